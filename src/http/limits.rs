//! Every wire-level limit in one place. Configurable ones are defaults for `[limits]`;
//! the rest are fixed properties of the codec.

/// Most header fields accepted in one request or response head. More → 431 (request) or 502.
pub const MAX_HEADERS: usize = 96;

/// Longest `x-request-id` we echo; a longer or non-printable one is replaced by a fresh id.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// Length of the request ids Spillway makes (32 hex digits).
pub const FRESH_REQUEST_ID_LEN: usize = 32;
const _: () = assert!(FRESH_REQUEST_ID_LEN <= MAX_REQUEST_ID_LEN);

/// Longest `x-worker-id` (direct routing) kept while a request is forwarded.
pub const MAX_WORKER_ID_LEN: usize = 128;

/// Most options (field names other than `close` and `keep-alive`) accepted in the
/// `Connection` fields of one head; more is refused as malformed.
pub const MAX_CONNECTION_OPTIONS: usize = 16;

/// Longest chunk-size line (hex digits plus extensions, up to and including its CR)
/// accepted in a chunked body.
pub const MAX_CHUNK_LINE: usize = 1024;

/// Trailer fields of a chunked body are read and dropped; this bounds them.
pub const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// Deepest JSON nesting the body scanner accepts (serde_json's own bound).
pub const MAX_JSON_DEPTH: u32 = 128;

/// Read buffer a connection takes when a request arrives; grows only for large heads or
/// bodies.
pub const INITIAL_READ_BUF: usize = 16 * 1024;

/// Buffer for what is written to the client (and the request forwarded upstream).
pub const WRITE_BUF: usize = 4 * 1024;

/// Free buffers of each size a core's pool keeps after traffic.
pub const BUFFER_POOL_IDLE: usize = 16;

/// What a connection that went idle without a buffer reads first: the start of its next
/// request (then it takes a buffer for the rest).
pub const IDLE_PROBE_LEN: usize = 32;

/// A connection buffer that grew beyond this for one large body is shrunk back afterwards,
/// so a single 40 MB upload does not pin 40 MB per idle keep-alive connection.
pub const RETAINED_BUF_MAX: usize = 256 * 1024;

/// Upstream read size while streaming a response body.
pub const RESPONSE_READ_BUF: usize = 16 * 1024;

/// Least free space offered to a client read; the buffer grows by this much when short.
pub const CLIENT_READ_MIN_SPARE: usize = 4096;

/// Least free space offered to an upstream read before the buffer grows by
/// [`RESPONSE_READ_BUF`].
pub const RESPONSE_READ_MIN_SPARE: usize = 1024;

/// Admin listener: largest request head and body (a `/load` batch for 1,000 workers × 8
/// ranks fits).
pub const MAX_ADMIN_HEAD: usize = 16 * 1024;
pub const MAX_ADMIN_BODY: usize = 8 * 1024 * 1024;

/// Largest data-parallel size of a worker: bounds `dp_size` in the file, in a pushed load
/// event, and the ranks a scrape reads (a larger rank label is ignored).
pub const MAX_DP_SIZE: u32 = 1024;

/// Engine `/metrics` scrapes: largest head and body accepted, first read buffer, and the
/// bounds of a scrape's timeout (the scrape interval, clamped).
pub const MAX_METRICS_HEAD: usize = 64 * 1024;
pub const MAX_METRICS_BODY: usize = 8 * 1024 * 1024;
pub const METRICS_READ_BUF: usize = 16 * 1024;
pub const SCRAPE_TIMEOUT_MIN_MS: u64 = 100;
pub const SCRAPE_TIMEOUT_MAX_MS: u64 = 5_000;

