//! Per-shard admission control: CoDel-style delay-based shedding, an
//! overloaded bound on the queue, and an adaptive concurrency limit on requests in execution.
//!
//! The request path this is built for (the server's `pipeline/admit.rs`):
//!
//! ```text
//! socket ─► in-flight caps (the server's `budget.rs`: stop reading when over them)
//!        ─► AdmissionQueue (bounded; Codel decides from the requests' ages alone)
//!        ─► ConcurrencyLimit (dispatch only while in execution < adaptive limit)
//!        ─► execute ─► on_complete (latency sample feeds the limit)
//! ```
//!
//! CoDel: the shard is overloaded once the standing delay (the smallest age seen at dequeue)
//! stayed above `target` for a whole `interval`. While overloaded, requests are dropped from
//! the old end once they waited more than `slough = 2 × target` (they would likely miss
//! their deadline anyway; they are answered `Overloaded` without being decoded), and the
//! queue keeps at most what the shard dispatches within the overloaded wait (750 us, or five
//! dispatches if longer; at most half the target) at its measured rate: further arrivals
//! are turned away at enqueue, from the header, the cheapest rejection there is, and so is
//! an arrival known (from its kernel stamp, or its read) to have waited longer than that
//! before it reached the queue. Then even FIFO waits little, what is served while
//! overloaded is answered about as fast as under a light load, and nothing is left to age
//! in the queue only to be shed later, at a higher cost than a rejection at enqueue;
//! optionally the queue serves the newest first while overloaded (adaptive LIFO, as Facebook
//! does). Not overloaded, the queue is FIFO and nothing waits longer than `max_queue_delay`
//! (Facebook's "N ms when the queue was recently empty").
//!
//! The queue only sees a request once its header is read. When the shard's event loop is
//! saturated, requests also wait where the queue cannot see them: in the kernel socket
//! buffer until their connection's reader task is polled again. That wait is at least the
//! loop's lag (how long a task that became ready waits before it runs), which a probe task
//! measures ([`LoopLag`]), and far longer once a backlog builds up behind a reader that takes
//! a bounded number of frames per turn (120 ms against a 3.5 ms lag, measured). Where the
//! kernel stamps what it received ([`Arrival::Received`]), the wait is known instead and a
//! request's age starts at that stamp; otherwise the controller counts the lag as waiting: a
//! request's age starts that long before the read ([`AdmissionController::enqueue_read`]).
//! Either way a lag above target is a standing delay even while the queue is empty, and so
//! is the age of frames that a busy reader only reaches late. The server's simulation of its
//! pipeline (`crates/server/src/sim.rs`) shows them at work.

use crate::clock::{duration_nanos, Nanos};
use crate::deadline::Deadline;
use std::collections::VecDeque;
use std::time::Duration;

/// What to do with a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Serve it.
    Serve,
    /// Turn it away with the pre-encoded `Overloaded` error.
    Shed,
    /// Its deadline passed: answer with a timeout, never execute.
    Expired,
}

/// CoDel constants (Facebook's and folly's defaults).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CodelConfig {
    /// Acceptable standing queue delay (5 ms).
    pub target: Duration,
    /// Window over which the minimum queue delay must exceed `target` (100 ms).
    pub interval: Duration,
    /// While overloaded, requests that waited longer than this are shed (10 ms = 2 × target).
    pub slough: Duration,
    /// Requests that waited longer than this are always shed (100 ms = interval).
    pub max_queue_delay: Duration,
}

impl Default for CodelConfig {
    fn default() -> Self {
        CodelConfig {
            target: Duration::from_millis(5),
            interval: Duration::from_millis(100),
            slough: Duration::from_millis(10),
            max_queue_delay: Duration::from_millis(100),
        }
    }
}

/// The delay-based overload detector: overloaded when the minimum queue delay observed over
/// the last interval stayed above target, i.e. the queue never drained in that interval.
#[derive(Clone, Debug)]
pub struct Codel {
    target: u64,
    interval: u64,
    slough: u64,
    max_delay: u64,
    interval_end: Nanos,
    /// Minimum delay seen in the current interval; `u64::MAX` when nothing was seen.
    min_delay: u64,
    /// Arrivals were turned away at enqueue in the current interval.
    turned_away: bool,
    overloaded: bool,
}

impl Codel {
    /// A detector that starts not overloaded.
    pub fn new(cfg: CodelConfig) -> Codel {
        Codel {
            target: duration_nanos(cfg.target),
            interval: duration_nanos(cfg.interval).max(1),
            slough: duration_nanos(cfg.slough),
            max_delay: duration_nanos(cfg.max_queue_delay),
            interval_end: Nanos::ZERO,
            min_delay: u64::MAX,
            turned_away: false,
            overloaded: false,
        }
    }

    /// Records a queue delay sample: the age of the oldest queued request when one is
    /// dequeued, or zero when the queue is found empty.
    #[inline]
    pub fn on_dequeue(&mut self, queue_delay: Duration, now: Nanos) {
        self.roll(now);
        self.min_delay = self.min_delay.min(duration_nanos(queue_delay));
    }

    /// Records an arrival turned away at enqueue for lack of room. While overloaded, the queue
    /// is kept short on purpose, so that it empties now and then proves nothing: an interval
    /// in which arrivals still had to be turned away keeps the overloaded state.
    #[inline]
    pub fn on_turned_away(&mut self, now: Nanos) {
        self.roll(now);
        self.turned_away = true;
    }

    /// [`Codel::on_turned_away`] without reading the time: counts in the current interval.
    #[inline]
    pub fn note_turned_away(&mut self) {
        self.turned_away = true;
    }

    /// True if a request that has waited `queued_for` must be shed now.
    #[inline]
    pub fn should_shed(&mut self, now: Nanos, queued_for: Duration) -> bool {
        self.roll(now);
        let q = duration_nanos(queued_for);
        q > self.max_delay || (self.overloaded && q > self.slough)
    }

    /// True while the queue has had a standing delay above target for a full interval.
    #[inline]
    pub fn is_overloaded(&mut self, now: Nanos) -> bool {
        self.roll(now);
        self.overloaded
    }

    #[inline]
    fn roll(&mut self, now: Nanos) {
        if now < self.interval_end {
            return;
        }
        // An interval without samples means no dequeues at all: either idle (queue empty)
        // or fully stalled; keep the previous state in that case rather than guessing.
        if self.min_delay != u64::MAX {
            self.overloaded = self.min_delay > self.target || (self.overloaded && self.turned_away);
        }
        self.min_delay = u64::MAX;
        self.turned_away = false;
        self.interval_end = Nanos(now.0.saturating_add(self.interval));
    }
}

/// The shard's event-loop lag, from a probe task that periodically makes itself ready and
/// measures how long it waits before it runs again. A socket's reader waits just as long
/// between the moment its bytes arrive and the moment it reads them, so the lag estimates the
/// wait before a request's header is read, which no queue of the server can see. One trip
/// through the run queue depends on the turns ahead of it, which vary, so the estimate is the
/// longer of the last two trips: an estimate short of a reader's own wait makes its frames
/// look younger than they are, and admission then serves them late.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopLag {
    /// The last completed probe's lag (nanoseconds).
    last: u64,
    /// The lag of the probe before it (nanoseconds).
    before_last: u64,
    /// When the probe in progress became ready, if one is in progress.
    pending_since: Option<Nanos>,
}

impl LoopLag {
    /// The probe became ready at `now` and waits to run.
    #[inline]
    pub fn probe_started(&mut self, now: Nanos) {
        self.pending_since = Some(now);
    }

    /// The probe ran at `now`; returns the lag it measured (zero if no probe was started).
    #[inline]
    pub fn probe_finished(&mut self, now: Nanos) -> Duration {
        let Some(since) = self.pending_since.take() else {
            return Duration::ZERO;
        };
        let lag = now.saturating_duration_since(since);
        self.before_last = self.last;
        self.last = duration_nanos(lag);
        lag
    }

    /// The current lag: the longer of the last two measurements, or longer if the probe in
    /// progress has already been waiting longer than that (the loop is stuck right now).
    #[inline]
    pub fn estimate(&self, now: Nanos) -> Duration {
        let waiting = self.pending_since.map_or(0, |t| now.0.saturating_sub(t.0));
        Duration::from_nanos(self.last.max(self.before_last).max(waiting))
    }
}

