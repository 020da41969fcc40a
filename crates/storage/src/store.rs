//! `Store`: one fjall database of the row store (one per shard, see `storage.rs`), with
//! striped partition locks and group commit.
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
//! Reads take a fjall snapshot (no lock): the partition header (partition deletion, range
//! tombstones, static row) with a point `get`, then the rows of each clustering range, or a
//! point `get` for a full primary key. Deletions and TTL are applied at read time; dead
//! rows are skipped and counted, and a read that steps over too many fails
//! (`MAX_DEAD_ROWS_PER_READ`) rather than running unbounded.

use crate::journal_sync::{JournalSyncer, SideSyncError};
use crate::keycodec::{self, ByteRange, KIND_HEADER, KIND_ROW, MAX_KEY_LEN};
use crate::memtable_reaper::MemtableReaper;
use crate::model::{ClusteringSlice, Mutation, PartitionRead, TableId, TableLayout};
use crate::row::{PartitionHeader, StoredRangeTombstone, StoredRow, MAX_RANGE_TOMBSTONES};
use crate::{Durability, ScanPage, ScanStart, ScannedPartition, StorageError};
use bytes::Bytes;
use fjall::config::RestartIntervalPolicy;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Number of partition lock stripes (fixed: bounded memory, low collision odds).
const STRIPES: usize = 1024;
/// In periodic mode, how often the sync thread starts the writeback of new journal pages
/// between two fsyncs.
const WRITEBACK_EVERY: Duration = Duration::from_millis(100);

/// Most dead entries (tombstoned or expired rows) one read may step over before it fails,
/// like Cassandra's tombstone_failure_threshold: a read's cost stays bounded.
pub const MAX_DEAD_ROWS_PER_READ: usize = 100_000;

/// Most rows one `commit` examines to purge what a new deletion shadows; the rest stays
/// (hidden by the deletion) until a later deletion of the partition purges it.
const PURGE_ROWS_PER_APPLY: usize = 16_384;

/// Rows examined per stripe-lock hold while purging (bounds the lock hold time).
const PURGE_CHUNK: usize = 256;

/// Initial size of the buffer a commit encodes its rows into (it grows for larger rows).
const ENCODE_BUFFER_BYTES: usize = 1024;

/// Rows deleted per fjall batch by `truncate` (bounded batch memory).
const TRUNCATE_CHUNK: usize = 1024;

/// Journal size on disk before fjall flushes memtables so that old journals can go.
const MAX_JOURNAL_BYTES: u64 = 512 << 20;

/// Key and value bytes the data keyspace may write into one memtable before the sync thread
/// seals it. A memtable is sealed when it is full, and fjall rotates the journal only when it
/// flushes one; but a memtable of overwritten keys drops the versions it supersedes and may
/// never fill. Without this bound the journal grew without end (2.8 GB after a 60 s write step
/// and a 60 s mixed step at 165,000 requests/s on 10,000 keys, all of it replayed by a
/// restart). With it, the same load keeps the journal under 700 MB, and a restart after
/// `kill -9` with a 487 MB journal took 12.3 s. The same size as `MAX_JOURNAL_BYTES`, the
/// bound on sealed journals.
const JOURNAL_BYTES_PER_MEMTABLE: u64 = 512 << 20;

/// Size at which the data keyspace's active memtable is sealed and flushed (fjall's default
/// is 64 MiB). Every write inserts into a skiplist whose searches miss the cache more the
/// larger it grows, and every version of an overwritten row stays in it until the flush.
/// On one core at 70,000 requests/s, 16 MiB cost 7.7 us of CPU per write against 8.7 us
/// at 64 MiB, and reads after a write phase 8.7 us against 14.3 us (flushes included).
/// fjall stores it with the keyspace: a directory created before keeps its own.
const DATA_MEMTABLE_BYTES: u64 = 16 << 20;

/// Keys between restart points in the data keyspace's blocks (fjall: 10 in L0, 16 below).
/// A range read seeks in every table it visits: a binary search over the restart points,
/// then a linear decode of the prefix-compressed keys up to the target. On one core at
/// 40,000 reads/s after a write phase: 10.1, 10.1, 9.8 us of CPU per read with fjall's
/// intervals; 8.8-9.0 with 4; 8.3-8.5 with 2; 8.8 with 1 (writes unchanged, 7.4-8.1 us).
/// Stored with the keyspace like the memtable size.
const DATA_BLOCK_RESTART_INTERVAL: u8 = 2;

const DATA_KEYSPACE: &str = "data";
const META_KEYSPACE: &str = "meta";

/// Longest a clean shutdown waits for its memtables to reach disk tables. Everything is
/// already durable in the journal before the wait starts; the flush only spares the next
/// start a journal replay, so a flush that takes longer (a slow or full disk) is left to
/// that replay instead of holding the shutdown.
const FLUSH_ON_CLOSE_LIMIT: Duration = Duration::from_secs(60);

/// How far the journal is known durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DurableState {
    /// Every ticket up to this one is durable.
    upto: u64,
    /// An fsync failed: fjall is poisoned and nothing further becomes durable.
    failed: bool,
    /// Storage is closed: tickets above `upto` will never become durable.
    closed: bool,
}

