//! Per-route limits and custom scopes on the real binary: a route's table counts only its
//! own requests, custom scopes read each kind of attribute, absent values never share a
//! bucket, and a route window is exact across a fleet on one Redis.

use std::sync::Arc;

use serde_json::Value;

use crate::support::redis::RedisServer;
use crate::support::{client, header, Gateway, Upstream, ADMIN_TOKEN};

/// A login route limited to 3 a minute per address, beside an API route under the global
/// `[limits.ip]` alone.
const ROUTED: &str = r#"
[limits.ip]
per_minute = 100

[[routes]]
name = "login"
path_prefix = "/v1/login"
methods = ["POST"]
upstreams = ["{upstream}"]
auth = "none"
limits = { ip = { per_minute = 3 } }

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["{upstream}"]
auth = "none"
"#;

/// The login route's window rejects its 4th request naming the route (body and IETF
/// name); the API route's requests meet only `[limits.ip]`, which counted the 3 admitted
/// logins and not the rejected one.
#[tokio::test(flavor = "multi_thread")]
async fn a_route_limit_counts_only_its_route() {
    let up = Upstream::start("u").await;
    let body = ROUTED.replace("{upstream}", &up.addr.to_string());
    let gw = Gateway::start_full(
        &["run"],
        &body,
        "grace_period_secs = 0\nrate_limit_headers = \"both\"",
    )
    .await;
    let c = client();
    for i in 0..3 {
        let r = c.post(gw.url("/v1/login")).send().await.unwrap();
        assert_eq!(r.status(), 200, "login {i}");
    }
    let r = c.post(gw.url("/v1/login")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    let policy = header(&r, "ratelimit-policy");
    assert!(policy.contains("\"login.ip-1m\";q=3"), "{policy}");
    assert!(policy.contains("\"ip-1m\";q=100"), "{policy}");
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (
            v["scope"].as_str(),
            v["route"].as_str(),
            v["limit"].as_u64()
        ),
        (Some("ip"), Some("login"), Some(3)),
        "{v}"
    );
    // The API route: its own requests are not limited by the login window.
    for i in 0..5 {
        let r = c.get(gw.url("/v1/items")).send().await.unwrap();
        assert_eq!(r.status(), 200, "api {i}");
        if i == 0 {
            // 3 admitted logins + this one in the shared [limits.ip] window.
            assert_eq!(header(&r, "x-ratelimit-remaining"), "96");
            assert_eq!(header(&r, "x-ratelimit-limit"), "100");
        }
    }
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains(r#"throttle_decisions_total{decision="rejected",scope="login.ip"} 1"#),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("decisions"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Custom scopes of every `from` kind but `jwt`, with limits of 2 a minute each.
const CUSTOM: &str = r#"
[scopes.user]
from = "header:X-User"

[scopes.org]
from = "query:org"

[scopes.session]
from = "cookie:session"

[scopes.project]
from = "path:2"

[scopes.tenant_id]
from = "header:X-Tenant-Id"
missing = "reject"

[limits.user]
per_minute = 2

[limits.org]
per_minute = 2

[limits.session]
per_minute = 2

[limits.project]
per_minute = 2

[[routes]]
name = "tenanted"
path_prefix = "/t"
upstreams = ["{upstream}"]
auth = "none"
limits = { tenant_id = { per_minute = 1 } }

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;

/// Each attribute kind is its own bucket per value; requests without it are not limited
/// by it (never one shared bucket); `missing = "reject"` and oversized values are 400s.
#[tokio::test(flavor = "multi_thread")]
async fn custom_scopes_read_each_attribute() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(CUSTOM, Some(&up)).await;
    let c = client();
    let status = |r: reqwest::RequestBuilder| async move { r.send().await.unwrap() };
    // Without any attribute: none of the custom limits applies, however many requests.
    for i in 0..6 {
        let r = status(c.get(gw.url("/p"))).await;
        assert_eq!(r.status(), 200, "anonymous {i}");
    }
    type Req = Box<dyn Fn(&reqwest::Client, &Gateway, &str) -> reqwest::RequestBuilder>;
    let kinds: Vec<(&str, Req)> = vec![
        (
            "user",
            Box::new(|c, g, v| c.get(g.url("/a")).header("x-user", v)),
        ),
        (
            "org",
            Box::new(|c, g, v| c.get(g.url(&format!("/a?org={v}")))),
        ),
        (
            "session",
            Box::new(|c, g, v| {
                c.get(g.url("/a"))
                    .header("cookie", format!("x=1; session={v}"))
            }),
        ),
        (
            "project",
            Box::new(|c, g, v| c.get(g.url(&format!("/projects/{v}/items")))),
        ),
    ];
    for (scope, make) in &kinds {
        for i in 0..2 {
            let r = status(make(&c, &gw, "alice")).await;
            assert_eq!(r.status(), 200, "{scope} alice {i}");
        }
        let r = status(make(&c, &gw, "alice")).await;
        assert_eq!(r.status(), 429, "{scope} alice over");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["scope"], *scope, "{v}");
        assert!(v.get("route").is_none(), "{v}");
        let r = status(make(&c, &gw, "bob")).await;
        assert_eq!(r.status(), 200, "{scope}: bob has a bucket of his own");
    }
    // Oversized and doubled values are invalid, never a fallback.
    let long = "x".repeat(257);
    let r = status(c.get(gw.url("/a")).header("x-user", &long)).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["error"].as_str(), v["scope"].as_str()),
        (Some("invalid_identity"), Some("user"))
    );
    let r = status(c.get(gw.url("/a?org=a&org=b"))).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["error"].as_str(), v["scope"].as_str()),
        (Some("invalid_identity"), Some("org"))
    );
    let r = status(c.get(gw.url(&format!("/a?org={}", "y".repeat(256))))).await;
    assert_eq!(r.status(), 200, "256 bytes is still an identity");
    // missing = "reject": 400 without the header, wherever the scope is used.
    let r = status(c.get(gw.url("/t/x"))).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["error"].as_str(), v["scope"].as_str()),
        (Some("missing_identity"), Some("tenant_id"))
    );
    // The route's table of a custom scope: 1 a minute per value, on that route only.
    let r = status(c.get(gw.url("/t/x")).header("x-tenant-id", "t1")).await;
    assert_eq!(r.status(), 200);
    let r = status(c.get(gw.url("/t/x")).header("x-tenant-id", "t1")).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["scope"].as_str(), v["route"].as_str()),
        (Some("tenant_id"), Some("tenanted")),
        "{v}"
    );
    // `/v1/top` ranks a custom scope's identities.
    let r = c
        .get(gw.admin_url("/v1/top?scope=user"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["top"][0]["identity"], "alice", "{v}");
    assert_eq!(v["top"][0]["requests"], 3, "{v}");
    assert_eq!(v["top"][0]["rejected"], 1, "{v}");
}

