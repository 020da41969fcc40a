//! `--client raw`: a cheap CQL client for the generator, so that the server, not the client, is
//! what a run measures. It speaks native protocol v4 directly over tokio TCP (no compression,
//! no retries, no paging) and does three things the `scylla` driver also does, at a fraction of
//! its CPU per request:
//!
//! * **Shard awareness.** SUPPORTED tells the shard count; with a shard-aware port each
//!   connection picks its shard by its source port (`port % nr_shards`), otherwise connections
//!   are opened on the main port until every shard has its share. Each operation goes to a
//!   connection of the shard that owns its partition ([`RawTarget::shard_of`]).
//! * **Pipelining.** Each request takes a stream id from its connection's [`InFlight`] table
//!   and appends its frame to the connection's buffer; the caller that finds no write in
//!   progress yields once, then writes the whole buffer with one non-blocking call, so requests
//!   issued together share a syscall and no task sits between a request and the socket
//!   ([`Conn`]). One reader task per connection reads large chunks and completes every answer
//!   it finds.
//! * **Pre-encoding.** An EXECUTE frame differs between requests only in its stream id and keys:
//!   [`ExecTemplate`] holds the rest, so encoding a request is one copy and two patches.
//!
//! Schema changes stay on the driver's [`Connection`](crate::driver::Connection): setup is not
//! measured.

use crate::driver::{ConsistencyLevel, KEYSPACE, VALUE_LEN};
use crate::runner::Ticket;
use crate::target::{Op, OpKind, Reply, Target};
use anyhow::{anyhow, bail, Context};
use bytes::{Buf, Bytes, BytesMut};
use sluice_protocol::frame::{FLAG_CUSTOM_PAYLOAD, FLAG_TRACING, FLAG_WARNING, RESPONSE_VERSION};
use sluice_protocol::{
    decode_request, BatchEntry, BatchQuery, BatchRequest, Consistency, FrameHeader, Opcode,
    QueryParameters, Request, Value, HEADER_LEN,
};
use sluice_ring::{Node, NodeState, ReplicaMap, Replication, Token, TokenMetadata};
use sluice_types::token::{murmur3_token, shard_of};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{oneshot, Notify};
use tokio::task::AbortHandle;
use tokio::time::Instant;

// ------------------------------------------------------------------ protocol constants

const OP_ERROR: u8 = Opcode::Error as u8;
const OP_READY: u8 = Opcode::Ready as u8;
const OP_AUTHENTICATE: u8 = Opcode::Authenticate as u8;
const OP_SUPPORTED: u8 = Opcode::Supported as u8;
const OP_RESULT: u8 = Opcode::Result as u8;

/// BATCH type UNLOGGED.
const BATCH_UNLOGGED: u8 = 1;
/// RESULT kind of an answer to PREPARE.
const RESULT_PREPARED: i32 = 0x0004;

/// Error codes the outcome classes distinguish.
const ERR_OVERLOADED: u32 = 0x1001;
const ERR_WRITE_TIMEOUT: u32 = 0x1100;
const ERR_READ_TIMEOUT: u32 = 0x1200;
const ERR_CONFIG: u32 = 0x2300;
const ERR_RATE_LIMIT: u32 = 0xF000;

// ------------------------------------------------------------------ client constants

/// Stream ids a connection may have in flight: 1..=32767 (0 is left for setup, negative
/// ids are the server's events).
const MAX_STREAM: i16 = i16::MAX;
/// The reader keeps at least this much free space for each read.
const READ_CHUNK: usize = 64 * 1024;
/// A frame longer than this is taken as a broken stream.
const MAX_FRAME: usize = 256 << 20;
/// Time allowed to connect one connection and complete its handshake and PREPAREs.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Ephemeral source ports tried for shard-aware connections (as ScyllaDB drivers do).
const PORT_LOW: u32 = 49152;
const PORT_HIGH: u32 = 65535;
/// Source ports tried per shard-aware connection before giving up.
const PORT_TRIES: usize = 2000;

// ------------------------------------------------------------------ request encoding

/// A STARTUP frame with `options` (stream 0: setup runs one request at a time).
fn startup_frame(options: &[(&str, &str)]) -> BytesMut {
    let options = options
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Request::Startup(options).to_frame(0)
}

/// A PREPARE frame of one statement.
fn prepare_frame(cql: &str) -> BytesMut {
    Request::Prepare {
        query: Bytes::copy_from_slice(cql.as_bytes()),
    }
    .to_frame(0)
}

/// An EXECUTE frame with every constant byte in place: only the stream id and the keys change
/// from one request to the next, so encoding is one copy and two patches.
#[derive(Clone, Debug)]
struct ExecTemplate {
    frame: Bytes,
    pk_at: usize,
    ck_at: Option<usize>,
    /// A write batch: where each further statement's pk and ck are (the first is above).
    more_rows: Vec<(usize, usize)>,
}

impl ExecTemplate {
    /// The frame of `kind` for the prepared statement `id` at `consistency`, values only;
    /// writes bind (pk bigint, ck int, v blob of `VALUE_LEN` bytes), reads bind pk. The
    /// protocol codec encodes it, and decoding it back tells where the keys sit.
    fn new(id: &[u8], kind: OpKind, consistency: Consistency) -> anyhow::Result<Self> {
        let mut values = vec![Value::Set(Bytes::from_static(&[0; 8]))];
        if kind == OpKind::Write {
            values.push(Value::Set(Bytes::from_static(&[0; 4])));
            // The same bytes as the driver target writes.
            values.push(Value::Set(Bytes::from(vec![0x5a; VALUE_LEN])));
        }
        let request = Request::Execute {
            id: Bytes::copy_from_slice(id),
            params: QueryParameters {
                consistency,
                values,
                ..QueryParameters::default()
            },
        };
        let frame = request.to_frame(0).freeze();
        let mut offsets = value_offsets(&frame)?.into_iter();
        let pk_at = offsets.next().context("EXECUTE template without a key")?;
        let ck_at = if kind == OpKind::Write {
            Some(
                offsets
                    .next()
                    .context("EXECUTE template without a clustering key")?,
            )
        } else {
            None
        };
        Ok(Self {
            frame,
            pk_at,
            ck_at,
            more_rows: Vec::new(),
        })
    }

    /// A write of `rows` rows of one partition as one UNLOGGED BATCH of the prepared write
    /// `id` (clustering keys `ck * rows + i`): a heavier request, so that a multiple of the
    /// server's capacity stays within what one generator core can offer. One row is a plain
    /// EXECUTE.
    fn write_batch(id: &[u8], rows: usize, consistency: Consistency) -> anyhow::Result<Self> {
        if rows <= 1 {
            return Self::new(id, OpKind::Write, consistency);
        }
        let entry = BatchEntry {
            statement: BatchQuery::Prepared(Bytes::copy_from_slice(id)),
            values: vec![
                Value::Set(Bytes::from_static(&[0; 8])),
                Value::Set(Bytes::from_static(&[0; 4])),
                Value::Set(Bytes::from(vec![0x5a; VALUE_LEN])),
            ],
        };
        let request = Request::Batch(BatchRequest {
            batch_type: BATCH_UNLOGGED,
            entries: vec![entry; rows.min(u16::MAX as usize)],
            consistency,
            serial_consistency: None,
            default_timestamp: None,
        });
        let frame = request.to_frame(0).freeze();
        let mut at = batch_key_offsets(&frame)?;
        let (pk_at, ck_at) = *at.first().context("BATCH template without a statement")?;
        Ok(Self {
            frame,
            pk_at,
            ck_at: Some(ck_at),
            more_rows: at.split_off(1),
        })
    }

    /// Appends the frame of `op` on `stream` to `out`.
    fn encode(&self, out: &mut BytesMut, stream: i16, op: &Op) {
        let start = out.len();
        out.extend_from_slice(&self.frame);
        let f = &mut out[start..];
        f[2..4].copy_from_slice(&stream.to_be_bytes());
        f[self.pk_at..self.pk_at + 8].copy_from_slice(&op.pk.to_be_bytes());
        let rows = 1 + self.more_rows.len() as i32;
        if let Some(at) = self.ck_at {
            f[at..at + 4].copy_from_slice(&op.ck.wrapping_mul(rows).to_be_bytes());
        }
        for (i, &(pk_at, ck_at)) in self.more_rows.iter().enumerate() {
            let ck = op.ck.wrapping_mul(rows).wrapping_add(i as i32 + 1);
            f[pk_at..pk_at + 8].copy_from_slice(&op.pk.to_be_bytes());
            f[ck_at..ck_at + 4].copy_from_slice(&ck.to_be_bytes());
        }
    }
}

/// Where each bound value of an uncompressed EXECUTE frame starts, from the frame's start:
/// the decoder hands values out as slices of the body, so their addresses give the offsets.
fn value_offsets(frame: &Bytes) -> anyhow::Result<Vec<usize>> {
    let raw: &[u8; HEADER_LEN] = frame
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .context("frame shorter than its header")?;
    let header = FrameHeader::parse(raw, u32::MAX).map_err(|e| anyhow!("{e}"))?;
    let body = frame.slice(HEADER_LEN..);
    let Request::Execute { params, .. } =
        decode_request(&header, body.clone()).map_err(|e| anyhow!("{e}"))?
    else {
        bail!("not an EXECUTE frame");
    };
    params
        .values
        .iter()
        .map(|v| match v {
            Value::Set(b) => Ok(HEADER_LEN + (b.as_ptr() as usize - body.as_ptr() as usize)),
            _ => bail!("a bound key is not set"),
        })
        .collect()
}

/// Where the first two bound values (pk, ck) of each statement of an uncompressed BATCH
/// frame start, from the frame's start (as [`value_offsets`] for an EXECUTE).
fn batch_key_offsets(frame: &Bytes) -> anyhow::Result<Vec<(usize, usize)>> {
    let raw: &[u8; HEADER_LEN] = frame
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .context("frame shorter than its header")?;
    let header = FrameHeader::parse(raw, u32::MAX).map_err(|e| anyhow!("{e}"))?;
    let body = frame.slice(HEADER_LEN..);
    let Request::Batch(batch) =
        decode_request(&header, body.clone()).map_err(|e| anyhow!("{e}"))?
    else {
        bail!("not a BATCH frame");
    };
    let at = |v: &Value| match v {
        Value::Set(b) => Ok(HEADER_LEN + (b.as_ptr() as usize - body.as_ptr() as usize)),
        _ => bail!("a bound key is not set"),
    };
    batch
        .entries
        .iter()
        .map(|e| match e.values.as_slice() {
            [pk, ck, ..] => Ok((at(pk)?, at(ck)?)),
            _ => bail!("a batch statement without its keys"),
        })
        .collect()
}

