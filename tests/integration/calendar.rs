//! Calendar quotas against the real binary, its clock started at a chosen instant
//! (`THROTTLE_CLOCK_START_MS`): days at local midnight across both DST changes (23 and 25
//! hours), a quota spent before local midnight admitted again right after it, months
//! ending on the last day (February of 2027 and of the leap year 2028), a billing anchor
//! on the 15th, Monday weeks (in UTC without a zone), and tenants in Pacific/Auckland and America/Los_Angeles resetting at
//! their own midnights (`[[tenants]]`, and the tenants table's columns through the admin
//! API). `X-RateLimit-Reset`, `Retry-After`, the 429 body's `retry_after`, the IETF
//! `w`, and `/v1/usage` all name the exact instant. On the memory store and on a private
//! Redis with leases (admission auto, the default).
//!
//! Every expected instant is a literal Unix second, with its local and UTC time beside it
//! (computed by hand from the zones' rules, not by the code under test).

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::support::postgres::TestDb;
use crate::support::redis::RedisServer;
use crate::support::{client, eventually, header, Gateway, Upstream, ADMIN_TOKEN};

static PREFIX: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Where the gateway counts: memory, or a private Redis with leases.
enum Store {
    Memory,
    Redis(RedisServer),
}

impl Store {
    async fn redis() -> Self {
        Store::Redis(RedisServer::start().await)
    }

