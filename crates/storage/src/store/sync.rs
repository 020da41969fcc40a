//! The sync thread (group commit and periodic fsync of the journal) and the waits for
//! durability.

use super::tables::Tables;
use super::{io, Store};
use crate::journal_sync::{JournalSyncer, SideSyncError};
use crate::{Durability, StorageError};
use fjall::{Database, PersistMode};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// In periodic mode, how often the sync thread starts the writeback of new journal pages
/// between two fsyncs.
const WRITEBACK_EVERY: Duration = Duration::from_millis(100);

/// How far the journal is known durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DurableState {
    /// Every ticket up to this one is durable.
    pub(super) upto: u64,
    /// An fsync failed: fjall is poisoned and nothing further becomes durable.
    pub(super) failed: bool,
    /// Storage is closed: tickets above `upto` will never become durable.
    pub(super) closed: bool,
}

/// What the sync thread measures of its group fsyncs, so that admission can tell how long a
/// write begun now will wait for the fsync that makes it durable. Written by the sync thread
/// alone, read by the shards with relaxed loads (an estimate, never a promise).
#[derive(Debug)]
pub(crate) struct FsyncGauge {
    /// The origin of the nanosecond instants below.
    epoch: Instant,
    /// Start of the fsync in progress, nanoseconds since `epoch` plus one (zero: none).
    running_since: AtomicU64,
    /// The last ticket the fsync in progress covers; later tickets wait for the next one.
    running_upto: AtomicU64,
    /// Tickets the fsync in progress covers.
    running_tickets: AtomicU64,
    /// The bare cost of an fsync, nanoseconds: a low quantile of recent durations (drops at
    /// once to a shorter fsync, rises slowly towards longer ones).
    floor_nanos: AtomicU64,
    /// Recent time an fsync spent beyond its bare cost, nanoseconds (moving average).
    extra_nanos: AtomicU64,
    /// Recent tickets per fsync (moving average), the divisor of `extra_nanos`.
    tickets: AtomicU64,
}

/// Weight of a new fsync in the gauge's moving averages (1/16).
const GAUGE_SHIFT: u32 = 4;
/// How slowly the fsync floor rises towards a longer fsync (1/64 of the gap per fsync).
const FLOOR_RISE_SHIFT: u32 = 6;
/// Fixed-point scale of the gauge's ticket average (1/1024 of a ticket).
const TICKET_SCALE: u64 = 1024;

impl FsyncGauge {
    /// A gauge that has measured nothing yet (it estimates no wait until the first fsync).
    pub(super) fn new() -> FsyncGauge {
        FsyncGauge {
            epoch: Instant::now(),
            running_since: AtomicU64::new(0),
            running_upto: AtomicU64::new(0),
            running_tickets: AtomicU64::new(0),
            floor_nanos: AtomicU64::new(0),
            extra_nanos: AtomicU64::new(0),
            tickets: AtomicU64::new(0),
        }
    }

    fn nanos_now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// An fsync covering tickets `from + 1 ..= upto` starts now.
    fn started(&self, from: u64, upto: u64) -> u64 {
        debug_assert!(upto > from, "an fsync covers at least one ticket");
        let now = self.nanos_now();
        self.running_upto.store(upto, Ordering::Relaxed);
        self.running_tickets
            .store(upto.saturating_sub(from), Ordering::Relaxed);
        self.running_since
            .store(now.saturating_add(1), Ordering::Release);
        now
    }

    /// The fsync begun at `started` (see [`Self::started`]) ended: feed its duration.
    fn finished(&self, started: u64) {
        let took = self.nanos_now().saturating_sub(started);
        let tickets = self.running_tickets.load(Ordering::Relaxed).max(1);
        self.running_since.store(0, Ordering::Release);
        self.record(took, tickets);
    }

