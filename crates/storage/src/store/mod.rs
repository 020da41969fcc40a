//! `Store`: one fjall database of the row store (one per shard, see `storage.rs`), with
//! striped partition locks and group commit. Each table has a keyspace of its own in it
//! (`tables.rs`), whose keys start with the token.
//!
//! Writes: `prepare` converts every mutation to storage form (clustering keys encoded, cells
//! sorted and reconciled) BEFORE any lock is taken. `commit` then takes the stripe locks of the
//! partitions it touches (sorted, so that concurrent batches cannot deadlock), and under
//! them only reads the current rows, merges and re-encodes them and commits one fjall
//! batch. The stripes are a fixed array, so memory does not grow with the number of
//! partitions, and a read-merge-write of one partition is linearizable.
//!
//! Durability: `commit` appends each batch to fjall's journal buffer without a system call.
//! A write is acknowledged only once the buffer holding it is in the OS (so that it survives
//! the process being killed): in `Periodic` mode either the server's acknowledgement barrier
//! flushes it before the socket write that carries the answer (`AckBarrier::flush`, one
//! `write(2)` for every write answered in that batch), or, for a caller without one, the first
//! waiter of an event-loop turn flushes it after the turn's other writes have been appended
//! (`wait_durable` yields once first); in `Batch` mode the sync thread flushes it before each
//! fsync. Nothing fsyncs on the write path. The sync thread fsyncs: in `Batch`
//! mode whenever tickets are pending (all writers that arrived during one fsync share the
//! next one), in `Periodic` mode on a timer. It fsyncs the journal file through its own
//! handle (`journal_sync`), so writers keep appending while the fsync runs instead of
//! queueing behind fjall's journal lock.
//!
//! Reads take a fjall snapshot under the table registry's read lock (held only against a
//! TRUNCATE or DROP swapping the table's keyspace): the partition header (partition deletion, range
//! tombstones, static row) with a point `get`, then the rows of each clustering range, or a
//! point `get` for a full primary key. Deletions and TTL are applied at read time; dead
//! rows are skipped and counted, and a read that steps over too many fails
//! (the tombstone failure threshold) rather than running unbounded.
//!
//! Files, by concern: this one holds the `Store` type, its open and close; `commit.rs` the
//! write path (`prepare`, `commit`); `ceiling.rs` the persisted timestamp ceiling;
//! `batchlog.rs` the codec of batches that span stores; `sync.rs` the sync thread and the
//! durability waits; `purge.rs` the background removal of shadowed rows; `gc.rs` the compaction filter that purges
//! tombstones and expired cells past gc_grace_seconds; `read.rs` partition reads;
//! `scan.rs` token-range scans; `merge.rs` the merge of several stores' ranges; `tables.rs`
//! the table keyspaces, TRUNCATE, DROP and the background deletion of old keyspaces.

mod batchlog;
mod ceiling;
mod commit;
mod conditional;
mod gc;
mod merge;
mod purge;
mod raw;
mod read;
mod scan;
mod stream;
mod sync;
mod tables;
mod transaction;

pub(crate) use batchlog::take_batchlog_len;
use ceiling::{load_timestamp_ceiling, TimestampCeiling};
pub(crate) use commit::Prepared;
pub use conditional::ConditionRead;
#[cfg(test)]
pub(crate) use purge::{PurgeHold, PURGE_QUEUE_JOBS};
pub use raw::{RawPartition, MAX_RAW_PARTITION_BYTES};
pub use read::{DEFAULT_TOMBSTONE_FAILURE_THRESHOLD, MAX_READ_BYTES};
pub use stream::{RangeChunk, RawRecord};
use sync::{CommitShared, DurableState, SyncRequest};
#[cfg(test)]
pub(crate) use tables::DeletionHold;
use tables::Tables;
#[cfg(test)]
pub(crate) use transaction::DIE_AFTER_FIRST_PART;
pub(crate) use transaction::{commit_transaction, TxnEnv};
pub use transaction::{TxnError, TxnPartition, TxnRead};

use crate::keycodec;
use crate::memtable_reaper::MemtableReaper;
use crate::model::TableId;
use crate::{Durability, StorageError};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Number of partition lock stripes (fixed: bounded memory, low collision odds).
const STRIPES: usize = 1024;

/// Journal size on disk before fjall flushes memtables so that old journals can go.
const MAX_JOURNAL_BYTES: u64 = 512 << 20;

