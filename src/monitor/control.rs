//! [`Control`]: the control thread's state (the monitor, the registry of generations,
//! where the config comes from, reload counts), what admin handlers and signals act on.
//! Reload is all or nothing: the file is read, validated and its names resolved on the
//! blocking pool (never in the monitor's loop), then committed with one store.

use std::cell::RefCell;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use super::Monitor;
use super::fleet::Fleet;
use crate::config::{Addrs, Config, ConfigError, ConfigSource, Overrides};
use crate::runtime::clock;
use crate::runtime::resolve::{ResolveError, resolve};
use crate::state::{Registry, Shared, Snapshot};
use crate::tls::{self, Material, TlsError};

/// Control-thread state shared by the monitor tasks and admin handlers.
#[derive(Debug)]
pub struct Control {
    pub shared: Arc<Shared>,
    /// `None` while a generation of found workers is being built off the loop.
    pub registry: Option<Registry>,
    pub source: ConfigSource,
    /// The file's configuration and its addresses, before found workers are added.
    pub base: (Config, Addrs),
    /// The worker sources and what they found.
    pub fleet: Fleet,
    pub monitor: Monitor,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    /// Admin connections closed to make room for a newer one (docs/behaviour.md §14.2).
    pub admin_evictions: u64,
}

/// Commands to the control thread, one byte each on its command socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Command {
    Stop = b'x',
    Reload = b'r',
    Dump = b'u',
}

impl Command {
    pub fn from_byte(b: u8) -> Option<Command> {
        [Command::Stop, Command::Reload, Command::Dump]
            .into_iter()
            .find(|c| *c as u8 == b)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("started without --config: there is no file to reload")]
    NoFile,
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("`{0}` cannot change on reload; restart Spillway to change it")]
    Immutable(&'static str),
    #[error("the reload was cancelled")]
    Cancelled,
    #[error("a generation of found workers is still being built; try again")]
    Busy,
}

/// A reload's inputs: the configuration, its addresses, the TLS files it names.
type Loaded = (Config, Addrs, Material);

/// Reads, validates and resolves a config file, and reads the certificates and keys it
/// names (blocking: files and DNS).
fn load(path: &Path, overrides: &Overrides) -> Result<Loaded, ReloadError> {
    let config = Config::load(path, overrides)?;
    let addrs = resolve(&config)?;
    let material = tls::load(&config.tls)?;
    Ok((config, addrs, material))
}

/// Reload (SIGHUP, `POST /reload`): the file is loaded off the loop, then committed; the
/// outcome is logged and counted either way. Returns the new generation.
pub async fn reload(control: &RefCell<Control>) -> Result<u64, ReloadError> {
    let source = control.borrow().source.clone();
    let result = match source.path {
        None => Err(ReloadError::NoFile),
        Some(path) => {
            let loaded = monoio::spawn_blocking(move || load(&path, &source.overrides)).await;
            match loaded {
                Ok(Ok((config, addrs, material))) => {
                    registry_back(control).await;
                    let committed = control.borrow_mut().commit(config, &addrs);
                    if committed.is_ok() {
                        // New handshakes use the new certificate; open sessions keep theirs.
                        control.borrow().shared.tls.store(Arc::new(material));
                    }
                    committed
                }
                Ok(Err(e)) => Err(e),
                Err(_) => Err(ReloadError::Cancelled),
            }
        }
    };
    let mut c = control.borrow_mut();
    match &result {
        Ok(generation) => {
            c.reloads_ok += 1;
            tracing::info!(generation, "configuration reloaded");
        }
        Err(e) => {
            c.reloads_failed += 1;
            tracing::error!(error = %e, "configuration reload failed; the running configuration is unchanged");
        }
    }
    result
}

