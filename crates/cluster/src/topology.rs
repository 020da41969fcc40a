//! The topology state machine: the cluster's nodes, their tokens and states, kept in the
//! metadata Raft group.
//!
//! Commands and answers are one version byte followed by JSON (metadata is small and rare).
//! A joining node's tokens are allocated when its `Join` is applied, by the deterministic
//! allocator of `sluice_ring` from the ring as it is at that log index, so every replica of
//! the log computes the same tokens and no two joins can pick from the same stale ring.
//!
//! After every change the new ring is published on a `watch` channel as an
//! `Arc<TokenMetadata>`, with a topology version that grows by one per change.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_meta::{Apply, MetaError};
use sluice_ring::allocation::allocate_tokens_for_replication;
use sluice_ring::{AllocationError, Node, NodeState, Replication, Token, TokenMetadata};
use tokio::sync::watch;
use uuid::Uuid;

/// The encoding version of commands, answers and snapshots.
pub const TOPOLOGY_VERSION_BYTE: u8 = 1;

/// The replication factor tokens are balanced for, as Cassandra's
/// `allocate_tokens_for_local_replication_factor` defaults to.
pub const ALLOCATION_REPLICATION_FACTOR: u32 = 3;

/// Most tokens a node may ask for (the allocator's own bound).
pub const MAX_NUM_TOKENS: u16 = sluice_ring::allocation::MAX_TOKENS_PER_NODE as u16;

/// A change to the topology, as proposed to the metadata group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TopologyCommand {
    /// Adds a node in state `Joining` with `num_tokens` tokens allocated at apply time; a node
    /// already present with this host id is answered its existing tokens.
    Join {
        /// The node's host id.
        #[serde(with = "uuid_text")]
        host_id: Uuid,
        /// Where clients reach it.
        cql_addr: SocketAddr,
        /// Where other nodes reach it.
        internode_addr: SocketAddr,
        /// Its data center.
        dc: String,
        /// Its rack.
        rack: String,
        /// How many tokens it asks for.
        num_tokens: u16,
    },
    /// Moves a node to another life-cycle state.
    SetState {
        /// The node's host id.
        #[serde(with = "uuid_text")]
        host_id: Uuid,
        /// The new state.
        state: WireState,
    },
    /// Forgets a node entirely.
    Remove {
        /// The node's host id.
        #[serde(with = "uuid_text")]
        host_id: Uuid,
    },
}

/// A [`NodeState`] as it is written in commands and snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireState {
    /// [`NodeState::Joining`].
    Joining,
    /// [`NodeState::Normal`].
    Normal,
    /// [`NodeState::Leaving`].
    Leaving,
    /// [`NodeState::Left`].
    Left,
}

impl From<NodeState> for WireState {
    fn from(state: NodeState) -> WireState {
        match state {
            NodeState::Joining => WireState::Joining,
            NodeState::Normal => WireState::Normal,
            NodeState::Leaving => WireState::Leaving,
            NodeState::Left => WireState::Left,
        }
    }
}

impl From<WireState> for NodeState {
    fn from(state: WireState) -> NodeState {
        match state {
            WireState::Joining => NodeState::Joining,
            WireState::Normal => NodeState::Normal,
            WireState::Leaving => NodeState::Leaving,
            WireState::Left => NodeState::Left,
        }
    }
}

/// Why a topology command was refused. Small and `Copy`, with a fixed message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TopologyError {
    /// The command or answer could not be decoded.
    Malformed,
    /// The command was written in an encoding version this node does not know.
    UnsupportedVersion,
    /// No node has this host id.
    UnknownHost,
    /// The host id belongs to a node that left; a node that comes back needs a new one.
    HostLeft,
    /// Another node already uses this internode or CQL address.
    AddressInUse,
    /// `num_tokens` is 0 or above [`MAX_NUM_TOKENS`].
    TokenCount,
    /// No range of the ring is wide enough to cut another token from.
    RingTooDense,
    /// The change would make an invalid ring.
    InvalidRing,
}

impl TopologyError {
    /// The error's message.
    pub fn message(self) -> &'static str {
        match self {
            TopologyError::Malformed => "malformed topology command",
            TopologyError::UnsupportedVersion => "unsupported topology command version",
            TopologyError::UnknownHost => "no node has this host id",
            TopologyError::HostLeft => "this host id belongs to a node that left the cluster",
            TopologyError::AddressInUse => "another node already uses this address",
            TopologyError::TokenCount => "num_tokens must be between 1 and 1024",
            TopologyError::RingTooDense => "no range of the ring is wide enough to split",
            TopologyError::InvalidRing => "the change would make an invalid ring",
        }
    }
}

