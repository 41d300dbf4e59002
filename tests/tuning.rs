#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every `*.toml` under `tuning/` is a configuration `spillway` accepts, and the presets say
//! what their comments claim, so CI keeps the operator-facing files valid.

use std::path::{Path, PathBuf};

use spillway::route::RouterMode;
use spillway::{Config, Overrides};

fn tuning_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning")
}

fn toml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            toml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
}

fn load(rel: &str) -> Config {
    let path = tuning_dir().join(rel);
    Config::load(&path, &Overrides::default()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_tuning_toml_parses() {
    let mut files = Vec::new();
    toml_files(&tuning_dir(), &mut files);
    files.sort();
    let rel: Vec<String> = files
        .iter()
        .map(|p| p.strip_prefix(tuning_dir()).unwrap().display().to_string())
        .collect();
    for want in [
        "spillway.toml",
        "docker/spillway.toml",
        "presets/latency-focused.toml",
        "presets/throughput-focused.toml",
    ] {
        assert!(rel.iter().any(|r| r == want), "{want} missing: {rel:?}");
    }
    let failures: Vec<String> = files
        .iter()
        .filter_map(|p| {
            Config::load(p, &Overrides::default())
                .err()
                .map(|e| format!("{}: {e}", p.display()))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Dynamo's presets (decode threshold, prefill threshold) on one node with two workers.
#[test]
fn presets_match_dynamo_guide() {
    for (file, decode, prefill, n, q) in [
        ("presets/latency-focused.toml", 0.70, 5000, 64, 4),
        ("presets/throughput-focused.toml", 0.95, 20000, 256, 64),
    ] {
        let c = load(file);
        assert_eq!(c.models.len(), 1, "{file}");
        let m = &c.models[0];
        assert_eq!(
            m.thresholds.active_decode_blocks_threshold,
            Some(decode),
            "{file}"
        );
        assert_eq!(
            m.thresholds.active_prefill_tokens_threshold,
            Some(prefill),
            "{file}"
        );
        assert_eq!(
            m.thresholds.active_prefill_tokens_threshold_frac, None,
            "{file}"
        );
        assert_eq!(m.router_mode, RouterMode::LeastLoaded, "{file}");
        assert_eq!(m.workers.len(), 2, "{file}");
        assert_eq!(c.workers.len(), 2, "{file}");
        for w in &c.workers {
            assert_eq!(w.engine_request_limit, Some(n), "{file} {}", w.name);
            assert_eq!(w.request_queue_limit, q, "{file} {}", w.name);
            assert!(w.load_sources.scrape && w.load_sources.tracked, "{file}");
        }
        assert_eq!(c.cores, 2, "{file}");
        assert!(
            c.admin_listen
                .literal()
                .is_some_and(|a| a.ip().is_loopback()),
            "{file}: admin API off the network"
        );
    }
}

/// The image's EXPOSE and HEALTHCHECK assume these ports on all interfaces.
#[test]
fn container_config_listens_on_all_interfaces() {
    let c = load("docker/spillway.toml");
    assert_eq!(c.listen, "0.0.0.0:8000".parse().unwrap());
    assert_eq!(c.admin_listen, "0.0.0.0:9090".parse().unwrap());
}
