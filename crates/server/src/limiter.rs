//! The per-partition rate limiter of a shard.
//!
//! Each shard owns one [`RateLimiter`] (fixed-size table of counters from `sluice-overload`),
//! reached through `&mut self` with no lock. `pipeline/check.rs` consults it once per
//! operation, on the shard that owns the partition:
//!
//! * a single-partition statement is checked on the shard that owns its token: locally when
//!   the driver is shard-aware, else the check travels with the forwarded execution
//!   ([`LimitCheck`] in `shard::Forwarded`) and runs on the owner before execution;
//! * each partition of a multi-partition operation (`IN` read, text or protocol batch) is
//!   checked on its owner too: the receiving shard checks its own partitions and sends one
//!   [`LimitRequest`] per other owner (a round trip, paid only on limited tables), so a
//!   partition has exactly one counter whichever shard the operation arrives on.
//!
//! A write to a replicated table in a cluster is decided instead by
//! `Engine::decide_replicated_write` (one decision on the coordinator, from the admitted writes
//! every replica counts), and a read by `Engine::decide_replicated_read` (from the reads this
//! node admitted plus those the other replicas report through the read count exchange), so
//! that several coordinators share one limit.
//!
//! Tables without `per_partition_rate_limit` (or without a limit for the operation) never
//! reach the table. The random number is drawn once per operation on the receiving shard
//! (xorshift, no syscall) and carried with the forwarded request. A rejection allocates
//! nothing: the answer is a pre-encoded frame (0xF000 for connections that negotiated
//! `SCYLLA_RATE_LIMIT_ERROR`, Config_error otherwise).

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};

use sluice_engine::{Engine, LimitedPartition, OpKind};
use sluice_overload::{
    Decision, LimitKey, OpType, RateLimiter, RateLimiterConfig, TableLimitSnapshot, TableLimitStats,
};
use sluice_protocol::OperationType;

use crate::clock::ShardClock;
use crate::metrics::ShardMetrics;
use crate::shard::ShardCtx;
use tokio::sync::oneshot;

/// A table's storage id (its UUID's bytes), as in `sluice_engine::Route::table`.
pub type TableId = [u8; 16];

/// One operation on one partition, to be accounted and decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitCheck {
    /// The table.
    pub table: TableId,
    /// The partition's token.
    pub token: i64,
    /// Read or write.
    pub op: OpType,
    /// The table's limit for `op` (operations per second per partition).
    pub limit: u32,
    /// Uniform random number drawn once for this operation by the receiving shard.
    pub random: u32,
}

/// The limiter's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitDecision {
    /// Execute.
    Accept,
    /// Reject with the rate-limit error for this operation type; nothing is executed.
    Reject(OpType),
}

/// The operation type of a statement kind, if the limiter counts it.
#[inline]
pub fn op_type(kind: OpKind) -> Option<OpType> {
    match kind {
        OpKind::Read => Some(OpType::Read),
        OpKind::Write => Some(OpType::Write),
        _ => None,
    }
}

/// The protocol operation type of a limiter operation type.
#[inline]
pub fn protocol_op(op: OpType) -> OperationType {
    match op {
        OpType::Read => OperationType::Read,
        OpType::Write => OperationType::Write,
    }
}

