//! The pipeline itself, without a gateway process: a memory store on a manual clock, a
//! store that fails, and a store that counts how requests end.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::*;
use crate::clock::ManualClock;
use crate::limiter::{Check, Verdict};
use crate::metrics::Metrics;
use crate::store::{LimitStore, MemoryStore, StoreError, TieredStore};

const NOW: u64 = 1_764_000_000_000;

const CONFIG: &str = r#"
[limits.ip]
per_minute = 5

[limits.auth]
per_minute = 3

[tiers.free]
key = { per_minute = 2 }
tenant = { per_hour = 100 }

[[keys]]
id = "k1"
key = "good-key"
tenant = "acme"
tier = "free"

[[keys]]
id = "k_blocked"
key = "blocked-key"
tenant = "acme"
tier = "free"

[[keys]]
id = "k_evil"
key = "evil-key"
tenant = "evil"
tier = "free"

[[blocks]]
scope = "ip"
value = "203.0.113.0/24"

[[blocks]]
scope = "key"
value = "k_blocked"

[[blocks]]
scope = "tenant"
value = "evil"

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["127.0.0.1:1"]
auth = "required"

[[routes]]
name = "opt"
path_prefix = "/opt"
upstreams = ["127.0.0.1:1"]
auth = "optional"

[[routes]]
name = "public"
path_prefix = "/public"
upstreams = ["127.0.0.1:1"]
auth = "none"

[[routes]]
name = "shadow"
path_prefix = "/shadow"
upstreams = ["127.0.0.1:1"]
auth = "required"
mode = "shadow"
"#;

/// A memory store that counts how admitted requests end.
#[derive(Default)]
struct Counting {
    inner: MemoryStore,
    endings: Mutex<Vec<Ending>>,
}

#[async_trait]
impl LimitStore for Counting {
    async fn check(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        Ok(self.inner.decide(check))
    }
    fn name(&self) -> &'static str {
        "memory"
    }
    fn finish(&self, _held: Held, ending: Ending) {
        self.endings.lock().unwrap().push(ending);
    }
}

/// A store that fails on demand (a stateful fake, not a mock).
struct Flaky {
    up: AtomicBool,
    calls: AtomicUsize,
    inner: MemoryStore,
}

#[async_trait]
impl LimitStore for Flaky {
    async fn check(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.up.load(Ordering::SeqCst) {
            Ok(self.inner.decide(check))
        } else {
            Err(StoreError::Unavailable("down".into()))
        }
    }
    fn name(&self) -> &'static str {
        "redis"
    }
}

fn core_with(config: &str, store: Arc<dyn LimitStore>, metrics: Arc<Metrics>) -> Core {
    let c = crate::config::parse("t.toml", config).unwrap();
    let clock = Arc::new(ManualClock::at(NOW));
    Core::with_clock(Runtime::from_config(c).unwrap(), store, metrics, clock).unwrap()
}

