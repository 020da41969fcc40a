//! Injectable time sources: a monotonic nanosecond clock for deadlines and queue delays,
//! and wall-clock time for the rate limiter's per-second windows.
//!
//! Everything in this crate takes time as an argument instead of reading it, so that the
//! simulations can drive the same code with a [`FakeClock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A point in time as nanoseconds since an arbitrary origin (monotonic or Unix epoch).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub u64);

impl Nanos {
    /// The origin.
    pub const ZERO: Nanos = Nanos(0);
    /// The latest representable instant; used as "no deadline".
    pub const MAX: Nanos = Nanos(u64::MAX);

    /// `secs` seconds after the origin.
    pub const fn from_secs(secs: u64) -> Nanos {
        Nanos(secs.saturating_mul(1_000_000_000))
    }

    /// `ms` milliseconds after the origin.
    pub const fn from_millis(ms: u64) -> Nanos {
        Nanos(ms.saturating_mul(1_000_000))
    }

    /// `us` microseconds after the origin.
    pub const fn from_micros(us: u64) -> Nanos {
        Nanos(us.saturating_mul(1_000))
    }

    /// Raw nanoseconds since the origin.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Whole seconds since the origin (the rate limiter's window id when the origin is the epoch).
    pub const fn as_secs(self) -> u64 {
        self.0 / 1_000_000_000
    }

    /// This instant plus `d`, saturating at [`Nanos::MAX`].
    pub fn saturating_add(self, d: Duration) -> Nanos {
        Nanos(self.0.saturating_add(duration_nanos(d)))
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Nanos) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// Converts a duration to nanoseconds, saturating at `u64::MAX` (about 584 years).
pub fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A source of time. Implementations must be cheap: this is read on the request path.
pub trait Clock {
    /// Monotonic time; never goes backwards.
    fn now(&self) -> Nanos;
    /// Wall-clock time as nanoseconds since the Unix epoch (may jump; used for limiter windows,
    /// which are aligned to wall-clock seconds so that replicas halve their counters together).
    fn wall(&self) -> Nanos;
}

/// The real clocks: the monotonic clock `Instant` reads, and `SystemTime` for wall time.
/// [`Clock::now`] reads the monotonic clock directly (on Linux), without `Instant`'s
/// conversions; [`SystemClock::at`] puts an `Instant` read elsewhere on the same scale.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Instant,
    /// `origin` on the raw monotonic clock ([`monotonic_raw`]), read at the same moment.
    origin_raw: u64,
}

impl SystemClock {
    /// A clock whose monotonic origin is the moment of creation.
    pub fn new() -> SystemClock {
        SystemClock {
            origin: Instant::now(),
            origin_raw: monotonic_raw(),
        }
    }

    /// The monotonic time of `at` (an `Instant` taken by the caller), on the scale of
    /// [`Clock::now`].
    #[inline]
    pub fn at(&self, at: Instant) -> Nanos {
        Nanos(duration_nanos(at.saturating_duration_since(self.origin)))
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    /// What `at(Instant::now())` gives (the origins were read together), from one read of
    /// the raw clock.
    #[inline]
    fn now(&self) -> Nanos {
        Nanos(monotonic_raw().saturating_sub(self.origin_raw))
    }

    #[inline]
    fn wall(&self) -> Nanos {
        Nanos(wall_raw())
    }
}

/// Nanoseconds since the Unix epoch on `CLOCK_REALTIME`, read directly: the rate limiter
/// reads it for every operation on a limited table, and `SystemTime`'s checked conversions
/// cost more than the read. A clock set before 1970 reads as the epoch.
#[cfg(target_os = "linux")]
#[inline]
fn wall_raw() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_REALTIME is always available.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    if ts.tv_sec < 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Nanoseconds since the Unix epoch (elsewhere: from `SystemTime`); a clock set before 1970
/// reads as the epoch.
#[cfg(not(target_os = "linux"))]
fn wall_raw() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    duration_nanos(since)
}

/// Nanoseconds on the monotonic clock that `Instant` reads (`CLOCK_MONOTONIC` on Linux).
#[cfg(target_os = "linux")]
#[inline]
fn monotonic_raw() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always available.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Nanoseconds on a monotonic clock (elsewhere: from `Instant`, with its conversions).
#[cfg(not(target_os = "linux"))]
fn monotonic_raw() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    duration_nanos(START.get_or_init(Instant::now).elapsed())
}

