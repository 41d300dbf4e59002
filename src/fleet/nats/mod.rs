//! A NATS client for load fan-out, over NATS's documented text protocol (`CONNECT`,
//! `SUB`, `PUB`, `MSG`, `PING`/`PONG`): [`proto`] is the sans-io codec, [`Subscriber`] and
//! [`Publisher`] run it on a monoio connection each. Both connect in one bounded step
//! (`INFO`, then `CONNECT`, `SUB` for a subscriber, and `PING` until the `PONG`), ask for no
//! headers, no echo and no `+OK`s, and answer the server's keep-alive `PING`s.

pub mod proto;
mod publisher;
mod wire;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use monoio::io::Canceller;
use monoio::net::TcpStream;

use proto::ServerOp;
pub use publisher::Publisher;
use wire::{ReadBuf, io_error, send};

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

/// Connects to `addr` and runs [`wire::handshake`], all within `timeout`.
async fn open(
    addr: SocketAddr,
    name: &str,
    subject: Option<&str>,
    timeout: Duration,
    early: &mut VecDeque<Msg>,
) -> Result<(TcpStream, ReadBuf), NatsError> {
    if let Some(subject) = subject {
        proto::validate_subject(subject)?;
    }
    let steps = async {
        let mut stream = TcpStream::connect_addr(addr)
            .await
            .map_err(|e| io_error(addr, format!("connect: {e}")))?;
        // Small writes (a PONG, a short PUB) go out at once.
        let _ = stream.set_nodelay(true);
        let mut rb = ReadBuf::new();
        wire::handshake(&mut stream, &mut rb, name, subject, addr, early).await?;
        Ok((stream, rb))
    };
    match monoio::time::timeout(timeout, steps).await {
        Ok(done) => done,
        Err(_) => Err(io_error(
            addr,
            format!("no handshake within {} ms", timeout.as_millis()),
        )),
    }
}

/// A connection subscribed to one subject (wildcards allowed); answers the server's
/// `PING`s itself, while [`Subscriber::next`] waits.
pub struct Subscriber {
    addr: SocketAddr,
    stream: TcpStream,
    rb: ReadBuf,
    /// Messages read during the handshake, before its `PONG`.
    early: VecDeque<Msg>,
    cancel: Canceller,
    /// Writing a `PONG`; still set when `next` was dropped mid-write.
    writing: bool,
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Subscriber {
    /// Connects, subscribes to `subject` and waits for the server to confirm it (its `PONG`
    /// to our `PING`), all within `timeout`: a message published after this returns is
    /// delivered.
    pub async fn connect(
        addr: SocketAddr,
        client_name: &str,
        subject: &str,
        timeout: Duration,
    ) -> Result<Subscriber, NatsError> {
        let mut early = VecDeque::new();
        let (stream, rb) = open(addr, client_name, Some(subject), timeout, &mut early).await?;
        Ok(Subscriber {
            addr,
            stream,
            rb,
            early,
            cancel: Canceller::new(),
            writing: false,
        })
    }

    /// Whether [`Subscriber::next`] has a whole message buffered, so that it returns
    /// without waiting for the network: callers apply the messages of one read together.
    pub fn buffered(&self) -> bool {
        !self.early.is_empty() || matches!(self.rb.parse(), Ok(Some((ServerOp::Msg { .. }, _))))
    }

    /// The next message; an error ends the connection (`-ERR` is [`NatsError::Server`],
    /// the end of the stream or a failed read [`NatsError::Io`]). Not cancel-safe: after
    /// a timeout drops this future mid-read, the subscriber only returns errors.
    pub async fn next(&mut self) -> Result<Msg, NatsError> {
        if self.writing {
            return Err(NatsError::Protocol(
                "a cancelled PONG left the connection mid-write".into(),
            ));
        }
        if let Some(msg) = self.early.pop_front() {
            return Ok(msg);
        }
        loop {
            let Some((op, used)) = self.rb.parse()? else {
                let cancel = self.cancel.handle();
                self.rb.fill(&mut self.stream, cancel, self.addr).await?;
                continue;
            };
            match op {
                ServerOp::Msg {
                    subject, payload, ..
                } => {
                    let msg = Msg {
                        subject: subject.to_owned(),
                        payload: payload.to_vec(),
                    };
                    self.rb.consume(used);
                    return Ok(msg);
                }
                ServerOp::Err(msg) => return Err(NatsError::Server(msg.to_owned())),
                ServerOp::Ping => {
                    self.rb.consume(used);
                    self.writing = true;
                    send(&mut self.stream, proto::PONG, self.addr).await.0?;
                    self.writing = false;
                }
                ServerOp::Pong | ServerOp::Ok | ServerOp::Info(_) => self.rb.consume(used),
            }
        }
    }
}