// ------------------------------------------------------------------ response parsing

/// The header of one response frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Head {
    stream: i16,
    opcode: u8,
    flags: u8,
    len: usize,
}

/// Parses a response header from the start of `b`: None if fewer than 9 bytes are there,
/// Err if the bytes are not a v4 response.
fn parse_head(b: &[u8]) -> Option<Result<Head, &'static str>> {
    let h = b.get(..HEADER_LEN)?;
    if h[0] != RESPONSE_VERSION {
        return Some(Err("not a v4 response"));
    }
    let len = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize;
    if len > MAX_FRAME {
        return Some(Err("frame too long"));
    }
    Some(Ok(Head {
        stream: i16::from_be_bytes([h[2], h[3]]),
        opcode: h[4],
        flags: h[1],
        len,
    }))
}

/// Reads protocol notations from a byte slice.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn i32(&mut self) -> Option<i32> {
        self.take(4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn string(&mut self) -> Option<&'a str> {
        let n = self.u16()? as usize;
        std::str::from_utf8(self.take(n)?).ok()
    }
    fn short_bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    fn bytes(&mut self) -> Option<()> {
        let n = self.i32()?;
        if n > 0 {
            self.take(n as usize)?;
        }
        Some(())
    }
}

/// The message body proper: skips the tracing id, warnings and custom payload the header
/// flags announce (in that order, as in the v4 spec).
fn message_body(flags: u8, body: &[u8]) -> Option<&[u8]> {
    let mut c = Cursor(body);
    if flags & FLAG_TRACING != 0 {
        c.take(16)?;
    }
    if flags & FLAG_WARNING != 0 {
        for _ in 0..c.u16()? {
            c.string()?;
        }
    }
    if flags & FLAG_CUSTOM_PAYLOAD != 0 {
        for _ in 0..c.u16()? {
            c.string()?;
            c.bytes()?;
        }
    }
    Some(c.0)
}

/// The code of an ERROR body (after the flag fields).
fn error_code(flags: u8, body: &[u8]) -> Option<u32> {
    Cursor(message_body(flags, body)?).i32().map(|c| c as u32)
}

/// Maps an error code onto the outcome classes. Config_error stands for a rate-limit rejection
/// only on a connection that did not negotiate `SCYLLA_RATE_LIMIT_ERROR` (ScyllaDB's rule).
fn reply_of_error(code: u32, rate_limit_opt_in: bool) -> Reply {
    match code {
        ERR_OVERLOADED => Reply::Overloaded,
        ERR_WRITE_TIMEOUT | ERR_READ_TIMEOUT => Reply::ServerTimeout,
        ERR_RATE_LIMIT => Reply::RateLimited,
        ERR_CONFIG if !rate_limit_opt_in => Reply::RateLimited,
        _ => Reply::Other,
    }
}

/// Maps one complete answer to an EXECUTE onto a reply.
fn reply_of(head: &Head, body: &[u8], rate_limit_opt_in: bool) -> Reply {
    match head.opcode {
        OP_RESULT => Reply::Ok,
        OP_ERROR => match error_code(head.flags, body) {
            Some(code) => reply_of_error(code, rate_limit_opt_in),
            None => Reply::Other,
        },
        _ => Reply::Other,
    }
}

/// Decodes a SUPPORTED `[string multimap]`.
fn parse_supported(body: &[u8]) -> Option<Vec<(String, Vec<String>)>> {
    let mut c = Cursor(body);
    let n = c.u16()?;
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let k = c.string()?.to_string();
        let m = c.u16()?;
        let mut vs = Vec::with_capacity(m as usize);
        for _ in 0..m {
            vs.push(c.string()?.to_string());
        }
        out.push((k, vs));
    }
    Some(out)
}

/// What one connection's SUPPORTED says about sharding (ScyllaDB's keys; Cassandra sends none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sharding {
    /// The shard serving this connection, if the node is sharded.
    pub shard: Option<u32>,
    /// Shards of the node (1 when it does not say).
    pub nr_shards: u32,
    /// `SCYLLA_SHARDING_IGNORE_MSB`.
    pub ignore_msb: u8,
    /// `SCYLLA_SHARD_AWARE_PORT`: connections there land on `source_port % nr_shards`.
    pub shard_aware_port: Option<u16>,
    /// The value of `SCYLLA_RATE_LIMIT_ERROR`, echoed at STARTUP to receive 0xF000.
    pub rate_limit_error: Option<String>,
}

impl Sharding {
    /// Reads the sharding keys of a SUPPORTED multimap; a partial set counts as unsharded.
    fn of(options: &[(String, Vec<String>)]) -> Self {
        let get = |k: &str| {
            options
                .iter()
                .find(|(key, _)| key == k)
                .and_then(|(_, v)| v.first())
        };
        let num = |k: &str| get(k).and_then(|v| v.parse::<u32>().ok());
        let rate_limit_error = get("SCYLLA_RATE_LIMIT_ERROR").cloned();
        match (num("SCYLLA_SHARD"), num("SCYLLA_NR_SHARDS")) {
            (Some(shard), Some(nr)) if nr >= 1 && shard < nr => Self {
                shard: Some(shard),
                nr_shards: nr,
                ignore_msb: num("SCYLLA_SHARDING_IGNORE_MSB").unwrap_or(0).min(63) as u8,
                shard_aware_port: num("SCYLLA_SHARD_AWARE_PORT")
                    .and_then(|p| u16::try_from(p).ok()),
                rate_limit_error,
            },
            _ => Self {
                nr_shards: 1,
                rate_limit_error,
                ..Default::default()
            },
        }
    }
}

// ------------------------------------------------------------------ connection setup

/// Sends one setup request and reads its answer (setup runs one request at a time); returns
/// the opcode and the message body.
async fn round_trip(s: &mut TcpStream, frame: &[u8]) -> anyhow::Result<(u8, Vec<u8>)> {
    s.write_all(frame).await?;
    loop {
        let mut h = [0u8; HEADER_LEN];
        s.read_exact(&mut h).await?;
        let head = parse_head(&h)
            .unwrap_or(Err("short header"))
            .map_err(anyhow::Error::msg)?;
        let mut body = vec![0u8; head.len];
        s.read_exact(&mut body).await?;
        if head.stream < 0 {
            continue; // an event; none was registered for, but skip it anyway
        }
        let msg = message_body(head.flags, &body).ok_or_else(|| anyhow!("truncated frame"))?;
        return Ok((head.opcode, msg.to_vec()));
    }
}

/// Text of an ERROR body, `0xCODE: message`.
fn error_text(body: &[u8]) -> String {
    let mut c = Cursor(body);
    match (c.i32(), c.string()) {
        (Some(code), Some(msg)) => format!("error 0x{code:04X}: {msg}"),
        _ => "malformed ERROR".into(),
    }
}

/// OPTIONS then STARTUP (CQL 3.0.0, echoing `SCYLLA_RATE_LIMIT_ERROR` when advertised).
async fn handshake(s: &mut TcpStream) -> anyhow::Result<Sharding> {
    let (op, body) = round_trip(s, &Request::Options.to_frame(0)).await?;
    if op != OP_SUPPORTED {
        bail!("OPTIONS answered with opcode 0x{op:02X}, not SUPPORTED");
    }
    let sharding =
        Sharding::of(&parse_supported(&body).ok_or_else(|| anyhow!("malformed SUPPORTED"))?);
    let mut opts = vec![("CQL_VERSION", "3.0.0")];
    if let Some(v) = &sharding.rate_limit_error {
        opts.push(("SCYLLA_RATE_LIMIT_ERROR", v.as_str()));
    }
    match round_trip(s, &startup_frame(&opts)).await? {
        (OP_READY, _) => Ok(sharding),
        (OP_AUTHENTICATE, _) => bail!("the server asks for authentication (AUTHENTICATE), which --client raw does not support"),
        (OP_ERROR, b) => bail!("STARTUP refused: {}", error_text(&b)),
        (op, _) => bail!("STARTUP answered with opcode 0x{op:02X}, not READY"),
    }
}

/// PREPAREs `cql`: Ok(Ok(id)), or Ok(Err(the server's error)) if the server refused it.
async fn prepare(s: &mut TcpStream, cql: &str) -> anyhow::Result<Result<Vec<u8>, String>> {
    match round_trip(s, &prepare_frame(cql)).await? {
        (OP_RESULT, b) => {
            let mut c = Cursor(&b);
            match (c.i32(), c.short_bytes()) {
                (Some(RESULT_PREPARED), Some(id)) => Ok(Ok(id.to_vec())),
                _ => bail!("PREPARE answered with a RESULT that is not Prepared"),
            }
        }
        (OP_ERROR, b) => Ok(Err(error_text(&b))),
        (op, _) => bail!("PREPARE answered with opcode 0x{op:02X}"),
    }
}

