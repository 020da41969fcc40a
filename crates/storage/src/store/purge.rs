//! Physical removal of the rows that a partition's deletions shadow.

use super::read::full_range;
use super::{io, Store};
use crate::keycodec::{ByteRange, KIND_ROW};
use crate::model::TableId;
use crate::row::{PartitionHeader, StoredRow};
use crate::StorageError;
use fjall::Keyspace;
use std::ops::Bound;

/// Most rows one `commit` examines to purge what a new deletion shadows; the rest stays
/// (hidden by the deletion) until a later deletion of the partition purges it.
const PURGE_ROWS_PER_APPLY: usize = 16_384;

/// Rows examined per stripe-lock hold while purging (bounds the lock hold time).
const PURGE_CHUNK: usize = 256;

impl Store {
    /// Physically removes the rows of a partition that its header's deletions shadow
    /// entirely (every timestamp in the row at or below the covering deletion). Reads
    /// already skip them; removing them keeps deleted partitions from growing without
    /// bound and from filling reads with dead rows. Safe at any time: the header keeps
    /// the deletion, so a late write under it stays hidden, and a header's deletions only
    /// ever grow, so an older copy of it is conservative. Runs in chunks, each under the
    /// partition's stripe lock (a concurrent write to a row cannot be lost), only over
    /// `range` (where the new deletion applies), and stops after `PURGE_ROWS_PER_APPLY`
    /// rows so that one delete does bounded work. `keyspace` is `table`'s, borrowed from the
    /// registry by the caller.
    pub(super) fn purge_shadowed_rows(
        &self,
        table: &TableId,
        keyspace: &Keyspace,
        prefix: &[u8],
        header: &PartitionHeader,
        range: &ByteRange,
    ) -> Result<(), StorageError> {
        let stripe = Self::stripe_of_key(table, prefix)?;
        let mut row_prefix = prefix.to_vec();
        row_prefix.push(KIND_ROW);
        let (mut from, end) = full_range(&row_prefix, range);
        let mut examined = 0usize;
        while examined < PURGE_ROWS_PER_APPLY {
            let _guard = self.stripes[stripe]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut batch = self.db.batch();
            let mut seen = 0usize;
            for guard in keyspace
                .range((from.clone(), end.clone()))
                .take(PURGE_CHUNK)
            {
                let (key, value) = guard.into_inner().map_err(io)?;
                seen += 1;
                let clustering = key.get(row_prefix.len()..).unwrap_or(&[]);
                let row = StoredRow::decode_value(&value)?;
                if header
                    .deletion_for(clustering)
                    .is_some_and(|d| row.max_timestamp() <= d)
                {
                    batch.remove(keyspace, key.clone());
                }
                from = Bound::Excluded(key.to_vec());
            }
            batch.commit().map_err(io)?;
            examined += seen;
            if seen < PURGE_CHUNK {
                break;
            }
        }
        Ok(())
    }
}
