//! Raw records of a token range of one table, out of the stores and into them: what moves
//! when a node's ranges stream to another node. Records travel as stored (partition headers
//! with their deletions and static rows, rows with their cell timestamps and tombstones), so
//! deletions move with the data, and an import merges them by timestamp like any write.

use super::commit::{Pending, Prepared};
use super::merge::MergedRange;
use super::tables::TablesRead;
use super::Store;
use crate::keycodec::{self, KIND_HEADER, KIND_ROW};
use crate::model::TableId;
use crate::row::{PartitionHeader, StoredRow};
use crate::StorageError;
use fjall::{Keyspace, Readable};
use std::collections::BTreeMap;
use std::ops::Bound;

/// One stored record of a table: its data key and its encoded value, as the store holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRecord {
    /// The data key (token, escaped partition key, kind, clustering bytes).
    pub key: Vec<u8>,
    /// The encoded partition header or row.
    pub value: Vec<u8>,
}

/// A chunk of a table's records in key order, and where the next chunk starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeChunk {
    /// Records in ascending key order.
    pub records: Vec<RawRecord>,
    /// The last key of this chunk when the range has more (resume strictly after it); `None`
    /// when the range is exhausted.
    pub resume_after: Option<Vec<u8>>,
}

impl RangeChunk {
    /// Bytes of keys and values in the chunk.
    pub fn byte_len(&self) -> usize {
        self.records
            .iter()
            .map(|r| r.key.len() + r.value.len())
            .sum()
    }
}

impl Store {
    /// Reads `table`'s records with keys in `(lo, hi)` (by key bytes, `lo` included unless
    /// `after` is given, then strictly after `after`) over every store in key order, until
    /// `max_bytes` of keys and values are gathered (at least one record).
    pub(crate) fn export_range(
        stores: &[Store],
        table: &TableId,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        max_bytes: usize,
    ) -> Result<RangeChunk, StorageError> {
        for store in stores {
            store.check_open()?;
        }
        let registries: Vec<TablesRead<'_>> = stores.iter().map(|s| s.tables.read()).collect();
        let keyspaces: Vec<Option<&Keyspace>> =
            registries.iter().map(|r| r.keyspace(table)).collect();
        let snapshots: Vec<fjall::Snapshot> = stores.iter().map(|s| s.db.snapshot()).collect();
        let range = (lo, hi);
        let merged = MergedRange::new(
            snapshots
                .iter()
                .zip(&keyspaces)
                .filter_map(|(snapshot, data)| data.map(|d| snapshot.range(d, range.clone())))
                .collect(),
        );
        let mut chunk = RangeChunk::default();
        let mut bytes = 0usize;
        for entry in merged {
            let (key, value) = entry?;
            if bytes >= max_bytes && !chunk.records.is_empty() {
                chunk.resume_after = chunk.records.last().map(|r| r.key.clone());
                break;
            }
            bytes += key.len() + value.len();
            chunk.records.push(RawRecord {
                key: key.to_vec(),
                value: value.to_vec(),
            });
        }
        Ok(chunk)
    }

    /// Converts raw records of `table` (all of this store's partitions) to a commit, checking
    /// that each key and value decodes. No lock held.
    pub(crate) fn prepare_raw_records(
        table: TableId,
        records: &[&RawRecord],
    ) -> Result<Prepared, StorageError> {
        let mut entries: BTreeMap<(TableId, Vec<u8>), Pending> = BTreeMap::new();
        let mut stripes = Vec::with_capacity(records.len());
        for record in records {
            if record.key.len() > keycodec::MAX_KEY_LEN {
                return Err(StorageError::TooLarge("streamed key too large"));
            }
            let (token, _, kind, _) = keycodec::split_data_key(&record.key)?;
            let stripe = Self::stripe_of(&table, token);
            stripes.push(stripe);
            let pending = match kind {
                KIND_HEADER => Pending::Header(PartitionHeader::decode_value(&record.value)?),
                KIND_ROW => Pending::Row {
                    row: StoredRow::decode_value(&record.value)?,
                    replaces_from: None,
                    stripe,
                },
                _ => return Err(StorageError::Corrupt("unknown kind in a streamed key")),
            };
            match (entries.get_mut(&(table, record.key.clone())), pending) {
                (Some(Pending::Header(h)), Pending::Header(incoming)) => h.merge(incoming),
                (Some(Pending::Row { row, .. }), Pending::Row { row: incoming, .. }) => {
                    row.merge(incoming)
                }
                (_, pending) => {
                    entries.insert((table, record.key.clone()), pending);
                }
            }
        }
        stripes.sort_unstable();
        stripes.dedup();
        Ok(Prepared {
            entries,
            stripes,
            tables: vec![table],
            gc_grace: Vec::new(),
        })
    }
}