    /// Feeds one fsync that took `took` nanoseconds for `tickets` tickets.
    fn record(&self, took: u64, tickets: u64) {
        let floor = self.floor_nanos.load(Ordering::Relaxed);
        let floor = if floor == 0 || took < floor {
            took
        } else {
            floor + ((took - floor) >> FLOOR_RISE_SHIFT)
        };
        self.floor_nanos.store(floor.max(1), Ordering::Relaxed);
        let extra = took.saturating_sub(floor);
        let avg = |a: &AtomicU64, sample: u64| {
            let old = a.load(Ordering::Relaxed);
            let new = if old == 0 {
                sample
            } else {
                old - (old >> GAUGE_SHIFT) + (sample >> GAUGE_SHIFT)
            };
            a.store(new, Ordering::Relaxed);
        };
        avg(&self.extra_nanos, extra);
        avg(&self.tickets, tickets.saturating_mul(TICKET_SCALE));
    }

    /// How long an fsync covering `tickets` tickets is expected to take: its bare cost plus
    /// the recent cost per ticket beyond it.
    fn expected_fsync(&self, tickets: u64) -> u64 {
        let floor = self.floor_nanos.load(Ordering::Relaxed);
        let per_ticket = self.tickets.load(Ordering::Relaxed).max(1);
        let extra = self.extra_nanos.load(Ordering::Relaxed);
        let beyond = u128::from(extra) * u128::from(tickets) * u128::from(TICKET_SCALE)
            / u128::from(per_ticket);
        floor.saturating_add(u64::try_from(beyond).unwrap_or(u64::MAX))
    }

    /// The expected wait of a write begun now for the group fsync that makes it durable,
    /// when `applied` is the newest ticket handed out and tickets up to `durable` are
    /// durable: the rest of the fsync in progress, then one that covers every write after
    /// it, this one included. An fsync that already ran longer than expected (the disk is
    /// busy with flushes, say) is expected to take about as long again. Zero before any
    /// fsync was measured.
    pub(crate) fn expected_wait(&self, applied: u64, durable: u64) -> Duration {
        if self.floor_nanos.load(Ordering::Relaxed) == 0 {
            return Duration::ZERO;
        }
        let since = self.running_since.load(Ordering::Acquire);
        let (rest, covered) = if since == 0 {
            (0, durable)
        } else {
            let elapsed = self.nanos_now().saturating_sub(since - 1);
            let expected = self.expected_fsync(self.running_tickets.load(Ordering::Relaxed));
            let rest = if elapsed < expected {
                expected - elapsed
            } else {
                elapsed
            };
            (rest, self.running_upto.load(Ordering::Relaxed).max(durable))
        };
        let next = self.expected_fsync(applied.saturating_sub(covered).saturating_add(1));
        Duration::from_nanos(rest.saturating_add(next))
    }

    /// The bare cost of one fsync, as measured (zero before the first).
    pub(crate) fn floor(&self) -> Duration {
        Duration::from_nanos(self.floor_nanos.load(Ordering::Relaxed))
    }
}

/// Requests to the sync thread.
#[derive(Debug, Default)]
pub(super) struct SyncRequest {
    pub(super) pending: bool,
    pub(super) shutdown: bool,
}

/// State shared by writers and the sync thread.
pub(super) struct CommitShared {
    pub(super) db: Database,
    /// The tables, whose memtables the sync thread seals (`seal_if_journal_grew`).
    pub(super) tables: Arc<Tables>,
    /// Key and value bytes committed to the tables since their memtables were last sealed
    /// for journal growth (the journal's own framing is not counted).
    pub(super) journal_bytes: AtomicU64,
    /// Journal bytes after which the sync thread seals the memtable.
    pub(super) journal_bytes_per_memtable: u64,
    pub(super) path: std::path::PathBuf,
    /// Last ticket handed out; a ticket is handed out only after its batch is in the journal.
    pub(super) applied: AtomicU64,
    /// Commits begun: counted just before a batch goes to the journal, so it is never below
    /// `applied`, and every commit a read could see is covered once `applied` reaches the
    /// value it had after that read (see [`Store::seen_upto`]).
    pub(super) begun: AtomicU64,
    /// Every ticket up to this one is in the OS (survives the process, not the machine).
    pub(super) in_os: AtomicU64,
    /// Journal buffer flushes (`write(2)` calls) made for waiting writers, for tests and metrics.
    pub(super) buffer_flushes: AtomicU64,
    pub(super) request: Mutex<SyncRequest>,
    pub(super) wake: Condvar,
    pub(super) durable: watch::Sender<DurableState>,
    pub(super) fsyncs: AtomicU64,
    /// Memtables sealed for journal growth (read by tests).
    pub(super) memtables_sealed: AtomicU64,
    /// Test hook: a test holding the write side stops the sync thread before its next fsync
    /// (uncontended otherwise: one read lock per fsync).
    pub(super) gate: std::sync::RwLock<()>,
    /// The group fsyncs' durations, for admission (Batch mode only).
    pub(super) gauge: FsyncGauge,
}

