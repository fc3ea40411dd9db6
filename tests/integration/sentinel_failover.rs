//! Sentinel failover under load: a sentinel promotes the replica while two gateways
//! decide on the master; both decide in the new master again within 2 s of the sentinels
//! naming it, and no request gets a 5xx (the scopes fail over to local decisions).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::support::redis::RedisServer;
use crate::support::{client, eventually, Gateway, Upstream};

const BODY: &str = r#"
[tiers.big]
key = { per_hour = 1000000, admission = "exact" }

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]

[[keys]]
id = "k_a"
key = "a"
tenant = "ta"
tier = "big"
[[keys]]
id = "k_b"
key = "b"
tenant = "tb"
tier = "big"
"#;

async fn get(server: &RedisServer, key: &str) -> Option<String> {
    let mut c = server.client().await;
    redis::cmd("GET").arg(key).query_async(&mut c).await.ok()
}

async fn info_has(server: &RedisServer, needle: &str) -> bool {
    let mut c = server.client().await;
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut c)
        .await
        .unwrap_or_default();
    info.contains(needle)
}

/// Sends requests with `key` to `gw` until `stop`, recording every status.
fn load(
    gw: &Gateway,
    key: &'static str,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<u16>>>,
) -> tokio::task::JoinHandle<()> {
    let url = gw.url("/x");
    tokio::spawn(async move {
        let c = client();
        while !stop.load(Ordering::SeqCst) {
            let status = match c.get(&url).header("x-api-key", key).send().await {
                Ok(r) => r.status().as_u16(),
                Err(_) => 0,
            };
            seen.lock().unwrap().push(status);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// See the module docs.
#[tokio::test(flavor = "multi_thread")]
async fn failover_under_load_shares_decisions_again_without_5xx() {
    let master = RedisServer::start().await;
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]).await;
    eventually(Duration::from_secs(10), "replica in sync", || async {
        info_has(&replica, "master_link_status:up")
            .await
            .then_some(())
    })
    .await;
    let sentinel = RedisServer::sentinel_with(
        &master,
        "fo",
        "sentinel down-after-milliseconds fo 1000\nsentinel failover-timeout fo 5000\n",
    )
    .await;
    let up = Upstream::start("u").await;
    let body = format!(
        "[store]\nbackend = \"redis\"\nsentinel = {{ urls = [\"{}\"], master = \"fo\" }}\ntimeout_ms = 200\non_failure = \"local\"\nkey_prefix = \"fo\"\n{}",
        sentinel.url(),
        BODY.replace("{upstream}", &up.addr.to_string())
    );
    let gws = [
        Gateway::start(&body, None).await,
        Gateway::start(&body, None).await,
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let traffic = [
        load(&gws[0], "a", stop.clone(), seen.clone()),
        load(&gws[1], "b", stop.clone(), seen.clone()),
    ];
    let keys = ["fo:{key:k_a}:1h", "fo:{key:k_b}:1h"];
    for k in keys {
        eventually(
            Duration::from_secs(5),
            "decisions in the master",
            || async { get(&master, k).await },
        )
        .await;
    }

    // The sentinel promotes the replica (retried until it knows the replica).
    let s = sentinel.client().await;
    eventually(
        Duration::from_secs(15),
        "SENTINEL FAILOVER accepted",
        || {
            let mut s = s.clone();
            async move {
                redis::cmd("SENTINEL")
                    .arg("FAILOVER")
                    .arg("fo")
                    .query_async::<String>(&mut s)
                    .await
                    .ok()
            }
        },
    )
    .await;
    let started = Instant::now();
    let new_port = replica.port.to_string();
    eventually(
        Duration::from_secs(15),
        "the sentinel names the replica",
        || {
            let mut s = s.clone();
            let new_port = new_port.clone();
            async move {
                let addr: Vec<String> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg("fo")
                    .query_async(&mut s)
                    .await
                    .ok()?;
                (addr.get(1) == Some(&new_port)).then_some(())
            }
        },
    )
    .await;
    let detection = started.elapsed();
    let before = [get(&replica, keys[0]).await, get(&replica, keys[1]).await];
    let named = Instant::now();
    let replica = &replica;
    for (k, was) in keys.iter().zip(before) {
        eventually(
            Duration::from_secs(2),
            "decisions in the new master",
            || {
                let was = was.clone();
                async move {
                    let now = get(replica, k).await;
                    (now.is_some() && now != was).then_some(())
                }
            },
        )
        .await;
    }
    let shared_after = named.elapsed();
    stop.store(true, Ordering::SeqCst);
    // Every status is recorded once both senders have seen the stop.
    for t in traffic {
        t.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    let bad: Vec<u16> = seen.iter().copied().filter(|s| *s != 200).collect();
    assert!(
        bad.is_empty(),
        "non-200 statuses during failover: {bad:?} of {}",
        seen.len()
    );
    eprintln!(
        "failover: {} requests, sentinel named the replica after {detection:?}, shared again {shared_after:?} later",
        seen.len()
    );
}
