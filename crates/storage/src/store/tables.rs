//! One fjall keyspace per table, so that TRUNCATE and DROP TABLE switch a table to a fresh
//! keyspace (or to none) at once and leave the old one's files to a background thread.
//!
//! Keyspaces are named by a sequence number (`table-<n>`), and a table record in the meta
//! keyspace (`TABLE_RECORD_PREFIX`) names the current one of each table. Creating a keyspace
//! costs fjall several fsyncs, so a background thread (the keeper) keeps a few empty spares
//! ready: a table's first write and a TRUNCATE take one and only write a record. At open,
//! every keyspace that no record names is a retired one (or a spare) and goes to the keeper,
//! so a restart in the middle of a deletion neither shows the old data nor leaks its files.
//!
//! Every use of a table's keyspace borrows it under the registry's read lock for the whole
//! operation; a switch takes the write lock only to swap the handle, so no write lands in a
//! keyspace once its replacement is published, and the keeper holds the only Sluice handle
//! to a retired keyspace.

use super::io;
use crate::model::TableId;
use crate::StorageError;
use fjall::config::{HashRatioPolicy, PinningPolicy, RestartIntervalPolicy};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
#[cfg(test)]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Size at which a table keyspace's active memtable is sealed and flushed (fjall's default
/// is 64 MiB). Every write inserts into a skiplist whose searches miss the cache more the
/// larger it grows, and every version of an overwritten row stays in it until the flush:
/// a smaller memtable made both writes and later reads cheaper.
/// fjall stores it with the keyspace: a keyspace created before keeps its own.
const TABLE_MEMTABLE_BYTES: u64 = 16 << 20;

/// Keys between restart points in a table keyspace's blocks (fjall: 10 in L0, 16 below).
/// A range read seeks in every table it visits: a binary search over the restart points,
/// then a linear decode of the prefix-compressed keys up to the target, which a short
/// interval keeps short (2 measured best, writes unchanged). Stored with the keyspace like
/// the memtable size.
const TABLE_BLOCK_RESTART_INTERVAL: u8 = 2;

/// Hash buckets per key in a table keyspace's data blocks (fjall: none). A point read
/// finds its key's restart interval through the block's hash index instead of a binary
/// search over the restart points, for one byte per key (stored with the keyspace).
const TABLE_BLOCK_HASH_RATIO: f32 = 1.0;

/// Meta key prefix of table records: `TABLE_RECORD_PREFIX ‖ table id` → keyspace number
/// (u64, big-endian) ‖ state (`LIVE` or `DROPPED`).
const TABLE_RECORD_PREFIX: &[u8] = b"storage/table/";
/// Record state of a table in use: the number names its keyspace.
const LIVE: u8 = 0;
/// Record state of a dropped table: it has no keyspace.
const DROPPED: u8 = 1;

/// The prefix of every table keyspace's name, followed by its number.
const KEYSPACE_NAME_PREFIX: &str = "table-";

/// Empty keyspaces the keeper keeps ready in each store.
const SPARE_KEYSPACES: usize = 2;

/// How often the keeper checks whether fjall still holds a deleted keyspace.
const KEEPER_POLL: Duration = Duration::from_millis(50);

/// How long the keeper waits for fjall to let a deleted keyspace go before it seals every
/// keyspace's memtable (and then again at this interval): fjall holds a deleted keyspace
/// until the journals that hold its writes are let go, and a journal is let go only once every
/// other keyspace written in it has flushed, which an idle table may never do by itself.
const KEEPER_FLUSH_AFTER: Duration = Duration::from_secs(2);

/// Hashes a table id (16 random-looking bytes) with one multiply per word: ids are UUIDs
/// chosen by the server, and SipHash would cost more than the rest of a lookup.
#[derive(Default)]
pub(super) struct TableIdHasher(u64);

impl Hasher for TableIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
}

type TableMap = HashMap<TableId, TableSlot, BuildHasherDefault<TableIdHasher>>;

