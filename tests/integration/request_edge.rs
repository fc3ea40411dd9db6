//! Edge hardening, third round: the request edge on the real binary (and the tower layer
//! in process, which shares it). Method tokens, method-override headers, HEAD on a GET
//! route, credential spellings, JWT claims that cannot be header values, access-log
//! bounds, `/v1/check` costs no window can hold, and HTTP/1.1 pipelining. Each test
//! failed before its fix.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use serde_json::{json, Value};
use throttle::admission::{Core, Runtime};
use throttle::clock::ManualClock;
use throttle::layer::ThrottleLayer;
use throttle::metrics::Metrics;
use throttle::store::MemoryStore;
use tower::{Layer, ServiceExt};

use crate::support::jwt::{hs256, now_secs};
use crate::support::{client, eventually, header, raw_exchange, raw_status, Gateway, Upstream};

/// The HS256 secret the gateway reads from `THROTTLE_TEST_JWT_SECRET`.
const SECRET: &str = "an-hs256-secret-of-at-least-32-bytes!";

/// Two routes on one echo upstream: `report`, GET-only and ten times the cost, and the
/// cheap catch-all; an ip limit whose remaining count shows which route was charged; two
/// keys, also readable from `?apikey=`.
const ROUTES: &str = r#"
[auth]
key_query = "apikey"

[limits.ip]
per_hour = 1000

[tiers.free]
key = { per_minute = 500 }

[[routes]]
name = "report"
path_prefix = "/v1/report"
methods = ["GET"]
cost = 10
upstreams = ["{upstream}"]
auth = "optional"

[[routes]]
name = "cheap"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "optional"

[[keys]]
id = "k1"
key = "key-one-secret"
tenant = "acme"
tier = "free"

[[keys]]
id = "k2"
key = "key-two-secret"
tenant = "acme"
tier = "free"
"#;

async fn start(up: &Upstream) -> Gateway {
    Gateway::start(ROUTES, Some(up)).await
}

/// A method token of `n` bytes.
fn method(n: usize) -> String {
    "M".repeat(n)
}

/// `x-ratelimit-remaining` of a response, as a number.
fn remaining(r: &reqwest::Response) -> u64 {
    header(r, "x-ratelimit-remaining").parse().unwrap()
}

