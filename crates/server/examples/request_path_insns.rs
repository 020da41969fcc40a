//! Drives the real request pipeline over an in-memory connection, frame bytes in and answer
//! bytes out (no sockets), for one outcome, N times; `scripts/insns.sh` runs it under
//! callgrind with N and 2N iterations and subtracts, which leaves the per-request
//! instruction count.
//!
//! The driver lives in `tests/support/request_path.rs`, shared with the test that proves
//! the rejections allocate nothing.
//!
//! Usage: `request_path_insns <served|served_limited|served_auth|overloaded|rate_limited|expired|write|read|read_tables|read_spread|read_narrow|read_narrow_spread> <N>`.

#[path = "../tests/support/request_path.rs"]
mod support;

/// The allocator the `sluice` binary runs with, so that the counts are the binary's.
#[global_allocator]
static ALLOC: sluice_alloc::Allocator = sluice_alloc::Allocator;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "served".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let (mut b, _dir, frames, expected) = support::setup(&path);
    // Warm-up: statement cache, limiter state, buffers.
    b.run(&frames, 200, |_| {});
    let wrong = measured(&mut b, &frames, n, &path, expected);
    // A few stray outcomes are tolerated (e.g. the limiter admitting one write per second);
    // more would mean the path measured is not the one named.
    assert!(
        wrong * 100 <= n,
        "{wrong} of {n} answers were not the {path} path"
    );
    println!(
        "{path}: {n} iterations, {wrong} off-path, {} disk tables at the end",
        b.disk_tables()
    );
}

/// The measured loop: `scripts/insns.sh` collects instructions inside this function only,
/// so that storage's background threads (flushes, compactions) do not count. Returns the
/// answers that were not `expected`.
#[inline(never)]
fn measured(
    b: &mut support::Bench,
    frames: &[Vec<u8>],
    n: usize,
    path: &str,
    expected: u8,
) -> usize {
    let _ = path;
    let mut wrong = 0usize;
    b.run(frames, n, |op| wrong += usize::from(op != expected));
    wrong
}
