//! The cluster as this node sees it: the current token ring, which peers are down, and the
//! TOPOLOGY_CHANGE / STATUS_CHANGE events their changes produce.
//!
//! The ring is an immutable [`TokenMetadata`] swapped whole: readers clone the `Arc` under a
//! read lock held for no longer than that. Changes (a new ring, a liveness flip) are
//! serialised by one mutex, diffed against what was last announced, and broadcast, so an
//! unchanged ring or a repeated liveness report sends nothing.

use sluice_protocol::response::{StatusChange, TopologyChange};
use sluice_ring::{Node, TokenMetadata};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::{broadcast, watch};
use uuid::Uuid;

/// How many node events a slow connection may fall behind before it misses some.
const NODE_EVENT_BACKLOG: usize = 256;

/// A change in the cluster that registered connections are told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeEvent {
    /// TOPOLOGY_CHANGE: a node started serving or left the ring.
    Topology(TopologyChange),
    /// STATUS_CHANGE: a node went up or down.
    Status(StatusChange),
}

/// This node's identity as the event rules need it.
#[derive(Debug, Clone, Copy)]
struct Me {
    host_id: Uuid,
    /// Native address: an event about another endpoint with this address is never sent
    /// (Cassandra's guard for nodes all advertising one address, CASSANDRA-10052).
    cql_address: SocketAddr,
}

/// The current ring and, while nodes join or leave, the ring once they settle (computed once
/// per ring change, for the pending replicas of every write).
#[derive(Clone)]
pub(crate) struct Rings {
    /// The ring as it is.
    pub(crate) current: Arc<TokenMetadata>,
    /// [`TokenMetadata::settled`] of `current`.
    pub(crate) settled: Option<Arc<TokenMetadata>>,
}

impl Rings {
    fn of(current: Arc<TokenMetadata>) -> Rings {
        let settled = current.settled().map(Arc::new);
        Rings { current, settled }
    }
}

/// The live ring, liveness and the event channel.
pub(crate) struct ClusterView {
    me: Me,
    ring: RwLock<Rings>,
    /// Whether the ring has other nodes: read on every request, so kept apart from the ring's
    /// lock and reference count, which all shards would otherwise touch.
    multi_node: std::sync::atomic::AtomicBool,
    /// Host ids reported down; its lock also serialises every change, so that events go
    /// out in the order the changes were applied.
    down: Mutex<HashSet<Uuid>>,
    events: broadcast::Sender<NodeEvent>,
}

impl ClusterView {
    /// A view starting from `ring`, with every node up.
    pub(crate) fn new(host_id: Uuid, cql_address: SocketAddr, ring: TokenMetadata) -> Self {
        let (events, _) = broadcast::channel(NODE_EVENT_BACKLOG);
        let multi_node = std::sync::atomic::AtomicBool::new(ring.nodes().len() > 1);
        ClusterView {
            multi_node,
            me: Me {
                host_id,
                cql_address,
            },
            ring: RwLock::new(Rings::of(Arc::new(ring))),
            down: Mutex::new(HashSet::new()),
            events,
        }
    }

    /// The current ring.
    pub(crate) fn ring(&self) -> Arc<TokenMetadata> {
        match self.ring.read() {
            Ok(g) => g.current.clone(),
            Err(p) => p.into_inner().current.clone(),
        }
    }

