//! One limit across regions in `gateway.toml` (issue 37): `[regions]`, and `fleet` on
//! every kind of scope table and on tiers; what `throttle check` refuses, at `line:col`,
//! and what it warns about.

use super::calendar::{pos_of, table_of};
use super::tables::{config, fill, TABLES};
use super::*;
use crate::config::{Peer, Regions};
use crate::limiter::{Fleet, WindowLimit};

/// A Redis store and three regions (this one `eu`).
const REGIONS: &str = "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n\n[regions]\nname = \"eu\"\npeers = { us = \"redis://us.example:6379\", ap = \"redis://ap.example:6379\" }\n\n";

fn with_regions(src: &str) -> String {
    format!("{REGIONS}{src}")
}

fn fleets(windows: &[WindowLimit]) -> Vec<(Window, Algorithm, Fleet)> {
    windows
        .iter()
        .map(|w| (w.window, w.algorithm, w.fleet))
        .collect()
}

/// Every kind of scope table takes `fleet`, on every one of its windows; with
/// `fleet = "regions"` and no `algorithm` the windows are fixed windows, with
/// `fleet = "home"` they keep each window's default, without `fleet` they are local.
#[test]
fn every_table_kind_sets_fleet_on_every_window() {
    let windows = ["per_second = 100", "per_hour = 5000", "per_month = 90000"];
    let regions = [
        (Window::Second, Algorithm::FixedWindow, Fleet::Regions),
        (Window::Hour, Algorithm::FixedWindow, Fleet::Regions),
        (Window::Month, Algorithm::FixedWindow, Fleet::Regions),
    ];
    let home = [
        (Window::Second, Algorithm::TokenBucket, Fleet::Home),
        (Window::Hour, Algorithm::SlidingWindow, Fleet::Home),
        (Window::Month, Algorithm::FixedWindow, Fleet::Home),
    ];
    let local = home.map(|(w, a, _)| (w, a, Fleet::Local));
    let rows: [(Option<&str>, &[_]); 4] = [
        (Some("fleet = \"regions\""), &regions),
        (Some("fleet = \"home\""), &home),
        (Some("fleet = \"local\""), &local),
        (None, &local),
    ];
    for (label, template, _) in TABLES {
        for (key, want) in rows {
            let keys: Vec<&str> = windows.iter().copied().chain(key).collect();
            let src = with_regions(&config(&fill(template, &keys)));
            let c = parse("f.toml", &src).unwrap_or_else(|e| panic!("{label}: {e}\n{src}"));
            assert_eq!(
                fleets(&table_of(&c, label).windows),
                want,
                "{label} {key:?}"
            );
        }
    }
}

/// An explicit `fixed_window` is what `fleet = "regions"` defaults to anyway.
#[test]
fn fleet_regions_takes_an_explicit_fixed_window() {
    let src = with_regions(&with_route(
        "[limits.ip]\nper_minute = 600\nalgorithm = \"fixed_window\"\nfleet = \"regions\"\n",
    ));
    let c = parse("f.toml", &src).unwrap();
    let ip = c.ip_limits.unwrap();
    assert_eq!(
        fleets(&ip.windows),
        [(Window::Minute, Algorithm::FixedWindow, Fleet::Regions)]
    );
}

/// A tier's `fleet` is the default of its key and tenant tables (each may say otherwise),
/// and of the windows the database builds later with the key table's settings: a
/// policy row, a key's `custom_override`, a `[[tenants]]` entry's own calendar.
#[test]
fn a_tier_fleet_is_its_tables_default_and_the_databases() {
    let tier = "[tiers.free]\nfleet = \"regions\"\nkey = { per_second = 30, per_day = 10000 }\ntenant = { per_minute = 600, per_month = 100000 }\n[tiers.pro]\nfleet = \"regions\"\nkey = { per_second = 300, fleet = \"home\" }\ntenant = { per_minute = 6000, fleet = \"local\" }\n[[tenants]]\nid = \"acme\"\ntier = \"free\"\ncalendar_tz = \"Europe/Berlin\"\n";
    let c = parse("f.toml", &with_regions(&with_route(tier))).unwrap();
    let free = &c.tiers["free"];
    let fixed = |w| (w, Algorithm::FixedWindow, Fleet::Regions);
    assert_eq!(
        fleets(&free.key.windows),
        [fixed(Window::Second), fixed(Window::Day)]
    );
    assert_eq!(
        fleets(&free.tenant.windows),
        [fixed(Window::Minute), fixed(Window::Month)]
    );
    let pro = &c.tiers["pro"];
    assert_eq!(
        fleets(&pro.key.windows),
        [(Window::Second, Algorithm::TokenBucket, Fleet::Home)]
    );
    assert_eq!(
        fleets(&pro.tenant.windows),
        [(Window::Minute, Algorithm::TokenBucket, Fleet::Local)]
    );
    // The windows the database adds: the key table's settings carry the fleet, and the
    // fixed window it defaults to.
    assert_eq!(free.key_settings.fleet, Fleet::Regions);
    assert_eq!(free.key_settings.algorithm, None);
    let hour = free.key_settings.window(Window::Hour, 500).unwrap();
    assert_eq!(
        (hour.algorithm, hour.fleet),
        (Algorithm::FixedWindow, Fleet::Regions)
    );
    let o = serde_json::json!({ "per_minute": 100 });
    let over = crate::identity::apply_override(free, &o, 1).unwrap();
    assert!(over.key.windows.iter().all(|w| w.fleet == Fleet::Regions));
    // A `[[tenants]]` entry's own calendar keeps the tier's fleet.
    let acme = &c.tenant_tiers["acme"];
    assert_eq!(
        fleets(&acme.tenant.windows),
        [fixed(Window::Minute), fixed(Window::Month)]
    );
    assert!(acme.tenant.windows[1].calendar.is_some());
}