/// Folds a table id into the limiter's 32-bit table key (ids are random UUIDs; a collision
/// only matters for two tables that also share a token).
#[inline]
fn table_key(id: &TableId) -> u32 {
    let mut k = 0u32;
    for c in id.chunks_exact(4) {
        k ^= u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    k
}

/// Per-shard limiter state (owned by the shard thread).
pub struct ShardLimiter {
    limiter: RateLimiter,
    clock: ShardClock,
    rng: u64,
    /// Shard-local view of this shard's per-table counters (bounded by the number of tables).
    tables: HashMap<TableId, Arc<TableLimitStats>>,
    /// The table of the last operation and its counters: a hot table is checked again and
    /// again, and this spares the hashing of its id.
    last_table: Option<(TableId, Arc<TableLimitStats>)>,
    checked: u64,
}

impl ShardLimiter {
    /// A limiter with a table sized by `config`; `shard` decorrelates the shards' randoms.
    pub fn new(config: RateLimiterConfig, shard: usize) -> ShardLimiter {
        Self::with_clock(config, shard, ShardClock::system())
    }

    /// [`Self::new`], reading the windows' wall time from `clock` (its `ShardCtx`'s).
    pub fn with_clock(config: RateLimiterConfig, shard: usize, clock: ShardClock) -> ShardLimiter {
        let mut h = RandomState::new().build_hasher();
        h.write_usize(shard);
        ShardLimiter {
            limiter: RateLimiter::new(config),
            clock,
            // xorshift must not start at zero.
            rng: h.finish() | 1,
            tables: HashMap::new(),
            last_table: None,
            checked: 0,
        }
    }

    /// Draws the operation's uniform random number (xorshift64*, no syscall).
    #[inline]
    pub fn draw(&mut self) -> u32 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32
    }

    /// A check for `p`, with a freshly drawn random number.
    pub fn check_for(&mut self, p: &LimitedPartition) -> Option<LimitCheck> {
        Some(LimitCheck {
            table: p.table,
            token: p.token,
            op: op_type(p.kind)?,
            limit: p.limit,
            random: self.draw(),
        })
    }

    /// Accounts one operation and decides; counts the decision in the table's counters.
    pub fn check(
        &mut self,
        c: &LimitCheck,
        engine: &Engine,
        metrics: &ShardMetrics,
    ) -> LimitDecision {
        self.checked += 1;
        let key = LimitKey {
            token: c.token,
            table: table_key(&c.table),
            op: c.op,
        };
        let wall = self.clock.wall();
        let stats = match &mut self.last_table {
            Some((id, stats)) if *id == c.table => stats,
            last => {
                let stats = match self.tables.get(&c.table) {
                    Some(s) => s.clone(),
                    None => {
                        // First operation on this table on this shard: register its counters,
                        // and forget dropped tables so that both maps stay bounded by the
                        // schema.
                        let s = metrics.rate_limits.register(engine, &c.table);
                        let live = &metrics.rate_limits;
                        self.tables.retain(|id, _| live.contains(id));
                        self.tables.entry(c.table).or_insert(s).clone()
                    }
                };
                &mut last.insert((c.table, stats)).1
            }
        };
        // A replicated table's operations are decided once, on the coordinator, from the
        // admitted writes every replica counts, or the admitted reads the replicas exchange
        // (so several coordinators share one limit).
        let replicated = match c.op {
            OpType::Write => engine.decide_replicated_write(&c.table, c.token, c.limit),
            OpType::Read => engine.decide_replicated_read(&c.table, c.token, c.limit),
        };
        if let Some(accept) = replicated {
            let decision = if accept {
                Decision::Accept
            } else {
                Decision::Reject
            };
            stats.record(c.op, decision);
            return match decision {
                Decision::Accept => LimitDecision::Accept,
                Decision::Reject => LimitDecision::Reject(c.op),
            };
        }
        match self
            .limiter
            .check(key, Some(c.limit), c.random, wall, stats)
        {
            Decision::Accept => LimitDecision::Accept,
            Decision::Reject => LimitDecision::Reject(c.op),
        }
    }

    /// Operations accounted by the limiter on this shard (limited tables only).
    pub fn checked(&self) -> u64 {
        self.checked
    }

    /// Bytes of the counter table (constant for the shard's life).
    pub fn memory_bytes(&self) -> usize {
        self.limiter.memory_bytes()
    }
}

/// Checks sent to the shard that owns their partitions (multi-partition operations).
#[derive(Debug)]
pub struct LimitRequest {
    /// The operations to account, all on partitions the receiving shard owns.
    pub checks: Vec<LimitCheck>,
    /// The verdict: the first rejection, else accept.
    pub reply: oneshot::Sender<LimitDecision>,
}

/// Runs a [`LimitRequest`] on the owning shard (synchronous: no await between the checks).
pub fn run_request(ctx: &ShardCtx, req: LimitRequest) {
    let mut limiter = ctx.limiter.borrow_mut();
    let mut decision = LimitDecision::Accept;
    for c in &req.checks {
        if let d @ LimitDecision::Reject(_) = limiter.check(c, &ctx.engine, &ctx.metrics) {
            decision = d;
            break;
        }
    }
    let _ = req.reply.send(decision);
}

