//! Promises where features meet, on Redis, against the real binary: the over-limit cache
//! and leases only ever apply at the limit they were decided at (a reload or a policy row
//! lowers or raises it: the next request is decided afresh), the fleet's bound after a
//! limit is lowered, and a settle that names the script's own time (no injected clock).

use std::time::Duration;

use crate::support::postgres::TestDb;
use crate::support::redis::RedisServer;
use crate::support::{client, eventually, header, Gateway, Upstream, ADMIN_TOKEN};

const KEY: &str = "seams-key-secret";
/// A second key of the same tier: it shows when a new limit is in force without
/// touching the first key's leases.
const PROBE: &str = "seams-probe-secret";

fn store(redis: &RedisServer, prefix: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 2000\non_failure = \"closed\"\nkey_prefix = \"{prefix}\"\n",
        redis.url()
    )
}

/// One route and one key of tier `t` with `window` (a TOML inline table's body).
fn config(head: &str, window: &str) -> String {
    format!(
        r#"{head}
[tiers.t]
key = {{ {window} }}

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{{upstream}}"]

[[keys]]
id = "k1"
key = "{KEY}"
tenant = "acme"
tier = "t"

[[keys]]
id = "k2"
key = "{PROBE}"
tenant = "acme"
tier = "t"
"#
    )
}

async fn get(base: &str) -> reqwest::Response {
    get_as(base, KEY).await
}

async fn get_as(base: &str, key: &str) -> reqwest::Response {
    client()
        .get(format!("{base}/x"))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap()
}