/// Adaptive concurrency limit constants (a Gradient2-style controller with a passive
/// no-load latency baseline instead of Envoy's periodic re-probe).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct ConcurrencyLimitConfig {
    /// Starting limit (4): start low so that the first windows measure the no-load latency
    /// even when the shard is overloaded from its first request, then grow.
    pub initial: u32,
    /// Lower bound (4).
    pub min: u32,
    /// Upper bound (1024).
    pub max: u32,
    /// Latency above `tolerance × baseline` shrinks the limit (2.0).
    pub tolerance: f64,
    /// Weight of a new estimate (0.2, Netflix's smoothing).
    pub smoothing: f64,
    /// Samples are aggregated over windows of this length (10 ms) ...
    pub window: Duration,
    /// ... holding at least this many samples (10).
    pub min_samples: u32,
}

impl Default for ConcurrencyLimitConfig {
    fn default() -> Self {
        ConcurrencyLimitConfig {
            initial: 4,
            min: 4,
            max: 1024,
            tolerance: 2.0,
            smoothing: 0.2,
            window: Duration::from_millis(10),
            min_samples: 10,
        }
    }
}

/// An adaptive limit on requests in execution: it grows by `√limit` while the measured
/// latency stays within `tolerance × baseline` and the limit is actually used, and shrinks
/// in proportion to `baseline × tolerance / latency` when a hidden queue forms behind it.
#[derive(Clone, Debug)]
pub struct ConcurrencyLimit {
    cfg: ConcurrencyLimitConfig,
    limit: f64,
    baseline: f64,
    window_end: Nanos,
    sum: f64,
    n: u32,
    max_inflight: u32,
}

impl ConcurrencyLimit {
    /// A limit at `cfg.initial`, clamped to `[min, max]`.
    pub fn new(cfg: ConcurrencyLimitConfig) -> ConcurrencyLimit {
        let min = cfg.min.max(1);
        let max = cfg.max.max(min);
        let cfg = ConcurrencyLimitConfig { min, max, ..cfg };
        ConcurrencyLimit {
            limit: f64::from(cfg.initial.clamp(min, max)),
            cfg,
            baseline: f64::INFINITY,
            window_end: Nanos::ZERO,
            sum: 0.0,
            n: 0,
            max_inflight: 0,
        }
    }

    /// The current limit.
    #[inline]
    pub fn limit(&self) -> u32 {
        self.limit as u32
    }

    /// The upper bound.
    #[inline]
    pub fn max(&self) -> u32 {
        self.cfg.max
    }

    /// The current no-load latency baseline, if any sample was taken.
    pub fn baseline(&self) -> Option<Duration> {
        self.baseline
            .is_finite()
            .then(|| Duration::from_nanos(self.baseline as u64))
    }

    /// Feeds one completed request: its execution latency and the number in execution
    /// when it was dispatched.
    pub fn on_sample(&mut self, latency: Duration, inflight: u32, now: Nanos) {
        let rtt = duration_nanos(latency).max(1) as f64;
        if self.n == 0 {
            self.window_end = now.saturating_add(self.cfg.window);
        }
        self.sum += rtt;
        self.n += 1;
        self.max_inflight = self.max_inflight.max(inflight);
        if now < self.window_end || self.n < self.cfg.min_samples {
            return;
        }
        let short = self.sum / f64::from(self.n);
        // The baseline is the lowest window mean seen (a per-sample minimum would track the
        // luckiest request, not the no-load latency). While the limit sits at its minimum the
        // shard already runs at the lowest concurrency allowed, so that window's latency *is*
        // the current no-load latency: re-baseline from it. This is Envoy's minRTT probe
        // without pinning concurrency on purpose, and it lets the baseline follow a workload
        // that really became slower.
        if self.limit() <= self.cfg.min {
            self.baseline = short;
        } else {
            self.baseline = self.baseline.min(short);
        }
        let used = f64::from(self.max_inflight) >= self.limit / 2.0;
        let gradient = (self.cfg.tolerance * self.baseline / short).clamp(0.5, 1.0);
        if gradient < 1.0 || used {
            let target = self.limit * gradient + self.limit.sqrt();
            let next = self.limit * (1.0 - self.cfg.smoothing) + target * self.cfg.smoothing;
            // Without pressure the limit only grows while it is actually used.
            let next = if gradient >= 1.0 {
                next.max(self.limit)
            } else {
                next
            };
            self.limit = next.clamp(f64::from(self.cfg.min), f64::from(self.cfg.max));
        }
        self.sum = 0.0;
        self.n = 0;
        self.max_inflight = 0;
    }
}

/// While overloaded, a request is served after a wait of up to this many dispatches at the
/// shard's measured rate, if that is longer than `AdmissionConfig::overloaded_wait`.
const OVERLOADED_WAIT_DISPATCHES: f64 = 5.0;

/// Dispatches a rate window holds before it may close early (see `count_dispatch`).
const RATE_WINDOW_SAMPLES: u64 = 64;
/// The shortest rate window, in nanoseconds (5 ms).
const RATE_WINDOW_MIN_NANOS: u64 = 5_000_000;

/// All admission constants of a shard.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct AdmissionConfig {
    /// Delay-based shedding.
    pub codel: CodelConfig,
    /// Adaptive concurrency limit on requests in execution.
    pub concurrency: ConcurrencyLimitConfig,
    /// Bound on queued requests (4096); arrivals beyond it are shed at once.
    pub queue_capacity: usize,
    /// Serve newest first while overloaded (false: with `shed_at_enqueue` the queue holds a
    /// few milliseconds of work, so FIFO waits little and leaves nothing to age and be shed).
    pub adaptive_lifo: bool,
    /// Period of the shard's event-loop lag probe (1 ms); zero turns the probe off, and with
    /// it the count of the wait before a request is read.
    pub lag_probe_interval: Duration,
    /// While overloaded, keep at most the requests that can be dispatched within
    /// `overloaded_wait` (the measured dispatch rate × that wait, at least the concurrency
    /// limit), and turn further arrivals, and arrivals known to have waited longer than
    /// that already, away at enqueue, from the header (true).
    pub shed_at_enqueue: bool,
    /// The longest wait before admission that a request is served after while the shard is
    /// overloaded: this (750 us) or the time the shard takes to dispatch five requests at
    /// its measured rate (`OVERLOADED_WAIT_DISPATCHES`), whichever is longer, and
    /// never more than half the CoDel target. Turned away, a request costs the shard little;
    /// served after a longer wait, it is answered later than the light-load latency a client
    /// expects. With heavy requests, fresh ones are scarcer, and a shorter wait would leave
    /// the shard idle. Why: docs/decisions/2026-11-26-admitted-latency-under-overload.md.
    pub overloaded_wait: Duration,
    /// While overloaded, a connection or shard at its in-flight cap keeps reading and answers
    /// the excess `Overloaded` from the header instead of pausing its socket, so the excess
    /// does not age unseen in the kernel (true). Not overloaded, the cap pauses the socket.
    pub reject_over_cap: bool,
    /// Serve the bounded backlog of a connection that slows down when held back, and turn
    /// away only the excess of one whose backlog keeps growing ([`crate::backlog`]) (false:
    /// several open-loop connections that each grow slowly are held back, and served in
    /// order, for about half a second before they are seen pushing; the server's reader
    /// reads a held-back connection ahead into its own bounded buffer, so that a small
    /// socket buffer no longer hides the growth).
    pub pace_windows: bool,
    /// The concurrency limit never falls below what the shard dispatches in this window at
    /// its measured rate (500 us). On a shard whose requests run one after another on one
    /// thread, a request's latency includes the rest of its event-loop turn, so it grows with
    /// the limit even without a hidden queue and the gradient would settle at its minimum,
    /// where each turn's fixed costs (an `epoll_wait`, a journal `write(2)`, a `send` per
    /// connection) are shared by too few requests. The floor bounds the queue hidden behind
    /// the limit to this window, small against the CoDel target, whatever the requests cost.
    /// Zero turns it off. Figures, and why the window is not wider:
    /// docs/decisions/2026-11-24-concurrency-floor-superseded-versions-writeback.md and
    /// 2026-11-25-read-ahead-that-reads-ahead.md.
    pub concurrency_floor_window: Duration,
    /// A write answered after a group fsync (`--durability batch`) is turned away
    /// `Overloaded` when it is expected to wait for that fsync longer than two bare fsyncs
    /// (the rest of one in progress, then its own) plus this: the fsync is shared by every
    /// write admitted meanwhile, so the writes beyond what it covers in time would lengthen
    /// it for all of them. Zero (the default) turns it off: on a disk whose fsyncs vary, the
    /// estimate also turns writes away at a light load. Why:
    /// docs/decisions/2026-11-26-admission-sees-the-group-fsync.md.
    pub group_commit_wait: Duration,
}

