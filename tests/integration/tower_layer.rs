//! `throttle::layer::ThrottleLayer`: the example binary (`examples/tower_axum.rs`) served
//! on loopback and spoken to over HTTP, and the layer in process (a manual clock, tower
//! services that wait on the test) for what HTTP from one machine cannot show.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use serde_json::Value;
use throttle::admission::{Core, Runtime};
use throttle::clock::ManualClock;
use throttle::layer::{Caller, ThrottleLayer};
use throttle::metrics::Metrics;
use throttle::store::MemoryStore;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tower::{Layer, ServiceExt};

use crate::support::header;

/// The example, built by the cargo running this test, listening on a free port; killed
/// on drop.
struct Example {
    addr: SocketAddr,
    _child: Child,
}

impl Example {
    async fn start() -> Self {
        let exe = build_example("tower_axum").await;
        let mut child = Command::new(exe)
            .env("TOWER_EXAMPLE_LISTEN", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the example printed nothing within 30 s")
            .unwrap()
            .expect("the example exited before listening");
        let addr = first
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .parse()
            .unwrap();
        Self {
            addr,
            _child: child,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// `cargo build --example NAME` (the profile of this test), returning the executable.
/// Cargo may wait for the build directory's lock: the patience is generous.
async fn build_example(name: &str) -> PathBuf {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--example", name, "--message-format=json"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    let out = tokio::time::timeout(Duration::from_secs(900), cmd.output())
        .await
        .expect("building the example took over 15 minutes")
        .unwrap();
    assert!(out.status.success(), "cargo build --example {name} failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo reported no executable for the example")
}

/// A client whose connections come from `local` (any 127.0.0.0/8 address is loopback).
fn client_from(local: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(local.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The example answers as the gateway does: X-RateLimit-* on passed responses, the third
/// request of a client the contract's 429 (whatever `X-Forwarded-For` an untrusted peer
/// sends), its own budget for every client address, 401 without a key on a route that
/// needs one, and the key's caller identity for the handler.
#[tokio::test(flavor = "multi_thread")]
async fn example_binary_speaks_the_contract() {
    let ex = Example::start().await;
    let c = client_from("127.0.0.1");
    for (i, spoof) in ["198.51.100.1", "198.51.100.2"].iter().enumerate() {
        let r = c
            .get(ex.url("/hello"))
            .header("x-forwarded-for", *spoof)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-limit"), "2");
        assert_eq!(header(&r, "x-ratelimit-remaining"), (1 - i).to_string());
        assert!(header(&r, "x-ratelimit-reset").parse::<u64>().unwrap() > 1_700_000_000);
        assert_eq!(header(&r, "retry-after"), "");
        assert_eq!(r.text().await.unwrap(), "hello, 127.0.0.1\n");
    }
    let r = c
        .get(ex.url("/hello"))
        .header("x-forwarded-for", "198.51.100.3")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "content-type"), "application/json");
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((1..=30).contains(&retry), "retry-after {retry}");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "rate_limit_exceeded");
    assert_eq!(body["scope"], "ip");
    assert_eq!(body["limit"], 2);
    assert_eq!(body["window"], "1m");
    assert!(body["retry_after"].as_f64().unwrap() > 0.0);
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains("2 requests per minute"));

    // Another client address has its own budget.
    let other = client_from("127.0.0.2");
    let r = other.get(ex.url("/hello")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "hello, 127.0.0.2\n");

    let third = client_from("127.0.0.3");
    let r = third.get(ex.url("/account")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.text().await.unwrap(), r#"{"error":"missing_api_key"}"#);
    let r = third
        .get(ex.url("/account"))
        .header("x-api-key", "wrong-key")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.text().await.unwrap(), r#"{"error":"invalid_api_key"}"#);
    let r = third
        .get(ex.url("/account"))
        .bearer_auth("demo-key-123")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "key key_demo of tenant acme\n");
}

const ROUTES: &str = r#"
[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["127.0.0.1:1"]
auth = "optional"

[tiers.free]
key = { per_minute = 100 }

[[keys]]
id = "key_demo"
key = "demo-key-123"
tenant = "acme"
tier = "free"
"#;

/// A layer on a memory store and a manual clock.
fn layer(limits: &str) -> ThrottleLayer {
    let clock = ManualClock::at(1_764_000_000_000);
    let config = throttle::config::parse("test.toml", &format!("{limits}\n{ROUTES}")).unwrap();
    let core = Core::with_clock(
        Runtime::from_config(config).unwrap(),
        Arc::new(MemoryStore::with_clock(clock.clone())),
        Arc::new(Metrics::new().unwrap()),
        Arc::new(clock),
    )
    .unwrap();
    ThrottleLayer::from_core(Arc::new(core))
}

/// An inner service answering with what it was given: the caller and the identity
/// headers, as JSON.
async fn echo(req: Request<Body>) -> Result<Response<Body>, Infallible> {
    let caller = req.extensions().get::<Caller>().cloned();
    let h = |n: &str| {
        req.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let body = serde_json::json!({
        "client_ip": caller.as_ref().map(|c| c.client_ip.to_string()),
        "route": caller.as_ref().and_then(|c| c.route.as_deref().map(str::to_string)),
        "key_id": caller.as_ref().and_then(|c| c.key_id.as_deref().map(str::to_string)),
        "tenant_header": h("x-throttle-tenant"),
        "key_id_header": h("x-throttle-key-id"),
        "path": req.uri().to_string(),
    });
    Ok(Response::new(Body::from(body.to_string())))
}

fn get(path: &str, peer: Option<[u8; 4]>, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::get(path).header("host", "api.example.com");
    if let Some(p) = peer {
        b = b.extension(SocketAddr::from((p, 40_000)));
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).unwrap()
}

async fn json(r: Response<Body>) -> Value {
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// Behind a trusted proxy the `X-Forwarded-For` client is counted, each with its own
/// budget; from an untrusted peer the header is ignored and the peer is the client.
#[tokio::test]
async fn client_address_is_resolved_as_the_proxy_does() {
    let svc = layer("[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]\n[limits.ip]\nper_minute = 1")
        .layer(tower::service_fn(echo));
    let proxy = Some([10, 0, 0, 1]);
    let xff = |ip| [("x-forwarded-for", ip)];
    let r = svc
        .clone()
        .oneshot(get("/a", proxy, &xff("203.0.113.1")))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json(r).await["client_ip"], "203.0.113.1");
    let r = svc
        .clone()
        .oneshot(get("/a", proxy, &xff("203.0.113.1")))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let r = svc
        .clone()
        .oneshot(get("/a", proxy, &xff("203.0.113.2")))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    let untrusted = Some([192, 0, 2, 1]);
    let r = svc
        .clone()
        .oneshot(get("/a", untrusted, &xff("203.0.113.3")))
        .await
        .unwrap();
    assert_eq!(json(r).await["client_ip"], "192.0.2.1");
    let r = svc
        .clone()
        .oneshot(get("/a", untrusted, &xff("203.0.113.4")))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// The inner service gets the key's identity headers and `Caller`, never a client's own
/// `X-Throttle-*`, and the normalized path; a request without a peer address is a 500.
#[tokio::test]
async fn inner_request_carries_identity_and_normalized_path() {
    let svc = layer("").layer(tower::service_fn(echo));
    let peer = Some([192, 0, 2, 1]);
    let spoof = ("x-throttle-tenant", "evil");
    let r = svc
        .clone()
        .oneshot(get(
            "/v1//%73earch?q=1",
            peer,
            &[("x-api-key", "demo-key-123"), spoof],
        ))
        .await
        .unwrap();
    let echo = json(r).await;
    assert_eq!(echo["tenant_header"], "acme");
    assert_eq!(echo["key_id_header"], "key_demo");
    assert_eq!(echo["key_id"], "key_demo");
    assert_eq!(echo["route"], "public");
    assert_eq!(echo["path"], "/v1/search?q=1");
    let r = svc
        .clone()
        .oneshot(get("/x", peer, &[spoof]))
        .await
        .unwrap();
    let echo = json(r).await;
    assert_eq!(echo["tenant_header"], Value::Null);
    assert_eq!(echo["key_id"], Value::Null);

    let r = svc
        .clone()
        .oneshot(get("/x/%2e%2e/y", peer, &[]))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json(r).await["error"], "invalid_path");
    let r = svc.oneshot(get("/x", None, &[])).await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(json(r).await["error"], "client_address_unavailable");
}

/// A route with `identity_headers = false` and `hide_client_headers = true` leaves out
/// the identity headers (still removing the client's) and the rate-limit headers in the
/// layer as in the proxy; the other route keeps both.
#[tokio::test]
async fn a_route_leaves_out_identity_and_rate_headers() {
    let quiet = "[[routes]]\nname = \"quiet\"\npath_prefix = \"/quiet\"\n\
                 upstreams = [\"127.0.0.1:1\"]\nauth = \"optional\"\n\
                 identity_headers = false\nhide_client_headers = true\n";
    let svc = layer(quiet).layer(tower::service_fn(echo));
    let peer = Some([192, 0, 2, 1]);
    let key = [("x-api-key", "demo-key-123"), ("x-throttle-tenant", "evil")];
    let r = svc
        .clone()
        .oneshot(get("/quiet/a", peer, &key))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("x-ratelimit-limit").is_none());
    let echo = json(r).await;
    assert_eq!(
        (&echo["route"], &echo["key_id"]),
        (&"quiet".into(), &"key_demo".into())
    );
    assert_eq!(
        (&echo["tenant_header"], &echo["key_id_header"]),
        (&Value::Null, &Value::Null)
    );
    let r = svc.oneshot(get("/a", peer, &key)).await.unwrap();
    assert_eq!(r.headers()["x-ratelimit-limit"], "100");
    assert_eq!(json(r).await["tenant_header"], "acme");
}

/// A concurrency slot is held while the inner service works and given back when its
/// response future resolves, and when the future is dropped unfinished.
#[tokio::test]
async fn admission_ends_with_the_inner_future() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel::<()>();
    let inner = {
        let gate = gate.clone();
        tower::service_fn(move |_req: Request<Body>| {
            let gate = gate.clone();
            let entered = entered_tx.clone();
            async move {
                let _ = entered.send(());
                gate.acquire().await.unwrap().forget();
                Ok::<_, Infallible>(Response::new(Body::from("done")))
            }
        })
    };
    let svc = layer("[limits.ip]\nper_minute = 100\nconcurrent = 1").layer(inner);
    let peer = Some([192, 0, 2, 1]);

    let first = tokio::spawn(svc.clone().oneshot(get("/a", peer, &[])));
    entered.recv().await.unwrap();
    let r = svc.clone().oneshot(get("/a", peer, &[])).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(json(r).await["window"], "concurrent");
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);

    // Dropped while the inner service works: the slot comes back all the same.
    let dropped = tokio::spawn(svc.clone().oneshot(get("/a", peer, &[])));
    entered.recv().await.unwrap();
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    gate.add_permits(1);
    let r = svc.oneshot(get("/a", peer, &[])).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

/// Reserve, then settle, as the proxy does: the inner service's `cost_header` settles the
/// reserved cost, and the response carries the settled `X-RateLimit-Remaining`.
#[tokio::test]
async fn the_inner_response_settles_the_cost() {
    let clock = ManualClock::at(1_764_000_000_000);
    let config = throttle::config::parse(
        "test.toml",
        r#"
[limits.ip]
per_minute = 100
algorithm = "fixed_window"

[[routes]]
name = "llm"
path_prefix = "/"
upstreams = ["127.0.0.1:1"]
auth = "none"
cost = 50
cost_header = "x-usage-tokens"
"#,
    )
    .unwrap();
    let core = Core::with_clock(
        Runtime::from_config(config).unwrap(),
        Arc::new(MemoryStore::with_clock(clock.clone())),
        Arc::new(Metrics::new().unwrap()),
        Arc::new(clock),
    )
    .unwrap();
    let inner = tower::service_fn(|_req: Request<Body>| async {
        let mut r = Response::new(Body::from("ok"));
        r.headers_mut()
            .insert("x-usage-tokens", http::HeaderValue::from_static("1"));
        Ok::<_, Infallible>(r)
    });
    let svc = ThrottleLayer::from_core(Arc::new(core)).layer(inner);
    let peer = Some([192, 0, 2, 9]);
    // Each request reserves 50 and is settled to 1: 99, 98, 97 left, never a 429.
    for left in ["99", "98", "97"] {
        let r = svc.clone().oneshot(get("/chat", peer, &[])).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["x-ratelimit-remaining"], left);
    }
}
