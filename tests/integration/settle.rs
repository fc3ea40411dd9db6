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

/// An upstream that announces every request head it reads and answers `/chat/hold`
/// never (the client leaves first) and anything else at once with 200 and
/// `X-Usage-Tokens: 100`.
struct HoldingUpstream {
    addr: std::net::SocketAddr,
    heads: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl HoldingUpstream {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, heads) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_string();
                            buf.drain(..end + 4);
                            let _ = tx.send(head.clone());
                            if head.starts_with("GET /chat/hold") {
                                // Held until the gateway closes the connection.
                                while s.read(&mut chunk).await.is_ok_and(|n| n > 0) {}
                                return;
                            }
                            let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-usage-tokens: 100\r\n\r\nok";
                            if s.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        match s.read(&mut chunk).await {
                            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    }
                });
            }
        });
        Self { addr, heads }
    }
}

/// cost 100 reserved, `max_cost` 900, 2000 a day.
fn leaving_config(store: &str, upstream: std::net::SocketAddr) -> String {
    config(
        store,
        r#"per_day = 2000, algorithm = "fixed_window", admission = "exact""#,
    )
    .replace("{upstream}", &upstream.to_string())
    .replace("cost = 10\n", "cost = 100\nmax_cost = 900\n")
}

/// A client that sends a request and goes away once the upstream has it, before the
/// upstream's usage header.
async fn leave_early(gw: &Gateway, up: &mut HoldingUpstream) {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let req = format!("GET /chat/hold HTTP/1.1\r\nhost: x\r\nx-api-key: {KEY}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let head = up.heads.recv().await.unwrap();
    assert!(head.starts_with("GET /chat/hold"), "{head}");
    drop(s);
}

async fn remaining_after_one(gw: &Gateway) -> String {
    let r = client()
        .get(gw.url("/chat/next"))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    header(&r, "x-ratelimit-remaining")
}

/// Memory store: a client gone before the usage header is settled at `max_cost` (900),
/// not the reserve (100): the next request (100) leaves 2000 - 900 - 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_client_leaving_early_pays_max_cost() {
    let mut up = HoldingUpstream::start().await;
    let gw = Gateway::start(&leaving_config("", up.addr), None).await;
    leave_early(&gw, &mut up).await;
    eventually(
        Duration::from_secs(5),
        "the abort settled at 900",
        || async { (settled_metrics(&gw).await == (800, 0)).then_some(()) },
    )
    .await;
    assert_eq!(remaining_after_one(&gw).await, "1000");
}

/// Redis: the same, seen in the key's window in Redis and in the next response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_client_leaving_early_pays_max_cost() {
    let redis = RedisServer::start().await;
    let mut up = HoldingUpstream::start().await;
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"leave\"\ntimeout_ms = 500\n",
        redis.url()
    );
    let gw = Gateway::start(&leaving_config(&store, up.addr), None).await;
    leave_early(&gw, &mut up).await;
    let conn = redis.client().await;
    eventually(Duration::from_secs(5), "Redis to hold 900", || async {
        let v: Option<String> = redis::cmd("GET")
            .arg("leave:{key:k1}:1d")
            .query_async(&mut conn.clone())
            .await
            .ok()?;
        v.filter(|v| v.ends_with(":900")).map(|_| ())
    })
    .await;
    assert_eq!(remaining_after_one(&gw).await, "1000");
}

/// `max_cost` bounds a reported usage (counted in `throttle_cost_clamped_total`); of
/// repeated usage headers the largest counts; a malformed one among them settles nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_cost_clamps_and_repeated_headers_settle_the_largest() {
    let up = Upstream::start("up").await;
    let body = config("", r#"per_day = 10000, algorithm = "fixed_window""#)
        .replace("cost = 10\n", "cost = 10\nmax_cost = 900\n");
    let gw = Gateway::start(&body, Some(&up)).await;
    for (query, remaining) in [
        ("usage=5000", "9100"),          // clamped: 900
        ("usage=900&usage=3", "8200"),   // the largest: 900
        ("usage=3&usage=900", "7300"),   // in any order
        ("usage=900&usage=abc", "7290"), // malformed among them: the reserve (10) stays
        ("usage=7", "7283"),
    ] {
        let r = get(&gw, query).await;
        assert_eq!(r.status(), 200, "{query}");
        assert_eq!(header(&r, "x-ratelimit-remaining"), remaining, "{query}");
    }
    let m = gw.metrics().await;
    assert!(
        m.lines().any(|l| l == "throttle_cost_clamped_total 1"),
        "one clamped settlement"
    );
}
