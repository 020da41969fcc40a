//! Writes: `prepare` (no lock) and `commit` (under the partitions' stripe locks).

use super::purge::{purge_record_key, PurgeJob};
use super::tables::TablesRead;
use super::{io, Store, Stripe};
use crate::keycodec::{self, ByteRange, KIND_ROW, MAX_KEY_LEN};
use crate::model::{Mutation, TableId, TableLayout};
use crate::row::{PartitionHeader, StoredRangeTombstone, StoredRow, MAX_RANGE_TOMBSTONES};
use crate::{Durability, StorageError};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

/// Initial size of the buffer a commit encodes its rows into (it grows for larger rows).
const ENCODE_BUFFER_BYTES: usize = 1024;

/// What a conditional commit runs under the stripe locks (see [`Store::commit_checked`]).
pub(super) type UnderLocks<'c> =
    Box<dyn FnOnce(&TablesRead<'_>, i64) -> Result<Option<i64>, StorageError> + 'c>;

/// One entry of a commit, keyed by its table and fjall key.
pub(super) enum Pending {
    Header(PartitionHeader),
    Row {
        row: StoredRow,
        /// Its lowest timestamp when the write sets every regular column of the table
        /// (`RegularColumns::replaced_by`): above the stripe's newest, it needs no read.
        replaces_from: Option<i64>,
        stripe: usize,
        /// `row` already encoded, before any lock (see [`Prepared::encode_ahead`]); dropped
        /// whenever the row changes, so it is always `row`'s encoding when present.
        encoded: Option<fjall::Slice>,
        /// `row` merged ahead with the row stored before the locks (see
        /// [`Store::merge_ahead`]); dropped whenever the row changes.
        merged: Option<MergedAhead>,
    },
}

/// A row merged with a stored value before the locks, and that value: under the locks the
/// merge stands if the key still holds the very same bytes.
pub(super) struct MergedAhead {
    /// The stored value it was merged with (held, so its buffer cannot be reused).
    from: fjall::Slice,
    /// The merged row, encoded.
    value: fjall::Slice,
}

impl MergedAhead {
    /// Whether `stored` is the value this merge was made from: the same buffer, which
    /// `from` keeps alive, so the same bytes. A copy of them (a value reloaded from disk)
    /// does not count and takes the merge under the locks, which gives the same result.
    fn made_from(&self, stored: &fjall::Slice) -> bool {
        stored.len() == self.from.len() && std::ptr::eq(stored.as_ptr(), self.from.as_ptr())
    }
}

/// Mutations in storage form, ready to commit to one store: what `prepare` makes before
/// any lock is taken, and what a batchlog record holds.
pub(crate) struct Prepared {
    pub(super) entries: BTreeMap<(TableId, Vec<u8>), Pending>,
    /// Lock stripes of the partitions touched, ascending and unique.
    pub(super) stripes: Vec<usize>,
    /// Tables written, ascending and unique.
    pub(super) tables: Vec<TableId>,
    /// The gc_grace_seconds of each table written, as its layout gave it (none when
    /// replayed from a batchlog record).
    pub(super) gc_grace: Vec<(TableId, u32)>,
}

impl Store {
    /// Converts mutations to storage form, merging entries for the same key. No lock held.
    pub(crate) fn prepare<'a, 'l: 'a>(
        mutations: impl IntoIterator<Item = &'a (&'l TableLayout, Mutation)>,
    ) -> Result<Prepared, StorageError> {
        let mutations = mutations.into_iter();
        let mut entries: BTreeMap<(TableId, Vec<u8>), Pending> = BTreeMap::new();
        let mut stripes = Vec::with_capacity(mutations.size_hint().0);
        let mut tables: Vec<TableId> = Vec::with_capacity(1);
        let mut gc_grace: Vec<(TableId, u32)> = Vec::with_capacity(1);
        for (layout, m) in mutations {
            if layout.id != m.table {
                return Err(StorageError::Corrupt(
                    "mutation and layout name different tables",
                ));
            }
            if !tables.contains(&m.table) {
                tables.push(m.table);
                gc_grace.push((m.table, layout.gc_grace_seconds));
            }
            let prefix = keycodec::partition_prefix(m.token, &m.partition_key);
            if prefix.len() + 1 > MAX_KEY_LEN {
                return Err(StorageError::TooLarge("partition key too large"));
            }
            let stripe = Self::stripe_of(&m.table, m.token);
            stripes.push(stripe);
            let mut header = PartitionHeader {
                deletion: m.partition_deletion,
                ..Default::default()
            };
            for rd in &m.range_deletions {
                let range =
                    keycodec::prefix_bounds_to_range(&layout.clustering, &rd.start, &rd.end)?;
                if !range.is_empty() {
                    header.range_tombstones.push(StoredRangeTombstone {
                        range,
                        timestamp: rd.timestamp,
                    });
                }
            }
            if let Some(s) = &m.static_row {
                let mut row = StoredRow::from_mutation(s);
                // The static row has no clustering key, whatever the mutation carried.
                row.clustering.clear();
                header.static_row = Some(row);
            }
            if !header.is_empty() {
                let key = (m.table, keycodec::header_key(&prefix));
                match entries.get_mut(&key) {
                    Some(Pending::Header(h)) => h.merge(header),
                    _ => {
                        entries.insert(key, Pending::Header(header));
                    }
                }
            }
            for r in &m.rows {
                if r.clustering.len() != layout.clustering.len() {
                    return Err(StorageError::Corrupt(
                        "row clustering key does not match the table layout",
                    ));
                }
                let mut key = prefix.clone();
                key.push(KIND_ROW);
                keycodec::encode_clustering(&layout.clustering, &r.clustering, &mut key)?;
                if key.len() > MAX_KEY_LEN {
                    return Err(StorageError::TooLarge("clustering key too large"));
                }
                let key = (m.table, key);
                let row = StoredRow::from_mutation(r);
                let replaces_from = layout
                    .regular
                    .as_ref()
                    .filter(|regular| regular.replaced_by(r))
                    .map(|_| row.min_timestamp());
                match entries.get_mut(&key) {
                    Some(Pending::Row {
                        row: existing,
                        replaces_from,
                        ..
                    }) => {
                        existing.merge(row);
                        // Two writes of one row in a batch: merge as usual.
                        *replaces_from = None;
                    }
                    _ => {
                        entries.insert(
                            key,
                            Pending::Row {
                                row,
                                replaces_from,
                                stripe,
                                encoded: None,
                                merged: None,
                            },
                        );
                    }
                }
            }
        }
        stripes.sort_unstable();
        stripes.dedup();
        tables.sort_unstable();
        Ok(Prepared {
            entries,
            stripes,
            tables,
            gc_grace,
        })
    }

    /// Commits prepared entries atomically (one engine batch, together with `batchlog`, a
    /// meta entry, when given). LWW merge per cell happens here, under the stripe locks.
    /// Returns the commit's sequence number once the data is visible to reads; durability
    /// is awaited with `wait_durable`.
    pub(crate) fn commit(
        &self,
        prepared: Prepared,
        batchlog: Option<(&[u8], &[u8])>,
    ) -> Result<u64, StorageError> {
        let unconditional: Option<UnderLocks<'_>> = None;
        self.commit_checked(prepared, batchlog, unconditional)?
            .ok_or(StorageError::Corrupt("an unconditional commit was refused"))
    }

    /// [`Store::commit`], running `check` first when given, under the stripe locks (and the
    /// table registry's read side, which it may read through): it gets the newest timestamp
    /// stored in the locked stripes and answers `None` to write nothing (the answer is then
    /// `None`), or by how much to move every timestamp of the write.
    pub(super) fn commit_checked(
        &self,
        prepared: Prepared,
        batchlog: Option<(&[u8], &[u8])>,
        check: Option<UnderLocks<'_>>,
    ) -> Result<Option<u64>, StorageError> {
        self.check_open()?;
        // Copied into its own buffer before the locks: under them the batch only shares it.
        let batchlog = batchlog.map(|(key, value)| (key, fjall::Slice::from(value)));
        let Prepared {
            mut entries,
            stripes,
            tables,
            gc_grace,
        } = prepared;
        if entries.is_empty() && batchlog.is_none() && check.is_none() {
            return Ok(Some(self.commit.applied.load(Ordering::Acquire)));
        }
        // Held to the end of the batch: no TRUNCATE or DROP retires a keyspace while this
        // write uses it. Taken before the stripes, as every holder does.
        let registry = self.tables.read_for_write(&self.db, &self.meta, &tables)?;
        let mut newest_written = newest_timestamp(&entries);
        let written = {
            // Stripes are taken in ascending order: two batches cannot deadlock.
            let mut guards = self.lock_stripes(&stripes);
            if let Some(check) = check {
                let newest_stored = guards.iter().map(|g| g.newest).max().unwrap_or(i64::MIN);
                let Some(shift) = check(&registry, newest_stored)? else {
                    return Ok(None);
                };
                if shift != 0 {
                    for pending in entries.values_mut() {
                        pending.shift_timestamps(shift);
                    }
                    newest_written = newest_written.saturating_add(shift);
                }
                if entries.is_empty() && batchlog.is_none() {
                    // Nothing to write, but the answer shows what the check read: a commit
                    // it saw may not have its ticket yet.
                    return Ok(Some(self.seen_upto()));
                }
            }
            self.write_locked(
                &registry,
                &stripes,
                &mut guards,
                entries,
                &gc_grace,
                batchlog.as_ref().map(|(key, value)| (*key, value)),
                newest_written,
            )?
        };
        drop(registry);
        Ok(Some(self.finish_commit(written)))
    }

    /// Takes the stripe locks `stripes` (ascending), in that order.
    pub(super) fn lock_stripes(&self, stripes: &[usize]) -> Vec<MutexGuard<'_, Stripe>> {
        debug_assert!(stripes.windows(2).all(|w| w[0] < w[1]));
        stripes
            .iter()
            .map(|&i| self.stripes[i].lock().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    /// Writes prepared entries (already moved to their final timestamps) as one engine
    /// batch, with `batchlog` when given, under the registry guard and the stripe locks
    /// the caller holds: `guards[i]` is stripe `stripes[i]`, and every entry's partition is
    /// among them. Returns what [`Store::finish_commit`] completes once the locks are gone.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_locked(
        &self,
        registry: &TablesRead<'_>,
        stripes: &[usize],
        guards: &mut [MutexGuard<'_, Stripe>],
        entries: BTreeMap<(TableId, Vec<u8>), Pending>,
        gc_grace: &[(TableId, u32)],
        batchlog: Option<(&[u8], &fjall::Slice)>,
        newest_written: i64,
    ) -> Result<Written, StorageError> {
        debug_assert_eq!(stripes.len(), guards.len());
        for (table, seconds) in gc_grace {
            if let Some(keyspace) = registry.keyspace(table) {
                self.gc_graces.note(keyspace.name(), *table, *seconds);
            }
        }
        // Appended to the journal buffer only: `wait_durable` moves it to the OS once per turn.
        // Room for every entry, the batchlog record and a timestamp-ceiling move.
        let mut batch = fjall::OwnedWriteBatch::with_capacity(self.db.clone(), entries.len() + 2)
            .durability(None);
        // One buffer for every entry, sized for a typical row so that encoding does not
        // grow it step by step (each step is a reallocation and a copy).
        let mut buf = Vec::with_capacity(ENCODE_BUFFER_BYTES);
        // Partitions that got a new deletion: the purger removes the rows it shadows later.
        let mut purges: Vec<PurgeJob> = Vec::new();
        let mut replaced = 0u64;
        let mut journal_bytes = 0u64;
        // The rows written are freed after the locks are released, not under them.
        let mut spent = Spent::default();
        for ((table, key), pending) in entries {
            // A table dropped since the write was planned: its data is being deleted.
            let Some(keyspace) = registry.keyspace(&table) else {
                spent.keep(pending);
                continue;
            };
            buf.clear();
            if let Pending::Row {
                row,
                replaces_from: Some(oldest),
                stripe,
                encoded,
                ..
            } = &pending
            {
                let newest_stored = stripes
                    .binary_search(stripe)
                    .map_or(i64::MAX, |at| guards[at].newest);
                if *oldest > newest_stored {
                    // Everything stored under this key is older than every cell of a
                    // write that sets the whole row: the merge would return `row`.
                    match encoded {
                        Some(value) => {
                            journal_bytes += (key.len() + value.len()) as u64;
                            batch.insert(keyspace, key, value.clone());
                        }
                        None => {
                            row.encode(&mut buf)?;
                            journal_bytes += (key.len() + buf.len()) as u64;
                            batch.insert(keyspace, key, buf.as_slice());
                        }
                    }
                    replaced += 1;
                    spent.keep(pending);
                    continue;
                }
            }
            let existing = keyspace.get(&key).map_err(io)?;
            match pending {
                Pending::Header(incoming) => {
                    let mut header = match existing {
                        Some(v) => PartitionHeader::decode_stored(v)?,
                        None => PartitionHeader::default(),
                    };
                    // Where the new deletions apply: the whole partition, or their ranges.
                    let purge_ranges: Vec<ByteRange> = if incoming.deletion.is_some() {
                        vec![ByteRange { lo: None, hi: None }]
                    } else {
                        incoming
                            .range_tombstones
                            .iter()
                            .map(|t| t.range.clone())
                            .collect()
                    };
                    header.merge(incoming);
                    if !purge_ranges.is_empty() {
                        let prefix = key.get(..key.len() - 1).unwrap_or(&[]).to_vec();
                        // In the batch of the deletion: a restart or a full queue
                        // cannot lose the purge.
                        let record = purge_record_key(&table, &prefix);
                        journal_bytes += (record.len() + 8) as u64;
                        batch.insert(
                            &self.meta,
                            record,
                            self.purger.next_generation().to_be_bytes(),
                        );
                        purges.push(PurgeJob {
                            table,
                            prefix,
                            ranges: purge_ranges,
                            drop_past_gc: false,
                        });
                    }
                    if header.range_tombstones.len() > MAX_RANGE_TOMBSTONES {
                        return Err(StorageError::TooLarge(
                            "too many range tombstones in partition",
                        ));
                    }
                    header.encode(&mut buf)?;
                }
                Pending::Row {
                    row: incoming,
                    encoded,
                    merged,
                    ..
                } => {
                    if let Some(merged) = merged {
                        if existing.as_ref().is_some_and(|v| merged.made_from(v)) {
                            // Still the row it was merged with: the merge made ahead stands.
                            journal_bytes += (key.len() + merged.value.len()) as u64;
                            batch.insert(keyspace, key, merged.value.clone());
                            spent.rows.push(incoming);
                            spent.values.extend(encoded);
                            spent.values.extend([merged.from, merged.value]);
                            continue;
                        }
                        spent.values.extend([merged.from, merged.value]);
                    }
                    match (existing, encoded) {
                        (Some(v), encoded) => {
                            let mut row = StoredRow::decode_stored(v)?;
                            row.merge(incoming);
                            buf.reserve(row.encoded_len_hint());
                            row.encode(&mut buf)?;
                            spent.rows.push(row);
                            spent.values.extend(encoded);
                        }
                        (None, Some(value)) => {
                            journal_bytes += (key.len() + value.len()) as u64;
                            batch.insert(keyspace, key, value);
                            spent.rows.push(incoming);
                            continue;
                        }
                        (None, None) => {
                            incoming.encode(&mut buf)?;
                            spent.rows.push(incoming);
                        }
                    }
                }
            }
            journal_bytes += (key.len() + buf.len()) as u64;
            batch.insert(keyspace, key, buf.as_slice());
        }
        if let Some((key, value)) = batchlog {
            batch.insert(&self.meta, key, value.clone());
        }
        // Counted before the journal sees the batch, so that a read seeing it takes a ticket
        // that covers it (`seen_upto`); a failed commit still takes its ticket, or a reader
        // would wait for one that never comes.
        self.commit.begun.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.commit_with_ceiling(batch, newest_written) {
            self.finish_commit(Written {
                purges: Vec::new(),
                replaced: 0,
                journal_bytes: 0,
                spent,
            });
            return Err(e);
        }
        for guard in guards.iter_mut() {
            guard.newest = guard.newest.max(newest_written);
        }
        Ok(Written {
            purges,
            replaced,
            journal_bytes,
            spent,
        })
    }

    /// Completes a commit after its locks are released: counters, the ticket (handed out
    /// after the batch is in the journal, so an fsync that starts after reading
    /// `applied >= t` covers ticket t), the sync thread's wake-up and the purges.
    pub(super) fn finish_commit(&self, written: Written) -> u64 {
        if written.replaced > 0 {
            self.replaced_rows
                .fetch_add(written.replaced, Ordering::Relaxed);
        }
        self.commit
            .journal_bytes
            .fetch_add(written.journal_bytes, Ordering::Relaxed);
        let ticket = self.commit.applied.fetch_add(1, Ordering::SeqCst) + 1;
        debug_assert!(ticket <= self.commit.begun.load(Ordering::SeqCst));
        if self.durability == Durability::Batch {
            self.commit.lock_request().pending = true;
            self.commit.wake.notify_one();
        }
        for job in written.purges {
            self.purger.enqueue(job);
        }
        drop(written.spent);
        ticket
    }
}

