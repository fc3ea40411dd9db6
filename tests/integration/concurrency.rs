//! Concurrency limits (`concurrent = N`) through real gateways: N slots, then the 429 of
//! the contract; a slot comes back on every ending (response, upstream error, client gone,
//! a reload in between, a rate-limit refusal); fleet-wide on Redis; and the slots of a
//! gateway killed with SIGKILL free themselves within `concurrency_lease_secs`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use tokio::time::Instant;

use serde_json::Value;

use crate::support::redis::RedisServer;
use crate::support::{client, eventually, header, Gateway, Upstream};

const KEY: &str = "conc-key-secret";

fn config(tier: &str, store: &str) -> String {
    format!(
        r#"{store}
[tiers.t]
{tier}

[[routes]]
name = "dead"
path_prefix = "/dead"
upstreams = ["127.0.0.1:1"]
connect_timeout_ms = 200

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{{upstream}}"]

[[keys]]
id = "k1"
key = "{KEY}"
tenant = "acme"
tier = "t"
"#
    )
}

async fn get(gw: &Gateway, path: &str) -> reqwest::Response {
    client()
        .get(gw.url(path))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap()
}

/// Starts a request that the upstream answers after `delay_ms`. While the probes of
/// `until_full` hold a slot for a moment it may be refused for concurrency: it retries
/// then (a concurrency refusal charges nothing), so it ends up in flight.
fn slow(gw: &Gateway, delay_ms: u64) -> tokio::task::JoinHandle<u16> {
    let url = gw.url(&format!("/slow?delay_ms={delay_ms}"));
    tokio::spawn(async move {
        loop {
            let r = client().get(&url).header("x-api-key", KEY).send().await;
            let Ok(r) = r else { return 0 };
            if r.status() != 429 {
                return r.status().as_u16();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// A request the upstream answers after `delay_ms`, sent on a raw connection and left in
/// flight (retried while it is refused for concurrency by a probe).
fn raw_slow(gw: &Gateway, delay_ms: u64) -> TcpStream {
    loop {
        let mut s = TcpStream::connect(gw.addr).unwrap();
        write!(
            s,
            "GET /slow?delay_ms={delay_ms} HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\n\r\n"
        )
        .unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut buf = [0u8; 16];
        match s.read(&mut buf) {
            Ok(n) if n > 0 => continue, // answered at once: refused, try again
            _ => return s,              // no answer yet: in flight
        }
    }
}

/// Waits until a quick request is refused for concurrency (the slow ones are in flight)
/// and answers that 429 with the number of probes that passed before it (each charged
/// the rate windows).
async fn until_full(gw: &Gateway) -> (reqwest::Response, u32) {
    let mut passed = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = get(gw, "/quick").await;
        match r.status().as_u16() {
            429 => return (r, passed),
            200 => passed += 1,
            other => panic!("probe answered {other}"),
        }
        assert!(Instant::now() < deadline, "the slots never filled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until a quick request passes again (the slots came back).
async fn until_free(gw: &Gateway, patience: Duration) {
    eventually(patience, "a slot to come back", || async {
        (get(gw, "/quick").await.status() == 200).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn n_slots_then_the_contract_429() {
    let up = Upstream::start("up").await;
    let gw = Gateway::start(
        &config("key = { per_minute = 1000, concurrent = 2 }", ""),
        Some(&up),
    )
    .await;
    let a = slow(&gw, 1_500);
    let b = slow(&gw, 1_500);
    let (r, _) = until_full(&gw).await;
    assert_eq!(header(&r, "retry-after"), "1");
    assert!(r.headers().get("x-ratelimit-limit").is_none());
    assert!(r.headers().get("x-ratelimit-remaining").is_none());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "rate_limit_exceeded");
    assert_eq!(body["scope"], "key");
    assert_eq!(body["window"], "concurrent");
    assert_eq!(body["limit"], 2);
    assert_eq!(body["current"], 3);
    assert_eq!(body["retry_after"], 1.0);
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains("2 requests in flight"));
    assert_eq!((a.await.unwrap(), b.await.unwrap()), (200, 200));
    // Both ended: both slots are back (a rate window was not charged by the 429s, so
    // the quick requests below pass on their own merits).
    let r = get(&gw, "/quick").await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-ratelimit-limit").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_comes_back_on_every_ending() {
    let up = Upstream::start("up").await;
    let body = config("key = { per_minute = 1000, concurrent = 1 }", "");
    let gw = Gateway::start(&body, Some(&up)).await;

    // Upstream failure (nothing listens on the dead route's port): 502, slot back.
    for _ in 0..3 {
        assert_eq!(get(&gw, "/dead/x").await.status(), 502);
        assert_eq!(
            get(&gw, "/quick").await.status(),
            200,
            "a 502 kept its slot"
        );
    }

    // The client goes away mid-request: the slot comes back once the gateway sees it.
    let s = raw_slow(&gw, 800);
    until_full(&gw).await;
    drop(s);
    until_free(&gw, Duration::from_secs(5)).await;

    // A reload while a request is in flight: it finishes on its config, and its slot
    // goes back to the same store.
    let slow_one = slow(&gw, 1_000);
    until_full(&gw).await;
    gw.rewrite(&body.replace("per_minute = 1000", "per_minute = 999"));
    gw.signal("HUP");
    assert_eq!(slow_one.await.unwrap(), 200);
    until_free(&gw, Duration::from_secs(5)).await;
    assert_eq!(get(&gw, "/quick").await.status(), 200);
}

/// A concurrency refusal charges no rate window, and a rate-window refusal gives the slot
/// it took back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_hold_nothing() {
    let up = Upstream::start("up").await;
    let gw = Gateway::start(
        // The exact log: no refill while the test runs, so remaining counts are exact.
        &config(
            r#"key = { per_hour = 100, algorithm = "sliding_log", concurrent = 1 }"#,
            "",
        ),
        Some(&up),
    )
    .await;
    let s = slow(&gw, 1_200);
    let (r, passed) = until_full(&gw).await;
    assert_eq!(r.json::<Value>().await.unwrap()["window"], "concurrent");
    for _ in 0..5 {
        assert_eq!(get(&gw, "/quick").await.status(), 429);
    }
    assert_eq!(s.await.unwrap(), 200);
    // Charged: the slow request and the probes that passed; none of the six 429s.
    let r = get(&gw, "/quick").await;
    assert_eq!(r.status(), 200);
    let left = 100 - 1 - passed - 1;
    assert_eq!(header(&r, "x-ratelimit-remaining"), left.to_string());
    for _ in 0..left {
        assert_eq!(get(&gw, "/quick").await.status(), 200);
    }
    // Now the rate window refuses. Had a refused request kept its slot, the next ones
    // would be refused for concurrency instead.
    for _ in 0..3 {
        let r = get(&gw, "/quick").await;
        assert_eq!(r.status(), 429);
        assert_eq!(r.json::<Value>().await.unwrap()["window"], "1h");
    }
}

fn redis_store(redis: &RedisServer, prefix: &str, lease_secs: u64) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = 500\nconcurrency_lease_secs = {lease_secs}\n",
        redis.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fleet_wide_on_redis() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("up").await;
    let body = config(
        "key = { per_minute = 1000 }\ntenant = { concurrent = 2 }",
        &redis_store(&redis, "conc-fleet", 30),
    );
    let a = Gateway::start(&body, Some(&up)).await;
    let b = Gateway::start(&body, Some(&up)).await;
    let s1 = slow(&a, 1_500);
    let s2 = slow(&a, 1_500);
    // Both slots are taken through gateway a: gateway b refuses.
    let (r, _) = until_full(&b).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (&body["scope"], &body["window"], &body["current"]),
        (
            &Value::from("tenant"),
            &Value::from("concurrent"),
            &Value::from(3)
        )
    );
    assert_eq!((s1.await.unwrap(), s2.await.unwrap()), (200, 200));
    until_free(&b, Duration::from_secs(5)).await;
    // Released means removed: nothing is left in the set. The probe that found a free
    // slot gives it back after its response is written (a spawned EVALSHA), so wait.
    let mut c = redis.client().await;
    eventually(Duration::from_secs(5), "the slot set to empty", || {
        let mut c = c.clone();
        async move {
            let n: u64 = redis::cmd("ZCARD")
                .arg("conc-fleet:{tenant:acme}:conc")
                .query_async(&mut c)
                .await
                .ok()?;
            (n == 0).then_some(())
        }
    })
    .await;
    // And it stays empty: nothing was double-counted or left behind.
    let n: u64 = redis::cmd("ZCARD")
        .arg("conc-fleet:{tenant:acme}:conc")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_frees_slots_within_the_lease() {
    let redis = RedisServer::start().await;
    let up = Upstream::start("up").await;
    let body = config(
        "key = { per_minute = 1000, concurrent = 1 }",
        &redis_store(&redis, "conc-kill", 1),
    );
    let mut a = Gateway::start(&body, Some(&up)).await;
    let b = Gateway::start(&body, Some(&up)).await;
    let held = slow(&a, 4_000);
    until_full(&b).await;
    // Past the lease (1 s) the slot is still held: gateway a renews it while it runs.
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    assert_eq!(
        get(&b, "/quick").await.status(),
        429,
        "a running request lost its slot"
    );
    a.signal("KILL");
    a.wait_exit(Duration::from_secs(5)).await;
    let killed = Instant::now();
    until_free(&b, Duration::from_secs(5)).await;
    // Within the lease (1 s) plus a renewal period and the polling.
    assert!(
        killed.elapsed() < Duration::from_secs(3),
        "{:?}",
        killed.elapsed()
    );
    drop(held);
}
