//! Accounting: per-second rows and per-step totals, with HdrHistogram latencies.
//!
//! Offered load is counted when a request is issued; outcomes are counted in the second in
//! which they complete (what a monitoring graph shows), and in the totals of the step whose
//! schedule issued them (what the tables show).

use crate::target::Outcome;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::time::Instant;

/// Highest latency the histograms hold exactly (larger values saturate), in microseconds.
const MAX_LATENCY_US: u64 = 600_000_000;

/// Request counts by stage and outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Requests the schedule asked for (offered load).
    pub offered: u64,
    /// Requests actually handed to the target.
    pub sent: u64,
    /// Requests sent later than the lag tolerance after their intended time.
    pub lagged: u64,
    /// Requests not sent at all because the generator's in-flight cap was reached.
    pub unsent: u64,
    /// Succeeded before the deadline (goodput).
    pub ok: u64,
    /// Succeeded after the deadline.
    pub late: u64,
    /// Rejected by the per-partition rate limiter.
    pub rate_limited: u64,
    /// Rejected as overloaded.
    pub overloaded: u64,
    /// Server-side timeouts.
    pub server_timeout: u64,
    /// Client-side timeouts.
    pub client_timeout: u64,
    /// Other errors.
    pub other: u64,
}

impl Counts {
    /// Adds one completed request.
    pub fn add(&mut self, o: Outcome) {
        *self.slot(o) += 1;
    }

    fn slot(&mut self, o: Outcome) -> &mut u64 {
        match o {
            Outcome::Ok => &mut self.ok,
            Outcome::Late => &mut self.late,
            Outcome::RateLimited => &mut self.rate_limited,
            Outcome::Overloaded => &mut self.overloaded,
            Outcome::ServerTimeout => &mut self.server_timeout,
            Outcome::ClientTimeout => &mut self.client_timeout,
            Outcome::Other => &mut self.other,
        }
    }

    /// The count for one outcome.
    pub fn get(&self, o: Outcome) -> u64 {
        match o {
            Outcome::Ok => self.ok,
            Outcome::Late => self.late,
            Outcome::RateLimited => self.rate_limited,
            Outcome::Overloaded => self.overloaded,
            Outcome::ServerTimeout => self.server_timeout,
            Outcome::ClientTimeout => self.client_timeout,
            Outcome::Other => self.other,
        }
    }

    /// Completed requests of any outcome.
    pub fn completed(&self) -> u64 {
        self.ok
            + self.late
            + self.rate_limited
            + self.overloaded
            + self.server_timeout
            + self.client_timeout
            + self.other
    }

    /// Everything that was not goodput: late successes and every error.
    pub fn failed(&self) -> u64 {
        self.completed() - self.ok
    }

    /// Field-wise sum.
    pub fn merge(&mut self, o: &Counts) {
        self.offered += o.offered;
        self.sent += o.sent;
        self.lagged += o.lagged;
        self.unsent += o.unsent;
        self.ok += o.ok;
        self.late += o.late;
        self.rate_limited += o.rate_limited;
        self.overloaded += o.overloaded;
        self.server_timeout += o.server_timeout;
        self.client_timeout += o.client_timeout;
        self.other += o.other;
    }
}

/// Latency percentiles of successful requests, in microseconds from the intended send time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Maximum.
    pub max_us: u64,
}

impl Percentiles {
    /// Reads the percentiles of a histogram (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }
}

/// One traffic class during one second.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassSecond {
    /// Counts in this second.
    pub counts: Counts,
    /// Latency of the successes that completed in this second.
    pub latency: Percentiles,
}

/// One second of the run, for every traffic class.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SecondRow {
    /// Seconds since the start of the whole run.
    pub t: u64,
    /// Per class, in the order of the class names of the run.
    pub classes: Vec<ClassSecond>,
}

impl SecondRow {
    /// Counts summed over classes.
    pub fn total(&self) -> Counts {
        let mut c = Counts::default();
        for cl in &self.classes {
            c.merge(&cl.counts);
        }
        c
    }
}

/// Totals of one traffic class over one step.
#[derive(Clone, Debug)]
pub struct ClassTotals {
    /// Counts over the step.
    pub counts: Counts,
    /// Latency of every success, 3 significant digits.
    pub hist: Histogram<u64>,
}

fn histogram(sigfig: u8) -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts, so this cannot fail.
    Histogram::new_with_bounds(1, MAX_LATENCY_US, sigfig).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Collects the events of one step; owned behind a mutex by the runner.
#[derive(Debug)]
pub struct Recorder {
    start: Instant,
    t_offset: u64,
    cur_sec: u64,
    cur: Vec<(Counts, Histogram<u64>)>,
    rows: Vec<SecondRow>,
    totals: Vec<(Counts, Histogram<u64>)>,
}