async fn reload(gw: &Gateway, body: &str, up: &Upstream) {
    gw.rewrite(&body.replace("{upstream}", &up.addr.to_string()));
    let r = client()
        .post(gw.admin_url("/v1/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "reload refused");
}

/// A rejection Redis decided at limit 4 is cached; once the limit is 20 (a reload), the
/// same client's next request is decided afresh and admitted, as the memory store would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_rejection_does_not_outlive_its_limit() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let head = store(&redis, "cache");
    let tight = config(&head, r#"per_hour = 4, algorithm = "fixed_window""#);
    let gw = Gateway::start(&tight, Some(&up)).await;
    let base = gw.url("");
    let base = base.trim_end_matches('/');
    // The connection to Redis is made by the first request (another key): on a loaded
    // machine that may miss the deadline, which is not what this test is about.
    eventually(Duration::from_secs(10), "Redis connected", || async {
        (get_as(base, PROBE).await.status() == 200).then_some(())
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(get(base).await.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429]);
    // The second 429 came from the cache (no Redis call).
    let m = gw.metrics().await;
    assert!(
        m.contains("throttle_local_decisions_total{reason=\"over_limit_cache\"} 1"),
        "{m}"
    );
    reload(
        &gw,
        &config(&head, r#"per_hour = 20, algorithm = "fixed_window""#),
        &up,
    )
    .await;
    let r = get(base).await;
    assert_eq!(
        r.status(),
        200,
        "a 429 decided at limit 4 was repeated at limit 20: {:?}",
        r.text().await
    );
    assert_eq!(header(&r, "x-ratelimit-limit"), "20");
    assert_eq!(header(&r, "x-ratelimit-remaining"), "15");
}

/// Seconds until the current UTC hour ends.
fn secs_left_in_hour() -> u64 {
    use throttle::clock::{Clock, SystemClock};
    3_600 - (SystemClock.now_ms() / 1_000) % 3_600
}

/// Paced traffic through `bases` in turn for `secs`: (admitted, limits shown by 200s).
async fn paced(bases: &[String], per_sec: u64, secs: f64) -> (u64, Vec<String>) {
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_sec));
    let n = (per_sec as f64 * secs) as usize;
    let (mut admitted, mut limits) = (0, Vec::new());
    for i in 0..n {
        tick.tick().await;
        let r = get(&bases[i % bases.len()]).await;
        if r.status() == 200 {
            admitted += 1;
            limits.push(header(&r, "x-ratelimit-limit"));
        }
    }
    (admitted, limits)
}

/// The Redis count of the key's hour window (`start:count`).
async fn redis_count(redis: &RedisServer, prefix: &str) -> u64 {
    try_count(redis, prefix).await.unwrap()
}

/// `redis_count`, or None while Redis does not answer.
async fn try_count(redis: &RedisServer, prefix: &str) -> Option<u64> {
    let v: Option<String> = redis::cmd("GET")
        .arg(format!("{prefix}:{{key:k1}}:1h"))
        .query_async(&mut redis.client().await)
        .await
        .ok()?;
    Some(
        v.and_then(|v| v.split(':').nth(1)?.parse().ok())
            .unwrap_or(0),
    )
}

/// How a test lowers the limit of tier `t` on every gateway.
enum Lower<'a> {
    /// Rewrite gateway.toml and reload each gateway.
    Reload,
    /// UPDATE the tier's rate_limit_policies row (NOTIFY reaches every gateway).
    PolicyRow(&'a TestDb),
}

/// Two gateways lease tokens of a 1000/h key; then the limit drops to half of what the
/// fleet has admitted. From then on the fleet admits nothing more in that window (leases
/// of the old limit pay nothing: a request of the new limit is decided afresh), every
/// answer shows the new limit, and the old leases' leftovers are back in Redis soon
/// after (with the next call for the window, or when they expire). Answers the tokens
/// leased and unused at the change, and how long their return took.
async fn lowered_limit_bound(prefix: &str, head: String, lower: Lower<'_>) -> (u64, Duration) {
    if secs_left_in_hour() < 30 {
        tokio::time::sleep(Duration::from_secs(secs_left_in_hour() + 1)).await;
    }
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let head = format!("{head}{}", store(&redis, prefix));
    let body = config(&head, r#"per_hour = 1000, algorithm = "fixed_window""#);
    let a = Gateway::start(&body, Some(&up)).await;
    let b = Gateway::start(&body, Some(&up)).await;
    if let Lower::PolicyRow(_) = lower {
        for gw in [&a, &b] {
            eventually(Duration::from_secs(10), "database connected", || async {
                (gw.readyz().await["database"]["healthy"] == true).then_some(())
            })
            .await;
        }
    }
    let bases: Vec<String> = [&a, &b]
        .iter()
        .map(|g| g.url("").trim_end_matches('/').to_string())
        .collect();
    // 100 requests a second until both gateways hold leases with tokens left (Redis
    // counts more than was admitted): 1.5 s, then half a second more at a time.
    let (mut before, _) = paced(&bases, 100, 1.5).await;
    let mut counted = redis_count(&redis, prefix).await;
    for _ in 0..10 {
        if counted > before {
            break;
        }
        before += paced(&bases, 100, 0.5).await.0;
        counted = redis_count(&redis, prefix).await;
    }
    assert!(
        counted > before,
        "Redis counts {counted} for {before} admitted: no tokens leased"
    );
    let outstanding = counted - before;
    let new_limit = (before / 2).max(1);
    let lowered = config(
        &head,
        &format!(r#"per_hour = {new_limit}, algorithm = "fixed_window""#),
    );
    match lower {
        Lower::Reload => {
            reload(&a, &lowered, &up).await;
            reload(&b, &lowered, &up).await;
        }
        Lower::PolicyRow(db) => {
            sqlx::query("UPDATE rate_limit_policies SET req_per_hour = $1 WHERE id = 't'")
                .bind(new_limit as i32)
                .execute(&db.pool().await)
                .await
                .unwrap();
        }
    }
    let changed = tokio::time::Instant::now();
    let shown = new_limit.to_string();
    for base in &bases {
        eventually(
            Duration::from_secs(5),
            "the lowered limit in force",
            || async {
                let r = get_as(base, PROBE).await;
                (header(&r, "x-ratelimit-limit") == shown).then_some(())
            },
        )
        .await;
    }
    // Within the old leases' life: 200 requests as fast as they go, across both.
    let (after, _) = paced(&bases, 1_000, 0.2).await;
    assert_eq!(
        after, 0,
        "{after} admitted after lowering to {new_limit} with {before} admitted and \
         {outstanding} leased and unused: old leases paid"
    );
    eventually(Duration::from_secs(3), "old leases given back", || async {
        (redis_count(&redis, prefix).await == before).then_some(())
    })
    .await;
    (outstanding, changed.elapsed())
}

/// The bound after a reload lowers a limit (two gateways, one Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_limit_by_reload_admits_at_most_the_new_limit() {
    let (outstanding, back) = lowered_limit_bound("lowreload", String::new(), Lower::Reload).await;
    eprintln!("reload: {outstanding} leased tokens unused at the change, none spent after, all back {back:?} after it");
}

/// The same bound when a `rate_limit_policies` row lowers the tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_limit_by_policy_row_admits_at_most_the_new_limit() {
    let Some(db) = TestDb::migrated() else { return };
    let head = format!("[database]\nurl = \"{}\"\n", db.url);
    let (outstanding, back) = lowered_limit_bound("lowrow", head, Lower::PolicyRow(&db)).await;
    eprintln!("policy row: {outstanding} leased tokens unused at the change, none spent after, all back {back:?} after it");
}

/// On Redis with no injected clock, a sliding-log refund finds the request's entry: the
/// settle names the script's time of the decision, not the gateway's clock reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_sliding_log_refund_finds_its_entry() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let head = store(&redis, "slog");
    let body = format!(
        "{}\n[[routes]]\nname = \"llm\"\npath_prefix = \"/chat\"\nupstreams = [\"{{upstream}}\"]\ncost = 10\ncost_header = \"X-Usage-Tokens\"\n",
        config(
            &head,
            r#"per_hour = 100, algorithm = "sliding_log", admission = "exact""#
        )
    );
    let gw = Gateway::start(&body, Some(&up)).await;
    let conn = redis.client().await;
    // Five requests reserve 10 and use 2 each: 8 refunded every time.
    for i in 1..=5u64 {
        let r = client()
            .get(gw.url("/chat?usage=2"))
            .header("x-api-key", KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        eventually(
            Duration::from_secs(5),
            "the refund applied in Redis",
            || async {
                let members: Vec<String> = redis::cmd("ZRANGE")
                    .arg("slog:{key:k1}:1h")
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn.clone())
                    .await
                    .ok()?;
                let costs: Vec<u64> = members
                    .iter()
                    .filter_map(|m| m.rsplit(':').next()?.parse().ok())
                    .collect();
                (costs.len() as u64 == i && costs.iter().all(|c| *c == 2)).then_some(())
            },
        )
        .await;
    }
    let r = get(gw.url("").trim_end_matches('/')).await;
    // 5 x 2 used + 1 for this request: 89 left.
    assert_eq!(header(&r, "x-ratelimit-remaining"), "89");
    assert!(gw
        .metrics()
        .await
        .contains("throttle_cost_settled_total{direction=\"refund\"} 40"));
}

/// On Redis Cluster each scope is its own call: when one call fails (here: the key's
/// node is paused past the deadline) after another charged its scope, that charge is
/// refunded, as for a scope another call rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_refunds_charged_scopes_when_another_call_fails() {
    use crate::support::redis::RedisCluster;
    let mut cluster = RedisCluster::start().await;
    let ip_key = "cref:{ip:127.0.0.1}:1h";
    let ip_port = cluster.primary_for(ip_key).await.port;
    let mut key_id = String::new();
    for i in 0.. {
        key_id = format!("k{i}");
        if cluster
            .primary_for(&format!("cref:{{key:{key_id}}}:1h"))
            .await
            .port
            != ip_port
        {
            break;
        }
    }
    let store_line = crate::leases::cluster_line(&cluster);
    let body = format!(
        r#"[store]
backend = "redis"
{store_line}
timeout_ms = 300
on_failure = "open"
key_prefix = "cref"

[limits.ip]
per_hour = 100
algorithm = "fixed_window"
admission = "exact"

[tiers.t]
key = {{ per_hour = 100, algorithm = "fixed_window", admission = "exact" }}

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{{upstream}}"]

[[keys]]
id = "{key_id}"
key = "{KEY}"
tenant = "acme"
tier = "t"
"#
    );
    let up = Upstream::start("u").await;
    let gw = Gateway::start(&body, Some(&up)).await;
    let base = gw.url("");
    let base = base.trim_end_matches('/');
    let r = get(base).await;
    assert_eq!(header(&r, "x-ratelimit-remaining"), "99");
    let urls = cluster.urls();
    let count = |key: String| {
        let urls = urls.clone();
        async move {
            let client = redis::cluster::ClusterClient::new(urls).unwrap();
            let mut c = client.get_async_connection().await.unwrap();
            let v: Option<String> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut c)
                .await
                .unwrap();
            v.and_then(|v| v.split(':').nth(1)?.parse::<u64>().ok())
                .unwrap_or(0)
        }
    };
    assert_eq!(count(ip_key.to_string()).await, 1);
    // The key scope's node stops answering for longer than the deadline.
    let key_node = cluster
        .primary_for(&format!("cref:{{key:{key_id}}}:1h"))
        .await;
    let mut c = key_node.client().await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_500)
        .arg("ALL")
        .query_async(&mut c)
        .await
        .unwrap();
    let r = get(base).await;
    assert_eq!(r.status(), 200, "failed open");
    eventually(Duration::from_secs(5), "the ip charge refunded", || async {
        (count(ip_key.to_string()).await == 1).then_some(())
    })
    .await;
}

