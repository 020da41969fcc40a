//! Decoded requests and the response values the server encodes.
//!
//! Requests borrow from the frame body through `Bytes` slices (reference-counted, no copy),
//! so a decoded request can move between tasks and shards without copying its values.

use bytes::Bytes;
use sluice_types::CqlType;
use std::sync::Arc;

/// A CQL consistency level (`[consistency]`, a short on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Consistency {
    /// ANY
    Any = 0x0000,
    /// ONE
    One = 0x0001,
    /// TWO
    Two = 0x0002,
    /// THREE
    Three = 0x0003,
    /// QUORUM
    Quorum = 0x0004,
    /// ALL
    All = 0x0005,
    /// LOCAL_QUORUM
    LocalQuorum = 0x0006,
    /// EACH_QUORUM
    EachQuorum = 0x0007,
    /// SERIAL
    Serial = 0x0008,
    /// LOCAL_SERIAL
    LocalSerial = 0x0009,
    /// LOCAL_ONE
    LocalOne = 0x000A,
}

impl Consistency {
    /// The level with this wire code, if valid.
    pub const fn from_code(code: u16) -> Option<Consistency> {
        Some(match code {
            0x0000 => Consistency::Any,
            0x0001 => Consistency::One,
            0x0002 => Consistency::Two,
            0x0003 => Consistency::Three,
            0x0004 => Consistency::Quorum,
            0x0005 => Consistency::All,
            0x0006 => Consistency::LocalQuorum,
            0x0007 => Consistency::EachQuorum,
            0x0008 => Consistency::Serial,
            0x0009 => Consistency::LocalSerial,
            0x000A => Consistency::LocalOne,
            _ => return None,
        })
    }

    /// True for SERIAL and LOCAL_SERIAL.
    pub const fn is_serial(self) -> bool {
        matches!(self, Consistency::Serial | Consistency::LocalSerial)
    }
}

/// One bound value (`[value]`): a byte string, null (-1) or unset (-2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Bytes of the serialized value (a slice of the request frame).
    Set(Bytes),
    /// `null` (length -1).
    Null,
    /// `unset` (length -2, v4+): leave the column unchanged / ignore.
    Unset,
}

impl Value {
    /// This value, borrowed.
    #[inline]
    pub fn borrowed(&self) -> ValueRef<'_> {
        match self {
            Value::Set(b) => ValueRef::Set(b),
            Value::Null => ValueRef::Null,
            Value::Unset => ValueRef::Unset,
        }
    }
}

/// One bound value borrowed from where it lies: a request body, or a decoded [`Value`].
/// `Copy`, with nothing to drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueRef<'a> {
    /// Bytes of the serialized value.
    Set(&'a [u8]),
    /// `null` (length -1).
    Null,
    /// `unset` (length -2, v4+).
    Unset,
}

/// Positional bound values, decoded ([`Value`]s) or read in place from a request body
/// ([`crate::ExecuteHead`]): what the deadline and routing read before a statement is
/// decoded in full, so that a request turned away there copies no value.
pub trait BoundValues {
    /// How many values there are.
    fn count(&self) -> usize;

    /// The value at `index`, borrowed; None past the end.
    fn value(&self, index: usize) -> Option<ValueRef<'_>>;

    /// Runs `f` over the same values as decoded [`Value`]s (slices of the request body: their
    /// bytes are not copied), for the uncommon statements whose binding needs them.
    fn with_decoded<R>(&self, f: impl FnOnce(&[Value]) -> R) -> R;
}

impl BoundValues for [Value] {
    #[inline]
    fn count(&self) -> usize {
        self.len()
    }

    #[inline]
    fn value(&self, index: usize) -> Option<ValueRef<'_>> {
        self.get(index).map(Value::borrowed)
    }

    #[inline]
    fn with_decoded<R>(&self, f: impl FnOnce(&[Value]) -> R) -> R {
        f(self)
    }
}

