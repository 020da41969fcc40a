//! openraft's state machine: request-id de-duplication around the application's [`Apply`].

// openraft's storage traits fix the (large) error type these functions return.
#![allow(clippy::result_large_err)]

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder, StorageIOError,
};
use tokio::sync::broadcast;

use crate::dedup::DedupTable;
use crate::log_store::MetaStore;
use crate::types::{
    Answer, Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use crate::{AppliedEvent, Apply};

/// What a snapshot holds: the de-duplication table and the application's own encoding.
#[derive(serde::Serialize, serde::Deserialize)]
struct SnapshotBody {
    dedup: DedupTable,
    #[serde(with = "crate::hex")]
    app: Vec<u8>,
}

/// The applied state, shared between openraft's state-machine task and the node's readers.
pub(crate) struct Applied<A> {
    pub(crate) app: A,
    dedup: DedupTable,
    last_applied: Option<LogId>,
    membership: StoredMembership,
}

/// The state behind a lock and the channel its events go out on.
pub(crate) struct SharedState<A> {
    applied: Mutex<Applied<A>>,
    events: broadcast::Sender<AppliedEvent>,
    /// `applied.last_applied`'s index, readable without the lock.
    last_applied: AtomicU64,
}

impl<A> SharedState<A> {
    /// Locks the applied state; a panic in `Apply` poisons nothing we cannot still read.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Applied<A>> {
        self.applied
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The index of the last applied entry (0: none).
    pub(crate) fn last_applied(&self) -> u64 {
        self.last_applied.load(Ordering::Acquire)
    }

    fn publish_applied(&self, applied: &Applied<A>) {
        self.last_applied.store(
            applied.last_applied.map_or(0, |id| id.index),
            Ordering::Release,
        );
    }

    /// A new subscription to applied events.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<AppliedEvent> {
        self.events.subscribe()
    }
}

/// The state machine openraft drives.
pub(crate) struct StateMachine<A> {
    shared: Arc<SharedState<A>>,
    store: MetaStore,
    dedup_capacity: usize,
    snapshots_built: u64,
}

fn snapshot_error<E: std::error::Error + 'static>(
    meta: Option<&SnapshotMeta>,
    verb: ErrorVerb,
    error: &E,
) -> StorageError {
    let subject = ErrorSubject::Snapshot(meta.map(|m| m.signature()));
    StorageIOError::new(subject, verb, openraft::AnyError::new(error)).into()
}

impl<A: Apply> StateMachine<A> {
    /// The state machine of `store`, restored from its stored snapshot if there is one.
    /// openraft then replays the committed log after the snapshot.
    pub(crate) fn open(
        store: MetaStore,
        app: A,
        dedup_capacity: usize,
        subscriber_capacity: usize,
    ) -> Result<StateMachine<A>, StorageError> {
        let (events, _) = broadcast::channel(subscriber_capacity.max(1));
        let mut applied = Applied {
            app,
            dedup: DedupTable::new(dedup_capacity),
            last_applied: None,
            membership: StoredMembership::default(),
        };
        if let Some((meta, data)) = store.read_snapshot()? {
            restore(&mut applied, &meta, &data, dedup_capacity)?;
        }
        let last_applied = AtomicU64::new(applied.last_applied.map_or(0, |id| id.index));
        Ok(StateMachine {
            shared: Arc::new(SharedState {
                applied: Mutex::new(applied),
                events,
                last_applied,
            }),
            store,
            dedup_capacity,
            snapshots_built: 0,
        })
    }

    /// The state shared with the node.
    pub(crate) fn shared(&self) -> Arc<SharedState<A>> {
        Arc::clone(&self.shared)
    }
}