/// Accounts every partition of a multi-partition operation (an `IN` read or a batch) on the
/// shard that owns it, each with its own random number: this shard's partitions here, the
/// others through one [`LimitRequest`] per owner. The operation is rejected if any partition
/// is. An owner that has stopped (shutdown) does not reject.
pub async fn check_partitions(shard: &ShardCtx, parts: &[LimitedPartition]) -> LimitDecision {
    let mut remote: Vec<(usize, Vec<LimitCheck>)> = Vec::new();
    {
        let mut limiter = shard.limiter.borrow_mut();
        for p in parts {
            let Some(c) = limiter.check_for(p) else {
                continue;
            };
            let owner = shard.owner_of(p.token);
            if owner == shard.id {
                if let d @ LimitDecision::Reject(_) =
                    limiter.check(&c, &shard.engine, &shard.metrics)
                {
                    return d;
                }
            } else if let Some((_, v)) = remote.iter_mut().find(|(o, _)| *o == owner) {
                v.push(c);
            } else {
                remote.push((owner, vec![c]));
            }
        }
    }
    let mut replies = Vec::with_capacity(remote.len());
    for (owner, checks) in remote {
        let Some(peer) = shard.peers.get(owner) else {
            continue;
        };
        let (reply, rx) = oneshot::channel();
        if peer
            .limits
            .send(LimitRequest { checks, reply })
            .await
            .is_ok()
        {
            replies.push(rx);
        }
    }
    let mut decision = LimitDecision::Accept;
    for rx in replies {
        if let Ok(d @ LimitDecision::Reject(_)) = rx.await {
            decision = d;
        }
    }
    decision
}

/// One table's counters on one shard, with the names used as metric labels.
#[derive(Debug)]
struct TableCounters {
    id: TableId,
    keyspace: String,
    table: String,
    stats: Arc<TableLimitStats>,
}

/// A shard's per-table accepted/rejected counters, readable by the metrics endpoint.
/// Written only on a table's first limited operation on the shard (the hot path keeps its
/// own `Arc` in [`ShardLimiter`]).
#[derive(Debug, Default)]
pub struct LimitMetrics {
    tables: Mutex<Vec<TableCounters>>,
}

impl LimitMetrics {
    fn register(&self, engine: &Engine, id: &TableId) -> Arc<TableLimitStats> {
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = tables.iter().find(|t| &t.id == id) {
            return t.stats.clone();
        }
        let schema = engine.schema();
        tables.retain(|t| schema.tables.values().any(|d| d.id.as_bytes() == &t.id));
        let (keyspace, table) = schema
            .tables
            .values()
            .find(|t| t.id.as_bytes() == id)
            .map(|t| (t.keyspace.clone(), t.name.clone()))
            .unwrap_or_else(|| (String::new(), "(dropped)".to_string()));
        let stats = Arc::new(TableLimitStats::default());
        tables.push(TableCounters {
            id: *id,
            keyspace,
            table,
            stats: stats.clone(),
        });
        stats
    }

    fn contains(&self, id: &TableId) -> bool {
        let tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        tables.iter().any(|t| &t.id == id)
    }

    /// This shard's counters, by (keyspace, table).
    pub fn snapshot(&self) -> Vec<(String, String, TableLimitSnapshot)> {
        let tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        tables
            .iter()
            .map(|t| (t.keyspace.clone(), t.table.clone(), t.stats.snapshot()))
            .collect()
    }
}

