//! One client connection on its shard: a reader that pulls frames out of a `BytesMut`, many
//! requests in flight at once (answered out of order, by stream id), and a single writer
//! that flushes whatever answers have accumulated in one `write_all`.
//!
//! The reader hands each frame to the request pipeline ([`crate::pipeline`]), which runs it
//! in the reader until it must wait (group commit, the admission queue, another shard); only
//! then does the request get a task of its own.
//!
//! Bounds: at most `max_inflight_per_connection` requests in flight per connection and
//! `max_inflight_per_shard` per shard (and as many request bytes). Over a cap, the socket is
//! not read (backpressure: the client's own queue grows, nothing is rejected), unless the
//! shard is overloaded: then the reader keeps reading and answers the excess with the
//! pre-encoded `Overloaded` frame from the header, because paused, that excess would wait
//! unseen in the kernel socket buffer and time out at the client instead. Answers not yet
//! written are bounded too: the reader waits while the outbox holds more than
//! [`MAX_OUTBOX_BYTES`], rejections included, so a client that does not read its answers is
//! still stopped by backpressure. A paced connection held back (a pause over a cap, a whole
//! quantum still buffered) is first read ahead into the reader's own bounded buffer, so that
//! a client that does not slow down shows its growing backlog ([`crate::read_ahead`]).
//! A malformed frame closes this connection only; a panic while serving a request answers
//! that stream with Server_error and leaves the shard running.
//!
//! Arrival: a frame's arrival is the kernel's receive time of its last byte, as far as the
//! reader can tell (`SO_TIMESTAMPNS`, see [`crate::socket_wait`]), or the instant of its read
//! where the socket gives no stamp. So the time a frame waited unread in the kernel, and then
//! behind the frames read before it, counts as queueing for admission. The kernel stamps only
//! a read's newest byte; the frames before it are spread back towards the earliest their
//! bytes can have come ([`crate::socket_wait::ReadArrivals`]). Without the stamp, a saturated
//! shard that kept its own queue short let its excess age unseen in the socket buffer;
//! without the spread, a reader that runs its requests itself saw every read as young and
//! shed nothing until deadlines passed (docs/decisions/2026-11-25-kernel-receive-stamps.md and
//! 2026-11-25-requests-run-in-the-reader.md).
//! The reader takes its in-flight slots without awaiting while they are free (no cooperative
//! yield per frame, so it drains what it read instead of leaving it to age in the buffer)
//! and yields to the shard's other tasks every [`READ_QUANTUM`] frames (a request it ran
//! counts as several).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use sluice_engine::Session;
use sluice_overload::{Arrival, BacklogConfig, BacklogWatch};
use sluice_protocol::compression::Compression;
use sluice_protocol::frame::{FrameDecoder, FrameHeader, HEADER_LEN};
use sluice_storage::AckBarrier;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tracing::debug;

use crate::budget::Budget;
use crate::pipeline::admit::{self, Admission};
use crate::pipeline::Pending;
use crate::pipeline::{self, reply};
use crate::read_ahead::{self, ReadAheadCharge};
use crate::shard::ShardCtx;
use crate::socket_wait::{LastRead, Read, ReadArrivals};
use crate::supported::StartupOptIns;

/// Shortest time between two samples of a connection's backlog (see [`watch_backlog`]).
pub(crate) const BACKLOG_SAMPLE: std::time::Duration = std::time::Duration::from_millis(1);
/// Answers waiting to be written beyond which the reader stops reading requests.
pub const MAX_OUTBOX_BYTES: usize = 8 << 20;
/// Read buffer growth step.
const READ_CHUNK: usize = 64 << 10;
/// Largest read: after reads that filled the buffer (more is likely waiting in the kernel,
/// unseen by admission), each read takes twice as much, up to this, so that the backlog
/// moves into the buffer where every frame carries the instant it was read.
const READ_AHEAD: usize = 1 << 20;
/// Frames a reader handles before it lets the shard's other tasks run: large enough to drain a
/// full read buffer of small requests in one go, small enough (well under a millisecond of
/// admission work) to keep the event loop's lag low.
pub const READ_QUANTUM: usize = 512;
/// What a request run in the reader counts towards [`READ_QUANTUM`]: running one costs
/// about as much as admitting eight, so the reader yields after at most 64 of them.
const INLINE_RUN_WEIGHT: usize = 8;

/// Encoded answers of one connection, appended by request tasks and drained by the writer.
pub struct Outbox {
    buf: RefCell<BytesMut>,
    ready: Notify,
    drained: Notify,
    closed: Cell<bool>,
}

impl Outbox {
    fn new() -> Outbox {
        Outbox {
            buf: RefCell::new(BytesMut::with_capacity(READ_CHUNK)),
            ready: Notify::new(),
            drained: Notify::new(),
            closed: Cell::new(false),
        }
    }

    /// Appends one or more complete frames through `encode` and wakes the writer.
    #[inline]
    pub fn push(&self, encode: impl FnOnce(&mut BytesMut)) {
        if self.closed.get() {
            return;
        }
        let mut buf = self.buf.borrow_mut();
        let was_empty = buf.is_empty();
        encode(&mut buf);
        drop(buf);
        // Answers already waiting were announced by the push that found the outbox empty,
        // and the writer takes everything once awake, so only that push wakes it.
        if was_empty {
            self.ready.notify_one();
        }
    }

    /// Moves every answer not yet written into `into` (which must be empty): what the
    /// writer does before each socket write, for a caller that drains the outbox itself.
    pub fn take(&self, into: &mut BytesMut) {
        debug_assert!(into.is_empty(), "answers are taken into an empty buffer");
        std::mem::swap(&mut *self.buf.borrow_mut(), into);
        self.drained.notify_one();
    }

    /// Bytes not yet handed to the socket.
    pub fn pending(&self) -> usize {
        self.buf.borrow().len()
    }

