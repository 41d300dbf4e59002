//! What the worker sources found, per model ([`Fleet`]), and how it becomes a generation:
//! the file's configuration plus the found workers, built at most every
//! [`BUILD_INTERVAL_MS`] and committed like a reload (unchanged workers keep their state;
//! a vanished one gets no new requests, finishes what it has, its pool drains). A source
//! that fails keeps its last good membership. The sources themselves: `discover.rs`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use super::Control;
use super::generation::{Built, FoundMap, FoundMember, Job};
use crate::config::{Addrs, Config, DiscoverySource, NatsConfig};
use crate::runtime::clock;
use crate::state::SlotSet;
use crate::state::Snapshot;

/// Found workers are folded into a new generation at most this often.
pub const BUILD_INTERVAL_MS: u64 = 100;

/// One model's source: its settings, its task's epoch and how it fares.
#[derive(Debug, Clone)]
pub struct SourceState {
    pub spec: DiscoverySource,
    /// The running task's id; a task whose epoch is not current stops.
    pub epoch: u64,
    pub running: bool,
    /// Whether its last attempt succeeded (`None`: none finished yet).
    pub up: Option<bool>,
    pub errors: u64,
    pub last_error: Option<String>,
    pub updates: u64,
}

/// What one of the NATS connections is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatsRole {
    /// `subscribe`: load events in.
    Subscribe,
    /// `publish`: this Spillway's workers' load out.
    Publish,
    /// `replica_sync`: the peers' routed load in.
    PeerSubscribe,
    /// `replica_sync`: this replica's routed load out.
    PeerPublish,
}

impl NatsRole {
    pub const ALL: [NatsRole; 4] = [
        NatsRole::Subscribe,
        NatsRole::Publish,
        NatsRole::PeerSubscribe,
        NatsRole::PeerPublish,
    ];

    /// Its `role` label.
    pub fn label(self) -> &'static str {
        match self {
            NatsRole::Subscribe => "subscribe",
            NatsRole::Publish => "publish",
            NatsRole::PeerSubscribe => "replica_subscribe",
            NatsRole::PeerPublish => "replica_publish",
        }
    }
}

/// Load over NATS: the settings, the tasks' epoch, and counts for `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct NatsState {
    pub config: Option<NatsConfig>,
    pub epoch: u64,
    pub running: bool,
    /// Whether each role's connection is up ([`NatsRole`] order).
    pub up: [bool; 4],
    pub received: u64,
    /// Events applied, and events for workers this Spillway does not have.
    pub applied: u64,
    pub unknown: u64,
    pub invalid: u64,
    pub published: u64,
    pub errors: u64,
    /// Slots of the workers whose load arrived since the last publication.
    pub touched: SlotSet,
    /// Replica sync: peers' messages applied, refused as invalid; this replica's sent.
    pub peer_received: u64,
    pub peer_invalid: u64,
    pub peer_published: u64,
}

impl NatsState {
    pub fn is_up(&self, role: NatsRole) -> bool {
        self.up[role as usize]
    }

    /// Marks a role's connection up or down; returns whether it was up.
    pub fn set_up(&mut self, role: NatsRole, up: bool) -> bool {
        std::mem::replace(&mut self.up[role as usize], up)
    }
}

/// The sources of every model and what they found.
#[derive(Debug, Default)]
pub struct Fleet {
    pub sources: BTreeMap<String, SourceState>,
    pub nats: NatsState,
    /// This process's id among front-door replicas (`[nats] replica_sync`), made once.
    pub replica_id: String,
    pub found: FoundMap,
    next_epoch: u64,
    dirty: bool,
    last_build_ms: u64,
}

impl Fleet {
    /// Matches the sources to a new file configuration: a model whose source changed or
    /// went gets a new epoch (its old task stops) and forgets what it found.
    pub fn sync(&mut self, config: &Config) {
        let mut next = BTreeMap::new();
        for m in &config.models {
            let Some(d) = &m.discovery else { continue };
            match self.sources.remove(&m.name) {
                Some(s) if s.spec == d.source => {
                    next.insert(m.name.clone(), s);
                }
                _ => {
                    self.next_epoch += 1;
                    self.found.remove(&m.name);
                    next.insert(
                        m.name.clone(),
                        SourceState {
                            spec: d.source.clone(),
                            epoch: self.next_epoch,
                            running: false,
                            up: None,
                            errors: 0,
                            last_error: None,
                            updates: 0,
                        },
                    );
                }
            }
        }
        self.found.retain(|model, _| next.contains_key(model));
        self.sources = next;
        if self.nats.config != config.nats {
            self.next_epoch += 1;
            self.nats = NatsState {
                config: config.nats.clone(),
                epoch: self.next_epoch,
                ..NatsState::default()
            };
        }
    }

