//! A fleet on loopback, with the real etcd and NATS (started here): 3 nodes (127.0.0.2-4),
//! each with 2 fake engines that register in etcd under leases and a node-edge Spillway
//! that finds them there and publishes their load over NATS as one worker per node; 2
//! front-door Spillways find the node edges in etcd and take their load from NATS.
//! - An engine that dies leaves its node edge's pool within its lease's TTL, and no
//!   client sees an error.
//! - An engine that registers gets requests within a second.
//! - An overloaded node's edge refuses (529) and the front doors move the requests to
//!   other nodes: clients see no refusal.
//! - Load over NATS: both front doors' cores see a node turn busy and idle again, at
//!   nearly the same moment (the skew is printed; its median must stay under one monitor
//!   interval).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use spillway::shed::Class;
use spillway_testkit::etcd::{Etcd, KeepAlive};
use spillway_testkit::nats::Nats;
use spillway_testkit::*;

const MODEL: &str = "fleet-model";
/// The engines' lease TTL.
const TTL_SECS: i64 = 2;

struct Engine {
    upstream: Upstream,
    key: String,
    _lease: KeepAlive,
}

fn engine(etcd: &Etcd, node: usize, name: &str) -> Engine {
    let ip = format!("127.0.0.{}", node + 2);
    let who = name.to_string();
    let upstream = upstream_at(&ip, move |_| {
        Reply::Raw(json_response(200, &format!(r#"{{"worker":"{who}"}}"#)))
    });
    let key = format!("/fleet/engines/node{node}/{name}");
    let lease = etcd.grant_lease(TTL_SECS);
    let value = format!(
        r#"{{"url":"{}","name":"{name}","kv_total_blocks":1000}}"#,
        upstream.url()
    );
    etcd.put(&key, value.as_bytes(), lease);
    Engine {
        upstream,
        key,
        _lease: etcd.keep_alive(lease),
    }
}

fn node_edge(etcd: &Etcd, nats: &Nats, node: usize) -> ServerHandle {
    let toml = format!(
        "listen = \"127.0.0.{ip}:0\"\nadmin_listen = \"127.0.0.1:0\"\ncores = 1\npin_cores = false\n\
         monitor_interval_ms = 20\n\
         [nats]\nurl = \"nats://{nats}\"\npublish = \"fleet.load.node{node}\"\npublish_as = \"node{node}\"\npublish_interval_ms = 20\n\
         [[models]]\nname = \"{MODEL}\"\nactive_prefill_tokens_threshold = 100\n\
         [models.etcd]\nendpoints = [\"{etcd}\"]\nprefix = \"/fleet/engines/node{node}/\"\n\
         [models.discovered]\nload_sources = [\"push\"]\n",
        ip = node + 2,
        nats = nats.addr(),
        etcd = etcd.url(),
    );
    let config = spillway::Config::parse(&toml, &spillway::Overrides::default()).unwrap();
    let source = spillway::ConfigSource {
        path: None,
        overrides: spillway::Overrides::default(),
    };
    spillway::start(config, source).unwrap()
}

fn front_door(etcd: &Etcd, nats: &Nats) -> ServerHandle {
    proxy(
        1,
        &format!(
            "monitor_interval_ms = 20\n\
             [nats]\nurl = \"nats://{nats}\"\nsubscribe = \"fleet.load.>\"\n\
             [[models]]\nname = \"{MODEL}\"\nactive_decode_blocks_threshold = 0.5\n\
             [models.etcd]\nendpoints = [\"{etcd}\"]\nprefix = \"/fleet/edges/\"\n\
             [models.discovered]\nload_sources = [\"push\"]\n",
            nats = nats.addr(),
            etcd = etcd.url(),
        ),
    )
}

/// Workers in the running generation.
fn members(admin: std::net::SocketAddr) -> f64 {
    admin_get(admin, "/load").json()["workers"]
        .as_array()
        .map_or(0, Vec::len) as f64
}

/// Clients sending requests through the front doors until stopped; every answer that is
/// not a 200 is counted.
struct Traffic {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
}

impl Traffic {
    fn start(doors: &[std::net::SocketAddr]) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let threads = doors
            .iter()
            .map(|&addr| {
                let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
                std::thread::spawn(move || {
                    let mut c = Client::connect(addr);
                    while !stop.load(Ordering::SeqCst) {
                        let r = c.request(&chat(MODEL));
                        if r.status == 200 {
                            ok.fetch_add(1, Ordering::SeqCst);
                        } else {
                            eprintln!("client saw {} {}", r.status, r.text());
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                })
            })
            .collect();
        Traffic {
            stop,
            ok,
            failed,
            threads,
        }
    }

    /// Stops the clients: (200s, anything else).
    fn stop(self) -> (usize, usize) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        (
            self.ok.load(Ordering::SeqCst),
            self.failed.load(Ordering::SeqCst),
        )
    }
}

#[test]
fn fleet_on_loopback() {
    let (Some(etcd), Some(nats)) = (Etcd::start(), Nats::start()) else {
        return;
    };
    let mut engines: Vec<Vec<Engine>> = (0..3)
        .map(|n| {
            vec![
                engine(&etcd, n, &format!("n{n}e0")),
                engine(&etcd, n, &format!("n{n}e1")),
            ]
        })
        .collect();
    let edges: Vec<ServerHandle> = (0..3).map(|n| node_edge(&etcd, &nats, n)).collect();
    let edge_lease = etcd.grant_lease(30);
    for (n, e) in edges.iter().enumerate() {
        let value = format!(
            r#"{{"url":"http://{}","name":"node{n}","kv_total_blocks":1000,"dp_size":2}}"#,
            e.data_addr
        );
        etcd.put(
            &format!("/fleet/edges/node{n}"),
            value.as_bytes(),
            edge_lease,
        );
    }
    let _edges_alive = etcd.keep_alive(edge_lease);
    let doors: Vec<ServerHandle> = (0..2).map(|_| front_door(&etcd, &nats)).collect();
    for e in &edges {
        eventually(
            "each node edge finds its 2 engines",
            Duration::from_secs(10),
            || members(e.admin_addr) == 2.0,
        );
    }
    for d in &doors {
        eventually(
            "each front door finds the 3 node edges",
            Duration::from_secs(10),
            || members(d.admin_addr) == 3.0,
        );
    }
    let door_addrs: Vec<_> = doors.iter().map(|d| d.data_addr).collect();

    // Every engine serves.
    for i in 0..60 {
        let r = once(door_addrs[i % 2], &chat(MODEL));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for e in engines.iter().flatten() {
        assert!(e.upstream.count() > 0, "{} got no request", e.key);
    }

    // Kill an engine: its lease lapses, its node edge drops it; no client sees an error.
    let traffic = Traffic::start(&door_addrs);
    let dead = engines[0].remove(0);
    let killed = Instant::now();
    drop(dead);
    eventually(
        "the dead engine leaves its node edge",
        Duration::from_secs(10),
        || members(edges[0].admin_addr) == 1.0,
    );
    let gone = killed.elapsed();
    eprintln!("dead engine left the pool after {gone:?} (lease TTL {TTL_SECS} s)");
    // The last renewal was up to TTL/3 before the kill; etcd revokes expired leases on a
    // 500 ms check.
    assert!(
        gone < Duration::from_millis(TTL_SECS as u64 * 1000 + 1500),
        "{gone:?}"
    );

    // A new engine gets requests within a second of registering.
    let fresh = engine(&etcd, 0, "n0e2");
    let registered = Instant::now();
    eventually(
        "the new engine gets a request",
        Duration::from_secs(5),
        || fresh.upstream.count() > 0,
    );
    let first = registered.elapsed();
    eprintln!("new engine's first request {first:?} after it registered");
    assert!(first < Duration::from_secs(1), "{first:?}");
    engines[0].push(fresh);

    // Node 1's engines report prefill work over the edge's threshold: its edge refuses,
    // the front doors (which shed on decode blocks only) move the requests elsewhere.
    for e in &engines[1] {
        let name = e.key.rsplit('/').next().unwrap();
        let body = format!(r#"{{"worker_id":"{name}","active_prefill_tokens":500}}"#);
        assert_eq!(admin_post(edges[1].admin_addr, "/load", &body).status, 200);
    }
    // Requests picked before the busy set changed may still be on their way: let them land.
    std::thread::sleep(Duration::from_millis(300));
    let before: usize = engines[1].iter().map(|e| e.upstream.count()).sum();
    std::thread::sleep(Duration::from_millis(500));
    let after: usize = engines[1].iter().map(|e| e.upstream.count()).sum();
    assert_eq!(before, after, "an overloaded node got requests");
    let refused = metric_value(
        &metrics(edges[1].admin_addr),
        &format!(
            "dynamo_frontend_model_rejection_total{{model=\"{MODEL}\",endpoint=\"chat_completions\"}}"
        ),
    );
    let (ok, failed) = traffic.stop();
    let migrated: f64 = doors
        .iter()
        .map(|d| {
            let text = metrics(d.admin_addr);
            text.lines()
                .filter(|l| l.starts_with("dynamo_frontend_model_migration_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum();
    eprintln!(
        "traffic: {ok} answered, {failed} failed; node 1 refused {refused:?}, the front doors migrated {migrated}"
    );
    assert_eq!(failed, 0, "a client saw an error");
    assert!(ok > 50, "{ok}");
    assert!(refused.is_some_and(|r| r > 0.0) && migrated > 0.0);

    // Load over NATS: node 2's engines fill their KV caches past the front doors'
    // decode threshold, then drain, ten times; each time both front doors' cores see it
    // (their busy replicas, read directly), and the two see it at nearly the same moment.
    let ids: Vec<u32> = doors.iter().map(|d| member_id(d, "node2")).collect();
    let mut skews = Vec::new();
    for flip in 0..10 {
        let busy = flip % 2 == 0;
        for e in &engines[2] {
            let name = e.key.rsplit('/').next().unwrap();
            let blocks = if busy { 900 } else { 0 };
            let body = format!(r#"{{"worker_id":"{name}","active_decode_blocks":{blocks}}}"#);
            assert_eq!(admin_post(edges[2].admin_addr, "/load", &body).status, 200);
        }
        let start = Instant::now();
        let mut seen = [None, None];
        while seen.iter().any(Option::is_none) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "flip {flip}: {seen:?}"
            );
            for (k, d) in doors.iter().enumerate() {
                if seen[k].is_none()
                    && d.shared.busy[0].load().is_busy(Class::Standard, ids[k]) == busy
                {
                    seen[k] = Some(start.elapsed());
                }
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        let (a, b) = (seen[0].unwrap(), seen[1].unwrap());
        skews.push(a.max(b) - a.min(b));
    }
    skews.sort_unstable();
    eprintln!(
        "front doors' skew on a busy change: median {:?}, max {:?} (monitor interval 20 ms)",
        skews[5], skews[9]
    );
    assert!(skews[5] < Duration::from_millis(20), "{skews:?}");
}

/// The member id of worker `name` in the front door's model.
fn member_id(door: &ServerHandle, name: &str) -> u32 {
    let snap = door.shared.snapshot.load();
    let model = snap.model(MODEL.as_bytes()).unwrap();
    model
        .members
        .iter()
        .find(|m| snap.workers[m.worker as usize].cfg.name == name)
        .unwrap()
        .id
}
