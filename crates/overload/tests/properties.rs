//! Property tests of the limiter and the admission controller invariants.

use proptest::prelude::*;
use sluice_overload::admission::{AdmissionConfig, AdmissionController, ConcurrencyLimitConfig};
use sluice_overload::{
    Acceptance, ColdStart, Deadline, Decision, LimitKey, Nanos, OpType, RateLimiter,
    RateLimiterConfig, Verdict,
};
use std::time::Duration;

const T0: u64 = 1_700_000_000;

#[derive(Clone, Debug)]
struct Op {
    token: i64,
    table: u32,
    write: bool,
    limit: u32,
    random: u32,
    /// Signed time step in microseconds (negative: the wall clock stepped back).
    step_us: i64,
}

fn op() -> impl Strategy<Value = Op> {
    (
        0i64..40,
        0u32..3,
        any::<bool>(),
        prop_oneof![Just(0u32), 1u32..5, 5u32..1_000, Just(u32::MAX)],
        any::<u32>(),
        prop_oneof![0i64..2_000, -3_000_000i64..0, 0i64..5_000_000_000],
    )
        .prop_map(|(token, table, write, limit, random, step_us)| Op {
            token,
            table,
            write,
            limit,
            random,
            step_us,
        })
}

fn cold_start() -> impl Strategy<Value = ColdStart> {
    prop_oneof![
        Just(ColdStart::Scylla),
        (0u8..6, 0.0f32..2.0).prop_map(|(windows, burst_fraction)| ColdStart::Ramp {
            windows,
            burst_fraction
        }),
    ]
}

