//! Multi-partition transactions: every partition the transaction reads or writes is known
//! before it runs, so their locks are taken up front in one global order (store, then the
//! store's table registry, then its stripes ascending). No two transactions can deadlock
//! and none is ever aborted to break a cycle. Under the locks the reads are made, the
//! caller decides the writes from them, and the writes are committed, one engine batch per
//! store. When they span stores, each store's batch carries the other stores' parts as a
//! batchlog record: a record is in the same batch as its own part, so wherever one survives
//! a crash its part did too, and the next open replays the rest. Records of writes known
//! before the locks are written to each store's journal before them, and the part's batch
//! carries only an empty marker naming its record: the journal is replayed in order, so
//! the record survives wherever the marker does, and the large values are not journaled
//! twice under the locks.

use super::commit::{newest_timestamp, Written};
use super::tables::TablesRead;
use super::{Prepared, Store, Stripe};
use crate::model::{ClusteringSlice, Mutation, PartitionRead, TableId, TableLayout};
use crate::StorageError;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

/// A partition a transaction reads or writes, named before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnPartition {
    /// Its table.
    pub table: TableId,
    /// Its token.
    pub token: i64,
}

/// One read of a transaction (a LET row), made under the transaction's locks.
#[derive(Debug, Clone)]
pub struct TxnRead<'a> {
    /// The table read.
    pub layout: &'a TableLayout,
    /// The partition's token.
    pub token: i64,
    /// The partition key, serialized.
    pub partition_key: &'a [u8],
    /// The rows read.
    pub slice: ClusteringSlice,
    /// Most rows returned.
    pub limit: usize,
}

/// How a transaction commit went, store-side.
pub(crate) struct StoreTxn {
    /// `(store, seq)` of every part written; empty when nothing was written.
    pub(crate) parts: Vec<(usize, u64)>,
    /// The reads, in the order asked.
    pub(crate) reads: Vec<PartitionRead>,
    /// The timestamp the write's provisional one became.
    pub(crate) timestamp: Option<i64>,
    /// The batchlog key of a write that spans stores.
    pub(crate) batchlog_key: Option<Vec<u8>>,
    /// The key of the records written ahead, when the parts carry markers naming them.
    pub(crate) ahead_key: Option<Vec<u8>>,
    /// Time spent acquiring the locks.
    pub(crate) lock_wait: Duration,
    /// Time the locks were held.
    pub(crate) locked_for: Duration,
}

/// Why a transaction commit did not happen.
#[derive(Debug)]
pub enum TxnError<E> {
    /// Storage refused or failed; nothing was written unless the error says otherwise.
    Storage(StorageError),
    /// The caller's decision failed (under the locks); nothing was written.
    Decide(E),
}

impl<E> From<StorageError> for TxnError<E> {
    fn from(e: StorageError) -> Self {
        TxnError::Storage(e)
    }
}

#[cfg(test)]
thread_local! {
    /// Test hook: a spanning transaction stops after its first store's batch, as if the
    /// process died there.
    pub(crate) static DIE_AFTER_FIRST_PART: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The locks held in one store.
struct Held<'s> {
    store: usize,
    registry: TablesRead<'s>,
    stripes: Vec<usize>,
    guards: Vec<MutexGuard<'s, Stripe>>,
}

/// What a transaction needs of the storage around the stores: which store owns a token,
/// the write limits, and how a spanning transaction's batchlog record is made.
pub(crate) struct TxnEnv<'a> {
    pub(crate) store_of: &'a dyn Fn(i64) -> usize,
    pub(crate) check_limits: &'a dyn Fn(&Mutation) -> Result<(), StorageError>,
    /// Makes the batchlog key of the parts (by store) of a spanning write, and the record
    /// each part carries (in the parts' order) so that any surviving part restores the rest.
    #[allow(clippy::type_complexity)]
    pub(crate) batchlog:
        &'a dyn Fn(&[(usize, Prepared)]) -> Result<(Vec<u8>, Vec<fjall::Slice>), StorageError>,
    /// The meta key of a record written ahead (see [`Store::log_ahead`]), from its
    /// batchlog key.
    pub(crate) ahead_key: &'a dyn Fn(&[u8]) -> Vec<u8>,
}

