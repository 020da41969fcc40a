//! The token ring of a Sluice cluster: the nodes and their tokens, replica placement exactly
//! as Cassandra computes it (SimpleStrategy and NetworkTopologyStrategy, with vnodes), a
//! per-keyspace replica map for the request path, and token allocation for joining nodes.
//!
//! This crate knows nothing of the server or the storage engine: the coordinator, the
//! metadata group and the system tables all build on it.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod allocation;
pub mod metadata;
pub mod node;
pub mod placement;
pub mod replication;
pub mod token;

pub use allocation::{allocate_tokens, primary_ownership, AllocationError};
pub use metadata::{Liveness, RingError, TokenMetadata};
pub use node::{Node, NodeIndex, NodeState};
pub use placement::{natural_replicas, pending_replicas, ReplicaMap};
pub use replication::{Replication, ReplicationError};
pub use token::Token;
