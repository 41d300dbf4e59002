//! How many requests a fake worker had open at once, from what it recorded and when
//! clients left.

use std::collections::HashMap;
use std::time::Instant;

/// One request as a worker handled it: its tag and when the worker started and stopped
/// answering it (stopped: before its response's last write, or when the connection broke).
#[derive(Debug, Clone)]
pub struct Handled {
    pub tag: String,
    pub start: Instant,
    pub end: Instant,
}

/// The most requests the worker had open at once, counting a request open from when the
/// worker started it until it stopped or its client left (`left`, by tag), whichever came
/// first. A client leaves before Spillway can notice and give the slot back, so this never
/// counts a request Spillway no longer holds, however late the worker sees its connection
/// close.
pub fn most_open_at_once(handled: &[Handled], left: &HashMap<String, Instant>) -> usize {
    let mut events: Vec<(Instant, i32)> = Vec::new();
    for h in handled {
        let end = left.get(&h.tag).map_or(h.end, |l| h.end.min(*l));
        if end > h.start {
            events.push((h.start, 1));
            events.push((end, -1));
        }
    }
    // At the same instant an end comes before a start (intervals are half-open).
    events.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, d) in events {
        open += d;
        most = most.max(open);
    }
    most as usize
}
