//! The openraft type configuration and the payloads this crate puts in the log.

use std::io::Cursor;

use crate::RequestId;

/// What one normal log entry carries: the application's command and its request id.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Proposal {
    pub(crate) request: RequestId,
    #[serde(with = "crate::hex")]
    pub(crate) command: Vec<u8>,
}

/// The state machine's answer to one entry, returned to the proposer.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Answer {
    /// The log index the request was first applied at (differs from the entry's index for a
    /// duplicate).
    pub(crate) index: u64,
    #[serde(with = "crate::hex")]
    pub(crate) response: Vec<u8>,
}

openraft::declare_raft_types!(
    /// The openraft types of the metadata group.
    pub(crate) TypeConfig:
        D = Proposal,
        R = Answer,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub(crate) type Raft = openraft::Raft<TypeConfig>;
pub(crate) type Entry = openraft::Entry<TypeConfig>;
pub(crate) type LogId = openraft::LogId<u64>;
pub(crate) type StorageError = openraft::StorageError<u64>;
pub(crate) type StoredMembership = openraft::StoredMembership<u64, openraft::BasicNode>;
pub(crate) type SnapshotMeta = openraft::SnapshotMeta<u64, openraft::BasicNode>;
pub(crate) type Snapshot = openraft::Snapshot<TypeConfig>;
