//! The data path's streams, plain TCP or TLS: a client connection's two halves, and a
//! worker connection ([`Upstream`]). With TLS each read opens the records it brought in
//! (into the caller's buffer) and each write seals its bytes first
//! ([`crate::runtime::tls_io`]). An upstream connection carries the watch that keeps it
//! from being reused after anything arrived while it was idle.

use std::io;
use std::net::SocketAddr;
use std::task::Waker;

use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt, CancelHandle, CancelableAsyncReadRent};
use monoio::net::TcpStream;
use monoio::net::tcp::{TcpOwnedReadHalf, TcpOwnedWriteHalf};
use socket2::{Domain, Protocol, Socket, Type};

use super::idle_watch::IdleWatch;

use super::tls_io::{Rx, Tx};

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

/// A connection to a worker, plain or TLS (`https://` workers), used whole, with the
/// watch that tells whether anything arrived while it was idle ([`IdleWatch`]).
pub struct Upstream {
    link: Link,
    watch: IdleWatch,
}

enum Link {
    Plain(TcpStream),
    Tls(TcpStream, Box<(Rx, Tx)>),
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.link {
            Link::Plain(_) => "Upstream::Plain",
            Link::Tls(..) => "Upstream::Tls",
        })
    }
}

impl Upstream {
    /// A new TCP connection to `addr` (TCP_NODELAY). The socket is connected without
    /// blocking and duplicated first, so that the idle watch polls its own descriptor.
    pub async fn connect(addr: SocketAddr) -> io::Result<Upstream> {
        let socket = Socket::new(
            Domain::for_address(addr),
            Type::STREAM.nonblocking(),
            Some(Protocol::TCP),
        )?;
        socket.set_tcp_nodelay(true)?;
        match socket.connect(&addr.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EINPROGRESS as i32) => {}
            Err(e) => return Err(e),
        }
        let tcp = std::net::TcpStream::from(socket);
        let watch = TcpStream::from_std(tcp.try_clone()?)?;
        watch.writable(false).await?;
        if let Some(e) = tcp.take_error()? {
            return Err(e);
        }
        // io_uring waits in the kernel on blocking sockets (monoio makes its own so);
        // epoll needs them non-blocking.
        if !monoio::utils::is_legacy() {
            tcp.set_nonblocking(false)?;
        }
        Ok(Upstream {
            link: Link::Plain(TcpStream::from_std(tcp)?),
            watch: IdleWatch::new(watch),
        })
    }

    /// The TCP stream, for the TLS handshake of an `https://` worker.
    pub fn tcp_mut(&mut self) -> &mut TcpStream {
        match &mut self.link {
            Link::Plain(s) | Link::Tls(s, _) => s,
        }
    }

    /// From here on, records sealed and opened with `session`'s keys.
    pub fn secure(self, session: Box<(Rx, Tx)>) -> Upstream {
        let Upstream { link, watch } = self;
        let (Link::Plain(tcp) | Link::Tls(tcp, _)) = link;
        Upstream {
            link: Link::Tls(tcp, session),
            watch,
        }
    }

    /// The connection goes idle in a pool: its watch is armed and wakes `waker` when
    /// anything arrives. False when something already has (do not keep it).
    pub fn go_idle(&mut self, waker: &Waker) -> bool {
        !self.watch.arm(waker)
    }

    /// Whether anything (a byte, a FIN, an error) arrived since it went idle; `waker`
    /// is woken when something does later.
    pub fn stirred(&mut self, waker: &Waker) -> bool {
        self.watch.poll(waker)
    }

    /// Taken from the pool for a request: whether it may carry it (nothing arrived
    /// while it was idle). The watch's read stays armed for the response.
    pub fn reusable(&mut self) -> bool {
        !self.watch.fired()
    }

    /// One read appended to `buf`'s spare room (with TLS: the plaintext of the records it
    /// completed). `Ok(0)`: end of stream. The first read after the connection was reused
    /// is the read its watch armed while it idled.
    pub async fn read_into(&mut self, mut buf: Vec<u8>) -> (io::Result<usize>, Vec<u8>) {
        if let Some(res) = std::future::poll_fn(|cx| self.watch.poll_read(cx)).await {
            let data = self.watch.data();
            match (&mut self.link, res) {
                (Link::Plain(_), Ok(n)) => {
                    buf.extend_from_slice(data);
                    return (Ok(n), buf);
                }
                // Ciphertext: it joins the record stream, opened below.
                (Link::Tls(_, session), Ok(n)) if n > 0 => session.0.absorb(data),
                (_, res) => return (res, buf),
            }
        }
        match &mut self.link {
            Link::Plain(s) => {
                let len = buf.len();
                let (res, slice) = s.read(buf.slice_mut(len..)).await;
                (res, slice.into_inner())
            }
            Link::Tls(s, session) => {
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
        match &mut self.link {
            Link::Plain(s) => {
                let (res, buf) = s.write_all(buf).await;
                (res.map(drop), buf)
            }
            Link::Tls(s, session) => {
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