/// A tenant's limit stays exact on Redis Cluster under concurrent load from several of
/// its keys across three gateways, while its keys' own (tighter per key) limits reject
/// too: the tenant admits exactly its limit. (A key rejection must not leave the tenant
/// charged, even for a moment, while another key of the tenant is decided.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_tenant_limit_is_exact_under_load() {
    use crate::support::redis::RedisCluster;
    let cluster = RedisCluster::start().await;
    let store_line = crate::leases::cluster_line(&cluster);
    let mut body = format!(
        r#"[store]
backend = "redis"
{store_line}
timeout_ms = 2000
on_failure = "closed"
key_prefix = "ctl"

[tiers.small]
key = {{ per_hour = 4, algorithm = "fixed_window", admission = "exact" }}
[tiers.ten]
tenant = {{ per_hour = 15, algorithm = "fixed_window", admission = "exact" }}

[[tenants]]
id = "acme"
tier = "ten"

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{{upstream}}"]
"#
    );
    const KEYS: usize = 8;
    for k in 0..KEYS {
        body.push_str(&format!(
            "\n[[keys]]\nid = \"k{k}\"\nkey = \"key-{k}\"\ntenant = \"acme\"\ntier = \"small\"\n"
        ));
    }
    let up = Upstream::start("u").await;
    let mut gws = Vec::new();
    for _ in 0..3 {
        gws.push(Gateway::start(&body, Some(&up)).await);
    }
    let bases: Vec<String> = gws
        .iter()
        .map(|g| g.url("").trim_end_matches('/').to_string())
        .collect();
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let bases = bases.clone();
            tokio::spawn(async move {
                let (mut ok, mut other) = (0, Vec::new());
                for i in 0..12 {
                    let k = (t + i) % KEYS;
                    let r = get_as(&bases[(t + i) % 3], &format!("key-{k}")).await;
                    match r.status().as_u16() {
                        200 => ok += 1,
                        429 => {}
                        s => other.push(s),
                    }
                }
                (ok, other)
            })
        })
        .collect();
    let (mut admitted, mut other) = (0, Vec::new());
    for t in tasks {
        let (ok, o) = t.await.unwrap();
        admitted += ok;
        other.extend(o);
    }
    assert!(other.is_empty(), "{other:?}");
    assert_eq!(admitted, 15, "the tenant admitted {admitted} of its 15");
}

