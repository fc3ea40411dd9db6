//! `GET /v1/top` seen from outside: skewed traffic ranks its heavy hitters first with the
//! right counts, a spray of distinct addresses leaves the gateway's memory flat, and the
//! endpoint wants the admin token.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

use crate::support::{client, Gateway, Upstream, ADMIN_TOKEN};

/// Trusted loopback proxy (so `X-Forwarded-For` names the client), a key limit that
/// bites, heavy and light keys.
fn skewed_config() -> String {
    let mut body = String::from(
        r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[tiers.free]
key = { per_minute = 250 }

[[keys]]
id = "key_heavy"
key = "heavy-key"
tenant = "acme"
tier = "free"

[[keys]]
id = "key_mid"
key = "mid-key"
tenant = "globex"
tier = "free"

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]
auth = "optional"
"#,
    );
    for i in 0..LIGHT_KEYS {
        body.push_str(&format!(
            "\n[[keys]]\nid = \"key_light_{i}\"\nkey = \"light-{i}\"\ntenant = \"t{}\"\ntier = \"free\"\n",
            i % 3
        ));
    }
    body
}

const LIGHT_KEYS: usize = 30;

/// `GET /v1/top` with the admin token.
async fn top(gw: &Gateway, query: &str) -> Value {
    let r = client()
        .get(gw.admin_url(&format!("/v1/top?{query}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{query}");
    r.json().await.unwrap()
}

/// (identity, requests, rejected) of the first `n` rows.
fn rows(v: &Value) -> Vec<(String, u64, u64)> {
    v["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["identity"].as_str().unwrap().to_string(),
                e["requests"].as_u64().unwrap(),
                e["rejected"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn within_10pct(got: u64, truth: u64) -> bool {
    got.abs_diff(truth) * 10 <= truth
}

/// A few heavy callers among many light ones: each scope ranks the heavy ones first,
/// requests within 10% of the truth, and rejected equal to the 429s the client saw.
#[tokio::test(flavor = "multi_thread")]
async fn top_ranks_heavy_hitters_with_counts_and_rejections() {
    let up = Upstream::start("u").await;
    let gw = Gateway::start(&skewed_config(), Some(&up)).await;
    // (client address, key): 400 heavy, 200 mid, 600 light callers from distinct addresses.
    let mut requests: Vec<(String, String)> = Vec::new();
    for i in 0..600usize {
        let light = Ipv4Addr::from(0xC612_0000u32 + i as u32); // 198.18.x.y
        requests.push((light.to_string(), format!("light-{}", i % LIGHT_KEYS)));
        if i % 3 != 2 {
            requests.push(("203.0.113.10".into(), "heavy-key".into()));
        } // 400
        if i % 3 == 0 {
            requests.push(("203.0.113.20".into(), "mid-key".into()));
        } // 200
    }
    let statuses = send_all(&gw, requests.clone(), 16).await;
    let mut rejected: HashMap<&str, u64> = HashMap::new();
    for ((_, key), status) in requests.iter().zip(&statuses) {
        if *status == 429 {
            *rejected.entry(key.as_str()).or_default() += 1;
        }
    }
    let heavy_rejected = rejected.get("heavy-key").copied().unwrap_or(0);
    assert!(heavy_rejected >= 100, "the key limit bit: {rejected:?}");
    assert_eq!(
        rejected.len(),
        1,
        "only the heavy key is over: {rejected:?}"
    );

    let keys = top(&gw, "scope=key&n=3").await;
    assert_eq!(
        (keys["scope"].as_str(), keys["window_secs"].as_u64()),
        (Some("key"), Some(60))
    );
    let k = rows(&keys);
    assert_eq!(k.len(), 3, "{keys}");
    assert_eq!(
        (k[0].0.as_str(), k[0].2),
        ("key_heavy", heavy_rejected),
        "{keys}"
    );
    assert!(within_10pct(k[0].1, 400), "{keys}");
    assert_eq!((k[1].0.as_str(), k[1].2), ("key_mid", 0), "{keys}");
    assert!(within_10pct(k[1].1, 200), "{keys}");
    assert!(
        k[2].0.starts_with("key_light_") && within_10pct(k[2].1, 20),
        "{keys}"
    );

    let ips = rows(&top(&gw, "scope=ip&n=3").await);
    assert_eq!(
        (ips[0].0.as_str(), ips[0].2),
        ("203.0.113.10", heavy_rejected),
        "{ips:?}"
    );
    assert!(within_10pct(ips[0].1, 400), "{ips:?}");
    assert_eq!(
        (ips[1].0.as_str(), ips[1].2),
        ("203.0.113.20", 0),
        "{ips:?}"
    );
    assert!(within_10pct(ips[1].1, 200), "{ips:?}");
    assert!(ips[2].1 <= 5, "a light address sent one request: {ips:?}");

    let tenants = rows(&top(&gw, "scope=tenant&n=10").await);
    assert_eq!(
        (tenants[0].0.as_str(), tenants[0].2),
        ("acme", heavy_rejected),
        "{tenants:?}"
    );
    assert!(within_10pct(tenants[0].1, 400), "{tenants:?}");
    let rest: HashMap<&str, u64> = tenants[1..].iter().map(|t| (t.0.as_str(), t.1)).collect();
    for (tenant, truth) in [("globex", 200), ("t0", 200), ("t1", 200), ("t2", 200)] {
        assert!(within_10pct(rest[tenant], truth), "{tenant}: {tenants:?}");
    }
}

/// Sends `(client address, key)` requests over `parallel` connections; statuses in order.
async fn send_all(gw: &Gateway, requests: Vec<(String, String)>, parallel: usize) -> Vec<u16> {
    let c = client();
    let mut tasks = Vec::new();
    let chunk = requests.len().div_ceil(parallel);
    for part in requests.chunks(chunk).map(<[_]>::to_vec) {
        let (c, url) = (c.clone(), gw.url("/x"));
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for (ip, key) in part {
                let r = c
                    .get(&url)
                    .header("x-forwarded-for", ip)
                    .header("x-api-key", key)
                    .send()
                    .await
                    .unwrap();
                out.push(r.status().as_u16());
            }
            out
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.extend(t.await.unwrap());
    }
    statuses
}

/// Distinct addresses the spray sends (one request each).
const SPRAY: u32 = 200_000;
/// Allowed RSS growth over the spray. Keeping every address with its two counts needs at
/// least 16 + 16 bytes per address before any map overhead: 200,000 x 32 B = 6.1 MiB
/// (a `HashMap<IpAddr, (u64, u64)>` of them takes about 15 MiB). The sketch is allocated
/// (and written) at start, so its own growth is 0; measured growth alone was 0 KiB, but
/// run beside the whole suite the allocator's own arenas have grown by a little, so the
/// bound leaves half of the smallest "kept" cost as slack.
const GROWTH_BOUND_KIB: u64 = 3 * 1024;

/// No limits, and one route the spray never matches (every request is a 404 after the
/// limits, with no upstream to wait on).
const SPRAY_CONFIG: &str = r#"
[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[[routes]]
name = "unused"
path_prefix = "/unused"
upstreams = ["127.0.0.1:9"]
auth = "none"
"#;

/// A spray of 200,000 distinct client addresses grows the gateway's memory by less
/// than keeping them would take. The config has no limits at all, so the limit store keeps no per-address state and
/// the top sketch is the only thing that sees every address.
#[tokio::test(flavor = "multi_thread")]
async fn ip_spray_keeps_memory_bounded() {
    let gw = Gateway::start(SPRAY_CONFIG, None).await;
    // Warm up connections, buffers and the allocator with a first spray of its own.
    spray(gw.addr, 0x0A00_0000, 40_000, 8).await;
    let before = vm_rss_kib(gw.pid());
    spray(gw.addr, 0x6440_0000, SPRAY, 8).await; // 100.64.0.0 onwards
    let after = vm_rss_kib(gw.pid());
    let grown = after.saturating_sub(before);
    eprintln!("VmRSS {before} KiB -> {after} KiB (+{grown} KiB) over {SPRAY} addresses");
    assert!(
        grown < GROWTH_BOUND_KIB,
        "RSS grew {grown} KiB over {SPRAY} distinct addresses"
    );
    let ips = rows(&top(&gw, "scope=ip&n=100").await);
    assert_eq!(ips.len(), 100, "the answer is capped at n");
}

/// `count` requests from consecutive addresses starting at `first`, over `parallel`
/// keep-alive connections (raw HTTP/1.1: the client must not be the bottleneck).
async fn spray(addr: SocketAddr, first: u32, count: u32, parallel: u32) {
    let per = count / parallel;
    let threads: Vec<_> = (0..parallel)
        .map(|t| {
            let start = first + t * per;
            tokio::task::spawn_blocking(move || {
                let mut conn = Conn::open(addr);
                for i in start..start + per {
                    let req = format!(
                        "GET /x HTTP/1.1\r\nHost: spray\r\nX-Forwarded-For: {}\r\n\r\n",
                        Ipv4Addr::from(i)
                    );
                    if conn.exchange(req.as_bytes()).is_none() {
                        conn = Conn::open(addr); // closed by the gateway: retry once
                        assert_eq!(conn.exchange(req.as_bytes()), Some(404));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.await.unwrap();
    }
}

/// A keep-alive connection reading whole responses (by Content-Length).
struct Conn {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Self {
        let writer = TcpStream::connect(addr).unwrap();
        writer
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let reader = BufReader::new(writer.try_clone().unwrap());
        Self { writer, reader }
    }

    /// Sends `req`; the response status.
    fn exchange(&mut self, req: &[u8]) -> Option<u16> {
        self.writer.write_all(req).ok()?;
        let mut line = String::new();
        self.reader.read_line(&mut line).ok()?;
        let status = line.split_whitespace().nth(1)?.parse().ok()?;
        let mut len = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line).ok()?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().ok()?;
            }
        }
        let mut body = vec![0u8; len];
        self.reader.read_exact(&mut body).ok()?;
        Some(status)
    }
}

/// The resident set size of `pid`, in KiB.
fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The endpoint wants the admin token (401 without it or with another), and answers a
/// bad scope or n with 400 and a JSON error.
#[tokio::test(flavor = "multi_thread")]
async fn top_requires_the_admin_token_and_valid_parameters() {
    let gw = Gateway::start(SPRAY_CONFIG, None).await;
    let c = client();
    let url = gw.admin_url("/v1/top?scope=key");
    let r = c.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = c.get(&url).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "unauthorized");
    for query in ["scope=global", "scope=key&n=0", "scope=key&n=x", "n=5"] {
        let r = c
            .get(gw.admin_url(&format!("/v1/top?{query}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{query}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "invalid_request", "{query}");
    }
    let empty = top(&gw, "scope=tenant").await;
    assert_eq!(
        empty,
        serde_json::json!({"scope": "tenant", "window_secs": 60, "top": []})
    );
}

/// `POST /v1/check` feeds the sketch with the address it names (not the caller's).
#[tokio::test(flavor = "multi_thread")]
async fn check_api_feeds_top_with_the_given_address() {
    let gw = Gateway::start(SPRAY_CONFIG, None).await;
    let c = client();
    for _ in 0..3 {
        let r = c
            .post(gw.admin_url("/v1/check"))
            .json(&serde_json::json!({"ip": "192.0.2.77"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let ips = rows(&top(&gw, "scope=ip").await);
    assert_eq!(ips, [("192.0.2.77".to_string(), 3, 0)]);
}
