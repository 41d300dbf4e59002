//! The wiring: [`start`] resolves the configuration's names, binds every listener, builds
//! the shared state and starts the threads (one per data core, one control thread for
//! the monitor and the admin listener); [`ServerHandle`] stops, drains and reloads them.

mod control;
mod core;

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use crate::accesslog;
use crate::config::{Config, ConfigSource};
use crate::monitor::Command;
use crate::runtime::listen::{STOP_DRAIN, STOP_NOW, bind_reuseport, stop_channel};
use crate::runtime::{clock, placement, resolve};
use crate::state::{Registry, Shared};
use crate::tls;

/// A running server. Dropping it stops every thread at once.
#[derive(Debug)]
pub struct ServerHandle {
    /// The data listener (speaking TLS when `[tls]` has a certificate and no `listen`).
    pub data_addr: SocketAddr,
    /// The TLS listener beside it (`tls.listen`).
    pub tls_addr: Option<SocketAddr>,
    pub admin_addr: SocketAddr,
    pub shared: Arc<Shared>,
    /// One per listener of each data core: a byte stops its accept loop (`STOP_NOW`,
    /// `STOP_DRAIN`).
    core_stops: Vec<StdUnixStream>,
    /// [`Command`]s to the control thread.
    control: StdUnixStream,
    cores: Vec<JoinHandle<()>>,
    control_thread: Option<JoinHandle<()>>,
    /// Set to make the access log's writer reopen its file (SIGUSR2).
    access_log_reopen: Arc<std::sync::atomic::AtomicBool>,
}

/// Starts the data-path cores and the control thread. Names in the configuration are
/// resolved here, before any thread starts.
pub fn start(config: Config, source: ConfigSource) -> io::Result<ServerHandle> {
    let addrs = resolve::resolve(&config).map_err(|e| io::Error::other(e.to_string()))?;
    let cores = config.cores.max(1);
    let (data_cpus, control_cpu) = placement(&config);

    // Bind everything first so errors surface before any thread starts.
    let (listeners, data_addr) = bind_per_core(addrs.listen, cores)?;
    let (tls_listeners, tls_addr) = match addrs.tls_listen {
        Some(addr) => bind_per_core(addr, cores).map(|(l, a)| (l, Some(a)))?,
        None => (Vec::new(), None),
    };
    let admin = bind_reuseport(addrs.admin_listen)?;
    let admin_addr = admin.local_addr()?;
    // Certificates and trust roots: a bad file stops the start here.
    let material = tls::load(&config.tls).map_err(io::Error::other)?;
    let data_is_tls = (config.tls.listener.as_ref()).is_some_and(|l| l.listen.is_none());

    let mut registry = Registry::new(cores, clock::unix_secs());
    let shared = Arc::new(Shared::new(registry.build(config, &addrs), cores));
    shared.tls.store(Arc::new(material));

    let snapshots = shared.snapshot.clone();
    let (logs, writer) = accesslog::start(cores, move |current| {
        let snap = snapshots.load();
        let dest = &snap.config.access_log.destination;
        (dest != current).then(|| dest.clone())
    })?;
    let mut core_stops = Vec::new();
    let mut threads = Vec::new();
    let mut tls_listeners = tls_listeners.into_iter();
    for ((id, listener), log) in listeners.into_iter().enumerate().zip(logs) {
        let mut parts = Vec::with_capacity(2);
        for (socket, tls) in
            std::iter::once((listener, data_is_tls)).chain(tls_listeners.next().map(|l| (l, true)))
        {
            let (stop_tx, stop_rx) = stop_channel()?;
            core_stops.push(stop_tx);
            parts.push((socket, stop_rx, tls));
        }
        let cpu = data_cpus.get(id).copied().flatten();
        let core = core::Core {
            id,
            cpu,
            listeners: parts,
            shared: shared.clone(),
            log,
        };
        threads.push(core::spawn(core)?);
    }
    let (control, commands) = stop_channel()?;
    let parts = control::Parts {
        shared: shared.clone(),
        registry,
        source,
        addrs,
        admin,
        commands,
    };
    let control_thread = control::spawn(control_cpu, parts)?;
    Ok(ServerHandle {
        data_addr,
        tls_addr,
        admin_addr,
        shared,
        core_stops,
        control,
        cores: threads,
        control_thread: Some(control_thread),
        access_log_reopen: writer.reopen,
    })
}

/// One SO_REUSEPORT listener per core on `addr` (port 0: the first one's port), and the
/// address they share.
fn bind_per_core(addr: SocketAddr, cores: usize) -> io::Result<(Vec<StdListener>, SocketAddr)> {
    let first = bind_reuseport(addr)?;
    let addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..cores {
        listeners.push(bind_reuseport(addr)?);
    }
    Ok((listeners, addr))
}

impl ServerHandle {
    fn send_cores(&self, byte: u8) {
        use std::io::Write;
        for mut s in &self.core_stops {
            let _ = s.write_all(&[byte]);
        }
    }

    fn send_control(&self, command: Command) {
        use std::io::Write;
        let _ = (&self.control).write_all(&[command as u8]);
    }

    /// Makes the access log's writer reopen its file (after logrotate moved it).
    pub fn reopen_access_log(&self) {
        self.access_log_reopen
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Stops every core and the control thread now (requests in flight are cut) and waits.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.send_cores(STOP_NOW);
        for t in self.cores.drain(..) {
            let _ = t.join();
        }
        self.send_control(Command::Stop);
        if let Some(t) = self.control_thread.take() {
            let _ = t.join();
        }
    }

    /// Starts a graceful drain (SIGTERM): health answers 503 at once, the listeners close
    /// after `drain_grace_ms`, and each core ends once its requests in flight are done or
    /// `drain_timeout_ms` has passed. Returns at once; see [`ServerHandle::drained`].
    pub fn begin_drain(&self) -> io::Result<()> {
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
            .collect::<io::Result<Vec<_>>>()?;
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

    /// Ends the control thread after a drain and waits for every thread.
    pub fn finish(mut self) {
        self.stop_now();
    }

    /// Re-reads the config file on the control thread (SIGHUP); the outcome is logged
    /// and counted in `spillway_config_reloads_total`.
    pub fn reload(&self) {
        self.send_control(Command::Reload);
    }

    /// Logs the monitor's view of every worker (SIGUSR1).
    pub fn dump_state(&self) {
        self.send_control(Command::Dump);
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}