/// A call that misses its deadline may still run in Redis (here: Redis is paused past
/// the deadline and then runs it). The request was decided without it (503 for a closed
/// scope), so the charge it made is undone when its reply comes in: the count is back
/// to the admitted requests, and the limit is not under-admitted by the timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_missed_its_deadline_does_not_keep_its_charge() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let head = store(&redis, "late").replace("timeout_ms = 2000", "timeout_ms = 300");
    let gw = Gateway::start(
        &config(
            &head,
            r#"per_hour = 100, algorithm = "fixed_window", admission = "exact""#,
        ),
        Some(&up),
    )
    .await;
    let base = gw.url("");
    let base = base.trim_end_matches('/');
    assert_eq!(get(base).await.status(), 200);
    assert_eq!(redis_count(&redis, "late").await, 1);
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_000)
        .arg("ALL")
        .query_async(&mut redis.client().await)
        .await
        .unwrap();
    let r = get(base).await;
    assert_eq!(
        r.status(),
        503,
        "fail closed when the call misses its deadline"
    );
    // The paused call runs once the pause ends (the count is 2 for a moment); its
    // charge is refunded.
    eventually(Duration::from_secs(5), "the late charge undone", || async {
        let undone = gw
            .metrics()
            .await
            .contains("throttle_store_late_charges_total 1");
        (undone && try_count(&redis, "late").await? == 1).then_some(())
    })
    .await;
}

