//! Order-preserving key encoding: the byte order of an encoded key equals CQL order.
//!
//! A data key is `token(8, sign bit flipped, BE) ‖ escaped partition key ‖ kind(1) ‖
//! clustering components`; each table has keyspaces of its own, so keys carry no table id
//! and begin with the token. Every component encoding is self-delimiting (no
//! encoding is a proper prefix of another), so the encoding of a clustering prefix is a byte
//! prefix of the encoding of every key that starts with it, and prefix bounds map to byte
//! ranges. A descending column is the bitwise complement of its ascending encoding
//! (terminators included), which reverses the order of a prefix-free code.
//!
//! Encodings (ascending):
//! - text, ascii, blob, inet, duration: bytes with `00` escaped as `00 FF`, then `00 01`.
//! - every other native type: a tag byte (`00` = empty value, `01` = value), then
//!   - integers, timestamp, time: big-endian with the sign bit flipped;
//!   - date: the raw unsigned 32-bit value; boolean: `00`/`01`;
//!   - float/double: IEEE total-order transform (NaN canonicalised, greatest, as in Java);
//!   - timeuuid: timestamp-first reordered high word (sign flipped) then low word compared
//!     as signed bytes (Cassandra `TimeUUIDType`);
//!   - uuid: version nibble, then (version 1) the timestamp or (others) the high word, then
//!     the low word unsigned (Cassandra `UUIDType`);
//!   - varint: sign class, magnitude length, magnitude (complemented when negative);
//!   - decimal: sign class, decimal exponent, significant digits (complemented when
//!     negative), so that numerically equal values (1.0, 1.00) encode equally, as Cassandra
//!     compares them.
//! - frozen list/set: `01 ‖ element` per element then `00`; frozen map: `01 ‖ key ‖ value`
//!   per entry then `00` (element-wise, then shorter first, as Cassandra compares them);
//!   tuple / UDT: per declared field `00` (absent), `01` (null) or `02 ‖ field`.

use crate::model::Order;
use crate::StorageError;
use bytes::Bytes;
use num_bigint::{BigInt, Sign};
use sluice_types::{CqlType, NativeType};
use std::ops::Bound;

/// Row kind byte of the partition header (partition deletion, range tombstones, static row).
pub const KIND_HEADER: u8 = 0x00;
/// Row kind byte of a clustering row.
pub const KIND_ROW: u8 = 0x01;

/// Largest key fjall accepts.
pub const MAX_KEY_LEN: usize = 65_535;

/// Length of the token at the start of every data key.
pub const TOKEN_LEN: usize = 8;

/// Maps a token to 8 bytes whose unsigned order is the signed order of tokens.
pub fn token_bytes(token: i64) -> [u8; 8] {
    ((token as u64) ^ (1 << 63)).to_be_bytes()
}

/// Inverse of [`token_bytes`].
pub fn token_from_bytes(b: [u8; 8]) -> i64 {
    (u64::from_be_bytes(b) ^ (1 << 63)) as i64
}

/// Appends `bytes` escaped (`00` -> `00 FF`) and terminated (`00 01`): order-preserving and
/// prefix-free.
pub fn escape_into(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0x00, 0x01]);
}

/// Reads an escaped string from the start of `input`; returns it and the bytes consumed.
pub fn unescape(input: &[u8]) -> Result<(Vec<u8>, usize), StorageError> {
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        match input.get(i) {
            None => return Err(StorageError::Corrupt("unterminated escaped key")),
            Some(0) => match input.get(i + 1) {
                Some(0xFF) => {
                    out.push(0);
                    i += 2;
                }
                Some(0x01) => return Ok((out, i + 2)),
                _ => return Err(StorageError::Corrupt("bad escape in key")),
            },
            Some(&b) => {
                out.push(b);
                i += 1;
            }
        }
    }
}

/// The key prefix of one partition: `token ‖ escaped partition key`.
pub fn partition_prefix(token: i64, partition_key: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(TOKEN_LEN + partition_key.len() + 4 + 64);
    key.extend_from_slice(&token_bytes(token));
    escape_into(partition_key, &mut key);
    key
}

/// The key of a partition's header (deletion, range tombstones, static row): its prefix
/// then [`KIND_HEADER`], so that it sorts just before the partition's rows.
pub fn header_key(partition_prefix: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(partition_prefix.len() + 1);
    key.extend_from_slice(partition_prefix);
    key.push(KIND_HEADER);
    key
}

/// Splits a data key into (token, partition key, kind, clustering bytes).
pub fn split_data_key(key: &[u8]) -> Result<(i64, Vec<u8>, u8, &[u8]), StorageError> {
    let token_raw: [u8; TOKEN_LEN] = key
        .get(..TOKEN_LEN)
        .and_then(|s| s.try_into().ok())
        .ok_or(StorageError::Corrupt("short data key"))?;
    let rest = key
        .get(TOKEN_LEN..)
        .ok_or(StorageError::Corrupt("short data key"))?;
    let (pk, used) = unescape(rest)?;
    let kind = *rest
        .get(used)
        .ok_or(StorageError::Corrupt("data key without kind"))?;
    let clustering = rest.get(used + 1..).unwrap_or(&[]);
    Ok((token_from_bytes(token_raw), pk, kind, clustering))
}

