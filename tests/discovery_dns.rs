//! The `dns` worker source against a real DNS server (dnsmasq, started here): a name's
//! A records with a port become workers, a re-resolution adds and removes them, SRV
//! records bring their own ports, and a DNS outage keeps the last good membership.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::Duration;

use spillway_testkit::dns::{Dnsmasq, Records};
use spillway_testkit::*;

const MODEL: &str = "m";

fn workers(admin: SocketAddr) -> Vec<String> {
    let v = admin_get(admin, "/load").json();
    let mut names: Vec<String> = v["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| w["worker_id"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

fn named(name: &'static str) -> impl Fn(&Seen) -> Reply + Send + Sync + 'static {
    move |_| Reply::Raw(json_response(200, &format!(r#"{{"worker":"{name}"}}"#)))
}

/// Two workers on one port at 127.0.0.2 and 127.0.0.3.
fn pair() -> (Upstream, Upstream) {
    for _ in 0..20 {
        let a = upstream_at("127.0.0.2", named("a"));
        if let Some(b) = upstream_on(
            SocketAddr::new([127, 0, 0, 3].into(), a.addr.port()),
            named("b"),
        ) {
            return (a, b);
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

fn gauge(admin: SocketAddr, name: &str) -> f64 {
    metric_value(
        &metrics(admin),
        &format!("{name}{{model=\"{MODEL}\",source=\"dns\"}}"),
    )
    .unwrap_or(-1.0)
}

#[test]
fn a_records_are_resolved_again_and_survive_an_outage() {
    let (a, b) = pair();
    let port = a.addr.port();
    let Some(mut dns) =
        Dnsmasq::start(&Records::new().host("engines.test", &["127.0.0.2", "127.0.0.3"]))
    else {
        return;
    };
    let p = proxy(
        1,
        &format!(
            "[[models]]\nname = \"{MODEL}\"\n[models.dns]\nname = \"engines.test\"\nport = {port}\nserver = \"{}\"\ninterval_ms = 100\n",
            dns.addr()
        ),
    );
    let both = vec![format!("127.0.0.2:{port}"), format!("127.0.0.3:{port}")];
    eventually("both found", Duration::from_secs(10), || {
        workers(p.admin_addr) == both
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

    // The name loses an address: its worker leaves at the next resolution.
    dns.set_hosts(&[("engines.test", "127.0.0.2")]);
    eventually("b gone", Duration::from_secs(10), || {
        workers(p.admin_addr) == both[..1]
    });
    let before = b.count();
    for _ in 0..6 {
        assert_eq!(once(p.data_addr, &chat(MODEL)).text(), r#"{"worker":"a"}"#);
    }
    assert_eq!(b.count(), before);
    // And gets it back.
    dns.set_hosts(&[("engines.test", "127.0.0.2"), ("engines.test", "127.0.0.3")]);
    eventually("b back", Duration::from_secs(10), || {
        workers(p.admin_addr) == both
    });

    // The server stops answering: the source is down, the last good set serves on.
    let errors = gauge(p.admin_addr, "spillway_discovery_errors_total");
    drop(dns);
    eventually("source down", Duration::from_secs(15), || {
        gauge(p.admin_addr, "spillway_discovery_up") == 0.0
    });
    assert!(gauge(p.admin_addr, "spillway_discovery_errors_total") > errors);
    assert_eq!(workers(p.admin_addr), both);
    for _ in 0..4 {
        assert_eq!(once(p.data_addr, &chat(MODEL)).status, 200);
    }
}

#[test]
fn srv_records_bring_their_ports() {
    let (one, two) = (upstream(named("one")), upstream(named("two")));
    let records = Records::new()
        .host("e1.test", &["127.0.0.1"])
        .host("e2.test", &["127.0.0.1"])
        .srv("_http._tcp.engines.test", "e1.test", one.addr.port())
        .srv("_http._tcp.engines.test", "e2.test", two.addr.port());
    let Some(dns) = Dnsmasq::start(&records) else {
        return;
    };
    let p = proxy(
        1,
        &format!(
            "[[models]]\nname = \"{MODEL}\"\n[models.dns]\nname = \"_http._tcp.engines.test\"\nsrv = true\nserver = \"{}\"\n",
            dns.addr()
        ),
    );
    let want = vec![
        format!("e1.test:{}", one.addr.port()),
        format!("e2.test:{}", two.addr.port()),
    ];
    eventually("both targets found", Duration::from_secs(10), || {
        workers(p.admin_addr) == want
    });
    for _ in 0..6 {
        assert_eq!(once(p.data_addr, &chat(MODEL)).status, 200);
    }
    assert!(one.count() >= 3 && two.count() >= 3);
}

/// A name that stops existing (NXDOMAIN: a Kubernetes headless Service scaled to zero)
/// keeps its workers for `nxdomain_hold_ms`, the source down meanwhile; then its workers
/// leave (requests get 503) and the source is up with none; they come back with the name.
#[test]
fn a_vanished_name_keeps_its_workers_for_the_hold_then_has_none() {
    let (a, _b) = pair();
    let port = a.addr.port();
    let Some(mut dns) = Dnsmasq::start(&Records::new().host("gone.test", &["127.0.0.2"])) else {
        return;
    };
    let p = proxy(
        1,
        &format!(
            "[[models]]\nname = \"{MODEL}\"\n[models.dns]\nname = \"gone.test\"\nport = {port}\nserver = \"{}\"\ninterval_ms = 100\nnxdomain_hold_ms = 3000\n",
            dns.addr()
        ),
    );
    let one = vec![format!("127.0.0.2:{port}")];
    eventually("found", Duration::from_secs(10), || {
        workers(p.admin_addr) == one
    });
    dns.set_hosts(&[]);
    eventually("source down", Duration::from_secs(10), || {
        gauge(p.admin_addr, "spillway_discovery_up") == 0.0
    });
    // Within the hold: the last good set serves.
    assert_eq!(workers(p.admin_addr), one);
    assert_eq!(once(p.data_addr, &chat(MODEL)).status, 200);
    eventually("the hold ends", Duration::from_secs(15), || {
        workers(p.admin_addr).is_empty()
    });
    assert_eq!(gauge(p.admin_addr, "spillway_discovery_up"), 1.0);
    assert_eq!(gauge(p.admin_addr, "spillway_discovery_members"), 0.0);
    assert_eq!(once(p.data_addr, &chat(MODEL)).status, 503);
    dns.set_hosts(&[("gone.test", "127.0.0.2")]);
    eventually("back with the name", Duration::from_secs(10), || {
        workers(p.admin_addr) == one
    });
}
