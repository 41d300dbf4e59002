//! Data-path counters: each core writes only its own cache-padded cells (a plain load and
//! store, no locked instruction, no sharing), and a scrape sums the cores. The labels
//! they are counted under (`Outcome`, `RequestType`, `MigrationReason`) follow Dynamo's
//! metric names; the exposition is in [`crate::metrics`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam_utils::CachePadded;

use crate::route::Endpoint;
use crate::route::handoff::Handed;
use crate::shed::{Class, Knob};

const KNOBS: usize = Knob::ALL.len();
const CLASSES: usize = Class::ALL.len();

/// Adds to a counter that only the calling core writes.
#[inline]
pub fn add(cell: &AtomicU64, n: u64) {
    cell.store(cell.load(Relaxed).wrapping_add(n), Relaxed);
}

#[inline]
pub fn sub(cell: &AtomicU64, n: u64) {
    cell.store(cell.load(Relaxed).wrapping_sub(n), Relaxed);
}

/// How a request ended: Dynamo's `status` and `error_type` labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Validation,
    NotFound,
    Overload,
    Unavailable,
    Cancelled,
    ResponseTimeout,
    /// The client took nothing of a write for `client_send_timeout_ms`.
    ClientSendTimeout,
    Internal,
    NotImplemented,
}

impl Outcome {
    pub const ALL: [Outcome; 10] = [
        Outcome::Success,
        Outcome::Validation,
        Outcome::NotFound,
        Outcome::Overload,
        Outcome::Unavailable,
        Outcome::Cancelled,
        Outcome::ResponseTimeout,
        Outcome::ClientSendTimeout,
        Outcome::Internal,
        Outcome::NotImplemented,
    ];

    pub fn status(self) -> &'static str {
        if self == Outcome::Success {
            "success"
        } else {
            "error"
        }
    }

    pub fn error_type(self) -> &'static str {
        match self {
            Outcome::Success => "",
            Outcome::Validation => "validation",
            Outcome::NotFound => "not_found",
            Outcome::Overload => "overload",
            Outcome::Unavailable => "unavailable",
            Outcome::Cancelled => "cancelled",
            Outcome::ResponseTimeout => "response_timeout",
            Outcome::ClientSendTimeout => "client_send_timeout",
            Outcome::Internal => "internal",
            Outcome::NotImplemented => "not_implemented",
        }
    }

    /// The outcome of a response status the client received.
    pub fn of_status(status: u16, overload_status: u16) -> Outcome {
        match status {
            200..=399 => Outcome::Success,
            404 => Outcome::NotFound,
            408 | 504 => Outcome::ResponseTimeout,
            429 | 529 => Outcome::Overload,
            s if s == overload_status => Outcome::Overload,
            503 => Outcome::Unavailable,
            501 => Outcome::NotImplemented,
            400..=499 => Outcome::Validation,
            _ => Outcome::Internal,
        }
    }
}

/// Why a request moved to another worker (`spillway_migrations_total{model,reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationReason {
    WorkerAtCapacity,
    QueueTimeout,
    UpstreamOverloaded,
    UpstreamUnavailable,
}

impl MigrationReason {
    pub const ALL: [MigrationReason; 4] = [
        MigrationReason::WorkerAtCapacity,
        MigrationReason::QueueTimeout,
        MigrationReason::UpstreamOverloaded,
        MigrationReason::UpstreamUnavailable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            MigrationReason::WorkerAtCapacity => "worker_at_capacity",
            MigrationReason::QueueTimeout => "queue_timeout",
            MigrationReason::UpstreamOverloaded => "upstream_overloaded",
            MigrationReason::UpstreamUnavailable => "upstream_unavailable",
        }
    }
}

/// Why a failed attempt was tried again on another worker
/// (`spillway_retries_total{model,reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// A 5xx head that is not a refusal.
    Status5xx,
    /// Closed or reset before any response byte.
    Reset,
    /// No head within `upstream_first_byte_timeout_ms`.
    HeadTimeout,
    /// Its worker was found hung while the request waited.
    Stalled,
    /// A response that could not be read.
    Malformed,
}

