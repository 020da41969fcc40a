//! Stored rows and partition headers: their binary encoding and the last-write-wins merge.
//!
//! A row value holds its raw clustering values (so that reads return them exactly as written,
//! even for types whose key encoding normalises, like decimal), its liveness, its deletion,
//! whole-collection deletions and cells sorted by `(column, path)`. A partition header holds
//! the partition deletion, range tombstones (as encoded clustering byte ranges) and the
//! static row.
//!
//! Merging is per cell: the higher timestamp wins; on equal timestamps a tombstone beats an
//! expiring cell, which beats a cell without TTL, then the later expiry, then the greater
//! value (Cassandra's rules). Counter
//! deltas add. Data shadowed by a deletion stored in the same row is dropped at merge time,
//! and rows entirely shadowed by a partition or range deletion are removed by `apply`.
//! Tombstones must keep shadowing late writes with older timestamps, so they stay until
//! they are older than the table's gc_grace_seconds; then compaction purges them
//! ([`GcHorizon`]).

use crate::keycodec::ByteRange;
use crate::model::{CellValue, ColumnId, Liveness, ReadCell, ReadRow, RowMutation};
use crate::StorageError;
use bytes::{Bytes, BytesMut};
use std::cmp::Ordering;

/// The point before which compaction may purge tombstones and expired cells: a tombstone
/// (deletion) written before `tombstones_before` (µs, its write timestamp), and a TTL cell
/// or liveness that expired at or before `expired_by` (epoch seconds), as Cassandra drops
/// them once they are older than gc_grace_seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcHorizon {
    /// Deletions with a timestamp (µs) below this are purged.
    pub tombstones_before: i64,
    /// TTL cells and liveness that expired at or before this (epoch seconds) are purged.
    pub expired_by: u32,
}

impl GcHorizon {
    /// The horizon at `now_secs` for a table with `gc_grace_seconds`.
    pub fn new(now_secs: u32, gc_grace_seconds: u32) -> GcHorizon {
        let before_secs = i64::from(now_secs) - i64::from(gc_grace_seconds);
        GcHorizon {
            tombstones_before: before_secs.saturating_mul(1_000_000),
            expired_by: now_secs.saturating_sub(gc_grace_seconds),
        }
    }

    /// True when a deletion at `timestamp` is older than the horizon.
    pub fn tombstone_purgeable(&self, timestamp: i64) -> bool {
        timestamp < self.tombstones_before
    }

    fn expiry_purgeable(&self, expiry: Option<(u32, u32)>) -> bool {
        matches!(expiry, Some((at, _)) if at <= self.expired_by)
    }
}

/// What a gc purge did to a stored row or header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purge {
    /// Nothing was purgeable.
    Unchanged,
    /// Something was purged; something is left.
    Changed,
    /// Nothing is left: the entry can go.
    Emptied,
}

/// What a stored cell holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredValue {
    /// A live value.
    Live(Bytes),
    /// A deletion.
    Tombstone,
    /// A counter total.
    Counter(i64),
}

/// One stored cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCell {
    /// Column.
    pub column: ColumnId,
    /// Collection element key.
    pub path: Option<Bytes>,
    /// Write timestamp (µs).
    pub timestamp: i64,
    /// `(expires_at, ttl)`.
    pub expiry: Option<(u32, u32)>,
    /// Content.
    pub value: StoredValue,
}

impl StoredCell {
    fn sort_key(&self) -> (ColumnId, Option<&[u8]>) {
        (self.column, self.path.as_deref())
    }

    /// The bytes its value takes in the encoding.
    fn value_len(&self) -> usize {
        match &self.value {
            StoredValue::Live(v) => 4 + v.len(),
            StoredValue::Tombstone => 0,
            StoredValue::Counter(_) => 8,
        }
    }

    fn is_live(&self, now_secs: u32) -> bool {
        !matches!(self.value, StoredValue::Tombstone) && !expired(self.expiry, now_secs)
    }
}

/// A stored row (clustering row or static row).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredRow {
    /// Raw clustering values (empty for the static row).
    pub clustering: Vec<Bytes>,
    /// Primary-key liveness.
    pub liveness: Option<Liveness>,
    /// Row deletion timestamp.
    pub deletion: Option<i64>,
    /// Whole-collection deletions, sorted by column, one per column.
    pub collection_deletions: Vec<(ColumnId, i64)>,
    /// Cells sorted by `(column, path)`, unique.
    pub cells: Vec<StoredCell>,
}

/// A stored range tombstone over encoded clustering bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRangeTombstone {
    /// The deleted range.
    pub range: ByteRange,
    /// Deletion timestamp.
    pub timestamp: i64,
}

/// The partition header entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartitionHeader {
    /// Partition deletion timestamp.
    pub deletion: Option<i64>,
    /// Range tombstones.
    pub range_tombstones: Vec<StoredRangeTombstone>,
    /// The static row.
    pub static_row: Option<StoredRow>,
}

/// Most range tombstones one partition header keeps; beyond that a write is refused
/// (bounded header size, and every read of the partition decodes them).
pub const MAX_RANGE_TOMBSTONES: usize = 4096;

/// True when range `outer` contains every key of range `inner`.
fn covers(outer: &ByteRange, inner: &ByteRange) -> bool {
    let lo_ok = match (&outer.lo, &inner.lo) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(o), Some(i)) => o <= i,
    };
    let hi_ok = match (&outer.hi, &inner.hi) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(o), Some(i)) => o >= i,
    };
    lo_ok && hi_ok
}

