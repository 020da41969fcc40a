//! Per-shard counters and a minimal Prometheus text endpoint (`GET /metrics`, HTTP/1.0).
//!
//! Each shard only writes its own [`ShardMetrics`] (relaxed atomics, no contention); the
//! endpoint reads all of them. Metric names use the `sluice_` prefix in snake case.

use sluice_engine::replica_stats::{RefusalReason, ReplicaVerb};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Request opcodes and their names, as counted (v4 §2.4).
const OPCODES: [(u8, &str); 8] = [
    (0x01, "startup"),
    (0x05, "options"),
    (0x07, "query"),
    (0x09, "prepare"),
    (0x0A, "execute"),
    (0x0B, "register"),
    (0x0D, "batch"),
    (0x0F, "auth_response"),
];

/// Error codes counted individually; anything else lands in `other`.
const ERROR_CODES: [(u32, &str); 16] = [
    (0x0000, "server_error"),
    (0x000A, "protocol_error"),
    (0x0100, "bad_credentials"),
    (0x1000, "unavailable"),
    (0x1001, "overloaded"),
    (0x1100, "write_timeout"),
    (0x1200, "read_timeout"),
    (0x1300, "read_failure"),
    (0x1500, "write_failure"),
    (0x2000, "syntax_error"),
    (0x2100, "unauthorized"),
    (0x2200, "invalid"),
    (0x2300, "config_error"),
    (0x2400, "already_exists"),
    (0x2500, "unprepared"),
    (0xF000, "rate_limit"),
];

/// Index of Overloaded in `ERROR_CODES` (checked at compile time).
const OVERLOADED_INDEX: usize = 4;
const _: () = assert!(ERROR_CODES[OVERLOADED_INDEX].0 == 0x1001);

/// Each opcode's index in `OPCODES` (`OPCODES.len()` for the others), by opcode: every
/// request is counted, so its counter is found by one load instead of a search.
const OPCODE_INDEX: [u8; 16] = {
    let mut table = [OPCODES.len() as u8; 16];
    let mut i = 0;
    while i < OPCODES.len() {
        assert!((OPCODES[i].0 as usize) < table.len());
        table[OPCODES[i].0 as usize] = i as u8;
        i += 1;
    }
    table
};

