//! Discrete-event simulations of the overload controls, driven by the same code the server
//! runs and a fake clock, with seeded randomness so every run is reproducible.
//!
//! * [`run_admission`]: one shard with a single CPU (FIFO, fixed or exponential service
//!   time), open-loop constant or Poisson arrivals, a per-request deadline, and either the
//!   [`AdmissionController`] or no admission control at all (an unbounded FIFO that runs
//!   everything, like a server without deadlines). Goodput counts requests whose response
//!   was complete before their deadline.
//! * [`run_limiter`]: one hot partition offered a multiple of its limit, plus optional
//!   background partitions, through the [`RateLimiter`], reporting accepted operations per
//!   simulated second.
//! * [`window`]: one connection, windowed or open-loop, through the real
//!   [`AdmissionController`] and [`crate::backlog::BacklogWatch`].
//!
//! The shard's whole request pipeline under overload (its reader, admission, execution and
//! answers, over a manual clock) is simulated by the server's own tests
//! (`crates/server/src/sim.rs`), on the real code rather than a model of it.

use crate::admission::{AdmissionConfig, AdmissionController, Verdict};
use crate::clock::{duration_nanos, Nanos};
use crate::deadline::Deadline;
use crate::rate_limit::{Decision, LimitKey, OpType, RateLimiter, RateLimiterConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::time::Duration;

pub mod txn;
pub mod window;

/// How requests arrive.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Arrivals {
    /// Evenly spaced.
    Constant,
    /// Exponential inter-arrival times (open-loop Poisson process).
    Poisson,
}

/// How long the CPU spends serving one request.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Service {
    /// Always the same.
    Fixed(Duration),
    /// Exponentially distributed with this mean.
    Exponential(Duration),
}

impl Service {
    fn mean(self) -> Duration {
        match self {
            Service::Fixed(d) | Service::Exponential(d) => d,
        }
    }

    fn sample(self, rng: &mut StdRng) -> u64 {
        match self {
            Service::Fixed(d) => duration_nanos(d),
            Service::Exponential(d) => exp_sample(rng, duration_nanos(d) as f64),
        }
    }
}

fn exp_sample(rng: &mut StdRng, mean: f64) -> u64 {
    let u: f64 = rng.random();
    (-mean * (1.0 - u).ln()).max(1.0) as u64
}

/// Which admission policy the simulated shard runs.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Policy {
    /// The [`AdmissionController`] with this configuration.
    Admission(AdmissionConfig),
    /// No admission control: unbounded FIFO, no deadline checks, everything executed.
    Uncontrolled,
}

/// One admission simulation run.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct AdmissionSim {
    /// Offered load as a multiple of the CPU's capacity (`1 / mean service time`).
    pub load: f64,
    /// Arrival process.
    pub arrivals: Arrivals,
    /// Service time model.
    pub service: Service,
    /// CPU time to turn a request away (shed or expired), charged to the same CPU.
    pub reject_cost: Duration,
    /// Per-request deadline relative to arrival (the client's `USING TIMEOUT`).
    pub deadline: Duration,
    /// Simulated time.
    pub duration: Duration,
    /// Initial period excluded from the figures.
    pub warmup: Duration,
    /// Admission policy.
    pub policy: Policy,
    /// RNG seed.
    pub seed: u64,
}

impl Default for AdmissionSim {
    fn default() -> Self {
        AdmissionSim {
            load: 1.0,
            arrivals: Arrivals::Poisson,
            service: Service::Exponential(Duration::from_micros(100)),
            reject_cost: Duration::ZERO,
            deadline: Duration::from_millis(10),
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            policy: Policy::Admission(AdmissionConfig::default()),
            seed: 1,
        }
    }
}

