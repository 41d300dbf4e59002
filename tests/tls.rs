#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)]
//! TLS on the data listener, against rustls clients trusting a test CA: requests and
//! streams over TLS 1.3 and 1.2, large bodies across many records, plain text on the TLS
//! port, a TLS hello on the plain port, certificates a client must refuse (expired, wrong
//! host) and files Spillway must refuse (garbage), and a certificate reload under load
//! with no failed request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use spillway::config::ConfigError;
use spillway::{Config, Overrides};
use spillway_testkit::tls::Pki;
use spillway_testkit::tools::scratch_dir;
use spillway_testkit::*;

fn tls_section(cert: &std::path::Path, key: &std::path::Path, extra: &str) -> String {
    format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\n{extra}\n",
        cert.display(),
        key.display()
    )
}

/// A proxy whose data listener speaks TLS with `pki`'s certificate, in front of an echo
/// worker.
fn tls_proxy(pki: &Pki, extra: &str) -> (ServerHandle, Upstream) {
    let w = echo_upstream("w");
    let toml = format!(
        "{}{}",
        tls_section(&pki.cert, &pki.key, extra),
        model("m", "", &[w.url()])
    );
    (proxy(1, &toml), w)
}

#[test]
fn requests_and_streams_over_tls() {
    let pki = Pki::new(&scratch_dir("tls"));
    let (p, _w) = tls_proxy(&pki, "");
    let mut c = Client::connect_tls(p.data_addr, pki.client_config(), "localhost").unwrap();
    let (version, alpn) = c.tls_info().unwrap();
    assert_eq!(version, rustls::ProtocolVersion::TLSv1_3);
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    // Kept alive: many requests on one session.
    for _ in 0..50 {
        let r = c.request(&chat("m"));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["worker"], "w");
    }
    // A body over several records (16 KiB each), and the listing.
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(100_000)
    );
    let r = c.request(&post("/v1/chat/completions", &big));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c.request(&get("/v1/models"));
    assert_eq!(r.status, 200);
    assert!(r.text().contains("\"m\""));
    // A closing connection says so: close_notify, then the TCP close.
    let r = c.request(&post_with(
        "/v1/chat/completions",
        "connection: close\r\n",
        r#"{"model":"m"}"#,
    ));
    assert_eq!(r.status, 200);
    c.tls_end().expect("close_notify before the close");
    let m = metrics(p.admin_addr);
    assert!(metric_value(&m, "spillway_tls_handshakes_total").unwrap_or(0.0) >= 1.0);
    assert!(m.contains("spillway_tls_handshake_failures_total 0"), "{m}");
}

