//! gSuneido's experiment on a fake clock: closed-loop clients running short transactions
//! on overlapping keys, through the real [`TxnLimiter`] or with no limit at all.
//!
//! The system is a model, not the server: `k` transactions running together each progress
//! at `1 / (1 + contention·(k-1)²)` of their solo speed (conflicts and lock waits grow with
//! the pairs that overlap), so committed throughput `k / (1 + contention·(k-1)²)` peaks at
//! some `k` and falls beyond it, as gSuneido's measured throughput did. Time advances in
//! fixed steps.

use crate::clock::Nanos;
use crate::txn_limit::{TxnAdmit, TxnLimitConfig, TxnLimiter};
use std::time::Duration;

/// One run of the transaction simulation.
#[derive(Copy, Clone, Debug)]
pub struct TxnSim {
    /// Closed-loop clients, each with one transaction at a time and no think time.
    pub clients: u32,
    /// Work of one transaction when it runs alone.
    pub service: Duration,
    /// How strongly concurrent transactions slow each other.
    pub contention: f64,
    /// Each transaction's deadline, from its issue.
    pub deadline: Duration,
    /// The adaptive limit, or `None` for none (every transaction runs at once).
    pub limit: Option<TxnLimitConfig>,
    /// Simulated time.
    pub duration: Duration,
    /// Length of one time step.
    pub step: Duration,
}

/// What a [`TxnSim`] run measured.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct TxnSimReport {
    /// Transactions committed before their deadline, per simulated second.
    pub goodput: f64,
    /// Transactions that finished after their deadline (wasted work).
    pub late: u64,
    /// Transactions turned away by the limiter (before any work).
    pub rejected: u64,
    /// Most transactions running at once.
    pub max_outstanding: u32,
    /// The limit at the end (0 without one).
    pub final_limit: u32,
}

#[derive(Copy, Clone)]
enum Client {
    /// Waiting to issue its next transaction at this step.
    Idle { at: u64 },
    /// Queued in the limiter since `issued`.
    Queued { issued: u64 },
    /// Running, with this much work left (in solo nanoseconds).
    Running {
        issued: u64,
        started: u64,
        left: f64,
    },
}

/// Runs the simulation.
pub fn run_txn(sim: &TxnSim) -> TxnSimReport {
    let step = sim.step.as_nanos().max(1) as u64;
    let steps = (sim.duration.as_nanos() as u64) / step;
    let deadline_steps = (sim.deadline.as_nanos() as u64).div_ceil(step);
    let mut limiter = sim.limit.map(|c| TxnLimiter::<usize>::new(c, Nanos::ZERO));
    let mut clients = vec![Client::Idle { at: 0 }; sim.clients as usize];
    let mut report = TxnSimReport::default();
    let (mut committed, mut admitted, mut expired) = (0u64, Vec::new(), Vec::new());
    let at = |s: u64| Nanos(s * step);
    for now in 0..steps {
        // Issue.
        for (i, c) in clients.iter_mut().enumerate() {
            let Client::Idle { at: when } = *c else {
                continue;
            };
            if when > now {
                continue;
            }
            let decision = match &mut limiter {
                Some(l) => l.admit(at(now), at(now + deadline_steps), i),
                None => TxnAdmit::Run,
            };
            *c = match decision {
                TxnAdmit::Run => Client::Running {
                    issued: now,
                    started: now,
                    left: sim.service.as_nanos() as f64,
                },
                TxnAdmit::Queued(_) => Client::Queued { issued: now },
                TxnAdmit::Reject(_) => {
                    report.rejected += 1;
                    // The client learns at once and tries again a millisecond later.
                    Client::Idle {
                        at: now + (1_000_000 / step).max(1),
                    }
                }
            };
        }
        // Progress.
        let running = clients
            .iter()
            .filter(|c| matches!(c, Client::Running { .. }))
            .count() as u32;
        report.max_outstanding = report.max_outstanding.max(running);
        let k = f64::from(running.max(1));
        let speed = 1.0 / (1.0 + sim.contention * (k - 1.0) * (k - 1.0));
        let progress = step as f64 * speed;
        for c in clients.iter_mut() {
            let Client::Running {
                issued,
                started,
                left,
            } = *c
            else {
                continue;
            };
            let left = left - progress;
            if left > 0.0 {
                *c = Client::Running {
                    issued,
                    started,
                    left,
                };
                continue;
            }
            let in_time = now + 1 - issued <= deadline_steps;
            if in_time {
                committed += 1;
            } else {
                report.late += 1;
            }
            *c = Client::Idle { at: now + 1 };
            if let Some(l) = &mut limiter {
                let service = Duration::from_nanos((now + 1 - started) * step);
                l.release(at(now + 1), service, in_time, &mut admitted, &mut expired);
            }
        }
        if let Some(l) = &mut limiter {
            l.tick(at(now + 1), &mut admitted, &mut expired);
        }
        for i in admitted.drain(..) {
            if let Some(Client::Queued { issued }) = clients.get(i).copied() {
                clients[i] = Client::Running {
                    issued,
                    started: now + 1,
                    left: sim.service.as_nanos() as f64,
                };
            }
        }
        for i in expired.drain(..) {
            report.rejected += 1;
            clients[i] = Client::Idle { at: now + 1 };
        }
    }
    report.goodput = committed as f64 / sim.duration.as_secs_f64();
    report.final_limit = limiter.as_ref().map_or(0, |l| l.limit());
    report
}