fn expired(expiry: Option<(u32, u32)>, now_secs: u32) -> bool {
    matches!(expiry, Some((at, _)) if at <= now_secs)
}

fn max_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    }
}

/// Cassandra's cell reconciliation (`Cells.resolveRegular`): true when `new` supersedes `old`.
fn supersedes(new: &StoredCell, old: &StoredCell) -> bool {
    if new.timestamp != old.timestamp {
        return new.timestamp > old.timestamp;
    }
    let new_dead = matches!(new.value, StoredValue::Tombstone);
    let old_dead = matches!(old.value, StoredValue::Tombstone);
    // At equal timestamps a tombstone or an expiring cell beats a cell without TTL, whatever
    // the clock says (CASSANDRA-14592); then a tombstone beats an expiring cell.
    let new_mortal = new_dead || new.expiry.is_some();
    let old_mortal = old_dead || old.expiry.is_some();
    if new_mortal != old_mortal {
        return new_mortal;
    }
    if new_dead != old_dead {
        return new_dead;
    }
    if !new_dead {
        // Both expiring: the later expiry wins; then, as for two cells without TTL, the value.
        let at = |c: &StoredCell| c.expiry.map_or(0, |(at, _)| at);
        if at(new) != at(old) {
            return at(new) > at(old);
        }
    }
    let by_value = match (&new.value, &old.value) {
        (StoredValue::Live(a), StoredValue::Live(b)) => a.cmp(b),
        (StoredValue::Counter(a), StoredValue::Counter(b)) => a.cmp(b),
        _ => Ordering::Equal,
    };
    by_value == Ordering::Greater
}

/// Cassandra's liveness reconciliation: true when `new` supersedes `old`.
fn liveness_supersedes(new: &Liveness, old: &Liveness) -> bool {
    if new.timestamp != old.timestamp {
        return new.timestamp > old.timestamp;
    }
    match (new.expiry, old.expiry) {
        (Some((a, _)), Some((b, _))) => a > b,
        // At equal timestamps an expiring liveness wins over a permanent one.
        (Some(_), None) => true,
        _ => false,
    }
}

/// Merges `incoming` into `old` (which may be absent): the LWW result.
fn merge_cell(old: Option<StoredCell>, incoming: StoredCell) -> StoredCell {
    let Some(old) = old else { return incoming };
    if let (StoredValue::Counter(a), StoredValue::Counter(b)) = (&old.value, &incoming.value) {
        // Counter shards are deltas: they add, the newest timestamp is kept.
        return StoredCell {
            value: StoredValue::Counter(a.wrapping_add(*b)),
            timestamp: old.timestamp.max(incoming.timestamp),
            expiry: None,
            ..incoming
        };
    }
    if supersedes(&incoming, &old) {
        incoming
    } else {
        old
    }
}

impl StoredRow {
    /// Converts a row mutation to storage form before any lock is taken: cells sorted and
    /// reconciled among themselves, so that the locked merge is a linear pass.
    pub fn from_mutation(m: &RowMutation) -> StoredRow {
        let mut cells: Vec<StoredCell> = m
            .cells
            .iter()
            .map(|c| StoredCell {
                column: c.column,
                path: c.path.clone(),
                timestamp: c.timestamp,
                expiry: match c.value {
                    CellValue::CounterDelta(_) => None,
                    _ => c.expiry,
                },
                value: match &c.value {
                    CellValue::Live(v) => StoredValue::Live(v.clone()),
                    CellValue::Tombstone => StoredValue::Tombstone,
                    CellValue::CounterDelta(d) => StoredValue::Counter(*d),
                },
            })
            .collect();
        cells.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        let mut merged: Vec<StoredCell> = Vec::with_capacity(cells.len());
        for cell in cells {
            match merged.last_mut() {
                Some(last) if last.sort_key() == cell.sort_key() => {
                    let prev = std::mem::replace(last, cell.clone());
                    *last = merge_cell(Some(prev), cell);
                }
                _ => merged.push(cell),
            }
        }
        let mut collection_deletions = m.collection_deletions.clone();
        collection_deletions.sort_unstable();
        collection_deletions.dedup_by(|b, a| {
            // Keep one entry per column with the newest timestamp (sorted ascending).
            if a.0 == b.0 {
                a.1 = a.1.max(b.1);
                true
            } else {
                false
            }
        });
        let mut row = StoredRow {
            clustering: m.clustering.clone(),
            liveness: m.liveness,
            deletion: m.deletion,
            collection_deletions,
            cells: merged,
        };
        row.purge_shadowed();
        row
    }
}

