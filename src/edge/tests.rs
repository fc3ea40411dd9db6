//! The request owns its time and config: one limiter clock reading and one runtime
//! snapshot per request through the edge and the pipeline.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::FutureExt;

use super::*;
use crate::admission::Runtime;
use crate::clock::{Clock, ManualClock};
use crate::metrics::Metrics;
use crate::store::{Ending, MemoryStore};

const NOW: u64 = 1_764_000_000_000;

const CONFIG: &str = r#"
[limits.ip]
per_minute = 2

[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["127.0.0.1:1"]
auth = "none"
"#;

/// A manual clock that counts its readings.
#[derive(Default)]
struct CountingClock {
    at: ManualClock,
    reads: AtomicUsize,
}

impl Clock for CountingClock {
    fn now_ms(&self) -> u64 {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.at.now_ms()
    }
}

fn runtime(config: &str) -> Runtime {
    Runtime::from_config(crate::config::parse("t.toml", config).unwrap()).unwrap()
}

fn core(clock: Arc<CountingClock>) -> Core {
    clock.at.set(NOW);
    let store = Arc::new(MemoryStore::with_clock(ManualClock::at(NOW)));
    let metrics = Arc::new(Metrics::new().unwrap());
    Core::with_clock(runtime(CONFIG), store, metrics, clock).unwrap()
}

fn parts() -> http::request::Parts {
    let req = http::Request::get("http://api.example/v1/x")
        .body(())
        .unwrap();
    req.into_parts().0
}

fn admit(core: &Core, parts: &http::request::Parts) -> Result<Admission, Refusal> {
    let peer: IpAddr = "198.51.100.7".parse().unwrap();
    let wire = target::Wire {
        method: &parts.method,
        uri: &parts.uri,
        headers: &parts.headers,
        raw: Ok(None),
        hop: target::Hop::Kept,
    };
    let admitted = admit_http(core, peer, wire).now_or_never();
    admitted.unwrap().map(|(a, _)| a)
}

/// An admitted request reads the limiter clock once (the edge's reading, which the
/// pipeline, the headers and the settlement use); a refused one too.
#[test]
fn one_clock_reading_per_request() {
    let clock = Arc::new(CountingClock::default());
    let core = core(clock.clone());
    let parts = parts();
    for _ in 0..2 {
        let before = clock.reads.load(Ordering::SeqCst);
        let mut a = admit(&core, &parts).unwrap();
        let _ = a.rate_headers().count();
        a.settle(1, &core.metrics);
        a.finish(Ending::Completed { status: 200 });
        assert_eq!(clock.reads.load(Ordering::SeqCst) - before, 1);
    }
    let before = clock.reads.load(Ordering::SeqCst);
    let refusal = admit(&core, &parts).unwrap_err();
    assert_eq!(refusal.reply().status, 429);
    assert_eq!(clock.reads.load(Ordering::SeqCst) - before, 1);
}

/// The pipeline decides on the snapshot it is given, never loading its own: a request
/// admitted on a snapshot with other limits is decided by them and carries that
/// snapshot.
#[test]
fn one_runtime_snapshot_per_request() {
    let clock = Arc::new(CountingClock::default());
    let core = core(clock);
    let strict = Arc::new(runtime(&CONFIG.replace("per_minute = 2", "per_minute = 1")));
    let ask = || Ask {
        host: None,
        path: "/v1/x",
        method: &http::Method::GET,
        key: Presented::Missing,
        cost: None,
        attrs: Default::default(),
    };
    let ip: IpAddr = "198.51.100.8".parse().unwrap();
    let at = (strict.clone(), NOW);
    let a = admit_asked(&core, at.clone(), ip, Ok(ask()))
        .now_or_never()
        .unwrap()
        .unwrap();
    assert!(Arc::ptr_eq(&a.runtime, &strict));
    a.finish(Ending::Completed { status: 200 });
    let refusal = admit_asked(&core, at, ip, Ok(ask()))
        .now_or_never()
        .unwrap()
        .unwrap_err();
    assert!(refusal
        .runtime
        .as_ref()
        .is_some_and(|rt| Arc::ptr_eq(rt, &strict)));
    assert_eq!(refusal.rejection.code(), "rate_limit_exceeded");
}
