//! Local admission on Redis, end to end: leases and the over-limit cache with real
//! redis-server processes (single node and the local Cluster) and the real gateway binary.
//! Round trips are counted with `throttle_store_calls_total{store="redis"}` from /metrics;
//! traffic is paced with a tokio interval, every assertion is on counts.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use throttle::clock::{Clock, SystemClock};

use crate::support::redis::{RedisCluster, RedisServer};
use crate::support::{client, header, Gateway, Upstream};

const CALLS: &str = r#"throttle_store_calls_total{store="redis"}"#;
const LEASED: &str = r#"throttle_local_decisions_total{reason="lease"}"#;
const CACHED: &str = r#"throttle_local_decisions_total{reason="over_limit_cache"}"#;
const RETURNED: &str = "throttle_lease_tokens_returned_total";

/// The value of one series in a Prometheus text exposition (0 when absent).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

async fn value(gw: &Gateway, series: &str) -> f64 {
    metric(&gw.metrics().await, series)
}

/// `[store]` on a single node (`url = ...`) or a cluster (`cluster = [...]`). A generous
/// deadline (debug builds on a small CI box); fail closed, so a store error is a 503 and
/// never a silently admitted request.
fn store(redis_line: &str, prefix: &str, extra: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\n{redis_line}\ntimeout_ms = 2000\non_failure = \"closed\"\nkey_prefix = \"{prefix}\"\n{extra}\n"
    )
}

fn single(redis: &RedisServer) -> String {
    format!("url = \"{}\"", redis.url())
}

pub(crate) fn cluster_line(cluster: &RedisCluster) -> String {
    let nodes = cluster
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!("cluster = [{nodes}]")
}

/// A route to `{upstream}` and one key per `(name, tier)`: key `name`, id `k_name`.
fn keys(keys: &[(&str, &str)]) -> String {
    let mut s = String::from(
        "\n[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"{upstream}\"]\n",
    );
    for (name, tier) in keys {
        s.push_str(&format!(
            "\n[[keys]]\nid = \"k_{name}\"\nkey = \"{name}\"\ntenant = \"t_{name}\"\ntier = \"{tier}\"\n"
        ));
    }
    s
}

async fn status(c: &reqwest::Client, base: &str, key: &str) -> u16 {
    c.get(format!("{base}/x"))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Statuses of a paced run: `per_sec` requests a second for `secs` seconds, one request at
/// a time, round-robin over `bases`.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    ok: u64,
    limited: u64,
    other: u64,
    /// The lowest `X-RateLimit-Remaining` of a 200.
    min_remaining: Option<u64>,
}

impl Tally {
    fn total(&self) -> u64 {
        self.ok + self.limited + self.other
    }
}

async fn paced(bases: &[String], key: &str, per_sec: u64, secs: f64) -> Tally {
    let c = client();
    let n = (per_sec as f64 * secs).round() as u64;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_sec));
    let mut t = Tally::default();
    for i in 0..n {
        tick.tick().await;
        let r = c
            .get(format!("{}/x", bases[i as usize % bases.len()]))
            .header("x-api-key", key)
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            200 => {
                t.ok += 1;
                let left: u64 = header(&r, "x-ratelimit-remaining").parse().unwrap();
                t.min_remaining = Some(t.min_remaining.map_or(left, |m| m.min(left)));
            }
            429 => t.limited += 1,
            _ => t.other += 1,
        }
    }
    t
}

/// `per_task` requests for every key from each of `tasks` concurrent tasks, spread
/// round-robin over `bases`; the 200s per key (other statuses than 200/429 panic).
async fn burst(bases: &[String], keys: &[&str], tasks: usize, per_task: usize) -> Vec<u64> {
    let bases = Arc::new(bases.to_vec());
    let mut handles = Vec::new();
    for t in 0..tasks {
        let bases = bases.clone();
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        handles.push(tokio::spawn(async move {
            let c = client();
            let mut ok = vec![0u64; keys.len()];
            for i in 0..per_task {
                for (k, key) in keys.iter().enumerate() {
                    let base = &bases[(t + i + k) % bases.len()];
                    match status(&c, base, key).await {
                        200 => ok[k] += 1,
                        429 => {}
                        s => panic!("{key}: status {s}"),
                    }
                }
            }
            ok
        }));
    }
    let mut total = vec![0u64; keys.len()];
    for h in handles {
        for (k, n) in h.await.unwrap().into_iter().enumerate() {
            total[k] += n;
        }
    }
    total
}

