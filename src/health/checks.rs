//! Active checks as settings and bytes: what a check sends and whether its answer
//! passes. The monitor runs them off the data cores (`monitor/checks.rs`).

use serde::Serialize;

/// What a check sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    /// `GET path`; passes on 2xx (vLLM, SGLang, llama.cpp and Dynamo serve `/health`).
    Http,
    /// A real completion of one token, `POST path` (default `/v1/completions`), sent only
    /// when the worker carried no successful request for the interval: it catches an
    /// engine core dead behind a live HTTP server, as Dynamo's canary does.
    Canary,
}

impl CheckKind {
    pub fn label(self) -> &'static str {
        match self {
            CheckKind::Http => "http",
            CheckKind::Canary => "canary",
        }
    }
}

pub const DEFAULT_HTTP_PATH: &str = "/health";
pub const DEFAULT_CANARY_PATH: &str = "/v1/completions";

/// `[health_check]` (or a model's own): HAProxy's `check` defaults.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckSettings {
    pub kind: CheckKind,
    pub path: String,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    /// Passes in a row that bring a worker whose checks failed back up.
    pub rise: u32,
    /// Failures in a row that take a worker down.
    pub fall: u32,
}

impl CheckSettings {
    pub fn new(kind: CheckKind) -> CheckSettings {
        CheckSettings {
            kind,
            path: match kind {
                CheckKind::Http => DEFAULT_HTTP_PATH,
                CheckKind::Canary => DEFAULT_CANARY_PATH,
            }
            .to_string(),
            interval_ms: 2_000,
            timeout_ms: 1_000,
            rise: 2,
            fall: 3,
        }
    }

    /// The check's whole request (it asks for `connection: close`). A canary names
    /// `model` (a JSON string's contents, already escaped).
    pub fn request(&self, host: &str, model: &str) -> Vec<u8> {
        match self.kind {
            CheckKind::Http => format!(
                "GET {} HTTP/1.1\r\nhost: {host}\r\nuser-agent: spillway-check\r\nconnection: close\r\n\r\n",
                self.path
            )
            .into_bytes(),
            CheckKind::Canary => {
                let body =
                    format!(r#"{{"model":"{model}","prompt":"ping","max_tokens":1,"stream":false}}"#);
                format!(
                    "POST {} HTTP/1.1\r\nhost: {host}\r\nuser-agent: spillway-check\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    self.path,
                    body.len()
                )
                .into_bytes()
            }
        }
    }
}

/// Whether an answer with `status` passes.
pub fn passes(status: u16) -> bool {
    (200..300).contains(&status)
}

/// The `result` label of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckResult {
    Passed,
    Failed,
    TimedOut,
}

impl CheckResult {
    pub const ALL: [CheckResult; 3] = [
        CheckResult::Passed,
        CheckResult::Failed,
        CheckResult::TimedOut,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CheckResult::Passed => "passed",
            CheckResult::Failed => "failed",
            CheckResult::TimedOut => "timed_out",
        }
    }
}
