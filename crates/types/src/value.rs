//! CQL values in their native-protocol serialized form: validation, Cassandra's ordering,
//! formatting as CQL literals, and a decoded [`Value`] for code that needs to compute.
//!
//! A zero-length value of a native type (other than `duration`) is Cassandra's "empty"
//! value: valid, distinct from null, and ordered before every non-empty value. For the
//! text and blob types it is just the empty string.

use crate::cql_type::{CqlType, NativeType};
use crate::datetime::{self, Duration};
use num_bigint::{BigInt, Sign};
use std::cmp::Ordering;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

mod canonical;
pub use canonical::{canonicalize, contains_set_or_map};

/// Why a value is not a valid serialization of its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueError(pub &'static str);

impl std::fmt::Display for ValueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for ValueError {}

/// Checked reads over a serialized value; never panics on short input.
#[derive(Clone, Copy)]
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, err: &'static str) -> Result<&'a [u8], ValueError> {
        if self.buf.len() < n {
            return Err(ValueError(err));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn i32(&mut self) -> Result<i32, ValueError> {
        let b = self.take(4, "truncated collection or tuple")?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A `[bytes]`: i32 length then that many bytes; a negative length is null (None).
    fn bytes(&mut self) -> Result<Option<&'a [u8]>, ValueError> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(None);
        }
        self.take(len as usize, "element length exceeds the value")
            .map(Some)
    }

    /// A collection element: like `bytes` but null is not allowed.
    fn element(&mut self) -> Result<&'a [u8], ValueError> {
        self.bytes()?
            .ok_or(ValueError("null element in a collection"))
    }

    /// A collection count, bounded by what the remaining bytes can hold (4 bytes per
    /// element at least) so that a forged count cannot drive allocation.
    fn count(&mut self, per_item: usize) -> Result<usize, ValueError> {
        let n = self.i32()?;
        if n < 0 {
            return Err(ValueError("negative collection size"));
        }
        let n = n as usize;
        if n.saturating_mul(per_item) > self.buf.len() {
            return Err(ValueError("collection size exceeds the value"));
        }
        Ok(n)
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

fn fixed<const N: usize>(bytes: &[u8]) -> Option<[u8; N]> {
    bytes.try_into().ok()
}

/// Reads one Cassandra unsigned vint; returns the value and the bytes consumed.
fn read_unsigned_vint(buf: &[u8]) -> Option<(u64, usize)> {
    let first = *buf.first()?;
    // One byte, the common case (small months, days and timeouts in nanoseconds' low bits).
    if first < 0x80 {
        return Some((u64::from(first), 1));
    }
    let extra = first.leading_ones() as usize;
    let rest = buf.get(1..1 + extra)?;
    let mut v = if extra >= 8 {
        0
    } else {
        u64::from(first & (0xffu8 >> extra))
    };
    for &b in rest {
        v = (v << 8) | u64::from(b);
    }
    Some((v, 1 + extra))
}

fn read_signed_vint(buf: &[u8]) -> Option<(i64, usize)> {
    let (u, n) = read_unsigned_vint(buf)?;
    Some((((u >> 1) as i64) ^ -((u & 1) as i64), n))
}

fn write_unsigned_vint(v: u64, out: &mut Vec<u8>) {
    let magnitude = (v | 1).leading_zeros() as usize;
    let size = (639 - magnitude * 9) >> 6;
    if size == 1 {
        out.push(v as u8);
        return;
    }
    let extra = size - 1;
    let mut buf = [0u8; 9];
    buf[1..].copy_from_slice(&v.to_be_bytes());
    let bytes = &mut buf[9 - size..];
    bytes[0] |= !(0xffu16 >> extra) as u8;
    out.extend_from_slice(bytes);
}

fn write_signed_vint(v: i64, out: &mut Vec<u8>) {
    write_unsigned_vint(((v << 1) ^ (v >> 63)) as u64, out);
}

/// Decodes a serialized duration, checking the sign rule and ranges: what
/// [`Value::decode`] does for a `duration`, without building a type or a value.
pub fn decode_duration(bytes: &[u8]) -> Result<Duration, ValueError> {
    const BAD: ValueError = ValueError("invalid duration");
    let (months, a) = read_signed_vint(bytes).ok_or(BAD)?;
    let (days, b) = read_signed_vint(bytes.get(a..).ok_or(BAD)?).ok_or(BAD)?;
    let (nanos, c) = read_signed_vint(bytes.get(a + b..).ok_or(BAD)?).ok_or(BAD)?;
    if a + b + c != bytes.len() {
        return Err(ValueError("trailing bytes after duration"));
    }
    let months = i32::try_from(months).map_err(|_| BAD)?;
    let days = i32::try_from(days).map_err(|_| BAD)?;
    let all_non_neg = months >= 0 && days >= 0 && nanos >= 0;
    let all_non_pos = months <= 0 && days <= 0 && nanos <= 0;
    if !(all_non_neg || all_non_pos) {
        return Err(ValueError(
            "duration months, days and nanoseconds must have the same sign",
        ));
    }
    Ok(Duration {
        months,
        days,
        nanos,
    })
}

/// Serializes a duration (three zig-zag vints).
pub fn encode_duration(d: Duration, out: &mut Vec<u8>) {
    write_signed_vint(i64::from(d.months), out);
    write_signed_vint(i64::from(d.days), out);
    write_signed_vint(d.nanos, out);
}

fn validate_native(t: NativeType, bytes: &[u8]) -> Result<(), ValueError> {
    if bytes.is_empty() {
        return if t == NativeType::Duration {
            Err(ValueError("empty duration"))
        } else {
            Ok(())
        };
    }
    if let Some(width) = t.fixed_width() {
        if bytes.len() != width {
            return Err(ValueError(match width {
                1 => "expected 1 byte",
                2 => "expected 2 bytes",
                4 => "expected 4 bytes",
                8 => "expected 8 bytes",
                _ => "expected 16 bytes",
            }));
        }
    }
    let time_in_range = |b: &[u8]| {
        fixed(b)
            .map(i64::from_be_bytes)
            .is_some_and(|n| (0..datetime::NANOS_PER_DAY).contains(&n))
    };
    match t {
        NativeType::Ascii if !bytes.is_ascii() => Err(ValueError("invalid ASCII: byte above 0x7f")),
        NativeType::Text if std::str::from_utf8(bytes).is_err() => Err(ValueError("invalid UTF-8")),
        NativeType::Time if !time_in_range(bytes) => {
            Err(ValueError("time out of range (0 to 86399999999999 ns)"))
        }
        NativeType::Timeuuid if bytes.get(6).is_none_or(|b| b >> 4 != 1) => {
            Err(ValueError("timeuuid must be a version 1 UUID"))
        }
        NativeType::Inet if bytes.len() != 4 && bytes.len() != 16 => {
            Err(ValueError("inet must be 4 or 16 bytes"))
        }
        NativeType::Decimal if bytes.len() < 5 => {
            Err(ValueError("decimal needs a 4-byte scale and a varint"))
        }
        NativeType::Duration => decode_duration(bytes).map(|_| ()),
        _ => Ok(()),
    }
}

/// Checks that `bytes` is a valid serialization of `ty` (the content of a `[bytes]`
/// value; null is handled by the caller). Collections and tuples are checked recursively
/// and must have no trailing bytes.
pub fn validate(ty: &CqlType, bytes: &[u8]) -> Result<(), ValueError> {
    match ty {
        CqlType::Native(t) => validate_native(*t, bytes),
        CqlType::Frozen(inner) => validate(inner, bytes),
        CqlType::List(elem) | CqlType::Set(elem) => {
            let mut r = Reader { buf: bytes };
            let n = r.count(4)?;
            for _ in 0..n {
                validate(elem, r.element()?)?;
            }
            no_trailing(&r)
        }
        CqlType::Map(k, v) => {
            let mut r = Reader { buf: bytes };
            let n = r.count(8)?;
            for _ in 0..n {
                validate(k, r.element()?)?;
                validate(v, r.element()?)?;
            }
            no_trailing(&r)
        }
        CqlType::Tuple(items) => {
            let mut r = Reader { buf: bytes };
            for item in items {
                // Cassandra accepts a tuple value cut short: missing trailing items are null.
                if r.is_empty() {
                    break;
                }
                if let Some(b) = r.bytes()? {
                    validate(item, b)?;
                }
            }
            no_trailing(&r)
        }
        CqlType::Udt { fields, .. } => {
            let mut r = Reader { buf: bytes };
            for (_, fty) in fields {
                if r.is_empty() {
                    break;
                }
                if let Some(b) = r.bytes()? {
                    validate(fty, b)?;
                }
            }
            no_trailing(&r)
        }
    }
}

fn no_trailing(r: &Reader<'_>) -> Result<(), ValueError> {
    if r.is_empty() {
        Ok(())
    } else {
        Err(ValueError("trailing bytes after the last element"))
    }
}

/// Compares two varints (big-endian two's complement, any length) numerically.
fn compare_varint(a: &[u8], b: &[u8]) -> Ordering {
    let neg = |x: &[u8]| x.first().is_some_and(|&b| b & 0x80 != 0);
    let (na, nb) = (neg(a), neg(b));
    if na != nb {
        return if na {
            Ordering::Less
        } else {
            Ordering::Greater
        };
    }
    // Strip redundant sign-extension bytes, then the longer magnitude wins (or loses, when
    // negative); equal lengths compare bytewise, which is numeric for equal signs.
    let strip = |x: &[u8]| -> usize {
        let pad = if neg(x) { 0xff } else { 0x00 };
        let mut i = 0;
        while i + 1 < x.len() && x[i] == pad && ((x[i + 1] & 0x80 != 0) == (pad == 0xff)) {
            i += 1;
        }
        i
    };
    let (a, b) = (&a[strip(a)..], &b[strip(b)..]);
    match a.len().cmp(&b.len()) {
        Ordering::Equal => a.cmp(b),
        longer if na => longer.reverse(),
        longer => longer,
    }
}

fn varint_of(bytes: &[u8]) -> BigInt {
    BigInt::from_signed_bytes_be(bytes)
}

/// Number of decimal digits of |v| (1 for zero).
fn decimal_digits(v: &BigInt) -> i64 {
    if v.sign() == Sign::NoSign {
        return 1;
    }
    v.magnitude().to_str_radix(10).len() as i64
}

/// Compares two decimals numerically (1.0 == 1.00, as Java's `BigDecimal.compareTo`),
/// without materialising a power of ten larger than the operands themselves.
fn compare_decimal(a: &[u8], b: &[u8]) -> Ordering {
    let parse = |x: &[u8]| -> Option<(i32, BigInt)> {
        let scale = i32::from_be_bytes(fixed(x.get(..4)?)?);
        Some((scale, varint_of(x.get(4..)?)))
    };
    let (Some((sa, ua)), Some((sb, ub))) = (parse(a), parse(b)) else {
        return a.cmp(b);
    };
    let sign_cmp = ua.sign().cmp(&ub.sign());
    if sign_cmp != Ordering::Equal || ua.sign() == Sign::NoSign {
        return sign_cmp;
    }
    let negative = ua.sign() == Sign::Minus;
    // Magnitude exponent: value ~ 10^(digits - scale). Different exponents decide.
    let ea = decimal_digits(&ua) - i64::from(sa);
    let eb = decimal_digits(&ub) - i64::from(sb);
    let mag = if ea != eb {
        ea.cmp(&eb)
    } else {
        // Same exponent: the scale gap is at most the digit-count gap, so bounded by the
        // operand sizes.
        let (ma, mb) = (ua.magnitude().clone(), ub.magnitude().clone());
        match sa.cmp(&sb) {
            Ordering::Equal => ma.cmp(&mb),
            Ordering::Less => {
                let p =
                    num_bigint::BigUint::from(10u32).pow((i64::from(sb) - i64::from(sa)) as u32);
                (ma * p).cmp(&mb)
            }
            Ordering::Greater => {
                let p =
                    num_bigint::BigUint::from(10u32).pow((i64::from(sa) - i64::from(sb)) as u32);
                ma.cmp(&(mb * p))
            }
        }
    };
    if negative {
        mag.reverse()
    } else {
        mag
    }
}

/// Java's `Float.compare` / `Double.compare`: -0.0 < 0.0, NaN equal to itself and
/// greater than everything.
fn compare_f64(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.total_cmp(&b),
    }
}

