//! The monitor: a dedicated thread that owns all load state, evaluates the busy rule and
//! publishes the busy set to every core's replica. It also hosts the admin listener, so
//! admin calls act on monitor state directly, without locks or cross-thread hops.

pub mod load;
pub mod scrape;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::net::TcpListener as StdListener;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::config::Overrides;
use crate::config::snapshot::{Registry, Snapshot};
use crate::core::{Shared, clock};
use crate::shed::Thresholds;
use load::{Latches, LoadTable, Timed};

/// The busy set as published: immutable, one per publish, read lock-free by the cores.
#[derive(Debug, Default, Clone)]
pub struct BusySet {
    pub generation: u64,
    /// Bit per model id: a threshold is configured, so busy members are excluded.
    enabled: Vec<u64>,
    /// Bit per member id: the (model, worker) pair is busy.
    busy: Vec<u64>,
    /// Per member id: load in permille of the fullest known signal (least-loaded ties).
    load: Vec<u16>,
}

impl PartialEq for BusySet {
    /// Same content (the generation is not content).
    fn eq(&self, other: &Self) -> bool {
        fn trimmed(v: &[u64]) -> &[u64] {
            let n = v.iter().rposition(|w| *w != 0).map_or(0, |i| i + 1);
            &v[..n]
        }
        let loads = |v: &[u16]| v.iter().rposition(|l| *l != 0).map_or(0, |i| i + 1);
        trimmed(&self.enabled) == trimmed(&other.enabled)
            && trimmed(&self.busy) == trimmed(&other.busy)
            && self.load[..loads(&self.load)] == other.load[..loads(&other.load)]
    }
}

fn bit(words: &[u64], i: u32) -> bool {
    words
        .get((i / 64) as usize)
        .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
}

fn set_bit(words: &mut Vec<u64>, i: u32) {
    let w = (i / 64) as usize;
    if words.len() <= w {
        words.resize(w + 1, 0);
    }
    words[w] |= 1u64 << (i % 64);
}

impl BusySet {
    #[inline]
    pub fn enabled(&self, model_id: u32) -> bool {
        bit(&self.enabled, model_id)
    }

    #[inline]
    pub fn is_busy(&self, member_id: u32) -> bool {
        bit(&self.busy, member_id)
    }

    #[inline]
    pub fn load(&self, member_id: u32) -> u16 {
        self.load.get(member_id as usize).copied().unwrap_or(0)
    }

    pub fn set_enabled(&mut self, model_id: u32) {
        set_bit(&mut self.enabled, model_id);
    }

    pub fn set_busy(&mut self, member_id: u32) {
        set_bit(&mut self.busy, member_id);
    }

    pub fn set_load(&mut self, member_id: u32, permille: u16) {
        let i = member_id as usize;
        if self.load.len() <= i {
            self.load.resize(i + 1, 0);
        }
        self.load[i] = permille;
    }

    /// Empties the set, keeping its storage.
    pub fn clear(&mut self) {
        self.enabled.iter_mut().for_each(|w| *w = 0);
        self.busy.iter_mut().for_each(|w| *w = 0);
        self.load.iter_mut().for_each(|l| *l = 0);
    }
}

/// Where the configuration comes from, kept for reloads.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub path: Option<PathBuf>,
    pub overrides: Overrides,
}

/// The monitor's state: load from every source, effective thresholds, decode latches, and
/// the last published busy set.
#[derive(Debug)]
pub struct Monitor {
    pub table: LoadTable,
    /// Effective thresholds per model: the config's, then `/busy_threshold` changes.
    pub thresholds: HashMap<String, Thresholds>,
    /// The thresholds the config file gave, to tell on reload whether the file changed them.
    file_thresholds: HashMap<String, Thresholds>,
    latches: Latches,
    scratch: BusySet,
    published: Arc<BusySet>,
    pub publishes: u64,
}

