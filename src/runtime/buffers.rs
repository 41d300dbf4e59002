//! A core's pool of connection buffers. A connection takes its buffers when a request
//! arrives and gives them back when it goes idle, so idle keep-alive connections hold none
//! and the buffers of the connections served recently are reused without allocating.
//!
//! The pool keeps as many free buffers as the recent peak needs: each `trim` (once a
//! second) frees those beyond what the busiest moment since the previous trim had lent,
//! and never fewer than `idle` are kept. After traffic it is back to `idle` free buffers
//! within two trims. Owned by one core; no lock.

/// Free buffers of one size.
#[derive(Debug)]
pub struct BufferPool {
    size: usize,
    /// Free buffers kept after traffic.
    idle: usize,
    free: Vec<Vec<u8>>,
    lent: usize,
    /// Most buffers lent at once since the last trim.
    peak: usize,
}

impl BufferPool {
    /// A pool of buffers of `size` bytes that keeps `idle` free ones after traffic.
    pub fn new(size: usize, idle: usize) -> BufferPool {
        BufferPool {
            size,
            idle,
            free: Vec::new(),
            lent: 0,
            peak: 0,
        }
    }

    /// An empty buffer with room for `size` bytes.
    pub fn take(&mut self) -> Vec<u8> {
        self.lent += 1;
        self.peak = self.peak.max(self.lent);
        self.free
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(self.size))
    }

    /// Takes back a buffer lent by `take`. One that grew far beyond the pool's size (a
    /// large body) is freed instead of kept; one that was lost (capacity 0: its read was
    /// abandoned with the connection) only ends the loan.
    pub fn give(&mut self, mut buf: Vec<u8>) {
        self.lent = self.lent.saturating_sub(1);
        let cap = buf.capacity();
        if cap >= self.size && cap <= self.size * 4 {
            buf.clear();
            self.free.push(buf);
        }
    }

    /// Frees what the recent peak did not need; once a second.
    pub fn trim(&mut self) {
        let keep = self.peak.saturating_sub(self.lent).max(self.idle);
        self.free.truncate(keep);
        self.peak = self.lent;
    }

    /// Buffers lent out now.
    pub fn lent(&self) -> usize {
        self.lent
    }

    /// Bytes held by the free buffers.
    pub fn free_bytes(&self) -> usize {
        self.free.iter().map(Vec::capacity).sum()
    }

    /// Free buffers held.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_what_it_lent() {
        let mut pool = BufferPool::new(1024, 2);
        let a = pool.take();
        let ptr = a.as_ptr();
        assert_eq!(a.capacity(), 1024);
        pool.give(a);
        let b = pool.take();
        assert_eq!(b.as_ptr(), ptr, "the same allocation comes back");
        assert_eq!(pool.lent(), 1);
        pool.give(b);
        assert_eq!((pool.lent(), pool.free_count()), (0, 1));
    }

    #[test]
    fn frees_grown_and_counts_lost_buffers() {
        let mut pool = BufferPool::new(1024, 2);
        let mut a = pool.take();
        a.reserve(64 * 1024);
        pool.give(a);
        assert_eq!(pool.free_count(), 0, "a buffer grown past 4x is freed");
        let _lost = pool.take();
        pool.give(Vec::new());
        assert_eq!((pool.lent(), pool.free_count()), (0, 0));
    }

    #[test]
    fn trim_keeps_the_recent_peak_then_returns_to_idle() {
        let mut pool = BufferPool::new(64, 2);
        let lent: Vec<_> = (0..10).map(|_| pool.take()).collect();
        for b in lent {
            pool.give(b);
        }
        assert_eq!(pool.free_count(), 10);
        pool.trim();
        assert_eq!(
            pool.free_count(),
            10,
            "the peak since the last trim is kept"
        );
        let b = pool.take();
        pool.give(b);
        pool.trim();
        assert_eq!(pool.free_count(), 2, "quiet: back to the idle size");
        assert_eq!(pool.free_bytes(), 128);
    }

    #[test]
    fn trim_keeps_room_for_buffers_still_lent() {
        let mut pool = BufferPool::new(64, 0);
        let held: Vec<_> = (0..4).map(|_| pool.take()).collect();
        let extra: Vec<_> = (0..4).map(|_| pool.take()).collect();
        for b in extra {
            pool.give(b);
        }
        pool.trim();
        assert_eq!(pool.free_count(), 4, "peak 8 with 4 still lent");
        pool.trim();
        assert_eq!(pool.free_count(), 0);
        drop(held);
    }
}
