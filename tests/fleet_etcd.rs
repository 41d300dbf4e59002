#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)]
//! The etcd client against a real etcd: a prefix read with its revision, a watch that
//! sees puts, updates, deletes and lease expiry, a compacted start revision, etcd dying
//! mid-watch (or a watch's `next()` cancelled), and the failures that need no etcd
//! (nothing listening, no answer).

use std::collections::VecDeque;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use spillway::fleet::etcd::{EtcdError, Event, Kv, Watch, range_prefix};
use spillway_testkit::etcd::{Etcd, b64};

const T: Duration = Duration::from_secs(10);
const HOST: &str = "etcd.test";

fn block_on<F: Future>(f: F) -> F::Output {
    spillway::runtime::build(0).unwrap().block_on(f)
}

/// Events one at a time, whatever batches the watch returns them in.
struct Events {
    watch: Watch,
    queue: VecDeque<Event>,
}

impl Events {
    /// The next event; panics after 10 s without one.
    async fn expect(&mut self) -> Event {
        while self.queue.is_empty() {
            let batch = monoio::time::timeout(T, self.watch.next()).await;
            self.queue
                .extend(batch.expect("no watch event within 10 s").unwrap());
        }
        self.queue.pop_front().unwrap()
    }
}

fn put_of(event: Event) -> Kv {
    match event {
        Event::Put(kv) => kv,
        other => panic!("expected a put, got {other:?}"),
    }
}

fn deleted_key(event: Event) -> String {
    match event {
        Event::Delete { key, .. } => key,
        other => panic!("expected a delete, got {other:?}"),
    }
}

#[test]
fn range_reads_exactly_the_prefix() {
    let Some(etcd) = Etcd::start() else { return };
    block_on(async {
        let (first, kvs) = range_prefix(etcd.addr(), HOST, "/workers/", T)
            .await
            .unwrap();
        assert!(kvs.is_empty() && first >= 1, "{first} {kvs:?}");
        let lease = etcd.grant_lease(60);
        etcd.put("/workers/b", b"http://10.0.0.2:8000", lease);
        etcd.put("/workers/a", b"http://10.0.0.1:8000", 0);
        etcd.put("/workers/c", b"", 0);
        let last = etcd.put("/workersX", b"outside", 0);
        let (revision, kvs) = range_prefix(etcd.addr(), HOST, "/workers/", T)
            .await
            .unwrap();
        assert_eq!(revision, last);
        let seen: Vec<(&str, &[u8], i64)> = kvs
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_slice(), kv.lease))
            .collect();
        assert_eq!(
            seen,
            [
                ("/workers/a", &b"http://10.0.0.1:8000"[..], 0),
                ("/workers/b", &b"http://10.0.0.2:8000"[..], lease),
                ("/workers/c", &b""[..], 0),
            ]
        );
        assert!(
            kvs.iter()
                .all(|kv| kv.mod_revision > first && kv.mod_revision < last)
        );
        // The empty prefix reads every key.
        let (_, all) = range_prefix(etcd.addr(), "", "", T).await.unwrap();
        assert_eq!(all.len(), 4);
    });
}

#[test]
fn range_reads_a_large_prefix() {
    let Some(etcd) = Etcd::start() else { return };
    // 4,096 workers with 200-byte values, written 128 to a transaction (etcd's limit).
    let value = "v".repeat(200);
    for batch in 0..32 {
        let puts: Vec<serde_json::Value> = (0..128)
            .map(|i| {
                let key = format!("/big/worker-{:05}", batch * 128 + i);
                serde_json::json!({"request_put": {"key": b64(key.as_bytes()), "value": b64(value.as_bytes())}})
            })
            .collect();
        etcd.call("/v3/kv/txn", &serde_json::json!({"success": puts}));
    }
    block_on(async {
        let (_, kvs) = range_prefix(etcd.addr(), HOST, "/big/", T).await.unwrap();
        assert_eq!(kvs.len(), 4096);
        assert!(kvs.iter().all(|kv| kv.value == value.as_bytes()));
        assert_eq!(kvs[4095].key, "/big/worker-04095");
    });
}