/// A batch written under the locks, to be completed by [`Store::finish_commit`].
pub(super) struct Written {
    purges: Vec<PurgeJob>,
    replaced: u64,
    journal_bytes: u64,
    /// The entries written, freed here rather than under the locks.
    spent: Spent,
}

/// What a commit wrote and no longer needs: large values are freed once the locks are gone.
#[derive(Default)]
struct Spent {
    rows: Vec<StoredRow>,
    values: Vec<fjall::Slice>,
}

impl Spent {
    /// Keeps an entry to free later.
    fn keep(&mut self, pending: Pending) {
        if let Pending::Row {
            row,
            encoded,
            merged,
            ..
        } = pending
        {
            self.rows.push(row);
            self.values.extend(encoded);
            if let Some(m) = merged {
                self.values.extend([m.from, m.value]);
            }
        }
    }
}

impl Store {
    /// Merges every row of `prepared` that its commit would merge with the stored row (a
    /// write that does not replace the whole row) with the row stored now, so that under
    /// the locks the commit only checks that the key still holds that value (see
    /// [`MergedAhead`]). Called before any lock is taken.
    pub(crate) fn merge_ahead(&self, prepared: &mut Prepared) -> Result<(), StorageError> {
        self.check_open()?;
        let registry = self.tables.read();
        for ((table, key), pending) in &mut prepared.entries {
            let Pending::Row {
                row,
                replaces_from: None,
                merged,
                ..
            } = pending
            else {
                continue;
            };
            let Some(keyspace) = registry.keyspace(table) else {
                continue;
            };
            let Some(stored) = keyspace.get(key).map_err(io)? else {
                continue;
            };
            let mut into = StoredRow::decode_stored(stored.clone())?;
            into.merge(row.clone());
            let mut buf = Vec::with_capacity(into.encoded_len_hint());
            into.encode(&mut buf)?;
            *merged = Some(MergedAhead {
                from: stored,
                value: fjall::Slice::from(buf),
            });
        }
        Ok(())
    }