impl std::fmt::Display for TopologyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for TopologyError {}

/// The state machine's answer to one command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TopologyResponse {
    /// The node is in the ring with these tokens (new, or its existing ones).
    Joined {
        /// The node's tokens, sorted.
        tokens: Vec<i64>,
    },
    /// The command was applied (or changed nothing, being a repeat).
    Done,
    /// The command was refused and changed nothing.
    Rejected(TopologyError),
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![TOPOLOGY_VERSION_BYTE];
    // Serializing these plain types into a Vec cannot fail.
    serde_json::to_writer(&mut out, value).unwrap_or_else(|_| unreachable!());
    out
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, TopologyError> {
    match bytes.split_first() {
        Some((&TOPOLOGY_VERSION_BYTE, body)) => {
            serde_json::from_slice(body).map_err(|_| TopologyError::Malformed)
        }
        Some(_) => Err(TopologyError::UnsupportedVersion),
        None => Err(TopologyError::Malformed),
    }
}

impl TopologyCommand {
    /// The command as it goes into the log.
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// A command from its log bytes.
    pub fn decode(bytes: &[u8]) -> Result<TopologyCommand, TopologyError> {
        decode(bytes)
    }
}

impl TopologyResponse {
    /// The answer as the proposer receives it.
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// An answer from its bytes; an undecodable one is `Err(Malformed)`.
    pub fn decode(bytes: &[u8]) -> Result<TopologyResponse, TopologyError> {
        decode(bytes)
    }
}

/// Host ids as their usual hyphenated text.
pub(crate) mod uuid_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use uuid::Uuid;

    pub(crate) fn serialize<S: Serializer>(id: &Uuid, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&id.hyphenated())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Uuid, D::Error> {
        let text = <&str>::deserialize(d)?;
        Uuid::parse_str(text).map_err(serde::de::Error::custom)
    }
}

/// A node as snapshots write it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct WireNode {
    #[serde(with = "uuid_text")]
    host_id: Uuid,
    cql_addr: SocketAddr,
    internode_addr: SocketAddr,
    dc: String,
    rack: String,
    tokens: Vec<i64>,
    state: WireState,
}

#[derive(Serialize, Deserialize)]
struct WireSnapshot {
    version: u64,
    nodes: Vec<WireNode>,
}

fn to_wire(node: &Node) -> WireNode {
    WireNode {
        host_id: node.host_id,
        cql_addr: node.cql_address,
        internode_addr: node.internode_address,
        dc: node.dc.clone(),
        rack: node.rack.clone(),
        tokens: node.tokens.iter().map(|t| t.0).collect(),
        state: node.state.into(),
    }
}

fn from_wire(node: WireNode) -> Node {
    Node {
        host_id: node.host_id,
        cql_address: node.cql_addr,
        internode_address: node.internode_addr,
        dc: node.dc,
        rack: node.rack,
        tokens: node.tokens.into_iter().map(Token).collect(),
        state: node.state.into(),
    }
}

/// A handle on the published topology: the current ring and its version.
#[derive(Clone, Debug)]
pub struct TopologyWatch {
    ring: watch::Receiver<Arc<TokenMetadata>>,
    version: Arc<AtomicU64>,
}

impl TopologyWatch {
    /// A receiver of the ring, marked changed on every topology change.
    pub fn ring(&self) -> watch::Receiver<Arc<TokenMetadata>> {
        self.ring.clone()
    }

    /// The current ring.
    pub fn current(&self) -> Arc<TokenMetadata> {
        Arc::clone(&self.ring.borrow())
    }

    /// The topology version: 0 for an empty topology, one more per applied change. It is
    /// stored before the ring is published, so it is never older than the ring just read.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }
}

/// The topology as an `Apply` state machine of the metadata group.
pub struct Topology {
    /// Every node in the order it joined (the ring's node indexes follow it).
    nodes: Vec<Node>,
    version: Arc<AtomicU64>,
    ring: watch::Sender<Arc<TokenMetadata>>,
}

impl Default for Topology {
    fn default() -> Topology {
        Topology::new()
    }
}

fn empty_ring() -> Arc<TokenMetadata> {
    // An empty node list always makes a ring.
    Arc::new(TokenMetadata::new(Vec::new()).unwrap_or_else(|_| unreachable!()))
}

fn allocation_error(error: AllocationError) -> TopologyError {
    match error {
        AllocationError::TokenCount => TopologyError::TokenCount,
        AllocationError::RingTooDense => TopologyError::RingTooDense,
    }
}

