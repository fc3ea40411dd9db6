//! The conformance table, part 3: what a refused call leaves behind. A call answered
//! `OVER_LIMIT` consumes nothing on any descriptor (memory, Redis `exact`, Redis `auto`
//! with leases), a limit of `requests_per_unit: 0` is always over, and `limit_remaining`
//! is what a descriptor has left once the call is done (a refused call's descriptors as
//! they stand). Beside the table: refused calls racing admitted ones, `throttle check`
//! on a zero limit, and a refund of a charge paid from a lease.

use std::sync::Arc;

use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::{Ok, OverLimit};
use throttle::clock::{Clock, ManualClock, SystemClock};
use throttle::limiter::{Algorithm, Check, Ident, OnFailure, Scope, ScopeLimits};
use throttle::limiter::{Verdict, Window, WindowLimit};
use throttle::store::redis::Target;
use throttle::store::{LimitStore, RedisStore};

use super::{
    body, call, desc, desc_hits, desc_limit, fresh_window, ok, one, over, req, Case, Rls, St,
    Store, D, MIN,
};
use crate::support::redis::RedisServer;

const PAIR: &str = "
domain: aon
descriptors:
  - key: a
    value: x
    rate_limit:
      unit: minute
      requests_per_unit: 10
      name: a10
  - key: b
    value: y
    rate_limit:
      unit: minute
      requests_per_unit: 1
      name: b1
";

/// A refused call consumes nothing on the descriptors that fit, in any order, whatever
/// their hits (descriptor or request `hits_addend`); each reports what it has left.
pub(super) fn refused_consumes_nothing() -> Case {
    let (a, b) = ((10, MIN, "a10"), (1, MIN, "b1"));
    let (da, db): (D, D) = (&[("a", "x")], &[("b", "y")]);
    let mut three = one("aon", &[da, db]);
    three.hits_addend = 3;
    Case::new(
        "refused_consumes_nothing",
        PAIR,
        vec![
            call(one("aon", &[da, db]), Ok, vec![ok(a, 9), ok(b, 0)]),
            call(one("aon", &[da, db]), OverLimit, vec![ok(a, 9), over(b)]),
            call(one("aon", &[da]), Ok, vec![ok(a, 8)]),
            call(one("aon", &[db, da]), OverLimit, vec![over(b), ok(a, 8)]),
            call(req("aon", vec![desc_hits(da, 0)]), Ok, vec![ok(a, 8)]),
            call(
                req("aon", vec![desc_hits(da, 5), desc(db)]),
                OverLimit,
                vec![ok(a, 8), over(b)],
            ),
            call(one("aon", &[da]), Ok, vec![ok(a, 7)]),
            call(three, OverLimit, vec![ok(a, 7), over(b)]),
            call(req("aon", vec![desc_hits(da, 7)]), Ok, vec![ok(a, 0)]),
            call(one("aon", &[da]), OverLimit, vec![over(a)]),
        ],
    )
}

/// `limit_remaining` over a run of admitted and refused calls at a pace that takes
/// leases on Redis `auto`: every refused call leaves the count where it was.
pub(super) fn remaining_counts_refusals() -> Case {
    let yaml = PAIR.replace("requests_per_unit: 10", "requests_per_unit: 100");
    let (a, b) = ((100, MIN, "a10"), (1, MIN, "b1"));
    let (da, db): (D, D) = (&[("a", "x")], &[("b", "y")]);
    let hits = |n| req("aon", vec![desc_hits(da, n)]);
    let hits_b = |n| req("aon", vec![desc_hits(da, n), desc(db)]);
    Case::new(
        "remaining_counts_refusals",
        &yaml,
        vec![
            call(one("aon", &[da]), Ok, vec![ok(a, 99)]),
            call(one("aon", &[da]), Ok, vec![ok(a, 98)]),
            call(one("aon", &[da]), Ok, vec![ok(a, 97)]),
            call(one("aon", &[da, db]), Ok, vec![ok(a, 96), ok(b, 0)]),
            call(one("aon", &[da, db]), OverLimit, vec![ok(a, 96), over(b)]),
            call(one("aon", &[da]), Ok, vec![ok(a, 95)]),
            call(hits_b(0), OverLimit, vec![ok(a, 95), over(b)]),
            call(hits(3), Ok, vec![ok(a, 92)]),
            call(hits_b(2), OverLimit, vec![ok(a, 92), over(b)]),
            call(one("aon", &[da]), Ok, vec![ok(a, 91)]),
            call(one("aon", &[db, da]), OverLimit, vec![over(b), ok(a, 91)]),
            call(one("aon", &[da]), Ok, vec![ok(a, 90)]),
            call(hits(0), Ok, vec![ok(a, 90)]),
            call(one("aon", &[da]), Ok, vec![ok(a, 89)]),
        ],
    )
}

