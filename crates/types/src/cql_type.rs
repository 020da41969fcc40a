//! The CQL type system: what a column, a bind marker or a result column holds.

use std::fmt;

/// A scalar CQL type, with the native-protocol option id it is sent as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NativeType {
    /// `ascii`: 7-bit text.
    Ascii,
    /// `bigint`: 64-bit signed integer.
    Bigint,
    /// `blob`: arbitrary bytes.
    Blob,
    /// `boolean`.
    Boolean,
    /// `counter`: 64-bit distributed counter.
    Counter,
    /// `decimal`: arbitrary-precision decimal (scale + varint).
    Decimal,
    /// `double`: IEEE 754 binary64.
    Double,
    /// `float`: IEEE 754 binary32.
    Float,
    /// `int`: 32-bit signed integer.
    Int,
    /// `timestamp`: milliseconds since the Unix epoch.
    Timestamp,
    /// `uuid`: any UUID.
    Uuid,
    /// `text` / `varchar`: UTF-8 text.
    Text,
    /// `varint`: arbitrary-precision integer.
    Varint,
    /// `timeuuid`: a version-1 UUID.
    Timeuuid,
    /// `inet`: an IPv4 or IPv6 address.
    Inet,
    /// `date`: days since the epoch, offset by 2^31.
    Date,
    /// `time`: nanoseconds since midnight.
    Time,
    /// `smallint`: 16-bit signed integer.
    Smallint,
    /// `tinyint`: 8-bit signed integer.
    Tinyint,
    /// `duration`: months, days, nanoseconds.
    Duration,
}

impl NativeType {
    /// Every native type, for exhaustive tests.
    pub const ALL: [NativeType; 20] = [
        NativeType::Ascii,
        NativeType::Bigint,
        NativeType::Blob,
        NativeType::Boolean,
        NativeType::Counter,
        NativeType::Decimal,
        NativeType::Double,
        NativeType::Float,
        NativeType::Int,
        NativeType::Timestamp,
        NativeType::Uuid,
        NativeType::Text,
        NativeType::Varint,
        NativeType::Timeuuid,
        NativeType::Inet,
        NativeType::Date,
        NativeType::Time,
        NativeType::Smallint,
        NativeType::Tinyint,
        NativeType::Duration,
    ];

