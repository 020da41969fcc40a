//! A node's life in the ring after it is admitted: finishing a join by streaming the ranges it
//! gains, decommission, removal of a dead node, and the status an operator reads
//! (`sluice nodetool`).
//!
//! Every data movement is a pull by the node that gains ranges ([`crate::streaming`]):
//! - **join**: the joining node, still `Joining`, pulls each range it will replicate from the
//!   range's current replicas, becomes `Normal`, then pulls the same ranges once more, so
//!   that writes its old replicas took while it streamed reach it too;
//! - **decommission**: the leaving node becomes `Leaving`, asks every other normal node to
//!   pull what it gains when the leaving node is gone ([`VERB_STREAM_GAINS`], the leaving node
//!   its first source), becomes `Left`, leaves the Raft group, asks for the same pull once
//!   more (the writes it took while leaving), and then stops;
//! - **removenode**: any node checks that the removed node does not answer, asks every normal
//!   node to pull what it gains from the removed node's other replicas, then marks it `Left`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sluice_internode::{CallError, ConnectionClass, InboundMessage, Messenger, MessengerConfig};
use sluice_meta::MetaLog;
use sluice_ring::{primary_ownership, NodeState, TokenMetadata};
use tokio::sync::watch;
use uuid::Uuid;

use crate::node::{propose_topology, raft_node_id, ClusterMeta, StartError};
use crate::streaming::{
    enough_replicas_without, plan_gains, ring_with_state, run_plan, DataSlot, LocalData,
    StreamStats,
};
use crate::topology::{TopologyCommand, TopologyWatch, WireState};
use crate::verbs::{VERB_ADMIN, VERB_NODE_LOAD, VERB_STREAM_GAINS};

/// How long a peer may take to answer a load request before `status` calls it down.
const LOAD_DEADLINE: Duration = Duration::from_secs(2);
/// Bound on one peer's pull of everything it gains from a leaving node.
const GAINS_DEADLINE: Duration = Duration::from_secs(3600);

/// One node as `nodetool status` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Host id.
    #[serde(with = "crate::topology::uuid_text")]
    pub host_id: Uuid,
    /// Address clients reach it at.
    pub cql_address: SocketAddr,
    /// Address of node-to-node messaging.
    pub internode_address: SocketAddr,
    /// Data center.
    pub dc: String,
    /// Rack.
    pub rack: String,
    /// Ring state: JOINING, NORMAL, LEAVING (left nodes are not listed).
    pub state: String,
    /// Whether it answered (this node always does).
    pub up: bool,
    /// Bytes of data on its disk, when it answered.
    pub load: Option<u64>,
    /// Tokens it holds.
    pub tokens: usize,
    /// Its share of the ring's primary ranges, 0 to 1.
    pub owns: f64,
}

/// An operator's command to one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminRequest {
    /// Every node of the ring with its state, liveness and load.
    Status,
    /// Stream this node's ranges away, leave the ring, and stop.
    Decommission,
    /// Remove a dead node from the ring, its ranges re-streamed from their other replicas.
    RemoveNode {
        /// The dead node's host id.
        #[serde(with = "crate::topology::uuid_text")]
        host_id: Uuid,
    },
}

/// A node's answer to an [`AdminRequest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum AdminReply {
    /// The nodes, for `Status`.
    Status(Vec<NodeStatus>),
    /// What a decommission or removal streamed.
    Done(StreamTotals),
    /// Why the command was not run (or did not finish).
    Refused(String),
}

/// What a decommission or removal streamed, over every node that pulled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamTotals {
    /// Ranges pulled.
    pub ranges: u64,
    /// Ranges no source could give.
    pub failed_ranges: u64,
    /// Records applied.
    pub records: u64,
    /// Key and value bytes applied.
    pub bytes: u64,
}

impl StreamTotals {
    fn add(&mut self, s: StreamStats) {
        self.ranges += s.ranges;
        self.failed_ranges += s.failed_ranges;
        self.records += s.records;
        self.bytes += s.bytes;
    }
}

