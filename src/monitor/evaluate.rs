//! The busy rule over the load table: every member's entry in the busy set, per request
//! class, as a full pass, a pass over a few workers' members, or the tick's pass over the
//! members whose entry can change by itself. Pure: `now` is an argument.

use std::collections::HashMap;

use super::adaptive::Adaptivity;
use super::load::{LoadTable, WorkerLoad, max_opt};
use crate::config::{ModelConfig, WorkerConfig};
use crate::shed::{Class, Headroom, RankLoad, Thresholds, Why, rank_why};
use crate::state::{BusySet, Member, MemberEntry, Model, Snapshot};
use crate::state::{SlotMap, SlotSet};

/// Decode latches, per request class, member id and rank.
#[derive(Debug, Default)]
pub struct Latches([Vec<Vec<bool>>; 3]);

impl Latches {
    /// A member's latches for each class, `ranks` of them at least.
    fn member(&mut self, member: u32, ranks: usize) -> [&mut [bool]; 3] {
        let m = member as usize;
        self.0.each_mut().map(|members| {
            if members.len() <= m {
                members.resize_with(m + 1, Vec::new);
            }
            let latches = &mut members[m];
            if latches.len() < ranks {
                latches.resize(ranks, false);
            }
            &mut latches[..]
        })
    }
}

/// What the busy rule reads besides the load table: thresholds per model, the adaptive
/// mode's factors, the decode latches.
pub struct Rule<'a> {
    pub thresholds: &'a HashMap<String, Thresholds>,
    pub adaptivity: &'a Adaptivity,
    pub latches: &'a mut Latches,
    /// Per member id: when its entry changes by itself (a signal turns stale), written
    /// by every evaluation of the member.
    pub recheck: &'a mut Vec<u64>,
}

/// Evaluates every model's members into `out` (cleared first; reuses its storage), for
/// each request class with the model's thresholds scaled as that class sees them (and as
/// the adaptive mode sets them for the member).
pub fn evaluate(
    snap: &Snapshot,
    table: &LoadTable,
    mut rule: Rule<'_>,
    now: u64,
    out: &mut BusySet,
) {
    out.clear();
    for (model, cfg) in snap.models.iter().zip(&snap.config.models) {
        let t = rule
            .thresholds
            .get(&*model.name)
            .copied()
            .unwrap_or_default();
        if t.any() {
            out.set_enabled(model.id);
        }
        out.set_queue_cap_ms(model.id, queue_cap_ms(rule.adaptivity, model.id, cfg));
        for member in model.members.iter() {
            evaluate_member(snap, table, &mut rule, (member, t), now, out);
        }
    }
}

/// The periodic pass over a set that holds the last evaluation: only the members whose
/// entry may have changed by itself since, because their load is tracked (refreshed
/// every tick), their model is adaptive (factors move every tick) or one of their
/// signals turned stale. Every other change to the load table or the rule is evaluated
/// where it happens (`POST /load`, a scrape, a reload, a threshold change: a full pass;
/// NATS: [`evaluate_slots`]). Returns whether any entry changed.
pub fn evaluate_due(
    snap: &Snapshot,
    table: &LoadTable,
    mut rule: Rule<'_>,
    now: u64,
    out: &mut BusySet,
) -> bool {
    let mut changed = false;
    for (model, cfg) in snap.models.iter().zip(&snap.config.models) {
        let t = model_thresholds(&rule, model);
        let cap = queue_cap_ms(rule.adaptivity, model.id, cfg);
        changed |= out.set_queue_cap_ms(model.id, cap);
        for member in model.members.iter() {
            let w = &snap.workers[member.worker as usize];
            let counts_slots = || {
                let load = table.workers.get(&w.state.slot);
                load.and_then(|l| l.total_slots(&w.cfg)).is_some()
            };
            let due = cfg.adaptive.is_some()
                || w.cfg.load_sources.tracked
                || (t.waiting_requests_threshold.is_some() && counts_slots())
                || rule
                    .recheck
                    .get(member.id as usize)
                    .is_none_or(|&t| t <= now);
            if due {
                changed |= evaluate_member(snap, table, &mut rule, (member, t), now, out);
            }
        }
    }
    changed
}

