//! The Sluice node: shard-per-core threads, the CQL listener, connections and the request
//! path from a frame header to an encoded answer.
//!
//! One request, and where it can be turned away: `listener.rs` accepts a socket and hands
//! it to a shard; `connection.rs` reads frames and hands each to the request pipeline
//! (`pipeline/`: admit, classify, check, execute, reply; see its module documentation).
//!
//! Each shard is an OS thread running a current-thread tokio runtime with a `LocalSet`, so
//! per-shard state lives in `Rc`/`RefCell` without locks; shards talk through bounded channels.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod admission;
pub mod budget;
pub mod clock;
pub mod connection;
pub mod events;
pub mod limiter;
pub mod listener;
pub mod login_limiter;
pub mod metrics;
pub mod pipeline;
pub mod read_ahead;
pub mod shard;
#[cfg(test)]
mod sim;
pub mod socket_wait;
pub mod supported;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use shard::Server;
pub use sluice_overload::AdmissionConfig;

/// ScyllaDB's `SCYLLA_SHARDING_IGNORE_MSB`: drivers, shards and stores agree on it.
pub const IGNORE_MSB: u8 = sluice_types::token::SHARDING_IGNORE_MSB;

/// Per-kind default deadlines, used when a statement has no `USING TIMEOUT`.
pub use sluice_overload::DeadlineDefaults;

/// Configuration of the node's network side.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// CQL listen address.
    pub listen: SocketAddr,
    /// ScyllaDB shard-aware port (same IP as `listen`), if enabled.
    pub shard_aware_port: Option<u16>,
    /// Number of shards (threads).
    pub shards: usize,
    /// Largest accepted frame body in bytes.
    pub max_frame_bytes: u32,
    /// Prometheus endpoint, if enabled.
    pub metrics_listen: Option<SocketAddr>,
    /// Default deadlines.
    pub timeouts: DeadlineDefaults,
    /// In-flight requests per connection before the socket stops being read. At least the
    /// admission queue's capacity: with less, one pipelined connection can never queue
    /// enough for admission to see a delay over its target, and the backlog waits unseen in
    /// the socket buffers instead of being turned away.
    pub max_inflight_per_connection: usize,
    /// In-flight requests per shard before its sockets stop being read.
    pub max_inflight_per_shard: usize,
    /// `system.local.host_id`, advertised as SCYLLA_HOST_ID.
    pub host_id: String,
    /// How long a shutdown waits for in-flight requests before closing connections.
    pub drain_timeout: Duration,
    /// Request bytes in flight per connection before the socket stops being read.
    pub max_inflight_bytes_per_connection: usize,
    /// Request bytes in flight per shard before its sockets stop being read.
    pub max_inflight_bytes_per_shard: usize,
    /// Delay-based admission (CoDel queue + adaptive concurrency limit) per shard;
    /// `None` turns it off (every request that passed backpressure executes at once).
    pub admission: Option<sluice_overload::AdmissionConfig>,
    /// TEST-ONLY: extra service time added to every admitted execution, to make "slow work"
    /// real in end-to-end overload tests. Always `None` in production.
    pub test_only_service_delay: Option<Duration>,
    /// The per-shard per-partition rate limiter's table (size, probes, cold start).
    pub rate_limiter: sluice_overload::RateLimiterConfig,
    /// How failed logins slow down their source address.
    pub login_limiter: login_limiter::LoginLimiterConfig,
    /// TLS of the CQL listeners (both ports), if on; a SIGHUP handler may reload it.
    pub tls: Option<Arc<tls::ReloadableTls>>,
}

impl ServerConfig {
    /// A configuration with the documented defaults on `listen`.
    pub fn new(listen: SocketAddr, shards: usize, host_id: String) -> ServerConfig {
        ServerConfig {
            listen,
            shard_aware_port: None,
            shards,
            max_frame_bytes: 16 << 20,
            metrics_listen: None,
            timeouts: DeadlineDefaults::default(),
            max_inflight_per_connection: 4096,
            max_inflight_per_shard: 8192,
            host_id,
            drain_timeout: Duration::from_secs(5),
            max_inflight_bytes_per_connection: 8 << 20,
            max_inflight_bytes_per_shard: 128 << 20,
            admission: Some(sluice_overload::AdmissionConfig::default()),
            test_only_service_delay: None,
            rate_limiter: sluice_overload::RateLimiterConfig::default(),
            login_limiter: login_limiter::LoginLimiterConfig::default(),
            tls: None,
        }
    }
}

/// What the node shares between shards.
pub(crate) type SharedMetrics = Arc<Vec<Arc<metrics::ShardMetrics>>>;