impl Monitor {
    pub fn new(snap: &Snapshot) -> Monitor {
        let file: HashMap<_, _> = snap
            .config
            .models
            .iter()
            .map(|m| (m.name.clone(), m.thresholds))
            .collect();
        Monitor {
            table: LoadTable::default(),
            thresholds: file.clone(),
            file_thresholds: file,
            latches: Latches::default(),
            scratch: BusySet::default(),
            published: Arc::new(BusySet::default()),
            publishes: 0,
        }
    }

    /// Carries state into a new config generation: thresholds set through the API survive
    /// unless the file changed that model's thresholds; state of removed workers goes.
    pub fn on_reload(&mut self, snap: &Snapshot) {
        let mut thresholds = HashMap::new();
        for m in &snap.config.models {
            let kept = self.thresholds.get(&m.name).copied();
            let unchanged = self.file_thresholds.get(&m.name) == Some(&m.thresholds);
            thresholds.insert(
                m.name.clone(),
                kept.filter(|_| unchanged).unwrap_or(m.thresholds),
            );
        }
        self.thresholds = thresholds;
        self.file_thresholds = snap
            .config
            .models
            .iter()
            .map(|m| (m.name.clone(), m.thresholds))
            .collect();
        self.table.retain(snap);
    }

    pub fn published(&self) -> &BusySet {
        &self.published
    }

    /// Folds what the cores routed and have not finished into the tracked source: sums
    /// over cores, spread evenly over the worker's ranks. Allocates nothing once warm.
    pub fn refresh_tracked(&mut self, snap: &Snapshot, now: u64) {
        for w in snap.workers.iter().filter(|w| w.cfg.load_sources.tracked) {
            let (mut prefill, mut blocks) = (0u64, 0u64);
            for cell in w.state.tracked.iter() {
                prefill = prefill.wrapping_add(cell.prefill_tokens.load(Relaxed));
                blocks = blocks.wrapping_add(cell.decode_blocks.load(Relaxed));
            }
            let load = self.table.worker(w.state.slot);
            let ranks = load.dp_size(&w.cfg) as u64;
            for r in 0..ranks as usize {
                let rank = load.rank_mut(r);
                rank.tracked.active_prefill_tokens = Some(Timed {
                    value: prefill.div_ceil(ranks),
                    at: now,
                });
                rank.tracked.active_decode_blocks = Some(Timed {
                    value: blocks.div_ceil(ranks),
                    at: now,
                });
            }
        }
    }

    /// Re-evaluates the busy rule and, when the set changed, publishes it to every core's
    /// replica before returning. Returns whether it published.
    pub fn publish(&mut self, shared: &Shared, snap: &Snapshot, now: u64) -> bool {
        let staleness = snap.config.load_staleness_ms;
        load::evaluate(
            snap,
            &self.table,
            &self.thresholds,
            &mut self.latches,
            now,
            staleness,
            &mut self.scratch,
        );
        // Workers marked overloaded by a refusal are skipped until the next publication:
        // publish a new generation even when the set itself did not change.
        let marked = snap
            .workers
            .iter()
            .any(|w| w.state.is_overloaded(self.published.generation));
        if self.scratch == *self.published && !marked {
            return false;
        }
        let mut next = self.scratch.clone();
        next.generation = self.published.generation + 1;
        let next = Arc::new(next);
        for replica in shared.busy.iter() {
            replica.store(next.clone());
        }
        self.published = next;
        self.publishes += 1;
        true
    }

    /// Busy members of a model in the published set.
    pub fn busy_workers(&self, snap: &Snapshot, model: &str) -> usize {
        snap.models
            .iter()
            .filter(|m| &*m.name == model)
            .flat_map(|m| m.members.iter())
            .filter(|m| self.published.is_busy(m.id))
            .count()
    }

