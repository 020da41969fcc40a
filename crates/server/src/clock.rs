//! The shard's clock: every time the request path reads (a frame's arrival, its deadline and
//! the check of it, the admission queue's delays and CoDel, the concurrency limit's latency
//! samples, the loop-lag probe, the rate limiter's windows) comes from the one [`ShardClock`]
//! its [`crate::shard::ShardCtx`] holds, so that a simulation can run the same pipeline over
//! a clock it sets and advances itself (see `sim.rs`, built for tests only).
//!
//! In a server the handle reads the system's clocks exactly as the code did before it
//! existed: the manual clock is compiled only into this crate's tests, so production pays
//! no branch for it. Kernel receive stamps (`socket_wait.rs`) stay on the kernel's clock.
//! The engine's last check of the deadline before storage reads the real clock: a manual
//! clock's instants lie a day after the real clock's, so that check never fires in a
//! simulation, and the check stage's (on this clock) is the one that decides.

use std::time::Instant;

use sluice_overload::{Clock, Nanos, SystemClock};

/// A shard's source of time (see the module documentation).
#[derive(Clone, Debug)]
pub struct ShardClock {
    system: SystemClock,
    #[cfg(test)]
    manual: Option<manual::ManualClock>,
}

impl ShardClock {
    /// The system's clocks: `Instant::now`, the raw monotonic clock and `CLOCK_REALTIME`.
    pub fn system() -> ShardClock {
        ShardClock {
            system: SystemClock::new(),
            #[cfg(test)]
            manual: None,
        }
    }

    /// A clock that moves only when `manual` is advanced.
    #[cfg(test)]
    pub fn manual(manual: manual::ManualClock) -> ShardClock {
        ShardClock {
            system: SystemClock::new(),
            manual: Some(manual),
        }
    }

    /// Now, as an `Instant` (arrivals and deadlines are instants).
    #[inline]
    pub fn now(&self) -> Instant {
        #[cfg(test)]
        if let Some(m) = &self.manual {
            return m.instant();
        }
        Instant::now()
    }

    /// Now, on the shard's monotonic scale for the overload crate's controllers (one read
    /// of the raw clock, without `Instant`'s conversions).
    #[inline]
    pub fn nanos(&self) -> Nanos {
        #[cfg(test)]
        if let Some(m) = &self.manual {
            return m.fake().now();
        }
        self.system.now()
    }

    /// The instant `at` (taken from [`Self::now`]) on the scale of [`Self::nanos`].
    #[inline]
    pub fn nanos_of(&self, at: Instant) -> Nanos {
        #[cfg(test)]
        if let Some(m) = &self.manual {
            return m.nanos_of(at);
        }
        self.system.at(at)
    }

    /// Wall-clock time since the Unix epoch (the rate limiter's windows).
    #[inline]
    pub fn wall(&self) -> Nanos {
        #[cfg(test)]
        if let Some(m) = &self.manual {
            return m.fake().wall();
        }
        self.system.wall()
    }

    /// A statement was executed on this shard: a manual clock advances by the simulated
    /// cost of an execution; the system clock has nothing to do (compiled to nothing).
    #[inline(always)]
    pub fn executed(&self) {
        #[cfg(test)]
        if let Some(m) = &self.manual {
            m.charge_execution();
        }
    }
}

#[cfg(test)]
pub mod manual {
    //! The manual clock of the simulations and tests.

    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    use sluice_overload::{Clock, FakeClock, Nanos};

    /// How far after the real clock a manual clock's instants start: far enough that no
    /// deadline computed on it passes on the real clock during a test.
    const AHEAD_OF_REAL_TIME: Duration = Duration::from_secs(24 * 3600);

    /// Time that moves only when told to. Clones share it.
    #[derive(Clone, Debug)]
    pub struct ManualClock {
        fake: FakeClock,
        origin: Instant,
        /// What the next execution costs, in simulated time.
        execution_cost: Rc<Cell<Duration>>,
        /// Executions charged, and their total cost.
        executions: Rc<Cell<(u64, Duration)>>,
    }

