//! Response encoders: each writes one complete v4 response frame (header 0x84 + body) at the
//! end of a `BytesMut`, compressing the body in place when the connection negotiated
//! compression and the body is large enough.

use std::net::SocketAddr;

use bytes::{BufMut, Bytes, BytesMut};
use sluice_types::CqlType;

use crate::compression::Compression;
use crate::error::{DbError, DetailedError, ErrorResponse, WriteType};
use crate::frame::{begin_frame, finish_frame, Opcode, EVENT_STREAM};
use crate::messages::{
    ColumnSpec, Consistency, PreparedMetadata, ResultMessage, Rows, RowsMetadata, SchemaChange,
    SchemaChangeTarget, SchemaChangeType,
};
use crate::wire::{
    put_bytes, put_consistency, put_inet, put_int, put_short, put_short_bytes, put_string,
    put_string_list, put_string_multimap,
};

/// Rows/prepared metadata flag: one global table spec precedes the column specs.
pub const METADATA_GLOBAL_TABLE_SPEC: i32 = 0x0001;
/// Rows metadata flag: a paging state follows; more pages remain.
pub const METADATA_HAS_MORE_PAGES: i32 = 0x0002;
/// Rows metadata flag: no column specs follow.
pub const METADATA_NO_METADATA: i32 = 0x0004;
/// Prepared metadata flag: ScyllaDB's LWT mark (`SCYLLA_LWT_ADD_METADATA_MARK`).
pub const METADATA_LWT: i32 = 0x8000_0000_u32 as i32;

/// RESULT kind: Void.
pub const RESULT_VOID: i32 = 0x0001;
/// RESULT kind: Rows.
pub const RESULT_ROWS: i32 = 0x0002;
/// RESULT kind: Set_keyspace.
pub const RESULT_SET_KEYSPACE: i32 = 0x0003;
/// RESULT kind: Prepared.
pub const RESULT_PREPARED: i32 = 0x0004;
/// RESULT kind: Schema_change.
pub const RESULT_SCHEMA_CHANGE: i32 = 0x0005;

/// The authenticator class drivers accept (upstream gocql requires exactly this name).
pub const PASSWORD_AUTHENTICATOR: &str = "org.apache.cassandra.auth.PasswordAuthenticator";

/// A STATUS_CHANGE event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusChange {
    /// The node at this native address came up.
    Up(SocketAddr),
    /// The node at this native address went down.
    Down(SocketAddr),
}

/// A TOPOLOGY_CHANGE event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyChange {
    /// A node joined.
    NewNode(SocketAddr),
    /// A node left.
    RemovedNode(SocketAddr),
}

/// An EVENT pushed to registered connections (stream -1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// SCHEMA_CHANGE.
    SchemaChange(SchemaChange),
    /// STATUS_CHANGE.
    StatusChange(StatusChange),
    /// TOPOLOGY_CHANGE.
    TopologyChange(TopologyChange),
}

/// Patches the length and compresses the frame started at `start`.
fn finish(buf: &mut BytesMut, start: usize, compression: Compression) {
    finish_frame(buf, start);
    compression.compress_frame_in_place(buf, start);
}

/// Appends READY (empty body, never compressed).
pub fn encode_ready(buf: &mut BytesMut, stream: i16) {
    let start = begin_frame(buf, stream, Opcode::Ready);
    finish_frame(buf, start);
}

/// Appends SUPPORTED with a string multimap, e.g. `&[("COMPRESSION", &["lz4", "snappy"])]`.
/// Sent before STARTUP, so never compressed.
pub fn encode_supported<K, L, V>(buf: &mut BytesMut, stream: i16, options: &[(K, L)])
where
    K: AsRef<str>,
    L: AsRef<[V]>,
    V: AsRef<str>,
{
    let start = begin_frame(buf, stream, Opcode::Supported);
    put_string_multimap(buf, options);
    finish_frame(buf, start);
}

/// Appends AUTHENTICATE with the authenticator class name.
pub fn encode_authenticate(buf: &mut BytesMut, stream: i16, class: &str) {
    let start = begin_frame(buf, stream, Opcode::Authenticate);
    put_string(buf, class);
    finish_frame(buf, start);
}

/// Appends AUTH_SUCCESS with an optional final token (`None` = null).
pub fn encode_auth_success(
    buf: &mut BytesMut,
    stream: i16,
    token: Option<&[u8]>,
    compression: Compression,
) {
    let start = begin_frame(buf, stream, Opcode::AuthSuccess);
    put_bytes(buf, token);
    finish(buf, start, compression);
}

/// Appends AUTH_CHALLENGE with a token.
pub fn encode_auth_challenge(
    buf: &mut BytesMut,
    stream: i16,
    token: Option<&[u8]>,
    compression: Compression,
) {
    let start = begin_frame(buf, stream, Opcode::AuthChallenge);
    put_bytes(buf, token);
    finish(buf, start, compression);
}