/// A `rate_limit_policies` row of a `fleet = "regions"` tier: its windows are the tier's
/// fleet, fixed windows without an algorithm; with another algorithm the row is refused
/// (the tier keeps the config's windows), naming `algorithm`.
#[test]
fn a_policy_row_of_a_regions_tier() {
    let tier = "[tiers.free]\nfleet = \"regions\"\nkey = { per_second = 30 }\n";
    let c = parse("f.toml", &with_regions(&with_route(tier))).unwrap();
    let row = |algorithm: Option<&str>| crate::db::policies::PolicyRow {
        id: "free".into(),
        name: "free".into(),
        limits: [Some(50), Some(1000), None, None, None],
        burst_multiplier: None,
        algorithm: algorithm.map(str::to_string),
    };
    let t = crate::reload::snapshot::row_tier(&c, &row(None)).unwrap();
    assert_eq!(
        fleets(&t.key.windows),
        [
            (Window::Second, Algorithm::FixedWindow, Fleet::Regions),
            (Window::Minute, Algorithm::FixedWindow, Fleet::Regions),
        ]
    );
    let t = crate::reload::snapshot::row_tier(&c, &row(Some("fixed_window"))).unwrap();
    assert!(t.key.windows.iter().all(|w| w.fleet == Fleet::Regions));
    for a in [
        "token_bucket",
        "sliding_window",
        "sliding_log",
        "leaky_bucket",
    ] {
        let e = crate::reload::snapshot::row_tier(&c, &row(Some(a))).unwrap_err();
        assert_eq!(e.field(), "algorithm", "{e}");
        assert!(
            e.to_string()
                .contains(&format!("counts fixed_window windows only, not {a}")),
            "{e}"
        );
    }
}

/// What `throttle check` refuses about `fleet`: each row a config and the text whose
/// position the error names, and a part of the message.
#[test]
fn fleet_refusals_name_line_and_column() {
    let rows: Vec<(String, &str, &str)> = vec![
        // `fleet` without [regions], on a table and on a tier.
        (
            with_route("[limits.ip]\nper_minute = 10\nfleet = \"regions\"\n"),
            "\"regions\"",
            "fleet = \"regions\" needs [regions]",
        ),
        (
            with_route("[tiers.free]\nfleet = \"home\"\nkey = { per_minute = 10 }\n"),
            "\"home\"",
            "fleet = \"home\" needs [regions]",
        ),
        // An algorithm without a window identity.
        (
            with_regions(&with_route(
                "[limits.ip]\nper_minute = 10\nalgorithm = \"sliding_window\"\nfleet = \"regions\"\n",
            )),
            "\"sliding_window\"",
            "algorithm = \"sliding_window\" with fleet = \"regions\": one limit across regions counts fixed_window windows only",
        ),
        (
            with_regions(&with_route(
                "[tiers.free]\nfleet = \"regions\"\nkey = { per_minute = 10, algorithm = \"leaky_bucket\" }\n",
            )),
            "\"leaky_bucket\"",
            "algorithm = \"leaky_bucket\" with fleet = \"regions\" (the tier's)",
        ),
        // A table without windows.
        (
            with_regions(&with_route("[limits.ip]\nconcurrent = 5\nfleet = \"regions\"\n")),
            "\"regions\"\n",
            "fleet shares rate windows (per_second .. per_month) across regions; this table has none",
        ),
        (
            with_regions(&with_route(
                "[tiers.free]\nfleet = \"regions\"\nkey = { concurrent = 5 }\ntenant = { concurrent = 50 }\n",
            )),
            "\"regions\"\nkey",
            "[tiers.free] (key and tenant) has none",
        ),
        // Not a fleet.
        (
            with_regions(&with_route("[limits.ip]\nper_minute = 10\nfleet = \"everywhere\"\n")),
            "\"everywhere\"",
            "unknown variant",
        ),
    ];
    for (src, at, says) in rows {
        let e = parse("f.toml", &src).expect_err(&src);
        assert_eq!(e.position, Some(pos_of(&src, at)), "{e}\n{src}");
        assert!(e.message.contains(says), "{e}");
    }
}

