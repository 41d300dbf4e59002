//! The client side's read half, with at most one read in flight that survives across
//! phases of the connection.
//!
//! monoio reads take the buffer by value. Dropping an in-flight read would hand the buffer
//! to the driver (and allocate), so the read future is kept in a pinned slot instead
//! (allocated with the reader, once per burst of requests, and re-armed in place): the
//! read issued to watch for a client disconnect while the upstream works simply becomes
//! the read of the next request on a keep-alive connection. A connection that idles gets
//! its buffer back by cancelling that read ([`ClientReader::release`]); only a closing
//! connection ever abandons one.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use monoio::io::{CancelHandle, Canceller};

use super::stream::ClientRead;

use crate::http::limits::{CLIENT_READ_MIN_SPARE, RETAINED_BUF_MAX};

pub type ReadDone = (ClientRead, Vec<u8>, io::Result<usize>);

/// One read appended to `buf`'s spare capacity; `cancel` can end it early.
pub async fn read_more(half: ClientRead, mut buf: Vec<u8>, cancel: CancelHandle) -> ReadDone {
    if buf.capacity() - buf.len() < CLIENT_READ_MIN_SPARE {
        buf.reserve(CLIENT_READ_MIN_SPARE);
    }
    half.read_into(buf, cancel).await
}

/// How [`ClientReader::release`] ended.
pub enum Released {
    /// Nothing had arrived: the half, the (empty) buffer and the canceller are back.
    Idle(ClientRead, Vec<u8>, Canceller),
    /// Bytes arrived before the cancel took effect: they are buffered, keep serving.
    Data,
    /// The client closed, or the read failed.
    Closed,
}

/// The read in flight: one concrete future type ([`read_more`]'s), kept in a slot that is
/// allocated once per [`ClientReader`] and re-armed in place for every read.
trait Slot {
    fn start(self: Pin<&mut Self>, half: ClientRead, buf: Vec<u8>, cancel: CancelHandle);
    /// `Pending` also when no read is in flight.
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ReadDone>;
}

pin_project_lite::pin_project! {
    struct ReadSlot<F> {
        #[pin]
        pending: Option<F>,
        start: fn(ClientRead, Vec<u8>, CancelHandle) -> F,
    }
}

impl<F: Future<Output = ReadDone>> Slot for ReadSlot<F> {
    fn start(self: Pin<&mut Self>, half: ClientRead, buf: Vec<u8>, cancel: CancelHandle) {
        let mut this = self.project();
        let start = *this.start;
        this.pending.set(Some(start(half, buf, cancel)));
    }

    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ReadDone> {
        let mut this = self.project();
        let Some(fut) = this.pending.as_mut().as_pin_mut() else {
            return Poll::Pending;
        };
        let done = std::task::ready!(fut.poll(cx));
        this.pending.set(None);
        Poll::Ready(done)
    }
}

/// A connection's read half with its one read, in flight or not.
pub struct ClientReader {
    slot: Pin<Box<dyn Slot>>,
    idle: Option<(ClientRead, Vec<u8>)>,
    canceller: Option<Canceller>,
}

impl ClientReader {
    pub fn new(half: ClientRead, buf: Vec<u8>, canceller: Canceller) -> Self {
        let slot = ReadSlot {
            pending: None,
            start: read_more,
        };
        ClientReader {
            slot: Box::pin(slot),
            idle: Some((half, buf)),
            canceller: Some(canceller),
        }
    }

    /// Ends the connection's read so that it can idle without a buffer: cancels the read
    /// in flight (if any) and hands back the half and the buffer, which holds no bytes.
    pub async fn release(mut self: Pin<&mut Self>) -> Released {
        if self.is_reading() {
            self.canceller = self.canceller.take().map(Canceller::cancel);
            match std::future::poll_fn(|cx| self.as_mut().poll_read(cx)).await {
                Ok(0) => return Released::Closed,
                Ok(_) => return Released::Data,
                Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ECANCELED as i32) => {}
                Err(_) => return Released::Closed,
            }
        }
        let this = self.get_mut();
        match this.idle.take() {
            Some((half, buf)) if buf.is_empty() => {
                Released::Idle(half, buf, this.canceller.take().unwrap_or_default())
            }
            // Buffered bytes (callers release an empty reader, but never lose them).
            Some(parts) => {
                this.idle = Some(parts);
                Released::Data
            }
            None => Released::Closed,
        }
    }

    /// Buffered bytes; empty while a read is in flight.
    pub fn buf(&self) -> &[u8] {
        self.idle.as_ref().map_or(&[], |(_, b)| b.as_slice())
    }

    /// The buffer, when no read is in flight.
    pub fn buf_mut(self: Pin<&mut Self>) -> Option<&mut Vec<u8>> {
        self.get_mut().idle.as_mut().map(|(_, b)| b)
    }

    pub fn is_reading(&self) -> bool {
        self.idle.is_none()
    }

    /// The buffer, unless a read holds it (then it stays with the read).
    pub fn take_buf(self: Pin<&mut Self>) -> Option<Vec<u8>> {
        self.get_mut().idle.take().map(|(_, buf)| buf)
    }

    /// Drops the first `n` buffered bytes (a finished request), keeping what follows.
    pub fn consume(self: Pin<&mut Self>, n: usize, shrink_to: usize) {
        if let Some(buf) = self.buf_mut() {
            let n = n.min(buf.len());
            buf.copy_within(n.., 0);
            buf.truncate(buf.len() - n);
            if buf.capacity() > RETAINED_BUF_MAX && buf.len() < shrink_to {
                buf.shrink_to(shrink_to);
            }
        }
    }

    /// Makes room for `total` buffered bytes (one allocation for a large body).
    pub fn reserve_total(self: Pin<&mut Self>, total: usize) {
        if let Some(buf) = self.buf_mut().filter(|b| b.capacity() < total) {
            buf.reserve(total - buf.len());
        }
    }

    /// Starts a read unless one is in flight.
    pub fn start(self: Pin<&mut Self>) {
        let this = self.get_mut();
        if let Some((half, buf)) = this.idle.take() {
            let cancel = this.canceller.get_or_insert_with(Canceller::new).handle();
            this.slot.as_mut().start(half, buf, cancel);
        }
    }

    /// Watches for a disconnect while the upstream works: starts a read only when nothing
    /// is buffered. Buffered bytes are a pipelined request that must stay parseable, so a
    /// pipelining client is not watched (its departure still shows on the next write).
    pub fn watch(self: Pin<&mut Self>) {
        if self.idle.as_ref().is_some_and(|(_, b)| b.is_empty()) {
            self.start();
        }
    }

    /// Polls the read in flight. `Ready(Ok(0))` is end of stream. With no read in flight
    /// this stays pending, so a race over it simply never picks this side.
    pub fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.idle.is_some() {
            return Poll::Pending;
        }
        let (half, buf, res) = std::task::ready!(this.slot.as_mut().poll_read(cx));
        this.idle = Some((half, buf));
        Poll::Ready(res)
    }

    /// Reads more bytes into the buffer (starting a read if none is in flight).
    pub async fn fill(mut self: Pin<&mut Self>) -> io::Result<usize> {
        self.as_mut().start();
        std::future::poll_fn(|cx| self.as_mut().poll_read(cx)).await
    }
}
