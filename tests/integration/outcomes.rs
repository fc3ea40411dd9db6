//! Counting by outcome (`count_on`): a failed-login limit
//! (`[routes.limits.ip] per_hour = 5, count_on = ["401", "403"]`; hours and days, so no
//! window rolls over during a test) admits as usual and
//! counts a request only when the upstream answers 401 or 403: the 6th failure is a 429,
//! twenty successes never block. Only that table is refunded (`[limits.ip]` counts every
//! request). A client that leaves before the answer counts. On the memory store, on
//! Redis with leases, across two gateways sharing Redis, and in the tower layer.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use serde_json::Value;
use throttle::admission::{Core, Runtime};
use throttle::clock::ManualClock;
use throttle::layer::ThrottleLayer;
use throttle::metrics::Metrics;
use throttle::store::MemoryStore;
use tower::{Layer, ServiceExt};

use crate::support::kinds::{kind_config_with, TABLE_KINDS};
use crate::support::redis::RedisServer;
use crate::support::{client, header, Gateway};

/// The failed-login route (5 failures a minute per address) under `[limits.ip]` of 30
/// for every request; `/other` has no limits of its own.
fn config(store: &str, upstream: &str) -> String {
    format!(
        r#"{store}
[limits.ip]
per_hour = 30

[[routes]]
name = "login"
path_prefix = "/login"
upstreams = ["{upstream}"]
auth = "none"

[routes.limits.ip]
per_hour = 5
count_on = ["401", "403"]

[[routes]]
name = "other"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#
    )
}

fn redis_store(redis: &RedisServer, extra: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"outcomes\"\ntimeout_ms = 2000\n{extra}\n",
        redis.url()
    )
}

/// A login upstream on loopback: `/login/<status>` answers that status;
/// `/login/continue` answers `100 Continue`, then 401; `/login/hold` announces itself
/// and never answers (the client leaves first); anything else is 200.
struct LoginUpstream {
    addr: std::net::SocketAddr,
    held: tokio::sync::mpsc::UnboundedReceiver<()>,
}

impl LoginUpstream {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, held) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let (mut buf, mut chunk) = (Vec::new(), [0u8; 4096]);
                    loop {
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_string();
                            buf.drain(..end + 4);
                            let path = head.split_whitespace().nth(1).unwrap_or("/");
                            if path == "/login/hold" {
                                let _ = tx.send(());
                                while s.read(&mut chunk).await.is_ok_and(|n| n > 0) {}
                                return;
                            }
                            if let Some(n) = path.strip_prefix("/bytes/") {
                                if !answer_bytes(&mut s, n, &tx).await {
                                    return;
                                }
                                continue;
                            }
                            let (interim, status) = match path {
                                "/login/continue" => ("HTTP/1.1 100 Continue\r\n\r\n", "401"),
                                p => ("", p.strip_prefix("/login/").unwrap_or("200")),
                            };
                            let answer = format!(
                                "{interim}HTTP/1.1 {status} X\r\ncontent-length: 2\r\n\r\nok"
                            );
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
        Self { addr, held }
    }
}

/// `/bytes/<n>`: 200 with `n` bytes of body; `/bytes/hold<n>`: the head of a far
/// longer body and `n` bytes of it, announced, then nothing until the gateway closes.
/// False when the connection is done.
async fn answer_bytes(
    s: &mut tokio::net::TcpStream,
    n: &str,
    tx: &tokio::sync::mpsc::UnboundedSender<()>,
) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (hold, n) = match n.strip_prefix("hold") {
        Some(n) => (true, n.parse::<usize>().unwrap()),
        None => (false, n.parse::<usize>().unwrap()),
    };
    let length = if hold { n * 100 } else { n };
    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {length}\r\n\r\n");
    let mut out = head.into_bytes();
    out.resize(out.len() + n, b'x');
    if s.write_all(&out).await.is_err() {
        return false;
    }
    if hold {
        let _ = tx.send(());
        let mut chunk = [0u8; 1024];
        while s.read(&mut chunk).await.is_ok_and(|n| n > 0) {}
        return false;
    }
    true
}

