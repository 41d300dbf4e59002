//! The code's shape, checked: the top-level modules of `src/` form layers that only
//! import downward (so the import graph is a DAG), decision code never touches monoio, no
//! function runs over 80 lines and no file over 600, and every path ARCHITECTURE.md names
//! exists. The layer order below is the one ARCHITECTURE.md draws.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules of the library, lowest first: each may import only modules before
/// it in this list.
const ORDER: &[&str] = &[
    // decision code
    "http",
    "shed",
    "admission",
    "route",     // the file and its validation
    "config",    // rustls material, the record layer
    "tls",       // shared state
    "state",     // threads, rings, listeners, clock
    "runtime",   // the access log's writer thread
    "accesslog", // clients of DNS, etcd, NATS
    "fleet",     // what runs on the runtime
    "monitor",
    "metrics",
    "admin",
    "proxy", // the wiring
    "server",
];

/// Pure decision code: no runtime, no sockets.
const DECISION: &[&str] = &[
    "http",
    "shed",
    "admission",
    "route",
    "monitor/load.rs",
    "monitor/evaluate.rs",
];

const MAX_FN_LINES: usize = 80;
const MAX_FILE_LINES: usize = 600;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source with comments and the contents of string and char literals blanked out
/// (same lines, same columns), so braces and paths can be read off plain code.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            loop {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(rest) {
            let open = rest.iter().position(|&c| c == b'"').unwrap() + 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            out.extend_from_slice(&rest[..open]);
            i += open;
            while !b[i..].starts_with(&close) {
                blank(&mut out, b[i]);
                i += 1;
            }
            out.extend_from_slice(&close);
            i += close.len();
        } else if b[i] == b'"' {
            out.push(b'"');
            i += 1;
            while b[i] != b'"' {
                let n = if b[i] == b'\\' { 2 } else { 1 };
                for k in 0..n {
                    blank(&mut out, b[i + k]);
                }
                i += n;
            }
            out.push(b'"');
            i += 1;
        } else if let Some(n) = char_literal_len(rest) {
            out.push(b'\'');
            out.extend(std::iter::repeat_n(b' ', n - 2));
            out.push(b'\'');
            i += n;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// `r"`, `r#"`, `br##"`...: the number of hashes.
fn raw_string_start(s: &[u8]) -> Option<usize> {
    let s = s.strip_prefix(b"b").unwrap_or(s);
    let s = s.strip_prefix(b"r")?;
    let hashes = s.iter().take_while(|&&c| c == b'#').count();
    (s.get(hashes) == Some(&b'"')).then_some(hashes)
}

/// `'x'`, `'\n'`, `'\u{1F600}'`, `'é'`: the literal's length; `None` for lifetimes.
fn char_literal_len(s: &[u8]) -> Option<usize> {
    if s.first() != Some(&b'\'') {
        return None;
    }
    if s.get(1) == Some(&b'\\') {
        return s[2..].iter().position(|&c| c == b'\'').map(|p| p + 3);
    }
    let width = match s.get(1)? {
        c if *c < 0x80 => 1,
        c if *c >= 0xf0 => 4,
        c if *c >= 0xe0 => 3,
        _ => 2,
    };
    (s.get(1 + width) == Some(&b'\'')).then_some(width + 2)
}

/// The part of a file's code that is not test code (`#[cfg(test)]` and what follows).
fn non_test(code: &str) -> &str {
    code.split("#[cfg(test)]").next().unwrap_or(code)
}

/// The top-level module a file of `src/` belongs to.
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// Top-level modules named after `crate::` in `code`.
fn crate_imports(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 0 => {
                        found.insert(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident(rest));
        }
    }
    found.retain(|m| !m.is_empty());
    found
}

#[test]
fn layers_only_import_downward() {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut problems = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        if matches!(
            rel.to_str(),
            Some("lib.rs" | "main.rs" | "cli.rs" | "demo.rs")
        ) || rel.ends_with("tests.rs")
        {
            continue;
        }
        let top = top_module(&src, file);
        let Some(rank) = ORDER.iter().position(|m| *m == top) else {
            problems.push(format!(
                "{}: module `{top}` is not in the layer order",
                rel.display()
            ));
            continue;
        };
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        for import in crate_imports(non_test(&code)) {
            match ORDER.iter().position(|m| *m == import) {
                Some(r) if r <= rank => {}
                Some(_) => problems.push(format!(
                    "{}: `{top}` imports `{import}`, a layer above it",
                    rel.display()
                )),
                None => problems.push(format!(
                    "{}: imports unknown `crate::{import}`",
                    rel.display()
                )),
            }
        }
        let decision = DECISION.iter().any(|d| rel.starts_with(d));
        if decision && code.contains("monoio") {
            problems.push(format!("{}: decision code uses monoio", rel.display()));
        }
    }
    assert!(
        problems.is_empty(),
        "upward or unknown imports:\n{}",
        problems.join("\n")
    );
}

