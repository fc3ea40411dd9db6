//! The Envoy rate-limit service end to end: the real gateway binary with `rls_listen`,
//! called by the gRPC client of envoy-types (tonic) over loopback, as Envoy calls it.

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

use crate::support::redis::{require_redis, RedisServer};
use crate::support::{client, eventually, free_port, header, Gateway, Upstream};

/// A gateway serving the rate-limit service, and a client connected to it.
struct Rls {
    gw: Gateway,
    client: RateLimitServiceClient<Channel>,
}

impl Rls {
    /// Starts the gateway with `body` (`{upstream}` replaced) and `rls_listen` on a free
    /// port; returns once a gRPC connection is up.
    async fn start(body: &str, upstream: &Upstream) -> Self {
        Self::start_env(body, upstream, "", &[]).await
    }

    /// As `start`, with more `[server]` lines and environment variables.
    async fn start_env(
        body: &str,
        upstream: &Upstream,
        server_extra: &str,
        env: &[(&str, Option<&str>)],
    ) -> Self {
        let body = body.replace("{upstream}", &upstream.addr.to_string());
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let server = format!("grace_period_secs = 0\nrls_listen = \"{addr}\"\n{server_extra}");
        let gw = Gateway::start_env(&["run"], &body, &server, env).await;
        let url = format!("http://{addr}");
        let client = eventually(Duration::from_secs(10), "the rate-limit service", || {
            let url = url.clone();
            async move { RateLimitServiceClient::connect(url).await.ok() }
        })
        .await;
        Self { gw, client }
    }

    async fn ask(&mut self, req: RateLimitRequest) -> RateLimitResponse {
        self.client
            .should_rate_limit(req)
            .await
            .unwrap_or_else(|s| panic!("{s:?}\n{}", self.gw.log()))
            .into_inner()
    }
}

/// A descriptor of `(key, value)` entries.
fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request as Envoy sends it: one descriptor per rate-limit action.
fn request(descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}

/// `response_headers_to_add` as `name: value`.
fn added(r: &RateLimitResponse, name: &str) -> String {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.clone())
        .unwrap_or_default()
}

/// The remaining count of every status (one per descriptor).
fn remaining(r: &RateLimitResponse) -> Vec<u32> {
    r.statuses.iter().map(|s| s.limit_remaining).collect()
}

fn route() -> &'static str {
    "[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"{upstream}\"]\nauth = \"optional\"\n"
}

/// The `ip` scope counts `remote_address`: OK with the window and the headers while under
/// the limit, then OVER_LIMIT with `duration_until_reset`, `Retry-After` and the proxy's
/// 429 body; another address has its own bucket; the domain plays no part.
#[tokio::test]
async fn ip_descriptor_counts_the_address_until_over_limit() {
    let up = Upstream::start("rls").await;
    let body = format!("[limits.ip]\nper_minute = 3\n\n{}", route());
    let mut rls = Rls::start(&body, &up).await;
    let ip = [("remote_address", "198.51.100.7")];
    for left in [2, 1, 0] {
        let r = rls.ask(request(&[&ip])).await;
        assert_eq!(r.overall_code(), Code::Ok);
        assert_eq!(remaining(&r), [left]);
        let limit = r.statuses[0].current_limit.clone().unwrap();
        assert_eq!((limit.name.as_str(), limit.requests_per_unit), ("ip-1m", 3));
        assert_eq!(added(&r, "x-ratelimit-limit"), "3");
        assert_eq!(added(&r, "x-ratelimit-remaining"), left.to_string());
        assert!(added(&r, "x-ratelimit-reset").parse::<u64>().unwrap() > 1_700_000_000);
        assert_eq!(added(&r, "retry-after"), "");
    }
    let mut other_domain = request(&[&ip]);
    other_domain.domain = "another".into();
    let r = rls.ask(other_domain).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    let s = &r.statuses[0];
    assert_eq!(s.code(), Code::OverLimit);
    assert_eq!(s.limit_remaining, 0);
    let reset = s.duration_until_reset.unwrap();
    assert!(reset.seconds > 0 && reset.seconds <= 60, "{reset:?}");
    let retry: u64 = added(&r, "retry-after").parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(added(&r, "x-ratelimit-remaining"), "0");
    assert_eq!(added(&r, "content-type"), "application/json");
    let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
    assert_eq!(body["error"], "rate_limit_exceeded");
    assert_eq!(
        (body["scope"].as_str(), body["window"].as_str()),
        (Some("ip"), Some("1m"))
    );
    let r = rls
        .ask(request(&[&[("remote_address", "198.51.100.8")]]))
        .await;
    assert_eq!((r.overall_code(), remaining(&r)), (Code::Ok, vec![2]));
}

