//! An adaptive limit on outstanding transactions, sized by probing committed goodput
//! (MongoDB's throughput probing), with a deadline-ordered wait queue in front of it.
//!
//! No fixed cap such as 200 or 500: every `interval` the limiter looks at the transactions
//! committed in it. From the stable state it steps the limit up by `step` when the limit
//! was reached (saturated) or down otherwise; after the step's interval it keeps the step
//! (moving the stable limit toward it by an EMA) only if goodput rose by more than
//! `keep_gain`, and returns to the stable limit either way. Goodput is completed work, so a
//! convoy of waiting transactions does not pass for a busy, productive system.
//!
//! Over the limit a transaction waits in a queue ordered by deadline (earliest first). One
//! that cannot finish in time - `now + expected wait + service > deadline`, the wait taken
//! from its place in the queue and the recent commit rate (Little's law) - is turned away at
//! once, before any work. Transactions already holding locks are never queued here: the
//! queue holds only starts, so lock holders and commits always go first. The queue has a
//! fixed capacity, so the limiter's memory is bounded.

use crate::clock::{duration_nanos, Nanos};
use std::collections::BTreeMap;
use std::time::Duration;

/// Settings of a [`TxnLimiter`].
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct TxnLimitConfig {
    /// The limit before any probing.
    pub initial: u32,
    /// The lowest limit.
    pub min: u32,
    /// The highest limit.
    pub max: u32,
    /// Relative size of a probing step (at least one transaction).
    pub step: f64,
    /// Relative goodput gain a step must bring to be kept.
    pub keep_gain: f64,
    /// Weight of a kept step in the stable limit's EMA.
    pub ema: f64,
    /// How long each probing phase lasts.
    pub interval: Duration,
    /// Most transactions waiting for a slot.
    pub queue_capacity: usize,
}

impl Default for TxnLimitConfig {
    fn default() -> Self {
        TxnLimitConfig {
            initial: 8,
            min: 2,
            max: 4096,
            step: 0.1,
            keep_gain: 0.02,
            ema: 0.2,
            interval: Duration::from_millis(100),
            queue_capacity: 4096,
        }
    }
}

/// Why a transaction was turned away before it ran.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TxnReject {
    /// It could not finish before its deadline (or the deadline passed while it waited).
    Deadline,
    /// The wait queue was full.
    OverLimit,
}

/// A queued transaction's place, to cancel it with [`TxnLimiter::cancel`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TxnWaitTicket {
    deadline: Nanos,
    seq: u64,
}

/// What [`TxnLimiter::admit`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum TxnAdmit {
    /// Run now (it counts as outstanding).
    Run,
    /// Wait: it runs when [`TxnLimiter::release`] or [`TxnLimiter::tick`] hands it a slot.
    Queued(TxnWaitTicket),
    /// Turned away, before any work.
    Reject(TxnReject),
}

/// The probing state.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    Stable,
    Up,
    Down,
}

/// Counters of a [`TxnLimiter`].
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnLimitStats {
    /// Transactions that ran (at once or after waiting).
    pub admitted: u64,
    /// Transactions that waited for a slot.
    pub queued: u64,
    /// Turned away for their deadline (at arrival or while waiting).
    pub rejected_deadline: u64,
    /// Turned away because the queue was full.
    pub rejected_over_limit: u64,
    /// Transactions that committed.
    pub committed: u64,
    /// Most outstanding transactions seen.
    pub max_outstanding: u32,
}

/// The adaptive limit and its queue. `W` is what a waiter is woken with.
#[derive(Debug)]
pub struct TxnLimiter<W> {
    config: TxnLimitConfig,
    /// The limit in force.
    limit: u32,
    /// The stable limit, which probing steps move away from and back to.
    stable: f64,
    phase: Phase,
    /// Whether the last probe stepped up (saturated probes alternate).
    last_probe_up: bool,
    /// Goodput (commits per second) measured at the stable limit.
    stable_goodput: Option<f64>,
    outstanding: u32,
    interval_start: Nanos,
    interval_commits: u64,
    interval_peak: u32,
    /// Commits per second, smoothed over intervals.
    commit_rate: f64,
    /// Service time of a transaction, smoothed (nanoseconds).
    service: f64,
    queue: BTreeMap<TxnWaitTicket, W>,
    seq: u64,
    stats: TxnLimitStats,
}

