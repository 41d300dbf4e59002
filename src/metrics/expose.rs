//! `/metrics`: every family built at scrape time from the cores' cells, the snapshot and
//! the monitor's state, encoded by the prometheus crate's text encoder. Names and labels
//! follow Dynamo (semantics §7); Spillway's own series are prefixed `spillway_`.

use std::sync::atomic::Ordering::Relaxed;

use prometheus::Encoder as _;
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

use super::{
    DURATION_BUCKETS, ITL_BUCKETS, MigrationReason, ModelMetrics, Outcome, RequestType,
    TTFT_BUCKETS,
};
use crate::monitor::Control;
use crate::route::Endpoint;

struct Families(Vec<MetricFamily>);

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name((*k).to_string());
            l.set_value((*v).to_string());
            l
        })
        .collect()
}

impl Families {
    fn family(&mut self, name: &str, help: &str, kind: MetricType) -> &mut MetricFamily {
        let mut f = MetricFamily::default();
        f.set_name(name.to_string());
        f.set_help(help.to_string());
        f.set_field_type(kind);
        self.0.push(f);
        self.0.last_mut().unwrap_or_else(|| unreachable!())
    }

    fn counter(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Vec<LabelPair>, f64)>,
    ) {
        let f = self.family(name, help, MetricType::COUNTER);
        for (l, v) in series {
            let mut c = Counter::default();
            c.set_value(v);
            let mut m = Metric::default();
            m.set_label(l);
            m.set_counter(c);
            f.mut_metric().push(m);
        }
    }

    fn gauge(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Vec<LabelPair>, f64)>,
    ) {
        let f = self.family(name, help, MetricType::GAUGE);
        for (l, v) in series {
            let mut g = Gauge::default();
            g.set_value(v);
            let mut m = Metric::default();
            m.set_label(l);
            m.set_gauge(g);
            f.mut_metric().push(m);
        }
    }

    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Vec<LabelPair>, Histogram)>,
    ) {
        let f = self.family(name, help, MetricType::HISTOGRAM);
        for (l, h) in series {
            let mut m = Metric::default();
            m.set_label(l);
            m.set_histogram(h);
            f.mut_metric().push(m);
        }
    }

    fn encode(mut self) -> Vec<u8> {
        self.0.retain(|f| !f.get_metric().is_empty());
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(e) = prometheus::TextEncoder::new().encode(&self.0, &mut out) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }
}

fn histogram<const N: usize>(
    bounds: &[f64; N],
    metrics: &ModelMetrics,
    pick: impl Fn(&super::ModelCore) -> &super::Histogram<N>,
) -> Histogram {
    let mut counts = vec![0u64; N + 1];
    let mut sum_ns = 0u64;
    for core in metrics.cores.iter() {
        pick(core).accumulate(&mut counts, &mut sum_ns);
    }
    let mut cumulative = 0;
    let buckets = bounds
        .iter()
        .zip(&counts)
        .map(|(&b, &c)| {
            cumulative += c;
            let mut bucket = Bucket::default();
            bucket.set_upper_bound(b);
            bucket.set_cumulative_count(cumulative);
            bucket
        })
        .collect();
    let mut h = Histogram::default();
    h.set_bucket(buckets);
    h.set_sample_count(counts.iter().sum());
    h.set_sample_sum(sum_ns as f64 / 1e9);
    h
}

