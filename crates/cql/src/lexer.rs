//! A hand-written CQL lexer over `&str`: tokens are byte ranges into the text, so lexing
//! allocates nothing but the token vector. Keywords are not distinguished here: the parser
//! matches identifier tokens against keywords case-insensitively, which is what makes
//! Cassandra's unreserved keywords (`key`, `ttl`, `type`, ...) usable as names.

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// An unquoted identifier or keyword: `[A-Za-z][A-Za-z0-9_]*`.
    Ident,
    /// A double-quoted identifier (`"Foo"`, `""` escapes a quote); text includes the quotes.
    QuotedIdent,
    /// A single-quoted string (`''` escapes a quote); text includes the quotes.
    String,
    /// A `$$...$$` string; text includes the dollars.
    DollarString,
    /// An integer, possibly negative: `-12`.
    Integer,
    /// A float: `1.5`, `-2e10`, `3.`, `1E-5` (NaN and Infinity are identifiers).
    Float,
    /// A blob literal: `0x0aff` (text includes the `0x`).
    Hex,
    /// A UUID literal: `123e4567-e89b-12d3-a456-426614174000`.
    Uuid,
    /// A duration literal: `1h30m`, `-10ms`, `P1DT2H`, `P0001-02-03T04:05:06`.
    Duration,
    /// `?`
    Question,
    /// `:`
    Colon,
    /// `(`
    LParen,
    /// `)`
    RParen,
    /// `[`
    LBracket,
    /// `]`
    RBracket,
    /// `{`
    LBrace,
    /// `}`
    RBrace,
    /// `,`
    Comma,
    /// `;`
    Semicolon,
    /// `.`
    Dot,
    /// `=`
    Eq,
    /// `!=`
    Neq,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `+`
    Plus,
    /// `-`
    Minus,
    /// `*`
    Star,
    /// `/`
    Slash,
    /// End of input.
    Eof,
}

/// A token: its kind and its byte range in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    /// Kind.
    pub kind: TokenKind,
    /// Byte offset of the first character.
    pub start: u32,
    /// Byte offset one past the last character.
    pub end: u32,
}

impl Token {
    /// The token's text.
    pub fn text<'a>(&self, src: &'a str) -> &'a str {
        src.get(self.start as usize..self.end as usize)
            .unwrap_or("")
    }
}

/// Why the text could not be split into tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LexError {
    /// Byte offset where the bad token starts.
    pub position: usize,
    /// Byte offset where lexing stopped.
    pub end: usize,
    /// What is wrong.
    pub message: &'static str,
}

/// The longest statement text the lexer accepts (positions are `u32`).
pub const MAX_TEXT_LEN: usize = u32::MAX as usize;

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic()
}

fn is_ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Length of a UUID literal at the start of `s`, if one is there and is not followed by
/// an identifier character.
fn uuid_len(s: &[u8]) -> Option<usize> {
    const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];
    let mut i = 0;
    for (g, &len) in GROUPS.iter().enumerate() {
        if g > 0 {
            if s.get(i) != Some(&b'-') {
                return None;
            }
            i += 1;
        }
        for _ in 0..len {
            if !s.get(i)?.is_ascii_hexdigit() {
                return None;
            }
            i += 1;
        }
    }
    match s.get(i) {
        Some(&b) if is_ident_char(b) || b == b'-' => None,
        _ => Some(i),
    }
}

/// Length of a `digits unit (digits unit)*` duration at the start of `s` (after any `-`).
fn unit_duration_len(s: &[u8]) -> Option<usize> {
    let mut i = 0;
    let mut groups = 0;
    loop {
        let start = i;
        while s.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            break;
        }
        let unit_len = duration_unit_len(&s[i..])?;
        i += unit_len;
        groups += 1;
    }
    if groups == 0 || s.get(i).is_some_and(|&b| is_ident_char(b)) {
        return None;
    }
    Some(i)
}

