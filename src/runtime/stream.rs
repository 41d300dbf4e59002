//! The data path's streams, plain TCP or TLS: a client connection's two halves, and a
//! worker connection ([`Upstream`]). With TLS each read opens the records it brought in
//! (into the caller's buffer) and each write seals its bytes first
//! ([`crate::runtime::tls`]).

use std::io;

use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt, CancelHandle, CancelableAsyncReadRent};
use monoio::net::TcpStream;
use monoio::net::tcp::{TcpOwnedReadHalf, TcpOwnedWriteHalf};

use super::tls::{Rx, Tx};

/// The longest a closing TLS connection waits to write its close_notify.
pub const CLOSE_NOTIFY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The read half.
pub enum ClientRead {
    Plain(TcpOwnedReadHalf),
    Tls(TcpOwnedReadHalf, Box<Rx>),
}

/// The write half.
pub enum ClientWrite {
    Plain(TcpOwnedWriteHalf),
    Tls(TcpOwnedWriteHalf, Box<Tx>),
}

impl std::fmt::Debug for ClientRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_tls() {
            "ClientRead::Tls"
        } else {
            "ClientRead::Plain"
        })
    }
}

impl std::fmt::Debug for ClientWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClientWrite::Plain(_) => "ClientWrite::Plain",
            ClientWrite::Tls(..) => "ClientWrite::Tls",
        })
    }
}

impl ClientRead {
    pub fn is_tls(&self) -> bool {
        matches!(self, ClientRead::Tls(..))
    }

    /// The socket, for a parked connection's probe read.
    pub fn tcp(&mut self) -> &mut TcpOwnedReadHalf {
        match self {
            ClientRead::Plain(h) | ClientRead::Tls(h, _) => h,
        }
    }

    /// A parked connection woke with `probe` read from the socket: plain bytes go to the
    /// request buffer, TLS bytes to the record stream.
    pub fn absorb_probe(&mut self, probe: &[u8], buf: &mut Vec<u8>) {
        match self {
            ClientRead::Plain(_) => buf.extend_from_slice(probe),
            ClientRead::Tls(_, rx) => rx.absorb(probe),
        }
    }

    /// The connection parks: buffers it can do without go.
    pub fn park(&mut self) {
        if let ClientRead::Tls(_, rx) = self {
            rx.park();
        }
    }

    /// One read, appended to `buf`'s spare room (with TLS: the plaintext of the records
    /// it completed, reading again while none is complete). `Ok(0)`: end of stream.
    pub async fn read_into(
        self,
        mut buf: Vec<u8>,
        cancel: CancelHandle,
    ) -> (ClientRead, Vec<u8>, io::Result<usize>) {
        match self {
            ClientRead::Plain(mut half) => {
                let len = buf.len();
                let (res, slice) = half.cancelable_read(buf.slice_mut(len..), cancel).await;
                (ClientRead::Plain(half), slice.into_inner(), res)
            }
            ClientRead::Tls(mut half, mut rx) => {
                let res = loop {
                    match rx.open_into(&mut buf) {
                        Ok(0) if rx.is_closed() => break Ok(0),
                        Ok(0) => {}
                        done => break done,
                    }
                    let (cipher, len) = rx.read_buf();
                    let (res, slice) = half
                        .cancelable_read(cipher.slice_mut(len..), cancel.clone())
                        .await;
                    rx.read_done(slice.into_inner());
                    match res {
                        Ok(0) => break Ok(0),
                        Ok(_) => {}
                        Err(e) => break Err(e),
                    }
                };
                (ClientRead::Tls(half, rx), buf, res)
            }
        }
    }
}

