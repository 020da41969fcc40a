//! The shard's admission controller: protects the shard, decided from the 9-byte frame header
//! alone. The decision point is `pipeline/admit.rs`; this is the state it consults.
//!
//! Order of the defences:
//!
//! 1. Backpressure, in `pipeline/admit.rs`: per-connection and per-shard caps on requests and
//!    request bytes in flight stop the reader from reading the socket while over a cap, so
//!    the client queues instead of the server. Nothing is rejected.
//! 2. Delay-based shedding, here: every execution request (QUERY, EXECUTE, BATCH, PREPARE)
//!    that obtained its in-flight slot is put in the shard's bounded
//!    [`AdmissionController`] queue, in front of an adaptive limit on requests in execution.
//!    CoDel measures the queue delay at dequeue and, while a standing delay persists, sheds
//!    from the old end and bounds the queue to what it dispatches within the overloaded wait
//!    (`AdmissionConfig::overloaded_wait`, 750 us or five dispatches at the measured rate;
//!    arrivals beyond are answered `Overloaded` from the header). Most requests run in their connection's reader and finish there, so
//!    the queue is mostly empty; what then waits is the backlog in the kernel, and an arrival
//!    known to have waited there longer than the overloaded wait is turned away too while
//!    overloaded. A shed request is
//!    answered with the pre-encoded `Overloaded` frame with only its stream id patched: its
//!    body is never decoded. A request of a client that disconnected is dropped from the
//!    queue without being answered.
//!
//! 3. The wait the queue cannot see: when the shard's event loop is saturated, requests also
//!    wait unread in the kernel socket buffer until their connection's reader runs again. A
//!    probe task per shard ([`crate::shard`]) measures the loop's lag; the controller counts it
//!    as part of each request's age and of CoDel's standing delay, so a saturated loop sheds
//!    even while the queue itself looks short. While overloaded, the queue keeps only what it
//!    can dispatch within the CoDel target and turns further arrivals away from the header,
//!    and a connection at its in-flight cap keeps reading and answers the excess `Overloaded`
//!    instead of pausing (see `pipeline/admit.rs`): reading and rejecting costs far less than
//!    leaving the excess to time out unseen in the kernel.
//!
//! Connection-state requests (OPTIONS, STARTUP, REGISTER, AUTH_RESPONSE) bypass the queue:
//! drivers use OPTIONS as a heartbeat, and shedding it would make them drop the connection.
//!
//! The queue lives in a slab of slots allocated once per shard, so admitting, shedding and
//! rejecting a request allocate nothing. Rejections are not logged one by one: aggregated
//! counts are logged at most once per second.

use std::cell::Cell;
use std::future::poll_fn;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use sluice_overload::{AdmissionController, AdmissionStats, Arrival, Deadline, Nanos, Verdict};
use sluice_protocol::frame::{FrameHeader, Opcode};
use sluice_storage::GroupCommitWait;
use tracing::info;

use crate::clock::ShardClock;
use crate::metrics::ShardMetrics;
use crate::shard::ShardCtx;
use crate::ServerConfig;

/// Aggregated rejection counts are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// The admission decision for one request, from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Go on; wait for the ticket's [`Outcome`] before decoding the body.
    Accept(Ticket),
    /// Answer `Overloaded` at once (`pipeline::reply`); the body is
    /// never decoded.
    Reject,
}

/// A request's place in the shard's admission queue (`None`: it bypasses the queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(Option<u32>);

impl Ticket {
    /// A ticket for a request that does not go through the queue.
    pub const BYPASS: Ticket = Ticket(None);
}

/// What became of a queued request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Decode and execute it.
    Run,
    /// Shed for queue delay: answer the pre-encoded `Overloaded`.
    Shed,
    /// Its deadline passed while queued: answer the pre-encoded timeout.
    Expired,
    /// Its client disconnected: answer nothing.
    Dropped,
}

/// State of one slab slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    Queued,
    /// Dispatched at this instant (start of the execution-latency sample).
    Running(Nanos),
    Done(Outcome),
}

#[derive(Debug)]
struct Slot {
    state: SlotState,
    conn: usize,
    waker: Option<Waker>,
}