async fn get(gw: &Gateway, path: &str) -> reqwest::Response {
    client().get(gw.url(path)).send().await.unwrap()
}

/// A 429's scope, route and limit.
async fn refused_by(r: reqwest::Response) -> (String, Option<String>, u64) {
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    let s = |k: &str| body[k].as_str().map(str::to_string);
    (
        s("scope").unwrap_or_default(),
        s("route"),
        body["limit"].as_u64().unwrap_or(0),
    )
}

fn login_table() -> (String, Option<String>, u64) {
    ("ip".into(), Some("login".into()), 5)
}

/// The contract on one or two gateways (requests alternate between them): twenty
/// successes never block, five failures do, a 403 counts as a failure, the 6th is a 429
/// of the login table; `[limits.ip]` counted all 25, so 5 more elsewhere fill it. With
/// `exact` headers (no leases: a lease's tokens show as spent), every success shows the
/// failed-login table's 5 left and every failure one less.
async fn failed_logins_block(gws: &[&Gateway], exact: bool) {
    let gw = |i: usize| gws[i % gws.len()];
    for i in 0..20 {
        let r = get(gw(i), "/login/200").await;
        assert_eq!(r.status(), 200, "success {i}");
        if exact {
            assert_eq!(header(&r, "x-ratelimit-remaining"), "5", "success {i}");
        }
    }
    for (i, status) in [401, 401, 403, 401, 401].into_iter().enumerate() {
        let r = get(gw(i), &format!("/login/{status}")).await;
        assert_eq!(r.status(), status, "failure {i}");
        if exact {
            let left = (4 - i).to_string();
            assert_eq!(header(&r, "x-ratelimit-remaining"), left, "failure {i}");
        }
    }
    for i in 0..2 {
        let r = get(gw(i), "/login/401").await;
        assert_eq!(refused_by(r).await, login_table(), "the 6th failure");
        // A success is refused too now: the table is full.
        let r = get(gw(i), "/login/200").await;
        assert_eq!(refused_by(r).await, login_table());
    }
    // [limits.ip] counted 25 of 30: five more pass, the next is its 429.
    for i in 0..5 {
        assert_eq!(get(gw(i), "/other").await.status(), 200, "other {i}");
    }
    let r = get(gw(0), "/other").await;
    assert_eq!(refused_by(r).await, ("ip".into(), None, 30));
}

