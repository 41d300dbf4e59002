//! Active health checks on the control thread (docs/behaviour.md §22.3): each worker
//! whose model has checks is checked every interval, one check at a time, and at once
//! when a core found it suspect. A canary runs only when the worker carried no
//! successful request since the last check.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::Control;
use super::health::checks_of;
use super::scrape::exchange;
use crate::health::CheckKind;
use crate::health::checks::{CheckResult, passes};
use crate::runtime::clock;
use crate::state::{SlotMap, SlotSet, Snapshot};

/// How often the loop looks for checks that are due (a suspect worker's check starts
/// within this of the suspicion; the cores give the suspicion the checks' timeout).
const LOOP_MS: u64 = 20;

/// When a worker's next check is due, and what it knew at its last.
#[derive(Debug, Clone, Copy)]
struct Due {
    next_ms: u64,
    /// Its successful attempts at the last check (a canary is skipped when they grew).
    ok_seen: u64,
    /// A check already ran for the current suspicion.
    suspicion_checked: bool,
}

/// Runs the checks for as long as the control thread runs.
pub async fn check_loop(control: Rc<RefCell<Control>>) {
    let in_flight: Rc<RefCell<SlotSet>> = Rc::default();
    let mut due: SlotMap<Due> = SlotMap::default();
    loop {
        let snap = control.borrow().shared.snapshot.load_full();
        let now = clock::now_ms();
        for (i, w) in snap.workers.iter().enumerate() {
            let Some(s) = checks_of(&snap, i) else {
                continue;
            };
            let slot = w.state.slot;
            if in_flight.borrow().contains(&slot) {
                continue;
            }
            let ok = w.state.outcomes().ok;
            let d = due.entry(slot).or_insert(Due {
                next_ms: now,
                ok_seen: ok,
                suspicion_checked: false,
            });
            let suspect = w.state.is_suspect();
            let for_suspicion = suspect && !d.suspicion_checked;
            d.suspicion_checked = suspect && (d.suspicion_checked || for_suspicion);
            if now < d.next_ms && !for_suspicion {
                continue;
            }
            d.next_ms = now + s.interval_ms;
            let carried = ok != d.ok_seen;
            d.ok_seen = ok;
            if s.kind == CheckKind::Canary && carried && !for_suspicion {
                continue;
            }
            in_flight.borrow_mut().insert(slot);
            let task = check_one(control.clone(), in_flight.clone(), snap.clone(), i);
            monoio::spawn(task);
        }
        if due.len() > snap.workers.len() * 2 {
            let live: SlotSet = snap.workers.iter().map(|w| w.state.slot).collect();
            due.retain(|slot, _| live.contains(slot));
        }
        monoio::time::sleep(Duration::from_millis(LOOP_MS)).await;
    }
}

/// One check of worker `i` of `snap`, applied (and published when it changed the
/// worker's health) when it lands.
async fn check_one(
    control: Rc<RefCell<Control>>,
    in_flight: Rc<RefCell<SlotSet>>,
    snap: Arc<Snapshot>,
    i: usize,
) {
    let (Some(w), Some(s)) = (snap.workers.get(i), checks_of(&snap, i)) else {
        return;
    };
    let model = (snap.models.iter())
        .find(|m| m.members.iter().any(|mm| mm.worker as usize == i))
        .map_or("", |m| &m.name);
    let model = serde_json::to_string(model).unwrap_or_default();
    let request = s.request(&w.cfg.endpoint.to_string(), model.trim_matches('"'));
    let timeout = Duration::from_millis(s.timeout_ms);
    let result = match monoio::time::timeout(timeout, exchange(w.addr, request)).await {
        Ok(Ok((status, _))) if passes(status) => CheckResult::Passed,
        Ok(Ok((status, _))) => {
            tracing::debug!(worker = %w.cfg.name, status, "check failed");
            CheckResult::Failed
        }
        Ok(Err(error)) => {
            tracing::debug!(worker = %w.cfg.name, %error, "check failed");
            CheckResult::Failed
        }
        Err(_) => CheckResult::TimedOut,
    };
    in_flight.borrow_mut().remove(&w.state.slot);
    let mut c = control.borrow_mut();
    let now = clock::now_ms();
    if c.monitor.health.checked(&snap, i, result, now) {
        c.publish_health();
    }
}
