//! The wire contract through the real gateway: 429s, headers, auth, blocks, routes,
//! shadow mode, cost, upstream headers, load balancing and hostile input.

use serde_json::Value;

use crate::support::{client, header, raw_exchange, raw_status, Gateway, Upstream};

const BASE: &str = r#"
[tiers.free]
message = "Your plan allows {limit} requests per {window}."
key = { per_minute = 3 }
tenant = { per_hour = 1000 }

[tiers.tight_tenant]
key = { per_minute = 100 }
tenant = { per_minute = 2 }

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["{upstream}"]
auth = "required"

[[routes]]
name = "opt"
path_prefix = "/opt"
upstreams = ["{upstream}"]
auth = "optional"

[[routes]]
name = "public"
path_prefix = "/public"
upstreams = ["{upstream}"]
auth = "none"

[[keys]]
id = "key_a"
key = "key-a-secret"
tenant = "acme"
tier = "free"

[[keys]]
id = "key_b"
key_sha256 = "163d5c1a47c42b8183100f41be2b944a747a34dfc4db4b0766a0fe6f65c7e8b9"
tenant = "acme"
tier = "free"

[[keys]]
id = "key_c"
key = "key-c-secret"
tenant = "tiny"
tier = "tight_tenant"

[[keys]]
id = "key_blocked"
key = "key-blocked-secret"
tenant = "acme"
tier = "free"

[[keys]]
id = "key_evil"
key = "key-evil-secret"
tenant = "evil"
tier = "free"

[[blocks]]
scope = "key"
value = "key_blocked"

[[blocks]]
scope = "tenant"
value = "evil"

[[blocks]]
scope = "key"
value = "key_a"
expires_at = 2020-01-01T00:00:00Z
"#;

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// Three requests pass with falling Remaining, the fourth is a 429 with Retry-After and
/// the JSON body of the contract; the tier's message is rendered.
#[tokio::test(flavor = "multi_thread")]
async fn rejects_fourth_request_in_minute_with_headers_and_body() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(BASE, Some(&up)).await;
    let c = client();
    for remaining in ["2", "1", "0"] {
        let r = c
            .get(gw.url("/v1/items"))
            .header("authorization", bearer("key-a-secret"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-limit"), "3");
        assert_eq!(header(&r, "x-ratelimit-remaining"), remaining);
        let reset: u64 = header(&r, "x-ratelimit-reset").parse().unwrap();
        assert!(reset > 1_700_000_000, "reset is Unix seconds");
        assert_eq!(header(&r, "retry-after"), "");
    }
    let r = c
        .get(gw.url("/v1/items"))
        .header("x-api-key", "key-a-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&r, "content-type"), "application/json");
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((1..=20).contains(&retry), "retry-after {retry}");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "rate_limit_exceeded");
    assert_eq!(body["scope"], "key");
    assert_eq!(body["limit"], 3);
    assert_eq!(body["current"], 4);
    assert_eq!(body["window"], "1m");
    assert!(body["retry_after"].as_f64().unwrap() > 0.0);
    assert_eq!(body["message"], "Your plan allows 3 requests per minute.");
    // A key of the same tier (configured by its SHA-256) has its own budget.
    let other = c
        .get(gw.url("/v1/items"))
        .header("x-api-key", "key-b-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(
        (
            other.status().as_u16(),
            header(&other, "x-ratelimit-remaining")
        ),
        (200, "2".to_string())
    );
}

/// Missing, malformed and unknown keys get the right 401 per auth mode.
#[tokio::test(flavor = "multi_thread")]
async fn auth_modes_answer_401_bodies() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(BASE, Some(&up)).await;
    let c = client();
    let get = |path: &str, key: Option<&str>| {
        let mut rb = c.get(gw.url(path));
        if let Some(k) = key {
            rb = rb.header("authorization", k.to_string());
        }
        rb.send()
    };
    let cases = [
        ("/v1/x", None, 401, Some("missing_api_key")),
        ("/v1/x", Some("Bearer nope"), 401, Some("invalid_api_key")),
        ("/v1/x", Some("Bearer "), 401, Some("invalid_api_key")),
        ("/opt/x", None, 200, None),
        ("/opt/x", Some("Bearer nope"), 401, Some("invalid_api_key")),
        ("/opt/x", Some("Bearer key-c-secret"), 200, None),
        ("/public/x", Some("Bearer nope"), 200, None),
    ];
    for (i, (path, key, status, error)) in cases.into_iter().enumerate() {
        let r = get(path, key).await.unwrap();
        assert_eq!(r.status(), status, "case {i}");
        if let Some(e) = error {
            let body: Value = r.json().await.unwrap();
            assert_eq!(body, serde_json::json!({ "error": e }), "case {i}");
        }
    }
}

