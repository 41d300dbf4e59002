//! What one core owns: its upstream pools, its connection buffers, RNG, round-robin positions, its caches of the
//! snapshot and of its busy-set replica, the count of requests in progress and the request
//! id sequence. Reached from every task of the core through an `Rc`; never shared.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::park::ParkedConns;
use super::pool::Pools;
use crate::accesslog::CoreLog;
use crate::http::limits::{BUFFER_POOL_IDLE, FRESH_REQUEST_ID_LEN, INITIAL_READ_BUF, WRITE_BUF};
use crate::route::Rng;
use crate::route::prefix::MAX_CHUNKS;
use crate::runtime::buffers::BufferPool;
use crate::runtime::stalls::Stalls;
use crate::shed::Knob;
use crate::state::{BusySet, CoreCounters, Shared, Snapshot};

/// A request's handle on its snapshot. The extra `Rc` layer is deliberate: cloning it per
/// request touches only this core's count, never the `Arc`'s count shared by all cores.
#[allow(clippy::redundant_allocation)]
pub type SnapshotRef = Rc<Arc<Snapshot>>;

#[derive(Debug)]
pub struct CoreCtx {
    pub id: usize,
    pub shared: Arc<Shared>,
    pub pools: RefCell<Pools>,
    /// Connection buffers lent per burst of requests: client and upstream reads ...
    pub read_bufs: RefCell<BufferPool>,
    /// ... and writes to the client.
    pub write_bufs: RefCell<BufferPool>,
    /// Client connections parked without buffers, with their idle deadlines.
    pub parked: RefCell<ParkedConns>,
    /// Client writes that did not finish at once, with their send deadlines.
    pub stalls: Rc<Stalls>,
    pub rng: RefCell<Rng>,
    /// Round-robin position per model id.
    rr: RefCell<Vec<u64>>,
    /// Per worker slot: the busy-set generation and the prefill tokens this core routed
    /// to the worker since that set was published (see `shed::Headroom`).
    routed: RefCell<Vec<(u64, u64)>>,
    /// Per worker slot: attempts that failed on this core lately, halved each second
    /// since the last (count, at ms): routers weigh them as load, so a worker that fails
    /// fast never looks idle.
    failures: RefCell<Vec<(u32, u64)>>,
    pub busy: RefCell<arc_swap::Cache<Arc<ArcSwap<BusySet>>, Arc<BusySet>>>,
    snapshot: RefCell<SnapshotCache>,
    /// Requests being served on this core (a drain waits for zero).
    pub active_requests: Cell<usize>,
    request_seq: Cell<u64>,
    request_salt: u64,
    /// `kv` routing's scratch: the chunk hashes of the request being routed.
    pub kv_hashes: RefCell<Box<[u64]>>,
    /// `kv` decisions made on this core so far: which one the scratch holds.
    pub kv_decisions: Cell<u64>,
    /// This core's end of the access log (`None` in contexts built without one).
    pub log: RefCell<Option<CoreLog>>,
    /// Process-clock ms of the last refusal logged per knob (refusal logs are rate-limited).
    refusal_logged_ms: [Cell<u64>; Knob::ALL.len()],
}

/// At most one refusal log line per knob per core in this many ms.
const REFUSAL_LOG_EVERY_MS: u64 = 1_000;

/// The core's view of the current snapshot: a cheap check per request, and an `Rc` the
/// request holds (no shared reference count is touched per request).
#[derive(Debug)]
struct SnapshotCache {
    cache: arc_swap::Cache<Arc<ArcSwap<Snapshot>>, Arc<Snapshot>>,
    current: SnapshotRef,
}

impl CoreCtx {
    /// The context of core `id`; `seed` seeds its RNG and request ids.
    pub fn new(id: usize, shared: Arc<Shared>, seed: u64) -> CoreCtx {
        let busy = arc_swap::Cache::new(shared.busy[id].clone());
        let mut cache = arc_swap::Cache::new(shared.snapshot.clone());
        let current = Rc::new(cache.load().clone());
        CoreCtx {
            id,
            pools: RefCell::new(Pools::default()),
            read_bufs: RefCell::new(BufferPool::new(INITIAL_READ_BUF, BUFFER_POOL_IDLE)),
            write_bufs: RefCell::new(BufferPool::new(WRITE_BUF, BUFFER_POOL_IDLE)),
            parked: RefCell::new(ParkedConns::default()),
            stalls: Rc::default(),
            rng: RefCell::new(Rng::new(seed)),
            rr: RefCell::new(Vec::new()),
            routed: RefCell::new(Vec::new()),
            failures: RefCell::new(Vec::new()),
            busy: RefCell::new(busy),
            snapshot: RefCell::new(SnapshotCache { cache, current }),
            active_requests: Cell::new(0),
            request_seq: Cell::new(0),
            request_salt: Rng::new(seed ^ 0xdead_beef).next_u64(),
            refusal_logged_ms: std::array::from_fn(|_| Cell::new(0)),
            kv_hashes: RefCell::new(vec![0; MAX_CHUNKS].into_boxed_slice()),
            kv_decisions: Cell::new(0),
            log: RefCell::new(None),
            shared,
        }
    }

