//! A watch on a kept-alive connection's socket while nothing is expected on it: a read
//! armed on a duplicate of the socket's descriptor (io_uring: one receive in the ring;
//! epoll: the descriptor's readiness), so the connection itself stays free for writes.
//!
//! An idle upstream connection must carry nothing: any byte (the rest of a body longer
//! than its length, an unsolicited response) or a FIN makes it unusable. The pool arms the
//! read when a connection goes idle ([`IdleWatch::arm`]) and asks on reuse whether it
//! completed ([`IdleWatch::fired`]). When it has not, it stays armed through the request
//! and becomes the first read of the response ([`IdleWatch::poll_read`]): the watch costs
//! no operation of its own, only an earlier submission of a read the response needs
//! anyway, into a small buffer of the connection's own ([`WATCH_READ_BUF`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use monoio::buf::IoBufMut;
use monoio::io::AsyncReadRent;
use monoio::net::TcpStream;

/// The buffer of a connection's armed read (most heads of a response, and short answers
/// whole, fit; the rest is read into the relay's buffer).
pub const WATCH_READ_BUF: usize = 4 * 1024;

/// The armed read: it owns the duplicate and the buffer and gives both back.
async fn read(mut fd: TcpStream, mut buf: Vec<u8>) -> (TcpStream, Vec<u8>, io::Result<usize>) {
    buf.clear();
    let (res, slice) = fd.read(buf.slice_mut(0..)).await;
    (fd, slice.into_inner(), res)
}

type ReadDone = (TcpStream, Vec<u8>, io::Result<usize>);

pin_project_lite::pin_project! {
    /// The read in flight (`armed`), or the descriptor and buffer between reads, with
    /// what the last read brought (`done`) until it is taken.
    struct Slot<F> {
        #[pin]
        armed: Option<F>,
        idle: Option<(TcpStream, Vec<u8>)>,
        done: Option<io::Result<usize>>,
        start: fn(TcpStream, Vec<u8>) -> F,
    }
}

/// [`Slot`] without its future's type, which cannot be named.
trait Watch {
    fn poll_armed(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()>;
    fn arm(self: Pin<&mut Self>);
    fn take_done(self: Pin<&mut Self>) -> Option<io::Result<usize>>;
    fn data(&self) -> &[u8];
}

impl<F: Future<Output = ReadDone>> Watch for Slot<F> {
    /// Ready once the armed read completed (or when none is armed).
    fn poll_armed(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        let Some(read) = this.armed.as_mut().as_pin_mut() else {
            return Poll::Ready(());
        };
        let (fd, buf, res) = std::task::ready!(read.poll(cx));
        this.armed.set(None);
        *this.idle = Some((fd, buf));
        *this.done = Some(res);
        Poll::Ready(())
    }

    fn arm(self: Pin<&mut Self>) {
        let mut this = self.project();
        if let Some((fd, buf)) = this.idle.take() {
            *this.done = None;
            let start = *this.start;
            this.armed.set(Some(start(fd, buf)));
        }
    }

    fn take_done(self: Pin<&mut Self>) -> Option<io::Result<usize>> {
        self.project().done.take()
    }

    fn data(&self) -> &[u8] {
        self.idle
            .as_ref()
            .map_or(&[][..], |(_, buf)| buf.as_slice())
    }
}

/// The watch of one connection (allocated once, with the connection).
pub struct IdleWatch {
    slot: Pin<Box<dyn Watch>>,
}

impl IdleWatch {
    /// Watches the socket that `fd` duplicates.
    pub fn new(fd: TcpStream) -> IdleWatch {
        let slot = Slot {
            armed: None,
            idle: Some((fd, Vec::with_capacity(WATCH_READ_BUF))),
            done: None,
            start: read,
        };
        IdleWatch {
            slot: Box::pin(slot),
        }
    }

    /// The connection goes idle: arms the read, whose completion wakes `waker`. True
    /// when something already arrived (the connection must not be kept).
    pub fn arm(&mut self, waker: &Waker) -> bool {
        self.slot.as_mut().arm();
        self.poll(waker)
    }

    /// Whether anything arrived since [`IdleWatch::arm`] (the connection is unusable).
    /// The read stays armed for the response; it wakes nobody until then.
    pub fn fired(&mut self) -> bool {
        self.poll(Waker::noop())
    }

    /// [`IdleWatch::fired`], with `waker` woken when it fires later.
    pub fn poll(&mut self, waker: &Waker) -> bool {
        let polled = self
            .slot
            .as_mut()
            .poll_armed(&mut Context::from_waker(waker));
        polled.is_ready()
    }

    /// The armed read as the response's first read: pending until it completes, then
    /// its result, the bytes in [`IdleWatch::data`] (`None` when no read is armed: read
    /// the connection itself).
    pub fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<usize>>> {
        std::task::ready!(self.slot.as_mut().poll_armed(cx));
        Poll::Ready(self.slot.as_mut().take_done())
    }

    /// What the last armed read brought (until the next [`IdleWatch::arm`]).
    pub fn data(&self) -> &[u8] {
        self.slot.data()
    }
}

impl std::fmt::Debug for IdleWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdleWatch")
    }
}