/// A manually advanced clock for tests and simulations. Clones share the same time.
///
/// Wall time is `wall_origin + monotonic`, so both advance together; [`FakeClock::set_wall`]
/// can move the wall clock independently (e.g. to jump close to a window-id wrap).
#[derive(Clone, Debug, Default)]
pub struct FakeClock {
    inner: Arc<FakeInner>,
}

#[derive(Debug, Default)]
struct FakeInner {
    mono: AtomicU64,
    wall_offset: AtomicU64,
}

impl FakeClock {
    /// A clock at monotonic time zero whose wall clock reads `wall_origin`.
    pub fn new(wall_origin: Nanos) -> FakeClock {
        let c = FakeClock::default();
        c.inner.wall_offset.store(wall_origin.0, Ordering::Relaxed);
        c
    }

    /// Moves time forward by `d` (both clocks).
    pub fn advance(&self, d: Duration) {
        self.inner
            .mono
            .fetch_add(duration_nanos(d), Ordering::Relaxed);
    }

    /// Moves monotonic time to `t` if it is later than now (monotonic time never goes back).
    pub fn advance_to(&self, t: Nanos) {
        self.inner.mono.fetch_max(t.0, Ordering::Relaxed);
    }

    /// Sets the wall clock to `wall` without moving monotonic time.
    pub fn set_wall(&self, wall: Nanos) {
        let mono = self.inner.mono.load(Ordering::Relaxed);
        self.inner
            .wall_offset
            .store(wall.0.wrapping_sub(mono), Ordering::Relaxed);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Nanos {
        Nanos(self.inner.mono.load(Ordering::Relaxed))
    }

    fn wall(&self) -> Nanos {
        let mono = self.inner.mono.load(Ordering::Relaxed);
        Nanos(
            self.inner
                .wall_offset
                .load(Ordering::Relaxed)
                .wrapping_add(mono),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `now` (the raw clock) and `at` (an `Instant`) are one scale: an `Instant` taken
    /// between two reads of `now` lands between them (give or take the origins' gap).
    #[test]
    fn system_clock_reads_and_instants_share_one_scale() {
        let c = SystemClock::new();
        std::thread::sleep(Duration::from_millis(2));
        let before = c.now();
        let at = c.at(Instant::now());
        let after = c.now();
        let slack = 1_000_000; // 1 ms, far above the microseconds between the origin reads
        assert!(
            at.0 + slack >= before.0 && at.0 <= after.0 + slack,
            "{before:?} {at:?} {after:?}"
        );
        assert!(before.0 >= 2_000_000, "time since the origin: {before:?}");
    }

    /// The direct read of the wall clock is the time `SystemTime` gives.
    #[test]
    fn system_clock_wall_is_system_time() {
        use std::time::{SystemTime, UNIX_EPOCH};
        let c = SystemClock::new();
        let since = |t: SystemTime| duration_nanos(t.duration_since(UNIX_EPOCH).unwrap());
        let before = since(SystemTime::now());
        let wall = c.wall();
        let after = since(SystemTime::now());
        assert!(
            before <= wall.0 && wall.0 <= after,
            "{before} {wall:?} {after}"
        );
    }

    #[test]
    fn fake_clock_is_shared_and_monotonic() {
        let c = FakeClock::new(Nanos::from_secs(1_000));
        let d = c.clone();
        c.advance(Duration::from_millis(1500));
        assert_eq!(d.now(), Nanos::from_millis(1500));
        assert_eq!(d.wall(), Nanos::from_millis(1_001_500));
        c.advance_to(Nanos::from_millis(10));
        assert_eq!(
            c.now(),
            Nanos::from_millis(1500),
            "advance_to never goes back"
        );
        c.set_wall(Nanos::from_secs(5));
        assert_eq!(c.wall(), Nanos::from_secs(5));
        assert_eq!(c.now(), Nanos::from_millis(1500));
        c.advance(Duration::from_secs(1));
        assert_eq!(c.wall(), Nanos::from_secs(6));
    }

    #[test]
    fn system_clock_moves_forward() {
        let c = SystemClock::new();
        let a = c.now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(c.now().saturating_duration_since(a) >= Duration::from_millis(2));
        assert!(c.wall().as_secs() > 1_600_000_000);
    }

    #[test]
    fn nanos_arithmetic_saturates() {
        assert_eq!(
            Nanos::MAX.saturating_add(Duration::from_secs(1)),
            Nanos::MAX
        );
        assert_eq!(Nanos(5).saturating_duration_since(Nanos(9)), Duration::ZERO);
        assert_eq!(Nanos::from_secs(3).as_secs(), 3);
    }
}