const ZERO: &str = "
domain: zero
descriptors:
  - key: z
    value: closed
    rate_limit:
      unit: minute
      requests_per_unit: 0
      name: closed
  - key: z
    value: watched
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 0
      name: watched
  - key: a
    value: x
    rate_limit:
      unit: minute
      requests_per_unit: 10
      name: a10
";

/// A status with a limit, OK (shadow) but over it.
fn shadow_over(limit: (u32, Unit, &'static str)) -> St {
    St {
        code: Code::Ok,
        limit: Some(limit),
        remaining: Some(0),
    }
}

/// `requests_per_unit: 0` (configured, or a descriptor's own `limit`) is always
/// OVER_LIMIT with remaining 0, hits 0 included; in shadow mode OK with remaining 0; it
/// makes the call refused, so the other descriptors consume nothing.
pub(super) fn zero_limit() -> Case {
    let (z, w, a) = (
        (0, MIN, "closed"),
        (0, Unit::Hour, "watched"),
        (10, MIN, "a10"),
    );
    let (dz, dw, da): (D, D, D) = (&[("z", "closed")], &[("z", "watched")], &[("a", "x")]);
    let own = |unit| req("zero", vec![desc_limit(da, 0, unit)]);
    Case::new(
        "zero_limit",
        ZERO,
        vec![
            call(one("zero", &[dz]), OverLimit, vec![over(z)]),
            call(one("zero", &[dz]), OverLimit, vec![over(z)]),
            call(
                req("zero", vec![desc_hits(dz, 0)]),
                OverLimit,
                vec![over(z)],
            ),
            call(one("zero", &[da, dz]), OverLimit, vec![ok(a, 10), over(z)]),
            call(one("zero", &[da]), Ok, vec![ok(a, 9)]),
            call(
                own(RateLimitUnit::Minute),
                OverLimit,
                vec![over((0, MIN, ""))],
            ),
            call(
                own(RateLimitUnit::Hour),
                OverLimit,
                vec![over((0, Unit::Hour, ""))],
            ),
            call(one("zero", &[dw, da]), Ok, vec![shadow_over(w), ok(a, 8)]),
            call(one("zero", &[dw]), Ok, vec![shadow_over(w)]),
            call(one("zero", &[da]), Ok, vec![ok(a, 7)]),
        ],
    )
}

/// `throttle check` accepts `requests_per_unit: 0` (valid in envoyproxy/ratelimit), and
/// the gateway it describes refuses every call of that descriptor.
#[tokio::test]
async fn zero_limit_passes_check_and_always_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("zero.yaml");
    std::fs::write(&yaml, ZERO).unwrap();
    let toml = dir.path().join("gateway.toml");
    let gateway = format!(
        "[server]\nlisten = \"127.0.0.1:18080\"\nadmin_listen = \"127.0.0.1:19090\"\nrls_listen = \"127.0.0.1:18081\"\n\n{}\n[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:9\"]\n",
        body(&Store::Memory, &yaml, false)
    );
    std::fs::write(&toml, gateway).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_throttle"))
        .args(["check", "--config", toml.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "throttle check refused requests_per_unit 0: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rls = Rls::start(&body(&Store::Memory, &yaml, false)).await;
    for _ in 0..3 {
        let r = rls.ask(one("zero", &[&[("z", "closed")]])).await;
        assert_eq!(r.overall_code(), OverLimit, "{r:?}");
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().map(|l| l.requests_per_unit);
        assert_eq!((limit, s.limit_remaining), (Some(0), 0), "{r:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Refused calls racing admitted ones.

/// On Redis `exact`, 40 refused calls ([a, b] with b spent) in flight with 20 calls of a
/// alone, a at 20 a minute: every call of a alone is admitted, so no refused call held a
/// unit of a even for a moment; afterwards a has nothing left. (On memory the same race
/// is played deterministically by `rls::configured::tests`; with leases a gateway may
/// refuse early by design, see `fleet`.)
#[tokio::test(flavor = "multi_thread")]
async fn racing_refusals_take_nothing_on_redis_exact() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.yaml");
    std::fs::write(
        &path,
        PAIR.replace("requests_per_unit: 10", "requests_per_unit: 20"),
    )
    .unwrap();
    let st = Store::Redis(&redis, "rlsrace", "exact");
    let mut rls = Rls::start(&body(&st, &path, false)).await;
    fresh_window(20.0).await;
    let (da, db): (D, D) = (&[("a", "x")], &[("b", "y")]);
    assert_eq!(rls.ask(one("aon", &[db])).await.overall_code(), Ok);
    let calls: Vec<_> = (0..60)
        .map(|i| {
            let mut c = rls.client.clone();
            let alone = i % 3 == 0;
            let r = if alone {
                one("aon", &[da])
            } else {
                one("aon", &[da, db])
            };
            tokio::spawn(async move {
                let got = c
                    .should_rate_limit(r)
                    .await
                    .map(|r| r.into_inner().overall_code());
                (alone, got)
            })
        })
        .collect();
    let (mut alone_ok, mut pair_ok) = (0, 0);
    for call in calls {
        let (alone, got) = call.await.unwrap();
        let code = got.unwrap_or_else(|s| panic!("{s:?}"));
        match (alone, code) {
            (true, Ok) => alone_ok += 1,
            (false, Ok) => pair_ok += 1,
            _ => {}
        }
    }
    assert_eq!((alone_ok, pair_ok), (20, 0), "admitted (a alone, a with b)");
    let r = rls.ask(req("aon", vec![desc_hits(da, 0)])).await;
    assert_eq!(r.overall_code(), OverLimit, "{r:?}");
}

/// Calls of two descriptors well under their limits on Redis `auto`: the look and the
/// charge of each are served by the leases in hand, so the calls cost few round trips
/// (a look that went to Redis would end the lease it asked about).
#[tokio::test(flavor = "multi_thread")]
async fn looks_are_served_from_leases() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pair.yaml");
    let yaml = PAIR.replace("requests_per_unit: 10\n", "requests_per_unit: 100000\n");
    let yaml = yaml.replace("requests_per_unit: 1\n", "requests_per_unit: 100000\n");
    std::fs::write(&path, yaml).unwrap();
    let st = Store::Redis(&redis, "rlslook", "auto");
    let mut rls = Rls::start(&body(&st, &path, false)).await;
    fresh_window(20.0).await;
    let before = store_calls(&rls).await;
    let (da, db): (D, D) = (&[("a", "x")], &[("b", "y")]);
    for _ in 0..300 {
        let r = rls.ask(one("aon", &[da, db])).await;
        assert_eq!(r.overall_code(), Ok, "{r:?}");
    }
    let calls = store_calls(&rls).await - before;
    assert!(
        calls <= 60.0,
        "{calls} Redis round trips for 300 calls of 2 descriptors"
    );
}

/// `throttle_store_calls_total{store="redis"}` of the gateway.
async fn store_calls(rls: &Rls) -> f64 {
    let text = rls.gw.metrics().await;
    let series = r#"throttle_store_calls_total{store="redis"} "#;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

// ---------------------------------------------------------------------------------------
// A refund of a charge paid from a lease.

/// Decides `check` as admission does: locally when the store can, else by a call.
async fn decide(store: &RedisStore, check: &Check<'_>) -> Verdict {
    match store.decide_locally(check) {
        Some(v) => v,
        None => store.check(check).await.unwrap(),
    }
}

fn remaining(v: &Verdict) -> u32 {
    v.governing.map_or(u32::MAX, |g| g.decision.remaining)
}

/// On Redis with leases, a refund (`settle` with a negative delta) of a request paid
/// from a lease in hand goes back to that lease: the next request it pays reports the
/// refund in its remaining, and once the lease is returned Redis counts exactly the
/// admitted units.
#[tokio::test(flavor = "multi_thread")]
async fn leased_refund_counts_in_remaining() {
    let redis = RedisServer::start().await;
    // Mid-minute, so the window holds for the whole test.
    let start = SystemClock.now_ms() / 60_000 * 60_000 + 30_000;
    let clock = Arc::new(ManualClock::at(start));
    let store = RedisStore::new(
        Target::Single(redis.url()),
        std::time::Duration::from_secs(2),
        "lr",
    )
    .with_local_admission(1_000)
    .with_clock(clock.clone());
    let limits = ScopeLimits {
        windows: vec![WindowLimit::with_algorithm(
            Window::Minute,
            100,
            Algorithm::FixedWindow,
        )],
        on_failure: OnFailure::Closed,
        message: None,
        concurrent: None,
        ban: None,
        count_on: None,
    };
    let mut check = Check::new(1);
    check.push(Scope::Global, Ident::Global, &limits);
    // Eleven at one instant: the rate is high, so the last call took a lease of 11.
    for n in 1..=11 {
        assert_eq!(remaining(&decide(&store, &check).await), 100 - n);
    }
    let paid = store.decide_locally(&check).expect("paid from the lease");
    assert_eq!(remaining(&paid), 88);
    store.settle(&check, -1, paid.decided_at);
    let next = store.decide_locally(&check).expect("the lease still pays");
    assert_eq!(remaining(&next), 88, "the refund is counted");
    store.return_all().await;
    let key = store.key(Scope::Global, &Ident::Global, Window::Minute);
    let mut c = redis.client().await;
    let v: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(
        v.ends_with(":12"),
        "{key} = {v}: 12 units admitted and kept"
    );
}
