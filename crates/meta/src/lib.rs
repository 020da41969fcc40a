//! Cluster metadata (schema, topology) on one Raft group.
//!
//! The rest of Sluice sees only [`MetaLog`]: propose an opaque command and get its log index
//! and the state machine's answer, a linearizable read barrier, a subscription to applied
//! commands, and membership changes. The consensus itself is `openraft` (pinned `=0.9.25`),
//! whose types stay inside this crate so that a version change touches nothing else.
//!
//! Three seams are traits so the pieces can be swapped: [`Apply`] is the application's state
//! machine (schema and topology later), [`MetaTransport`] carries serialized Raft messages
//! (the internode crate's control class later; [`memory::MemoryNetwork`] in tests), and the
//! log lives in a fjall keyspace under the node's data directory ([`MetaConfig::dir`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), sluice_meta::MetaError> {
//! use sluice_meta::{memory::MemoryNetwork, Apply, MetaConfig, MetaLog, MetaNode};
//!
//! #[derive(Default)]
//! struct Counter(u64);
//! impl Apply for Counter {
//!     fn apply(&mut self, _index: u64, _command: &[u8]) -> Vec<u8> {
//!         self.0 += 1;
//!         self.0.to_be_bytes().to_vec()
//!     }
//!     fn snapshot(&self) -> Vec<u8> {
//!         self.0.to_be_bytes().to_vec()
//!     }
//!     fn restore(&mut self, snapshot: &[u8]) -> Result<(), sluice_meta::MetaError> {
//!         let bytes = snapshot.try_into().map_err(|_| sluice_meta::MetaError::Malformed)?;
//!         self.0 = u64::from_be_bytes(bytes);
//!         Ok(())
//!     }
//! }
//!
//! let network = MemoryNetwork::new(7);
//! let config = MetaConfig::new(1, "127.0.0.1:7000", "/tmp/node1/meta");
//! let node = MetaNode::open(config, Counter::default(), network.transport(1)).await?;
//! network.register(1, node.rpc_handler());
//! node.initialize(&[(1, "127.0.0.1:7000".to_owned())]).await?;
//! let committed = node.propose(node.next_request_id(), b"incr".to_vec()).await?;
//! assert_eq!(committed.response, 1u64.to_be_bytes());
//! # Ok(()) }
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod dedup;
mod hex;
mod log_store;
pub mod memory;
mod network;
mod node;
mod state_machine;
mod types;

pub use network::{RpcHandler, RpcKind};
pub use node::MetaNode;

/// The application's deterministic state machine, fed every committed command in log order.
///
/// Every node applies the same commands in the same order, so `apply` must depend only on its
/// inputs (no clocks, no randomness); a command that does nothing still returns an answer.
pub trait Apply: Send + 'static {
    /// Applies the command committed at `index` and returns the answer for its proposer.
    fn apply(&mut self, index: u64, command: &[u8]) -> Vec<u8>;
    /// Encodes the whole state, to be restored on this or another node.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the whole state with one that `snapshot` encoded.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), MetaError>;
}

/// Identifies one logical proposal so that a retry of it is applied at most once.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct RequestId {
    /// The proposing client, unique per process incarnation.
    pub client: u64,
    /// The client's sequence number for this proposal.
    pub seq: u64,
}

/// A proposal that the group committed and this node's state machine applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// The log index the command was committed at (the first one, for a retried proposal).
    pub index: u64,
    /// What [`Apply::apply`] answered.
    pub response: Vec<u8>,
}

/// Something the state machine did, in log order, for caches that follow it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppliedEvent {
    /// A command was applied at `index`.
    Command {
        /// Its log index.
        index: u64,
        /// The command bytes as proposed.
        command: std::sync::Arc<[u8]>,
    },
    /// The whole state was replaced by a snapshot ending at `index`: re-read it.
    Restored {
        /// The last log index the snapshot covers.
        index: u64,
    },
}

