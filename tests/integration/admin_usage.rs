//! `GET /v1/usage`: every window of a key, tenant or IP, read without spending, on the
//! memory store and on Redis with leases.

use serde_json::Value;
use throttle::clock::{Clock, SystemClock};

use crate::support::redis::RedisServer;
use crate::support::{client, Gateway, Upstream, ADMIN_TOKEN};

const LIMITS: &str = r#"
[limits.ip]
per_minute = 50

[tiers.free]
key = { per_minute = 20, per_hour = 100 }
tenant = { per_minute = 30 }

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]

[[keys]]
id = "key_a"
key = "key-a-secret"
tenant = "acme"
tier = "free"
"#;

async fn usage(gw: &Gateway, query: &str) -> (u16, Value) {
    let r = client()
        .get(gw.admin_url(&format!("/v1/usage?{query}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn spend(gw: &Gateway, n: usize) {
    for _ in 0..n {
        let r = client()
            .get(gw.url("/x"))
            .header("x-api-key", "key-a-secret")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

/// (scope, window) -> used, of a usage answer, checking limit = used + remaining.
fn used(body: &Value) -> Vec<(String, String, u64)> {
    let now = SystemClock.now_ms() / 1000;
    body["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let (limit, used, remaining) = (
                w["limit"].as_u64().unwrap(),
                w["used"].as_u64().unwrap(),
                w["remaining"].as_u64().unwrap(),
            );
            assert_eq!(limit, used + remaining, "{w}");
            let reset = w["reset"].as_u64().unwrap();
            assert!(reset >= now && reset <= now + 2 * 3600 + 60, "{w}");
            (
                w["scope"].as_str().unwrap().to_string(),
                w["window"].as_str().unwrap().to_string(),
                used,
            )
        })
        .collect()
}

/// On memory: after 3 requests every window of the key, its tenant and the address says
/// used 3, and asking twice spends nothing; bad queries name the field.
#[tokio::test(flavor = "multi_thread")]
async fn admin_api_usage_reads_every_window_without_spending() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(LIMITS, Some(&up)).await;
    spend(&gw, 3).await;
    for _ in 0..2 {
        let (s, key) = usage(&gw, "key_id=key_a").await;
        assert_eq!(s, 200, "{key}");
        let got = used(&key);
        assert_eq!(got.len(), 3, "{key}");
        assert!(got.iter().all(|(_, _, u)| *u == 3), "{got:?}");
        assert!(
            got.iter().any(|(s, w, _)| s == "key" && w == "1h"),
            "{got:?}"
        );
        assert!(got.iter().any(|(s, _, _)| s == "tenant"), "{got:?}");
        let (_, t) = usage(&gw, "tenant=acme").await;
        assert_eq!(used(&t), vec![("tenant".into(), "1m".into(), 3)]);
        let (_, ip) = usage(&gw, "ip=127.0.0.1").await;
        assert_eq!(used(&ip)[0].2, 3, "{ip}");
    }
    let (_, other) = usage(&gw, "ip=192.0.2.1").await;
    assert_eq!(used(&other)[0].2, 0);
    for (query, field) in [
        ("", "key_id"),
        ("ip=nope", "ip"),
        ("colour=red", "key_id"),
        ("ip=1.2.3.4&tenant=acme", "key_id"),
    ] {
        let (s, b) = usage(&gw, query).await;
        assert_eq!((s, b["field"].as_str()), (400, Some(field)), "{query}: {b}");
    }
    assert_eq!(usage(&gw, "key_id=none").await.0, 404);
    assert_eq!(usage(&gw, "tenant=none").await.0, 404);
    let r = client()
        .get(gw.admin_url("/v1/usage?key_id=key_a"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

/// On Redis with leases (lease_ms = 60000, most of the N requests admitted on a lease):
/// after N requests every window's used count is at least N and at most N plus the one
/// lease outstanding for that window (at most half of what remained when it was granted,
/// so at most N + limit / 2). Sliding windows: a token bucket refills while the test runs,
/// so its `used` falls below N by what refilled.
#[tokio::test(flavor = "multi_thread")]
async fn admin_api_usage_on_redis_counts_leased_tokens_within_the_bound() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 2000\nkey_prefix = \"usage\"\nlease_ms = 60000\n{}",
        redis.url(),
        LIMITS
            .replace("per_minute = 50", "per_minute = 5000\nalgorithm = \"sliding_window\"")
            .replace(
                "per_minute = 20, per_hour = 100",
                "per_minute = 1000, per_hour = 5000, algorithm = \"sliding_window\""
            )
            .replace(
                "per_minute = 30",
                "per_minute = 3000, algorithm = \"sliding_window\""
            )
    );
    let gw = Gateway::start(&body, Some(&up)).await;
    const N: u64 = 60;
    spend(&gw, N as usize).await;
    let (s, b) = usage(&gw, "key_id=key_a").await;
    assert_eq!(s, 200, "{b}");
    let leased = gw
        .metrics()
        .await
        .lines()
        .find(|l| l.starts_with(r#"throttle_local_decisions_total{reason="lease"}"#))
        .map(str::to_string);
    eprintln!("usage after {N} requests ({leased:?}): {b}");
    assert!(
        leased.is_some_and(|l| !l.ends_with(" 0")),
        "no request was admitted on a lease"
    );
    for (scope, window, used) in used(&b) {
        let limit = match (scope.as_str(), window.as_str()) {
            ("key", "1m") => 1000,
            ("key", "1h") => 5000,
            _ => 3000,
        };
        assert!(
            used >= N && used <= N + limit / 2,
            "{scope} {window}: used {used} after {N}"
        );
    }
    let (_, again) = usage(&gw, "key_id=key_a").await;
    assert_eq!(used(&again), used(&b), "usage spent something");
}

/// `[limits.global]` and the route tables that count a key, its tenant, an address or a
/// route's traffic are windows that apply too: route tables named with their `route`
/// (their `scope` as a 429 from them names it), read without spending.
#[tokio::test(flavor = "multi_thread")]
async fn admin_api_usage_lists_global_and_route_windows() {
    let up = Upstream::start("u").await;
    let body = r#"
[limits.global]
per_hour = 1000

[tiers.free]
key = { per_minute = 20 }
tenant = { per_minute = 30 }

[[routes]]
name = "search"
path_prefix = "/search"
upstreams = ["{upstream}"]
limits = { key = { per_minute = 10 }, ip = { per_minute = 15 }, global = { per_hour = 500 } }

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]

[[keys]]
id = "key_a"
key = "key-a-secret"
tenant = "acme"
tier = "free"
"#;
    let gw = Gateway::start(body, Some(&up)).await;
    for path in ["/search/a", "/search/b", "/x"] {
        let r = client()
            .get(gw.url(path))
            .header("x-api-key", "key-a-secret")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    // (route, scope, window, used), sorted.
    let windows = |body: &Value| {
        let mut v: Vec<(String, String, String, u64)> = used(body)
            .into_iter()
            .zip(body["windows"].as_array().unwrap())
            .map(|((s, w, n), j)| (j["route"].as_str().unwrap_or("").to_string(), s, w, n))
            .collect();
        v.sort();
        v
    };
    let want = |rows: &[(&str, &str, &str, u64)]| {
        rows.iter()
            .map(|(r, s, w, n)| (r.to_string(), s.to_string(), w.to_string(), *n))
            .collect::<Vec<_>>()
    };
    let (s, key) = usage(&gw, "key_id=key_a").await;
    assert_eq!(s, 200, "{key}");
    assert_eq!(
        windows(&key),
        want(&[
            ("", "global", "1h", 3),
            ("", "key", "1m", 3),
            ("", "tenant", "1m", 3),
            ("search", "global", "1h", 2),
            ("search", "key", "1m", 2),
        ]),
        "{key}"
    );
    let (_, ip) = usage(&gw, "ip=127.0.0.1").await;
    let by_ip = want(&[
        ("", "global", "1h", 3),
        ("search", "global", "1h", 2),
        ("search", "ip", "1m", 2),
    ]);
    assert_eq!(windows(&ip), by_ip, "{ip}");
    // Read twice: nothing was spent.
    let (_, again) = usage(&gw, "ip=127.0.0.1").await;
    assert_eq!(windows(&again), by_ip);
}