impl Default for AdmissionConfig {
    /// CoDel 5 ms / 100 ms, limit from 4 in [4, 1024] and at least 500 us of dispatches,
    /// queue 4096, FIFO, lag probe every 1 ms, shedding at enqueue past a 750 us wait (or
    /// five dispatches) and rejection over the in-flight caps while overloaded; no write
    /// turned away for its group fsync.
    fn default() -> AdmissionConfig {
        AdmissionConfig {
            codel: CodelConfig::default(),
            concurrency: ConcurrencyLimitConfig::default(),
            queue_capacity: 4096,
            adaptive_lifo: false,
            lag_probe_interval: Duration::from_millis(1),
            shed_at_enqueue: true,
            overloaded_wait: Duration::from_micros(750),
            reject_over_cap: true,
            pace_windows: false,
            concurrency_floor_window: Duration::from_micros(500),
            group_commit_wait: Duration::ZERO,
        }
    }
}

impl AdmissionConfig {
    /// True if a write expected to wait `expected` for its group fsync, whose bare cost is
    /// `fsync`, is to be turned away: it would wait longer than two bare fsyncs (the rest of
    /// one in progress, then its own) plus [`Self::group_commit_wait`]. Never when that is
    /// zero (off).
    #[inline]
    pub fn group_commit_too_long(&self, expected: Duration, fsync: Duration) -> bool {
        !self.group_commit_wait.is_zero()
            && expected
                > fsync
                    .saturating_mul(2)
                    .saturating_add(self.group_commit_wait)
    }
}

/// Shard admission counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Requests queued.
    pub enqueued: u64,
    /// Requests turned away at enqueue: the queue was full, or (while overloaded) held what
    /// can be dispatched within the overloaded wait.
    pub shed_full: u64,
    /// Of `shed_full`, those turned away by the overloaded bound while the queue had room.
    pub shed_enqueue: u64,
    /// Requests shed for queue delay (CoDel).
    pub shed_delay: u64,
    /// Requests dropped because their deadline passed while queued.
    pub expired: u64,
    /// Requests dispatched for execution.
    pub dispatched: u64,
    /// Requests completed.
    pub completed: u64,
}

/// When a request reached the shard, as its connection's reader knows it: on the shard's
/// clock (`Nanos`), or as the reader took it (an `Instant`, say) until [`Arrival::map`]
/// converts it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Arrival<T = Nanos> {
    /// Its header was read at this time, after a wait in the kernel socket buffer that is
    /// estimated as the event loop's lag.
    Read(T),
    /// Its bytes reached the kernel at this time (a receive timestamp of the read): the
    /// wait before the read is known, nothing is estimated.
    Received(T),
}

impl<T> Arrival<T> {
    /// The time itself, read or received.
    #[inline]
    pub fn at(self) -> T {
        match self {
            Arrival::Read(at) | Arrival::Received(at) => at,
        }
    }

    /// The same kind of arrival at `f(time)`: another clock, or a later time.
    #[inline]
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Arrival<U> {
        match self {
            Arrival::Read(at) => Arrival::Read(f(at)),
            Arrival::Received(at) => Arrival::Received(f(at)),
        }
    }
}

impl<T> From<T> for Arrival<T> {
    /// An arrival known only from the instant of its read.
    fn from(at: T) -> Arrival<T> {
        Arrival::Read(at)
    }
}

impl Arrival {
    /// The arrival time, with the loop's `lag` standing in for an unknown wait before the read.
    #[inline]
    fn with_lag(self, lag: Duration) -> Nanos {
        match self {
            Arrival::Read(at) => Nanos(at.0.saturating_sub(duration_nanos(lag))),
            Arrival::Received(at) => at,
        }
    }
}

/// A queued request with its arrival time and deadline.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Queued<T> {
    /// The caller's request handle (e.g. stream id and buffer index).
    pub item: T,
    /// When it arrived, as estimated: its header was read at the `now` given to
    /// [`AdmissionController::enqueue`], after waiting about the event loop's lag unread.
    pub enqueued: Nanos,
    /// Its absolute deadline.
    pub deadline: Deadline,
    /// Its connection obeys backpressure ([`AdmissionController::enqueue_paced`]): the queue
    /// turns it away only when its deadline has passed, never for its wait.
    pub paced: bool,
}

/// The per-shard admission controller and its bounded queue.
#[derive(Debug)]
pub struct AdmissionController<T> {
    queue: VecDeque<Queued<T>>,
    capacity: usize,
    lifo: bool,
    codel: Codel,
    limit: ConcurrencyLimit,
    inflight: u32,
    stats: AdmissionStats,
    lag: LoopLag,
    target: u64,
    interval: u64,
    shed_at_enqueue: bool,
    /// `AdmissionConfig::overloaded_wait`, at most half the target (nanoseconds).
    overloaded_wait_floor: u64,
    /// The overloaded wait at the last measured rate (nanoseconds): the floor, or
    /// `OVERLOADED_WAIT_DISPATCHES` dispatches if longer, at most half the target.
    overloaded_wait: u64,
    reject_over_cap: bool,
    /// When the latest arrival reached the queue, and its age then (nanoseconds).
    last_arrival: (Nanos, u64),
    /// The overloaded bound on the queue as last computed (`usize::MAX`: none).
    bound: usize,
    /// Dispatches counted since `rate_since`, and the last measured rate (per second).
    rate_count: u64,
    rate_since: Nanos,
    dispatch_rate: f64,
    /// `concurrency_floor_window` in nanoseconds, and the floor it gave at the last rate.
    floor_window: u64,
    floor: u32,
}

impl<T> AdmissionController<T> {
    /// A controller with an empty queue, allocated once to its capacity.
    pub fn new(cfg: AdmissionConfig) -> AdmissionController<T> {
        let capacity = cfg.queue_capacity.max(1);
        let wait_floor =
            duration_nanos(cfg.overloaded_wait).min(duration_nanos(cfg.codel.target) / 2);
        AdmissionController {
            queue: VecDeque::with_capacity(capacity),
            capacity,
            lifo: cfg.adaptive_lifo,
            codel: Codel::new(cfg.codel),
            limit: ConcurrencyLimit::new(cfg.concurrency),
            inflight: 0,
            stats: AdmissionStats::default(),
            lag: LoopLag::default(),
            target: duration_nanos(cfg.codel.target),
            interval: duration_nanos(cfg.codel.interval).max(1),
            shed_at_enqueue: cfg.shed_at_enqueue,
            overloaded_wait_floor: wait_floor,
            overloaded_wait: wait_floor,
            reject_over_cap: cfg.reject_over_cap,
            last_arrival: (Nanos::ZERO, 0),
            bound: usize::MAX,
            rate_count: 0,
            rate_since: Nanos::ZERO,
            dispatch_rate: 0.0,
            floor_window: duration_nanos(cfg.concurrency_floor_window),
            floor: 0,
        }
    }

    /// The limit on requests in execution: the adaptive limit, or the rate floor if higher.
    #[inline]
    fn limit(&self) -> u32 {
        self.limit.limit().max(self.floor)
    }

    /// Queues a request whose header was just read at `now`; see [`Self::enqueue_read`].
    #[inline]
    pub fn enqueue(&mut self, item: T, now: Nanos, deadline: Deadline) -> Result<(), T> {
        self.enqueue_read(item, Arrival::Read(now), now, deadline)
    }