    /// The current ring with its settled ring, read together.
    pub(crate) fn rings(&self) -> Rings {
        match self.ring.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Whether the ring has nodes besides this one.
    pub(crate) fn is_multi_node(&self) -> bool {
        self.multi_node.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Subscribes to node events.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<NodeEvent> {
        self.events.subscribe()
    }

    /// Installs `next` as the ring and announces how the served nodes changed; returns how
    /// many events were sent.
    pub(crate) fn set_ring(&self, next: Arc<TokenMetadata>) -> usize {
        let mut down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        let previous = self.ring();
        let mut changes = Vec::new();
        topology_changes(self.me, &previous, &next, &mut changes);
        down.retain(|id| next.index_of(*id).is_some());
        // Built before the lock: readers never wait for a placement computation.
        let rings = Rings::of(next);
        {
            let mut g = self.ring.write().unwrap_or_else(|p| p.into_inner());
            self.multi_node.store(
                rings.current.nodes().len() > 1,
                std::sync::atomic::Ordering::Relaxed,
            );
            *g = rings;
        }
        for &c in &changes {
            tracing::info!(change = ?c, "ring changed");
            // No subscriber (no registered connection) is not an error.
            let _ = self.events.send(NodeEvent::Topology(c));
        }
        changes.len()
    }

    /// Records the failure detector's verdict on a node; sends STATUS_CHANGE when it flips
    /// for a node drivers know (a served peer). Returns whether the verdict changed.
    pub(crate) fn set_node_up(&self, host_id: Uuid, up: bool) -> bool {
        if host_id == self.me.host_id {
            return false;
        }
        let mut down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        let ring = self.ring();
        let Some(idx) = ring.index_of(host_id) else {
            return false;
        };
        let changed = if up {
            down.remove(&host_id)
        } else {
            down.insert(host_id)
        };
        let node = ring.node(idx);
        if changed && announced(self.me, node) {
            let addr = node.cql_address;
            let status = if up {
                StatusChange::Up(addr)
            } else {
                StatusChange::Down(addr)
            };
            tracing::info!(change = ?status, "node liveness changed");
            let _ = self.events.send(NodeEvent::Status(status));
        }
        changed
    }

    /// Whether the node with this host id is not reported down.
    pub(crate) fn is_up(&self, host_id: Uuid) -> bool {
        !self
            .down
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&host_id)
    }
}

/// Whether drivers are told about `node`: another node that serves its ranges (normal, or
/// leaving but still a natural replica). Joining nodes are announced once they are normal.
pub(crate) fn is_served_peer(me_host_id: Uuid, node: &Node) -> bool {
    node.host_id != me_host_id && node.state.owns_tokens()
}

fn announced(me: Me, node: &Node) -> bool {
    is_served_peer(me.host_id, node) && node.cql_address != me.cql_address
}

/// The TOPOLOGY_CHANGE events that take drivers from `old` to `new`: REMOVED_NODE for every
/// announced node that is gone (or moved to another address), then NEW_NODE for every node
/// announced now and not before.
fn topology_changes(
    me: Me,
    old: &TokenMetadata,
    new: &TokenMetadata,
    out: &mut Vec<TopologyChange>,
) {
    let announced_at = |ring: &TokenMetadata, n: &Node| {
        ring.index_of(n.host_id)
            .map(|i| ring.node(i))
            .is_some_and(|m| announced(me, m) && m.cql_address == n.cql_address)
    };
    for n in old.nodes().iter().filter(|n| announced(me, n)) {
        if !announced_at(new, n) {
            out.push(TopologyChange::RemovedNode(n.cql_address));
        }
    }
    for n in new.nodes().iter().filter(|n| announced(me, n)) {
        if !announced_at(old, n) {
            out.push(TopologyChange::NewNode(n.cql_address));
        }
    }
}

/// Applies every ring published on `rings` to `engine` until the sender is dropped: the
/// hand-over point for the metadata group's topology, run as one task per node.
pub async fn follow_ring(
    engine: Arc<crate::Engine>,
    mut rings: watch::Receiver<Arc<TokenMetadata>>,
) {
    loop {
        let ring = rings.borrow_and_update().clone();
        engine.set_ring(ring);
        if rings.changed().await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_ring::{NodeState, Token};

    pub(crate) fn node(n: u8, state: NodeState, tokens: &[i64]) -> Node {
        Node {
            host_id: Uuid::from_u128(u128::from(n)),
            cql_address: ([127, 0, 0, n], 9042).into(),
            internode_address: ([127, 0, 0, n], 7000).into(),
            dc: "datacenter1".to_string(),
            rack: format!("rack{n}"),
            tokens: tokens.iter().map(|&t| Token(t)).collect(),
            state,
        }
    }

    fn ring(nodes: Vec<Node>) -> Arc<TokenMetadata> {
        Arc::new(TokenMetadata::new(nodes).unwrap())
    }

    fn view() -> ClusterView {
        ClusterView::new(
            Uuid::from_u128(1),
            ([127, 0, 0, 1], 9042).into(),
            TokenMetadata::new(vec![node(1, NodeState::Normal, &[0])]).unwrap(),
        )
    }

    fn drain(rx: &mut broadcast::Receiver<NodeEvent>) -> Vec<NodeEvent> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    fn addr(n: u8) -> SocketAddr {
        ([127, 0, 0, n], 9042).into()
    }

    #[test]
    fn a_node_is_announced_once_when_it_becomes_normal() {
        let v = view();
        let mut rx = v.subscribe();
        let joining = ring(vec![
            node(1, NodeState::Normal, &[0]),
            node(2, NodeState::Joining, &[100]),
        ]);
        assert_eq!(v.set_ring(joining), 0, "a joining node is not announced");
        let normal = ring(vec![
            node(1, NodeState::Normal, &[0]),
            node(2, NodeState::Normal, &[100]),
        ]);
        assert_eq!(v.set_ring(normal.clone()), 1);
        assert_eq!(v.set_ring(normal), 0, "the same ring again sends nothing");
        assert_eq!(
            drain(&mut rx),
            vec![NodeEvent::Topology(TopologyChange::NewNode(addr(2)))]
        );
        assert_eq!(v.ring().nodes().len(), 2);
    }

    #[test]
    fn leaving_stays_announced_and_leaving_the_ring_removes() {
        let v = view();
        let mut rx = v.subscribe();
        v.set_ring(ring(vec![
            node(1, NodeState::Normal, &[0]),
            node(2, NodeState::Normal, &[100]),
            node(3, NodeState::Normal, &[200]),
        ]));
        v.set_ring(ring(vec![
            node(1, NodeState::Normal, &[0]),
            node(2, NodeState::Leaving, &[100]),
            node(3, NodeState::Normal, &[200]),
        ]));
        v.set_ring(ring(vec![
            node(1, NodeState::Normal, &[0]),
            node(2, NodeState::Left, &[]),
        ]));
        assert_eq!(
            drain(&mut rx),
            vec![
                NodeEvent::Topology(TopologyChange::NewNode(addr(2))),
                NodeEvent::Topology(TopologyChange::NewNode(addr(3))),
                NodeEvent::Topology(TopologyChange::RemovedNode(addr(2))),
                NodeEvent::Topology(TopologyChange::RemovedNode(addr(3))),
            ]
        );
    }

    #[test]
    fn a_new_address_is_a_removal_and_an_addition() {
        let v = view();
        v.set_ring(ring(vec![
            node(1, NodeState::Normal, &[0]),
            node(2, NodeState::Normal, &[100]),
        ]));
        let mut rx = v.subscribe();
        let mut moved = node(2, NodeState::Normal, &[100]);
        moved.cql_address = addr(9);
        v.set_ring(ring(vec![node(1, NodeState::Normal, &[0]), moved]));
        assert_eq!(
            drain(&mut rx),
            vec![
                NodeEvent::Topology(TopologyChange::RemovedNode(addr(2))),
                NodeEvent::Topology(TopologyChange::NewNode(addr(9))),
            ]
        );
    }

    #[test]
    fn no_event_is_about_this_node_or_its_address() {
        let v = view();
        let mut rx = v.subscribe();
        let mut same_address = node(5, NodeState::Normal, &[500]);
        same_address.cql_address = addr(1);
        v.set_ring(ring(vec![
            node(1, NodeState::Normal, &[0, 7]),
            same_address,
        ]));
        assert!(
            v.set_node_up(Uuid::from_u128(5), false),
            "the verdict is recorded"
        );
        assert!(
            !v.set_node_up(Uuid::from_u128(1), false),
            "this node's own verdict is not"
        );
        assert!(drain(&mut rx).is_empty(), "but nothing is announced");
    }

    #[test]
    fn liveness_flips_are_reported_once() {
        let v = view();
        v.set_ring(ring(vec![
            node(1, NodeState::Normal, &[0]),
            node(2, NodeState::Normal, &[100]),
            node(3, NodeState::Joining, &[200]),
        ]));
        let mut rx = v.subscribe();
        let two = Uuid::from_u128(2);
        assert!(v.set_node_up(two, false));
        assert!(
            !v.set_node_up(two, false),
            "a repeated verdict changes nothing"
        );
        assert!(!v.is_up(two));
        assert!(v.set_node_up(two, true));
        assert!(v.set_node_up(Uuid::from_u128(3), false), "recorded");
        assert!(
            !v.set_node_up(Uuid::from_u128(77), false),
            "not in the ring"
        );
        assert_eq!(
            drain(&mut rx),
            vec![
                NodeEvent::Status(StatusChange::Down(addr(2))),
                NodeEvent::Status(StatusChange::Up(addr(2))),
            ],
            "a joining node's liveness is not announced"
        );
    }
}