impl CommitShared {
    pub(super) fn lock_request(&self) -> MutexGuard<'_, SyncRequest> {
        self.request.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the journal buffer to the OS; every ticket handed out before it is then there.
    fn flush_buffer(&self) -> Result<(), StorageError> {
        let upto = self.applied.load(Ordering::SeqCst);
        self.db.persist(PersistMode::Buffer).map_err(io)?;
        self.in_os.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// [`flush_buffer`](Self::flush_buffer) on behalf of waiting writers (counted apart from
    /// the sync thread's flushes).
    pub(super) fn flush_buffer_for_writers(&self) -> Result<(), StorageError> {
        self.flush_buffer()?;
        self.buffer_flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The newest ticket applied but not yet durable, if any (and the journal has not failed).
    pub(super) fn pending_upto(&self) -> Option<u64> {
        let upto = self.applied.load(Ordering::SeqCst);
        let current = *self.durable.borrow();
        (!current.failed && upto > current.upto).then_some(upto)
    }

    /// Fsyncs the journal if tickets are pending and publishes the new durable point.
    fn sync_pending(&self, syncer: &mut JournalSyncer) {
        let _gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
        let Some(upto) = self.pending_upto() else {
            return;
        };
        let started = self.gauge.started(self.durable.borrow().upto, upto);
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
                self.gauge.finished(started);
                self.fsyncs.fetch_add(1, Ordering::Relaxed);
                self.durable.send_modify(|d| d.upto = d.upto.max(upto));
            }
            Err(()) => {
                self.gauge.finished(started);
                tracing::error!("journal fsync failed; writes can no longer be made durable");
                self.durable.send_modify(|d| d.failed = true);
            }
        }
    }