    pub fn current(&self, model: &str, epoch: u64) -> bool {
        self.sources.get(model).is_some_and(|s| s.epoch == epoch)
    }

    /// Sources whose task must start: (model, settings, epoch), marked running.
    pub fn to_start(&mut self) -> Vec<(String, DiscoverySource, u64)> {
        self.sources
            .iter_mut()
            .filter(|(_, s)| !s.running)
            .map(|(m, s)| {
                s.running = true;
                (m.clone(), s.spec.clone(), s.epoch)
            })
            .collect()
    }

    /// A source's outcome. Returns `false` when the task is no longer current.
    pub fn update(
        &mut self,
        model: &str,
        epoch: u64,
        result: Result<Vec<FoundMember>, String>,
    ) -> bool {
        let Some(s) = self.sources.get_mut(model).filter(|s| s.epoch == epoch) else {
            return false;
        };
        let kind = s.spec.kind();
        match result {
            Ok(mut list) => {
                list.sort_by(|a, b| a.0.name.cmp(&b.0.name));
                if s.up != Some(true) {
                    tracing::info!(
                        model,
                        source = kind,
                        members = list.len(),
                        "worker source answered"
                    );
                }
                s.up = Some(true);
                s.last_error = None;
                if self.found.get(model).map(|l| &l[..]) != Some(&list[..]) {
                    s.updates += 1;
                    self.found.insert(model.to_string(), list.into());
                    self.dirty = true;
                }
            }
            Err(e) => {
                s.errors += 1;
                if s.up != Some(false) {
                    let kept = self.found.get(model).map_or(0, |l| l.len());
                    tracing::warn!(model, source = kind, error = %e, kept, "worker source failed; keeping its last good membership");
                }
                s.up = Some(false);
                s.last_error = Some(e);
            }
        }
        true
    }

    /// Members a model's source holds now.
    pub fn members(&self, model: &str) -> usize {
        self.found.get(model).map_or(0, |l| l.len())
    }
}

impl Control {
    /// The file's configuration with what the sources found: the next generation.
    pub(super) fn effective(&self) -> (Config, Addrs) {
        let (config, addrs, skipped) = self.base.0.with_found(&self.base.1, &self.fleet.found);
        for reason in skipped {
            tracing::warn!("{reason}");
        }
        (config, addrs)
    }

    /// The build of what the sources found, when it changed, the last build is old
    /// enough and the registry is here (not away with a build); marks it built.
    fn found_job(&mut self, now: u64) -> Option<Job> {
        let due = self.fleet.dirty
            && now.saturating_sub(self.fleet.last_build_ms) >= BUILD_INTERVAL_MS
            && self.registry.is_some();
        if !due {
            return None;
        }
        let registry = self.registry.take()?;
        self.fleet.dirty = false;
        self.fleet.last_build_ms = now;
        Some(Job {
            registry,
            base: self.base.clone(),
            found: self.fleet.found.clone(),
            old: self.shared.snapshot.load_full(),
        })
    }

    /// Commits a generation built off the loop (`back`: when it came back): one store
    /// for every core, then only the members that joined, left or changed are evaluated
    /// again. The log line's `build_ms` runs from the start of the build, `commit_us` is
    /// this step's time on the loop.
    fn commit_found(&mut self, mut built: Built, started: u64, back: std::time::Instant) {
        // The change is against the generation the build started from; only a build
        // moves the registry's generation on, so another one in between means a full pass.
        let running = self.shared.snapshot.load().generation;
        built.change.full |= running + 1 != built.snap.generation;
        for reason in &built.skipped {
            tracing::warn!("{reason}");
        }
        let before = self.shared.snapshot.load().workers.len();
        let snap = Arc::new(built.snap);
        self.monitor
            .on_members_changed(&snap, &built.change, built.index);
        let replaced = self.shared.snapshot.swap(snap.clone());
        retire(replaced);
        let now = self.fold_in().1;
        self.monitor
            .publish_change(&self.shared, &snap, now, &built.change);
        tracing::info!(
            generation = snap.generation,
            build_ms = clock::now_ms().saturating_sub(started),
            commit_us = clock::since(back).as_micros() as u64,
            joined_or_changed = built.change.evaluate.len(),
            left = built.change.left.len(),
            workers_before = before,
            workers = snap.workers.len(),
            found = ?self.fleet.sources.keys().map(|m| (m.as_str(), self.fleet.members(m))).collect::<Vec<_>>(),
            "found workers committed on every core"
        );
    }
}