/// A method over 32 bytes is 405 before routing (the upstream never sees it); 32 bytes
/// pass. The access log cuts every field at 2,048 bytes and escapes U+2028 and U+2029
/// (here from a key's tenant), so each line stays one short line.
#[tokio::test(flavor = "multi_thread")]
async fn long_methods_are_refused_and_log_lines_are_bounded() {
    let up = Upstream::start("edge").await;
    let body = format!(
        "{}\n[[keys]]\nid = \"k3\"\nkey = \"key-three-secret\"\ntier = \"free\"\n\
         tenant = \"eve\\u2028line\\u2029para{}\"\n",
        ROUTES.replace("{upstream}", &up.addr.to_string()),
        "t".repeat(3000)
    );
    let gw = Gateway::start_full(
        &["run"],
        &body,
        "grace_period_secs = 0\naccess_log = \"access.log\"",
    )
    .await;
    let raw = |m: &str| format!("{m} /v1/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    for (n, want) in [(4096, 405), (33, 405), (32, 200)] {
        let mut s = TcpStream::connect(gw.addr).unwrap();
        let (status, _, body) =
            crate::support::raw_exchange(&mut s, raw(&method(n)).as_bytes()).unwrap();
        assert_eq!(status, want, "a {n}-byte method");
        let body: Value = serde_json::from_slice(&body).unwrap();
        match want {
            405 => assert_eq!(body, json!({"error": "method_not_allowed"})),
            _ => assert_eq!(body["method"], method(n), "the upstream served it"),
        }
    }
    let r = client()
        .get(gw.url("/v1/x"))
        .header("x-api-key", "key-three-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let path = gw.config_path().parent().unwrap().join("access.log");
    let text = eventually(Duration::from_secs(10), "four log lines", || {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        async move { (text.lines().count() >= 4).then_some(text) }
    })
    .await;
    assert!(!text.contains(['\u{2028}', '\u{2029}']), "raw separators");
    for line in text.lines() {
        assert!(line.len() < 4096, "a {}-byte line", line.len());
        let v: Value = serde_json::from_str(line).unwrap();
        assert!(v["method"].as_str().unwrap().len() <= 2048);
    }
    let methods: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect();
    assert_eq!(methods[0]["method"], method(2048), "cut at 2,048 bytes");
    assert_eq!(methods[0]["status"], 405);
    let k3 = text
        .lines()
        .find(|l| l.contains(r#""key_id":"k3""#))
        .unwrap();
    assert!(k3.contains(r"eve\u2028line\u2029para"), "{k3}");
    let k3: Value = serde_json::from_str(k3).unwrap();
    assert_eq!(k3["tenant"].as_str().unwrap().len(), 2048, "the tenant cut");
}

/// A JWT whose key or tenant claim cannot be a header value (a newline, a control byte)
/// is 401 `invalid_token`, never a request without identity headers; a valid one reaches
/// the upstream as `X-Throttle-Key-Id` and `X-Throttle-Tenant`.
#[tokio::test(flavor = "multi_thread")]
async fn jwt_claims_that_cannot_be_header_values_are_invalid_tokens() {
    let up = Upstream::start("edge").await;
    let body = format!(
        "[auth.jwt]\nalgorithms = [\"HS256\"]\nhs256_secret_env = \"THROTTLE_TEST_JWT_SECRET\"\n\
         default_tier = \"free\"\ntenant_claim = \"org\"\n{}",
        ROUTES.replace("{upstream}", &up.addr.to_string())
    );
    let env = [("THROTTLE_TEST_JWT_SECRET", Some(SECRET))];
    let gw = Gateway::start_env(&["run"], &body, "grace_period_secs = 0", &env).await;
    let call = |claims: Value| {
        let mut c = json!({"exp": now_secs() + 600});
        c.as_object_mut()
            .unwrap()
            .extend(claims.as_object().unwrap().clone());
        let token = hs256(SECRET.as_bytes(), "k", &c);
        client()
            .get(gw.url("/v1/x"))
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    for bad in [
        json!({"sub": "alice\nx-admin: 1"}),
        json!({"sub": "alice\r"}),
        json!({"sub": "bob\u{7f}"}),
        json!({"sub": "carol", "org": "acme\nx: y"}),
        json!({"sub": "dave", "org": "\u{1b}[31m"}),
    ] {
        let r = call(bad.clone()).await.unwrap();
        assert_eq!(r.status(), 401, "{bad}");
        assert_eq!(
            header(&r, "www-authenticate"),
            r#"Bearer error="invalid_token""#
        );
        let body: Value = r.json().await.unwrap();
        assert_eq!(body, json!({"error": "invalid_token"}), "{bad}");
    }
    let r = call(json!({"sub": "alice", "org": "acme"})).await.unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["headers"]["x-throttle-key-id"], "alice");
    assert_eq!(body["headers"]["x-throttle-tenant"], "acme");
}

/// `X-HTTP-Method-Override`, `X-HTTP-Method` and `X-Method-Override` never reach the
/// upstream; a HEAD to a GET-only route is that route's (its cost of 10 is charged), not
/// the cheap catch-all's.
#[tokio::test(flavor = "multi_thread")]
async fn method_overrides_are_removed_and_head_keeps_its_get_route() {
    let up = Upstream::start("edge").await;
    let gw = start(&up).await;
    let r = client()
        .post(gw.url("/v1/items"))
        .header("x-http-method-override", "DELETE")
        .header("X-HTTP-Method", "DELETE")
        .header("x-method-override", "PUT")
        .header("x-kept", "yes")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    let headers = body["headers"].as_object().unwrap();
    for gone in [
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
    ] {
        assert!(!headers.contains_key(gone), "{gone} reached the upstream");
    }
    assert_eq!(headers["x-kept"], "yes");
    let c = client();
    let cheap = c.head(gw.url("/v1/other")).send().await.unwrap();
    let report = c.head(gw.url("/v1/report/q3")).send().await.unwrap();
    assert_eq!(
        (cheap.status().as_u16(), report.status().as_u16()),
        (200, 200)
    );
    assert_eq!(
        remaining(&cheap) - remaining(&report),
        10,
        "the HEAD paid the GET route's cost"
    );
    let get = c.get(gw.url("/v1/report/q3")).send().await.unwrap();
    assert_eq!(remaining(&report) - remaining(&get), 10);
    let post = c.post(gw.url("/v1/report/q3")).send().await.unwrap();
    assert_eq!(remaining(&get) - remaining(&post), 1, "POST falls through");
}

/// `Bearer` followed by a tab is a Bearer credential; `?APIKEY=` and `;apikey=` are the
/// key query. Beside another credential each is 400 `ambiguous_credentials`; alone each
/// identifies the caller, and the key parameter (any spelling) does not go upstream.
#[tokio::test(flavor = "multi_thread")]
async fn credential_spellings_are_credentials() {
    let up = Upstream::start("edge").await;
    let gw = start(&up).await;
    let c = client();
    let other = ("x-api-key", "key-one-secret");
    let ambiguous: [(&str, Option<&str>); 4] = [
        ("/v1/x", Some("Bearer\tkey-two-secret")),
        ("/v1/x?APIKEY=key-two-secret", None),
        ("/v1/x?a=1;apikey=key-two-secret", None),
        (
            "/v1/x?a=1;ApiKey=key-one-secret&apikey=key-one-secret",
            None,
        ),
    ];
    for (path, auth) in ambiguous {
        let mut req = c.get(gw.url(path)).header(other.0, other.1);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 400, "{path} {auth:?}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "ambiguous_credentials", "{path}");
    }
    let r = c
        .get(gw.url("/v1/x"))
        .header("authorization", "Bearer\tkey-two-secret")
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["headers"]["x-throttle-key-id"], "k2", "Bearer<TAB>");
    for (path, query) in [
        ("/v1/x?a=1;APIKEY=key-two-secret;b=2", "a=1;b=2"),
        ("/v1/x?ApiKey=key-two-secret&c=3", "c=3"),
    ] {
        let r = c.get(gw.url(path)).send().await.unwrap();
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["headers"]["x-throttle-key-id"], "k2", "{path}");
        assert_eq!(body["query"], query, "{path}: the key stays here");
    }
}

/// `/v1/check` with a cost above every window's capacity is 400 naming the cost and the
/// capacity (no wait would admit it), and spends nothing; a cost the window holds is
/// decided as usual.
#[tokio::test(flavor = "multi_thread")]
async fn check_with_a_cost_no_window_holds_is_400() {
    let up = Upstream::start("edge").await;
    let gw = start(&up).await;
    let c = client();
    let check = |cost: u32| {
        c.post(gw.admin_url("/v1/check"))
            .json(&json!({"ip": "198.51.100.7", "cost": cost}))
            .send()
    };
    let r = check(5000).await.unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body,
        json!({"error": "cost_exceeds_capacity", "cost": 5000, "capacity": 1000})
    );
    let r = check(1000).await.unwrap();
    assert_eq!(r.status(), 200, "the whole window was left");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["remaining"], 0);
    let r = check(1).await.unwrap();
    assert_eq!(r.status(), 429, "a cost the window holds waits");
}