/// Counts logged once per second.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Logged {
    rejected_full: u64,
    shed_at_enqueue: u64,
    rejected_over_cap: u64,
    shed: u64,
    expired: u64,
    dropped: u64,
    group_commit: u64,
}

/// Per-shard admission state (owned by the shard thread, no locks).
#[derive(Debug)]
pub struct ShardAdmission {
    ctl: Option<AdmissionController<u32>>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    clock: ShardClock,
    /// The last arrival converted and its shard-local time: every frame of one socket read
    /// has the same arrival, so all but the first take it from here.
    last_arrival: (Instant, Nanos),
    queue_capacity: usize,
    /// The queue's deadline bound: the exact deadline needs the body (`USING TIMEOUT`), so
    /// the queue uses the largest per-kind default; the exact one is checked after decode.
    queue_timeout: Duration,
    admitted: u64,
    counts: Logged,
    logged: Logged,
    /// The latest instant the controller saw (for releases that read no clock).
    last_now: Nanos,
    next_log: Nanos,
    /// Period of the loop-lag probe (`None`: no probe).
    lag_probe: Option<Duration>,
    /// Largest loop lag measured since the last log line.
    lag_max: Duration,
    /// The CoDel interval, if admission is on.
    interval: Option<Duration>,
    /// `AdmissionConfig::pace_windows`, false when admission is off.
    pace_windows: bool,
    /// The constants, for the group-commit bound (`None`: admission is off).
    config: Option<sluice_overload::AdmissionConfig>,
}

impl ShardAdmission {
    /// State for one shard on the system clock: the slab and queue are allocated here, once.
    pub fn new(config: &ServerConfig) -> ShardAdmission {
        Self::with_clock(config, ShardClock::system())
    }

    /// State for one shard that reads `clock` (its `ShardCtx`'s).
    pub fn with_clock(config: &ServerConfig, clock: ShardClock) -> ShardAdmission {
        let (ctl, nslots, queue_capacity) = match config.admission {
            Some(cfg) => {
                let q = cfg.queue_capacity.max(1);
                let n = q + cfg.concurrency.max.max(1) as usize;
                (Some(AdmissionController::new(cfg)), n, q)
            }
            None => (None, 0, 0),
        };
        let lag_probe = config
            .admission
            .map(|c| c.lag_probe_interval)
            .filter(|d| !d.is_zero());
        let slots = (0..nslots)
            .map(|_| Slot {
                state: SlotState::Free,
                conn: 0,
                waker: None,
            })
            .collect();
        let t = &config.timeouts;
        ShardAdmission {
            ctl,
            slots,
            free: (0..nslots as u32).rev().collect(),
            last_arrival: (clock.now(), Nanos::ZERO),
            clock,
            queue_capacity,
            queue_timeout: t.read.max(t.write).max(t.range).max(t.other),
            admitted: 0,
            counts: Logged::default(),
            logged: Logged::default(),
            last_now: Nanos::ZERO,
            next_log: Nanos::ZERO,
            lag_probe,
            lag_max: Duration::ZERO,
            interval: config.admission.map(|c| c.codel.interval),
            pace_windows: config.admission.is_some_and(|c| c.pace_windows),
            config: config.admission,
        }
    }

    /// Shard-local monotonic time of `at`.
    #[inline]
    fn nanos(&self, at: Instant) -> Nanos {
        self.clock.nanos_of(at)
    }

    /// Shard-local monotonic time of `at`, for the controllers of the overload crate.
    #[inline]
    pub fn nanos_of(&self, at: Instant) -> Nanos {
        self.nanos(at)
    }

    /// Shard-local monotonic time of an arrival (cached for the frames of one read).
    #[inline]
    fn arrival_nanos(&mut self, at: Instant) -> Nanos {
        if self.last_arrival.0 != at {
            self.last_arrival = (at, self.nanos(at));
        }
        self.last_arrival.1
    }

    /// Shard-local monotonic time now (one read of the raw clock).
    #[inline]
    fn now(&self) -> Nanos {
        self.clock.nanos()
    }

    /// Decides from the header and the frame's arrival (the socket read that completed the
    /// frame, or the kernel's receive stamp of it). `conn` identifies the connection (so its
    /// queued requests can be dropped when it disconnects). Never allocates.
    pub fn admit(
        &mut self,
        header: &FrameHeader,
        arrival: Arrival<Instant>,
        conn: usize,
        metrics: &ShardMetrics,
    ) -> Admit {
        self.admit_paced(header, arrival, conn, false, metrics)
    }

