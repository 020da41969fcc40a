//! ScyllaDB's per-partition rate limiter, re-implemented faithfully and then fixed.
//!
//! One [`RateLimiter`] per shard: a fixed-size open-addressing table of counters keyed by a
//! salted hash of (partition token, table id, operation type). Memory is allocated once and
//! never grows. The ScyllaDB mechanics are kept:
//!
//! * triangular probing bounded by [`RateLimiterConfig::max_probes`];
//! * lossy counting: every [`RateLimiterConfig::lossy_bucket`] operations on the shard,
//!   every counter is virtually decremented by one, so one-off keys fade and free their slot;
//! * counters halve once per wall-clock second, lazily, using window ids stamped in entries
//!   and a small ring of per-window lossy decrements;
//! * the decision: accept while the counter `c` (which counts every attempt, rejected ones
//!   too) is `<= 2L`; above, accept with probability `L / (c·ln 2)`, using one `u32` random
//!   number drawn per operation by the coordinator (so replicas given the same number agree).
//!   With halving, a key offered `V > 2L` ops/s has a counter sweeping `[V, 2V]` each second,
//!   and `∫_V^{2V} L/(x ln 2) dx = L`: the expected accepted rate is the limit.
//!
//! Fixed flaws (see `scylla_rate_limit.md` §9):
//!
//! * **Window wrap.** Window ids are 12 bits as in ScyllaDB, but the delta is computed modulo
//!   4096, so a hot entry is no longer reset every 68 minutes. A sweep refreshes
//!   `len / 2048` entries per window so no live entry is ever more than 2048 windows stale,
//!   which keeps the modular delta unambiguous.
//! * **Fail-open.** When all probed slots hold live counters, ScyllaDB admits unconditionally.
//!   Here the slot with the smallest counter is evicted and the new key inherits that count
//!   (space-saving): counts are never under-estimated, so a hot key cannot hide by flooding
//!   its probe chain with other keys. The price, only when a whole probe chain holds keys
//!   above `2L`, is that a cold key may be rejected; [`LimiterStats::evictions`] shows it.
//! * **Chain breaks.** A never-used slot ends the probe (a key can't live past it) and an
//!   expired slot is only reused after the whole chain was searched for the key, so a hot
//!   entry is never shadowed by a re-used earlier slot.
//! * **Cold-start burst.** With a counter starting at zero, ScyllaDB admits
//!   `2L + L·log2(V/2L)` in the first second (436 at L=100, V=1000) and the counter only
//!   reaches its steady state geometrically (about 1.58L, 1.22L, 1.10L in the next seconds
//!   at V=10L). [`ColdStart::Ramp`] (the default) instead runs a token bucket (rate `L`,
//!   burst `max(1, L·burst_fraction)`, starting full) while an entry is young, i.e. for its
//!   first `windows` windows and again whenever a key's counter faded to zero. The counter
//!   keeps counting every attempt meanwhile, so when the entry matures it is already within
//!   `1 - 2^-windows` of its steady state. The default burst is `L` (fraction 1.0): a key
//!   that never exceeds `L` operations in any one-second span conforms to the bucket and is
//!   never rejected in either phase (a smaller burst rejected Poisson bursts of keys with
//!   small limits that ScyllaDB's `<= 2L` rule accepts). Measured in `sim.rs` (L = 1000,
//!   constant arrivals, 60 s): the first second admits `2.0L` at 2x, 10x and 100x, where
//!   ScyllaDB admits `2.0L`, `4.4L` and `7.6L`; seconds 2-4 admit exactly `L` where
//!   ScyllaDB admits `1.6L`, `1.19L`, `1.14L` at 10x; afterwards both follow the same
//!   probabilistic rule, whose per-second count has a standard deviation of about `√L`
//!   (single seconds 887..1121 over 20 seeds; every 5-second rate within ±10%).
//!
//! The decision step takes `&mut self` (the table is per shard), allocates nothing and
//! takes no lock. Tables without a limit must not reach the table at all: [`RateLimiter::check`]
//! returns [`Decision::Accept`] for `limit == None` before hashing.

use crate::clock::Nanos;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Operation class of an accounted request; reads and writes are limited separately.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpType {
    /// A single-partition read (each partition of an `IN` counts on its own token).
    Read = 0,
    /// A mutation of one partition (a batch counts each partition it touches).
    Write = 1,
}