/// Requests of `key` to `base`, one at a time, until `n` were sent; the 200s.
async fn drain(base: &str, key: &str, n: usize) -> u64 {
    let c = client();
    let mut ok = 0;
    for _ in 0..n {
        match status(&c, base, key).await {
            200 => ok += 1,
            429 => {}
            s => panic!("{key}: status {s}"),
        }
    }
    ok
}

// === 1. Round trips of clients under their limits ===

const UNDER: &str = r#"
[limits.ip]
per_second = 100000
per_minute = 1000000
{admission}
[limits.global]
per_second = 100000
{admission}
[tiers.t]
key = { per_second = 1000, per_minute = 60000 {key_admission} }
"#;

fn under(exact: bool) -> String {
    let (a, k) = if exact {
        ("admission = \"exact\"", ", admission = \"exact\"")
    } else {
        ("", "")
    };
    UNDER
        .replace("{admission}", a)
        .replace("{key_admission}", k)
        + &keys(&[("under", "t")])
}

/// ~100 requests/s of a key far under every window (ip 2, key 2, global 1) for 1 s of
/// warm-up and 3 s measured; round trips per request over the measured part.
async fn round_trips(redis_line: &str, prefix: &str, exact: bool) -> f64 {
    let up = Upstream::start("u").await;
    let body = store(redis_line, prefix, "") + &under(exact);
    let gw = Gateway::start(&body, Some(&up)).await;
    let bases = [gw.url("")];
    let warm = paced(&bases, "under", 100, 1.0).await;
    assert_eq!(warm.ok, warm.total(), "warm-up: {warm:?}\n{}", gw.log());
    let before = gw.metrics().await;
    let t = paced(&bases, "under", 100, 3.0).await;
    let after = gw.metrics().await;
    assert_eq!(
        t.ok,
        t.total(),
        "every request under the limits is admitted: {t:?}"
    );
    let calls = metric(&after, CALLS) - metric(&before, CALLS);
    let leased = metric(&after, LEASED) - metric(&before, LEASED);
    let per = calls / t.total() as f64;
    eprintln!(
        "round trips ({prefix}, {}): {calls} for {} requests = {per:.3} per request; {leased} admitted on leases",
        if exact { "exact" } else { "auto" },
        t.total()
    );
    per
}

/// Target: <= 0.1 round trips per request for a client at a tenth of its limits.
#[tokio::test(flavor = "multi_thread")]
async fn under_the_limit_needs_few_round_trips() {
    let redis = RedisServer::start().await;
    let per = round_trips(&single(&redis), "rt", false).await;
    assert!(
        per <= 0.1,
        "{per:.3} round trips per request (target <= 0.1)"
    );
}

/// `admission = "exact"` everywhere: every request is one round trip, as before.
#[tokio::test(flavor = "multi_thread")]
async fn exact_admission_is_one_round_trip_per_request() {
    let redis = RedisServer::start().await;
    let per = round_trips(&single(&redis), "rtx", true).await;
    assert!(
        (0.97..=1.03).contains(&per),
        "{per:.3} round trips per request with admission = \"exact\" (expected 1.0)"
    );
}

/// The same on the local 3-primary Cluster. Each scope lives in its own slot there and is
/// its own call, and a per-second window's lease lasts at most 250 ms: at 100 requests/s
/// the floor is about 4 calls a second per scope, so the target holds per scope (3 scopes:
/// ~0.15 per request measured), not per request.
#[tokio::test(flavor = "multi_thread")]
async fn under_the_limit_needs_few_round_trips_on_cluster() {
    let cluster = RedisCluster::start().await;
    let per = round_trips(&cluster_line(&cluster), "rtc", false).await;
    assert!(
        per / 3.0 <= 0.1,
        "{per:.3} round trips per request on Cluster, {:.3} per scope (target <= 0.1)",
        per / 3.0
    );
}

/// A lease is asked for only when the identity's rate x lease length reaches 2 tokens: a
/// client sending one request every 1.1 s (1 token per 1 s lease) takes none, so every
/// request is exactly one round trip and nothing is ever given back.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_client_takes_no_lease() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let body = store(&single(&redis), "slow", "")
        + "[tiers.t]\nkey = { per_hour = 1000 }\n"
        + &keys(&[("slow", "t")]);
    let gw = Gateway::start(&body, Some(&up)).await;
    let c = client();
    let mut tick = tokio::time::interval(Duration::from_millis(1_100));
    for _ in 0..5 {
        tick.tick().await;
        assert_eq!(status(&c, &gw.url(""), "slow").await, 200);
    }
    // Past the end of any lease (1 s) and a sweep (100 ms).
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let m = gw.metrics().await;
    let (calls, returned) = (metric(&m, CALLS), metric(&m, RETURNED));
    let mut conn = redis.client().await;
    let state: String = redis::cmd("GET")
        .arg("slow:{key:k_slow}:1h")
        .query_async(&mut conn)
        .await
        .unwrap();
    eprintln!("slow client: 5 requests, {calls} round trips, {returned} tokens returned; Redis state {state}");
    assert_eq!(
        (calls, returned),
        (5.0, 0.0),
        "1 request per 1.1 s should take no lease (rate x lease = 1 token < 2)"
    );
}