fn be_u64(b: &[u8]) -> u64 {
    fixed::<8>(b).map_or(0, u64::from_be_bytes)
}

/// The 60-bit timestamp of a version-1 UUID's first 8 bytes, with the version nibble on
/// top (Cassandra's `reorderTimestampBytes`).
fn reorder_timestamp(msb: u64) -> u64 {
    (msb << 48) | ((msb << 16) & 0xFFFF_0000_0000) | (msb >> 32)
}

/// Cassandra's `TimeUUIDType` order: timestamp, then the low 8 bytes as signed bytes.
fn compare_timeuuid(a: &[u8], b: &[u8]) -> Ordering {
    let (ma, mb) = (
        reorder_timestamp(be_u64(&a[..8])),
        reorder_timestamp(be_u64(&b[..8])),
    );
    (ma as i64).cmp(&(mb as i64)).then_with(|| {
        a[8..]
            .iter()
            .map(|&x| x as i8)
            .cmp(b[8..].iter().map(|&x| x as i8))
    })
}

/// Cassandra's `UUIDType` order: version, then (v1) timestamp or (others) the high 8
/// bytes unsigned, then the low 8 bytes unsigned.
fn compare_uuid(a: &[u8], b: &[u8]) -> Ordering {
    let (ma, mb) = (be_u64(&a[..8]), be_u64(&b[..8]));
    let (va, vb) = ((ma >> 12) & 0xf, (mb >> 12) & 0xf);
    if va != vb {
        return va.cmp(&vb);
    }
    let high = if va == 1 {
        (reorder_timestamp(ma) as i64).cmp(&(reorder_timestamp(mb) as i64))
    } else {
        ma.cmp(&mb)
    };
    high.then_with(|| be_u64(&a[8..]).cmp(&be_u64(&b[8..])))
}

