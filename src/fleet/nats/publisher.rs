//! The publishing connection. Its socket is split: `publish` owns the write half between
//! calls, and a small task spawned on the read half ([`read_loop`]) watches what the
//! server sends. That task answers a `PING` itself when the write half is free (so an
//! idle publisher is not dropped as stale: nats-server closes a client that leaves
//! `ping_max` PINGs unanswered) and otherwise leaves the `PONG` owed to the publish under
//! way, which writes it before giving the half back. `-ERR`, the end of the stream or a
//! failed read or write mark the connection dead, and the next `publish` returns that
//! error. Everything is shared through one `Rc` of `Cell`s: one thread, no lock.

use std::cell::Cell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use monoio::io::{CancelHandle, Canceller, OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;

use super::proto::{self, ServerOp};
use super::wire::{ReadBuf, send};
use super::{NatsError, open};

type Writer = OwnedWriteHalf<TcpStream>;

#[derive(Default)]
struct Shared {
    /// The write half, when nobody is writing.
    writer: Cell<Option<Writer>>,
    /// A `publish` waiting for the reader task to give the write half back.
    waiting: Cell<Option<Waker>>,
    /// PINGs seen while a `publish` held the write half.
    owed_pongs: Cell<u32>,
    /// Why the connection is over.
    dead: Cell<Option<NatsError>>,
}

impl Shared {
    fn dead(&self) -> Option<NatsError> {
        let dead = self.dead.take();
        self.dead.set(dead.clone());
        dead
    }

    fn die(&self, err: NatsError) {
        if self.dead().is_none() {
            self.dead.set(Some(err));
        }
        self.wake();
    }

    fn give_back(&self, writer: Writer) {
        self.writer.set(Some(writer));
        self.wake();
    }

    fn wake(&self) {
        if let Some(waker) = self.waiting.take() {
            waker.wake();
        }
    }
}

/// A connection that publishes; it also answers the server's `PING`s (see the module).
pub struct Publisher {
    addr: SocketAddr,
    shared: Rc<Shared>,
    /// Reused for every `PUB`.
    out: Vec<u8>,
    max_payload: usize,
    cancel: Canceller,
    /// A `publish` is under way; still set when its future was dropped mid-write.
    writing: bool,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("addr", &self.addr)
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Connects and completes the handshake (`INFO`, `CONNECT`, `PING`/`PONG`) within
    /// `timeout`, then starts the reader task on the current thread.
    pub async fn connect(
        addr: SocketAddr,
        client_name: &str,
        timeout: Duration,
    ) -> Result<Publisher, NatsError> {
        let mut early = VecDeque::new();
        let (stream, rb) = open(addr, client_name, None, timeout, &mut early).await?;
        let max_payload = rb.max_payload;
        let (reader, writer) = stream.into_split();
        let shared = Rc::new(Shared::default());
        shared.writer.set(Some(writer));
        let cancel = Canceller::new();
        monoio::spawn(read_loop(reader, rb, shared.clone(), cancel.handle(), addr));
        Ok(Publisher {
            addr,
            shared,
            out: Vec::new(),
            max_payload,
            cancel,
            writing: false,
        })
    }

    /// Publishes `payload` on `subject`, after any `PONG` owed. A bad subject or a payload
    /// over the server's `max_payload` is refused without harm; any other error ends the
    /// connection (every later call returns it). Not cancel-safe: after a timeout drops
    /// this future mid-write, the publisher only returns errors.
    pub async fn publish(&mut self, subject: &str, payload: &[u8]) -> Result<(), NatsError> {
        if self.writing {
            self.shared.die(NatsError::Protocol(
                "a cancelled publish left the connection mid-write".into(),
            ));
        }
        if let Some(err) = self.shared.dead() {
            return Err(err);
        }
        if payload.len() > self.max_payload {
            return Err(NatsError::Protocol(format!(
                "payload of {} bytes over the server's max_payload {}",
                payload.len(),
                self.max_payload
            )));
        }
        proto::validate_subject(subject)?;
        self.writing = true;
        let mut writer = self.take_writer().await?;
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        pongs(&mut out, self.shared.owed_pongs.replace(0));
        if let Err(err) = proto::write_pub(&mut out, subject, payload) {
            self.shared.give_back(writer);
            self.out = out;
            self.writing = false;
            return Err(err);
        }
        let (mut res, mut buf) = send(&mut writer, out, self.addr).await;
        // PINGs the reader saw meanwhile: answered before the half goes back.
        while res.is_ok() && self.shared.owed_pongs.get() > 0 {
            buf.clear();
            pongs(&mut buf, self.shared.owed_pongs.replace(0));
            (res, buf) = send(&mut writer, buf, self.addr).await;
        }
        self.out = buf;
        self.writing = false;
        match res {
            Ok(()) => {
                self.shared.give_back(writer);
                Ok(())
            }
            Err(err) => {
                self.shared.die(err.clone());
                Err(err)
            }
        }
    }

    /// The write half, once the reader task is not writing a `PONG` with it.
    async fn take_writer(&self) -> Result<Writer, NatsError> {
        std::future::poll_fn(|cx| {
            if let Some(err) = self.shared.dead() {
                return Poll::Ready(Err(err));
            }
            match self.shared.writer.take() {
                Some(writer) => Poll::Ready(Ok(writer)),
                None => {
                    self.shared.waiting.set(Some(cx.waker().clone()));
                    Poll::Pending
                }
            }
        })
        .await
    }
}

impl Drop for Publisher {
    /// Shuts the write side (the server then closes) and cancels the reader's read, so
    /// the task ends and the socket closes.
    fn drop(&mut self) {
        drop(self.shared.writer.take());
        std::mem::take(&mut self.cancel).cancel();
        self.shared
            .die(NatsError::Protocol("publisher closed".into()));
    }
}

fn pongs(out: &mut Vec<u8>, n: u32) {
    for _ in 0..n {
        out.extend_from_slice(proto::PONG);
    }
}

/// The reader task: runs until the connection dies, then records why.
async fn read_loop(
    mut reader: OwnedReadHalf<TcpStream>,
    mut rb: ReadBuf,
    shared: Rc<Shared>,
    cancel: CancelHandle,
    addr: SocketAddr,
) {
    let err = loop {
        let op = match rb.parse() {
            Ok(Some((op, used))) => {
                let op = match op {
                    ServerOp::Ping => Some(Ok(())),
                    ServerOp::Err(msg) => Some(Err(NatsError::Server(msg.to_owned()))),
                    _ => None,
                };
                rb.consume(used);
                op
            }
            Ok(None) => match rb.fill(&mut reader, cancel.clone(), addr).await {
                Ok(()) => continue,
                Err(err) => break err,
            },
            Err(err) => break err,
        };
        match op {
            Some(Ok(())) => {
                if let Err(err) = answer_ping(&shared, addr).await {
                    break err;
                }
            }
            Some(Err(err)) => break err,
            None => {}
        }
    };
    shared.die(err);
}

/// Writes a `PONG` now if the write half is free, else leaves it to the publish under way.
async fn answer_ping(shared: &Shared, addr: SocketAddr) -> Result<(), NatsError> {
    let Some(mut writer) = shared.writer.take() else {
        if shared.dead().is_none() {
            shared.owed_pongs.set(shared.owed_pongs.get() + 1);
        }
        return Ok(());
    };
    let (res, _) = send(&mut writer, proto::PONG, addr).await;
    res?;
    shared.give_back(writer);
    Ok(())
}