fn memory_core() -> (Core, Arc<Counting>) {
    let store = Arc::new(Counting::default());
    let core = core_with(CONFIG, store.clone(), Arc::new(Metrics::new().unwrap()));
    (core, store)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn req<'a>(client: &str, path: &'a str, key: Option<&'a str>) -> AdmitRequest<'a> {
    AdmitRequest {
        client_ip: ip(client),
        target: Target::Match {
            host: None,
            path,
            method: &http::Method::GET,
        },
        key: key.map_or(Presented::Missing, |k| {
            crate::identity::validate_key(k.as_bytes())
        }),
        cost: None,
        also_charge: None,
        origin: Origin::Proxy,
        attrs: Default::default(),
        skip: Default::default(),
    }
}

/// The rejection's short name, for tables.
fn kind(r: &Result<Admission, Refusal>) -> String {
    match r {
        Ok(a) if a.shadow_rejected => "shadow".into(),
        Ok(_) => "ok".into(),
        Err(f) => match &f.rejection {
            Rejection::RateLimited { governing, .. } => format!("429 {}", governing.scope.as_str()),
            Rejection::Concurrent { full, .. } => format!("429 concurrent {}", full.scope.as_str()),
            Rejection::Blocked(s) => format!("403 {}", s.as_str()),
            Rejection::Banned(b) => format!("403 ban {}", b.scope.as_str()),
            Rejection::MissingKey => "401 missing".into(),
            Rejection::InvalidKey => "401 invalid".into(),
            Rejection::InvalidToken => "401 token".into(),
            Rejection::NoRoute(_) => "404".into(),
            Rejection::UnknownRoute(_) => "404 unknown".into(),
            Rejection::InvalidPath => "400 path".into(),
            Rejection::InvalidHost => "400 host".into(),
            Rejection::AmbiguousCredentials => "400 credentials".into(),
            Rejection::MethodNotAllowed => "405 method".into(),
            Rejection::CostOverCapacity { cost, capacity } => format!("400 cost {cost}>{capacity}"),
            Rejection::InvalidIdentity(s) => format!("400 invalid {}", s.as_str()),
            Rejection::MissingIdentity(s) => format!("400 missing {}", s.as_str()),
            Rejection::Unavailable => "503".into(),
            Rejection::NotReady => "503 not ready".into(),
        },
    }
}

/// Every refusal kind, each from a fresh pipeline, in the contract's order: an IP block
/// before anything, auth before limits, blocks after auth.
#[tokio::test]
async fn every_refusal_kind_in_order() {
    let cases: [(&str, &str, Option<&str>, &str); 11] = [
        ("203.0.113.9", "/v1/x", None, "403 ip"),
        ("203.0.113.9", "/nowhere", Some("bad"), "403 ip"),
        ("198.51.100.1", "/nowhere", None, "404"),
        ("198.51.100.1", "/v1/x", None, "401 missing"),
        ("198.51.100.1", "/v1/x", Some("bad"), "401 invalid"),
        ("198.51.100.1", "/opt/x", Some("bad"), "401 invalid"),
        ("198.51.100.1", "/opt/x", None, "ok"),
        ("198.51.100.1", "/public/x", Some("bad"), "ok"),
        ("198.51.100.1", "/v1/x", Some("blocked-key"), "403 key"),
        ("198.51.100.1", "/v1/x", Some("evil-key"), "403 tenant"),
        ("198.51.100.1", "/v1/x", Some("good-key"), "ok"),
    ];
    for (i, (client, path, key, want)) in cases.into_iter().enumerate() {
        let (core, _) = memory_core();
        let got = kind(&admit(&core, &req(client, path, key)).await);
        assert_eq!(got, want, "case {i}: {client} {path} {key:?}");
    }
}

/// Limits: the key's window rejects after 2; the ip limit applies even without a route
/// (404 until the ip budget is gone, then 429); a shadow route admits what it would reject.
#[tokio::test]
async fn limits_apply_in_layers() {
    let (core, _) = memory_core();
    let key = |p| req("198.51.100.1", p, Some("good-key"));
    assert_eq!(kind(&admit(&core, &key("/v1/a")).await), "ok");
    assert_eq!(kind(&admit(&core, &key("/v1/a")).await), "ok");
    assert_eq!(kind(&admit(&core, &key("/v1/a")).await), "429 key");

    let (core, _) = memory_core();
    for _ in 0..5 {
        assert_eq!(
            kind(&admit(&core, &req("198.51.100.2", "/none", None)).await),
            "404"
        );
    }
    assert_eq!(
        kind(&admit(&core, &req("198.51.100.2", "/none", None)).await),
        "429 ip"
    );

    let (core, _) = memory_core();
    let shadow = req("198.51.100.3", "/shadow", Some("good-key"));
    for want in ["ok", "ok", "shadow", "shadow"] {
        assert_eq!(kind(&admit(&core, &shadow).await), want);
    }
}

/// Failed key lookups count against the client address and `also_charge`; past
/// `[limits.auth]` even a valid key is refused with 429 `auth`.
#[tokio::test]
async fn failed_lookups_are_charged_to_both_addresses() {
    let (core, _) = memory_core();
    let mut r = req("198.51.100.7", "/v1/x", Some("bad"));
    r.also_charge = Some(ip("10.9.9.9"));
    for _ in 0..3 {
        assert_eq!(kind(&admit(&core, &r).await), "401 invalid");
    }
    assert_eq!(kind(&admit(&core, &r).await), "429 auth");
    // Another client address from the same caller: the caller's budget is gone.
    let mut other = req("198.51.100.8", "/v1/x", Some("good-key"));
    other.also_charge = Some(ip("10.9.9.9"));
    assert_eq!(kind(&admit(&core, &other).await), "429 auth");
    // Without the caller, that address is fine.
    assert_eq!(
        kind(&admit(&core, &req("198.51.100.8", "/v1/x", Some("good-key"))).await),
        "ok"
    );
}

/// Before the first database snapshot a key the config does not hold may be one not
/// loaded yet: 503 `not_ready`, not 401, and not a failed lookup; the config's keys are
/// served. Once the snapshot is in, the same key is 401 and counts.
#[tokio::test]
async fn before_the_first_snapshot_unknown_keys_are_not_ready() {
    let (core, _) = memory_core();
    core.swap_dynamic(Dynamic {
        awaiting: true,
        ..Dynamic::default()
    });
    let unknown = req("198.51.100.7", "/v1/x", Some("bad"));
    for _ in 0..5 {
        assert_eq!(kind(&admit(&core, &unknown).await), "503 not ready");
    }
    let good = req("198.51.100.7", "/v1/x", Some("good-key"));
    assert_eq!(kind(&admit(&core, &good).await), "ok");
    core.swap_dynamic(Dynamic::default());
    for _ in 0..3 {
        assert_eq!(kind(&admit(&core, &unknown).await), "401 invalid");
    }
    assert_eq!(kind(&admit(&core, &unknown).await), "429 auth");
}

/// Named routes (the check API) and `Target::Any`.
#[tokio::test]
async fn named_and_routeless_targets() {
    let (core, _) = memory_core();
    let named = |name| AdmitRequest {
        target: Target::Named(name),
        ..req("198.51.100.1", "", Some("good-key"))
    };
    assert_eq!(kind(&admit(&core, &named("api")).await), "ok");
    assert_eq!(kind(&admit(&core, &named("nope")).await), "404 unknown");
    let any = AdmitRequest {
        target: Target::Any,
        ..req("198.51.100.1", "", Some("bad"))
    };
    assert_eq!(
        kind(&admit(&core, &any).await),
        "401 invalid",
        "Any is auth=optional"
    );
    let a = admit(
        &core,
        &AdmitRequest {
            key: Presented::Missing,
            ..any
        },
    )
    .await
    .unwrap();
    assert!(a.route.is_none() && a.key.is_none());
}

/// An admission keeps the runtime it was decided on across a reload.
#[tokio::test]
async fn admission_keeps_its_config() {
    let (core, _) = memory_core();
    let a = admit(&core, &req("198.51.100.1", "/public/x", None))
        .await
        .unwrap();
    let reloaded = CONFIG.replace("name = \"public\"", "name = \"public2\"");
    let c = crate::config::parse("t.toml", &reloaded).unwrap();
    core.swap_runtime(Runtime::from_config(c).unwrap()).unwrap();
    assert_eq!(a.route_name().map(|n| &**n), Some("public"));
    assert!(a.runtime.router.find_by_name("public").is_some());
    assert!(core.runtime().router.find_by_name("public").is_none());
}

/// Every admitted request is finished exactly once, however it ends; a refused one holds
/// nothing and is not.
#[tokio::test]
async fn every_admission_is_finished_exactly_once() {
    let (core, store) = memory_core();
    let ok = || req("198.51.100.1", "/public/x", None);
    admit(&core, &ok())
        .await
        .unwrap()
        .finish(Ending::Completed { status: 200 });
    admit(&core, &ok())
        .await
        .unwrap()
        .finish(Ending::UpstreamFailed);
    admit(&core, &ok())
        .await
        .unwrap()
        .finish(Ending::ClientGone);
    drop(admit(&core, &ok()).await.unwrap()); // a cancelled request
    assert!(admit(&core, &req("198.51.100.1", "/v1/x", None))
        .await
        .is_err());
    assert_eq!(
        *store.endings.lock().unwrap(),
        [
            Ending::Completed { status: 200 },
            Ending::UpstreamFailed,
            Ending::ClientGone,
            Ending::Dropped
        ]
    );
}

/// `throttle_decisions_total{scope,decision}` as rendered.
fn decisions(m: &Metrics, scope: &str, decision: &str) -> u64 {
    metric(
        m,
        &format!("throttle_decisions_total{{decision=\"{decision}\",scope=\"{scope}\"}}"),
    )
}

fn metric(m: &Metrics, series: &str) -> u64 {
    let text = String::from_utf8(m.render()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series).map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0)
}

