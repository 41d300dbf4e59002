//! The official OpenAI Python client (pip package `openai`) against Spillway in front of
//! the mock engines: streaming and non-streaming chat, completions, a 529 surfacing as
//! the client's documented error, and a stream whose worker dies after one event raising
//! an `APIError` (Spillway's last error event), over plain HTTP and over TLS. The checks live in
//! tests/openai_client.py.
//!
//! Python comes from `SPILLWAY_PYTHON` (a venv with `openai`; .ci/run makes one) or
//! `python3`. Without the package the test is skipped, unless `CI` is set, where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use spillway_mock::MockConfig;
use spillway_testkit::{SSE_HEAD, Script, Upstream, chunk, model, proxy, scripted, worker_name};

const MODEL: &str = "Qwen/Qwen3-0.6B";
const BROKEN_MODEL: &str = "broken";

/// A worker whose every stream breaks off (a reset) after one OpenAI chunk.
fn broken_stream_worker() -> Upstream {
    let event = format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\
         \"model\":\"{BROKEN_MODEL}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hel\"}},\
         \"finish_reason\":null}}]}}\n\n"
    );
    scripted(move |_, _| {
        Script::new()
            .write(SSE_HEAD)
            .write(chunk(&event))
            .sleep_ms(20)
            .reset()
    })
}

#[test]
fn official_openai_client_works_through_spillway() {
    run_checks(None);
}

/// The same checks over TLS: Spillway's data listener with a test CA's certificate, the
/// client trusting that CA (`SSL_CERT_FILE`, which httpx reads).
#[test]
fn official_openai_client_works_over_tls() {
    let pki = spillway_testkit::tls::Pki::new(&spillway_testkit::tools::scratch_dir("openai-tls"));
    run_checks(Some(&pki));
}

fn run_checks(tls: Option<&spillway_testkit::tls::Pki>) {
    let Some(python) = spillway_testkit::tools::python_with("openai") else {
        return;
    };
    // Two mock engines behind Spillway, shaped as the demo runs them.
    let engines: Vec<_> = (0..2)
        .map(|seed| {
            spillway_mock::start(MockConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                model: MODEL.to_string(),
                seed,
                ..MockConfig::default()
            })
            .unwrap()
        })
        .collect();
    let urls: Vec<String> = engines.iter().map(|e| e.url()).collect();
    let extra = "router_mode = \"power-of-two\"\nactive_decode_blocks_threshold = 0.85";
    let tls_section = tls.map_or(String::new(), |pki| {
        format!(
            "[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            pki.cert.display(),
            pki.key.display()
        )
    });
    let broken = broken_stream_worker();
    let models = format!(
        "{}{}",
        model(MODEL, extra, &urls),
        model(BROKEN_MODEL, "", &[broken.url()])
    );
    let p = proxy(1, &format!("{tls_section}{models}"));
    let base_url = match tls {
        Some(_) => format!("https://localhost:{}/v1", p.data_addr.port()),
        None => format!("http://{}/v1", p.data_addr),
    };
    let workers: Vec<String> = urls.iter().map(|u| worker_name(u)).collect();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let mut command = Command::new(&python);
    if let Some(pki) = tls {
        command.env("SSL_CERT_FILE", &pki.ca);
    }
    let out = command
        .arg(script)
        .env("BASE_URL", base_url)
        .env("ADMIN_URL", format!("http://{}", p.admin_addr))
        .env("MODEL", MODEL)
        .env("WORKERS", workers.join(","))
        .env("BROKEN_MODEL", BROKEN_MODEL)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openai client checks failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
