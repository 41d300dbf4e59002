#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What does one routing decision cost on the data path? As `proxy::pick` (src/proxy/pick.rs) does
//! it: load the core's busy replica through its `arc_swap::Cache`, build each member's
//! `MemberState` from the busy set, the worker's down mark and this core's in-flight count,
//! and run `route::pick`, for a model of 8 and of 64 members in round-robin, power-of-two
//! and least-loaded. A quarter of the members are busy, loads and in-flight counts vary.
//!
//! `kv` mode (`route_kv`): the whole decision as `proxy::pick` makes it, `route::decide_kv`
//! on the core's scratch: hash a chat prompt of 4 KiB or 64 KiB (chunks of 16 tokens),
//! look up the predicted-cache index for every eligible member (one of them holds the
//! first half of the prompt, the others the system prompt), cost and pick, then
//! `route::record_kv` on the same scratch, as `proxy::pick::bound` records it once the
//! request is bound.

#[path = "fleet.rs"]
mod fleet;

use std::cell::RefCell;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use arc_swap::ArcSwap;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use spillway::config::{Config, Overrides};
use spillway::route::{self, MemberState, Pick, Rng, RouterMode};
use spillway::shed::Class;
use spillway::state::{BusySet, Snapshot};

/// The per-core state `pick` reads, shaped as in `CoreCtx`.
struct Core {
    id: usize,
    busy: RefCell<arc_swap::Cache<Arc<ArcSwap<BusySet>>, Arc<BusySet>>>,
    rr: RefCell<Vec<u64>>,
    rng: RefCell<Rng>,
}

/// `proxy::pick` (src/proxy/pick.rs) minus the direct-mode branch: no request failed yet.
fn pick(core: &Core, snap: &Snapshot, model_idx: usize, now: u64) -> Pick {
    let failed: u128 = 0;
    let model = &snap.models[model_idx];
    let mut cache = core.busy.borrow_mut();
    let busy = cache.load();
    let shed = busy.enabled(model.id);
    let state = |i: usize| {
        let m = model.members[i];
        let w = &snap.workers[m.worker as usize].state;
        MemberState {
            unreachable: w.is_down(now) || (i < 128 && failed & (1u128 << i) != 0),
            busy: shed && busy.is_busy(Class::Standard, m.id),
            inflight: w.inflight_on(core.id),
            load: busy.load(m.id),
            ..MemberState::default()
        }
    };
    let n = model.members.len();
    let mut rr = core
        .rr
        .borrow()
        .get(model.id as usize)
        .copied()
        .unwrap_or(0);
    let picked = route::pick(
        model.router_mode,
        n,
        state,
        &mut rr,
        &mut core.rng.borrow_mut(),
    );
    core.rr.borrow_mut()[model.id as usize] = rr;
    picked
}

fn setup(members: usize, mode: &str) -> (Snapshot, Core, Arc<ArcSwap<BusySet>>) {
    let text = fleet::model_toml(members, 1, mode, 40_000);
    let snap =
        Snapshot::standalone(Config::parse(&text, &Overrides::default()).unwrap(), 1).unwrap();
    let model = &snap.models[0];
    let mut set = BusySet::default();
    set.set_enabled(model.id);
    for (i, m) in model.members.iter().enumerate() {
        if i % 4 == 1 {
            set.set_busy(Class::Standard, m.id, None);
        }
        set.set_load(m.id, (fleet::mix(i as u64) % 1000) as u16);
        let w = &snap.workers[m.worker as usize].state;
        w.tracked[0]
            .inflight
            .store(fleet::mix(i as u64 + 7) % 4, Relaxed);
    }
    set.generation = 1;
    let replica = Arc::new(ArcSwap::from_pointee(set));
    let core = Core {
        id: 0,
        busy: RefCell::new(arc_swap::Cache::new(replica.clone())),
        rr: RefCell::new(vec![0; model.id as usize + 1]),
        rng: RefCell::new(Rng::new(0x5eed)),
    };
    (snap, core, replica)
}