    /// [`Self::admit`], for a connection that obeys backpressure when `paced` (it is not
    /// pushing, see [`sluice_overload::backlog`]): while overloaded, its requests are not
    /// turned away for their age or the queue's overloaded bound, only for a full queue.
    pub fn admit_paced(
        &mut self,
        header: &FrameHeader,
        arrival: Arrival<Instant>,
        conn: usize,
        paced: bool,
        metrics: &ShardMetrics,
    ) -> Admit {
        if self.ctl.is_none() || bypasses_queue(header.opcode) {
            self.admitted += 1;
            return Admit::Accept(Ticket::BYPASS);
        }
        if self.turns_away_from_header(paced, metrics) {
            return Admit::Reject;
        }
        let Some(idx) = self.free.pop() else {
            self.counts.rejected_full += 1;
            metrics.rejected_overloaded.fetch_add(1, Relaxed);
            return Admit::Reject;
        };
        // `arrival` is the socket read that completed the frame (or the kernel's stamp of
        // it); the reader may reach it later, after other frames of that read: that wait
        // counts as queueing too.
        let read = arrival.map(|at| self.arrival_nanos(at));
        let now = self.now();
        let deadline = Deadline(read.at().saturating_add(self.queue_timeout));
        // Nothing waits and there is room: straight to running, as the queue would have.
        let at_once = self.ctl.as_mut().and_then(|c| {
            if paced {
                c.dispatch_paced_at_once(read, now, deadline)
            } else {
                c.dispatch_at_once(read, now, deadline)
            }
        });
        if let Some(waited) = at_once {
            self.last_now = self.last_now.max(now);
            metrics.observe_queue_delay(waited);
            self.occupy(idx, conn, SlotState::Running(now));
            return Admit::Accept(Ticket(Some(idx)));
        }
        let queued = match self.ctl.as_mut() {
            Some(ctl) if paced => ctl.enqueue_paced(idx, read, now, deadline).is_ok(),
            Some(ctl) => ctl.enqueue_read(idx, read, now, deadline).is_ok(),
            None => false,
        };
        if !queued {
            // The queue had room: overloaded, it already holds what it can dispatch in time.
            self.free.push(idx);
            self.counts.shed_at_enqueue += 1;
            metrics.rejected_overloaded.fetch_add(1, Relaxed);
            return Admit::Reject;
        }
        self.occupy(idx, conn, SlotState::Queued);
        self.pump(now, metrics);
        Admit::Accept(Ticket(Some(idx)))
    }

    /// The rejections [`Self::admit_paced`] decides before any time arithmetic, inlined
    /// into the reader so that the cheapest rejection costs no call: the queue is full, or
    /// (not `paced`) the shard is overloaded and the queue already holds what it dispatches
    /// in time (the bound is refreshed at every dispatch and loop-lag probe). Counts what
    /// it turns away. Never true for a request that bypasses the queue.
    #[inline]
    pub fn turns_away_from_header(&mut self, paced: bool, metrics: &ShardMetrics) -> bool {
        let Some(ctl) = self.ctl.as_mut() else {
            return false;
        };
        if ctl.queued() >= self.queue_capacity {
            self.counts.rejected_full += 1;
        } else if !paced && ctl.turn_away_at_once() {
            self.counts.shed_at_enqueue += 1;
        } else {
            return false;
        }
        metrics.rejected_overloaded.fetch_add(1, Relaxed);
        true
    }

    /// Gives slot `idx` to an admitted request of connection `conn`.
    fn occupy(&mut self, idx: u32, conn: usize, state: SlotState) {
        if let Some(slot) = self.slots.get_mut(idx as usize) {
            debug_assert_eq!(
                slot.state,
                SlotState::Free,
                "a slot is given to one request"
            );
            slot.state = state;
            slot.conn = conn;
            slot.waker = None;
        }
        self.admitted += 1;
    }

    /// Period of the shard's loop-lag probe, if admission is on and the probe enabled.
    pub fn lag_probe_interval(&self) -> Option<Duration> {
        self.lag_probe
    }

