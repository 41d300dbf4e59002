//! A one-line view of what the proxy is doing (the demo's status line, SIGUSR1).

use std::fmt;

use super::Shared;
use super::counters::{Outcome, RequestType};
use crate::route::Endpoint;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests finished (any outcome) over all models.
    pub requests: u64,
    /// Requests refused with the overload status (busy pool or worker refusals).
    pub rejected: u64,
    pub inflight: u64,
    /// Workers in the published busy set, out of `workers`.
    pub busy_workers: usize,
    pub workers: usize,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "requests={} rejected={} busy_workers={}/{} in_flight={}",
            self.requests, self.rejected, self.busy_workers, self.workers, self.inflight
        )
    }
}

impl Shared {
    /// Sums the cores' counters and reads the published busy set.
    pub fn stats(&self) -> Stats {
        let snap = self.snapshot.load();
        let busy = self.busy.first().map(|b| b.load_full()).unwrap_or_default();
        let mut s = Stats {
            workers: snap.workers.len(),
            ..Stats::default()
        };
        for m in snap.models.iter() {
            for e in Endpoint::ALL {
                s.rejected += m.metrics.rejections(e);
                for t in [RequestType::Unary, RequestType::Stream] {
                    s.requests += Outcome::ALL
                        .iter()
                        .map(|o| m.metrics.requests(e, t, *o))
                        .sum::<u64>();
                }
            }
            s.inflight += m.metrics.inflight();
        }
        s.busy_workers = (0..snap.workers.len() as u32)
            .filter(|&wi| {
                snap.models.iter().any(|m| {
                    m.members
                        .iter()
                        .any(|mm| mm.worker == wi && busy.is_busy(m.class, mm.id))
                })
            })
            .count();
        s
    }
}
