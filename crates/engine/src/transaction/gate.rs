//! Where transactions enter execution: the node's adaptive limit on outstanding
//! transactions ([`TxnLimiter`]) and the transaction metrics.
//!
//! One gate per engine (per node), not per shard: a transaction takes stripe locks in
//! several stores, which every shard shares, so contention - and the goodput the limit
//! probes - is a property of the node. A waiter sleeps on a oneshot channel until a
//! finishing transaction hands it a slot, or until its deadline minus the expected service
//! time, when it leaves the queue (nothing has run, so the answer is final).

use sluice_overload::{Nanos, TxnAdmit, TxnLimitConfig, TxnLimiter, TxnReject, TxnWaitTicket};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Buckets of the latency histograms: powers of two of nanoseconds, up to about 17 s.
const BUCKETS: usize = 35;

/// A lock-free histogram of durations in power-of-two buckets.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    sum_nanos: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one duration.
    pub fn record(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let bucket = (64 - nanos.leading_zeros() as usize).min(BUCKETS - 1);
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.sum_nanos.fetch_add(nanos, Relaxed);
    }

    /// Number of durations recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// Sum of the durations recorded.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_nanos.load(Relaxed))
    }

    /// An upper bound of quantile `q` (the bucket's upper edge; zero when empty).
    pub fn quantile(&self, q: f64) -> Duration {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return Duration::ZERO;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_nanos(1u64 << i.min(63));
            }
        }
        Duration::from_nanos(1u64 << (BUCKETS - 1))
    }
}

/// The node's transaction counters (read by `GET /metrics`).
#[derive(Debug, Default)]
pub struct TxnMetrics {
    /// Transactions that completed and wrote.
    pub committed: AtomicU64,
    /// Transactions that completed without writing (their IF chose no writes). Not aborts.
    pub committed_without_writes: AtomicU64,
    /// Aborted: the deadline could not be met (at admission, while queued, or before the locks).
    pub aborted_deadline: AtomicU64,
    /// Aborted: the wait queue was full.
    pub aborted_over_limit: AtomicU64,
    /// Ended by an error (invalid values, storage failure).
    pub failed: AtomicU64,
    /// Time taken to acquire every lock of a transaction.
    pub lock_wait: Histogram,
    /// Time the locks were held (the critical section).
    pub critical_section: Histogram,
}

impl TxnMetrics {
    pub(crate) fn note_commit(&self, wrote: bool) {
        if wrote {
            self.committed.fetch_add(1, Relaxed);
        } else {
            self.committed_without_writes.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn note_locks(&self, wait: Duration, held: Duration) {
        self.lock_wait.record(wait);
        self.critical_section.record(held);
    }

    pub(crate) fn note_deadline_abort(&self) {
        self.aborted_deadline.fetch_add(1, Relaxed);
    }

    pub(crate) fn note_error(&self) {
        self.failed.fetch_add(1, Relaxed);
    }
}

/// A point-in-time view of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnGateSnapshot {
    /// Transactions running.
    pub outstanding: u32,
    /// The adaptive limit.
    pub limit: u32,
    /// Transactions waiting for a slot.
    pub queued: usize,
    /// Most transactions running at once since start.
    pub max_outstanding: u32,
}

/// The admission gate of transactions.
#[derive(Debug)]
pub struct TxnGate {
    limiter: Mutex<TxnLimiter<oneshot::Sender<()>>>,
    origin: Instant,
    metrics: TxnMetrics,
    /// When false, every transaction runs at once (a benchmark switch).
    limited: std::sync::atomic::AtomicBool,
    /// Transactions running while the limit is off (the limiter counts the others).
    unlimited_running: std::sync::atomic::AtomicU32,
    /// Most of them at once.
    unlimited_max: std::sync::atomic::AtomicU32,
}

/// A running transaction's slot; dropping it without [`TxnPermit::finish`] releases it as
/// not committed (the request was abandoned).
pub(crate) struct TxnPermit<'g> {
    gate: &'g TxnGate,
    started: Instant,
    counted: bool,
    done: bool,
}

