//! The open-loop runner: issues every request at its intended time, whatever the server does.

use crate::schedule::{Arrival, Schedule};
use crate::stats::{ClassTotals, Recorder, SecondRow};
use crate::target::{KeyDist, OpGen, Outcome, Reply, Target};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::{sleep_until, timeout, Instant};

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
}

fn lock(m: &Mutex<Recorder>) -> MutexGuard<'_, Recorder> {
    // A panic elsewhere must not lose the measurements already taken.
    m.lock().unwrap_or_else(|e| e.into_inner())
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
pub async fn run_step<T: Target>(
    target: &Arc<T>,
    streams: &[StreamSpec],
    duration: Duration,
    cfg: &RunConfig,
    t_offset: u64,
) -> StepRun {
    let start = Instant::now();
    let rec = Arc::new(Mutex::new(Recorder::new(streams.len(), start, t_offset)));
    let max = cfg.max_in_flight.clamp(1, Semaphore::MAX_PERMITS);
    let sem = Arc::new(Semaphore::new(max));
    let attempts_before = target.attempts();

    let printed = Arc::new(AtomicUsize::new(0));
    let ticker = cfg.progress.then(|| {
        let (rec, printed) = (rec.clone(), printed.clone());
        tokio::spawn(async move {
            let mut next = start + Duration::from_secs(1);
            loop {
                sleep_until(next).await;
                next += Duration::from_secs(1);
                let mut r = lock(&rec);
                r.roll(Instant::now());
                for row in r.rows().iter().skip(printed.load(Ordering::Relaxed)) {
                    eprintln!("{}", progress_line(row));
                }
                printed.store(r.rows().len(), Ordering::Relaxed);
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
        let (target, rec, sem, cfg) = (target.clone(), rec.clone(), sem.clone(), cfg.clone());
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
                    lock(&rec).on_unsent(Instant::now(), class, rest);
                    break;
                }
                if Instant::now() < intended {
                    burst = 0;
                    sleep_until(intended).await;
                } else {
                    // Behind schedule: yield now and then so that completions (and, on a
                    // single-threaded runtime, the requests themselves) still make progress.
                    burst += 1;
                    if burst.is_multiple_of(64) {
                        tokio::task::yield_now().await;
                    }
                }
                let now = Instant::now();
                let lagged = now.saturating_duration_since(intended) > cfg.lag_tolerance;
                let op = gen.next_op();
                let Ok(permit) = sem.clone().try_acquire_owned() else {
                    lock(&rec).on_issue(now, class, lagged, false);
                    continue;
                };
                lock(&rec).on_issue(now, class, lagged, true);
                let (target, rec) = (target.clone(), rec.clone());
                let (deadline, client_timeout) = (cfg.deadline, cfg.client_timeout);
                tokio::spawn(async move {
                    let reply = timeout(client_timeout, target.execute(op))
                        .await
                        .unwrap_or(Reply::ClientTimeout);
                    let done = Instant::now();
                    let latency = done.saturating_duration_since(intended);
                    let outcome = Outcome::classify(reply, latency, deadline);
                    lock(&rec).on_done(done, class, outcome, latency);
                    drop(permit);
                });
            }
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
    // Every in-flight request holds a permit; taking them all waits for the last straggler.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _all = sem.acquire_many(all).await;
    if let Some(t) = ticker {
        t.abort();
    }
    let attempts = match (attempts_before, target.attempts()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    // The aborted ticker may still hold a clone of the Arc for a moment: take the state out.
    let rec = std::mem::replace(&mut *lock(&rec), Recorder::new(0, start, t_offset));
    let (seconds, totals) = rec.finish(Instant::now());
    if cfg.progress {
        for row in seconds.iter().skip(printed.load(Ordering::Relaxed)) {
            eprintln!("{}", progress_line(row));
        }
    }
    StepRun {
        seconds,
        totals,
        attempts,
    }
}
