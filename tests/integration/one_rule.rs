//! One rule written once: the admin API, `POST /v1/check` and the RLS read a bearer token
//! the same way (`Secret::authorizes`).

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use crate::support::{client, eventually, free_port, Gateway, Upstream, ADMIN_TOKEN};

const CHECK_TOKEN: &str = "check-s3cret-0123456";

/// How a token is presented: every `Authorization` value sent, `{}` standing for the
/// token; and whether each of the three APIs must take it.
const PRESENTED: &[(&[&str], bool)] = &[
    (&["Bearer {}"], true),
    // The scheme is case-insensitive (RFC 9110 §11.1).
    (&["bearer {}"], true),
    (&["BEARER {}"], true),
    // One or more spaces after it (RFC 6750 §2.1: `"Bearer" 1*SP b64token`).
    (&["Bearer  {}"], true),
    // Not a tab, not no space, nothing after the token.
    (&["Bearer\t{}"], false),
    (&["Bearer{}"], false),
    (&["Bearer {} x"], false),
    // Exactly one value: two, even both right, are not one credential.
    (&["Bearer {}", "Bearer {}"], false),
    (&["Bearer wrong-token-000000", "Bearer {}"], false),
    (&[], false),
];

fn values(presented: &[&str], token: &str) -> Vec<String> {
    presented.iter().map(|p| p.replace("{}", token)).collect()
}

/// The admin token (`GET /v1/top?scope=ip`), the check token (`POST /v1/check`) and the RLS's
/// `authorization` metadata each accept and refuse the same presentations.
#[tokio::test(flavor = "multi_thread")]
async fn admin_check_and_rls_read_a_bearer_token_alike() {
    let up = Upstream::start("u").await;
    let body = format!(
        "[limits.ip]\nper_minute = 1000\n\n[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"{}\"]\nauth = \"optional\"\n",
        up.addr
    );
    let rls_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let server = format!(
        "grace_period_secs = 0\nrls_listen = \"{rls_addr}\"\ncheck_token = \"${{THROTTLE_ONE_RULE_TOKEN}}\""
    );
    let env = [("THROTTLE_ONE_RULE_TOKEN", Some(CHECK_TOKEN))];
    let gw = Gateway::start_env(&["run"], &body, &server, &env).await;
    let url = format!("http://{rls_addr}");
    let mut rls = eventually(Duration::from_secs(10), "the rate-limit service", || {
        let url = url.clone();
        async move { RateLimitServiceClient::connect(url).await.ok() }
    })
    .await;
    let c = client();
    for (presented, want) in PRESENTED {
        // The admin API.
        let mut r = c.get(gw.admin_url("/v1/top?scope=ip"));
        for v in values(presented, ADMIN_TOKEN) {
            r = r.header("authorization", v);
        }
        let status = r.send().await.unwrap().status();
        assert_eq!(status == 200, *want, "admin {presented:?}: {status}");
        // `POST /v1/check`.
        let mut r = c
            .post(gw.admin_url("/v1/check"))
            .json(&serde_json::json!({"ip": "198.51.100.20"}));
        for v in values(presented, CHECK_TOKEN) {
            r = r.header("authorization", v);
        }
        let status = r.send().await.unwrap().status();
        assert_eq!(status == 200, *want, "/v1/check {presented:?}: {status}");
        // The RLS.
        let mut req = tonic::Request::new(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".into(),
                    value: "198.51.100.21".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        });
        for v in values(presented, CHECK_TOKEN) {
            req.metadata_mut()
                .append("authorization", v.parse().unwrap());
        }
        match rls.should_rate_limit(req).await {
            Ok(r) => {
                assert!(*want, "RLS {presented:?} was let in");
                assert_eq!(r.into_inner().overall_code(), Code::Ok);
            }
            Err(s) => {
                assert!(!*want, "RLS {presented:?}: {s:?}");
                assert_eq!(s.code(), tonic::Code::Unauthenticated, "{presented:?}");
            }
        }
    }
}
