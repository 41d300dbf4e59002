//! A generation of found workers, built off the monitor's loop: the configuration with
//! what the sources found, the [`Registry`]'s snapshot of it, and how its membership
//! differs from the running one ([`Change`]), all on the control thread's blocking pool.
//! The loop only commits: it stores the snapshot, forgets the load of workers that left
//! and evaluates the members that joined or changed, so NATS load never waits behind a
//! build of thousands of workers. Pure: no I/O, no clock.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use super::evaluate::members_by_slot;
use crate::config::{Addrs, Config, Found, WorkerConfig};
use crate::state::{Registry, Snapshot};
use crate::state::{SlotMap, SlotSet};

/// What the sources found, per model; shared with the build without copying it.
/// A worker a source found, with its resolved address: shared between the source's own
/// view, the fleet's and the builds, so a report copies pointers, not names.
pub type FoundMember = Arc<(Found, SocketAddr)>;
/// What each model's source found, by model name.
pub type FoundMap = BTreeMap<String, Arc<[FoundMember]>>;

/// How the next generation's membership differs from the running one's: what a busy set
/// holding the running one's evaluation needs to match a full pass over the next.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Members of the next generation to evaluate (new, or their worker's settings
    /// changed): (model index, member position).
    pub evaluate: Vec<(u32, u32)>,
    /// Member ids the next generation no longer has: their entries are cleared.
    pub left: Vec<u32>,
    /// Worker slots the next generation no longer has: their load is forgotten.
    pub gone_slots: Vec<u32>,
    /// Models, thresholds or rule settings differ: only a full pass is right.
    pub full: bool,
}

impl Change {
    /// Whether the busy set can change at all.
    pub fn is_empty(&self) -> bool {
        self.evaluate.is_empty() && self.left.is_empty() && !self.full
    }
}

/// Whether what the busy rule reads of the models (besides their members) is the same.
fn same_rule(old: &Snapshot, next: &Snapshot) -> bool {
    let (a, b) = (&old.config, &next.config);
    a.classes == b.classes
        && a.load_staleness_ms == b.load_staleness_ms
        && old.models.len() == next.models.len()
        && old.models.iter().zip(next.models.iter()).all(|(x, y)| {
            (x.name == y.name && x.id == y.id && x.class == y.class)
                && (x.router_mode == y.router_mode)
        })
        && a.models.iter().zip(&b.models).all(|(x, y)| {
            x.thresholds == y.thresholds && x.adaptive == y.adaptive && x.class == y.class
        })
}

/// The difference between the running generation `old` and `next`.
pub fn change(old: &Snapshot, next: &Snapshot) -> Change {
    let mut out = Change {
        full: !same_rule(old, next),
        ..Change::default()
    };
    // Member id → its worker's settings in the running generation, and whether the
    // next generation still has it.
    let mut before: SlotMap<(&WorkerConfig, bool)> = old
        .models
        .iter()
        .flat_map(|m| m.members.iter())
        .map(|mm| (mm.id, (&old.workers[mm.worker as usize].cfg, false)))
        .collect();
    for (mi, model) in next.models.iter().enumerate() {
        for (pos, mm) in model.members.iter().enumerate() {
            let cfg = &next.workers[mm.worker as usize].cfg;
            let same = before.get_mut(&mm.id).is_some_and(|(was, kept)| {
                *kept = true;
                *was == cfg
            });
            if !same {
                out.evaluate.push((mi as u32, pos as u32));
            }
        }
    }
    out.left = before
        .iter()
        .filter(|(_, (_, kept))| !kept)
        .map(|(&id, _)| id)
        .collect();
    out.left.sort_unstable();
    let live: SlotSet = next.workers.iter().map(|w| w.state.slot).collect();
    out.gone_slots = old
        .workers
        .iter()
        .map(|w| w.state.slot)
        .filter(|s| !live.contains(s))
        .collect();
    out
}

/// A generation built off the loop, ready to commit.
#[derive(Debug)]
pub struct Built {
    pub snap: Snapshot,
    /// Why found workers were left out (logged on commit).
    pub skipped: Vec<String>,
    pub change: Change,
    /// [`members_by_slot`] of `snap`.
    pub index: SlotMap<Vec<(u32, u32)>>,
}

