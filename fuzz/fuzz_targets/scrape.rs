//! An engine's `/metrics` text as the monitor's scrape reads it, on arbitrary UTF-8: the
//! samples and their labels, and the per-rank signals for each engine family. A scraped
//! worker names at most as many ranks as a configured one may have.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use spillway::config::{MetricsFormat, WorkerConfig};
use spillway::http::limits::MAX_DP_SIZE;
use spillway::monitor::scrape::{parse, samples};
use spillway::{Config, Overrides};

const WORKER: &str = r#"
[[models]]
name = "m"
[[models.workers]]
url = "http://127.0.0.1:1"
kv_total_blocks = 100
block_size = 16
"#;

fn worker() -> &'static WorkerConfig {
    static CFG: OnceLock<Config> = OnceLock::new();
    let c = CFG.get_or_init(|| Config::parse(WORKER, &Overrides::default()).expect("parses"));
    &c.workers[0]
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for s in samples(text) {
        for key in ["engine", "dp_rank", "num_gpu_blocks", "model_name", "priority"] {
            let _ = s.label(key);
        }
    }
    for format in [
        MetricsFormat::Vllm,
        MetricsFormat::Sglang,
        MetricsFormat::Llamacpp,
    ] {
        let ranks = parse(format, text, worker()).ranks;
        assert!(ranks.len() <= MAX_DP_SIZE as usize, "{} ranks", ranks.len());
    }
});
