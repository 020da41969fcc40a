//! A partition exactly as it is stored, deletions included: what replicas compare (a read's
//! digest) and exchange (read repair). Merging only live cells would resurrect deleted data,
//! so repair ships and merges the stored entries themselves.

use super::commit::{Pending, Prepared};
use super::{io, Store};
use crate::keycodec::{self, KIND_ROW, MAX_KEY_LEN};
use crate::model::TableLayout;
use crate::row::{PartitionHeader, StoredRow};
use crate::StorageError;
use bytes::Bytes;
use fjall::Readable;
use std::collections::BTreeMap;
use std::ops::Bound;

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
    /// Every stored entry of one partition, from one snapshot.
    pub(crate) fn read_raw_partition(
        &self,
        table: &[u8; 16],
        token: i64,
        partition_key: &[u8],
    ) -> Result<RawPartition, StorageError> {
        self.check_open()?;
        let registry = self.tables.read();
        let Some(data) = registry.keyspace(table) else {
            return Ok(RawPartition::default());
        };
        let snapshot = self.db.snapshot();
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
        for entry in snapshot.range(data, (Bound::Included(prefix), hi)) {
            let (key, value) = entry.into_inner().map_err(io)?;
            bytes += value.len();
            if bytes > MAX_RAW_PARTITION_BYTES {
                return Err(StorageError::TooLarge(
                    "partition too large to compare across replicas",
                ));
            }
            if *key == header_key[..] {
                out.header = Some(Bytes::copy_from_slice(&value));
            } else if key.starts_with(&row_prefix) {
                out.rows.push(Bytes::copy_from_slice(&value));
            }
        }
        Ok(out)
    }

    /// Converts a raw partition (from another replica) to storage form: every entry is
    /// decoded, so a malformed one is refused before anything is written, and row keys are
    /// encoded again from the rows' own clustering values.
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
        let stripe = Self::stripe_of(&layout.id, token);
        let mut entries = BTreeMap::new();
        if let Some(h) = &raw.header {
            let header = PartitionHeader::decode_value(h)?;
            entries.insert(
                (layout.id, keycodec::header_key(&prefix)),
                Pending::Header(header),
            );
        }
        for value in &raw.rows {
            let row = StoredRow::decode_value(value)?;
            if row.clustering.len() != layout.clustering.len() {
                return Err(StorageError::Corrupt(
                    "row clustering key does not match the table layout",
                ));
            }
            let mut key = prefix.clone();
            key.push(KIND_ROW);
            keycodec::encode_clustering(&layout.clustering, &row.clustering, &mut key)?;
            if key.len() > MAX_KEY_LEN {
                return Err(StorageError::TooLarge("clustering key too large"));
            }
            match entries.get_mut(&(layout.id, key.clone())) {
                Some(Pending::Row { row: existing, .. }) => existing.merge(row),
                _ => {
                    entries.insert(
                        (layout.id, key),
                        Pending::Row {
                            row,
                            replaces_from: None,
                            stripe,
                        },
                    );
                }
            }
        }
        Ok(Prepared {
            entries,
            stripes: vec![stripe],
            tables: vec![layout.id],
            gc_grace: vec![(layout.id, layout.gc_grace_seconds)],
        })
    }
}