/// The kind byte of a data key ([`KIND_HEADER`] or [`KIND_ROW`]), found without copying the
/// partition key; None for a malformed key.
pub fn data_key_kind(key: &[u8]) -> Option<u8> {
    key.get(partition_prefix_len(key)?).copied()
}

/// The length of a data key's partition prefix ([`partition_prefix`]: the token and the
/// escaped partition key), None for a malformed key.
pub fn partition_prefix_len(key: &[u8]) -> Option<usize> {
    let rest = key.get(TOKEN_LEN..)?;
    let mut i = 0;
    loop {
        match rest.get(i)? {
            0 => match rest.get(i + 1)? {
                0xFF => i += 2,
                0x01 => return Some(TOKEN_LEN + i + 2),
                _ => return None,
            },
            _ => i += 1,
        }
    }
}

/// The partition prefix of data keys, which the table keyspaces' Bloom filters also hold:
/// a partition read is a range within one prefix, and skips the disk tables that lack it.
pub struct PartitionPrefixExtractor;

impl fjall::prefix::PrefixExtractor for PartitionPrefixExtractor {
    fn name(&self) -> &str {
        // Names the prefix format: a new one needs a new name.
        "sluice.partition.v1"
    }

    fn prefix_len(&self, key: &[u8]) -> Option<usize> {
        partition_prefix_len(key)
    }
}

/// Encodes a clustering key or prefix (values in clustering order) into `out`.
pub fn encode_clustering(
    columns: &[(CqlType, Order)],
    values: &[Bytes],
    out: &mut Vec<u8>,
) -> Result<(), StorageError> {
    if values.len() > columns.len() {
        return Err(StorageError::Corrupt("more clustering values than columns"));
    }
    for ((ty, order), value) in columns.iter().zip(values) {
        let start = out.len();
        encode_value(ty, value, out)?;
        if *order == Order::Desc {
            for b in &mut out[start..] {
                *b = !*b;
            }
        }
    }
    Ok(())
}

/// Encodes a clustering key or prefix into a fresh buffer.
pub fn clustering_bytes(
    columns: &[(CqlType, Order)],
    values: &[Bytes],
) -> Result<Vec<u8>, StorageError> {
    let mut out = Vec::with_capacity(values.iter().map(|v| v.len() + 4).sum());
    encode_clustering(columns, values, &mut out)?;
    Ok(out)
}

/// The smallest byte string greater than every string that starts with `prefix`, or None
/// when there is none (all bytes `FF`).
pub fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut out = prefix.to_vec();
    while let Some(last) = out.pop() {
        if last != 0xFF {
            out.push(last + 1);
            return Some(out);
        }
    }
    None
}

/// A clustering range in encoded form: `lo` inclusive (None = unbounded), `hi` exclusive
/// (None = unbounded). Comparisons are on encoded clustering bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByteRange {
    /// Inclusive lower bound.
    pub lo: Option<Vec<u8>>,
    /// Exclusive upper bound.
    pub hi: Option<Vec<u8>>,
}

impl ByteRange {
    /// True when the encoded clustering key lies in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.lo.as_deref().is_none_or(|lo| key >= lo)
            && self.hi.as_deref().is_none_or(|hi| key < hi)
    }

    /// True when the range cannot contain any key.
    pub fn is_empty(&self) -> bool {
        matches!((&self.lo, &self.hi), (Some(lo), Some(hi)) if lo >= hi)
    }

    /// Intersection with another range.
    pub fn intersect(&self, other: &ByteRange) -> ByteRange {
        let lo = match (&self.lo, &other.lo) {
            (Some(a), Some(b)) => Some(a.max(b).clone()),
            (a, b) => a.clone().or_else(|| b.clone()),
        };
        let hi = match (&self.hi, &other.hi) {
            (Some(a), Some(b)) => Some(a.min(b).clone()),
            (a, b) => a.clone().or_else(|| b.clone()),
        };
        ByteRange { lo, hi }
    }
}