impl StoredRow {
    /// Merges `incoming` into this row (LWW per cell, deletions applied, shadowed data dropped).
    pub fn merge(&mut self, incoming: StoredRow) {
        if self.clustering.is_empty() {
            self.clustering = incoming.clustering;
        }
        self.deletion = max_opt(self.deletion, incoming.deletion);
        self.liveness = match (self.liveness, incoming.liveness) {
            (Some(old), Some(new)) => Some(if liveness_supersedes(&new, &old) {
                new
            } else {
                old
            }),
            (a, b) => a.or(b),
        };
        // Merge collection deletions (both sorted by column).
        let mut deletions = Vec::with_capacity(
            self.collection_deletions.len() + incoming.collection_deletions.len(),
        );
        let (mut a, mut b) = (
            std::mem::take(&mut self.collection_deletions)
                .into_iter()
                .peekable(),
            incoming.collection_deletions.into_iter().peekable(),
        );
        loop {
            match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x.0 == y.0 => {
                    deletions.push((x.0, x.1.max(y.1)));
                    a.next();
                    b.next();
                }
                (Some(x), Some(y)) if x.0 < y.0 => deletions.extend(a.next()),
                (Some(_), Some(_)) | (None, Some(_)) => deletions.extend(b.next()),
                (Some(_), None) => deletions.extend(a.next()),
                (None, None) => break,
            }
        }
        self.collection_deletions = deletions;
        // Merge cells (both sorted by (column, path)).
        let mut cells = Vec::with_capacity(self.cells.len() + incoming.cells.len());
        let mut a = std::mem::take(&mut self.cells).into_iter().peekable();
        let mut b = incoming.cells.into_iter().peekable();
        loop {
            let order = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) => x.sort_key().cmp(&y.sort_key()),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => break,
            };
            match order {
                Ordering::Less => cells.extend(a.next()),
                Ordering::Greater => cells.extend(b.next()),
                Ordering::Equal => {
                    let (old, new) = (a.next(), b.next());
                    if let Some(new) = new {
                        cells.push(merge_cell(old, new));
                    }
                }
            }
        }
        self.cells = cells;
        self.purge_shadowed();
    }

    /// True when the row holds nothing at all (no liveness, deletion or cell).
    pub fn is_empty(&self) -> bool {
        self.liveness.is_none()
            && self.deletion.is_none()
            && self.collection_deletions.is_empty()
            && self.cells.is_empty()
    }

    /// Drops the tombstones and expired cells behind `horizon`. What a purged deletion hid
    /// is dropped first (it is already shadowed in this row), so nothing reappears.
    pub fn purge_gc(&mut self, horizon: &GcHorizon) -> Purge {
        let before = (
            self.liveness,
            self.deletion,
            self.collection_deletions.len(),
            self.cells.len(),
        );
        self.purge_shadowed();
        if self
            .deletion
            .is_some_and(|d| horizon.tombstone_purgeable(d))
        {
            self.deletion = None;
        }
        if self
            .liveness
            .is_some_and(|l| horizon.expiry_purgeable(l.expiry))
        {
            self.liveness = None;
        }
        self.collection_deletions
            .retain(|&(_, ts)| !horizon.tombstone_purgeable(ts));
        self.cells.retain(|c| match c.value {
            StoredValue::Tombstone => !horizon.tombstone_purgeable(c.timestamp),
            _ => !horizon.expiry_purgeable(c.expiry),
        });
        let after = (
            self.liveness,
            self.deletion,
            self.collection_deletions.len(),
            self.cells.len(),
        );
        if self.is_empty() {
            Purge::Emptied
        } else if after == before {
            Purge::Unchanged
        } else {
            Purge::Changed
        }
    }

    /// Drops the liveness, cells and collection deletions that a deletion in this row hides.
    fn purge_shadowed(&mut self) {
        if let Some(del) = self.deletion {
            if self.liveness.is_some_and(|l| l.timestamp <= del) {
                self.liveness = None;
            }
            self.collection_deletions.retain(|&(_, ts)| ts > del);
        }
        let deletion = self.deletion;
        let coll = &self.collection_deletions;
        self.cells.retain(|c| {
            if deletion.is_some_and(|d| c.timestamp <= d) {
                return false;
            }
            if c.path.is_some() {
                if let Ok(i) = coll.binary_search_by_key(&c.column, |&(col, _)| col) {
                    return c.timestamp > coll[i].1;
                }
            }
            true
        });
    }

    /// Moves every timestamp in the row by `delta` µs (a conditional commit that assigns its
    /// write timestamp under the lock keeps the offsets between them, e.g. a collection's
    /// replacement tombstone one below its elements).
    pub(crate) fn shift_timestamps(&mut self, delta: i64) {
        for c in &mut self.cells {
            c.timestamp = c.timestamp.saturating_add(delta);
        }
        for (_, ts) in &mut self.collection_deletions {
            *ts = ts.saturating_add(delta);
        }
        if let Some(l) = &mut self.liveness {
            l.timestamp = l.timestamp.saturating_add(delta);
        }
        if let Some(d) = &mut self.deletion {
            *d = d.saturating_add(delta);
        }
    }

    /// Every timestamp in the row: cells, collection deletions, liveness, row deletion.
    fn timestamps(&self) -> impl Iterator<Item = i64> + '_ {
        let cells = self.cells.iter().map(|c| c.timestamp);
        let deletions = self.collection_deletions.iter().map(|&(_, ts)| ts);
        cells
            .chain(deletions)
            .chain(self.liveness.map(|l| l.timestamp))
            .chain(self.deletion)
    }

    /// The oldest timestamp anywhere in the row (`i64::MIN` for an empty row).
    pub fn min_timestamp(&self) -> i64 {
        self.timestamps().min().unwrap_or(i64::MIN)
    }

    /// The newest timestamp anywhere in the row (`i64::MIN` for an empty row).
    pub fn max_timestamp(&self) -> i64 {
        self.timestamps().max().unwrap_or(i64::MIN)
    }

    /// The live content of this row under an outer deletion (partition / range tombstone)
    /// at `now_secs`, or None when nothing of it is live.
    pub fn live_view(&self, outer_deletion: Option<i64>, now_secs: u32) -> Option<ReadRow> {
        let deletion = max_opt(self.deletion, outer_deletion);
        let shadowed = |ts: i64| deletion.is_some_and(|d| ts <= d);
        let has_liveness = self
            .liveness
            .is_some_and(|l| !shadowed(l.timestamp) && !expired(l.expiry, now_secs));
        let cells: Vec<ReadCell> = self
            .cells
            .iter()
            .filter(|c| !shadowed(c.timestamp) && c.is_live(now_secs))
            .filter(|c| {
                c.path.is_none()
                    || self
                        .collection_deletions
                        .binary_search_by_key(&c.column, |&(col, _)| col)
                        .map_or(true, |i| c.timestamp > self.collection_deletions[i].1)
            })
            .map(|c| ReadCell {
                column: c.column,
                path: c.path.clone(),
                value: match &c.value {
                    StoredValue::Live(v) => v.clone(),
                    StoredValue::Counter(n) => Bytes::copy_from_slice(&n.to_be_bytes()),
                    StoredValue::Tombstone => Bytes::new(),
                },
                timestamp: c.timestamp,
                expiry: c.expiry,
            })
            .collect();
        if !has_liveness && cells.is_empty() {
            return None;
        }
        Some(ReadRow {
            clustering: self.clustering.clone(),
            cells,
            has_liveness,
        })
    }

    /// At least the length of this row's encoding, to size a buffer once.
    pub fn encoded_len_hint(&self) -> usize {
        let clustering: usize = self.clustering.iter().map(|v| 4 + v.len()).sum();
        let cells: usize = self
            .cells
            .iter()
            .map(|c| 19 + c.path.as_ref().map_or(0, |p| 4 + p.len()) + c.value_len())
            .sum();
        33 + clustering + 10 * self.collection_deletions.len() + cells
    }

    /// Appends the binary encoding of this row.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), StorageError> {
        let mut flags = 0u8;
        if self.liveness.is_some() {
            flags |= 1;
        }
        if self.liveness.is_some_and(|l| l.expiry.is_some()) {
            flags |= 2;
        }
        if self.deletion.is_some() {
            flags |= 4;
        }
        out.push(flags);
        if let Some(l) = self.liveness {
            out.extend_from_slice(&l.timestamp.to_be_bytes());
            if let Some((at, ttl)) = l.expiry {
                out.extend_from_slice(&at.to_be_bytes());
                out.extend_from_slice(&ttl.to_be_bytes());
            }
        }
        if let Some(d) = self.deletion {
            out.extend_from_slice(&d.to_be_bytes());
        }
        put_len16(out, self.clustering.len())?;
        for v in &self.clustering {
            put_bytes(out, v)?;
        }
        put_len16(out, self.collection_deletions.len())?;
        for (col, ts) in &self.collection_deletions {
            out.extend_from_slice(&col.to_be_bytes());
            out.extend_from_slice(&ts.to_be_bytes());
        }
        put_len32(out, self.cells.len())?;
        for c in &self.cells {
            out.extend_from_slice(&c.column.to_be_bytes());
            let kind = match c.value {
                StoredValue::Live(_) => 0u8,
                StoredValue::Tombstone => 1,
                StoredValue::Counter(_) => 2,
            };
            let flags =
                u8::from(c.path.is_some()) | (u8::from(c.expiry.is_some()) << 1) | (kind << 2);
            out.push(flags);
            out.extend_from_slice(&c.timestamp.to_be_bytes());
            if let Some((at, ttl)) = c.expiry {
                out.extend_from_slice(&at.to_be_bytes());
                out.extend_from_slice(&ttl.to_be_bytes());
            }
            if let Some(p) = &c.path {
                put_bytes(out, p)?;
            }
            match &c.value {
                StoredValue::Live(v) => put_bytes(out, v)?,
                StoredValue::Tombstone => {}
                StoredValue::Counter(n) => out.extend_from_slice(&n.to_be_bytes()),
            }
        }
        Ok(())
    }

    /// Decodes a row from `r` (values are zero-copy slices of the reader's buffer).
    pub fn decode(r: &mut Decoder) -> Result<StoredRow, StorageError> {
        let flags = r.u8()?;
        let liveness = if flags & 1 != 0 {
            let timestamp = r.i64()?;
            let expiry = if flags & 2 != 0 {
                Some((r.u32()?, r.u32()?))
            } else {
                None
            };
            Some(Liveness { timestamp, expiry })
        } else {
            None
        };
        let deletion = if flags & 4 != 0 { Some(r.i64()?) } else { None };
        let n = usize::from(r.u16()?);
        let mut clustering = Vec::with_capacity(n);
        for _ in 0..n {
            clustering.push(r.bytes()?);
        }
        let n = usize::from(r.u16()?);
        let mut collection_deletions = Vec::with_capacity(n);
        for _ in 0..n {
            collection_deletions.push((r.u16()?, r.i64()?));
        }
        let n = r.u32()? as usize;
        // Each cell takes at least 11 bytes: bound the allocation by what is there.
        let mut cells = Vec::with_capacity(n.min(r.remaining() / 11));
        for _ in 0..n {
            let column = r.u16()?;
            let flags = r.u8()?;
            let timestamp = r.i64()?;
            let expiry = if flags & 2 != 0 {
                Some((r.u32()?, r.u32()?))
            } else {
                None
            };
            let path = if flags & 1 != 0 {
                Some(r.bytes()?)
            } else {
                None
            };
            let value = match flags >> 2 {
                0 => StoredValue::Live(r.bytes()?),
                1 => StoredValue::Tombstone,
                2 => StoredValue::Counter(r.i64()?),
                _ => return Err(StorageError::Corrupt("unknown cell kind")),
            };
            cells.push(StoredCell {
                column,
                path,
                timestamp,
                expiry,
                value,
            });
        }
        Ok(StoredRow {
            clustering,
            liveness,
            deletion,
            collection_deletions,
            cells,
        })
    }

    /// Decodes a whole row value from a copy of `value`.
    pub fn decode_value(value: &[u8]) -> Result<StoredRow, StorageError> {
        StoredRow::decode_all(Decoder::new(value))
    }

    /// Decodes a whole row value as the engine stored it, without copying it: the row's
    /// byte strings share `value`'s buffer.
    pub fn decode_stored(value: fjall::Slice) -> Result<StoredRow, StorageError> {
        StoredRow::decode_all(Decoder::shared(value))
    }

    fn decode_all(mut r: Decoder) -> Result<StoredRow, StorageError> {
        let row = StoredRow::decode(&mut r)?;
        r.finish()?;
        Ok(row)
    }
}