/// What the limiter counts: one partition of one table, for one operation type.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LimitKey {
    /// The partition's Murmur3 token.
    pub token: i64,
    /// The table's shard-local numeric id.
    pub table: u32,
    /// Read or write.
    pub op: OpType,
}

/// The limiter's verdict for one operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Execute the operation.
    Accept,
    /// Reject it with the rate-limit error; nothing is executed.
    Reject,
}

/// How a key that has just started being counted is treated (see the module docs).
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum ColdStart {
    /// ScyllaDB's behaviour: the counter rule from the first operation (bursts of
    /// `2L + L·log2(V/2L)` in the first second, slow convergence after).
    Scylla,
    /// A token bucket of rate `L` for the first `windows` windows of an entry's life.
    Ramp {
        /// How many one-second windows an entry stays young (4 gives a counter within 6%
        /// of its steady state at maturity).
        windows: u8,
        /// Bucket depth as a fraction of the limit (`max(1, L·burst_fraction)` operations).
        /// 1.0 (the default) never rejects a key within `L` ops in any one-second span.
        burst_fraction: f32,
    },
}

/// Limiter configuration; the defaults are ScyllaDB's sizes.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct RateLimiterConfig {
    /// log2 of the number of entries (16: 65,536 entries, 2 MiB per shard). Clamped to 4..=24.
    pub table_bits: u8,
    /// Maximum probes per lookup (32). Clamped to 1..=table size.
    pub max_probes: u16,
    /// Operations per lossy-counting decrement (10,000).
    pub lossy_bucket: u32,
    /// Cold-start smoothing (default: `Ramp { windows: 4, burst_fraction: 1.0 }`).
    pub cold_start: ColdStart,
}

impl Default for RateLimiterConfig {
    fn default() -> Self {
        RateLimiterConfig {
            table_bits: 16,
            max_probes: 32,
            lossy_bucket: 10_000,
            cold_start: ColdStart::Ramp {
                windows: 4,
                burst_fraction: 1.0,
            },
        }
    }
}

/// Shard-wide limiter counters (plain integers: the limiter is owned by one shard).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LimiterStats {
    /// Operations accounted (limited tables only).
    pub lookups: u64,
    /// Slots probed in total (`probes / lookups` is the mean chain length).
    pub probes: u64,
    /// New entries placed in a free or expired slot.
    pub allocations: u64,
    /// New entries that had to evict the smallest live counter (ScyllaDB failed open here).
    pub evictions: u64,
    /// Operations accepted.
    pub accepted: u64,
    /// Operations rejected.
    pub rejected: u64,
}

/// Accepted/rejected counters of one table, per operation type, readable from any thread
/// (e.g. by the metrics endpoint) while a shard updates them.
#[derive(Debug, Default)]
pub struct TableLimitStats {
    /// Reads accepted by the limiter.
    pub read_accepted: AtomicU64,
    /// Reads rejected by the limiter.
    pub read_rejected: AtomicU64,
    /// Writes accepted by the limiter.
    pub write_accepted: AtomicU64,
    /// Writes rejected by the limiter.
    pub write_rejected: AtomicU64,
}

/// A plain copy of [`TableLimitStats`].
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TableLimitSnapshot {
    /// Reads accepted.
    pub read_accepted: u64,
    /// Reads rejected.
    pub read_rejected: u64,
    /// Writes accepted.
    pub write_accepted: u64,
    /// Writes rejected.
    pub write_rejected: u64,
}