/// The cap on queue waits the adaptive mode sets while the model is overloaded.
fn queue_cap_ms(adaptivity: &Adaptivity, model_id: u32, cfg: &ModelConfig) -> Option<u64> {
    let adaptive = cfg
        .adaptive
        .filter(|_| adaptivity.is_overloaded(model_id))?;
    Some(adaptive.overload_queue_cap_ms())
}

/// Where each worker is a member: slot → (model index, member position), for one
/// snapshot.
pub fn members_by_slot(snap: &Snapshot) -> SlotMap<Vec<(u32, u32)>> {
    let mut index: SlotMap<Vec<(u32, u32)>> = SlotMap::default();
    for (mi, model) in snap.models.iter().enumerate() {
        for (pos, member) in model.members.iter().enumerate() {
            let slot = snap.workers[member.worker as usize].state.slot;
            index.entry(slot).or_default().push((mi as u32, pos as u32));
        }
    }
    index
}

/// Evaluates again only the members of the workers in `slots` (found through `index`,
/// [`members_by_slot`] of `snap`), in a set that holds the last evaluation: new load from
/// a few workers, published without waiting for the next full pass. Returns whether any
/// of their entries changed.
pub fn evaluate_slots(
    snap: &Snapshot,
    table: &LoadTable,
    rule: Rule<'_>,
    now: u64,
    out: &mut BusySet,
    slots: &SlotSet,
    index: &SlotMap<Vec<(u32, u32)>>,
) -> bool {
    let members = slots.iter().filter_map(|s| index.get(s)).flatten();
    evaluate_members(snap, table, rule, now, out, members.copied())
}

/// Evaluates again the members at `(model index, member position)` of `snap`, in a set
/// that holds the last evaluation. Returns whether any of their entries changed.
pub fn evaluate_members(
    snap: &Snapshot,
    table: &LoadTable,
    mut rule: Rule<'_>,
    now: u64,
    out: &mut BusySet,
    members: impl IntoIterator<Item = (u32, u32)>,
) -> bool {
    let mut changed = false;
    // The last member's model and its thresholds (a worker's members are in model order).
    let mut last: Option<(u32, Thresholds)> = None;
    for (mi, pos) in members {
        let Some(model) = snap.models.get(mi as usize) else {
            continue;
        };
        let Some(member) = model.members.get(pos as usize) else {
            continue;
        };
        let t = match last {
            Some((m, t)) if m == mi => t,
            _ => model_thresholds(&rule, model),
        };
        last = Some((mi, t));
        changed |= evaluate_member(snap, table, &mut rule, (member, t), now, out);
    }
    changed
}

/// A model's thresholds as the rule has them now (none set: nothing is busy).
fn model_thresholds(rule: &Rule<'_>, model: &Model) -> Thresholds {
    rule.thresholds
        .get(&*model.name)
        .copied()
        .unwrap_or_default()
}

