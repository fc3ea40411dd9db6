//! Memory-store decision cost: per algorithm, 1 and 2 threads, 1k and 1M distinct keys,
//! plus the full 3-scope layered decision and client IP resolution. Also prints the
//! resident bytes per key after filling the store with 1M identities.
//!
//! Run: `cargo bench --bench limiter` (add `-- --quick` for a fast pass).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use throttle::client_ip::ClientIpResolver;
use throttle::limiter::{
    Algorithm, Check, Ident, OnFailure, Scope, ScopeLimits, Window, WindowLimit,
};
use throttle::store::MemoryStore;

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::TokenBucket,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
    Algorithm::SlidingLog,
    Algorithm::LeakyBucket,
];

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
    Ident::Ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)))
}

/// One scope, one window: the limit is high enough that every decision is an admit
/// (the expensive path: dry run + charge).
fn single_scope(c: &mut Criterion) {
    let mut g = c.benchmark_group("single_scope");
    g.throughput(Throughput::Elements(1));
    for alg in ALGORITHMS {
        // sliding_log keeps one entry per admitted request: keep its limit small.
        let limit = if alg == Algorithm::SlidingLog {
            64
        } else {
            1_000_000_000
        };
        let window = if alg == Algorithm::SlidingLog {
            Window::Second
        } else {
            Window::Hour
        };
        let l = limits(vec![WindowLimit::with_algorithm(window, limit, alg)]);
        for keys in [1_000u32, 1_000_000] {
            let store = MemoryStore::new();
            let idents: Vec<Ident> = (0..keys).map(ip).collect();
            for id in &idents {
                let mut ch = Check::new(1);
                ch.push(Scope::Ip, id.clone(), &l);
                store.decide(&ch);
            }
            let mut i = 0usize;
            g.bench_function(
                BenchmarkId::new(format!("{}/1thread", alg.as_str()), keys),
                |b| {
                    b.iter(|| {
                        i = (i + 1) % idents.len();
                        let mut ch = Check::new(1);
                        ch.push(Scope::Ip, idents[i].clone(), &l);
                        black_box(store.decide(&ch))
                    })
                },
            );
            let store = Arc::new(store);
            let idents = Arc::new(idents);
            let l = Arc::new(l.clone());
            g.bench_function(
                BenchmarkId::new(format!("{}/2threads", alg.as_str()), keys),
                |b| b.iter_custom(|iters| two_threads(iters, &store, &idents, &l)),
            );
        }
    }
    g.finish();
}

