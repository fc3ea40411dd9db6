//! The snapshot's tenants with their own calendar (`own_tenant_tiers`): the tenants
//! table's columns, `[[tenants]]` entries the table does not override, and the tier each
//! caller's tenant windows are counted at.

use std::collections::HashSet;

use super::*;
use crate::db::keys::ActiveKey;
use crate::db::policies::PolicyRow;
use crate::db::tenants::TenantRecord;

const CONFIG: &str = r#"
[tiers.pro]
calendar_tz = "Europe/Berlin"
key = { per_day = 100 }
tenant = { per_day = 1000, per_month = 9000, algorithm = "fixed_window" }
[[tenants]]
id = "file_kiwi"
tier = "pro"
calendar_tz = "Pacific/Auckland"
[[tenants]]
id = "file_then_row"
tier = "pro"
calendar_tz = "Asia/Tokyo"
[[routes]]
name = "all"
path_prefix = "/"
upstreams = ["127.0.0.1:9000"]
"#;

fn record(id: &str, zone: Option<&str>, anchor: Option<i16>) -> TenantRecord {
    TenantRecord {
        id: id.into(),
        tier: "pro".into(),
        calendar_tz: zone.map(Into::into),
        billing_anchor_day: anchor,
    }
}

fn key(id: &str, tenant: &str) -> ActiveKey {
    ActiveKey {
        id: id.into(),
        tenant: tenant.into(),
        tier: "pro".into(),
        policy_id: None,
        sha256: <sha2::Sha256 as sha2::Digest>::digest(id.as_bytes()).into(),
        custom_override: None,
    }
}

/// Each row: a tenant, and the (zone, anchor) its tenant windows follow (the tier's
/// Berlin when it has nothing of its own); the key windows are always the tier's.
#[test]
fn a_tenant_is_counted_on_its_own_calendar() {
    let c = crate::config::parse("t.toml", CONFIG).unwrap();
    let m = Metrics::new().unwrap();
    let records = Records {
        tenants: vec![
            record("row_la", Some("America/Los_Angeles"), Some(15)),
            record("row_anchor", None, Some(3)),
            record("row_plain", None, None),
            // The table's row wins over the file's entry, and has no calendar of its own.
            record("file_then_row", None, None),
            record("row_bad", Some("Mars/Olympus"), None),
        ],
        keys: [
            "row_la",
            "row_anchor",
            "row_plain",
            "file_then_row",
            "row_bad",
            "file_kiwi",
        ]
        .iter()
        .map(|t| key(&format!("k_{t}"), t))
        .collect(),
        ..Records::default()
    };
    let d = build(&c, records, &m, &HashSet::new());
    let rows = [
        ("row_la", ("America/Los_Angeles", 15)),
        ("row_anchor", ("Europe/Berlin", 3)),
        ("row_plain", ("Europe/Berlin", 1)),
        ("file_then_row", ("Europe/Berlin", 1)),
        ("row_bad", ("Europe/Berlin", 1)),
        ("file_kiwi", ("Pacific/Auckland", 1)),
    ];
    for (tenant, want) in rows {
        let of = |t: &Tier| -> Vec<(String, u8)> {
            let cal = |w: &crate::limiter::WindowLimit| {
                w.calendar.map(|c| (c.zone().to_string(), c.anchor_day()))
            };
            t.tenant.windows.iter().filter_map(cal).collect()
        };
        let want = vec![(want.0.to_string(), want.1); 2];
        let by_rule = d.tenant_tier(&c, tenant).unwrap();
        assert_eq!(of(&by_rule), want, "{tenant} by the rule");
        let info = d.keys.lookup(format!("k_{tenant}").as_bytes()).unwrap();
        assert_eq!(of(&info.tenant_tier), want, "{tenant}'s key");
        assert_eq!(
            info.tenant_tier.key, c.tiers["pro"].key,
            "{tenant}: key windows"
        );
    }
    let own: HashSet<&str> = d.tenant_tiers.keys().map(String::as_str).collect();
    assert_eq!(own, HashSet::from(["row_la", "row_anchor", "file_kiwi"]));
}

/// A `rate_limit_policies` row replaces a config tier's key windows by its columns; a
/// `per_week` window, which no column holds, stays the config's, on its calendar, in
/// order; the row's windows keep the tier's calendar.
#[test]
fn a_policy_row_keeps_the_config_week() {
    let cfg = CONFIG.replace(
        "key = { per_day = 100 }",
        "key = { per_day = 100, per_week = 500 }",
    );
    let c = crate::config::parse("t.toml", &cfg).unwrap();
    let m = Metrics::new().unwrap();
    let row = PolicyRow {
        id: "pro".into(),
        name: "pro".into(),
        limits: [None, Some(60), None, Some(200), Some(3000)],
        burst_multiplier: None,
        algorithm: Some("fixed_window".into()),
    };
    let records = Records {
        policies: vec![row],
        keys: vec![key("k", "row_plain")],
        ..Records::default()
    };
    let d = build(&c, records, &m, &HashSet::new());
    let tier = &d.keys.lookup(b"k").unwrap().tier;
    let got: Vec<_> = tier
        .key
        .windows
        .iter()
        .map(|w| (w.window, w.limit, w.calendar.map(|c| c.zone().to_string())))
        .collect();
    let berlin = || Some("Europe/Berlin".to_string());
    use crate::limiter::Window;
    assert_eq!(
        got,
        [
            (Window::Minute, 60, None),
            (Window::Day, 200, berlin()),
            (Window::Week, 500, berlin()),
            (Window::Month, 3000, berlin()),
        ]
    );
}
