//! Every table `throttle check` accepts can limit something; custom scopes read no
//! credential; named scopes are budgeted per config, never per process.

use super::*;
use crate::limiter::{Base, Named, Scope};

/// The 1-based line of the first occurrence of `needle` in `src`.
pub(super) fn line_of(src: &str, needle: &str) -> usize {
    let at = src
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in\n{src}"));
    src[..at].matches('\n').count() + 1
}

/// Every kind of scope table, with `{}` where its keys go and the text that starts it
/// (where the error is placed).
pub(super) const TABLES: [(&str, &str, &str); 12] = [
    ("[limits.ip]", "[limits.ip]\n{}\n", "[limits.ip]"),
    ("[limits.global]", "[limits.global]\n{}\n", "[limits.global]"),
    ("[limits.auth]", "[limits.auth]\n{}\n", "[limits.auth]"),
    (
        "[limits.user]",
        "[scopes.user]\nfrom = \"header:X-User\"\n[limits.user]\n{}\n",
        "[limits.user]",
    ),
    ("[tiers.free] key", "[tiers.free]\nkey = { {} }\n", "key = {"),
    ("[tiers.free] key", "[tiers.free.key]\n{}\n", "[tiers.free.key]"),
    ("[tiers.free] tenant", "[tiers.free]\ntenant = { {} }\n", "tenant = {"),
    ("[routes.limits.ip]", "[[routes]]\nname = \"r\"\npath_prefix = \"/r\"\nupstreams = [\"127.0.0.1:9000\"]\n[routes.limits.ip]\n{}\n", "[routes.limits.ip]"),
    ("[routes.limits.key]", "[[routes]]\nname = \"r\"\npath_prefix = \"/r\"\nupstreams = [\"127.0.0.1:9000\"]\nlimits = { key = { {} } }\n", "limits = {"),
    ("[routes.limits.tenant]", "[[routes]]\nname = \"r\"\npath_prefix = \"/r\"\nupstreams = [\"127.0.0.1:9000\"]\n[routes.limits.tenant]\n{}\n", "[routes.limits.tenant]"),
    ("[routes.limits.global]", "[[routes]]\nname = \"r\"\npath_prefix = \"/r\"\nupstreams = [\"127.0.0.1:9000\"]\n[routes.limits.global]\n{}\n", "[routes.limits.global]"),
    ("[routes.limits.user]", "[scopes.user]\nfrom = \"header:X-User\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/r\"\nupstreams = [\"127.0.0.1:9000\"]\n[routes.limits.user]\n{}\n", "[routes.limits.user]"),
];

/// Keys of a scope table none of which limits anything alone or together.
const NEVER_APPLY: [&[&str]; 9] = [
    &[],
    &["ban = { after = 3, within_secs = 60, for_secs = 600 }"],
    &["admission = \"exact\""],
    &["on_failure = \"closed\""],
    &["algorithm = \"sliding_log\""],
    &["burst_multiplier = 2.0"],
    &["message = \"slow down\""],
    &["reset_jitter_secs = 30"],
    &[
        "algorithm = \"token_bucket\"",
        "burst_multiplier = 1.5",
        "on_failure = \"open\"",
        "admission = \"auto\"",
        "message = \"m\"",
    ],
];

/// `keys` as the table's body: lines for a `[...]` table, `a, b` for an inline one.
pub(super) fn fill(template: &str, keys: &[&str]) -> String {
    let inline = template.contains("{ {} }");
    template.replacen("{}", &keys.join(if inline { ", " } else { "\n" }), 1)
}

pub(super) fn config(table: &str) -> String {
    format!("{table}{ROUTE}")
}

/// A table without a window and without `concurrent`, whatever else it sets, is refused at
/// its own line, naming it (`ban` on a global table is refused for that first).
#[test]
fn tables_that_never_apply_are_refused_at_their_line() {
    for (label, template, start) in TABLES {
        for keys in NEVER_APPLY {
            let global = label.contains("global");
            if global && keys.iter().any(|k| k.starts_with("ban")) {
                continue;
            }
            let src = config(&fill(template, keys));
            let e = parse("f.toml", &src).expect_err(&src);
            let line = line_of(&src, start);
            assert_eq!(e.position.map(|p| p.0), Some(line), "{e}\n{src}");
            assert!(
                e.message.starts_with(label)
                    && e.message.contains("no window")
                    && e.message.contains("no concurrent")
                    && e.message.contains("would never limit anything"),
                "{e}"
            );
        }
    }
}

