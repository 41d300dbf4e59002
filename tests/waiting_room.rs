#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! A model's waiting room (docs/behaviour.md §8.12): requests that find every worker's
//! slots full wait for the model, not for one worker, and bind to the first worker that
//! frees a slot (late binding); first come, first served across cores; the room's size is
//! exact; its timeout, a client's budget and a client leaving end a wait.

use spillway_testkit::*;
use std::io::Write;
use std::time::{Duration, Instant};

const ROOM_FULL: &str =
    "Server overloaded: every worker of the model is at capacity and its waiting room is full";
const ROOM_EVICTED: &str =
    "Server overloaded: request evicted from the model's full waiting room by a more important one";
const ROOM_TENANT_FULL: &str =
    "Server overloaded: this tenant already holds its share of the model's waiting room";
const ROOM_TIMEOUT: &str = "Server overloaded: request rejected after waiting in the model's waiting room past its timeout";

/// A model of held workers with one slot each and no queue of their own, and a room.
fn with_room(cores: usize, workers: &[&Held], room: &str) -> ServerHandle {
    let mut cfg = format!("[[models]]\nname = \"m\"\nrouter_mode = \"round-robin\"\n{room}\n");
    for (i, h) in workers.iter().enumerate() {
        cfg += &format!(
            "[[models.workers]]\nurl = \"{}\"\nname = \"w{i}\"\nengine_request_limit = 1\n",
            h.url()
        );
    }
    proxy(cores, &cfg)
}

fn gauge(p: &ServerHandle, series: &str) -> f64 {
    scrape(p.admin_addr, series).unwrap_or(0.0)
}

fn waiting(p: &ServerHandle) -> f64 {
    gauge(p, "spillway_waiting_room_requests{model=\"m\"}")
}

/// Sends `tag` and waits until it is in the room (`before` were there already).
fn wait_in_room(p: &ServerHandle, tag: &str, before: f64) -> std::thread::JoinHandle<Response> {
    let h = spawn_request(p.data_addr, tagged(tag, ""));
    eventually(tag, Duration::from_secs(5), || waiting(p) == before + 1.0);
    h
}

/// The waiter goes to whichever worker frees a slot first, not to the one it was picked
/// for; no worker queue holds it meanwhile.
#[test]
fn a_waiter_binds_to_the_first_worker_that_frees_a_slot() {
    let (a, b) = (Held::new("a"), Held::new("b"));
    let p = with_room(2, &[&a, &b], "waiting_room_size = 4");
    let one = spawn_request(p.data_addr, tagged("one", ""));
    let two = spawn_request(p.data_addr, tagged("two", ""));
    eventually("both slots taken", Duration::from_secs(5), || {
        a.up.count() == 1 && b.up.count() == 1
    });
    let late = wait_in_room(&p, "late", 0.0);
    for w in ["w0", "w1"] {
        assert_eq!(
            gauge(&p, &format!("dynamo_request_queue{{worker=\"{w}\"}}")),
            0.0
        );
    }
    // b answers its first request: its slot goes to the waiter.
    b.release(2);
    let late = late.join().unwrap();
    assert_eq!(late.status, 200, "{}", late.text());
    assert_eq!(late.json()["worker"], "b");
    assert_eq!(a.up.count(), 1, "the waiter went to a");
    assert_eq!(waiting(&p), 0.0);
    a.release(1);
    for r in [one, two] {
        assert_eq!(r.join().unwrap().status, 200);
    }
}

/// Waiters get slots in the order they came, whichever core they came on.
#[test]
fn waiters_are_served_in_arrival_order_across_cores() {
    let w = Held::new("w");
    let p = with_room(2, &[&w], "waiting_room_size = 8");
    let first = spawn_request(p.data_addr, tagged("first", ""));
    eventually("slot taken", Duration::from_secs(5), || w.up.count() == 1);
    let waiters: Vec<_> = (0..5)
        .map(|i| wait_in_room(&p, &format!("r{i}"), i as f64))
        .collect();
    w.release(6);
    assert_eq!(first.join().unwrap().status, 200);
    for r in waiters {
        assert_eq!(r.join().unwrap().status, 200);
    }
    let seen: Vec<String> = w.up.seen().iter().map(|s| s.body_str()).collect();
    let order: Vec<_> = (seen.iter())
        .filter_map(|b| {
            ["r0", "r1", "r2", "r3", "r4"]
                .into_iter()
                .find(|t| b.contains(t))
        })
        .collect();
    assert_eq!(order, ["r0", "r1", "r2", "r3", "r4"], "{seen:?}");
}