impl PartitionHeader {
    /// Moves every timestamp in the header by `delta` µs (see [`StoredRow::shift_timestamps`]).
    pub(crate) fn shift_timestamps(&mut self, delta: i64) {
        if let Some(d) = &mut self.deletion {
            *d = d.saturating_add(delta);
        }
        for t in &mut self.range_tombstones {
            t.timestamp = t.timestamp.saturating_add(delta);
        }
        if let Some(row) = &mut self.static_row {
            row.shift_timestamps(delta);
        }
    }

    /// The newest timestamp in the header (deletions, range tombstones, static row).
    pub fn max_timestamp(&self) -> i64 {
        let tombstones = self.range_tombstones.iter().map(|t| t.timestamp);
        tombstones
            .chain(self.deletion)
            .chain(self.static_row.as_ref().map(StoredRow::max_timestamp))
            .max()
            .unwrap_or(i64::MIN)
    }

    /// Merges incoming header changes into this header.
    pub fn merge(&mut self, incoming: PartitionHeader) {
        self.deletion = max_opt(self.deletion, incoming.deletion);
        for rt in incoming.range_tombstones {
            // Keep the set small: a tombstone covered by a wider one that is at least as
            // new adds nothing (e.g. queue-style `DELETE ... WHERE c < ?` with a growing
            // bound keeps one tombstone instead of one per delete).
            if self
                .range_tombstones
                .iter()
                .any(|t| t.timestamp >= rt.timestamp && covers(&t.range, &rt.range))
            {
                continue;
            }
            self.range_tombstones
                .retain(|t| !(rt.timestamp >= t.timestamp && covers(&rt.range, &t.range)));
            self.range_tombstones.push(rt);
        }
        if let Some(d) = self.deletion {
            // A partition deletion covers every older range tombstone.
            self.range_tombstones.retain(|t| t.timestamp > d);
        }
        match (&mut self.static_row, incoming.static_row) {
            (Some(old), Some(new)) => old.merge(new),
            (slot @ None, Some(new)) => *slot = Some(new),
            (_, None) => {}
        }
        if let (Some(d), Some(s)) = (self.deletion, &mut self.static_row) {
            s.deletion = max_opt(s.deletion, Some(d));
            s.purge_shadowed();
            s.deletion = s.deletion.filter(|&sd| sd > d);
        }
    }