/// The outcome of an admission simulation (figures exclude the warm-up).
#[derive(Clone, Debug, PartialEq)]
pub struct AdmissionReport {
    /// Requests that arrived.
    pub arrived: u64,
    /// Requests served (completed), in time or not.
    pub served: u64,
    /// Requests served before their deadline.
    pub good: u64,
    /// Requests shed (queue full or queue delay).
    pub shed: u64,
    /// Requests dropped as expired before execution.
    pub expired: u64,
    /// Goodput in requests per second.
    pub goodput: f64,
    /// Goodput as a fraction of the CPU's capacity.
    pub goodput_ratio: f64,
    /// Median queue delay of served requests: arrival to start of service on the CPU, so
    /// it includes any queue hidden behind the concurrency limit.
    pub sojourn_p50: Duration,
    /// 99th percentile queue delay of served requests (same definition).
    pub sojourn_p99: Duration,
    /// 99th percentile response time (arrival to completion) of served requests.
    pub latency_p99: Duration,
    /// Concurrency limit at the end (0 when uncontrolled).
    pub final_limit: u32,
}

struct Req {
    arrival: u64,
    deadline: u64,
    dispatched: u64,
}

/// Runs one admission simulation.
pub fn run_admission(sim: &AdmissionSim) -> AdmissionReport {
    let mut rng = StdRng::seed_from_u64(sim.seed);
    let mean_service = duration_nanos(sim.service.mean()).max(1) as f64;
    let capacity = 1e9 / mean_service;
    let gap = mean_service / sim.load.max(1e-9);
    let end = duration_nanos(sim.duration);
    let warm = duration_nanos(sim.warmup);
    let reject_cost = duration_nanos(sim.reject_cost);
    let deadline = duration_nanos(sim.deadline);

    let mut ctl = match sim.policy {
        Policy::Admission(cfg) => Some(AdmissionController::<Req>::new(cfg)),
        Policy::Uncontrolled => None,
    };
    let mut fifo: VecDeque<Req> = VecDeque::new(); // uncontrolled queue
                                                   // Dispatched jobs on the CPU, completing in FIFO order: (done, service start, request).
    let mut cpu: VecDeque<(u64, u64, Req)> = VecDeque::new();
    let mut busy_until = 0u64;
    let mut next_arrival = 0u64;
    let mut arrived = 0u64;
    let (mut served, mut good, mut shed, mut expired) = (0u64, 0u64, 0u64, 0u64);
    let mut sojourns: Vec<u64> = Vec::new();
    let mut latencies: Vec<u64> = Vec::new();

    loop {
        let next_done = cpu.front().map_or(u64::MAX, |j| j.0);
        let now = next_arrival.min(next_done);
        if now >= end {
            break;
        }
        let counted = now >= warm;
        if next_done <= next_arrival {
            if let Some((done, started, req)) = cpu.pop_front() {
                if counted {
                    served += 1;
                    if done <= req.deadline {
                        good += 1;
                    }
                    sojourns.push(started - req.arrival);
                    latencies.push(done - req.arrival);
                }
                if let Some(c) = ctl.as_mut() {
                    // Execution latency as the server sees it: dispatch to completion.
                    let dispatched = req.dispatched;
                    c.on_complete(Duration::from_nanos(done - dispatched), Nanos(done));
                }
            }
        } else {
            if counted {
                arrived += 1;
            }
            let req = Req {
                arrival: now,
                deadline: now + deadline,
                dispatched: 0,
            };
            match ctl.as_mut() {
                Some(c) => {
                    let dl = Deadline(Nanos(req.deadline));
                    if c.enqueue(req, Nanos(now), dl).is_err() {
                        busy_until = busy_until.max(now) + reject_cost;
                        shed += u64::from(counted);
                    }
                }
                None => fifo.push_back(req),
            }
            next_arrival = now
                + match sim.arrivals {
                    Arrivals::Constant => gap.max(1.0) as u64,
                    Arrivals::Poisson => exp_sample(&mut rng, gap),
                };
        }
        // Dispatch whatever the policy allows at this instant.
        match ctl.as_mut() {
            Some(c) => {
                let mut rejected = 0u64;
                let mut exp = 0u64;
                while let Some(q) = c.dispatch(Nanos(now), |_, v| match v {
                    Verdict::Expired => exp += 1,
                    _ => rejected += 1,
                }) {
                    let start = busy_until.max(now);
                    busy_until = start + sim.service.sample(&mut rng);
                    let req = Req {
                        dispatched: now,
                        ..q.item
                    };
                    cpu.push_back((busy_until, start, req));
                }
                busy_until = busy_until.max(now) + (rejected + exp) * reject_cost;
                if counted {
                    shed += rejected;
                    expired += exp;
                }
            }
            None => {
                while let Some(req) = fifo.pop_front() {
                    let start = busy_until.max(now);
                    busy_until = start + sim.service.sample(&mut rng);
                    cpu.push_back((busy_until, start, req));
                }
            }
        }
    }
    let secs = (end - warm) as f64 / 1e9;
    let goodput = good as f64 / secs;
    AdmissionReport {
        arrived,
        served,
        good,
        shed,
        expired,
        goodput,
        goodput_ratio: goodput / capacity,
        sojourn_p50: percentile(&mut sojourns, 0.50),
        sojourn_p99: percentile(&mut sojourns, 0.99),
        latency_p99: percentile(&mut latencies, 0.99),
        final_limit: ctl.map_or(0, |c| c.concurrency_limit()),
    }
}

