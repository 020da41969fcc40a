//! Raft messages over a [`MetaTransport`]: the sending side openraft calls, and the
//! [`RpcHandler`] that the receiving node's transport hands incoming bytes to.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{
    CheckIsLeaderError, ClientWriteError, InstallSnapshotError, NetworkError, RPCError, RaftError,
    RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, ChangeMembers};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::types::{Answer, Proposal, Raft, TypeConfig};
use crate::{MetaError, MetaTransport, TransportError};

/// The kind of a metadata message, so a transport can frame it without decoding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RpcKind {
    /// Log replication and heartbeats.
    AppendEntries = 1,
    /// Leader election.
    Vote = 2,
    /// A chunk of a snapshot for a node too far behind.
    InstallSnapshot = 3,
    /// A proposal, read barrier or membership change forwarded to the leader.
    Forward = 4,
}

impl RpcKind {
    /// The kind's wire byte.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// The kind of a wire byte, if it is one.
    pub fn from_u8(byte: u8) -> Option<RpcKind> {
        match byte {
            1 => Some(RpcKind::AppendEntries),
            2 => Some(RpcKind::Vote),
            3 => Some(RpcKind::InstallSnapshot),
            4 => Some(RpcKind::Forward),
            _ => None,
        }
    }
}

/// The longest a forwarded operation may run on the leader.
const MAX_FORWARD_BUDGET: Duration = Duration::from_secs(60);

/// An operation only the leader can run, sent by a follower.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum LeaderOp {
    Propose(Proposal),
    ReadIndex,
    AddLearner { node: u64, addr: String },
    Promote { node: u64 },
    Remove { node: u64 },
}

/// A forwarded operation and the time the sender still waits for it.
#[derive(serde::Serialize, serde::Deserialize)]
struct ForwardEnvelope {
    budget_ms: u64,
    op: LeaderOp,
}

/// Why the leader-side operation did not complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum LeaderError {
    /// The receiver is not the leader; `leader` is who it thinks is.
    NotLeader { leader: Option<u64> },
    /// It is the leader, and the operation failed.
    Failed(MetaError),
}

type LeaderResult = Result<Answer, LeaderError>;

fn not_leader(leader: Option<u64>) -> LeaderError {
    LeaderError::NotLeader { leader }
}

fn write_error(error: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> LeaderError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(to)) => not_leader(to.leader_id),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(_)) => {
            LeaderError::Failed(MetaError::MembershipRejected)
        }
        RaftError::Fatal(_) => LeaderError::Failed(MetaError::Stopped),
    }
}

/// Runs `op` on this node, which must be the leader, giving up after `budget`.
pub(crate) async fn run_on_leader(raft: &Raft, op: LeaderOp, budget: Duration) -> LeaderResult {
    match tokio::time::timeout(budget, run_unbounded(raft, op)).await {
        Ok(result) => result,
        Err(_) => Err(LeaderError::Failed(MetaError::Timeout)),
    }
}

async fn run_unbounded(raft: &Raft, op: LeaderOp) -> LeaderResult {
    let membership_answer = |index: u64| Answer {
        index,
        response: Vec::new(),
    };
    match op {
        LeaderOp::Propose(proposal) => raft
            .client_write(proposal)
            .await
            .map(|written| written.data)
            .map_err(write_error),
        LeaderOp::ReadIndex => match raft.ensure_linearizable().await {
            Ok(read) => Ok(membership_answer(read.map_or(0, |id| id.index))),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(to))) => {
                Err(not_leader(to.leader_id))
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_))) => {
                Err(LeaderError::Failed(MetaError::NoLeader))
            }
            Err(RaftError::Fatal(_)) => Err(LeaderError::Failed(MetaError::Stopped)),
        },
        LeaderOp::AddLearner { node, addr } => raft
            .add_learner(node, BasicNode { addr }, true)
            .await
            .map(|written| membership_answer(written.log_id.index))
            .map_err(write_error),
        LeaderOp::Promote { node } => raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([node])), true)
            .await
            .map(|written| membership_answer(written.log_id.index))
            .map_err(write_error),
        LeaderOp::Remove { node } => {
            let is_voter = raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .voter_ids()
                .any(|id| id == node);
            let change = if is_voter {
                ChangeMembers::RemoveVoters(BTreeSet::from([node]))
            } else {
                ChangeMembers::RemoveNodes(BTreeSet::from([node]))
            };
            raft.change_membership(change, false)
                .await
                .map(|written| membership_answer(written.log_id.index))
                .map_err(write_error)
        }
    }
}

/// Receives metadata messages for one node: its transport calls [`RpcHandler::handle`] with
/// each incoming message and sends back the bytes it returns.
#[derive(Clone)]
pub struct RpcHandler {
    raft: Raft,
}

impl RpcHandler {
    pub(crate) fn new(raft: Raft) -> RpcHandler {
        RpcHandler { raft }
    }