    /// How long a task that becomes ready at `at` waits to run (the loop-lag probe's
    /// estimate; zero when admission or the probe is off).
    #[inline]
    pub fn loop_lag(&self, at: Instant) -> Duration {
        let now = self.nanos(at);
        self.ctl
            .as_ref()
            .map_or(Duration::ZERO, |c| c.hidden_delay(now))
    }

    /// The loop-lag probe became ready at `at` and waits to be polled.
    pub fn lag_probe_started(&mut self, at: Instant) {
        let now = self.nanos(at);
        if let Some(ctl) = self.ctl.as_mut() {
            ctl.lag_probe_started(now);
        }
    }

    /// The loop-lag probe was polled at `at`: the lag feeds the controller (see the module
    /// documentation, point 3). Returns the lag measured.
    pub fn lag_probe_finished(&mut self, at: Instant, metrics: &ShardMetrics) -> Duration {
        let now = self.nanos(at);
        let Some(ctl) = self.ctl.as_mut() else {
            return Duration::ZERO;
        };
        let lag = ctl.lag_probe_finished(now);
        self.lag_max = self.lag_max.max(lag);
        metrics.loop_lag_us.store(lag.as_micros() as i64, Relaxed);
        metrics
            .concurrency_limit
            .store(i64::from(ctl.concurrency_limit()), Relaxed);
        self.pump(now, metrics);
        lag
    }

    /// True if a connection (or the shard) at its in-flight cap should keep reading and
    /// answer the excess `Overloaded` instead of pausing: the shard is overloaded, so the
    /// excess would only age unseen in the kernel. False when admission is off.
    #[inline]
    pub fn reject_over_cap(&mut self, at: Instant) -> bool {
        let now = self.nanos(at);
        self.ctl.as_mut().is_some_and(|c| c.reject_over_cap(now))
    }

    /// True while the shard has a standing delay (CoDel's overloaded state), as of the
    /// latest instant admission saw: no clock read. False when admission is off.
    #[inline]
    pub fn is_overloaded(&mut self) -> bool {
        let now = self.last_now;
        self.ctl.as_mut().is_some_and(|c| c.is_overloaded(now))
    }

    /// The CoDel interval (the window of a connection's backlog watch), if admission is on.
    pub fn interval(&self) -> Option<Duration> {
        self.interval
    }

    /// True if connections that slow down when held back are paced rather than shed
    /// (`AdmissionConfig::pace_windows`); false when admission is off.
    pub fn paces_windows(&self) -> bool {
        self.pace_windows
    }

    /// True if a write's group fsync is watched: admission is on and its group-commit wait
    /// is not zero (`AdmissionConfig::group_commit_wait`).
    #[inline]
    pub fn watches_group_commit(&self) -> bool {
        self.config.is_some_and(|c| !c.group_commit_wait.is_zero())
    }

    /// True (and counted) if a dispatched write that is expected to wait `wait` for its
    /// group fsync is to be turned away `Overloaded` (see
    /// `AdmissionConfig::group_commit_too_long`). A `paced` connection's write is not: its
    /// client's window bounds what it adds to the fsync, so it is served.
    #[inline]
    pub fn turns_away_for_group_commit(
        &mut self,
        wait: GroupCommitWait,
        paced: bool,
        metrics: &ShardMetrics,
    ) -> bool {
        let too_long = !paced
            && self
                .config
                .is_some_and(|c| c.group_commit_too_long(wait.expected, wait.fsync));
        if too_long {
            self.counts.group_commit += 1;
            metrics.rejected_overloaded.fetch_add(1, Relaxed);
            metrics.rejected_group_commit.fetch_add(1, Relaxed);
            debug_assert!(
                metrics.rejected_group_commit.load(Relaxed)
                    <= metrics.rejected_overloaded.load(Relaxed),
                "a write turned away for its group fsync is one of the Overloaded"
            );
        }
        too_long
    }

    /// Counts one request answered `Overloaded` because its connection or shard was at its
    /// in-flight cap while overloaded (the caller appends the frame).
    #[inline]
    pub fn count_rejected_over_cap(&mut self, metrics: &ShardMetrics) {
        self.counts.rejected_over_cap += 1;
        metrics.rejected_overloaded.fetch_add(1, Relaxed);
    }

