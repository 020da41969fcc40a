//! The request-path decisions allocate nothing: proven with a counting global allocator.

use sluice_overload::admission::{AdmissionConfig, AdmissionController};
use sluice_overload::{
    Deadline, Decision, LimitKey, Nanos, OpType, RateLimiter, RateLimiterConfig, TableLimitStats,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

struct Counting;

thread_local! {
    // Per thread: the test harness's own threads allocate concurrently.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn bump() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

#[test]
fn request_path_decisions_do_not_allocate() {
    let mut rl = RateLimiter::with_salt(RateLimiterConfig::default(), 1);
    let stats = TableLimitStats::default();
    let mut ctl = AdmissionController::<u32>::new(AdmissionConfig {
        queue_capacity: 64,
        ..AdmissionConfig::default()
    });

    // The counter sees this thread's allocations.
    let probe = allocs();
    drop(std::hint::black_box(Vec::<u8>::with_capacity(8)));
    assert_eq!(allocs(), probe + 1);

    let before = allocs();
    let mut rejected = 0u64;
    let mut t = Nanos::from_secs(1_700_000_000).0;
    for i in 0..200_000u64 {
        t += 50_000; // 20,000 ops/s: windows advance, the sweep runs, keys fade and evict
        let key = LimitKey {
            // A quarter of the traffic on 40 hot partitions, the rest spread over 50,000.
            token: if i % 4 == 0 {
                (i % 40) as i64
            } else {
                (i % 50_000) as i64 * 7919
            },
            table: (i % 3) as u32,
            op: if i % 2 == 0 {
                OpType::Read
            } else {
                OpType::Write
            },
        };
        let limit = if i % 7 == 0 { None } else { Some(5) };
        if rl.check(
            key,
            limit,
            (i as u32).wrapping_mul(2_654_435_761),
            Nanos(t),
            &stats,
        ) == Decision::Reject
        {
            rejected += 1;
        }

        // Admission: fill past capacity (rejections), dispatch, complete.
        let now = Nanos(t);
        let _ = ctl.enqueue(i as u32, now, Deadline(Nanos(t + 20_000_000)));
        if i % 3 == 0 {
            if let Some(q) = ctl.dispatch(now, |_, _| rejected += 1) {
                std::hint::black_box(q.item);
                ctl.on_complete(Duration::from_micros(80), now);
            }
        }
    }
    let after = allocs();
    assert_eq!(after - before, 0, "allocations on the request path");
    assert!(rejected > 0, "rejection paths were exercised");
    assert!(ctl.stats().shed_full > 0);
    assert!(rl.stats().rejected > 0);
}
