//! The cluster layer, where the coordinator will live: it joins the metadata group
//! (`sluice-meta`), node-to-node messaging (`sluice-internode`) and replica placement
//! (`sluice-ring`).
//!
//! Today it carries the metadata group's Raft messages over internode connections
//! ([`RaftTransport`] sends them and [`serve_raft`] answers them, on the Control class), keeps
//! the cluster's topology in that group ([`Topology`], published as a ring), and starts a node
//! into the cluster ([`ClusterNode`]: a new cluster, a join through seeds, or a restart).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use sluice_cluster::{serve_raft, PeerDirectory, RaftTransport};
//! use sluice_internode::{ConnectionClass, Messenger, MessengerConfig};
//! use sluice_meta::{Apply, MetaConfig, MetaError, MetaNode};
//! # #[derive(Default)] struct App;
//! # impl Apply for App {
//! #     fn apply(&mut self, _: u64, _: &[u8]) -> Vec<u8> { Vec::new() }
//! #     fn snapshot(&self) -> Vec<u8> { Vec::new() }
//! #     fn restore(&mut self, _: &[u8]) -> Result<(), MetaError> { Ok(()) }
//! # }
//!
//! let listen = "127.0.0.1:7000".parse()?;
//! let messenger = Arc::new(Messenger::bind(MessengerConfig::new("Test Cluster", 1, listen)).await?);
//! let directory = Arc::new(PeerDirectory::new());
//! directory.insert(1, listen);
//! let transport = RaftTransport::new(Arc::clone(&messenger), Arc::clone(&directory));
//! let config = MetaConfig::new(1, &listen.to_string(), "/tmp/node1/meta");
//! let node = MetaNode::open(config, App, transport).await?;
//! let queue = messenger.take_inbound(ConnectionClass::Control).expect("not taken yet");
//! let service = serve_raft(queue, node.rpc_handler());
//! node.initialize(&[(1, listen.to_string())]).await?;
//! # drop(service); Ok(()) }
//! ```

pub mod control;
pub mod lifecycle;
pub mod node;
pub mod raft_transport;
pub mod replica;
pub mod schema;
pub mod state;
pub mod streaming;
pub mod topology;
pub mod txn_log;
pub mod verbs;

pub use control::{serve_control, ControlHandler, ControlVerb};
pub use lifecycle::{ask_node, AdminReply, AdminRequest, Lifecycle, NodeStatus, StreamTotals};
pub use node::{raft_node_id, ClusterConfig, ClusterMeta, ClusterNode, SchemaClient, StartError};
pub use raft_transport::{serve_raft, PeerDirectory, RaftTransport, MAX_RAFT_HANDLERS};
pub use schema::{SchemaCommand, SchemaEdit, SchemaError, SchemaFollower, SchemaResponse};
pub use state::ClusterState;
pub use streaming::{LocalData, StreamChunk, StreamStats, StreamTable};
pub use topology::{Topology, TopologyCommand, TopologyError, TopologyResponse, TopologyWatch};
pub use txn_log::{
    PartitionRef, TxnBatch, TxnCommit, TxnFollower, TxnOutcome, TxnProposal, TxnResponse,
};