/// What the build needs, moved to the blocking pool (the registry comes back with it).
#[derive(Debug)]
pub struct Job {
    pub registry: Registry,
    /// The file's configuration and its addresses.
    pub base: (Config, Addrs),
    pub found: FoundMap,
    /// The running generation.
    pub old: Arc<Snapshot>,
}

impl Job {
    /// Builds the next generation; returns the registry with it.
    pub fn run(self) -> (Registry, Built) {
        let Job {
            mut registry,
            base,
            found,
            old,
        } = self;
        let (config, addrs, skipped) = base.0.with_found(&base.1, &found);
        let snap = registry.build(config, &addrs);
        let built = Built {
            change: change(&old, &snap),
            index: members_by_slot(&snap),
            snap,
            skipped,
        };
        (registry, built)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HostPort, Overrides};

    const FILE: &str = "[[models]]\nname = \"m\"\nactive_decode_blocks_threshold = 0.5\n[models.etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nprefix = \"/w/\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\nname = \"listed\"\n";

    fn found(names: &[(&str, u16)]) -> FoundMap {
        let list: Vec<FoundMember> = names
            .iter()
            .map(|&(name, port)| {
                let hp = HostPort::parse(&format!("127.0.0.2:{port}")).unwrap();
                let mut f = Found::at(hp);
                f.name = name.into();
                Arc::new((f, format!("127.0.0.2:{port}").parse().unwrap()))
            })
            .collect();
        BTreeMap::from([("m".to_string(), list.into())])
    }

    fn base(text: &str) -> (Config, Addrs) {
        let config = Config::parse(text, &Overrides::default()).unwrap();
        let addrs = Addrs::literals(&config).unwrap();
        (config, addrs)
    }

    fn build(
        registry: Registry,
        text: &str,
        old: &Arc<Snapshot>,
        f: FoundMap,
    ) -> (Registry, Built) {
        Job {
            registry,
            base: base(text),
            found: f,
            old: old.clone(),
        }
        .run()
    }

    fn id(s: &Snapshot, worker: &str) -> u32 {
        let m = &s.models[0];
        m.members
            .iter()
            .find(|mm| s.workers[mm.worker as usize].cfg.name == worker)
            .unwrap()
            .id
    }

    #[test]
    fn only_joined_changed_and_left_members_are_named() {
        let mut registry = Registry::new(1, 0);
        let (c, a) = base(FILE);
        let first = Arc::new(registry.build(c, &a));
        let (registry, b1) = build(
            registry,
            FILE,
            &first,
            found(&[("a", 1), ("b", 2), ("c", 3)]),
        );
        let s1 = Arc::new(b1.snap);
        // From the file-only generation: the three found workers join.
        assert_eq!(b1.change.evaluate, vec![(0, 1), (0, 2), (0, 3)]);
        assert!(b1.change.left.is_empty() && b1.change.gone_slots.is_empty());
        assert!(!b1.change.full);
        assert_eq!(b1.index.len(), 4);
        // b leaves, d joins, c moves to another port (a new identity), a is unchanged.
        let (registry, b2) = build(registry, FILE, &s1, found(&[("a", 1), ("c", 9), ("d", 4)]));
        let s2 = &b2.snap;
        let at = |s: &Snapshot, name: &str| {
            let pos = s.models[0]
                .members
                .iter()
                .position(|mm| s.workers[mm.worker as usize].cfg.name == name)
                .unwrap();
            (0, pos as u32)
        };
        let mut want = vec![at(s2, "c"), at(s2, "d")];
        want.sort_unstable();
        assert_eq!(b2.change.evaluate, want);
        let mut left = vec![id(&s1, "b"), id(&s1, "c")];
        left.sort_unstable();
        assert_eq!(b2.change.left, left);
        let slot = |s: &Snapshot, name: &str| s.worker_named(name).unwrap().state.slot;
        let mut gone = b2.change.gone_slots.clone();
        gone.sort_unstable();
        assert_eq!(gone, vec![slot(&s1, "b"), slot(&s1, "c")]);
        assert_eq!(
            slot(s2, "a"),
            slot(&s1, "a"),
            "an unchanged worker keeps its state"
        );
        // The same membership again: nothing to do.
        let s2 = Arc::new(b2.snap);
        let (registry, b3) = build(registry, FILE, &s2, found(&[("a", 1), ("c", 9), ("d", 4)]));
        assert!(b3.change.is_empty());
        // A threshold change (a reload's business) asks for a full pass.
        let text = FILE.replace("0.5", "0.7");
        let (_, b4) = build(registry, &text, &s2, found(&[("a", 1), ("c", 9), ("d", 4)]));
        assert!(b4.change.full && !b4.change.is_empty());
    }

