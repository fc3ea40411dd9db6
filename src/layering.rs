//! The module graph reads one way: every `crate::` path in a top-level module's production
//! code names a module of a lower layer (see the crate docs), and no module names a path
//! it is forbidden (`FORBIDDEN`).
//!
//! Production code is the whole of every file under `src/` except test code: items under
//! `#[cfg(test)]` (a braced `mod x { .. }` matched to its closing brace, or a `mod x;`
//! declaration whose file is then skipped too), files named `tests.rs`, `tests_*.rs` or
//! `*_tests.rs` or under a `tests/` directory, and comments. String and character literals
//! are blanked before braces are matched. `sizes` reads the same production code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The layers, lowest first; a module may use modules of lower layers only.
const LAYERS: &[&[&str]] = &[
    &["clock", "sharded"],
    // `regions`: the cross-region rule as pure functions; it imports nothing of the gateway.
    &["limiter", "regions"],
    &["adaptive"],
    // JWT verification: self-contained, it imports only `sharded` of the gateway; the config
    // builds its settings and identity reads its token shape.
    // envoyproxy/ratelimit's YAML descriptors, loaded and matched: pure, it imports
    // nothing of the gateway; the config loads it and the rate-limit service matches it.
    &["auth", "descriptors"],
    &["config"],
    &[
        "metrics",
        "client_ip",
        "blocklist",
        "bans",
        "identity",
        "lifecycle",
        "demo",
        "top",
        "access_log",
        "otlp",
        "violations",
    ],
    &["store", "db", "routing"],
    &["admission"],
    &["reply", "reload", "upstream_health"],
    // The transport-neutral HTTP edge every HTTP adapter calls.
    &["edge"],
    // What the Pingora listeners share: the connection guard and the peer's address.
    &["listener"],
    // The adapters: none imports another.
    &["proxy", "admin", "sync", "rls", "layer"],
    &["server", "simulate"],
];

/// (module, path prefix it must not name), on top of the layers: the admission pipeline
/// reads the database only through its snapshot and the store only through `LimitStore`,
/// so it names neither PostgreSQL records nor the Redis store.
const FORBIDDEN: &[(&str, &[&str])] = &[("admission", &["db"]), ("admission", &["store", "redis"])];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// One production file under `src/`.
pub(crate) struct Source {
    /// The path from `src/`, e.g. `limiter/algorithm/mod.rs`.
    pub(crate) rel: PathBuf,
    pub(crate) code: Code,
}

impl Source {
    /// The top-level module the file belongs to (`lib` and `main` for the crate roots).
    pub(crate) fn module(&self) -> String {
        let first = self.rel.components().next().expect("a file under src/");
        let first = first.as_os_str().to_string_lossy();
        first.strip_suffix(".rs").unwrap_or(&first).to_string()
    }
}

/// A file's production code: the source with comments, literals and test items blanked
/// (every byte but a newline turned into a space, so offsets and line numbers hold).
pub(crate) struct Code {
    pub(crate) text: String,
    /// Lines not wholly inside a test item.
    pub(crate) production_lines: usize,
    /// Files of `#[cfg(test)] mod x;` declarations: the module name, or its `#[path]`.
    test_mods: Vec<TestMod>,
}

