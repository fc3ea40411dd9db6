//! Route `health_check`: an upstream failing `/healthz` gets no traffic until it passes
//! again; with every upstream down the gateway answers 502 without connecting.

use std::time::Duration;

use tokio::time::Instant;

use crate::support::{client, eventually, Gateway, HealthUpstream};

fn config(a: &HealthUpstream, b: &HealthUpstream) -> String {
    format!(
        r#"
[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{}", "{}"]
auth = "none"
health_check = {{ path = "/healthz", interval_ms = 100 }}
"#,
        a.addr, b.addr
    )
}

/// The `upstream` label of one proxied response (None: not a 200).
async fn upstream_of(gw: &Gateway) -> Option<String> {
    let r = client().get(gw.url("/x")).send().await.unwrap();
    if r.status() != 200 {
        return None;
    }
    let v: serde_json::Value = r.json().await.unwrap();
    Some(v["upstream"].as_str()?.to_string())
}

/// Waits until `throttle_upstream_healthy` of `upstream` reads `value`.
async fn healthy_metric(gw: &Gateway, upstream: &HealthUpstream, value: u8) {
    let line = format!(
        "throttle_upstream_healthy{{route=\"api\",upstream=\"{}\"}} {value}",
        upstream.addr
    );
    eventually(Duration::from_secs(5), &line, || async {
        gw.metrics().await.contains(&line).then_some(())
    })
    .await;
}

/// An upstream failing its health check is skipped; it gets traffic again once healthy.
#[tokio::test(flavor = "multi_thread")]
async fn skips_unhealthy_upstream_until_it_recovers() {
    let (a, b) = (
        HealthUpstream::start("a").await,
        HealthUpstream::start("b").await,
    );
    let gw = Gateway::start(&config(&a, &b), None).await;
    healthy_metric(&gw, &a, 1).await;
    healthy_metric(&gw, &b, 1).await;

    b.set_healthy(false);
    healthy_metric(&gw, &b, 0).await;
    let before = b.served();
    for _ in 0..20 {
        assert_eq!(upstream_of(&gw).await.as_deref(), Some("a"));
    }
    assert_eq!(b.served(), before, "the unhealthy upstream got traffic");

    b.set_healthy(true);
    healthy_metric(&gw, &b, 1).await;
    let mut seen_b = false;
    for _ in 0..20 {
        seen_b |= upstream_of(&gw).await.as_deref() == Some("b");
    }
    assert!(seen_b, "the recovered upstream got no traffic");
}

/// With every upstream of the route down: 502 bad_gateway at once, no connect attempt.
#[tokio::test(flavor = "multi_thread")]
async fn all_upstreams_down_is_502_without_connecting() {
    let (a, b) = (
        HealthUpstream::start("a").await,
        HealthUpstream::start("b").await,
    );
    let gw = Gateway::start(&config(&a, &b), None).await;
    a.set_healthy(false);
    b.set_healthy(false);
    healthy_metric(&gw, &a, 0).await;
    healthy_metric(&gw, &b, 0).await;
    let served = a.served() + b.served();
    for _ in 0..5 {
        let started = Instant::now();
        let r = client().get(gw.url("/x")).send().await.unwrap();
        assert_eq!(r.status(), 502);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"], "bad_gateway");
        assert!(started.elapsed() < Duration::from_millis(500));
    }
    assert_eq!(a.served() + b.served(), served, "an upstream was contacted");

    a.set_healthy(true);
    healthy_metric(&gw, &a, 1).await;
    assert_eq!(upstream_of(&gw).await.as_deref(), Some("a"));
}
