//! A connection's read side with at most one read in flight, kept across phases: the read
//! that watches for a disconnect while a generation runs becomes the read of the next
//! request, so pipelined bytes are never lost. monoio reads take the buffer by value, so
//! the read in flight owns the read half and the buffer until it completes; a closing
//! connection simply drops it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use monoio::buf::IoBufMut;
use monoio::io::AsyncReadRent;
use monoio::net::tcp::TcpOwnedReadHalf;

/// Minimum free space offered to each read.
const MIN_SPARE: usize = 4096;

/// A buffer larger than this after a request is shrunk back, so one large upload does not
/// pin its memory for the life of an idle keep-alive connection.
const RETAINED_BUF_MAX: usize = 256 * 1024;

type ReadDone = (TcpOwnedReadHalf, Vec<u8>, io::Result<usize>);

/// One read appended to `buf`'s spare capacity.
async fn read_more(mut half: TcpOwnedReadHalf, mut buf: Vec<u8>) -> ReadDone {
    if buf.capacity() - buf.len() < MIN_SPARE {
        buf.reserve(MIN_SPARE);
    }
    let len = buf.len();
    let (res, slice) = half.read(buf.slice_mut(len..)).await;
    (half, slice.into_inner(), res)
}

/// The read half and its buffer: idle, or lent to the read in flight.
pub struct Reader {
    idle: Option<(TcpOwnedReadHalf, Vec<u8>)>,
    pending: Option<Pin<Box<dyn Future<Output = ReadDone>>>>,
}

impl Reader {
    pub fn new(half: TcpOwnedReadHalf, buf: Vec<u8>) -> Reader {
        Reader {
            idle: Some((half, buf)),
            pending: None,
        }
    }

    /// Buffered bytes; empty while a read is in flight.
    pub fn buf(&self) -> &[u8] {
        self.idle.as_ref().map_or(&[], |(_, b)| b.as_slice())
    }

    pub fn is_reading(&self) -> bool {
        self.idle.is_none()
    }

    /// Drops the first `n` buffered bytes (a finished request), keeping what follows. A
    /// buffer that grew for one large body shrinks back to `shrink_to`.
    pub fn consume(&mut self, n: usize, shrink_to: usize) {
        if let Some((_, buf)) = &mut self.idle {
            buf.drain(..n.min(buf.len()));
            if buf.capacity() > RETAINED_BUF_MAX && buf.len() < shrink_to {
                buf.shrink_to(shrink_to);
            }
        }
    }

    /// Makes room for `total` buffered bytes (one allocation for a large body).
    pub fn reserve_total(&mut self, total: usize) {
        if let Some((_, buf)) = self.idle.as_mut().filter(|(_, b)| b.capacity() < total) {
            buf.reserve(total - buf.len());
        }
    }

    /// Starts a read unless one is in flight.
    fn start(&mut self) {
        if let Some((half, buf)) = self.idle.take() {
            self.pending = Some(Box::pin(read_more(half, buf)));
        }
    }

    /// Watches for a disconnect while a generation runs: starts a read only when nothing
    /// is buffered. Buffered bytes are a pipelined request that must stay parseable, so a
    /// pipelining client is not watched (its departure still shows on the next write).
    pub fn watch(&mut self) {
        if self.idle.as_ref().is_some_and(|(_, b)| b.is_empty()) {
            self.start();
        }
    }

    /// Polls the read in flight. `Ready(Ok(0))` is end of stream. With no read in flight
    /// this stays pending, so a race over it simply never picks this side.
    pub fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Some(fut) = self.pending.as_mut() else {
            return Poll::Pending;
        };
        let (half, buf, res) = std::task::ready!(fut.as_mut().poll(cx));
        self.pending = None;
        self.idle = Some((half, buf));
        Poll::Ready(res)
    }

    /// Reads more bytes into the buffer (starting a read if none is in flight).
    pub async fn fill(&mut self) -> io::Result<usize> {
        self.start();
        std::future::poll_fn(|cx| self.poll_read(cx)).await
    }
}