/// A seed for the first node's token offset, from its host id (the command's only input).
fn first_ring_seed(host_id: Uuid) -> u64 {
    let id = host_id.as_u128();
    (id >> 64) as u64 ^ id as u64
}

impl Topology {
    /// An empty topology.
    pub fn new() -> Topology {
        let (ring, _) = watch::channel(empty_ring());
        Topology {
            nodes: Vec::new(),
            version: Arc::new(AtomicU64::new(0)),
            ring,
        }
    }

    /// A handle on the ring this state machine publishes.
    pub fn watch(&self) -> TopologyWatch {
        TopologyWatch {
            ring: self.ring.subscribe(),
            version: Arc::clone(&self.version),
        }
    }

    /// Every node, in join order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node with this host id.
    pub fn node(&self, host_id: Uuid) -> Option<&Node> {
        self.nodes.iter().find(|n| n.host_id == host_id)
    }

    /// Installs `nodes` if they make a valid ring, bumps the version and publishes it.
    fn install(&mut self, nodes: Vec<Node>) -> Result<(), TopologyError> {
        let ring = TokenMetadata::new(nodes.clone()).map_err(|_| TopologyError::InvalidRing)?;
        self.nodes = nodes;
        self.version.fetch_add(1, Ordering::AcqRel);
        self.ring.send_replace(Arc::new(ring));
        Ok(())
    }

    fn join(
        &mut self,
        host_id: Uuid,
        cql_addr: SocketAddr,
        internode_addr: SocketAddr,
        dc: String,
        rack: String,
        num_tokens: u16,
    ) -> Result<Vec<i64>, TopologyError> {
        if let Some(existing) = self.node(host_id) {
            if existing.state == NodeState::Left {
                return Err(TopologyError::HostLeft);
            }
            return Ok(existing.tokens.iter().map(|t| t.0).collect());
        }
        if num_tokens == 0 || num_tokens > MAX_NUM_TOKENS {
            return Err(TopologyError::TokenCount);
        }
        let taken = self.nodes.iter().any(|n| {
            n.state != NodeState::Left
                && (n.internode_address == internode_addr || n.cql_address == cql_addr)
        });
        if taken {
            return Err(TopologyError::AddressInUse);
        }
        let mut joining = Node {
            host_id,
            cql_address: cql_addr,
            internode_address: internode_addr,
            dc,
            rack,
            tokens: Vec::new(),
            state: NodeState::Joining,
        };
        // Joining nodes' tokens are taken too: allocate against every node that holds
        // tokens, so two nodes joining one after the other never get the same ones.
        let holders: Vec<Node> = self
            .nodes
            .iter()
            .filter(|n| n.state != NodeState::Left)
            .map(|n| Node {
                state: NodeState::Normal,
                ..n.clone()
            })
            .collect();
        let ring = TokenMetadata::new(holders).map_err(|_| TopologyError::InvalidRing)?;
        let replication = Replication::Simple {
            factor: ALLOCATION_REPLICATION_FACTOR,
        };
        joining.tokens = allocate_tokens_for_replication(
            &ring,
            &joining,
            &replication,
            usize::from(num_tokens),
            first_ring_seed(host_id),
        )
        .map_err(allocation_error)?;
        let tokens = joining.tokens.iter().map(|t| t.0).collect();
        let mut nodes = self.nodes.clone();
        nodes.push(joining);
        self.install(nodes)?;
        Ok(tokens)
    }

    fn set_state(&mut self, host_id: Uuid, state: NodeState) -> Result<(), TopologyError> {
        let position = self
            .nodes
            .iter()
            .position(|n| n.host_id == host_id)
            .ok_or(TopologyError::UnknownHost)?;
        let current = self.nodes[position].state;
        if current == state {
            return Ok(());
        }
        if current == NodeState::Left {
            return Err(TopologyError::HostLeft);
        }
        let mut nodes = self.nodes.clone();
        nodes[position].state = state;
        self.install(nodes)
    }

    fn remove(&mut self, host_id: Uuid) -> Result<(), TopologyError> {
        if self.node(host_id).is_none() {
            // A repeated removal has nothing left to do.
            return Ok(());
        }
        let nodes = self
            .nodes
            .iter()
            .filter(|n| n.host_id != host_id)
            .cloned()
            .collect();
        self.install(nodes)
    }

