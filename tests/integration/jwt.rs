//! `[auth.jwt]` through the real gateway: RS256 tokens from a JWKS served over HTTP by the
//! test, their claims as the caller (upstream headers, tier limits, blocks), the key scope
//! counted by the claim across two gateways on one Redis, key rotation through the JWKS URL,
//! every invalid token as 401 `invalid_token` with `WWW-Authenticate`, `[limits.auth]`
//! counting refused tokens, and a reload that adds and changes the section.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::jwt::{hs256, jwks, now_secs, unsigned, JwksServer, RsaKey};
use crate::support::redis::RedisServer;
use crate::support::{client, eventually, header, Gateway, Upstream, ADMIN_TOKEN};

const ISSUER: &str = "https://idp.test/";
/// The HS256 secret the gateway reads from `THROTTLE_TEST_JWT_SECRET`.
const SECRET: &str = "an-hs256-secret-of-at-least-32-bytes!";
const CHALLENGE: &str = r#"Bearer error="invalid_token""#;

/// Tiers, routes, an API key and blocks around an `[auth.jwt]` table (`jwt`; empty: none).
fn body(jwt: &str, extra: &str) -> String {
    let section = if jwt.is_empty() {
        String::new()
    } else {
        format!("[auth.jwt]\n{jwt}\n")
    };
    format!(
        r#"
[tiers.free]
key = {{ per_minute = 100 }}

[tiers.gold]
key = {{ per_minute = 500 }}

{section}
{extra}

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["{{upstream}}"]
auth = "required"

[[routes]]
name = "opt"
path_prefix = "/opt"
upstreams = ["{{upstream}}"]
auth = "optional"

[[routes]]
name = "hidden"
path_prefix = "/hidden"
upstreams = ["{{upstream}}"]
auth = "required"
hide_credentials = true

[[keys]]
id = "key_a"
key = "key-a-secret"
tenant = "acme"
tier = "free"

[[blocks]]
scope = "key"
value = "jwt:blocked-user"

[[blocks]]
scope = "tenant"
value = "blocked-org"
"#
    )
}

/// Claims valid for an hour, for `sub`, with `more` merged in.
fn claims(sub: &str, more: Value) -> Value {
    let now = now_secs();
    let mut c = json!({"sub": sub, "iss": ISSUER, "aud": "api", "iat": now, "exp": now + 3600});
    if let (Some(c), Some(more)) = (c.as_object_mut(), more.as_object()) {
        c.extend(more.clone());
    }
    c
}

async fn call(gw: &Gateway, path: &str, token: &str) -> reqwest::Response {
    client()
        .get(gw.url(path))
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap()
}

/// 401 `{"error":"invalid_token"}` with the Bearer challenge.
async fn assert_invalid(gw: &Gateway, path: &str, token: &str, what: &str) {
    let r = call(gw, path, token).await;
    assert_eq!(r.status(), 401, "{what}");
    assert_eq!(header(&r, "www-authenticate"), CHALLENGE, "{what}");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body, json!({"error": "invalid_token"}), "{what}");
}

/// Waits until `token` is admitted on `path` (the JWKS is fetched beside readiness).
async fn until_admitted(gw: &Gateway, path: &str, token: &str) -> reqwest::Response {
    eventually(
        Duration::from_secs(20),
        "a valid token admitted",
        || async {
            let r = call(gw, path, token).await;
            (r.status() == 200).then_some(r)
        },
    )
    .await
}

/// The RS256 + HS256 table of the first test, keys from `url`.
fn idp_table(url: &str) -> String {
    format!(
        r#"algorithms = ["RS256", "HS256"]
jwks_url = "{url}"
hs256_secret_env = "THROTTLE_TEST_JWT_SECRET"
issuer = "{ISSUER}"
audience = "api"
tenant_claim = "org"
tier_claim = "plan"
default_tier = "free""#
    )
}

async fn start(body: &str, up: &Upstream) -> Gateway {
    let body = body.replace("{upstream}", &up.addr.to_string());
    let env = [("THROTTLE_TEST_JWT_SECRET", Some(SECRET))];
    Gateway::start_env(&["run"], &body, "grace_period_secs = 0", &env).await
}