    /// The deletion that covers a clustering row with these encoded clustering bytes.
    pub fn deletion_for(&self, clustering: &[u8]) -> Option<i64> {
        self.range_tombstones
            .iter()
            .filter(|t| t.range.contains(clustering))
            .map(|t| t.timestamp)
            .fold(self.deletion, |acc, ts| max_opt(acc, Some(ts)))
    }

    /// Purges its static row behind `horizon`. The partition deletion and range tombstones
    /// stay: they shadow rows stored under other keys, possibly in disk tables this
    /// compaction does not see, so dropping them could bring those rows back; the store's
    /// purger drops them under the partition's lock once no row they shadow is left.
    pub fn purge_gc(&mut self, horizon: &GcHorizon) -> Purge {
        let outcome = match &mut self.static_row {
            Some(s) => s.purge_gc(horizon),
            None => Purge::Unchanged,
        };
        if outcome == Purge::Emptied {
            self.static_row = None;
        }
        if self.is_empty() {
            Purge::Emptied
        } else if outcome == Purge::Unchanged {
            Purge::Unchanged
        } else {
            Purge::Changed
        }
    }

    /// True when the header carries nothing.
    pub fn is_empty(&self) -> bool {
        self.deletion.is_none() && self.range_tombstones.is_empty() && self.static_row.is_none()
    }