/// Defaults of the `[limits]` table.
pub mod defaults {
    pub const MAX_HEADER_BYTES: usize = 16 * 1024;
    pub const MAX_BODY_BYTES: usize = 45 * 1024 * 1024;
    pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
    /// Longest wait for the next bytes of a request body (like nginx's
    /// `client_body_timeout`, between reads, so a large upload on a slow link is fine).
    pub const BODY_READ_TIMEOUT_MS: u64 = 10_000;
    pub const IDLE_TIMEOUT_MS: u64 = 60_000;
    /// A keep-alive connection with nothing to read for this long gives its buffers back
    /// to the core's pool and waits for its next request without one (0: at once).
    pub const BUFFER_RELEASE_MS: u64 = 1_000;
    pub const CONNECT_TIMEOUT_MS: u64 = 2_000;
    /// The worker's whole response head must arrive within this long of the request's
    /// last byte going out (a deadline, not a timer reset by each read).
    pub const UPSTREAM_FIRST_BYTE_TIMEOUT_MS: u64 = 600_000;
    /// Longest silence between two reads of a response body (Envoy's `stream_idle_timeout`
    /// default): long enough for an engine's pauses (preemption, a reasoning model between
    /// phases, a tool call), short enough that a hung engine gives its slot back.
    pub const UPSTREAM_STREAM_IDLE_TIMEOUT_MS: u64 = 300_000;
    /// Longest a write to the client may take, checked once a second (nginx's
    /// `send_timeout`).
    pub const CLIENT_SEND_TIMEOUT_MS: u64 = 60_000;
    pub const MAX_CONNECTIONS: usize = 65_536;
    /// Below uvicorn's 5 s keep-alive (vLLM, SGLang) so we close idle upstream connections
    /// before the engine does and never write into one it is closing.
    pub const POOL_IDLE_TIMEOUT_MS: u64 = 4_000;
    pub const POOL_MAX_IDLE_PER_WORKER: usize = 128;
    pub const WORKER_DOWN_BACKOFF_MS: u64 = 1_000;
    pub const WORKER_DOWN_BACKOFF_MAX_MS: u64 = 30_000;
    /// A worker that refused a request (slots and queue full, queue timeout, its own
    /// 529) is skipped this long, whatever the monitor publishes meanwhile (0: not at all).
    /// About as long as a few load reports take to arrive.
    pub const WORKER_REFUSAL_HOLD_MS: u64 = 100;
    /// Admin listener: each whole request (head and body) must arrive within this long of
    /// the connection opening or of the previous answer, and each answer must be written
    /// within it, so a slow client holds a connection place for at most this long.
    pub const ADMIN_READ_TIMEOUT_MS: u64 = 5_000;
    /// Admin connections open at once; beyond, 503 and close.
    pub const ADMIN_MAX_CONNECTIONS: usize = 64;
}

/// Runtime limits, validated from config.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_body_bytes: usize,
    pub header_read_timeout_ms: u64,
    pub body_read_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub buffer_release_ms: u64,
    pub connect_timeout_ms: u64,
    pub upstream_first_byte_timeout_ms: u64,
    pub upstream_stream_idle_timeout_ms: u64,
    pub client_send_timeout_ms: u64,
    pub max_connections: usize,
    pub pool_idle_timeout_ms: u64,
    pub pool_max_idle_per_worker: usize,
    pub worker_down_backoff_ms: u64,
    pub worker_down_backoff_max_ms: u64,
    pub worker_refusal_hold_ms: u64,
    pub admin_read_timeout_ms: u64,
    pub admin_max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        use defaults::*;
        Self {
            max_header_bytes: MAX_HEADER_BYTES,
            max_body_bytes: MAX_BODY_BYTES,
            header_read_timeout_ms: HEADER_READ_TIMEOUT_MS,
            body_read_timeout_ms: BODY_READ_TIMEOUT_MS,
            idle_timeout_ms: IDLE_TIMEOUT_MS,
            buffer_release_ms: BUFFER_RELEASE_MS,
            connect_timeout_ms: CONNECT_TIMEOUT_MS,
            upstream_first_byte_timeout_ms: UPSTREAM_FIRST_BYTE_TIMEOUT_MS,
            upstream_stream_idle_timeout_ms: UPSTREAM_STREAM_IDLE_TIMEOUT_MS,
            client_send_timeout_ms: CLIENT_SEND_TIMEOUT_MS,
            max_connections: MAX_CONNECTIONS,
            pool_idle_timeout_ms: POOL_IDLE_TIMEOUT_MS,
            pool_max_idle_per_worker: POOL_MAX_IDLE_PER_WORKER,
            worker_down_backoff_ms: WORKER_DOWN_BACKOFF_MS,
            worker_down_backoff_max_ms: WORKER_DOWN_BACKOFF_MAX_MS,
            worker_refusal_hold_ms: WORKER_REFUSAL_HOLD_MS,
            admin_read_timeout_ms: ADMIN_READ_TIMEOUT_MS,
            admin_max_connections: ADMIN_MAX_CONNECTIONS,
        }
    }
}
