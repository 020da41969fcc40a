//! The rejection paths allocate nothing: from the 9 header bytes to the `Overloaded` frame
//! appended to a connection's write buffer, and from the frame to the per-partition rate
//! limiter's or the deadline's pre-encoded error, decoding no more than it needs to find
//! the partition key. The paths are the real pipeline's, over an in-memory connection.
//!
//! A counting global allocator counts allocations made by this thread only, so the test
//! harness's other threads cannot disturb the figure.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Instant;

use bytes::BytesMut;
use sluice_protocol::frame::{FrameHeader, Opcode, HEADER_LEN};
use sluice_server::admission::{Admit, ShardAdmission};
use sluice_server::metrics::ShardMetrics;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

mod support;

fn allocations() -> u64 {
    ALLOCS.with(|c| c.get())
}

/// A v4 EXECUTE header for `stream` with a 200-byte body.
fn header_bytes(stream: i16) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0] = 0x04;
    h[2..4].copy_from_slice(&stream.to_be_bytes());
    h[4] = Opcode::Execute as u8;
    h[5..9].copy_from_slice(&200u32.to_be_bytes());
    h
}

#[test]
fn overloaded_rejection_from_the_header_allocates_nothing() {
    let config = support::request_path::fixed_admission_config(8, 1);
    let metrics = ShardMetrics::default();
    let mut admission = ShardAdmission::new(&config);
    let arrival = Instant::now();
    // Fill the execution slot and the queue (these allocate nothing either, but are not the
    // path under test).
    for s in 0..9 {
        let h = FrameHeader::parse(&header_bytes(s), 1 << 20).unwrap();
        assert!(matches!(
            admission.admit(&h, arrival.into(), 1, &metrics),
            Admit::Accept(_)
        ));
    }
    // The connection's write buffer has its usual spare capacity.
    let mut out = BytesMut::with_capacity(64 << 10);
    let frames = sluice_protocol::PreencodedErrors::new();
    const N: i16 = 1000;
    let before = allocations();
    for s in 100..100 + N {
        let bytes = header_bytes(s);
        let h = FrameHeader::parse(&bytes, 1 << 20).unwrap();
        match admission.admit(&h, Instant::now().into(), 1, &metrics) {
            Admit::Reject => {
                frames.overloaded.append(&mut out, h.stream);
            }
            Admit::Accept(_) => panic!("a full queue must reject"),
        }
    }
    let after = allocations();
    assert_eq!(after - before, 0, "the rejection path allocated");
    // And it really produced N Overloaded frames, each on its own stream.
    let frame_len = out.len() / N as usize;
    assert_eq!(out.len(), frame_len * N as usize);
    for (i, f) in out.chunks(frame_len).enumerate() {
        assert_eq!(f[0], 0x84);
        assert_eq!(i16::from_be_bytes([f[2], f[3]]), 100 + i as i16);
        assert_eq!(f[4], Opcode::Error as u8);
        assert_eq!(&f[9..13], &0x1001i32.to_be_bytes());
    }
    assert_eq!(
        metrics
            .rejected_overloaded
            .load(std::sync::atomic::Ordering::Relaxed),
        N as u64
    );
}

/// Runs `path` of the real pipeline over an in-memory connection and returns how many of
/// its answers were that path's and the allocations made while serving them, in steady state.
fn allocations_on_path(path: &str) -> (usize, u64) {
    let (mut bench, _dir, frames, expected) = support::request_path::setup(path);
    // Warm-up: statement cache, limiter slot, buffers.
    bench.run(&frames, 200, |_| {});
    const N: usize = 500;
    let mut answers: Vec<(u8, u64)> = Vec::with_capacity(N);
    let mut before = allocations();
    bench.run(&frames, N, |op| {
        let now = allocations();
        answers.push((op, now - before));
        before = allocations();
    });
    let on_path: Vec<u64> = answers
        .iter()
        .filter(|(op, _)| *op == expected)
        .map(|&(_, a)| a)
        .collect();
    (on_path.len(), on_path.iter().sum())
}

/// Allocations per request of a rejection path, after checking that nearly every answer was
/// that path's. The rate limiter's decisions are random around the limit, so an odd write
/// may be served; only the rejections are counted.
fn allocations_per_rejection(path: &str) -> u64 {
    let (on_path, allocated) = allocations_on_path(path);
    assert!(on_path >= 490, "only {on_path} of 500 answers were {path}");
    allocated
}

#[test]
fn rate_limited_rejection_allocates_nothing() {
    assert_eq!(allocations_per_rejection("rate_limited"), 0);
}

#[test]
fn expired_rejection_allocates_nothing() {
    assert_eq!(allocations_per_rejection("expired"), 0);
}

#[test]
fn overloaded_rejection_through_the_pipeline_allocates_nothing() {
    assert_eq!(allocations_per_rejection("overloaded"), 0);
}

#[test]
fn a_served_write_does_allocate() {
    // The same harness on the served path: it allocates (rows, batches, results), which
    // shows the tests above can fail.
    let (on_path, allocated) = allocations_on_path("served");
    assert_eq!(on_path, 500);
    assert!(allocated > 0);
}

#[test]
fn the_counting_allocator_does_count() {
    let before = allocations();
    let v: Vec<u8> = Vec::with_capacity(16);
    assert!(allocations() > before);
    drop(v);
}
