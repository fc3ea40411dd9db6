//! Edge hardening, third round, on the real binary: what an attacker's probe found in the
//! newest features. Each test failed before its fix.

use serde_json::{json, Value};

use crate::support::{client, Gateway, Upstream, ADMIN_TOKEN};

/// A request through the trusted proxy on 127.0.0.1 for client `xff`, with API key `key`.
async fn as_client(gw: &Gateway, xff: &str, key: &str) -> (u16, Value) {
    let r = client()
        .get(gw.url("/v1/x"))
        .header("x-forwarded-for", xff)
        .header("x-api-key", key)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// `[limits.auth]` counts an IPv6 client by its /64, and so does the early refusal: once
/// a /64 is over the limit, every address of it gets 429 `auth` before any key is looked
/// at, a valid key included; another /64 is untouched.
#[tokio::test(flavor = "multi_thread")]
async fn the_auth_refusal_covers_the_whole_ipv6_network() {
    let up = Upstream::start("round3").await;
    let body = r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[limits.auth]
per_minute = 3

[tiers.free]
key = { per_minute = 100 }

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["{upstream}"]
auth = "required"

[[keys]]
id = "k1"
key = "valid-key-123"
tenant = "acme"
tier = "free"
"#;
    let gw = Gateway::start(body, Some(&up)).await;
    for i in 1..=3 {
        let (status, _) = as_client(&gw, &format!("2001:db8:1:2::{i}"), "guess").await;
        assert_eq!(status, 401, "guess {i}");
    }
    let (status, body) = as_client(&gw, "2001:db8:1:2::1", "guess").await;
    assert_eq!((status, &body["scope"]), (429, &Value::from("auth")));
    // A fresh address of the same /64, with a valid key: refused before the lookup.
    for fresh in ["2001:db8:1:2::99", "2001:db8:1:2:ffff::7"] {
        let (status, body) = as_client(&gw, fresh, "valid-key-123").await;
        assert_eq!(
            (status, &body["scope"]),
            (429, &Value::from("auth")),
            "{fresh}"
        );
    }
    let (status, _) = as_client(&gw, "2001:db8:1:3::1", "valid-key-123").await;
    assert_eq!(status, 200, "another /64");
}

/// A cookie scope cannot be escaped by reformatting the cookie: once `sess=abc` is over
/// its limit, `sess= abc`, `sess="abc"` and `other=1, sess=abc` (the same session to
/// common parsers) are refused too, and naming the cookie twice is 400.
#[tokio::test(flavor = "multi_thread")]
async fn a_cookie_scope_is_not_escaped_by_reformatting() {
    let up = Upstream::start("round3").await;
    let body = r#"
[scopes.session]
from = "cookie:sess"

[limits.session]
per_minute = 2

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;
    let gw = Gateway::start(body, Some(&up)).await;
    let with = |cookie: &'static str| client().get(gw.url("/x")).header("cookie", cookie).send();
    for _ in 0..2 {
        assert_eq!(with("sess=abc").await.unwrap().status(), 200);
    }
    for spelled in [
        "sess=abc",
        "sess= abc",
        "sess=\"abc\"",
        "other=1, sess=abc",
        " sess =abc;x=1",
    ] {
        let r = with(spelled).await.unwrap();
        assert_eq!(r.status(), 429, "{spelled:?}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["scope"], "session", "{spelled:?}");
    }
    let r = with("sess=abc, sess=other").await.unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body,
        serde_json::json!({"error": "invalid_identity", "scope": "session"})
    );
    assert_eq!(
        with("sess=xyz").await.unwrap().status(),
        200,
        "another session"
    );
}

/// A block of an IPv6 network that carries IPv4 is judged by the IPv4 network it carries:
/// NAT64's `64:ff9b::/96` is all of IPv4, so without `force` it is 400 (and IPv4 clients
/// keep being served); with `force` it is taken as meant.
#[tokio::test(flavor = "multi_thread")]
async fn a_nat64_block_of_all_of_ipv4_needs_force() {
    let up = Upstream::start("u").await;
    let body = "[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nauth = \"none\"\nupstreams = [\"{upstream}\"]\n";
    let gw = Gateway::start(body, Some(&up)).await;
    let post = |b: Value| {
        client()
            .post(gw.admin_url("/v1/blocks"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&b)
            .send()
    };
    for value in ["64:ff9b::/96", "64:ff9b:1::/96", "::ffff:0:0:0/96"] {
        let r = post(json!({"scope": "ip", "value": value})).await.unwrap();
        assert_eq!(r.status(), 400, "{value}");
        let reply: Value = r.json().await.unwrap();
        let detail = reply["detail"].as_str().unwrap_or("");
        assert!(detail.contains("wider than /8"), "{value}: {reply}");
    }
    let served = client().get(gw.url("/x")).send().await.unwrap();
    assert_eq!(served.status(), 200, "no IPv4 client is blocked");
    let r = post(json!({"scope": "ip", "value": "64:ff9b::a00:0/104"}))
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        201,
        "10.0.0.0/8 through NAT64 is a block like any /8"
    );
    let forced = post(json!({"scope": "ip", "value": "64:ff9b::/96", "force": true}))
        .await
        .unwrap();
    assert_eq!(forced.status(), 201);
    let blocked = client().get(gw.url("/x")).send().await.unwrap();
    assert_eq!(blocked.status(), 403, "forced, it is all of IPv4");
}