/// A verified RS256 token is the caller: its claims go upstream as the key id and tenant,
/// its tier claim (or `default_tier`) sets the key limits, a caller without a tenant claim
/// has no tenant, key blocks name `jwt:<sub>` and tenant blocks the claimed tenant, and
/// `hide_credentials` drops the token.
#[tokio::test(flavor = "multi_thread")]
async fn verified_token_is_the_caller() {
    let k1 = RsaKey::new(0, "k1");
    let idp = JwksServer::start(jwks(&[&k1])).await;
    let up = Upstream::start("u").await;
    let gw = start(&body(&idp_table(&idp.url()), ""), &up).await;

    let gold = k1.sign(&claims("user-1", json!({"org": "acme", "plan": "gold"})));
    let r = until_admitted(&gw, "/v1/x", &gold).await;
    assert_eq!(
        header(&r, "x-ratelimit-limit"),
        "500",
        "the gold tier's key limit"
    );
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-throttle-key-id"], "user-1");
    assert_eq!(echo["headers"]["x-throttle-tenant"], "acme");
    assert_eq!(echo["headers"]["authorization"], format!("Bearer {gold}"));

    // No tier claim: default_tier; no tenant claim: no tenant (never one named after
    // the subject).
    let plain = k1.sign(&claims("user-2", json!({})));
    let r = call(&gw, "/v1/x", &plain).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-limit"), "100", "default_tier free");
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-throttle-key-id"], "user-2");
    assert!(echo["headers"].get("x-throttle-tenant").is_none(), "{echo}");

    // Optional routes take it too; hide_credentials drops it before the upstream.
    let r = call(&gw, "/opt/x", &gold).await;
    assert_eq!(r.status(), 200);
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-throttle-key-id"], "user-1");
    let r = call(&gw, "/hidden/x", &gold).await;
    assert_eq!(r.status(), 200);
    let echo: Value = r.json().await.unwrap();
    assert!(echo["headers"].get("authorization").is_none(), "{echo}");
    assert_eq!(echo["headers"]["x-throttle-key-id"], "user-1");

    // A key block names the JWT caller's key scope (`jwt:<sub>`), a tenant block the
    // tenant its tenant claim names.
    for (sub, org, scope) in [
        ("blocked-user", "acme", "key"),
        ("user-3", "blocked-org", "tenant"),
    ] {
        let token = k1.sign(&claims(sub, json!({"org": org})));
        let r = call(&gw, "/v1/x", &token).await;
        assert_eq!(r.status(), 403, "{scope}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body, json!({"error": "blocked", "scope": scope}));
    }

    // API keys still work beside tokens.
    let r = client()
        .get(gw.url("/v1/x"))
        .header("x-api-key", "key-a-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Every token that must not verify answers 401 `invalid_token` with the Bearer challenge:
/// forged signature, expired, wrong audience, wrong issuer, `alg: none`, HS256 signed with
/// the RSA public key, oversized, unknown tier, malformed; on an optional route too.
#[tokio::test(flavor = "multi_thread")]
async fn invalid_tokens_are_refused() {
    let k1 = RsaKey::new(0, "k1");
    let forger = RsaKey::new(1, "k1");
    let idp = JwksServer::start(jwks(&[&k1])).await;
    let up = Upstream::start("u").await;
    let gw = start(&body(&idp_table(&idp.url()), ""), &up).await;
    until_admitted(&gw, "/v1/x", &k1.sign(&claims("ok", json!({})))).await;

    let now = now_secs();
    let (der, pem) = k1.public_bytes();
    let none_header = r#"{"alg":"none","typ":"JWT","kid":"k1"}"#;
    let payload = claims("mallory", json!({})).to_string();
    let cases = [
        (
            "forged signature",
            forger.sign(&claims("mallory", json!({}))),
        ),
        (
            "expired beyond the leeway",
            k1.sign(&claims("u", json!({"exp": now - 120, "iat": now - 3600}))),
        ),
        (
            "not yet valid",
            k1.sign(&claims("u", json!({"nbf": now + 600}))),
        ),
        (
            "wrong audience",
            k1.sign(&claims("u", json!({"aud": "other"}))),
        ),
        (
            "wrong issuer",
            k1.sign(&claims("u", json!({"iss": "https://evil.test/"}))),
        ),
        ("alg none", unsigned(none_header, &payload)),
        (
            "HS256 with the RSA public key (DER)",
            hs256(&der, "k1", &claims("mallory", json!({}))),
        ),
        (
            "HS256 with the RSA public key (PEM)",
            hs256(pem.as_bytes(), "k1", &claims("mallory", json!({}))),
        ),
        (
            "oversized",
            k1.sign(&claims("u", json!({"pad": "x".repeat(9000)}))),
        ),
        (
            "unknown tier claim",
            k1.sign(&claims("u", json!({"plan": "platinum"}))),
        ),
        ("unknown kid", k1.sign_as("k9", &claims("u", json!({})))),
        ("malformed", "not.a.jwt".to_string()),
        ("missing exp", {
            let mut c = claims("u", json!({}));
            c.as_object_mut().unwrap().remove("exp");
            k1.sign(&c)
        }),
    ];
    for (what, token) in &cases {
        assert_invalid(&gw, "/v1/x", token, what).await;
    }
    assert_invalid(&gw, "/opt/x", &cases[0].1, "optional route").await;
    // The HS path is live: a token with the configured secret verifies.
    let r = call(
        &gw,
        "/v1/x",
        &hs256(SECRET.as_bytes(), "any", &claims("hs-user", json!({}))),
    )
    .await;
    assert_eq!(r.status(), 200, "HS256 with the configured secret");
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-throttle-key-id"], "hs-user");
}

/// The key scope counts by the key claim, across gateways: two gateways on one Redis
/// admit exactly the tier's limit for one `sub` (each request a different token), and
/// another `sub` has its own count.
#[tokio::test(flavor = "multi_thread")]
async fn claim_key_limit_is_shared_by_two_gateways() {
    let k1 = RsaKey::new(0, "k1");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, jwks(&[&k1])).unwrap();
    let redis = RedisServer::start().await;
    let up = Upstream::start("u").await;
    let table = format!(
        "algorithms = [\"RS256\"]\njwks_file = \"{}\"\ndefault_tier = \"five\"",
        file.display()
    );
    let extra = format!(
        // A generous store deadline: under a loaded test run a 25 ms call can time out,
        // and the local fallback would divide the limit between the two gateways.
        "[tiers.five]\nkey = {{ per_hour = 5, admission = \"exact\" }}\n\n[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 2000",
        redis.url()
    );
    let cfg = body(&table, &extra);
    let (a, b) = (start(&cfg, &up).await, start(&cfg, &up).await);
    let mut admitted = 0;
    for i in 0..12 {
        let gw = if i % 2 == 0 { &a } else { &b };
        let token = k1.sign(&claims("shared-user", json!({"jti": format!("t{i}")})));
        let r = call(gw, "/v1/x", &token).await;
        match r.status().as_u16() {
            200 => admitted += 1,
            429 => {
                let body: Value = r.json().await.unwrap();
                assert_eq!(
                    (body["scope"].as_str(), body["limit"].as_u64()),
                    (Some("key"), Some(5))
                );
            }
            s => panic!("unexpected status {s}"),
        }
    }
    assert_eq!(admitted, 5, "the tier's key limit across both gateways");
    let other = k1.sign(&claims("other-user", json!({})));
    assert_eq!(call(&b, "/v1/x", &other).await.status(), 200);
}

/// Key rotation through the JWKS URL: a token of a newly published `kid` is admitted within
/// the unknown-kid refetch, long before `jwks_refresh_secs`, and a stream of tokens with
/// that kid costs the key server a bounded number of fetches.
#[tokio::test(flavor = "multi_thread")]
async fn rotated_key_works_within_the_unknown_kid_refetch() {
    let (k1, k2) = (RsaKey::new(0, "k1"), RsaKey::new(2, "k2"));
    let idp = JwksServer::start(jwks(&[&k1])).await;
    let up = Upstream::start("u").await;
    let table = format!(
        "algorithms = [\"RS256\"]\njwks_url = \"{}\"\njwks_refresh_secs = 3600\ndefault_tier = \"free\"",
        idp.url()
    );
    let gw = start(&body(&table, ""), &up).await;
    until_admitted(&gw, "/v1/x", &k1.sign(&claims("u", json!({})))).await;
    let rotated = k2.sign(&claims("u", json!({})));
    assert_invalid(&gw, "/v1/x", &rotated, "k2 before it is published").await;
    let before = idp.hits();
    idp.publish(jwks(&[&k1, &k2]));
    let started = tokio::time::Instant::now();
    until_admitted(&gw, "/v1/x", &rotated).await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let fetches = idp.hits() - before;
    assert!(
        (1..=2).contains(&fetches),
        "{fetches} fetches for one rotation"
    );
    // The old key still works (both are published).
    assert_eq!(
        call(&gw, "/v1/x", &k1.sign(&claims("u", json!({}))))
            .await
            .status(),
        200
    );
}

/// `[limits.auth]` counts refused tokens like unknown keys: after the limit the address
/// gets 429 `auth`, and then not even a valid token is looked at.
#[tokio::test(flavor = "multi_thread")]
async fn limits_auth_counts_invalid_tokens() {
    let (k1, forger) = (RsaKey::new(0, "k1"), RsaKey::new(1, "k1"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, jwks(&[&k1])).unwrap();
    let up = Upstream::start("u").await;
    let table = format!(
        "algorithms = [\"RS256\"]\njwks_file = \"{}\"\ndefault_tier = \"free\"",
        file.display()
    );
    let gw = start(&body(&table, "[limits.auth]\nper_minute = 3"), &up).await;
    let valid = k1.sign(&claims("u", json!({})));
    assert_eq!(call(&gw, "/v1/x", &valid).await.status(), 200);
    let forged = forger.sign(&claims("mallory", json!({})));
    for i in 0..3 {
        assert_invalid(&gw, "/v1/x", &forged, &format!("bad token {i}")).await;
    }
    let r = call(&gw, "/v1/x", &forged).await;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["scope"], "auth");
    let r = call(&gw, "/v1/x", &valid).await;
    assert_eq!(r.status(), 429, "past the limit no token is looked at");
}

/// A reload that adds `[auth.jwt]` makes JWT-shaped Bearer values tokens (before it they
/// are API keys), with the new verifier's JWKS fetched; a reload that changes the
/// audience applies to the next request.
#[tokio::test(flavor = "multi_thread")]
async fn reload_adds_and_changes_jwt() {
    let k1 = RsaKey::new(0, "k1");
    let idp = JwksServer::start(jwks(&[&k1])).await;
    let up = Upstream::start("u").await;
    let gw = start(&body("", ""), &up).await;
    let token = k1.sign(&claims("u", json!({})));
    let r = call(&gw, "/v1/x", &token).await;
    assert_eq!(r.status(), 401);
    let body_json: Value = r.json().await.unwrap();
    assert_eq!(
        body_json["error"], "invalid_api_key",
        "no [auth.jwt]: an API key"
    );

    let table = |aud: &str| {
        let t = format!(
            "algorithms = [\"RS256\"]\njwks_url = \"{}\"\naudience = \"{aud}\"\ndefault_tier = \"free\"",
            idp.url()
        );
        body(&t, "").replace("{upstream}", &up.addr.to_string())
    };
    let reload = || async {
        let r = client()
            .post(gw.admin_url("/v1/reload"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    };
    gw.rewrite(&table("api"));
    reload().await;
    until_admitted(&gw, "/v1/x", &token).await;
    gw.rewrite(&table("other-api"));
    reload().await;
    assert_invalid(&gw, "/v1/x", &token, "audience changed by the reload").await;
}

/// `from = "jwt:<claim>"`: a custom scope counts by a claim of the verified token (here
/// the organisation, 2 a minute), so two users of one organisation share its bucket while
/// another organisation keeps its own, and a token without the claim is not limited by it.
#[tokio::test(flavor = "multi_thread")]
async fn a_custom_scope_counts_by_a_claim() {
    let up = Upstream::start("u").await;
    let extra = "[scopes.org]\nfrom = \"jwt:org_id\"\n\n[limits.org]\nper_minute = 2\n";
    let table = format!(
        "algorithms = [\"HS256\"]\nhs256_secret_env = \"THROTTLE_TEST_JWT_SECRET\"\nissuer = \"{ISSUER}\"\ndefault_tier = \"free\""
    );
    let gw = start(&body(&table, extra), &up).await;
    let token = |sub: &str, org: Option<&str>| {
        let more = org.map_or(json!({}), |o| json!({ "org_id": o }));
        hs256(SECRET.as_bytes(), "", &claims(sub, more))
    };
    for sub in ["ann", "bob"] {
        let r = call(&gw, "/v1/x", &token(sub, Some("o1"))).await;
        assert_eq!(r.status(), 200, "{sub} of o1");
    }
    let r = call(&gw, "/v1/x", &token("cid", Some("o1"))).await;
    assert_eq!(r.status(), 429, "the third caller of o1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["scope"], "org", "{v}");
    let r = call(&gw, "/v1/x", &token("dan", Some("o2"))).await;
    assert_eq!(r.status(), 200, "o2 has a bucket of its own");
    for i in 0..4 {
        let r = call(&gw, "/v1/x", &token("eve", None)).await;
        assert_eq!(r.status(), 200, "no org claim: the scope is left out ({i})");
    }
}
