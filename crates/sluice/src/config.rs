//! `sluice serve` options: command-line flags, `SLUICE_*` environment variables and an
//! optional TOML file, merged as flags > env > file > defaults.
//!
//! Clap resolves flags and environment variables (both map to the same `Option` field), so
//! a `Some` from clap always wins over the file; the file wins over the built-in default.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default CQL listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9042";
/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = "./sluice-data";
/// Default metrics listen address.
pub const DEFAULT_METRICS: &str = "127.0.0.1:9180";
/// Default shard-aware port (ScyllaDB's).
pub const DEFAULT_SHARD_AWARE_PORT: u16 = 19042;
/// Default block cache of the storage engine.
pub const DEFAULT_CACHE_BYTES: u64 = 256 << 20;

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityArg {
    /// Acknowledge after fsync; concurrent writes share one fsync (group commit).
    Batch,
    /// Acknowledge once the journal is in the OS; fsync every `--periodic-sync-ms`.
    Periodic,
}

/// Who may connect (`--authenticator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthenticatorArg {
    /// Anyone who reaches the port (Cassandra's `AllowAllAuthenticator`).
    AllowAll,
    /// Roles with a password, over SASL PLAIN (`PasswordAuthenticator`).
    Password,
}

/// Whether permissions are checked (`--authorizer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthorizerArg {
    /// Every logged-in role may do everything (`AllowAllAuthorizer`).
    AllowAll,
    /// GRANTed permissions are checked (`CassandraAuthorizer`).
    Cassandra,
}

