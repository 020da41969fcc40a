//! `TokenMetadata`: the nodes of the cluster and the sorted ring of their tokens.

use crate::node::{Node, NodeIndex, NodeState};
use crate::token::Token;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use uuid::Uuid;

/// Most nodes one ring holds: node indexes are `u16`.
pub const MAX_NODES: usize = u16::MAX as usize;

/// Why a set of nodes does not make a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// Two nodes share a host id.
    DuplicateHostId,
    /// Two tokens are equal (tokens are unique cluster-wide).
    DuplicateToken(Token),
    /// A node was given the ring's minimum token, which no key hashes to.
    MinimumToken,
    /// A node that owns ranges (normal or leaving) has no tokens.
    OwnerWithoutTokens,
    /// More nodes than a node index can name.
    TooManyNodes,
}

impl RingError {
    /// The error's message.
    pub fn message(self) -> &'static str {
        match self {
            RingError::DuplicateHostId => "two nodes have the same host id",
            RingError::DuplicateToken(_) => "two nodes have the same token",
            RingError::MinimumToken => "no node may own the ring's minimum token -2^63",
            RingError::OwnerWithoutTokens => "a normal or leaving node has no tokens",
            RingError::TooManyNodes => "more than 65535 nodes",
        }
    }
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::DuplicateToken(t) => write!(f, "{} ({t})", self.message()),
            _ => f.write_str(self.message()),
        }
    }
}

impl std::error::Error for RingError {}

/// A data center as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DataCenter {
    name: String,
    /// Nodes of this DC that own tokens.
    owners: usize,
    /// Distinct racks among those nodes.
    racks: usize,
}

/// The ring: every node, and the sorted (token, owner) pairs of the nodes that own ranges.
/// Immutable: a topology change builds a new one.
#[derive(Debug, Clone)]
pub struct TokenMetadata {
    nodes: Vec<Node>,
    /// Sorted tokens of the owning nodes.
    tokens: Vec<Token>,
    /// `owners[i]` owns `(tokens[i - 1], tokens[i]]` (wrapping for i = 0).
    owners: Vec<NodeIndex>,
    dcs: Vec<DataCenter>,
    /// Per node: index into `dcs`.
    node_dc: Vec<u16>,
    /// Per node: a number for its (dc, rack) pair, unique across the cluster.
    node_rack: Vec<u32>,
}