    /// Queues a request that arrived at `arrival` (its socket read, or the kernel's receive
    /// stamp of it) and reaches admission at `now` (later if the reader worked through other
    /// frames of that read first). `Err` gives it back, to be answered `Overloaded` from the header alone, when
    /// the queue is full or, while overloaded, already holds what can be dispatched within
    /// the overloaded wait: what waits longer will be shed anyway, and shedding it later costs
    /// more than turning it away now.
    ///
    /// Its age counts from before the read: it waited about the loop's lag unread, unless
    /// the kernel's stamp says how long.
    #[inline]
    pub fn enqueue_read(
        &mut self,
        item: T,
        arrival: Arrival,
        now: Nanos,
        deadline: Deadline,
    ) -> Result<(), T> {
        let len = self.queue.len();
        if len >= self.capacity {
            self.stats.shed_full += 1;
            self.codel.on_turned_away(now);
            return Err(item);
        }
        let arrived = arrival.with_lag(self.lag.estimate(now));
        self.last_arrival = (now, now.0.saturating_sub(arrived.0));
        if len >= self.overload_bound(now) || self.too_old_to_admit(now, arrival) {
            self.stats.shed_full += 1;
            self.stats.shed_enqueue += 1;
            self.codel.on_turned_away(now);
            return Err(item);
        }
        self.stats.enqueued += 1;
        self.queue.push_back(Queued {
            item,
            enqueued: arrived,
            deadline,
            paced: false,
        });
        Ok(())
    }

    /// Queues a request of a connection that obeys backpressure (see [`crate::backlog`]):
    /// its backlog is bounded by its client's window, so neither its age nor the overloaded
    /// bound turns it away at enqueue; only a full queue does. Its age still feeds CoDel's
    /// standing delay (so that an overload is seen and watched), but its wait in the queue
    /// counts from `now`: the wait before was the client's window, held back on purpose.
    #[inline]
    pub fn enqueue_paced(
        &mut self,
        item: T,
        arrival: Arrival,
        now: Nanos,
        deadline: Deadline,
    ) -> Result<(), T> {
        if self.queue.len() >= self.capacity {
            self.stats.shed_full += 1;
            self.codel.on_turned_away(now);
            return Err(item);
        }
        let arrived = arrival.with_lag(self.lag.estimate(now));
        self.last_arrival = (now, now.0.saturating_sub(arrived.0));
        self.stats.enqueued += 1;
        self.queue.push_back(Queued {
            item,
            enqueued: now,
            deadline,
            paced: true,
        });
        Ok(())
    }

    /// [`Self::dispatch_at_once`] for a request of a connection that obeys backpressure: its
    /// age is CoDel's sample but never a reason to turn it away (see [`Self::enqueue_paced`]).
    #[inline]
    pub fn dispatch_paced_at_once(
        &mut self,
        arrival: Arrival,
        now: Nanos,
        deadline: Deadline,
    ) -> Option<Duration> {
        if !self.queue.is_empty() || self.inflight >= self.limit() || deadline.expired(now) {
            return None;
        }
        let arrived = arrival.with_lag(self.lag.estimate(now));
        let waited = now.saturating_duration_since(arrived);
        self.last_arrival = (now, now.0.saturating_sub(arrived.0));
        self.overload_bound(now);
        self.stats.enqueued += 1;
        self.codel.on_dequeue(waited, now);
        self.inflight += 1;
        self.stats.dispatched += 1;
        self.count_dispatch(now);
        Some(waited)
    }

    /// The fast path of an arrival that finds the queue empty and a free execution place:
    /// exactly what [`Self::enqueue_read`] then [`Self::dispatch`] would do in that case,
    /// without going through the queue. Returns the time it waited (the queue-delay sample),
    /// or `None` when it must take that path instead: something waits, the limit is
    /// reached, or the queue would turn it away (expired, or CoDel sheds it).
    #[inline]
    pub fn dispatch_at_once(
        &mut self,
        arrival: Arrival,
        now: Nanos,
        deadline: Deadline,
    ) -> Option<Duration> {
        if !self.queue.is_empty() || self.inflight >= self.limit() {
            return None;
        }
        let arrived = arrival.with_lag(self.lag.estimate(now));
        let waited = now.saturating_duration_since(arrived);
        // `should_shed` only rolls the interval at `now`: asking twice is harmless.
        if deadline.expired(now)
            || self.codel.should_shed(now, waited)
            || self.too_old_to_admit(now, arrival)
        {
            return None;
        }
        self.last_arrival = (now, now.0.saturating_sub(arrived.0));
        self.overload_bound(now);
        self.stats.enqueued += 1;
        self.codel.on_dequeue(waited, now);
        self.inflight += 1;
        self.stats.dispatched += 1;
        self.count_dispatch(now);
        Some(waited)
    }

    /// The standing-delay sample while the queue is empty: the wait a request arriving now
    /// would already have, i.e. the loop lag, or the age the latest arrival had on reaching
    /// the queue if that was recent (a reader working through a backlog of old frames keeps
    /// the queue empty without the shard being idle).
    #[inline]
    fn empty_queue_delay(&self, now: Nanos) -> Duration {
        let lag = self.lag.estimate(now);
        let (at, age) = self.last_arrival;
        if now.0.saturating_sub(at.0) <= self.target {
            lag.max(Duration::from_nanos(age))
        } else {
            lag
        }
    }

    /// True if an arrival is turned away for its age: overloaded (and configured to shed at
    /// enqueue), it is known to have waited longer than the overloaded wait already (the
    /// wait the queue keeps to while overloaded), in the kernel (its receive stamp) or behind the
    /// frames read before it. A reader that runs requests itself keeps the queue empty, so
    /// the queue's length alone would leave the delay to the backlog in the socket, which
    /// then sets every served request's wait. The loop-lag estimate does not count here: it
    /// is one figure for every frame of a read, fresh or not, and turning away by it would
    /// turn away the fresh ones too.
    #[inline]
    fn too_old_to_admit(&mut self, now: Nanos, arrival: Arrival) -> bool {
        self.shed_at_enqueue
            && now.0.saturating_sub(arrival.at().0) > self.overloaded_wait
            && self.codel.is_overloaded(now)
    }

    /// Queue length beyond which arrivals are turned away: unbounded unless overloaded, then
    /// what the shard dispatches within the overloaded wait at its measured rate (at least
    /// the concurrency limit, so that a shard that measured no rate yet still serves). Also
    /// remembered for [`Self::turn_away_at_once`].
    #[inline]
    fn overload_bound(&mut self, now: Nanos) -> usize {
        let bound = if self.shed_at_enqueue && self.codel.is_overloaded(now) {
            // Nanoseconds / 1e9 for seconds.
            let within_wait = self.dispatch_rate * self.overloaded_wait as f64 / 1e9;
            (within_wait as usize).max(self.limit() as usize)
        } else {
            usize::MAX
        };
        self.bound = bound;
        bound
    }

    /// The cheapest rejection: true (and counted) if an arrival is to be turned away at
    /// enqueue by the overloaded bound as last computed (at the latest dispatch or probe,
    /// so at most a probe period old), without reading the clock. The caller answers it
    /// `Overloaded` from the header; a `false` says nothing, [`Self::enqueue_read`] decides.
    #[inline]
    pub fn turn_away_at_once(&mut self) -> bool {
        if self.queue.len() < self.bound {
            return false;
        }
        self.stats.shed_full += 1;
        self.stats.shed_enqueue += 1;
        self.codel.note_turned_away();
        true
    }

    /// The probe task became ready at `now` (see [`LoopLag`]).
    #[inline]
    pub fn lag_probe_started(&mut self, now: Nanos) {
        self.lag.probe_started(now);
    }

    /// The probe task ran at `now`: records the loop lag and feeds it to CoDel as a standing
    /// delay sample (with the queue's own delay, if longer), so that a saturated loop is
    /// seen as overloaded even while the queue looks short. Returns the lag.
    pub fn lag_probe_finished(&mut self, now: Nanos) -> Duration {
        let lag = self.lag.probe_finished(now);
        let sample = match self.queue.front() {
            Some(q) => lag.max(now.saturating_duration_since(q.enqueued)),
            None => self.empty_queue_delay(now),
        };
        self.codel.on_dequeue(sample, now);
        self.overload_bound(now);
        lag
    }