impl<W> TxnLimiter<W> {
    /// A limiter at `config.initial`, its first interval starting at `now`.
    pub fn new(config: TxnLimitConfig, now: Nanos) -> Self {
        let min = config.min.max(1);
        let max = config.max.max(min);
        let config = TxnLimitConfig { min, max, ..config };
        let initial = config.initial.clamp(min, max);
        TxnLimiter {
            config,
            limit: initial,
            stable: f64::from(initial),
            phase: Phase::Stable,
            last_probe_up: false,
            stable_goodput: None,
            outstanding: 0,
            interval_start: now,
            interval_commits: 0,
            interval_peak: 0,
            commit_rate: 0.0,
            service: 0.0,
            queue: BTreeMap::new(),
            seq: 0,
            stats: TxnLimitStats::default(),
        }
    }

    /// The limit in force.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Transactions running.
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// Transactions waiting for a slot.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The counters.
    pub fn stats(&self) -> TxnLimitStats {
        self.stats
    }

    /// The expected service time of one transaction.
    pub fn expected_service(&self) -> Duration {
        Duration::from_nanos(self.service as u64)
    }

    /// How long the `position`-th waiter (0 = next) is expected to wait.
    fn expected_wait(&self, position: usize) -> Duration {
        let rate = if self.commit_rate > 0.0 {
            self.commit_rate
        } else if self.service > 0.0 {
            f64::from(self.limit) * 1e9 / self.service
        } else {
            return Duration::ZERO;
        };
        Duration::from_secs_f64((position as f64 + 1.0) / rate)
    }

    /// Decides about a transaction arriving at `now` that must finish by `deadline`
    /// ([`Nanos::MAX`] for none); `waiter` is kept when it has to wait.
    pub fn admit(&mut self, now: Nanos, deadline: Nanos, waiter: W) -> TxnAdmit {
        let service = Duration::from_nanos(self.service as u64);
        if self.outstanding < self.limit && self.queue.is_empty() {
            if now.saturating_add(service) > deadline {
                self.stats.rejected_deadline += 1;
                return TxnAdmit::Reject(TxnReject::Deadline);
            }
            self.start_one();
            return TxnAdmit::Run;
        }
        let ahead = self
            .queue
            .range(
                ..TxnWaitTicket {
                    deadline,
                    seq: u64::MAX,
                },
            )
            .count();
        let wait = self.expected_wait(ahead);
        if now.saturating_add(wait).saturating_add(service) > deadline {
            self.stats.rejected_deadline += 1;
            return TxnAdmit::Reject(TxnReject::Deadline);
        }
        if self.queue.len() >= self.config.queue_capacity {
            self.stats.rejected_over_limit += 1;
            return TxnAdmit::Reject(TxnReject::OverLimit);
        }
        self.seq += 1;
        let ticket = TxnWaitTicket {
            deadline,
            seq: self.seq,
        };
        self.queue.insert(ticket, waiter);
        self.stats.queued += 1;
        TxnAdmit::Queued(ticket)
    }

    /// Removes a waiter that gave up; false when it is no longer queued (it was handed a
    /// slot or expired meanwhile).
    pub fn cancel(&mut self, ticket: TxnWaitTicket) -> bool {
        self.queue.remove(&ticket).is_some()
    }

    fn start_one(&mut self) {
        self.outstanding += 1;
        self.stats.admitted += 1;
        self.interval_peak = self.interval_peak.max(self.outstanding);
        self.stats.max_outstanding = self.stats.max_outstanding.max(self.outstanding);
    }

    /// A transaction that ran ends at `now` after `service`; `committed` when it completed
    /// (a false IF is a completion too). Frees its slot, then hands slots to waiters in
    /// deadline order (`admitted`), turning away those that can no longer finish in time
    /// (`expired`).
    pub fn release(
        &mut self,
        now: Nanos,
        service: Duration,
        committed: bool,
        admitted: &mut Vec<W>,
        expired: &mut Vec<W>,
    ) {
        debug_assert!(self.outstanding > 0, "a release without an admission");
        self.outstanding = self.outstanding.saturating_sub(1);
        let sample = duration_nanos(service) as f64;
        self.service = if self.service == 0.0 {
            sample
        } else {
            0.9 * self.service + 0.1 * sample
        };
        if committed {
            self.interval_commits += 1;
            self.stats.committed += 1;
        }
        self.tick(now, admitted, expired);
    }