    /// Handles one serialized message of `kind` and returns the serialized reply. Malformed
    /// input is rejected, never a panic.
    pub async fn handle(&self, kind: RpcKind, body: &[u8]) -> Result<Vec<u8>, TransportError> {
        const MALFORMED: TransportError = TransportError::Rejected("malformed metadata message");
        match kind {
            RpcKind::AppendEntries => {
                let request: AppendEntriesRequest<TypeConfig> =
                    serde_json::from_slice(body).map_err(|_| MALFORMED)?;
                Ok(encode(&self.raft.append_entries(request).await))
            }
            RpcKind::Vote => {
                let request: VoteRequest<u64> =
                    serde_json::from_slice(body).map_err(|_| MALFORMED)?;
                Ok(encode(&self.raft.vote(request).await))
            }
            RpcKind::InstallSnapshot => {
                let request: InstallSnapshotRequest<TypeConfig> =
                    serde_json::from_slice(body).map_err(|_| MALFORMED)?;
                Ok(encode(&self.raft.install_snapshot(request).await))
            }
            RpcKind::Forward => {
                let envelope: ForwardEnvelope =
                    serde_json::from_slice(body).map_err(|_| MALFORMED)?;
                // The sender's budget is trusted only up to a bound: no message holds the
                // leader's work open for longer.
                let budget = Duration::from_millis(envelope.budget_ms).min(MAX_FORWARD_BUDGET);
                Ok(encode(
                    &run_on_leader(&self.raft, envelope.op, budget).await,
                ))
            }
        }
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("metadata messages serialize")
}

/// Sends `op` to the leader `target` and decodes its answer.
pub(crate) async fn forward<T: MetaTransport>(
    transport: &T,
    target: u64,
    addr: &str,
    op: LeaderOp,
    budget: Duration,
) -> LeaderResult {
    let envelope = ForwardEnvelope {
        budget_ms: budget.as_millis().min(u128::from(u64::MAX)) as u64,
        op,
    };
    // The reply needs a little longer than the leader's own budget to travel back.
    let deadline = Instant::now() + budget + Duration::from_millis(50);
    match transport
        .send(target, addr, RpcKind::Forward, encode(&envelope), deadline)
        .await
    {
        Ok(reply) => serde_json::from_slice::<LeaderResult>(&reply)
            .unwrap_or(Err(LeaderError::Failed(MetaError::Malformed))),
        Err(TransportError::Timeout) => Err(LeaderError::Failed(MetaError::Timeout)),
        Err(TransportError::Unreachable) | Err(TransportError::Rejected(_)) => {
            Err(not_leader(None))
        }
    }
}

/// Creates one openraft client per peer over the shared transport.
pub(crate) struct NetworkFactory<T> {
    pub(crate) transport: Arc<T>,
    pub(crate) source: u64,
    pub(crate) backoff: Duration,
}

impl<T: MetaTransport> RaftNetworkFactory<TypeConfig> for NetworkFactory<T> {
    type Network = PeerClient<T>;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerClient<T> {
        PeerClient {
            transport: Arc::clone(&self.transport),
            source: self.source,
            target,
            addr: node.addr.clone(),
            backoff: self.backoff,
        }
    }
}

/// openraft's client for one peer.
pub(crate) struct PeerClient<T> {
    transport: Arc<T>,
    source: u64,
    target: u64,
    addr: String,
    backoff: Duration,
}

impl<T: MetaTransport> PeerClient<T> {
    async fn call<Req, Resp, E>(
        &self,
        kind: RpcKind,
        action: RPCTypes,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<u64, BasicNode, RaftError<u64, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        let ttl = option.hard_ttl();
        let deadline = Instant::now() + ttl;
        let reply = self
            .transport
            .send(self.target, &self.addr, kind, encode(request), deadline)
            .await
            .map_err(|error| match error {
                TransportError::Timeout => RPCError::Timeout(Timeout {
                    action,
                    id: self.source,
                    target: self.target,
                    timeout: ttl,
                }),
                TransportError::Unreachable => RPCError::Unreachable(Unreachable::new(&error)),
                TransportError::Rejected(_) => RPCError::Network(NetworkError::new(&error)),
            })?;
        let result: Result<Resp, RaftError<u64, E>> =
            serde_json::from_slice(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl<T: MetaTransport> RaftNetwork<TypeConfig> for PeerClient<T> {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.call(
            RpcKind::AppendEntries,
            RPCTypes::AppendEntries,
            &request,
            &option,
        )
        .await
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        self.call(
            RpcKind::InstallSnapshot,
            RPCTypes::InstallSnapshot,
            &request,
            &option,
        )
        .await
    }

    async fn vote(
        &mut self,
        request: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.call(RpcKind::Vote, RPCTypes::Vote, &request, &option)
            .await
    }

    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(self.backoff))
    }
}

/// The voters and learners of a membership, with addresses, in id order.
pub(crate) fn members_of(membership: &openraft::Membership<u64, BasicNode>) -> crate::Members {
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let nodes: BTreeMap<u64, String> = membership
        .nodes()
        .map(|(id, node)| (*id, node.addr.clone()))
        .collect();
    let (voters, learners) = nodes.into_iter().partition(|(id, _)| voters.contains(id));
    crate::Members {
        voters,
        learners,
        joint: membership.get_joint_config().len() > 1,
    }
}
