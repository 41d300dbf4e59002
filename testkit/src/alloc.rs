//! A counting global allocator, for tests and benches that measure heap allocations.
//!
//! A binary installs it with
//! `#[global_allocator] static GLOBAL: CountingAlloc = CountingAlloc;`
//! and reads the count with [`allocations`]; [`describe_since`] names the threads and
//! sizes of the latest ones, so a failing zero-allocation test says whose they were. A
//! [`Watch`] also captures the call stacks of the first allocations while it runs, so a
//! rare one names its call site. It also keeps the live heap, in bytes ([`live_bytes`])
//! and by size ([`live_by_size`]), so a test can tell what a state holds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU64, AtomicUsize, Ordering};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Bytes allocated and not yet freed.
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
/// Blocks allocated and not yet freed, by exact size up to `SIZES - 1` (larger ones are
/// counted in the last).
const SIZES: usize = 16 * 1024 + 1;
static LIVE_BY_SIZE: [AtomicI64; SIZES] = [const { AtomicI64::new(0) }; SIZES];

/// The latest allocations, by their number modulo `RECENT`: the thread's id and the size.
const RECENT: usize = 64;
static RECENT_TID: [AtomicI32; RECENT] = [const { AtomicI32::new(0) }; RECENT];
static RECENT_SIZE: [AtomicUsize; RECENT] = [const { AtomicUsize::new(0) }; RECENT];

/// A [`Watch`] runs: allocations capture their call stacks (the first `STACKS` of them).
static WATCHING: AtomicBool = AtomicBool::new(false);
const STACKS: usize = 4;
static CAPTURED: AtomicUsize = AtomicUsize::new(0);
static STACKS_SEEN: Mutex<Vec<(usize, Backtrace)>> = Mutex::new(Vec::new());

thread_local! {
    /// This thread's id, asked of the kernel once (0: not yet). Const-initialised and
    /// without a destructor, so reading it never allocates.
    static TID: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
    /// This thread is capturing a call stack: what that allocates is not counted.
    static CAPTURING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A block of `size` bytes allocated (`sign` 1) or freed (-1).
fn live(size: usize, sign: i64) {
    LIVE_BYTES.fetch_add(sign * size as i64, Ordering::Relaxed);
    LIVE_BY_SIZE[size.min(SIZES - 1)].fetch_add(sign, Ordering::Relaxed);
}

/// Heap bytes allocated and not freed so far in this process (0 unless [`CountingAlloc`]
/// is the global allocator).
pub fn live_bytes() -> i64 {
    LIVE_BYTES.load(Ordering::SeqCst)
}

/// Blocks allocated and not freed, by size: element `n` counts blocks of `n` bytes (the
/// last one, 16 KiB and more). It allocates its answer (one vector).
pub fn live_by_size() -> Vec<i64> {
    let mut out = Vec::with_capacity(SIZES);
    out.extend(LIVE_BY_SIZE.iter().map(|c| c.load(Ordering::SeqCst)));
    out
}

/// Counts one allocation and remembers who made it (without allocating, unless a
/// [`Watch`] runs and this is one of its first allocations).
#[allow(unsafe_code)]
fn count(size: usize) {
    if CAPTURING.with(std::cell::Cell::get) {
        return;
    }
    let n = ALLOCATIONS.fetch_add(1, Ordering::Relaxed) as usize % RECENT;
    let tid = TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid has no preconditions and cannot fail.
            t.set(unsafe { libc::gettid() });
        }
        t.get()
    });
    RECENT_TID[n].store(tid, Ordering::Relaxed);
    RECENT_SIZE[n].store(size, Ordering::Relaxed);
    if WATCHING.load(Ordering::Relaxed) && CAPTURED.fetch_add(1, Ordering::Relaxed) < STACKS {
        CAPTURING.with(|c| c.set(true));
        let stack = Backtrace::force_capture();
        if let Ok(mut seen) = STACKS_SEEN.lock() {
            seen.push((size, stack));
        }
        CAPTURING.with(|c| c.set(false));
    }
}

/// Counts the allocations from its start to its end and captures the call stacks of the
/// first few (the capture itself is not counted).
#[derive(Debug)]
pub struct Watch {
    before: u64,
}

impl Watch {
    pub fn start() -> Watch {
        if let Ok(mut seen) = STACKS_SEEN.lock() {
            seen.clear();
        }
        CAPTURED.store(0, Ordering::SeqCst);
        let before = allocations();
        WATCHING.store(true, Ordering::SeqCst);
        Watch { before }
    }

    /// The allocations counted while it ran, and who made them: threads, sizes and the
    /// call stacks captured.
    pub fn stop(self) -> (u64, String) {
        WATCHING.store(false, Ordering::SeqCst);
        let n = allocations() - self.before;
        let mut whose = describe_since(self.before);
        if let Ok(mut seen) = STACKS_SEEN.lock() {
            for (size, stack) in seen.drain(..) {
                let _ = write!(whose, "\n--- {size} B allocated at:\n{stack}");
            }
        }
        (n, whose)
    }
}

/// The allocations counted since the count was `since` (the latest 64 at most): each one's
/// size and its thread's name, e.g. `48 B on spillway-monitor`. Call it after measuring: it
/// allocates.
pub fn describe_since(since: u64) -> String {
    let now = allocations();
    let first = since.max(now.saturating_sub(RECENT as u64));
    let mut out = String::new();
    for n in first..now {
        let slot = n as usize % RECENT;
        let tid = RECENT_TID[slot].load(Ordering::Relaxed);
        let size = RECENT_SIZE[slot].load(Ordering::Relaxed);
        let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| format!("exited thread {tid}"));
        let _ = write!(
            out,
            "{}{size} B on {name}",
            if out.is_empty() { "" } else { "; " }
        );
    }
    out
}

/// Forwards every call to [`System`], counting each `alloc`, `alloc_zeroed` and `realloc`,
/// and keeping the live heap's bytes and sizes.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

/// Allocations counted so far in this process; stays 0 unless [`CountingAlloc`] is the
/// global allocator.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::SeqCst)
}

// SAFETY: every method hands its arguments unchanged to `System`, which meets the
// `GlobalAlloc` contract, and returns what `System` returns; counting only stores to
// atomics (and asks the kernel for the thread's id), so it neither allocates nor unwinds.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        live(layout.size(), 1);
        // SAFETY: our caller meets `alloc`'s contract for `layout`; it is the same for `System`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        live(layout.size(), -1);
        // SAFETY: `ptr` came from this allocator, hence from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        live(layout.size(), 1);
        // SAFETY: our caller meets `alloc_zeroed`'s contract for `layout`; it is the same
        // for `System`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        live(layout.size(), -1);
        live(new_size, 1);
        // SAFETY: `ptr` came from this allocator, hence from `System`, with `layout`, and our
        // caller meets `realloc`'s contract for `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