    /// The current estimate of the wait before a request's header is read (the loop lag).
    #[inline]
    pub fn hidden_delay(&self, now: Nanos) -> Duration {
        self.lag.estimate(now)
    }

    /// True if a connection or the shard at its in-flight cap should read on and turn the
    /// excess away (overloaded, and configured so) rather than pause its socket.
    #[inline]
    pub fn reject_over_cap(&mut self, now: Nanos) -> bool {
        self.reject_over_cap && self.codel.is_overloaded(now)
    }

    /// True if a request may be dispatched now (under the concurrency limit, queue not empty).
    #[inline]
    pub fn can_dispatch(&self) -> bool {
        self.inflight < self.limit() && !self.queue.is_empty()
    }

    /// Takes the next request to execute, or `None` when the queue is empty or the
    /// concurrency limit is reached. Requests found expired or too old on the way are passed
    /// to `reject` with [`Verdict::Expired`] or [`Verdict::Shed`]; the caller answers them.
    pub fn dispatch(
        &mut self,
        now: Nanos,
        mut reject: impl FnMut(T, Verdict),
    ) -> Option<Queued<T>> {
        self.overload_bound(now);
        if self.inflight >= self.limit() {
            return None;
        }
        // Drop from the old end first: they waited longest.
        let mut oldest_dropped = None;
        while let Some(head) = self.queue.front() {
            let waited = now.saturating_duration_since(head.enqueued);
            let verdict = if head.deadline.expired(now) {
                Verdict::Expired
            } else if !head.paced && self.codel.should_shed(now, waited) {
                Verdict::Shed
            } else {
                break;
            };
            oldest_dropped.get_or_insert(waited);
            if let Some(q) = self.queue.pop_front() {
                self.count_reject(verdict);
                reject(q.item, verdict);
            }
        }
        // The standing delay is the age of the oldest request, whichever end is served; a
        // request dropped for its age counts too (an emptied queue is not an idle one).
        let Some(head) = self.queue.front() else {
            let sample = oldest_dropped.unwrap_or_else(|| self.empty_queue_delay(now));
            self.codel.on_dequeue(sample, now);
            return None;
        };
        let sample = oldest_dropped.unwrap_or_else(|| now.saturating_duration_since(head.enqueued));
        self.codel.on_dequeue(sample, now);
        let newest_first = self.lifo && self.codel.is_overloaded(now);
        loop {
            let next = if newest_first {
                self.queue.pop_back()
            } else {
                self.queue.pop_front()
            };
            let q = next?;
            if q.deadline.expired(now) {
                self.count_reject(Verdict::Expired);
                reject(q.item, Verdict::Expired);
                continue;
            }
            self.inflight += 1;
            self.stats.dispatched += 1;
            self.count_dispatch(now);
            return Some(q);
        }
    }

    /// Reports the completion of a dispatched request that executed for `latency`.
    #[inline]
    pub fn on_complete(&mut self, latency: Duration, now: Nanos) {
        let inflight = self.inflight;
        self.on_turned_away_after_dispatch();
        self.limit.on_sample(latency, inflight, now);
    }

    /// Reports a dispatched request that was turned away before it executed (its deadline
    /// passed, its partition is rate limited): it frees its place but is no latency sample,
    /// which would tell the concurrency limit that the shard is faster than it is.
    #[inline]
    pub fn on_turned_away_after_dispatch(&mut self) {
        self.inflight = self.inflight.saturating_sub(1);
        self.stats.completed += 1;
    }

    /// Removes every queued request for which `dead` is true (e.g. its client disconnected),
    /// without answering them.
    pub fn drop_where(&mut self, mut dead: impl FnMut(&T) -> bool) -> usize {
        let before = self.queue.len();
        self.queue.retain(|q| !dead(&q.item));
        before - self.queue.len()
    }

    /// Measures the dispatch rate over windows of [`RATE_WINDOW_SAMPLES`] dispatches and at
    /// least [`RATE_WINDOW_MIN_NANOS`], or one CoDel interval if that comes first. A busy shard
    /// measures every few milliseconds, so that when load jumps after a quiet spell the floor
    /// follows within a few windows: measured once per interval, the shard would spend that
    /// interval at the adaptive limit's minimum, where a turn costs the most per request,
    /// build a standing queue and shed load it has the capacity for. A slow shard still
    /// counts enough dispatches for a steady rate.
    #[inline]
    fn count_dispatch(&mut self, now: Nanos) {
        self.rate_count += 1;
        let elapsed = now.0.saturating_sub(self.rate_since.0);
        let window_full =
            self.rate_count >= RATE_WINDOW_SAMPLES && elapsed >= RATE_WINDOW_MIN_NANOS;
        if window_full || elapsed >= self.interval {
            self.dispatch_rate = self.rate_count as f64 * 1e9 / elapsed as f64;
            let floor = self.dispatch_rate * self.floor_window as f64 / 1e9;
            self.floor = (floor as u32).min(self.limit.max());
            let dispatches = (OVERLOADED_WAIT_DISPATCHES * 1e9 / self.dispatch_rate) as u64;
            // The floor is at most half the target (see `new`), so the range is not empty.
            self.overloaded_wait = dispatches.clamp(self.overloaded_wait_floor, self.target / 2);
            self.rate_count = 0;
            self.rate_since = now;
        }
    }

    fn count_reject(&mut self, v: Verdict) {
        match v {
            Verdict::Expired => self.stats.expired += 1,
            Verdict::Shed => self.stats.shed_delay += 1,
            Verdict::Serve => {}
        }
    }

    /// Requests waiting in the queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Requests in execution.
    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    /// The current concurrency limit (the adaptive limit or the rate floor, if higher).
    pub fn concurrency_limit(&self) -> u32 {
        self.limit()
    }

    /// True while the shard is in the overloaded (shedding, LIFO) state.
    pub fn is_overloaded(&mut self, now: Nanos) -> bool {
        self.codel.is_overloaded(now)
    }

    /// Counters.
    pub fn stats(&self) -> AdmissionStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    fn at_ms(x: u64) -> Nanos {
        Nanos::from_millis(x)
    }

    proptest::proptest! {
        /// The fast path changes nothing but the cost: a controller that tries
        /// `dispatch_at_once` first ends every step in the state of one that always queues.
        #[test]
        fn dispatch_at_once_is_the_queue_path_without_the_queue(
            steps in proptest::collection::vec((0u8..4, 0u64..30, 0u64..200), 1..400),
        ) {
            let cfg = AdmissionConfig {
                queue_capacity: 8,
                ..AdmissionConfig::default()
            };
            let mut fast: AdmissionController<u32> = AdmissionController::new(cfg);
            let mut queued: AdmissionController<u32> = AdmissionController::new(cfg);
            let (mut fast_running, mut queued_running) = (Vec::new(), Vec::new());
            let mut now = Nanos::ZERO;
            for (i, (kind, age_ms, budget_ms)) in steps.into_iter().enumerate() {
                let id = i as u32;
                now = Nanos(now.0 + 700_000);
                match kind {
                    // An arrival read `age_ms` ago with `budget_ms` of deadline left.
                    0 | 1 => {
                        let read = Nanos(now.0.saturating_sub(age_ms * 1_000_000));
                        let deadline = Deadline(Nanos(read.0 + budget_ms * 1_000_000));
                        let dispatch_all = |c: &mut AdmissionController<u32>, running: &mut Vec<u32>| {
                            while c.can_dispatch() {
                                match c.dispatch(now, |_, _| {}) {
                                    Some(q) => running.push(q.item),
                                    None => break,
                                }
                            }
                        };
                        if fast.dispatch_at_once(Arrival::Read(read), now, deadline).is_some() {
                            fast_running.push(id);
                        } else if fast.enqueue_read(id, Arrival::Read(read), now, deadline).is_ok() {
                            dispatch_all(&mut fast, &mut fast_running);
                        }
                        if queued.enqueue_read(id, Arrival::Read(read), now, deadline).is_ok() {
                            dispatch_all(&mut queued, &mut queued_running);
                        }
                    }
                    // The oldest running request completes after a few milliseconds.
                    2 => {
                        if !fast_running.is_empty() {
                            fast_running.remove(0);
                            fast.on_complete(Duration::from_millis(age_ms), now);
                        }
                        if !queued_running.is_empty() {
                            queued_running.remove(0);
                            queued.on_complete(Duration::from_millis(age_ms), now);
                        }
                    }
                    // The loop-lag probe.
                    _ => {
                        fast.lag_probe_started(now);
                        queued.lag_probe_started(now);
                        let later = Nanos(now.0 + age_ms * 100_000);
                        fast.lag_probe_finished(later);
                        queued.lag_probe_finished(later);
                    }
                }
                proptest::prop_assert_eq!(&fast_running, &queued_running);
                proptest::prop_assert_eq!(fast.stats(), queued.stats());
                proptest::prop_assert_eq!(fast.inflight(), queued.inflight());
                proptest::prop_assert_eq!(fast.queued(), queued.queued());
                proptest::prop_assert_eq!(fast.concurrency_limit(), queued.concurrency_limit());
                proptest::prop_assert_eq!(fast.turn_away_at_once(), queued.turn_away_at_once());
            }
        }
    }

