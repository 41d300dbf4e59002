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

/// What one scrape says: per rank (index = data-parallel rank), and the metrics the
/// engine family should export that this text lacks (each by the name the README's
/// engine table gives).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scraped {
    pub ranks: Vec<ScrapedRank>,
    pub missing: Vec<&'static str>,
}

#[derive(Debug, Default)]
struct Raw {
    usage: Option<f64>,
    legacy_usage: Option<f64>,
    /// vLLM's `num_gpu_blocks` (the sum over ranks since vLLM 0.33's API server).
    gpu_blocks: Option<u64>,
    /// vLLM's per-rank `kv_cache_size_tokens` and `block_size`.
    size_tokens: Option<u64>,
    block_size: Option<u64>,
    total_tokens: Option<u64>,
    used_tokens: Option<u64>,
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

fn label_count(s: &Sample<'_>, key: &str) -> Option<u64> {
    s.label(key).and_then(|v| v.parse().ok())
}

/// What a sample sets in its rank's [`Raw`].
type Set = fn(&mut Raw, &Sample<'_>);

/// The samples an engine family exports that we read: the label naming the rank (none:
/// one rank) and what the sample sets. Names checked against vLLM 0.33.0, SGLang 0.5.23
/// and llama.cpp 0c1e570 (README, "Engines").
fn reading(format: MetricsFormat, name: &str) -> Option<(Option<&'static str>, Set)> {
    use MetricsFormat::{Llamacpp, Sglang, Vllm};
    let (vllm, sglang) = (Some("engine"), Some("dp_rank"));
    let set: (Option<&str>, Set) = match (format, name) {
        (Vllm, "vllm:kv_cache_usage_perc") => (vllm, |r, s| r.usage = Some(s.value)),
        (Vllm, "vllm:gpu_cache_usage_perc") => (vllm, |r, s| r.legacy_usage = Some(s.value)),
        (Vllm, "vllm:cache_config_info") => (vllm, |r, s| {
            r.gpu_blocks = label_count(s, "num_gpu_blocks");
            r.size_tokens = label_count(s, "kv_cache_size_tokens");
            r.block_size = label_count(s, "block_size");
        }),
        (Vllm, "vllm:num_requests_running") => (vllm, |r, s| r.running = count(s.value)),
        (Vllm, "vllm:num_requests_waiting") => (vllm, |r, s| r.waiting = count(s.value)),
        (Sglang, "sglang:token_usage") => (sglang, |r, s| r.legacy_usage = Some(s.value)),
        (Sglang, "sglang:kv_used_tokens") => (sglang, |r, s| r.used_tokens = count(s.value)),
        (Sglang, "sglang:max_total_num_tokens") => (sglang, |r, s| r.total_tokens = count(s.value)),
        (Sglang, "sglang:num_running_reqs") => (sglang, |r, s| r.running = count(s.value)),
        (Sglang, "sglang:num_queue_reqs") => (sglang, |r, s| r.waiting = count(s.value)),
        (Llamacpp, "llamacpp:requests_processing") => (None, |r, s| r.running = count(s.value)),
        (Llamacpp, "llamacpp:requests_deferred") => (None, |r, s| r.waiting = count(s.value)),
        _ => return None,
    };
    Some(set)
}

/// The metrics each family should export: the name reported missing, and the names any
/// one of which supplies it.
fn expected(format: MetricsFormat) -> &'static [(&'static str, &'static [&'static str])] {
    match format {
        MetricsFormat::Vllm => &[
            (
                "vllm:kv_cache_usage_perc",
                &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            ),
            ("vllm:cache_config_info", &["vllm:cache_config_info"]),
            ("vllm:num_requests_running", &["vllm:num_requests_running"]),
            ("vllm:num_requests_waiting", &["vllm:num_requests_waiting"]),
        ],
        MetricsFormat::Sglang => &[
            (
                "sglang:kv_used_tokens",
                &["sglang:kv_used_tokens", "sglang:token_usage"],
            ),
            (
                "sglang:max_total_num_tokens",
                &["sglang:max_total_num_tokens"],
            ),
            ("sglang:num_running_reqs", &["sglang:num_running_reqs"]),
            ("sglang:num_queue_reqs", &["sglang:num_queue_reqs"]),
        ],
        MetricsFormat::Llamacpp => &[
            (
                "llamacpp:requests_processing",
                &["llamacpp:requests_processing"],
            ),
            (
                "llamacpp:requests_deferred",
                &["llamacpp:requests_deferred"],
            ),
        ],
    }
}

