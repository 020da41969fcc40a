//! The coordinator's hop between nodes: [`MessengerTransport`] carries the engine's replica
//! requests on the Requests class (replies on Responses); [`ReplicaService`] runs the ones
//! other coordinators send here, behind deadline-aware admission; [`follow_liveness`] feeds
//! the failure detector's verdicts to the engine, which sends nothing to a replica it
//! believes down (a hint instead) and answers Unavailable from them; [`replay_hints`] delivers
//! the hints once the replica is back.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_engine::coordinator::{
    Replica, ReplicaError, ReplicaFuture, ReplicaRefusal, ReplicaTransport, ReplicaVerb,
};
use sluice_engine::replica_stats::{RefusalReason, ReplicaStats};
use sluice_engine::Engine;
use sluice_internode::{
    CallError, ConnectionClass, FailureDetector, FailureDetectorConfig, InboundMessage,
    InboundQueue, Liveness, Messenger, Status,
};
use sluice_ring::{NodeState, TokenMetadata};
use tokio::sync::{mpsc, watch};
use uuid::Uuid;

use crate::verbs::{
    VERB_MUTATION, VERB_READ, VERB_READ_COUNTS, VERB_REPAIR, VERB_SCAN, VERB_SELECT, VERB_SLICE,
    VERB_TRUNCATE,
};

/// Replica requests this node runs at once; more are refused at arrival.
pub const MAX_REPLICA_IN_FLIGHT: usize = 1024;

/// Replayed hints waiting for the replica service; more are answered Overloaded and replayed
/// again later by their sender.
const MAX_QUEUED_HINTS: usize = 256;

/// Bulk-class requests (replayed hints) this node runs at once.
pub const MAX_BULK_IN_FLIGHT: usize = 64;

/// How often the hints of replicas that are back are replayed.
const HINT_REPLAY_INTERVAL: Duration = Duration::from_millis(500);

/// How long one replayed hint may take.
const HINT_REPLAY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long after a peer is first watched a silence means down: the failure detector
/// reports a peer down only after it was once up, so one never heard from is marked down here.
const NEVER_HEARD_GRACE: Duration = Duration::from_secs(2);

/// How often liveness is reconciled besides the detector's events.
const LIVENESS_RECHECK: Duration = Duration::from_millis(500);

/// Sends the engine's replica requests through the node's messenger.
pub struct MessengerTransport {
    messenger: Arc<Messenger>,
}

impl MessengerTransport {
    /// A transport over `messenger`.
    pub fn new(messenger: Arc<Messenger>) -> MessengerTransport {
        MessengerTransport { messenger }
    }
}

/// The internode verb of a replica request.
pub const fn verb_of(verb: ReplicaVerb) -> u16 {
    match verb {
        ReplicaVerb::Mutation => VERB_MUTATION,
        ReplicaVerb::Read => VERB_READ,
        ReplicaVerb::Repair => VERB_REPAIR,
        ReplicaVerb::Truncate => VERB_TRUNCATE,
        ReplicaVerb::Select => VERB_SELECT,
        ReplicaVerb::Scan => VERB_SCAN,
        ReplicaVerb::Slice => VERB_SLICE,
    }
}

/// How the coordinator counts a failed call: a refusal or an unreachable peer is a failed
/// replica at once; only silence waits for the deadline.
pub const fn replica_error(e: CallError) -> ReplicaError {
    match e {
        CallError::Timeout => ReplicaError::Timeout,
        CallError::Overloaded | CallError::Expired | CallError::Failed | CallError::UnknownVerb => {
            ReplicaError::Refused
        }
        CallError::QueueFull
        | CallError::PeerDown
        | CallError::TooManyInFlight
        | CallError::TooLarge
        | CallError::ReservedVerb
        | CallError::WrongClass
        | CallError::ShuttingDown => ReplicaError::Unreachable,
    }
}