    #[test]
    fn dispatch_at_once_only_when_nothing_waits_and_there_is_room() {
        let mut cfg = AdmissionConfig::default();
        cfg.concurrency.initial = 1;
        cfg.concurrency.min = 1;
        cfg.concurrency.max = 1;
        let mut c: AdmissionController<u32> = AdmissionController::new(cfg);
        let far = Deadline(at_ms(1_000));
        // Read 2 ms ago, nothing running: runs at once, and the wait is its sample.
        assert_eq!(
            c.dispatch_at_once(Arrival::Read(at_ms(8)), at_ms(10), far),
            Some(ms(2))
        );
        assert_eq!((c.inflight(), c.stats().dispatched), (1, 1));
        // The only place is taken: the queue decides.
        assert_eq!(
            c.dispatch_at_once(Arrival::Read(at_ms(10)), at_ms(10), far),
            None
        );
        c.on_complete(ms(1), at_ms(11));
        // Expired on arrival: the queue answers it, not the fast path.
        assert_eq!(
            c.dispatch_at_once(Arrival::Read(at_ms(5)), at_ms(12), Deadline(at_ms(11))),
            None
        );
        // Something queued: it goes first.
        c.enqueue(7, at_ms(12), far).unwrap();
        assert_eq!(
            c.dispatch_at_once(Arrival::Read(at_ms(12)), at_ms(12), far),
            None
        );
    }

    #[test]
    fn a_write_is_turned_away_only_past_two_bare_fsyncs_and_the_group_commit_wait() {
        let cfg = AdmissionConfig {
            group_commit_wait: Duration::from_micros(2500),
            ..AdmissionConfig::default()
        };
        let fsync = ms(1);
        // Two bare fsyncs plus 2.5 ms: 4.5 ms.
        assert!(!cfg.group_commit_too_long(Duration::from_micros(4500), fsync));
        assert!(cfg.group_commit_too_long(Duration::from_micros(4501), fsync));
        // A slow disk's bare fsync raises the bound with it.
        assert!(!cfg.group_commit_too_long(ms(40), ms(20)));
        assert!(cfg.group_commit_too_long(ms(43), ms(20)));
        let off = AdmissionConfig::default();
        assert!(
            !off.group_commit_too_long(Duration::from_secs(10), fsync),
            "off by default"
        );
    }

    #[test]
    fn codel_enters_and_leaves_overload() {
        let mut c = Codel::new(CodelConfig::default());
        // Low delay for a second: never overloaded, nothing shed under 100 ms of waiting.
        for t in 0..1_000 {
            c.on_dequeue(ms(1), at_ms(t));
            assert!(!c.is_overloaded(at_ms(t)));
            assert!(!c.should_shed(at_ms(t), ms(50)));
        }
        assert!(
            c.should_shed(at_ms(1_000), ms(101)),
            "max queue delay always applies"
        );
        // A standing delay of 6 ms for a whole interval: overloaded at the next boundary.
        for t in 1_000..1_250 {
            c.on_dequeue(ms(6), at_ms(t));
        }
        assert!(c.is_overloaded(at_ms(1_250)));
        assert!(c.should_shed(at_ms(1_250), ms(11)));
        assert!(!c.should_shed(at_ms(1_250), ms(9)));
        // The queue drains once (delay 0): overload ends at the following boundary.
        c.on_dequeue(Duration::ZERO, at_ms(1_260));
        for t in 1_261..1_300 {
            c.on_dequeue(ms(6), at_ms(t));
        }
        assert!(!c.is_overloaded(at_ms(1_300)));
        // ... and resumes after another full interval with a standing queue.
        for t in 1_300..1_400 {
            c.on_dequeue(ms(6), at_ms(t));
        }
        assert!(c.is_overloaded(at_ms(1_400)));
    }

    fn controller(lifo: bool) -> AdmissionController<u32> {
        AdmissionController::new(AdmissionConfig {
            queue_capacity: 8,
            adaptive_lifo: lifo,
            ..AdmissionConfig::default()
        })
    }

    #[test]
    fn fifo_when_calm_and_bounded_queue() {
        let mut a = controller(true);
        let d = Deadline(at_ms(1_000));
        for i in 0..8 {
            assert!(a.enqueue(i, at_ms(0), d).is_ok());
        }
        assert_eq!(a.enqueue(8, at_ms(0), d), Err(8), "queue is bounded");
        let mut rejected = Vec::new();
        let order: Vec<u32> = (0..3)
            .filter_map(|_| a.dispatch(at_ms(1), |i, v| rejected.push((i, v))))
            .map(|q| q.item)
            .collect();
        assert_eq!(order, vec![0, 1, 2]);
        assert!(rejected.is_empty());
        assert_eq!(a.inflight(), 3);
        a.on_complete(ms(1), at_ms(2));
        assert_eq!(a.inflight(), 2);
        assert_eq!(a.stats().shed_full, 1);
    }

    #[test]
    fn requests_turned_away_after_dispatch_free_their_place_but_are_no_latency_sample() {
        // Two shards see the same traffic: every request is turned away right after dispatch
        // (rate limited, expired), on one shard reported as such, on the other as a
        // completion in 1 µs. Both free the place; only the second feeds the limit.
        let (mut turned, mut sampled) = (controller(false), controller(false));
        let initial = turned.concurrency_limit();
        for t in 0..5_000u64 {
            for a in [&mut turned, &mut sampled] {
                a.enqueue(t as u32, at_ms(t), Deadline(at_ms(t + 1_000)))
                    .unwrap();
                assert!(a.dispatch(at_ms(t), |_, _| {}).is_some());
            }
            turned.on_turned_away_after_dispatch();
            sampled.on_complete(Duration::from_micros(1), at_ms(t));
            assert_eq!((turned.inflight(), sampled.inflight()), (0, 0));
        }
        assert_eq!(turned.stats().completed, 5_000);
        assert_eq!(turned.concurrency_limit(), initial, "no sample, no change");
    }

    #[test]
    fn expired_requests_are_never_dispatched() {
        let mut a = controller(true);
        a.enqueue(1, at_ms(0), Deadline(at_ms(5))).unwrap();
        a.enqueue(2, at_ms(0), Deadline(at_ms(50))).unwrap();
        let mut rejected = Vec::new();
        let got = a.dispatch(at_ms(10), |i, v| rejected.push((i, v)));
        assert_eq!(got.map(|q| q.item), Some(2));
        assert_eq!(rejected, vec![(1, Verdict::Expired)]);
        assert_eq!(a.stats().expired, 1);
    }

