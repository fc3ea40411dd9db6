//! Calendar quotas in `gateway.toml`: `per_week`, `calendar_tz` and `billing_anchor_day`
//! on every kind of scope table, on tiers and on `[[tenants]]`; what `throttle check`
//! refuses, at `line:col` of the value.

use super::tables::{config, fill, TABLES};
use super::*;
use std::sync::Arc;

use crate::limiter::{ScopeLimits, WindowLimit};

/// The 1-based line and column of the first occurrence of `needle` in `src`.
pub(super) fn pos_of(src: &str, needle: &str) -> (usize, usize) {
    let at = src
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in\n{src}"));
    let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
    (
        src[..at].matches('\n').count() + 1,
        src[line_start..at].chars().count() + 1,
    )
}

/// The scope table a template of `TABLES` builds, from the parsed config.
pub(super) fn table_of(c: &Config, label: &str) -> Arc<ScopeLimits> {
    let route = || &c.routes[0].limits[0].limits;
    match label {
        "[limits.ip]" => c.ip_limits.clone().unwrap(),
        "[limits.global]" => c.global_limits.clone().unwrap(),
        "[limits.auth]" => c.auth_limits.clone().unwrap(),
        "[limits.user]" => c.scopes[0].limits.clone().unwrap(),
        "[tiers.free] key" => c.tiers["free"].key.clone(),
        "[tiers.free] tenant" => c.tiers["free"].tenant.clone(),
        _ => route().clone(),
    }
}

fn calendar_of(w: &WindowLimit) -> Option<(&str, u8)> {
    w.calendar.map(|c| (c.zone(), c.anchor_day()))
}

/// Every kind of scope table takes the three keys: day, week and month windows of the
/// window-aligned algorithms follow the calendar, the others do not.
#[test]
fn every_table_kind_takes_the_calendar_keys() {
    let keys = [
        "per_minute = 100",
        "per_day = 1000",
        "per_week = 5000",
        "per_month = 20000",
        "calendar_tz = \"Europe/Berlin\"",
        "billing_anchor_day = 15",
    ];
    for (label, template, _) in TABLES {
        let src = config(&fill(template, &keys));
        let c = parse("f.toml", &src).unwrap_or_else(|e| panic!("{label}: {e}\n{src}"));
        let t = table_of(&c, label);
        let got: Vec<_> = t
            .windows
            .iter()
            .map(|w| (w.window, calendar_of(w)))
            .collect();
        let berlin = Some(("Europe/Berlin", 15));
        assert_eq!(
            got,
            [
                (Window::Minute, None),
                (Window::Day, berlin),
                (Window::Week, berlin),
                (Window::Month, berlin),
            ],
            "{label}"
        );
    }
}

/// `per_week` without a calendar is a Monday week in UTC (not an epoch week, which
/// starts on a Thursday); a token-bucket week has no calendar.
#[test]
fn per_week_without_a_zone_is_a_monday_week_in_utc() {
    let c = parse(
        "f.toml",
        &config("[limits.ip]\nper_week = 100\n[limits.global]\nper_week = 100\nalgorithm = \"token_bucket\"\n"),
    )
    .unwrap();
    let w = c.ip_limits.as_ref().unwrap().windows[0];
    assert_eq!(
        (w.window, calendar_of(&w)),
        (Window::Week, Some(("UTC", 1)))
    );
    // Wednesday 2026-03-04 12:00 UTC: the week is Monday 2026-03-02 00:00 to Monday 03-09.
    let wed = 1_772_625_600_000;
    assert_eq!(w.bounds(wed, 0), (1_772_409_600_000, 1_773_014_400_000));
    let g = c.global_limits.as_ref().unwrap().windows[0];
    assert_eq!((g.algorithm, g.calendar), (Algorithm::TokenBucket, None));
}

