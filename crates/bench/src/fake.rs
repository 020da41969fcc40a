//! In-process targets with known behaviour: a simulated single-server FIFO queue on tokio time,
//! and a target that answers at once (to measure the generator's own ceiling).

use crate::target::{Op, Reply, Target};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::{sleep_until, Instant};

/// Answers every request immediately, with no await point: the generator's ceiling.
#[derive(Debug, Default)]
pub struct Immediate {
    served: AtomicU64,
}

impl Target for Immediate {
    async fn execute(&self, _op: Op) -> Reply {
        self.served.fetch_add(1, Ordering::Relaxed);
        Reply::Ok
    }

    fn attempts(&self) -> Option<u64> {
        Some(self.served.load(Ordering::Relaxed))
    }
}

/// Behaviour of a [`FakeServer`].
#[derive(Clone, Debug, Default)]
pub struct FakeConfig {
    /// Time to serve one request; requests are served one at a time, first come first served.
    pub service: Duration,
    /// Admission: reject with `Overloaded` (at no cost) when the queue wait would exceed this.
    pub max_queue_delay: Option<Duration>,
    /// Server timeout: a request that would wait longer gets a timeout after this long, unserved.
    pub server_timeout: Option<Duration>,
    /// The server serves nothing between these two offsets from its creation.
    pub stall: Option<(Duration, Duration)>,
    /// Per-partition limit in requests per second (fixed one-second windows).
    pub partition_limit: Option<u32>,
}

#[derive(Debug)]
struct FakeState {
    next_free: Instant,
    window: u64,
    per_partition: HashMap<i64, u32>,
}

/// A simulated single-server queue: an exact model to check the generator's accounting against.
#[derive(Debug)]
pub struct FakeServer {
    cfg: FakeConfig,
    t0: Instant,
    state: Mutex<FakeState>,
    arrivals: AtomicU64,
}

impl FakeServer {
    /// A server created now (stall offsets count from here).
    pub fn new(cfg: FakeConfig) -> Self {
        let t0 = Instant::now();
        Self {
            cfg,
            t0,
            state: Mutex::new(FakeState {
                next_free: t0,
                window: 0,
                per_partition: HashMap::new(),
            }),
            arrivals: AtomicU64::new(0),
        }
    }

    /// Decides the reply and the instant it is sent, updating the queue.
    fn admit(&self, op: Op, now: Instant) -> (Reply, Instant) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(limit) = self.cfg.partition_limit {
            let window = now.saturating_duration_since(self.t0).as_secs();
            if window != s.window {
                // One window at a time keeps the map bounded by one second of arrivals.
                s.window = window;
                s.per_partition.clear();
            }
            let n = s.per_partition.entry(op.pk).or_insert(0);
            *n += 1;
            if *n > limit {
                return (Reply::RateLimited, now);
            }
        }
        let mut start = s.next_free.max(now);
        if let Some((a, b)) = self.cfg.stall {
            if start >= self.t0 + a && start < self.t0 + b {
                start = self.t0 + b;
            }
        }
        let wait = start - now;
        if self.cfg.max_queue_delay.is_some_and(|q| wait > q) {
            return (Reply::Overloaded, now);
        }
        if let Some(t) = self.cfg.server_timeout.filter(|t| wait > *t) {
            return (Reply::ServerTimeout, now + t);
        }
        s.next_free = start + self.cfg.service;
        (Reply::Ok, s.next_free)
    }
}

impl Target for FakeServer {
    async fn execute(&self, op: Op) -> Reply {
        self.arrivals.fetch_add(1, Ordering::Relaxed);
        let (reply, at) = self.admit(op, Instant::now());
        sleep_until(at).await;
        reply
    }

