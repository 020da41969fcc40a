//! The real request pipeline over an in-memory connection, frame bytes in and answer bytes
//! out (no sockets), for one of the outcomes below: shared by `examples/request_path_insns.rs`
//! (instruction counts under callgrind) and `tests/no_alloc_reject.rs` (allocations per
//! rejection). Each frame goes through `connection::handle_frame`, as the connection's reader
//! hands it over, on a standalone shard (`ShardCtx::standalone`); the answers are taken from
//! the connection's outbox as its writer would. Writes are EXECUTEs of a prepared statement
//! with two bound ints, as drivers send them.
//!
//! - `served`: admission from the header (queue, dispatch, completion), the EXECUTE checked
//!   from its head, body decode, route, engine execute (periodic durability, so no fsync),
//!   RESULT encoded into the outbox.
//! - `overloaded`: admission finds the queue full; the pre-encoded `Overloaded` frame is
//!   appended. The body is never decoded.
//! - `rate_limited`: like `served` up to the route, from the statement id and the leading
//!   values only, then the per-partition rate limiter rejects and the pre-encoded rate-limit
//!   frame is appended. The rest of the body is never decoded.
//! - `served_limited`: `served` on a table with a write limit it never reaches: the
//!   limiter accounts every write (what a limit costs; a table without one skips it).
//! - `served_auth`: `served` with the password authenticator and the Cassandra authorizer,
//!   by a role that holds MODIFY on the table through a GRANT: the permission check's cost.
//! - `expired`: like `served` up to the deadline check (`USING TIMEOUT 1ms`, the frame read
//!   5 ms earlier), which finds it passed: the pre-encoded Write_timeout is appended.
//! - `read`: `served` for a single-partition SELECT, the benchmarks' read: a table of
//!   (k bigint, c int, v blob) with [`PARTITIONS`] partitions of one 64-byte row each, all in
//!   the memtable, read in a scattered order.
//! - `read_tables`: `read` with the data in [`DISK_TABLES`] disk tables instead (each
//!   partition written, then flushed, that many times), and an empty memtable.
//! - `read_spread`: `read` from [`DISK_TABLES`] disk tables that each hold a quarter of the
//!   partitions (every table's key range covers them all), and an empty memtable: as after
//!   writes of new keys, where a partition lives in one of several tables.
//! - `read_narrow`, `read_narrow_spread`: `read` and `read_spread` on a table without
//!   clustering columns (k bigint PRIMARY KEY, v blob), one 64-byte row per partition.
//! - `write`: `served` for the benchmarks' write: one 64-byte row into the `read` table, over
//!   its [`PARTITIONS`] partitions in a scattered order, each already in the memtable (the
//!   memtable's search is part of the cost, as it is under load).

#![allow(dead_code)]

use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use sluice_engine::{Engine, NodeInfo};
use sluice_overload::Arrival;
use sluice_protocol::frame::{FrameDecoder, Opcode};
use sluice_server::admission::Admit;
use sluice_server::connection::{handle_frame, ConnState};
use sluice_server::shard::{ShardCtx, Standalone};
use sluice_server::ServerConfig;

/// A QUERY frame at consistency ONE, without values.
pub fn query_frame(stream: i16, text: &str) -> Vec<u8> {
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

/// The table a read path reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ReadTable {
    /// `ks.wide` (k bigint, c int, v blob, PRIMARY KEY (k, c)).
    Wide,
    /// `ks.narrow` (k bigint PRIMARY KEY, v blob).
    Narrow,
}

/// Where a read path's partitions are.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// All in the memtable.
    Memtable,
    /// Each in every one of [`DISK_TABLES`] disk tables.
    EveryTable,
    /// Each in one of [`DISK_TABLES`] disk tables.
    Spread,
}

/// Every partition key of `ks.wide` once, each far from the one before: a stride coprime
/// with [`PARTITIONS`].
fn scattered_partitions() -> impl Iterator<Item = i64> {
    (0..PARTITIONS).map(|i| (i * 7919) % PARTITIONS)
}

