//! The admin listener: calls, `/metrics` and its lint.

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use crate::client::{Response, once};
use crate::tools::skip_missing_tool;

/// One admin request on a fresh connection; `content_type` only when given.
pub fn admin_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> Response {
    let ct = content_type
        .map(|c| format!("content-type: {c}\r\n"))
        .unwrap_or_default();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nhost: admin\r\n{ct}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    once(addr, raw.as_bytes())
}

/// A POST with a JSON body.
pub fn admin_post(addr: SocketAddr, path: &str, body: &str) -> Response {
    admin_call(addr, "POST", path, Some("application/json"), body)
}

/// A GET.
pub fn admin_get(addr: SocketAddr, path: &str) -> Response {
    admin_call(addr, "GET", path, None, "")
}

/// The `/metrics` text.
pub fn metrics(addr: SocketAddr) -> String {
    admin_get(addr, "/metrics").text()
}

/// The value of one series in a metrics text (`name{labels}` exactly as rendered).
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l[series.len()..].trim().parse().ok())
}

/// One series' value, scraped now from the admin listener at `admin`.
pub fn scrape(admin: SocketAddr, series: &str) -> Option<f64> {
    metric_value(&metrics(admin), series)
}

/// The sum of every labelled series of `family` on the admin port, and how many there are.
pub fn scrape_family(admin: SocketAddr, family: &str) -> (f64, usize) {
    let prefix = format!("{family}{{");
    let values: Vec<f64> = (metrics(admin).lines())
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (values.iter().sum(), values.len())
}

/// Waits (up to 10 s) until `worker`'s slots, queue and in-flight count and `model`'s
/// in-flight count are all back to zero: whatever happened, every slot was given back.
pub fn counters_back_to_zero(admin: SocketAddr, model: &str, worker: &str) {
    let series = [
        format!("dynamo_engine_request{{worker=\"{worker}\"}}"),
        format!("dynamo_request_queue{{worker=\"{worker}\"}}"),
        format!("spillway_worker_inflight_requests{{worker=\"{worker}\"}}"),
        format!("dynamo_frontend_inflight_requests{{model=\"{model}\"}}"),
    ];
    crate::wait::eventually(
        "every counter back to zero",
        std::time::Duration::from_secs(10),
        || {
            let m = metrics(admin);
            series.iter().all(|s| metric_value(&m, s) == Some(0.0))
        },
    );
}

/// `promtool check metrics` over `text`: the problems it reports (empty when it passes),
/// or `None` when promtool cannot run (a failure instead under CI, see
/// [`skip_missing_tool`]).
#[track_caller]
pub fn promtool_problems(text: &str) -> Option<Vec<String>> {
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            skip_missing_tool("promtool", e);
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let problems: Vec<String> = report
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    if !out.status.success() && problems.is_empty() {
        return Some(vec![format!("promtool failed: {}", out.status)]);
    }
    Some(problems)
}