/// The store failed: each scope's `on_failure` decides, and each decision is counted once
/// (a local-fallback admission is `local_fallback`, not also `allowed`); store errors are
/// counted once per failed call, never for calls the open breaker skipped.
#[tokio::test]
async fn failure_policy_counts_each_decision_once() {
    let config = |on_failure: &str| {
        format!("[limits.global]\nper_minute = 100\non_failure = \"{on_failure}\"\n{CONFIG}")
            .replace(
                "[limits.ip]\nper_minute = 5",
                "[limits.ip]\nper_minute = 5\non_failure = \"local\"",
            )
    };
    let metrics = Arc::new(Metrics::new().unwrap());
    let flaky = Arc::new(Flaky {
        up: AtomicBool::new(true),
        calls: AtomicUsize::new(0),
        inner: MemoryStore::new(),
    });
    let tiered = Arc::new(TieredStore::new(
        flaky.clone(),
        Arc::new(MemoryStore::new()),
        Arc::new(AtomicU32::new(1)),
        metrics.clone(),
    ));
    let core = core_with(&config("open"), tiered.clone(), metrics.clone());
    let r = req("198.51.100.1", "/public/x", None);

    assert_eq!(kind(&admit(&core, &r).await), "ok");
    assert_eq!(decisions(&metrics, "ip", "allowed"), 1);
    assert_eq!(decisions(&metrics, "global", "allowed"), 1);

    flaky.up.store(false, Ordering::SeqCst);
    for _ in 0..5 {
        assert_eq!(kind(&admit(&core, &r).await), "ok");
    }
    // ip (local, limit 5/min, one spent on Redis only): the local store admits 5 more.
    assert_eq!(kind(&admit(&core, &r).await), "429 ip");
    assert_eq!(decisions(&metrics, "ip", "local_fallback"), 5);
    assert_eq!(decisions(&metrics, "ip", "allowed"), 1, "not also allowed");
    assert_eq!(decisions(&metrics, "ip", "rejected"), 1);
    assert_eq!(decisions(&metrics, "global", "failed_open"), 6);
    assert_eq!(decisions(&metrics, "global", "allowed"), 1);
    // 3 calls failed and opened the breaker; later calls were skipped, not errors.
    let calls = flaky.calls.load(Ordering::SeqCst);
    assert_eq!(calls, 1 + 3);
    assert_eq!(
        metric(&metrics, "throttle_store_errors_total{store=\"redis\"}"),
        3
    );

    // A closed scope: 503, counted failed_closed once for that scope.
    let metrics = Arc::new(Metrics::new().unwrap());
    let tiered = Arc::new(TieredStore::new(
        flaky.clone(),
        Arc::new(MemoryStore::new()),
        Arc::new(AtomicU32::new(1)),
        metrics.clone(),
    ));
    let core = core_with(&config("closed"), tiered, metrics.clone());
    assert_eq!(kind(&admit(&core, &r).await), "503");
    assert_eq!(decisions(&metrics, "global", "failed_closed"), 1);
    assert_eq!(decisions(&metrics, "ip", "failed_closed"), 0);
    assert_eq!(decisions(&metrics, "ip", "local_fallback"), 0);
}

/// A bare store that fails (no tiering) fails open; brute-force counting fails open too.
#[tokio::test]
async fn a_failing_bare_store_fails_open() {
    let metrics = Arc::new(Metrics::new().unwrap());
    let flaky = Arc::new(Flaky {
        up: AtomicBool::new(false),
        calls: AtomicUsize::new(0),
        inner: MemoryStore::new(),
    });
    let core = core_with(CONFIG, flaky, metrics.clone());
    assert_eq!(
        kind(&admit(&core, &req("198.51.100.1", "/v1/x", Some("good-key"))).await),
        "ok"
    );
    assert_eq!(decisions(&metrics, "key", "failed_open"), 1);
    assert_eq!(
        kind(&admit(&core, &req("198.51.100.1", "/v1/x", Some("bad"))).await),
        "401 invalid"
    );
}