/// The writes of a transaction known before its locks, in storage form, encoded, with
/// the batchlog records they need when they span stores (made with their provisional
/// timestamps, and written ahead to each store's journal; remade in full under the locks
/// only if those move or more writes join).
struct Ahead {
    parts: Vec<(usize, Prepared)>,
    /// The batchlog key, and the marker each part's batch carries under it.
    records: Option<(Vec<u8>, Vec<fjall::Slice>)>,
}

/// `mutations` in storage form, one part per store, in ascending store order.
fn prepare_by_store(
    env: &TxnEnv<'_>,
    mutations: &[(&TableLayout, Mutation)],
) -> Result<Vec<(usize, Prepared)>, StorageError> {
    let mut owners: Vec<usize> = mutations
        .iter()
        .map(|(_, m)| (env.store_of)(m.token))
        .collect();
    owners.sort_unstable();
    owners.dedup();
    let mut parts = Vec::with_capacity(owners.len());
    for store in owners {
        let own = mutations
            .iter()
            .filter(|(_, m)| (env.store_of)(m.token) == store);
        let prepared = Store::prepare(own)?;
        if !prepared.is_empty() {
            parts.push((store, prepared));
        }
    }
    Ok(parts)
}

/// Runs a transaction over `stores`: prepares `known` (writes that need no read, made
/// with timestamp `provisional`) before any lock, locks every partition of `partitions`
/// and `reads`, reads `reads`, asks `decide` for the other writes (made with timestamp
/// `provisional`), moves them all above every timestamp stored in the locked stripes, and
/// commits them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn commit_transaction<'l, E>(
    stores: &[Store],
    env: &TxnEnv<'_>,
    partitions: &[TxnPartition],
    reads: &[TxnRead<'_>],
    known: &[(&'l TableLayout, Mutation)],
    now_secs: u32,
    provisional: i64,
    decide: impl FnOnce(&[PartitionRead]) -> Result<Vec<(&'l TableLayout, Mutation)>, E>,
) -> Result<StoreTxn, TxnError<E>> {
    // The known writes: checked, converted, encoded and logged before the first lock.
    for (_, m) in known {
        (env.check_limits)(m)?;
    }
    let mut parts = prepare_by_store(env, known)?;
    for (store, prepared) in &mut parts {
        prepared.encode_ahead()?;
        stores
            .get(*store)
            .ok_or(StorageError::Closed)?
            .merge_ahead(prepared)?;
    }
    let records = if parts.len() > 1 {
        Some((env.batchlog)(&parts)?)
    } else {
        None
    };
    // Everything about the lock set is decided before the first lock.
    let mut wanted: Vec<(usize, usize, TableId)> = partitions
        .iter()
        .map(|p| (p.table, p.token))
        .chain(reads.iter().map(|r| (r.layout.id, r.token)))
        .map(|(table, token)| {
            (
                (env.store_of)(token),
                Store::stripe_of(&table, token),
                table,
            )
        })
        .collect();
    wanted.sort_unstable();
    let mut plan: Vec<(usize, Vec<usize>, Vec<TableId>)> = Vec::new();
    for (store, stripe, table) in wanted {
        match plan.last_mut() {
            Some((s, stripes, tables)) if *s == store => {
                if stripes.last() != Some(&stripe) {
                    stripes.push(stripe);
                }
                if !tables.contains(&table) {
                    tables.push(table);
                }
            }
            _ => plan.push((store, vec![stripe], vec![table])),
        }
    }
    for (store, _, tables) in &mut plan {
        tables.sort_unstable();
        stores
            .get(*store)
            .ok_or(StorageError::Closed)?
            .check_open()?;
    }
    // Each part's record goes to its store's journal now; under the locks the part's batch
    // carries only an empty marker under the batchlog key.
    let mut logged_ahead: Option<(Vec<u8>, Vec<usize>)> = None;
    let records = match records {
        Some((key, records)) => {
            let ahead = (env.ahead_key)(&key);
            let mut logged = Vec::with_capacity(parts.len());
            for ((store, _), record) in parts.iter().zip(records) {
                let result = stores
                    .get(*store)
                    .ok_or(StorageError::Closed)
                    .and_then(|s| s.log_ahead(&ahead, record));
                if let Err(e) = result {
                    forget_ahead(stores, &ahead, &logged);
                    return Err(e.into());
                }
                logged.push(*store);
            }
            let markers = vec![fjall::Slice::new(&[]); parts.len()];
            logged_ahead = Some((ahead, logged));
            Some((key, markers))
        }
        None => None,
    };
    let ahead = Ahead { parts, records };
    let started = Instant::now();
    let mut held: Vec<Held<'_>> = Vec::with_capacity(plan.len());
    for (index, stripes, tables) in plan {
        let store = &stores[index];
        // The registry before the stripes, as every holder does; stores in ascending order.
        let registry = match store.tables.read_for_write(&store.db, &store.meta, &tables) {
            Ok(registry) => registry,
            Err(e) => {
                drop(held);
                if let Some((ahead, logged)) = &logged_ahead {
                    forget_ahead(stores, ahead, logged);
                }
                return Err(e.into());
            }
        };
        let guards = store.lock_stripes(&stripes);
        held.push(Held {
            store: index,
            registry,
            stripes,
            guards,
        });
    }
    let locked = Instant::now();
    let lock_wait = locked - started;
    let mut marked = false;
    let outcome = locked_section(
        stores,
        env,
        &mut held,
        reads,
        ahead,
        now_secs,
        provisional,
        decide,
        &mut marked,
    );
    drop(held);
    let locked_for = locked.elapsed();
    // Records written ahead that no marker names (the transaction wrote nothing, or its
    // records were remade) go now; once a marker may be in a journal they stay for it.
    let ahead_key = match logged_ahead {
        Some((ahead, logged)) if !marked => {
            forget_ahead(stores, &ahead, &logged);
            None
        }
        Some((ahead, _)) => Some(ahead),
        None => None,
    };
    let (written, reads, timestamp, batchlog_key) = outcome?;
    let parts = written
        .into_iter()
        .map(|(store, w)| (store, stores[store].finish_commit(w)))
        .collect();
    Ok(StoreTxn {
        parts,
        reads,
        timestamp,
        batchlog_key,
        ahead_key,
        lock_wait,
        locked_for,
    })
}

/// Removes a record written ahead from the stores it went to (best effort: one left
/// behind is removed at the next open, unreplayed, as no marker names it).
fn forget_ahead(stores: &[Store], ahead: &[u8], logged: &[usize]) {
    for &store in logged {
        if let Err(e) = stores[store].forget_batchlog(&[ahead]) {
            tracing::debug!(error = %e, "a record written ahead left for the next open");
        }
    }
}

/// What the locked section wrote, per store, with the reads and the assigned timestamp.
type Locked = (
    Vec<(usize, Written)>,
    Vec<PartitionRead>,
    Option<i64>,
    Option<Vec<u8>>,
);

/// The part of a transaction that runs under its locks. Never inlined: profiles find the
/// critical section by this name.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn locked_section<'l, E>(
    stores: &[Store],
    env: &TxnEnv<'_>,
    held: &mut [Held<'_>],
    reads: &[TxnRead<'_>],
    ahead: Ahead,
    now_secs: u32,
    provisional: i64,
    decide: impl FnOnce(&[PartitionRead]) -> Result<Vec<(&'l TableLayout, Mutation)>, E>,
    marked: &mut bool,
) -> Result<Locked, TxnError<E>> {
    let held_by_store =
        |held: &[Held<'_>], store: usize| held.iter().position(|h| h.store == store);
    let mut found = Vec::with_capacity(reads.len());
    for read in reads {
        let store = (env.store_of)(read.token);
        let at = held_by_store(held, store).ok_or(StorageError::Corrupt(
            "a transaction read a store it did not lock",
        ))?;
        found.push(stores[store].read_partition_in(
            &held[at].registry,
            read.layout,
            read.token,
            read.partition_key,
            &read.slice,
            None,
            read.limit,
            now_secs,
        )?);
    }
    let mutations = decide(&found).map_err(TxnError::Decide)?;
    let Ahead {
        mut parts,
        mut records,
    } = ahead;
    if mutations.is_empty() && parts.is_empty() {
        return Ok((Vec::new(), found, None, None));
    }
    if !mutations.is_empty() {
        for (_, m) in &mutations {
            (env.check_limits)(m)?;
        }
        // More parts, or more in a part: the records made ahead no longer cover them.
        records = None;
        for (store, prepared) in prepare_by_store(env, &mutations)? {
            match parts.iter_mut().find(|(s, _)| *s == store) {
                Some((_, part)) => part.absorb(prepared),
                None => parts.push((store, prepared)),
            }
        }
        parts.sort_unstable_by_key(|(store, _)| *store);
    }
    for (store, prepared) in &parts {
        let Some(at) = held_by_store(held, *store) else {
            return Err(
                StorageError::Corrupt("a transaction wrote a store it did not lock").into(),
            );
        };
        if prepared
            .stripes
            .iter()
            .any(|s| held[at].stripes.binary_search(s).is_err())
        {
            return Err(
                StorageError::Corrupt("a transaction wrote a partition it did not lock").into(),
            );
        }
    }
    // The write is ordered after everything stored in the partitions it locked.
    let newest_stored = held
        .iter()
        .flat_map(|h| h.guards.iter().map(|g| g.newest))
        .max()
        .unwrap_or(i64::MIN);
    let timestamp = provisional.max(newest_stored.saturating_add(1));
    debug_assert!(timestamp > newest_stored || newest_stored == i64::MAX);
    let shift = timestamp - provisional;
    if shift != 0 {
        // A replayed record must carry the final timestamps.
        records = None;
        for (_, prepared) in &mut parts {
            for pending in prepared.entries.values_mut() {
                pending.shift_timestamps(shift);
            }
        }
    }
    let batchlog = match records {
        Some(records) if parts.len() > 1 => {
            *marked = true;
            Some(records)
        }
        _ if parts.len() > 1 => Some((env.batchlog)(&parts)?),
        _ => None,
    };
    let mut written = Vec::with_capacity(parts.len());
    for (part, (store, prepared)) in parts.into_iter().enumerate() {
        let Some(at) = held_by_store(held, store) else {
            return Err(
                StorageError::Corrupt("a transaction wrote a store it did not lock").into(),
            );
        };
        let h = &mut held[at];
        let newest = newest_timestamp(&prepared.entries);
        let result = stores[store].write_locked(
            &h.registry,
            &h.stripes,
            &mut h.guards,
            prepared.entries,
            &prepared.gc_grace,
            batchlog
                .as_ref()
                .and_then(|(k, records)| Some((k.as_slice(), records.get(part)?))),
            newest,
        );
        #[cfg(test)]
        let result = result.and_then(|w| {
            if part == 0 && DIE_AFTER_FIRST_PART.with(|d| d.get()) {
                stores[store].finish_commit(w);
                return Err(StorageError::Closed);
            }
            Ok(w)
        });
        match result {
            Ok(w) => written.push((store, w)),
            Err(e) => {
                // The parts already written stand (their batchlog record replays the rest
                // at the next open), so they are completed like any commit.
                for (store, w) in written {
                    stores[store].finish_commit(w);
                }
                return Err(e.into());
            }
        }
    }
    Ok((
        written,
        found,
        Some(timestamp),
        batchlog.map(|(key, _)| key),
    ))
}