impl RetryReason {
    pub const ALL: [RetryReason; 5] = [
        RetryReason::Status5xx,
        RetryReason::Reset,
        RetryReason::HeadTimeout,
        RetryReason::Stalled,
        RetryReason::Malformed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RetryReason::Status5xx => "status_5xx",
            RetryReason::Reset => "reset",
            RetryReason::HeadTimeout => "head_timeout",
            RetryReason::Stalled => "stalled",
            RetryReason::Malformed => "malformed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestType {
    Unary,
    Stream,
}

impl RequestType {
    pub fn label(self) -> &'static str {
        match self {
            RequestType::Unary => "unary",
            RequestType::Stream => "stream",
        }
    }
}

/// Dynamo's default bucket bounds (seconds), for dashboard compatibility.
pub const TTFT_BUCKETS: [f64; 18] = [
    0.0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1.0, 2.2, 4.7, 10.0, 22.0, 48.0,
    100.0, 220.0, 480.0,
];
pub const ITL_BUCKETS: [f64; 13] = [
    0.0, 0.0019, 0.0035, 0.0067, 0.013, 0.024, 0.045, 0.084, 0.16, 0.3, 0.56, 1.1, 2.0,
];
pub const DURATION_BUCKETS: [f64; 10] = [0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 130.0, 260.0, 510.0];

/// `dynamo_frontend_input_sequence_tokens` and `dynamo_frontend_cached_tokens`: 0, then 11
/// log-spaced bounds from 100 to 130,000 tokens (2 significant figures).
pub const ISL_BUCKETS: [f64; 12] = [
    0.0, 100.0, 210.0, 430.0, 870.0, 1800.0, 3600.0, 7400.0, 15000.0, 31000.0, 63000.0, 130000.0,
];
/// `dynamo_frontend_output_sequence_tokens`: 0, then 9 log-spaced bounds from 100 to
/// 32,000 tokens.
pub const OSL_BUCKETS: [f64; 10] = [
    0.0, 100.0, 210.0, 430.0, 880.0, 1800.0, 3700.0, 7600.0, 16000.0, 32000.0,
];

/// `dynamo_component_router_kv_hit_rate`: the share of a request's blocks predicted cached
/// on the worker `kv` routing chose.
pub const KV_HIT_BUCKETS: [f64; 11] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// `spillway_kv_router_overhead_seconds`: a `kv` routing decision (Dynamo's
/// `dynamo_router_overhead_total_ms`, in the base unit).
pub const OVERHEAD_BUCKETS: [f64; 12] = [
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3,
];

/// `spillway_waiting_room_wait_seconds`: a wait in a model's waiting room, 1 ms to 10 s.
pub const ROOM_WAIT_BUCKETS: [f64; 13] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// A single-writer histogram: counts per bucket (last = +Inf) and the sum in nanoseconds.
#[derive(Debug)]
pub struct Histogram<const N: usize> {
    counts: [AtomicU64; N],
    overflow: AtomicU64,
    sum_ns: AtomicU64,
}

impl<const N: usize> Default for Histogram<N> {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            overflow: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl<const N: usize> Histogram<N> {
    #[inline]
    pub fn observe(&self, bounds: &[f64; N], secs: f64) {
        match bounds.iter().position(|&b| secs <= b) {
            Some(i) => add(&self.counts[i], 1),
            None => add(&self.overflow, 1),
        }
        add(&self.sum_ns, (secs * 1e9) as u64);
    }

    /// Observes a count (tokens): the sum holds whole units, not nanoseconds.
    #[inline]
    pub fn observe_count(&self, bounds: &[f64; N], n: u64) {
        let v = n as f64;
        match bounds.iter().position(|&b| v <= b) {
            Some(i) => add(&self.counts[i], 1),
            None => add(&self.overflow, 1),
        }
        add(&self.sum_ns, n);
    }

