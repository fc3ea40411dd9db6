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
//! Cluster. A refund of a fixed window paid from a lease still in hand goes back to that
//! lease instead, at once (`Local::refund`), so the remaining it reports counts it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use redis::Script;

pub mod bans;
pub mod concurrency;
mod conn;
mod late;
pub mod local;
pub mod region_sync;
mod regions;
mod remote;
mod settle;
pub mod wire;

pub use self::conn::{Target, CHECK_LUA, REGIONS_LUA};

use self::concurrency::RemoteSlots;
use self::conn::{eval, run_script, unavailable, Conn, LATE_PATIENCE};
use self::local::{Local, Outcome, Plan, Return};
use self::remote::Remote;
use self::wire::{LeaseArgs, Mode, Reply};
use super::{LimitStore, StoreError};
use crate::clock::{Clock, SystemClock};
use crate::config::Store as StoreConfig;
use crate::limiter::{Check, DecidedAt, Ident, Scope, ScopeCheck, Verdict, Window};
use crate::metrics::Metrics;

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
    /// This gateway's place among `[regions]` (None: regions windows are decided as
    /// local ones); see `regions`.
    region: Option<wire::RegionArgs>,
    /// The regions windows this gateway decided or leased on, for the sync loop.
    live: Option<Arc<crate::regions::Live>>,
    /// A peer region's store (`RedisStore::peer`): a single node's connection opens
    /// without the `CLIENT SETINFO` round trip; every connection closes with a reset.
    is_peer: bool,
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
            region: None,
            live: None,
            is_peer: false,
        }
    }

    /// A peer region's store at `target` (the sync loop of `fleet = "regions"` writes
    /// into it): a single node's connection opens without the `CLIENT SETINFO` round
    /// trip, so a connection opened during a partition carries writes as soon as TCP
    /// connects (with a password in the URL, `AUTH` still takes one round trip; a
    /// Cluster's connections are redis-rs's own), and every connection closes with a
    /// reset (see `RedisStore::tcp_settings`).
    pub fn peer(target: Target, timeout: Duration, prefix: &str) -> Self {
        Self {
            is_peer: true,
            ..Self::new(target, timeout, prefix)
        }
    }

    /// Drops the connection: the next call opens a new one (calls in flight on the old
    /// one finish or miss their deadline there, unless their caller gives them up, as
    /// the sync loop's writes to a peer do).
    pub fn reconnect(&self) {
        self.conn.store(None);
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

    fn now_arg(&self) -> String {
        self.now_arg_at(self.local_now())
    }

    /// `ARGV[1]` for a call made at the gateway's `local` time: that time when a clock is
    /// injected or moved (`THROTTLE_CLOCK_START_MS`: Redis `TIME` is not it), else ''
    /// (the server's clock). One read serves both, so an instant the gateway keeps from
    /// the reply (`local + reset_after_ms`) is the script's, not a millisecond later.
    fn now_arg_at(&self, local: u64) -> String {
        if self.clock.is_some() || crate::clock::shifted() {
            local.to_string()
        } else {
            String::new()
        }
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
            self.region,
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
        let reply = wire::parse_reply(&wire::ints(&raw)?, scopes)?;
        if !peek {
            self.note_regions(scopes, reply.now);
        }
        Ok(reply)
    }

    async fn check_inner(&self, check: &Check<'_>) -> Result<Verdict, StoreError> {
        let mut conn = tokio::time::timeout(self.timeout, self.conn())
            .await
            .map_err(|_| StoreError::Timeout(self.timeout.as_millis() as u64))??;
        let local_now = self.local_now();
        let now = self.now_arg_at(local_now);
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
                    self.local_now(),
                );
            }
        };
        let mut decisions: Vec<_> = remote.covered.clone();
        // When each scope was charged: the grant times of the leases that paid covered
        // windows, then the script's `now` of the call that decided the rest.
        let mut decided_at = remote.granted_at;
        let called = if scopes.is_empty() {
            // Every window was paid from leases (the lease check raced a refill).
            Ok(())
        } else if !matches!(conn, Conn::Cluster(_)) || scopes.len() == 1 {
            let leases = Some(&remote.leases[..]);
            let call = self.call(&mut conn, &scopes, leases, check.cost, check.peek, &now);
            call.await.map(|reply| {
                record(&scopes, &reply);
                for s in &scopes {
                    decided_at.add_for(check, s.scope, reply.now);
                }
                decisions.extend(reply.decisions);
            })
        } else {
            let failed = self
                .call_each_scope(
                    conn,
                    check,
                    &scopes,
                    &remote.leases,
                    &now,
                    &record,
                    &mut decisions,
                    &mut decided_at,
                )
                .await;
            failed.map_or(Ok(()), Err)
        };
        let verdict = called.map(|()| Verdict {
            decided_at,
            ..Verdict::from_decisions(check, decisions)
        });
        // A request not admitted (refused, or the call failed) gives back the leased
        // tokens it spent on covered windows.
        let admitted = verdict.as_ref().is_ok_and(|v| v.allowed);
        if let (Some(l), false, false) = (&self.local, admitted, remote.covered.is_empty()) {
            l.undo(check, &plan, check.cost);
        }
        verdict
    }

    /// Cluster: one call per scope (one slot each), concurrently. Adds the decisions and
    /// the scripts' times to `decisions` and `decided_at`, refunds the charged scopes
    /// when the request is not admitted, and answers the first failure.
    #[allow(clippy::too_many_arguments)]
    async fn call_each_scope(
        &self,
        conn: Conn,
        check: &Check<'_>,
        scopes: &[ScopeCheck<'_>],
        leases: &[smallvec::SmallVec<[LeaseArgs; 2]>],
        now: &str,
        record: &(dyn Fn(&[ScopeCheck<'_>], &Reply) + Sync),
        decisions: &mut Vec<crate::limiter::WindowDecision>,
        decided_at: &mut DecidedAt,
    ) -> Option<StoreError> {
        let calls = scopes.iter().enumerate().map(|(i, s)| {
            let mut c = conn.clone();
            let l = leases.get(i).cloned().map(|l| [l]);
            async move {
                self.call(
                    &mut c,
                    std::slice::from_ref(s),
                    l.as_ref().map(|l| &l[..]),
                    check.cost,
                    check.peek,
                    now,
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
            decided_at.add_for(check, s.scope, r.now);
            decisions.extend(r.decisions);
        }
        let allowed = failed.is_none() && decisions.iter().all(|d| d.decision.allowed);
        if !allowed && !charged.is_empty() {
            self.refund(conn, check.cost, charged);
        }
        failed
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
            let sha = self.script.get_hash();
            let cmd = wire::evalsha_in(sha, &self.prefix, header, 0, windows, self.region);
            self.count_call();
            match tokio::time::timeout(self.timeout, run_script(&mut conn, &cmd)).await {
                Ok(Ok(_)) => self.count_returned(group.iter().map(|r| &r.lease)),
                _ => tracing::debug!("giving leased tokens back did not complete"),
            }
        }
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
        if delta > 0 {
            return self.settle_debt(check, delta, decided_at);
        }
        self.settle_refund(check, delta, decided_at)
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
