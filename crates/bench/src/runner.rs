//! The open-loop runner: issues every request at its intended time, whatever the server does.

use crate::schedule::{Arrival, Schedule};
use crate::stats::{ClassTotals, Recorder, SecondRow};
use crate::target::{KeyDist, OpGen, Outcome, Reply, Target};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

/// How far past the end of its step a lagging generator keeps issuing.
const GIVE_UP_AFTER: Duration = Duration::from_secs(1);

/// One stream of traffic within a step.
#[derive(Clone, Debug)]
pub struct StreamSpec {
    /// Offered rate, requests per second.
    pub rate: f64,
    /// Fraction of reads (the rest are writes).
    pub read_fraction: f64,
    /// Partitions touched.
    pub keys: KeyDist,
    /// Rows per partition that writes spread over.
    pub rows: i32,
}

/// Generator settings shared by every step of a run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Arrival process.
    pub arrival: Arrival,
    /// A success counts as goodput only within this time of its intended send time.
    pub deadline: Duration,
    /// The client gives up after this long.
    pub client_timeout: Duration,
    /// A request issued later than this after its intended time counts as generator lag.
    pub lag_tolerance: Duration,
    /// Cap on requests in flight; arrivals beyond it are counted as unsent.
    pub max_in_flight: usize,
    /// Seed for arrivals and keys.
    pub seed: u64,
    /// Print one progress line per second to stderr.
    pub progress: bool,
}

/// The data of one step.
#[derive(Debug)]
pub struct StepRun {
    /// Per-second rows (run-relative seconds).
    pub seconds: Vec<SecondRow>,
    /// Totals per class, over every request this step scheduled.
    pub totals: Vec<ClassTotals>,
    /// Server arrivals (with retries) during the step, if the target counts them.
    pub attempts: Option<u64>,
    /// The generator's delay from each request's intended send time to the socket write
    /// that carried it, if the target measures it.
    pub send_delay: Option<SendDelay>,
}

/// The generator's own delay, from intended send time to the socket write, over a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SendDelay {
    /// Requests written.
    pub written: u64,
    /// Median delay, microseconds.
    pub p50_us: u64,
    /// 99th percentile, microseconds.
    pub p99_us: u64,
    /// Largest, microseconds.
    pub max_us: u64,
    /// Share of requests written more than 1 ms late.
    pub over_1ms: f64,
}

impl SendDelay {
    /// The figures of a histogram of delays in microseconds (`None` when it is empty).
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> Option<SendDelay> {
        if h.is_empty() {
            return None;
        }
        let over = h.len() - h.count_between(0, 1_000);
        Some(SendDelay {
            written: h.len(),
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            max_us: h.max(),
            over_1ms: over as f64 / h.len() as f64,
        })
    }
}

fn lock(m: &Mutex<Recorder>) -> MutexGuard<'_, Recorder> {
    // A panic elsewhere must not lose the measurements already taken.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where the completions of one step go: its recorder, and the count of requests in flight
/// that the end of the step waits for.
#[derive(Debug)]
pub struct StepSink {
    rec: Mutex<Recorder>,
    deadline: Duration,
    client_timeout: Duration,
    in_flight: AtomicUsize,
    max_in_flight: usize,
    /// Woken when the last request in flight completes.
    drained: Notify,
}

impl StepSink {
    /// A sink recording into `rec` under `cfg`'s deadline, timeout and in-flight cap.
    pub(crate) fn new(rec: Recorder, cfg: &RunConfig) -> Self {
        Self {
            rec: Mutex::new(rec),
            deadline: cfg.deadline,
            client_timeout: cfg.client_timeout,
            in_flight: AtomicUsize::new(0),
            max_in_flight: cfg.max_in_flight.max(1),
            drained: Notify::new(),
        }
    }

    /// Counts a request of `class` meant to go out at `intended` in flight and returns its
    /// ticket, or None when the in-flight cap is reached (the request is not sent).
    pub(crate) fn begin(self: &Arc<Self>, intended: Instant, class: usize) -> Option<Ticket> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_in_flight).then_some(n + 1)
            })
            .ok()?;
        Some(Ticket {
            sink: self.clone(),
            intended,
            class,
            done: false,
        })
    }

    /// Closes the accounting at `now`: every per-second row and the totals of each class.
    pub(crate) fn finish(&self, now: Instant) -> (Vec<SecondRow>, Vec<ClassTotals>) {
        let mut rec = lock(&self.rec);
        let start = rec.start();
        std::mem::replace(&mut *rec, Recorder::new(0, start, 0)).finish(now)
    }

    /// Requests in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Waits until every request begun so far has completed.
    async fn drain(&self) {
        loop {
            let woken = self.drained.notified();
            tokio::pin!(woken);
            // Registered before the check, so a completion in between still wakes us.
            woken.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            woken.await;
        }
    }
}

/// One request in flight: what its answer is recorded against. A target completes it exactly
/// once; one dropped unanswered (its connection went away) counts as [`Reply::Other`].
#[derive(Debug)]
pub struct Ticket {
    sink: Arc<StepSink>,
    intended: Instant,
    class: usize,
    done: bool,
}

impl Ticket {
    /// When the schedule meant the request to go out.
    pub fn intended(&self) -> Instant {
        self.intended
    }

    /// When the client stops waiting for the answer.
    pub fn expires(&self) -> Instant {
        self.intended + self.sink.client_timeout
    }

    /// How long the client waits for an answer.
    pub fn client_timeout(&self) -> Duration {
        self.sink.client_timeout
    }

    /// Records how the request ended, now.
    pub fn complete(mut self, reply: Reply) {
        self.finish(reply);
    }

