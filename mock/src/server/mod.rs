//! The mock engine's I/O: one monoio runtime on its own thread running the accept loop,
//! one task per connection, the scheduler task that drives [`Engine`] with the clock, and
//! the optional load pusher. Everything shares one `Rc<Mock>`; nothing crosses threads
//! except the stop signal.

mod conn;
mod generate;
mod handoff;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use monoio::io::AsyncReadRent;
use monoio::net::TcpListener;

use crate::MockConfig;
use crate::clock;
use crate::disagg::{Counts, Identity, Setup};
use crate::fault::FaultState;
use crate::push::{self, Reports, Target};
use crate::sim::{Engine, EngineConfig, Load, Micros, SeqId, Token};

/// State of the mock shared by its tasks.
pub struct Mock {
    cfg: MockConfig,
    engine_cfg: EngineConfig,
    /// The served model as a JSON string, quotes included.
    model_json: String,
    /// `,"system_fingerprint":"fp_…"` of `fingerprint_bytes`, or empty.
    fingerprint: String,
    epoch: Instant,
    engine: RefCell<Engine>,
    /// The connection waiting on each sequence.
    slots: RefCell<HashMap<SeqId, Rc<Slot>>>,
    /// Wakes the scheduler when a request arrives.
    kick: Signal,
    /// The fault mode in force.
    fault: FaultState,
    /// The disaggregation role and what a plan needs of this engine.
    disagg: Setup,
    /// Handoffs seen (the `mock_*` series of `/metrics`).
    handoffs: Cell<Counts>,
    /// The body of the last `POST /v1/*` request read (`GET /last_request`).
    last_request: RefCell<Vec<u8>>,
}

impl Mock {
    fn now(&self) -> Micros {
        clock::now().duration_since(self.epoch).as_micros() as Micros
    }

    pub fn load(&self) -> Load {
        self.engine.borrow().load()
    }

    pub fn engine_config(&self) -> &EngineConfig {
        &self.engine_cfg
    }

    fn count(&self, f: impl FnOnce(&mut Counts)) {
        let mut counts = self.handoffs.get();
        f(&mut counts);
        self.handoffs.set(counts);
    }
}

impl Reports for Rc<Mock> {
    fn engine_config(&self) -> &EngineConfig {
        Mock::engine_config(self)
    }

    fn load(&self) -> Load {
        Mock::load(self)
    }

    fn paused(&self) -> bool {
        self.fault.hung()
    }
}

/// A one-waiter, level-triggered wakeup on one thread.
#[derive(Default)]
struct Signal {
    set: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Signal {
    fn notify(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.set.replace(false) {
                Poll::Ready(())
            } else {
                self.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }
}

/// Where the scheduler leaves a sequence's progress for its connection.
#[derive(Default)]
struct Slot {
    generated: Cell<u32>,
    /// Prompt tokens the prefix cache held at admission.
    cached: Cell<u32>,
    done: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

/// Aborts the sequence (freeing its blocks) when its connection stops waiting for it, on
/// every path: disconnect, write error, shutdown. A finished sequence is already gone.
struct SeqGuard<'a> {
    mock: &'a Mock,
    id: SeqId,
}

impl Drop for SeqGuard<'_> {
    fn drop(&mut self) {
        self.mock.slots.borrow_mut().remove(&self.id);
        if self.mock.engine.borrow_mut().abort(self.id) {
            tracing::debug!(seq = self.id, "sequence aborted");
        }
    }
}

/// Binds the listener (SO_REUSEADDR, no SO_REUSEPORT: two mocks never share a port).
pub fn bind(addr: SocketAddr) -> io::Result<StdListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

type Runtime = monoio::FusionRuntime<
    monoio::time::TimeDriver<monoio::IoUringDriver>,
    monoio::time::TimeDriver<monoio::LegacyDriver>,
>;

/// A monoio runtime with timers: io_uring when the kernel allows, epoll otherwise.
fn runtime() -> io::Result<Runtime> {
    match monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .build()
    {
        Ok(rt) => Ok(rt),
        Err(e) => {
            tracing::warn!(error = %e, "io_uring runtime failed to start; using epoll");
            Ok(monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()?
                .into())
        }
    }
}

/// The mock's thread: runs until a byte arrives on `stop`.
pub fn run(
    cfg: MockConfig,
    engine_cfg: EngineConfig,
    listener: StdListener,
    stop: StdUnixStream,
    push: Option<(Target, String)>,
) {
    let mut rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the mock engine runtime");
            return;
        }
    };
    rt.block_on(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot adopt the mock engine listener");
                return;
            }
        };
        let push_interval = Duration::from_millis(cfg.push_interval_ms.max(1));
        let disagg = Setup {
            role: cfg.role,
            identity: Identity::new(listener.local_addr().unwrap_or(cfg.listen), cfg.seed),
            bootstrap_port: cfg.bootstrap_port,
            block_size: cfg.block_size,
        };
        let epoch = clock::now();
        let fault = FaultState::new(
            cfg.fault,
            Duration::from_millis(cfg.flap_period_ms.max(1)),
            epoch,
        );
        let mock = Rc::new(Mock {
            model_json: serde_json::to_string(&cfg.model).unwrap_or_else(|_| "\"\"".into()),
            fingerprint: fingerprint(cfg.fingerprint_bytes),
            engine: RefCell::new(Engine::new(engine_cfg.clone())),
            engine_cfg,
            cfg,
            epoch,
            slots: RefCell::new(HashMap::new()),
            kick: Signal::default(),
            fault,
            disagg,
            handoffs: Cell::new(Counts::default()),
            last_request: RefCell::new(Vec::new()),
        });
        monoio::spawn(drive(mock.clone()));
        if let Some((target, worker)) = push {
            monoio::spawn(push::run(mock.clone(), target, worker, push_interval));
        }
        accept_until_stopped(&listener, stop, &mock).await;
    });
}

