//! Salted, slow password hashes: bcrypt, as Cassandra stores them (`$2a$` / `$2b$`).

/// The lowest cost bcrypt accepts; tests use it to stay fast.
pub const MIN_BCRYPT_COST: u32 = 4;

/// Hashes `password` with a fresh random salt at `cost` (log2 rounds, 4..=31).
pub fn hash_password(password: &str, cost: u32) -> Result<String, bcrypt::BcryptError> {
    bcrypt::hash(password, cost)
}

/// True if `password` matches `hash`; a malformed hash never matches.
pub fn verify_password(password: impl AsRef<[u8]>, hash: &str) -> bool {
    bcrypt::verify(password, hash).unwrap_or(false)
}

/// True if `hash` is a well-formed bcrypt hash (for `HASHED PASSWORD`).
pub fn is_bcrypt_hash(hash: &str) -> bool {
    // `$2a$10$` + 22 characters of salt + 31 of hash.
    let b = hash.as_bytes();
    b.len() == 60
        && hash.starts_with("$2")
        && matches!(b.get(2), Some(b'a' | b'b' | b'x' | b'y'))
        && b.get(3) == Some(&b'$')
        && b.get(4..6)
            .is_some_and(|c| c.iter().all(u8::is_ascii_digit))
        && b.get(6) == Some(&b'$')
        && bcrypt::verify("", hash).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_salted_and_verify() {
        let a = hash_password("secret", MIN_BCRYPT_COST).unwrap();
        let b = hash_password("secret", MIN_BCRYPT_COST).unwrap();
        assert_ne!(a, b, "two hashes of one password differ by their salt");
        assert!(a.starts_with("$2"));
        assert!(is_bcrypt_hash(&a));
        assert!(verify_password("secret", &a));
        assert!(verify_password("secret", &b));
        assert!(!verify_password("Secret", &a));
        assert!(!verify_password("", &a));
    }

    #[test]
    fn jbcrypt_hashes_verify() {
        // A vector of the OpenWall crypt_blowfish and jBCrypt (Cassandra's library) tests.
        let h = "$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW";
        assert!(is_bcrypt_hash(h));
        assert!(verify_password("U*U", h));
        assert!(!verify_password("U*V", h));
    }

    #[test]
    fn malformed_hashes_never_match() {
        for h in [
            "",
            "plain",
            "$2a$10$short",
            "$2a$99$XJJ6CXrzBBYLV8/B2u8bhOGWuFpDnCsQVZsYmqRD6e1Dvl3hezcpS",
        ] {
            assert!(!verify_password("x", h), "{h}");
            assert!(!is_bcrypt_hash(h), "{h}");
        }
    }
}