    /// Dispatches queued requests while the concurrency limit allows, and wakes the
    /// requests that were dispatched, shed or found expired.
    fn pump(&mut self, now: Nanos, metrics: &ShardMetrics) {
        self.last_now = self.last_now.max(now);
        let Some(ctl) = self.ctl.as_mut() else {
            return;
        };
        let slots = &mut self.slots;
        let counts = &mut self.counts;
        while ctl.can_dispatch() {
            let next = ctl.dispatch(now, |idx, verdict| {
                let outcome = match verdict {
                    Verdict::Expired => {
                        // Counted as expired when it is answered (`pipeline::reply`).
                        counts.expired += 1;
                        Outcome::Expired
                    }
                    Verdict::Shed | Verdict::Serve => {
                        counts.shed += 1;
                        metrics.rejected_overloaded.fetch_add(1, Relaxed);
                        Outcome::Shed
                    }
                };
                finish_slot(slots, idx, SlotState::Done(outcome));
            });
            let Some(q) = next else { break };
            metrics.observe_queue_delay(now.saturating_duration_since(q.enqueued));
            finish_slot(slots, q.item, SlotState::Running(now));
        }
        metrics.queued.store(ctl.queued() as i64, Relaxed);
        if now >= self.next_log {
            self.next_log = now.saturating_add(LOG_EVERY);
            if self.counts != self.logged {
                let (c, l) = (self.counts, self.logged);
                info!(
                    rejected_queue_full = c.rejected_full - l.rejected_full,
                    shed_at_enqueue = c.shed_at_enqueue - l.shed_at_enqueue,
                    rejected_over_cap = c.rejected_over_cap - l.rejected_over_cap,
                    shed_for_delay = c.shed - l.shed,
                    expired_in_queue = c.expired - l.expired,
                    dropped_disconnected = c.dropped - l.dropped,
                    turned_away_for_group_commit = c.group_commit - l.group_commit,
                    concurrency_limit = ctl.concurrency_limit(),
                    loop_lag_max_us = self.lag_max.as_micros() as u64,
                    "admission: requests turned away in the last interval"
                );
                self.logged = c;
            }
            self.lag_max = Duration::ZERO;
        }
    }

