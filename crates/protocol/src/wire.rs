//! Primitive readers and writers of the native protocol (v4 §3 notation).
//!
//! Readers are checked: every read validates the remaining length first and returns a
//! [`DecodeError`] instead of panicking, so untrusted bytes can be fed to them directly.
//! Byte-string reads return `Bytes` slices of the frame body (a reference-count bump, no copy).
//! Writers append to a `BytesMut`; they never fail.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::{BufMut, Bytes, BytesMut};

use crate::messages::Consistency;

/// Why a request body (or a primitive inside it) could not be decoded. Small and `Copy`;
/// the server answers it with a ProtocolError on the request's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl DecodeError {
    /// The static message.
    pub const fn message(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for DecodeError {}

/// Error for a read past the end of the body.
pub const TRUNCATED: DecodeError = DecodeError("truncated message body");

/// A checked cursor over a frame body. Slices it hands out share the body's buffer.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    data: &'a Bytes,
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader positioned at the start of `data`.
    pub fn new(data: &'a Bytes) -> Reader<'a> {
        Reader { data, pos: 0 }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    /// Current offset from the start of the body.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The next `n` bytes as a borrowed slice, advancing past them.
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(TRUNCATED)?;
        let slice = self.data.get(self.pos..end).ok_or(TRUNCATED)?;
        self.pos = end;
        Ok(slice)
    }

    /// The next `n` bytes as a shared `Bytes` slice (no copy), advancing past them.
    fn take_bytes(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        let start = self.pos;
        self.take(n)?;
        Ok(self.data.slice(start..self.pos))
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let slice = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    /// `[byte]`.
    pub fn read_u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take_array::<1>()?[0])
    }

    /// `[short]`: unsigned 16-bit.
    pub fn read_short(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.take_array()?))
    }

    /// `[int]`: signed 32-bit.
    pub fn read_int(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.take_array()?))
    }

    /// `[long]`: signed 64-bit.
    pub fn read_long(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.take_array()?))
    }

    /// `[string]`: short length + UTF-8, borrowed from the body.
    pub fn read_string(&mut self) -> Result<&'a str, DecodeError> {
        let len = self.read_short()? as usize;
        let raw = self.take(len)?;
        std::str::from_utf8(raw).map_err(|_| DecodeError("invalid UTF-8 in [string]"))
    }

    /// `[long string]` as validated UTF-8 bytes sharing the body's buffer.
    pub fn read_long_string_bytes(&mut self) -> Result<Bytes, DecodeError> {
        let len = self.read_int()?;
        let len = usize::try_from(len).map_err(|_| DecodeError("negative [long string] length"))?;
        let raw = self.take_bytes(len)?;
        std::str::from_utf8(&raw).map_err(|_| DecodeError("invalid UTF-8 in [long string]"))?;
        Ok(raw)
    }

    /// `[bytes]`: int length, `None` when negative (null).
    pub fn read_bytes(&mut self) -> Result<Option<Bytes>, DecodeError> {
        let len = self.read_int()?;
        if len < 0 {
            return Ok(None);
        }
        self.take_bytes(len as usize).map(Some)
    }

    /// `[short bytes]`, borrowed from the body.
    pub fn read_short_bytes_borrowed(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.read_short()? as usize;
        self.take(len)
    }

    /// `[short bytes]`.
    pub fn read_short_bytes(&mut self) -> Result<Bytes, DecodeError> {
        let len = self.read_short()? as usize;
        self.take_bytes(len)
    }

    /// `[value]`: int length; -1 null, -2 unset, other negatives are malformed.
    pub fn read_value(&mut self) -> Result<crate::messages::Value, DecodeError> {
        use crate::messages::Value;
        match self.read_int()? {
            -1 => Ok(Value::Null),
            -2 => Ok(Value::Unset),
            len if len < 0 => Err(DecodeError("invalid [value] length")),
            len => self.take_bytes(len as usize).map(Value::Set),
        }
    }

    /// [`Self::read_value`], borrowed from the body (no reference count taken).
    pub fn read_value_borrowed(&mut self) -> Result<crate::messages::ValueRef<'a>, DecodeError> {
        use crate::messages::ValueRef;
        match self.read_int()? {
            -1 => Ok(ValueRef::Null),
            -2 => Ok(ValueRef::Unset),
            len if len < 0 => Err(DecodeError("invalid [value] length")),
            len => self.take(len as usize).map(ValueRef::Set),
        }
    }

    /// `[consistency]`, rejecting unknown codes.
    pub fn read_consistency(&mut self) -> Result<Consistency, DecodeError> {
        Consistency::from_code(self.read_short()?).ok_or(DecodeError("unknown consistency level"))
    }

    /// Reads a `[short]` element count and checks that `count * min_elem_len` bytes remain,
    /// so that a hostile count can never drive an allocation larger than the body.
    pub fn read_count(&mut self, min_elem_len: usize) -> Result<usize, DecodeError> {
        let n = self.read_short()? as usize;
        if n.saturating_mul(min_elem_len) > self.remaining() {
            return Err(DecodeError("element count exceeds message body"));
        }
        Ok(n)
    }

    /// `[string list]` of borrowed strings, visited in order (no allocation).
    pub fn read_string_list_with(
        &mut self,
        mut each: impl FnMut(&'a str) -> Result<(), DecodeError>,
    ) -> Result<(), DecodeError> {
        let n = self.read_count(2)?;
        for _ in 0..n {
            each(self.read_string()?)?;
        }
        Ok(())
    }

    /// `[string map]` as owned pairs, in wire order.
    pub fn read_string_map(&mut self) -> Result<Vec<(String, String)>, DecodeError> {
        let n = self.read_count(4)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let k = self.read_string()?;
            let v = self.read_string()?;
            out.push((k.to_owned(), v.to_owned()));
        }
        Ok(out)
    }

    /// `[bytes map]`: skipped (used for a request's custom payload, which Sluice ignores).
    pub fn skip_bytes_map(&mut self) -> Result<(), DecodeError> {
        let n = self.read_count(6)?;
        for _ in 0..n {
            self.read_string()?;
            self.read_bytes()?;
        }
        Ok(())
    }

    /// `[uuid]`: 16 bytes.
    pub fn read_uuid(&mut self) -> Result<[u8; 16], DecodeError> {
        self.take_array()
    }

    /// `[inet]`: address length byte (4 or 16), address, int port.
    pub fn read_inet(&mut self) -> Result<SocketAddr, DecodeError> {
        let ip = match self.read_u8()? {
            4 => IpAddr::V4(Ipv4Addr::from(self.take_array::<4>()?)),
            16 => IpAddr::V6(Ipv6Addr::from(self.take_array::<16>()?)),
            _ => return Err(DecodeError("invalid [inet] address length")),
        };
        let port = u16::try_from(self.read_int()?).map_err(|_| DecodeError("invalid port"))?;
        Ok(SocketAddr::new(ip, port))
    }
}

