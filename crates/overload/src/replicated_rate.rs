//! The per-partition limits of a replicated table, decided once per operation.
//!
//! One counter type serves writes and reads. Writes: every replica of a partition receives every admitted write, whoever coordinated it. So a
//! node counts the admitted writes it applies per (table, token) in one-second wall-clock
//! windows, and a coordinator that is a replica decides from that count, which already holds
//! the other coordinators' admitted writes. Replicas only count; they never reject on rate.
//! The window is the coordinator's (carried in the MUTATION), clamped to the receiver's own
//! window ±1, so every replica counts a write in the same window whatever its clock.
//!
//! The decision is deterministic: accept iff the sliding-window estimate
//! `current + previous · (1 − elapsed fraction)` is below the limit. Offered far above the
//! limit, a key then gets the limit per second, spread evenly over the window. Counting only
//! admitted writes (not attempts, as [`crate::rate_limit`] does) is what lets counts from
//! several coordinators add up: a rejected attempt is never replicated.
//!
//! Reads reach only some replicas, so each node sends the other replicas of a key the reads
//! it admitted (an exchange every few tens of milliseconds, `sluice_engine`'s
//! `read_counts`), and the receiver counts them with [`ReplicatedCounts::count_many`] in the
//! sender's window: the estimate is then this node's admissions plus its peers'.
//!
//! The table is fixed-size (two candidate slots per key, striped locks held for a few
//! instructions); when both candidates hold other live keys the smaller is evicted and its
//! counts inherited, so a key's count is never under-estimated.

use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;

/// Slots per stripe; a key's two candidates are in one stripe.
const STRIPE_SLOTS: usize = 256;
/// Number of stripes (each behind its own lock).
const STRIPES: usize = 64;

/// One counted key.
#[derive(Copy, Clone, Debug, Default)]
struct Slot {
    /// 0: never used.
    key: u64,
    token: i64,
    table: u32,
    /// The window `current` counts.
    window: u32,
    current: u32,
    previous: u32,
    /// The window in which another node's counts last arrived through [`ReplicatedCounts::count_many`].
    shared: u32,
}

impl Slot {
    /// The sliding-window estimate of admitted writes at `now` (window id, fraction elapsed in
    /// thousandths), in thousandths of a write.
    fn estimate_milli(&self, window: u32, elapsed_milli: u32) -> u64 {
        let remain = u64::from(1000 - elapsed_milli.min(1000));
        if self.window == window {
            u64::from(self.current) * 1000 + u64::from(self.previous) * remain
        } else if self.window.wrapping_add(1) == window {
            u64::from(self.current) * remain
        } else if self.window == window.wrapping_add(1) {
            // Counted in a window a fast coordinator's clock has already started.
            (u64::from(self.current) + u64::from(self.previous)) * 1000
        } else {
            0
        }
    }

    /// Moves the slot forward to `window` (no-op if it is there or ahead).
    fn roll(&mut self, window: u32) {
        if window == self.window || window.wrapping_sub(self.window) > u32::MAX / 2 {
            return;
        }
        self.previous = if window == self.window.wrapping_add(1) {
            self.current
        } else {
            0
        };
        self.current = 0;
        self.window = window;
    }

    /// Adds `n` admitted operations counted in `window` (ignored when more than one window
    /// stale).
    fn add(&mut self, window: u32, n: u32) {
        self.roll(window);
        if window == self.window {
            self.current = self.current.saturating_add(n);
        } else if window.wrapping_add(1) == self.window {
            self.previous = self.previous.saturating_add(n);
        }
    }

    fn live(&self, window: u32) -> bool {
        self.key != 0 && self.estimate_milli(window, 0) > 0
    }
}

/// Counts of admitted operations (writes, or reads) per (table, token), in wall-clock
/// one-second windows.
pub struct ReplicatedCounts {
    stripes: Box<[Mutex<Box<[Slot; STRIPE_SLOTS]>>]>,
    seed: (u64, u64),
}

impl std::fmt::Debug for ReplicatedCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicatedCounts").finish_non_exhaustive()
    }
}

impl Default for ReplicatedCounts {
    fn default() -> Self {
        Self::new()
    }
}

/// The window id of a wall-clock instant in milliseconds since the epoch, and the
/// thousandths of it elapsed.
#[inline]
pub fn window_of(unix_millis: u64) -> (u32, u32) {
    ((unix_millis / 1000) as u32, (unix_millis % 1000) as u32)
}

