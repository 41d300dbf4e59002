//! The scrape source: engine `/metrics` text mapped to load signals, per engine family.
//! Parsing is pure; [`fetch`] does the HTTP GET on the monitor's runtime. A metric the
//! engine does not export stays unknown; it is never read as zero.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::Duration;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};

use crate::config::{MetricsFormat, WorkerConfig};
use crate::http::BodyFraming;
use crate::http::chunked::Dechunker;
use crate::http::limits::{
    MAX_DP_SIZE, MAX_METRICS_BODY, MAX_METRICS_HEAD, METRICS_READ_BUF, RESPONSE_READ_MIN_SPARE,
};
use crate::http::response::{ResponseHead, parse_response};

/// One sample of the text exposition format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    labels: &'a str,
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// A label's value, unescaped.
    pub fn label(&self, key: &str) -> Option<Cow<'a, str>> {
        let mut rest = self.labels;
        loop {
            rest = rest.trim_start_matches([',', ' ']);
            let eq = rest.find('=')?;
            let k = rest[..eq].trim();
            let after = rest[eq + 1..].trim_start().strip_prefix('"')?;
            // Find the closing quote, honouring backslash escapes.
            let bytes = after.as_bytes();
            let mut i = 0;
            let mut escaped = false;
            while i < bytes.len() && bytes[i] != b'"' {
                escaped |= bytes[i] == b'\\';
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            let raw = after.get(..i)?;
            if k == key {
                return Some(if escaped {
                    Cow::Owned(
                        raw.replace("\\\"", "\"")
                            .replace("\\n", "\n")
                            .replace("\\\\", "\\"),
                    )
                } else {
                    Cow::Borrowed(raw)
                });
            }
            rest = after.get(i + 1..)?;
        }
    }
}

/// Samples of a text exposition; comments and malformed lines are skipped.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                // No `}` after the `{` (`}{ 1`): malformed, skipped.
                let close = line.rfind('}').filter(|&c| c > open)?;
                (&line[..open], &line[open + 1..close], &line[close + 1..])
            }
            None => {
                let sp = line.find([' ', '\t'])?;
                (&line[..sp], "", &line[sp..])
            }
        };
        let value = rest.split_whitespace().next()?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().ok()?,
        };
        Some(Sample {
            name: name.trim(),
            labels,
            value,
        })
    })
}

/// What one scrape says about one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScrapedRank {
    pub kv_used_blocks: Option<u64>,
    pub kv_total_blocks: Option<u64>,
    pub running: Option<u64>,
    pub waiting: Option<u64>,
}

#[derive(Debug, Default)]
struct Raw {
    usage: Option<f64>,
    legacy_usage: Option<f64>,
    total_blocks: Option<u64>,
    total_tokens: Option<u64>,
    running: Option<u64>,
    waiting: Option<u64>,
}

/// A sample's rank: its `label`, 0 when absent or not a number; `None` beyond any
/// configurable data-parallel size (a bogus label must not size the rank table).
fn rank_of(s: &Sample<'_>, label: Option<&str>) -> Option<usize> {
    let rank = label
        .and_then(|l| s.label(l))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (rank < MAX_DP_SIZE as usize).then_some(rank)
}

fn count(v: f64) -> Option<u64> {
    (v.is_finite() && v >= 0.0).then_some(v.round() as u64)
}

