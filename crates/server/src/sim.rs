//! The overload simulation: one real shard (`ShardCtx::standalone_with_clock`) over a manual
//! clock, fed real EXECUTE frames from several simulated connections with open-loop Poisson
//! arrivals, through the reader's real per-frame stage (`connection::handle_frame`) and the
//! real arrival stamps of a read (`socket_wait::LastRead`, as if the kernel stamped each
//! read's newest byte). Nothing of the request path is modelled: admission, classify, check,
//! the engine and storage, and the reply all run as in a server.
//!
//! What is simulated is what a test cannot own:
//! - time: the shard's clock moves only when the simulation moves it;
//! - the CPU: one execution costs a seeded random service time (the clock advances by it when
//!   the engine returns, see `ShardClock::executed`), and an answer turned away costs what
//!   the real binary spends on one (the simulation advances the clock when it finds it);
//! - the sockets: a connection's frames wait in a fake socket from their intended send time
//!   until its reader reads them; answers are taken from the connection's outbox;
//! - the scheduler: a FIFO run queue, as tokio's current-thread runtime keeps one. A reader
//!   whose socket is empty waits, and its socket's next bytes wake it (to the back of the
//!   queue); a reader runs until its socket is empty or it has handled one quantum
//!   (`connection::READ_QUANTUM`, counted as the reader counts it), then yields (to the
//!   back). The loop-lag probe's timer queues it, and it measures one trip through the
//!   queue, as the shard's probe task does. Requests that wait (queued admissions) are
//!   tokio tasks of the same `LocalSet`, run between two turns.
//!
//! Each answer's latency counts from its request's intended send time, in simulated time, and
//! each run prints where the slowest 1% of its served requests waited: unread in the socket
//! (for their reader's turn on the event loop), in the read buffer, in the admission queue,
//! and executing (docs/decisions/2026-11-26-admitted-latency-under-overload.md).

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use sluice_engine::{Engine, NodeInfo};
use sluice_overload::clock::duration_nanos;
use sluice_overload::Nanos;
use sluice_protocol::frame::{FrameDecoder, Opcode, HEADER_LEN};
use sluice_protocol::Request as ClientRequest;
use sluice_protocol::{ErrorCode, QueryParameters, Value};

use crate::clock::manual::ManualClock;
use crate::clock::ShardClock;
use crate::connection::{handle_frame, ConnState, BACKLOG_SAMPLE, READ_QUANTUM};
use crate::pipeline::admit::is_paced;
use crate::read_ahead::{read_ahead, ReadAheadCharge};
use crate::shard::{ShardCtx, Standalone};
use crate::socket_wait::{LastRead, Read, ReadArrivals};
use crate::ServerConfig;

/// Mean CPU time of one execution, unless a run sets its own: the shard's capacity is its
/// inverse (10,000 a second).
const SERVICE: Duration = Duration::from_micros(100);
/// CPU time of an answer turned away from its header (`Overloaded`): its share of a small
/// write on the real binary (`scripts/cost.sh`) times a small write's time on one shard
/// (derivation in docs/decisions/2026-11-26-simulation-runs-the-real-pipeline.md).
const OVERLOADED_COST: Duration = Duration::from_nanos(165);
/// CPU time of an answer turned away after its body was read (expired, rate-limited),
/// derived in the same way.
const LATE_REJECTION_COST: Duration = Duration::from_nanos(600);
/// Client connections.
const CONNECTIONS: usize = 8;
/// Simulated time before the measurement starts (the controllers settle), unless a run
/// sets its own.
const WARMUP: Duration = Duration::from_millis(200);
/// Simulated time measured, unless a run sets its own.
const MEASURED: Duration = Duration::from_millis(600);
/// Largest socket read, as the reader's first read takes.
const READ_BYTES: usize = 64 << 10;
/// Partitions written.
const PARTITIONS: i32 = 1000;
/// The error code of `Overloaded`.
const OVERLOADED: u32 = ErrorCode::Overloaded as u32;
/// The error code of Write_timeout.
const WRITE_TIMEOUT: u32 = ErrorCode::WriteTimeout as u32;

/// A small deterministic generator (SplitMix64): the simulation must not depend on a
/// random source it does not seed.
struct SplitMix(u64);

impl SplitMix {
    /// The next 64 random bits.
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Exponentially distributed with mean `mean` nanoseconds.
    fn exp(&mut self, mean: f64) -> u64 {
        (-mean * self.unit().ln()) as u64
    }
}

/// One simulated client connection: its client's queue, its fake socket and what its reader
/// knows.
struct Conn {
    /// The server's state of the connection (its outbox holds the answers).
    state: Rc<ConnState>,
    /// The client's side and the kernel's socket buffer.
    net: FakeSocket,
    /// What the reader holds of the shard's read-ahead pool.
    charge: ReadAheadCharge,
    /// A windowed client's requests to send, one per answer it took.
    sends_owed: usize,
    /// Of a windowed client's window, the requests sent so far.
    window_sent: usize,
    /// The client sends one request per answer (a window), not on a schedule.
    windowed: bool,
    /// Bytes read and not yet handed over.
    buf: BytesMut,
    /// Cuts frames out of `buf`, as the reader's does.
    decoder: FrameDecoder,
    /// The last read, which bounds when the next one's bytes can have arrived.
    last_read: LastRead,
    /// The arrivals of the frames of the last read.
    arrivals: ReadArrivals,
    /// The end of the reader's last backpressure pause.
    resumed_at: Instant,
    /// The reader found its socket empty and waits for bytes.
    idle: bool,
    /// When the reader samples its backlog next (with `--admission-pace-windows on`).
    next_backlog_sample: Instant,
    /// When the request on each stream was handed to `handle_frame`, the age its arrival
    /// stamp gave it then, and the execution cost drawn for it (nanoseconds).
    handled_at: Vec<(Nanos, u64, u64)>,
    /// Answers taken from the outbox and not yet parsed.
    answers: BytesMut,
}

/// A client's queue and the kernel's receive buffer of one connection. A request waits in
/// the client until the socket has room and one of the 32,768 stream ids is free, as a
/// client behind TCP's flow control does.
struct FakeSocket {
    /// Requests the client meant to send and could not yet: (intended send time, frame
    /// with its stream id still to be set).
    client: VecDeque<(Nanos, BytesMut)>,
    /// Frames in the kernel's buffer, not yet read: (when they entered it, frame).
    socket: VecDeque<(Nanos, Bytes)>,
    /// Bytes in `socket`.
    socket_bytes: usize,
    /// Most bytes `socket` holds (the kernel's receive buffer).
    socket_limit: usize,
    /// The client's first request waits for room (or a stream id): it enters the socket
    /// when room is made, not when it was meant to be sent.
    blocked: bool,
    /// Stream ids not in use.
    free_streams: Vec<i16>,
    /// Intended send time of the request on each stream.
    sent_at: Vec<Nanos>,
    /// When the request on each stream was read from the socket.
    read_at: Vec<Nanos>,
}