fn compare_native(t: NativeType, a: &[u8], b: &[u8]) -> Ordering {
    // Empty sorts first; a malformed width falls back to bytes so the order stays total.
    match (a.is_empty(), b.is_empty()) {
        (true, true) => return Ordering::Equal,
        (true, false) => return Ordering::Less,
        (false, true) => return Ordering::Greater,
        _ => {}
    }
    if let Some(w) = t.fixed_width() {
        if a.len() != w || b.len() != w {
            return a.len().cmp(&b.len()).then_with(|| a.cmp(b));
        }
    }
    match t {
        NativeType::Tinyint => (a[0] as i8).cmp(&(b[0] as i8)),
        NativeType::Smallint => {
            i16::from_be_bytes([a[0], a[1]]).cmp(&i16::from_be_bytes([b[0], b[1]]))
        }
        NativeType::Int => i32::from_be_bytes([a[0], a[1], a[2], a[3]])
            .cmp(&i32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        NativeType::Bigint | NativeType::Counter | NativeType::Timestamp | NativeType::Time => {
            (be_u64(a) as i64).cmp(&(be_u64(b) as i64))
        }
        NativeType::Float => compare_f64(
            f64::from(f32::from_be_bytes([a[0], a[1], a[2], a[3]])),
            f64::from(f32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        ),
        NativeType::Double => compare_f64(f64::from_bits(be_u64(a)), f64::from_bits(be_u64(b))),
        NativeType::Boolean => (a[0] != 0).cmp(&(b[0] != 0)),
        NativeType::Varint => compare_varint(a, b),
        NativeType::Decimal => compare_decimal(a, b),
        NativeType::Uuid => compare_uuid(a, b),
        NativeType::Timeuuid => compare_timeuuid(a, b),
        NativeType::Duration => {
            // Durations have no natural order (1mo vs 30d); Cassandra forbids them in keys
            // and orders them by bytes internally.
            a.cmp(b)
        }
        // ascii, text, blob, inet, date (unsigned days): unsigned bytewise.
        _ => a.cmp(b),
    }
}

/// Compares two serialized values of `ty` in Cassandra's order for that type (the order
/// of clustering columns and of sets and map keys). Malformed input never panics: it
/// compares in some consistent order.
pub fn compare(ty: &CqlType, a: &[u8], b: &[u8]) -> Ordering {
    match ty {
        CqlType::Native(t) => compare_native(*t, a, b),
        CqlType::Frozen(inner) => compare(inner, a, b),
        CqlType::List(elem) | CqlType::Set(elem) => {
            compare_collections(a, b, |ra, rb| compare_elements(elem, ra, rb), 1)
        }
        CqlType::Map(k, v) => compare_collections(
            a,
            b,
            |ra, rb| compare_elements(k, ra, rb).then_with(|| compare_elements(v, ra, rb)),
            2,
        ),
        CqlType::Tuple(items) => compare_tuple(items.iter(), a, b),
        CqlType::Udt { fields, .. } => compare_tuple(fields.iter().map(|(_, t)| t), a, b),
    }
}

/// Compares the next `[bytes]` element of each reader; null sorts first.
fn compare_elements(ty: &CqlType, ra: &mut Reader<'_>, rb: &mut Reader<'_>) -> Ordering {
    match (ra.bytes(), rb.bytes()) {
        (Ok(Some(x)), Ok(Some(y))) => compare(ty, x, y),
        (Ok(None), Ok(None)) => Ordering::Equal,
        (Ok(None), Ok(Some(_))) => Ordering::Less,
        (Ok(Some(_)), Ok(None)) => Ordering::Greater,
        (Err(_), Err(_)) => Ordering::Equal,
        (Err(_), _) => Ordering::Less,
        (_, Err(_)) => Ordering::Greater,
    }
}

/// Lexicographic comparison of two collections, then by size (shorter first).
fn compare_collections(
    a: &[u8],
    b: &[u8],
    mut item: impl FnMut(&mut Reader<'_>, &mut Reader<'_>) -> Ordering,
    per_item: usize,
) -> Ordering {
    let mut ra = Reader { buf: a };
    let mut rb = Reader { buf: b };
    let (na, nb) = match (ra.count(4 * per_item), rb.count(4 * per_item)) {
        (Ok(x), Ok(y)) => (x, y),
        _ => return a.cmp(b),
    };
    for _ in 0..na.min(nb) {
        let c = item(&mut ra, &mut rb);
        if c != Ordering::Equal {
            return c;
        }
    }
    na.cmp(&nb)
}

fn compare_tuple<'t>(items: impl Iterator<Item = &'t CqlType>, a: &[u8], b: &[u8]) -> Ordering {
    let mut ra = Reader { buf: a };
    let mut rb = Reader { buf: b };
    for ty in items {
        match (ra.is_empty(), rb.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        let c = compare_elements(ty, &mut ra, &mut rb);
        if c != Ordering::Equal {
            return c;
        }
    }
    Ordering::Equal
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn write_hex(bytes: &[u8], out: &mut String) {
    out.reserve(bytes.len() * 2);
    for &b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0xf)] as char);
    }
}