/// Connects, from `local_port` if given (any address of the family), with TCP_NODELAY.
async fn connect(addr: SocketAddr, local_port: Option<u16>) -> std::io::Result<TcpStream> {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(p) = local_port {
        let any: std::net::IpAddr = if addr.is_ipv4() {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        sock.bind(SocketAddr::new(any, p))?;
    }
    let s = sock.connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Hands out source ports in the ephemeral range with `port % nr_shards == shard`, moving on
/// after each so that no two connections try the same port.
struct PortPicker {
    next: u32,
}

impl PortPicker {
    fn new(start: u32) -> Self {
        Self {
            next: start.clamp(PORT_LOW, PORT_HIGH),
        }
    }

    fn pick(&mut self, shard: u32, nr_shards: u32) -> u16 {
        let nr = nr_shards.max(1);
        let up = |from: u32| from + (shard + nr - from % nr) % nr;
        let mut p = up(self.next);
        if p > PORT_HIGH {
            p = up(PORT_LOW);
        }
        self.next = if p + 1 > PORT_HIGH { PORT_LOW } else { p + 1 };
        p as u16
    }
}

/// Opens a connection to the shard-aware port that lands on `shard`: tries successive source
/// ports of that shard while they are taken.
async fn connect_to_shard(
    addr: SocketAddr,
    shard: u32,
    nr_shards: u32,
    ports: &mut PortPicker,
) -> anyhow::Result<TcpStream> {
    use std::io::ErrorKind::{AddrInUse, AddrNotAvailable};
    for _ in 0..PORT_TRIES {
        let p = ports.pick(shard, nr_shards);
        match connect(addr, Some(p)).await {
            Ok(s) => return Ok(s),
            Err(e) if matches!(e.kind(), AddrInUse | AddrNotAvailable) => continue,
            Err(e) => return Err(e).with_context(|| format!("connecting to {addr} from port {p}")),
        }
    }
    bail!("no free source port for shard {shard} of {nr_shards} after {PORT_TRIES} tries")
}

/// A connection after its handshake, before its tasks start.
struct Opened {
    stream: TcpStream,
    sharding: Sharding,
    /// The shard it was opened for.
    meant: u32,
}

/// Where one connection ended up (for checks and reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnInfo {
    /// The node it goes to: its position in the client's node list.
    pub node: usize,
    /// The shard this connection serves in the routing table.
    pub meant: u32,
    /// The shard the server said the connection is on (None: unsharded server).
    pub reported: Option<u32>,
    /// The connection's source port.
    pub local_port: u16,
}

// ------------------------------------------------------------------ the stream-id table

/// Who waits for the answer on one stream id.
#[derive(Debug)]
enum Waiter {
    /// The id is free.
    Free,
    /// A caller of [`Target::execute`].
    Caller(oneshot::Sender<Reply>),
    /// A request of the runner: recorded when answered, or when its client timeout passes.
    Ticket(Ticket),
    /// The client gave up on it; the id is free again once the answer comes.
    Abandoned,
}

impl Waiter {
    /// Tells whoever waits that the request ended with `reply`.
    fn answer(self, reply: Reply) {
        match self {
            Waiter::Caller(tx) => {
                let _ = tx.send(reply);
            }
            Waiter::Ticket(t) => t.complete(reply),
            Waiter::Free | Waiter::Abandoned => {}
        }
    }
}

/// One stream id: its waiter, and a generation that tells its successive requests apart.
#[derive(Debug)]
struct Slot {
    waiter: Waiter,
    generation: u32,
}

/// The requests on the wire of one connection, indexed by stream id, and the ids not in use.
/// Callers take ids, the reader frees them; runner requests also leave an entry in
/// `expiries`, so that a periodic sweep can time them out without a timer each.
struct InFlight {
    slots: Vec<Slot>,
    free: Vec<i16>,
    /// (expiry, stream id, generation) of runner requests in the order they were queued,
    /// which is their order of expiry; entries whose request already ended are skipped.
    expiries: VecDeque<(Instant, i16, u32)>,
    /// The connection failed: nothing more is sent, everything gets `Reply::Other`.
    closed: bool,
}

impl InFlight {
    fn new() -> Self {
        Self {
            slots: (0..=MAX_STREAM as usize)
                .map(|_| Slot {
                    waiter: Waiter::Free,
                    generation: 0,
                })
                .collect(),
            // Popped from the end: ids are handed out from 1 upwards.
            free: (1..=MAX_STREAM).rev().collect(),
            expiries: VecDeque::new(),
            closed: false,
        }
    }

    /// Takes a free id for `waiter`, or hands `waiter` back when none is free or the
    /// connection is closed.
    fn take(&mut self, waiter: Waiter) -> Result<i16, Waiter> {
        if self.closed {
            return Err(waiter);
        }
        let Some(id) = self.free.pop() else {
            return Err(waiter);
        };
        let slot = &mut self.slots[id as usize];
        slot.generation = slot.generation.wrapping_add(1);
        if let Waiter::Ticket(t) = &waiter {
            self.expiries.push_back((t.expires(), id, slot.generation));
        }
        slot.waiter = waiter;
        Ok(id)
    }

    /// Completes the request on `stream` and frees the id; an answer nobody waits for any
    /// more only frees it. Answers on free or unknown ids are ignored.
    fn complete(&mut self, stream: i16, reply: Reply) {
        let Some(slot) = usize::try_from(stream)
            .ok()
            .filter(|s| *s > 0)
            .and_then(|s| self.slots.get_mut(s))
        else {
            return;
        };
        match std::mem::replace(&mut slot.waiter, Waiter::Free) {
            Waiter::Free => {}
            w => {
                w.answer(reply);
                self.free.push(stream);
            }
        }
    }

    /// Gives up on the runner requests whose client timeout passed by `now`: each is recorded
    /// as a client timeout, and its id stays taken until the server answers.
    fn expire(&mut self, now: Instant) {
        while let Some(&(at, id, generation)) = self.expiries.front() {
            let slot = &mut self.slots[id as usize];
            let waiting = slot.generation == generation && matches!(slot.waiter, Waiter::Ticket(_));
            if waiting && at > now {
                return;
            }
            self.expiries.pop_front();
            if waiting {
                std::mem::replace(&mut slot.waiter, Waiter::Abandoned).answer(Reply::ClientTimeout);
            }
        }
    }

    /// Fails every request in flight and every later one.
    fn close(&mut self) {
        self.closed = true;
        self.expiries.clear();
        for (id, slot) in self.slots.iter_mut().enumerate() {
            match std::mem::replace(&mut slot.waiter, Waiter::Free) {
                Waiter::Free => {}
                w => {
                    w.answer(Reply::Other);
                    self.free.push(id as i16);
                }
            }
        }
    }
}

// ------------------------------------------------------------------ one connection

/// What the users of one connection share, under one lock held only to encode or complete.
struct ConnState {
    inflight: InFlight,
    /// Frames encoded and not yet handed to the socket.
    out: BytesMut,
    /// Someone (a flusher, or the stall task) is writing `out`: the others only append to it.
    flushing: bool,
    /// Bytes ever appended to `out`, and ever written to the socket.
    queued_bytes: u64,
    written_bytes: u64,
    /// Runner requests not yet written: where their frame ends in the `queued_bytes` count,
    /// and when the schedule meant them to go out.
    unsent: VecDeque<(u64, Instant)>,
    /// Delay from intended send time to the write that carried each runner request (µs).
    send_delays: hdrhistogram::Histogram<u64>,
}

/// Largest send delay the histograms hold exactly (60 s, in microseconds).
const MAX_SEND_DELAY_US: u64 = 60_000_000;

fn send_delay_histogram() -> hdrhistogram::Histogram<u64> {
    // Constant bounds that hdrhistogram accepts.
    hdrhistogram::Histogram::new_with_bounds(1, MAX_SEND_DELAY_US, 2).expect("valid bounds")
}

/// One pipelined connection. Requests are encoded into `out`; whoever claims the flush
/// (the runner after each burst through [`Target::flush`], or a caller of `execute`) writes
/// everything queued with non-blocking `try_write`s, so frames queued together share a
/// syscall and no task hop sits between a request and the socket (a hop costs a wake-up, and
/// wake-ups are most of a client's CPU here). Only when the socket is full does the
/// connection's stall task finish the write. The reader task completes the answers.
struct Conn {
    state: Mutex<ConnState>,
    wr: OwnedWriteHalf,
    /// Wakes the stall task when a write would block.
    stalled: Notify,
    write: ExecTemplate,
    read: ExecTemplate,
}

impl Conn {
    fn new(wr: OwnedWriteHalf, write: ExecTemplate, read: ExecTemplate) -> Self {
        Self {
            state: Mutex::new(ConnState {
                inflight: InFlight::new(),
                out: BytesMut::with_capacity(64 * 1024),
                flushing: false,
                queued_bytes: 0,
                written_bytes: 0,
                unsent: VecDeque::new(),
                send_delays: send_delay_histogram(),
            }),
            wr,
            stalled: Notify::new(),
            write,
            read,
        }
    }

    fn lock(&self) -> MutexGuard<'_, ConnState> {
        // A panic in another caller must not stop this one from failing requests.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `op` for a caller of `execute`; its answer (or `Reply::Other` if it cannot be
    /// sent) comes through `reply`. The caller yields one scheduler turn before writing, so
    /// that requests issued in the same instant join its write.
    async fn send(&self, op: &Op, reply: oneshot::Sender<Reply>) {
        self.queue(op, Waiter::Caller(reply));
        if self.claim_flush() {
            // Flushes on drop, also if the caller gives up during the yield.
            let _flush = FlushOnDrop(self);
            tokio::task::yield_now().await;
        }
    }

    /// Appends `op`'s frame to `out`, to go out at the next flush; a request that cannot
    /// take a stream id is answered `Reply::Other` at once.
    fn queue(&self, op: &Op, waiter: Waiter) {
        let intended = match &waiter {
            Waiter::Ticket(t) => Some(t.intended()),
            _ => None,
        };
        let mut st = self.lock();
        let id = match st.inflight.take(waiter) {
            Ok(id) => id,
            Err(waiter) => {
                drop(st);
                waiter.answer(Reply::Other);
                return;
            }
        };
        let tpl = if op.kind == OpKind::Write {
            &self.write
        } else {
            &self.read
        };
        let before = st.out.len();
        tpl.encode(&mut st.out, id, op);
        st.queued_bytes += (st.out.len() - before) as u64;
        if let Some(at) = intended {
            let end = st.queued_bytes;
            st.unsent.push_back((end, at));
        }
    }

    /// Counts `n` bytes written now: the requests whose frames they complete went out late by
    /// now minus their intended time.
    fn written(&self, n: usize) {
        let now = Instant::now();
        let mut st = self.lock();
        st.written_bytes += n as u64;
        while let Some(&(end, at)) = st.unsent.front() {
            if end > st.written_bytes {
                break;
            }
            st.unsent.pop_front();
            let us =
                u64::try_from(now.saturating_duration_since(at).as_micros()).unwrap_or(u64::MAX);
            st.send_delays.saturating_record(us.max(1));
        }
    }

    /// The send delays recorded since the last call, leaving an empty histogram.
    fn take_send_delays(&self) -> hdrhistogram::Histogram<u64> {
        std::mem::replace(&mut self.lock().send_delays, send_delay_histogram())
    }

    /// Takes the duty to write `out`: true if there is something to write and nobody is
    /// writing already (the one writing takes new frames along).
    fn claim_flush(&self) -> bool {
        let mut st = self.lock();
        if st.flushing || st.out.is_empty() {
            return false;
        }
        st.flushing = true;
        true
    }

    /// Writes out everything queued without waiting, until nothing is left (then clears
    /// `flushing`) or the socket is full (then leaves the rest to the stall task). Only the
    /// holder of `flushing` calls it. Never awaits, so a caller's cancelled future cannot leave
    /// a write half done.
    fn flush(&self) {
        loop {
            let mut chunk = {
                let mut st = self.lock();
                if st.out.is_empty() {
                    st.flushing = false;
                    return;
                }
                st.out.split()
            };
            while !chunk.is_empty() {
                match self.wr.try_write(&chunk) {
                    Ok(n) if n > 0 => {
                        chunk.advance(n);
                        self.written(n);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        // Put the rest back in front of what was queued meanwhile.
                        let mut st = self.lock();
                        let later = st.out.split();
                        chunk.unsplit(later);
                        st.out = chunk;
                        self.stalled.notify_one();
                        return;
                    }
                    _ => {
                        self.fail();
                        return;
                    }
                }
            }
        }
    }

    /// The connection broke: fails everything in flight and every later request.
    fn fail(&self) {
        let mut st = self.lock();
        st.inflight.close();
        st.out.clear();
        st.flushing = false;
        st.unsent.clear();
        st.written_bytes = st.queued_bytes;
    }
}

/// Holds the duty to flush a connection and does it when dropped.
struct FlushOnDrop<'a>(&'a Conn);