fn apply(t: &mut u64, step_us: i64) -> Nanos {
    let ns = step_us.saturating_mul(1_000);
    *t = if ns >= 0 {
        t.saturating_add(ns as u64)
    } else {
        t.saturating_sub(ns.unsigned_abs())
    };
    Nanos(*t)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any sequence of operations, limits and clock jumps (also backwards) on a tiny table:
    /// no panic, memory never changes, limit 0 always rejects, stats add up.
    #[test]
    fn limiter_never_panics_and_memory_is_fixed(
        ops in prop::collection::vec(op(), 1..400),
        bits in 4u8..8,
        probes in 1u16..40,
        lossy in 1u32..50,
        cold in cold_start(),
        carried in any::<bool>(),
    ) {
        let acceptance = if carried { Acceptance::Carried } else { Acceptance::Independent };
        let cfg = RateLimiterConfig { table_bits: bits, max_probes: probes, lossy_bucket: lossy, cold_start: cold, acceptance };
        let mut rl = RateLimiter::with_salt(cfg, 99);
        let mem = rl.memory_bytes();
        let mut t = Nanos::from_secs(T0).0;
        for o in &ops {
            let now = apply(&mut t, o.step_us);
            let k = LimitKey { token: o.token, table: o.table, op: if o.write { OpType::Write } else { OpType::Read } };
            let d = rl.account_and_decide(k, o.limit, o.random, now);
            if o.limit == 0 {
                prop_assert_eq!(d, Decision::Reject);
            }
        }
        prop_assert_eq!(rl.memory_bytes(), mem);
        prop_assert!(rl.live_entries() <= rl.capacity());
        let s = rl.stats();
        prop_assert_eq!(s.accepted + s.rejected, ops.len() as u64);
        prop_assert_eq!(s.lookups, ops.len() as u64);
    }

    /// A key whose operations are spaced at least 1/L apart is never rejected, whatever the
    /// cold-start mode, the spacing jitter and the other keys' traffic.
    #[test]
    fn under_limit_key_is_never_rejected(
        limit in 1u32..2_000,
        extra_gaps in prop::collection::vec(0u64..3_000_000_000, 1..300),
        noise in prop::collection::vec((0i64..500, any::<u32>(), 1u32..50), 0..300),
        cold in cold_start().prop_filter("a bucket of at least L", |c| match c {
            ColdStart::Scylla => true,
            ColdStart::Ramp { burst_fraction, .. } => *burst_fraction >= 1.0,
        }),
    ) {
        let cfg = RateLimiterConfig { cold_start: cold, ..RateLimiterConfig::default() };
        let mut rl = RateLimiter::with_salt(cfg, 5);
        let hot = LimitKey { token: -1, table: 9, op: OpType::Read };
        let min_gap = 1_000_000_000u64.div_ceil(u64::from(limit));
        let mut t = Nanos::from_secs(T0).0;
        for (i, extra) in extra_gaps.iter().enumerate() {
            t += min_gap + extra % (min_gap * 4 + 1);
            if let Some(&(tok, r, l)) = noise.get(i) {
                let k = LimitKey { token: tok, table: 9, op: OpType::Read };
                rl.account_and_decide(k, l, r, Nanos(t));
            }
            prop_assert_eq!(rl.account_and_decide(hot, limit, u32::MAX, Nanos(t)), Decision::Accept);
        }
    }

    /// Within one window a key's count grows by one per operation on it (no evictions in a
    /// large table, no lossy decrement before the bucket fills), and it never grows without
    /// operations on it across windows.
    #[test]
    fn counts_monotone_within_a_window(
        seq in prop::collection::vec((0i64..20, 0u64..999_000), 1..200),
        later in 1u64..40,
    ) {
        let mut rl = RateLimiter::with_salt(RateLimiterConfig::default(), 3);
        let mut counts = [0u32; 20];
        for &(tok, off_us) in &seq {
            let now = Nanos(Nanos::from_secs(T0).0 + off_us * 1_000);
            let k = LimitKey { token: tok, table: 1, op: OpType::Write };
            rl.account_and_decide(k, 10, 0, now);
            counts[tok as usize] += 1;
            prop_assert_eq!(rl.peek_count(k, now), counts[tok as usize]);
        }
        let t2 = Nanos::from_secs(T0 + later);
        for (tok, &c) in counts.iter().enumerate() {
            let k = LimitKey { token: tok as i64, table: 1, op: OpType::Write };
            prop_assert!(rl.peek_count(k, t2) <= c);
            prop_assert_eq!(rl.peek_count(k, t2), c >> later.min(31));
        }
    }

    /// Admission invariants over random arrivals, dispatches and completions: requests are
    /// conserved, the queue is bounded, nothing expired is dispatched, the concurrency limit
    /// stays within its bounds and in-execution never exceeds it at dispatch.
    #[test]
    fn admission_invariants(
        events in prop::collection::vec((0u8..3, 0u64..3_000, 0u64..40_000, 1u64..20_000), 1..600),
        cap in 1usize..64,
        lifo in any::<bool>(),
    ) {
        let ccfg = ConcurrencyLimitConfig { min: 2, max: 16, initial: 4, ..ConcurrencyLimitConfig::default() };
        let mut a = AdmissionController::<u64>::new(AdmissionConfig {
            queue_capacity: cap, adaptive_lifo: lifo, concurrency: ccfg, ..AdmissionConfig::default()
        });
        let mut now = 0u64;
        let mut running: Vec<u64> = Vec::new();
        let (mut shed_full, mut rejected) = (0u64, 0u64);
        let mut id = 0u64;
        for &(kind, step_us, ttl_us, lat_us) in &events {
            now += step_us * 1_000;
            let t = Nanos(now);
            match kind {
                0 => {
                    id += 1;
                    if a.enqueue(id, t, Deadline(Nanos(now + ttl_us * 1_000))).is_err() {
                        shed_full += 1;
                    }
                }
                1 => {
                    let limit = a.concurrency_limit();
                    let before = a.inflight();
                    if let Some(q) = a.dispatch(t, |_, v| { assert_ne!(v, Verdict::Serve); rejected += 1; }) {
                        prop_assert!(!q.deadline.expired(t));
                        prop_assert!(before < limit);
                        running.push(q.item);
                    }
                }
                _ => {
                    if running.pop().is_some() {
                        a.on_complete(Duration::from_micros(lat_us), t);
                    }
                }
            }
            let s = a.stats();
            prop_assert!(a.queued() <= cap);
            prop_assert_eq!(s.enqueued, s.dispatched + s.shed_delay + s.expired + a.queued() as u64);
            prop_assert_eq!(s.shed_full, shed_full);
            prop_assert_eq!(s.shed_delay + s.expired, rejected);
            prop_assert_eq!(a.inflight() as usize, running.len());
            prop_assert!((ccfg.min..=ccfg.max).contains(&a.concurrency_limit()));
        }
    }
}