/// Key and value bytes a store's tables may write into one memtable before the sync thread
/// seals it. A memtable is sealed when it is full, and fjall rotates the journal only when it
/// flushes one; but a memtable of overwritten keys drops the versions it supersedes and may
/// never fill; without this bound the journal (and the replay at the next start) grows without
/// end. The same size as `MAX_JOURNAL_BYTES`, the bound on sealed journals.
const JOURNAL_BYTES_PER_MEMTABLE: u64 = 512 << 20;

/// The keyspace of every table's data in the layout of earlier versions, which this one
/// refuses to open.
const SHARED_DATA_KEYSPACE: &str = "data";
/// The store's own metadata: the schema catalog (store 0), table records, batchlog records
/// and the timestamp ceiling.
const META_KEYSPACE: &str = "meta";

/// Longest a clean shutdown waits for its memtables to reach disk tables. Everything is
/// already durable in the journal before the wait starts; the flush only spares the next
/// start a journal replay, so a flush that takes longer (a slow or full disk) is left to
/// that replay instead of holding the shutdown.
const FLUSH_ON_CLOSE_LIMIT: Duration = Duration::from_secs(60);

/// One fjall database: its journal, memtables, version lock, sync thread and partition
/// stripes. `Storage` keeps one per shard, so that shards share nothing on the write path.
pub(crate) struct Store {
    /// Stops itself when dropped: first of the fields, so before the database it reads.
    _reaper: MemtableReaper,
    db: Database,
    /// Each table's keyspace (see `tables.rs`).
    tables: Arc<Tables>,
    meta: Keyspace,
    stripes: Arc<[Mutex<Stripe>]>,
    /// Removes the rows that partition deletions and range tombstones shadow (`purge.rs`).
    purger: purge::Purger,
    /// Persisted bound on every stored timestamp (see `TimestampCeiling`).
    ceiling: TimestampCeiling,
    /// Rows written without reading the row they replace, for tests and metrics.
    replaced_rows: AtomicU64,
    /// Most dead entries one read or scan page may step over (see `StorageError::TooManyTombstones`).
    tombstone_failure_threshold: AtomicUsize,
    /// Each table keyspace's gc_grace_seconds, read by its compaction filter.
    gc_graces: Arc<gc::GcGraces>,
    commit: Arc<CommitShared>,
    durability: Durability,
    sync_thread: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
}

impl Drop for Store {
    fn drop(&mut self) {
        self.purger.stop();
        self.stop_sync_thread();
        self.tables.stop_keeper();
    }
}

fn io(e: fjall::Error) -> StorageError {
    tracing::error!(error = ?e, "storage I/O error");
    match e {
        // fjall refuses every write after one failed (its database is poisoned).
        fjall::Error::Poisoned => StorageError::Io(crate::limits::STORAGE_FAILED_MESSAGE),
        fjall::Error::Io(e) if e.kind() == std::io::ErrorKind::StorageFull => {
            StorageError::Io("no space left on device")
        }
        fjall::Error::Storage(fjall::LsmError::Io(e))
            if e.kind() == std::io::ErrorKind::StorageFull =>
        {
            StorageError::Io("no space left on device")
        }
        _ => StorageError::Io("storage engine error"),
    }
}

/// What one partition lock stripe guards besides the partitions themselves.
struct Stripe {
    /// No stored row of a partition in this stripe has a timestamp above this one.
    newest: i64,
}

impl Store {
    /// Opens (or creates) the database at `path` and starts its sync thread.
    pub(crate) fn open(
        path: &std::path::Path,
        durability: Durability,
        cache_bytes: u64,
    ) -> Result<Store, StorageError> {
        Self::open_with_journal_bound(path, durability, cache_bytes, JOURNAL_BYTES_PER_MEMTABLE)
    }

