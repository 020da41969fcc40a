//! `ClusterNode`: what a node starts before it opens its CQL port. It binds the messenger,
//! opens the metadata group with the topology state machine, serves the Control verbs, and
//! brings itself into the ring: a new cluster, a join through seeds, or a restart.
//!
//! Joining: the new node sends [`VERB_JOIN`] to a seed, which proposes its `Join` (tokens are
//! allocated when it is applied), adds it to the Raft group as a learner, and promotes it to
//! voter while the group has fewer than [`ClusterConfig::max_voters`] voters. The seed need
//! not be the leader: the metadata node forwards each step to whoever leads.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sluice_internode::{ConnectionClass, InboundMessage, Messenger, MessengerConfig};
use sluice_meta::{MetaConfig, MetaError, MetaLog, MetaNode};
use sluice_ring::{NodeState, Token, TokenMetadata};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::control::{serve_control, ControlHandler, ControlVerb};
use crate::lifecycle::Lifecycle;
use crate::raft_transport::{PeerDirectory, RaftTransport};
use crate::schema::{SchemaCommand, SchemaFollower, SchemaResponse};
use crate::state::ClusterState;
use crate::streaming::{serve_bulk, DataSlot, HintSlot};
use crate::topology::{
    uuid_text, Topology, TopologyCommand, TopologyError, TopologyResponse, TopologyWatch,
    WireState, TOPOLOGY_VERSION_BYTE,
};
use crate::verbs::{VERB_ADMIN, VERB_JOIN, VERB_NODE_LOAD, VERB_STREAM_GAINS};

/// The metadata node of a cluster node: topology and schema in one group.
pub type ClusterMeta = MetaNode<ClusterState, RaftTransport>;

/// Join requests a node serves at once.
const MAX_JOIN_HANDLERS: usize = 4;
/// First pause between join attempts; it doubles up to [`MAX_JOIN_BACKOFF`].
const MIN_JOIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest pause between join attempts.
const MAX_JOIN_BACKOFF: Duration = Duration::from_secs(2);
/// Streaming pulls a node serves at once (each is one peer's share of a decommission).
const MAX_GAINS_HANDLERS: usize = 2;
/// Load requests a node serves at once.
const MAX_LOAD_HANDLERS: usize = 16;
/// Operator commands a node serves at once.
const MAX_ADMIN_HANDLERS: usize = 4;

/// How a cluster node is set up.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Nodes of another cluster are refused at the internode handshake.
    pub cluster_name: String,
    /// This node's host id, stable across restarts.
    pub host_id: Uuid,
    /// Where clients reach this node.
    pub cql_addr: SocketAddr,
    /// The internode listen address (a specific IP; port 0 picks a free one).
    pub internode_listen: SocketAddr,
    /// Internode addresses of nodes to join through; none (or only this node) starts a new
    /// cluster.
    pub seeds: Vec<SocketAddr>,
    /// Data center name.
    pub dc: String,
    /// Rack name.
    pub rack: String,
    /// Tokens this node asks for when it joins.
    pub num_tokens: u16,
    /// The node's data directory; the metadata log lives in `<data_dir>/meta`.
    pub data_dir: PathBuf,
    /// Bound on getting into the ring: the whole join through seeds, or the replay on restart.
    pub join_timeout: Duration,
    /// Bound on one join request to one seed.
    pub join_attempt_timeout: Duration,
    /// The Raft group's voters; nodes joining after it has this many stay learners.
    pub max_voters: usize,
    /// A node that joins through seeds stays `Joining` after `start`, for its owner to stream
    /// its ranges in ([`Lifecycle::finish_join`]); without it, it becomes `Normal` at once.
    pub stream_on_join: bool,
}

impl ClusterConfig {
    /// A node with defaults: datacenter1/rack1, 16 tokens, a two-minute join bound, three
    /// voters.
    pub fn new(
        cluster_name: &str,
        host_id: Uuid,
        cql_addr: SocketAddr,
        internode_listen: SocketAddr,
        data_dir: impl Into<PathBuf>,
    ) -> ClusterConfig {
        ClusterConfig {
            cluster_name: cluster_name.to_owned(),
            host_id,
            cql_addr,
            internode_listen,
            seeds: Vec::new(),
            dc: "datacenter1".to_owned(),
            rack: "rack1".to_owned(),
            num_tokens: 16,
            data_dir: data_dir.into(),
            join_timeout: Duration::from_secs(120),
            join_attempt_timeout: Duration::from_secs(30),
            max_voters: 3,
            stream_on_join: false,
        }
    }
}

