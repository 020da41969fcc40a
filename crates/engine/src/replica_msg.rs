//! The bodies of the coordinator's messages to replicas: storage mutations, read requests
//! and raw partitions, in a compact big-endian form. Every decoder bounds what it allocates
//! by the bytes present and answers a malformed body with an error, never a panic.

use bytes::{BufMut, Bytes, BytesMut};
use sluice_protocol::{Consistency, DbError, DetailedError, OperationType, Value, WriteType};
use sluice_storage::{
    CellValue, CellWrite, ClusteringSlice, Liveness, Mutation, PartitionRead, RangeDeletion,
    RawPartition, ReadCell, ReadRow, RowMutation, ScanPage, ScanStart, ScannedPartition,
};
use std::ops::Bound;

/// The version byte every body starts with.
const VERSION: u8 = 1;

/// Why a body could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MalformedBody(pub &'static str);

type R<T> = Result<T, MalformedBody>;

/// What a read request asks a replica for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadKind {
    /// The digest of the partition's raw stored entries.
    Digest,
    /// The raw stored entries themselves.
    Data,
}

/// A request for one partition of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    /// Digest or data.
    pub kind: ReadKind,
    /// The table's id.
    pub table: [u8; 16],
    /// The partition's token.
    pub token: i64,
    /// The serialized partition key.
    pub partition_key: Bytes,
}

/// A raw partition sent to a replica to merge (read repair).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairRequest {
    /// The table's id.
    pub table: [u8; 16],
    /// The partition's token.
    pub token: i64,
    /// The serialized partition key.
    pub partition_key: Bytes,
    /// What to merge.
    pub raw: RawPartition,
}

/// The digest of a raw partition: equal digests mean equal stored entries.
pub fn digest(raw: &RawPartition) -> [u8; 16] {
    use md5::{Digest, Md5};
    let mut h = Md5::new();
    match &raw.header {
        Some(header) => {
            h.update([1u8]);
            h.update((header.len() as u64).to_be_bytes());
            h.update(header);
        }
        None => h.update([0u8]),
    }
    for row in &raw.rows {
        h.update((row.len() as u64).to_be_bytes());
        h.update(row);
    }
    h.finalize().into()
}

/// Encodes the mutations of one MUTATION message, with the coordinator's rate-limit window
/// (`sluice_overload::window_of`), in which replicas count the admitted writes of
/// rate-limited tables.
pub fn encode_mutations(mutations: &[&Mutation], rate_window: u32) -> Bytes {
    let mut out = BytesMut::with_capacity(64 * mutations.len().max(1));
    out.put_u8(VERSION);
    out.put_u32(rate_window);
    out.put_u32(mutations.len() as u32);
    for m in mutations {
        out.put_slice(&m.table);
        out.put_i64(m.token);
        put_bytes(&mut out, &m.partition_key);
        put_opt_i64(&mut out, m.partition_deletion);
        out.put_u32(m.range_deletions.len() as u32);
        for rd in &m.range_deletions {
            put_bound(&mut out, &rd.start);
            put_bound(&mut out, &rd.end);
            out.put_i64(rd.timestamp);
        }
        put_option(&mut out, m.static_row.as_ref(), put_row);
        out.put_u32(m.rows.len() as u32);
        for row in &m.rows {
            put_row(&mut out, row);
        }
    }
    out.freeze()
}

/// Decodes a MUTATION message: the coordinator's rate-limit window and the mutations.
pub fn decode_mutations(body: &Bytes) -> R<(u32, Vec<Mutation>)> {
    let mut r = Reader::new(body);
    r.version()?;
    let rate_window = r.u32()?;
    let n = r.count(29)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let table = r.array16()?;
        let token = r.i64()?;
        let partition_key = r.bytes()?;
        let partition_deletion = r.opt_i64()?;
        let range_deletions = r.list(10, |r| {
            Ok(RangeDeletion {
                start: r.bound()?,
                end: r.bound()?,
                timestamp: r.i64()?,
            })
        })?;
        let static_row = r.option("bad static row flag", Reader::row)?;
        let rows = r.list(13, Reader::row)?;
        out.push(Mutation {
            table,
            token,
            partition_key,
            partition_deletion,
            range_deletions,
            static_row,
            rows,
        });
    }
    r.finish()?;
    Ok((rate_window, out))
}

/// Encodes a read request.
pub fn encode_read(req: &ReadRequest) -> Bytes {
    let mut out = BytesMut::with_capacity(32 + req.partition_key.len());
    out.put_u8(VERSION);
    out.put_u8(match req.kind {
        ReadKind::Digest => 0,
        ReadKind::Data => 1,
    });
    out.put_slice(&req.table);
    out.put_i64(req.token);
    put_bytes(&mut out, &req.partition_key);
    out.freeze()
}

/// Decodes a read request.
pub fn decode_read(body: &Bytes) -> R<ReadRequest> {
    let mut r = Reader::new(body);
    r.version()?;
    let kind = match r.u8()? {
        0 => ReadKind::Digest,
        1 => ReadKind::Data,
        _ => return Err(MalformedBody("bad read kind")),
    };
    let table = r.array16()?;
    let token = r.i64()?;
    let partition_key = r.bytes()?;
    r.finish()?;
    Ok(ReadRequest {
        kind,
        table,
        token,
        partition_key,
    })
}

/// Encodes a TRUNCATE of one table.
pub fn encode_truncate(table: [u8; 16]) -> Bytes {
    let mut out = BytesMut::with_capacity(17);
    out.put_u8(VERSION);
    out.put_slice(&table);
    out.freeze()
}

/// Decodes a TRUNCATE: the table's id.
pub fn decode_truncate(body: &Bytes) -> R<[u8; 16]> {
    let mut r = Reader::new(body);
    r.version()?;
    let table = r.array16()?;
    r.finish()?;
    Ok(table)
}

