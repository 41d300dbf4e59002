//! State shared between the threads: the config snapshot behind one `ArcSwap`, each
//! core's busy-set replica, per-worker atomics, per-core counters. Plain data and atomics;
//! nothing here does I/O or reads the clock. The monitor writes the busy replicas and the
//! snapshot; cores read them; neither ever waits for the other.

pub mod busy;
pub mod counters;
mod cow_chunks;
mod registry;
pub mod snapshot;
mod stats;
pub mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;

use crate::tls::Material;
pub use busy::{BusySet, MemberEntry};
pub use counters::CoreCounters;
pub use registry::Registry;
pub use snapshot::{
    Disaggregated, KvRouting, Member, Model, ModelRoom, Responses, Snapshot, Worker,
};
pub use stats::Stats;
pub use worker::KvLoad;
pub use worker::{SlotMap, SlotSet, TrackedLoad, WorkerState};

/// State shared by every core and the control thread.
#[derive(Debug)]
pub struct Shared {
    /// The current config generation; each request runs on the one it started with.
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    /// Busy-set replica per core, written by the monitor on every publish.
    pub busy: Box<[Arc<ArcSwap<BusySet>>]>,
    /// Open client connections across all cores.
    pub connections: AtomicUsize,
    pub counters: Box<[CachePadded<CoreCounters>]>,
    /// True on cores running the epoll fallback.
    pub legacy_driver: Box<[AtomicBool]>,
    /// Set on SIGTERM: health answers 503, responses close their connections.
    pub draining: AtomicBool,
    /// Process-clock ms after which draining cores stop waiting for requests in flight.
    pub drain_deadline_ms: AtomicU64,
    /// What TLS handshakes use (certificates, trust roots); a reload swaps it whole, so
    /// new handshakes take the new certificate and open connections keep their session.
    pub tls: ArcSwap<Material>,
}

impl Shared {
    /// Shared state for `cores` data cores, starting on `snapshot` with an empty busy set.
    pub fn new(snapshot: Snapshot, cores: usize) -> Shared {
        let empty = Arc::new(BusySet::default());
        Shared {
            snapshot: Arc::new(ArcSwap::from_pointee(snapshot)),
            busy: (0..cores)
                .map(|_| Arc::new(ArcSwap::new(empty.clone())))
                .collect(),
            connections: AtomicUsize::new(0),
            counters: (0..cores)
                .map(|_| CachePadded::new(CoreCounters::default()))
                .collect(),
            legacy_driver: (0..cores).map(|_| AtomicBool::new(false)).collect(),
            draining: AtomicBool::new(false),
            drain_deadline_ms: AtomicU64::new(u64::MAX),
            tls: ArcSwap::from_pointee(Material::default()),
        }
    }

    pub fn cores(&self) -> usize {
        self.counters.len()
    }
}
