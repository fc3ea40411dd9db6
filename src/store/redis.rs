//! The Redis store: every gateway of a fleet shares one set of limits.
//!
//! All limiter math runs inside Redis as one Lua script (lua/, assembled below), so every
//! read-compute-write is atomic: no counter leaks under concurrency (APISIX #12592) and
//! replicas never multiply a limit (Traefik #6042). The script decides every window of
//! every scope and charges none unless all allow (Envoy ratelimit #185 charges them all).
//!
//! Round trips: on a single node or behind Sentinel, the whole layered check is **one**
//! `EVALSHA`. On Redis Cluster a request's scopes live in different slots (each scope's
//! keys share a hash tag, `thr:{ip:203.0.113.7}:1m`), so each scope is one script call, the
//! calls run concurrently, and when one scope rejects, the scopes that were charged are
//! refunded (in the background: the 429 does not wait for it).
//!
//! Time: the script reads `redis.call('TIME')`, so gateway clock skew cannot matter. Only
//! `with_clock` (tests) passes a time. Every call carries the `timeout_ms` deadline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{RedisResult, Script, ScriptInvocation};

use super::{LimitStore, StoreError};
use crate::clock::Clock;
use crate::config::Store as StoreConfig;
use crate::limiter::{
    Algorithm, Check, Decision, Ident, Scope, ScopeCheck, Verdict, Window, WindowDecision,
};

macro_rules! lua {
    ($f:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $f))
    };
}

/// The one script: prelude, the five algorithms, then the entry point.
pub const CHECK_LUA: &str = concat!(
    lua!("prelude.lua"),
    lua!("token_bucket.lua"),
    lua!("sliding_window.lua"),
    lua!("fixed_window.lua"),
    lua!("sliding_log.lua"),
    lua!("leaky_bucket.lua"),
    lua!("check.lua"),
);

/// Where the store connects.
#[derive(Debug, Clone)]
pub enum Target {
    /// One node (`url`).
    Single(String),
    /// Redis Cluster seed nodes (`cluster`).
    Cluster(Vec<String>),
    /// Sentinel URLs and the master name (`sentinel`).
    Sentinel(Vec<String>, String),
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(MultiplexedConnection),
}

/// The Redis limit store.
pub struct RedisStore {
    target: Target,
    conn: ArcSwapOption<Conn>,
    connecting: tokio::sync::Mutex<()>,
    script: Script,
    timeout: Duration,
    prefix: Arc<str>,
    clock: Option<Arc<dyn Clock>>,
    healthy: AtomicBool,
}

// === impl RedisStore ===

impl RedisStore {
    /// A store for `target`; connects lazily on the first call (inside the runtime that
    /// makes it, as Pingora services each have their own).
    pub fn new(target: Target, timeout: Duration, prefix: &str) -> Self {
        Self {
            target,
            conn: ArcSwapOption::empty(),
            connecting: tokio::sync::Mutex::new(()),
            script: Script::new(CHECK_LUA),
            timeout,
            prefix: Arc::from(prefix),
            clock: None,
            healthy: AtomicBool::new(true),
        }
    }

    /// The store `[store]` describes.
    ///
    /// # Errors
    /// When no Redis address is configured.
    pub fn from_config(c: &StoreConfig) -> Result<Self, StoreError> {
        let target = if !c.cluster.is_empty() {
            Target::Cluster(c.cluster.clone())
        } else if let Some((urls, master)) = &c.sentinel {
            Target::Sentinel(urls.clone(), master.clone())
        } else if let Some(url) = &c.url {
            Target::Single(url.clone())
        } else {
            return Err(StoreError::Unavailable(
                "no redis url, cluster or sentinel configured".into(),
            ));
        };
        Ok(Self::new(target, c.timeout, &c.key_prefix))
    }

    /// Sends `clock`'s time with every call instead of using Redis `TIME`. For tests
    /// (the differential test feeds Rust and Lua the same times); never in production.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The Redis key of one window of one identity: `<prefix>:{<scope>:<id>}:<window>`.
    pub fn key(&self, scope: Scope, ident: &Ident, window: Window) -> String {
        let (p, w) = (&self.prefix, window.label());
        match ident {
            Ident::Global => format!("{p}:{{global}}:{w}"),
            Ident::Ip(ip) => format!("{p}:{{{}:{ip}}}:{w}", scope.as_str()),
            Ident::Name(n) => format!("{p}:{{{}:{n}}}:{w}", scope.as_str()),
        }
    }

