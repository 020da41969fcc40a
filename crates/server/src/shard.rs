//! Shards: one OS thread per shard, each with its own current-thread tokio runtime and
//! `LocalSet`. A shard owns its connections, its per-shard state (admission, limiter) and
//! the slice of the token ring with `shard_of(token, N, 12) == id`. Work for a partition
//! owned by another shard crosses through that shard's bounded forward channel.

use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::BytesMut;
use sluice_engine::{Engine, Prepared, RequestContext, Session, ShardStatements};
use sluice_protocol::preencoded::PreencodedErrors;
use sluice_protocol::QueryParameters;
use sluice_storage::AckBarrier;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{error, info};

use crate::admission::ShardAdmission;
use crate::budget::Budget;
use crate::clock::ShardClock;
use crate::limiter::ShardLimiter;
use crate::metrics::ShardMetrics;
use crate::pipeline::execute::Failure;
use crate::pipeline::reply::Rejection;
use crate::{listener, ServerConfig, SharedMetrics, IGNORE_MSB};

/// Bound of each shard's queue of new connections.
const CONNECTION_QUEUE: usize = 256;
/// Bound of each shard's queue of forwarded executions.
const FORWARD_QUEUE: usize = 4096;

/// An execution sent to the shard that owns its partition.
pub struct Forwarded {
    /// The statement.
    pub prepared: Arc<Prepared>,
    /// Its parameters (values are `Bytes` slices of the original frame: no copy).
    pub params: QueryParameters,
    /// A copy of the connection's session.
    pub session: Session,
    /// Deadline and time.
    pub ctx: RequestContext,
    /// The rate limiter's check to run here, on the owner, before executing.
    pub limit: Option<crate::limiter::LimitCheck>,
    /// Where the owner answers.
    pub reply: oneshot::Sender<crate::pipeline::execute::ForwardedAnswer>,
}

/// How other threads reach a shard.
#[derive(Clone)]
pub struct ShardHandle {
    /// New connections (already accepted sockets).
    pub connections: mpsc::Sender<std::net::TcpStream>,
    /// Executions forwarded from other shards.
    pub forwards: mpsc::Sender<Forwarded>,
    /// Rate limiter checks of multi-partition operations, for the partitions this shard owns.
    pub limits: mpsc::Sender<crate::limiter::LimitRequest>,
}

/// Everything a shard's tasks share. Lives on the shard thread only (`Rc`).
pub struct ShardCtx {
    /// This shard's index.
    pub id: usize,
    /// Number of shards.
    pub nr_shards: usize,
    /// The query engine, shared by all shards.
    pub engine: Arc<Engine>,
    /// Node configuration.
    pub config: Arc<ServerConfig>,
    /// This shard's counters.
    pub metrics: Arc<ShardMetrics>,
    /// Every shard's handle, to forward work to the owner of a partition.
    pub peers: Arc<Vec<ShardHandle>>,
    /// The SUPPORTED frame for this shard, pre-encoded with stream 0 (patched per request).
    pub supported: BytesMut,
    /// Per-shard in-flight cap (backpressure).
    pub inflight: Rc<Budget>,
    /// Per-shard cap on request bytes in flight.
    pub inflight_bytes: Rc<Budget>,
    /// Per-shard admission state.
    pub admission: RefCell<ShardAdmission>,
    /// Bytes the readers of held-back connections read ahead, bounded per shard.
    pub read_ahead: Rc<crate::read_ahead::ReadAheadPool>,
    /// The backlogs of this shard's connections that grew in their latest interval, for
    /// their backlog watches (`sluice_overload::backlog`).
    pub growing_backlogs: sluice_overload::GrowingBacklogs,
    /// Per-shard rate limiter state.
    pub limiter: RefCell<ShardLimiter>,
    /// This shard's statement cache, in front of the engine's shared one (no lock per EXECUTE).
    pub statements: RefCell<ShardStatements>,
    /// The rejections' error frames, encoded once (`pipeline::reply` patches the stream id).
    pub frames: PreencodedErrors,
    /// Becomes true when the node shuts down.
    pub shutdown: watch::Receiver<bool>,
    /// Storage's acknowledgement barrier: each connection's writer flushes it before it
    /// writes answers, so requests may be answered as soon as their writes are applied.
    pub ack_barrier: AckBarrier,
    /// Failed logins per source address, shared by all shards.
    pub logins: Arc<crate::login_limiter::LoginLimiter>,
    /// The one source of time of this shard's request path (admission and the limiter
    /// hold copies of it).
    pub clock: ShardClock,
}

