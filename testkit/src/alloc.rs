//! A counting global allocator, for tests and benches that measure heap allocations.
//!
//! A binary installs it with
//! `#[global_allocator] static GLOBAL: CountingAlloc = CountingAlloc;`
//! and reads the count with [`allocations`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Forwards every call to [`System`], counting each `alloc`, `alloc_zeroed` and `realloc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

/// Allocations counted so far in this process; stays 0 unless [`CountingAlloc`] is the
/// global allocator.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::SeqCst)
}

// SAFETY: every method hands its arguments unchanged to `System`, which meets the
// `GlobalAlloc` contract, and returns what `System` returns; counting only bumps an
// atomic, so it neither allocates nor unwinds.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: our caller meets `alloc`'s contract for `layout`; it is the same for `System`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, hence from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: our caller meets `alloc_zeroed`'s contract for `layout`; it is the same
        // for `System`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator, hence from `System`, with `layout`, and our
        // caller meets `realloc`'s contract for `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