impl ReplicaTransport for MessengerTransport {
    fn send(
        &self,
        to: Replica,
        verb: ReplicaVerb,
        body: Bytes,
        deadline: Instant,
    ) -> ReplicaFuture {
        let messenger = Arc::clone(&self.messenger);
        Box::pin(async move {
            messenger
                .call(
                    to.internode,
                    ConnectionClass::Requests,
                    verb_of(verb),
                    body,
                    deadline,
                )
                .await
                .map_err(|e| {
                    tracing::debug!(error = %e, peer = %to.internode, ?verb, "replica call failed");
                    replica_error(e)
                })
        })
    }
}

/// Deadline-aware admission of replica requests: a request is turned away at arrival when
/// the cap of requests in flight is reached, or when its remaining budget cannot cover the
/// time requests of its verb have recently taken (so a saturated replica says so at once
/// instead of running work whose coordinator has given up).
#[derive(Debug)]
pub struct ReplicaAdmission {
    in_flight: usize,
    cap: usize,
    /// Smoothed service time per verb (in [`ReplicaVerb`] order), in nanoseconds.
    service_nanos: [f64; ReplicaVerb::ALL.len()],
}

/// Weight of a new sample in the smoothed service time.
const SERVICE_EWMA_WEIGHT: f64 = 0.1;

/// The served verb of an internode verb, if the replica service runs it.
pub fn served_verb(verb: u16) -> Option<ReplicaVerb> {
    ReplicaVerb::ALL.into_iter().find(|&v| verb_of(v) == verb)
}

fn verb_index(verb: u16) -> Option<usize> {
    served_verb(verb).map(|v| v as usize)
}

impl ReplicaAdmission {
    /// Admission with at most `cap` requests in flight.
    pub fn new(cap: usize) -> ReplicaAdmission {
        ReplicaAdmission {
            in_flight: 0,
            cap: cap.max(1),
            service_nanos: [0.0; ReplicaVerb::ALL.len()],
        }
    }

    /// Requests admitted and not yet done.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The time a request of `verb` is expected to take now.
    pub fn expected(&self, verb: u16) -> Duration {
        let nanos = verb_index(verb).map_or(0.0, |i| self.service_nanos[i]);
        Duration::from_nanos(nanos as u64)
    }

    /// Admits a request with `remaining` budget, or says why not (a status to answer).
    pub fn try_admit(&mut self, verb: u16, remaining: Duration) -> Result<(), Status> {
        self.admit(verb, remaining).map_err(status_of)
    }

    /// Admits a request with `remaining` budget, or gives the reason it is turned away.
    pub fn admit(&mut self, verb: u16, remaining: Duration) -> Result<(), RefusalReason> {
        if self.in_flight >= self.cap {
            return Err(RefusalReason::InFlightCap);
        }
        if remaining.is_zero() {
            return Err(RefusalReason::Expired);
        }
        if remaining < self.expected(verb) {
            return Err(RefusalReason::Budget);
        }
        self.in_flight += 1;
        debug_assert!(self.in_flight <= self.cap);
        Ok(())
    }

    /// Releases an admitted request that ran for `took`.
    pub fn release(&mut self, verb: u16, took: Duration) {
        debug_assert!(self.in_flight > 0, "released more than admitted");
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(i) = verb_index(verb) {
            let sample = took.as_nanos() as f64;
            let old = self.service_nanos[i];
            self.service_nanos[i] = if old == 0.0 {
                sample
            } else {
                old + SERVICE_EWMA_WEIGHT * (sample - old)
            };
        }
    }
}

/// The status that answers an admission refusal.
const fn status_of(reason: RefusalReason) -> Status {
    match reason {
        RefusalReason::Expired => Status::Expired,
        RefusalReason::InFlightCap | RefusalReason::Budget => Status::Overloaded,
        RefusalReason::Failed => Status::Failed,
    }
}

/// The thread that runs replica requests from other coordinators.
pub struct ReplicaService {
    thread: Option<std::thread::JoinHandle<()>>,
    engine: Arc<Engine>,
}