/// A client that leaves once the upstream has its login, before the answer: counted.
/// After four failures and one such abandoned login, the next failure is a 429.
async fn leaving_counts(gw: &Gateway, up: &mut LoginUpstream) {
    use tokio::io::AsyncWriteExt;
    for i in 0..4 {
        assert_eq!(get(gw, "/login/401").await.status(), 401, "failure {i}");
    }
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"GET /login/hold HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    up.held.recv().await.unwrap();
    drop(s);
    let r = get(gw, "/login/401").await;
    assert_eq!(
        refused_by(r).await,
        login_table(),
        "the abandoned login counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_counts_failed_logins_only() {
    let up = LoginUpstream::start().await;
    let gw = Gateway::start(&config("", &up.addr.to_string()), None).await;
    failed_logins_block(&[&gw], true).await;
}

/// An interim `100 Continue` is no outcome: the 401 after it counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interim_answer_is_no_outcome() {
    let up = LoginUpstream::start().await;
    let gw = Gateway::start(&config("", &up.addr.to_string()), None).await;
    for i in 0..5 {
        assert_eq!(
            get(&gw, "/login/continue").await.status(),
            401,
            "failure {i}"
        );
    }
    let r = get(&gw, "/login/continue").await;
    assert_eq!(refused_by(r).await, login_table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_counts_a_client_that_left() {
    let mut up = LoginUpstream::start().await;
    let gw = Gateway::start(&config("", &up.addr.to_string()), None).await;
    leaving_counts(&gw, &mut up).await;
}

/// Redis with leases (`lease_ms`): the refunds of successes go back whether the window
/// was paid from a lease or in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_with_leases_counts_failed_logins_only() {
    let redis = RedisServer::start().await;
    let mut up = LoginUpstream::start().await;
    for algorithm in ["sliding_window", "fixed_window"] {
        let store = redis_store(&redis, "lease_ms = 60000");
        let body = config(&store, &up.addr.to_string())
            .replace(
                "per_hour = 5\n",
                &format!("per_hour = 5\nalgorithm = \"{algorithm}\"\n"),
            )
            .replace(
                "key_prefix = \"outcomes\"",
                &format!("key_prefix = \"outcomes-{algorithm}\""),
            );
        let gw = Gateway::start(&body, None).await;
        failed_logins_block(&[&gw], false).await;
    }
    let body = config(
        &redis_store(&redis, "lease_ms = 60000"),
        &up.addr.to_string(),
    )
    .replace(
        "key_prefix = \"outcomes\"",
        "key_prefix = \"outcomes-left\"",
    );
    let gw = Gateway::start(&body, None).await;
    leaving_counts(&gw, &mut up).await;
}

/// Two gateways sharing Redis (exact admission, so neither holds tokens the other
/// needs): one failed-login budget across both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_the_failed_login_budget() {
    let redis = RedisServer::start().await;
    let up = LoginUpstream::start().await;
    let body = config(&redis_store(&redis, ""), &up.addr.to_string())
        .replace("per_hour = 5\n", "per_hour = 5\nadmission = \"exact\"\n")
        .replace("per_hour = 30\n", "per_hour = 30\nadmission = \"exact\"\n");
    let a = Gateway::start(&body, None).await;
    let b = Gateway::start(&body, None).await;
    failed_logins_block(&[&a, &b], true).await;
}

/// The tower layer: an inner service answering the status the path names; a response
/// future dropped before it resolves (the client left) counts.
#[tokio::test]
async fn tower_layer_counts_failed_logins_only() {
    let clock = ManualClock::at(1_764_000_000_000);
    let body = config("", "127.0.0.1:1");
    let config = throttle::config::parse("test.toml", &body).unwrap();
    let core = Core::with_clock(
        Runtime::from_config(config).unwrap(),
        Arc::new(MemoryStore::with_clock(clock.clone())),
        Arc::new(Metrics::new().unwrap()),
        Arc::new(clock),
    )
    .unwrap();
    let (called, mut calls) = tokio::sync::mpsc::unbounded_channel::<()>();
    let inner = tower::service_fn(move |req: Request<Body>| {
        let called = called.clone();
        async move {
            let tail = req.uri().path().strip_prefix("/login/").unwrap_or("200");
            if tail == "hold" {
                let _ = called.send(());
                std::future::pending::<()>().await;
            }
            let mut r = Response::new(Body::from("ok"));
            *r.status_mut() = StatusCode::from_u16(tail.parse().unwrap()).unwrap();
            Ok::<_, Infallible>(r)
        }
    });
    let svc = ThrottleLayer::from_core(Arc::new(core)).layer(inner);
    let send = |path: &str| {
        let req = Request::get(path)
            .header("host", "api.example.com")
            .extension(std::net::SocketAddr::from(([192, 0, 2, 7], 40_000)))
            .body(Body::empty())
            .unwrap();
        svc.clone().oneshot(req)
    };
    for i in 0..20 {
        let r = send("/login/200").await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "success {i}");
        assert_eq!(r.headers()["x-ratelimit-remaining"], "5");
    }
    for i in 0..4 {
        let r = send("/login/401").await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "failure {i}");
    }
    // The fifth: the client leaves once the inner service has the request.
    let pending = tokio::spawn(send("/login/hold"));
    calls.recv().await.unwrap();
    pending.abort();
    let _ = pending.await;
    let r = send("/login/401").await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the abandoned login counted"
    );
}

