//! `kv` routing's series: Dynamo's router histograms (predicted hit rate, routing
//! overhead) and the predicted-cache index's size and churn, per `kv` model; predicted
//! hits per worker.

use super::families::{Families, histogram, labels};
use crate::state::Snapshot;
use crate::state::counters::{KV_HIT_BUCKETS, OVERHEAD_BUCKETS};

pub(super) fn families(f: &mut Families, snap: &Snapshot, now: u64) {
    let kv_models = || {
        snap.models
            .iter()
            .filter_map(|m| m.kv.as_ref().map(|kv| (m, kv)))
    };
    let per_model = |v: &dyn Fn(&crate::state::Model, &crate::state::KvRouting) -> f64| {
        kv_models()
            .map(|(m, kv)| (labels(&[("model", &m.name)]), v(m, kv)))
            .collect::<Vec<_>>()
    };
    f.histogram(
        "dynamo_component_router_kv_hit_rate",
        "kv routing: share of the request's KV blocks predicted cached on the chosen worker",
        kv_models().map(|(m, _)| {
            let h = histogram(&KV_HIT_BUCKETS, &m.metrics, |c| &c.kv_hit_rate);
            (labels(&[("model", &m.name)]), h)
        }),
    );
    f.histogram(
        "spillway_kv_router_overhead_seconds",
        "kv routing: time to hash the prompt, look up the index and pick a worker (Dynamo's dynamo_router_overhead_total_ms, in seconds)",
        kv_models().map(|(m, _)| {
            let h = histogram(&OVERHEAD_BUCKETS, &m.metrics, |c| &c.router_overhead);
            (labels(&[("model", &m.name)]), h)
        }),
    );
    f.gauge(
        "spillway_kv_index_bytes",
        "kv routing: memory of the model's predicted-cache index (fixed at start or reload)",
        per_model(&|_, kv| kv.cache.memory_bytes() as f64),
    );
    f.gauge(
        "spillway_kv_index_capacity_entries",
        "kv routing: entries the model's predicted-cache index can hold",
        per_model(&|_, kv| kv.cache.capacity() as f64),
    );
    f.gauge(
        "spillway_kv_index_entries",
        "kv routing: index entries naming a prefix chunk some worker is predicted to hold",
        per_model(&|_, kv| kv.cache.live_entries(now) as f64),
    );
    f.counter(
        "spillway_kv_index_inserts_total",
        "kv routing: prefix chunks newly predicted on a worker",
        per_model(&|m, _| m.metrics.kv_index_counts().0 as f64),
    );
    f.counter(
        "spillway_kv_index_evictions_total",
        "kv routing: predictions given up for room (index bucket full, worker's KV capacity)",
        per_model(&|m, _| m.metrics.kv_index_counts().1 as f64),
    );
    let (mut blocks, mut hits) = (Vec::new(), Vec::new());
    for w in snap.workers.iter() {
        let (b, h) = w.state.kv_totals();
        if b > 0 {
            let l = labels(&[("worker", &w.cfg.name)]);
            blocks.push((l.clone(), b as f64));
            hits.push((l, h as f64));
        }
    }
    f.counter(
        "spillway_kv_routed_blocks_total",
        "kv routing: KV blocks of the requests routed to the worker",
        blocks,
    );
    f.counter(
        "spillway_kv_predicted_hit_blocks_total",
        "kv routing: of those, blocks predicted cached on the worker when it was chosen",
        hits,
    );
}