/// Writes a UUID in its canonical hyphenated lower-case form.
pub fn write_uuid(u: &[u8; 16], out: &mut String) {
    write_hex(&u[..4], out);
    out.push('-');
    write_hex(&u[4..6], out);
    out.push('-');
    write_hex(&u[6..8], out);
    out.push('-');
    write_hex(&u[8..10], out);
    out.push('-');
    write_hex(&u[10..], out);
}

/// Writes `s` as a single-quoted CQL string, doubling embedded quotes.
pub fn write_quoted(s: &str, out: &mut String) {
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push('\'');
        }
        out.push(c);
    }
    out.push('\'');
}

fn write_f64(v: f64, out: &mut String) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        // Debug keeps a `.0` or an exponent, so the text reads back as a float literal.
        let _ = write!(out, "{v:?}");
    }
}

fn write_f32(v: f32, out: &mut String) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        let _ = write!(out, "{v:?}");
    }
}

/// Writes a decimal `unscaled × 10^-scale` as a CQL numeric literal.
fn write_decimal(scale: i32, unscaled: &BigInt, out: &mut String) {
    let digits = unscaled.magnitude().to_str_radix(10);
    if unscaled.sign() == Sign::Minus {
        out.push('-');
    }
    let n = digits.len() as i64;
    let scale = i64::from(scale);
    if scale == 0 {
        out.push_str(&digits);
    } else if scale > 0 && scale < n {
        let point = (n - scale) as usize;
        out.push_str(&digits[..point]);
        out.push('.');
        out.push_str(&digits[point..]);
    } else if scale >= n && scale - n <= 20 {
        out.push_str("0.");
        for _ in 0..(scale - n) {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        // Negative or very large scale: an exponent keeps the text short.
        let _ = write!(out, "{digits}E{}", -scale);
    }
}

/// The function that turns a blob into this type (`blobAsInt`), for empty values, which
/// have no literal of their own.
fn blob_as_function(t: NativeType) -> &'static str {
    match t {
        NativeType::Ascii => "blobAsAscii",
        NativeType::Bigint => "blobAsBigint",
        NativeType::Blob => "blobAsBlob",
        NativeType::Boolean => "blobAsBoolean",
        NativeType::Counter => "blobAsCounter",
        NativeType::Decimal => "blobAsDecimal",
        NativeType::Double => "blobAsDouble",
        NativeType::Float => "blobAsFloat",
        NativeType::Int => "blobAsInt",
        NativeType::Timestamp => "blobAsTimestamp",
        NativeType::Uuid => "blobAsUuid",
        NativeType::Text => "blobAsText",
        NativeType::Varint => "blobAsVarint",
        NativeType::Timeuuid => "blobAsTimeuuid",
        NativeType::Inet => "blobAsInet",
        NativeType::Date => "blobAsDate",
        NativeType::Time => "blobAsTime",
        NativeType::Smallint => "blobAsSmallint",
        NativeType::Tinyint => "blobAsTinyint",
        NativeType::Duration => "blobAsDuration",
    }
}

