//! The bodies of the coordinator's messages to replicas: storage mutations, read requests
//! and raw partitions, in a compact big-endian form. Every decoder bounds what it allocates
//! by the bytes present and answers a malformed body with an error, never a panic.

use bytes::{BufMut, Bytes, BytesMut};
use sluice_storage::{
    CellValue, CellWrite, Liveness, Mutation, RangeDeletion, RawPartition, RowMutation,
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
        match &m.static_row {
            Some(row) => {
                out.put_u8(1);
                put_row(&mut out, row);
            }
            None => out.put_u8(0),
        }
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
        let nrd = r.count(10)?;
        let mut range_deletions = Vec::with_capacity(nrd);
        for _ in 0..nrd {
            let start = r.bound()?;
            let end = r.bound()?;
            let timestamp = r.i64()?;
            range_deletions.push(RangeDeletion {
                start,
                end,
                timestamp,
            });
        }
        let static_row = match r.u8()? {
            0 => None,
            1 => Some(r.row()?),
            _ => return Err(MalformedBody("bad static row flag")),
        };
        let nrows = r.count(13)?;
        let mut rows = Vec::with_capacity(nrows);
        for _ in 0..nrows {
            rows.push(r.row()?);
        }
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

fn put_raw(out: &mut BytesMut, raw: &RawPartition) {
    match &raw.header {
        Some(h) => {
            out.put_u8(1);
            put_bytes(out, h);
        }
        None => out.put_u8(0),
    }
    out.put_u32(raw.rows.len() as u32);
    for row in &raw.rows {
        put_bytes(out, row);
    }
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u32(b.len() as u32);
    out.put_slice(b);
}

fn put_opt_i64(out: &mut BytesMut, v: Option<i64>) {
    match v {
        Some(v) => {
            out.put_u8(1);
            out.put_i64(v);
        }
        None => out.put_u8(0),
    }
}

fn put_expiry(out: &mut BytesMut, e: Option<(u32, u32)>) {
    match e {
        Some((at, ttl)) => {
            out.put_u8(1);
            out.put_u32(at);
            out.put_u32(ttl);
        }
        None => out.put_u8(0),
    }
}

fn put_bound(out: &mut BytesMut, b: &Bound<Vec<Bytes>>) {
    let (kind, values) = match b {
        Bound::Unbounded => (0u8, None),
        Bound::Included(v) => (1, Some(v)),
        Bound::Excluded(v) => (2, Some(v)),
    };
    out.put_u8(kind);
    if let Some(values) = values {
        out.put_u16(values.len() as u16);
        for v in values {
            put_bytes(out, v);
        }
    }
}

fn put_row(out: &mut BytesMut, row: &RowMutation) {
    out.put_u16(row.clustering.len() as u16);
    for v in &row.clustering {
        put_bytes(out, v);
    }
    match row.liveness {
        Some(l) => {
            out.put_u8(1);
            out.put_i64(l.timestamp);
            put_expiry(out, l.expiry);
        }
        None => out.put_u8(0),
    }
    put_opt_i64(out, row.deletion);
    out.put_u32(row.collection_deletions.len() as u32);
    for (col, ts) in &row.collection_deletions {
        out.put_u16(*col);
        out.put_i64(*ts);
    }
    out.put_u32(row.cells.len() as u32);
    for c in &row.cells {
        out.put_u16(c.column);
        match &c.path {
            Some(p) => {
                out.put_u8(1);
                put_bytes(out, p);
            }
            None => out.put_u8(0),
        }
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

    fn opt_i64(&mut self) -> R<Option<i64>> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.i64()?)),
            _ => Err(MalformedBody("bad option flag")),
        }
    }

    fn expiry(&mut self) -> R<Option<(u32, u32)>> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some((self.u32()?, self.u32()?))),
            _ => Err(MalformedBody("bad expiry flag")),
        }
    }

    fn bound(&mut self) -> R<Bound<Vec<Bytes>>> {
        let kind = self.u8()?;
        if kind == 0 {
            return Ok(Bound::Unbounded);
        }
        let n = usize::from(self.u16()?);
        if n.saturating_mul(4) > self.remaining() {
            return Err(MalformedBody("count exceeds the body"));
        }
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            values.push(self.bytes()?);
        }
        match kind {
            1 => Ok(Bound::Included(values)),
            2 => Ok(Bound::Excluded(values)),
            _ => Err(MalformedBody("bad bound kind")),
        }
    }

    fn row(&mut self) -> R<RowMutation> {
        let n = usize::from(self.u16()?);
        if n.saturating_mul(4) > self.remaining() {
            return Err(MalformedBody("count exceeds the body"));
        }
        let mut clustering = Vec::with_capacity(n);
        for _ in 0..n {
            clustering.push(self.bytes()?);
        }
        let liveness = match self.u8()? {
            0 => None,
            1 => Some(Liveness {
                timestamp: self.i64()?,
                expiry: self.expiry()?,
            }),
            _ => return Err(MalformedBody("bad liveness flag")),
        };
        let deletion = self.opt_i64()?;
        let n = self.count(10)?;
        let mut collection_deletions = Vec::with_capacity(n);
        for _ in 0..n {
            collection_deletions.push((self.u16()?, self.i64()?));
        }
        let n = self.count(13)?;
        let mut cells = Vec::with_capacity(n);
        for _ in 0..n {
            let column = self.u16()?;
            let path = match self.u8()? {
                0 => None,
                1 => Some(self.bytes()?),
                _ => return Err(MalformedBody("bad path flag")),
            };
            let value = match self.u8()? {
                0 => CellValue::Live(self.bytes()?),
                1 => CellValue::Tombstone,
                2 => CellValue::CounterDelta(self.i64()?),
                _ => return Err(MalformedBody("bad cell kind")),
            };
            let timestamp = self.i64()?;
            let expiry = self.expiry()?;
            cells.push(CellWrite {
                column,
                path,
                value,
                timestamp,
                expiry,
            });
        }
        Ok(RowMutation {
            clustering,
            liveness,
            deletion,
            collection_deletions,
            cells,
        })
    }

    fn raw(&mut self) -> R<RawPartition> {
        let header = match self.u8()? {
            0 => None,
            1 => Some(self.bytes()?),
            _ => return Err(MalformedBody("bad header flag")),
        };
        let n = self.count(4)?;
        let mut rows = Vec::with_capacity(n);
        for _ in 0..n {
            rows.push(self.bytes()?);
        }
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
