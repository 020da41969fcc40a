//! The query engine: schema catalog, system tables, statement analysis and execution.
//!
//! The server calls [`Engine::prepare`] (through the statement cache) and
//! [`Engine::execute`] / [`Engine::batch`]; [`Engine::route`] tells it which partition a
//! statement touches before anything runs, so that it can pick the owning shard, apply the
//! per-partition limiter and set the deadline.
//!
//! Design notes:
//! - The schema is an immutable [`catalog::Schema`] behind an `RwLock<Arc<_>>`: readers
//!   clone the `Arc`, DDL (serialised by one lock) builds the next schema, persists it as
//!   one JSON document in the storage metadata store, swaps it in, invalidates cached
//!   statements of the touched tables and broadcasts the change. In a cluster the change is
//!   proposed to the metadata group instead and every node installs it when the group
//!   applies it ([`schema_group`]); the local document is then a cache of the group's schema.
//! - Statements are analysed once into plans ([`Prepared`]) kept in a bounded cache keyed
//!   by MD5(keyspace + query), shared by PREPARE and unprepared QUERY.
//! - Paging states are self-contained (position, remaining LIMIT, statement hash), so any
//!   node or shard can continue a query; malformed states are Invalid errors.
//! - Deadlines: `execute` checks the deadline immediately before storage work and answers a
//!   Write_timeout (SIMPLE) / Read_timeout (no data) without executing.
//! - Conditional statements (single node) read, check and write under a 64-way lock
//!   stripe keyed by token: they are linearizable among themselves, but a plain write to
//!   the same row may interleave (as when Cassandra mixes LWT and non-LWT writes).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod analyze;
pub mod auth;
pub mod catalog;
mod cluster;
pub mod codec;
pub mod coordinator;
mod ddl;
mod describe;
mod exec;
pub mod hints;
mod json;
mod logged_batch;
mod paging;
pub mod rate_limit_option;
mod read;
pub mod read_counts;
mod remote_read;
pub mod replica_msg;
pub mod replica_stats;
mod result;
pub mod schema_group;
mod shard_statements;
pub mod system;
pub mod transaction;
mod truncate;
mod write;

#[cfg(test)]
mod tests;

use analyze::Plan;
use bytes::Bytes;
use catalog::{PersistedSchema, Schema};
use sluice_protocol::{
    BatchRequest, BoundValues, ColumnSpec, DbError, DetailedError, PreparedMetadata,
    QueryParameters, ResultColumns, ResultMessage, RowsMetadata, SchemaChange, ValueRef,
};
use sluice_storage::{Storage, StorageError, TableId};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use uuid::Uuid;

pub use catalog::{ColumnDef, ColumnKind, KeyspaceDef, RateLimits, TableDef, TableOptions};
pub use cluster::{follow_ring, NodeEvent};
pub use rate_limit_option::LimitedPartition;
pub use shard_statements::ShardStatements;

/// The CQL version reported in `system.local`.
pub const CQL_VERSION: &str = "3.4.7";
/// The release version reported in `system.local` (cqlsh needs >= 4 for DESCRIBE).
pub const RELEASE_VERSION: &str = "5.0.0";
/// The partitioner class name drivers check.
pub const PARTITIONER: &str = "org.apache.cassandra.dht.Murmur3Partitioner";

/// How many statements the cache keeps before evicting the least recently used quarter.
const STATEMENT_CACHE_CAPACITY: usize = 8192;

/// How long a DDL statement without a deadline of its own may wait for the metadata group.
const DEFAULT_DDL_DEADLINE: Duration = Duration::from_secs(10);

/// The metadata key the schema document is stored under.
const SCHEMA_META_KEY: &[u8] = b"schema/v1";

/// Who this node is, as `system.local` reports it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The address clients connect to (never 0.0.0.0).
    pub rpc_address: IpAddr,
    /// The native protocol port.
    pub port: u16,
    /// Cluster name.
    pub cluster_name: String,
    /// Stable host id.
    pub host_id: Uuid,
    /// The node's tokens (non-empty).
    pub tokens: Vec<i64>,
    /// Data center name.
    pub data_center: String,
    /// Rack name.
    pub rack: String,
    /// Gossip generation (start time in seconds).
    pub generation: i32,
    /// The address of node-to-node messaging (`listen_address` in `system.local`).
    pub internode_address: std::net::SocketAddr,
    /// Settings shown in `system_views.settings` (name, value), by Cassandra's names where
    /// one exists (`commitlog_sync`...), so that tools can compare configurations.
    pub settings: Vec<(String, String)>,
}

impl NodeInfo {
    /// A single-node identity with Cassandra's default names and one token.
    pub fn single(rpc_address: IpAddr, port: u16, host_id: Uuid) -> NodeInfo {
        NodeInfo {
            rpc_address,
            port,
            cluster_name: "Sluice Cluster".to_string(),
            host_id,
            tokens: vec![0],
            data_center: "datacenter1".to_string(),
            rack: "rack1".to_string(),
            generation: (now_micros() / 1_000_000) as i32,
            settings: Vec::new(),
            internode_address: std::net::SocketAddr::new(rpc_address, 7000),
        }
    }

    /// The native (CQL) address and port clients connect to.
    pub fn cql_address(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.rpc_address, self.port)
    }

    /// This node as the ring describes it.
    pub fn ring_node(&self) -> sluice_ring::Node {
        sluice_ring::Node {
            host_id: self.host_id,
            cql_address: self.cql_address(),
            internode_address: self.internode_address,
            dc: self.data_center.clone(),
            rack: self.rack.clone(),
            tokens: self.tokens.iter().map(|&t| sluice_ring::Token(t)).collect(),
            state: sluice_ring::NodeState::Normal,
        }
    }

    /// The ring of a single-node cluster: this node alone, with its tokens.
    pub fn single_node_ring(&self) -> Result<sluice_ring::TokenMetadata, sluice_ring::RingError> {
        sluice_ring::TokenMetadata::new(vec![self.ring_node()])
    }
}

/// The partitions an LWT, SERIAL read or transaction reads, and its error for silence until
/// the deadline (a read's or a CAS write's timeout).
type TxnReads<'p> = (
    Vec<(&'p catalog::TableDef, i64)>,
    fn(sluice_protocol::Consistency) -> DetailedError,
);

/// Per-connection state.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// The keyspace set by `USE`.
    pub keyspace: Option<String>,
    /// The role that logged in (None with the allow-all authenticator, or before login).
    pub user: Option<auth::AuthenticatedUser>,
    /// The client's address, for audit lines.
    pub peer: Option<std::net::SocketAddr>,
}

/// Per-request execution context.
#[derive(Debug, Clone, Copy)]
pub struct RequestContext {
    /// The request's deadline; work is not started past it.
    pub deadline: Option<Instant>,
    /// "Now" in microseconds since the epoch (write timestamps, TTL expiry).
    pub now_micros: i64,
    /// Present when the caller flushes the storage's `AckBarrier` before it writes the answer
    /// to its client: a write that the barrier makes durable (Periodic mode) then answers
    /// without waiting for it.
    pub ack_barrier: Option<sluice_storage::AckBarrierHeld>,
}

impl RequestContext {
    /// A context with the current wall clock, no deadline and no acknowledgement barrier.
    pub fn now() -> RequestContext {
        RequestContext {
            deadline: None,
            now_micros: now_micros(),
            ack_barrier: None,
        }
    }
}

/// Wall clock in microseconds since the epoch.
pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// What a statement does, for admission and routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// A single- or multi-partition read.
    Read,
    /// A write.
    Write,
    /// A range scan (token range or full table).
    Range,
    /// DDL.
    Schema,
    /// USE, DESCRIBE, system tables: answered locally.
    Other,
}

/// Where a statement goes, computed without executing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The partition token, when the statement touches exactly one partition.
    pub token: Option<i64>,
    /// The table, if any.
    pub table: Option<TableId>,
    /// The kind of operation.
    pub kind: OpKind,
    /// `USING TIMEOUT`, if the statement has one.
    pub timeout: Option<Duration>,
    /// The table's `per_partition_rate_limit`, for the per-partition rate limiter.
    pub rate_limits: Option<RateLimits>,
}

/// Why the engine could not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineOpenError {
    /// Storage failed.
    Storage(StorageError),
    /// The persisted schema did not decode.
    CorruptSchema(&'static str),
    /// The node's own tokens do not make a ring.
    InvalidTokens(sluice_ring::RingError),
}

impl std::fmt::Display for EngineOpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineOpenError::Storage(e) => write!(f, "storage error: {e:?}"),
            EngineOpenError::CorruptSchema(m) => write!(f, "corrupt schema: {m}"),
            EngineOpenError::InvalidTokens(e) => write!(f, "invalid node tokens: {e}"),
        }
    }
}

impl std::error::Error for EngineOpenError {}

