//! The adapter over the pipeline, without a process or a socket: a memory store on a
//! manual clock, requests as Envoy builds them.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tonic::Code as GrpcCode;

use super::*;
use crate::clock::ManualClock;
use crate::metrics::Metrics;
use crate::store::MemoryStore;

const CONFIG: &str = r#"
[limits.ip]
per_minute = 100

[tiers.free]
key = { per_minute = 3 }
tenant = { per_hour = 4 }

[[keys]]
id = "k1"
key = "key-one"
tenant = "acme"
tier = "free"

[[keys]]
id = "k2"
key = "key-two"
tenant = "other"
tier = "free"

[[routes]]
name = "heavy"
path_prefix = "/heavy"
upstreams = ["127.0.0.1:1"]
auth = "optional"
cost = 2

[[routes]]
name = "private"
path_prefix = "/private"
upstreams = ["127.0.0.1:1"]
auth = "required"
"#;

fn rls() -> Rls {
    let config = crate::config::parse("t.toml", CONFIG).unwrap();
    let core = Core::with_clock(
        admission::Runtime::from_config(config).unwrap(),
        Arc::new(MemoryStore::with_clock(ManualClock::at(1_764_000_000_000))),
        Arc::new(Metrics::new().unwrap()),
        Arc::new(ManualClock::at(1_764_000_000_000)),
    )
    .unwrap();
    Rls::new(Arc::new(core))
}

/// One descriptor with `entries`, plus `remote_address` 10.0.0.1.
fn one(entries: &[(&str, &str)]) -> RateLimitRequest {
    let mut all = vec![("remote_address", "10.0.0.1")];
    all.extend_from_slice(entries);
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: all
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// (overall code, governing limit name, remaining).
async fn ask(rls: &Rls, req: &RateLimitRequest) -> (Code, String, u32) {
    let r = rls.decide(req).await.unwrap();
    let s = &r.statuses[0];
    let name = s
        .current_limit
        .as_ref()
        .map_or(String::new(), |l| l.name.clone());
    (r.overall_code(), name, s.limit_remaining)
}

fn body(r: &RateLimitResponse) -> serde_json::Value {
    serde_json::from_slice(&r.raw_body).unwrap()
}

/// `api_key` and `key_id` of one key spend one bucket.
#[tokio::test]
async fn api_key_and_key_id_share_the_key_bucket() {
    let rls = rls();
    assert_eq!(
        ask(&rls, &one(&[("api_key", "key-one")])).await,
        (Code::Ok, "key-1m".into(), 2)
    );
    assert_eq!(ask(&rls, &one(&[("key_id", "k1")])).await.2, 1);
    assert_eq!(ask(&rls, &one(&[("api_key", "key-one")])).await.2, 0);
    let (code, name, _) = ask(&rls, &one(&[("key_id", "k1")])).await;
    assert_eq!((code, name.as_str()), (Code::OverLimit, "key-1m"));
}

/// A tenant alone spends its tenant limits only; a key of that tenant shares them.
#[tokio::test]
async fn tenant_alone_spends_the_tenant_scope() {
    let rls = rls();
    for remaining in [3, 2, 1] {
        let got = ask(&rls, &one(&[("tenant", "acme")])).await;
        assert_eq!(got, (Code::Ok, "tenant-1h".into(), remaining));
    }
    assert_eq!(ask(&rls, &one(&[("key_id", "k1")])).await.0, Code::Ok);
    let (code, name, _) = ask(&rls, &one(&[("tenant", "acme")])).await;
    assert_eq!((code, name.as_str()), (Code::OverLimit, "tenant-1h"));
}

/// A route gives the cost when hits_addend is 0; hits_addend overrides it.
#[tokio::test]
async fn route_cost_unless_hits_addend() {
    let rls = rls();
    let mut req = one(&[("api_key", "key-two"), ("route", "heavy")]);
    assert_eq!(ask(&rls, &req).await.2, 1);
    req.hits_addend = 1;
    assert_eq!(ask(&rls, &req).await.2, 0);
}

/// Denials that are not rate limits are OVER_LIMIT with the proxy's body; an unknown
/// key id is an invalid key.
#[tokio::test]
async fn auth_refusals_are_over_limit() {
    let rls = rls();
    let r = rls.decide(&one(&[("route", "private")])).await.unwrap();
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert_eq!(body(&r)["error"], "missing_api_key");
    let r = rls.decide(&one(&[("key_id", "nope")])).await.unwrap();
    assert_eq!(body(&r)["error"], "invalid_api_key");
    let r = rls.decide(&one(&[("api_key", "wrong")])).await.unwrap();
    assert_eq!(body(&r)["error"], "invalid_api_key");
    // A tenant names an identified caller: enough for `auth = "required"`.
    let r = rls
        .decide(&one(&[("route", "private"), ("tenant", "acme")]))
        .await;
    assert_eq!(r.unwrap().overall_code(), Code::Ok);
}

/// Names the gateway does not know, and a tenant that is not the key's, are malformed.
#[tokio::test]
async fn unknown_names_and_conflicts_are_invalid() {
    let rls = rls();
    for (entries, want) in [
        (vec![("route", "nope")], "unknown route \"nope\""),
        (vec![("tenant", "nobody")], "unknown tenant \"nobody\""),
        (
            vec![("api_key", "key-one"), ("tenant", "other")],
            "tenant \"other\" is not the tenant of the api_key",
        ),
        (
            vec![("key_id", "k2"), ("tenant", "acme")],
            "conflicts with the key's tenant \"other\"",
        ),
    ] {
        let status = rls.decide(&one(&entries)).await.unwrap_err();
        assert_eq!(status.code(), GrpcCode::InvalidArgument, "{entries:?}");
        assert!(status.message().contains(want), "{}", status.message());
    }
    // A matching tenant is fine.
    let r = rls
        .decide(&one(&[("key_id", "k1"), ("tenant", "acme")]))
        .await;
    assert_eq!(r.unwrap().overall_code(), Code::Ok);
}

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

fn many(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    }
}