#[cfg(test)]
mod tests_support {
    use super::*;

    /// gSuneido-like settings: short transactions, throughput peaking near 5 clients.
    pub(super) fn sim(clients: u32, limit: bool) -> TxnSim {
        TxnSim {
            clients,
            service: Duration::from_micros(400),
            // Peak near 5 concurrent transactions, as gSuneido's measurements.
            contention: 1.0 / 24.0,
            deadline: Duration::from_secs(1),
            limit: limit.then(|| TxnLimitConfig {
                initial: 2,
                min: 1,
                ..TxnLimitConfig::default()
            }),
            duration: Duration::from_secs(20),
            step: Duration::from_micros(50),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::sim;
    use super::*;

    #[test]
    fn the_adaptive_limit_keeps_goodput_near_the_peak_as_clients_grow() {
        let peak = (1..=30)
            .map(|c| run_txn(&sim(c, false)).goodput)
            .fold(0.0, f64::max);
        for clients in [5, 10, 30, 320] {
            let off = run_txn(&sim(clients, false));
            let on = run_txn(&sim(clients, true));
            assert!(
                on.goodput >= 0.85 * peak,
                "{clients} clients, limit on: {on:?}, peak {peak}"
            );
            assert!(on.max_outstanding <= 16, "{clients} clients: {on:?}");
            if clients >= 30 {
                assert!(
                    off.goodput < 0.5 * peak,
                    "{clients} clients without a limit should collapse: {off:?}"
                );
                assert_eq!(off.max_outstanding, clients);
            }
        }
    }
}

#[cfg(test)]
mod sweep {
    use super::tests_support::sim;
    use super::*;

    /// The sweep reported in docs/decisions (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn print_the_client_sweep() {
        println!("clients | off tx/s | off max outstanding | on tx/s | on max outstanding | on rejected | final limit");
        for clients in [1, 2, 3, 4, 5, 6, 8, 10, 16, 20, 30, 320] {
            let off = run_txn(&sim(clients, false));
            let on = run_txn(&sim(clients, true));
            println!(
                "{clients} | {:.0} | {} | {:.0} | {} | {} | {}",
                off.goodput,
                off.max_outstanding,
                on.goodput,
                on.max_outstanding,
                on.rejected,
                on.final_limit
            );
        }
    }
}
