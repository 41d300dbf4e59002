//! `/metrics`: every family built at scrape time from the cores' counter cells, the
//! snapshot and the monitor's state, and encoded by the prometheus crate's text encoder.
//! Names and labels follow Dynamo (docs/behaviour.md §15); Spillway's own series are prefixed
//! `spillway_`. Nothing here runs on a core.

mod families;
mod fleet;
mod frontend;
mod health;
mod kv;
mod process;

use families::{Families, histogram, labels};
use prometheus::proto::LabelPair;

use crate::config::PoolRole;
use crate::monitor::Control;
use crate::route::Endpoint;
use crate::route::handoff::Handed;
use crate::runtime::clock;
use crate::shed::{Class, Knob};
use crate::state::counters::{
    DURATION_BUCKETS, ITL_BUCKETS, MigrationReason, Outcome, ROOM_WAIT_BUCKETS, RequestType,
    TTFT_BUCKETS,
};
use crate::state::{Model, Snapshot};

type Series = Vec<(Vec<LabelPair>, f64)>;

/// Renders the whole exposition.
pub fn render(control: &Control) -> Vec<u8> {
    let snap = control.shared.snapshot.load_full();
    let mut f = Families::new();
    requests(&mut f, &snap);
    handoffs(&mut f, &snap);
    latencies(&mut f, &snap);
    frontend::families(&mut f, &snap);
    worker_load(&mut f, control, &snap, clock::now_ms());
    admission(&mut f, &snap);
    kv::families(&mut f, &snap, clock::now_ms());
    process::families(&mut f, control, &snap, clock::now_ms());
    fleet::families(&mut f, control);
    health::families(&mut f, control, &snap);
    f.encode()
}

/// One series per model.
fn per_model(snap: &Snapshot, value: impl Fn(&Model) -> f64) -> Series {
    snap.models
        .iter()
        .map(|m| (labels(&[("model", &m.name)]), value(m)))
        .collect()
}

/// Requests, rejections and migrations per model (Dynamo's frontend counters).
fn requests(f: &mut Families, snap: &Snapshot) {
    let (mut requests, mut rejections) = (Vec::new(), Vec::new());
    let (mut migrations, mut migration_reasons) = (Vec::new(), Vec::new());
    for model in snap.models.iter() {
        let m = &model.metrics;
        for e in Endpoint::ALL {
            for t in [RequestType::Unary, RequestType::Stream] {
                for o in Outcome::ALL {
                    let n = m.requests(e, t, o);
                    let l = [
                        ("model", &*model.name),
                        ("endpoint", e.label()),
                        ("request_type", t.label()),
                        ("status", o.status()),
                        ("error_type", o.error_type()),
                    ];
                    if n > 0 {
                        requests.push((labels(&l), n as f64));
                    }
                }
            }
            let n = m.rejections(e);
            if n > 0 {
                let l = [("model", &*model.name), ("endpoint", e.label())];
                rejections.push((labels(&l), n as f64));
            }
        }
        let mut total = 0;
        for reason in MigrationReason::ALL {
            let n = m.migrations(reason);
            total += n;
            if n > 0 {
                let l = [("model", &*model.name), ("reason", reason.label())];
                migration_reasons.push((labels(&l), n as f64));
            }
        }
        if total > 0 {
            // Spillway moves a request only before any response byte: Dynamo's
            // `new_request` migration (never `ongoing_request`).
            let l = [("model", &*model.name), ("migration_type", "new_request")];
            migrations.push((labels(&l), total as f64));
        }
    }
    f.counter(
        "dynamo_frontend_requests_total",
        "Total number of LLM requests processed",
        requests,
    );
    f.counter(
        "dynamo_frontend_model_rejection_total",
        "Total number of requests rejected due to resource exhaustion",
        rejections,
    );
    f.counter(
        "dynamo_frontend_model_migration_total",
        "Total number of request migrations due to worker unavailability",
        migrations,
    );
    f.counter(
        "spillway_refusals_total",
        "Requests refused, by the knob that refused them and the request's class (the answer's `knob` and `class` fields)",
        refusals(snap),
    );
    f.counter(
        "spillway_class_requests_total",
        "Requests routed, by request class",
        classes(snap),
    );
    f.counter(
        "spillway_migrations_total",
        "Requests moved to another worker, by the refusal that moved them",
        migration_reasons,
    );
    f.gauge(
        "dynamo_frontend_inflight_requests",
        "Number of inflight requests",
        per_model(snap, |m| m.metrics.inflight() as f64),
    );
}

