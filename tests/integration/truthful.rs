//! Ready means ready (issue 34), the parts that make answers tell the truth: a reload
//! lists every setting it does not apply, `PUT /v1/policies` refuses what the gateways
//! would refuse, a concurrency 429 is logged with its scope and window, the JWT
//! verifier's counters are metrics. Real gateway, real PostgreSQL, real JWKS server.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::jwt::{jwks, now_secs, JwksServer, RsaKey};
use crate::support::postgres::TestDb;
use crate::support::tls::TestCa;
use crate::support::{client, eventually, Gateway, Upstream, ADMIN_TOKEN};

const ROUTE: &str = r#"
[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
"#;

/// `POST /v1/reload`: (status, body).
async fn reload(gw: &Gateway) -> (u16, Value) {
    let r = client()
        .post(gw.admin_url("/v1/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// `store.lease_ms`, `store.concurrency_lease_secs` and adding `server.tls` are fixed at
/// start: a reload lists them in `needs_restart` (and keeps listing them on the next
/// reload, which changes something else), and the listener stays plain HTTP.
#[tokio::test(flavor = "multi_thread")]
async fn reload_lists_lease_settings_and_added_tls() {
    let up = Upstream::start("u").await;
    let route = ROUTE.replace("{upstream}", &up.addr.to_string());
    let gw = Gateway::start(&route, None).await;
    gw.rewrite(&format!(
        "[store]\nlease_ms = 200\nconcurrency_lease_secs = 10\n{route}"
    ));
    let (s, body) = reload(&gw).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["reloaded"], true);
    assert_eq!(
        body["needs_restart"],
        json!(["store.lease_ms", "store.concurrency_lease_secs"])
    );

    let ca = TestCa::new();
    let certs = tempfile::tempdir().unwrap();
    TestCa::write(&ca.leaf(), certs.path());
    let path = gw.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    let tls = format!(
        "[server]\ntls = {{ cert = \"{0}/cert.pem\", key = \"{0}/key.pem\" }}\n",
        certs.path().display()
    );
    std::fs::write(&path, text.replacen("[server]\n", &tls, 1)).unwrap();
    let (s, body) = reload(&gw).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(
        body["needs_restart"],
        json!([
            "server.tls",
            "store.lease_ms",
            "store.concurrency_lease_secs"
        ])
    );
    // The old behaviour goes on: the listener still speaks plain HTTP.
    let r = client().get(gw.url("/x")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// The tier `free` (100/min) in a config whose costliest route costs 5.
fn policy_config(db_url: &str) -> String {
    format!(
        r#"
[database]
url = "{db_url}"

[tiers.free]
key = {{ per_minute = 100 }}

[[routes]]
name = "heavy"
path_prefix = "/heavy"
upstreams = ["{{upstream}}"]
cost = 5

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{{upstream}}"]
"#
    )
}

/// `PUT /v1/policies/{id}` with a window below the costliest route's `cost` (what every
/// gateway refuses when it reads the row): 400 naming the column, nothing written, the
/// old limit stays in force. A row the gateways take is still written.
#[tokio::test(flavor = "multi_thread")]
async fn policy_put_refuses_what_gateways_refuse() {
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw = Gateway::start(&policy_config(&db.url), Some(&up)).await;
    eventually(Duration::from_secs(10), "database connected", || async {
        (gw.readyz().await["database"]["healthy"] == true).then_some(())
    })
    .await;
    let call = |method: &str, path: &str, body: Option<Value>| {
        let mut r = client()
            .request(method.parse().unwrap(), gw.admin_url(path))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let r = r.send().await.unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (s, created) = call(
        "POST",
        "/v1/keys",
        Some(json!({"tenant": "t", "tier": "free"})),
    )
    .await;
    assert_eq!(s, 201, "{created}");
    let key = created["key"].as_str().unwrap().to_string();
    let limit = || async {
        let r = client()
            .get(gw.url("/x"))
            .header("x-api-key", &key)
            .send()
            .await
            .unwrap();
        crate::support::header(&r, "x-ratelimit-limit")
    };
    assert_eq!(limit().await, "100");
    let row = |per_minute: u64| {
        json!({"req_per_second": 0, "req_per_minute": per_minute, "req_per_hour": 0,
               "req_per_day": 0, "req_per_month": 0, "burst_multiplier": 1.0})
    };
    let (s, body) = call("PUT", "/v1/policies/free", Some(row(3))).await;
    assert_eq!(s, 400, "{body}");
    assert_eq!(body["error"], "invalid_request", "{body}");
    assert_eq!(body["field"], "req_per_minute", "{body}");
    assert!(body["detail"].as_str().unwrap().contains('5'), "{body}");
    let (_, stored) = call("GET", "/v1/policies/free", None).await;
    assert_eq!(stored["req_per_minute"], 100, "{stored}");
    assert_eq!(limit().await, "100", "the old limit stays in force");

    let (s, body) = call("PUT", "/v1/policies/free", Some(row(10))).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(limit().await, "10");
}

/// A concurrency 429 is logged with its scope and `"window":"concurrent"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_429_is_logged_with_scope_and_window() {
    let up = Upstream::start("u").await;
    let body = r#"
[tiers.t]
key = { per_minute = 1000, concurrent = 1 }

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]

[[keys]]
id = "k1"
key = "conc-secret"
tenant = "acme"
tier = "t"
"#
    .replace("{upstream}", &up.addr.to_string());
    let gw = Gateway::start_full(
        &["run"],
        &body,
        "grace_period_secs = 0\naccess_log = \"access.log\"",
    )
    .await;
    // A quick request may hold the one slot at the moment the slow one arrives (the slow
    // one is then the 429): try again until the slow one holds it and a quick one is
    // refused.
    let mut refused = false;
    for _ in 0..5 {
        let slow = tokio::spawn({
            let url = gw.url("/slow?delay_ms=4000");
            async move {
                let r = client().get(url).header("x-api-key", "conc-secret");
                r.send().await.unwrap().status().as_u16()
            }
        });
        while !slow.is_finished() {
            let r = client()
                .get(gw.url("/quick"))
                .header("x-api-key", "conc-secret")
                .send()
                .await
                .unwrap();
            if r.status() == 429 {
                refused = true;
                break;
            }
        }
        if refused {
            assert_eq!(slow.await.unwrap(), 200);
            break;
        }
    }
    assert!(refused, "no concurrency 429 in 5 tries");
    let path = gw.config_path().parent().unwrap().join("access.log");
    let line = eventually(Duration::from_secs(10), "the 429's log line", || {
        let path = path.clone();
        async move {
            let text = std::fs::read_to_string(&path).ok()?;
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .find(|v| v["status"] == 429)
        }
    })
    .await;
    assert_eq!(line["scope"], "key", "{line}");
    assert_eq!(line["window"], "concurrent", "{line}");
    assert_eq!(line["key_id"], "k1", "{line}");
}

/// The value of the unlabelled series `name` in `gw`'s /metrics.
async fn series(gw: &Gateway, name: &str) -> Option<u64> {
    let m = gw.metrics().await;
    let prefix = format!("{name} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// The JWT verifier's counters are `throttle_jwt_*` metrics without labels: a token of an
/// unknown kid counts a kid miss, a JWKS that stops parsing counts fetch failures.
#[tokio::test(flavor = "multi_thread")]
async fn jwt_counters_are_metrics() {
    let (k1, k2) = (RsaKey::new(0, "k1"), RsaKey::new(2, "k2"));
    let idp = JwksServer::start(jwks(&[&k1])).await;
    let up = Upstream::start("u").await;
    let body = format!(
        "[tiers.free]\nkey = {{ per_minute = 100 }}\n\n[auth.jwt]\nalgorithms = [\"RS256\"]\njwks_url = \"{}\"\njwks_refresh_secs = 1\ndefault_tier = \"free\"\n\n[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"{}\"]\nauth = \"required\"\n",
        idp.url(),
        up.addr
    );
    let gw = Gateway::start(&body, None).await;
    let now = now_secs();
    let claims = json!({"sub": "u", "iat": now, "exp": now + 3600});
    let call = |token: String| {
        let url = gw.url("/x");
        async move {
            let r = client().get(url).bearer_auth(token).send().await.unwrap();
            r.status().as_u16()
        }
    };
    eventually(
        Duration::from_secs(20),
        "a valid token admitted",
        || async { (call(k1.sign(&claims)).await == 200).then_some(()) },
    )
    .await;
    assert!(series(&gw, "throttle_jwt_fetches_total").await >= Some(1));
    assert_eq!(series(&gw, "throttle_jwt_keys").await, Some(1));
    assert_eq!(series(&gw, "throttle_jwt_kid_misses_total").await, Some(0));
    assert_eq!(call(k2.sign(&claims)).await, 401);
    assert_eq!(series(&gw, "throttle_jwt_kid_misses_total").await, Some(1));
    idp.publish(b"not a key set".to_vec());
    eventually(
        Duration::from_secs(10),
        "a failed fetch counted",
        || async {
            (series(&gw, "throttle_jwt_fetch_failures_total").await >= Some(1)).then_some(())
        },
    )
    .await;
    let m = gw.metrics().await;
    assert!(!m.contains("throttle_jwt_fetches_total{"), "no labels: {m}");
}

/// `throttle check` warns (exit 0) about a `cost_header` route without `max_cost` that
/// feeds `[limits.global]`.
#[test]
fn check_warns_about_an_unbounded_cost_on_a_shared_window() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let text = "[limits.global]\nper_minute = 1000\n\n[[routes]]\nname = \"llm\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:9\"]\nauth = \"none\"\ncost_header = \"x-cost\"\n";
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_throttle"))
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: route \"llm\" has cost_header without max_cost")
            && stderr.contains("[limits.global]"),
        "{stderr}"
    );
}
