//! The Lua script on a real redis-server: it loads, keys are readable and carry TTLs;
//! leases are charged, given back, keep TTLs and unique log members.

use std::sync::Arc;

use throttle::clock::ManualClock;
use throttle::limiter::{
    Algorithm, Check, Ident, OnFailure, Scope, ScopeLimits, Window, WindowLimit,
};
use throttle::store::redis::wire::{self, Grant, LeaseArgs, Mode};
use throttle::store::redis::{Target, CHECK_LUA};
use throttle::store::{LimitStore, RedisStore};

use crate::support::redis::RedisServer;

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

/// The assembled script compiles in Redis (a Lua syntax error fails here, by name).
#[tokio::test(flavor = "multi_thread")]
async fn script_loads() {
    let redis = RedisServer::start().await;
    let mut c = redis.client().await;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(CHECK_LUA)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(sha.len(), 40);
}

/// Keys name scope and identity in clear text, share a hash tag per scope, and every key
/// written has a TTL.
#[tokio::test(flavor = "multi_thread")]
async fn keys_are_readable_and_expire() {
    let redis = RedisServer::start().await;
    let store = RedisStore::new(
        Target::Single(redis.url()),
        std::time::Duration::from_secs(1),
        "lk",
    );
    // Slow refills, so no key expires (returns to its initial state) before it is inspected.
    let ip = limits(vec![
        WindowLimit::new(Window::Second, 1),
        WindowLimit::new(Window::Minute, 10),
    ]);
    let key = limits(
        Window::ALL
            .iter()
            .map(|w| WindowLimit::new(*w, 1))
            .collect(),
    );
    let global = limits(vec![WindowLimit::new(Window::Second, 1)]);
    let mut check = Check::new(1);
    check.push(Scope::Ip, Ident::Ip("203.0.113.7".parse().unwrap()), &ip);
    check.push(Scope::Key, Ident::Name("key_demo".into()), &key);
    check.push(Scope::Global, Ident::Global, &global);
    let v = store.check(&check).await.unwrap();
    assert!(v.allowed);
    let mut c = redis.client().await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("lk:*")
        .query_async(&mut c)
        .await
        .unwrap();
    keys.sort();
    assert_eq!(
        keys,
        [
            "lk:{global}:1s",
            "lk:{ip:203.0.113.7}:1m",
            "lk:{ip:203.0.113.7}:1s",
            "lk:{key:key_demo}:1d",
            "lk:{key:key_demo}:1h",
            "lk:{key:key_demo}:1m",
            "lk:{key:key_demo}:1mo",
            "lk:{key:key_demo}:1s",
        ]
    );
    for k in &keys {
        let ttl: i64 = redis::cmd("PTTL").arg(k).query_async(&mut c).await.unwrap();
        assert!(ttl > 0, "{k} has no TTL ({ttl})");
        assert!(
            ttl <= 31 * 86_400_000,
            "{k} outlives its longest window ({ttl} ms)"
        );
    }
}

/// A rejected layered request writes nothing at all.
#[tokio::test(flavor = "multi_thread")]
async fn rejection_writes_nothing() {
    let redis = RedisServer::start().await;
    let clock = Arc::new(ManualClock::at(1_764_000_000_000));
    let store = RedisStore::new(
        Target::Single(redis.url()),
        std::time::Duration::from_secs(1),
        "rw",
    )
    .with_clock(clock);
    let key = limits(vec![WindowLimit::new(Window::Minute, 10)]);
    let tenant = limits(vec![WindowLimit::new(Window::Minute, 1)]);
    let check = || {
        let mut c = Check::new(1);
        c.push(Scope::Key, Ident::Name("k".into()), &key);
        c.push(Scope::Tenant, Ident::Name("t".into()), &tenant);
        c
    };
    assert!(store.check(&check()).await.unwrap().allowed);
    let mut c = redis.client().await;
    let before: String = redis::cmd("GET")
        .arg("rw:{key:k}:1m")
        .query_async(&mut c)
        .await
        .unwrap();
    for _ in 0..3 {
        let v = store.check(&check()).await.unwrap();
        assert_eq!(
            (v.allowed, v.governing.unwrap().scope),
            (false, Scope::Tenant)
        );
    }
    let after: String = redis::cmd("GET")
        .arg("rw:{key:k}:1m")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(
        before, after,
        "the key scope was charged for rejected requests"
    );
}