    fn run(&mut self, command: &[u8]) -> TopologyResponse {
        let command = match TopologyCommand::decode(command) {
            Ok(command) => command,
            Err(error) => return TopologyResponse::Rejected(error),
        };
        let result = match command {
            TopologyCommand::Join {
                host_id,
                cql_addr,
                internode_addr,
                dc,
                rack,
                num_tokens,
            } => self
                .join(host_id, cql_addr, internode_addr, dc, rack, num_tokens)
                .map(|tokens| TopologyResponse::Joined { tokens }),
            TopologyCommand::SetState { host_id, state } => self
                .set_state(host_id, state.into())
                .map(|()| TopologyResponse::Done),
            TopologyCommand::Remove { host_id } => {
                self.remove(host_id).map(|()| TopologyResponse::Done)
            }
        };
        result.unwrap_or_else(TopologyResponse::Rejected)
    }
}

impl Apply for Topology {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        self.run(command).encode()
    }

    fn snapshot(&self) -> Vec<u8> {
        encode(&WireSnapshot {
            version: self.version.load(Ordering::Acquire),
            nodes: self.nodes.iter().map(to_wire).collect(),
        })
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), MetaError> {
        let snapshot: WireSnapshot = decode(snapshot).map_err(|_| MetaError::Malformed)?;
        let nodes: Vec<Node> = snapshot.nodes.into_iter().map(from_wire).collect();
        let ring = TokenMetadata::new(nodes.clone()).map_err(|_| MetaError::Malformed)?;
        self.nodes = nodes;
        self.version.store(snapshot.version, Ordering::Release);
        self.ring.send_replace(Arc::new(ring));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(n: u8, num_tokens: u16) -> TopologyCommand {
        TopologyCommand::Join {
            host_id: Uuid::from_u128(0x1000 + u128::from(n)),
            cql_addr: ([127, 0, 0, n], 9042).into(),
            internode_addr: ([127, 0, 0, n], 7000).into(),
            dc: "datacenter1".to_owned(),
            rack: "rack1".to_owned(),
            num_tokens,
        }
    }

    fn host(n: u8) -> Uuid {
        Uuid::from_u128(0x1000 + u128::from(n))
    }

    fn apply(topology: &mut Topology, index: u64, command: &TopologyCommand) -> TopologyResponse {
        TopologyResponse::decode(&topology.apply(index, &command.encode())).unwrap()
    }

    fn joined_tokens(response: TopologyResponse) -> Vec<i64> {
        match response {
            TopologyResponse::Joined { tokens } => tokens,
            other => panic!("expected Joined, got {other:?}"),
        }
    }

    #[test]
    fn three_joins_get_distinct_tokens_that_every_replica_computes_alike() {
        let mut a = Topology::new();
        let mut b = Topology::new();
        let watch = a.watch();
        let mut all = Vec::new();
        for n in 1..=3u8 {
            let from_a = joined_tokens(apply(&mut a, u64::from(n), &join(n, 16)));
            let from_b = joined_tokens(apply(&mut b, u64::from(n), &join(n, 16)));
            assert_eq!(from_a.len(), 16);
            assert_eq!(from_a, from_b, "node {n}: replicas disagree on its tokens");
            all.extend(from_a);
        }
        let distinct: std::collections::BTreeSet<i64> = all.iter().copied().collect();
        assert_eq!(distinct.len(), 48, "tokens are unique across nodes");
        assert_eq!(watch.version(), 3);
        let ring = watch.current();
        assert_eq!(ring.nodes().len(), 3);
        assert!(ring.nodes().iter().all(|n| n.state == NodeState::Joining));
        assert!(ring.is_empty(), "joining nodes own no ranges yet");
        assert_eq!(a.snapshot(), b.snapshot());
    }

    #[test]
    fn a_repeated_join_answers_the_same_tokens_and_changes_nothing() {
        let mut topology = Topology::new();
        let first = joined_tokens(apply(&mut topology, 1, &join(1, 8)));
        let version = topology.watch().version();
        let mut rx = topology.watch().ring();
        rx.mark_unchanged();
        let again = joined_tokens(apply(&mut topology, 2, &join(1, 8)));
        assert_eq!(first, again);
        assert_eq!(topology.watch().version(), version);
        assert!(!rx.has_changed().unwrap(), "a repeat publishes nothing");
        assert_eq!(topology.nodes().len(), 1);
    }

    #[test]
    fn state_changes_and_removal_are_published() {
        let mut topology = Topology::new();
        let watch = topology.watch();
        let mut rx = watch.ring();
        joined_tokens(apply(&mut topology, 1, &join(1, 4)));
        joined_tokens(apply(&mut topology, 2, &join(2, 4)));
        rx.mark_unchanged();
        let normal = TopologyCommand::SetState {
            host_id: host(1),
            state: WireState::Normal,
        };
        assert_eq!(apply(&mut topology, 3, &normal), TopologyResponse::Done);
        assert!(rx.has_changed().unwrap());
        let ring = rx.borrow_and_update().clone();
        assert_eq!(ring.tokens().len(), 4, "only the normal node owns ranges");
        assert_eq!(watch.version(), 3);

        let remove = TopologyCommand::Remove { host_id: host(1) };
        assert_eq!(apply(&mut topology, 4, &remove), TopologyResponse::Done);
        assert_eq!(watch.current().nodes().len(), 1);
        assert!(watch.current().is_empty());
        assert_eq!(apply(&mut topology, 5, &remove), TopologyResponse::Done);
        assert_eq!(watch.version(), 4, "a repeated removal changes nothing");

        let unknown = TopologyCommand::SetState {
            host_id: host(9),
            state: WireState::Normal,
        };
        assert_eq!(
            apply(&mut topology, 6, &unknown),
            TopologyResponse::Rejected(TopologyError::UnknownHost)
        );
        let left = TopologyCommand::SetState {
            host_id: host(2),
            state: WireState::Left,
        };
        assert_eq!(apply(&mut topology, 7, &left), TopologyResponse::Done);
        assert_eq!(
            apply(&mut topology, 8, &join(2, 4)),
            TopologyResponse::Rejected(TopologyError::HostLeft)
        );
    }

    #[test]
    fn joins_that_cannot_be_placed_are_refused() {
        let mut topology = Topology::new();
        assert_eq!(
            apply(&mut topology, 1, &join(1, 0)),
            TopologyResponse::Rejected(TopologyError::TokenCount)
        );
        assert_eq!(
            apply(&mut topology, 2, &join(1, MAX_NUM_TOKENS + 1)),
            TopologyResponse::Rejected(TopologyError::TokenCount)
        );
        joined_tokens(apply(&mut topology, 3, &join(1, 4)));
        let TopologyCommand::Join {
            cql_addr,
            internode_addr,
            ..
        } = join(1, 4)
        else {
            unreachable!()
        };
        let same_address = TopologyCommand::Join {
            host_id: host(7),
            cql_addr,
            internode_addr,
            dc: "datacenter1".to_owned(),
            rack: "rack1".to_owned(),
            num_tokens: 4,
        };
        assert_eq!(
            apply(&mut topology, 4, &same_address),
            TopologyResponse::Rejected(TopologyError::AddressInUse)
        );
        assert_eq!(topology.nodes().len(), 1);
    }

    #[test]
    fn a_snapshot_restores_the_same_ring_and_version() {
        let mut topology = Topology::new();
        for n in 1..=3u8 {
            joined_tokens(apply(&mut topology, u64::from(n), &join(n, 16)));
            let normal = TopologyCommand::SetState {
                host_id: host(n),
                state: WireState::Normal,
            };
            apply(&mut topology, 10 + u64::from(n), &normal);
        }
        let snapshot = topology.snapshot();
        let mut restored = Topology::new();
        let watch = restored.watch();
        restored.restore(&snapshot).unwrap();
        assert_eq!(restored.nodes(), topology.nodes());
        assert_eq!(watch.version(), topology.watch().version());
        assert_eq!(
            watch.current().tokens(),
            topology.watch().current().tokens()
        );
        assert_eq!(watch.current().tokens().len(), 48);
        // The restored copy allocates the next node's tokens exactly as the original does.
        let next_a = joined_tokens(apply(&mut topology, 20, &join(4, 16)));
        let next_b = joined_tokens(apply(&mut restored, 20, &join(4, 16)));
        assert_eq!(next_a, next_b);
        assert_eq!(
            restored.restore(b"\x01{\"version\":1}"),
            Err(MetaError::Malformed)
        );
        assert_eq!(restored.restore(b""), Err(MetaError::Malformed));
    }

    #[test]
    fn malformed_commands_are_answered_with_an_error() {
        let mut topology = Topology::new();
        let inputs: [&[u8]; 5] = [
            b"",
            b"\x01",
            b"\x01{\"Join\":{}}",
            b"\x02{\"Remove\":{\"host_id\":\"00000000-0000-0000-0000-000000000001\"}}",
            b"\x01\xff\xfe",
        ];
        let expected = [
            TopologyError::Malformed,
            TopologyError::Malformed,
            TopologyError::Malformed,
            TopologyError::UnsupportedVersion,
            TopologyError::Malformed,
        ];
        for (input, error) in inputs.iter().zip(expected) {
            let answer = TopologyResponse::decode(&topology.apply(1, input)).unwrap();
            assert_eq!(answer, TopologyResponse::Rejected(error), "{input:?}");
        }
        assert!(topology.nodes().is_empty());
        assert_eq!(topology.watch().version(), 0);
    }
}