/// The room's size is exact: one more is refused at once with `queue_full`; a wait past
/// the room's timeout is refused with `queue_timeout`. Neither reaches a worker.
#[test]
fn a_full_room_and_a_long_wait_are_refused() {
    let w = Held::new("w");
    let p = with_room(
        2,
        &[&w],
        "waiting_room_size = 1\nwaiting_room_timeout_ms = 400",
    );
    let first = spawn_request(p.data_addr, tagged("first", ""));
    eventually("slot taken", Duration::from_secs(5), || w.up.count() == 1);
    let started = Instant::now();
    let waiter = wait_in_room(&p, "waiter", 0.0);
    let r = once(p.data_addr, &tagged("extra", ""));
    assert_eq!(r.status, 529, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["knob"].as_str(), v["message"].as_str()),
        (Some("queue_full"), Some(ROOM_FULL)),
        "{v}"
    );
    assert_eq!(v["setting"], "waiting_room_size", "{v}");
    assert_eq!(
        r.header("retry-after"),
        Some("1"),
        "no pace yet: retry_after_secs"
    );
    assert_eq!(
        (v["value"].as_f64(), v["threshold"].as_f64()),
        (Some(1.0), Some(1.0))
    );
    let r = waiter.join().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(390));
    assert_eq!(r.status, 529, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["knob"].as_str(), v["message"].as_str()),
        (Some("queue_timeout"), Some(ROOM_TIMEOUT)),
        "{v}"
    );
    assert_eq!(v["threshold"].as_f64(), Some(400.0), "{v}");
    assert_eq!(v["setting"], "waiting_room_timeout_ms", "{v}");
    assert!(v["value"].as_f64().unwrap() >= 390.0, "{v}");
    let waits = "spillway_waiting_room_wait_seconds_count{model=\"m\",class=\"standard\"}";
    assert_eq!(gauge(&p, waits), 1.0, "the one wait, ended by the timeout");
    let slow =
        "spillway_waiting_room_wait_seconds_bucket{model=\"m\",class=\"standard\",le=\"0.2\"}";
    assert_eq!(gauge(&p, slow), 0.0, "it waited 400 ms");
    for knob in ["queue_full", "queue_timeout"] {
        let series =
            format!("spillway_refusals_total{{model=\"m\",knob=\"{knob}\",class=\"standard\"}}");
        assert_eq!(gauge(&p, &series), 1.0, "{knob}");
    }
    assert_eq!(waiting(&p), 0.0);
    w.release(1);
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(w.up.count(), 1, "a refused request reached the worker");
}

/// A client's stated budget ends its wait in the room (knob `deadline`); a client that
/// leaves frees its place at once, and the next waiter gets the slot.
#[test]
fn a_budget_or_a_client_leaving_ends_a_wait() {
    let w = Held::new("w");
    let p = with_room(1, &[&w], "waiting_room_size = 4");
    let first = spawn_request(p.data_addr, tagged("first", ""));
    eventually("slot taken", Duration::from_secs(5), || w.up.count() == 1);
    let started = Instant::now();
    let r = once(
        p.data_addr,
        &tagged("hurried", "x-stainless-timeout: 0.25\r\n"),
    );
    assert_eq!(r.status, 529, "{}", r.text());
    assert_eq!(r.json()["knob"], "deadline", "{}", r.text());
    assert!(started.elapsed() >= Duration::from_millis(240));
    let mut gone = std::net::TcpStream::connect(p.data_addr).unwrap();
    gone.write_all(&tagged("gone", "")).unwrap();
    eventually("in the room", Duration::from_secs(5), || waiting(&p) == 1.0);
    drop(gone);
    eventually("left the room", Duration::from_secs(5), || {
        waiting(&p) == 0.0
    });
    let next = wait_in_room(&p, "next", 0.0);
    w.release(2);
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(next.join().unwrap().status, 200);
    let seen: Vec<String> = w.up.seen().iter().map(|s| s.body_str()).collect();
    assert!(
        !seen
            .iter()
            .any(|b| b.contains("hurried") || b.contains("gone")),
        "{seen:?}"
    );
}

