//! A NATS client for load fan-out, over NATS's documented text protocol (`CONNECT`,
//! `SUB`, `PUB`, `MSG`, `PING`/`PONG`): [`proto`] is the sans-io codec, [`Subscriber`] and
//! [`Publisher`] run it on a monoio connection each.

use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NatsError {
    #[error("NATS {addr}: {reason}")]
    Io { addr: SocketAddr, reason: String },
    #[error("NATS server error: {0}")]
    Server(String),
    #[error("NATS protocol: {0}")]
    Protocol(String),
}

/// A message received on a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub subject: String,
    pub payload: Vec<u8>,
}

/// A connection subscribed to one subject (wildcards allowed); answers the server's
/// `PING`s itself.
#[derive(Debug)]
pub struct Subscriber {
    _private: (),
}

impl Subscriber {
    pub async fn connect(
        addr: SocketAddr,
        _client_name: &str,
        _subject: &str,
        _timeout: Duration,
    ) -> Result<Subscriber, NatsError> {
        Err(NatsError::Io {
            addr,
            reason: "not built yet".into(),
        })
    }

    /// The next message; an error ends the connection.
    pub async fn next(&mut self) -> Result<Msg, NatsError> {
        Err(NatsError::Protocol("not built yet".into()))
    }
}

/// A connection that publishes; it also answers the server's `PING`s.
#[derive(Debug)]
pub struct Publisher {
    _private: (),
}

impl Publisher {
    pub async fn connect(
        addr: SocketAddr,
        _client_name: &str,
        _timeout: Duration,
    ) -> Result<Publisher, NatsError> {
        Err(NatsError::Io {
            addr,
            reason: "not built yet".into(),
        })
    }

    /// Publishes `payload` on `subject`; an error ends the connection.
    pub async fn publish(&mut self, _subject: &str, _payload: &[u8]) -> Result<(), NatsError> {
        Err(NatsError::Protocol("not built yet".into()))
    }
}
