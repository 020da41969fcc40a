//! The allocator of the `sluice` binary: mimalloc (its v2 line), called the way C calls it.
//!
//! The `mimalloc` crate's `GlobalAlloc` passes every request through `mi_malloc_aligned`,
//! whose alignment checks come before mimalloc's small-object fast path. Almost every Rust
//! allocation has an alignment mimalloc's size classes already give (at most 16 bytes, and
//! the size a multiple of it), so [`Allocator`] calls `mi_malloc`, `mi_zalloc` and
//! `mi_realloc` for those and keeps the aligned calls for the rest. On the served write of
//! `scripts/insns.sh` that took 360 instructions (2.3%) off a request.
//!
//! Why the plain calls are aligned enough: mimalloc's size classes up to 64 bytes are the
//! multiples of 8, and above 64 bytes multiples of 16; a page's first block sits at a
//! multiple of the block size from a 64 KiB-aligned slice, so every block is aligned to the
//! largest power of two dividing its size class. A size that is a multiple of an alignment of
//! at most 16 falls in a class that is a multiple of that alignment too. The tests check it
//! for every size up to 4 KiB and every such alignment.
//!
//! [`set_transparent_huge_pages`] says whether the kernel may back the heap with 2 MiB pages:
//! the server turns them off (see its doc for the measured stall).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use libmimalloc_sys as ffi;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// The largest alignment a plain `mi_malloc` block is guaranteed to have
/// (mimalloc's `MI_MAX_ALIGN_SIZE`), given a size that is a multiple of it.
const NATURAL_ALIGN_MAX: usize = 16;

/// mimalloc as the global allocator, without its aligned path for ordinary layouts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Allocator;

/// Whether a plain mimalloc call returns memory aligned enough for `size` at `align`.
#[inline]
fn plain_call_aligns(size: usize, align: usize) -> bool {
    // `align` is a power of two (a `Layout` guarantees it).
    align <= NATURAL_ALIGN_MAX && size & (align - 1) == 0
}

/// Allocates `layout` with mimalloc's `plain` call when that aligns it enough, else with its
/// `aligned` one (the same allocation, zeroed or not).
///
/// # Safety
/// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
#[inline]
unsafe fn alloc_with(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: plain FFI calls; mimalloc accepts any size and power-of-two alignment.
    unsafe {
        if plain_call_aligns(layout.size(), layout.align()) {
            plain(layout.size()).cast()
        } else {
            aligned(layout.size(), layout.align()).cast()
        }
    }
}

// SAFETY: every call forwards to mimalloc, which returns blocks of at least the requested
// size, aligned as the layout asks (see the module documentation for the plain calls), and
// frees any block it returned with `mi_free`.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `alloc_with`'s.
        unsafe { alloc_with(layout, ffi::mi_malloc, ffi::mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe { alloc_with(layout, ffi::mi_zalloc, ffi::mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { ffi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; the new block keeps its
        // alignment by the same rule as `alloc`.
        unsafe {
            if plain_call_aligns(new_size, layout.align()) {
                ffi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                ffi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

/// Allows or forbids transparent huge pages for this process's later page faults (Linux's
/// `PR_SET_THP_DISABLE`, which covers mappings made before the call too; mimalloc's
/// `MIMALLOC_ALLOW_THP=0` makes the same call, but only from the environment at start-up).
///
/// Why a server forbids them: a fault on a fresh 2 MiB page zeroes all of it before the
/// faulting thread goes on. On the virtual machines Sluice is benchmarked on, one such fault
/// took about 6.5 ms (eight in a row stalled a shard for 52 ms, `perf` in
/// `clear_page_erms`), the first time the heap grew past its high-water mark, which is when
/// load rises. With 4 KiB pages only the memory touched is zeroed, a page at a time.
/// Elsewhere than Linux this does nothing.
pub fn set_transparent_huge_pages(allow: bool) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let disable = libc::c_ulong::from(!allow);
        let unused: libc::c_ulong = 0;
        // SAFETY: `prctl` with integer arguments only; it touches no memory of ours.
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, disable, unused, unused, unused) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = allow;
    Ok(())
}

/// Whether transparent huge pages are allowed for this process (always true elsewhere than
/// Linux, where the call does not exist).
pub fn transparent_huge_pages_allowed() -> std::io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        let unused: libc::c_ulong = 0;
        // SAFETY: as above.
        let rc = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, unused, unused, unused, unused) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(rc == 0)
    }
    #[cfg(not(target_os = "linux"))]
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALLOCATOR: Allocator = Allocator;

    fn check_block(ptr: *mut u8, layout: Layout) {
        assert!(!ptr.is_null(), "no block for {layout:?}");
        assert_eq!(
            ptr as usize % layout.align(),
            0,
            "block for {layout:?} is misaligned"
        );
    }

    #[test]
    fn every_small_size_and_alignment_gets_an_aligned_block() {
        for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in (1..=4096).filter(|s| s % align == 0 || align > 16) {
                let layout = Layout::from_size_align(size, align).unwrap();
                // Several blocks per class, so that more than a page's first block is checked.
                let blocks: Vec<*mut u8> =
                    (0..4).map(|_| unsafe { ALLOCATOR.alloc(layout) }).collect();
                for &b in &blocks {
                    check_block(b, layout);
                    // The whole block is writable.
                    unsafe { std::ptr::write_bytes(b, 0xA5, size) };
                }
                for b in blocks {
                    unsafe { ALLOCATOR.dealloc(b, layout) };
                }
            }
        }
    }

    #[test]
    fn zeroed_blocks_are_zero() {
        for (size, align) in [(24usize, 8usize), (48, 16), (100, 4), (4096, 64), (3, 1)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            let p = unsafe { ALLOCATOR.alloc_zeroed(layout) };
            check_block(p, layout);
            let bytes = unsafe { std::slice::from_raw_parts(p, size) };
            assert!(bytes.iter().all(|&b| b == 0), "{layout:?} not zeroed");
            unsafe { ALLOCATOR.dealloc(p, layout) };
        }
    }

    #[test]
    fn transparent_huge_pages_are_turned_off_and_on() {
        set_transparent_huge_pages(false).unwrap();
        let off = transparent_huge_pages_allowed().unwrap();
        set_transparent_huge_pages(true).unwrap();
        let on = transparent_huge_pages_allowed().unwrap();
        if cfg!(target_os = "linux") {
            assert!(!off, "still allowed after turning them off");
        }
        assert!(on, "not allowed after turning them on");
    }

    proptest! {
        /// A reallocation keeps the contents and the alignment, growing or shrinking, on both
        /// the plain and the aligned path.
        #[test]
        fn realloc_keeps_contents_and_alignment(
            size in 1usize..3000,
            new_size in 1usize..3000,
            align_log in 0u32..8,
        ) {
            let align = 1usize << align_log;
            let layout = Layout::from_size_align(size, align).unwrap();
            let p = unsafe { ALLOCATOR.alloc(layout) };
            check_block(p, layout);
            for i in 0..size {
                unsafe { *p.add(i) = (i % 251) as u8 };
            }
            let q = unsafe { ALLOCATOR.realloc(p, layout, new_size) };
            let grown = Layout::from_size_align(new_size, align).unwrap();
            check_block(q, grown);
            for i in 0..size.min(new_size) {
                prop_assert_eq!(unsafe { *q.add(i) }, (i % 251) as u8);
            }
            unsafe { ALLOCATOR.dealloc(q, grown) };
        }
    }
}