fn restore<A: Apply>(
    applied: &mut Applied<A>,
    meta: &SnapshotMeta,
    data: &[u8],
    dedup_capacity: usize,
) -> Result<(), StorageError> {
    let body: SnapshotBody = serde_json::from_slice(data)
        .map_err(|e| snapshot_error(Some(meta), ErrorVerb::Read, &e))?;
    applied
        .app
        .restore(&body.app)
        .map_err(|e| snapshot_error(Some(meta), ErrorVerb::Read, &e))?;
    applied.dedup = body.dedup;
    applied.dedup.set_capacity(dedup_capacity);
    applied.last_applied = meta.last_log_id;
    applied.membership = meta.last_membership.clone();
    Ok(())
}

/// Builds a snapshot from state captured when openraft asked for the builder.
pub(crate) struct SnapshotBuilder {
    store: MetaStore,
    meta: SnapshotMeta,
    data: Vec<u8>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let store = self.store.clone();
        let meta = self.meta.clone();
        let data = std::mem::take(&mut self.data);
        let (meta, data) = match tokio::task::spawn_blocking(move || {
            store.write_snapshot(&meta, &data).map(|()| (meta, data))
        })
        .await
        {
            Ok(result) => result?,
            Err(join) => return Err(snapshot_error(Some(&self.meta), ErrorVerb::Write, &join)),
        };
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl<A: Apply> RaftStateMachine<TypeConfig> for StateMachine<A> {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let applied = self.shared.lock();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Answer>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries = entries.into_iter();
        let mut answers = Vec::with_capacity(entries.size_hint().0);
        let mut applied = self.shared.lock();
        for entry in entries {
            let index = entry.log_id.index;
            debug_assert!(
                applied.last_applied.is_none_or(|last| last.index < index),
                "entries apply in log order"
            );
            applied.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => answers.push(Answer {
                    index,
                    response: Vec::new(),
                }),
                EntryPayload::Membership(membership) => {
                    applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                    answers.push(Answer {
                        index,
                        response: Vec::new(),
                    });
                }
                EntryPayload::Normal(proposal) => {
                    if let Some(first) = applied.dedup.get(&proposal.request) {
                        answers.push(first.clone());
                        continue;
                    }
                    let response = applied.app.apply(index, &proposal.command);
                    let answer = Answer { index, response };
                    applied.dedup.insert(proposal.request, answer.clone());
                    answers.push(answer);
                    // No subscriber is not an error: caches subscribe when they need to.
                    let _ = self.shared.events.send(AppliedEvent::Command {
                        index,
                        command: proposal.command.into(),
                    });
                }
            }
        }
        self.shared.publish_applied(&applied);
        Ok(answers)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        self.snapshots_built += 1;
        let applied = self.shared.lock();
        // Encoded under the lock, so the snapshot is exactly the state at `last_applied`.
        let app = applied.app.snapshot();
        let data = encode_body(&applied.dedup, &app);
        let snapshot_id = match applied.last_applied {
            Some(last) => format!("{}-{}-{}", last.leader_id, last.index, self.snapshots_built),
            None => format!("--{}", self.snapshots_built),
        };
        SnapshotBuilder {
            store: self.store.clone(),
            meta: SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
                snapshot_id,
            },
            data,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        {
            let mut applied = self.shared.lock();
            restore(&mut applied, meta, &data, self.dedup_capacity)?;
            self.shared.publish_applied(&applied);
        }
        let store = self.store.clone();
        let stored_meta = meta.clone();
        match tokio::task::spawn_blocking(move || store.write_snapshot(&stored_meta, &data)).await {
            Ok(result) => result?,
            Err(join) => return Err(snapshot_error(Some(meta), ErrorVerb::Write, &join)),
        }
        let index = meta.last_log_id.map_or(0, |id| id.index);
        let _ = self.shared.events.send(AppliedEvent::Restored { index });
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        Ok(self.store.read_snapshot()?.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Encodes a [`SnapshotBody`] from borrowed parts.
fn encode_body(dedup: &DedupTable, app: &[u8]) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct BodyRef<'a> {
        dedup: &'a DedupTable,
        #[serde(with = "crate::hex")]
        app: &'a [u8],
    }
    serde_json::to_vec(&BodyRef { dedup, app }).expect("snapshot body serializes")
}
