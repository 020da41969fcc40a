//! A node as the ring sees it: identity, addresses, location and tokens.

use crate::token::Token;
use std::net::SocketAddr;
use uuid::Uuid;

/// Where a node is in its life in the cluster. Liveness (up or down) is separate: a node is
/// `Normal` while it is down, and keeps its tokens (see [`crate::Liveness`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeState {
    /// Has tokens but is still receiving its data; not yet a natural replica.
    Joining,
    /// Owns its ranges and serves them.
    Normal,
    /// Being decommissioned; still a natural replica until it has streamed its ranges away.
    Leaving,
    /// Gone; its tokens belong to nobody.
    Left,
}

impl NodeState {
    /// Whether the node's tokens take part in placement (Cassandra's normal token owners:
    /// a leaving node stays a natural replica, a joining one is only pending).
    pub fn owns_tokens(self) -> bool {
        matches!(self, NodeState::Normal | NodeState::Leaving)
    }

    /// The state's name as `nodetool status` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Joining => "JOINING",
            NodeState::Normal => "NORMAL",
            NodeState::Leaving => "LEAVING",
            NodeState::Left => "LEFT",
        }
    }
}

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Stable identity for the node's whole life (drivers key hosts by it).
    pub host_id: Uuid,
    /// The address and port clients connect to (never unspecified).
    pub cql_address: SocketAddr,
    /// The address and port of node-to-node messaging.
    pub internode_address: SocketAddr,
    /// Data center name.
    pub dc: String,
    /// Rack name.
    pub rack: String,
    /// The node's tokens, each ending one range it owns.
    pub tokens: Vec<Token>,
    /// Life-cycle state.
    pub state: NodeState,
}

/// The position of a node in a [`crate::TokenMetadata`]'s node table: replica lists are
/// slices of these, so that a lookup copies nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeIndex(pub u16);

impl NodeIndex {
    /// The index as a `usize`, for indexing the node table.
    pub fn get(self) -> usize {
        usize::from(self.0)
    }
}
