//! The data model storage speaks: mutations going in, rows coming out.
//!
//! Values are opaque serialized CQL values (the native-protocol encoding). Storage knows
//! types only where order matters: clustering keys, which it encodes so that byte order
//! equals CQL order (ascending or descending per column).

use bytes::Bytes;
use sluice_types::CqlType;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A table's identity in storage (the table's UUID bytes).
pub type TableId = [u8; 16];

/// A column's stable id within its table; the catalog never reuses an id.
pub type ColumnId = u16;

/// Sort order of a clustering column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Ascending.
    Asc,
    /// Descending.
    Desc,
}

/// What storage must know of a table to order its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableLayout {
    /// The table.
    pub id: TableId,
    /// Clustering column types and orders, in clustering order.
    pub clustering: Vec<(CqlType, Order)>,
    /// The table's regular columns, which let a write that sets all of them skip reading the
    /// row it replaces; `None`: every write merges into the stored row.
    pub regular: Option<Arc<RegularColumns>>,
    /// `gc_grace_seconds`: how long tombstones and expired cells are kept before compaction
    /// may purge them.
    pub gc_grace_seconds: u32,
}

/// Cassandra's default `gc_grace_seconds` (ten days).
pub const DEFAULT_GC_GRACE_SECONDS: u32 = 864_000;

impl TableLayout {
    /// Retires the regular column set, if any (see `RegularColumns::retire`).
    pub fn retire_regular_columns(&self) {
        if let Some(regular) = &self.regular {
            regular.retire();
        }
    }
}

/// A table's regular (non-key, non-static) columns as one version of its schema has them.
///
/// A row write that sets every one of them (a multi-cell collection counts as set when the
/// write deletes it first, as an INSERT does) with timestamps above everything stored in its
/// partition's lock stripe replaces the stored row entirely, so storage writes it without
/// reading the old one. The set must be the table's current one: a write planned against an
/// older schema cannot know of a column added since, whose cells it would erase. So the
/// schema owner `retire`s a set before a new schema version becomes visible.
#[derive(Debug)]
pub struct RegularColumns {
    columns: Vec<(ColumnId, bool)>,
    current: AtomicBool,
}

impl RegularColumns {
    /// The regular columns by storage id, each with whether it is a multi-cell collection.
    pub fn new(columns: Vec<(ColumnId, bool)>) -> RegularColumns {
        RegularColumns {
            columns,
            current: AtomicBool::new(true),
        }
    }

    /// Marks this set as superseded: later writes planned with it merge as before.
    pub fn retire(&self) {
        self.current.store(false, Ordering::Release);
    }

    /// Whether `row` sets every column of a current set and writes no counter (so that the
    /// stored row, all older, would be entirely shadowed).
    pub(crate) fn replaced_by(&self, row: &RowMutation) -> bool {
        if !self.current.load(Ordering::Acquire) || row.liveness.is_none() {
            return false;
        }
        if row
            .cells
            .iter()
            .any(|c| matches!(c.value, CellValue::CounterDelta(_)))
        {
            return false;
        }
        self.columns.iter().all(|&(id, multi_cell)| {
            if multi_cell {
                row.collection_deletions.iter().any(|&(c, _)| c == id)
            } else {
                row.cells.iter().any(|c| c.column == id && c.path.is_none())
            }
        })
    }
}

impl PartialEq for RegularColumns {
    fn eq(&self, other: &Self) -> bool {
        self.columns == other.columns
    }
}

impl Eq for RegularColumns {}

/// A row's liveness (Cassandra's primary-key liveness info, written by INSERT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// Write timestamp (µs).
    pub timestamp: i64,
    /// Expiry as seconds since the epoch, with the TTL it came from: `(expires_at, ttl)`.
    pub expiry: Option<(u32, u32)>,
}

/// The new state of one cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CellValue {
    /// A live value.
    Live(Bytes),
    /// A deletion (tombstone).
    Tombstone,
    /// A counter increment (added to the current value).
    CounterDelta(i64),
}

