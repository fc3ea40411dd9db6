//! The Envoy rate-limit service (`[server] rls_listen`, gRPC `ShouldRateLimit`) with an
//! envoyproxy/ratelimit YAML config (`[rls] config`): decisions per second, latency and
//! Redis round trips per decision, on Redis with leases (`[rls] admission = "auto"`), on
//! Redis with every decision in Redis (`"exact"`), and on the memory store, side by side
//! from one run.
//!
//! ```text
//! DURATION=5s cargo bench --bench rls
//! ```
//!
//! Each configuration runs the real gateway binary (`target/release/throttle run`, built by
//! cargo for this bench) with `rls_listen` on a free port, `[rls] config` pointing at one
//! YAML file (domain `rlsbench`: `generic_key` = `bench` and a bare `remote_address`, one
//! counter per address, both `100_000_000` per minute, so nothing is ever rejected) and,
//! on Redis, a fresh `key_prefix` (its keys are deleted afterwards). `CALLERS` callers
//! (default 32) keep one `ShouldRateLimit` each in flight over `CONNS` HTTP/2 connections
//! (default 4), each request two descriptors (`generic_key`, `remote_address` of one of
//! `ADDRESSES` client addresses, default 1000, in turn), for `WARMUP` (default 1 s, not
//! measured) and then `DURATION` (default 5 s). Every configuration runs `ROUNDS` times
//! (default 2; round 2 in reverse order, each in a fresh gateway), so drift on a busy
//! machine shows; the gateway's CPU time over each measured phase gives decisions per
//! gateway CPU-second as well, which depends less on what else the machine is doing.
//!
//! Redis round trips are counted on the Redis the gateway uses (`$REDIS_URL`, default
//! redis://127.0.0.1:6379): `INFO stats` then `INFO commandstats` before and after the
//! measured phase. Round trips = the calls of commands a client sends itself (script calls
//! `EVALSHA`/`EVAL`/`FCALL` and their `_RO` forms, `PING`, `HELLO`, `SELECT`, `AUTH`, and
//! the container commands such as `SCRIPT|LOAD` or `CLIENT|SETINFO`), since Throttle makes
//! every store call one script call; the commands those scripts run inside Redis (GET, SET,
//! PEXPIRE, ...) are in "commands/decision": `total_commands_processed`'s change minus the
//! benchmark's own two `INFO` calls. Both include the gateway's heartbeat (one script call a
//! second). The gateway's own count (`throttle_store_calls_total{store="redis"}`) is shown
//! beside them. Prints "skipped" for the Redis rows when no Redis answers.
//!
//! Other knobs: `THREADS` (the gateway's `server.threads`, default 1: the RLS runtime gets
//! one thread, the other core is left to the callers and Redis), `CLIENT_THREADS` (the
//! callers' tokio workers, default 1), `GW_LOG` (the gateway's `RUST_LOG`, default warn).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

const DOMAIN: &str = "rlsbench";
/// Per minute, on both descriptors: far above anything two cores can send.
const LIMIT: u32 = 100_000_000;

struct Settings {
    duration: Duration,
    warmup: Duration,
    callers: usize,
    conns: usize,
    addresses: usize,
    threads: usize,
    client_threads: usize,
    rounds: usize,
    redis_url: String,
    gw_log: String,
    /// /proc/loadavg at start: other load on the machine shows.
    loadavg: String,
}

/// `5s`, `500ms`, `1m`, `2.5` (seconds).
fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.trim().parse().ok()?;
    (v.is_finite() && v > 0.0).then(|| Duration::from_secs_f64(v * scale))
}

fn bad_env(name: &str, value: &str, what: &str) -> ! {
    eprintln!("rls: {name}={value} is not {what}");
    std::process::exit(2)
}

fn env_duration(name: &str, default: Duration) -> Duration {
    match std::env::var(name) {
        Ok(v) => parse_duration(&v).unwrap_or_else(|| bad_env(name, &v, "a duration")),
        Err(_) => default,
    }
}

fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| bad_env(name, &v, "a positive count")),
        Err(_) => default,
    }
}