/// Commits what the sources found when it changed and the last build is old enough. The
/// configuration and snapshot are built on the blocking pool (the registry goes with
/// them and comes back); the loop keeps applying NATS load meanwhile.
pub async fn build_found(control: &Rc<RefCell<Control>>, now: u64) {
    let Some(job) = control.borrow_mut().found_job(now) else {
        return;
    };
    let Ok((registry, built)) = monoio::spawn_blocking(move || job.run()).await else {
        // The pool is gone (shutting down): the registry with it.
        return tracing::warn!("building a generation of found workers was cancelled");
    };
    let mut c = control.borrow_mut();
    c.registry = Some(registry);
    c.commit_found(built, now, clock::now());
}

/// Drops a replaced snapshot on the blocking pool: the last reference to thousands of
/// workers' settings is freed off the loop (a core still reading it drops it itself).
fn retire(snap: Arc<Snapshot>) {
    monoio::spawn(async move {
        let _ = monoio::spawn_blocking(move || drop(snap)).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Found, HostPort, Overrides};

    fn config(prefix: &str) -> Config {
        let text = format!(
            "[[models]]\nname = \"m\"\n[models.etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nprefix = \"{prefix}\"\n"
        );
        Config::parse(&text, &Overrides::default()).unwrap()
    }

    fn found(name: &str) -> FoundMember {
        let hp = HostPort::parse("127.0.0.1:7").unwrap();
        let mut f = Found::at(hp);
        f.name = name.into();
        Arc::new((f, "127.0.0.1:7".parse().unwrap()))
    }

    #[test]
    fn a_failing_source_keeps_its_last_good_members() {
        let mut fleet = Fleet::default();
        fleet.sync(&config("/a/"));
        let starts = fleet.to_start();
        assert_eq!(starts.len(), 1);
        let epoch = starts[0].2;
        assert!(fleet.to_start().is_empty(), "started once");
        assert!(fleet.update("m", epoch, Ok(vec![found("b"), found("a")])));
        assert!(std::mem::take(&mut fleet.dirty));
        assert_eq!(fleet.found["m"][0].0.name, "a", "sorted by name");
        // The same answer again changes nothing.
        assert!(fleet.update("m", epoch, Ok(vec![found("a"), found("b")])));
        assert!(!fleet.dirty);
        assert!(fleet.update("m", epoch, Err("etcd down".into())));
        let s = &fleet.sources["m"];
        assert_eq!((s.up, s.errors, fleet.members("m")), (Some(false), 1, 2));
        assert!(!fleet.dirty);
    }

    #[test]
    fn a_changed_source_gets_a_new_epoch_and_forgets() {
        let mut fleet = Fleet::default();
        fleet.sync(&config("/a/"));
        let epoch = fleet.to_start()[0].2;
        fleet.update("m", epoch, Ok(vec![found("a")]));
        // Same settings: same task, same members.
        fleet.sync(&config("/a/"));
        assert!(fleet.current("m", epoch) && fleet.to_start().is_empty());
        assert_eq!(fleet.members("m"), 1);
        // New prefix: the old task is stale and its answers are ignored.
        fleet.sync(&config("/b/"));
        assert!(!fleet.current("m", epoch));
        assert_eq!(fleet.members("m"), 0);
        assert!(!fleet.update("m", epoch, Ok(vec![found("a")])));
        assert_eq!(fleet.to_start().len(), 1);
        // Source removed from the file.
        let listed = "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n";
        fleet.sync(&Config::parse(listed, &Overrides::default()).unwrap());
        assert!(fleet.sources.is_empty() && fleet.found.is_empty());
    }
}