/// Sustained traffic at half the limit, on one gateway, for every algorithm: leases are
/// renewed every 250 ms (a quarter of the second window) for 6 s. No request is rejected
/// and the remaining quota never gets near 0: an exact limiter shows ~50-99 left, and one
/// gateway alone has no one else holding tokens. (Tokens of a spent lease must not stay
/// held once that lease is over, however many leases follow it.)
#[tokio::test(flavor = "multi_thread")]
async fn sustained_traffic_at_half_the_limit_stays_clear_of_it() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let tiers: String = ALGORITHMS
        .iter()
        .map(|a| format!("[tiers.{a}]\nkey = {{ per_second = 100, algorithm = \"{a}\" }}\n"))
        .collect();
    let body = store(&single(&redis), "half", "") + &tiers + &keys(&ALGORITHMS.map(|a| (a, a)));
    let gw = Gateway::start(&body, Some(&up)).await;
    let bases = vec![gw.url("")];
    let runs: Vec<_> = ALGORITHMS
        .iter()
        .map(|a| {
            let bases = bases.clone();
            tokio::spawn(async move { paced(&bases, a, 50, 6.0).await })
        })
        .collect();
    let mut failed = Vec::new();
    for (a, r) in ALGORITHMS.iter().zip(runs) {
        let t = r.await.unwrap();
        eprintln!("half the limit, {a}: {t:?}");
        if t.ok != t.total() {
            failed.push(format!("{a}: {} of {} rejected", t.limited, t.total()));
        }
        // Exact, a client at half its limit never gets near it; held leases may lower
        // what is shown by a lease or two, never to within 10% of the limit.
        if t.min_remaining.is_some_and(|m| m < 10) {
            failed.push(format!(
                "{a}: X-RateLimit-Remaining fell to {:?} of 100",
                t.min_remaining
            ));
        }
    }
    let m = gw.metrics().await;
    eprintln!(
        "half the limit: {} round trips, {} lease decisions, {} tokens returned",
        metric(&m, CALLS),
        metric(&m, LEASED),
        metric(&m, RETURNED)
    );
    assert!(
        failed.is_empty(),
        "a client at half its limit was rejected or pushed to its limit: {failed:?}"
    );
}

/// Four keys at half their limits for 8 s, sharing the ip and global scopes (also at
/// half): the layout of `benches/local_admission.sh` (a). Sustained traffic renews leases
/// all along; nothing may be rejected and round trips stay <= 0.1 per request.
#[tokio::test(flavor = "multi_thread")]
async fn several_keys_at_half_their_limits_sustained() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let limits = "[limits.ip]\nper_second = 400\nper_minute = 24000\n[limits.global]\nper_second = 400\n[tiers.half]\nkey = { per_second = 100, per_minute = 6000 }\n";
    const NAMES: [&str; 4] = ["h1", "h2", "h3", "h4"];
    let body = store(&single(&redis), "sus", "") + limits + &keys(&NAMES.map(|n| (n, "half")));
    let gw = Gateway::start(&body, Some(&up)).await;
    let bases = vec![gw.url("")];
    let run = |secs: f64| {
        let runs: Vec<_> = NAMES
            .iter()
            .map(|n| {
                let bases = bases.clone();
                tokio::spawn(async move { paced(&bases, n, 50, secs).await })
            })
            .collect();
        async move {
            let mut all = Tally::default();
            for r in runs {
                let t = r.await.unwrap();
                all.ok += t.ok;
                all.limited += t.limited;
                all.other += t.other;
            }
            all
        }
    };
    let _ = run(1.0).await;
    let before = gw.metrics().await;
    let t = run(8.0).await;
    let after = gw.metrics().await;
    let calls = metric(&after, CALLS) - metric(&before, CALLS);
    let per = calls / t.total() as f64;
    eprintln!(
        "4 keys at half their limits, 8 s: {t:?}, {calls} round trips = {per:.3} per request, {} lease decisions",
        metric(&after, LEASED) - metric(&before, LEASED)
    );
    assert_eq!(
        t.limited, 0,
        "clients at half their limits were rejected: {t:?}"
    );
    assert!(
        per <= 0.1,
        "{per:.3} round trips per request (target <= 0.1)"
    );
}