/// A bandwidth quota: `[routes.limits.ip] per_day = {limit}` on a route that reserves
/// `cost` and settles to the response bytes (`cost_from`), in `unit` bytes.
fn bandwidth(store: &str, upstream: &str, (limit, cost, extra): (u32, u32, &str)) -> String {
    format!(
        r#"{store}
[[routes]]
name = "files"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
cost = {cost}
cost_from = "response_bytes"
{extra}

[routes.limits.ip]
per_day = {limit}
algorithm = "fixed_window"
"#
    )
}

/// Responses of known sizes drain a 10000-byte quota exactly: each response's remaining
/// is the quota less the bytes sent before and its own reserve (1000).
async fn drains_exactly(gw: &Gateway, settled: impl AsyncFn(u64)) {
    let mut used = 0;
    for (n, remaining) in [(300, "9000"), (500, "8700"), (8200, "8200"), (10, "0")] {
        let r = get(gw, &format!("/bytes/{n}")).await;
        assert_eq!(r.status(), 200, "{n}");
        assert_eq!(header(&r, "x-ratelimit-remaining"), remaining, "{n}");
        assert_eq!(r.bytes().await.unwrap().len(), n);
        used += n as u64;
        settled(used).await;
    }
    // 9010 used: a reserve of 1000 no longer fits.
    assert_eq!(get(gw, "/bytes/1").await.status(), 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_bandwidth_quota_drains_by_response_bytes() {
    let up = LoginUpstream::start().await;
    let body = bandwidth("", &up.addr.to_string(), (10_000, 1000, ""));
    let gw = Gateway::start(&body, None).await;
    drains_exactly(&gw, async |_| {}).await;
}

/// Redis (exact admission): each settlement is in Redis before the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_bandwidth_quota_drains_by_response_bytes() {
    let redis = RedisServer::start().await;
    let up = LoginUpstream::start().await;
    let store = redis_store(&redis, "").replace("\"outcomes\"", "\"bytes\"");
    let body = bandwidth(&store, &up.addr.to_string(), (10_000, 1000, "")).replace(
        "fixed_window\"\n",
        "fixed_window\"\nadmission = \"exact\"\n",
    );
    let gw = Gateway::start(&body, None).await;
    let conn = redis.client().await;
    drains_exactly(&gw, async |used| {
        let want = format!(":{used}");
        crate::support::eventually(Duration::from_secs(5), "Redis to hold the bytes", || {
            let mut conn = conn.clone();
            let want = want.clone();
            async move {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg("*")
                    .query_async(&mut conn)
                    .await
                    .ok()?;
                for k in keys {
                    // Other keys (other types) may be there: only a string can match.
                    let v: Option<String> = redis::cmd("GET")
                        .arg(&k)
                        .query_async(&mut conn)
                        .await
                        .ok()
                        .flatten();
                    if v.is_some_and(|v| v.ends_with(&want)) {
                        return Some(());
                    }
                }
                None
            }
        })
        .await;
    })
    .await;
}

/// `cost_unit_bytes` rounds up; `max_cost` bounds a settlement; `request_bytes` counts
/// the request body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_in_units_bounded_by_max_cost() {
    let up = LoginUpstream::start().await;
    let units = "cost_unit_bytes = 100\nmax_cost = 50";
    let gw = Gateway::start(&bandwidth("", &up.addr.to_string(), (100, 10, units)), None).await;
    // 250 bytes: 3 units; 1 byte: 1; 100000 bytes: 1000 units, bounded by 50.
    for (n, remaining) in [(250, "90"), (1, "87"), (100_000, "86"), (0, "36")] {
        let r = get(&gw, &format!("/bytes/{n}")).await;
        assert_eq!(header(&r, "x-ratelimit-remaining"), remaining, "{n}");
        assert_eq!(r.bytes().await.unwrap().len(), n);
    }
    let body = bandwidth("", &up.addr.to_string(), (10_000, 1000, ""))
        .replace("response_bytes", "request_bytes");
    let gw = Gateway::start(&body, None).await;
    for (n, remaining) in [(300, "9000"), (4000, "8700"), (0, "4700")] {
        let r = client()
            .post(gw.url("/bytes/5"))
            .body(vec![b'y'; n])
            .send()
            .await
            .unwrap();
        assert_eq!(header(&r, "x-ratelimit-remaining"), remaining, "{n}");
        assert_eq!(r.bytes().await.unwrap().len(), 5);
    }
}