/// What `throttle check` refuses in any scope table, each at its value's `line:col`
/// with a message saying which and why: (keys, the last of which the error points at,
/// words the message holds).
#[test]
fn refusals_name_the_value_and_say_why() {
    let rows: [(&[&str], &[&str]); 9] = [
        (
            &["per_day = 10", "calendar_tz = \"Mars/Olympus\""],
            &["unknown time zone `Mars/Olympus`", "IANA"],
        ),
        (
            &["per_month = 10", "billing_anchor_day = 29"],
            &["billing_anchor_day must be 1..=28", "got 29"],
        ),
        (
            &["per_month = 10", "billing_anchor_day = 0"],
            &["billing_anchor_day must be 1..=28", "got 0"],
        ),
        (
            &["per_minute = 10", "calendar_tz = \"Europe/Berlin\""],
            &["calendar_tz aligns day, week and month windows of fixed_window and sliding_window; this table has none (it has no per_day, per_week or per_month)"],
        ),
        (
            &[
                "per_day = 10",
                "algorithm = \"token_bucket\"",
                "calendar_tz = \"Europe/Berlin\"",
            ],
            &["this table has none (per_day uses token_bucket)"],
        ),
        (
            &["per_day = 10", "billing_anchor_day = 15"],
            &["billing_anchor_day starts the month windows of fixed_window and sliding_window on that day; this table has none (it has no per_month)"],
        ),
        (
            &["per_week = 0"],
            &["per_week must be at least 1"],
        ),
        (
            &["algorithm = \"sliding_window\"", "per_week = 1000000000"],
            &["per_week = 1000000000 is too large for sliding_window"],
        ),
        (
            &["per_week = 2000000000"],
            &["per_week = 2000000000 is above the maximum"],
        ),
    ];
    for (label, template, _) in TABLES {
        for (keys, words) in rows {
            let src = config(&fill(template, keys));
            let e = parse("f.toml", &src).expect_err(&src);
            let last = keys[keys.len() - 1];
            let (line, col) = pos_of(&src, last);
            let value = last.find("= ").unwrap() + 2;
            assert_eq!(e.position, Some((line, col + value)), "{label}: {e}\n{src}");
            for w in words {
                assert!(e.message.contains(w), "{label}: {e} lacks {w:?}");
            }
        }
    }
}

/// A tier's `calendar_tz` / `billing_anchor_day` are its key and tenant tables'
/// defaults, each key apart; a table's own key wins. A tier none of whose tables it
/// would move is refused at its key, unless key windows may come from the database.
#[test]
fn a_tier_calendar_is_its_tables_default() {
    let src = config(
        "[tiers.pro]\ncalendar_tz = \"America/Los_Angeles\"\nbilling_anchor_day = 15\n\
         key = { per_day = 10, per_month = 100, calendar_tz = \"Asia/Tokyo\" }\n\
         tenant = { per_month = 1000, per_minute = 5 }\n",
    );
    let c = parse("f.toml", &src).unwrap();
    let pro = &c.tiers["pro"];
    let key: Vec<_> = pro.key.windows.iter().map(calendar_of).collect();
    assert_eq!(key, [Some(("Asia/Tokyo", 15)), Some(("Asia/Tokyo", 15))]);
    let tenant: Vec<_> = pro.tenant.windows.iter().map(calendar_of).collect();
    assert_eq!(tenant, [None, Some(("America/Los_Angeles", 15))]);
    // What a policy row or a key's override builds key windows with.
    assert_eq!(
        pro.key_settings
            .calendar
            .map(|c| (c.zone(), c.anchor_day())),
        Some(("Asia/Tokyo", 15))
    );

    let unaligned = "[tiers.free]\ncalendar_tz = \"Europe/Paris\"\nkey = { per_minute = 10 }\ntenant = { per_day = 10, algorithm = \"token_bucket\" }\n";
    let src = config(unaligned);
    let e = parse("f.toml", &src).unwrap_err();
    assert_eq!(e.position, Some(pos_of(&src, "\"Europe/Paris\"")), "{e}");
    assert!(
        e.message
            .contains("[tiers.free] (key and tenant) has none (per_day uses token_bucket)"),
        "{e}"
    );
    let bad = config("[tiers.free]\nbilling_anchor_day = 31\nkey = { per_month = 10 }\n");
    let e = parse("f.toml", &bad).unwrap_err();
    assert_eq!(e.position, Some(pos_of(&bad, "31")), "{e}");
    // With a database the key windows may be a policy row's: accepted.
    let db = "[database]\nurl = \"postgres://127.0.0.1/x\"\n";
    parse("f.toml", &format!("{db}{unaligned}{ROUTE}")).unwrap();
}

