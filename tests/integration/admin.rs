//! The admin listener: health, readiness, metrics and the /v1/check decision API.

use serde_json::{json, Value};

use crate::support::{client, header, Gateway, Upstream};

const CONFIG: &str = r#"
[limits.ip]
per_minute = 100

[tiers.free]
key = { per_minute = 2 }

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["{upstream}"]
cost = 1

[[keys]]
id = "key_a"
key = "key-a-secret"
tenant = "acme"
tier = "free"
"#;

/// /healthz and /readyz answer JSON; /metrics exposes the throttle_ metrics.
#[tokio::test(flavor = "multi_thread")]
async fn health_ready_and_metrics() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(CONFIG, Some(&up)).await;
    let c = client();
    let h: Value = c
        .get(gw.admin_url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["status"], "ok");
    let r: Value = gw.readyz().await;
    assert_eq!(
        (r["ready"].as_bool(), r["degraded"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(r["store"]["backend"], "memory");
    c.get(gw.url("/v1/x"))
        .header("x-api-key", "key-a-secret")
        .send()
        .await
        .unwrap();
    c.get(gw.url("/v1/x")).send().await.unwrap();
    // Request counters are written in the logging phase, after the response: wait for them.
    let needles = [
        r#"throttle_requests_total{route="api",status="200"} 1"#,
        r#"throttle_requests_total{route="api",status="401"} 1"#,
        r#"throttle_decisions_total{decision="allowed",scope="key"} 1"#,
        "throttle_store_call_seconds_count{store=\"memory\"}",
        "throttle_upstream_seconds_count{route=\"api\"} 1",
        "throttle_fallback_active 0",
    ];
    let m = crate::support::eventually(
        std::time::Duration::from_secs(5),
        "all metrics present",
        || async {
            let m = gw.metrics().await;
            needles.iter().all(|n| m.contains(n)).then_some(m)
        },
    )
    .await;
    assert!(
        !m.contains("127.0.0.1") && !m.contains("key_a") && !m.contains("acme"),
        "identities leaked into labels"
    );
}

/// POST /v1/check spends the given IP's and key's limits and answers 200 then 429 with
/// the decision and the X-RateLimit-* headers.
#[tokio::test(flavor = "multi_thread")]
async fn check_api_decides_for_the_given_ip() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(CONFIG, Some(&up)).await;
    let c = client();
    let check = |body: Value| c.post(gw.admin_url("/v1/check")).json(&body).send();
    let req = json!({"ip": "198.51.100.20", "api_key": "key-a-secret", "route": "api"});
    let r = check(req.clone()).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-remaining"), "1");
    let b: Value = r.json().await.unwrap();
    assert_eq!(
        (
            b["allowed"].as_bool(),
            b["scope"].as_str(),
            b["remaining"].as_u64(),
            b["window"].as_str()
        ),
        (Some(true), Some("key"), Some(1), Some("1m"))
    );
    assert!(b["reset"].as_u64().unwrap() > 1_700_000_000);
    check(req.clone()).await.unwrap();
    let r = check(req).await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(header(&r, "retry-after").parse::<u64>().unwrap() >= 1);
    let b: Value = r.json().await.unwrap();
    assert_eq!(
        (
            b["allowed"].as_bool(),
            b["limit"].as_u64(),
            b["remaining"].as_u64()
        ),
        (Some(false), Some(2), Some(0))
    );
    assert!(b["retry_after"].as_f64().unwrap() > 0.0);
    // The proxy shares the same state: the key is spent there too.
    assert_eq!(
        c.get(gw.url("/v1/x"))
            .header("x-api-key", "key-a-secret")
            .send()
            .await
            .unwrap()
            .status(),
        429
    );
    // The given IP was charged, not the caller's (127.0.0.1 still has its full ip budget).
    let r = check(json!({"ip": "127.0.0.1"})).await.unwrap();
    let b: Value = r.json().await.unwrap();
    assert_eq!(
        (b["scope"].as_str(), b["remaining"].as_u64()),
        (Some("ip"), Some(99))
    );
    // Bad requests are 4xx with a reason.
    assert_eq!(
        check(json!({"ip": "not-an-ip"})).await.unwrap().status(),
        400
    );
    assert_eq!(
        check(json!({"ip": "1.2.3.4", "api_key": "wrong"}))
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        check(json!({"ip": "1.2.3.4", "route": "nope"}))
            .await
            .unwrap()
            .status(),
        404
    );
}

/// `[server] check_token = "${VAR}"`: `POST /v1/check` answers 401 `unauthorized`
/// without `Authorization: Bearer <token>`, with a wrong one, or with the admin token;
/// the right token decides as before.
#[tokio::test(flavor = "multi_thread")]
async fn check_token_guards_the_check_api() {
    let up = Upstream::start("u").await;
    let body = CONFIG.replace("{upstream}", &up.addr.to_string());
    let server = "grace_period_secs = 0\ncheck_token = \"${THROTTLE_CHECK_TOKEN_T}\"";
    let env = [("THROTTLE_CHECK_TOKEN_T", Some("check-s3cret-0123456"))];
    let gw = Gateway::start_env(&["run"], &body, server, &env).await;
    let c = client();
    let req = json!({"ip": "198.51.100.20"});
    let post = |auth: Option<&str>| {
        let r = c.post(gw.admin_url("/v1/check")).json(&req);
        match auth {
            Some(a) => r.header("authorization", a),
            None => r,
        }
        .send()
    };
    let admin = format!("Bearer {}", crate::support::ADMIN_TOKEN);
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer check-s3cre"),
        Some("check-s3cret-0123456"),
        Some(admin.as_str()),
    ] {
        let r = post(auth).await.unwrap();
        assert_eq!(r.status(), 401, "{auth:?}");
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["error"], "unauthorized", "{auth:?}");
    }
    let r = post(Some("Bearer check-s3cret-0123456")).await.unwrap();
    assert_eq!(r.status(), 200);
    let b: Value = r.json().await.unwrap();
    // Refused calls spent nothing: this is the first decision for the address.
    assert_eq!(
        (b["allowed"].as_bool(), b["remaining"].as_u64()),
        (Some(true), Some(99))
    );
}

