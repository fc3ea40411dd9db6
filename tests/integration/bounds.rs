//! Bounds an attacker cannot push past (edge hardening, third round): the memory store's
//! window states (`[store] max_states`, least recently used evicted), the decision APIs'
//! share of the ban table (half, locally and in the fleet's table on Redis), and the
//! clients it takes to shrink an adaptive route (`min_clients`).

use std::time::Duration;

use crate::support::redis::RedisServer;
use crate::support::{client, eventually, header, Gateway, Upstream};

/// The value of the series `series` (name and labels, exactly) on /metrics.
async fn metric(gw: &Gateway, series: &str) -> f64 {
    let prefix = format!("{series} ");
    gw.metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// (status, X-RateLimit-Limit) of a request to `path` from `ip` (its `X-Forwarded-For`).
async fn get_as(gw: &Gateway, ip: &str, path: &str) -> (u16, u64) {
    let r = client()
        .get(gw.url(path))
        .header("x-forwarded-for", ip)
        .send()
        .await
        .unwrap();
    let limit = header(&r, "x-ratelimit-limit").parse().unwrap_or(0);
    (r.status().as_u16(), limit)
}

/// 100 window states at most: one shard, so the order of eviction is exact.
const STATES: &str = r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[store]
max_states = 100

[limits.ip]
per_hour = 3

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;

/// Past `max_states` the least recently used state is evicted: the oldest caller's
/// limit starts afresh, while a caller used since keeps its count; the evictions are
/// counted in `throttle_store_evictions_total`.
#[tokio::test(flavor = "multi_thread")]
async fn the_least_recently_used_state_is_evicted_at_max_states() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(STATES, Some(&up)).await;
    let (oldest, recent) = ("198.51.100.1", "198.51.100.2");
    for ip in [oldest, recent] {
        for _ in 0..3 {
            assert_eq!(get_as(&gw, ip, "/x").await.0, 200, "{ip}");
        }
        assert_eq!(get_as(&gw, ip, "/x").await.0, 429, "{ip}");
    }
    // 97 more callers: 99 states held.
    for n in 0..97 {
        assert_eq!(get_as(&gw, &format!("10.0.0.{n}"), "/x").await.0, 200);
    }
    assert_eq!(metric(&gw, "throttle_store_evictions_total").await, 0.0);
    // The recent caller is used again; then new callers fill the store past its bound.
    assert_eq!(get_as(&gw, recent, "/x").await.0, 429);
    for n in 0..5 {
        assert_eq!(get_as(&gw, &format!("10.0.1.{n}"), "/x").await.0, 200);
    }
    assert_eq!(
        get_as(&gw, recent, "/x").await.0,
        429,
        "a recently used caller kept its count"
    );
    assert_eq!(
        get_as(&gw, oldest, "/x").await.0,
        200,
        "the oldest caller's state was evicted: its limit starts afresh"
    );
    let evicted = metric(&gw, "throttle_store_evictions_total").await;
    assert!(evicted >= 1.0, "throttle_store_evictions_total {evicted}");
}

/// A per-second limit a cost of 2 never fits (a check is refused at once, not as a
/// cost no window can hold: the hour holds it), and a ban at the first rejection, the
/// decision APIs included. `{store}`: the store section.
const CHECK_BANS: &str = r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]
{store}
[limits.ip]
per_second = 1
per_hour = 10
ban = { after = 1, within_secs = 3600, for_secs = 3600, from_check = true }

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;

/// A gateway on `body` whose admin listener takes the 16 connections of `check_bans`'s
/// checkers from one address (the default per-client cap is 8).
async fn checks_gateway(body: &str, up: &Upstream) -> Gateway {
    let body = body.replace("{upstream}", &up.addr.to_string());
    let server = "grace_period_secs = 0\nadmin_max_connections_per_ip = 64";
    Gateway::start_full(&["run"], &body, server).await
}

