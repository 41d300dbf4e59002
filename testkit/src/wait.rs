//! Waiting for effects that land asynchronously.

use std::time::{Duration, Instant};

/// Polls `cond` every 5 ms until it holds; panics naming `what` after `timeout`.
pub fn eventually(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("timed out waiting for: {what}");
}
