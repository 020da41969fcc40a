//! Typing literal constants against their receiver: `INSERT ... VALUES (1, 'a')` turns
//! `1` into the 4 bytes of an `int` or the 8 of a `bigint` depending on the column.
//!
//! This runs when a statement is prepared (or an unprepared one is analysed), never per
//! execution of a prepared statement, so errors carry owned, user-readable messages.

use crate::ast::{Literal, Term};
use bytes::Bytes;
use num_bigint::BigInt;
use sluice_types::datetime::{self, Duration};
use sluice_types::value::{compare, encode_duration, write_element};
use sluice_types::{CqlType, NativeType};
use std::fmt;

/// Why a constant cannot be assigned to its receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeError {
    /// A message in Cassandra's words, e.g. `Invalid INTEGER constant (abc) for "k" of type int`.
    pub message: String,
}

impl fmt::Display for TypeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TypeError {}

/// Serializes a constant term for a receiver of type `ty`; `Ok(None)` is NULL.
/// Bind markers and function calls are not constants and are refused.
pub fn literal_to_bytes(ty: &CqlType, term: &Term) -> Result<Option<Bytes>, TypeError> {
    literal_to_bytes_for("value", ty, term)
}

/// As [`literal_to_bytes`], naming the receiver (a column, `[limit]`, ...) in errors.
pub fn literal_to_bytes_for(
    receiver: &str,
    ty: &CqlType,
    term: &Term,
) -> Result<Option<Bytes>, TypeError> {
    let cx = Cx { receiver };
    let mut out = Vec::new();
    if cx.write(ty, term, &mut out)? {
        Ok(Some(Bytes::from(out)))
    } else {
        Ok(None)
    }
}

struct Cx<'r> {
    receiver: &'r str,
}

fn kind_name(l: &Literal) -> &'static str {
    match l {
        Literal::Null => "NULL",
        Literal::Bool(_) => "BOOLEAN",
        Literal::Integer(_) => "INTEGER",
        Literal::Float(_) => "FLOAT",
        Literal::String(_) => "STRING",
        Literal::Blob(_) => "HEX",
        Literal::Uuid(_) => "UUID",
        Literal::Duration(_) => "DURATION",
    }
}

fn literal_text(l: &Literal) -> String {
    match l {
        Literal::Null => "null".into(),
        Literal::Bool(b) => b.to_string(),
        Literal::Integer(s) | Literal::Float(s) | Literal::String(s) | Literal::Duration(s) => {
            s.clone()
        }
        Literal::Blob(b) => {
            let mut s = String::from("0x");
            for byte in b {
                s.push_str(&format!("{byte:02x}"));
            }
            s
        }
        Literal::Uuid(u) => {
            let mut s = String::new();
            sluice_types::value::write_uuid(u, &mut s);
            s
        }
    }
}

/// Parses a CQL float literal's text (`1.5`, `-2e10`, `3.`, `NaN`, `-Infinity`).
fn parse_f64(text: &str) -> Option<f64> {
    match text {
        "NaN" | "-NaN" => return Some(f64::NAN),
        "Infinity" => return Some(f64::INFINITY),
        "-Infinity" => return Some(f64::NEG_INFINITY),
        _ => {}
    }
    let t = text.replace(".e", ".0e").replace(".E", ".0E");
    t.parse::<f64>()
        .ok()
        .filter(|_| text.bytes().any(|b| b.is_ascii_digit()))
}

fn parse_f32(text: &str) -> Option<f32> {
    match text {
        "NaN" | "-NaN" => return Some(f32::NAN),
        "Infinity" => return Some(f32::INFINITY),
        "-Infinity" => return Some(f32::NEG_INFINITY),
        _ => {}
    }
    let t = text.replace(".e", ".0e").replace(".E", ".0E");
    t.parse::<f32>()
        .ok()
        .filter(|_| text.bytes().any(|b| b.is_ascii_digit()))
}