    /// Adds this histogram's counts into `into` (per-bucket, non-cumulative) and sums.
    pub fn accumulate(&self, counts: &mut [u64], sum_ns: &mut u64) {
        for (i, c) in self.counts.iter().enumerate() {
            counts[i] += c.load(Relaxed);
        }
        counts[N] += self.overflow.load(Relaxed);
        *sum_ns += self.sum_ns.load(Relaxed);
    }
}

/// Where a request stands before its first response byte
/// (`dynamo_frontend_stage_requests{stage}`): being routed (picked, waiting at a worker's
/// admission gate), or dispatched upstream and waiting for the worker's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Route,
    Dispatch,
}

impl Stage {
    pub const ALL: [Stage; 2] = [Stage::Route, Stage::Dispatch];

    pub fn label(self) -> &'static str {
        match self {
            Stage::Route => "route",
            Stage::Dispatch => "dispatch",
        }
    }
}

const REQUEST_CELLS: usize = Endpoint::ALL.len() * 2 * Outcome::ALL.len();

/// One core's counters for one model.
#[derive(Debug)]
pub struct ModelCore {
    requests: [AtomicU64; REQUEST_CELLS],
    rejections: [AtomicU64; Endpoint::ALL.len()],
    pub inflight: AtomicU64,
    pub ttft: Histogram<18>,
    pub itl: Histogram<13>,
    pub duration: Histogram<10>,
    pub kv_hit_rate: Histogram<11>,
    pub router_overhead: Histogram<12>,
    /// Prompt tokens (estimated as the router does), generated tokens, and the tokens `kv`
    /// routing predicted cached on the chosen worker.
    pub isl: Histogram<12>,
    pub osl: Histogram<10>,
    pub cached_tokens: Histogram<12>,
    /// Requests in each [`Stage`] (a gauge: added and taken back by this core).
    pub stages: [AtomicU64; 2],
    /// `kv` routing's index: chunks newly predicted on a worker, predictions given up.
    kv_added: AtomicU64,
    kv_evicted: AtomicU64,
    migrations: [AtomicU64; 4],
    retries: [AtomicU64; RetryReason::ALL.len()],
    /// Retries the budget did not allow.
    retries_refused: AtomicU64,
    /// By knob, then class.
    refusals: [AtomicU64; KNOBS * CLASSES],
    /// Requests routed, by class.
    classes: [AtomicU64; CLASSES],
    /// Waits in the model's waiting room, by class, however they ended.
    pub room_wait: [Histogram<13>; CLASSES],
    /// Waiters refused at once, their turn predicted past their wait's end.
    room_predicted: AtomicU64,
    /// A disaggregated model's stage 2 begun, by how (`Handed`); from stage 1's end to
    /// the first token of a `remote` one.
    handoffs: [AtomicU64; Handed::ALL.len()],
    pub handoff_ttft: Histogram<18>,
}

impl Default for ModelCore {
    fn default() -> Self {
        Self {
            requests: std::array::from_fn(|_| AtomicU64::new(0)),
            rejections: std::array::from_fn(|_| AtomicU64::new(0)),
            inflight: AtomicU64::new(0),
            ttft: Histogram::default(),
            itl: Histogram::default(),
            duration: Histogram::default(),
            kv_hit_rate: Histogram::default(),
            router_overhead: Histogram::default(),
            isl: Histogram::default(),
            osl: Histogram::default(),
            cached_tokens: Histogram::default(),
            stages: std::array::from_fn(|_| AtomicU64::new(0)),
            kv_added: AtomicU64::new(0),
            kv_evicted: AtomicU64::new(0),
            migrations: std::array::from_fn(|_| AtomicU64::new(0)),
            retries: std::array::from_fn(|_| AtomicU64::new(0)),
            retries_refused: AtomicU64::new(0),
            refusals: std::array::from_fn(|_| AtomicU64::new(0)),
            classes: std::array::from_fn(|_| AtomicU64::new(0)),
            room_wait: std::array::from_fn(|_| Histogram::default()),
            room_predicted: AtomicU64::new(0),
            handoffs: std::array::from_fn(|_| AtomicU64::new(0)),
            handoff_ttft: Histogram::default(),
        }
    }
}

