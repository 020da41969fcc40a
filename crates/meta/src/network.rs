//! Raft messages over a [`MetaTransport`]: the sending side openraft calls, and the
//! [`RpcHandler`] that the receiving node's transport hands incoming bytes to.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{
    CheckIsLeaderError, ClientWriteError, InstallSnapshotError, NetworkError, PayloadTooLarge,
    RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, ChangeMembers};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::types::{Answer, Entry, Proposal, Raft, TypeConfig};
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
    pub(crate) max_append_bytes: usize,
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
            max_append_bytes: self.max_append_bytes,
            append_budget: self.max_append_bytes,
            append_unanswered: false,
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
    /// The most bytes an encoded append to this peer may take.
    max_append_bytes: usize,
    /// The bound used now: halved after an append of several entries went unanswered within
    /// openraft's deadline (the heartbeat interval), doubled back after each answered append.
    append_budget: usize,
    /// An append of several entries was sent and its answer not seen: it failed, or openraft
    /// dropped the call at its deadline.
    append_unanswered: bool,
}

/// The smallest budget an append shrinks to; a single entry is sent whatever its size.
const MIN_APPEND_BUDGET_BYTES: usize = 16 * 1024;

impl<T: MetaTransport> PeerClient<T> {
    async fn call<Resp, E>(
        &self,
        kind: RpcKind,
        action: RPCTypes,
        body: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<u64, BasicNode, RaftError<u64, E>>>
    where
        Resp: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        let ttl = option.hard_ttl();
        let deadline = Instant::now() + ttl;
        let reply = self
            .transport
            .send(self.target, &self.addr, kind, body, deadline)
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

impl<T> PeerClient<T> {
    /// openraft's answer that makes it resend an append of `entries` as the first `hint`.
    fn fewer_entries(&self, entries: usize, hint: u64) -> RPCError<u64, BasicNode, RaftError<u64>> {
        debug_assert!(hint >= 1 && hint < entries as u64);
        tracing::debug!(
            target = self.target,
            entries,
            hint,
            "append too large, asking for fewer entries"
        );
        RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(hint))
    }
}

impl<T: MetaTransport> RaftNetwork<TypeConfig> for PeerClient<T> {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        // openraft resends a failed batch unchanged, so an append too large for the transport
        // would fail forever; `PayloadTooLarge` makes it resend fewer entries instead. The
        // estimate spares encoding a batch only to drop it; the encoded size is the backstop.
        // openraft gives an append the heartbeat interval and resends it unchanged when that
        // passes, so on a slow machine a full-size append could time out forever: send less.
        if std::mem::take(&mut self.append_unanswered) {
            let floor = MIN_APPEND_BUDGET_BYTES.min(self.max_append_bytes);
            self.append_budget = (self.append_budget / 2).max(floor);
        }
        debug_assert!(self.append_budget <= self.max_append_bytes);
        let entries = request.entries.len();
        if entries > 1 {
            if let Some(fitting) = fitting_prefix(&request.entries, self.append_budget) {
                return Err(self.fewer_entries(entries, fitting.clamp(1, entries - 1) as u64));
            }
        }
        let body = encode(&request);
        if let Some(hint) = entries_hint(body.len(), entries, self.append_budget) {
            return Err(self.fewer_entries(entries, hint));
        }
        self.append_unanswered = entries > 1;
        let result = self
            .call(
                RpcKind::AppendEntries,
                RPCTypes::AppendEntries,
                body,
                &option,
            )
            .await;
        match &result {
            Ok(_) => {
                self.append_unanswered = false;
                if entries > 0 {
                    self.append_budget = (self.append_budget * 2).min(self.max_append_bytes);
                }
            }
            // Slow: the next append is smaller.
            Err(RPCError::Timeout(_)) => {}
            // Down or refusing: size is not the cause.
            Err(_) => self.append_unanswered = false,
        }
        debug_assert!(self.append_budget <= self.max_append_bytes);
        result
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
            encode(&request),
            &option,
        )
        .await
    }

    async fn vote(
        &mut self,
        request: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.call(RpcKind::Vote, RPCTypes::Vote, encode(&request), &option)
            .await
    }

    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(self.backoff))
    }
}

/// An upper bound of the encoded bytes of an append beyond its entries: the vote, the previous
/// and committed log ids, and the field names.
const APPEND_ENVELOPE_BYTES: usize = 512;

/// An upper bound of the encoded bytes of an entry beyond its command: its log id, request id
/// (numbers of up to 20 digits) and field names.
const ENTRY_ENVELOPE_BYTES: usize = 256;

