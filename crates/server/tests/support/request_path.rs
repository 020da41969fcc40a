//! The in-process request path, frame bytes in and response bytes out (no sockets), for one
//! of the outcomes below: shared by `examples/request_path_insns.rs` (instruction counts under
//! callgrind) and `tests/no_alloc_reject.rs` (allocations per rejection).
//!
//! The steps are the ones the server runs (`connection.rs` then `request.rs`), called
//! through the same public functions. Writes are EXECUTEs of a prepared statement with two
//! bound ints, as drivers send them.
//!
//! - `served`: header decode, [A] admission (queue, dispatch, completion), body decode,
//!   prepared statement lookup, deadline check, route, engine execute (periodic durability,
//!   so no fsync), RESULT encoded into the write buffer.
//! - `overloaded`: header decode, [A] admission finds the queue full, the pre-encoded
//!   `Overloaded` frame is appended. The body is never decoded.
//! - `rate_limited`: like `served` up to the route, from the statement id and the leading
//!   values only, then the per-partition limiter [B] rejects and the pre-encoded rate-limit
//!   frame is appended. The rest of the body is never decoded.
//! - `served_limited`: `served` on a table with a write limit it never reaches: the
//!   limiter accounts every write (what a limit costs; a table without one skips it).
//! - `served_auth`: `served` with the password authenticator and the Cassandra authorizer,
//!   by a role that holds MODIFY on the table through a GRANT: the permission check from
//!   the connection's cache of decisions is what it adds.
//! - `expired`: like `served` up to the deadline check (`USING TIMEOUT 1ms`, the frame read
//!   5 ms earlier), which finds it passed: the pre-encoded Write_timeout is appended.
//! - `read`: `served` for a single-partition SELECT, the benchmarks' read: a table of
//!   (k bigint, c int, v blob) with [`PARTITIONS`] partitions of one 64-byte row each, all in
//!   the memtable, read in a scattered order.
//! - `read_tables`: `read` with the data in [`DISK_TABLES`] disk tables instead (each
//!   partition written, then flushed, that many times), and an empty memtable.
//! - `write`: `served` for the benchmarks' write: one 64-byte row into the `read` table, over
//!   its [`PARTITIONS`] partitions in a scattered order, each already in the memtable (the
//!   memtable's search is part of the cost, as it is under load).

#![allow(dead_code)]

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use sluice_engine::{Engine, NodeInfo, RequestContext, Session};
use sluice_overload::{
    Decision, LimitKey, OpType, RateLimiter, RateLimiterConfig, TableLimitStats,
};
use sluice_protocol::compression::Compression;
use sluice_protocol::frame::{Frame, FrameDecoder, Opcode};
use sluice_protocol::preencoded::PreencodedErrors;
use sluice_protocol::{decode_request, ExecuteHead, OperationType, Request};
use sluice_server::admission::{Admit, ShardAdmission};
use sluice_server::metrics::ShardMetrics;
use sluice_server::ServerConfig;

/// Polls a future that completes without waiting on I/O (local storage, no fsync).
fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

fn query_frame(stream: i16, text: &str) -> Vec<u8> {
    let mut body = (text.len() as u32).to_be_bytes().to_vec();
    body.extend_from_slice(text.as_bytes());
    body.extend_from_slice(&[0, 1, 0]); // consistency ONE, no flags
    let mut f = vec![4, 0];
    f.extend_from_slice(&stream.to_be_bytes());
    f.push(Opcode::Query as u8);
    f.extend_from_slice(&(body.len() as u32).to_be_bytes());
    f.extend_from_slice(&body);
    f
}

/// Partitions of the read paths' table (as many as the benchmarks' default key space).
pub const PARTITIONS: i64 = 10_000;

/// Disk tables that hold the data of the `read_tables` path.
pub const DISK_TABLES: usize = 4;

/// The value of every row of `ks.wide` (the benchmarks write 64-byte values).
const WIDE_VALUE: [u8; 64] = [0x5a; 64];

/// Every partition key of `ks.wide` once, each far from the one before: a stride coprime
/// with [`PARTITIONS`].
fn scattered_partitions() -> impl Iterator<Item = i64> {
    (0..PARTITIONS).map(|i| (i * 7919) % PARTITIONS)
}

/// An EXECUTE frame for prepared `id` binding two ints (the drivers' path for writes).
fn execute_frame(stream: i16, id: &[u8; 16], k: i32, v: i32) -> Vec<u8> {
    execute_frame_with(stream, id, &[&k.to_be_bytes(), &v.to_be_bytes()])
}