    /// True once the connection is closing: answers are discarded.
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// Stops accepting answers and lets the writer finish.
    pub fn close(&self) {
        self.closed.set(true);
        self.ready.notify_one();
    }
}

/// Per-connection protocol state.
pub struct ConnState {
    /// Outgoing answers.
    pub outbox: Rc<Outbox>,
    /// Negotiated at STARTUP.
    pub compression: Cell<Compression>,
    /// STARTUP done (requests other than OPTIONS/STARTUP are accepted).
    pub ready: Cell<bool>,
    /// Scylla opt-ins echoed at STARTUP.
    pub opt_ins: Cell<StartupOptIns>,
    /// Current keyspace and other session state; each request works on a copy and USE
    /// writes it back, so requests never hold a borrow across an await.
    pub session: RefCell<Session>,
    /// Per-connection in-flight cap.
    pub inflight: Rc<Budget>,
    /// Per-connection cap on request bytes in flight.
    pub inflight_bytes: Rc<Budget>,
    /// Task pushing events, once REGISTERed.
    pub events: RefCell<Option<tokio::task::JoinHandle<()>>>,
    /// The event types REGISTERed for.
    pub registered: Cell<crate::events::Registered>,
    /// The client's address (source of its logins).
    pub peer: Option<std::net::SocketAddr>,
    /// Where the connection is in the login exchange.
    pub login: Cell<LoginPhase>,
    /// Permission decisions of the logged-in role, valid for one auth generation.
    pub permissions: RefCell<sluice_engine::auth::PermissionCache>,
    /// The denial of the request being turned away as Unauthorized, for its answer.
    pub denial: RefCell<Option<sluice_engine::auth::Unauthorized>>,
    /// Tells this connection's bounded backlog (served, held back) from a client that does
    /// not slow down (its excess turned away): see `sluice_overload::backlog`.
    pub backlog: Cell<BacklogWatch>,
    /// The backlog watch's latest verdict: the client does not slow down when held back.
    pub pushing: Cell<bool>,
}

/// Where a connection is in the login exchange of the password authenticator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginPhase {
    /// No login needed (allow-all), or STARTUP not seen yet.
    NotRequired,
    /// STARTUP answered AUTHENTICATE: only OPTIONS and AUTH_RESPONSE are served.
    Awaiting,
    /// An AUTH_RESPONSE is being checked.
    Checking,
    /// Logged in.
    Done,
}

impl ConnState {
    /// Runs `f` with the session's current keyspace, borrowed: no copy of its name per
    /// request. `f` must not touch the session itself.
    pub fn with_keyspace<R>(&self, f: impl FnOnce(Option<&str>) -> R) -> R {
        f(self.session.borrow().keyspace.as_deref())
    }

    /// A new connection's state on `shard`: not started, no compression, empty outbox.
    pub fn new(shard: &ShardCtx) -> ConnState {
        ConnState {
            outbox: Rc::new(Outbox::new()),
            compression: Cell::new(Compression::None),
            ready: Cell::new(false),
            opt_ins: Cell::new(StartupOptIns::default()),
            session: RefCell::new(Session::default()),
            inflight: Budget::new(shard.config.max_inflight_per_connection),
            inflight_bytes: Budget::new(shard.config.max_inflight_bytes_per_connection),
            events: RefCell::new(None),
            registered: Cell::new(crate::events::Registered::default()),
            peer: None,
            login: Cell::new(LoginPhase::NotRequired),
            permissions: RefCell::new(Default::default()),
            denial: RefCell::new(None),
            backlog: Cell::new(BacklogWatch::new(BacklogConfig {
                interval: shard
                    .config
                    .admission
                    .map_or(BacklogConfig::default().interval, |a| a.codel.interval),
                ..BacklogConfig::default()
            })),
            pushing: Cell::new(false),
        }
    }
}