impl ShardCtx {
    /// The statement prepared under `id`, for EXECUTE: from this shard's cache, else the
    /// engine's.
    #[inline]
    pub fn prepared(&self, id: &[u8]) -> Option<Arc<Prepared>> {
        self.statements.borrow_mut().prepared(&self.engine, id)
    }

    /// Shard `id` of `nr_shards`: its admission, limiter and in-flight budgets, fresh.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: usize,
        nr_shards: usize,
        engine: Arc<Engine>,
        config: Arc<ServerConfig>,
        metrics: Arc<ShardMetrics>,
        peers: Arc<Vec<ShardHandle>>,
        shard_aware_port: Option<u16>,
        shutdown: watch::Receiver<bool>,
        ack_barrier: AckBarrier,
        logins: Arc<crate::login_limiter::LoginLimiter>,
        clock: ShardClock,
    ) -> ShardCtx {
        let options =
            crate::supported::supported_options(id, nr_shards, shard_aware_port, &config.host_id);
        let mut supported = BytesMut::new();
        sluice_protocol::response::encode_supported(&mut supported, 0, &options);
        ShardCtx {
            id,
            nr_shards,
            engine,
            inflight: Budget::new(config.max_inflight_per_shard),
            inflight_bytes: Budget::new(config.max_inflight_bytes_per_shard),
            admission: RefCell::new(ShardAdmission::with_clock(&config, clock.clone())),
            read_ahead: crate::read_ahead::ReadAheadPool::new(
                crate::read_ahead::MAX_READ_AHEAD_PER_SHARD,
            ),
            growing_backlogs: sluice_overload::GrowingBacklogs::new(),
            limiter: RefCell::new(ShardLimiter::with_clock(
                config.rate_limiter,
                id,
                clock.clone(),
            )),
            statements: RefCell::new(ShardStatements::default()),
            frames: PreencodedErrors::new(),
            config,
            metrics,
            peers,
            supported,
            shutdown,
            ack_barrier,
            logins,
            clock,
        }
    }

    /// A node's only shard, outside any thread or listener: the request pipeline over an
    /// in-memory connection (instruction counts, allocation and invariant tests). Must be
    /// used on a current-thread runtime inside a `LocalSet`; the returned [`Standalone`]
    /// keeps its channels open.
    pub fn standalone(
        config: ServerConfig,
        engine: Arc<Engine>,
        ack_barrier: AckBarrier,
    ) -> (Rc<ShardCtx>, Standalone) {
        Self::standalone_with_clock(config, engine, ack_barrier, ShardClock::system())
    }

    /// [`Self::standalone`] over `clock` (a manual one runs the pipeline in simulated time).
    pub fn standalone_with_clock(
        config: ServerConfig,
        engine: Arc<Engine>,
        ack_barrier: AckBarrier,
        clock: ShardClock,
    ) -> (Rc<ShardCtx>, Standalone) {
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let (connections, connections_rx) = mpsc::channel(1);
        let (forwards, forwards_rx) = mpsc::channel(1);
        let (limits, limits_rx) = mpsc::channel(1);
        let peers = Arc::new(vec![ShardHandle {
            connections,
            forwards,
            limits,
        }]);
        let metrics = Arc::new(ShardMetrics::default());
        let logins = Arc::new(crate::login_limiter::LoginLimiter::new(
            config.login_limiter,
            std::time::Instant::now(),
        ));
        let ctx = ShardCtx::new(
            0,
            1,
            engine,
            Arc::new(config),
            metrics,
            peers,
            None,
            shutdown_rx,
            ack_barrier,
            logins,
            clock,
        );
        let standalone = Standalone {
            _shutdown: shutdown_tx,
            _connections: connections_rx,
            _forwards: forwards_rx,
            _limits: limits_rx,
        };
        (Rc::new(ctx), standalone)
    }

    /// The shard that owns `token`.
    pub fn owner_of(&self, token: i64) -> usize {
        sluice_types::token::shard_of(token, self.nr_shards as u32, IGNORE_MSB) as usize
    }
}