/// A Prometheus label value: `\`, `"` and newlines escaped (quoted CQL names may hold them).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Appends `sluice_rate_limit_{accepted,rejected}_total{keyspace,table,op}`, summed over
/// shards, in the Prometheus text format.
pub fn render(out: &mut String, shards: &[Arc<ShardMetrics>]) {
    let mut sum: BTreeMap<(String, String), TableLimitSnapshot> = BTreeMap::new();
    for m in shards {
        for (ks, t, s) in m.rate_limits.snapshot() {
            let e = sum.entry((escape(&ks), escape(&t))).or_default();
            e.read_accepted += s.read_accepted;
            e.read_rejected += s.read_rejected;
            e.write_accepted += s.write_accepted;
            e.write_rejected += s.write_rejected;
        }
    }
    for (name, help, accepted) in [
        (
            "sluice_rate_limit_accepted_total",
            "Operations accepted by the per-partition rate limiter, by table and operation.",
            true,
        ),
        (
            "sluice_rate_limit_rejected_total",
            "Operations rejected by the per-partition rate limiter, by table and operation.",
            false,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for ((ks, t), s) in &sum {
            let (r, w) = if accepted {
                (s.read_accepted, s.write_accepted)
            } else {
                (s.read_rejected, s.write_rejected)
            };
            let _ = writeln!(
                out,
                "{name}{{keyspace=\"{ks}\",table=\"{t}\",op=\"read\"}} {r}"
            );
            let _ = writeln!(
                out,
                "{name}{{keyspace=\"{ks}\",table=\"{t}\",op=\"write\"}} {w}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    #[test]
    fn xorshift_draws_spread_over_u32() {
        let mut l = ShardLimiter::new(RateLimiterConfig::default(), 3);
        let n = 100_000u32;
        let mut below_half = 0u32;
        let mut prev = l.draw();
        let mut repeats = 0;
        for _ in 0..n {
            let x = l.draw();
            below_half += u32::from(x < u32::MAX / 2);
            repeats += u32::from(x == prev);
            prev = x;
        }
        // Uniform: about half below the midpoint (6 sigma is ~950), no stuck state.
        assert!(
            (below_half as i64 - (n / 2) as i64).abs() < 1_000,
            "{below_half}"
        );
        assert_eq!(repeats, 0);
    }

    #[test]
    fn table_key_distinguishes_ids() {
        let a = [1u8; 16];
        let mut b = a;
        b[15] = 2;
        assert_ne!(table_key(&a), table_key(&b));
    }

    fn engine() -> (Arc<Engine>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let storage = sluice_storage::Storage::open(sluice_storage::StorageConfig {
            path: dir.path().to_path_buf(),
            durability: sluice_storage::Durability::Periodic {
                interval: std::time::Duration::from_millis(50),
            },
            cache_bytes: 8 << 20,
            stores: 1,
        })
        .unwrap();
        let node = sluice_engine::NodeInfo::single(
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            9042,
            uuid::Uuid::from_u128(9),
        );
        (Engine::open(storage, node).unwrap(), dir)
    }

    #[tokio::test]
    async fn hot_partition_is_rejected_and_counted_per_table() {
        let (e, _dir) = engine();
        for q in [
            "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
            "CREATE TABLE ks.hot (pk int PRIMARY KEY, v int) WITH per_partition_rate_limit = {'max_writes_per_second': 5}",
        ] {
            let p = e.prepare(None, q).unwrap();
            e.execute(
                &mut sluice_engine::Session::default(),
                &p,
                &Default::default(),
                &sluice_engine::RequestContext::now(),
            )
            .await
            .unwrap();
        }
        let table = *e.table("ks", "hot").unwrap().id.as_bytes();
        let metrics = ShardMetrics::default();
        let mut l = ShardLimiter::new(RateLimiterConfig::default(), 0);
        let mut verdicts = Vec::new();
        for _ in 0..200 {
            let c = LimitCheck {
                table,
                token: 42,
                op: OpType::Write,
                limit: 5,
                random: l.draw(),
            };
            verdicts.push(l.check(&c, &e, &metrics));
        }
        // Within a second or two: the burst of L, then (nearly) everything rejected.
        let accepted = verdicts
            .iter()
            .filter(|d| **d == LimitDecision::Accept)
            .count();
        assert!((5..=15).contains(&accepted), "{accepted} accepted");
        assert_eq!(verdicts[0], LimitDecision::Accept);
        assert!(verdicts.contains(&LimitDecision::Reject(OpType::Write)));
        // Another partition of the same table is not affected.
        let c = LimitCheck {
            table,
            token: 43,
            op: OpType::Write,
            limit: 5,
            random: l.draw(),
        };
        assert_eq!(l.check(&c, &e, &metrics), LimitDecision::Accept);
        assert_eq!(l.checked(), 201);
        let snap = metrics.rate_limits.snapshot();
        assert_eq!(snap.len(), 1);
        let (ks, t, s) = &snap[0];
        assert_eq!((ks.as_str(), t.as_str()), ("ks", "hot"));
        assert_eq!(s.write_accepted, accepted as u64 + 1);
        assert_eq!(s.write_rejected, 200 - accepted as u64);
        assert_eq!(s.read_accepted + s.read_rejected, 0);
        let mut out = String::new();
        render(&mut out, &[Arc::new(metrics)]);
        assert!(out.contains(&format!(
            "sluice_rate_limit_rejected_total{{keyspace=\"ks\",table=\"hot\",op=\"write\"}} {}",
            200 - accepted
        )));
    }

    /// Counts this thread's allocations (the harness's other threads do not disturb it).
    struct Counting;

    thread_local! {
        static ALLOCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    unsafe impl std::alloc::GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
            unsafe { std::alloc::System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
            unsafe { std::alloc::System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(
            &self,
            ptr: *mut u8,
            layout: std::alloc::Layout,
            new_size: usize,
        ) -> *mut u8 {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
            unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    fn allocations() -> u64 {
        ALLOCS.with(|c| c.get())
    }

    async fn engine_with(queries: &[&str]) -> (Arc<Engine>, tempfile::TempDir) {
        let (e, dir) = engine();
        for q in queries {
            let p = e.prepare(None, q).unwrap();
            e.execute(
                &mut sluice_engine::Session::default(),
                &p,
                &Default::default(),
                &sluice_engine::RequestContext::now(),
            )
            .await
            .unwrap();
        }
        (e, dir)
    }

    #[tokio::test]
    async fn reject_path_allocates_nothing_and_dropped_tables_are_forgotten() {
        let (e, _dir) = engine_with(&[
            "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
            "CREATE TABLE ks.a (pk int PRIMARY KEY, v int) WITH per_partition_rate_limit = {'max_reads_per_second': 1}",
            "CREATE TABLE ks.b (pk int PRIMARY KEY, v int) WITH per_partition_rate_limit = {'max_reads_per_second': 1}",
        ])
        .await;
        let metrics = ShardMetrics::default();
        let mut l = ShardLimiter::new(RateLimiterConfig::default(), 1);
        let a = *e.table("ks", "a").unwrap().id.as_bytes();
        let check = |l: &mut ShardLimiter, table| LimitCheck {
            table,
            token: 7,
            op: OpType::Read,
            limit: 1,
            random: l.draw(),
        };
        // Warm up: the table's counters are registered on its first operation.
        let c = check(&mut l, a);
        assert_eq!(l.check(&c, &e, &metrics), LimitDecision::Accept);
        let mut out = BytesMut::with_capacity(4096);
        let frames = sluice_protocol::PreencodedErrors::new();
        let before = allocations();
        let mut rejected = 0;
        for stream in 0..50i16 {
            let c = check(&mut l, a);
            if let LimitDecision::Reject(op) = l.check(&c, &e, &metrics) {
                frames
                    .rate_limit(protocol_op(op), true)
                    .append(&mut out, stream);
                rejected += 1;
            }
        }
        assert_eq!(allocations() - before, 0, "the reject path allocated");
        assert!(rejected >= 45, "{rejected} rejected");
        // The typed error for negotiated connections, Config_error otherwise.
        assert_eq!(&out[9..13], &[0, 0, 0xF0, 0]);
        let config = frames
            .rate_limit(protocol_op(OpType::Read), false)
            .as_bytes();
        assert_eq!(&config[9..13], &[0, 0, 0x23, 0]);

        // A dropped table's counters go away when the next table registers.
        let mut s = sluice_engine::Session::default();
        let p = e.prepare(None, "DROP TABLE ks.a").unwrap();
        e.execute(
            &mut s,
            &p,
            &Default::default(),
            &sluice_engine::RequestContext::now(),
        )
        .await
        .unwrap();
        let b = *e.table("ks", "b").unwrap().id.as_bytes();
        let c = check(&mut l, b);
        l.check(&c, &e, &metrics);
        let names: Vec<String> = metrics
            .rate_limits
            .snapshot()
            .into_iter()
            .map(|(_, t, _)| t)
            .collect();
        assert_eq!(names, vec!["b".to_string()]);
        assert_eq!(l.tables.len(), 1);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("x\ny"), "x\\ny");
    }

    #[test]
    fn op_types_follow_statement_kinds() {
        assert_eq!(op_type(OpKind::Read), Some(OpType::Read));
        assert_eq!(op_type(OpKind::Write), Some(OpType::Write));
        assert_eq!(op_type(OpKind::Range), None);
        assert_eq!(op_type(OpKind::Schema), None);
    }
}
