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
    MAX_METRICS_BODY, MAX_METRICS_HEAD, METRICS_READ_BUF, RESPONSE_READ_MIN_SPARE,
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
                let close = line.rfind('}')?;
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

fn rank_of(s: &Sample<'_>, label: &str) -> usize {
    s.label(label).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn count(v: f64) -> Option<u64> {
    (v.is_finite() && v >= 0.0).then_some(v.round() as u64)
}

/// Maps an engine's metrics to per-rank signals (index = data-parallel rank).
pub fn parse(format: MetricsFormat, text: &str, cfg: &WorkerConfig) -> Vec<ScrapedRank> {
    fn at(raw: &mut Vec<Raw>, rank: usize) -> &mut Raw {
        if raw.len() <= rank {
            raw.resize_with(rank + 1, Raw::default);
        }
        &mut raw[rank]
    }
    let mut raw: Vec<Raw> = Vec::new();
    for s in samples(text) {
        match (format, s.name) {
            (MetricsFormat::Vllm, "vllm:kv_cache_usage_perc") => {
                at(&mut raw, rank_of(&s, "engine")).usage = Some(s.value)
            }
            (MetricsFormat::Vllm, "vllm:gpu_cache_usage_perc") => {
                at(&mut raw, rank_of(&s, "engine")).legacy_usage = Some(s.value)
            }
            (MetricsFormat::Vllm, "vllm:cache_config_info") => {
                let blocks = s.label("num_gpu_blocks").and_then(|v| v.parse().ok());
                at(&mut raw, rank_of(&s, "engine")).total_blocks = blocks;
            }
            (MetricsFormat::Vllm, "vllm:num_requests_running") => {
                at(&mut raw, rank_of(&s, "engine")).running = count(s.value)
            }
            (MetricsFormat::Vllm, "vllm:num_requests_waiting") => {
                at(&mut raw, rank_of(&s, "engine")).waiting = count(s.value)
            }
            (MetricsFormat::Sglang, "sglang:token_usage") => {
                at(&mut raw, rank_of(&s, "dp_rank")).usage = Some(s.value)
            }
            (MetricsFormat::Sglang, "sglang:max_total_num_tokens") => {
                at(&mut raw, rank_of(&s, "dp_rank")).total_tokens = count(s.value)
            }
            (MetricsFormat::Sglang, "sglang:num_running_reqs") => {
                at(&mut raw, rank_of(&s, "dp_rank")).running = count(s.value)
            }
            (MetricsFormat::Sglang, "sglang:num_queue_reqs") => {
                at(&mut raw, rank_of(&s, "dp_rank")).waiting = count(s.value)
            }
            (MetricsFormat::Llamacpp, "llamacpp:kv_cache_usage_ratio") => {
                at(&mut raw, 0).usage = Some(s.value)
            }
            (MetricsFormat::Llamacpp, "llamacpp:requests_processing") => {
                at(&mut raw, 0).running = count(s.value)
            }
            (MetricsFormat::Llamacpp, "llamacpp:requests_deferred") => {
                at(&mut raw, 0).waiting = count(s.value)
            }
            _ => {}
        }
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
async fn exchange(addr: SocketAddr, request: Vec<u8>) -> Result<(u16, Vec<u8>), String> {
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

    #[test]
    fn label_escapes() {
        let s: Vec<_> = samples("x{a=\"q\\\"uote\",b=\"plain\"} 1\n").collect();
        assert_eq!(s[0].label("a").as_deref(), Some("q\"uote"));
        assert_eq!(s[0].label("b").as_deref(), Some("plain"));
        assert_eq!(s[0].label("c"), None);
    }
}