impl FakeSocket {
    /// Moves the client's requests into the socket while it has room and a stream id is
    /// free, at `now`. True if the socket was empty and is not now.
    fn pass_client_frames(&mut self, now: Nanos) -> bool {
        let was_empty = self.socket.is_empty();
        while let Some((intended, frame)) = self.client.front() {
            let room = self.socket_limit.saturating_sub(self.socket_bytes);
            if frame.len() > room && !self.socket.is_empty() {
                self.blocked = true;
                break;
            }
            let Some(stream) = self.free_streams.pop() else {
                self.blocked = true;
                break;
            };
            let intended = *intended;
            let Some((_, mut frame)) = self.client.pop_front() else {
                break;
            };
            frame[2..4].copy_from_slice(&stream.to_be_bytes());
            self.sent_at[stream as usize] = intended;
            self.socket_bytes += frame.len();
            let entered = if self.blocked {
                intended.max(now)
            } else {
                intended
            };
            self.socket.push_back((entered, frame.freeze()));
        }
        if self.client.is_empty() {
            self.blocked = false;
        }
        was_empty && !self.socket.is_empty()
    }

    /// Reads whole frames of at most `want` bytes into `buf` at `now`, the client refilling
    /// the socket as it empties (a read that does not wait). Returns the bytes read.
    fn read_into(&mut self, buf: &mut BytesMut, want: usize, now: Nanos) -> usize {
        let mut len = 0;
        loop {
            self.pass_client_frames(now);
            let Some((_, frame)) = self.socket.front() else {
                break;
            };
            if len + frame.len() > want {
                break;
            }
            len += frame.len();
            let stream = i16::from_be_bytes([frame[2], frame[3]]);
            self.read_at[stream as usize & 0x7fff] = now;
            buf.extend_from_slice(frame);
            self.socket_bytes -= frame.len();
            self.socket.pop_front();
        }
        len
    }

    /// True while the client or the socket holds a request.
    fn holds_requests(&self) -> bool {
        !self.client.is_empty() || !self.socket.is_empty()
    }
}

/// What became of the requests sent during the measured period.
#[derive(Debug, Default, Clone, PartialEq)]
struct Outcomes {
    /// Requests sent.
    sent: u64,
    /// Of them, answered with a result.
    served: u64,
    /// Answers served within their deadline while the period lasted.
    goodput: u64,
    /// Answered `Overloaded`.
    overloaded: u64,
    /// Answered with a write timeout.
    expired: u64,
    /// Answered otherwise (none expected).
    other: u64,
    /// Latencies of the served requests, from their intended send time (nanoseconds).
    latencies: Vec<u64>,
    /// Where each served request's latency went, in the order of `latencies`.
    parts: Vec<Parts>,
    /// Simulated time of the measured period in which the shard had nothing to run.
    idle: u64,
    /// The mean cost of the run's executions (nanoseconds): its own capacity is the inverse.
    mean_service: u64,
    /// Connections seen pushing (not slowing down when held back) when the run ended.
    pushing: usize,
    /// The run's mean execution cost as set up, and its measured period (nanoseconds).
    service: u64,
    measured: u64,
}

/// Where a served request's latency went (nanoseconds).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Parts {
    /// From its send time until its reader read it: unread in the socket, waiting for the
    /// reader's turn on the event loop.
    socket: u64,
    /// From its read until `handle_frame` took it: behind the frames read before it.
    buffer: u64,
    /// From `handle_frame` until its answer, less its execution: in the admission queue (a
    /// request that ran as a task may have been charged another frame's draw, so this is
    /// exact only for the requests that ran in their reader, where it is zero).
    queue: u64,
    /// Its execution: the service time drawn for it.
    execution: u64,
    /// Its age as admission saw it (from its arrival stamp) when `handle_frame` took it.
    seen_age: u64,
}

impl Outcomes {
    /// The `q` quantile of the served requests' latencies.
    fn p(&self, q: f64) -> Duration {
        let mut l = self.latencies.clone();
        l.sort_unstable();
        let i = ((l.len() as f64 * q).ceil() as usize).clamp(1, l.len().max(1)) - 1;
        Duration::from_nanos(l.get(i).copied().unwrap_or(0))
    }

    /// Where the slowest 1% of the served requests spent their time: the mean of each part
    /// over the requests at or above the p99, with the p99 of each part over all of them.
    fn tail_parts(&self) -> (Parts, Parts) {
        let p99 = duration_nanos(self.p(0.99));
        let tail: Vec<&Parts> = self
            .latencies
            .iter()
            .zip(&self.parts)
            .filter(|(l, _)| **l >= p99)
            .map(|(_, p)| p)
            .collect();
        let n = tail.len().max(1) as u64;
        let mean = Parts {
            socket: tail.iter().map(|p| p.socket).sum::<u64>() / n,
            buffer: tail.iter().map(|p| p.buffer).sum::<u64>() / n,
            queue: tail.iter().map(|p| p.queue).sum::<u64>() / n,
            execution: tail.iter().map(|p| p.execution).sum::<u64>() / n,
            seen_age: tail.iter().map(|p| p.seen_age).sum::<u64>() / n,
        };
        let quantile = |f: fn(&Parts) -> u64| {
            let mut v: Vec<u64> = self.parts.iter().map(f).collect();
            v.sort_unstable();
            let i = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len().max(1)) - 1;
            v.get(i).copied().unwrap_or(0)
        };
        let p99s = Parts {
            socket: quantile(|p| p.socket),
            buffer: quantile(|p| p.buffer),
            queue: quantile(|p| p.queue),
            execution: quantile(|p| p.execution),
            seen_age: quantile(|p| p.seen_age),
        };
        (mean, p99s)
    }

    /// Requests answered, whatever the answer.
    fn answered(&self) -> u64 {
        self.served + self.overloaded + self.expired + self.other
    }
}

/// One shard, its storage and the prepared INSERT.
struct Shard {
    /// The shard's current-thread runtime.
    rt: tokio::runtime::Runtime,
    /// Its `LocalSet`: requests that wait are its tasks.
    local: tokio::task::LocalSet,
    /// The shard.
    shard: Rc<ShardCtx>,
    /// Its clock.
    clock: ManualClock,
    /// The prepared INSERT's id.
    insert: Bytes,
    /// Keeps the shard's channels open.
    _standalone: Standalone,
    /// Its storage's directory, removed when the run ends.
    _dir: tempfile::TempDir,
}