/// What keeps a [`ShardCtx::standalone`] shard's channels open.
pub struct Standalone {
    _shutdown: watch::Sender<bool>,
    _connections: mpsc::Receiver<std::net::TcpStream>,
    _forwards: mpsc::Receiver<Forwarded>,
    _limits: mpsc::Receiver<crate::limiter::LimitRequest>,
}

/// A running node: shard threads plus the listener thread.
pub struct Server {
    threads: Vec<JoinHandle<()>>,
    shutdown: watch::Sender<bool>,
    metrics: SharedMetrics,
    local_addr: std::net::SocketAddr,
    shard_aware_addr: Option<std::net::SocketAddr>,
    metrics_addr: Option<std::net::SocketAddr>,
}

impl Server {
    /// Binds the listeners and starts the shards, which flush `ack_barrier` before they write
    /// answers. Fails only at start-up (bind errors).
    pub fn start(
        config: ServerConfig,
        engine: Arc<Engine>,
        ack_barrier: AckBarrier,
    ) -> io::Result<Server> {
        let config = Arc::new(config);
        let n = config.shards.max(1);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let metrics: SharedMetrics =
            Arc::new((0..n).map(|_| Arc::new(ShardMetrics::default())).collect());

        let mut handles = Vec::with_capacity(n);
        let mut receivers = Vec::with_capacity(n);
        for _ in 0..n {
            let (ctx, crx) = mpsc::channel(CONNECTION_QUEUE);
            let (ftx, frx) = mpsc::channel(FORWARD_QUEUE);
            let (ltx, lrx) = mpsc::channel(FORWARD_QUEUE);
            handles.push(ShardHandle {
                connections: ctx,
                forwards: ftx,
                limits: ltx,
            });
            receivers.push((crx, frx, lrx));
        }
        let peers = Arc::new(handles);

        let listeners = listener::Listeners::bind(&config)?;
        let local_addr = listeners.main_addr()?;
        let shard_aware_addr = listeners.shard_aware_addr()?;
        let metrics_addr = listeners.metrics_addr()?;

        let logins = Arc::new(crate::login_limiter::LoginLimiter::new(
            config.login_limiter,
            std::time::Instant::now(),
        ));
        let mut threads = Vec::with_capacity(n + 1);
        for (id, (crx, frx, lrx)) in receivers.into_iter().enumerate() {
            let engine = engine.clone();
            let logins = logins.clone();
            let config = config.clone();
            let peers = peers.clone();
            let m = metrics[id].clone();
            let shutdown = shutdown_rx.clone();
            let ack_barrier = ack_barrier.clone();
            let t = std::thread::Builder::new()
                .name(format!("sluice-shard-{id}"))
                .spawn(move || {
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            error!(shard = id, "cannot build shard runtime: {e}");
                            return;
                        }
                    };
                    let local = tokio::task::LocalSet::new();
                    let shard_aware_port = shard_aware_addr.map(|a| a.port());
                    let ctx = Rc::new(ShardCtx::new(
                        id,
                        n,
                        engine,
                        config,
                        m,
                        peers,
                        shard_aware_port,
                        shutdown,
                        ack_barrier,
                        logins,
                        ShardClock::system(),
                    ));
                    local.block_on(&rt, run_shard(ctx, crx, frx, lrx));
                })?;
            threads.push(t);
        }

        let t = listeners.spawn(
            config.clone(),
            peers.clone(),
            metrics.clone(),
            {
                let engine = engine.clone();
                Arc::new(move |out: &mut String| {
                    crate::metrics::render_transactions(out, engine.transactions());
                    crate::metrics::render_coordinator(
                        out,
                        &crate::metrics::CoordinatorCounts::of(&engine),
                    );
                    crate::metrics::render_txn_log(
                        out,
                        engine.txn_log_commits(),
                        engine.txn_log_conflicts(),
                    );
                    crate::metrics::render_purges(out, &engine.storage().purge_stats());
                })
            },
            shutdown_rx.clone(),
        )?;
        threads.push(t);
        info!(%local_addr, shards = n, "sluice is listening");
        Ok(Server {
            threads,
            shutdown: shutdown_tx,
            metrics,
            local_addr,
            shard_aware_addr,
            metrics_addr,
        })
    }

    /// The bound CQL address (useful with port 0).
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.local_addr
    }

    /// The bound shard-aware address, if enabled.
    pub fn shard_aware_addr(&self) -> Option<std::net::SocketAddr> {
        self.shard_aware_addr
    }

    /// The bound metrics address, if enabled.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_addr
    }

    /// Every shard's counters.
    pub fn metrics(&self) -> &[Arc<ShardMetrics>] {
        &self.metrics
    }

    /// Stops accepting, lets in-flight requests finish (up to the drain timeout), closes
    /// connections and joins every thread.
    pub fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