/// What a store knows of one table it has seen (a table never written here has no slot).
pub(super) enum TableSlot {
    /// In use, with its current keyspace.
    Live(Keyspace),
    /// Dropped: reads find nothing and writes are discarded.
    Dropped,
}

/// The tables of one store: their current keyspaces, and the keeper of spare and retired
/// ones.
pub(super) struct Tables {
    slots: RwLock<TableMap>,
    /// Serializes the changes of a slot (first write, TRUNCATE, DROP): each reads a slot
    /// and then acts on it.
    changes: Mutex<()>,
    keeper: Keeper,
}

/// The read side of the registry, held for the length of one read or write.
pub(super) struct TablesRead<'a>(RwLockReadGuard<'a, TableMap>);

impl TablesRead<'_> {
    /// The current keyspace of `table`, or None when it has none (never written, or dropped).
    pub(super) fn keyspace(&self, table: &TableId) -> Option<&Keyspace> {
        match self.0.get(table) {
            Some(TableSlot::Live(k)) => Some(k),
            _ => None,
        }
    }

    /// Every current keyspace.
    pub(super) fn keyspaces(&self) -> impl Iterator<Item = &Keyspace> {
        self.0.values().filter_map(|slot| match slot {
            TableSlot::Live(k) => Some(k),
            TableSlot::Dropped => None,
        })
    }

    /// True when every table in `tables` has a slot: a write can go ahead.
    fn ready_for(&self, tables: &[TableId]) -> bool {
        tables.iter().all(|t| self.0.contains_key(t))
    }
}

/// The name of keyspace number `n`.
fn keyspace_name(n: u64) -> String {
    format!("{KEYSPACE_NAME_PREFIX}{n}")
}

/// True when `name` is a table keyspace's name (not the meta keyspace's).
pub(super) fn is_table_keyspace(name: &str) -> bool {
    keyspace_number(name).is_some()
}