/// Requests to the sync thread.
#[derive(Debug, Default)]
struct SyncRequest {
    pending: bool,
    shutdown: bool,
}

/// State shared by writers and the sync thread.
struct CommitShared {
    db: Database,
    /// The data keyspace, whose memtable the sync thread seals (`seal_if_journal_grew`).
    data: Keyspace,
    /// Key and value bytes committed to the data keyspace since its memtable was last sealed
    /// for journal growth (the journal's own framing is not counted).
    journal_bytes: AtomicU64,
    /// Journal bytes after which the sync thread seals the memtable.
    journal_bytes_per_memtable: u64,
    path: std::path::PathBuf,
    /// Last ticket handed out; a ticket is handed out only after its batch is in the journal.
    applied: AtomicU64,
    /// Every ticket up to this one is in the OS (survives the process, not the machine).
    in_os: AtomicU64,
    /// Journal buffer flushes (`write(2)` calls) made for waiting writers, for tests and metrics.
    buffer_flushes: AtomicU64,
    request: Mutex<SyncRequest>,
    wake: Condvar,
    durable: watch::Sender<DurableState>,
    fsyncs: AtomicU64,
    /// Memtables sealed for journal growth (read by tests).
    memtables_sealed: AtomicU64,
    /// Test hook: a test holding the write side stops the sync thread before its next fsync.
    #[cfg(test)]
    gate: std::sync::RwLock<()>,
}

