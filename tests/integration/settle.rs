//! Reserve, then settle (`cost_header`): a request reserves the route's `cost`; the
//! upstream's `X-Usage-Tokens` (the demo upstream's `?usage=N`) settles it: a refund or a
//! debt on every charged window, on the memory store and on Redis, with exact numbers in
//! `X-RateLimit-Remaining` and in the store.

use std::time::Duration;

use serde_json::Value;

use crate::support::redis::RedisServer;
use crate::support::{client, eventually, header, Gateway, Upstream};

const KEY: &str = "settle-key-secret";

fn config(store: &str, window: &str) -> String {
    format!(
        r#"{store}
[tiers.t]
key = {{ {window} }}

[[routes]]
name = "llm"
path_prefix = "/"
upstreams = ["{{upstream}}"]
cost = 10
cost_header = "X-Usage-Tokens"

[[keys]]
id = "k1"
key = "{KEY}"
tenant = "acme"
tier = "t"
"#
    )
}

async fn get(gw: &Gateway, query: &str) -> reqwest::Response {
    client()
        .get(gw.url(&format!("/chat?{query}")))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap()
}

/// The steps every store goes through: (usage reported, remaining after settling).
/// 100 per window, cost 10 reserved each time.
const STEPS: [(&str, &str); 4] = [
    ("usage=3", "97"),  // reserved 10, refunded 7: 3 used
    ("usage=10", "87"), // exact: nothing to settle
    ("usage=50", "37"), // reserved 10, charged 40 more: 63 used
    ("usage=60", "0"),  // reserved 10, charged 50 more: 123 used, a debt of 23
];

async fn walk(gw: &Gateway, after_each: impl AsyncFn(u64)) {
    let mut used = 0;
    for ((query, remaining), add) in STEPS.into_iter().zip([3, 10, 50, 60]) {
        let r = get(gw, query).await;
        assert_eq!(r.status(), 200, "{query}");
        assert_eq!(header(&r, "x-ratelimit-remaining"), remaining, "{query}");
        assert_eq!(
            header(&r, "x-usage-tokens"),
            query["usage=".len()..],
            "the header reaches the client"
        );
        used += add;
        after_each(used).await;
    }
    // In debt: 123 + 10 > 100, whatever the next request would use.
    let r = get(gw, "usage=1").await;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["current"], 133);
}

async fn settled_metrics(gw: &Gateway) -> (u64, u64) {
    let m = gw.metrics().await;
    let value = |dir: &str| {
        let series = format!("throttle_cost_settled_total{{direction=\"{dir}\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(u64::MAX)
    };
    (value("charge"), value("refund"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_refunds_and_charges_debt() {
    let up = Upstream::start("up").await;
    for window in [
        r#"per_day = 100, algorithm = "fixed_window""#,
        r#"per_hour = 100, algorithm = "sliding_log""#,
    ] {
        let gw = Gateway::start(&config("", window), Some(&up)).await;
        walk(&gw, async |_| {}).await;
        assert_eq!(settled_metrics(&gw).await, (90, 7), "{window}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_settles_without_a_valid_header() {
    let up = Upstream::start("up").await;
    let gw = Gateway::start(
        &config("", r#"per_day = 100, algorithm = "fixed_window""#),
        Some(&up),
    )
    .await;
    for (query, remaining) in [
        ("", "90"),
        ("usage=abc", "80"),
        ("usage=-5", "70"),
        ("usage=1e3", "60"),
    ] {
        let r = get(&gw, query).await;
        assert_eq!(header(&r, "x-ratelimit-remaining"), remaining, "{query:?}");
    }
    assert_eq!(settled_metrics(&gw).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_refunds_and_charges_debt() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("up").await;
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"settle\"\ntimeout_ms = 500\n",
        redis.url()
    );
    let gw = Gateway::start(
        &config(
            &store,
            r#"per_day = 100, algorithm = "fixed_window", admission = "exact""#,
        ),
        Some(&up),
    )
    .await;
    let conn = redis.client().await;
    walk(&gw, async |used| {
        // The settlement is one script call after the response headers: Redis holds the
        // true count soon after.
        let conn = &mut conn.clone();
        eventually(
            Duration::from_secs(5),
            "Redis to hold the settled count",
            || async {
                let v: Option<String> = redis::cmd("GET")
                    .arg("settle:{key:k1}:1d")
                    .query_async(&mut conn.clone())
                    .await
                    .ok()?;
                v.filter(|v| v.ends_with(&format!(":{used}"))).map(|_| ())
            },
        )
        .await;
    })
    .await;
    assert_eq!(settled_metrics(&gw).await, (90, 7));
}
