//! Adaptive limits end to end: a slow upstream (the demo upstream's `?delay_ms=N`), an
//! erroring one (`?status=503`) and an unreachable one (the gateway's own 502) lower
//! their route's factor, seen in `throttle_adaptive_factor{route}` and in a lower
//! `X-RateLimit-Limit`; recovery raises it back; another route is unaffected.

use std::time::Duration;

use crate::support::{client, eventually, free_port, header, Gateway, Upstream};

/// `{dead}` is replaced by a port nothing listens on.
const CONFIG: &str = r#"
[limits.ip]
per_hour = 1000

[[routes]]
name = "slow"
path_prefix = "/slow"
upstreams = ["{upstream}"]
auth = "none"
adaptive = { target_p99_ms = 100, min_factor = 0.5 }

[[routes]]
name = "flaky"
path_prefix = "/flaky"
upstreams = ["{upstream}"]
auth = "none"
adaptive = { max_error_rate = 0.1 }

[[routes]]
name = "dead"
path_prefix = "/dead"
upstreams = ["127.0.0.1:{dead}"]
auth = "none"
connect_timeout_ms = 200
adaptive = { max_error_rate = 0.1 }

[[routes]]
name = "steady"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
adaptive = { target_p99_ms = 100 }
"#;

async fn start() -> (Gateway, Upstream) {
    let up = Upstream::start("adaptive").await;
    let body = CONFIG.replace("{dead}", &free_port().to_string());
    let gw = Gateway::start(&body, Some(&up)).await;
    (gw, up)
}

/// `throttle_adaptive_factor{route="<route>"}` as /metrics shows it.
async fn factor(gw: &Gateway, route: &str) -> Option<f64> {
    let series = format!("throttle_adaptive_factor{{route=\"{route}\"}} ");
    gw.metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
}

/// (status, X-RateLimit-Limit) of one request.
async fn get(gw: &Gateway, path: &str) -> (u16, u64) {
    let r = client().get(gw.url(path)).send().await.unwrap();
    let limit = header(&r, "x-ratelimit-limit").parse().unwrap_or(0);
    (r.status().as_u16(), limit)
}

/// A slow upstream lowers its route's factor (gauge and header), never below
/// `min_factor`; the other route keeps 1 and its full limit; once the slow responses
/// have left the 10 s window the factor climbs back to 1.
#[tokio::test(flavor = "multi_thread")]
async fn slow_upstream_lowers_the_factor_and_recovery_restores_it() {
    let (gw, _up) = start().await;
    let patience = Duration::from_secs(15);
    eventually(patience, "every adaptive route exported at 1", || async {
        (factor(&gw, "slow").await == Some(1.0) && factor(&gw, "steady").await == Some(1.0))
            .then_some(())
    })
    .await;
    assert_eq!(get(&gw, "/slow/x").await, (200, 1000));

    for _ in 0..2 {
        assert_eq!(get(&gw, "/slow/x?delay_ms=300").await.0, 200);
    }
    let lowered = eventually(patience, "the slow route's factor drops", || async {
        factor(&gw, "slow").await.filter(|f| *f < 1.0)
    })
    .await;
    assert!(lowered >= 0.5, "floor is min_factor: {lowered}");
    // Every request on the route now sees an effective limit floor(1000 x factor).
    let (status, limit) = get(&gw, "/slow/x").await;
    assert_eq!(status, 200);
    assert!((500..1000).contains(&limit), "X-RateLimit-Limit {limit}");
    eventually(patience, "the factor reaches min_factor", || async {
        (factor(&gw, "slow").await == Some(0.5)).then_some(())
    })
    .await;
    assert_eq!(get(&gw, "/slow/x").await, (200, 500));

    // Another route on the same gateway is unaffected.
    assert_eq!(get(&gw, "/other").await, (200, 1000));
    assert_eq!(factor(&gw, "steady").await, Some(1.0));

    // The slow responses leave the window after 10 s, then + 0.05 per second.
    eventually(
        Duration::from_secs(30),
        "the factor recovers to 1",
        || async { (factor(&gw, "slow").await == Some(1.0)).then_some(()) },
    )
    .await;
    assert_eq!(get(&gw, "/slow/x").await, (200, 1000));
}

/// 5xx answers lower the factor, an upstream's 503 and the gateway's own 502 for an
/// unreachable upstream alike; the healthy route keeps 1.
#[tokio::test(flavor = "multi_thread")]
async fn erroring_upstreams_lower_the_factor() {
    let (gw, _up) = start().await;
    let patience = Duration::from_secs(15);
    for _ in 0..3 {
        assert_eq!(get(&gw, "/flaky/x?status=503").await.0, 503);
        assert_eq!(get(&gw, "/dead/x").await.0, 502);
        assert_eq!(get(&gw, "/ok").await.0, 200);
    }
    for route in ["flaky", "dead"] {
        eventually(patience, &format!("{route}'s factor drops"), || async {
            factor(&gw, route).await.filter(|f| *f < 1.0)
        })
        .await;
    }
    let (status, limit) = get(&gw, "/flaky/x").await;
    assert_eq!(status, 200);
    assert!(limit < 1000, "X-RateLimit-Limit {limit}");
    assert_eq!(get(&gw, "/ok").await, (200, 1000));
    assert_eq!(factor(&gw, "steady").await, Some(1.0));
}