/// `api_key` (hashed and looked up as the proxy does) and `key_id` name the same key and
/// spend one bucket; each descriptor gets its own status (the address alone has no limit
/// here); an unknown key is denied.
#[tokio::test]
async fn key_descriptors_spend_the_key_bucket() {
    let up = Upstream::start("rls").await;
    let body = format!(
        "[tiers.free]\nkey = {{ per_minute = 3 }}\n\n[[keys]]\nid = \"k_rls\"\nkey = \"rls-key-1\"\ntenant = \"acme\"\ntier = \"free\"\n\n{}",
        route()
    );
    let mut rls = Rls::start(&body, &up).await;
    let ip = [("remote_address", "198.51.100.20")];
    let r = rls
        .ask(request(&[&ip, &[ip[0], ("api_key", "rls-key-1")]]))
        .await;
    assert_eq!((r.overall_code(), remaining(&r)), (Code::Ok, vec![0, 2]));
    assert_eq!(r.statuses[0].current_limit, None);
    assert_eq!(r.statuses[1].current_limit.clone().unwrap().name, "key-1m");
    // Another address, the same key: the key bucket is the key's, not the address's.
    let other = [("remote_address", "198.51.100.21"), ("key_id", "k_rls")];
    let r = rls.ask(request(&[&other])).await;
    assert_eq!((r.overall_code(), remaining(&r)), (Code::Ok, vec![1]));
    let r = rls.ask(request(&[&ip, &[("key_id", "k_rls")]])).await;
    assert_eq!(remaining(&r), [0, 0]);
    let r = rls
        .ask(request(&[&ip, &[ip[0], ("api_key", "rls-key-1")]]))
        .await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert_eq!(r.statuses[0].code(), Code::Ok);
    assert_eq!(r.statuses[1].code(), Code::OverLimit);
    assert_eq!(r.statuses[1].current_limit.clone().unwrap().name, "key-1m");
    for unknown in [("api_key", "not-a-key"), ("key_id", "k_nope")] {
        let r = rls.ask(request(&[&ip, &[ip[0], unknown]])).await;
        assert_eq!(r.overall_code(), Code::OverLimit, "{unknown:?}");
        let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
        assert_eq!(body["error"], "invalid_api_key");
    }
}

/// `hits_addend` is the cost (0 means 1), a descriptor's own overriding the request's.
#[tokio::test]
async fn hits_addend_is_the_cost() {
    let up = Upstream::start("rls").await;
    let body = format!("[limits.ip]\nper_minute = 10\n\n{}", route());
    let mut rls = Rls::start(&body, &up).await;
    let ip: &[(&str, &str)] = &[("remote_address", "198.51.100.30")];
    let mut r4 = request(&[ip]);
    r4.hits_addend = 4;
    assert_eq!(remaining(&rls.ask(r4).await), [6]);
    let mut r5 = request(&[ip]);
    r5.descriptors[0].hits_addend = Some(UInt64Value { value: 5 });
    assert_eq!(remaining(&rls.ask(r5).await), [1]);
    assert_eq!(remaining(&rls.ask(request(&[ip])).await), [0]);
    let r = rls.ask(request(&[ip])).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
    assert_eq!(body["scope"], "ip");
}

/// One state: requests through the proxy and RLS calls for the same client and key drain
/// the same buckets, whichever way they come.
#[tokio::test]
async fn proxy_and_rls_share_the_buckets() {
    let up = Upstream::start("rls").await;
    let body = format!(
        "[tiers.free]\nkey = {{ per_minute = 4 }}\n\n[[keys]]\nid = \"k_shared\"\nkey = \"shared-key\"\ntenant = \"acme\"\ntier = \"free\"\n\n{}",
        route()
    );
    let mut rls = Rls::start(&body, &up).await;
    let (http, url) = (client(), rls.gw.url("/x"));
    let through_proxy = || async {
        let r = http
            .get(&url)
            .header("x-api-key", "shared-key")
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), header(&r, "x-ratelimit-remaining"))
    };
    assert_eq!(through_proxy().await, (200, "3".into()));
    let key = [("remote_address", "127.0.0.1"), ("api_key", "shared-key")];
    assert_eq!(remaining(&rls.ask(request(&[&key])).await), [2]);
    assert_eq!(through_proxy().await, (200, "1".into()));
    assert_eq!(remaining(&rls.ask(request(&[&key])).await), [0]);
    assert_eq!(through_proxy().await.0, 429);
    let r = rls.ask(request(&[&key])).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
}

