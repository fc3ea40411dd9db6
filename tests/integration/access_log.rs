//! `[server] access_log` and `X-Request-Id` through the real gateway: a line per request
//! with its fields for a pass, a 429, a 401 and an upstream error; hostile paths stay
//! one JSON object per line; request ids generated, kept from a trusted proxy, replaced
//! from an untrusted one, sent upstream and back.

use std::time::Duration;

use serde_json::Value;

use crate::support::{client, eventually, free_port, header, Gateway, Upstream};

const CONFIG: &str = r#"
[client_ip]
trusted_proxies = {trusted}

[tiers.free]
key = { per_minute = 1 }

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["{upstream}"]
auth = "required"

[[routes]]
name = "down"
path_prefix = "/down"
upstreams = ["127.0.0.1:{dead}"]
auth = "none"

[[keys]]
id = "key_a"
key = "key-a-secret"
tenant = "acme"
tier = "free"
"#;

async fn start(trusted: &str, up: &Upstream) -> Gateway {
    let body = CONFIG
        .replace("{trusted}", trusted)
        .replace("{dead}", &free_port().to_string());
    Gateway::start_full(
        &["run"],
        &body.replace("{upstream}", &up.addr.to_string()),
        "grace_period_secs = 0\naccess_log = \"access.log\"",
    )
    .await
}

/// The log's lines once it holds `n`, each parsed (every line one JSON object).
async fn lines(gw: &Gateway, n: usize) -> Vec<Value> {
    let path = gw.config_path().parent().unwrap().join("access.log");
    eventually(Duration::from_secs(10), "access log lines", || {
        let path = path.clone();
        async move {
            let text = std::fs::read_to_string(&path).ok()?;
            let v: Vec<Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
                .collect();
            (v.len() >= n).then_some(v)
        }
    })
    .await
}

/// A pass, a 429, a 401 and a 502 each log their fields, and the ids match the answers.
#[tokio::test]
async fn logs_pass_429_401_and_upstream_error() {
    let up = Upstream::start("up").await;
    let gw = start("[]", &up).await;
    let c = client();
    let key = ("x-api-key", "key-a-secret");
    let pass = c
        .get(gw.url("/v1/a"))
        .header(key.0, key.1)
        .send()
        .await
        .unwrap();
    let limited = c
        .get(gw.url("/v1/b"))
        .header(key.0, key.1)
        .send()
        .await
        .unwrap();
    let unauth = c.get(gw.url("/v1/c")).send().await.unwrap();
    let down = c.get(gw.url("/down/d")).send().await.unwrap();
    let statuses = [&pass, &limited, &unauth, &down].map(|r| r.status().as_u16());
    assert_eq!(statuses, [200, 429, 401, 502]);
    let ids = [&pass, &limited, &unauth, &down].map(|r| header(r, "x-request-id"));
    let v = lines(&gw, 4).await;
    for (line, id) in v.iter().zip(&ids) {
        assert_eq!(line["request_id"], id.as_str(), "{line}");
        assert_eq!(id.len(), 32);
        assert_eq!(line["client_ip"], "127.0.0.1");
        assert_eq!(line["method"], "GET");
        assert!(line["time"].as_str().unwrap().ends_with('Z'));
        assert!(line["duration_ms"].as_f64().unwrap() >= 0.0);
        assert!(!line.to_string().contains("key-a-secret"), "{line}");
    }
    let (p, l, u, d) = (&v[0], &v[1], &v[2], &v[3]);
    assert_eq!(
        (p["status"].as_u64(), p["path"].as_str()),
        (Some(200), Some("/v1/a"))
    );
    assert_eq!(
        (p["route"].as_str(), p["key_id"].as_str()),
        (Some("api"), Some("key_a"))
    );
    assert_eq!(p["tenant"], "acme");
    assert_eq!(p["upstream"], up.addr.to_string());
    assert!(p["upstream_ms"].as_f64().is_some() && p["bytes_out"].as_u64() > Some(0));
    assert_eq!(
        (l["status"].as_u64(), l["scope"].as_str()),
        (Some(429), Some("key"))
    );
    assert_eq!(
        (l["window"].as_str(), l["upstream"].as_null()),
        (Some("1m"), Some(()))
    );
    // A refused request still names the caller it identified.
    assert_eq!(
        (l["key_id"].as_str(), l["tenant"].as_str()),
        (Some("key_a"), Some("acme"))
    );
    assert_eq!(
        (u["status"].as_u64(), u["key_id"].as_null()),
        (Some(401), Some(()))
    );
    assert_eq!(
        (d["status"].as_u64(), d["route"].as_str()),
        (Some(502), Some("down"))
    );
    assert!(d["upstream"].as_str().is_some());
}

/// An untrusted peer's X-Request-Id is replaced, upstream and in the answer; a huge,
/// quoted, percent-encoded path still logs one valid line.
#[tokio::test]
async fn replaces_untrusted_request_id_and_survives_hostile_paths() {
    let up = Upstream::start("up").await;
    let gw = start("[]", &up).await;
    let c = client();
    let r = c
        .get(gw.url("/down/x"))
        .header("x-request-id", "client-chosen")
        .send()
        .await
        .unwrap();
    let id = header(&r, "x-request-id");
    assert_ne!(id, "client-chosen");
    let long = format!("/v1/%22%0A{}", "a".repeat(10_000));
    let _ = c.get(gw.url(&long)).send().await;
    let v = lines(&gw, 1).await;
    assert_eq!(v[0]["request_id"], id.as_str());
    for line in &v {
        assert!(line["path"].as_str().unwrap().len() <= 2048, "{line}");
    }
}

/// A trusted proxy's id is kept and forwarded upstream; without one, a generated id goes
/// upstream and back, the same on both sides.
#[tokio::test]
async fn keeps_trusted_request_id_upstream_and_back() {
    let up = Upstream::start("up").await;
    let gw = start(r#"["127.0.0.1/32"]"#, &up).await;
    let c = client();
    let key = ("x-api-key", "key-a-secret");
    let r = c
        .get(gw.url("/v1/a"))
        .header(key.0, key.1)
        .header("x-request-id", "lb-123")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&r, "x-request-id"), "lb-123");
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-request-id"], "lb-123");
    let v = lines(&gw, 1).await;
    assert_eq!(v[0]["request_id"], "lb-123");
}

/// A refused request logs the client address resolved behind a trusted proxy, not the
/// proxy's socket address.
#[tokio::test]
async fn a_refusal_logs_the_resolved_client() {
    let up = Upstream::start("up").await;
    let gw = start(r#"["127.0.0.1/32"]"#, &up).await;
    let r = client()
        .get(gw.url("/v1/a"))
        .header("x-forwarded-for", "203.0.113.50")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v = lines(&gw, 1).await;
    assert_eq!(v[0]["status"], 401);
    assert_eq!(v[0]["client_ip"], "203.0.113.50", "{}", v[0]);
}
