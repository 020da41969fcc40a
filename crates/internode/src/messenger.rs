//! The messenger: connections per (peer, class), bounded fail-fast queues, calls with a
//! deadline, and per-class inbound handler queues.
//!
//! Each node writes only on connections it opened and reads only on connections it accepted;
//! a reply travels on the replying node's own connection of the reply class
//! ([`ConnectionClass::reply_class`]) to the internode address the requester gave in its
//! handshake.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::budget::ByteBudget;
use crate::class::{ConnectionClass, CLASS_COUNT};
use crate::frame::{encode_frame, FrameDecoder, FrameHeader, Kind, Status, HEADER_LEN};
use crate::handshake::{
    decode_answer, encode_answer, Answer, Hello, ANSWER_LEN, HELLO_FIXED_LEN, MAX_CLUSTER_NAME,
};
use crate::metrics::{add, bump, Metrics, MetricsSnapshot};

/// Verb of the failure detector's ping, answered by the connection reader itself.
pub const VERB_PING: u16 = 0;
/// Verbs below this one are reserved for the messenger.
pub const FIRST_APPLICATION_VERB: u16 = 16;

/// Bytes gathered from the queue before one socket write.
const WRITE_BATCH_BYTES: usize = 64 * 1024;
/// Read buffer reserved when it has no room left.
const READ_CHUNK: usize = 64 * 1024;
/// How long a status reply (Overloaded, Expired, ...) may still be written after its request's
/// deadline: the requester's deadline is a little later than ours by the transit time.
const STATUS_REPLY_GRACE: Duration = Duration::from_millis(50);

/// Why a send or call failed. Small and `Copy`, so that failing allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallError {
    /// The outbound queue of that (peer, class) is full.
    QueueFull,
    /// The connection to the peer could not be opened or is backing off after a failure.
    PeerDown,
    /// The deadline had passed before the message was written, or the peer found it expired.
    Expired,
    /// No reply arrived by the deadline.
    Timeout,
    /// The peer's handler queue for this class was full: the request was not run.
    Overloaded,
    /// The peer has no handler for this verb.
    UnknownVerb,
    /// The peer's handler failed or dropped the request without replying.
    Failed,
    /// This messenger already has the maximum number of calls in flight to that peer.
    TooManyInFlight,
    /// The body is longer than the maximum frame body.
    TooLarge,
    /// The verb is reserved for the messenger.
    ReservedVerb,
    /// Requests cannot be sent on the Responses class.
    WrongClass,
    /// The messenger is shutting down.
    ShuttingDown,
}

