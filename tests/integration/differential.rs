//! Differential test: the Rust algorithms (MemoryStore) and their Lua twins (RedisStore on
//! a real redis-server) fed the same random sequences of (time step, cost) at the same
//! injected times must give identical decisions.
//!
//! Leases: the Rust state machine, driven as `lua/check.lua` orders a call (give backs,
//! decide, write if all allow, take), and the script called directly in the wire format
//! of `store::redis::wire`, fed the same random requests (cost, tokens wanted) and
//! give-backs of earlier grants, must give identical decisions and identical grants
//! (tokens, until, tags).

use std::sync::Arc;

use throttle::clock::{Clock, ManualClock};
use throttle::limiter::algorithm::{self as alg, State};
use throttle::limiter::{
    Algorithm, Check, Decision, Ident, OnFailure, Scope, ScopeLimits, Verdict, Window, WindowLimit,
};
use throttle::store::redis::wire::{self, Grant, LeaseArgs, Mode};
use throttle::store::redis::{Target, CHECK_LUA};
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
        concurrent: None,
        ban: None,
        windows,
        on_failure: OnFailure::Closed,
        message: None,
        count_on: None,
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

/// Calendar windows in a time zone (`calendar_tz`, `billing_anchor_day`): the gateway
/// hands the script each window's edges and both sides agree across DST days (23 h,
/// 25 h, Lord Howe's 30-minute shift), Monday weeks, anchored months and a leap day,
/// fixed and sliding counters: plain checks, leases and settles.
fn zoned_cases() -> Vec<(&'static str, WindowLimit, u64)> {
    use throttle::limiter::algorithm::Calendar;
    let cal = |z: &str, a: i64| Some(Calendar::interned(z, a).unwrap());
    let mut cases = Vec::new();
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let w = |window, limit: u32| WindowLimit::with_algorithm(window, limit, alg);
        // Berlin, days through the spring-forward day (2026-03-29, 23 h).
        cases.push((
            "berlin-day",
            w(Window::Day, 30).with_calendar(cal("Europe/Berlin", 1)),
            1_774_415_820_000,
        ));
        // Los Angeles, Monday weeks through the fall-back day (2026-11-01, 25 h).
        cases.push((
            "la-week",
            w(Window::Week, 30).with_calendar(cal("America/Los_Angeles", 1)),
            1_792_473_420_000,
        ));
        // Auckland, months from the 15th, across Feb 2028 (a leap year).
        cases.push((
            "auckland-month-15",
            w(Window::Month, 30).with_calendar(cal("Pacific/Auckland", 15)),
            1_831_094_220_000,
        ));
        // Lord Howe: DST moves the clock by 30 minutes (2026-04-05).
        cases.push((
            "lord-howe-day",
            w(Window::Day, 30).with_calendar(cal("Australia/Lord_Howe", 1)),
            1_775_020_620_000,
        ));
        // Los Angeles months from the 1st with a reset jitter of up to 2 days.
        cases.push((
            "la-month-jitter",
            w(Window::Month, 30)
                .with_jitter_ms(2 * 86_400_000)
                .with_calendar(cal("America/Los_Angeles", 1)),
            1_772_342_220_000,
        ));
    }
    for (name, w, _) in &cases {
        assert!(w.calendar.is_some(), "{name}: the calendar was dropped");
    }
    cases
}