/// The number of a keyspace named by [`keyspace_name`], or None for any other name.
fn keyspace_number(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(KEYSPACE_NAME_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn record_key(table: &TableId) -> Vec<u8> {
    let mut key = TABLE_RECORD_PREFIX.to_vec();
    key.extend_from_slice(table);
    key
}

fn record_value(keyspace: u64, state: u8) -> [u8; 9] {
    let mut v = [0u8; 9];
    v[..8].copy_from_slice(&keyspace.to_be_bytes());
    v[8] = state;
    v
}

fn keyspace_options() -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default()
        .max_memtable_size(TABLE_MEMTABLE_BYTES)
        .data_block_restart_interval_policy(RestartIntervalPolicy::all(
            TABLE_BLOCK_RESTART_INTERVAL,
        ))
        // Filter and index blocks stay in memory at every level (fjall pins filters in L0
        // and indexes in L0 and L1 only): a point read probes a filter in every table it
        // passes, and after heavy writes the keys read live below L1, where each probe was a
        // block cache lookup. Filters take about 10 bits per key, as Cassandra's do.
        .data_block_hash_ratio_policy(HashRatioPolicy::all(TABLE_BLOCK_HASH_RATIO))
        .filter_block_pinning_policy(PinningPolicy::all(true))
        .index_block_pinning_policy(PinningPolicy::all(true))
}

/// The table records of a store's meta keyspace: table → (keyspace number, state).
fn load_records(meta: &Keyspace) -> Result<HashMap<TableId, (u64, u8)>, StorageError> {
    const BAD: StorageError = StorageError::Corrupt("bad table record");
    let mut records = HashMap::new();
    for guard in meta.prefix(TABLE_RECORD_PREFIX) {
        let (key, value) = guard.into_inner().map_err(io)?;
        let table: TableId = key
            .get(TABLE_RECORD_PREFIX.len()..)
            .and_then(|t| t.try_into().ok())
            .ok_or(BAD)?;
        let number = value
            .get(..8)
            .and_then(|g| g.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or(BAD)?;
        let state = *value.get(8).ok_or(BAD)?;
        if state != LIVE && state != DROPPED {
            return Err(BAD);
        }
        records.insert(table, (number, state));
    }
    Ok(records)
}

impl Tables {
    /// Loads the table records and keyspaces of `db`, and starts the keeper with every
    /// keyspace no record names: empty ones become spares, the others are deleted.
    pub(super) fn open(db: &Database, meta: &Keyspace) -> Result<Tables, StorageError> {
        let records = load_records(meta)?;
        let mut owners: HashMap<u64, TableId> = HashMap::new();
        let mut slots = TableMap::default();
        let mut next_number = 0u64;
        for (table, &(number, state)) in &records {
            next_number = next_number.max(number.saturating_add(1));
            if state == LIVE {
                owners.insert(number, *table);
            } else {
                slots.insert(*table, TableSlot::Dropped);
            }
        }
        let mut spares = Vec::new();
        let mut retired = VecDeque::new();
        for name in db.list_keyspace_names() {
            let Some(number) = keyspace_number(&name) else {
                continue;
            };
            next_number = next_number.max(number.saturating_add(1));
            let keyspace = db.keyspace(&name, keyspace_options).map_err(io)?;
            if let Some(table) = owners.remove(&number) {
                slots.insert(table, TableSlot::Live(keyspace));
            } else if spares.len() < SPARE_KEYSPACES && keyspace.is_empty().map_err(io)? {
                spares.push(keyspace);
            } else {
                retired.push_back(keyspace);
            }
        }
        for (number, table) in owners {
            // Recorded, but the keyspace is gone: nothing of the table can be read.
            tracing::error!(
                keyspace = number,
                table = ?table,
                "a table's keyspace is missing; its data is lost"
            );
        }
        if !retired.is_empty() {
            tracing::info!(
                keyspaces = retired.len(),
                "deleting the data of truncated or dropped tables"
            );
        }
        Ok(Tables {
            slots: RwLock::new(slots),
            changes: Mutex::new(()),
            keeper: Keeper::start(db.clone(), spares, retired, next_number)?,
        })
    }

    /// The registry's read side, for one read or write.
    pub(super) fn read(&self) -> TablesRead<'_> {
        TablesRead(self.slots.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn lock_changes(&self) -> MutexGuard<'_, ()> {
        self.changes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, table: TableId, slot: TableSlot) -> Option<TableSlot> {
        self.slots
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(table, slot)
    }

    /// The read side, once every table in `tables` has a slot: a table's first write in
    /// this store gives it a spare keyspace first.
    pub(super) fn read_for_write(
        &self,
        db: &Database,
        meta: &Keyspace,
        tables: &[TableId],
    ) -> Result<TablesRead<'_>, StorageError> {
        {
            let read = self.read();
            if read.ready_for(tables) {
                return Ok(read);
            }
        }
        let _changes = self.lock_changes();
        for table in tables {
            if self.read().0.contains_key(table) {
                continue;
            }
            let (number, keyspace) = self.keeper.take_spare()?;
            // In the journal ahead of every write to the keyspace, without an fsync: any
            // such write that becomes durable makes the record durable with it.
            let mut batch = db.batch().durability(None);
            batch.insert(meta, record_key(table), record_value(number, LIVE));
            batch.commit().map_err(io)?;
            self.publish(*table, TableSlot::Live(keyspace));
        }
        Ok(self.read())
    }

    /// Switches `table` to an empty keyspace (TRUNCATE), or to none when `drop` (DROP
    /// TABLE), and hands its old keyspace to the keeper for deletion. The switch is recorded
    /// durably in `meta` first. Returns without waiting for the deletion.
    pub(super) fn retire(
        &self,
        db: &Database,
        meta: &Keyspace,
        table: &TableId,
        drop: bool,
    ) -> Result<(), StorageError> {
        let _changes = self.lock_changes();
        let number = match self.read().0.get(table) {
            Some(TableSlot::Dropped) => return Ok(()),
            Some(TableSlot::Live(k)) => keyspace_number(k.name()),
            None => None,
        };
        let slot = match (number, drop) {
            // Never written in this store: nothing to empty, and nothing to keep from
            // coming back at the next open.
            (None, false) => return Ok(()),
            (None, true) => TableSlot::Dropped,
            (Some(number), true) => {
                meta.insert(record_key(table), record_value(number, DROPPED))
                    .map_err(io)?;
                db.persist(PersistMode::SyncAll).map_err(io)?;
                TableSlot::Dropped
            }
            (Some(_), false) => {
                let (fresh, keyspace) = self.keeper.take_spare()?;
                meta.insert(record_key(table), record_value(fresh, LIVE))
                    .map_err(io)?;
                db.persist(PersistMode::SyncAll).map_err(io)?;
                TableSlot::Live(keyspace)
            }
        };
        if let Some(TableSlot::Live(old)) = self.publish(*table, slot) {
            debug_assert_eq!(
                keyspace_number(old.name()),
                number,
                "the retired keyspace is the one the table had"
            );
            self.keeper.retire(old);
        }
        Ok(())
    }

    /// Stops the keeper; a deletion it has not finished is found again at the next open.
    pub(super) fn stop_keeper(&self) {
        self.keeper.stop();
    }

    /// Retired keyspaces whose files are not removed yet (tests, metrics).
    pub(super) fn pending_deletions(&self) -> usize {
        self.keeper.shared.pending.load(Ordering::Acquire) as usize
    }

    /// What the keeper's background deletions of dropped and truncated tables have done.
    pub(super) fn purge_progress(&self) -> KeyspacePurges {
        let shared = &self.keeper.shared;
        KeyspacePurges {
            pending: shared.pending.load(Ordering::Acquire),
            purged: shared.purged.load(Ordering::Relaxed),
            purged_bytes: shared.purged_bytes.load(Ordering::Relaxed),
            steps: shared.purge_steps.load(Ordering::Relaxed),
        }
    }

    /// Test hook: holds the keeper's deletions while the guard lives.
    #[cfg(test)]
    pub(super) fn hold_deletions(&self) -> DeletionHold<'_> {
        self.keeper.shared.held.store(true, Ordering::Release);
        DeletionHold(&self.keeper)
    }
}

