//! Name resolution: the configuration's host names turned into socket addresses. It
//! blocks (getaddrinfo), so it runs where blocking is harmless: on the starting thread
//! before any core runs, and on the control thread's blocking pool during a reload, never
//! on a core or in the monitor's loop.

use std::net::{SocketAddr, ToSocketAddrs};

use crate::config::{Addrs, Config, HostPort};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot resolve `{host}`: {reason}")]
pub struct ResolveError {
    pub host: String,
    pub reason: String,
}

/// One `host:port`: IP literals without a lookup, names through the system resolver
/// (first address).
pub fn lookup(hp: &HostPort) -> Result<SocketAddr, ResolveError> {
    if let Some(a) = hp.literal() {
        return Ok(a);
    }
    let err = |reason: String| ResolveError {
        host: hp.host.clone(),
        reason,
    };
    (hp.host.as_str(), hp.port)
        .to_socket_addrs()
        .map_err(|e| err(e.to_string()))?
        .next()
        .ok_or_else(|| err("no address".to_string()))
}

/// [`lookup`] from a runtime's loop: IP literals at once, names on the runtime's blocking
/// pool (never blocking the loop).
pub async fn lookup_off_loop(hp: &HostPort) -> Result<SocketAddr, ResolveError> {
    if let Some(a) = hp.literal() {
        return Ok(a);
    }
    let owned = hp.clone();
    match monoio::spawn_blocking(move || lookup(&owned)).await {
        Ok(r) => r,
        Err(_) => Err(ResolveError {
            host: hp.host.clone(),
            reason: "name resolution was cancelled".into(),
        }),
    }
}

/// Every address of `config` (listeners, workers, metrics endpoints).
pub fn resolve(config: &Config) -> Result<Addrs, ResolveError> {
    Addrs::with(config, lookup)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_localhost() {
        let hp = HostPort::parse("127.0.0.1:7").unwrap();
        assert_eq!(lookup(&hp), Ok("127.0.0.1:7".parse().unwrap()));
        let hp = HostPort::parse("localhost:7").unwrap();
        assert!(lookup(&hp).is_ok_and(|a| a.ip().is_loopback() && a.port() == 7));
        let hp = HostPort::parse("no-such-host.invalid:7").unwrap();
        assert!(lookup(&hp).is_err_and(|e| {
            e.to_string()
                .starts_with("cannot resolve `no-such-host.invalid`")
        }));
    }
}