    /// Seals the tables' memtables once their writes have put `journal_bytes_per_memtable`
    /// into the journal, so that fjall flushes them and rotates the journal (see
    /// [`JOURNAL_BYTES_PER_MEMTABLE`](super::JOURNAL_BYTES_PER_MEMTABLE)).
    fn seal_if_journal_grew(&self) {
        if self.journal_bytes.load(Ordering::Relaxed) < self.journal_bytes_per_memtable {
            return;
        }
        self.journal_bytes.store(0, Ordering::Relaxed);
        let mut sealed = false;
        for keyspace in self.tables.read().keyspaces() {
            match keyspace.rotate_memtable() {
                Ok(rotated) => sealed |= rotated,
                Err(e) => {
                    tracing::error!(error = ?e, "cannot seal a memtable for journal growth");
                }
            }
        }
        if sealed {
            self.memtables_sealed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Group commit: fsync as soon as something is pending; writers arriving during an
    /// fsync are covered by the next one.
    pub(super) fn run_batch(&self) {
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
    pub(super) fn run_periodic(&self, interval: Duration) {
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

impl Store {
    /// A ticket covering every commit a read that has already returned could have seen:
    /// such a commit was in the journal before the read saw it, so it was begun by now and
    /// its ticket is at most this one, or it is covered by an fsync that starts after the
    /// read (which is what waiting for a ticket above every one handed out needs).
    pub(crate) fn seen_upto(&self) -> u64 {
        self.commit.begun.load(Ordering::SeqCst)
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

    /// Batch mode: how long a write begun now is expected to wait for the group fsync that
    /// makes it durable (see [`FsyncGauge::expected_wait`]), and the bare cost of one fsync.
    /// Periodic mode: zero, since a write waits for no fsync.
    pub(crate) fn group_commit_wait(&self) -> (Duration, Duration) {
        if self.journal_in_os_is_durable() {
            return (Duration::ZERO, Duration::ZERO);
        }
        let commit = &self.commit;
        let applied = commit.applied.load(Ordering::Relaxed);
        let durable = commit.durable.borrow().upto;
        (
            commit.gauge.expected_wait(applied, durable),
            commit.gauge.floor(),
        )
    }

    /// True in Periodic mode, where a write is acknowledged once its journal buffer is in the
    /// OS (see `Storage::durable_at_ack_barrier`).
    pub(crate) fn journal_in_os_is_durable(&self) -> bool {
        matches!(self.durability, Durability::Periodic { .. })
    }

    /// Periodic mode: moves the journal buffer to the OS if a write begun since the last
    /// flush is not there yet (two atomic loads otherwise; `begun`, not `applied`, so that a
    /// commit an answer read while its ticket was not handed out yet is flushed too). Batch
    /// mode: nothing (the sync thread flushes before each fsync, and answers wait for the fsync).
    pub(crate) fn flush_journal_to_os(&self) -> Result<(), StorageError> {
        let commit = &self.commit;
        if !self.journal_in_os_is_durable()
            || commit.in_os.load(Ordering::SeqCst) >= commit.begun.load(Ordering::SeqCst)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A gauge whose epoch lies `ago` in the past, so that a test can place an fsync that
    /// started before now without sleeping.
    fn gauge_started(ago: Duration) -> FsyncGauge {
        let g = FsyncGauge::new();
        FsyncGauge {
            epoch: g.epoch.checked_sub(ago).unwrap_or(g.epoch),
            ..g
        }
    }

    #[test]
    fn nothing_measured_means_no_wait() {
        let g = FsyncGauge::new();
        assert_eq!(g.expected_wait(100, 0), Duration::ZERO);
        assert_eq!(g.floor(), Duration::ZERO);
    }

    #[test]
    fn a_lone_write_waits_one_bare_fsync_and_a_crowd_waits_for_its_size() {
        let g = FsyncGauge::new();
        // Light load: 1 ms fsyncs of a few writes.
        for _ in 0..64 {
            g.record(MS, 4);
        }
        assert_eq!(g.floor(), Duration::from_millis(1));
        assert_eq!(g.expected_wait(10, 10), Duration::from_millis(1), "alone");
        assert_eq!(g.expected_wait(12, 10), Duration::from_millis(1));
        // Heavy load: fsyncs of 100 writes take 3 ms, 2 ms beyond the bare cost.
        for _ in 0..256 {
            g.record(3 * MS, 100);
        }
        let floor = g.floor();
        assert!(floor >= Duration::from_millis(1) && floor < Duration::from_millis(3));
        let extra = 3 * MS - floor.as_nanos() as u64;
        // 199 writes pending and this one: the bare cost plus twice the measured extra.
        let wait = g.expected_wait(199, 0).as_nanos() as u64;
        let want = floor.as_nanos() as u64 + 2 * extra;
        assert!(
            wait.abs_diff(want) < want / 20,
            "expected about {want} ns, got {wait}"
        );
        // The floor drops at once to a shorter fsync.
        g.record(MS / 2, 1);
        assert_eq!(g.floor(), Duration::from_micros(500));
    }

    #[test]
    fn an_fsync_in_progress_adds_its_rest_and_an_overrun_counts_as_long_again() {
        let g = gauge_started(Duration::from_millis(50));
        for _ in 0..64 {
            g.record(2 * MS, 10);
        }
        // An fsync of 10 writes started just now: a new write waits for its rest, then
        // one more fsync.
        g.started(0, 10);
        let after = g.expected_wait(10, 0);
        assert!(after > Duration::from_millis(3) && after <= Duration::from_millis(4));
        // The same fsync, started 40 ms ago (the disk is busy): its rest is taken as 40 ms.
        g.running_since.store(10 * MS + 1, Ordering::Release);
        let stalled = g.expected_wait(10, 0);
        assert!(
            stalled >= Duration::from_millis(42),
            "a stalled fsync is expected to run about as long again: {stalled:?}"
        );
        g.finished(10 * MS);
        assert_eq!(
            g.running_since.load(Ordering::Acquire),
            0,
            "none in progress"
        );
        // One more fsync, now a little longer: the 40 ms one is in the averages.
        let next = g.expected_wait(10, 10);
        assert!(next > Duration::from_millis(2) && next < Duration::from_millis(10));
    }
}
