//! Runs one overload decision N times, for instruction counting under callgrind (the counts
//! are repeatable on noisy machines, unlike wall-clock benchmarks):
//!
//! ```text
//! cargo build --release -p sluice-overload --example insns
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/insns hot 200000   # minus the same run with 100000
//! ```
//!
//! Modes: `hot` (one partition far over its limit), `wide` (50,000 partitions), `keys=<n>`
//! (uniform over `n` partitions, as the criterion bench `account_and_decide/<n>`), `nolimit`
//! (a table without a limit), `reject_full` (admission queue full), `cycle` (enqueue,
//! dispatch, complete). Optional third argument: simulated nanoseconds per operation (the
//! criterion bench uses 1000).
//!
//! Cache misses per decision, with the simulated last level set to this machine's per-core
//! L2 (512 KiB; the 32 MiB L3 would hold any table):
//!
//! ```text
//! valgrind --tool=cachegrind --cache-sim=yes --LL=524288,8,64 --cachegrind-out-file=/dev/null \
//!     target/release/examples/insns keys=50000 2000000 1000   # minus the run with 1000000
//! ```

use sluice_overload::admission::{AdmissionConfig, AdmissionController};
use sluice_overload::{
    Deadline, LimitKey, Nanos, OpType, RateLimiter, RateLimiterConfig, TableLimitStats,
};
use std::hint::black_box;
use std::time::Duration;

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "hot".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    // Simulated time per operation (default 100 µs: 10,000 ops/s on the shard).
    let step: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let mut rl = RateLimiter::with_salt(RateLimiterConfig::default(), 1);
    let stats = TableLimitStats::default();
    let mut ctl = AdmissionController::<u64>::new(AdmissionConfig {
        queue_capacity: 1,
        ..AdmissionConfig::default()
    });
    let _ = ctl.enqueue(0, Nanos(0), Deadline::NEVER);
    let mut cycle = AdmissionController::<u64>::new(AdmissionConfig::default());
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut t = 1_700_000_000_000_000_000u64;
    let mut acc = 0u64;
    let keys: Option<u64> = mode.strip_prefix("keys=").and_then(|n| n.parse().ok());
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t += step; // by default the hot partition runs at 100x its limit of 100
        let key = |token| LimitKey {
            token,
            table: 1,
            op: OpType::Write,
        };
        acc += match mode.as_str() {
            "hot" => rl.check(key(42), Some(100), x as u32, Nanos(t), &stats) as u64,
            "wide" => {
                let k = key((x % 50_000) as i64);
                rl.check(k, Some(100), (x >> 32) as u32, Nanos(t), &stats) as u64
            }
            _ if keys.is_some() => {
                let n = keys.unwrap_or(1);
                let k = key((((x & 0xFFFF_FFFF) * n) >> 32) as i64);
                rl.account_and_decide(k, 100, (x >> 32) as u32, Nanos(t)) as u64
            }
            "nolimit" => rl.check(key(42), black_box(None), x as u32, Nanos(t), &stats) as u64,
            "reject_full" => u64::from(ctl.enqueue(i, Nanos(t), Deadline::NEVER).is_err()),
            _ => {
                let _ = cycle.enqueue(i, Nanos(t), Deadline(Nanos(t + 10_000_000)));
                match cycle.dispatch(Nanos(t), |_, _| {}) {
                    Some(q) => {
                        cycle.on_complete(Duration::from_micros(100), Nanos(t));
                        q.item & 1
                    }
                    None => 0,
                }
            }
        };
    }
    println!(
        "{mode} {n} {acc} {:?} live={}",
        rl.stats(),
        rl.live_entries()
    );
}
