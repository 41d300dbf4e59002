//! A watch on a kept-alive connection's socket while nothing is expected on it: one
//! readiness poll on a duplicate of the socket's descriptor (io_uring: a single
//! `POLL_ADD`; epoll: the descriptor's readiness, confirmed by poll(2) when it changed),
//! so the connection itself stays free for reads and writes while the poll is armed.
//!
//! An idle upstream connection must carry nothing: any byte (the rest of a body longer
//! than its length, an unsolicited response) or a FIN makes it unusable. The pool arms the
//! watch when a connection goes idle ([`IdleWatch::arm`]) and asks on reuse whether it
//! fired ([`IdleWatch::fired`]); the poll stays armed through the next exchange, where the
//! response's first bytes complete it, so each request costs one poll and no cancel.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use monoio::net::TcpStream;

/// The watch's poll: it owns its descriptor and gives it back when it completes.
async fn readable(fd: TcpStream) -> TcpStream {
    // An error completes the poll as readiness does: the connection is not to be reused.
    let _ = fd.readable(false).await;
    fd
}

pin_project_lite::pin_project! {
    /// The poll in flight (`armed`), or the descriptor between polls.
    struct Slot<F> {
        #[pin]
        armed: Option<F>,
        fd: Option<TcpStream>,
        start: fn(TcpStream) -> F,
    }
}

/// [`Slot`] without its future's type, which cannot be named.
trait Watch {
    fn poll_fired(self: Pin<&mut Self>, cx: &mut Context<'_>) -> bool;
    fn arm(self: Pin<&mut Self>, cx: &mut Context<'_>) -> bool;
}

impl<F: Future<Output = TcpStream>> Watch for Slot<F> {
    fn poll_fired(self: Pin<&mut Self>, cx: &mut Context<'_>) -> bool {
        let mut this = self.project();
        let Some(poll) = this.armed.as_mut().as_pin_mut() else {
            // Not armed: nothing watched the socket, so nothing vouches for it.
            return true;
        };
        match poll.poll(cx) {
            Poll::Ready(fd) => {
                this.armed.set(None);
                *this.fd = Some(fd);
                true
            }
            Poll::Pending => false,
        }
    }

    fn arm(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> bool {
        // The poll armed when the connection last went idle completed when the response
        // arrived; it may still be pending (epoll re-waits once the response is read).
        if !self
            .as_mut()
            .poll_fired(&mut Context::from_waker(Waker::noop()))
        {
            return self.poll_fired(cx);
        }
        let mut this = self.as_mut().project();
        if let Some(fd) = this.fd.take() {
            let start = *this.start;
            this.armed.set(Some(start(fd)));
        }
        self.poll_fired(cx)
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
            fd: Some(fd),
            start: readable,
        };
        IdleWatch {
            slot: Box::pin(slot),
        }
    }

    /// The connection goes idle: (re)arms the poll, whose completion wakes `waker`.
    /// True when something already arrived (the connection must not be kept).
    pub fn arm(&mut self, waker: &Waker) -> bool {
        self.slot.as_mut().arm(&mut Context::from_waker(waker))
    }

    /// Whether anything arrived since [`IdleWatch::arm`] (the connection is unusable).
    /// Later completions of the poll, as the next response arrives, wake nobody.
    pub fn fired(&mut self) -> bool {
        self.poll(Waker::noop())
    }

    /// [`IdleWatch::fired`], with `waker` woken when it fires later.
    pub fn poll(&mut self, waker: &Waker) -> bool {
        self.slot
            .as_mut()
            .poll_fired(&mut Context::from_waker(waker))
    }
}

impl std::fmt::Debug for IdleWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdleWatch")
    }
}