/// After SCRIPT FLUSH (a restart or failover) the store reloads the script on NOSCRIPT.
#[tokio::test(flavor = "multi_thread")]
async fn reloads_after_script_flush() {
    let redis = RedisServer::start().await;
    let store = RedisStore::new(
        Target::Single(redis.url()),
        std::time::Duration::from_secs(1),
        "nf",
    );
    let l = limits(vec![WindowLimit::new(Window::Minute, 3)]);
    let mut check = Check::new(1);
    check.push(Scope::Ip, Ident::Ip("192.0.2.1".parse().unwrap()), &l);
    assert!(store.check(&check).await.unwrap().allowed);
    let mut c = redis.client().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut c)
        .await
        .unwrap();
    let v = store.check(&check).await.unwrap();
    assert_eq!(
        v.governing.unwrap().decision.remaining,
        1,
        "state survived, script reloaded"
    );
}

/// On a single node the whole layered check of a request is one EVALSHA: one round trip.
#[tokio::test(flavor = "multi_thread")]
async fn one_round_trip_per_request_on_a_single_node() {
    let redis = RedisServer::start().await;
    let store = RedisStore::new(
        Target::Single(redis.url()),
        std::time::Duration::from_secs(1),
        "rt",
    );
    let ip = limits(vec![
        WindowLimit::new(Window::Second, 100),
        WindowLimit::new(Window::Minute, 1000),
    ]);
    let key = limits(
        Window::ALL
            .iter()
            .map(|w| WindowLimit::new(*w, 1000))
            .collect(),
    );
    let global = limits(vec![WindowLimit::new(Window::Second, 10_000)]);
    let check = {
        let mut c = Check::new(1);
        c.push(Scope::Ip, Ident::Ip("192.0.2.9".parse().unwrap()), &ip);
        c.push(Scope::Key, Ident::Name("k".into()), &key);
        c.push(Scope::Global, Ident::Global, &global);
        c
    };
    store.check(&check).await.unwrap(); // connects and loads the script
    let mut c = redis.client().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut c)
        .await
        .unwrap();
    for _ in 0..100 {
        store.check(&check).await.unwrap();
    }
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    let calls = |cmd: &str| {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{cmd}:")))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|v| v.split(',').next())
            .map_or(0, |v| v.parse::<u64>().unwrap())
    };
    assert_eq!(calls("evalsha"), 100, "{stats}");
    assert_eq!(calls("eval") + calls("script|load"), 0, "{stats}");
}

const T: u64 = 1_764_000_000_000; // a minute's start

/// One direct script call for `check`'s windows, in the wire format.
async fn call(
    c: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    check: &Check<'_>,
    now: u64,
    mode: Mode,
    lease_ms: u64,
    leases: &[LeaseArgs],
) -> Vec<i64> {
    let script = redis::Script::new(CHECK_LUA);
    let mut inv = script.prepare_invoke();
    wire::push_header(&mut inv, &now.to_string(), check.cost, mode, lease_ms);
    let mut at = 0;
    for s in &check.scopes {
        let n = s.limits.windows.len();
        wire::push_scope(&mut inv, prefix, s, None, Some(&leases[at..at + n]), now);
        at += n;
    }
    let raw: Vec<u8> = inv.invoke_async(c).await.unwrap();
    wire::ints(&raw).unwrap()
}

fn want(n: u64) -> LeaseArgs {
    LeaseArgs {
        want: n,
        ..LeaseArgs::default()
    }
}

fn ret(k: u64, from: Grant) -> LeaseArgs {
    LeaseArgs {
        ret: k,
        from,
        ..LeaseArgs::default()
    }
}

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::TokenBucket,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
    Algorithm::SlidingLog,
    Algorithm::LeakyBucket,
];

