//! The schema part of the metadata group's state: a map of named documents (one per keyspace
//! and table definition, whose content this crate does not interpret) with a schema epoch
//! that grows by one per accepted change.
//!
//! A change names the epoch it was built against (ScyllaDB's state id): apply refuses it as
//! `Stale` when another change was accepted since, so two nodes' concurrent DDL can never both
//! build on the same schema; the proposer re-reads and rebuilds. Apply is deterministic: the
//! documents, ids and timestamps all come from the proposer.
//!
//! The engine (which does interpret the documents) follows the applied state through a
//! [`SchemaFollower`], called on the state machine's task for every accepted change and on
//! every snapshot restore, so a change is installed on a node by the time its `propose`
//! returns there.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sluice_meta::MetaError;

/// The tag byte of schema commands, answers and snapshots in the shared group (topology
/// commands start with [`crate::topology::TOPOLOGY_VERSION_BYTE`]).
pub const SCHEMA_TAG: u8 = 2;

/// Most documents the schema may hold, so that the state (and its snapshot) stays bounded.
pub const MAX_SCHEMA_DOCUMENTS: usize = 65_536;

/// One change to one document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SchemaEdit {
    /// Creates or replaces the document `key`.
    Put {
        /// The document's name.
        key: String,
        /// Its content, as the proposer encoded it.
        value: String,
    },
    /// Removes the document `key` (nothing to do when it is absent).
    Delete {
        /// The document's name.
        key: String,
    },
}

impl SchemaEdit {
    /// The document this edit changes.
    pub fn key(&self) -> &str {
        match self {
            SchemaEdit::Put { key, .. } | SchemaEdit::Delete { key } => key,
        }
    }

    /// The new content, `None` for a removal.
    pub fn value(&self) -> Option<&str> {
        match self {
            SchemaEdit::Put { value, .. } => Some(value),
            SchemaEdit::Delete { .. } => None,
        }
    }
}

/// A schema change as proposed to the group: edits applied together, or not at all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaCommand {
    /// The epoch of the schema the proposer built the change against.
    pub base: u64,
    /// The edits, in order.
    pub edits: Vec<SchemaEdit>,
}

/// Why a schema command was refused. Small and `Copy`, with a fixed message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SchemaError {
    /// The command could not be decoded.
    Malformed,
    /// A command without edits, or an edit with an empty key.
    Empty,
    /// The change would take the schema past [`MAX_SCHEMA_DOCUMENTS`].
    TooManyDocuments,
}

impl SchemaError {
    /// The error's message.
    pub fn message(self) -> &'static str {
        match self {
            SchemaError::Malformed => "malformed schema command",
            SchemaError::Empty => "schema command without edits, or with an empty key",
            SchemaError::TooManyDocuments => "the schema would hold too many definitions",
        }
    }
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for SchemaError {}

/// The state machine's answer to a schema command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SchemaResponse {
    /// The change was accepted; the schema is now at `epoch`.
    Applied {
        /// The new epoch.
        epoch: u64,
    },
    /// The change was built against an older schema and changed nothing; rebuild it against
    /// `epoch`.
    Stale {
        /// The current epoch.
        epoch: u64,
    },
    /// The command was refused and changed nothing.
    Rejected(SchemaError),
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![SCHEMA_TAG];
    // Serializing these plain types into a Vec cannot fail.
    serde_json::to_writer(&mut out, value).unwrap_or_else(|_| unreachable!());
    out
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, SchemaError> {
    match bytes.split_first() {
        Some((&SCHEMA_TAG, body)) => {
            serde_json::from_slice(body).map_err(|_| SchemaError::Malformed)
        }
        _ => Err(SchemaError::Malformed),
    }
}

impl SchemaCommand {
    /// The command as it goes into the log.
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// A command from its log bytes.
    pub fn decode(bytes: &[u8]) -> Result<SchemaCommand, SchemaError> {
        decode(bytes)
    }
}

impl SchemaResponse {
    /// The answer as the proposer receives it.
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// An answer from its bytes.
    pub fn decode(bytes: &[u8]) -> Result<SchemaResponse, SchemaError> {
        decode(bytes)
    }
}

/// What follows the applied schema on this node (the engine). Called on the metadata state
/// machine's task with its lock held: it must not call back into the metadata node.
pub trait SchemaFollower: Send + Sync + 'static {
    /// A change was accepted: the schema is now `documents`, at `epoch`, after `edits`.
    fn applied(&self, epoch: u64, edits: &[SchemaEdit], documents: &BTreeMap<String, String>);

    /// The whole schema was replaced (a snapshot was installed, or the follower was just
    /// attached): it is now `documents`, at `epoch`.
    fn replaced(&self, epoch: u64, documents: &BTreeMap<String, String>);
}

#[derive(Default, Serialize, Deserialize)]
struct SchemaSnapshot {
    epoch: u64,
    documents: BTreeMap<String, String>,
}