/// Second stages per disaggregated model and outcome (docs/behaviour.md §23.5).
fn handoffs(f: &mut Families, snap: &Snapshot) {
    let mut out = Vec::new();
    for m in snap.models.iter().filter(|m| m.disagg.is_some()) {
        for how in Handed::ALL {
            let l = [("model", &*m.name), ("outcome", how.label())];
            out.push((labels(&l), m.metrics.handoffs(how) as f64));
        }
    }
    let disaggregated = snap.models.iter().filter(|m| m.disagg.is_some());
    let ttft = disaggregated.map(|m| {
        let h = histogram(&TTFT_BUCKETS, &m.metrics, |c| &c.handoff_ttft);
        (labels(&[("model", &m.name)]), h)
    });
    f.histogram(
        "spillway_handoff_first_token_seconds",
        "Disaggregated requests handed off with the prefill worker's KV cache: from the prefill stage's end to the first decoded token",
        ttft.collect::<Vec<_>>(),
    );
    f.counter(
        "spillway_handoffs_total",
        "Disaggregated requests' second stages, by how they began: remote (the prefill worker's KV cache), fallback (stage 1 failed: prefilled where decoded), local (short enough to skip stage 1)",
        out,
    );
}

/// Refusals per model, knob and class.
fn refusals(snap: &Snapshot) -> Series {
    let mut out = Vec::new();
    for model in snap.models.iter() {
        for (knob, class) in Knob::ALL.iter().flat_map(|k| Class::ALL.map(|c| (*k, c))) {
            let n = model.metrics.refusals(knob, class);
            if n > 0 {
                let l = [
                    ("model", &*model.name),
                    ("knob", knob.label()),
                    ("class", class.label()),
                ];
                out.push((labels(&l), n as f64));
            }
        }
    }
    out
}

/// Requests routed per model and class (classes with none are left out).
fn classes(snap: &Snapshot) -> Series {
    let mut out = Vec::new();
    for model in snap.models.iter() {
        for class in Class::ALL {
            let n = model.metrics.requests_of_class(class);
            if n > 0 {
                let l = [("model", &*model.name), ("class", class.label())];
                out.push((labels(&l), n as f64));
            }
        }
    }
    out
}

/// TTFT, inter-token latency and duration histograms per model.
fn latencies(f: &mut Families, snap: &Snapshot) {
    let each = |h: &dyn Fn(&Model) -> prometheus::proto::Histogram| {
        snap.models
            .iter()
            .map(|m| (labels(&[("model", &m.name)]), h(m)))
            .collect::<Vec<_>>()
    };
    f.histogram(
        "dynamo_frontend_time_to_first_token_seconds",
        "Time to first token in seconds",
        each(&|m| histogram(&TTFT_BUCKETS, &m.metrics, |c| &c.ttft)),
    );
    f.histogram(
        "dynamo_frontend_inter_token_latency_seconds",
        "Inter-token latency in seconds",
        each(&|m| histogram(&ITL_BUCKETS, &m.metrics, |c| &c.itl)),
    );
    f.histogram(
        "dynamo_frontend_request_duration_seconds",
        "Duration of LLM requests",
        each(&|m| histogram(&DURATION_BUCKETS, &m.metrics, |c| &c.duration)),
    );
}