/// Why a node could not start. Small and `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartError {
    /// The internode listener could not be bound.
    Bind(std::io::ErrorKind),
    /// The metadata group failed (its log, or no leader within the bound).
    Meta(MetaError),
    /// The cluster refused this node (its address is taken, its host id left, ...).
    Refused(TopologyError),
    /// The stored topology has this node at another internode address; restart it on that
    /// one.
    AddressChanged,
    /// Some ranges this node gains could not be streamed from any of their replicas; the
    /// node stays `Joining`, and a restart tries again.
    StreamFailed {
        /// Ranges that failed.
        failed_ranges: u64,
    },
    /// Streaming was asked for before the node's data was attached.
    NoLocalData,
    /// No seed admitted this node within [`ClusterConfig::join_timeout`].
    NoSeedAnswered {
        /// Join attempts made.
        attempts: u32,
        /// What the last attempt failed with.
        last: &'static str,
    },
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Bind(kind) => write!(f, "cannot bind the internode listener: {kind}"),
            StartError::Meta(error) => write!(f, "metadata group: {error}"),
            StartError::Refused(error) => write!(f, "the cluster refused this node: {error}"),
            StartError::AddressChanged => f.write_str(
                "the cluster knows this node at another internode address; restart it there",
            ),
            StartError::StreamFailed { failed_ranges } => write!(
                f,
                "{failed_ranges} ranges could not be streamed from any replica; restart to retry"
            ),
            StartError::NoLocalData => f.write_str("the node's data is not attached"),
            StartError::NoSeedAnswered { attempts, last } => write!(
                f,
                "no seed admitted this node after {attempts} attempts (last: {last})"
            ),
        }
    }
}

impl std::error::Error for StartError {}

/// The Raft node id of a host: both halves of its host id folded together.
pub fn raft_node_id(host_id: Uuid) -> u64 {
    let id = host_id.as_u128();
    (id >> 64) as u64 ^ id as u64
}

/// What a joining node sends a seed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct JoinRequest {
    #[serde(with = "uuid_text")]
    host_id: Uuid,
    cql_addr: SocketAddr,
    internode_addr: SocketAddr,
    dc: String,
    rack: String,
    num_tokens: u16,
}

impl JoinRequest {
    /// The topology command that puts the requesting node in the ring.
    fn command(self) -> TopologyCommand {
        TopologyCommand::Join {
            host_id: self.host_id,
            cql_addr: self.cql_addr,
            internode_addr: self.internode_addr,
            dc: self.dc,
            rack: self.rack,
            num_tokens: self.num_tokens,
        }
    }
}

/// A seed's answer to a join request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum JoinReply {
    /// The node is in the topology and the Raft group, with these tokens.
    Joined { tokens: Vec<i64> },
    /// The topology refused it; retrying will not help.
    Refused(TopologyError),
    /// The group could not do it now (no leader, a timeout); another attempt may.
    Unavailable(MetaError),
}

