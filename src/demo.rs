//! `spillway` with no arguments (part of the binary): the proxy in front of two
//! in-process mock engines with shedding on, so one command shows the whole thing
//! working (and overloading).

use std::io;
use std::net::SocketAddr;

use spillway::config::ConfigError;
use spillway::{Config, ConfigSource, Overrides, ServerHandle};
use spillway_mock::{MockConfig, MockHandle};

/// The model the demo serves (any OpenAI client can ask for it).
pub const MODEL: &str = "Qwen/Qwen3-0.6B";
/// Data and admin listeners of the demo.
pub const LISTEN: &str = "127.0.0.1:8000";
pub const ADMIN_LISTEN: &str = "127.0.0.1:9090";
/// Shedding and admission the demo runs with.
pub const DECODE_THRESHOLD: f64 = 0.85;
pub const ENGINE_REQUEST_LIMIT: u32 = 64;
pub const REQUEST_QUEUE_LIMIT: u32 = 16;

/// A running demo: the proxy and its engines (stopped on drop, proxy first).
#[derive(Debug)]
pub struct Demo {
    pub server: ServerHandle,
    pub engines: Vec<MockHandle>,
}

/// The demo's configuration for engines at `engines`: scraped vLLM metrics plus
/// router-tracked load, decode threshold 0.85, 64 engine slots and 16 queue places each.
pub fn config_text(listen: &str, admin: &str, engines: &[SocketAddr]) -> String {
    let mut text = format!(
        "listen = \"{listen}\"\nadmin_listen = \"{admin}\"\nscrape_interval_ms = 200\n\n\
         [[models]]\nname = \"{MODEL}\"\nrouter_mode = \"power-of-two\"\n\
         active_decode_blocks_threshold = {DECODE_THRESHOLD}\n"
    );
    for (i, addr) in engines.iter().enumerate() {
        text.push_str(&format!(
            "\n[[models.workers]]\nurl = \"http://{addr}\"\nname = \"engine-{i}\"\n\
             load_sources = [\"scrape\", \"tracked\"]\n\
             engine_request_limit = {ENGINE_REQUEST_LIMIT}\nrequest_queue_limit = {REQUEST_QUEUE_LIMIT}\n"
        ));
    }
    text
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot start a mock engine: {0}")]
    Engine(io::Error),
    #[error("demo configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("cannot start the proxy on {listen} (admin {admin}): {source}")]
    Proxy {
        listen: String,
        admin: String,
        source: io::Error,
    },
}

/// Starts two mock engines on free ports and the proxy on `listen` / `admin`.
pub fn start(listen: &str, admin: &str, overrides: Overrides) -> Result<Demo, DemoError> {
    let engines = (0..2u64)
        .map(|i| {
            spillway_mock::start(MockConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                model: MODEL.to_string(),
                seed: i,
                ..MockConfig::default()
            })
        })
        .collect::<io::Result<Vec<_>>>()
        .map_err(DemoError::Engine)?;
    let addrs: Vec<_> = engines.iter().map(|e| e.addr).collect();
    let config = Config::parse(&config_text(listen, admin, &addrs), &overrides)?;
    let source = ConfigSource {
        path: None,
        overrides,
    };
    let server = spillway::start(config, source).map_err(|source| DemoError::Proxy {
        listen: listen.to_string(),
        admin: admin.to_string(),
        source,
    })?;
    Ok(Demo { server, engines })
}

impl Demo {
    /// The curl command that streams a completion through the proxy.
    pub fn curl(&self) -> String {
        let snap = self.server.shared.snapshot.load();
        let origin = match &snap.config.tls.listener {
            // `--cacert` as README's self-signed certificate needs.
            Some(l) if l.listen.is_none() => format!(
                "--cacert {} https://localhost:{}",
                l.cert.display(),
                self.server.data_addr.port()
            ),
            _ => format!("http://{}", self.server.data_addr),
        };
        format!(
            "curl -N {origin}/v1/chat/completions -H 'content-type: application/json' \
             -d '{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}],\"stream\":true}}'"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_serves_a_completion() {
        use std::io::{Read, Write};
        let demo = start("127.0.0.1:0", "127.0.0.1:0", Overrides::default()).unwrap();
        let body = format!(
            r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":3}}"#
        );
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: d\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut s = std::net::TcpStream::connect(demo.server.data_addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(reply.contains("\"completion_tokens\":3"), "{reply}");
        assert!(demo.curl().contains(&demo.server.data_addr.to_string()));
    }
}