    /// Appends the binary encoding of this header.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), StorageError> {
        let flags = u8::from(self.deletion.is_some()) | (u8::from(self.static_row.is_some()) << 1);
        out.push(flags);
        if let Some(d) = self.deletion {
            out.extend_from_slice(&d.to_be_bytes());
        }
        put_len32(out, self.range_tombstones.len())?;
        for t in &self.range_tombstones {
            let f = u8::from(t.range.lo.is_some()) | (u8::from(t.range.hi.is_some()) << 1);
            out.push(f);
            if let Some(lo) = &t.range.lo {
                put_bytes(out, lo)?;
            }
            if let Some(hi) = &t.range.hi {
                put_bytes(out, hi)?;
            }
            out.extend_from_slice(&t.timestamp.to_be_bytes());
        }
        if let Some(s) = &self.static_row {
            s.encode(out)?;
        }
        Ok(())
    }

    /// Decodes a header value from a copy of `value`.
    pub fn decode_value(value: &[u8]) -> Result<PartitionHeader, StorageError> {
        PartitionHeader::decode_all(Decoder::new(value))
    }

    /// Decodes a header value as the engine stored it, without copying it.
    pub fn decode_stored(value: fjall::Slice) -> Result<PartitionHeader, StorageError> {
        PartitionHeader::decode_all(Decoder::shared(value))
    }

    fn decode_all(mut r: Decoder) -> Result<PartitionHeader, StorageError> {
        let flags = r.u8()?;
        let deletion = if flags & 1 != 0 { Some(r.i64()?) } else { None };
        let n = r.u32()? as usize;
        let mut range_tombstones = Vec::with_capacity(n.min(r.remaining() / 9));
        for _ in 0..n {
            let f = r.u8()?;
            let lo = if f & 1 != 0 {
                Some(r.bytes()?.to_vec())
            } else {
                None
            };
            let hi = if f & 2 != 0 {
                Some(r.bytes()?.to_vec())
            } else {
                None
            };
            range_tombstones.push(StoredRangeTombstone {
                range: ByteRange { lo, hi },
                timestamp: r.i64()?,
            });
        }
        let static_row = if flags & 2 != 0 {
            Some(StoredRow::decode(&mut r)?)
        } else {
            None
        };
        r.finish()?;
        Ok(PartitionHeader {
            deletion,
            range_tombstones,
            static_row,
        })
    }
}

fn put_len16(out: &mut Vec<u8>, n: usize) -> Result<(), StorageError> {
    let n = u16::try_from(n).map_err(|_| StorageError::TooLarge("too many entries in a row"))?;
    out.extend_from_slice(&n.to_be_bytes());
    Ok(())
}

fn put_len32(out: &mut Vec<u8>, n: usize) -> Result<(), StorageError> {
    let n = u32::try_from(n).map_err(|_| StorageError::TooLarge("row too large"))?;
    out.extend_from_slice(&n.to_be_bytes());
    Ok(())
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) -> Result<(), StorageError> {
    put_len32(out, b.len())?;
    out.extend_from_slice(b);
    Ok(())
}

/// Checked reader over a stored value; byte strings come out as zero-copy `Bytes` slices.
pub struct Decoder {
    buf: Bytes,
    pos: usize,
}

const TRUNCATED: StorageError = StorageError::Corrupt("truncated stored row");

impl Decoder {
    /// A decoder over a copy of `value` (one copy per stored value; cells slice into it).
    pub fn new(value: &[u8]) -> Decoder {
        Decoder {
            buf: BytesMut::from(value).freeze(),
            pos: 0,
        }
    }