impl Settings {
    fn from_env() -> Self {
        Self {
            duration: env_duration("DURATION", Duration::from_secs(5)),
            warmup: env_duration("WARMUP", Duration::from_secs(1)),
            callers: env_count("CALLERS", 32),
            conns: env_count("CONNS", 4),
            addresses: env_count("ADDRESSES", 1000),
            threads: env_count("THREADS", 1),
            client_threads: env_count("CLIENT_THREADS", 1),
            rounds: env_count("ROUNDS", 2),
            redis_url: std::env::var("REDIS_URL")
                .unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
            gw_log: std::env::var("GW_LOG").unwrap_or_else(|_| "warn".into()),
            loadavg: std::fs::read_to_string("/proc/loadavg")
                .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|_| "?".into()),
        }
    }
}

fn yaml() -> String {
    format!(
        "# benches/rls.rs: limits far above the load, so every decision is OK and counted.\n\
         domain: {DOMAIN}\n\
         descriptors:\n\
         \x20 - key: generic_key\n\
         \x20   value: bench\n\
         \x20   rate_limit:\n\
         \x20     unit: minute\n\
         \x20     requests_per_unit: {LIMIT}\n\
         \x20 - key: remote_address\n\
         \x20   rate_limit:\n\
         \x20     unit: minute\n\
         \x20     requests_per_unit: {LIMIT}\n"
    )
}