/// Appends a RESULT frame.
pub fn encode_result(
    buf: &mut BytesMut,
    stream: i16,
    result: &ResultMessage,
    compression: Compression,
) {
    let start = begin_frame(buf, stream, Opcode::Result);
    match result {
        ResultMessage::Void => put_int(buf, RESULT_VOID),
        ResultMessage::Rows(rows) => {
            put_int(buf, RESULT_ROWS);
            put_rows(buf, rows);
        }
        ResultMessage::SetKeyspace(ks) => {
            put_int(buf, RESULT_SET_KEYSPACE);
            put_string(buf, ks);
        }
        ResultMessage::Prepared {
            id,
            metadata,
            result_metadata,
        } => {
            put_int(buf, RESULT_PREPARED);
            put_short_bytes(buf, id);
            put_prepared_metadata(buf, metadata);
            put_rows_metadata(buf, result_metadata);
        }
        ResultMessage::SchemaChange(change) => {
            put_int(buf, RESULT_SCHEMA_CHANGE);
            put_schema_change(buf, change);
        }
    }
    finish(buf, start, compression);
}

/// Appends a Rows RESULT whose cells the caller writes directly into `buf` (no intermediate
/// `Bytes`): call this, then append `row_count * column_count` cells with
/// [`crate::wire::put_bytes`], then [`RowsWriter::finish`].
pub fn begin_rows(buf: &mut BytesMut, stream: i16, metadata: &RowsMetadata) -> RowsWriter {
    let start = begin_frame(buf, stream, Opcode::Result);
    put_int(buf, RESULT_ROWS);
    put_rows_metadata(buf, metadata);
    let count_at = buf.len();
    put_int(buf, 0);
    RowsWriter {
        start,
        count_at,
        rows: 0,
    }
}

/// An open Rows RESULT frame being filled in place (see [`begin_rows`]).
#[derive(Debug)]
#[must_use = "call finish() to patch the row count and frame length"]
pub struct RowsWriter {
    start: usize,
    count_at: usize,
    rows: u32,
}

impl RowsWriter {
    /// Records that one more complete row has been appended.
    pub fn row_done(&mut self) {
        self.rows += 1;
    }

    /// Rows recorded so far.
    pub fn rows(&self) -> u32 {
        self.rows
    }

    /// Patches the row count and the frame length, then compresses if negotiated.
    pub fn finish(self, buf: &mut BytesMut, compression: Compression) {
        buf[self.count_at..self.count_at + 4].copy_from_slice(&self.rows.to_be_bytes());
        finish(buf, self.start, compression);
    }
}

fn put_rows(buf: &mut BytesMut, rows: &Rows) {
    put_rows_metadata(buf, &rows.metadata);
    buf.put_u32(rows.row_count);
    buf.put_slice(&rows.body);
}

/// The shared (keyspace, table) of all specs, if there is one and it is not empty.
fn global_spec(columns: &[ColumnSpec]) -> Option<(&str, &str)> {
    let first = columns.first()?;
    columns
        .iter()
        .all(|c| c.keyspace == first.keyspace && c.table == first.table)
        .then_some((first.keyspace.as_str(), first.table.as_str()))
}

fn put_column_specs(buf: &mut BytesMut, columns: &[ColumnSpec], global: bool) {
    for c in columns {
        if !global {
            put_string(buf, &c.keyspace);
            put_string(buf, &c.table);
        }
        put_string(buf, &c.name);
        put_type_option(buf, &c.ty);
    }
}

fn len_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The column specs part of a Rows `<metadata>`: whether the global table spec applies,
/// and the bytes from it (if so) to the last column spec.
pub(crate) fn encode_result_column_specs(columns: &[ColumnSpec]) -> (bool, Bytes) {
    let global = global_spec(columns);
    let mut buf = BytesMut::new();
    if let Some((ks, table)) = global {
        put_string(&mut buf, ks);
        put_string(&mut buf, table);
    }
    put_column_specs(&mut buf, columns, global.is_some());
    (global.is_some(), buf.freeze())
}

/// Writes a Rows `<metadata>` (v4 §4.2.5.2); the column specs are copied as encoded once.
pub fn put_rows_metadata(buf: &mut BytesMut, m: &RowsMetadata) {
    let mut flags = 0;
    if m.no_metadata {
        flags |= METADATA_NO_METADATA;
    } else if m.columns.is_global() {
        flags |= METADATA_GLOBAL_TABLE_SPEC;
    }
    if m.paging_state.is_some() {
        flags |= METADATA_HAS_MORE_PAGES;
    }
    put_int(buf, flags);
    let count = if m.no_metadata {
        m.column_count
    } else {
        m.columns.len()
    };
    put_int(buf, len_i32(count));
    if let Some(state) = &m.paging_state {
        put_bytes(buf, Some(state));
    }
    if m.no_metadata {
        return;
    }
    buf.put_slice(m.columns.encoded());
}