/// Maps a pair of clustering-prefix bounds to the byte range of keys they select.
pub fn prefix_bounds_to_range(
    columns: &[(CqlType, Order)],
    start: &Bound<Vec<Bytes>>,
    end: &Bound<Vec<Bytes>>,
) -> Result<ByteRange, StorageError> {
    // An empty prefix selects everything whatever its inclusiveness.
    let lo = match start {
        Bound::Unbounded => None,
        Bound::Included(p) if p.is_empty() => None,
        Bound::Excluded(p) if p.is_empty() => None,
        Bound::Included(p) => Some(clustering_bytes(columns, p)?),
        Bound::Excluded(p) => match prefix_successor(&clustering_bytes(columns, p)?) {
            Some(s) => Some(s),
            // Nothing sorts after this prefix: the range is empty.
            None => {
                return Ok(ByteRange {
                    lo: Some(vec![0xFF]),
                    hi: Some(vec![0xFF]),
                })
            }
        },
    };
    let hi = match end {
        Bound::Unbounded => None,
        Bound::Included(p) if p.is_empty() => None,
        Bound::Excluded(p) if p.is_empty() => None,
        Bound::Included(p) => prefix_successor(&clustering_bytes(columns, p)?),
        Bound::Excluded(p) => Some(clustering_bytes(columns, p)?),
    };
    Ok(ByteRange { lo, hi })
}

const WRONG_WIDTH: StorageError = StorageError::Corrupt("clustering value has the wrong width");

fn fixed<const N: usize>(value: &[u8]) -> Result<[u8; N], StorageError> {
    value.try_into().map_err(|_| WRONG_WIDTH)
}

/// Appends the ascending order-preserving encoding of one value of type `ty`.
pub fn encode_value(ty: &CqlType, value: &[u8], out: &mut Vec<u8>) -> Result<(), StorageError> {
    match ty {
        CqlType::Native(n) => encode_native(*n, value, out),
        CqlType::Frozen(inner) => encode_value(inner, value, out),
        CqlType::List(elem) | CqlType::Set(elem) => {
            let mut r = Reader::new(value);
            let n = r.count()?;
            for _ in 0..n {
                out.push(0x01);
                encode_value(elem, r.element()?, out)?;
            }
            r.finish()?;
            out.push(0x00);
            Ok(())
        }
        CqlType::Map(k, v) => {
            let mut r = Reader::new(value);
            let n = r.count()?;
            for _ in 0..n {
                out.push(0x01);
                encode_value(k, r.element()?, out)?;
                encode_value(v, r.element()?, out)?;
            }
            r.finish()?;
            out.push(0x00);
            Ok(())
        }
        CqlType::Tuple(fields) => encode_fields(fields.iter(), value, out),
        CqlType::Udt { fields, .. } => encode_fields(fields.iter().map(|(_, t)| t), value, out),
    }
}

fn encode_fields<'a>(
    fields: impl Iterator<Item = &'a CqlType>,
    value: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), StorageError> {
    let mut r = Reader::new(value);
    for ty in fields {
        if r.is_empty() {
            // An absent trailing field sorts before null and every value.
            out.push(0x00);
            continue;
        }
        match r.optional_element()? {
            None => out.push(0x01),
            Some(field) => {
                out.push(0x02);
                encode_value(ty, field, out)?;
            }
        }
    }
    r.finish()
}

fn encode_native(ty: NativeType, value: &[u8], out: &mut Vec<u8>) -> Result<(), StorageError> {
    match ty {
        NativeType::Ascii
        | NativeType::Text
        | NativeType::Blob
        | NativeType::Inet
        | NativeType::Duration => {
            escape_into(value, out);
            return Ok(());
        }
        _ => {}
    }
    if value.is_empty() {
        // Cassandra sorts the empty value before every other value of the type.
        out.push(0x00);
        return Ok(());
    }
    out.push(0x01);
    match ty {
        NativeType::Tinyint => out.push(fixed::<1>(value)?[0] ^ 0x80),
        NativeType::Smallint => flip_sign(&fixed::<2>(value)?, out),
        NativeType::Int => flip_sign(&fixed::<4>(value)?, out),
        NativeType::Bigint | NativeType::Counter | NativeType::Timestamp | NativeType::Time => {
            flip_sign(&fixed::<8>(value)?, out)
        }
        NativeType::Date => out.extend_from_slice(&fixed::<4>(value)?),
        NativeType::Boolean => out.push(u8::from(fixed::<1>(value)?[0] != 0)),
        NativeType::Float => {
            let f = f32::from_be_bytes(fixed::<4>(value)?);
            let bits = if f.is_nan() {
                f32::NAN.to_bits()
            } else {
                f.to_bits()
            };
            let ordered = if bits & (1 << 31) != 0 {
                !bits
            } else {
                bits | (1 << 31)
            };
            out.extend_from_slice(&ordered.to_be_bytes());
        }
        NativeType::Double => {
            let f = f64::from_be_bytes(fixed::<8>(value)?);
            let bits = if f.is_nan() {
                f64::NAN.to_bits()
            } else {
                f.to_bits()
            };
            let ordered = if bits & (1 << 63) != 0 {
                !bits
            } else {
                bits | (1 << 63)
            };
            out.extend_from_slice(&ordered.to_be_bytes());
        }
        NativeType::Timeuuid => {
            let b = fixed::<16>(value)?;
            let (msb, lsb) = split_uuid(&b);
            out.extend_from_slice(&(reorder_timestamp(msb) ^ (1 << 63)).to_be_bytes());
            // Cassandra compares the low word as signed bytes.
            out.extend(lsb.to_be_bytes().iter().map(|b| b ^ 0x80));
        }
        NativeType::Uuid => {
            let b = fixed::<16>(value)?;
            let (msb, lsb) = split_uuid(&b);
            let version = ((msb >> 12) & 0xF) as u8;
            out.push(version);
            let high = if version == 1 {
                reorder_timestamp(msb)
            } else {
                msb
            };
            out.extend_from_slice(&high.to_be_bytes());
            out.extend_from_slice(&lsb.to_be_bytes());
        }
        NativeType::Varint => encode_varint(value, out),
        NativeType::Decimal => encode_decimal(value, out)?,
        NativeType::Ascii
        | NativeType::Text
        | NativeType::Blob
        | NativeType::Inet
        | NativeType::Duration => {
            // Returned early above; kept total without a panic path.
            escape_into(value, out)
        }
    }
    Ok(())
}