enum TestMod {
    Named(String),
    Path(String),
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Blanks `from..to` of `out`, newlines kept.
fn blank(out: &mut [u8], from: usize, to: usize) {
    let to = to.min(out.len());
    for b in &mut out[from..to] {
        if *b != b'\n' {
            *b = b' ';
        }
    }
}

/// Where the literal or comment starting at `i` ends, if one starts there.
fn literal_end(s: &[u8], i: usize) -> Option<usize> {
    let at = |k: usize| s.get(k).copied().unwrap_or(0);
    let prev_ident = i > 0 && is_ident(s[i - 1]);
    match s[i] {
        b'/' if at(i + 1) == b'/' => Some(
            s[i..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(s.len(), |n| i + n),
        ),
        b'/' if at(i + 1) == b'*' => {
            let (mut depth, mut k) = (1, i + 2);
            while k < s.len() && depth > 0 {
                if s[k] == b'/' && at(k + 1) == b'*' {
                    depth += 1;
                    k += 1;
                } else if s[k] == b'*' && at(k + 1) == b'/' {
                    depth -= 1;
                    k += 1;
                }
                k += 1;
            }
            Some(k)
        }
        b'r' if !prev_ident || (s[i - 1] == b'b' && (i < 2 || !is_ident(s[i - 2]))) => {
            let hashes = s[i + 1..].iter().take_while(|&&b| b == b'#').count();
            if at(i + 1 + hashes) != b'"' {
                return None;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let body = i + 2 + hashes;
            let end = s[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice());
            Some(end.map_or(s.len(), |n| body + n + close.len()))
        }
        b'"' => {
            let mut k = i + 1;
            while k < s.len() && s[k] != b'"' {
                k += if s[k] == b'\\' { 2 } else { 1 };
            }
            Some(k + 1)
        }
        b'\'' if at(i + 1) == b'\\' => s[i + 3..]
            .iter()
            .position(|&b| b == b'\'')
            .map(|n| i + 3 + n + 1),
        b'\'' => {
            // A character literal, or else a lifetime or a label (left as code).
            let ch = std::str::from_utf8(&s[i + 1..(i + 5).min(s.len())])
                .or_else(|e| std::str::from_utf8(&s[i + 1..i + 1 + e.valid_up_to()]))
                .ok()?
                .chars()
                .next()?;
            let after = i + 1 + ch.len_utf8();
            (at(after) == b'\'').then_some(after + 1)
        }
        _ => None,
    }
}

/// The source with comments and string and character literals blanked.
fn without_literals(source: &str) -> Vec<u8> {
    let s = source.as_bytes();
    let mut out = s.to_vec();
    let mut i = 0;
    while i < s.len() {
        match literal_end(s, i) {
            Some(end) => {
                blank(&mut out, i, end);
                i = end.max(i + 1);
            }
            None => i += 1,
        }
    }
    out
}

/// The end of the item starting at `i` (after its attributes): past its `;`, or past the
/// brace closing its first block, whichever comes first outside `()` and `[]`.
fn item_end(c: &[u8], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < c.len() {
        match c[i] {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth = depth.saturating_sub(1),
            b';' if depth == 0 => return i + 1,
            b'{' if depth == 0 => return close_brace(c, i),
            _ => {}
        }
        i += 1;
    }
    c.len()
}

/// Past the brace closing the one at `open`.
pub(crate) fn close_brace(c: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, &b) in c.iter().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    c.len()
}

/// Past the attributes (`#[..]`) and whitespace starting at `i`.
fn skip_attributes(c: &[u8], mut i: usize) -> usize {
    loop {
        while i < c.len() && c[i].is_ascii_whitespace() {
            i += 1;
        }
        if !c[i..].starts_with(b"#[") {
            return i;
        }
        let mut depth = 0usize;
        while i < c.len() {
            match c[i] {
                b'[' => depth += 1,
                b']' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        i += 1;
    }
}

/// The `mod x;` declaration of a test item's head, as the file it names.
fn test_mod(source: &str, code: &[u8], attrs: usize, head: usize, end: usize) -> Option<TestMod> {
    let words = std::str::from_utf8(&code[head..end]).ok()?;
    let mut words = words
        .split(|c: char| !is_ident(c as u8) && c != ';')
        .filter(|w| !w.is_empty());
    let name = loop {
        match words.next()? {
            "pub" | "crate" | "super" | "self" | "in" => continue,
            "mod" => break words.next()?.trim_end_matches(';'),
            _ => return None,
        }
    };
    if !code[head..end].ends_with(b";") {
        return None;
    }
    let attributes = &source[attrs..head];
    if let Some(at) = attributes.find("#[path") {
        let quoted = attributes[at..].split('"').nth(1)?;
        return Some(TestMod::Path(quoted.to_string()));
    }
    Some(TestMod::Named(name.to_string()))
}

/// A file's production code.
pub(crate) fn code(source: &str) -> Code {
    let mut c = without_literals(source);
    let mut test = vec![false; c.len() + 1];
    let mut test_mods = Vec::new();
    if find(&c, b"#![cfg(test)]", 0).is_some() {
        test.iter_mut().for_each(|t| *t = true);
        blank(&mut c, 0, source.len());
    }
    let mut from = 0;
    while let Some(at) = find(&c, b"#[cfg(test)]", from) {
        let attrs_end = at + "#[cfg(test)]".len();
        let head = skip_attributes(&c, attrs_end);
        let end = item_end(&c, head);
        test_mods.extend(test_mod(source, &c, attrs_end, head, end));
        let line_start = c[..at]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |n| n + 1);
        let start = if c[line_start..at].iter().all(u8::is_ascii_whitespace) {
            line_start
        } else {
            at
        };
        test[start..end].iter_mut().for_each(|t| *t = true);
        blank(&mut c, at, end);
        from = end;
    }
    let mut production_lines = 0;
    let mut line_start = 0;
    for (k, &b) in c.iter().enumerate() {
        if b == b'\n' {
            production_lines += usize::from(!test[line_start]);
            line_start = k + 1;
        }
    }
    if line_start < c.len() {
        production_lines += usize::from(!test[line_start]);
    }
    Code {
        text: String::from_utf8_lossy(&c).into_owned(),
        production_lines,
        test_mods,
    }
}

fn find(c: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    c.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|n| from + n)
}

/// Test files by name: `tests.rs`, `tests_*.rs`, `*_tests.rs`, anything under `tests/`.
fn test_file(rel: &Path) -> bool {
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    name == "tests.rs"
        || name.starts_with("tests_")
        || name.ends_with("_tests.rs")
        || rel
            .parent()
            .is_some_and(|p| p.components().any(|c| c.as_os_str() == "tests"))
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rs_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Where the children of the module in `rel` live.
fn children_dir(rel: &Path) -> PathBuf {
    let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
    match rel.file_stem().map(|s| s.to_string_lossy().to_string()) {
        Some(s) if s == "mod" || s == "lib" || s == "main" => parent,
        Some(s) => parent.join(s),
        None => parent,
    }
}

/// Every production file under `src/`, sorted by path.
pub(crate) fn production_files() -> Vec<Source> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rs_files(&src, &mut paths);
    paths.sort();
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    for path in paths {
        let rel = path.strip_prefix(&src).unwrap().to_path_buf();
        if test_file(&rel) {
            continue;
        }
        let code = code(&std::fs::read_to_string(&path).unwrap());
        for m in &code.test_mods {
            let (file, dir) = match m {
                TestMod::Named(name) => {
                    let dir = children_dir(&rel).join(name);
                    (dir.with_extension("rs"), Some(dir))
                }
                TestMod::Path(p) => (rel.parent().unwrap_or(Path::new("")).join(p), None),
            };
            skipped.push(file);
            skipped.extend(dir);
        }
        files.push(Source { rel, code });
    }
    files.retain(|f| !skipped.iter().any(|s| f.rel.starts_with(s)));
    files
}

/// Every path `crate::` names in `code`, as its segments, with `use` groups expanded
/// (`crate::store::{redis::RedisStore, self}` names `store::redis::RedisStore` and `store`).
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let c = code.as_bytes();
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && is_ident(c[at - 1]) {
            continue;
        }
        let mut i = at + "crate::".len();
        use_tree(c, &mut i, Vec::new(), &mut out);
    }
    out
}