impl TxnPermit<'_> {
    /// Ends the transaction, `committed` when it completed (a false IF included).
    pub(crate) fn finish(mut self, committed: bool) {
        self.release(committed);
    }

    fn release(&mut self, committed: bool) {
        if self.done {
            return;
        }
        self.done = true;
        if self.counted {
            self.gate.release(self.started.elapsed(), committed);
        } else {
            let before = self.gate.unlimited_running.fetch_sub(1, Relaxed);
            debug_assert!(before > 0, "an unlimited transaction released twice");
        }
    }
}

impl Drop for TxnPermit<'_> {
    fn drop(&mut self) {
        self.release(false);
    }
}

impl Default for TxnGate {
    fn default() -> Self {
        TxnGate::new(TxnLimitConfig::default())
    }
}

impl TxnGate {
    /// A gate with these limiter settings.
    pub fn new(config: TxnLimitConfig) -> TxnGate {
        TxnGate {
            limiter: Mutex::new(TxnLimiter::new(config, Nanos::ZERO)),
            origin: Instant::now(),
            metrics: TxnMetrics::default(),
            limited: std::sync::atomic::AtomicBool::new(true),
            unlimited_running: std::sync::atomic::AtomicU32::new(0),
            unlimited_max: std::sync::atomic::AtomicU32::new(0),
        }
    }

    fn now(&self) -> Nanos {
        Nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    fn at(&self, instant: Instant) -> Nanos {
        Nanos(
            u64::try_from(instant.saturating_duration_since(self.origin).as_nanos())
                .unwrap_or(u64::MAX),
        )
    }

    /// The counters.
    pub fn metrics(&self) -> &TxnMetrics {
        &self.metrics
    }

    /// Turns the adaptive limit on (the default) or off (every transaction runs at once).
    pub fn set_limited(&self, on: bool) {
        self.limited.store(on, Relaxed);
    }

    /// The limit, what runs and what waits.
    pub fn snapshot(&self) -> TxnGateSnapshot {
        let l = self.limiter.lock().unwrap_or_else(|e| e.into_inner());
        TxnGateSnapshot {
            outstanding: l.outstanding() + self.unlimited_running.load(Relaxed),
            limit: l.limit(),
            queued: l.queued(),
            max_outstanding: l
                .stats()
                .max_outstanding
                .max(self.unlimited_max.load(Relaxed)),
        }
    }

    /// Waits for a slot; turned away at once when the deadline cannot be met (or the queue
    /// is full), or later when the deadline comes before a slot does.
    pub(crate) async fn admit(
        &self,
        deadline: Option<Instant>,
    ) -> Result<TxnPermit<'_>, TxnReject> {
        let started = Instant::now();
        if !self.limited.load(Relaxed) {
            if deadline.is_some_and(|d| started >= d) {
                self.metrics.aborted_deadline.fetch_add(1, Relaxed);
                return Err(TxnReject::Deadline);
            }
            let running = self.unlimited_running.fetch_add(1, Relaxed) + 1;
            self.unlimited_max.fetch_max(running, Relaxed);
            return Ok(TxnPermit {
                gate: self,
                started,
                counted: false,
                done: false,
            });
        }
        let due = deadline.map_or(Nanos::MAX, |d| self.at(d));
        let (tx, mut rx) = oneshot::channel();
        let (decision, service) = {
            let mut l = self.limiter.lock().unwrap_or_else(|e| e.into_inner());
            let decision = l.admit(self.now(), due, tx);
            (decision, l.expected_service())
        };
        let ticket = match decision {
            TxnAdmit::Run => {
                return Ok(TxnPermit {
                    gate: self,
                    started,
                    counted: true,
                    done: false,
                })
            }
            TxnAdmit::Reject(reason) => {
                self.count_reject(reason);
                return Err(reason);
            }
            TxnAdmit::Queued(ticket) => ticket,
        };
        // Leave the queue when even a slot given now would finish too late.
        let give_up = deadline.map(|d| d.checked_sub(service).unwrap_or(d));
        let woken = match give_up {
            Some(at) => tokio::time::timeout_at(at.into(), &mut rx).await,
            None => Ok((&mut rx).await),
        };
        match woken {
            Ok(Ok(())) => Ok(self.permit_at(Instant::now())),
            // Dropped by the limiter: it expired in the queue.
            Ok(Err(_)) => {
                self.count_reject(TxnReject::Deadline);
                Err(TxnReject::Deadline)
            }
            Err(_) => self.give_up(ticket, rx).await,
        }
    }