/// Options of `sluice serve`. Every option is also an environment variable and a key of the
/// `--config` TOML file (the key is the flag name with `_` for `-`, e.g. `data_dir`).
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML configuration file; its keys are the option names below with `_` for `-`
    /// (e.g. `listen = "0.0.0.0:9042"`, `data_dir = "/var/lib/sluice"`).
    #[arg(long, env = "SLUICE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Address of the CQL native-protocol listener [default: 127.0.0.1:9042].
    #[arg(long, env = "SLUICE_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Address of node-to-node messaging; peers connect to it, so it must be a concrete
    /// address [default: the --listen IP, port 7000].
    #[arg(long, env = "SLUICE_INTERNODE_LISTEN", value_name = "ADDR:PORT")]
    pub internode_listen: Option<SocketAddr>,

    /// Internode addresses of nodes to join through, comma-separated (HOST:PORT,...).
    /// Parsed and checked, but not used yet: joining a cluster is not implemented, and
    /// every node starts as a single-node cluster [default: none, a single-node cluster].
    #[arg(long, env = "SLUICE_SEEDS", value_name = "HOST:PORT,...")]
    pub seeds: Option<String>,

    /// Name of the cluster, shown in system.local; a node refuses to start with another
    /// name than the one its data directory was created with [default: Sluice Cluster].
    #[arg(long, env = "SLUICE_CLUSTER_NAME", value_name = "NAME")]
    pub cluster_name: Option<String>,

    /// Data center of this node (fixed once the data directory exists) [default: datacenter1].
    #[arg(long, env = "SLUICE_DC", value_name = "NAME")]
    pub dc: Option<String>,

    /// Rack of this node (fixed once the data directory exists) [default: rack1].
    #[arg(long, env = "SLUICE_RACK", value_name = "NAME")]
    pub rack: Option<String>,

    /// Tokens (vnodes) of this node, 1 to 1024, chosen when its data directory is created
    /// and kept after [default: 16].
    #[arg(long, env = "SLUICE_NUM_TOKENS", value_name = "N")]
    pub num_tokens: Option<usize>,

    /// Directory of the data files (created if missing) [default: ./sluice-data].
    #[arg(long, env = "SLUICE_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Number of shards: threads, each owning its connections and a slice of the token ring
    /// [default: the number of cores].
    #[arg(long, env = "SLUICE_SHARDS", value_name = "N")]
    pub shards: Option<usize>,

    /// When writes are acknowledged: `batch` = after fsync, with group commit (safe);
    /// `periodic` = once the journal is in the OS (it survives a killed process; the journal is
    /// written before the socket write of the answer), fsync every --periodic-sync-ms
    /// (Cassandra's default) [default: batch].
    #[arg(long, env = "SLUICE_DURABILITY", value_enum)]
    pub durability: Option<DurabilityArg>,

    /// Interval between fsyncs in periodic durability mode, in ms; in between, the journal's
    /// writeback is started every 100 ms [default: 10000].
    #[arg(long, env = "SLUICE_PERIODIC_SYNC_MS", value_name = "MS")]
    pub periodic_sync_ms: Option<u64>,

    /// Most tombstones (deleted or expired rows, deleted partitions) one read may step over;
    /// past it the read fails with Read_failure, as Cassandra's tombstone_failure_threshold
    /// [default: 100000].
    #[arg(long, env = "SLUICE_TOMBSTONE_FAILURE_THRESHOLD", value_name = "N")]
    pub tombstone_failure_threshold: Option<usize>,

    /// Largest accepted frame (e.g. 16MiB, 256KiB, 1048576); larger frames get a protocol
    /// error and the connection is closed [default: 16MiB].
    #[arg(long, env = "SLUICE_MAX_FRAME_BYTES", value_name = "SIZE")]
    pub max_frame_bytes: Option<String>,

    /// Block cache of the storage engine, shared out among the stores (e.g. 256MiB)
    /// [default: 256MiB].
    #[arg(long, env = "SLUICE_CACHE_BYTES", value_name = "SIZE")]
    pub cache_bytes: Option<String>,

    /// Largest cell value a write may store (e.g. 10MiB); a bigger one is answered Invalid
    /// naming the limit. At most max-frame-bytes and max-mutation-bytes
    /// [default: 16MiB, or max-frame-bytes if smaller].
    #[arg(long, env = "SLUICE_MAX_VALUE_BYTES", value_name = "SIZE")]
    pub max_value_bytes: Option<String>,

    /// Largest mutation of one partition (a statement, or a batch's changes to one
    /// partition), as Cassandra's max_mutation_size; a bigger one is answered Invalid naming
    /// the limit [default: 16MiB].
    #[arg(long, env = "SLUICE_MAX_MUTATION_BYTES", value_name = "SIZE")]
    pub max_mutation_bytes: Option<String>,

    /// Largest partition (e.g. 100MiB): a write that would take a partition over it is
    /// answered Invalid naming the limit. Estimated per partition from the bytes written to
    /// it since start (or since it was deleted whole), overwrites included; 0 disables it
    /// [default: 0].
    #[arg(long, env = "SLUICE_MAX_PARTITION_BYTES", value_name = "SIZE")]
    pub max_partition_bytes: Option<String>,

    /// Free space the data directory's file system must keep: below it writes are answered
    /// Server_error ("No space left on device ...") while reads go on, until space is freed;
    /// 0 disables the guard [default: 1GiB].
    #[arg(long, env = "SLUICE_MIN_FREE_DISK_BYTES", value_name = "SIZE")]
    pub min_free_disk_bytes: Option<String>,

    /// ScyllaDB shard-aware port: a connection from source port p is served by shard
    /// p % shards, and drivers are told so in SUPPORTED; `off` disables it [default: 19042].
    #[arg(long, env = "SLUICE_SHARD_AWARE_PORT", value_name = "PORT|off")]
    pub shard_aware_port: Option<String>,

    /// Address of the Prometheus `/metrics` endpoint; `off` disables it [default: 127.0.0.1:9180].
    #[arg(long, env = "SLUICE_METRICS_LISTEN", value_name = "ADDR|off")]
    pub metrics_listen: Option<String>,

    /// Server-side deadline of single-partition reads without USING TIMEOUT (e.g. 5s, 500ms)
    /// [default: 5s].
    #[arg(long, env = "SLUICE_READ_TIMEOUT", value_name = "DURATION")]
    pub read_timeout: Option<String>,

    /// Server-side deadline of writes without USING TIMEOUT [default: 2s].
    #[arg(long, env = "SLUICE_WRITE_TIMEOUT", value_name = "DURATION")]
    pub write_timeout: Option<String>,

    /// Server-side deadline of range reads (scans, multi-partition) [default: 10s].
    #[arg(long, env = "SLUICE_RANGE_TIMEOUT", value_name = "DURATION")]
    pub range_timeout: Option<String>,

    /// Server-side deadline of everything else (DDL, system tables) [default: 10s].
    #[arg(long, env = "SLUICE_OTHER_TIMEOUT", value_name = "DURATION")]
    pub other_timeout: Option<String>,

    /// Maximum requests in flight per connection; the socket is not read while over it
    /// [default: 4096, the admission queue's size: a lower cap keeps the queue that
    /// admission sees short of its delay target while the backlog grows unseen].
    #[arg(long, env = "SLUICE_MAX_INFLIGHT_PER_CONNECTION", value_name = "N")]
    pub max_inflight_per_connection: Option<usize>,

    /// Maximum requests in flight per shard, all connections together [default: 8192].
    #[arg(long, env = "SLUICE_MAX_INFLIGHT_PER_SHARD", value_name = "N")]
    pub max_inflight_per_shard: Option<usize>,

    /// Request bytes in flight per connection; the socket is not read while over it
    /// [default: 8MiB].
    #[arg(
        long,
        env = "SLUICE_MAX_INFLIGHT_BYTES_PER_CONNECTION",
        value_name = "SIZE"
    )]
    pub max_inflight_bytes_per_connection: Option<String>,

    /// Request bytes in flight per shard, all connections together [default: 128MiB].
    #[arg(long, env = "SLUICE_MAX_INFLIGHT_BYTES_PER_SHARD", value_name = "SIZE")]
    pub max_inflight_bytes_per_shard: Option<String>,

    /// Counter slots of the per-partition rate limiter per shard, rounded up to a power of
    /// two between 16 and 16Mi (16 bytes each) [default: 65536].
    #[arg(long, env = "SLUICE_RATE_LIMITER_SLOTS", value_name = "N")]
    pub rate_limiter_slots: Option<usize>,

    /// Delay-based admission control per shard (CoDel queue + adaptive concurrency limit);
    /// `off` executes every request that passed backpressure at once [default: on].
    #[arg(long, env = "SLUICE_ADMISSION", value_name = "on|off")]
    pub admission: Option<String>,

    /// CoDel target: acceptable standing queue delay [default: 5ms].
    #[arg(long, env = "SLUICE_ADMISSION_TARGET", value_name = "DURATION")]
    pub admission_target: Option<String>,

    /// CoDel interval: the queue delay must stay above target this long before shedding
    /// starts; queued requests older than it are always shed [default: 100ms].
    #[arg(long, env = "SLUICE_ADMISSION_INTERVAL", value_name = "DURATION")]
    pub admission_interval: Option<String>,

    /// Bound of each shard's admission queue; arrivals beyond it get Overloaded
    /// [default: 4096].
    #[arg(long, env = "SLUICE_ADMISSION_QUEUE", value_name = "N")]
    pub admission_queue: Option<usize>,

    /// Lower bound of the adaptive limit on requests in execution per shard; the limit also
    /// never falls below what the shard dispatches in 500 us at its rate (measured every 5 ms
    /// when busy). It bounds the requests that wait while they execute (group commit,
    /// another shard): one that finishes in its connection's reader frees its place at once
    /// [default: 4].
    #[arg(long, env = "SLUICE_ADMISSION_MIN_CONCURRENCY", value_name = "N")]
    pub admission_min_concurrency: Option<u32>,

    /// Upper bound of the adaptive limit on requests in execution per shard [default: 1024].
    #[arg(long, env = "SLUICE_ADMISSION_MAX_CONCURRENCY", value_name = "N")]
    pub admission_max_concurrency: Option<u32>,

    /// Period of each shard's event-loop lag probe, whose lag admission counts as waiting
    /// before a request is read when the kernel gave no receive stamp, and as a standing
    /// delay when above the CoDel target; `off` disables it [default: 1ms].
    #[arg(long, env = "SLUICE_ADMISSION_LAG_PROBE", value_name = "DURATION|off")]
    pub admission_lag_probe: Option<String>,

    /// While overloaded, keep in the admission queue only what is dispatched within 750 us
    /// (or five dispatches at the measured rate if longer; at most half the target), turn
    /// away arrivals known to have waited longer than that already (in the kernel, behind
    /// the frames read before them), and answer them Overloaded from the header
    /// [default: on].
    #[arg(long, env = "SLUICE_ADMISSION_SHED_AT_ENQUEUE", value_name = "on|off")]
    pub admission_shed_at_enqueue: Option<String>,

    /// While overloaded, a connection or shard at its in-flight cap keeps reading and
    /// answers the excess Overloaded instead of pausing its socket [default: on].
    #[arg(long, env = "SLUICE_ADMISSION_REJECT_OVER_CAP", value_name = "on|off")]
    pub admission_reject_over_cap: Option<String>,

    /// Serve the bounded backlog of a connection that slows down when held back (a driver's
    /// window, a bulk loader) without `Overloaded`; only the excess of a connection whose
    /// backlog keeps growing (seen through the reader's bounded read-ahead) is turned away.
    /// Off by default: several open-loop connections that each grow slowly are held back,
    /// not shed, until they are seen pushing [default: off].
    #[arg(long, env = "SLUICE_ADMISSION_PACE_WINDOWS", value_name = "on|off")]
    pub admission_pace_windows: Option<String>,

    /// While overloaded, serve the newest queued request first (adaptive LIFO) [default: off].
    #[arg(long, env = "SLUICE_ADMISSION_LIFO", value_name = "on|off")]
    pub admission_lifo: Option<String>,

    /// With `--durability batch`, turn a write away Overloaded when it is expected to wait
    /// for its group fsync longer than two bare fsyncs plus this, and answer it with a
    /// timeout at once when that wait would pass its deadline; `off` lets every write join
    /// the fsync (see docs/decisions/2026-11-26-admission-sees-the-group-fsync.md before
    /// turning it on) [default: off].
    #[arg(
        long,
        env = "SLUICE_ADMISSION_GROUP_COMMIT_WAIT",
        value_name = "DURATION|off"
    )]
    pub admission_group_commit_wait: Option<String>,

    /// Let the kernel back the heap with transparent huge pages. Off, because zeroing a
    /// fresh 2 MiB page stalls the shard that touched it (6.5 ms measured on a virtual
    /// machine) just when load rises and the heap grows [default: off].
    #[arg(long, env = "SLUICE_TRANSPARENT_HUGE_PAGES", value_name = "on|off")]
    pub transparent_huge_pages: Option<String>,

    /// In a cluster, keep the writes a replica misses while it is down (in memory, bounded
    /// in bytes and age) and replay them when it is back, as Cassandra's
    /// `hinted_handoff_enabled` [default: on].
    #[arg(long, env = "SLUICE_HINTED_HANDOFF", value_name = "on|off")]
    pub hinted_handoff: Option<String>,

    /// TEST ONLY: service time added to every execution, to make slow work real in
    /// overload tests. Never set in production.
    #[arg(
        long,
        env = "SLUICE_TEST_ONLY_SERVICE_DELAY",
        value_name = "DURATION",
        hide = true
    )]
    pub test_only_service_delay: Option<String>,

    /// TEST ONLY: IP addresses of peers this node pretends to have (normal, same data center
    /// and rack, same CQL port, nothing listening), so that drivers' handling of a
    /// multi-node ring can be tested against one process. Never set in production.
    #[arg(
        long,
        env = "SLUICE_TEST_ONLY_FAKE_PEERS",
        value_name = "IP,...",
        value_delimiter = ',',
        hide = true
    )]
    pub test_only_fake_peers: Vec<IpAddr>,

    /// BENCHMARK ONLY: `on` makes every LWT hold a per-token lock stripe until its write is
    /// durable, as before conditions were checked inside the storage commit, to measure the
    /// convoy that caused [default: off].
    #[arg(
        long,
        env = "SLUICE_LWT_SERIALIZE_THROUGH_DURABILITY",
        value_name = "on|off",
        hide = true
    )]
    pub lwt_serialize_through_durability: Option<String>,

    /// BENCHMARK ONLY: `off` lets every multi-partition transaction run at once instead of
    /// waiting for the adaptive limit on outstanding transactions [default: on].
    #[arg(
        long,
        env = "SLUICE_TXN_ADAPTIVE_LIMIT",
        value_name = "on|off",
        hide = true
    )]
    pub txn_adaptive_limit: Option<String>,

    /// BENCHMARK ONLY: `on` converts and encodes a transaction's writes under its locks even
    /// when they need no read, to measure what preparing them before costs [default: off].
    #[arg(
        long,
        env = "SLUICE_TXN_PREPARE_UNDER_LOCK",
        value_name = "on|off",
        hide = true
    )]
    pub txn_prepare_under_lock: Option<String>,

    /// Log filter (error, warn, info, debug, trace, or a tracing directive such as
    /// `sluice_server=debug`); RUST_LOG is used when this is not given [default: info].
    #[arg(long, env = "SLUICE_LOG", value_name = "FILTER")]
    pub log: Option<String>,

    /// `password` makes clients log in with a role's name and password (the first start
    /// creates the superuser cassandra/cassandra; change its password) [default: allow-all].
    #[arg(long, env = "SLUICE_AUTHENTICATOR", value_enum)]
    pub authenticator: Option<AuthenticatorArg>,

    /// `cassandra` checks GRANTed permissions on every request; needs
    /// `--authenticator password` [default: allow-all].
    #[arg(long, env = "SLUICE_AUTHORIZER", value_enum)]
    pub authorizer: Option<AuthorizerArg>,

    /// bcrypt cost (log2 rounds, 4 to 31) of new password hashes [default: 10].
    #[arg(long, env = "SLUICE_AUTH_BCRYPT_COST", value_name = "N")]
    pub auth_bcrypt_cost: Option<u32>,

    /// PEM certificate chain of the CQL listener; with --tls-key, clients must use TLS.
    /// SIGHUP reloads the files.
    #[arg(long, env = "SLUICE_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "SLUICE_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificates; when given, clients must present a certificate they signed.
    #[arg(long, env = "SLUICE_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
}