/// Concurrency slots: taken before the rate windows (a concurrency refusal charges
/// none), held until the admission ends, and given back at once when a rate window
/// refuses the request.
#[tokio::test]
async fn concurrency_slots_in_the_pipeline() {
    let config = CONFIG.replace(
        "key = { per_minute = 2 }",
        "key = { per_minute = 2, concurrent = 1 }",
    );
    assert_ne!(config, CONFIG, "the test config changed");
    let store = Arc::new(MemoryStore::with_clock(ManualClock::at(NOW)));
    let core = core_with(&config, store.clone(), Arc::new(Metrics::new().unwrap()));
    let key = req("198.51.100.1", "/v1/a", Some("good-key"));
    let first = admit(&core, &key).await;
    assert_eq!(kind(&first), "ok");
    for _ in 0..3 {
        assert_eq!(kind(&admit(&core, &key).await), "429 concurrent key");
    }
    first.unwrap().finish(Ending::ClientGone);
    // The three refusals charged nothing: one of two is left.
    let second = admit(&core, &key).await.unwrap();
    assert_eq!(second.rate.unwrap().decision.remaining, 0);
    drop(second); // a dropped admission gives its slot back too
    let ident = crate::limiter::Ident::Name("k1".into());
    assert_eq!(store.inflight().in_flight(Scope::Key, &ident), 0);
    // The window refuses now; the slot the refused request took is back at once.
    assert_eq!(kind(&admit(&core, &key).await), "429 key");
    assert_eq!(store.inflight().in_flight(Scope::Key, &ident), 0);
    assert!(store.inflight().is_empty());
}

/// `throttle_near_limit_total{scope}` counts admitted requests that left their governing
/// window at most 10% of its limit, by that window's scope; refusals are not counted.
#[tokio::test]
async fn near_limit_counts_admissions_at_the_edge() {
    let metrics = Arc::new(Metrics::new().unwrap());
    let store = Arc::new(MemoryStore::with_clock(ManualClock::at(NOW)));
    let core = core_with(CONFIG, store, metrics.clone());
    let near = |scope: &str| {
        metric(
            &metrics,
            &format!("throttle_near_limit_total{{scope=\"{scope}\"}}"),
        )
    };
    let key = req("198.51.100.1", "/v1/a", Some("good-key"));
    assert_eq!(kind(&admit(&core, &key).await), "ok"); // key: 1 of 2 left (50%)
    assert_eq!(near("key"), 0);
    assert_eq!(kind(&admit(&core, &key).await), "ok"); // key: 0 of 2 left
    assert_eq!(near("key"), 1);
    assert_eq!(kind(&admit(&core, &key).await), "429 key"); // refused: not counted
    assert_eq!(near("key"), 1);
    // Without a key the ip window (5 per minute) governs; the two admitted requests above
    // spent 2 of it (the refused one nothing): 2, then 1 (20%), then 0 left.
    let anon = req("198.51.100.1", "/opt/a", None);
    assert_eq!(kind(&admit(&core, &anon).await), "ok");
    assert_eq!(kind(&admit(&core, &anon).await), "ok");
    assert_eq!(near("ip"), 0);
    assert_eq!(kind(&admit(&core, &anon).await), "ok");
    assert_eq!(near("ip"), 1);
}

/// A store whose rate check never answers (slots come from its memory store).
struct Stuck {
    inner: MemoryStore<ManualClock>,
}

#[async_trait]
impl LimitStore for Stuck {
    async fn check(&self, _check: &Check<'_>) -> Result<Verdict, StoreError> {
        std::future::pending().await
    }
    async fn acquire(
        &self,
        slots: &[crate::store::slots::SlotRequest],
    ) -> Result<crate::store::slots::Acquired, StoreError> {
        self.inner.acquire(slots).await
    }
    fn finish(&self, held: Held, ending: Ending) {
        self.inner.finish(held, ending);
    }
    fn name(&self) -> &'static str {
        "stuck"
    }
}

/// An admission dropped while its rate windows are being checked (a gRPC deadline, a
/// timeout layer, a client gone) gives its concurrency slots back.
#[tokio::test]
async fn a_dropped_admission_future_gives_its_slots_back() {
    let config = CONFIG.replace(
        "key = { per_minute = 2 }",
        "key = { per_minute = 2, concurrent = 1 }",
    );
    let store = Arc::new(Stuck {
        inner: MemoryStore::with_clock(ManualClock::at(NOW)),
    });
    let core = core_with(&config, store.clone(), Arc::new(Metrics::new().unwrap()));
    let key = req("198.51.100.1", "/v1/a", Some("good-key"));
    for _ in 0..3 {
        let timed_out = tokio::time::timeout(Duration::from_millis(10), admit(&core, &key)).await;
        assert!(timed_out.is_err(), "the stuck check answered");
        assert!(store.inner.inflight().is_empty(), "a slot leaked");
    }
}

/// A shadow-mode would-be rejection was charged nothing, so it settles nothing (a refund
/// would hand out budget it never paid).
#[tokio::test]
async fn a_shadow_rejection_settles_nothing() {
    let metrics = Arc::new(Metrics::new().unwrap());
    let (core, _) = memory_core();
    let shadow = req("198.51.100.3", "/shadow", Some("good-key"));
    let mut first = admit(&core, &shadow).await.unwrap();
    assert_eq!(first.settle(3, &metrics), 2, "an admitted request settles");
    drop(first);
    let _second = admit(&core, &shadow).await.unwrap();
    let mut would_be = admit(&core, &shadow).await.unwrap();
    assert!(would_be.shadow_rejected);
    assert_eq!(would_be.settle(0, &metrics), 0);
}