/// An EXECUTE frame for prepared `id` binding `values`.
fn execute_frame_with(stream: i16, id: &[u8; 16], values: &[&[u8]]) -> Vec<u8> {
    let mut body = (id.len() as u16).to_be_bytes().to_vec();
    body.extend_from_slice(id);
    body.extend_from_slice(&[0, 1, 0x01]); // consistency ONE, flag: values
    body.extend_from_slice(&(values.len() as u16).to_be_bytes());
    for x in values {
        body.extend_from_slice(&(x.len() as i32).to_be_bytes());
        body.extend_from_slice(x);
    }
    let mut f = vec![4, 0];
    f.extend_from_slice(&stream.to_be_bytes());
    f.push(Opcode::Execute as u8);
    f.extend_from_slice(&(body.len() as u32).to_be_bytes());
    f.extend_from_slice(&body);
    f
}

/// The request path's state, as one shard holds it.
pub struct Bench {
    engine: Arc<Engine>,
    session: Session,
    decoder: FrameDecoder,
    admission: ShardAdmission,
    frames: sluice_protocol::PreencodedErrors,
    metrics: ShardMetrics,
    limiter: RateLimiter,
    table_stats: TableLimitStats,
    errors: PreencodedErrors,
    out: BytesMut,
    input: BytesMut,
    permissions: sluice_engine::auth::PermissionCache,
}

impl Bench {
    /// One frame through the path; returns the opcode of the answer written.
    pub fn one(&mut self, frame: &[u8], path: &str) -> u8 {
        self.input.extend_from_slice(frame);
        // As connection.rs: the header first, the body only for an admitted request.
        let Ok(Some(header)) = self.decoder.next_header(&mut self.input) else {
            panic!("bad frame");
        };
        let mut arrival = Instant::now();
        if path == "expired" {
            // The frame was read 5 ms ago and waited (queued) past its 1 ms deadline.
            arrival = arrival
                .checked_sub(Duration::from_millis(5))
                .unwrap_or(arrival);
        }
        let stream = header.stream;
        let start = self.out.len();
        match self
            .admission
            .admit(&header, arrival.into(), 1, &self.metrics)
        {
            Admit::Reject => {
                // As connection::reject_overloaded does.
                FrameDecoder::skip_body(&mut self.input, &header);
                self.metrics.count_overloaded_error();
                self.frames.overloaded.append(&mut self.out, stream);
            }
            Admit::Accept(ticket) => {
                let frame = FrameDecoder::take_frame(&mut self.input, header);
                // As request.rs: a request turned away by [C] or [B] is no latency sample.
                if self.served(frame, arrival) {
                    self.admission.complete(ticket, &self.metrics);
                } else {
                    self.admission.complete_turned_away(ticket, &self.metrics);
                }
            }
        }
        let op = self.out[start + 4];
        if self.out.len() > 64 << 10 {
            // As the connection's writer does before it sends a batch of answers.
            self.engine.storage().ack_barrier().expect("ack barrier");
            self.out.clear();
        }
        op
    }

    /// Runs an admitted frame; false when [C] or [B] turned it away before it ran.
    fn served(&mut self, frame: Frame, arrival: Instant) -> bool {
        let stream = frame.header.stream;
        let header = frame.header;
        let body = Compression::None
            .decompress_body(&header, frame.body, 1 << 20)
            .expect("body");
        // As request.rs: an EXECUTE is checked on its id and leading values, and decoded in
        // full only once it passed [C] and [B]; a QUERY is decoded first.
        let mut head = ExecuteHead::default();
        let head = (header.opcode == Opcode::Execute
            && head.read(&header, &body).is_ok()
            && head.complete())
        .then_some(&head);
        let (p, decoded) = match &head {
            Some(h) => (self.engine.prepared(&h.id).expect("prepared"), None),
            None => match decode_request(&header, body.clone()) {
                Ok(Request::Query { query, params }) => {
                    let text = std::str::from_utf8(&query).expect("utf-8");
                    let p = self.engine.prepare(self.session.keyspace.as_deref(), text);
                    (p.expect("prepare"), Some(params))
                }
                _ => panic!("not a query"),
            },
        };
        let values = match (head, &decoded) {
            (Some(h), _) => h.values(),
            (None, Some(params)) => &params.values[..],
            (None, None) => unreachable!(),
        };
        // [C] before routing, as request.rs does.
        let timeout = self.engine.timeout(&p, values).expect("timeout");
        let deadline = arrival + timeout.unwrap_or(Duration::from_secs(2));
        if Instant::now() >= deadline {
            self.errors.write_timeout.append(&mut self.out, stream);
            return false;
        }
        // Permissions, as check.rs does after the deadline.
        if self.engine.auth().checks_permissions() {
            if let Err(denied) =
                self.engine
                    .check_access(self.session.user.as_ref(), &mut self.permissions, &p)
            {
                denied.encode(&mut self.out, stream, Compression::None);
                return false;
            }
        }
        let route = self.engine.route_with_timeout(&p, values, timeout);
        // [B] as request.rs: only for a table with a limit for this operation.
        {
            if let (Some(token), Some(limit)) = (
                route.token,
                route.rate_limits.and_then(|r| r.max_writes_per_second),
            ) {
                let key = LimitKey {
                    token,
                    table: 1,
                    op: OpType::Write,
                };
                let random = (token as u32).wrapping_mul(0x9E37_79B9);
                let wall = sluice_overload::Nanos(1_700_000_000_000_000_000);
                let d = self
                    .limiter
                    .check(key, Some(limit), random, wall, &self.table_stats);
                if d == Decision::Reject {
                    self.errors
                        .rate_limit(OperationType::Write, true)
                        .append(&mut self.out, stream);
                    return false;
                }
            }
        }
        let params = match decoded {
            Some(params) => params,
            None => match decode_request(&header, body) {
                Ok(Request::Execute { params, .. }) => params,
                _ => panic!("not an EXECUTE"),
            },
        };
        let ctx = RequestContext {
            deadline: Some(deadline),
            now_micros: sluice_engine::now_micros(),
            ack_barrier: true,
        };
        let r = block_on(self.engine.execute(&mut self.session, &p, &params, &ctx));
        match r {
            Ok(r) => sluice_protocol::response::encode_result(
                &mut self.out,
                stream,
                &r,
                Compression::None,
            ),
            Err(e) => sluice_protocol::response::encode_detailed_error(
                &mut self.out,
                stream,
                &e,
                Compression::None,
            ),
        }
        true
    }
}