/// What a sample sets in its rank's [`Raw`].
type Set = fn(&mut Raw, &Sample<'_>);

/// The samples an engine family exports that we read: the label naming the rank (none:
/// one rank) and what the sample sets.
fn reading(format: MetricsFormat, name: &str) -> Option<(Option<&'static str>, Set)> {
    use MetricsFormat::{Llamacpp, Sglang, Vllm};
    let (vllm, sglang) = (Some("engine"), Some("dp_rank"));
    let set: (Option<&str>, Set) = match (format, name) {
        (Vllm, "vllm:kv_cache_usage_perc") => (vllm, |r, s| r.usage = Some(s.value)),
        (Vllm, "vllm:gpu_cache_usage_perc") => (vllm, |r, s| r.legacy_usage = Some(s.value)),
        (Vllm, "vllm:cache_config_info") => (vllm, |r, s| {
            r.total_blocks = s.label("num_gpu_blocks").and_then(|v| v.parse().ok())
        }),
        (Vllm, "vllm:num_requests_running") => (vllm, |r, s| r.running = count(s.value)),
        (Vllm, "vllm:num_requests_waiting") => (vllm, |r, s| r.waiting = count(s.value)),
        (Sglang, "sglang:token_usage") => (sglang, |r, s| r.usage = Some(s.value)),
        (Sglang, "sglang:max_total_num_tokens") => (sglang, |r, s| r.total_tokens = count(s.value)),
        (Sglang, "sglang:num_running_reqs") => (sglang, |r, s| r.running = count(s.value)),
        (Sglang, "sglang:num_queue_reqs") => (sglang, |r, s| r.waiting = count(s.value)),
        (Llamacpp, "llamacpp:kv_cache_usage_ratio") => (None, |r, s| r.usage = Some(s.value)),
        (Llamacpp, "llamacpp:requests_processing") => (None, |r, s| r.running = count(s.value)),
        (Llamacpp, "llamacpp:requests_deferred") => (None, |r, s| r.waiting = count(s.value)),
        _ => return None,
    };
    Some(set)
}

/// Maps an engine's metrics to per-rank signals (index = data-parallel rank).
pub fn parse(format: MetricsFormat, text: &str, cfg: &WorkerConfig) -> Vec<ScrapedRank> {
    let mut raw: Vec<Raw> = Vec::new();
    for s in samples(text) {
        let Some((label, set)) = reading(format, s.name) else {
            continue;
        };
        let Some(rank) = rank_of(&s, label) else {
            continue;
        };
        if raw.len() <= rank {
            raw.resize_with(rank + 1, Raw::default);
        }
        set(&mut raw[rank], &s);
    }
    let block = u64::from(cfg.block_size.max(1));
    raw.into_iter()
        .map(|r| {
            let total = r
                .total_blocks
                .or(r.total_tokens.map(|t| t / block))
                .or(cfg.kv_total_blocks);
            let usage = r
                .usage
                .or(r.legacy_usage)
                .filter(|u| u.is_finite() && *u >= 0.0);
            ScrapedRank {
                kv_used_blocks: usage.zip(total).map(|(u, t)| (u * t as f64).round() as u64),
                kv_total_blocks: r.total_blocks.or(r.total_tokens.map(|t| t / block)),
                running: r.running,
                waiting: r.waiting,
            }
        })
        .collect()
}

/// GETs `path` from `addr` and returns the body text.
pub async fn fetch(
    addr: SocketAddr,
    host: &str,
    path: &str,
    timeout: Duration,
) -> Result<String, String> {
    let req = format!(
        "GET {path} HTTP/1.1\r\nhost: {host}\r\naccept: text/plain\r\nconnection: close\r\nuser-agent: spillway\r\n\r\n"
    );
    let (status, body) =
        match monoio::time::timeout(timeout, exchange(addr, req.into_bytes())).await {
            Ok(r) => r?,
            Err(_) => return Err("scrape timed out".into()),
        };
    if status != 200 {
        return Err(format!("status {status}"));
    }
    String::from_utf8(body).map_err(|_| "metrics are not UTF-8".into())
}

/// One HTTP/1.1 exchange on a fresh connection: writes `request` (a whole request that
/// asks for `connection: close`) and returns the status and the de-chunked body, at most
/// [`MAX_METRICS_BODY`]. The caller bounds it in time.
pub(super) async fn exchange(addr: SocketAddr, request: Vec<u8>) -> Result<(u16, Vec<u8>), String> {
    let mut stream = monoio::net::TcpStream::connect_addr(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (res, _) = stream.write_all(request).await;
    res.map_err(|e| format!("write: {e}"))?;
    let mut buf: Vec<u8> = Vec::with_capacity(METRICS_READ_BUF);
    let mut head = ResponseHead::default();
    // Kept across reads: it de-chunks in place, so it must not restart from the head.
    let mut dechunker = Dechunker::new(0);
    let mut eof = false;
    loop {
        if !eof {
            if buf.capacity() - buf.len() < RESPONSE_READ_MIN_SPARE {
                buf.reserve(METRICS_READ_BUF);
            }
            let len = buf.len();
            let (res, slice) = stream.read(buf.slice_mut(len..)).await;
            buf = slice.into_inner();
            eof = res.map_err(|e| format!("read: {e}"))? == 0;
            if buf.len() > MAX_METRICS_BODY {
                return Err("response body too large".into());
            }
        }
        if head.status == 0 {
            match parse_response(&buf, MAX_METRICS_HEAD, false, &mut head) {
                Ok(true) => {}
                Ok(false) if eof => return Err("connection closed before the response head".into()),
                Ok(false) => continue,
                Err(e) => return Err(format!("bad response: {e}")),
            }
            dechunker = Dechunker::new(head.head_len);
        }
        let start = head.head_len;
        let done = match head.framing() {
            BodyFraming::None => Some(start..start),
            BodyFraming::Length(n) if buf.len() >= start + n as usize => {
                Some(start..start + n as usize)
            }
            BodyFraming::Length(_) => None,
            BodyFraming::UntilClose => eof.then_some(start..buf.len()),
            BodyFraming::Chunked => {
                let filled = buf.len();
                match dechunker.decode(&mut buf, filled, usize::MAX) {
                    Ok(true) => Some(start..dechunker.out),
                    Ok(false) => None,
                    Err(e) => return Err(format!("bad chunked body: {e}")),
                }
            }
        };
        if let Some(range) = done {
            buf.truncate(range.end);
            buf.drain(..range.start);
            return Ok((head.status, buf));
        }
        if eof {
            return Err("connection closed mid-body".into());
        }
    }
}

#[cfg(test)]
mod tests {
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
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2000",prefix="a\"b,c=d"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0
"#;

    #[test]
    fn vllm() {
        let r = parse(MetricsFormat::Vllm, VLLM, &worker(""));
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

    #[test]
    fn missing_metrics_are_unknown_not_zero() {
        let r = parse(
            MetricsFormat::Vllm,
            "vllm:num_requests_running 3\n",
            &worker(""),
        );
        assert_eq!(r[0].kv_used_blocks, None);
        let r = parse(
            MetricsFormat::Llamacpp,
            "llamacpp:requests_processing 1\nllamacpp:requests_deferred 4\n",
            &worker("kv_total_blocks = 100"),
        );
        assert_eq!(
            r[0],
            ScrapedRank {
                kv_used_blocks: None,
                kv_total_blocks: None,
                running: Some(1),
                waiting: Some(4)
            }
        );
        assert!(parse(MetricsFormat::Sglang, "", &worker("")).is_empty());
    }

    #[test]
    fn legacy_vllm_name_and_config_capacity() {
        let r = parse(
            MetricsFormat::Vllm,
            "vllm:gpu_cache_usage_perc{model_name=\"x\"} 0.9\n",
            &worker("kv_total_blocks = 100"),
        );
        assert_eq!(r[0].kv_used_blocks, Some(90));
        assert_eq!(r[0].kv_total_blocks, None);
    }

    #[test]
    fn sglang_and_llamacpp() {
        let text = "sglang:token_usage{model_name=\"m\"} 0.75\nsglang:max_total_num_tokens{model_name=\"m\"} 3200\nsglang:num_queue_reqs{model_name=\"m\"} 5\n";
        let r = parse(MetricsFormat::Sglang, text, &worker("block_size = 32"));
        assert_eq!(
            r[0],
            ScrapedRank {
                kv_used_blocks: Some(75),
                kv_total_blocks: Some(100),
                running: None,
                waiting: Some(5)
            }
        );
        let r = parse(
            MetricsFormat::Llamacpp,
            "llamacpp:kv_cache_usage_ratio 0.5\n",
            &worker("kv_total_blocks = 10"),
        );
        assert_eq!(r[0].kv_used_blocks, Some(5));
    }

    /// Found by `fuzz/` (target `scrape`): a rank label sized the rank table (a huge one
    /// overflowed or exhausted memory); ranks past `MAX_DP_SIZE` are ignored.
    #[test]
    fn rank_labels_are_bounded() {
        let text = "vllm:num_requests_running{engine=\"18446744073709551615\"} 1\n\
                    vllm:num_requests_running{engine=\"4000000000\"} 1\n\
                    vllm:num_requests_running{engine=\"1024\"} 1\n\
                    vllm:num_requests_running{engine=\"1\"} 2\n";
        let r = parse(MetricsFormat::Vllm, text, &worker(""));
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].running, Some(2));
        let text = "sglang:num_queue_reqs{dp_rank=\"1023\"} 4\n";
        assert_eq!(parse(MetricsFormat::Sglang, text, &worker("")).len(), 1024);
    }

    /// Found by `fuzz/` (target `scrape`): a `}` before the `{` sliced backwards.
    #[test]
    fn brace_before_label_set_is_skipped() {
        for text in [
            "}{",
            "x} y{a=\"1\"\n",
            "}{ 1\nvllm:num_requests_running 3\n",
        ] {
            let r = parse(MetricsFormat::Vllm, text, &worker(""));
            assert!(r.len() <= 1, "{text:?}");
        }
        let s: Vec<_> = samples("}{ 1\nok 2\n").collect();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].name, "ok");
    }

    #[test]
    fn label_escapes() {
        let s: Vec<_> = samples("x{a=\"q\\\"uote\",b=\"plain\"} 1\n").collect();
        assert_eq!(s[0].label("a").as_deref(), Some("q\"uote"));
        assert_eq!(s[0].label("b").as_deref(), Some("plain"));
        assert_eq!(s[0].label("c"), None);
    }
}
