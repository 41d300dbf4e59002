//! DNS lookups for the `dns` worker source: A/AAAA (with a configured port) or SRV, asked
//! of one server over UDP (TCP when the answer is truncated). Messages are encoded and
//! decoded by `hickory-proto`; this file is the transport.

use std::net::SocketAddr;
use std::time::Duration;

/// Why a lookup gave no answer. Every error keeps the source's last good membership.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    #[error("DNS server {server} did not answer within {timeout_ms} ms")]
    Timeout { server: SocketAddr, timeout_ms: u64 },
    #[error("`{name}` does not exist (NXDOMAIN)")]
    NoSuchName { name: String },
    #[error("DNS server answered {rcode} for `{name}`")]
    Server { name: String, rcode: String },
    #[error("DNS: {0}")]
    Other(String),
}

/// One SRV target, its address resolved: `host` is the SRV target name (no trailing dot).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SrvTarget {
    pub host: String,
    pub addr: SocketAddr,
}

/// The A and AAAA records of `name` with `port`, sorted and deduplicated. A name that
/// exists with no address records is `Ok(vec![])`.
pub async fn lookup_addrs(
    _server: SocketAddr,
    _name: &str,
    _port: u16,
    _timeout: Duration,
) -> Result<Vec<SocketAddr>, DnsError> {
    Err(DnsError::Other("not built yet".into()))
}

/// The SRV records of `name`, each target's addresses taken from the answer's additional
/// section or else looked up (A and AAAA), sorted and deduplicated.
pub async fn lookup_srv(
    _server: SocketAddr,
    _name: &str,
    _timeout: Duration,
) -> Result<Vec<SrvTarget>, DnsError> {
    Err(DnsError::Other("not built yet".into()))
}

/// The first `nameserver` of `/etc/resolv.conf` (port 53): where lookups go when the
/// config names no server.
pub fn system_server() -> Result<SocketAddr, DnsError> {
    Err(DnsError::Other("not built yet".into()))
}
