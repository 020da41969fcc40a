//! SASL PLAIN (RFC 4616) as drivers send it in the first AUTH_RESPONSE:
//! `[authzid] NUL authcid NUL password`.

/// The credentials of a PLAIN token, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlainCredentials<'a> {
    /// The user (authentication id).
    pub user: &'a str,
    /// The password, as bytes (compared by the password hash, never decoded).
    pub password: &'a [u8],
}

/// Why a PLAIN token was refused; the message is what Cassandra answers with
/// Bad_credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslError {
    /// More than two NUL separators.
    Format,
    /// No password, or an empty one.
    NoPassword,
    /// No user, or an empty one.
    NoUser,
    /// The user is not UTF-8.
    UserNotUtf8,
}

impl SaslError {
    /// Cassandra's message for the error.
    pub const fn message(self) -> &'static str {
        match self {
            SaslError::Format => {
                "Credential format error: username or password is empty or contains NUL(\\0) character"
            }
            SaslError::NoPassword => "Password must not be null",
            SaslError::NoUser => "Authentication ID must not be null",
            SaslError::UserNotUtf8 => "Authentication ID must be UTF-8",
        }
    }
}

/// Parses a PLAIN token as Cassandra's `PlainTextSaslAuthenticator` does: from the end,
/// the password follows the last NUL and the user the one before; an authorization id
/// before the first NUL is ignored. Never panics, whatever the bytes.
pub fn parse_plain(token: &[u8]) -> Result<PlainCredentials<'_>, SaslError> {
    let mut password: Option<&[u8]> = None;
    let mut user: Option<&[u8]> = None;
    let mut end = token.len();
    for i in (0..token.len()).rev() {
        if token[i] != 0 {
            continue;
        }
        let field = &token[i + 1..end];
        if password.is_none() {
            password = Some(field);
        } else if user.is_none() {
            user = Some(field);
        } else {
            return Err(SaslError::Format);
        }
        end = i;
    }
    let password = password
        .filter(|p| !p.is_empty())
        .ok_or(SaslError::NoPassword)?;
    let user = user.filter(|u| !u.is_empty()).ok_or(SaslError::NoUser)?;
    let user = std::str::from_utf8(user).map_err(|_| SaslError::UserNotUtf8)?;
    Ok(PlainCredentials { user, password })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn drivers_token_parses() {
        let c = parse_plain(b"\0cassandra\0secret").unwrap();
        assert_eq!(c.user, "cassandra");
        assert_eq!(c.password, b"secret");
        // An authorization id is allowed and ignored.
        let c = parse_plain(b"admin\0bob\0p w").unwrap();
        assert_eq!(c.user, "bob");
        assert_eq!(c.password, b"p w");
        // Passwords are bytes: not necessarily UTF-8.
        let c = parse_plain(b"\0u\0\xff\xfe").unwrap();
        assert_eq!(c.password, b"\xff\xfe");
    }

    #[test]
    fn malformed_tokens_are_refused() {
        assert_eq!(parse_plain(b""), Err(SaslError::NoPassword));
        assert_eq!(parse_plain(b"userpassword"), Err(SaslError::NoPassword));
        assert_eq!(parse_plain(b"\0user\0"), Err(SaslError::NoPassword));
        assert_eq!(parse_plain(b"user\0password"), Err(SaslError::NoUser));
        assert_eq!(parse_plain(b"\0\0password"), Err(SaslError::NoUser));
        assert_eq!(parse_plain(b"\0a\0b\0c"), Err(SaslError::Format));
        assert_eq!(parse_plain(b"\0\xc3\0pw"), Err(SaslError::UserNotUtf8));
        assert_eq!(parse_plain(b"\0"), Err(SaslError::NoPassword));
        assert_eq!(parse_plain(b"\0\0"), Err(SaslError::NoPassword));
    }

    proptest! {
        #[test]
        fn never_panics_and_round_trips(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            user in "[a-z]{1,12}",
            pw in proptest::collection::vec(1u8..=255, 1..32),
        ) {
            let _ = parse_plain(&bytes);
            let mut token = vec![0u8];
            token.extend_from_slice(user.as_bytes());
            token.push(0);
            token.extend_from_slice(&pw);
            let c = parse_plain(&token).unwrap();
            prop_assert_eq!(c.user, user.as_str());
            prop_assert_eq!(c.password, &pw[..]);
        }
    }
}
