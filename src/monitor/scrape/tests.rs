//! The scrape adapters against each engine family's exposition.
use super::*;
use crate::config::{Config, Overrides};

fn worker(extra: &str) -> WorkerConfig {
    let text = format!(
        "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n{extra}\n"
    );
    Config::parse(&text, &Overrides::default()).unwrap().workers[0].clone()
}

const VLLM: &str = r#"# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.25
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 7.0
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 2.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",kv_cache_size_tokens="32000",num_gpu_blocks="3000",prefix="a\"b,c=d"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="3000",kv_cache_size_tokens="16000"} 1.0
"#;

#[test]
fn vllm() {
    let r = parse(MetricsFormat::Vllm, VLLM, &worker("")).ranks;
    assert_eq!(r.len(), 2);
    assert_eq!(
        r[0],
        ScrapedRank {
            kv_used_blocks: Some(1000),
            kv_total_blocks: Some(2000),
            running: Some(7),
            waiting: Some(2)
        }
    );
    assert_eq!(r[1].kv_used_blocks, Some(250));
    assert_eq!(r[1].running, None);
}

/// vLLM 0.33's `num_gpu_blocks` is the sum over ranks: without a rank's own
/// `kv_cache_size_tokens`, each rank gets its share.
#[test]
fn vllm_blocks_summed_over_ranks_are_shared() {
    let text = "vllm:cache_config_info{engine=\"0\",num_gpu_blocks=\"3000\"} 1\n\
                vllm:cache_config_info{engine=\"1\",num_gpu_blocks=\"3000\"} 1\n";
    let r = parse(MetricsFormat::Vllm, text, &worker("")).ranks;
    assert_eq!(r[0].kv_total_blocks, Some(1500));
    assert_eq!(r[1].kv_total_blocks, Some(1500));
}

/// Each family's expected metrics, and which of them a text lacks.
#[test]
fn missing_metrics_are_named() {
    let full = parse(MetricsFormat::Vllm, VLLM, &worker(""));
    assert_eq!(full.missing, Vec::<&str>::new());
    let legacy = parse(
        MetricsFormat::Vllm,
        "vllm:gpu_cache_usage_perc 0.1\n",
        &worker(""),
    );
    assert_eq!(
        legacy.missing,
        [
            "vllm:cache_config_info",
            "vllm:num_requests_running",
            "vllm:num_requests_waiting"
        ]
    );
    let old_llama = parse(
        MetricsFormat::Llamacpp,
        "llamacpp:kv_cache_usage_ratio 0.5\nllamacpp:requests_processing 1\n",
        &worker(""),
    );
    assert_eq!(old_llama.missing, ["llamacpp:requests_deferred"]);
    assert_eq!(old_llama.ranks[0].kv_used_blocks, None, "no longer read");
    let sglang = parse(MetricsFormat::Sglang, "", &worker(""));
    assert_eq!(sglang.missing.len(), 4);
}

/// SGLang with priority scheduling exports the total without a priority and one
/// series per priority: the total is read.
#[test]
fn sglang_priority_series_are_skipped() {
    let text = "sglang:num_queue_reqs{priority=\"\"} 7\n\
                sglang:num_queue_reqs{priority=\"1\"} 2\n\
                sglang:kv_used_tokens 640\nsglang:max_total_num_tokens 3200\n";
    let r = parse(MetricsFormat::Sglang, text, &worker("block_size = 32")).ranks;
    assert_eq!(r[0].waiting, Some(7));
    assert_eq!(
        (r[0].kv_used_blocks, r[0].kv_total_blocks),
        (Some(20), Some(100))
    );
}

#[test]
fn missing_metrics_are_unknown_not_zero() {
    let r = parse(
        MetricsFormat::Vllm,
        "vllm:num_requests_running 3\n",
        &worker(""),
    )
    .ranks;
    assert_eq!(r[0].kv_used_blocks, None);
    let r = parse(
        MetricsFormat::Llamacpp,
        "llamacpp:requests_processing 1\nllamacpp:requests_deferred 4\n",
        &worker("kv_total_blocks = 100"),
    )
    .ranks;
    assert_eq!(
        r[0],
        ScrapedRank {
            kv_used_blocks: None,
            kv_total_blocks: None,
            running: Some(1),
            waiting: Some(4)
        }
    );
    assert!(
        parse(MetricsFormat::Sglang, "", &worker(""))
            .ranks
            .is_empty()
    );
}

#[test]
fn legacy_vllm_name_and_config_capacity() {
    let r = parse(
        MetricsFormat::Vllm,
        "vllm:gpu_cache_usage_perc{model_name=\"x\"} 0.9\n",
        &worker("kv_total_blocks = 100"),
    )
    .ranks;
    assert_eq!(r[0].kv_used_blocks, Some(90));
    assert_eq!(r[0].kv_total_blocks, None);
}

#[test]
fn sglang() {
    let text = "sglang:token_usage{model_name=\"m\"} 0.75\nsglang:max_total_num_tokens{model_name=\"m\"} 3200\nsglang:num_queue_reqs{model_name=\"m\"} 5\n";
    let r = parse(MetricsFormat::Sglang, text, &worker("block_size = 32")).ranks;
    assert_eq!(
        r[0],
        ScrapedRank {
            kv_used_blocks: Some(75),
            kv_total_blocks: Some(100),
            running: None,
            waiting: Some(5)
        }
    );
}

/// Found by `fuzz/` (target `scrape`): a rank label sized the rank table (a huge one
/// overflowed or exhausted memory); ranks past `MAX_DP_SIZE` are ignored.
#[test]
fn rank_labels_are_bounded() {
    let text = "vllm:num_requests_running{engine=\"18446744073709551615\"} 1\n\
                vllm:num_requests_running{engine=\"4000000000\"} 1\n\
                vllm:num_requests_running{engine=\"1024\"} 1\n\
                vllm:num_requests_running{engine=\"1\"} 2\n";
    let r = parse(MetricsFormat::Vllm, text, &worker("")).ranks;
    assert_eq!(r.len(), 2);
    assert_eq!(r[1].running, Some(2));
    let text = "sglang:num_queue_reqs{dp_rank=\"1023\"} 4\n";
    assert_eq!(
        parse(MetricsFormat::Sglang, text, &worker("")).ranks.len(),
        1024
    );
}

/// Found by `fuzz/` (target `scrape`): a `}` before the `{` sliced backwards.
#[test]
fn brace_before_label_set_is_skipped() {
    for text in [
        "}{",
        "x} y{a=\"1\"\n",
        "}{ 1\nvllm:num_requests_running 3\n",
    ] {
        let r = parse(MetricsFormat::Vllm, text, &worker("")).ranks;
        assert!(r.len() <= 1, "{text:?}");
    }
    let s: Vec<_> = samples("}{ 1\nok 2\n").collect();
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].name, "ok");
}

#[test]
fn llamacpp_props() {
    let body =
        r#"{"default_generation_settings":{"n_ctx":1024},"total_slots":4,"is_sleeping":false}"#;
    assert_eq!(props_slots(body), Some(4));
    for body in [
        "{}",
        r#"{"total_slots":0}"#,
        r#"{"total_slots":"4"}"#,
        "not json",
    ] {
        assert_eq!(props_slots(body), None, "{body}");
    }
}

#[test]
fn label_escapes() {
    let s: Vec<_> = samples("x{a=\"q\\\"uote\",b=\"plain\"} 1\n").collect();
    assert_eq!(s[0].label("a").as_deref(), Some("q\"uote"));
    assert_eq!(s[0].label("b").as_deref(), Some("plain"));
    assert_eq!(s[0].label("c"), None);
}