/// One request per client address, as Envoy sends them: two descriptors.
fn requests(addresses: usize) -> Vec<RateLimitRequest> {
    let descriptor = |k: &str, v: String| RateLimitDescriptor {
        entries: vec![Entry {
            key: k.into(),
            value: v,
        }],
        ..Default::default()
    };
    (0..addresses)
        .map(|i| RateLimitRequest {
            domain: DOMAIN.into(),
            descriptors: vec![
                descriptor("generic_key", "bench".into()),
                descriptor(
                    "remote_address",
                    Ipv4Addr::from(0x0a00_0001u32 + i as u32).to_string(),
                ),
            ],
            hits_addend: 0,
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Store {
    Memory,
    Redis(&'static str),
}

impl Store {
    fn label(self) -> String {
        match self {
            Store::Memory => "memory store".into(),
            Store::Redis(a) => format!("Redis, admission = \"{a}\""),
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Store::Memory => "memory",
            Store::Redis(a) => a,
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The gateway process; stopped (SIGTERM, then SIGKILL) when dropped.
struct Gateway {
    child: Child,
    admin: SocketAddr,
    rls: SocketAddr,
    log: PathBuf,
}

impl Gateway {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What every configuration shares.
struct Bench {
    s: Settings,
    /// The temporary directory of the YAML file, the gateway configs and their logs.
    dir: PathBuf,
    yaml: PathBuf,
    http: reqwest::Client,
    reqs: Arc<Vec<RateLimitRequest>>,
    ticks_per_sec: f64,
}

/// Writes the gateway's config and starts it; returns once `/readyz` answers 200.
async fn start_gateway(b: &Bench, store: Store, prefix: &str) -> Result<Gateway, String> {
    let (s, dir, yaml, http) = (&b.s, b.dir.as_path(), b.yaml.as_path(), &b.http);
    let (port, admin, rls) = (free_port(), free_port(), free_port());
    let tag = store.tag();
    let (store_toml, admission) = match store {
        Store::Memory => ("backend = \"memory\"\n".to_string(), String::new()),
        Store::Redis(a) => (
            format!(
                "backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = 250\n",
                s.redis_url
            ),
            format!("admission = \"{a}\"\n"),
        ),
    };
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
         rls_listen = \"127.0.0.1:{rls}\"\ninstance_id = \"{prefix}\"\nthreads = {}\n\
         grace_period_secs = 0\n\n[store]\n{store_toml}\n[rls]\nconfig = \"{}\"\n{admission}\n\
         [[routes]]\nname = \"rlsbench\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:9\"]\n",
        s.threads,
        yaml.display()
    );
    let config = dir.join(format!("gateway-{tag}.toml"));
    std::fs::write(&config, &toml).unwrap();
    let log = dir.join(format!("gateway-{tag}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_throttle"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", &s.gw_log)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .map_err(|e| format!("{}: {e}", env!("CARGO_BIN_EXE_throttle")))?;
    let mut gw = Gateway {
        child,
        admin: ([127, 0, 0, 1], admin).into(),
        rls: ([127, 0, 0, 1], rls).into(),
        log,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = gw.child.try_wait() {
            return Err(format!(
                "the gateway exited ({status}) with this config:\n{toml}\nits log:\n{}",
                gw.log_tail()
            ));
        }
        let ready = http
            .get(format!("http://{}/readyz", gw.admin))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if ready {
            return Ok(gw);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "the gateway was not ready within 30 s with this config:\n{toml}\nits log:\n{}",
        gw.log_tail()
    ))
}

async fn connect(
    rls: SocketAddr,
    conns: usize,
) -> Result<Vec<RateLimitServiceClient<Channel>>, String> {
    let endpoint = Endpoint::from_shared(format!("http://{rls}")).unwrap();
    let mut out = Vec::with_capacity(conns);
    for _ in 0..conns {
        let deadline = Instant::now() + Duration::from_secs(10);
        let channel = loop {
            match endpoint.connect().await {
                Ok(c) => break c,
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("no gRPC connection to {rls}: {e}"))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        out.push(RateLimitServiceClient::new(channel));
    }
    Ok(out)
}

#[derive(Default)]
struct Load {
    ok: u64,
    over: u64,
    errors: u64,
    first_error: Option<String>,
    latencies_us: Vec<u32>,
    elapsed: Duration,
}

/// `callers` callers, each with one call in flight, until `duration` has passed.
async fn drive(
    clients: &[RateLimitServiceClient<Channel>],
    reqs: &Arc<Vec<RateLimitRequest>>,
    callers: usize,
    duration: Duration,
) -> Load {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + duration;
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let (reqs, next) = (reqs.clone(), next.clone());
            tokio::spawn(async move {
                let mut load = Load {
                    latencies_us: Vec::with_capacity(1 << 14),
                    ..Load::default()
                };
                while Instant::now() < end {
                    let n = next.fetch_add(1, Ordering::Relaxed) as usize % reqs.len();
                    let req = reqs[n].clone();
                    let t0 = Instant::now();
                    let answer = client.should_rate_limit(req).await;
                    let us = t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                    load.latencies_us.push(us);
                    let problem = match answer {
                        Ok(r) => {
                            let r = r.into_inner();
                            let limited = r.statuses.len() == 2
                                && r.statuses.iter().all(|s| {
                                    s.current_limit
                                        .as_ref()
                                        .is_some_and(|l| l.requests_per_unit == LIMIT)
                                });
                            match r.overall_code() {
                                Code::Ok if limited => {
                                    load.ok += 1;
                                    None
                                }
                                Code::OverLimit => {
                                    load.over += 1;
                                    None
                                }
                                _ => Some(format!("an unexpected answer: {r:?}")),
                            }
                        }
                        Err(status) => Some(format!("{status:?}")),
                    };
                    if let Some(p) = problem {
                        load.errors += 1;
                        load.first_error.get_or_insert(p);
                    }
                }
                load
            })
        })
        .collect();
    let mut all = Load::default();
    for t in tasks {
        let l = t.await.unwrap();
        all.ok += l.ok;
        all.over += l.over;
        all.errors += l.errors;
        if all.first_error.is_none() {
            all.first_error = l.first_error;
        }
        all.latencies_us.extend(l.latencies_us);
    }
    all.elapsed = start.elapsed();
    all
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Redis's counters: `total_commands_processed` and the calls of every command.
struct RedisStats {
    total: u64,
    calls: BTreeMap<String, u64>,
}

async fn redis_stats(conn: &mut redis::aio::MultiplexedConnection) -> Result<RedisStats, String> {
    let stats: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    let commands: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    let total = stats
        .lines()
        .find_map(|l| {
            l.strip_prefix("total_commands_processed:")?
                .trim()
                .parse()
                .ok()
        })
        .ok_or("INFO stats without total_commands_processed")?;
    let calls = commands
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let n = rest
                .split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_string(), n))
        })
        .collect();
    Ok(RedisStats { total, calls })
}

/// A command a client sends itself, never one a script runs inside Redis.
fn client_command(name: &str) -> bool {
    matches!(
        name,
        "eval"
            | "evalsha"
            | "eval_ro"
            | "evalsha_ro"
            | "fcall"
            | "fcall_ro"
            | "ping"
            | "hello"
            | "select"
            | "auth"
    ) || name.contains('|')
}

/// (round trips, commands) between two snapshots, without the benchmark's own two INFOs.
fn redis_delta(before: &RedisStats, after: &RedisStats) -> (u64, u64) {
    let trips = after
        .calls
        .iter()
        .filter(|(name, _)| client_command(name))
        .map(|(name, n)| n - before.calls.get(name).copied().unwrap_or(0))
        .sum();
    (trips, (after.total - before.total).saturating_sub(2))
}

/// The gateway's metrics the table shows, summed over their label sets.
#[derive(Default, Clone, Copy)]
struct GwMetrics {
    store_calls: f64,
    store_errors: f64,
    leased: f64,
}

fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            let (series, value) = rest.rsplit_once(' ')?;
            labels
                .iter()
                .all(|want| series.contains(want))
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum()
}

async fn gw_metrics(http: &reqwest::Client, admin: SocketAddr) -> GwMetrics {
    let Ok(r) = http.get(format!("http://{admin}/metrics")).send().await else {
        return GwMetrics::default();
    };
    let text = r.text().await.unwrap_or_default();
    GwMetrics {
        store_calls: metric(&text, "throttle_store_calls_total", &[r#"store="redis""#]),
        store_errors: metric(&text, "throttle_store_errors_total", &[]),
        leased: metric(
            &text,
            "throttle_local_decisions_total",
            &[r#"reason="lease""#],
        ),
    }
}

/// One configuration measured once (one round).
struct Measured {
    load: Load,
    /// Redis round trips and commands over the measured phase (Redis rows only).
    redis: Option<(u64, u64)>,
    gw: GwMetrics,
    /// The gateway's CPU time (user + system, all threads) over the measured phase.
    gw_cpu: Duration,
}

impl Measured {
    fn decisions(&self) -> u64 {
        self.load.ok + self.load.over
    }

    fn per_second(&self) -> f64 {
        self.decisions() as f64 / self.load.elapsed.as_secs_f64()
    }
}

/// The CPU time `pid` has used so far (utime + stime of /proc/PID/stat).
fn cpu_time(pid: u32, ticks_per_sec: f64) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ticks: f64 = stat
        .rsplit_once(") ")
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|v| v.parse::<f64>().ok())
                .sum()
        })
        .unwrap_or(0.0);
    Duration::from_secs_f64(ticks / ticks_per_sec)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`, 100 when that fails).
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

async fn measure(
    b: &Bench,
    store: Store,
    prefix: &str,
    redis: Option<&mut redis::aio::MultiplexedConnection>,
) -> Result<Measured, String> {
    let (s, http, reqs) = (&b.s, &b.http, &b.reqs);
    let gw = start_gateway(b, store, prefix).await?;
    let clients = connect(gw.rls, s.conns).await?;
    let warm = drive(&clients, reqs, s.callers, s.warmup).await;
    if warm.ok == 0 {
        return Err(format!(
            "no OK decision in the warm-up ({} errors, first: {}); the gateway's log:\n{}",
            warm.errors,
            warm.first_error.unwrap_or_default(),
            gw.log_tail()
        ));
    }
    let mut redis = redis;
    let before = match redis.as_mut() {
        Some(c) => Some(redis_stats(c).await?),
        None => None,
    };
    let gw0 = gw_metrics(http, gw.admin).await;
    let cpu0 = cpu_time(gw.child.id(), b.ticks_per_sec);
    let load = drive(&clients, reqs, s.callers, s.duration).await;
    let cpu1 = cpu_time(gw.child.id(), b.ticks_per_sec);
    let gw1 = gw_metrics(http, gw.admin).await;
    let after = match redis.as_mut() {
        Some(c) => Some(redis_stats(c).await?),
        None => None,
    };
    let log = gw.log_tail();
    drop(clients);
    drop(gw);
    if load.errors > 0 {
        eprintln!(
            "rls: {}: {} failed calls, the first: {}\nthe gateway's log:\n{log}",
            store.label(),
            load.errors,
            load.first_error.as_deref().unwrap_or_default()
        );
    }
    Ok(Measured {
        load,
        redis: before.zip(after).map(|(b, a)| redis_delta(&b, &a)),
        gw: GwMetrics {
            store_calls: gw1.store_calls - gw0.store_calls,
            store_errors: gw1.store_errors - gw0.store_errors,
            leased: gw1.leased - gw0.leased,
        },
        gw_cpu: cpu1.saturating_sub(cpu0),
    })
}

/// Deletes the keys of one configuration's prefix.
async fn delete_keys(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) {
    let mut cursor = 0u64;
    loop {
        let Ok((next, keys)): Result<(u64, Vec<String>), _> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
        else {
            return;
        };
        if !keys.is_empty() {
            let _: Result<u64, _> = redis::cmd("UNLINK").arg(&keys).query_async(conn).await;
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

async fn redis_conn(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| "no answer within 2 s".to_string())?
    .map_err(|e| e.to_string())?;
    let _: String = redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// Every round of one configuration, or why it has none.
struct Row {
    store: Store,
    rounds: Vec<Measured>,
    failed: Option<String>,
}

impl Row {
    fn decisions(&self) -> u64 {
        self.rounds.iter().map(Measured::decisions).sum()
    }

    /// Decisions per second, the mean of the rounds.
    fn per_second(&self) -> f64 {
        self.rounds.iter().map(Measured::per_second).sum::<f64>() / self.rounds.len().max(1) as f64
    }

    /// Decisions per CPU-second of the gateway, pooled over the rounds.
    fn per_cpu_second(&self) -> f64 {
        let cpu: f64 = self.rounds.iter().map(|m| m.gw_cpu.as_secs_f64()).sum();
        self.decisions() as f64 / cpu.max(1e-9)
    }

    /// Redis round trips per decision, pooled over the rounds.
    fn trips(&self) -> Option<f64> {
        let trips: Option<u64> = self.rounds.iter().map(|m| m.redis.map(|r| r.0)).sum();
        Some(trips? as f64 / self.decisions().max(1) as f64)
    }

    fn sum(&self, f: impl Fn(&Measured) -> f64) -> f64 {
        self.rounds.iter().map(f).sum()
    }
}

fn print_table(s: &Settings, rows: &[Row]) {
    println!(
        "RLS ShouldRateLimit, envoyproxy/ratelimit YAML (domain {DOMAIN}: generic_key=bench + bare remote_address, \
         {LIMIT}/minute each, never over)"
    );
    println!(
        "2 descriptors per call over {} client addresses; {} callers in flight on {} HTTP/2 connections; \
         {:.1} s measured after {:.1} s warm-up, {} round(s) (round 2 in reverse order); gateway threads = {}, caller threads = {}; \
         load average at start {}",
        s.addresses,
        s.callers,
        s.conns,
        s.duration.as_secs_f64(),
        s.warmup.as_secs_f64(),
        s.rounds,
        s.threads,
        s.client_threads,
        s.loadavg,
    );
    println!();
    println!(
        "{:<26} {:>17} {:>9} {:>7} {:>10} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>5} {:>6} {:>9}",
        "store",
        "decisions/s r1/r2",
        "mean",
        "gw CPU",
        "dec/CPU-s",
        "p50 µs",
        "p99 µs",
        "Redis RT",
        "Redis",
        "gw store",
        "decisions",
        "over",
        "errors",
        "store err"
    );
    let units = format!(
        "{:<26} {:>17} {:>9} {:>7} {:>10} {:>7} {:>7} {:>9} {:>9} {:>9}",
        "", "", "", "", "", "", "", "/dec", "cmd/dec", "calls/dec"
    );
    println!("{}", units.trim_end());
    for row in rows {
        let label = row.store.label();
        if let Some(why) = &row.failed {
            println!("{label:<26} {why}");
            continue;
        }
        let d = row.decisions().max(1) as f64;
        let mut lat: Vec<u32> = row
            .rounds
            .iter()
            .flat_map(|m| m.load.latencies_us.iter().copied())
            .collect();
        lat.sort_unstable();
        let per_round: Vec<String> = row
            .rounds
            .iter()
            .map(|m| format!("{:.0}", m.per_second()))
            .collect();
        let wall: f64 = row.sum(|m| m.load.elapsed.as_secs_f64());
        let cpu: f64 = row.sum(|m| m.gw_cpu.as_secs_f64());
        let (rt, cmds, calls) = match (row.trips(), row.store) {
            (Some(rt), Store::Redis(_)) => (
                format!("{rt:.4}"),
                format!(
                    "{:.3}",
                    row.sum(|m| m.redis.map_or(0.0, |r| r.1 as f64)) / d
                ),
                format!("{:.4}", row.sum(|m| m.gw.store_calls) / d),
            ),
            _ => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "{label:<26} {:>17} {:>9.0} {:>6.0}% {:>10.0} {:>7} {:>7} {rt:>9} {cmds:>9} {calls:>9} {:>9} {:>5.0} {:>6.0} {:>9.0}",
            per_round.join(" / "),
            row.per_second(),
            100.0 * cpu / wall.max(1e-9),
            row.per_cpu_second(),
            percentile(&lat, 0.50),
            percentile(&lat, 0.99),
            row.decisions(),
            row.sum(|m| m.load.over as f64),
            row.sum(|m| m.load.errors as f64),
            row.sum(|m| m.gw.store_errors),
        );
    }
    let get = |st: Store| {
        rows.iter()
            .find(|r| r.store == st && r.failed.is_none() && !r.rounds.is_empty())
    };
    let (auto, exact, memory) = (
        get(Store::Redis("auto")),
        get(Store::Redis("exact")),
        get(Store::Memory),
    );
    println!();
    if let (Some(a), Some(x)) = (auto, exact) {
        println!(
            "auto / exact: {:.2}x decisions/s, {:.2}x decisions per gateway CPU-second; Redis round trips per decision {:.4} vs {:.4}",
            a.per_second() / x.per_second(),
            a.per_cpu_second() / x.per_cpu_second(),
            a.trips().unwrap_or(0.0),
            x.trips().unwrap_or(0.0),
        );
    }
    if let Some(m) = memory {
        for (name, r) in [("auto", auto), ("exact", exact)] {
            if let Some(r) = r {
                println!(
                    "{name} / memory: {:.2}x decisions/s, {:.2}x decisions per gateway CPU-second",
                    r.per_second() / m.per_second(),
                    r.per_cpu_second() / m.per_cpu_second()
                );
            }
        }
    }
    if let Some(a) = auto {
        println!(
            "auto: {:.3} of the 2 descriptors per call admitted from a lease (throttle_local_decisions_total{{reason=\"lease\"}})",
            a.sum(|m| m.gw.leased) / a.decisions().max(1) as f64
        );
    }
    println!(
        "decision = one ShouldRateLimit call (2 descriptors). gw CPU: the gateway's user+system CPU time over the measured \
         phase / its wall time (100% = one core). Redis RT/dec: calls of client-sent commands (EVALSHA/EVAL/FCALL[_RO], \
         PING, HELLO, SELECT, AUTH, X|Y container commands) in INFO commandstats; Redis cmd/dec: total_commands_processed \
         (with the commands the scripts run); both as changes over the measured phase minus the benchmark's own INFO \
         calls, heartbeats included; gw store calls/dec: the gateway's throttle_store_calls_total{{store=\"redis\"}}. \
         Latency percentiles and per-decision figures pooled over the rounds."
    );
}

fn main() {
    let s = Settings::from_env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(s.client_threads)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(s));
}

async fn run(s: Settings) {
    let dir = tempfile::tempdir().unwrap();
    let yaml_path = dir.path().join("rlsbench.yaml");
    std::fs::write(&yaml_path, yaml()).unwrap();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let b = Bench {
        reqs: Arc::new(requests(s.addresses)),
        s,
        dir: dir.path().to_path_buf(),
        yaml: yaml_path,
        http,
        ticks_per_sec: clock_ticks(),
    };
    let s = &b.s;
    let mut redis = match redis_conn(&s.redis_url).await {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!(
                "rls: no Redis at {}: {e}; the Redis rows are skipped",
                s.redis_url
            );
            None
        }
    };
    let order = [Store::Redis("auto"), Store::Redis("exact"), Store::Memory];
    let mut rows: Vec<Row> = order
        .iter()
        .map(|&store| Row {
            store,
            rounds: Vec::new(),
            failed: (matches!(store, Store::Redis(_)) && redis.is_none())
                .then(|| format!("skipped (no Redis answers at {})", s.redis_url)),
        })
        .collect();
    for round in 1..=s.rounds {
        let mut idx: Vec<usize> = (0..order.len()).collect();
        if round % 2 == 0 {
            idx.reverse();
        }
        for i in idx {
            let store = rows[i].store;
            if rows[i].failed.is_some() {
                continue;
            }
            // A fresh key prefix per configuration and round; its keys are deleted afterwards.
            let prefix = format!("rlsbench-{}-{}-r{round}", std::process::id(), store.tag());
            eprintln!("rls: round {round}: {} ...", store.label());
            let result = match (store, redis.as_mut()) {
                (Store::Redis(_), Some(c)) => {
                    let r = measure(&b, store, &prefix, Some(&mut *c)).await;
                    delete_keys(c, &prefix).await;
                    r
                }
                _ => measure(&b, store, &prefix, None).await,
            };
            match result {
                Ok(m) => rows[i].rounds.push(m),
                Err(e) => {
                    eprintln!("rls: {}: {e}", store.label());
                    rows[i].failed = Some("failed (see above)".into());
                }
            }
        }
    }
    print_table(s, &rows);
}