impl CommitShared {
    fn lock_request(&self) -> MutexGuard<'_, SyncRequest> {
        self.request.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the journal buffer to the OS; every ticket handed out before it is then there.
    fn flush_buffer(&self) -> Result<(), StorageError> {
        let upto = self.applied.load(Ordering::Acquire);
        self.db.persist(PersistMode::Buffer).map_err(io)?;
        self.in_os.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// [`flush_buffer`](Self::flush_buffer) on behalf of waiting writers (counted apart from
    /// the sync thread's flushes).
    fn flush_buffer_for_writers(&self) -> Result<(), StorageError> {
        self.flush_buffer()?;
        self.buffer_flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The newest ticket applied but not yet durable, if any (and the journal has not failed).
    fn pending_upto(&self) -> Option<u64> {
        let upto = self.applied.load(Ordering::Acquire);
        let current = *self.durable.borrow();
        (!current.failed && upto > current.upto).then_some(upto)
    }

    /// Fsyncs the journal if tickets are pending and publishes the new durable point.
    fn sync_pending(&self, syncer: &mut JournalSyncer) {
        #[cfg(test)]
        let _gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
        let Some(upto) = self.pending_upto() else {
            return;
        };
        // The side fsync covers only what is in the OS: flush the buffer first (`upto` was
        // read before it, so everything up to `upto` is in it).
        let result = match self.flush_buffer().map(|()| syncer.sync()) {
            Ok(Ok(())) => Ok(()),
            Err(_) | Ok(Err(SideSyncError::Io)) => Err(()),
            Ok(Err(SideSyncError::NotFound)) => {
                self.db.persist(PersistMode::SyncData).map_err(|e| {
                    tracing::error!(error = ?e, "journal fsync failed");
                })
            }
        };
        match result {
            Ok(()) => {
                self.fsyncs.fetch_add(1, Ordering::Relaxed);
                self.durable.send_modify(|d| d.upto = d.upto.max(upto));
            }
            Err(()) => {
                tracing::error!("journal fsync failed; writes can no longer be made durable");
                self.durable.send_modify(|d| d.failed = true);
            }
        }
    }

    /// Seals the data keyspace's memtable once its writes have put
    /// `journal_bytes_per_memtable` into the journal, so that fjall flushes it and rotates
    /// the journal (see [`JOURNAL_BYTES_PER_MEMTABLE`]).
    fn seal_if_journal_grew(&self) {
        if self.journal_bytes.load(Ordering::Relaxed) < self.journal_bytes_per_memtable {
            return;
        }
        self.journal_bytes.store(0, Ordering::Relaxed);
        if let Err(e) = self.data.rotate_memtable() {
            tracing::error!(error = ?e, "cannot seal the memtable for journal growth");
        } else {
            self.memtables_sealed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Group commit: fsync as soon as something is pending; writers arriving during an
    /// fsync are covered by the next one.
    fn run_batch(&self) {
        let mut syncer = JournalSyncer::new(&self.path);
        loop {
            let shutdown = {
                let mut req = self.lock_request();
                while !req.pending && !req.shutdown {
                    req = self.wake.wait(req).unwrap_or_else(|e| e.into_inner());
                }
                req.pending = false;
                req.shutdown
            };
            self.sync_pending(&mut syncer);
            self.seal_if_journal_grew();
            if shutdown {
                return;
            }
        }
    }

    /// Periodic mode: fsync every `interval` when something was written, and in between
    /// start the writeback of new journal pages every [`WRITEBACK_EVERY`] (see
    /// [`JournalSyncer::start_writeback`]).
    fn run_periodic(&self, interval: Duration) {
        let mut syncer = JournalSyncer::new(&self.path);
        let mut last_sync = Instant::now();
        loop {
            let wait = interval
                .saturating_sub(last_sync.elapsed())
                .min(WRITEBACK_EVERY);
            let shutdown = {
                let req = self.lock_request();
                let (req, _) = self
                    .wake
                    .wait_timeout_while(req, wait, |r| !r.shutdown)
                    .unwrap_or_else(|e| e.into_inner());
                req.shutdown
            };
            if shutdown || last_sync.elapsed() >= interval {
                self.sync_pending(&mut syncer);
                last_sync = Instant::now();
            } else if self.pending_upto().is_some() {
                syncer.start_writeback();
            }
            self.seal_if_journal_grew();
            if shutdown {
                return;
            }
        }
    }
}

/// One fjall database: its journal, memtables, version lock, sync thread and partition
/// stripes. `Storage` keeps one per shard, so that shards share nothing on the write path.
pub(crate) struct Store {
    /// Stops itself when dropped: first of the fields, so before the database it reads.
    _reaper: MemtableReaper,
    db: Database,
    data: Keyspace,
    meta: Keyspace,
    stripes: Box<[Mutex<Stripe>]>,
    /// Persisted bound on every stored timestamp (see `TimestampCeiling`).
    ceiling: TimestampCeiling,
    /// Rows written without reading the row they replace, for tests and metrics.
    replaced_rows: AtomicU64,
    commit: Arc<CommitShared>,
    durability: Durability,
    sync_thread: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop_sync_thread();
    }
}

fn io(e: fjall::Error) -> StorageError {
    tracing::error!(error = ?e, "storage I/O error");
    StorageError::Io("storage engine error")
}

/// One entry of a commit, keyed by its fjall key.
enum Pending {
    Header(PartitionHeader),
    Row {
        row: StoredRow,
        /// Its lowest timestamp when the write sets every regular column of the table
        /// (`RegularColumns::replaced_by`): above the stripe's newest, it needs no read.
        replaces_from: Option<i64>,
        stripe: usize,
    },
}

/// Mutations in storage form, ready to commit to one store: what `prepare` makes before
/// any lock is taken, and what a batchlog record holds.
pub(crate) struct Prepared {
    entries: BTreeMap<Vec<u8>, Pending>,
    /// Lock stripes of the partitions touched, ascending and unique.
    stripes: Vec<usize>,
}

/// Batchlog entry kinds.
const LOGGED_HEADER: u8 = 0;
const LOGGED_ROW: u8 = 1;

impl Prepared {
    /// Whether there is nothing to commit.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends the entries for a batchlog record: count, then per entry its kind, key and
    /// value (each with a u32 length).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) -> Result<(), StorageError> {
        let len = |n: usize| {
            u32::try_from(n).map_err(|_| StorageError::TooLarge("batch too large for the batchlog"))
        };
        out.extend_from_slice(&len(self.entries.len())?.to_be_bytes());
        let mut value = Vec::new();
        for (key, pending) in &self.entries {
            value.clear();
            let kind = match pending {
                Pending::Header(h) => {
                    h.encode(&mut value)?;
                    LOGGED_HEADER
                }
                Pending::Row { row, .. } => {
                    row.encode(&mut value)?;
                    LOGGED_ROW
                }
            };
            out.push(kind);
            out.extend_from_slice(&len(key.len())?.to_be_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(&len(value.len())?.to_be_bytes());
            out.extend_from_slice(&value);
        }
        Ok(())
    }

    /// Decodes what `encode` wrote from the front of `input`, advancing it. Replayed rows
    /// always merge with what is stored (a replay may follow a newer write).
    pub(crate) fn decode(input: &mut &[u8]) -> Result<Prepared, StorageError> {
        const BAD: StorageError = StorageError::Corrupt("bad batchlog record");
        fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], StorageError> {
            if input.len() < n {
                return Err(BAD);
            }
            let (head, rest) = input.split_at(n);
            *input = rest;
            Ok(head)
        }
        let count = take_batchlog_len(input)?;
        let mut entries = BTreeMap::new();
        let mut stripes = Vec::new();
        for _ in 0..count {
            let kind = take(input, 1)?[0];
            let key_len = take_batchlog_len(input)?;
            let key = take(input, key_len)?.to_vec();
            let value_len = take_batchlog_len(input)?;
            let value = take(input, value_len)?;
            let stripe = Store::stripe_of_key(&key)?;
            stripes.push(stripe);
            let pending = match kind {
                LOGGED_HEADER => Pending::Header(PartitionHeader::decode_value(value)?),
                LOGGED_ROW => Pending::Row {
                    row: StoredRow::decode_value(value)?,
                    replaces_from: None,
                    stripe,
                },
                _ => return Err(BAD),
            };
            entries.insert(key, pending);
        }
        stripes.sort_unstable();
        stripes.dedup();
        Ok(Prepared { entries, stripes })
    }
}

/// Reads a batchlog length (u32, big-endian) from the front of `input`, advancing it.
pub(crate) fn take_batchlog_len(input: &mut &[u8]) -> Result<usize, StorageError> {
    let (head, rest) = input
        .split_first_chunk::<4>()
        .ok_or(StorageError::Corrupt("bad batchlog record"))?;
    *input = rest;
    Ok(u32::from_be_bytes(*head) as usize)
}

/// What one partition lock stripe guards besides the partitions themselves.
struct Stripe {
    /// No stored row of a partition in this stripe has a timestamp above this one.
    newest: i64,
}

/// Meta key of the persisted timestamp ceiling.
const CEILING_KEY: &[u8] = b"storage/timestamp-ceiling";

/// How far above a write's timestamp the persisted ceiling is moved, so that it is
/// rewritten about once per this many microseconds of server time, not per write.
const CEILING_HEADROOM_MICROS: i64 = 10_000_000;

/// A bound on every timestamp ever stored, kept in the meta keyspace and moved up in the
/// same journal batch as the write that passes it, so that after a restart it still bounds
/// whatever the journal recovered. It seeds every stripe's `newest` at open.
struct TimestampCeiling {
    value: std::sync::atomic::AtomicI64,
    /// Held across the commit of a batch that moves the ceiling: moves land in order.
    moving: Mutex<()>,
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

    /// [`Store::open`], sealing the data memtable after `journal_bytes_per_memtable` of
    /// writes instead of [`JOURNAL_BYTES_PER_MEMTABLE`] (tests use a small bound).
    pub(crate) fn open_with_journal_bound(
        path: &std::path::Path,
        durability: Durability,
        cache_bytes: u64,
        journal_bytes_per_memtable: u64,
    ) -> Result<Store, StorageError> {
        let db = Database::builder(path)
            .cache_size(cache_bytes)
            // fjall flushes each batch to the OS itself (survives kill -9); fsync is ours.
            .manual_journal_persist(false)
            // Bounded recovery time and disk: past this journal size fjall flushes
            // memtables so that old journals can go (each memtable is bounded by fjall's
            // per-keyspace limit).
            .max_journaling_size(MAX_JOURNAL_BYTES)
            .open()
            .map_err(io)?;
        let data = db
            .keyspace(DATA_KEYSPACE, || {
                KeyspaceCreateOptions::default()
                    .max_memtable_size(DATA_MEMTABLE_BYTES)
                    .data_block_restart_interval_policy(RestartIntervalPolicy::all(
                        DATA_BLOCK_RESTART_INTERVAL,
                    ))
            })
            .map_err(io)?;
        let meta = db
            .keyspace(META_KEYSPACE, KeyspaceCreateOptions::default)
            .map_err(io)?;
        let (durable, _) = watch::channel(DurableState {
            upto: 0,
            failed: false,
            closed: false,
        });
        let commit = Arc::new(CommitShared {
            db: db.clone(),
            data: data.clone(),
            journal_bytes: AtomicU64::new(0),
            journal_bytes_per_memtable,
            path: path.to_path_buf(),
            applied: AtomicU64::new(0),
            in_os: AtomicU64::new(0),
            buffer_flushes: AtomicU64::new(0),
            request: Mutex::new(SyncRequest::default()),
            wake: Condvar::new(),
            durable,
            fsyncs: AtomicU64::new(0),
            memtables_sealed: AtomicU64::new(0),
            #[cfg(test)]
            gate: std::sync::RwLock::new(()),
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
        let reaper = MemtableReaper::start(data.clone())
            .map_err(|_| StorageError::Io("cannot start the memtable reaper thread"))?;
        let ceiling = load_timestamp_ceiling(&data, &meta)?;
        let stripes = (0..STRIPES)
            .map(|_| Mutex::new(Stripe { newest: ceiling }))
            .collect();
        Ok(Store {
            db,
            data,
            meta,
            stripes,
            ceiling: TimestampCeiling {
                value: std::sync::atomic::AtomicI64::new(ceiling),
                moving: Mutex::new(()),
            },
            replaced_rows: AtomicU64::new(0),
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

    fn check_open(&self) -> Result<(), StorageError> {
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

    /// The stripe of the partition a data key (or a partition's key prefix) belongs to.
    fn stripe_of_key(key: &[u8]) -> Result<usize, StorageError> {
        const SHORT: StorageError = StorageError::Corrupt("short data key");
        let table: TableId = key.get(..16).and_then(|t| t.try_into().ok()).ok_or(SHORT)?;
        let token = keycodec::token_from_bytes(
            key.get(16..24)
                .and_then(|t| t.try_into().ok())
                .ok_or(SHORT)?,
        );
        Ok(Self::stripe_of(&table, token))
    }

    /// Converts mutations to storage form, merging entries for the same key. No lock held.
    pub(crate) fn prepare<'a, 'l: 'a>(
        mutations: impl IntoIterator<Item = &'a (&'l TableLayout, Mutation)>,
    ) -> Result<Prepared, StorageError> {
        let mutations = mutations.into_iter();
        let mut entries: BTreeMap<Vec<u8>, Pending> = BTreeMap::new();
        let mut stripes = Vec::with_capacity(mutations.size_hint().0);
        for (layout, m) in mutations {
            if layout.id != m.table {
                return Err(StorageError::Corrupt(
                    "mutation and layout name different tables",
                ));
            }
            let prefix = keycodec::partition_prefix(&m.table, m.token, &m.partition_key);
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
                let key = keycodec::header_key(&prefix);
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
                            },
                        );
                    }
                }
            }
        }
        stripes.sort_unstable();
        stripes.dedup();
        Ok(Prepared { entries, stripes })
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
        self.check_open()?;
        let Prepared { entries, stripes } = prepared;
        if entries.is_empty() && batchlog.is_none() {
            return Ok(self.commit.applied.load(Ordering::Acquire));
        }
        // Appended to the journal buffer only: `wait_durable` moves it to the OS once per turn.
        // Room for every entry, the batchlog record and a timestamp-ceiling move.
        let mut batch = fjall::OwnedWriteBatch::with_capacity(self.db.clone(), entries.len() + 2)
            .durability(None);
        // One buffer for every entry, sized for a typical row so that encoding does not
        // grow it step by step (each step is a reallocation and a copy).
        let mut buf = Vec::with_capacity(ENCODE_BUFFER_BYTES);
        // Partitions that got a new deletion, to purge the rows it shadows afterwards.
        let mut purges: Vec<(Vec<u8>, PartitionHeader, Vec<ByteRange>)> = Vec::new();
        let mut replaced = 0u64;
        let mut journal_bytes = 0u64;
        let newest_written = entries
            .values()
            .map(|p| match p {
                Pending::Header(h) => h.max_timestamp(),
                Pending::Row { row, .. } => row.max_timestamp(),
            })
            .max()
            .unwrap_or(i64::MIN);
        {
            // Stripes are taken in ascending order: two batches cannot deadlock.
            let mut guards: Vec<MutexGuard<'_, Stripe>> = stripes
                .iter()
                .map(|&i| self.stripes[i].lock().unwrap_or_else(|e| e.into_inner()))
                .collect();
            for (key, pending) in entries {
                buf.clear();
                if let Pending::Row {
                    row,
                    replaces_from: Some(oldest),
                    stripe,
                } = &pending
                {
                    let newest_stored = stripes
                        .binary_search(stripe)
                        .map_or(i64::MAX, |at| guards[at].newest);
                    if *oldest > newest_stored {
                        // Everything stored under this key is older than every cell of a
                        // write that sets the whole row: the merge would return `row`.
                        row.encode(&mut buf)?;
                        journal_bytes += (key.len() + buf.len()) as u64;
                        batch.insert(&self.data, key, buf.as_slice());
                        replaced += 1;
                        continue;
                    }
                }
                let existing = self.data.get(&key).map_err(io)?;
                match pending {
                    Pending::Header(incoming) => {
                        let mut header = match existing {
                            Some(v) => PartitionHeader::decode_value(&v)?,
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
                            purges.push((prefix, header.clone(), purge_ranges));
                        }
                        if header.range_tombstones.len() > MAX_RANGE_TOMBSTONES {
                            return Err(StorageError::TooLarge(
                                "too many range tombstones in partition",
                            ));
                        }
                        header.encode(&mut buf)?;
                    }
                    Pending::Row { row: incoming, .. } => {
                        let row = match existing {
                            Some(v) => {
                                let mut row = StoredRow::decode_value(&v)?;
                                row.merge(incoming);
                                row
                            }
                            None => incoming,
                        };
                        row.encode(&mut buf)?;
                    }
                }
                journal_bytes += (key.len() + buf.len()) as u64;
                batch.insert(&self.data, key, buf.as_slice());
            }
            if let Some((key, value)) = batchlog {
                batch.insert(&self.meta, key, value);
            }
            self.commit_with_ceiling(batch, newest_written)?;
            for guard in &mut guards {
                guard.newest = guard.newest.max(newest_written);
            }
        }
        if replaced > 0 {
            self.replaced_rows.fetch_add(replaced, Ordering::Relaxed);
        }
        self.commit
            .journal_bytes
            .fetch_add(journal_bytes, Ordering::Relaxed);
        // The ticket is handed out after the batch is in the journal, so an fsync that
        // starts after reading `applied >= t` covers ticket t.
        let ticket = self.commit.applied.fetch_add(1, Ordering::AcqRel) + 1;
        if self.durability == Durability::Batch {
            self.commit.lock_request().pending = true;
            self.commit.wake.notify_one();
        }
        for (prefix, header, ranges) in purges {
            for range in &ranges {
                self.purge_shadowed_rows(&prefix, &header, range)?;
            }
        }
        Ok(ticket)
    }

    /// Commits `batch`; when it stores a timestamp above the persisted ceiling, the batch
    /// also moves the ceiling (atomically with the data, in order with other moves).
    fn commit_with_ceiling(
        &self,
        mut batch: fjall::OwnedWriteBatch,
        newest_written: i64,
    ) -> Result<(), StorageError> {
        let ceiling = &self.ceiling;
        if newest_written <= ceiling.value.load(Ordering::Acquire) {
            return batch.commit().map_err(io);
        }
        let _moving = ceiling.moving.lock().unwrap_or_else(|e| e.into_inner());
        let current = ceiling.value.load(Ordering::Acquire);
        if newest_written <= current {
            return batch.commit().map_err(io);
        }
        let next = newest_written.saturating_add(CEILING_HEADROOM_MICROS);
        batch.insert(&self.meta, CEILING_KEY, next.to_be_bytes());
        batch.commit().map_err(io)?;
        ceiling.value.store(next, Ordering::Release);
        Ok(())
    }

    /// Physically removes the rows of a partition that its header's deletions shadow
    /// entirely (every timestamp in the row at or below the covering deletion). Reads
    /// already skip them; removing them keeps deleted partitions from growing without
    /// bound and from filling reads with dead rows. Safe at any time: the header keeps
    /// the deletion, so a late write under it stays hidden, and a header's deletions only
    /// ever grow, so an older copy of it is conservative. Runs in chunks, each under the
    /// partition's stripe lock (a concurrent write to a row cannot be lost), only over
    /// `range` (where the new deletion applies), and stops after `PURGE_ROWS_PER_APPLY`
    /// rows so that one delete does bounded work.
    fn purge_shadowed_rows(
        &self,
        prefix: &[u8],
        header: &PartitionHeader,
        range: &ByteRange,
    ) -> Result<(), StorageError> {
        let stripe = Self::stripe_of_key(prefix)?;
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
            for guard in self
                .data
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
                    batch.remove(&self.data, key.clone());
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

    /// Resolves once the ticket's write is durable: in Batch mode after the group fsync; in
    /// Periodic mode once it is in the OS (the next timed fsync makes it durable).
    pub(crate) async fn wait_durable(&self, ticket: u64) -> Result<(), StorageError> {
        if let Durability::Periodic { .. } = self.durability {
            return self.wait_in_os(ticket).await;
        }
        let mut rx = self.commit.durable.subscribe();
        let state = rx
            .wait_for(|d| d.failed || d.closed || d.upto >= ticket)
            .await
            .map_err(|_| StorageError::Closed)?;
        if state.upto >= ticket {
            Ok(())
        } else if state.failed {
            Err(StorageError::Io("journal fsync failed"))
        } else {
            Err(StorageError::Closed)
        }
    }

    /// True in Periodic mode, where a write is acknowledged once its journal buffer is in the
    /// OS (see `Storage::durable_at_ack_barrier`).
    pub(crate) fn journal_in_os_is_durable(&self) -> bool {
        matches!(self.durability, Durability::Periodic { .. })
    }

    /// Periodic mode: moves the journal buffer to the OS if a write applied since the last
    /// flush is not there yet (two atomic loads otherwise). Batch mode: nothing (the sync
    /// thread flushes before each fsync, and answers wait for the fsync).
    pub(crate) fn flush_journal_to_os(&self) -> Result<(), StorageError> {
        let commit = &self.commit;
        if !self.journal_in_os_is_durable()
            || commit.in_os.load(Ordering::Acquire) >= commit.applied.load(Ordering::Acquire)
        {
            return Ok(());
        }
        commit.flush_buffer_for_writers()
    }

    /// Group flush to the OS: the first writer to wait lets the rest of its event-loop turn
    /// run first (their batches join the journal buffer), then flushes them all with one
    /// `write(2)`; the others find their ticket already flushed.
    async fn wait_in_os(&self, ticket: u64) -> Result<(), StorageError> {
        let commit = &self.commit;
        if commit.in_os.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        tokio::task::yield_now().await;
        if commit.in_os.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        // (Also after `close`: its final fsync already covered what it could, this is cheap.)
        commit.flush_buffer_for_writers()
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
        self.data.prefix(table).count()
    }

    /// Test hook: memtables the sync thread sealed because the journal grew.
    #[cfg(test)]
    pub(crate) fn memtables_sealed_for_journal(&self) -> u64 {
        self.commit.memtables_sealed.load(Ordering::Relaxed)
    }

    /// The number of disk tables of the data keyspace.
    pub(crate) fn data_table_count(&self) -> usize {
        self.data.table_count()
    }

    /// Test hook: journal files on disk, the active one included.
    #[cfg(test)]
    pub(crate) fn journal_count(&self) -> usize {
        self.db.journal_count()
    }

    /// Test hook: holds the sync thread before its next fsync while the guard lives.
    #[cfg(test)]
    pub(crate) fn hold_sync(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.commit.gate.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads one partition: rows in `slice` (reversed if asked), resuming strictly after
    /// `after` (a full clustering key) when given, at most `limit` rows. TTL-expired cells and
    /// rows are not returned (`now_secs` = now as epoch seconds).
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
        let snapshot = self.db.snapshot();
        let prefix = keycodec::partition_prefix(&layout.id, token, partition_key);

        let mut ranges = Vec::with_capacity(slice.ranges.len());
        let resume = match after {
            Some(ck) => Some(keycodec::clustering_bytes(&layout.clustering, ck)?),
            None => None,
        };
        for (start, end) in &slice.ranges {
            // A full primary key (or a table without clustering columns) is a point read:
            // a `get` uses the bloom filters and skips building a range iterator.
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
        let mut header = if header_in_range {
            PartitionHeader::default()
        } else {
            read_header(&snapshot, &self.data, &header_key)?
        };
        let mut row_prefix = prefix;
        row_prefix.push(KIND_ROW);
        let mut out = PartitionRead {
            static_row: None,
            rows: Vec::new(),
            more: false,
        };
        let mut dead = 0usize;
        'ranges: for (i, (range, point)) in ranges.iter().enumerate() {
            let with_header = header_in_range && i == 0;
            let iter: Box<
                dyn Iterator<Item = Result<(fjall::UserKey, fjall::UserValue), StorageError>>,
            > = match point {
                Some(k) => {
                    let mut key = row_prefix.clone();
                    key.extend_from_slice(k);
                    let found = snapshot.get(&self.data, &key).map_err(io)?;
                    Box::new(
                        found
                            .map(|v| Ok((fjall::UserKey::from(key), v)))
                            .into_iter(),
                    )
                }
                None => {
                    let (mut lo, hi) = full_range(&row_prefix, range);
                    if with_header {
                        lo = Bound::Included(header_key.clone());
                    }
                    let iter = snapshot
                        .range(&self.data, (lo, hi))
                        .map(|g| g.into_inner().map_err(io));
                    if slice.reversed {
                        Box::new(iter.rev())
                    } else {
                        Box::new(iter)
                    }
                }
            };
            for entry in iter {
                let (key, value) = entry?;
                if with_header && *key == header_key[..] {
                    header = PartitionHeader::decode_value(&value)?;
                    continue;
                }
                let clustering = key.get(row_prefix.len()..).unwrap_or(&[]);
                let row = StoredRow::decode_value(&value)?;
                match row.live_view(header.deletion_for(clustering), now_secs) {
                    Some(view) => {
                        if out.rows.len() >= limit {
                            out.more = true;
                            break 'ranges;
                        }
                        out.rows.push(view);
                    }
                    None => {
                        dead += 1;
                        if dead > MAX_DEAD_ROWS_PER_READ {
                            return Err(StorageError::TooLarge(
                                "read stepped over too many dead rows",
                            ));
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

    /// Token-ordered scan of a table from `start` up to `end` (token bound), returning at most
    /// `row_limit` rows in total (a partition with only a static row counts as 1) and where to resume.
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
        let snapshots: Vec<fjall::Snapshot> = stores.iter().map(|s| s.db.snapshot()).collect();
        let table = keycodec::table_prefix(&layout.id);
        let token_key = |t: i64| {
            let mut k = table.to_vec();
            k.extend_from_slice(&keycodec::token_bytes(t));
            k
        };
        let table_end = keycodec::prefix_successor(&table);
        let hi: Option<Vec<u8>> = match end {
            Bound::Unbounded => table_end.clone(),
            Bound::Excluded(t) => Some(token_key(t)),
            Bound::Included(t) => match t.checked_add(1) {
                Some(n) => Some(token_key(n)),
                None => table_end.clone(),
            },
        };
        // The partition being assembled (a resumed one starts the page).
        let mut current: Option<ScanCursor> = None;
        let lo: Vec<u8> = match start {
            ScanStart::Token(Bound::Unbounded) => table.to_vec(),
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
                let prefix = keycodec::partition_prefix(&layout.id, *token, partition_key);
                let (snapshot, store) = snapshots
                    .get(resume_in)
                    .zip(stores.get(resume_in))
                    .ok_or(StorageError::Corrupt("resumed partition in no store"))?;
                let header = read_header(snapshot, &store.data, &keycodec::header_key(&prefix))?;
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
        let mut dead = 0usize;
        // Position after the last item returned: (token, partition key, last clustering key).
        let mut last_pos: Option<(i64, Bytes, Option<Vec<Bytes>>)> = None;
        let mut stopped = false;
        let range = (Bound::Included(lo), upper);
        let merged = MergedRange::new(
            snapshots
                .iter()
                .zip(stores)
                .map(|(snapshot, store)| snapshot.range(&store.data, range.clone()))
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
                        PartitionHeader::decode_value(&value)?
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
                        if dead > MAX_DEAD_ROWS_PER_READ {
                            return Err(StorageError::TooLarge(
                                "scan stepped over too many dead rows",
                            ));
                        }
                    }
                    continue;
                }
            }
            if kind != KIND_ROW {
                return Err(StorageError::Corrupt("unexpected entry kind in data key"));
            }
            let row = StoredRow::decode_value(&value)?;
            match row.live_view(c.header.deletion_for(clustering), now_secs) {
                Some(view) => {
                    if c.static_slot_free {
                        // The static row was counted as this partition's row; its first
                        // live row takes that place.
                        c.static_slot_free = false;
                    } else if rows_out >= row_limit {
                        c.read.more = true;
                        stopped = true;
                        break;
                    } else {
                        rows_out += 1;
                    }
                    last_pos = Some((
                        c.token,
                        c.partition_key.clone(),
                        Some(view.clustering.clone()),
                    ));
                    c.read.rows.push(view);
                }
                None => {
                    dead += 1;
                    if dead > MAX_DEAD_ROWS_PER_READ {
                        return Err(StorageError::TooLarge(
                            "scan stepped over too many dead rows",
                        ));
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

    /// Deletes all data of a table (TRUNCATE / DROP TABLE).
    pub(crate) fn truncate(&self, table: TableId) -> Result<(), StorageError> {
        self.check_open()?;
        let prefix = keycodec::table_prefix(&table);
        loop {
            let keys: Vec<fjall::UserKey> = self
                .data
                .prefix(prefix)
                .take(TRUNCATE_CHUNK)
                .map(|g| g.key())
                .collect::<Result<_, _>>()
                .map_err(io)?;
            if keys.is_empty() {
                break;
            }
            let mut batch = self.db.batch();
            for k in keys {
                batch.remove(&self.data, k);
            }
            batch.commit().map_err(io)?;
        }
        self.db.persist(PersistMode::SyncAll).map_err(io)
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

    /// Removes a batchlog record, without waiting for it to reach the disk.
    pub(crate) fn forget_batchlog(&self, key: &[u8]) -> Result<(), StorageError> {
        self.check_open()?;
        let mut batch = self.db.batch().durability(None);
        batch.remove(&self.meta, key);
        batch.commit().map_err(io)
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
        // The sync thread makes everything applied so far durable before it exits.
        self.stop_sync_thread();
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

    /// Seals both keyspaces' memtables and waits, at most `limit`, until fjall has written
    /// them to disk tables and let their journals go, so that a restart after a clean
    /// shutdown replays no journal.
    pub(crate) fn flush_memtables(&self, limit: Duration) {
        let started = Instant::now();
        for keyspace in [&self.data, &self.meta] {
            if let Err(e) = keyspace.rotate_memtable() {
                tracing::warn!(error = ?e, "cannot seal a memtable at shutdown; the journal keeps it");
                return;
            }
        }
        while self.data.sealed_memtable_count() + self.meta.sealed_memtable_count() > 0 {
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

/// The persisted timestamp ceiling. A database written before there was one gets it from
/// one scan of every stored entry (then persisted); an empty one starts below every timestamp.
fn load_timestamp_ceiling(data: &Keyspace, meta: &Keyspace) -> Result<i64, StorageError> {
    if let Some(v) = meta.get(CEILING_KEY).map_err(io)? {
        let bytes: [u8; 8] = v
            .as_ref()
            .try_into()
            .map_err(|_| StorageError::Corrupt("bad timestamp ceiling"))?;
        return Ok(i64::from_be_bytes(bytes));
    }
    let mut newest = i64::MIN;
    for guard in data.iter() {
        let (key, value) = guard.into_inner().map_err(io)?;
        let (_, _, kind, _) = keycodec::split_data_key(&key)?;
        let stored = if kind == KIND_HEADER {
            PartitionHeader::decode_value(&value)?.max_timestamp()
        } else {
            StoredRow::decode_value(&value)?.max_timestamp()
        };
        newest = newest.max(stored);
    }
    if newest > i64::MIN {
        tracing::info!("timestamp ceiling computed from a scan of the stored data");
        meta.insert(CEILING_KEY, newest.to_be_bytes()).map_err(io)?;
    }
    Ok(newest)
}

/// Reads and decodes a partition header (absent = empty) by its key
/// ([`keycodec::header_key`]).
fn read_header(
    snapshot: &fjall::Snapshot,
    data: &Keyspace,
    header_key: &[u8],
) -> Result<PartitionHeader, StorageError> {
    match snapshot.get(data, header_key).map_err(io)? {
        Some(v) => PartitionHeader::decode_value(&v),
        None => Ok(PartitionHeader::default()),
    }
}

/// The fjall key range of a clustering byte range within one partition's rows.
fn full_range(row_prefix: &[u8], range: &ByteRange) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
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

/// Several stores' entries in one ascending key order. A key lives in one store only, so
/// there are no ties to break; each store's iterator is read one entry ahead.
struct MergedRange {
    iters: Vec<fjall::Iter>,
    heads: Vec<Option<fjall::KvPair>>,
    started: bool,
}

impl MergedRange {
    fn new(iters: Vec<fjall::Iter>) -> MergedRange {
        let heads = iters.iter().map(|_| None).collect();
        MergedRange {
            iters,
            heads,
            started: false,
        }
    }

    fn pull(iter: &mut fjall::Iter) -> Result<Option<fjall::KvPair>, StorageError> {
        iter.next().map(|g| g.into_inner().map_err(io)).transpose()
    }

    fn advance(&mut self) -> Result<Option<fjall::KvPair>, StorageError> {
        if !self.started {
            self.started = true;
            for (head, iter) in self.heads.iter_mut().zip(&mut self.iters) {
                *head = Self::pull(iter)?;
            }
        }
        let next = self
            .heads
            .iter()
            .enumerate()
            .filter_map(|(i, h)| h.as_ref().map(|(k, _)| (i, k)))
            .min_by(|a, b| a.1.cmp(b.1))
            .map(|(i, _)| i);
        let Some(i) = next else {
            return Ok(None);
        };
        let item = self.heads[i].take();
        self.heads[i] = Self::pull(&mut self.iters[i])?;
        Ok(item)
    }
}

impl Iterator for MergedRange {
    type Item = Result<fjall::KvPair, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.advance().transpose()
    }
}
