//! Token-ordered scans of a table over every store.

use super::merge::MergedRange;
use super::read::{read_header, MAX_READ_BYTES};
use super::tables::TablesRead;
use super::Store;
use crate::keycodec::{self, KIND_HEADER, KIND_ROW};
use crate::model::{PartitionRead, TableLayout};
use crate::row::{PartitionHeader, StoredRow};
use crate::{ScanPage, ScanStart, ScannedPartition, StorageError};
use bytes::Bytes;
use fjall::{Keyspace, Readable};
use std::ops::Bound;

impl Store {
    /// Token-ordered scan of a table from `start` up to `end` (token bound), returning at most
    /// `row_limit` rows in total (a partition with only a static row counts as 1), and about
    /// [`MAX_READ_BYTES`] of them, and where to resume.
    ///
    /// A resumed partition (`ScanStart::Resume`) is returned with its static row, for the
    /// caller to fill static columns, but only when it still has rows; its static row alone
    /// does not count again.
    /// `stores` are all the stores of a table's data (each key lives in one of them, and
    /// the scan merges their ranges in key order); `resume_in` is the index of the store
    /// that owns a resumed partition.
    pub(crate) fn scan(
        stores: &[Store],
        resume_in: usize,
        layout: &TableLayout,
        start: &ScanStart,
        end: Bound<i64>,
        row_limit: usize,
        now_secs: u32,
    ) -> Result<ScanPage, StorageError> {
        for store in stores {
            store.check_open()?;
        }
        // Every store is set alike (`Storage::set_tombstone_failure_threshold`).
        let threshold = stores
            .first()
            .map_or(super::DEFAULT_TOMBSTONE_FAILURE_THRESHOLD, |s| {
                s.tombstone_failure_threshold()
            });
        // One registry guard per store, in store order (each store has its own lock).
        let registries: Vec<TablesRead<'_>> = stores.iter().map(|s| s.tables.read()).collect();
        let keyspaces: Vec<Option<&Keyspace>> =
            registries.iter().map(|r| r.keyspace(&layout.id)).collect();
        let snapshots: Vec<fjall::Snapshot> = stores.iter().map(|s| s.db.snapshot()).collect();
        let token_key = |t: i64| keycodec::token_bytes(t).to_vec();
        let hi: Option<Vec<u8>> = match end {
            Bound::Unbounded => None,
            Bound::Excluded(t) => Some(token_key(t)),
            Bound::Included(t) => t.checked_add(1).map(token_key),
        };
        // The partition being assembled (a resumed one starts the page).
        let mut current: Option<ScanCursor> = None;
        let lo: Vec<u8> = match start {
            ScanStart::Token(Bound::Unbounded) => Vec::new(),
            ScanStart::Token(Bound::Included(t)) => token_key(*t),
            ScanStart::Token(Bound::Excluded(t)) => match t.checked_add(1) {
                Some(n) => token_key(n),
                None => return Ok(ScanPage::default()),
            },
            ScanStart::Resume {
                token,
                partition_key,
                after,
            } => {
                let prefix = keycodec::partition_prefix(*token, partition_key);
                let (snapshot, data) = snapshots
                    .get(resume_in)
                    .zip(keyspaces.get(resume_in))
                    .ok_or(StorageError::Corrupt("resumed partition in no store"))?;
                let header = match data {
                    Some(data) => read_header(snapshot, data, &keycodec::header_key(&prefix))?,
                    // Dropped or truncated since the last page: nothing left to read.
                    None => PartitionHeader::default(),
                };
                let mut lo = prefix.clone();
                lo.push(KIND_ROW);
                if let Some(ck) = after {
                    keycodec::encode_clustering(&layout.clustering, ck, &mut lo)?;
                    lo.push(0x00);
                }
                current = Some(ScanCursor::new(
                    prefix,
                    *token,
                    partition_key.clone(),
                    header,
                    now_secs,
                ));
                lo
            }
        };
        if hi.as_ref().is_some_and(|h| &lo >= h) {
            return Ok(ScanPage::default());
        }
        let upper = match hi {
            Some(h) => Bound::Excluded(h),
            None => Bound::Unbounded,
        };

        let mut page = ScanPage::default();
        let mut rows_out = 0usize;
        let mut bytes = 0usize;
        let mut dead = 0usize;
        // Position after the last item returned: (token, partition key, last clustering key).
        let mut last_pos: Option<(i64, Bytes, Option<Vec<Bytes>>)> = None;
        let mut stopped = false;
        let range = (Bound::Included(lo), upper);
        let merged = MergedRange::new(
            snapshots
                .iter()
                .zip(&keyspaces)
                .filter_map(|(snapshot, data)| data.map(|d| snapshot.range(d, range.clone())))
                .collect(),
        );
        for entry in merged {
            let (key, value) = entry?;
            // Escaped partition keys are prefix-free: a key that starts with the current
            // partition's prefix belongs to it, and needs no decoding.
            let same = current
                .as_ref()
                .filter(|c| key.starts_with(&c.prefix))
                .map(|c| c.prefix.len());
            let (kind, clustering) = match same {
                Some(n) => match key.get(n..) {
                    Some([kind, rest @ ..]) => (*kind, rest),
                    _ => return Err(StorageError::Corrupt("data key without kind")),
                },
                None => {
                    if let Some(done) = current.take() {
                        page.partitions.extend(done.finish());
                    }
                    let (token, pk, kind, clustering) = keycodec::split_data_key(&key)?;
                    let prefix_len = key.len() - clustering.len() - 1;
                    let header = if kind == KIND_HEADER {
                        PartitionHeader::decode_stored(value.clone())?
                    } else {
                        PartitionHeader::default()
                    };
                    let prefix = key.get(..prefix_len).unwrap_or(&[]).to_vec();
                    current = Some(ScanCursor::new(
                        prefix,
                        token,
                        Bytes::from(pk),
                        header,
                        now_secs,
                    ));
                    (kind, clustering)
                }
            };
            let Some(c) = current.as_mut() else {
                return Err(StorageError::Corrupt("scan lost its partition"));
            };
            if same.is_none() {
                if c.read.static_row.is_some() {
                    // A partition whose static row is live is at least one result row.
                    if rows_out >= row_limit {
                        stopped = true;
                        break;
                    }
                    rows_out += 1;
                    c.static_counted = true;
                    c.static_slot_free = true;
                    last_pos = Some((c.token, c.partition_key.clone(), None));
                }
                if kind == KIND_HEADER {
                    if !c.static_counted {
                        // A header that yields nothing (a deleted partition) is dead weight.
                        dead += 1;
                        if dead > threshold {
                            return Err(StorageError::TooManyTombstones);
                        }
                    }
                    continue;
                }
            }
            if kind != KIND_ROW {
                return Err(StorageError::Corrupt("unexpected entry kind in data key"));
            }
            let value_len = value.len();
            let row = StoredRow::decode_stored(value)?;
            match row.live_view(c.header.deletion_for(clustering), now_secs) {
                Some(view) => {
                    if c.static_slot_free {
                        // The static row was counted as this partition's row; its first
                        // live row takes that place.
                        c.static_slot_free = false;
                    } else if rows_out >= row_limit || (bytes >= MAX_READ_BYTES && rows_out > 0) {
                        c.read.more = true;
                        stopped = true;
                        break;
                    } else {
                        rows_out += 1;
                    }
                    bytes += value_len;
                    last_pos = Some((
                        c.token,
                        c.partition_key.clone(),
                        Some(view.clustering.clone()),
                    ));
                    c.read.rows.push(view);
                }
                None => {
                    dead += 1;
                    if dead > threshold {
                        return Err(StorageError::TooManyTombstones);
                    }
                }
            }
        }
        if let Some(done) = current.take() {
            page.partitions.extend(done.finish());
        }
        if stopped {
            page.next = Some(match last_pos {
                Some((token, partition_key, after)) => ScanStart::Resume {
                    token,
                    partition_key,
                    after,
                },
                // Nothing returned (a zero limit): resume where this page started.
                None => start.clone(),
            });
        }
        Ok(page)
    }
}