/// `POST /v1/blocks` refuses a CIDR with host bits set, one wider than /8 (IPv4) or /32
/// (IPv6), and values or reasons with bidirectional formatting characters: 400 naming
/// the field. `"force": true` takes a wide or host-bit CIDR as its network.
#[tokio::test(flavor = "multi_thread")]
async fn blocks_refuse_wide_cidrs_and_formatting_characters() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(CONFIG, Some(&up)).await;
    let c = client();
    let post = |body: Value| {
        c.post(gw.admin_url("/v1/blocks"))
            .bearer_auth(crate::support::ADMIN_TOKEN)
            .json(&body)
            .send()
    };
    let refused = [
        (
            json!({"scope": "ip", "value": "1.2.3.4/0"}),
            "value 1.2.3.4/0 has host bits set",
        ),
        (
            json!({"scope": "ip", "value": "0.0.0.0/0"}),
            "value 0.0.0.0/0 is wider than /8",
        ),
        (
            json!({"scope": "ip", "value": "10.0.0.0/7"}),
            "value 10.0.0.0/7 is wider than /8",
        ),
        (
            json!({"scope": "ip", "value": "10.0.0.1/8"}),
            "value 10.0.0.1/8 has host bits set",
        ),
        (
            json!({"scope": "ip", "value": "2001::/16"}),
            "value 2001::/16 is wider than /32",
        ),
        (
            json!({"scope": "ip", "value": "::ffff:0:0/96"}),
            "is wider than /8",
        ),
        (
            json!({"scope": "tenant", "value": "evil\u{202E}acme"}),
            "value must not contain bidirectional formatting characters",
        ),
        (
            json!({"scope": "key", "value": "k1", "reason": "ok\u{2066}"}),
            "reason must not contain bidirectional formatting characters",
        ),
        (
            json!({"scope": "key", "value": "k\u{1b}[31m"}),
            "value must not contain control characters",
        ),
    ];
    for (body, detail) in refused {
        let r = post(body.clone()).await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["error"], "invalid_request", "{body}");
        let got = b["detail"].as_str().unwrap();
        assert!(got.contains(detail), "{body}: {got}");
    }
    // Nothing was stored.
    let listed: Value = c
        .get(gw.admin_url("/v1/blocks"))
        .bearer_auth(crate::support::ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["blocks"], json!([]));
    // Forced: stored as the network it blocks.
    for (value, stored) in [("10.0.0.1/8", "10.0.0.0/8"), ("2001::/16", "2001::/16")] {
        let r = post(json!({"scope": "ip", "value": value, "force": true}))
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{value}");
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["value"], stored);
    }
    // A narrow, well-formed CIDR needs no force.
    let r = post(json!({"scope": "ip", "value": "203.0.113.0/24"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
}