/// Accepts connections, one task each, until a byte arrives on `stop`. A failed accept
/// (EMFILE and friends) backs off briefly instead of spinning.
async fn accept_until_stopped(listener: &TcpListener, stop: StdUnixStream, mock: &Rc<Mock>) {
    let mut stop = match monoio::net::UnixStream::from_std(stop) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot adopt the mock engine's stop channel");
            return;
        }
    };
    let mut stopped = std::pin::pin!(stop.read(vec![0u8; 1]));
    loop {
        let next = monoio::select! {
            _ = &mut stopped => return,
            a = listener.accept() => a,
        };
        match next {
            Ok((stream, _)) => {
                monoio::spawn(conn::serve(mock.clone(), stream));
            }
            Err(e) => {
                tracing::warn!(listener = "mock", error = %e, "accept failed");
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// `,"system_fingerprint":"fp_…"` with a string of `bytes` bytes; empty for 0.
fn fingerprint(bytes: usize) -> String {
    if bytes == 0 {
        return String::new();
    }
    let hex = b"0123456789abcdef";
    let body: String = (3..bytes.max(3)).map(|i| char::from(hex[i % 16])).collect();
    format!(r#","system_fingerprint":"fp_{body}""#)
}

/// The scheduler: advances the engine to the clock, hands tokens to their connections,
/// and sleeps until the step under way ends or a request arrives.
async fn drive(mock: Rc<Mock>) {
    let mut tokens: Vec<Token> = Vec::new();
    loop {
        let now = mock.now();
        let deadline = {
            let mut engine = mock.engine.borrow_mut();
            engine.advance(now, &mut tokens);
            engine.next_deadline()
        };
        {
            let slots = mock.slots.borrow();
            for t in tokens.drain(..) {
                if let Some(slot) = slots.get(&t.id) {
                    slot.generated.set(t.index + 1);
                    slot.cached.set(t.cached);
                    slot.done.set(t.last);
                    if let Some(w) = slot.waker.take() {
                        w.wake();
                    }
                }
            }
        }
        match deadline {
            Some(d) => {
                // The timer counts whole milliseconds: round up, never wake early.
                let wait = Duration::from_millis(d.saturating_sub(now).div_ceil(1000));
                monoio::select! {
                    _ = monoio::time::sleep(wait) => {},
                    _ = mock.kick.wait() => {},
                }
            }
            None => mock.kick.wait().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fingerprint;

    #[test]
    fn fingerprint_has_the_asked_bytes_and_parses() {
        assert_eq!(fingerprint(0), "");
        for bytes in [1, 3, 40, 1000] {
            let f = fingerprint(bytes);
            let v: serde_json::Value = serde_json::from_str(&format!("{{{}}}", &f[1..])).unwrap();
            let s = v["system_fingerprint"].as_str().unwrap();
            assert_eq!(s.len(), bytes.max(3), "{f}");
            assert!(s.starts_with("fp_"));
        }
    }
}
