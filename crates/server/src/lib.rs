//! The Sluice node: shard-per-core threads, the CQL listener, connections and the request
//! path from a frame header to an encoded answer.
//!
//! One request, and where it can be turned away (DESIGN.md, "Architecture"):
//!
//! ```text
//! listener.rs  accept, hand the socket to a shard (round-robin, or source port % N)
//! connection.rs  read, FrameDecoder, in-flight caps (budget.rs), [A] admission.rs (from
//!             the header); an EXECUTE that may run now passes [C] and [B] right there
//!             (request::precheck_in_reader), so one turned away never becomes a task
//! request.rs  decode body, statement cache, deadline [C], route, [B] limiter.rs hook,
//!             forward to the owning shard (shard.rs) if needed, engine execute, answer
//! ```
//!
//! Each shard is an OS thread running a current-thread tokio runtime with a `LocalSet`, so
//! per-shard state lives in `Rc`/`RefCell` without locks; shards talk through bounded channels.

pub mod admission;
pub mod budget;
pub mod connection;
pub mod events;
pub mod limiter;
pub mod listener;
pub mod metrics;
pub mod request;
pub mod shard;
pub mod socket_wait;
pub mod supported;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use shard::Server;
pub use sluice_overload::AdmissionConfig;

/// ScyllaDB's `SCYLLA_SHARDING_IGNORE_MSB`: drivers, shards and stores agree on it.
pub const IGNORE_MSB: u8 = sluice_types::token::SHARDING_IGNORE_MSB;

/// Per-kind default deadlines, used when a statement has no `USING TIMEOUT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Single-partition reads.
    pub read: Duration,
    /// Writes.
    pub write: Duration,
    /// Range reads and scans.
    pub range: Duration,
    /// Everything else (DDL, system tables, USE).
    pub other: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            read: Duration::from_secs(5),
            write: Duration::from_secs(2),
            range: Duration::from_secs(10),
            other: Duration::from_secs(10),
        }
    }
}

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
    pub timeouts: Timeouts,
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
    /// [A] delay-based admission (CoDel queue + adaptive concurrency limit) per shard;
    /// `None` turns it off (every request that passed backpressure executes at once).
    pub admission: Option<sluice_overload::AdmissionConfig>,
    /// TEST-ONLY: extra service time added to every admitted execution, to make "slow work"
    /// real in end-to-end overload tests. Always `None` in production.
    pub test_only_service_delay: Option<Duration>,
    /// [B] per-shard per-partition rate limiter table (size, probes, cold start).
    pub rate_limiter: sluice_overload::RateLimiterConfig,
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
            timeouts: Timeouts::default(),
            max_inflight_per_connection: 4096,
            max_inflight_per_shard: 8192,
            host_id,
            drain_timeout: Duration::from_secs(5),
            max_inflight_bytes_per_connection: 8 << 20,
            max_inflight_bytes_per_shard: 128 << 20,
            admission: Some(sluice_overload::AdmissionConfig::default()),
            test_only_service_delay: None,
            rate_limiter: sluice_overload::RateLimiterConfig::default(),
        }
    }
}

/// What the node shares between shards.
pub(crate) type SharedMetrics = Arc<Vec<Arc<metrics::ShardMetrics>>>;