    /// Advances the probing when an interval has passed, and hands free slots to waiters.
    /// Call it on every admission and release, and periodically when idle.
    pub fn tick(&mut self, now: Nanos, admitted: &mut Vec<W>, expired: &mut Vec<W>) {
        let elapsed = now.saturating_duration_since(self.interval_start);
        if elapsed >= self.config.interval {
            self.end_interval(elapsed, now);
        }
        self.hand_out(now, admitted, expired);
        // Nobody waits while a slot is free.
        debug_assert!(self.queue.is_empty() || self.outstanding >= self.limit);
    }

    fn hand_out(&mut self, now: Nanos, admitted: &mut Vec<W>, expired: &mut Vec<W>) {
        let service = Duration::from_nanos(self.service as u64);
        while self.outstanding < self.limit {
            let Some((ticket, waiter)) = self.queue.pop_first() else {
                break;
            };
            if now.saturating_add(service) > ticket.deadline {
                self.stats.rejected_deadline += 1;
                expired.push(waiter);
                continue;
            }
            self.start_one();
            admitted.push(waiter);
        }
    }

    fn end_interval(&mut self, elapsed: Duration, now: Nanos) {
        let goodput = self.interval_commits as f64 / elapsed.as_secs_f64().max(1e-9);
        let saturated = self.interval_peak >= self.limit;
        let busy = self.interval_commits > 0 || self.outstanding > 0;
        self.commit_rate = if self.commit_rate == 0.0 {
            goodput
        } else {
            0.7 * self.commit_rate + 0.3 * goodput
        };
        let (min, max) = (f64::from(self.config.min), f64::from(self.config.max));
        match self.phase {
            Phase::Stable if busy => {
                self.stable_goodput = Some(goodput);
                let stable = self.stable.round() as u32;
                let delta = (self.stable * self.config.step).max(1.0);
                // Saturated, it probes both ways in turn (so that a limit past the best is
                // found too); otherwise only down, toward what is used.
                let up = saturated && stable < self.config.max && !self.last_probe_up;
                if up {
                    self.limit = (self.stable + delta).min(max).round() as u32;
                    self.phase = Phase::Up;
                    self.last_probe_up = true;
                } else if stable > self.config.min {
                    self.limit = (self.stable - delta).max(min).round() as u32;
                    self.phase = Phase::Down;
                    self.last_probe_up = false;
                } else {
                    self.last_probe_up = false;
                }
            }
            Phase::Stable => {}
            Phase::Up | Phase::Down => {
                let before = self.stable_goodput.unwrap_or(0.0);
                if goodput > before * (1.0 + self.config.keep_gain) {
                    let old = self.stable.round();
                    self.stable = (self.config.ema * f64::from(self.limit)
                        + (1.0 - self.config.ema) * self.stable)
                        .clamp(min, max);
                    // A kept step moves the stable limit by at least one transaction.
                    if self.stable.round() == old {
                        self.stable = if self.phase == Phase::Up {
                            (old + 1.0).min(max)
                        } else {
                            (old - 1.0).max(min)
                        };
                    }
                }
                self.limit = (self.stable.round() as u32).clamp(self.config.min, self.config.max);
                self.phase = Phase::Stable;
            }
        }
        self.interval_start = now;
        self.interval_commits = 0;
        self.interval_peak = self.outstanding;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Nanos {
        Nanos::from_millis(n)
    }

    #[test]
    fn runs_up_to_the_limit_then_queues_in_deadline_order() {
        let config = TxnLimitConfig {
            initial: 2,
            ..TxnLimitConfig::default()
        };
        let mut l = TxnLimiter::new(config, ms(0));
        assert_eq!(l.admit(ms(0), ms(1000), 1), TxnAdmit::Run);
        assert_eq!(l.admit(ms(0), ms(1000), 2), TxnAdmit::Run);
        assert!(matches!(l.admit(ms(0), ms(900), 3), TxnAdmit::Queued(_)));
        assert!(matches!(l.admit(ms(0), ms(500), 4), TxnAdmit::Queued(_)));
        assert_eq!(l.outstanding(), 2);
        let (mut run, mut gone) = (Vec::new(), Vec::new());
        l.release(ms(1), Duration::from_millis(1), true, &mut run, &mut gone);
        // The earliest deadline goes first.
        assert_eq!(run, vec![4]);
        l.release(ms(2), Duration::from_millis(1), true, &mut run, &mut gone);
        assert_eq!(run, vec![4, 3]);
        assert!(gone.is_empty());
        assert_eq!(l.outstanding(), 2);
    }

    #[test]
    fn a_transaction_that_cannot_finish_in_time_is_turned_away_at_once() {
        let config = TxnLimitConfig {
            initial: 1,
            min: 1,
            ..TxnLimitConfig::default()
        };
        let mut l = TxnLimiter::new(config, ms(0));
        assert_eq!(l.admit(ms(0), Nanos::MAX, ()), TxnAdmit::Run);
        let (mut run, mut gone) = (Vec::new(), Vec::new());
        // Service times of 10 ms are learnt.
        l.release(ms(10), Duration::from_millis(10), true, &mut run, &mut gone);
        assert_eq!(l.admit(ms(10), Nanos::MAX, ()), TxnAdmit::Run);
        // One is running: a deadline 5 ms away cannot be met (wait + service > 5 ms).
        assert_eq!(
            l.admit(ms(10), ms(15), ()),
            TxnAdmit::Reject(TxnReject::Deadline)
        );
        // A deadline already too close for the service alone, even with a free slot.
        l.release(ms(20), Duration::from_millis(10), true, &mut run, &mut gone);
        assert_eq!(
            l.admit(ms(20), ms(25), ()),
            TxnAdmit::Reject(TxnReject::Deadline)
        );
        assert_eq!(l.stats().rejected_deadline, 2);
        assert_eq!(l.outstanding(), 0);
    }

    #[test]
    fn waiters_past_their_deadline_expire_and_cancel_leaves_the_queue() {
        let config = TxnLimitConfig {
            initial: 1,
            min: 1,
            queue_capacity: 2,
            ..TxnLimitConfig::default()
        };
        let mut l = TxnLimiter::new(config, ms(0));
        assert_eq!(l.admit(ms(0), Nanos::MAX, 0), TxnAdmit::Run);
        let TxnAdmit::Queued(first) = l.admit(ms(0), ms(50), 1) else {
            panic!("queued expected");
        };
        assert!(matches!(l.admit(ms(0), ms(60), 2), TxnAdmit::Queued(_)));
        assert_eq!(
            l.admit(ms(0), ms(70), 3),
            TxnAdmit::Reject(TxnReject::OverLimit)
        );
        assert!(l.cancel(first));
        assert!(!l.cancel(first));
        let (mut run, mut gone) = (Vec::new(), Vec::new());
        // At 65 ms the waiter due at 60 ms can no longer run.
        l.release(ms(65), Duration::from_millis(1), true, &mut run, &mut gone);
        assert!(run.is_empty());
        assert_eq!(gone, vec![2]);
        assert_eq!(l.queued(), 0);
    }

    /// Transactions a fake system commits per 100 ms at `concurrency`: as many as run up
    /// to `best`, then fewer (contention).
    fn commits_at(concurrency: u32, best: u32) -> u32 {
        if concurrency <= best {
            concurrency
        } else {
            best.saturating_sub((concurrency - best) / 2).max(1)
        }
    }

    #[test]
    fn probing_climbs_toward_the_best_limit_and_stays_bounded() {
        let config = TxnLimitConfig {
            initial: 4,
            min: 2,
            max: 64,
            ..TxnLimitConfig::default()
        };
        let mut l = TxnLimiter::new(config, ms(0));
        let (mut run, mut gone) = (Vec::new(), Vec::new());
        let mut now = 0;
        for _ in 0..400 {
            // Saturate: as many running as the limit allows.
            while l.admit(ms(now), Nanos::MAX, ()) == TxnAdmit::Run {}
            let done = commits_at(l.limit(), 24);
            for _ in 0..done {
                l.release(
                    ms(now),
                    Duration::from_micros(100),
                    true,
                    &mut run,
                    &mut gone,
                );
                if l.outstanding() == 0 {
                    break;
                }
            }
            now += 100;
            l.tick(ms(now), &mut run, &mut gone);
            // Whatever is still running ends before the next interval.
            while l.outstanding() > 0 {
                l.release(
                    ms(now),
                    Duration::from_micros(100),
                    false,
                    &mut run,
                    &mut gone,
                );
            }
            // Waiters were handed slots: they are counted and run in the next round.
            while l.queued() > 0 {
                let _ = l.cancel(*l.queue.keys().next().unwrap());
            }
            run.clear();
        }
        let limit = l.limit();
        assert!((16..=32).contains(&limit), "limit {limit} far from 24");
        assert!(l.stats().max_outstanding <= 64);
    }
}