/// Per worker and rank: the latest effective load the busy rule saw.
fn worker_load(f: &mut Families, control: &Control, snap: &Snapshot, now: u64) {
    let staleness = snap.config.load_staleness_ms;
    let (mut decode, mut prefill, mut waiting) = (Vec::new(), Vec::new(), Vec::new());
    let (mut slots, mut missing) = (Vec::new(), Vec::new());
    for (i, w) in snap.workers.iter().enumerate() {
        let Some(load) = control.monitor.table.workers.get(&w.state.slot) else {
            continue;
        };
        let worker_type = worker_type(snap, i);
        let worker = [("worker_id", w.cfg.name.as_str())];
        if let Some(n) = load.total_slots(&w.cfg) {
            slots.push((labels(&worker), n as f64));
        }
        for metric in &load.scrape_missing {
            let l = [("worker_id", w.cfg.name.as_str()), ("metric", metric)];
            missing.push((labels(&l), 1.0));
        }
        for r in 0..load.dp_size(&w.cfg) {
            let e = load.effective(r, &w.cfg, now, staleness);
            let rank = r.to_string();
            let l = [
                ("worker_id", w.cfg.name.as_str()),
                ("dp_rank", rank.as_str()),
                ("worker_type", worker_type),
            ];
            if let Some(v) = e.kv_used_blocks.max(e.active_decode_blocks) {
                decode.push((labels(&l), v as f64));
            }
            if let Some(v) = e.active_prefill_tokens {
                prefill.push((labels(&l), v as f64));
            }
            if let Some(v) = e.waiting_requests {
                waiting.push((labels(&l), v as f64));
            }
        }
    }
    f.gauge(
        "dynamo_frontend_worker_active_decode_blocks",
        "Active KV cache decode blocks per worker",
        decode,
    );
    f.gauge(
        "dynamo_frontend_worker_active_prefill_tokens",
        "Active prefill tokens queued per worker",
        prefill,
    );
    f.gauge(
        "spillway_worker_waiting_requests",
        "Requests waiting in the engine's own queue per worker and rank, as the busy rule saw them (waiting_requests_threshold)",
        waiting,
    );
    f.gauge(
        "spillway_worker_engine_slots",
        "The engine's slots (requests it runs at once), as reported or configured (total_slots)",
        slots,
    );
    f.gauge(
        "spillway_scrape_missing",
        "1 for each metric a scraped worker's engine family should export and its last scrape lacked",
        missing,
    );
}

/// Dynamo's `worker_type` of a worker: `prefill` when it serves prefill pools only
/// (docs/behaviour.md §23), else `decode` (Dynamo's label for aggregated workers too).
fn worker_type(snap: &Snapshot, worker: usize) -> &'static str {
    let mut pools = (snap.models.iter())
        .filter(|m| m.members.iter().any(|p| p.worker as usize == worker))
        .peekable();
    let some = pools.peek().is_some();
    if some && pools.all(|m| m.role == PoolRole::Prefill) {
        "prefill"
    } else {
        "decode"
    }
}

/// One series per model with a waiting room.
fn rooms_of(snap: &Snapshot, value: &dyn Fn(&Model) -> f64) -> Series {
    (snap.models.iter().filter(|m| m.room.is_some()))
        .map(|m| (labels(&[("model", &m.name)]), value(m)))
        .collect()
}

