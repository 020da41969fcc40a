//! Micro-benchmarks of the overload decisions on the request path.
//!
//! `cargo bench -p sluice-overload --bench limiter`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use sluice_overload::admission::{AdmissionConfig, AdmissionController, Codel, CodelConfig};
use sluice_overload::{
    Deadline, LimitKey, Nanos, OpType, RateLimiter, RateLimiterConfig, TableLimitStats,
};
use std::hint::black_box;
use std::time::Duration;

const T0: u64 = 1_700_000_000_000_000_000;

/// A cheap deterministic stream of u32s standing in for the coordinator's random draw.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn key(token: i64) -> LimitKey {
    LimitKey {
        token,
        table: 3,
        op: OpType::Write,
    }
}

fn limiter(c: &mut Criterion) {
    let mut g = c.benchmark_group("limiter");
    let stats = TableLimitStats::default();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);

    // Uniform traffic over `n` distinct partitions at one million operations per second on
    // the shard, limit 100: n = 1 is one hot partition far above its limit (every call takes
    // the probabilistic branch), 1,000 keys are each at 10x the limit and stay in cache,
    // 50,000 keys fill 76% of the default 65,536 slots, 1,000,000 keys overflow the table
    // (each operation finds a faded slot or evicts one).
    for n in [1u64, 1_000, 50_000, 1_000_000] {
        let mut rl = RateLimiter::with_salt(RateLimiterConfig::default(), n);
        let mut t = T0;
        g.bench_with_input(BenchmarkId::new("account_and_decide", n), &n, |b, &n| {
            b.iter(|| {
                t += 1_000; // 1 µs per operation: a new window every million calls
                let r = rng.next();
                // Multiply-shift instead of `%`: the division would dominate the measurement.
                let k = key((((r & 0xFFFF_FFFF) * n) >> 32) as i64);
                rl.account_and_decide(black_box(k), 100, (r >> 32) as u32, Nanos(t))
            })
        });
    }

    // The request-path wrapper with per-table stats, for a limited table.
    let mut rl = RateLimiter::with_salt(RateLimiterConfig::default(), 3);
    let mut t = T0;
    g.bench_function("check/limited", |b| {
        b.iter(|| {
            t += 1_000;
            rl.check(
                black_box(key(7)),
                black_box(Some(100)),
                rng.next() as u32,
                Nanos(t),
                &stats,
            )
        })
    });

    // A table without a limit: must not touch the counter table at all.
    g.bench_function("check/no_limit", |b| {
        b.iter(|| {
            rl.check(
                black_box(key(7)),
                black_box(None),
                rng.next() as u32,
                Nanos(T0),
                &stats,
            )
        })
    });
    g.finish();
}

fn admission(c: &mut Criterion) {
    let mut g = c.benchmark_group("admission");

    let mut codel = Codel::new(CodelConfig::default());
    let mut t = 0u64;
    g.bench_function("codel/should_shed", |b| {
        b.iter(|| {
            t += 1_000;
            codel.on_dequeue(Duration::from_micros(300), Nanos(t));
            codel.should_shed(Nanos(t), black_box(Duration::from_micros(300)))
        })
    });

    // A full enqueue -> dispatch -> complete cycle of one request.
    let mut ctl = AdmissionController::<u32>::new(AdmissionConfig::default());
    let mut t = 0u64;
    g.bench_function("controller/enqueue_dispatch_complete", |b| {
        b.iter(|| {
            t += 1_000;
            let now = Nanos(t);
            let _ = ctl.enqueue(black_box(1), now, Deadline(Nanos(t + 10_000_000)));
            if let Some(q) = ctl.dispatch(now, |_, _| {}) {
                black_box(q.item);
                ctl.on_complete(Duration::from_micros(100), now);
            }
        })
    });

    // The rejection decision when the queue is full: header only, no allocation.
    let mut full = AdmissionController::<u32>::new(AdmissionConfig {
        queue_capacity: 1,
        ..AdmissionConfig::default()
    });
    let _ = full.enqueue(0, Nanos(0), Deadline::NEVER);
    g.bench_function("controller/reject_full", |b| {
        b.iter(|| {
            full.enqueue(black_box(1), Nanos(1), Deadline::NEVER)
                .is_err()
        })
    });

    g.finish();
}

criterion_group!(benches, limiter, admission);
criterion_main!(benches);
