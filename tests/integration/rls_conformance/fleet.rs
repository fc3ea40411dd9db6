//! One limit across a fleet: two gateways on one Redis (the same key prefix), 200
//! concurrent calls spread over both, with leases (`admission = "auto"`) and without.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use super::{body, fresh_window, one, Rls, Store};
use crate::support::redis::RedisServer;

/// 200 concurrent calls of one descriptor (50 a minute) over two gateways: never more
/// than 50 OK, no errors; exactly 50 at once without leases, and with them once the
/// leases of the burst came back; afterwards both gateways refuse it.
async fn exactly_the_limit(admission: &str) {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.yaml");
    let yaml = "domain: fleet\ndescriptors:\n  - key: tenant\n    value: acme\n    rate_limit:\n      unit: minute\n      requests_per_unit: 50\n      name: fleet50\n";
    std::fs::write(&path, yaml).unwrap();
    let prefix = format!("rlsfleet-{admission}");
    let body = body(&Store::Redis(&redis, &prefix, admission), &path, false);
    let mut gws = [Rls::start(&body).await, Rls::start(&body).await];
    fresh_window(30.0).await;
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let mut c = gws[i % 2].client.clone();
            tokio::spawn(async move {
                c.should_rate_limit(one("fleet", &[&[("tenant", "acme")]]))
                    .await
                    .map(|r| r.into_inner())
            })
        })
        .collect();
    let (mut ok, mut over, mut errors) = (0, 0, Vec::new());
    for call in calls {
        match call.await.unwrap() {
            Ok(r) => {
                let l = r.statuses[0].current_limit.clone().unwrap_or_default();
                assert_eq!((l.requests_per_unit, l.unit()), (50, Unit::Minute), "{r:?}");
                match r.overall_code() {
                    Code::Ok => ok += 1,
                    Code::OverLimit => over += 1,
                    c => errors.push(format!("{c:?}")),
                }
            }
            Err(s) => errors.push(format!("{s:?}")),
        }
    }
    assert!(errors.is_empty(), "{admission}: {errors:?}");
    let mut c = redis.client().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:{{rls:fleet:*"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(
        !keys.is_empty(),
        "{admission}: no {prefix}:{{rls:fleet:* key"
    );
    let mut counters = Vec::new();
    for k in &keys {
        let v: String = redis::cmd("GET").arg(k).query_async(&mut c).await.unwrap();
        counters.push(format!("{k} = {v}"));
    }
    assert_eq!(ok + over, 200, "{admission}");
    if admission == "exact" {
        assert_eq!(
            (ok, over),
            (50, 150),
            "{admission}: OK and OVER_LIMIT of 200 (Redis: {counters:?})"
        );
    } else {
        // Never more than the limit. A burst can end with a few tokens leased to a
        // gateway whose calls were all in flight already: they go back within a lease
        // and its grace (1.5 s), every gateway asks Redis again within three leases, and
        // then the fleet admits exactly the rest of the limit.
        assert!(ok <= 50, "{admission}: {ok} admitted (Redis: {counters:?})");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(8);
        let mut i = 0;
        while ok < 50 && tokio::time::Instant::now() < deadline {
            let r = gws[i % 2].ask(one("fleet", &[&[("tenant", "acme")]])).await;
            if r.overall_code() == Code::Ok {
                ok += 1;
            } else {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            i += 1;
        }
        assert_eq!(
            ok, 50,
            "{admission}: the fleet's total once the leases came back"
        );
    }
    for gw in &mut gws {
        let r = gw.ask(one("fleet", &[&[("tenant", "acme")]])).await;
        assert_eq!(r.overall_code(), Code::OverLimit, "{admission}: {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_admits_exactly_the_limit() {
    exactly_the_limit("auto").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exact_admits_exactly_the_limit() {
    exactly_the_limit("exact").await;
}