    /// [`Store::open`], sealing the tables' memtables after `journal_bytes_per_memtable` of
    /// writes instead of [`JOURNAL_BYTES_PER_MEMTABLE`] (tests use a small bound).
    pub(crate) fn open_with_journal_bound(
        path: &std::path::Path,
        durability: Durability,
        cache_bytes: u64,
        journal_bytes_per_memtable: u64,
    ) -> Result<Store, StorageError> {
        let gc_graces = Arc::new(gc::GcGraces::default());
        let assigner_graces = gc_graces.clone();
        let purge_inbox = Arc::new(purge::PurgeInbox::new());
        let assigner_inbox = purge_inbox.clone();
        let db = Database::builder(path)
            .cache_size(cache_bytes)
            // fjall flushes each batch to the OS itself (survives kill -9); fsync is ours.
            .manual_journal_persist(false)
            // Bounded recovery time and disk: past this journal size fjall flushes
            // memtables so that old journals can go (each memtable is bounded by fjall's
            // per-keyspace limit).
            .max_journaling_size(MAX_JOURNAL_BYTES)
            .with_compaction_filter_factories(Arc::new(move |name: &str| {
                tables::is_table_keyspace(name).then(|| {
                    Arc::new(gc::GcFilterFactory::new(
                        assigner_graces.clone(),
                        assigner_inbox.clone(),
                        name,
                    )) as Arc<dyn fjall::compaction::filter::Factory>
                })
            }))
            // A partition read is a range within one partition prefix: the tables' filters
            // hold those prefixes, so that it skips the disk tables without the partition.
            .with_prefix_extractors(Arc::new(|name: &str| {
                tables::is_table_keyspace(name).then(|| {
                    Arc::new(crate::keycodec::PartitionPrefixExtractor)
                        as fjall::prefix::SharedPrefixExtractor
                })
            }))
            .open()
            .map_err(io)?;
        if db.keyspace_exists(SHARED_DATA_KEYSPACE) {
            tracing::error!(
                path = %path.display(),
                "this data directory keeps every table in one keyspace, the layout of an \
                 earlier version of Sluice; this version keeps each table apart and does not \
                 read it: start with an empty data directory"
            );
            return Err(StorageError::Corrupt(
                "the data directory has the layout of an earlier version (one keyspace for \
                 every table), which this version does not read; start with an empty data \
                 directory",
            ));
        }
        let meta = db
            .keyspace(META_KEYSPACE, KeyspaceCreateOptions::default)
            .map_err(io)?;
        let tables = Arc::new(Tables::open(&db, &meta)?);
        let (durable, _) = watch::channel(DurableState {
            upto: 0,
            failed: false,
            closed: false,
        });
        let commit = Arc::new(CommitShared {
            db: db.clone(),
            tables: tables.clone(),
            journal_bytes: AtomicU64::new(0),
            journal_bytes_per_memtable,
            path: path.to_path_buf(),
            applied: AtomicU64::new(0),
            begun: AtomicU64::new(0),
            in_os: AtomicU64::new(0),
            buffer_flushes: AtomicU64::new(0),
            request: Mutex::new(SyncRequest::default()),
            wake: Condvar::new(),
            durable,
            fsyncs: AtomicU64::new(0),
            memtables_sealed: AtomicU64::new(0),
            gate: std::sync::RwLock::new(()),
            gauge: sync::FsyncGauge::new(),
        });
        let thread_commit = commit.clone();
        let handle = std::thread::Builder::new()
            .name("sluice-storage-sync".into())
            .spawn(move || match durability {
                Durability::Batch => thread_commit.run_batch(),
                Durability::Periodic { interval } => thread_commit.run_periodic(interval),
            })
            .map_err(|_| StorageError::Io("cannot start the storage sync thread"))?;
        // fjall's flush and compaction workers exist once the database is open.
        let lowered = crate::background::lower_threads_named("fjall:");
        tracing::debug!(
            threads = lowered,
            "storage background threads at lower priority"
        );
        let reaper_tables = tables.clone();
        let reaper = MemtableReaper::start(move |visit| {
            reaper_tables.read().keyspaces().for_each(visit);
        })
        .map_err(|_| StorageError::Io("cannot start the memtable reaper thread"))?;
        let ceiling = load_timestamp_ceiling(&tables, &meta)?;
        let stripes: Arc<[Mutex<Stripe>]> = (0..STRIPES)
            .map(|_| Mutex::new(Stripe { newest: ceiling }))
            .collect();
        let purger = purge::Purger::start(
            db.clone(),
            meta.clone(),
            tables.clone(),
            stripes.clone(),
            gc_graces.clone(),
            purge_inbox,
        )?;
        Ok(Store {
            db,
            tables,
            meta,
            stripes,
            purger,
            ceiling: TimestampCeiling {
                value: std::sync::atomic::AtomicI64::new(ceiling),
                moving: Mutex::new(()),
            },
            replaced_rows: AtomicU64::new(0),
            tombstone_failure_threshold: AtomicUsize::new(DEFAULT_TOMBSTONE_FAILURE_THRESHOLD),
            gc_graces,
            commit,
            durability,
            sync_thread: Mutex::new(Some(handle)),
            _reaper: reaper,
            closed: AtomicBool::new(false),
        })
    }

