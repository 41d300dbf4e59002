//! The configuration loader on arbitrary text (`Config::parse`, default overrides): it
//! refuses or returns a configuration whose models name existing workers, whose workers
//! have a data-parallel size the monitor can hold, and which renders as TOML.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway::{Config, Overrides};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = Config::parse(text, &Overrides::default()) else {
        return;
    };
    for m in &config.models {
        assert!(!m.workers.is_empty(), "model {} without workers", m.name);
        assert!(m.workers.iter().all(|&w| w < config.workers.len()));
        m.thresholds.validate().expect("validated thresholds");
    }
    for w in &config.workers {
        assert!((1..=1024).contains(&w.dp_size), "dp_size {}", w.dp_size);
        assert!(w.block_size > 0);
    }
    assert!(config.limits.max_header_bytes > 0);
    let _ = config.to_toml();
});
