//! The code's shape, checked: the top-level modules of `src/` form layers that only
//! import downward (so the import graph is a DAG), no file of `src/` or `mock/src/`
//! imports one that imports it back (directly or around a loop), decision code never
//! touches monoio, no function runs over 80 lines and no file over 600, and every path
//! ARCHITECTURE.md names exists. The layer order below is the one ARCHITECTURE.md draws.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules of the library, lowest first: each may import only modules before
/// it in this list.
const ORDER: &[&str] = &[
    "http",      // decision code: the HTTP/1.1 codec,
    "shed",      // the busy rule,
    "admission", // the admission gate,
    "route",     // the router,
    "health",    // outlier ejection and checks
    "config",    // the file and its validation
    "tls",       // rustls material, the record layer
    "state",     // shared state
    "runtime",   // threads, rings, listeners, clock, streams
    "accesslog", // the access log's writer thread
    "fleet",     // clients of DNS, etcd, NATS
    "monitor",   // what runs on the runtime: the monitor,
    "metrics",   // the exposition,
    "admin",     // the admin listener,
    "proxy",     // the data path
    "server",    // the wiring
];

/// Pure decision code: no runtime, no sockets.
const DECISION: &[&str] = &[
    "http",
    "shed",
    "admission",
    "route",
    "health",
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

/// A file's module path in its crate (`proxy/conn.rs` → `proxy::conn`; `mod.rs`,
/// `lib.rs` and `main.rs` are their folder's module).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if path
        .last()
        .is_some_and(|l| matches!(l.as_str(), "mod" | "lib" | "main"))
    {
        path.pop();
    }
    path
}

/// Every path a use tree starting at `rest` names, after `base` (`a::b`, `a::{b, c::d}`,
/// nested groups); each path as far as it reads.
fn use_tree(base: &[String], rest: &str, out: &mut Vec<Vec<String>>) {
    let mut path = base.to_vec();
    let mut rest = rest;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            for item in split_group(group) {
                use_tree(&path, item.trim(), out);
            }
            return;
        }
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            break;
        }
        rest = &rest[ident.len()..];
        path.push(ident);
        match rest.strip_prefix("::") {
            Some(r) => rest = r.trim_start(),
            None => break,
        }
    }
    out.push(path);
}

/// The top-level items of a `{...}` group (its closing brace ends it).
fn split_group(group: &str) -> Vec<&str> {
    let (mut depth, mut start, mut items) = (0, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
}

/// Module paths that `code` (of module `module`) names: `crate::…`, `super::…`, `self::…`.
fn named_modules(module: &[String], code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let word_start =
        |at: usize| at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
    for (at, _) in code
        .match_indices("crate::")
        .filter(|(at, _)| word_start(*at))
    {
        use_tree(&[], &code[at + 7..], &mut out);
    }
    for (at, _) in code
        .match_indices("super::")
        .filter(|(at, _)| word_start(*at))
    {
        if at >= 7 && &code[at - 7..at] == "super::" {
            continue; // counted from the first `super::` of a chain
        }
        let mut rest = &code[at..];
        let mut up = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            up += 1;
            rest = r;
        }
        let base = &module[..module.len().saturating_sub(up)];
        use_tree(base, rest, &mut out);
    }
    for (at, _) in code
        .match_indices("self::")
        .filter(|(at, _)| word_start(*at))
    {
        use_tree(module, &code[at + 6..], &mut out);
    }
    out
}

/// Files (by module path) in import cycles: each strongly connected component of two or
/// more files of `crate_files` (module path, code). An import is a path naming another
/// file's module or an item in it; a module's own descendants do not count (its file
/// declares them).
fn file_cycles(crate_files: &[(Vec<String>, String)]) -> Vec<Vec<String>> {
    let mods: BTreeSet<&Vec<String>> = crate_files.iter().map(|(m, _)| m).collect();
    let resolve = |path: &[String]| {
        (1..=path.len())
            .rev()
            .find_map(|n| mods.get(&path[..n].to_vec()).copied())
    };
    let index: Vec<&Vec<String>> = mods.iter().copied().collect();
    let pos = |m: &Vec<String>| index.iter().position(|x| *x == m).unwrap();
    let mut edges = vec![BTreeSet::new(); index.len()];
    for (m, code) in crate_files {
        for path in named_modules(m, non_test(&code_only(code))) {
            if let Some(t) = resolve(&path).filter(|t| *t != m && !t.starts_with(m)) {
                edges[pos(m)].insert(pos(t));
            }
        }
    }
    strongly_connected(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| c.iter().map(|&i| index[i].join("/")).collect())
        .collect()
}

