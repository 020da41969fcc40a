//! The Raft log, vote and committed index in fjall, under the node's `meta/` directory.
//!
//! Layout: keyspace `raft_log` maps the big-endian log index to the JSON entry; keyspace
//! `raft_state` holds `vote`, `committed`, `last_purged` and the snapshot (`snapshot_meta`,
//! `snapshot_data`). Appends and votes are fsynced before openraft hears they are durable.

// openraft's storage traits fix the (large) error type these functions return.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader, StorageIOError, Vote};

use crate::types::{Entry, LogId, SnapshotMeta, StorageError, TypeConfig};

const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";
const SNAPSHOT_META: &str = "snapshot_meta";
const SNAPSHOT_DATA: &str = "snapshot_data";

/// The fjall database of one metadata node, shared by its log store and state machine.
#[derive(Clone)]
pub(crate) struct MetaStore {
    inner: Arc<StoreInner>,
}

struct StoreInner {
    db: Database,
    log: Keyspace,
    state: Keyspace,
}

fn io_error(subject: ErrorSubject<u64>, verb: ErrorVerb, error: &fjall::Error) -> StorageError {
    StorageIOError::new(subject, verb, openraft::AnyError::new(error)).into()
}

fn decode_error(subject: ErrorSubject<u64>, error: &serde_json::Error) -> StorageError {
    StorageIOError::new(subject, ErrorVerb::Read, openraft::AnyError::new(error)).into()
}

impl MetaStore {
    /// Opens (or creates) the database in `dir`.
    pub(crate) fn open(dir: &Path) -> Result<MetaStore, fjall::Error> {
        std::fs::create_dir_all(dir)?;
        // Metadata is small: one worker thread and a small cache keep it out of the data path.
        let db = Database::builder(dir)
            .worker_threads(1)
            .cache_size(8 << 20)
            .open()?;
        let log = db.keyspace("raft_log", KeyspaceCreateOptions::default)?;
        let state = db.keyspace("raft_state", KeyspaceCreateOptions::default)?;
        Ok(MetaStore {
            inner: Arc::new(StoreInner { db, log, state }),
        })
    }

