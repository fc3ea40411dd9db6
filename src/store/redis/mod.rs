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

pub mod wire;

use self::wire::{Mode, Reply};
use super::{LimitStore, StoreError};
use crate::clock::Clock;
use crate::config::Store as StoreConfig;
use crate::limiter::{Check, Ident, Scope, ScopeCheck, Verdict, Window};

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
        wire::key(&self.prefix, scope, ident, window)
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
        let mode = if peek { Mode::Peek } else { Mode::Check };
        wire::push_header(&mut inv, now, cost, mode);
        for s in scopes {
            wire::push_scope(&mut inv, &self.prefix, s, None);
        }
        let raw = tokio::time::timeout(self.timeout, eval(conn, &inv))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout.as_millis() as u64))?
            .map_err(unavailable)?;
        wire::parse_reply(&raw, scopes)
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
                let mut args = vec![
                    now.to_string(),
                    cost.to_string(),
                    Mode::Refund.as_str().to_string(),
                ];
                for (i, w) in s.limits.windows.iter().enumerate() {
                    let current = currents.get(i).copied().unwrap_or(0);
                    args.extend(wire::window_args(w, &s.ident, current).map(|v| v.to_string()));
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

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}
