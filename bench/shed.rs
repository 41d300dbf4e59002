#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What does the busy rule cost: one rank (`rank_busy`, all three thresholds set), and the
//! monitor's whole pass over a fleet of 1,000 workers × 8 ranks with pushed load (JSON
//! parse of a `/load` batch, `LoadTable::push`, `evaluate`, `Monitor::publish`)?
//!
//! Before criterion runs, a counting allocator reports heap allocations per call of each
//! monitor step (the busy rule is meant to allocate nothing once warm).

#[path = "fleet.rs"]
mod fleet;

use std::collections::HashMap;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group};
use spillway::config::{Config, Overrides};
use spillway::monitor::evaluate::{Latches, Rule, evaluate};
use spillway::monitor::load::{LoadEvent, LoadTable, parse_events};
use spillway::monitor::{Adaptivity, Monitor};
use spillway::shed::{RankLoad, Thresholds, rank_busy};
use spillway::state::{BusySet, Shared, Snapshot};
use spillway_testkit::alloc::{CountingAlloc, allocations};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const WORKERS: usize = 1000;
const DP: u32 = 8;
const RANKS: u64 = WORKERS as u64 * DP as u64;
const NOW: u64 = 1_000_000;

const ALL_THREE: Thresholds = Thresholds {
    active_decode_blocks_threshold: Some(0.85),
    active_prefill_tokens_threshold: Some(8192),
    active_prefill_tokens_threshold_frac: Some(1.5),
    waiting_requests_threshold: None,
};

fn rank(decode: u64, prefill: u64) -> RankLoad {
    RankLoad {
        active_decode_blocks: Some(decode),
        kv_used_blocks: Some(decode),
        active_prefill_tokens: Some(prefill),
        kv_total_blocks: Some(fleet::KV_TOTAL_BLOCKS),
        max_num_batched_tokens: Some(fleet::MAX_BATCHED_TOKENS),
        waiting_requests: None,
    }
}

fn busy_rule(c: &mut Criterion) {
    let mut g = c.benchmark_group("rank_busy");
    // Free: every check runs and none trips. Busy: the decode check (latched) or prefill.
    for (name, load, want) in [
        ("all_three/free", rank(1000, 2000), false),
        ("all_three/busy_decode", rank(3600, 2000), true),
        ("all_three/busy_prefill", rank(1000, 9000), true),
    ] {
        let mut latch = false;
        assert_eq!(rank_busy(&ALL_THREE, &load, &mut latch), want);
        g.bench_function(name, |b| {
            b.iter(|| rank_busy(black_box(&ALL_THREE), black_box(&load), &mut latch))
        });
    }
    g.finish();
}

struct Fleet {
    snap: Snapshot,
    json: &'static str,
    /// Borrow their worker names from `json` (leaked: it lives as long as the bench).
    events: Vec<LoadEvent<'static>>,
    thresholds: HashMap<String, Thresholds>,
}

fn fleet() -> Fleet {
    let text = fleet::model_toml(WORKERS, DP, "round-robin", 40_000);
    let cfg = Config::parse(&text, &Overrides::default()).unwrap();
    let snap = Snapshot::standalone(cfg, 1).unwrap();
    let json: &'static str = fleet::load_batches(0, WORKERS, DP, 1).remove(0).leak();
    let events = parse_events(json.as_bytes()).unwrap();
    assert_eq!(events.len() as u64, RANKS);
    let thresholds = snap
        .config
        .models
        .iter()
        .map(|m| (m.name.clone(), m.thresholds))
        .collect();
    Fleet {
        snap,
        json,
        events,
        thresholds,
    }
}

fn shared(cores: usize) -> Shared {
    // The state the cores share, without a runtime: `cores` replicas to publish into.
    let text = fleet::model_toml(1, 1, "round-robin", 40_000);
    let snap =
        Snapshot::standalone(Config::parse(&text, &Overrides::default()).unwrap(), cores).unwrap();
    Shared::new(snap, cores)
}

