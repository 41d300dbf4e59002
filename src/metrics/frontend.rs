//! The rest of Dynamo's frontend series its dashboards query: sequence lengths, predicted
//! cached tokens, active and queued requests, and requests per stage.

use super::families::{Families, count_histogram, labels};
use super::per_model;
use crate::state::Snapshot;
use crate::state::counters::{ISL_BUCKETS, OSL_BUCKETS, Stage};

pub(super) fn families(f: &mut Families, snap: &Snapshot) {
    let each = |h: &dyn Fn(&crate::state::Model) -> prometheus::proto::Histogram| {
        snap.models
            .iter()
            .map(|m| (labels(&[("model", &m.name)]), h(m)))
            .collect::<Vec<_>>()
    };
    f.histogram(
        "dynamo_frontend_input_sequence_tokens",
        "Input sequence length in tokens",
        each(&|m| count_histogram(&ISL_BUCKETS, &m.metrics, |c| &c.isl)),
    );
    f.histogram(
        "dynamo_frontend_output_sequence_tokens",
        "Output sequence length in tokens",
        each(&|m| count_histogram(&OSL_BUCKETS, &m.metrics, |c| &c.osl)),
    );
    let kv = snap.models.iter().filter(|m| m.kv.is_some());
    f.histogram(
        "dynamo_frontend_cached_tokens",
        "Number of cached tokens (prefix cache hits) per request",
        kv.map(|m| {
            let h = count_histogram(&ISL_BUCKETS, &m.metrics, |c| &c.cached_tokens);
            (labels(&[("model", &m.name)]), h)
        })
        .collect::<Vec<_>>(),
    );
    f.gauge(
        "dynamo_frontend_active_requests",
        "Number of requests currently being handled by the frontend, from HTTP handler entry to response completion",
        per_model(snap, |m| m.metrics.inflight() as f64),
    );
    f.gauge(
        "dynamo_frontend_queued_requests",
        "Number of requests in HTTP processing queue",
        per_model(snap, |m| {
            Stage::ALL
                .iter()
                .map(|s| m.metrics.in_stage(*s) as f64)
                .sum()
        }),
    );
    // Dynamo's labels: {stage, phase}, no model (lib/runtime/src/metrics/frontend_perf.rs).
    // Spillway has no `preprocess` work (no template, no tokenizer): the series is there,
    // at 0, so queries over the three stages see the same set as against Dynamo.
    let mut stages = vec![(labels(&[("stage", "preprocess"), ("phase", "")]), 0.0)];
    // A disaggregated model's pools are the `prefill` and `decode` phases (§23).
    let phase = |m: &crate::state::Model| m.role.worker_type(m.disagg.is_some());
    for s in Stage::ALL {
        for p in ["aggregated", "prefill", "decode"] {
            let of_phase = snap.models.iter().filter(|m| phase(m) == p);
            let n: u64 = of_phase.clone().map(|m| m.metrics.in_stage(s)).sum();
            if p == "aggregated" || of_phase.count() > 0 {
                let l = [("stage", s.label()), ("phase", p)];
                stages.push((labels(&l), n as f64));
            }
        }
    }
    f.gauge(
        "dynamo_frontend_stage_requests",
        "Number of requests currently in the given pipeline stage",
        stages,
    );
}
