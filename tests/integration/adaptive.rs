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
adaptive = { target_p99_ms = 100, min_factor = 0.5, min_clients = 1 }

[[routes]]
name = "flaky"
path_prefix = "/flaky"
upstreams = ["{upstream}"]
auth = "none"
adaptive = { max_error_rate = 0.1, min_clients = 1 }

[[routes]]
name = "dead"
path_prefix = "/dead"
upstreams = ["127.0.0.1:{dead}"]
auth = "none"
connect_timeout_ms = 200
adaptive = { max_error_rate = 0.1, min_clients = 1 }

[[routes]]
name = "steady"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
adaptive = { target_p99_ms = 100, min_clients = 1 }
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

/// One route shared by several clients told apart by `X-Forwarded-For` (from a trusted
/// proxy), each well within its ip limit; one client's bad answers alone never move it
/// (`min_clients = 2`; `bounds` tests the default of 5).
const SHARED: &str = r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[limits.ip]
per_second = 50

[[routes]]
name = "shared"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "none"
adaptive = { target_p99_ms = 100, max_error_rate = 0.1, min_clients = 2 }
"#;

/// Status of one request from `client` (its `X-Forwarded-For`).
async fn get_as(gw: &Gateway, client: &str, path: &str) -> u16 {
    let r = crate::support::client()
        .get(gw.url(path))
        .header("x-forwarded-for", client)
        .send()
        .await
        .unwrap();
    r.status().as_u16()
}

/// The lowest factor seen while polling for `secs` seconds (letting the controller tick).
async fn lowest_factor_over(gw: &Gateway, route: &str, secs: u64) -> f64 {
    let mut lowest = f64::MAX;
    let until = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < until {
        lowest = lowest.min(factor(gw, route).await.unwrap_or(f64::MAX));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    lowest
}

/// One client within its limits hitting a URL that answers 500 and a slow one, while
/// three others use the route normally, does not move the route's factor at all (with
/// `min_clients = 2` the controller leaves out the bad responses of the one client with
/// the most of them);
/// when the upstream fails for everyone, the factor still drops.
#[tokio::test(flavor = "multi_thread")]
async fn one_client_cannot_shrink_a_shared_route() {
    let up = Upstream::start("shared").await;
    let gw = Gateway::start(SHARED, Some(&up)).await;
    eventually(
        Duration::from_secs(15),
        "the route exported at 1",
        || async { (factor(&gw, "shared").await == Some(1.0)).then_some(()) },
    )
    .await;
    let good = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];
    let (mut bad_sent, mut all_sent) = (0u32, 0u32);
    let mut lowest = f64::MAX;
    let started = tokio::time::Instant::now();
    // About 4 s of traffic: the bad client sends 1/4 of all requests, every one bad.
    while started.elapsed() < Duration::from_secs(4) {
        let (a, b, c) = tokio::join!(
            get_as(&gw, "10.9.9.9", "/x?status=500"),
            get_as(&gw, "10.9.9.9", "/x?delay_ms=300"),
            async {
                for g in good {
                    for _ in 0..2 {
                        assert_eq!(get_as(&gw, g, "/x").await, 200);
                    }
                }
            },
        );
        assert_eq!((a, b, c), (500, 200, ()));
        bad_sent += 2;
        all_sent += 8;
        lowest = lowest.min(factor(&gw, "shared").await.unwrap_or(0.0));
    }
    lowest = lowest.min(lowest_factor_over(&gw, "shared", 3).await);
    eprintln!(
        "one bad client: {bad_sent} of {all_sent} responses bad ({:.0}%), lowest factor {lowest}",
        f64::from(bad_sent) * 100.0 / f64::from(all_sent)
    );
    assert_eq!(lowest, 1.0, "one client moved the shared route's factor");

    // The upstream fails for everyone: the factor drops.
    for _ in 0..3 {
        for c in good.iter().chain(["10.9.9.9"].iter()) {
            assert_eq!(get_as(&gw, c, "/x?status=503").await, 503);
        }
    }
    eventually(
        Duration::from_secs(15),
        "a real outage shrinks the route",
        || async { factor(&gw, "shared").await.filter(|f| *f < 1.0) },
    )
    .await;
}

/// A client dripping its request body takes long, but the upstream answers at once:
/// the controller measures the upstream alone (last request byte written to response
/// head), so the route keeps its factor; a slow upstream still lowers it.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_upload_is_not_upstream_latency() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (gw, _up) = start().await;
    eventually(
        Duration::from_secs(15),
        "the route exported at 1",
        || async { (factor(&gw, "slow").await == Some(1.0)).then_some(()) },
    )
    .await;
    let drip = || async {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        let head = "POST /slow/up HTTP/1.1\r\nhost: x\r\ncontent-length: 8\r\n\r\n";
        s.write_all(head.as_bytes()).await.unwrap();
        for _ in 0..8 {
            // Letting time pass: the client uploads slowly (400 ms in all).
            tokio::time::sleep(Duration::from_millis(50)).await;
            if s.write_all(b"x").await.is_err() {
                break;
            }
        }
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap_or(0);
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    };
    tokio::join!(drip(), drip(), drip());
    let lowest = lowest_factor_over(&gw, "slow", 3).await;
    assert_eq!(lowest, 1.0, "a slow upload counted as upstream latency");
    assert_eq!(get(&gw, "/slow/x?delay_ms=300").await.0, 200);
    eventually(
        Duration::from_secs(15),
        "a slow upstream lowers it",
        || async { factor(&gw, "slow").await.filter(|f| *f < 1.0) },
    )
    .await;
}