/// A write of one cell: a column, or one element of a non-frozen collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellWrite {
    /// The column.
    pub column: ColumnId,
    /// For a non-frozen collection element: the element key (set element, map key, or list
    /// timeuuid). Order of elements is the byte order of the serialized key for sets and
    /// lists (lists use timeuuid keys whose encoding the engine makes order-preserving).
    pub path: Option<Bytes>,
    /// New value.
    pub value: CellValue,
    /// Write timestamp (µs); last write wins, ties broken by value bytes as Cassandra does.
    pub timestamp: i64,
    /// `(expires_at, ttl)` in seconds.
    pub expiry: Option<(u32, u32)>,
}

/// Changes to one row (or to the static row when `clustering` is empty on a table with
/// clustering columns and `is_static` is set).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RowMutation {
    /// Full clustering key, one serialized value per clustering column (empty for tables
    /// without clustering columns, and for the static row).
    pub clustering: Vec<Bytes>,
    /// Set by INSERT: the row exists even if all its regular columns are null.
    pub liveness: Option<Liveness>,
    /// Row deletion at this timestamp: hides the marker and cells written at or before it.
    pub deletion: Option<i64>,
    /// Whole-collection deletions (`SET l = [...]` first deletes the old elements): (column, timestamp).
    pub collection_deletions: Vec<(ColumnId, i64)>,
    /// Cell writes.
    pub cells: Vec<CellWrite>,
}

/// A clustering range deletion (`DELETE ... WHERE pk = ? AND c > ?`): bounds are prefixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeDeletion {
    /// Start bound (a clustering prefix).
    pub start: Bound<Vec<Bytes>>,
    /// End bound (a clustering prefix).
    pub end: Bound<Vec<Bytes>>,
    /// Deletion timestamp.
    pub timestamp: i64,
}

/// All changes to one partition of one table, applied atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mutation {
    /// The table.
    pub table: TableId,
    /// The partition's Murmur3 token.
    pub token: i64,
    /// The serialized partition key (the routing key drivers hash).
    pub partition_key: Bytes,
    /// Partition deletion timestamp.
    pub partition_deletion: Option<i64>,
    /// Clustering range deletions.
    pub range_deletions: Vec<RangeDeletion>,
    /// Static row changes.
    pub static_row: Option<RowMutation>,
    /// Row changes.
    pub rows: Vec<RowMutation>,
}

/// A live cell as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadCell {
    /// Column.
    pub column: ColumnId,
    /// Collection element key, if any.
    pub path: Option<Bytes>,
    /// Value (for counters, the 8-byte big-endian total).
    pub value: Bytes,
    /// Write timestamp (for `WRITETIME()`).
    pub timestamp: i64,
    /// `(expires_at, ttl)` (for `TTL()`).
    pub expiry: Option<(u32, u32)>,
}

/// A live row as read back: cells sorted by (column, path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRow {
    /// Clustering key values (empty for the static row / tables without clustering).
    pub clustering: Vec<Bytes>,
    /// Live cells only.
    pub cells: Vec<ReadCell>,
    /// Whether the row's liveness marker is live (the row exists even with no cells).
    pub has_liveness: bool,
}

/// Which rows of a partition to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusteringSlice {
    /// Clustering ranges (prefix bounds), in clustering order, non-overlapping;
    /// a single `(Unbounded, Unbounded)` reads the whole partition.
    pub ranges: Vec<(Bound<Vec<Bytes>>, Bound<Vec<Bytes>>)>,
    /// Read in reverse clustering order.
    pub reversed: bool,
}

impl ClusteringSlice {
    /// The whole partition, in clustering order.
    pub fn all() -> Self {
        ClusteringSlice {
            ranges: vec![(Bound::Unbounded, Bound::Unbounded)],
            reversed: false,
        }
    }
}

/// A partition as read back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartitionRead {
    /// The static row, if it has live cells.
    pub static_row: Option<ReadRow>,
    /// Live rows in the requested order, at most the requested limit.
    pub rows: Vec<ReadRow>,
    /// True when the limit stopped the read before the slice was exhausted.
    pub more: bool,
}