/// A one-shard config whose admission queue holds `queue` requests and whose concurrency
/// limit is fixed at `limit`.
pub fn fixed_admission_config(queue: usize, limit: u32) -> ServerConfig {
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), 1, "bench".into());
    let mut a = sluice_server::AdmissionConfig {
        queue_capacity: queue,
        ..Default::default()
    };
    a.concurrency.initial = limit;
    a.concurrency.min = limit;
    a.concurrency.max = limit;
    config.admission = Some(a);
    config
}

/// A bench for `path` with its schema (and for the read paths, its data) in place, the
/// EXECUTE frames to send in turn (one, except for the reads: one per partition, in a
/// scattered order) and the opcode of the answer that path gives.
pub fn setup(path: &str) -> (Bench, tempfile::TempDir, Vec<Vec<u8>>, u8) {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = sluice_storage::Storage::open(sluice_storage::StorageConfig {
        path: dir.path().join("db"),
        durability: sluice_storage::Durability::Periodic {
            interval: Duration::from_secs(3600),
        },
        cache_bytes: 16 << 20,
        stores: 1,
    })
    .expect("storage");
    let info = NodeInfo::single([127, 0, 0, 1].into(), 9042, uuid::Uuid::nil());
    let auth = if path == "served_auth" {
        sluice_engine::auth::AuthConfig {
            authenticator: sluice_engine::auth::AuthenticatorKind::Password,
            authorizer: sluice_engine::auth::AuthorizerKind::Cassandra,
            bcrypt_cost: sluice_engine::auth::MIN_BCRYPT_COST,
        }
    } else {
        sluice_engine::auth::AuthConfig::default()
    };
    let engine = Engine::open_with_auth(storage, info, auth).expect("engine");
    let user = |name: &str| sluice_engine::auth::AuthenticatedUser { name: name.into() };
    let config = if path == "overloaded" {
        // One execution slot and a one-request queue, both taken: every frame is shed.
        fixed_admission_config(1, 1)
    } else {
        ServerConfig::new("127.0.0.1:0".parse().expect("addr"), 1, "bench".into())
    };
    let mut b = Bench {
        engine,
        session: Session {
            user: Some(user(sluice_engine::auth::DEFAULT_SUPERUSER)),
            ..Session::default()
        },
        decoder: FrameDecoder::new(1 << 20),
        admission: ShardAdmission::new(&config),
        frames: sluice_protocol::PreencodedErrors::new(),
        metrics: ShardMetrics::default(),
        limiter: RateLimiter::new(RateLimiterConfig::default()),
        table_stats: TableLimitStats::default(),
        errors: PreencodedErrors::new(),
        out: BytesMut::with_capacity(2 << 20),
        input: BytesMut::with_capacity(64 << 10),
        permissions: Default::default(),
    };
    for (i, ddl) in [
        "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
        "CREATE TABLE ks.t (k int PRIMARY KEY, v int)",
        "CREATE TABLE ks.limited (k int PRIMARY KEY, v int) WITH per_partition_rate_limit = {'max_writes_per_second': 1}",
        "CREATE TABLE ks.roomy (k int PRIMARY KEY, v int) WITH per_partition_rate_limit = {'max_writes_per_second': 1000000000}",
        "CREATE TABLE ks.wide (k bigint, c int, v blob, PRIMARY KEY (k, c))",
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(b.one(&query_frame(i as i16, ddl), "served"), Opcode::Result as u8);
    }
    if path == "read" || path == "read_tables" {
        let frames = b.read_frames(path == "read_tables");
        return (b, dir, frames, Opcode::Result as u8);
    }
    if path == "write" {
        let insert = b.populate_wide(false);
        let frames = scattered_partitions()
            .map(|k| {
                execute_frame_with(
                    1,
                    &insert,
                    &[&k.to_be_bytes(), &0i32.to_be_bytes(), &WIDE_VALUE],
                )
            })
            .collect();
        return (b, dir, frames, Opcode::Result as u8);
    }
    if path == "served_auth" {
        // A role with MODIFY through a GRANT (a superuser would skip the decision).
        let hash = sluice_engine::auth::hash_password("app", sluice_engine::auth::MIN_BCRYPT_COST)
            .expect("hash");
        for (i, q) in [
            format!("CREATE ROLE app WITH HASHED PASSWORD = '{hash}' AND LOGIN = true"),
            "GRANT MODIFY ON TABLE ks.t TO app".to_string(),
        ]
        .iter()
        .enumerate()
        {
            assert_eq!(
                b.one(&query_frame(i as i16, q), "served"),
                Opcode::Result as u8
            );
        }
        b.session.user = Some(user("app"));
    }
    let text = match path {
        "served" | "overloaded" | "served_auth" => "INSERT INTO ks.t (k, v) VALUES (?, ?)",
        "rate_limited" => "INSERT INTO ks.limited (k, v) VALUES (?, ?)",
        "served_limited" => "INSERT INTO ks.roomy (k, v) VALUES (?, ?)",
        "expired" => "INSERT INTO ks.t (k, v) VALUES (?, ?) USING TIMEOUT 1ms",
        other => panic!("unknown path {other}"),
    };
    let prepared = b.engine.prepare(None, text).expect("prepare");
    let frame = execute_frame(7, &prepared.id, 1, 2);
    let expected = if matches!(path, "served" | "served_limited" | "served_auth") {
        Opcode::Result as u8
    } else {
        Opcode::Error as u8
    };
    if path == "overloaded" {
        let arrival = Instant::now();
        for _ in 0..2 {
            let mut input = BytesMut::from(&frame[..]);
            let f = b.decoder.decode(&mut input).expect("frame").expect("frame");
            assert!(matches!(
                b.admission.admit(&f.header, arrival.into(), 1, &b.metrics),
                Admit::Accept(_)
            ));
        }
    }
    (b, dir, vec![frame], expected)
}