fn percentile(v: &mut [u64], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    Duration::from_nanos(v[i])
}

/// One rate-limiter simulation run.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct LimiterSim {
    /// The hot partition's limit (ops/s).
    pub limit: u32,
    /// The hot partition's offered rate as a multiple of its limit.
    pub multiplier: f64,
    /// Arrival process of the hot partition.
    pub arrivals: Arrivals,
    /// Background partitions, each offered `background_rate` ops/s (Poisson), same limit.
    pub background_keys: u32,
    /// Offered rate of each background partition.
    pub background_rate: f64,
    /// Simulated seconds.
    pub secs: u64,
    /// Wall-clock second at which the run starts (to place it across a window-id wrap).
    pub start_wall_secs: u64,
    /// Limiter configuration.
    pub config: RateLimiterConfig,
    /// RNG seed.
    pub seed: u64,
}

impl Default for LimiterSim {
    fn default() -> Self {
        LimiterSim {
            limit: 1_000,
            multiplier: 10.0,
            arrivals: Arrivals::Constant,
            background_keys: 0,
            background_rate: 0.0,
            secs: 60,
            start_wall_secs: 1_700_000_000,
            config: RateLimiterConfig::default(),
            seed: 1,
        }
    }
}

/// Per-second outcome of a limiter simulation.
#[derive(Clone, Debug, PartialEq)]
pub struct LimiterReport {
    /// Hot partition: accepted operations in each simulated second.
    pub hot_accepted: Vec<u64>,
    /// Hot partition: offered operations in each simulated second.
    pub hot_offered: Vec<u64>,
    /// Background partitions: offered and accepted in total.
    pub background_offered: u64,
    /// Background partitions: accepted in total.
    pub background_accepted: u64,
    /// Limiter memory before the run.
    pub memory_before: usize,
    /// Limiter memory after the run.
    pub memory_after: usize,
    /// Evictions during the run.
    pub evictions: u64,
}