/// A sheddable request held back by its class's share waits in the room beside a free
/// slot; a standard one that comes is not behind it and takes that slot at once.
#[test]
fn a_more_important_request_is_not_behind_a_less_important_waiter() {
    let w = Held::new("w");
    let p = proxy(
        2,
        &format!(
            "[classes.sheddable]\nslot_share = 0.5\n[[models]]\nname = \"m\"\n\
             waiting_room_size = 4\n[[models.workers]]\nurl = \"{}\"\nname = \"w\"\n\
             engine_request_limit = 2\n",
            w.url()
        ),
    );
    let shed = |tag: &str| tagged(tag, "x-spillway-class: sheddable\r\n");
    let first = spawn_request(p.data_addr, shed("shed-running"));
    eventually("running", Duration::from_secs(5), || w.up.count() == 1);
    let held_back = spawn_request(p.data_addr, shed("shed-waiting"));
    eventually("in the room", Duration::from_secs(5), || waiting(&p) == 1.0);
    let standard = spawn_request(p.data_addr, tagged("standard", ""));
    eventually(
        "standard took the free slot",
        Duration::from_secs(5),
        || w.up.count() == 2,
    );
    assert_eq!(waiting(&p), 1.0, "the sheddable one still waits");
    w.release(3);
    for r in [first, standard, held_back] {
        assert_eq!(r.join().unwrap().status, 200);
    }
    let seen: Vec<String> = w.up.seen().iter().map(|s| s.body_str()).collect();
    assert!(seen[1].contains("\"standard\""), "{seen:?}");
}

/// A full room makes way for a more important request: the youngest sheddable waiter is
/// evicted (knob `evicted`, its own message), the critical one takes its place and the
/// next slot; a request with nobody less important to evict is refused as before.
#[test]
fn a_critical_request_evicts_the_youngest_sheddable_waiter() {
    let w = Held::new("w");
    let p = with_room(2, &[&w], "waiting_room_size = 2");
    let running = spawn_request(p.data_addr, tagged("running", ""));
    eventually("running", Duration::from_secs(5), || w.up.count() == 1);
    let class = |c: &str| format!("x-spillway-class: {c}\r\n");
    let old = spawn_request(p.data_addr, tagged("old", &class("sheddable")));
    eventually("old waits", Duration::from_secs(5), || waiting(&p) == 1.0);
    let young = spawn_request(p.data_addr, tagged("young", &class("sheddable")));
    eventually("young waits", Duration::from_secs(5), || waiting(&p) == 2.0);
    let refused = once(p.data_addr, &tagged("refused", &class("sheddable")));
    assert_eq!(refused.json()["knob"], "queue_full", "{}", refused.text());
    let critical = spawn_request(p.data_addr, tagged("critical", &class("critical")));
    let young = young.join().unwrap();
    assert_eq!(young.status, 529, "{}", young.text());
    assert_eq!(young.json()["knob"], "evicted", "{}", young.text());
    assert_eq!(young.json()["message"], ROOM_EVICTED);
    assert_eq!(young.json()["setting"], "waiting_room_size");
    assert_eq!(young.json()["class"], "sheddable");
    assert!(young.header("retry-after").is_some());
    assert_eq!(waiting(&p), 2.0, "the critical one took its place");
    let evicted = "spillway_refusals_total{model=\"m\",knob=\"evicted\",class=\"sheddable\"}";
    assert_eq!(gauge(&p, evicted), 1.0);
    w.release(1);
    eventually("critical runs", Duration::from_secs(5), || {
        w.up.count() == 2
    });
    w.release(2);
    let critical = critical.join().unwrap();
    assert_eq!(critical.status, 200, "{}", critical.text());
    assert!(w.up.seen()[1].body_str().contains("\"critical\""));
    eventually("old runs", Duration::from_secs(5), || w.up.count() == 3);
    w.release(3);
    for r in [running, old] {
        assert_eq!(r.join().unwrap().status, 200);
    }
}

/// A model of one held worker with one slot, a room of `size`, and tenants named by
/// `x-tenant` (`top`: more top-level keys).
fn with_tenants(w: &Held, size: u32, top: &str) -> ServerHandle {
    proxy(
        2,
        &format!(
            "tenant_header = \"x-tenant\"\n{top}\n[[models]]\nname = \"m\"\nwaiting_room_size = {size}\n\
             [[models.workers]]\nurl = \"{}\"\nname = \"w\"\nengine_request_limit = 1\n",
            w.url()
        ),
    )
}