/// Key and tenant blocks answer 403 naming the scope; an expired block does not.
#[tokio::test(flavor = "multi_thread")]
async fn blocks_answer_403_until_expiry() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(BASE, Some(&up)).await;
    let c = client();
    let cases = [
        ("key-blocked-secret", 403, Some("key")),
        ("key-evil-secret", 403, Some("tenant")),
        ("key-a-secret", 200, None),
    ];
    for (key, status, scope) in cases {
        let r = c
            .get(gw.url("/v1/x"))
            .header("x-api-key", key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{key}");
        if let Some(s) = scope {
            let body: Value = r.json().await.unwrap();
            assert_eq!(body, serde_json::json!({"error": "blocked", "scope": s}));
        }
    }
}

/// An IP block (address behind a trusted proxy, or a CIDR) is a 403 with scope ip.
#[tokio::test(flavor = "multi_thread")]
async fn ip_blocks_match_resolved_client() {
    let up = Upstream::start("u").await;
    let body = format!(
        "[client_ip]\ntrusted_proxies = [\"127.0.0.1/32\"]\n{BASE}\n[[blocks]]\nscope = \"ip\"\nvalue = \"203.0.113.0/24\"\n"
    );
    let gw = Gateway::start(&body, Some(&up)).await;
    let c = client();
    let r = c
        .get(gw.url("/public/x"))
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        serde_json::json!({"error": "blocked", "scope": "ip"})
    );
    let r = c
        .get(gw.url("/public/x"))
        .header("x-forwarded-for", "198.51.100.1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// No route is a 404, but only after the ip limit: route probing is rate limited too.
#[tokio::test(flavor = "multi_thread")]
async fn no_route_is_404_and_still_ip_limited() {
    let up = Upstream::start("u").await;
    let body = format!("[limits.ip]\nper_minute = 2\n{BASE}");
    let gw = Gateway::start(&body, Some(&up)).await;
    let c = client();
    for _ in 0..2 {
        let r = c.get(gw.url("/nope")).send().await.unwrap();
        assert_eq!(r.status(), 404);
        assert_eq!(
            r.json::<Value>().await.unwrap(),
            serde_json::json!({"error": "no_route"})
        );
    }
    let r = c.get(gw.url("/nope")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.json::<Value>().await.unwrap()["scope"], "ip");
    // The same budget covers routed traffic from that IP.
    assert_eq!(
        c.get(gw.url("/public/x")).send().await.unwrap().status(),
        429
    );
    // `/v1x` is not under `/v1`.
    assert_eq!(c.get(gw.url("/v1x")).send().await.unwrap().status(), 429);
}

/// The tenant limit is shared by the tenant's keys and names scope "tenant".
#[tokio::test(flavor = "multi_thread")]
async fn tenant_limit_rejects_with_scope_tenant() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(BASE, Some(&up)).await;
    let c = client();
    for _ in 0..2 {
        assert_eq!(
            c.get(gw.url("/v1/x"))
                .header("x-api-key", "key-c-secret")
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    let r = c
        .get(gw.url("/v1/x"))
        .header("x-api-key", "key-c-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let b: Value = r.json().await.unwrap();
    assert_eq!(
        (b["scope"].as_str(), b["limit"].as_u64()),
        (Some("tenant"), Some(2))
    );
}

/// Shadow mode charges and sends headers but never rejects; would-be rejections count.
#[tokio::test(flavor = "multi_thread")]
async fn shadow_mode_counts_but_never_rejects() {
    let up = Upstream::start("u").await;
    let body = format!(
        "{BASE}\n[[routes]]\nname = \"shadow\"\npath_prefix = \"/shadow\"\nupstreams = [\"{{upstream}}\"]\nmode = \"shadow\"\n"
    );
    let gw = Gateway::start(&body, Some(&up)).await;
    let c = client();
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let r = c
            .get(gw.url("/shadow/x"))
            .header("x-api-key", "key-a-secret")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        remaining.push(header(&r, "x-ratelimit-remaining"));
    }
    assert_eq!(remaining, ["2", "1", "0", "0", "0"]);
    let m = gw.metrics().await;
    assert!(
        m.contains(r#"throttle_decisions_total{decision="shadow_rejected",scope="key"} 2"#),
        "{m}"
    );
    // Shadow charged like enforce: the key is spent for enforcing routes as well.
    let r = c
        .get(gw.url("/v1/x"))
        .header("x-api-key", "key-a-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
}

/// Route cost spends several units per request.
#[tokio::test(flavor = "multi_thread")]
async fn route_cost_spends_several_units() {
    let up = Upstream::start("u").await;
    let body = format!(
        "[limits.ip]\nper_minute = 5\n{BASE}\n[[routes]]\nname = \"heavy\"\npath_prefix = \"/heavy\"\nupstreams = [\"{{upstream}}\"]\nauth = \"none\"\ncost = 2\n"
    );
    let gw = Gateway::start(&body, Some(&up)).await;
    let c = client();
    for remaining in ["3", "1"] {
        let r = c.get(gw.url("/heavy")).send().await.unwrap();
        assert_eq!(
            (r.status().as_u16(), header(&r, "x-ratelimit-remaining")),
            (200, remaining.to_string())
        );
    }
    let r = c.get(gw.url("/heavy")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.json::<Value>().await.unwrap()["current"], 6);
    // One unit is left for a cost-1 request.
    assert_eq!(
        c.get(gw.url("/public/x")).send().await.unwrap().status(),
        200
    );
}

/// A route may leave out `X-Real-IP` and `X-Throttle-*` upstream and the rate-limit
/// headers of its forwarded answers; `X-Forwarded-For` and `X-Request-Id` still go, the
/// client's own `X-Real-IP` and `X-Throttle-*` are still removed, a 429 still carries `X-RateLimit-*`, and a
/// route without those keys keeps every header.
#[tokio::test(flavor = "multi_thread")]
async fn a_route_leaves_out_the_headers_it_does_not_need() {
    let up = Upstream::start("u").await;
    let config = format!(
        "{}\n{}",
        r#"
[[routes]]
name = "quiet"
path_prefix = "/quiet"
upstreams = ["{upstream}"]
auth = "required"
identity_headers = false
real_ip_header = false
hide_client_headers = true
"#,
        BASE
    );
    let gw = Gateway::start(&config, Some(&up)).await;
    let c = client();
    let ask = |path: &'static str| {
        c.get(gw.url(path))
            .header("x-api-key", "key-a-secret")
            .header("x-throttle-tenant", "spoofed")
            .header("x-real-ip", "203.0.113.9")
            .send()
    };
    let r = ask("/quiet/x").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-limit"), "");
    assert_ne!(header(&r, "x-request-id"), "");
    let echo: Value = r.json().await.unwrap();
    let h = &echo["headers"];
    for gone in ["x-real-ip", "x-throttle-tenant", "x-throttle-key-id"] {
        assert!(h.get(gone).is_none(), "{gone}: {h}");
    }
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert!(h.get("x-request-id").is_some(), "{h}");
    // The route without the keys, same key: every header is there.
    let r = ask("/v1/x").await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-limit"), "3");
    let echo: Value = r.json().await.unwrap();
    let h = &echo["headers"];
    assert_eq!(
        (
            &h["x-real-ip"],
            &h["x-throttle-tenant"],
            &h["x-throttle-key-id"]
        ),
        (&"127.0.0.1".into(), &"acme".into(), &"key_a".into())
    );
    // key_a's per-minute 3 is spent (2 so far): the quiet route's 429 says so.
    assert_eq!(ask("/quiet/x").await.unwrap().status(), 200);
    let r = ask("/quiet/x").await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        (
            header(&r, "x-ratelimit-limit"),
            header(&r, "x-ratelimit-remaining")
        ),
        ("3".to_string(), "0".to_string())
    );
}

/// The upstream sees X-Forwarded-For, X-Real-IP and the gateway's X-Throttle-* headers,
/// never the client's.
#[tokio::test(flavor = "multi_thread")]
async fn upstream_gets_identity_headers_and_not_spoofed_ones() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(BASE, Some(&up)).await;
    let c = client();
    let r = c
        .get(gw.url("/v1/x"))
        .header("x-api-key", "key-c-secret")
        .header("x-throttle-tenant", "spoofed")
        .header("x-throttle-admin", "1")
        .send()
        .await
        .unwrap();
    let echo: Value = r.json().await.unwrap();
    let h = &echo["headers"];
    assert_eq!(h["x-throttle-tenant"], "tiny");
    assert_eq!(h["x-throttle-key-id"], "key_c");
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["x-real-ip"], "127.0.0.1");
    assert!(h.get("x-throttle-admin").is_none());
    let r = c
        .get(gw.url("/public/x"))
        .header("x-throttle-key-id", "spoofed")
        .send()
        .await
        .unwrap();
    let echo: Value = r.json().await.unwrap();
    assert!(echo["headers"].get("x-throttle-key-id").is_none());
}