/// Writes a PREPARED bind-marker `<metadata>` (v4 §4.2.5.4) with pk indexes and LWT bit.
pub fn put_prepared_metadata(buf: &mut BytesMut, m: &PreparedMetadata) {
    let global = global_spec(&m.columns);
    let mut flags = 0;
    if global.is_some() {
        flags |= METADATA_GLOBAL_TABLE_SPEC;
    }
    if m.lwt {
        flags |= METADATA_LWT;
    }
    put_int(buf, flags);
    put_int(buf, len_i32(m.columns.len()));
    put_int(buf, len_i32(m.pk_indexes.len()));
    for &i in &m.pk_indexes {
        put_short(buf, i);
    }
    if let Some((ks, table)) = global {
        put_string(buf, ks);
        put_string(buf, table);
    }
    put_column_specs(buf, &m.columns, global.is_some());
}

/// Writes a type as an `[option]`: native ids, list 0x20, map 0x21, set 0x22, UDT 0x30,
/// tuple 0x31. `frozen` does not exist on the wire.
pub fn put_type_option(buf: &mut BytesMut, ty: &CqlType) {
    match ty {
        CqlType::Native(n) => put_short(buf, n.option_id()),
        CqlType::List(t) => {
            put_short(buf, 0x0020);
            put_type_option(buf, t);
        }
        CqlType::Map(k, v) => {
            put_short(buf, 0x0021);
            put_type_option(buf, k);
            put_type_option(buf, v);
        }
        CqlType::Set(t) => {
            put_short(buf, 0x0022);
            put_type_option(buf, t);
        }
        CqlType::Udt {
            keyspace,
            name,
            fields,
        } => {
            put_short(buf, 0x0030);
            put_string(buf, keyspace);
            put_string(buf, name);
            let n = fields.len().min(u16::MAX as usize);
            put_short(buf, n as u16);
            for (fname, fty) in &fields[..n] {
                put_string(buf, fname);
                put_type_option(buf, fty);
            }
        }
        CqlType::Tuple(items) => {
            put_short(buf, 0x0031);
            let n = items.len().min(u16::MAX as usize);
            put_short(buf, n as u16);
            for t in &items[..n] {
                put_type_option(buf, t);
            }
        }
        CqlType::Frozen(inner) => put_type_option(buf, inner),
    }
}

fn change_type_str(c: SchemaChangeType) -> &'static str {
    match c {
        SchemaChangeType::Created => "CREATED",
        SchemaChangeType::Updated => "UPDATED",
        SchemaChangeType::Dropped => "DROPPED",
    }
}

/// Writes a schema change body (shared by RESULT Schema_change and the SCHEMA_CHANGE event).
fn put_schema_change(buf: &mut BytesMut, sc: &SchemaChange) {
    put_string(buf, change_type_str(sc.change));
    match &sc.target {
        SchemaChangeTarget::Keyspace(ks) => {
            put_string(buf, "KEYSPACE");
            put_string(buf, ks);
        }
        SchemaChangeTarget::Table(ks, t) => {
            put_string(buf, "TABLE");
            put_string(buf, ks);
            put_string(buf, t);
        }
        SchemaChangeTarget::Type(ks, t) => {
            put_string(buf, "TYPE");
            put_string(buf, ks);
            put_string(buf, t);
        }
    }
}

/// Appends an EVENT frame (stream -1).
pub fn encode_event(buf: &mut BytesMut, event: &Event, compression: Compression) {
    let start = begin_frame(buf, EVENT_STREAM, Opcode::Event);
    match event {
        Event::SchemaChange(sc) => {
            put_string(buf, "SCHEMA_CHANGE");
            put_schema_change(buf, sc);
        }
        Event::StatusChange(s) => {
            put_string(buf, "STATUS_CHANGE");
            let (change, addr) = match s {
                StatusChange::Up(a) => ("UP", a),
                StatusChange::Down(a) => ("DOWN", a),
            };
            put_string(buf, change);
            put_inet(buf, *addr);
        }
        Event::TopologyChange(t) => {
            put_string(buf, "TOPOLOGY_CHANGE");
            let (change, addr) = match t {
                TopologyChange::NewNode(a) => ("NEW_NODE", a),
                TopologyChange::RemovedNode(a) => ("REMOVED_NODE", a),
            };
            put_string(buf, change);
            put_inet(buf, *addr);
        }
    }
    finish(buf, start, compression);
}

/// Writes `<cl><received><blockfor>` with neutral counts, for the failure errors whose
/// fields Sluice does not track (keeps the body parseable by every driver).
fn put_default_counts(buf: &mut BytesMut) {
    put_consistency(buf, Consistency::One);
    put_int(buf, 0);
    put_int(buf, 1);
}