/// The same tables with a window, or with only `concurrent` (where `concurrent` is
/// allowed), are accepted.
#[test]
fn tables_with_a_window_or_concurrent_are_accepted() {
    for (label, template, _) in TABLES {
        let src = config(&fill(
            template,
            &[
                "per_minute = 10",
                "ban = { after = 3, within_secs = 60, for_secs = 600 }",
            ][..if label.contains("global") { 1 } else { 2 }],
        ));
        parse("f.toml", &src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        if label.contains("global") || label.contains("auth") {
            continue; // concurrent is not theirs
        }
        let src = config(&fill(
            template,
            &["concurrent = 5", "on_failure = \"closed\""],
        ));
        parse("f.toml", &src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    }
}

/// With a database, a tier's key windows may come from its policy row or a key's
/// override: a key table of settings alone is accepted there (its tenant table is not).
#[test]
fn a_tier_key_table_of_settings_is_kept_for_database_windows() {
    let db = "[database]\nurl = \"postgres://127.0.0.1/x\"\n";
    let settings = "[tiers.free]\nkey = { ban = { after = 3, within_secs = 60, for_secs = 600 }, algorithm = \"sliding_log\" }\n";
    let c = parse("f.toml", &format!("{db}{settings}{ROUTE}")).unwrap();
    assert!(c.tiers["free"].key.ban.is_some() && c.tiers["free"].key.windows.is_empty());
    let e = parse("f.toml", &format!("{settings}{ROUTE}")).unwrap_err();
    assert!(e.message.contains("[tiers.free] key has no window"), "{e}");
    let tenant = "[tiers.free]\ntenant = { algorithm = \"sliding_log\" }\n";
    let e = parse("f.toml", &format!("{db}{tenant}{ROUTE}")).unwrap_err();
    assert!(
        e.message.contains("[tiers.free] tenant has no window"),
        "{e}"
    );
    // A tier without tables names a tier, and limits nothing: still accepted.
    parse("f.toml", &format!("[tiers.free]\nmessage = \"m\"\n{ROUTE}")).unwrap();
}

/// A custom scope may not read a credential: `Authorization`, the key header (any case)
/// or the key query parameter; an error at its `from`. Other headers, cookies and query
/// parameters are fine.
#[test]
fn custom_scopes_may_not_read_credentials() {
    let refused = [
        ("", "header:Authorization"),
        ("", "header:authorization"),
        ("", "header:AUTHORIZATION"),
        ("", "header:X-API-Key"),
        ("", "header:x-api-key"),
        ("[auth]\nkey_header = \"X-Key\"\n", "header:x-key"),
        ("[auth]\nkey_header = \"X-Key\"\n", "header:Authorization"),
        ("[auth]\nkey_query = \"apikey\"\n", "query:apikey"),
        (
            "[auth]\nkey_header = \"x-key\"\nkey_query = \"k\"\n",
            "header:X-KEY",
        ),
    ];
    for (auth, from) in refused {
        let src = format!("{auth}[scopes.user]\nmissing = \"skip\"\nfrom = \"{from}\"\n{ROUTE}");
        let e = parse("f.toml", &src).expect_err(&src);
        assert_eq!(e.position, Some((line_of(&src, "from ="), 8)), "{e}");
        assert!(
            e.message.contains("[scopes.user]") && e.message.contains("reads a credential"),
            "{e}"
        );
    }
    let accepted = [
        ("", "header:X-User"),
        ("", "cookie:session"),
        ("", "cookie:Authorization"),
        ("", "query:apikey"),
        ("[auth]\nkey_header = \"X-Key\"\n", "header:X-API-Key"),
        // Query parameters are case-sensitive: `APIKEY` is not the key's parameter.
        ("[auth]\nkey_query = \"apikey\"\n", "query:APIKEY"),
        ("[auth]\nkey_query = \"apikey\"\n", "header:apikey"),
    ];
    for (auth, from) in accepted {
        let src = format!("{auth}[scopes.user]\nfrom = \"{from}\"\n{ROUTE}");
        parse("f.toml", &src).unwrap_or_else(|e| panic!("{from}: {e}"));
    }
}

/// `n` custom scopes (no limits) and `tables` route tables over routes of two tables
/// each; names start with `tag`.
fn named_config(tag: &str, n: usize, tables: usize) -> String {
    let mut src = String::new();
    for i in 0..n {
        src.push_str(&format!(
            "[scopes.{tag}s{i:03}]\nfrom = \"header:X-S{i}\"\n"
        ));
    }
    for r in 0..tables.div_ceil(2) {
        let both = if 2 * r + 1 < tables {
            ", global = { per_second = 9 }"
        } else {
            ""
        };
        src.push_str(&format!(
            "[[routes]]\nname = \"{tag}r{r:03}\"\npath_prefix = \"/{tag}r{r:03}\"\nupstreams = [\"127.0.0.1:9000\"]\nlimits = {{ ip = {{ per_second = 9 }}{both} }}\n"
        ));
    }
    src.push_str(ROUTE);
    src
}

/// A config holds at most 255 named scopes (custom scopes and route tables): the 256th
/// is refused at its own line, whichever kind it is.
#[test]
fn the_256th_named_scope_is_refused_at_its_line() {
    parse("f.toml", &named_config("a", 200, 55)).unwrap();
    parse("f.toml", &named_config("b", 0, 255)).unwrap();
    parse("f.toml", &named_config("c", 255, 0)).unwrap();
    let src = named_config("d", 200, 56);
    let e = parse("f.toml", &src).unwrap_err();
    let last = src.rfind("global = {").unwrap();
    let line = src[..last].matches('\n').count() + 1;
    assert_eq!(e.position.map(|p| p.0), Some(line), "{e}");
    assert!(e.message.contains("more than 255 named scopes"), "{e}");
    let src = named_config("e", 256, 0);
    let e = parse("f.toml", &src).unwrap_err();
    assert_eq!(
        e.position.map(|p| p.0),
        Some(line_of(&src, "[scopes.es255]")),
        "{e}"
    );
}

/// An `[rls] config` directory of one YAML file per domain, `domains` of them.
fn rls_dir(dir: &Path, tag: &str, domains: usize) {
    let yaml = dir.join("ratelimit");
    std::fs::create_dir_all(&yaml).unwrap();
    for d in 0..domains {
        std::fs::write(
            yaml.join(format!("{d:05}.yaml")),
            format!("domain: {tag}d{d}\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n"),
        )
        .unwrap();
    }
}

/// RLS domains have their own budget: 260 of them load beside 255 named scopes.
#[test]
fn rls_domains_do_not_count_toward_named_scopes() {
    let dir = tempfile::tempdir().unwrap();
    rls_dir(dir.path(), "f", 260);
    let path = dir.path().join("gateway.toml");
    let src = format!(
        "[rls]\nconfig = \"ratelimit\"\n{}",
        named_config("f", 200, 55)
    );
    std::fs::write(&path, src).unwrap();
    let c = load(&path).unwrap_or_else(|e| panic!("{e}"));
    let scopes = &c.rls.descriptors.as_ref().unwrap().scopes;
    assert_eq!(scopes.len(), 260);
    assert_eq!(scopes["fd7"].as_str(), "rls:fd7");
}

/// A route `rls` with a custom table `domain` and the RLS domain `domain` are two scopes
/// with two names (two sets of counters); a custom scope may not be named `rls`.
#[test]
fn a_route_named_rls_never_shares_a_domains_counters() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("ratelimit");
    std::fs::create_dir_all(&yaml).unwrap();
    std::fs::write(
        yaml.join("d.yaml"),
        "domain: domain\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n",
    )
    .unwrap();
    let path = dir.path().join("gateway.toml");
    let src = "[rls]\nconfig = \"ratelimit\"\n[scopes.domain]\nfrom = \"header:X-D\"\n[[routes]]\nname = \"rls\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:9000\"]\n[routes.limits.domain]\nper_minute = 5\n";
    std::fs::write(&path, src).unwrap();
    let c = load(&path).unwrap_or_else(|e| panic!("{e}"));
    let table = c.routes[0].limits[0].scope;
    let domain = c.rls.descriptors.as_ref().unwrap().scopes["domain"];
    assert_ne!(table, domain);
    assert_eq!(
        (table.as_str(), domain.as_str()),
        ("rls.domain", "rls:domain")
    );
    let e = parse(
        "f.toml",
        &format!("[scopes.rls]\nfrom = \"header:X-R\"\n{ROUTE}"),
    )
    .unwrap_err();
    assert_eq!(e.position, Some((1, 1)), "{e}");
}

/// Validating a config again interns nothing new: its scopes are the same handles.
#[test]
fn parsing_again_gives_the_same_scopes() {
    let src = named_config("g", 3, 4);
    let (a, b) = (
        parse("f.toml", &src).unwrap(),
        parse("f.toml", &src).unwrap(),
    );
    let scopes = |c: &Config| -> Vec<Scope> {
        let customs = c.scopes.iter().map(|s| s.scope);
        customs
            .chain(
                c.routes
                    .iter()
                    .flat_map(|r| r.limits.iter().map(|t| t.scope)),
            )
            .collect()
    };
    assert_eq!(scopes(&a), scopes(&b));
    assert_eq!(scopes(&a).len(), 7);
    for s in scopes(&a) {
        assert_eq!(Scope::parse(s.as_str()), Some(s));
    }
    let ip = Scope::Named(Named::intern(Some("gr000"), Base::Ip));
    assert!(scopes(&b).contains(&ip));
}

/// A thousand validations, each with fresh custom scope, route and domain names (as
/// `throttle check` and refused reloads run in a long-lived process), never run out of
/// names: a config still loads after them.
#[test]
fn a_thousand_validations_with_fresh_names_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let yaml = dir.path().join("ratelimit.yaml");
    for i in 0..1000 {
        std::fs::write(
            &yaml,
            format!("domain: h{i}\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n"),
        )
        .unwrap();
        let src = format!(
            "[rls]\nconfig = \"ratelimit.yaml\"\n{}",
            named_config(&format!("h{i}x"), 2, 3)
        );
        std::fs::write(&path, src).unwrap();
        let c = load(&path).unwrap_or_else(|e| panic!("round {i}: {e}"));
        assert_eq!(
            c.scopes.len() + c.routes.iter().map(|r| r.limits.len()).sum::<usize>(),
            5
        );
    }
    std::fs::write(&path, named_config("hlast", 255, 0)).unwrap();
    load(&path).unwrap_or_else(|e| panic!("{e}"));
}

