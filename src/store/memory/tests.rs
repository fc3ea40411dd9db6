use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::limiter::{Algorithm, OnFailure, ScopeLimits, WindowLimit};

fn limits(windows: Vec<WindowLimit>) -> ScopeLimits {
    ScopeLimits {
        concurrent: None,
        ban: None,
        windows,
        on_failure: OnFailure::Local,
        message: None,
        count_on: None,
    }
}

fn ip(n: u32) -> Ident {
    Ident::Ip(IpAddr::V4(Ipv4Addr::from(n)))
}

const T0: u64 = 1_764_000_000_000;

/// Many threads racing on one identity admit exactly the limit, for every algorithm.
#[test]
fn exact_under_concurrency_from_many_threads() {
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::LeakyBucket,
    ] {
        let store = Arc::new(MemoryStore::with_clock(ManualClock::at(
            T0 - T0 % 3_600_000,
        )));
        let l = Arc::new(limits(vec![WindowLimit::with_algorithm(
            Window::Hour,
            500,
            alg,
        )]));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (store, l) = (store.clone(), l.clone());
                std::thread::spawn(move || {
                    (0..250)
                        .filter(|_| {
                            let mut c = Check::new(1);
                            c.push(Scope::Key, Ident::Name("k".into()), &l);
                            store.decide(&c).allowed
                        })
                        .count()
                })
            })
            .collect();
        let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(admitted, 500, "{alg:?}");
    }
}

/// When the tenant scope rejects, the key and ip scopes are not charged.
#[test]
fn charges_no_scope_when_tenant_rejects() {
    let store = MemoryStore::with_clock(ManualClock::at(T0));
    let ipl = limits(vec![WindowLimit::new(Window::Minute, 100)]);
    let keyl = limits(vec![WindowLimit::new(Window::Minute, 10)]);
    let tenl = limits(vec![WindowLimit::new(Window::Minute, 2)]);
    let check = || {
        let mut c = Check::new(1);
        c.push(Scope::Ip, ip(1), &ipl);
        c.push(Scope::Key, Ident::Name("k".into()), &keyl);
        c.push(Scope::Tenant, Ident::Name("t".into()), &tenl);
        c
    };
    assert!(store.decide(&check()).allowed);
    assert!(store.decide(&check()).allowed);
    for _ in 0..5 {
        let v = store.decide(&check());
        assert!(!v.allowed);
        assert_eq!(v.governing.unwrap().scope, Scope::Tenant);
    }
    // The key alone still has 8 left: 2 charged, the 5 rejected ones were not.
    let mut key_only = Check::new(1);
    key_only.push(Scope::Key, Ident::Name("k".into()), &keyl);
    assert_eq!(
        store
            .decide(&key_only)
            .governing
            .unwrap()
            .decision
            .remaining,
        7
    );
}