/// Serves one accepted socket until the client closes it, it misbehaves, or shutdown:
/// read, take each complete frame, hand it to the pipeline.
pub async fn serve(shard: Rc<ShardCtx>, stream: std::net::TcpStream) {
    shard.metrics.connections.fetch_add(1, Relaxed);
    let _guard = ConnectionCount(shard.clone());
    let peer = stream.peer_addr().ok();
    let Some((mut rd, wr, stamped)) = socket(stream, shard.config.tls.as_deref(), &shard).await
    else {
        return;
    };
    let conn = Rc::new(ConnState {
        peer,
        ..ConnState::new(&shard)
    });
    let writer = tokio::task::spawn_local(write_loop(
        wr,
        conn.outbox.clone(),
        shard.ack_barrier.clone(),
    ));
    let _close_outbox = CloseOnDrop(conn.outbox.clone());
    let mut decoder = FrameDecoder::new(shard.config.max_frame_bytes);
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut shutdown = shard.shutdown.clone();
    let mut reads = ReadState::new(shard.clock.now());
    let mut since_yield = 0usize;
    // Bytes of frames turned away at the front of `buf`, dropped together (see
    // `FrameDecoder::next_header_past`).
    let mut skipped = 0usize;
    // What this connection holds of its shard's read-ahead pool (see `crate::read_ahead`).
    let mut charge = ReadAheadCharge::new(shard.read_ahead.clone());

    'read: loop {
        // Every complete frame already buffered. The header first: a frame turned away from
        // it is skipped without taking its body.
        loop {
            let header = match decoder.next_header_past(&mut buf, &mut skipped) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    reply::protocol_close(&shard, &conn, e);
                    break 'read;
                }
            };
            shard.metrics.count_request(header.opcode as u8);
            let frame_len = HEADER_LEN + header.length as usize;
            let arrival = reads.arrivals.next_arrival(frame_len, || {
                admit::is_paced(&shard, &conn).then(|| shard.clock.now())
            });
            since_yield += 1;
            if since_yield >= READ_QUANTUM {
                since_yield = 0;
                // A reader a whole quantum behind holds the rest back in the kernel as a pause
                // does, and the kernel's buffer may be too small to show the backlog grow:
                // what came meanwhile moves into the reader's buffer.
                let unread = buf.len().saturating_sub(skipped + frame_len);
                let read =
                    read_ahead::read_ahead(&shard, &conn, &mut buf, &mut charge, |b, want| {
                        try_read_some(&rd, b, want)
                    });
                reads.arrivals.read_ahead(unread, read, shard.clock.now());
                tokio::task::yield_now().await;
            }
            let step = handle_frame_at_once(&shard, &conn, &mut buf, &mut skipped, header, arrival);
            let handled = match step {
                FrameStep::Done => Handled::DONE,
                FrameStep::Waits(pending) => run_pending(pending).await,
                FrameStep::OverCap => {
                    let arrivals = &mut reads.arrivals;
                    let read_ahead = |b: &mut BytesMut| {
                        let unread = b.len().saturating_sub(frame_len);
                        let read =
                            read_ahead::read_ahead(&shard, &conn, b, &mut charge, |b, want| {
                                try_read_some(&rd, b, want)
                            });
                        arrivals.read_ahead(unread, read, shard.clock.now());
                        read
                    };
                    Box::pin(handle_frame_over_cap(
                        &shard, &conn, &mut buf, header, read_ahead,
                    ))
                    .await
                }
            };
            if let Some(at) = handled.resumed_at {
                reads.resumed(at);
            }
            if conn.outbox.closed.get() {
                break 'read;
            }
            since_yield += handled.weight;
        }
        // Do not read more while the answers pile up unread by the client.
        if conn.outbox.pending() > MAX_OUTBOX_BYTES {
            while conn.outbox.pending() > MAX_OUTBOX_BYTES && !conn.outbox.closed.get() {
                conn.outbox.drained.notified().await;
            }
            reads.resumed_at = shard.clock.now();
        }
        if conn.outbox.closed.get() {
            break;
        }
        read_ahead::release(&mut charge, &mut buf, 2 * READ_AHEAD);
        watch_backlog(&shard, &conn, &rd, &buf, &mut reads);
        make_room(&mut buf, reads.size);
        let spare = buf.capacity() - buf.len();
        tokio::select! {
            r = read(&mut rd, &mut buf, stamped) => match r {
                // The client is gone: nobody waits for the answers, so requests that have not
                // started executing are dropped.
                Ok(Read { len: 0, .. }) | Err(_) => {
                    conn.outbox.close();
                    break;
                }
                Ok(r) => {
                    let carried = buf.len() - r.len;
                    let now = shard.clock.now();
                    let lag = shard.admission.borrow().loop_lag(now);
                    reads.completed(&r, spare, carried, now, lag);
                }
            },
            _ = shutdown.changed() => break,
        }
    }
    close(&shard, &conn).await;
    let _ = writer.await;
    buf.advance(buf.len());
}

/// What became of one frame handed to the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    /// The reader paused over an in-flight cap before admitting it and resumed then.
    pub resumed_at: Option<Instant>,
    /// What it counts towards [`READ_QUANTUM`] beyond its frame.
    pub weight: usize,
}

/// Hands the frame whose `header` was just read from `buf` to the pipeline: admission from
/// the header (the body is skipped if it is turned away), then every stage that runs in the
/// reader; a request that has to wait is spawned as a task. Over an in-flight cap,
/// `read_ahead` reads the socket ahead before the reader pauses ([`handle_frame_over_cap`]).
pub async fn handle_frame(
    shard: &Rc<ShardCtx>,
    conn: &Rc<ConnState>,
    buf: &mut BytesMut,
    header: FrameHeader,
    arrival: Arrival<Instant>,
    read_ahead: impl FnOnce(&mut BytesMut) -> usize,
) -> Handled {
    let mut skipped = 0;
    let step = handle_frame_at_once(shard, conn, buf, &mut skipped, header, arrival);
    FrameDecoder::drop_skipped(buf, &mut skipped);
    match step {
        FrameStep::Done => Handled::DONE,
        FrameStep::Waits(pending) => run_pending(pending).await,
        FrameStep::OverCap => handle_frame_over_cap(shard, conn, buf, header, read_ahead).await,
    }
}

/// A frame over an in-flight cap: `read_ahead` first moves what the socket holds into `buf`
/// (a paced connection's, see [`crate::read_ahead`]; it returns the bytes read), then the
/// reader pauses ([`handle_frame_after_pause`]). Bytes read ahead waited in the client's
/// queue, as the rest of a held-back backlog does: they count as arrived no earlier than the
/// pause's end, and while the connection is paced, when the reader takes them
/// ([`ReadArrivals::next_arrival`]).
pub async fn handle_frame_over_cap(
    shard: &Rc<ShardCtx>,
    conn: &Rc<ConnState>,
    buf: &mut BytesMut,
    header: FrameHeader,
    read_ahead: impl FnOnce(&mut BytesMut) -> usize,
) -> Handled {
    let read = read_ahead(buf);
    let mut handled = handle_frame_after_pause(shard, conn, buf, header).await;
    if read > 0 && handled.resumed_at.is_none() {
        handled.resumed_at = Some(shard.clock.now());
    }
    handled
}

/// Where [`handle_frame_at_once`] left a frame.
pub enum FrameStep {
    /// Answered (or turned away) in the reader.
    Done,
    /// Admitted, with stages left that may wait: [`run_pending`].
    Waits(Pending),
    /// Over an in-flight cap: the reader pauses in [`handle_frame_after_pause`].
    OverCap,
}

impl Handled {
    /// A frame answered without a pause or a run in the reader.
    const DONE: Handled = Handled {
        resumed_at: None,
        weight: 0,
    };
}

