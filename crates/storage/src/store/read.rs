//! Point reads of one partition.

use super::tables::TablesRead;
use super::{io, Store};
use crate::keycodec::{self, ByteRange, KIND_ROW};
use crate::model::{ClusteringSlice, PartitionRead, TableLayout};
use crate::row::{PartitionHeader, StoredRow};
use crate::StorageError;
use bytes::Bytes;
use fjall::{Keyspace, Readable};
use std::ops::Bound;

/// Most dead entries (tombstoned or expired rows) one read may step over before it fails
/// unless configured otherwise: Cassandra's tombstone_failure_threshold default. A read's
/// cost stays bounded.
pub const DEFAULT_TOMBSTONE_FAILURE_THRESHOLD: usize = 100_000;

/// Most stored row bytes one partition read or scan page returns, whatever its row limit:
/// past it the read stops (at least one row returned) and says there is more, so that a
/// partition of big rows is read in pieces of bounded memory, never whole.
pub const MAX_READ_BYTES: usize = 4 << 20;

impl Store {
    /// `after` (a full clustering key) when given, at most `limit` rows and about
    /// [`MAX_READ_BYTES`] of them. TTL-expired cells and rows are not returned (`now_secs` = now
    /// as epoch seconds).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_partition(
        &self,
        layout: &TableLayout,
        token: i64,
        partition_key: &[u8],
        slice: &ClusteringSlice,
        after: Option<&[Bytes]>,
        limit: usize,
        now_secs: u32,
    ) -> Result<PartitionRead, StorageError> {
        self.check_open()?;
        let registry = self.tables.read();
        self.read_partition_in(
            &registry,
            layout,
            token,
            partition_key,
            slice,
            after,
            limit,
            now_secs,
        )
    }

    /// [`Store::read_partition`] under a registry read side the caller already holds (a
    /// conditional commit reads under it: taking it again could wait behind a TRUNCATE).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_partition_in(
        &self,
        registry: &TablesRead<'_>,
        layout: &TableLayout,
        token: i64,
        partition_key: &[u8],
        slice: &ClusteringSlice,
        after: Option<&[Bytes]>,
        limit: usize,
        now_secs: u32,
    ) -> Result<PartitionRead, StorageError> {
        let Some(data) = registry.keyspace(&layout.id) else {
            // Never written in this store, or dropped.
            return Ok(PartitionRead {
                static_row: None,
                rows: Vec::new(),
                more: false,
            });
        };
        let snapshot = self.db.snapshot();
        let prefix = keycodec::partition_prefix(token, partition_key);

        let mut ranges = Vec::with_capacity(slice.ranges.len());
        let resume = match after {
            Some(ck) => Some(keycodec::clustering_bytes(&layout.clustering, ck)?),
            None => None,
        };
        for (start, end) in &slice.ranges {
            // A full primary key (or a table without clustering columns) is a point read:
            // a `get` uses the bloom filters and skips building a range iterator. Its header
            // is a second `get`: two cost less than one range over both (see
            // docs/decisions/2026-11-26-point-reads-in-one-seek.md).
            let point = match (start, end) {
                (Bound::Included(a), Bound::Included(b))
                    if a == b && a.len() == layout.clustering.len() && !a.is_empty() =>
                {
                    Some(keycodec::clustering_bytes(&layout.clustering, a)?)
                }
                (Bound::Unbounded, Bound::Unbounded) if layout.clustering.is_empty() => {
                    Some(Vec::new())
                }
                _ => None,
            };
            let mut range = keycodec::prefix_bounds_to_range(&layout.clustering, start, end)?;
            if let Some(ck) = &resume {
                let cut = if slice.reversed {
                    ByteRange {
                        lo: None,
                        hi: Some(ck.clone()),
                    }
                } else {
                    // The smallest key after a full key: full keys are prefix-free.
                    let mut lo = ck.clone();
                    lo.push(0x00);
                    ByteRange {
                        lo: Some(lo),
                        hi: None,
                    }
                };
                range = range.intersect(&cut);
            }
            if !range.is_empty() {
                match point {
                    // The `after` cut removed the point: nothing to read in this range.
                    Some(k) if !range.contains(&k) => {}
                    _ => ranges.push((range, point)),
                }
            }
        }
        ranges.sort_by(|(a, _), (b, _)| match (&a.lo, &b.lo) {
            (None, None) => std::cmp::Ordering::Equal,
            (None, Some(_)) => std::cmp::Ordering::Less,
            (Some(_), None) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => x.cmp(y),
        });
        if slice.reversed {
            ranges.reverse();
        }

        // The header key sorts just before the partition's first row: a forward read that
        // starts there takes the header from its own range instead of a second lookup
        // (which would search every memtable and consult every table's filter again).
        let header_in_range =
            !slice.reversed && matches!(ranges.first(), Some((r, None)) if r.lo.is_none());
        let header_key = keycodec::header_key(&prefix);
        let mut row_prefix = prefix;
        row_prefix.push(KIND_ROW);
        // A table without clustering columns has at most one row per partition, the key
        // right after its header: a point read takes both in one pass (one memtable search,
        // one visit of each disk table's run) instead of two `get`s.
        let mut row_read_with_header = None;
        let mut header = if header_in_range {
            PartitionHeader::default()
        } else if let ([(_, Some(k))], true) = (&ranges[..], layout.clustering.is_empty()) {
            debug_assert!(
                k.is_empty(),
                "a table without clustering has empty row keys"
            );
            let (header, row) = snapshot
                .get_pair(data, &header_key, &row_prefix)
                .map_err(io)?;
            row_read_with_header = Some(row);
            match header {
                Some(v) => PartitionHeader::decode_value(&v)?,
                None => PartitionHeader::default(),
            }
        } else {
            read_header(&snapshot, data, &header_key)?
        };
        let mut out = PartitionRead {
            static_row: None,
            rows: Vec::new(),
            more: false,
        };
        let mut dead = 0usize;
        let mut bytes = 0usize;
        'ranges: for (i, (range, point)) in ranges.iter().enumerate() {
            let with_header = header_in_range && i == 0;
            let iter = match point {
                Some(k) => {
                    let found = match row_read_with_header.take() {
                        Some(found) => found,
                        None => {
                            let mut key = row_prefix.clone();
                            key.extend_from_slice(k);
                            snapshot.get(data, &key).map_err(io)?
                        }
                    };
                    // The key is rebuilt only when the row exists (the loop reads its
                    // clustering from it).
                    RangeEntries::Point(found.map(|v| {
                        let key = if k.is_empty() {
                            fjall::UserKey::from(&row_prefix[..])
                        } else {
                            let mut key = row_prefix.clone();
                            key.extend_from_slice(k);
                            fjall::UserKey::from(key)
                        };
                        (key, v)
                    }))
                }
                None => {
                    // Within one partition's prefix: the disk tables whose prefix filter
                    // lacks the partition are skipped.
                    let (mut lo, hi) = full_range(&row_prefix, range);
                    if with_header {
                        lo = Bound::Included(header_key.clone());
                    }
                    let iter = snapshot
                        .range(data, (lo, hi))
                        .map(|g| g.into_inner().map_err(io));
                    if slice.reversed {
                        RangeEntries::Range(Box::new(iter.rev()))
                    } else {
                        RangeEntries::Range(Box::new(iter))
                    }
                }
            };
            for entry in iter {
                let (key, value) = entry?;
                if with_header && *key == header_key[..] {
                    header = PartitionHeader::decode_stored(value)?;
                    continue;
                }
                let clustering = key.get(row_prefix.len()..).unwrap_or(&[]);
                let value_len = value.len();
                let row = StoredRow::decode_stored(value)?;
                match row.live_view(header.deletion_for(clustering), now_secs) {
                    Some(view) => {
                        if out.rows.len() >= limit
                            || (bytes >= MAX_READ_BYTES && !out.rows.is_empty())
                        {
                            out.more = true;
                            break 'ranges;
                        }
                        bytes += value_len;
                        out.rows.push(view);
                    }
                    None => {
                        dead += 1;
                        if dead > self.tombstone_failure_threshold() {
                            return Err(StorageError::TooManyTombstones);
                        }
                    }
                }
            }
        }
        out.static_row = header
            .static_row
            .as_ref()
            .and_then(|s| s.live_view(header.deletion, now_secs));
        Ok(out)
    }
}

