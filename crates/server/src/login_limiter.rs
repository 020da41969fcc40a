//! Failed-login throttling per source address, in fixed memory.
//!
//! After a few free failures, an address must wait before its next password is checked,
//! the wait doubling per further failure up to a ceiling; an attempt during the wait is
//! refused without running the (slow) password hash. Addresses live in a set-associative
//! table of fixed size whose buckets are chosen by a per-process random hash, so that
//! memory stays bounded and nobody can aim collisions; when a bucket is full its oldest
//! entry is forgotten (an attacker with many addresses can only reset its own entries).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How the limiter throttles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginLimiterConfig {
    /// Failures an address may have before it is made to wait.
    pub free_failures: u32,
    /// The wait after the first failure beyond the free ones; it doubles per failure.
    pub base_delay: Duration,
    /// The longest wait.
    pub max_delay: Duration,
    /// An address whose last failure is older than this starts afresh.
    pub forget_after: Duration,
    /// Buckets of the table (rounded up to a power of two).
    pub buckets: usize,
}

impl Default for LoginLimiterConfig {
    fn default() -> Self {
        LoginLimiterConfig {
            free_failures: 5,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
            forget_after: Duration::from_secs(600),
            buckets: 1024,
        }
    }
}

/// Entries per bucket.
const WAYS: usize = 4;

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    addr: Option<IpAddr>,
    failures: u32,
    /// Milliseconds since the limiter's origin.
    last_failure_ms: u64,
    blocked_until_ms: u64,
}

/// Whether a login attempt may go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginVerdict {
    /// Check the password.
    Allowed,
    /// Refuse without checking; the address may try again after this long.
    Throttled {
        /// Time left of the wait.
        retry_after: Duration,
    },
}

/// The message a throttled attempt gets with Bad_credentials.
pub const THROTTLED_MESSAGE: &str =
    "Too many failed login attempts from this address; try again later";

/// Failed logins per source address, in fixed memory (`buckets * 4` entries).
#[derive(Debug)]
pub struct LoginLimiter {
    config: LoginLimiterConfig,
    origin: Instant,
    hasher: RandomState,
    slots: Mutex<Box<[Slot]>>,
    mask: usize,
    /// Addresses with a password check under way, each with its one turn. An entry lives only
    /// while a login from that address is being checked or waits to be, so the map is bounded
    /// by the logins in progress.
    turns: Mutex<HashMap<IpAddr, Arc<Semaphore>>>,
}

/// An address's turn to have a password checked: one at a time per address, so that the
/// attempts of one address (an attacker's, or a pool's) hold at most one of the node's few
/// hashing slots and a login from another address never queues behind them.
#[derive(Debug)]
pub struct CheckTurn<'a> {
    limiter: &'a LoginLimiter,
    addr: IpAddr,
    turn: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for CheckTurn<'_> {
    fn drop(&mut self) {
        self.permit.take();
        let mut turns = self.limiter.turns.lock().unwrap_or_else(|p| p.into_inner());
        // Held by the map and by this turn only: nobody waits, the entry goes.
        if Arc::strong_count(&self.turn) == 2 {
            turns.remove(&self.addr);
        }
        debug_assert!(Arc::strong_count(&self.turn) >= 1);
    }
}