/// Parses a decimal literal into `(scale, unscaled)`: `-12.5e-3` is `(4, -125)`.
fn parse_decimal(text: &str) -> Option<(i32, BigInt)> {
    let (mantissa, exp) = match text.find(['e', 'E']) {
        Some(p) => (&text[..p], text[p + 1..].parse::<i64>().ok()?),
        None => (text, 0),
    };
    let (int_part, frac) = match mantissa.find('.') {
        Some(p) => (&mantissa[..p], &mantissa[p + 1..]),
        None => (mantissa, ""),
    };
    let (neg, int_digits) = match int_part.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, int_part.strip_prefix('+').unwrap_or(int_part)),
    };
    let all = format!("{int_digits}{frac}");
    if all.is_empty() || !all.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut unscaled = BigInt::parse_bytes(all.as_bytes(), 10)?;
    if neg {
        unscaled = -unscaled;
    }
    let scale = i32::try_from(frac.len() as i64 - exp).ok()?;
    Some((scale, unscaled))
}

impl Cx<'_> {
    fn err(&self, msg: String) -> TypeError {
        TypeError { message: msg }
    }

    fn invalid(&self, l: &Literal, ty: &CqlType) -> TypeError {
        self.err(format!(
            "Invalid {} constant ({}) for \"{}\" of type {}",
            kind_name(l),
            literal_text(l),
            self.receiver,
            ty
        ))
    }

    fn unable(&self, l: &Literal, ty: &CqlType) -> TypeError {
        self.err(format!(
            "Unable to make {} from '{}' for \"{}\"",
            ty,
            literal_text(l),
            self.receiver
        ))
    }

    /// Writes the serialized value; returns false for NULL (nothing written).
    fn write(&self, ty: &CqlType, term: &Term, out: &mut Vec<u8>) -> Result<bool, TypeError> {
        let ty = ty.unfrozen();
        match term {
            Term::Literal(Literal::Null) => Ok(false),
            Term::Literal(l) => match ty {
                CqlType::Native(t) => self.native(*t, ty, l, out).map(|()| true),
                _ => Err(self.invalid(l, ty)),
            },
            Term::Bind(_) => Err(self.err(format!(
                "Bind marker for \"{}\" is not a constant",
                self.receiver
            ))),
            Term::Function { name, .. } => Err(self.err(format!(
                "Function {name}() for \"{}\" is not a constant; it is evaluated at execution",
                self.receiver
            ))),
            Term::Reference(_) => Err(self.err(format!(
                "A LET reference for \"{}\" is allowed only inside BEGIN TRANSACTION",
                self.receiver
            ))),
            Term::Cast(hint, inner) => {
                if hint.unfrozen() != ty {
                    return Err(self.err(format!(
                        "Cannot assign value of type {hint} to \"{}\" of type {ty}",
                        self.receiver
                    )));
                }
                self.write(ty, inner, out)
            }
            Term::List(items) => match ty {
                CqlType::List(elem) => {
                    let elems = self.elements(elem, items)?;
                    put_collection(elems.iter().map(Vec::as_slice), out);
                    Ok(true)
                }
                _ => Err(self.not_a(ty, "list")),
            },
            Term::Set(items) => match ty {
                CqlType::Set(elem) => {
                    let mut elems = self.elements(elem, items)?;
                    elems.sort_by(|a, b| compare(elem, a, b));
                    elems.dedup_by(|a, b| compare(elem, a, b).is_eq());
                    put_collection(elems.iter().map(Vec::as_slice), out);
                    Ok(true)
                }
                // `{}` is also the empty map.
                CqlType::Map(_, _) if items.is_empty() => {
                    out.extend_from_slice(&0i32.to_be_bytes());
                    Ok(true)
                }
                _ => Err(self.not_a(ty, "set")),
            },
            Term::Map(entries) => match ty {
                CqlType::Map(kt, vt) => {
                    let mut pairs = Vec::with_capacity(entries.len());
                    for (k, v) in entries {
                        pairs.push((self.element(kt, k)?, self.element(vt, v)?));
                    }
                    // Sort by key; on duplicate keys the last one written wins, as in Cassandra.
                    pairs.reverse();
                    pairs.sort_by(|a, b| compare(kt, &a.0, &b.0));
                    pairs.dedup_by(|a, b| compare(kt, &a.0, &b.0).is_eq());
                    out.extend_from_slice(&(pairs.len() as i32).to_be_bytes());
                    for (k, v) in &pairs {
                        write_element(Some(k), out);
                        write_element(Some(v), out);
                    }
                    Ok(true)
                }
                _ => Err(self.not_a(ty, "map")),
            },
            Term::Tuple(items) => match ty {
                CqlType::Tuple(types) => {
                    if items.len() > types.len() {
                        return Err(self.err(format!(
                            "Invalid tuple literal for \"{}\": too many elements. Type {ty} expects {} but got {}",
                            self.receiver,
                            types.len(),
                            items.len()
                        )));
                    }
                    for (t, item) in types.iter().zip(items) {
                        let mut e = Vec::new();
                        if self.write(t, item, &mut e)? {
                            write_element(Some(&e), out);
                        } else {
                            write_element(None, out);
                        }
                    }
                    Ok(true)
                }
                _ => Err(self.not_a(ty, "tuple")),
            },
        }
    }

    fn not_a(&self, ty: &CqlType, what: &str) -> TypeError {
        self.err(format!(
            "Invalid {what} literal for \"{}\" of type {ty}",
            self.receiver
        ))
    }

    /// One collection element: never null.
    fn element(&self, ty: &CqlType, term: &Term) -> Result<Vec<u8>, TypeError> {
        let mut e = Vec::new();
        if !self.write(ty, term, &mut e)? {
            return Err(self.err(format!(
                "null is not supported inside collections (\"{}\")",
                self.receiver
            )));
        }
        Ok(e)
    }

    fn elements(&self, ty: &CqlType, items: &[Term]) -> Result<Vec<Vec<u8>>, TypeError> {
        items.iter().map(|t| self.element(ty, t)).collect()
    }

    fn native(
        &self,
        t: NativeType,
        ty: &CqlType,
        l: &Literal,
        out: &mut Vec<u8>,
    ) -> Result<(), TypeError> {
        use NativeType as N;
        let bad = || self.invalid(l, ty);
        match (t, l) {
            (N::Text, Literal::String(s)) => out.extend_from_slice(s.as_bytes()),
            (N::Ascii, Literal::String(s)) => {
                if !s.is_ascii() {
                    return Err(self.err(format!(
                        "Invalid ASCII character in string literal for \"{}\"",
                        self.receiver
                    )));
                }
                out.extend_from_slice(s.as_bytes())
            }
            (N::Blob, Literal::Blob(b)) => out.extend_from_slice(b),
            (N::Boolean, Literal::Bool(b)) => out.push(u8::from(*b)),
            (N::Tinyint, Literal::Integer(s)) => {
                let v: i8 = s.parse().map_err(|_| self.unable(l, ty))?;
                out.push(v as u8)
            }
            (N::Smallint, Literal::Integer(s)) => {
                let v: i16 = s.parse().map_err(|_| self.unable(l, ty))?;
                out.extend_from_slice(&v.to_be_bytes())
            }
            (N::Int, Literal::Integer(s)) => {
                let v: i32 = s.parse().map_err(|_| self.unable(l, ty))?;
                out.extend_from_slice(&v.to_be_bytes())
            }
            (N::Bigint | N::Counter | N::Timestamp, Literal::Integer(s)) => {
                let v: i64 = s.parse().map_err(|_| self.unable(l, ty))?;
                out.extend_from_slice(&v.to_be_bytes())
            }
            (N::Varint, Literal::Integer(s)) => {
                let v = BigInt::parse_bytes(s.as_bytes(), 10).ok_or_else(|| self.unable(l, ty))?;
                out.extend_from_slice(&v.to_signed_bytes_be())
            }
            (N::Decimal, Literal::Integer(s) | Literal::Float(s)) => {
                let (scale, unscaled) = parse_decimal(s).ok_or_else(|| self.unable(l, ty))?;
                out.extend_from_slice(&scale.to_be_bytes());
                out.extend_from_slice(&unscaled.to_signed_bytes_be());
            }
            (N::Double, Literal::Integer(s) | Literal::Float(s)) => {
                let v = parse_f64(s).ok_or_else(|| self.unable(l, ty))?;
                out.extend_from_slice(&v.to_be_bytes())
            }
            (N::Float, Literal::Integer(s) | Literal::Float(s)) => {
                let v = parse_f32(s).ok_or_else(|| self.unable(l, ty))?;
                out.extend_from_slice(&v.to_be_bytes())
            }
            (N::Timestamp, Literal::String(s)) => {
                let ms = datetime::parse_timestamp(s).ok_or_else(|| {
                    self.err(format!(
                        "Unable to parse a date/time from '{s}' for \"{}\"",
                        self.receiver
                    ))
                })?;
                out.extend_from_slice(&ms.to_be_bytes())
            }
            (N::Date, Literal::String(s)) => {
                let d = datetime::parse_date(s).ok_or_else(|| {
                    self.err(format!(
                        "Unable to coerce '{s}' to a formatted date (yyyy-mm-dd) for \"{}\"",
                        self.receiver
                    ))
                })?;
                out.extend_from_slice(&d.to_be_bytes())
            }
            (N::Date, Literal::Integer(s)) => {
                let d: u32 = s.parse().map_err(|_| self.unable(l, ty))?;
                out.extend_from_slice(&d.to_be_bytes())
            }
            (N::Time, Literal::String(s)) => {
                let n = datetime::parse_time(s).ok_or_else(|| {
                    self.err(format!(
                        "Unable to coerce '{s}' to a formatted time (HH:MM:SS[.fffffffff]) for \"{}\"",
                        self.receiver
                    ))
                })?;
                out.extend_from_slice(&n.to_be_bytes())
            }
            (N::Time, Literal::Integer(s)) => {
                let n: i64 = s.parse().map_err(|_| self.unable(l, ty))?;
                if !(0..datetime::NANOS_PER_DAY).contains(&n) {
                    return Err(self.unable(l, ty));
                }
                out.extend_from_slice(&n.to_be_bytes())
            }
            (N::Uuid, Literal::Uuid(u)) => out.extend_from_slice(u),
            (N::Timeuuid, Literal::Uuid(u)) => {
                if u[6] >> 4 != 1 {
                    return Err(self.err(format!(
                        "Unsupported UUID for \"{}\": timeuuid requires a version 1 UUID",
                        self.receiver
                    )));
                }
                out.extend_from_slice(u)
            }
            (N::Inet, Literal::String(s)) => {
                let addr: std::net::IpAddr = s.parse().map_err(|_| {
                    self.err(format!(
                        "Unable to make inet address from '{s}' for \"{}\"",
                        self.receiver
                    ))
                })?;
                match addr {
                    std::net::IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
                    std::net::IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
                }
            }
            (N::Duration, Literal::Duration(s)) => {
                let d: Duration = datetime::parse_duration(s).ok_or_else(|| {
                    self.err(format!("Invalid duration '{s}' for \"{}\"", self.receiver))
                })?;
                encode_duration(d, out)
            }
            _ => return Err(bad()),
        }
        Ok(())
    }
}

