//! Open-loop arrival schedules: the intended send time of every request, fixed in advance.
//!
//! The schedule never looks at the server: a slow answer does not delay the next arrival, which
//! is what keeps the measurement free of coordinated omission.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// How arrivals are spaced in time.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Evenly spaced arrivals, one every `1/rate` seconds (wrk2 style).
    Constant,
    /// Exponentially distributed gaps with mean `1/rate` (a Poisson process).
    Poisson,
}

/// An iterator over intended send times, as offsets from the start of a step.
#[derive(Debug)]
pub struct Schedule {
    arrival: Arrival,
    gap_ns: f64,
    end_ns: f64,
    index: u64,
    next_ns: f64,
    rng: StdRng,
}

impl Schedule {
    /// A schedule of `rate` arrivals per second over `duration`; `seed` fixes Poisson gaps.
    pub fn new(arrival: Arrival, rate: f64, duration: Duration, seed: u64) -> Self {
        // A non-positive or non-finite rate yields an empty schedule rather than a division by zero.
        let gap_ns = if rate.is_finite() && rate > 0.0 {
            1e9 / rate
        } else {
            f64::INFINITY
        };
        let mut s = Self {
            arrival,
            gap_ns,
            end_ns: duration.as_nanos() as f64,
            index: 0,
            next_ns: 0.0,
            rng: StdRng::seed_from_u64(seed),
        };
        if !gap_ns.is_finite() {
            s.next_ns = f64::INFINITY;
        } else if arrival == Arrival::Poisson {
            s.next_ns = s.exp_gap();
        }
        s
    }

    fn exp_gap(&mut self) -> f64 {
        // 1 - U lies in (0, 1], so the logarithm is finite.
        let u: f64 = self.rng.random();
        -(1.0 - u).ln() * self.gap_ns
    }
}

impl Iterator for Schedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if !self.next_ns.is_finite() || self.next_ns >= self.end_ns {
            return None;
        }
        let now = self.next_ns;
        self.index += 1;
        self.next_ns = match self.arrival {
            // Multiply rather than accumulate so that rounding does not drift over long runs.
            Arrival::Constant => self.index as f64 * self.gap_ns,
            Arrival::Poisson => now + self.exp_gap(),
        };
        Some(Duration::from_nanos(now as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_schedule_is_evenly_spaced() {
        let times: Vec<Duration> =
            Schedule::new(Arrival::Constant, 1000.0, Duration::from_secs(2), 1).collect();
        assert_eq!(times.len(), 2000);
        for (k, t) in times.iter().enumerate() {
            assert_eq!(*t, Duration::from_micros(k as u64 * 1000));
        }
    }

    #[test]
    fn constant_schedule_handles_fractional_gaps_without_drift() {
        let times: Vec<Duration> =
            Schedule::new(Arrival::Constant, 3.0, Duration::from_secs(100), 1).collect();
        assert_eq!(times.len(), 300);
        let last = times[299].as_secs_f64();
        assert!((last - 299.0 / 3.0).abs() < 1e-6, "last arrival at {last}");
    }

    #[test]
    fn poisson_schedule_has_the_requested_mean_rate_and_exponential_gaps() {
        let rate = 10_000.0;
        let times: Vec<Duration> =
            Schedule::new(Arrival::Poisson, rate, Duration::from_secs(20), 7).collect();
        let n = times.len() as f64;
        assert!(
            (n / 20.0 - rate).abs() < rate * 0.02,
            "mean rate {}",
            n / 20.0
        );
        let gaps: Vec<f64> = times
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64())
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        // An exponential distribution has a coefficient of variation of 1; a constant one has 0.
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.05, "coefficient of variation {cv}");
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "times must not go backwards"
        );
    }

    #[test]
    fn poisson_schedule_is_reproducible_from_its_seed() {
        let a: Vec<Duration> =
            Schedule::new(Arrival::Poisson, 500.0, Duration::from_secs(1), 42).collect();
        let b: Vec<Duration> =
            Schedule::new(Arrival::Poisson, 500.0, Duration::from_secs(1), 42).collect();
        let c: Vec<Duration> =
            Schedule::new(Arrival::Poisson, 500.0, Duration::from_secs(1), 43).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn zero_or_invalid_rate_gives_no_arrivals() {
        for rate in [0.0, -5.0, f64::NAN] {
            assert_eq!(
                Schedule::new(Arrival::Constant, rate, Duration::from_secs(1), 1).count(),
                0
            );
            assert_eq!(
                Schedule::new(Arrival::Poisson, rate, Duration::from_secs(1), 1).count(),
                0
            );
        }
    }
}