    /// The CQL name, as written in `system_schema.columns.type` and DESCRIBE.
    pub const fn cql_name(self) -> &'static str {
        match self {
            NativeType::Ascii => "ascii",
            NativeType::Bigint => "bigint",
            NativeType::Blob => "blob",
            NativeType::Boolean => "boolean",
            NativeType::Counter => "counter",
            NativeType::Decimal => "decimal",
            NativeType::Double => "double",
            NativeType::Float => "float",
            NativeType::Int => "int",
            NativeType::Timestamp => "timestamp",
            NativeType::Uuid => "uuid",
            NativeType::Text => "text",
            NativeType::Varint => "varint",
            NativeType::Timeuuid => "timeuuid",
            NativeType::Inet => "inet",
            NativeType::Date => "date",
            NativeType::Time => "time",
            NativeType::Smallint => "smallint",
            NativeType::Tinyint => "tinyint",
            NativeType::Duration => "duration",
        }
    }

    /// The `[option]` id of the native protocol (v4 §6).
    pub const fn option_id(self) -> u16 {
        match self {
            NativeType::Ascii => 0x0001,
            NativeType::Bigint => 0x0002,
            NativeType::Blob => 0x0003,
            NativeType::Boolean => 0x0004,
            NativeType::Counter => 0x0005,
            NativeType::Decimal => 0x0006,
            NativeType::Double => 0x0007,
            NativeType::Float => 0x0008,
            NativeType::Int => 0x0009,
            NativeType::Timestamp => 0x000B,
            NativeType::Uuid => 0x000C,
            NativeType::Text => 0x000D,
            NativeType::Varint => 0x000E,
            NativeType::Timeuuid => 0x000F,
            NativeType::Inet => 0x0010,
            NativeType::Date => 0x0011,
            NativeType::Time => 0x0012,
            NativeType::Smallint => 0x0013,
            NativeType::Tinyint => 0x0014,
            NativeType::Duration => 0x0015,
        }
    }

    /// The native type with this `[option]` id, if any (`0x000D` also covers varchar).
    pub const fn from_option_id(id: u16) -> Option<NativeType> {
        Some(match id {
            0x0001 => NativeType::Ascii,
            0x0002 => NativeType::Bigint,
            0x0003 => NativeType::Blob,
            0x0004 => NativeType::Boolean,
            0x0005 => NativeType::Counter,
            0x0006 => NativeType::Decimal,
            0x0007 => NativeType::Double,
            0x0008 => NativeType::Float,
            0x0009 => NativeType::Int,
            0x000B => NativeType::Timestamp,
            0x000C => NativeType::Uuid,
            0x000D => NativeType::Text,
            0x000E => NativeType::Varint,
            0x000F => NativeType::Timeuuid,
            0x0010 => NativeType::Inet,
            0x0011 => NativeType::Date,
            0x0012 => NativeType::Time,
            0x0013 => NativeType::Smallint,
            0x0014 => NativeType::Tinyint,
            0x0015 => NativeType::Duration,
            _ => return None,
        })
    }

    /// The native type a CQL type name denotes (case-insensitive; `varchar` is `text`).
    pub fn from_name(name: &str) -> Option<NativeType> {
        let lower = name.to_ascii_lowercase();
        if lower == "varchar" {
            return Some(NativeType::Text);
        }
        NativeType::ALL.into_iter().find(|t| t.cql_name() == lower)
    }

    /// The fixed serialized width in bytes, or `None` for variable-width types.
    pub const fn fixed_width(self) -> Option<usize> {
        match self {
            NativeType::Bigint
            | NativeType::Counter
            | NativeType::Double
            | NativeType::Timestamp
            | NativeType::Time => Some(8),
            NativeType::Int | NativeType::Float | NativeType::Date => Some(4),
            NativeType::Smallint => Some(2),
            NativeType::Tinyint | NativeType::Boolean => Some(1),
            NativeType::Uuid | NativeType::Timeuuid => Some(16),
            _ => None,
        }
    }
}

/// Any CQL type: native, collection, tuple or user-defined.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CqlType {
    /// A scalar type.
    Native(NativeType),
    /// `list<T>`.
    List(Box<CqlType>),
    /// `set<T>`.
    Set(Box<CqlType>),
    /// `map<K, V>`.
    Map(Box<CqlType>, Box<CqlType>),
    /// `tuple<T1, T2, ...>` (always frozen).
    Tuple(Vec<CqlType>),
    /// `frozen<T>`: a collection or UDT stored and compared as one value.
    Frozen(Box<CqlType>),
    /// A user-defined type: keyspace, name, fields.
    Udt {
        /// Keyspace the type belongs to.
        keyspace: String,
        /// Type name.
        name: String,
        /// Field names and types, in declaration order.
        fields: Vec<(String, CqlType)>,
    },
}

impl CqlType {
    /// Shorthand for a native type.
    pub const fn native(t: NativeType) -> CqlType {
        CqlType::Native(t)
    }

    /// The type with any `frozen<>` wrapper removed.
    pub fn unfrozen(&self) -> &CqlType {
        match self {
            CqlType::Frozen(inner) => inner.unfrozen(),
            other => other,
        }
    }

    /// True for `frozen<...>`, tuples and native types: the value is one cell.
    pub fn is_frozen_or_native(&self) -> bool {
        matches!(
            self,
            CqlType::Native(_) | CqlType::Frozen(_) | CqlType::Tuple(_)
        )
    }

    /// True for a non-frozen list, set or map (stored one cell per element).
    pub fn is_multi_cell_collection(&self) -> bool {
        matches!(
            self,
            CqlType::List(_) | CqlType::Set(_) | CqlType::Map(_, _)
        )
    }

    /// True for `counter`.
    pub fn is_counter(&self) -> bool {
        matches!(self, CqlType::Native(NativeType::Counter))
    }

    /// Parses a type as written in CQL or `system_schema` (`frozen<map<text, int>>`).
    /// User-defined types are not resolved here; a bare unknown name is an error.
    pub fn parse(text: &str) -> Result<CqlType, TypeParseError> {
        let mut parser = TypeTextParser { text, pos: 0 };
        let ty = parser.parse_type()?;
        parser.skip_ws();
        if parser.pos != text.len() {
            return Err(TypeParseError("trailing characters after type"));
        }
        Ok(ty)
    }
}