    fn read_state<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
        subject: ErrorSubject<u64>,
    ) -> Result<Option<T>, StorageError> {
        let Some(bytes) = self
            .inner
            .state
            .get(key)
            .map_err(|e| io_error(subject.clone(), ErrorVerb::Read, &e))?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| decode_error(subject, &e))
    }

    /// Writes state keys in one batch, then fsyncs when `sync` says the caller relies on it.
    fn write_state(
        &self,
        pairs: &[(&str, Vec<u8>)],
        subject: ErrorSubject<u64>,
        sync: bool,
    ) -> Result<(), StorageError> {
        let mut batch = self.inner.db.batch();
        for (key, value) in pairs {
            batch.insert(&self.inner.state, *key, value.as_slice());
        }
        batch
            .commit()
            .map_err(|e| io_error(subject.clone(), ErrorVerb::Write, &e))?;
        if sync {
            self.sync(subject)?;
        }
        Ok(())
    }

    fn sync(&self, subject: ErrorSubject<u64>) -> Result<(), StorageError> {
        self.inner
            .db
            .persist(PersistMode::SyncAll)
            .map_err(|e| io_error(subject, ErrorVerb::Write, &e))
    }

    /// A handle that tells whether the database is still open somewhere.
    pub(crate) fn watch_closed(&self) -> std::sync::Weak<impl Sized> {
        Arc::downgrade(&self.inner)
    }

    /// The stored snapshot, if any.
    pub(crate) fn read_snapshot(&self) -> Result<Option<(SnapshotMeta, Vec<u8>)>, StorageError> {
        let Some(meta) =
            self.read_state::<SnapshotMeta>(SNAPSHOT_META, ErrorSubject::Snapshot(None))?
        else {
            return Ok(None);
        };
        let data = self
            .inner
            .state
            .get(SNAPSHOT_DATA)
            .map_err(|e| io_error(ErrorSubject::Snapshot(None), ErrorVerb::Read, &e))?
            .map(|v| v.to_vec())
            .unwrap_or_default();
        Ok(Some((meta, data)))
    }

    /// Stores a snapshot durably, replacing the previous one.
    pub(crate) fn write_snapshot(
        &self,
        meta: &SnapshotMeta,
        data: &[u8],
    ) -> Result<(), StorageError> {
        let subject = ErrorSubject::Snapshot(Some(meta.signature()));
        let meta = serde_json::to_vec(meta).expect("snapshot meta serializes");
        self.write_state(
            &[(SNAPSHOT_META, meta), (SNAPSHOT_DATA, data.to_vec())],
            subject,
            true,
        )
    }

    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&x) => x,
            Bound::Excluded(&x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&x) => Bound::Included(x.to_be_bytes()),
            Bound::Excluded(&x) => Bound::Excluded(x.to_be_bytes()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut entries = Vec::new();
        for guard in self
            .inner
            .log
            .range::<[u8; 8], _>((Bound::Included(start.to_be_bytes()), end))
        {
            let value = guard
                .value()
                .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, &e))?;
            let entry: Entry =
                serde_json::from_slice(&value).map_err(|e| decode_error(ErrorSubject::Logs, &e))?;
            entries.push(entry);
        }
        Ok(entries)
    }

    /// Removes the log entries whose index is in `range`, in one batch.
    fn remove_entries(&self, range: impl RangeBounds<[u8; 8]>) -> Result<(), StorageError> {
        let mut batch = self.inner.db.batch();
        for guard in self.inner.log.range::<[u8; 8], _>(range) {
            let key = guard
                .key()
                .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, &e))?;
            batch.remove(&self.inner.log, key);
        }
        batch
            .commit()
            .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Delete, &e))
    }
}

/// openraft's view of the log: reads, appends, truncation and purging.
#[derive(Clone)]
pub(crate) struct LogStore {
    store: MetaStore,
}

