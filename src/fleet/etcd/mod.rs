//! An etcd v3 client for the `etcd` worker source, over etcd's documented JSON gateway
//! (`POST /v3/kv/range`, `POST /v3/watch`; keys and values base64): a prefix is read with
//! its revision, then watched from the next revision. `decode` and `stream` are the pure
//! halves (JSON in and out, the watch stream cut into objects); `conn` is the one HTTP/1.1
//! exchange per request. Keys that are not UTF-8 are skipped (see `decode`).

mod conn;
mod decode;
mod stream;

use std::net::SocketAddr;
use std::time::Duration;

use conn::{Conn, closed};
use decode::WatchMsg;
use stream::{BodyDecoder, JsonSplitter};

pub use decode::prefix_end;

/// The most a range answer may take: a prefix of thousands of workers fits many times.
pub const MAX_RANGE_BODY: usize = 16 * 1024 * 1024;
/// The most a watch may buffer: one batch of events (and what followed it in the stream).
pub const MAX_WATCH_OBJECT: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    #[error("etcd {addr}: {reason}")]
    Io { addr: SocketAddr, reason: String },
    #[error("etcd {addr} answered {status}: {body}")]
    Status {
        addr: SocketAddr,
        status: u16,
        body: String,
    },
    /// The watch's start revision was compacted away: read the prefix again.
    #[error("etcd revision {0} was compacted")]
    Compacted(i64),
    #[error("etcd: unexpected answer: {0}")]
    Protocol(String),
    /// etcd refused or ended the watch itself (an error object, a cancel that is not a
    /// compaction).
    #[error("etcd: {0}")]
    Server(String),
}

/// One key under the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
    /// The lease the key is bound to (0: none).
    pub lease: i64,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Put(Kv),
    Delete { key: String, mod_revision: i64 },
}

fn timed_out(addr: SocketAddr, timeout: Duration) -> EtcdError {
    EtcdError::Io {
        addr,
        reason: format!("no answer within {} ms", timeout.as_millis()),
    }
}

/// Every key under `prefix` and the store's revision at the read. `host` is the Host
/// header (empty: `addr`); `timeout` bounds the whole exchange.
pub async fn range_prefix(
    addr: SocketAddr,
    host: &str,
    prefix: &str,
    timeout: Duration,
) -> Result<(i64, Vec<Kv>), EtcdError> {
    range(addr, host, &decode::range_body(prefix), timeout).await
}

/// The store's revision, from a count of the keys under `prefix` (no key or value is
/// sent back): a cheap check that etcd still answers, within `timeout`.
pub async fn check(
    addr: SocketAddr,
    host: &str,
    prefix: &str,
    timeout: Duration,
) -> Result<i64, EtcdError> {
    let (revision, _) = range(addr, host, &decode::count_body(prefix), timeout).await?;
    Ok(revision)
}

/// One `POST /v3/kv/range` with `body`, the whole exchange within `timeout`.
async fn range(
    addr: SocketAddr,
    host: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<(i64, Vec<Kv>), EtcdError> {
    monoio::time::timeout(timeout, range_once(addr, host, body))
        .await
        .unwrap_or_else(|_| Err(timed_out(addr, timeout)))
}

async fn range_once(
    addr: SocketAddr,
    host: &str,
    body: &[u8],
) -> Result<(i64, Vec<Kv>), EtcdError> {
    let mut conn = Conn::post(addr, host, "/v3/kv/range", body).await?;
    let head = conn.head().await?;
    if head.status != 200 {
        return Err(conn.status_error(&head).await);
    }
    let mut body = Vec::new();
    let mut decoder = BodyDecoder::new(head.framing());
    conn.body(&mut decoder, &mut body, MAX_RANGE_BODY).await?;
    decode::decode_range(&body)
}

/// A watch on a prefix: one long HTTP response whose chunks carry JSON results.
#[derive(Debug)]
pub struct Watch {
    conn: Conn,
    decoder: BodyDecoder,
    splitter: JsonSplitter,
    /// Payload bytes on their way from `decoder` to `splitter`.
    scratch: Vec<u8>,
    /// The response body ended (etcd closed the stream).
    ended: bool,
}

impl Watch {
    /// Opens a watch of `prefix` from `start_revision` (inclusive; 0: from now); returns
    /// once etcd has confirmed it (or `timeout` passed). A compacted start revision is
    /// [`EtcdError::Compacted`], here or from the first [`Watch::next`].
    pub async fn start(
        addr: SocketAddr,
        host: &str,
        prefix: &str,
        start_revision: i64,
        timeout: Duration,
    ) -> Result<Watch, EtcdError> {
        monoio::time::timeout(timeout, Watch::open(addr, host, prefix, start_revision))
            .await
            .unwrap_or_else(|_| Err(timed_out(addr, timeout)))
    }

    async fn open(
        addr: SocketAddr,
        host: &str,
        prefix: &str,
        start_revision: i64,
    ) -> Result<Watch, EtcdError> {
        let body = decode::watch_body(prefix, start_revision);
        let mut conn = Conn::post(addr, host, "/v3/watch", &body).await?;
        let head = conn.head().await?;
        if head.status != 200 {
            return Err(conn.status_error(&head).await);
        }
        let mut watch = Watch {
            conn,
            decoder: BodyDecoder::new(head.framing()),
            splitter: JsonSplitter::new(MAX_WATCH_OBJECT),
            scratch: Vec::new(),
            ended: false,
        };
        match watch.message().await? {
            WatchMsg::Created => Ok(watch),
            WatchMsg::Events { .. } => Err(EtcdError::Protocol(
                "watch events before its creation was confirmed".into(),
            )),
        }
    }

    /// The next batch of events (never empty; progress notifications are skipped). An
    /// error ends the watch: etcd closed or canceled it, or sent something unreadable.
    /// Not cancel-safe: once a `next()` is dropped while it waits (a timeout, a
    /// `select!`), bytes may be lost and every later call is an error; start a new watch.
    pub async fn next(&mut self) -> Result<Vec<Event>, EtcdError> {
        loop {
            if let WatchMsg::Events { events, .. } = self.message().await?
                && !events.is_empty()
            {
                return Ok(events);
            }
        }
    }

    /// The next object of the stream, decoded.
    async fn message(&mut self) -> Result<WatchMsg, EtcdError> {
        loop {
            if let Some(object) = self.splitter.next_object()? {
                return decode::decode_watch(&object);
            }
            // Bytes may already wait in the connection (they came with the head).
            self.scratch.clear();
            let eof = self.conn.eof;
            let ended = self
                .decoder
                .feed(&mut self.conn.raw, &mut self.scratch, eof)?;
            self.ended |= ended;
            if !self.scratch.is_empty() {
                self.splitter.push(&self.scratch)?;
                continue;
            }
            if self.ended || eof {
                return Err(closed(self.conn.addr, "by etcd mid-watch"));
            }
            self.conn.fill().await?;
        }
    }
}