/// Every algorithm: an admitted 'check' leases what was asked (charged at once, with the
/// algorithm's tags), keys keep TTLs covering the lease, and a 'return' call gives the
/// unused tokens back.
#[tokio::test(flavor = "multi_thread")]
async fn leases_are_charged_and_given_back() {
    let redis = RedisServer::start().await;
    let mut c = redis.client().await;
    for alg in ALGORITHMS {
        let l = limits(vec![WindowLimit::with_algorithm(Window::Minute, 100, alg)]);
        let prefix = format!("ls{}", wire::algorithm_code(alg));
        let check = |cost| {
            let mut ch = Check::new(cost);
            ch.push(Scope::Key, Ident::Name("k".into()), &l);
            ch
        };
        let key = format!("{prefix}:{{key:k}}:1m");
        let ch = check(1);
        let raw = call(&mut c, &prefix, &ch, T, Mode::Check, 1_000, &[want(10)]).await;
        let reply = wire::parse_reply(&raw, &ch.scopes).unwrap();
        let g = reply.grants[0];
        let (tag1, tag2) = match alg {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => (T + 2_000, 0), // hold's end
            Algorithm::SlidingWindow | Algorithm::FixedWindow => (T, 0),       // window start
            Algorithm::SlidingLog => (T + 1_000, 101 * 1_000 + 11),            // the member
        };
        let grant = Grant {
            granted: 10,
            until: T + 1_000,
            tag1,
            tag2,
        };
        assert_eq!(g, grant, "{alg:?}");
        assert_eq!(reply.decisions[0].decision.remaining, 99, "{alg:?}");
        // Charged at once: 1 + 10 spent.
        let peek = call(&mut c, &prefix, &ch, T + 1, Mode::Peek, 0, &[want(0)]).await;
        assert_eq!(peek[3], 88, "{alg:?} remaining after the lease: {peek:?}");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(ttl > 0, "{alg:?}: no TTL ({ttl})");
        if alg == Algorithm::SlidingLog {
            assert!(
                ttl > 60_000,
                "the lease's member outlives its TTL ({ttl} ms)"
            );
        }
        if alg == Algorithm::TokenBucket {
            let v: String = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap();
            assert_eq!(v, format!("5340000:{T}:600000:{}", T + 2_000), "held");
        }
        // 'return': no decision, the tokens come back.
        let r = call(&mut c, &prefix, &ch, T + 2, Mode::Return, 0, &[ret(10, g)]).await;
        assert_eq!(r, [(T + 2) as i64, 1]);
        let peek = call(&mut c, &prefix, &ch, T + 2, Mode::Peek, 0, &[want(0)]).await;
        assert_eq!(peek[3], 98, "{alg:?} remaining after giving back: {peek:?}");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(ttl > 0, "{alg:?}: no TTL after giving back ({ttl})");
    }
}

/// No lease below 2 tokens, none above half of what remains, none in 'peek' or a rejected
/// call, none when lease_ms is 0.
#[tokio::test(flavor = "multi_thread")]
async fn leases_are_sized_like_the_rust_helpers() {
    let redis = RedisServer::start().await;
    let mut c = redis.client().await;
    let l = limits(vec![WindowLimit::with_algorithm(
        Window::Minute,
        10,
        Algorithm::FixedWindow,
    )]);
    let mut ch = Check::new(1);
    ch.push(Scope::Key, Ident::Name("k".into()), &l);
    let granted = |raw: &[i64]| raw[2 + 5];
    // (mode, lease_ms, want, granted): 9 remain after each admitted request until full.
    let rows = [
        (Mode::Check, 0, 8, 0),       // no leases configured
        (Mode::Peek, 1_000, 8, 0),    // peek charges nothing
        (Mode::Check, 1_000, 1, 0),   // below 2
        (Mode::Check, 1_000, 100, 3), // 8 - 1 = 7 left: 3
        (Mode::Check, 1_000, 100, 0), // 2 left: 1 < 2
        (Mode::Check, 1_000, 100, 0), // 1 left: none
        (Mode::Check, 1_000, 100, 0), // rejected
    ];
    for (i, (mode, lease_ms, w, g)) in rows.into_iter().enumerate() {
        let raw = call(&mut c, "sz", &ch, T + 10, mode, lease_ms, &[want(w)]).await;
        assert_eq!(granted(&raw), g, "row {i}: {raw:?}");
    }
}

