//! The official OpenAI Python client (pip package `openai`) against Spillway in front of
//! the mock engines: streaming and non-streaming chat, completions, and a 529 surfacing as
//! the client's documented error. The checks live in tests/openai_client.py.
//!
//! Python comes from `SPILLWAY_PYTHON` (a venv with `openai`; .ci/run makes one) or
//! `python3`. Without the package the test is skipped, unless `SPILLWAY_REQUIRE_OPENAI` is
//! set (as in CI), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

#[test]
fn official_openai_client_works_through_spillway() {
    let python = std::env::var("SPILLWAY_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_client = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_client {
        assert!(
            std::env::var_os("SPILLWAY_REQUIRE_OPENAI").is_none(),
            "the openai package is required but `{python} -c 'import openai'` fails"
        );
        eprintln!("skipping: no `openai` package for {python}");
        return;
    }
    let demo = spillway::demo::start("127.0.0.1:0", "127.0.0.1:0", spillway::Overrides::default())
        .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let out = Command::new(&python)
        .arg(script)
        .env("BASE_URL", format!("http://{}/v1", demo.server.data_addr))
        .env("ADMIN_URL", format!("http://{}", demo.server.admin_addr))
        .env("MODEL", spillway::demo::MODEL)
        .env("WORKERS", "engine-0,engine-1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openai client checks failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
