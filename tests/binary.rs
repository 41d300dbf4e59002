#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! The `spillway` binary: signals (SIGTERM drain, SIGHUP reload, SIGUSR1 dump, SIGUSR2 log reopen, a second
//! stop signal), check-config, and the Dynamo environment variables end to end.

use spillway_testkit::*;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

/// A running `spillway --config`, its stderr collected line by line.
struct Proc {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    data: SocketAddr,
    admin: SocketAddr,
}

impl Proc {
    fn start(file: &ConfigFile, env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.args(["--config", file.path.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn spillway");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    log.lock().unwrap().push(line);
                }
            });
        }
        let mut p = Proc {
            child,
            log,
            data: "0.0.0.0:0".parse().unwrap(),
            admin: "0.0.0.0:0".parse().unwrap(),
        };
        eventually("spillway is serving", Duration::from_secs(20), || {
            p.line("spillway is serving").is_some()
        });
        let line = p.line("spillway is serving").unwrap();
        let field = |k: &str| -> SocketAddr {
            let at = line.find(&format!("{k}=")).unwrap() + k.len() + 1;
            line[at..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        p.data = field("listen");
        p.admin = field("admin");
        p
    }

    fn line(&self, needle: &str) -> Option<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains(needle))
            .cloned()
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sse_worker(events: usize, gap: Duration) -> Upstream {
    upstream(move |_| {
        let mut steps = vec![Step::Write(SSE_HEAD.as_bytes().to_vec())];
        for i in 0..events {
            steps.push(Step::Sleep(gap));
            steps.push(Step::Write(chunk(&format!("data: {{\"token\":{i}}}\n\n"))));
        }
        steps.push(Step::Write(chunk("data: [DONE]\n\n")));
        steps.push(Step::Write(b"0\r\n\r\n".to_vec()));
        Reply::Steps(steps)
    })
}

#[test]
fn sigterm_drains_fifty_streams_then_exits_zero() {
    let up = sse_worker(10, Duration::from_millis(100));
    let file = ConfigFile::new(&format!(
        "{}drain_grace_ms = 300\ndrain_timeout_ms = 20000\n{}",
        test_head(1),
        model("m", "", &[up.url()])
    ));
    let mut p = Proc::start(&file, &[]);
    let streams: Vec<_> = (0..50)
        .map(|_| {
            spawn_request(
                p.data,
                post("/v1/chat/completions", r#"{"model":"m","stream":true}"#),
            )
        })
        .collect();
    eventually("50 streams in flight", Duration::from_secs(10), || {
        up.count() == 50
    });
    p.signal(nix::sys::signal::Signal::SIGTERM);
    eventually("health answers 503", Duration::from_secs(5), || {
        admin_get(p.admin, "/health").status == 503
    });
    assert_eq!(admin_get(p.admin, "/live").status, 503);
    // After the grace, new connections are refused.
    eventually("listener closed", Duration::from_secs(5), || {
        std::net::TcpStream::connect(p.data).is_err()
    });
    for s in streams {
        let r = s.join().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.pieces.len(), 11, "a stream was cut: {}", r.text());
    }
    assert_eq!(p.wait_exit(Duration::from_secs(10)), Some(0));
    assert!(p.line("drained; exiting").is_some());
}

#[test]
fn second_stop_signal_exits_at_once() {
    let up = upstream(|_| Reply::Steps(vec![Step::WaitClose]));
    let file = ConfigFile::new(&format!(
        "{}drain_grace_ms = 100\ndrain_timeout_ms = 60000\n{}",
        test_head(1),
        model("m", "", &[up.url()])
    ));
    let mut p = Proc::start(&file, &[]);
    let mut c = Client::connect(p.data);
    c.send(&chat("m"));
    eventually("request in flight", Duration::from_secs(5), || {
        up.count() == 1
    });
    p.signal(nix::sys::signal::Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        p.wait_exit(Duration::from_millis(100)),
        None,
        "exited without waiting for the request"
    );
    p.signal(nix::sys::signal::Signal::SIGINT);
    assert_eq!(p.wait_exit(Duration::from_secs(5)), Some(1));
}