/// Each descriptor is decided on its own and gets its own status; one over makes the
/// answer OVER_LIMIT and the others consume nothing.
#[tokio::test]
async fn descriptors_are_decided_each_on_its_own() {
    let rls = rls();
    let ip = || descriptor(&[("remote_address", "10.0.0.1")]);
    let key = |k| descriptor(&[("key_id", k)]);
    let r = rls.decide(&many(vec![ip(), key("k1")])).await.unwrap();
    assert_eq!(r.overall_code(), Code::Ok);
    let names: Vec<_> = r
        .statuses
        .iter()
        .map(|s| (s.current_limit.clone().unwrap().name, s.limit_remaining))
        .collect();
    assert_eq!(
        names,
        [("ip-1m".to_string(), 99), ("key-1m".to_string(), 2)]
    );
    // Spend k1's last two.
    for _ in 0..2 {
        assert_eq!(ask(&rls, &one(&[("key_id", "k1")])).await.0, Code::Ok);
    }
    let before = ask(&rls, &one(&[])).await.2;
    let r = rls.decide(&many(vec![ip(), key("k1")])).await.unwrap();
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert_eq!(r.statuses[0].code(), Code::Ok);
    assert_eq!(r.statuses[1].code(), Code::OverLimit);
    assert_eq!(body(&r)["scope"], "key");
    // All or nothing: the ip descriptor that fit was refunded.
    assert_eq!(ask(&rls, &one(&[])).await.2, before - 1);
}

/// A descriptor without remote_address applies no ip limit and is not an error.
#[tokio::test]
async fn a_descriptor_without_an_address_has_no_ip_limit() {
    let rls = rls();
    let r = rls
        .decide(&many(vec![descriptor(&[("key_id", "k2")])]))
        .await
        .unwrap();
    assert_eq!(r.overall_code(), Code::Ok);
    let s = &r.statuses[0];
    assert_eq!(s.current_limit.clone().unwrap().name, "key-1m");
    // The ip bucket of no address was not spent: 10.0.0.1's is full.
    assert_eq!(ask(&rls, &one(&[])).await.2, 99);
    // Only entries no limit applies to: OK without a limit.
    let r = rls
        .decide(&many(vec![descriptor(&[("route", "heavy")])]))
        .await
        .unwrap();
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(r.statuses[0].current_limit, None);
}

/// With `[rls] config`: `throttle_rls_decisions_total{domain,code}` by the configured
/// domain (an unknown one is `unknown`, never the request's text), and
/// `throttle_rls_descriptor_total` by the config path of a `detailed_metric` limit only,
/// never its runtime value.
#[tokio::test]
async fn configured_decisions_are_counted_by_config_names() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/rls/metrics");
    let body = format!(
        "[rls]\nconfig = \"{dir}\"\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\n"
    );
    let config = crate::config::parse("t.toml", &body).unwrap();
    let metrics = Arc::new(Metrics::new().unwrap());
    let core = Core::with_clock(
        admission::Runtime::from_config(config).unwrap(),
        Arc::new(MemoryStore::with_clock(ManualClock::at(1_764_000_000_000))),
        metrics.clone(),
        Arc::new(ManualClock::at(1_764_000_000_000)),
    )
    .unwrap();
    let rls = Rls::new(Arc::new(core));
    let ask = |domain: &str, entries: &[(&str, &str)]| RateLimitRequest {
        domain: domain.into(),
        ..many(vec![descriptor(entries)])
    };
    let r = rls
        .decide(&ask("edge", &[("user", "alice")]))
        .await
        .unwrap();
    assert_eq!(r.overall_code(), Code::Ok);
    let r = rls
        .decide(&ask("edge", &[("user", "alice")]))
        .await
        .unwrap();
    assert_eq!(r.overall_code(), Code::OverLimit);
    let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
    assert_eq!(
        (body["error"].as_str(), body["limit"].as_u64()),
        (Some("rate_limited"), Some(1))
    );
    rls.decide(&ask("edge", &[("plain", "x")])).await.unwrap();
    rls.decide(&ask("attacker-chosen", &[("user", "alice")]))
        .await
        .unwrap();
    let text = String::from_utf8(metrics.render()).unwrap();
    for want in [
        r#"throttle_rls_decisions_total{code="ok",domain="edge"} 2"#,
        r#"throttle_rls_decisions_total{code="over_limit",domain="edge"} 1"#,
        r#"throttle_rls_decisions_total{code="ok",domain="unknown"} 1"#,
        r#"throttle_rls_descriptor_total{code="ok",descriptor="user",domain="edge"} 1"#,
        r#"throttle_rls_descriptor_total{code="over_limit",descriptor="user",domain="edge"} 1"#,
    ] {
        assert!(text.contains(want), "{want} missing from\n{text}");
    }
    assert!(
        !text.contains("alice") && !text.contains("attacker-chosen"),
        "{text}"
    );
    assert!(
        !text.contains(r#"descriptor="plain""#),
        "not detailed: {text}"
    );
}