fn flip_sign(bytes: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(bytes);
    out[start] ^= 0x80;
}

fn split_uuid(b: &[u8; 16]) -> (u64, u64) {
    let mut hi = [0u8; 8];
    let mut lo = [0u8; 8];
    hi.copy_from_slice(&b[..8]);
    lo.copy_from_slice(&b[8..]);
    (u64::from_be_bytes(hi), u64::from_be_bytes(lo))
}

/// Cassandra's `TimeUUIDType.reorderTimestampBytes`: time_hi (with version), time_mid,
/// time_low, so that the word orders by timestamp.
fn reorder_timestamp(msb: u64) -> u64 {
    (msb << 48) | ((msb << 16) & 0xFFFF_0000_0000) | (msb >> 32)
}

fn encode_varint(value: &[u8], out: &mut Vec<u8>) {
    let n = BigInt::from_signed_bytes_be(value);
    let (sign, magnitude) = n.to_bytes_be();
    match sign {
        Sign::NoSign => out.push(0x01),
        Sign::Plus => {
            out.push(0x02);
            out.extend_from_slice(&(magnitude.len() as u32).to_be_bytes());
            out.extend_from_slice(&magnitude);
        }
        Sign::Minus => {
            // A larger magnitude is a smaller number: complement length and magnitude.
            out.push(0x00);
            out.extend_from_slice(&(!(magnitude.len() as u32)).to_be_bytes());
            out.extend(magnitude.iter().map(|b| !b));
        }
    }
}

fn encode_decimal(value: &[u8], out: &mut Vec<u8>) -> Result<(), StorageError> {
    let scale = i32::from_be_bytes(
        value
            .get(..4)
            .and_then(|s| s.try_into().ok())
            .ok_or(WRONG_WIDTH)?,
    );
    let unscaled = BigInt::from_signed_bytes_be(value.get(4..).unwrap_or(&[]));
    let (sign, magnitude) = unscaled.into_parts();
    if sign == Sign::NoSign {
        out.push(0x01);
        return Ok(());
    }
    let digits = magnitude.to_str_radix(10);
    let significant = digits.trim_end_matches('0');
    let trailing = (digits.len() - significant.len()) as i64;
    // value = 0.<significant> * 10^exponent, with a non-zero first digit.
    let exponent = significant.len() as i64 + trailing - i64::from(scale);
    let start = out.len();
    out.push(if sign == Sign::Minus { 0x00 } else { 0x02 });
    let body = out.len();
    out.extend_from_slice(&((exponent as u64) ^ (1 << 63)).to_be_bytes());
    out.extend_from_slice(significant.as_bytes());
    out.push(0x00);
    if sign == Sign::Minus {
        for b in &mut out[body..] {
            *b = !*b;
        }
    }
    debug_assert!(out.len() > start);
    Ok(())
}