/// An upper bound of one entry's encoded size, without encoding it: commands are hex, two
/// characters a byte. A membership entry, rare and small, is encoded to be measured.
fn estimated_entry_bytes(entry: &Entry) -> usize {
    ENTRY_ENVELOPE_BYTES
        + match &entry.payload {
            openraft::EntryPayload::Blank => 0,
            openraft::EntryPayload::Normal(proposal) => 2 * proposal.command.len(),
            openraft::EntryPayload::Membership(membership) => encode(membership).len(),
        }
}

/// How many leading `entries` fit in an append of `max_bytes` by estimate; `None` when all do.
fn fitting_prefix(entries: &[Entry], max_bytes: usize) -> Option<usize> {
    let mut total = APPEND_ENVELOPE_BYTES;
    for (fitting, entry) in entries.iter().enumerate() {
        total += estimated_entry_bytes(entry);
        if total > max_bytes {
            return Some(fitting);
        }
    }
    None
}

/// How many entries to send instead of an append of `entries` entries that encoded to
/// `encoded_bytes`, when that is over `max_bytes`; `None` when it fits or cannot be split.
pub(crate) fn entries_hint(encoded_bytes: usize, entries: usize, max_bytes: usize) -> Option<u64> {
    if encoded_bytes <= max_bytes || entries <= 1 {
        // A single entry is sent as it is: `MetaNode::open` checks that the largest command
        // fits, and only a membership entry of a huge group could be larger.
        return None;
    }
    let per_entry = encoded_bytes.div_ceil(entries);
    // Aim an eighth below the bound: entries differ a little in size (their indexes grow), and
    // the part of the message that is not entries is counted in the average.
    let target = max_bytes - max_bytes / 8;
    let hint = (target / per_entry).clamp(1, entries - 1);
    debug_assert!(hint >= 1 && hint < entries);
    Some(hint as u64)
}

/// Bytes of a snapshot request beyond its data: the vote and the snapshot's metadata, whose
/// membership lists every node's address.
const SNAPSHOT_ENVELOPE_BYTES: usize = 16 * 1024;

/// The snapshot chunk size whose request encodes within `max_append_bytes`: the data is a JSON
/// array of numbers, at most four characters a byte.
pub(crate) fn snapshot_chunk_bytes(max_append_bytes: usize) -> usize {
    max_append_bytes.saturating_sub(SNAPSHOT_ENVELOPE_BYTES) / 4
}