/// Writes a serialized value of `ty` as a CQL literal that reads back to the same value:
/// `'it''s'`, `0xcafe`, `123`, `1.5`, `NaN`, uuids bare, `'2024-01-02T03:04:05.123Z'`,
/// `'2024-01-02'`, `'01:02:03.000000000'`, `'1.2.3.4'`, `1h30m`, `[1, 2]`, `{1, 2}`,
/// `{'k': 1}`, `(1, 'a')`, `{f: 1}`. A value that is not valid for its type is written
/// as the blob it is, so output never lies about the bytes.
pub fn format_cql(ty: &CqlType, bytes: &[u8], out: &mut String) {
    if validate(ty, bytes).is_err() {
        out.push_str("0x");
        write_hex(bytes, out);
        return;
    }
    write_valid(ty, bytes, out);
}

fn write_valid(ty: &CqlType, bytes: &[u8], out: &mut String) {
    match ty {
        CqlType::Native(t) => write_native(*t, bytes, out),
        CqlType::Frozen(inner) => write_valid(inner, bytes, out),
        CqlType::List(elem) | CqlType::Set(elem) => {
            let (open, close) = if matches!(ty, CqlType::List(_)) {
                ('[', ']')
            } else {
                ('{', '}')
            };
            out.push(open);
            let mut r = Reader { buf: bytes };
            let n = r.count(4).unwrap_or(0);
            for i in 0..n {
                if i > 0 {
                    out.push_str(", ");
                }
                if let Ok(e) = r.element() {
                    write_valid(elem, e, out);
                }
            }
            out.push(close);
        }
        CqlType::Map(k, v) => {
            out.push('{');
            let mut r = Reader { buf: bytes };
            let n = r.count(8).unwrap_or(0);
            for i in 0..n {
                if i > 0 {
                    out.push_str(", ");
                }
                if let (Ok(kb), Ok(vb)) = (r.element(), r.element()) {
                    write_valid(k, kb, out);
                    out.push_str(": ");
                    write_valid(v, vb, out);
                }
            }
            out.push('}');
        }
        CqlType::Tuple(items) => {
            out.push('(');
            let mut r = Reader { buf: bytes };
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                match r.bytes() {
                    Ok(Some(b)) => write_valid(item, b, out),
                    _ => out.push_str("null"),
                }
            }
            out.push(')');
        }
        CqlType::Udt { fields, .. } => {
            out.push('{');
            let mut r = Reader { buf: bytes };
            for (i, (name, fty)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_identifier(name, out);
                out.push_str(": ");
                match r.bytes() {
                    Ok(Some(b)) => write_valid(fty, b, out),
                    _ => out.push_str("null"),
                }
            }
            out.push('}');
        }
    }
}

/// Writes an identifier, double-quoted when it is not a plain lower-case name.
pub fn write_identifier(name: &str, out: &mut String) {
    let plain = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if plain {
        out.push_str(name);
    } else {
        out.push('"');
        for c in name.chars() {
            if c == '"' {
                out.push('"');
            }
            out.push(c);
        }
        out.push('"');
    }
}

