//! Load generator of `benches/local_admission.sh`: paced HTTP traffic through one or more
//! gateways, one schedule per API key, and the gateways' local-admission counters.
//!
//! ```text
//! local_admission --targets http://127.0.0.1:8080,... [--admins http://127.0.0.1:9090,...]
//!                 --key NAME=RATE [--key NAME=RATE ...] --secs SECS [--path /bench]
//! ```
//!
//! Each key sends RATE requests a second for SECS seconds (a fixed schedule: a request is
//! sent at every tick whatever the previous ones are doing, at most 256 in flight per key),
//! round-robin over the targets, to `--path` (default `/bench`; `throttle demo`'s upstream
//! answers `/bench?status=401` with a 401). Prints one JSON object: per key `sent`, `ok`,
//! `limited` (429), `other` (any other answer), `failed` (no answer), `first_ms` /
//! `last_ms` / `done_ms` (Unix ms of its first and last request and of its last answer);
//! `elapsed_secs`; and, with `--admins`, the change of every gateway's
//! `throttle_store_calls_total`, `throttle_local_decisions_total`,
//! `throttle_lease_tokens_returned_total` and `throttle_store_errors_total` over the run,
//! summed. Without `--targets` (e.g. under a plain `cargo bench`) it prints how to run it
//! and exits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use throttle::clock::{Clock, SystemClock};
use tokio::sync::Semaphore;
use tokio::time::Instant;

const SERIES: [(&str, &str); 5] = [
    (
        "round_trips",
        r#"throttle_store_calls_total{store="redis"}"#,
    ),
    (
        "leased",
        r#"throttle_local_decisions_total{reason="lease"}"#,
    ),
    (
        "over_limit_cache",
        r#"throttle_local_decisions_total{reason="over_limit_cache"}"#,
    ),
    ("tokens_returned", "throttle_lease_tokens_returned_total"),
    (
        "store_errors",
        r#"throttle_store_errors_total{store="redis"}"#,
    ),
];

struct Args {
    targets: Vec<String>,
    admins: Vec<String>,
    keys: Vec<(String, f64)>,
    secs: f64,
    path: String,
}

#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    ok: AtomicU64,
    limited: AtomicU64,
    other: AtomicU64,
    /// No answer (a connection error or the 10 s timeout).
    failed: AtomicU64,
    /// Unix ms of the first and the last request sent, and of the last answer.
    first_ms: AtomicU64,
    last_ms: AtomicU64,
    done_ms: AtomicU64,
}

fn unix_ms() -> u64 {
    SystemClock.now_ms()
}

fn args() -> Option<Args> {
    let mut a = Args {
        targets: Vec::new(),
        admins: Vec::new(),
        keys: Vec::new(),
        secs: 10.0,
        path: "/bench".to_string(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--targets" => a.targets = it.next()?.split(',').map(str::to_string).collect(),
            "--admins" => a.admins = it.next()?.split(',').map(str::to_string).collect(),
            "--secs" => a.secs = it.next()?.parse().ok()?,
            "--path" => a.path = it.next()?,
            "--key" => {
                let v = it.next()?;
                let (name, rate) = v.split_once('=')?;
                a.keys.push((name.to_string(), rate.parse().ok()?));
            }
            _ => {} // `--bench` from cargo bench, and anything else
        }
    }
    (!a.targets.is_empty() && !a.keys.is_empty()).then_some(a)
}

async fn counters(c: &reqwest::Client, admins: &[String]) -> BTreeMap<&'static str, f64> {
    let mut out: BTreeMap<&'static str, f64> = SERIES.iter().map(|(n, _)| (*n, 0.0)).collect();
    for admin in admins {
        let text = c
            .get(format!("{admin}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for (name, series) in SERIES {
            let v: f64 = text
                .lines()
                .find_map(|l| {
                    l.strip_prefix(series)?
                        .strip_prefix(' ')?
                        .trim()
                        .parse()
                        .ok()
                })
                .unwrap_or(0.0);
            *out.get_mut(name).unwrap() += v;
        }
    }
    out
}

async fn run_key(
    client: reqwest::Client,
    targets: Arc<Vec<String>>,
    key: String,
    rate: f64,
    secs: f64,
    tally: Arc<Tally>,
) {
    let n = (rate * secs).round() as u64;
    let inflight = Arc::new(Semaphore::new(256));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut handles = Vec::with_capacity(n as usize);
    for i in 0..n {
        tick.tick().await;
        let permit = inflight.clone().acquire_owned().await.unwrap();
        let url = targets[i as usize % targets.len()].clone();
        let (c, k, t) = (client.clone(), key.clone(), tally.clone());
        if t.sent.fetch_add(1, Ordering::Relaxed) == 0 {
            t.first_ms.store(unix_ms(), Ordering::Relaxed);
        }
        t.last_ms.store(unix_ms(), Ordering::Relaxed);
        handles.push(tokio::spawn(async move {
            let status = c
                .get(url)
                .header("x-api-key", k)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0);
            match status {
                200 => &t.ok,
                429 => &t.limited,
                0 => &t.failed,
                _ => &t.other,
            }
            .fetch_add(1, Ordering::Relaxed);
            t.done_ms.fetch_max(unix_ms(), Ordering::Relaxed);
            drop(permit);
        }));
    }
    for h in handles {
        let _ = h.await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(a) = args() else {
        println!(
            "local_admission: a load generator for benches/local_admission.sh (run that script)"
        );
        return;
    };
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let before = counters(&client, &a.admins).await;
    // Every request's URL: a target and the path.
    let targets: Arc<Vec<String>> =
        Arc::new(a.targets.iter().map(|t| format!("{t}{}", a.path)).collect());
    let tallies: Vec<Arc<Tally>> = a.keys.iter().map(|_| Arc::default()).collect();
    let start = Instant::now();
    let tasks: Vec<_> = a
        .keys
        .iter()
        .zip(&tallies)
        .map(|((key, rate), t)| {
            tokio::spawn(run_key(
                client.clone(),
                targets.clone(),
                key.clone(),
                *rate,
                a.secs,
                t.clone(),
            ))
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let after = counters(&client, &a.admins).await;
    let keys: serde_json::Map<String, Value> = a
        .keys
        .iter()
        .zip(&tallies)
        .map(|((k, rate), t)| {
            (
                k.clone(),
                json!({
                    "rate": rate,
                    "sent": t.sent.load(Ordering::Relaxed),
                    "ok": t.ok.load(Ordering::Relaxed),
                    "limited": t.limited.load(Ordering::Relaxed),
                    "other": t.other.load(Ordering::Relaxed),
                    "failed": t.failed.load(Ordering::Relaxed),
                    "first_ms": t.first_ms.load(Ordering::Relaxed),
                    "last_ms": t.last_ms.load(Ordering::Relaxed),
                    "done_ms": t.done_ms.load(Ordering::Relaxed),
                }),
            )
        })
        .collect();
    let delta: serde_json::Map<String, Value> = after
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v - before[k])))
        .collect();
    println!(
        "{}",
        json!({ "elapsed_secs": elapsed, "keys": keys, "gateways": delta })
    );
}