/// Length of a duration unit at the start of `s`: the longest of y, mo, w, d, h, m, s,
/// ms, us, µs, ns that is followed by a digit or by a non-identifier character.
fn duration_unit_len(s: &[u8]) -> Option<usize> {
    let lower = |i: usize| s.get(i).map(u8::to_ascii_lowercase);
    let two = match (lower(0), lower(1)) {
        (Some(b'm'), Some(b'o'))
        | (Some(b'm'), Some(b's'))
        | (Some(b'u'), Some(b's'))
        | (Some(b'n'), Some(b's')) => Some(2),
        _ if s.starts_with("µs".as_bytes()) => Some("µs".len()),
        _ => None,
    };
    let one = match lower(0) {
        Some(b'y' | b'w' | b'd' | b'h' | b'm' | b's') => Some(1),
        _ => None,
    };
    let ends_ok = |n: usize| match s.get(n) {
        Some(&b) => b.is_ascii_digit() || !is_ident_char(b),
        None => true,
    };
    two.filter(|&n| ends_ok(n))
        .or_else(|| one.filter(|&n| ends_ok(n)))
}

/// Length of an ISO-8601 duration (`P...`) at the start of `s`, checked loosely here
/// (`P` then digits, unit letters, `T`, `-`, `:`); the value parser validates it fully.
fn iso_duration_len(s: &[u8]) -> Option<usize> {
    if !matches!(s.first(), Some(b'P' | b'p')) {
        return None;
    }
    let mut i = 1;
    let mut digits = false;
    while let Some(&b) = s.get(i) {
        match b {
            b'0'..=b'9' => digits = true,
            b'Y' | b'M' | b'W' | b'D' | b'H' | b'S' | b'T' | b'y' | b'm' | b'w' | b'd' | b'h'
            | b's' | b't' | b'-' | b':' => {}
            _ if is_ident_char(b) => return None,
            _ => break,
        }
        i += 1;
    }
    // An identifier such as `p` or `pt` is not a duration: it needs digits, and a unit or
    // separator after the last digit group.
    let last = *s.get(i - 1)?;
    let ok = (digits && !last.is_ascii_digit()) || s[..i].contains(&b':');
    (ok && sluice_types::datetime::parse_duration(std::str::from_utf8(&s[..i]).ok()?).is_some())
        .then_some(i)
}

/// Splits `text` into tokens, ending with an `Eof` token.
pub fn tokenize(text: &str) -> Result<Vec<Token>, LexError> {
    let mut out = Vec::with_capacity(text.len() / 4 + 2);
    tokenize_into(text, &mut out)?;
    Ok(out)
}

