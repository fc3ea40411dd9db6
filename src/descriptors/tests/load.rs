//! Loading: every error at its position, input bounds, files and directories.

use std::path::{Path, PathBuf};

use super::super::*;
use super::parse;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rls")
        .join(name)
}

/// Every load error, with the position of the offending field or descriptor.
#[test]
fn load_errors() {
    let table: &[(&str, &str)] = &[
        ("", "1:1: empty file"),
        ("# only a comment\n", "1:1: empty file"),
        ("- a\n- b\n", "1:1: a file is a map of `domain` and `descriptors`"),
        ("descriptors: []\n", "1:1: config file has no `domain`"),
        ("domain: ''\n", "1:9: config file cannot have empty domain"),
        ("domain:\n", "1:1: config file cannot have empty domain"),
        ("domain: d\ndescriptors:\n  - key:\n", "3:5: descriptor has empty key"),
        ("domain: [a]\n", "1:9: expected a string, found a list"),
        ("'''\n", "1:1: invalid YAML"),
        ("domain: d\ndescriptors: [\n", "invalid YAML"),
        ("domain: d\n---\ndomain: e\n", "2:1: a file holds one YAML document"),
        ("domain: d\ndomian: e\n", "2:1: config error, unknown key 'domian' in the file"),
        ("domain: d\ndomain: e\n", "2:1: duplicate field 'domain' in the file"),
        ("0.25: d\n", "1:1: config error, key is not of type string: 0.25"),
        ("domain: d\n7: x\n", "2:1: config error, key is not of type string: 7"),
        ("domain: d\ntrue: x\n", "2:1: config error, key is not of type string: true"),
        ("domain: d\n~: x\n", "2:1: config error, key is not of type string: nothing"),
        ("domain: d\n'7': x\n", "2:1: config error, unknown key '7' in the file"),
        ("domain: d\ndescriptors: x\n", "2:14: expected a list, found a scalar"),
        ("domain: d\ndescriptors:\n  - a\n  - b\n", "3:5: config error, yaml file contains list of type other than map: a"),
        ("domain: d\ndescriptors:\n  - [a]\n", "3:5: config error, yaml file contains list of type other than map: a list"),
        ("domain: d\ndescriptors:\n  - value: v\n", "3:5: descriptor has empty key"),
        ("domain: d\ndescriptors:\n  - key: ''\n", "3:10: descriptor has empty key"),
        (
            "domain: d\ndescriptors:\n  - key: k\n    unit: second\n",
            "4:5: config error, unknown key 'unit' in a descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
            "6:7: config error, unknown key 'requestsperunit' in a rate_limit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "5:5: duplicate descriptor composite key 'k_v'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n",
            "6:9: duplicate descriptor composite key 'a.b'",
        ),
        // envoyproxy's composite keys: `a_b` bare and `a` + `b` are one.
        (
            "domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n",
            "4:5: duplicate descriptor composite key 'a_b'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
            "4:25: invalid rate limit unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: unknown }\n",
            "4:25: invalid rate limit unit 'unknown'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { requests_per_unit: 1 }\n",
            "4:17: rate_limit needs a unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: day\n",
            "6:7: should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: -1 }\n",
            "4:49: requests_per_unit must be a whole number",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 4294967296 }\n",
            "4:49: '4294967296' is over 4294967295",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n",
            "4:18: expected true or false, found 'maybe'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      replaces:\n        - name: ''\n",
            "7:17: should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      replaces:\n        - {}\n",
            "7:11: should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      name: me\n      replaces:\n        - name: me\n",
            "8:17: replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      replaces: [x]\n",
            "6:18: config error, yaml file contains list of type other than map: x",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
            "5:5: share_threshold can only be used with wildcard values (containing '*'), but found key 'k_v'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    metadata: 5\n",
            "4:15: metadata must be a map, found a scalar",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: 5\n",
            "4:17: rate_limit must be a map, found a scalar",
        ),
    ];
    let mut wrong = Vec::new();
    for (text, want) in table {
        match RlsConfig::parse("f.yaml", text) {
            Ok(_) => wrong.push(format!("{text:?}: loaded, want {want}")),
            Err(e) => {
                let got = e.to_string();
                if !got.starts_with("f.yaml:") || !got.contains(want) {
                    wrong.push(format!("{text:?}:\n   got {got}\n  want {want}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The error's fields and its display.
#[test]
fn error_fields() {
    let e = RlsConfig::parse("cfg/x.yaml", "domain: d\nbogus: 1\n").unwrap_err();
    assert_eq!((e.file.as_str(), e.line, e.col), ("cfg/x.yaml", 2, 1));
    assert!(e
        .to_string()
        .starts_with("cfg/x.yaml:2:1: config error, unknown key 'bogus'"));
}

/// Input bounds: file size, descriptor depth, YAML depth, alias expansion.
#[test]
fn input_is_bounded() {
    let big = format!("domain: d\n# {}\n", "x".repeat(MAX_FILE_BYTES));
    let e = RlsConfig::parse("big.yaml", &big).unwrap_err();
    assert_eq!(e.to_string(), "big.yaml:1:1: the file is larger than 4 MiB");

    let nested = |levels: usize| {
        let mut s = String::from("domain: d\ndescriptors:\n");
        for i in 0..levels {
            let pad = "  ".repeat(2 * i + 1);
            s.push_str(&format!("{pad}- key: k{i}\n{pad}  descriptors:\n"));
        }
        s
    };
    parse(&nested(MAX_DEPTH));
    let e = RlsConfig::parse("deep.yaml", &nested(MAX_DEPTH + 1)).unwrap_err();
    assert_eq!(e.line, 2 * MAX_DEPTH + 3, "{e}");
    assert!(
        e.message
            .contains("descriptors nested deeper than 32 levels"),
        "{e}"
    );

    let deep_metadata = format!(
        "domain: d\ndescriptors:\n  - key: k\n    metadata: {{ a: {}{} }}\n",
        "[".repeat(200),
        "]".repeat(200)
    );
    let e = RlsConfig::parse("m.yaml", &deep_metadata).unwrap_err();
    assert!(e.message.contains("nested deeper"), "{e}");

    // Each level of aliases doubles the descriptors (anchors kept in ignored metadata):
    // refused once past the budget, never built.
    let mut bomb = String::from("domain: d\ndescriptors:\n  - key: defs\n    metadata:\n");
    bomb.push_str("      x0: &a0 [{ key: k }]\n");
    for i in 1..24 {
        let p = i - 1;
        bomb.push_str(&format!(
            "      x{i}: &a{i} [{{ key: a, descriptors: *a{p} }}, {{ key: b, descriptors: *a{p} }}]\n"
        ));
    }
    bomb.push_str("  - key: top\n    descriptors: *a23\n");
    let e = RlsConfig::parse("bomb.yaml", &bomb).unwrap_err();
    assert!(e.message.contains("more than 262144 descriptors"), "{e}");
}

/// A directory loads its `*.yaml`/`*.yml` files in name order; other files are left out.
#[test]
fn directory_loading() {
    let c = RlsConfig::load(&fixture("dir")).unwrap();
    let mut domains: Vec<_> = c.domains().collect();
    domains.sort_unstable();
    assert_eq!(domains, ["edge", "mongo_cps"]);
    let m = c.lookup("mongo_cps", &[("database", "users")]).unwrap();
    assert_eq!(
        (m.limit.requests_per_unit, m.limit.unit),
        (500, Unit::Second)
    );
    let m = c.lookup("edge", &[("remote_address", "10.0.0.1")]).unwrap();
    assert_eq!(m.limit.requests_per_unit, 60);
    assert!(c
        .lookup("edge", &[("remote_address", "50.0.0.5")])
        .is_none());

    // one file by its path.
    let one = RlsConfig::load(&fixture("dir/10-mongo.yaml")).unwrap();
    assert_eq!(one.domains().collect::<Vec<_>>(), ["mongo_cps"]);

    // a directory without YAML: an empty configuration.
    let empty = tempfile::tempdir().unwrap();
    std::fs::write(empty.path().join("notes.txt"), "domain: x").unwrap();
    std::fs::write(empty.path().join(".hidden.yaml"), "domain: h").unwrap();
    let c = RlsConfig::load(empty.path()).unwrap();
    assert_eq!(c.domains().count(), 0);
}

/// A domain in two files: an error in the later file (name order) naming the first one.
#[test]
fn duplicate_domain_across_files() {
    let dir = fixture("dup");
    let e = RlsConfig::load(&dir).unwrap_err();
    let first = dir.join("a.yaml").display().to_string();
    let second = dir.join("b.yml").display().to_string();
    assert_eq!(e.file, second);
    assert_eq!((e.line, e.col), (2, 9));
    assert_eq!(
        e.message,
        format!("duplicate domain 'shared': already in {first}")
    );
}

/// Files that cannot be read: missing, not UTF-8, too large.
#[test]
fn unreadable_files() {
    let e = RlsConfig::load(Path::new("/nonexistent/rls.yaml")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/rls.yaml:1:1: cannot read"),
        "{e}"
    );

    let dir = tempfile::tempdir().unwrap();
    let latin1 = dir.path().join("latin1.yaml");
    std::fs::write(&latin1, b"domain: d\n# caf\xe9\n").unwrap();
    let e = RlsConfig::load(&latin1).unwrap_err();
    assert_eq!(
        (e.line, e.col, e.message.as_str()),
        (2, 6, "the file is not UTF-8")
    );

    let big = dir.path().join("big.yaml");
    std::fs::write(&big, vec![b'#'; MAX_FILE_BYTES + 1]).unwrap();
    let e = RlsConfig::load(&big).unwrap_err();
    assert!(e.message.contains("larger than 4 MiB"), "{e}");
}