    fn stop_sync_thread(&self) {
        self.commit.lock_request().shutdown = true;
        self.commit.wake.notify_all();
        let handle = self
            .sync_thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = handle {
            if h.join().is_err() {
                tracing::error!("storage sync thread panicked");
            }
        }
    }

    pub(super) fn check_open(&self) -> Result<(), StorageError> {
        if self.closed.load(Ordering::Acquire) {
            Err(StorageError::Closed)
        } else {
            Ok(())
        }
    }

    fn stripe_of(table: &TableId, token: i64) -> usize {
        let mut t = [0u8; 8];
        t.copy_from_slice(&table[..8]);
        // Tokens are already Murmur3 hashes; mix in the table so that tables spread too.
        let h = (token as u64 ^ u64::from_le_bytes(t)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 54) as usize % STRIPES
    }

    /// The stripe of the partition a data key of `table` (or a partition's key prefix)
    /// belongs to.
    fn stripe_of_key(table: &TableId, key: &[u8]) -> Result<usize, StorageError> {
        let token = keycodec::token_from_bytes(
            key.get(..keycodec::TOKEN_LEN)
                .and_then(|t| t.try_into().ok())
                .ok_or(StorageError::Corrupt("short data key"))?,
        );
        Ok(Self::stripe_of(table, token))
    }

    /// A handle on the store's fjall database (the free-space guard reads its write buffer).
    pub(crate) fn database(&self) -> Database {
        self.db.clone()
    }

    /// Number of rows written whole without reading what they replace (tests, metrics).
    pub(crate) fn replaced_row_count(&self) -> u64 {
        self.replaced_rows.load(Ordering::Relaxed)
    }

    /// Number of journal fsyncs done by the sync thread (for tests and metrics).
    pub(crate) fn fsync_count(&self) -> u64 {
        self.commit.fsyncs.load(Ordering::Relaxed)
    }

    /// Number of journal buffer flushes made for waiting writers in Periodic mode (tests, metrics).
    pub(crate) fn buffer_flush_count(&self) -> u64 {
        self.commit.buffer_flushes.load(Ordering::Relaxed)
    }

    /// Test hook: the number of stored entries (headers and rows, live or not) of a table.
    #[cfg(test)]
    pub(crate) fn raw_entry_count(&self, table: TableId) -> usize {
        self.tables
            .read()
            .keyspace(&table)
            .map_or(0, |k| k.iter().count())
    }

    /// Sets the most dead entries one read may step over before it fails.
    pub(crate) fn set_tombstone_failure_threshold(&self, threshold: usize) {
        self.tombstone_failure_threshold
            .store(threshold, Ordering::Relaxed);
    }

    pub(super) fn tombstone_failure_threshold(&self) -> usize {
        self.tombstone_failure_threshold.load(Ordering::Relaxed)
    }

    /// Test hook: flushes a table's memtable and compacts all its disk tables into one (the
    /// last level); returns the entries then on disk, engine tombstones included.
    #[cfg(test)]
    pub(crate) fn compact_table(&self, table: TableId) -> usize {
        let registry = self.tables.read();
        let Some(keyspace) = registry.keyspace(&table) else {
            return 0;
        };
        keyspace.rotate_memtable_and_wait().unwrap();
        keyspace.major_compact().unwrap();
        keyspace.approximate_len()
    }

    /// Test hook: a table's data blocks loaded and disk tables skipped by a filter so far.
    #[cfg(test)]
    pub(crate) fn read_filter_metrics(&self, table: TableId) -> (usize, usize) {
        let registry = self.tables.read();
        registry.keyspace(&table).map_or((0, 0), |k| {
            let m = k.metrics();
            (m.data_block_load_count(), m.io_skipped_by_filter())
        })
    }

    /// Test hook: memtables the sync thread sealed because the journal grew.
    #[cfg(test)]
    pub(crate) fn memtables_sealed_for_journal(&self) -> u64 {
        self.commit.memtables_sealed.load(Ordering::Relaxed)
    }

    /// The number of disk tables over every table keyspace.
    pub(crate) fn data_table_count(&self) -> usize {
        self.tables
            .read()
            .keyspaces()
            .map(|k| k.table_count())
            .sum()
    }

    /// The number of level-0 disk tables over every table keyspace.
    pub(crate) fn l0_data_table_count(&self) -> usize {
        self.tables
            .read()
            .keyspaces()
            .map(|k| k.l0_table_count())
            .sum()
    }