/// Functions whose body runs over [`MAX_FN_LINES`] lines (from the `fn` line to the
/// closing brace), as `file:line name (lines)`.
fn long_functions(rel: &Path, code: &str) -> Vec<String> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let mut depth = 0i32;
        let mut opened = false;
        for (end, l) in lines.iter().enumerate().skip(start) {
            if !opened && l.contains(';') && !l.contains('{') {
                break;
            }
            for c in l.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth == 0 {
                let n = end - start + 1;
                if n > MAX_FN_LINES {
                    out.push(format!(
                        "{}:{} {name} ({n} lines)",
                        rel.display(),
                        start + 1
                    ));
                }
                break;
            }
        }
    }
    out
}

/// The name of the function a line declares.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    loop {
        let before = rest;
        for prefix in ["pub ", "const ", "async ", "unsafe ", "extern \"C\" "] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        if rest.starts_with("pub(") {
            rest = rest.split_once(") ").map_or(rest, |(_, r)| r);
        }
        if rest == before {
            break;
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    Some(
        rest.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect(),
    )
}

#[test]
fn functions_and_files_stay_short() {
    let mut problems = Vec::new();
    for dir in ["src", "mock/src", "testkit/src"] {
        let dir = root().join(dir);
        if !dir.exists() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        for file in files {
            let rel = file.strip_prefix(root()).unwrap().to_path_buf();
            let text = std::fs::read_to_string(&file).unwrap();
            let n = text.lines().count();
            if n > MAX_FILE_LINES {
                problems.push(format!("{}: {n} lines", rel.display()));
            }
            problems.extend(long_functions(&rel, &code_only(&text)));
        }
    }
    assert!(
        problems.is_empty(),
        "too long (functions {MAX_FN_LINES} lines, files {MAX_FILE_LINES}):\n{}",
        problems.join("\n")
    );
}

/// Where a path ARCHITECTURE.md names may be: from the repository root, from `src/`, or
/// (a bare file or folder name) inside the folder it last named.
fn resolve_doc_path(quoted: &str, folder: &Path) -> Option<PathBuf> {
    [root(), root().join("src"), folder.to_path_buf()]
        .into_iter()
        .map(|base| base.join(quoted))
        .find(|p| p.exists())
}

#[test]
fn architecture_md_names_only_paths_that_exist() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    let mut folder = root();
    for (i, quoted) in text.split('`').enumerate() {
        let is_path = i % 2 == 1
            && !quoted.contains(' ')
            && (quoted.ends_with(".rs") || quoted.ends_with('/') || quoted.ends_with(".md"));
        if !is_path {
            continue;
        }
        match resolve_doc_path(quoted, &folder) {
            Some(p) if p.is_dir() => folder = p,
            Some(_) => {}
            None => missing.push(quoted.to_string()),
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn the_checker_sees_through_strings_and_comments() {
    let code = code_only(
        "let s = \"crate::proxy {\"; // crate::server }\nlet r = r#\"}\"#; let c = '{';\n/* { */ fn f<'a>(x: &'a str) {}\n",
    );
    assert!(crate_imports(&code).is_empty(), "{code}");
    assert_eq!(code.matches('{').count(), 1, "{code}");
    assert_eq!(
        crate_imports("use crate::{http::Span, state::{Shared, Snapshot}};\nuse crate::proxy::x;"),
        ["http", "proxy", "state"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    let long = format!(
        "fn long() {{\n{}}}\nfn short() {{}}\n",
        "    x();\n".repeat(80)
    );
    assert_eq!(
        long_functions(Path::new("f.rs"), &long),
        ["f.rs:1 long (82 lines)"]
    );
    assert_eq!(fn_name("    pub(crate) async fn go<F>("), Some("go".into()));
    assert_eq!(fn_name("    let f = 1;"), None);
}