impl CallError {
    /// A static description.
    pub const fn message(self) -> &'static str {
        match self {
            CallError::QueueFull => "outbound queue full",
            CallError::PeerDown => "peer down",
            CallError::Expired => "deadline passed before the message was run",
            CallError::Timeout => "no reply by the deadline",
            CallError::Overloaded => "peer overloaded",
            CallError::UnknownVerb => "peer does not know the verb",
            CallError::Failed => "peer handler failed",
            CallError::TooManyInFlight => "too many calls in flight to the peer",
            CallError::TooLarge => "body exceeds the maximum frame size",
            CallError::ReservedVerb => "verb is reserved for the messenger",
            CallError::WrongClass => "requests cannot use the Responses class",
            CallError::ShuttingDown => "messenger shutting down",
        }
    }

    fn from_status(status: Status) -> Option<CallError> {
        match status {
            Status::Ok => None,
            Status::Overloaded => Some(CallError::Overloaded),
            Status::Expired => Some(CallError::Expired),
            Status::UnknownVerb => Some(CallError::UnknownVerb),
            Status::Failed => Some(CallError::Failed),
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

/// Everything a messenger is configured with.
#[derive(Debug, Clone)]
pub struct MessengerConfig {
    /// Peers with another cluster name are refused at the handshake.
    pub cluster_name: String,
    /// This node's host id.
    pub host_id: u128,
    /// Internode listen address; outbound connections are bound to its IP.
    pub listen: SocketAddr,
    /// Largest frame body accepted or sent.
    pub max_frame_body: u32,
    /// Bytes each (peer, class) outbound queue may hold, per class.
    pub outbound_queue_bytes: [usize; CLASS_COUNT],
    /// Bytes each class's inbound handler queue may hold.
    pub inbound_queue_bytes: [usize; CLASS_COUNT],
    /// Most bytes per second written to one peer on each class; 0 for no limit. Background
    /// classes (Bulk) get a budget here so that they cannot take the CPU from foreground work.
    pub outbound_bytes_per_second: [u64; CLASS_COUNT],
    /// Messages each class's inbound handler queue may hold.
    pub inbound_queue_len: [usize; CLASS_COUNT],
    /// Inbound connections open at once; more are closed on accept. Each peer opens at most
    /// one per class.
    pub max_inbound_connections: usize,
    /// Calls in flight to one peer, across classes.
    pub max_calls_in_flight_per_peer: usize,
    /// Bound on opening a connection, handshake included, and on an inbound handshake.
    pub connect_timeout: Duration,
    /// First wait after a failed connection attempt; doubles on each failure.
    pub backoff_min: Duration,
    /// Longest wait between connection attempts.
    pub backoff_max: Duration,
}

impl MessengerConfig {
    /// The defaults for a node of `cluster_name` with `host_id` listening on `listen`.
    pub fn new(cluster_name: &str, host_id: u128, listen: SocketAddr) -> MessengerConfig {
        const MIB: usize = 1024 * 1024;
        MessengerConfig {
            cluster_name: cluster_name.to_owned(),
            host_id,
            listen,
            max_frame_body: crate::frame::DEFAULT_MAX_BODY,
            outbound_queue_bytes: [MIB, 4 * MIB, 4 * MIB, 16 * MIB + HEADER_LEN],
            inbound_queue_bytes: [4 * MIB, 32 * MIB, 32 * MIB, 32 * MIB],
            inbound_queue_len: [1024, 4096, 4096, 256],
            outbound_bytes_per_second: [0; CLASS_COUNT],
            max_inbound_connections: 1024,
            max_calls_in_flight_per_peer: 8192,
            connect_timeout: Duration::from_millis(1000),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(1000),
        }
    }
}

/// One message waiting in an outbound queue.
struct Outgoing {
    kind: Kind,
    verb: u16,
    status: Status,
    id: u64,
    deadline: Instant,
    body: Bytes,
}

impl Outgoing {
    fn size(&self) -> usize {
        HEADER_LEN + self.body.len()
    }
}

const STATE_CONNECTING: u8 = 0;
const STATE_CONNECTED: u8 = 1;
const STATE_BACKOFF: u8 = 2;

/// The outbound side of one (peer, class): a queue bounded in bytes and its writer task,
/// which ends once this handle is dropped.
struct Outbound {
    tx: mpsc::UnboundedSender<Outgoing>,
    queue: Arc<QueueState>,
}

/// What the senders and the writer of one outbound queue share.
struct QueueState {
    bytes: ByteBudget,
    state: AtomicU8,
}

/// A request waiting for its reply.
struct PendingCall {
    peer: SocketAddr,
    reply: oneshot::Sender<Result<Bytes, CallError>>,
}

#[derive(Default)]
struct CallTable {
    calls: HashMap<u64, PendingCall>,
    per_peer: HashMap<SocketAddr, usize>,
}

impl CallTable {
    fn remove(&mut self, id: u64, from: Option<SocketAddr>) -> Option<PendingCall> {
        let call = self.calls.get(&id)?;
        if from.is_some_and(|from| from != call.peer) {
            return None;
        }
        let call = self.calls.remove(&id)?;
        let count = self.per_peer.get_mut(&call.peer);
        debug_assert!(count.as_ref().is_some_and(|c| **c > 0));
        if let Some(count) = count {
            *count -= 1;
            if *count == 0 {
                self.per_peer.remove(&call.peer);
            }
        }
        Some(call)
    }
}

pub(crate) struct Shared {
    config: MessengerConfig,
    local_addr: SocketAddr,
    decoder: FrameDecoder,
    metrics: Metrics,
    outbound: Mutex<HashMap<(SocketAddr, ConnectionClass), Arc<Outbound>>>,
    calls: Mutex<CallTable>,
    next_id: AtomicU64,
    inbound_tx: [mpsc::Sender<InboundMessage>; CLASS_COUNT],
    inbound_bytes: [ByteBudget; CLASS_COUNT],
    inbound_rx: Mutex<[Option<mpsc::Receiver<InboundMessage>>; CLASS_COUNT]>,
    inbound_connections: Arc<Semaphore>,
    /// The runtime `bind` ran on: every task of this messenger runs there, whichever thread
    /// sends.
    runtime: tokio::runtime::Handle,
    shutdown_tx: watch::Sender<bool>,
    shutdown_rx: watch::Receiver<bool>,
    /// What this node sends and answers pings with (see [`Messenger::set_heartbeat`]).
    heartbeat: Mutex<Bytes>,
    /// The latest heartbeat each peer sent or answered, by its internode address.
    peer_heartbeats: Mutex<HashMap<SocketAddr, Bytes>>,
}

/// Most peers whose heartbeats are kept (more are not recorded).
const MAX_PEER_HEARTBEATS: usize = 1024;

/// Most bytes of a heartbeat: pings stay small and answered ahead of every queue.
pub const MAX_HEARTBEAT_BYTES: usize = 64;

/// A node's endpoint for internode messaging. Dropping it stops every task it started.
pub struct Messenger {
    shared: Arc<Shared>,
    listener_task: Mutex<Option<JoinHandle<()>>>,
}

impl Messenger {
    /// Binds the internode listener and starts accepting on the current tokio runtime, where
    /// all of the messenger's tasks run. The listen address must be a specific IP: it is the
    /// address peers reply to.
    pub async fn bind(config: MessengerConfig) -> io::Result<Messenger> {
        if config.listen.ip().is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the internode listen address must be a specific IP, not 0.0.0.0 or ::",
            ));
        }
        if config.cluster_name.is_empty() || config.cluster_name.len() > MAX_CLUSTER_NAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cluster name must be 1 to 128 bytes",
            ));
        }
        let listener = TcpListener::bind(config.listen).await?;
        let local_addr = listener.local_addr()?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let config_inbound = config.max_inbound_connections;
        let mut senders = Vec::with_capacity(CLASS_COUNT);
        let mut receivers = Vec::with_capacity(CLASS_COUNT);
        for len in config.inbound_queue_len {
            let (tx, rx) = mpsc::channel(len.max(1));
            senders.push(tx);
            receivers.push(Some(rx));
        }
        let shared = Arc::new(Shared {
            decoder: FrameDecoder::new(config.max_frame_body),
            inbound_bytes: config.inbound_queue_bytes.map(ByteBudget::new),
            inbound_tx: senders.try_into().unwrap_or_else(|_| unreachable!()),
            inbound_rx: Mutex::new(receivers.try_into().unwrap_or_else(|_| unreachable!())),
            config,
            local_addr,
            metrics: Metrics::default(),
            outbound: Mutex::new(HashMap::new()),
            calls: Mutex::new(CallTable::default()),
            next_id: AtomicU64::new(1),
            inbound_connections: Arc::new(Semaphore::new(config_inbound)),
            runtime: tokio::runtime::Handle::current(),
            shutdown_tx,
            shutdown_rx,
            heartbeat: Mutex::new(Bytes::new()),
            peer_heartbeats: Mutex::new(HashMap::new()),
        });
        let task = shared.runtime.spawn(accept_loop(shared.clone(), listener));
        Ok(Messenger {
            shared,
            listener_task: Mutex::new(Some(task)),
        })
    }

    /// The address the listener is bound to (the configured one, with its port resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// This node's host id.
    pub fn host_id(&self) -> u128 {
        self.shared.config.host_id
    }

    /// Sends a request and waits for its reply until `deadline`, never longer. The time left
    /// travels with the request; the peer does not run it once that time is gone.
    pub async fn call(
        &self,
        peer: SocketAddr,
        class: ConnectionClass,
        verb: u16,
        body: Bytes,
        deadline: Instant,
    ) -> Result<Bytes, CallError> {
        if verb < FIRST_APPLICATION_VERB {
            return Err(CallError::ReservedVerb);
        }
        self.shared.call(peer, class, verb, body, deadline).await
    }

    /// Sends a message that expects no reply; it is dropped unrun once `deadline` passes.
    pub fn send_oneway(
        &self,
        peer: SocketAddr,
        class: ConnectionClass,
        verb: u16,
        body: Bytes,
        deadline: Instant,
    ) -> Result<(), CallError> {
        if verb < FIRST_APPLICATION_VERB {
            return Err(CallError::ReservedVerb);
        }
        if class == ConnectionClass::Responses {
            return Err(CallError::WrongClass);
        }
        if body.len() > self.shared.config.max_frame_body as usize {
            return Err(CallError::TooLarge);
        }
        if Instant::now() >= deadline {
            return Err(CallError::Expired);
        }
        self.shared.enqueue(
            peer,
            class,
            Outgoing {
                kind: Kind::OneWay,
                verb,
                status: Status::Ok,
                id: 0,
                deadline,
                body,
            },
        )
    }

    /// Pings `peer` on the Control class and returns the round-trip time.
    pub async fn ping(&self, peer: SocketAddr, deadline: Instant) -> Result<Duration, CallError> {
        self.shared.ping(peer, deadline).await.map(|(rtt, _)| rtt)
    }

    /// Sets the bytes this node sends with every ping and answers every ping with (a small
    /// piece of state its peers keep, such as a schema version); at most
    /// [`MAX_HEARTBEAT_BYTES`].
    pub fn set_heartbeat(&self, heartbeat: Bytes) {
        debug_assert!(
            heartbeat.len() <= MAX_HEARTBEAT_BYTES,
            "heartbeat too large"
        );
        if heartbeat.len() <= MAX_HEARTBEAT_BYTES {
            *lock(&self.shared.heartbeat) = heartbeat;
        }
    }

    /// The latest heartbeat `peer` sent with a ping or answered one with, if any.
    pub fn peer_heartbeat(&self, peer: SocketAddr) -> Option<Bytes> {
        self.shared.peer_heartbeat(peer)
    }

    /// The inbound queue of `class`, once: its owner runs the requests that arrive.
    /// Until it is taken, requests wait in the bounded queue and then get `Overloaded`.
    /// The Responses class carries only replies, so its queue stays empty.
    pub fn take_inbound(&self, class: ConnectionClass) -> Option<InboundQueue> {
        let rx = lock(&self.shared.inbound_rx)[class.index()].take()?;
        Some(InboundQueue {
            class,
            rx,
            shared: self.shared.clone(),
            shutdown: self.shared.shutdown_rx.clone(),
        })
    }

    /// Closes the connections to `peer` (a node that left the cluster) and fails what they
    /// still had queued; a later send opens them again.
    pub fn forget_peer(&self, peer: SocketAddr) {
        lock(&self.shared.outbound).retain(|&(addr, _), _| addr != peer);
    }

    /// A copy of every counter.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// Stops every task, fails the calls in flight and waits until the listening socket is
    /// closed.
    pub async fn shutdown(&self) {
        self.shared.shutdown_tx.send_replace(true);
        self.shared.fail_all_calls();
        let task = lock(&self.listener_task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

impl Drop for Messenger {
    fn drop(&mut self) {
        self.shared.shutdown_tx.send_replace(true);
        self.shared.fail_all_calls();
        // Queued messages hold the shared state: free the queues nobody took.
        let untaken = std::mem::take(&mut *lock(&self.shared.inbound_rx));
        drop(untaken);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves its map consistent: recover it.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Removes a pending call if its future is dropped before the reply (timeout, cancellation).
struct CallGuard<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        lock(&self.shared.calls).remove(self.id, None);
    }
}

impl Shared {
    pub(crate) fn is_shut_down(&self) -> bool {
        *self.shutdown_rx.borrow()
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    pub(crate) fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown_rx.clone()
    }

    /// Pings `peer` with this node's heartbeat: the round-trip time and the peer's heartbeat
    /// (also recorded).
    pub(crate) async fn ping(
        self: &Arc<Shared>,
        peer: SocketAddr,
        deadline: Instant,
    ) -> Result<(Duration, Bytes), CallError> {
        let start = Instant::now();
        let mine = lock(&self.heartbeat).clone();
        let heartbeat = self
            .call(peer, ConnectionClass::Control, VERB_PING, mine, deadline)
            .await?;
        self.record_heartbeat(peer, &heartbeat);
        Ok((start.elapsed(), heartbeat))
    }

    /// Keeps a peer's heartbeat (a ping's body or its answer), within the bounds.
    fn record_heartbeat(&self, peer: SocketAddr, heartbeat: &Bytes) {
        if heartbeat.is_empty() || heartbeat.len() > MAX_HEARTBEAT_BYTES {
            return;
        }
        let mut beats = lock(&self.peer_heartbeats);
        if beats.len() < MAX_PEER_HEARTBEATS || beats.contains_key(&peer) {
            beats.insert(peer, heartbeat.clone());
        }
    }

    pub(crate) fn peer_heartbeat(&self, peer: SocketAddr) -> Option<Bytes> {
        lock(&self.peer_heartbeats).get(&peer).cloned()
    }

    async fn call(
        self: &Arc<Shared>,
        peer: SocketAddr,
        class: ConnectionClass,
        verb: u16,
        body: Bytes,
        deadline: Instant,
    ) -> Result<Bytes, CallError> {
        if class == ConnectionClass::Responses {
            return Err(CallError::WrongClass);
        }
        if body.len() > self.config.max_frame_body as usize {
            return Err(CallError::TooLarge);
        }
        if self.is_shut_down() {
            return Err(CallError::ShuttingDown);
        }
        if Instant::now() >= deadline {
            return Err(CallError::Expired);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply_tx, reply_rx) = oneshot::channel();
        {
            let mut table = lock(&self.calls);
            let in_flight = table.per_peer.entry(peer).or_insert(0);
            if *in_flight >= self.config.max_calls_in_flight_per_peer {
                return Err(CallError::TooManyInFlight);
            }
            *in_flight += 1;
            table.calls.insert(
                id,
                PendingCall {
                    peer,
                    reply: reply_tx,
                },
            );
        }
        let _guard = CallGuard { shared: self, id };
        self.enqueue(
            peer,
            class,
            Outgoing {
                kind: Kind::Request,
                verb,
                status: Status::Ok,
                id,
                deadline,
                body,
            },
        )?;
        match tokio::time::timeout_at(deadline.into(), reply_rx).await {
            Ok(Ok(result)) => result,
            // The sender is dropped only with the table, at shutdown.
            Ok(Err(_)) => Err(CallError::ShuttingDown),
            Err(_) => Err(CallError::Timeout),
        }
    }

    fn fail_all_calls(&self) {
        let calls = {
            let mut table = lock(&self.calls);
            table.per_peer.clear();
            std::mem::take(&mut table.calls)
        };
        for (_, call) in calls {
            let _ = call.reply.send(Err(CallError::ShuttingDown));
        }
    }

    fn complete_call(&self, id: u64, from: Option<SocketAddr>, result: Result<Bytes, CallError>) {
        let call = lock(&self.calls).remove(id, from);
        if let Some(call) = call {
            let _ = call.reply.send(result);
        }
    }

    /// Puts a message on the (peer, class) queue, opening the queue and its writer on first use.
    fn enqueue(
        self: &Arc<Shared>,
        peer: SocketAddr,
        class: ConnectionClass,
        message: Outgoing,
    ) -> Result<(), CallError> {
        let outbound = self.outbound(peer, class)?;
        if outbound.queue.state.load(Ordering::Acquire) == STATE_BACKOFF {
            return Err(CallError::PeerDown);
        }
        let size = message.size();
        if !outbound.queue.bytes.try_acquire(size) {
            bump(&self.metrics.class(class).queue_full);
            return Err(CallError::QueueFull);
        }
        if outbound.tx.send(message).is_err() {
            outbound.queue.bytes.release(size);
            return Err(CallError::ShuttingDown);
        }
        Ok(())
    }

    fn outbound(
        self: &Arc<Shared>,
        peer: SocketAddr,
        class: ConnectionClass,
    ) -> Result<Arc<Outbound>, CallError> {
        let mut map = lock(&self.outbound);
        if let Some(outbound) = map.get(&(peer, class)) {
            return Ok(outbound.clone());
        }
        if self.is_shut_down() {
            return Err(CallError::ShuttingDown);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let queue = Arc::new(QueueState {
            bytes: ByteBudget::new(self.config.outbound_queue_bytes[class.index()]),
            state: AtomicU8::new(STATE_CONNECTING),
        });
        let outbound = Arc::new(Outbound {
            tx,
            queue: queue.clone(),
        });
        map.insert((peer, class), outbound.clone());
        drop(map);
        self.runtime
            .spawn(writer_task(self.clone(), peer, class, queue, rx));
        Ok(outbound)
    }

    /// Sends a reply to `to` on the reply class of `class`.
    #[allow(clippy::too_many_arguments)]
    fn send_reply(
        self: &Arc<Shared>,
        to: SocketAddr,
        class: ConnectionClass,
        id: u64,
        verb: u16,
        status: Status,
        body: Bytes,
        deadline: Instant,
    ) {
        let deadline = if status == Status::Ok {
            deadline
        } else {
            deadline.max(Instant::now() + STATUS_REPLY_GRACE)
        };
        let reply = Outgoing {
            kind: Kind::Response,
            verb,
            status,
            id,
            deadline,
            body,
        };
        if let Err(error) = self.enqueue(to, class.reply_class(), reply) {
            debug!(peer = %to, class = class.name(), %error, "reply not sent");
        }
    }
}

/// Why a connection ended.
enum Ended {
    /// The messenger is shutting down.
    Shutdown,
    /// The connection broke; the next message opens a new one.
    Broken,
}

/// Owns the outbound queue of one (peer, class): opens the connection when a message is
/// waiting, writes batches, and backs off after a failed attempt, failing what is queued.
async fn writer_task(
    shared: Arc<Shared>,
    peer: SocketAddr,
    class: ConnectionClass,
    queue: Arc<QueueState>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) {
    let mut shutdown = shared.shutdown_signal();
    let mut backoff = shared.config.backoff_min;
    loop {
        let first = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => break,
            message = rx.recv() => match message {
                Some(message) => message,
                None => break,
            },
        };
        queue.state.store(STATE_CONNECTING, Ordering::Release);
        let connected = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => break,
            result = tokio::time::timeout(shared.config.connect_timeout, connect(&shared, peer, class)) => {
                result.unwrap_or(Err(ConnectError::TimedOut))
            }
        };
        match connected {
            Ok(stream) => {
                debug!(%peer, class = class.name(), "internode connection open");
                queue.state.store(STATE_CONNECTED, Ordering::Release);
                backoff = shared.config.backoff_min;
                match write_loop(&shared, class, &queue, &mut rx, stream, first).await {
                    Ended::Shutdown => break,
                    Ended::Broken => {
                        debug!(%peer, class = class.name(), "internode connection lost");
                        queue.state.store(STATE_CONNECTING, Ordering::Release);
                    }
                }
            }
            Err(reason) => {
                debug!(%peer, class = class.name(), reason = reason.message(), "internode connect failed");
                queue.state.store(STATE_BACKOFF, Ordering::Release);
                fail_message(&shared, &queue, first, CallError::PeerDown);
                while let Ok(message) = rx.try_recv() {
                    fail_message(&shared, &queue, message, CallError::PeerDown);
                }
                tokio::select! {
                    biased;
                    _ = shutdown.wait_for(|stop| *stop) => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(shared.config.backoff_max);
                queue.state.store(STATE_CONNECTING, Ordering::Release);
            }
        }
    }
    rx.close();
    let error = if shared.is_shut_down() {
        CallError::ShuttingDown
    } else {
        CallError::PeerDown
    };
    while let Ok(message) = rx.try_recv() {
        fail_message(&shared, &queue, message, error);
    }
}

/// Releases a message's queue space and fails its call, if it is a request.
fn fail_message(shared: &Shared, queue: &QueueState, message: Outgoing, error: CallError) {
    queue.bytes.release(message.size());
    if message.kind == Kind::Request {
        shared.complete_call(message.id, None, Err(error));
    }
}

async fn write_loop(
    shared: &Shared,
    class: ConnectionClass,
    queue: &QueueState,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    stream: TcpStream,
    first: Outgoing,
) -> Ended {
    let counters = shared.metrics.class(class);
    let mut shutdown = shared.shutdown_signal();
    let (mut read_half, mut write_half) = stream.into_split();
    // The accepting side never writes after its answer: any byte or end of stream means the
    // connection is gone, which a writer would otherwise learn only from a later write.
    let mut probe = [0u8; 64];
    let mut batch = BytesMut::with_capacity(WRITE_BATCH_BYTES);
    let mut batch_requests: Vec<u64> = Vec::new();
    let rate = shared.config.outbound_bytes_per_second[class.index()];
    let mut pacer = (rate > 0).then(|| Pacer::new(rate, Instant::now()));
    let mut next = Some(first);
    loop {
        let message = match next.take() {
            Some(message) => message,
            None => tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => return Ended::Shutdown,
                message = rx.recv() => match message {
                    Some(message) => message,
                    None => return Ended::Shutdown,
                },
                _ = read_half.read(&mut probe) => return Ended::Broken,
            },
        };
        let mut message = Some(message);
        let now = Instant::now();
        while let Some(m) = message.take() {
            let size = m.size();
            if m.deadline <= now {
                bump(&counters.expired_outbound);
                fail_message(shared, queue, m, CallError::Expired);
            } else {
                let budget = (m.deadline - now).as_micros().min(u32::MAX as u128) as u32;
                let header = FrameHeader {
                    kind: m.kind,
                    verb: m.verb,
                    status: m.status,
                    id: m.id,
                    budget_micros: budget.max(1),
                    length: m.body.len() as u32,
                };
                encode_frame(header, &m.body, &mut batch);
                if m.kind == Kind::Request {
                    batch_requests.push(m.id);
                }
                queue.bytes.release(size);
                bump(&counters.frames_out);
                add(&counters.bytes_out, size);
            }
            if batch.len() < WRITE_BATCH_BYTES {
                message = rx.try_recv().ok();
            }
        }
        if batch.is_empty() {
            continue;
        }
        let written = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => return Ended::Shutdown,
            result = write_half.write_all(&batch) => result,
            _ = read_half.read(&mut probe) => Err(io::ErrorKind::ConnectionReset.into()),
        };
        if written.is_err() {
            for id in batch_requests.drain(..) {
                shared.complete_call(id, None, Err(CallError::PeerDown));
            }
            return Ended::Broken;
        }
        if let Some(pause) = pacer
            .as_mut()
            .and_then(|p| p.after_write(batch.len(), Instant::now()))
        {
            // Over the class's byte rate: stop writing, so that the queue fills and senders
            // are refused at once instead of this class taking the CPU and the link.
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => return Ended::Shutdown,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        batch.clear();
        batch_requests.clear();
        if batch.capacity() > 4 * WRITE_BATCH_BYTES {
            // One large body grew the buffer: do not keep the memory for small frames.
            batch = BytesMut::with_capacity(WRITE_BATCH_BYTES);
        }
    }
}

/// Most a paced connection may catch up after writing late.
const PACER_CREDIT: Duration = Duration::from_millis(20);

/// Holds a connection's writes to a byte rate: each write moves the time the next may start.
#[derive(Debug)]
struct Pacer {
    bytes_per_second: u64,
    next_write: Instant,
}

impl Pacer {
    fn new(bytes_per_second: u64, now: Instant) -> Pacer {
        debug_assert!(bytes_per_second > 0);
        Pacer {
            bytes_per_second,
            next_write: now,
        }
    }

    /// Accounts for `bytes` just written and returns how long to wait before the next write.
    fn after_write(&mut self, bytes: usize, now: Instant) -> Option<Duration> {
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_second as f64);
        // A late wake-up may be caught up, but idle time earns at most PACER_CREDIT, so a quiet
        // connection cannot burst.
        let floor = now.checked_sub(PACER_CREDIT).unwrap_or(now);
        self.next_write = self.next_write.max(floor) + cost;
        let wait = self.next_write.saturating_duration_since(now);
        (!wait.is_zero()).then_some(wait)
    }
}