/// Where a write counted in the coordinator's window `theirs` lands here: in that window if
/// it is within one of `ours`, else nowhere (a replayed hint, or a clock far off).
#[inline]
pub fn clamp_window(theirs: u32, ours: u32) -> Option<u32> {
    let d = theirs.wrapping_sub(ours) as i32;
    (-1..=1).contains(&d).then_some(theirs)
}

impl ReplicatedCounts {
    /// An empty table of `STRIPES × STRIPE_SLOTS` (16,384) keys, 640 KiB.
    pub fn new() -> ReplicatedCounts {
        let stripes = (0..STRIPES)
            .map(|_| Mutex::new(Box::new([Slot::default(); STRIPE_SLOTS])))
            .collect();
        let s = std::collections::hash_map::RandomState::new();
        let mut h = s.build_hasher();
        h.write_u8(1);
        let a = h.finish();
        h.write_u8(2);
        ReplicatedCounts {
            stripes,
            seed: (a, h.finish() | 1),
        }
    }

    fn hash(&self, table: u32, token: i64) -> u64 {
        let x = (token as u64 ^ self.seed.0).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ u64::from(table).wrapping_mul(self.seed.1);
        let x = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        (x ^ (x >> 32)) | 1
    }

    /// Runs `f` on the key's slot (found, free, or evicted with its counts inherited).
    fn with_slot<T>(
        &self,
        table: u32,
        token: i64,
        window: u32,
        f: impl FnOnce(&mut Slot) -> T,
    ) -> T {
        let h = self.hash(table, token);
        let stripe = &self.stripes[(h as usize >> 1) % STRIPES];
        let mut slots = stripe.lock().unwrap_or_else(|p| p.into_inner());
        let a = ((h >> 16) as usize) % STRIPE_SLOTS;
        // Two distinct candidates: a key whose two were the same slot would evict whatever
        // holds it, a hot key included, however small its own count.
        let b = match ((h >> 40) as usize) % STRIPE_SLOTS {
            b if b == a => (a + 1) % STRIPE_SLOTS,
            b => b,
        };
        let found = [a, b]
            .into_iter()
            .find(|&i| slots[i].key == h && slots[i].token == token && slots[i].table == table);
        let i = match found {
            Some(i) => i,
            None => {
                let i = if !slots[a].live(window) {
                    a
                } else if !slots[b].live(window) {
                    b
                } else if slots[a].estimate_milli(window, 0) <= slots[b].estimate_milli(window, 0) {
                    a
                } else {
                    b
                };
                let s = &mut slots[i];
                if !s.live(window) {
                    *s = Slot::default();
                }
                // Space-saving: an evicted live key's counts stay with the newcomer.
                s.key = h;
                s.token = token;
                s.table = table;
                i
            }
        };
        debug_assert_eq!(slots[i].key, h, "the slot holds the key after lookup");
        f(&mut slots[i])
    }

    /// Counts one admitted write that a coordinator counted in its window `theirs`; `now` is
    /// this node's wall clock in milliseconds. Returns whether it was counted.
    pub fn count(&self, table: u32, token: i64, theirs: u32, now_millis: u64) -> bool {
        self.count_many(table, token, theirs, 1, now_millis)
    }

    /// Counts `n` operations another node admitted in its window `theirs` (a peer's read
    /// counts); the same window rule as [`Self::count`]. Returns whether they were counted.
    pub fn count_many(&self, table: u32, token: i64, theirs: u32, n: u32, now_millis: u64) -> bool {
        let (ours, _) = window_of(now_millis);
        let Some(w) = clamp_window(theirs, ours) else {
            return false;
        };
        if n == 0 {
            return true;
        }
        self.with_slot(table, token, ours, |s| {
            s.add(w, n);
            s.shared = ours;
        });
        true
    }

    /// Decides one write at `now` against `limit` writes per second; an accepted write is
    /// counted at once (in the window returned), so that this node's own admissions in
    /// flight are seen by its next decision. `None`: rejected, nothing counted.
    pub fn decide(&self, table: u32, token: i64, limit: u32, now_millis: u64) -> Option<u32> {
        self.decide_shared(table, token, limit, 0, now_millis)
    }