impl Recorder {
    /// A recorder for `classes` traffic classes, whose second 0 is `start` = run second `t_offset`.
    pub fn new(classes: usize, start: Instant, t_offset: u64) -> Self {
        Self {
            start,
            t_offset,
            cur_sec: 0,
            // Per-second histograms use 2 significant digits: a long run keeps no histograms, only
            // their percentiles, but a 3-digit histogram per class per second would be ~140 KB.
            cur: (0..classes)
                .map(|_| (Counts::default(), histogram(2)))
                .collect(),
            rows: Vec::new(),
            totals: (0..classes)
                .map(|_| (Counts::default(), histogram(3)))
                .collect(),
        }
    }

    /// The instant of second 0.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Closes every second that ended before `now`.
    pub fn roll(&mut self, now: Instant) {
        let sec = now.saturating_duration_since(self.start).as_secs();
        while self.cur_sec < sec {
            self.close_second();
        }
    }

    fn close_second(&mut self) {
        let classes = self
            .cur
            .iter_mut()
            .map(|(c, h)| {
                let row = ClassSecond {
                    counts: *c,
                    latency: Percentiles::of(h),
                };
                *c = Counts::default();
                h.reset();
                row
            })
            .collect();
        self.rows.push(SecondRow {
            t: self.t_offset + self.cur_sec,
            classes,
        });
        self.cur_sec += 1;
    }

    /// Records that the schedule produced a request at `now`; `lagged` if it went out late.
    pub fn on_issue(&mut self, now: Instant, class: usize, lagged: bool, sent: bool) {
        self.roll(now);
        for c in [
            self.cur.get_mut(class).map(|x| &mut x.0),
            self.totals.get_mut(class).map(|x| &mut x.0),
        ]
        .into_iter()
        .flatten()
        {
            c.offered += 1;
            if sent {
                c.sent += 1;
                c.lagged += u64::from(lagged);
            } else {
                c.unsent += 1;
            }
        }
    }

    /// Records `n` requests that the generator dropped without sending them.
    pub fn on_unsent(&mut self, now: Instant, class: usize, n: u64) {
        self.roll(now);
        for c in [
            self.cur.get_mut(class).map(|x| &mut x.0),
            self.totals.get_mut(class).map(|x| &mut x.0),
        ]
        .into_iter()
        .flatten()
        {
            c.offered += n;
            c.unsent += n;
        }
    }

    /// Records a completed request.
    pub fn on_done(&mut self, now: Instant, class: usize, outcome: Outcome, latency: Duration) {
        self.roll(now);
        let us = micros(latency);
        let success = matches!(outcome, Outcome::Ok | Outcome::Late);
        for (c, h) in [self.cur.get_mut(class), self.totals.get_mut(class)]
            .into_iter()
            .flatten()
        {
            c.add(outcome);
            if success {
                h.saturating_record(us);
            }
        }
    }

    /// Rows closed so far.
    pub fn rows(&self) -> &[SecondRow] {
        &self.rows
    }

    /// Closes the current (partial) second and returns all rows and the totals.
    pub fn finish(mut self, now: Instant) -> (Vec<SecondRow>, Vec<ClassTotals>) {
        self.roll(now);
        if self.cur.iter().any(|(c, _)| *c != Counts::default()) {
            self.close_second();
        }
        let totals = self
            .totals
            .into_iter()
            .map(|(counts, hist)| ClassTotals { counts, hist })
            .collect();
        (self.rows, totals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_splits_by_completion_second_and_totals_by_step() {
        let t0 = Instant::now();
        let mut r = Recorder::new(2, t0, 10);
        r.on_issue(t0, 0, false, true);
        r.on_issue(t0, 1, true, false);
        r.on_done(
            t0 + Duration::from_millis(1500),
            0,
            Outcome::Ok,
            Duration::from_millis(1500),
        );
        let (rows, totals) = r.finish(t0 + Duration::from_millis(1600));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].t, 10);
        assert_eq!(rows[0].classes[0].counts.offered, 1);
        assert_eq!(rows[0].classes[1].counts.unsent, 1);
        assert_eq!(
            rows[0].classes[1].counts.lagged, 0,
            "unsent is not also lagged"
        );
        assert_eq!(rows[1].classes[0].counts.ok, 1);
        let p99 = rows[1].classes[0].latency.p99_us as f64;
        assert!((p99 - 1.5e6).abs() < 1.5e4, "p99 {p99}");
        assert_eq!(totals[0].counts.ok, 1);
        assert_eq!(totals[0].counts.sent, 1);
        assert_eq!(totals[1].counts.unsent, 1);
        assert_eq!(totals[0].hist.len(), 1);
    }

    #[test]
    fn failures_do_not_enter_the_latency_histogram() {
        let t0 = Instant::now();
        let mut r = Recorder::new(1, t0, 0);
        r.on_done(t0, 0, Outcome::ClientTimeout, Duration::from_secs(1));
        r.on_done(t0, 0, Outcome::Late, Duration::from_millis(50));
        let (_, totals) = r.finish(t0);
        assert_eq!(totals[0].hist.len(), 1);
        assert_eq!(totals[0].counts.failed(), 2);
        assert_eq!(totals[0].counts.completed(), 2);
    }
}