/// Sliding log members stay unique: two leases of one millisecond end a millisecond
/// apart, and a request whose count equals an earlier request's of the same millisecond
/// (leased tokens given back in between) gets its own member.
#[tokio::test(flavor = "multi_thread")]
async fn sliding_log_members_stay_unique() {
    let redis = RedisServer::start().await;
    let mut c = redis.client().await;
    let l = limits(vec![WindowLimit::with_algorithm(
        Window::Minute,
        100,
        Algorithm::SlidingLog,
    )]);
    let check = |cost| {
        let mut ch = Check::new(cost);
        ch.push(Scope::Key, Ident::Name("k".into()), &l);
        ch
    };
    let grant = |raw: &[i64], ch: &Check<'_>| wire::parse_reply(raw, &ch.scopes).unwrap().grants[0];
    let one = check(1);
    let g1 = grant(
        &call(&mut c, "u", &one, T, Mode::Check, 1_000, &[want(4)]).await,
        &one,
    );
    let g2 = grant(
        &call(&mut c, "u", &one, T, Mode::Check, 1_000, &[want(4)]).await,
        &one,
    );
    assert_eq!((g1.until, g2.until), (T + 1_000, T + 999));
    // Count 10 (1 + 4 + 1 + 4); a cost-2 request makes it 12: member "T:12:2".
    let two = check(2);
    call(&mut c, "u", &two, T, Mode::Check, 0, &[want(0)]).await;
    // 2 of g2 back (10), and another cost-2 request: 12 again.
    call(&mut c, "u", &two, T, Mode::Return, 0, &[ret(2, g2)]).await;
    let raw = call(&mut c, "u", &two, T, Mode::Check, 0, &[want(0)]).await;
    assert_eq!((raw[1], raw[4]), (1, 12), "{raw:?}");
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg("u:{key:k}:1m")
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(members.len(), 6, "{members:?}");
    let peek = call(&mut c, "u", &one, T, Mode::Peek, 0, &[want(0)]).await;
    assert_eq!(peek[4], 13, "every member counted (12 + 1): {members:?}");
}

/// Settles write keys with TTLs (a debt's key lives until it is paid off), a token
/// bucket in debt is an empty bucket at a future time (at most the limit below empty), and
/// a sliding log's debt member is cut to twice the limit and its refund keeps one member
/// per request.
#[tokio::test(flavor = "multi_thread")]
async fn settled_keys_keep_ttls() {
    let redis = RedisServer::start().await;
    let mut c = redis.client().await;
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(CHECK_LUA)
        .query_async(&mut c)
        .await
        .unwrap();
    let sha = redis::Script::new(CHECK_LUA).get_hash().to_string();
    const T: u64 = 1_764_000_060_000;
    for (n, alg) in [
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::LeakyBucket,
    ]
    .into_iter()
    .enumerate()
    {
        let prefix = format!("st{n}");
        let l = limits(vec![WindowLimit::with_algorithm(Window::Second, 10, alg)]);
        let mut ch = Check::new(4);
        ch.push(Scope::Key, Ident::Name("k".into()), &l);
        let key = wire::key(
            &prefix,
            Scope::Key,
            &Ident::Name("k".into()),
            Window::Second,
        );
        let store = RedisStore::new(
            Target::Single(redis.url()),
            std::time::Duration::from_secs(2),
            &prefix,
        )
        .with_clock(Arc::new(ManualClock::at(T)));
        assert!(store.check(&ch).await.unwrap().allowed);
        for (at, delta) in [(T + 10, 30), (T + 20, -3)] {
            let cmd = wire::settle_command(
                &sha,
                &at.to_string(),
                4,
                delta,
                T.into(),
                &prefix,
                &ch.scopes,
            );
            let raw: Vec<u8> = cmd.query_async(&mut c).await.unwrap();
            assert_eq!(wire::ints(&raw).unwrap(), [at as i64, 1]);
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap();
            assert!(ttl > 500, "{alg:?}: PTTL {ttl} after a settle of {delta}");
        }
        match alg {
            Algorithm::TokenBucket => {
                // 6.1 left at T + 10 - 30: cut to 10 owed (the limit), paid off at
                // T + 1 010. The refund at T + 20 (true cost 1: 3 back; 20 ms of refill is
                // below 1 token): 6.9 owed, paid off at T + 710.
                let v: String = redis::cmd("GET")
                    .arg(&key)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                assert_eq!(v, format!("0:{}", T + 710));
            }
            Algorithm::SlidingLog => {
                let members: Vec<String> = redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                // The debt entry is cut to 16: 4 + 16 = 20, twice the limit.
                assert_eq!(members, [format!("{T}:4:1"), format!("{}:20:16", T + 10)]);
            }
            _ => {}
        }
    }
}