    /// Records this instance as alive for `ttl_ms` and returns how many instances are alive
    /// (a sorted set `<prefix>:{instances}` scored by last heartbeat).
    ///
    /// # Errors
    /// When Redis fails or misses the deadline.
    pub async fn heartbeat(
        &self,
        instance_id: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<u32, StoreError> {
        // The heartbeat doubles as a health probe: /readyz turns degraded when it fails,
        // before any request meets the outage.
        let r = self.beat(instance_id, now_ms, ttl_ms).await;
        self.healthy.store(r.is_ok(), Ordering::Relaxed);
        r
    }

    async fn beat(&self, instance_id: &str, now_ms: u64, ttl_ms: u64) -> Result<u32, StoreError> {
        let script = redis::Script::new(
            "redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
             redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]) - tonumber(ARGV[3]))
             redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
             return redis.call('ZCARD', KEYS[1])",
        );
        let key = format!("{}:{{instances}}", self.prefix);
        let mut conn = tokio::time::timeout(self.timeout, self.conn())
            .await
            .map_err(|_| StoreError::Timeout(self.timeout.as_millis() as u64))??;
        let mut inv = script.key(key);
        inv.arg(now_ms).arg(instance_id).arg(ttl_ms);
        let n: Vec<i64> = match tokio::time::timeout(self.timeout, async {
            let n: RedisResult<i64> = match &mut conn {
                Conn::Single(c) => inv.invoke_async(c).await,
                Conn::Cluster(c) => inv.invoke_async(c).await,
                Conn::Sentinel(c) => inv.invoke_async(c).await,
            };
            n.map(|v| vec![v])
        })
        .await
        {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(unavailable(e)),
            Err(_) => return Err(StoreError::Timeout(self.timeout.as_millis() as u64)),
        };
        Ok(n.first()
            .and_then(|v| u32::try_from(*v).ok())
            .unwrap_or(1)
            .max(1))
    }

    /// Whether the last call succeeded.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    async fn conn(&self) -> Result<Conn, StoreError> {
        if let Some(c) = self.conn.load_full() {
            return Ok((*c).clone());
        }
        let _guard = self.connecting.lock().await;
        if let Some(c) = self.conn.load_full() {
            return Ok((*c).clone());
        }
        let c = self.connect().await.map_err(unavailable)?;
        self.conn.store(Some(Arc::new(c.clone())));
        Ok(c)
    }

    async fn connect(&self) -> RedisResult<Conn> {
        Ok(match &self.target {
            Target::Single(url) => {
                Conn::Single(ConnectionManager::new(redis::Client::open(url.as_str())?).await?)
            }
            Target::Cluster(nodes) => Conn::Cluster(
                ClusterClient::new(nodes.clone())?
                    .get_async_connection()
                    .await?,
            ),
            Target::Sentinel(urls, master) => {
                let mut client = SentinelClient::build(
                    urls.clone(),
                    master.clone(),
                    None,
                    SentinelServerType::Master,
                )?;
                Conn::Sentinel(client.get_async_connection().await?)
            }
        })
    }

    fn now_arg(&self) -> String {
        self.clock
            .as_ref()
            .map(|c| c.now_ms().to_string())
            .unwrap_or_default()
    }

    /// Adds `scope`'s windows (keys + 7 args each) to `inv`.
    fn push_scope(
        &self,
        inv: &mut ScriptInvocation<'_>,
        s: &ScopeCheck<'_>,
        currents: Option<&[u64]>,
    ) {
        for (i, w) in s.limits.windows.iter().enumerate() {
            inv.key(self.key(s.scope, &s.ident, w.window));
            inv.arg(algorithm_code(w.algorithm))
                .arg(window_code(w.window))
                .arg(w.limit)
                .arg(w.capacity)
                .arg(w.window.period_ms())
                .arg(s.ident.offset_ms(w))
                .arg(currents.and_then(|c| c.get(i)).copied().unwrap_or(0));
        }
    }

    /// One script call for `scopes` within the deadline.
    async fn call(
        &self,
        conn: &mut Conn,
        scopes: &[ScopeCheck<'_>],
        cost: u32,
        peek: bool,
        now: &str,
    ) -> Result<Reply, StoreError> {
        let mut inv = self.script.prepare_invoke();
        inv.arg(now)
            .arg(cost)
            .arg(if peek { "peek" } else { "check" });
        for s in scopes {
            self.push_scope(&mut inv, s, None);
        }
        let raw = tokio::time::timeout(self.timeout, eval(conn, &inv))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout.as_millis() as u64))?
            .map_err(unavailable)?;
        Reply::parse(&raw, scopes)
    }

    async fn check_inner(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        let mut conn = tokio::time::timeout(self.timeout, self.conn())
            .await
            .map_err(|_| StoreError::Timeout(self.timeout.as_millis() as u64))??;
        let now = self.now_arg();
        if !matches!(conn, Conn::Cluster(_)) || check.scopes.len() == 1 {
            let reply = self
                .call(&mut conn, &check.scopes, check.cost, check.peek, &now)
                .await?;
            return Ok(Verdict::from_decisions(reply.decisions));
        }
        // Cluster: one call per scope (one slot each), concurrently.
        let calls = check.scopes.iter().map(|s| {
            let mut c = conn.clone();
            let now = now.clone();
            async move {
                self.call(
                    &mut c,
                    std::slice::from_ref(s),
                    check.cost,
                    check.peek,
                    &now,
                )
                .await
            }
        });
        let replies = futures_util::future::join_all(calls).await;
        let mut decisions = Vec::with_capacity(8);
        let mut charged = Vec::new();
        for (s, r) in check.scopes.iter().zip(replies) {
            let r = r?;
            if r.all_allowed && !check.peek {
                charged.push((
                    s.clone(),
                    r.now,
                    r.decisions
                        .iter()
                        .map(|d| d.decision.current)
                        .collect::<Vec<_>>(),
                ));
            }
            decisions.extend(r.decisions);
        }
        let verdict = Verdict::from_decisions(decisions);
        if !verdict.allowed && !charged.is_empty() {
            self.refund(conn, check.cost, charged);
        }
        Ok(verdict)
    }

    /// Gives back the charges of scopes whose request another scope rejected. Runs in the
    /// background, each call within the deadline: the 429 does not wait for it.
    fn refund(&self, conn: Conn, cost: u32, charged: Vec<(ScopeCheck<'_>, u64, Vec<u64>)>) {
        let calls: Vec<(Vec<String>, Vec<String>)> = charged
            .iter()
            .map(|(s, now, currents)| {
                let keys = s
                    .limits
                    .windows
                    .iter()
                    .map(|w| self.key(s.scope, &s.ident, w.window))
                    .collect();
                let mut args = vec![now.to_string(), cost.to_string(), "refund".to_string()];
                for (i, w) in s.limits.windows.iter().enumerate() {
                    args.extend([
                        algorithm_code(w.algorithm).to_string(),
                        window_code(w.window).to_string(),
                        w.limit.to_string(),
                        w.capacity.to_string(),
                        w.window.period_ms().to_string(),
                        s.ident.offset_ms(w).to_string(),
                        currents.get(i).copied().unwrap_or(0).to_string(),
                    ]);
                }
                (keys, args)
            })
            .collect();
        let timeout = self.timeout;
        let script = self.script.clone();
        tokio::spawn(async move {
            let mut conn = conn;
            for (keys, args) in calls {
                let mut inv = script.prepare_invoke();
                for k in &keys {
                    inv.key(k);
                }
                for a in &args {
                    inv.arg(a);
                }
                let result = tokio::time::timeout(timeout, eval(&mut conn, &inv)).await;
                if !matches!(result, Ok(Ok(_))) {
                    tracing::debug!("refund of a rejected request's charge did not complete");
                }
            }
        });
    }
}