/// The voters and learners of the group, by node id, with their transport addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    /// Nodes that vote and count towards a quorum.
    pub voters: Vec<(u64, String)>,
    /// Nodes that receive the log but do not vote.
    pub learners: Vec<(u64, String)>,
    /// Whether a joint (two-step) configuration change is in progress.
    pub joint: bool,
}

/// Why a metadata operation did not complete. Small and `Copy`: no allocation to reject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MetaError {
    /// No leader is known (an election is in progress, or this node is cut off).
    NoLeader,
    /// The deadline passed; a proposal may still be applied later, so retry with the same id.
    Timeout,
    /// This node has shut down.
    Stopped,
    /// The local log or snapshot storage failed.
    Storage,
    /// A message or snapshot could not be decoded.
    Malformed,
    /// The leader refused a membership change (another one is in progress, or the node is
    /// unknown).
    MembershipRejected,
    /// The group is already initialized, or initialization was refused.
    AlreadyInitialized,
    /// The command is larger than [`MetaConfig::max_command_bytes`].
    TooLarge,
    /// The configuration is inconsistent: a command of [`MetaConfig::max_command_bytes`] does
    /// not fit in one message of [`MetaConfig::max_append_bytes`], or that bound leaves
    /// snapshot chunks too small.
    Misconfigured,
}

impl MetaError {
    /// A fixed description of the error.
    pub fn message(self) -> &'static str {
        match self {
            MetaError::NoLeader => "no metadata leader is known",
            MetaError::Timeout => "metadata operation timed out",
            MetaError::Stopped => "metadata node has stopped",
            MetaError::Storage => "metadata storage failed",
            MetaError::Malformed => "malformed metadata message",
            MetaError::MembershipRejected => "metadata membership change rejected",
            MetaError::AlreadyInitialized => "metadata group already initialized",
            MetaError::TooLarge => "metadata command too large",
            MetaError::Misconfigured => {
                "metadata max_append_bytes does not fit max_command_bytes or a snapshot chunk"
            }
        }
    }
}

impl std::fmt::Display for MetaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for MetaError {}

/// The metadata log as the rest of Sluice uses it. Implemented by [`MetaNode`].
pub trait MetaLog: Send + Sync {
    /// A fresh request id for a new logical proposal; reuse it only to retry that proposal.
    fn next_request_id(&self) -> RequestId;

    /// Commits `command` through the group (forwarding to the leader) and waits until this
    /// node has applied it. A retry with the same `request` is applied once and answers the
    /// first application's index and response.
    fn propose(
        &self,
        request: RequestId,
        command: Vec<u8>,
    ) -> impl Future<Output = Result<Committed, MetaError>> + Send;

    /// Linearizable read barrier: returns once this node has applied everything the leader
    /// had committed when the call started, with that index.
    fn read_barrier(&self) -> impl Future<Output = Result<u64, MetaError>> + Send;

