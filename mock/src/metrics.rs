//! The mock engine's `/metrics`: the vLLM (V1) series a load shedder reads, with vLLM's
//! names, labels and value formatting (Python floats: `3.0`, not `3`).

use std::fmt::Write as _;

use super::sim::{EngineConfig, Load};
use crate::disagg::{Counts, Protocol, Setup};

/// One series of the exposition: its name, type, help text and how to read its value.
struct Series {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&EngineConfig, &Load) -> f64,
}

/// The per-engine series, in the order vLLM lists them.
const SERIES: [Series; 8] = [
    Series {
        name: "vllm:num_requests_running",
        kind: "gauge",
        help: "Number of requests in model execution batches.",
        value: |_, load| load.running as f64,
    },
    Series {
        name: "vllm:num_requests_waiting",
        kind: "gauge",
        help: "Number of requests waiting to be processed.",
        value: |_, load| load.waiting as f64,
    },
    Series {
        name: "vllm:kv_cache_usage_perc",
        kind: "gauge",
        help: "KV-cache usage. 1 means 100 percent usage.",
        value: kv_cache_usage,
    },
    Series {
        name: "vllm:prefix_cache_queries_total",
        kind: "counter",
        help: "Prefix cache queries, in terms of number of queried tokens.",
        value: |_, load| load.prefix_cache_queries_total as f64,
    },
    Series {
        name: "vllm:prefix_cache_hits_total",
        kind: "counter",
        help: "Prefix cache hits, in terms of number of cached tokens.",
        value: |_, load| load.prefix_cache_hits_total as f64,
    },
    Series {
        name: "vllm:num_preemptions_total",
        kind: "counter",
        help: "Cumulative number of preemption from the engine.",
        value: |_, load| load.preemptions_total as f64,
    },
    Series {
        name: "vllm:prompt_tokens_total",
        kind: "counter",
        help: "Number of prefill tokens processed.",
        value: |_, load| load.prompt_tokens_total as f64,
    },
    Series {
        name: "vllm:generation_tokens_total",
        kind: "counter",
        help: "Number of generation tokens processed.",
        value: |_, load| load.generation_tokens_total as f64,
    },
];

fn kv_cache_usage(cfg: &EngineConfig, load: &Load) -> f64 {
    if cfg.kv_blocks == 0 {
        0.0
    } else {
        load.used_blocks as f64 / cfg.kv_blocks as f64
    }
}

/// Renders the exposition text for the current engine state.
pub fn render(out: &mut String, model: &str, cfg: &EngineConfig, load: &Load) {
    let model = escape(model);
    let labels = format!(r#"engine="0",model_name="{model}""#);
    for Series {
        name,
        kind,
        help,
        value,
    } in &SERIES
    {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{{labels}}} {}", py_float(value(cfg, load)));
    }
    let _ = writeln!(
        out,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"{}\",engine=\"0\",kv_cache_size_tokens=\"{}\",num_gpu_blocks=\"{}\"}} 1.0",
        cfg.block_size,
        if cfg.enable_prefix_caching {
            "True"
        } else {
            "False"
        },
        cfg.kv_blocks * u64::from(cfg.block_size),
        cfg.kv_blocks
    );
}

