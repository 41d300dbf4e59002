//! Thread-per-core runtime: one monoio runtime per data-path core, pinned to its CPU, each
//! with its own SO_REUSEPORT listener and accept loop; plus the control thread (monitor and
//! admin listener). [`start`] wires them up and returns a [`ServerHandle`].

pub mod clock;
pub mod conn;
pub mod reader;

use std::cell::RefCell;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use monoio::io::AsyncReadRent;
use monoio::net::{TcpListener, TcpStream};

use crate::config::Config;
use crate::config::snapshot::{Registry, Snapshot};
use crate::metrics::{CoreCounters, add};
use crate::monitor::BusySet;
use crate::route::Rng;
use crate::upstream::Pools;

/// State shared by every core and the control thread.
#[derive(Debug)]
pub struct Shared {
    /// The current config generation; connections pin the one they started with.
    pub snapshot: ArcSwap<Snapshot>,
    /// Busy-set replica per core, written by the monitor on every publish.
    pub busy: Box<[Arc<ArcSwap<BusySet>>]>,
    /// Open client connections across all cores.
    pub connections: AtomicUsize,
    pub counters: Box<[CachePadded<CoreCounters>]>,
    /// True on cores running the epoll fallback.
    pub legacy_driver: Box<[AtomicBool]>,
    pub draining: AtomicBool,
}

impl Shared {
    pub fn cores(&self) -> usize {
        self.counters.len()
    }
}

/// What one core owns: its pools, counters, RNG; reachable from every task of the core.
#[derive(Debug)]
pub struct CoreCtx {
    pub id: usize,
    pub shared: Arc<Shared>,
    pub pools: RefCell<Pools>,
    pub rng: RefCell<Rng>,
    /// Round-robin position per model id.
    pub rr: RefCell<Vec<u64>>,
    pub busy: RefCell<arc_swap::Cache<Arc<ArcSwap<BusySet>>, Arc<BusySet>>>,
    request_seq: std::cell::Cell<u64>,
    request_salt: u64,
}

impl CoreCtx {
    pub fn counters(&self) -> &CoreCounters {
        &self.shared.counters[self.id]
    }

    /// A fresh `x-request-id`: 32 hex digits, unique per process (core, sequence, salt).
    pub fn next_request_id(&self, out: &mut [u8; 32]) {
        let seq = self.request_seq.get().wrapping_add(1);
        self.request_seq.set(seq);
        let hi = self.request_salt ^ ((self.id as u64) << 56);
        let lo = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ self.request_salt.rotate_left(17);
        for (i, v) in [hi, lo].into_iter().enumerate() {
            for j in 0..16 {
                out[i * 16 + j] = b"0123456789abcdef"[((v >> (60 - 4 * j)) & 0xf) as usize];
            }
        }
    }

    /// The round-robin position of a model on this core.
    pub fn rr(&self, model_id: u32) -> u64 {
        self.rr
            .borrow()
            .get(model_id as usize)
            .copied()
            .unwrap_or(0)
    }

    pub fn set_rr(&self, model_id: u32, value: u64) {
        let mut rr = self.rr.borrow_mut();
        let i = model_id as usize;
        if rr.len() <= i {
            rr.resize(i + 1, 0);
        }
        rr[i] = value;
    }
}

