//! Physical removal of the rows that a partition's deletions shadow, on a background thread.
//!
//! Reads already skip rows that a partition deletion or a range tombstone shadows, so a
//! commit only records the work: a purge record in the meta keyspace, written in the same
//! engine batch as the new deletion, and a job in a bounded queue. The purger thread then
//! removes the shadowed rows in chunks, each under the partition's stripe lock, and removes
//! the record. A job dropped because the queue was full, or lost to a restart, keeps its
//! record: the purger loads the records again once its queue drains (and at every open), so
//! no deleted partition's rows stay on disk for good.

use super::gc::{self, GcGraces};
use super::read::full_range;
use super::tables::Tables;
use super::{io, Store, Stripe};
use crate::keycodec::{self, ByteRange, KIND_ROW};
use crate::model::TableId;
use crate::row::{GcHorizon, PartitionHeader, StoredRow};
use crate::StorageError;
use fjall::{Database, Keyspace};
use std::collections::VecDeque;
use std::ops::Bound;
#[cfg(test)]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Rows examined per stripe-lock hold while purging (bounds the lock hold time).
const PURGE_CHUNK: usize = 256;

/// Most purge jobs queued per store; past it a job is dropped (its record stays, so a later
/// reload of the records purges it).
pub(crate) const PURGE_QUEUE_JOBS: usize = 1024;

/// Meta key prefix of purge records: `PURGE_RECORD_PREFIX ‖ table id ‖ partition prefix` →
/// the record's generation (u64, big-endian).
pub(super) const PURGE_RECORD_PREFIX: &[u8] = b"storage/purge/";

/// Pause after a job failed, so that a failing disk does not turn the purger into a busy loop.
const PURGE_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// One partition whose shadowed rows are to be removed, over `ranges` of its rows.
pub(super) struct PurgeJob {
    pub(super) table: TableId,
    /// The partition's key prefix (token and partition key).
    pub(super) prefix: Vec<u8>,
    /// Where its new deletions apply, in encoded clustering bounds.
    pub(super) ranges: Vec<ByteRange>,
    /// Asked by a compaction that found the header's deletions past gc_grace: drop them
    /// once nothing they shadow is left.
    pub(super) drop_past_gc: bool,
}

/// The meta key of the purge record of `table`'s partition `prefix`.
pub(super) fn purge_record_key(table: &TableId, prefix: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(PURGE_RECORD_PREFIX.len() + table.len() + prefix.len());
    key.extend_from_slice(PURGE_RECORD_PREFIX);
    key.extend_from_slice(table);
    key.extend_from_slice(prefix);
    key
}

/// The purger of one store: its queue and its thread (at background priority).
pub(super) struct Purger {
    shared: Arc<PurgeShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct PurgeState {
    queue: VecDeque<PurgeJob>,
    /// Records may exist that no queued job covers: load them once the queue drains.
    reload: bool,
    /// A job is being run (tests wait for the purger to be idle).
    running: bool,
    stop: bool,
}

/// The purger's queue, shared with the compaction filter (which asks for the header
/// deletions it finds past gc_grace to be dropped) from before the database opens.
pub(super) struct PurgeInbox {
    state: Mutex<PurgeState>,
    /// Wakes the thread (a job, a stop, a release of the test hold).
    wake: Condvar,
    /// Wakes whoever waits for an idle purger.
    idle: Condvar,
    /// Jobs dropped because the queue was full.
    dropped: AtomicU64,
}

impl PurgeInbox {
    /// An empty inbox; the purger loads the purge records when it starts.
    pub(super) fn new() -> PurgeInbox {
        PurgeInbox {
            state: Mutex::new(PurgeState {
                queue: VecDeque::new(),
                reload: true,
                running: false,
                stop: false,
            }),
            wake: Condvar::new(),
            idle: Condvar::new(),
            dropped: AtomicU64::new(0),
        }
    }