/// On Redis the calls are decided in Redis (the ip key is there, named by the address)
/// and counted as on the proxy.
#[tokio::test]
async fn decides_on_the_redis_store() {
    require_redis();
    let redis = RedisServer::start().await;
    let up = Upstream::start("rls").await;
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 2000\non_failure = \"closed\"\nkey_prefix = \"rls\"\n\n[limits.ip]\nper_minute = 3\nadmission = \"exact\"\n\n{}",
        redis.url(),
        route()
    );
    let mut rls = Rls::start(&body, &up).await;
    let ip = [("remote_address", "198.51.100.40")];
    for left in [2, 1, 0] {
        assert_eq!(remaining(&rls.ask(request(&[&ip])).await), [left]);
    }
    assert_eq!(
        rls.ask(request(&[&ip])).await.overall_code(),
        Code::OverLimit
    );
    let mut c = redis.client().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("rls:*")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(
        keys.iter().any(|k| k == "rls:{ip:198.51.100.40}:1m"),
        "{keys:?}"
    );
}

/// A malformed request is INVALID_ARGUMENT with a message naming the problem, and the
/// service keeps answering.
#[tokio::test]
async fn malformed_requests_are_invalid_argument() {
    let up = Upstream::start("rls").await;
    let mut rls = Rls::start(&format!("[limits.ip]\nper_minute = 5\n\n{}", route()), &up).await;
    let ip = ("remote_address", "198.51.100.50");
    let cases: Vec<(RateLimitRequest, &str)> = vec![
        (request(&[]), "no descriptors"),
        (
            request(&[&[("remote_address", "not-an-ip")]]),
            "is not an IP address",
        ),
        (
            request(&[&[ip, ("route", "nope")]]),
            "unknown route \"nope\"",
        ),
        (
            request(&[&[ip, ("remote_address", "198.51.100.51")]]),
            "two different remote_address values",
        ),
        (request(&[&[ip, ("path", "/x")]]), "unknown entry \"path\""),
        (request(&[&[ip, ("tenant", "nobody")]]), "unknown tenant"),
    ];
    for (req, want) in cases {
        let status = rls.client.should_rate_limit(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{want}");
        assert!(status.message().contains(want), "{}", status.message());
    }
    let r = rls.ask(request(&[&[ip]])).await;
    assert_eq!((r.overall_code(), remaining(&r)), (Code::Ok, vec![4]));
}

/// A blocked address is OVER_LIMIT (the protocol has no other denial), with the 403 body
/// and no window; the address next to it is not blocked.
#[tokio::test]
async fn blocked_ip_is_over_limit() {
    let up = Upstream::start("rls").await;
    let body = format!(
        "[limits.ip]\nper_minute = 5\n\n[[blocks]]\nscope = \"ip\"\nvalue = \"203.0.113.0/24\"\n\n{}",
        route()
    );
    let mut rls = Rls::start(&body, &up).await;
    let r = rls
        .ask(request(&[&[("remote_address", "203.0.113.9")]]))
        .await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert_eq!(r.statuses[0].current_limit, None);
    assert_eq!(r.raw_body, br#"{"error":"blocked","scope":"ip"}"#);
    let r = rls
        .ask(request(&[&[("remote_address", "203.0.114.9")]]))
        .await;
    assert_eq!(r.overall_code(), Code::Ok);
}

/// `[server] check_token`: a call without `authorization: Bearer <token>` metadata, or
/// with a wrong one, is `UNAUTHENTICATED` and spends nothing; with it the call is decided.
/// Calls naming a `key_id` or a `tenant` (no secret) are refused as over the limit but
/// never ban that key or tenant (`from_check` is off): its proxied requests get 429, not
/// 403.
#[tokio::test]
async fn check_token_guards_the_rls_and_calls_do_not_ban() {
    let up = Upstream::start("rls").await;
    let body = format!(
        r#"
[tiers.free]
key = {{ per_minute = 1, ban = {{ after = 2, within_secs = 60, for_secs = 600 }} }}
tenant = {{ per_minute = 50, ban = {{ after = 2, within_secs = 60, for_secs = 600 }} }}

[[keys]]
id = "k1"
key = "key-one-secret"
tenant = "acme"
tier = "free"

[[tenants]]
id = "acme"
tier = "free"

{}"#,
        route()
    );
    let env = [("THROTTLE_RLS_TOKEN_T", Some("rls-s3cret-0123456789"))];
    let server = "check_token = \"${THROTTLE_RLS_TOKEN_T}\"";
    let mut rls = Rls::start_env(&body, &up, server, &env).await;
    let victim = [("remote_address", "198.51.100.7"), ("key_id", "k1")];
    let call = |auth: Option<&str>, hits: u32| {
        let mut req = tonic::Request::new(RateLimitRequest {
            hits_addend: hits,
            ..request(&[&victim])
        });
        if let Some(a) = auth {
            req.metadata_mut()
                .insert("authorization", a.parse().unwrap());
        }
        req
    };
    for auth in [None, Some("Bearer wrong"), Some("rls-s3cret-0123456789")] {
        let status = rls
            .client
            .should_rate_limit(call(auth, 1))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{auth:?}");
    }
    // Authorized: the key's one request a minute is still there, then over the limit;
    // a huge cost (the attack) too, as often as the caller likes.
    let ok = Some("Bearer rls-s3cret-0123456789");
    let r = rls
        .client
        .should_rate_limit(call(ok, 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code(), Code::Ok);
    for _ in 0..4 {
        let r = rls
            .client
            .should_rate_limit(call(ok, 1_000))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code(), Code::OverLimit);
    }
    // No ban: the key's own proxied request is limited (429), not banned (403).
    let r = client()
        .get(rls.gw.url("/x"))
        .header("x-api-key", "key-one-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let m = rls.gw.metrics().await;
    assert!(
        !m.lines()
            .any(|l| l.starts_with("throttle_bans_total") && !l.ends_with(" 0")),
        "{m}"
    );
}

/// `[rls] on_failure` decides a descriptor when Redis cannot: `closed` answers
/// OVER_LIMIT, `open` OK (no limit applied); the service keeps answering either way.
#[tokio::test]
async fn configured_descriptors_follow_on_failure_when_redis_is_away() {
    let up = Upstream::start("rls").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(
        &yaml,
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
    )
    .unwrap();
    // Nothing listens there: every store call fails at once.
    let dead = format!("redis://127.0.0.1:{}", free_port());
    for (policy, want) in [("closed", Code::OverLimit), ("open", Code::Ok)] {
        let body = format!(
            "[store]\nbackend = \"redis\"\nurl = \"{dead}\"\ntimeout_ms = 50\n\n[rls]\nconfig = \"{}\"\non_failure = \"{policy}\"\n\n{}",
            yaml.display(),
            route()
        );
        let mut rls = Rls::start(&body, &up).await;
        for _ in 0..3 {
            let r = rls.ask(request(&[&[("user", "alice")]])).await;
            assert_eq!(r.overall_code(), want, "{policy}: {r:?}\n{}", rls.gw.log());
        }
    }
}

/// One call spends each shared scope once, whatever its number of descriptors: three
/// descriptors of one address cost the `ip` limit 1 (not 3), and three descriptors of
/// different callers cost `[limits.global]` 1; a second address in the same call has its
/// own `ip` unit. Fails when each descriptor spends the shared scopes on its own.
#[tokio::test]
async fn one_call_spends_shared_scopes_once() {
    let up = Upstream::start("rls").await;
    let keys = "[tiers.free]\nkey = { per_minute = 50 }\n\n[[keys]]\nid = \"k1\"\nkey = \"key-one\"\ntenant = \"acme\"\ntier = \"free\"\n";
    let body = format!("[limits.ip]\nper_minute = 10\n\n{keys}\n{}", route());
    let mut rls = Rls::start(&body, &up).await;
    let (a, b) = (
        ("remote_address", "198.51.100.60"),
        ("remote_address", "198.51.100.61"),
    );
    let r = rls
        .ask(request(&[
            &[a],
            &[a, ("key_id", "k1")],
            &[a, ("route", "api")],
            &[b],
        ]))
        .await;
    assert_eq!(r.overall_code(), Code::Ok);
    // The address alone, next: 10 - 1 (the call) - 1 (this one).
    assert_eq!(remaining(&rls.ask(request(&[&[a]])).await), [8]);
    assert_eq!(remaining(&rls.ask(request(&[&[b]])).await), [8]);

    let body = format!("[limits.global]\nper_minute = 20\n\n{keys}\n{}", route());
    let mut rls = Rls::start(&body, &up).await;
    let r = rls
        .ask(request(&[
            &[a],
            &[("key_id", "k1")],
            &[b],
            &[("tenant", "acme")],
        ]))
        .await;
    assert_eq!(r.overall_code(), Code::Ok);
    let r = rls.ask(request(&[&[a]])).await;
    assert_eq!(
        r.statuses[0].current_limit.clone().unwrap().name,
        "global-1m"
    );
    assert_eq!(remaining(&r), [18], "20 - 1 (the call) - 1 (this one)");
}

/// A descriptor without `remote_address` is decided, not INVALID_ARGUMENT: a valid
/// `api_key` is looked up and admitted, an unknown one is OVER_LIMIT 401 and counted in
/// `throttle_rls_unmetered_lookups_total`, a tenant alone is limited at its tier, and a
/// blocked key or tenant is OVER_LIMIT with the 403 body.
#[tokio::test]
async fn descriptors_without_remote_address_are_decided() {
    let up = Upstream::start("rls").await;
    let body = format!(
        r#"[tiers.free]
key = {{ per_minute = 5 }}
tenant = {{ per_hour = 40 }}

[[keys]]
id = "k_good"
key = "good-key"
tenant = "acme"
tier = "free"

[[keys]]
id = "k_bad"
key = "blocked-key"
tenant = "acme"
tier = "free"

[[keys]]
id = "k_evil"
key = "evil-key"
tenant = "evil"
tier = "free"

[[blocks]]
scope = "key"
value = "k_bad"

[[blocks]]
scope = "tenant"
value = "evil"

{}"#,
        route()
    );
    let mut rls = Rls::start(&body, &up).await;
    let r = rls.ask(request(&[&[("api_key", "good-key")]])).await;
    assert_eq!((r.overall_code(), remaining(&r)), (Code::Ok, vec![4]));
    assert_eq!(r.statuses[0].current_limit.clone().unwrap().name, "key-1m");
    let r = rls.ask(request(&[&[("tenant", "acme")]])).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(
        r.statuses[0].current_limit.clone().unwrap().name,
        "tenant-1h"
    );
    assert_eq!(remaining(&r), [38], "the key's call and this one");
    let r = rls.ask(request(&[&[("api_key", "not-a-key")]])).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
    assert_eq!(body["error"], "invalid_api_key");
    let metrics = rls.gw.metrics().await;
    assert!(
        metrics.contains("throttle_rls_unmetered_lookups_total 1"),
        "{metrics}"
    );
    for (entry, scope) in [
        (("api_key", "blocked-key"), "key"),
        (("key_id", "k_bad"), "key"),
        (("tenant", "evil"), "tenant"),
        (("api_key", "evil-key"), "tenant"),
    ] {
        let r = rls.ask(request(&[&[entry]])).await;
        assert_eq!(r.overall_code(), Code::OverLimit, "{entry:?}");
        let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": "blocked", "scope": scope})
        );
    }
}

/// A tenant made through the admin API, with no key yet, is known to the rate-limit
/// service at once: its `tenant` descriptor is limited at the tier the tenants table
/// gives it (not refused as unknown, which Envoy's default would let through unlimited).
#[tokio::test(flavor = "multi_thread")]
async fn an_admin_made_tenant_is_known_at_once() {
    let Some(db) = crate::support::postgres::TestDb::migrated() else {
        return;
    };
    let up = Upstream::start("rls").await;
    let body = format!(
        "[database]\nurl = \"{}\"\n\n[tiers.free]\nkey = {{ per_minute = 5 }}\ntenant = {{ per_hour = 2 }}\n\n{}",
        db.url,
        route()
    );
    let mut rls = Rls::start(&body, &up).await;
    let unknown = rls
        .client
        .should_rate_limit(request(&[&[("tenant", "newco")]]))
        .await;
    assert!(unknown.is_err(), "no such tenant yet: {unknown:?}");
    let made = client()
        .post(rls.gw.admin_url("/v1/tenants"))
        .bearer_auth(crate::support::ADMIN_TOKEN)
        .json(&serde_json::json!({"id": "newco", "tier": "free"}))
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), 201);
    let codes: Vec<Code> = {
        let mut codes = Vec::new();
        for _ in 0..3 {
            let r = rls.ask(request(&[&[("tenant", "newco")]])).await;
            codes.push(r.overall_code());
        }
        codes
    };
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
}