    fn permit_at(&self, started: Instant) -> TxnPermit<'_> {
        TxnPermit {
            gate: self,
            started,
            counted: true,
            done: false,
        }
    }

    /// A waiter whose time ran out leaves the queue, unless it was handed a slot (or
    /// expired) meanwhile, which its channel tells at once.
    async fn give_up(
        &self,
        ticket: TxnWaitTicket,
        rx: oneshot::Receiver<()>,
    ) -> Result<TxnPermit<'_>, TxnReject> {
        let removed = {
            let mut l = self.limiter.lock().unwrap_or_else(|e| e.into_inner());
            l.cancel(ticket)
        };
        self.count_reject(TxnReject::Deadline);
        if !removed && rx.await.is_ok() {
            // Handed a slot just as the timer fired: give it back unused.
            self.permit_at(Instant::now()).finish(false);
        }
        Err(TxnReject::Deadline)
    }

    fn count_reject(&self, reason: TxnReject) {
        match reason {
            TxnReject::Deadline => self.metrics.aborted_deadline.fetch_add(1, Relaxed),
            TxnReject::OverLimit => self.metrics.aborted_over_limit.fetch_add(1, Relaxed),
        };
    }

    fn release(&self, service: Duration, committed: bool) {
        let (mut admitted, mut expired) = (Vec::new(), Vec::new());
        {
            let mut l = self.limiter.lock().unwrap_or_else(|e| e.into_inner());
            l.release(self.now(), service, committed, &mut admitted, &mut expired);
        }
        // Outside the lock: wake the admitted; the expired see their sender dropped.
        for waiter in admitted {
            if waiter.send(()).is_err() {
                // The waiter is gone (its request was dropped): give the slot back.
                self.release(Duration::ZERO, false);
            }
        }
        drop(expired);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_at_a_time() -> TxnGate {
        TxnGate::new(TxnLimitConfig {
            initial: 1,
            min: 1,
            max: 1,
            ..TxnLimitConfig::default()
        })
    }

    #[tokio::test]
    async fn a_waiter_runs_when_the_slot_is_freed_and_one_out_of_time_is_turned_away() {
        let gate = one_at_a_time();
        let first = gate.admit(None).await.unwrap();
        assert_eq!(gate.snapshot().outstanding, 1);
        let second = gate.admit(Some(Instant::now() + Duration::from_secs(5)));
        let release = async {
            tokio::task::yield_now().await;
            assert_eq!(gate.snapshot().queued, 1);
            first.finish(true);
        };
        let (second, ()) = tokio::join!(second, release);
        let second = second.unwrap();
        assert_eq!(gate.snapshot().outstanding, 1);
        // The slot is taken: a deadline 20 ms away passes while waiting.
        let late = gate
            .admit(Some(Instant::now() + Duration::from_millis(20)))
            .await;
        assert_eq!(late.err(), Some(TxnReject::Deadline));
        assert_eq!(gate.snapshot().queued, 0);
        assert_eq!(gate.metrics().aborted_deadline.load(Relaxed), 1);
        drop(second);
        assert_eq!(gate.snapshot().outstanding, 0);
    }

    #[tokio::test]
    async fn without_the_limit_everything_runs_and_is_still_counted() {
        let gate = one_at_a_time();
        gate.set_limited(false);
        let a = gate.admit(None).await.unwrap();
        let b = gate.admit(None).await.unwrap();
        assert_eq!(gate.snapshot().outstanding, 2);
        a.finish(true);
        drop(b);
        let s = gate.snapshot();
        assert_eq!((s.outstanding, s.max_outstanding), (0, 2));
        let expired = gate
            .admit(Some(Instant::now() - Duration::from_millis(1)))
            .await;
        assert_eq!(expired.err(), Some(TxnReject::Deadline));
    }
}
