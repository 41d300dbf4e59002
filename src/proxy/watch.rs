//! Waiting on the upstream (or the admission queue) while the client is watched: the
//! client's read stays in flight, so a disconnect ends the wait at once, and pipelined
//! bytes that arrive meanwhile are kept. Neither side's operation is dropped when the
//! other wins.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::Poll;
use std::time::Instant;

use crate::http::limits::{RESPONSE_READ_BUF, RESPONSE_READ_MIN_SPARE};
use crate::runtime::reader::ClientReader;
use crate::runtime::stream::Upstream;

/// The client's reader, lent to the stages that watch it.
pub(super) type Reader<'a> = Pin<&'a mut ClientReader>;

/// What ended a wait early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Interrupt {
    ClientGone,
    Timeout,
    /// A checkpoint gave up the wait.
    Abandoned,
}

/// Called when the wait reaches a checkpoint before its deadline: the next checkpoint,
/// or `None` to give the wait up.
pub(super) type Checkpoint<'a> = &'a mut dyn FnMut(Instant) -> Option<Instant>;

enum Race<T> {
    Work(T),
    Client(io::Result<usize>),
    Timeout,
}

async fn race<U: Future>(
    mut work: Pin<&mut U>,
    reader: &mut Reader<'_>,
    mut sleep: Pin<&mut monoio::time::Sleep>,
) -> Race<U::Output> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = work.as_mut().poll(cx) {
            return Poll::Ready(Race::Work(v));
        }
        if let Poll::Ready(r) = reader.as_mut().poll_read(cx) {
            return Poll::Ready(Race::Client(r));
        }
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Race::Timeout);
        }
        Poll::Pending
    })
    .await
}

/// Waits for `work` until `deadline` while watching the client: pipelined bytes arriving
/// meanwhile are kept (the watch re-arms only when nothing is buffered); a disconnect
/// ends the wait.
pub(super) async fn watched<U: Future>(
    work: U,
    reader: &mut Reader<'_>,
    deadline: Instant,
) -> Result<U::Output, Interrupt> {
    watched_until(work, reader, deadline, None).await
}

/// [`watched`], with a checkpoint at `check.0` that may give the wait up or set the next.
async fn watched_until<U: Future>(
    work: U,
    reader: &mut Reader<'_>,
    deadline: Instant,
    mut check: Option<(Instant, Checkpoint<'_>)>,
) -> Result<U::Output, Interrupt> {
    let first = check.as_ref().map_or(deadline, |c| c.0.min(deadline));
    let mut sleep = std::pin::pin!(monoio::time::sleep_until(first.into()));
    let mut work = std::pin::pin!(work);
    loop {
        match race(work.as_mut(), reader, sleep.as_mut()).await {
            Race::Work(v) => return Ok(v),
            Race::Client(Ok(n)) if n > 0 => reader.as_mut().watch(),
            Race::Client(_) => return Err(Interrupt::ClientGone),
            Race::Timeout => {
                let now = crate::runtime::clock::now();
                let next = match &mut check {
                    Some((_, checkpoint)) if now < deadline => checkpoint(now),
                    _ => return Err(Interrupt::Timeout),
                };
                let next = next.ok_or(Interrupt::Abandoned)?;
                sleep.as_mut().reset(next.min(deadline).into());
            }
        }
    }
}

/// One upstream read appended to `rbuf`, while the client is watched.
pub(super) async fn read_upstream(
    stream: &mut Upstream,
    rbuf: &mut Vec<u8>,
    reader: &mut Reader<'_>,
    deadline: Instant,
) -> Result<io::Result<usize>, Interrupt> {
    read_upstream_until(stream, rbuf, reader, deadline, None).await
}

/// [`read_upstream`] with a checkpoint (see [`watched_until`]).
pub(super) async fn read_upstream_until(
    stream: &mut Upstream,
    rbuf: &mut Vec<u8>,
    reader: &mut Reader<'_>,
    deadline: Instant,
    check: Option<(Instant, Checkpoint<'_>)>,
) -> Result<io::Result<usize>, Interrupt> {
    if rbuf.capacity() - rbuf.len() < RESPONSE_READ_MIN_SPARE {
        rbuf.reserve(RESPONSE_READ_BUF);
    }
    let buf = std::mem::take(rbuf);
    let (res, buf) = watched_until(stream.read_into(buf), reader, deadline, check).await?;
    *rbuf = buf;
    Ok(res)
}