fn of_tenant(tenant: &str, tag: &str) -> Vec<u8> {
    tagged(tag, &format!("x-tenant: {tenant}\r\n"))
}

/// Tenants take turns in the room: a light tenant's request that comes behind a heavy
/// tenant's backlog is served after at most one of them, not after all.
#[test]
fn tenants_take_turns_in_the_room() {
    let w = Held::new("w");
    let p = with_tenants(&w, 8, "");
    let running = spawn_request(p.data_addr, of_tenant("heavy", "running"));
    eventually("running", Duration::from_secs(5), || w.up.count() == 1);
    let mut sent = vec![running];
    for i in 0..4 {
        let h = spawn_request(p.data_addr, of_tenant("heavy", &format!("heavy{i}")));
        eventually("heavy waits", Duration::from_secs(5), || {
            waiting(&p) == f64::from(i + 1)
        });
        sent.push(h);
    }
    sent.push(wait_in_room_as(&p, "light", "light", 4.0));
    let per_tenant = "spillway_waiting_room_tenant_requests";
    assert_eq!(scrape_family(p.admin_addr, per_tenant).0, 5.0);
    for n in 1..=6 {
        w.release(1);
        eventually("next runs", Duration::from_secs(5), || {
            w.up.count() == (n + 1).min(6)
        });
    }
    for r in sent {
        assert_eq!(r.join().unwrap().status, 200);
    }
    let order: Vec<String> = (w.up.seen().iter())
        .map(|s| s.body_str().split('"').nth(7).unwrap_or("?").to_string())
        .collect();
    let light = order.iter().position(|o| o == "light").unwrap();
    assert!(light <= 2, "light served {light}th: {order:?}");
    let heavy: Vec<_> = order.iter().filter(|o| o.starts_with("heavy")).collect();
    assert_eq!(heavy, ["heavy0", "heavy1", "heavy2", "heavy3"], "{order:?}");
}

/// One tenant's burst cannot fill the room: beyond its share it is refused (knob
/// `tenant_share`), and another tenant still finds a place.
#[test]
fn a_tenant_beyond_its_share_of_the_room_is_refused() {
    let w = Held::new("w");
    let p = with_tenants(&w, 4, "tenant_room_share = 0.5");
    let running = spawn_request(p.data_addr, of_tenant("heavy", "running"));
    eventually("running", Duration::from_secs(5), || w.up.count() == 1);
    let mut sent = vec![running];
    for i in 0..2 {
        let tag = format!("heavy{i}");
        sent.push(wait_in_room_as(&p, "heavy", &tag, f64::from(i)));
    }
    let r = once(p.data_addr, &of_tenant("heavy", "refused"));
    assert_eq!(r.status, 529, "{}", r.text());
    assert_eq!(r.json()["knob"], "tenant_share", "{}", r.text());
    assert_eq!(r.json()["setting"], "tenant_room_share");
    assert_eq!(
        (r.json()["value"].as_f64(), r.json()["threshold"].as_f64()),
        (Some(2.0), Some(2.0))
    );
    assert_eq!(r.json()["message"], ROOM_TENANT_FULL);
    sent.push(wait_in_room_as(&p, "light", "light", 2.0));
    w.release(4);
    for r in sent {
        assert_eq!(r.join().unwrap().status, 200);
    }
}

/// Sends `tag` as `tenant` and waits until it is in the room (`before` were there).
fn wait_in_room_as(
    p: &ServerHandle,
    tenant: &str,
    tag: &str,
    before: f64,
) -> std::thread::JoinHandle<Response> {
    let h = spawn_request(p.data_addr, of_tenant(tenant, tag));
    eventually(tag, Duration::from_secs(5), || waiting(p) == before + 1.0);
    h
}

