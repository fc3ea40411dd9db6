//! Automatic temporary bans, fleet-wide on Redis: repeated 429s on one gateway become a
//! 403 with `Retry-After` on every gateway, listed by `/v1/blocks` as automatic, and one
//! `DELETE` lifts it everywhere.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use throttle::bans::{Ban, BanSource};
use throttle::clock::{Clock, SystemClock};
use throttle::limiter::{BanRule, Ident, Scope};
use throttle::store::redis::bans::{BanCursor, BanRead, Published, MAX_CHANGES};
use throttle::store::redis::Target;
use throttle::store::RedisStore;

use crate::support::postgres::TestDb;
use crate::support::redis::{RedisCluster, RedisServer};
use crate::support::{client, eventually, header, Gateway, Upstream, ADMIN_TOKEN};

fn config(redis: &RedisServer) -> String {
    format!(
        r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[store]
backend = "redis"
url = "{}"
key_prefix = "bans"
timeout_ms = 500

[limits.ip]
per_minute = 2
ban = {{ after = 3, within_secs = 30, for_secs = 120 }}

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{{upstream}}"]
auth = "none"
"#,
        redis.url()
    )
}

async fn get(gw: &Gateway, ip: &str) -> reqwest::Response {
    client()
        .get(gw.url("/x"))
        .header("x-forwarded-for", ip)
        .send()
        .await
        .unwrap()
}

