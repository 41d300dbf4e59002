//! llama.cpp's own HTTP server (`llama-server`) on a loopback port, serving a tiny model
//! with random weights: a real engine for tests, killed on drop.
//!
//! The binary is `SPILLWAY_LLAMA_SERVER`, else `<target>/llama.cpp/bin/llama-server` as
//! `tests/llamacpp/build.sh` leaves it (`<target>` is `CARGO_TARGET_DIR`, else the
//! workspace's `target`). The model is written once per process by
//! `tests/llamacpp/tiny_gguf.py` (with `SPILLWAY_PYTHON`, else `python3`, which needs the
//! `gguf` package) into `<target>/llama.cpp/models/`. Without the binary or the package a
//! test is skipped, and fails under CI ([`skip_missing_tool`]).
//!
//! The server runs with `--ignore-eos`: the random weights emit the end-of-sequence token
//! now and then, and a test asking for N tokens gets exactly N.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::client::{Client, Response, get};
use crate::proxy::ServerHandle;
use crate::tools::skip_missing_tool;

/// The name [`skip_missing_tool`] reports.
const TOOL: &str = "llama.cpp's llama-server";

/// Longest wait for a started server to answer `/health` with 200.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `llama-server`; killed (SIGKILL) on drop.
pub struct LlamaServer {
    child: Option<Child>,
    port: u16,
    slots: u32,
    ctx: u32,
    binary: PathBuf,
    model: PathBuf,
    /// Holds `llama-server.log` (every start appends to it); removed on drop.
    dir: PathBuf,
}

/// The workspace's root (the folder above `testkit/`).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `CARGO_TARGET_DIR` (relative: from the workspace), else the workspace's `target`.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => workspace().join(dir),
        _ => workspace().join("target"),
    }
}

/// Where the `llama-server` binary is looked for.
pub fn binary() -> PathBuf {
    match std::env::var_os("SPILLWAY_LLAMA_SERVER") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => target_dir().join("llama.cpp/bin/llama-server"),
    }
}

fn python() -> String {
    std::env::var("SPILLWAY_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Why `binary` cannot serve, if it cannot: missing, or `--version` fails.
fn binary_problem(binary: &Path) -> Option<String> {
    match Command::new(binary).arg("--version").output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "`{} --version` failed ({}); build it with tests/llamacpp/build.sh",
            binary.display(),
            out.status
        )),
        Err(e) => Some(format!(
            "{}: {e}; build it with tests/llamacpp/build.sh",
            binary.display()
        )),
    }
}

/// Why the model cannot be written, if the `gguf` package is missing.
fn gguf_problem(python: &str) -> Option<String> {
    let ok = Command::new(python)
        .args(["-c", "import gguf"])
        .output()
        .is_ok_and(|o| o.status.success());
    (!ok).then(|| format!("`{python} -c 'import gguf'` fails (pip install gguf)"))
}

/// The tiny model's file, written once per process (the script's defaults: 4 layers ×
/// 384 wide, f16, seed 7; about 15 MB, the same bytes every time).
pub fn tiny_model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = target_dir().join("llama.cpp/models");
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("tiny.gguf");
        let script = workspace().join("tests/llamacpp/tiny_gguf.py");
        let python = python();
        let run = Command::new(&python)
            .arg(&script)
            .arg(&out)
            .output()
            .unwrap_or_else(|e| panic!("{python}: {e}"));
        assert!(
            run.status.success(),
            "`{python} {} {}` failed:\n{}",
            script.display(),
            out.display(),
            String::from_utf8_lossy(&run.stderr)
        );
        out
    })
}

impl LlamaServer {
    /// Starts `llama-server -np slots -c ctx` (each slot gets `ctx / slots` tokens of
    /// context) on a free loopback port and waits until `/health` answers 200. `None`
    /// (the test then returns) when the binary or the `gguf` package is missing, outside
    /// CI.
    pub fn start(slots: u32, ctx: u32) -> Option<LlamaServer> {
        let binary = binary();
        if let Some(why) = binary_problem(&binary).or_else(|| gguf_problem(&python())) {
            skip_missing_tool(TOOL, why);
            return None;
        }
        let model = tiny_model().to_path_buf();
        let dir = crate::tools::scratch_dir("llama");
        let mut server = LlamaServer {
            child: None,
            port: 0,
            slots,
            ctx,
            binary,
            model,
            dir,
        };
        // A port taken between picking and binding: try again with another.
        let mut last = String::new();
        for _ in 0..3 {
            server.port = crate::tools::free_port();
            match server.launch() {
                Ok(()) => return Some(server),
                Err(why) => last = why,
            }
        }
        panic!("llama-server did not start: {last}");
    }

