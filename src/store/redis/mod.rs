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
//!
//! TLS: `rediss://` URLs (single node, Cluster seeds, Sentinels) connect over rustls,
//! verified against the system trust store, or only the file named by `SSL_CERT_FILE`
//! when it is set. Behind Sentinel, the master found is reached over TLS when the
//! sentinels are (`rediss://` sentinel URLs).
//!
//! Settles (`LimitStore::settle`) are 'settle' calls spawned in the background, like
//! Cluster refunds: one per request on a single node or Sentinel, one per scope on
//! Cluster.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{RedisResult, Script, ScriptInvocation};

pub mod bans;
pub mod concurrency;
pub mod local;
pub mod wire;

use self::concurrency::RemoteSlots;
use self::local::{Local, Outcome, Plan, Return, WindowPlan};
use self::wire::{LeaseArgs, Mode, Reply};
use super::{LimitStore, StoreError};
use crate::clock::{Clock, SystemClock};
use crate::config::Store as StoreConfig;
use crate::limiter::{Check, DecidedAt, Ident, Scope, ScopeCheck, Verdict, Window};
use crate::metrics::Metrics;

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
    /// Leases and the over-limit cache (see `local`); None: every request goes to Redis.
    local: Option<Arc<Local>>,
    lease_ms: u64,
    metrics: Option<Arc<Metrics>>,
    /// Concurrency slots this gateway holds (see `concurrency`).
    slots: RemoteSlots,
    /// Behind Sentinel: the master address the sentinels named last (`follow_master`).
    master_seen: std::sync::Mutex<Option<String>>,
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
            local: None,
            lease_ms: 0,
            metrics: None,
            slots: RemoteSlots::new(concurrency::DEFAULT_LEASE_MS),
            master_seen: std::sync::Mutex::new(None),
        }
    }

    /// Behind Sentinel: asks the sentinels which node is the master now (within the store
    /// deadline) and, when it changed since the last ask, drops the connection so the next
    /// call connects to the new master. A promoted replica is followed this way even while
    /// the old master still accepts writes (a manual `SENTINEL FAILOVER` demotes it only
    /// later), which no call error would reveal. Called every second by the heartbeat;
    /// does nothing for a single node or Cluster.
    pub async fn follow_master(&self) {
        let Target::Sentinel(urls, master) = &self.target else {
            return;
        };
        let ask = async {
            let mut sentinel = redis::sentinel::Sentinel::build(urls.clone())?;
            let info = master_tls(urls);
            let client = sentinel.async_master_for(master, info.as_ref()).await?;
            Ok::<_, redis::RedisError>(client.get_connection_info().addr().to_string())
        };
        let addr = match tokio::time::timeout(self.timeout.max(Duration::from_millis(500)), ask)
            .await
        {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => return tracing::debug!(error = %e, "sentinels not asked for the master"),
            Err(_) => return tracing::debug!("sentinels did not name the master in time"),
        };
        let changed = match self.master_seen.lock() {
            Ok(mut seen) => {
                let changed = seen.as_ref().is_some_and(|s| *s != addr);
                *seen = Some(addr.clone());
                changed
            }
            Err(_) => false,
        };
        if changed {
            tracing::info!(master = %addr, "sentinels name a new master; reconnecting");
            self.conn.store(None);
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
        Ok(Self::new(target, c.timeout, &c.key_prefix)
            .with_local_admission(c.lease.as_millis() as u64)
            .with_concurrency_lease(c.concurrency_lease.as_millis() as u64))
    }

    /// How long a concurrency slot's entry lives without renewal (`[store]
    /// concurrency_lease_secs`).
    pub fn with_concurrency_lease(mut self, lease_ms: u64) -> Self {
        self.slots = RemoteSlots::new(lease_ms);
        self
    }

    /// Decides locally when it can: the over-limit cache, and leases of at most
    /// `lease_ms` (0: no leases) for `admission = "auto"` windows.
    pub fn with_local_admission(mut self, lease_ms: u64) -> Self {
        self.local = Some(Arc::new(Local::new(lease_ms)));
        self.lease_ms = lease_ms;
        self
    }

    /// Counts round trips, local decisions and returned tokens.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
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
            // The store's own deadline bounds every call (`timeout_ms`); the client's
            // response timeout (redis-rs defaults to 500 ms) is set past it, so that a
            // call that missed the deadline still gets its reply (`undo_late`).
            Target::Single(url) => Conn::Single(
                ConnectionManager::new_with_config(
                    redis::Client::open(url.as_str())?,
                    redis::aio::ConnectionManagerConfig::new()
                        .set_response_timeout(Some(LATE_PATIENCE)),
                )
                .await?,
            ),
            Target::Cluster(nodes) => Conn::Cluster(
                ClusterClient::builder(nodes.clone())
                    .response_timeout(LATE_PATIENCE)
                    .build()?
                    .get_async_connection()
                    .await?,
            ),
            Target::Sentinel(urls, master) => {
                let mut client = SentinelClient::build(
                    urls.clone(),
                    master.clone(),
                    master_tls(urls),
                    SentinelServerType::Master,
                )?;
                let config =
                    redis::AsyncConnectionConfig::new().set_response_timeout(Some(LATE_PATIENCE));
                Conn::Sentinel(client.get_async_connection_with_config(&config).await?)
            }
        })
    }

    fn now_arg(&self) -> String {
        self.clock
            .as_ref()
            .map(|c| c.now_ms().to_string())
            .unwrap_or_default()
    }

    /// The gateway's clock (leases and cached rejections are kept on it).
    fn local_now(&self) -> u64 {
        match &self.clock {
            Some(c) => c.now_ms(),
            None => SystemClock.now_ms(),
        }
    }

    fn count_call(&self) {
        if let Some(m) = &self.metrics {
            m.store_calls.inc();
        }
    }

    /// One script call for `scopes` within the deadline.
    ///
    /// A call that misses its deadline may still run in Redis: the request is decided
    /// without it (each scope's `on_failure`), so a charge it makes there is undone when
    /// its reply comes in late (`undo_late`).
    async fn call(
        &self,
        conn: &mut Conn,
        scopes: &[ScopeCheck<'_>],
        leases: Option<&[smallvec::SmallVec<[LeaseArgs; 2]>]>,
        cost: u32,
        peek: bool,
        now: &str,
    ) -> Result<Reply, StoreError> {
        let mode = if peek { Mode::Peek } else { Mode::Check };
        let cmd = wire::command(
            self.script.get_hash(),
            now,
            cost,
            mode,
            self.lease_ms,
            &self.prefix,
            scopes,
            leases,
        );
        self.count_call();
        let mut c = conn.clone();
        let mut run = Box::pin(async move { run_script(&mut c, &cmd).await });
        let raw = match tokio::time::timeout(self.timeout, &mut run).await {
            Ok(r) => r.map_err(unavailable)?,
            Err(_) => {
                if !peek {
                    self.undo_late(run, scopes, cost, conn.clone());
                }
                return Err(StoreError::Timeout(self.timeout.as_millis() as u64));
            }
        };
        wire::parse_reply(&wire::ints(&raw)?, scopes)
    }

    /// Waits (in the background, up to `LATE_PATIENCE`) for the reply of a call that
    /// missed its deadline. If it charged, the request was decided without it: the charge
    /// of every scope not failing open is refunded (an open scope admitted the request
    /// uncounted, so its late charge is the true count), and tokens it leased go back.
    fn undo_late(
        &self,
        run: std::pin::Pin<Box<dyn std::future::Future<Output = RedisResult<Vec<u8>>> + Send>>,
        scopes: &[ScopeCheck<'_>],
        cost: u32,
        conn: Conn,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let owned: Vec<(Scope, Ident, crate::limiter::ScopeLimits)> = scopes
            .iter()
            .map(|s| (s.scope, s.ident.clone(), s.limits.clone()))
            .collect();
        let (prefix, script, timeout) = (self.prefix.clone(), self.script.clone(), self.timeout);
        let local = self.local.clone();
        let metrics = self.metrics.clone();
        runtime.spawn(async move {
            let Ok(Ok(raw)) = tokio::time::timeout(LATE_PATIENCE, run).await else {
                return; // no reply at all: the charge (if any) expires with its window
            };
            let scopes: Vec<ScopeCheck<'_>> = owned
                .iter()
                .map(|(scope, ident, limits)| ScopeCheck {
                    scope: *scope,
                    ident: ident.clone(),
                    limits,
                })
                .collect();
            let Ok(reply) = wire::ints(&raw).and_then(|v| wire::parse_reply(&v, &scopes)) else {
                return;
            };
            if !reply.all_allowed {
                return; // nothing was charged
            }
            let mut at = 0;
            let mut charged = Vec::new();
            let mut returns = Vec::new();
            for s in &scopes {
                let n = s.limits.windows.len();
                let decisions = reply.decisions.get(at..at + n).unwrap_or_default();
                let grants = reply.grants.get(at..at + n).unwrap_or_default();
                at += n;
                for (w, g) in s.limits.windows.iter().zip(grants) {
                    if g.granted > 0 {
                        returns.push(local::Return {
                            scope: s.scope,
                            ident: s.ident.clone(),
                            limit: *w,
                            lease: LeaseArgs {
                                want: 0,
                                ret: g.granted,
                                from: *g,
                            },
                        });
                    }
                }
                if s.limits.on_failure != crate::limiter::OnFailure::Open {
                    let currents = decisions.iter().map(|d| d.decision.current).collect();
                    charged.push((s.clone(), reply.now, currents));
                }
            }
            tracing::debug!("a call that missed its deadline charged in Redis: undoing it");
            if let Some(m) = &metrics {
                m.store_late_charges_total.inc();
            }
            if let Some(local) = local.filter(|_| !returns.is_empty()) {
                local.queue_returns(returns);
            }
            let calls = refund_calls(script.get_hash(), &prefix, cost, &charged);
            run_refunds(conn, timeout, calls).await;
        });
    }

    async fn check_inner(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        let mut conn = tokio::time::timeout(self.timeout, self.conn())
            .await
            .map_err(|_| StoreError::Timeout(self.timeout.as_millis() as u64))??;
        let now = self.now_arg();
        let local_now = self.local_now();
        let plan = match &self.local {
            Some(l) => l.prepare(check, local_now),
            None => Plan::default(),
        };
        let remote = Remote::of(check, &plan);
        self.count_returned(remote.leases.iter().flatten());
        let scopes = remote.scopes();
        let record = |scopes: &[ScopeCheck<'_>], r: &Reply| {
            if let Some(l) = &self.local {
                l.record(
                    scopes,
                    check.cost,
                    &r.decisions,
                    &r.grants,
                    local_now,
                    r.now,
                );
            }
        };
        let mut decisions: Vec<_> = remote.covered.clone();
        // When each scope was charged: the grant times of the leases that paid covered
        // windows, then the script's `now` of the call that decided the rest.
        let mut decided_at = remote.granted_at;
        if scopes.is_empty() {
            // Every window was paid from leases (the lease check raced a refill).
        } else if !matches!(conn, Conn::Cluster(_)) || scopes.len() == 1 {
            let called = self
                .call(
                    &mut conn,
                    &scopes,
                    Some(&remote.leases),
                    check.cost,
                    check.peek,
                    &now,
                )
                .await;
            let reply = match called {
                Ok(r) => r,
                Err(e) => {
                    // The leased tokens this request spent on covered windows go back.
                    if let (Some(l), false) = (&self.local, remote.covered.is_empty()) {
                        l.undo(check, &plan, check.cost);
                    }
                    return Err(e);
                }
            };
            record(&scopes, &reply);
            for s in &scopes {
                decided_at.add(s.scope, reply.now);
            }
            decisions.extend(reply.decisions);
        } else {
            // Cluster: one call per scope (one slot each), concurrently.
            let calls = scopes.iter().enumerate().map(|(i, s)| {
                let mut c = conn.clone();
                let now = now.clone();
                let l = remote.leases.get(i).cloned().map(|l| [l]);
                async move {
                    self.call(
                        &mut c,
                        std::slice::from_ref(s),
                        l.as_ref().map(|l| &l[..]),
                        check.cost,
                        check.peek,
                        &now,
                    )
                    .await
                }
            });
            let replies = futures_util::future::join_all(calls).await;
            let mut charged = Vec::new();
            let mut failed = None;
            for (s, r) in scopes.iter().zip(replies) {
                // Every reply is looked at, even after a failed one: a scope charged by
                // its call must be refunded when another call failed.
                let r = match r {
                    Ok(r) => r,
                    Err(e) => {
                        failed.get_or_insert(e);
                        continue;
                    }
                };
                record(std::slice::from_ref(s), &r);
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
                decided_at.add(s.scope, r.now);
                decisions.extend(r.decisions);
            }
            let allowed = failed.is_none() && decisions.iter().all(|d| d.decision.allowed);
            if !allowed && !charged.is_empty() {
                self.refund(conn, check.cost, charged);
            }
            if let Some(e) = failed {
                if !remote.covered.is_empty() {
                    if let Some(l) = &self.local {
                        l.undo(check, &plan, check.cost);
                    }
                }
                return Err(e);
            }
        }
        let verdict = Verdict {
            decided_at,
            ..Verdict::from_decisions(decisions)
        };
        if !verdict.allowed && !remote.covered.is_empty() {
            if let Some(l) = &self.local {
                l.undo(check, &plan, check.cost);
            }
        }
        Ok(verdict)
    }

    fn count_returned<'a>(&self, leases: impl Iterator<Item = &'a LeaseArgs>) {
        let n: u64 = leases.map(|l| l.ret).sum();
        if let (Some(m), true) = (&self.metrics, n > 0) {
            m.lease_tokens_returned_total.inc_by(n);
        }
    }

    /// Decides `check` on leases or the over-limit cache, when it can.
    fn local_decision(&self, check: &Check<'_>) -> Option<Verdict> {
        let local = self.local.as_ref()?;
        let (verdict, reason) = match local.decide(check, self.local_now()) {
            Outcome::Leased(v) => (v, 0),
            Outcome::OverLimit(v) => (v, 1),
            Outcome::Remote => return None,
        };
        if let Some(m) = &self.metrics {
            m.local_decisions[reason].inc();
        }
        Some(verdict)
    }

    /// Gives back the unused tokens of leases that ended, and forgets idle identities.
    pub async fn return_expired(&self) {
        if let Some(local) = &self.local {
            let returns = local.expired(self.local_now());
            if let Some(m) = &self.metrics {
                m.lease_table_evictions_total.inc_by(local.take_evictions());
            }
            self.give_back(returns).await;
        }
    }

    /// Gives back every lease (graceful shutdown).
    pub async fn return_all(&self) {
        if let Some(local) = &self.local {
            let returns = local.drain();
            self.give_back(returns).await;
        }
    }

    /// 'return' calls for `returns`: one on a single node, one per identity on Cluster.
    async fn give_back(&self, returns: Vec<Return>) {
        if returns.is_empty() {
            return;
        }
        let Ok(Ok(mut conn)) = tokio::time::timeout(self.timeout, self.conn()).await else {
            return; // Redis is away: the tokens stay charged and expire with their window
        };
        let groups: Vec<&[Return]> = if matches!(conn, Conn::Cluster(_)) {
            returns
                .chunk_by(|a, b| a.scope == b.scope && a.ident == b.ident)
                .collect()
        } else {
            returns.chunks(256).collect()
        };
        let now = self.now_arg();
        for group in groups {
            let windows = group.iter().map(|r| wire::Win {
                scope: r.scope,
                ident: &r.ident,
                limit: &r.limit,
                current: 0,
                lease: r.lease,
            });
            let header = (now.as_str(), 1, Mode::Return);
            let cmd = wire::evalsha(self.script.get_hash(), &self.prefix, header, 0, windows);
            self.count_call();
            match tokio::time::timeout(self.timeout, run_script(&mut conn, &cmd)).await {
                Ok(Ok(_)) => self.count_returned(group.iter().map(|r| &r.lease)),
                _ => tracing::debug!("giving leased tokens back did not complete"),
            }
        }
    }

    /// Spawns the 'settle' calls of `check` (see `LimitStore::settle`): one on a single
    /// node or behind Sentinel, one per scope (one slot each) on Cluster, each within
    /// the deadline and counted as a store call. Built here, synchronously, so the task
    /// owns everything it sends. Skipped without a connection (none was made, or it was
    /// dropped after an error) or outside a Tokio runtime: the settle is lost, as a
    /// failed call's would be.
    fn spawn_settle(&self, check: &Check<'_>, delta: i64, decided_at: DecidedAt) {
        let Some(conn) = self.conn.load_full() else {
            tracing::debug!("settle skipped: no connection to Redis");
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let now = self.now_arg();
        let settle = |scopes: &[ScopeCheck<'_>]| {
            wire::settle_command(
                self.script.get_hash(),
                &now,
                check.cost,
                delta,
                decided_at,
                &self.prefix,
                scopes,
            )
        };
        let cmds: Vec<redis::Cmd> = if matches!(*conn, Conn::Cluster(_)) {
            check
                .scopes
                .iter()
                .map(|s| settle(std::slice::from_ref(s)))
                .collect()
        } else {
            vec![settle(&check.scopes)]
        };
        for _ in &cmds {
            self.count_call();
        }
        let timeout = self.timeout;
        let mut conn = (*conn).clone();
        runtime.spawn(async move {
            for cmd in cmds {
                let result = tokio::time::timeout(timeout, run_script(&mut conn, &cmd)).await;
                if !matches!(result, Ok(Ok(_))) {
                    tracing::debug!("settling a request's cost did not complete");
                }
            }
        });
    }

    /// Gives back the charges of scopes whose request another scope rejected. Runs in the
    /// background, each call within the deadline: the 429 does not wait for it.
    fn refund(&self, conn: Conn, cost: u32, charged: Vec<(ScopeCheck<'_>, u64, Vec<u64>)>) {
        let calls = refund_calls(self.script.get_hash(), &self.prefix, cost, &charged);
        tokio::spawn(run_refunds(conn, self.timeout, calls));
    }
}

/// How long a call that missed its deadline is waited for (see `RedisStore::undo_late`).
const LATE_PATIENCE: Duration = Duration::from_secs(10);

/// The 'refund' calls giving back `cost` on each of `charged`'s scopes: the scope, the
/// script's `now` of the charge, and each window's `current` then.
fn refund_calls(
    sha: &str,
    prefix: &str,
    cost: u32,
    charged: &[(ScopeCheck<'_>, u64, Vec<u64>)],
) -> Vec<redis::Cmd> {
    charged
        .iter()
        .map(|(s, now, currents)| wire::refund_command(sha, prefix, cost, s, *now, currents))
        .collect()
}

/// Runs `calls` one after another, each within `timeout`.
async fn run_refunds(mut conn: Conn, timeout: Duration, calls: Vec<redis::Cmd>) {
    for cmd in calls {
        let result = tokio::time::timeout(timeout, run_script(&mut conn, &cmd)).await;
        if !matches!(result, Ok(Ok(_))) {
            tracing::debug!("refund of a request's charge did not complete");
        }
    }
}

/// Runs an `EVALSHA` of the script, loading it first when Redis does not have it
/// (`NOSCRIPT`: a restart, a failover, `SCRIPT FLUSH`).
async fn run_script(conn: &mut Conn, cmd: &redis::Cmd) -> RedisResult<Vec<u8>> {
    match query(conn, cmd).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(CHECK_LUA);
            let _: String = match conn {
                Conn::Single(c) => load.query_async(c).await?,
                Conn::Cluster(c) => load.query_async(c).await?,
                Conn::Sentinel(c) => load.query_async(c).await?,
            };
            query(conn, cmd).await
        }
        other => other,
    }
}

async fn eval(conn: &mut Conn, inv: &ScriptInvocation<'_>) -> RedisResult<Vec<u8>> {
    match conn {
        Conn::Single(c) => inv.invoke_async(c).await,
        Conn::Cluster(c) => inv.invoke_async(c).await,
        Conn::Sentinel(c) => inv.invoke_async(c).await,
    }
}

async fn query(conn: &mut Conn, cmd: &redis::Cmd) -> RedisResult<Vec<u8>> {
    match conn {
        Conn::Single(c) => cmd.query_async(c).await,
        Conn::Cluster(c) => cmd.query_async(c).await,
        Conn::Sentinel(c) => cmd.query_async(c).await,
    }
}

#[async_trait]
impl LimitStore for RedisStore {
    async fn check(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        if check.is_empty() {
            return Ok(Verdict::UNLIMITED);
        }
        // Local decisions come first through `decide_locally` (TieredStore asks before its
        // breaker); asking again here would count the request twice in its rate.
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

    async fn acquire(
        &self,
        slots: &[super::slots::SlotRequest],
    ) -> Result<super::slots::Acquired, StoreError> {
        if slots.is_empty() {
            return Ok(Ok(super::slots::SlotLease::default()));
        }
        let result = self.acquire_slots(slots).await;
        self.healthy.store(result.is_ok(), Ordering::Relaxed);
        if result.is_err() && !matches!(self.target, Target::Single(_)) {
            self.conn.store(None);
        }
        result
    }

    fn settle(&self, check: &Check<'_>, delta: i64, decided_at: DecidedAt) {
        if delta == 0 || check.is_empty() || check.peek {
            return;
        }
        self.spawn_settle(check, delta, decided_at);
    }

    fn finish(&self, held: super::Held, _ending: super::Ending) {
        if held.slots.origin == super::slots::Origin::Remote {
            self.release_slots(&held.slots);
        }
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn healthy(&self) -> bool {
        self.is_healthy()
    }

    fn decide_locally(&self, check: &Check<'_>) -> Option<Verdict> {
        if check.is_empty() {
            return None;
        }
        self.local_decision(check)
    }
}

/// The part of a check Redis decides: the windows not paid from leases.
struct Remote<'a> {
    /// Scopes with at least one remote window: the scope, and its limits reduced to the
    /// remote windows when some were covered.
    parts: Vec<(ScopeCheck<'a>, Option<crate::limiter::ScopeLimits>)>,
    /// Lease arguments of each part's windows.
    leases: Vec<smallvec::SmallVec<[LeaseArgs; 2]>>,
    /// Decisions of the covered windows.
    covered: Vec<crate::limiter::WindowDecision>,
    /// When the leases paying the covered windows were granted, per scope.
    granted_at: DecidedAt,
}

impl<'a> Remote<'a> {
    fn of(check: &Check<'a>, plan: &Plan) -> Self {
        let mut out = Remote {
            parts: Vec::with_capacity(check.scopes.len()),
            leases: Vec::with_capacity(check.scopes.len()),
            covered: Vec::new(),
            granted_at: DecidedAt::default(),
        };
        for (i, s) in check.scopes.iter().enumerate() {
            let Some(plans) = plan.scopes.get(i) else {
                out.parts.push((s.clone(), None));
                out.leases.push(smallvec::SmallVec::new());
                continue;
            };
            let mut windows = Vec::new();
            let mut args = smallvec::SmallVec::new();
            for (w, p) in s.limits.windows.iter().zip(plans) {
                match p {
                    WindowPlan::Covered {
                        decision,
                        granted_at,
                        ..
                    } => {
                        out.covered.push(*decision);
                        out.granted_at.add(s.scope, *granted_at);
                    }
                    WindowPlan::Remote(a) => {
                        windows.push(*w);
                        args.push(*a);
                    }
                }
            }
            if windows.is_empty() {
                continue;
            }
            let reduced =
                (windows.len() < s.limits.windows.len()).then(|| crate::limiter::ScopeLimits {
                    windows,
                    ..s.limits.clone()
                });
            out.parts.push((s.clone(), reduced));
            out.leases.push(args);
        }
        out
    }

    /// The scopes to send, each with its remote windows.
    fn scopes(&self) -> Vec<ScopeCheck<'_>> {
        self.parts
            .iter()
            .map(|(s, reduced)| ScopeCheck {
                scope: s.scope,
                ident: s.ident.clone(),
                limits: reduced.as_ref().unwrap_or(s.limits),
            })
            .collect()
    }
}

/// TLS to the master when the sentinels are reached over TLS (`rediss://`): one
/// deployment, one transport.
fn master_tls(urls: &[String]) -> Option<SentinelNodeConnectionInfo> {
    urls.iter()
        .any(|u| u.starts_with("rediss://"))
        .then(|| SentinelNodeConnectionInfo::default().set_tls_mode(redis::TlsMode::Secure))
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}