/// Flips the prefill threshold between 8192 and 0 tokens (nearly every worker busy), so
/// every publish sees a different busy set.
fn flip(thresholds: &mut HashMap<String, Thresholds>, on: bool) {
    if let Some(t) = thresholds.get_mut(fleet::MODEL) {
        t.active_prefill_tokens_threshold = Some(if on { 8192 } else { 0 });
    }
}

fn monitor(c: &mut Criterion) {
    let f = fleet();
    let mut g = c.benchmark_group("monitor_1000x8");
    g.throughput(Throughput::Elements(RANKS));
    g.sample_size(20);

    // As `POST /load` parses: `parse_events` (one event or an array).
    g.bench_function("parse_load_json/parse_events", |b| {
        b.iter(|| black_box(parse_events(black_box(f.json.as_bytes())).map(|v| v.len())))
    });
    // Baseline: the same array parsed straight into `Vec<LoadEvent>`.
    g.bench_function("parse_load_json/Vec<LoadEvent>", |b| {
        b.iter(|| {
            black_box(serde_json::from_str::<Vec<LoadEvent>>(black_box(f.json)).map(|v| v.len()))
        })
    });

    let mut table = LoadTable::default();
    g.bench_function("LoadTable::push", |b| {
        b.iter(|| black_box(table.push(&f.snap, black_box(&f.events), NOW)))
    });

    let mut latches = Latches::default();
    let mut recheck = Vec::new();
    let mut out = BusySet::default();
    g.bench_function("evaluate", |b| {
        b.iter(|| {
            evaluate(
                &f.snap,
                &table,
                Rule {
                    thresholds: &f.thresholds,
                    adaptivity: &Adaptivity::default(),
                    latches: &mut latches,
                    recheck: &mut recheck,
                },
                NOW,
                &mut out,
            );
            black_box(&out);
        })
    });

    let shared = shared(spillway::config::default_cores());
    let mut mon = Monitor::new(&f.snap);
    mon.table.push(&f.snap, &f.events, NOW).unwrap();
    mon.publish(&shared, &f.snap, NOW);
    g.bench_function("Monitor::publish/unchanged", |b| {
        b.iter(|| black_box(mon.publish(&shared, &f.snap, NOW)))
    });
    let mut on = true;
    g.bench_function("Monitor::publish/changed", |b| {
        b.iter(|| {
            on = !on;
            flip(&mut mon.thresholds, on);
            black_box(mon.publish(&shared, &f.snap, NOW))
        })
    });
    g.finish();
}

/// Does `LoadTable::push` cost per event grow with the fleet? A batch of every rank of
/// fleets of 125 to 1,000 workers × 8 ranks.
fn push_scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("push_per_fleet_size");
    g.sample_size(20);
    for workers in [125usize, 250, 500, 1000] {
        let text = fleet::model_toml(workers, DP, "round-robin", 40_000);
        let snap =
            Snapshot::standalone(Config::parse(&text, &Overrides::default()).unwrap(), 1).unwrap();
        let json = fleet::load_batches(0, workers, DP, 1).remove(0);
        let events = parse_events(json.as_bytes()).unwrap();
        let mut table = LoadTable::default();
        g.throughput(Throughput::Elements(events.len() as u64));
        g.bench_function(format!("LoadTable::push/{workers}x8"), |b| {
            b.iter(|| black_box(table.push(&snap, black_box(&events), NOW)))
        });
    }
    g.finish();
}

