//! Small helpers for the native-protocol value encoding the engine builds itself
//! (system table cells, collection cells, tuples) and reads apart (collections, tuples).

use bytes::{BufMut, Bytes, BytesMut};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// `text`.
pub fn text(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// `int`.
pub fn int(v: i32) -> Bytes {
    Bytes::copy_from_slice(&v.to_be_bytes())
}

/// `bigint` / `counter` / `timestamp`.
pub fn bigint(v: i64) -> Bytes {
    Bytes::copy_from_slice(&v.to_be_bytes())
}

/// `boolean`.
pub fn boolean(v: bool) -> Bytes {
    Bytes::copy_from_slice(&[v as u8])
}

/// `double`.
pub fn double(v: f64) -> Bytes {
    Bytes::copy_from_slice(&v.to_be_bytes())
}

/// `uuid` / `timeuuid`.
pub fn uuid(v: &uuid::Uuid) -> Bytes {
    Bytes::copy_from_slice(v.as_bytes())
}

/// `inet`.
pub fn inet(v: &IpAddr) -> Bytes {
    match v {
        IpAddr::V4(a) => Bytes::copy_from_slice(&a.octets()),
        IpAddr::V6(a) => Bytes::copy_from_slice(&a.octets()),
    }
}

/// A list or set from already serialized elements (`i32 n` then `[bytes]` each).
pub fn collection<'a>(items: impl IntoIterator<Item = &'a [u8]>) -> Bytes {
    let mut out = BytesMut::new();
    out.put_i32(0);
    let mut n = 0i32;
    for item in items {
        out.put_i32(item.len() as i32);
        out.put_slice(item);
        n += 1;
    }
    out[0..4].copy_from_slice(&n.to_be_bytes());
    out.freeze()
}

/// A map from already serialized keys and values.
pub fn map<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Bytes {
    let mut out = BytesMut::new();
    out.put_i32(0);
    let mut n = 0i32;
    for (k, v) in pairs {
        out.put_i32(k.len() as i32);
        out.put_slice(k);
        out.put_i32(v.len() as i32);
        out.put_slice(v);
        n += 1;
    }
    out[0..4].copy_from_slice(&n.to_be_bytes());
    out.freeze()
}

/// `list<text>` / `set<text>` from strings.
pub fn text_list<S: AsRef<str>>(items: &[S]) -> Bytes {
    collection(items.iter().map(|s| s.as_ref().as_bytes()))
}

/// `map<text, text>`.
pub fn text_map(m: &BTreeMap<String, String>) -> Bytes {
    map(m.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())))
}

/// A tuple value from its components (`[bytes]` each, null allowed).
pub fn tuple(items: &[Option<&[u8]>]) -> Bytes {
    let mut out = BytesMut::new();
    for item in items {
        match item {
            Some(b) => {
                out.put_i32(b.len() as i32);
                out.put_slice(b);
            }
            None => out.put_i32(-1),
        }
    }
    out.freeze()
}

fn read_i32(b: &[u8], pos: &mut usize) -> Option<i32> {
    let s = b.get(*pos..*pos + 4)?;
    *pos += 4;
    Some(i32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn read_item(b: &Bytes, pos: &mut usize) -> Option<Option<Bytes>> {
    let len = read_i32(b, pos)?;
    if len < 0 {
        return Some(None);
    }
    let len = len as usize;
    let end = pos.checked_add(len)?;
    if end > b.len() {
        return None;
    }
    let item = b.slice(*pos..end);
    *pos = end;
    Some(Some(item))
}

/// Splits a serialized list or set into its elements (None if malformed or null elements).
pub fn split_collection(b: &Bytes) -> Option<Vec<Bytes>> {
    let mut pos = 0;
    let n = read_i32(b, &mut pos)?;
    if n < 0 {
        return None;
    }
    let mut out = Vec::with_capacity((n as usize).min(1024));
    for _ in 0..n {
        out.push(read_item(b, &mut pos)??);
    }
    (pos == b.len()).then_some(out)
}

/// Splits a serialized map into its pairs (None if malformed).
pub fn split_map(b: &Bytes) -> Option<Vec<(Bytes, Bytes)>> {
    let mut pos = 0;
    let n = read_i32(b, &mut pos)?;
    if n < 0 {
        return None;
    }
    let mut out = Vec::with_capacity((n as usize).min(1024));
    for _ in 0..n {
        let k = read_item(b, &mut pos)??;
        let v = read_item(b, &mut pos)??;
        out.push((k, v));
    }
    (pos == b.len()).then_some(out)
}

/// Splits a serialized tuple into `n` components (None if malformed).
pub fn split_tuple(b: &Bytes, n: usize) -> Option<Vec<Option<Bytes>>> {
    let mut pos = 0;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if pos == b.len() {
            out.push(None);
            continue;
        }
        out.push(read_item(b, &mut pos)?);
    }
    (pos == b.len()).then_some(out)
}

/// Splits a composite partition key (`u16 len ‖ bytes ‖ 0x00` per component).
pub fn split_composite(b: &Bytes, n: usize) -> Option<Vec<Bytes>> {
    if n == 1 {
        return Some(vec![b.clone()]);
    }
    let mut pos = 0;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let l = b.get(pos..pos + 2)?;
        let len = u16::from_be_bytes([l[0], l[1]]) as usize;
        pos += 2;
        let end = pos + len;
        if end + 1 > b.len() {
            return None;
        }
        out.push(b.slice(pos..end));
        pos = end + 1;
    }
    (pos == b.len()).then_some(out)
}

/// Decodes a `bigint`/`counter` cell.
pub fn as_i64(b: &[u8]) -> Option<i64> {
    Some(i64::from_be_bytes(b.try_into().ok()?))
}

/// Decodes an `int` cell.
pub fn as_i32(b: &[u8]) -> Option<i32> {
    Some(i32::from_be_bytes(b.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collections_round_trip() {
        let l = text_list(&["a", "bc"]);
        assert_eq!(&l[..4], &2i32.to_be_bytes());
        let parts = split_collection(&l).unwrap();
        assert_eq!(
            parts,
            vec![Bytes::from_static(b"a"), Bytes::from_static(b"bc")]
        );
        let mut m = BTreeMap::new();
        m.insert("k".to_string(), "v".to_string());
        let mb = text_map(&m);
        assert_eq!(
            split_map(&mb).unwrap(),
            vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))]
        );
        let t = tuple(&[Some(b"x"), None]);
        assert_eq!(
            split_tuple(&t, 2).unwrap(),
            vec![Some(Bytes::from_static(b"x")), None]
        );
    }

    #[test]
    fn malformed_input_is_rejected_not_panicking() {
        assert!(split_collection(&Bytes::from_static(&[0, 0, 0, 5, 0, 0])).is_none());
        assert!(split_collection(&Bytes::from_static(&[0, 0])).is_none());
        assert!(split_map(&Bytes::from_static(&[0, 0, 0, 1, 0, 0, 0, 1, 9])).is_none());
        assert!(split_composite(&Bytes::from_static(&[0, 9, 1]), 2).is_none());
        assert!(as_i64(&[1, 2]).is_none());
    }

    #[test]
    fn composite_keys_split() {
        let mut k = BytesMut::new();
        for part in [&b"ab"[..], &b"c"[..]] {
            k.put_u16(part.len() as u16);
            k.put_slice(part);
            k.put_u8(0);
        }
        let parts = split_composite(&k.freeze(), 2).unwrap();
        assert_eq!(
            parts,
            vec![Bytes::from_static(b"ab"), Bytes::from_static(b"c")]
        );
    }
}