    /// Polls the outcome of a queued request.
    fn poll_outcome(&mut self, ticket: Ticket, cx: &mut Context<'_>) -> Poll<Outcome> {
        let Some(idx) = ticket.0 else {
            return Poll::Ready(Outcome::Run);
        };
        let Some(slot) = self.slots.get_mut(idx as usize) else {
            return Poll::Ready(Outcome::Dropped);
        };
        match slot.state {
            SlotState::Queued => {
                match &slot.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => slot.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            SlotState::Running(_) => Poll::Ready(Outcome::Run),
            SlotState::Done(o) => Poll::Ready(o),
            SlotState::Free => Poll::Ready(Outcome::Dropped),
        }
    }

    /// True when the request of `ticket` may run now: it bypassed the queue or was
    /// dispatched at admission (not waiting in the queue, not shed or expired there).
    pub fn is_dispatched(&self, ticket: Ticket) -> bool {
        match ticket.0 {
            None => true,
            Some(idx) => matches!(
                self.slots.get(idx as usize).map(|s| s.state),
                Some(SlotState::Running(_))
            ),
        }
    }

    /// Releases a ticket outside a shard (benchmarks, tests); in the server [`Admitted`]
    /// does this when the request's task ends.
    pub fn complete(&mut self, ticket: Ticket, metrics: &ShardMetrics) {
        self.release(ticket, true, metrics);
    }

    /// Completes a dispatched request that was turned away before executing (deadline,
    /// rate limit): it is no latency sample for the concurrency limit, and when nothing
    /// waits, releasing it reads no clock.
    pub fn complete_turned_away(&mut self, ticket: Ticket, metrics: &ShardMetrics) {
        self.release(ticket, false, metrics);
    }

    /// Releases a ticket: completes a running request (its latency feeds the concurrency
    /// limit if `sample`), removes a still-queued one, frees the slot and dispatches more.
    fn release(&mut self, ticket: Ticket, sample: bool, metrics: &ShardMetrics) {
        let Some(idx) = ticket.0 else { return };
        let Some(slot) = self.slots.get_mut(idx as usize) else {
            return;
        };
        let state = slot.state;
        debug_assert_ne!(state, SlotState::Free, "a ticket is released once");
        slot.state = SlotState::Free;
        slot.waker = None;
        // Dispatched, then turned away before it ran, with nothing queued: no latency sample
        // and nothing to dispatch, so no clock read and no pump.
        if let (SlotState::Running(_), false, Some(ctl)) = (state, sample, self.ctl.as_mut()) {
            if ctl.queued() == 0 {
                ctl.on_turned_away_after_dispatch();
                self.free.push(idx);
                debug_assert!(
                    self.free.len() <= self.slots.len(),
                    "more free slots than slots"
                );
                return;
            }
        }
        // The clock is needed for a latency sample and to dispatch what waits.
        let timed = sample || self.ctl.as_ref().is_some_and(|c| c.queued() > 0);
        let now = if timed { self.now() } else { self.last_now };
        if let Some(ctl) = self.ctl.as_mut() {
            match state {
                SlotState::Running(_) if !sample => ctl.on_turned_away_after_dispatch(),
                SlotState::Running(start) => {
                    metrics.latency_samples.fetch_add(1, Relaxed);
                    ctl.on_complete(now.saturating_duration_since(start), now)
                }
                SlotState::Queued => {
                    ctl.drop_where(|&i| i == idx);
                }
                SlotState::Done(_) | SlotState::Free => {}
            }
        }
        if state != SlotState::Free {
            self.free.push(idx);
        }
        debug_assert!(
            self.free.len() <= self.slots.len(),
            "more free slots than slots"
        );
        self.pump(now, metrics);
    }

    /// Drops every queued request of connection `conn` (its client disconnected): they are
    /// never executed nor answered. Returns how many were dropped.
    pub fn drop_connection(&mut self, conn: usize, metrics: &ShardMetrics) -> usize {
        let Some(ctl) = self.ctl.as_mut() else {
            return 0;
        };
        let slots = &mut self.slots;
        let n = ctl.drop_where(|&idx| {
            let mine = slots.get(idx as usize).is_some_and(|s| s.conn == conn);
            if mine {
                finish_slot(slots, idx, SlotState::Done(Outcome::Dropped));
            }
            mine
        });
        self.counts.dropped += n as u64;
        metrics.dropped_disconnected.fetch_add(n as u64, Relaxed);
        metrics.queued.store(ctl.queued() as i64, Relaxed);
        n
    }

    /// Requests admitted so far on this shard.
    pub fn admitted(&self) -> u64 {
        self.admitted
    }

    /// Requests waiting in the queue.
    pub fn queued(&self) -> usize {
        self.ctl.as_ref().map_or(0, |c| c.queued())
    }

    /// Requests that hold an admission slot (queued, running, or answered from the queue and
    /// not yet released): zero once every admitted request has been released.
    pub fn slots_in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Requests the controller counts as executing.
    pub fn executing(&self) -> u32 {
        self.ctl.as_ref().map_or(0, |c| c.inflight())
    }

    /// The controller's counters (zero when admission is off).
    pub fn stats(&self) -> AdmissionStats {
        self.ctl.as_ref().map(|c| c.stats()).unwrap_or_default()
    }
}

/// Requests that change connection state are handled inline and never queued.
#[inline]
fn bypasses_queue(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Options | Opcode::Startup | Opcode::Register | Opcode::AuthResponse
    )
}

/// Sets a slot's state and wakes the request waiting on it.
#[inline]
fn finish_slot(slots: &mut [Slot], idx: u32, state: SlotState) {
    if let Some(slot) = slots.get_mut(idx as usize) {
        slot.state = state;
        if let Some(w) = slot.waker.take() {
            w.wake();
        }
    }
}

/// A request's hold on the admission queue: wait for its [`Outcome`]; its owner (the
/// pipeline's `Request`) releases its place once, when it ends (answered, failed or
/// abandoned), so the next request can be dispatched. It keeps no reference to the shard:
/// the request already holds one.
pub struct Admitted {
    ticket: Ticket,
    sampled: Cell<bool>,
}

impl Admitted {
    /// Takes ownership of `ticket` for the request's lifetime.
    pub fn new(ticket: Ticket) -> Admitted {
        Admitted {
            ticket,
            sampled: Cell::new(true),
        }
    }

