//! A partition exactly as it is stored, deletions included: what replicas compare (a read's
//! digest) and exchange (read repair). Merging only live cells would resurrect deleted data,
//! so repair ships and merges the stored entries themselves. A partition's raw form is the
//! records of its key prefix (`stream.rs`), sent without their keys: each is encoded again
//! from the partition and the row.

use super::commit::Prepared;
use super::stream::RawCommit;
use super::Store;
use crate::keycodec::{self, KIND_HEADER, KIND_ROW, MAX_KEY_LEN};
use crate::model::{TableId, TableLayout};
use crate::StorageError;
use bytes::Bytes;
use std::ops::{Bound, ControlFlow};

/// Most stored bytes one raw partition may hold: a bigger one is not compared or repaired
/// across replicas (its reads fail instead of holding unbounded memory).
pub const MAX_RAW_PARTITION_BYTES: usize = 4 << 20;

/// One partition's stored entries, tombstones and shadowed-but-not-yet-purged data included.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawPartition {
    /// The encoded partition header (partition deletion, range tombstones, static row).
    pub header: Option<Bytes>,
    /// The encoded rows, in clustering order (each carries its clustering values).
    pub rows: Vec<Bytes>,
}

impl RawPartition {
    /// Whether nothing at all is stored for the partition.
    pub fn is_empty(&self) -> bool {
        self.header.is_none() && self.rows.is_empty()
    }

    /// The stored bytes it holds.
    pub fn byte_len(&self) -> usize {
        self.header.as_ref().map_or(0, Bytes::len) + self.rows.iter().map(Bytes::len).sum::<usize>()
    }
}

impl Store {
    /// Every stored entry of one partition: the records of its key prefix, from one snapshot.
    pub(crate) fn read_raw_partition(
        &self,
        table: &TableId,
        token: i64,
        partition_key: &[u8],
    ) -> Result<RawPartition, StorageError> {
        let prefix = keycodec::partition_prefix(token, partition_key);
        let header_key = keycodec::header_key(&prefix);
        let mut row_prefix = prefix.clone();
        row_prefix.push(KIND_ROW);
        let hi = match keycodec::prefix_successor(&prefix) {
            Some(s) => Bound::Excluded(s),
            None => Bound::Unbounded,
        };
        let mut out = RawPartition::default();
        let mut bytes = 0usize;
        let range = (Bound::Included(prefix), hi);
        Self::visit_records(std::slice::from_ref(self), table, range, |key, value| {
            bytes += value.len();
            if bytes > MAX_RAW_PARTITION_BYTES {
                return Err(StorageError::TooLarge(
                    "partition too large to compare across replicas",
                ));
            }
            if key == header_key {
                out.header = Some(Bytes::copy_from_slice(value));
            } else if key.starts_with(&row_prefix) {
                out.rows.push(Bytes::copy_from_slice(value));
            }
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(out)
    }

    /// Converts a raw partition (from another replica) to storage form as streamed records
    /// are converted: every entry is decoded, so a malformed one is refused before anything
    /// is written, and row keys are encoded again from the rows' own clustering values.
    pub(crate) fn prepare_raw_partition(
        layout: &TableLayout,
        token: i64,
        partition_key: &[u8],
        raw: &RawPartition,
    ) -> Result<Prepared, StorageError> {
        let prefix = keycodec::partition_prefix(token, partition_key);
        if prefix.len() + 1 > MAX_KEY_LEN {
            return Err(StorageError::TooLarge("partition key too large"));
        }
        let mut commit = RawCommit::new(layout);
        if let Some(header) = &raw.header {
            commit.add(&prefix, token, KIND_HEADER, header, None)?;
        }
        for row in &raw.rows {
            commit.add(&prefix, token, KIND_ROW, row, None)?;
        }
        Ok(commit.finish())
    }
}