    fn lock_state(&self) -> MutexGuard<'_, PurgeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`, or drops it (counted) when the queue is full. A job with a purge
    /// record (`recorded`) is then found again by a reload of the records; a gc request
    /// is made again by the next compaction that sees the header.
    pub(super) fn enqueue(&self, job: PurgeJob, recorded: bool) {
        let mut state = self.lock_state();
        if state.queue.len() >= PURGE_QUEUE_JOBS {
            state.reload |= recorded;
            drop(state);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        state.queue.push_back(job);
        debug_assert!(
            state.queue.len() <= PURGE_QUEUE_JOBS,
            "the purge queue is bounded"
        );
        drop(state);
        self.wake.notify_all();
    }
}

struct PurgeShared {
    db: Database,
    meta: Keyspace,
    tables: Arc<Tables>,
    stripes: Arc<[Mutex<Stripe>]>,
    graces: Arc<GcGraces>,
    inbox: Arc<PurgeInbox>,
    /// Generation of the next purge record: a job removes its record only if no later
    /// deletion rewrote it meanwhile. Seeded from the clock at open, so that it does not
    /// repeat a generation written before a restart.
    generation: AtomicU64,
    /// Rows the purger examined.
    examined: AtomicU64,
    /// Test hook: jobs wait while this is set.
    #[cfg(test)]
    held: AtomicBool,
}

impl Purger {
    /// Starts the purger of a store; it first loads the purge records left by an earlier run.
    pub(super) fn start(
        db: Database,
        meta: Keyspace,
        tables: Arc<Tables>,
        stripes: Arc<[Mutex<Stripe>]>,
        graces: Arc<GcGraces>,
        inbox: Arc<PurgeInbox>,
    ) -> Result<Purger, StorageError> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let shared = Arc::new(PurgeShared {
            db,
            meta,
            tables,
            stripes,
            graces,
            inbox,
            generation: AtomicU64::new(seed),
            examined: AtomicU64::new(0),
            #[cfg(test)]
            held: AtomicBool::new(false),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-purge".into())
            .spawn(move || thread_shared.run())
            .map_err(|_| StorageError::Io("cannot start the purge thread"))?;
        Ok(Purger {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The generation to write in a new purge record.
    pub(super) fn next_generation(&self) -> u64 {
        self.shared.generation.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues the job of a committed deletion, or drops it (counted) when the queue is
    /// full: the rows stay hidden by the deletion, and the job's record has them purged
    /// after the queue drains.
    pub(super) fn enqueue(&self, job: PurgeJob) {
        self.shared.inbox.enqueue(job, true);
    }

    /// Jobs dropped because the queue was full (tests, metrics).
    pub(super) fn dropped_jobs(&self) -> u64 {
        self.shared.inbox.dropped.load(Ordering::Relaxed)
    }

    /// Jobs waiting in the queue (metrics).
    pub(super) fn queued_jobs(&self) -> u64 {
        self.shared.inbox.lock_state().queue.len() as u64
    }

    /// Rows examined by the purger (tests, metrics).
    pub(super) fn rows_examined(&self) -> u64 {
        self.shared.examined.load(Ordering::Relaxed)
    }

    /// Stops the thread after its current chunk; unfinished jobs keep their records.
    pub(super) fn stop(&self) {
        self.shared.inbox.lock_state().stop = true;
        self.shared.inbox.wake.notify_all();
        self.shared.inbox.idle.notify_all();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            if t.join().is_err() {
                tracing::error!("purge thread panicked");
            }
        }
    }

    /// Test hook: waits at most `limit` until every queued job and record is done; true
    /// when the purger is idle.
    #[cfg(test)]
    pub(super) fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let mut state = self.shared.inbox.lock_state();
        loop {
            if state.queue.is_empty() && !state.running && !state.reload {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline || state.stop {
                return false;
            }
            state = self
                .shared
                .inbox
                .idle
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Test hook: holds the purger before its next job while the guard lives.
    #[cfg(test)]
    pub(super) fn hold(&self) -> PurgeHold<'_> {
        self.shared.held.store(true, Ordering::Release);
        PurgeHold(self)
    }
}

impl Drop for Purger {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Test hook: releases the purger when dropped.
#[cfg(test)]
pub(crate) struct PurgeHold<'a>(&'a Purger);

#[cfg(test)]
impl Drop for PurgeHold<'_> {
    fn drop(&mut self) {
        self.0.shared.held.store(false, Ordering::Release);
        self.0.shared.inbox.wake.notify_all();
    }
}

/// How a job ended.
enum JobEnd {
    Done,
    Stopped,
}

impl PurgeShared {
    fn lock_state(&self) -> MutexGuard<'_, PurgeState> {
        self.inbox.lock_state()
    }

    fn held(&self) -> bool {
        #[cfg(test)]
        return self.held.load(Ordering::Acquire);
        #[cfg(not(test))]
        false
    }

    fn stopping(&self) -> bool {
        self.lock_state().stop
    }

    fn run(&self) {
        crate::background::lower_current_thread();
        loop {
            let job = {
                let mut state = self.lock_state();
                loop {
                    if state.stop {
                        return;
                    }
                    if !self.held() {
                        if let Some(job) = state.queue.pop_front() {
                            state.running = true;
                            break Some(job);
                        }
                        if state.reload {
                            state.reload = false;
                            state.running = true;
                            break None;
                        }
                    }
                    self.inbox.idle.notify_all();
                    state = self
                        .inbox
                        .wake
                        .wait(state)
                        .unwrap_or_else(|e| e.into_inner());
                }
            };
            let outcome = match job {
                Some(job) => self.run_job(&job),
                None => self.reload_records().map(|()| JobEnd::Done),
            };
            if let Err(e) = outcome {
                // The record stays: the next reload (at open, or after a dropped job) retries
                // it; retrying at once would spin on a failing disk.
                tracing::warn!(error = ?e, "cannot purge the rows a deletion shadows");
                std::thread::sleep(PURGE_RETRY_PAUSE);
            }
            self.lock_state().running = false;
            if matches!(outcome, Ok(JobEnd::Stopped)) {
                return;
            }
        }
    }

    /// Queues a job for up to [`PURGE_QUEUE_JOBS`] of the records in the meta keyspace;
    /// when there may be more, reloads again once those are done.
    fn reload_records(&self) -> Result<(), StorageError> {
        let mut jobs = Vec::new();
        for guard in self.meta.prefix(PURGE_RECORD_PREFIX) {
            let key = guard.key().map_err(io)?;
            let rest = key.get(PURGE_RECORD_PREFIX.len()..).unwrap_or(&[]);
            let (Some(table), Some(prefix)) = (
                rest.get(..16).and_then(|t| TableId::try_from(t).ok()),
                rest.get(16..),
            ) else {
                return Err(StorageError::Corrupt("bad purge record"));
            };
            jobs.push(PurgeJob {
                table,
                prefix: prefix.to_vec(),
                ranges: vec![ByteRange { lo: None, hi: None }],
                drop_past_gc: false,
            });
            if jobs.len() == PURGE_QUEUE_JOBS {
                break;
            }
        }
        let mut state = self.lock_state();
        if jobs.len() == PURGE_QUEUE_JOBS {
            state.reload = true;
        }
        for job in jobs {
            if state.queue.len() >= PURGE_QUEUE_JOBS {
                state.reload = true;
                break;
            }
            state.queue.push_back(job);
        }
        Ok(())
    }

    /// Removes the rows of `job`'s partition that its header's deletions shadow entirely
    /// (every timestamp in the row at or below the covering deletion), then its record.
    /// Safe at any time: the header keeps the deletion, so a late write under it stays
    /// hidden. Each chunk reads the current header under the partition's stripe lock (so a
    /// concurrent write to a row cannot be lost) and the table's current keyspace under the
    /// registry (so a TRUNCATE or DROP never waits for more than a chunk).
    fn run_job(&self, job: &PurgeJob) -> Result<JobEnd, StorageError> {
        let stripe = Store::stripe_of_key(&job.table, &job.prefix)?;
        let record = purge_record_key(&job.table, &job.prefix);
        let header_key = keycodec::header_key(&job.prefix);
        let mut row_prefix = job.prefix.clone();
        row_prefix.push(KIND_ROW);
        // The record as this job first saw it: a deletion committed later rewrites it.
        let mut first_seen: Option<Option<fjall::Slice>> = None;
        'ranges: for range in &job.ranges {
            let (mut from, end) = full_range(&row_prefix, range);
            loop {
                if self.stopping() {
                    return Ok(JobEnd::Stopped);
                }
                let registry = self.tables.read();
                let Some(keyspace) = registry.keyspace(&job.table) else {
                    // Dropped: its keyspace is being deleted whole.
                    break 'ranges;
                };
                let _guard = self.stripes[stripe]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if first_seen.is_none() {
                    first_seen = Some(self.meta.get(&record).map_err(io)?);
                }
                let Some(header) = keyspace.get(&header_key).map_err(io)? else {
                    // No header, no deletion (the table was truncated since).
                    break 'ranges;
                };
                let header = PartitionHeader::decode_value(&header)?;
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
                self.examined.fetch_add(seen as u64, Ordering::Relaxed);
                if seen < PURGE_CHUNK {
                    break;
                }
            }
        }
        // Under the stripe lock: a deletion of the partition commits either before (and
        // rewrote the record, which then stays for its own job) or after (a new record).
        let registry = self.tables.read();
        let _guard = self.stripes[stripe]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let (true, Some(keyspace)) = (job.drop_past_gc, registry.keyspace(&job.table)) {
            self.drop_deletions_past_gc(keyspace, &header_key, &row_prefix)?;
        }
        let now = self.meta.get(&record).map_err(io)?;
        if first_seen.is_none_or(|seen| seen == now) && now.is_some() {
            let mut batch = self.db.batch().durability(None);
            batch.remove(&self.meta, record);
            batch.commit().map_err(io)?;
        }
        Ok(JobEnd::Done)
    }

    /// Drops the header's partition deletion and range tombstones older than the table's
    /// gc_grace once nothing they shadow is left, so that a deleted partition does not keep
    /// its header for ever. Runs under the partition's stripe lock (the caller's) over at
    /// most `PURGE_CHUNK` rows: each is either wholly shadowed (removed here, an engine
    /// tombstone that hides its older versions) or wholly newer than its covering deletion,
    /// so no read changes. A larger partition, or a row only partly shadowed, keeps them. A
    /// write arriving later under a dropped deletion is visible, as in Cassandra once the
    /// tombstone is purged.
    fn drop_deletions_past_gc(
        &self,
        keyspace: &Keyspace,
        header_key: &[u8],
        row_prefix: &[u8],
    ) -> Result<(), StorageError> {
        let Some(grace) = self.graces.get(keyspace.name()) else {
            return Ok(());
        };
        let horizon = GcHorizon::new(gc::now_secs(), grace);
        let Some(value) = keyspace.get(header_key).map_err(io)? else {
            return Ok(());
        };
        let header = PartitionHeader::decode_value(&value)?;
        let mut kept = header.clone();
        kept.deletion = kept.deletion.filter(|&d| !horizon.tombstone_purgeable(d));
        kept.range_tombstones
            .retain(|t| !horizon.tombstone_purgeable(t.timestamp));
        if kept.deletion == header.deletion
            && kept.range_tombstones.len() == header.range_tombstones.len()
        {
            return Ok(());
        }
        if let (Some(s), Some(d)) = (&header.static_row, header.deletion) {
            if s.min_timestamp() <= d {
                return Ok(());
            }
        }
        let mut batch = self.db.batch();
        let mut rows = 0usize;
        for guard in keyspace.prefix(row_prefix) {
            rows += 1;
            if rows > PURGE_CHUNK {
                return Ok(());
            }
            let (key, value) = guard.into_inner().map_err(io)?;
            let clustering = key.get(row_prefix.len()..).unwrap_or(&[]);
            let Some(covering) = header.deletion_for(clustering) else {
                continue;
            };
            let row = StoredRow::decode_value(&value)?;
            if row.max_timestamp() <= covering {
                batch.remove(keyspace, key.clone());
            } else if row.min_timestamp() <= covering {
                return Ok(());
            }
        }
        self.examined.fetch_add(rows as u64, Ordering::Relaxed);
        if kept.is_empty() {
            batch.remove(keyspace, header_key);
        } else {
            let mut encoded = Vec::new();
            kept.encode(&mut encoded)?;
            batch.insert(keyspace, header_key, encoded);
        }
        batch.commit().map_err(io)
    }
}