    /// Repeats [`MetaLog::read_barrier`] until it succeeds or `timeout` passes; a node calls it
    /// before it opens its CQL port.
    fn wait_caught_up(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<u64, MetaError>> + Send;

    /// The last log index this node's state machine has applied (0: nothing yet).
    fn last_applied(&self) -> u64;

    /// Events for every command applied from now on, in order. A receiver that falls more than
    /// [`MetaConfig::subscriber_capacity`] events behind gets `Lagged` and should re-read.
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<AppliedEvent>;

    /// The current leader, if known.
    fn leader(&self) -> Option<u64>;

    /// The current voters and learners.
    fn members(&self) -> Members;

    /// Adds a node as a learner and waits until it has caught up with the log. On
    /// [`MetaError::Timeout`] the learner may have been added but not caught up yet.
    fn add_learner(
        &self,
        node: u64,
        addr: String,
    ) -> impl Future<Output = Result<u64, MetaError>> + Send;

    /// Makes a learner a voter (joint consensus, two log entries).
    fn promote(&self, node: u64) -> impl Future<Output = Result<u64, MetaError>> + Send;

    /// Removes a voter or learner from the group (joint consensus for a voter).
    fn remove(&self, node: u64) -> impl Future<Output = Result<u64, MetaError>> + Send;
}

/// The transport for Raft messages between nodes: one request, one reply, with a deadline.
///
/// The receiving side hands the bytes to that node's [`RpcHandler`] and sends back its reply.
pub trait MetaTransport: Send + Sync + 'static {
    /// Sends `body` (a serialized message of `kind`) to node `target` at `addr` and returns
    /// its serialized reply, or an error once `deadline` passes.
    fn send(
        &self,
        target: u64,
        addr: &str,
        kind: RpcKind,
        body: Vec<u8>,
        deadline: Instant,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send;
}

/// Why a transport could not deliver a message or its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportError {
    /// The target is not connected or not listening.
    Unreachable,
    /// No reply before the deadline.
    Timeout,
    /// The target rejected the message.
    Rejected(&'static str),
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportError::Unreachable => f.write_str("metadata peer unreachable"),
            TransportError::Timeout => f.write_str("metadata peer timed out"),
            TransportError::Rejected(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for TransportError {}

/// How one metadata node is set up.
#[derive(Clone, Debug)]
pub struct MetaConfig {
    /// This node's id in the group (never reused for another node).
    pub node_id: u64,
    /// This node's transport address, as other nodes reach it.
    pub addr: String,
    /// The directory of the log and snapshots, e.g. `<data>/meta`.
    pub dir: PathBuf,
    /// Leader heartbeat interval.
    pub heartbeat: Duration,
    /// Election timeout, chosen at random in `[election_min, election_max)`.
    pub election_min: Duration,
    /// Upper bound of the election timeout.
    pub election_max: Duration,
    /// Applied entries between snapshots; the log before a snapshot is purged.
    pub snapshot_every: u64,
    /// How long `propose`, `read_barrier` and membership calls keep retrying.
    pub op_timeout: Duration,
    /// Deadline of one snapshot chunk (its install included, for the last one) and of one
    /// attempt to forward an operation to the leader. openraft gives an append or a vote the
    /// heartbeat interval; a peer that misses it gets smaller appends.
    pub rpc_timeout: Duration,
    /// Request ids remembered for duplicate detection (oldest forgotten first).
    pub dedup_capacity: usize,
    /// Events buffered per subscriber before it lags.
    pub subscriber_capacity: usize,
    /// Entries per append message.
    pub max_entries_per_append: u64,
    /// The most bytes one encoded append may take; openraft sends fewer entries above it.
    /// Snapshot chunks are sized to fit it too. Keep it well below what the transport queues
    /// per peer (the internode Control class: 1 MiB).
    pub max_append_bytes: usize,
    /// The largest command `propose` accepts. Commands travel hex-encoded, so one of this size
    /// must encode within `max_append_bytes`; [`MetaNode::open`] checks it.
    pub max_command_bytes: usize,
}

impl MetaConfig {
    /// A configuration with production timings for node `node_id` at `addr`, storing in `dir`.
    pub fn new(node_id: u64, addr: &str, dir: impl Into<PathBuf>) -> MetaConfig {
        MetaConfig {
            node_id,
            addr: addr.to_owned(),
            dir: dir.into(),
            // openraft 0.9 campaigns only after its leader lease (election_max) and its own
            // timeout (election_min..election_max) pass without a word from the leader: 500-600
            // ms here, five heartbeats or more, so a leader descheduled for a few hundred ms
            // keeps its place while a dead one is replaced within a second.
            heartbeat: Duration::from_millis(100),
            election_min: Duration::from_millis(200),
            election_max: Duration::from_millis(300),
            snapshot_every: 5_000,
            op_timeout: Duration::from_secs(10),
            rpc_timeout: Duration::from_millis(1_000),
            dedup_capacity: 10_000,
            subscriber_capacity: 4_096,
            max_entries_per_append: 300,
            max_append_bytes: 256 << 10,
            max_command_bytes: 64 << 10,
        }
    }
}
