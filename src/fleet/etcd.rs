//! An etcd v3 client for the `etcd` worker source, over etcd's documented JSON gateway
//! (`POST /v3/kv/range`, `POST /v3/watch`; keys and values base64): a prefix is read with
//! its revision, then watched from the next revision.

use std::net::SocketAddr;
use std::time::Duration;

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

/// Every key under `prefix` and the store's revision at the read.
pub async fn range_prefix(
    addr: SocketAddr,
    _host: &str,
    _prefix: &str,
    _timeout: Duration,
) -> Result<(i64, Vec<Kv>), EtcdError> {
    Err(EtcdError::Io {
        addr,
        reason: "not built yet".into(),
    })
}

/// A watch on a prefix: one long HTTP response whose chunks carry JSON results.
#[derive(Debug)]
pub struct Watch {
    _private: (),
}

impl Watch {
    /// Opens a watch of `prefix` from `start_revision` (inclusive); returns once etcd
    /// has confirmed it (or `timeout` passed).
    pub async fn start(
        addr: SocketAddr,
        _host: &str,
        _prefix: &str,
        _start_revision: i64,
        _timeout: Duration,
    ) -> Result<Watch, EtcdError> {
        Err(EtcdError::Io {
            addr,
            reason: "not built yet".into(),
        })
    }

    /// The next batch of events (never empty; progress notifications are skipped). An
    /// error ends the watch.
    pub async fn next(&mut self) -> Result<Vec<Event>, EtcdError> {
        Err(EtcdError::Protocol("not built yet".into()))
    }
}
