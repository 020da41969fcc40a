//! Tombstone GC: a compaction filter on every table keyspace that purges tombstones and
//! expired TTL cells older than the table's gc_grace_seconds (`GcHorizon`).
//!
//! Each stored key holds its row's whole merged state, so a row's tombstones only shadow
//! that row: a row left empty becomes an engine tombstone (`Verdict::Remove`), which keeps
//! shadowing any older version of the key in disk tables this compaction does not see, and
//! the engine drops it itself at the last level. A partition header's deletion and range
//! tombstones shadow other keys, which this filter cannot see (the header comes first, and
//! its rows may sit in other disk tables or a memtable): it keeps them and asks the purger
//! (`purge.rs`) to drop them, which it does under the partition's lock once no row they
//! shadow is left.

use super::purge::{PurgeInbox, PurgeJob};
use crate::keycodec::{self, ByteRange, KIND_HEADER, KIND_ROW};
use crate::model::TableId;
use crate::row::{GcHorizon, PartitionHeader, Purge, StoredRow};
use fjall::compaction::filter::{
    CompactionFilter, CompactionFilterResult, Context, Factory, ItemAccessor, Verdict,
};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The gc_grace_seconds and table id of the table each keyspace of a store holds, by
/// keyspace name. Writes note their table's; a keyspace with none noted yet (after a
/// restart, before its first write) is not purged.
#[derive(Default)]
pub(super) struct GcGraces(RwLock<HashMap<String, (u32, TableId)>>);

impl GcGraces {
    /// Records `seconds` for `keyspace`, which holds `table` (a read-lock check first: it
    /// rarely changes).
    pub(super) fn note(&self, keyspace: &str, table: TableId, seconds: u32) {
        let known = self
            .0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(keyspace)
            .copied();
        if known != Some((seconds, table)) {
            self.0
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(keyspace.to_owned(), (seconds, table));
        }
    }

    /// Forgets a keyspace that no table uses any more.
    pub(super) fn forget(&self, keyspace: &str) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(keyspace);
    }

    /// The gc grace noted for `keyspace`.
    pub(super) fn get(&self, keyspace: &str) -> Option<u32> {
        self.entry(keyspace).map(|(seconds, _)| seconds)
    }

    fn entry(&self, keyspace: &str) -> Option<(u32, TableId)> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(keyspace)
            .copied()
    }
}

/// Makes one [`GcFilter`] per compaction of one table keyspace.
pub(super) struct GcFilterFactory {
    graces: Arc<GcGraces>,
    inbox: Arc<PurgeInbox>,
    keyspace: String,
}

impl GcFilterFactory {
    /// The factory of `keyspace`, reading its grace from `graces` and asking the purger
    /// through `inbox` to drop header deletions past it.
    pub(super) fn new(
        graces: Arc<GcGraces>,
        inbox: Arc<PurgeInbox>,
        keyspace: &str,
    ) -> GcFilterFactory {
        GcFilterFactory {
            graces,
            inbox,
            keyspace: keyspace.to_owned(),
        }
    }
}

impl Factory for GcFilterFactory {
    fn name(&self) -> &str {
        "sluice-tombstone-gc"
    }

    fn make_filter(&self, _ctx: &Context) -> Box<dyn CompactionFilter> {
        let noted = self.graces.entry(&self.keyspace);
        Box::new(GcFilter {
            horizon: noted.map(|(grace, _)| GcHorizon::new(now_secs(), grace)),
            requests: noted.map(|(_, table)| (table, self.inbox.clone())),
        })
    }
}

/// Seconds since the epoch (0 if the clock is before it: nothing is then purgeable).
pub(super) fn now_secs() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
}

/// Purges what is behind `horizon` (nothing when None) from the entries a compaction
/// rewrites.
struct GcFilter {
    horizon: Option<GcHorizon>,
    /// Where to ask for a header's deletions past the horizon to be dropped, and for
    /// which table.
    requests: Option<(TableId, Arc<PurgeInbox>)>,
}

