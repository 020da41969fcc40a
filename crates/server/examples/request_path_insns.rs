//! Drives the in-process request path, frame bytes in and response bytes out (no sockets),
//! for one of four outcomes, N times; `scripts/insns.sh` runs it under callgrind with N and
//! 2N iterations and subtracts, which leaves the per-request instruction count.
//!
//! The path itself lives in `tests/support/request_path.rs`, shared with the test that
//! proves the rejections allocate nothing.
//!
//! Usage: `request_path_insns <served|served_limited|overloaded|rate_limited|expired> <N>`.

#[path = "../tests/support/request_path.rs"]
mod support;

/// The allocator the `sluice` binary runs with, so that the counts are the binary's.
#[global_allocator]
static ALLOC: sluice_alloc::Allocator = sluice_alloc::Allocator;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "served".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let (mut b, _dir, frame, expected) = support::setup(&path);
    // Warm-up: statement cache, limiter state, buffers.
    for _ in 0..200 {
        b.one(&frame, &path);
    }
    let mut wrong = 0usize;
    for _ in 0..n {
        if b.one(&frame, &path) != expected {
            wrong += 1;
        }
    }
    // A few stray outcomes are tolerated (e.g. the limiter admitting one write per second);
    // more would mean the path measured is not the one named.
    assert!(
        wrong * 100 <= n,
        "{wrong} of {n} answers were not the {path} path"
    );
    println!("{path}: {n} iterations, {wrong} off-path");
}