/// [`handle_frame`]'s part that needs no wait: admission decided at once, and the stages
/// that run in the reader. Synchronous, so that the common frame builds no future. The
/// frame starts `skipped` bytes into `buf` (see `FrameDecoder::next_header_past`); one
/// turned away adds its bytes there, any other drops them first and leaves it at 0.
#[inline]
pub fn handle_frame_at_once(
    shard: &Rc<ShardCtx>,
    conn: &Rc<ConnState>,
    buf: &mut BytesMut,
    skipped: &mut usize,
    header: FrameHeader,
    arrival: Arrival<Instant>,
) -> FrameStep {
    let request = match admit::admit(shard, conn, &header, arrival) {
        Admission::Admitted(r) => r,
        Admission::Overloaded => {
            *skipped += HEADER_LEN + header.length as usize;
            reply::overloaded_from_header(shard, conn, header.stream);
            return FrameStep::Done;
        }
        Admission::OverCap => {
            FrameDecoder::drop_skipped(buf, skipped);
            return FrameStep::OverCap;
        }
    };
    FrameDecoder::drop_skipped(buf, skipped);
    let frame = FrameDecoder::take_frame(buf, header);
    match pipeline::start(request, frame) {
        Some(pending) => FrameStep::Waits(pending),
        None => FrameStep::Done,
    }
}

/// Runs the rest of an admitted request, here in the reader until it waits, then as a task.
pub async fn run_pending(pending: Pending) -> Handled {
    // Boxed: the request's state machine is large, and a task holding it inline copies all
    // of it when it is spawned and again when it completes.
    if let Some(waiting) = run_until_it_waits(Box::pin(pipeline::finish(pending))).await {
        tokio::task::spawn_local(waiting);
    }
    Handled {
        resumed_at: None,
        weight: INLINE_RUN_WEIGHT,
    }
}

/// A frame over an in-flight cap: the reader pauses until its units are free, then admits
/// it (see [`admit::admit_after_pause`]). The reader boxes this future, so that its state
/// does not enlarge the reader's own for the frames that never pause.
pub async fn handle_frame_after_pause(
    shard: &Rc<ShardCtx>,
    conn: &Rc<ConnState>,
    buf: &mut BytesMut,
    header: FrameHeader,
) -> Handled {
    let Some(request) = admit::admit_after_pause(shard, conn, &header).await else {
        FrameDecoder::skip_body(buf, &header);
        reply::overloaded_from_header(shard, conn, header.stream);
        return Handled::DONE;
    };
    let resumed_at = Some(request.arrival);
    let frame = FrameDecoder::take_frame(buf, header);
    let mut handled = match pipeline::start(request, frame) {
        Some(pending) => run_pending(pending).await,
        None => Handled::DONE,
    };
    handled.resumed_at = resumed_at;
    handled
}

