//! A real etcd (`/usr/bin/etcd`, v3 with its JSON gateway) on loopback ports in a temp
//! dir, killed on drop, and blocking helpers that write to it the way a worker would:
//! leases, puts, deletes, keepalives, compaction.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spillway::http::chunked::ChunkedParser;

use crate::tools::skip_missing_tool;

const ETCD: &str = "/usr/bin/etcd";

/// A running etcd; killed and its data dir removed on drop.
pub struct Etcd {
    child: Child,
    dir: PathBuf,
    addr: SocketAddr,
}

impl Etcd {
    /// Starts etcd and waits until it answers. `None` (the test then returns) when etcd
    /// is not installed, outside CI; see [`skip_missing_tool`].
    pub fn start() -> Option<Etcd> {
        if !std::path::Path::new(ETCD).exists() {
            skip_missing_tool("etcd", format!("{ETCD} not found"));
            return None;
        }
        let mut last = String::new();
        // A port taken between picking and binding: try again with others.
        for _ in 0..3 {
            match Etcd::try_start() {
                Ok(etcd) => return Some(etcd),
                Err(why) => last = why,
            }
        }
        panic!("etcd did not start: {last}");
    }

    fn try_start() -> Result<Etcd, String> {
        let dir = crate::tools::scratch_dir("etcd");
        let (client, peer) = (crate::tools::free_port(), crate::tools::free_port());
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
        let child = Command::new(ETCD)
            .args(["--name", "test", "--log-level", "warn", "--logger", "zap"])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("test={peer_url}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], client));
        let mut etcd = Etcd { child, dir, addr };
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if let Ok(Some(status)) = etcd.child.try_wait() {
                let log = std::fs::read_to_string(etcd.dir.join("etcd.log")).unwrap_or_default();
                return Err(format!("exited with {status}: {log}"));
            }
            if post(addr, "/v3/kv/range", &json!({"key": b64(b"\0")})).is_ok() {
                return Ok(etcd);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err("no answer within 30 s".into())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kills etcd now (SIGKILL), as a crash would; the dir goes on drop.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) etcd: stopped, it holds its connections and
    /// the kernel still accepts new ones, but nothing answers, as with a hung server.
    pub fn pause(&self, paused: bool) {
        let signal = if paused { "-STOP" } else { "-CONT" };
        let status = std::process::Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} etcd failed");
    }

    /// `POST path` with a JSON body; the answer's JSON. Panics unless etcd answers 200.
    pub fn call(&self, path: &str, body: &Value) -> Value {
        post(self.addr, path, body).unwrap_or_else(|e| panic!("etcd {path}: {e}"))
    }

    /// A new lease of `ttl_secs`; its ID.
    pub fn grant_lease(&self, ttl_secs: i64) -> i64 {
        let answer = self.call("/v3/lease/grant", &json!({"TTL": ttl_secs.to_string()}));
        int(&answer["ID"])
    }

    /// Puts `key` = `value`, bound to `lease` (0: none); the store's new revision.
    pub fn put(&self, key: &str, value: &[u8], lease: i64) -> i64 {
        let mut body = json!({"key": b64(key.as_bytes()), "value": b64(value)});
        if lease != 0 {
            body["lease"] = json!(lease.to_string());
        }
        int(&self.call("/v3/kv/put", &body)["header"]["revision"])
    }

    /// Deletes `key`; the store's revision after.
    pub fn delete(&self, key: &str) -> i64 {
        let answer = self.call("/v3/kv/deleterange", &json!({"key": b64(key.as_bytes())}));
        int(&answer["header"]["revision"])
    }

    /// One keepalive round for `lease`; the TTL it was renewed to (0: the lease is gone).
    pub fn keepalive(&self, lease: i64) -> i64 {
        keepalive_once(self.addr, lease).unwrap_or_else(|e| panic!("etcd keepalive: {e}"))
    }

    /// Revokes `lease`: its keys go at once.
    pub fn revoke(&self, lease: i64) {
        self.call("/v3/lease/revoke", &json!({"ID": lease.to_string()}));
    }

    /// Compacts the store up to `revision`: watches from before it are refused.
    pub fn compact(&self, revision: i64) {
        self.call(
            "/v3/kv/compaction",
            &json!({"revision": revision.to_string(), "physical": true}),
        );
    }

    /// Renews `lease` every third of its TTL from a thread, until the keeper is dropped
    /// (which stops renewing without revoking: the keys expire after the TTL, as when
    /// their process dies).
    pub fn keep_alive(&self, lease: i64) -> KeepAlive {
        let ttl = self.keepalive(lease);
        assert!(ttl > 0, "lease {lease} is gone");
        let every = Duration::from_millis((ttl as u64 * 1000 / 3).max(100));
        let stop = Arc::new(AtomicBool::new(false));
        let addr = self.addr;
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut next = Instant::now() + every;
            while !flag.load(Ordering::SeqCst) {
                if Instant::now() >= next {
                    let _ = keepalive_once(addr, lease);
                    next = Instant::now() + every;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        KeepAlive {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Keeps a lease alive while held; see [`Etcd::keep_alive`].
pub struct KeepAlive {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn keepalive_once(addr: SocketAddr, lease: i64) -> Result<i64, String> {
    let answer = post(
        addr,
        "/v3/lease/keepalive",
        &json!({"ID": lease.to_string()}),
    )?;
    Ok(answer["result"]["TTL"]
        .as_str()
        .map_or(0, |t| t.parse().unwrap_or(0)))
}

/// An int64 field as the gateway writes it: a JSON string.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or_else(|_| panic!("not an int64: {v}")),
        Value::Number(n) => n.as_i64().unwrap(),
        _ => panic!("not an int64: {v}"),
    }
}

/// Standard base64 with padding, as the gateway takes keys and values.
pub fn b64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for group in bytes.chunks(3) {
        let n = group
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= group.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A blocking HTTP/1.1 POST (`connection: close`); the answer's JSON when it is 200.
fn post(addr: SocketAddr, path: &str, body: &Value) -> Result<Value, String> {
    let body = body.to_string();
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("read: {e}"))?;
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut head = httparse::Response::new(&mut fields);
    let Ok(httparse::Status::Complete(len)) = head.parse(&raw) else {
        return Err(format!("bad answer: {}", String::from_utf8_lossy(&raw)));
    };
    let chunked = head.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding") && h.value.eq_ignore_ascii_case(b"chunked")
    });
    let mut payload = Vec::new();
    if chunked {
        ChunkedParser::new()
            .skim(&raw[len..], |data| payload.extend_from_slice(data))
            .map_err(|e| format!("bad chunked body: {e}"))?;
    } else {
        payload.extend_from_slice(&raw[len..]);
    }
    if head.code != Some(200) {
        let text = String::from_utf8_lossy(&payload);
        return Err(format!("status {:?}: {text}", head.code));
    }
    serde_json::from_slice(&payload).map_err(|e| format!("bad JSON: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_standard_alphabet() {
        for (raw, text) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"\0", "AA=="),
            (b"\xff\xfe\xfd", "//79"),
        ] {
            assert_eq!(super::b64(raw), text);
        }
    }
}