async fn automatic(gw: &Gateway) -> Vec<Value> {
    let r = client()
        .get(gw.admin_url("/v1/blocks"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    v["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["automatic"] == true)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn repeated_429s_ban_fleet_wide_until_lifted() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let a = Gateway::start(&config(&redis), Some(&up)).await;
    let b = Gateway::start(&config(&redis), Some(&up)).await;
    // Two pass, then three 429s on gateway a (the limit is shared, so b would refuse too).
    let who = "2001:db8:7:7::1";
    for want in [200, 200, 429, 429, 429] {
        assert_eq!(get(&a, who).await.status(), want);
    }
    // The /64 is banned on both gateways: 403 with the reason and Retry-After.
    for gw in [&a, &b] {
        let r = eventually(
            Duration::from_secs(5),
            "the ban to reach the gateway",
            || async {
                let r = get(gw, "2001:db8:7:7::2").await;
                (r.status() == 403).then_some(r)
            },
        )
        .await;
        let retry: u64 = header(&r, "retry-after").parse().unwrap();
        assert!((100..=120).contains(&retry), "{retry}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "blocked");
        assert_eq!(body["scope"], "ip");
        assert_eq!(body["reason"], "automatic: 3 rate-limit rejections in 30s");
        let listed = eventually(Duration::from_secs(5), "the ban in /v1/blocks", || async {
            let l = automatic(gw).await;
            (!l.is_empty()).then_some(l)
        })
        .await;
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0]["value"], "2001:db8:7:7::/64");
        assert!(listed[0]["expires_at"].as_str().unwrap().ends_with('Z'));
    }
    // Exactly one gateway imposed it.
    let mut imposed = 0.0;
    for gw in [&a, &b] {
        let text = client()
            .get(gw.admin_url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        imposed += text
            .lines()
            .find_map(|l| l.strip_prefix("throttle_bans_total{scope=\"ip\"} "))
            .map_or(0.0, |v| v.parse::<f64>().unwrap());
    }
    assert_eq!(imposed, 1.0);
    // Another client is untouched.
    assert_eq!(get(&b, "203.0.113.50").await.status(), 200);

    // DELETE on gateway b lifts it everywhere: the client is then limited, not banned.
    let id = automatic(&b).await[0]["id"].as_i64().unwrap();
    assert!(id < 0);
    let r = client()
        .delete(b.admin_url(&format!("/v1/blocks/{id}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    for gw in [&a, &b] {
        eventually(Duration::from_secs(5), "the ban to be lifted", || async {
            (get(gw, who).await.status() == 429).then_some(())
        })
        .await;
    }
    assert!(automatic(&a).await.is_empty());
}

/// On the memory store with a database: the ban is one `rate_limit_events` row naming the
/// banned identity, the rule's count and span.
#[tokio::test(flavor = "multi_thread")]
async fn a_ban_is_logged_as_an_event() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let body = format!(
        r#"
[database]
url = "{}"

[limits.ip]
per_minute = 1
ban = {{ after = 2, within_secs = 45, for_secs = 60 }}

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{{upstream}}"]
auth = "none"
"#,
        db.url
    );
    let gw = Gateway::start(&body, Some(&up)).await;
    for want in [200, 429, 429, 403] {
        assert_eq!(get(&gw, "ignored").await.status(), want);
    }
    let pool = db.pool().await;
    let row: (String, String, i64, i64, String) = eventually(
        Duration::from_secs(5),
        "the ban's event",
        || {
            let pool = pool.clone();
            async move {
                sqlx::query_as(
                    "SELECT scope, limit_key, limit_value, count, \"window\"::text FROM rate_limit_events WHERE limit_key LIKE 'ban:%'",
                )
                .fetch_optional(&pool)
                .await
                .unwrap()
            }
        },
    )
    .await;
    assert_eq!(
        row,
        (
            "ip".to_string(),
            "ban:ip:127.0.0.1".to_string(),
            2,
            2,
            "00:00:45".to_string()
        )
    );
}

fn memory_config(ban: &str) -> String {
    format!(
        r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[limits.ip]
per_minute = 2
ban = {{ {ban} }}

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{{upstream}}"]
auth = "none"
"#
    )
}

/// `POST /v1/check` naming a victim's address with its whole window's cost is refused
/// after the first, but bans the victim only when the scope opts in with
/// `from_check = true` (a cost above the window's capacity is 400 and strikes nothing).
#[tokio::test(flavor = "multi_thread")]
async fn checks_ban_their_victim_only_with_from_check() {
    let up = Upstream::start("u").await;
    let victim = "203.0.113.77";
    for (from_check, banned) in [(false, false), (true, true)] {
        let ban = format!("after = 3, within_secs = 60, for_secs = 600, from_check = {from_check}");
        let gw = Gateway::start(&memory_config(&ban), Some(&up)).await;
        for i in 0..5 {
            let r = client()
                .post(gw.admin_url("/v1/check"))
                .json(&serde_json::json!({"ip": victim, "cost": 2}))
                .send()
                .await
                .unwrap();
            let want: &[u16] = if i == 0 { &[200] } else { &[429, 403] };
            assert!(want.contains(&r.status().as_u16()), "{}", r.status());
        }
        let status = get(&gw, victim).await.status();
        assert_eq!(status == 403, banned, "from_check = {from_check}: {status}");
        assert_eq!(automatic(&gw).await.len(), usize::from(banned));
    }
}

/// Once a ban ends, the next `after` rejections within `within_secs` ban again, even
/// inside the span that led to the first ban (the span restarts when a ban ends).
#[tokio::test(flavor = "multi_thread")]
async fn a_ban_that_ends_is_struck_again() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(
        &memory_config("after = 2, within_secs = 60, for_secs = 1"),
        Some(&up),
    )
    .await;
    let who = "198.51.100.31";
    for want in [200, 200, 429, 429, 403] {
        assert_eq!(get(&gw, who).await.status(), want);
    }
    // Time passes: the one-second ban ends (polling while banned counts nothing).
    let first = eventually(Duration::from_secs(5), "the ban to end", || async {
        let s = get(&gw, who).await.status();
        (s != 403).then_some(s)
    })
    .await;
    assert_eq!(first, 429);
    assert_eq!(get(&gw, who).await.status(), 429);
    assert_eq!(get(&gw, who).await.status(), 403, "banned again");
}

/// `INFO commandstats` of `redis`: calls per command (commands run by scripts included).
async fn commandstats(redis: &RedisServer) -> HashMap<String, u64> {
    let mut c = redis.client().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.strip_prefix("calls=")?.split(',').next()?;
            Some((name.to_string(), calls.parse().ok()?))
        })
        .collect()
}

/// The calls adding rejections to a fleet's count: each runs one INCR (or INCRBY), and
/// nothing else in the gateway does.
async fn strike_calls(redis: &RedisServer) -> u64 {
    let stats = commandstats(redis).await;
    ["incr", "incrby"]
        .iter()
        .map(|c| stats.get(*c).copied().unwrap_or(0))
        .sum()
}

/// The value of the series `series` (name and labels) in `gw`'s `/metrics`, 0 if absent.
async fn metric(gw: &Gateway, series: &str) -> f64 {
    gw.metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn fleet_config(redis: &RedisServer, limit: &str, ban: &str) -> String {
    format!(
        r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[store]
backend = "redis"
url = "{}"
key_prefix = "fleet"
timeout_ms = 500

[limits.ip]
{limit}
ban = {{ {ban} }}

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["{{upstream}}"]
auth = "none"
"#,
        redis.url()
    )
}

/// A client sending far past its limit (per_second = 1, so a retry_after of at most
/// 1 s) on a ban-enabled scope costs at most one Redis call per retry_after for its
/// strikes, not one per 429: between two calls the limit must have admitted it again,
/// so calls <= requests admitted + 1. The ban still lands on the `after`-th rejection.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_far_over_its_limit_costs_one_strike_call_per_retry_after() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let gw = Gateway::start(
        &fleet_config(
            &redis,
            "per_second = 1",
            "after = 100, within_secs = 60, for_secs = 60",
        ),
        Some(&up),
    )
    .await;
    let who = "198.51.100.44";
    let before = strike_calls(&redis).await;
    let started = tokio::time::Instant::now();
    let admitted = std::sync::atomic::AtomicU64::new(0);
    let mut rejected = 0u32;
    while rejected < 100 {
        match get(&gw, who).await.status().as_u16() {
            200 => _ = admitted.fetch_add(1, Ordering::Relaxed),
            429 => rejected += 1,
            s => panic!("{s} after {rejected} rejections: banned before the 100th"),
        }
    }
    let elapsed = started.elapsed();
    // The 100th rejection bans (this gateway's own count reached `after`).
    let r = eventually(Duration::from_secs(5), "the ban", || async {
        let r = get(&gw, who).await;
        if r.status() == 200 {
            admitted.fetch_add(1, Ordering::Relaxed);
        }
        (r.status() == 403).then_some(r)
    })
    .await;
    let admitted = admitted.load(Ordering::Relaxed);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["reason"],
        "automatic: 100 rate-limit rejections in 60s"
    );
    assert_eq!(metric(&gw, "throttle_bans_total{scope=\"ip\"}").await, 1.0);
    let calls = strike_calls(&redis).await - before;
    eprintln!("{rejected} rejections and {admitted} admitted in {elapsed:?}: {calls} strike calls");
    assert!(calls >= 1, "the strikes reached Redis");
    assert!(
        calls <= admitted + 1,
        "{calls} strike calls for {rejected} rejections ({admitted} admitted in {elapsed:?})"
    );
}