/// One member's entry, under its model's thresholds `t` (replaced in `out`); returns
/// whether it changed.
fn evaluate_member(
    snap: &Snapshot,
    table: &LoadTable,
    rule: &mut Rule<'_>,
    (member, t): (&Member, Thresholds),
    now: u64,
    out: &mut BusySet,
) -> bool {
    static EMPTY: std::sync::LazyLock<WorkerLoad> = std::sync::LazyLock::new(WorkerLoad::default);
    let scale = rule.adaptivity.scale(member.id);
    let classes = &snap.config.classes;
    let by_class = Class::ALL.map(|c| t.scaled(classes.get(c).busy_threshold_scale * scale));
    // Classes that see the same thresholds get the same answer (and latches): each
    // distinct one is computed once, the others copy it.
    let same_as = [
        0,
        usize::from(by_class[1] != by_class[0]),
        if by_class[2] == by_class[0] {
            0
        } else if by_class[2] == by_class[1] {
            1
        } else {
            2
        },
    ];
    let w = &snap.workers[member.worker as usize];
    let load = table.workers.get(&w.state.slot).unwrap_or(&EMPTY);
    let ranks = load.dp_size(&w.cfg);
    let staleness = snap.config.load_staleness_ms;
    let mut latches = rule.latches.member(member.id, ranks);
    let mut permille = 0u16;
    let mut max_batched = None;
    // Busy when every rank is: the least busy rank says why.
    let mut why: [Option<Why>; 3] = [None; 3];
    let mut busy = [ranks > 0; 3];
    let mut recheck = u64::MAX;
    // `r` indexes the load entry's ranks and each class's latches alike.
    #[allow(clippy::needless_range_loop)]
    for r in 0..ranks {
        let (l, until) = load.effective_until(r, &w.cfg, now, staleness);
        recheck = recheck.min(until);
        permille = permille.max(load_permille(&l));
        max_batched = l.max_num_batched_tokens;
        for i in (0..3).filter(|&i| same_as[i] == i) {
            match rank_why(&by_class[i], &l, &mut latches[i][r]) {
                None => busy[i] = false,
                Some(y) if why[i].is_none_or(|w| y.excess() < w.excess()) => why[i] = Some(y),
                Some(_) => {}
            }
        }
    }
    for i in (0..3).filter(|&i| same_as[i] != i) {
        (busy[i], why[i]) = (busy[same_as[i]], why[same_as[i]]);
        let [a, b, c] = &mut latches;
        let (from, to): (&[bool], &mut [bool]) = match (same_as[i], i) {
            (0, 1) => (a, b),
            (0, 2) => (a, c),
            _ => (b, c),
        };
        to[..ranks].copy_from_slice(&from[..ranks]);
    }
    let i = member.id as usize;
    if rule.recheck.len() <= i {
        rule.recheck.resize(i + 1, 0);
    }
    rule.recheck[i] = recheck;
    let entry = MemberEntry {
        busy: Class::ALL.map(|c| busy[c.index()].then_some(why[c.index()])),
        load: permille,
        headroom: headroom(load, &w.cfg, ranks, max_batched, &by_class)
            .with_slots(load.total_slots(&w.cfg), &by_class),
    };
    out.set_member(member.id, entry)
}

/// The headroom a core checks its own routing against: for a one-rank worker whose load
/// includes the router's tracked load (with more ranks the rank a request lands on is the
/// engine's choice, so only the monitor judges them).
fn headroom(
    load: &WorkerLoad,
    cfg: &WorkerConfig,
    ranks: usize,
    max_batched: Option<u64>,
    by_class: &[Thresholds; 3],
) -> Headroom {
    if ranks != 1 || !cfg.load_sources.tracked {
        return Headroom::default();
    }
    Headroom::new(load.tracked_prefill(0), max_batched, by_class)
}

/// The fullest known signal of a rank, in permille of its capacity (for least-loaded).
pub fn load_permille(l: &RankLoad) -> u16 {
    let used = max_opt([l.kv_used_blocks, l.active_decode_blocks]);
    let decode = match (used, l.kv_total_blocks) {
        (Some(u), Some(t)) if t > 0 => u.saturating_mul(1000) / t,
        _ => 0,
    };
    let prefill = match (l.active_prefill_tokens, l.max_num_batched_tokens) {
        (Some(p), Some(m)) if m > 0 => p.saturating_mul(1000) / m,
        _ => 0,
    };
    decode.max(prefill).min(1000) as u16
}

#[cfg(test)]
mod tests {
    use super::super::load::parse_events;
    use super::*;
    use crate::config::{Config, Overrides};

    fn snap() -> Snapshot {
        let mut text = String::from(
            "load_staleness_ms = 1000\n[[models]]\nname = \"m\"\nactive_decode_blocks_threshold = 0.5\nactive_prefill_tokens_threshold = 100\n",
        );
        for (name, port) in [("a", 1), ("b", 2), ("c", 3)] {
            text.push_str(&format!(
                "[[models.workers]]\nurl = \"http://127.0.0.1:{port}\"\nname = \"{name}\"\nkv_total_blocks = 100\ndp_size = 2\nload_sources = [\"push\"]\n"
            ));
        }
        Snapshot::standalone(Config::parse(&text, &Overrides::default()).unwrap(), 1).unwrap()
    }