/// The encoded size of the largest messages that carry one command of `command_bytes`: an
/// append of that one entry and a proposal forwarded to the leader, with every number at its
/// longest.
pub(crate) fn largest_single_command_messages(command_bytes: usize) -> usize {
    let proposal = Proposal {
        request: crate::RequestId {
            client: u64::MAX,
            seq: u64::MAX,
        },
        command: vec![0xff; command_bytes],
    };
    let log_id = openraft::LogId::new(
        openraft::CommittedLeaderId::new(u64::MAX, u64::MAX),
        u64::MAX,
    );
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: openraft::Vote::new_committed(u64::MAX, u64::MAX),
        prev_log_id: Some(log_id),
        leader_commit: Some(log_id),
        entries: vec![openraft::Entry {
            log_id,
            payload: openraft::EntryPayload::Normal(proposal.clone()),
        }],
    };
    let forward = ForwardEnvelope {
        budget_ms: u64::MAX,
        op: LeaderOp::Propose(proposal),
    };
    encode(&append).len().max(encode(&forward).len())
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};

    use super::*;
    use crate::{MetaConfig, RequestId};

    /// Records the size of every message it is given and answers each append `Success`, or
    /// never answers while `stalled`.
    #[derive(Default)]
    struct Recording {
        sent: Mutex<Vec<usize>>,
        stalled: std::sync::atomic::AtomicBool,
    }

    impl MetaTransport for Recording {
        async fn send(
            &self,
            _target: u64,
            _addr: &str,
            kind: RpcKind,
            body: Vec<u8>,
            _deadline: Instant,
        ) -> Result<Vec<u8>, TransportError> {
            assert_eq!(kind, RpcKind::AppendEntries);
            self.sent.lock().unwrap().push(body.len());
            if self.stalled.load(std::sync::atomic::Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
            let reply: Result<AppendEntriesResponse<u64>, RaftError<u64>> =
                Ok(AppendEntriesResponse::Success);
            Ok(encode(&reply))
        }
    }

    fn append_of(commands: usize, command_bytes: usize) -> AppendEntriesRequest<TypeConfig> {
        let log_id = |index: u64| LogId::new(CommittedLeaderId::new(3, 1), index);
        let entries = (1..=commands as u64)
            .map(|index| Entry {
                log_id: log_id(index),
                payload: EntryPayload::Normal(Proposal {
                    request: RequestId {
                        client: 7,
                        seq: index,
                    },
                    command: vec![0xab; command_bytes],
                }),
            })
            .collect();
        AppendEntriesRequest {
            vote: Vote::new_committed(3, 1),
            prev_log_id: None,
            leader_commit: Some(log_id(commands as u64)),
            entries,
        }
    }

    fn client(transport: &Arc<Recording>, max_append_bytes: usize) -> PeerClient<Recording> {
        PeerClient {
            transport: Arc::clone(transport),
            source: 1,
            target: 2,
            addr: "peer".to_owned(),
            backoff: Duration::from_millis(10),
            max_append_bytes,
            append_budget: max_append_bytes,
            append_unanswered: false,
        }
    }

    fn option() -> RPCOption {
        RPCOption::new(Duration::from_secs(1))
    }

    #[tokio::test]
    async fn an_oversized_append_asks_for_fewer_entries_and_the_resend_fits() {
        let max = MetaConfig::new(1, "a", "/nonexistent").max_append_bytes;
        let transport = Arc::new(Recording::default());
        let mut client = client(&transport, max);
        // 300 commands of 4 KiB: about 2.5 MB encoded, ten times the bound.
        let request = append_of(300, 4096);
        let encoded = encode(&request).len();
        assert!(encoded > 8 * max, "{encoded} bytes");
        let hint = match client.append_entries(request, option()).await {
            Err(RPCError::PayloadTooLarge(too_large)) => {
                assert_eq!(too_large.action(), RPCTypes::AppendEntries);
                too_large.entries_hint()
            }
            other => panic!("expected PayloadTooLarge, got {other:?}"),
        };
        assert!((1..300).contains(&hint), "hint {hint}");
        assert!(transport.sent.lock().unwrap().is_empty(), "nothing is sent");

        // openraft resends the first `hint` entries: that message fits and is sent.
        let resend = append_of(hint as usize, 4096);
        let resend_bytes = encode(&resend).len();
        assert!(resend_bytes <= max, "{resend_bytes} > {max}");
        assert!(matches!(
            client.append_entries(resend, option()).await,
            Ok(AppendEntriesResponse::Success)
        ));
        // Not wastefully small either: more than half the bound is used.
        assert!(resend_bytes > max / 2, "{resend_bytes} of {max}");
        assert_eq!(*transport.sent.lock().unwrap(), vec![resend_bytes]);
    }

    /// Sends `request`, answering openraft's `PayloadTooLarge` as it does: resend the first
    /// `hint` entries. Returns the entries finally sent, or `None` if openraft's deadline passed.
    async fn send_as_openraft(
        client: &mut PeerClient<Recording>,
        command_bytes: usize,
        mut entries: usize,
    ) -> Option<usize> {
        loop {
            let call = client.append_entries(append_of(entries, command_bytes), option());
            match tokio::time::timeout(Duration::from_millis(20), call).await {
                Err(_) => return None,
                Ok(Ok(_)) => return Some(entries),
                Ok(Err(RPCError::PayloadTooLarge(too_large))) => {
                    entries = too_large.entries_hint() as usize
                }
                Ok(Err(other)) => panic!("unexpected {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn an_append_left_unanswered_at_the_deadline_makes_the_next_one_smaller() {
        let max = MetaConfig::new(1, "a", "/nonexistent").max_append_bytes;
        let transport = Arc::new(Recording::default());
        let mut client = client(&transport, max);
        let full = send_as_openraft(&mut client, 4096, 300).await.unwrap();
        // A slow peer: each call is dropped at openraft's deadline, and each next one halves.
        transport
            .stalled
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(send_as_openraft(&mut client, 4096, 300).await, None);
        let mut sizes = Vec::new();
        for _ in 0..6 {
            assert_eq!(send_as_openraft(&mut client, 4096, 300).await, None);
            sizes.push(*transport.sent.lock().unwrap().last().unwrap());
        }
        assert!(sizes[0] <= max / 2 && sizes[1] <= max / 4, "{sizes:?}");
        // It stops at the floor, 16 KiB: one 4 KiB command (about 8 KB encoded).
        assert!(sizes[5] <= MIN_APPEND_BUDGET_BYTES && sizes[5] > MIN_APPEND_BUDGET_BYTES / 2);
        // Answered again: one more halving for the last unanswered call, then it doubles back.
        transport
            .stalled
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let mut sent = Vec::new();
        for _ in 0..6 {
            sent.push(send_as_openraft(&mut client, 4096, 300).await.unwrap());
        }
        assert!(sent.windows(2).all(|w| w[0] <= w[1]), "{sent:?}");
        assert_eq!(*sent.last().unwrap(), full, "{sent:?}");
        assert!(sent[0] < full / 8, "{sent:?}");
    }

    #[tokio::test]
    async fn appends_within_the_bound_and_single_entries_are_sent_as_they_are() {
        let transport = Arc::new(Recording::default());
        let mut client = client(&transport, 64 * 1024);
        for request in [append_of(0, 0), append_of(10, 1024), append_of(1, 100_000)] {
            assert!(matches!(
                client.append_entries(request, option()).await,
                Ok(AppendEntriesResponse::Success)
            ));
        }
        assert_eq!(transport.sent.lock().unwrap().len(), 3);
    }

    #[test]
    fn the_size_estimate_is_an_upper_bound_of_the_encoding() {
        let most = LogId::new(CommittedLeaderId::new(u64::MAX, u64::MAX), u64::MAX);
        for command_bytes in [0, 1, 100, 4096, 65_536] {
            let entry = Entry {
                log_id: most,
                payload: EntryPayload::Normal(Proposal {
                    request: RequestId {
                        client: u64::MAX,
                        seq: u64::MAX,
                    },
                    command: vec![0xff; command_bytes],
                }),
            };
            assert!(encode(&entry).len() <= estimated_entry_bytes(&entry));
        }
        let blank = Entry {
            log_id: most,
            payload: EntryPayload::Blank,
        };
        assert!(encode(&blank).len() <= estimated_entry_bytes(&blank));
        let envelope = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(u64::MAX, u64::MAX),
            prev_log_id: Some(most),
            leader_commit: Some(most),
            entries: Vec::new(),
        };
        assert!(encode(&envelope).len() <= APPEND_ENVELOPE_BYTES);
    }

    #[tokio::test]
    async fn a_bound_below_one_entry_still_splits_a_batch_into_single_entries() {
        // Nothing fits the bound: the hint is one entry, never zero, and that one is sent.
        let transport = Arc::new(Recording::default());
        let request = append_of(2, 10);
        let encoded = encode(&request).len();
        let mut client = client(&transport, encoded - 1);
        match client.append_entries(request, option()).await {
            Err(RPCError::PayloadTooLarge(too_large)) => assert_eq!(too_large.entries_hint(), 1),
            other => panic!("expected PayloadTooLarge, got {other:?}"),
        }
        assert!(transport.sent.lock().unwrap().is_empty());
        assert!(matches!(
            client.append_entries(append_of(1, 10), option()).await,
            Ok(AppendEntriesResponse::Success)
        ));
        assert_eq!(transport.sent.lock().unwrap().len(), 1);
    }

    #[test]
    fn the_hint_is_below_the_entry_count_and_at_least_one() {
        assert_eq!(entries_hint(1000, 10, 1000), None);
        assert_eq!(entries_hint(1_000_000, 1, 1000), None);
        assert_eq!(entries_hint(1_000_000, 2, 1000), Some(1));
        // 300 entries of 1,000 bytes against 64,000: 56,000 / 1,000.
        assert_eq!(entries_hint(300_000, 300, 64_000), Some(56));
        // Just over: the hint aims an eighth below the bound (875 / 4 bytes an entry).
        assert_eq!(entries_hint(1001, 300, 1000), Some(218));
        assert_eq!(entries_hint(1_000_000, 300, 1000), Some(1));
    }

    #[test]
    fn the_default_configuration_fits_its_largest_messages() {
        let config = MetaConfig::new(1, "a", "/nonexistent");
        let largest = largest_single_command_messages(config.max_command_bytes);
        assert!(largest > 2 * config.max_command_bytes);
        assert!(largest <= config.max_append_bytes, "{largest}");
        assert!(
            largest_single_command_messages(config.max_append_bytes / 2) > config.max_append_bytes
        );
        let chunk = snapshot_chunk_bytes(config.max_append_bytes);
        let request = InstallSnapshotRequest::<TypeConfig> {
            vote: Vote::new_committed(u64::MAX, u64::MAX),
            meta: openraft::SnapshotMeta {
                last_log_id: Some(LogId::new(
                    CommittedLeaderId::new(u64::MAX, u64::MAX),
                    u64::MAX,
                )),
                last_membership: Default::default(),
                snapshot_id: "x".repeat(64),
            },
            offset: u64::MAX,
            data: vec![255; chunk],
            done: false,
        };
        let encoded = encode(&request).len();
        assert!(encoded <= config.max_append_bytes, "{encoded}");
        assert!(encoded > config.max_append_bytes * 3 / 4, "{encoded}");
    }
}
