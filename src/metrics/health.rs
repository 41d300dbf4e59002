//! Worker health's series (docs/behaviour.md §22.7): ejections and checks per worker,
//! retries and the retry budget per model, and the models whose health is ignored.

use super::families::{Families, labels};
use crate::health::EjectReason;
use crate::health::checks::CheckResult;
use crate::monitor::Control;
use crate::state::Snapshot;
use crate::state::counters::RetryReason;

pub(super) fn families(f: &mut Families, control: &Control, snap: &Snapshot) {
    let health = &control.monitor.health;
    let published = control.monitor.published();
    let (mut ejections, mut ejected, mut checks) = (Vec::new(), Vec::new(), Vec::new());
    for w in snap.workers.iter() {
        let name = w.cfg.name.as_str();
        let counts = health
            .ejections
            .get(&w.state.slot)
            .copied()
            .unwrap_or_default();
        for (reason, n) in EjectReason::ALL.iter().zip(counts) {
            ejections.push((
                labels(&[("worker", name), ("reason", reason.label())]),
                n as f64,
            ));
        }
        let out = published.is_unhealthy(w.state.slot) || w.state.is_suspect();
        ejected.push((labels(&[("worker", name)]), f64::from(u8::from(out))));
        if let Some(counts) = health.checks.get(&w.state.slot) {
            for (result, n) in CheckResult::ALL.iter().zip(counts) {
                checks.push((
                    labels(&[("worker", name), ("result", result.label())]),
                    *n as f64,
                ));
            }
        }
    }
    f.counter(
        "spillway_worker_ejections_total",
        "Times a worker was ejected by outlier detection, by reason",
        ejections,
    );
    f.gauge(
        "spillway_worker_ejected",
        "1 while the worker is out of rotation (ejected, its checks failing, or suspect)",
        ejected,
    );
    f.counter(
        "spillway_health_checks_total",
        "Active health checks of the worker, by result",
        checks,
    );
    models(f, control, snap);
}

fn models(f: &mut Families, control: &Control, snap: &Snapshot) {
    let published = control.monitor.published();
    let health = &control.monitor.health;
    let (mut retries, mut refused, mut ignored, mut capped) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for m in snap.models.iter() {
        let model = [("model", &*m.name)];
        for reason in RetryReason::ALL {
            let l = labels(&[("model", &*m.name), ("reason", reason.label())]);
            retries.push((l, m.metrics.retries(reason) as f64));
        }
        refused.push((labels(&model), m.metrics.retries_refused() as f64));
        ignored.push((labels(&model), f64::from(u8::from(published.panics(m.id)))));
        let n = health.refused_ejections.get(&m.id).copied().unwrap_or(0);
        capped.push((labels(&model), n as f64));
    }
    f.counter(
        "spillway_retries_total",
        "Failed attempts tried again on another worker, by what failed",
        retries,
    );
    f.counter(
        "spillway_retry_budget_exhausted_total",
        "Failed attempts not retried because the retry budget was spent",
        refused,
    );
    f.gauge(
        "spillway_model_health_ignored",
        "1 while fewer of the model's workers are healthy than outlier.min_healthy_percent, so all are routed to",
        ignored,
    );
    f.counter(
        "spillway_ejections_refused_total",
        "Ejections not made because the model would keep fewer than its healthy share",
        capped,
    );
}