/// The reading half of a client connection.
enum ClientReader {
    /// Plain TCP (its reads may carry the kernel's receive stamps).
    Plain(OwnedReadHalf),
    /// TLS over TCP.
    Tls(tokio::io::ReadHalf<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// The writing half of a client connection.
enum ClientWriter {
    /// Plain TCP.
    Plain(OwnedWriteHalf),
    /// TLS over TCP.
    Tls(tokio::io::WriteHalf<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl ClientWriter {
    async fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            ClientWriter::Plain(w) => w.write_all(b).await,
            ClientWriter::Tls(w) => {
                w.write_all(b).await?;
                w.flush().await
            }
        }
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        match self {
            ClientWriter::Plain(w) => w.shutdown().await,
            ClientWriter::Tls(w) => w.shutdown().await,
        }
    }
}

/// Samples the connection's backlog (unread in the kernel, and the start of a frame still
/// buffered) for its watch, at most once per [`BACKLOG_SAMPLE`] (an `ioctl` each). While
/// the shard is overloaded and the connection is not pushing, the next read takes no more
/// than needed, so that the rest of its window waits in its client (held back).
fn watch_backlog(
    shard: &ShardCtx,
    conn: &ConnState,
    rd: &ClientReader,
    buf: &BytesMut,
    reads: &mut ReadState,
) {
    if !shard.admission.borrow().paces_windows() {
        return;
    }
    let now = shard.clock.now();
    if now >= reads.next_backlog_sample {
        reads.next_backlog_sample = now + BACKLOG_SAMPLE;
        // A TLS reader's kernel bytes are ciphertext in records: not watched.
        let ClientReader::Plain(rd) = rd else {
            return;
        };
        let mut watch = conn.backlog.get();
        let unread = crate::socket_wait::unread_bytes(rd.as_ref()).unwrap_or(0);
        let at = shard.admission.borrow().nanos_of(now);
        conn.pushing
            .set(watch.observe(at, (unread + buf.len()) as u64, &shard.growing_backlogs));
        conn.backlog.set(watch);
    }
    if !conn.pushing.get() && shard.admission.borrow_mut().is_overloaded() {
        reads.size = READ_CHUNK;
    }
}

/// The socket in non-blocking mode, split, and whether the kernel stamps its reads. With
/// TLS, the handshake first (bounded): a client that fails it, such as one that speaks
/// plaintext CQL, is closed at once.
async fn socket(
    stream: std::net::TcpStream,
    tls: Option<&crate::tls::ReloadableTls>,
    shard: &ShardCtx,
) -> Option<(ClientReader, ClientWriter, bool)> {
    stream.set_nonblocking(true).ok()?;
    let stream = TcpStream::from_std(stream).ok()?;
    if let Some(tls) = tls {
        let acceptor = tls.acceptor();
        return match crate::tls::accept(&acceptor, stream, crate::tls::HANDSHAKE_TIMEOUT).await {
            Ok(s) => {
                let (rd, wr) = tokio::io::split(s);
                Some((ClientReader::Tls(rd), ClientWriter::Tls(wr), false))
            }
            Err(e) => {
                shard.metrics.tls_handshake_failures.fetch_add(1, Relaxed);
                debug!(error = %e, "TLS handshake failed; connection closed");
                None
            }
        };
    }
    // Without stamps the reader still works; admission then sees only the loop lag.
    let stamped = crate::socket_wait::enable(std::os::fd::AsRawFd::as_raw_fd(&stream)).is_ok();
    let (rd, wr) = stream.into_split();
    Some((ClientReader::Plain(rd), ClientWriter::Plain(wr), stamped))
}

/// Ends a connection: drops its queued requests if its client is gone, answers what is in
/// flight (bounded by the drain timeout), then lets the writer flush and close.
async fn close(shard: &ShardCtx, conn: &Rc<ConnState>) {
    debug!("connection closing");
    if conn.outbox.is_closed() {
        shard
            .admission
            .borrow_mut()
            .drop_connection(Rc::as_ptr(conn) as usize, &shard.metrics);
    }
    if let Some(events) = conn.events.borrow_mut().take() {
        events.abort();
    }
    let _ = tokio::time::timeout(shard.config.drain_timeout, conn.inflight.drained()).await;
    conn.outbox.close();
}

/// When the frames of the last socket read arrived, and how much the next read takes.
struct ReadState {
    /// The frames of the last read: spread between the earliest its first byte can have come
    /// and the kernel's stamp of its newest (`Arrival::Received`), or (without stamps) all at
    /// the instant of the read (`Arrival::Read`).
    arrivals: ReadArrivals,
    last_read: LastRead,
    /// The end of the last backpressure pause: bytes that waited in the kernel while the
    /// reader stopped on purpose waited in the client's queue, not the shard's, so no stamp
    /// counts from before it.
    resumed_at: Instant,
    /// The next read's size.
    size: usize,
    /// When the backlog watch takes its next sample.
    next_backlog_sample: Instant,
}

impl ReadState {
    fn new(connected_at: Instant) -> ReadState {
        ReadState {
            arrivals: ReadArrivals::all_at(connected_at),
            last_read: LastRead::connected(connected_at),
            resumed_at: connected_at,
            size: READ_CHUNK,
            next_backlog_sample: connected_at,
        }
    }

    /// The reader paused over an in-flight cap and resumed at `at`: what is still buffered
    /// counts from then (see [`ReadArrivals::resumed`]).
    fn resumed(&mut self, at: Instant) {
        self.resumed_at = at;
        self.arrivals = self.arrivals.resumed(at);
    }

    /// A read of `r.len` bytes completed at `now`, with the loop's lag `lag`, into a buffer
    /// that had `spare` bytes free and `carried` bytes of an unfinished frame.
    fn completed(&mut self, r: &Read, spare: usize, carried: usize, now: Instant, lag: Duration) {
        self.arrivals = self
            .last_read
            .next(r, spare, carried, now, self.resumed_at, lag);
        self.size = if r.len >= spare {
            (self.size * 2).min(READ_AHEAD)
        } else {
            READ_CHUNK
        };
    }
}

/// Gives `buf` room for a read of `read_size` bytes. The read-ahead depends on it: reserving
/// only when not even a frame header fit kept every read at the first 64 KiB, so a backlog
/// stayed in the kernel (and in the client, behind TCP's flow control) instead of moving
/// into the buffer where admission sees its age.
fn make_room(buf: &mut BytesMut, read_size: usize) {
    if buf.capacity() - buf.len() < read_size {
        buf.reserve(read_size);
    }
}

/// A read of at most `want` bytes into `buf` that does not wait: 0 when the socket has
/// nothing (or is closed, which the next ordinary read finds). A TLS reader reads nothing
/// ahead: its kernel bytes are records, not frames.
fn try_read_some(rd: &ClientReader, buf: &mut BytesMut, want: usize) -> usize {
    match rd {
        ClientReader::Plain(rd) => rd
            .try_read_buf(&mut bytes::BufMut::limit(&mut *buf, want))
            .unwrap_or(0),
        ClientReader::Tls(_) => 0,
    }
}

/// One socket read into `buf`, with how long its newest byte waited in the kernel when
/// `stamped` (zero otherwise).
async fn read(rd: &mut ClientReader, buf: &mut BytesMut, stamped: bool) -> std::io::Result<Read> {
    let len = match rd {
        ClientReader::Plain(rd) if stamped => {
            return crate::socket_wait::read_stamped(rd, buf).await
        }
        ClientReader::Plain(rd) => rd.read_buf(buf).await?,
        ClientReader::Tls(rd) => rd.read_buf(buf).await?,
    };
    Ok(Read {
        len,
        newest_waited: std::time::Duration::ZERO,
        idle_before: false,
        stamped: false,
    })
}

/// Polls a request once, here in the reader, and returns it if it has to wait (group
/// commit, the admission queue, another shard), for a task of its own. Most requests finish
/// in that first poll (periodic durability, reads from memory): they never become a task,
/// which saves the spawn, the scheduling and the task's state. Whatever the request's
/// futures registered to be woken is registered again, with the task's waker, by the task's
/// first poll, which tokio makes at once. A panic is caught as a task's would be: the
/// request's `InFlight` answers Server_error as it unwinds, and the connection goes on.
async fn run_until_it_waits<F: Future<Output = ()>>(
    mut request: Pin<Box<F>>,
) -> Option<Pin<Box<F>>> {
    std::future::poll_fn(|cx| {
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| request.as_mut().poll(cx)));
        Poll::Ready(matches!(polled, Ok(Poll::Pending)))
    })
    .await
    .then_some(request)
}

/// Decrements the shard's connection gauge when the connection task ends (even by panic).
struct ConnectionCount(Rc<ShardCtx>);

impl Drop for ConnectionCount {
    fn drop(&mut self) {
        self.0.metrics.connections.fetch_sub(1, Relaxed);
    }
}