    /// Stores one scrape's result for a worker (missing metrics become unknown).
    pub fn apply_scrape(
        &mut self,
        snap: &Snapshot,
        slot: u32,
        result: Result<String, String>,
        now: u64,
    ) {
        let Some(w) = snap.workers.iter().find(|w| w.state.slot == slot) else {
            return;
        };
        let load = self.table.worker(slot);
        match result {
            Ok(text) => {
                let ranks = scrape::parse(w.cfg.metrics_format, &text, &w.cfg);
                load.last_scrape = Some(now);
                load.scrape_error = None;
                for (i, r) in ranks.iter().enumerate() {
                    let rank = load.rank_mut(i);
                    rank.scrape.kv_used_blocks =
                        r.kv_used_blocks.map(|value| Timed { value, at: now });
                    rank.scrape.active_decode_blocks = None;
                    rank.scrape.active_prefill_tokens = None;
                    if r.kv_total_blocks.is_some() {
                        rank.kv_total_blocks = r.kv_total_blocks;
                    }
                    rank.running = r.running;
                    rank.waiting = r.waiting;
                }
            }
            Err(e) => {
                if load.scrape_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(worker = %w.cfg.name, error = %e, "scrape failed");
                }
                load.scrape_error = Some(e);
            }
        }
    }
}

/// Control-thread state shared by the monitor tasks and admin handlers.
#[derive(Debug)]
pub struct Control {
    pub shared: Arc<Shared>,
    pub registry: Registry,
    pub source: ConfigSource,
    pub monitor: Monitor,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
}

/// Commands to the monitor thread, one byte each on its control socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Command {
    Stop = b'x',
    Reload = b'r',
    Dump = b'u',
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("started without --config: there is no file to reload")]
    NoFile,
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("`{0}` cannot change on reload; restart Spillway to change it")]
    Immutable(&'static str),
}

impl Control {
    /// Re-evaluates and publishes now (after a push, a threshold change, a scrape).
    pub fn republish(&mut self) -> bool {
        let snap = self.shared.snapshot.load_full();
        let now = clock::now_ms();
        self.monitor.refresh_tracked(&snap, now);
        self.monitor.publish(&self.shared, &snap, now)
    }

    /// Reload, all or nothing: parse and validate the file, refuse changes that need a
    /// restart, build the next snapshot (unchanged workers keep pools, load, busy state and
    /// slots), then switch every core to it with one store. Requests in flight finish on
    /// the snapshot they started with. On error nothing changes.
    pub fn reload(&mut self) -> Result<u64, ReloadError> {
        let result = self.try_reload();
        match &result {
            Ok(generation) => {
                self.reloads_ok += 1;
                tracing::info!(generation, "configuration reloaded");
            }
            Err(e) => {
                self.reloads_failed += 1;
                tracing::error!(error = %e, "configuration reload failed; the running configuration is unchanged");
            }
        }
        result
    }

    fn try_reload(&mut self) -> Result<u64, ReloadError> {
        let path = self.source.path.as_ref().ok_or(ReloadError::NoFile)?;
        let next = crate::config::Config::load(path, &self.source.overrides)?;
        let old = self.shared.snapshot.load_full();
        let was = &old.config;
        let fixed: [(&'static str, bool); 6] = [
            ("listen", next.listen == was.listen),
            ("admin_listen", next.admin_listen == was.admin_listen),
            ("cores", next.cores == was.cores),
            ("cpus", next.cpus == was.cpus),
            ("monitor_cpu", next.monitor_cpu == was.monitor_cpu),
            ("pin_cores", next.pin_cores == was.pin_cores),
        ];
        if let Some((key, _)) = fixed.iter().find(|(_, same)| !same) {
            return Err(ReloadError::Immutable(key));
        }
        let names = |c: &crate::config::Config| -> (HashSet<String>, HashSet<String>) {
            (
                c.models.iter().map(|m| m.name.clone()).collect(),
                c.workers
                    .iter()
                    .map(|w| format!("{}={}", w.name, w.url))
                    .collect(),
            )
        };
        let ((old_models, old_workers), (new_models, new_workers)) = (names(was), names(&next));
        let snap = Arc::new(self.registry.build(next));
        self.monitor.on_reload(&snap);
        self.shared.snapshot.store(snap.clone());
        self.republish();
        let diff = |a: &HashSet<String>, b: &HashSet<String>| {
            let mut v: Vec<_> = a.difference(b).cloned().collect();
            v.sort();
            v
        };
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
            tracing::info!(
                worker = %w.worker_id,
                url = %w.url,
                down = w.down,
                busy_in = ?w.busy_in,
                inflight = w.inflight,
                slots_in_use = w.slots_in_use,
                slots = ?w.slots,
                queued = w.queued,
                push = w.sources.push,
                scrape = w.sources.scrape,
                tracked = w.sources.tracked,
                push_age_ms = ?w.last_push_age_ms,
                scrape_age_ms = ?w.last_scrape_age_ms,
                scrape_error = ?w.scrape_error,
                "worker"
            );
            for r in &w.ranks {
                tracing::info!(
                    worker = %w.worker_id,
                    rank = r.dp_rank,
                    active_decode_blocks = ?r.load.active_decode_blocks,
                    kv_used_blocks = ?r.load.kv_used_blocks,
                    active_prefill_tokens = ?r.load.active_prefill_tokens,
                    kv_total_blocks = ?r.load.kv_total_blocks,
                    max_num_batched_tokens = ?r.load.max_num_batched_tokens,
                    "rank"
                );
            }
        }
    }
}