#[test]
fn sighup_reloads_and_a_broken_file_is_logged_and_counted() {
    let (a, b) = (echo_upstream("a"), echo_upstream("b"));
    let head = test_head(1);
    let file = ConfigFile::new(&format!("{head}{}", model("m", "", &[a.url()])));
    let p = Proc::start(&file, &[]);
    assert_eq!(once(p.data, &chat("m")).text(), r#"{"worker":"a"}"#);
    file.write(&format!("{head}{}", model("m", "", &[b.url()])));
    p.signal(nix::sys::signal::Signal::SIGHUP);
    eventually("reloaded", Duration::from_secs(5), || {
        once(p.data, &chat("m")).text() == r#"{"worker":"b"}"#
    });
    // The new snapshot is stored before the line is logged: wait for it too.
    eventually("reload logged", Duration::from_secs(5), || {
        p.line("configuration reloaded").is_some()
    });
    file.write("listen = 5\n");
    p.signal(nix::sys::signal::Signal::SIGHUP);
    eventually("error logged", Duration::from_secs(5), || {
        p.line("configuration reload failed").is_some()
    });
    let line = p.line("configuration reload failed").unwrap();
    assert!(line.contains("invalid type"), "{line}");
    assert_eq!(
        metric_value(
            &metrics(p.admin),
            "spillway_config_reloads_total{result=\"error\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        once(p.data, &chat("m")).text(),
        r#"{"worker":"b"}"#,
        "the broken file changed something"
    );
}

#[test]
fn sigusr1_logs_the_state_of_every_worker() {
    let up = echo_upstream("a");
    let file = ConfigFile::new(&format!(
        "{}[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"{}\"\nname = \"w1\"\nengine_request_limit = 4\ndp_size = 2\n",
        test_head(1),
        up.url()
    ));
    let p = Proc::start(&file, &[]);
    p.signal(nix::sys::signal::Signal::SIGUSR1);
    eventually("state dumped", Duration::from_secs(5), || {
        p.line("state dump").is_some() && p.line("rank=1").is_some()
    });
    let w = p
        .line(" worker worker=w1")
        .unwrap_or_else(|| p.line("worker=w1").unwrap());
    for field in [
        "slots_in_use=0",
        "slots=Some(4)",
        "queued=0",
        "push=true",
        "tracked=true",
    ] {
        assert!(w.contains(field), "{field} missing in {w}");
    }
}

/// SIGUSR2 reopens the access log (logrotate moved it); SIGUSR1 stays the state dump.
#[test]
fn sigusr2_reopens_the_access_log() {
    let up = echo_upstream("a");
    let dir = spillway_testkit::tools::scratch_dir("bin-log");
    let log = dir.join("access.log");
    let file = ConfigFile::new(&format!(
        "{}[access_log]\npath = \"{}\"\n{}",
        test_head(1),
        log.display(),
        model("m", "", &[up.url()])
    ));
    let p = Proc::start(&file, &[]);
    let lines = |path: &std::path::Path| {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert_eq!(once(p.data, &chat("m")).status, 200);
    eventually("first line", Duration::from_secs(10), || lines(&log) == 1);
    let rotated = dir.join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    p.signal(nix::sys::signal::Signal::SIGUSR2);
    eventually("reopened", Duration::from_secs(10), || {
        p.line("access log reopened").is_some()
    });
    assert_eq!(once(p.data, &chat("m")).status, 200);
    eventually("a line in the new file", Duration::from_secs(10), || {
        lines(&log) == 1
    });
    assert_eq!(lines(&rotated), 1);
    assert!(
        p.line("state dump").is_none(),
        "SIGUSR2 is not the state dump"
    );
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn overload_status_env_var_end_to_end() {
    let up = echo_upstream("a");
    let text = format!(
        "{}[[models]]\nname = \"m\"\nactive_prefill_tokens_threshold = 0\n[[models.workers]]\nurl = \"{}\"\nname = \"w\"\n",
        test_head(1),
        up.url()
    );
    for (env, want) in [("503", 503u16), ("not-a-number", 529)] {
        let file = ConfigFile::new(&text);
        let p = Proc::start(&file, &[("DYN_HTTP_OVERLOAD_STATUS_CODE", env)]);
        assert_eq!(
            admin_post(
                p.admin,
                "/load",
                r#"{"worker_id":"w","active_prefill_tokens":5}"#
            )
            .status,
            200
        );
        let r = once(p.data, &chat("m"));
        assert_eq!(r.status, want, "{env}");
        assert_eq!(r.json()["type"], "Overloaded");
    }
}

#[test]
fn dynamo_flags_and_env_vars_configure_every_model() {
    let up = echo_upstream("a");
    let file = ConfigFile::new(&format!("{}{}", test_head(1), model("m", "", &[up.url()])));
    let out = Command::new(BIN)
        .args([
            "check-config",
            file.path.to_str().unwrap(),
            "--active-decode-blocks-threshold",
            "0.7",
            "--router-mode",
            "least-loaded",
        ])
        .env("DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", "5000")
        .env("DYN_ENGINE_REQUEST_LIMIT", "8")
        .env("DYN_MIGRATION_LIMIT", "1")
        // Dynamo's convention: `None` or empty means unset.
        .env("DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", "None")
        .env("DYN_ROUTER_TRACK_OUTPUT_BLOCKS", "")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let effective: toml::Value = toml::from_str(&text).unwrap();
    let m = &effective["models"][0];
    assert_eq!(
        m["thresholds"]["active_decode_blocks_threshold"].as_float(),
        Some(0.7)
    );
    assert_eq!(
        m["thresholds"]["active_prefill_tokens_threshold"].as_integer(),
        Some(5000)
    );
    assert_eq!(m["router_mode"].as_str(), Some("least-loaded"));
    assert_eq!(
        effective["workers"][0]["engine_request_limit"].as_integer(),
        Some(8)
    );
    assert_eq!(effective["migration_limit"].as_integer(), Some(1));
    assert!(
        m["thresholds"]
            .get("active_prefill_tokens_threshold_frac")
            .is_none()
    );
    assert_eq!(m["track_output_blocks"].as_bool(), Some(false));
    assert!(String::from_utf8_lossy(&out.stderr).contains("configuration OK"));

    // A bad file: non-zero exit, the key and line in the message.
    let bad = ConfigFile::new("[[models]]\nname = \"m\"\nrouter_mode = \"fastest\"\n");
    let out = Command::new(BIN)
        .args(["check-config", bad.path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("models[0].router_mode (line 3)"), "{err}");
}

/// `check-config` refuses a worker URL with credentials (Spillway would drop them), and
/// neither its output nor its message shows the password (issue 26, item 9).
#[test]
fn check_config_refuses_worker_url_credentials_without_showing_them() {
    let file = ConfigFile::new(
        "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://user:s3cr3t@127.0.0.1:8000\"\n",
    );
    let out = Command::new(BIN)
        .args(["check-config", file.path.to_str().unwrap()])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stderr.contains("models[0].workers[0].url (line 4): `http://***@127.0.0.1:8000`: credentials in a worker URL are not supported"),
        "{stderr}"
    );
    assert!(
        !stdout.contains("s3cr3t") && !stderr.contains("s3cr3t"),
        "{stdout}{stderr}"
    );
}

/// Dynamo's `kv` settings, as its deployments carry them, start and route; a value that
/// cannot be used fails with the variable's name.
#[test]
fn dynamo_kv_router_settings_start_and_route() {
    let up = echo_upstream("a");
    let file = ConfigFile::new(&format!("{}{}", test_head(1), model("m", "", &[up.url()])));
    let env = [
        ("DYN_ROUTER_MODE", "kv"),
        ("DYN_ROUTER_TEMPERATURE", "0.0"),
        ("DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT", "1.5"),
        ("DYN_KV_CACHE_BLOCK_SIZE", "32"),
        ("DYN_ROUTER_TTL_SECS", "60"),
        ("DYN_ROUTER_USE_KV_EVENTS", "false"),
    ];
    let out = Command::new(BIN)
        .args(["check-config", file.path.to_str().unwrap()])
        .envs(env)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let effective: toml::Value = toml::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    let m = &effective["models"][0];
    assert_eq!(m["router_mode"].as_str(), Some("kv"));
    assert_eq!(m["kv"]["router_prefill_load_scale"].as_float(), Some(1.5));
    assert_eq!(m["kv"]["kv_cache_block_size"].as_integer(), Some(32));
    let p = Proc::start(&file, &env);
    let r = once(p.data, &chat("m"));
    assert_eq!(r.status, 200, "{}", r.text());

    for (var, value) in [
        ("DYN_ROUTER_MODE", "kv-aware"),
        ("DYN_ROUTER_USE_KV_EVENTS", "true"),
    ] {
        let out = Command::new(BIN)
            .args(["check-config", file.path.to_str().unwrap()])
            .env(var, value)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{var}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("{var}={value}")), "{err}");
    }
}

/// Dynamo's `DYN_TLS_CERT_PATH`/`DYN_TLS_KEY_PATH` make the data listener speak TLS; a
/// SIGHUP reads the files again, and new handshakes get the new certificate.
#[test]
fn dynamo_tls_env_vars_serve_https_and_sighup_reloads_the_certificate() {
    let pki = spillway_testkit::tls::Pki::new(&spillway_testkit::tools::scratch_dir("bin-tls"));
    let w = echo_upstream("w");
    let file = ConfigFile::new(&format!("{}{}", test_head(1), model("m", "", &[w.url()])));
    let (cert, key) = (pki.cert.to_str().unwrap(), pki.key.to_str().unwrap());
    let p = Proc::start(
        &file,
        &[("DYN_TLS_CERT_PATH", cert), ("DYN_TLS_KEY_PATH", key)],
    );
    let fetch = || {
        let mut c = Client::connect_tls(p.data, pki.client_config(), "localhost").unwrap();
        assert_eq!(c.request(&chat("m")).text(), r#"{"worker":"w"}"#);
        c.peer_certificate().unwrap()
    };
    let first = fetch();
    // Same paths, new contents (as a certificate renewal writes them).
    let (new_cert, new_key) = pki.leaf("renewed", &["localhost", "127.0.0.1"], false);
    std::fs::copy(new_cert, &pki.cert).unwrap();
    std::fs::copy(new_key, &pki.key).unwrap();
    p.signal(nix::sys::signal::Signal::SIGHUP);
    eventually(
        "the renewed certificate served",
        Duration::from_secs(10),
        || fetch() != first,
    );
}