#[test]
fn sse_streams_through_tls() {
    let pki = Pki::new(&scratch_dir("tls"));
    let w = upstream(|_| {
        let mut steps = vec![Step::Write(SSE_HEAD.as_bytes().to_vec())];
        for i in 0..20 {
            let event = format!("data: {{\"i\":{i},\"pad\":\"{}\"}}\n\n", "p".repeat(2000));
            steps.push(Step::Write(chunk(&event)));
        }
        steps.push(Step::Write(chunk("data: [DONE]\n\n")));
        steps.push(Step::Write(b"0\r\n\r\n".to_vec()));
        Reply::Steps(steps)
    });
    let toml = format!(
        "{}{}",
        tls_section(&pki.cert, &pki.key, ""),
        model("m", "", &[w.url()])
    );
    let p = proxy(1, &toml);
    let mut c = Client::connect_tls(p.data_addr, pki.client_config(), "localhost").unwrap();
    for _ in 0..3 {
        let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let r = c.request(&post("/v1/chat/completions", body));
        assert_eq!(r.status, 200);
        let text = r.text();
        assert_eq!(text.matches("data: {").count(), 20, "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    }
}

#[test]
fn tls12_clients_are_served() {
    let pki = Pki::new(&scratch_dir("tls"));
    let (p, _w) = tls_proxy(&pki, "");
    let mut roots = rustls::RootCertStore::empty();
    for cert in spillway::tls::material::certificates("ca", &pki.ca).unwrap() {
        roots.add(cert).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS12])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut c = Client::connect_tls(p.data_addr, Arc::new(config), "127.0.0.1").unwrap();
    assert_eq!(c.tls_info().unwrap().0, rustls::ProtocolVersion::TLSv1_2);
    for _ in 0..20 {
        assert_eq!(c.request(&chat("m")).status, 200);
    }
}

#[test]
fn plain_http_on_the_tls_port_gets_a_plain_400() {
    let pki = Pki::new(&scratch_dir("tls"));
    let (p, _w) = tls_proxy(&pki, "");
    let r = once(p.data_addr, &chat("m"));
    assert_eq!(r.status, 400);
    assert!(
        r.text()
            .contains("plain HTTP request was sent to the TLS port"),
        "{}",
        r.text()
    );
    // Counted once the answer is written (just after the client read it).
    eventually(
        "the failed handshake counted",
        Duration::from_secs(10),
        || {
            let m = metrics(p.admin_addr);
            metric_value(&m, "spillway_tls_handshake_failures_total").unwrap_or(0.0) >= 1.0
        },
    );
}

#[test]
fn plain_and_tls_listeners_side_by_side() {
    let pki = Pki::new(&scratch_dir("tls"));
    let (p, _w) = tls_proxy(&pki, "listen = \"127.0.0.1:0\"");
    let tls_addr = p.tls_addr.expect("a TLS listener beside the plain one");
    // Plain on the plain port, TLS on the TLS port.
    assert_eq!(once(p.data_addr, &chat("m")).status, 200);
    let mut c = Client::connect_tls(tls_addr, pki.client_config(), "localhost").unwrap();
    assert_eq!(c.request(&chat("m")).status, 200);
    // A TLS hello on the plain port: the handshake fails at once, nothing hangs.
    let started = std::time::Instant::now();
    let refused = Client::connect_tls(p.data_addr, pki.client_config(), "localhost");
    assert!(
        refused.is_err(),
        "a TLS handshake on the plain port succeeded"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(once(p.data_addr, &chat("m")).status, 200);
}

/// The handshake's error for a client trusting `pki`'s CA against a server with `cert`.
fn client_error(pki: &Pki, cert: &std::path::Path, key: &std::path::Path) -> String {
    let w = echo_upstream("w");
    let toml = format!(
        "{}{}",
        tls_section(cert, key, ""),
        model("m", "", &[w.url()])
    );
    let p = proxy(1, &toml);
    match Client::connect_tls(p.data_addr, pki.client_config(), "localhost") {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn clients_refuse_expired_and_wrong_host_certificates() {
    let pki = Pki::new(&scratch_dir("tls"));
    let (cert, key) = pki.leaf("expired", &["localhost"], true);
    let e = client_error(&pki, &cert, &key);
    assert!(e.contains("expired"), "expired certificate: `{e}`");
    let (cert, key) = pki.leaf("other", &["other.example"], false);
    let e = client_error(&pki, &cert, &key);
    assert!(e.contains("not valid for name"), "wrong host: `{e}`");
}

#[test]
fn garbage_certificates_are_refused_with_the_file_named() {
    let dir = scratch_dir("tls");
    let pki = Pki::new(&dir);
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let missing = dir.join("missing.pem");
    for (cert, key, expect) in [
        (&garbage, &pki.key, "tls.cert"),
        (&pki.cert, &garbage, "tls.key"),
        (&missing, &pki.key, "missing.pem"),
    ] {
        let text = format!("{}{}", test_head(1), tls_section(cert, key, ""));
        let config = Config::parse(&text, &Overrides::default()).unwrap();
        let source = spillway::ConfigSource {
            path: None,
            overrides: Overrides::default(),
        };
        let err = spillway::start(config, source).unwrap_err().to_string();
        assert!(err.contains(expect), "`{err}` should name {expect}");
    }
    // A key without its certificate is a configuration error.
    let text = format!("{}[tls]\nkey = \"{}\"\n", test_head(1), pki.key.display());
    let err = Config::parse(&text, &Overrides::default()).unwrap_err();
    assert!(
        matches!(err, ConfigError::Invalid { ref key, .. } if key == "tls.cert"),
        "{err}"
    );
}

/// The leaf certificate a fresh handshake gets.
fn served_certificate(addr: SocketAddr, pki: &Pki) -> Vec<u8> {
    let mut c = Client::connect_tls(addr, pki.client_config(), "localhost").unwrap();
    assert_eq!(c.request(&chat("m")).status, 200);
    c.peer_certificate().unwrap()
}

#[test]
fn certificates_reload_under_load_without_a_failed_request() {
    let dir = scratch_dir("tls");
    let pki = Pki::new(&dir);
    let (cert_b, key_b) = pki.leaf("b", &["localhost", "127.0.0.1"], false);
    let w = echo_upstream("w");
    let body = |cert: &std::path::Path, key: &std::path::Path| {
        format!(
            "{}{}{}",
            test_head(1),
            tls_section(cert, key, ""),
            model("m", "", &[w.url()])
        )
    };
    let file = ConfigFile::new(&body(&pki.cert, &pki.key));
    let p = proxy_file(&file);
    let addr = p.data_addr;
    let first = served_certificate(addr, &pki);
    // Load: kept-alive sessions and new handshakes, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut old_session = Client::connect_tls(addr, pki.client_config(), "localhost").unwrap();
    let load: Vec<_> = (0..2)
        .map(|fresh| {
            let (stop, ok, failed, config) = (
                stop.clone(),
                ok.clone(),
                failed.clone(),
                pki.client_config(),
            );
            std::thread::spawn(move || {
                let mut c = Client::connect_tls(addr, config.clone(), "localhost").unwrap();
                while !stop.load(Ordering::Relaxed) {
                    if fresh == 1 {
                        c = Client::connect_tls(addr, config.clone(), "localhost").unwrap();
                    }
                    let status = c.request(&chat("m")).status;
                    let n = if status == 200 { &ok } else { &failed };
                    n.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // A bad key is refused; the running certificate stays.
    std::fs::write(dir.join("bad.key.pem"), "garbage").unwrap();
    file.write(&body(&cert_b, &dir.join("bad.key.pem")));
    let r = admin_post(p.admin_addr, "/reload", "");
    assert_ne!(r.status, 200, "a reload with a bad key was accepted");
    assert!(r.text().contains("tls.key"), "{}", r.text());
    assert_eq!(served_certificate(addr, &pki), first);
    // The good one is taken by new handshakes.
    file.write(&body(&cert_b, &key_b));
    let r = admin_post(p.admin_addr, "/reload", "");
    assert_eq!(r.status, 200, "{}", r.text());
    let second = served_certificate(addr, &pki);
    assert_ne!(second, first);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().unwrap();
    }
    // The session opened before the reload goes on with its certificate.
    assert_eq!(old_session.request(&chat("m")).status, 200);
    assert_eq!(old_session.peer_certificate().unwrap(), first);
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert!(
        ok.load(Ordering::Relaxed) > 10,
        "{ok:?} requests under load"
    );
}

#[test]
fn client_certificates_are_required_when_client_ca_is_set() {
    let dir = scratch_dir("tls");
    let pki = Pki::new(&dir);
    let (client_cert, client_key) = pki.leaf("client", &["client.example"], false);
    let extra = format!("client_ca = \"{}\"", pki.ca.display());
    let (p, _w) = tls_proxy(&pki, &extra);
    // A request that closes its connection: served, it ends with close_notify.
    let close = post_with(
        "/v1/chat/completions",
        "connection: close\r\n",
        r#"{"model":"m"}"#,
    );
    // Without a certificate: refused (TLS 1.3 reports it on the first read).
    let without =
        Client::connect_tls(p.data_addr, pki.client_config(), "localhost").and_then(|mut c| {
            c.write_raw(&close)?;
            c.tls_end()
        });
    assert!(without.is_err(), "served a client without a certificate");
    // With one the CA signed: served.
    let chain = spillway::tls::material::certificates("client", &client_cert).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&client_key).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for cert in spillway::tls::material::certificates("ca", &pki.ca).unwrap() {
        roots.add(cert).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    let mut c = Client::connect_tls(p.data_addr, Arc::new(config), "localhost").unwrap();
    assert_eq!(c.request(&chat("m")).status, 200);
    c.write_raw(&close).unwrap();
    c.tls_end().expect("served to the end");
    assert!(String::from_utf8_lossy(c.buffered()).starts_with("HTTP/1.1 200"));
}
