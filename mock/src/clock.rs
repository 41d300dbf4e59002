//! The mock's only clock reads. The engine's schedule runs on microseconds since an
//! [`Instant`] taken at start; response `created` fields are Unix seconds.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The monotonic clock, now.
#[allow(clippy::disallowed_methods)]
pub fn now() -> Instant {
    Instant::now()
}

/// Seconds since the Unix epoch (0 if the wall clock is before it).
#[allow(clippy::disallowed_methods)]
pub fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