    /// [`Self::decide`] for a key whose counts other nodes also send (reads): while their
    /// counts arrived in this window or the last, the estimate must stay `margin_milli`
    /// thousandths of an operation below the limit. Every coordinator crosses below the limit at about the same moment and admits
    /// before hearing of the others' admissions, so without the margin each window ends about
    /// (coordinators − 1) over the limit.
    pub fn decide_shared(
        &self,
        table: u32,
        token: i64,
        limit: u32,
        margin_milli: u32,
        now_millis: u64,
    ) -> Option<u32> {
        let (window, elapsed) = window_of(now_millis);
        self.with_slot(table, token, window, |s| {
            let shared_lately = s.shared == window || s.shared.wrapping_add(1) == window;
            let threshold = if shared_lately {
                (u64::from(limit) * 1000).saturating_sub(u64::from(margin_milli))
            } else {
                u64::from(limit) * 1000
            };
            if s.estimate_milli(window, elapsed) < threshold {
                s.add(window, 1);
                Some(window)
            } else {
                None
            }
        })
    }

    /// The estimate of admitted writes for a key at `now`, in writes (tests, metrics).
    pub fn estimate(&self, table: u32, token: i64, now_millis: u64) -> f64 {
        let (window, elapsed) = window_of(now_millis);
        self.with_slot(table, token, window, |s| s.estimate_milli(window, elapsed)) as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_800_000_000_000;

    #[test]
    fn a_lone_coordinator_accepts_the_limit_per_second() {
        let c = ReplicatedCounts::new();
        // 1000 attempts per second for 10 s against a limit of 50.
        let mut per_second = [0u32; 10];
        for ms in 0..10_000u64 {
            if c.decide(7, 42, 50, T0 + ms).is_some() {
                per_second[(ms / 1000) as usize] += 1;
            }
        }
        for (s, n) in per_second.iter().enumerate().skip(1) {
            assert!((48..=52).contains(n), "second {s}: {n}");
        }
        assert_eq!(per_second[0], 50);
    }

    #[test]
    fn three_coordinators_share_one_limit_through_replicated_counts() {
        // Three replicas; each coordinates a third of the attempts, decides from its own
        // table, and its admitted writes reach the other two (counted in its window).
        let nodes = [
            ReplicatedCounts::new(),
            ReplicatedCounts::new(),
            ReplicatedCounts::new(),
        ];
        let mut accepted = [0u32; 10];
        for ms in 0..10_000u64 {
            let coord = (ms % 3) as usize;
            if let Some(w) = nodes[coord].decide(1, 9, 50, T0 + ms) {
                accepted[(ms / 1000) as usize] += 1;
                for (i, n) in nodes.iter().enumerate() {
                    if i != coord {
                        assert!(n.count(1, 9, w, T0 + ms));
                    }
                }
            }
        }
        for (s, n) in accepted.iter().enumerate().skip(1) {
            assert!((48..=52).contains(n), "second {s}: {n}");
        }
        // Every replica holds the same estimate: they agree.
        let e: Vec<f64> = nodes
            .iter()
            .map(|n| n.estimate(1, 9, T0 + 10_000))
            .collect();
        assert!(e.iter().all(|x| (x - e[0]).abs() < 1e-9), "{e:?}");
    }

    /// Reads spread evenly over three coordinators for 10 s at 1,000 a second against a
    /// limit of 50; with `exchange`, every 25 ms each node's admissions since the last round
    /// are counted by the two others in its window. Returns the reads accepted per second.
    fn three_coordinators_reading(exchange: bool) -> [u32; 10] {
        let nodes = [
            ReplicatedCounts::new(),
            ReplicatedCounts::new(),
            ReplicatedCounts::new(),
        ];
        let mut pending: [Vec<u32>; 3] = Default::default();
        let mut accepted = [0u32; 10];
        for ms in 0..10_000u64 {
            if exchange && ms % 25 == 0 {
                for (from, waiting) in pending.iter_mut().enumerate() {
                    for w in std::mem::take(waiting) {
                        for (to, n) in nodes.iter().enumerate() {
                            if to != from {
                                n.count_many(1, 9, w, 1, T0 + ms);
                            }
                        }
                    }
                }
            }
            let coord = (ms % 3) as usize;
            if let Some(w) = nodes[coord].decide(1, 9, 50, T0 + ms) {
                accepted[(ms / 1000) as usize] += 1;
                pending[coord].push(w);
            }
        }
        accepted
    }

    #[test]
    fn exchanged_read_counts_share_one_limit_across_coordinators() {
        let with = three_coordinators_reading(true);
        for (s, n) in with.iter().enumerate().skip(1) {
            assert!((45..=55).contains(n), "second {s} with the exchange: {n}");
        }
        // Each coordinator alone admits the limit: three times it in all.
        let without = three_coordinators_reading(false);
        for (s, n) in without.iter().enumerate().skip(1) {
            assert!(
                (140..=160).contains(n),
                "second {s} without the exchange: {n}"
            );
        }
    }

    #[test]
    fn count_many_adds_in_the_senders_window_and_ignores_stale_ones() {
        let c = ReplicatedCounts::new();
        let (w, _) = window_of(T0);
        assert!(c.count_many(2, 5, w, 30, T0));
        assert!(c.count_many(2, 5, w, 0, T0));
        assert_eq!(c.estimate(2, 5, T0), 30.0);
        assert!(!c.count_many(2, 5, w - 2, 30, T0));
        assert_eq!(c.estimate(2, 5, T0), 30.0);
        assert!(c.decide(2, 5, 31, T0).is_some());
        assert!(c.decide(2, 5, 31, T0).is_none());
    }

    #[test]
    fn the_margin_holds_only_while_other_nodes_send_counts() {
        let c = ReplicatedCounts::new();
        let (w, _) = window_of(T0);
        // Alone: the whole limit of 10, margin or not.
        for _ in 0..10 {
            assert!(c.decide_shared(4, 1, 10, 1500, T0).is_some());
        }
        assert!(c.decide_shared(4, 1, 10, 1500, T0).is_none());
        // Another node's counts arrived: 1.5 below the limit now (5, 6, 7 and 8 pass).
        assert!(c.count_many(4, 2, w, 5, T0));
        for _ in 0..4 {
            assert!(c.decide_shared(4, 2, 10, 1500, T0).is_some());
        }
        assert!(c.decide_shared(4, 2, 10, 1500, T0).is_none());
        assert!(c.decide_shared(4, 2, 10, 0, T0).is_some());
        // Two windows later the margin is gone with the counts.
        let later = T0 + 2000;
        for _ in 0..10 {
            assert!(c.decide_shared(4, 2, 10, 1500, later).is_some());
        }
    }

    #[test]
    fn windows_are_the_coordinators_within_one_of_ours() {
        assert_eq!(clamp_window(100, 100), Some(100));
        assert_eq!(clamp_window(99, 100), Some(99));
        assert_eq!(clamp_window(101, 100), Some(101));
        assert_eq!(clamp_window(98, 100), None);
        assert_eq!(clamp_window(0, 100), None);
        let c = ReplicatedCounts::new();
        // A replayed hint from long ago is not counted.
        assert!(!c.count(1, 1, 5, T0));
        assert_eq!(c.estimate(1, 1, T0), 0.0);
        // A write from a coordinator 400 ms ahead (its window already started) is counted
        // in its window, and seen in ours.
        let (w, _) = window_of(T0 + 900);
        assert!(c.count(1, 1, w + 1, T0 + 900));
        assert!(c.estimate(1, 1, T0 + 950) >= 1.0);
        assert!(c.estimate(1, 1, T0 + 1100) >= 0.8);
    }

    #[test]
    fn counts_fade_after_two_windows_and_keys_stay_apart() {
        let c = ReplicatedCounts::new();
        for ms in 0..100 {
            assert!(c.decide(1, 1, 1000, T0 + ms).is_some());
        }
        assert_eq!(c.estimate(1, 1, T0 + 100), 100.0);
        assert_eq!(c.estimate(1, 2, T0 + 100), 0.0);
        assert_eq!(c.estimate(2, 1, T0 + 100), 0.0);
        assert!((c.estimate(1, 1, T0 + 1500) - 50.0).abs() < 1.0);
        assert_eq!(c.estimate(1, 1, T0 + 2000), 0.0);
    }

    #[test]
    fn a_flood_of_cold_keys_does_not_hide_a_hot_one() {
        let c = ReplicatedCounts::new();
        for ms in 0..200 {
            c.decide(3, 77, 100, T0 + ms);
        }
        for k in 0..100_000i64 {
            c.count(3, k * 7919 + 1_000_000, window_of(T0 + 300).0, T0 + 300);
        }
        // The hot key's count is never under-estimated (it keeps or inherits a slot).
        assert!(c.estimate(3, 77, T0 + 400) >= 100.0);
        assert!(c.decide(3, 77, 100, T0 + 400).is_none());
    }
}
