//! One member of the metadata group: openraft wired to the fjall log, the state machine and
//! the transport, behind [`MetaLog`].

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::InitializeError;
use openraft::error::RaftError;
use openraft::metrics::WaitError;
use openraft::{BasicNode, SnapshotPolicy};
use tokio::sync::broadcast;

use crate::log_store::{LogStore, MetaStore};
use crate::network::{
    forward, largest_single_command_messages, members_of, run_on_leader, snapshot_chunk_bytes,
    LeaderError, LeaderOp, NetworkFactory, RpcHandler,
};
use crate::state_machine::{SharedState, StateMachine};
use crate::types::{Answer, Proposal, Raft};
use crate::{
    AppliedEvent, Apply, Committed, Members, MetaConfig, MetaError, MetaLog, MetaTransport,
    RequestId,
};

/// A metadata node. Opening it replays its log; it serves once its transport routes
/// messages to [`MetaNode::rpc_handler`].
pub struct MetaNode<A: Apply, T: MetaTransport> {
    config: MetaConfig,
    raft: Raft,
    transport: Arc<T>,
    state: Arc<SharedState<A>>,
    client: u64,
    next_seq: AtomicU64,
    /// Dead once openraft's tasks dropped the log and state machine (the database is closed).
    store_alive: Box<dyn Fn() -> bool + Send + Sync>,
    /// Set by `shutdown`, so a stopped node forwards nothing to the leader.
    stopped: AtomicBool,
}

/// How a leader-side operation is retried when the leader cannot be reached.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Retry on a timeout too: the request id makes a repeated proposal apply once.
    Idempotent,
    /// Retry only when the operation surely did not run (no leader, or not the leader).
    OnlyIfNotRun,
}