/// Why an outbound connection could not be opened.
#[derive(Debug, Clone, Copy)]
enum ConnectError {
    Io,
    TimedOut,
    BadAnswer,
    Refused(Answer),
}

impl ConnectError {
    fn message(self) -> &'static str {
        match self {
            ConnectError::Io => "connection failed",
            ConnectError::TimedOut => "connect or handshake timed out",
            ConnectError::BadAnswer => "malformed handshake answer",
            ConnectError::Refused(answer) => answer.message(),
        }
    }
}

async fn connect(
    shared: &Shared,
    peer: SocketAddr,
    class: ConnectionClass,
) -> Result<TcpStream, ConnectError> {
    let socket = if peer.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|_| ConnectError::Io)?;
    let local_ip = shared.local_addr.ip();
    // Bind to our own internode IP so that peers see the address nodes are known by.
    if !local_ip.is_unspecified() && local_ip.is_ipv4() == peer.is_ipv4() {
        socket
            .bind(SocketAddr::new(local_ip, 0))
            .map_err(|_| ConnectError::Io)?;
    }
    let mut stream = socket.connect(peer).await.map_err(|_| ConnectError::Io)?;
    let _ = stream.set_nodelay(true);
    let hello = Hello {
        class,
        host_id: shared.config.host_id,
        internode_addr: shared.local_addr,
        cluster_name: shared.config.cluster_name.clone(),
    };
    let mut buf = BytesMut::with_capacity(HELLO_FIXED_LEN + MAX_CLUSTER_NAME);
    hello.encode(&mut buf);
    stream.write_all(&buf).await.map_err(|_| ConnectError::Io)?;
    let mut answer = [0u8; ANSWER_LEN];
    stream
        .read_exact(&mut answer)
        .await
        .map_err(|_| ConnectError::Io)?;
    match decode_answer(&answer) {
        Ok((Answer::Accepted, _)) => Ok(stream),
        Ok((refused, _)) => {
            warn!(%peer, class = class.name(), reason = refused.message(), "peer refused internode connection");
            Err(ConnectError::Refused(refused))
        }
        Err(_) => Err(ConnectError::BadAnswer),
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let mut shutdown = shared.shutdown_signal();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, remote)) => {
                let Ok(permit) = shared.inbound_connections.clone().try_acquire_owned() else {
                    bump(&shared.metrics.handshake_failures);
                    warn!(%remote, "too many inbound internode connections; closing");
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                // The accept loop runs on the messenger's runtime: so does this task.
                tokio::spawn(async move {
                    inbound_connection(shared, stream, remote).await;
                    drop(permit);
                });
            }
            Err(error) => {
                // Out of descriptors and the like: pause rather than spin.
                warn!(%error, "internode accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Reads the hello and, when it is acceptable, the frames of one inbound connection.
async fn inbound_connection(shared: Arc<Shared>, mut stream: TcpStream, remote: SocketAddr) {
    let mut shutdown = shared.shutdown_signal();
    let hello = tokio::select! {
        biased;
        _ = shutdown.wait_for(|stop| *stop) => return,
        hello = tokio::time::timeout(shared.config.connect_timeout, read_hello(&mut stream)) => hello,
    };
    let hello = match hello {
        Ok(Ok(hello)) => hello,
        Ok(Err(reason)) => {
            bump(&shared.metrics.handshake_failures);
            warn!(%remote, reason, "internode handshake failed; closing");
            return;
        }
        Err(_) => {
            bump(&shared.metrics.handshake_failures);
            debug!(%remote, "internode handshake timed out; closing");
            return;
        }
    };
    let answer = if hello.cluster_name != shared.config.cluster_name {
        warn!(
            %remote,
            ours = %shared.config.cluster_name,
            theirs = %hello.cluster_name,
            "internode connection from another cluster; closing"
        );
        Answer::ClusterMismatch
    } else if hello.host_id == shared.config.host_id {
        warn!(%remote, "internode connection with this node's own host id; closing");
        Answer::SameHostId
    } else {
        Answer::Accepted
    };
    let reply = encode_answer(answer, shared.config.host_id);
    if stream.write_all(&reply).await.is_err() || answer != Answer::Accepted {
        if answer != Answer::Accepted {
            bump(&shared.metrics.handshake_failures);
        }
        return;
    }
    let class = hello.class;
    let counters = shared.metrics.class(class);
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        loop {
            match shared.decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    bump(&counters.frames_in);
                    add(&counters.bytes_in, HEADER_LEN + frame.body.len());
                    if let Err(reason) = on_frame(&shared, &hello, frame.header, frame.body) {
                        bump(&counters.malformed_closes);
                        warn!(%remote, class = class.name(), reason, "malformed internode frame; closing the connection");
                        return;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    bump(&counters.malformed_closes);
                    warn!(%remote, class = class.name(), reason = error.message(), "malformed internode frame; closing the connection");
                    return;
                }
            }
        }
        if buf.capacity() == buf.len() {
            buf.reserve(READ_CHUNK);
        }
        let read = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => return,
            read = stream.read_buf(&mut buf) => read,
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

async fn read_hello(stream: &mut TcpStream) -> Result<Hello, &'static str> {
    let mut fixed = [0u8; HELLO_FIXED_LEN];
    stream
        .read_exact(&mut fixed)
        .await
        .map_err(|_| "connection closed during the handshake")?;
    let name_len = Hello::parse_fixed(&fixed).map_err(|e| e.message())?;
    let mut name = [0u8; MAX_CLUSTER_NAME];
    stream
        .read_exact(&mut name[..name_len])
        .await
        .map_err(|_| "connection closed during the handshake")?;
    Hello::decode(&fixed, &name[..name_len]).map_err(|e| e.message())
}

/// Dispatches one inbound frame. An error is a protocol violation that closes the connection.
fn on_frame(
    shared: &Arc<Shared>,
    hello: &Hello,
    header: FrameHeader,
    body: Bytes,
) -> Result<(), &'static str> {
    let class = hello.class;
    let from = hello.internode_addr;
    let counters = shared.metrics.class(class);
    if header.kind == Kind::Response {
        if class == ConnectionClass::Requests {
            return Err("response on a Requests connection");
        }
        let result = match CallError::from_status(header.status) {
            None => Ok(body),
            Some(error) => Err(error),
        };
        shared.complete_call(header.id, Some(from), result);
        return Ok(());
    }
    if class == ConnectionClass::Responses {
        return Err("request on a Responses connection");
    }
    let arrival = Instant::now();
    let budget = Duration::from_micros(u64::from(header.budget_micros));
    let deadline = arrival + budget;
    let is_request = header.kind == Kind::Request;
    if header.budget_micros == 0 {
        bump(&counters.expired_inbound);
        if is_request {
            shared.send_reply(
                from,
                class,
                header.id,
                header.verb,
                Status::Expired,
                Bytes::new(),
                deadline,
            );
        }
        return Ok(());
    }
    if header.verb < FIRST_APPLICATION_VERB {
        // Pings are answered here, ahead of any queue, so that a busy node still answers them.
        let (status, body) = if header.verb == VERB_PING && class == ConnectionClass::Control {
            shared.record_heartbeat(from, &body);
            (Status::Ok, lock(&shared.heartbeat).clone())
        } else {
            (Status::UnknownVerb, Bytes::new())
        };
        if is_request {
            shared.send_reply(from, class, header.id, header.verb, status, body, deadline);
        }
        return Ok(());
    }
    let size = HEADER_LEN + body.len();
    let queued = shared.inbound_bytes[class.index()].try_acquire(size)
        && match shared.inbound_tx[class.index()].try_send(InboundMessage {
            from,
            from_host_id: hello.host_id,
            class,
            verb: header.verb,
            body,
            kind: header.kind,
            id: header.id,
            deadline,
            budget_on_arrival: budget,
            answered: false,
            shared: shared.clone(),
        }) {
            Ok(()) => true,
            Err(refused) => {
                shared.inbound_bytes[class.index()].release(size);
                let mut message = refused.into_inner();
                // The reply below is the answer; the message must not send its own.
                message.answered = true;
                false
            }
        };
    if !queued {
        bump(&counters.overloaded_replies);
        if is_request {
            shared.send_reply(
                from,
                class,
                header.id,
                header.verb,
                Status::Overloaded,
                Bytes::new(),
                deadline,
            );
        }
    }
    Ok(())
}

/// The handler queue of one class. Messages already past their deadline are answered
/// `Expired` and skipped here, so a handler never runs expired work.
pub struct InboundQueue {
    class: ConnectionClass,
    rx: mpsc::Receiver<InboundMessage>,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
}

impl InboundQueue {
    /// The class this queue serves.
    pub fn class(&self) -> ConnectionClass {
        self.class
    }

    /// The next message still within its deadline; `None` once the messenger shuts down.
    pub async fn recv(&mut self) -> Option<InboundMessage> {
        loop {
            let message = tokio::select! {
                biased;
                _ = self.shutdown.wait_for(|stop| *stop) => return None,
                message = self.rx.recv() => message?,
            };
            self.shared.inbound_bytes[self.class.index()].release(message.size());
            if Instant::now() < message.deadline {
                return Some(message);
            }
            bump(&self.shared.metrics.class(self.class).expired_inbound);
            message.reply_status(Status::Expired);
        }
    }
}

/// A request or one-way message from a peer. A request that is dropped without a reply is
/// answered `Failed`, so its caller never waits for its deadline because of a lost reply.
pub struct InboundMessage {
    /// The sender's internode address.
    pub from: SocketAddr,
    /// The sender's host id, from its handshake.
    pub from_host_id: u128,
    /// The class it arrived on.
    pub class: ConnectionClass,
    /// What the body means.
    pub verb: u16,
    /// The opaque body.
    pub body: Bytes,
    kind: Kind,
    id: u64,
    deadline: Instant,
    budget_on_arrival: Duration,
    answered: bool,
    shared: Arc<Shared>,
}

impl InboundMessage {
    /// When the sender stops waiting, by this node's clock: arrival plus the budget.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The budget the frame carried when it arrived.
    pub fn budget_on_arrival(&self) -> Duration {
        self.budget_on_arrival
    }

    /// True if the sender expects no reply.
    pub fn is_one_way(&self) -> bool {
        self.kind == Kind::OneWay
    }

    fn size(&self) -> usize {
        HEADER_LEN + self.body.len()
    }

    /// Answers the request with `body`. Ignored for one-way messages.
    pub fn reply(mut self, body: Bytes) {
        self.answer(Status::Ok, body);
    }

    /// Answers the request with an error status instead of running it (`Overloaded` from an
    /// application-level admission check, for example).
    pub fn reply_status(mut self, status: Status) {
        self.answer(status, Bytes::new());
    }

    fn answer(&mut self, status: Status, body: Bytes) {
        debug_assert!(!self.answered, "a message is answered once");
        if self.answered {
            return;
        }
        self.answered = true;
        if self.kind == Kind::Request {
            self.shared.send_reply(
                self.from,
                self.class,
                self.id,
                self.verb,
                status,
                body,
                self.deadline,
            );
        }
    }
}

impl Drop for InboundMessage {
    fn drop(&mut self) {
        if !self.answered && self.kind == Kind::Request {
            self.answer(Status::Failed, Bytes::new());
        }
    }
}

impl fmt::Debug for InboundMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboundMessage")
            .field("from", &self.from)
            .field("class", &self.class)
            .field("verb", &self.verb)
            .field("kind", &self.kind)
            .field("id", &self.id)
            .field("body_len", &self.body.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_holds_writes_to_its_rate_with_bounded_credit() {
        let start = Instant::now();
        let mut pacer = Pacer::new(1_000_000, start);
        // 100 KB at 1 MB/s: the next write waits 100 ms.
        assert_eq!(
            pacer.after_write(100_000, start),
            Some(Duration::from_millis(100))
        );
        // Written on time: another 100 ms.
        let on_time = start + Duration::from_millis(100);
        assert_eq!(
            pacer.after_write(100_000, on_time),
            Some(Duration::from_millis(100))
        );
        // After ten idle seconds the debt is gone, and only PACER_CREDIT was earned.
        let later = start + Duration::from_secs(10);
        assert_eq!(
            pacer.after_write(500_000, later),
            Some(Duration::from_millis(500) - PACER_CREDIT)
        );
        // A wake-up 5 ms late is caught up on the next wait.
        let next = later + Duration::from_millis(480 + 5);
        assert_eq!(
            pacer.after_write(100_000, next),
            Some(Duration::from_millis(95))
        );
    }
}