    /// Spawns the server on `self.port` and waits for it; the log's tail when it exits
    /// or does not answer in time.
    fn launch(&mut self) -> Result<(), String> {
        let log_path = self.dir.join("llama-server.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        let child = Command::new(&self.binary)
            .arg("-m")
            .arg(&self.model)
            .args(["-np", &self.slots.to_string(), "-c", &self.ctx.to_string()])
            .args([
                "-t",
                "1",
                "--metrics",
                "--slots",
                "--ignore-eos",
                "--no-warmup",
            ])
            .args(["--alias", "tiny", "--host", "127.0.0.1"])
            .args(["--port", &self.port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        let end = Instant::now() + READY_TIMEOUT;
        while Instant::now() < end {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                self.child = None;
                return Err(format!("exited with {status}:\n{}", self.log_tail()));
            }
            if self.try_get("/health").is_some_and(|r| r.status == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err(format!(
            "no 200 from /health within {READY_TIMEOUT:?}:\n{}",
            self.log_tail()
        ))
    }

    /// Kills the server (SIGKILL), as a crash would; [`LlamaServer::restart`] brings it
    /// back.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs and starts it again on the same port, waiting until
    /// it answers (a few tries, while the port is not free yet).
    pub fn restart(&mut self) {
        self.kill();
        let mut last = String::new();
        for _ in 0..5 {
            match self.launch() {
                Ok(()) => return,
                Err(why) => last = why,
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!("llama-server did not restart on port {}: {last}", self.port);
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// A GET straight to the server; `None` when it cannot connect, or closes the
    /// connection without answering (as it may while it starts).
    pub fn try_get(&self, path: &str) -> Option<Response> {
        let mut client = Client::try_connect(self.addr()).ok()?;
        client.try_request(&get(path))
    }

    /// A GET straight to the server, which must be up.
    pub fn get(&self, path: &str) -> Response {
        self.try_get(path)
            .unwrap_or_else(|| panic!("llama-server on port {} is not up", self.port))
    }

    /// A value of its `/metrics` (`name` without the `llamacpp:` prefix).
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").text();
        crate::admin::metric_value(&text, &format!("llamacpp:{name}"))
            .unwrap_or_else(|| panic!("no llamacpp:{name} in:\n{text}"))
    }

    /// How many of its slots are processing a request now (`/slots`).
    pub fn busy_slots(&self) -> usize {
        let slots = self.get("/slots").json();
        let slots = slots.as_array().expect("/slots is an array");
        slots
            .iter()
            .filter(|s| s["is_processing"].as_bool() == Some(true))
            .count()
    }

    /// The last 40 lines of its log (all starts).
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("llama-server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

/// The model's name in Spillway (and llama-server's alias for its model).
pub const MODEL: &str = "tiny";

/// What a test adds to the config [`setup`] writes.
#[derive(Default)]
pub struct Extra<'a> {
    /// Top-level lines before `[[models]]` (a `[limits]` table, ...).
    pub head: &'a str,
    /// Lines of the `[[models]]` block (busy thresholds, `router_mode`, ...).
    pub model: &'a str,
    /// Lines of its one `[[models.workers]]` block (`engine_request_limit`,
    /// `load_sources`, `metrics_format`, ...).
    pub worker: &'a str,
}

/// llama-server and Spillway in front of it (in-process, [`crate::proxy`]).
pub struct Setup {
    pub llama: LlamaServer,
    pub proxy: ServerHandle,
    /// The worker's name in Spillway's metrics.
    pub worker: String,
}

/// Starts llama-server (`slots` slots sharing `ctx` tokens of context) and a Spillway of
/// `cores` cores with one model, [`MODEL`], whose one worker it is. `None` when
/// llama-server cannot run here (the test then returns).
///
/// Tests of the `llamacpp` scrape adapter and of busy thresholds against the real engine
/// start here: the scrape settings (`load_sources = ["scrape"]`,
/// `metrics_format = "llamacpp"`) go in `extra.worker`, the thresholds in `extra.model`.
pub fn setup(slots: u32, ctx: u32, cores: usize, extra: Extra<'_>) -> Option<Setup> {
    let llama = LlamaServer::start(slots, ctx)?;
    let worker = crate::worker_name(&llama.url());
    let toml = format!(
        "{}\n[[models]]\nname = \"{MODEL}\"\n{}\n[[models.workers]]\nurl = \"{}\"\nname = \"{worker}\"\n{}\n",
        extra.head,
        extra.model,
        llama.url(),
        extra.worker
    );
    let proxy = crate::proxy(cores, &toml);
    Some(Setup {
        llama,
        proxy,
        worker,
    })
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