/// The monitor's work per NATS message at fleet scale (`fleet_scale`'s load): 4,096 workers
/// × 8 ranks, one message per worker with its 8 rank events; a read of 75 messages is
/// parsed and applied message by message (`Control::apply_nats`), then its workers'
/// members are evaluated and published at once (`flush_nats`). Two load variants
/// alternate, so about one worker in five changes its busy state each read.
fn nats_read(c: &mut Criterion) {
    const FLEET: usize = 4096;
    const READ: usize = 75;
    let text = fleet::model_toml(FLEET, DP, "round-robin", 40_000);
    let snap =
        Snapshot::standalone(Config::parse(&text, &Overrides::default()).unwrap(), 1).unwrap();
    let variants: Vec<Vec<String>> = (0..2)
        .map(|v| fleet::load_batches(v, FLEET, DP, FLEET))
        .collect();
    let shared = shared(spillway::config::default_cores());
    let mut mon = Monitor::new(&snap);
    let mut touched = spillway::state::SlotSet::default();
    for m in &variants[0] {
        let events = parse_events(m.as_bytes()).unwrap();
        mon.table
            .push_known(&snap, &events, NOW, &mut touched)
            .unwrap();
    }
    mon.publish(&shared, &snap, NOW);
    touched.clear();
    let mut g = c.benchmark_group("nats_4096x8");
    g.throughput(Throughput::Elements(READ as u64));
    g.sample_size(20);
    let mut at = 0usize;
    g.bench_function("read_of_75_messages", |b| {
        b.iter(|| {
            let batch = &variants[(at / FLEET) % 2];
            for i in 0..READ {
                let events = parse_events(batch[(at + i) % FLEET].as_bytes()).unwrap();
                black_box(mon.table.push_known(&snap, &events, NOW, &mut touched)).unwrap();
            }
            at += READ;
            black_box(mon.publish_slots(&shared, &snap, NOW, &touched));
            touched.clear();
        })
    });
    // The monitor's tick with nothing due: what `Control::tick` runs every
    // `monitor_interval_ms` (folding tracked load in, stepping the adaptive mode, and the
    // pass over the members whose entry can change by itself).
    g.throughput(Throughput::Elements(1));
    g.bench_function("tick", |b| {
        b.iter(|| {
            mon.refresh_tracked(&snap, NOW);
            black_box(mon.adaptivity.step(&snap, NOW));
            black_box(mon.publish_due(&shared, &snap, NOW))
        })
    });
    g.finish();
}

/// Allocations per call of `op`, after one warm-up call.
fn allocations_per_call(mut op: impl FnMut()) -> f64 {
    const CALLS: u64 = 10;
    op();
    let before = allocations();
    for _ in 0..CALLS {
        op();
    }
    (allocations() - before) as f64 / CALLS as f64
}

fn report_allocations() {
    let f = fleet();
    let mut table = LoadTable::default();
    let mut latches = Latches::default();
    let mut recheck = Vec::new();
    let mut out = BusySet::default();
    let shared = shared(spillway::config::default_cores());
    let mut mon = Monitor::new(&f.snap);
    mon.table.push(&f.snap, &f.events, NOW).unwrap();

    let rows = [
        (
            "parse_load_json with parse_events (8,000 events)",
            allocations_per_call(|| {
                black_box(parse_events(f.json.as_bytes()).unwrap());
            }),
        ),
        (
            "parse_load_json as Vec<LoadEvent> (8,000 events)",
            allocations_per_call(|| {
                black_box(serde_json::from_str::<Vec<LoadEvent>>(f.json).unwrap());
            }),
        ),
        (
            "LoadTable::push (8,000 events)",
            allocations_per_call(|| {
                table.push(&f.snap, &f.events, NOW).unwrap();
            }),
        ),
        (
            "evaluate (1,000 × 8)",
            allocations_per_call(|| {
                evaluate(
                    &f.snap,
                    &table,
                    Rule {
                        thresholds: &f.thresholds,
                        adaptivity: &Adaptivity::default(),
                        latches: &mut latches,
                        recheck: &mut recheck,
                    },
                    NOW,
                    &mut out,
                );
            }),
        ),
        (
            "Monitor::publish, unchanged",
            allocations_per_call(|| {
                mon.publish(&shared, &f.snap, NOW);
            }),
        ),
        ("Monitor::publish, changed", {
            let mut on = true;
            allocations_per_call(|| {
                on = !on;
                flip(&mut mon.thresholds, on);
                assert!(mon.publish(&shared, &f.snap, NOW));
            })
        }),
    ];
    println!("\nHeap allocations per call (after one warm-up call):\n");
    println!("| step | allocations per call |");
    println!("|---|---:|");
    for (name, n) in rows {
        println!("| {name} | {n} |");
    }
    println!();
}

criterion_group!(benches, busy_rule, monitor, push_scaling, nats_read);

fn main() {
    report_allocations();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
