#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Operations: reload under load (in process), the admin token, and the admin/data split.
//! Signals and draining run the real binary: see tests/binary.rs.

use spillway_testkit::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn config(head: &str, models: &str) -> String {
    format!("{head}{models}")
}

fn worker(url: &str, name: &str) -> String {
    format!("[[models.workers]]\nurl = \"{url}\"\nname = \"{name}\"\n")
}

/// Keeps `clients` keep-alive connections busy; records every request it sends and each
/// failure (a status other than 200, or a client that panicked, e.g. on a closed connection).
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    ok: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// What a [`Load`] saw, once stopped.
struct LoadReport {
    sent: usize,
    ok: usize,
    failures: Vec<String>,
}

impl Load {
    fn start(addr: std::net::SocketAddr, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let ok = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|_| {
                let (stop, sent, ok, failures) =
                    (stop.clone(), sent.clone(), ok.clone(), failures.clone());
                std::thread::spawn(move || {
                    let mut c = Client::connect(addr);
                    while !stop.load(Ordering::SeqCst) {
                        sent.fetch_add(1, Ordering::SeqCst);
                        let r = c.request(&chat("m"));
                        if r.status == 200 {
                            ok.fetch_add(1, Ordering::SeqCst);
                        } else {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("{} {}", r.status, r.text()));
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            sent,
            ok,
            failures,
            threads,
        }
    }

    fn finish(self) -> LoadReport {
        self.stop.store(true, Ordering::SeqCst);
        let mut panics = Vec::new();
        for t in self.threads {
            if let Err(e) = t.join() {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panics.push(format!("a load client panicked: {why}"));
            }
        }
        let mut failures = std::mem::take(&mut *self.failures.lock().unwrap());
        failures.extend(panics);
        LoadReport {
            sent: self.sent.load(Ordering::SeqCst),
            ok: self.ok.load(Ordering::SeqCst),
            failures,
        }
    }
}

#[test]
fn reload_under_load_applies_every_change_and_fails_nothing() {
    let (a, b, c) = (echo_upstream("a"), echo_upstream("b"), echo_upstream("c"));
    let slow = upstream(|_| {
        let mut steps = vec![Step::Write(SSE_HEAD.as_bytes().to_vec())];
        for i in 0..10 {
            steps.push(Step::Write(chunk(&format!("data: {{\"token\":{i}}}\n\n"))));
            steps.push(Step::Sleep(Duration::from_millis(100)));
        }
        steps.push(Step::Write(chunk("data: [DONE]\n\n")));
        steps.push(Step::Write(b"0\r\n\r\n".to_vec()));
        Reply::Steps(steps)
    });
    let head = test_head(2);
    let v1 = config(
        &head,
        &format!(
            "[[models]]\nname = \"m\"\nrouter_mode = \"round-robin\"\n{}{}\
             [[models]]\nname = \"stream\"\n{}\
             [[models]]\nname = \"keep\"\n{}",
            worker(&a.url(), "a"),
            worker(&b.url(), "b"),
            worker(&slow.url(), "slow"),
            worker(&a.url(), "a"),
        ),
    );
    let file = ConfigFile::new(&v1);
    let p = proxy_file(&file);
    // A threshold set through the API on a model whose file thresholds do not change.
    let r = admin_post(
        p.admin_addr,
        "/busy_threshold",
        r#"{"model":"keep","active_prefill_tokens_threshold":777}"#,
    );
    assert_eq!(r.status, 200);

    let load = Load::start(p.data_addr, 4);
    let streams: Vec<_> = (0..3)
        .map(|_| {
            spawn_request(
                p.data_addr,
                post(
                    "/v1/chat/completions",
                    r#"{"model":"stream","stream":true}"#,
                ),
            )
        })
        .collect();
    eventually("streams started", Duration::from_secs(5), || {
        slow.count() == 3
    });
    eventually("load flowing", Duration::from_secs(5), || b.count() > 20);

    // v2: c added, b removed, thresholds and router mode of m changed.
    let v2 = config(
        &head,
        &format!(
            "[[models]]\nname = \"m\"\nrouter_mode = \"random\"\nactive_prefill_tokens_threshold = 100000\n{}{}\
             [[models]]\nname = \"stream\"\n{}\
             [[models]]\nname = \"keep\"\n{}",
            worker(&a.url(), "a"),
            worker(&c.url(), "c"),
            worker(&slow.url(), "slow"),
            worker(&a.url(), "a"),
        ),
    );
    file.write(&v2);
    let r = admin_post(p.admin_addr, "/reload", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["generation"], 2);
    let b_at_reload = b.count();
    eventually(
        "the added worker gets traffic",
        Duration::from_secs(5),
        || c.count() > 20,
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        b.count() <= b_at_reload + 4,
        "the removed worker still gets new requests"
    );

    // A broken file changes nothing; the error is counted.
    file.write("this is [not toml");
    let r = admin_post(p.admin_addr, "/reload", "");
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("TOML parse error"),
        "{}",
        r.text()
    );
    let m = metrics(p.admin_addr);
    assert_eq!(
        metric_value(&m, "spillway_config_reloads_total{result=\"error\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric_value(&m, "spillway_config_reloads_total{result=\"ok\"}"),
        Some(1.0)
    );
    assert_eq!(metric_value(&m, "spillway_config_generation"), Some(2.0));
    // A key that needs a restart is refused, also without effect.
    file.write(&v2.replace("cores = 2", "cores = 1"));
    let r = admin_post(p.admin_addr, "/reload", "");
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("`cores` cannot change")
    );

    std::thread::sleep(Duration::from_millis(200));
    let LoadReport { sent, ok, failures } = load.finish();
    let failed = failures.len();
    assert_eq!(
        failed,
        0,
        "{failed} requests failed across the reloads ({ok} succeeded):\n{}",
        failures.join("\n")
    );
    assert_eq!(
        ok, sent,
        "{ok} of {sent} load requests succeeded across the reloads"
    );
    // The waits above alone need more than 40: b and c each saw over 20.
    assert!(
        ok > 40,
        "only {ok} load requests succeeded: too few to cover the reloads"
    );
    for s in streams {
        let r = s.join().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(
            r.pieces.len(),
            11,
            "a stream in flight was harmed: {}",
            r.text()
        );
    }
    let t = admin_get(p.admin_addr, "/busy_threshold").json();
    let by_model = |name: &str| {
        t["thresholds"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["model"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        by_model("m")["active_prefill_tokens_threshold"],
        100000,
        "the file's new threshold applies"
    );
    assert_eq!(
        by_model("keep")["active_prefill_tokens_threshold"],
        777,
        "an API threshold survives the reload"
    );

    // The file changes keep's thresholds: the file wins.
    file.write(&v2.replace(
        "name = \"keep\"\n",
        "name = \"keep\"\nactive_decode_blocks_threshold = 0.5\n",
    ));
    assert_eq!(admin_post(p.admin_addr, "/reload", "").status, 200);
    let t = admin_get(p.admin_addr, "/busy_threshold").json();
    let keep = t["thresholds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["model"] == "keep")
        .unwrap()
        .clone();
    assert!(keep["active_prefill_tokens_threshold"].is_null());
    assert_eq!(keep["active_decode_blocks_threshold"], 0.5);
}

#[test]
fn router_mode_change_applies_on_reload() {
    let (a, b) = (echo_upstream("a"), echo_upstream("b"));
    let models = format!(
        "[[models]]\nname = \"m\"\n{}{}",
        worker(&a.url(), "a"),
        worker(&b.url(), "b")
    );
    let file = ConfigFile::new(&config(&test_head(1), &models));
    let p = proxy_file(&file);
    assert_eq!(once(p.data_addr, &chat("m")).status, 200);
    file.write(&config(
        &test_head(1),
        &models.replace("name = \"m\"\n", "name = \"m\"\nrouter_mode = \"direct\"\n"),
    ));
    assert_eq!(admin_post(p.admin_addr, "/reload", "").status, 200);
    // Direct mode now: the header is required and pins the worker.
    assert_eq!(once(p.data_addr, &chat("m")).status, 400);
    let body = r#"{"model":"m"}"#;
    let pinned = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: h\r\nx-worker-id: b\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let before = b.count();
    assert_eq!(once(p.data_addr, pinned.as_bytes()).status, 200);
    assert_eq!(b.count(), before + 1);
}

/// Names resolve at start and on reload, on the control thread's blocking pool; one that
/// does not resolve fails the reload, which changes nothing.
#[test]
fn reload_to_an_unresolvable_worker_changes_nothing() {
    let up = echo_upstream("a");
    let file = ConfigFile::new(&format!(
        "{}{}",
        test_head(1),
        model("m", "", &[up.url().replace("127.0.0.1", "localhost")])
    ));
    let p = proxy_file(&file);
    assert_eq!(
        once(p.data_addr, &chat("m")).status,
        200,
        "localhost resolves"
    );
    let unresolvable = "http://no-such-host.invalid:1".to_string();
    file.write(&format!(
        "{}{}",
        test_head(1),
        model("m", "", &[unresolvable])
    ));
    let r = admin_post(p.admin_addr, "/reload", "");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("cannot resolve `no-such-host.invalid`"),
        "{}",
        r.text()
    );
    let m = metrics(p.admin_addr);
    assert_eq!(
        metric_value(&m, "spillway_config_reloads_total{result=\"error\"}"),
        Some(1.0)
    );
    assert_eq!(
        once(p.data_addr, &chat("m")).status,
        200,
        "the old config serves"
    );
}

#[test]
fn reload_without_a_file_is_refused() {
    let up = echo_upstream("a");
    let p = proxy(1, &model("m", "", &[up.url()]));
    let r = admin_post(p.admin_addr, "/reload", "");
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("no file to reload")
    );
}

#[test]
fn admin_token_guards_mutating_endpoints() {
    let up = echo_upstream("a");
    let p = proxy(
        1,
        &format!("admin_token = \"s3cret\"\n{}", model("m", "", &[up.url()])),
    );
    let w = worker_name(&up.url());
    let calls: [(&str, &str, String); 4] = [
        (
            "POST",
            "/busy_threshold",
            r#"{"model":"m","active_decode_blocks_threshold":0.5}"#.to_string(),
        ),
        ("DELETE", "/busy_threshold", r#"{"model":"m"}"#.to_string()),
        (
            "POST",
            "/load",
            format!(r#"{{"worker_id":"{w}","active_decode_blocks":1}}"#),
        ),
        ("POST", "/reload", String::new()),
    ];
    for (method, path, body) in &calls {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Bearer s3cre"),
            Some("s3cret"),
            Some("Basic czNjcmV0"),
        ] {
            let header = auth
                .map(|a| format!("authorization: {a}\r\n"))
                .unwrap_or_default();
            let raw = format!(
                "{method} {path} HTTP/1.1\r\nhost: a\r\n{header}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let r = once(p.admin_addr, raw.as_bytes());
            assert_eq!(r.status, 401, "{method} {path} with {auth:?}");
            assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        }
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nhost: a\r\nauthorization: Bearer s3cret\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let r = once(p.admin_addr, raw.as_bytes());
        assert_ne!(
            r.status,
            401,
            "{method} {path} with the right token: {}",
            r.text()
        );
    }
    // Reads stay open.
    for path in ["/health", "/live", "/metrics", "/busy_threshold", "/load"] {
        assert_eq!(admin_get(p.admin_addr, path).status, 200, "{path}");
    }
}

/// Auth schemes are case-insensitive (RFC 9110 §11.1; issue 26, item 10): any case of
/// `Bearer`, one or more spaces, passes the token check.
#[test]
fn admin_token_scheme_is_case_insensitive() {
    let up = echo_upstream("a");
    let p = proxy(
        1,
        &format!("admin_token = \"s3cret\"\n{}", model("m", "", &[up.url()])),
    );
    let call = |auth: &str| {
        let body = r#"{"model":"m"}"#;
        let raw = format!(
            "DELETE /busy_threshold HTTP/1.1\r\nhost: a\r\nauthorization: {auth}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        once(p.admin_addr, raw.as_bytes())
    };
    for auth in ["BEARER s3cret", "bearer s3cret", "bEaReR   s3cret"] {
        let r = call(auth);
        assert_eq!(r.status, 200, "{auth}: {}", r.text());
    }
    for auth in ["BEARER s3cre", "BEARERs3cret", "BASIC s3cret"] {
        assert_eq!(call(auth).status, 401, "{auth}");
    }
}

#[test]
fn admin_token_from_the_environment_overrides_the_file() {
    let up = echo_upstream("a");
    let overrides = spillway::Overrides {
        admin_token_env: Some("from-env".into()),
        ..Default::default()
    };
    let p = proxy_with(
        1,
        &format!(
            "admin_token = \"from-file\"\n{}",
            model("m", "", &[up.url()])
        ),
        overrides,
    );
    let call = |token: &str| {
        let body = r#"{"model":"m"}"#;
        let raw = format!(
            "POST /busy_threshold HTTP/1.1\r\nhost: a\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        once(p.admin_addr, raw.as_bytes()).status
    };
    assert_eq!(call("from-file"), 401);
    assert_eq!(call("from-env"), 200);
}

#[test]
fn data_listener_never_serves_admin_paths_and_admin_bodies_are_limited() {
    let up = echo_upstream("a");
    let p = proxy(1, &model("m", "", &[up.url()]));
    for path in [
        "/health",
        "/live",
        "/metrics",
        "/busy_threshold",
        "/load",
        "/reload",
    ] {
        assert_eq!(once(p.data_addr, &get(path)).status, 404, "GET {path}");
        assert_eq!(
            once(p.data_addr, &post(path, "{}")).status,
            404,
            "POST {path}"
        );
    }
    let r = once(
        p.admin_addr,
        b"POST /load HTTP/1.1\r\nhost: a\r\ncontent-type: application/json\r\ncontent-length: 100000000\r\n\r\n",
    );
    assert_eq!(r.status, 413);
}