/// An EXECUTE frame for prepared `id` binding two ints (the drivers' path for writes).
pub fn execute_frame(stream: i16, id: &[u8; 16], k: i32, v: i32) -> Vec<u8> {
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

/// Answer bytes after which the bench runs storage's acknowledgement barrier, as the
/// connection's writer does before it writes a batch of answers.
const BARRIER_EVERY: usize = 64 << 10;

/// The session user of a role that logged in.
fn user(name: &str) -> sluice_engine::auth::AuthenticatedUser {
    sluice_engine::auth::AuthenticatedUser { name: name.into() }
}

/// One shard and one in-memory connection, on their own current-thread runtime.
pub struct Bench {
    rt: tokio::runtime::Runtime,
    local: tokio::task::LocalSet,
    wire: Wire,
    _standalone: Standalone,
}

/// The connection's side: frames in, answers out.
pub struct Wire {
    /// The shard.
    pub shard: Rc<ShardCtx>,
    /// The connection.
    pub conn: Rc<ConnState>,
    decoder: FrameDecoder,
    input: BytesMut,
    /// The answer to the last frame.
    pub last: BytesMut,
    unflushed: usize,
    /// True for the `expired` path: frames arrived 5 ms before they are read.
    late: bool,
}

impl Wire {
    /// Hands every frame to the pipeline without waiting for answers, as a pipelining
    /// client's frames arrive in one read.
    pub async fn send(&mut self, frames: &[Vec<u8>]) {
        for frame in frames {
            self.input.extend_from_slice(frame);
            let Ok(Some(header)) = self.decoder.next_header(&mut self.input) else {
                panic!("bad frame");
            };
            let arrival = Arrival::Read(Instant::now());
            handle_frame(
                &self.shard,
                &self.conn,
                &mut self.input,
                header,
                arrival,
                |_| 0,
            )
            .await;
        }
    }

    /// Waits (at most 20 s) for `n` answers; returns each one's opcode and, for an error,
    /// its code.
    pub async fn answers(&mut self, n: usize) -> Vec<(u8, Option<u32>)> {
        let mut got = Vec::with_capacity(n);
        let mut pending = BytesMut::new();
        let mut taken = BytesMut::new();
        let give_up = Instant::now() + Duration::from_secs(20);
        while got.len() < n {
            assert!(Instant::now() < give_up, "{} of {n} answers", got.len());
            self.conn.outbox.take(&mut taken);
            pending.extend_from_slice(&taken);
            taken.clear();
            while pending.len() >= 9 {
                let len = u32::from_be_bytes([pending[5], pending[6], pending[7], pending[8]]);
                if pending.len() < 9 + len as usize {
                    break;
                }
                let f = pending.split_to(9 + len as usize);
                let code = (f[4] == 0).then(|| u32::from_be_bytes([f[9], f[10], f[11], f[12]]));
                got.push((f[4], code));
            }
            if got.len() < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        got
    }

    /// One frame through the pipeline; returns the opcode of its answer.
    pub async fn one(&mut self, frame: &[u8]) -> u8 {
        self.input.extend_from_slice(frame);
        let Ok(Some(header)) = self.decoder.next_header(&mut self.input) else {
            panic!("bad frame");
        };
        let mut arrival = Instant::now();
        if self.late {
            // The frame was read 5 ms ago and waited (queued) past its 1 ms deadline.
            arrival = arrival
                .checked_sub(Duration::from_millis(5))
                .unwrap_or(arrival);
        }
        let (shard, conn) = (&self.shard, &self.conn);
        handle_frame(
            shard,
            conn,
            &mut self.input,
            header,
            Arrival::Read(arrival),
            |_| 0,
        )
        .await;
        // A request that had to wait is finished by its task.
        while conn.outbox.pending() == 0 {
            tokio::task::yield_now().await;
        }
        self.last.clear();
        conn.outbox.take(&mut self.last);
        self.unflushed += self.last.len();
        if self.unflushed > BARRIER_EVERY {
            self.unflushed = 0;
            shard.ack_barrier.flush().expect("ack barrier");
        }
        self.last[4]
    }
}

impl Bench {
    /// Runs `f` on the shard's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.local.block_on(&self.rt, f)
    }

    /// Another connection to the same shard.
    pub fn new_wire(&self) -> Wire {
        let conn = Rc::new(ConnState::new(&self.wire.shard));
        conn.ready.set(true);
        Wire {
            shard: self.wire.shard.clone(),
            conn,
            decoder: FrameDecoder::new(1 << 20),
            input: BytesMut::new(),
            last: BytesMut::new(),
            unflushed: 0,
            late: false,
        }
    }

    /// One frame through the pipeline; returns the opcode of its answer.
    pub fn one(&mut self, frame: &[u8]) -> u8 {
        let Bench {
            rt, local, wire, ..
        } = self;
        local.block_on(rt, wire.one(frame))
    }

    /// `n` frames, taken in turn from `frames`, through the pipeline in one runtime entry;
    /// `each` sees every answer's opcode.
    pub fn run(&mut self, frames: &[Vec<u8>], n: usize, mut each: impl FnMut(u8)) {
        let Bench {
            rt, local, wire, ..
        } = self;
        local.block_on(rt, async {
            for frame in frames.iter().cycle().take(n) {
                each(wire.one(frame).await);
            }
        });
    }

    /// The shard and the connection.
    pub fn wire(&self) -> &Wire {
        &self.wire
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
/// A standalone shard with `config`, one connection, and the schema every path uses.
pub fn bench_with(config: ServerConfig) -> (Bench, tempfile::TempDir) {
    bench_with_auth(config, sluice_engine::auth::AuthConfig::default())
}

/// [`bench_with`] with the authenticator and authorizer of `auth`; with passwords, the
/// connection starts logged in as the default superuser.
pub fn bench_with_auth(
    config: ServerConfig,
    auth: sluice_engine::auth::AuthConfig,
) -> (Bench, tempfile::TempDir) {
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
    let ack_barrier = storage.ack_barrier();
    let engine = Engine::open_with_auth(storage, info, auth).expect("engine");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    let (shard, standalone) = {
        let _entered = rt.enter();
        ShardCtx::standalone(config, engine, ack_barrier)
    };
    let conn = Rc::new(ConnState::new(&shard));
    // As after STARTUP (and a login, when a password is asked), uncompressed.
    conn.ready.set(true);
    if auth.authenticator == sluice_engine::auth::AuthenticatorKind::Password {
        conn.session.borrow_mut().user = Some(user(sluice_engine::auth::DEFAULT_SUPERUSER));
    }
    let mut b = Bench {
        rt,
        local,
        wire: Wire {
            shard,
            conn,
            decoder: FrameDecoder::new(1 << 20),
            input: BytesMut::with_capacity(64 << 10),
            last: BytesMut::with_capacity(64 << 10),
            unflushed: 0,
            late: false,
        },
        _standalone: standalone,
    };
    for (i, ddl) in [
        "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
        "CREATE TABLE ks.t (k int PRIMARY KEY, v int)",
        "CREATE TABLE ks.limited (k int PRIMARY KEY, v int) WITH per_partition_rate_limit = {'max_writes_per_second': 1}",
        "CREATE TABLE ks.roomy (k int PRIMARY KEY, v int) WITH per_partition_rate_limit = {'max_writes_per_second': 1000000000}",
        "CREATE TABLE ks.wide (k bigint, c int, v blob, PRIMARY KEY (k, c))",
        "CREATE TABLE ks.narrow (k bigint PRIMARY KEY, v blob)",
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(b.one(&query_frame(i as i16, ddl)), Opcode::Result as u8);
    }
    (b, dir)
}

pub fn setup(path: &str) -> (Bench, tempfile::TempDir, Vec<Vec<u8>>, u8) {
    let config = if path == "overloaded" {
        // One execution slot and a one-request queue, both taken: every frame is shed.
        fixed_admission_config(1, 1)
    } else {
        ServerConfig::new("127.0.0.1:0".parse().expect("addr"), 1, "bench".into())
    };
    let auth = if path == "served_auth" {
        sluice_engine::auth::AuthConfig {
            authenticator: sluice_engine::auth::AuthenticatorKind::Password,
            authorizer: sluice_engine::auth::AuthorizerKind::Cassandra,
            bcrypt_cost: sluice_engine::auth::MIN_BCRYPT_COST,
        }
    } else {
        sluice_engine::auth::AuthConfig::default()
    };
    let (mut b, dir) = bench_with_auth(config, auth);
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
            assert_eq!(b.one(&query_frame(i as i16, q)), Opcode::Result as u8);
        }
        b.wire.conn.session.borrow_mut().user = Some(user("app"));
    }
    let read = match path {
        "read" => Some((ReadTable::Wide, Placement::Memtable)),
        "read_tables" => Some((ReadTable::Wide, Placement::EveryTable)),
        "read_spread" => Some((ReadTable::Wide, Placement::Spread)),
        "read_narrow" => Some((ReadTable::Narrow, Placement::Memtable)),
        "read_narrow_spread" => Some((ReadTable::Narrow, Placement::Spread)),
        _ => None,
    };
    if let Some((table, placement)) = read {
        let frames = b.read_frames(table, placement);
        return (b, dir, frames, Opcode::Result as u8);
    }
    if path == "write" {
        let insert = b.populate(ReadTable::Wide, Placement::Memtable);
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
    let text = match path {
        "served" | "overloaded" | "served_auth" => "INSERT INTO ks.t (k, v) VALUES (?, ?)",
        "rate_limited" => "INSERT INTO ks.limited (k, v) VALUES (?, ?)",
        "served_limited" => "INSERT INTO ks.roomy (k, v) VALUES (?, ?)",
        "expired" => "INSERT INTO ks.t (k, v) VALUES (?, ?) USING TIMEOUT 1ms",
        other => panic!("unknown path {other}"),
    };
    let prepared = b.wire.shard.engine.prepare(None, text).expect("prepare");
    let frame = execute_frame(7, &prepared.id, 1, 2);
    let expected = if matches!(path, "served" | "served_limited" | "served_auth") {
        Opcode::Result as u8
    } else {
        Opcode::Error as u8
    };
    if path == "overloaded" {
        // Take the execution slot and the queue's place for good (the tickets are never
        // released), so that every frame measured finds the queue full.
        let arrival = Instant::now();
        let shard = &b.wire.shard;
        for _ in 0..2 {
            let mut input = BytesMut::from(&frame[..]);
            let f = b
                .wire
                .decoder
                .decode(&mut input)
                .expect("frame")
                .expect("frame");
            let admit =
                shard
                    .admission
                    .borrow_mut()
                    .admit(&f.header, arrival.into(), 1, &shard.metrics);
            assert!(matches!(admit, Admit::Accept(_)));
        }
    }
    b.wire.late = path == "expired";
    (b, dir, vec![frame], expected)
}

impl Bench {
    /// Disk tables of user data now (compaction may merge them while the path runs).
    pub fn disk_tables(&self) -> usize {
        self.wire.shard.engine.storage().disk_table_count()
    }

    /// Writes every partition of `table` where `placement` says and returns the id of the
    /// prepared INSERT.
    fn populate(&mut self, table: ReadTable, placement: Placement) -> [u8; 16] {
        let engine = self.wire.shard.engine.clone();
        let text = match table {
            ReadTable::Wide => "INSERT INTO ks.wide (k, c, v) VALUES (?, ?, ?)",
            ReadTable::Narrow => "INSERT INTO ks.narrow (k, v) VALUES (?, ?)",
        };
        let insert = engine.prepare(None, text).expect("prepare");
        let rounds = match placement {
            Placement::Memtable => 1,
            Placement::EveryTable | Placement::Spread => DISK_TABLES,
        };
        for round in 0..rounds {
            for k in 0..PARTITIONS {
                if placement == Placement::Spread && k as usize % DISK_TABLES != round {
                    continue;
                }
                let key = k.to_be_bytes();
                let values: &[&[u8]] = match table {
                    ReadTable::Wide => &[&key, &0i32.to_be_bytes(), &WIDE_VALUE],
                    ReadTable::Narrow => &[&key, &WIDE_VALUE],
                };
                let f = execute_frame_with(1, &insert.id, values);
                assert_eq!(self.one(&f), Opcode::Result as u8);
            }
            if placement != Placement::Memtable {
                engine.storage().flush_memtables(Duration::from_secs(60));
            }
        }
        if placement != Placement::Memtable {
            assert_eq!(engine.storage().disk_table_count(), DISK_TABLES);
        }
        insert.id
    }

    /// Writes every partition of `table` where `placement` says and returns a read frame
    /// per partition, in a scattered order.
    fn read_frames(&mut self, table: ReadTable, placement: Placement) -> Vec<Vec<u8>> {
        self.populate(table, placement);
        let text = match table {
            ReadTable::Wide => "SELECT k, c, v FROM ks.wide WHERE k = ?",
            ReadTable::Narrow => "SELECT k, v FROM ks.narrow WHERE k = ?",
        };
        let select = self.wire.shard.engine.prepare(None, text).expect("prepare");
        let frames: Vec<Vec<u8>> = scattered_partitions()
            .map(|k| execute_frame_with(2, &select.id, &[&k.to_be_bytes()]))
            .collect();
        // Every read finds its row: the answer carries the value.
        for f in [&frames[0], &frames[frames.len() - 1]] {
            assert_eq!(self.one(f), Opcode::Result as u8);
            assert!(
                self.wire
                    .last
                    .windows(WIDE_VALUE.len())
                    .any(|w| w == WIDE_VALUE),
                "row not found"
            );
        }
        frames
    }
}