/// A client that leaves in the middle of a response pays the bytes it was sent: 1000
/// of a reserve of 2000 (1000 refunded), so the next request sees 10000 - 1000 - 2000.
/// (Mutation-checked: settling at the reserve instead shows 6000.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_pays_what_was_sent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut up = LoginUpstream::start().await;
    // The gateway learns the client left when the held upstream's read times out.
    let body = bandwidth(
        "",
        &up.addr.to_string(),
        (10_000, 2000, "read_timeout_ms = 1000"),
    );
    let gw = Gateway::start(&body, None).await;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"GET /bytes/hold1000 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    up.held.recv().await.unwrap();
    // Read until the 1000 bytes of body have arrived, then leave.
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the gateway closed first");
        got.extend_from_slice(&chunk[..n]);
        let body = got
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|h| got.len() - h - 4);
        if body.is_some_and(|b| b >= 1000) {
            break;
        }
    }
    drop(s);
    crate::support::eventually(Duration::from_secs(10), "the abort settled", || async {
        let m = gw.metrics().await;
        m.lines()
            .any(|l| l == "throttle_cost_settled_total{direction=\"refund\"} 1000")
            .then_some(())
    })
    .await;
    let r = get(&gw, "/bytes/0").await;
    assert_eq!(header(&r, "x-ratelimit-remaining"), "7000");
}

/// The tower layer does not read the response body: a route with `cost_from` is refused
/// when the layer is built, naming the route.
#[test]
fn the_tower_layer_refuses_cost_from() {
    let body = bandwidth("", "127.0.0.1:1", (10_000, 1000, ""));
    let config = throttle::config::parse("test.toml", &body).unwrap();
    let Err(e) = ThrottleLayer::new(config) else {
        panic!("a layer with cost_from was built")
    };
    assert!(
        matches!(e, throttle::layer::LayerError::Unsupported(_)),
        "{e}"
    );
    assert!(e.to_string().contains("route \"files\": cost_from"), "{e}");
}

// === count_on in every table kind, on every store ===

/// A gateway config with the `count_on` table of `kind` (a `TABLE_KINDS` entry's TOML):
/// one route `/login` (key optional), a key `k1` of tenant `acme` in tier `t`, a custom
/// scope `user` from `X-User`.
fn kind_config(store: &str, upstream: &str, kind: &str) -> String {
    let table = "per_hour = 3\ncount_on = [\"401\"]";
    kind_config_with(store, upstream, kind, table, "")
}

/// Six successes never count, three failures do, the next request (a failure or a
/// success) is that table's 429.
async fn kind_counts_failures_only(gw: &Gateway, label: &str, scope: &str, route: Option<&str>) {
    let get = |path: &str| {
        client()
            .get(gw.url(path))
            .header("x-api-key", "key-one-secret")
            .header("x-user", "u1")
            .send()
    };
    for i in 0..6 {
        assert_eq!(
            get("/login/200").await.unwrap().status(),
            200,
            "{label}: success {i}"
        );
    }
    for i in 0..3 {
        assert_eq!(
            get("/login/401").await.unwrap().status(),
            401,
            "{label}: failure {i}"
        );
    }
    for path in ["/login/401", "/login/200"] {
        let r = get(path).await.unwrap();
        let got = refused_by(r).await;
        let want = (scope.to_string(), route.map(str::to_string), 3);
        assert_eq!(got, want, "{label}: {path} after three failures");
    }
}