    #[test]
    fn overload_serves_newest_first_and_sheds_the_oldest() {
        // Without the overloaded bound at enqueue, so that the queue keeps everything.
        let mut a = AdmissionController::new(AdmissionConfig {
            queue_capacity: 100_000,
            adaptive_lifo: true,
            shed_at_enqueue: false,
            ..AdmissionConfig::default()
        });
        let d = |t: u64| Deadline(at_ms(t + 1_000));
        let mut id = 0u32;
        let mut shed = 0;
        // Arrivals at 2 per ms, service at 1 per ms: a standing queue builds.
        for t in 0..400u64 {
            for _ in 0..2 {
                a.enqueue(id, at_ms(t), d(t)).unwrap();
                id += 1;
            }
            if let Some(q) = a.dispatch(at_ms(t), |_, v| {
                assert_eq!(v, Verdict::Shed);
                shed += 1;
            }) {
                a.on_complete(ms(1), at_ms(t));
                if t > 250 {
                    // Overloaded by now: the request served is the newest one.
                    assert!(a.is_overloaded(at_ms(t)));
                    assert!(
                        t.saturating_sub(u64::from(q.item) / 2) <= 1,
                        "t={t} item={}",
                        q.item
                    );
                }
            }
        }
        assert!(shed > 100, "old requests were shed: {shed}");
        // Nothing left in the queue is older than the slough time (plus one step).
        assert!(a.queued() <= 2 * 11 + 2, "{}", a.queued());
    }

    #[test]
    fn loop_lag_estimate_grows_while_the_probe_waits() {
        let mut l = LoopLag::default();
        assert_eq!(l.estimate(at_ms(5)), Duration::ZERO);
        assert_eq!(
            l.probe_finished(at_ms(5)),
            Duration::ZERO,
            "no probe started"
        );
        l.probe_started(at_ms(10));
        assert_eq!(l.estimate(at_ms(13)), ms(3), "stuck loop: the wait so far");
        assert_eq!(l.probe_finished(at_ms(14)), ms(4));
        assert_eq!(l.estimate(at_ms(100)), ms(4), "the last measurement holds");
        l.probe_started(at_ms(101));
        assert_eq!(l.estimate(at_ms(102)), ms(4), "never below the last one");
        assert_eq!(l.probe_finished(at_ms(102)), ms(1));
        assert_eq!(
            l.estimate(at_ms(102)),
            ms(4),
            "the longer of the last two trips"
        );
        l.probe_started(at_ms(103));
        assert_eq!(l.probe_finished(at_ms(105)), ms(2));
        assert_eq!(
            l.estimate(at_ms(105)),
            ms(2),
            "the 4 ms trip is two probes old"
        );
    }

    #[test]
    fn overloaded_only_arrivals_younger_than_the_overloaded_wait_are_admitted() {
        let now = at_ms(300);
        let aged = |us: u64| Arrival::Received(Nanos(now.0 - us * 1_000));
        let mut a = controller(false);
        probe(&mut a, 0, 300, ms(8));
        assert!(a.is_overloaded(now), "standing lag above target");
        // Stamped arrivals: their age is known, whatever the loop's lag.
        assert!(a.enqueue_read(1, aged(700), now, Deadline::NEVER).is_ok());
        assert!(a.enqueue_read(2, aged(800), now, Deadline::NEVER).is_err());
        assert!(a
            .dispatch_at_once(aged(800), now, Deadline::NEVER)
            .is_none());
        assert_eq!(a.stats().shed_enqueue, 1);
        // The wait never exceeds half the target, whatever it is set to.
        let mut b = AdmissionController::<u32>::new(AdmissionConfig {
            queue_capacity: 8,
            overloaded_wait: ms(50),
            ..AdmissionConfig::default()
        });
        probe(&mut b, 0, 300, ms(8));
        assert!(b.enqueue_read(1, aged(2_400), now, Deadline::NEVER).is_ok());
        assert!(b
            .enqueue_read(2, aged(2_600), now, Deadline::NEVER)
            .is_err());
        // Not overloaded, age turns nothing away.
        let mut c = controller(false);
        assert!(c.enqueue_read(1, aged(4_000), now, Deadline::NEVER).is_ok());
    }

    #[test]
    fn the_overloaded_wait_follows_a_slow_dispatch_rate() {
        // Requests of 400 us, one dispatched at a time: five of them take 2 ms, longer than
        // the 750 us floor, so that fresh requests are not too scarce to keep the shard busy.
        let mut a = controller(false);
        let mut t = Nanos::ZERO;
        while t < at_ms(300) {
            a.dispatch_at_once(Arrival::Received(t), t, Deadline::NEVER)
                .expect("room and nothing queued");
            t = Nanos(t.0 + 400_000);
            a.on_complete(Duration::from_micros(400), t);
        }
        probe(&mut a, 300, 600, ms(8));
        let now = at_ms(600);
        assert!(a.is_overloaded(now));
        let aged = |us: u64| Arrival::Received(Nanos(now.0 - us * 1_000));
        assert!(a.enqueue_read(1, aged(1_900), now, Deadline::NEVER).is_ok());
        assert!(a
            .enqueue_read(2, aged(2_100), now, Deadline::NEVER)
            .is_err());
    }

    /// Probe samples of `lag` every millisecond from `from` to `to`.
    fn probe(a: &mut AdmissionController<u32>, from: u64, to: u64, lag: Duration) {
        for t in from..to {
            a.lag_probe_started(at_ms(t));
            a.lag_probe_finished(at_ms(t).saturating_add(lag));
        }
    }

    #[test]
    fn a_saturated_loop_is_overloaded_even_with_an_empty_queue() {
        let mut a = controller(false);
        probe(&mut a, 0, 300, Duration::from_micros(500));
        assert!(!a.is_overloaded(at_ms(300)), "lag under target");
        probe(&mut a, 300, 500, ms(8));
        assert!(a.is_overloaded(at_ms(500)), "standing lag above target");
        assert!(a.reject_over_cap(at_ms(500)));
        // A request read now waited about the lag unread: its age counts from before.
        a.enqueue_read(1, Arrival::Read(at_ms(500)), at_ms(500), Deadline::NEVER)
            .unwrap();
        let q = a.dispatch(at_ms(501), |_, _| panic!("nothing to shed"));
        assert_eq!(q.map(|q| q.enqueued), Some(at_ms(492)));
        probe(&mut a, 501, 700, Duration::from_micros(500));
        assert!(!a.is_overloaded(at_ms(700)), "the loop caught up");
        assert!(!a.reject_over_cap(at_ms(700)));
        let off = AdmissionConfig {
            reject_over_cap: false,
            ..AdmissionConfig::default()
        };
        let mut b = AdmissionController::<u32>::new(off);
        probe(&mut b, 0, 300, ms(8));
        assert!(b.is_overloaded(at_ms(300)) && !b.reject_over_cap(at_ms(300)));
    }

    #[test]
    fn a_kernel_stamp_replaces_the_lag_estimate() {
        let mut a = controller(false);
        probe(&mut a, 0, 10, ms(3));
        // Read at 10 ms: its unseen wait before the read is taken to be the loop's lag (3 ms).
        a.enqueue_read(1, Arrival::Read(at_ms(10)), at_ms(10), Deadline::NEVER)
            .unwrap();
        // Stamped by the kernel at 2 ms and read at 12 ms: it arrived at 2 ms, lag or not.
        a.enqueue_read(2, Arrival::Received(at_ms(2)), at_ms(12), Deadline::NEVER)
            .unwrap();
        let none = |_: u32, _: Verdict| panic!("nothing to shed");
        let first = a.dispatch(at_ms(12), none);
        assert_eq!(first.map(|q| (q.item, q.enqueued)), Some((1, at_ms(7))));
        let second = a.dispatch(at_ms(12), none);
        assert_eq!(second.map(|q| (q.item, q.enqueued)), Some((2, at_ms(2))));
    }

