//! Conditional commits (lightweight transactions): the condition is read and evaluated
//! under the partition's stripe locks, the same locks every plain write to it takes, so no
//! write lands between the check and the write. The durability wait happens after the
//! locks are released, so concurrent conditional commits share a group fsync.

use super::{Prepared, Store};
use crate::model::{ClusteringSlice, PartitionRead, TableLayout};
use crate::StorageError;

/// One read a condition needs, in the partition being written.
#[derive(Debug, Clone)]
pub struct ConditionRead<'a> {
    /// The table read (the partition's table).
    pub layout: &'a TableLayout,
    /// The rows read: typically the one row the condition checks.
    pub slice: ClusteringSlice,
    /// Most rows returned.
    pub limit: usize,
}

/// What a conditional commit did, store-side.
pub(crate) struct StoreConditional {
    /// The commit's sequence number when the condition held (and it wrote).
    pub(crate) seq: Option<u64>,
    /// The reads, in the order asked.
    pub(crate) reads: Vec<PartitionRead>,
    /// The timestamp the write's `provisional` one became (moved above what is stored).
    pub(crate) timestamp: Option<i64>,
}

impl Store {
    /// Takes the stripe locks of `prepared` and of the reads' partition, reads `reads`,
    /// and commits `prepared` only if `condition` holds on them. With `provisional`, the
    /// timestamp every cell of `prepared` was made with, the write is moved so that it
    /// is above every timestamp stored in the locked stripes (ordered after all it read).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn commit_conditional(
        &self,
        mut prepared: Prepared,
        token: i64,
        partition_key: &[u8],
        reads: &[ConditionRead<'_>],
        now_secs: u32,
        provisional: Option<i64>,
        condition: impl FnOnce(&[PartitionRead]) -> bool,
    ) -> Result<StoreConditional, StorageError> {
        for read in reads {
            prepared
                .stripes
                .push(Self::stripe_of(&read.layout.id, token));
            if !prepared.tables.contains(&read.layout.id) {
                prepared.tables.push(read.layout.id);
            }
        }
        prepared.stripes.sort_unstable();
        prepared.stripes.dedup();
        prepared.tables.sort_unstable();
        let mut out = StoreConditional {
            seq: None,
            reads: Vec::with_capacity(reads.len()),
            timestamp: None,
        };
        let found = &mut out.reads;
        let assigned = &mut out.timestamp;
        let check = Box::new(|registry: &super::tables::TablesRead<'_>, newest: i64| {
            for read in reads {
                found.push(self.read_partition_in(
                    registry,
                    read.layout,
                    token,
                    partition_key,
                    &read.slice,
                    None,
                    read.limit,
                    now_secs,
                )?);
            }
            if !condition(found) {
                return Ok(None);
            }
            let Some(provisional) = provisional else {
                return Ok(Some(0));
            };
            let timestamp = provisional.max(newest.saturating_add(1));
            debug_assert!(timestamp > newest || newest == i64::MAX);
            *assigned = Some(timestamp);
            Ok(Some(timestamp - provisional))
        });
        out.seq = self.commit_checked(prepared, None, Some(check))?;
        Ok(out)
    }
}
