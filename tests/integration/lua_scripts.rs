//! The Lua script on a real redis-server: it loads, keys are readable and carry TTLs.

use std::sync::Arc;

use throttle::clock::ManualClock;
use throttle::limiter::{Check, Ident, OnFailure, Scope, ScopeLimits, Window, WindowLimit};
use throttle::store::redis::{Target, CHECK_LUA};
use throttle::store::{LimitStore, RedisStore};

use crate::support::redis::RedisServer;

fn limits(windows: Vec<WindowLimit>) -> ScopeLimits {
    ScopeLimits {
        windows,
        on_failure: OnFailure::Closed,
        message: None,
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