impl TableLimitStats {
    /// Counts one decision.
    #[inline]
    pub fn record(&self, op: OpType, decision: Decision) {
        let c = match (op, decision) {
            (OpType::Read, Decision::Accept) => &self.read_accepted,
            (OpType::Read, Decision::Reject) => &self.read_rejected,
            (OpType::Write, Decision::Accept) => &self.write_accepted,
            (OpType::Write, Decision::Reject) => &self.write_rejected,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads all four counters.
    pub fn snapshot(&self) -> TableLimitSnapshot {
        TableLimitSnapshot {
            read_accepted: self.read_accepted.load(Ordering::Relaxed),
            read_rejected: self.read_rejected.load(Ordering::Relaxed),
            write_accepted: self.write_accepted.load(Ordering::Relaxed),
            write_rejected: self.write_rejected.load(Ordering::Relaxed),
        }
    }
}

/// Bits of the window id stored in entries (ScyllaDB: 12, a wrap every 4096 s).
pub const WINDOW_BITS: u32 = 12;
const WINDOW_MASK: u16 = (1 << WINDOW_BITS) - 1;
/// Length of the per-window lossy-decrement history; a `u32` halved 32 times is zero.
const HISTORY: usize = 32;
/// Every entry is swept at least once per this many windows (half the id space).
const SWEEP_PERIOD: usize = 1 << (WINDOW_BITS - 1);

const USED: u8 = 1;
const WRITE: u8 = 2;
const MATURE: u8 = 4;

/// One counter slot: 32 bytes.
#[derive(Copy, Clone, Debug, Default)]
struct Entry {
    token: i64,
    table: u32,
    /// Absolute count; the effective count is `count - bucket` (lossy counting).
    count: u32,
    /// Cold-start token bucket level.
    tokens: f32,
    /// Wall-clock microseconds (wrapping) of the last bucket refill.
    last_us: u32,
    /// Window id (12 bits) of the last refresh.
    window: u16,
    /// Window id (12 bits) when the key's current life began.
    born: u16,
    flags: u8,
}

impl Entry {
    #[inline]
    fn matches(&self, key: &LimitKey) -> bool {
        self.token == key.token
            && self.table == key.table
            && (self.flags & WRITE != 0) == (key.op == OpType::Write)
    }
}

/// The per-shard, fixed-memory, per-partition rate limiter.
pub struct RateLimiter {
    entries: Box<[Entry]>,
    mask: usize,
    salt: u64,
    max_probes: usize,
    lossy_bucket: u32,
    cold_start: ColdStart,
    /// Current window (whole wall-clock seconds since the epoch).
    window: u64,
    /// Lossy decrement applied so far in the current window.
    bucket: u32,
    ops_in_bucket: u32,
    /// Lossy decrement of each finished window, indexed by `window % HISTORY`.
    history: [u32; HISTORY],
    sweep_cursor: usize,
    stats: LimiterStats,
}

impl RateLimiter {
    /// A limiter with a random salt (from the standard library's per-process random keys).
    pub fn new(config: RateLimiterConfig) -> RateLimiter {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        RateLimiter::with_salt(config, h.finish())
    }

    /// A limiter with a given salt (deterministic tests and simulations).
    pub fn with_salt(config: RateLimiterConfig, salt: u64) -> RateLimiter {
        let bits = config.table_bits.clamp(4, 24);
        let len = 1usize << bits;
        RateLimiter {
            entries: vec![Entry::default(); len].into_boxed_slice(),
            mask: len - 1,
            salt,
            max_probes: usize::from(config.max_probes).clamp(1, len),
            lossy_bucket: config.lossy_bucket.max(1),
            cold_start: config.cold_start,
            window: 0,
            bucket: 0,
            ops_in_bucket: 0,
            history: [0; HISTORY],
            sweep_cursor: 0,
            stats: LimiterStats::default(),
        }
    }

    /// Number of counter slots (fixed for the limiter's life).
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// Bytes owned by the limiter, table included; constant for its whole life.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + std::mem::size_of_val(&*self.entries)
    }

    /// Shard-wide counters.
    pub fn stats(&self) -> LimiterStats {
        self.stats
    }

    /// Number of slots holding a live (non-faded) counter. Scans the table: diagnostics only.
    pub fn live_entries(&self) -> usize {
        let cur = self.window16();
        self.entries
            .iter()
            .filter(|e| e.flags & USED != 0)
            .filter(|e| {
                let mut e = **e;
                refresh(&mut e, cur, self.window, &self.history);
                e.count > self.bucket
            })
            .count()
    }

    /// The full request-path entry point: no limit means accept without touching the table;
    /// otherwise account and decide, and count the decision in the table's stats.
    #[inline]
    pub fn check(
        &mut self,
        key: LimitKey,
        limit: Option<u32>,
        random: u32,
        wall: Nanos,
        table_stats: &TableLimitStats,
    ) -> Decision {
        match limit {
            None => Decision::Accept,
            Some(l) => {
                let d = self.account_and_decide(key, l, random, wall);
                table_stats.record(key.op, d);
                d
            }
        }
    }

    /// Counts one operation on `key` and decides whether to accept it, for a limit of
    /// `limit_per_sec` operations per second (0 rejects everything, as in ScyllaDB).
    /// `random` is drawn uniformly once per operation by the coordinator; `wall` is
    /// wall-clock time since the epoch (windows are aligned to wall-clock seconds).
    pub fn account_and_decide(
        &mut self,
        key: LimitKey,
        limit_per_sec: u32,
        random: u32,
        wall: Nanos,
    ) -> Decision {
        self.advance_to(wall.as_secs());
        let count = self.increase(&key, limit_per_sec, wall);
        let decision = match count {
            Counted::Young(_) if limit_per_sec == 0 => Decision::Reject,
            Counted::Young(d) => d,
            Counted::Mature(c) => decide(c, limit_per_sec, random),
        };
        match decision {
            Decision::Accept => self.stats.accepted += 1,
            Decision::Reject => self.stats.rejected += 1,
        }
        decision
    }

    /// The effective counter of `key` right now, without counting (tests and diagnostics).
    pub fn peek_count(&self, key: LimitKey, wall: Nanos) -> u32 {
        let w = wall.as_secs().max(self.window);
        let cur16 = (w as u16) & WINDOW_MASK;
        let h = hash_key(&key, self.salt);
        let mut idx = h as usize;
        for i in 0..self.max_probes {
            idx = (idx + i) & self.mask;
            let mut e = self.entries[idx];
            if e.flags & USED == 0 {
                return 0;
            }
            if e.matches(&key) {
                let (history, bucket) = if w == self.window {
                    (self.history, self.bucket)
                } else {
                    let mut h = self.history;
                    h[(self.window % HISTORY as u64) as usize] = self.bucket;
                    for x in self.window + 1..w.min(self.window + HISTORY as u64) {
                        h[(x % HISTORY as u64) as usize] = 0;
                    }
                    (h, 0)
                };
                refresh(&mut e, cur16, w, &history);
                return e.count.saturating_sub(bucket);
            }
        }
        0
    }

    fn window16(&self) -> u16 {
        (self.window as u16) & WINDOW_MASK
    }

    /// Moves to window `w` if it is later than the current one (a wall clock that steps back
    /// keeps the current window), recording the finished window's lossy decrement and
    /// sweeping enough entries to keep every window stamp within half the id space.
    #[inline]
    fn advance_to(&mut self, w: u64) {
        if w <= self.window {
            return;
        }
        if self.window == 0 {
            // First use: the table is empty, there is nothing to halve or sweep.
            self.window = w;
            return;
        }
        let gap = w - self.window;
        self.history[(self.window % HISTORY as u64) as usize] = self.bucket;
        for x in self.window + 1..w.min(self.window + HISTORY as u64) {
            self.history[(x % HISTORY as u64) as usize] = 0;
        }
        self.window = w;
        self.bucket = 0;
        self.ops_in_bucket = 0;
        self.sweep(gap);
    }

    #[cold]
    fn sweep(&mut self, gap: u64) {
        let len = self.entries.len();
        let per_window = len.div_ceil(SWEEP_PERIOD);
        let n = usize::try_from(gap)
            .unwrap_or(usize::MAX)
            .saturating_mul(per_window)
            .min(len);
        let cur16 = self.window16();
        let ramp = self.ramp_windows();
        for _ in 0..n {
            let e = &mut self.entries[self.sweep_cursor];
            if e.flags & USED != 0 {
                refresh(e, cur16, self.window, &self.history);
                mature_if_old(e, cur16, ramp);
            }
            self.sweep_cursor = (self.sweep_cursor + 1) & self.mask;
        }
    }

    fn ramp_windows(&self) -> u16 {
        match self.cold_start {
            ColdStart::Scylla => 0,
            ColdStart::Ramp { windows, .. } => u16::from(windows),
        }
    }

    /// Finds or allocates the key's slot, adds one, and returns what the decision needs.
    #[inline]
    fn increase(&mut self, key: &LimitKey, limit: u32, wall: Nanos) -> Counted {
        self.stats.lookups += 1;
        self.ops_in_bucket += 1;
        if self.ops_in_bucket >= self.lossy_bucket {
            self.ops_in_bucket = 0;
            self.bucket = self.bucket.saturating_add(1);
        }
        let cur16 = self.window16();
        let bucket = self.bucket;
        let h = hash_key(key, self.salt);
        let mut idx = h as usize;
        let mut free: Option<usize> = None;
        let mut min_slot = idx & self.mask;
        let mut min_count = u32::MAX;
        let mut found: Option<usize> = None;
        let mut virgin: Option<usize> = None;
        let mut probes = 0u64;
        for i in 0..self.max_probes {
            idx = (idx + i) & self.mask;
            probes += 1;
            let e = &mut self.entries[idx];
            if e.flags & USED == 0 {
                virgin = Some(idx);
                break;
            }
            refresh(e, cur16, self.window, &self.history);
            if e.matches(key) {
                found = Some(idx);
                break;
            }
            let eff = e.count.saturating_sub(bucket);
            if eff == 0 {
                if free.is_none() {
                    free = Some(idx);
                }
            } else if eff < min_count {
                min_count = eff;
                min_slot = idx;
            }
        }
        self.stats.probes += probes;
        let ramp = self.ramp_windows();
        let slot = match found {
            Some(s) => {
                let e = &mut self.entries[s];
                if e.count <= bucket {
                    // The key faded out: it starts a new life, young again.
                    e.count = bucket;
                    self.start_life(s, limit, wall);
                }
                s
            }
            None => {
                let (s, inherit) = match free.or(virgin) {
                    Some(s) => {
                        self.stats.allocations += 1;
                        (s, 0)
                    }
                    None => {
                        self.stats.evictions += 1;
                        (min_slot, min_count)
                    }
                };
                let e = &mut self.entries[s];
                e.token = key.token;
                e.table = key.table;
                e.flags = USED
                    | match key.op {
                        OpType::Read => 0,
                        OpType::Write => WRITE,
                    };
                e.window = cur16;
                e.count = bucket.saturating_add(inherit);
                self.start_life(s, limit, wall);
                s
            }
        };
        let fraction = self.burst_fraction();
        let e = &mut self.entries[slot];
        mature_if_old(e, cur16, ramp);
        e.count = e.count.saturating_add(1);
        let effective = e.count - bucket.min(e.count);
        if e.flags & MATURE != 0 {
            return Counted::Mature(effective);
        }
        Counted::Young(take_token(e, limit, fraction, wall))
    }

    fn burst_fraction(&self) -> f32 {
        match self.cold_start {
            ColdStart::Scylla => 0.0,
            ColdStart::Ramp { burst_fraction, .. } => burst_fraction,
        }
    }

    fn start_life(&mut self, slot: usize, limit: u32, wall: Nanos) {
        let cur16 = self.window16();
        let mature = matches!(self.cold_start, ColdStart::Scylla);
        let burst = burst_of(limit, self.burst_fraction());
        let e = &mut self.entries[slot];
        e.born = cur16;
        e.tokens = burst;
        e.last_us = wall_micros(wall);
        if mature {
            e.flags |= MATURE;
        } else {
            e.flags &= !MATURE;
        }
    }
}

enum Counted {
    Young(Decision),
    Mature(u32),
}

/// ScyllaDB's rule: accept while `count <= 2L`, then with probability `L / (count · ln 2)`.
#[inline]
pub fn decide(count: u32, limit: u32, random: u32) -> Decision {
    if u64::from(count) <= 2 * u64::from(limit) {
        return Decision::Accept;
    }
    // r/2^32 * c * ln2 < L  <=>  r * c * ln2 < L * 2^32
    let lhs = f64::from(random) * f64::from(count) * std::f64::consts::LN_2;
    let rhs = f64::from(limit) * 4_294_967_296.0;
    if lhs < rhs {
        Decision::Accept
    } else {
        Decision::Reject
    }
}

#[inline]
fn burst_of(limit: u32, fraction: f32) -> f32 {
    (limit as f32 * fraction).max(1.0)
}

#[inline]
fn wall_micros(wall: Nanos) -> u32 {
    // Wrapping: only differences over a few seconds are ever taken.
    (wall.0 / 1_000) as u32
}

#[inline]
fn take_token(e: &mut Entry, limit: u32, fraction: f32, wall: Nanos) -> Decision {
    let now_us = wall_micros(wall);
    // A wall clock stepping back refills nothing; i32 is ample for a young entry's life.
    let dt_us = (now_us.wrapping_sub(e.last_us) as i32).max(0);
    e.last_us = now_us;
    let burst = burst_of(limit, fraction);
    e.tokens = (e.tokens + dt_us as f32 * 1e-6 * limit as f32).min(burst);
    // Tolerance so that arrivals spaced exactly 1/L apart are never refused by rounding.
    if e.tokens >= 0.999 {
        e.tokens -= 1.0;
        Decision::Accept
    } else {
        Decision::Reject
    }
}

#[inline]
fn mature_if_old(e: &mut Entry, cur16: u16, ramp: u16) {
    if e.flags & MATURE == 0 && (cur16.wrapping_sub(e.born) & WINDOW_MASK) >= ramp {
        e.flags |= MATURE;
    }
}

/// Applies the halvings (and lossy decrements) of every window the entry missed.
#[inline]
fn refresh(e: &mut Entry, cur16: u16, cur: u64, history: &[u32; HISTORY]) {
    let delta = cur16.wrapping_sub(e.window) & WINDOW_MASK;
    if delta == 0 {
        return;
    }
    if usize::from(delta) >= HISTORY {
        e.count = 0;
    } else {
        let mut c = e.count;
        for k in (1..=u64::from(delta)).rev() {
            let w = cur.wrapping_sub(k);
            c = c.saturating_sub(history[(w % HISTORY as u64) as usize]) / 2;
        }
        e.count = c;
    }
    e.window = cur16;
}

/// Salted 64-bit hash of the key (murmur3's finaliser over the mixed fields).
#[inline]
fn hash_key(key: &LimitKey, salt: u64) -> u64 {
    let tag = (u64::from(key.table) << 1) | key.op as u64;
    let mut x = (key.token as u64 ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= tag.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) ^ salt.rotate_left(29);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const T0: u64 = 1_700_000_000; // an arbitrary wall-clock second

    fn key(token: i64) -> LimitKey {
        LimitKey {
            token,
            table: 7,
            op: OpType::Write,
        }
    }

    /// Drives `key` at a constant `rate` ops/s for `secs` seconds from wall second `start`;
    /// returns the accepted count of each second.
    fn drive(
        rl: &mut RateLimiter,
        k: LimitKey,
        limit: u32,
        rate: u64,
        start: u64,
        secs: u64,
        rng: &mut StdRng,
    ) -> Vec<u64> {
        let mut out = Vec::new();
        for s in 0..secs {
            let mut acc = 0;
            for i in 0..rate {
                let t = Nanos::from_secs(start + s).0 + i * 1_000_000_000 / rate;
                if rl.account_and_decide(k, limit, rng.random(), Nanos(t)) == Decision::Accept {
                    acc += 1;
                }
            }
            out.push(acc);
        }
        out
    }

    #[test]
    fn decide_follows_scylla_formula() {
        assert_eq!(
            decide(200, 100, u32::MAX),
            Decision::Accept,
            "c <= 2L always accepted"
        );
        assert_eq!(
            decide(201, 100, 0),
            Decision::Accept,
            "r = 0 always accepted"
        );
        assert_eq!(decide(201, 100, u32::MAX), Decision::Reject);
        assert_eq!(
            decide(1, 0, 0),
            Decision::Reject,
            "limit 0 rejects everything"
        );
        // The accepted fraction of r at count c is L/(c ln 2).
        for &c in &[300u32, 1_000, 10_000] {
            let n = 100_000u64;
            let acc = (0..n)
                .filter(|i| {
                    let r = (i * (u64::from(u32::MAX) / n)) as u32;
                    decide(c, 100, r) == Decision::Accept
                })
                .count() as f64;
            let want = 100.0 / (f64::from(c) * std::f64::consts::LN_2);
            assert!(
                (acc / n as f64 - want).abs() < 1e-3,
                "c={c}: {acc} vs {want}"
            );
        }
        assert_eq!(
            decide(u32::MAX, u32::MAX, u32::MAX),
            Decision::Accept,
            "no overflow"
        );
    }

    #[test]
    fn under_limit_constant_rate_never_rejected() {
        for cold in [ColdStart::Scylla, RateLimiterConfig::default().cold_start] {
            let cfg = RateLimiterConfig {
                cold_start: cold,
                ..RateLimiterConfig::default()
            };
            let mut rl = RateLimiter::with_salt(cfg, 1);
            let mut rng = StdRng::seed_from_u64(1);
            let cases = [(100u64, 100u32), (50, 100), (1, 1), (999, 1000)];
            for (i, (rate, limit)) in cases.into_iter().enumerate() {
                let start = T0 + 100 * i as u64;
                let got = drive(&mut rl, key(rate as i64), limit, rate, start, 12, &mut rng);
                assert!(
                    got.iter().all(|&a| a == rate),
                    "{cold:?} {rate}/{limit}: {got:?}"
                );
            }
            assert_eq!(rl.stats().rejected, 0);
        }
    }

    #[test]
    fn scylla_mode_reproduces_the_cold_start_burst() {
        let cfg = RateLimiterConfig {
            cold_start: ColdStart::Scylla,
            ..RateLimiterConfig::default()
        };
        let mut rl = RateLimiter::with_salt(cfg, 2);
        let mut rng = StdRng::seed_from_u64(2);
        let got = drive(&mut rl, key(1), 100, 1_000, T0, 4, &mut rng);
        // 2L + L·log2(V/2L) = 200 + 100·log2(5) ≈ 432 in the first second, then ≈ 158, 122.
        assert!((400..=470).contains(&got[0]), "{got:?}");
        assert!((130..=185).contains(&got[1]), "{got:?}");
    }

    #[test]
    fn ramp_smooths_the_cold_start_burst() {
        let mut rl = RateLimiter::with_salt(RateLimiterConfig::default(), 3);
        let mut rng = StdRng::seed_from_u64(3);
        let got = drive(&mut rl, key(1), 1_000, 10_000, T0, 10, &mut rng);
        // First second: burst (L) + L, where ScyllaDB admits 2L + L·log2(5) ≈ 4.3L;
        // afterwards within ±10%.
        assert!(got[0] <= 2_001, "{got:?}");
        assert_eq!(
            &got[1..4],
            &[1_000, 1_000, 1_000],
            "token bucket while young"
        );
        for (s, &a) in got.iter().enumerate().skip(4) {
            assert!((850..=1_150).contains(&a), "second {s}: {got:?}");
        }
    }

    #[test]
    fn faded_key_is_young_again() {
        let mut rl = RateLimiter::with_salt(RateLimiterConfig::default(), 4);
        let mut rng = StdRng::seed_from_u64(4);
        drive(&mut rl, key(9), 100, 1_000, T0, 8, &mut rng);
        // Silent for 40 s: the counter halves to zero, so the key restarts with the ramp.
        assert_eq!(rl.peek_count(key(9), Nanos::from_secs(T0 + 48)), 0);
        let got = drive(&mut rl, key(9), 100, 1_000, T0 + 48, 3, &mut rng);
        assert!(got[0] <= 201 && got[1] <= 110, "{got:?}");
    }

    #[test]
    fn counters_halve_each_window_and_wrap_modularly() {
        let cfg = RateLimiterConfig {
            cold_start: ColdStart::Scylla,
            ..RateLimiterConfig::default()
        };
        let mut rl = RateLimiter::with_salt(cfg, 5);
        // Land exactly on the last window id before the 12-bit wrap.
        let w = T0 | u64::from(WINDOW_MASK);
        assert_eq!((w as u16) & WINDOW_MASK, WINDOW_MASK);
        for _ in 0..64 {
            rl.account_and_decide(key(3), 1_000_000, 0, Nanos::from_secs(w));
        }
        assert_eq!(rl.peek_count(key(3), Nanos::from_secs(w)), 64);
        // Next window has id 0: ScyllaDB's unsigned delta reset this to 0; here it halves.
        rl.account_and_decide(key(3), 1_000_000, 0, Nanos::from_secs(w + 1));
        assert_eq!(rl.peek_count(key(3), Nanos::from_secs(w + 1)), 33);
        assert_eq!(rl.peek_count(key(3), Nanos::from_secs(w + 3)), 8);
        assert_eq!(rl.peek_count(key(3), Nanos::from_secs(w + 40)), 0);
    }

    #[test]
    fn idle_entries_survive_many_wraps_without_looking_fresh() {
        let cfg = RateLimiterConfig {
            table_bits: 8,
            cold_start: ColdStart::Scylla,
            ..RateLimiterConfig::default()
        };
        let mut rl = RateLimiter::with_salt(cfg, 6);
        for _ in 0..500 {
            rl.account_and_decide(key(11), 10, 0, Nanos::from_secs(T0));
        }
        // Exactly one id-space later, a stale stamp would read as "this window": the sweep
        // (driven by another key's traffic) must have refreshed it.
        for s in 1..=4096u64 {
            rl.account_and_decide(key(12), 10, 0, Nanos::from_secs(T0 + s));
        }
        assert_eq!(rl.peek_count(key(11), Nanos::from_secs(T0 + 4096)), 0);
        assert_eq!(
            rl.account_and_decide(key(11), 10, u32::MAX, Nanos::from_secs(T0 + 4096)),
            Decision::Accept
        );
    }

    #[test]
    fn full_probe_window_evicts_instead_of_failing_open() {
        // 16 slots, 16 probes: 16 steady keys fill the table, then a hot key arrives.
        let cfg = RateLimiterConfig {
            table_bits: 4,
            max_probes: 16,
            cold_start: ColdStart::Scylla,
            ..RateLimiterConfig::default()
        };
        let mut rl = RateLimiter::with_salt(cfg, 7);
        let mut rng = StdRng::seed_from_u64(7);
        let limit = 50;
        let mut hot_acc = Vec::new();
        for s in 0..20u64 {
            let mut acc = 0;
            for i in 0..1_000u64 {
                let t = Nanos(Nanos::from_secs(T0 + s).0 + i * 1_000_000);
                // Fillers: 16 keys at 20 ops/s each, all under the limit.
                if i % 50 == 0 {
                    for f in 0..16 {
                        rl.account_and_decide(key(1_000 + f), limit, rng.random(), t);
                    }
                }
                if s >= 2
                    && rl.account_and_decide(key(1), limit, rng.random(), t) == Decision::Accept
                {
                    acc += 1;
                }
            }
            if s >= 2 {
                hot_acc.push(acc);
            }
        }
        assert!(rl.stats().evictions > 0);
        let mean = hot_acc[4..].iter().sum::<u64>() as f64 / (hot_acc.len() - 4) as f64;
        assert!(
            mean < 1.2 * f64::from(limit),
            "hot key fails open: {hot_acc:?}"
        );
    }

    #[test]
    fn one_off_keys_fade_through_lossy_counting() {
        let cfg = RateLimiterConfig {
            table_bits: 10,
            lossy_bucket: 100,
            ..RateLimiterConfig::default()
        };
        let mut rl = RateLimiter::with_salt(cfg, 8);
        let t = Nanos::from_secs(T0);
        for k in 0..50_000 {
            assert_eq!(
                rl.account_and_decide(key(k), 10, u32::MAX, t),
                Decision::Accept
            );
        }
        // All in one window: without lossy counting the table would fill and evict live
        // entries; with it, at most ~one bucket's worth of one-off keys stays live.
        assert!(rl.live_entries() <= 100, "{}", rl.live_entries());
        assert!(rl.stats().evictions < 500, "{:?}", rl.stats());
    }

    #[test]
    fn no_limit_skips_the_table() {
        let mut rl = RateLimiter::with_salt(RateLimiterConfig::default(), 9);
        let stats = TableLimitStats::default();
        let t = Nanos::from_secs(T0);
        for _ in 0..10 {
            assert_eq!(rl.check(key(1), None, 0, t, &stats), Decision::Accept);
        }
        assert_eq!(rl.stats(), LimiterStats::default());
        assert_eq!(stats.snapshot(), TableLimitSnapshot::default());
        assert_eq!(rl.check(key(1), Some(0), 0, t, &stats), Decision::Reject);
        let r = LimitKey {
            op: OpType::Read,
            ..key(1)
        };
        assert_eq!(rl.check(r, Some(5), 0, t, &stats), Decision::Accept);
        assert_eq!(
            stats.snapshot(),
            TableLimitSnapshot {
                read_accepted: 1,
                write_rejected: 1,
                ..TableLimitSnapshot::default()
            }
        );
    }

    #[test]
    fn reads_and_writes_and_tables_are_counted_apart() {
        let mut rl = RateLimiter::with_salt(RateLimiterConfig::default(), 10);
        let t = Nanos::from_secs(T0);
        let w = key(5);
        let r = LimitKey {
            op: OpType::Read,
            ..w
        };
        let other = LimitKey { table: 8, ..w };
        for _ in 0..10 {
            rl.account_and_decide(w, 100, 0, t);
        }
        rl.account_and_decide(r, 100, 0, t);
        assert_eq!(rl.peek_count(w, t), 10);
        assert_eq!(rl.peek_count(r, t), 1);
        assert_eq!(rl.peek_count(other, t), 0);
    }

    #[test]
    fn entries_are_32_bytes() {
        assert_eq!(std::mem::size_of::<Entry>(), 32);
        let rl = RateLimiter::with_salt(RateLimiterConfig::default(), 0);
        assert_eq!(rl.capacity(), 65_536);
        assert!(rl.memory_bytes() >= 2 << 20 && rl.memory_bytes() < (2 << 20) + 4096);
    }
}