    #[test]
    fn old_frames_read_late_count_when_the_queue_is_empty() {
        // A reader works through frames read 20 ms ago: each is dispatched at once (the
        // queue stays empty), yet none of them is fresh.
        let mut a = controller(false);
        let mut turned_away = Vec::new();
        for t in 0..300u64 {
            let read_at = at_ms(t.saturating_sub(20));
            if a.enqueue_read(t as u32, Arrival::Read(read_at), at_ms(t), Deadline::NEVER)
                .is_err()
            {
                turned_away.push(t);
                continue;
            }
            let q = a.dispatch(at_ms(t), |_, _| {});
            if q.is_some() {
                a.on_complete(Duration::from_micros(100), at_ms(t));
            }
            assert!(a.dispatch(at_ms(t), |_, _| {}).is_none(), "empty queue");
        }
        assert!(a.is_overloaded(at_ms(300)));
        // Once overloaded, what is known to be older than the target is turned away, and
        // turning it away keeps the state overloaded.
        assert_eq!(turned_away.first(), Some(&200), "{turned_away:?}");
        assert_eq!(turned_away.len(), 100, "{turned_away:?}");
        // A fresh frame is still admitted.
        assert!(a
            .enqueue_read(1, Arrival::Read(at_ms(300)), at_ms(300), Deadline::NEVER)
            .is_ok());
    }

    #[test]
    fn overloaded_arrivals_beyond_what_is_dispatched_in_time_are_turned_away() {
        let mut a = AdmissionController::new(AdmissionConfig {
            queue_capacity: 100_000,
            ..AdmissionConfig::default()
        });
        let (mut id, mut turned_away) = (0u32, 0u32);
        // Arrivals at 4 per ms, service at 1 per ms: a standing queue, then overload.
        for t in 0..600u64 {
            for _ in 0..4 {
                id += 1;
                if a.enqueue(id, at_ms(t), Deadline::NEVER).is_err() {
                    turned_away += 1;
                }
            }
            if a.dispatch(at_ms(t), |_, _| {}).is_some() {
                a.on_complete(Duration::from_micros(900), at_ms(t));
            }
            if t >= 300 && t % 50 == 0 {
                // The queue is short (its requests wait less than the target), yet arrivals
                // are still turned away: the state holds.
                assert!(a.is_overloaded(at_ms(t)), "t={t}");
            }
        }
        assert!(a.is_overloaded(at_ms(600)));
        // At 1 dispatch per ms, the 750 us overloaded wait holds none: the concurrency limit
        // (at least 4) is the bound.
        let bound = a.concurrency_limit() as usize;
        assert!(a.queued() <= bound + 1, "{} > {bound}", a.queued());
        assert!(turned_away > 1_000, "{turned_away}");
        assert_eq!(a.stats().shed_enqueue, u64::from(turned_away));
        // The same decision without a clock read, from the bound of the latest dispatch.
        a.dispatch(at_ms(600), |_, _| {});
        while a.enqueue(id, at_ms(600), Deadline::NEVER).is_ok() {
            id += 1;
        }
        let counted = a.stats().shed_enqueue;
        assert!(a.turn_away_at_once());
        assert_eq!(a.stats().shed_enqueue, counted + 1);
        // Once the load is gone, the queue drains and the state ends.
        for t in 600..900u64 {
            if t % 4 == 0 {
                id += 1;
                let _ = a.enqueue(id, at_ms(t), Deadline::NEVER);
            }
            while a.dispatch(at_ms(t), |_, _| {}).is_some() {
                a.on_complete(Duration::from_micros(900), at_ms(t));
            }
        }
        assert!(!a.is_overloaded(at_ms(900)));
        a.dispatch(at_ms(900), |_, _| {});
        assert!(!a.turn_away_at_once(), "no bound once the overload ended");
        let before = a.stats().shed_enqueue;
        for i in 0..50 {
            a.enqueue(1_000_000 + i, at_ms(900), Deadline::NEVER)
                .unwrap();
        }
        assert_eq!(
            a.stats().shed_enqueue,
            before,
            "no bound when not overloaded"
        );
    }

    #[test]
    fn dropping_disconnected_requests() {
        let mut a = controller(false);
        for i in 0..6 {
            a.enqueue(i, at_ms(0), Deadline::NEVER).unwrap();
        }
        assert_eq!(a.drop_where(|i| i % 2 == 0), 3);
        assert_eq!(a.queued(), 3);
    }

    #[test]
    fn concurrency_limit_shrinks_on_hidden_queue_and_grows_when_used() {
        let cfg = ConcurrencyLimitConfig::default();
        let mut l = ConcurrencyLimit::new(cfg);
        let mut t = 0u64;
        // Latency 100 µs with the limit fully used: grows.
        for _ in 0..200 {
            t += 1;
            l.on_sample(
                Duration::from_micros(100),
                l.limit(),
                Nanos::from_micros(t * 500),
            );
        }
        let grown = l.limit();
        assert!(grown > cfg.initial, "{grown}");
        assert_eq!(l.baseline(), Some(Duration::from_micros(100)));
        // Latency 10x the baseline: shrinks, down to the minimum.
        let mut lowest = u32::MAX;
        for _ in 0..2_000 {
            t += 1;
            l.on_sample(
                Duration::from_millis(1),
                l.limit(),
                Nanos::from_micros(t * 500),
            );
            lowest = lowest.min(l.limit());
        }
        assert_eq!(lowest, cfg.min);
        // At the minimum the slower latency becomes the new baseline: the workload changed.
        assert_eq!(l.baseline(), Some(Duration::from_millis(1)));
        // App-limited (in flight far below the limit): no growth.
        let mut l2 = ConcurrencyLimit::new(cfg);
        for i in 0..1_000 {
            l2.on_sample(Duration::from_micros(100), 2, Nanos::from_micros(i * 500));
        }
        assert_eq!(l2.limit(), cfg.initial);
        // Bounded above.
        let mut l3 = ConcurrencyLimit::new(ConcurrencyLimitConfig { max: 40, ..cfg });
        for i in 0..10_000 {
            l3.on_sample(
                Duration::from_micros(100),
                1_000,
                Nanos::from_micros(i * 500),
            );
        }
        assert_eq!(l3.limit(), 40);
    }

    #[test]
    fn the_limit_never_falls_below_half_a_millisecond_of_dispatches() {
        // One request every `step`, each done before the next: the adaptive limit is never
        // used, so it stays at its minimum; the floor follows the dispatch rate.
        let run = |step: Duration| {
            let mut a = AdmissionController::<u32>::new(AdmissionConfig::default());
            let mut now = Nanos::ZERO;
            while now < Nanos::from_millis(300) {
                a.enqueue(0, now, Deadline::NEVER).unwrap();
                assert!(a.dispatch(now, |_, _| {}).is_some());
                a.on_complete(Duration::from_micros(5), now);
                now = now.saturating_add(step);
            }
            // Then a burst: how many run at once.
            for i in 0..200 {
                a.enqueue(i, now, Deadline::NEVER).unwrap();
            }
            let mut dispatched = 0;
            while a.dispatch(now, |_, _| {}).is_some() {
                dispatched += 1;
            }
            assert_eq!(dispatched, a.concurrency_limit());
            dispatched
        };
        let min = ConcurrencyLimitConfig::default().min;
        // 100,000/s: 50 in 500 us.
        let fast = run(Duration::from_micros(10));
        assert!((49..=51).contains(&fast), "{fast}");
        // 1,000/s: half a request in 500 us, the adaptive limit's minimum rules.
        assert_eq!(run(Duration::from_millis(1)), min);
    }

    #[test]
    fn the_floor_follows_a_jump_in_load_within_milliseconds() {
        let mut a = AdmissionController::<u32>::new(AdmissionConfig::default());
        let mut now = Nanos::ZERO;
        // Serves one request every `step` until `until`.
        let mut serve = |a: &mut AdmissionController<u32>, step: Duration, until: Nanos| {
            while now < until {
                a.enqueue(0, now, Deadline::NEVER).unwrap();
                assert!(a.dispatch(now, |_, _| {}).is_some());
                a.on_complete(Duration::from_micros(2), now);
                now = now.saturating_add(step);
            }
        };
        // 100,000/s, then a quiet second, then 200,000/s.
        serve(&mut a, Duration::from_micros(10), Nanos::from_millis(300));
        assert_eq!(a.concurrency_limit(), 50);
        serve(&mut a, Duration::from_secs(1), Nanos::from_millis(1_300));
        serve(&mut a, Duration::from_micros(5), Nanos::from_millis(1_315));
        // 200,000/s dispatch 100 in 500 us: within 15 ms of the jump the limit says so, where
        // a rate measured once per CoDel interval (100 ms) would still be at the minimum.
        assert_eq!(a.concurrency_limit(), 100);
    }
}