    fn attempts(&self) -> Option<u64> {
        Some(self.arrivals.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    //! Each test runs the real runner against the fake on paused tokio time and compares the
    //! counts with what the queueing model predicts.

    use super::*;
    use crate::runner::{run_step, RunConfig, StreamSpec};
    use crate::schedule::Arrival;
    use crate::target::KeyDist;
    use std::sync::Arc;

    fn cfg(deadline_ms: u64, client_timeout_ms: u64) -> RunConfig {
        RunConfig {
            arrival: Arrival::Constant,
            deadline: Duration::from_millis(deadline_ms),
            client_timeout: Duration::from_millis(client_timeout_ms),
            lag_tolerance: Duration::from_millis(1),
            max_in_flight: 100_000,
            seed: 1,
            progress: false,
        }
    }

    fn writes(rate: f64) -> Vec<StreamSpec> {
        vec![StreamSpec {
            rate,
            read_fraction: 0.0,
            keys: KeyDist::Uniform { partitions: 1000 },
            rows: 1,
        }]
    }

    fn near(actual: u64, expected: f64, tolerance: f64) -> bool {
        (actual as f64 - expected).abs() <= expected * tolerance + 2.0
    }

    #[tokio::test(start_paused = true)]
    async fn under_capacity_everything_is_goodput() {
        // Whole milliseconds throughout: tokio timers round sleeps up to the next millisecond.
        let fake = Arc::new(FakeServer::new(FakeConfig {
            service: Duration::from_millis(1),
            ..Default::default()
        }));
        let r = run_step(
            &fake,
            &writes(500.0),
            Duration::from_secs(3),
            &cfg(10, 10),
            0,
        )
        .await;
        let c = r.totals[0].counts;
        assert_eq!((c.offered, c.sent, c.ok, c.failed()), (1500, 1500, 1500, 0));
        assert_eq!(c.lagged, 0);
        assert_eq!(r.attempts, Some(1500));
        // Service time only: 1 ms for every request, no queueing.
        assert_eq!(r.totals[0].hist.min(), 1000);
        assert_eq!(r.totals[0].hist.max(), 1000);
        assert!(r.seconds.len() >= 3);
        assert_eq!(r.seconds[1].classes[0].counts.ok, 500);
    }

    #[tokio::test(start_paused = true)]
    async fn unprotected_queue_at_twice_capacity_collapses_as_the_model_predicts() {
        // Service 1 ms, arrivals every 0.5 ms: request k completes at (k+1) ms, so its latency
        // is 1 + 0.5k ms, and only k <= 98 meet the 50 ms deadline. The rest time out on the
        // client, while the server keeps working on them: goodput collapses to ~100 in 2 s.
        let fake = Arc::new(FakeServer::new(FakeConfig {
            service: Duration::from_millis(1),
            ..Default::default()
        }));
        let r = run_step(
            &fake,
            &writes(2000.0),
            Duration::from_secs(2),
            &cfg(50, 50),
            0,
        )
        .await;
        let c = r.totals[0].counts;
        assert_eq!(c.offered, 4000);
        assert!(near(c.ok, 99.0, 0.0), "ok {}", c.ok);
        assert!(
            near(c.client_timeout, 3901.0, 0.0),
            "client timeouts {}",
            c.client_timeout
        );
        assert_eq!(c.completed(), 4000);
    }

    #[tokio::test(start_paused = true)]
    async fn admission_keeps_goodput_at_capacity_and_counts_rejections() {
        // Admitted requests wait at most 10 ms, so the server serves T/S plus the 10 ms backlog
        // and everything else is rejected at once: ok ~ 2000 + 10, overloaded ~ 1990.
        let fake = Arc::new(FakeServer::new(FakeConfig {
            service: Duration::from_millis(1),
            max_queue_delay: Some(Duration::from_millis(10)),
            ..Default::default()
        }));
        let r = run_step(
            &fake,
            &writes(2000.0),
            Duration::from_secs(2),
            &cfg(50, 50),
            0,
        )
        .await;
        let c = r.totals[0].counts;
        assert!(near(c.ok, 2010.0, 0.01), "ok {}", c.ok);
        assert!(
            near(c.overloaded, 1990.0, 0.01),
            "overloaded {}",
            c.overloaded
        );
        assert_eq!(c.late + c.client_timeout + c.server_timeout, 0);
        // 10 ms queue + 1 ms service + up to 0.5 ms of timer rounding at the generator.
        assert!(
            r.totals[0].hist.max() <= 12_000,
            "max {}",
            r.totals[0].hist.max()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn server_timeouts_and_late_successes_are_counted_apart() {
        // Same 2x overload with a 5 ms server timeout: ~2005 served, ~1995 timed out by the server.
        let fake = Arc::new(FakeServer::new(FakeConfig {
            service: Duration::from_millis(1),
            server_timeout: Some(Duration::from_millis(5)),
            ..Default::default()
        }));
        let r = run_step(
            &fake,
            &writes(2000.0),
            Duration::from_secs(2),
            &cfg(50, 50),
            0,
        )
        .await;
        let c = r.totals[0].counts;
        assert!(near(c.ok, 2005.0, 0.01), "ok {}", c.ok);
        assert!(
            near(c.server_timeout, 1995.0, 0.01),
            "server timeouts {}",
            c.server_timeout
        );

        // A 30 ms service time with a 20 ms deadline and 100 ms client timeout: all late.
        let slow = Arc::new(FakeServer::new(FakeConfig {
            service: Duration::from_millis(30),
            ..Default::default()
        }));
        let r = run_step(
            &slow,
            &writes(10.0),
            Duration::from_secs(1),
            &cfg(20, 100),
            0,
        )
        .await;
        let c = r.totals[0].counts;
        assert_eq!((c.ok, c.late, c.client_timeout), (0, 10, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn partition_limit_rejections_match_the_limit() {
        let fake = Arc::new(FakeServer::new(FakeConfig {
            partition_limit: Some(100),
            ..Default::default()
        }));
        let hot = vec![StreamSpec {
            rate: 1000.0,
            read_fraction: 1.0,
            keys: KeyDist::Single { pk: 7 },
            rows: 1,
        }];
        let r = run_step(&fake, &hot, Duration::from_secs(2), &cfg(50, 50), 0).await;
        let c = r.totals[0].counts;
        assert_eq!((c.ok, c.rate_limited), (200, 1800));
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_stall_shows_in_every_request_scheduled_during_it() {
        // 1000 req/s, instant service, the server stalls from 1.0 s to 1.5 s. The ~500 requests
        // scheduled during the stall wait until 1.5 s; measured from their intended times their
        // latencies spread evenly over 0-500 ms. A closed-loop client (coordinated omission)
        // would have sent one request during the stall and seen one slow answer.
        let fake = Arc::new(FakeServer::new(FakeConfig {
            service: Duration::ZERO,
            stall: Some((Duration::from_millis(1000), Duration::from_millis(1500))),
            ..Default::default()
        }));
        let r = run_step(
            &fake,
            &writes(1000.0),
            Duration::from_secs(3),
            &cfg(1000, 1000),
            0,
        )
        .await;
        let h = &r.totals[0].hist;
        assert_eq!(h.len(), 3000);
        let over_100ms = h.count_between(100_000, 1_000_000);
        let over_250ms = h.count_between(250_000, 1_000_000);
        assert!(near(over_100ms, 400.0, 0.02), "over 100 ms: {over_100ms}");
        assert!(near(over_250ms, 250.0, 0.02), "over 250 ms: {over_250ms}");
        assert!((495_000..=505_000).contains(&h.max()), "max {}", h.max());
        // The stall happened in second 1; later seconds are fast again.
        assert!(r.seconds[1].classes[0].latency.max_us >= 490_000);
        assert!(r.seconds[2].classes[0].latency.p50_us < 1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_cap_is_reported_as_unsent_not_hidden() {
        let fake = Arc::new(FakeServer::new(FakeConfig {
            service: Duration::from_millis(1),
            ..Default::default()
        }));
        let mut c = cfg(1000, 1000);
        c.max_in_flight = 10;
        let r = run_step(&fake, &writes(2000.0), Duration::from_secs(1), &c, 0).await;
        let t = r.totals[0].counts;
        assert_eq!(t.offered, 2000);
        assert_eq!(t.sent + t.unsent, 2000);
        assert!(t.unsent > 900, "unsent {}", t.unsent);
    }

    #[tokio::test(start_paused = true)]
    async fn immediate_target_serves_everything_on_time() {
        let imm = Arc::new(Immediate::default());
        let r = run_step(
            &imm,
            &writes(5000.0),
            Duration::from_secs(1),
            &cfg(10, 10),
            0,
        )
        .await;
        assert_eq!(r.totals[0].counts.ok, 5000);
        assert_eq!(r.attempts, Some(5000));
    }
}