    /// The request was turned away after dispatch, before executing (deadline, rate limit):
    /// its release is no latency sample for the concurrency limit.
    pub fn turned_away(&self) {
        self.sampled.set(false);
    }

    /// Waits until the request is dispatched, shed, expired or dropped.
    pub async fn outcome(&self, shard: &ShardCtx) -> Outcome {
        poll_fn(|cx| shard.admission.borrow_mut().poll_outcome(self.ticket, cx)).await
    }

    /// True when the request may run now: it bypassed the queue or was dispatched.
    pub fn is_dispatched(&self, shard: &ShardCtx) -> bool {
        shard.admission.borrow().is_dispatched(self.ticket)
    }

    /// Gives the place back; called once, by the owner as it is dropped.
    pub fn release(&self, shard: &ShardCtx) {
        // Admission is borrowed only inside its own methods, which never drop a request, so
        // the borrow cannot be busy here; if it were, the slot would leak for the shard's life.
        match shard.admission.try_borrow_mut() {
            Ok(mut a) => a.release(self.ticket, self.sampled.get(), &shard.metrics),
            Err(_) => {
                debug_assert!(false, "admission busy while a request is released");
                tracing::error!("admission busy while a request is released: its slot leaks");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_overload::AdmissionConfig;
    use std::sync::Arc;
    use std::task::Wake;

    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Relaxed);
        }
    }

    fn config(queue: usize, limit: u32) -> ServerConfig {
        let mut c = ServerConfig::new("127.0.0.1:0".parse().unwrap(), 1, "h".into());
        let mut a = AdmissionConfig {
            queue_capacity: queue,
            ..Default::default()
        };
        a.concurrency.initial = limit;
        a.concurrency.min = limit;
        a.concurrency.max = limit;
        c.admission = Some(a);
        c
    }

    fn header(op: Opcode, stream: i16) -> FrameHeader {
        FrameHeader {
            version: 4,
            flags: 0,
            stream,
            opcode: op,
            length: 10,
        }
    }

    fn poll(a: &mut ShardAdmission, t: Ticket) -> (Poll<Outcome>, Arc<Flag>) {
        let flag = Arc::new(Flag(Default::default()));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        (a.poll_outcome(t, &mut cx), flag)
    }

    fn ticket(a: Admit) -> Ticket {
        match a {
            Admit::Accept(t) => t,
            Admit::Reject => panic!("rejected"),
        }
    }

    #[test]
    fn queue_beyond_limit_waits_then_runs_on_completion() {
        let m = ShardMetrics::default();
        let mut a = ShardAdmission::new(&config(4, 1));
        let now = Instant::now();
        let t1 = ticket(a.admit(&header(Opcode::Query, 1), now.into(), 7, &m));
        let t2 = ticket(a.admit(&header(Opcode::Query, 2), now.into(), 7, &m));
        assert_eq!(poll(&mut a, t1).0, Poll::Ready(Outcome::Run));
        let (p2, woke) = poll(&mut a, t2);
        assert_eq!(p2, Poll::Pending);
        assert_eq!(a.queued(), 1);
        a.release(t1, true, &m);
        assert!(woke.0.load(Relaxed), "the queued request is woken");
        assert_eq!(poll(&mut a, t2).0, Poll::Ready(Outcome::Run));
        a.release(t2, true, &m);
        assert_eq!(a.stats().completed, 2);
        assert_eq!(a.free.len(), a.slots.len(), "every slot returned");
    }

    #[test]
    fn a_request_turned_away_after_dispatch_frees_its_place_without_a_sample() {
        let m = ShardMetrics::default();
        let mut a = ShardAdmission::new(&config(4, 1));
        let now = Instant::now();
        let alone = ticket(a.admit(&header(Opcode::Execute, 1), now.into(), 7, &m));
        assert!(a.is_dispatched(alone));
        assert_eq!((a.executing(), a.slots_in_use()), (1, 1));
        a.release(alone, false, &m);
        assert_eq!((a.executing(), a.slots_in_use()), (0, 0));
        // With a request queued behind it, its release dispatches that one.
        let first = ticket(a.admit(&header(Opcode::Execute, 2), now.into(), 7, &m));
        let queued = ticket(a.admit(&header(Opcode::Execute, 3), now.into(), 7, &m));
        assert_eq!(a.queued(), 1);
        a.release(first, false, &m);
        assert_eq!(poll(&mut a, queued).0, Poll::Ready(Outcome::Run));
        assert_eq!(m.latency_samples.load(Relaxed), 0, "no request ran yet");
        a.release(queued, true, &m);
        assert_eq!(m.latency_samples.load(Relaxed), 1);
        assert_eq!((a.executing(), a.slots_in_use()), (0, 0));
        assert_eq!(a.stats().completed, 3);
    }

