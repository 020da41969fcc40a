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