    fn finish(&mut self, reply: Reply) {
        self.done = true;
        let done = Instant::now();
        let latency = done.saturating_duration_since(self.intended);
        let outcome = Outcome::classify(reply, latency, self.sink.deadline);
        lock(&self.sink.rec).on_done(done, self.class, outcome, latency);
        if self.sink.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.sink.drained.notify_waiters();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.finish(Reply::Other);
        }
    }
}

/// Formats one progress line (elapsed, offered, goodput, rejections, lag, p99 of class 0).
pub fn progress_line(row: &SecondRow) -> String {
    let c = row.total();
    let p99 = row.classes.first().map(|c| c.latency.p99_us).unwrap_or(0);
    format!(
        "[{:>4}s] offered {:>7}/s  goodput {:>7}/s  late {:>6}  rate-limited {:>6}  overloaded {:>6}  server-timeout {:>6}  client-timeout {:>6}  other {:>5}  lag {:>6}  p99 {:>8.2} ms",
        row.t,
        c.offered,
        c.ok,
        c.late,
        c.rate_limited,
        c.overloaded,
        c.server_timeout,
        c.client_timeout,
        c.other,
        c.lagged + c.unsent,
        p99 as f64 / 1000.0
    )
}

/// Runs one step: every stream at its rate for `duration`, then waits for the stragglers.
///
/// Latency is measured from each request's intended send time, so a stalled server or a
/// stalled generator shows up in the latency of every request scheduled during the stall.
/// Requests go to the target through [`Target::submit`], and [`Target::flush`] follows every
/// burst of arrivals that were due together.
pub async fn run_step<T: Target>(
    target: &Arc<T>,
    streams: &[StreamSpec],
    duration: Duration,
    cfg: &RunConfig,
    t_offset: u64,
) -> StepRun {
    let start = Instant::now();
    let sink = Arc::new(StepSink::new(
        Recorder::new(streams.len(), start, t_offset),
        cfg,
    ));
    let attempts_before = target.attempts();
    // What an earlier step left in the target's delay histograms is not this step's.
    let _ = target.take_send_delays();

    let printed = Arc::new(AtomicUsize::new(0));
    let ticker = cfg.progress.then(|| {
        let (sink, printed) = (sink.clone(), printed.clone());
        tokio::spawn(async move {
            let mut next = start + Duration::from_secs(1);
            loop {
                sleep_until(next).await;
                next += Duration::from_secs(1);
                // Formatted under the lock, queued after it: never a write(2) here.
                let lines: Vec<String> = {
                    let mut r = lock(&sink.rec);
                    r.roll(Instant::now());
                    let lines = r.rows().iter().skip(printed.load(Ordering::Relaxed));
                    let lines = lines.map(progress_line).collect();
                    printed.store(r.rows().len(), Ordering::Relaxed);
                    lines
                };
                lines.into_iter().for_each(crate::progress::line);
            }
        })
    });

    let mut dispatchers = Vec::with_capacity(streams.len());
    for (class, spec) in streams.iter().enumerate() {
        let seed = cfg.seed ^ (t_offset << 8) ^ class as u64;
        let sched = Schedule::new(cfg.arrival, spec.rate, duration, seed);
        let mut gen = OpGen::new(
            spec.read_fraction,
            spec.keys,
            spec.rows,
            seed.wrapping_mul(31),
        );
        let (target, sink, lag_tolerance) = (target.clone(), sink.clone(), cfg.lag_tolerance);
        dispatchers.push(tokio::spawn(async move {
            let mut burst = 0u32;
            // A generator that falls this far behind gives up on the rest of the step and
            // counts it as unsent, rather than stretching the step indefinitely.
            let give_up = start + duration + GIVE_UP_AFTER;
            let mut sched = sched;
            while let Some(offset) = sched.next() {
                let intended = start + offset;
                if burst > 0 && burst.is_multiple_of(64) && Instant::now() > give_up {
                    let rest = 1 + sched.by_ref().count() as u64;
                    lock(&sink.rec).on_unsent(Instant::now(), class, rest);
                    break;
                }
                let mut now = Instant::now();
                if now < intended {
                    // The burst that was due is complete: send it before sleeping.
                    burst = 0;
                    target.flush();
                    sleep_until(intended).await;
                    now = Instant::now();
                } else {
                    // Behind schedule: send and yield now and then so that completions (and,
                    // on a single-threaded runtime, the requests themselves) make progress.
                    burst += 1;
                    if burst.is_multiple_of(64) {
                        target.flush();
                        tokio::task::yield_now().await;
                        now = Instant::now();
                    }
                }
                let lagged = now.saturating_duration_since(intended) > lag_tolerance;
                let op = gen.next_op();
                let ticket = sink.begin(intended, class);
                lock(&sink.rec).on_issue(now, class, lagged, ticket.is_some());
                if let Some(ticket) = ticket {
                    target.submit(op, ticket);
                }
            }
            target.flush();
        }));
    }
    for d in dispatchers {
        // A dispatcher only ends by finishing its schedule; a panic there is a bug worth surfacing.
        if let Err(e) = d.await {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    }
    sink.drain().await;
    if let Some(t) = ticker {
        t.abort();
    }
    let attempts = match (attempts_before, target.attempts()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    // The aborted ticker may still hold a clone of the Arc for a moment: take the state out.
    let (seconds, totals) = sink.finish(Instant::now());
    let send_delay = target.take_send_delays().as_ref().and_then(SendDelay::of);
    if cfg.progress {
        for row in seconds.iter().skip(printed.load(Ordering::Relaxed)) {
            crate::progress::line(progress_line(row));
        }
        // The step is over: what follows on stderr comes after its lines.
        crate::progress::flush();
    }
    StepRun {
        seconds,
        totals,
        attempts,
        send_delay,
    }
}