#[test]
fn watch_sees_puts_updates_deletes_and_expiry() {
    let Some(etcd) = Etcd::start() else { return };
    block_on(async {
        etcd.put("/w/old", b"before", 0);
        let (revision, _) = range_prefix(etcd.addr(), HOST, "/w/", T).await.unwrap();
        let watch = Watch::start(etcd.addr(), HOST, "/w/", revision + 1, T)
            .await
            .unwrap();
        let mut events = Events {
            watch,
            queue: VecDeque::new(),
        };
        etcd.put("/elsewhere", b"x", 0);
        let rev = etcd.put("/w/a", b"one", 0);
        let kv = put_of(events.expect().await);
        assert_eq!(
            (kv.key.as_str(), &kv.value[..], kv.mod_revision),
            ("/w/a", &b"one"[..], rev)
        );
        etcd.put("/w/a", b"two", 0);
        assert_eq!(put_of(events.expect().await).value, b"two");
        let rev = etcd.delete("/w/a");
        assert_eq!(
            events.expect().await,
            Event::Delete {
                key: "/w/a".into(),
                mod_revision: rev
            }
        );

        // A lease nobody renews: its key goes after the TTL.
        let lease = etcd.grant_lease(2);
        etcd.put("/w/leased", b"x", lease);
        let put_at = Instant::now();
        assert_eq!(put_of(events.expect().await).lease, lease);
        assert_eq!(deleted_key(events.expect().await), "/w/leased");
        let after = put_at.elapsed();
        assert!(
            after >= Duration::from_millis(1500) && after < Duration::from_secs(9),
            "{after:?}"
        );

        // A kept lease outlives its TTL; dropping the keeper lets it expire.
        let lease = etcd.grant_lease(2);
        etcd.put("/w/kept", b"x", lease);
        let keeper = etcd.keep_alive(lease);
        assert_eq!(put_of(events.expect().await).key, "/w/kept");
        monoio::time::sleep(Duration::from_secs(4)).await;
        let (_, kvs) = range_prefix(etcd.addr(), HOST, "/w/", T).await.unwrap();
        assert!(kvs.iter().any(|kv| kv.key == "/w/kept"), "{kvs:?}");
        drop(keeper);
        assert_eq!(deleted_key(events.expect().await), "/w/kept");
    });
}

#[test]
fn a_compacted_start_revision_is_reported() {
    let Some(etcd) = Etcd::start() else { return };
    block_on(async {
        for i in 0..5 {
            etcd.put("/c/k", format!("{i}").as_bytes(), 0);
        }
        let last = etcd.put("/c/k", b"last", 0);
        etcd.compact(last);
        let error = match Watch::start(etcd.addr(), HOST, "/c/", 2, T).await {
            Err(e) => e,
            Ok(mut watch) => monoio::time::timeout(T, watch.next())
                .await
                .unwrap()
                .unwrap_err(),
        };
        assert_eq!(error, EtcdError::Compacted(last));
        // From the compaction on, the watch is fine.
        let mut watch = Watch::start(etcd.addr(), HOST, "/c/", last, T)
            .await
            .unwrap();
        let batch = monoio::time::timeout(T, watch.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(put_of(batch[0].clone()).value, b"last");
    });
}

#[test]
fn etcd_dying_ends_the_watch() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    block_on(async {
        // A next() dropped mid-wait ends its watch: later calls say so at once.
        let mut cut = Watch::start(etcd.addr(), HOST, "/d/", 0, T).await.unwrap();
        let short = Duration::from_millis(100);
        assert!(monoio::time::timeout(short, cut.next()).await.is_err());
        let error = monoio::time::timeout(T, cut.next())
            .await
            .unwrap()
            .unwrap_err();
        assert!(error.to_string().contains("cancelled"), "{error}");

        let mut watch = Watch::start(etcd.addr(), HOST, "/d/", 0, T).await.unwrap();
        etcd.put("/d/a", b"x", 0);
        assert_eq!(watch.next().await.unwrap().len(), 1);
        etcd.kill();
        let started = Instant::now();
        let result = monoio::time::timeout(T, watch.next()).await;
        let error = result
            .expect("next() still waiting 10 s after etcd died")
            .unwrap_err();
        assert!(matches!(error, EtcdError::Io { .. }), "{error:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    });
}

fn unused_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[test]
fn nothing_listening_and_no_answer_are_errors() {
    block_on(async {
        let dead = unused_addr();
        let error = range_prefix(dead, HOST, "/w/", T).await.unwrap_err();
        assert!(matches!(error, EtcdError::Io { .. }), "{error:?}");
        // Accepts (the backlog does) but never answers: the timeout ends both calls.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let short = Duration::from_millis(300);
        let started = Instant::now();
        let error = range_prefix(addr, HOST, "/w/", short).await.unwrap_err();
        assert!(
            error.to_string().contains("no answer within 300 ms"),
            "{error}"
        );
        let error = Watch::start(addr, HOST, "/w/", 1, short).await.unwrap_err();
        assert!(
            error.to_string().contains("no answer within 300 ms"),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(silent);
    });
}