impl TokenMetadata {
    /// Builds the ring of `nodes`. Only normal and leaving nodes own ranges (Cassandra's
    /// natural endpoints); joining and left nodes are listed but own nothing.
    pub fn new(nodes: Vec<Node>) -> Result<TokenMetadata, RingError> {
        if nodes.len() > MAX_NODES {
            return Err(RingError::TooManyNodes);
        }
        let mut ids = HashSet::with_capacity(nodes.len());
        if !nodes.iter().all(|n| ids.insert(n.host_id)) {
            return Err(RingError::DuplicateHostId);
        }
        let mut pairs: Vec<(Token, NodeIndex)> = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            if !n.state.owns_tokens() {
                continue;
            }
            if n.tokens.is_empty() {
                return Err(RingError::OwnerWithoutTokens);
            }
            for &t in &n.tokens {
                if t == Token::MIN {
                    return Err(RingError::MinimumToken);
                }
                pairs.push((t, NodeIndex(i as u16)));
            }
        }
        pairs.sort_unstable();
        if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(RingError::DuplicateToken(w[0].0));
        }

        let mut dc_index: BTreeMap<&str, u16> = BTreeMap::new();
        let mut rack_index: BTreeMap<(&str, &str), u32> = BTreeMap::new();
        let mut node_dc = Vec::with_capacity(nodes.len());
        let mut node_rack = Vec::with_capacity(nodes.len());
        for n in &nodes {
            let next_dc = dc_index.len() as u16;
            node_dc.push(*dc_index.entry(n.dc.as_str()).or_insert(next_dc));
            let next_rack = rack_index.len() as u32;
            node_rack.push(
                *rack_index
                    .entry((n.dc.as_str(), n.rack.as_str()))
                    .or_insert(next_rack),
            );
        }
        let mut dcs: Vec<DataCenter> = vec![
            DataCenter {
                name: String::new(),
                owners: 0,
                racks: 0,
            };
            dc_index.len()
        ];
        for (name, &i) in &dc_index {
            dcs[usize::from(i)].name = (*name).to_string();
        }
        let mut owning: BTreeSet<NodeIndex> = BTreeSet::new();
        owning.extend(pairs.iter().map(|p| p.1));
        let mut racks_seen: BTreeSet<u32> = BTreeSet::new();
        for idx in owning {
            let dc = &mut dcs[usize::from(node_dc[idx.get()])];
            dc.owners += 1;
            if racks_seen.insert(node_rack[idx.get()]) {
                dc.racks += 1;
            }
        }
        let (tokens, owners) = pairs.into_iter().unzip();
        Ok(TokenMetadata {
            nodes,
            tokens,
            owners,
            dcs,
            node_dc,
            node_rack,
        })
    }

    /// Every node, owning or not, in the order given to `new`.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// One node.
    pub fn node(&self, idx: NodeIndex) -> &Node {
        &self.nodes[idx.get()]
    }

    /// The index of the node with this host id.
    pub fn index_of(&self, host_id: Uuid) -> Option<NodeIndex> {
        self.nodes
            .iter()
            .position(|n| n.host_id == host_id)
            .map(|i| NodeIndex(i as u16))
    }

    /// Whether no node owns a range (then nothing can be placed).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The sorted tokens of the ring.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// The owners of the ring's tokens: `owners()[i]` owns `(tokens()[i - 1], tokens()[i]]`.
    pub fn owners(&self) -> &[NodeIndex] {
        &self.owners
    }

    /// The ring index of the first token >= `t`, wrapping to 0 past the last token: the
    /// range that holds `t`. The ring must not be empty.
    pub fn first_token_index(&self, t: Token) -> usize {
        debug_assert!(!self.tokens.is_empty(), "placement on an empty ring");
        let i = self.tokens.partition_point(|&x| x < t);
        if i == self.tokens.len() {
            0
        } else {
            i
        }
    }

    /// The primary owner of `t`: the owner of the first token >= `t`, wrapping.
    pub fn owner_of(&self, t: Token) -> Option<NodeIndex> {
        if self.tokens.is_empty() {
            return None;
        }
        Some(self.owners[self.first_token_index(t)])
    }

    /// The range `(start, end]` ending at ring index `i`.
    pub fn range_at(&self, i: usize) -> (Token, Token) {
        let prev = if i == 0 { self.tokens.len() - 1 } else { i - 1 };
        (self.tokens[prev], self.tokens[i])
    }

    /// The data center number of a node (DCs are numbered in order of first appearance).
    pub fn dc_of(&self, idx: NodeIndex) -> u16 {
        self.node_dc[idx.get()]
    }

    /// The number of a data center by name.
    pub fn dc_named(&self, name: &str) -> Option<u16> {
        self.dcs
            .iter()
            .position(|d| d.name == name)
            .map(|i| i as u16)
    }

    /// The number of data centers that have at least one node.
    pub fn dc_count(&self) -> usize {
        self.dcs.len()
    }

    /// A data center's name.
    pub fn dc_name(&self, dc: u16) -> &str {
        &self.dcs[usize::from(dc)].name
    }

    /// How many nodes of a data center own ranges.
    pub fn dc_owner_count(&self, dc: u16) -> usize {
        self.dcs[usize::from(dc)].owners
    }

    /// How many distinct racks the owning nodes of a data center are in.
    pub fn dc_rack_count(&self, dc: u16) -> usize {
        self.dcs[usize::from(dc)].racks
    }

    /// A number for the node's (dc, rack) pair, unique across the cluster.
    pub fn rack_of(&self, idx: NodeIndex) -> u32 {
        self.node_rack[idx.get()]
    }

    /// How many nodes own ranges.
    pub fn owner_count(&self) -> usize {
        self.dcs.iter().map(|d| d.owners).sum()
    }

    /// Whether some node is joining or leaving, so that writes also go to pending replicas.
    pub fn has_moves(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| matches!(n.state, NodeState::Joining | NodeState::Leaving))
    }

    /// The ring once every joining node is normal and every leaving node has left: where
    /// writes must already go while the nodes move (Cassandra's pending ranges). Node indexes
    /// are this ring's. `None` when no node moves, or when the settled nodes do not make a
    /// ring (a joining node without tokens stays joining).
    pub fn settled(&self) -> Option<TokenMetadata> {
        if !self.has_moves() {
            return None;
        }
        let nodes = self
            .nodes
            .iter()
            .map(|n| {
                let mut n = n.clone();
                n.state = match n.state {
                    NodeState::Joining if !n.tokens.is_empty() => NodeState::Normal,
                    NodeState::Leaving => NodeState::Left,
                    other => other,
                };
                n
            })
            .collect();
        let settled = TokenMetadata::new(nodes).ok()?;
        debug_assert_eq!(settled.nodes.len(), self.nodes.len(), "indexes are kept");
        Some(settled)
    }
}