impl Drop for FlushOnDrop<'_> {
    fn drop(&mut self) {
        self.0.flush();
    }
}

/// Finishes the writes that found the socket full, once it drains.
async fn unstall(conn: Arc<Conn>) {
    loop {
        conn.stalled.notified().await;
        if conn.wr.writable().await.is_err() {
            conn.fail();
            return;
        }
        conn.flush();
    }
}

/// Reads large chunks and completes every whole answer in them; on EOF or a broken stream,
/// fails everything in flight and closes the connection for later requests.
async fn reader(mut rd: OwnedReadHalf, conn: Arc<Conn>, rate_limit_opt_in: bool) {
    let mut buf = BytesMut::with_capacity(2 * READ_CHUNK);
    'read: loop {
        if buf.capacity() - buf.len() < READ_CHUNK {
            buf.reserve(READ_CHUNK);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let mut st = conn.lock();
        while let Some(head) = parse_head(&buf) {
            let Ok(head) = head else { break 'read };
            let end = HEADER_LEN + head.len;
            if buf.len() < end {
                break;
            }
            let reply = reply_of(&head, &buf[HEADER_LEN..end], rate_limit_opt_in);
            st.inflight.complete(head.stream, reply);
            buf.advance(end);
        }
    }
    conn.fail();
}

/// How often each connection's runner requests are checked against their client timeout.
const EXPIRY_SWEEP: Duration = Duration::from_millis(2);

/// Times out the runner requests of every connection whose answer is overdue.
async fn sweep_expiries(conns: Vec<Arc<Conn>>) {
    let mut tick = tokio::time::interval(EXPIRY_SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let now = Instant::now();
        for c in &conns {
            c.lock().inflight.expire(now);
        }
    }
}

// ------------------------------------------------------------------ node choice

/// How the raw client picks each request's node; within a node, requests always go to the
/// shard that owns their partition.
pub enum NodeChoice {
    /// The nodes in turn. Every request reaches a replica only when every node is one, as
    /// with RF 3 on 3 nodes.
    RoundRobin,
    /// The replicas of the request's partition among the `--nodes`, in turn (token-aware).
    Replicas(ReplicaRing),
}

/// The replicas of each partition among the client's nodes: the ring's tokens as the cluster
/// publishes them (system.local and system.peers) placed by the project's own SimpleStrategy.
pub struct ReplicaRing {
    map: ReplicaMap,
    factor: u32,
    /// Per ring node, its position in the client's node list, if it is there.
    slot: Vec<Option<usize>>,
}

impl ReplicaRing {
    /// The replicas of `meta`'s ring under SimpleStrategy with `factor`; ring nodes are
    /// matched with the client's `nodes` by IP address.
    pub fn new(meta: &TokenMetadata, factor: u32, nodes: &[IpAddr]) -> Self {
        let map = ReplicaMap::build(meta, &Replication::Simple { factor });
        let slot = meta
            .nodes()
            .iter()
            .map(|n| nodes.iter().position(|ip| *ip == n.cql_address.ip()))
            .collect();
        Self { map, factor, slot }
    }

    /// The ring the driver `session` read from system.local and system.peers, for the client's
    /// `nodes` (host:port).
    pub async fn from_session(
        session: &scylla::client::session::Session,
        factor: u32,
        nodes: &[String],
    ) -> anyhow::Result<Self> {
        let mut ips = Vec::with_capacity(nodes.len());
        for n in nodes {
            ips.push(resolve(n).await?.ip());
        }
        let state = session.get_cluster_state();
        let mut ring: Vec<Node> = Vec::new();
        for (token, node) in state.replica_locator().ring().iter() {
            let i = match ring.iter().position(|n| n.host_id == node.host_id) {
                Some(i) => i,
                None => {
                    let addr = SocketAddr::new(node.address.ip(), node.address.port());
                    ring.push(Node {
                        host_id: node.host_id,
                        cql_address: addr,
                        internode_address: addr,
                        dc: node.datacenter.clone().unwrap_or_default(),
                        rack: node.rack.clone().unwrap_or_default(),
                        tokens: Vec::new(),
                        state: NodeState::Normal,
                    });
                    ring.len() - 1
                }
            };
            ring[i].tokens.push(Token(token.value()));
        }
        if ring.is_empty() {
            bail!(
                "the driver read no token ring from the cluster; use --load-balancing round-robin"
            );
        }
        let meta =
            TokenMetadata::new(ring).map_err(|e| anyhow!("the cluster's ring: {}", e.message()))?;
        let this = Self::new(&meta, factor, &ips);
        if this.slot.iter().all(Option::is_none) {
            bail!(
                "no ring node has the address of one of --nodes ({})",
                nodes.join(",")
            );
        }
        Ok(this)
    }

    /// The `turn`-th replica of `token` that is one of the client's nodes (its position in
    /// their list), or None if none of them replicates it.
    fn pick(&self, token: i64, turn: usize) -> Option<usize> {
        let replicas = self.map.replicas(Token(token));
        let n = replicas.len();
        (0..n).find_map(|k| self.slot[replicas[(turn + k) % n].get()])
    }
}

// ------------------------------------------------------------------ the target

/// The connections of one shard, used in turn.
struct ShardConns {
    conns: Vec<Arc<Conn>>,
    next: AtomicUsize,
}

/// The connections to one node, by shard.
struct RawNode {
    shards: Vec<ShardConns>,
    nr_shards: u32,
    ignore_msb: u8,
    /// Requests routed to each shard of this node.
    routed: Vec<AtomicU64>,
    shard_aware_port: Option<u16>,
}

impl RawNode {
    /// The shard of this node that owns `token`.
    fn shard_of(&self, token: i64) -> usize {
        shard_of(token, self.nr_shards, self.ignore_msb) as usize
    }

    /// The connection that carries a request for `token`: one of its shard's, in turn;
    /// counts it.
    fn conn_for(&self, token: i64) -> &Conn {
        let shard = self.shard_of(token);
        self.routed[shard].fetch_add(1, Ordering::Relaxed);
        let s = &self.shards[shard];
        let i = match s.conns.len() {
            1 => 0,
            n => s.next.fetch_add(1, Ordering::Relaxed) % n,
        };
        &s.conns[i]
    }

    /// How connections reach their shard, for reports.
    fn how(&self) -> String {
        match self.shard_aware_port {
            Some(p) => format!("shard-aware port {p}"),
            None if self.nr_shards > 1 => "main port".to_string(),
            None => "unsharded node".to_string(),
        }
    }
}

/// Settings of [`RawTarget::connect_with`].
pub struct RawOptions {
    /// Connections per shard of each node.
    pub connections: usize,
    /// Table of [`KEYSPACE`] the statements write and read.
    pub table: String,
    /// `USING TIMEOUT` on the writes, if the server accepts it.
    pub using_timeout: Option<Duration>,
    /// Rows per write: more than one makes each write an UNLOGGED BATCH of its partition.
    pub batch_rows: usize,
    /// Consistency level of every request.
    pub consistency: ConsistencyLevel,
    /// How each request's node is picked when there are several.
    pub choice: NodeChoice,
}

/// CQL endpoints driven over raw protocol v4: shard-aware routing, pipelined connections,
/// no retries, one or several nodes. Same contract as [`CqlTarget`](crate::driver::CqlTarget).
pub struct RawTarget {
    nodes: Vec<RawNode>,
    choice: NodeChoice,
    /// Counts requests for the nodes or replicas taken in turn.
    turn: AtomicUsize,
    consistency: ConsistencyLevel,
    conns: Vec<ConnInfo>,
    tasks: Vec<AbortHandle>,
}

/// The first address `node` (host:port) resolves to.
async fn resolve(node: &str) -> anyhow::Result<SocketAddr> {
    tokio::net::lookup_host(node)
        .await
        .with_context(|| format!("resolving {node}"))?
        .next()
        .ok_or_else(|| anyhow!("{node} resolves to no address"))
}

/// Opens `per_shard` connections to every shard of the node at `addr`, `control` (its first,
/// already open) among them when the node assigns shards itself.
async fn open_node(
    addr: SocketAddr,
    control: Opened,
    per_shard: usize,
) -> anyhow::Result<(Vec<Opened>, Sharding)> {
    let info = control.sharding.clone();
    let nr = info.nr_shards.max(1);
    let mut opened: Vec<Opened> = Vec::with_capacity(per_shard * nr as usize);
    match (info.shard, info.shard_aware_port) {
        (Some(_), Some(port)) => {
            // Each connection chooses its shard by its source port.
            let sa = SocketAddr::new(addr.ip(), port);
            let mut ports = PortPicker::new(rand::random_range(PORT_LOW..=PORT_HIGH));
            for shard in 0..nr {
                for _ in 0..per_shard {
                    let c = open(sa, Some((shard, nr)), Some(&mut ports)).await?;
                    if c.sharding.shard != Some(shard) {
                        bail!(
                            "a connection to the shard-aware port {port} meant for shard {shard} reports shard {:?}",
                            c.sharding.shard
                        );
                    }
                    opened.push(c);
                }
            }
        }
        (Some(shard), None) => {
            // The main port assigns shards itself: open until every shard has its share.
            let mut need = vec![per_shard; nr as usize];
            need[shard as usize] -= 1;
            opened.push(Opened {
                meant: shard,
                ..control
            });
            let max_attempts = 8 * per_shard * nr as usize + 8;
            let mut attempts = 0;
            while need.iter().any(|n| *n > 0) {
                if attempts == max_attempts {
                    bail!("after {attempts} connections some shards of {addr} still lack connections: {need:?} missing");
                }
                attempts += 1;
                let c = open(addr, None, None).await?;
                let s = c.sharding.shard.unwrap_or(0).min(nr - 1);
                if need[s as usize] > 0 {
                    need[s as usize] -= 1;
                    opened.push(Opened { meant: s, ..c });
                }
            }
        }
        (None, _) => {
            opened.push(Opened {
                meant: 0,
                ..control
            });
            for _ in 1..per_shard {
                opened.push(open(addr, None, None).await?);
            }
        }
    }
    Ok((opened, info))
}

impl RawTarget {
    /// Connects `connections` connections per shard of each of `nodes` (in turn when there are
    /// several) at consistency ONE and prepares the write (with `USING TIMEOUT` if given and
    /// accepted) and read statements of `table`. Returns notes for the report, as
    /// [`CqlTarget::prepare`](crate::driver::CqlTarget::prepare).
    pub async fn connect(
        nodes: &[String],
        connections: usize,
        table: &str,
        using_timeout: Option<Duration>,
    ) -> anyhow::Result<(Self, Vec<String>)> {
        let opts = RawOptions {
            connections,
            table: table.to_string(),
            using_timeout,
            batch_rows: 1,
            consistency: ConsistencyLevel::One,
            choice: NodeChoice::RoundRobin,
        };
        Self::connect_with(nodes, opts).await
    }

    /// [`Self::connect`] with every setting: consistency, batches and how nodes are picked.
    pub async fn connect_with(
        nodes: &[String],
        opts: RawOptions,
    ) -> anyhow::Result<(Self, Vec<String>)> {
        if nodes.is_empty() {
            bail!("--client raw needs at least one node");
        }
        let per_shard = opts.connections.max(1);
        let mut addrs = Vec::with_capacity(nodes.len());
        for n in nodes {
            addrs.push(resolve(n).await?);
        }

        // The first connection to the first node picks the statements.
        let mut first = open(addrs[0], None, None).await?;
        let mut notes = Vec::new();
        let table = &opts.table;
        let plain = format!("INSERT INTO {KEYSPACE}.{table} (pk, ck, v) VALUES (?, ?, ?)");
        let write_cql = match opts.using_timeout {
            Some(t) => {
                let cql = format!("{plain} USING TIMEOUT {}ms", t.as_millis());
                match prepare(&mut first.stream, &cql).await? {
                    Ok(_) => cql,
                    Err(e) => {
                        notes.push(format!(
                            "USING TIMEOUT unsupported by the server ({e}); writes carry only the client deadline"
                        ));
                        plain
                    }
                }
            }
            None => plain,
        };
        let read_cql = format!("SELECT pk, ck, v FROM {KEYSPACE}.{table} WHERE pk = ?");
        let consistency = opts.consistency.wire();

        let mut raw_nodes = Vec::with_capacity(addrs.len());
        let mut conns = Vec::new();
        let mut all: Vec<Arc<Conn>> = Vec::new();
        let mut tasks = Vec::new();
        let mut first = Some(first);
        for (node, &addr) in addrs.iter().enumerate() {
            let control = match first.take() {
                Some(c) => c,
                None => open(addr, None, None).await?,
            };
            let (opened, info) = open_node(addr, control, per_shard).await?;
            let nr = info.nr_shards.max(1);
            let mut shards: Vec<ShardConns> = (0..nr)
                .map(|_| ShardConns {
                    conns: Vec::with_capacity(per_shard),
                    next: AtomicUsize::new(0),
                })
                .collect();
            for mut c in opened {
                let write_id = prepare(&mut c.stream, &write_cql)
                    .await?
                    .map_err(|e| anyhow!("preparing the write on {addr}: {e}"))?;
                let read_id = prepare(&mut c.stream, &read_cql)
                    .await?
                    .map_err(|e| anyhow!("preparing the read on {addr}: {e}"))?;
                conns.push(ConnInfo {
                    node,
                    meant: c.meant,
                    reported: c.sharding.shard,
                    local_port: c.stream.local_addr().map(|a| a.port()).unwrap_or(0),
                });
                let (rd, wr) = c.stream.into_split();
                let conn = Arc::new(Conn::new(
                    wr,
                    ExecTemplate::write_batch(&write_id, opts.batch_rows, consistency)?,
                    ExecTemplate::new(&read_id, OpKind::Read, consistency)?,
                ));
                let opt_in = c.sharding.rate_limit_error.is_some();
                tasks.push(tokio::spawn(unstall(conn.clone())).abort_handle());
                tasks.push(tokio::spawn(reader(rd, conn.clone(), opt_in)).abort_handle());
                all.push(conn.clone());
                shards[c.meant as usize].conns.push(conn);
            }
            raw_nodes.push(RawNode {
                shards,
                nr_shards: nr,
                ignore_msb: info.ignore_msb,
                routed: (0..nr).map(|_| AtomicU64::new(0)).collect(),
                shard_aware_port: info.shard_aware_port.filter(|_| info.shard.is_some()),
            });
        }
        tasks.push(tokio::spawn(sweep_expiries(all)).abort_handle());
        let target = Self {
            nodes: raw_nodes,
            choice: opts.choice,
            turn: AtomicUsize::new(0),
            consistency: opts.consistency,
            conns,
            tasks,
        };
        Ok((target, notes))
    }

    /// The shard of the first node that owns partition `pk` (token of the bigint key,
    /// ScyllaDB's sharding).
    pub fn shard_of(&self, pk: i64) -> usize {
        self.nodes[0].shard_of(murmur3_token(&pk.to_be_bytes()))
    }

    /// Requests routed to each shard so far, summed over the nodes.
    pub fn routed(&self) -> Vec<u64> {
        let width = self.nodes.iter().map(|n| n.routed.len()).max().unwrap_or(0);
        let mut out = vec![0; width];
        for n in &self.nodes {
            for (o, c) in out.iter_mut().zip(&n.routed) {
                *o += c.load(Ordering::Relaxed);
            }
        }
        out
    }

    /// Requests routed to each node so far, in the order of the client's nodes.
    pub fn routed_per_node(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| n.routed.iter().map(|c| c.load(Ordering::Relaxed)).sum())
            .collect()
    }

    /// Every connection: its node, the shard it serves, the shard the server reported, its
    /// source port.
    pub fn connections(&self) -> &[ConnInfo] {
        &self.conns
    }

    /// Shards of the first node (1 for an unsharded node such as Cassandra).
    pub fn nr_shards(&self) -> u32 {
        self.nodes[0].nr_shards
    }

    /// One line for reports: protocol, consistency, node choice, sharding and connections.
    pub fn describe(&self) -> String {
        let first = &self.nodes[0];
        let per_shard = self.conns.len() / self.nodes.len() / first.shards.len().max(1);
        let choice = match (&self.choice, self.nodes.len()) {
            (_, 1) => "1 node".to_string(),
            (NodeChoice::RoundRobin, n) => format!("{n} nodes in turn (round-robin)"),
            (NodeChoice::Replicas(r), n) => format!(
                "{n} nodes, token-aware (each partition's replicas in turn, SimpleStrategy RF {} on the cluster's ring)",
                r.factor
            ),
        };
        format!(
            "raw CQL v4 (pipelined, no retries: 0 retries per request by construction), consistency {}, {choice}, {} shard(s) x {per_shard} connection(s) per node, {}",
            self.consistency.name(),
            first.nr_shards,
            first.how()
        )
    }

    /// All connections of every node.
    fn all_conns(&self) -> impl Iterator<Item = &Arc<Conn>> {
        self.nodes
            .iter()
            .flat_map(|n| n.shards.iter().flat_map(|s| &s.conns))
    }

    /// The connection that carries `op`: its node by the node choice, then one of its
    /// partition's shard, in turn; counts it.
    fn conn_for(&self, op: &Op) -> &Conn {
        let token = murmur3_token(&op.pk.to_be_bytes());
        let node = match (&self.choice, self.nodes.len()) {
            (_, 1) => 0,
            (NodeChoice::RoundRobin, n) => self.turn.fetch_add(1, Ordering::Relaxed) % n,
            (NodeChoice::Replicas(ring), n) => {
                let turn = self.turn.fetch_add(1, Ordering::Relaxed);
                // A partition none of the nodes replicates still goes somewhere.
                ring.pick(token, turn).unwrap_or(turn % n)
            }
        };
        self.nodes[node].conn_for(token)
    }
}