/// The 1-based (line, column) of the first `needle` in `src`.
fn place_of(src: &str, needle: &str) -> (usize, usize) {
    let at = src
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in\n{src}"));
    let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
    (line_of(src, needle), at - line_start + 1)
}

/// `count_on` on every kind of table a request is admitted on: a valid list is kept
/// (codes and classes); an empty list, a bad status, a repeat, a table without a window
/// (concurrency only) and `[limits.auth]` are refused at the list's line and column.
#[test]
fn count_on_is_checked_at_its_list() {
    let kept = "count_on = [\"401\", \"5xx\"]";
    for (label, template, _) in TABLES {
        let src = config(&fill(template, &["per_minute = 10", kept]));
        if label.contains("auth") {
            let e = parse("f.toml", &src).expect_err(&src);
            assert_eq!(e.position, Some(place_of(&src, "[\"401\"")), "{e}");
            assert!(e.message.contains("not [limits.auth]"), "{e}");
            continue;
        }
        let c = parse("f.toml", &src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let limits = match label {
            "[limits.ip]" => c.ip_limits.clone(),
            "[limits.global]" => c.global_limits.clone(),
            "[limits.user]" => c.scopes[0].limits.clone(),
            l if l.starts_with("[tiers") => {
                let t = &c.tiers["free"];
                Some(if l.ends_with("key") {
                    t.key.clone()
                } else {
                    t.tenant.clone()
                })
            }
            _ => Some(c.routes[0].limits[0].limits.clone()),
        };
        let set = limits.and_then(|l| l.count_on).expect(label);
        assert!(
            set.contains(401) && set.contains(503) && !set.contains(200),
            "{label}"
        );
        let bad: &[(&str, &str)] = &[
            ("count_on = []", "at least one"),
            ("count_on = [\"401\", \"600\"]", "is not a status"),
            ("count_on = [\"4xx\", \"401\"]", "listed twice"),
        ];
        for (line, why) in bad {
            let src = config(&fill(template, &["per_minute = 10", line]));
            let e = parse("f.toml", &src).expect_err(&src);
            let list = &line["count_on = ".len()..];
            assert_eq!(e.position, Some(place_of(&src, list)), "{e}\n{src}");
            assert!(e.message.contains(why), "{e}");
        }
        if label.contains("global") {
            continue; // concurrent is not its
        }
        let src = config(&fill(template, &["concurrent = 5", kept]));
        let e = parse("f.toml", &src).expect_err(&src);
        assert_eq!(e.position, Some(place_of(&src, "[\"401\"")), "{e}\n{src}");
        assert!(e.message.contains("count_on needs a rate window"), "{e}");
    }
}
