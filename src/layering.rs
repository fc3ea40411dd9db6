//! The module graph reads one way: every `crate::` path in a top-level module's code
//! (comments and test modules aside) names a module of a lower layer (see the crate docs).

use std::collections::BTreeSet;
use std::path::Path;

/// The layers, lowest first; a module may use modules of lower layers only.
const LAYERS: &[&[&str]] = &[
    &["clock", "sharded"],
    &["limiter"],
    &["adaptive"],
    // JWT verification: self-contained, it imports nothing of the gateway; the config
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

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Code of a file: comments and `#[cfg(test)]` modules removed.
fn code(source: &str) -> String {
    let without_tests = match source.find("#[cfg(test)]") {
        Some(i) => &source[..i],
        None => source,
    };
    without_tests
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// (file's top-level module, module it names) for every `crate::x` in `src/`.
fn edges(dir: &Path, top: Option<&str>, out: &mut BTreeSet<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            edges(&path, Some(top.unwrap_or(&name)), out);
            continue;
        }
        let module = top.unwrap_or(&name).to_string();
        if matches!(module.as_str(), "lib" | "main" | "layering") || name == "tests" {
            continue;
        }
        let src = code(&std::fs::read_to_string(&path).unwrap());
        for (i, _) in src.match_indices("crate::") {
            let named: String = src[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if named != module {
                out.insert((module.clone(), named));
            }
        }
    }
}

#[test]
fn imports_only_run_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = BTreeSet::new();
    edges(&src, None, &mut all);
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