/// A running server. Dropping it stops every thread.
#[derive(Debug)]
pub struct ServerHandle {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub shared: Arc<Shared>,
    stops: Vec<StdUnixStream>,
    threads: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    /// Stops accepting, ends every core and the control thread, and waits for them.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        use std::io::Write;
        for s in &mut self.stops {
            let _ = s.write_all(b"x");
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Blocks until every thread has ended (they end on [`ServerHandle::shutdown`] or a signal).
    pub fn wait(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// A handle that can stop the server from another thread (signal handling).
    pub fn stopper(&self) -> io::Result<Stopper> {
        Ok(Stopper {
            stops: self
                .stops
                .iter()
                .map(|s| s.try_clone())
                .collect::<io::Result<_>>()?,
        })
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Stops a running server from any thread.
#[derive(Debug)]
pub struct Stopper {
    stops: Vec<StdUnixStream>,
}

impl Stopper {
    pub fn stop(&mut self) {
        use std::io::Write;
        for s in &mut self.stops {
            let _ = s.write_all(b"x");
        }
    }
}

fn bind_reuseport(addr: SocketAddr) -> io::Result<StdListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// CPUs this process may run on (its affinity mask), in order.
fn allowed_cpus() -> Vec<usize> {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Where each data core and the monitor run: explicit `cpus`, else the last `cores`
/// allowed CPUs for data and the first for the monitor when one is spare.
fn placement(config: &Config) -> (Vec<Option<usize>>, Option<usize>) {
    if !config.pin_cores {
        return (vec![None; config.cores], None);
    }
    let allowed = allowed_cpus();
    if !config.cpus.is_empty() {
        return (
            config.cpus.iter().map(|&c| Some(c)).collect(),
            config.monitor_cpu,
        );
    }
    if allowed.is_empty() {
        return (vec![None; config.cores], config.monitor_cpu);
    }
    let n = allowed.len();
    if config.cores < n {
        let data = (0..config.cores)
            .map(|i| Some(allowed[n - config.cores + i]))
            .collect();
        (data, config.monitor_cpu.or(Some(allowed[0])))
    } else {
        let data = (0..config.cores).map(|i| Some(allowed[i % n])).collect();
        (data, config.monitor_cpu)
    }
}

pub(crate) fn pin_current(cpu: Option<usize>, what: &str) {
    if let Some(Err(e)) = cpu.map(|c| monoio::utils::bind_to_cpu_set([c])) {
        tracing::warn!(cpu, thread = what, error = ?e, "cannot pin thread to CPU");
    }
}

/// Builds a monoio runtime: io_uring when the kernel allows, epoll otherwise.
pub(crate) fn runtime() -> io::Result<
    monoio::FusionRuntime<
        monoio::time::TimeDriver<monoio::IoUringDriver>,
        monoio::time::TimeDriver<monoio::LegacyDriver>,
    >,
> {
    match monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .with_entries(2048)
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

/// Starts the data-path cores and the control thread.
pub fn start(config: Config, source: crate::monitor::ConfigSource) -> io::Result<ServerHandle> {
    let cores = config.cores.max(1);
    let (data_cpus, monitor_cpu) = placement(&config);

    // Bind everything first so errors surface before any thread starts.
    let first = bind_reuseport(config.listen)?;
    let data_addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..cores {
        listeners.push(bind_reuseport(data_addr)?);
    }
    let admin = bind_reuseport(config.admin_listen)?;
    let admin_addr = admin.local_addr()?;

    let mut registry = Registry::new(cores);
    let snapshot = Arc::new(registry.build(config));
    let empty = Arc::new(BusySet::default());
    let shared = Arc::new(Shared {
        snapshot: ArcSwap::new(snapshot),
        busy: (0..cores)
            .map(|_| Arc::new(ArcSwap::new(empty.clone())))
            .collect(),
        connections: AtomicUsize::new(0),
        counters: (0..cores)
            .map(|_| CachePadded::new(CoreCounters::default()))
            .collect(),
        legacy_driver: (0..cores).map(|_| AtomicBool::new(false)).collect(),
        draining: AtomicBool::new(false),
    });

    let mut stops = Vec::new();
    let mut threads = Vec::new();
    for (id, listener) in listeners.into_iter().enumerate() {
        let (stop_tx, stop_rx) = StdUnixStream::pair()?;
        stop_rx.set_nonblocking(true)?;
        stops.push(stop_tx);
        let shared = shared.clone();
        let cpu = data_cpus.get(id).copied().flatten();
        threads.push(
            std::thread::Builder::new()
                .name(format!("spillway-core-{id}"))
                .spawn(move || run_core(id, cpu, listener, stop_rx, shared))?,
        );
    }
    let (stop_tx, stop_rx) = StdUnixStream::pair()?;
    stop_rx.set_nonblocking(true)?;
    stops.push(stop_tx);
    {
        let shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("spillway-monitor".into())
                .spawn(move || {
                    crate::monitor::run(monitor_cpu, admin, stop_rx, shared, registry, source)
                })?,
        );
    }
    Ok(ServerHandle {
        data_addr,
        admin_addr,
        shared,
        stops,
        threads,
    })
}

fn run_core(
    id: usize,
    cpu: Option<usize>,
    listener: StdListener,
    stop: StdUnixStream,
    shared: Arc<Shared>,
) {
    pin_current(cpu, "core");
    let mut rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(core = id, error = %e, "cannot start a runtime on this core");
            return;
        }
    };
    rt.block_on(async move {
        let legacy = monoio::utils::is_legacy();
        shared.legacy_driver[id].store(legacy, Ordering::Relaxed);
        tracing::info!(core = id, cpu = ?cpu, driver = if legacy { "epoll" } else { "io_uring" }, "core started");
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(core = id, error = %e, "cannot adopt listener");
                return;
            }
        };
        let busy = arc_swap::Cache::new(shared.busy[id].clone());
        let seed = clock::now_ms() ^ (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(std::process::id());
        let ctx = Rc::new(CoreCtx {
            id,
            pools: RefCell::new(Pools::new()),
            rng: RefCell::new(Rng::new(seed)),
            rr: RefCell::new(Vec::new()),
            busy: RefCell::new(busy),
            request_seq: std::cell::Cell::new(0),
            request_salt: Rng::new(seed ^ 0xdead_beef).next_u64(),
            shared,
        });
        monoio::spawn(crate::upstream::sweep_pools(ctx.clone()));
        accept_loop(ctx, listener, stop).await;
    });
}

async fn accept_loop(ctx: Rc<CoreCtx>, listener: TcpListener, stop: StdUnixStream) {
    accept_until_stopped(&listener, stop, "data", |stream, peer| {
        admit(&ctx, stream, peer)
    })
    .await;
}

/// Accepts connections until a byte arrives on `stop`, handing each to `accepted`. A
/// failed accept (EMFILE and friends) backs off briefly instead of spinning.
pub(crate) async fn accept_until_stopped(
    listener: &TcpListener,
    stop: StdUnixStream,
    kind: &'static str,
    mut accepted: impl FnMut(TcpStream, SocketAddr),
) {
    let mut stop = match monoio::net::UnixStream::from_std(stop) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(listener = kind, error = %e, "cannot adopt stop channel");
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
            Ok((stream, peer)) => accepted(stream, peer),
            Err(e) => {
                tracing::warn!(listener = kind, error = %e, "accept failed");
                monoio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

fn admit(ctx: &Rc<CoreCtx>, stream: TcpStream, peer: SocketAddr) {
    let shared = &ctx.shared;
    let max = shared.snapshot.load().config.limits.max_connections;
    add(&ctx.counters().connections, 1);
    if shared.connections.fetch_add(1, Ordering::AcqRel) >= max {
        shared.connections.fetch_sub(1, Ordering::AcqRel);
        add(&ctx.counters().connections_refused, 1);
        monoio::spawn(conn::refuse(ctx.clone(), stream));
        return;
    }
    monoio::spawn(conn::serve(ctx.clone(), stream, peer));
}