/// Connects (to the shard-aware port from a source port of `(shard, nr_shards)` when given)
/// and shakes hands, within [`SETUP_TIMEOUT`].
async fn open(
    addr: SocketAddr,
    shard: Option<(u32, u32)>,
    ports: Option<&mut PortPicker>,
) -> anyhow::Result<Opened> {
    let go = async {
        let mut stream = match (shard, ports) {
            (Some((s, nr)), Some(ports)) => connect_to_shard(addr, s, nr, ports).await?,
            _ => connect(addr, None)
                .await
                .with_context(|| format!("connecting to {addr}"))?,
        };
        let sharding = handshake(&mut stream)
            .await
            .with_context(|| format!("handshake with {addr}"))?;
        let meant = shard.map(|(s, _)| s).or(sharding.shard).unwrap_or(0);
        Ok(Opened {
            stream,
            sharding,
            meant,
        })
    };
    tokio::time::timeout(SETUP_TIMEOUT, go)
        .await
        .map_err(|_| anyhow!("setting up a connection to {addr} took over {SETUP_TIMEOUT:?}"))?
}

impl Drop for RawTarget {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Target for RawTarget {
    async fn execute(&self, op: Op) -> Reply {
        let (tx, rx) = oneshot::channel();
        self.conn_for(&op).send(&op, tx).await;
        // A dropped sender means the connection's tasks ended.
        rx.await.unwrap_or(Reply::Other)
    }