/// The schema documents and their epoch, as part of the group's state machine.
#[derive(Default)]
pub struct SchemaState {
    epoch: u64,
    documents: BTreeMap<String, String>,
    /// Set once the engine exists; applies before that only update the documents, which the
    /// follower then receives whole.
    follower: Mutex<Option<Arc<dyn SchemaFollower>>>,
}

impl SchemaState {
    /// An empty schema at epoch 0 (no change was ever accepted).
    pub fn new() -> SchemaState {
        SchemaState::default()
    }

    /// The epoch: 0 before the first accepted change, one more per accepted change.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The documents by name.
    pub fn documents(&self) -> &BTreeMap<String, String> {
        &self.documents
    }

    /// Hands the current schema to `follower` and has it follow every later change. The
    /// caller holds the state machine's lock (`MetaNode::with_state`), so no change falls
    /// between the two.
    pub fn attach(&self, follower: Arc<dyn SchemaFollower>) {
        follower.replaced(self.epoch, &self.documents);
        *self.follower.lock().unwrap_or_else(|p| p.into_inner()) = Some(follower);
    }

    fn follower(&self) -> Option<Arc<dyn SchemaFollower>> {
        self.follower
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Applies one encoded command and answers it.
    pub fn apply(&mut self, command: &[u8]) -> SchemaResponse {
        let command = match SchemaCommand::decode(command) {
            Ok(command) => command,
            Err(error) => return SchemaResponse::Rejected(error),
        };
        if command.base != self.epoch {
            return SchemaResponse::Stale { epoch: self.epoch };
        }
        if command.edits.is_empty() || command.edits.iter().any(|e| e.key().is_empty()) {
            return SchemaResponse::Rejected(SchemaError::Empty);
        }
        let added = command
            .edits
            .iter()
            .filter(
                |e| matches!(e, SchemaEdit::Put { key, .. } if !self.documents.contains_key(key)),
            )
            .count();
        if self.documents.len() + added > MAX_SCHEMA_DOCUMENTS {
            return SchemaResponse::Rejected(SchemaError::TooManyDocuments);
        }
        for edit in &command.edits {
            match edit {
                SchemaEdit::Put { key, value } => {
                    self.documents.insert(key.clone(), value.clone());
                }
                SchemaEdit::Delete { key } => {
                    self.documents.remove(key);
                }
            }
        }
        self.epoch += 1;
        debug_assert!(self.documents.len() <= MAX_SCHEMA_DOCUMENTS);
        if let Some(follower) = self.follower() {
            follower.applied(self.epoch, &command.edits, &self.documents);
        }
        SchemaResponse::Applied { epoch: self.epoch }
    }

    /// The whole state, for a snapshot.
    pub fn snapshot(&self) -> Vec<u8> {
        encode(&SchemaSnapshot {
            epoch: self.epoch,
            documents: self.documents.clone(),
        })
    }

    /// Decodes a snapshot without installing it, so that a combined restore can check every
    /// part before it changes any.
    pub(crate) fn decode_snapshot(
        bytes: &[u8],
    ) -> Result<(u64, BTreeMap<String, String>), MetaError> {
        let snapshot: SchemaSnapshot = decode(bytes).map_err(|_| MetaError::Malformed)?;
        if snapshot.documents.len() > MAX_SCHEMA_DOCUMENTS {
            return Err(MetaError::Malformed);
        }
        Ok((snapshot.epoch, snapshot.documents))
    }

    /// Installs a decoded snapshot and tells the follower.
    pub(crate) fn install(&mut self, epoch: u64, documents: BTreeMap<String, String>) {
        self.epoch = epoch;
        self.documents = documents;
        if let Some(follower) = self.follower() {
            follower.replaced(self.epoch, &self.documents);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str) -> SchemaEdit {
        SchemaEdit::Put {
            key: key.to_owned(),
            value: value.to_owned(),
        }
    }

    fn command(base: u64, edits: Vec<SchemaEdit>) -> Vec<u8> {
        SchemaCommand { base, edits }.encode()
    }

    /// One call to the follower: the epoch, how many edits (0 for a replacement), the
    /// documents.
    type Seen = (u64, usize, BTreeMap<String, String>);

    /// Records what it is told, as the engine would install it.
    #[derive(Default)]
    struct Recorder {
        seen: Mutex<Vec<Seen>>,
    }

    impl SchemaFollower for Recorder {
        fn applied(&self, epoch: u64, edits: &[SchemaEdit], documents: &BTreeMap<String, String>) {
            self.seen
                .lock()
                .unwrap()
                .push((epoch, edits.len(), documents.clone()));
        }

        fn replaced(&self, epoch: u64, documents: &BTreeMap<String, String>) {
            self.seen
                .lock()
                .unwrap()
                .push((epoch, 0, documents.clone()));
        }
    }

    #[test]
    fn changes_apply_in_order_and_a_stale_base_changes_nothing() {
        let mut state = SchemaState::new();
        let recorder = Arc::new(Recorder::default());
        state.attach(recorder.clone());
        let first = command(
            0,
            vec![put("keyspace/ks", "{}"), put("table/ks/t", "{\"a\":1}")],
        );
        assert_eq!(state.apply(&first), SchemaResponse::Applied { epoch: 1 });
        // A second proposer built against epoch 0 too: refused, nothing changes.
        let racing = command(0, vec![put("table/ks/t", "{\"a\":2}")]);
        assert_eq!(state.apply(&racing), SchemaResponse::Stale { epoch: 1 });
        assert_eq!(state.documents()["table/ks/t"], "{\"a\":1}");
        // Rebuilt against epoch 1, it goes in.
        let rebuilt = command(
            1,
            vec![
                SchemaEdit::Delete {
                    key: "table/ks/t".to_owned(),
                },
                put("table/ks/u", "{}"),
            ],
        );
        assert_eq!(state.apply(&rebuilt), SchemaResponse::Applied { epoch: 2 });
        assert_eq!(state.epoch(), 2);
        let keys: Vec<&str> = state.documents().keys().map(String::as_str).collect();
        assert_eq!(keys, ["keyspace/ks", "table/ks/u"]);
        // The follower got the attach, then each accepted change (never the stale one).
        let seen = recorder.seen.lock().unwrap();
        let epochs: Vec<(u64, usize)> = seen.iter().map(|(e, n, _)| (*e, *n)).collect();
        assert_eq!(epochs, [(0, 0), (1, 2), (2, 2)]);
        assert_eq!(&seen[2].2, state.documents());
    }

    #[test]
    fn two_replicas_fed_the_same_commands_agree_and_a_snapshot_restores_them() {
        let commands = [
            command(0, vec![put("keyspace/a", "1")]),
            command(0, vec![put("keyspace/b", "2")]),
            command(1, vec![put("keyspace/b", "3"), put("table/b/x", "4")]),
            command(
                2,
                vec![SchemaEdit::Delete {
                    key: "keyspace/a".to_owned(),
                }],
            ),
        ];
        let mut a = SchemaState::new();
        let mut b = SchemaState::new();
        for c in &commands {
            assert_eq!(a.apply(c), b.apply(c));
        }
        assert_eq!(a.epoch(), 3);
        assert_eq!(a.snapshot(), b.snapshot());
        let (epoch, documents) = SchemaState::decode_snapshot(&a.snapshot()).unwrap();
        let mut restored = SchemaState::new();
        let recorder = Arc::new(Recorder::default());
        restored.attach(recorder.clone());
        restored.install(epoch, documents);
        assert_eq!(restored.snapshot(), a.snapshot());
        assert_eq!(recorder.seen.lock().unwrap().last().unwrap().0, 3);
        // The restored state refuses the same stale base and accepts the current one.
        let next = command(3, vec![put("keyspace/c", "5")]);
        assert_eq!(
            restored.apply(&command(2, vec![put("keyspace/c", "5")])),
            SchemaResponse::Stale { epoch: 3 }
        );
        assert_eq!(restored.apply(&next), a.apply(&next));
    }

    #[test]
    fn malformed_and_empty_commands_are_answered_with_errors_and_change_nothing() {
        let mut state = SchemaState::new();
        assert_eq!(
            state.apply(&command(0, vec![put("k", "v")])),
            SchemaResponse::Applied { epoch: 1 }
        );
        let before = state.snapshot();
        for bad in [
            &b""[..],
            b"\x02",
            b"\x02{",
            b"\x02{\"base\":1}",
            b"\x02{\"base\":\"one\",\"edits\":[]}",
            b"\x09{\"base\":1,\"edits\":[]}",
        ] {
            assert_eq!(
                state.apply(bad),
                SchemaResponse::Rejected(SchemaError::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(
            state.apply(&command(1, vec![])),
            SchemaResponse::Rejected(SchemaError::Empty)
        );
        assert_eq!(
            state.apply(&command(1, vec![put("", "v")])),
            SchemaResponse::Rejected(SchemaError::Empty)
        );
        assert_eq!(state.snapshot(), before);
        assert!(SchemaState::decode_snapshot(b"\x02[]").is_err());
        assert!(SchemaState::decode_snapshot(b"").is_err());
        assert!(SchemaResponse::decode(b"\x01{}").is_err());
    }

    #[test]
    fn the_document_count_is_bounded() {
        let mut state = SchemaState::new();
        let edits: Vec<SchemaEdit> = (0..MAX_SCHEMA_DOCUMENTS)
            .map(|i| put(&i.to_string(), ""))
            .collect();
        assert_eq!(
            state.apply(&command(0, edits)),
            SchemaResponse::Applied { epoch: 1 }
        );
        assert_eq!(
            state.apply(&command(1, vec![put("one more", "")])),
            SchemaResponse::Rejected(SchemaError::TooManyDocuments)
        );
        // Replacing an existing document does not add one.
        assert_eq!(
            state.apply(&command(1, vec![put("0", "x")])),
            SchemaResponse::Applied { epoch: 2 }
        );
    }
}