/// Writes `[byte]`.
#[inline]
pub fn put_u8(buf: &mut BytesMut, v: u8) {
    buf.put_u8(v);
}

/// Writes `[short]`.
#[inline]
pub fn put_short(buf: &mut BytesMut, v: u16) {
    buf.put_u16(v);
}

/// Writes `[int]`.
#[inline]
pub fn put_int(buf: &mut BytesMut, v: i32) {
    buf.put_i32(v);
}

/// Writes `[long]`.
#[inline]
pub fn put_long(buf: &mut BytesMut, v: i64) {
    buf.put_i64(v);
}

/// The longest prefix of `s` that fits a `[string]` (65535 bytes), cut on a char boundary.
/// Server-generated strings never get near the limit; this only keeps frames well-formed.
fn short_str(s: &str) -> &str {
    if s.len() <= u16::MAX as usize {
        return s;
    }
    let mut end = u16::MAX as usize;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Writes `[string]` (strings over 65535 bytes are truncated on a char boundary).
pub fn put_string(buf: &mut BytesMut, s: &str) {
    let s = short_str(s);
    buf.put_u16(s.len() as u16);
    buf.put_slice(s.as_bytes());
}

/// Writes `[long string]`.
pub fn put_long_string(buf: &mut BytesMut, s: &str) {
    put_len_i32(buf, s.len());
    buf.put_slice(s.as_bytes());
}

/// Writes an `[int]` length; frames are capped far below `i32::MAX`, so saturation never
/// happens in practice and only guards against wrapping to a negative (null) length.
fn put_len_i32(buf: &mut BytesMut, len: usize) {
    buf.put_i32(i32::try_from(len).unwrap_or(i32::MAX));
}

/// Writes `[bytes]`: int length + bytes, or length -1 for `None` (null).
pub fn put_bytes(buf: &mut BytesMut, v: Option<&[u8]>) {
    match v {
        Some(b) => {
            put_len_i32(buf, b.len());
            buf.put_slice(b);
        }
        None => buf.put_i32(-1),
    }
}

/// Writes `[short bytes]` (truncated to 65535 bytes; ids are 16).
pub fn put_short_bytes(buf: &mut BytesMut, v: &[u8]) {
    let v = &v[..v.len().min(u16::MAX as usize)];
    buf.put_u16(v.len() as u16);
    buf.put_slice(v);
}

/// Writes `[string list]`.
pub fn put_string_list<S: AsRef<str>>(buf: &mut BytesMut, items: &[S]) {
    let n = items.len().min(u16::MAX as usize);
    buf.put_u16(n as u16);
    for s in &items[..n] {
        put_string(buf, s.as_ref());
    }
}

/// Writes `[string map]`.
pub fn put_string_map<K: AsRef<str>, V: AsRef<str>>(buf: &mut BytesMut, items: &[(K, V)]) {
    let n = items.len().min(u16::MAX as usize);
    buf.put_u16(n as u16);
    for (k, v) in &items[..n] {
        put_string(buf, k.as_ref());
        put_string(buf, v.as_ref());
    }
}

/// Writes `[string multimap]`.
pub fn put_string_multimap<K, L, V>(buf: &mut BytesMut, items: &[(K, L)])
where
    K: AsRef<str>,
    L: AsRef<[V]>,
    V: AsRef<str>,
{
    let n = items.len().min(u16::MAX as usize);
    buf.put_u16(n as u16);
    for (k, vs) in &items[..n] {
        put_string(buf, k.as_ref());
        put_string_list(buf, vs.as_ref());
    }
}

/// Writes `[uuid]`.
pub fn put_uuid(buf: &mut BytesMut, v: &[u8; 16]) {
    buf.put_slice(v);
}

/// Writes `[inet]`: address length, address bytes, int port.
pub fn put_inet(buf: &mut BytesMut, addr: SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => {
            buf.put_u8(4);
            buf.put_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            buf.put_u8(16);
            buf.put_slice(&ip.octets());
        }
    }
    buf.put_i32(i32::from(addr.port()));
}