/// The TOML file: the same keys as the flags (snake_case), all optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    internode_listen: Option<SocketAddr>,
    seeds: Option<toml::Value>,
    cluster_name: Option<String>,
    dc: Option<String>,
    rack: Option<String>,
    num_tokens: Option<usize>,
    data_dir: Option<PathBuf>,
    shards: Option<usize>,
    durability: Option<DurabilityArg>,
    periodic_sync_ms: Option<u64>,
    tombstone_failure_threshold: Option<usize>,
    max_frame_bytes: Option<toml::Value>,
    cache_bytes: Option<toml::Value>,
    max_value_bytes: Option<toml::Value>,
    max_mutation_bytes: Option<toml::Value>,
    max_partition_bytes: Option<toml::Value>,
    min_free_disk_bytes: Option<toml::Value>,
    shard_aware_port: Option<toml::Value>,
    metrics_listen: Option<String>,
    read_timeout: Option<String>,
    write_timeout: Option<String>,
    range_timeout: Option<String>,
    other_timeout: Option<String>,
    max_inflight_per_connection: Option<usize>,
    max_inflight_per_shard: Option<usize>,
    max_inflight_bytes_per_connection: Option<toml::Value>,
    max_inflight_bytes_per_shard: Option<toml::Value>,
    rate_limiter_slots: Option<usize>,
    admission: Option<String>,
    admission_target: Option<String>,
    admission_interval: Option<String>,
    admission_queue: Option<usize>,
    admission_min_concurrency: Option<u32>,
    admission_max_concurrency: Option<u32>,
    admission_lag_probe: Option<String>,
    admission_shed_at_enqueue: Option<String>,
    admission_reject_over_cap: Option<String>,
    admission_pace_windows: Option<String>,
    admission_lifo: Option<String>,
    admission_group_commit_wait: Option<String>,
    transparent_huge_pages: Option<String>,
    hinted_handoff: Option<String>,
    log: Option<String>,
    authenticator: Option<AuthenticatorArg>,
    authorizer: Option<AuthorizerArg>,
    auth_bcrypt_cost: Option<u32>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
}

/// The fully resolved configuration of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedConfig {
    /// CQL listen address.
    pub listen: SocketAddr,
    /// The node's place in a cluster.
    pub cluster: ClusterSettings,
    /// Data directory.
    pub data_dir: PathBuf,
    /// Shard count.
    pub shards: usize,
    /// Durability mode.
    pub durability: DurabilityArg,
    /// Periodic fsync interval.
    pub periodic_sync: Duration,
    /// Most tombstones one read may step over.
    pub tombstone_failure_threshold: usize,
    /// Maximum frame size in bytes.
    pub max_frame_bytes: usize,
    /// Block cache bytes.
    pub cache_bytes: u64,
    /// Largest cell value a write may store.
    pub max_value_bytes: usize,
    /// Largest mutation of one partition.
    pub max_mutation_bytes: usize,
    /// Largest partition, as estimated (0: no limit).
    pub max_partition_bytes: u64,
    /// Free space below which writes are refused (0: never).
    pub min_free_disk_bytes: u64,
    /// Shard-aware port, if enabled.
    pub shard_aware_port: Option<u16>,
    /// Metrics endpoint, if enabled.
    pub metrics_listen: Option<SocketAddr>,
    /// Default read deadline.
    pub read_timeout: Duration,
    /// Default write deadline.
    pub write_timeout: Duration,
    /// Default range deadline.
    pub range_timeout: Duration,
    /// Default deadline of other requests.
    pub other_timeout: Duration,
    /// Per-connection in-flight cap.
    pub max_inflight_per_connection: usize,
    /// Per-shard in-flight cap.
    pub max_inflight_per_shard: usize,
    /// Per-connection cap on request bytes in flight.
    pub max_inflight_bytes_per_connection: usize,
    /// Per-shard cap on request bytes in flight.
    pub max_inflight_bytes_per_shard: usize,
    /// Per-partition rate limiter slots per shard (a power of two).
    pub rate_limiter_slots: usize,
    /// Delay-based admission, if on.
    pub admission: Option<AdmissionSettings>,
    /// Transparent huge pages allowed for the process.
    pub transparent_huge_pages: bool,
    /// Hints for replicas that are down.
    pub hinted_handoff: bool,
    /// TEST ONLY: service time added to every execution.
    pub test_only_service_delay: Option<Duration>,
    /// TEST ONLY: addresses of pretended peers.
    pub test_only_fake_peers: Vec<IpAddr>,
    /// BENCHMARK ONLY: LWTs hold a lock stripe until durable (the old convoy).
    pub lwt_serialize_through_durability: bool,
    /// BENCHMARK ONLY: transactions wait for the adaptive limit (off: all run at once).
    pub txn_adaptive_limit: bool,
    /// BENCHMARK ONLY: transactions prepare their writes under the locks.
    pub txn_prepare_under_lock: bool,
    /// Log filter, if given (else RUST_LOG, else info).
    pub log: Option<String>,
    /// Authentication and authorization.
    pub auth: sluice_engine::auth::AuthConfig,
    /// TLS of the CQL listener, if on.
    pub tls: Option<sluice_server::tls::TlsFiles>,
}

/// Default internode port (Cassandra's storage port).
pub const DEFAULT_INTERNODE_PORT: u16 = 7000;
/// Default cluster name.
pub const DEFAULT_CLUSTER_NAME: &str = "Sluice Cluster";
/// Default data center.
pub const DEFAULT_DC: &str = "datacenter1";
/// Default rack.
pub const DEFAULT_RACK: &str = "rack1";
/// Default number of tokens per node (Cassandra 4.0+).
pub const DEFAULT_NUM_TOKENS: usize = 16;
/// Most seeds accepted.
const MAX_SEEDS: usize = 64;

/// Resolved cluster options (`--internode-listen`, `--seeds`, `--cluster-name`, `--dc`,
/// `--rack`, `--num-tokens`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// Address of node-to-node messaging.
    pub internode_listen: SocketAddr,
    /// Internode addresses of the seeds (empty: a single-node cluster).
    pub seeds: Vec<SocketAddr>,
    /// Cluster name.
    pub cluster_name: String,
    /// Data center.
    pub dc: String,
    /// Rack.
    pub rack: String,
    /// Tokens of a new node.
    pub num_tokens: usize,
}

/// Resolved admission-control constants (see the `--admission-*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionSettings {
    /// Event-loop lag probe period (`None`: off).
    pub lag_probe: Option<Duration>,
    /// Bound the queue and reject at enqueue while overloaded.
    pub shed_at_enqueue: bool,
    /// Reject over the in-flight caps while overloaded instead of pausing.
    pub reject_over_cap: bool,
    /// Adaptive LIFO while overloaded.
    pub lifo: bool,
    /// Serve windowed connections' backlogs; shed only connections that keep pushing.
    pub pace_windows: bool,
    /// CoDel target queue delay.
    pub target: Duration,
    /// CoDel interval.
    pub interval: Duration,
    /// Queue bound per shard.
    pub queue: usize,
    /// A write's longest expected wait for its group fsync beyond two bare fsyncs (zero: off).
    pub group_commit_wait: Duration,
    /// Concurrency limit bounds per shard.
    pub min_concurrency: u32,
    /// Upper bound of the concurrency limit.
    pub max_concurrency: u32,
}