    struct State {
        thresholds: HashMap<String, Thresholds>,
        latches: Latches,
        recheck: Vec<u64>,
    }

    impl State {
        fn new(s: &Snapshot) -> State {
            State {
                thresholds: s
                    .config
                    .models
                    .iter()
                    .map(|m| (m.name.clone(), m.thresholds))
                    .collect(),
                latches: Latches::default(),
                recheck: Vec::new(),
            }
        }

        fn rule(&mut self) -> Rule<'_> {
            static ADAPTIVITY: std::sync::LazyLock<Adaptivity> =
                std::sync::LazyLock::new(Adaptivity::default);
            Rule {
                thresholds: &self.thresholds,
                adaptivity: &ADAPTIVITY,
                latches: &mut self.latches,
                recheck: &mut self.recheck,
            }
        }
    }

    /// What a full pass at `now` gives, with its own latches.
    fn full(s: &Snapshot, table: &LoadTable, now: u64) -> BusySet {
        let mut st = State::new(s);
        let mut out = BusySet::default();
        evaluate(s, table, st.rule(), now, &mut out);
        out
    }

    fn push(s: &Snapshot, table: &mut LoadTable, now: u64, body: &str) -> SlotSet {
        let mut touched = SlotSet::default();
        let events = parse_events(body.as_bytes()).unwrap();
        table.push_known(s, &events, now, &mut touched).unwrap();
        touched
    }

    #[test]
    fn partial_passes_agree_with_a_full_one() {
        let s = snap();
        let mut table = LoadTable::default();
        let mut st = State::new(&s);
        let mut set = BusySet::default();
        push(
            &s,
            &mut table,
            0,
            r#"[{"worker_id":"a","dp_rank":0,"active_decode_blocks":60},{"worker_id":"a","dp_rank":1,"active_prefill_tokens":500},
            {"worker_id":"b","dp_rank":0,"active_decode_blocks":60},{"worker_id":"c","dp_rank":1,"active_decode_blocks":10}]"#,
        );
        evaluate(&s, &table, st.rule(), 0, &mut set);
        assert_eq!(set, full(&s, &table, 0));
        let a = s.model(b"m").unwrap().members[0].id;
        assert!(
            set.is_busy(Class::Standard, a),
            "both of a's ranks are busy"
        );
        // New load for b only: the slot pass matches a full pass and reports the change.
        let index = members_by_slot(&s);
        let touched = push(
            &s,
            &mut table,
            400,
            r#"{"worker_id":"b","dp_rank":1,"active_decode_blocks":90}"#,
        );
        assert!(evaluate_slots(
            &s,
            &table,
            st.rule(),
            400,
            &mut set,
            &touched,
            &index
        ));
        assert_eq!(set, full(&s, &table, 400));
        // Same load again: nothing changes.
        let touched = push(
            &s,
            &mut table,
            500,
            r#"{"worker_id":"b","dp_rank":1,"active_decode_blocks":90}"#,
        );
        assert!(!evaluate_slots(
            &s,
            &table,
            st.rule(),
            500,
            &mut set,
            &touched,
            &index
        ));
        // Before anything turns stale the tick has nothing to do...
        assert!(!evaluate_due(&s, &table, st.rule(), 900, &mut set));
        // ...and when a's reports (from 0) turn stale at 1000, it catches that.
        assert!(evaluate_due(&s, &table, st.rule(), 1000, &mut set));
        assert!(!set.is_busy(Class::Standard, a));
        assert_eq!(set, full(&s, &table, 1000));
        for now in [1001, 1399, 1400, 1500, 5000] {
            evaluate_due(&s, &table, st.rule(), now, &mut set);
            assert_eq!(set, full(&s, &table, now), "at {now}");
        }
    }
}