/// One response (head and `Content-Length` body) read from `s`.
fn read_response(s: &mut TcpStream) -> Option<(u16, Vec<u8>)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap_or(0));
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    Some((status, body))
}

/// HTTP/1.1 pipelining: four requests in one write (a refused one and one with a body
/// among them) are all answered, in order, on the one connection.
#[tokio::test(flavor = "multi_thread")]
async fn pipelined_requests_are_answered_in_order() {
    let up = Upstream::start("edge").await;
    let gw = start(&up).await;
    let requests = format!(
        "GET /v1/a HTTP/1.1\r\nHost: h\r\n\r\n\
         {} /v1/b HTTP/1.1\r\nHost: h\r\n\r\n\
         POST /v1/c HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello\
         GET /v1/d HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        method(40)
    );
    let addr: SocketAddr = gw.addr;
    let answers = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(requests.as_bytes()).unwrap();
        (0..4)
            .map_while(|_| read_response(&mut s))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let got: Vec<(u16, Value)> = answers
        .into_iter()
        .map(|(status, body)| (status, serde_json::from_slice(&body).unwrap()))
        .collect();
    assert_eq!(got.len(), 4, "every request answered: {got:?}");
    let paths: Vec<(u16, &Value)> = got.iter().map(|(s, b)| (*s, &b["path"])).collect();
    assert_eq!(
        paths,
        [
            (200, &json!("/v1/a")),
            (405, &Value::Null),
            (200, &json!("/v1/c")),
            (200, &json!("/v1/d")),
        ]
    );
    assert_eq!(got[2].1["method"], "POST");
    // The connection still serves a request after a pipelined burst.
    assert_eq!(
        raw_status(gw.addr, b"GET /v1/e HTTP/1.1\r\nHost: h\r\n\r\n"),
        Some(200)
    );
}

// The tower layer, in process: the same edge.

/// A layer over `ROUTES` on a memory store and a manual clock.
fn layer() -> ThrottleLayer {
    let clock = ManualClock::at(1_764_000_000_000);
    let config = ROUTES.replace("{upstream}", "127.0.0.1:1");
    let config = throttle::config::parse("test.toml", &config).unwrap();
    let core = Core::with_clock(
        Runtime::from_config(config).unwrap(),
        Arc::new(MemoryStore::with_clock(clock.clone())),
        Arc::new(Metrics::new().unwrap()),
        Arc::new(clock),
    )
    .unwrap();
    ThrottleLayer::from_core(Arc::new(core))
}

