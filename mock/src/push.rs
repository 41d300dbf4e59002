//! `--push-load`: the mock reports its load to a Spillway admin listener as Dynamo's
//! `ActiveLoad` events (`POST {url}/load`), the way a real engine integration would.

use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};

use super::sim::{EngineConfig, Load};
use crate::clock;

/// Where events go: the resolved admin address and its `host` header.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub addr: SocketAddr,
    pub host: String,
}

impl Target {
    /// `http://host:port[/]`, resolved once at start.
    pub fn resolve(url: &str) -> Result<Target, String> {
        let (host, port) = parse_http_url(url)?;
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

/// The host and port of a plain `http://host[:port][/]` URL (no path, no query).
fn parse_http_url(url: &str) -> Result<(String, u16), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "`{url}`: https upstreams are not supported (use http)"
            ));
        }
        _ => return Err(format!("`{url}` must start with http://")),
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!(
            "`{url}`: a base path is not supported; requests keep their own path"
        ));
    }
    if uri.query().is_some() {
        return Err(format!("`{url}`: a query string is not supported"));
    }
    let host = uri.host().ok_or_else(|| format!("`{url}` has no host"))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((host, uri.port_u16().unwrap_or(80)))
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

/// What a push reports: the engine's shape and its load now (the mock server is one).
pub(crate) trait Reports {
    fn engine_config(&self) -> &EngineConfig;
    fn load(&self) -> Load;
    /// Whether pushing is paused (a hung engine reports nothing).
    fn paused(&self) -> bool {
        false
    }
}

/// Pushes an event every `interval` until the runtime ends. Never fatal.
pub(crate) async fn run(mock: impl Reports, target: Target, worker: String, interval: Duration) {
    let timeout = interval.max(Duration::from_millis(500));
    let mut body = String::with_capacity(256);
    let mut failing_since: Option<Instant> = None;
    let mut last_warn: Option<Instant> = None;
    let mut failures = 0u64;
    loop {
        monoio::time::sleep(interval).await;
        if mock.paused() {
            continue;
        }
        body.clear();
        event(&mut body, &worker, mock.engine_config(), &mock.load());
        let request = format!(
            "POST /load HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\nuser-agent: spillway-mock\r\n\r\n{body}",
            target.host,
            body.len()
        );
        let sent =
            monoio::time::timeout(timeout, exchange(target.addr, request.into_bytes())).await;
        let error = match sent {
            Ok(Ok((200, _))) => None,
            Ok(Ok((status, reply))) => Some(format!(
                "status {status}: {}",
                String::from_utf8_lossy(&reply[..reply.len().min(200)])
            )),
            Ok(Err(e)) => Some(e),
            Err(_) => Some("timed out".to_string()),
        };
        let now = clock::now();
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

/// Most response bytes read back from the admin listener.
const MAX_REPLY_BYTES: usize = 64 * 1024;

/// One HTTP/1.1 exchange on a fresh connection: writes `request` (a whole request that
/// asks for `connection: close`) and returns the response's status and body. The caller
/// bounds it in time.
async fn exchange(addr: SocketAddr, request: Vec<u8>) -> Result<(u16, Vec<u8>), String> {
    let mut stream = monoio::net::TcpStream::connect_addr(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (res, _) = stream.write_all(request).await;
    res.map_err(|e| format!("write: {e}"))?;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(4096);
        }
        let len = buf.len();
        let (res, slice) = stream.read(buf.slice_mut(len..)).await;
        buf = slice.into_inner();
        let eof = res.map_err(|e| format!("read: {e}"))? == 0;
        if let Some(reply) = reply(&buf, eof)? {
            return Ok(reply);
        }
        if buf.len() > MAX_REPLY_BYTES {
            return Err("response too large".into());
        }
    }
}

/// The status and body once `buf` holds a whole response: Content-Length says where it
/// ends, else the close does (the request asked for one). `None`: read more.
fn reply(buf: &[u8], eof: bool) -> Result<Option<(u16, Vec<u8>)>, String> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut fields);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if eof => {
            return Err("connection closed before the response head".into());
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response: {e}")),
    };
    let status = response.code.unwrap_or(0);
    let length = response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| {
            std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| "bad response: invalid Content-Length".to_string())
        })
        .transpose()?;
    let body = &buf[head_len..];
    match length {
        Some(n) if body.len() >= n => Ok(Some((status, body[..n].to_vec()))),
        None if eof => Ok(Some((status, body.to_vec()))),
        _ if eof => Err("connection closed mid-body".into()),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_has_every_field_spillway_reads() {
        let cfg = EngineConfig {
            kv_blocks: 100,
            block_size: 16,
            max_num_seqs: 8,
            max_num_batched_tokens: 512,
            prefill_tokens_per_s: 1.0,
            decode_step_base_ms: 1.0,
            decode_step_per_seq_ms: 0.0,
            enable_prefix_caching: false,
        };
        let load = Load {
            used_blocks: 7,
            prefill_tokens: 300,
            ..Load::default()
        };
        let mut out = String::new();
        event(&mut out, "w\"1", &cfg, &load);
        assert_eq!(
            out,
            r#"{"worker_id":"w\"1","dp_rank":0,"active_decode_blocks":7,"kv_used_blocks":7,"active_prefill_tokens":300,"kv_total_blocks":100,"max_num_batched_tokens":512}"#
        );
    }

    #[test]
    fn targets() {
        let t = Target::resolve("http://127.0.0.1:9090").unwrap();
        assert_eq!(t.addr, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(t.host, "127.0.0.1:9090");
        let t = Target::resolve("http://[::1]:9090/").unwrap();
        assert_eq!(t.host, "[::1]:9090");
        assert_eq!(parse_http_url("http://h"), Ok(("h".to_string(), 80)));
        for bad in [
            "https://127.0.0.1:9090",
            "127.0.0.1:9090",
            "http://127.0.0.1:9090/admin",
            "http://127.0.0.1:9090/?x=1",
        ] {
            assert!(Target::resolve(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn replies() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        assert_eq!(reply(ok, false), Ok(Some((200, b"ok".to_vec()))));
        assert_eq!(reply(&ok[..ok.len() - 1], false), Ok(None));
        assert!(reply(&ok[..ok.len() - 1], true).is_err());
        assert!(reply(&ok[..10], true).is_err());
        let closed = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\nno";
        assert_eq!(reply(closed, false), Ok(None));
        assert_eq!(reply(closed, true), Ok(Some((400, b"no".to_vec()))));
        assert!(reply(b"SMTP ready\r\n\r\n", false).is_err());
    }
}