/// Appends the tokens of `text` (ending with `Eof`) to `out`.
pub fn tokenize_into(text: &str, out: &mut Vec<Token>) -> Result<(), LexError> {
    let s = text.as_bytes();
    if s.len() > MAX_TEXT_LEN {
        return Err(LexError {
            position: 0,
            end: 0,
            message: "statement too long",
        });
    }
    let mut i = 0usize;
    let err = |start: usize, end: usize, message: &'static str| LexError {
        position: start,
        end,
        message,
    };
    while i < s.len() {
        let b = s[i];
        let start = i;
        let kind = match b {
            b' ' | b'\t' | b'\n' | b'\r' | 0x0c => {
                i += 1;
                continue;
            }
            b'-' if s.get(i + 1) == Some(&b'-') => {
                skip_line(s, &mut i);
                continue;
            }
            b'/' if s.get(i + 1) == Some(&b'/') => {
                skip_line(s, &mut i);
                continue;
            }
            b'/' if s.get(i + 1) == Some(&b'*') => {
                match find(s, i + 2, b"*/") {
                    Some(end) => i = end + 2,
                    None => return Err(err(start, s.len(), "unterminated comment")),
                }
                continue;
            }
            b'\'' => {
                i = quoted_end(s, i, b'\'').ok_or(err(start, s.len(), "unterminated string"))?;
                TokenKind::String
            }
            b'"' => {
                i = quoted_end(s, i, b'"').ok_or(err(
                    start,
                    s.len(),
                    "unterminated quoted identifier",
                ))?;
                if i - start == 2 {
                    return Err(err(start, i, "empty quoted identifier"));
                }
                TokenKind::QuotedIdent
            }
            b'$' if s.get(i + 1) == Some(&b'$') => {
                let end =
                    find(s, i + 2, b"$$").ok_or(err(start, s.len(), "unterminated $$ string"))?;
                i = end + 2;
                TokenKind::DollarString
            }
            b'0' if matches!(s.get(i + 1), Some(b'x' | b'X')) => {
                i += 2;
                while s.get(i).is_some_and(u8::is_ascii_hexdigit) {
                    i += 1;
                }
                if s.get(i).is_some_and(|&b| is_ident_char(b)) {
                    return Err(err(start, i + 1, "invalid hexadecimal blob literal"));
                }
                TokenKind::Hex
            }
            b'-' if s.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                i += 1;
                number(s, &mut i, start)?
            }
            b'0'..=b'9' => {
                if let Some(n) = uuid_len(&s[i..]) {
                    i += n;
                    TokenKind::Uuid
                } else {
                    number(s, &mut i, start)?
                }
            }
            _ if is_ident_start(b) => {
                if let Some(n) = uuid_len(&s[i..]) {
                    i += n;
                    TokenKind::Uuid
                } else if let Some(n) = iso_duration_len(&s[i..]) {
                    i += n;
                    TokenKind::Duration
                } else {
                    while s.get(i).is_some_and(|&b| is_ident_char(b)) {
                        i += 1;
                    }
                    TokenKind::Ident
                }
            }
            b'?' => punct(&mut i, 1, TokenKind::Question),
            b':' => punct(&mut i, 1, TokenKind::Colon),
            b'(' => punct(&mut i, 1, TokenKind::LParen),
            b')' => punct(&mut i, 1, TokenKind::RParen),
            b'[' => punct(&mut i, 1, TokenKind::LBracket),
            b']' => punct(&mut i, 1, TokenKind::RBracket),
            b'{' => punct(&mut i, 1, TokenKind::LBrace),
            b'}' => punct(&mut i, 1, TokenKind::RBrace),
            b',' => punct(&mut i, 1, TokenKind::Comma),
            b';' => punct(&mut i, 1, TokenKind::Semicolon),
            b'.' => punct(&mut i, 1, TokenKind::Dot),
            b'=' => punct(&mut i, 1, TokenKind::Eq),
            b'!' if s.get(i + 1) == Some(&b'=') => punct(&mut i, 2, TokenKind::Neq),
            b'<' if s.get(i + 1) == Some(&b'=') => punct(&mut i, 2, TokenKind::Le),
            b'<' => punct(&mut i, 1, TokenKind::Lt),
            b'>' if s.get(i + 1) == Some(&b'=') => punct(&mut i, 2, TokenKind::Ge),
            b'>' => punct(&mut i, 1, TokenKind::Gt),
            b'+' => punct(&mut i, 1, TokenKind::Plus),
            b'-' => punct(&mut i, 1, TokenKind::Minus),
            b'*' => punct(&mut i, 1, TokenKind::Star),
            b'/' => punct(&mut i, 1, TokenKind::Slash),
            _ => {
                let len = text
                    .get(i..)
                    .and_then(|r| r.chars().next())
                    .map_or(1, char::len_utf8);
                return Err(err(start, i + len, "unexpected character"));
            }
        };
        out.push(Token {
            kind,
            start: start as u32,
            end: i as u32,
        });
    }
    out.push(Token {
        kind: TokenKind::Eof,
        start: s.len() as u32,
        end: s.len() as u32,
    });
    Ok(())
}

fn punct(i: &mut usize, len: usize, kind: TokenKind) -> TokenKind {
    *i += len;
    kind
}

