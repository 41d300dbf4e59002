//! The process clock: monotonic milliseconds since start, read once per decision by the
//! I/O layer and passed into decision code as `now`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds since the process clock started.
#[inline]
pub fn now_ms() -> u64 {
    Instant::now().duration_since(epoch()).as_millis() as u64
}

/// An `Instant` `ms` after the clock's start (for deadlines computed in ms).
pub fn instant_at(ms: u64) -> Instant {
    epoch() + Duration::from_millis(ms)
}