async fn eval(conn: &mut Conn, inv: &ScriptInvocation<'_>) -> RedisResult<Vec<i64>> {
    match conn {
        Conn::Single(c) => inv.invoke_async(c).await,
        Conn::Cluster(c) => inv.invoke_async(c).await,
        Conn::Sentinel(c) => inv.invoke_async(c).await,
    }
}

#[async_trait]
impl LimitStore for RedisStore {
    async fn check(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        if check.is_empty() {
            return Ok(Verdict::UNLIMITED);
        }
        let result = self.check_inner(check).await;
        self.healthy.store(result.is_ok(), Ordering::Relaxed);
        if result.is_err() && !matches!(self.target, Target::Single(_)) {
            // Sentinel: re-ask the sentinels for the master. Cluster: reconnect from the seed
            // nodes and refetch the slot map (after a failover the old primary is gone).
            // The breaker in front of this store bounds how often that happens.
            self.conn.store(None);
        }
        result
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn healthy(&self) -> bool {
        self.is_healthy()
    }
}

/// A decoded script reply.
struct Reply {
    now: u64,
    all_allowed: bool,
    decisions: Vec<WindowDecision>,
}

impl Reply {
    fn parse(raw: &[i64], scopes: &[ScopeCheck<'_>]) -> Result<Reply, StoreError> {
        let windows: usize = scopes.iter().map(|s| s.limits.windows.len()).sum();
        if raw.len() != 2 + 5 * windows {
            return Err(StoreError::Unavailable(format!(
                "unexpected script reply of {} values for {windows} windows",
                raw.len()
            )));
        }
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        let mut decisions = Vec::with_capacity(windows);
        let mut at = 2;
        for s in scopes {
            for w in &s.limits.windows {
                let f = &raw[at..at + 5];
                decisions.push(WindowDecision {
                    scope: s.scope,
                    window: w.window,
                    decision: Decision {
                        allowed: f[0] == 1,
                        limit: w.limit,
                        remaining: u32::try_from(f[1]).unwrap_or(0),
                        current: u(f[2]),
                        reset_after_ms: u(f[3]),
                        retry_after_ms: u(f[4]),
                    },
                });
                at += 5;
            }
        }
        Ok(Reply {
            now: u(raw[0]),
            all_allowed: raw[1] == 1,
            decisions,
        })
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// The script's algorithm codes.
pub fn algorithm_code(a: Algorithm) -> u8 {
    match a {
        Algorithm::TokenBucket => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::FixedWindow => 3,
        Algorithm::SlidingLog => 4,
        Algorithm::LeakyBucket => 5,
    }
}

/// The script's window codes.
pub fn window_code(w: Window) -> u8 {
    match w {
        Window::Second => 1,
        Window::Minute => 2,
        Window::Hour => 3,
        Window::Day => 4,
        Window::Month => 5,
    }
}