    /// Test hook: the value stored under `key` of `table`, as the engine holds it.
    #[cfg(test)]
    pub(crate) fn stored_value(&self, table: &TableId, key: &[u8]) -> Option<fjall::Slice> {
        let registry = self.tables.read();
        registry.keyspace(table)?.get(key).ok()?
    }
}

impl Prepared {
    /// Test hook: the rows merged ahead, by key, with their encoding.
    #[cfg(test)]
    pub(crate) fn merged_ahead(&self) -> Vec<((TableId, Vec<u8>), fjall::Slice)> {
        self.entries
            .iter()
            .filter_map(|(key, pending)| match pending {
                Pending::Row {
                    merged: Some(m), ..
                } => Some((key.clone(), m.value.clone())),
                _ => None,
            })
            .collect()
    }

    /// Encodes every row into its own buffer, so that the commit under the locks (and a
    /// batchlog record) only shares the bytes. Called before any lock is taken.
    pub(crate) fn encode_ahead(&mut self) -> Result<(), StorageError> {
        for pending in self.entries.values_mut() {
            if let Pending::Row { row, encoded, .. } = pending {
                if encoded.is_none() {
                    let mut buf = Vec::with_capacity(row.encoded_len_hint());
                    row.encode(&mut buf)?;
                    *encoded = Some(fjall::Slice::from(buf));
                }
            }
        }
        Ok(())
    }