/// Test hook: releases the keeper's deletions when dropped.
#[cfg(test)]
pub(crate) struct DeletionHold<'a>(&'a Keeper);

#[cfg(test)]
impl Drop for DeletionHold<'_> {
    fn drop(&mut self) {
        self.0.shared.held.store(false, Ordering::Release);
        self.0.shared.wake.notify_all();
    }
}

/// Counters of the keeper's deletions of retired keyspaces (dropped and truncated tables).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KeyspacePurges {
    /// Retired keyspaces whose files are still on disk.
    pub(crate) pending: u64,
    /// Retired keyspaces whose files are gone.
    pub(crate) purged: u64,
    /// Their disk space when they were deleted.
    pub(crate) purged_bytes: u64,
    /// Deletion steps run.
    pub(crate) steps: u64,
}

/// The keeper thread, at background priority: creates spare keyspaces and deletes retired
/// ones, one at a time.
struct Keeper {
    shared: Arc<KeeperShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct KeeperState {
    spares: Vec<Keyspace>,
    retired: VecDeque<Keyspace>,
    /// The number of the next keyspace to create.
    next_number: u64,
    stop: bool,
}

struct KeeperShared {
    db: Database,
    state: Mutex<KeeperState>,
    wake: Condvar,
    /// Keyspaces retired whose files are still on disk.
    pending: AtomicU64,
    /// Retired keyspaces whose files are gone.
    purged: AtomicU64,
    /// The disk space of the purged keyspaces, as fjall counted it when each was deleted.
    purged_bytes: AtomicU64,
    /// Deletion steps run: a keyspace deleted, or a look at those fjall still held.
    purge_steps: AtomicU64,
    /// Test hook: deletions wait while this is set.
    #[cfg(test)]
    held: AtomicBool,
}

impl Keeper {
    fn start(
        db: Database,
        spares: Vec<Keyspace>,
        retired: VecDeque<Keyspace>,
        next_number: u64,
    ) -> Result<Keeper, StorageError> {
        let shared = Arc::new(KeeperShared {
            db,
            pending: AtomicU64::new(retired.len() as u64),
            purged: AtomicU64::new(0),
            purged_bytes: AtomicU64::new(0),
            purge_steps: AtomicU64::new(0),
            state: Mutex::new(KeeperState {
                spares,
                retired,
                next_number,
                stop: false,
            }),
            wake: Condvar::new(),
            #[cfg(test)]
            held: AtomicBool::new(false),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-keyspace-keeper".into())
            .spawn(move || thread_shared.run())
            .map_err(|_| StorageError::Io("cannot start the keyspace keeper thread"))?;
        Ok(Keeper {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// A spare keyspace and its number; created here (slowly) when none is ready.
    fn take_spare(&self) -> Result<(u64, Keyspace), StorageError> {
        let taken = {
            let mut state = self.shared.lock_state();
            match state.spares.pop() {
                Some(k) => Ok(k),
                None => Err(state.take_number()),
            }
        };
        self.shared.wake.notify_all();
        let keyspace = match taken {
            Ok(k) => k,
            Err(number) => {
                tracing::debug!("no spare keyspace ready; creating one");
                self.shared.create(number)?
            }
        };
        let number = keyspace_number(keyspace.name())
            .ok_or(StorageError::Corrupt("a spare keyspace without a number"))?;
        Ok((number, keyspace))
    }

    fn retire(&self, keyspace: Keyspace) {
        self.shared.pending.fetch_add(1, Ordering::AcqRel);
        self.shared.lock_state().retired.push_back(keyspace);
        self.shared.wake.notify_all();
    }

    fn stop(&self) {
        self.shared.lock_state().stop = true;
        self.shared.wake.notify_all();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            if t.join().is_err() {
                tracing::error!("keyspace keeper thread panicked");
            }
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop();
    }
}

impl KeeperState {
    fn take_number(&mut self) -> u64 {
        let n = self.next_number;
        self.next_number += 1;
        n
    }
}

/// One step of the keeper.
enum Work {
    Delete(Keyspace),
    Create(u64),
    /// Only deleted keyspaces that fjall still holds: look again later.
    Poll,
}

impl KeeperShared {
    fn lock_state(&self) -> MutexGuard<'_, KeeperState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn held(&self) -> bool {
        #[cfg(test)]
        return self.held.load(Ordering::Acquire);
        #[cfg(not(test))]
        false
    }

    fn create(&self, number: u64) -> Result<Keyspace, StorageError> {
        self.db
            .keyspace(&keyspace_name(number), keyspace_options)
            .map_err(io)
    }

    /// Seals the memtable of every keyspace of the database, so that fjall flushes them and
    /// lets go of the journals (and the deleted keyspaces) they kept.
    fn flush_every_keyspace(&self) {
        for name in self.db.list_keyspace_names() {
            // Only this thread deletes keyspaces, so a listed one still exists.
            match self.db.keyspace(&name, keyspace_options) {
                Ok(keyspace) => {
                    if let Err(e) = keyspace.rotate_memtable() {
                        tracing::warn!(error = ?e, keyspace = %name, "cannot seal a memtable");
                    }
                }
                Err(e) => tracing::warn!(error = ?e, keyspace = %name, "cannot open a keyspace"),
            }
        }
    }

    /// Waits for the next step, or None when stopped.
    fn next_work(&self, waiting_on_fjall: bool) -> Option<Work> {
        let mut state = self.lock_state();
        loop {
            if state.stop {
                return None;
            }
            if !self.held() {
                if let Some(k) = state.retired.pop_front() {
                    return Some(Work::Delete(k));
                }
            }
            if state.spares.len() < SPARE_KEYSPACES {
                return Some(Work::Create(state.take_number()));
            }
            if waiting_on_fjall {
                let (s, wait) = self
                    .wake
                    .wait_timeout(state, KEEPER_POLL)
                    .unwrap_or_else(|e| e.into_inner());
                state = s;
                if wait.timed_out() {
                    return Some(Work::Poll);
                }
            } else {
                state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        }
    }

    /// A deleted keyspace's folder goes when its last handle drops, and fjall may still hold
    /// handles for a while (a flush, the journal's watermarks): the keeper keeps its own
    /// until it is the last, so that the unlinking happens here rather than on a shard's
    /// thread.
    fn run(&self) {
        crate::background::lower_current_thread();
        // Deleted keyspaces fjall still holds, with their disk space when deleted.
        let mut deleted: Vec<(Keyspace, u64)> = Vec::new();
        let mut last_flush = Instant::now();
        while let Some(work) = self.next_work(!deleted.is_empty()) {
            match work {
                Work::Delete(keyspace) => {
                    self.purge_steps.fetch_add(1, Ordering::Relaxed);
                    let name = keyspace.name().to_string();
                    let bytes = keyspace.disk_space();
                    match self.db.delete_keyspace(keyspace.clone()) {
                        Ok(()) => {
                            tracing::debug!(keyspace = %name, "table keyspace deleted");
                            deleted.push((keyspace, bytes));
                        }
                        Err(e) => {
                            // Left for the next open, which finds it unnamed again.
                            tracing::error!(error = ?e, keyspace = %name, "cannot delete a table keyspace");
                            self.pending.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                }
                Work::Create(number) => match self.create(number) {
                    Ok(k) => self.lock_state().spares.push(k),
                    Err(_) => {
                        // Logged by `io`; a write then creates its keyspace itself.
                        std::thread::sleep(KEEPER_POLL);
                    }
                },
                Work::Poll => {
                    self.purge_steps.fetch_add(1, Ordering::Relaxed);
                    if last_flush.elapsed() >= KEEPER_FLUSH_AFTER {
                        self.flush_every_keyspace();
                        last_flush = Instant::now();
                    }
                }
            }
            if deleted.is_empty() {
                last_flush = Instant::now();
            }
            let mut gone = 0;
            deleted.retain(|(k, bytes)| {
                let held = k.handle_count() > 1;
                if !held {
                    gone += 1;
                    self.purged_bytes.fetch_add(*bytes, Ordering::Relaxed);
                }
                held
            });
            if gone > 0 {
                self.purged.fetch_add(gone, Ordering::Relaxed);
                self.pending.fetch_sub(gone, Ordering::AcqRel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyspace_names_parse_back_and_others_do_not() {
        assert_eq!(keyspace_name(42), "table-42");
        assert_eq!(keyspace_number(&keyspace_name(42)), Some(42));
        assert_eq!(keyspace_number(&keyspace_name(u64::MAX)), Some(u64::MAX));
        for other in [
            "meta", "data", "table-", "table-x", "table--1", "table-1a", "t-1",
        ] {
            assert_eq!(keyspace_number(other), None, "{other}");
        }
    }

    #[test]
    fn table_ids_hash_apart() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<TableIdHasher>::default();
        let hash = |t: TableId| build.hash_one(t);
        let mut seen: Vec<u64> = (0..=255u8)
            .map(|b| {
                let mut t = [0u8; 16];
                t[15] = b;
                hash(t)
            })
            .collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen.len(),
            256,
            "ids differing in their last byte hash apart"
        );
    }
}
