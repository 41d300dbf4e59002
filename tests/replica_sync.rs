//! Front-door replicas sharing what each routed over NATS (`[nats] replica_sync`), with a
//! real nats-server started here. One worker behind two front doors, its load known only
//! from what the doors routed (`tracked`), busy above 100 prefill tokens; each request
//! here is about 60 tokens.
//! - Without sharing, each door sees only its own request: a third request is admitted
//!   and the worker holds 3 (the herd the sharing exists to stop).
//! - With sharing, each door sees both and refuses the third (529) at once; when the
//!   requests finish, both doors admit again.
//! - A peer that falls silent is forgotten, its load with it: a routed-load message
//!   published by the test (a replica that then dies) turns the worker busy, and silence
//!   turns it idle after 10 publish intervals.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::Duration;

use spillway_testkit::nats::Nats;
use spillway_testkit::*;

const SUBJECT: &str = "spillway.routed";
const WAIT: Duration = Duration::from_secs(10);

/// A front door for `worker` (named "a"), sharing its routed load when `nats` is given.
fn door(worker: &str, nats: Option<&Nats>) -> ServerHandle {
    let sync = nats.map_or(String::new(), |n| {
        format!(
            "[nats]\nurl = \"nats://{}\"\nreplica_sync = \"{SUBJECT}\"\npublish_interval_ms = 20\n",
            n.addr()
        )
    });
    proxy(
        1,
        &format!(
            "monitor_interval_ms = 20\n{sync}\
             [[models]]\nname = \"m\"\nactive_prefill_tokens_threshold = 100\n\
             [[models.workers]]\nurl = \"{worker}\"\nname = \"a\"\nload_sources = [\"tracked\"]\n"
        ),
    )
}

/// A completion whose prompt is about 60 tokens.
fn request() -> Vec<u8> {
    let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(240));
    post("/v1/completions", &body)
}

/// Sends a request through `door` and waits until the worker has `held` requests.
fn hold(door: &ServerHandle, worker: &Held, held: usize) -> Client {
    let mut c = Client::connect(door.data_addr);
    c.send(&request());
    eventually("the worker holds the request", WAIT, || {
        worker.up.count() == held
    });
    c
}

/// The prefill tokens the door's monitor believes the worker has.
fn prefill(admin: SocketAddr) -> u64 {
    let load = admin_get(admin, "/load").json();
    load["workers"][0]["ranks"][0]["active_prefill_tokens"]
        .as_u64()
        .unwrap_or(0)
}

fn peers(admin: SocketAddr) -> f64 {
    metric_value(&metrics(admin), "spillway_nats_replica_peers").unwrap_or(0.0)
}

/// The worker is busy at the door: 529 for a new request, the worker not reached.
fn assert_refused(door: &ServerHandle, worker: &Held, held: usize) {
    let r = once(door.data_addr, &request());
    assert_eq!(r.status, 529, "{}", r.text());
    assert_eq!(
        worker.up.count(),
        held,
        "a refused request reached the worker"
    );
}

#[test]
fn without_sharing_each_door_admits_up_to_the_threshold_alone() {
    let worker = Held::new("a");
    let (a, b) = (door(&worker.url(), None), door(&worker.url(), None));
    let mut held = vec![hold(&a, &worker, 1), hold(&b, &worker, 2)];
    // Each door sees 60 tokens: not over 100, so the worker takes a third.
    std::thread::sleep(Duration::from_millis(100));
    held.push(hold(&b, &worker, 3));
    worker.release(3);
    for mut c in held {
        assert_eq!(c.response().status, 200);
    }
}

#[test]
fn doors_sharing_their_routed_load_see_the_worker_busy_together() {
    let Some(nats) = Nats::start() else { return };
    let worker = Held::new("a");
    let (a, b) = (
        door(&worker.url(), Some(&nats)),
        door(&worker.url(), Some(&nats)),
    );
    eventually("each door hears the other", WAIT, || {
        peers(a.admin_addr) == 1.0 && peers(b.admin_addr) == 1.0
    });
    let mut held = vec![hold(&a, &worker, 1), hold(&b, &worker, 2)];
    // Each door's tracked load is its own 60 tokens plus the peer's.
    eventually("both doors see both requests", WAIT, || {
        prefill(a.admin_addr) >= 120 && prefill(b.admin_addr) >= 120
    });
    assert_refused(&a, &worker, 2);
    assert_refused(&b, &worker, 2);
    worker.release(2);
    for c in &mut held {
        assert_eq!(c.response().status, 200);
    }
    eventually("both doors see the worker idle again", WAIT, || {
        prefill(a.admin_addr) == 0 && prefill(b.admin_addr) == 0
    });
    worker.release(1);
    assert_eq!(once(b.data_addr, &request()).status, 200);
    let sent = metric_value(
        &metrics(a.admin_addr),
        "spillway_nats_replica_messages_total{direction=\"published\"}",
    );
    assert!(sent.unwrap_or(0.0) > 0.0, "{sent:?}");
}

#[test]
fn a_silent_peers_load_is_forgotten() {
    let Some(nats) = Nats::start() else { return };
    let worker = Held::new("a");
    let d = door(&worker.url(), Some(&nats));
    // Wait until the door's subscription is up: its own messages come back to it.
    eventually("the door subscribes", WAIT, || {
        metrics(d.admin_addr).contains("spillway_nats_connected{role=\"replica_subscribe\"} 1")
    });
    let ghost = br#"{"replica":"ghost","routed":[{"worker_id":"a","active_prefill_tokens":500},{"worker_id":"elsewhere","active_prefill_tokens":9}]}"#;
    nats.publish(SUBJECT, ghost);
    eventually("the ghost's load counts", WAIT, || {
        prefill(d.admin_addr) == 500
    });
    assert_refused(&d, &worker, 0);
    // Silent for 10 intervals of 20 ms: forgotten.
    eventually("the ghost is forgotten", WAIT, || {
        prefill(d.admin_addr) == 0 && peers(d.admin_addr) == 0.0
    });
    worker.release(1);
    assert_eq!(once(d.data_addr, &request()).status, 200);
    // A message that is not a routed-load message is counted and changes nothing.
    nats.publish(SUBJECT, b"[1,2]");
    eventually("the invalid message is counted", WAIT, || {
        metric_value(
            &metrics(d.admin_addr),
            "spillway_nats_replica_messages_total{direction=\"invalid\"}",
        ) == Some(1.0)
    });
}