/// A standalone shard on a manual clock at zero, with storage in a temporary directory and
/// the table written to.
fn shard(pace_windows: bool) -> Shard {
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
    let engine = Engine::open(storage, info).expect("engine");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let clock = ManualClock::new(Nanos::from_secs(1_700_000_000));
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), 1, "sim".into());
    if let Some(admission) = config.admission.as_mut() {
        admission.pace_windows = pace_windows;
    }
    let (shard, standalone) = {
        let _entered = rt.enter();
        ShardCtx::standalone_with_clock(
            config,
            engine,
            ack_barrier,
            ShardClock::manual(clock.clone()),
        )
    };
    let local = tokio::task::LocalSet::new();
    // The schema, through the pipeline itself, before simulated time starts.
    let conn = Rc::new(ConnState::new(&shard));
    conn.ready.set(true);
    for (stream, ddl) in [
        "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
        "CREATE TABLE ks.t (k int PRIMARY KEY, v blob)",
    ]
    .into_iter()
    .enumerate()
    {
        let query = ClientRequest::Query {
            query: Bytes::from_static(ddl.as_bytes()),
            params: QueryParameters::default(),
        };
        let mut buf = query.to_frame(stream as i16);
        let answer = local.block_on(&rt, async {
            let mut decoder = FrameDecoder::new(1 << 20);
            let header = decoder.next_header(&mut buf).expect("frame").expect("frame");
            let arrival = shard.clock.now().into();
            handle_frame(&shard, &conn, &mut buf, header, arrival, |_| 0).await;
            let give_up = Instant::now() + Duration::from_secs(20);
            while conn.outbox.pending() == 0 {
                assert!(Instant::now() < give_up, "no answer to {ddl}");
                tokio::task::yield_now().await;
            }
            let mut answer = BytesMut::new();
            conn.outbox.take(&mut answer);
            answer
        });
        assert_eq!(answer[4], Opcode::Result as u8, "{ddl}");
    }
    let insert = shard
        .engine
        .prepare(None, "INSERT INTO ks.t (k, v) VALUES (?, ?)")
        .expect("prepare")
        .id;
    Shard {
        rt,
        local,
        shard,
        clock,
        insert: Bytes::copy_from_slice(&insert),
        _standalone: standalone,
        _dir: dir,
    }
}

impl Conn {
    /// A connection made at `now`, its socket (of `socket_limit` bytes) empty and its
    /// reader waiting.
    fn new(shard: &ShardCtx, now: Instant, socket_limit: usize, windowed: bool) -> Conn {
        let state = Rc::new(ConnState::new(shard));
        // As after STARTUP, uncompressed.
        state.ready.set(true);
        Conn {
            state,
            net: FakeSocket {
                client: VecDeque::new(),
                socket: VecDeque::new(),
                socket_bytes: 0,
                socket_limit,
                blocked: false,
                free_streams: (0..i16::MAX).rev().collect(),
                sent_at: vec![Nanos::ZERO; 1 << 15],
                read_at: vec![Nanos::ZERO; 1 << 15],
            },
            charge: ReadAheadCharge::new(shard.read_ahead.clone()),
            sends_owed: 0,
            window_sent: 0,
            windowed,
            buf: BytesMut::with_capacity(READ_BYTES),
            decoder: FrameDecoder::new(shard.config.max_frame_bytes),
            last_read: LastRead::connected(now),
            arrivals: ReadArrivals::all_at(now),
            resumed_at: now,
            idle: true,
            next_backlog_sample: now,
            handled_at: vec![(Nanos::ZERO, 0, 0); 1 << 15],
            answers: BytesMut::new(),
        }
    }

    /// Reads what the fake socket holds (up to [`READ_BYTES`] of whole frames) at `now`,
    /// and stamps the read as the kernel would: the age of its newest byte. False if the
    /// socket was empty.
    fn read(&mut self, clock: &ManualClock, loop_lag: Duration) -> bool {
        debug_assert!(
            self.buf.is_empty(),
            "a reader reads once its buffer is empty"
        );
        let now = clock.now();
        let mut newest = None;
        let mut len = 0;
        while let Some((sent, frame)) = self.net.socket.front() {
            if len > 0 && len + frame.len() > READ_BYTES {
                break;
            }
            debug_assert!(*sent <= now, "only frames sent by now are delivered");
            len += frame.len();
            newest = Some(*sent);
            let stream = i16::from_be_bytes([frame[2], frame[3]]);
            self.net.read_at[stream as usize & 0x7fff] = now;
            self.buf.extend_from_slice(frame);
            self.net.socket_bytes -= frame.len();
            self.net.socket.pop_front();
        }
        let Some(newest) = newest else { return false };
        let read = Read {
            len,
            newest_waited: now.saturating_duration_since(newest),
            idle_before: self.idle,
            stamped: true,
        };
        self.idle = false;
        let at = clock.instant();
        self.arrivals = self
            .last_read
            .next(&read, READ_BYTES, 0, at, self.resumed_at, loop_lag);
        true
    }
}

/// The open-loop clients: Poisson arrivals at `rate`, dealt round-robin to the connections,
/// each an EXECUTE of the prepared INSERT on a random partition.
struct Offered {
    /// Draws the gaps and the partitions.
    rng: SplitMix,
    /// The prepared INSERT's id.
    insert: Bytes,
    /// Mean time between two sends in the measured period (nanoseconds).
    mean_gap: f64,
    /// Mean time between two sends before the measured period (nanoseconds).
    warmup_gap: f64,
    /// When the next request is sent.
    next_send: Nanos,
    /// The measured period: requests sent in it are the run's figures.
    measured: (Nanos, Nanos),
    /// Requests sent.
    sent: u64,
    /// Requests sent in the measured period.
    sent_measured: u64,
    /// Bytes of each request's value (4 at least).
    value_bytes: usize,
    /// A windowed client's window, built up over `window_ramp` from the start.
    window: usize,
    /// How long a windowed client takes to build its window (zero: at once).
    window_ramp: Duration,
    /// Of the window, the requests due by the last delivery.
    ramped: usize,
}