/// A room refusal's `Retry-After` is the wait the room predicts for a newcomer once its
/// pace is measured (whole seconds, rounded up; `retry_after_secs` before, as
/// `a_full_room_and_a_long_wait_are_refused` sees).
#[test]
fn a_room_refusal_says_when_to_come_back() {
    let slow = upstream(|_| {
        std::thread::sleep(Duration::from_millis(400));
        Reply::Raw(json_response(200, r#"{"ok":true}"#))
    });
    let p = proxy(
        1,
        &format!(
            "[[models]]\nname = \"m\"\nwaiting_room_size = 4\nwaiting_room_timeout_ms = 20000\n\
             [[models.workers]]\nurl = \"{}\"\nname = \"w\"\nengine_request_limit = 1\n",
            slow.url()
        ),
    );
    // Arrivals at 10 a second against 2.5 served: the room stays full.
    let mut sent = Vec::new();
    for i in 0..24 {
        sent.push(spawn_request(p.data_addr, tagged(&format!("r{i}"), "")));
        std::thread::sleep(Duration::from_millis(100));
    }
    // Places freed since the last arrival are taken again, and the probe finds the room
    // full. A slot that frees meanwhile lets the probe in, where its 50 ms budget refuses
    // it at once (knob `deadline`): then again.
    let mut probes = 0;
    let (r, pace) = loop {
        probes += 1;
        for i in 0..3 {
            let fill = tagged(&format!("fill{probes}-{i}"), "");
            sent.push(spawn_request(p.data_addr, fill));
        }
        eventually("a full room", Duration::from_secs(5), || waiting(&p) == 4.0);
        let pace = gauge(&p, "spillway_waiting_room_release_rate{model=\"m\"}");
        let r = once(
            p.data_addr,
            &tagged("probe", "x-stainless-timeout: 0.05\r\n"),
        );
        assert_eq!(r.status, 529, "{}", r.text());
        if r.json()["knob"] == "queue_full" || probes == 5 {
            break (r, pace);
        }
    };
    assert_eq!(r.json()["knob"], "queue_full", "{}", r.text());
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    // A place frees: a request with 50 ms to spare gets in, and its turn is predicted
    // seconds away: refused at once, and counted.
    eventually("a free place", Duration::from_secs(5), || waiting(&p) < 4.0);
    let started = Instant::now();
    let hurried = once(
        p.data_addr,
        &tagged("hurried", "x-stainless-timeout: 0.05\r\n"),
    );
    let took = started.elapsed();
    eprintln!(
        "refused after {took:?}, its turn predicted {}",
        hurried.json()["value"]
    );
    assert_eq!(hurried.json()["knob"], "deadline", "{}", hurried.text());
    // At once, at its predicted turn's figures (a refusal at its budget's end would say
    // about 50 ms); the time taken is printed, not bounded (a busy machine).
    let value = hurried.json()["value"].as_f64().unwrap();
    assert!(value > 400.0, "{}", hurried.text());
    let predicted = "spillway_waiting_room_predicted_refusals_total{model=\"m\"}";
    let counted = gauge(&p, predicted);
    assert_eq!(counted, probes as f64, "probes that got in, and this one");
    eprintln!("pace {pace}/s, retry-after {retry} s");
    // Five places at about 2.5 a second: 2 s, give or take the estimate.
    assert!(
        (2..=4).contains(&retry),
        "retry-after {retry} at pace {pace}"
    );
    for h in sent {
        let s = h.join().unwrap().status;
        assert!(s == 200 || s == 529, "{s}");
    }
}

/// A model of one worker made busy by a pushed load report, with a room (`worker`: more
/// keys of the worker).
fn busy_with_room(w: &Upstream, room: &str, worker: &str) -> ServerHandle {
    proxy(
        2,
        &format!(
            "[[models]]\nname = \"m\"\nactive_decode_blocks_threshold = 0.5\n{room}\n\
             [[models.workers]]\nurl = \"{}\"\nname = \"w\"\nkv_total_blocks = 100\nload_sources = [\"push\"]\n{worker}\n",
            w.url()
        ),
    )
}

fn report(p: &ServerHandle, blocks: u64) {
    let body = format!(r#"{{"worker_id":"w","active_decode_blocks":{blocks}}}"#);
    let r = admin_post(p.admin_addr, "/load", &body);
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Every worker busy by the busy rule: by default the overload answer at once, room or
/// not; with `waiting_room_waits_for_busy` the request waits for one to stop being busy
/// (the monitor nudges the room when it publishes).
#[test]
fn a_waiter_binds_when_a_worker_stops_being_busy() {
    let w = echo_upstream("w");
    let p = busy_with_room(&w, "waiting_room_size = 4", "");
    report(&p, 90);
    let r = once(p.data_addr, &tagged("at-once", ""));
    assert_eq!(r.status, 529, "{}", r.text());
    assert_eq!(r.json()["knob"], "decode_blocks", "{}", r.text());
    let waits = "spillway_waiting_room_entered_total{model=\"m\"}";
    assert_eq!(gauge(&p, waits), 0.0, "it never entered the room");
    let p = busy_with_room(
        &w,
        "waiting_room_size = 4\nwaiting_room_waits_for_busy = true",
        "",
    );
    report(&p, 90);
    let waiter = wait_in_room(&p, "waiter", 0.0);
    assert_eq!(w.count(), 0, "nothing reached the busy worker");
    report(&p, 10);
    let r = waiter.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["worker"], "w");
    assert_eq!(waiting(&p), 0.0);
    let waits = "spillway_waiting_room_wait_seconds_count{model=\"m\",class=\"standard\"}";
    assert_eq!(gauge(&p, waits), 1.0);
}

/// Every worker busy, one with its slots full too: the overload answer at once; the
/// request never waits in the room for a slot at a worker that is busy anyway.
#[test]
fn all_busy_with_a_full_worker_is_answered_at_once() {
    let w = Held::new("w");
    let room = "waiting_room_size = 4\nwaiting_room_timeout_ms = 10000";
    let p = busy_with_room(&w.up, room, "engine_request_limit = 1");
    let running = spawn_request(p.data_addr, tagged("running", ""));
    eventually("running", Duration::from_secs(5), || w.up.count() == 1);
    report(&p, 90);
    let r = once(p.data_addr, &tagged("busy", ""));
    assert_eq!(r.status, 529, "{}", r.text());
    assert_eq!(r.json()["knob"], "decode_blocks", "{}", r.text());
    let entered = "spillway_waiting_room_entered_total{model=\"m\"}";
    assert_eq!(gauge(&p, entered), 0.0, "it never waited");
    w.release(1);
    assert_eq!(running.join().unwrap().status, 200);
}

/// Workers that stay busy past the room's timeout: the answer is theirs (the overload
/// answer with the busy figures), not the room's timeout.
#[test]
fn a_wait_for_busy_workers_ends_with_their_answer() {
    let w = echo_upstream("w");
    let room =
        "waiting_room_size = 4\nwaiting_room_timeout_ms = 300\nwaiting_room_waits_for_busy = true";
    let p = busy_with_room(&w, room, "");
    report(&p, 90);
    let started = Instant::now();
    let r = once(p.data_addr, &tagged("waiter", ""));
    let took = started.elapsed();
    assert_eq!(r.status, 529, "{}", r.text());
    assert_ne!(r.json()["message"], ROOM_TIMEOUT, "{}", r.text());
    assert_eq!(r.json()["knob"], "decode_blocks", "{}", r.text());
    assert!(took >= Duration::from_millis(300), "waited {took:?}");
    assert_eq!(w.count(), 0);
}

/// A rollout: the model's only worker is away (its port closed). With a hold, a request
/// waits for it to come back, trying it again each time its connect backoff ends; without
/// one, 503 at once.
#[test]
fn a_rollout_hold_waits_for_a_worker_to_come_back() {
    let gone = echo_upstream("old");
    let addr = gone.addr;
    drop(gone);
    let worker = format!("[[models.workers]]\nurl = \"http://{addr}\"\nname = \"w\"\n");
    let p = proxy(
        2,
        &format!(
            "[limits]\nworker_down_backoff_ms = 50\nworker_down_backoff_max_ms = 100\n\
             [[models]]\nname = \"m\"\nwaiting_room_size = 4\nrollout_hold_ms = 20000\n{worker}\
             [[models]]\nname = \"nohold\"\nwaiting_room_size = 4\n{worker}"
        ),
    );
    let r = once(
        p.data_addr,
        &post("/v1/chat/completions", r#"{"model":"nohold"}"#),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    let held = wait_in_room(&p, "held", 0.0);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(waiting(&p), 1.0, "still held through several backoffs");
    let Some(back) = upstream_on(addr, |_| {
        Reply::Raw(json_response(200, r#"{"worker":"new"}"#))
    }) else {
        eprintln!("{addr} was taken meanwhile: the worker cannot come back on it");
        return;
    };
    let r = held.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["worker"], "new");
    assert_eq!(back.count(), 1);
    assert_eq!(waiting(&p), 0.0);
}
