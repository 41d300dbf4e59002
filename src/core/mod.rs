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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// The current config generation; each request runs on the one it started with.
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    /// Busy-set replica per core, written by the monitor on every publish.
    pub busy: Box<[Arc<ArcSwap<BusySet>>]>,
    /// Open client connections across all cores.
    pub connections: AtomicUsize,
    pub counters: Box<[CachePadded<CoreCounters>]>,
    /// True on cores running the epoll fallback.
    pub legacy_driver: Box<[AtomicBool]>,
    /// Set on SIGTERM: health answers 503, responses close their connections.
    pub draining: AtomicBool,
    /// Process-clock ms after which draining cores stop waiting for requests in flight.
    pub drain_deadline_ms: AtomicU64,
}

impl Shared {
    /// Shared state for `cores` data cores, starting on `snapshot` with an empty busy set.
    pub fn new(snapshot: Snapshot, cores: usize) -> Shared {
        let empty = Arc::new(BusySet::default());
        Shared {
            snapshot: Arc::new(ArcSwap::from_pointee(snapshot)),
            busy: (0..cores)
                .map(|_| Arc::new(ArcSwap::new(empty.clone())))
                .collect(),
            connections: AtomicUsize::new(0),
            counters: (0..cores)
                .map(|_| CachePadded::new(CoreCounters::default()))
                .collect(),
            legacy_driver: (0..cores).map(|_| AtomicBool::new(false)).collect(),
            draining: AtomicBool::new(false),
            drain_deadline_ms: AtomicU64::new(u64::MAX),
        }
    }

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
    snapshot: RefCell<SnapshotCache>,
    /// Requests being served on this core (a drain waits for zero).
    pub active_requests: std::cell::Cell<usize>,
    request_seq: std::cell::Cell<u64>,
    request_salt: u64,
}

/// A request's handle on its snapshot. The extra `Rc` layer is deliberate: cloning it per
/// request touches only this core's count, never the `Arc`'s count shared by all cores.
#[allow(clippy::redundant_allocation)]
pub type SnapshotRef = Rc<Arc<Snapshot>>;

/// The core's view of the current snapshot: a cheap check per request, and an `Rc` the
/// request holds (no shared reference count is touched per request).
#[derive(Debug)]
struct SnapshotCache {
    cache: arc_swap::Cache<Arc<ArcSwap<Snapshot>>, Arc<Snapshot>>,
    current: SnapshotRef,
}

impl CoreCtx {
    /// The snapshot a new request runs on.
    pub fn snapshot(&self) -> SnapshotRef {
        let mut s = self.snapshot.borrow_mut();
        let SnapshotCache { cache, current } = &mut *s;
        let latest = cache.load();
        if !Arc::ptr_eq(latest, current) {
            *current = Rc::new(latest.clone());
        }
        current.clone()
    }

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

/// A one-line view of what the proxy is doing (the demo's status line, SIGUSR1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests finished (any outcome) over all models.
    pub requests: u64,
    /// Requests refused with the overload status (busy pool or worker refusals).
    pub rejected: u64,
    pub inflight: u64,
    /// Workers in the published busy set, out of `workers`.
    pub busy_workers: usize,
    pub workers: usize,
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "requests={} rejected={} busy_workers={}/{} in_flight={}",
            self.requests, self.rejected, self.busy_workers, self.workers, self.inflight
        )
    }
}

impl Shared {
    /// Sums the cores' counters and reads the published busy set.
    pub fn stats(&self) -> Stats {
        use crate::metrics::{Outcome, RequestType};
        use crate::route::Endpoint;
        let snap = self.snapshot.load();
        let busy = self.busy.first().map(|b| b.load_full()).unwrap_or_default();
        let mut s = Stats {
            workers: snap.workers.len(),
            ..Stats::default()
        };
        for m in snap.models.iter() {
            for e in Endpoint::ALL {
                s.rejected += m.metrics.rejections(e);
                for t in [RequestType::Unary, RequestType::Stream] {
                    s.requests += Outcome::ALL
                        .iter()
                        .map(|o| m.metrics.requests(e, t, *o))
                        .sum::<u64>();
                }
            }
            s.inflight += m.metrics.inflight();
        }
        s.busy_workers = (0..snap.workers.len() as u32)
            .filter(|&wi| {
                snap.models.iter().any(|m| {
                    m.members
                        .iter()
                        .any(|mm| mm.worker == wi && busy.is_busy(mm.id))
                })
            })
            .count();
        s
    }
}

/// A running server. Dropping it stops every thread at once.
#[derive(Debug)]
pub struct ServerHandle {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub shared: Arc<Shared>,
    /// One per data core: a byte stops its accept loop (`x` now, `d` drain).
    core_stops: Vec<StdUnixStream>,
    /// Commands to the monitor thread (see [`crate::monitor::Command`]).
    monitor: StdUnixStream,
    cores: Vec<JoinHandle<()>>,
    monitor_thread: Option<JoinHandle<()>>,
}

/// Stop bytes for a core's accept loop.
const STOP_NOW: u8 = b'x';
const STOP_DRAIN: u8 = b'd';

impl ServerHandle {
    fn send_cores(&self, byte: u8) {
        use std::io::Write;
        for mut s in &self.core_stops {
            let _ = s.write_all(&[byte]);
        }
    }

    fn send_monitor(&self, command: crate::monitor::Command) {
        use std::io::Write;
        let _ = (&self.monitor).write_all(&[command as u8]);
    }