#[tokio::test(flavor = "multi_thread")]
async fn rust_and_lua_agree_on_zoned_calendars() {
    let redis = RedisServer::start().await;
    let mut conn = redis.client().await;
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(CHECK_LUA)
        .query_async(&mut conn)
        .await
        .unwrap();
    for (n, (name, w, start)) in zoned_cases().into_iter().enumerate() {
        // About twice the limit's rate (as the per-algorithm cases).
        let max_step = w.window.period_ms() * 2 / u64::from(w.limit);
        let scopes = [(
            Scope::Tenant,
            Ident::Name(format!("t{n}").into()),
            limits(vec![w]),
        )];
        replay(
            &redis,
            &format!("zc{n}"),
            &scopes,
            0xCA1 + n as u64,
            400,
            max_step,
            start,
        )
        .await;
        let s = lease_replay(
            &mut conn,
            &format!("zl{n}"),
            &scopes,
            0xCA1E + n as u64,
            400,
            max_step,
            start,
        )
        .await;
        assert_exercised(name, &s, 400);
        settle_replay(
            &redis,
            &mut conn,
            &format!("zs{n}"),
            &scopes,
            0xCA15 + n as u64,
            400,
            max_step,
            start,
            0,
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

/// What a lease replay exercised.
#[derive(Debug, Default)]
struct LeaseStats {
    allowed: usize,
    rejected: usize,
    grants: usize,
    returns: usize,
    /// Give-backs that changed the state (the others were forfeited).
    effective: usize,
}

/// Replays `steps` random calls through the Rust state machine and the script (called
/// directly) and compares every decision and grant. Calls: mostly 'check' (random cost,
/// random tokens wanted per window), some 'peek' and 'return'; any call may give back
/// part of an earlier grant of a window (soon, or much later), and some grants are never
/// given back. Time advances in phases of light and heavy traffic, with bursts at one
/// instant; lease_ms varies per call (0 to longer than a quarter of any period).
async fn lease_replay(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    scopes: &[(Scope, Ident, ScopeLimits)],
    seed: u64,
    steps: usize,
    mean_step_ms: u64,
    start: u64,
) -> LeaseStats {
    let script = redis::Script::new(CHECK_LUA);
    let windows: Vec<(WindowLimit, u64)> = scopes
        .iter()
        .flat_map(|(_, ident, l)| l.windows.iter().map(|w| (*w, ident.offset_ms(w))))
        .collect();
    let mut states: Vec<State> = windows
        .iter()
        .map(|(w, _)| State::initial(w.algorithm))
        .collect();
    let mut held: Vec<Option<Grant>> = vec![None; windows.len()];
    let max_cost = windows.iter().map(|(w, _)| w.limit).min().unwrap().min(3);
    let mut rng = Rng(seed);
    let mut now = start;
    let mut stats = LeaseStats::default();
    let (mut slow, mut burst) = (false, 0);
    for i in 0..steps {
        if rng.below(30) == 0 {
            slow = !slow;
        }
        if burst > 0 {
            burst -= 1;
        } else {
            now += match (slow, rng.below(8)) {
                (_, 0) => rng.below(mean_step_ms * 8),
                (true, _) => rng.below(mean_step_ms * 3),
                (false, _) => rng.below(mean_step_ms / 2 + 1),
            };
            if rng.below(8) == 0 {
                burst = rng.below(8);
            }
        }
        let cost = 1 + rng.below(u64::from(max_cost)) as u32;
        let mode = match rng.below(14) {
            0 => Mode::Peek,
            1 | 2 => Mode::Return,
            _ => Mode::Check,
        };
        let lease_ms = [0, 1, 40, 300, 20_000, 100_000_000][rng.below(6) as usize];
        let mut args = vec![LeaseArgs::default(); windows.len()];
        for (j, (w, _)) in windows.iter().enumerate() {
            if let Some(g) = held[j] {
                if rng.below(3) == 0 {
                    args[j].ret = rng.below(g.granted + 1); // 0: all used
                    args[j].from = g;
                    held[j] = None;
                    stats.returns += 1;
                }
            }
            if rng.below(4) != 0 {
                args[j].want = rng.below(u64::from(w.limit.min(40)) / 2 + 3);
            }
        }

        // The script.
        let mut check = Check::new(cost);
        for (scope, ident, l) in scopes {
            check.push(*scope, ident.clone(), l);
        }
        let mut inv = script.prepare_invoke();
        wire::push_header(&mut inv, &now.to_string(), cost, mode, lease_ms);
        let mut at = 0;
        for s in &check.scopes {
            let n = s.limits.windows.len();
            wire::push_scope(&mut inv, prefix, s, None, Some(&args[at..at + n]), now);
            at += n;
        }
        let raw: Vec<u8> = inv.invoke_async(conn).await.unwrap();
        let raw = wire::ints(&raw).unwrap();

        // The Rust twin, in check.lua's order.
        for (j, (w, off)) in windows.iter().enumerate() {
            let a = &args[j];
            if a.from.granted > 0 {
                let f = a.from;
                let before = states[j].clone();
                alg::give_back(
                    &mut states[j],
                    w,
                    now,
                    *off,
                    a.ret,
                    f.tag1,
                    f.tag2,
                    f.granted,
                );
                stats.effective += usize::from(states[j] != before);
            }
        }
        let ctx = || {
            format!(
                "step {i} (now {now}, cost {cost}, {mode:?}, lease_ms {lease_ms}, args {args:?})"
            )
        };
        if mode == Mode::Return {
            assert_eq!(raw, [now as i64, 1], "{}", ctx());
            continue;
        }
        let ds: Vec<Decision> = windows
            .iter()
            .zip(states.iter_mut())
            .map(|((w, off), s)| alg::step(s, w, now, *off, cost, false))
            .collect();
        let all = ds.iter().all(|d| d.allowed);
        let mut grants = vec![Grant::default(); windows.len()];
        if all && mode == Mode::Check {
            for (j, (w, off)) in windows.iter().enumerate() {
                let d = alg::step(&mut states[j], w, now, *off, cost, true);
                assert_eq!(d, ds[j], "{}", ctx());
            }
            for (j, (w, off)) in windows.iter().enumerate() {
                let n = alg::lease_size(args[j].want, ds[j].remaining);
                let len = alg::lease_len(lease_ms, w.window.period_ms());
                if n >= 2 && len >= 1 {
                    let l = alg::take(&mut states[j], w, now, *off, n, now + len);
                    grants[j] = Grant {
                        granted: l.granted,
                        until: l.until,
                        tag1: l.tag1,
                        tag2: l.tag2,
                    };
                }
            }
        }
        let reply = wire::parse_reply(&raw, &check.scopes).unwrap();
        for (j, wd) in reply.decisions.iter().enumerate() {
            assert_eq!(
                wd.decision,
                ds[j],
                "{}: window {j} ({:?} {:?}) decision (lua, rust)",
                ctx(),
                windows[j].0.algorithm,
                windows[j].0.window
            );
        }
        assert_eq!((reply.now, reply.all_allowed), (now, all), "{}", ctx());
        assert_eq!(reply.grants, grants, "{}: grants (lua, rust)", ctx());
        for (j, g) in grants.iter().enumerate() {
            if g.granted > 0 {
                held[j] = Some(*g); // an earlier grant not given back is forfeited
                stats.grants += 1;
            }
        }
        if mode == Mode::Check {
            if all {
                stats.allowed += 1;
            } else {
                stats.rejected += 1;
            }
        }
    }
    stats
}

fn assert_exercised(name: &str, s: &LeaseStats, steps: usize) {
    if std::env::var_os("LEASE_STATS").is_some() {
        eprintln!("{name}: {s:?}");
    }
    assert!(
        s.allowed > steps / 10
            && s.rejected > steps / 20
            && s.grants > steps / 20
            && s.returns > steps / 20
            && s.effective > steps / 80,
        "{name}: sequence too one-sided: {s:?}"
    );
}

/// Leases, every algorithm, on a short and a long window: decisions, grants and tags
/// agree through takes and give-backs.
#[tokio::test(flavor = "multi_thread")]
async fn rust_and_lua_agree_on_leases_per_algorithm() {
    let redis = RedisServer::start().await;
    let mut conn = redis.client().await;
    let cases = [
        (Algorithm::TokenBucket, Window::Second, 20, 1.5),
        (Algorithm::TokenBucket, Window::Hour, 40, 1.0),
        (Algorithm::SlidingWindow, Window::Second, 20, 1.0),
        (Algorithm::SlidingWindow, Window::Minute, 30, 1.0),
        (Algorithm::FixedWindow, Window::Second, 20, 1.0),
        (Algorithm::FixedWindow, Window::Minute, 30, 1.0),
        (Algorithm::SlidingLog, Window::Second, 20, 1.0),
        (Algorithm::SlidingLog, Window::Minute, 15, 1.0),
        (Algorithm::LeakyBucket, Window::Second, 20, 1.0),
        (Algorithm::LeakyBucket, Window::Minute, 30, 1.0),
    ];
    for (n, (alg, window, limit, burst)) in cases.into_iter().enumerate() {
        let l = limits(vec![
            WindowLimit::with_algorithm(window, limit, alg).with_burst(burst)
        ]);
        let scopes = [(Scope::Ip, Ident::Ip("198.51.100.1".parse().unwrap()), l)];
        let steps = 500;
        let s = lease_replay(
            &mut conn,
            &format!("ld{n}"),
            &scopes,
            0x1EA5E + n as u64,
            steps,
            window.period_ms() * 2 / u64::from(limit),
            1_764_000_000_123,
        )
        .await;
        assert_exercised(&format!("{alg:?} {window:?}"), &s, steps);
    }
}

/// Leases with reset jitter (per-key offsets) on day and month windows, every algorithm,
/// across window ends.
#[tokio::test(flavor = "multi_thread")]
async fn rust_and_lua_agree_on_leases_with_jitter() {
    let redis = RedisServer::start().await;
    let mut conn = redis.client().await;
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::LeakyBucket,
    ];
    for (n, alg) in algorithms.into_iter().enumerate() {
        for (m, (window, limit)) in [(Window::Day, 30), (Window::Month, 30)]
            .into_iter()
            .enumerate()
        {
            let l = limits(vec![WindowLimit::with_algorithm(window, limit, alg)
                .with_jitter_ms(window.period_ms() / 5)]);
            let ident = Ident::Name(format!("acme{n}{m}").into());
            assert!(ident.offset_ms(&l.windows[0]) > 0);
            let scopes = [(Scope::Tenant, ident, l)];
            let steps = 400;
            let s = lease_replay(
                &mut conn,
                &format!("lj{n}{m}"),
                &scopes,
                0x0FF5E7 + (n * 2 + m) as u64,
                steps,
                window.period_ms() * 2 / u64::from(limit),
                1_767_000_000_000,
            )
            .await;
            assert_exercised(&format!("{alg:?} {window:?}"), &s, steps);
        }
    }
}

/// Leases in layered calls: several scopes and windows per call, mixed algorithms, a
/// reset offset; a window that rejects stops every window's charge and lease.
#[tokio::test(flavor = "multi_thread")]
async fn rust_and_lua_agree_on_layered_leases() {
    let redis = RedisServer::start().await;
    let mut conn = redis.client().await;
    let scopes = [
        (
            Scope::Ip,
            Ident::Ip("2001:db8::7".parse().unwrap()),
            limits(vec![
                WindowLimit::new(Window::Second, 20).with_burst(1.5),
                WindowLimit::with_algorithm(Window::Minute, 600, Algorithm::SlidingLog),
            ]),
        ),
        (
            Scope::Key,
            Ident::Name("key_a".into()),
            limits(vec![
                WindowLimit::with_algorithm(Window::Second, 15, Algorithm::LeakyBucket),
                WindowLimit::with_algorithm(Window::Minute, 900, Algorithm::FixedWindow),
                WindowLimit::with_algorithm(Window::Day, 5_000, Algorithm::SlidingWindow)
                    .with_jitter_ms(3_600_000),
            ]),
        ),
        (
            Scope::Global,
            Ident::Global,
            limits(vec![WindowLimit::with_algorithm(
                Window::Second,
                25,
                Algorithm::SlidingWindow,
            )]),
        ),
    ];
    let steps = 800;
    let s = lease_replay(
        &mut conn,
        "ll",
        &scopes,
        4242,
        steps,
        150,
        1_764_000_000_000,
    )
    .await;
    assert_exercised("layered", &s, steps);
}

/// What a settle replay exercised.
#[derive(Debug, Default)]
struct SettleStats {
    allowed: usize,
    rejected: usize,
    debts: usize,
    /// Debts beyond what any window accepts (cut to each window's bound).
    capped: usize,
    refunds: usize,
}

/// Replays `steps` random checks, with random settles (debts and refunds) of earlier
/// admitted requests, through the MemoryStore and the script at the same injected
/// times, and compares every verdict. Checks go through `RedisStore::check`; settles
/// send the production command (`wire::settle_command`) directly, so each completes
/// before the next check (the store's own `settle` is spawned). Now and then a debt is
/// far beyond every window's bound (`x-usage-tokens: 999999999`, or just past the
/// bound): both cut it alike, and a rejection's `current` (which counts the debt) never
/// shows a window more than its limit in debt.
///
/// Redis expires a state on its own clock, not the replay's: when the machine stalls the
/// replay (more than `STALL` between two Redis calls), a state the replay's clock still
/// holds may be gone there. A divergence after such a stall replays the case again under
/// a fresh prefix (three tries); any other divergence fails at once.
#[allow(clippy::too_many_arguments)]
async fn settle_replay(
    redis: &RedisServer,
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    scopes: &[(Scope, Ident, ScopeLimits)],
    seed: u64,
    steps: usize,
    max_step_ms: u64,
    start: u64,
    huge_every: u64,
) -> SettleStats {
    for attempt in 0..3 {
        let prefix = format!("{prefix}-{attempt}");
        let args = (seed, steps, max_step_ms, start, huge_every);
        if let Some(stats) = settle_replay_once(redis, conn, &prefix, scopes, args).await {
            return stats;
        }
    }
    panic!("{prefix}: three replays stalled and diverged");
}

/// A real-time gap between two Redis calls of a replay past which Redis may have expired
/// a state early (the shortest TTLs are a fraction of a 1 s window).
const STALL: std::time::Duration = std::time::Duration::from_millis(50);

/// One replay (see `settle_replay`); None when it diverged after a stall.
async fn settle_replay_once(
    redis: &RedisServer,
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    scopes: &[(Scope, Ident, ScopeLimits)],
    (seed, steps, max_step_ms, start, huge_every): (u64, usize, u64, u64, u64),
) -> Option<SettleStats> {
    let mut last = tokio::time::Instant::now();
    let mut stalled = false;
    let mut stall = move || {
        stalled |= last.elapsed() > STALL;
        last = tokio::time::Instant::now();
        stalled
    };
    let sha = redis::Script::new(CHECK_LUA).get_hash().to_string();
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
        .unwrap();
    // Costs scale with large limits, so the traffic reaches them.
    let max_cost = max_cost.min(4).max(max_cost / 50);
    let make = |cost| {
        let mut check = Check::new(cost);
        for (scope, ident, l) in scopes {
            check.push(*scope, ident.clone(), l);
        }
        check
    };
    let windows: Vec<(Scope, WindowLimit)> = scopes
        .iter()
        .flat_map(|(scope, _, l)| l.windows.iter().map(|w| (*scope, *w)))
        .collect();
    // No window accepts more debt than this (`algorithm::debt_ceiling`).
    let ceiling = windows
        .iter()
        .map(|(_, w)| alg::debt_ceiling(w))
        .max()
        .unwrap();
    let mut rng = Rng(seed);
    let mut pending: Vec<(u64, u32)> = Vec::new();
    let mut stats = SettleStats::default();
    for i in 0..steps {
        clock.advance(std::time::Duration::from_millis(rng.below(max_step_ms)));
        let now = clock.now_ms();
        // Settle some earlier requests: at once, soon or late, in any order.
        while !pending.is_empty() && rng.below(3) == 0 {
            let (at, cost) = pending.swap_remove(rng.below(pending.len() as u64) as usize);
            // Half refunds (true cost 0 to cost - 1), half debts (up to 3x the cost + 2;
            // 1 in `huge_every` of them past every window's bound).
            let c = u64::from(cost);
            let truth = if rng.below(2) == 0 {
                rng.below(c)
            } else if huge_every > 0 && rng.below(huge_every) == 0 {
                [999_999_999, c + ceiling + rng.below(3)][rng.below(2) as usize]
            } else {
                c + 1 + rng.below(2 * c + 2)
            } as i64;
            let delta = truth - i64::from(cost);
            stats.capped += usize::from(delta.unsigned_abs() > ceiling);
            let check = make(cost);
            memory.settle_at(&check, delta, at, now);
            let cmd = wire::settle_command(
                &sha,
                &now.to_string(),
                cost,
                delta,
                at.into(),
                prefix,
                &check.scopes,
            );
            stall();
            let raw: Vec<u8> = cmd.query_async(conn).await.unwrap();
            stall();
            assert_eq!(wire::ints(&raw).unwrap(), [now as i64, 1]);
            match delta.signum() {
                1 => stats.debts += 1,
                -1 => stats.refunds += 1,
                _ => {}
            }
        }
        let cost = 1 + rng.below(u64::from(max_cost)) as u32;
        let check = make(cost);
        let m: Verdict = memory.decide_at(&check, now);
        stall();
        let r: Verdict = redis_store.check(&check).await.unwrap();
        if m != r && stall() {
            eprintln!("{prefix}: step {i} diverged after a stall of the machine: replayed");
            return None;
        }
        assert_eq!(
            m, r,
            "step {i} (now {now}, cost {cost}) diverged:\n memory {m:?}\n redis  {r:?}"
        );
        if m.allowed {
            stats.allowed += 1;
            if rng.below(5) != 0 {
                pending.push((now, cost));
            }
        } else {
            stats.rejected += 1;
            // In debt by at most the limit: used + debt + cost <= capacity + limit + cost.
            let g = m.governing.unwrap();
            let (_, w) = windows
                .iter()
                .find(|(scope, w)| *scope == g.scope && w.window == g.window)
                .unwrap();
            let most = u64::from(w.capacity) + u64::from(w.limit) + u64::from(cost);
            assert!(
                g.decision.current <= most,
                "step {i}: {:?} {:?} in debt past its limit: {g:?}",
                w.algorithm,
                w.window
            );
        }
    }
    if std::env::var_os("LEASE_STATS").is_some() {
        eprintln!("{prefix}: {stats:?}");
    }
    assert!(
        stats.allowed > steps / 10
            && stats.rejected > steps / 10
            && stats.debts > steps / 40
            && (huge_every == 0 || stats.capped > steps / 40)
            && stats.refunds > steps / 40,
        "{prefix}: sequence too one-sided: {stats:?}"
    );
    Some(stats)
}

/// Settles, every algorithm, on a short and a long window: checks after debts and
/// refunds decide identically in Rust and Lua.
#[tokio::test(flavor = "multi_thread")]
async fn rust_and_lua_agree_on_settles_per_algorithm() {
    let redis = RedisServer::start().await;
    let mut conn = redis.client().await;
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(CHECK_LUA)
        .query_async(&mut conn)
        .await
        .unwrap();
    let cases = [
        (Algorithm::TokenBucket, Window::Second, 5, 1.5),
        (Algorithm::TokenBucket, Window::Hour, 40, 1.0),
        (Algorithm::TokenBucket, Window::Second, 3_000, 1.0),
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
        // About twice the limit's rate in reserved cost, more with debts.
        let step = (window.period_ms() * 2 / u64::from(limit)).max(2);
        let scopes = [(Scope::Ip, Ident::Ip("198.51.100.1".parse().unwrap()), l)];
        settle_replay(
            &redis,
            &mut conn,
            &format!("s{n}"),
            &scopes,
            0x5E771E + n as u64,
            400,
            step,
            1_764_000_000_123,
            0,
        )
        .await;
    }
}

/// Debts far beyond every window's bound (`x-usage-tokens: 999999999`, or just past the
/// bound), every algorithm, on a short and a long window, the bursty and large ones
/// too: Rust and Lua cut them alike, and no window shows more than its limit in debt.
#[tokio::test(flavor = "multi_thread")]
async fn rust_and_lua_agree_on_capped_debts() {
    let redis = RedisServer::start().await;
    let mut conn = redis.client().await;
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(CHECK_LUA)
        .query_async(&mut conn)
        .await
        .unwrap();
    let cases = [
        (Algorithm::TokenBucket, Window::Second, 5, 1.5),
        (Algorithm::TokenBucket, Window::Minute, 5, 1.0),
        (Algorithm::TokenBucket, Window::Second, 3_000, 2.0),
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
        // A few steps per period: a capped debt is paid off within a few.
        let step = window.period_ms() / 2;
        let scopes = [(Scope::Ip, Ident::Ip("198.51.100.1".parse().unwrap()), l)];
        settle_replay(
            &redis,
            &mut conn,
            &format!("c{n}"),
            &scopes,
            0xCA99ED + n as u64,
            400,
            step,
            1_764_000_000_123,
            3,
        )
        .await;
    }
    // Calendar months with reset offsets (steps of up to 20 days), and layered checks.
    for (n, alg) in [Algorithm::FixedWindow, Algorithm::SlidingWindow]
        .into_iter()
        .enumerate()
    {
        let l = limits(vec![
            WindowLimit::with_algorithm(Window::Month, 30, alg).with_jitter_ms(5 * 86_400_000)
        ]);
        let scopes = [(Scope::Tenant, Ident::Name("acme".into()), l)];
        settle_replay(
            &redis,
            &mut conn,
            &format!("cm{n}"),
            &scopes,
            0xCA77 + n as u64,
            400,
            20 * 86_400_000,
            1_767_000_000_000,
            3,
        )
        .await;
    }
    settle_replay(
        &redis,
        &mut conn,
        "cl",
        &layered_settle_scopes(),
        0xCA11,
        600,
        20_000,
        1_764_000_000_000,
        3,
    )
    .await;
}

/// The layered settle case: several scopes and windows, mixed algorithms.
fn layered_settle_scopes() -> [(Scope, Ident, ScopeLimits); 4] {
    [
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
    ]
}

/// Settles on calendar months with reset offsets, and on layered checks (several scopes
/// and windows, mixed algorithms): Rust and Lua agree.
#[tokio::test(flavor = "multi_thread")]
async fn rust_and_lua_agree_on_layered_and_monthly_settles() {
    let redis = RedisServer::start().await;
    let mut conn = redis.client().await;
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(CHECK_LUA)
        .query_async(&mut conn)
        .await
        .unwrap();
    for (n, alg) in [Algorithm::FixedWindow, Algorithm::SlidingWindow]
        .into_iter()
        .enumerate()
    {
        let l = limits(vec![
            WindowLimit::with_algorithm(Window::Month, 30, alg).with_jitter_ms(5 * 86_400_000)
        ]);
        let scopes = [(Scope::Tenant, Ident::Name("acme".into()), l)];
        settle_replay(
            &redis,
            &mut conn,
            &format!("sm{n}"),
            &scopes,
            177 + n as u64,
            400,
            24 * 3_600_000,
            1_767_000_000_000,
            0,
        )
        .await;
    }
    let scopes = layered_settle_scopes();
    settle_replay(
        &redis,
        &mut conn,
        "sl",
        &scopes,
        991,
        600,
        1_000,
        1_764_000_000_000,
        0,
    )
    .await;
}

/// `RedisStore::settle` through the trait: a debt refuses later requests until paid off,
/// a refund gives back, one spawned round trip each (counted as store calls).
#[tokio::test(flavor = "multi_thread")]
async fn redis_store_settles_through_the_trait() {
    let redis = RedisServer::start().await;
    let clock = Arc::new(ManualClock::at(1_764_000_060_000));
    let metrics = Arc::new(throttle::metrics::Metrics::new().unwrap());
    let store = RedisStore::new(
        Target::Single(redis.url()),
        std::time::Duration::from_secs(2),
        "st",
    )
    .with_clock(clock.clone())
    .with_metrics(metrics.clone());
    let store: &dyn LimitStore = &store;
    let keyl = limits(vec![
        WindowLimit::new(Window::Second, 10),
        WindowLimit::with_algorithm(Window::Minute, 100, Algorithm::SlidingLog),
    ]);
    let minutel = limits(vec![keyl.windows[1]]);
    let check = |cost, peek| {
        let mut c = Check::new(cost);
        c.push(Scope::Key, Ident::Name("k".into()), &keyl);
        c.peek = peek;
        c
    };
    // The same key's minute window alone.
    let mut minute = Check::new(1);
    minute.push(Scope::Key, Ident::Name("k".into()), &minutel);
    minute.peek = true;
    let at = clock.now_ms();
    assert!(store.check(&check(4, false)).await.unwrap().allowed);
    let calls = metrics.store_calls.get();
    // True cost 16: the bucket (6 left) owes 6 tokens: 600 ms, then 100 ms per token.
    store.settle(&check(4, false), 12, at.into());
    assert_eq!(
        metrics.store_calls.get(),
        calls + 1,
        "one call, counted when sent"
    );
    let retry = |v: Verdict| v.governing.map(|g| g.decision.retry_after_ms);
    let mut v = store.check(&check(1, true)).await.unwrap();
    for _ in 0..200 {
        if !v.allowed {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        v = store.check(&check(1, true)).await.unwrap();
    }
    assert_eq!((v.allowed, retry(v)), (false, Some(700)));
    clock.advance(std::time::Duration::from_millis(700));
    assert!(store.check(&check(1, false)).await.unwrap().allowed);
    // A refund of 4 (true cost 0) a second later: the log's own entry goes (17 - 4 = 13
    // left counted), the bucket, refilled since, gets nothing back.
    clock.advance(std::time::Duration::from_secs(1));
    let remaining = |v: Verdict| v.governing.unwrap().decision.remaining;
    assert_eq!(remaining(store.check(&minute).await.unwrap()), 82);
    store.settle(&check(4, false), -16, at.into());
    let mut r = 82;
    for _ in 0..200 {
        r = remaining(store.check(&minute).await.unwrap());
        if r != 82 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(r, 86);
}