/// Why a type string did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeParseError(pub &'static str);

impl fmt::Display for TypeParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for TypeParseError {}

struct TypeTextParser<'a> {
    text: &'a str,
    pos: usize,
}

impl TypeTextParser<'_> {
    fn skip_ws(&mut self) {
        while self.text[self.pos..].starts_with(|c: char| c.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn ident(&mut self) -> Result<&str, TypeParseError> {
        self.skip_ws();
        let rest = &self.text[self.pos..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if len == 0 {
            return Err(TypeParseError("expected a type name"));
        }
        self.pos += len;
        Ok(&rest[..len])
    }

    fn expect(&mut self, c: char) -> Result<(), TypeParseError> {
        self.skip_ws();
        if self.text[self.pos..].starts_with(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(match c {
                '<' => TypeParseError("expected '<'"),
                '>' => TypeParseError("expected '>'"),
                _ => TypeParseError("expected ','"),
            })
        }
    }

    fn peek_is(&mut self, c: char) -> bool {
        self.skip_ws();
        self.text[self.pos..].starts_with(c)
    }

    fn parse_type(&mut self) -> Result<CqlType, TypeParseError> {
        let name = self.ident()?.to_ascii_lowercase();
        match name.as_str() {
            "list" | "set" | "frozen" => {
                self.expect('<')?;
                let inner = Box::new(self.parse_type()?);
                self.expect('>')?;
                Ok(match name.as_str() {
                    "list" => CqlType::List(inner),
                    "set" => CqlType::Set(inner),
                    _ => CqlType::Frozen(inner),
                })
            }
            "map" => {
                self.expect('<')?;
                let k = self.parse_type()?;
                self.expect(',')?;
                let v = self.parse_type()?;
                self.expect('>')?;
                Ok(CqlType::Map(Box::new(k), Box::new(v)))
            }
            "tuple" => {
                self.expect('<')?;
                let mut items = vec![self.parse_type()?];
                while !self.peek_is('>') {
                    self.expect(',')?;
                    items.push(self.parse_type()?);
                }
                self.expect('>')?;
                Ok(CqlType::Tuple(items))
            }
            other => NativeType::from_name(other)
                .map(CqlType::Native)
                .ok_or(TypeParseError("unknown type name")),
        }
    }
}

impl fmt::Display for CqlType {
    /// Formats as CQL: `frozen<map<text, int>>`, as Cassandra writes it in `system_schema`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CqlType::Native(t) => f.write_str(t.cql_name()),
            CqlType::List(t) => write!(f, "list<{t}>"),
            CqlType::Set(t) => write!(f, "set<{t}>"),
            CqlType::Map(k, v) => write!(f, "map<{k}, {v}>"),
            CqlType::Frozen(t) => write!(f, "frozen<{t}>"),
            CqlType::Tuple(items) => {
                f.write_str("tuple<")?;
                for (i, t) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{t}")?;
                }
                f.write_str(">")
            }
            CqlType::Udt { name, .. } => f.write_str(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_nested_types() {
        for text in [
            "int",
            "frozen<map<text, int>>",
            "list<frozen<set<uuid>>>",
            "tuple<int, text, blob>",
            "map<text, frozen<list<bigint>>>",
        ] {
            let ty = CqlType::parse(text).unwrap();
            assert_eq!(ty.to_string(), text);
        }
        assert_eq!(
            CqlType::parse("VARCHAR").unwrap(),
            CqlType::Native(NativeType::Text)
        );
    }

    #[test]
    fn rejects_malformed_types() {
        assert!(CqlType::parse("map<text>").is_err());
        assert!(CqlType::parse("lst<int>").is_err());
        assert!(CqlType::parse("list<int").is_err());
        assert!(CqlType::parse("int int").is_err());
    }

    #[test]
    fn option_ids_round_trip() {
        for t in NativeType::ALL {
            assert_eq!(NativeType::from_option_id(t.option_id()), Some(t));
            assert_eq!(NativeType::from_name(t.cql_name()), Some(t));
        }
    }
}