/// Rejections held between two calls are not lost: they go with the next call (INCRBY
/// n), so two gateways each seeing half of a client's rejections ban it on the fleet's
/// count, long before either gateway's own count reaches `after`. The client sends
/// every 100 ms, alternating gateways: 5 rejections a second on each, so a call per
/// second on each carries about 5.
#[tokio::test(flavor = "multi_thread")]
async fn rejections_held_between_calls_reach_the_fleet_count() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let config = fleet_config(
        &redis,
        "per_second = 1",
        "after = 30, within_secs = 60, for_secs = 60",
    );
    let a = Gateway::start(&config, Some(&up)).await;
    let b = Gateway::start(&config, Some(&up)).await;
    let who = "198.51.100.45";
    let before = strike_calls(&redis).await;
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    let mut rejected = [0u32; 2];
    let mut i = 0usize;
    loop {
        pace.tick().await;
        let gw = [&a, &b][i % 2];
        match get(gw, who).await.status().as_u16() {
            200 => {}
            429 => rejected[i % 2] += 1,
            403 => break,
            s => panic!("{s}"),
        }
        assert!(
            rejected[0] < 30 && rejected[1] < 30,
            "not banned on the fleet's count: {rejected:?} rejections"
        );
        i += 1;
    }
    let total = rejected[0] + rejected[1];
    let calls = strike_calls(&redis).await - before;
    eprintln!("banned after {rejected:?} rejections, {calls} strike calls");
    assert!(
        total >= 30,
        "banned after {total} rejections, before `after`"
    );
    assert!(
        u64::from(total) > calls,
        "{calls} strike calls for {total} rejections: held ones were sent one by one"
    );
    // Exactly one gateway imposed it; the other took it from the sync.
    for gw in [&a, &b] {
        eventually(Duration::from_secs(5), "the ban on both", || async {
            (get(gw, who).await.status() == 403).then_some(())
        })
        .await;
    }
    let imposed = metric(&a, "throttle_bans_total{scope=\"ip\"}").await
        + metric(&b, "throttle_bans_total{scope=\"ip\"}").await;
    assert_eq!(imposed, 1.0);
}