fn random_client_id(node_id: u64) -> u64 {
    // A fresh id per incarnation, so request ids of a restarted node never collide with the
    // ones it used before.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(node_id);
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

/// The smallest snapshot chunk worth sending; a smaller `max_append_bytes` is refused.
const MIN_SNAPSHOT_CHUNK_BYTES: usize = 4 * 1024;

/// Checks that every message fits `max_append_bytes`: an append or forward of the largest
/// command, and a snapshot chunk. A message that does not fit would be resent forever.
fn check_message_bounds(config: &MetaConfig) -> Result<(), MetaError> {
    let largest = largest_single_command_messages(config.max_command_bytes);
    let chunk = snapshot_chunk_bytes(config.max_append_bytes);
    if largest > config.max_append_bytes || chunk < MIN_SNAPSHOT_CHUNK_BYTES {
        tracing::error!(
            max_command_bytes = config.max_command_bytes,
            largest_message_bytes = largest,
            max_append_bytes = config.max_append_bytes,
            snapshot_chunk_bytes = chunk,
            "metadata messages do not fit max_append_bytes: lower max_command_bytes or raise \
             max_append_bytes"
        );
        return Err(MetaError::Misconfigured);
    }
    Ok(())
}

/// Logs every change of this node's role or of the leader it follows, with the term: the
/// timestamps of a failover in each node's log.
async fn log_leadership(
    node: u64,
    mut server: tokio::sync::watch::Receiver<openraft::metrics::RaftServerMetrics<u64, BasicNode>>,
) {
    let mut seen = None;
    loop {
        let now = {
            let metrics = server.borrow_and_update();
            (
                metrics.state,
                metrics.current_leader,
                metrics.vote.leader_id().get_term(),
            )
        };
        if seen != Some(now) {
            let (state, leader, term) = now;
            tracing::info!(
                node,
                ?state,
                ?leader,
                term,
                "metadata group leadership changed"
            );
            seen = Some(now);
        }
        if server.changed().await.is_err() {
            return;
        }
    }
}

fn wait_error(error: WaitError) -> MetaError {
    match error {
        WaitError::Timeout(..) => MetaError::Timeout,
        WaitError::ShuttingDown => MetaError::Stopped,
    }
}

impl<A: Apply, T: MetaTransport> MetaNode<A, T> {
    /// Opens the node's log in `config.dir`, restores its last snapshot into `app` and replays
    /// the committed log after it, then starts Raft. Returns once the replay is done.
    pub async fn open(
        config: MetaConfig,
        app: A,
        transport: T,
    ) -> Result<MetaNode<A, T>, MetaError> {
        check_message_bounds(&config)?;
        let dir = config.dir.clone();
        let store = tokio::task::spawn_blocking(move || MetaStore::open(&dir))
            .await
            .map_err(|_| MetaError::Storage)?
            .map_err(|error| {
                tracing::error!(dir = %config.dir.display(), %error, "cannot open the metadata log");
                MetaError::Storage
            })?;
        let state_machine = StateMachine::open(
            store.clone(),
            app,
            config.dedup_capacity,
            config.subscriber_capacity,
        )
        .map_err(|error| {
            tracing::error!(%error, "cannot restore the metadata snapshot");
            MetaError::Storage
        })?;
        let state = state_machine.shared();
        let weak_store = store.watch_closed();
        let store_alive = Box::new(move || weak_store.strong_count() > 0);
        let millis = |d: Duration| d.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
        let raft_config = openraft::Config {
            cluster_name: "sluice-meta".to_owned(),
            heartbeat_interval: millis(config.heartbeat),
            election_timeout_min: millis(config.election_min),
            election_timeout_max: millis(config.election_max),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every.max(1)),
            // Keep some log after a snapshot so a briefly lagging follower catches up from it.
            max_in_snapshot_log_to_keep: (config.snapshot_every / 4).min(1_000),
            max_payload_entries: config.max_entries_per_append.max(1),
            snapshot_max_chunk_size: snapshot_chunk_bytes(config.max_append_bytes) as u64,
            install_snapshot_timeout: millis(config.rpc_timeout),
            ..Default::default()
        }
        .validate()
        .map_err(|_| MetaError::Malformed)?;
        let transport = Arc::new(transport);
        let network = NetworkFactory {
            transport: Arc::clone(&transport),
            source: config.node_id,
            backoff: config.heartbeat,
            max_append_bytes: config.max_append_bytes,
        };
        let raft = Raft::new(
            config.node_id,
            Arc::new(raft_config),
            network,
            LogStore::new(store),
            state_machine,
        )
        .await
        .map_err(|error| {
            tracing::error!(%error, "cannot replay the metadata log");
            MetaError::Storage
        })?;
        tokio::spawn(log_leadership(config.node_id, raft.server_metrics()));
        Ok(MetaNode {
            client: random_client_id(config.node_id),
            next_seq: AtomicU64::new(1),
            config,
            raft,
            transport,
            state,
            store_alive,
            stopped: AtomicBool::new(false),
        })
    }

    /// Starts a new group whose voters are `members` (id, transport address). Call it on one
    /// node of a new cluster (calling it on each with the same members is also correct).
    pub async fn initialize(&self, members: &[(u64, String)]) -> Result<(), MetaError> {
        let members: BTreeMap<u64, BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect();
        match self.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                Err(MetaError::AlreadyInitialized)
            }
            Err(RaftError::APIError(InitializeError::NotInMembers(_))) => {
                Err(MetaError::MembershipRejected)
            }
            Err(RaftError::Fatal(_)) => Err(MetaError::Stopped),
        }
    }

    /// The handler the transport gives this node's incoming messages to.
    pub fn rpc_handler(&self) -> RpcHandler {
        RpcHandler::new(self.raft.clone())
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.config.node_id
    }

    /// Reads the application's applied state.
    pub fn with_state<R>(&self, read: impl FnOnce(&A) -> R) -> R {
        read(&self.state.lock().app)
    }

    /// Takes a snapshot now (it is otherwise taken every `snapshot_every` entries) and waits
    /// until it is stored; the log before it is purged.
    pub async fn snapshot_now(&self, timeout: Duration) -> Result<u64, MetaError> {
        let applied = self.last_applied();
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|_| MetaError::Stopped)?;
        self.raft
            .wait(Some(timeout))
            .metrics(
                |m| m.snapshot.is_some_and(|s| s.index >= applied),
                "snapshot stored",
            )
            .await
            .map_err(wait_error)?;
        Ok(applied)
    }

    /// The index of the last stored snapshot (0: none).
    pub fn snapshot_index(&self) -> u64 {
        self.raft.metrics().borrow().snapshot.map_or(0, |s| s.index)
    }

    /// The index of the last log entry purged after a snapshot (0: none).
    pub fn purged_index(&self) -> u64 {
        self.raft.metrics().borrow().purged.map_or(0, |p| p.index)
    }

    /// Stops Raft and waits until the log is closed, so the node can be opened again from
    /// the same directory. Later calls on this handle answer [`MetaError::Stopped`].
    pub async fn shutdown(&self) -> Result<(), MetaError> {
        self.stopped.store(true, Ordering::Release);
        self.raft.shutdown().await.map_err(|_| MetaError::Stopped)?;
        // openraft's state-machine task ends shortly after its core; wait for it to drop the
        // database rather than let two handles open the same directory.
        let deadline = Instant::now() + Duration::from_secs(10);
        while (self.store_alive)() {
            if Instant::now() >= deadline {
                return Err(MetaError::Timeout);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    fn addr_of(&self, node: u64) -> String {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let addr = metrics
            .membership_config
            .membership()
            .nodes()
            .find(|(id, _)| **id == node)
            .map(|(_, n)| n.addr.clone());
        addr.unwrap_or_default()
    }

    fn pause(&self) -> Duration {
        (self.config.heartbeat / 2).max(Duration::from_millis(5))
    }

    /// Runs `op` on the leader (here or forwarded) until it succeeds or `deadline` passes.
    async fn on_leader(
        &self,
        op: LeaderOp,
        retry: Retry,
        deadline: Instant,
    ) -> Result<Answer, MetaError> {
        let mut hint: Option<u64> = None;
        loop {
            if self.stopped.load(Ordering::Acquire) {
                return Err(MetaError::Stopped);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(MetaError::Timeout);
            }
            let budget = deadline - now;
            let leader = hint.take().or_else(|| self.leader());
            let result = match leader {
                None => Err(LeaderError::NotLeader { leader: None }),
                Some(leader) if leader == self.config.node_id => {
                    run_on_leader(&self.raft, op.clone(), budget).await
                }
                Some(leader) => {
                    // A bounded attempt, so a leader that is gone does not take the whole budget:
                    // the next attempt asks whoever is leader by then.
                    let attempt = budget.min(self.config.rpc_timeout * 4);
                    let addr = self.addr_of(leader);
                    let forwarded = forward(&*self.transport, leader, &addr, op.clone(), attempt);
                    if retry == Retry::Idempotent {
                        // A leader that died with the operation never answers; once this node
                        // sees another leader (or an election), ask again there. The request id
                        // makes the retry apply once if the first one ran after all.
                        tokio::select! {
                            result = forwarded => result,
                            () = self.leader_replaced(leader) => {
                                Err(LeaderError::NotLeader { leader: None })
                            }
                        }
                    } else {
                        forwarded.await
                    }
                }
            };
            match result {
                Ok(answer) => return Ok(answer),
                Err(LeaderError::NotLeader { leader: next }) => {
                    if next.is_some() && next != leader {
                        hint = next;
                        continue;
                    }
                }
                Err(LeaderError::Failed(MetaError::Timeout | MetaError::NoLeader))
                    if retry == Retry::Idempotent => {}
                Err(LeaderError::Failed(MetaError::NoLeader)) => {}
                Err(LeaderError::Failed(error)) => return Err(error),
            }
            tokio::time::sleep(
                self.pause()
                    .min(deadline.saturating_duration_since(Instant::now())),
            )
            .await;
        }
    }

    /// Returns once this node no longer takes `leader` for the leader: another node won an
    /// election, or one is under way.
    async fn leader_replaced(&self, leader: u64) {
        let mut server = self.raft.server_metrics();
        loop {
            if server.borrow_and_update().current_leader != Some(leader) {
                return;
            }
            if server.changed().await.is_err() {
                // Raft stopped: the forward ends by its own deadline.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits until this node has applied `index`.
    async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), MetaError> {
        if self.last_applied() >= index {
            return Ok(());
        }
        let timeout = deadline.saturating_duration_since(Instant::now());
        self.raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "local apply")
            .await
            .map(|_| ())
            .map_err(wait_error)
    }

    async fn read_barrier_until(&self, deadline: Instant) -> Result<u64, MetaError> {
        let read = self
            .on_leader(LeaderOp::ReadIndex, Retry::Idempotent, deadline)
            .await?;
        self.wait_applied(read.index, deadline).await?;
        Ok(read.index)
    }

    async fn membership_change(&self, op: LeaderOp) -> Result<u64, MetaError> {
        let deadline = Instant::now() + self.config.op_timeout;
        let answer = self.on_leader(op, Retry::OnlyIfNotRun, deadline).await?;
        self.wait_applied(answer.index, deadline).await?;
        Ok(answer.index)
    }
}

impl<A: Apply, T: MetaTransport> MetaLog for MetaNode<A, T> {
    fn next_request_id(&self) -> RequestId {
        RequestId {
            client: self.client,
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    async fn propose(&self, request: RequestId, command: Vec<u8>) -> Result<Committed, MetaError> {
        if command.len() > self.config.max_command_bytes {
            return Err(MetaError::TooLarge);
        }
        let deadline = Instant::now() + self.config.op_timeout;
        let op = LeaderOp::Propose(Proposal { request, command });
        let answer = self.on_leader(op, Retry::Idempotent, deadline).await?;
        // The proposer reads its own write: wait until this node applied it too.
        self.wait_applied(answer.index, deadline).await?;
        Ok(Committed {
            index: answer.index,
            response: answer.response,
        })
    }

    async fn read_barrier(&self) -> Result<u64, MetaError> {
        self.read_barrier_until(Instant::now() + self.config.op_timeout)
            .await
    }

    async fn wait_caught_up(&self, timeout: Duration) -> Result<u64, MetaError> {
        self.read_barrier_until(Instant::now() + timeout).await
    }

    fn last_applied(&self) -> u64 {
        self.state.last_applied()
    }

    fn subscribe(&self) -> broadcast::Receiver<AppliedEvent> {
        self.state.subscribe()
    }

    fn leader(&self) -> Option<u64> {
        self.raft.server_metrics().borrow().current_leader
    }

    fn members(&self) -> Members {
        members_of(self.raft.metrics().borrow().membership_config.membership())
    }

    async fn add_learner(&self, node: u64, addr: String) -> Result<u64, MetaError> {
        self.membership_change(LeaderOp::AddLearner { node, addr })
            .await
    }

    async fn promote(&self, node: u64) -> Result<u64, MetaError> {
        self.membership_change(LeaderOp::Promote { node }).await
    }

    async fn remove(&self, node: u64) -> Result<u64, MetaError> {
        self.membership_change(LeaderOp::Remove { node }).await
    }
}
