//! `SELECT JSON`: rows rendered as JSON objects, in Cassandra's representation of each type.

use sluice_types::datetime;
use sluice_types::value::{write_identifier, write_uuid};
use sluice_types::{CqlType, Value};
use std::fmt::Write;

/// Appends `s` as a JSON string.
fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Appends a decoded value as JSON.
pub(crate) fn write_json(v: &Value, out: &mut String) {
    let mut tmp = String::new();
    match v {
        Value::Empty => out.push_str("null"),
        Value::Ascii(s) | Value::Text(s) => json_string(s, out),
        Value::Boolean(_)
        | Value::Tinyint(_)
        | Value::Smallint(_)
        | Value::Int(_)
        | Value::Bigint(_)
        | Value::Counter(_)
        | Value::Varint(_)
        | Value::Decimal { .. } => v.write_cql(out),
        Value::Float(f) if f.is_finite() => v.write_cql(out),
        Value::Double(f) if f.is_finite() => v.write_cql(out),
        Value::Float(_) | Value::Double(_) | Value::Blob(_) => {
            v.write_cql(&mut tmp);
            json_string(&tmp, out);
        }
        Value::Timestamp(ms) => {
            datetime::write_timestamp(*ms, &mut tmp);
            json_string(&tmp, out);
        }
        Value::Date(d) => {
            datetime::write_date(*d, &mut tmp);
            json_string(&tmp, out);
        }
        Value::Time(ns) => {
            datetime::write_time(*ns, &mut tmp);
            json_string(&tmp, out);
        }
        Value::Duration(d) => {
            datetime::write_duration(*d, &mut tmp);
            json_string(&tmp, out);
        }
        Value::Uuid(u) | Value::Timeuuid(u) => {
            write_uuid(u, &mut tmp);
            json_string(&tmp, out);
        }
        Value::Inet(a) => json_string(&a.to_string(), out),
        Value::List(items) | Value::Set(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json(item, out);
            }
            out.push(']');
        }
        Value::Tuple(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                match item {
                    Some(v) => write_json(v, out),
                    None => out.push_str("null"),
                }
            }
            out.push(']');
        }
        Value::Map(pairs) => {
            out.push('{');
            for (i, (k, val)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                // JSON keys are strings: non-text keys are their JSON text, quoted.
                match k {
                    Value::Text(s) | Value::Ascii(s) => json_string(s, out),
                    other => {
                        let mut key = String::new();
                        write_json(other, &mut key);
                        json_string(key.trim_matches('"'), out);
                    }
                }
                out.push_str(": ");
                write_json(val, out);
            }
            out.push('}');
        }
        Value::Udt(fields) => {
            out.push('{');
            for (i, (name, val)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                json_string(name, out);
                out.push_str(": ");
                match val {
                    Some(v) => write_json(v, out),
                    None => out.push_str("null"),
                }
            }
            out.push('}');
        }
    }
}

/// Renders one result row as a JSON object keyed by column name (quoted names keep
/// their quotes, as Cassandra does).
pub(crate) fn row_json(columns: &[(String, CqlType)], cells: &[Option<bytes::Bytes>]) -> String {
    let mut out = String::from("{");
    for (i, ((name, ty), cell)) in columns.iter().zip(cells).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let mut key = String::new();
        write_identifier(name, &mut key);
        json_string(&key, &mut out);
        out.push_str(": ");
        match cell.as_ref().map(|b| Value::decode(ty, b)) {
            Some(Ok(v)) => write_json(&v, &mut out),
            _ => out.push_str("null"),
        }
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use sluice_types::NativeType;

    #[test]
    fn renders_types_as_cassandra_json() {
        let cols = vec![
            ("k".to_string(), CqlType::native(NativeType::Int)),
            ("Name".to_string(), CqlType::native(NativeType::Text)),
            ("b".to_string(), CqlType::native(NativeType::Blob)),
            (
                "m".to_string(),
                CqlType::Map(
                    Box::new(CqlType::native(NativeType::Int)),
                    Box::new(CqlType::native(NativeType::Boolean)),
                ),
            ),
            ("n".to_string(), CqlType::native(NativeType::Text)),
        ];
        let map = crate::codec::map([(&1i32.to_be_bytes()[..], &[1u8][..])]);
        let cells = vec![
            Some(Bytes::copy_from_slice(&7i32.to_be_bytes())),
            Some(Bytes::from_static(b"a\"b")),
            Some(Bytes::from_static(&[0xca, 0xfe])),
            Some(map),
            None,
        ];
        assert_eq!(
            row_json(&cols, &cells),
            r#"{"k": 7, "\"Name\"": "a\"b", "b": "0xcafe", "m": {"1": true}, "n": null}"#
        );
    }
}