/// Automatic bans on the memory store: the `after`-th rejection within the span bans the
/// identity (an IPv6 client by its /64); the ban refuses before any limit, ends on time,
/// and other identities are untouched. Key bans work alike.
#[tokio::test]
async fn repeated_rejections_ban_then_the_ban_ends() {
    let config = r#"
[limits.ip]
per_minute = 2
ban = { after = 3, within_secs = 10, for_secs = 60 }

[tiers.free]
key = { per_minute = 1, ban = { after = 2, within_secs = 10, for_secs = 30 } }

[[keys]]
id = "k1"
key = "good-key"
tenant = "acme"
tier = "free"

[[routes]]
name = "public"
path_prefix = "/public"
upstreams = ["127.0.0.1:1"]
auth = "none"

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["127.0.0.1:1"]
auth = "required"
"#;
    let clock = Arc::new(ManualClock::at(NOW));
    let c = crate::config::parse("t.toml", config).unwrap();
    let metrics = Arc::new(Metrics::new().unwrap());
    let core = Core::with_clock(
        Runtime::from_config(c).unwrap(),
        Arc::new(MemoryStore::with_clock(clock.clone())),
        metrics,
        clock.clone(),
    )
    .unwrap();
    let run = |client: &'static str, path: &'static str, key: Option<&'static str>| {
        let core = &core;
        async move {
            let r = admit(core, &req(client, path, key)).await;
            let k = kind(&r);
            if let Ok(a) = r {
                a.finish(Ending::Completed { status: 200 });
            }
            k
        }
    };
    // (client, outcome): two pass, three 429s ban the /64 on the third.
    let steps = [
        ("2001:db8::1", "ok"),
        ("2001:db8::2", "ok"),
        ("2001:db8::3", "429 ip"),
        ("2001:db8::4", "429 ip"),
        ("2001:db8::5", "429 ip"),
        ("2001:db8::6", "403 ban ip"),
        ("2001:db8:0:1::1", "ok"),
    ];
    for (i, (client, want)) in steps.iter().enumerate() {
        assert_eq!(run(client, "/public/x", None).await, *want, "step {i}");
    }
    let bans = core.bans.list(NOW);
    assert_eq!(bans.len(), 1);
    assert_eq!(bans[0].value, "2001:db8::/64");
    match admit(&core, &req("2001:db8::7", "/public/x", None)).await {
        Err(f) => {
            let reply = crate::reply::render(
                &f.rejection,
                NOW + 1_500,
                crate::config::RateLimitHeaders::XRateLimit,
            );
            let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
            assert_eq!(
                body,
                serde_json::json!({"error": "blocked", "scope": "ip",
                    "reason": "automatic: 3 rate-limit rejections in 10s", "retry_after": 59})
            );
            assert_eq!(reply.headers[0].1, "59");
        }
        Ok(_) => panic!("banned client admitted"),
    }
    // The ban ends after 60 s; the minute window has refilled by then.
    clock.advance(Duration::from_secs(60));
    assert_eq!(run("2001:db8::8", "/public/x", None).await, "ok");

    // Rejections spread wider than the span do not ban.
    clock.advance(Duration::from_secs(120));
    assert_eq!(run("198.51.100.1", "/v1/x", Some("good-key")).await, "ok");
    assert_eq!(
        run("198.51.100.1", "/v1/x", Some("good-key")).await,
        "429 key"
    );
    clock.advance(Duration::from_secs(11));
    assert_eq!(
        run("198.51.100.1", "/v1/x", Some("good-key")).await,
        "429 key"
    );
    assert!(core.bans.list(core.clock.now_ms()).is_empty());
    // The second rejection within 10 s bans the key (from the next request on).
    assert_eq!(
        run("198.51.100.1", "/v1/x", Some("good-key")).await,
        "429 key"
    );
    assert_eq!(
        run("198.51.100.1", "/v1/x", Some("good-key")).await,
        "403 ban key"
    );
    // Lifting it by its id admits the key again (up to its limit).
    let id = core.bans.list(core.clock.now_ms())[0].id();
    assert!(core.bans.lift(id).is_some());
    assert_eq!(
        run("198.51.100.1", "/v1/x", Some("good-key")).await,
        "429 key"
    );
}

/// `GET /v1/top`'s counts for one scope: (identity, requests, rejected).
fn top_rows(core: &Core, scope: Scope) -> Vec<(String, u64, u64)> {
    let sketch = core.top.scope(scope).unwrap();
    sketch
        .top(10, NOW)
        .into_iter()
        .map(|h| (h.identity.to_string(), h.requests, h.rejected))
        .collect()
}

/// Every decided request feeds the top sketch: its address always, its key and tenant
/// once identified; a 429 counts as rejected for each, a block or a 401 does not.
#[tokio::test]
async fn top_counts_requests_and_rejections_per_identity() {
    let (core, _) = memory_core();
    // good-key: key limit 2 per minute, so the third is a 429 (key scope).
    for _ in 0..3 {
        admit(&core, &req("198.51.100.1", "/v1/x", Some("good-key")))
            .await
            .ok();
    }
    admit(&core, &req("198.51.100.2", "/v1/x", Some("blocked-key")))
        .await
        .ok(); // 403 key
    admit(&core, &req("198.51.100.2", "/v1/x", None)).await.ok(); // 401
    let row = |who: &str, n, r| (who.to_string(), n, r);
    assert_eq!(
        top_rows(&core, Scope::Ip),
        [row("198.51.100.1", 3, 1), row("198.51.100.2", 2, 0)]
    );
    assert_eq!(
        top_rows(&core, Scope::Key),
        [row("k1", 3, 1), row("k_blocked", 1, 0)]
    );
    assert_eq!(top_rows(&core, Scope::Tenant), [row("acme", 4, 1)]);
}