/// The inner service: the method, URI and header names it was given, as JSON.
async fn echo(req: Request<Body>) -> Result<Response<Body>, std::convert::Infallible> {
    let names: Vec<&str> = req.headers().keys().map(|n| n.as_str()).collect();
    let body = json!({
        "method": req.method().as_str(),
        "uri": req.uri().to_string(),
        "headers": names,
        "key_id": req.headers().get("x-throttle-key-id").map(|v| v.to_str().unwrap()),
    });
    Ok(Response::new(Body::from(body.to_string())))
}

fn request(method: &str, uri: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "api.example.com")
        .extension(SocketAddr::from(([192, 0, 2, 9], 40_000)));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).unwrap()
}

async fn json_of(r: Response<Body>) -> Value {
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// The tower layer holds the same request edge: a long method is 405, override headers
/// do not reach the inner service, HEAD keeps its GET route, and the credential
/// spellings are credentials.
#[tokio::test]
async fn the_tower_layer_holds_the_same_request_edge() {
    let svc = layer().layer(tower::service_fn(echo));
    let call = |m: &str, uri: &str, h: &[(&str, &str)]| svc.clone().oneshot(request(m, uri, h));
    let r = call(&method(33), "/v1/x", &[]).await.unwrap();
    assert_eq!(r.status(), 405);
    let r = call(&method(32), "/v1/x", &[]).await.unwrap();
    assert_eq!(r.status(), 200);
    let overrides = [
        ("x-http-method-override", "DELETE"),
        ("x-http-method", "DELETE"),
        ("x-method-override", "PUT"),
    ];
    let body = json_of(call("POST", "/v1/x", &overrides).await.unwrap()).await;
    let names = body["headers"].as_array().unwrap();
    assert!(
        !names.iter().any(|n| n.as_str().unwrap().contains("method")),
        "{names:?}"
    );
    let left = |r: &Response<Body>| -> u64 {
        r.headers()["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let cheap = call("HEAD", "/v1/other", &[]).await.unwrap();
    let report = call("HEAD", "/v1/report", &[]).await.unwrap();
    assert_eq!(left(&cheap) - left(&report), 10, "HEAD on the GET route");
    let key = ("x-api-key", "key-one-secret");
    for (uri, auth) in [
        ("/v1/x", Some("Bearer\tkey-two-secret")),
        ("/v1/x?APIKEY=key-two-secret", None),
        ("/v1/x?a=1;apikey=key-two-secret", None),
    ] {
        let mut h = vec![key];
        h.extend(auth.map(|a| ("authorization", a)));
        let r = call("GET", uri, &h).await.unwrap();
        assert_eq!(r.status(), 400, "{uri} {auth:?}");
    }
    let r = call("GET", "/v1/x?a=1;APIKEY=key-two-secret", &[])
        .await
        .unwrap();
    let body = json_of(r).await;
    assert_eq!(
        (&body["key_id"], &body["uri"]),
        (&json!("k2"), &json!("/v1/x?a=1"))
    );
}

/// A request target that is not a path (`v1/x`, `?a=1`, `x:80/../v1/x`, a leading space)
/// is 400 `invalid_path`: it is never matched as `/` by the catch-all route while its raw
/// bytes go upstream, where a server resolving it would serve a route that needs a key.
#[tokio::test(flavor = "multi_thread")]
async fn targets_that_are_not_paths_are_refused() {
    let up = Upstream::start("edge").await;
    let gw = start(&up).await;
    for target in [
        "v1/report",
        "x:80/../v1/report",
        "public/../v1/report",
        "public/%2e%2e/v1/report",
        "%2fv1/report",
        "?a=1",
        " /v1/report",
        "*",
    ] {
        let request = format!("GET {target} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
        let mut stream = std::net::TcpStream::connect(gw.addr).unwrap();
        let answer = raw_exchange(&mut stream, request.as_bytes());
        let (status, body) = answer.map_or((0, Vec::new()), |(s, _, b)| (s, b));
        let body = String::from_utf8_lossy(&body);
        // The gateway's own 400, not an upstream's answer to the raw target.
        assert!(
            status == 0 || (status == 400 && body.contains("invalid_path")),
            "{target:?} answered {status} {body}"
        );
    }
    assert_eq!(
        raw_status(
            gw.addr,
            b"GET /v1/x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
        ),
        Some(200)
    );
    assert_eq!(
        raw_status(
            gw.addr,
            b"GET http://h/v1/x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
        ),
        Some(200)
    );
}