/// Every refused algorithm, in every kind of table, is refused at its value.
#[test]
fn every_table_kind_refuses_fleet_regions_on_unaligned_algorithms() {
    for (label, template, _) in TABLES {
        for a in [
            "token_bucket",
            "sliding_window",
            "sliding_log",
            "leaky_bucket",
        ] {
            let alg = format!("algorithm = \"{a}\"");
            let keys = ["per_minute = 100", alg.as_str(), "fleet = \"regions\""];
            let src = with_regions(&config(&fill(template, &keys)));
            let e = parse("f.toml", &src).expect_err(&src);
            let at = pos_of(&src, &format!("\"{a}\""));
            assert_eq!(e.position, Some(at), "{label}: {e}\n{src}");
            assert!(e.message.contains("fixed_window windows only"), "{e}");
            // `fleet = "home"` decides in one Redis: any algorithm.
            let src = src
                .replace("\"regions\"\n", "\"home\"\n")
                .replace("\"regions\" }", "\"home\" }");
            parse("f.toml", &src).unwrap_or_else(|e| panic!("{label}: {e}\n{src}"));
        }
    }
}

/// What `throttle check` refuses in `[regions]`, at the value.
#[test]
fn regions_refusals_name_line_and_column() {
    let region = |body: &str| {
        with_route(&format!(
            "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n[regions]\n{body}\n"
        ))
    };
    let peers = "peers = { us = \"redis://us:6379\" }";
    let rows: Vec<(String, &str, &str)> = vec![
        (
            with_route(&format!("[regions]\nname = \"eu\"\n{peers}\n")),
            "[regions]",
            "[regions] needs [store] backend = \"redis\"",
        ),
        (
            with_route(&format!(
                "[store]\nbackend = \"memory\"\n[regions]\nname = \"eu\"\n{peers}\n"
            )),
            "[regions]",
            "[regions] needs [store] backend = \"redis\"",
        ),
        (
            region(&format!("name = \"EU\"\n{peers}")),
            "\"EU\"",
            "is not a region name",
        ),
        (
            region(&format!("name = \"\"\n{peers}")),
            "\"\"",
            "is not a region name",
        ),
        (
            region(&format!("name = \"{}\"\n{peers}", "e".repeat(33))),
            "\"eee",
            "is not a region name",
        ),
        (
            region("name = \"eu\"\npeers = {}"),
            "{}",
            "at least one peer",
        ),
        (
            region("name = \"eu\"\npeers = { \"u s\" = \"redis://us:6379\" }"),
            "\"redis://us",
            "\"u s\" is not a region name",
        ),
        (
            region("name = \"eu\"\npeers = { us = \"redis://us:6379\", eu = \"redis://x:6379\" }"),
            "\"redis://x",
            "\"eu\" is this region's own name",
        ),
        (
            region("name = \"eu\"\npeers = { us = \"${NOT_SET_ANYWHERE_37}\" }"),
            "\"${NOT",
            "[regions] peers.us: environment variable NOT_SET_ANYWHERE_37 is not set",
        ),
        (
            region(&format!("name = \"eu\"\n{peers}\nsync_ms = 4")),
            "4\n",
            "sync_ms must be at least 5",
        ),
        (
            region(&format!("name = \"eu\"\n{peers}\nsync_ms = 10001")),
            "10001",
            "sync_ms = 10001 is above the maximum of 10000",
        ),
        (
            region(&format!("name = \"eu\"\n{peers}\npartition_secs = 0")),
            "0\n",
            "partition_secs must be at least 1",
        ),
        (
            region(&format!("name = \"eu\"\n{peers}\npartition_secs = 3601")),
            "3601",
            "above the maximum of 3600",
        ),
        (
            region(&format!("name = \"eu\"\n{peers}\nsync_ms = 600")),
            "600",
            "partition_secs = 1 is less than two sync_ms = 600",
        ),
        (
            region(&format!("name = \"eu\"\n{peers}\nunsynced = 0.0")),
            "0.0\n",
            "unsynced must be above 0 and at most 1",
        ),
        (
            region(&format!("name = \"eu\"\n{peers}\nunsynced = 1.5")),
            "1.5\n",
            "unsynced must be above 0 and at most 1",
        ),
        (
            region(&format!("name = \"eu\"\n{peers}\nbudget = 3")),
            "budget",
            "unknown field `budget`",
        ),
        (region(peers), "[regions]", "missing field `name`"),
    ];
    for (src, at, says) in rows {
        let e = parse("f.toml", &src).expect_err(&src);
        assert_eq!(e.position, Some(pos_of(&src, at)), "{e}\n{src}");
        assert!(e.message.contains(says), "{e}");
    }
}

