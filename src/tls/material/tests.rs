use std::path::PathBuf;

use super::*;
use crate::config::{DEFAULT_HANDSHAKE_TIMEOUT_MS, TlsConfig, TlsListener};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spillway-material-{}-{name}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

fn listener(cert: PathBuf, key: PathBuf) -> TlsConfig {
    TlsConfig {
        listener: Some(TlsListener {
            listen: None,
            cert,
            key,
            client_ca: None,
            handshake_timeout_ms: DEFAULT_HANDSHAKE_TIMEOUT_MS,
        }),
        upstream_ca: None,
    }
}

#[test]
fn missing_and_garbage_files_name_the_key_and_path() {
    let dir = scratch("bad");
    let garbage = dir.join("garbage.pem");
    let _ = std::fs::write(&garbage, "nothing here\n");
    let missing = dir.join("missing.pem");
    let e = load(&listener(missing.clone(), garbage.clone()))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.starts_with("cannot read tls.cert") && e.contains("missing.pem"),
        "{e}"
    );
    let e = load(&listener(garbage.clone(), garbage.clone()))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("tls.cert") && e.contains("holds no PEM certificate"),
        "{e}"
    );
}

#[test]
fn without_a_listener_only_the_client_side_loads() {
    let m = load(&TlsConfig::default());
    assert!(m.is_ok_and(|m| m.server.is_none() && m.upstream.is_some()));
}
