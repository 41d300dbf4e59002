//! Listeners: one SO_REUSEPORT socket per core on the same address, and the accept loop
//! that runs until a stop byte arrives.

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::time::Duration;

use monoio::io::AsyncReadRent;
use monoio::net::{TcpListener, TcpStream};

/// Stop bytes for an accept loop: stop now (requests in flight are cut), or drain.
pub const STOP_NOW: u8 = b'x';
pub const STOP_DRAIN: u8 = b'd';

/// How long a failed accept (EMFILE and friends) backs off before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// A non-blocking listener with SO_REUSEPORT, so every core can bind the same address.
pub fn bind_reuseport(addr: SocketAddr) -> io::Result<StdListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Accepts connections until a byte arrives on `stop`, handing each to `accepted`, and
/// returns that byte. A failed accept backs off briefly instead of spinning.
pub async fn accept_until_stopped(
    listener: &TcpListener,
    stop: StdUnixStream,
    kind: &'static str,
    mut accepted: impl FnMut(TcpStream, SocketAddr),
) -> u8 {
    let mut stop = match monoio::net::UnixStream::from_std(stop) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(listener = kind, error = %e, "cannot adopt stop channel");
            return STOP_NOW;
        }
    };
    let mut stopped = std::pin::pin!(stop.read(vec![0u8; 1]));
    loop {
        let next = monoio::select! {
            (_, byte) = &mut stopped => return byte.first().copied().unwrap_or(STOP_NOW),
            a = listener.accept() => a,
        };
        match next {
            Ok((stream, peer)) => accepted(stream, peer),
            Err(e) => {
                tracing::warn!(listener = kind, error = %e, "accept failed");
                monoio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// A stop channel: the write end for whoever stops the loop, the read end (non-blocking)
/// for [`accept_until_stopped`].
pub fn stop_channel() -> io::Result<(StdUnixStream, StdUnixStream)> {
    let (tx, rx) = StdUnixStream::pair()?;
    rx.set_nonblocking(true)?;
    Ok((tx, rx))
}