    impl ManualClock {
        /// A clock at zero whose wall clock reads `wall_origin`.
        pub fn new(wall_origin: Nanos) -> ManualClock {
            let now = Instant::now();
            ManualClock {
                fake: FakeClock::new(wall_origin),
                origin: now.checked_add(AHEAD_OF_REAL_TIME).unwrap_or(now),
                execution_cost: Rc::new(Cell::new(Duration::ZERO)),
                executions: Rc::new(Cell::new((0, Duration::ZERO))),
            }
        }

        /// The underlying fake clock.
        pub fn fake(&self) -> &FakeClock {
            &self.fake
        }

        /// Now.
        pub fn now(&self) -> Nanos {
            self.fake.now()
        }

        /// Now, as an instant.
        pub fn instant(&self) -> Instant {
            self.instant_of(self.fake.now())
        }

        /// The instant of `t` on this clock's scale.
        pub fn instant_of(&self, t: Nanos) -> Instant {
            self.origin + Duration::from_nanos(t.as_u64())
        }

        /// The time of `at`, an instant of this clock.
        pub fn nanos_of(&self, at: Instant) -> Nanos {
            Nanos(sluice_overload::clock::duration_nanos(
                at.saturating_duration_since(self.origin),
            ))
        }

        /// Moves time forward by `d`.
        pub fn advance(&self, d: Duration) {
            self.fake.advance(d);
        }

        /// Moves time forward to `t` (never back).
        pub fn advance_to(&self, t: Nanos) {
            self.fake.advance_to(t);
        }

        /// Sets what each execution costs from now on.
        pub fn set_execution_cost(&self, cost: Duration) {
            self.execution_cost.set(cost);
        }

        /// An execution ran: time moves forward by its cost.
        pub fn charge_execution(&self) {
            let cost = self.execution_cost.get();
            self.fake.advance(cost);
            let (n, total) = self.executions.get();
            self.executions.set((n + 1, total + cost));
        }

        /// Executions charged so far, and their total cost.
        pub fn executions(&self) -> (u64, Duration) {
            self.executions.get()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::manual::ManualClock;
    use super::*;
    use std::time::Duration;

    /// The system handle reads the real clocks on one scale.
    #[test]
    fn system_clock_instants_and_nanos_agree() {
        let c = ShardClock::system();
        let before = c.nanos();
        let at = c.nanos_of(c.now());
        let after = c.nanos();
        let slack = 1_000_000;
        assert!(at.0 + slack >= before.0 && at.0 <= after.0 + slack);
        assert!(c.wall().as_secs() > 1_600_000_000);
    }

    /// A manual handle moves only when told, on every scale at once, and its instants lie
    /// after the real clock's.
    #[test]
    fn manual_clock_moves_when_told() {
        let m = ManualClock::new(Nanos::from_secs(1_000));
        let c = ShardClock::manual(m.clone());
        let t0 = c.now();
        assert_eq!(c.nanos(), Nanos::ZERO);
        assert!(t0 > Instant::now() + Duration::from_secs(3600));
        m.advance(Duration::from_millis(3));
        assert_eq!(c.now() - t0, Duration::from_millis(3));
        assert_eq!(c.nanos(), Nanos::from_millis(3));
        assert_eq!(c.nanos_of(c.now()), Nanos::from_millis(3));
        assert_eq!(c.wall(), Nanos::from_millis(1_000_003));
        m.set_execution_cost(Duration::from_micros(50));
        c.executed();
        c.executed();
        assert_eq!(c.nanos(), Nanos::from_micros(3_100));
        // The system handle's `executed` does nothing.
        let s = ShardClock::system();
        s.executed();
        assert_eq!(c.nanos(), Nanos::from_micros(3_100));
    }
}