/// Writes a valid, non-empty-or-empty native value.
fn write_native(t: NativeType, b: &[u8], out: &mut String) {
    if b.is_empty() {
        match t {
            NativeType::Ascii | NativeType::Text => out.push_str("''"),
            NativeType::Blob => out.push_str("0x"),
            _ => {
                out.push_str(blob_as_function(t));
                out.push_str("(0x)");
            }
        }
        return;
    }
    match Value::decode_native(t, b) {
        Ok(v) => v.write_cql(out),
        Err(_) => {
            out.push_str("0x");
            write_hex(b, out);
        }
    }
}

/// A decoded CQL value, for code that computes on values (system tables, conditions,
/// counters, literal typing). The wire form stays the source of truth.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// The zero-length value of a native type other than text and blob.
    Empty,
    /// `ascii`.
    Ascii(String),
    /// `text`.
    Text(String),
    /// `blob`.
    Blob(Vec<u8>),
    /// `boolean`.
    Boolean(bool),
    /// `tinyint`.
    Tinyint(i8),
    /// `smallint`.
    Smallint(i16),
    /// `int`.
    Int(i32),
    /// `bigint`.
    Bigint(i64),
    /// `counter`.
    Counter(i64),
    /// `float`.
    Float(f32),
    /// `double`.
    Double(f64),
    /// `varint`.
    Varint(BigInt),
    /// `decimal`: `unscaled × 10^-scale`.
    Decimal {
        /// Scale (digits after the point; may be negative).
        scale: i32,
        /// Unscaled value.
        unscaled: BigInt,
    },
    /// `timestamp`: ms since the epoch.
    Timestamp(i64),
    /// `date`: serialized form (days since the epoch + 2^31).
    Date(u32),
    /// `time`: ns since midnight.
    Time(i64),
    /// `uuid`.
    Uuid([u8; 16]),
    /// `timeuuid`.
    Timeuuid([u8; 16]),
    /// `inet`.
    Inet(IpAddr),
    /// `duration`.
    Duration(Duration),
    /// `list<T>`.
    List(Vec<Value>),
    /// `set<T>` (elements in serialized order, which is sorted for stored values).
    Set(Vec<Value>),
    /// `map<K, V>`.
    Map(Vec<(Value, Value)>),
    /// `tuple<...>`: one entry per item, None for null.
    Tuple(Vec<Option<Value>>),
    /// A user-defined type value: field name and value (None for null), in field order.
    Udt(Vec<(String, Option<Value>)>),
}