impl LoginLimiter {
    /// A limiter with all its memory allocated up front.
    pub fn new(config: LoginLimiterConfig, origin: Instant) -> LoginLimiter {
        let buckets = config.buckets.max(1).next_power_of_two();
        LoginLimiter {
            config,
            origin,
            hasher: RandomState::new(),
            slots: Mutex::new(vec![Slot::default(); buckets * WAYS].into_boxed_slice()),
            mask: buckets - 1,
            turns: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for `addr`'s turn to have a password checked (one check at a time per address).
    pub async fn turn(&self, addr: IpAddr) -> CheckTurn<'_> {
        let turn = {
            let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
            turns
                .entry(addr)
                .or_insert_with(|| Arc::new(Semaphore::new(1)))
                .clone()
        };
        // The semaphore is never closed, so acquiring only fails if it were.
        let permit = turn.clone().acquire_owned().await.ok();
        debug_assert!(permit.is_some(), "a login turn's semaphore is never closed");
        CheckTurn {
            limiter: self,
            addr,
            turn,
            permit,
        }
    }

    /// Addresses with a login being checked or waiting for its turn.
    pub fn turns_in_use(&self) -> usize {
        self.turns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_millis() as u64
    }

    fn bucket(&self, addr: &IpAddr) -> usize {
        (self.hasher.hash_one(addr) as usize) & self.mask
    }

    /// May `addr` try a password now?
    pub fn check(&self, addr: IpAddr, now: Instant) -> LoginVerdict {
        let now_ms = self.ms(now);
        let b = self.bucket(&addr);
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let found = slots[b * WAYS..(b + 1) * WAYS]
            .iter()
            .find(|s| s.addr == Some(addr));
        match found {
            Some(s) if s.blocked_until_ms > now_ms => LoginVerdict::Throttled {
                retry_after: Duration::from_millis(s.blocked_until_ms - now_ms),
            },
            _ => LoginVerdict::Allowed,
        }
    }

    /// Records a failed attempt of `addr` (a wrong password, or a throttled attempt).
    pub fn record_failure(&self, addr: IpAddr, now: Instant) {
        let now_ms = self.ms(now);
        let b = self.bucket(&addr);
        let forget_ms = self.config.forget_after.as_millis() as u64;
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = &mut slots[b * WAYS..(b + 1) * WAYS];
        let i = match bucket.iter().position(|s| s.addr == Some(addr)) {
            Some(i) => i,
            None => {
                // A free slot, else the one whose last failure is oldest.
                let i = bucket
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, s)| (s.addr.is_some(), s.last_failure_ms))
                    .map_or(0, |(i, _)| i);
                bucket[i] = Slot {
                    addr: Some(addr),
                    ..Slot::default()
                };
                i
            }
        };
        let s = &mut bucket[i];
        if s.failures > 0 && now_ms.saturating_sub(s.last_failure_ms) > forget_ms {
            s.failures = 0;
            s.blocked_until_ms = 0;
        }
        s.failures = s.failures.saturating_add(1);
        s.last_failure_ms = now_ms;
        if s.failures > self.config.free_failures {
            let doublings = (s.failures - self.config.free_failures - 1).min(30);
            let delay = self
                .config
                .base_delay
                .saturating_mul(1u32 << doublings)
                .min(self.config.max_delay);
            s.blocked_until_ms = now_ms + delay.as_millis() as u64;
        }
        debug_assert!(s.addr == Some(addr));
    }

    /// A successful login forgets the address's failures.
    pub fn record_success(&self, addr: IpAddr) {
        let b = self.bucket(&addr);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slots[b * WAYS..(b + 1) * WAYS]
            .iter_mut()
            .find(|s| s.addr == Some(addr))
        {
            *s = Slot::default();
        }
    }

    /// How many addresses the limiter remembers (at most `buckets * 4`).
    pub fn tracked(&self) -> usize {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.iter().filter(|s| s.addr.is_some()).count()
    }

    /// The table's capacity in addresses.
    pub fn capacity(&self) -> usize {
        (self.mask + 1) * WAYS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    fn limiter(t0: Instant) -> LoginLimiter {
        LoginLimiter::new(
            LoginLimiterConfig {
                free_failures: 3,
                base_delay: Duration::from_millis(100),
                max_delay: Duration::from_secs(2),
                forget_after: Duration::from_secs(60),
                buckets: 16,
            },
            t0,
        )
    }

    #[test]
    fn one_check_at_a_time_per_address_and_no_entry_left_behind() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = limiter(Instant::now());
            let first = l.turn(ip(2)).await;
            // Another address is not held up by the first one's check.
            let other = tokio::time::timeout(Duration::from_millis(100), l.turn(ip(3)))
                .await
                .expect("another address gets its turn at once");
            // The same address waits until the first check is done.
            let waiting = tokio::time::timeout(Duration::from_millis(20), l.turn(ip(2))).await;
            assert!(
                waiting.is_err(),
                "a second check of one address waits its turn"
            );
            assert_eq!(l.turns_in_use(), 2);
            drop(first);
            let second = tokio::time::timeout(Duration::from_millis(100), l.turn(ip(2)))
                .await
                .expect("the next check of that address goes once the first is done");
            drop(second);
            drop(other);
            assert_eq!(l.turns_in_use(), 0, "finished turns leave no entry");
        });
    }

    #[test]
    fn failures_beyond_the_free_ones_wait_longer_each_time() {
        let t0 = Instant::now();
        let l = limiter(t0);
        let mut now = t0;
        for _ in 0..3 {
            assert_eq!(l.check(ip(2), now), LoginVerdict::Allowed);
            l.record_failure(ip(2), now);
        }
        assert_eq!(l.check(ip(2), now), LoginVerdict::Allowed);
        // The fourth failure costs 100 ms, the fifth 200 ms, then 400 ms...
        let mut expected = 100;
        for _ in 0..8 {
            l.record_failure(ip(2), now);
            assert_eq!(
                l.check(ip(2), now),
                LoginVerdict::Throttled {
                    retry_after: Duration::from_millis(expected.min(2000))
                }
            );
            now += Duration::from_millis(expected.min(2000) - 1);
            assert!(matches!(
                l.check(ip(2), now),
                LoginVerdict::Throttled { .. }
            ));
            now += Duration::from_millis(1);
            assert_eq!(l.check(ip(2), now), LoginVerdict::Allowed);
            expected *= 2;
        }
        // Another address is not affected.
        assert_eq!(l.check(ip(3), now), LoginVerdict::Allowed);
    }

    #[test]
    fn success_and_time_forget_failures() {
        let t0 = Instant::now();
        let l = limiter(t0);
        for _ in 0..10 {
            l.record_failure(ip(2), t0);
        }
        assert!(matches!(l.check(ip(2), t0), LoginVerdict::Throttled { .. }));
        l.record_success(ip(2));
        assert_eq!(l.check(ip(2), t0), LoginVerdict::Allowed);
        for _ in 0..10 {
            l.record_failure(ip(4), t0);
        }
        // Long after, the next failure starts the count again: free failures are free.
        let later = t0 + Duration::from_secs(120);
        assert_eq!(l.check(ip(4), later), LoginVerdict::Allowed);
        l.record_failure(ip(4), later);
        assert_eq!(l.check(ip(4), later), LoginVerdict::Allowed);
    }

    #[test]
    fn a_thousand_failures_allow_few_password_checks() {
        // An attacker that retries as soon as allowed, for 60 simulated seconds.
        let t0 = Instant::now();
        let l = limiter(t0);
        let mut checked = 0;
        let mut now = t0;
        for _ in 0..1000 {
            match l.check(ip(2), now) {
                LoginVerdict::Allowed => {
                    checked += 1;
                    l.record_failure(ip(2), now);
                }
                LoginVerdict::Throttled { .. } => {}
            }
            now += Duration::from_millis(60);
        }
        // 3 free, then waits of 0.1, 0.2, 0.4, 0.8, 1.6 s, then one every 2 s.
        assert!((30..=40).contains(&checked), "{checked} passwords checked");
    }

    #[test]
    fn memory_is_bounded() {
        let t0 = Instant::now();
        let l = limiter(t0);
        assert_eq!(l.capacity(), 64);
        for i in 0..10_000u32 {
            let a = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            l.record_failure(a, t0 + Duration::from_millis(u64::from(i)));
        }
        assert_eq!(l.tracked(), 64);
    }
}