/// Encodes a raw partition (a data reply).
pub fn encode_raw(raw: &RawPartition) -> Bytes {
    let mut out = BytesMut::with_capacity(8 + raw.byte_len() + 4 * raw.rows.len());
    put_raw(&mut out, raw);
    out.freeze()
}

/// Decodes a raw partition (a data reply).
pub fn decode_raw(body: &Bytes) -> R<RawPartition> {
    let mut r = Reader::new(body);
    let raw = r.raw()?;
    r.finish()?;
    Ok(raw)
}

/// Encodes a repair request.
pub fn encode_repair(req: &RepairRequest) -> Bytes {
    let mut out = BytesMut::with_capacity(40 + req.partition_key.len() + req.raw.byte_len());
    out.put_u8(VERSION);
    out.put_slice(&req.table);
    out.put_i64(req.token);
    put_bytes(&mut out, &req.partition_key);
    put_raw(&mut out, &req.raw);
    out.freeze()
}

/// Decodes a repair request.
pub fn decode_repair(body: &Bytes) -> R<RepairRequest> {
    let mut r = Reader::new(body);
    r.version()?;
    let table = r.array16()?;
    let token = r.i64()?;
    let partition_key = r.bytes()?;
    let raw = r.raw()?;
    r.finish()?;
    Ok(RepairRequest {
        table,
        token,
        partition_key,
        raw,
    })
}

/// A statement a coordinator that is not a replica of its partitions hands to one that is,
/// which runs it as the coordinator (its values already in marker order): a single-partition
/// SELECT, an LWT, a SERIAL read or a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedStatement {
    /// The keyspace the statement was prepared in.
    pub keyspace: Option<String>,
    /// The statement's text.
    pub query: String,
    /// The request's consistency level.
    pub consistency: Consistency,
    /// The request's serial consistency level (for an LWT).
    pub serial_consistency: Option<Consistency>,
    /// The client's default timestamp.
    pub default_timestamp: Option<i64>,
    /// The coordinator's "now" (TTL expiry is judged at the same instant).
    pub now_micros: i64,
    /// The client's page size.
    pub page_size: Option<i32>,
    /// The client's paging state.
    pub paging_state: Option<Bytes>,
    /// Whether the client skips the result metadata.
    pub skip_metadata: bool,
    /// Bound values, positional.
    pub values: Vec<Value>,
}

/// What a forwarded statement answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardedResult {
    /// Rows (a SELECT's, an LWT's `[applied]` rows, a transaction's returning SELECT).
    Rows(ForwardedRows),
    /// Nothing (a transaction without a returning SELECT).
    Void,
}

/// The rows a forwarded statement answered (the coordinator adds its own column metadata).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedRows {
    /// Rows in `body`.
    pub row_count: u32,
    /// Cells per row.
    pub column_count: u32,
    /// Where the next page starts.
    pub paging_state: Option<Bytes>,
    /// The encoded rows.
    pub body: Bytes,
}

/// A scan of one token range of a table on a replica: storage's scan, run there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanRequest {
    /// The table's id.
    pub table: [u8; 16],
    /// Where the scan starts.
    pub start: ScanStart,
    /// The last token (bound) of the range.
    pub end: Bound<i64>,
    /// Most rows in the answer.
    pub row_limit: u32,
    /// "Now" in seconds, for TTL expiry.
    pub now_secs: u32,
    /// The scan's level: ONE reads the replica's own storage; a level that needs more than
    /// one replica has the replica reconcile the page with others as the scan's coordinator.
    pub consistency: Consistency,
}

/// A slice of one partition for a coordinator that holds no copy of it (a partition of a
/// multi-partition IN): the replica makes its copy consistent at `consistency`, then reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceRequest {
    /// The table's id.
    pub table: [u8; 16],
    /// The partition's token.
    pub token: i64,
    /// The partition key.
    pub partition_key: Bytes,
    /// Which rows, in which order.
    pub slice: ClusteringSlice,
    /// Resume strictly after this clustering key.
    pub after: Option<Vec<Bytes>>,
    /// Most rows in the answer.
    pub row_limit: u32,
    /// "Now" in seconds, for TTL expiry.
    pub now_secs: u32,
    /// The read's level, which the replica reconciles its copy at.
    pub consistency: Consistency,
}

fn put_opt_bytes(out: &mut BytesMut, b: Option<&[u8]>) {
    put_option(out, b, put_bytes);
}

/// Encodes a forwarded SELECT.
pub fn encode_forwarded_statement(req: &ForwardedStatement) -> Bytes {
    let mut out = BytesMut::with_capacity(64 + req.query.len());
    out.put_u8(VERSION);
    put_opt_bytes(&mut out, req.keyspace.as_deref().map(str::as_bytes));
    put_bytes(&mut out, req.query.as_bytes());
    out.put_u16(req.consistency as u16);
    match req.serial_consistency {
        Some(c) => {
            out.put_u8(1);
            out.put_u16(c as u16);
        }
        None => out.put_u8(0),
    }
    match req.default_timestamp {
        Some(ts) => {
            out.put_u8(1);
            out.put_i64(ts);
        }
        None => out.put_u8(0),
    }
    out.put_i64(req.now_micros);
    put_option(&mut out, req.page_size, BytesMut::put_i32);
    put_opt_bytes(&mut out, req.paging_state.as_deref());
    out.put_u8(u8::from(req.skip_metadata));
    out.put_u32(req.values.len() as u32);
    for v in &req.values {
        match v {
            Value::Set(b) => {
                out.put_u8(0);
                put_bytes(&mut out, b);
            }
            Value::Null => out.put_u8(1),
            Value::Unset => out.put_u8(2),
        }
    }
    out.freeze()
}

