//! The mock engine's `/metrics`: the vLLM (V1) series a load shedder reads, with vLLM's
//! names, labels and value formatting (Python floats: `3.0`, not `3`).

use std::fmt::Write as _;

use super::sim::{EngineConfig, Load};

/// Renders the exposition text for the current engine state.
pub fn render(out: &mut String, model: &str, cfg: &EngineConfig, load: &Load) {
    let model = escape(model);
    let labels = format!(r#"engine="0",model_name="{model}""#);
    let usage = if cfg.kv_blocks == 0 {
        0.0
    } else {
        load.used_blocks as f64 / cfg.kv_blocks as f64
    };
    let series: [(&str, &str, &str, f64); 6] = [
        (
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            load.running as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            load.waiting as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            usage,
        ),
        (
            "vllm:num_preemptions_total",
            "counter",
            "Cumulative number of preemption from the engine.",
            load.preemptions_total as f64,
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            load.prompt_tokens_total as f64,
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            load.generation_tokens_total as f64,
        ),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{{labels}}} {}", py_float(value));
    }
    let _ = writeln!(
        out,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"False\",engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0",
        cfg.block_size, cfg.kv_blocks
    );
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
    use crate::config::{Config, MetricsFormat, Overrides};
    use crate::monitor::scrape::{ScrapedRank, parse};

    #[test]
    fn spillway_scrape_reads_the_mock() {
        let cfg = EngineConfig {
            kv_blocks: 2048,
            block_size: 16,
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            prefill_tokens_per_s: 20_000.0,
            decode_step_base_ms: 8.0,
            decode_step_per_seq_ms: 0.25,
        };
        let load = Load {
            running: 5,
            waiting: 3,
            used_blocks: 517,
            prefill_tokens: 100,
            prompt_tokens_total: 1000,
            generation_tokens_total: 200,
            preemptions_total: 1,
        };
        let mut text = String::new();
        render(&mut text, "Qwen/\"odd\"", &cfg, &load);
        assert!(text.contains(
            "vllm:num_requests_running{engine=\"0\",model_name=\"Qwen/\\\"odd\\\"\"} 5.0\n"
        ));
        assert!(text.contains("vllm:generation_tokens_total{"));
        let worker = Config::parse(
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            &Overrides::default(),
        )
        .unwrap()
        .workers[0]
            .clone();
        assert_eq!(
            parse(MetricsFormat::Vllm, &text, &worker),
            [ScrapedRank {
                kv_used_blocks: Some(517),
                kv_total_blocks: Some(2048),
                running: Some(5),
                waiting: Some(3),
            }]
        );
    }

    #[test]
    fn floats_print_like_python() {
        assert_eq!(py_float(3.0), "3.0");
        assert_eq!(py_float(0.0), "0.0");
        assert_eq!(py_float(0.25), "0.25");
    }
}
