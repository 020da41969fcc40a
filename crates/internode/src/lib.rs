//! Node-to-node messaging: a framed protocol over TCP with one connection per (peer, class),
//! queues bounded in bytes that fail at once, a time budget in every frame, and a ping failure
//! detector on the Control class.
//!
//! Peers are identified by their internode `SocketAddr` and a `u128` host id; bodies are opaque
//! bytes tagged with a `u16` verb. A coordinator calls replicas like this:
//!
//! ```no_run
//! # async fn example(replica: std::net::SocketAddr) -> std::io::Result<()> {
//! use std::time::{Duration, Instant};
//! use bytes::Bytes;
//! use sluice_internode::{ConnectionClass, Messenger, MessengerConfig};
//!
//! let messenger = Messenger::bind(MessengerConfig::new("Test Cluster", 1, "127.0.0.1:7000".parse().unwrap())).await?;
//! let deadline = Instant::now() + Duration::from_secs(2);
//! let reply = messenger.call(replica, ConnectionClass::Requests, 100, Bytes::from_static(b"read"), deadline).await;
//! # let _ = reply; Ok(()) }
//! ```

mod budget;
pub mod class;
pub mod failure;
pub mod frame;
pub mod handshake;
mod messenger;
mod metrics;

pub use class::ConnectionClass;
pub use failure::{FailureDetector, FailureDetectorConfig, Liveness, LivenessChange};
pub use frame::Status;
pub use messenger::{
    CallError, InboundMessage, InboundQueue, Messenger, MessengerConfig, FIRST_APPLICATION_VERB,
    VERB_PING,
};
pub use metrics::{ClassMetrics, MetricsSnapshot};