impl Offered {
    /// Sends every request whose send time came by `now` (and, for a windowed client, one
    /// per answer it took), into its connection's socket as far as it has room; returns the
    /// connections whose reader was waiting for bytes (they become ready).
    fn deliver(&mut self, now: Nanos, conns: &mut [Conn], woken: &mut Vec<usize>) {
        while self.next_send <= now && self.next_send < self.measured.1 {
            let i = (self.sent as usize) % conns.len();
            let intended = self.next_send;
            let frame = self.request(intended);
            conns[i].net.client.push_back((intended, frame));
            Self::pass(&mut conns[i], i, now, woken);
            let gap = if self.next_send < self.measured.0 {
                self.warmup_gap
            } else {
                self.mean_gap
            };
            self.next_send = Nanos(self.next_send.0 + self.rng.exp(gap).max(1));
        }
        for (i, c) in conns.iter_mut().enumerate() {
            if c.windowed && c.window_sent < self.window {
                // The window grows evenly over the ramp, one request per answer besides.
                let ramp = duration_nanos(self.window_ramp).max(1);
                let due = (self.window as u64 * now.0.min(ramp) / ramp) as usize;
                let due = if self.window_ramp.is_zero() {
                    self.window
                } else {
                    due.min(self.window)
                };
                c.sends_owed += due.saturating_sub(c.window_sent);
                c.window_sent = c.window_sent.max(due);
                self.ramped = due;
            }
            while c.sends_owed > 0 && now < self.measured.1 {
                c.sends_owed -= 1;
                let frame = self.request(now);
                c.net.client.push_back((now, frame));
            }
            Self::pass(c, i, now, woken);
        }
    }

    /// An EXECUTE of the INSERT on a random partition, meant to be sent at `intended`
    /// (counted), its stream id to be set when it enters the socket.
    fn request(&mut self, intended: Nanos) -> BytesMut {
        let k = (self.rng.next() % PARTITIONS as u64) as i32;
        let frame = ClientRequest::Execute {
            id: self.insert.clone(),
            params: QueryParameters {
                values: vec![
                    Value::Set(Bytes::copy_from_slice(&k.to_be_bytes())),
                    Value::Set(self.value()),
                ],
                ..QueryParameters::default()
            },
        };
        self.sent += 1;
        if intended >= self.measured.0 && intended < self.measured.1 {
            self.sent_measured += 1;
        }
        frame.to_frame(0)
    }

    /// The value written: the request's number, padded to `value_bytes`.
    fn value(&self) -> Bytes {
        let mut v = (self.sent as i32).to_be_bytes().to_vec();
        v.resize(self.value_bytes.max(4), 0);
        Bytes::from(v)
    }

    /// Moves connection `i`'s waiting requests into its socket; wakes its reader if it was
    /// waiting for bytes.
    fn pass(c: &mut Conn, i: usize, now: Nanos, woken: &mut Vec<usize>) {
        if c.net.pass_client_frames(now) && c.idle && c.buf.is_empty() {
            woken.push(i);
        }
    }

    /// The next send time, if any is left: an open-loop send, or the next step of a window
    /// being built.
    fn next(&self) -> Option<Nanos> {
        let ramp = duration_nanos(self.window_ramp);
        let step = (self.ramped < self.window && ramp > 0)
            .then(|| Nanos((ramp * (self.ramped as u64 + 1)).div_ceil(self.window as u64)));
        let next = step.map_or(self.next_send, |s| s.min(self.next_send));
        (next < self.measured.1).then_some(next)
    }
}

/// A task of the shard's event loop, in its run queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Task {
    /// A connection's reader.
    Reader(usize),
    /// The loop-lag probe, woken by its timer: it notes the time and yields.
    ProbeStarted,
    /// The probe again, after its trip through the run queue.
    ProbeFinished,
}