    /// Adds `other`'s entries to these, merging entries of the same key (the merged row
    /// needs the read a partial write needs, and loses its encoding).
    pub(crate) fn absorb(&mut self, other: Prepared) {
        for (key, incoming) in other.entries {
            match (self.entries.get_mut(&key), incoming) {
                (Some(Pending::Header(h)), Pending::Header(incoming)) => h.merge(incoming),
                (
                    Some(Pending::Row {
                        row,
                        replaces_from,
                        encoded,
                        merged,
                        ..
                    }),
                    Pending::Row { row: incoming, .. },
                ) => {
                    row.merge(incoming);
                    *replaces_from = None;
                    *encoded = None;
                    *merged = None;
                }
                (_, incoming) => {
                    self.entries.insert(key, incoming);
                }
            }
        }
        self.stripes.extend(other.stripes);
        self.stripes.sort_unstable();
        self.stripes.dedup();
        self.tables.extend(other.tables);
        self.tables.sort_unstable();
        self.tables.dedup();
        for (table, seconds) in other.gc_grace {
            if !self.gc_grace.iter().any(|(t, _)| *t == table) {
                self.gc_grace.push((table, seconds));
            }
        }
    }
}

/// The newest timestamp among prepared entries (`i64::MIN` when there are none).
pub(super) fn newest_timestamp(entries: &BTreeMap<(TableId, Vec<u8>), Pending>) -> i64 {
    entries
        .values()
        .map(|p| match p {
            Pending::Header(h) => h.max_timestamp(),
            Pending::Row { row, .. } => row.max_timestamp(),
        })
        .max()
        .unwrap_or(i64::MIN)
}

impl Pending {
    /// Moves every timestamp of the entry by `delta` µs.
    pub(super) fn shift_timestamps(&mut self, delta: i64) {
        match self {
            Pending::Header(h) => h.shift_timestamps(delta),
            Pending::Row {
                row,
                replaces_from,
                encoded,
                merged,
                ..
            } => {
                row.shift_timestamps(delta);
                // The encodings carry the old timestamps.
                *encoded = None;
                *merged = None;
                if let Some(oldest) = replaces_from {
                    *oldest = oldest.saturating_add(delta);
                }
            }
        }
    }
}