    /// Truncated or dropped tables' keyspaces whose files are not removed yet.
    pub(crate) fn pending_table_deletions(&self) -> usize {
        self.tables.pending_deletions()
    }

    /// Test hook: the names of the store's keyspaces, as fjall lists them.
    #[cfg(test)]
    pub(crate) fn keyspace_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .db
            .list_keyspace_names()
            .iter()
            .map(|n| n.to_string())
            .collect();
        names.sort();
        names
    }

    /// Test hook: the name of a table's current keyspace, if it has one.
    #[cfg(test)]
    pub(crate) fn table_keyspace_name(&self, table: TableId) -> Option<String> {
        self.tables
            .read()
            .keyspace(&table)
            .map(|k| k.name().to_string())
    }

    /// Purge jobs dropped because the purge queue was full (tests, metrics).
    pub(crate) fn dropped_purge_jobs(&self) -> u64 {
        self.purger.dropped_jobs()
    }

    /// Rows the purger examined (tests, metrics).
    pub(crate) fn purge_rows_examined(&self) -> u64 {
        self.purger.rows_examined()
    }

    /// The background purges' counters: dropped and truncated tables' keyspaces, and
    /// rows shadowed by deletions.
    pub(crate) fn purge_stats(&self) -> crate::PurgeStats {
        let keyspaces = self.tables.purge_progress();
        crate::PurgeStats {
            tables_pending: keyspaces.pending,
            tables_purged: keyspaces.purged,
            table_bytes_purged: keyspaces.purged_bytes,
            table_purge_steps: keyspaces.steps,
            row_purges_queued: self.purger.queued_jobs(),
            row_purges_dropped: self.purger.dropped_jobs(),
            row_purge_rows_examined: self.purger.rows_examined(),
        }
    }

    /// Test hook: waits at most `limit` for the purger to finish its jobs; true if it did.
    #[cfg(test)]
    pub(crate) fn wait_purges(&self, limit: Duration) -> bool {
        self.purger.wait_idle(limit)
    }

    /// Test hook: the purge records in the store's meta keyspace.
    #[cfg(test)]
    pub(crate) fn purge_record_count(&self) -> usize {
        self.meta.prefix(purge::PURGE_RECORD_PREFIX).count()
    }

    /// Test hook: holds the purger before its next job while the guard lives.
    #[cfg(test)]
    pub(crate) fn hold_purger(&self) -> PurgeHold<'_> {
        self.purger.hold()
    }

    /// Test hook: holds the table deleter before its next deletion while the guard lives.
    #[cfg(test)]
    pub(crate) fn hold_deleter(&self) -> DeletionHold<'_> {
        self.tables.hold_deletions()
    }

    /// Empties a table (TRUNCATE): it switches to a fresh keyspace at once, and the old one
    /// is deleted in the background.
    pub(crate) fn truncate(&self, table: TableId) -> Result<(), StorageError> {
        self.check_open()?;
        self.retire_table(table, false)
    }

    /// Drops a table (DROP TABLE): its data is deleted in the background, and writes that
    /// race with the drop are discarded.
    pub(crate) fn drop_table(&self, table: TableId) -> Result<(), StorageError> {
        self.check_open()?;
        self.retire_table(table, true)
    }

    /// TRUNCATE (`drop` false) or DROP TABLE, forgetting the old keyspace's gc grace.
    fn retire_table(&self, table: TableId, drop: bool) -> Result<(), StorageError> {
        let old = self
            .tables
            .read()
            .keyspace(&table)
            .map(|k| k.name().to_string());
        self.tables.retire(&self.db, &self.meta, &table, drop)?;
        if let Some(name) = old {
            self.gc_graces.forget(&name);
        }
        Ok(())
    }

    /// Test hook: journal files on disk, the active one included.
    #[cfg(test)]
    pub(crate) fn journal_count(&self) -> usize {
        self.db.journal_count()
    }

    /// Test hook: holds the sync thread before its next fsync while the guard lives.
    pub(crate) fn hold_sync(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.commit.gate.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Small durable metadata store for the schema catalog (synchronously fsynced).
    pub(crate) fn meta_put(&self, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        self.check_open()?;
        self.meta.insert(key, value).map_err(io)?;
        self.db.persist(PersistMode::SyncAll).map_err(io)
    }

    /// Deletes one metadata key (synchronously fsynced).
    pub(crate) fn meta_delete(&self, key: &[u8]) -> Result<(), StorageError> {
        self.check_open()?;
        self.meta.remove(key).map_err(io)?;
        self.db.persist(PersistMode::SyncAll).map_err(io)
    }

    /// All metadata entries whose key starts with `prefix`, in key order.
    pub(crate) fn meta_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StorageError> {
        self.check_open()?;
        self.meta
            .prefix(prefix)
            .map(|g| {
                g.into_inner()
                    .map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(io)
            })
            .collect()
    }

    /// Removes batchlog entries (a record, or a marker and the record it names) in one
    /// batch, without waiting for it to reach the disk.
    pub(crate) fn forget_batchlog(&self, keys: &[&[u8]]) -> Result<(), StorageError> {
        self.check_open()?;
        let mut batch = self.db.batch().durability(None);
        for key in keys {
            batch.remove(&self.meta, *key);
        }
        batch.commit().map_err(io)
    }

    /// Appends a transaction part's batchlog record to the journal before its locks, in a
    /// batch of its own: the part's batch under the locks then carries only a marker that
    /// names it. The journal is replayed in order, so wherever that later batch survives a
    /// crash, this one did too.
    pub(crate) fn log_ahead(&self, key: &[u8], record: fjall::Slice) -> Result<(), StorageError> {
        self.check_open()?;
        let mut batch = self.db.batch().durability(None);
        batch.insert(&self.meta, key, record);
        batch.commit().map_err(io)
    }

    /// One metadata entry.
    pub(crate) fn meta_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.check_open()?;
        Ok(self.meta.get(key).map_err(io)?.map(|v| v.to_vec()))
    }

    /// Fsyncs everything written so far.
    pub(crate) fn sync_all(&self) -> Result<(), StorageError> {
        self.db.persist(PersistMode::SyncAll).map_err(io)
    }

    /// Flushes and fsyncs everything (clean shutdown). Later calls fail with `Closed`.
    pub(crate) fn close(&self) -> Result<(), StorageError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // The sync thread makes everything applied so far durable before it exits. A
        // deletion the deleter has not finished is found again at the next open, and so is a
        // purge the purger has not finished (its record stays).
        self.purger.stop();
        self.stop_sync_thread();
        self.tables.stop_keeper();
        let upto = self.commit.applied.load(Ordering::Acquire);
        let result = self.db.persist(PersistMode::SyncAll).map_err(io);
        // Release every waiter: what was applied before this final fsync is durable; a
        // write that raced with close gets `Closed`, never a hang.
        self.commit.durable.send_modify(|d| {
            if result.is_ok() {
                d.upto = d.upto.max(upto);
            }
            d.closed = true;
        });
        result?;
        self.flush_memtables(FLUSH_ON_CLOSE_LIMIT);
        Ok(())
    }

    /// Seals every keyspace's memtable and waits, at most `limit`, until fjall has written
    /// them to disk tables and let their journals go, so that a restart after a clean
    /// shutdown replays no journal.
    pub(crate) fn flush_memtables(&self, limit: Duration) {
        let started = Instant::now();
        // Handles of their own: the wait below must not hold the registry.
        let mut keyspaces: Vec<Keyspace> = self.tables.read().keyspaces().cloned().collect();
        keyspaces.push(self.meta.clone());
        for keyspace in &keyspaces {
            if let Err(e) = keyspace.rotate_memtable() {
                tracing::warn!(error = ?e, "cannot seal a memtable at shutdown; the journal keeps it");
                return;
            }
        }
        while keyspaces
            .iter()
            .map(|k| k.sealed_memtable_count())
            .sum::<usize>()
            > 0
        {
            if started.elapsed() >= limit {
                tracing::warn!(
                    waited = ?started.elapsed(),
                    "memtables not flushed at shutdown; the next start replays their journal"
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        tracing::debug!(took = ?started.elapsed(), "memtables flushed at shutdown");
    }
}

#[cfg(test)]
mod io_error_tests {
    use super::io;
    use crate::StorageError;

    #[test]
    fn a_full_disk_and_a_poisoned_engine_are_named_in_the_error() {
        let enospc = || std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert_eq!(
            io(fjall::Error::Io(enospc())),
            StorageError::Io("no space left on device")
        );
        assert_eq!(
            io(fjall::Error::Storage(fjall::LsmError::Io(enospc()))),
            StorageError::Io("no space left on device")
        );
        assert_eq!(
            io(fjall::Error::Poisoned),
            StorageError::Io(crate::STORAGE_FAILED_MESSAGE)
        );
        assert_eq!(
            io(fjall::Error::Io(std::io::Error::other("x"))),
            StorageError::Io("storage engine error")
        );
    }
}