/// One run at `load` times the shard's capacity (an open-loop client), or of a windowed
/// client (`setup.window`, `load` unused).
fn run(load: f64, seed: u64, setup: &Setup) -> Outcomes {
    let s = shard(setup.pace_windows);
    let Shard {
        rt,
        local,
        shard,
        clock,
        insert,
        ..
    } = &s;
    let capacity = 1e9 / setup.service.as_nanos() as f64;
    let end = Nanos(duration_nanos(setup.warmup + setup.measured));
    let measured = (Nanos(duration_nanos(setup.warmup)), end);
    let mut offered = Offered {
        rng: SplitMix(seed),
        insert: insert.clone(),
        mean_gap: 1e9 / (capacity * load),
        warmup_gap: 1e9 / (capacity * setup.step_from_percent.map_or(load, |p| p as f64 / 100.0)),
        next_send: if setup.window.is_some() {
            end
        } else {
            Nanos::ZERO
        },
        measured,
        sent: 0,
        sent_measured: 0,
        value_bytes: setup.value_bytes,
        window: setup.window.unwrap_or(0),
        window_ramp: setup.window_ramp,
        ramped: 0,
    };
    let mut service = SplitMix(seed ^ 0xC0FF_EE00);
    let mut conns: Vec<Conn> = (0..setup.connections)
        .map(|_| {
            Conn::new(
                shard,
                clock.instant(),
                setup.socket_bytes,
                setup.window.is_some(),
            )
        })
        .collect();
    let mut out = Outcomes {
        service: duration_nanos(setup.service),
        measured: duration_nanos(setup.measured),
        ..Outcomes::default()
    };
    let lag_every = shard
        .admission
        .borrow()
        .lag_probe_interval()
        .map(duration_nanos);
    let mut probe_due = lag_every.map(Nanos);
    let deadline = duration_nanos(shard.config.timeouts.write);
    let mut run_queue: VecDeque<Task> = VecDeque::new();
    let mut woken = Vec::new();
    let mut unflushed = 0usize;
    let wall_limit = Instant::now() + Duration::from_secs(120);
    local.block_on(rt, async {
        loop {
            assert!(
                Instant::now() < wall_limit,
                "the simulation runs in bounded time"
            );
            // Between two task polls the runtime polls its driver: sockets that received
            // bytes wake their readers, and the probe's timer fires.
            let now = clock.now();
            offered.deliver(now, &mut conns, &mut woken);
            run_queue.extend(woken.drain(..).map(Task::Reader));
            if probe_due.is_some_and(|due| due <= now) {
                probe_due = None;
                run_queue.push_back(Task::ProbeStarted);
            }
            // Requests that waited (queued admissions) run as tasks of their own.
            tokio::task::yield_now().await;
            for c in conns.iter_mut() {
                unflushed += collect(c, clock, measured, deadline, &mut out);
            }
            let Some(task) = run_queue.pop_front() else {
                let busy = shard.admission.borrow().slots_in_use() > 0
                    || conns.iter().any(|c| c.net.holds_requests());
                if offered.next().is_none() && !busy {
                    break;
                }
                // Idle: time moves to the next arrival or timer.
                match offered.next().into_iter().chain(probe_due).min() {
                    Some(t) if t > now => {
                        if now >= measured.0 && now < measured.1 {
                            out.idle += t.0.min(measured.1 .0) - now.0;
                        }
                        clock.advance_to(t)
                    }
                    _ => clock.advance(Duration::from_micros(1)),
                }
                continue;
            };
            let c = match task {
                Task::ProbeStarted => {
                    shard
                        .admission
                        .borrow_mut()
                        .lag_probe_started(clock.instant());
                    run_queue.push_back(Task::ProbeFinished);
                    continue;
                }
                Task::ProbeFinished => {
                    shard
                        .admission
                        .borrow_mut()
                        .lag_probe_finished(clock.instant(), &shard.metrics);
                    probe_due = lag_every.map(|every| Nanos(now.0 + every));
                    continue;
                }
                Task::Reader(c) => c,
            };
            // One turn of reader `c`, as `connection::serve` runs it: frames from its buffer,
            // a read whenever the buffer is empty, until its socket is empty (it waits) or
            // it has handled a quantum (it yields).
            let mut since_yield = 0usize;
            loop {
                if since_yield >= READ_QUANTUM {
                    let conn = &mut conns[c];
                    // As `connection::serve` reads ahead before it yields.
                    if setup.read_ahead {
                        let now = clock.now();
                        let net = &mut conn.net;
                        let unread = conn.buf.len();
                        let read = read_ahead(
                            shard,
                            &conn.state,
                            &mut conn.buf,
                            &mut conn.charge,
                            |b, want| net.read_into(b, want, now),
                        );
                        conn.arrivals.read_ahead(unread, read, clock.instant());
                    }
                    run_queue.push_back(Task::Reader(c));
                    break;
                }
                if conns[c].buf.is_empty() {
                    offered.deliver(clock.now(), &mut conns, &mut woken);
                }
                let conn = &mut conns[c];
                if conn.buf.is_empty() {
                    watch_backlog(shard, conn, clock.instant());
                    let lag = shard.admission.borrow().loop_lag(clock.instant());
                    if !conn.read(clock, lag) {
                        conn.idle = true;
                        break;
                    }
                }
                let header = match conn.decoder.next_header(&mut conn.buf) {
                    Ok(Some(h)) => h,
                    other => panic!("the simulation sends whole, valid frames: {other:?}"),
                };
                let frame_len = HEADER_LEN + header.length as usize;
                let paced = is_paced(shard, &conn.state);
                let arrival = conn
                    .arrivals
                    .next_arrival(frame_len, || paced.then(|| clock.instant()));
                since_yield += 1;
                let cost = service.exp(setup.service.as_nanos() as f64).max(1);
                conn.handled_at[header.stream as usize & 0x7fff] = (
                    clock.now(),
                    duration_nanos(clock.instant().saturating_duration_since(arrival.at())),
                    cost,
                );
                clock.set_execution_cost(Duration::from_nanos(cost));
                // Over an in-flight cap, the reader reads ahead as `connection::serve` does.
                let state = conn.state.clone();
                let mut buf = std::mem::take(&mut conn.buf);
                let (net, charge, arrivals) = (&mut conn.net, &mut conn.charge, &mut conn.arrivals);
                let reads_ahead = setup.read_ahead;
                let read_ahead = |b: &mut BytesMut| {
                    let now = clock.now();
                    if !reads_ahead {
                        return 0;
                    }
                    let unread = b.len().saturating_sub(frame_len);
                    let read = read_ahead(shard, &state, b, charge, |b, want| {
                        net.read_into(b, want, now)
                    });
                    arrivals.read_ahead(unread, read, clock.instant());
                    read
                };
                let handled =
                    handle_frame(shard, &state, &mut buf, header, arrival, read_ahead).await;
                conn.buf = buf;
                if let Some(at) = handled.resumed_at {
                    conn.resumed_at = at;
                    conn.arrivals = conn.arrivals.resumed(at);
                }
                since_yield += handled.weight;
                unflushed += collect(conn, clock, measured, deadline, &mut out);
            }
            woken.retain(|&w| w != c);
            if unflushed > 64 << 10 {
                // As the connection's writer does before it writes answers.
                unflushed = 0;
                shard.ack_barrier.flush().expect("ack barrier");
            }
        }
        for c in conns.iter_mut() {
            collect(c, clock, measured, deadline, &mut out);
        }
    });
    assert_eq!(
        shard.admission.borrow().slots_in_use(),
        0,
        "every admission slot is released"
    );
    out.sent = offered.sent_measured;
    out.pushing = conns.iter().filter(|c| c.state.pushing.get()).count();
    drop(conns);
    assert_eq!(
        (shard.read_ahead.total(), shard.read_ahead.holders()),
        (0, 0),
        "every read-ahead byte is given back"
    );
    let (executions, cost) = clock.executions();
    out.mean_service = duration_nanos(cost) / executions.max(1);
    out
}

/// What `connection::watch_backlog` does before a read, with the fake socket's unread bytes
/// for the kernel's (`FIONREAD`). The simulation's reads never exceed the 64 KiB that a
/// connection held back reads, so the read size is left alone.
fn watch_backlog(shard: &ShardCtx, c: &mut Conn, now: Instant) {
    if !shard.admission.borrow().paces_windows() || now < c.next_backlog_sample {
        return;
    }
    c.next_backlog_sample = now + BACKLOG_SAMPLE;
    let unread = c.net.socket_bytes;
    let mut watch = c.state.backlog.get();
    let at = shard.admission.borrow().nanos_of(now);
    c.state
        .pushing
        .set(watch.observe(at, (unread + c.buf.len()) as u64, &shard.growing_backlogs));
    c.state.backlog.set(watch);
}