/// What the monitor believes about one worker (`GET /load`, SIGUSR1).
#[derive(Debug, serde::Serialize)]
pub struct WorkerReport {
    pub worker_id: String,
    pub url: String,
    pub down: bool,
    /// Models in whose published busy set the worker is.
    pub busy_in: Vec<String>,
    pub inflight: u64,
    pub slots_in_use: u64,
    /// `engine_request_limit`, when set.
    pub slots: Option<u32>,
    pub queued: u64,
    pub sources: crate::config::LoadSources,
    pub last_push_age_ms: Option<u64>,
    pub last_scrape_age_ms: Option<u64>,
    pub scrape_error: Option<String>,
    pub ranks: Vec<RankReport>,
}

#[derive(Debug, serde::Serialize)]
pub struct RankReport {
    pub dp_rank: usize,
    #[serde(flatten)]
    pub load: crate::shed::RankLoad,
}

impl Monitor {
    /// One report per configured worker, effective loads as the busy rule sees them now.
    pub fn report(&self, snap: &Snapshot, now: u64) -> Vec<WorkerReport> {
        let empty = load::WorkerLoad::default();
        let published = self.published();
        snap.workers
            .iter()
            .map(|w| {
                let load = self.table.workers.get(&w.state.slot).unwrap_or(&empty);
                let busy_in = snap
                    .models
                    .iter()
                    .filter(|m| {
                        m.members.iter().any(|mm| {
                            snap.workers[mm.worker as usize].state.slot == w.state.slot
                                && published.is_busy(mm.id)
                        })
                    })
                    .map(|m| m.name.to_string())
                    .collect();
                let (slots_in_use, queued) = w.gate.as_ref().map_or((0, 0), |g| g.occupancy());
                let staleness = snap.config.load_staleness_ms;
                WorkerReport {
                    worker_id: w.cfg.name.clone(),
                    url: w.cfg.url.clone(),
                    down: w.state.is_down(now),
                    busy_in,
                    inflight: w.state.inflight_total(),
                    slots_in_use,
                    slots: w.gate.as_ref().map(|g| g.limit()),
                    queued,
                    sources: w.cfg.load_sources,
                    last_push_age_ms: load.last_push.map(|t| now.saturating_sub(t)),
                    last_scrape_age_ms: load.last_scrape.map(|t| now.saturating_sub(t)),
                    scrape_error: load.scrape_error.clone(),
                    ranks: (0..load.dp_size(&w.cfg))
                        .map(|r| RankReport {
                            dp_rank: r,
                            load: load.effective(r, &w.cfg, now, staleness),
                        })
                        .collect(),
                }
            })
            .collect()
    }
}