/// Two gateways on one Redis, 8 threads: a route's window admits exactly its limit in
/// total, and the other route's requests are not counted in it.
#[tokio::test(flavor = "multi_thread")]
async fn a_route_window_is_exact_across_a_fleet() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let body = format!(
        r#"
[store]
backend = "redis"
url = "{}"
timeout_ms = 2000
on_failure = "closed"
key_prefix = "rw"

# The same window length as the route's table: separate counters all the same.
[limits.global]
per_hour = 100000

[[routes]]
name = "search"
path_prefix = "/search"
upstreams = ["{{upstream}}"]
auth = "none"
limits = {{ global = {{ per_hour = 40, algorithm = "token_bucket" }} }}

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{{upstream}}"]
auth = "none"
"#,
        redis.url()
    );
    let mut gws = Vec::new();
    for _ in 0..2 {
        gws.push(Gateway::start(&body, Some(&up)).await);
    }
    let urls: Arc<Vec<String>> = Arc::new(gws.iter().map(|g| g.url("")).collect());
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let urls = urls.clone();
            tokio::spawn(async move {
                let c = client();
                let (mut search, mut other) = (0, 0);
                for i in 0..15 {
                    let gw = &urls[(t + i) % urls.len()];
                    let s = c
                        .get(format!("{gw}/search?q=1"))
                        .send()
                        .await
                        .unwrap()
                        .status();
                    match s.as_u16() {
                        200 => search += 1,
                        429 => {}
                        s => panic!("search: {s}"),
                    }
                    let s = c.get(format!("{gw}/other")).send().await.unwrap().status();
                    assert_eq!(s, 200, "the other route is not limited by search's window");
                    other += 1;
                }
                (search, other)
            })
        })
        .collect();
    let (mut search, mut other) = (0, 0);
    for h in handles {
        let (s, o) = h.await.unwrap();
        search += s;
        other += o;
    }
    assert_eq!(
        search, 40,
        "admitted {search} of 120 with a route limit of 40 on 2 gateways"
    );
    assert_eq!(other, 120);
}