/// Takes `c`'s answers from its outbox and accounts them at the current simulated time,
/// charging each rejection its CPU cost first. Returns the answer bytes taken.
fn collect(
    c: &mut Conn,
    clock: &ManualClock,
    measured: (Nanos, Nanos),
    deadline: u64,
    out: &mut Outcomes,
) -> usize {
    let mut taken = BytesMut::new();
    c.state.outbox.take(&mut taken);
    let n = taken.len();
    c.answers.extend_from_slice(&taken);
    while c.answers.len() >= HEADER_LEN {
        let len = u32::from_be_bytes([c.answers[5], c.answers[6], c.answers[7], c.answers[8]]);
        if c.answers.len() < HEADER_LEN + len as usize {
            break;
        }
        let f = c.answers.split_to(HEADER_LEN + len as usize);
        let stream = i16::from_be_bytes([f[2], f[3]]);
        let opcode = f[4];
        let code = (opcode == Opcode::Error as u8)
            .then(|| u32::from_be_bytes([f[9], f[10], f[11], f[12]]));
        clock.advance(match code {
            None => Duration::ZERO,
            Some(OVERLOADED) => OVERLOADED_COST,
            Some(_) => LATE_REJECTION_COST,
        });
        let now = clock.now();
        let sent = c.net.sent_at[stream as usize & 0x7fff];
        c.net.free_streams.push(stream);
        if c.windowed {
            c.sends_owed += 1;
        }
        let latency = now.0.saturating_sub(sent.0);
        let served = opcode == Opcode::Result as u8;
        // Goodput: answers served within their deadline during the measured period.
        if served && latency <= deadline && measured.0 <= now && now < measured.1 {
            out.goodput += 1;
        }
        if sent < measured.0 {
            continue;
        }
        match code {
            None if served => {
                out.served += 1;
                out.latencies.push(latency);
                let read = c.net.read_at[stream as usize & 0x7fff];
                let (handled, seen_age, cost) = c.handled_at[stream as usize & 0x7fff];
                let admitted = now.0.saturating_sub(handled.0);
                out.parts.push(Parts {
                    socket: read.0.saturating_sub(sent.0),
                    buffer: handled.0.saturating_sub(read.0),
                    queue: admitted.saturating_sub(cost),
                    execution: cost,
                    seen_age,
                });
            }
            Some(OVERLOADED) => out.overloaded += 1,
            Some(WRITE_TIMEOUT) => out.expired += 1,
            _ => out.other += 1,
        }
    }
    n
}

/// The sweep's offered loads, as multiples of the shard's capacity.
const LOADS: [f64; 6] = [0.5, 1.0, 2.0, 3.0, 5.0, 10.0];

/// What a run is set up with, besides its load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Setup {
    /// Which set of seeds (0: the one the tables in the records use).
    seeds: u64,
    /// `--admission-pace-windows`.
    pace_windows: bool,
    /// Client connections (the open-loop load is dealt among them).
    connections: usize,
    /// Each connection's client keeps this many requests in flight (a driver's window), one
    /// new request per answer, instead of an open-loop load.
    window: Option<usize>,
    /// Bytes each connection's kernel receive buffer holds; beyond them the client's own
    /// queue grows.
    socket_bytes: usize,
    /// The reader reads ahead before it pauses over an in-flight cap (`crate::read_ahead`);
    /// false shows what pacing does without it.
    read_ahead: bool,
    /// Mean CPU time of one execution.
    service: Duration,
    /// Bytes of each request's value (the frame is about 60 bytes more).
    value_bytes: usize,
    /// A windowed client builds its window evenly over this long (zero: at once).
    window_ramp: Duration,
    /// Simulated time before the measurement starts.
    warmup: Duration,
    /// Simulated time measured, after the warm-up.
    measured: Duration,
    /// The open-loop load during the warm-up, in percent of capacity, if it is not the
    /// measured load: a step of a sweep, measured from the moment the load changes.
    step_from_percent: Option<u32>,
}

impl Setup {
    /// Seed set 0, pacing on (`--admission-pace-windows on`), eight open-loop connections with
    /// sockets that hold everything, 100 us requests of 4-byte values.
    const DEFAULT: Setup = Setup {
        seeds: 0,
        pace_windows: true,
        connections: CONNECTIONS,
        window: None,
        socket_bytes: usize::MAX,
        read_ahead: true,
        service: SERVICE,
        value_bytes: 4,
        window_ramp: Duration::ZERO,
        warmup: WARMUP,
        measured: MEASURED,
        step_from_percent: None,
    };
}

/// The seed of the run at `load` in seed set `seeds` (each load its own, every run the same).
fn seed(load: f64, seeds: u64) -> u64 {
    0x5EED ^ (load * 10.0) as u64 ^ (seeds << 16)
}

/// Goodput as a fraction of the shard's capacity.
fn goodput(o: &Outcomes) -> f64 {
    o.goodput as f64 * o.service as f64 / o.measured.max(1) as f64
}

/// Goodput as a fraction of the capacity the run's own service times gave: the mean of a
/// few thousand exponential draws moves by a percent or two between seeds, and so does
/// [`goodput`], whatever admission does.
fn goodput_of_own_capacity(o: &Outcomes) -> f64 {
    o.goodput as f64 * o.mean_service as f64 / o.measured.max(1) as f64
}

/// Runs `load`, prints its row of the table and where the slowest 1% of its served requests
/// waited, and checks what every run must show.
fn run_and_print(load: f64, setup: Setup) -> Outcomes {
    let started = Instant::now();
    let o = run(load, seed(load, setup.seeds), &setup);
    println!(
        "{:>4}x {:>7} {:>7} {:>7.3} {:>7.3} {:>10} {:>7} {:>9.2?} {:>9.2?} {:>9.2?} {:>7.0?}",
        load,
        o.sent,
        o.served,
        goodput(&o),
        goodput_of_own_capacity(&o),
        o.overloaded,
        o.expired,
        o.p(0.50),
        o.p(0.99),
        o.p(1.0),
        started.elapsed()
    );
    let (tail, p99s) = o.tail_parts();
    let us = |n: u64| n as f64 / 1e3;
    println!(
        "      slowest 1% (mean, us): unread {:.0}, in the read buffer {:.0}, queued {:.0}, \
         executing {:.0}; age admission saw {:.0}. p99 of each: {:.0} / {:.0} / {:.0} / {:.0} / \
         {:.0}. Served after a wait in the queue: {}. Idle {:.1}%",
        us(tail.socket),
        us(tail.buffer),
        us(tail.queue),
        us(tail.execution),
        us(tail.seen_age),
        us(p99s.socket),
        us(p99s.buffer),
        us(p99s.queue),
        us(p99s.execution),
        us(p99s.seen_age),
        o.parts.iter().filter(|p| p.queue > 0).count(),
        o.idle as f64 / o.measured.max(1) as f64 * 100.0,
    );
    assert_eq!(o.answered(), o.sent, "every request is answered once");
    assert_eq!(o.other, 0, "only results, Overloaded and write timeouts");
    o
}

/// Prints the table's header.
fn print_header() {
    println!(
        "{:>5} {:>7} {:>7} {:>7} {:>7} {:>10} {:>7} {:>9} {:>9} {:>9} {:>7}",
        "load",
        "sent",
        "served",
        "goodput",
        "of own",
        "overloaded",
        "expired",
        "p50",
        "p99",
        "max",
        "wall"
    );
}