/// Waits (bounded) until the registry is back from a build of found workers.
async fn registry_back(control: &RefCell<Control>) {
    for _ in 0..REGISTRY_WAIT_MS {
        if control.borrow().registry.is_some() {
            return;
        }
        monoio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// How long a reload waits for a generation of found workers to be built.
const REGISTRY_WAIT_MS: u32 = 5_000;

/// Settings that only a restart can change.
fn immutable_change(next: &Config, was: &Config) -> Option<&'static str> {
    let listener = |c: &Config| c.tls.listener.as_ref().map(|l| l.listen.clone());
    let fixed: [(&'static str, bool); 7] = [
        ("listen", next.listen == was.listen),
        ("admin_listen", next.admin_listen == was.admin_listen),
        ("cores", next.cores == was.cores),
        ("cpus", next.cpus == was.cpus),
        ("monitor_cpu", next.monitor_cpu == was.monitor_cpu),
        ("pin_cores", next.pin_cores == was.pin_cores),
        (
            "tls (whether a TLS listener runs, tls.listen)",
            listener(next) == listener(was),
        ),
    ];
    fixed.iter().find(|(_, same)| !same).map(|(key, _)| *key)
}

/// Model names and `name=url` of workers, to log what a reload changed.
fn names(c: &Config) -> (HashSet<String>, HashSet<String>) {
    (
        c.models.iter().map(|m| m.name.clone()).collect(),
        c.workers
            .iter()
            .map(|w| format!("{}={}", w.name, w.url))
            .collect(),
    )
}

fn diff(a: &HashSet<String>, b: &HashSet<String>) -> Vec<String> {
    let mut v: Vec<_> = a.difference(b).cloned().collect();
    v.sort();
    v
}

impl Control {
    /// The control thread's state for a server started with `base` (the file's
    /// configuration, which the first generation was built from).
    pub fn new(
        shared: Arc<Shared>,
        registry: Registry,
        source: ConfigSource,
        base: (Config, Addrs),
    ) -> Control {
        let monitor = Monitor::new(&shared.snapshot.load());
        let mut fleet = Fleet::default();
        fleet.sync(&base.0);
        Control {
            shared,
            registry: Some(registry),
            source,
            base,
            fleet,
            monitor,
            reloads_ok: 0,
            reloads_failed: 0,
            admin_evictions: 0,
        }
    }

    /// Re-evaluates and publishes now (after a push, a threshold change, a scrape).
    pub fn republish(&mut self) -> bool {
        let (snap, now) = self.fold_in();
        self.monitor.publish(&self.shared, &snap, now)
    }

    /// A check changed a worker's health: publishes it at once.
    pub fn publish_health(&mut self) -> bool {
        let snap = self.shared.snapshot.load_full();
        self.monitor
            .publish_health(&self.shared, &snap, clock::now_ms())
    }

    /// The monitor's tick: publishes what changed by itself since the last evaluation
    /// ([`Monitor::publish_due`]).
    pub fn tick(&mut self) -> bool {
        let (snap, now) = self.fold_in();
        self.monitor.publish_due(&self.shared, &snap, now)
    }

    /// Before an evaluation: folds tracked load in and steps the adaptive mode.
    pub(super) fn fold_in(&mut self) -> (Arc<Snapshot>, u64) {
        let snap = self.shared.snapshot.load_full();
        let now = clock::now_ms();
        self.monitor.refresh_tracked(&snap, now);
        self.monitor.refresh_beyond_slots(&snap);
        self.monitor.measure_releases(&snap, now);
        self.monitor.adaptivity.step(&snap, now);
        (snap, now)
    }

    /// Commits a loaded configuration: refuses changes that need a restart, builds the
    /// next snapshot (unchanged workers keep pools, load, busy state and slots; workers
    /// found by a source that did not change stay), switches every core to it with one
    /// store and republishes. Requests in flight finish on the snapshot they started
    /// with. On error nothing changes.
    pub fn commit(&mut self, next: Config, addrs: &Addrs) -> Result<u64, ReloadError> {
        let old = self.shared.snapshot.load_full();
        if let Some(key) = immutable_change(&next, &old.config) {
            return Err(ReloadError::Immutable(key));
        }
        if self.registry.is_none() {
            return Err(ReloadError::Busy);
        }
        self.fleet.sync(&next);
        self.base = (next, addrs.clone());
        let (next, addrs) = self.effective();
        let addrs = &addrs;
        let ((old_models, old_workers), (new_models, new_workers)) =
            (names(&old.config), names(&next));
        let Some(registry) = self.registry.as_mut() else {
            return Err(ReloadError::Busy);
        };
        let snap = Arc::new(registry.build(next, addrs));
        self.monitor.on_reload(&snap);
        self.shared.snapshot.store(snap.clone());
        self.republish();
        tracing::info!(
            generation = snap.generation,
            models_added = ?diff(&new_models, &old_models),
            models_removed = ?diff(&old_models, &new_models),
            workers_added = ?diff(&new_workers, &old_workers),
            workers_removed = ?diff(&old_workers, &new_workers),
            "new configuration committed on every core"
        );
        Ok(snap.generation)
    }

    /// Logs the monitor's view of every worker (SIGUSR1).
    pub fn dump(&self) {
        let snap = self.shared.snapshot.load_full();
        let published = self.monitor.published();
        tracing::info!(generation = snap.generation, busy_set = published.generation, stats = %self.shared.stats(), "state dump");
        for w in self.monitor.report(&snap, clock::now_ms()) {
            w.log();
        }
    }
}
