//! Spillway's own series (`spillway_*`): busy-set publication, workers' marks, the I/O
//! driver, reloads, connections and the data-path counters summed over cores.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use super::families::{Families, labels};
use super::per_model;
use crate::monitor::Control;
use crate::state::{CoreCounters, Shared, Snapshot};

type Cell = fn(&CoreCounters) -> &AtomicU64;

/// The data-path counters, summed over cores: name, help, cell.
const CORE_COUNTERS: [(&str, &str, Cell); 14] = [
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
        "Requests answered before routing: malformed, or naming no model served here",
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
        "spillway_upstream_idle_closed_total",
        "Idle pooled upstream connections closed because the worker sent bytes or closed",
        |c| &c.upstream_idle_closed,
    ),
    (
        "spillway_failovers_total",
        "Attempts that failed to connect, after which the request tried another worker",
        |c| &c.failovers,
    ),
    (
        "spillway_client_disconnects_total",
        "Requests abandoned because the client went away",
        |c| &c.client_disconnects,
    ),
    (
        "spillway_tls_handshakes_total",
        "TLS handshakes completed on the TLS listener",
        |c| &c.tls_handshakes,
    ),
    (
        "spillway_tls_handshake_failures_total",
        "TLS listener connections closed before a finished handshake (bad hello, plain text, timeout)",
        |c| &c.tls_handshake_failures,
    ),
    (
        "spillway_upstream_tls_failures_total",
        "TLS handshakes with https:// workers that failed (certificate, protocol); the worker is marked down",
        |c| &c.upstream_tls_failures,
    ),
    (
        "spillway_access_log_lines_total",
        "Access log lines written into the cores' buffers",
        |c| &c.access_log_lines,
    ),
    (
        "spillway_access_log_dropped_total",
        "Access log lines dropped because the writer thread had fallen behind",
        |c| &c.access_log_dropped,
    ),
];

pub(super) fn families(f: &mut Families, control: &Control, snap: &Snapshot, now: u64) {
    busy(f, control, snap);
    workers(f, snap, now);
    lifecycle(f, control, snap);
    counters(f, &control.shared);
}

fn busy(f: &mut Families, control: &Control, snap: &Snapshot) {
    let monitor = &control.monitor;
    f.counter(
        "spillway_busy_publish_total",
        "Busy-set publications from the monitor to the cores",
        [(Vec::new(), monitor.publishes as f64)],
    );
    f.gauge(
        "spillway_busy_workers",
        "Workers of the model in the published busy set",
        per_model(snap, |m| monitor.busy_workers(snap, &m.name) as f64),
    );
    f.gauge(
        "spillway_busy_shedding_enabled",
        "1 when at least one busy threshold is set for the model",
        per_model(snap, |m| {
            f64::from(u8::from(monitor.published().enabled(m.id)))
        }),
    );
    let scales = snap
        .models
        .iter()
        .zip(&snap.config.models)
        .filter(|(_, cfg)| cfg.adaptive.is_some())
        .flat_map(|(m, _)| m.members.iter().map(move |mm| (m, mm)))
        .map(|(m, mm)| {
            let worker = &snap.workers[mm.worker as usize].cfg.name;
            let l = labels(&[("model", &m.name), ("worker", worker)]);
            (l, monitor.adaptivity.scale(mm.id))
        })
        .collect::<Vec<_>>();
    f.gauge(
        "spillway_adaptive_threshold_scale",
        "Adaptive mode: the factor on the model's busy thresholds for the worker",
        scales,
    );
    let overloaded = snap
        .models
        .iter()
        .zip(&snap.config.models)
        .filter(|(_, cfg)| cfg.adaptive.is_some())
        .map(|(m, _)| {
            let on = monitor.adaptivity.is_overloaded(m.id);
            (labels(&[("model", &m.name)]), f64::from(u8::from(on)))
        })
        .collect::<Vec<_>>();
    f.gauge(
        "spillway_adaptive_overloaded",
        "Adaptive mode: 1 while the model refuses a large share of its requests (its TTFT target binds), 0 near capacity (twice the target)",
        overloaded,
    );
}

fn workers(f: &mut Families, snap: &Snapshot, now: u64) {
    let each = |v: &dyn Fn(&crate::state::Worker) -> f64| {
        snap.workers
            .iter()
            .map(|w| (labels(&[("worker", &w.cfg.name)]), v(w)))
            .collect::<Vec<_>>()
    };
    f.gauge(
        "spillway_worker_up",
        "0 while the worker is marked down after failed connects",
        each(&|w| f64::from(u8::from(!w.state.is_down(now)))),
    );
    f.gauge(
        "spillway_worker_inflight_requests",
        "Requests routed to the worker and not finished, over all cores",
        each(&|w| w.state.inflight_total() as f64),
    );
}

fn lifecycle(f: &mut Families, control: &Control, snap: &Snapshot) {
    let shared = &control.shared;
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
    f.counter(
        "spillway_admin_connections_evicted_total",
        "Admin connections closed at admin_max_connections to make room for a newer one: the oldest with no request head in progress",
        [(Vec::new(), control.admin_evictions as f64)],
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
}

fn counters(f: &mut Families, shared: &Shared) {
    for (name, help, get) in CORE_COUNTERS {
        let sum: u64 = shared.counters.iter().map(|c| get(c).load(Relaxed)).sum();
        f.counter(name, help, [(Vec::new(), sum as f64)]);
    }
    let gauge = |get: Cell| {
        shared
            .counters
            .iter()
            .map(|c| get(c).load(Relaxed))
            .sum::<u64>()
    };
    f.gauge(
        "spillway_connections_parked",
        "Idle keep-alive client connections holding no buffer (refreshed once a second)",
        [(Vec::new(), gauge(|c| &c.parked_connections) as f64)],
    );
    f.gauge(
        "spillway_connection_buffers_lent",
        "Connection buffers lent to busy connections (refreshed once a second)",
        [(Vec::new(), gauge(|c| &c.buffers_lent) as f64)],
    );
    f.gauge(
        "spillway_connection_buffer_pool_bytes",
        "Bytes of free connection buffers kept by the cores' pools (refreshed once a second)",
        [(Vec::new(), gauge(|c| &c.buffer_pool_bytes) as f64)],
    );
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
}
