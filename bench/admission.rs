//! Admission gate costs (issue 4): how much does one request pay for the hard cap?
//! - `acquire_release/uncontended`: take a slot and give it back, one thread.
//! - `acquire_release/contended`: the same while another thread hammers the same gate
//!   (both cores of a 2-core machine on one cache line).
//! - `queue/enqueue_wake`: the overflow path: a ticket that must wait registers its waker,
//!   a release wakes it, it runs and leaves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // a benchmark times itself

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use spillway::admission::Gate;
use spillway::shed::Class;

fn acquire_release(c: &mut Criterion) {
    let mut g = c.benchmark_group("acquire_release");
    let gate = Gate::new(64, 16);
    g.bench_function("uncontended", |b| {
        b.iter(|| {
            let t = gate.enter(Class::Standard).unwrap();
            black_box(t.is_ready());
        })
    });
    let gate = Arc::new(Gate::new(64, 16));
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = {
        let (gate, stop) = (gate.clone(), stop.clone());
        std::thread::spawn(move || {
            let _ = monoio::utils::bind_to_cpu_set([1]);
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..1000 {
                    drop(black_box(gate.enter(Class::Standard)));
                }
            }
        })
    };
    let _ = monoio::utils::bind_to_cpu_set([0]);
    g.bench_function("contended", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                if let Some(t) = gate.enter(Class::Standard) {
                    black_box(t.is_ready());
                }
            }
            start.elapsed()
        })
    });
    stop.store(true, Ordering::Relaxed);
    hammer.join().unwrap();
    g.finish();
}

fn enqueue_wake(c: &mut Criterion) {
    let mut g = c.benchmark_group("queue");
    let gate = Gate::new(1, 2);
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    g.bench_function("enqueue_wake", |b| {
        b.iter(|| {
            let running = gate.enter(Class::Standard).unwrap();
            let waiting = gate.enter(Class::Standard).unwrap();
            {
                let mut ready = pin!(waiting.ready());
                assert!(ready.as_mut().poll(&mut cx).is_pending());
                drop(running); // wakes the waiter's slot
                assert!(ready.as_mut().poll(&mut cx).is_ready());
            }
            drop(waiting);
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = acquire_release, enqueue_wake
}
criterion_main!(benches);