/// A calendar window's edges come from the gateway's clock; Redis's `now` may be on the
/// other side of an edge (clock skew): the script looks its own `now` up in the edges
/// and decides in the right window either way (Berlin's local midnight, a 24 h day).
#[tokio::test(flavor = "multi_thread")]
async fn calendar_edges_survive_a_skewed_clock() {
    use throttle::limiter::algorithm::Calendar;
    let redis = RedisServer::start().await;
    let mut c = redis.client().await;
    let berlin = Calendar::interned("Europe/Berlin", 1).unwrap();
    let l = limits(vec![WindowLimit::with_algorithm(
        Window::Day,
        2,
        Algorithm::FixedWindow,
    )
    .with_calendar(Some(berlin))]);
    let mut ch = Check::new(1);
    ch.push(Scope::Tenant, Ident::Name("t".into()), &l);
    // 2026-03-30 00:00 in Berlin (CEST), and the next local midnight 24 h later.
    const MIDNIGHT: u64 = 1_774_821_600_000;
    const DAY: u64 = 86_400_000;
    let script = redis::Script::new(CHECK_LUA);
    let call = |script_now: u64, edges_at: u64| {
        let mut inv = script.prepare_invoke();
        wire::push_header(&mut inv, &script_now.to_string(), 1, Mode::Check, 0);
        wire::push_scope(&mut inv, "skew", &ch.scopes[0], None, None, edges_at);
        inv
    };
    for now in [MIDNIGHT - 200, MIDNIGHT - 100] {
        let raw: Vec<u8> = call(now, now).invoke_async(&mut c).await.unwrap();
        assert_eq!(wire::ints(&raw).unwrap()[1], 1, "spending the day at {now}");
    }
    // The gateway is 50 ms ahead: its edges are the next day's; Redis is still before.
    let raw: Vec<u8> = call(MIDNIGHT - 10, MIDNIGHT + 40)
        .invoke_async(&mut c)
        .await
        .unwrap();
    let r = wire::parse_reply(&wire::ints(&raw).unwrap(), &ch.scopes).unwrap();
    assert!(!r.all_allowed, "still the spent day: {r:?}");
    assert_eq!(r.decisions[0].decision.retry_after_ms, 10);
    // The gateway is 50 ms behind: its edges are the spent day's; Redis is past midnight.
    let raw: Vec<u8> = call(MIDNIGHT + 10, MIDNIGHT - 40)
        .invoke_async(&mut c)
        .await
        .unwrap();
    let r = wire::parse_reply(&wire::ints(&raw).unwrap(), &ch.scopes).unwrap();
    assert!(r.all_allowed, "a new day: {r:?}");
    assert_eq!(r.decisions[0].decision.reset_after_ms, DAY - 10);
}