/// Decodes a forwarded SELECT.
pub fn decode_forwarded_statement(body: &Bytes) -> R<ForwardedStatement> {
    let mut r = Reader::new(body);
    r.version()?;
    let keyspace = r.opt_bytes()?.map(utf8).transpose()?;
    let query = utf8(r.bytes()?)?;
    let consistency = Consistency::from_code(r.u16()?).ok_or(MalformedBody("bad consistency"))?;
    let serial_consistency = match r.u8()? {
        0 => None,
        1 => Some(Consistency::from_code(r.u16()?).ok_or(MalformedBody("bad consistency"))?),
        _ => return Err(MalformedBody("bad option flag")),
    };
    let default_timestamp = match r.u8()? {
        0 => None,
        1 => Some(r.i64()?),
        _ => return Err(MalformedBody("bad option flag")),
    };
    let now_micros = r.i64()?;
    let page_size = r.option("bad option flag", |r| Ok(r.u32()? as i32))?;
    let paging_state = r.opt_bytes()?;
    let skip_metadata = r.bool()?;
    let values = r.list(1, |r| match r.u8()? {
        0 => Ok(Value::Set(r.bytes()?)),
        1 => Ok(Value::Null),
        2 => Ok(Value::Unset),
        _ => Err(MalformedBody("bad value kind")),
    })?;
    r.finish()?;
    Ok(ForwardedStatement {
        keyspace,
        query,
        consistency,
        serial_consistency,
        default_timestamp,
        now_micros,
        page_size,
        paging_state,
        skip_metadata,
        values,
    })
}

fn utf8(b: Bytes) -> R<String> {
    String::from_utf8(b.to_vec()).map_err(|_| MalformedBody("not UTF-8"))
}

/// Encodes the answer to a forwarded statement: its rows, Void, or its error.
pub fn encode_forwarded_answer(answer: &Result<ForwardedResult, DetailedError>) -> Bytes {
    let mut out = BytesMut::with_capacity(match answer {
        Ok(ForwardedResult::Rows(rows)) => 32 + rows.body.len(),
        Ok(ForwardedResult::Void) => 2,
        Err(e) => 64 + e.message.len(),
    });
    out.put_u8(VERSION);
    match answer {
        Ok(ForwardedResult::Rows(rows)) => {
            out.put_u8(0);
            out.put_u32(rows.row_count);
            out.put_u32(rows.column_count);
            put_opt_bytes(&mut out, rows.paging_state.as_deref());
            put_bytes(&mut out, &rows.body);
        }
        Ok(ForwardedResult::Void) => out.put_u8(2),
        Err(e) => {
            out.put_u8(1);
            put_error(&mut out, &e.error);
            put_bytes(&mut out, e.message.as_bytes());
        }
    }
    out.freeze()
}

/// Decodes the answer to a forwarded statement.
pub fn decode_forwarded_answer(body: &Bytes) -> R<Result<ForwardedResult, DetailedError>> {
    let mut r = Reader::new(body);
    r.version()?;
    let answer = match r.u8()? {
        0 => Ok(ForwardedResult::Rows(ForwardedRows {
            row_count: r.u32()?,
            column_count: r.u32()?,
            paging_state: r.opt_bytes()?,
            body: r.bytes()?,
        })),
        2 => Ok(ForwardedResult::Void),
        1 => {
            let error = r.error()?;
            let message = utf8(r.bytes()?)?;
            Err(DetailedError::new(error, message))
        }
        _ => return Err(MalformedBody("bad answer kind")),
    };
    r.finish()?;
    Ok(answer)
}

/// The errors a forwarded statement answers, with their fields; any other is sent as a
/// Server_error.
fn put_error(out: &mut BytesMut, e: &DbError) {
    match *e {
        DbError::Unavailable {
            consistency,
            required,
            alive,
        } => {
            out.put_u8(1);
            out.put_u16(consistency as u16);
            out.put_i32(required);
            out.put_i32(alive);
        }
        DbError::ReadTimeout {
            consistency,
            received,
            block_for,
            data_present,
        } => {
            out.put_u8(2);
            out.put_u16(consistency as u16);
            out.put_i32(received);
            out.put_i32(block_for);
            out.put_u8(u8::from(data_present));
        }
        DbError::ReplicaReadFailure {
            consistency,
            received,
            block_for,
            failures,
            data_present,
        } => {
            out.put_u8(3);
            out.put_u16(consistency as u16);
            out.put_i32(received);
            out.put_i32(block_for);
            out.put_i32(failures);
            out.put_u8(u8::from(data_present));
        }
        DbError::WriteTimeout {
            consistency,
            received,
            block_for,
            write_type,
        } => {
            out.put_u8(4);
            out.put_u16(consistency as u16);
            out.put_i32(received);
            out.put_i32(block_for);
            out.put_u8(write_type_code(write_type));
        }
        DbError::RateLimitReached {
            op,
            rejected_by_coordinator,
        } => {
            out.put_u8(5);
            out.put_u8(u8::from(op == OperationType::Write));
            out.put_u8(u8::from(rejected_by_coordinator));
        }
        DbError::ReplicaWriteFailure {
            consistency,
            received,
            block_for,
            failures,
            write_type,
        } => {
            out.put_u8(6);
            out.put_u16(consistency as u16);
            out.put_i32(received);
            out.put_i32(block_for);
            out.put_i32(failures);
            out.put_u8(write_type_code(write_type));
        }
        DbError::Overloaded => out.put_u8(10),
        DbError::ReadFailure => out.put_u8(11),
        DbError::Invalid => out.put_u8(12),
        DbError::SyntaxError => out.put_u8(13),
        DbError::Unauthorized => out.put_u8(14),
        DbError::IsBootstrapping => out.put_u8(15),
        DbError::FunctionFailure => out.put_u8(16),
        DbError::ConfigError => out.put_u8(17),
        DbError::WriteFailure => out.put_u8(18),
        _ => out.put_u8(0),
    }
}

fn write_type_code(w: WriteType) -> u8 {
    match w {
        WriteType::Simple => 0,
        WriteType::Batch => 1,
        WriteType::UnloggedBatch => 2,
        WriteType::Counter => 3,
        WriteType::Cas => 4,
        WriteType::BatchLog => 5,
    }
}