impl ClientWrite {
    /// Writes the first `n` bytes of `buf` (sealed first, with TLS) and gives `buf` back.
    pub async fn write_prefix(&mut self, buf: Vec<u8>, n: usize) -> (io::Result<()>, Vec<u8>) {
        match self {
            ClientWrite::Plain(half) => {
                let (res, slice) = half.write_all(buf.slice(..n)).await;
                (res.map(drop), slice.into_inner())
            }
            ClientWrite::Tls(half, tx) => {
                if let Err(e) = tx.seal(&buf[..n]) {
                    return (Err(e), buf);
                }
                let (res, sealed) = half.write_all(std::mem::take(&mut tx.sealed)).await;
                tx.sealed = sealed;
                (res.map(drop), buf)
            }
        }
    }

    /// The connection parks: buffers it can do without go.
    pub fn park(&mut self) {
        if let ClientWrite::Tls(_, tx) = self {
            tx.park();
        }
    }

    /// TLS: a close_notify alert before the connection closes, best effort (a peer that
    /// reads nothing gets [`CLOSE_NOTIFY_WAIT`]).
    pub async fn close_notify(&mut self) {
        if let ClientWrite::Tls(half, tx) = self
            && tx.close_notify().is_ok()
        {
            let write = half.write_all(std::mem::take(&mut tx.sealed));
            let _ = monoio::time::timeout(CLOSE_NOTIFY_WAIT, write).await;
        }
    }

    /// Writes a constant (`100 Continue`).
    pub async fn write_static(&mut self, bytes: &'static [u8]) -> io::Result<()> {
        match self {
            ClientWrite::Plain(half) => half.write_all(bytes).await.0.map(drop),
            ClientWrite::Tls(half, tx) => {
                tx.seal(bytes)?;
                let (res, sealed) = half.write_all(std::mem::take(&mut tx.sealed)).await;
                tx.sealed = sealed;
                res.map(drop)
            }
        }
    }
}

/// A connection to a worker, plain or TLS (`https://` workers), used whole.
pub enum Upstream {
    Plain(TcpStream),
    Tls(TcpStream, Box<(Rx, Tx)>),
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Upstream::Plain(_) => "Upstream::Plain",
            Upstream::Tls(..) => "Upstream::Tls",
        })
    }
}

impl Upstream {
    /// The socket (a pooled connection's liveness peek).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Upstream::Plain(s) | Upstream::Tls(s, _) => s,
        }
    }

    /// One read appended to `buf`'s spare room (with TLS: the plaintext of the records it
    /// completed). `Ok(0)`: end of stream.
    pub async fn read_into(&mut self, buf: Vec<u8>) -> (io::Result<usize>, Vec<u8>) {
        match self {
            Upstream::Plain(s) => {
                let len = buf.len();
                let (res, slice) = s.read(buf.slice_mut(len..)).await;
                (res, slice.into_inner())
            }
            Upstream::Tls(s, session) => {
                let mut buf = buf;
                let rx = &mut session.0;
                loop {
                    match rx.open_into(&mut buf) {
                        Ok(0) if rx.is_closed() => return (Ok(0), buf),
                        Ok(0) => {}
                        done => return (done, buf),
                    }
                    let (cipher, len) = rx.read_buf();
                    let (res, slice) = s.read(cipher.slice_mut(len..)).await;
                    rx.read_done(slice.into_inner());
                    match res {
                        Ok(0) => return (Ok(0), buf),
                        Ok(_) => {}
                        Err(e) => return (Err(e), buf),
                    }
                }
            }
        }
    }

    /// Writes all of `buf` (sealed first, with TLS) and gives it back.
    pub async fn write_all(&mut self, buf: Vec<u8>) -> (io::Result<()>, Vec<u8>) {
        match self {
            Upstream::Plain(s) => {
                let (res, buf) = s.write_all(buf).await;
                (res.map(drop), buf)
            }
            Upstream::Tls(s, session) => {
                let tx = &mut session.1;
                if let Err(e) = tx.seal(&buf) {
                    return (Err(e), buf);
                }
                let (res, sealed) = s.write_all(std::mem::take(&mut tx.sealed)).await;
                tx.sealed = sealed;
                (res.map(drop), buf)
            }
        }
    }
}