impl ServeArgs {
    /// Merges flags/env (self) over the config file over the defaults.
    pub fn resolve(&self) -> Result<ResolvedConfig> {
        let file = match &self.config {
            Some(path) => load_file(path)?,
            None => FileConfig::default(),
        };
        let auth = self.resolve_auth(&file)?;
        let tls = self.resolve_tls(&file)?;
        let listen = self
            .listen
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid default"));
        let cluster = self.resolve_cluster(&file, listen)?;
        // The built-in defaults are the server's own, written once there.
        let server = sluice_server::ServerConfig::new(
            DEFAULT_LISTEN.parse().expect("valid default"),
            1,
            String::new(),
        );
        let admission_defaults = sluice_server::AdmissionConfig::default();
        let shards = self
            .shards
            .or(file.shards)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        if shards == 0 || shards > 256 {
            bail!("shards must be between 1 and 256, got {shards}");
        }
        let max_frame_bytes = match (&self.max_frame_bytes, &file.max_frame_bytes) {
            (Some(s), _) => parse_size(s)?,
            (None, Some(v)) => parse_size(&toml_scalar(v))?,
            (None, None) => server.max_frame_bytes as usize,
        };
        if !(1024..=256 << 20).contains(&max_frame_bytes) {
            bail!("max-frame-bytes must be between 1KiB and 256MiB, got {max_frame_bytes}");
        }
        let size = |flag: &Option<String>, file: &Option<toml::Value>| -> Result<Option<usize>> {
            match (flag, file) {
                (Some(s), _) => parse_size(s).map(Some),
                (None, Some(v)) => parse_size(&toml_scalar(v)).map(Some),
                (None, None) => Ok(None),
            }
        };
        let max_mutation_bytes = size(&self.max_mutation_bytes, &file.max_mutation_bytes)?
            .unwrap_or(sluice_storage::DEFAULT_MAX_MUTATION_BYTES);
        let max_value_bytes = match size(&self.max_value_bytes, &file.max_value_bytes)? {
            Some(n) => n,
            None => sluice_storage::DEFAULT_MAX_VALUE_BYTES.min(max_frame_bytes),
        };
        if max_value_bytes == 0 || max_mutation_bytes == 0 {
            bail!("max-value-bytes and max-mutation-bytes must be positive");
        }
        if max_value_bytes > max_frame_bytes {
            bail!(
                "max-value-bytes ({max_value_bytes}) is above max-frame-bytes \
                 ({max_frame_bytes}): no request could carry such a value; lower \
                 max-value-bytes or raise max-frame-bytes"
            );
        }
        if max_value_bytes > max_mutation_bytes {
            bail!(
                "max-value-bytes ({max_value_bytes}) is above max-mutation-bytes \
                 ({max_mutation_bytes}): a write holding such a value would be refused; lower \
                 max-value-bytes or raise max-mutation-bytes"
            );
        }
        let max_partition_bytes =
            size(&self.max_partition_bytes, &file.max_partition_bytes)?.map_or(0, |n| n as u64);
        if max_partition_bytes != 0 && max_partition_bytes < max_mutation_bytes as u64 {
            bail!(
                "max-partition-bytes ({max_partition_bytes}) is below max-mutation-bytes \
                 ({max_mutation_bytes}): lower max-mutation-bytes, or raise \
                 max-partition-bytes (0 disables it)"
            );
        }
        let cache_bytes =
            size(&self.cache_bytes, &file.cache_bytes)?.map_or(DEFAULT_CACHE_BYTES, |n| n as u64);
        if cache_bytes < 1 << 20 {
            bail!("cache-bytes must be at least 1MiB, got {cache_bytes}");
        }
        let min_free_disk_bytes = size(&self.min_free_disk_bytes, &file.min_free_disk_bytes)?
            .map_or(sluice_storage::DEFAULT_MIN_FREE_DISK_BYTES, |n| n as u64);
        let shard_aware_port = match (&self.shard_aware_port, &file.shard_aware_port) {
            (Some(s), _) => parse_port_or_off(s)?,
            (None, Some(v)) => parse_port_or_off(&toml_scalar(v))?,
            (None, None) => Some(DEFAULT_SHARD_AWARE_PORT),
        };
        let metrics = self
            .metrics_listen
            .clone()
            .or(file.metrics_listen)
            .unwrap_or_else(|| DEFAULT_METRICS.to_string());
        let metrics_listen = if metrics.eq_ignore_ascii_case("off") {
            None
        } else {
            Some(
                metrics
                    .parse()
                    .with_context(|| format!("invalid metrics-listen address {metrics:?}"))?,
            )
        };
        let duration = |flag: &Option<String>, file: Option<String>, default: Duration| match flag
            .clone()
            .or(file)
        {
            Some(s) => parse_duration(&s),
            None => Ok(default),
        };
        let periodic_ms = self
            .periodic_sync_ms
            .or(file.periodic_sync_ms)
            .unwrap_or(10_000);
        if periodic_ms == 0 {
            bail!("periodic-sync-ms must be positive");
        }
        let tombstone_failure_threshold = self
            .tombstone_failure_threshold
            .or(file.tombstone_failure_threshold)
            .unwrap_or(sluice_storage::DEFAULT_TOMBSTONE_FAILURE_THRESHOLD);
        if tombstone_failure_threshold == 0 {
            bail!("tombstone-failure-threshold must be positive");
        }
        let per_conn = self
            .max_inflight_per_connection
            .or(file.max_inflight_per_connection)
            .unwrap_or(server.max_inflight_per_connection);
        let per_shard = self
            .max_inflight_per_shard
            .or(file.max_inflight_per_shard)
            .unwrap_or(server.max_inflight_per_shard);
        if per_conn == 0 || per_shard == 0 || per_conn > 32768 {
            bail!("in-flight caps must be positive (and at most 32768 per connection)");
        }
        let size = |flag: &Option<String>, file: &Option<toml::Value>, default: usize| {
            let n = match (flag, file) {
                (Some(s), _) => parse_size(s)?,
                (None, Some(v)) => parse_size(&toml_scalar(v))?,
                (None, None) => default,
            };
            if n < 1024 {
                bail!("in-flight byte caps must be at least 1KiB, got {n}");
            }
            Ok(n)
        };
        let bytes_per_conn = size(
            &self.max_inflight_bytes_per_connection,
            &file.max_inflight_bytes_per_connection,
            server.max_inflight_bytes_per_connection,
        )?;
        let bytes_per_shard = size(
            &self.max_inflight_bytes_per_shard,
            &file.max_inflight_bytes_per_shard,
            server.max_inflight_bytes_per_shard,
        )?;
        let rate_limiter_slots = self
            .rate_limiter_slots
            .or(file.rate_limiter_slots)
            .unwrap_or(1 << server.rate_limiter.table_bits);
        if !(16..=1 << 24).contains(&rate_limiter_slots) {
            bail!("rate-limiter-slots must be between 16 and 16777216, got {rate_limiter_slots}");
        }
        let rate_limiter_slots = rate_limiter_slots.next_power_of_two();
        let admission_on = match self.admission.clone().or(file.admission.clone()) {
            None => true,
            Some(s) if s.eq_ignore_ascii_case("on") => true,
            Some(s) if s.eq_ignore_ascii_case("off") => false,
            Some(s) => bail!("admission must be on or off, got {s:?}"),
        };
        let admission = if admission_on {
            let min = self
                .admission_min_concurrency
                .or(file.admission_min_concurrency)
                .unwrap_or(admission_defaults.concurrency.min);
            let max = self
                .admission_max_concurrency
                .or(file.admission_max_concurrency)
                .unwrap_or(admission_defaults.concurrency.max);
            let queue = self
                .admission_queue
                .or(file.admission_queue)
                .unwrap_or(admission_defaults.queue_capacity);
            if min == 0 || min > max || queue == 0 || queue > 1 << 20 {
                bail!(
                    "admission needs 0 < min-concurrency <= max-concurrency and 0 < queue <= 1Mi"
                );
            }
            let lag_probe = match self
                .admission_lag_probe
                .clone()
                .or(file.admission_lag_probe.clone())
            {
                None => Some(admission_defaults.lag_probe_interval),
                Some(s) if s.trim().eq_ignore_ascii_case("off") => None,
                Some(s) => Some(parse_duration(&s)?),
            };
            if lag_probe.is_some_and(|d| d < Duration::from_micros(100)) {
                bail!("admission-lag-probe must be at least 100us (or off)");
            }
            let group_commit_wait = match self
                .admission_group_commit_wait
                .clone()
                .or(file.admission_group_commit_wait.clone())
            {
                None => admission_defaults.group_commit_wait,
                Some(s) if s.trim().eq_ignore_ascii_case("off") => Duration::ZERO,
                Some(s) => parse_duration(&s)?,
            };
            Some(AdmissionSettings {
                lag_probe,
                shed_at_enqueue: on_off(
                    "admission-shed-at-enqueue",
                    &self.admission_shed_at_enqueue,
                    &file.admission_shed_at_enqueue,
                    admission_defaults.shed_at_enqueue,
                )?,
                reject_over_cap: on_off(
                    "admission-reject-over-cap",
                    &self.admission_reject_over_cap,
                    &file.admission_reject_over_cap,
                    admission_defaults.reject_over_cap,
                )?,
                pace_windows: on_off(
                    "admission-pace-windows",
                    &self.admission_pace_windows,
                    &file.admission_pace_windows,
                    admission_defaults.pace_windows,
                )?,
                lifo: on_off(
                    "admission-lifo",
                    &self.admission_lifo,
                    &file.admission_lifo,
                    admission_defaults.adaptive_lifo,
                )?,
                target: duration(
                    &self.admission_target,
                    file.admission_target.clone(),
                    admission_defaults.codel.target,
                )?,
                interval: duration(
                    &self.admission_interval,
                    file.admission_interval.clone(),
                    admission_defaults.codel.interval,
                )?,
                queue,
                group_commit_wait,
                min_concurrency: min,
                max_concurrency: max,
            })
        } else {
            None
        };
        check_limit_relations(
            LimitRelations {
                per_conn,
                per_shard,
                bytes_per_conn,
                bytes_per_shard,
            },
            admission.as_ref(),
        )?;
        let test_only_service_delay = match &self.test_only_service_delay {
            Some(s) => Some(parse_duration(s)?),
            None => None,
        };
        check_ports(listen, &cluster, shard_aware_port, metrics_listen)?;
        Ok(ResolvedConfig {
            listen,
            cluster,
            data_dir: self
                .data_dir
                .clone()
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            shards,
            durability: self
                .durability
                .or(file.durability)
                .unwrap_or(DurabilityArg::Batch),
            periodic_sync: Duration::from_millis(periodic_ms),
            tombstone_failure_threshold,
            max_frame_bytes,
            cache_bytes,
            max_value_bytes,
            max_mutation_bytes,
            max_partition_bytes,
            min_free_disk_bytes,
            shard_aware_port,
            metrics_listen,
            read_timeout: duration(&self.read_timeout, file.read_timeout, server.timeouts.read)?,
            write_timeout: duration(
                &self.write_timeout,
                file.write_timeout,
                server.timeouts.write,
            )?,
            range_timeout: duration(
                &self.range_timeout,
                file.range_timeout,
                server.timeouts.range,
            )?,
            other_timeout: duration(
                &self.other_timeout,
                file.other_timeout,
                server.timeouts.other,
            )?,
            max_inflight_per_connection: per_conn,
            max_inflight_per_shard: per_shard,
            max_inflight_bytes_per_connection: bytes_per_conn,
            max_inflight_bytes_per_shard: bytes_per_shard,
            rate_limiter_slots,
            admission,
            transparent_huge_pages: on_off(
                "transparent-huge-pages",
                &self.transparent_huge_pages,
                &file.transparent_huge_pages,
                false,
            )?,
            hinted_handoff: on_off(
                "hinted-handoff",
                &self.hinted_handoff,
                &file.hinted_handoff,
                true,
            )?,
            test_only_service_delay,
            test_only_fake_peers: self.test_only_fake_peers.clone(),
            lwt_serialize_through_durability: on_off(
                "lwt-serialize-through-durability",
                &self.lwt_serialize_through_durability,
                &None,
                false,
            )?,
            txn_adaptive_limit: on_off(
                "txn-adaptive-limit",
                &self.txn_adaptive_limit,
                &None,
                true,
            )?,
            txn_prepare_under_lock: on_off(
                "txn-prepare-under-lock",
                &self.txn_prepare_under_lock,
                &None,
                false,
            )?,
            log: self.log.clone().or(file.log),
            auth,
            tls,
        })
    }