/// Encodes a scan request.
pub fn encode_scan(req: &ScanRequest) -> Bytes {
    let mut out = BytesMut::with_capacity(64);
    out.put_u8(VERSION);
    out.put_slice(&req.table);
    put_scan_start(&mut out, &req.start);
    put_token_bound(&mut out, req.end);
    out.put_u32(req.row_limit);
    out.put_u32(req.now_secs);
    out.put_u16(req.consistency as u16);
    out.freeze()
}

/// Decodes a scan request.
pub fn decode_scan(body: &Bytes) -> R<ScanRequest> {
    let mut r = Reader::new(body);
    r.version()?;
    let req = ScanRequest {
        table: r.array16()?,
        start: r.scan_start()?,
        end: r.token_bound()?,
        row_limit: r.u32()?,
        now_secs: r.u32()?,
        consistency: Consistency::from_code(r.u16()?).ok_or(MalformedBody("bad consistency"))?,
    };
    r.finish()?;
    Ok(req)
}

/// Encodes a partition slice request.
pub fn encode_slice(req: &SliceRequest) -> Bytes {
    let mut out = BytesMut::with_capacity(64 + req.partition_key.len());
    out.put_u8(VERSION);
    out.put_slice(&req.table);
    out.put_i64(req.token);
    put_bytes(&mut out, &req.partition_key);
    out.put_u32(req.slice.ranges.len() as u32);
    for (lo, hi) in &req.slice.ranges {
        put_bound(&mut out, lo);
        put_bound(&mut out, hi);
    }
    out.put_u8(u8::from(req.slice.reversed));
    put_option(&mut out, req.after.as_deref(), put_values);
    out.put_u32(req.row_limit);
    out.put_u32(req.now_secs);
    out.put_u16(req.consistency as u16);
    out.freeze()
}

/// Decodes a partition slice request.
pub fn decode_slice(body: &Bytes) -> R<SliceRequest> {
    let mut r = Reader::new(body);
    r.version()?;
    let table = r.array16()?;
    let token = r.i64()?;
    let partition_key = r.bytes()?;
    let ranges = r.list(2, |r| Ok((r.bound()?, r.bound()?)))?;
    let reversed = r.bool()?;
    let req = SliceRequest {
        table,
        token,
        partition_key,
        slice: ClusteringSlice { ranges, reversed },
        after: r.option("bad option flag", Reader::values)?,
        row_limit: r.u32()?,
        now_secs: r.u32()?,
        consistency: r.consistency()?,
    };
    r.finish()?;
    Ok(req)
}

/// Encodes a partition slice (a slice request's answer).
pub fn encode_partition_read(read: &PartitionRead) -> Bytes {
    let mut out = BytesMut::with_capacity(256);
    out.put_u8(VERSION);
    put_option(&mut out, read.static_row.as_ref(), put_read_row);
    out.put_u32(read.rows.len() as u32);
    for row in &read.rows {
        put_read_row(&mut out, row);
    }
    out.put_u8(u8::from(read.more));
    out.freeze()
}

/// Decodes a partition slice.
pub fn decode_partition_read(body: &Bytes) -> R<PartitionRead> {
    let mut r = Reader::new(body);
    r.version()?;
    let read = PartitionRead {
        static_row: r.option("bad static flag", Reader::read_row)?,
        rows: r.list(7, Reader::read_row)?,
        more: r.bool()?,
    };
    r.finish()?;
    Ok(read)
}

/// Encodes a scan page (a scan's answer).
pub fn encode_scan_page(page: &ScanPage) -> Bytes {
    let mut out = BytesMut::with_capacity(256);
    out.put_u8(VERSION);
    out.put_u32(page.partitions.len() as u32);
    for p in &page.partitions {
        out.put_i64(p.token);
        put_bytes(&mut out, &p.partition_key);
        put_option(&mut out, p.read.static_row.as_ref(), put_read_row);
        out.put_u32(p.read.rows.len() as u32);
        for row in &p.read.rows {
            put_read_row(&mut out, row);
        }
        out.put_u8(u8::from(p.read.more));
    }
    put_option(&mut out, page.next.as_ref(), put_scan_start);
    out.freeze()
}

/// Decodes a scan page.
pub fn decode_scan_page(body: &Bytes) -> R<ScanPage> {
    let mut r = Reader::new(body);
    r.version()?;
    let n = r.count(18)?;
    let mut partitions = Vec::with_capacity(n);
    for _ in 0..n {
        let token = r.i64()?;
        let partition_key = r.bytes()?;
        let static_row = r.option("bad static flag", Reader::read_row)?;
        let rows = r.list(7, Reader::read_row)?;
        let more = r.bool()?;
        partitions.push(ScannedPartition {
            token,
            partition_key,
            read: PartitionRead {
                static_row,
                rows,
                more,
            },
        });
    }
    let next = r.option("bad option flag", Reader::scan_start)?;
    r.finish()?;
    Ok(ScanPage { partitions, next })
}

fn put_token_bound(out: &mut BytesMut, b: Bound<i64>) {
    match b {
        Bound::Unbounded => out.put_u8(0),
        Bound::Included(t) => {
            out.put_u8(1);
            out.put_i64(t);
        }
        Bound::Excluded(t) => {
            out.put_u8(2);
            out.put_i64(t);
        }
    }
}

fn put_scan_start(out: &mut BytesMut, s: &ScanStart) {
    match s {
        ScanStart::Token(b) => {
            out.put_u8(0);
            put_token_bound(out, *b);
        }
        ScanStart::Resume {
            token,
            partition_key,
            after,
        } => {
            out.put_u8(1);
            out.put_i64(*token);
            put_bytes(out, partition_key);
            put_option(out, after.as_deref(), put_values);
        }
    }
}