/// The parameters shared by QUERY and EXECUTE (`<query_parameters>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryParameters {
    /// Consistency level.
    pub consistency: Consistency,
    /// Bound values, positional.
    pub values: Vec<Value>,
    /// Names of the values when flag 0x40 was set (same length as `values`).
    pub names: Option<Vec<String>>,
    /// Flag 0x02: the client already has the result metadata.
    pub skip_metadata: bool,
    /// Flag 0x04: page size (None = unpaged; values <= 0 also mean unpaged).
    pub page_size: Option<i32>,
    /// Flag 0x08: paging state returned by a previous page.
    pub paging_state: Option<Bytes>,
    /// Flag 0x10: serial consistency for conditional updates.
    pub serial_consistency: Option<Consistency>,
    /// Flag 0x20: client-side default timestamp in microseconds.
    pub default_timestamp: Option<i64>,
}

impl Default for QueryParameters {
    fn default() -> Self {
        QueryParameters {
            consistency: Consistency::One,
            values: Vec::new(),
            names: None,
            skip_metadata: false,
            page_size: None,
            paging_state: None,
            serial_consistency: None,
            default_timestamp: None,
        }
    }
}

/// One statement of a BATCH request: its text or prepared id, and its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchEntry {
    /// The statement.
    pub statement: BatchQuery,
    /// Its bound values.
    pub values: Vec<Value>,
}

/// A batch entry is a query string (kind 0) or a prepared id (kind 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchQuery {
    /// Kind 0: CQL text (validated UTF-8).
    Text(Bytes),
    /// Kind 1: prepared statement id.
    Prepared(Bytes),
}

/// BATCH request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRequest {
    /// 0 = LOGGED, 1 = UNLOGGED, 2 = COUNTER.
    pub batch_type: u8,
    /// The statements.
    pub entries: Vec<BatchEntry>,
    /// Consistency.
    pub consistency: Consistency,
    /// Serial consistency.
    pub serial_consistency: Option<Consistency>,
    /// Client-side default timestamp (µs).
    pub default_timestamp: Option<i64>,
}

/// Event types a connection can REGISTER for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// TOPOLOGY_CHANGE
    TopologyChange,
    /// STATUS_CHANGE
    StatusChange,
    /// SCHEMA_CHANGE
    SchemaChange,
}

/// A decoded request message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// OPTIONS.
    Options,
    /// STARTUP with its string map.
    Startup(Vec<(String, String)>),
    /// AUTH_RESPONSE with its token.
    AuthResponse(Option<Bytes>),
    /// REGISTER with the event types.
    Register(Vec<EventType>),
    /// QUERY: the CQL text (validated UTF-8, borrowed from the frame) and parameters.
    Query {
        /// CQL text as UTF-8 bytes.
        query: Bytes,
        /// Parameters.
        params: QueryParameters,
    },
    /// PREPARE: the CQL text.
    Prepare {
        /// CQL text as UTF-8 bytes.
        query: Bytes,
    },
    /// EXECUTE: the prepared id and parameters.
    Execute {
        /// Prepared statement id.
        id: Bytes,
        /// Parameters.
        params: QueryParameters,
    },
    /// BATCH.
    Batch(BatchRequest),
}

/// The column spec of a result or bind-marker metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnSpec {
    /// Keyspace of the table the column belongs to.
    pub keyspace: String,
    /// Table.
    pub table: String,
    /// Column (or receiver) name, e.g. `v`, `[limit]`, `partition key token`.
    pub name: String,
    /// Type.
    pub ty: CqlType,
}

/// The column specs of a Rows result, encoded once: a prepared statement's results share
/// the specs and their bytes, so that answering a read neither copies nor re-encodes them.
#[derive(Debug, Clone)]
pub struct ResultColumns {
    specs: Arc<[ColumnSpec]>,
    /// Every column is of one table: the Global_tables_spec flag applies.
    global: bool,
    /// `[<global_table_spec>]<col_spec_1>...<col_spec_n>` of `<metadata>` (v4 §4.2.5.2).
    encoded: Bytes,
}