/// Several upstreams share the load; a dead one is skipped; all dead is a JSON 502.
#[tokio::test(flavor = "multi_thread")]
async fn balances_upstreams_and_answers_502_when_all_are_down() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let dead = format!("127.0.0.1:{}", crate::support::free_port());
    let body = format!(
        "[[routes]]\nname = \"lb\"\npath_prefix = \"/\"\nupstreams = [\"{}\", \"{}\", \"{dead}\"]\nauth = \"none\"\n\n[[routes]]\nname = \"down\"\npath_prefix = \"/down\"\nupstreams = [\"{dead}\"]\nauth = \"none\"\nconnect_timeout_ms = 500\n",
        a.addr, b.addr
    );
    let gw = Gateway::start(&body, None).await;
    let c = client();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..12 {
        let r = c.get(gw.url("/x")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        seen.insert(
            r.json::<Value>().await.unwrap()["upstream"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    let r = c.get(gw.url("/down")).send().await.unwrap();
    assert_eq!(r.status(), 502);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        serde_json::json!({"error": "bad_gateway"})
    );
}

/// Hostile input gets a 4xx (or a normal answer), never a 5xx, a hang or a crash.
#[tokio::test(flavor = "multi_thread")]
async fn malformed_input_never_yields_5xx() {
    let up = Upstream::start("u").await;
    let body = format!("[client_ip]\ntrusted_proxies = [\"127.0.0.1/32\"]\n{BASE}");
    let gw = Gateway::start(&body, Some(&up)).await;
    let long_xff = (0..800)
        .map(|i| format!("10.0.{}.{}", i / 250, i % 250))
        .collect::<Vec<_>>()
        .join(",");
    assert!(long_xff.len() > 8_000);
    let long_key = "k".repeat(10_000);
    let huge_path = format!("/v1/{}", "a".repeat(200_000));
    let requests: Vec<(&str, Vec<u8>)> = vec![
        (
            "8KB XFF",
            format!("GET /public/x HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: {long_xff}\r\n\r\n")
                .into_bytes(),
        ),
        (
            "garbage XFF",
            b"GET /public/x HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: \xff\xfe, ,,, nonsense\r\n\r\n"
                .to_vec(),
        ),
        (
            "non-ASCII key",
            b"GET /v1/x HTTP/1.1\r\nHost: t\r\nX-API-Key: caf\xc3\xa9\xff\r\n\r\n".to_vec(),
        ),
        (
            "non-ASCII host",
            b"GET /v1/x HTTP/1.1\r\nHost: \xe4\xbd\xa0\xe5\xa5\xbd\r\n\r\n".to_vec(),
        ),
        (
            "empty bearer",
            b"GET /v1/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer \r\n\r\n".to_vec(),
        ),
        (
            "10k key",
            format!("GET /v1/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {long_key}\r\n\r\n")
                .into_bytes(),
        ),
        (
            "huge path",
            format!("GET {huge_path} HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes(),
        ),
        (
            "dot segments",
            b"GET /public/../v1/x HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(),
        ),
        (
            "encoded dot segments",
            b"GET /public/%2e%2e/v1/x HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(),
        ),
        ("bad request line", b"GARBAGE\r\n\r\n".to_vec()),
    ];
    for (what, req) in requests {
        let status = raw_status(gw.addr, &req)
            .unwrap_or_else(|| panic!("{what}: connection closed without an answer"));
        // Hostile XFF still identifies a client (the trusted peer) and passes; all else is 4xx.
        let ok = if what.contains("XFF") {
            status == 200
        } else {
            (400..500).contains(&status)
        };
        assert!(ok, "{what}: {status}");
    }
    // The gateway is still alive and well.
    assert_eq!(
        client()
            .get(gw.url("/public/x"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert!(!gw.log().contains("panicked"), "{}", gw.log());
}

/// A 429 storm on one keep-alive connection: every answer arrives, the connection stays open.
#[tokio::test(flavor = "multi_thread")]
async fn keep_alive_survives_a_429_storm() {
    let up = Upstream::start("u").await;
    let body = format!("[limits.ip]\nper_minute = 5\n{BASE}");
    let gw = Gateway::start(&body, Some(&up)).await;
    let mut conn = std::net::TcpStream::connect(gw.addr).unwrap();
    let mut statuses = Vec::new();
    for _ in 0..50 {
        let (status, head, _) =
            raw_exchange(&mut conn, b"GET /public/x HTTP/1.1\r\nHost: t\r\n\r\n")
                .expect("connection closed");
        assert!(!head.to_ascii_lowercase().contains("connection: close"));
        statuses.push(status);
    }
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 5);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 45);
}
