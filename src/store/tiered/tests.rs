use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};

use super::*;
use crate::limiter::{Ident, Scope, Window, WindowLimit};

/// A store that fails on demand and counts its calls (a stateful fake, not a mock).
struct FakeStore {
    up: AtomicBool,
    calls: AtomicUsize,
    settles: AtomicUsize,
    inner: MemoryStore,
}

#[async_trait]
impl LimitStore for FakeStore {
    async fn check(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.up.load(Ordering::SeqCst) {
            Ok(self.inner.decide(check))
        } else {
            Err(StoreError::Timeout(25))
        }
    }
    fn name(&self) -> &'static str {
        "fake"
    }
    fn settle(&self, check: &Check<'_>, delta: i64, decided_at: DecidedAt) {
        self.settles.fetch_add(1, Ordering::SeqCst);
        self.inner.settle(check, delta, decided_at);
    }
}

fn limits(limit: u32, on_failure: OnFailure) -> ScopeLimits {
    ScopeLimits {
        concurrent: None,
        ban: None,
        windows: vec![WindowLimit::new(Window::Hour, limit)],
        on_failure,
        message: None,
        count_on: None,
    }
}

fn setup(instances: u32) -> (Arc<FakeStore>, TieredStore) {
    let fake = Arc::new(FakeStore {
        up: AtomicBool::new(true),
        calls: AtomicUsize::new(0),
        settles: AtomicUsize::new(0),
        inner: MemoryStore::new(),
    });
    let metrics = Arc::new(Metrics::new().unwrap());
    let t = TieredStore::new(
        fake.clone(),
        Arc::new(MemoryStore::new()),
        Arc::new(AtomicU32::new(instances)),
        metrics,
    );
    (fake, t)
}

fn check<'a>(l: &'a ScopeLimits, g: Option<&'a ScopeLimits>) -> Check<'a> {
    let mut c = Check::new(1);
    c.push(Scope::Key, Ident::Name("k".into()), l);
    if let Some(g) = g {
        c.push(Scope::Global, Ident::Global, g);
    }
    c
}

/// Local scopes fall back to the memory store at limit / instances; the breaker then
/// stops calling the failing store; a probe finds it again and sharing resumes.
#[tokio::test(start_paused = true)]
async fn falls_back_locally_at_a_divided_limit_and_recovers() {
    let (fake, t) = setup(4);
    let l = limits(40, OnFailure::Local);
    assert!(!t.check(&check(&l, None)).await.unwrap().fallback);
    fake.up.store(false, Ordering::SeqCst);
    let mut admitted = 0;
    for _ in 0..30 {
        let v = t.check(&check(&l, None)).await.unwrap();
        assert!(v.fallback);
        admitted += usize::from(v.allowed);
    }
    assert_eq!(admitted, 10, "40 per hour over 4 instances");
    assert_eq!(
        fake.calls.load(Ordering::SeqCst),
        1 + FAILURES_TO_OPEN as usize,
        "the open breaker stops calling"
    );
    assert_eq!(t.breaker().state(), BreakerState::Open);
    assert!(!t.healthy());
    fake.up.store(true, Ordering::SeqCst);
    tokio::time::advance(PROBE_EVERY).await;
    let v = t.check(&check(&l, None)).await.unwrap();
    assert!(!v.fallback, "the probe went to the shared store");
    assert_eq!(t.breaker().state(), BreakerState::Closed);
    // The shared store never saw what was counted locally: 1 + 1 charged there.
    assert_eq!(v.governing.unwrap().decision.remaining, 38);
}

/// A fail-closed scope refuses the request; a fail-open scope is skipped.
#[tokio::test(start_paused = true)]
async fn closed_refuses_and_open_skips() {
    let (fake, t) = setup(1);
    fake.up.store(false, Ordering::SeqCst);
    let closed = limits(5, OnFailure::Closed);
    assert!(t.check(&check(&closed, None)).await.is_err());
    let open = limits(1, OnFailure::Open);
    let local = limits(2, OnFailure::Local);
    let mut admitted = 0;
    for _ in 0..5 {
        let v = t.check(&check(&open, Some(&local))).await.unwrap();
        admitted += usize::from(v.allowed);
    }
    assert_eq!(
        admitted, 2,
        "only the local scope limits; the open scope is ignored"
    );
}

/// Division keeps at least one request per window.
#[test]
fn divide_rounds_down_to_at_least_one() {
    let l = ScopeLimits {
        concurrent: None,
        ban: None,
        windows: vec![WindowLimit::new(Window::Second, 10).with_burst(2.0)],
        on_failure: OnFailure::Local,
        message: None,
        count_on: None,
    };
    let d = divide(&l, 3);
    assert_eq!((d.windows[0].limit, d.windows[0].capacity), (3, 6));
    assert_eq!(divide(&l, 100).windows[0].limit, 1);
}

/// Settles follow the breaker: closed, to the shared store; open, a debt is charged to
/// the local fallback at the divided limit and a refund is dropped.
#[tokio::test(start_paused = true)]
async fn settles_follow_the_breaker() {
    let (fake, t) = setup(4);
    let l = limits(40, OnFailure::Local);
    let c = check(&l, None);
    assert!(t.check(&c).await.unwrap().allowed);
    t.settle(&c, 5, 0.into());
    assert_eq!(fake.settles.load(Ordering::SeqCst), 1);
    let v = t.check(&c).await.unwrap();
    assert_eq!(
        v.governing.unwrap().decision.remaining,
        33,
        "40 - 1 - 5 - 1"
    );
    fake.up.store(false, Ordering::SeqCst);
    for _ in 0..FAILURES_TO_OPEN {
        assert!(t.check(&c).await.unwrap().fallback);
    }
    assert_eq!(t.breaker().state(), BreakerState::Open);
    // 10 per hour locally, 3 charged by the failing checks: a debt of 4 leaves 3.
    t.settle(&c, 4, 0.into());
    t.settle(&c, -4, 0.into()); // dropped: its charge may live in the shared store
    assert_eq!(fake.settles.load(Ordering::SeqCst), 1);
    let admitted = (0..10)
        .filter(|_| t.fallback().decide(&divided(&l)).allowed)
        .count();
    assert_eq!(admitted, 3);
}

fn divided(l: &ScopeLimits) -> Check<'static> {
    let d: &'static ScopeLimits = Box::leak(Box::new(divide(l, 4)));
    let mut c = Check::new(1);
    c.push(Scope::Key, Ident::Name("k".into()), d);
    c
}