/// Per tenant bucket (docs/behaviour.md §8.13), the buckets with any: a model's requests
/// in flight (while the busy rule spares light tenants) and its room's waiters. A bucket is
/// a number, never a tenant's value: at most 64 series per model.
fn tenants(f: &mut Families, snap: &Snapshot) {
    let per_bucket = |counts: &mut dyn Iterator<Item = u64>, model: &str, out: &mut Series| {
        for (b, n) in counts.enumerate().filter(|(_, n)| *n > 0) {
            let bucket = b.to_string();
            let l = labels(&[("model", model), ("tenant_bucket", &bucket)]);
            out.push((l, n as f64));
        }
    };
    let (mut inflight, mut waiting) = (Series::new(), Series::new());
    for m in snap.models.iter() {
        if let Some(t) = &m.tenants {
            per_bucket(&mut t.by_bucket(), &m.name, &mut inflight);
        }
        if let Some(r) = m
            .room
            .as_ref()
            .filter(|_| snap.config.tenant_header.is_some())
        {
            per_bucket(&mut r.room.waiting_by_bucket(), &m.name, &mut waiting);
        }
    }
    f.gauge(
        "spillway_tenant_requests",
        "Requests in flight at the model per tenant bucket (a hash of the tenant_header value over 64 buckets), while the busy rule spares light tenants",
        inflight,
    );
    f.gauge(
        "spillway_waiting_room_tenant_requests",
        "Requests waiting in the model's waiting room per tenant bucket (a hash of the tenant_header value over 64 buckets)",
        waiting,
    );
}

/// Worker admission (engine slots and overflow queue), for workers with a limit.
fn admission(f: &mut Families, snap: &Snapshot) {
    let gates: Vec<_> = snap
        .workers
        .iter()
        .filter_map(|w| {
            w.gate
                .as_ref()
                .map(|g| (labels(&[("worker", &w.cfg.name)]), g))
        })
        .collect();
    let series = |v: &dyn Fn(&crate::admission::Gate) -> f64| -> Series {
        gates.iter().map(|(l, g)| (l.clone(), v(g))).collect()
    };
    f.counter(
        "dynamo_rejection_request_total",
        "Requests rejected because the worker is at capacity (engine slots and queue full, or queue timeout)",
        series(&|g| g.rejected() as f64),
    );
    f.gauge(
        "dynamo_engine_request",
        "Requests holding an engine slot of the worker (engine_request_limit)",
        series(&|g| g.occupancy().0 as f64),
    );
    f.gauge(
        "dynamo_request_queue",
        "Requests waiting for an engine slot of the worker (request_queue_limit)",
        series(&|g| g.occupancy().1 as f64),
    );
    let rooms = |v: &dyn Fn(&crate::admission::Room) -> f64| -> Series {
        rooms_of(snap, &|m| m.room.as_ref().map_or(0.0, |r| v(&r.room)))
    };
    f.gauge(
        "spillway_waiting_room_requests",
        "Requests waiting in the model's waiting room for a slot at any of its workers (waiting_room_size)",
        rooms(&|r| r.waiting() as f64),
    );
    f.counter(
        "spillway_waiting_room_entered_total",
        "Requests that found every eligible worker's slots full and waited in the model's waiting room",
        rooms(&|r| r.entered() as f64),
    );
    f.counter(
        "spillway_waiting_room_predicted_refusals_total",
        "Waiters refused at once because their turn was predicted past the end of their wait (the room's timeout or the client's budget)",
        rooms_of(snap, &|m| m.metrics.room_predicted() as f64),
    );
    let waits: Vec<_> = (snap.models.iter().filter(|m| m.room.is_some()))
        .flat_map(|m| {
            Class::ALL.map(|c| {
                let l = labels(&[("model", &m.name), ("class", c.label())]);
                let h = histogram(&ROOM_WAIT_BUCKETS, &m.metrics, |core| {
                    &core.room_wait[c.index()]
                });
                (l, h)
            })
        })
        .collect();
    f.histogram(
        "spillway_waiting_room_wait_seconds",
        "Waits in the model's waiting room, however they ended (a slot, a refusal, the client gone)",
        waits,
    );
    tenants(f, snap);
    f.gauge(
        "spillway_waiting_room_release_rate",
        "Slots the model's workers gave back per second while requests waited in its room, as last measured (0: not yet)",
        rooms(&|r| r.pace().per_sec()),
    );
}