impl ReplicaService {
    /// Starts serving `requests` (the messenger's Requests queue) on a thread of its own,
    /// so that storage work never runs on the thread of Raft and the failure detector.
    /// It stops when the messenger shuts down.
    /// `hints`, when given, receives the hints other nodes replay (the Bulk class's MUTATION
    /// messages, which the streaming server forwards), served the same way with a cap of its
    /// own.
    pub fn start(
        requests: InboundQueue,
        hints: Option<mpsc::Receiver<InboundMessage>>,
        engine: Arc<Engine>,
        cap: usize,
    ) -> std::io::Result<ReplicaService> {
        debug_assert_eq!(requests.class(), ConnectionClass::Requests);
        let service_engine = Arc::clone(&engine);
        let thread = std::thread::Builder::new()
            .name("sluice-replica".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the replica runtime");
                        return;
                    }
                };
                let local = tokio::task::LocalSet::new();
                if let Some(hints) = hints {
                    local.spawn_local(serve(hints, Arc::clone(&engine), MAX_BULK_IN_FLIGHT));
                }
                local.block_on(&runtime, serve(requests, engine, cap));
            })?;
        Ok(ReplicaService {
            thread: Some(thread),
            engine: service_engine,
        })
    }

    /// The service's counters (kept by the engine, which `GET /metrics` reads).
    pub fn counters(&self) -> &ReplicaStats {
        self.engine.replica_stats()
    }

    /// Waits for the thread to end (after the messenger shut down).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A queue of replica requests: the messenger's Requests queue, or the hints the Bulk class
/// forwards.
trait ReplicaRequests {
    /// The next request still within its deadline; `None` once the source is gone.
    async fn next(&mut self) -> Option<InboundMessage>;
}

impl ReplicaRequests for InboundQueue {
    async fn next(&mut self) -> Option<InboundMessage> {
        self.recv().await
    }
}

impl ReplicaRequests for mpsc::Receiver<InboundMessage> {
    async fn next(&mut self) -> Option<InboundMessage> {
        loop {
            let message = self.recv().await?;
            if Instant::now() < message.deadline() {
                return Some(message);
            }
            message.reply_status(Status::Expired);
        }
    }
}

async fn serve(mut requests: impl ReplicaRequests, engine: Arc<Engine>, cap: usize) {
    let admission = std::rc::Rc::new(std::cell::RefCell::new(ReplicaAdmission::new(cap)));
    while let Some(message) = requests.next().await {
        let verb = message.verb;
        if verb == VERB_READ_COUNTS {
            // A bounded message of counts only: counted here, before any storage work.
            if let Err(refusal) = engine.count_peer_reads(&message.body) {
                tracing::debug!(?refusal, from = %message.from, "read counts refused");
                message.reply_status(Status::Failed);
            } else {
                message.reply(Bytes::new());
            }
            continue;
        }
        let Some(served) = served_verb(verb) else {
            message.reply_status(Status::UnknownVerb);
            continue;
        };
        let remaining = message.deadline().saturating_duration_since(Instant::now());
        if let Err(reason) = admission.borrow_mut().admit(verb, remaining) {
            engine.replica_stats().count_refused(served, reason);
            message.reply_status(status_of(reason));
            continue;
        }
        engine.replica_stats().count_served(served);
        let engine = Arc::clone(&engine);
        let admission = std::rc::Rc::clone(&admission);
        tokio::task::spawn_local(async move {
            let started = Instant::now();
            handle(&engine, message).await;
            admission.borrow_mut().release(verb, started.elapsed());
        });
    }
}

/// Runs one replica request and answers it.
async fn handle(engine: &Engine, message: InboundMessage) {
    let deadline = message.deadline();
    let result = match message.verb {
        VERB_MUTATION => engine
            .apply_replica_mutations(&message.body, deadline)
            .await
            .map(|()| Bytes::new()),
        VERB_READ => engine.replica_read(&message.body, deadline),
        VERB_REPAIR => engine
            .apply_replica_repair(&message.body, deadline)
            .await
            .map(|()| Bytes::new()),
        VERB_TRUNCATE => engine
            .apply_replica_truncate(&message.body, deadline)
            .map(|()| Bytes::new()),
        VERB_SELECT => {
            engine
                .serve_forwarded_statement(&message.body, deadline)
                .await
        }
        VERB_SCAN => engine.serve_scan(&message.body, deadline).await,
        VERB_SLICE => engine.serve_slice(&message.body, deadline).await,
        _ => {
            message.reply_status(Status::UnknownVerb);
            return;
        }
    };
    let stats = engine.replica_stats();
    let served = served_verb(message.verb);
    match result {
        Ok(reply) => message.reply(reply),
        Err(ReplicaRefusal::Expired) => {
            if let Some(v) = served {
                stats.count_refused(v, RefusalReason::Expired);
            }
            message.reply_status(Status::Expired)
        }
        Err(refusal) => {
            if let Some(v) = served {
                stats.count_refused(v, RefusalReason::Failed);
            }
            tracing::debug!(?refusal, from = %message.from, "replica request refused");
            message.reply_status(Status::Failed);
        }
    }
}