/// A sprayed million source IPs does not stay in memory: the inline sweep bounds each
/// shard while spraying, and a sweep after the windows pass empties the store.
#[test]
fn memory_stays_bounded_under_an_ip_spray() {
    let clock = ManualClock::at(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let l = limits(vec![WindowLimit::new(Window::Second, 10)]);
    let mut peak = 0;
    for n in 0..1_000_000u32 {
        clock.advance(Duration::from_millis(1));
        let mut c = Check::new(1);
        c.push(Scope::Ip, ip(n), &l);
        assert!(store.decide(&c).allowed);
        if n % 50_000 == 0 {
            peak = peak.max(store.len());
        }
    }
    assert!(peak <= SHARDS * 2 * INLINE_SWEEP_MIN, "peak {peak}");
    assert!(store.len() < 1_000_000);
    clock.advance(Duration::from_millis(100));
    store.sweep();
    assert_eq!(store.len(), 0);
}

/// Sweeping keeps every slot that is not back to its initial value, and what it evicts
/// was indistinguishable from a fresh slot.
#[test]
fn eviction_never_hands_an_active_client_a_fresh_bucket() {
    let clock = ManualClock::at(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let l = limits(vec![
        WindowLimit::new(Window::Minute, 3),
        WindowLimit::new(Window::Hour, 100),
    ]);
    let check = |n| {
        let mut c = Check::new(1);
        c.push(Scope::Ip, ip(n), &l);
        c
    };
    for _ in 0..3 {
        assert!(store.decide(&check(1)).allowed);
    }
    assert!(store.decide(&check(2)).allowed);
    clock.advance(Duration::from_secs(10));
    store.sweep();
    // Half a token has refilled for ip 1: nothing is back to initial, nothing is evicted,
    // and ip 1 is still refused after the sweep.
    assert_eq!(store.len(), 2);
    assert!(!store.decide(&check(1)).allowed);
    // 20 s later ip 2's minute bucket is full again, but its hour window is not: kept.
    clock.advance(Duration::from_secs(20));
    store.sweep();
    assert_eq!(store.len(), 2);
    // After the hour window ends (sliding: two windows), everything is initial again.
    clock.advance(Duration::from_secs(2 * 3600));
    store.sweep();
    assert_eq!(store.len(), 0);
    let v = store.decide(&check(1));
    assert_eq!(v.governing.unwrap().decision.remaining, 2);
}

/// A check with no scopes is unlimited and charges nothing.
#[test]
fn empty_check_is_unlimited() {
    let store = MemoryStore::new();
    assert_eq!(store.decide(&Check::new(1)), Verdict::UNLIMITED);
    assert!(store.is_empty());
}

/// `settle` through the trait, on every window of every scope: a debt refuses later
/// requests (exactly until it is paid off) and keeps the identity from eviction; a
/// refund gives back to every window; a refund for an identity not held does nothing.
#[tokio::test]
async fn settle_charges_and_refunds_every_window() {
    let clock = ManualClock::at(T0 - T0 % 60_000);
    let now = clock.now_ms();
    let keyl = limits(vec![
        WindowLimit::new(Window::Second, 10), // token bucket
        WindowLimit::with_algorithm(Window::Minute, 100, Algorithm::FixedWindow),
    ]);
    let ipl = limits(vec![WindowLimit::with_algorithm(
        Window::Minute,
        50,
        Algorithm::SlidingLog,
    )]);
    let check = |cost| {
        let mut c = Check::new(cost);
        c.push(Scope::Ip, ip(1), &ipl);
        c.push(Scope::Key, Ident::Name("k".into()), &keyl);
        c
    };
    let fixedl = limits(vec![keyl.windows[1]]);
    let mem = MemoryStore::with_clock(clock.clone());
    let store: &dyn LimitStore = &mem;
    assert!(store.check(&check(4)).await.unwrap().allowed);
    // True cost 16: 12 more on every window. The bucket (6 left) owes 6: 600 ms, then
    // 100 ms per token.
    store.settle(&check(4), 12, now.into());
    let v = store.check(&check(1)).await.unwrap();
    let g = v.governing.unwrap();
    assert_eq!(
        (v.allowed, g.scope, g.decision.retry_after_ms),
        (false, Scope::Key, 700)
    );
    clock.advance(Duration::from_millis(699));
    assert!(!store.check(&check(1)).await.unwrap().allowed);
    clock.advance(Duration::from_millis(1));
    let v = store.check(&check(1)).await.unwrap();
    assert!(v.allowed);
    // The minute windows hold 4 + 12 + 1.
    clock.advance(Duration::from_secs(1));
    let minute = |v: Verdict| v.governing.unwrap().decision.remaining;
    let peek = || {
        let mut c = Check::new(1);
        c.push(Scope::Ip, ip(1), &ipl);
        c.peek = true;
        c
    };
    assert_eq!(minute(store.check(&peek()).await.unwrap()), 32); // 50 - 17 - 1
                                                                 // A refund of the first request (its true cost 0 after all: 4 back, not 15): the
                                                                 // log's entry and the fixed window give it back; the bucket, refilled since, not.
    store.settle(&check(4), -15, now.into());
    assert_eq!(minute(store.check(&peek()).await.unwrap()), 36);
    let mut fixed = Check::new(1);
    fixed.push(Scope::Key, Ident::Name("k".into()), &fixedl);
    fixed.peek = true;
    assert_eq!(minute(store.check(&fixed).await.unwrap()), 86); // 100 - 13 - 1
                                                                // Unknown identity: nothing created.
    let mut other = Check::new(4);
    other.push(Scope::Ip, ip(2), &ipl);
    let before = mem.len();
    store.settle(&other, -3, now.into());
    assert_eq!(mem.len(), before);
}

/// A debt keeps an identity from eviction until it is paid off; refunds of unknown
/// identities create nothing.
#[test]
fn debt_outlives_eviction_and_refunds_create_nothing() {
    let clock = ManualClock::at(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let l = limits(vec![WindowLimit::new(Window::Second, 10)]);
    let check = |n: u32| {
        let mut c = Check::new(1);
        c.push(Scope::Ip, ip(n), &l);
        c
    };
    store.settle_at(&check(1), -1, T0, T0);
    assert!(store.is_empty());
    assert!(store.decide(&check(1)).allowed);
    store.settle_at(&check(1), 15, T0, T0); // 9 left - 15: 0.6 s to pay off, 1 s to fill
    store.sweep_at(T0 + 1_599);
    assert_eq!(store.len(), 1);
    let v = store.decide_at(&check(1), T0 + 1_599);
    assert_eq!(v.governing.unwrap().decision.remaining, 8);
    store.sweep_at(T0 + 1_600);
    assert_eq!(store.len(), 1);
    store.sweep_at(T0 + 10_000);
    assert!(store.is_empty());
}

/// `max_states`: one shard per 4,096 states (a power of two, at most 64), each with its
/// share of the bound.
#[test]
fn max_states_sizes_the_shards() {
    for (max, shards, cap) in [
        (1, 1, 1),
        (100, 1, 100),
        (8_191, 1, 8_191),
        (8_192, 2, 4_096),
        (DEFAULT_MAX_STATES, 64, 4_096),
        (1 << 24, 64, 1 << 18),
    ] {
        let store = MemoryStore::new().with_max_states(max);
        assert_eq!(store.shards.shard_count(), shards, "{max}");
        assert!(store.shards.iter_locked().all(|s| s.cap == cap), "{max}");
        assert_eq!(store.max_states(), max);
    }
}

/// Past `max_states` the least recently used states go: the oldest caller's limit
/// starts afresh while a caller used since keeps its count; idle states are swept before
/// any active one is evicted, and only evictions of active states are counted.
#[test]
fn least_recently_used_states_are_evicted_at_the_bound() {
    const MAX: usize = 64;
    let clock = ManualClock::at(T0);
    let counter = prometheus::IntCounter::new("evictions", "test").unwrap();
    let store = MemoryStore::with_clock(clock.clone())
        .with_max_states(MAX)
        .with_evictions_counter(counter.clone());
    let l = limits(vec![WindowLimit::new(Window::Hour, 3)]);
    let decide = |n: u32| {
        let mut c = Check::new(1);
        c.push(Scope::Ip, ip(n), &l);
        store.decide(&c)
    };
    // Caller 1 (the oldest) and caller 2 spend their 3.
    for n in [1, 2] {
        for _ in 0..3 {
            assert!(decide(n).allowed);
        }
        assert!(!decide(n).allowed);
    }
    // 61 more callers fill the store to 63; caller 2 is used again (still refused).
    for n in 100..161 {
        clock.advance(Duration::from_millis(1));
        assert!(decide(n).allowed);
    }
    assert!(!decide(2).allowed);
    assert_eq!(store.len(), 63);
    // Caller 1000 makes 64; caller 1001 finds the store full: the least recently used
    // eighth (8) goes, caller 1 first; caller 2 was used since and stays.
    assert!(decide(1_000).allowed);
    assert!(decide(1_001).allowed);
    assert!(store.len() <= MAX);
    assert_eq!(store.evictions(), 8);
    assert_eq!(counter.get(), 8);
    assert!(!decide(2).allowed, "a recently used caller kept its count");
    let fresh = decide(1);
    assert!(fresh.allowed, "the oldest caller's state was evicted");
    assert_eq!(fresh.governing.unwrap().decision.remaining, 2);
    // However many more distinct callers come, the bound holds.
    for n in 10_000..20_000 {
        decide(n);
        assert!(store.len() <= MAX);
    }
    // Idle states are swept first, and not counted as evictions: after the hour every
    // state is back to initial.
    let before = store.evictions();
    clock.advance(Duration::from_secs(2 * 3_600));
    for n in 30_000..30_060 {
        decide(n);
    }
    assert_eq!(store.evictions(), before);
}

/// A key's state is never evicted: a flood of fresh addresses (or a custom scope's
/// header values) cannot restart a key's day quota; the bound holds for the rest.
#[test]
fn a_flood_of_fresh_identities_never_evicts_a_key() {
    const MAX: usize = 64;
    let clock = ManualClock::at(T0);
    let store = MemoryStore::with_clock(clock.clone()).with_max_states(MAX);
    let day = limits(vec![WindowLimit::new(Window::Day, 3)]);
    let key = Ident::Name("key_a".into());
    let spend_key = || {
        let mut c = Check::new(1);
        c.push(Scope::Key, key.clone(), &day);
        store.decide(&c)
    };
    for _ in 0..3 {
        assert!(spend_key().allowed);
    }
    assert!(!spend_key().allowed);
    for n in 0..10_000 {
        clock.advance(Duration::from_millis(1));
        let mut c = Check::new(1);
        c.push(Scope::Ip, ip(n), &day);
        store.decide(&c);
        assert!(store.len() <= MAX + 1);
    }
    assert!(store.evictions() > 0);
    assert!(
        !spend_key().allowed,
        "the key's day quota was not restarted"
    );
}

/// The default bound holds a full store within `max_states`, and a state costs what the
/// README says: at most 300 heap bytes (hash table included) for an address with two
/// windows, as the `[limits.ip]` scope has.
#[test]
fn the_default_bound_holds_and_a_state_is_small() {
    let clock = ManualClock::at(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let l = limits(vec![
        WindowLimit::new(Window::Minute, 100),
        WindowLimit::new(Window::Hour, 1_000),
    ]);
    let n = DEFAULT_MAX_STATES as u32 + 50_000;
    for i in 0..n {
        let mut c = Check::new(1);
        c.push(Scope::Ip, ip(i), &l);
        store.decide(&c);
    }
    assert!(store.len() <= DEFAULT_MAX_STATES, "{}", store.len());
    assert!(store.evictions() >= 50_000);
    let per_state = store.heap_bytes() / store.len();
    eprintln!(
        "{} states, {per_state} heap bytes per state, {} evicted",
        store.len(),
        store.evictions()
    );
    assert!(per_state <= 300, "{per_state} bytes per state");
}