/// Writes the code-specific part of an error body (v4 §9), exactly as drivers parse it.
fn put_error_fields(buf: &mut BytesMut, error: &DbError, already_exists: Option<(&str, &str)>) {
    match *error {
        DbError::Unavailable {
            consistency,
            required,
            alive,
        } => {
            put_consistency(buf, consistency);
            put_int(buf, required);
            put_int(buf, alive);
        }
        DbError::WriteTimeout {
            consistency,
            received,
            block_for,
            write_type,
        } => {
            put_consistency(buf, consistency);
            put_int(buf, received);
            put_int(buf, block_for);
            put_string(buf, write_type.as_str());
        }
        DbError::ReadTimeout {
            consistency,
            received,
            block_for,
            data_present,
        } => {
            put_consistency(buf, consistency);
            put_int(buf, received);
            put_int(buf, block_for);
            buf.put_u8(u8::from(data_present));
        }
        DbError::RateLimitReached {
            op,
            rejected_by_coordinator,
        } => {
            buf.put_u8(op as u8);
            buf.put_u8(u8::from(rejected_by_coordinator));
        }
        DbError::Unprepared { len, ref id } => {
            let len = usize::from(len).min(id.len());
            put_short_bytes(buf, &id[..len]);
        }
        DbError::ReadFailure => {
            put_default_counts(buf);
            put_int(buf, 0);
            buf.put_u8(0);
        }
        DbError::WriteFailure => {
            put_default_counts(buf);
            put_int(buf, 0);
            put_string(buf, WriteType::Simple.as_str());
        }
        DbError::ReplicaReadFailure {
            consistency,
            received,
            block_for,
            failures,
            data_present,
        } => {
            put_consistency(buf, consistency);
            put_int(buf, received);
            put_int(buf, block_for);
            put_int(buf, failures);
            buf.put_u8(u8::from(data_present));
        }
        DbError::ReplicaWriteFailure {
            consistency,
            received,
            block_for,
            failures,
            write_type,
        } => {
            put_consistency(buf, consistency);
            put_int(buf, received);
            put_int(buf, block_for);
            put_int(buf, failures);
            put_string(buf, write_type.as_str());
        }
        DbError::FunctionFailure => {
            put_string(buf, "");
            put_string(buf, "");
            put_string_list::<&str>(buf, &[]);
        }
        DbError::AlreadyExists => {
            let (ks, table) = already_exists.unwrap_or(("", ""));
            put_string(buf, ks);
            put_string(buf, table);
        }
        DbError::ServerError
        | DbError::ProtocolError
        | DbError::BadCredentials
        | DbError::Overloaded
        | DbError::IsBootstrapping
        | DbError::TruncateError
        | DbError::SyntaxError
        | DbError::Unauthorized
        | DbError::Invalid
        | DbError::ConfigError => {}
    }
}

/// Writes an ERROR body (`<code><message><fields>`) without the frame header.
pub fn put_error_body(buf: &mut BytesMut, e: &ErrorResponse) {
    put_int(buf, e.code() as i32);
    put_string(buf, e.message);
    put_error_fields(buf, &e.error, None);
}

/// Appends an ERROR frame for a hot-path error value.
pub fn encode_error(buf: &mut BytesMut, stream: i16, e: &ErrorResponse, compression: Compression) {
    let start = begin_frame(buf, stream, Opcode::Error);
    put_error_body(buf, e);
    finish(buf, start, compression);
}

/// Appends an ERROR frame for a cold-path error with a built message.
pub fn encode_detailed_error(
    buf: &mut BytesMut,
    stream: i16,
    e: &DetailedError,
    compression: Compression,
) {
    let start = begin_frame(buf, stream, Opcode::Error);
    put_int(buf, e.code() as i32);
    put_string(buf, &e.message);
    let ae = e
        .already_exists
        .as_ref()
        .map(|(ks, t)| (ks.as_str(), t.as_str()));
    put_error_fields(buf, &e.error, ae);
    finish(buf, start, compression);
}

/// Message of the Unprepared error.
pub const UNPREPARED_MESSAGE: &str = "Prepared statement not found; re-prepare it";

/// Appends an ERROR frame with a borrowed message (for messages built once and shared,
/// such as a cached permission denial).
pub fn encode_error_text(
    buf: &mut BytesMut,
    stream: i16,
    error: &DbError,
    message: &str,
    compression: Compression,
) {
    let start = begin_frame(buf, stream, Opcode::Error);
    put_int(buf, error.code() as i32);
    put_string(buf, message);
    put_error_fields(buf, error, None);
    finish(buf, start, compression);
}