/// Maps an engine's metrics to per-rank signals. A sample of one priority (SGLang's
/// `priority` label, set) is skipped: the total is the series without one.
pub fn parse(format: MetricsFormat, text: &str, cfg: &WorkerConfig) -> Scraped {
    let mut raw: Vec<Raw> = Vec::new();
    let wanted = expected(format);
    let mut seen = 0u32;
    for s in samples(text) {
        let Some((label, set)) = reading(format, s.name) else {
            continue;
        };
        if let Some(i) = wanted.iter().position(|(_, names)| names.contains(&s.name)) {
            seen |= 1 << i;
        }
        if s.label("priority").is_some_and(|p| !p.is_empty()) {
            continue;
        }
        let Some(rank) = rank_of(&s, label) else {
            continue;
        };
        if raw.len() <= rank {
            raw.resize_with(rank + 1, Raw::default);
        }
        set(&mut raw[rank], &s);
    }
    let missing = (wanted.iter().enumerate())
        .filter(|(i, _)| seen & (1 << i) == 0)
        .map(|(_, (name, _))| *name)
        .collect();
    let ranks = raw.len() as u64;
    let block = u64::from(cfg.block_size.max(1));
    let ranks = raw
        .into_iter()
        .map(|r| {
            let reported = capacity(&r, ranks, block);
            let total = reported.or(cfg.kv_total_blocks);
            let usage = r
                .usage
                .or(r.legacy_usage)
                .filter(|u| u.is_finite() && *u >= 0.0);
            let used = match (r.used_tokens, r.total_tokens) {
                (Some(used), Some(_)) => Some(used / block),
                _ => usage.zip(total).map(|(u, t)| (u * t as f64).round() as u64),
            };
            ScrapedRank {
                kv_used_blocks: used,
                kv_total_blocks: reported,
                running: r.running,
                waiting: r.waiting,
            }
        })
        .collect();
    Scraped { ranks, missing }
}

/// A rank's KV capacity in blocks of `block` tokens, as the engine reports it: vLLM's
/// per-rank tokens over its block size, else its block count shared by the `ranks`;
/// SGLang's token pool.
fn capacity(r: &Raw, ranks: u64, block: u64) -> Option<u64> {
    let vllm = match (r.size_tokens, r.block_size.filter(|&b| b > 0)) {
        (Some(tokens), Some(size)) => Some(tokens / size),
        _ => r.gpu_blocks.map(|b| b / ranks.max(1)),
    };
    vllm.or(r.total_tokens.map(|t| t / block))
}

/// GETs `path` from `addr` and returns the body text.
pub async fn fetch(
    addr: SocketAddr,
    host: &str,
    path: &str,
    timeout: Duration,
) -> Result<String, String> {
    get(addr, host, path, "text/plain", timeout).await
}

/// llama.cpp's slot count: `total_slots` of its `GET /props` (`None` when the server
/// does not say).
pub async fn llamacpp_slots(addr: SocketAddr, host: &str, timeout: Duration) -> Option<u64> {
    let text = get(addr, host, "/props", "application/json", timeout).await;
    props_slots(&text.ok()?)
}

/// `total_slots` of a llama.cpp `/props` body.
pub fn props_slots(body: &str) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Props {
        total_slots: Option<u64>,
    }
    let props: Props = serde_json::from_str(body).ok()?;
    props.total_slots.filter(|&n| n > 0)
}

async fn get(
    addr: SocketAddr,
    host: &str,
    path: &str,
    accept: &str,
    timeout: Duration,
) -> Result<String, String> {
    let req = format!(
        "GET {path} HTTP/1.1\r\nhost: {host}\r\naccept: {accept}\r\nconnection: close\r\nuser-agent: spillway\r\n\r\n"
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
mod tests;