/// `count_on` works in every kind of table it can appear in (global, custom, tier key
/// and tenant, and each of a route's tables), on the memory store and on Redis with
/// leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_on_works_in_every_table_kind_on_every_store() {
    let redis = RedisServer::start().await;
    let up = LoginUpstream::start().await;
    for (n, (label, kind, scope, route)) in TABLE_KINDS.into_iter().enumerate() {
        let redis = redis_store(&redis, "lease_ms = 60000").replace(
            "key_prefix = \"outcomes\"",
            &format!("key_prefix = \"kinds{n}\""),
        );
        for (store, body) in [("memory", ""), ("redis", redis.as_str())] {
            let gw = Gateway::start(&kind_config(body, &up.addr.to_string(), kind), None).await;
            kind_counts_failures_only(&gw, &format!("{label} on {store}"), scope, route).await;
        }
    }
}

/// The decision API sees no outcome: an admitted `POST /v1/check` counts in a
/// `count_on` table (three checks fill a table of three; the fourth is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_counts_in_a_count_on_table() {
    let up = LoginUpstream::start().await;
    let body = kind_config("", &up.addr.to_string(), TABLE_KINDS[0].1);
    let gw = Gateway::start(&body, None).await;
    let check = || {
        client()
            .post(gw.admin_url("/v1/check"))
            .json(&serde_json::json!({"ip": "198.51.100.9"}))
            .send()
    };
    for i in 0..3 {
        assert_eq!(check().await.unwrap().status(), 200, "check {i}");
    }
    assert_eq!(check().await.unwrap().status(), 429);
}

/// `cost_from` settles every kind of table the request was admitted on: a 10000-byte
/// daily quota in each table kind, 3000-byte responses reserving 1000: three pass and
/// settle (9000), the fourth fits its reserve and settles past the quota (12000), and
/// from then on the table refuses, on the memory store at once, on Redis with leases
/// as soon as the settle is in (a settle is a script call after the response).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_from_settles_every_table_kind_on_every_store() {
    let redis = RedisServer::start().await;
    let up = LoginUpstream::start().await;
    let table = "per_day = 10000\nalgorithm = \"fixed_window\"";
    let route = "cost = 1000\ncost_from = \"response_bytes\"";
    for (n, (label, kind, scope, route_name)) in TABLE_KINDS.into_iter().enumerate() {
        let redis = redis_store(&redis, "lease_ms = 60000").replace(
            "key_prefix = \"outcomes\"",
            &format!("key_prefix = \"bytekinds{n}\""),
        );
        for (store, body) in [("memory", ""), ("redis", redis.as_str())] {
            let label = format!("{label} on {store}");
            let body = kind_config_with(body, &up.addr.to_string(), kind, table, route);
            let gw = Gateway::start(&body, None).await;
            let get = |path: String| {
                client()
                    .get(gw.url(&path))
                    .header("x-api-key", "key-one-secret")
                    .header("x-user", "u1")
                    .send()
            };
            for i in 0..4 {
                let r = get("/bytes/3000".into()).await.unwrap();
                assert_eq!(r.status(), 200, "{label}: response {i}");
                assert_eq!(r.bytes().await.unwrap().len(), 3000, "{label}");
            }
            let extra = std::sync::atomic::AtomicU32::new(0);
            let refused = crate::support::eventually(
                Duration::from_secs(5),
                "the settled table to refuse",
                || {
                    let r = get("/bytes/1".into());
                    let extra = &extra;
                    async move {
                        let r = r.await.ok()?;
                        if r.status() == 429 {
                            return Some(r);
                        }
                        extra.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        None
                    }
                },
            )
            .await;
            let want = (scope.to_string(), route_name.map(str::to_string), 10_000);
            assert_eq!(refused_by(refused).await, want, "{label}");
            let extra = extra.into_inner();
            eprintln!("{label}: {extra} admitted after the quota was spent");
            if store == "memory" {
                assert_eq!(extra, 0, "{label}: admitted after the quota was spent");
            }
        }
    }
}