fn skip_line(s: &[u8], i: &mut usize) {
    while *i < s.len() && s[*i] != b'\n' {
        *i += 1;
    }
}

fn find(s: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    s.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// End (exclusive) of a quoted token starting at `start` with quote `q`; a doubled quote
/// is an escaped quote.
fn quoted_end(s: &[u8], start: usize, q: u8) -> Option<usize> {
    let mut i = start + 1;
    loop {
        let p = s.get(i..)?.iter().position(|&b| b == q)? + i;
        if s.get(p + 1) == Some(&q) {
            i = p + 2;
        } else {
            return Some(p + 1);
        }
    }
}

/// Lexes an integer, float or duration whose digits start at `*i` (after any `-`).
fn number(s: &[u8], i: &mut usize, start: usize) -> Result<TokenKind, LexError> {
    if let Some(n) = unit_duration_len(&s[*i..]) {
        *i += n;
        return Ok(TokenKind::Duration);
    }
    let digits = |i: &mut usize| {
        let from = *i;
        while s.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - from
    };
    digits(i);
    let mut kind = TokenKind::Integer;
    // `1.` followed by a digit, an exponent or a non-identifier is a float; `1..` or
    // `t.1` never reach here.
    if s.get(*i) == Some(&b'.')
        && !s
            .get(*i + 1)
            .is_some_and(|&b| b == b'.' || is_ident_start(b) && !matches!(b, b'e' | b'E'))
    {
        *i += 1;
        digits(i);
        kind = TokenKind::Float;
    }
    if matches!(s.get(*i), Some(b'e' | b'E')) {
        let mut j = *i + 1;
        if matches!(s.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let exp_start = j;
        while s.get(j).is_some_and(u8::is_ascii_digit) {
            j += 1;
        }
        if j == exp_start {
            return Err(LexError {
                position: start,
                end: j,
                message: "invalid number: missing exponent digits",
            });
        }
        *i = j;
        kind = TokenKind::Float;
    }
    if s.get(*i).is_some_and(|&b| is_ident_char(b)) {
        return Err(LexError {
            position: start,
            end: *i + 1,
            message: "invalid number",
        });
    }
    Ok(kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use TokenKind::*;

    fn kinds(text: &str) -> Vec<(TokenKind, &str)> {
        tokenize(text)
            .unwrap()
            .iter()
            .map(|t| (t.kind, t.text(text)))
            .collect()
    }

    #[test]
    fn lexes_every_token_kind() {
        let text = "SELECT \"Foo\"\"x\", 'it''s', $$a'b$$, 12, -3, 1.5, -2e10, 3.E2, 0xCAFE, \
                    123e4567-e89b-12d3-a456-426614174000, 1h30m, -10ms, P1DT2H, ?, :name \
                    ( ) [ ] { } , ; . = != < <= > >= + - * /";
        let got = kinds(text);
        let want = vec![
            (Ident, "SELECT"),
            (QuotedIdent, "\"Foo\"\"x\""),
            (Comma, ","),
            (String, "'it''s'"),
            (Comma, ","),
            (DollarString, "$$a'b$$"),
            (Comma, ","),
            (Integer, "12"),
            (Comma, ","),
            (Integer, "-3"),
            (Comma, ","),
            (Float, "1.5"),
            (Comma, ","),
            (Float, "-2e10"),
            (Comma, ","),
            (Float, "3.E2"),
            (Comma, ","),
            (Hex, "0xCAFE"),
            (Comma, ","),
            (Uuid, "123e4567-e89b-12d3-a456-426614174000"),
            (Comma, ","),
            (Duration, "1h30m"),
            (Comma, ","),
            (Duration, "-10ms"),
            (Comma, ","),
            (Duration, "P1DT2H"),
            (Comma, ","),
            (Question, "?"),
            (Comma, ","),
            (Colon, ":"),
            (Ident, "name"),
            (LParen, "("),
            (RParen, ")"),
            (LBracket, "["),
            (RBracket, "]"),
            (LBrace, "{"),
            (RBrace, "}"),
            (Comma, ","),
            (Semicolon, ";"),
            (Dot, "."),
            (Eq, "="),
            (Neq, "!="),
            (Lt, "<"),
            (Le, "<="),
            (Gt, ">"),
            (Ge, ">="),
            (Plus, "+"),
            (Minus, "-"),
            (Star, "*"),
            (Slash, "/"),
            (Eof, ""),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn comments_and_positions() {
        let text = "a -- x\n/* y\n */ b // z\nc";
        let toks = tokenize(text).unwrap();
        let idents: Vec<_> = toks.iter().map(|t| (t.text(text), t.start)).collect();
        assert_eq!(idents, vec![("a", 0), ("b", 16), ("c", 23), ("", 24)]);
    }

    #[test]
    fn ambiguous_shapes() {
        // A UUID starting with letters, identifiers that look like hex or durations.
        assert_eq!(kinds("abcdef01-0000-1000-8000-000000000000")[0].0, Uuid);
        assert_eq!(kinds("deadbeef")[0], (Ident, "deadbeef"));
        assert_eq!(kinds("p")[0], (Ident, "p"));
        assert_eq!(kinds("pk")[0], (Ident, "pk"));
        assert_eq!(kinds("pt")[0], (Ident, "pt"));
        assert_eq!(kinds("p1")[0], (Ident, "p1"));
        assert_eq!(kinds("P2W")[0], (Duration, "P2W"));
        assert_eq!(kinds("P0001-02-03T04:05:06")[0].0, Duration);
        assert_eq!(kinds("30000ms")[0], (Duration, "30000ms"));
        assert_eq!(kinds("1d")[0], (Duration, "1d"));
        assert_eq!(kinds("3µs")[0], (Duration, "3µs"));
        assert_eq!(kinds("1mo2w")[0], (Duration, "1mo2w"));
        // `c - 1` is minus then integer; `c -1` lexes `-1` as Cassandra does.
        assert_eq!(kinds("c - 1")[1], (Minus, "-"));
        assert_eq!(kinds("c -1")[1], (Integer, "-1"));
        assert_eq!(kinds("ks.t")[1], (Dot, "."));
        assert_eq!(kinds("1.e5")[0], (Float, "1.e5"));
        assert_eq!(kinds("0x")[0], (Hex, "0x"));
        assert_eq!(kinds("key_1")[0], (Ident, "key_1"));
    }

    #[test]
    fn errors_carry_positions() {
        let e = tokenize("SELECT 'abc").unwrap_err();
        assert_eq!((e.position, e.message), (7, "unterminated string"));
        let e = tokenize("a /* b").unwrap_err();
        assert_eq!(e.position, 2);
        let e = tokenize("x = 12abc").unwrap_err();
        assert_eq!((e.position, e.message), (4, "invalid number"));
        let e = tokenize("x = 0xfg").unwrap_err();
        assert_eq!(e.position, 4);
        let e = tokenize("x # y").unwrap_err();
        assert_eq!((e.position, e.message), (2, "unexpected character"));
        let e = tokenize("x = 1e").unwrap_err();
        assert_eq!(e.position, 4);
        assert!(tokenize("\"\"").is_err());
    }

    #[test]
    fn token_text_reassembles_the_input() {
        // Round trip: concatenating token texts with the skipped whitespace between them
        // gives back the input.
        let text = "INSERT INTO ks.\"T\" (a,b) VALUES ( ?, 'x''y' ) USING TTL 10 AND TIMEOUT 5s;";
        let toks = tokenize(text).unwrap();
        let mut rebuilt = std::string::String::new();
        let mut last = 0;
        for t in &toks {
            rebuilt.push_str(&text[last..t.start as usize]);
            rebuilt.push_str(t.text(text));
            last = t.end as usize;
        }
        assert_eq!(rebuilt, text);
        assert!(toks.windows(2).all(|w| w[0].end <= w[1].start));
    }
}