/// An analysed statement, shared by PREPARE/EXECUTE and the unprepared-QUERY cache.
#[derive(Debug)]
pub struct Prepared {
    /// MD5(keyspace + query).
    pub id: [u8; 16],
    /// The keyspace it was prepared in.
    pub keyspace: Option<String>,
    /// The query text.
    pub query: String,
    /// Bind marker specs, in marker order.
    pub bind_specs: Vec<ColumnSpec>,
    /// Partition-key bind indexes (empty unless every component is `= ?`).
    pub pk_indexes: Vec<u16>,
    /// Result columns of a SELECT (or of a conditional write); empty = no metadata.
    pub result_columns: ResultColumns,
    /// True for a conditional (LWT) statement.
    pub lwt: bool,
    /// The kind of operation.
    pub kind: OpKind,
    /// The table it reads or writes.
    pub table_id: Option<Uuid>,
    /// The keyspace of that table.
    pub table_keyspace: Option<String>,
    pub(crate) plan: Plan,
    /// `USING TIMEOUT` when written as a constant, decided at analysis (None: a bind marker).
    pub(crate) const_timeout: Option<Result<Option<std::time::Duration>, DetailedError>>,
    /// Some marker's type holds a set or map, whose bound value may need reordering.
    pub(crate) set_or_map_markers: bool,
    pub(crate) last_used: AtomicU64,
    /// The schema version the plan was analysed against.
    pub(crate) schema_version: Uuid,
    /// The permissions the statement needs, checked by [`Engine::check_access`].
    pub access: Box<[auth::AccessCheck]>,
    /// A role or permission change (CREATE / ALTER / DROP ROLE, GRANT, REVOKE), counted.
    pub changes_auth: bool,
}

impl Prepared {
    /// True for statements that change the schema.
    pub fn is_schema_change(&self) -> bool {
        self.kind == OpKind::Schema
    }
}

/// Hasher of the statement cache, which every EXECUTE looks up: prepared ids are MD5 digests,
/// so a fast keyed hash (foldhash, randomly seeded per process) suffices where SipHash cost
/// ~300 instructions per lookup; the seed keeps clients from aiming collisions.
type PreparedIdHash = foldhash::fast::RandomState;

/// Lock stripes of the LWT benchmark switch (as many as the per-token LWT locks had).
const LWT_SERIALIZER_STRIPES: usize = 64;

/// The query engine, shared by all shards.
pub struct Engine {
    storage: Storage,
    node: NodeInfo,
    cluster: cluster::ClusterView,
    schema: RwLock<Arc<Schema>>,
    ddl_lock: Mutex<()>,
    /// Set in a cluster: DDL goes through the metadata group.
    schema_log: std::sync::OnceLock<Arc<dyn schema_group::SchemaLog>>,
    /// Orders this node's DDL through the group (held across the proposal's await).
    ddl_queue: tokio::sync::Mutex<()>,
    /// True while this node proposes its local schema as the group's first one.
    seeding: std::sync::atomic::AtomicBool,
    cache: RwLock<HashMap<[u8; 16], Arc<Prepared>, PreparedIdHash>>,
    cache_clock: AtomicU64,
    /// Bumped whenever a statement leaves `cache`, so that shards' own caches
    /// ([`ShardStatements`]) forget what the engine dropped.
    cache_generation: AtomicU64,
    events: broadcast::Sender<SchemaChange>,
    list_clock: AtomicU64,
    last_write_ts: std::sync::atomic::AtomicI64,
    /// Benchmark switch: when on, an LWT holds one of `lwt_serializer`'s stripes until its
    /// write is durable (the behaviour before conditions moved into the storage commit).
    lwt_serialize_through_durability: std::sync::atomic::AtomicBool,
    lwt_serializer: Box<[tokio::sync::Mutex<()>]>,
    /// Benchmark switch: when on, a transaction's writes are converted and encoded under
    /// its locks even when they need no read.
    txn_prepare_under_lock: std::sync::atomic::AtomicBool,
    auth: auth::AuthState,
    /// Admission of multi-partition transactions and their metrics.
    transactions: transaction::gate::TxnGate,
    /// Set in a cluster: statements are then coordinated across their partitions' replicas.
    replica_transport: std::sync::OnceLock<Arc<dyn coordinator::ReplicaTransport>>,
    replica_stats: replica_stats::ReplicaStats,
    /// Each peer's schema version as its heartbeat last said (`system.peers`).
    peer_schema_versions: Mutex<HashMap<Uuid, Uuid>>,
    /// Set in a cluster: transactions and LWT go through the cluster's transaction log.
    txn_log: std::sync::OnceLock<Arc<dyn transaction::replicated::TxnLog>>,
    /// Set when this node's storage may lack logged commits (a snapshot from another node).
    txn_commits_missed: std::sync::atomic::AtomicBool,
    /// Logged transactions this coordinator proposed that the log found in conflict.
    txn_log_conflicts: AtomicU64,
    /// Logged transactions and writes this coordinator committed.
    txn_log_commits: AtomicU64,
    /// Odd while a logged commit is being written to storage (a sequence lock for readers).
    txn_apply_seq: AtomicU64,
    /// Partitions a read found differing across replicas and repaired.
    read_repairs: AtomicU64,
    /// Whether writes leave hints for replicas that are down.
    hinted_handoff: std::sync::atomic::AtomicBool,
    /// Set once the node's hint directory is open; without it no hints are kept.
    hints: std::sync::OnceLock<hints::HintStore>,
    speculation: coordinator::Speculation,
    /// Admitted writes of rate-limited replicated tables, counted by every replica.
    replicated_writes: sluice_overload::ReplicatedCounts,
    /// Admitted reads of rate-limited replicated tables: this node's and its peers'.
    replicated_reads: sluice_overload::ReplicatedCounts,
    /// Reads this node admitted that its peers have not been told of yet.
    pending_reads: Mutex<read_counts::PendingReads>,
    read_count_stats: read_counts::ReadCountStats,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("node", &self.node).finish()
    }
}

/// Milliseconds since the Unix epoch: rate-limit windows follow wall-clock seconds, which
/// every node shares, so replicas agree on where a window starts.
fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This node's current rate-limit window, carried in MUTATION messages.
pub(crate) fn rate_window_now() -> u32 {
    sluice_overload::window_of(unix_millis()).0
}