// === 2. A client far over its limit, and the 429 contract of the cache ===

/// Seconds until the current minute ends (wall clock, as Redis's TIME on this machine).
fn secs_left_in_minute() -> f64 {
    let now = SystemClock.now_ms() as f64 / 1000.0;
    60.0 - now % 60.0
}

struct Rejected {
    headers: reqwest::header::HeaderMap,
    body: Value,
}

/// 500 requests at once against a fixed window of 5 per minute (100x): the 5 admitted and
/// the first rejection go to Redis, every later 429 comes from the over-limit cache; a
/// cached 429 carries the same contract as Redis's.
#[tokio::test(flavor = "multi_thread")]
async fn over_limit_client_costs_one_round_trip_per_retry_after() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let body = store(&single(&redis), "ol", "")
        + "[tiers.small]\nkey = { per_minute = 5, algorithm = \"fixed_window\" }\n"
        + &keys(&[("abuser", "small")]);
    let gw = Gateway::start(&body, Some(&up)).await;
    // One window for the whole run (500 requests take well under 15 s).
    if secs_left_in_minute() < 15.0 {
        tokio::time::sleep(Duration::from_secs_f64(secs_left_in_minute() + 0.2)).await;
    }
    let c = client();
    let calls0 = value(&gw, CALLS).await;
    let mut ok = 0u64;
    let mut limited = 0u64;
    let mut first: Option<Rejected> = None;
    let mut cached: Option<Rejected> = None;
    for _ in 0..500 {
        let r = c
            .get(gw.url("/x"))
            .header("x-api-key", "abuser")
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            200 => ok += 1,
            429 => {
                limited += 1;
                if first.is_none() || cached.is_none() {
                    let rej = Rejected {
                        headers: r.headers().clone(),
                        body: r.json().await.unwrap(),
                    };
                    let from_cache = value(&gw, CACHED).await;
                    if first.is_none() {
                        assert_eq!(from_cache, 0.0, "the first 429 is Redis's");
                        first = Some(rej);
                    } else {
                        assert_eq!(from_cache, 1.0, "the second 429 is the cache's");
                        cached = Some(rej);
                    }
                }
            }
            s => panic!("status {s}\n{}", gw.log()),
        }
    }
    let m = gw.metrics().await;
    let calls = metric(&m, CALLS) - calls0;
    let from_cache = metric(&m, CACHED);
    let leased = metric(&m, LEASED);
    let mut conn = redis.client().await;
    let state: String = redis::cmd("GET")
        .arg("ol:{key:k_abuser}:1m")
        .query_async(&mut conn)
        .await
        .unwrap();
    eprintln!(
        "100x client: 500 requests, {ok} admitted ({leased} on a lease), {limited} x 429, {calls} round trips, {from_cache} 429s from the over-limit cache; Redis state {state}"
    );
    assert_eq!(ok, 5, "a fixed window of 5 in one minute");
    assert!(
        calls <= (ok + 2) as f64,
        "{calls} round trips for {ok} admitted and one retry_after (target: admitted + ~1)"
    );
    assert!(
        from_cache >= (limited - 2) as f64,
        "{from_cache} of {limited} 429s from the cache"
    );

    // The contract: same status, headers and body fields; a shrinking retry_after.
    let (first, cached) = (first.unwrap(), cached.unwrap());
    for (name, r) in [("redis", &first), ("cache", &cached)] {
        let h = |n: &str| {
            r.headers
                .get(n)
                .unwrap_or_else(|| panic!("{name}: no {n} header"))
                .to_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(h("x-ratelimit-limit"), "5", "{name}");
        assert_eq!(h("x-ratelimit-remaining"), "0", "{name}");
        assert!(h("x-ratelimit-reset").parse::<u64>().unwrap() > 0, "{name}");
        assert!(h("retry-after").parse::<u64>().unwrap() >= 1, "{name}");
        let b = &r.body;
        assert_eq!(b["error"], "rate_limit_exceeded", "{name}: {b}");
        assert_eq!(b["scope"], "key", "{name}: {b}");
        assert_eq!(b["limit"], 5, "{name}: {b}");
        assert_eq!(b["window"], "1m", "{name}: {b}");
        assert!(b["current"].as_u64().is_some(), "{name}: {b}");
        assert!(
            b["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{name}: {b}"
        );
        assert!(b["retry_after"].as_f64().unwrap() > 0.0, "{name}: {b}");
    }
    let fields = |b: &Value| {
        let mut k: Vec<String> = b.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(
        fields(&first.body),
        fields(&cached.body),
        "same body fields"
    );
    assert!(
        cached.body["retry_after"].as_f64() <= first.body["retry_after"].as_f64(),
        "retry_after shrinks: redis {} then cache {}",
        first.body,
        cached.body
    );
    let secs = |r: &Rejected, n: &str| r.headers[n].to_str().unwrap().parse::<u64>().unwrap();
    assert!(secs(&cached, "retry-after") <= secs(&first, "retry-after"));
    assert!(
        secs(&cached, "x-ratelimit-reset").abs_diff(secs(&first, "x-ratelimit-reset")) <= 1,
        "same reset"
    );
}

// === 3. Exactness with three gateways, every algorithm ===

const ALGORITHMS: [&str; 5] = [
    "token_bucket",
    "leaky_bucket",
    "fixed_window",
    "sliding_window",
    "sliding_log",
];

/// One tier per algorithm, `limit` per day (a day: no refill or window end during a test).
fn algorithm_tiers(limit: u32) -> String {
    ALGORITHMS
        .iter()
        .map(|a| format!("[tiers.{a}]\nkey = {{ per_day = {limit}, algorithm = \"{a}\" }}\n"))
        .collect::<String>()
        + &keys(&ALGORITHMS.map(|a| (a, a)))
}

/// 3 gateways, 8 concurrent tasks sending 2x the limit of every algorithm spread over
/// them: never above the limit. Then, once every lease has ended and gone back, a fresh
/// gateway admits exactly what is left: leases strand nothing.
async fn exact_fleet(redis_line: &str, prefix: &str, algorithms: &[&str], scopes: &str) {
    const LIMIT: u64 = 50;
    let up = Upstream::start("u").await;
    let body = store(redis_line, prefix, "") + scopes + &algorithm_tiers(LIMIT as u32);
    let mut gws = Vec::new();
    for _ in 0..3 {
        gws.push(Gateway::start(&body, Some(&up)).await);
    }
    let bases: Vec<String> = gws.iter().map(|g| g.url("")).collect();
    // 8 tasks x 13 = 104 requests per key.
    let admitted = burst(&bases, algorithms, 8, 13).await;
    let mut leased = 0.0;
    for g in &gws {
        leased += value(g, LEASED).await;
    }
    // Every lease has ended (1 s) and its leftovers went back (every 100 ms).
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let mut returned = 0.0;
    for g in &gws {
        returned += value(g, RETURNED).await;
    }
    let fresh = Gateway::start(&body, Some(&up)).await;
    for (a, n) in algorithms.iter().zip(&admitted) {
        let rest = drain(&fresh.url(""), a, (LIMIT + 10) as usize).await;
        eprintln!(
            "fleet ({prefix}) {a}: admitted {n} of 104 with a limit of {LIMIT} ({} below it); a fresh gateway then admitted {rest}, total {}",
            LIMIT.saturating_sub(*n),
            n + rest
        );
        assert!(*n <= LIMIT, "{a}: admitted {n} with a limit of {LIMIT}");
        if *a == "sliding_window" {
            assert!(n + rest <= LIMIT, "{a}: {n} + {rest} over the limit");
        } else {
            assert_eq!(
                n + rest,
                LIMIT,
                "{a}: {n} admitted by the fleet + {rest} afterwards should be the limit (tokens stranded or over-admitted)"
            );
        }
    }
    eprintln!("fleet ({prefix}): {leased} requests admitted on leases, {returned} tokens returned");
}

#[tokio::test(flavor = "multi_thread")]
async fn fleet_never_admits_over_the_limit_with_leases() {
    let redis = RedisServer::start().await;
    exact_fleet(&single(&redis), "fx", &ALGORITHMS, "").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_fleet_never_admits_over_the_limit_with_leases() {
    let cluster = RedisCluster::start().await;
    let scopes = "[limits.ip]\nper_hour = 100000\n[limits.global]\nper_hour = 100000\n";
    exact_fleet(
        &cluster_line(&cluster),
        "fxc",
        &["token_bucket", "sliding_log"],
        scopes,
    )
    .await;
}

// === 4-5. Unused tokens go back: on expiry, and at shutdown ===

/// A's traffic: 30 requests of every algorithm's key at 50/s (enough for leases).
async fn take_leases(gw: &Gateway) -> Vec<u64> {
    let bases = [gw.url("")];
    let mut admitted = Vec::new();
    for a in ALGORITHMS {
        let t = paced(&bases, a, 50, 0.6).await;
        assert_eq!(t.ok, t.total(), "{a}: {t:?}");
        admitted.push(t.ok);
    }
    assert!(value(gw, LEASED).await > 0.0, "no lease was taken");
    admitted
}

/// B admits exactly what A did not use, per algorithm.
async fn rest_is_available(b: &Gateway, limit: u64, a_admitted: &[u64]) {
    for (a, n) in ALGORITHMS.iter().zip(a_admitted) {
        let rest = drain(&b.url(""), a, (limit + 10) as usize).await;
        eprintln!("{a}: A admitted {n}, B then {rest} (limit {limit})");
        assert_eq!(
            rest,
            limit - n,
            "{a}: B admitted {rest} after A admitted {n}, limit {limit}: leased tokens stranded"
        );
    }
}

/// Gateway A (lease_ms = 500) takes leases and stops sending: its leases end and the
/// unused tokens go back within ~2 s, so B can admit the limit minus A's admissions.
#[tokio::test(flavor = "multi_thread")]
async fn unused_tokens_go_back_when_the_lease_ends() {
    const LIMIT: u64 = 100;
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let a_body = store(&single(&redis), "exp", "lease_ms = 500") + &algorithm_tiers(100);
    let b_body = store(&single(&redis), "exp", "") + &algorithm_tiers(100);
    let a = Gateway::start(&a_body, Some(&up)).await;
    let b = Gateway::start(&b_body, Some(&up)).await;
    let admitted = take_leases(&a).await;
    let returned = crate::support::eventually(
        Duration::from_secs(2),
        "leased tokens returned on expiry",
        || async {
            let n = value(&a, RETURNED).await;
            (n > 0.0).then_some(n)
        },
    )
    .await;
    // Every lease ended 500 ms after A's last request; the sweep runs every 100 ms.
    tokio::time::sleep(Duration::from_millis(700)).await;
    eprintln!(
        "A admitted {admitted:?}; {returned} tokens returned first, {} in all",
        value(&a, RETURNED).await
    );
    rest_is_available(&b, LIMIT, &admitted).await;
}

/// Gateway A (lease_ms = 60000: leases of 60 s) takes leases, then SIGTERM: it gives every
/// lease back before it exits, so B admits the limit minus A's admissions.
#[tokio::test(flavor = "multi_thread")]
async fn unused_tokens_go_back_on_sigterm() {
    const LIMIT: u64 = 100;
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let a_body = (store(&single(&redis), "term", "lease_ms = 60000") + &algorithm_tiers(100))
        .replace("{upstream}", &up.addr.to_string());
    let b_body = store(&single(&redis), "term", "") + &algorithm_tiers(100);
    let mut a = Gateway::start_full(&["run"], &a_body, "grace_period_secs = 5").await;
    let b = Gateway::start(&b_body, Some(&up)).await;
    let admitted = take_leases(&a).await;
    assert_eq!(
        value(&a, RETURNED).await,
        0.0,
        "nothing returned before SIGTERM (leases of 60 s)"
    );
    a.signal("TERM");
    let exit = a.wait_exit(Duration::from_secs(15)).await;
    assert!(exit.is_some(), "A did not exit after SIGTERM\n{}", a.log());
    eprintln!("A admitted {admitted:?}, exited {exit:?}");
    rest_is_available(&b, LIMIT, &admitted).await;
}

// === 6. A Redis outage with leases in hand ===

/// A holds a lease (lease_ms = 5000) when Redis dies: the lease keeps admitting (no 503
/// although on_failure = "closed") until its tokens run out, then 503s.
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_in_hand_serves_through_a_redis_outage() {
    let mut redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let body = store(&single(&redis), "out", "lease_ms = 5000")
        .replace("timeout_ms = 2000", "timeout_ms = 200")
        + "[tiers.t]\nkey = { per_hour = 1000, algorithm = \"fixed_window\" }\n"
        + &keys(&[("held", "t")]);
    let gw = Gateway::start(&body, Some(&up)).await;
    // Stay inside one hour window for the whole test.
    let now = SystemClock.now_ms() as f64 / 1000.0;
    let left = 3600.0 - now % 3600.0;
    if left < 30.0 {
        tokio::time::sleep(Duration::from_secs_f64(left + 0.2)).await;
    }
    let bases = [gw.url("")];
    let warm = paced(&bases, "held", 100, 0.5).await;
    assert_eq!(warm.ok, warm.total(), "{warm:?}");
    // Redis holds admitted + leased-and-unused tokens: what is in hand. Until a good lease
    // is in hand (a spent one is renewed at the client's rate), one more request at a time.
    let mut conn = redis.client().await;
    let c = client();
    let mut admitted = warm.ok;
    let (mut state, mut in_hand) = (String::new(), 0);
    for _ in 0..300 {
        state = redis::cmd("GET")
            .arg("out:{key:k_held}:1h")
            .query_async(&mut conn)
            .await
            .unwrap();
        let charged: u64 = state.rsplit(':').next().unwrap().parse().unwrap();
        in_hand = charged - admitted;
        if in_hand >= 10 {
            break;
        }
        assert_eq!(status(&c, &gw.url(""), "held").await, 200);
        admitted += 1;
    }
    let leased_before = value(&gw, LEASED).await;
    eprintln!("outage: {admitted} admitted, {state} in Redis: {in_hand} leased tokens in hand");
    assert!(in_hand >= 10, "no lease in hand ({state})");
    redis.kill();

    let mut statuses = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    for _ in 0..2_000 {
        tick.tick().await;
        let r = c
            .get(gw.url("/x"))
            .header("x-api-key", "held")
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        if s == 503 {
            assert_eq!(header(&r, "retry-after"), "1");
            assert_eq!(
                r.json::<Value>().await.unwrap(),
                serde_json::json!({"error": "rate_limiter_unavailable"})
            );
        }
        statuses.push(s);
        if statuses.iter().filter(|s| **s == 503).count() >= 5 {
            break;
        }
    }
    let served = statuses.iter().take_while(|s| **s == 200).count() as u64;
    let after: Vec<u16> = statuses[served as usize..].to_vec();
    let leased = value(&gw, LEASED).await - leased_before;
    eprintln!(
        "outage: {served} x 200 from the lease ({leased} lease decisions), then {after:?}\n{}",
        gw.log()
    );
    assert!(
        after.iter().all(|s| *s == 503),
        "after the lease: only 503s expected, got {after:?}"
    );
    assert!(!after.is_empty(), "no 503 after the lease ran out");
    assert_eq!(
        served, in_hand,
        "the lease in hand ({in_hand} tokens) should serve exactly that many requests during the outage"
    );
    assert_eq!(leased, served as f64, "each was a lease decision");
}

/// Redis's own count of EVALSHA calls since the last `CONFIG RESETSTAT`.
async fn evalsha_calls(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|v| v.split(',').next())
        .map_or(0, |v| v.parse().unwrap())
}

/// Settles no lease takes ride on the identity's next call instead of a call of their
/// own (`Local::carry`), and that call's decision sees them: the refund of a call's own
/// charge (a token bucket: no lease paid it) and a debt with no lease in hand (a fixed
/// window). A second refund, held with no call to follow, goes with the expiry pass; a
/// second debt is paid from the lease the second call took. An `exact` window's settles
/// are calls of their own, at once. Counted as store calls when sent, and by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_ride_on_the_identitys_next_call() {
    use throttle::clock::ManualClock;
    use throttle::limiter::{
        Admission, Algorithm, Check, Ident, OnFailure, Scope, ScopeLimits, Window, WindowLimit,
    };
    use throttle::metrics::Metrics;
    use throttle::store::redis::Target;
    use throttle::store::{LimitStore, RedisStore};

    let redis = RedisServer::start().await;
    let mut conn = redis.client().await;
    // 100 ms into a minute: its fixed window lasts.
    let clock = Arc::new(ManualClock::at(1_764_000_060_100));
    let metrics = Arc::new(Metrics::new().unwrap());
    let store = RedisStore::new(Target::Single(redis.url()), Duration::from_secs(2), "carry")
        .with_local_admission(1_000)
        .with_clock(clock.clone())
        .with_metrics(metrics.clone());
    // Loaded first, so no call is answered NOSCRIPT and sent again.
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(throttle::store::redis::CHECK_LUA)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    // (algorithm, admission, the two settles, remaining after the second request, the
    // store calls of it all: 2 requests, 2 settles, then the expiry pass).
    let cases = [
        (Algorithm::TokenBucket, Admission::Auto, -1, Some(599), 3),
        (Algorithm::FixedWindow, Admission::Auto, 3, Some(595), 2),
        (Algorithm::TokenBucket, Admission::Exact, -1, None, 4),
        (Algorithm::FixedWindow, Admission::Exact, 3, None, 4),
    ];
    for (n, (alg, admission, delta, remaining, calls)) in cases.into_iter().enumerate() {
        let what = format!("{alg:?} {admission:?}, settles of {delta}");
        let l = ScopeLimits {
            concurrent: None,
            ban: None,
            windows: vec![
                WindowLimit::with_algorithm(Window::Minute, 600, alg).with_admission(admission)
            ],
            on_failure: OnFailure::Closed,
            message: None,
            count_on: None,
        };
        let mut check = Check::new(1);
        check.push(Scope::Key, Ident::Name(format!("k{n}").into()), &l);
        let before = metrics.store_calls.get();
        // Two requests, each settled when it ends; neither paid from a lease (the first
        // is too little rate to lease for).
        let mut seen = None;
        for _ in 0..2 {
            assert!(store.decide_locally(&check).is_none(), "{what}");
            let v = store.check(&check).await.unwrap();
            assert!(v.allowed, "{what}");
            seen = v.governing.map(|g| g.decision.remaining);
            store.settle(&check, delta, v.decided_at);
        }
        if let Some(r) = remaining {
            assert_eq!(
                seen,
                Some(r),
                "{what}: the second decision saw the first settle"
            );
        }
        clock.advance(Duration::from_millis(50));
        store.return_expired().await;
        assert_eq!(metrics.store_calls.get() - before, calls, "{what}");
    }
    // Every call counted reached Redis (an exact window's settles are spawned).
    let sent = metrics.store_calls.get();
    crate::support::eventually(Duration::from_secs(5), "Redis to count every call", || {
        let mut conn = conn.clone();
        async move { (evalsha_calls(&mut conn).await == sent).then_some(()) }
    })
    .await;
}

/// A clock that moves `step` ms at every reading.
struct SteppingClock {
    at: std::sync::atomic::AtomicU64,
    step: std::sync::atomic::AtomicU64,
}

impl Clock for SteppingClock {
    fn now_ms(&self) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        self.at.fetch_add(self.step.load(SeqCst), SeqCst)
    }
}