fn encode<T: Serialize>(value: &T) -> Bytes {
    let mut out = vec![TOPOLOGY_VERSION_BYTE];
    // Serializing these plain types into a Vec cannot fail.
    serde_json::to_writer(&mut out, value).unwrap_or_else(|_| unreachable!());
    Bytes::from(out)
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<T> {
    match bytes.split_first() {
        Some((&TOPOLOGY_VERSION_BYTE, body)) => serde_json::from_slice(body).ok(),
        _ => None,
    }
}

/// A node of the cluster: its messenger, its metadata node and the published ring.
pub struct ClusterNode {
    host_id: Uuid,
    messenger: Arc<Messenger>,
    meta: Arc<ClusterMeta>,
    topology: TopologyWatch,
    tokens: Vec<Token>,
    /// The metadata group's bound on one command.
    max_command_bytes: usize,
    lifecycle: Lifecycle,
    service: JoinHandle<()>,
    bulk_service: JoinHandle<()>,
    /// Where the Bulk class hands replayed hints to the replica service.
    hints: HintSlot,
    directory_task: JoinHandle<()>,
}

impl ClusterNode {
    /// Starts the node and returns once it is in the ring in state Normal: a new one-node
    /// cluster when there are no other seeds and no stored state, a join through the seeds when
    /// there are, or, with stored state, a replay of the log and a catch-up with the leader.
    pub async fn start(config: ClusterConfig) -> Result<ClusterNode, StartError> {
        let messenger = Messenger::bind(MessengerConfig::new(
            &config.cluster_name,
            config.host_id.as_u128(),
            config.internode_listen,
        ))
        .await
        .map_err(|e| StartError::Bind(e.kind()))?;
        let messenger = Arc::new(messenger);
        let internode_addr = messenger.local_addr();
        let node_id = raft_node_id(config.host_id);

        let topology = Topology::new();
        let watch = topology.watch();
        let directory = Arc::new(PeerDirectory::new());
        directory.insert(node_id, internode_addr);
        let transport = RaftTransport::new(Arc::clone(&messenger), Arc::clone(&directory));
        let meta_config = MetaConfig::new(
            node_id,
            &internode_addr.to_string(),
            config.data_dir.join("meta"),
        );
        let max_command_bytes = meta_config.max_command_bytes;
        let state = ClusterState::new(topology);
        let meta = match MetaNode::open(meta_config, state, transport).await {
            Ok(meta) => Arc::new(meta),
            Err(error) => {
                messenger.shutdown().await;
                return Err(StartError::Meta(error));
            }
        };
        let Some(control) = messenger.take_inbound(ConnectionClass::Control) else {
            unreachable!("a new messenger's Control queue is not taken");
        };
        let Some(bulk) = messenger.take_inbound(ConnectionClass::Bulk) else {
            unreachable!("a new messenger's Bulk queue is not taken");
        };
        let data = DataSlot::default();
        let hints = HintSlot::default();
        let bulk_service = serve_bulk(bulk, Arc::clone(&data), Arc::clone(&hints));
        let lifecycle = Lifecycle::new(
            config.host_id,
            Arc::clone(&messenger),
            Arc::clone(&meta),
            watch.clone(),
            data,
            config.max_voters.max(1),
        );
        let join_meta = Arc::clone(&meta);
        let max_voters = config.max_voters.max(1);
        let join_handler: ControlHandler = Arc::new(move |message| {
            Box::pin(serve_join(Arc::clone(&join_meta), max_voters, message))
        });
        let service = serve_control(
            control,
            meta.rpc_handler(),
            vec![
                ControlVerb {
                    verb: VERB_JOIN,
                    handler: join_handler,
                    max_running: MAX_JOIN_HANDLERS,
                },
                ControlVerb {
                    verb: VERB_STREAM_GAINS,
                    handler: lifecycle_handler(&lifecycle, |l, m| Box::pin(l.serve_gains(m))),
                    max_running: MAX_GAINS_HANDLERS,
                },
                ControlVerb {
                    verb: VERB_NODE_LOAD,
                    handler: lifecycle_handler(&lifecycle, |l, m| Box::pin(l.serve_load(m))),
                    max_running: MAX_LOAD_HANDLERS,
                },
                ControlVerb {
                    verb: VERB_ADMIN,
                    handler: lifecycle_handler(&lifecycle, |l, m| Box::pin(l.serve_admin(m))),
                    max_running: MAX_ADMIN_HANDLERS,
                },
            ],
        );
        let directory_task = tokio::spawn(follow_ring(watch.ring(), directory, node_id));

        let mut node = ClusterNode {
            host_id: config.host_id,
            messenger,
            meta,
            topology: watch,
            tokens: Vec::new(),
            max_command_bytes,
            lifecycle,
            service,
            bulk_service,
            hints,
            directory_task,
        };
        match node.enter_ring(&config, internode_addr).await {
            Ok(tokens) => {
                node.tokens = tokens;
                Ok(node)
            }
            Err(error) => {
                let _ = node.stop().await;
                Err(error)
            }
        }
    }

    async fn enter_ring(
        &self,
        config: &ClusterConfig,
        internode_addr: SocketAddr,
    ) -> Result<Vec<Token>, StartError> {
        let known = self
            .meta
            .with_state(|s| s.topology().node(config.host_id).is_some());
        let seeds: Vec<SocketAddr> = config
            .seeds
            .iter()
            .copied()
            .filter(|s| *s != internode_addr && *s != config.internode_listen)
            .collect();
        let request = JoinRequest {
            host_id: config.host_id,
            cql_addr: config.cql_addr,
            internode_addr,
            dc: config.dc.clone(),
            rack: config.rack.clone(),
            num_tokens: config.num_tokens,
        };
        if known {
            let stored = self.meta.with_state(|s| {
                s.topology()
                    .node(config.host_id)
                    .map(|n| n.internode_address)
            });
            if stored != Some(internode_addr) {
                // The other nodes would keep calling the old address.
                return Err(StartError::AddressChanged);
            }
            let left = self.meta.with_state(|s| {
                s.topology()
                    .node(config.host_id)
                    .is_some_and(|n| n.state == NodeState::Left)
            });
            if left {
                // Decommissioned or removed: no longer in the Raft group, so a catch-up would
                // only wait out its bound.
                return Err(StartError::Refused(TopologyError::HostLeft));
            }
            // Replay is done (open did it); catch up with what the group committed since.
            self.meta
                .wait_caught_up(config.join_timeout)
                .await
                .map_err(StartError::Meta)?;
        } else if seeds.is_empty() {
            let node_id = raft_node_id(config.host_id);
            match self
                .meta
                .initialize(&[(node_id, internode_addr.to_string())])
                .await
            {
                Ok(()) | Err(MetaError::AlreadyInitialized) => {}
                Err(error) => return Err(StartError::Meta(error)),
            }
            self.propose(request.command()).await?;
        } else {
            let deadline = Instant::now() + config.join_timeout;
            join_through_seeds(&self.messenger, &seeds, &request, config, deadline).await?;
            self.meta
                .wait_caught_up(deadline.saturating_duration_since(Instant::now()))
                .await
                .map_err(StartError::Meta)?;
        }
        let joining = self.meta.with_state(|s| {
            s.topology()
                .node(config.host_id)
                .is_some_and(|n| n.state == NodeState::Joining)
        });
        let first_node = !known && seeds.is_empty();
        if !(config.stream_on_join && joining && !first_node) {
            // Without streaming a node owns its ranges as soon as it is in the ring.
            self.propose(TopologyCommand::SetState {
                host_id: config.host_id,
                state: WireState::Normal,
            })
            .await?;
        }
        let tokens = self.meta.with_state(|s| {
            s.topology()
                .node(config.host_id)
                .map(|n| n.tokens.clone())
                .unwrap_or_default()
        });
        debug_assert!(!tokens.is_empty(), "a node in the ring has tokens");
        Ok(tokens)
    }

    async fn propose(&self, command: TopologyCommand) -> Result<TopologyResponse, StartError> {
        propose_topology(&self.meta, command).await
    }

    /// The node's join, decommission and removal operations, and its status.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// Hands the Bulk class's replayed hints (MUTATION messages) to `replica` from now on.
    /// Set once; a second call answers false and changes nothing.
    pub fn attach_hint_receiver(
        &self,
        replica: tokio::sync::mpsc::Sender<sluice_internode::InboundMessage>,
    ) -> bool {
        self.hints.set(replica).is_ok()
    }

    /// This node's host id.
    pub fn host_id(&self) -> Uuid {
        self.host_id
    }

    /// The address other nodes reach this node at.
    pub fn internode_addr(&self) -> SocketAddr {
        self.messenger.local_addr()
    }

    /// This node's tokens, sorted.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// A receiver of the cluster's ring, marked changed on every topology change.
    pub fn ring(&self) -> watch::Receiver<Arc<TokenMetadata>> {
        self.topology.ring()
    }

    /// The published topology: the current ring and its version.
    pub fn topology(&self) -> &TopologyWatch {
        &self.topology
    }

    /// The metadata node (topology and schema).
    pub fn meta(&self) -> &Arc<ClusterMeta> {
        &self.meta
    }

    /// Hands the group's current schema to `follower` and has it follow every later change
    /// (see [`SchemaFollower`]); returns the schema epoch it was handed.
    pub fn follow_schema(&self, follower: Arc<dyn SchemaFollower>) -> u64 {
        self.meta.with_state(|s| {
            s.schema().attach(follower);
            s.schema().epoch()
        })
    }

    /// A handle to change the schema through the group.
    pub fn schema_client(&self) -> SchemaClient {
        SchemaClient {
            meta: Arc::clone(&self.meta),
            max_command_bytes: self.max_command_bytes,
        }
    }

    /// The messenger, for other services on the same internode port.
    pub fn messenger(&self) -> &Arc<Messenger> {
        &self.messenger
    }

    /// Stops the metadata node and the messenger; the data directory can then be opened
    /// again.
    pub async fn stop(&self) -> Result<(), MetaError> {
        let stopped = self.meta.shutdown().await;
        self.messenger.shutdown().await;
        self.service.abort();
        self.bulk_service.abort();
        self.directory_task.abort();
        stopped
    }
}

/// Changes the schema through the metadata group (cheap to clone).
#[derive(Clone)]
pub struct SchemaClient {
    meta: Arc<ClusterMeta>,
    max_command_bytes: usize,
}

impl SchemaClient {
    /// Waits until this node has applied everything the group committed (a read barrier), so
    /// a change built next reads the latest schema; returns the schema epoch then.
    pub async fn read_barrier(&self) -> Result<u64, MetaError> {
        self.meta.read_barrier().await?;
        Ok(self.meta.with_state(|s| s.schema().epoch()))
    }

    /// Proposes `command` and returns the state machine's answer once this node applied it
    /// (and its [`SchemaFollower`] installed it).
    pub async fn propose(&self, command: &SchemaCommand) -> Result<SchemaResponse, MetaError> {
        let committed = self
            .meta
            .propose(self.meta.next_request_id(), command.encode())
            .await?;
        SchemaResponse::decode(&committed.response).map_err(|_| MetaError::Malformed)
    }

    /// The largest encoded command the group accepts.
    pub fn max_command_bytes(&self) -> usize {
        self.max_command_bytes
    }
}

/// Proposes a topology command and returns the state machine's answer once this node
/// applied it; a rejection is an error.
pub(crate) async fn propose_topology(
    meta: &ClusterMeta,
    command: TopologyCommand,
) -> Result<TopologyResponse, StartError> {
    let committed = meta
        .propose(meta.next_request_id(), command.encode())
        .await
        .map_err(StartError::Meta)?;
    match TopologyResponse::decode(&committed.response) {
        Ok(TopologyResponse::Rejected(error)) | Err(error) => Err(StartError::Refused(error)),
        Ok(response) => Ok(response),
    }
}

/// A Control handler that runs `serve` on a clone of the node's lifecycle.
fn lifecycle_handler(
    lifecycle: &Lifecycle,
    serve: fn(Lifecycle, InboundMessage) -> crate::control::HandlerFuture,
) -> ControlHandler {
    let lifecycle = lifecycle.clone();
    Arc::new(move |message| serve(lifecycle.clone(), message))
}

/// Asks the seeds in turn to admit this node, with backoff, until one does, one refuses it,
/// or `deadline` passes.
async fn join_through_seeds(
    messenger: &Messenger,
    seeds: &[SocketAddr],
    request: &JoinRequest,
    config: &ClusterConfig,
    deadline: Instant,
) -> Result<(), StartError> {
    debug_assert!(!seeds.is_empty());
    let body = encode(request);
    let mut backoff = MIN_JOIN_BACKOFF;
    let mut attempts = 0u32;
    let mut last: &'static str = "no attempt";
    for seed in seeds.iter().cycle() {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        attempts += 1;
        let attempt_deadline = deadline.min(now + config.join_attempt_timeout);
        let reply = messenger
            .call(
                *seed,
                ConnectionClass::Control,
                VERB_JOIN,
                body.clone(),
                attempt_deadline,
            )
            .await;
        match reply.map(|bytes| decode::<JoinReply>(&bytes)) {
            Ok(Some(JoinReply::Joined { tokens })) => {
                tracing::info!(%seed, tokens = tokens.len(), "joined the cluster");
                return Ok(());
            }
            Ok(Some(JoinReply::Refused(error))) => return Err(StartError::Refused(error)),
            Ok(Some(JoinReply::Unavailable(error))) => last = error.message(),
            Ok(None) => last = "malformed join reply",
            Err(error) => last = error.message(),
        }
        tracing::debug!(%seed, why = last, "join attempt failed");
        let pause = backoff.min(deadline.saturating_duration_since(Instant::now()));
        tokio::time::sleep(pause).await;
        backoff = (backoff * 2).min(MAX_JOIN_BACKOFF);
    }
    Err(StartError::NoSeedAnswered { attempts, last })
}

/// Admits the node of one join request and answers it.
async fn serve_join(meta: Arc<ClusterMeta>, max_voters: usize, message: InboundMessage) {
    let Some(request) = decode::<JoinRequest>(&message.body) else {
        message.reply(encode(&JoinReply::Refused(TopologyError::Malformed)));
        return;
    };
    let deadline = message.deadline();
    let reply = tokio::time::timeout_at(deadline.into(), admit(&meta, max_voters, request))
        .await
        .unwrap_or(JoinReply::Unavailable(MetaError::Timeout));
    message.reply(encode(&reply));
}

/// Puts the node in the topology (tokens allocated at apply time), then in the Raft group.
/// Each step is idempotent, so a retried join after a partial one completes it.
async fn admit(meta: &ClusterMeta, max_voters: usize, request: JoinRequest) -> JoinReply {
    let node_id = raft_node_id(request.host_id);
    let internode_addr = request.internode_addr;
    let command = request.command();
    let committed = match meta.propose(meta.next_request_id(), command.encode()).await {
        Ok(committed) => committed,
        Err(error) => return JoinReply::Unavailable(error),
    };
    let tokens = match TopologyResponse::decode(&committed.response) {
        Ok(TopologyResponse::Joined { tokens }) => tokens,
        Ok(TopologyResponse::Rejected(error)) | Err(error) => return JoinReply::Refused(error),
        Ok(TopologyResponse::Done) => return JoinReply::Refused(TopologyError::Malformed),
    };
    let members = meta.members();
    if members.voters.iter().any(|(id, _)| *id == node_id) {
        return JoinReply::Joined { tokens };
    }
    if let Err(error) = meta.add_learner(node_id, internode_addr.to_string()).await {
        return JoinReply::Unavailable(error);
    }
    if meta.members().voters.len() < max_voters {
        if let Err(error) = meta.promote(node_id).await {
            return JoinReply::Unavailable(error);
        }
    }
    JoinReply::Joined { tokens }
}

/// Keeps the peer directory equal to the ring's nodes (except those that left).
async fn follow_ring(
    mut ring: watch::Receiver<Arc<TokenMetadata>>,
    directory: Arc<PeerDirectory>,
    own_id: u64,
) {
    let mut known: Vec<u64> = Vec::new();
    loop {
        let current = Arc::clone(&ring.borrow_and_update());
        let mut present = Vec::with_capacity(current.nodes().len());
        for node in current.nodes() {
            if node.state == NodeState::Left {
                continue;
            }
            let id = raft_node_id(node.host_id);
            directory.insert(id, node.internode_address);
            present.push(id);
        }
        for id in known.iter().filter(|id| !present.contains(id)) {
            if *id != own_id {
                directory.remove(*id);
            }
        }
        known = present;
        if ring.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_messages_survive_the_wire_and_garbage_is_refused() {
        let request = JoinRequest {
            host_id: Uuid::from_u128(42),
            cql_addr: "127.0.0.2:9042".parse().unwrap(),
            internode_addr: "127.0.0.2:7000".parse().unwrap(),
            dc: "dc1".to_owned(),
            rack: "r1".to_owned(),
            num_tokens: 16,
        };
        assert_eq!(decode::<JoinRequest>(&encode(&request)), Some(request));
        let reply = JoinReply::Unavailable(MetaError::NoLeader);
        assert_eq!(decode::<JoinReply>(&encode(&reply)), Some(reply));
        assert_eq!(decode::<JoinRequest>(b""), None);
        assert_eq!(decode::<JoinRequest>(b"\x01{}"), None);
        assert_eq!(decode::<JoinRequest>(b"\x07{}"), None);
    }

    #[test]
    fn raft_ids_differ_for_different_hosts() {
        let a = raft_node_id(Uuid::from_u128(1));
        let b = raft_node_id(Uuid::from_u128(2));
        assert_ne!(a, b);
        assert_eq!(a, raft_node_id(Uuid::from_u128(1)));
    }
}