fn put_read_row(out: &mut BytesMut, row: &ReadRow) {
    put_values(out, &row.clustering);
    out.put_u32(row.cells.len() as u32);
    for c in &row.cells {
        out.put_u16(c.column);
        put_opt_bytes(out, c.path.as_deref());
        put_bytes(out, &c.value);
        out.put_i64(c.timestamp);
        put_expiry(out, c.expiry);
    }
    out.put_u8(u8::from(row.has_liveness));
}

fn put_raw(out: &mut BytesMut, raw: &RawPartition) {
    put_opt_bytes(out, raw.header.as_deref());
    out.put_u32(raw.rows.len() as u32);
    for row in &raw.rows {
        put_bytes(out, row);
    }
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u32(b.len() as u32);
    out.put_slice(b);
}

/// Writes a presence flag (1 or 0) and, when `v` is there, what `put` writes of it.
fn put_option<T>(out: &mut BytesMut, v: Option<T>, put: impl FnOnce(&mut BytesMut, T)) {
    match v {
        Some(v) => {
            out.put_u8(1);
            put(out, v);
        }
        None => out.put_u8(0),
    }
}

/// Writes a u16 count and the values (clustering values, bound prefixes).
fn put_values(out: &mut BytesMut, values: &[Bytes]) {
    out.put_u16(values.len() as u16);
    for v in values {
        put_bytes(out, v);
    }
}

fn put_opt_i64(out: &mut BytesMut, v: Option<i64>) {
    put_option(out, v, BytesMut::put_i64);
}

fn put_expiry(out: &mut BytesMut, e: Option<(u32, u32)>) {
    put_option(out, e, |out, (at, ttl)| {
        out.put_u32(at);
        out.put_u32(ttl);
    });
}

fn put_bound(out: &mut BytesMut, b: &Bound<Vec<Bytes>>) {
    let (kind, values) = match b {
        Bound::Unbounded => (0u8, None),
        Bound::Included(v) => (1, Some(v)),
        Bound::Excluded(v) => (2, Some(v)),
    };
    out.put_u8(kind);
    if let Some(values) = values {
        put_values(out, values);
    }
}

fn put_row(out: &mut BytesMut, row: &RowMutation) {
    put_values(out, &row.clustering);
    put_option(out, row.liveness, |out, l| {
        out.put_i64(l.timestamp);
        put_expiry(out, l.expiry);
    });
    put_opt_i64(out, row.deletion);
    out.put_u32(row.collection_deletions.len() as u32);
    for (col, ts) in &row.collection_deletions {
        out.put_u16(*col);
        out.put_i64(*ts);
    }
    out.put_u32(row.cells.len() as u32);
    for c in &row.cells {
        out.put_u16(c.column);
        put_opt_bytes(out, c.path.as_deref());
        match &c.value {
            CellValue::Live(v) => {
                out.put_u8(0);
                put_bytes(out, v);
            }
            CellValue::Tombstone => out.put_u8(1),
            CellValue::CounterDelta(d) => {
                out.put_u8(2);
                out.put_i64(*d);
            }
        }
        out.put_i64(c.timestamp);
        put_expiry(out, c.expiry);
    }
}