    fn section(&self) -> String {
        match self {
            Store::Memory => "[store]\nbackend = \"memory\"\n".into(),
            // A prefix of its own for each gateway: each starts its clock afresh.
            Store::Redis(r) => format!(
                "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"calendar{}\"\ntimeout_ms = 2000\n",
                r.url(),
                PREFIX.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
        }
    }
}

/// A gateway on `store` running `body` (`{upstream}` is `up`), its clock started at Unix
/// second `start`, with both header styles; and the instant just before it was spawned
/// (its clock reads at most `start` + the time elapsed since).
async fn gateway(store: &Store, body: &str, up: &Upstream, start: u64) -> (Gateway, Instant) {
    let body = format!("{}\n{}", store.section(), body).replace("{upstream}", &up.addr.to_string());
    let ms = (start * 1000).to_string();
    let t0 = Instant::now();
    let gw = Gateway::start_env(
        &["run"],
        &body,
        "grace_period_secs = 0\nrate_limit_headers = \"both\"",
        &[("THROTTLE_CLOCK_START_MS", Some(&ms))],
    )
    .await;
    (gw, t0)
}

/// `[limits.ip]` with `table` (its windows and calendar), one open route.
fn ip_config(table: &str) -> String {
    format!(
        "[limits.ip]\n{table}\n\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstreams = [\"{{upstream}}\"]\nauth = \"none\"\n"
    )
}

/// What one request saw.
#[derive(Debug)]
struct Seen {
    status: u16,
    reset: u64,
    retry_after: Option<u64>,
    policy: String,
    body: Value,
}

async fn get(gw: &Gateway, key: Option<&str>) -> Seen {
    let mut req = client().get(gw.url("/x"));
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let reset = header(&r, "x-ratelimit-reset").parse().unwrap_or(0);
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let policy = header(&r, "ratelimit-policy");
    let body = r.json().await.unwrap_or(Value::Null);
    Seen {
        status,
        reset,
        retry_after,
        policy,
        body,
    }
}

/// A 429 whose `Retry-After` and body `retry_after` point at `reset`: the gateway's clock
/// read between `start` and `start` + the time since `t0`, so the wait is at most
/// `reset - start` and at least that less the elapsed time (rounded up).
fn assert_points_at(seen: &Seen, reset: u64, start: u64, t0: Instant) {
    assert_eq!(seen.status, 429, "{seen:?}");
    assert_eq!(seen.reset, reset, "X-RateLimit-Reset: {seen:?}");
    let most = reset - start;
    let least = most.saturating_sub(t0.elapsed().as_secs() + 1);
    let retry = seen.retry_after.expect("Retry-After");
    assert!(
        (least..=most).contains(&retry),
        "Retry-After {retry} not in {least}..={most}"
    );
    // The body's `retry_after` is in seconds with a fraction.
    let body = seen.body["retry_after"].as_f64().expect("retry_after");
    assert!(
        (least as f64..=most as f64).contains(&body),
        "retry_after {body} not in {least}..={most}: {seen:?}"
    );
}

// 2026-03-29 is the spring-forward day in Berlin (23 hours), 2026-10-25 the fall-back
// day (25 hours).
/// 2026-03-29 12:00:00 UTC (14:00 CEST).
const SPRING_NOON: u64 = 1_774_785_600;
/// 2026-03-30 00:00 CEST = 2026-03-29 22:00:00 UTC.
const SPRING_NEXT_MIDNIGHT: u64 = 1_774_821_600;
/// 2026-10-25 12:00:00 UTC (13:00 CET).
const FALL_NOON: u64 = 1_792_929_600;
/// 2026-10-26 00:00 CET = 2026-10-25 23:00:00 UTC.
const FALL_NEXT_MIDNIGHT: u64 = 1_792_969_200;

/// The spring-forward day is 23 hours and the fall-back day 25: `X-RateLimit-Reset` is
/// the next local midnight, `RateLimit-Policy` gives the day's true length, and a 429's
/// `Retry-After` and `retry_after` point at that midnight.
async fn dst_days(store: Store) {
    let up = Upstream::start("u").await;
    let cfg =
        ip_config("per_day = 2\nalgorithm = \"fixed_window\"\ncalendar_tz = \"Europe/Berlin\"");
    for (start, midnight, len) in [
        (SPRING_NOON, SPRING_NEXT_MIDNIGHT, 82_800),
        (FALL_NOON, FALL_NEXT_MIDNIGHT, 90_000),
    ] {
        let (gw, t0) = gateway(&store, &cfg, &up, start).await;
        for _ in 0..2 {
            let s = get(&gw, None).await;
            assert_eq!((s.status, s.reset), (200, midnight), "{s:?}");
            assert!(
                s.policy.contains(&format!("\"ip-1d\";q=2;w={len}")),
                "{s:?}"
            );
        }
        let s = get(&gw, None).await;
        assert_points_at(&s, midnight, start, t0);
        assert_eq!(s.body["window"], "1d", "{s:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dst_days_reset_at_the_next_local_midnight_memory() {
    dst_days(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dst_days_reset_at_the_next_local_midnight_redis() {
    dst_days(Store::redis().await).await;
}

/// 2026-03-31 00:00 CEST = 2026-03-30 22:00:00 UTC: the day after SPRING_NEXT_MIDNIGHT.
const DAY_AFTER_MIDNIGHT: u64 = 1_774_908_000;

/// A day's quota of 20 spent seconds before local midnight is refused until midnight and
/// admitted right after it: the admit carries the next day's reset, and came no earlier
/// than the midnight (the gateway's clock cannot have passed it sooner). On Redis the
/// quota is spent on leased tokens, across the edge.
async fn spent_before_midnight(store: Store) {
    let up = Upstream::start("u").await;
    let cfg =
        ip_config("per_day = 20\nalgorithm = \"fixed_window\"\ncalendar_tz = \"Europe/Berlin\"");
    let lead = 25; // the window must not end before the spending is done: room for a loaded CI machine
    let start = SPRING_NEXT_MIDNIGHT - lead;
    let (gw, t0) = gateway(&store, &cfg, &up, start).await;
    for _ in 0..20 {
        let s = get(&gw, None).await;
        assert_eq!((s.status, s.reset), (200, SPRING_NEXT_MIDNIGHT), "{s:?}");
    }
    let s = get(&gw, None).await;
    assert_points_at(&s, SPRING_NEXT_MIDNIGHT, start, t0);
    let admitted = eventually(
        Duration::from_secs(lead + 10),
        "admitted after midnight",
        || async {
            let s = get(&gw, None).await;
            match s.status {
                200 => Some(s),
                429 => {
                    assert_eq!(s.reset, SPRING_NEXT_MIDNIGHT, "{s:?}");
                    None
                }
                _ => panic!("{s:?}"),
            }
        },
    )
    .await;
    assert!(
        t0.elapsed() >= Duration::from_secs(lead),
        "admitted {:?} after a start {lead} s before midnight",
        t0.elapsed()
    );
    assert_eq!(admitted.reset, DAY_AFTER_MIDNIGHT, "{admitted:?}");
    assert!(admitted.policy.contains(";w=86400"), "{admitted:?}");
    if let Store::Redis(_) = store {
        let leased = r#"throttle_local_decisions_total{reason="lease"}"#;
        let m = gw.metrics().await;
        let n: f64 = m
            .lines()
            .find_map(|l| l.strip_prefix(leased))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0);
        assert!(n > 0.0, "no request admitted on a lease:\n{m}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quota_spent_before_midnight_admits_right_after_it_memory() {
    spent_before_midnight(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quota_spent_before_midnight_admits_right_after_it_redis() {
    spent_before_midnight(Store::redis().await).await;
}

/// Month windows in Berlin: (clock start, the month's end, the month's length in s).
const MONTHS: [(u64, u64, u64); 4] = [
    // 2027-01-31 12:00 CET (11:00 UTC): January ends 2027-02-01 00:00 CET = 2027-01-31
    // 23:00 UTC; 31 days.
    (1_801_393_200, 1_801_436_400, 31 * 86_400),
    // 2027-02-28 12:00 CET: February 2027 ends 2027-03-01 00:00 CET = 2027-02-28 23:00
    // UTC; 28 days.
    (1_803_812_400, 1_803_855_600, 28 * 86_400),
    // 2028-02-28 12:00 CET: in the leap year February ends 2028-03-01 00:00 CET =
    // 2028-02-29 23:00 UTC; 29 days.
    (1_835_348_400, 1_835_478_000, 29 * 86_400),
    // 2028-02-29 12:00 CET: still February 2028.
    (1_835_434_800, 1_835_478_000, 29 * 86_400),
];

/// Anchored months (`billing_anchor_day = 15`): (clock start, the period's end, length).
const ANCHORED: [(u64, u64, u64); 2] = [
    // 2026-05-20 12:00 CEST: the period 2026-05-15 .. 2026-06-15 00:00 CEST = 2026-06-14
    // 22:00 UTC; 31 days.
    (1_779_271_200, 1_781_474_400, 31 * 86_400),
    // 2026-05-10 12:00 CEST: the period 2026-04-15 .. 2026-05-15 00:00 CEST = 2026-05-14
    // 22:00 UTC; 30 days.
    (1_778_407_200, 1_778_796_000, 30 * 86_400),
];

/// Weeks: (config, clock start, the week's end, its length in s).
const WEEKS: [(&str, u64, u64, u64); 2] = [
    // Without calendar_tz a Monday week in UTC: Wednesday 2026-03-04 12:00 UTC; the week
    // ends Monday 2026-03-09 00:00:00 UTC (an epoch week would end on a Thursday).
    ("per_week = 1", 1_772_625_600, 1_773_014_400, 604_800),
    // In Berlin across the spring change: Wednesday 2026-03-25 12:00 UTC; the week ends
    // Monday 2026-03-30 00:00 CEST = 2026-03-29 22:00 UTC, one hour short of 7 days.
    (
        "per_week = 1\ncalendar_tz = \"Europe/Berlin\"",
        1_774_440_000,
        1_774_821_600,
        604_800 - 3_600,
    ),
];

/// A Monday week ends at Monday's midnight (UTC without a zone, local with one).
async fn weeks(store: &Store, up: &Upstream) {
    for (table, start, end, len) in WEEKS {
        let (gw, t0) = gateway(store, &ip_config(table), up, start).await;
        let s = get(&gw, None).await;
        assert_eq!((s.status, s.reset), (200, end), "{table}: {s:?}");
        assert!(
            s.policy.contains(&format!("\"ip-1w\";q=1;w={len}")),
            "{table}: {s:?}"
        );
        assert_points_at(&get(&gw, None).await, end, start, t0);
    }
}

/// A month ends at local midnight after its last day (January 31; February 28, and 29
/// in 2028); with `billing_anchor_day = 15` the period ends at local midnight starting
/// the 15th. Then the weeks.
async fn months(store: Store) {
    let up = Upstream::start("u").await;
    let plain = ip_config("per_month = 1\ncalendar_tz = \"Europe/Berlin\"");
    let anchored =
        ip_config("per_month = 1\ncalendar_tz = \"Europe/Berlin\"\nbilling_anchor_day = 15");
    let cases = MONTHS
        .iter()
        .map(|m| (&plain, m))
        .chain(ANCHORED.iter().map(|m| (&anchored, m)));
    for (cfg, &(start, end, len)) in cases {
        let (gw, t0) = gateway(&store, cfg, &up, start).await;
        let s = get(&gw, None).await;
        assert_eq!((s.status, s.reset), (200, end), "start {start}: {s:?}");
        assert!(
            s.policy.contains(&format!("\"ip-1mo\";q=1;w={len}")),
            "start {start}: {s:?}"
        );
        assert_points_at(&get(&gw, None).await, end, start, t0);
    }
    weeks(&store, &up).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn months_and_weeks_end_on_their_calendar_edges_memory() {
    months(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn months_and_weeks_end_on_their_calendar_edges_redis() {
    months(Store::redis().await).await;
}

/// 2026-06-02 00:00 NZST (Pacific/Auckland, UTC+12) = 2026-06-01 12:00:00 UTC.
const AUCKLAND_MIDNIGHT: u64 = 1_780_315_200;
/// 2026-06-02 00:00 PDT (America/Los_Angeles, UTC-7) = 2026-06-02 07:00:00 UTC.
const LA_MIDNIGHT: u64 = 1_780_383_600;
/// 2026-06-02 00:00 UTC (the tier's calendar: none, so UTC).
const UTC_MIDNIGHT: u64 = 1_780_358_400;

const KIWI_KEY: &str = "kiwi-key-0123456789";
const LA_KEY: &str = "la-key-0123456789";

/// Tier `pro`: a tenant day of 2 (its calendar UTC unless the tenant says otherwise),
/// keys at 100 a minute. `tenants` is the `[[tenants]]` entries.
fn tenant_config(tenants: &str) -> String {
    format!(
        r#"[tiers.pro]
key = {{ per_minute = 100 }}
tenant = {{ per_day = 2, algorithm = "fixed_window" }}

[[keys]]
id = "kiwi-1"
key = "{KIWI_KEY}"
tenant = "kiwi"
tier = "pro"

[[keys]]
id = "la-1"
key = "{LA_KEY}"
tenant = "la"
tier = "pro"

{tenants}

[[routes]]
name = "all"
path_prefix = "/"
upstreams = ["{{upstream}}"]
"#
    )
}

/// The `tenant` window of `/v1/usage?tenant=<id>`.
async fn tenant_usage(gw: &Gateway, id: &str) -> Value {
    let r = client()
        .get(gw.admin_url(&format!("/v1/usage?tenant={id}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    v["windows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["scope"] == "tenant" && w["window"] == "1d")
        .cloned()
        .unwrap_or_else(|| panic!("{v}"))
}

/// Two tenants of one tier in their own zones: both spend their day seconds before
/// Auckland's midnight; the Auckland tenant is admitted again right after it, the Los
/// Angeles tenant stays refused until its own midnight 19 hours later. The headers and
/// `/v1/usage` name each tenant's own midnight.
async fn tenants_at_their_own_midnights(store: Store) {
    let up = Upstream::start("u").await;
    let cfg = tenant_config(
        "[[tenants]]\nid = \"kiwi\"\ntier = \"pro\"\ncalendar_tz = \"Pacific/Auckland\"\n\
         [[tenants]]\nid = \"la\"\ntier = \"pro\"\ncalendar_tz = \"America/Los_Angeles\"\n",
    );
    let lead = 25; // the window must not end before the spending is done: room for a loaded CI machine
    let start = AUCKLAND_MIDNIGHT - lead;
    let (gw, t0) = gateway(&store, &cfg, &up, start).await;
    for (key, midnight) in [(KIWI_KEY, AUCKLAND_MIDNIGHT), (LA_KEY, LA_MIDNIGHT)] {
        for _ in 0..2 {
            let s = get(&gw, Some(key)).await;
            assert_eq!((s.status, s.reset), (200, midnight), "{key}: {s:?}");
        }
        let s = get(&gw, Some(key)).await;
        assert_points_at(&s, midnight, start, t0);
        assert_eq!(s.body["scope"], "tenant", "{s:?}");
    }
    assert_eq!(tenant_usage(&gw, "kiwi").await["reset"], AUCKLAND_MIDNIGHT);
    assert_eq!(tenant_usage(&gw, "la").await["reset"], LA_MIDNIGHT);
    let admitted = eventually(Duration::from_secs(lead + 10), "kiwi admitted", || async {
        let s = get(&gw, Some(KIWI_KEY)).await;
        (s.status == 200).then_some(s)
    })
    .await;
    assert!(
        t0.elapsed() >= Duration::from_secs(lead),
        "{:?}",
        t0.elapsed()
    );
    // The next Auckland midnight: 2026-06-03 00:00 NZST = 2026-06-02 12:00:00 UTC.
    assert_eq!(admitted.reset, 1_780_401_600, "{admitted:?}");
    let la = get(&gw, Some(LA_KEY)).await;
    assert_points_at(&la, LA_MIDNIGHT, start, t0);
    let usage = tenant_usage(&gw, "la").await;
    assert_eq!(
        (usage["reset"].as_u64(), usage["remaining"].as_u64()),
        (Some(LA_MIDNIGHT), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_reset_at_their_own_midnights_memory() {
    tenants_at_their_own_midnights(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_reset_at_their_own_midnights_redis() {
    tenants_at_their_own_midnights(Store::redis().await).await;
}

/// 2026-06-01 10:00:00 UTC (22:00 in Auckland, 03:00 in Los Angeles).
const JUNE_FIRST: u64 = 1_780_308_000;

async fn admin(gw: &Gateway, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
    let r = client()
        .request(method, gw.admin_url(path))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The tenants table's `calendar_tz` and `billing_anchor_day`, through the admin API:
/// created, read back and replaced; a bad zone or anchor is 400 naming the field (and
/// the column refuses an anchor outside 1..=28 written in SQL); the tenant's windows
/// follow the row at once, and `/v1/usage` names the instant.
#[tokio::test(flavor = "multi_thread")]
async fn the_tenants_table_gives_a_tenant_its_own_calendar() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let body = format!(
        "[database]\nurl = \"{}\"\n\n[tiers.pro]\nkey = {{ per_minute = 100 }}\ntenant = {{ per_day = 2, algorithm = \"fixed_window\" }}\n\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstreams = [\"{{upstream}}\"]\n",
        db.url
    );
    let (gw, _) = gateway(&Store::Memory, &body, &up, JUNE_FIRST).await;
    use reqwest::Method;
    let bad = [
        (
            json(r#"{"id":"x","tier":"pro","calendar_tz":"Mars/Olympus"}"#),
            "calendar_tz",
        ),
        (
            json(r#"{"id":"x","tier":"pro","billing_anchor_day":29}"#),
            "billing_anchor_day",
        ),
        (
            json(r#"{"id":"x","tier":"pro","billing_anchor_day":"15"}"#),
            "billing_anchor_day",
        ),
    ];
    for (b, field) in bad {
        let (status, v) = admin(&gw, Method::POST, "/v1/tenants", b).await;
        assert_eq!((status, v["field"].as_str()), (400, Some(field)), "{v}");
    }
    let (status, v) = admin(
        &gw,
        Method::POST,
        "/v1/tenants",
        json(r#"{"id":"kiwi","tier":"pro","calendar_tz":"Pacific/Auckland"}"#),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(
        (&v["calendar_tz"], &v["billing_anchor_day"]),
        (&json(r#""Pacific/Auckland""#), &Value::Null)
    );
    let (status, v) = admin(
        &gw,
        Method::POST,
        "/v1/tenants",
        json(r#"{"id":"la","tier":"pro","calendar_tz":"America/Los_Angeles","billing_anchor_day":15}"#),
    )
    .await;
    assert_eq!(
        (status, v["billing_anchor_day"].as_u64()),
        (201, Some(15)),
        "{v}"
    );
    let mut keys = Vec::new();
    for tenant in ["kiwi", "la"] {
        let (status, v) = admin(
            &gw,
            Method::POST,
            "/v1/keys",
            serde_json::json!({"tenant": tenant, "tier": "pro"}),
        )
        .await;
        assert_eq!(status, 201, "{v}");
        keys.push(v["key"].as_str().unwrap().to_string());
    }
    for (key, midnight) in [(&keys[0], AUCKLAND_MIDNIGHT), (&keys[1], LA_MIDNIGHT)] {
        let s = get(&gw, Some(key)).await;
        assert_eq!((s.status, s.reset), (200, midnight), "{s:?}");
    }
    assert_eq!(tenant_usage(&gw, "kiwi").await["reset"], AUCKLAND_MIDNIGHT);
    // Replaced without a calendar: the tier's (UTC), at once on this gateway.
    let (status, v) = admin(
        &gw,
        Method::PUT,
        "/v1/tenants/la",
        json(r#"{"tier":"pro"}"#),
    )
    .await;
    assert_eq!((status, &v["calendar_tz"]), (200, &Value::Null), "{v}");
    let s = get(&gw, Some(&keys[1])).await;
    assert_eq!((s.status, s.reset), (200, UTC_MIDNIGHT), "{s:?}");
    assert_eq!(tenant_usage(&gw, "la").await["reset"], UTC_MIDNIGHT);
    let (status, v) = admin(&gw, Method::GET, "/v1/tenants/kiwi", Value::Null).await;
    assert_eq!(
        (status, &v["calendar_tz"]),
        (200, &json(r#""Pacific/Auckland""#)),
        "{v}"
    );
    // The column's CHECK, for writes that bypass the API.
    let pool = db.pool().await;
    let refused = sqlx::query("UPDATE tenants SET billing_anchor_day = 29 WHERE id = 'kiwi'")
        .execute(&pool)
        .await;
    assert!(refused.is_err(), "{refused:?}");
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}