/// A key's value (a string, or a sorted set's members and scores) and PTTL.
async fn state(c: &mut redis::aio::MultiplexedConnection, key: &str) -> (Vec<String>, i64) {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(c).await.unwrap();
    let value: Vec<String> = match kind.as_str() {
        "zset" => redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(c)
            .await
            .unwrap(),
        _ => {
            let v: Option<String> = redis::cmd("GET").arg(key).query_async(c).await.unwrap();
            v.into_iter().collect()
        }
    };
    let ttl: i64 = redis::cmd("PTTL").arg(key).query_async(c).await.unwrap();
    (value, ttl)
}

/// A settle carried by a later call (`wire::Carried`, see `Local::carry`) is applied
/// before that call decides, as the request's own 'settle' call sent just before it would
/// be: the same reply and the same state, for every algorithm, a debt and a refund, in a
/// 'check' call and in a 'return' call (the expiry pass's).
#[tokio::test(flavor = "multi_thread")]
async fn a_carried_settle_is_the_settle_call_before() {
    use throttle::store::redis::wire::Carried;
    let redis = RedisServer::start().await;
    let mut c = redis.client().await;
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(CHECK_LUA)
        .query_async(&mut c)
        .await
        .unwrap();
    let sha = redis::Script::new(CHECK_LUA).get_hash().to_string();
    let mut n = 0;
    for alg in ALGORITHMS {
        let l = limits(vec![WindowLimit::with_algorithm(Window::Minute, 10, alg)]);
        let check = |cost| {
            let mut ch = Check::new(cost);
            ch.push(Scope::Key, Ident::Name("k".into()), &l);
            ch
        };
        // A debt of 5, and a refund of 1 of 2 (the charge 200 ms before).
        for (delta, mode) in [(5, Mode::Check), (-1, Mode::Check), (3, Mode::Return)] {
            n += 1;
            let (sent, carried) = (format!("cs{n}"), format!("cc{n}"));
            let reserve = check(2);
            for prefix in [&sent, &carried] {
                call(
                    &mut c,
                    prefix,
                    &reserve,
                    T + 100,
                    Mode::Check,
                    0,
                    &[want(0)],
                )
                .await;
            }
            let next = check(1);
            let cmd = wire::settle_command(
                &sha,
                &(T + 300).to_string(),
                2,
                delta,
                (T + 100).into(),
                &sent,
                &reserve.scopes,
            );
            let raw: Vec<u8> = cmd.query_async(&mut c).await.unwrap();
            assert_eq!(wire::ints(&raw).unwrap(), [(T + 300) as i64, 1]);
            let before = call(&mut c, &sent, &next, T + 300, mode, 0, &[want(0)]).await;
            let with = LeaseArgs {
                settle: Carried {
                    cost: 2,
                    delta,
                    at: T + 100,
                },
                ..LeaseArgs::default()
            };
            let after = call(&mut c, &carried, &next, T + 300, mode, 0, &[with]).await;
            let what = format!("{alg:?}, delta {delta}, {mode:?}");
            assert_eq!(before, after, "{what}: the reply");
            let key = |prefix: &str| format!("{prefix}:{{key:k}}:1m");
            let (a, b) = (
                state(&mut c, &key(&sent)).await,
                state(&mut c, &key(&carried)).await,
            );
            assert_eq!(a.0, b.0, "{what}: the state");
            // The TTLs were set a few ms apart on the real clock.
            assert!(a.1.abs_diff(b.1) < 1_000, "{what}: PTTL {} vs {}", a.1, b.1);
            // The settle did something: without it, the state differs.
            let plain = format!("cp{n}");
            call(
                &mut c,
                &plain,
                &reserve,
                T + 100,
                Mode::Check,
                0,
                &[want(0)],
            )
            .await;
            call(&mut c, &plain, &next, T + 300, mode, 0, &[want(0)]).await;
            assert_ne!(state(&mut c, &key(&plain)).await.0, b.0, "{what}: settled");
        }
    }
}