/// Writes `[consistency]`.
pub fn put_consistency(buf: &mut BytesMut, c: Consistency) {
    buf.put_u16(c as u16);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Value;

    #[test]
    fn primitives_round_trip() {
        let mut buf = BytesMut::new();
        put_u8(&mut buf, 7);
        put_short(&mut buf, 0xBEEF);
        put_int(&mut buf, -5);
        put_long(&mut buf, i64::MIN + 3);
        put_string(&mut buf, "héllo");
        put_long_string(&mut buf, "SELECT * FROM t");
        put_bytes(&mut buf, Some(b"abc"));
        put_bytes(&mut buf, None);
        put_short_bytes(&mut buf, &[1, 2, 3, 4]);
        put_consistency(&mut buf, Consistency::LocalQuorum);
        put_uuid(&mut buf, &[9; 16]);
        put_inet(&mut buf, "10.1.2.3:9042".parse().unwrap());
        put_inet(&mut buf, "[::1]:19042".parse().unwrap());
        put_string_map(
            &mut buf,
            &[("CQL_VERSION", "3.0.0"), ("COMPRESSION", "lz4")],
        );
        let body = buf.freeze();
        let mut r = Reader::new(&body);
        assert_eq!(r.read_u8().unwrap(), 7);
        assert_eq!(r.read_short().unwrap(), 0xBEEF);
        assert_eq!(r.read_int().unwrap(), -5);
        assert_eq!(r.read_long().unwrap(), i64::MIN + 3);
        assert_eq!(r.read_string().unwrap(), "héllo");
        assert_eq!(&r.read_long_string_bytes().unwrap()[..], b"SELECT * FROM t");
        assert_eq!(r.read_bytes().unwrap().as_deref(), Some(&b"abc"[..]));
        assert_eq!(r.read_bytes().unwrap(), None);
        assert_eq!(&r.read_short_bytes().unwrap()[..], &[1, 2, 3, 4]);
        assert_eq!(r.read_consistency().unwrap(), Consistency::LocalQuorum);
        assert_eq!(r.read_uuid().unwrap(), [9; 16]);
        assert_eq!(r.read_inet().unwrap(), "10.1.2.3:9042".parse().unwrap());
        assert_eq!(r.read_inet().unwrap(), "[::1]:19042".parse().unwrap());
        assert_eq!(
            r.read_string_map().unwrap(),
            vec![
                ("CQL_VERSION".to_owned(), "3.0.0".to_owned()),
                ("COMPRESSION".to_owned(), "lz4".to_owned())
            ]
        );
        assert_eq!(r.remaining(), 0);
        assert_eq!(r.read_u8(), Err(TRUNCATED));
    }

    #[test]
    fn values_null_unset_and_bad_lengths() {
        let mut buf = BytesMut::new();
        put_int(&mut buf, -1);
        put_int(&mut buf, -2);
        put_int(&mut buf, 2);
        buf.put_slice(b"xy");
        put_int(&mut buf, -3);
        let body = buf.freeze();
        let mut r = Reader::new(&body);
        assert_eq!(r.read_value().unwrap(), Value::Null);
        assert_eq!(r.read_value().unwrap(), Value::Unset);
        assert_eq!(
            r.read_value().unwrap(),
            Value::Set(Bytes::from_static(b"xy"))
        );
        assert!(r.read_value().is_err());
    }

    #[test]
    fn truncated_and_invalid_reads_fail_cleanly() {
        let body = Bytes::from_static(&[0x00, 0x05, b'a', b'b']);
        assert_eq!(Reader::new(&body).read_string(), Err(TRUNCATED));
        let body = Bytes::from_static(&[0x00, 0x02, 0xff, 0xfe]);
        assert!(Reader::new(&body).read_string().is_err());
        let body = Bytes::from_static(&[0x7f, 0xff, 0xff, 0xff, 1]);
        assert_eq!(Reader::new(&body).read_bytes(), Err(TRUNCATED));
        let body = Bytes::from_static(&[0xff, 0xff, 0xff, 0xf0]);
        assert!(Reader::new(&body).read_long_string_bytes().is_err());
        // A count of 65535 strings cannot fit in 2 remaining bytes.
        let body = Bytes::from_static(&[0xff, 0xff, 0x00, 0x00]);
        assert!(Reader::new(&body).read_string_map().is_err());
        let body = Bytes::from_static(&[0x05, 1, 2, 3, 4, 5, 0, 0, 0, 1]);
        assert!(Reader::new(&body).read_inet().is_err());
        let body = Bytes::from_static(&[0x00, 0x0B]);
        assert!(Reader::new(&body).read_consistency().is_err());
    }

    #[test]
    fn byte_reads_share_the_body_buffer() {
        let mut buf = BytesMut::new();
        put_bytes(&mut buf, Some(b"zero-copy"));
        let body = buf.freeze();
        let v = Reader::new(&body).read_bytes().unwrap().unwrap();
        let base = body.as_ptr() as usize;
        assert_eq!(v.as_ptr() as usize, base + 4);
    }

    #[test]
    fn oversized_strings_are_truncated_on_char_boundary() {
        let s = "é".repeat(40_000); // 80 000 bytes
        let mut buf = BytesMut::new();
        put_string(&mut buf, &s);
        let body = buf.freeze();
        let got = Reader::new(&body).read_string().unwrap();
        assert!(got.len() <= u16::MAX as usize && got.len() > 65_000);
        assert!(got.chars().all(|c| c == 'é'));
    }
}
