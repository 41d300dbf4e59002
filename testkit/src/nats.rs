//! A real nats-server on a free loopback port for the NATS client's tests, and blocking
//! std helpers beside it: one-shot publish, kill and restart on the same port.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::tools::skip_missing_tool;

pub const NATS_SERVER: &str = "/usr/sbin/nats-server";

/// A nats-server process (no monitoring port), killed on drop.
pub struct Nats {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl Nats {
    /// Starts nats-server with its defaults; `None` (after `skip_missing_tool`) when it is
    /// not installed.
    pub fn start() -> Option<Nats> {
        Nats::start_with("")
    }

    /// Starts nats-server with `config` (nats-server's config syntax, e.g.
    /// `ping_interval: "1s"`) in its config file.
    pub fn start_with(config: &str) -> Option<Nats> {
        if !std::path::Path::new(NATS_SERVER).exists() {
            skip_missing_tool("nats-server", format!("{NATS_SERVER} is missing"));
            return None;
        }
        let dir = crate::tools::scratch_dir("nats");
        std::fs::write(dir.join("nats.conf"), config).unwrap();
        let mut nats = Nats {
            child: None,
            port: 0,
            dir,
        };
        for _ in 0..3 {
            nats.port = crate::tools::free_port();
            if nats.spawn() {
                return Some(nats);
            }
        }
        panic!("nats-server did not start (3 tries)");
    }

    /// Spawns the server on `self.port`; whether it came up answering INFO.
    fn spawn(&mut self) -> bool {
        let child = Command::new(NATS_SERVER)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-c"])
            .arg(self.dir.join("nats.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(15);
        while Instant::now() < end {
            if self.answers_info() {
                return true;
            }
            let exited = self.child.as_mut().unwrap().try_wait().unwrap().is_some();
            if exited {
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    fn answers_info(&self) -> bool {
        let Ok(stream) = TcpStream::connect_timeout(&self.addr(), Duration::from_secs(1)) else {
            return false;
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("INFO ")
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Publishes one message over a short connection of its own: CONNECT, PUB, PING, and
    /// back once the PONG says the server has routed it.
    pub fn publish(&self, subject: &str, payload: &[u8]) {
        let mut stream = TcpStream::connect_timeout(&self.addr(), Duration::from_secs(5)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("INFO "), "{line:?}");
        let mut out = br#"CONNECT {"verbose":false,"pedantic":false,"echo":false,"headers":false,"name":"testkit","lang":"rust","version":"0","protocol":1}"#.to_vec();
        out.extend_from_slice(format!("\r\nPUB {subject} {}\r\n", payload.len()).as_bytes());
        out.extend_from_slice(payload);
        out.extend_from_slice(b"\r\nPING\r\n");
        stream.write_all(&out).unwrap();
        loop {
            line.clear();
            let n = reader.read_line(&mut line).unwrap();
            assert!(n > 0, "nats-server closed the connection before PONG");
            assert!(!line.starts_with("-ERR"), "nats-server: {line}");
            if line == "PONG\r\n" {
                return;
            }
        }
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (after [`Nats::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("nats-server did not restart on port {}", self.port);
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
