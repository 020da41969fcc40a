//! Tokens: positions on Cassandra's Murmur3 ring, the signed 64-bit integers.

use std::fmt;
use std::str::FromStr;

/// A position on the ring. A key's token is its Murmur3 hash; a node's token ends the range
/// it owns, `(previous token, token]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(pub i64);

impl Token {
    /// The ring's minimum, which no key hashes to and no node may own (Cassandra's rule).
    pub const MIN: Token = Token(i64::MIN);

    /// The token of a routing key (see `sluice_types::routing_key`).
    pub fn of_key(routing_key: &[u8]) -> Token {
        Token(sluice_types::murmur3_token(routing_key))
    }

    /// The token's distance from the ring's minimum, as an unsigned offset: makes ring
    /// arithmetic (widths of ranges, midpoints) wrap the way the ring does.
    pub fn offset(self) -> u64 {
        (self.0 as u64) ^ (1 << 63)
    }

    /// The token at an unsigned offset from the ring's minimum (the inverse of `offset`).
    pub fn from_offset(offset: u64) -> Token {
        Token((offset ^ (1 << 63)) as i64)
    }

    /// How far the ring goes from `self` (exclusive) to `end` (inclusive), clockwise;
    /// a range from a token to itself is the whole ring, reported as 2^64.
    pub fn width_to(self, end: Token) -> u128 {
        let d = end.offset().wrapping_sub(self.offset());
        if d == 0 {
            1u128 << 64
        } else {
            u128::from(d)
        }
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A token string that is not a signed 64-bit decimal integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenParseError;

impl fmt::Display for TokenParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a token must be a signed 64-bit decimal integer")
    }
}

impl std::error::Error for TokenParseError {}

impl FromStr for Token {
    type Err = TokenParseError;

    /// Parses the decimal form `system.local.tokens` uses.
    fn from_str(s: &str) -> Result<Token, TokenParseError> {
        s.trim().parse().map(Token).map_err(|_| TokenParseError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_tokens_match_the_drivers_vectors() {
        assert_eq!(Token::of_key(b"test"), Token(-6017608668500074083));
        assert_eq!(Token::of_key(b""), Token(0));
    }

    #[test]
    fn offsets_keep_ring_order_and_round_trip() {
        let ts = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        for w in ts.windows(2) {
            assert!(Token(w[0]).offset() < Token(w[1]).offset());
        }
        for t in ts {
            assert_eq!(Token::from_offset(Token(t).offset()), Token(t));
        }
        assert_eq!(Token::MIN.offset(), 0);
    }

    #[test]
    fn widths_wrap_around_the_ring() {
        assert_eq!(Token(0).width_to(Token(10)), 10);
        assert_eq!(Token(i64::MAX).width_to(Token(i64::MIN + 1)), 2);
        assert_eq!(Token(5).width_to(Token(5)), 1 << 64);
    }

    #[test]
    fn tokens_parse_from_their_display_form() {
        for t in [i64::MIN + 1, -3, 0, i64::MAX] {
            assert_eq!(Token(t).to_string().parse::<Token>(), Ok(Token(t)));
        }
        assert_eq!("x".parse::<Token>(), Err(TokenParseError));
        assert_eq!("9223372036854775808".parse::<Token>(), Err(TokenParseError));
    }
}