/// Runs the monitor thread: admin listener plus monitor tasks, until stopped.
pub fn run(
    cpu: Option<usize>,
    admin: StdListener,
    commands: StdUnixStream,
    shared: Arc<Shared>,
    registry: Registry,
    source: ConfigSource,
) {
    crate::core::pin_current(cpu, "monitor");
    let mut rt = match crate::core::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the monitor runtime");
            return;
        }
    };
    rt.block_on(async move {
        let monitor = Monitor::new(&shared.snapshot.load());
        let control = Rc::new(RefCell::new(Control {
            shared,
            registry,
            source,
            monitor,
            reloads_ok: 0,
            reloads_failed: 0,
        }));
        control.borrow_mut().republish();
        monoio::spawn(tick(control.clone()));
        monoio::spawn(scrape_loop(control.clone()));
        let listener = match monoio::net::TcpListener::from_std(admin) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot adopt the admin listener");
                return;
            }
        };
        let (stop_admin, stop) = match StdUnixStream::pair()
            .and_then(|(a, b)| b.set_nonblocking(true).map(|()| (a, b)))
        {
            Ok(pair) => pair,
            Err(e) => {
                tracing::error!(error = %e, "cannot create the admin stop channel");
                return;
            }
        };
        monoio::spawn(serve_commands(control.clone(), commands, stop_admin));
        crate::core::accept_until_stopped(&listener, stop, "admin", |stream, _| {
            monoio::spawn(crate::admin::serve(control.clone(), stream));
        })
        .await;
    });
}

/// Reads [`Command`]s from the process (signals arrive here as bytes).
async fn serve_commands(
    control: Rc<RefCell<Control>>,
    commands: StdUnixStream,
    stop_admin: StdUnixStream,
) {
    use monoio::io::AsyncReadRent;
    use std::io::Write;
    let stop = |mut s: &StdUnixStream| {
        let _ = s.write_all(b"x");
    };
    let mut rx = match monoio::net::UnixStream::from_std(commands) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot adopt the command channel");
            return stop(&stop_admin);
        }
    };
    let mut buf = vec![0u8; 64];
    loop {
        let (res, b) = rx.read(buf).await;
        buf = b;
        let n = match res {
            Ok(n) if n > 0 => n,
            _ => return stop(&stop_admin),
        };
        for &byte in &buf[..n] {
            match byte {
                b if b == Command::Stop as u8 => return stop(&stop_admin),
                b if b == Command::Reload as u8 => {
                    let _ = control.borrow_mut().reload();
                }
                b if b == Command::Dump as u8 => control.borrow().dump(),
                _ => {}
            }
        }
    }
}

/// Folds tracked load in and republishes on a fixed interval.
async fn tick(control: Rc<RefCell<Control>>) {
    loop {
        let interval = control
            .borrow()
            .shared
            .snapshot
            .load()
            .config
            .monitor_interval_ms;
        monoio::time::sleep(Duration::from_millis(interval)).await;
        control.borrow_mut().republish();
    }
}

/// Polls every worker with the `scrape` source once per interval; one scrape per worker
/// in flight at a time.
async fn scrape_loop(control: Rc<RefCell<Control>>) {
    let in_flight: Rc<RefCell<HashSet<u32>>> = Rc::default();
    loop {
        let snap = control.borrow().shared.snapshot.load_full();
        let interval = Duration::from_millis(snap.config.scrape_interval_ms);
        for w in snap.workers.iter().filter(|w| w.cfg.load_sources.scrape) {
            let slot = w.state.slot;
            if !in_flight.borrow_mut().insert(slot) {
                continue;
            }
            let (addr, host, path) = (
                w.cfg.metrics_addr,
                w.cfg.metrics_host.clone(),
                w.cfg.metrics_path.clone(),
            );
            let timeout = interval.clamp(Duration::from_millis(100), Duration::from_secs(5));
            let control = control.clone();
            let in_flight = in_flight.clone();
            monoio::spawn(async move {
                let result = scrape::fetch(addr, &host, &path, timeout).await;
                in_flight.borrow_mut().remove(&slot);
                let mut c = control.borrow_mut();
                let snap = c.shared.snapshot.load_full();
                c.monitor.apply_scrape(&snap, slot, result, clock::now_ms());
                c.republish();
            });
        }
        monoio::time::sleep(interval).await;
    }
}