/// The mock's own series, after vLLM's: its disaggregation role and identity, and the
/// handoffs it has seen (see the crate's "Disaggregation").
pub fn render_disagg(out: &mut String, setup: &Setup, counts: &Counts) {
    let _ = writeln!(
        out,
        "# HELP mock_disagg_info The mock engine's disaggregation role and identity.\n\
         # TYPE mock_disagg_info gauge\n\
         mock_disagg_info{{role=\"{}\",engine_id=\"{}\",bootstrap_port=\"{}\"}} 1.0",
        setup.role,
        escape(&setup.identity.engine_id),
        setup.bootstrap_port
    );
    let _ = writeln!(
        out,
        "# HELP mock_kv_transfers_total Decode side: prompts whose KV was received from a prefill engine (received) or that were prefilled locally because their transfer parameters did not check out (fallback).\n\
         # TYPE mock_kv_transfers_total counter"
    );
    for p in Protocol::ALL {
        for (outcome, n) in [
            ("received", counts.received(p)),
            ("fallback", counts.fallback(p)),
        ] {
            let _ = writeln!(
                out,
                "mock_kv_transfers_total{{protocol=\"{}\",outcome=\"{outcome}\"}} {}",
                p.label(),
                py_float(n as f64)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP mock_remote_prefills_total Prefill side: prefills finished for a decode engine.\n\
         # TYPE mock_remote_prefills_total counter"
    );
    for p in Protocol::ALL {
        let _ = writeln!(
            out,
            "mock_remote_prefills_total{{protocol=\"{}\"}} {}",
            p.label(),
            py_float(counts.prefills(p) as f64)
        );
    }
}

/// A float the way Python's `repr` prints it (the Prometheus client's output).
fn py_float(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e16 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// Label value escaping of the text format: backslash, double quote, newline.
fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_with_vllm_labels_and_python_floats() {
        let cfg = EngineConfig {
            kv_blocks: 2048,
            block_size: 16,
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            prefill_tokens_per_s: 20_000.0,
            decode_step_base_ms: 8.0,
            decode_step_per_seq_ms: 0.25,
            enable_prefix_caching: false,
        };
        let load = Load {
            running: 5,
            waiting: 3,
            used_blocks: 512,
            prefill_tokens: 100,
            prompt_tokens_total: 1000,
            generation_tokens_total: 200,
            preemptions_total: 1,
            prefix_cache_queries_total: 900,
            prefix_cache_hits_total: 640,
        };
        let mut text = String::new();
        render(&mut text, "Qwen/\"odd\"", &cfg, &load);
        let labels = r#"{engine="0",model_name="Qwen/\"odd\""}"#;
        for (series, value) in [
            ("vllm:num_requests_running", "5.0"),
            ("vllm:num_requests_waiting", "3.0"),
            ("vllm:kv_cache_usage_perc", "0.25"),
            ("vllm:prefix_cache_queries_total", "900.0"),
            ("vllm:prefix_cache_hits_total", "640.0"),
            ("vllm:num_preemptions_total", "1.0"),
            ("vllm:prompt_tokens_total", "1000.0"),
            ("vllm:generation_tokens_total", "200.0"),
        ] {
            assert!(
                text.contains(&format!("\n{series}{labels} {value}\n")),
                "{series}:\n{text}"
            );
        }
        assert!(text.starts_with(
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
             # TYPE vllm:num_requests_running gauge\n"
        ));
        assert!(text.contains("# TYPE vllm:num_preemptions_total counter\n"));
        assert!(text.ends_with(
            "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"False\",engine=\"0\",kv_cache_size_tokens=\"32768\",num_gpu_blocks=\"2048\"} 1.0\n"
        ));
        assert_eq!(text.lines().count(), 8 * 3 + 3);
    }

    #[test]
    fn disaggregation_series() {
        use crate::disagg::{Identity, Role};
        let setup = Setup {
            role: Role::Decode,
            identity: Identity::new("127.0.0.1:8000".parse().unwrap(), 0),
            bootstrap_port: 8998,
            block_size: 16,
        };
        let counts = Counts {
            received: [3, 1],
            fallback: [2, 0],
            prefills: [0, 5],
        };
        let mut text = String::new();
        render_disagg(&mut text, &setup, &counts);
        let id = &setup.identity.engine_id;
        assert!(text.starts_with(&format!(
            "# HELP mock_disagg_info The mock engine's disaggregation role and identity.\n\
             # TYPE mock_disagg_info gauge\n\
             mock_disagg_info{{role=\"decode\",engine_id=\"{id}\",bootstrap_port=\"8998\"}} 1.0\n"
        )));
        for line in [
            "# TYPE mock_kv_transfers_total counter",
            r#"mock_kv_transfers_total{protocol="vllm",outcome="received"} 3.0"#,
            r#"mock_kv_transfers_total{protocol="vllm",outcome="fallback"} 2.0"#,
            r#"mock_kv_transfers_total{protocol="sglang",outcome="received"} 1.0"#,
            r#"mock_kv_transfers_total{protocol="sglang",outcome="fallback"} 0.0"#,
            "# TYPE mock_remote_prefills_total counter",
            r#"mock_remote_prefills_total{protocol="vllm"} 0.0"#,
            r#"mock_remote_prefills_total{protocol="sglang"} 5.0"#,
        ] {
            assert!(text.contains(&format!("\n{line}\n")), "{line}:\n{text}");
        }
        assert_eq!(text.lines().count(), 3 + 2 + 4 + 2 + 2);
    }

    #[test]
    fn floats_print_like_python() {
        assert_eq!(py_float(3.0), "3.0");
        assert_eq!(py_float(0.0), "0.0");
        assert_eq!(py_float(0.25), "0.25");
    }
}