/// `count` addresses from `first` on (10.x.y.z), each banned by one refused
/// `POST /v1/check` naming it.
async fn check_bans(gw: &Gateway, first: u32, count: u32) {
    const TASKS: u32 = 16;
    let url = gw.admin_url("/v1/check");
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (c, url) = (client(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = first + t;
            while i < first + count {
                let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
                let r = c
                    .post(&url)
                    .json(&serde_json::json!({"ip": ip, "cost": 2}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 429, "{ip}");
                i += TASKS;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A proxied abuser of a fresh address: 200, its rejection (429), then banned (403).
async fn abuser_is_banned(gw: &Gateway, ip: &str) {
    assert_eq!(get_as(gw, ip, "/x").await.0, 200);
    assert_eq!(get_as(gw, ip, "/x").await.0, 429);
    let banned = eventually(Duration::from_secs(5), "the abuser is banned", || async {
        let status = get_as(gw, ip, "/x").await.0;
        (status == 403).then_some(status)
    })
    .await;
    assert_eq!(banned, 403);
}

/// Bans named through `/v1/check` fill at most half of the 100,000-ban table: a flood of
/// 100,050 of them has the rest refused (`throttle_bans_dropped_total{source="check"}`),
/// and a proxied abuser is still banned.
#[tokio::test(flavor = "multi_thread")]
async fn decision_api_bans_leave_room_for_proxied_abuse() {
    let up = Upstream::start("u").await;
    let gw = checks_gateway(&CHECK_BANS.replace("{store}", ""), &up).await;
    check_bans(&gw, 0, 100_050).await;
    abuser_is_banned(&gw, "198.51.100.9").await;
    let dropped = metric(&gw, "throttle_bans_dropped_total{source=\"check\"}").await;
    assert_eq!(dropped, 50_050.0, "check bans past half the table");
    assert_eq!(
        metric(&gw, "throttle_bans_dropped_total{source=\"proxy\"}").await,
        0.0
    );
}

/// The same in the fleet's table on Redis. It already holds 49,000 bans of proxied
/// abuse (written straight into Redis); 51,050 bans through `/v1/check` would fill it,
/// but at most the decision APIs' half (50,000) is taken, in the fleet's table and in
/// the gateway's, and the next proxied abuser is banned.
#[tokio::test(flavor = "multi_thread")]
async fn decision_api_bans_leave_room_in_the_fleets_table() {
    const HELD: u32 = 49_000;
    let redis = RedisServer::start().await;
    let mut conn = redis.client().await;
    let until = throttle::clock::Clock::now_ms(&throttle::clock::SystemClock) + 3_600_000;
    for chunk in 0..HELD / 1_000 {
        let mut pipe = redis::pipe();
        for i in chunk * 1_000..(chunk + 1) * 1_000 {
            let field = format!("ip|172.16.{}.{}", i >> 8, i & 255);
            let value = format!("{until}|automatic: 3 rate-limit rejections in 10s");
            pipe.hset("bounds:{bans}", &field, value).ignore();
            pipe.zadd("bounds:{bans}:expiry", &field, until).ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
    let store = format!(
        "\n[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"bounds\"\ntimeout_ms = 2000\n",
        redis.url()
    );
    let up = Upstream::start("u").await;
    let gw = checks_gateway(&CHECK_BANS.replace("{store}", &store), &up).await;
    check_bans(&gw, 0, 51_050).await;
    // At least the 1,050 past the half are refused (a publish that misses its deadline
    // under load is refused locally instead, and counted there).
    eventually(Duration::from_secs(10), "check bans refused", || async {
        let n = metric(&gw, "throttle_bans_dropped_total{source=\"check\"}").await;
        (n >= 1_050.0).then_some(n)
    })
    .await;
    let count = |key: &'static str, cmd: &'static str| {
        let mut conn = conn.clone();
        async move {
            let n: u64 = redis::cmd(cmd)
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            n
        }
    };
    let checks = count("bounds:{bans}:checks", "ZCARD").await;
    assert!(checks <= 50_000, "{checks} check bans in the fleet's table");
    let held = count("bounds:{bans}", "HLEN").await;
    assert!(
        held <= u64::from(HELD) + 50_000,
        "{held} bans in the fleet's table"
    );
    abuser_is_banned(&gw, "198.51.100.9").await;
}

/// An adaptive route with the default `min_clients` (5), shared by clients told apart by
/// `X-Forwarded-For`.
const ADAPTIVE: &str = r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[limits.ip]
per_minute = 1000

[[routes]]
name = "shared"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
adaptive = { target_p99_ms = 100, max_error_rate = 0.1 }
"#;

/// `throttle_adaptive_factor{route="shared"}`.
async fn factor(gw: &Gateway) -> f64 {
    metric(gw, "throttle_adaptive_factor{route=\"shared\"}").await
}

/// Each of `attackers` sends slow and failing requests for `secs` seconds (8 at a time
/// each); answers the lowest factor seen meanwhile.
async fn attack(gw: &Gateway, attackers: &[&str], secs: u64) -> f64 {
    let started = tokio::time::Instant::now();
    let mut lowest = f64::MAX;
    while started.elapsed() < Duration::from_secs(secs) {
        let mut sends = Vec::new();
        for ip in attackers {
            for k in 0..8 {
                let path = if k % 2 == 0 {
                    "/x?delay_ms=300"
                } else {
                    "/x?status=500"
                };
                sends.push(get_as(gw, ip, path));
            }
        }
        futures_util::future::join_all(sends).await;
        lowest = lowest.min(factor(gw).await);
    }
    lowest
}

/// Two addresses acting together, every one of their requests slow or failing, cannot
/// move an adaptive route's factor: a victim keeps its full limit. Five can.
#[tokio::test(flavor = "multi_thread")]
async fn two_addresses_cannot_shrink_an_adaptive_route_five_can() {
    let up = Upstream::start("shared").await;
    let gw = Gateway::start(ADAPTIVE, Some(&up)).await;
    eventually(
        Duration::from_secs(15),
        "the route exported at 1",
        || async { (factor(&gw).await == 1.0).then_some(()) },
    )
    .await;
    let victim = "192.0.2.50";
    let pair = ["203.0.113.1", "203.0.113.2"];
    let mut lowest = attack(&gw, &pair, 5).await;
    // Two more controller ticks with the attack in the window.
    let until = tokio::time::Instant::now() + Duration::from_millis(2_100);
    while tokio::time::Instant::now() < until {
        lowest = lowest.min(factor(&gw).await);
        tokio::task::yield_now().await;
    }
    assert_eq!(lowest, 1.0, "two addresses moved the factor");
    assert_eq!(get_as(&gw, victim, "/x").await, (200, 1000));

    let five = [
        "203.0.113.1",
        "203.0.113.2",
        "203.0.113.3",
        "203.0.113.4",
        "203.0.113.5",
    ];
    let lowest = attack(&gw, &five, 3).await;
    let lowered = eventually(
        Duration::from_secs(10),
        "five addresses move it",
        || async {
            let f = factor(&gw).await.min(lowest);
            (f < 1.0).then_some(f)
        },
    )
    .await;
    assert!(lowered < 1.0);
    let (status, limit) = get_as(&gw, victim, "/x").await;
    assert_eq!(status, 200);
    assert!(limit < 1000, "X-RateLimit-Limit {limit}");
}