impl LogStore {
    /// The log of `store`.
    pub(crate) fn new(store: MetaStore) -> LogStore {
        LogStore { store }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.store.entries(range)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.store.read_state(LAST_PURGED, ErrorSubject::Store)?;
        let last = match self.store.inner.log.last_key_value() {
            None => None,
            Some(guard) => {
                let value = guard
                    .value()
                    .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, &e))?;
                let entry: Entry = serde_json::from_slice(&value)
                    .map_err(|e| decode_error(ErrorSubject::Logs, &e))?;
                Some(entry.log_id)
            }
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last.or(last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError> {
        let store = self.store.clone();
        let bytes = serde_json::to_vec(vote).expect("vote serializes");
        // A vote must be on disk before it is granted, or a restart could vote twice in a term.
        run_blocking(move || store.write_state(&[(VOTE, bytes)], ErrorSubject::Vote, true)).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        self.store.read_state(VOTE, ErrorSubject::Vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let bytes = serde_json::to_vec(&committed).expect("log id serializes");
        // A batch reaches the OS buffers but is not fsynced: a process crash keeps it, a machine
        // crash may lose it, which only means replaying less on restart and learning the rest
        // from the leader.
        self.store
            .write_state(&[(COMMITTED, bytes)], ErrorSubject::Store, false)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self
            .store
            .read_state::<Option<LogId>>(COMMITTED, ErrorSubject::Store)?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        for entry in entries {
            let value = serde_json::to_vec(&entry).expect("log entry serializes");
            encoded.push((entry.log_id.index.to_be_bytes(), value));
        }
        let store = self.store.clone();
        let result = run_blocking(move || {
            let inner = &store.inner;
            let mut batch = inner.db.batch();
            for (key, value) in encoded {
                batch.insert(&inner.log, key, value);
            }
            batch
                .commit()
                .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Write, &e))?;
            store.sync(ErrorSubject::Logs)
        })
        .await;
        // openraft is told the entries are durable only after the fsync returned.
        callback.log_io_completed(
            result
                .as_ref()
                .map(|_| ())
                .map_err(|e| std::io::Error::other(e.to_string())),
        );
        result
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let store = self.store.clone();
        run_blocking(move || {
            store.remove_entries(log_id.index.to_be_bytes()..)?;
            store.sync(ErrorSubject::Logs)
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let store = self.store.clone();
        run_blocking(move || {
            // The purge mark goes first, so a crash between the two leaves entries that are
            // ignored, never a gap that the log state does not explain.
            let mark = serde_json::to_vec(&log_id).expect("log id serializes");
            store.write_state(&[(LAST_PURGED, mark)], ErrorSubject::Store, true)?;
            store.remove_entries(..=log_id.index.to_be_bytes())
        })
        .await
    }
}

/// Runs blocking disk work (fsync) off the async workers.
async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(join) => Err(StorageIOError::new(
            ErrorSubject::Store,
            ErrorVerb::Write,
            openraft::AnyError::new(&join),
        )
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorageExt;
    use openraft::testing::{StoreBuilder, Suite};

    use super::*;
    use crate::state_machine::StateMachine;
    use crate::{Apply, MetaError};

    /// An application that keeps nothing: the suite checks the log and the Raft state.
    struct Nothing;

    impl Apply for Nothing {
        fn apply(&mut self, _index: u64, _command: &[u8]) -> Vec<u8> {
            Vec::new()
        }

        fn snapshot(&self) -> Vec<u8> {
            Vec::new()
        }

        fn restore(&mut self, _snapshot: &[u8]) -> Result<(), MetaError> {
            Ok(())
        }
    }

    struct FjallBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine<Nothing>, tempfile::TempDir> for FjallBuilder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateMachine<Nothing>), StorageError> {
            let dir = tempfile::tempdir().expect("temporary directory");
            let store = MetaStore::open(dir.path()).expect("open fjall");
            let state_machine = StateMachine::open(store.clone(), Nothing, 16, 16)?;
            Ok((dir, LogStore::new(store), state_machine))
        }
    }

    /// openraft's own conformance suite for log and state-machine storage.
    #[test]
    fn passes_the_openraft_storage_suite() {
        Suite::test_all(FjallBuilder).unwrap();
    }

    #[test]
    fn vote_log_and_purge_mark_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let vote = Vote::new(3, 2);
            {
                let mut log = LogStore::new(MetaStore::open(dir.path()).unwrap());
                log.save_vote(&vote).await.unwrap();
                let entries: Vec<Entry> = (1..=10)
                    .map(|index| Entry {
                        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(3, 2), index),
                        payload: openraft::EntryPayload::Blank,
                    })
                    .collect();
                // Returns once the append's flush callback has fired.
                log.blocking_append(entries).await.unwrap();
                log.purge(openraft::LogId::new(
                    openraft::CommittedLeaderId::new(3, 2),
                    4,
                ))
                .await
                .unwrap();
                log.truncate(openraft::LogId::new(
                    openraft::CommittedLeaderId::new(3, 2),
                    9,
                ))
                .await
                .unwrap();
            }
            let mut log = LogStore::new(MetaStore::open(dir.path()).unwrap());
            assert_eq!(log.read_vote().await.unwrap(), Some(vote));
            let state = log.get_log_state().await.unwrap();
            assert_eq!(state.last_purged_log_id.map(|id| id.index), Some(4));
            assert_eq!(state.last_log_id.map(|id| id.index), Some(8));
            let indexes: Vec<u64> = log
                .try_get_log_entries(0..100)
                .await
                .unwrap()
                .iter()
                .map(|e| e.log_id.index)
                .collect();
            assert_eq!(indexes, vec![5, 6, 7, 8]);
        });
    }
}