/// Folds a table id into the write counts' 32-bit table key (ids are random UUIDs; a
/// collision only matters for two tables that also share a token).
fn rate_table_key(id: &[u8; 16]) -> u32 {
    id.chunks_exact(4)
        .fold(0, |k, c| k ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// The number of replicas a keyspace's replication asks for, over every data center.
fn total_factor(replication: &sluice_ring::Replication) -> u32 {
    match replication {
        sluice_ring::Replication::Local => 1,
        sluice_ring::Replication::Simple { factor } => *factor,
        sluice_ring::Replication::NetworkTopology { factors } => {
            factors.iter().map(|(_, rf)| *rf).sum()
        }
    }
}

/// A storage failure's static message, for a replica's refusal.
fn refusal_message(e: &StorageError) -> &'static str {
    match e {
        StorageError::TooLarge(m) | StorageError::Io(m) | StorageError::Corrupt(m) => m,
        StorageError::TooManyTombstones => "too many tombstones",
        StorageError::Closed => "storage is shutting down",
    }
}

/// Maps a storage failure to a response (unexpected, so Server_error; oversize is Invalid).
pub(crate) fn storage_error(e: StorageError) -> DetailedError {
    match e {
        StorageError::TooLarge(m) => DetailedError::new(DbError::Invalid, m),
        // Cassandra answers its TombstoneOverwhelmingException with Read_failure.
        StorageError::TooManyTombstones => DetailedError::new(
            DbError::ReadFailure,
            "Scanned over more tombstones than tombstone_failure_threshold allows; query aborted",
        ),
        StorageError::Io(m) | StorageError::Corrupt(m) => {
            DetailedError::new(DbError::ServerError, m)
        }
        StorageError::Closed => {
            DetailedError::new(DbError::ServerError, "storage is shutting down")
        }
    }
}

impl Engine {
    /// Opens the engine on `storage`, reloading the persisted schema, with neither
    /// authentication nor authorization.
    pub fn open(storage: Storage, node: NodeInfo) -> Result<Arc<Engine>, EngineOpenError> {
        Engine::open_with_auth(storage, node, auth::AuthConfig::default())
    }

    /// Opens the engine with these authentication and authorization settings; with the
    /// password authenticator, the first start creates the default superuser.
    pub fn open_with_auth(
        storage: Storage,
        node: NodeInfo,
        auth_config: auth::AuthConfig,
    ) -> Result<Arc<Engine>, EngineOpenError> {
        let ring = node
            .single_node_ring()
            .map_err(EngineOpenError::InvalidTokens)?;
        let cluster = cluster::ClusterView::new(node.host_id, node.cql_address(), ring);
        let auth = auth::AuthState::open(&storage, auth_config)?;
        let stored = storage
            .meta_scan(SCHEMA_META_KEY)
            .map_err(EngineOpenError::Storage)?;
        let schema = match stored
            .into_iter()
            .find(|(k, _)| k.as_slice() == SCHEMA_META_KEY)
        {
            Some((_, v)) => {
                let p: PersistedSchema = serde_json::from_slice(&v).map_err(|_| {
                    EngineOpenError::CorruptSchema("schema document does not decode")
                })?;
                Schema::from_persisted(p).map_err(EngineOpenError::CorruptSchema)?
            }
            None => Schema::with_system(),
        };
        let (events, _) = broadcast::channel(256);
        Ok(Arc::new(Engine {
            storage,
            node,
            cluster,
            schema: RwLock::new(Arc::new(schema)),
            ddl_lock: Mutex::new(()),
            schema_log: std::sync::OnceLock::new(),
            ddl_queue: tokio::sync::Mutex::new(()),
            seeding: std::sync::atomic::AtomicBool::new(false),
            cache: RwLock::new(HashMap::default()),
            cache_clock: AtomicU64::new(1),
            cache_generation: AtomicU64::new(1),
            events,
            list_clock: AtomicU64::new(0),
            last_write_ts: std::sync::atomic::AtomicI64::new(i64::MIN),
            lwt_serialize_through_durability: std::sync::atomic::AtomicBool::new(false),
            txn_prepare_under_lock: std::sync::atomic::AtomicBool::new(false),
            lwt_serializer: (0..LWT_SERIALIZER_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            auth,
            transactions: transaction::gate::TxnGate::default(),
            replica_transport: std::sync::OnceLock::new(),
            replica_stats: replica_stats::ReplicaStats::default(),
            peer_schema_versions: Mutex::new(HashMap::new()),
            txn_log: std::sync::OnceLock::new(),
            txn_commits_missed: std::sync::atomic::AtomicBool::new(false),
            txn_log_conflicts: AtomicU64::new(0),
            txn_log_commits: AtomicU64::new(0),
            txn_apply_seq: AtomicU64::new(0),
            read_repairs: AtomicU64::new(0),
            hinted_handoff: std::sync::atomic::AtomicBool::new(true),
            hints: std::sync::OnceLock::new(),
            speculation: coordinator::Speculation::default(),
            replicated_writes: sluice_overload::ReplicatedCounts::new(),
            replicated_reads: sluice_overload::ReplicatedCounts::new(),
            pending_reads: Mutex::new(read_counts::PendingReads::default()),
            read_count_stats: read_counts::ReadCountStats::default(),
        }))
    }

    /// The admission gate and metrics of multi-partition transactions.
    pub fn transactions(&self) -> &transaction::gate::TxnGate {
        &self.transactions
    }

    pub(crate) fn speculation_point(&self, sent: Instant, deadline: Instant) -> Instant {
        self.speculation.point(sent, deadline)
    }

    pub(crate) fn note_replica_read_latency(&self, took: std::time::Duration) {
        self.speculation.note_latency(took);
    }

    pub(crate) fn count_coordinated_read(&self) {
        self.speculation.count_read();
    }

    pub(crate) fn may_speculate(&self) -> bool {
        self.speculation.take()
    }

    /// Extra read requests sent because the first targets were slow.
    pub fn speculative_reads(&self) -> u64 {
        self.speculation.speculated()
    }

    /// Turns hints for replicas that are down on or off (on by default, as Cassandra's
    /// `hinted_handoff_enabled`).
    pub fn set_hinted_handoff(&self, on: bool) {
        self.hinted_handoff.store(on, Ordering::Relaxed);
    }

    pub(crate) fn hinted_handoff(&self) -> bool {
        self.hinted_handoff.load(Ordering::Relaxed)
    }

    /// Keeps hints on disk as `config` says (files a previous run left are replayed too).
    /// Set once; a second call is an error.
    pub fn open_hints(&self, config: hints::HintConfig) -> std::io::Result<()> {
        let store = hints::HintStore::open(config)?;
        self.hints
            .set(store)
            .map_err(|_| std::io::Error::other("the hint store is already open"))
    }

    /// The hint store, once opened.
    pub fn hints(&self) -> Option<&hints::HintStore> {
        self.hints.get()
    }

    /// Hosts with hints waiting on disk.
    pub fn hinted_hosts(&self) -> Vec<Uuid> {
        self.hints().map(|h| h.hosts()).unwrap_or_default()
    }

    /// What the hint store holds and has done (all zero when none is open).
    pub fn hint_stats(&self) -> hints::HintStats {
        self.hints().map(|h| h.stats()).unwrap_or_default()
    }

    /// Writes the queued hints and stops the hint writer (at shutdown).
    pub fn close_hints(&self) {
        if let Some(h) = self.hints() {
            h.close();
        }
    }

    /// Whether the ring has nodes besides this one (a cheap read for every request).
    pub(crate) fn is_multi_node(&self) -> bool {
        self.cluster.is_multi_node()
    }

    /// Makes this engine a coordinator: from now on reads and writes of replicated keyspaces
    /// go to their partitions' replicas through `transport`. Set once; later calls are
    /// ignored and answer false.
    pub fn set_replica_transport(&self, transport: Arc<dyn coordinator::ReplicaTransport>) -> bool {
        self.replica_transport.set(transport).is_ok()
    }

    /// The transport to other replicas, in a cluster.
    pub(crate) fn replica_transport(&self) -> Option<&Arc<dyn coordinator::ReplicaTransport>> {
        self.replica_transport.get()
    }

    /// Records the schema version `peer` last reported (its failure-detector heartbeat).
    pub fn set_peer_schema_version(&self, peer: Uuid, version: Uuid) {
        let mut versions = self
            .peer_schema_versions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        versions.insert(peer, version);
    }

    /// The schema version `peer` last reported, if it has.
    pub fn peer_schema_version(&self, peer: Uuid) -> Option<Uuid> {
        self.peer_schema_versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&peer)
            .copied()
    }

    /// What this node's replica service did for other coordinators.
    pub fn replica_stats(&self) -> &replica_stats::ReplicaStats {
        &self.replica_stats
    }

    /// How many partitions reads found differing across replicas and repaired.
    pub fn read_repairs(&self) -> u64 {
        self.read_repairs.load(Ordering::Relaxed)
    }

    pub(crate) fn count_read_repair(&self) {
        self.read_repairs.fetch_add(1, Ordering::Relaxed);
    }

    /// The table with this id, if this node's schema has it.
    fn table_by_id(&self, id: &[u8; 16]) -> Option<Arc<TableDef>> {
        self.schema()
            .tables
            .values()
            .find(|t| t.id.as_bytes() == id)
            .cloned()
    }

    /// Replica side of a MUTATION: applies a coordinator's mutations and waits until they
    /// are durable. Nothing is written once `deadline` has passed, nor when any table is
    /// unknown here.
    pub async fn apply_replica_mutations(
        &self,
        body: &Bytes,
        deadline: Instant,
    ) -> Result<(), coordinator::ReplicaRefusal> {
        use coordinator::ReplicaRefusal;
        let (rate_window, muts) =
            replica_msg::decode_mutations(body).map_err(|e| ReplicaRefusal::Malformed(e.0))?;
        let mut tables: Vec<Arc<TableDef>> = Vec::with_capacity(1);
        for m in &muts {
            if !tables.iter().any(|t| *t.id.as_bytes() == m.table) {
                tables.push(
                    self.table_by_id(&m.table)
                        .ok_or(ReplicaRefusal::UnknownTable)?,
                );
            }
        }
        let batch: Vec<(&sluice_storage::TableLayout, sluice_storage::Mutation)> = muts
            .into_iter()
            .map(|m| {
                let t = tables.iter().find(|t| *t.id.as_bytes() == m.table);
                (&t.expect("every table was found above").layout, m)
            })
            .collect();
        if Instant::now() >= deadline {
            return Err(ReplicaRefusal::Expired);
        }
        // Count before applying: the coordinator admitted these writes whatever happens here.
        self.count_replicated_writes(&tables, &batch, rate_window);
        let ticket = self
            .storage
            .apply(&batch)
            .map_err(|e| ReplicaRefusal::Storage(refusal_message(&e)))?;
        self.storage
            .wait_durable(ticket)
            .await
            .map_err(|e| ReplicaRefusal::Storage(refusal_message(&e)))
    }

    /// Counts each admitted write of a table with a write limit, in the coordinator's window.
    fn count_replicated_writes(
        &self,
        tables: &[Arc<TableDef>],
        batch: &[(&sluice_storage::TableLayout, sluice_storage::Mutation)],
        rate_window: u32,
    ) {
        let limited = |id: &[u8; 16]| {
            tables.iter().any(|t| {
                t.id.as_bytes() == id
                    && t.options
                        .per_partition_rate_limit
                        .is_some_and(|l| l.max_writes_per_second.is_some())
            })
        };
        let now = unix_millis();
        for (_, m) in batch {
            if limited(&m.table) {
                self.replicated_writes
                    .count(rate_table_key(&m.table), m.token, rate_window, now);
            }
        }
    }

    /// The per-partition write limit of a replicated table, decided once on this coordinator
    /// from the admitted writes every replica counts (its own decisions included): `None` when
    /// the table is not replicated to other nodes, and the shard's own limiter decides.
    /// Replicas never reject on rate; an accepted write is counted here at once.
    pub fn decide_replicated_write(
        &self,
        table: &[u8; 16],
        token: i64,
        limit: u32,
    ) -> Option<bool> {
        if !self.is_multi_node() || self.replica_transport().is_none() {
            return None;
        }
        let t = self.table_by_id(table)?;
        if coordinator::replication_of(self, &t) == sluice_ring::Replication::Local {
            return None;
        }
        Some(
            self.replicated_writes
                .decide(rate_table_key(table), token, limit, unix_millis())
                .is_some(),
        )
    }

    /// The per-partition read limit of a table replicated to more than one node, decided
    /// once on this coordinator from the reads it and the other replicas admitted (their
    /// counts arrive through the read count exchange): `None` on one node or for a table
    /// with one replica, where the shard's own limiter decides. An accepted read is counted
    /// here at once and waits for the next exchange.
    pub fn decide_replicated_read(&self, table: &[u8; 16], token: i64, limit: u32) -> Option<bool> {
        self.decide_replicated_read_at(table, token, limit, unix_millis())
    }

    pub(crate) fn decide_replicated_read_at(
        &self,
        table: &[u8; 16],
        token: i64,
        limit: u32,
        now_millis: u64,
    ) -> Option<bool> {
        if !self.is_multi_node() || self.replica_transport().is_none() {
            return None;
        }
        let t = self.table_by_id(table)?;
        let replication = coordinator::replication_of(self, &t);
        let factor = total_factor(&replication);
        if factor <= 1 {
            return None;
        }
        // Between two exchanges a node spends at most its share of the limit on a key, so
        // that coordinators starting together on a cold key admit about the limit in all.
        let share = (limit / factor).max(1);
        // Each other coordinator may admit one more before this one hears of it: keep that
        // far below the limit (in thousandths of a read), at most a share.
        let margin_milli = ((factor - 1) * 1000).min(limit / factor * 1000);
        let mut pending = self.pending_reads.lock().unwrap_or_else(|p| p.into_inner());
        let (now_window, _) = sluice_overload::window_of(now_millis);
        if pending.waiting(table, token, now_window) >= share {
            return Some(false);
        }
        let Some(window) = self.replicated_reads.decide_shared(
            rate_table_key(table),
            token,
            limit,
            margin_milli,
            now_millis,
        ) else {
            return Some(false);
        };
        if !pending.add(*table, token, window) {
            self.read_count_stats.dropped();
        }
        Some(true)
    }

    /// The read count exchange's messages now: for each peer, the reads this node admitted
    /// since the last call of the keys it is a replica of (at most
    /// [`read_counts::MAX_KEYS_PER_MESSAGE`] keys per message). Peers believed down get
    /// nothing; counts more than one window old are dropped, as a receiver would.
    pub fn take_read_counts(&self) -> Vec<(std::net::SocketAddr, Bytes)> {
        self.take_read_counts_at(unix_millis())
    }

    pub(crate) fn take_read_counts_at(
        &self,
        now_millis: u64,
    ) -> Vec<(std::net::SocketAddr, Bytes)> {
        let counts = self
            .pending_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if counts.is_empty() {
            return Vec::new();
        }
        let (ours, _) = sluice_overload::window_of(now_millis);
        let rings = self.rings();
        let ring = &rings.current;
        let me = ring.index_of(self.node().host_id);
        let mut replication_by_table: Vec<([u8; 16], Option<sluice_ring::Replication>)> =
            Vec::new();
        let mut by_peer: Vec<(std::net::SocketAddr, Vec<read_counts::ReadCount>)> = Vec::new();
        let mut replicas = Vec::new();
        for c in counts {
            if sluice_overload::clamp_window(c.window, ours).is_none() {
                continue;
            }
            let replication = match replication_by_table.iter().find(|(id, _)| *id == c.table) {
                Some((_, r)) => r.clone(),
                None => {
                    let r = self
                        .table_by_id(&c.table)
                        .map(|t| coordinator::replication_of(self, &t));
                    replication_by_table.push((c.table, r.clone()));
                    r
                }
            };
            let Some(replication) = replication else {
                continue;
            };
            replicas.clear();
            sluice_ring::natural_replicas(
                ring,
                &replication,
                sluice_ring::Token(c.token),
                &mut replicas,
            );
            for &r in &replicas {
                let node = ring.node(r);
                if Some(r) == me || !self.is_node_up(node.host_id) {
                    continue;
                }
                match by_peer
                    .iter_mut()
                    .find(|(a, _)| *a == node.internode_address)
                {
                    Some((_, v)) => v.push(c),
                    None => by_peer.push((node.internode_address, vec![c])),
                }
            }
        }
        let mut out = Vec::new();
        let mut keys = 0;
        for (peer, counts) in by_peer {
            keys += counts.len();
            for chunk in counts.chunks(read_counts::MAX_KEYS_PER_MESSAGE) {
                out.push((peer, read_counts::encode_read_counts(chunk)));
            }
        }
        self.read_count_stats.sent(out.len(), keys);
        out
    }

    /// Counts a peer's read count message as admitted reads in its windows (each clamped to
    /// this node's window ±1); a malformed message is refused whole, nothing counted.
    /// Returns how many keys were counted.
    pub fn count_peer_reads(&self, body: &[u8]) -> Result<usize, coordinator::ReplicaRefusal> {
        self.count_peer_reads_at(body, unix_millis())
    }

    pub(crate) fn count_peer_reads_at(
        &self,
        body: &[u8],
        now_millis: u64,
    ) -> Result<usize, coordinator::ReplicaRefusal> {
        let counts = read_counts::decode_read_counts(body).map_err(|e| {
            self.read_count_stats.malformed();
            coordinator::ReplicaRefusal::Malformed(e.0)
        })?;
        let mut counted = 0;
        for c in counts {
            if self.replicated_reads.count_many(
                rate_table_key(&c.table),
                c.token,
                c.window,
                c.count,
                now_millis,
            ) {
                counted += 1;
            }
        }
        self.read_count_stats.received(counted);
        Ok(counted)
    }

    /// What the read count exchange sent, received and dropped.
    pub fn read_count_stats(&self) -> read_counts::ReadCountSnapshot {
        self.read_count_stats.snapshot()
    }

    /// Replica side of a READ: the digest or the raw entries of one partition.
    pub fn replica_read(
        &self,
        body: &Bytes,
        deadline: Instant,
    ) -> Result<Bytes, coordinator::ReplicaRefusal> {
        use coordinator::ReplicaRefusal;
        let req = replica_msg::decode_read(body).map_err(|e| ReplicaRefusal::Malformed(e.0))?;
        if self.table_by_id(&req.table).is_none() {
            return Err(ReplicaRefusal::UnknownTable);
        }
        if Instant::now() >= deadline {
            return Err(ReplicaRefusal::Expired);
        }
        let raw = self
            .storage
            .read_raw_partition(req.table, req.token, &req.partition_key)
            .map_err(|e| ReplicaRefusal::Storage(refusal_message(&e)))?;
        Ok(match req.kind {
            replica_msg::ReadKind::Digest => Bytes::copy_from_slice(&replica_msg::digest(&raw)),
            replica_msg::ReadKind::Data => replica_msg::encode_raw(&raw),
        })
    }

    /// Replica side of a TRUNCATE: drops every row of the table on this node.
    pub fn apply_replica_truncate(
        &self,
        body: &Bytes,
        deadline: Instant,
    ) -> Result<(), coordinator::ReplicaRefusal> {
        use coordinator::ReplicaRefusal;
        let table =
            replica_msg::decode_truncate(body).map_err(|e| ReplicaRefusal::Malformed(e.0))?;
        if self.table_by_id(&table).is_none() {
            return Err(ReplicaRefusal::UnknownTable);
        }
        if Instant::now() >= deadline {
            return Err(ReplicaRefusal::Expired);
        }
        self.storage
            .truncate(table)
            .map_err(|e| ReplicaRefusal::Storage(refusal_message(&e)))
    }

    /// Replica side of a read repair: merges the coordinator's partition into this one's
    /// and waits until it is durable.
    pub async fn apply_replica_repair(
        &self,
        body: &Bytes,
        deadline: Instant,
    ) -> Result<(), coordinator::ReplicaRefusal> {
        use coordinator::ReplicaRefusal;
        let req = replica_msg::decode_repair(body).map_err(|e| ReplicaRefusal::Malformed(e.0))?;
        let t = self
            .table_by_id(&req.table)
            .ok_or(ReplicaRefusal::UnknownTable)?;
        if Instant::now() >= deadline {
            return Err(ReplicaRefusal::Expired);
        }
        let ticket = self
            .storage
            .apply_raw_partition(&t.layout, req.token, &req.partition_key, &req.raw)
            .map_err(|e| ReplicaRefusal::Storage(refusal_message(&e)))?;
        self.storage
            .wait_durable(ticket)
            .await
            .map_err(|e| ReplicaRefusal::Storage(refusal_message(&e)))
    }

    /// Roles, logins and grants.
    pub fn auth(&self) -> &auth::AuthState {
        &self.auth
    }

    /// Checks that `user` holds every permission `p` needs; a no-op with the allow-all
    /// authorizer. Decisions are cached in the connection's `cache` under the auth
    /// generation, so a repeated check costs a few compares and allocates nothing.
    pub fn check_access(
        &self,
        user: Option<&auth::AuthenticatedUser>,
        cache: &mut auth::PermissionCache,
        p: &Prepared,
    ) -> Result<(), auth::Unauthorized> {
        if p.access.is_empty() || !self.auth.checks_permissions() {
            return Ok(());
        }
        let generation = self.auth.generation();
        let Some(user) = user else {
            return Err(auth::Unauthorized::not_logged_in(p.access[0].permission));
        };
        for check in p.access.iter() {
            cache.check(generation, &user.name, check, || self.auth.data())?;
        }
        Ok(())
    }

    /// [`Engine::check_access`] for every statement of a BATCH request (statements that do
    /// not resolve are left to [`Engine::batch`], which reports them).
    pub fn check_batch_access(
        &self,
        user: Option<&auth::AuthenticatedUser>,
        cache: &mut auth::PermissionCache,
        keyspace: Option<&str>,
        b: &BatchRequest,
    ) -> Result<(), auth::Unauthorized> {
        if !self.auth.checks_permissions() {
            return Ok(());
        }
        for e in &b.entries {
            let p = match &e.statement {
                sluice_protocol::BatchQuery::Prepared(id) => self.prepared(id),
                sluice_protocol::BatchQuery::Text(text) => std::str::from_utf8(text)
                    .ok()
                    .and_then(|q| self.prepare(keyspace, q).ok()),
            };
            if let Some(p) = p {
                self.check_access(user, cache, &p)?;
            }
        }
        Ok(())
    }

    /// The current schema snapshot.
    pub fn schema(&self) -> Arc<Schema> {
        match self.schema.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The node identity.
    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    /// The token ring as this node knows it now (a single-node ring of this node until the
    /// cluster's topology replaces it through [`Engine::set_ring`]).
    pub fn ring(&self) -> Arc<sluice_ring::TokenMetadata> {
        self.cluster.ring()
    }

    /// The current ring with, while nodes join or leave, the ring once they settle.
    pub(crate) fn rings(&self) -> cluster::Rings {
        self.cluster.rings()
    }

    /// Replaces the ring (every reader sees the new one from its next read) and pushes
    /// TOPOLOGY_CHANGE for the nodes that started serving or left; returns how many events
    /// were sent (none for an unchanged ring).
    pub fn set_ring(&self, ring: Arc<sluice_ring::TokenMetadata>) -> usize {
        self.cluster.set_ring(ring)
    }

    /// Records whether a node is up; pushes STATUS_CHANGE when that changed for a peer
    /// drivers know. Returns whether it changed.
    pub fn set_node_up(&self, host_id: Uuid, up: bool) -> bool {
        self.cluster.set_node_up(host_id, up)
    }

    /// Whether a node is up as far as this node knows (nodes start up).
    pub fn is_node_up(&self, host_id: Uuid) -> bool {
        self.cluster.is_up(host_id)
    }

    /// Subscribes to TOPOLOGY_CHANGE / STATUS_CHANGE events.
    pub fn node_events(&self) -> broadcast::Receiver<NodeEvent> {
        self.cluster.subscribe()
    }

    /// The storage handle.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The current schema version.
    pub fn schema_version(&self) -> Uuid {
        self.schema().version
    }

    /// A table definition by name.
    pub fn table(&self, keyspace: &str, name: &str) -> Option<Arc<TableDef>> {
        self.schema().table(keyspace, name).cloned()
    }

    /// Subscribes to schema changes (to push SCHEMA_CHANGE events).
    pub fn schema_events(&self) -> broadcast::Receiver<SchemaChange> {
        self.events.subscribe()
    }

    /// Parses (through the statement cache) and analyses a statement.
    pub fn prepare(
        &self,
        keyspace: Option<&str>,
        query: &str,
    ) -> Result<Arc<Prepared>, DetailedError> {
        let id = analyze::statement_id(keyspace, query);
        if let Some(p) = self.lookup(&id) {
            if p.query == query && p.keyspace.as_deref() == keyspace {
                return Ok(p);
            }
        }
        let parsed = sluice_cql::parse(query)
            .map_err(|e| DetailedError::new(DbError::SyntaxError, e.to_string()))?;
        let schema = self.schema();
        let prepared = Arc::new(analyze::analyze(&schema, keyspace, query, id, parsed)?);
        self.insert_cached(prepared.clone());
        Ok(prepared)
    }

    /// Cache hit path: a shared read lock, and no shared-counter write, so that shards
    /// executing the same statements do not contend. Recency is an epoch advanced on
    /// inserts; a statement's stamp is written only when the epoch moved.
    fn lookup(&self, id: &[u8; 16]) -> Option<Arc<Prepared>> {
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        let p = cache.get(id)?.clone();
        drop(cache);
        self.touch(&p);
        Some(p)
    }

    /// Marks `p` as used in the current epoch of the statement cache.
    #[inline]
    fn touch(&self, p: &Prepared) {
        let epoch = self.cache_clock.load(Ordering::Relaxed);
        if p.last_used.load(Ordering::Relaxed) != epoch {
            p.last_used.store(epoch, Ordering::Relaxed);
        }
    }

    fn insert_cached(&self, p: Arc<Prepared>) {
        p.last_used.store(
            self.cache_clock.fetch_add(1, Ordering::Relaxed) + 1,
            Ordering::Relaxed,
        );
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        // A plan analysed against a schema that changed meanwhile is used once, not cached:
        // DDL swaps the schema before it invalidates under this lock, so this check cannot
        // miss a change.
        if p.schema_version != self.schema_version() && !matches!(p.plan, Plan::Dynamic(_)) {
            return;
        }
        if cache.len() >= STATEMENT_CACHE_CAPACITY && !cache.contains_key(&p.id) {
            // Evict the least recently used quarter in one go (amortised O(1) per insert).
            let mut stamps: Vec<u64> = cache
                .values()
                .map(|p| p.last_used.load(Ordering::Relaxed))
                .collect();
            stamps.sort_unstable();
            let cut = stamps[stamps.len() / 4];
            cache.retain(|_, v| v.last_used.load(Ordering::Relaxed) > cut);
            // After the removal, under the lock: see `ShardStatements::prepared`.
            self.cache_generation.fetch_add(1, Ordering::AcqRel);
        }
        cache.insert(p.id, p);
    }

    /// Drops cached statements that read or write any of these tables (or keyspace).
    fn invalidate(&self, tables: &[Uuid], keyspace: Option<&str>) {
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        cache.retain(|_, p| {
            let by_table = p.table_id.is_some_and(|t| tables.contains(&t));
            let by_ks = keyspace.is_some_and(|k| p.table_keyspace.as_deref() == Some(k));
            let batch_hit = match &p.plan {
                Plan::Batch(b) => b.writes.iter().any(|w| {
                    tables.contains(&w.table.id) || keyspace == Some(w.table.keyspace.as_str())
                }),
                Plan::Transaction(t) => {
                    let (read, written) = t.tables();
                    read.iter()
                        .chain(&written)
                        .any(|t| tables.contains(&t.id) || keyspace == Some(t.keyspace.as_str()))
                }
                _ => false,
            };
            !(by_table || by_ks || batch_hit)
        });
        self.cache_generation.fetch_add(1, Ordering::AcqRel);
    }

    /// How many statements the cache holds (bounded by its capacity).
    pub fn cached_statements(&self) -> usize {
        self.cache.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The statement prepared under this id, for EXECUTE.
    pub fn prepared(&self, id: &[u8]) -> Option<Arc<Prepared>> {
        let id: [u8; 16] = id.try_into().ok()?;
        self.lookup(&id)
    }

    /// The RESULT Prepared message for a statement. `lwt` is set for conditional
    /// statements; the server clears it on connections that did not negotiate the mark.
    pub fn prepared_result(&self, p: &Prepared) -> ResultMessage {
        // A statement without result columns (a write) says so with No_metadata.
        let result_metadata = RowsMetadata {
            columns: p.result_columns.clone(),
            column_count: p.result_columns.len(),
            paging_state: None,
            no_metadata: p.result_columns.is_empty(),
        };
        ResultMessage::Prepared {
            id: Bytes::copy_from_slice(&p.id),
            metadata: PreparedMetadata {
                columns: p.bind_specs.clone(),
                pk_indexes: p.pk_indexes.clone(),
                lwt: p.lwt,
            },
            result_metadata,
        }
    }

    /// [`Engine::route`] for a request's parameters: named values are put in marker
    /// order first, so that the token is computed from the right values.
    pub fn route_params(
        &self,
        p: &Prepared,
        params: &QueryParameters,
    ) -> Result<Route, DetailedError> {
        let values = exec::order_values(p, params)?;
        self.route(p, &values)
    }

    /// The statement's `USING TIMEOUT`, if any: decided once at analysis when constant,
    /// bound from `values` when a marker. Cheap, so that the deadline check can run
    /// before any routing work. Values are positional.
    #[inline]
    pub fn timeout<V: BoundValues + ?Sized>(
        &self,
        p: &Prepared,
        values: &V,
    ) -> Result<Option<Duration>, DetailedError> {
        match &p.const_timeout {
            Some(Ok(decided)) => Ok(*decided),
            _ => Self::bound_timeout(p, values),
        }
    }

    /// [`Engine::timeout`] of a statement whose timeout is not decided by its text alone.
    fn bound_timeout<V: BoundValues + ?Sized>(
        p: &Prepared,
        values: &V,
    ) -> Result<Option<Duration>, DetailedError> {
        if let Some(decided) = &p.const_timeout {
            return decided.clone();
        }
        match p.plan.timeout() {
            // A marker is decoded where it lies; null and unset mean no timeout.
            Some(analyze::Val::Bind(i)) => match values.value(*i) {
                Some(ValueRef::Set(bytes)) => exec::decode_timeout(bytes).map(Some),
                _ => Ok(None),
            },
            // A duration marker never involves "now".
            Some(v) => {
                values.with_decoded(|values| exec::timeout_of(&exec::Binder::new(values, 0), v))
            }
            None => Ok(None),
        }
    }

    /// Routing information without executing: token of the single partition touched (if
    /// any), table, operation kind and `USING TIMEOUT`. Values are positional (see
    /// [`Engine::route_params`] for named values).
    pub fn route(
        &self,
        p: &Prepared,
        values: &[sluice_protocol::Value],
    ) -> Result<Route, DetailedError> {
        let timeout = self.timeout(p, values)?;
        Ok(self.route_with_timeout(p, values, timeout))
    }

    /// [`Engine::route`] for a caller that already has the statement's [`Engine::timeout`]
    /// (the server decides the deadline before routing), so it is not bound twice.
    #[inline]
    pub fn route_with_timeout<V: BoundValues + ?Sized>(
        &self,
        p: &Prepared,
        values: &V,
        timeout: Option<Duration>,
    ) -> Route {
        let (table, where_) = match &p.plan {
            Plan::Select(s) => (Some(&s.table), Some(&s.where_)),
            Plan::Write(w) => (Some(&w.table), Some(&w.where_)),
            Plan::Batch(bp) => (bp.writes.first().map(|w| &w.table), None),
            Plan::Transaction(_) | Plan::Dynamic(_) => (None, None),
        };
        let route = Route {
            token: None,
            table: table.map(|t| *t.id.as_bytes()),
            kind: p.kind,
            timeout,
            rate_limits: table.and_then(|t| t.options.per_partition_rate_limit),
        };
        // The common statement: one partition key column bound or constant, hashed where it
        // lies, with neither the clock nor a binder.
        if let (Some(t), Some(w)) = (table, where_) {
            if !p.set_or_map_markers && !t.is_virtual() {
                if let Some(token) = exec::single_column_key_token(values, w) {
                    return Route {
                        token: Some(token),
                        ..route
                    };
                }
            }
        }
        values.with_decoded(|values| Self::route_bound(p, values, route, table, where_))
    }

    /// [`Engine::route_with_timeout`] of any other statement: its partition key bound with
    /// canonical values and "now".
    fn route_bound(
        p: &Prepared,
        values: &[sluice_protocol::Value],
        mut route: Route,
        table: Option<&Arc<TableDef>>,
        where_: Option<&analyze::Where>,
    ) -> Route {
        // The clock is read only when a partition key calls now(), uuid()...
        let now = match (&p.plan, where_) {
            (Plan::Batch(_), _) => now_micros(),
            (_, Some(w)) if exec::pk_uses_now(w) => now_micros(),
            _ => 0,
        };
        let values = exec::canonical_positional(p, values);
        let b = exec::Binder::new(&values, now);
        if let (Some(t), Some(w)) = (table, where_) {
            if !t.is_virtual() && w.pk_complete() {
                if let Some(Ok(token)) = exec::single_partition_token(&b, t, w) {
                    route.token = Some(token);
                } else if let Ok(keys) = exec::partition_keys(&b, t, w) {
                    // `IN` with a single distinct value.
                    if let [k] = &keys[..] {
                        route.token = Some(k.token);
                    }
                }
            }
        }
        if let Plan::Batch(bp) = &p.plan {
            route.token = exec::single_batch_token(&b, bp.writes.iter());
        }
        route
    }

    /// Executes a prepared (or cached unprepared) statement.
    pub async fn execute(
        &self,
        session: &mut Session,
        p: &Prepared,
        params: &QueryParameters,
        ctx: &RequestContext,
    ) -> Result<ResultMessage, DetailedError> {
        if params.serial_consistency.is_some_and(|c| !c.is_serial()) {
            return Err(catalog::invalid(
                "Invalid serial consistency level: only SERIAL and LOCAL_SERIAL are allowed",
            ));
        }
        let values = exec::order_values(p, params)?;
        exec::validate_values(p, &values)?;
        self.execute_bound(session, p, &values, params, ctx, true)
            .await
    }

    /// The partitions an LWT, SERIAL read or transaction reads through the transaction log
    /// (which only a replica of them all may coordinate), with its error for a forwarded
    /// statement's silence; `None` for every other statement, or when binding fails (the
    /// statement's own path then answers the error).
    fn txn_reads<'p>(
        &self,
        p: &'p Prepared,
        b: &exec::Binder<'_>,
        params: &QueryParameters,
    ) -> Option<TxnReads<'p>> {
        let keyed = |t: &'p Arc<catalog::TableDef>, w: &analyze::Where| {
            let keys = exec::partition_keys(b, t, w).ok()?;
            Some(
                keys.into_iter()
                    .map(|k| (&**t, k.token))
                    .collect::<Vec<_>>(),
            )
        };
        match &p.plan {
            Plan::Select(s) if params.consistency.is_serial() => {
                if s.table.is_virtual() || !s.where_.pk_complete() {
                    return None;
                }
                self.txn_log_for(std::iter::once(&*s.table))?;
                Some((keyed(&s.table, &s.where_)?, exec::read_timeout))
            }
            Plan::Write(w) if w.condition.is_some() => {
                self.txn_log_for(std::iter::once(&*w.table))?;
                let reads = keyed(&w.table, &w.where_)?;
                // An IN is refused by the LWT's own path, here as on any replica.
                (reads.len() == 1).then_some((reads, transaction::replicated::cas_timeout))
            }
            Plan::Batch(bp) if p.lwt => {
                self.txn_log_for(bp.writes.iter().map(|w| &*w.table))?;
                let mut reads = Vec::new();
                for w in &bp.writes {
                    reads.extend(keyed(&w.table, &w.where_)?);
                }
                Some((reads, transaction::replicated::cas_timeout))
            }
            Plan::Transaction(t) => {
                let (read_tables, write_tables) = t.tables();
                self.txn_log_for(read_tables.into_iter().chain(write_tables).map(|t| &**t))?;
                Some((transaction::read_partitions(t, b).ok()?, t.timeout_kind()))
            }
            _ => None,
        }
    }

    /// Runs a statement with its values in marker order; with `may_forward`, a statement
    /// whose partitions this node does not hold runs on a replica of them (a replica running
    /// a forwarded statement never forwards it again).
    async fn execute_bound(
        &self,
        session: &mut Session,
        p: &Prepared,
        values: &[sluice_protocol::Value],
        params: &QueryParameters,
        ctx: &RequestContext,
        may_forward: bool,
    ) -> Result<ResultMessage, DetailedError> {
        let b = exec::Binder::new(values, ctx.now_micros);
        if may_forward {
            if let Some(transport) = self.replica_transport() {
                if let Some((reads, timeout)) = self.txn_reads(p, &b, params) {
                    if remote_read::txn_needs_forwarding(self, &reads) {
                        return Box::pin(remote_read::forward_txn(
                            self, transport, p, &reads, values, params, ctx, timeout,
                        ))
                        .await;
                    }
                }
            }
        }
        match &p.plan {
            Plan::Select(s) => {
                if params.consistency.is_serial() {
                    // Linearizable: the read reflects every transaction committed before it.
                    transaction::replicated::serial_read_barrier(
                        self,
                        &s.table,
                        &b,
                        &s.where_,
                        params.consistency,
                        ctx,
                    )
                    .await?;
                }
                self.select(p, s, values, &b, params, ctx, may_forward)
                    .await
            }
            Plan::Write(w) => {
                let entries = [(w.as_ref(), &b)];
                if w.condition.is_some() {
                    write::execute_conditional(
                        self,
                        &entries,
                        None,
                        params.default_timestamp,
                        params.consistency,
                        params.skip_metadata,
                        ctx,
                    )
                    .await
                } else {
                    write::execute_writes(
                        self,
                        &entries,
                        None,
                        params.default_timestamp,
                        params.consistency,
                        ctx,
                        sluice_protocol::WriteType::Simple,
                    )
                    .await
                }
            }
            Plan::Batch(bp) => {
                write::check_batch_kind(bp.kind, bp.writes.iter())?;
                let entries: Vec<_> = bp.writes.iter().map(|w| (w, &b)).collect();
                let ts = match &bp.timestamp {
                    Some(v) => exec::opt_i64(&b, v, "[timestamp]")?,
                    None => None,
                };
                if p.lwt {
                    return write::execute_conditional(
                        self,
                        &entries,
                        ts,
                        params.default_timestamp,
                        params.consistency,
                        params.skip_metadata,
                        ctx,
                    )
                    .await;
                }
                write::execute_writes(
                    self,
                    &entries,
                    ts,
                    params.default_timestamp,
                    params.consistency,
                    ctx,
                    write::batch_write_type(bp.kind),
                )
                .await
            }
            Plan::Transaction(t) => transaction::execute(self, p, t, &b, params, ctx).await,
            Plan::Dynamic(stmt) => self.execute_dynamic(session, p, stmt, params, ctx).await,
        }
    }

    /// Runs a SELECT as its coordinator: a partition this node does not hold is read on a
    /// replica (the whole statement forwarded, when `may_forward`), the others are made
    /// consistent at the level here and read locally.
    #[allow(clippy::too_many_arguments)]
    async fn select(
        &self,
        p: &Prepared,
        s: &analyze::SelectPlan,
        values: &[sluice_protocol::Value],
        b: &exec::Binder<'_>,
        params: &QueryParameters,
        ctx: &RequestContext,
        may_forward: bool,
    ) -> Result<ResultMessage, DetailedError> {
        if let Some(transport) = self.replica_transport() {
            let cluster = self.cluster.is_multi_node();
            if cluster && !s.table.is_virtual() && s.where_.pk_complete() {
                let keys = exec::partition_keys(b, &s.table, &s.where_)?;
                // One partition this node does not hold: the statement runs on a replica. Of
                // several (an IN), each that is not here is read on one of its replicas
                // (`remote_read::read_partition_slice`), each that is here is reconciled here.
                if may_forward && keys.len() == 1 {
                    let pk = &keys[0];
                    if !remote_read::reads_locally(self, &s.table, pk.token) {
                        return Box::pin(remote_read::forward_select(
                            self, transport, p, &s.table, pk.token, values, params, ctx,
                        ))
                        .await;
                    }
                }
                for pk in keys {
                    if !remote_read::reads_locally(self, &s.table, pk.token) {
                        continue;
                    }
                    // Boxed: a single node's read future stays as small as it was.
                    Box::pin(coordinator::reconcile_partition(
                        self,
                        transport,
                        &s.table,
                        pk.token,
                        &pk.key,
                        params.consistency,
                        ctx,
                    ))
                    .await?;
                }
            }
        }
        read::execute_select(self, p, s, b, params, ctx).await
    }

    /// Replica side of a forwarded statement (a SELECT, an LWT, a SERIAL read or a
    /// transaction): runs it here as its coordinator (never forwarding it again) and encodes
    /// its rows, Void or error as the reply.
    pub async fn serve_forwarded_statement(
        &self,
        body: &Bytes,
        deadline: Instant,
    ) -> Result<Bytes, coordinator::ReplicaRefusal> {
        use coordinator::ReplicaRefusal;
        let req = replica_msg::decode_forwarded_statement(body)
            .map_err(|e| ReplicaRefusal::Malformed(e.0))?;
        if Instant::now() >= deadline {
            return Err(ReplicaRefusal::Expired);
        }
        let answer = self.run_forwarded_statement(req, deadline).await;
        let reply = replica_msg::encode_forwarded_answer(&answer);
        if remote_read::forwarded_answer_fits(&reply) {
            return Ok(reply);
        }
        Ok(replica_msg::encode_forwarded_answer(&Err(catalog::invalid(
            "The result of this query is too large to pass between nodes; page it (set a fetch size)",
        ))))
    }

    async fn run_forwarded_statement(
        &self,
        req: replica_msg::ForwardedStatement,
        deadline: Instant,
    ) -> Result<replica_msg::ForwardedResult, DetailedError> {
        let p = self.prepare(req.keyspace.as_deref(), &req.query)?;
        if matches!(p.plan, Plan::Dynamic(_)) {
            return Err(catalog::invalid(
                "Only a SELECT, an LWT or a transaction is run for another node",
            ));
        }
        if req.serial_consistency.is_some_and(|c| !c.is_serial()) {
            return Err(catalog::invalid(
                "Invalid serial consistency level: only SERIAL and LOCAL_SERIAL are allowed",
            ));
        }
        let params = QueryParameters {
            consistency: req.consistency,
            values: req.values,
            names: None,
            skip_metadata: req.skip_metadata,
            page_size: req.page_size,
            paging_state: req.paging_state,
            serial_consistency: req.serial_consistency,
            default_timestamp: req.default_timestamp,
        };
        let values = exec::order_values(&p, &params)?;
        exec::validate_values(&p, &values)?;
        let ctx = RequestContext {
            deadline: Some(remote_read::forwarded_deadline(deadline)),
            now_micros: req.now_micros,
            ack_barrier: None,
        };
        let mut session = Session::default();
        match Box::pin(self.execute_bound(&mut session, &p, &values, &params, &ctx, false)).await? {
            ResultMessage::Rows(rows) => Ok(replica_msg::ForwardedResult::Rows(
                replica_msg::ForwardedRows {
                    row_count: rows.row_count,
                    column_count: rows.metadata.column_count as u32,
                    paging_state: rows.metadata.paging_state,
                    body: rows.body,
                },
            )),
            ResultMessage::Void => Ok(replica_msg::ForwardedResult::Void),
            _ => Err(DetailedError::new(
                DbError::ServerError,
                "A forwarded statement answered something other than rows or nothing",
            )),
        }
    }

    /// Replica side of a remote scan: one storage page of a token range of a table.
    pub async fn serve_scan(
        &self,
        body: &Bytes,
        deadline: Instant,
    ) -> Result<Bytes, coordinator::ReplicaRefusal> {
        use coordinator::ReplicaRefusal;
        let req = replica_msg::decode_scan(body).map_err(|e| ReplicaRefusal::Malformed(e.0))?;
        let t = self
            .table_by_id(&req.table)
            .ok_or(ReplicaRefusal::UnknownTable)?;
        if Instant::now() >= deadline {
            return Err(ReplicaRefusal::Expired);
        }
        remote_read::serve_scan(self, &t, &req, deadline)
            .await
            .map_err(|e| {
                ReplicaRefusal::Storage(match e.message {
                    std::borrow::Cow::Borrowed(m) => m,
                    std::borrow::Cow::Owned(_) => "the scan failed",
                })
            })
    }

    /// Replica side of a partition slice: this node's copy of one partition made consistent
    /// at the read's level, then the slice asked for.
    pub async fn serve_slice(
        &self,
        body: &Bytes,
        deadline: Instant,
    ) -> Result<Bytes, coordinator::ReplicaRefusal> {
        use coordinator::ReplicaRefusal;
        let req = replica_msg::decode_slice(body).map_err(|e| ReplicaRefusal::Malformed(e.0))?;
        let t = self
            .table_by_id(&req.table)
            .ok_or(ReplicaRefusal::UnknownTable)?;
        if Instant::now() >= deadline {
            return Err(ReplicaRefusal::Expired);
        }
        remote_read::serve_slice(self, &t, &req, deadline)
            .await
            .map_err(|e| {
                ReplicaRefusal::Storage(match e.message {
                    std::borrow::Cow::Borrowed(m) => m,
                    std::borrow::Cow::Owned(_) => "the partition read failed",
                })
            })
    }

    async fn execute_dynamic(
        &self,
        session: &mut Session,
        p: &Prepared,
        stmt: &sluice_cql::ast::Statement,
        params: &QueryParameters,
        ctx: &RequestContext,
    ) -> Result<ResultMessage, DetailedError> {
        use sluice_cql::ast::Statement;
        let ks = p.keyspace.as_deref();
        match stmt {
            Statement::Use(name) => {
                let schema = self.schema();
                if !schema.keyspaces.contains_key(name) {
                    return Err(catalog::invalid(format!(
                        "Keyspace '{name}' does not exist"
                    )));
                }
                session.keyspace = Some(name.clone());
                Ok(ResultMessage::SetKeyspace(name.clone()))
            }
            Statement::Describe(d) => describe::execute(self, ks, d, params),
            Statement::CreateRole(_)
            | Statement::AlterRole(_)
            | Statement::DropRole(_)
            | Statement::ListRoles(_)
            | Statement::GrantPermissions(_)
            | Statement::RevokePermissions(_)
            | Statement::ListPermissions(_)
            | Statement::GrantRole(_)
            | Statement::RevokeRole(_) => auth::execute_statement(self, session, stmt).await,
            Statement::Truncate(name) if self.is_multi_node() => {
                let t = ddl::truncate_target(&self.schema(), ks, name)?;
                let replicated =
                    coordinator::replication_of(self, &t) != sluice_ring::Replication::Local;
                match self.replica_transport().filter(|_| replicated) {
                    Some(transport) => {
                        truncate::everywhere(self, transport, &t, ctx.deadline).await
                    }
                    None => ddl::execute(self, ks, stmt, ctx.now_micros),
                }
            }
            other => {
                if let Some(d) = ctx.deadline {
                    if Instant::now() >= d {
                        return Err(exec::write_timeout(
                            params.consistency,
                            sluice_protocol::WriteType::Simple,
                        ));
                    }
                }
                let result = match self.schema_log() {
                    Some(log) => {
                        let deadline = ctx
                            .deadline
                            .unwrap_or_else(|| Instant::now() + DEFAULT_DDL_DEADLINE);
                        schema_group::execute(self, log, ks, other, ctx.now_micros, deadline)
                            .await?
                    }
                    None => ddl::execute(self, ks, other, ctx.now_micros)?,
                };
                if matches!(result, ResultMessage::SchemaChange(_)) {
                    auth::grant_creator_of(self, session, ks, other);
                }
                Ok(result)
            }
        }
    }

    /// Executes a BATCH request (entries are text or prepared ids, each with its values).
    pub async fn batch(
        &self,
        session: &mut Session,
        b: &BatchRequest,
        ctx: &RequestContext,
    ) -> Result<ResultMessage, DetailedError> {
        let kind = match b.batch_type {
            0 => sluice_cql::ast::BatchKind::Logged,
            1 => sluice_cql::ast::BatchKind::Unlogged,
            2 => sluice_cql::ast::BatchKind::Counter,
            _ => return Err(catalog::invalid("Unknown batch type")),
        };
        if b.serial_consistency.is_some_and(|c| !c.is_serial()) {
            return Err(catalog::invalid(
                "Invalid serial consistency level: only SERIAL and LOCAL_SERIAL are allowed",
            ));
        }
        let mut prepared = Vec::with_capacity(b.entries.len());
        for e in &b.entries {
            let p = match &e.statement {
                sluice_protocol::BatchQuery::Prepared(id) => {
                    self.prepared(id).ok_or_else(|| exec::unprepared(id))?
                }
                sluice_protocol::BatchQuery::Text(text) => {
                    let q = std::str::from_utf8(text)
                        .map_err(|_| catalog::invalid("Batch statement is not valid UTF-8"))?;
                    self.prepare(session.keyspace.as_deref(), q)?
                }
            };
            let Plan::Write(_) = &p.plan else {
                return Err(catalog::invalid("Invalid statement in batch: only UPDATE, INSERT and DELETE statements are allowed."));
            };
            if e.values.len() != p.bind_specs.len() {
                return Err(catalog::invalid(format!(
                    "There were {} markers(?) in CQL but {} bound variables",
                    p.bind_specs.len(),
                    e.values.len()
                )));
            }
            exec::validate_values(&p, &e.values)?;
            prepared.push((p, &e.values));
        }
        let binders: Vec<exec::Binder> = prepared
            .iter()
            .map(|(_, v)| exec::Binder::new(v, ctx.now_micros))
            .collect();
        let entries: Vec<(&analyze::WritePlan, &exec::Binder)> = prepared
            .iter()
            .zip(&binders)
            .map(|((p, _), b)| match &p.plan {
                Plan::Write(w) => (w.as_ref(), b),
                _ => unreachable!("checked above"),
            })
            .collect();
        write::check_batch_kind(kind, entries.iter().map(|(w, _)| *w))?;
        if prepared.iter().any(|(p, _)| p.lwt) {
            return write::execute_conditional(
                self,
                &entries,
                None,
                b.default_timestamp,
                b.consistency,
                false,
                ctx,
            )
            .await;
        }
        write::execute_writes(
            self,
            &entries,
            None,
            b.default_timestamp,
            b.consistency,
            ctx,
            write::batch_write_type(kind),
        )
        .await
    }

    /// Publishes a schema change: new snapshot, persisted, cache invalidated, event sent.
    fn commit_schema(
        &self,
        mut next: Schema,
        change: SchemaChange,
        tables: &[Uuid],
        keyspace: Option<&str>,
    ) -> Result<(), DetailedError> {
        next.version = next.digest();
        let json = serde_json::to_vec(&next.to_persisted())
            .map_err(|_| DetailedError::new(DbError::ServerError, "schema does not serialize"))?;
        self.storage
            .meta_put(SCHEMA_META_KEY, &json)
            .map_err(storage_error)?;
        {
            let mut g = self.schema.write().unwrap_or_else(|p| p.into_inner());
            *g = Arc::new(next);
        }
        self.invalidate(tables, keyspace);
        tracing::info!(change = ?change.change, target = ?change.target, "schema changed");
        let _ = self.events.send(change);
        Ok(())
    }

    /// Takes the DDL lock (DDL is rare; one at a time keeps copy-on-write simple).
    fn ddl_guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.ddl_lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A server-side write timestamp: `now`, but strictly greater than the last one handed
    /// out, so that successive writes without client timestamps never tie (as Cassandra's
    /// `ClientState.getTimestamp`).
    pub(crate) fn write_timestamp(&self, now_micros: i64) -> i64 {
        let mut last = self.last_write_ts.load(Ordering::Relaxed);
        loop {
            let next = now_micros.max(last.saturating_add(1));
            match self.last_write_ts.compare_exchange_weak(
                last,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(actual) => last = actual,
            }
        }
    }

    /// The next list-element key suffix (unique per engine).
    pub(crate) fn next_list_seq(&self) -> u64 {
        self.list_clock.fetch_add(1, Ordering::Relaxed)
    }

    /// Benchmark switch (`--lwt-serialize-through-durability`): when on, every LWT holds a
    /// per-token lock stripe until its write is durable, as before conditions were checked
    /// inside the storage commit, so that both can be measured in one run. Off by default.
    pub fn set_lwt_serialize_through_durability(&self, on: bool) {
        self.lwt_serialize_through_durability
            .store(on, Ordering::Relaxed);
    }

    /// Benchmark switch (`--txn-prepare-under-lock`): when on, a transaction converts and
    /// encodes every write under its locks, as RavenDB serialized commands under its write
    /// lock, so that both can be measured in one run. Off by default.
    pub fn set_txn_prepare_under_lock(&self, on: bool) {
        self.txn_prepare_under_lock.store(on, Ordering::Relaxed);
    }

    /// Whether the benchmark switch `--txn-prepare-under-lock` is on.
    pub(crate) fn txn_prepare_under_lock(&self) -> bool {
        self.txn_prepare_under_lock.load(Ordering::Relaxed)
    }

    /// The LWT's serializing stripe when the benchmark switch is on.
    pub(crate) fn lwt_durability_serializer(&self, token: i64) -> Option<&tokio::sync::Mutex<()>> {
        if !self
            .lwt_serialize_through_durability
            .load(Ordering::Relaxed)
        {
            return None;
        }
        let i = (token as u64 % self.lwt_serializer.len() as u64) as usize;
        self.lwt_serializer.get(i)
    }

    /// Keeps later server-assigned write timestamps above `ts`, one a conditional commit
    /// assigned, so that this node's writes after an LWT are ordered after it.
    pub(crate) fn note_write_timestamp(&self, ts: i64) {
        self.last_write_ts.fetch_max(ts, Ordering::Relaxed);
    }
}