/// Closes the outbox when the connection task ends, even by panic, so the writer exits.
struct CloseOnDrop(Rc<Outbox>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Drains the outbox into the socket: every wake-up writes everything accumulated so far in
/// one `write_all` (answers flushed in batches).
///
/// Before each write it flushes storage's acknowledgement barrier ([`AckBarrier`]): in
/// Periodic mode a write is answered once its journal buffer is in the OS, and the requests
/// leave that to this barrier (`RequestContext::ack_barrier`), so that a write ends in the
/// reader that ran it instead of waiting for the rest of the event-loop turn in a task of its
/// own. Every answer taken here was encoded after its write was applied, so the barrier,
/// which flushes everything applied before it, covers them all with one `write(2)` per store.
/// If the journal cannot be written, no answer of the batch is sent and the connection
/// closes: its client cannot be told which writes stand.
async fn write_loop(mut wr: ClientWriter, out: Rc<Outbox>, ack_barrier: AckBarrier) {
    let mut spare = BytesMut::with_capacity(READ_CHUNK);
    loop {
        if out.buf.borrow().is_empty() {
            if out.closed.get() {
                break;
            }
            out.ready.notified().await;
            continue;
        }
        std::mem::swap(&mut *out.buf.borrow_mut(), &mut spare);
        let result = match ack_barrier.flush() {
            Ok(()) => wr.write_all(&spare).await,
            Err(e) => {
                tracing::error!(error = %e, "journal write failed; closing the connection unanswered");
                Err(std::io::ErrorKind::Other.into())
            }
        };
        spare.clear();
        out.drained.notify_one();
        if result.is_err() {
            out.closed.set(true);
            out.buf.borrow_mut().clear();
            out.drained.notify_one();
            break;
        }
    }
    let _ = wr.shutdown().await;
}

#[cfg(test)]
mod tests {
    //! An in-process node (real engine on a temp-dir storage) driven with raw frames.

    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    /// An answer that finds the outbox empty leaves the writer a wake-up, also after the
    /// writer took what was there; answers pushed before it takes them are taken with them.
    #[test]
    fn an_answer_to_an_empty_outbox_wakes_the_writer() {
        use std::future::Future;
        use std::task::{Context, Waker};
        let out = super::Outbox::new();
        let woken = |out: &super::Outbox| {
            let mut n = std::pin::pin!(out.ready.notified());
            n.as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_ready()
        };
        assert!(!woken(&out), "nothing to write, no wake-up");
        out.push(|b| b.extend_from_slice(b"a"));
        out.push(|b| b.extend_from_slice(b"b"));
        assert!(woken(&out), "the first answer wakes the writer");
        let mut taken = bytes::BytesMut::new();
        out.take(&mut taken);
        assert_eq!(&taken[..], b"ab", "one wake-up, both answers");
        out.push(|b| b.extend_from_slice(b"c"));
        assert!(woken(&out), "after a take the next answer wakes it again");
    }

    /// A request that finishes in its first poll runs in the reader; one that waits comes
    /// back for a task, which finishes it; one that panics is contained.
    #[test]
    fn requests_run_in_the_reader_until_they_wait() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async {
            let done = std::rc::Rc::new(std::cell::Cell::new(0));
            let d = done.clone();
            let quick = Box::pin(async move { d.set(d.get() + 1) });
            assert!(super::run_until_it_waits(quick).await.is_none());
            assert_eq!(done.get(), 1, "ran in the reader");

            let notify = std::rc::Rc::new(tokio::sync::Notify::new());
            let (d, n) = (done.clone(), notify.clone());
            let waits = Box::pin(async move {
                n.notified().await;
                d.set(d.get() + 1);
            });
            let waiting = super::run_until_it_waits(waits)
                .await
                .expect("a waiting request comes back");
            let task = tokio::task::spawn_local(waiting);
            notify.notify_one();
            task.await.unwrap();
            assert_eq!(done.get(), 2, "its task finished it");

            let panics = Box::pin(async { panic!("request bug") });
            assert!(super::run_until_it_waits(panics).await.is_none());
        });
    }

    use crate::{Server, ServerConfig};

    #[test]
    fn a_grown_read_size_gets_its_room_even_when_a_header_still_fits() {
        let mut buf = bytes::BytesMut::with_capacity(super::READ_CHUNK);
        // What a full read leaves: the tail of a frame, far from a full buffer.
        buf.extend_from_slice(&[0u8; 100]);
        for size in [super::READ_CHUNK, 4 * super::READ_CHUNK, super::READ_AHEAD] {
            super::make_room(&mut buf, size);
            assert!(
                buf.capacity() - buf.len() >= size,
                "room for a {size}-byte read"
            );
        }
        assert_eq!(&buf[..], &[0u8; 100][..], "the buffered bytes are kept");
    }

    struct TestNode {
        server: Option<Server>,
        engine: std::sync::Arc<sluice_engine::Engine>,
        storage: sluice_storage::Storage,
        _dir: tempfile::TempDir,
    }

    impl TestNode {
        fn start(shards: usize) -> TestNode {
            let dir = tempfile::tempdir().unwrap();
            let storage = sluice_storage::Storage::open(sluice_storage::StorageConfig {
                path: dir.path().join("db"),
                durability: sluice_storage::Durability::Periodic {
                    interval: Duration::from_secs(1),
                },
                cache_bytes: 8 << 20,
                stores: 1,
            })
            .unwrap();
            let host = uuid::Uuid::new_v4();
            let info = sluice_engine::NodeInfo::single([127, 0, 0, 1].into(), 9042, host);
            let engine = sluice_engine::Engine::open(storage.clone(), info).unwrap();
            let config =
                ServerConfig::new("127.0.0.1:0".parse().unwrap(), shards, host.to_string());
            let server = Server::start(config, engine.clone(), storage.ack_barrier()).unwrap();
            TestNode {
                server: Some(server),
                engine,
                storage,
                _dir: dir,
            }
        }

        fn connect(&self) -> TcpStream {
            let addr = self.server.as_ref().unwrap().local_addr();
            let s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s
        }
    }

    impl Drop for TestNode {
        fn drop(&mut self) {
            if let Some(s) = self.server.take() {
                s.shutdown();
            }
            let _ = self.storage.close();
        }
    }

    fn frame(stream: i16, opcode: u8, body: &[u8]) -> Vec<u8> {
        let mut f = vec![4, 0];
        f.extend_from_slice(&stream.to_be_bytes());
        f.push(opcode);
        f.extend_from_slice(&(body.len() as u32).to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    fn string(s: &str) -> Vec<u8> {
        let mut b = (s.len() as u16).to_be_bytes().to_vec();
        b.extend_from_slice(s.as_bytes());
        b
    }

    fn startup(s: &mut TcpStream) {
        let mut body = vec![0, 1];
        body.extend(string("CQL_VERSION"));
        body.extend(string("3.0.0"));
        s.write_all(&frame(0, 0x01, &body)).unwrap();
        let (stream, opcode, _) = read_frame(s);
        assert_eq!((stream, opcode), (0, 0x02), "READY");
    }

    fn query(stream: i16, text: &str) -> Vec<u8> {
        let mut body = (text.len() as u32).to_be_bytes().to_vec();
        body.extend_from_slice(text.as_bytes());
        body.extend_from_slice(&[0, 1, 0]);
        frame(stream, 0x07, &body)
    }

    fn read_frame(s: &mut TcpStream) -> (i16, u8, Vec<u8>) {
        let mut h = [0u8; 9];
        s.read_exact(&mut h).unwrap();
        assert_eq!(h[0], 0x84);
        let mut body = vec![0u8; u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize];
        s.read_exact(&mut body).unwrap();
        (i16::from_be_bytes([h[2], h[3]]), h[4], body)
    }

    #[test]
    fn options_answers_supported_with_this_shard() {
        let node = TestNode::start(2);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..4 {
            let mut s = node.connect();
            s.write_all(&frame(3, 0x05, &[])).unwrap();
            let (stream, opcode, body) = read_frame(&mut s);
            assert_eq!((stream, opcode), (3, 0x06));
            let text = String::from_utf8_lossy(&body).to_string();
            assert!(text.contains("SCYLLA_NR_SHARDS"));
            // Round-robin over the shards: SCYLLA_SHARD is the connection's shard.
            let pos = text
                .find("SCYLLA_SHARD\0")
                .map(|p| p + "SCYLLA_SHARD".len());
            let shard = pos.and_then(|p| body.get(p + 4).copied());
            seen.insert(shard);
        }
        assert_eq!(seen.len(), 2, "connections land on both shards: {seen:?}");
    }

    #[test]
    fn pipelined_requests_are_all_answered_by_stream_id() {
        let node = TestNode::start(2);
        let mut s = node.connect();
        startup(&mut s);
        let mut batch = Vec::new();
        for stream in 1..=300i16 {
            let q = if stream % 3 == 0 {
                query(stream, "SELECT * FROM no_such_ks.t")
            } else {
                query(stream, "SELECT key, release_version FROM system.local")
            };
            batch.extend(q);
        }
        s.write_all(&batch).unwrap();
        let mut answered = std::collections::HashMap::new();
        for _ in 0..300 {
            let (stream, opcode, _) = read_frame(&mut s);
            assert!(
                answered.insert(stream, opcode).is_none(),
                "stream {stream} answered twice"
            );
        }
        for stream in 1..=300i16 {
            let expected = if stream % 3 == 0 { 0x00 } else { 0x08 };
            assert_eq!(answered.get(&stream), Some(&expected), "stream {stream}");
        }
    }

    #[test]
    fn registered_connections_receive_schema_events() {
        let node = TestNode::start(2);
        let mut listener = node.connect();
        startup(&mut listener);
        let mut body = 1u16.to_be_bytes().to_vec();
        body.extend(string("SCHEMA_CHANGE"));
        listener.write_all(&frame(1, 0x0B, &body)).unwrap();
        assert_eq!(read_frame(&mut listener).1, 0x02, "REGISTER -> READY");

        let mut other = node.connect();
        startup(&mut other);
        other
            .write_all(&query(
                5,
                "CREATE KEYSPACE ev WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
            ))
            .unwrap();
        let (stream, opcode, _) = read_frame(&mut other);
        assert_eq!((stream, opcode), (5, 0x08));
        let (stream, opcode, body) = read_frame(&mut listener);
        assert_eq!((stream, opcode), (-1, 0x0C), "EVENT on stream -1");
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("SCHEMA_CHANGE") && text.contains("CREATED") && text.contains("ev"));
    }

    fn register(s: &mut TcpStream, types: &[&str]) {
        let mut body = (types.len() as u16).to_be_bytes().to_vec();
        for t in types {
            body.extend(string(t));
        }
        s.write_all(&frame(1, 0x0B, &body)).unwrap();
        assert_eq!(read_frame(s).1, 0x02, "REGISTER -> READY");
    }

    /// The next EVENT on `s`: its type, change and (for node events) the address it names.
    fn next_event(s: &mut TcpStream) -> (String, String, Option<std::net::SocketAddr>) {
        let (stream, opcode, body) = read_frame(s);
        assert_eq!((stream, opcode), (-1, 0x0C), "EVENT on stream -1");
        let mut pos = 0;
        let mut string = || {
            let len = u16::from_be_bytes([body[pos], body[pos + 1]]) as usize;
            let text = String::from_utf8(body[pos + 2..pos + 2 + len].to_vec()).unwrap();
            pos += 2 + len;
            text
        };
        let (kind, change) = (string(), string());
        if kind == "SCHEMA_CHANGE" {
            return (kind, change, None);
        }
        assert_eq!(body[pos], 4, "an IPv4 [inet]");
        let ip: [u8; 4] = body[pos + 1..pos + 5].try_into().unwrap();
        let port = i32::from_be_bytes(body[pos + 5..pos + 9].try_into().unwrap());
        assert_eq!(pos + 9, body.len(), "nothing after the address");
        (kind, change, Some((ip, port as u16).into()))
    }

    /// A ring of the test node and the given peers (127.0.0.n, each Normal, token n * 100).
    fn ring_with(node: &TestNode, peers: &[u8]) -> std::sync::Arc<sluice_ring::TokenMetadata> {
        let mut nodes = vec![node.engine.node().ring_node()];
        for &n in peers {
            nodes.push(sluice_ring::Node {
                host_id: uuid::Uuid::from_u128(u128::from(n)),
                cql_address: ([127, 0, 0, n], 9042).into(),
                internode_address: ([127, 0, 0, n], 7000).into(),
                dc: "datacenter1".to_string(),
                rack: "rack1".to_string(),
                tokens: vec![sluice_ring::Token(i64::from(n) * 100)],
                state: sluice_ring::NodeState::Normal,
            });
        }
        std::sync::Arc::new(sluice_ring::TokenMetadata::new(nodes).unwrap())
    }

    /// A new node in the ring is one NEW_NODE with its native address; the same ring again
    /// sends nothing (the next event is the status change that follows); a connection that
    /// registered for schema changes only sees none of it.
    #[test]
    fn registered_connections_receive_topology_and_status_events_once() {
        let node = TestNode::start(2);
        let mut listener = node.connect();
        startup(&mut listener);
        register(&mut listener, &["TOPOLOGY_CHANGE"]);
        register(&mut listener, &["STATUS_CHANGE"]);
        let mut schema_only = node.connect();
        startup(&mut schema_only);
        register(&mut schema_only, &["SCHEMA_CHANGE"]);

        let peer: std::net::SocketAddr = ([127, 0, 0, 2], 9042).into();
        assert_eq!(node.engine.set_ring(ring_with(&node, &[2])), 1);
        assert_eq!(
            next_event(&mut listener),
            ("TOPOLOGY_CHANGE".into(), "NEW_NODE".into(), Some(peer))
        );
        assert_eq!(node.engine.set_ring(ring_with(&node, &[2])), 0);
        assert!(node.engine.set_node_up(uuid::Uuid::from_u128(2), false));
        assert_eq!(
            next_event(&mut listener),
            ("STATUS_CHANGE".into(), "DOWN".into(), Some(peer)),
            "no second NEW_NODE before it"
        );
        assert_eq!(node.engine.set_ring(ring_with(&node, &[])), 1);
        assert_eq!(
            next_event(&mut listener),
            ("TOPOLOGY_CHANGE".into(), "REMOVED_NODE".into(), Some(peer))
        );

        let mut other = node.connect();
        startup(&mut other);
        other
            .write_all(&query(
                5,
                "CREATE KEYSPACE topo WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
            ))
            .unwrap();
        assert_eq!(read_frame(&mut other).1, 0x08);
        let (kind, change, _) = next_event(&mut schema_only);
        assert_eq!(
            (kind.as_str(), change.as_str()),
            ("SCHEMA_CHANGE", "CREATED"),
            "no node event went to a schema-only connection"
        );
    }

    /// In periodic mode a write is answered only once its journal bytes are in the OS (they
    /// survive the process being killed): the writer's acknowledgement barrier writes the
    /// journal buffer before the answer's socket write. The sync thread's own writeback runs
    /// only every 100 ms, and each answer here is read and checked at once, so without the
    /// barrier most of the markers would still be in the process's buffer.
    #[test]
    fn a_periodic_write_is_in_the_journal_file_when_it_is_answered() {
        let node = TestNode::start(1);
        let mut s = node.connect();
        startup(&mut s);
        for (stream, ddl) in [
            "CREATE KEYSPACE ab WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
            "CREATE TABLE ab.t (k int PRIMARY KEY, v text)",
        ]
        .into_iter()
        .enumerate()
        {
            s.write_all(&query(stream as i16 + 1, ddl)).unwrap();
            assert_eq!(read_frame(&mut s).1, 0x08, "{ddl}");
        }
        let store = node._dir.path().join("db").join("store-0");
        let in_journal_files = |marker: &[u8]| {
            std::fs::read_dir(&store).unwrap().any(|e| {
                let path = e.unwrap().path();
                path.extension().is_some_and(|x| x == "jnl")
                    && std::fs::read(&path)
                        .unwrap()
                        .windows(marker.len())
                        .any(|w| w == marker)
            })
        };
        for i in 0..5i16 {
            let marker = format!("acknowledged-{i}-{}", uuid::Uuid::new_v4().simple());
            let insert = format!("INSERT INTO ab.t (k, v) VALUES ({i}, '{marker}')");
            s.write_all(&query(10 + i, &insert)).unwrap();
            let (stream, opcode, _) = read_frame(&mut s);
            assert_eq!((stream, opcode), (10 + i, 0x08), "INSERT answered");
            assert!(
                in_journal_files(marker.as_bytes()),
                "write {i} answered before its journal bytes were in the OS"
            );
        }
    }

    #[test]
    fn a_bad_frame_closes_only_its_connection() {
        let node = TestNode::start(1);
        let mut good = node.connect();
        startup(&mut good);
        let mut bad = node.connect();
        let mut f = frame(9, 0x07, &[]);
        f[5..9].copy_from_slice(&u32::MAX.to_be_bytes());
        bad.write_all(&f).unwrap();
        let (stream, opcode, body) = read_frame(&mut bad);
        assert_eq!((stream, opcode), (9, 0x00));
        assert_eq!(&body[..4], &[0, 0, 0, 0x0A]);
        let mut rest = Vec::new();
        assert_eq!(bad.read_to_end(&mut rest).unwrap_or(0), 0);
        good.write_all(&query(2, "SELECT key FROM system.local"))
            .unwrap();
        assert_eq!(read_frame(&mut good).1, 0x08);
    }
}
