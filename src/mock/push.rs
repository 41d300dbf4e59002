//! `--push-load`: the mock reports its load to a Spillway admin listener as Dynamo's
//! `ActiveLoad` events (`POST {url}/load`), the way a real engine integration would.

use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::server::Mock;
use super::sim::{EngineConfig, Load};

/// Where events go: the resolved admin address and its `host` header.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub host: String,
}

impl Target {
    /// `http://host:port[/]`, resolved once at start.
    pub fn resolve(url: &str) -> Result<Target, String> {
        let (host, port) = crate::config::parse_http_url(url)?;
        let addr = (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve `{url}`: {e}"))?
            .next()
            .ok_or_else(|| format!("`{url}` resolves to no address"))?;
        let host = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(Target { addr, host })
    }
}

/// One load event; decode and used blocks are the same here: only running sequences
/// hold blocks.
pub fn event(out: &mut String, worker: &str, cfg: &EngineConfig, load: &Load) {
    out.push_str(r#"{"worker_id":"#);
    let _ = serde_json::to_string(worker).map(|w| out.push_str(&w));
    let _ = write!(
        out,
        r#","dp_rank":0,"active_decode_blocks":{used},"kv_used_blocks":{used},"active_prefill_tokens":{},"kv_total_blocks":{},"max_num_batched_tokens":{}}}"#,
        load.prefill_tokens,
        cfg.kv_blocks,
        cfg.max_num_batched_tokens,
        used = load.used_blocks,
    );
}

/// How often a failing push is logged at warn level; the rest go to debug.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Pushes an event every `interval` until the runtime ends. Never fatal.
pub async fn run(mock: Rc<Mock>, target: Target, worker: String, interval: Duration) {
    let timeout = interval.max(Duration::from_millis(500));
    let mut body = String::with_capacity(256);
    let mut failing_since: Option<Instant> = None;
    let mut last_warn: Option<Instant> = None;
    let mut failures = 0u64;
    loop {
        monoio::time::sleep(interval).await;
        body.clear();
        event(&mut body, &worker, mock.engine_config(), &mock.load());
        let request = format!(
            "POST /load HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\nuser-agent: spillway-mock\r\n\r\n{body}",
            target.host,
            body.len()
        );
        let sent = monoio::time::timeout(
            timeout,
            crate::monitor::scrape::exchange(target.addr, request.into_bytes()),
        )
        .await;
        let error = match sent {
            Ok(Ok((200, _))) => None,
            Ok(Ok((status, reply))) => Some(format!(
                "status {status}: {}",
                String::from_utf8_lossy(&reply[..reply.len().min(200)])
            )),
            Ok(Err(e)) => Some(e),
            Err(_) => Some("timed out".to_string()),
        };
        let now = Instant::now();
        match error {
            None => {
                if let Some(since) = failing_since.take() {
                    tracing::info!(target_addr = %target.addr, failures, down_ms = now.duration_since(since).as_millis() as u64, "load push recovered");
                    failures = 0;
                }
            }
            Some(error) => {
                failures += 1;
                failing_since.get_or_insert(now);
                if last_warn.is_none_or(|t| now.duration_since(t) >= WARN_EVERY) {
                    last_warn = Some(now);
                    tracing::warn!(target_addr = %target.addr, worker = %worker, failures, %error, "load push failed");
                } else {
                    tracing::debug!(target_addr = %target.addr, %error, "load push failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::load::parse_events;

    #[test]
    fn event_is_what_spillway_accepts() {
        let cfg = EngineConfig {
            kv_blocks: 100,
            block_size: 16,
            max_num_seqs: 8,
            max_num_batched_tokens: 512,
            prefill_tokens_per_s: 1.0,
            decode_step_base_ms: 1.0,
            decode_step_per_seq_ms: 0.0,
        };
        let load = Load {
            used_blocks: 7,
            prefill_tokens: 300,
            ..Load::default()
        };
        let mut out = String::new();
        event(&mut out, "w\"1", &cfg, &load);
        let mut events = parse_events(out.as_bytes()).unwrap();
        assert_eq!(events.len(), 1, "one event");
        let e = events.remove(0);
        assert_eq!(e.worker_id.name(), "w\"1");
        assert_eq!(e.dp_rank, 0);
        assert_eq!(e.active_decode_blocks, Some(7));
        assert_eq!(e.kv_used_blocks, Some(7));
        assert_eq!(e.active_prefill_tokens, Some(300));
        assert_eq!(e.kv_total_blocks, Some(100));
        assert_eq!(e.max_num_batched_tokens, Some(512));
    }

    #[test]
    fn targets() {
        let t = Target::resolve("http://127.0.0.1:9090").unwrap();
        assert_eq!(t.addr, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(t.host, "127.0.0.1:9090");
        assert!(Target::resolve("https://127.0.0.1:9090").is_err());
        assert!(Target::resolve("127.0.0.1:9090").is_err());
    }
}