/// The index of `code` in `ERROR_CODES` (`ERROR_CODES.len()` for the others): a binary
/// search, which the table's order (checked at compile time) allows.
const fn error_index(code: u32) -> usize {
    let (mut lo, mut hi) = (0, ERROR_CODES.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        let at = ERROR_CODES[mid].0;
        if at == code {
            return mid;
        }
        if at < code {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    ERROR_CODES.len()
}

const _: () = {
    let mut i = 1;
    while i < ERROR_CODES.len() {
        assert!(ERROR_CODES[i - 1].0 < ERROR_CODES[i].0);
        i += 1;
    }
};

/// Counters of one shard.
#[derive(Debug, Default)]
pub struct ShardMetrics {
    requests: [AtomicU64; OPCODES.len() + 1],
    errors: [AtomicU64; ERROR_CODES.len() + 1],
    /// Requests answered with a non-error result.
    pub served: AtomicU64,
    /// Requests currently being processed on this shard (read, not yet answered).
    pub inflight: AtomicI64,
    /// Open client connections.
    pub connections: AtomicI64,
    /// Executions this shard sent to the owning shard of their partition.
    pub forwards_out: AtomicU64,
    /// Executions this shard ran for other shards.
    pub forwards_in: AtomicU64,
    /// Requests dropped before execution because their client disconnected.
    pub abandoned: AtomicU64,
    /// Connections closed because of a protocol violation.
    pub protocol_closes: AtomicU64,
    /// Times the reader stopped reading a socket because an in-flight cap was reached.
    pub backpressure_pauses: AtomicU64,
    /// Requests turned away with `Overloaded` by admission (queue full or shed for delay).
    pub rejected_overloaded: AtomicU64,
    /// Of `rejected_overloaded`, the writes turned away because they would wait too long
    /// for their group fsync (`AdmissionConfig::group_commit_wait`).
    pub rejected_group_commit: AtomicU64,
    /// Of `expired_before_execution`, the writes whose group fsync would end past their
    /// deadline.
    pub expired_group_commit: AtomicU64,
    /// Requests rejected by the per-partition rate limiter.
    pub rejected_rate_limited: AtomicU64,
    /// Requests whose deadline passed before they were executed (never executed).
    pub expired_before_execution: AtomicU64,
    /// Requests whose deadline passed during execution (answered with a timeout).
    pub timed_out: AtomicU64,
    /// Queued requests dropped because their client disconnected.
    pub dropped_disconnected: AtomicU64,
    /// Requests waiting in the admission queue.
    pub queued: AtomicI64,
    /// The event loop's lag at the last probe, microseconds (admission's hidden-delay signal).
    pub loop_lag_us: AtomicI64,
    /// The adaptive limit on requests in execution, at the last probe.
    pub concurrency_limit: AtomicI64,
    /// Executed requests whose latency fed the adaptive concurrency limit (requests turned
    /// away after dispatch are not among them).
    pub latency_samples: AtomicU64,
    /// Admission queue delay histogram: cumulative counts per `QUEUE_DELAY_BUCKETS_US`
    /// upper bound, then +Inf.
    queue_delay_buckets: [AtomicU64; QUEUE_DELAY_BUCKETS_US.len() + 1],
    /// Sum of observed queue delays in microseconds.
    queue_delay_sum_us: AtomicU64,
    /// Per-table accepted/rejected counters of the per-partition rate limiter.
    pub rate_limits: crate::limiter::LimitMetrics,
    /// Logins that succeeded.
    pub logins_succeeded: AtomicU64,
    /// Logins refused for a wrong user name or password (or a malformed token).
    pub logins_failed: AtomicU64,
    /// Logins refused unchecked because their address failed too often.
    pub logins_throttled: AtomicU64,
    /// TLS handshakes that failed (plaintext clients, refused client certificates).
    pub tls_handshake_failures: AtomicU64,
    /// Role and permission changes that succeeded (CREATE / ALTER / DROP ROLE, GRANT, REVOKE).
    pub auth_changes: AtomicU64,
}

/// Upper bounds (microseconds) of the queue-delay histogram buckets.
const QUEUE_DELAY_BUCKETS_US: [u64; 12] = [
    100, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000,
];

impl ShardMetrics {
    /// Counts one request with this opcode.
    #[inline]
    pub fn count_request(&self, opcode: u8) {
        let i = OPCODE_INDEX
            .get(usize::from(opcode))
            .map_or(OPCODES.len(), |&i| usize::from(i));
        self.requests[i].fetch_add(1, Relaxed);
    }

    /// Counts one `Overloaded` answer: a constant index, for the shed path.
    #[inline]
    pub fn count_overloaded_error(&self) {
        self.errors[OVERLOADED_INDEX].fetch_add(1, Relaxed);
    }

    /// Counts one error answer with this code.
    pub fn count_error(&self, code: u32) {
        self.errors[error_index(code)].fetch_add(1, Relaxed);
    }

    /// Counts one error answer with the code `CODE`, whose counter is found at compile time
    /// (the rejection paths).
    #[inline]
    pub fn count_error_code<const CODE: u32>(&self) {
        self.errors[const { error_index(CODE) }].fetch_add(1, Relaxed);
    }

    /// Requests counted with this opcode so far.
    pub fn requests_with_opcode(&self, opcode: u8) -> u64 {
        let i = OPCODES
            .iter()
            .position(|(op, _)| *op == opcode)
            .unwrap_or(OPCODES.len());
        self.requests[i].load(Relaxed)
    }

    /// Records one admission queue delay (no allocation; two relaxed adds).
    #[inline]
    pub fn observe_queue_delay(&self, delay: Duration) {
        // Whole seconds and the sub-second part apart: no 128-bit arithmetic per request.
        let us = delay
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(delay.subsec_micros()));
        let i = QUEUE_DELAY_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(QUEUE_DELAY_BUCKETS_US.len());
        self.queue_delay_buckets[i].fetch_add(1, Relaxed);
        self.queue_delay_sum_us
            .fetch_add(us.min(u64::MAX / 2), Relaxed);
    }

    /// Errors counted with this code so far.
    pub fn errors_with_code(&self, code: u32) -> u64 {
        let i = ERROR_CODES
            .iter()
            .position(|(c, _)| *c == code)
            .unwrap_or(ERROR_CODES.len());
        self.errors[i].load(Relaxed)
    }
}

/// Renders every shard's counters in the Prometheus text format.
pub fn render(shards: &[Arc<ShardMetrics>]) -> String {
    let mut out = String::with_capacity(4096);
    let n = "sluice_requests_total";
    family(
        &mut out,
        n,
        "counter",
        "Requests received, by shard and opcode.",
    );
    for (s, m) in shards.iter().enumerate() {
        for (i, (_, op)) in OPCODES.iter().enumerate() {
            let v = m.requests[i].load(Relaxed);
            let _ = writeln!(out, "{n}{{shard=\"{s}\",opcode=\"{op}\"}} {v}");
        }
        let v = m.requests[OPCODES.len()].load(Relaxed);
        let _ = writeln!(out, "{n}{{shard=\"{s}\",opcode=\"other\"}} {v}");
    }
    let n = "sluice_errors_total";
    family(
        &mut out,
        n,
        "counter",
        "Error responses, by shard and error code.",
    );
    for (s, m) in shards.iter().enumerate() {
        for (i, (_, code)) in ERROR_CODES.iter().enumerate() {
            let v = m.errors[i].load(Relaxed);
            let _ = writeln!(out, "{n}{{shard=\"{s}\",code=\"{code}\"}} {v}");
        }
        let v = m.errors[ERROR_CODES.len()].load(Relaxed);
        let _ = writeln!(out, "{n}{{shard=\"{s}\",code=\"other\"}} {v}");
    }
    let n = "sluice_queue_delay_seconds";
    family(
        &mut out,
        n,
        "histogram",
        "Admission queue delay of dispatched requests.",
    );
    for (s, m) in shards.iter().enumerate() {
        let mut cum = 0;
        for (i, b) in QUEUE_DELAY_BUCKETS_US.iter().enumerate() {
            cum += m.queue_delay_buckets[i].load(Relaxed);
            let le = *b as f64 / 1e6;
            let _ = writeln!(out, "{n}_bucket{{shard=\"{s}\",le=\"{le}\"}} {cum}");
        }
        cum += m.queue_delay_buckets[QUEUE_DELAY_BUCKETS_US.len()].load(Relaxed);
        let _ = writeln!(out, "{n}_bucket{{shard=\"{s}\",le=\"+Inf\"}} {cum}");
        let sum = m.queue_delay_sum_us.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{n}_sum{{shard=\"{s}\"}} {sum}");
        let _ = writeln!(out, "{n}_count{{shard=\"{s}\"}} {cum}");
    }
    let n = "sluice_rejected_total";
    family(
        &mut out,
        n,
        "counter",
        "Requests turned away, by shard and reason.",
    );
    type Counter = fn(&ShardMetrics) -> &AtomicU64;
    let reasons: [(&str, Counter); 5] = [
        ("overloaded", |m| &m.rejected_overloaded),
        ("rate_limited", |m| &m.rejected_rate_limited),
        ("expired_before_execution", |m| &m.expired_before_execution),
        ("timed_out", |m| &m.timed_out),
        ("client_disconnected", |m| &m.dropped_disconnected),
    ];
    for (s, m) in shards.iter().enumerate() {
        for (reason, get) in reasons {
            let v = get(m).load(Relaxed);
            let _ = writeln!(out, "{n}{{shard=\"{s}\",reason=\"{reason}\"}} {v}");
        }
    }
    let n = "sluice_group_commit_rejected_total";
    family(
        &mut out,
        n,
        "counter",
        "Writes turned away for their expected wait for the group fsync (also counted in sluice_rejected_total), by shard and answer.",
    );
    let answers: [(&str, Counter); 2] = [
        ("overloaded", |m| &m.rejected_group_commit),
        ("expired", |m| &m.expired_group_commit),
    ];
    for (s, m) in shards.iter().enumerate() {
        for (answer, get) in answers {
            let v = get(m).load(Relaxed);
            let _ = writeln!(out, "{n}{{shard=\"{s}\",answer=\"{answer}\"}} {v}");
        }
    }
    let n = "sluice_logins_total";
    family(
        &mut out,
        n,
        "counter",
        "Login attempts, by shard and outcome (throttled: refused unchecked after repeated failures from the address).",
    );
    let outcomes: [(&str, Counter); 3] = [
        ("succeeded", |m| &m.logins_succeeded),
        ("failed", |m| &m.logins_failed),
        ("throttled", |m| &m.logins_throttled),
    ];
    for (s, m) in shards.iter().enumerate() {
        for (outcome, get) in outcomes {
            let v = get(m).load(Relaxed);
            let _ = writeln!(out, "{n}{{shard=\"{s}\",outcome=\"{outcome}\"}} {v}");
        }
    }
    type Getter = fn(&ShardMetrics) -> i64;
    let simple: [(&str, &str, &str, Getter); 14] = [
        (
            "sluice_admission_queued",
            "gauge",
            "Requests waiting in the admission queue.",
            |m| m.queued.load(Relaxed),
        ),
        (
            "sluice_loop_lag_microseconds",
            "gauge",
            "How late the shard's event loop ran its lag probe, at the last probe.",
            |m| m.loop_lag_us.load(Relaxed),
        ),
        (
            "sluice_admission_concurrency_limit",
            "gauge",
            "Adaptive limit on requests in execution.",
            |m| m.concurrency_limit.load(Relaxed),
        ),
        (
            "sluice_served_total",
            "counter",
            "Requests answered with a result.",
            |m| m.served.load(Relaxed) as i64,
        ),
        ("sluice_inflight", "gauge", "Requests in flight.", |m| {
            m.inflight.load(Relaxed)
        }),
        (
            "sluice_connections",
            "gauge",
            "Open client connections.",
            |m| m.connections.load(Relaxed),
        ),
        (
            "sluice_admission_latency_samples_total",
            "counter",
            "Executed requests whose latency fed the adaptive concurrency limit.",
            |m| m.latency_samples.load(Relaxed) as i64,
        ),
        (
            "sluice_cross_shard_forwards_total",
            "counter",
            "Executions forwarded to the shard owning the partition.",
            |m| m.forwards_out.load(Relaxed) as i64,
        ),
        (
            "sluice_cross_shard_received_total",
            "counter",
            "Executions run on behalf of another shard.",
            |m| m.forwards_in.load(Relaxed) as i64,
        ),
        (
            "sluice_abandoned_total",
            "counter",
            "Requests dropped before execution because their client disconnected.",
            |m| m.abandoned.load(Relaxed) as i64,
        ),
        (
            "sluice_protocol_closes_total",
            "counter",
            "Connections closed for a protocol violation.",
            |m| m.protocol_closes.load(Relaxed) as i64,
        ),
        (
            "sluice_role_and_permission_changes_total",
            "counter",
            "Role and permission changes that succeeded (CREATE/ALTER/DROP ROLE, GRANT, REVOKE).",
            |m| m.auth_changes.load(Relaxed) as i64,
        ),
        (
            "sluice_tls_handshake_failures_total",
            "counter",
            "TLS handshakes that failed: plaintext clients on the TLS port, refused client certificates.",
            |m| m.tls_handshake_failures.load(Relaxed) as i64,
        ),
        (
            "sluice_backpressure_pauses_total",
            "counter",
            "Times a socket was not read because an in-flight cap was reached.",
            |m| m.backpressure_pauses.load(Relaxed) as i64,
        ),
    ];
    for (n, kind, help, get) in simple {
        family(&mut out, n, kind, help);
        for (s, m) in shards.iter().enumerate() {
            let _ = writeln!(out, "{n}{{shard=\"{s}\"}} {}", get(m));
        }
    }
    crate::limiter::render(&mut out, shards);
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Metrics rendered after the shards' (the node's transactions and coordinator), appended to
/// the text.
pub type ExtraMetrics = Arc<dyn Fn(&mut String) + Send + Sync>;

/// What this node did as a coordinator of replicated keyspaces, as the engine counts it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CoordinatorCounts {
    /// Partitions a read found differing across replicas and repaired.
    pub read_repairs: u64,
    /// Extra read requests sent because the first replicas were slow.
    pub speculative_reads: u64,
    /// The hints held for replicas that are down.
    pub hints: sluice_engine::coordinator::HintStats,
    /// Replica requests from other coordinators run here, per verb (in `ReplicaVerb` order).
    pub replica_served: [u64; ReplicaVerb::ALL.len()],
    /// Replica requests refused or failed here, per verb and reason (`RefusalReason` order).
    pub replica_refused: [[u64; RefusalReason::ALL.len()]; ReplicaVerb::ALL.len()],
    /// The read count exchange of the per-partition read limit.
    pub read_counts: sluice_engine::read_counts::ReadCountSnapshot,
}

impl CoordinatorCounts {
    /// The engine's counters now.
    pub fn of(engine: &sluice_engine::Engine) -> CoordinatorCounts {
        CoordinatorCounts {
            read_repairs: engine.read_repairs(),
            speculative_reads: engine.speculative_reads(),
            hints: engine.hint_stats(),
            replica_served: ReplicaVerb::ALL.map(|v| engine.replica_stats().served(v)),
            replica_refused: ReplicaVerb::ALL
                .map(|v| RefusalReason::ALL.map(|r| engine.replica_stats().refused(v, r))),
            read_counts: engine.read_count_stats(),
        }
    }
}

/// Renders the node's coordinator metrics: read repairs, speculative reads, hints.
pub fn render_coordinator(out: &mut String, c: &CoordinatorCounts) {
    let rows = [
        (
            "sluice_read_repairs_total",
            "counter",
            "Partitions a read found differing across replicas and repaired before answering.",
            c.read_repairs,
        ),
        (
            "sluice_speculative_reads_total",
            "counter",
            "Extra read requests sent to another replica because the first were slow.",
            c.speculative_reads,
        ),
        (
            "sluice_hints_held",
            "gauge",
            "Hints held (queued or on disk) for replicas that are down.",
            c.hints.held as u64,
        ),
        (
            "sluice_hint_bytes",
            "gauge",
            "Bytes of the hints held: queued records and hint files.",
            c.hints.bytes as u64,
        ),
        (
            "sluice_hint_disk_bytes",
            "gauge",
            "Bytes of the hint files on disk.",
            c.hints.disk_bytes as u64,
        ),
        (
            "sluice_hints_replayed_total",
            "counter",
            "Hints delivered to their replica since start.",
            c.hints.replayed,
        ),
        (
            "sluice_hints_stored_total",
            "counter",
            "Hints stored since start.",
            c.hints.stored,
        ),
        (
            "sluice_hints_dropped_total",
            "counter",
            "Hints dropped: over the byte bound, older than the hint window, unreadable or not written.",
            c.hints.dropped,
        ),
        (
            "sluice_read_count_messages_sent_total",
            "counter",
            "Read count messages sent to other replicas for the per-partition read limit.",
            c.read_counts.messages_sent,
        ),
        (
            "sluice_read_count_keys_sent_total",
            "counter",
            "Keys whose admitted reads were sent to other replicas.",
            c.read_counts.keys_sent,
        ),
        (
            "sluice_read_count_keys_received_total",
            "counter",
            "Keys whose admitted reads other replicas reported and this node counted.",
            c.read_counts.keys_received,
        ),
        (
            "sluice_read_count_malformed_total",
            "counter",
            "Read count messages refused as malformed.",
            c.read_counts.malformed,
        ),
        (
            "sluice_read_count_dropped_total",
            "counter",
            "Admitted reads not reported to other replicas: too many keys waited.",
            c.read_counts.dropped,
        ),
    ];
    for (name, kind, help, v) in rows {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    }
    family(
        out,
        "sluice_replica_requests_total",
        "counter",
        "Requests from other coordinators this node admitted as a replica, per verb.",
    );
    for (v, n) in ReplicaVerb::ALL.iter().zip(c.replica_served) {
        let _ = writeln!(
            out,
            "sluice_replica_requests_total{{verb=\"{}\"}} {n}",
            v.label()
        );
    }
    family(
        out,
        "sluice_replica_refused_total",
        "counter",
        "Requests from other coordinators this node turned away or failed, per verb and reason.",
    );
    for (v, per_reason) in ReplicaVerb::ALL.iter().zip(c.replica_refused) {
        for (r, n) in RefusalReason::ALL.iter().zip(per_reason) {
            let _ = writeln!(
                out,
                "sluice_replica_refused_total{{verb=\"{}\",reason=\"{}\"}} {n}",
                v.label(),
                r.label()
            );
        }
    }
}

/// Renders what this coordinator proposed to the cluster's transaction log: transactions
/// committed, and proposals the log found in conflict (read again and retried).
pub fn render_txn_log(out: &mut String, committed: u64, conflicts: u64) {
    let rows = [
        (
            "sluice_txn_log_commits_total",
            "Transactions and LWT this coordinator committed through the cluster's log.",
            committed,
        ),
        (
            "sluice_txn_log_conflicts_total",
            "Proposals the cluster's log refused because a read partition was written after the read.",
            conflicts,
        ),
    ];
    for (name, help, v) in rows {
        family(out, name, "counter", help);
        let _ = writeln!(out, "{name} {v}");
    }
}

/// Renders storage's background purges: dropped and truncated tables' files deleted, and
/// rows shadowed by deletions removed.
pub fn render_purges(out: &mut String, p: &sluice_storage::PurgeStats) {
    let rows = [
        (
            "sluice_table_purges_pending",
            "gauge",
            "Dropped or truncated tables' keyspaces whose files are not deleted yet.",
            p.tables_pending,
        ),
        (
            "sluice_table_purges_total",
            "counter",
            "Dropped or truncated tables' keyspaces whose files were deleted.",
            p.tables_purged,
        ),
        (
            "sluice_table_purged_bytes_total",
            "counter",
            "Disk space of the deleted keyspaces, as counted when each was deleted.",
            p.table_bytes_purged,
        ),
        (
            "sluice_table_purge_steps_total",
            "counter",
            "Steps the background deleters ran (a deletion, or a look at one storage still held).",
            p.table_purge_steps,
        ),
        (
            "sluice_row_purges_queued",
            "gauge",
            "Jobs queued to remove the rows that deletions shadow.",
            p.row_purges_queued,
        ),
        (
            "sluice_row_purges_dropped_total",
            "counter",
            "Row purge jobs dropped because a queue was full (their records have them run later).",
            p.row_purges_dropped,
        ),
        (
            "sluice_row_purge_rows_examined_total",
            "counter",
            "Rows the row purgers examined.",
            p.row_purge_rows_examined,
        ),
    ];
    for (name, kind, help, v) in rows {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    }
}

/// Renders the node's transaction metrics: outstanding transactions, the adaptive limit,
/// commits, aborts by reason, lock wait and critical-section time.
pub fn render_transactions(out: &mut String, gate: &sluice_engine::transaction::gate::TxnGate) {
    let g = gate.snapshot();
    let m = gate.metrics();
    let gauges = [
        (
            "sluice_txn_outstanding",
            "Transactions running.",
            u64::from(g.outstanding),
        ),
        (
            "sluice_txn_limit",
            "The adaptive limit on outstanding transactions.",
            u64::from(g.limit),
        ),
        (
            "sluice_txn_queued",
            "Transactions waiting for a slot.",
            g.queued as u64,
        ),
        (
            "sluice_txn_max_outstanding",
            "Most transactions running at once since start.",
            u64::from(g.max_outstanding),
        ),
    ];
    for (name, help, v) in gauges {
        family(out, name, "gauge", help);
        let _ = writeln!(out, "{name} {v}");
    }
    let n = "sluice_txn_commits_total";
    family(out, n, "counter", "Transactions completed, by whether they wrote (a false IF writes nothing; it is not an abort).");
    let _ = writeln!(out, "{n}{{wrote=\"true\"}} {}", m.committed.load(Relaxed));
    let _ = writeln!(
        out,
        "{n}{{wrote=\"false\"}} {}",
        m.committed_without_writes.load(Relaxed)
    );
    let n = "sluice_txn_aborts_total";
    family(
        out,
        n,
        "counter",
        "Transactions turned away or ended before committing, by reason.",
    );
    let _ = writeln!(
        out,
        "{n}{{reason=\"deadline\"}} {}",
        m.aborted_deadline.load(Relaxed)
    );
    let _ = writeln!(
        out,
        "{n}{{reason=\"over_limit\"}} {}",
        m.aborted_over_limit.load(Relaxed)
    );
    let _ = writeln!(out, "{n}{{reason=\"error\"}} {}", m.failed.load(Relaxed));
    for (name, help, h) in [
        (
            "sluice_txn_lock_wait_seconds",
            "Time to acquire a transaction's locks (quantiles are bucket upper bounds).",
            &m.lock_wait,
        ),
        (
            "sluice_txn_critical_section_seconds",
            "Time a transaction held its locks (quantiles are bucket upper bounds).",
            &m.critical_section,
        ),
    ] {
        family(out, name, "summary", help);
        for q in [0.5, 0.99, 0.999] {
            let _ = writeln!(
                out,
                "{name}{{quantile=\"{q}\"}} {}",
                h.quantile(q).as_secs_f64()
            );
        }
        let _ = writeln!(out, "{name}_sum {}", h.sum().as_secs_f64());
        let _ = writeln!(out, "{name}_count {}", h.count());
    }
}

/// Serves `GET /metrics` on `addr` until the task is dropped. Each connection gets one
/// HTTP/1.0 answer and is closed; requests are bounded to 4 KiB and 5 s.
pub async fn serve(
    listener: TcpListener,
    shards: Arc<Vec<Arc<ShardMetrics>>>,
    extra: ExtraMetrics,
) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let shards = shards.clone();
        let extra = extra.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            let mut len = 0;
            let read = async {
                while len < buf.len() {
                    match sock.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => len += n,
                    }
                    if buf[..len].windows(4).any(|w| w == b"\r\n\r\n")
                        || buf[..len].windows(2).any(|w| w == b"\n\n")
                    {
                        break;
                    }
                }
            };
            if tokio::time::timeout(Duration::from_secs(5), read)
                .await
                .is_err()
            {
                return;
            }
            let head = &buf[..len];
            let (status, body) =
                if head.starts_with(b"GET /metrics ") || head.starts_with(b"GET /metrics\r") {
                    let mut text = render(&shards);
                    extra(&mut text);
                    ("200 OK", text)
                } else {
                    ("404 Not Found", "try GET /metrics\n".to_string())
                };
            let resp = format!(
                "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

/// Binds the metrics listener (start-up; errors are reported to the operator).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_per_shard() {
        let a = Arc::new(ShardMetrics::default());
        let b = Arc::new(ShardMetrics::default());
        a.count_request(0x07);
        a.count_request(0x07);
        b.count_request(0x0A);
        b.count_request(0x42);
        a.count_error(0x1001);
        b.count_error(0x1234);
        b.forwards_out.fetch_add(3, Relaxed);
        assert_eq!(a.requests_with_opcode(0x07), 2);
        assert_eq!(a.errors_with_code(0x1001), 1);
        let text = render(&[a, b]);
        assert!(text.contains("sluice_requests_total{shard=\"0\",opcode=\"query\"} 2"));
        assert!(text.contains("sluice_requests_total{shard=\"1\",opcode=\"execute\"} 1"));
        assert!(text.contains("sluice_requests_total{shard=\"1\",opcode=\"other\"} 1"));
        assert!(text.contains("sluice_errors_total{shard=\"0\",code=\"overloaded\"} 1"));
        assert!(text.contains("sluice_errors_total{shard=\"1\",code=\"other\"} 1"));
        assert!(text.contains("sluice_cross_shard_forwards_total{shard=\"1\"} 3"));
        assert!(text.contains("# TYPE sluice_inflight gauge"));
        assert!(text.contains("# TYPE sluice_loop_lag_microseconds gauge"));
        assert!(text.contains("sluice_admission_concurrency_limit{shard=\"0\"}"));
    }

    #[test]
    fn coordinator_metrics_render() {
        let counts = CoordinatorCounts {
            read_repairs: 3,
            speculative_reads: 1,
            hints: sluice_engine::coordinator::HintStats {
                held: 2,
                bytes: 300,
                disk_bytes: 256,
                stored: 5,
                dropped: 1,
                replayed: 9,
            },
            replica_served: [4, 0, 0, 0, 7, 2, 3],
            replica_refused: {
                let mut r = [[0; RefusalReason::ALL.len()]; ReplicaVerb::ALL.len()];
                r[ReplicaVerb::Scan as usize][RefusalReason::Budget as usize] = 6;
                r
            },
            read_counts: sluice_engine::read_counts::ReadCountSnapshot {
                messages_sent: 8,
                keys_sent: 9,
                keys_received: 10,
                malformed: 11,
                dropped: 12,
            },
        };
        let mut text = String::new();
        render_coordinator(&mut text, &counts);
        assert!(
            text.contains("# TYPE sluice_read_repairs_total counter"),
            "{text}"
        );
        assert!(text.contains("sluice_read_repairs_total 3"));
        assert!(text.contains("sluice_speculative_reads_total 1"));
        assert!(text.contains("sluice_hints_held 2"));
        assert!(text.contains("sluice_hint_bytes 300"));
        assert!(text.contains("sluice_hint_disk_bytes 256"));
        assert!(text.contains("sluice_hints_replayed_total 9"));
        assert!(text.contains("sluice_hints_stored_total 5"));
        assert!(text.contains("sluice_hints_dropped_total 1"));
        assert!(text.contains("sluice_read_count_messages_sent_total 8"));
        assert!(text.contains("sluice_read_count_keys_sent_total 9"));
        assert!(text.contains("sluice_read_count_keys_received_total 10"));
        assert!(text.contains("sluice_read_count_malformed_total 11"));
        assert!(text.contains("sluice_read_count_dropped_total 12"));
        assert!(text.contains("# TYPE sluice_replica_requests_total counter"));
        assert!(text.contains("sluice_replica_requests_total{verb=\"mutation\"} 4"));
        assert!(text.contains("sluice_replica_requests_total{verb=\"select\"} 7"));
        assert!(text.contains("sluice_replica_requests_total{verb=\"scan\"} 2"));
        assert!(text.contains("sluice_replica_requests_total{verb=\"slice\"} 3"));
        assert!(text.contains("sluice_replica_refused_total{verb=\"scan\",reason=\"budget\"} 6"));
        assert!(
            text.contains("sluice_replica_refused_total{verb=\"read\",reason=\"in_flight_cap\"} 0")
        );
    }

    #[test]
    fn txn_log_metrics_render() {
        let mut text = String::new();
        render_txn_log(&mut text, 7, 2);
        assert!(text.contains("# TYPE sluice_txn_log_commits_total counter"));
        assert!(text.contains("sluice_txn_log_commits_total 7"));
        assert!(text.contains("sluice_txn_log_conflicts_total 2"));
    }

    #[test]
    fn purge_metrics_render() {
        let mut out = String::new();
        render_purges(
            &mut out,
            &sluice_storage::PurgeStats {
                tables_pending: 1,
                tables_purged: 2,
                table_bytes_purged: 3,
                table_purge_steps: 4,
                row_purges_queued: 5,
                row_purges_dropped: 6,
                row_purge_rows_examined: 7,
            },
        );
        for line in [
            "sluice_table_purges_pending 1",
            "sluice_table_purges_total 2",
            "sluice_table_purged_bytes_total 3",
            "sluice_table_purge_steps_total 4",
            "sluice_row_purges_queued 5",
            "sluice_row_purges_dropped_total 6",
            "sluice_row_purge_rows_examined_total 7",
            "# TYPE sluice_table_purges_pending gauge",
            "# TYPE sluice_table_purges_total counter",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in:\n{out}");
        }
    }

    #[test]
    fn transaction_metrics_render() {
        let gate = sluice_engine::transaction::gate::TxnGate::default();
        gate.metrics().aborted_over_limit.fetch_add(2, Relaxed);
        gate.metrics()
            .critical_section
            .record(Duration::from_micros(3));
        let mut text = String::new();
        render_transactions(&mut text, &gate);
        assert!(text.contains("sluice_txn_limit 8"), "{text}");
        assert!(text.contains("sluice_txn_outstanding 0"));
        assert!(text.contains("sluice_txn_aborts_total{reason=\"over_limit\"} 2"));
        assert!(text.contains("sluice_txn_commits_total{wrote=\"false\"} 0"));
        // 3 µs falls in the bucket up to 4096 ns.
        assert!(text.contains("sluice_txn_critical_section_seconds{quantile=\"0.99\"} 0.000004096"));
        assert!(text.contains("sluice_txn_critical_section_seconds_count 1"));
    }

    /// The counters found by table and binary search are the ones the readers find by
    /// scanning, for every opcode byte and every code, listed or not.
    #[test]
    fn fast_counter_lookups_match_the_tables() {
        for opcode in 0..=u8::MAX {
            let m = ShardMetrics::default();
            m.count_request(opcode);
            assert_eq!(m.requests_with_opcode(opcode), 1, "opcode {opcode:#x}");
            let total: u64 = m.requests.iter().map(|c| c.load(Relaxed)).sum();
            assert_eq!(total, 1);
        }
        let listed = ERROR_CODES.iter().map(|&(c, _)| c);
        for code in listed.chain([1, 0x1002, 0x2600, 0xFFFF, u32::MAX]) {
            let m = ShardMetrics::default();
            m.count_error(code);
            assert_eq!(m.errors_with_code(code), 1, "code {code:#x}");
        }
        let m = ShardMetrics::default();
        m.count_error_code::<0x1100>();
        m.count_error_code::<0xF000>();
        m.count_error_code::<0x4242>();
        m.count_overloaded_error();
        assert_eq!(m.errors_with_code(0x1100), 1);
        assert_eq!(m.errors_with_code(0xF000), 1);
        assert_eq!(
            m.errors_with_code(0x4242),
            1,
            "unlisted codes count as other"
        );
        assert_eq!(m.errors_with_code(0x1001), 1);
    }

    #[tokio::test]
    async fn endpoint_answers_get_metrics() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let m = Arc::new(ShardMetrics::default());
        m.count_request(0x05);
        let task = tokio::spawn(serve(
            listener,
            Arc::new(vec![m]),
            Arc::new(|out: &mut String| out.push_str("extra_metric 1\n")),
        ));
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).await.unwrap();
        assert!(resp.starts_with("HTTP/1.0 200 OK"));
        assert!(resp.contains("sluice_requests_total{shard=\"0\",opcode=\"options\"} 1"));
        assert!(resp.contains("extra_metric 1\n"));
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /other HTTP/1.0\r\n\r\n").await.unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).await.unwrap();
        assert!(resp.starts_with("HTTP/1.0 404"));
        task.abort();
    }
}
