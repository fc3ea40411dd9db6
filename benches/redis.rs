//! Redis store figures: memory per key-window (MEMORY USAGE) per algorithm, layered
//! decisions per second with 3 scopes, and Redis commands per request.
//!
//! Run: `cargo bench --bench redis` against `$REDIS_URL` (default redis://127.0.0.1:6379);
//! prints "skipped" when no Redis answers. Uses its own key prefix and deletes its keys.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use throttle::limiter::{
    Algorithm, Check, Ident, OnFailure, Scope, ScopeLimits, Window, WindowLimit,
};
use throttle::store::redis::Target;
use throttle::store::{LimitStore, RedisStore};

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

fn ip(n: u32) -> Ident {
    Ident::Ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)))
}

async fn memory_per_key(url: &str, conn: &mut redis::aio::MultiplexedConnection) {
    let cases = [
        (Algorithm::TokenBucket, Window::Hour, 1000),
        (Algorithm::SlidingWindow, Window::Hour, 1000),
        (Algorithm::FixedWindow, Window::Month, 1000),
        (Algorithm::LeakyBucket, Window::Hour, 1000),
        (Algorithm::SlidingLog, Window::Hour, 10),
    ];
    println!("redis memory per key-window (MEMORY USAGE, mean of 1000 identities):");
    for (alg, window, limit) in cases {
        let prefix = format!("bench-mem-{}", alg.as_str());
        let store = RedisStore::new(
            Target::Single(url.to_string()),
            Duration::from_secs(2),
            &prefix,
        );
        let l = limits(vec![WindowLimit::with_algorithm(window, limit, alg)]);
        let per_id = if alg == Algorithm::SlidingLog { 10 } else { 1 };
        let mut total = 0u64;
        for n in 0..1000 {
            let mut c = Check::new(1);
            c.push(Scope::Ip, ip(n), &l);
            for _ in 0..per_id {
                store.check(&c).await.unwrap();
            }
            let key = store.key(Scope::Ip, &ip(n), window);
            let bytes: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(conn)
                .await
                .unwrap();
            total += bytes;
            let _: () = redis::cmd("DEL").arg(&key).query_async(conn).await.unwrap();
        }
        let note = if alg == Algorithm::SlidingLog {
            " (holding 10 entries)"
        } else {
            ""
        };
        println!(
            "  {:<15} {:>5.0} bytes{note}",
            alg.as_str(),
            total as f64 / 1000.0
        );
    }
}

async fn throughput(url: &str, conn: &mut redis::aio::MultiplexedConnection) {
    let store = Arc::new(RedisStore::new(
        Target::Single(url.to_string()),
        Duration::from_secs(2),
        "bench-tp",
    ));
    let ip_l = Arc::new(limits(vec![
        WindowLimit::new(Window::Second, 1_000_000),
        WindowLimit::new(Window::Minute, 100_000_000),
    ]));
    let key_l = Arc::new(limits(vec![
        WindowLimit::new(Window::Second, 1_000_000),
        WindowLimit::new(Window::Hour, 1_000_000_000),
    ]));
    let global_l = Arc::new(limits(vec![WindowLimit::new(
        Window::Second,
        1_000_000_000,
    )]));
    let warm = {
        let mut c = Check::new(1);
        c.push(Scope::Ip, ip(0), &ip_l);
        c
    };
    store.check(&warm).await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
    let (tasks, per_task) = (64u32, 1_000u32);
    #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
    let start = std::time::Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (store, ip_l, key_l, global_l) =
                (store.clone(), ip_l.clone(), key_l.clone(), global_l.clone());
            tokio::spawn(async move {
                for i in 0..per_task {
                    let mut c = Check::new(1);
                    c.push(Scope::Ip, ip((t * per_task + i) % 1000), &ip_l);
                    c.push(
                        Scope::Key,
                        Ident::Name(format!("key_{}", i % 100).into()),
                        &key_l,
                    );
                    c.push(Scope::Global, Ident::Global, &global_l);
                    store.check(&c).await.unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let elapsed = start.elapsed();
    let n = u64::from(tasks * per_task);
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let calls = |prefix: &str| -> u64 {
        stats
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    let (evalsha, all) = (calls("cmdstat_evalsha:"), calls("cmdstat_"));
    println!(
        "redis layered check, 3 scopes / 5 windows, {tasks} concurrent tasks: {n} decisions in {:.2} s = {:.0} decisions/s",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64(),
    );
    println!(
        "  round trips (EVALSHA) per request: {:.2}; commands per request including those the script runs: {:.2}",
        evalsha as f64 / n as f64,
        all as f64 / n as f64
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("bench-tp:*")
        .query_async(conn)
        .await
        .unwrap();
    for k in keys {
        let _: () = redis::cmd("DEL").arg(k).query_async(conn).await.unwrap();
    }
}

/// The extra cost per request of a concurrency scope on Redis: a slot taken (one script
/// call before the request) and given back (one after it, off the response's path), for
/// 64 concurrent tasks on one client thread.
async fn concurrency(url: &str) {
    use throttle::limiter::OnFailure;
    use throttle::store::slots::SlotRequest;
    use throttle::store::{Ending, Held};
    let store = Arc::new(RedisStore::new(
        Target::Single(url.to_string()),
        Duration::from_secs(2),
        "bench-conc",
    ));
    let (tasks, per_task) = (64u32, 1_000u32);
    #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
    let start = std::time::Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    let slot = [SlotRequest {
                        scope: Scope::Tenant,
                        ident: Ident::Name(format!("tenant_{}", (t * per_task + i) % 100).into()),
                        limit: 1_000_000,
                        on_failure: OnFailure::Local,
                    }];
                    if let Ok(Ok(lease)) = store.acquire(&slot).await {
                        let held = Held {
                            cost: 1,
                            slots: lease,
                        };
                        store.finish(held, Ending::Completed { status: 200 });
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let elapsed = start.elapsed();
    let n = u64::from(tasks * per_task);
    println!(
        "redis concurrency slot, take + give back, {tasks} concurrent tasks: {n} in {:.2} s = {:.0} requests/s ({:.1} us each; 2 script calls per request, the give-back spawned)",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / n as f64,
    );
}

fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let Ok(client) = redis::Client::open(url.as_str()) else {
            return println!("skipped: bad REDIS_URL {url}");
        };
        let Ok(Ok(mut conn)) = tokio::time::timeout(
            Duration::from_secs(2),
            client.get_multiplexed_async_connection(),
        )
        .await
        else {
            return println!("skipped: no Redis at {url}");
        };
        memory_per_key(&url, &mut conn).await;
        throughput(&url, &mut conn).await;
        concurrency(&url).await;
    });
}