    /// `--authenticator`, `--authorizer` and `--auth-bcrypt-cost`.
    fn resolve_auth(&self, file: &FileConfig) -> Result<sluice_engine::auth::AuthConfig> {
        use sluice_engine::auth::{AuthConfig, AuthenticatorKind, AuthorizerKind};
        let authenticator = match self.authenticator.or(file.authenticator) {
            None | Some(AuthenticatorArg::AllowAll) => AuthenticatorKind::AllowAll,
            Some(AuthenticatorArg::Password) => AuthenticatorKind::Password,
        };
        let authorizer = match self.authorizer.or(file.authorizer) {
            None | Some(AuthorizerArg::AllowAll) => AuthorizerKind::AllowAll,
            Some(AuthorizerArg::Cassandra) => AuthorizerKind::Cassandra,
        };
        if authorizer == AuthorizerKind::Cassandra && authenticator != AuthenticatorKind::Password {
            bail!("--authorizer cassandra needs --authenticator password (anonymous clients have no role to check)");
        }
        let bcrypt_cost = self
            .auth_bcrypt_cost
            .or(file.auth_bcrypt_cost)
            .unwrap_or(sluice_engine::auth::DEFAULT_BCRYPT_COST);
        if !(sluice_engine::auth::MIN_BCRYPT_COST..=31).contains(&bcrypt_cost) {
            bail!("auth-bcrypt-cost must be between 4 and 31, got {bcrypt_cost}");
        }
        Ok(AuthConfig {
            authenticator,
            authorizer,
            bcrypt_cost,
        })
    }

    /// `--internode-listen`, `--seeds`, `--cluster-name`, `--dc`, `--rack`, `--num-tokens`.
    fn resolve_cluster(&self, file: &FileConfig, listen: SocketAddr) -> Result<ClusterSettings> {
        let internode_listen = match self.internode_listen.or(file.internode_listen) {
            Some(a) if a.ip().is_unspecified() => {
                bail!("internode-listen must be a concrete address that peers can reach, got {a}")
            }
            Some(a) if a.port() == 0 => bail!("internode-listen needs a port, got {a}"),
            Some(a) => a,
            // Like the advertised CQL address: an unspecified listener is reached on loopback.
            None if listen.ip().is_unspecified() => {
                SocketAddr::from(([127, 0, 0, 1], DEFAULT_INTERNODE_PORT))
            }
            None => SocketAddr::new(listen.ip(), DEFAULT_INTERNODE_PORT),
        };
        let seeds = match (&self.seeds, &file.seeds) {
            (Some(s), _) => parse_seeds(s.split(','))?,
            (None, Some(toml::Value::Array(items))) => {
                let items: Vec<String> = items.iter().map(toml_scalar).collect();
                parse_seeds(items.iter().map(String::as_str))?
            }
            (None, Some(v)) => parse_seeds(toml_scalar(v).split(','))?,
            (None, None) => Vec::new(),
        };
        let name = |what: &str, flag: &Option<String>, file: &Option<String>, default: &str| {
            let v = flag.clone().or_else(|| file.clone());
            let v = v.unwrap_or_else(|| default.to_string());
            check_name(what, &v)?;
            Ok::<_, anyhow::Error>(v)
        };
        let num_tokens = self
            .num_tokens
            .or(file.num_tokens)
            .unwrap_or(DEFAULT_NUM_TOKENS);
        if !(1..=sluice_ring::allocation::MAX_TOKENS_PER_NODE).contains(&num_tokens) {
            bail!("num-tokens must be between 1 and 1024, got {num_tokens}");
        }
        Ok(ClusterSettings {
            internode_listen,
            seeds,
            cluster_name: name(
                "cluster-name",
                &self.cluster_name,
                &file.cluster_name,
                DEFAULT_CLUSTER_NAME,
            )?,
            dc: name("dc", &self.dc, &file.dc, DEFAULT_DC)?,
            rack: name("rack", &self.rack, &file.rack, DEFAULT_RACK)?,
            num_tokens,
        })
    }

    /// `--tls-cert`, `--tls-key` and `--tls-client-ca`: both of the first two, or neither.
    fn resolve_tls(&self, file: &FileConfig) -> Result<Option<sluice_server::tls::TlsFiles>> {
        let cert = self.tls_cert.clone().or_else(|| file.tls_cert.clone());
        let key = self.tls_key.clone().or_else(|| file.tls_key.clone());
        let client_ca = self
            .tls_client_ca
            .clone()
            .or_else(|| file.tls_client_ca.clone());
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(sluice_server::tls::TlsFiles {
                cert,
                key,
                client_ca,
            })),
            (None, None) if client_ca.is_none() => Ok(None),
            (None, None) => bail!("--tls-client-ca needs --tls-cert and --tls-key"),
            _ => bail!("--tls-cert and --tls-key go together"),
        }
    }
}

impl AdmissionSettings {
    /// The per-shard admission constants these settings stand for (the rest at their
    /// defaults; `slough = 2 × target`, `max_queue_delay = interval`).
    pub fn to_config(self) -> sluice_server::AdmissionConfig {
        let mut c = sluice_server::AdmissionConfig::default();
        c.codel.target = self.target;
        c.codel.interval = self.interval;
        c.codel.slough = self.target * 2;
        c.codel.max_queue_delay = self.interval;
        c.queue_capacity = self.queue;
        c.concurrency.min = self.min_concurrency;
        c.concurrency.max = self.max_concurrency;
        c.concurrency.initial = c
            .concurrency
            .initial
            .clamp(self.min_concurrency, self.max_concurrency);
        c.lag_probe_interval = self.lag_probe.unwrap_or(Duration::ZERO);
        c.shed_at_enqueue = self.shed_at_enqueue;
        c.reject_over_cap = self.reject_over_cap;
        c.pace_windows = self.pace_windows;
        c.adaptive_lifo = self.lifo;
        c.group_commit_wait = self.group_commit_wait;
        c
    }
}