/// `[regions]` as validated: the defaults, the peers sorted by name with their URLs
/// expanded from the environment, and the numbering every region agrees on.
#[test]
fn regions_defaults_env_and_numbering() {
    let src = with_route("[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n[regions]\nname = \"eu\"\npeers = { us = \"${US_REDIS}\", ap = \"${AP_REDIS}\", af = \"redis://af:6379\" }\n");
    let env = |var: &str| match var {
        "US_REDIS" => Ok("rediss://:secret@us.example:6380".to_string()),
        "AP_REDIS" => Ok("redis://ap.example:6379/2".to_string()),
        _ => Err(std::env::VarError::NotPresent),
    };
    let c = parse_with("f.toml", &src, &env).unwrap();
    let r = c.regions.unwrap();
    let peer = |name: &str, url: &str| Peer {
        name: name.into(),
        url: url.into(),
    };
    assert_eq!(
        r,
        Regions {
            name: "eu".into(),
            peers: vec![
                peer("af", "redis://af:6379"),
                peer("ap", "redis://ap.example:6379/2"),
                peer("us", "rediss://:secret@us.example:6380"),
            ],
            sync: Duration::from_millis(50),
            partition: Duration::from_secs(1),
        }
    );
    assert_eq!(r.names(), ["af", "ap", "eu", "us"]);
    assert_eq!((r.count(), r.index()), (4, 2));
    assert!(c.file_warnings.is_empty(), "{:?}", c.file_warnings);
    // Every region numbers the regions alike: each one's index is its place in names().
    for (i, name) in ["af", "ap", "eu", "us"].into_iter().enumerate() {
        let others: Vec<String> = ["af", "ap", "eu", "us"]
            .into_iter()
            .filter(|n| *n != name)
            .map(|n| format!("{n} = \"redis://{n}:6379\""))
            .collect();
        let src = with_route(&format!("[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n[regions]\nname = \"{name}\"\npeers = {{ {} }}\n", others.join(", ")));
        let r = parse("f.toml", &src).unwrap().regions.unwrap();
        assert_eq!((r.index(), r.count()), (i, 4), "{name}");
    }
    // The values given, as a subtable of peers.
    let src = with_route("[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n[regions]\nname = \"us-east_1\"\nsync_ms = 20\npartition_secs = 5\n[regions.peers]\neu = \"redis://eu:6379\"\n");
    let r = parse("f.toml", &src).unwrap().regions.unwrap();
    assert_eq!(
        (r.name.as_str(), r.sync, r.partition, r.count(), r.index()),
        (
            "us-east_1",
            Duration::from_millis(20),
            Duration::from_secs(5),
            2,
            1
        )
    );
    // Without [regions]: none.
    assert_eq!(parse("f.toml", &with_route("")).unwrap().regions, None);
}

/// Warned, at the value, and not refused: `unsynced` (the first contract's budget, now
/// unused) and a `fleet = "regions"` window below the number of regions; not a
/// `fleet = "home"` one.
#[test]
fn unsynced_and_small_regions_limits_warn_at_their_value() {
    let src = with_route("[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n[regions]\nname = \"eu\"\npeers = { us = \"redis://us:6379\", ap = \"redis://ap:6379\" }\nunsynced = 0.02\n[limits.ip]\nper_second = 2\nper_minute = 3\nfleet = \"regions\"\n[limits.global]\nper_second = 1\nfleet = \"home\"\n");
    let c = parse("f.toml", &src).unwrap();
    // At the value of `key = value`.
    let at = |key: &str| {
        let (l, c) = pos_of(&src, key);
        let c = c + key.find("= ").unwrap() + 2;
        format!("f.toml:{l}:{c}: warning: ")
    };
    let w = c.warnings();
    assert_eq!(w.len(), 2, "{w:#?}");
    assert!(
        w[0].starts_with(&at("unsynced = 0.02")) && w[0].contains("unsynced is not used"),
        "{w:#?}"
    );
    assert!(
        w[1].starts_with(&at("per_second = 2"))
            && w[1].contains("per_second = 2 with fleet = \"regions\" is below the 3 regions")
            && w[1].contains("fleet = \"home\" suits small limits"),
        "{w:#?}"
    );
    // At the number of regions: no warning.
    let c = parse(
        "f.toml",
        &src.replace("per_second = 2\n", "per_second = 3\n"),
    )
    .unwrap();
    assert_eq!(c.warnings().len(), 1, "{:?}", c.warnings());
}