/// A bounds-checked reader; values are zero-copy slices of the body.
struct Reader<'a> {
    body: &'a Bytes,
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(body: &'a Bytes) -> Reader<'a> {
        Reader { body, at: 0 }
    }

    fn remaining(&self) -> usize {
        self.body.len() - self.at
    }

    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        let body: &'a [u8] = self.body;
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= body.len())
            .ok_or(MalformedBody("body too short"))?;
        let s = &body[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn version(&mut self) -> R<()> {
        match self.u8()? {
            VERSION => Ok(()),
            _ => Err(MalformedBody("unknown body version")),
        }
    }

    fn finish(&self) -> R<()> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(MalformedBody("trailing bytes"))
        }
    }

    fn u8(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> R<u16> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> R<u32> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(a))
    }

    fn i64(&mut self) -> R<i64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(i64::from_be_bytes(a))
    }

    fn array16(&mut self) -> R<[u8; 16]> {
        let mut a = [0u8; 16];
        a.copy_from_slice(self.take(16)?);
        Ok(a)
    }

    /// A count of items each at least `min_size` bytes long: more than the body can hold
    /// is malformed, so a count never makes the decoder allocate beyond the body's size.
    fn count(&mut self, min_size: usize) -> R<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_size) > self.remaining() {
            return Err(MalformedBody("count exceeds the body"));
        }
        Ok(n)
    }

    fn bytes(&mut self) -> R<Bytes> {
        let n = self.u32()? as usize;
        let start = self.at;
        self.take(n)?;
        Ok(self.body.slice(start..start + n))
    }

    /// A presence flag and, when it is 1, what `read` reads; any other flag is `bad_flag`.
    fn option<T>(
        &mut self,
        bad_flag: &'static str,
        read: impl FnOnce(&mut Self) -> R<T>,
    ) -> R<Option<T>> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(read(self)?)),
            _ => Err(MalformedBody(bad_flag)),
        }
    }

    /// A u32 count, each item at least `min_size` bytes, and the items `read` reads.
    fn list<T>(&mut self, min_size: usize, mut read: impl FnMut(&mut Self) -> R<T>) -> R<Vec<T>> {
        let n = self.count(min_size)?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(read(self)?);
        }
        Ok(items)
    }

    fn opt_i64(&mut self) -> R<Option<i64>> {
        self.option("bad option flag", Self::i64)
    }

    fn expiry(&mut self) -> R<Option<(u32, u32)>> {
        self.option("bad expiry flag", |r| Ok((r.u32()?, r.u32()?)))
    }

    fn bound(&mut self) -> R<Bound<Vec<Bytes>>> {
        let kind = self.u8()?;
        if kind == 0 {
            return Ok(Bound::Unbounded);
        }
        let values = self.values()?;
        match kind {
            1 => Ok(Bound::Included(values)),
            2 => Ok(Bound::Excluded(values)),
            _ => Err(MalformedBody("bad bound kind")),
        }
    }

    fn row(&mut self) -> R<RowMutation> {
        let clustering = self.values()?;
        let liveness = self.option("bad liveness flag", |r| {
            Ok(Liveness {
                timestamp: r.i64()?,
                expiry: r.expiry()?,
            })
        })?;
        let deletion = self.opt_i64()?;
        let collection_deletions = self.list(10, |r| Ok((r.u16()?, r.i64()?)))?;
        let cells = self.list(13, |r| {
            let column = r.u16()?;
            let path = r.option("bad path flag", Self::bytes)?;
            let value = match r.u8()? {
                0 => CellValue::Live(r.bytes()?),
                1 => CellValue::Tombstone,
                2 => CellValue::CounterDelta(r.i64()?),
                _ => return Err(MalformedBody("bad cell kind")),
            };
            Ok(CellWrite {
                column,
                path,
                value,
                timestamp: r.i64()?,
                expiry: r.expiry()?,
            })
        })?;
        Ok(RowMutation {
            clustering,
            liveness,
            deletion,
            collection_deletions,
            cells,
        })
    }

    fn bool(&mut self) -> R<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(MalformedBody("bad flag")),
        }
    }

    fn opt_bytes(&mut self) -> R<Option<Bytes>> {
        self.option("bad option flag", Self::bytes)
    }

    fn values(&mut self) -> R<Vec<Bytes>> {
        let n = usize::from(self.u16()?);
        if n.saturating_mul(4) > self.remaining() {
            return Err(MalformedBody("count exceeds the body"));
        }
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            values.push(self.bytes()?);
        }
        Ok(values)
    }

    fn token_bound(&mut self) -> R<Bound<i64>> {
        match self.u8()? {
            0 => Ok(Bound::Unbounded),
            1 => Ok(Bound::Included(self.i64()?)),
            2 => Ok(Bound::Excluded(self.i64()?)),
            _ => Err(MalformedBody("bad bound kind")),
        }
    }

    fn scan_start(&mut self) -> R<ScanStart> {
        match self.u8()? {
            0 => Ok(ScanStart::Token(self.token_bound()?)),
            1 => {
                let token = self.i64()?;
                let partition_key = self.bytes()?;
                let after = self.option("bad option flag", Self::values)?;
                Ok(ScanStart::Resume {
                    token,
                    partition_key,
                    after,
                })
            }
            _ => Err(MalformedBody("bad scan start")),
        }
    }

    fn read_row(&mut self) -> R<ReadRow> {
        let clustering = self.values()?;
        let cells = self.list(16, |r| {
            Ok(ReadCell {
                column: r.u16()?,
                path: r.opt_bytes()?,
                value: r.bytes()?,
                timestamp: r.i64()?,
                expiry: r.expiry()?,
            })
        })?;
        Ok(ReadRow {
            clustering,
            cells,
            has_liveness: self.bool()?,
        })
    }

    fn consistency(&mut self) -> R<Consistency> {
        Consistency::from_code(self.u16()?).ok_or(MalformedBody("bad consistency"))
    }

    fn write_type(&mut self) -> R<WriteType> {
        Ok(match self.u8()? {
            0 => WriteType::Simple,
            1 => WriteType::Batch,
            2 => WriteType::UnloggedBatch,
            3 => WriteType::Counter,
            4 => WriteType::Cas,
            5 => WriteType::BatchLog,
            _ => return Err(MalformedBody("bad write type")),
        })
    }

    fn error(&mut self) -> R<DbError> {
        Ok(match self.u8()? {
            1 => DbError::Unavailable {
                consistency: self.consistency()?,
                required: self.u32()? as i32,
                alive: self.u32()? as i32,
            },
            2 => DbError::ReadTimeout {
                consistency: self.consistency()?,
                received: self.u32()? as i32,
                block_for: self.u32()? as i32,
                data_present: self.bool()?,
            },
            3 => DbError::ReplicaReadFailure {
                consistency: self.consistency()?,
                received: self.u32()? as i32,
                block_for: self.u32()? as i32,
                failures: self.u32()? as i32,
                data_present: self.bool()?,
            },
            4 => DbError::WriteTimeout {
                consistency: self.consistency()?,
                received: self.u32()? as i32,
                block_for: self.u32()? as i32,
                write_type: self.write_type()?,
            },
            6 => DbError::ReplicaWriteFailure {
                consistency: self.consistency()?,
                received: self.u32()? as i32,
                block_for: self.u32()? as i32,
                failures: self.u32()? as i32,
                write_type: self.write_type()?,
            },
            5 => DbError::RateLimitReached {
                op: if self.bool()? {
                    OperationType::Write
                } else {
                    OperationType::Read
                },
                rejected_by_coordinator: self.bool()?,
            },
            10 => DbError::Overloaded,
            11 => DbError::ReadFailure,
            12 => DbError::Invalid,
            13 => DbError::SyntaxError,
            14 => DbError::Unauthorized,
            15 => DbError::IsBootstrapping,
            16 => DbError::FunctionFailure,
            17 => DbError::ConfigError,
            18 => DbError::WriteFailure,
            0 => DbError::ServerError,
            _ => return Err(MalformedBody("bad error kind")),
        })
    }

    fn raw(&mut self) -> R<RawPartition> {
        let header = self.option("bad header flag", Self::bytes)?;
        let rows = self.list(4, Self::bytes)?;
        Ok(RawPartition { header, rows })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Mutation {
        Mutation {
            table: [7; 16],
            token: -42,
            partition_key: Bytes::from_static(b"pk"),
            partition_deletion: Some(5),
            range_deletions: vec![RangeDeletion {
                start: Bound::Included(vec![Bytes::from_static(b"a")]),
                end: Bound::Unbounded,
                timestamp: 9,
            }],
            static_row: Some(RowMutation {
                cells: vec![CellWrite {
                    column: 3,
                    path: None,
                    value: CellValue::Live(Bytes::from_static(b"s")),
                    timestamp: 11,
                    expiry: Some((100, 10)),
                }],
                ..RowMutation::default()
            }),
            rows: vec![RowMutation {
                clustering: vec![Bytes::from_static(b"c1"), Bytes::new()],
                liveness: Some(Liveness {
                    timestamp: 12,
                    expiry: None,
                }),
                deletion: Some(3),
                collection_deletions: vec![(4, 8)],
                cells: vec![
                    CellWrite {
                        column: 4,
                        path: Some(Bytes::from_static(b"k")),
                        value: CellValue::Tombstone,
                        timestamp: 12,
                        expiry: None,
                    },
                    CellWrite {
                        column: 5,
                        path: None,
                        value: CellValue::CounterDelta(-3),
                        timestamp: 12,
                        expiry: None,
                    },
                ],
            }],
        }
    }

    #[test]
    fn mutations_round_trip_and_every_truncation_is_refused() {
        let m = sample();
        let body = encode_mutations(&[&m, &m], 1_800_000_000);
        assert_eq!(
            decode_mutations(&body).unwrap(),
            (1_800_000_000, vec![m.clone(), m])
        );
        for cut in 0..body.len() {
            assert!(
                decode_mutations(&body.slice(..cut)).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = BytesMut::from(&body[..]);
        longer.put_u8(0);
        assert!(decode_mutations(&longer.freeze()).is_err());
    }

    #[test]
    fn reads_repairs_and_raw_partitions_round_trip() {
        let req = ReadRequest {
            kind: ReadKind::Data,
            table: [1; 16],
            token: i64::MIN,
            partition_key: Bytes::from_static(b"key"),
        };
        assert_eq!(decode_read(&encode_read(&req)).unwrap(), req);
        let raw = RawPartition {
            header: Some(Bytes::from_static(b"h")),
            rows: vec![Bytes::from_static(b"r1"), Bytes::from_static(b"r2")],
        };
        assert_eq!(decode_raw(&encode_raw(&raw)).unwrap(), raw);
        let repair = RepairRequest {
            table: [2; 16],
            token: 1,
            partition_key: Bytes::from_static(b"k"),
            raw: raw.clone(),
        };
        let body = encode_repair(&repair);
        assert_eq!(decode_repair(&body).unwrap(), repair);
        for cut in 0..body.len() {
            assert!(decode_repair(&body.slice(..cut)).is_err(), "cut at {cut}");
        }
        // The digest sees every entry and where one ends.
        let other = RawPartition {
            header: Some(Bytes::from_static(b"h")),
            rows: vec![Bytes::from_static(b"r1r"), Bytes::from_static(b"2")],
        };
        assert_ne!(digest(&raw), digest(&other));
        assert_eq!(digest(&raw), digest(&raw.clone()));
    }

    #[test]
    fn forwarded_statements_and_answers_round_trip() {
        let req = ForwardedStatement {
            keyspace: Some("ks".into()),
            query: "SELECT v FROM t WHERE pk = ?".into(),
            consistency: Consistency::LocalQuorum,
            serial_consistency: Some(Consistency::LocalSerial),
            default_timestamp: Some(1_700_000_000_000_001),
            now_micros: 1_700_000_000_000_000,
            page_size: Some(2),
            paging_state: Some(Bytes::from_static(b"state")),
            skip_metadata: true,
            values: vec![
                Value::Set(Bytes::from_static(b"\0\0\0\x01")),
                Value::Null,
                Value::Unset,
            ],
        };
        let body = encode_forwarded_statement(&req);
        assert_eq!(decode_forwarded_statement(&body).unwrap(), req);
        for cut in 0..body.len() {
            assert!(
                decode_forwarded_statement(&body.slice(..cut)).is_err(),
                "cut at {cut}"
            );
        }
        let rows = ForwardedRows {
            row_count: 2,
            column_count: 1,
            paging_state: None,
            body: Bytes::from_static(b"\0\0\0\x01a\0\0\0\x01b"),
        };
        let answer = encode_forwarded_answer(&Ok(ForwardedResult::Rows(rows.clone())));
        assert_eq!(
            decode_forwarded_answer(&answer).unwrap(),
            Ok(ForwardedResult::Rows(rows))
        );
        let void = encode_forwarded_answer(&Ok(ForwardedResult::Void));
        assert_eq!(
            decode_forwarded_answer(&void).unwrap(),
            Ok(ForwardedResult::Void)
        );
        for cut in 0..void.len() {
            assert!(decode_forwarded_answer(&void.slice(..cut)).is_err());
        }
        // Errors keep the fields drivers parse.
        for error in [
            DbError::Unavailable {
                consistency: Consistency::Quorum,
                required: 2,
                alive: 1,
            },
            DbError::ReadTimeout {
                consistency: Consistency::All,
                received: 1,
                block_for: 3,
                data_present: true,
            },
            DbError::ReplicaReadFailure {
                consistency: Consistency::Two,
                received: 0,
                block_for: 2,
                failures: 2,
                data_present: false,
            },
            DbError::RateLimitReached {
                op: OperationType::Read,
                rejected_by_coordinator: true,
            },
            DbError::WriteTimeout {
                consistency: Consistency::Serial,
                received: 0,
                block_for: 1,
                write_type: WriteType::Cas,
            },
            DbError::WriteTimeout {
                consistency: Consistency::Quorum,
                received: 0,
                block_for: 2,
                write_type: WriteType::BatchLog,
            },
            DbError::ReplicaWriteFailure {
                consistency: Consistency::Quorum,
                received: 1,
                block_for: 2,
                failures: 1,
                write_type: WriteType::Cas,
            },
            DbError::WriteFailure,
            DbError::Overloaded,
            DbError::Invalid,
        ] {
            let e = DetailedError::new(error, "why");
            let body = encode_forwarded_answer(&Err(e.clone()));
            let back = decode_forwarded_answer(&body).unwrap().unwrap_err();
            assert_eq!((back.error, &*back.message), (e.error, "why"));
            for cut in 0..body.len() {
                assert!(decode_forwarded_answer(&body.slice(..cut)).is_err());
            }
        }
    }

    #[test]
    fn partition_slices_and_their_answers_round_trip() {
        let req = SliceRequest {
            table: [4; 16],
            token: 12,
            partition_key: Bytes::from_static(b"pk"),
            slice: ClusteringSlice {
                ranges: vec![
                    (
                        Bound::Included(vec![Bytes::from_static(b"a")]),
                        Bound::Unbounded,
                    ),
                    (Bound::Unbounded, Bound::Excluded(vec![Bytes::new()])),
                ],
                reversed: true,
            },
            after: Some(vec![Bytes::from_static(b"c")]),
            row_limit: 100,
            now_secs: 1_800_000_000,
            consistency: Consistency::LocalQuorum,
        };
        let body = encode_slice(&req);
        assert_eq!(decode_slice(&body).unwrap(), req);
        for cut in 0..body.len() {
            assert!(decode_slice(&body.slice(..cut)).is_err(), "cut at {cut}");
        }
        let row = |ck: &'static [u8]| ReadRow {
            clustering: vec![Bytes::from_static(ck)],
            cells: vec![ReadCell {
                column: 1,
                path: None,
                value: Bytes::from_static(b"v"),
                timestamp: 7,
                expiry: Some((9, 2)),
            }],
            has_liveness: true,
        };
        let read = PartitionRead {
            static_row: Some(row(b"")),
            rows: vec![row(b"a"), row(b"b")],
            more: true,
        };
        let body = encode_partition_read(&read);
        assert_eq!(decode_partition_read(&body).unwrap(), read);
        for cut in 0..body.len() {
            assert!(decode_partition_read(&body.slice(..cut)).is_err());
        }
    }

    #[test]
    fn scans_and_scan_pages_round_trip() {
        let req = ScanRequest {
            table: [3; 16],
            start: ScanStart::Resume {
                token: -7,
                partition_key: Bytes::from_static(b"pk"),
                after: Some(vec![Bytes::from_static(b"c"), Bytes::new()]),
            },
            end: Bound::Included(99),
            row_limit: 1000,
            now_secs: 1_800_000_000,
            consistency: Consistency::Quorum,
        };
        let body = encode_scan(&req);
        assert_eq!(decode_scan(&body).unwrap(), req);
        for cut in 0..body.len() {
            assert!(decode_scan(&body.slice(..cut)).is_err(), "cut at {cut}");
        }
        let row = ReadRow {
            clustering: vec![Bytes::from_static(b"c1")],
            cells: vec![ReadCell {
                column: 2,
                path: Some(Bytes::from_static(b"k")),
                value: Bytes::from_static(b"v"),
                timestamp: 5,
                expiry: Some((10, 3)),
            }],
            has_liveness: true,
        };
        let page = ScanPage {
            partitions: vec![
                ScannedPartition {
                    token: i64::MIN,
                    partition_key: Bytes::from_static(b"a"),
                    read: PartitionRead {
                        static_row: Some(ReadRow {
                            clustering: Vec::new(),
                            cells: Vec::new(),
                            has_liveness: false,
                        }),
                        rows: vec![row.clone(), row],
                        more: true,
                    },
                },
                ScannedPartition {
                    token: 4,
                    partition_key: Bytes::new(),
                    read: PartitionRead {
                        static_row: None,
                        rows: Vec::new(),
                        more: false,
                    },
                },
            ],
            next: Some(ScanStart::Token(Bound::Excluded(4))),
        };
        let body = encode_scan_page(&page);
        assert_eq!(decode_scan_page(&body).unwrap(), page);
        for cut in 0..body.len() {
            assert!(
                decode_scan_page(&body.slice(..cut)).is_err(),
                "cut at {cut}"
            );
        }
        assert_eq!(
            decode_scan_page(&encode_scan_page(&ScanPage::default())).unwrap(),
            ScanPage::default()
        );
        // The smallest partition and the smallest row (each count's bound is exact).
        let smallest = ScanPage {
            partitions: vec![ScannedPartition {
                token: 0,
                partition_key: Bytes::new(),
                read: PartitionRead {
                    static_row: None,
                    rows: vec![ReadRow {
                        clustering: Vec::new(),
                        cells: vec![ReadCell {
                            column: 0,
                            path: None,
                            value: Bytes::new(),
                            timestamp: 0,
                            expiry: None,
                        }],
                        has_liveness: false,
                    }],
                    more: false,
                },
            }],
            next: None,
        };
        assert_eq!(
            decode_scan_page(&encode_scan_page(&smallest)).unwrap(),
            smallest
        );
        let mut bare = smallest.clone();
        bare.partitions[0].read.rows.clear();
        assert_eq!(decode_scan_page(&encode_scan_page(&bare)).unwrap(), bare);
    }

    #[test]
    fn a_huge_count_does_not_allocate() {
        let mut b = BytesMut::new();
        b.put_u8(VERSION);
        b.put_u32(7);
        b.put_u32(u32::MAX);
        assert_eq!(
            decode_mutations(&b.freeze()),
            Err(MalformedBody("count exceeds the body"))
        );
    }

    #[test]
    fn a_truncate_round_trips_and_a_cut_or_padded_one_is_refused() {
        let table = [7u8; 16];
        let body = encode_truncate(table);
        assert_eq!(decode_truncate(&body), Ok(table));
        for cut in 0..body.len() {
            assert!(decode_truncate(&body.slice(..cut)).is_err(), "cut at {cut}");
        }
        let mut padded = BytesMut::from(&body[..]);
        padded.put_u8(0);
        assert!(decode_truncate(&padded.freeze()).is_err());
    }
}