/// `[[tenants]]` `calendar_tz` / `billing_anchor_day`: the tenant's own tier (made at
/// load, in `tenant_tiers`) has its tenant windows on that calendar over the tier's;
/// its key windows and the tier itself stay as they are.
#[test]
fn a_tenant_calendar_makes_its_own_tier() {
    let tier = "[tiers.pro]\ncalendar_tz = \"Europe/Berlin\"\nbilling_anchor_day = 15\nkey = { per_day = 10 }\ntenant = { per_day = 100, per_month = 1000 }\n";
    let tenants =
        "[[tenants]]\nid = \"kiwi\"\ntier = \"pro\"\ncalendar_tz = \"Pacific/Auckland\"\n\
                   [[tenants]]\nid = \"la\"\ntier = \"pro\"\nbilling_anchor_day = 1\n\
                   [[tenants]]\nid = \"plain\"\ntier = \"pro\"\n";
    let c = parse("f.toml", &config(&format!("{tier}{tenants}"))).unwrap();
    fn zones(t: &Tier) -> Vec<Option<(&str, u8)>> {
        t.tenant.windows.iter().map(calendar_of).collect()
    }
    let kiwi = &c.tenant_tiers["kiwi"];
    assert_eq!(zones(kiwi), [Some(("Pacific/Auckland", 15)); 2]);
    assert_eq!(
        zones(&c.tenant_tiers["la"]),
        [Some(("Europe/Berlin", 1)); 2]
    );
    assert!(!c.tenant_tiers.contains_key("plain"));
    assert_eq!(zones(&c.tiers["pro"]), [Some(("Europe/Berlin", 15)); 2]);
    assert_eq!(
        (kiwi.name.as_str(), &kiwi.key),
        ("pro", &c.tiers["pro"].key)
    );
    assert_eq!(c.tenants["kiwi"], "pro");

    // Refused, at the value: an unknown zone, a bad anchor, and a tier whose tenant
    // table has no window the setting would move.
    let rows: [(&str, &str, &str); 3] = [
        ("calendar_tz = \"Pacific/Atlantis\"", "\"Pacific/Atlantis\"", "unknown time zone"),
        ("billing_anchor_day = 40", "40", "billing_anchor_day must be 1..=28"),
        (
            "calendar_tz = \"Asia/Tokyo\"",
            "\"Asia/Tokyo\"",
            "calendar_tz aligns day, week and month windows of fixed_window and sliding_window; tenant \"t\"'s tier \"hourly\" tenant table has none (it has no per_day, per_week or per_month)",
        ),
    ];
    for (key, at, words) in rows {
        let tier = if words.contains("hourly") {
            "hourly"
        } else {
            "pro"
        };
        let src = config(&format!(
            "{}[tiers.hourly]\ntenant = {{ per_hour = 10 }}\n[[tenants]]\nid = \"t\"\ntier = \"{tier}\"\n{key}\n",
            "[tiers.pro]\ntenant = { per_day = 100, per_month = 1000 }\n"
        ));
        let e = parse("f.toml", &src).expect_err(&src);
        assert_eq!(e.position, Some(pos_of(&src, at)), "{e}\n{src}");
        assert!(e.message.contains(words), "{e}");
    }
}