/// Tarjan's strongly connected components of a graph of `edges.len()` nodes.
fn strongly_connected(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct Walk<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(w: &mut Walk<'_>, v: usize) {
        w.index[v] = Some(w.next);
        w.low[v] = w.next;
        w.next += 1;
        w.stack.push(v);
        w.on_stack[v] = true;
        for &t in w.edges[v].iter() {
            match w.index[t] {
                None => {
                    visit(w, t);
                    w.low[v] = w.low[v].min(w.low[t]);
                }
                Some(i) if w.on_stack[t] => w.low[v] = w.low[v].min(i),
                Some(_) => {}
            }
        }
        if Some(w.low[v]) == w.index[v] {
            let mut component = Vec::new();
            while let Some(t) = w.stack.pop() {
                w.on_stack[t] = false;
                component.push(t);
                if t == v {
                    break;
                }
            }
            w.out.push(component);
        }
    }
    let n = edges.len();
    let mut w = Walk {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if w.index[v].is_none() {
            visit(&mut w, v);
        }
    }
    w.out
}

#[test]
fn no_file_imports_one_that_imports_it_back() {
    let mut problems = Vec::new();
    for dir in ["src", "mock/src"] {
        let src = root().join(dir);
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let crate_files: Vec<(Vec<String>, String)> = files
            .iter()
            .map(|f| (module_of(&src, f), std::fs::read_to_string(f).unwrap()))
            .collect();
        for cycle in file_cycles(&crate_files) {
            problems.push(format!("{dir}: {}", cycle.join(" → ")));
        }
    }
    assert!(
        problems.is_empty(),
        "files that import each other around a loop (imports point down only):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_cycle_checker_finds_a_loop() {
    let file = |m: &str, code: &str| {
        let path = m.split('/').map(String::from).collect::<Vec<_>>();
        (path, code.to_string())
    };
    let files = [
        file("a", "use super::b::B;"),
        file("a/inner", "use crate::c::{self, d::D};"),
        file("b", "use crate::{c::C, e};"),
        file("c", "fn f() { super::a::x(); }"),
        file("d", "// crate::a\n#[cfg(test)]\nuse crate::a;"),
        file("e", "pub struct E;"),
    ];
    // a → b → c → a (through a child and a parent); d's imports are a comment and a test.
    assert_eq!(file_cycles(&files), [["c", "b", "a"].map(String::from)]);
    assert!(file_cycles(&files[3..]).is_empty());
}

/// Every document the code names exists, and every section of `docs/behaviour.md` it
/// cites (`§N` a section, `§N.M` an item) is there: no citation of what the repository
/// does not carry.
#[test]
fn cited_documents_and_sections_exist() {
    let behaviour = std::fs::read_to_string(root().join("docs/behaviour.md")).unwrap();
    let exists = |section: &str| match section.split_once('.') {
        None => behaviour.contains(&format!("\n## {section}. ")),
        Some(_) => behaviour.contains(&format!("\n**{section} ")),
    };
    let mut problems = Vec::new();
    for dir in ["src", "tests", "mock/src", "testkit/src"] {
        let mut files = Vec::new();
        rust_files(&root().join(dir), &mut files);
        for file in files {
            let rel = file.strip_prefix(root()).unwrap().display().to_string();
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                for doc in documents_named(line) {
                    if !root().join(doc).exists() {
                        problems.push(format!("{rel}:{}: `{doc}` is not in the repository", n + 1));
                    }
                }
                if !line.contains("docs/behaviour.md") {
                    continue;
                }
                for section in sections_cited(line).filter(|s| !s.is_empty() && !exists(s)) {
                    problems.push(format!(
                        "{rel}:{}: docs/behaviour.md has no §{section}",
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "dangling citations:\n{}",
        problems.join("\n")
    );
}

/// The `*.md` paths a line names.
fn documents_named(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
        .filter(|w| w.ends_with(".md") && w.len() > 3)
}

/// The sections (`4`, `4.7`) a line cites with `§`.
fn sections_cited(line: &str) -> impl Iterator<Item = &str> {
    line.split('§').skip(1).map(|rest| {
        let end = rest
            .char_indices()
            .find(|&(i, c)| {
                !(c.is_ascii_digit()
                    || (c == '.' && rest[i + 1..].starts_with(|d: char| d.is_ascii_digit())))
            })
            .map_or(rest.len(), |(i, _)| i);
        &rest[..end]
    })
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