fn routing(c: &mut Criterion) {
    let now = spillway::runtime::clock::now_ms();
    let mut g = c.benchmark_group("route_pick");
    for (label, mode) in [
        ("round_robin", "round-robin"),
        ("power_of_two", "power-of-two"),
        ("least_loaded", "least-loaded"),
    ] {
        for members in [8usize, 64] {
            let (snap, core, _replica) = setup(members, mode);
            assert_eq!(snap.models[0].router_mode, RouterMode::parse(mode).unwrap());
            // Never a busy member, never a refusal: a quarter are busy, the rest free.
            for _ in 0..1000 {
                match pick(&core, &snap, 0, now) {
                    Pick::Member(i) => assert_ne!(i % 4, 1),
                    other => panic!("{other:?}"),
                }
            }
            g.bench_with_input(BenchmarkId::new(label, members), &members, |b, _| {
                b.iter(|| black_box(pick(&core, black_box(&snap), 0, now)))
            });
        }
    }
    g.finish();
}

/// A chat body's `messages` value of about `bytes`: a system prompt (1 KiB) and the
/// conversation `conv`'s history.
fn messages(conv: usize, bytes: usize) -> String {
    let system = "You are a helpful assistant. ".repeat(37);
    let turn = format!("conversation {conv}: tell me more about that. ");
    let history = turn.repeat(bytes.saturating_sub(system.len()) / turn.len() + 1);
    format!(
        r#"[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{}"}}]"#,
        &history[..bytes.saturating_sub(system.len()).min(history.len())]
    )
}

fn kv_routing(c: &mut Criterion) {
    let now = spillway::runtime::clock::now_ms();
    let mut g = c.benchmark_group("route_kv");
    for members in [8usize, 64] {
        let (snap, core, _replica) = setup(members, "kv");
        let model = &snap.models[0];
        let kv = model.kv.as_deref().unwrap();
        let mut scratch = vec![0u64; spillway::route::prefix::MAX_CHUNKS];
        for kib in [4usize, 64] {
            let prompt = messages(1, kib * 1024);
            let tokens = prompt.len() as u64 / 4;
            // Every member holds the system prompt; member 2 the first half of this one.
            let state = |i: usize| MemberState {
                busy: i % 4 == 1,
                ..MemberState::default()
            };
            for i in 0..members {
                let other = messages(100 + i, 2048);
                let all = |_: usize| MemberState::default();
                let mut rng = Rng::new(i as u64 + 1);
                let only = |j: usize| MemberState {
                    unreachable: j != i,
                    ..all(j)
                };
                let d = route::decide_kv(
                    &kv.cache,
                    &kv.settings,
                    other.as_bytes(),
                    512,
                    members,
                    only,
                    &mut scratch,
                    now,
                    &mut rng,
                );
                let seen = (other.as_bytes(), Some(d.chunks));
                route::record_kv(&kv.cache, &kv.settings, seen, i, &mut scratch, now);
            }
            let half = messages(1, kib * 512);
            let to_2 = |j: usize| MemberState {
                unreachable: j != 2,
                ..MemberState::default()
            };
            let mut rng = Rng::new(7);
            let d = route::decide_kv(
                &kv.cache,
                &kv.settings,
                half.as_bytes(),
                tokens / 2,
                members,
                to_2,
                &mut scratch,
                now,
                &mut rng,
            );
            let seen = (half.as_bytes(), Some(d.chunks));
            route::record_kv(&kv.cache, &kv.settings, seen, 2, &mut scratch, now);
            let d = route::decide_kv(
                &kv.cache,
                &kv.settings,
                prompt.as_bytes(),
                tokens,
                members,
                state,
                &mut scratch,
                now,
                &mut rng,
            );
            assert_eq!(
                d.pick,
                Pick::Member(2),
                "the member holding half the prompt"
            );
            let mut rng = core.rng.borrow_mut();
            g.bench_with_input(
                BenchmarkId::new(format!("{members}_workers"), format!("{kib}KiB")),
                &kib,
                |b, _| {
                    b.iter(|| {
                        let d = route::decide_kv(
                            &kv.cache,
                            &kv.settings,
                            black_box(prompt.as_bytes()),
                            tokens,
                            members,
                            state,
                            &mut scratch,
                            now,
                            &mut rng,
                        );
                        if let Pick::Member(i) = d.pick {
                            let seen = (prompt.as_bytes(), Some(d.chunks));
                            let r = route::record_kv(
                                &kv.cache,
                                &kv.settings,
                                seen,
                                i,
                                &mut scratch,
                                now,
                            );
                            black_box(r);
                        }
                        black_box(d)
                    })
                },
            );
        }
    }
    g.finish();
}

criterion_group!(benches, routing, kv_routing);
criterion_main!(benches);