/// A usage of 999,999,999 on a 100/min token bucket leaves it at most one limit in debt
/// (memory and Redis): the response's headers describe the bucket as settled (full again
/// in 120 s, not the 6 s of the reserve alone), the next request's 429 counts the debt
/// in `current` (capacity 100 + debt 100 + cost 10) and its Retry-After is 66 s, not
/// centuries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_usage_is_bounded_by_the_limit_and_shows_in_the_headers() {
    use throttle::clock::{Clock, SystemClock};
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    for head in [String::new(), store(&redis, "huge")] {
        let window = if head.is_empty() {
            r#"per_minute = 100, algorithm = "token_bucket""#
        } else {
            r#"per_minute = 100, algorithm = "token_bucket", admission = "exact""#
        };
        let body = format!(
            "{}\n[[routes]]\nname = \"llm\"\npath_prefix = \"/chat\"\nupstreams = [\"{{upstream}}\"]\ncost = 10\ncost_header = \"X-Usage-Tokens\"\n",
            config(&head, window)
        );
        let gw = Gateway::start(&body, Some(&up)).await;
        let r = client()
            .get(gw.url("/chat?usage=999999999"))
            .header("x-api-key", KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let now_s = SystemClock.now_ms() / 1_000;
        let reset: u64 = header(&r, "x-ratelimit-reset").parse().unwrap();
        assert_eq!(header(&r, "x-ratelimit-remaining"), "0", "{head}");
        assert!(
            (now_s + 115..=now_s + 122).contains(&reset),
            "reset {} s ahead, want 120 ({head})",
            reset.saturating_sub(now_s)
        );
        let body: serde_json::Value = eventually(Duration::from_secs(5), "the debt", || async {
            let r = get(gw.url("").trim_end_matches('/')).await;
            (r.status() == 429).then_some(())?;
            r.json().await.ok()
        })
        .await;
        // The probe costs 1 (the "/" route).
        assert_eq!(body["current"], 201, "{body} ({head})");
        let retry = body["retry_after"].as_f64().unwrap();
        assert!(
            (59.0..=61.0).contains(&retry),
            "retry_after {retry} ({head})"
        );
    }
}