/// `INFO stats` of `redis`: the bytes it has sent to clients so far, and the size of
/// this reply (counted in the next).
async fn bytes_out(redis: &RedisServer) -> (u64, u64) {
    let mut c = redis.client().await;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut c)
        .await
        .unwrap();
    let sent = info
        .lines()
        .find_map(|l| {
            l.strip_prefix("total_net_output_bytes:")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap();
    (sent, info.len() as u64 + 16)
}

/// Bans `ip` through `gw`'s `/v1/check` (with `per_minute = 2`, `from_check = true` and
/// `after = 1`: a check spends the window, and the next one, refused, bans).
async fn ban_by_check(gw: &Gateway, ip: &str) {
    for want in [200, 429] {
        let r = client()
            .post(gw.admin_url("/v1/check"))
            .json(&serde_json::json!({"ip": ip, "cost": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), want, "{ip}");
    }
}

async fn syncs(gw: &Gateway, read: &str) -> f64 {
    metric(gw, &format!("throttle_ban_syncs_total{{read=\"{read}\"}}")).await
}

/// Waits until both gateways have synced `n` more times reading changes only.
async fn idle_syncs(gws: [&Gateway; 2], n: f64) {
    let start = [
        syncs(gws[0], "changes").await,
        syncs(gws[1], "changes").await,
    ];
    eventually(Duration::from_secs(10), "ban syncs", || async {
        let a = syncs(gws[0], "changes").await - start[0];
        let b = syncs(gws[1], "changes").await - start[1];
        (a >= n && b >= n).then_some(())
    })
    .await;
}

/// The ban sync reads only what changed: two gateways on one Redis; 200 bans published
/// by one reach the other; then a sync with nothing changed reads no hash (no HGETALL,
/// no HGET) and a few dozen bytes, where the whole table is kilobytes. A lift reaches
/// the other gateway; a flushed Redis (a restart) is read anew, once, and bans made
/// after it arrive.
#[tokio::test(flavor = "multi_thread")]
async fn a_ban_sync_reads_only_what_changed() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let config = fleet_config(
        &redis,
        "per_minute = 2",
        "after = 1, within_secs = 60, for_secs = 600, from_check = true",
    );
    let a = Gateway::start(&config, Some(&up)).await;
    let b = Gateway::start(&config, Some(&up)).await;
    let ip = |i: u32| format!("10.9.{}.{}", i / 256, i % 256);
    for i in 0..200 {
        ban_by_check(&a, &ip(i)).await;
    }
    eventually(Duration::from_secs(10), "200 bans on b", || async {
        (automatic(&b).await.len() == 200).then_some(())
    })
    .await;
    assert_eq!(get(&b, &ip(7)).await.status(), 403);
    // One full read each (the first sync); the bans came to b as changes.
    assert_eq!(syncs(&a, "full").await, 1.0);
    assert_eq!(syncs(&b, "full").await, 1.0);

    // Nothing changes: three syncs on each gateway, once both have read every change (a
    // holds its own bans before its sync reads them back: two syncs from now, the second
    // starts after the last publish).
    idle_syncs([&a, &b], 2.0).await;
    let stats = commandstats(&redis).await;
    let (sent, info) = bytes_out(&redis).await;
    let before = [syncs(&a, "changes").await, syncs(&b, "changes").await];
    idle_syncs([&a, &b], 3.0).await;
    let sent = bytes_out(&redis).await.0 - sent - info;
    let after = commandstats(&redis).await;
    let n = syncs(&a, "changes").await - before[0] + syncs(&b, "changes").await - before[1];
    let calls = |c: &str, s: &HashMap<String, u64>| s.get(c).copied().unwrap_or(0);
    for c in ["hgetall", "hget", "hscan", "hkeys", "hvals"] {
        assert_eq!(
            calls(c, &after),
            calls(c, &stats),
            "{c} while nothing changed"
        );
    }
    // Bytes Redis sent meanwhile: the syncs and the heartbeats.
    let mut c = redis.client().await;
    let table: Vec<String> = redis::cmd("HGETALL")
        .arg("fleet:{bans}")
        .query_async(&mut c)
        .await
        .unwrap();
    let table_bytes: usize = table.iter().map(|s| s.len() + 8).sum();
    let per_sync = sent as f64 / n;
    eprintln!(
        "{n} idle syncs: {sent} bytes sent by Redis ({per_sync:.0} per sync, at most); the table is {table_bytes} bytes"
    );
    assert!(
        per_sync < 1_000.0 && table_bytes > 10_000,
        "{per_sync} bytes per idle sync, table {table_bytes}"
    );

    // A lift on a reaches b.
    let id = automatic(&a)
        .await
        .into_iter()
        .find(|b| b["value"] == ip(7))
        .unwrap()["id"]
        .as_i64()
        .unwrap();
    let r = client()
        .delete(a.admin_url(&format!("/v1/blocks/{id}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    // (Read from b's table: the check that led to the ban spent ip 7's window, so a
    // proxied request now would be a 429, and with `after = 1` a new ban.)
    eventually(Duration::from_secs(5), "the lift on b", || async {
        let left = automatic(&b).await;
        (!left.iter().any(|b| b["value"] == ip(7))).then_some(())
    })
    .await;
    assert_eq!(automatic(&b).await.len(), 199);
    assert_eq!(get(&b, &ip(8)).await.status(), 403);

    // Redis loses everything (a restart without persistence), then three new bans are
    // published at once: each gateway reads the table anew (once) and holds exactly
    // those three.
    let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
    for i in 1000..1003 {
        ban_by_check(&a, &ip(i)).await;
    }
    for gw in [&a, &b] {
        eventually(Duration::from_secs(5), "the table read anew", || async {
            let l = automatic(gw).await;
            let mut values: Vec<String> = l
                .iter()
                .map(|b| b["value"].as_str().unwrap().to_string())
                .collect();
            values.sort();
            (values == [ip(1000), ip(1001), ip(1002)]).then_some(())
        })
        .await;
        assert_eq!(syncs(gw, "full").await, 2.0);
    }
    assert_eq!(get(&b, &ip(8)).await.status(), 200);
    assert_eq!(get(&b, &ip(1001)).await.status(), 403);
    // And the fleet goes on reading changes only.
    let stats = commandstats(&redis).await;
    idle_syncs([&a, &b], 2.0).await;
    assert_eq!(
        calls("hgetall", &commandstats(&redis).await),
        calls("hgetall", &stats)
    );
}

/// The change log on a real Redis, through the store: a cursor at the last change reads
/// nothing; one a few changes behind reads those (a lift as a lift); one behind what the
/// log holds (`MAX_CHANGES`), or new, reads the whole table. A ban in force is not
/// published twice; ended bans leave the hash on a sync.
#[tokio::test(flavor = "multi_thread")]
async fn the_change_log_serves_changes_and_reads_anew_when_behind() {
    let redis = RedisServer::start().await;
    let store = Arc::new(RedisStore::new(
        Target::Single(redis.url()),
        Duration::from_secs(2),
        "log",
    ));
    let now = SystemClock.now_ms();
    let rule = BanRule {
        after: 1,
        within_ms: 1_000,
        for_ms: 600_000,
        from_check: false,
    };
    let who = |i: u32| Ident::Ip(std::net::IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
    let ban = |i: u32| Ban::new(Scope::Ip, &who(i), &rule, now);
    let mut early = BanCursor::default();
    assert_eq!(
        store.sync_bans(&mut early, now).await.unwrap(),
        BanRead::Full(Vec::new())
    );
    let mut near = early.clone();
    assert_eq!(
        store
            .publish_ban(&ban(0), now, BanSource::Proxy)
            .await
            .unwrap(),
        Published::Set
    );
    // The same identity again (a gateway the ban had not reached): the first is kept.
    let again = Ban::new(Scope::Ip, &who(0), &rule, now + 500);
    assert_eq!(
        store
            .publish_ban(&again, now + 500, BanSource::Proxy)
            .await
            .unwrap(),
        Published::InForce(ban(0))
    );
    let changes =
        |set: Vec<(Ident, Ban)>, lifted: Vec<(Scope, Ident)>| BanRead::Changes { set, lifted };
    assert_eq!(
        store.sync_bans(&mut near, now).await.unwrap(),
        changes(vec![(who(0), ban(0))], Vec::new())
    );
    assert_eq!(
        store.sync_bans(&mut near, now).await.unwrap(),
        changes(Vec::new(), Vec::new())
    );
    store.lift_ban(&ban(0)).await.unwrap();
    assert_eq!(
        store
            .publish_ban(&ban(1), now, BanSource::Proxy)
            .await
            .unwrap(),
        Published::Set
    );
    assert_eq!(
        store.sync_bans(&mut near, now).await.unwrap(),
        changes(vec![(who(1), ban(1))], vec![(Scope::Ip, who(0))])
    );

    // An ended ban leaves the hash at the next sync, unlogged (gateways drop it by time).
    let ended = Ban {
        expires_at_ms: now + 1,
        ..ban(2)
    };
    assert_eq!(
        store
            .publish_ban(&ended, now, BanSource::Proxy)
            .await
            .unwrap(),
        Published::Set
    );
    assert_eq!(
        store.sync_bans(&mut near, now + 2).await.unwrap(),
        changes(Vec::new(), vec![(Scope::Ip, who(2))])
    );
    let mut c = redis.client().await;
    let len: u64 = redis::cmd("HLEN")
        .arg("log:{bans}")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(len, 1);

    // More changes than the log holds: `near`, one change behind the flood's start,
    // reads the whole table; a cursor at the end reads nothing.
    let flood = u32::try_from(MAX_CHANGES).unwrap() + 10;
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut i = 10 + t;
                while i < 10 + flood {
                    let b = Ban::new(Scope::Ip, &who(i), &rule, now);
                    assert_eq!(
                        store.publish_ban(&b, now, BanSource::Proxy).await.unwrap(),
                        Published::Set
                    );
                    i += 16;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    match store.sync_bans(&mut near, now + 2).await.unwrap() {
        BanRead::Full(all) => assert_eq!(all.len(), flood as usize + 1),
        other => panic!("not a full read: {other:?}"),
    }
    assert_eq!(
        store.sync_bans(&mut near, now + 2).await.unwrap(),
        changes(Vec::new(), Vec::new())
    );
    assert!(matches!(
        store.sync_bans(&mut early, now + 2).await.unwrap(),
        BanRead::Full(_)
    ));
    let logged: u64 = redis::cmd("ZCARD")
        .arg("log:{bans}:changes")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(logged, MAX_CHANGES as u64);
}

/// On Redis Cluster the ban scripts name keys of one slot (`{bans}`; a strike, its
/// identity's): strike, publish, sync and lift run without CROSSSLOT.
#[tokio::test(flavor = "multi_thread")]
async fn the_ban_scripts_run_on_redis_cluster() {
    let cluster = RedisCluster::start().await;
    let store = RedisStore::new(
        Target::Cluster(cluster.urls()),
        Duration::from_secs(2),
        "cl",
    );
    let now = SystemClock.now_ms();
    let rule = BanRule {
        after: 3,
        within_ms: 60_000,
        for_ms: 600_000,
        from_check: false,
    };
    let who = Ident::Ip("192.0.2.80".parse().unwrap());
    assert_eq!(store.strike(Scope::Ip, &who, 2, 60_000).await.unwrap(), 2);
    assert_eq!(store.strike(Scope::Ip, &who, 1, 60_000).await.unwrap(), 3);
    let mut cursor = BanCursor::default();
    assert_eq!(
        store.sync_bans(&mut cursor, now).await.unwrap(),
        BanRead::Full(Vec::new())
    );
    let ban = Ban::new(Scope::Ip, &who, &rule, now);
    assert_eq!(
        store
            .publish_ban(&ban, now, BanSource::Proxy)
            .await
            .unwrap(),
        Published::Set
    );
    store
        .quiet_strikes(Scope::Ip, &who, ban.expires_at_ms, now)
        .await
        .unwrap();
    assert_eq!(
        store.sync_bans(&mut cursor, now).await.unwrap(),
        BanRead::Changes {
            set: vec![(who.clone(), ban.clone())],
            lifted: Vec::new()
        }
    );
    store.lift_ban(&ban).await.unwrap();
    assert_eq!(
        store.sync_bans(&mut cursor, now).await.unwrap(),
        BanRead::Changes {
            set: Vec::new(),
            lifted: vec![(Scope::Ip, who.clone())]
        }
    );
    // The lift reset the count.
    assert_eq!(store.strike(Scope::Ip, &who, 1, 60_000).await.unwrap(), 1);
}

/// On Redis, the gateway that sees a client's `after`-th rejection bans it at once: the
/// very next request is 403, never a fourth 429, however long the publishing call to
/// Redis takes. Redis is paused (`CLIENT PAUSE`) from the second rejection on, so the ban
/// cannot reach Redis before the next request: the rejections come from the over-limit
/// cache and the ban must hold here. Repeated for 20 clients through one gateway.
#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_seeing_the_after_th_rejection_bans_at_once() {
    let redis = RedisServer::start().await;
    let mut conn = redis.client().await;
    let up = Upstream::start("bans").await;
    let gw = Gateway::start(&config(&redis), Some(&up)).await;
    for run in 0..20 {
        let ip = format!("198.51.100.{}", 100 + run);
        let mut codes = Vec::new();
        for i in 0..6 {
            if i == 3 {
                let _: () = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(400)
                    .arg("ALL")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
            codes.push(get(&gw, &ip).await.status().as_u16());
        }
        // per_minute = 2, after = 3: two 200s, three 429s, then banned.
        assert_eq!(codes, [200, 200, 429, 429, 429, 403], "run {run} ({ip})");
        eventually(Duration::from_secs(5), "the ban published", || async {
            let banned = automatic(&gw)
                .await
                .iter()
                .any(|b| b["value"] == ip.as_str());
            banned.then_some(())
        })
        .await;
    }
}