/// A request to pull what this node gains when `subject` leaves the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct GainsRequest {
    #[serde(with = "crate::topology::uuid_text")]
    subject: Uuid,
    /// The subject is dead: never a source.
    removed: bool,
    /// Take the subject out of the Raft group first: a node cannot remove itself, as it
    /// would wait to apply a change it is no longer sent.
    #[serde(default)]
    leave_group: bool,
}

/// The lifecycle operations of one node (cheap to clone).
#[derive(Clone)]
pub struct Lifecycle {
    inner: Arc<Inner>,
}

struct Inner {
    host_id: Uuid,
    messenger: Arc<Messenger>,
    meta: Arc<ClusterMeta>,
    topology: TopologyWatch,
    data: DataSlot,
    /// The Raft group's voters, kept when a voter leaves.
    max_voters: usize,
    left: watch::Sender<bool>,
    /// One join, decommission or removal at a time on this node.
    busy: tokio::sync::Mutex<()>,
}

fn encode<T: Serialize>(value: &T) -> Bytes {
    // Serializing these plain types into a Vec cannot fail.
    Bytes::from(serde_json::to_vec(value).unwrap_or_else(|_| unreachable!()))
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<T> {
    serde_json::from_slice(bytes).ok()
}

impl Lifecycle {
    pub(crate) fn new(
        host_id: Uuid,
        messenger: Arc<Messenger>,
        meta: Arc<ClusterMeta>,
        topology: TopologyWatch,
        data: DataSlot,
        max_voters: usize,
    ) -> Lifecycle {
        Lifecycle {
            inner: Arc::new(Inner {
                host_id,
                messenger,
                meta,
                topology,
                data,
                max_voters,
                left: watch::channel(false).0,
                busy: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// Attaches this node's data; until then streaming requests are refused. Only the first
    /// call counts.
    pub fn attach(&self, data: Arc<dyn LocalData>) {
        if self.inner.data.set(data).is_err() {
            tracing::warn!("local data already attached; keeping the first");
        }
    }

    /// Marked `true` once this node has left the ring (decommissioned): it should stop.
    pub fn left(&self) -> watch::Receiver<bool> {
        self.inner.left.subscribe()
    }

    fn data(&self) -> Result<Arc<dyn LocalData>, &'static str> {
        self.inner
            .data
            .get()
            .cloned()
            .ok_or("the node's data is not open yet")
    }

    fn state_of(&self, ring: &TokenMetadata, host_id: Uuid) -> Option<NodeState> {
        ring.index_of(host_id).map(|i| ring.node(i).state)
    }

    async fn set_state(&self, host_id: Uuid, state: WireState) -> Result<(), StartError> {
        propose_topology(
            &self.inner.meta,
            TopologyCommand::SetState { host_id, state },
        )
        .await
        .map(|_| ())
    }

    /// Finishes this node's join: while it is `Joining`, pulls every range it will replicate
    /// from the range's current replicas, becomes `Normal`, then pulls them once more (the
    /// writes they took meanwhile). Does nothing for a node that is not joining. Fails,
    /// leaving the node `Joining` (a restart resumes), when a range had no source that
    /// answered.
    pub async fn finish_join(&self) -> Result<StreamStats, StartError> {
        let _busy = self.inner.busy.lock().await;
        let me = self.inner.host_id;
        let ring = self.inner.topology.current();
        if self.state_of(&ring, me) != Some(NodeState::Joining) {
            return Ok(StreamStats::default());
        }
        let data = self.data().map_err(|_| StartError::NoLocalData)?;
        let tables = data.tables();
        let (Some(old), Some(new)) = (
            ring_with_state(&ring, me, NodeState::Joining),
            ring_with_state(&ring, me, NodeState::Normal),
        ) else {
            return Err(StartError::Refused(crate::TopologyError::InvalidRing));
        };
        let plan = plan_gains(&tables, &old, &new, me, None, None);
        let started = Instant::now();
        let mut stats = run_plan(&self.inner.messenger, &data, &plan).await;
        if stats.failed_ranges > 0 {
            return Err(StartError::StreamFailed {
                failed_ranges: stats.failed_ranges,
            });
        }
        tracing::info!(
            ranges = stats.ranges,
            records = stats.records,
            bytes = stats.bytes,
            seconds = started.elapsed().as_secs_f64(),
            "streamed the ranges this node gains"
        );
        self.set_state(me, WireState::Normal).await?;
        let catch_up = run_plan(&self.inner.messenger, &data, &plan).await;
        tracing::info!(
            records = catch_up.records,
            failed_ranges = catch_up.failed_ranges,
            "pulled the joined ranges once more after becoming normal"
        );
        stats.add(catch_up);
        Ok(stats)
    }

    /// Pulls what this node gains when `subject` leaves the ring.
    async fn pull_gains(&self, request: GainsRequest) -> Result<StreamStats, &'static str> {
        let data = self.data()?;
        if request.leave_group {
            self.remove_member(request.subject).await;
        }
        let me = self.inner.host_id;
        let ring = self.inner.topology.current();
        let (Some(old), Some(new)) = (
            ring_with_state(&ring, request.subject, NodeState::Normal),
            ring_with_state(&ring, request.subject, NodeState::Left),
        ) else {
            return Err("the leaving node is not in the ring");
        };
        let tables = data.tables();
        let (prefer, avoid) = match request.removed {
            true => (None, Some(request.subject)),
            false => (Some(request.subject), None),
        };
        let plan = plan_gains(&tables, &old, &new, me, prefer, avoid);
        Ok(run_plan(&self.inner.messenger, &data, &plan).await)
    }

    /// Takes `host_id` out of the Raft group (a warning when it cannot).
    async fn remove_member(&self, host_id: Uuid) {
        let node = raft_node_id(host_id);
        let members = self.inner.meta.members();
        let member = members
            .voters
            .iter()
            .chain(&members.learners)
            .any(|(id, _)| *id == node);
        if !member {
            return;
        }
        if let Err(error) = self.inner.meta.remove(node).await {
            tracing::warn!(%error, %host_id, "cannot take a node that left out of the metadata group");
            return;
        }
        // Keep the group at its number of voters: promote a normal learner in its place.
        let members = self.inner.meta.members();
        if members.voters.len() >= self.inner.max_voters {
            return;
        }
        let ring = self.inner.topology.current();
        let learner = members.learners.iter().find(|(id, _)| {
            ring.nodes()
                .iter()
                .any(|n| n.state == NodeState::Normal && raft_node_id(n.host_id) == *id)
        });
        if let Some((id, _)) = learner {
            if let Err(error) = self.inner.meta.promote(*id).await {
                tracing::warn!(%error, "cannot promote a learner to replace a voter that left");
            }
        }
    }

    /// Has every normal node but `subject` pull what it gains when `subject` leaves; with
    /// `leave_group`, the first one asked takes `subject` out of the Raft group first.
    async fn pull_everywhere(&self, mut request: GainsRequest) -> StreamTotals {
        let ring = self.inner.topology.current();
        let mut totals = StreamTotals::default();
        for node in ring.nodes() {
            if node.state != NodeState::Normal || node.host_id == request.subject {
                continue;
            }
            let asked = request;
            request.leave_group = false;
            if node.host_id == self.inner.host_id {
                match self.pull_gains(asked).await {
                    Ok(stats) => totals.add(stats),
                    Err(why) => {
                        tracing::warn!(why, "cannot pull the ranges this node gains");
                        totals.failed_ranges += 1;
                    }
                }
                continue;
            }
            let reply = self
                .inner
                .messenger
                .call(
                    node.internode_address,
                    ConnectionClass::Control,
                    VERB_STREAM_GAINS,
                    encode(&asked),
                    Instant::now() + GAINS_DEADLINE,
                )
                .await;
            match reply.map(|body| decode::<Result<StreamTotals, String>>(&body)) {
                Ok(Some(Ok(stats))) => {
                    totals.ranges += stats.ranges;
                    totals.failed_ranges += stats.failed_ranges;
                    totals.records += stats.records;
                    totals.bytes += stats.bytes;
                }
                Ok(Some(Err(why))) => {
                    tracing::warn!(peer = %node.internode_address, why, "a peer could not pull its ranges");
                    totals.failed_ranges += 1;
                }
                Ok(None) => totals.failed_ranges += 1,
                Err(error) => {
                    tracing::warn!(peer = %node.internode_address, why = error.message(), "a peer could not be asked to pull its ranges");
                    totals.failed_ranges += 1;
                }
            }
        }
        totals
    }

    /// Streams this node's ranges to the nodes that take them over, leaves the ring and the
    /// Raft group, and marks [`Lifecycle::left`].
    pub async fn decommission(&self) -> Result<StreamTotals, &'static str> {
        let Ok(_busy) = self.inner.busy.try_lock() else {
            return Err("another join, decommission or removal is running on this node");
        };
        let me = self.inner.host_id;
        let ring = self.inner.topology.current();
        match self.state_of(&ring, me) {
            Some(NodeState::Normal | NodeState::Leaving) => {}
            _ => return Err("only a normal node can be decommissioned"),
        }
        let others = ring
            .nodes()
            .iter()
            .filter(|n| n.host_id != me && n.state == NodeState::Normal)
            .count();
        if others == 0 {
            return Err("the last normal node of the ring cannot leave it");
        }
        let data = self.data()?;
        if !enough_replicas_without(&data.tables(), &ring, me) {
            return Err("the remaining nodes would be fewer than a keyspace's replication factor");
        }
        self.set_state(me, WireState::Leaving)
            .await
            .map_err(|_| "cannot mark this node leaving")?;
        let request = GainsRequest {
            subject: me,
            removed: false,
            leave_group: false,
        };
        let mut totals = self.pull_everywhere(request).await;
        if totals.failed_ranges > 0 {
            // Still a replica of everything: the operator can retry.
            return Err("some ranges could not be streamed away; the node stays leaving");
        }
        self.set_state(me, WireState::Left)
            .await
            .map_err(|_| "cannot mark this node left")?;
        let catch_up = self
            .pull_everywhere(GainsRequest {
                leave_group: true,
                ..request
            })
            .await;
        totals.records += catch_up.records;
        totals.bytes += catch_up.bytes;
        totals.failed_ranges += catch_up.failed_ranges;
        self.inner.left.send_replace(true);
        Ok(totals)
    }

    /// Removes the dead node `host_id` from the ring: every normal node pulls the ranges it
    /// gains from their other replicas, then the node is marked left and leaves the Raft
    /// group. Refused while the node answers.
    pub async fn remove_node(&self, host_id: Uuid) -> Result<StreamTotals, &'static str> {
        let Ok(_busy) = self.inner.busy.try_lock() else {
            return Err("another join, decommission or removal is running on this node");
        };
        if host_id == self.inner.host_id {
            return Err("a node cannot remove itself; decommission it");
        }
        let ring = self.inner.topology.current();
        let Some(index) = ring.index_of(host_id) else {
            return Err("no node with that host id in the ring");
        };
        let node = ring.node(index).clone();
        if node.state == NodeState::Left {
            return Err("that node has already left");
        }
        if self.load_of(node.internode_address).await.is_ok() {
            return Err("that node is alive; decommission it instead");
        }
        let mut totals = StreamTotals::default();
        if node.state.owns_tokens() {
            totals = self
                .pull_everywhere(GainsRequest {
                    subject: host_id,
                    removed: true,
                    leave_group: false,
                })
                .await;
        }
        self.set_state(host_id, WireState::Left)
            .await
            .map_err(|_| "cannot mark the node left")?;
        self.remove_member(host_id).await;
        Ok(totals)
    }

    async fn load_of(&self, peer: SocketAddr) -> Result<u64, CallError> {
        let body = self
            .inner
            .messenger
            .call(
                peer,
                ConnectionClass::Control,
                VERB_NODE_LOAD,
                Bytes::new(),
                Instant::now() + LOAD_DEADLINE,
            )
            .await?;
        let bytes: [u8; 8] = body.as_ref().try_into().map_err(|_| CallError::Failed)?;
        Ok(u64::from_be_bytes(bytes))
    }

    async fn local_load(&self) -> Option<u64> {
        let data = self.data().ok()?;
        tokio::task::spawn_blocking(move || data.load_bytes())
            .await
            .ok()
    }

    /// Every node of the ring but those that left, with liveness and load (asked of each
    /// peer, all at once, within [`LOAD_DEADLINE`]).
    pub async fn status(&self) -> Vec<NodeStatus> {
        let ring = self.inner.topology.current();
        let owns = primary_ownership(&ring);
        let mut asks = tokio::task::JoinSet::new();
        for (i, node) in ring.nodes().iter().enumerate() {
            if node.state == NodeState::Left || node.host_id == self.inner.host_id {
                continue;
            }
            let this = self.clone();
            let peer = node.internode_address;
            asks.spawn(async move { (i, this.load_of(peer).await.ok()) });
        }
        let mut loads: Vec<Option<u64>> = vec![None; ring.nodes().len()];
        while let Some(answer) = asks.join_next().await {
            if let Ok((i, load)) = answer {
                loads[i] = load;
            }
        }
        let local = self.local_load().await;
        let mut out = Vec::with_capacity(ring.nodes().len());
        for (i, node) in ring.nodes().iter().enumerate() {
            if node.state == NodeState::Left {
                continue;
            }
            let (up, load) = if node.host_id == self.inner.host_id {
                (true, local)
            } else {
                (loads[i].is_some(), loads[i])
            };
            out.push(NodeStatus {
                host_id: node.host_id,
                cql_address: node.cql_address,
                internode_address: node.internode_address,
                dc: node.dc.clone(),
                rack: node.rack.clone(),
                state: node.state.as_str().to_owned(),
                up,
                load,
                tokens: node.tokens.len(),
                owns: owns.get(i).copied().unwrap_or(0.0),
            });
        }
        out
    }

    /// Answers a [`VERB_STREAM_GAINS`] request.
    pub(crate) async fn serve_gains(self, message: InboundMessage) {
        let Some(request) = decode::<GainsRequest>(&message.body) else {
            message.reply(encode(&Err::<StreamTotals, _>("malformed request")));
            return;
        };
        let reply = match self.pull_gains(request).await {
            Ok(stats) => {
                let mut totals = StreamTotals::default();
                totals.add(stats);
                Ok(totals)
            }
            Err(why) => Err(why.to_owned()),
        };
        message.reply(encode(&reply));
    }

    /// Answers a [`VERB_NODE_LOAD`] request.
    pub(crate) async fn serve_load(self, message: InboundMessage) {
        let load = self.local_load().await.unwrap_or(0);
        message.reply(Bytes::copy_from_slice(&load.to_be_bytes()));
    }

    /// Answers a [`VERB_ADMIN`] request.
    pub(crate) async fn serve_admin(self, message: InboundMessage) {
        let reply = match decode::<AdminRequest>(&message.body) {
            None => AdminReply::Refused("malformed admin request".to_owned()),
            Some(AdminRequest::Status) => AdminReply::Status(self.status().await),
            Some(AdminRequest::Decommission) => match self.decommission().await {
                Ok(totals) => AdminReply::Done(totals),
                Err(why) => AdminReply::Refused(why.to_owned()),
            },
            Some(AdminRequest::RemoveNode { host_id }) => match self.remove_node(host_id).await {
                Ok(totals) => AdminReply::Done(totals),
                Err(why) => AdminReply::Refused(why.to_owned()),
            },
        };
        message.reply(encode(&reply));
    }
}

/// Sends `request` to the node at `node` (its internode address) and returns its answer, for
/// `sluice nodetool`: opens a messenger of its own, of the node's cluster name, on the node's
/// IP (the answer comes back on a connection to it), and closes it after.
pub async fn ask_node(
    cluster_name: &str,
    node: SocketAddr,
    request: &AdminRequest,
    deadline: Instant,
) -> Result<AdminReply, &'static str> {
    let listen = SocketAddr::new(node.ip(), 0);
    let messenger = Messenger::bind(MessengerConfig::new(
        cluster_name,
        Uuid::new_v4().as_u128(),
        listen,
    ))
    .await
    .map_err(|_| "cannot open an internode endpoint on the node's IP")?;
    let reply = messenger
        .call(
            node,
            ConnectionClass::Control,
            VERB_ADMIN,
            encode(request),
            deadline,
        )
        .await;
    messenger.shutdown().await;
    decode(&reply.map_err(|e| e.message())?).ok_or("malformed answer from the node")
}