    /// The snapshot a new request runs on.
    pub fn snapshot(&self) -> SnapshotRef {
        let mut s = self.snapshot.borrow_mut();
        let SnapshotCache { cache, current } = &mut *s;
        let latest = cache.load();
        if !Arc::ptr_eq(latest, current) {
            *current = Rc::new(latest.clone());
        }
        current.clone()
    }

    pub fn counters(&self) -> &CoreCounters {
        &self.shared.counters[self.id]
    }

    /// A fresh `x-request-id`: 32 hex digits, unique per process (core, sequence, salt).
    pub fn next_request_id(&self, out: &mut [u8; FRESH_REQUEST_ID_LEN]) {
        let seq = self.request_seq.get().wrapping_add(1);
        self.request_seq.set(seq);
        let hi = self.request_salt ^ ((self.id as u64) << 56);
        let lo = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ self.request_salt.rotate_left(17);
        for (i, v) in [hi, lo].into_iter().enumerate() {
            for j in 0..16 {
                out[i * 16 + j] = b"0123456789abcdef"[((v >> (60 - 4 * j)) & 0xf) as usize];
            }
        }
    }

    /// Whether a refusal by `knob` may be logged now (at most once a second per knob).
    pub fn may_log_refusal(&self, knob: Knob, now_ms: u64) -> bool {
        let last = &self.refusal_logged_ms[knob.index()];
        let due = last.get() == 0 || now_ms.saturating_sub(last.get()) >= REFUSAL_LOG_EVERY_MS;
        if due {
            last.set(now_ms.max(1));
        }
        due
    }

    /// The round-robin position of a model on this core.
    pub fn rr(&self, model_id: u32) -> u64 {
        self.rr
            .borrow()
            .get(model_id as usize)
            .copied()
            .unwrap_or(0)
    }

    /// Prefill tokens this core routed to the worker in `slot` since busy-set
    /// `generation` was published.
    pub fn routed_since(&self, slot: usize, generation: u64) -> u64 {
        match self.routed.borrow().get(slot) {
            Some(&(g, tokens)) if g == generation => tokens,
            _ => 0,
        }
    }

    /// Recent failures of the worker in `slot` on this core, halved for each second since
    /// the last one.
    #[inline]
    pub fn failure_penalty(&self, slot: usize, now_ms: u64) -> u32 {
        match self.failures.borrow().get(slot) {
            Some(&(n, at)) if n > 0 => n >> (now_ms.saturating_sub(at) / 1_000).min(31),
            _ => 0,
        }
    }

    /// Counts a failed attempt on the worker in `slot`.
    pub fn note_failure(&self, slot: usize, now_ms: u64) {
        let now_count = self.failure_penalty(slot, now_ms);
        let mut failures = self.failures.borrow_mut();
        if failures.len() <= slot {
            failures.resize(slot + 1, (0, 0));
        }
        failures[slot] = (now_count.saturating_add(1).min(1 << 16), now_ms);
    }

    /// Counts `tokens` of prefill routed to the worker in `slot` under busy-set
    /// `generation` (a newer generation starts the count again: its evaluation saw the
    /// earlier ones in the tracked load).
    pub fn note_routed(&self, slot: usize, generation: u64, tokens: u64) {
        let mut routed = self.routed.borrow_mut();
        if routed.len() <= slot {
            routed.resize(slot + 1, (0, 0));
        }
        let (g, sum) = &mut routed[slot];
        if *g != generation {
            (*g, *sum) = (generation, 0);
        }
        *sum = sum.saturating_add(tokens);
    }

    pub fn set_rr(&self, model_id: u32, value: u64) {
        let mut rr = self.rr.borrow_mut();
        let i = model_id as usize;
        if rr.len() <= i {
            rr.resize(i + 1, 0);
        }
        rr[i] = value;
    }
}