fn put_collection<'a>(elems: impl ExactSizeIterator<Item = &'a [u8]>, out: &mut Vec<u8>) {
    sluice_types::value::build_collection(elems, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ast::BindMarker;
    use proptest::prelude::*;
    use sluice_types::value::{format_cql, Value};
    use sluice_types::CqlType as T;

    fn n(t: NativeType) -> CqlType {
        T::Native(t)
    }

    fn int(s: &str) -> Term {
        Term::Literal(Literal::Integer(s.into()))
    }

    fn float(s: &str) -> Term {
        Term::Literal(Literal::Float(s.into()))
    }

    fn string(s: &str) -> Term {
        Term::Literal(Literal::String(s.into()))
    }

    fn ok(ty: &CqlType, term: &Term) -> Vec<u8> {
        literal_to_bytes(ty, term)
            .unwrap_or_else(|e| panic!("{ty}: {e}"))
            .expect("not null")
            .to_vec()
    }

    fn err(ty: &CqlType, term: &Term) -> String {
        literal_to_bytes_for("k", ty, term).unwrap_err().message
    }

    fn shown(ty: &CqlType, term: &Term) -> String {
        let mut s = String::new();
        format_cql(ty, &ok(ty, term), &mut s);
        s
    }

    #[test]
    fn integers_with_range_checks() {
        use NativeType::*;
        assert_eq!(ok(&n(Int), &int("-7")), (-7i32).to_be_bytes());
        assert_eq!(ok(&n(Tinyint), &int("-128")), vec![0x80]);
        assert!(err(&n(Tinyint), &int("128")).contains("Unable to make tinyint from '128'"));
        assert_eq!(ok(&n(Smallint), &int("32767")), 32767i16.to_be_bytes());
        assert!(literal_to_bytes(&n(Smallint), &int("32768")).is_err());
        assert!(literal_to_bytes(&n(Int), &int("2147483648")).is_err());
        assert_eq!(
            ok(&n(Bigint), &int("-9223372036854775808")),
            i64::MIN.to_be_bytes()
        );
        assert_eq!(ok(&n(Counter), &int("5")), 5i64.to_be_bytes());
        assert_eq!(
            ok(&n(Varint), &int("-123456789012345678901234567890")),
            "-123456789012345678901234567890"
                .parse::<BigInt>()
                .unwrap()
                .to_signed_bytes_be()
        );
        assert_eq!(
            err(&n(Int), &string("abc")),
            "Invalid STRING constant (abc) for \"k\" of type int"
        );
        assert_eq!(
            err(&n(Int), &float("1.5")),
            "Invalid FLOAT constant (1.5) for \"k\" of type int"
        );
    }

    #[test]
    fn floats_and_decimals() {
        use NativeType::*;
        assert_eq!(ok(&n(Double), &float("1.5")), 1.5f64.to_be_bytes());
        assert_eq!(ok(&n(Double), &int("3")), 3f64.to_be_bytes());
        assert_eq!(ok(&n(Double), &float("-2e10")), (-2e10f64).to_be_bytes());
        assert_eq!(ok(&n(Double), &float("1.e2")), 100f64.to_be_bytes());
        assert!(f64::from_be_bytes(ok(&n(Double), &float("NaN")).try_into().unwrap()).is_nan());
        assert_eq!(
            ok(&n(Double), &float("-Infinity")),
            f64::NEG_INFINITY.to_be_bytes()
        );
        assert_eq!(ok(&n(Float), &float("0.1")), 0.1f32.to_be_bytes());
        assert_eq!(shown(&n(Decimal), &float("-12.5e-3")), "-0.0125");
        assert_eq!(shown(&n(Decimal), &int("42")), "42");
        assert_eq!(shown(&n(Decimal), &float("1.50")), "1.50");
        assert_eq!(shown(&n(Decimal), &float("15e2")), "15E2");
        assert!(literal_to_bytes(&n(Decimal), &float("NaN")).is_err());
    }

    #[test]
    fn text_blob_bool_uuid_inet() {
        use NativeType::*;
        assert_eq!(ok(&n(Text), &string("żółw")), "żółw".as_bytes());
        assert_eq!(ok(&n(Ascii), &string("abc")), b"abc");
        assert!(err(&n(Ascii), &string("é")).contains("ASCII"));
        assert_eq!(
            ok(&n(Blob), &Term::Literal(Literal::Blob(vec![1, 2]))),
            vec![1, 2]
        );
        assert!(literal_to_bytes(&n(Blob), &string("0102")).is_err());
        assert_eq!(
            ok(&n(Boolean), &Term::Literal(Literal::Bool(true))),
            vec![1]
        );
        let mut v1 = [0u8; 16];
        v1[6] = 0x11;
        let mut v4 = [0u8; 16];
        v4[6] = 0x41;
        assert_eq!(ok(&n(Uuid), &Term::Literal(Literal::Uuid(v4))), v4);
        assert_eq!(ok(&n(Timeuuid), &Term::Literal(Literal::Uuid(v1))), v1);
        assert!(err(&n(Timeuuid), &Term::Literal(Literal::Uuid(v4))).contains("version 1"));
        assert!(
            literal_to_bytes(&n(Uuid), &string("00000000-0000-0000-0000-000000000000")).is_err()
        );
        assert_eq!(ok(&n(Inet), &string("1.2.3.4")), vec![1, 2, 3, 4]);
        assert_eq!(ok(&n(Inet), &string("::1")).len(), 16);
        assert!(err(&n(Inet), &string("1.2.3")).contains("inet"));
    }

    #[test]
    fn dates_times_durations() {
        use NativeType::*;
        assert_eq!(
            ok(&n(Timestamp), &string("2024-01-02 03:04:05+0000")),
            1_704_164_645_000i64.to_be_bytes()
        );
        assert_eq!(
            ok(&n(Timestamp), &string("2024-01-02T03:04:05.123Z")),
            1_704_164_645_123i64.to_be_bytes()
        );
        assert_eq!(
            ok(&n(Timestamp), &string("2024-01-02")),
            1_704_153_600_000i64.to_be_bytes()
        );
        assert_eq!(ok(&n(Timestamp), &int("1000")), 1000i64.to_be_bytes());
        assert!(err(&n(Timestamp), &string("yesterday")).contains("date/time"));
        assert_eq!(shown(&n(Date), &string("2024-02-29")), "'2024-02-29'");
        assert_eq!(ok(&n(Date), &int("2147483648")), (1u32 << 31).to_be_bytes());
        assert!(literal_to_bytes(&n(Date), &string("2024-02-30")).is_err());
        assert_eq!(
            ok(&n(Time), &string("01:02:03.5")),
            3_723_500_000_000i64.to_be_bytes()
        );
        assert_eq!(ok(&n(Time), &int("5")), 5i64.to_be_bytes());
        assert!(literal_to_bytes(&n(Time), &int("-1")).is_err());
        let dur = |s: &str| Term::Literal(Literal::Duration(s.into()));
        assert_eq!(shown(&n(Duration), &dur("1h30m")), "1h30m");
        assert_eq!(shown(&n(Duration), &dur("P1DT2H")), "1d2h");
        assert!(literal_to_bytes(&n(Duration), &int("5")).is_err());
    }

    #[test]
    fn collections_are_typed_sorted_and_deduplicated() {
        use NativeType::*;
        let set_int = T::Set(Box::new(n(Int)));
        let lit = Term::Set(vec![int("3"), int("-1"), int("3"), int("2")]);
        assert_eq!(shown(&set_int, &lit), "{-1, 2, 3}");
        let list_text = T::List(Box::new(n(Text)));
        assert_eq!(
            shown(
                &list_text,
                &Term::List(vec![string("b"), string("a"), string("b")])
            ),
            "['b', 'a', 'b']"
        );
        let m = T::Map(Box::new(n(Text)), Box::new(n(Int)));
        let lit = Term::Map(vec![
            (string("b"), int("1")),
            (string("a"), int("2")),
            (string("b"), int("3")),
        ]);
        assert_eq!(shown(&m, &lit), "{'a': 2, 'b': 3}");
        assert_eq!(shown(&m, &Term::Set(vec![])), "{}");
        let frozen = T::Frozen(Box::new(T::List(Box::new(T::Frozen(Box::new(T::Set(
            Box::new(n(Bigint)),
        )))))));
        let lit = Term::List(vec![Term::Set(vec![int("2"), int("1")])]);
        assert_eq!(shown(&frozen, &lit), "[{1, 2}]");
        assert!(err(&set_int, &Term::List(vec![])).contains("Invalid list literal"));
        assert!(err(&set_int, &Term::Set(vec![Term::Literal(Literal::Null)])).contains("null"));
        assert!(literal_to_bytes(&set_int, &Term::Set(vec![string("x")])).is_err());
        // The stored bytes decode as the collection.
        let bytes = ok(&m, &Term::Map(vec![(string("k"), int("7"))]));
        assert_eq!(
            Value::decode(&m, &bytes).unwrap(),
            Value::Map(vec![(Value::Text("k".into()), Value::Int(7))])
        );
    }

    #[test]
    fn tuples_nulls_casts_and_non_constants() {
        use NativeType::*;
        let tup = T::Tuple(vec![n(Int), n(Text), n(Boolean)]);
        assert_eq!(
            shown(
                &tup,
                &Term::Tuple(vec![int("1"), Term::Literal(Literal::Null)])
            ),
            "(1, null, null)"
        );
        assert!(err(&tup, &Term::Tuple(vec![int("1"); 4])).contains("too many elements"));
        assert_eq!(
            literal_to_bytes(&n(Int), &Term::Literal(Literal::Null)),
            Ok(None)
        );
        assert_eq!(
            ok(&n(Bigint), &Term::Cast(n(Bigint), Box::new(int("5")))),
            5i64.to_be_bytes()
        );
        assert!(err(&n(Bigint), &Term::Cast(n(Int), Box::new(int("5")))).contains("Cannot assign"));
        let bind = Term::Bind(BindMarker {
            index: 0,
            name: None,
        });
        assert!(err(&n(Int), &bind).contains("not a constant"));
        let f = Term::Function {
            name: "now".into(),
            args: vec![],
        };
        assert!(err(&n(Timeuuid), &f).contains("now()"));
    }

    /// Strategy for a type and a (canonical) value of it: sets sorted and deduplicated,
    /// map keys likewise, floats without NaN payloads, no empty values.
    fn arb_typed_value() -> impl Strategy<Value = (CqlType, Value)> {
        use sluice_types::datetime::Duration as D;
        use NativeType::*;
        let leaf = prop_oneof![
            any::<i32>().prop_map(|v| (n(Int), Value::Int(v))),
            any::<i64>().prop_map(|v| (n(Bigint), Value::Bigint(v))),
            any::<i8>().prop_map(|v| (n(Tinyint), Value::Tinyint(v))),
            any::<i16>().prop_map(|v| (n(Smallint), Value::Smallint(v))),
            any::<bool>().prop_map(|v| (n(Boolean), Value::Boolean(v))),
            "\\PC{0,12}".prop_map(|v| (n(Text), Value::Text(v))),
            "[ -~]{0,12}".prop_map(|v| (n(Ascii), Value::Ascii(v))),
            proptest::collection::vec(any::<u8>(), 0..8).prop_map(|v| (n(Blob), Value::Blob(v))),
            prop_oneof![
                (-1e300f64..1e300).boxed(),
                Just(f64::INFINITY).boxed(),
                Just(f64::NEG_INFINITY).boxed(),
                Just(f64::NAN).boxed(),
                Just(-0.0f64).boxed()
            ]
            .prop_map(|v| (n(Double), Value::Double(v))),
            (-1e30f32..1e30).prop_map(|v| (n(Float), Value::Float(v))),
            any::<i128>().prop_map(|v| (n(Varint), Value::Varint(BigInt::from(v)))),
            (any::<i64>(), -30i32..30).prop_map(|(u, s)| (
                n(Decimal),
                Value::Decimal {
                    scale: s,
                    unscaled: BigInt::from(u)
                }
            )),
            any::<i64>().prop_map(|v| (n(Timestamp), Value::Timestamp(v))),
            any::<u32>().prop_map(|v| (n(Date), Value::Date(v))),
            (0..datetime::NANOS_PER_DAY).prop_map(|v| (n(Time), Value::Time(v))),
            any::<[u8; 16]>().prop_map(|v| (n(Uuid), Value::Uuid(v))),
            any::<[u8; 16]>().prop_map(|mut v| {
                v[6] = (v[6] & 0x0f) | 0x10;
                (n(Timeuuid), Value::Timeuuid(v))
            }),
            any::<[u8; 4]>().prop_map(|v| (n(Inet), Value::Inet(std::net::IpAddr::from(v)))),
            any::<[u8; 16]>().prop_map(|v| (n(Inet), Value::Inet(std::net::IpAddr::from(v)))),
            (0i32..i32::MAX, 0i32..1000, 0i64..i64::MAX, any::<bool>()).prop_map(
                |(m, d, ns, neg)| {
                    let s = if neg { -1 } else { 1 };
                    (
                        n(Duration),
                        Value::Duration(D {
                            months: m * s,
                            days: d * s,
                            nanos: ns * i64::from(s),
                        }),
                    )
                }
            ),
        ];
        leaf.prop_recursive(2, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(|items| {
                    // A list of the first item's type (or int when empty).
                    let ty = items.first().map_or(n(NativeType::Int), |(t, _)| t.clone());
                    let vals = items
                        .into_iter()
                        .filter(|(t, _)| *t == ty)
                        .map(|(_, v)| v)
                        .collect();
                    (T::List(Box::new(ty)), Value::List(vals))
                }),
                proptest::collection::btree_set(any::<i32>(), 0..5).prop_map(|s| {
                    (
                        T::Set(Box::new(n(NativeType::Int))),
                        Value::Set(s.into_iter().map(Value::Int).collect()),
                    )
                }),
                (proptest::collection::btree_map("\\PC{0,5}", inner.clone(), 0..4)).prop_map(|m| {
                    let vt = m
                        .values()
                        .next()
                        .map_or(n(NativeType::Int), |(t, _)| t.clone());
                    let entries = m
                        .into_iter()
                        .filter(|(_, (t, _))| *t == vt)
                        .map(|(k, (_, v))| (Value::Text(k), v))
                        .collect();
                    (
                        T::Map(Box::new(n(NativeType::Text)), Box::new(vt)),
                        Value::Map(entries),
                    )
                }),
                proptest::collection::vec(proptest::option::of(inner), 1..4).prop_map(|items| {
                    let types = items
                        .iter()
                        .map(|i| i.as_ref().map_or(n(NativeType::Int), |(t, _)| t.clone()))
                        .collect();
                    let vals = items.into_iter().map(|i| i.map(|(_, v)| v)).collect();
                    (T::Tuple(types), Value::Tuple(vals))
                }),
            ]
        })
    }

    proptest! {
        /// format_cql output, parsed by the parser and typed back, gives the same bytes:
        /// DESCRIBE output and literals agree.
        #[test]
        fn formatted_values_parse_back_to_the_same_bytes((ty, value) in arb_typed_value()) {
            let bytes = value.to_bytes();
            prop_assert!(sluice_types::value::validate(&ty, &bytes).is_ok());
            let mut lit = String::new();
            format_cql(&ty, &bytes, &mut lit);
            let text = format!("INSERT INTO t (c) VALUES ({lit})");
            let parsed = crate::parse(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
            let crate::ast::Statement::Insert(ins) = parsed.statement else { panic!() };
            let back = literal_to_bytes(&ty, &ins.values[0])
                .map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?
                .expect("not null");
            prop_assert_eq!(back.to_vec(), bytes, "{}", text);
        }
    }

    #[test]
    fn parsed_literals_round_trip_through_the_parser() {
        // End to end: parse an INSERT, type its literals, format them back.
        let p =
            crate::parse("INSERT INTO t (a, b, c, d) VALUES (-5, 'it''s', {'x': [1, 2]}, 0xcafe)")
                .unwrap();
        let crate::ast::Statement::Insert(ins) = p.statement else {
            panic!("not an insert")
        };
        let types = [
            n(NativeType::Int),
            n(NativeType::Text),
            T::Map(
                Box::new(n(NativeType::Text)),
                Box::new(T::List(Box::new(n(NativeType::Int)))),
            ),
            n(NativeType::Blob),
        ];
        let shown: Vec<String> = types
            .iter()
            .zip(&ins.values)
            .map(|(t, v)| shown(t, v))
            .collect();
        assert_eq!(shown, vec!["-5", "'it''s'", "{'x': [1, 2]}", "0xcafe"]);
    }
}