/// The overload targets, in simulated time: goodput (answers served within their deadline)
/// of at least 95% of capacity at 3x, 90% at 5x and 80% at 10x; under overload, the p99 of
/// served requests stays under CoDel's slough (twice its target: older requests are shed
/// while overloaded). With pacing on and off (the default). Prints the tables (`--
/// --nocapture`).
#[test]
fn overload_targets_hold_in_simulated_time() {
    for pace_windows in [true, false] {
        println!("pace windows: {pace_windows}");
        print_header();
        let setup = Setup {
            pace_windows,
            ..Setup::DEFAULT
        };
        let rows: Vec<(f64, Outcomes)> = LOADS
            .iter()
            .map(|&l| (l, run_and_print(l, setup)))
            .collect();
        let at = |load: f64| &rows.iter().find(|r| r.0 == load).expect("row").1;
        let light = at(0.5);
        assert_eq!(light.served, light.sent, "at 0.5x every request is served");
        for (load, least) in [(3.0, 0.95), (5.0, 0.90), (10.0, 0.80)] {
            let g = goodput(at(load));
            assert!(
                g >= least,
                "pacing {pace_windows}: goodput at {load}x: {g:.3}"
            );
        }
        // Paced, the eight open-loop connections are seen pushing together, each long before
        // its own backlog would pass the floor of a window (`GrowingBacklogs`).
        if pace_windows {
            for load in [2.0, 3.0, 5.0, 10.0] {
                assert_eq!(at(load).pushing, CONNECTIONS, "pushing at {load}x");
            }
        }
        let slough = sluice_overload::CodelConfig::default().slough;
        for load in [3.0, 5.0, 10.0] {
            let p99 = at(load).p(0.99);
            assert!(
                p99 <= slough,
                "pacing {pace_windows}: p99 at {load}x: {p99:?}"
            );
        }
    }
}

/// The latency target: admitted p99 at 3x within twice the p99 at 0.5x, in three
/// sets of seeds (the light-load p99 alone moves by a third between them). While
/// overloaded, admission serves nothing that waited longer than the overloaded wait
/// (docs/decisions/2026-11-26-admitted-latency-under-overload.md). With pacing on (the
/// eight open-loop connections are seen pushing together within the warm-up) and off.
#[test]
fn admitted_p99_at_3x_is_within_twice_the_p99_at_half_load() {
    for pace_windows in [true, false] {
        println!("pace windows: {pace_windows}");
        print_header();
        for seeds in 0..3 {
            let setup = Setup {
                seeds,
                pace_windows,
                ..Setup::DEFAULT
            };
            let light = run_and_print(0.5, setup).p(0.99);
            let heavy = run_and_print(3.0, setup).p(0.99);
            assert!(
                heavy <= light * 2,
                "pacing {pace_windows}, seeds {seeds}: p99 {heavy:?} at 3x, {light:?} at 0.5x"
            );
        }
    }
}

/// The sweep in four sets of seeds, with pacing off and on (`--admission-pace-windows`):
/// the figures behind pacing's default and the goodput's spread between seeds. Slow (48
/// runs), so it runs only when asked: `cargo test -p sluice-server --lib sim::sweep --
/// --ignored --nocapture`.
#[test]
#[ignore = "a report: run it to print the figures"]
fn sweep_in_four_seed_sets_with_pacing_off_and_on() {
    for pace_windows in [false, true] {
        println!("pace windows: {pace_windows}");
        print_header();
        for seeds in 0..4 {
            for &load in &LOADS {
                run_and_print(
                    load,
                    Setup {
                        seeds,
                        pace_windows,
                        ..Setup::DEFAULT
                    },
                );
            }
        }
    }
}

/// A kernel receive buffer smaller than the backlog watch's floor of frames (32 KiB, some
/// 600 of these frames): the socket fills before a growth can show there.
const SMALL_SOCKET: usize = 32 << 10;

/// One open-loop connection behind a small socket, with pacing on: the case in which the
/// connection, held back over its in-flight cap, was paced by TCP like a window, its
/// requests aged in its client and goodput fell to nothing. The reader reads ahead into its
/// own buffer before it pauses, so the backlog keeps growing where the watch sees it: the
/// connection is seen pushing and the overload targets hold. Without the read-ahead the
/// same runs miss them.
#[test]
fn an_open_loop_client_behind_a_small_socket_is_seen_pushing() {
    let setup = Setup {
        pace_windows: true,
        connections: 1,
        socket_bytes: SMALL_SOCKET,
        ..Setup::DEFAULT
    };
    print_header();
    for (load, least) in [(2.0, 0.95), (3.0, 0.95), (5.0, 0.90), (10.0, 0.80)] {
        let o = run_and_print(load, setup);
        assert_eq!(o.pushing, 1, "seen pushing at {load}x");
        let g = goodput(&o);
        assert!(g >= least, "goodput at {load}x: {g:.3} of capacity");
        let slough = sluice_overload::CodelConfig::default().slough;
        assert!(
            o.p(0.99) <= slough,
            "admitted p99 at {load}x: {:?}",
            o.p(0.99)
        );
    }
    let blind = Setup {
        read_ahead: false,
        ..setup
    };
    // Without it the connection is never seen pushing, and its requests wait in the client
    // longer with every interval: past a second within this short run, past the write
    // deadline soon after (where the real binary's goodput fell to nothing).
    for load in [3.0, 10.0] {
        let o = run_and_print(load, blind);
        assert_eq!(o.pushing, 0, "without the read-ahead at {load}x");
        assert!(o.p(0.99) > Duration::from_secs(1), "{:?}", o.p(0.99));
    }
}

/// A driver's window on one connection (512 requests in flight, 51 ms of work: ten times
/// CoDel's target, far inside the write deadline), with a socket that holds all of it or a
/// small one: with pacing on it is served without one `Overloaded` or timeout; with pacing
/// off, CoDel turns part of it away.
#[test]
fn a_windowed_bulk_load_is_served_without_overloaded() {
    let window = Setup {
        pace_windows: true,
        connections: 1,
        window: Some(512),
        ..Setup::DEFAULT
    };
    print_header();
    for socket_bytes in [usize::MAX, SMALL_SOCKET] {
        let o = run_and_print(
            1.0,
            Setup {
                socket_bytes,
                ..window
            },
        );
        assert_eq!((o.overloaded, o.expired), (0, 0), "{socket_bytes}");
        assert_eq!(o.pushing, 0, "a window is never pushing");
        let g = goodput_of_own_capacity(&o);
        assert!(g >= 0.95, "the shard ran at capacity: {g:.3}");
    }
    let unpaced = run_and_print(
        1.0,
        Setup {
            pace_windows: false,
            ..window
        },
    );
    assert!(unpaced.overloaded > 0, "{unpaced:?}");
}

