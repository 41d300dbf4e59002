#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! DNS lookups against a real dnsmasq (tests/../testkit `Dnsmasq`): A, AAAA, both, a name
//! with no records, SRV with addresses in the additional section, membership changes,
//! a server that never answers, and a truncated reply retried over TCP. Run once plain
//! and once with MONOIO_FORCE_LEGACY_DRIVER=1.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::Message;
use spillway::fleet::dns::{
    DnsError, RecordType, SrvTarget, fqdn, lookup_addrs, lookup_srv, query_bytes,
};
use spillway_testkit::dns::{Dnsmasq, Records};

const TIMEOUT: Duration = Duration::from_secs(5);

fn block_on<T>(f: impl Future<Output = T>) -> T {
    spillway::runtime::build(0).unwrap().block_on(f)
}

fn addrs(server: SocketAddr, name: &str, port: u16) -> Result<Vec<SocketAddr>, DnsError> {
    block_on(lookup_addrs(server, name, port, TIMEOUT))
}

fn sock(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// One raw UDP exchange, to see what dnsmasq itself sends.
fn raw(server: SocketAddr, name: &str, rtype: RecordType) -> Message {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(server).unwrap();
    socket.set_read_timeout(Some(TIMEOUT)).unwrap();
    socket
        .send(&query_bytes(99, &fqdn(name).unwrap(), rtype).unwrap())
        .unwrap();
    let mut buf = [0u8; 4096];
    loop {
        // A blocking call on a thread that ran io_uring can see EINTR (task work).
        match socket.recv(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            got => return Message::from_vec(&buf[..got.unwrap()]).unwrap(),
        }
    }
}

#[test]
fn a_aaaa_and_both() {
    let records = Records::new()
        .host("four.test", &["127.0.0.1"])
        .host("six.test", &["::1"])
        .host("both.test", &["::2", "127.0.0.2", "127.0.0.3"]);
    let Some(dns) = Dnsmasq::start(&records) else {
        return;
    };
    let server = dns.addr();
    assert_eq!(
        addrs(server, "four.test", 8080),
        Ok(vec![sock("127.0.0.1:8080")])
    );
    assert_eq!(
        addrs(server, "six.test", 8080),
        Ok(vec![sock("[::1]:8080")])
    );
    assert_eq!(
        addrs(server, "both.test.", 9),
        Ok(vec![
            sock("127.0.0.2:9"),
            sock("127.0.0.3:9"),
            sock("[::2]:9")
        ])
    );
}

#[test]
fn names_without_addresses() {
    let records = Records::new().host("four.test", &["127.0.0.1"]).srv(
        "_http._tcp.svc.test",
        "four.test",
        8000,
    );
    let Some(dns) = Dnsmasq::start(&records) else {
        return;
    };
    let server = dns.addr();
    // A name of the served domain that dnsmasq does not know at all: NXDOMAIN.
    let msg = raw(server, "nothing.test", RecordType::A);
    assert_eq!(
        msg.metadata.response_code.to_string(),
        "Non-Existent Domain"
    );
    assert_eq!(
        addrs(server, "nothing.test", 80),
        Err(DnsError::NoSuchName {
            name: "nothing.test".into()
        })
    );
    // A name that exists with records of another type only: NOERROR and no address.
    let msg = raw(server, "_http._tcp.svc.test", RecordType::A);
    assert_eq!(msg.metadata.response_code.to_string(), "No Error");
    assert_eq!(addrs(server, "_http._tcp.svc.test", 80), Ok(vec![]));
    // Outside the served domain, with no upstream: dnsmasq refuses.
    let Err(DnsError::Server { rcode, .. }) = addrs(server, "example.com", 80) else {
        panic!("a refused query is a server error");
    };
    assert!(rcode.contains("Refused"), "{rcode}");
}

#[test]
fn srv_targets_with_additional_addresses() {
    let records = Records::new()
        .host("w1.test", &["127.0.0.11", "::11"])
        .host("w2.test", &["127.0.0.12"])
        .srv("_http._tcp.svc.test", "w1.test", 8001)
        .srv("_http._tcp.svc.test", "w2.test", 8002)
        .srv("_http._tcp.svc.test", "gone.test", 8003)
        .srv("_off._tcp.svc.test", ".", 0);
    let Some(dns) = Dnsmasq::start(&records) else {
        return;
    };
    let server = dns.addr();
    let msg = raw(server, "_http._tcp.svc.test", RecordType::SRV);
    assert_eq!(msg.answers.len(), 3, "{msg}");
    assert!(
        msg.additionals
            .iter()
            .any(|r| r.record_type() == RecordType::A),
        "dnsmasq puts the targets' addresses in the additional section: {msg}"
    );
    let target = |host: &str, addr: &str| SrvTarget {
        host: host.into(),
        addr: sock(addr),
    };
    assert_eq!(
        block_on(lookup_srv(server, "_http._tcp.svc.test", TIMEOUT)),
        Ok(vec![
            target("w1.test", "127.0.0.11:8001"),
            target("w1.test", "[::11]:8001"),
            target("w2.test", "127.0.0.12:8002"),
        ])
    );
    assert_eq!(
        block_on(lookup_srv(server, "_off._tcp.svc.test", TIMEOUT)),
        Ok(vec![])
    );
    assert!(matches!(
        block_on(lookup_srv(server, "_nope._tcp.svc.test", TIMEOUT)),
        Err(DnsError::NoSuchName { .. })
    ));
}

#[test]
fn membership_follows_the_hosts_file() {
    let records = Records::new().host("pool.test", &["127.0.0.1", "127.0.0.2"]);
    let Some(mut dns) = Dnsmasq::start(&records) else {
        return;
    };
    let server = dns.addr();
    assert_eq!(
        addrs(server, "pool.test", 80),
        Ok(vec![sock("127.0.0.1:80"), sock("127.0.0.2:80")])
    );
    dns.set_hosts(&[("pool.test", "127.0.0.2"), ("pool.test", "127.0.0.3")]);
    assert_eq!(
        addrs(server, "pool.test", 80),
        Ok(vec![sock("127.0.0.2:80"), sock("127.0.0.3:80")])
    );
    dns.set_hosts(&[("other.test", "127.0.0.9")]);
    assert_eq!(
        addrs(server, "pool.test", 80),
        Err(DnsError::NoSuchName {
            name: "pool.test".into()
        })
    );
}

#[test]
fn silent_server_times_out_after_one_retry() {
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    silent
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let server = silent.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (seen, stop) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            while !stop.load(Ordering::SeqCst) {
                if silent.recv(&mut buf).is_ok() {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };
    let timeout = Duration::from_millis(1000);
    let start = Instant::now();
    let got = block_on(lookup_addrs(server, "a.test", 80, timeout));
    let took = start.elapsed();
    assert_eq!(
        got,
        Err(DnsError::Timeout {
            server,
            timeout_ms: 1000
        })
    );
    assert!(took >= timeout, "gave up early: {took:?}");
    assert!(took < timeout + Duration::from_secs(3), "took {took:?}");
    let srv = block_on(lookup_srv(server, "_x._tcp.test", timeout));
    assert_eq!(
        srv,
        Err(DnsError::Timeout {
            server,
            timeout_ms: 1000
        })
    );
    // A and AAAA, each sent twice (the retry halfway); then SRV twice.
    spillway_testkit::eventually("six queries at the silent server", TIMEOUT, || {
        seen.load(Ordering::SeqCst) >= 6
    });
    stop.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 6);
}

#[test]
fn truncated_answer_is_retried_over_tcp() {
    let ips: Vec<String> = (1..=60).map(|i| format!("10.0.1.{i}")).collect();
    let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
    let records = Records::new().host("big.test", &ips);
    let Some(dns) = Dnsmasq::start(&records) else {
        return;
    };
    let server = dns.addr();
    let msg = raw(server, "big.test", RecordType::A);
    assert!(
        msg.metadata.truncation,
        "60 A records do not fit 512 bytes: {msg}"
    );
    let got = addrs(server, "big.test", 443).unwrap();
    let want: Vec<SocketAddr> = (1..=60).map(|i| sock(&format!("10.0.1.{i}:443"))).collect();
    assert_eq!(got, want);
}