    /// A decoder over a stored value itself: cells slice into `value`'s buffer, which they
    /// keep alive, so decoding costs no copy however large the value (a read under a
    /// transaction's locks would otherwise copy every row it touches).
    pub fn shared(value: fjall::Slice) -> Decoder {
        Decoder {
            buf: Bytes::from_owner(value),
            pos: 0,
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], StorageError> {
        let end = self.pos.checked_add(n).ok_or(TRUNCATED)?;
        let s = self.buf.get(self.pos..end).ok_or(TRUNCATED)?;
        self.pos = end;
        Ok(s)
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn u8(&mut self) -> Result<u8, StorageError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, StorageError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().map_err(|_| TRUNCATED)?,
        ))
    }

    fn u32(&mut self) -> Result<u32, StorageError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().map_err(|_| TRUNCATED)?,
        ))
    }

    fn i64(&mut self) -> Result<i64, StorageError> {
        Ok(i64::from_be_bytes(
            self.take(8)?.try_into().map_err(|_| TRUNCATED)?,
        ))
    }

    fn bytes(&mut self) -> Result<Bytes, StorageError> {
        let n = self.u32()? as usize;
        let start = self.pos;
        self.take(n)?;
        Ok(self.buf.slice(start..start + n))
    }

    fn finish(&self) -> Result<(), StorageError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(StorageError::Corrupt("trailing bytes in stored row"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CellWrite;

    fn cell(column: ColumnId, value: CellValue, timestamp: i64) -> CellWrite {
        CellWrite {
            column,
            path: None,
            value,
            timestamp,
            expiry: None,
        }
    }

    fn live(v: &'static [u8]) -> CellValue {
        CellValue::Live(Bytes::from_static(v))
    }

    fn row_with(cells: Vec<CellWrite>) -> StoredRow {
        StoredRow::from_mutation(&RowMutation {
            cells,
            ..Default::default()
        })
    }

    fn value_of(row: &StoredRow, column: ColumnId) -> Option<Bytes> {
        row.live_view(None, 0)?
            .cells
            .into_iter()
            .find(|c| c.column == column)
            .map(|c| c.value)
    }

    #[test]
    fn older_timestamp_loses_and_ties_go_to_greater_value() {
        let mut row = row_with(vec![cell(1, live(b"b"), 10)]);
        row.merge(row_with(vec![cell(1, live(b"z"), 9)]));
        assert_eq!(value_of(&row, 1).as_deref(), Some(&b"b"[..]));
        row.merge(row_with(vec![cell(1, live(b"a"), 10)]));
        assert_eq!(value_of(&row, 1).as_deref(), Some(&b"b"[..]));
        row.merge(row_with(vec![cell(1, live(b"c"), 10)]));
        assert_eq!(value_of(&row, 1).as_deref(), Some(&b"c"[..]));
        row.merge(row_with(vec![cell(1, CellValue::Tombstone, 10)]));
        assert_eq!(value_of(&row, 1), None);
        // A live value at the tombstone's timestamp does not resurrect the cell.
        row.merge(row_with(vec![cell(1, live(b"zz"), 10)]));
        assert_eq!(value_of(&row, 1), None);
    }

    #[test]
    fn counters_add_and_duplicates_in_one_mutation_reconcile() {
        let mut row = row_with(vec![
            cell(2, CellValue::CounterDelta(5), 1),
            cell(2, CellValue::CounterDelta(-2), 2),
        ]);
        row.merge(row_with(vec![cell(2, CellValue::CounterDelta(10), 3)]));
        assert_eq!(value_of(&row, 2).as_deref(), Some(&13i64.to_be_bytes()[..]));
    }

    #[test]
    fn row_deletion_purges_older_data_and_collection_deletion_hides_elements() {
        let mut row = StoredRow::default();
        row.merge(StoredRow::from_mutation(&RowMutation {
            liveness: Some(Liveness {
                timestamp: 5,
                expiry: None,
            }),
            cells: vec![
                cell(1, live(b"x"), 5),
                CellWrite {
                    path: Some(Bytes::from_static(b"k1")),
                    ..cell(3, live(b"v1"), 5)
                },
                CellWrite {
                    path: Some(Bytes::from_static(b"k2")),
                    ..cell(3, live(b"v2"), 8)
                },
            ],
            ..Default::default()
        }));
        row.merge(StoredRow::from_mutation(&RowMutation {
            collection_deletions: vec![(3, 6)],
            ..Default::default()
        }));
        let view = row.live_view(None, 0).unwrap();
        let paths: Vec<_> = view.cells.iter().filter_map(|c| c.path.clone()).collect();
        assert_eq!(paths, vec![Bytes::from_static(b"k2")]);
        row.merge(StoredRow::from_mutation(&RowMutation {
            deletion: Some(7),
            ..Default::default()
        }));
        // Only the element written at 8 survives; the marker and column 1 are gone for good.
        assert_eq!(row.cells.len(), 1);
        assert!(row.liveness.is_none());
        let view = row.live_view(None, 0).unwrap();
        assert!(!view.has_liveness);
        // An outer deletion at 8 hides the rest.
        assert_eq!(row.live_view(Some(8), 0), None);
    }

    #[test]
    fn ttl_expiry_hides_cells_and_liveness() {
        let mut row = StoredRow::from_mutation(&RowMutation {
            liveness: Some(Liveness {
                timestamp: 1,
                expiry: Some((100, 10)),
            }),
            cells: vec![CellWrite {
                expiry: Some((100, 10)),
                ..cell(1, live(b"x"), 1)
            }],
            ..Default::default()
        });
        assert!(row.live_view(None, 99).is_some());
        assert_eq!(row.live_view(None, 100), None);
        row.merge(row_with(vec![cell(2, live(b"y"), 2)]));
        let view = row.live_view(None, 100).unwrap();
        assert!(!view.has_liveness);
        assert_eq!(view.cells.len(), 1);
        assert_eq!(view.cells[0].column, 2);
    }

    #[test]
    fn rows_and_headers_round_trip_and_reject_truncation() {
        let row = StoredRow::from_mutation(&RowMutation {
            clustering: vec![Bytes::from_static(b"ck")],
            liveness: Some(Liveness {
                timestamp: 3,
                expiry: Some((9, 4)),
            }),
            deletion: Some(1),
            collection_deletions: vec![(4, 2)],
            cells: vec![
                CellWrite {
                    path: Some(Bytes::from_static(b"p")),
                    expiry: Some((50, 5)),
                    ..cell(4, live(b"v"), 3)
                },
                cell(5, CellValue::Tombstone, 3),
                cell(6, CellValue::CounterDelta(-7), 3),
            ],
        });
        let mut buf = Vec::new();
        row.encode(&mut buf).unwrap();
        assert_eq!(StoredRow::decode_value(&buf).unwrap(), row);
        for cut in 0..buf.len() {
            assert!(StoredRow::decode_value(&buf[..cut]).is_err());
        }
        let header = PartitionHeader {
            deletion: Some(4),
            range_tombstones: vec![StoredRangeTombstone {
                range: ByteRange {
                    lo: Some(vec![1]),
                    hi: None,
                },
                timestamp: 6,
            }],
            static_row: Some(row),
        };
        let mut buf = Vec::new();
        header.encode(&mut buf).unwrap();
        assert_eq!(PartitionHeader::decode_value(&buf).unwrap(), header);
        for cut in 0..buf.len() {
            assert!(PartitionHeader::decode_value(&buf[..cut]).is_err());
        }
    }

    proptest::proptest! {
        /// Stored bytes are checked: garbage decodes to an error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes: Vec<u8>) {
            let _ = StoredRow::decode_value(&bytes);
            let _ = PartitionHeader::decode_value(&bytes);
        }

        /// Decoding a stored value in place gives what decoding a copy gives, for garbage
        /// (the same error or the same row) as for every cut of a real row.
        #[test]
        fn shared_decoding_equals_copied_decoding(bytes: Vec<u8>) {
            let stored = fjall::Slice::from(bytes.as_slice());
            proptest::prop_assert_eq!(
                StoredRow::decode_stored(stored.clone()).map_err(|e| e.to_string()),
                StoredRow::decode_value(&bytes).map_err(|e| e.to_string())
            );
            proptest::prop_assert_eq!(
                PartitionHeader::decode_stored(stored).map_err(|e| e.to_string()),
                PartitionHeader::decode_value(&bytes).map_err(|e| e.to_string())
            );
        }

        /// Rows of any shape round-trip through the in-place decoding as through the copy.
        #[test]
        fn shared_decoding_round_trips_rows(
            clustering in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8), 0..3),
            liveness in proptest::option::of((proptest::prelude::any::<i64>(), proptest::option::of((proptest::prelude::any::<u32>(), proptest::prelude::any::<u32>())))),
            deletion in proptest::option::of(proptest::prelude::any::<i64>()),
            cells in proptest::collection::vec(
                (0u16..6, proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4)), proptest::prelude::any::<i64>(), 0u8..3, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)),
                0..8,
            ),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
        ) {
            let row = StoredRow::from_mutation(&RowMutation {
                clustering: clustering.into_iter().map(Bytes::from).collect(),
                liveness: liveness.map(|(timestamp, expiry)| Liveness { timestamp, expiry }),
                deletion,
                collection_deletions: vec![],
                cells: cells
                    .into_iter()
                    .map(|(column, path, timestamp, kind, value)| CellWrite {
                        column,
                        path: path.map(Bytes::from),
                        value: match kind {
                            0 => CellValue::Live(Bytes::from(value)),
                            1 => CellValue::Tombstone,
                            _ => CellValue::CounterDelta(value.len() as i64 - 150),
                        },
                        timestamp,
                        expiry: None,
                    })
                    .collect(),
            });
            let mut buf = Vec::new();
            row.encode(&mut buf).unwrap();
            proptest::prop_assert!(row.encoded_len_hint() >= buf.len());
            let stored = StoredRow::decode_stored(fjall::Slice::from(buf.as_slice())).unwrap();
            proptest::prop_assert_eq!(&stored, &row);
            proptest::prop_assert_eq!(&stored, &StoredRow::decode_value(&buf).unwrap());
            let header = PartitionHeader {
                deletion,
                range_tombstones: vec![],
                static_row: Some(row),
            };
            let mut hbuf = Vec::new();
            header.encode(&mut hbuf).unwrap();
            let shared = PartitionHeader::decode_stored(fjall::Slice::from(hbuf.as_slice())).unwrap();
            proptest::prop_assert_eq!(&shared, &header);
            // A truncated value fails the same way both ways.
            let cut = cut.index(buf.len());
            proptest::prop_assert_eq!(
                StoredRow::decode_stored(fjall::Slice::from(&buf[..cut])).map_err(|e| e.to_string()),
                StoredRow::decode_value(&buf[..cut]).map_err(|e| e.to_string())
            );
        }
    }

    #[test]
    fn shared_decoding_keeps_the_stored_value_alive_without_copying_it() {
        let row = row_with(vec![cell(
            1,
            live(b"a value long enough to be on the heap"),
            3,
        )]);
        let mut buf = Vec::new();
        row.encode(&mut buf).unwrap();
        let stored = fjall::Slice::from(buf.as_slice());
        let range = stored.as_ptr_range();
        let decoded = StoredRow::decode_stored(stored).unwrap();
        // The stored value is gone from here: the cell still reads it, in place.
        let StoredValue::Live(v) = &decoded.cells[0].value else {
            panic!("a live cell");
        };
        assert_eq!(&v[..], b"a value long enough to be on the heap");
        assert!(range.contains(&v.as_ptr()));
        assert_eq!(decoded, row);
    }

    #[test]
    fn covered_range_tombstones_coalesce() {
        let rt = |lo: Option<u8>, hi: Option<u8>, timestamp: i64| PartitionHeader {
            range_tombstones: vec![StoredRangeTombstone {
                range: ByteRange {
                    lo: lo.map(|b| vec![b]),
                    hi: hi.map(|b| vec![b]),
                },
                timestamp,
            }],
            ..Default::default()
        };
        let mut h = PartitionHeader::default();
        // Queue-style deletes with a growing upper bound keep a single tombstone.
        for (i, hi) in (10u8..60).enumerate() {
            h.merge(rt(None, Some(hi), 100 + i as i64));
        }
        assert_eq!(h.range_tombstones.len(), 1);
        assert_eq!(h.deletion_for(&[58]), Some(149));
        // A narrower but newer tombstone is kept: it shadows more inside its range.
        h.merge(rt(Some(5), Some(6), 500));
        assert_eq!(h.range_tombstones.len(), 2);
        assert_eq!(h.deletion_for(&[5]), Some(500));
        assert_eq!(h.deletion_for(&[7]), Some(149));
        // A narrower, older one adds nothing.
        h.merge(rt(Some(20), Some(30), 120));
        assert_eq!(h.range_tombstones.len(), 2);
    }

    #[test]
    fn header_deletion_covers_ranges() {
        let mut h = PartitionHeader::default();
        h.merge(PartitionHeader {
            range_tombstones: vec![StoredRangeTombstone {
                range: ByteRange {
                    lo: Some(vec![2]),
                    hi: Some(vec![4]),
                },
                timestamp: 10,
            }],
            ..Default::default()
        });
        assert_eq!(h.deletion_for(&[3]), Some(10));
        assert_eq!(h.deletion_for(&[4]), None);
        h.merge(PartitionHeader {
            deletion: Some(12),
            ..Default::default()
        });
        assert!(h.range_tombstones.is_empty());
        assert_eq!(h.deletion_for(&[3]), Some(12));
    }
}