    /// Stops every core and the monitor now (requests in flight are cut) and waits.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.send_cores(STOP_NOW);
        for t in self.cores.drain(..) {
            let _ = t.join();
        }
        self.send_monitor(crate::monitor::Command::Stop);
        if let Some(t) = self.monitor_thread.take() {
            let _ = t.join();
        }
    }

    /// Starts a graceful drain (SIGTERM): health answers 503 at once, the listeners close
    /// after `drain_grace_ms`, and each core ends once its requests in flight are done or
    /// `drain_timeout_ms` has passed. Returns at once; see [`ServerHandle::drained`].
    pub fn begin_drain(&self) -> std::io::Result<()> {
        let config = &self.shared.snapshot.load().config;
        let (grace, timeout) = (config.drain_grace_ms, config.drain_timeout_ms);
        self.shared
            .drain_deadline_ms
            .store(clock::now_ms() + grace + timeout, Ordering::Relaxed);
        self.shared.draining.store(true, Ordering::Relaxed);
        tracing::info!(
            grace_ms = grace,
            timeout_ms = timeout,
            "draining: health now answers 503"
        );
        let stops = self
            .core_stops
            .iter()
            .map(|s| s.try_clone())
            .collect::<std::io::Result<Vec<_>>>()?;
        std::thread::Builder::new()
            .name("spillway-drain".into())
            .spawn(move || {
                use std::io::Write;
                std::thread::sleep(std::time::Duration::from_millis(grace));
                tracing::info!("draining: listeners closed");
                for mut s in &stops {
                    let _ = s.write_all(&[STOP_DRAIN]);
                }
            })?;
        Ok(())
    }

    /// True once every core has ended (after a drain).
    pub fn drained(&self) -> bool {
        self.cores.iter().all(JoinHandle::is_finished)
    }

    /// Ends the monitor after a drain and waits for every thread.
    pub fn finish(mut self) {
        self.stop_now();
    }

    /// Re-reads the config file on the monitor thread (SIGHUP); the outcome is logged and
    /// counted in `spillway_config_reloads_total`.
    pub fn reload(&self) {
        self.send_monitor(crate::monitor::Command::Reload);
    }

    /// Logs the monitor's view of every worker (SIGUSR1).
    pub fn dump_state(&self) {
        self.send_monitor(crate::monitor::Command::Dump);
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_now();
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
    let fusion = |tuned: bool| {
        let mut ring = io_uring::IoUring::builder();
        if tuned {
            // One thread submits to each ring, and completions are reaped when the core
            // parks: no inter-processor interrupt or signal-style task work per completion.
            ring.setup_coop_taskrun().setup_single_issuer();
        }
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .uring_builder(ring)
            .with_entries(2048)
            .enable_timer()
            .build()
    };
    // Older kernels refuse the flags (COOP_TASKRUN 5.19, SINGLE_ISSUER 6.0): plain ring.
    match fusion(true).or_else(|_| fusion(false)) {
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
    let shared = Arc::new(Shared::new(registry.build(config), cores));

    let mut core_stops = Vec::new();
    let mut cores = Vec::new();
    for (id, listener) in listeners.into_iter().enumerate() {
        let (stop_tx, stop_rx) = StdUnixStream::pair()?;
        stop_rx.set_nonblocking(true)?;
        core_stops.push(stop_tx);
        let shared = shared.clone();
        let cpu = data_cpus.get(id).copied().flatten();
        cores.push(
            std::thread::Builder::new()
                .name(format!("spillway-core-{id}"))
                .spawn(move || run_core(id, cpu, listener, stop_rx, shared))?,
        );
    }
    let (monitor, monitor_rx) = StdUnixStream::pair()?;
    monitor_rx.set_nonblocking(true)?;
    let monitor_thread = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("spillway-monitor".into())
            .spawn(move || {
                crate::monitor::run(monitor_cpu, admin, monitor_rx, shared, registry, source)
            })?
    };
    Ok(ServerHandle {
        data_addr,
        admin_addr,
        shared,
        core_stops,
        monitor,
        cores,
        monitor_thread: Some(monitor_thread),
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
        let mut cache = arc_swap::Cache::new(shared.snapshot.clone());
        let current = Rc::new(cache.load().clone());
        let seed = clock::now_ms() ^ (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(std::process::id());
        let ctx = Rc::new(CoreCtx {
            id,
            pools: RefCell::new(Pools::new()),
            rng: RefCell::new(Rng::new(seed)),
            rr: RefCell::new(Vec::new()),
            busy: RefCell::new(busy),
            snapshot: RefCell::new(SnapshotCache { cache, current }),
            active_requests: std::cell::Cell::new(0),
            request_seq: std::cell::Cell::new(0),
            request_salt: Rng::new(seed ^ 0xdead_beef).next_u64(),
            shared,
        });
        monoio::spawn(crate::upstream::sweep_pools(ctx.clone()));
        let why = accept_until_stopped(&listener, stop, "data", |stream, peer| admit(&ctx, stream, peer)).await;
        drop(listener);
        if why == STOP_DRAIN {
            drain(&ctx).await;
        }
        // Returning drops every remaining connection task: idle keep-alive connections close.
    });
}

/// Waits until this core has no request in flight, or the drain deadline.
async fn drain(ctx: &CoreCtx) {
    let deadline = ctx.shared.drain_deadline_ms.load(Ordering::Relaxed);
    while ctx.active_requests.get() > 0 && clock::now_ms() < deadline {
        monoio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    if ctx.active_requests.get() > 0 {
        tracing::warn!(
            core = ctx.id,
            cut = ctx.active_requests.get(),
            "drain timeout: cutting requests in flight"
        );
    }
}

/// Accepts connections until a byte arrives on `stop`, handing each to `accepted`, and
/// returns that byte. A failed accept (EMFILE and friends) backs off briefly instead of
/// spinning.
pub(crate) async fn accept_until_stopped(
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
