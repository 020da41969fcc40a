//! Storage: rows of cells on an embedded LSM engine (fjall, one database per shard),
//! last-write-wins by write timestamp, tombstones and TTL, with group commit so that
//! concurrent writes share an fsync.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod background;
#[cfg(test)]
mod conditional_tests;
#[cfg(test)]
mod critical_section_tests;
#[cfg(test)]
mod delete_timing_tests;
#[cfg(test)]
mod gc_tests;
#[cfg(test)]
mod get_pair_tests;
mod journal_sync;
pub mod keycodec;
mod limits;
mod memtable_reaper;
pub mod model;
#[cfg(test)]
mod prefix_filter_tests;
mod row;
mod storage;
mod store;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod superseded_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod transaction_tests;

pub use limits::{
    WriteLimits, DEFAULT_MAX_MUTATION_BYTES, DEFAULT_MAX_VALUE_BYTES, DEFAULT_MIN_FREE_DISK_BYTES,
    DISK_FULL_MESSAGE, STORAGE_FAILED_MESSAGE,
};
pub use model::*;
pub use storage::{
    AckBarrier, AckBarrierHeld, CommitTicket, ConditionalOutcome, GroupCommitWait, Storage,
    TxnOutcome,
};
pub use store::{
    ConditionRead, RangeChunk, RawPartition, RawRecord, TxnError, TxnPartition, TxnRead,
    DEFAULT_TOMBSTONE_FAILURE_THRESHOLD, MAX_RAW_PARTITION_BYTES, MAX_READ_BYTES,
};

use bytes::Bytes;
use std::ops::Bound;
use std::path::PathBuf;
use std::time::Duration;

/// What storage's background purges have done: the deletion of dropped and truncated
/// tables' files, and the removal of rows that deletions shadow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeStats {
    /// Dropped or truncated tables' keyspaces whose files are not deleted yet.
    pub tables_pending: u64,
    /// Dropped or truncated tables' keyspaces whose files are gone.
    pub tables_purged: u64,
    /// The disk space of those keyspaces when they were deleted.
    pub table_bytes_purged: u64,
    /// Steps the keyspace deleters ran (a deletion, or a look at one not yet let go).
    pub table_purge_steps: u64,
    /// Row purge jobs queued.
    pub row_purges_queued: u64,
    /// Row purge jobs dropped because a queue was full (their records keep them).
    pub row_purges_dropped: u64,
    /// Rows the row purgers examined.
    pub row_purge_rows_examined: u64,
}

impl PurgeStats {
    /// The sum of two stores' counters.
    fn plus(&self, other: &PurgeStats) -> PurgeStats {
        PurgeStats {
            tables_pending: self.tables_pending + other.tables_pending,
            tables_purged: self.tables_purged + other.tables_purged,
            table_bytes_purged: self.table_bytes_purged + other.table_bytes_purged,
            table_purge_steps: self.table_purge_steps + other.table_purge_steps,
            row_purges_queued: self.row_purges_queued + other.row_purges_queued,
            row_purges_dropped: self.row_purges_dropped + other.row_purges_dropped,
            row_purge_rows_examined: self.row_purge_rows_examined + other.row_purge_rows_examined,
        }
    }
}

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Acknowledge after fsync; concurrent writes share one fsync (group commit).
    Batch,
    /// Acknowledge at once; fsync every `interval` (Cassandra's default mode, 10 s there).
    Periodic {
        /// Time between fsyncs.
        interval: Duration,
    },
}

/// How to open storage.
#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// Data directory.
    pub path: PathBuf,
    /// Durability mode.
    pub durability: Durability,
    /// Block cache size in bytes (shared out among the stores).
    pub cache_bytes: u64,
    /// Number of stores (fjall databases) for a new data directory: one per shard, so that
    /// shards do not share a journal. An existing directory keeps the number it has.
    pub stores: usize,
}

/// A storage failure. Small and `Copy`: the detail goes to the log where it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageError {
    /// The engine reported an I/O error.
    Io(&'static str),
    /// Stored bytes did not decode (corruption or a bug).
    Corrupt(&'static str),
    /// A value or key is larger than storage accepts.
    TooLarge(&'static str),
    /// A read stepped over more dead entries (deleted or expired rows, deleted partitions)
    /// than the tombstone failure threshold allows, as Cassandra's
    /// TombstoneOverwhelmingException.
    TooManyTombstones,
    /// Storage is shutting down.
    Closed,
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageError::Io(m) => write!(f, "storage I/O error: {m}"),
            StorageError::Corrupt(m) => write!(f, "storage corruption: {m}"),
            StorageError::TooLarge(m) => write!(f, "too large for storage: {m}"),
            StorageError::TooManyTombstones => {
                f.write_str("read stepped over more tombstones than tombstone_failure_threshold")
            }
            StorageError::Closed => f.write_str("storage is closed"),
        }
    }
}

impl std::error::Error for StorageError {}

/// Where a token-range scan resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanStart {
    /// From the first partition whose token satisfies this bound.
    Token(Bound<i64>),
    /// Within a partition, after this clustering key (None = after the static row / the
    /// start of that partition's rows, i.e. `after_rows = false` means from its first row).
    Resume {
        /// Token of the partition.
        token: i64,
        /// Partition key.
        partition_key: Bytes,
        /// Last clustering key already returned; None = start of the partition.
        after: Option<Vec<Bytes>>,
    },
}

/// One partition of a scan result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedPartition {
    /// Token.
    pub token: i64,
    /// Partition key.
    pub partition_key: Bytes,
    /// Its rows.
    pub read: PartitionRead,
}

/// A scan page.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScanPage {
    /// Partitions in token order (then key bytes), each with at most the remaining rows.
    pub partitions: Vec<ScannedPartition>,
    /// Where to resume, or None when the range is exhausted.
    pub next: Option<ScanStart>,
}