/// A partition being assembled by `scan`.
struct ScanCursor {
    prefix: Vec<u8>,
    header: PartitionHeader,
    token: i64,
    partition_key: Bytes,
    read: PartitionRead,
    /// The live static row was counted as one result row.
    static_counted: bool,
    /// That count has not yet been taken over by a live clustering row.
    static_slot_free: bool,
}

impl ScanCursor {
    /// A cursor for the partition with this key prefix. For a resumed partition the
    /// static row is attached (to fill static columns) but not counted.
    fn new(
        prefix: Vec<u8>,
        token: i64,
        partition_key: Bytes,
        header: PartitionHeader,
        now_secs: u32,
    ) -> ScanCursor {
        let static_row = header
            .static_row
            .as_ref()
            .and_then(|s| s.live_view(header.deletion, now_secs));
        ScanCursor {
            prefix,
            header,
            token,
            partition_key,
            read: PartitionRead {
                static_row,
                rows: Vec::new(),
                more: false,
            },
            static_counted: false,
            static_slot_free: false,
        }
    }

    /// The partition to return, if it contributes rows (or is a counted static-only row).
    fn finish(self) -> Option<ScannedPartition> {
        (self.static_counted || !self.read.rows.is_empty()).then_some(ScannedPartition {
            token: self.token,
            partition_key: self.partition_key,
            read: self.read,
        })
    }
}