/// Renders the whole exposition.
pub fn render(control: &Control) -> Vec<u8> {
    let shared = &control.shared;
    let snap = shared.snapshot.load_full();
    let monitor = &control.monitor;
    let now = crate::core::clock::now_ms();
    let mut f = Families(Vec::new());

    // Frontend request metrics, per model.
    let mut requests = Vec::new();
    let mut rejections = Vec::new();
    let mut migrations = Vec::new();
    for model in snap.models.iter() {
        let m = &model.metrics;
        for e in Endpoint::ALL {
            for t in [RequestType::Unary, RequestType::Stream] {
                for o in Outcome::ALL {
                    let n = m.requests(e, t, o);
                    if n > 0 {
                        let l = labels(&[
                            ("model", &model.name),
                            ("endpoint", e.label()),
                            ("request_type", t.label()),
                            ("status", o.status()),
                            ("error_type", o.error_type()),
                        ]);
                        requests.push((l, n as f64));
                    }
                }
            }
            let n = m.rejections(e);
            if n > 0 {
                rejections.push((
                    labels(&[("model", &model.name), ("endpoint", e.label())]),
                    n as f64,
                ));
            }
        }
        for reason in MigrationReason::ALL {
            let n = m.migrations(reason);
            if n > 0 {
                migrations.push((
                    labels(&[("model", &model.name), ("reason", reason.label())]),
                    n as f64,
                ));
            }
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
    let per_model =
        |g: &dyn Fn(&crate::config::snapshot::Model) -> f64| -> Vec<(Vec<LabelPair>, f64)> {
            snap.models
                .iter()
                .map(|m| (labels(&[("model", &m.name)]), g(m)))
                .collect()
        };
    f.gauge(
        "dynamo_frontend_inflight_requests",
        "Number of inflight requests",
        per_model(&|m| m.metrics.inflight() as f64),
    );
    f.histogram(
        "dynamo_frontend_time_to_first_token_seconds",
        "Time to first token in seconds",
        snap.models.iter().map(|m| {
            (
                labels(&[("model", &m.name)]),
                histogram(&TTFT_BUCKETS, &m.metrics, |c| &c.ttft),
            )
        }),
    );
    f.histogram(
        "dynamo_frontend_inter_token_latency_seconds",
        "Inter-token latency in seconds",
        snap.models.iter().map(|m| {
            (
                labels(&[("model", &m.name)]),
                histogram(&ITL_BUCKETS, &m.metrics, |c| &c.itl),
            )
        }),
    );
    f.histogram(
        "dynamo_frontend_request_duration_seconds",
        "Duration of LLM requests",
        snap.models.iter().map(|m| {
            (
                labels(&[("model", &m.name)]),
                histogram(&DURATION_BUCKETS, &m.metrics, |c| &c.duration),
            )
        }),
    );

    // Per worker and rank: the latest effective load the busy rule saw.
    let staleness = snap.config.load_staleness_ms;
    let mut decode = Vec::new();
    let mut prefill = Vec::new();
    for w in snap.workers.iter() {
        let Some(load) = monitor.table.workers.get(&w.state.slot) else {
            continue;
        };
        for r in 0..load.dp_size(&w.cfg) {
            let e = load.effective(r, &w.cfg, now, staleness);
            let rank = r.to_string();
            let l = || {
                labels(&[
                    ("worker_id", &w.cfg.name),
                    ("dp_rank", &rank),
                    ("worker_type", "decode"),
                ])
            };
            if let Some(v) = e.kv_used_blocks.max(e.active_decode_blocks) {
                decode.push((l(), v as f64));
            }
            if let Some(v) = e.active_prefill_tokens {
                prefill.push((l(), v as f64));
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

    // Worker admission (engine slots and overflow queue), for workers with a limit.
    let gates: Vec<_> = snap
        .workers
        .iter()
        .filter_map(|w| w.gate.as_ref().map(|g| (w, g)))
        .collect();
    f.counter(
        "dynamo_rejection_request_total",
        "Requests rejected because the worker is at capacity (engine slots and queue full, or queue timeout)",
        gates.iter().map(|(w, g)| (labels(&[("worker", &w.cfg.name)]), g.rejected() as f64)),
    );
    f.gauge(
        "dynamo_engine_request",
        "Requests holding an engine slot of the worker (engine_request_limit)",
        gates
            .iter()
            .map(|(w, g)| (labels(&[("worker", &w.cfg.name)]), g.occupancy().0 as f64)),
    );
    f.gauge(
        "dynamo_request_queue",
        "Requests waiting for an engine slot of the worker (request_queue_limit)",
        gates
            .iter()
            .map(|(w, g)| (labels(&[("worker", &w.cfg.name)]), g.occupancy().1 as f64)),
    );

    // Spillway's own series.
    f.counter(
        "spillway_busy_publish_total",
        "Busy-set publications from the monitor to the cores",
        [(Vec::new(), monitor.publishes as f64)],
    );
    f.gauge(
        "spillway_busy_workers",
        "Workers of the model in the published busy set",
        per_model(&|m| monitor.busy_workers(&snap, &m.name) as f64),
    );
    f.gauge(
        "spillway_busy_shedding_enabled",
        "1 when at least one busy threshold is set for the model",
        per_model(&|m| f64::from(u8::from(monitor.published().enabled(m.id)))),
    );
    f.gauge(
        "spillway_worker_up",
        "0 while the worker is marked down after failed connects",
        snap.workers.iter().map(|w| {
            (
                labels(&[("worker", &w.cfg.name)]),
                f64::from(u8::from(!w.state.is_down(now))),
            )
        }),
    );
    f.gauge(
        "spillway_worker_inflight_requests",
        "Requests routed to the worker and not finished, over all cores",
        snap.workers.iter().map(|w| {
            (
                labels(&[("worker", &w.cfg.name)]),
                w.state.inflight_total() as f64,
            )
        }),
    );
    let legacy = shared
        .legacy_driver
        .iter()
        .filter(|d| d.load(Relaxed))
        .count();
    f.gauge(
        "spillway_io_driver",
        "Data-path cores per I/O driver",
        [
            (
                labels(&[("driver", "io_uring")]),
                (shared.cores() - legacy) as f64,
            ),
            (labels(&[("driver", "epoll")]), legacy as f64),
        ],
    );
    f.counter(
        "spillway_config_reloads_total",
        "Configuration reloads (SIGHUP or POST /reload) by result",
        [
            (labels(&[("result", "ok")]), control.reloads_ok as f64),
            (
                labels(&[("result", "error")]),
                control.reloads_failed as f64,
            ),
        ],
    );
    f.gauge(
        "spillway_config_generation",
        "Generation of the running configuration",
        [(Vec::new(), snap.generation as f64)],
    );
    f.gauge(
        "spillway_connections_active",
        "Open client connections",
        [(Vec::new(), shared.connections.load(Relaxed) as f64)],
    );
    type Cell = fn(&super::CoreCounters) -> &std::sync::atomic::AtomicU64;
    let sum = |get: Cell| -> f64 {
        shared
            .counters
            .iter()
            .map(|c| get(c).load(Relaxed))
            .sum::<u64>() as f64
    };
    let counters: [(&str, &str, Cell); 8] = [
        (
            "spillway_connections_total",
            "Client connections accepted",
            |c| &c.connections,
        ),
        (
            "spillway_connections_refused_total",
            "Client connections refused over max_connections",
            |c| &c.connections_refused,
        ),
        (
            "spillway_bad_requests_total",
            "Requests refused as malformed before routing",
            |c| &c.bad_requests,
        ),
        (
            "spillway_upstream_connects_total",
            "Upstream connections opened",
            |c| &c.upstream_connects,
        ),
        (
            "spillway_upstream_connect_failures_total",
            "Upstream connects that failed or timed out",
            |c| &c.upstream_connect_failures,
        ),
        (
            "spillway_upstream_reuse_retries_total",
            "Requests retried on a fresh connection after a pooled one failed",
            |c| &c.upstream_reuse_retries,
        ),
        (
            "spillway_failovers_total",
            "Requests moved to another worker after a failed connect",
            |c| &c.failovers,
        ),
        (
            "spillway_client_disconnects_total",
            "Requests abandoned because the client went away",
            |c| &c.client_disconnects,
        ),
    ];
    for (name, help, get) in counters {
        f.counter(name, help, [(Vec::new(), sum(get))]);
    }
    f.counter(
        "spillway_core_connections_total",
        "Client connections accepted, per data-path core",
        shared.counters.iter().enumerate().map(|(i, c)| {
            (
                labels(&[("core", &i.to_string())]),
                c.connections.load(Relaxed) as f64,
            )
        }),
    );
    f.encode()
}