/// Builds the Unprepared error for an unknown prepared id (echoed, up to 16 bytes).
pub fn unprepared_error(id: &[u8]) -> ErrorResponse {
    ErrorResponse::new(DbError::unprepared(id), UNPREPARED_MESSAGE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorCode, OperationType};
    use crate::frame::{HEADER_LEN, RESPONSE_VERSION};
    use crate::wire::{DecodeError, Reader};
    use bytes::Bytes;
    use sluice_types::NativeType;

    /// Checks the header and returns (stream, opcode byte, body).
    fn split(buf: BytesMut) -> (i16, u8, Bytes) {
        assert_eq!(buf[0], RESPONSE_VERSION);
        let len = u32::from_be_bytes(buf[5..9].try_into().unwrap()) as usize;
        assert_eq!(len, buf.len() - HEADER_LEN, "length field");
        let stream = i16::from_be_bytes([buf[2], buf[3]]);
        let op = buf[4];
        (stream, op, buf.freeze().slice(HEADER_LEN..))
    }

    fn col(ks: &str, t: &str, n: &str, ty: CqlType) -> ColumnSpec {
        ColumnSpec {
            keyspace: ks.into(),
            table: t.into(),
            name: n.into(),
            ty,
        }
    }

    fn read_option(r: &mut Reader<'_>) -> Result<String, DecodeError> {
        let id = r.read_short()?;
        Ok(match id {
            0x20 => format!("list<{}>", read_option(r)?),
            0x21 => format!("map<{}, {}>", read_option(r)?, read_option(r)?),
            0x22 => format!("set<{}>", read_option(r)?),
            0x30 => {
                let ks = r.read_string()?;
                let name = r.read_string()?;
                let n = r.read_short()?;
                let mut s = format!("udt {ks}.{name}(");
                for _ in 0..n {
                    s += &format!("{} {},", r.read_string()?, read_option(r)?);
                }
                s + ")"
            }
            0x31 => {
                let n = r.read_short()?;
                let mut parts = vec![];
                for _ in 0..n {
                    parts.push(read_option(r)?);
                }
                format!("tuple<{}>", parts.join(", "))
            }
            n => NativeType::from_option_id(n).unwrap().cql_name().to_owned(),
        })
    }

    #[test]
    fn ready_supported_authenticate() {
        let mut buf = BytesMut::new();
        encode_ready(&mut buf, 3);
        let (stream, op, body) = split(buf);
        assert_eq!((stream, op, body.len()), (3, Opcode::Ready as u8, 0));

        let mut buf = BytesMut::new();
        encode_supported(
            &mut buf,
            0,
            &[
                ("CQL_VERSION", &["3.4.7"][..]),
                ("COMPRESSION", &["lz4", "snappy"][..]),
            ],
        );
        let (_, op, body) = split(buf);
        assert_eq!(op, Opcode::Supported as u8);
        let mut r = Reader::new(&body);
        assert_eq!(r.read_short().unwrap(), 2);
        assert_eq!(r.read_string().unwrap(), "CQL_VERSION");
        assert_eq!(r.read_short().unwrap(), 1);
        assert_eq!(r.read_string().unwrap(), "3.4.7");
        assert_eq!(r.read_string().unwrap(), "COMPRESSION");
        assert_eq!(r.read_short().unwrap(), 2);
        assert_eq!(r.read_string().unwrap(), "lz4");
        assert_eq!(r.read_string().unwrap(), "snappy");
        assert_eq!(r.remaining(), 0);

        let mut buf = BytesMut::new();
        encode_authenticate(&mut buf, 1, PASSWORD_AUTHENTICATOR);
        let (_, op, body) = split(buf);
        assert_eq!(op, Opcode::Authenticate as u8);
        assert_eq!(
            Reader::new(&body).read_string().unwrap(),
            PASSWORD_AUTHENTICATOR
        );
    }

    #[test]
    fn rows_with_global_spec_and_paging() {
        let rows = Rows {
            metadata: RowsMetadata {
                columns: vec![
                    col("ks", "t", "k", CqlType::Native(NativeType::Int)),
                    col(
                        "ks",
                        "t",
                        "m",
                        CqlType::Frozen(Box::new(CqlType::Map(
                            Box::new(CqlType::Native(NativeType::Text)),
                            Box::new(CqlType::List(Box::new(CqlType::Native(NativeType::Bigint)))),
                        ))),
                    ),
                ]
                .into(),
                column_count: 2,
                paging_state: Some(Bytes::from_static(b"next")),
                no_metadata: false,
            },
            row_count: 1,
            body: {
                let mut b = BytesMut::new();
                put_bytes(&mut b, Some(&1i32.to_be_bytes()));
                put_bytes(&mut b, None);
                b.freeze()
            },
        };
        let mut buf = BytesMut::new();
        encode_result(&mut buf, 9, &ResultMessage::Rows(rows), Compression::None);
        let (stream, op, body) = split(buf);
        assert_eq!((stream, op), (9, Opcode::Result as u8));
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), RESULT_ROWS);
        assert_eq!(r.read_int().unwrap(), 0x0003);
        assert_eq!(r.read_int().unwrap(), 2);
        assert_eq!(&r.read_bytes().unwrap().unwrap()[..], b"next");
        assert_eq!(r.read_string().unwrap(), "ks");
        assert_eq!(r.read_string().unwrap(), "t");
        assert_eq!(r.read_string().unwrap(), "k");
        assert_eq!(read_option(&mut r).unwrap(), "int");
        assert_eq!(r.read_string().unwrap(), "m");
        assert_eq!(read_option(&mut r).unwrap(), "map<text, list<bigint>>");
        assert_eq!(r.read_int().unwrap(), 1);
        assert_eq!(r.read_int().unwrap(), 4);
        assert_eq!(r.read_int().unwrap(), 1);
        assert_eq!(r.read_int().unwrap(), -1);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn rows_metadata_per_column_spec_and_no_metadata() {
        let mut buf = BytesMut::new();
        put_rows_metadata(
            &mut buf,
            &RowsMetadata {
                columns: vec![
                    col("a", "t", "x", CqlType::Native(NativeType::Blob)),
                    col("b", "t", "y", CqlType::Native(NativeType::Uuid)),
                ]
                .into(),
                column_count: 2,
                paging_state: None,
                no_metadata: false,
            },
        );
        let body = buf.freeze();
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0);
        assert_eq!(r.read_int().unwrap(), 2);
        for (ks, name, ty) in [("a", "x", "blob"), ("b", "y", "uuid")] {
            assert_eq!(r.read_string().unwrap(), ks);
            assert_eq!(r.read_string().unwrap(), "t");
            assert_eq!(r.read_string().unwrap(), name);
            assert_eq!(read_option(&mut r).unwrap(), ty);
        }
        assert_eq!(r.remaining(), 0);

        let mut buf = BytesMut::new();
        put_rows_metadata(
            &mut buf,
            &RowsMetadata {
                columns: vec![].into(),
                column_count: 3,
                paging_state: Some(Bytes::from_static(b"p")),
                no_metadata: true,
            },
        );
        let body = buf.freeze();
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0x0006);
        assert_eq!(r.read_int().unwrap(), 3);
        assert_eq!(&r.read_bytes().unwrap().unwrap()[..], b"p");
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn prepared_with_pk_indexes_lwt_udt_and_tuple() {
        let udt = CqlType::Udt {
            keyspace: "ks".into(),
            name: "addr".into(),
            fields: vec![
                ("street".into(), CqlType::Native(NativeType::Text)),
                ("zip".into(), CqlType::Native(NativeType::Int)),
            ],
        };
        let tuple = CqlType::Tuple(vec![
            CqlType::Native(NativeType::Int),
            CqlType::Set(Box::new(CqlType::Native(NativeType::Ascii))),
        ]);
        let msg = ResultMessage::Prepared {
            id: Bytes::from_static(&[7; 16]),
            metadata: PreparedMetadata {
                columns: vec![col("ks", "t", "k", udt), col("ks", "t", "v", tuple)],
                pk_indexes: vec![1, 0],
                lwt: true,
            },
            result_metadata: RowsMetadata {
                no_metadata: true,
                ..RowsMetadata::default()
            },
        };
        let mut buf = BytesMut::new();
        encode_result(&mut buf, 2, &msg, Compression::None);
        let (_, _, body) = split(buf);
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), RESULT_PREPARED);
        assert_eq!(&r.read_short_bytes().unwrap()[..], &[7; 16]);
        assert_eq!(r.read_int().unwrap() as u32, 0x8000_0001);
        assert_eq!(r.read_int().unwrap(), 2);
        assert_eq!(r.read_int().unwrap(), 2);
        assert_eq!(r.read_short().unwrap(), 1);
        assert_eq!(r.read_short().unwrap(), 0);
        assert_eq!(r.read_string().unwrap(), "ks");
        assert_eq!(r.read_string().unwrap(), "t");
        assert_eq!(r.read_string().unwrap(), "k");
        assert_eq!(
            read_option(&mut r).unwrap(),
            "udt ks.addr(street text,zip int,)"
        );
        assert_eq!(r.read_string().unwrap(), "v");
        assert_eq!(read_option(&mut r).unwrap(), "tuple<int, set<ascii>>");
        assert_eq!(r.read_int().unwrap(), 0x0004);
        assert_eq!(r.read_int().unwrap(), 0);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn void_set_keyspace_schema_change() {
        let mut buf = BytesMut::new();
        encode_result(&mut buf, 1, &ResultMessage::Void, Compression::Lz4);
        let (_, _, body) = split(buf);
        assert_eq!(&body[..], &[0, 0, 0, 1]);

        let mut buf = BytesMut::new();
        encode_result(
            &mut buf,
            1,
            &ResultMessage::SetKeyspace("ks1".into()),
            Compression::None,
        );
        let (_, _, body) = split(buf);
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), RESULT_SET_KEYSPACE);
        assert_eq!(r.read_string().unwrap(), "ks1");

        let sc = SchemaChange {
            change: SchemaChangeType::Created,
            target: SchemaChangeTarget::Table("ks".into(), "t".into()),
        };
        let mut buf = BytesMut::new();
        encode_result(
            &mut buf,
            1,
            &ResultMessage::SchemaChange(sc.clone()),
            Compression::None,
        );
        let (_, _, body) = split(buf);
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), RESULT_SCHEMA_CHANGE);
        for s in ["CREATED", "TABLE", "ks", "t"] {
            assert_eq!(r.read_string().unwrap(), s);
        }
        assert_eq!(r.remaining(), 0);

        let mut buf = BytesMut::new();
        encode_event(&mut buf, &Event::SchemaChange(sc), Compression::None);
        let (stream, op, body) = split(buf);
        assert_eq!((stream, op), (-1, Opcode::Event as u8));
        let mut r = Reader::new(&body);
        for s in ["SCHEMA_CHANGE", "CREATED", "TABLE", "ks", "t"] {
            assert_eq!(r.read_string().unwrap(), s);
        }
    }

    #[test]
    fn status_and_topology_events() {
        let addr: SocketAddr = "192.168.1.5:9042".parse().unwrap();
        for (ev, kind, change) in [
            (
                Event::StatusChange(StatusChange::Down(addr)),
                "STATUS_CHANGE",
                "DOWN",
            ),
            (
                Event::TopologyChange(TopologyChange::NewNode(addr)),
                "TOPOLOGY_CHANGE",
                "NEW_NODE",
            ),
        ] {
            let mut buf = BytesMut::new();
            encode_event(&mut buf, &ev, Compression::None);
            let (stream, _, body) = split(buf);
            assert_eq!(stream, -1);
            let mut r = Reader::new(&body);
            assert_eq!(r.read_string().unwrap(), kind);
            assert_eq!(r.read_string().unwrap(), change);
            assert_eq!(r.read_inet().unwrap(), addr);
            assert_eq!(r.remaining(), 0);
        }
    }

    fn error_body(e: &ErrorResponse) -> Bytes {
        let mut buf = BytesMut::new();
        encode_error(&mut buf, 4, e, Compression::None);
        let (stream, op, body) = split(buf);
        assert_eq!((stream, op), (4, Opcode::Error as u8));
        body
    }

    #[test]
    fn error_bodies_follow_the_spec() {
        let body = error_body(&ErrorResponse {
            error: DbError::WriteTimeout {
                consistency: Consistency::Quorum,
                received: 1,
                block_for: 2,
                write_type: WriteType::Cas,
            },
            message: "timeout",
        });
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0x1100);
        assert_eq!(r.read_string().unwrap(), "timeout");
        assert_eq!(r.read_consistency().unwrap(), Consistency::Quorum);
        assert_eq!((r.read_int().unwrap(), r.read_int().unwrap()), (1, 2));
        assert_eq!(r.read_string().unwrap(), "CAS");
        assert_eq!(r.remaining(), 0);

        let body = error_body(&ErrorResponse {
            error: DbError::ReadTimeout {
                consistency: Consistency::One,
                received: 0,
                block_for: 1,
                data_present: true,
            },
            message: "rt",
        });
        assert_eq!(&body[body.len() - 11..], &[0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1]);

        let body = error_body(&ErrorResponse {
            error: DbError::RateLimitReached {
                op: OperationType::Write,
                rejected_by_coordinator: true,
            },
            message: "rl",
        });
        assert_eq!(&body[..], &[0, 0, 0xF0, 0, 0, 2, b'r', b'l', 1, 1]);

        let body = error_body(&ErrorResponse {
            error: DbError::Unavailable {
                consistency: Consistency::All,
                required: 3,
                alive: 1,
            },
            message: "u",
        });
        assert_eq!(&body[7..], &[0, 5, 0, 0, 0, 3, 0, 0, 0, 1]);

        let body = error_body(&unprepared_error(&[0xAA; 16]));
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0x2500);
        r.read_string().unwrap();
        assert_eq!(&r.read_short_bytes().unwrap()[..], &[0xAA; 16]);
        assert_eq!(r.remaining(), 0);

        let body = error_body(&ErrorResponse::new(DbError::Overloaded, "busy"));
        assert_eq!(&body[..], &[0, 0, 0x10, 1, 0, 4, b'b', b'u', b's', b'y']);
    }

    #[test]
    fn detailed_already_exists_and_defaults() {
        let e = DetailedError::already_exists("ks", "t", format!("Table {} exists", "t"));
        let mut buf = BytesMut::new();
        encode_detailed_error(&mut buf, 1, &e, Compression::None);
        let (_, _, body) = split(buf);
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0x2400);
        assert_eq!(r.read_string().unwrap(), "Table t exists");
        assert_eq!(r.read_string().unwrap(), "ks");
        assert_eq!(r.read_string().unwrap(), "t");
        assert_eq!(r.remaining(), 0);

        // A failure error, whose fields Sluice does not track, still yields a complete body.
        let body = error_body(&ErrorResponse::new(DbError::WriteFailure, "w"));
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0x1500);
        r.read_string().unwrap();
        r.read_consistency().unwrap();
        assert_eq!((r.read_int().unwrap(), r.read_int().unwrap()), (0, 1));
        assert_eq!(r.read_int().unwrap(), 0);
        assert_eq!(r.read_string().unwrap(), "SIMPLE");
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn replica_failures_carry_their_counts() {
        let error = DbError::ReplicaWriteFailure {
            consistency: Consistency::Quorum,
            received: 1,
            block_for: 2,
            failures: 2,
            write_type: WriteType::UnloggedBatch,
        };
        let body = error_body(&ErrorResponse::new(error, "w"));
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0x1500);
        r.read_string().unwrap();
        assert_eq!(r.read_consistency().unwrap(), Consistency::Quorum);
        assert_eq!((r.read_int().unwrap(), r.read_int().unwrap()), (1, 2));
        assert_eq!(r.read_int().unwrap(), 2);
        assert_eq!(r.read_string().unwrap(), "UNLOGGED_BATCH");
        assert_eq!(r.remaining(), 0);

        // A logged batch whose log write timed out: the spec's BATCH_LOG.
        let error = DbError::WriteTimeout {
            consistency: Consistency::Quorum,
            received: 0,
            block_for: 2,
            write_type: WriteType::BatchLog,
        };
        let body = error_body(&ErrorResponse::new(error, "w"));
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0x1100);
        r.read_string().unwrap();
        assert_eq!(r.read_consistency().unwrap(), Consistency::Quorum);
        assert_eq!((r.read_int().unwrap(), r.read_int().unwrap()), (0, 2));
        assert_eq!(r.read_string().unwrap(), "BATCH_LOG");
        assert_eq!(r.remaining(), 0);

        let error = DbError::ReplicaReadFailure {
            consistency: Consistency::All,
            received: 2,
            block_for: 3,
            failures: 1,
            data_present: true,
        };
        let body = error_body(&ErrorResponse::new(error, "r"));
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0x1300);
        r.read_string().unwrap();
        assert_eq!(r.read_consistency().unwrap(), Consistency::All);
        assert_eq!((r.read_int().unwrap(), r.read_int().unwrap()), (2, 3));
        assert_eq!(r.read_int().unwrap(), 1);
        assert_eq!(r.read_u8().unwrap(), 1);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn the_code_follows_the_error_and_the_rate_limit_downgrades() {
        let rl = DbError::RateLimitReached {
            op: OperationType::Read,
            rejected_by_coordinator: true,
        };
        assert_eq!(rl.code(), ErrorCode::RateLimitReached);
        assert_eq!(rl.for_client(true), rl);
        assert_eq!(rl.for_client(false), DbError::ConfigError);
        assert_eq!(DbError::Invalid.for_client(false), DbError::Invalid);
        assert_eq!(DbError::unprepared(&[1; 20]).code(), ErrorCode::Unprepared);
    }

    #[test]
    fn rows_writer_fills_in_place_and_compresses() {
        let meta = RowsMetadata {
            columns: vec![col("ks", "t", "v", CqlType::Native(NativeType::Text))].into(),
            column_count: 1,
            paging_state: None,
            no_metadata: false,
        };
        for c in [Compression::None, Compression::Lz4, Compression::Snappy] {
            let mut buf = BytesMut::new();
            let mut w = begin_rows(&mut buf, 6, &meta);
            for _ in 0..100 {
                put_bytes(&mut buf, Some(b"some repeated text value"));
                w.row_done();
            }
            assert_eq!(w.rows(), 100);
            w.finish(&mut buf, c);
            let compressed = buf[1] & 0x01 != 0;
            assert_eq!(compressed, c != Compression::None);
            let (_, _, body) = split(buf);
            let body = if compressed {
                Bytes::from(c.decompress(&body, 1 << 20).unwrap())
            } else {
                body
            };
            let mut r = Reader::new(&body);
            assert_eq!(r.read_int().unwrap(), RESULT_ROWS);
            r.read_int().unwrap();
            r.read_int().unwrap();
            for s in ["ks", "t", "v"] {
                assert_eq!(r.read_string().unwrap(), s);
            }
            r.read_short().unwrap();
            assert_eq!(r.read_int().unwrap(), 100);
            for _ in 0..100 {
                assert_eq!(
                    &r.read_bytes().unwrap().unwrap()[..],
                    b"some repeated text value"
                );
            }
            assert_eq!(r.remaining(), 0);
        }
    }
}
