//! Outside tools some tests need (promtool, the Python `openai` package): a test skips
//! where its tool is missing, and fails instead under CI.

use std::ffi::OsStr;
use std::fmt::Display;

/// Whether this is a CI run: `CI` is set, non-empty, and neither `0` nor `false`.
pub fn in_ci() -> bool {
    says_ci(std::env::var_os("CI").as_deref())
}

fn says_ci(value: Option<&OsStr>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// Called when `tool` cannot run (`why` says what failed): panics under CI ([`in_ci`]),
/// else prints that the test is skipped; the caller then returns without checking.
#[track_caller]
pub fn skip_missing_tool(tool: &str, why: impl Display) {
    assert!(
        !in_ci(),
        "{tool} is required when CI is set but is not available ({why})"
    );
    eprintln!("skipping: {tool} is not available ({why})");
}

/// The Python interpreter the tests use (`SPILLWAY_PYTHON`, else `python3`) when it can
/// import `module`; `None` (the test then returns) after [`skip_missing_tool`] otherwise.
pub fn python_with(module: &str) -> Option<String> {
    let python = std::env::var("SPILLWAY_PYTHON").unwrap_or_else(|_| "python3".into());
    let imports = std::process::Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !imports {
        skip_missing_tool(
            &format!("the {module} Python package"),
            format_args!("`{python} -c 'import {module}'` fails"),
        );
        return None;
    }
    Some(python)
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then let go),
/// for servers that must be told their port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A new empty directory under the system's temp dir, named `spillway-<what>-<pid>-<n>`
/// (unique within the process); the caller removes it.
pub fn scratch_dir(what: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "spillway-{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[cfg(test)]
mod tests {
    use super::says_ci;
    use std::ffi::OsStr;

    #[test]
    fn ci_is_any_value_but_empty_zero_or_false() {
        for (value, ci) in [
            (None, false),
            (Some(""), false),
            (Some("0"), false),
            (Some("false"), false),
            (Some("FALSE"), false),
            (Some("1"), true),
            (Some("true"), true),
            (Some("yes"), true),
        ] {
            assert_eq!(says_ci(value.map(OsStr::new)), ci, "CI={value:?}");
        }
    }
}
