//! The I/O both connections share: one read buffer reused for every read, the write of a
//! whole buffer, and the handshake (`INFO`, then `CONNECT`, an optional `SUB` and `PING`,
//! until the `PONG`).

use std::collections::VecDeque;
use std::net::SocketAddr;

use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{AsyncWriteRent, AsyncWriteRentExt, CancelHandle, CancelableAsyncReadRent};

use super::proto::{self, ServerOp};
use super::{Msg, NatsError};

/// Bytes asked of each read; the buffer grows past it only for a larger message.
const READ_CHUNK: usize = 64 * 1024;
/// The sid of a subscriber's one subscription.
pub(super) const SID: u64 = 1;

pub(super) fn io_error(addr: SocketAddr, reason: impl Into<String>) -> NatsError {
    NatsError::Io {
        addr,
        reason: reason.into(),
    }
}

/// Received bytes not yet parsed: `buf[pos..]`. Reused for the connection's life, so in
/// steady state a read neither allocates nor moves more than a partial operation.
pub(super) struct ReadBuf {
    buf: Vec<u8>,
    pos: usize,
    /// A read was under way when its future was dropped: the stream lost its place.
    reading: bool,
    pub(super) max_payload: usize,
}

impl ReadBuf {
    pub(super) fn new() -> ReadBuf {
        ReadBuf {
            buf: Vec::with_capacity(READ_CHUNK),
            pos: 0,
            reading: false,
            max_payload: proto::DEFAULT_MAX_PAYLOAD,
        }
    }

    /// The next complete operation and the bytes it takes; pass them to [`Self::consume`].
    pub(super) fn parse(&self) -> Result<Option<(ServerOp<'_>, usize)>, NatsError> {
        if self.reading {
            return Err(NatsError::Protocol(
                "a cancelled read left the connection mid-stream".into(),
            ));
        }
        proto::parse(
            self.buf.get(self.pos..).unwrap_or_default(),
            self.max_payload,
        )
    }

    pub(super) fn consume(&mut self, used: usize) {
        self.pos = (self.pos + used).min(self.buf.len());
    }

    /// Reads more bytes; the end of the stream is an error.
    pub(super) async fn fill<R: CancelableAsyncReadRent>(
        &mut self,
        reader: &mut R,
        cancel: CancelHandle,
        addr: SocketAddr,
    ) -> Result<(), NatsError> {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 2 && self.pos > 0 {
            self.buf.copy_within(self.pos.., 0);
            self.buf.truncate(self.buf.len() - self.pos);
            self.pos = 0;
        }
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 2 {
            self.buf.reserve(READ_CHUNK);
        }
        let len = self.buf.len();
        self.reading = true;
        let buf = std::mem::take(&mut self.buf);
        let (res, slice) = reader.cancelable_read(buf.slice_mut(len..), cancel).await;
        self.buf = slice.into_inner();
        self.reading = false;
        match res {
            Ok(0) => Err(io_error(addr, "connection closed by the server")),
            Ok(_) => Ok(()),
            Err(e) => Err(io_error(addr, format!("read: {e}"))),
        }
    }
}

/// Writes all of `buf` and hands it back for reuse.
pub(super) async fn send<W: AsyncWriteRent, B: IoBuf + 'static>(
    writer: &mut W,
    buf: B,
    addr: SocketAddr,
) -> (Result<(), NatsError>, B) {
    let (res, buf) = writer.write_all(buf).await;
    (
        res.map(drop)
            .map_err(|e| io_error(addr, format!("write: {e}"))),
        buf,
    )
}

/// Reads the server's `INFO` (which sets the payload bound), sends `CONNECT`, `SUB` when
/// `subject` is given, and `PING`, and waits for the `PONG`: the server has then applied
/// the subscription. Messages that arrive before it are kept in `early`.
pub(super) async fn handshake<S>(
    stream: &mut S,
    rb: &mut ReadBuf,
    name: &str,
    subject: Option<&str>,
    addr: SocketAddr,
    early: &mut VecDeque<Msg>,
) -> Result<(), NatsError>
where
    S: CancelableAsyncReadRent + AsyncWriteRent,
{
    let cancel = monoio::io::Canceller::new();
    loop {
        let Some((op, used)) = rb.parse()? else {
            rb.fill(stream, cancel.handle(), addr).await?;
            continue;
        };
        let ServerOp::Info(json) = op else {
            return Err(NatsError::Protocol(
                "the server did not start with INFO".into(),
            ));
        };
        rb.max_payload = proto::info_max_payload(json)?;
        rb.consume(used);
        break;
    }
    let mut out = Vec::with_capacity(256);
    proto::write_connect(&mut out, name, env!("CARGO_PKG_VERSION"));
    if let Some(subject) = subject {
        proto::write_sub(&mut out, subject, SID)?;
    }
    out.extend_from_slice(proto::PING);
    send(stream, out, addr).await.0?;
    loop {
        let Some((op, used)) = rb.parse()? else {
            rb.fill(stream, cancel.handle(), addr).await?;
            continue;
        };
        match op {
            ServerOp::Pong => {
                rb.consume(used);
                return Ok(());
            }
            ServerOp::Err(msg) => return Err(NatsError::Server(msg.to_owned())),
            ServerOp::Msg {
                subject, payload, ..
            } => early.push_back(Msg {
                subject: subject.to_owned(),
                payload: payload.to_vec(),
            }),
            ServerOp::Ping => {
                rb.consume(used);
                send(stream, proto::PONG, addr).await.0?;
                continue;
            }
            ServerOp::Info(_) | ServerOp::Ok => {}
        }
        rb.consume(used);
    }
}