/// A rejection cached on the gateway (and a lease's view) ends where the window ends, to
/// the millisecond: the gateway's clock is read once per call, and that reading is both
/// the script's `now` and the instant the reply's `reset_after_ms` is kept from. Read
/// twice, a clock that moved between the readings put the cached end a millisecond past
/// the window's, and the headers and `/v1/usage` (rounded up) named the second after
/// midnight (`calendar::tenants_reset_at_their_own_midnights_redis` failed so on a loaded
/// CI machine). Here the clock moves 1 ms at every reading while the day is spent, then
/// stands still for the read-back.
#[tokio::test(flavor = "multi_thread")]
async fn a_cached_rejection_ends_with_its_window() {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use throttle::limiter::{
        Admission, Algorithm, Check, Ident, OnFailure, Scope, ScopeLimits, Window, WindowLimit,
    };
    use throttle::store::redis::Target;
    use throttle::store::{LimitStore, RedisStore};

    let redis = RedisServer::start().await;
    // 100 ms into a minute; the minute ends at `end`.
    let (start, end) = (1_764_000_060_100, 1_764_000_120_000);
    let clock = Arc::new(SteppingClock {
        at: AtomicU64::new(start),
        step: AtomicU64::new(1),
    });
    for (n, admission) in [Admission::Auto, Admission::Exact].into_iter().enumerate() {
        let store = RedisStore::new(Target::Single(redis.url()), Duration::from_secs(2), "ends")
            .with_local_admission(1_000)
            .with_clock(clock.clone());
        let l = ScopeLimits {
            concurrent: None,
            ban: None,
            windows: vec![
                WindowLimit::with_algorithm(Window::Minute, 3, Algorithm::FixedWindow)
                    .with_admission(admission),
            ],
            on_failure: OnFailure::Closed,
            message: None,
            count_on: None,
        };
        let mut check = Check::new(1);
        check.push(Scope::Tenant, Ident::Name(format!("t{n}").into()), &l);
        clock.step.store(1, SeqCst);
        let mut refused = false;
        for _ in 0..10 {
            if !store.check(&check).await.unwrap().allowed {
                refused = true;
                break;
            }
        }
        assert!(refused, "{admission:?}: the minute of 3 was spent");
        clock.step.store(0, SeqCst);
        let now = clock.now_ms();
        let cached = store
            .decide_locally(&check)
            .unwrap_or_else(|| panic!("{admission:?}: the rejection is cached"));
        let d = cached.governing.unwrap().decision;
        assert!(!cached.allowed);
        assert_eq!(
            (now + d.reset_after_ms, now + d.retry_after_ms),
            (end, end),
            "{admission:?}: the cached rejection's end (now {now})"
        );
    }
}
