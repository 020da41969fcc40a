//! Bytes as a hex string in JSON, so log entries and snapshots stay compact and readable.

use serde::{Deserialize, Deserializer, Serializer};

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Serializes `bytes` as lowercase hex.
pub(crate) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    serializer.serialize_str(&text)
}

/// Deserializes lowercase or uppercase hex; anything else is an error, never a panic.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
    decode(text.as_bytes()).ok_or_else(|| serde::de::Error::custom("invalid hex bytes"))
}

fn nibble(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

fn decode(text: &[u8]) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    text.chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Wrapped(#[serde(with = "super")] Vec<u8>);

    #[test]
    fn round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let json = serde_json::to_string(&Wrapped(all.clone())).unwrap();
        assert_eq!(&json[..7], "\"000102");
        let back: Wrapped = serde_json::from_str(&json).unwrap();
        assert_eq!(back.0, all);
    }

    #[test]
    fn rejects_bad_hex_without_panicking() {
        assert!(serde_json::from_str::<Wrapped>("\"abc\"").is_err());
        assert!(serde_json::from_str::<Wrapped>("\"zz\"").is_err());
        assert!(serde_json::from_str::<Wrapped>("7").is_err());
    }
}