impl Value {
    /// Decodes a serialized value of `ty`, validating it.
    pub fn decode(ty: &CqlType, bytes: &[u8]) -> Result<Value, ValueError> {
        match ty {
            CqlType::Native(t) => {
                validate_native(*t, bytes)?;
                Value::decode_native(*t, bytes)
            }
            CqlType::Frozen(inner) => Value::decode(inner, bytes),
            CqlType::List(elem) | CqlType::Set(elem) => {
                let mut r = Reader { buf: bytes };
                let n = r.count(4)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(Value::decode(elem, r.element()?)?);
                }
                no_trailing(&r)?;
                Ok(if matches!(ty, CqlType::List(_)) {
                    Value::List(items)
                } else {
                    Value::Set(items)
                })
            }
            CqlType::Map(k, v) => {
                let mut r = Reader { buf: bytes };
                let n = r.count(8)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    let key = Value::decode(k, r.element()?)?;
                    let val = Value::decode(v, r.element()?)?;
                    items.push((key, val));
                }
                no_trailing(&r)?;
                Ok(Value::Map(items))
            }
            CqlType::Tuple(types) => {
                let mut r = Reader { buf: bytes };
                let mut items = Vec::with_capacity(types.len());
                for t in types {
                    let item = if r.is_empty() { None } else { r.bytes()? };
                    items.push(item.map(|b| Value::decode(t, b)).transpose()?);
                }
                no_trailing(&r)?;
                Ok(Value::Tuple(items))
            }
            CqlType::Udt { fields, .. } => {
                let mut r = Reader { buf: bytes };
                let mut items = Vec::with_capacity(fields.len());
                for (name, t) in fields {
                    let item = if r.is_empty() { None } else { r.bytes()? };
                    items.push((name.clone(), item.map(|b| Value::decode(t, b)).transpose()?));
                }
                no_trailing(&r)?;
                Ok(Value::Udt(items))
            }
        }
    }

    /// Decodes a native value whose width the caller has validated.
    fn decode_native(t: NativeType, b: &[u8]) -> Result<Value, ValueError> {
        const WIDTH: ValueError = ValueError("wrong width");
        if b.is_empty() {
            return Ok(match t {
                NativeType::Ascii => Value::Ascii(String::new()),
                NativeType::Text => Value::Text(String::new()),
                NativeType::Blob => Value::Blob(Vec::new()),
                _ => Value::Empty,
            });
        }
        Ok(match t {
            NativeType::Ascii => Value::Ascii(
                std::str::from_utf8(b)
                    .map_err(|_| ValueError("invalid ASCII"))?
                    .to_owned(),
            ),
            NativeType::Text => Value::Text(
                std::str::from_utf8(b)
                    .map_err(|_| ValueError("invalid UTF-8"))?
                    .to_owned(),
            ),
            NativeType::Blob => Value::Blob(b.to_vec()),
            NativeType::Boolean => Value::Boolean(b.first().ok_or(WIDTH)? != &0),
            NativeType::Tinyint => Value::Tinyint(*b.first().ok_or(WIDTH)? as i8),
            NativeType::Smallint => Value::Smallint(i16::from_be_bytes(fixed(b).ok_or(WIDTH)?)),
            NativeType::Int => Value::Int(i32::from_be_bytes(fixed(b).ok_or(WIDTH)?)),
            NativeType::Bigint => Value::Bigint(i64::from_be_bytes(fixed(b).ok_or(WIDTH)?)),
            NativeType::Counter => Value::Counter(i64::from_be_bytes(fixed(b).ok_or(WIDTH)?)),
            NativeType::Timestamp => Value::Timestamp(i64::from_be_bytes(fixed(b).ok_or(WIDTH)?)),
            NativeType::Time => Value::Time(i64::from_be_bytes(fixed(b).ok_or(WIDTH)?)),
            NativeType::Date => Value::Date(u32::from_be_bytes(fixed(b).ok_or(WIDTH)?)),
            NativeType::Float => Value::Float(f32::from_be_bytes(fixed(b).ok_or(WIDTH)?)),
            NativeType::Double => Value::Double(f64::from_be_bytes(fixed(b).ok_or(WIDTH)?)),
            NativeType::Uuid => Value::Uuid(fixed(b).ok_or(WIDTH)?),
            NativeType::Timeuuid => Value::Timeuuid(fixed(b).ok_or(WIDTH)?),
            NativeType::Varint => Value::Varint(varint_of(b)),
            NativeType::Decimal => Value::Decimal {
                scale: i32::from_be_bytes(fixed(b.get(..4).ok_or(WIDTH)?).ok_or(WIDTH)?),
                unscaled: varint_of(&b[4..]),
            },
            NativeType::Inet => match b.len() {
                4 => Value::Inet(IpAddr::V4(Ipv4Addr::from(fixed::<4>(b).ok_or(WIDTH)?))),
                16 => Value::Inet(IpAddr::V6(Ipv6Addr::from(fixed::<16>(b).ok_or(WIDTH)?))),
                _ => return Err(ValueError("inet must be 4 or 16 bytes")),
            },
            NativeType::Duration => Value::Duration(decode_duration(b)?),
        })
    }

    /// Appends the serialized form (the content of a `[bytes]`, without its length).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Empty => {}
            Value::Ascii(s) | Value::Text(s) => out.extend_from_slice(s.as_bytes()),
            Value::Blob(b) => out.extend_from_slice(b),
            Value::Boolean(v) => out.push(u8::from(*v)),
            Value::Tinyint(v) => out.push(*v as u8),
            Value::Smallint(v) => out.extend_from_slice(&v.to_be_bytes()),
            Value::Int(v) => out.extend_from_slice(&v.to_be_bytes()),
            Value::Bigint(v) | Value::Counter(v) | Value::Timestamp(v) | Value::Time(v) => {
                out.extend_from_slice(&v.to_be_bytes())
            }
            Value::Date(v) => out.extend_from_slice(&v.to_be_bytes()),
            Value::Float(v) => out.extend_from_slice(&v.to_be_bytes()),
            Value::Double(v) => out.extend_from_slice(&v.to_be_bytes()),
            Value::Uuid(u) | Value::Timeuuid(u) => out.extend_from_slice(u),
            Value::Varint(v) => out.extend_from_slice(&v.to_signed_bytes_be()),
            Value::Decimal { scale, unscaled } => {
                out.extend_from_slice(&scale.to_be_bytes());
                out.extend_from_slice(&unscaled.to_signed_bytes_be());
            }
            Value::Inet(IpAddr::V4(a)) => out.extend_from_slice(&a.octets()),
            Value::Inet(IpAddr::V6(a)) => out.extend_from_slice(&a.octets()),
            Value::Duration(d) => encode_duration(*d, out),
            Value::List(items) | Value::Set(items) => {
                out.extend_from_slice(&(items.len() as i32).to_be_bytes());
                for item in items {
                    encode_element(Some(item), out);
                }
            }
            Value::Map(items) => {
                out.extend_from_slice(&(items.len() as i32).to_be_bytes());
                for (k, v) in items {
                    encode_element(Some(k), out);
                    encode_element(Some(v), out);
                }
            }
            Value::Tuple(items) => {
                for item in items {
                    encode_element(item.as_ref(), out);
                }
            }
            Value::Udt(fields) => {
                for (_, item) in fields {
                    encode_element(item.as_ref(), out);
                }
            }
        }
    }

    /// The serialized form as a new vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// Writes the value as a CQL literal (see [`format_cql`]).
    pub fn write_cql(&self, out: &mut String) {
        match self {
            Value::Empty => out.push_str("blobAsBlob(0x)"),
            Value::Ascii(s) | Value::Text(s) => write_quoted(s, out),
            Value::Blob(b) => {
                out.push_str("0x");
                write_hex(b, out);
            }
            Value::Boolean(v) => out.push_str(if *v { "true" } else { "false" }),
            Value::Tinyint(v) => {
                let _ = write!(out, "{v}");
            }
            Value::Smallint(v) => {
                let _ = write!(out, "{v}");
            }
            Value::Int(v) => {
                let _ = write!(out, "{v}");
            }
            Value::Bigint(v) | Value::Counter(v) => {
                let _ = write!(out, "{v}");
            }
            Value::Float(v) => write_f32(*v, out),
            Value::Double(v) => write_f64(*v, out),
            Value::Varint(v) => {
                let _ = write!(out, "{v}");
            }
            Value::Decimal { scale, unscaled } => write_decimal(*scale, unscaled, out),
            Value::Timestamp(ms) => {
                if (-62_167_219_200_000..=253_402_300_799_999).contains(ms) {
                    out.push('\'');
                    datetime::write_timestamp(*ms, out);
                    out.push('\'');
                } else {
                    // Outside years 0..=9999 the integer form is the portable literal.
                    let _ = write!(out, "{ms}");
                }
            }
            Value::Date(d) => {
                out.push('\'');
                datetime::write_date(*d, out);
                out.push('\'');
            }
            Value::Time(ns) => {
                out.push('\'');
                datetime::write_time(*ns, out);
                out.push('\'');
            }
            Value::Uuid(u) | Value::Timeuuid(u) => write_uuid(u, out),
            Value::Inet(a) => {
                let _ = write!(out, "'{a}'");
            }
            Value::Duration(d) => datetime::write_duration(*d, out),
            Value::List(items) => write_seq('[', ']', items.iter().map(Some), out),
            Value::Set(items) => write_seq('{', '}', items.iter().map(Some), out),
            Value::Tuple(items) => write_seq('(', ')', items.iter().map(Option::as_ref), out),
            Value::Map(items) => {
                out.push('{');
                for (i, (k, v)) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    k.write_cql(out);
                    out.push_str(": ");
                    v.write_cql(out);
                }
                out.push('}');
            }
            Value::Udt(fields) => {
                out.push('{');
                for (i, (name, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_identifier(name, out);
                    out.push_str(": ");
                    match v {
                        Some(v) => v.write_cql(out),
                        None => out.push_str("null"),
                    }
                }
                out.push('}');
            }
        }
    }
}