fn request_cell(e: Endpoint, t: RequestType, o: Outcome) -> usize {
    let oi = Outcome::ALL.iter().position(|x| *x == o).unwrap_or(0);
    (e.index() * 2 + t as usize) * Outcome::ALL.len() + oi
}

impl ModelCore {
    #[inline]
    pub fn request_done(&self, e: Endpoint, t: RequestType, o: Outcome) {
        add(&self.requests[request_cell(e, t, o)], 1);
    }

    #[inline]
    pub fn rejected(&self, e: Endpoint) {
        add(&self.rejections[e.index()], 1);
    }

    #[inline]
    pub fn migrated(&self, reason: MigrationReason) {
        add(&self.migrations[reason as usize], 1);
    }

    #[inline]
    pub fn retried(&self, reason: RetryReason) {
        add(&self.retries[reason as usize], 1);
    }

    #[inline]
    pub fn handed(&self, how: Handed) {
        add(&self.handoffs[how as usize], 1);
    }

    #[inline]
    pub fn retry_refused(&self) {
        add(&self.retries_refused, 1);
    }

    /// A request refused by `knob` (the client got the overload status or 503).
    #[inline]
    pub fn refused(&self, knob: Knob, class: Class) {
        add(&self.refusals[knob.index() * CLASSES + class.index()], 1);
    }

    /// A waiter refused at once, its turn predicted past its wait's end.
    #[inline]
    pub fn room_predicted(&self) {
        add(&self.room_predicted, 1);
    }

    /// A request of `class` is being routed.
    #[inline]
    pub fn classed(&self, class: Class) {
        add(&self.classes[class.index()], 1);
    }

    #[inline]
    pub fn kv_recorded(&self, added: u64, evicted: u64) {
        add(&self.kv_added, added);
        add(&self.kv_evicted, evicted);
    }
}

/// A model's counters: one [`ModelCore`] per core. Kept across reloads.
#[derive(Debug)]
pub struct ModelMetrics {
    pub cores: Box<[CachePadded<ModelCore>]>,
    /// Retries of failed attempts running now, over all cores: the retry budget's count
    /// (written only when a retry starts or ends).
    pub retries_running: CachePadded<std::sync::atomic::AtomicU64>,
}