fn use_tree(c: &[u8], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let skip_ws = |i: &mut usize| {
        while *i < c.len() && c[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    skip_ws(i);
    if c.get(*i) == Some(&b'{') {
        *i += 1;
        loop {
            skip_ws(i);
            if *i >= c.len() || c[*i] == b'}' {
                *i += 1;
                return;
            }
            use_tree(c, i, prefix.clone(), out);
            skip_ws(i);
            match c.get(*i) {
                Some(b',') => *i += 1,
                Some(b'}') => {}
                _ => return,
            }
        }
    }
    if c.get(*i) == Some(&b'*') {
        *i += 1;
        out.push(prefix);
        return;
    }
    let ident = ident_at(c, i);
    if ident.is_empty() || ident == "self" {
        out.push(prefix);
        skip_alias(c, i);
        return;
    }
    let mut path = prefix;
    path.push(ident);
    skip_ws(i);
    if c[*i..].starts_with(b"::") && !c[*i + 2..].trim_ascii_start().starts_with(b"<") {
        *i += 2;
        use_tree(c, i, path, out);
    } else {
        out.push(path);
        skip_alias(c, i);
    }
}

/// The identifier at `i` (empty if none), moving past it.
fn ident_at(c: &[u8], i: &mut usize) -> String {
    let start = *i;
    while *i < c.len() && is_ident(c[*i]) {
        *i += 1;
    }
    String::from_utf8_lossy(&c[start..*i]).to_string()
}

/// Past ` as name`, if that follows `i`.
fn skip_alias(c: &[u8], i: &mut usize) {
    let mut k = *i;
    while k < c.len() && c[k].is_ascii_whitespace() {
        k += 1;
    }
    if ident_at(c, &mut k) == "as" {
        while k < c.len() && c[k].is_ascii_whitespace() {
            k += 1;
        }
        ident_at(c, &mut k);
        *i = k;
    }
}

/// (file's top-level module, path it names) for every production `crate::` path.
fn imports() -> BTreeSet<(String, Vec<String>, PathBuf)> {
    let mut out = BTreeSet::new();
    for file in production_files() {
        let module = file.module();
        if matches!(module.as_str(), "lib" | "main") {
            continue;
        }
        for path in crate_paths(&file.code.text) {
            out.insert((module.clone(), path, file.rel.clone()));
        }
    }
    out
}

#[test]
fn imports_only_run_down() {
    let all: BTreeSet<(String, String)> = imports()
        .into_iter()
        .filter_map(|(from, path, _)| path.first().map(|to| (from, to.clone())))
        .filter(|(from, to)| from != to)
        .collect();
    assert!(all.len() > 20, "too few imports found: {all:?}");
    let mut wrong = Vec::new();
    for (from, to) in &all {
        match (layer(from), layer(to)) {
            (Some(a), Some(b)) if b < a => {}
            (None, _) => wrong.push(format!("{from} is in no layer")),
            (_, None) => wrong.push(format!("{to} (used by {from}) is in no layer")),
            _ => wrong.push(format!("{from} -> {to} runs up or sideways")),
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn forbidden_imports() {
    let mut wrong = BTreeSet::new();
    for (from, path, file) in imports() {
        for (module, prefix) in FORBIDDEN {
            if from == *module
                && path.starts_with(&prefix.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            {
                wrong.insert(format!(
                    "src/{}: crate::{}",
                    file.display(),
                    path.join("::")
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "forbidden imports: {wrong:#?}");
}

mod extractor {
    use super::*;

    /// (source, text the production code keeps, text it drops).
    const CASES: &[(&str, &[&str], &[&str])] = &[
        (
            "use crate::clock;\n#[cfg(test)]\nmod tests {\n    use crate::server;\n}\nuse crate::server::Up;\n",
            &["crate::clock", "crate::server::Up"],
            &["crate::server;"],
        ),
        (
            "// use crate::a;\n/* use crate::b; /* nested */ use crate::c; */\nuse crate::d;\n",
            &["crate::d"],
            &["crate::a", "crate::b", "crate::c"],
        ),
        (
            "#[cfg(test)]\nmod t {\n    const S: &str = \"}}}\";\n    const C: char = '}';\n    const R: &str = r#\"}\"#;\n}\nuse crate::after;\n",
            &["crate::after"],
            &["const S", "const C", "const R"],
        ),
        (
            "fn f<'a>(x: &'a str) -> &'a str { x }\n#[cfg(test)]\nmod tests;\nuse crate::after;\n",
            &["fn f<'a>", "crate::after"],
            &["mod tests"],
        ),
        (
            "#[cfg(test)]\n#[allow(dead_code)]\npub(super) fn read(x: [u8; 3]) { let _ = x; }\nfn kept() {}\n",
            &["fn kept"],
            &["fn read"],
        ),
        (
            "const Q: char = '\\'';\nconst B: &[u8] = b\"{\";\nuse crate::after;\n",
            &["crate::after"],
            &["{"],
        ),
    ];

    #[test]
    fn test_code_and_comments_are_dropped() {
        for (source, kept, dropped) in CASES {
            let code = code(source).text;
            for k in *kept {
                assert!(code.contains(k), "{k:?} lost from {source:?}:\n{code}");
            }
            for d in *dropped {
                assert!(!code.contains(d), "{d:?} kept from {source:?}:\n{code}");
            }
            assert_eq!(code.lines().count(), source.lines().count(), "{source:?}");
        }
    }

    #[test]
    fn an_upward_import_after_a_test_module_is_caught() {
        let source = "use crate::clock;\n#[cfg(test)]\nmod tests {}\nuse crate::server::Up;\n";
        let paths = crate_paths(&code(source).text);
        assert!(
            paths.contains(&vec!["server".to_string(), "Up".to_string()]),
            "{paths:?}"
        );
    }

    #[test]
    fn production_lines_skip_test_items_only() {
        let cases = [
            (
                "fn a() {}\n\n#[cfg(test)]\nmod tests {\n    fn b() {}\n}\nfn c() {}\n",
                3,
            ),
            ("fn a() {}\n#[cfg(test)]\nmod tests;\n", 1),
            ("#![cfg(test)]\nfn a() {}\n", 0),
            ("fn a() {}\n", 1),
        ];
        for (source, lines) in cases {
            assert_eq!(code(source).production_lines, lines, "{source:?}");
        }
    }

    #[test]
    fn use_groups_are_expanded() {
        let cases: &[(&str, &[&str])] = &[
            ("use crate::db;", &["db"]),
            ("use crate::store::{redis, memory::Mem};", &["store::redis", "store::memory::Mem"]),
            (
                "use crate::{\n    store::{self, redis::{RedisStore as R, wire}},\n    clock::*,\n};",
                &["store", "store::redis::RedisStore", "store::redis::wire", "clock"],
            ),
            ("let x = crate::db::keys::load::<u8>(1);", &["db::keys::load"]),
            ("let x = $crate::clock::now();", &["clock::now"]),
            ("let notcrate::x = 1;", &[]),
        ];
        for (source, want) in cases {
            let got: Vec<String> = crate_paths(source).iter().map(|p| p.join("::")).collect();
            assert_eq!(got, *want, "{source:?}");
        }
    }
}