/// An adaptive route's factor multiplies every limit checked for its requests: the rate
/// windows (as the decision and the 429 show them) and the `concurrent` slots; another
/// route keeps its limits; a reload keeps the factor.
#[tokio::test]
async fn adaptive_factor_scales_the_route_limits() {
    use crate::adaptive::Factor;
    const ADAPTIVE: &str = r#"
[limits.ip]
per_minute = 10
concurrent = 5

[[routes]]
name = "slow"
path_prefix = "/slow"
upstreams = ["127.0.0.1:1"]
auth = "none"
adaptive = { target_p99_ms = 100, min_factor = 0.5 }

[[routes]]
name = "other"
path_prefix = "/"
upstreams = ["127.0.0.1:1"]
auth = "none"
"#;
    let store = Arc::new(MemoryStore::with_clock(ManualClock::at(NOW)));
    let core = core_with(ADAPTIVE, store, Arc::new(Metrics::new().unwrap()));
    let rt = core.runtime();
    let slow = rt.router.find_by_name("slow").unwrap();
    let state = core.route_state(slow).adaptive().unwrap().clone();
    let settings = slow.route.adaptive.unwrap();
    let other = rt.router.find_by_name("other").unwrap();
    assert!(core.route_state(other).adaptive().is_none());
    state.record(NOW, Duration::from_millis(300), false);
    assert_eq!(state.tick(&settings, NOW + 1_000), Factor::from_f64(0.8));

    // 10 per minute x 0.8 = 8 on /slow, in the decision and in the 429.
    let limit = |a: &Admission| a.rate.unwrap().decision.limit;
    for _ in 0..8 {
        let a = admit(&core, &req("198.51.100.1", "/slow/x", None))
            .await
            .unwrap();
        assert_eq!(limit(&a), 8);
    }
    match admit(&core, &req("198.51.100.1", "/slow/x", None)).await {
        Err(Refusal {
            rejection: Rejection::RateLimited { governing, .. },
            ..
        }) => assert_eq!(governing.decision.limit, 8),
        other => panic!("expected a 429, got {}", kind(&other)),
    }
    let a = admit(&core, &req("198.51.100.2", "/x", None))
        .await
        .unwrap();
    assert_eq!(limit(&a), 10, "another route keeps its limits");

    // 5 slots x 0.8 = 4 on /slow.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(
            admit(&core, &req("198.51.100.3", "/slow/x", None))
                .await
                .unwrap(),
        );
    }
    match admit(&core, &req("198.51.100.3", "/slow/x", None)).await {
        Err(Refusal {
            rejection: Rejection::Concurrent { full, .. },
            ..
        }) => assert_eq!(full.limit, 4),
        other => panic!("expected 429 concurrent, got {}", kind(&other)),
    }
    drop(held);

    // A reload keeps the state of a route that stays adaptive under its name.
    let c = crate::config::parse("t.toml", ADAPTIVE).unwrap();
    core.swap_runtime(Runtime::from_config(c).unwrap()).unwrap();
    let again = core.runtime();
    let entry = again.router.find_by_name("slow").unwrap();
    let live = core.route_state(entry);
    assert_eq!(live.factor(), Factor::from_f64(0.8));
    assert!(Arc::ptr_eq(live.adaptive().unwrap(), &state));
}

/// A refund finds the request's own sliding-log entry even when the store's clock reads
/// later than the admission's (the clock ticked between the two readings): the store
/// decides at the time the admission records, and the settle names that time.
#[tokio::test]
async fn a_refund_finds_its_entry_when_the_clock_ticks() {
    let config = r#"
[tiers.t]
key = { per_hour = 100, algorithm = "sliding_log" }

[[keys]]
id = "k1"
key = "good-key"
tenant = "acme"
tier = "t"

[[routes]]
name = "llm"
path_prefix = "/v1"
upstreams = ["127.0.0.1:1"]
cost = 10
"#;
    let c = crate::config::parse("t.toml", config).unwrap();
    let metrics = Arc::new(Metrics::new().unwrap());
    // The store's own clock is 1 ms ahead of the pipeline's.
    let store = Arc::new(MemoryStore::with_clock(ManualClock::at(NOW + 1)));
    let core = Core::with_clock(
        Runtime::from_config(c).unwrap(),
        store,
        metrics.clone(),
        Arc::new(ManualClock::at(NOW)),
    )
    .unwrap();
    let mut a = admit(&core, &req("198.51.100.1", "/v1/x", Some("good-key")))
        .await
        .unwrap();
    assert_eq!(a.rate.unwrap().decision.remaining, 90);
    assert_eq!(a.settle(3, &metrics), -7);
    a.finish(Ending::Completed { status: 200 });
    let b = admit(&core, &req("198.51.100.1", "/v1/x", Some("good-key")))
        .await
        .unwrap();
    // 3 used, 10 reserved: 87 left (a lost refund would leave 80).
    assert_eq!(b.rate.unwrap().decision.remaining, 87);
    b.finish(Ending::Completed { status: 200 });
}