impl ResultColumns {
    /// The specs with their encoding.
    pub fn new(specs: Vec<ColumnSpec>) -> ResultColumns {
        let (global, encoded) = crate::response::encode_result_column_specs(&specs);
        ResultColumns {
            specs: specs.into(),
            global,
            encoded,
        }
    }

    /// True if every column is of one table (sent once, with the Global_tables_spec flag).
    pub fn is_global(&self) -> bool {
        self.global
    }

    /// The encoded specs, as `<metadata>` carries them after its paging state.
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }
}

impl From<Vec<ColumnSpec>> for ResultColumns {
    fn from(specs: Vec<ColumnSpec>) -> ResultColumns {
        ResultColumns::new(specs)
    }
}

impl Default for ResultColumns {
    fn default() -> ResultColumns {
        ResultColumns::new(Vec::new())
    }
}

impl std::ops::Deref for ResultColumns {
    type Target = [ColumnSpec];

    fn deref(&self) -> &[ColumnSpec] {
        &self.specs
    }
}

impl PartialEq for ResultColumns {
    fn eq(&self, other: &ResultColumns) -> bool {
        self.specs == other.specs
    }
}

impl Eq for ResultColumns {}

/// `<metadata>` of a Rows result.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RowsMetadata {
    /// Column specs (not sent with `no_metadata`), shared with the prepared statement.
    pub columns: ResultColumns,
    /// Number of columns per row (equals `columns.len()` unless `no_metadata`).
    pub column_count: usize,
    /// Paging state when more pages remain (sets Has_more_pages).
    pub paging_state: Option<Bytes>,
    /// No_metadata flag: the client asked to skip it and it matches the prepared metadata.
    pub no_metadata: bool,
}

/// `<metadata>` of the bind markers in a PREPARED result.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreparedMetadata {
    /// Bind marker specs, in marker order.
    pub columns: Vec<ColumnSpec>,
    /// For each partition-key component, the index of its bind marker (empty if not all bound by `=`).
    pub pk_indexes: Vec<u16>,
    /// Set ScyllaDB's LWT bit (0x80000000) in the flags.
    pub lwt: bool,
}

/// A Rows result: metadata plus rows already encoded as consecutive `[bytes]` cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rows {
    /// Metadata.
    pub metadata: RowsMetadata,
    /// Number of rows in `body`.
    pub row_count: u32,
    /// `row_count * column_count` cells, each `[bytes]` (i32 length, -1 for null).
    pub body: Bytes,
}

/// The change of a SCHEMA_CHANGE result or event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaChangeType {
    /// CREATED
    Created,
    /// UPDATED
    Updated,
    /// DROPPED
    Dropped,
}

/// What a schema change touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaChangeTarget {
    /// KEYSPACE ks
    Keyspace(String),
    /// TABLE ks t
    Table(String, String),
    /// TYPE ks t
    Type(String, String),
}

/// A schema change (RESULT kind 5, and the SCHEMA_CHANGE event body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaChange {
    /// Created / updated / dropped.
    pub change: SchemaChangeType,
    /// The object.
    pub target: SchemaChangeTarget,
}

/// A RESULT message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultMessage {
    /// Kind 1: Void.
    Void,
    /// Kind 2: Rows.
    Rows(Rows),
    /// Kind 3: Set_keyspace.
    SetKeyspace(String),
    /// Kind 4: Prepared.
    Prepared {
        /// Statement id (16-byte MD5 of keyspace + query).
        id: Bytes,
        /// Bind marker metadata.
        metadata: PreparedMetadata,
        /// Result metadata (`no_metadata` for non-SELECT).
        result_metadata: RowsMetadata,
    },
    /// Kind 5: Schema_change.
    SchemaChange(SchemaChange),
}