    fn attempts(&self) -> Option<u64> {
        Some(self.routed().iter().sum())
    }

    /// Queues the request on its shard's connection with the ticket in its stream-id slot:
    /// no task, no channel and no timer per request (the reader completes the ticket, the
    /// expiry sweep times it out).
    fn submit(self: &Arc<Self>, op: Op, ticket: Ticket) {
        self.conn_for(&op).queue(&op, Waiter::Ticket(ticket));
    }

    fn flush(&self) {
        for c in self.all_conns() {
            if c.claim_flush() {
                c.flush();
            }
        }
    }

    fn take_send_delays(&self) -> Option<hdrhistogram::Histogram<u64>> {
        let mut all = send_delay_histogram();
        for c in self.all_conns() {
            // Same bounds on both sides: adding cannot fail.
            let _ = all.add(c.take_send_delays());
        }
        Some(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{RunConfig, StepSink};
    use crate::stats::Recorder;
    use cassandra_protocol::compression::Compression;
    use cassandra_protocol::consistency::Consistency;
    use cassandra_protocol::frame::message_error::{
        ErrorBody, ErrorType, WriteTimeoutError, WriteType,
    };
    use cassandra_protocol::frame::message_request::RequestBody;
    use cassandra_protocol::frame::message_result::ResResultBody;
    use cassandra_protocol::frame::message_supported::BodyResSupported;
    use cassandra_protocol::frame::{Direction, Envelope, Flags, Opcode, Serialize, Version};
    use cassandra_protocol::query::QueryValues;
    use cassandra_protocol::types::value::Value;
    use std::collections::HashMap;

    /// Decodes one request frame with the oracle, checking the envelope and that it spans `raw`.
    fn oracle_request(raw: &[u8], stream: i16, opcode: Opcode) -> RequestBody {
        let parsed = Envelope::from_buffer(raw, Compression::None).expect("oracle parses");
        assert_eq!(parsed.envelope_len, raw.len());
        let env = parsed.envelope;
        assert_eq!(env.version, Version::V4);
        assert_eq!(env.direction, Direction::Request);
        assert_eq!(env.stream_id, stream);
        assert_eq!(env.opcode, opcode);
        env.request_body().expect("oracle decodes the body")
    }

    /// An oracle-encoded response frame.
    fn response(opcode: Opcode, stream: i16, body: Vec<u8>, warnings: Vec<String>) -> Vec<u8> {
        let flags = if warnings.is_empty() {
            Flags::empty()
        } else {
            Flags::WARNING
        };
        Envelope::new(
            Version::V4,
            Direction::Response,
            flags,
            opcode,
            stream,
            body,
            None,
            warnings,
        )
        .encode_with(Compression::None)
        .expect("oracle encodes")
    }

    /// Our reading of a whole response frame.
    fn our_reply(raw: &[u8], opt_in: bool) -> (i16, Reply) {
        let head = parse_head(raw).expect("whole header").expect("v4 response");
        assert_eq!(HEADER_LEN + head.len, raw.len());
        (head.stream, reply_of(&head, &raw[HEADER_LEN..], opt_in))
    }

    fn error(ty: ErrorType) -> Vec<u8> {
        ErrorBody {
            message: "m".into(),
            ty,
        }
        .serialize_to_vec(Version::V4)
    }

    #[test]
    fn execute_frames_decode_with_the_oracle() {
        let id: Vec<u8> = (1..=16).collect();
        let write =
            ExecTemplate::new(&id, OpKind::Write, sluice_protocol::Consistency::One).unwrap();
        let read = ExecTemplate::new(&id, OpKind::Read, sluice_protocol::Consistency::One).unwrap();
        let w = Op {
            kind: OpKind::Write,
            pk: -42,
            ck: 7,
        };
        let r = Op {
            kind: OpKind::Read,
            pk: i64::MAX,
            ck: 0,
        };
        // Two frames in one buffer, as the writer sends them.
        let mut buf = BytesMut::new();
        write.encode(&mut buf, 32767, &w);
        let split = buf.len();
        read.encode(&mut buf, 1, &r);
        let RequestBody::Execute(e) = oracle_request(&buf[..split], 32767, Opcode::Execute) else {
            panic!("not EXECUTE")
        };
        assert_eq!(e.id.into_bytes(), Some(id.clone()));
        let q = e.query_parameters;
        assert_eq!(q.consistency, Consistency::One);
        assert!(!q.with_names);
        assert_eq!(
            q.values,
            Some(QueryValues::SimpleValues(vec![
                Value::Some((-42i64).to_be_bytes().to_vec()),
                Value::Some(7i32.to_be_bytes().to_vec()),
                Value::Some(vec![0x5a; VALUE_LEN]),
            ]))
        );
        assert_eq!(
            (
                q.page_size,
                q.paging_state,
                q.serial_consistency,
                q.timestamp
            ),
            (None, None, None, None)
        );
        let RequestBody::Execute(e) = oracle_request(&buf[split..], 1, Opcode::Execute) else {
            panic!("not EXECUTE")
        };
        assert_eq!(
            e.query_parameters.values,
            Some(QueryValues::SimpleValues(vec![Value::Some(
                i64::MAX.to_be_bytes().to_vec()
            )]))
        );
        assert_eq!(e.query_parameters.page_size, None);
        // The template itself is untouched by encoding.
        assert_eq!(&write.frame[2..4], &[0, 0]);
    }

    #[test]
    fn batch_writes_decode_with_the_oracle() {
        use cassandra_protocol::frame::message_batch::{BatchQuerySubj, BatchType};
        let id: Vec<u8> = (1..=16).collect();
        let batch =
            ExecTemplate::write_batch(&id, 3, sluice_protocol::Consistency::One).expect("template");
        let op = Op {
            kind: OpKind::Write,
            pk: 99,
            ck: 5,
        };
        let mut buf = BytesMut::new();
        batch.encode(&mut buf, 12, &op);
        let RequestBody::Batch(b) = oracle_request(&buf, 12, Opcode::Batch) else {
            panic!("not BATCH")
        };
        assert_eq!(b.batch_type, BatchType::Unlogged);
        assert_eq!(b.consistency, Consistency::One);
        assert_eq!(b.queries.len(), 3);
        for (i, q) in b.queries.iter().enumerate() {
            let BatchQuerySubj::PreparedId(got) = &q.subject else {
                panic!("not by prepared id")
            };
            assert_eq!(got.clone().into_bytes(), Some(id.clone()));
            assert_eq!(
                q.values,
                QueryValues::SimpleValues(vec![
                    Value::Some(99i64.to_be_bytes().to_vec()),
                    Value::Some((15 + i as i32).to_be_bytes().to_vec()),
                    Value::Some(vec![0x5a; VALUE_LEN]),
                ])
            );
        }
        // One row stays a plain EXECUTE.
        let one =
            ExecTemplate::write_batch(&id, 1, sluice_protocol::Consistency::One).expect("template");
        assert_eq!(one.frame[4], 0x0A, "EXECUTE");
    }

    #[test]
    fn every_consistency_level_reaches_the_frame() {
        use cassandra_protocol::frame::message_batch::BatchType;
        let id: Vec<u8> = (1..=16).collect();
        let op = Op {
            kind: OpKind::Write,
            pk: 3,
            ck: 1,
        };
        for (ours, oracle) in [
            (ConsistencyLevel::Quorum, Consistency::Quorum),
            (ConsistencyLevel::All, Consistency::All),
            (ConsistencyLevel::LocalQuorum, Consistency::LocalQuorum),
            (ConsistencyLevel::LocalOne, Consistency::LocalOne),
            (ConsistencyLevel::Two, Consistency::Two),
        ] {
            for kind in [OpKind::Write, OpKind::Read] {
                let t = ExecTemplate::new(&id, kind, ours.wire()).expect("template");
                let mut buf = BytesMut::new();
                t.encode(&mut buf, 5, &Op { kind, ..op });
                let RequestBody::Execute(e) = oracle_request(&buf, 5, Opcode::Execute) else {
                    panic!("not EXECUTE")
                };
                assert_eq!(e.query_parameters.consistency, oracle, "{ours:?} {kind:?}");
            }
            let t = ExecTemplate::write_batch(&id, 4, ours.wire()).expect("template");
            let mut buf = BytesMut::new();
            t.encode(&mut buf, 6, &op);
            let RequestBody::Batch(b) = oracle_request(&buf, 6, Opcode::Batch) else {
                panic!("not BATCH")
            };
            assert_eq!(b.batch_type, BatchType::Unlogged);
            assert_eq!(b.consistency, oracle, "{ours:?} batch");
        }
    }

    /// Three nodes on 127.0.0.1-3 with two tokens each, interleaved.
    fn three_node_ring() -> TokenMetadata {
        let node = |i: u8, tokens: [i64; 2]| {
            let addr: SocketAddr = format!("127.0.0.{i}:9042").parse().expect("addr");
            Node {
                host_id: uuid::Uuid::from_u128(u128::from(i)),
                cql_address: addr,
                internode_address: addr,
                dc: "datacenter1".into(),
                rack: "rack1".into(),
                tokens: tokens.map(Token).to_vec(),
                state: NodeState::Normal,
            }
        };
        TokenMetadata::new(vec![
            node(1, [-300, 0]),
            node(2, [-200, 100]),
            node(3, [-100, 200]),
        ])
        .expect("ring")
    }

    fn ips(last: &[u8]) -> Vec<IpAddr> {
        last.iter().map(|i| IpAddr::from([127, 0, 0, *i])).collect()
    }

    #[test]
    fn replica_ring_picks_the_partitions_replicas_in_turn() {
        let meta = three_node_ring();
        // RF 1: always the primary, the owner of the first token at or after the key's.
        let one = ReplicaRing::new(&meta, 1, &ips(&[1, 2, 3]));
        for turn in 0..4 {
            assert_eq!(one.pick(-250, turn), Some(1), "(-300, -200] is node 2's");
            assert_eq!(one.pick(-200, turn), Some(1), "a token ends its own range");
            assert_eq!(one.pick(50, turn), Some(1));
            assert_eq!(one.pick(150, turn), Some(2));
            assert_eq!(
                one.pick(250, turn),
                Some(0),
                "past the last token wraps to the first"
            );
        }
        // RF 2: the primary and the next distinct node on the ring, alternately.
        let two = ReplicaRing::new(&meta, 2, &ips(&[1, 2, 3]));
        let picks: Vec<_> = (0..4).map(|t| two.pick(150, t)).collect();
        assert_eq!(picks, [Some(2), Some(0), Some(2), Some(0)]);
        // RF 3 on 3 nodes: every node in turn.
        let three = ReplicaRing::new(&meta, 3, &ips(&[1, 2, 3]));
        let picks: Vec<_> = (0..3).map(|t| three.pick(-50, t)).collect();
        assert_eq!(picks, [Some(0), Some(1), Some(2)]);
        // The client's own node order maps ring nodes onto its connections.
        let reordered = ReplicaRing::new(&meta, 1, &ips(&[3, 1]));
        assert_eq!(
            reordered.pick(150, 0),
            Some(0),
            "node 3 is the client's first"
        );
        assert_eq!(
            reordered.pick(-250, 0),
            None,
            "node 2 is not among the client's"
        );
        // A replica the client lacks is skipped for the next one.
        let partial = ReplicaRing::new(&meta, 2, &ips(&[3, 1]));
        assert_eq!(
            partial.pick(-250, 0),
            Some(0),
            "node 2 missing: node 3 next"
        );
        assert_eq!(partial.pick(-250, 1), Some(0));
    }

    #[test]
    fn setup_frames_decode_with_the_oracle() {
        assert!(matches!(
            oracle_request(&Request::Options.to_frame(0), 0, Opcode::Options),
            RequestBody::Options(_)
        ));
        let f = startup_frame(&[
            ("CQL_VERSION", "3.0.0"),
            ("SCYLLA_RATE_LIMIT_ERROR", "ERROR_CODE=61440"),
        ]);
        let RequestBody::Startup(s) = oracle_request(&f, 0, Opcode::Startup) else {
            panic!("not STARTUP")
        };
        let want: HashMap<String, String> = [
            ("CQL_VERSION", "3.0.0"),
            ("SCYLLA_RATE_LIMIT_ERROR", "ERROR_CODE=61440"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(s.map, want);
        let cql = "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, ?) USING TIMEOUT 10ms";
        let RequestBody::Prepare(p) = oracle_request(&prepare_frame(cql), 0, Opcode::Prepare)
        else {
            panic!("not PREPARE")
        };
        assert_eq!((p.query.as_str(), p.keyspace), (cql, None));
    }

    #[test]
    fn answers_map_onto_outcome_classes() {
        let void = ResResultBody::Void.serialize_to_vec(Version::V4);
        assert_eq!(
            our_reply(&response(Opcode::Result, 5, void, vec![]), true),
            (5, Reply::Ok)
        );
        let wt = ErrorType::WriteTimeout(WriteTimeoutError {
            cl: Consistency::One,
            received: 0,
            block_for: 1,
            write_type: WriteType::Simple,
            contentions: None,
        });
        let cases = [
            (error(ErrorType::Overloaded), true, Reply::Overloaded),
            (error(wt), true, Reply::ServerTimeout),
            (error(ErrorType::Config), false, Reply::RateLimited),
            (error(ErrorType::Config), true, Reply::Other),
            (error(ErrorType::Syntax), true, Reply::Other),
            (error(ErrorType::Server), false, Reply::Other),
        ];
        for (i, (body, opt_in, want)) in cases.into_iter().enumerate() {
            let raw = response(Opcode::Error, i as i16 + 1, body.clone(), vec![]);
            assert_eq!(our_reply(&raw, opt_in), (i as i16 + 1, want), "case {i}");
            // Warnings come before the error code and must be skipped.
            let raw = response(
                Opcode::Error,
                9,
                body,
                vec!["w1".into(), "warning two".into()],
            );
            assert_eq!(our_reply(&raw, opt_in).1, want, "case {i} with warnings");
        }
        // ReadTimeout (its oracle type cannot be built here) and ScyllaDB's 0xF000 rate-limit
        // error (unknown to the oracle) by hand; the oracle checks the ReadTimeout bytes.
        let mut rt = 0x1200i32.to_be_bytes().to_vec();
        rt.extend_from_slice(&[0, 1, b'm', 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
        let raw = response(Opcode::Error, 2, rt, vec![]);
        let env = Envelope::from_buffer(&raw, Compression::None)
            .expect("parse")
            .envelope;
        let parsed = env.response_body().expect("oracle decodes ReadTimeout");
        assert!(matches!(
            parsed,
            cassandra_protocol::frame::message_response::ResponseBody::Error(ErrorBody {
                ty: ErrorType::ReadTimeout(_),
                ..
            })
        ));
        assert_eq!(our_reply(&raw, true).1, Reply::ServerTimeout);
        let mut rl = 0xF000i32.to_be_bytes().to_vec();
        rl.extend_from_slice(&[0, 1, b'm', 0, 1]);
        assert_eq!(
            our_reply(&response(Opcode::Error, 2, rl, vec![]), true).1,
            Reply::RateLimited
        );
        // A truncated ERROR, a tracing flag and other opcodes.
        let head = Head {
            stream: 1,
            opcode: OP_ERROR,
            flags: 0,
            len: 2,
        };
        assert_eq!(reply_of(&head, &[0, 0], true), Reply::Other);
        let mut traced = vec![0u8; 16];
        traced.extend_from_slice(&ERR_OVERLOADED.to_be_bytes());
        let head = Head {
            stream: 1,
            opcode: OP_ERROR,
            flags: FLAG_TRACING,
            len: traced.len(),
        };
        assert_eq!(reply_of(&head, &traced, true), Reply::Overloaded);
        let head = Head {
            stream: 1,
            opcode: OP_READY,
            flags: 0,
            len: 0,
        };
        assert_eq!(reply_of(&head, &[], true), Reply::Other);
    }

    #[test]
    fn headers_parse_only_when_whole_and_v4() {
        let raw = response(Opcode::Ready, 300, vec![], vec![]);
        assert_eq!(parse_head(&raw[..8]), None);
        assert_eq!(
            parse_head(&raw),
            Some(Ok(Head {
                stream: 300,
                opcode: OP_READY,
                flags: 0,
                len: 0
            }))
        );
        let mut v3 = raw.clone();
        v3[0] = 0x83;
        assert!(matches!(parse_head(&v3), Some(Err(_))));
    }

    #[test]
    fn supported_gives_the_sharding() {
        let data: HashMap<String, Vec<String>> = [
            ("SCYLLA_SHARD", "1"),
            ("SCYLLA_NR_SHARDS", "2"),
            ("SCYLLA_SHARDING_IGNORE_MSB", "12"),
            ("SCYLLA_SHARD_AWARE_PORT", "19042"),
            ("SCYLLA_RATE_LIMIT_ERROR", "ERROR_CODE=61440"),
            ("CQL_VERSION", "3.4.7"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
        .collect();
        let body = BodyResSupported { data }.serialize_to_vec(Version::V4);
        let s = Sharding::of(&parse_supported(&body).expect("multimap"));
        assert_eq!(
            s,
            Sharding {
                shard: Some(1),
                nr_shards: 2,
                ignore_msb: 12,
                shard_aware_port: Some(19042),
                rate_limit_error: Some("ERROR_CODE=61440".into()),
            }
        );
        // Cassandra: no sharding keys at all.
        let data: HashMap<String, Vec<String>> = [
            ("CQL_VERSION".to_string(), vec!["3.4.5".to_string()]),
            (
                "COMPRESSION".to_string(),
                vec!["lz4".into(), "snappy".into()],
            ),
        ]
        .into_iter()
        .collect();
        let body = BodyResSupported { data }.serialize_to_vec(Version::V4);
        let s = Sharding::of(&parse_supported(&body).expect("multimap"));
        assert_eq!((s.shard, s.nr_shards, s.shard_aware_port), (None, 1, None));
        assert!(parse_supported(&body[..body.len() - 1]).is_none());
    }

    #[test]
    fn stream_ids_are_lent_and_returned() {
        let mut t = InFlight::new();
        let caller = |tx| Waiter::Caller(tx);
        let mut rxs = Vec::new();
        for want in 1..=MAX_STREAM {
            let (tx, rx) = oneshot::channel();
            assert_eq!(t.take(caller(tx)).ok(), Some(want));
            rxs.push(rx);
        }
        // No id left: the waiter comes back.
        let (tx, _rx) = oneshot::channel();
        assert!(t.take(caller(tx)).is_err());
        t.complete(5, Reply::Overloaded);
        assert_eq!(rxs[4].try_recv(), Ok(Reply::Overloaded));
        // An answer whose waiter gave up frees its id all the same.
        drop(rxs.pop());
        t.complete(MAX_STREAM, Reply::Ok);
        t.complete(5, Reply::Ok); // a duplicate answer is ignored
        t.complete(-1, Reply::Ok); // an event is not a request
        let (a, _ra) = oneshot::channel();
        let (b, _rb) = oneshot::channel();
        let mut got = [
            t.take(caller(a)).expect("free id"),
            t.take(caller(b)).expect("free id"),
        ];
        got.sort_unstable();
        assert_eq!(got, [5, MAX_STREAM]);
        t.close();
        assert_eq!(rxs[0].try_recv(), Ok(Reply::Other));
        let (c, _rc) = oneshot::channel();
        assert!(
            t.take(caller(c)).is_err(),
            "a closed connection lends no id"
        );
    }

    /// A step's sink with a 10 ms client timeout and a 5 ms deadline, one class.
    fn sink() -> Arc<StepSink> {
        let cfg = RunConfig {
            arrival: crate::schedule::Arrival::Constant,
            deadline: Duration::from_millis(5),
            client_timeout: Duration::from_millis(10),
            lag_tolerance: Duration::from_millis(2),
            max_in_flight: 100,
            seed: 1,
            progress: false,
        };
        Arc::new(StepSink::new(Recorder::new(1, Instant::now(), 0), &cfg))
    }

    #[tokio::test(start_paused = true)]
    async fn runner_requests_are_answered_or_timed_out_by_the_sweep() {
        let sink = sink();
        let mut t = InFlight::new();
        let t0 = Instant::now();
        let ticket = || Waiter::Ticket(sink.begin(t0, 0).expect("below the cap"));
        let ids: Vec<i16> = (0..4).map(|_| t.take(ticket()).expect("id")).collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        t.complete(2, Reply::Ok); // on time: goodput
        tokio::time::advance(Duration::from_millis(7)).await;
        t.complete(4, Reply::Overloaded);
        t.expire(Instant::now());
        assert_eq!(sink.in_flight(), 2, "not expired yet");
        tokio::time::advance(Duration::from_millis(4)).await;
        t.expire(Instant::now());
        assert_eq!(sink.in_flight(), 0);
        assert!(t.expiries.is_empty(), "every entry ended and was swept");
        // The timed-out ids 1 and 3 stay taken until the server answers them: the next
        // requests get the answered 4 and 2, then a new id.
        let ids: Vec<i16> = (0..3)
            .map(|_| t.take(Waiter::Caller(oneshot::channel().0)).expect("id"))
            .collect();
        assert_eq!(ids, [4, 2, 5]);
        t.complete(1, Reply::Ok);
        assert_eq!(t.free.last(), Some(&1), "a late answer frees the id");
        // It is not counted again: the request was already recorded as a client timeout.
        let (_, totals) = sink.finish(Instant::now());
        let c = totals[0].counts;
        assert_eq!(
            (c.ok, c.overloaded, c.client_timeout, c.completed()),
            (1, 1, 2, 4),
            "{c:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_connection_fails_its_runner_requests_once() {
        let sink = sink();
        let mut t = InFlight::new();
        for _ in 0..3 {
            let ticket = sink.begin(Instant::now(), 0).expect("below the cap");
            t.take(Waiter::Ticket(ticket)).expect("id");
        }
        t.close();
        t.expire(Instant::now() + Duration::from_secs(1));
        let ticket = sink.begin(Instant::now(), 0).expect("below the cap");
        let refused = t.take(Waiter::Ticket(ticket)).expect_err("closed");
        refused.answer(Reply::Other);
        assert_eq!(sink.in_flight(), 0);
        let (_, totals) = sink.finish(Instant::now());
        assert_eq!(
            (totals[0].counts.other, totals[0].counts.completed()),
            (4, 4)
        );
    }

    #[test]
    fn source_ports_land_on_the_shard() {
        let mut p = PortPicker::new(PORT_HIGH - 3);
        let ports: Vec<u16> = (0..6).map(|_| p.pick(1, 4)).collect();
        assert!(
            ports
                .iter()
                .all(|&x| x % 4 == 1 && u32::from(x) >= PORT_LOW),
            "{ports:?}"
        );
        assert!(ports.windows(2).all(|w| w[0] != w[1]), "{ports:?}");
        let mut p = PortPicker::new(PORT_LOW);
        assert_eq!(p.pick(0, 1), PORT_LOW as u16);
        assert_eq!(p.pick(0, 1), PORT_LOW as u16 + 1);
    }

    /// A server that waits `wait`, answers the first `answer` EXECUTEs with RESULT Void
    /// (stream order reversed per read, to show answers need not come in order) and closes.
    async fn fake_server(
        listener: tokio::net::TcpListener,
        answer: usize,
        wait: Duration,
    ) -> usize {
        let (mut s, _) = listener.accept().await.expect("accept");
        tokio::time::sleep(wait).await;
        let mut seen = 0;
        let mut buf = BytesMut::new();
        while seen < answer {
            if s.read_buf(&mut buf).await.expect("read") == 0 {
                break;
            }
            let mut streams = Vec::new();
            while buf.len() >= HEADER_LEN {
                let len = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) as usize;
                if buf.len() < HEADER_LEN + len {
                    break;
                }
                assert_eq!(buf[4], sluice_protocol::Opcode::Execute as u8);
                streams.push(i16::from_be_bytes([buf[2], buf[3]]));
                buf.advance(HEADER_LEN + len);
            }
            let mut out = Vec::new();
            for st in streams.into_iter().rev() {
                if seen < answer {
                    out.extend(response(Opcode::Result, st, vec![0, 0, 0, 1], vec![]));
                    seen += 1;
                }
            }
            s.write_all(&out).await.expect("write");
        }
        seen
    }

    /// A client connection to `addr` with its reader and stall tasks, as `RawTarget` builds it;
    /// `send_buffer` shrinks the socket's send buffer so that writes find it full.
    async fn client(addr: SocketAddr, send_buffer: Option<u32>) -> Arc<Conn> {
        let sock = TcpSocket::new_v4().expect("socket");
        if let Some(n) = send_buffer {
            sock.set_send_buffer_size(n).expect("SO_SNDBUF");
        }
        let (rd, wr) = sock.connect(addr).await.expect("connect").into_split();
        let id = [9u8; 16];
        let conn = Arc::new(Conn::new(
            wr,
            ExecTemplate::new(&id, OpKind::Write, sluice_protocol::Consistency::One).unwrap(),
            ExecTemplate::new(&id, OpKind::Read, sluice_protocol::Consistency::One).unwrap(),
        ));
        tokio::spawn(unstall(conn.clone()));
        tokio::spawn(reader(rd, conn.clone(), true));
        conn
    }

    fn sender(conn: &Arc<Conn>) -> impl Fn(i64) -> tokio::sync::oneshot::Receiver<Reply> + '_ {
        move |pk| {
            let (reply, rx) = oneshot::channel();
            let kind = if pk % 2 == 0 {
                OpKind::Write
            } else {
                OpKind::Read
            };
            conn.queue(&Op { kind, pk, ck: 0 }, Waiter::Caller(reply));
            if conn.claim_flush() {
                conn.flush();
            }
            rx
        }
    }

    async fn replies(rxs: Vec<oneshot::Receiver<Reply>>) -> Vec<Reply> {
        let mut out = Vec::with_capacity(rxs.len());
        for rx in rxs {
            out.push(rx.await.unwrap_or(Reply::Other));
        }
        out
    }

    /// A listener for a fake server on a free loopback port.
    async fn loopback_listener() -> (tokio::net::TcpListener, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        (listener, addr)
    }

    #[tokio::test]
    async fn pipelined_answers_complete_and_a_closed_connection_fails_the_rest() {
        let (listener, addr) = loopback_listener().await;
        let server = tokio::spawn(fake_server(listener, 100, Duration::ZERO));
        let conn = client(addr, None).await;
        let send = sender(&conn);
        let work = async {
            let first = replies((0..100).map(&send).collect()).await;
            assert!(first.iter().all(|r| *r == Reply::Ok), "{first:?}");
            assert_eq!(server.await.expect("server"), 100);
            // The server has closed: what is in flight or sent later fails.
            let later = replies((100..110).map(&send).collect()).await;
            assert!(later.iter().all(|r| *r == Reply::Other), "{later:?}");
        };
        tokio::time::timeout(Duration::from_secs(10), work)
            .await
            .expect("bounded");
    }

    #[tokio::test]
    async fn writes_that_find_the_socket_full_are_finished_by_the_stall_task() {
        let (listener, addr) = loopback_listener().await;
        // The server reads nothing for a while: ~5 MB of frames cannot fit in the buffers.
        let n = 30_000;
        let server = tokio::spawn(fake_server(listener, n, Duration::from_millis(300)));
        let conn = client(addr, Some(4096)).await;
        let send = sender(&conn);
        let work = async {
            let rxs: Vec<_> = (0..n as i64).map(&send).collect();
            assert!(
                conn.lock().flushing,
                "the socket filled up and the stall task has the rest"
            );
            let got = replies(rxs).await;
            assert!(got.iter().all(|r| *r == Reply::Ok));
            assert_eq!(server.await.expect("server"), n);
        };
        tokio::time::timeout(Duration::from_secs(20), work)
            .await
            .expect("bounded");
    }

    #[tokio::test]
    async fn the_send_delay_counts_the_wait_for_a_full_socket() {
        let (listener, addr) = loopback_listener().await;
        // The server reads nothing for 300 ms: most frames wait in the client to be written.
        let n = 20_000;
        let server = tokio::spawn(fake_server(listener, n, Duration::from_millis(300)));
        let conn = client(addr, Some(4096)).await;
        let cfg = RunConfig {
            arrival: crate::schedule::Arrival::Constant,
            deadline: Duration::from_secs(10),
            client_timeout: Duration::from_secs(10),
            lag_tolerance: Duration::from_millis(2),
            max_in_flight: n,
            seed: 1,
            progress: false,
        };
        let sink = Arc::new(StepSink::new(Recorder::new(1, Instant::now(), 0), &cfg));
        let intended = Instant::now();
        for pk in 0..n as i64 {
            let ticket = sink.begin(intended, 0).expect("below the cap");
            let op = Op {
                kind: OpKind::Write,
                pk,
                ck: 0,
            };
            conn.queue(&op, Waiter::Ticket(ticket));
        }
        if conn.claim_flush() {
            conn.flush();
        }
        let answered = async {
            while sink.in_flight() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), answered)
            .await
            .expect("bounded");
        assert_eq!(server.await.expect("server"), n);
        let d = crate::runner::SendDelay::of(&conn.take_send_delays()).expect("recorded");
        assert_eq!(d.written, n as u64, "every request once");
        assert!(d.max_us >= 250_000, "the last waited for the server: {d:?}");
        assert!(d.over_1ms > 0.5, "most went out late: {d:?}");
        assert!(conn.take_send_delays().is_empty(), "taking resets");
    }
}