/// An entry of a partition read: a data key and its value.
type Entry = Result<(fjall::UserKey, fjall::UserValue), StorageError>;

/// The entries of one clustering range of a read: a point read's one entry, or a range
/// iterator (boxed: forward and reversed differ in type). A point read allocates no box.
enum RangeEntries<'a> {
    /// A point read's entry, taken once.
    Point(Option<(fjall::UserKey, fjall::UserValue)>),
    /// A range's entries in read order.
    Range(Box<dyn Iterator<Item = Entry> + 'a>),
}

impl Iterator for RangeEntries<'_> {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        match self {
            RangeEntries::Point(entry) => entry.take().map(Ok),
            RangeEntries::Range(iter) => iter.next(),
        }
    }
}

/// Reads and decodes a partition header (absent = empty) by its key
/// ([`keycodec::header_key`]).
pub(super) fn read_header(
    snapshot: &fjall::Snapshot,
    data: &Keyspace,
    header_key: &[u8],
) -> Result<PartitionHeader, StorageError> {
    match snapshot.get(data, header_key).map_err(io)? {
        Some(v) => PartitionHeader::decode_stored(v),
        None => Ok(PartitionHeader::default()),
    }
}

/// The fjall key range of a clustering byte range within one partition's rows.
pub(super) fn full_range(row_prefix: &[u8], range: &ByteRange) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let with = |suffix: &[u8]| {
        let mut k = Vec::with_capacity(row_prefix.len() + suffix.len());
        k.extend_from_slice(row_prefix);
        k.extend_from_slice(suffix);
        k
    };
    let lo = Bound::Included(with(range.lo.as_deref().unwrap_or(&[])));
    let hi = match &range.hi {
        Some(h) => Bound::Excluded(with(h)),
        // The end of this partition's rows: the successor of the row prefix.
        None => match keycodec::prefix_successor(row_prefix) {
            Some(s) => Bound::Excluded(s),
            None => Bound::Unbounded,
        },
    };
    (lo, hi)
}