/// Checked reader of native-protocol collection / tuple bytes (`i32` counts and lengths).
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn i32(&mut self) -> Result<i32, StorageError> {
        let raw: [u8; 4] = self
            .buf
            .get(..4)
            .and_then(|s| s.try_into().ok())
            .ok_or(StorageError::Corrupt("truncated collection value"))?;
        self.buf = &self.buf[4..];
        Ok(i32::from_be_bytes(raw))
    }

    fn count(&mut self) -> Result<usize, StorageError> {
        usize::try_from(self.i32()?).map_err(|_| StorageError::Corrupt("negative collection size"))
    }

    fn optional_element(&mut self) -> Result<Option<&'a [u8]>, StorageError> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(None);
        }
        let len = len as usize;
        let (head, tail) = (
            self.buf
                .get(..len)
                .ok_or(StorageError::Corrupt("truncated collection element"))?,
            &self.buf[len..],
        );
        self.buf = tail;
        Ok(Some(head))
    }

    fn element(&mut self) -> Result<&'a [u8], StorageError> {
        self.optional_element()?
            .ok_or(StorageError::Corrupt("null collection element"))
    }

    fn finish(&self) -> Result<(), StorageError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(StorageError::Corrupt("trailing bytes in collection value"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cmp::Ordering;

    fn enc(ty: &CqlType, order: Order, v: &[u8]) -> Vec<u8> {
        clustering_bytes(&[(ty.clone(), order)], &[Bytes::copy_from_slice(v)]).unwrap()
    }

    fn nat(t: NativeType) -> CqlType {
        CqlType::Native(t)
    }

    fn check_order(ty: &CqlType, a: &[u8], b: &[u8], expected: Ordering) {
        let asc = enc(ty, Order::Asc, a).cmp(&enc(ty, Order::Asc, b));
        assert_eq!(asc, expected, "asc {ty} {a:?} vs {b:?}");
        let desc = enc(ty, Order::Desc, a).cmp(&enc(ty, Order::Desc, b));
        assert_eq!(desc, expected.reverse(), "desc {ty} {a:?} vs {b:?}");
    }

    fn list_bytes(elems: &[&[u8]]) -> Vec<u8> {
        let mut out = (elems.len() as i32).to_be_bytes().to_vec();
        for e in elems {
            out.extend_from_slice(&(e.len() as i32).to_be_bytes());
            out.extend_from_slice(e);
        }
        out
    }

    fn decimal(scale: i32, unscaled: i64) -> Vec<u8> {
        let mut out = scale.to_be_bytes().to_vec();
        out.extend_from_slice(&BigInt::from(unscaled).to_signed_bytes_be());
        out
    }

    fn uuid_v1(timestamp: u64, lsb: u64) -> Vec<u8> {
        let time_low = timestamp & 0xFFFF_FFFF;
        let time_mid = (timestamp >> 32) & 0xFFFF;
        let time_hi = (timestamp >> 48) & 0x0FFF;
        let msb = (time_low << 32) | (time_mid << 16) | (1 << 12) | time_hi;
        let mut out = msb.to_be_bytes().to_vec();
        out.extend_from_slice(&lsb.to_be_bytes());
        out
    }

    proptest! {
        #[test]
        fn partition_prefix_len_finds_the_partition_prefix(
            token: i64,
            pk in proptest::collection::vec(any::<u8>(), 0..12),
            clustering in proptest::collection::vec(any::<u8>(), 0..12),
        ) {
            let prefix = partition_prefix(token, &pk);
            let header = header_key(&prefix);
            let mut row = prefix.clone();
            row.push(KIND_ROW);
            row.extend_from_slice(&clustering);
            for key in [&header, &row] {
                prop_assert_eq!(partition_prefix_len(key), Some(prefix.len()));
            }
            prop_assert_eq!(data_key_kind(&header), Some(KIND_HEADER));
            prop_assert_eq!(data_key_kind(&row), Some(KIND_ROW));
            // Cut inside the partition key: no prefix.
            prop_assert_eq!(partition_prefix_len(&prefix[..prefix.len() - 1]), None);
        }

        #[test]
        fn ints_order(a: i32, b: i32) {
            check_order(&nat(NativeType::Int), &a.to_be_bytes(), &b.to_be_bytes(), a.cmp(&b));
        }

        #[test]
        fn bigints_order(a: i64, b: i64) {
            for t in [NativeType::Bigint, NativeType::Timestamp, NativeType::Time] {
                check_order(&nat(t), &a.to_be_bytes(), &b.to_be_bytes(), a.cmp(&b));
            }
        }

        #[test]
        fn small_ints_order(a: i16, b: i16, c: i8, d: i8) {
            check_order(&nat(NativeType::Smallint), &a.to_be_bytes(), &b.to_be_bytes(), a.cmp(&b));
            check_order(&nat(NativeType::Tinyint), &c.to_be_bytes(), &d.to_be_bytes(), c.cmp(&d));
        }

        #[test]
        fn dates_order_unsigned(a: u32, b: u32) {
            check_order(&nat(NativeType::Date), &a.to_be_bytes(), &b.to_be_bytes(), a.cmp(&b));
        }

        #[test]
        fn doubles_order_like_java(a: f64, b: f64) {
            let expected = a.total_cmp(&b);
            // Java's Double.compare puts -0.0 before 0.0 and every NaN last, like total_cmp
            // for non-NaN values; positive NaN is what proptest generates, if any.
            prop_assume!(!a.is_nan() && !b.is_nan());
            check_order(&nat(NativeType::Double), &a.to_be_bytes(), &b.to_be_bytes(), expected);
        }

        #[test]
        fn floats_order_like_java(a: f32, b: f32) {
            prop_assume!(!a.is_nan() && !b.is_nan());
            check_order(&nat(NativeType::Float), &a.to_be_bytes(), &b.to_be_bytes(), a.total_cmp(&b));
        }

        #[test]
        fn blobs_and_text_order_bytewise(a: Vec<u8>, b: Vec<u8>) {
            for t in [NativeType::Blob, NativeType::Text, NativeType::Ascii, NativeType::Inet] {
                check_order(&nat(t), &a, &b, a.cmp(&b));
            }
        }

        #[test]
        fn varints_order_numerically(a: i128, b: i128) {
            let ea = BigInt::from(a).to_signed_bytes_be();
            let eb = BigInt::from(b).to_signed_bytes_be();
            check_order(&nat(NativeType::Varint), &ea, &eb, a.cmp(&b));
        }

        #[test]
        fn decimals_order_numerically(sa in -6i32..6, ua in -100_000i64..100_000, sb in -6i32..6, ub in -100_000i64..100_000) {
            // Compare a = ua * 10^-sa and b = ub * 10^-sb exactly on a common scale.
            let scale = 12;
            let na = i128::from(ua) * 10i128.pow((scale - sa) as u32);
            let nb = i128::from(ub) * 10i128.pow((scale - sb) as u32);
            check_order(&nat(NativeType::Decimal), &decimal(sa, ua), &decimal(sb, ub), na.cmp(&nb));
        }

        #[test]
        fn timeuuids_order_by_time_then_signed_bytes(ta in 0u64..(1 << 60), tb in 0u64..(1 << 60), la: u64, lb: u64) {
            let a = uuid_v1(ta, la);
            let b = uuid_v1(tb, lb);
            let signed = |x: u64| x.to_be_bytes().map(|v| v as i8);
            let expected = ta.cmp(&tb).then_with(|| signed(la).cmp(&signed(lb)));
            check_order(&nat(NativeType::Timeuuid), &a, &b, expected);
            let expected_uuid = ta.cmp(&tb).then_with(|| la.cmp(&lb));
            check_order(&nat(NativeType::Uuid), &a, &b, expected_uuid);
        }

        #[test]
        fn frozen_lists_order_elementwise(a: Vec<i32>, b: Vec<i32>) {
            let ty = CqlType::Frozen(Box::new(CqlType::List(Box::new(nat(NativeType::Int)))));
            let ba: Vec<[u8; 4]> = a.iter().map(|x| x.to_be_bytes()).collect();
            let bb: Vec<[u8; 4]> = b.iter().map(|x| x.to_be_bytes()).collect();
            let la = list_bytes(&ba.iter().map(|x| &x[..]).collect::<Vec<_>>());
            let lb = list_bytes(&bb.iter().map(|x| &x[..]).collect::<Vec<_>>());
            check_order(&ty, &la, &lb, a.cmp(&b));
        }

        #[test]
        fn composite_keys_order_lexicographically(a1: i32, a2: Vec<u8>, b1: i32, b2: Vec<u8>, desc1: bool, desc2: bool) {
            let o = |d: bool| if d { Order::Desc } else { Order::Asc };
            let cols = vec![(nat(NativeType::Int), o(desc1)), (nat(NativeType::Blob), o(desc2))];
            let ka = clustering_bytes(&cols, &[Bytes::copy_from_slice(&a1.to_be_bytes()), Bytes::from(a2.clone())]).unwrap();
            let kb = clustering_bytes(&cols, &[Bytes::copy_from_slice(&b1.to_be_bytes()), Bytes::from(b2.clone())]).unwrap();
            let c1 = if desc1 { b1.cmp(&a1) } else { a1.cmp(&b1) };
            let c2 = if desc2 { b2.cmp(&a2) } else { a2.cmp(&b2) };
            prop_assert_eq!(ka.cmp(&kb), c1.then(c2));
            // The encoded prefix is a byte prefix of the full key.
            let pa = clustering_bytes(&cols, &[Bytes::copy_from_slice(&a1.to_be_bytes())]).unwrap();
            prop_assert!(ka.starts_with(&pa));
        }

        #[test]
        fn escaped_partition_keys_round_trip(a: Vec<u8>, tail: Vec<u8>) {
            let mut out = Vec::new();
            escape_into(&a, &mut out);
            let used = out.len();
            out.extend_from_slice(&tail);
            let (back, n) = unescape(&out).unwrap();
            prop_assert_eq!(back, a);
            prop_assert_eq!(n, used);
        }
    }

    /// Values of a type, valid or empty, as the engine may hand them to storage.
    fn values_of(ty: &CqlType) -> BoxedStrategy<Vec<u8>> {
        let n = match ty {
            CqlType::Native(n) => *n,
            CqlType::Frozen(inner) => return values_of(inner),
            CqlType::List(e) | CqlType::Set(e) => {
                return proptest::collection::vec(values_of(e), 0..4)
                    .prop_map(|items| list_bytes(&items.iter().map(|x| &x[..]).collect::<Vec<_>>()))
                    .boxed()
            }
            CqlType::Map(k, v) => {
                return proptest::collection::vec((values_of(k), values_of(v)), 0..4)
                    .prop_map(|pairs| {
                        let mut out = (pairs.len() as i32).to_be_bytes().to_vec();
                        for (k, v) in pairs {
                            for x in [k, v] {
                                out.extend_from_slice(&(x.len() as i32).to_be_bytes());
                                out.extend_from_slice(&x);
                            }
                        }
                        out
                    })
                    .boxed()
            }
            CqlType::Tuple(items) => {
                let fields: Vec<_> = items
                    .iter()
                    .map(|t| proptest::option::of(values_of(t)))
                    .collect();
                return (fields, 0..=items.len())
                    .prop_map(|(fields, present)| {
                        let mut out = Vec::new();
                        for f in fields.into_iter().take(present) {
                            match f {
                                None => out.extend_from_slice(&(-1i32).to_be_bytes()),
                                Some(x) => {
                                    out.extend_from_slice(&(x.len() as i32).to_be_bytes());
                                    out.extend_from_slice(&x);
                                }
                            }
                        }
                        out
                    })
                    .boxed();
            }
            CqlType::Udt { .. } => unreachable!("not generated"),
        };
        let fixed = |w: usize| proptest::collection::vec(any::<u8>(), w..=w).boxed();
        let valued = match n {
            NativeType::Text | NativeType::Ascii | NativeType::Blob | NativeType::Duration => {
                proptest::collection::vec(prop_oneof![Just(0u8), Just(0xFF), any::<u8>()], 0..6)
                    .boxed()
            }
            NativeType::Inet => prop_oneof![fixed(4), fixed(16)].boxed(),
            NativeType::Float => prop_oneof![
                any::<f32>().prop_map(|f| f.to_be_bytes().to_vec()),
                Just(f32::NAN.to_be_bytes().to_vec()),
                Just((-0.0f32).to_be_bytes().to_vec()),
            ]
            .boxed(),
            NativeType::Double => prop_oneof![
                any::<f64>().prop_map(|f| f.to_be_bytes().to_vec()),
                Just(f64::NAN.to_be_bytes().to_vec()),
                Just(f64::INFINITY.to_be_bytes().to_vec()),
            ]
            .boxed(),
            NativeType::Boolean => (0u8..2).prop_map(|b| vec![b]).boxed(),
            // Any two's complement bytes, including non-minimal sign extension.
            NativeType::Varint => {
                proptest::collection::vec(prop_oneof![Just(0u8), Just(0xFF), any::<u8>()], 1..6)
                    .boxed()
            }
            NativeType::Decimal => (
                -4i32..4,
                proptest::collection::vec(prop_oneof![Just(0u8), Just(0xFF), any::<u8>()], 1..5),
            )
                .prop_map(|(scale, unscaled)| {
                    let mut out = scale.to_be_bytes().to_vec();
                    out.extend_from_slice(&unscaled);
                    out
                })
                .boxed(),
            NativeType::Uuid | NativeType::Timeuuid => {
                (fixed(16), prop_oneof![Just(1u8), Just(4u8)])
                    .prop_map(move |(mut b, version)| {
                        let version = if n == NativeType::Timeuuid {
                            1
                        } else {
                            version
                        };
                        b[6] = (b[6] & 0x0F) | (version << 4);
                        b
                    })
                    .boxed()
            }
            other => fixed(other.fixed_width().expect("fixed width")),
        };
        prop_oneof![1 => Just(Vec::new()), 9 => valued].boxed()
    }

    fn any_type() -> impl Strategy<Value = CqlType> {
        let natives = prop_oneof![
            Just(NativeType::Int),
            Just(NativeType::Bigint),
            Just(NativeType::Smallint),
            Just(NativeType::Tinyint),
            Just(NativeType::Boolean),
            Just(NativeType::Float),
            Just(NativeType::Double),
            Just(NativeType::Text),
            Just(NativeType::Blob),
            Just(NativeType::Varint),
            Just(NativeType::Decimal),
            Just(NativeType::Uuid),
            Just(NativeType::Timeuuid),
            Just(NativeType::Date),
            Just(NativeType::Time),
            Just(NativeType::Timestamp),
            Just(NativeType::Inet),
            Just(NativeType::Ascii),
        ]
        .prop_map(CqlType::Native);
        natives.prop_recursive(2, 6, 3, |inner| {
            prop_oneof![
                inner
                    .clone()
                    .prop_map(|t| CqlType::Frozen(Box::new(CqlType::List(Box::new(t))))),
                inner
                    .clone()
                    .prop_map(|t| CqlType::Frozen(Box::new(CqlType::Set(Box::new(t))))),
                (inner.clone(), inner.clone()).prop_map(|(k, v)| CqlType::Frozen(Box::new(
                    CqlType::Map(Box::new(k), Box::new(v))
                ))),
                proptest::collection::vec(inner, 1..4).prop_map(CqlType::Tuple),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The encoded byte order equals `sluice_types::value::compare`, ascending and
        /// descending, for every native type and nested frozen types.
        #[test]
        fn byte_order_equals_cql_compare((ty, a, b) in any_type().prop_flat_map(|t| {
            let v = values_of(&t);
            (Just(t), v.clone(), v)
        })) {
            let expected = sluice_types::value::compare(&ty, &a, &b);
            check_order(&ty, &a, &b, expected);
        }
    }

    proptest! {
        /// Malformed values and keys are errors, never panics.
        #[test]
        fn arbitrary_bytes_never_panic(ty in any_type(), bytes: Vec<u8>) {
            let mut out = Vec::new();
            let _ = encode_value(&ty, &bytes, &mut out);
            let _ = split_data_key(&bytes);
            let _ = unescape(&bytes);
        }
    }

    #[test]
    fn decimal_equal_values_encode_equally() {
        let ty = nat(NativeType::Decimal);
        assert_eq!(
            enc(&ty, Order::Asc, &decimal(1, 10)),
            enc(&ty, Order::Asc, &decimal(2, 100))
        );
        check_order(&ty, &decimal(0, -1), &decimal(3, -999), Ordering::Less);
        check_order(&ty, &decimal(0, 0), &decimal(5, 1), Ordering::Less);
    }

    #[test]
    fn empty_values_sort_first() {
        let ty = nat(NativeType::Int);
        check_order(&ty, &[], &i32::MIN.to_be_bytes(), Ordering::Less);
    }

    #[test]
    fn uuid_orders_by_version_first() {
        let ty = nat(NativeType::Uuid);
        let v1 = uuid_v1(u64::MAX >> 4, u64::MAX);
        let mut v4 = [0u8; 16];
        v4[6] = 0x40;
        check_order(&ty, &v1, &v4, Ordering::Less);
    }

    #[test]
    fn wrong_width_and_truncated_values_are_errors() {
        let cols = [(nat(NativeType::Int), Order::Asc)];
        assert!(clustering_bytes(&cols, &[Bytes::from_static(&[1, 2, 3])]).is_err());
        let list = [(
            CqlType::Frozen(Box::new(CqlType::List(Box::new(nat(NativeType::Int))))),
            Order::Asc,
        )];
        assert!(
            clustering_bytes(&list, &[Bytes::from_static(&[0, 0, 0, 2, 0, 0, 0, 4, 1])]).is_err()
        );
        assert!(unescape(&[1, 2, 0]).is_err());
    }

    #[test]
    fn prefix_bounds_select_prefixed_keys() {
        let cols = vec![
            (nat(NativeType::Int), Order::Asc),
            (nat(NativeType::Int), Order::Desc),
        ];
        let key = |a: i32, b: i32| {
            clustering_bytes(
                &cols,
                &[
                    Bytes::copy_from_slice(&a.to_be_bytes()),
                    Bytes::copy_from_slice(&b.to_be_bytes()),
                ],
            )
            .unwrap()
        };
        let p = |a: i32| vec![Bytes::copy_from_slice(&a.to_be_bytes())];
        // c1 > 1 AND c1 <= 3
        let r =
            prefix_bounds_to_range(&cols, &Bound::Excluded(p(1)), &Bound::Included(p(3))).unwrap();
        for (a, b, inside) in [
            (1, 5, false),
            (2, i32::MIN, true),
            (2, i32::MAX, true),
            (3, 0, true),
            (3, i32::MIN, true),
            (4, 0, false),
            (0, 0, false),
        ] {
            assert_eq!(r.contains(&key(a, b)), inside, "({a}, {b})");
        }
        // c1 >= 2 AND c1 < 3
        let r =
            prefix_bounds_to_range(&cols, &Bound::Included(p(2)), &Bound::Excluded(p(3))).unwrap();
        assert!(r.contains(&key(2, 7)) && !r.contains(&key(3, 7)) && !r.contains(&key(1, 7)));
        let token = token_bytes(-5);
        assert!(token < token_bytes(3) && token_from_bytes(token) == -5);
    }

    #[test]
    fn data_keys_split_back() {
        let mut key = partition_prefix(-42, b"a\0b");
        key.push(KIND_ROW);
        key.extend_from_slice(&[9, 9]);
        let (token, pk, kind, rest) = split_data_key(&key).unwrap();
        assert_eq!(
            (token, pk.as_slice(), kind, rest),
            (-42, &b"a\0b"[..], KIND_ROW, &[9u8, 9][..])
        );
        assert!(split_data_key(&key[..6]).is_err());
        assert!(
            split_data_key(&key[..10]).is_err(),
            "unterminated partition key"
        );
    }
}