    #[test]
    fn full_queue_rejects_from_the_header_and_startup_bypasses() {
        let m = ShardMetrics::default();
        let mut a = ShardAdmission::new(&config(1, 1));
        let now = Instant::now();
        let _run = ticket(a.admit(&header(Opcode::Execute, 1), now.into(), 7, &m));
        let _queued = ticket(a.admit(&header(Opcode::Execute, 2), now.into(), 7, &m));
        assert_eq!(
            a.admit(&header(Opcode::Execute, 3), now.into(), 7, &m),
            Admit::Reject
        );
        assert_eq!(m.rejected_overloaded.load(Relaxed), 1);
        assert_eq!(
            a.admit(&header(Opcode::Options, 4), now.into(), 7, &m),
            Admit::Accept(Ticket::BYPASS)
        );
    }

    #[test]
    fn disconnect_drops_only_that_connections_queued_requests() {
        let m = ShardMetrics::default();
        let mut a = ShardAdmission::new(&config(8, 1));
        let now = Instant::now();
        let run = ticket(a.admit(&header(Opcode::Query, 1), now.into(), 1, &m));
        let gone = ticket(a.admit(&header(Opcode::Query, 2), now.into(), 2, &m));
        let stays = ticket(a.admit(&header(Opcode::Query, 3), now.into(), 3, &m));
        assert_eq!(a.drop_connection(2, &m), 1);
        assert_eq!(m.dropped_disconnected.load(Relaxed), 1);
        assert_eq!(poll(&mut a, gone).0, Poll::Ready(Outcome::Dropped));
        a.release(gone, true, &m);
        a.release(run, true, &m);
        assert_eq!(poll(&mut a, stays).0, Poll::Ready(Outcome::Run));
        a.release(stays, true, &m);
        assert_eq!(a.free.len(), a.slots.len());
    }

    #[test]
    fn standing_queue_delay_sheds_the_oldest() {
        let m = ShardMetrics::default();
        let mut a = ShardAdmission::new(&config(64, 1));
        let t0 = Instant::now();
        let running = ticket(a.admit(&header(Opcode::Query, 0), t0.into(), 1, &m));
        // Requests that wait behind a stuck execution for longer than max_queue_delay
        // (100 ms by default) are shed when the queue is next served.
        let old: Vec<Ticket> = (1..4)
            .map(|s| ticket(a.admit(&header(Opcode::Query, s), t0.into(), 1, &m)))
            .collect();
        let later = t0 + Duration::from_millis(150);
        let fresh = ticket(a.admit(&header(Opcode::Query, 9), later.into(), 1, &m));
        let t = a.nanos(later);
        a.ctl
            .as_mut()
            .unwrap()
            .on_complete(Duration::from_millis(150), t);
        a.slots[0].state = SlotState::Free; // the running request finished
        a.free.push(0);
        a.pump(t, &m);
        for o in &old {
            assert_eq!(poll(&mut a, *o).0, Poll::Ready(Outcome::Shed));
        }
        assert_eq!(poll(&mut a, fresh).0, Poll::Ready(Outcome::Run));
        assert_eq!(m.rejected_overloaded.load(Relaxed), 3);
        let _ = running;
    }

    #[test]
    fn admission_off_admits_everything_without_queueing() {
        let m = ShardMetrics::default();
        let mut c = config(1, 1);
        c.admission = None;
        let mut a = ShardAdmission::new(&c);
        for s in 0..10 {
            assert_eq!(
                a.admit(&header(Opcode::Query, s), Instant::now().into(), 1, &m),
                Admit::Accept(Ticket::BYPASS)
            );
        }
        assert_eq!(a.queued(), 0);
    }
}
