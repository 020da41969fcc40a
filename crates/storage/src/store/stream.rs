//! Raw records of a table, out of the stores and into them: a token range's records when a
//! node's ranges stream to another node, and one partition's records when replicas compare
//! and repair it (`raw.rs`). Records travel as stored (partition headers with their deletions
//! and static rows, rows with their cell timestamps and tombstones), so deletions move with
//! the data, and an import merges them by timestamp like any write.

use super::commit::{Pending, Prepared};
use super::merge::MergedRange;
use super::tables::TablesRead;
use super::Store;
use crate::keycodec::{self, KIND_HEADER, KIND_ROW, MAX_KEY_LEN};
use crate::model::{TableId, TableLayout};
use crate::row::{PartitionHeader, StoredRow};
use crate::StorageError;
use fjall::{Keyspace, Readable};
use std::collections::BTreeMap;
use std::ops::{Bound, ControlFlow};

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

/// A key range of data keys, by key bytes.
pub(super) type KeyRange = (Bound<Vec<u8>>, Bound<Vec<u8>>);

impl Store {
    /// Hands `visit` each of `table`'s records (key, value) with keys in `range`, over every
    /// store of `stores` in key order, each store read from one snapshot, until it breaks.
    pub(super) fn visit_records(
        stores: &[Store],
        table: &TableId,
        range: KeyRange,
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<ControlFlow<()>, StorageError>,
    ) -> Result<(), StorageError> {
        for store in stores {
            store.check_open()?;
        }
        let registries: Vec<TablesRead<'_>> = stores.iter().map(|s| s.tables.read()).collect();
        let keyspaces: Vec<Option<&Keyspace>> =
            registries.iter().map(|r| r.keyspace(table)).collect();
        let snapshots: Vec<fjall::Snapshot> = stores.iter().map(|s| s.db.snapshot()).collect();
        let merged = MergedRange::new(
            snapshots
                .iter()
                .zip(&keyspaces)
                .filter_map(|(snapshot, data)| data.map(|d| snapshot.range(d, range.clone())))
                .collect(),
        );
        for entry in merged {
            let (key, value) = entry?;
            if visit(&key, &value)?.is_break() {
                break;
            }
        }
        Ok(())
    }

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
        let mut chunk = RangeChunk::default();
        let mut bytes = 0usize;
        Self::visit_records(stores, table, (lo, hi), |key, value| {
            if bytes >= max_bytes && !chunk.records.is_empty() {
                chunk.resume_after = chunk.records.last().map(|r| r.key.clone());
                return Ok(ControlFlow::Break(()));
            }
            bytes += key.len() + value.len();
            chunk.records.push(RawRecord {
                key: key.to_vec(),
                value: value.to_vec(),
            });
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(chunk)
    }

    /// Converts raw records of the table `layout` describes (all of this store's partitions)
    /// to a commit, checking that each key and value decodes and that each key is the one
    /// its value gives. No lock held.
    pub(crate) fn prepare_raw_records(
        layout: &TableLayout,
        records: &[&RawRecord],
    ) -> Result<Prepared, StorageError> {
        let mut commit = RawCommit::new(layout);
        for record in records {
            if record.key.len() > MAX_KEY_LEN {
                return Err(StorageError::TooLarge("streamed key too large"));
            }
            let (token, _, kind, clustering) = keycodec::split_data_key(&record.key)?;
            let prefix = &record.key[..record.key.len() - clustering.len() - 1];
            commit.add(prefix, token, kind, &record.value, Some(&record.key))?;
        }
        Ok(commit.finish())
    }
}

/// Raw records of one table gathered into one commit: each value decoded by its kind, so
/// that a malformed one refuses the whole commit before anything is written, and records
/// of one key merged.
pub(super) struct RawCommit<'a> {
    layout: &'a TableLayout,
    entries: BTreeMap<(TableId, Vec<u8>), Pending>,
    stripes: Vec<usize>,
}

impl<'a> RawCommit<'a> {
    /// An empty commit to the table `layout` describes.
    pub(super) fn new(layout: &'a TableLayout) -> RawCommit<'a> {
        RawCommit {
            layout,
            entries: BTreeMap::new(),
            stripes: Vec::new(),
        }
    }

    /// Adds the record of kind `kind` with `value` to the partition whose key prefix (token,
    /// escaped partition key) is `prefix`. Its key is encoded again from the value (a row's
    /// own clustering values) and must equal `given_key` when the record came with one.
    pub(super) fn add(
        &mut self,
        prefix: &[u8],
        token: i64,
        kind: u8,
        value: &[u8],
        given_key: Option<&[u8]>,
    ) -> Result<(), StorageError> {
        let stripe = Store::stripe_of(&self.layout.id, token);
        let (key, pending) = match kind {
            KIND_HEADER => (
                keycodec::header_key(prefix),
                Pending::Header(PartitionHeader::decode_value(value)?),
            ),
            KIND_ROW => {
                let row = StoredRow::decode_value(value)?;
                if row.clustering.len() != self.layout.clustering.len() {
                    return Err(StorageError::Corrupt(
                        "row clustering key does not match the table layout",
                    ));
                }
                let mut key = Vec::with_capacity(prefix.len() + 1 + 32);
                key.extend_from_slice(prefix);
                key.push(KIND_ROW);
                keycodec::encode_clustering(&self.layout.clustering, &row.clustering, &mut key)?;
                let pending = Pending::Row {
                    row,
                    replaces_from: None,
                    stripe,
                    encoded: None,
                    merged: None,
                };
                (key, pending)
            }
            _ => return Err(StorageError::Corrupt("unknown kind in a raw record's key")),
        };
        if key.len() > MAX_KEY_LEN {
            return Err(StorageError::TooLarge("clustering key too large"));
        }
        if given_key.is_some_and(|given| given != key) {
            return Err(StorageError::Corrupt(
                "a raw record's key is not the one its value gives",
            ));
        }
        self.stripes.push(stripe);
        let table = self.layout.id;
        match (self.entries.get_mut(&(table, key.clone())), pending) {
            (Some(Pending::Header(h)), Pending::Header(incoming)) => h.merge(incoming),
            (Some(Pending::Row { row, .. }), Pending::Row { row: incoming, .. }) => {
                row.merge(incoming)
            }
            (_, pending) => {
                self.entries.insert((table, key), pending);
            }
        }
        Ok(())
    }

    /// The commit of every record added, with the table's gc_grace_seconds.
    pub(super) fn finish(mut self) -> Prepared {
        self.stripes.sort_unstable();
        self.stripes.dedup();
        Prepared {
            entries: self.entries,
            stripes: self.stripes,
            tables: vec![self.layout.id],
            gc_grace: vec![(self.layout.id, self.layout.gc_grace_seconds)],
        }
    }
}