impl std::fmt::Display for Value {
    /// The value as a CQL literal (see [`Value::write_cql`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = String::new();
        self.write_cql(&mut s);
        f.write_str(&s)
    }
}

fn write_seq<'v>(
    open: char,
    close: char,
    items: impl Iterator<Item = Option<&'v Value>>,
    out: &mut String,
) {
    out.push(open);
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        match item {
            Some(v) => v.write_cql(out),
            None => out.push_str("null"),
        }
    }
    out.push(close);
}

/// Appends one `[bytes]` element: i32 length then content, or length -1 for null.
pub fn encode_element(v: Option<&Value>, out: &mut Vec<u8>) {
    match v {
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        Some(v) => {
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            v.encode(out);
            let len = (out.len() - at - 4) as i32;
            out[at..at + 4].copy_from_slice(&len.to_be_bytes());
        }
    }
}

/// Appends one `[bytes]` element from already serialized content (None = null).
pub fn write_element(bytes: Option<&[u8]>, out: &mut Vec<u8>) {
    match bytes {
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        Some(b) => {
            out.extend_from_slice(&(b.len() as i32).to_be_bytes());
            out.extend_from_slice(b);
        }
    }
}

/// Splits a serialized list or set into its serialized elements.
pub fn collection_elements(bytes: &[u8]) -> Result<Vec<&[u8]>, ValueError> {
    let mut r = Reader { buf: bytes };
    let n = r.count(4)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(r.element()?);
    }
    no_trailing(&r)?;
    Ok(out)
}

/// One serialized (key, value) pair of a map.
pub type MapEntry<'a> = (&'a [u8], &'a [u8]);

/// Splits a serialized map into its serialized (key, value) pairs.
pub fn map_entries(bytes: &[u8]) -> Result<Vec<MapEntry<'_>>, ValueError> {
    let mut r = Reader { buf: bytes };
    let n = r.count(8)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let k = r.element()?;
        let v = r.element()?;
        out.push((k, v));
    }
    no_trailing(&r)?;
    Ok(out)
}

/// Splits a serialized tuple (or UDT) into its items; missing trailing items are null.
pub fn tuple_items(bytes: &[u8], arity: usize) -> Result<Vec<Option<&[u8]>>, ValueError> {
    let mut r = Reader { buf: bytes };
    let mut out = Vec::with_capacity(arity);
    for _ in 0..arity {
        out.push(if r.is_empty() { None } else { r.bytes()? });
    }
    no_trailing(&r)?;
    Ok(out)
}

/// Serializes a list or set from serialized elements.
pub fn build_collection<'a>(elements: impl ExactSizeIterator<Item = &'a [u8]>, out: &mut Vec<u8>) {
    out.extend_from_slice(&(elements.len() as i32).to_be_bytes());
    for e in elements {
        write_element(Some(e), out);
    }
}

/// Serializes a map from serialized (key, value) pairs.
pub fn build_map<'a>(
    entries: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(&(entries.len() as i32).to_be_bytes());
    for (k, v) in entries {
        write_element(Some(k), out);
        write_element(Some(v), out);
    }
}

#[cfg(test)]
mod tests;