/// The in-flight caps that [`check_limit_relations`] compares.
#[derive(Clone, Copy, Debug)]
struct LimitRelations {
    per_conn: usize,
    per_shard: usize,
    bytes_per_conn: usize,
    bytes_per_shard: usize,
}

/// Relations between limits that each look valid alone: a connection's cap above its
/// shard's would never apply, and a per-connection cap below the admission queue hides a
/// backlog in the socket where the queue's delay cannot see it. Checked at start-up so that
/// a bad combination fails with its reason instead of misbehaving under load.
fn check_limit_relations(
    caps: LimitRelations,
    admission: Option<&AdmissionSettings>,
) -> Result<()> {
    if caps.per_conn > caps.per_shard {
        bail!(
            "max-inflight-per-connection ({}) must not exceed max-inflight-per-shard ({}): \
             the shard's cap would stop a single connection first",
            caps.per_conn,
            caps.per_shard
        );
    }
    if caps.bytes_per_conn > caps.bytes_per_shard {
        bail!(
            "max-inflight-bytes-per-connection ({}) must not exceed \
             max-inflight-bytes-per-shard ({})",
            caps.bytes_per_conn,
            caps.bytes_per_shard
        );
    }
    if let Some(a) = admission {
        if caps.per_conn < a.queue {
            bail!(
                "max-inflight-per-connection ({}) must be at least admission-queue ({}): \
                 below it, a connection's backlog waits unread in its socket, unseen by \
                 admission; lower admission-queue or raise the cap",
                caps.per_conn,
                a.queue
            );
        }
        if a.target >= a.interval {
            bail!(
                "admission-target ({:?}) must be shorter than admission-interval ({:?}): \
                 a standing delay is one that outlasts a whole interval",
                a.target,
                a.interval
            );
        }
    }
    Ok(())
}

/// An `on`/`off` option: flag or env, else the file, else `default`.
fn on_off(name: &str, flag: &Option<String>, file: &Option<String>, default: bool) -> Result<bool> {
    match flag.as_ref().or(file.as_ref()) {
        None => Ok(default),
        Some(s) if s.trim().eq_ignore_ascii_case("on") => Ok(true),
        Some(s) if s.trim().eq_ignore_ascii_case("off") => Ok(false),
        Some(s) => bail!("{name} must be on or off, got {s:?}"),
    }
}

/// Parses seeds given as `HOST:PORT` (host names are resolved once, here).
fn parse_seeds<'a>(items: impl Iterator<Item = &'a str>) -> Result<Vec<SocketAddr>> {
    use std::net::ToSocketAddrs;
    let mut seeds = Vec::new();
    for item in items.map(str::trim) {
        if item.is_empty() {
            bail!("seeds: empty entry (expected HOST:PORT,HOST:PORT...)");
        }
        let addr = match item.parse::<SocketAddr>() {
            Ok(a) => a,
            Err(_) => item
                .to_socket_addrs()
                .with_context(|| format!("seeds: {item:?} is not HOST:PORT"))?
                .next()
                .with_context(|| format!("seeds: {item:?} resolves to no address"))?,
        };
        if addr.ip().is_unspecified() || addr.port() == 0 {
            bail!("seeds: {item:?} is not a reachable address");
        }
        if seeds.contains(&addr) {
            bail!("seeds: {item:?} is given twice");
        }
        seeds.push(addr);
    }
    if seeds.len() > MAX_SEEDS {
        bail!("seeds: at most {MAX_SEEDS} seeds, got {}", seeds.len());
    }
    Ok(seeds)
}

/// A cluster, data center or rack name: shown to drivers and compared on every start, so it
/// must be non-empty printable text without surrounding spaces.
fn check_name(what: &str, v: &str) -> Result<()> {
    if v.is_empty() || v.len() > 128 {
        bail!("{what} must be 1 to 128 bytes long, got {v:?}");
    }
    if v.trim() != v || v.chars().any(char::is_control) {
        bail!("{what} must not have control characters or surrounding spaces, got {v:?}");
    }
    Ok(())
}

/// The CQL, shard-aware, metrics and internode listeners must not share a port on one IP.
fn check_ports(
    listen: SocketAddr,
    cluster: &ClusterSettings,
    shard_aware_port: Option<u16>,
    metrics: Option<SocketAddr>,
) -> Result<()> {
    let internode = cluster.internode_listen;
    let clash = |ip: std::net::IpAddr, port: u16| {
        port == internode.port() && (ip == internode.ip() || ip.is_unspecified())
    };
    if clash(listen.ip(), listen.port()) {
        bail!("internode-listen ({internode}) must not use the CQL port of --listen ({listen})");
    }
    if shard_aware_port.is_some_and(|p| clash(listen.ip(), p)) {
        bail!("internode-listen ({internode}) must not use the shard-aware port");
    }
    if metrics.is_some_and(|m| clash(m.ip(), m.port())) {
        bail!("internode-listen ({internode}) must not use the metrics port");
    }
    Ok(())
}

fn load_file(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
}

/// A TOML scalar as text, so that `max_frame_bytes = 1048576` and `= "1MiB"` both work.
fn toml_scalar(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Parses `16MiB`, `256KiB`, `1GiB`, `10MB`, `1048576` into bytes.
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().with_context(|| format!("invalid size {s:?}"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => bail!("invalid size unit in {s:?} (use B, KiB, MiB, GiB, KB, MB, GB)"),
    };
    n.checked_mul(mult)
        .with_context(|| format!("size {s:?} is too large"))
}

/// Parses `5s`, `500ms`, `2m`, `100us`, or a bare number of milliseconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .with_context(|| format!("invalid duration {s:?}"))?;
    let d = match unit.trim() {
        "" | "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" | "min" => Duration::from_secs(n.saturating_mul(60)),
        "us" | "µs" => Duration::from_micros(n),
        _ => bail!("invalid duration unit in {s:?} (use us, ms, s, m)"),
    };
    if d.is_zero() {
        bail!("duration {s:?} must be positive");
    }
    Ok(d)
}