/// How often this node's schema version is checked for its heartbeat (a change is pinged to
/// every peer at once) and the peers' recorded: `system.peers` lags a peer's change by about
/// this plus a round trip.
const SCHEMA_VERSION_EXCHANGE: Duration = Duration::from_millis(20);

/// The schema versions carried in the failure detector's pings: this node's, and where each
/// peer's goes (the engine's `schema_version` and `set_peer_schema_version`).
pub struct SchemaVersions {
    /// This node's schema version now.
    pub mine: Arc<dyn Fn() -> Uuid + Send + Sync>,
    /// Records a peer's version (host id, version).
    pub peer: Arc<dyn Fn(Uuid, Uuid) + Send + Sync>,
}

/// Watches every peer of the ring with a failure detector and reports each liveness
/// change through `set_up(host_id, up)` (the engine's `set_node_up`); with `versions`, this
/// node's schema version rides in its ping answers and each peer's is recorded. Runs until
/// the ring's sender is dropped; call it on the messenger's runtime.
pub async fn follow_liveness(
    messenger: Arc<Messenger>,
    mut ring: watch::Receiver<Arc<TokenMetadata>>,
    me: Uuid,
    config: FailureDetectorConfig,
    set_up: Arc<dyn Fn(Uuid, bool) + Send + Sync>,
    versions: Option<SchemaVersions>,
) {
    let detector = FailureDetector::start(&messenger, config);
    let mut events = detector.subscribe();
    let peers: Mutex<HashMap<SocketAddr, (Uuid, Instant)>> = Mutex::new(HashMap::new());
    let sync_peers = |current: &TokenMetadata| {
        let mut peers = peers.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let wanted: Vec<(SocketAddr, Uuid)> = current
            .nodes()
            .iter()
            .filter(|n| n.host_id != me && n.state != NodeState::Left)
            .map(|n| (n.internode_address, n.host_id))
            .collect();
        peers.retain(|addr, _| {
            let keep = wanted.iter().any(|(a, _)| a == addr);
            if !keep {
                detector.unwatch(*addr);
            }
            keep
        });
        for (addr, host) in wanted {
            peers.entry(addr).or_insert_with(|| {
                detector.watch(addr);
                (host, now)
            });
        }
    };
    let reconcile = || {
        let peers = peers.lock().unwrap_or_else(|p| p.into_inner());
        for (addr, (host, since)) in peers.iter() {
            let up = detector.is_up(*addr);
            if up || since.elapsed() >= NEVER_HEARD_GRACE {
                set_up(*host, up);
            }
        }
    };
    let mut published: Option<Uuid> = None;
    let exchange_versions = |published: &mut Option<Uuid>| {
        let Some(versions) = &versions else {
            return;
        };
        let mine = (versions.mine)();
        if *published != Some(mine) {
            messenger.set_heartbeat(Bytes::copy_from_slice(mine.as_bytes()));
            detector.ping_now();
            *published = Some(mine);
        }
        let peers = peers.lock().unwrap_or_else(|p| p.into_inner());
        for (addr, (host, _)) in peers.iter() {
            if let Some(version) = detector
                .heartbeat(*addr)
                .and_then(|b| Uuid::from_slice(&b).ok())
            {
                (versions.peer)(*host, version);
            }
        }
    };
    sync_peers(&ring.borrow_and_update());
    exchange_versions(&mut published);
    let mut recheck = tokio::time::interval(LIVENESS_RECHECK);
    let mut exchange = tokio::time::interval(SCHEMA_VERSION_EXCHANGE);
    exchange.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = exchange.tick(), if versions.is_some() => exchange_versions(&mut published),
            changed = ring.changed() => {
                if changed.is_err() {
                    return;
                }
                let current = Arc::clone(&ring.borrow_and_update());
                sync_peers(&current);
            }
            event = events.recv() => {
                match event {
                    Ok(change) => {
                        let host = peers
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get(&change.peer)
                            .map(|(h, _)| *h);
                        if let Some(host) = host {
                            set_up(host, change.liveness == Liveness::Up);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => reconcile(),
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
            _ = recheck.tick() => reconcile(),
        }
    }
}

/// Replays the engine's hints, one at a time on the Bulk class (whose byte rate the messenger
/// budgets), to each replica the engine believes up, a host's oldest file first; what cannot
/// be delivered waits on disk for the next round. Runs until aborted; call it on the
/// messenger's runtime.
pub async fn replay_hints(
    messenger: Arc<Messenger>,
    engine: Arc<Engine>,
    ring: watch::Receiver<Arc<TokenMetadata>>,
) {
    let mut tick = tokio::time::interval(HINT_REPLAY_INTERVAL);
    loop {
        tick.tick().await;
        let Some(store) = engine.hints() else {
            continue;
        };
        for host in store.hosts() {
            if !engine.is_node_up(host) {
                continue;
            }
            let address = {
                let ring = ring.borrow();
                ring.index_of(host).map(|i| ring.node(i).internode_address)
            };
            // A node gone from the ring: its hints age out of the window.
            let Some(address) = address else {
                continue;
            };
            let mut replayed = 0;
            while let Some(batch) = store.next_batch(host).await {
                let mut delivered = 0;
                for body in batch.bodies() {
                    let deadline = Instant::now() + HINT_REPLAY_TIMEOUT;
                    match messenger
                        .call(
                            address,
                            ConnectionClass::Bulk,
                            VERB_MUTATION,
                            body.clone(),
                            deadline,
                        )
                        .await
                    {
                        Ok(_) => delivered += 1,
                        Err(e) => {
                            tracing::debug!(error = %e, %host, "hint replay stopped");
                            break;
                        }
                    }
                }
                store.delivered(&batch, delivered);
                replayed += delivered;
                if delivered < batch.len() {
                    break;
                }
            }
            if replayed > 0 {
                tracing::info!(%host, delivered = replayed, "hints replayed");
            }
        }
    }
}

/// Sends the other replicas of each key the reads this node admitted since the last round,
/// every `read_counts::EXCHANGE_INTERVAL`, one-way on the Requests class (a message that
/// cannot be queued is dropped: the next round carries newer counts). Runs until aborted;
/// call it on the messenger's runtime.
pub async fn exchange_read_counts(messenger: Arc<Messenger>, engine: Arc<Engine>) {
    let mut tick = tokio::time::interval(sluice_engine::read_counts::EXCHANGE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let deadline = Instant::now() + READ_COUNTS_TIMEOUT;
        for (peer, body) in engine.take_read_counts() {
            if let Err(e) = messenger.send_oneway(
                peer,
                ConnectionClass::Requests,
                VERB_READ_COUNTS,
                body,
                deadline,
            ) {
                tracing::debug!(error = %e, %peer, "read counts not sent");
            }
        }
    }
}

/// How long a read count message may travel: counts older than a window are not counted.
const READ_COUNTS_TIMEOUT: Duration = Duration::from_millis(500);

/// The coordinator wired into a node: the engine sends through the messenger, this node
/// serves other coordinators' requests, and liveness follows the failure detector.
pub struct Coordination {
    service: ReplicaService,
    liveness: tokio::task::JoinHandle<()>,
    hints: tokio::task::JoinHandle<()>,
    read_counts: tokio::task::JoinHandle<()>,
}

impl Coordination {
    /// Makes `engine` a coordinator over `node`'s messenger. Call it from within the
    /// messenger's runtime (the failure detector and its follower run there).
    pub fn start(node: &crate::ClusterNode, engine: Arc<Engine>) -> std::io::Result<Coordination> {
        let messenger = Arc::clone(node.messenger());
        engine.set_replica_transport(Arc::new(MessengerTransport::new(Arc::clone(&messenger))));
        let requests = messenger
            .take_inbound(ConnectionClass::Requests)
            .ok_or_else(|| std::io::Error::other("the Requests queue is already served"))?;
        let (hint_sender, hints) = mpsc::channel(MAX_QUEUED_HINTS);
        node.attach_hint_receiver(hint_sender);
        let service = ReplicaService::start(
            requests,
            Some(hints),
            Arc::clone(&engine),
            MAX_REPLICA_IN_FLIGHT,
        )?;
        let hints = tokio::spawn(replay_hints(
            Arc::clone(&messenger),
            Arc::clone(&engine),
            node.ring(),
        ));
        let read_counts = tokio::spawn(exchange_read_counts(
            Arc::clone(&messenger),
            Arc::clone(&engine),
        ));
        let versions = SchemaVersions {
            mine: {
                let engine = Arc::clone(&engine);
                Arc::new(move || engine.schema_version())
            },
            peer: {
                let engine = Arc::clone(&engine);
                Arc::new(move |host, version| engine.set_peer_schema_version(host, version))
            },
        };
        let set_up: Arc<dyn Fn(Uuid, bool) + Send + Sync> = Arc::new(move |host, up| {
            engine.set_node_up(host, up);
        });
        let liveness = tokio::spawn(follow_liveness(
            messenger,
            node.ring(),
            node.host_id(),
            FailureDetectorConfig::default(),
            set_up,
            Some(versions),
        ));
        Ok(Coordination {
            service,
            liveness,
            hints,
            read_counts,
        })
    }

    /// The replica side's counters.
    pub fn counters(&self) -> &ReplicaStats {
        self.service.counters()
    }

    /// Stops following liveness and waits for the replica thread, which ends once the
    /// messenger has shut down (`ClusterNode::stop`).
    pub fn join(self) {
        self.liveness.abort();
        self.hints.abort();
        self.read_counts.abort();
        self.service.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_caps_in_flight_and_refuses_what_cannot_finish() {
        let mut a = ReplicaAdmission::new(2);
        let budget = Duration::from_millis(100);
        assert_eq!(a.try_admit(VERB_MUTATION, budget), Ok(()));
        assert_eq!(a.try_admit(VERB_MUTATION, budget), Ok(()));
        // Full: refused at once, whatever the budget.
        assert_eq!(
            a.try_admit(VERB_MUTATION, Duration::from_secs(10)),
            Err(Status::Overloaded)
        );
        a.release(VERB_MUTATION, Duration::from_millis(50));
        assert_eq!(a.in_flight(), 1);
        // Mutations now take about 50 ms: 20 ms left cannot be enough, 80 ms can.
        assert_eq!(
            a.try_admit(VERB_MUTATION, Duration::from_millis(20)),
            Err(Status::Overloaded)
        );
        assert_eq!(
            a.try_admit(VERB_MUTATION, Duration::from_millis(80)),
            Ok(())
        );
        // Reads have their own history; nothing left is expired work.
        a.release(VERB_MUTATION, Duration::from_millis(50));
        assert_eq!(a.try_admit(VERB_READ, Duration::from_millis(1)), Ok(()));
        a.release(VERB_READ, Duration::from_micros(10));
        assert_eq!(a.try_admit(VERB_READ, Duration::ZERO), Err(Status::Expired));
        a.release(VERB_MUTATION, Duration::from_millis(50));
        assert_eq!(a.in_flight(), 0);
    }

    #[test]
    fn call_errors_map_to_failures_or_timeouts() {
        assert_eq!(replica_error(CallError::Timeout), ReplicaError::Timeout);
        for refused in [CallError::Overloaded, CallError::Expired, CallError::Failed] {
            assert_eq!(replica_error(refused), ReplicaError::Refused);
        }
        for unreachable in [
            CallError::QueueFull,
            CallError::PeerDown,
            CallError::TooManyInFlight,
        ] {
            assert_eq!(replica_error(unreachable), ReplicaError::Unreachable);
        }
    }
}