impl ModelMetrics {
    pub fn new(cores: usize) -> ModelMetrics {
        ModelMetrics {
            cores: (0..cores)
                .map(|_| CachePadded::new(ModelCore::default()))
                .collect(),
            retries_running: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// One cell summed over the cores.
    fn total(&self, cell: impl Fn(&ModelCore) -> &AtomicU64) -> u64 {
        self.cores.iter().map(|c| cell(c).load(Relaxed)).sum()
    }

    /// (chunks newly predicted on a worker, predictions given up) by `kv` routing.
    pub fn kv_index_counts(&self) -> (u64, u64) {
        (self.total(|c| &c.kv_added), self.total(|c| &c.kv_evicted))
    }

    pub fn requests(&self, e: Endpoint, t: RequestType, o: Outcome) -> u64 {
        let cell = request_cell(e, t, o);
        self.total(|c| &c.requests[cell])
    }

    pub fn rejections(&self, e: Endpoint) -> u64 {
        self.total(|c| &c.rejections[e.index()])
    }

    pub fn migrations(&self, reason: MigrationReason) -> u64 {
        self.total(|c| &c.migrations[reason as usize])
    }

    pub fn retries(&self, reason: RetryReason) -> u64 {
        self.total(|c| &c.retries[reason as usize])
    }

    pub fn handoffs(&self, how: Handed) -> u64 {
        self.total(|c| &c.handoffs[how as usize])
    }

    pub fn retries_refused(&self) -> u64 {
        self.total(|c| &c.retries_refused)
    }

    pub fn refusals(&self, knob: Knob, class: Class) -> u64 {
        self.total(|c| &c.refusals[knob.index() * CLASSES + class.index()])
    }

    pub fn room_predicted(&self) -> u64 {
        self.total(|c| &c.room_predicted)
    }

    pub fn requests_of_class(&self, class: Class) -> u64 {
        self.total(|c| &c.classes[class.index()])
    }

    pub fn inflight(&self) -> u64 {
        self.total(|c| &c.inflight)
    }

    /// Requests in `stage` now, over all cores (each core's cell may wrap below zero on
    /// its own; the sum does not).
    pub fn in_stage(&self, stage: Stage) -> u64 {
        self.cores.iter().fold(0u64, |a, c| {
            a.wrapping_add(c.stages[stage as usize].load(Relaxed))
        })
    }
}

/// Process-wide data-path counters of one core.
#[derive(Debug, Default)]
pub struct CoreCounters {
    pub connections: AtomicU64,
    pub connections_refused: AtomicU64,
    pub bad_requests: AtomicU64,
    pub upstream_connects: AtomicU64,
    pub upstream_connect_failures: AtomicU64,
    pub upstream_reuse_retries: AtomicU64,
    /// Idle pooled connections closed because something arrived on them (bytes or FIN).
    pub upstream_idle_closed: AtomicU64,
    pub failovers: AtomicU64,
    pub client_disconnects: AtomicU64,
    /// TLS listener handshakes completed, and failed (bad hello, plain text, timeout).
    pub tls_handshakes: AtomicU64,
    pub tls_handshake_failures: AtomicU64,
    /// Handshakes with `https://` workers that failed (certificate, protocol).
    pub upstream_tls_failures: AtomicU64,
    /// Gauges the core refreshes once a second: its connection buffers lent out, the
    /// bytes its pool holds free, and its connections parked without buffers.
    pub buffers_lent: AtomicU64,
    pub buffer_pool_bytes: AtomicU64,
    pub parked_connections: AtomicU64,
    /// Access log lines written into the core's buffers, and lines dropped because the
    /// writer thread had no free buffer to give back.
    pub access_log_lines: AtomicU64,
    pub access_log_dropped: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets() {
        let h = Histogram::<3>::default();
        let bounds = [0.1, 1.0, 10.0];
        for s in [0.05, 0.1, 0.5, 5.0, 50.0] {
            h.observe(&bounds, s);
        }
        let mut counts = [0u64; 4];
        let mut sum = 0;
        h.accumulate(&mut counts, &mut sum);
        assert_eq!(counts, [2, 1, 1, 1]);
        assert_eq!(sum, 55_650_000_000);
    }

    #[test]
    fn outcome_of_status() {
        assert_eq!(Outcome::of_status(200, 529), Outcome::Success);
        assert_eq!(Outcome::of_status(529, 529), Outcome::Overload);
        assert_eq!(Outcome::of_status(503, 503), Outcome::Overload);
        assert_eq!(Outcome::of_status(503, 529), Outcome::Unavailable);
        assert_eq!(Outcome::of_status(400, 529), Outcome::Validation);
        assert_eq!(Outcome::of_status(502, 529), Outcome::Internal);
    }

    #[test]
    fn model_metrics_sum_cores() {
        let m = ModelMetrics::new(3);
        m.cores[0].request_done(
            Endpoint::ChatCompletions,
            RequestType::Stream,
            Outcome::Success,
        );
        m.cores[2].request_done(
            Endpoint::ChatCompletions,
            RequestType::Stream,
            Outcome::Success,
        );
        m.cores[1].rejected(Endpoint::Completions);
        assert_eq!(
            m.requests(
                Endpoint::ChatCompletions,
                RequestType::Stream,
                Outcome::Success
            ),
            2
        );
        assert_eq!(
            m.requests(
                Endpoint::ChatCompletions,
                RequestType::Unary,
                Outcome::Success
            ),
            0
        );
        assert_eq!(m.rejections(Endpoint::Completions), 1);
    }
}
