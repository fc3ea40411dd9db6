//! Table-driven tests of matching and counters, after envoyproxy/ratelimit's
//! `test/config` cases (own YAML, same behaviours); loading and its errors in `load`.

use super::*;

mod load;

/// One table row: the entries, and the expected (requests_per_unit, unit, path, counter).
type Row<'a> = (
    &'a [(&'a str, &'a str)],
    Option<(u32, Unit, &'a str, &'a str)>,
);

fn parse(text: &str) -> RlsConfig {
    match RlsConfig::parse("test.yaml", text) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

/// What a lookup found, flattened for tables: (requests_per_unit, unit, path, counter).
fn found(
    c: &RlsConfig,
    domain: &str,
    entries: &[(&str, &str)],
) -> Option<(u32, Unit, String, String)> {
    c.lookup(domain, entries).map(|m| {
        (
            m.limit.requests_per_unit,
            m.limit.unit,
            m.path.to_string(),
            m.counter,
        )
    })
}

/// Checks a table of (entries, expected (requests_per_unit, unit, path, counter) or None).
fn check(c: &RlsConfig, table: &[Row<'_>]) {
    let mut wrong = Vec::new();
    for (entries, want) in table {
        let got = found(c, "d", entries);
        let want = want.map(|(n, u, p, k)| (n, u, p.to_string(), k.to_string()));
        if got != want {
            wrong.push(format!("{entries:?}: got {got:?}, want {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

const BASIC: &str = r#"
domain: d
descriptors:
  # key/value without a limit, its children with one
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: { unit: second, requests_per_unit: 5 }
      - key: subkey1
        value: subvalue1
        rate_limit: { unit: SECOND, requests_per_unit: 10 }
  # bare key, a more specific value, and a whitelisted value
  - key: key2
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: key2
    value: value2
    rate_limit: { unit: Minute, requests_per_unit: 30 }
  - key: key2
    value: value3
  - key: key4
    rate_limit:
      name: key4_rate_limit
      unit: day
      requests_per_unit: 1
  # a limit with a child: the depth rule both ways
  - key: key5
    value: value5
    rate_limit: { unit: day, requests_per_unit: 15 }
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: { unit: day, requests_per_unit: 25 }
  - key: key6
    rate_limit: { unlimited: true }
  - key: key7
    value: 123
    metadata: { any: [thing, { deep: 1 }] }
    value_to_metric: true
    rate_limit: { unit: week, requests_per_unit: 7 }
"#;

/// Basic config: exact, bare and whitelisted values, nested keys and the depth rule.
#[test]
fn basic_matching() {
    let c = parse(BASIC);
    use Unit::*;
    check(
        &c,
        &[
            // key1 has no bare entry, and value1 alone has no limit.
            (&[("key1", "something")], None),
            (&[("key1", "value1")], None),
            // nested: a bare subkey (one counter per value) and an exact override.
            (
                &[("key1", "value1"), ("subkey1", "something")],
                Some((
                    5,
                    Second,
                    "key1_value1.subkey1",
                    "key1=value1&subkey1=something",
                )),
            ),
            (
                &[("key1", "value1"), ("subkey1", "subvalue1")],
                Some((
                    10,
                    Second,
                    "key1_value1.subkey1_subvalue1",
                    "key1=value1&subkey1=subvalue1",
                )),
            ),
            // bare key vs. its exact values; value3 is whitelisted (no limit).
            (
                &[("key2", "something")],
                Some((20, Minute, "key2", "key2=something")),
            ),
            (
                &[("key2", "value2")],
                Some((30, Minute, "key2_value2", "key2=value2")),
            ),
            (&[("key2", "value3")], None),
            // depth rule: longer than the config path (key2 has no children).
            (&[("key2", "value2"), ("subkey", "subvalue")], None),
            // depth rule: key5's own limit does not apply to a longer descriptor...
            (&[("key5", "value5"), ("subkey5", "other")], None),
            // ... the child's does, and the parent's applies to the short one.
            (
                &[("key5", "value5"), ("subkey5", "subvalue5")],
                Some((
                    25,
                    Day,
                    "key5_value5.subkey5_subvalue5",
                    "key5=value5&subkey5=subvalue5",
                )),
            ),
            (
                &[("key5", "value5")],
                Some((15, Day, "key5_value5", "key5=value5")),
            ),
            (&[("key4", "x")], Some((1, Day, "key4", "key4=x"))),
            // a number is read as the string it is written as.
            (&[("key7", "123")], Some((7, Week, "key7_123", "key7=123"))),
            (&[("unknown", "x")], None),
            (&[], None),
        ],
    );
    assert!(
        c.lookup("other", &[("key2", "x")]).is_none(),
        "unknown domain"
    );
    assert!(c.has_domain("d") && !c.has_domain("other"));
    assert_eq!(c.domains().collect::<Vec<_>>(), ["d"]);
}

/// Limits carry their name, flags, `unlimited` and `replaces`.
#[test]
fn limits_carry_their_fields() {
    let c = parse(
        r#"
domain: d
descriptors:
  - key: plain
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: named
    shadow_mode: true
    quota_mode: yes
    detailed_metric: true
    rate_limit:
      unit: month
      requests_per_unit: 4294967295
      name: big
      replaces: [{ name: small }, { name: other }]
  - key: free
    shadow_mode: false
    rate_limit: { unlimited: true, requests_per_unit: 9 }
"#,
    );
    let limit = |k: &str| c.lookup("d", &[(k, "v")]).map(|m| m.limit.clone());
    assert_eq!(
        limit("plain"),
        Some(Limit {
            unit: Unit::Hour,
            requests_per_unit: 3,
            unlimited: false,
            name: None,
            replaces: vec![],
            shadow_mode: false,
            quota_mode: false,
            detailed_metric: false,
        })
    );
    assert_eq!(
        limit("named"),
        Some(Limit {
            unit: Unit::Month,
            requests_per_unit: u32::MAX,
            unlimited: false,
            name: Some("big".into()),
            replaces: vec!["small".into(), "other".into()],
            shadow_mode: true,
            quota_mode: true,
            detailed_metric: true,
        })
    );
    let free = limit("free").unwrap();
    assert!(free.unlimited && free.unit == Unit::Second && !free.shadow_mode);
}

const WILDCARDS: &str = r#"
domain: d
descriptors:
  - key: wild
    value: foo*
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: wild
    value: fo*
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: wild
    value: foobar
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: wild
    rate_limit: { unit: minute, requests_per_unit: 4 }
  - key: noWild
    value: foo
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: midWild
    value: bar*b
    rate_limit: { unit: minute, requests_per_unit: 6 }
  - key: multiWild
    value: foo*bar*baz
    rate_limit: { unit: minute, requests_per_unit: 7 }
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: { unit: minute, requests_per_unit: 8 }
  - key: path
    value: "*"
    rate_limit: { unit: minute, requests_per_unit: 9 }
"#;

/// Wildcards: trailing, middle, several; exact beats wildcard beats bare; the first
/// matching wildcard in file order wins; patterns as written in the path.
#[test]
fn wildcard_matching() {
    let c = parse(WILDCARDS);
    use Unit::Minute as M;
    check(
        &c,
        &[
            (&[("wild", "foo1")], Some((1, M, "wild_foo*", "wild=foo1"))),
            (&[("wild", "foo")], Some((1, M, "wild_foo*", "wild=foo"))),
            // `fo*` comes after `foo*`: only what `foo*` misses reaches it.
            (&[("wild", "fox")], Some((2, M, "wild_fo*", "wild=fox"))),
            // exact beats the wildcards before it.
            (
                &[("wild", "foobar")],
                Some((3, M, "wild_foobar", "wild=foobar")),
            ),
            // no wildcard matches: the bare key.
            (&[("wild", "bar")], Some((4, M, "wild", "wild=bar"))),
            // no prefix eagerness without a `*`.
            (&[("noWild", "foo1")], None),
            (
                &[("noWild", "foo")],
                Some((5, M, "noWild_foo", "noWild=foo")),
            ),
            (
                &[("midWild", "barab")],
                Some((6, M, "midWild_bar*b", "midWild=barab")),
            ),
            (
                &[("midWild", "barb")],
                Some((6, M, "midWild_bar*b", "midWild=barb")),
            ),
            (
                &[("midWild", "bar123b")],
                Some((6, M, "midWild_bar*b", "midWild=bar123b")),
            ),
            (&[("midWild", "bara")], None),
            (&[("midWild", "xbarb")], None),
            // `bar*b` needs 4 bytes: `bab` must not match by sharing the `b`.
            (&[("midWild", "bab")], None),
            (
                &[("multiWild", "foo123bar456baz")],
                Some((7, M, "multiWild_foo*bar*baz", "multiWild=foo123bar456baz")),
            ),
            (
                &[("multiWild", "foobarbaz")],
                Some((7, M, "multiWild_foo*bar*baz", "multiWild=foobarbaz")),
            ),
            (&[("multiWild", "foo123baz")], None),
            (&[("multiWild", "bar456baz")], None),
            (&[("multiWild", "foobazbar")], None),
            (
                &[("nestedWild", "val1"), ("wild", "goo2")],
                Some((
                    8,
                    M,
                    "nestedWild_val1.wild_goo*",
                    "nestedWild=val1&wild=goo2",
                )),
            ),
            (&[("nestedWild", "val1"), ("wild", "foo2")], None),
            // `*` matches the empty value too.
            (&[("path", "")], Some((9, M, "path_*", "path="))),
            (
                &[("path", "/any/thing")],
                Some((9, M, "path_*", "path=/any/thing")),
            ),
        ],
    );
}

/// Wildcards match the combined `key_value`, as envoyproxy does.
#[test]
fn wildcards_match_key_underscore_value() {
    let pattern = |p: &str| {
        let parts: Vec<String> = p.split('*').map(str::to_string).collect();
        let fixed = parts.iter().map(String::len).sum();
        Pattern { parts, fixed }
    };
    let table: &[(&str, &str, &str, bool)] = &[
        ("path_/api/*", "path", "/api/v1", true),
        ("path_/api/*", "path", "/apx", false),
        ("path_/api/*", "pat", "h_/api/x", false), // `pat_h_/api/x`
        ("path_/api/*", "path_/api/x", "y", true), // `path_/api/x_y`, as in envoyproxy
        ("pa*_v", "path", "v", true),              // a `*` in the key part
        ("k_*a*a*", "k", "aa", true),
        ("k_*a*a*", "k", "a", false),
        ("k_**", "k", "", true),
        ("k_x*y*z", "k", "xyz", true),
        ("k_x*y*z", "k", "xzy", false),
        ("*_*", "", "", true),   // `_`
        ("a*a", "a", "", false), // `a_` does not end with `a`
        ("a*_b", "a", "b", true),
        ("ab*_c", "a", "b_c", false), // `a_b_c`
    ];
    for (p, key, value, want) in table {
        assert_eq!(
            pattern(p).matches(key, value),
            *want,
            "{p:?} on {key:?} {value:?}"
        );
    }
}

const SHARED: &str = r#"
domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: { unit: minute, requests_per_unit: 200 }
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: { unit: minute, requests_per_unit: 300 }
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        descriptors:
          - key: type
            rate_limit: { unit: minute, requests_per_unit: 120 }
  - key: file
    value: test1
    rate_limit: { unit: minute, requests_per_unit: 50 }
  - key: file
    value: test*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 60 }
  - key: mid
    value: t*prod
    share_threshold: true
    descriptors:
      - key: res
        value: res*v2
        share_threshold: true
        rate_limit: { unit: minute, requests_per_unit: 70 }
  # a wildcard in a bare key: shared under the key as written, with no value.
  - key: x-*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 80 }
"#;

/// share_threshold: every value a wildcard matches shares one counter, under the
/// pattern; tracked per entry, also when the limit is deeper.
#[test]
fn share_threshold_counters() {
    let c = parse(SHARED);
    use Unit::Minute as M;
    check(
        &c,
        &[
            (
                &[("files", "files/a.pdf")],
                Some((100, M, "files_files/*", "files=files/*")),
            ),
            (
                &[("files", "files/b.csv")],
                Some((100, M, "files_files/*", "files=files/*")),
            ),
            (
                &[("nested", "parent"), ("files", "nested/x.txt")],
                Some((
                    200,
                    M,
                    "nested_parent.files_nested/*",
                    "nested=parent&files=nested/*",
                )),
            ),
            // the same key at two levels, both shared.
            (
                &[("files", "top/1"), ("files", "nested/2")],
                Some((
                    300,
                    M,
                    "files_top/*.files_nested/*",
                    "files=top/*&files=nested/*",
                )),
            ),
            // shared at the top (no limit there), a plain wildcard below, a bare key last.
            (
                &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
                Some((
                    120,
                    M,
                    "path_path/*.file_file/*.type",
                    "path=path/*&file=file/doc1&type=pdf",
                )),
            ),
            // an exact value has its own counter; the others share the pattern's.
            (
                &[("file", "test1")],
                Some((50, M, "file_test1", "file=test1")),
            ),
            (
                &[("file", "test2")],
                Some((60, M, "file_test*", "file=test*")),
            ),
            (
                &[("file", "test123")],
                Some((60, M, "file_test*", "file=test*")),
            ),
            (
                &[("mid", "t99prod"), ("res", "resBBBv2")],
                Some((70, M, "mid_t*prod.res_res*v2", "mid=t*prod&res=res*v2")),
            ),
            (&[("x-a", "1")], Some((80, M, "x-*", "x-*="))),
            (&[("x-b", "2")], Some((80, M, "x-*", "x-*="))),
        ],
    );
}

/// Counter identities: escaped so that no two entry lists share one, hashed over 200
/// bytes.
#[test]
fn counter_encoding() {
    let table: &[(&[(&str, &str)], &str)] = &[
        (&[("a", "b")], "a=b"),
        (&[("remote_address", "10.0.0.1")], "remote_address=10.0.0.1"),
        (&[("path", "/a/b~c-d.e:8*")], "path=/a/b~c-d.e:8*"),
        // `_` is kept: `a_b`/`c` and `a`/`b_c` stay apart.
        (&[("a_b", "c")], "a_b=c"),
        (&[("a", "b_c")], "a=b_c"),
        // separators and `%` are escaped: one entry never reads as two.
        (&[("a", "b&c=d")], "a=b%26c%3Dd"),
        (&[("a", "b"), ("c", "d")], "a=b&c=d"),
        (&[("k", "50%")], "k=50%25"),
        (&[("k", "{x} y\n\u{7f}")], "k=%7Bx%7D%20y%0A%7F"),
        (&[("k", "é")], "k=%C3%A9"),
        (&[("", "")], "="),
        (&[("k", ""), ("", "v")], "k=&=v"),
    ];
    for (entries, want) in table {
        assert_eq!(plain_counter(entries), *want, "{entries:?}");
    }
    // exactly 200 bytes stay as they are; 201 are hashed, over the whole string.
    let v198 = "x".repeat(198);
    assert_eq!(plain_counter(&[("k", &v198)]), format!("k={v198}"));
    let v199 = "x".repeat(199);
    let long = plain_counter(&[("k", &v199)]);
    let expect = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(format!("k={v199}")))
    };
    assert_eq!(long, format!("#{expect}"));
    // escapes count at their encoded length, and are hashed as encoded.
    let spaces = " ".repeat(70);
    let expect = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(format!("k={}", "%20".repeat(70))))
    };
    assert_eq!(plain_counter(&[("k", &spaces)]), format!("#{expect}"));
    // a matched descriptor's counter is hashed the same way.
    let c = parse(BASIC);
    let m = c.lookup("d", &[("key2", &v199)]).unwrap();
    assert_eq!(m.counter, plain_counter(&[("key2", &v199)]));
    assert_eq!(m.counter.len(), 65);
}

/// Units: lengths, names both ways, case-insensitive parsing.
#[test]
fn units() {
    let table = [
        (Unit::Second, "second", 1),
        (Unit::Minute, "minute", 60),
        (Unit::Hour, "hour", 3_600),
        (Unit::Day, "day", 86_400),
        (Unit::Week, "week", 604_800),
        (Unit::Month, "month", 2_592_000),
        (Unit::Year, "year", 31_536_000),
    ];
    for (unit, name, seconds) in table {
        assert_eq!(unit.as_str(), name);
        assert_eq!(unit.seconds(), seconds);
        assert_eq!(Unit::parse(name), Some(unit));
        assert_eq!(Unit::parse(&name.to_uppercase()), Some(unit));
    }
    assert_eq!(Unit::parse("unknown"), None);
    assert_eq!(Unit::parse("seconds"), None);
}

/// Aliases reuse an anchored node (a shared rate_limit, a shared subtree).
#[test]
fn aliases() {
    let c = parse(
        r#"
domain: d
descriptors:
  - key: a
    rate_limit: &per_minute { unit: minute, requests_per_unit: 10 }
    descriptors: &children
      - key: c
        rate_limit: *per_minute
  - key: b
    rate_limit: *per_minute
    descriptors: *children
"#,
    );
    let table: &[Row<'_>] = &[
        (&[("a", "1")], Some((10, Unit::Minute, "a", "a=1"))),
        (&[("b", "1")], Some((10, Unit::Minute, "b", "b=1"))),
        (
            &[("b", "1"), ("c", "2")],
            Some((10, Unit::Minute, "b.c", "b=1&c=2")),
        ),
    ];
    check(&c, table);
}
