#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)]
//! `https://` workers: a front Spillway speaks TLS to a worker that terminates TLS (here a
//! second Spillway with a TLS listener before an echo worker): requests and streams go
//! through on pooled, kept-alive TLS connections; a certificate the front cannot trust
//! (expired, another host, an unknown CA) marks the worker down, says why in the log and
//! counts in `spillway_upstream_tls_failures_total`.

use std::path::Path;
use std::time::Duration;

use spillway_testkit::tls::Pki;
use spillway_testkit::tools::scratch_dir;
use spillway_testkit::*;

/// A TLS-terminating "worker" (a Spillway) with `cert`, before `worker`.
fn tls_worker(cert: &Path, key: &Path, worker: &Upstream) -> ServerHandle {
    let toml = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\n{}",
        cert.display(),
        key.display(),
        model("m", "", &[worker.url()])
    );
    proxy(1, &toml)
}

/// A front Spillway whose one worker is `https://<addr>`, trusting `ca` when given.
fn front(worker: &ServerHandle, ca: Option<&Path>) -> ServerHandle {
    let ca = ca.map_or(String::new(), |ca| {
        format!("[tls]\nupstream_ca = \"{}\"\n", ca.display())
    });
    let toml = format!(
        "{ca}[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"https://{}\"\nname = \"edge\"\n",
        worker.data_addr
    );
    proxy(1, &toml)
}

#[test]
fn requests_and_streams_over_pooled_tls_connections() {
    let pki = Pki::new(&scratch_dir("tls-up"));
    let echo = echo_upstream("origin");
    let edge = tls_worker(&pki.cert, &pki.key, &echo);
    let p = front(&edge, Some(&pki.ca));
    let mut c = Client::connect(p.data_addr);
    for _ in 0..30 {
        let r = c.request(&chat("m"));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["worker"], "origin");
    }
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "y".repeat(60_000)
    );
    assert_eq!(c.request(&post("/v1/chat/completions", &big)).status, 200);
    // One TLS connection carried them all (kept alive in the pool).
    let m = metrics(p.admin_addr);
    assert_eq!(
        metric_value(&m, "spillway_upstream_connects_total"),
        Some(1.0),
        "{m}"
    );
    let edge_m = metrics(edge.admin_addr);
    assert_eq!(
        metric_value(&edge_m, "spillway_tls_handshakes_total"),
        Some(1.0)
    );
    // Idle long enough for the pool's liveness peek: nothing unread, still reused.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(c.request(&chat("m")).status, 200);
    let m = metrics(p.admin_addr);
    assert_eq!(
        metric_value(&m, "spillway_upstream_connects_total"),
        Some(1.0),
        "{m}"
    );
}

#[test]
fn sse_streams_over_an_https_worker() {
    let pki = Pki::new(&scratch_dir("tls-up"));
    let origin = upstream(|_| {
        let mut steps = vec![Step::Write(SSE_HEAD.as_bytes().to_vec())];
        for i in 0..10 {
            steps.push(Step::Write(chunk(&format!("data: {{\"i\":{i}}}\n\n"))));
        }
        steps.push(Step::Write(chunk("data: [DONE]\n\n")));
        steps.push(Step::Write(b"0\r\n\r\n".to_vec()));
        Reply::Steps(steps)
    });
    let edge = tls_worker(&pki.cert, &pki.key, &origin);
    let p = front(&edge, Some(&pki.ca));
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = once(p.data_addr, &post("/v1/chat/completions", body));
    assert_eq!(r.status, 200);
    assert_eq!(r.text().matches("data: {").count(), 10, "{}", r.text());
}

/// The front's answer and its TLS failure count for a worker presenting `cert`.
fn refused(pki: &Pki, cert: &Path, key: &Path, trust: bool) -> (u16, f64) {
    let echo = echo_upstream("origin");
    let edge = tls_worker(cert, key, &echo);
    let p = front(&edge, trust.then_some(pki.ca.as_path()));
    let status = once(p.data_addr, &chat("m")).status;
    let mut failures = 0.0;
    eventually("the TLS failure counted", Duration::from_secs(10), || {
        let m = metrics(p.admin_addr);
        failures = metric_value(&m, "spillway_upstream_tls_failures_total").unwrap_or(0.0);
        failures >= 1.0
    });
    (status, failures)
}

#[test]
fn untrusted_worker_certificates_mark_the_worker_down() {
    let pki = Pki::new(&scratch_dir("tls-up"));
    let (expired, expired_key) = pki.leaf("expired", &["127.0.0.1"], true);
    let (other, other_key) = pki.leaf("other", &["other.example"], false);
    for (what, cert, key, trust) in [
        ("expired", &expired, &expired_key, true),
        ("another host", &other, &other_key, true),
        ("an unknown CA", &pki.cert, &pki.key, false),
    ] {
        let (status, failures) = refused(&pki, cert, key, trust);
        assert_ne!(
            status, 200,
            "{what}: served through an untrusted certificate"
        );
        assert!(failures >= 1.0, "{what}");
    }
}

#[test]
fn https_workers_are_accepted_and_http_elsewhere_is_kept() {
    let text = format!(
        "{}[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"https://engine.example\"\n",
        test_head(1)
    );
    let c = spillway::Config::parse(&text, &spillway::Overrides::default()).unwrap();
    assert_eq!(c.workers[0].url, "https://engine.example:443");
    assert!(c.workers[0].tls);
    // Scraping an https worker needs a plain metrics_url.
    let text = format!("{text}load_sources = [\"scrape\"]\n");
    let e = spillway::Config::parse(&text, &spillway::Overrides::default()).unwrap_err();
    assert!(e.to_string().contains("metrics_url"), "{e}");
}