/// A change of `[regions]` needs a restart; the warnings are not a setting.
#[test]
fn a_change_of_regions_needs_a_restart() {
    let a = parse("f.toml", &with_regions(&with_route(""))).unwrap();
    let b = parse(
        "f.toml",
        &with_regions(&with_route("")).replace("name = \"eu\"", "name = \"af\""),
    )
    .unwrap();
    assert_eq!(crate::reload::settings::needs_restart(&a, &b), ["regions"]);
    assert!(crate::reload::settings::needs_restart(&a, &a).is_empty());
}

/// The first ```toml block after `heading` in `text`.
fn toml_block<'a>(text: &'a str, heading: &str) -> &'a str {
    let from = text
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?}"));
    let rest = &text[from..];
    let start = rest.find("```toml\n").unwrap() + "```toml\n".len();
    let len = rest[start..].find("```").unwrap();
    &rest[start..start + len]
}

/// The examples of the README and the user page are what they say: `throttle check`
/// accepts them (with their variables set), with the fleets they describe.
#[test]
fn the_documented_examples_pass_the_check() {
    let env = |var: &str| match var {
        "REDIS_URL" | "US_REDIS" | "AP_REDIS" => Ok(format!("redis://{var}.example:6379")),
        _ => Err(std::env::VarError::NotPresent),
    };
    let readme = include_str!("../../../README.md");
    let page = include_str!("../../../docs/src/features/regions.md");
    let examples = [
        toml_block(readme, "## One limit across regions").to_string(),
        with_route(toml_block(page, "## A three-region example")),
    ];
    for src in examples {
        let c = parse_with("f.toml", &src, &env).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let r = c.regions.as_ref().unwrap();
        assert_eq!((r.name.as_str(), r.names()), ("eu", vec!["ap", "eu", "us"]));
        assert_eq!(r.peers[1].url, "redis://US_REDIS.example:6379");
        assert_eq!(
            fleets(&c.tiers["pro"].key.windows),
            [
                (Window::Second, Algorithm::FixedWindow, Fleet::Regions),
                (Window::Day, Algorithm::FixedWindow, Fleet::Regions),
            ]
        );
        let home = c.scopes[0].limits.as_ref().unwrap();
        assert_eq!(home.windows[0].fleet, Fleet::Home);
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    }
}

/// The shipped file's commented `[regions]` example and tier `fleet` line, uncommented
/// on a Redis store, pass the check: the pro tier becomes one limit across regions.
#[test]
fn the_shipped_regions_example_passes_when_uncommented() {
    let mut text = SHIPPED.replacen(
        "backend = \"memory\"",
        "backend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"",
        1,
    );
    let lines = [
        "# [regions]",
        "# name = \"eu\"",
        "# peers = {",
        "# sync_ms = 50",
        "# partition_secs = 1",
        "# fleet = \"regions\"",
    ];
    for line in lines {
        let at = text
            .find(line)
            .unwrap_or_else(|| panic!("{line:?} not shipped"));
        text.replace_range(at..at + 2, "");
    }
    let env = |var: &str| match var {
        "US_REDIS" | "AP_REDIS" => Ok(format!("redis://{var}.example:6379")),
        _ => Err(std::env::VarError::NotPresent),
    };
    let c = parse_with("gateway.toml", &text, &env).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.regions.as_ref().map(Regions::count), Some(3));
    let pro = &c.tiers["pro"];
    let all = pro.key.windows.iter().chain(&pro.tenant.windows);
    assert!(all.clone().count() > 0);
    assert!(all.clone().all(|w| w.fleet == Fleet::Regions), "{pro:?}");
    assert!(all.clone().all(|w| w.algorithm == Algorithm::FixedWindow));
    assert!(c.tiers["free"]
        .key
        .windows
        .iter()
        .all(|w| w.fleet == Fleet::Local));
}
