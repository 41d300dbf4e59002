//! The `etcd` worker source against a real etcd (started here): keys under the prefix
//! become workers, a deleted or expired key's worker leaves, capacity fields apply, a bad
//! value is skipped, a reload that keeps the source keeps the members, and an etcd outage
//! (or a hung etcd) keeps the last good membership while requests go on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::Duration;

use spillway_testkit::etcd::Etcd;
use spillway_testkit::*;

const MODEL: &str = "m";

fn series(name: &str) -> String {
    format!("{name}{{model=\"{MODEL}\",source=\"etcd\"}}")
}

fn gauge(admin: SocketAddr, name: &str) -> f64 {
    metric_value(&metrics(admin), &series(name)).unwrap_or(-1.0)
}

/// Workers in the running generation.
fn workers(admin: SocketAddr) -> usize {
    admin_get(admin, "/load").json()["workers"]
        .as_array()
        .map_or(0, Vec::len)
}

fn config(etcd: &Etcd, prefix: &str) -> String {
    format!(
        "[[models]]\nname = \"{MODEL}\"\n[models.etcd]\nendpoints = [\"{}\"]\nprefix = \"{prefix}\"\n\
         [models.discovered]\nengine_request_limit = 7\n",
        etcd.url()
    )
}

fn worker_value(u: &Upstream, name: &str, extra: &str) -> Vec<u8> {
    format!(r#"{{"url":"{}","name":"{name}"{extra}}}"#, u.url()).into_bytes()
}

#[test]
fn etcd_members_come_and_go_and_survive_an_outage() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let (a, b) = (echo_upstream("a"), echo_upstream("b"));
    etcd.put("/w/m/a", &worker_value(&a, "a", r#","dp_size":2"#), 0);
    let file = ConfigFile::new(&format!("{}{}", test_head(1), config(&etcd, "/w/m/")));
    let p = proxy_file(&file);
    eventually("a found", Duration::from_secs(10), || {
        workers(p.admin_addr) == 1
    });
    assert_eq!(gauge(p.admin_addr, "spillway_discovery_up"), 1.0);
    assert_eq!(once(p.data_addr, &chat(MODEL)).text(), r#"{"worker":"a"}"#);
    // The template's settings and the value's capacity.
    let load = admin_get(p.admin_addr, "/load").json();
    let w = &load["workers"][0];
    assert_eq!(
        (
            w["worker_id"].as_str(),
            w["slots"].as_u64(),
            w["ranks"].as_array().map(Vec::len)
        ),
        (Some("a"), Some(7), Some(2))
    );

    // A second key joins; a key with a bad value and one outside the prefix do not.
    etcd.put("/w/m/b", &worker_value(&b, "b", ""), 0);
    etcd.put("/w/m/bad", br#"{"url":"ftp://x"}"#, 0);
    etcd.put("/w/other/c", &worker_value(&b, "c", ""), 0);
    eventually("b found", Duration::from_secs(10), || {
        workers(p.admin_addr) == 2
    });
    for _ in 0..10 {
        assert_eq!(once(p.data_addr, &chat(MODEL)).status, 200);
    }
    assert!(
        a.count() >= 5 && b.count() >= 5,
        "{} {}",
        a.count(),
        b.count()
    );

    // A leased key lapses: its worker leaves.
    let lease = etcd.grant_lease(1);
    let c = echo_upstream("c");
    etcd.put("/w/m/c", &worker_value(&c, "c2", ""), lease);
    eventually("c found", Duration::from_secs(10), || {
        workers(p.admin_addr) == 3
    });
    eventually("c expired", Duration::from_secs(10), || {
        workers(p.admin_addr) == 2
    });

    // A reload that keeps the source keeps what it found (no lookup needed).
    let generation = metric_value(&metrics(p.admin_addr), "spillway_config_generation").unwrap();
    assert_eq!(admin_post(p.admin_addr, "/reload", "").status, 200);
    assert_eq!(gauge(p.admin_addr, "spillway_discovery_members"), 2.0);
    let load = admin_get(p.admin_addr, "/load").json();
    assert_eq!(load["workers"].as_array().unwrap().len(), 2);
    assert!(
        metric_value(&metrics(p.admin_addr), "spillway_config_generation").unwrap() > generation
    );

    // Deleting a key removes its worker.
    etcd.delete("/w/m/b");
    eventually("b gone", Duration::from_secs(10), || {
        workers(p.admin_addr) == 1
    });
    let before = b.count();
    for _ in 0..6 {
        assert_eq!(once(p.data_addr, &chat(MODEL)).text(), r#"{"worker":"a"}"#);
    }
    assert_eq!(b.count(), before);

    // etcd goes away: the source is down, the last good set stays and serves.
    etcd.kill();
    eventually("source down", Duration::from_secs(15), || {
        gauge(p.admin_addr, "spillway_discovery_up") == 0.0
    });
    assert!(gauge(p.admin_addr, "spillway_discovery_errors_total") >= 1.0);
    assert_eq!(gauge(p.admin_addr, "spillway_discovery_members"), 1.0);
    for _ in 0..4 {
        assert_eq!(once(p.data_addr, &chat(MODEL)).status, 200);
    }
    if let Some(problems) = promtool_problems(&metrics(p.admin_addr)) {
        assert!(problems.is_empty(), "{problems:?}");
    }
}

/// A hung etcd (stopped: its connections stay open, nothing answers) is noticed by the
/// watch's silence check, the source says it is down, the last good set serves, and the
/// source comes back when etcd does.
#[test]
fn a_hung_etcd_is_noticed_and_its_set_kept() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let a = echo_upstream("a");
    etcd.put("/w/m/a", &worker_value(&a, "a", ""), 0);
    let file = ConfigFile::new(&format!("{}{}", test_head(1), config(&etcd, "/w/m/")));
    let p = proxy_file(&file);
    eventually("a found", Duration::from_secs(10), || {
        workers(p.admin_addr) == 1
    });
    assert_eq!(gauge(p.admin_addr, "spillway_discovery_up"), 1.0);
    let errors = gauge(p.admin_addr, "spillway_discovery_errors_total");
    etcd.pause(true);
    // 5 s of silence, then a check that gets no answer within 5 s.
    eventually("source down", Duration::from_secs(25), || {
        gauge(p.admin_addr, "spillway_discovery_up") == 0.0
    });
    assert!(gauge(p.admin_addr, "spillway_discovery_errors_total") > errors);
    assert_eq!(gauge(p.admin_addr, "spillway_discovery_members"), 1.0);
    assert_eq!(once(p.data_addr, &chat(MODEL)).text(), r#"{"worker":"a"}"#);
    etcd.pause(false);
    eventually("source back", Duration::from_secs(20), || {
        gauge(p.admin_addr, "spillway_discovery_up") == 1.0
    });
    assert_eq!(workers(p.admin_addr), 1);
}

#[test]
fn a_changed_prefix_starts_over() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let (a, b) = (echo_upstream("a"), echo_upstream("b"));
    etcd.put("/one/a", &worker_value(&a, "a", ""), 0);
    etcd.put("/two/b", &worker_value(&b, "b", ""), 0);
    let file = ConfigFile::new(&format!("{}{}", test_head(1), config(&etcd, "/one/")));
    let p = proxy_file(&file);
    eventually("a found", Duration::from_secs(10), || {
        workers(p.admin_addr) == 1
    });
    file.write(&format!("{}{}", test_head(1), config(&etcd, "/two/")));
    assert_eq!(admin_post(p.admin_addr, "/reload", "").status, 200);
    eventually("only b", Duration::from_secs(10), || {
        once(p.data_addr, &chat(MODEL)).text() == r#"{"worker":"b"}"#
    });
    for _ in 0..4 {
        assert_eq!(once(p.data_addr, &chat(MODEL)).text(), r#"{"worker":"b"}"#);
    }
}

/// A value whose URL carries credentials is refused for its worker (issue 26, item 9:
/// Spillway would not send them), and the other keys' workers serve as before.
#[test]
fn a_worker_url_with_credentials_is_left_out() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let (a, b) = (echo_upstream("a"), echo_upstream("b"));
    let with_credentials = a.url().replace("http://", "http://user:s3cr3t@");
    let value = format!(r#"{{"url":"{with_credentials}","name":"a"}}"#);
    // A range read hands keys back in order: once `b` is found, `a` was read.
    etcd.put("/w/m/a", value.as_bytes(), 0);
    etcd.put("/w/m/b", &worker_value(&b, "b", ""), 0);
    let file = ConfigFile::new(&format!("{}{}", test_head(1), config(&etcd, "/w/m/")));
    let p = proxy_file(&file);
    let names = || -> Vec<String> {
        admin_get(p.admin_addr, "/load").json()["workers"]
            .as_array()
            .map_or(vec![], |w| {
                w.iter()
                    .map(|w| w["worker_id"].as_str().unwrap_or("").to_string())
                    .collect()
            })
    };
    eventually("b found", Duration::from_secs(10), || {
        names().contains(&"b".to_string())
    });
    assert_eq!(names(), ["b"]);
    for _ in 0..4 {
        assert_eq!(once(p.data_addr, &chat(MODEL)).text(), r#"{"worker":"b"}"#);
    }
    assert_eq!(a.count(), 0);
}