/// Wall time for `iters` decisions split over two threads (per-decision cost = time / iters).
fn two_threads(
    iters: u64,
    store: &Arc<MemoryStore>,
    idents: &Arc<Vec<Ident>>,
    l: &Arc<ScopeLimits>,
) -> Duration {
    #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
    let start = std::time::Instant::now();
    let handles: Vec<_> = (0..2u64)
        .map(|t| {
            let (store, idents, l) = (store.clone(), idents.clone(), l.clone());
            std::thread::spawn(move || {
                let n = idents.len() as u64;
                for i in 0..iters / 2 {
                    let mut ch = Check::new(1);
                    ch.push(Scope::Ip, idents[((i * 2 + t) % n) as usize].clone(), &l);
                    black_box(store.decide(&ch));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    start.elapsed()
}

/// ip (2 windows) + key (5 windows, tier-like) + global (1 window), all-or-nothing.
fn layered(c: &mut Criterion) {
    let ip_l = limits(vec![
        WindowLimit::new(Window::Second, 1_000_000),
        WindowLimit::new(Window::Minute, 100_000_000),
    ]);
    let key_l = limits(vec![
        WindowLimit::new(Window::Second, 1_000_000),
        WindowLimit::new(Window::Minute, 100_000_000),
        WindowLimit::new(Window::Hour, 1_000_000_000),
        WindowLimit::new(Window::Day, 1_000_000_000),
        WindowLimit::new(Window::Month, 1_000_000_000),
    ]);
    let global_l = limits(vec![WindowLimit::new(Window::Second, 1_000_000_000)]);
    let mut g = c.benchmark_group("layered");
    g.throughput(Throughput::Elements(1));
    for (name, key_windows) in [
        ("3_scopes_8_windows", &key_l),
        (
            "3_scopes_1_window_each",
            &limits(vec![WindowLimit::new(Window::Second, 1_000_000)]),
        ),
    ] {
        let store = MemoryStore::new();
        let ips: Vec<Ident> = (0..1_000).map(ip).collect();
        let keys: Vec<Ident> = (0..100)
            .map(|k| Ident::Name(format!("key_{k}").into()))
            .collect();
        let ip_one = limits(vec![WindowLimit::new(Window::Second, 1_000_000)]);
        let ip_windows = if name.ends_with("each") {
            &ip_one
        } else {
            &ip_l
        };
        let mut i = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                i += 1;
                let mut ch = Check::new(1);
                ch.push(Scope::Ip, ips[i % ips.len()].clone(), ip_windows);
                ch.push(Scope::Key, keys[i % keys.len()].clone(), key_windows);
                ch.push(Scope::Global, Ident::Global, &global_l);
                black_box(store.decide(&ch))
            })
        });
    }
    g.finish();
}

fn client_ip(c: &mut Criterion) {
    let r = ClientIpResolver::new(vec![
        "10.0.0.0/8".parse().unwrap(),
        "127.0.0.1/32".parse().unwrap(),
    ]);
    let peer: IpAddr = "10.0.0.1".parse().unwrap();
    let xff: &[u8] = b"203.0.113.9, 10.1.2.3, 10.4.5.6";
    c.bench_function("client_ip/resolve_3_hops", |b| {
        b.iter(|| black_box(r.resolve(peer, std::iter::once(black_box(xff)))))
    });
}

/// Resident memory per identity: RSS growth while 1M token-bucket states are held.
fn report_memory() {
    fn rss_kib() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
    let cases: [(&str, Vec<WindowLimit>); 5] = [
        (
            "token_bucket 1 window",
            vec![WindowLimit::with_algorithm(
                Window::Hour,
                100,
                Algorithm::TokenBucket,
            )],
        ),
        (
            "sliding_window 1 window",
            vec![WindowLimit::with_algorithm(
                Window::Hour,
                100,
                Algorithm::SlidingWindow,
            )],
        ),
        (
            "fixed_window 1 window",
            vec![WindowLimit::with_algorithm(
                Window::Month,
                100,
                Algorithm::FixedWindow,
            )],
        ),
        (
            "ip scope: per_minute + per_hour",
            vec![
                WindowLimit::new(Window::Minute, 100),
                WindowLimit::new(Window::Hour, 1000),
            ],
        ),
        (
            "key scope: 5 windows",
            Window::ALL
                .iter()
                .map(|w| WindowLimit::new(*w, 100))
                .collect(),
        ),
    ];
    for (name, windows) in cases {
        let n_windows = windows.len();
        let l = limits(windows);
        let store = MemoryStore::new();
        let before = rss_kib();
        for n in 0..1_000_000 {
            let mut ch = Check::new(1);
            ch.push(Scope::Ip, ip(n), &l);
            store.decide(&ch);
        }
        let after = rss_kib();
        let per_key = store.heap_bytes() as f64 / store.len() as f64;
        println!(
            "memory/{name}: {} identities, {per_key:.0} heap bytes per identity, {:.0} per key-window (RSS +{} KiB)",
            store.len(),
            per_key / n_windows as f64,
            after - before
        );
    }
}

/// The extra cost per request of concurrency scopes on the memory store: one slot taken
/// and given back (`Inflight::acquire` + `release`), for 1 and 3 scopes (ip, key, tenant).
fn concurrency(c: &mut Criterion) {
    use throttle::limiter::OnFailure;
    use throttle::store::slots::{Inflight, SlotRequest};
    let inflight = Inflight::default();
    let req = |scope, ident| SlotRequest {
        scope,
        ident,
        limit: 1_000,
        on_failure: OnFailure::Local,
    };
    let one = [req(Scope::Ip, ip(7))];
    let three = [
        req(Scope::Ip, ip(7)),
        req(Scope::Key, Ident::Name("key_demo".into())),
        req(Scope::Tenant, Ident::Name("acme".into())),
    ];
    let mut g = c.benchmark_group("concurrency");
    for (name, reqs) in [("1_scope", &one[..]), ("3_scopes", &three[..])] {
        g.bench_function(format!("acquire_release_{name}"), |b| {
            b.iter(|| {
                if let Ok(lease) = inflight.acquire(black_box(reqs), |r| r.limit) {
                    inflight.release(&lease.entries);
                }
            })
        });
    }
    g.finish();
}

fn main() {
    report_memory();
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    single_scope(&mut c);
    layered(&mut c);
    client_ip(&mut c);
    concurrency(&mut c);
    c.final_summary();
}
