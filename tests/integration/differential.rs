//! Differential test: the Rust algorithms (MemoryStore) and their Lua twins (RedisStore on
//! a real redis-server) fed the same random sequences of (time step, cost) at the same
//! injected times must give identical decisions.

use std::sync::Arc;

use throttle::clock::{Clock, ManualClock};
use throttle::limiter::{
    Algorithm, Check, Ident, OnFailure, Scope, ScopeLimits, Verdict, Window, WindowLimit,
};
use throttle::store::redis::Target;
use throttle::store::{LimitStore, MemoryStore, RedisStore};

use crate::support::redis::RedisServer;

/// xorshift64*, so a failure replays exactly.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

fn limits(windows: Vec<WindowLimit>) -> ScopeLimits {
    ScopeLimits {
        windows,
        on_failure: OnFailure::Closed,
        message: None,
    }
}

/// Replays `steps` random requests through both stores and compares every verdict.
async fn replay(
    redis: &RedisServer,
    prefix: &str,
    scopes: &[(Scope, Ident, ScopeLimits)],
    seed: u64,
    steps: usize,
    max_step_ms: u64,
    start: u64,
) {
    let clock = Arc::new(ManualClock::at(start));
    let memory = MemoryStore::with_clock(clock.clone());
    let redis_store = RedisStore::new(
        Target::Single(redis.url()),
        std::time::Duration::from_secs(2),
        prefix,
    )
    .with_clock(clock.clone());
    let max_cost = scopes
        .iter()
        .flat_map(|(_, _, l)| l.windows.iter().map(|w| w.limit))
        .min()
        .unwrap()
        .min(3);
    let mut rng = Rng(seed);
    let (mut allowed, mut rejected) = (0, 0);
    for i in 0..steps {
        clock.advance(std::time::Duration::from_millis(rng.below(max_step_ms)));
        let cost = 1 + rng.below(u64::from(max_cost)) as u32;
        let mut check = Check::new(cost);
        for (scope, ident, l) in scopes {
            check.push(*scope, ident.clone(), l);
        }
        let m: Verdict = memory.decide_at(&check, clock.now_ms());
        let r: Verdict = redis_store.check(&check).await.unwrap();
        assert_eq!(
            m,
            r,
            "step {i} (now {}, cost {cost}) diverged:\n memory {m:?}\n redis  {r:?}",
            clock.now_ms()
        );
        if m.allowed {
            allowed += 1
        } else {
            rejected += 1
        }
    }
    assert!(
        allowed > steps / 10 && rejected > steps / 10,
        "sequence too one-sided: {allowed} allowed, {rejected} rejected"
    );
}

/// Every algorithm, on a short and a long window, over random traffic around the limit.
#[tokio::test(flavor = "multi_thread")]
async fn rust_and_lua_agree_per_algorithm() {
    let redis = RedisServer::start().await;
    let cases = [
        (Algorithm::TokenBucket, Window::Second, 5, 1.5),
        (Algorithm::TokenBucket, Window::Hour, 40, 1.0),
        (Algorithm::SlidingWindow, Window::Second, 6, 1.0),
        (Algorithm::SlidingWindow, Window::Minute, 20, 1.0),
        (Algorithm::FixedWindow, Window::Second, 5, 1.0),
        (Algorithm::FixedWindow, Window::Minute, 20, 1.0),
        (Algorithm::SlidingLog, Window::Second, 5, 1.0),
        (Algorithm::SlidingLog, Window::Minute, 15, 1.0),
        (Algorithm::LeakyBucket, Window::Second, 4, 1.0),
        (Algorithm::LeakyBucket, Window::Minute, 30, 1.0),
    ];
    for (n, (alg, window, limit, burst)) in cases.into_iter().enumerate() {
        let l = limits(vec![
            WindowLimit::with_algorithm(window, limit, alg).with_burst(burst)
        ]);
        let step = window.period_ms() / u64::from(limit) * 2;
        let scopes = [(Scope::Ip, Ident::Ip("198.51.100.1".parse().unwrap()), l)];
        replay(
            &redis,
            &format!("d{n}"),
            &scopes,
            0x5EED + n as u64,
            400,
            step,
            1_764_000_000_123,
        )
        .await;
    }
}

/// Calendar months (fixed and sliding counters, with a reset offset) across month ends.
#[tokio::test(flavor = "multi_thread")]
async fn rust_and_lua_agree_on_calendar_months() {
    let redis = RedisServer::start().await;
    for (n, alg) in [Algorithm::FixedWindow, Algorithm::SlidingWindow]
        .into_iter()
        .enumerate()
    {
        let l = limits(vec![
            WindowLimit::with_algorithm(Window::Month, 30, alg).with_jitter_ms(5 * 86_400_000)
        ]);
        let scopes = [(Scope::Tenant, Ident::Name("acme".into()), l)];
        // 400 steps of up to 6 h: about 50 days, over at least one month end.
        replay(
            &redis,
            &format!("m{n}"),
            &scopes,
            77 + n as u64,
            400,
            6 * 3_600_000,
            1_767_000_000_000,
        )
        .await;
    }
}

/// The layered decision: several scopes and windows, mixed algorithms, all-or-nothing.
#[tokio::test(flavor = "multi_thread")]
async fn rust_and_lua_agree_on_layered_checks() {
    let redis = RedisServer::start().await;
    let scopes = [
        (
            Scope::Ip,
            Ident::Ip("2001:db8::7".parse().unwrap()),
            limits(vec![
                WindowLimit::new(Window::Second, 8),
                WindowLimit::new(Window::Minute, 100),
            ]),
        ),
        (
            Scope::Key,
            Ident::Name("key_a".into()),
            limits(vec![
                WindowLimit::with_algorithm(Window::Second, 5, Algorithm::LeakyBucket),
                WindowLimit::with_algorithm(Window::Minute, 60, Algorithm::SlidingLog),
            ]),
        ),
        (
            Scope::Tenant,
            Ident::Name("acme".into()),
            limits(vec![WindowLimit::with_algorithm(
                Window::Minute,
                50,
                Algorithm::SlidingWindow,
            )]),
        ),
        (
            Scope::Global,
            Ident::Global,
            limits(vec![WindowLimit::with_algorithm(
                Window::Second,
                6,
                Algorithm::FixedWindow,
            )]),
        ),
    ];
    replay(&redis, "layered", &scopes, 99, 600, 400, 1_764_000_000_000).await;
}