impl GcFilter {
    fn verdict(&self, key: &[u8], value: &[u8]) -> Verdict {
        let Some(horizon) = &self.horizon else {
            return Verdict::Keep;
        };
        // An entry that does not decode is kept as it is: reads report it.
        let mut out = Vec::new();
        let outcome = match keycodec::data_key_kind(key) {
            Some(KIND_ROW) => match StoredRow::decode_value(value) {
                Ok(mut row) => {
                    let outcome = row.purge_gc(horizon);
                    if outcome == Purge::Changed && row.encode(&mut out).is_err() {
                        return Verdict::Keep;
                    }
                    outcome
                }
                Err(_) => Purge::Unchanged,
            },
            Some(KIND_HEADER) => match PartitionHeader::decode_value(value) {
                Ok(mut header) => {
                    let past_gc = header
                        .deletion
                        .is_some_and(|d| horizon.tombstone_purgeable(d))
                        || header
                            .range_tombstones
                            .iter()
                            .any(|t| horizon.tombstone_purgeable(t.timestamp));
                    if let (true, Some((table, inbox))) = (past_gc, &self.requests) {
                        let prefix = key.get(..key.len() - 1).unwrap_or(&[]).to_vec();
                        inbox.enqueue(
                            PurgeJob {
                                table: *table,
                                prefix,
                                ranges: vec![ByteRange { lo: None, hi: None }],
                                drop_past_gc: true,
                            },
                            false,
                        );
                    }
                    let outcome = header.purge_gc(horizon);
                    if outcome == Purge::Changed && header.encode(&mut out).is_err() {
                        return Verdict::Keep;
                    }
                    outcome
                }
                Err(_) => Purge::Unchanged,
            },
            _ => Purge::Unchanged,
        };
        match outcome {
            Purge::Emptied => Verdict::Remove,
            Purge::Changed => Verdict::ReplaceValue(out.into()),
            Purge::Unchanged => Verdict::Keep,
        }
    }
}

impl CompactionFilter for GcFilter {
    fn filter_item(&mut self, item: ItemAccessor<'_>, _ctx: &Context) -> CompactionFilterResult {
        let value = item.value()?;
        Ok(self.verdict(item.key(), &value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keycodec::{header_key, partition_prefix};
    use crate::row::GcHorizon;

    fn row_key() -> Vec<u8> {
        let mut key = partition_prefix(1, b"pk\0k");
        key.push(KIND_ROW);
        key.extend_from_slice(&[1, 2, 3]);
        key
    }

    #[test]
    fn the_kind_of_a_data_key_is_found_past_an_escaped_partition_key() {
        assert_eq!(keycodec::data_key_kind(&row_key()), Some(KIND_ROW));
        let header = header_key(&partition_prefix(-5, b"\0\0"));
        assert_eq!(keycodec::data_key_kind(&header), Some(KIND_HEADER));
        assert_eq!(keycodec::data_key_kind(&[0; 5]), None);
    }

    #[test]
    fn an_emptied_row_becomes_an_engine_tombstone_never_a_silent_drop() {
        // An engine tombstone keeps shadowing older versions of the key in disk tables
        // outside the compaction; `Destroy` would let them come back.
        let deleted = StoredRow {
            deletion: Some(1_000_000),
            ..Default::default()
        };
        let mut value = Vec::new();
        deleted.encode(&mut value).unwrap();
        let purging = GcFilter {
            horizon: Some(GcHorizon::new(100, 0)),
            requests: None,
        };
        assert!(matches!(
            purging.verdict(&row_key(), &value),
            Verdict::Remove
        ));
        let within_grace = GcFilter {
            horizon: Some(GcHorizon::new(100, 1000)),
            requests: None,
        };
        assert!(matches!(
            within_grace.verdict(&row_key(), &value),
            Verdict::Keep
        ));
        let unknown = GcFilter {
            horizon: None,
            requests: None,
        };
        assert!(matches!(unknown.verdict(&row_key(), &value), Verdict::Keep));
    }
}