impl Bench {
    /// Disk tables of user data now (compaction may merge them while the path runs).
    pub fn disk_tables(&self) -> usize {
        self.engine.storage().disk_table_count()
    }

    /// Writes every partition of `ks.wide` (into [`DISK_TABLES`] disk tables if `on_disk`)
    /// and returns the id of the prepared INSERT.
    fn populate_wide(&mut self, on_disk: bool) -> [u8; 16] {
        let insert = self
            .engine
            .prepare(None, "INSERT INTO ks.wide (k, c, v) VALUES (?, ?, ?)")
            .expect("prepare");
        for _ in 0..if on_disk { DISK_TABLES } else { 1 } {
            for k in 0..PARTITIONS {
                let f = execute_frame_with(
                    1,
                    &insert.id,
                    &[&k.to_be_bytes(), &0i32.to_be_bytes(), &WIDE_VALUE],
                );
                assert_eq!(self.one(&f, "read"), Opcode::Result as u8);
                self.out.clear();
            }
            if on_disk {
                let storage = self.engine.storage();
                storage.flush_memtables(Duration::from_secs(60));
            }
        }
        if on_disk {
            assert_eq!(self.engine.storage().disk_table_count(), DISK_TABLES);
        }
        insert.id
    }

    /// Writes every partition of `ks.wide` (into [`DISK_TABLES`] disk tables if `on_disk`)
    /// and returns a read frame per partition, in a scattered order.
    fn read_frames(&mut self, on_disk: bool) -> Vec<Vec<u8>> {
        self.populate_wide(on_disk);
        let select = self
            .engine
            .prepare(None, "SELECT k, c, v FROM ks.wide WHERE k = ?")
            .expect("prepare");
        let frames: Vec<Vec<u8>> = scattered_partitions()
            .map(|k| execute_frame_with(2, &select.id, &[&k.to_be_bytes()]))
            .collect();
        // Every read finds its row: the answer carries the value.
        for f in [&frames[0], &frames[frames.len() - 1]] {
            self.out.clear();
            assert_eq!(self.one(f, "read"), Opcode::Result as u8);
            assert!(
                self.out.windows(WIDE_VALUE.len()).any(|w| w == WIDE_VALUE),
                "row not found"
            );
        }
        self.out.clear();
        frames
    }
}