/// Runs one limiter simulation: events of the hot and background partitions are merged in
/// time order and each one is accounted with a fresh random number, as a coordinator would.
pub fn run_limiter(sim: &LimiterSim) -> LimiterReport {
    let mut rng = StdRng::seed_from_u64(sim.seed);
    let mut rl = RateLimiter::with_salt(sim.config, sim.seed);
    let memory_before = rl.memory_bytes();
    let start = Nanos::from_secs(sim.start_wall_secs).0;
    let end = start + sim.secs * 1_000_000_000;
    let hot_rate = f64::from(sim.limit) * sim.multiplier;
    let hot_gap = 1e9 / hot_rate.max(1e-9);
    let hot = LimitKey {
        token: 0x5151,
        table: 1,
        op: OpType::Write,
    };
    // Background arrivals as one merged Poisson process over uniformly chosen keys.
    let bg_total = f64::from(sim.background_keys) * sim.background_rate;
    let bg_gap = if bg_total > 0.0 {
        1e9 / bg_total
    } else {
        f64::INFINITY
    };
    let mut next_hot = start as f64;
    let mut next_bg = if bg_gap.is_finite() {
        start as f64 + exp_sample(&mut rng, bg_gap) as f64
    } else {
        f64::INFINITY
    };
    let secs = usize::try_from(sim.secs).unwrap_or(0);
    let mut hot_accepted = vec![0u64; secs];
    let mut hot_offered = vec![0u64; secs];
    let (mut bg_off, mut bg_acc) = (0u64, 0u64);
    loop {
        let t = next_hot.min(next_bg);
        if t >= end as f64 {
            break;
        }
        let now = Nanos(t as u64);
        let sec = ((now.0 - start) / 1_000_000_000) as usize;
        if next_hot <= next_bg {
            let d = rl.account_and_decide(hot, sim.limit, rng.random(), now);
            if let (Some(o), Some(a)) = (hot_offered.get_mut(sec), hot_accepted.get_mut(sec)) {
                *o += 1;
                *a += u64::from(d == Decision::Accept);
            }
            next_hot += match sim.arrivals {
                Arrivals::Constant => hot_gap,
                Arrivals::Poisson => exp_sample(&mut rng, hot_gap) as f64,
            };
        } else {
            let k = LimitKey {
                token: i64::from(rng.random_range(0..sim.background_keys)) + 1_000_000,
                table: 1,
                op: OpType::Write,
            };
            bg_off += 1;
            bg_acc += u64::from(
                rl.account_and_decide(k, sim.limit, rng.random(), now) == Decision::Accept,
            );
            next_bg += exp_sample(&mut rng, bg_gap) as f64;
        }
    }
    LimiterReport {
        hot_accepted,
        hot_offered,
        background_offered: bg_off,
        background_accepted: bg_acc,
        memory_before,
        memory_after: rl.memory_bytes(),
        evictions: rl.stats().evictions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate_limit::{Acceptance, ColdStart};

    fn admission(load: f64) -> AdmissionReport {
        let r = run_admission(&AdmissionSim {
            load,
            ..AdmissionSim::default()
        });
        eprintln!("admission load={load}: {r:?}");
        r
    }

    #[test]
    fn admission_keeps_goodput_and_bounded_delay_under_overload() {
        let at_capacity = admission(1.0);
        let target = Duration::from_millis(5);
        for load in [3.0, 10.0] {
            let r = admission(load);
            assert!(
                r.goodput >= 0.95 * at_capacity.goodput,
                "load {load}: goodput {} vs {} at capacity",
                r.goodput,
                at_capacity.goodput
            );
            assert!(r.goodput_ratio >= 0.9, "load {load}: {r:?}");
            assert!(r.sojourn_p99 <= 3 * target, "load {load}: {r:?}");
            assert!(
                r.good as f64 >= 0.99 * r.served as f64,
                "admitted work is useful"
            );
        }
    }

    #[test]
    fn admission_sheds_nothing_at_half_load() {
        for seed in 1..=3 {
            let r = run_admission(&AdmissionSim {
                load: 0.5,
                seed,
                ..AdmissionSim::default()
            });
            eprintln!("admission load=0.5 seed={seed}: {r:?}");
            assert_eq!((r.shed, r.expired), (0, 0), "{r:?}");
            assert_eq!(r.good, r.served);
            assert!((r.goodput_ratio - 0.5).abs() < 0.02, "{r:?}");
        }
    }

    #[test]
    fn no_admission_control_collapses() {
        let controlled = admission(3.0);
        let r = run_admission(&AdmissionSim {
            load: 3.0,
            policy: Policy::Uncontrolled,
            ..AdmissionSim::default()
        });
        eprintln!("uncontrolled load=3: {r:?}");
        assert!(
            r.goodput < 0.05 * controlled.goodput,
            "uncontrolled {} vs controlled {}",
            r.goodput,
            controlled.goodput
        );
        // It stays busy all along: throughput is not goodput.
        assert!(r.served as f64 > 0.9 * 9.0 * 10_000.0, "{r:?}");
    }

    #[test]
    fn codel_sheds_when_deadlines_are_long() {
        // The default write timeout (2 s): deadlines no longer bound the queue, CoDel does.
        let long = |policy| {
            run_admission(&AdmissionSim {
                load: 3.0,
                deadline: Duration::from_secs(2),
                policy,
                ..AdmissionSim::default()
            })
        };
        let r = long(Policy::Admission(AdmissionConfig::default()));
        let u = long(Policy::Uncontrolled);
        eprintln!("3x, 2 s deadline: controlled {r:?}\nuncontrolled {u:?}");
        assert!(r.shed > 0 && r.expired == 0, "{r:?}");
        assert!(r.goodput_ratio >= 0.95, "{r:?}");
        assert!(r.sojourn_p99 <= Duration::from_millis(15), "{r:?}");
        // Without control the queue grows by two seconds of work every second: goodput only
        // in the first second or so, then nothing (the longer the run, the lower the ratio).
        assert!(u.goodput < 0.3 * r.goodput, "{u:?}");
        assert!(u.sojourn_p99 > Duration::from_secs(4), "{u:?}");
    }

    #[test]
    fn adaptive_lifo_beats_fifo_with_deadline_drops() {
        // Same controller without the overloaded queue bound, FIFO only: requests are served
        // just before their deadline.
        let unbounded = |adaptive_lifo| {
            run_admission(&AdmissionSim {
                load: 3.0,
                policy: Policy::Admission(AdmissionConfig {
                    adaptive_lifo,
                    shed_at_enqueue: false,
                    ..AdmissionConfig::default()
                }),
                ..AdmissionSim::default()
            })
        };
        let (fifo, lifo) = (unbounded(false), unbounded(true));
        eprintln!("3x unbounded FIFO: {fifo:?}\n3x unbounded LIFO: {lifo:?}");
        assert!(fifo.sojourn_p99 > 3 * lifo.sojourn_p99, "{fifo:?}");
        assert!(lifo.goodput >= fifo.goodput, "{fifo:?}");
        // Bounded while overloaded to what is dispatched within the target, even FIFO waits
        // about the target at most.
        let bounded_fifo = run_admission(&AdmissionSim {
            load: 3.0,
            policy: Policy::Admission(AdmissionConfig {
                adaptive_lifo: false,
                ..AdmissionConfig::default()
            }),
            ..AdmissionSim::default()
        });
        eprintln!("3x bounded FIFO: {bounded_fifo:?}");
        assert!(
            bounded_fifo.sojourn_p99 <= Duration::from_millis(6),
            "{bounded_fifo:?}"
        );
        assert!(bounded_fifo.goodput_ratio >= 0.95, "{bounded_fifo:?}");
    }

    #[test]
    fn cheap_rejections_keep_goodput_at_ten_times_capacity() {
        // Rejections that cost 0.5% of a served request (the T2 budget is 2%).
        let r = run_admission(&AdmissionSim {
            load: 10.0,
            reject_cost: Duration::from_nanos(500),
            ..AdmissionSim::default()
        });
        eprintln!("admission load=10 reject_cost=0.5%: {r:?}");
        assert!(r.goodput_ratio >= 0.9, "{r:?}");
    }

    fn limiter(limit: u32, multiplier: f64, config: RateLimiterConfig) -> LimiterReport {
        let r = run_limiter(&LimiterSim {
            limit,
            multiplier,
            config,
            ..LimiterSim::default()
        });
        eprintln!(
            "limiter L={limit} {multiplier}x {:?} {:?}: first {:?} min {:?} max {:?} mean {:.1}",
            config.cold_start,
            config.acceptance,
            &r.hot_accepted[..6],
            r.hot_accepted[1..].iter().min(),
            r.hot_accepted[1..].iter().max(),
            mean(&r.hot_accepted[1..])
        );
        r
    }

    fn mean(v: &[u64]) -> f64 {
        v.iter().sum::<u64>() as f64 / v.len().max(1) as f64
    }

    fn std_dev(v: &[u64]) -> f64 {
        let m = mean(v);
        (v.iter().map(|&a| (a as f64 - m).powi(2)).sum::<f64>() / v.len().max(1) as f64).sqrt()
    }

    #[test]
    fn hot_partition_accepted_rate_tracks_the_limit() {
        // The default rule carries each decision's rounding residual, so the count accepted
        // in any second is the sum of the decision probabilities ± 2: with constant arrivals
        // every second after the first is within ±10% of the limit (measured ±2%), at a small
        // limit as at a large one. The first second is the young token bucket: burst + rate.
        for l in [100u32, 1_000] {
            for m in [2.0, 10.0, 100.0] {
                let r = limiter(l, m, RateLimiterConfig::default());
                let l = f64::from(l);
                assert!(
                    r.hot_accepted[0] as f64 <= 2.0 * l + 1.0,
                    "L={l} {m}x first second"
                );
                for (s, &a) in r.hot_accepted.iter().enumerate().skip(1) {
                    assert!(
                        (a as f64 - l).abs() <= 0.1 * l,
                        "L={l} {m}x second {s}: {:?}",
                        r.hot_accepted
                    );
                }
                assert!(
                    (mean(&r.hot_accepted[1..]) - l).abs() <= 0.01 * l,
                    "L={l} {m}x mean"
                );
            }
        }
    }

    #[test]
    fn independent_rule_per_second_noise_is_statistical() {
        // ScyllaDB's rule draws each operation above 2L independently: a second's accepted
        // count is a sum of Bernoulli draws with standard deviation about √L, i.e. 10% at
        // L = 100, so a per-second ±10% bound there is a coin toss over 59 seconds (measured
        // 71..132 over 5 seeds). At L = 1000 the same bound is 3.2σ per second (a few
        // excursions per hour of seconds; measured 887..1089 over 5 seeds), and a 5-second
        // block's ±10% is 7σ. The carried rule removes the noise with the same expectation.
        let independent = RateLimiterConfig {
            acceptance: Acceptance::Independent,
            ..RateLimiterConfig::default()
        };
        let noisy = limiter(100, 10.0, independent);
        let carried = limiter(100, 10.0, RateLimiterConfig::default());
        let (sd_noisy, sd_carried) = (
            std_dev(&noisy.hot_accepted[5..]),
            std_dev(&carried.hot_accepted[5..]),
        );
        eprintln!("L=100 10x per-second σ: independent {sd_noisy:.2}, carried {sd_carried:.2}");
        assert!((5.0..=15.0).contains(&sd_noisy), "{sd_noisy} ≈ √100");
        assert!(sd_carried <= 1.5, "{sd_carried}");
        assert!((mean(&noisy.hot_accepted[5..]) - 100.0).abs() <= 4.0);
        for m in [2.0, 10.0, 100.0] {
            let r = limiter(1_000, m, independent);
            for (s, &a) in r.hot_accepted.iter().enumerate().skip(1) {
                assert!((850..=1_150).contains(&a), "{m}x second {s}: {a}");
            }
            for (b, block) in r.hot_accepted[1..].chunks(5).enumerate() {
                let rate = mean(block);
                assert!((rate - 1_000.0).abs() <= 100.0, "{m}x block {b}: {rate}");
            }
            assert!((mean(&r.hot_accepted[1..]) - 1_000.0).abs() <= 30.0);
        }
    }

    #[test]
    fn scylla_cold_start_for_comparison() {
        // The unsmoothed behaviour the default fixes: a burst, then slow convergence.
        let r = limiter(
            1_000,
            10.0,
            RateLimiterConfig {
                cold_start: ColdStart::Scylla,
                ..RateLimiterConfig::default()
            },
        );
        assert!(r.hot_accepted[0] > 3_000, "{:?}", &r.hot_accepted[..4]);
        assert!(r.hot_accepted[1] > 1_400, "{:?}", &r.hot_accepted[..4]);
        assert!((mean(&r.hot_accepted[10..]) - 1_000.0).abs() <= 30.0);
    }

    #[test]
    fn hot_partition_with_poisson_arrivals_and_neighbours() {
        let r = run_limiter(&LimiterSim {
            limit: 1_000,
            multiplier: 100.0,
            arrivals: Arrivals::Poisson,
            background_keys: 2_000,
            background_rate: 50.0,
            secs: 20,
            ..LimiterSim::default()
        });
        let m = mean(&r.hot_accepted[1..]);
        eprintln!(
            "poisson 100x + 2000 neighbours at 5% of limit: mean {m:.1}, neighbours {}/{}",
            r.background_accepted, r.background_offered
        );
        assert!((m - 1_000.0).abs() <= 10.0, "{m}");
        for (s, &a) in r.hot_accepted.iter().enumerate().skip(1) {
            assert!(
                (900..=1_100).contains(&a),
                "second {s}: {:?}",
                r.hot_accepted
            );
        }
        assert_eq!(
            r.background_accepted, r.background_offered,
            "under-limit never rejected"
        );
        // At 10x the Poisson offered count varies by ±1% per second (√10,000), the accepted
        // count by a little more (measured 974..1018 over 5 seeds). At 2x it would follow the
        // offered count's own ±2.2%, amplified by the ≤ 2L rule, so only 10x and up are bound.
        let r = run_limiter(&LimiterSim {
            limit: 1_000,
            multiplier: 10.0,
            arrivals: Arrivals::Poisson,
            secs: 30,
            ..LimiterSim::default()
        });
        for (s, &a) in r.hot_accepted.iter().enumerate().skip(1) {
            assert!(
                (900..=1_100).contains(&a),
                "10x second {s}: {:?}",
                r.hot_accepted
            );
        }
    }

    #[test]
    fn memory_is_constant_through_a_million_partitions() {
        let r = run_limiter(&LimiterSim {
            limit: 10,
            multiplier: 0.0,
            background_keys: 1_000_000,
            background_rate: 0.5, // 500,000 ops/s over a million keys for 4 s
            secs: 4,
            ..LimiterSim::default()
        });
        eprintln!(
            "1M partitions: {} ops, {} evictions, memory {} -> {}",
            r.background_offered, r.evictions, r.memory_before, r.memory_after
        );
        assert!(r.background_offered > 1_900_000);
        assert_eq!(r.memory_before, r.memory_after);
        assert_eq!(r.background_accepted, r.background_offered);
    }

    #[test]
    fn no_reset_across_the_window_wrap() {
        // Start 10 s before the 12-bit window id wraps; run 30 s at 10x.
        let wrap = (1_700_000_000u64 | 0xFFF) + 1;
        let r = run_limiter(&LimiterSim {
            start_wall_secs: wrap - 10,
            secs: 30,
            ..LimiterSim::default()
        });
        eprintln!("across wrap: {:?}", &r.hot_accepted[8..14]);
        for (s, &a) in r.hot_accepted.iter().enumerate().skip(1) {
            assert!(
                (900..=1_100).contains(&a),
                "second {s}: {:?}",
                r.hot_accepted
            );
        }
    }
}