/// Who may ban: a decision API (`Origin::Check`) naming a client never strikes unless
/// the scope's ban says `from_check = true`; a proxied request does. At the cap of the
/// table a new ban is refused and counted, and the bans in force stay.
#[tokio::test]
async fn only_proxied_requests_ban_and_a_full_table_refuses() {
    let config = |from_check: bool| {
        format!(
            r#"
[limits.ip]
per_minute = 1000
ban = {{ after = 2, within_secs = 60, for_secs = 600, from_check = {from_check} }}

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["127.0.0.1:1"]
auth = "none"
"#
        )
    };
    let core_for = |from_check| {
        let clock = Arc::new(ManualClock::at(NOW));
        let c = crate::config::parse("t.toml", &config(from_check)).unwrap();
        let mut core = Core::with_clock(
            Runtime::from_config(c).unwrap(),
            Arc::new(MemoryStore::with_clock(clock.clone())),
            Arc::new(Metrics::new().unwrap()),
            clock,
        )
        .unwrap();
        core.bans = Arc::new(crate::bans::Bans::with_caps(2, 100));
        core
    };
    async fn run(core: &Core, client: &str, origin: Origin) -> String {
        let request = AdmitRequest {
            origin,
            cost: Some(1_000), // the attack: a whole window's cost naming a victim
            ..req(client, "/x", None)
        };
        kind(&admit(core, &request).await)
    }
    // Checks naming a victim: refused, never banned.
    let core = core_for(false);
    assert_eq!(run(&core, "192.0.2.1", Origin::Check).await, "ok");
    for _ in 0..5 {
        assert_eq!(run(&core, "192.0.2.1", Origin::Check).await, "429 ip");
    }
    assert!(core.bans.list(NOW).is_empty(), "a check banned its victim");
    // The same scope opted in: checks ban.
    let core = core_for(true);
    for want in ["ok", "429 ip", "429 ip", "403 ban ip"] {
        assert_eq!(run(&core, "192.0.2.1", Origin::Check).await, want);
    }
    // Proxied requests always strike. The attacker is banned first, then a flood of
    // bans on others fills the table (cap 2): the rest are refused and counted, and the
    // attacker's ban stays.
    let core = core_for(false);
    for client in ["192.0.2.66", "198.51.100.1", "198.51.100.2", "198.51.100.3"] {
        for want in ["ok", "429 ip", "429 ip"] {
            assert_eq!(run(&core, client, Origin::Proxy).await, want, "{client}");
        }
    }
    assert_eq!(run(&core, "192.0.2.66", Origin::Proxy).await, "403 ban ip");
    assert_eq!(
        run(&core, "198.51.100.1", Origin::Proxy).await,
        "403 ban ip"
    );
    assert_eq!(run(&core, "198.51.100.3", Origin::Proxy).await, "429 ip");
    assert_eq!(core.metrics.bans_dropped[0].get(), 2);
    assert_eq!(core.bans.list(NOW).len(), 2);
}

/// A settle refunds every window the request was charged in, the route's own tables and
/// custom scopes included (their times are found by position in the re-derived check):
/// after a settle from 10 to 3 each window holds 3 of the request, not 10.
#[tokio::test]
async fn a_settle_refunds_route_tables_and_custom_scopes() {
    let config = r#"
[scopes.user]
from = "header:X-User"
[limits.user]
per_hour = 100
algorithm = "sliding_log"

[tiers.t]
key = { per_hour = 100, algorithm = "sliding_log" }

[[keys]]
id = "k1"
key = "good-key"
tenant = "acme"
tier = "t"

[[routes]]
name = "llm"
path_prefix = "/v1"
upstreams = ["127.0.0.1:1"]
cost = 10
limits = { key = { per_hour = 50, algorithm = "sliding_log" }, user = { per_hour = 30, algorithm = "sliding_log" } }
"#;
    let c = crate::config::parse("t.toml", config).unwrap();
    let metrics = Arc::new(Metrics::new().unwrap());
    let store = Arc::new(MemoryStore::with_clock(ManualClock::at(NOW + 1)));
    let core = Core::with_clock(
        Runtime::from_config(c).unwrap(),
        store,
        metrics.clone(),
        Arc::new(ManualClock::at(NOW)),
    )
    .unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert("x-user", http::HeaderValue::from_static("alice"));
    let request = || AdmitRequest {
        attrs: Attrs {
            headers: Some(&headers),
            query: None,
        },
        ..req("198.51.100.1", "/v1/x", Some("good-key"))
    };
    let mut a = admit(&core, &request()).await.unwrap();
    // The tightest window governs: the route's table of the user scope (30), 20 left.
    assert_eq!(a.rate.unwrap().decision.remaining, 20);
    assert_eq!(a.rate.unwrap().scope.as_str(), "llm.user");
    assert_eq!(a.settle(3, &metrics), -7);
    a.finish(Ending::Completed { status: 200 });
    let b = admit(&core, &request()).await.unwrap();
    // 3 used + 10 reserved in llm.user: 17 left (a refund lost there: 10).
    assert_eq!(b.rate.unwrap().decision.remaining, 17);
    let names: Vec<&str> = b.applied.scopes().map(|s| s.as_str()).collect();
    assert_eq!(names, ["key", "user", "llm.key", "llm.user"]);
    b.finish(Ending::Completed { status: 200 });
}