/// A window with more work than a deadline holds: 256 requests of 10 ms (2.56 s against the
/// 2 s write deadline) of 12 KB each, as a debug build serves the bulk load's 200-row
/// batches, sent at once. The reader reads the window ahead into its buffer; its frames
/// count from when the reader takes them, so none expires and none is turned away, although
/// the client waits longer than the deadline for the last ones.
#[test]
fn a_window_larger_than_a_deadline_of_work_is_served_without_timeouts() {
    let setup = Setup {
        connections: 1,
        window: Some(256),
        service: Duration::from_millis(10),
        value_bytes: 12 << 10,
        warmup: Duration::ZERO,
        measured: Duration::from_secs(3),
        ..Setup::DEFAULT
    };
    print_header();
    for socket_bytes in [usize::MAX, SMALL_SOCKET] {
        let o = run_and_print(
            1.0,
            Setup {
                socket_bytes,
                ..setup
            },
        );
        assert_eq!((o.overloaded, o.expired), (0, 0), "{socket_bytes}");
        assert_eq!(o.served, o.sent, "{socket_bytes}");
        assert_eq!(o.pushing, 0, "a window is never pushing");
        assert!(
            o.p(1.0) > Duration::from_secs(2),
            "the window holds more than a deadline of work: {:?}",
            o.p(1.0)
        );
    }
}

/// A window of 512 requests of 1 ms that its client builds evenly over a second (a slow
/// producer, as cqlsh COPY is): its backlog grows in every interval, by more than the watch's
/// slack, up to 512 frames. Alone on its shard it stays under the floor of a window: never
/// pushing, never `Overloaded`, never expired.
#[test]
fn a_window_built_slowly_is_never_pushing() {
    let o = run_and_print(
        1.0,
        Setup {
            connections: 1,
            window: Some(512),
            window_ramp: Duration::from_secs(1),
            service: Duration::from_millis(1),
            warmup: Duration::ZERO,
            measured: Duration::from_millis(1_500),
            ..Setup::DEFAULT
        },
    );
    assert_eq!((o.overloaded, o.expired, o.pushing), (0, 0, 0));
    assert_eq!(o.served, o.sent);
    assert!(
        o.p(1.0) >= Duration::from_millis(400),
        "the window's backlog was built: {:?}",
        o.p(1.0)
    );
}

/// A read-ahead stops at its connection's bound, which makes the connection pushing (and it
/// then reads nothing more ahead); every byte it held goes back to the shard's pool, and the
/// buffer grown for it is let go.
#[test]
fn a_read_ahead_that_reaches_its_bound_is_pushing_and_gives_its_bytes_back() {
    use crate::read_ahead::{release, MAX_READ_AHEAD_PER_CONNECTION};
    let s = shard(true);
    let pool = s.shard.read_ahead.clone();
    let conn = ConnState::new(&s.shard);
    let mut charge = ReadAheadCharge::new(pool.clone());
    let mut buf = BytesMut::new();
    let flood = |b: &mut BytesMut, want: usize| {
        b.resize(b.len() + want, 0);
        want
    };
    let read = read_ahead(&s.shard, &conn, &mut buf, &mut charge, flood);
    assert_eq!(read, MAX_READ_AHEAD_PER_CONNECTION);
    assert!(conn.pushing.get(), "a full read-ahead is pushing");
    assert_eq!(pool.total(), MAX_READ_AHEAD_PER_CONNECTION);
    let more = read_ahead(&s.shard, &conn, &mut buf, &mut charge, |_, _| {
        panic!("a pushing connection reads nothing ahead")
    });
    assert_eq!(more, 0);
    buf.clear();
    release(&mut charge, &mut buf, 1 << 20);
    assert_eq!((pool.total(), pool.holders()), (0, 0));
    assert!(buf.capacity() < 1 << 20, "the grown buffer is let go");

    // A window's few frames: held, not pushing.
    let window = ConnState::new(&s.shard);
    let mut charge = ReadAheadCharge::new(pool.clone());
    let mut bytes = 64 << 10;
    let read = read_ahead(&s.shard, &window, &mut buf, &mut charge, |b, want| {
        let n = want.min(bytes);
        bytes -= n;
        b.resize(b.len() + n, 0);
        n
    });
    assert_eq!((read, pool.total()), (64 << 10, 64 << 10));
    assert!(!window.pushing.get());
    drop(charge);
    assert_eq!(pool.total(), 0, "a dropped charge gives its bytes back");
}

/// The latency target measured as a sweep measures it, from the moment the load steps from
/// 0.5x to 3x, so that what was served before admission saw the overload counts: CoDel
/// declares an overload at the end of an interval in which the delay stood above target,
/// and until then serves everything younger than its maximum delay (100 ms). A report, not a
/// target that holds (docs/decisions/2026-11-26-admitted-latency-under-overload.md), pacing
/// off as the server's default: `cargo test -p sluice-server --lib sim::from_a_step --
/// --ignored --nocapture`.
#[test]
#[ignore = "a report: run it to print the figures"]
fn from_a_step_to_3x_the_p99_is_the_onset() {
    print_header();
    for seeds in 0..3 {
        let setup = Setup {
            seeds,
            pace_windows: false,
            ..Setup::DEFAULT
        };
        let light = run_and_print(0.5, setup).p(0.99);
        let stepped = run_and_print(
            3.0,
            Setup {
                step_from_percent: Some(50),
                ..setup
            },
        );
        println!(
            "seeds {seeds}: p99 {:?} from the step to 3x, {light:?} at 0.5x",
            stepped.p(0.99)
        );
    }
}

/// Two runs with one seed give the same answers at the same simulated times.
#[test]
fn the_simulation_is_deterministic() {
    let unpaced = Setup {
        pace_windows: false,
        ..Setup::DEFAULT
    };
    let first = run(2.0, 7, &unpaced);
    assert!(first.overloaded > 0 && first.served > 0, "{first:?}");
    assert_eq!(first, run(2.0, 7, &unpaced));
    let read_ahead = Setup {
        pace_windows: true,
        connections: 1,
        socket_bytes: SMALL_SOCKET,
        ..Setup::DEFAULT
    };
    let first = run(3.0, 7, &read_ahead);
    assert!(first.pushing == 1 && first.served > 0, "{first:?}");
    assert_eq!(first, run(3.0, 7, &read_ahead));
}