/// Whether each node of a [`TokenMetadata`] is up, kept apart from the ring so that the
/// failure detector flips a flag without rebuilding placement.
#[derive(Debug)]
pub struct Liveness {
    up: Box<[AtomicBool]>,
}

impl Liveness {
    /// Flags for `nodes` nodes, all starting as `initially_up`.
    pub fn new(nodes: usize, initially_up: bool) -> Liveness {
        Liveness {
            up: (0..nodes).map(|_| AtomicBool::new(initially_up)).collect(),
        }
    }

    /// Whether the node is up.
    pub fn is_up(&self, idx: NodeIndex) -> bool {
        debug_assert!(idx.get() < self.up.len(), "node index out of the table");
        self.up
            .get(idx.get())
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// Marks the node up or down; returns whether that changed its state (for de-duplicated
    /// status events).
    pub fn set(&self, idx: NodeIndex, up: bool) -> bool {
        debug_assert!(idx.get() < self.up.len(), "node index out of the table");
        self.up
            .get(idx.get())
            .is_some_and(|f| f.swap(up, Ordering::Relaxed) != up)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A test node: host id from `n`, address 127.0.0.n.
    pub(crate) fn node(n: u8, dc: &str, rack: &str, tokens: &[i64]) -> Node {
        Node {
            host_id: Uuid::from_u128(u128::from(n) + 1),
            cql_address: ([127, 0, 0, n], 9042).into(),
            internode_address: ([127, 0, 0, n], 7000).into(),
            dc: dc.to_string(),
            rack: rack.to_string(),
            tokens: tokens.iter().map(|&t| Token(t)).collect(),
            state: NodeState::Normal,
        }
    }

    #[test]
    fn a_token_belongs_to_the_first_node_token_at_or_after_it() {
        let m = TokenMetadata::new(vec![
            node(1, "dc1", "r1", &[-100, 100]),
            node(2, "dc1", "r1", &[0]),
        ])
        .unwrap();
        let owner = |t| m.owner_of(Token(t)).unwrap().0;
        assert_eq!(owner(-100), 0, "a node owns its own token");
        assert_eq!(owner(-99), 1);
        assert_eq!(owner(0), 1);
        assert_eq!(owner(1), 0);
        assert_eq!(owner(100), 0);
        assert_eq!(owner(101), 0, "past the last token wraps to the first");
        assert_eq!(owner(i64::MIN), 0);
        assert_eq!(m.range_at(0), (Token(100), Token(-100)));
    }

    #[test]
    fn only_normal_and_leaving_nodes_own_ranges() {
        let mut joining = node(3, "dc1", "r2", &[50]);
        joining.state = NodeState::Joining;
        let mut leaving = node(2, "dc1", "r1", &[0]);
        leaving.state = NodeState::Leaving;
        let m = TokenMetadata::new(vec![node(1, "dc1", "r1", &[-100]), leaving, joining]).unwrap();
        assert_eq!(m.tokens(), &[Token(-100), Token(0)]);
        assert_eq!(m.dc_owner_count(0), 2);
        assert_eq!(m.dc_rack_count(0), 1);
        assert_eq!(m.nodes().len(), 3);
    }

    #[test]
    fn invalid_rings_are_rejected() {
        let dup = TokenMetadata::new(vec![node(1, "d", "r", &[5]), node(2, "d", "r", &[5])]);
        assert_eq!(dup.unwrap_err(), RingError::DuplicateToken(Token(5)));
        let same_id = TokenMetadata::new(vec![node(1, "d", "r", &[5]), node(1, "d", "r", &[6])]);
        assert_eq!(same_id.unwrap_err(), RingError::DuplicateHostId);
        let min = TokenMetadata::new(vec![node(1, "d", "r", &[i64::MIN])]);
        assert_eq!(min.unwrap_err(), RingError::MinimumToken);
        let none = TokenMetadata::new(vec![node(1, "d", "r", &[])]);
        assert_eq!(none.unwrap_err(), RingError::OwnerWithoutTokens);
    }

    #[test]
    fn liveness_reports_changes_only() {
        let l = Liveness::new(2, false);
        assert!(!l.is_up(NodeIndex(1)));
        assert!(l.set(NodeIndex(1), true));
        assert!(!l.set(NodeIndex(1), true));
        assert!(l.is_up(NodeIndex(1)));
        assert!(!l.is_up(NodeIndex(0)));
    }
}