async fn run_shard(
    ctx: Rc<ShardCtx>,
    mut connections: mpsc::Receiver<std::net::TcpStream>,
    mut forwards: mpsc::Receiver<Forwarded>,
    mut limits: mpsc::Receiver<crate::limiter::LimitRequest>,
) {
    let mut shutdown = ctx.shutdown.clone();
    let probe = ctx.admission.borrow().lag_probe_interval();
    if let Some(every) = probe {
        tokio::task::spawn_local(lag_probe(ctx.clone(), every));
    }
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            Some(stream) = connections.recv() => {
                tokio::task::spawn_local(crate::connection::serve(ctx.clone(), stream));
            }
            Some(fwd) = forwards.recv() => run_forwarded(&ctx, fwd),
            Some(req) = limits.recv() => crate::limiter::run_request(&ctx, req),
        }
    }
    // Connections see the same shutdown signal: they stop reading, answer what is in
    // flight and close. Keep serving other shards' forwards while they drain.
    let drain = async {
        while ctx.metrics.connections.load(Relaxed) > 0 {
            tokio::select! {
                Some(fwd) = forwards.recv() => run_forwarded(&ctx, fwd),
                Some(req) = limits.recv() => crate::limiter::run_request(&ctx, req),
                _ = tokio::time::sleep(std::time::Duration::from_millis(5)) => {}
            }
        }
    };
    let _ = tokio::time::timeout(ctx.config.drain_timeout * 2, drain).await;
}

/// The shard's event-loop lag probe for admission: every `every`, it makes itself ready (a yield) and
/// measures how long it waits to run again. A connection's reader waits as long between its
/// bytes arriving and being read, a wait no queue of the server sees; admission counts it.
/// One wake-up per `every`: a few microseconds of CPU per millisecond at most.
async fn lag_probe(ctx: Rc<ShardCtx>, every: std::time::Duration) {
    let mut shutdown = ctx.shutdown.clone();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tokio::time::sleep(every) => {}
        }
        ctx.admission
            .borrow_mut()
            .lag_probe_started(ctx.clock.now());
        // The scheduler runs every task already ready (and polls the I/O driver) first.
        tokio::task::yield_now().await;
        ctx.admission
            .borrow_mut()
            .lag_probe_finished(ctx.clock.now(), &ctx.metrics);
    }
}

/// Runs an execution for another shard on this (the owning) shard.
fn run_forwarded(ctx: &Rc<ShardCtx>, fwd: Forwarded) {
    ctx.metrics.forwards_in.fetch_add(1, Relaxed);
    let ctx = ctx.clone();
    // The forwarded single-partition operation is rate-limited on its owner, once.
    if let Some(c) = &fwd.limit {
        let d = ctx.limiter.borrow_mut().check(c, &ctx.engine, &ctx.metrics);
        if let crate::limiter::LimitDecision::Reject(op) = d {
            let rejected = Rejection::RateLimited(op);
            let _ = fwd
                .reply
                .send((fwd.session, Err(Failure::Rejected(rejected))));
            return;
        }
    }
    tokio::task::spawn_local(async move {
        let mut session = fwd.session;
        // The engine checks the deadline again before any storage work.
        let result = ctx
            .engine
            .execute(&mut session, &fwd.prepared, &fwd.params, &fwd.ctx)
            .await
            .map_err(Failure::Error);
        ctx.clock.executed();
        let _ = fwd.reply.send((session, result));
    });
}