fn parse_port_or_off(s: &str) -> Result<Option<u16>> {
    if s.trim().eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let p: u16 = s
        .trim()
        .parse()
        .with_context(|| format!("invalid port {s:?} (a number, or off)"))?;
    if p == 0 {
        bail!("port 0 is not allowed; use off to disable");
    }
    Ok(Some(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse() {
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("256KiB").unwrap(), 256 << 10);
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("100").unwrap(), Duration::from_millis(100));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }

    #[test]
    fn defaults_apply_without_flags_or_file() {
        let c = ServeArgs::default().resolve().unwrap();
        assert_eq!(c.listen, "127.0.0.1:9042".parse().unwrap());
        assert_eq!(c.data_dir, PathBuf::from("./sluice-data"));
        assert_eq!(c.durability, DurabilityArg::Batch);
        assert_eq!(c.max_frame_bytes, 16 << 20);
        assert_eq!(c.shard_aware_port, Some(19042));
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9180".parse().unwrap()));
        assert_eq!(c.read_timeout, Duration::from_secs(5));
        assert_eq!(c.write_timeout, Duration::from_secs(2));
        assert_eq!(c.range_timeout, Duration::from_secs(10));
        assert_eq!(c.other_timeout, Duration::from_secs(10));
        assert!(c.shards >= 1);
        assert!(!c.transparent_huge_pages, "off unless asked for");
        assert!(c.hinted_handoff, "on unless turned off");
        assert_eq!(c.tombstone_failure_threshold, 100_000);
        assert_eq!(c.cache_bytes, 256 << 20);
        assert_eq!(c.max_value_bytes, 16 << 20);
        assert_eq!(c.max_mutation_bytes, 16 << 20);
        assert_eq!(
            c.max_partition_bytes, 0,
            "no partition limit unless asked for"
        );
        assert_eq!(c.min_free_disk_bytes, 1 << 30);
    }

    #[test]
    fn write_limits_come_from_flag_or_file_and_keep_their_relations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.toml");
        std::fs::write(
            &path,
            "max_value_bytes = \"1MiB\"\nmax_mutation_bytes = 4194304\nmin_free_disk_bytes = \"64MiB\"\nmax_partition_bytes = \"100MiB\"\n",
        )
        .unwrap();
        let c = ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(
            (
                c.max_value_bytes,
                c.max_mutation_bytes,
                c.min_free_disk_bytes,
                c.max_partition_bytes
            ),
            (1 << 20, 4 << 20, 64 << 20, 100 << 20)
        );
        // A partition limit below the mutation limit is refused, saying why.
        let e = ServeArgs {
            max_partition_bytes: Some("1MiB".into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(e.contains("below max-mutation-bytes"), "{e}");
        // A smaller frame lowers the default value limit with it.
        let small_frame = ServeArgs {
            max_frame_bytes: Some("1MiB".into()),
            ..ServeArgs::default()
        };
        assert_eq!(small_frame.resolve().unwrap().max_value_bytes, 1 << 20);
        // A value limit above the frame or the mutation limit is refused, saying why.
        let e = ServeArgs {
            max_value_bytes: Some("32MiB".into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(e.contains("above max-frame-bytes"), "{e}");
        let e = ServeArgs {
            max_frame_bytes: Some("64MiB".into()),
            max_value_bytes: Some("32MiB".into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(e.contains("above max-mutation-bytes"), "{e}");
        let ok = ServeArgs {
            max_frame_bytes: Some("64MiB".into()),
            max_value_bytes: Some("32MiB".into()),
            max_mutation_bytes: Some("48MiB".into()),
            min_free_disk_bytes: Some("0".into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(ok.min_free_disk_bytes, 0);
    }

    #[test]
    fn tombstone_failure_threshold_comes_from_flag_or_file_and_is_positive() {
        let dir = std::env::temp_dir().join(format!("sluice-cfg-tomb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sluice.toml");
        std::fs::write(&path, "tombstone_failure_threshold = 500\n").unwrap();
        let from_file = ServeArgs {
            config: Some(path.clone()),
            ..ServeArgs::default()
        };
        assert_eq!(
            from_file.resolve().unwrap().tombstone_failure_threshold,
            500
        );
        let flag = ServeArgs {
            tombstone_failure_threshold: Some(7),
            ..from_file.clone()
        };
        assert_eq!(flag.resolve().unwrap().tombstone_failure_threshold, 7);
        let zero = ServeArgs {
            tombstone_failure_threshold: Some(0),
            ..ServeArgs::default()
        };
        assert!(zero.resolve().is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn flags_win_over_file_and_file_over_defaults() {
        let dir = std::env::temp_dir().join(format!("sluice-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sluice.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:9999\"\nshards = 3\nmax_frame_bytes = \"1MiB\"\n\
             shard_aware_port = \"off\"\nmetrics_listen = \"off\"\nwrite_timeout = \"750ms\"\n\
             durability = \"periodic\"\ntransparent_huge_pages = \"on\"\nhinted_handoff = \"off\"\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(path.clone()),
            shards: Some(5),
            ..ServeArgs::default()
        };
        let c = args.resolve().unwrap();
        assert_eq!(c.listen, "127.0.0.1:9999".parse().unwrap());
        assert_eq!(c.shards, 5, "flag beats file");
        assert_eq!(c.max_frame_bytes, 1 << 20);
        assert_eq!(c.shard_aware_port, None);
        assert_eq!(c.metrics_listen, None);
        assert_eq!(c.write_timeout, Duration::from_millis(750));
        assert_eq!(c.durability, DurabilityArg::Periodic);
        assert!(c.transparent_huge_pages);
        assert!(!c.hinted_handoff);
        let flag_off = ServeArgs {
            transparent_huge_pages: Some("off".into()),
            ..args.clone()
        };
        assert!(
            !flag_off.resolve().unwrap().transparent_huge_pages,
            "flag beats file"
        );

        std::fs::write(&path, "no_such_key = 1\n").unwrap();
        assert!(args.resolve().is_err(), "unknown keys are rejected");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn admission_flags_resolve_with_documented_defaults() {
        let c = ServeArgs::default().resolve().unwrap();
        let a = c.admission.expect("admission is on by default");
        assert_eq!(a.target, Duration::from_millis(5));
        assert_eq!(a.interval, Duration::from_millis(100));
        assert_eq!(
            (a.queue, a.min_concurrency, a.max_concurrency),
            (4096, 4, 1024)
        );
        assert_eq!(c.max_inflight_per_connection, 4096);
        assert_eq!(c.max_inflight_bytes_per_connection, 8 << 20);
        assert_eq!(c.max_inflight_bytes_per_shard, 128 << 20);
        assert_eq!(c.test_only_service_delay, None);
        assert!(c.test_only_fake_peers.is_empty());
        assert!(!c.lwt_serialize_through_durability);
        assert!(c.txn_adaptive_limit);
        assert!(!c.txn_prepare_under_lock);
        assert_eq!(a.lag_probe, Some(Duration::from_millis(1)));
        assert!(a.shed_at_enqueue && a.reject_over_cap && !a.lifo && !a.pace_windows);
        let cfg = a.to_config();
        assert_eq!(cfg.lag_probe_interval, Duration::from_millis(1));
        assert!(cfg.shed_at_enqueue && cfg.reject_over_cap && !cfg.adaptive_lifo);
        assert_eq!(cfg.codel.slough, Duration::from_millis(10));
        assert_eq!(cfg.codel.max_queue_delay, Duration::from_millis(100));
        assert_eq!(cfg.group_commit_wait, Duration::ZERO, "off by default");
        let hidden_off = ServeArgs {
            admission_group_commit_wait: Some("off".into()),
            admission_lag_probe: Some("off".into()),
            admission_shed_at_enqueue: Some("OFF".into()),
            admission_reject_over_cap: Some("off".into()),
            admission_lifo: Some("on".into()),
            lwt_serialize_through_durability: Some("on".into()),
            txn_adaptive_limit: Some("off".into()),
            txn_prepare_under_lock: Some("on".into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert!(hidden_off.lwt_serialize_through_durability);
        assert!(!hidden_off.txn_adaptive_limit);
        assert!(hidden_off.txn_prepare_under_lock);
        let hidden_off = hidden_off.admission.unwrap();
        assert_eq!(hidden_off.lag_probe, None);
        assert!(!hidden_off.shed_at_enqueue && !hidden_off.reject_over_cap && hidden_off.lifo);
        let cfg = hidden_off.to_config();
        assert_eq!(
            cfg.lag_probe_interval,
            Duration::ZERO,
            "zero turns the probe off"
        );
        assert!(!cfg.shed_at_enqueue && !cfg.reject_over_cap && cfg.adaptive_lifo);
        assert_eq!(cfg.group_commit_wait, Duration::ZERO, "off turns it off");
        let probe = |s: &str| {
            ServeArgs {
                admission_lag_probe: Some(s.into()),
                ..ServeArgs::default()
            }
            .resolve()
            .map(|c| c.admission.and_then(|a| a.lag_probe))
        };
        assert_eq!(probe("2ms").unwrap(), Some(Duration::from_millis(2)));
        assert!(probe("10us").is_err(), "too short: the probe would spin");
        assert!(probe("soon").is_err());
        let off = ServeArgs {
            admission: Some("OFF".into()),
            ..ServeArgs::default()
        };
        assert_eq!(off.resolve().unwrap().admission, None);
        let tuned = ServeArgs {
            admission_target: Some("2ms".into()),
            admission_queue: Some(64),
            max_inflight_bytes_per_connection: Some("1MiB".into()),
            ..ServeArgs::default()
        };
        let t = tuned.resolve().unwrap();
        assert_eq!(t.admission.unwrap().target, Duration::from_millis(2));
        assert_eq!(t.admission.unwrap().queue, 64);
        assert_eq!(t.max_inflight_bytes_per_connection, 1 << 20);
        for bad in [
            ServeArgs {
                admission: Some("maybe".into()),
                ..ServeArgs::default()
            },
            ServeArgs {
                admission_min_concurrency: Some(8),
                admission_max_concurrency: Some(4),
                ..ServeArgs::default()
            },
            ServeArgs {
                admission_queue: Some(0),
                ..ServeArgs::default()
            },
            ServeArgs {
                max_inflight_bytes_per_shard: Some("10".into()),
                ..ServeArgs::default()
            },
            ServeArgs {
                admission_reject_over_cap: Some("sometimes".into()),
                ..ServeArgs::default()
            },
            ServeArgs {
                transparent_huge_pages: Some("yes".into()),
                ..ServeArgs::default()
            },
        ] {
            assert!(bad.resolve().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn relations_between_limits_are_checked_at_start_up() {
        let err = |args: ServeArgs| format!("{:#}", args.resolve().unwrap_err());
        let below_queue = ServeArgs {
            max_inflight_per_connection: Some(100),
            admission_queue: Some(200),
            ..ServeArgs::default()
        };
        assert!(err(below_queue).contains("must be at least admission-queue (200)"));
        let over_shard = ServeArgs {
            max_inflight_per_connection: Some(9000),
            max_inflight_per_shard: Some(8192),
            ..ServeArgs::default()
        };
        assert!(err(over_shard).contains("must not exceed max-inflight-per-shard (8192)"));
        let bytes = ServeArgs {
            max_inflight_bytes_per_connection: Some("2MiB".into()),
            max_inflight_bytes_per_shard: Some("1MiB".into()),
            ..ServeArgs::default()
        };
        assert!(err(bytes).contains("max-inflight-bytes-per-shard (1048576)"));
        let codel = ServeArgs {
            admission_target: Some("100ms".into()),
            admission_interval: Some("50ms".into()),
            ..ServeArgs::default()
        };
        assert!(err(codel).contains("admission-target"));
        // The same caps are fine once they agree, and admission off drops its relations.
        let agreeing = ServeArgs {
            max_inflight_per_connection: Some(100),
            admission_queue: Some(100),
            ..ServeArgs::default()
        };
        assert!(agreeing.resolve().is_ok());
        let off = ServeArgs {
            max_inflight_per_connection: Some(100),
            admission: Some("off".into()),
            ..ServeArgs::default()
        };
        assert!(off.resolve().is_ok());
    }

    #[test]
    fn invalid_values_are_rejected() {
        let bad_shards = ServeArgs {
            shards: Some(0),
            ..ServeArgs::default()
        };
        assert!(bad_shards.resolve().is_err());
        let bad_frame = ServeArgs {
            max_frame_bytes: Some("10".into()),
            ..ServeArgs::default()
        };
        assert!(bad_frame.resolve().is_err());
        let bad_port = ServeArgs {
            shard_aware_port: Some("0".into()),
            ..ServeArgs::default()
        };
        assert!(bad_port.resolve().is_err());
    }

    #[test]
    fn cluster_options_default_and_resolve_from_flags_and_file() {
        let c = ServeArgs::default().resolve().unwrap().cluster;
        assert_eq!(c.internode_listen, "127.0.0.1:7000".parse().unwrap());
        assert!(c.seeds.is_empty(), "no seeds: a single-node cluster");
        assert_eq!(c.cluster_name, "Sluice Cluster");
        assert_eq!((c.dc.as_str(), c.rack.as_str()), ("datacenter1", "rack1"));
        assert_eq!(c.num_tokens, 16);

        let on_ip = ServeArgs {
            listen: Some("127.0.0.2:9042".parse().unwrap()),
            ..ServeArgs::default()
        };
        let c = on_ip.resolve().unwrap().cluster;
        assert_eq!(
            c.internode_listen,
            "127.0.0.2:7000".parse().unwrap(),
            "the CQL IP"
        );

        let flags = ServeArgs {
            internode_listen: Some("127.0.0.3:7100".parse().unwrap()),
            seeds: Some("127.0.0.1:7000, 127.0.0.2:7000".into()),
            cluster_name: Some("Test".into()),
            dc: Some("dc2".into()),
            rack: Some("r9".into()),
            num_tokens: Some(4),
            ..ServeArgs::default()
        };
        let c = flags.resolve().unwrap().cluster;
        assert_eq!(c.internode_listen, "127.0.0.3:7100".parse().unwrap());
        assert_eq!(
            c.seeds,
            vec![
                "127.0.0.1:7000".parse::<SocketAddr>().unwrap(),
                "127.0.0.2:7000".parse().unwrap()
            ]
        );
        assert_eq!((c.cluster_name.as_str(), c.dc.as_str()), ("Test", "dc2"));
        assert_eq!((c.rack.as_str(), c.num_tokens), ("r9", 4));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.toml");
        std::fs::write(
            &path,
            "internode_listen = \"127.0.0.5:7001\"\nseeds = [\"127.0.0.1:7000\"]\n\
             cluster_name = \"From File\"\ndc = \"dcf\"\nrack = \"rf\"\nnum_tokens = 8\n",
        )
        .unwrap();
        let file = ServeArgs {
            config: Some(path.clone()),
            rack: Some("flag-rack".into()),
            ..ServeArgs::default()
        };
        let c = file.resolve().unwrap().cluster;
        assert_eq!(c.internode_listen, "127.0.0.5:7001".parse().unwrap());
        assert_eq!(c.seeds.len(), 1);
        assert_eq!(
            (c.cluster_name.as_str(), c.dc.as_str()),
            ("From File", "dcf")
        );
        assert_eq!(
            (c.rack.as_str(), c.num_tokens),
            ("flag-rack", 8),
            "flag beats file"
        );
        std::fs::write(&path, "seeds = \"127.0.0.1:7000,127.0.0.9:7000\"\n").unwrap();
        assert_eq!(
            file.resolve().unwrap().cluster.seeds.len(),
            2,
            "a string list too"
        );
    }

    #[test]
    fn invalid_cluster_options_are_rejected() {
        let rejected = |args: ServeArgs| args.resolve().unwrap_err().to_string();
        let e = rejected(ServeArgs {
            internode_listen: Some("0.0.0.0:7000".parse().unwrap()),
            ..ServeArgs::default()
        });
        assert!(e.contains("concrete address"), "{e}");
        let e = rejected(ServeArgs {
            internode_listen: Some("127.0.0.1:9042".parse().unwrap()),
            ..ServeArgs::default()
        });
        assert!(e.contains("CQL port"), "{e}");
        let e = rejected(ServeArgs {
            internode_listen: Some("127.0.0.1:9180".parse().unwrap()),
            ..ServeArgs::default()
        });
        assert!(e.contains("metrics port"), "{e}");
        for seeds in [
            "",
            "127.0.0.1:7000,,",
            "nonsense",
            "127.0.0.1:7000,127.0.0.1:7000",
            "0.0.0.0:7000",
        ] {
            let e = rejected(ServeArgs {
                seeds: Some(seeds.into()),
                ..ServeArgs::default()
            });
            assert!(e.contains("seeds"), "{seeds:?}: {e}");
        }
        for n in [0, 1025] {
            let e = rejected(ServeArgs {
                num_tokens: Some(n),
                ..ServeArgs::default()
            });
            assert!(e.contains("num-tokens"), "{e}");
        }
        for (name, value) in [("dc", ""), ("rack", " r1"), ("cluster-name", "a\nb")] {
            let mut args = ServeArgs::default();
            match name {
                "dc" => args.dc = Some(value.into()),
                "rack" => args.rack = Some(value.into()),
                _ => args.cluster_name = Some(value.into()),
            }
            let e = rejected(args);
            assert!(e.contains(name), "{name} {value:?}: {e}");
        }
    }

    #[test]
    fn rate_limiter_slots_default_round_up_and_bounds() {
        assert_eq!(
            ServeArgs::default().resolve().unwrap().rate_limiter_slots,
            1 << 16
        );
        let slots = |n| {
            ServeArgs {
                rate_limiter_slots: Some(n),
                ..ServeArgs::default()
            }
            .resolve()
            .map(|c| c.rate_limiter_slots)
        };
        assert_eq!(slots(100).unwrap(), 128);
        assert_eq!(slots(1 << 20).unwrap(), 1 << 20);
        assert!(slots(15).is_err());
        assert!(slots((1 << 24) + 1).is_err());
    }

    #[test]
    fn auth_and_tls_options_resolve() {
        use sluice_engine::auth::{AuthenticatorKind, AuthorizerKind};
        let c = ServeArgs::default().resolve().unwrap();
        assert_eq!(c.auth, sluice_engine::auth::AuthConfig::default());
        assert_eq!(c.auth.authenticator, AuthenticatorKind::AllowAll);
        assert_eq!(c.tls, None);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.toml");
        std::fs::write(
            &path,
            "authenticator = \"password\"\nauthorizer = \"cassandra\"\nauth_bcrypt_cost = 6\n\
             tls_cert = \"/etc/sluice/node.pem\"\ntls_key = \"/etc/sluice/node.key\"\n",
        )
        .unwrap();
        let c = ServeArgs {
            config: Some(path.clone()),
            tls_client_ca: Some("/etc/sluice/ca.pem".into()),
            auth_bcrypt_cost: Some(5),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(c.auth.authenticator, AuthenticatorKind::Password);
        assert_eq!(c.auth.authorizer, AuthorizerKind::Cassandra);
        assert_eq!(c.auth.bcrypt_cost, 5, "flag beats file");
        let tls = c.tls.unwrap();
        assert_eq!(tls.cert, PathBuf::from("/etc/sluice/node.pem"));
        assert_eq!(tls.key, PathBuf::from("/etc/sluice/node.key"));
        assert_eq!(tls.client_ca, Some(PathBuf::from("/etc/sluice/ca.pem")));

        let err = |args: ServeArgs| args.resolve().unwrap_err().to_string();
        assert!(err(ServeArgs {
            authorizer: Some(AuthorizerArg::Cassandra),
            ..ServeArgs::default()
        })
        .contains("needs --authenticator password"));
        assert!(err(ServeArgs {
            auth_bcrypt_cost: Some(3),
            ..ServeArgs::default()
        })
        .contains("between 4 and 31"));
        assert!(err(ServeArgs {
            tls_cert: Some("c.pem".into()),
            ..ServeArgs::default()
        })
        .contains("go together"));
        assert!(err(ServeArgs {
            tls_client_ca: Some("ca.pem".into()),
            ..ServeArgs::default()
        })
        .contains("needs --tls-cert"));
    }
}