    use super::super::adaptive::Adaptivity;
    use super::super::evaluate::{Latches, Rule, evaluate, evaluate_members};
    use super::super::load::{LoadTable, parse_events};
    use crate::state::BusySet;
    use std::collections::HashMap;

    /// The rule's inputs besides the load table.
    struct RuleState {
        thresholds: HashMap<String, crate::shed::Thresholds>,
        adaptivity: Adaptivity,
        latches: Latches,
        recheck: Vec<u64>,
    }

    impl RuleState {
        fn new(s: &Snapshot) -> RuleState {
            RuleState {
                thresholds: HashMap::from([("m".to_string(), s.config.models[0].thresholds)]),
                adaptivity: Adaptivity::default(),
                latches: Latches::default(),
                recheck: Vec::new(),
            }
        }

        fn rule(&mut self) -> Rule<'_> {
            Rule {
                thresholds: &self.thresholds,
                adaptivity: &self.adaptivity,
                latches: &mut self.latches,
                recheck: &mut self.recheck,
            }
        }

        /// What a full pass with fresh latches gives.
        fn full(s: &Snapshot, table: &LoadTable) -> BusySet {
            let mut out = BusySet::default();
            evaluate(s, table, RuleState::new(s).rule(), 0, &mut out);
            out
        }
    }

    fn push(s: &Snapshot, table: &mut LoadTable, body: &str) {
        let events = parse_events(body.as_bytes()).unwrap();
        table
            .push_known(s, &events, 0, &mut SlotSet::default())
            .unwrap();
    }

    /// The commit's partial pass (clear who left, evaluate who joined or changed) leaves
    /// the set a full pass over the next generation gives.
    #[test]
    fn a_partial_pass_over_the_change_agrees_with_a_full_one() {
        let file = FILE.replace(
            "[[models.workers]]",
            "[models.discovered]\nkv_total_blocks = 100\n[[models.workers]]",
        );
        let mut registry = Registry::new(1, 0);
        let (c, a) = base(&file);
        let first = Arc::new(registry.build(c, &a));
        let (registry, b1) = build(
            registry,
            &file,
            &first,
            found(&[("a", 1), ("b", 2), ("c", 3)]),
        );
        let s1 = Arc::new(b1.snap);
        let mut table = LoadTable::default();
        let busy = r#"[{"worker_id":"a","active_decode_blocks":90},{"worker_id":"b","active_decode_blocks":90},{"worker_id":"c","active_decode_blocks":10}]"#;
        push(&s1, &mut table, busy);
        let (mut st, mut set) = (RuleState::new(&s1), BusySet::default());
        evaluate(&s1, &table, st.rule(), 0, &mut set);
        assert_eq!(set, RuleState::full(&s1, &table));
        // b leaves (it was busy), d joins.
        let (_, b2) = build(registry, &file, &s1, found(&[("a", 1), ("c", 3), ("d", 4)]));
        let s2 = b2.snap;
        for slot in &b2.change.gone_slots {
            table.workers.remove(slot);
        }
        push(
            &s2,
            &mut table,
            r#"{"worker_id":"d","active_decode_blocks":95}"#,
        );
        for &id in &b2.change.left {
            set.clear_member(id);
        }
        let members = b2.change.evaluate.iter().copied();
        assert!(evaluate_members(
            &s2,
            &table,
            st.rule(),
            0,
            &mut set,
            members
        ));
        assert_eq!(set, RuleState::full(&s2, &table));
        assert_eq!(table.workers.len(), 3, "b's load is forgotten");
    }
}
