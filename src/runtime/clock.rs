//! The process clock: the only place that reads the time (clippy's `disallowed-methods`
//! enforces it). The I/O layers read it once per decision and pass `now` into decision
//! code; decision code never reads it itself.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(now)
}

/// The current instant.
#[inline]
#[allow(clippy::disallowed_methods)]
pub fn now() -> Instant {
    Instant::now()
}

/// Milliseconds since the process clock started.
#[inline]
pub fn now_ms() -> u64 {
    now().duration_since(epoch()).as_millis() as u64
}

/// Time passed since `since`.
#[inline]
pub fn since(since: Instant) -> Duration {
    now().saturating_duration_since(since)
}

/// An `Instant` `ms` after the clock's start (for deadlines computed in ms).
pub fn instant_at(ms: u64) -> Instant {
    epoch() + Duration::from_millis(ms)
}

/// Seconds since the Unix epoch (the `created` field of `/v1/models`).
#[allow(clippy::disallowed_methods)]
pub fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Milliseconds since the Unix epoch (access log times).
#[allow(clippy::disallowed_methods)]
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
