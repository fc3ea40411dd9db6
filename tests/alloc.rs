//! The admission path allocates nothing for a known key and client address on the memory
//! store: counted by a global allocator that counts this thread's allocations (a count,
//! not a time). The same allocator counts this thread's live heap bytes, which measures
//! what one window state of the memory store costs at its `max_states` bound.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use throttle::admission::{admit, AdmitRequest, Core, Origin, Runtime, Target};
use throttle::identity::validate_key;
use throttle::metrics::Metrics;
use throttle::store::{Ending, MemoryStore};

/// The system allocator, counting allocations made by the current thread.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static LIVE_BYTES: Cell<i64> = const { Cell::new(0) };
}

/// Adds `delta` to this thread's live heap bytes.
fn live(delta: i64) {
    let _ = LIVE_BYTES.try_with(|c| c.set(c.get() + delta));
}

// SAFETY-free: `GlobalAlloc` is an unsafe trait, so this file needs `unsafe impl`; the
// crate forbids unsafe code, tests may use it for the allocator alone.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        live(layout.size() as i64);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        live(-(layout.size() as i64));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        live(new_size as i64 - layout.size() as i64);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

const CONFIG: &str = r#"
[limits.ip]
per_second = 1000000
per_minute = 10000000

[limits.global]
per_second = 100000000

[tiers.free]
key = { per_second = 1000000, per_minute = 10000000, per_hour = 100000000 }
tenant = { per_hour = 100000000 }

[[keys]]
id = "key_demo"
key = "demo-key-123"
tenant = "acme"
tier = "free"

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["127.0.0.1:9000"]
auth = "required"
"#;

/// 1,000 admissions of a known key and client address: zero allocations, from the request
/// to its finish (ip, key, tenant and global scopes, 7 windows).
#[test]
fn admit_path_allocates_nothing_for_a_known_key_and_ip() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let config = throttle::config::parse("alloc.toml", CONFIG).unwrap();
    let core = Core::new(
        Runtime::from_config(config).unwrap(),
        Arc::new(MemoryStore::new()),
        Arc::new(Metrics::new().unwrap()),
    )
    .unwrap();
    let req = AdmitRequest {
        client_ip: "198.51.100.7".parse().unwrap(),
        target: Target::Match {
            method: &http::Method::GET,
            host: Some("api.example.com"),
            path: "/v1/users",
        },
        key: validate_key(b"demo-key-123"),
        cost: None,
        also_charge: None,
        origin: Origin::Proxy,
        attrs: Default::default(),
        skip: Default::default(),
    };
    rt.block_on(async {
        // The first request creates the identities' state; so may the metrics' first use.
        for _ in 0..3 {
            admit(&core, &req)
                .await
                .unwrap()
                .finish(Ending::Completed { status: 200 });
        }
        let before = allocations();
        for _ in 0..1_000 {
            let a = admit(&core, &req).await.unwrap();
            assert!(a.key.is_some() && a.rate.is_some());
            a.finish(Ending::Completed { status: 200 });
        }
        let spent = allocations() - before;
        assert_eq!(spent, 0, "{spent} allocations in 1,000 admissions");
        // The counter does count: an allocation on this thread shows.
        let before = allocations();
        drop(std::hint::black_box(Box::new(1u64)));
        assert_eq!(allocations() - before, 1);
    });
}

/// Bytes per window state at the memory store's default bound (`[store] max_states`,
/// 262,144), allocator-counted: the live heap bytes of a store filled past its bound,
/// over the states it holds. Each shard's hash table has doubled past its share of the
/// bound by then, so this is the most a state costs. Rows: what a state holds, and the
/// most bytes per state allowed (the README's figures, rounded up). Filling on past the
/// bound grows nothing: the evicted states' memory is reused.
#[test]
fn bytes_per_state_at_the_default_bound() {
    use std::net::{IpAddr, Ipv4Addr};
    use throttle::limiter::{Check, Ident, OnFailure, Scope, ScopeLimits, Window, WindowLimit};
    use throttle::store::memory::DEFAULT_MAX_STATES;
    let limits = |windows: &[Window]| ScopeLimits {
        concurrent: None,
        ban: None,
        windows: windows
            .iter()
            .map(|w| WindowLimit::new(*w, 1_000))
            .collect(),
        on_failure: OnFailure::Local,
        message: None,
        count_on: None,
    };
    type Row = (&'static str, Vec<Window>, fn(u32) -> Ident, usize);
    let rows: Vec<Row> = vec![
        (
            "client address, 2 windows",
            vec![Window::Minute, Window::Hour],
            |n| Ident::Ip(IpAddr::V4(Ipv4Addr::from(n))),
            300,
        ),
        (
            "RLS descriptor (a 40-byte name), 1 window",
            vec![Window::Month],
            |n| Ident::Name(format!("rls:edge/remote_address=10.{n:08}.0.0").into()),
            400,
        ),
        (
            "API key, 5 windows",
            Window::ALL.to_vec(),
            |n| Ident::Name(format!("key_{n:012}").into()),
            700,
        ),
    ];
    let fill = |store: &MemoryStore, l: &ScopeLimits, ident: fn(u32) -> Ident, from: u32| {
        for n in from..from + DEFAULT_MAX_STATES as u32 + 20_000 {
            let mut c = Check::new(1);
            // An evictable scope (key, tenant and global states are never evicted): the
            // size of a state does not depend on its scope.
            c.push(Scope::Ip, ident(n), l);
            store.decide(&c);
        }
    };
    for (what, windows, ident, most) in rows {
        let l = limits(&windows);
        let before = LIVE_BYTES.with(Cell::get);
        let store = MemoryStore::new();
        fill(&store, &l, ident, 0);
        let held = store.len();
        assert!(held <= DEFAULT_MAX_STATES, "{what}: {held} states");
        let grown = LIVE_BYTES.with(Cell::get) - before;
        let per_state = grown as usize / held;
        eprintln!("{what}: {held} states, {grown} bytes, {per_state} bytes per state");
        assert!(per_state <= most, "{what}: {per_state} bytes per state");
        // Past the bound: as many new states again, and the heap stays where it was.
        fill(&store, &l, ident, 10_000_000);
        let again = LIVE_BYTES.with(Cell::get) - before;
        assert!(
            again <= grown + grown / 20,
            "{what}: {grown} -> {again} bytes past the bound"
        );
        drop(store);
    }
}