/// Each scope counts its own ban strikes: a rejection by `[limits.ip]` does not count
/// towards a route's `login.ip` rule (pooled, it would ban one rejection early, or, past
/// the rule's `after`, never), though the ban it imposes is an `ip` ban.
#[tokio::test]
async fn each_scope_counts_its_own_strikes() {
    let config = r#"
[limits.ip]
per_minute = 100
ban = { after = 3, within_secs = 60, for_secs = 600 }

[[routes]]
name = "login"
path_prefix = "/login"
upstreams = ["127.0.0.1:1"]
auth = "none"
limits = { ip = { per_minute = 1, ban = { after = 2, within_secs = 60, for_secs = 600 } } }

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["127.0.0.1:1"]
auth = "none"
"#;
    let core = core_with(
        config,
        Arc::new(MemoryStore::with_clock(ManualClock::at(NOW))),
        Arc::new(Metrics::new().unwrap()),
    );
    let huge = AdmitRequest {
        cost: Some(1_000),
        ..req("192.0.2.9", "/x", None)
    };
    assert_eq!(kind(&admit(&core, &huge).await), "429 ip");
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = admit(&core, &req("192.0.2.9", "/login", None)).await;
        seen.push(kind(&r));
        if let Ok(a) = r {
            a.finish(Ending::Completed { status: 200 });
        }
    }
    assert_eq!(seen, ["ok", "429 login.ip", "429 login.ip", "403 ban ip"]);
}

/// `concurrent` on a custom scope: one request in flight per header value; another value
/// (or none) is not held back, and the slot comes back when the request ends.
#[tokio::test]
async fn a_custom_scope_takes_concurrency_slots() {
    let config = r#"
[scopes.user]
from = "header:X-User"
[limits.user]
per_minute = 100
concurrent = 1

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["127.0.0.1:1"]
auth = "none"
"#;
    let core = core_with(
        config,
        Arc::new(MemoryStore::with_clock(ManualClock::at(NOW))),
        Arc::new(Metrics::new().unwrap()),
    );
    let with_user = |user: &'static str| {
        let mut h = http::HeaderMap::new();
        h.insert("x-user", http::HeaderValue::from_static(user));
        h
    };
    let (alice, bob) = (with_user("alice"), with_user("bob"));
    let as_user = |h| AdmitRequest {
        attrs: Attrs {
            headers: Some(h),
            query: None,
        },
        ..req("192.0.2.9", "/x", None)
    };
    let first = admit(&core, &as_user(&alice)).await.unwrap();
    assert_eq!(
        kind(&admit(&core, &as_user(&alice)).await),
        "429 concurrent user"
    );
    let other = admit(&core, &as_user(&bob)).await.unwrap();
    let anonymous = admit(&core, &req("192.0.2.9", "/x", None)).await.unwrap();
    first.finish(Ending::Completed { status: 200 });
    let again = admit(&core, &as_user(&alice)).await.unwrap();
    for a in [other, anonymous, again] {
        a.finish(Ending::Completed { status: 200 });
    }
}

/// A decision API's cost above a window's capacity is 400 (no wait would admit it),
/// charges nothing and strikes nothing; the same cost on a proxied request (a route's
/// cost, checked when the config loads) stays a limit decision.
#[tokio::test]
async fn a_check_cost_no_window_holds_is_refused() {
    let (core, _) = memory_core();
    let run = |origin, cost| {
        let request = AdmitRequest {
            origin,
            cost: Some(cost),
            ..req("192.0.2.5", "/opt/x", None)
        };
        let core = &core;
        async move { kind(&admit(core, &request).await) }
    };
    assert_eq!(run(Origin::Check, 6).await, "400 cost 6>5");
    assert_eq!(run(Origin::Check, 5).await, "ok", "nothing was charged");
    assert_eq!(run(Origin::Check, 1).await, "429 ip");
    assert_eq!(run(Origin::Proxy, 6).await, "429 ip");
}

/// The violation log is whatever `EventSink` the core is given: each rejection is pushed
/// to it (the limit's identity, limit and count), and so is the ban the rejections
/// lead to.
#[tokio::test]
async fn rejections_and_bans_go_to_the_event_sink() {
    #[derive(Default)]
    struct Sink(Mutex<Vec<crate::violations::Event>>);
    impl crate::violations::EventSink for Sink {
        fn push(&self, event: crate::violations::Event) {
            self.0.lock().unwrap().push(event);
        }
    }
    const BANNING: &str = r#"
[limits.ip]
per_minute = 1
ban = { after = 2, within_secs = 10, for_secs = 60 }

[[routes]]
name = "open"
path_prefix = "/"
upstreams = ["127.0.0.1:1"]
auth = "none"
"#;
    let c = crate::config::parse("t.toml", BANNING).unwrap();
    let sink = Arc::new(Sink::default());
    let clock = Arc::new(ManualClock::at(NOW));
    let core = Core::builder(
        Runtime::from_config(c).unwrap(),
        Arc::new(MemoryStore::with_clock(clock.clone())),
        Arc::new(Metrics::new().unwrap()),
    )
    .clock(clock)
    .events(Some(sink.clone()))
    .build()
    .unwrap();
    let r = req("198.51.100.7", "/x", None);
    assert!(admit(&core, &r).await.is_ok());
    for _ in 0..2 {
        assert!(admit(&core, &r).await.is_err());
    }
    let events = sink.0.lock().unwrap().clone();
    let shown: Vec<_> = events
        .iter()
        .map(|e| (e.scope, e.limit_key.as_str(), e.limit_value, e.count))
        .collect();
    assert_eq!(
        shown,
        [
            ("ip", "ip:198.51.100.7", 1, 2),
            ("ip", "ip:198.51.100.7", 1, 2),
            ("ip", "ban:ip:198.51.100.7", 2, 2),
        ]
    );
    assert!(events.iter().all(|e| e.ip == ip("198.51.100.7")));
}
