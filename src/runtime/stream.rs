//! A client connection's two halves, plain TCP or TLS. The request loop reads and writes
//! through these; with TLS each read opens the records it brought in (into the request
//! buffer) and each write seals its bytes first ([`crate::runtime::tls`]).

use std::io;

use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{AsyncWriteRentExt, CancelHandle, CancelableAsyncReadRent};
use monoio::net::tcp::{TcpOwnedReadHalf, TcpOwnedWriteHalf};

use super::tls::{Rx, Tx};

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
