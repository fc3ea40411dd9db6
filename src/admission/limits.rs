//! The layered limits of one request, and the one place decisions are counted.
//!
//! `throttle_decisions_total{scope,decision}` counts, per request:
//! - decided by the shared store (or the memory store): on a pass every checked scope
//!   `allowed`; on a rejection the rejecting scope `rejected` (`shadow_rejected` in
//!   shadow mode) and nothing else;
//! - the store could not decide (error, deadline, open breaker): each scope by its
//!   `on_failure`: `failed_open` for open scopes; for local scopes `local_fallback` when
//!   the local decision admits, else the rejecting scope `rejected`; with a closed scope
//!   the request is refused (503) and each closed scope counts `failed_closed`.
//!
//! `throttle_near_limit_total{scope}` counts admitted requests whose governing window
//! (the fewest remaining) is left with at most 10% of its limit, by that window's scope.
//!
//! `throttle_store_errors_total` is counted by the store that failed (`TieredStore`),
//! once per call that reached it.

use std::net::IpAddr;
use std::sync::Arc;

use super::bans::{self, Offender};

use super::applied::{Applied, Part, Tables};
use super::core::{Core, Runtime};
use super::Rejection;
use crate::config::{Counts, Mode, Route};
use crate::identity::KeyInfo;
use crate::limiter::{Check, Ident, Quota, Scope, Verdict, WindowDecision};
use crate::metrics::Outcome;
use crate::store::StoreError;
use crate::violations::Event;

/// The outcome of the limits for one caller.
#[derive(Debug, Clone)]
pub(super) struct LimitOutcome {
    /// The layered verdict (`allowed` may be false only in shadow mode).
    pub(super) verdict: Verdict,
    /// True when the verdict rejected but the mode is shadow.
    pub(super) shadow_rejected: bool,
    /// The check's windows, when the IETF headers are on.
    pub(super) policy: Option<Box<[Quota]>>,
}

/// What the limits see of one request.
#[derive(Clone, Copy)]
pub(super) struct Charge<'a> {
    /// The tables that apply (built once per request, scaled by the route's factor).
    pub(super) applied: &'a Applied,
    /// Where they are read from.
    pub(super) tables: Tables<'a>,
    /// The resolved client address.
    pub(super) client_ip: IpAddr,
    /// Units to spend.
    pub(super) cost: u32,
    /// The route's mode (a shadow-mode rejection is admitted).
    pub(super) mode: Mode,
    /// Who asks (only some origins strike bans).
    pub(super) origin: super::Origin,
    /// The request's one limiter clock reading.
    pub(super) now_ms: u64,
    /// Where the store call's start and length are left (for tracing).
    pub(super) span: &'a std::sync::OnceLock<super::StoreSpan>,
}

/// Enforces the rate windows of `c.applied` (ip -> key -> tenant -> global -> custom ->
/// route) for one request of `c.cost`.
///
/// # Errors
/// 429 with the rejecting window (enforce mode), or 503 when a fail-closed scope's store
/// is unreachable.
pub(super) async fn limit(
    core: &Core,
    rt: &Runtime,
    c: &Charge<'_>,
) -> Result<LimitOutcome, Rejection> {
    let mut check = c.applied.check(c.tables, c.cost);
    let outcome = |verdict, shadow_rejected, policy| LimitOutcome {
        verdict,
        shadow_rejected,
        policy,
    };
    if check.is_empty() {
        return Ok(outcome(Verdict::UNLIMITED, false, None));
    }
    // A cost that a window can never hold is the caller's error, not a wait: `/v1/check`
    // and the rate-limit service name their own cost (a proxied request's route cost is
    // checked against every window when the config loads). Nothing is charged or struck.
    if c.origin != super::Origin::Proxy && c.mode == Mode::Enforce {
        if let Some(capacity) = below_cost(&check) {
            return Err(Rejection::CostOverCapacity {
                cost: check.cost,
                capacity,
            });
        }
    }
    // The time the memory store decides at (the store reports the time it decided at
    // in `Verdict::decided_at`, which is what a settle names).
    check.at_ms = Some(c.now_ms);
    let ietf = rt.config.server.rate_limit_headers.ietf();
    let policy = ietf.then(|| check.quotas());
    let started = tokio::time::Instant::now();
    let result = decide(core, &check).await;
    let took = started.elapsed();
    core.store_call.observe(took.as_secs_f64());
    if core.observed {
        // One store call per request: the first span stands.
        let _ = c.span.set((started, took));
    }
    let verdict = match result {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!(error = %e, "limit store failed");
            return store_failed(core, c, &check);
        }
    };
    count(core, &check, &verdict, c.mode);
    match verdict.governing {
        Some(governing) if !verdict.allowed => {
            if c.mode == Mode::Shadow {
                return Ok(outcome(verdict, true, policy));
            }
            Err(rejected(core, &check, c, governing, policy))
        }
        _ => Ok(outcome(verdict, false, policy)),
    }
}

/// The largest capacity of `check`'s windows when even that is below its cost: a cost
/// above every window's capacity (None: some window can hold it; a window that cannot is
/// then a 429 like any other).
fn below_cost(check: &Check<'_>) -> Option<u32> {
    let largest = check
        .scopes
        .iter()
        .flat_map(|s| &s.limits.windows)
        .map(|w| w.capacity)
        .max()?;
    (largest < check.cost).then_some(largest)
}

/// The 429 of a rejection by `governing`: recorded in the violation log, and a strike
/// towards the rejecting scope's `ban`.
fn rejected(
    core: &Core,
    check: &Check<'_>,
    c: &Charge<'_>,
    governing: WindowDecision,
    policy: Option<Box<[Quota]>>,
) -> Rejection {
    let (client_ip, key, now_ms) = (c.client_ip, c.tables.key, c.now_ms);
    let rejecting = check.scopes.iter().find(|s| s.scope == governing.scope);
    let ident = rejecting.map(|s| &s.ident);
    record(core, client_ip, key, &governing, ident, now_ms);
    if let Some(s) = rejecting {
        if let Some(rule) = s.limits.ban.filter(|r| c.origin.strikes(r)) {
            let who = Offender {
                client_ip,
                key,
                now_ms,
                source: c.origin.ban_source(),
            };
            let retry_after = governing.decision.retry_after_ms;
            bans::strike(core, s.scope, &s.ident, rule, retry_after, &who);
        }
    }
    let message = rejecting.and_then(|s| s.limits.message.clone());
    Rejection::RateLimited {
        governing,
        message,
        policy,
    }
}

/// The store's verdict: at once when it can decide locally (the memory store always;
/// Redis on leases or cached rejections), else a round trip.
/// Decides `check`: at once when the store can (`LimitStore::decide_locally`: memory,
/// leases, the over-limit cache), else by a store call.
///
/// # Errors
/// The store could not decide.
pub async fn decide(core: &Core, check: &Check<'_>) -> Result<Verdict, StoreError> {
    match core.store.decide_locally(check) {
        Some(v) => Ok(v),
        None => core.store.check(check).await,
    }
}

/// The store could not decide (the tiered store answers so only for a fail-closed
/// scope; a bare store fails open).
fn store_failed(core: &Core, c: &Charge<'_>, check: &Check<'_>) -> Result<LimitOutcome, Rejection> {
    let mut closed = c.applied.closed(c.tables, Part::Rate).peekable();
    if closed.peek().is_some() {
        for scope in closed {
            core.metrics.decision(scope, Outcome::FailedClosed);
        }
        return Err(Rejection::Unavailable);
    }
    for s in check.scopes.iter() {
        core.metrics.decision(s.scope, Outcome::FailedOpen);
    }
    Ok(LimitOutcome {
        verdict: Verdict::UNLIMITED,
        shadow_rejected: false,
        policy: None,
    })
}

/// Counts one request's decisions (see the module docs).
fn count(core: &Core, check: &Check<'_>, verdict: &Verdict, mode: Mode) {
    let m = &core.metrics;
    if !verdict.allowed {
        if let Some(g) = verdict.governing {
            let outcome = match mode {
                Mode::Shadow => Outcome::ShadowRejected,
                Mode::Enforce => Outcome::Rejected,
            };
            m.decision(g.scope, outcome);
        }
        for (i, s) in check.scopes.iter().enumerate() {
            if verdict.failed_open & (1 << i) != 0 {
                m.decision(s.scope, Outcome::FailedOpen);
            }
        }
        return;
    }
    if let Some(g) = verdict.governing {
        // At most 10% of the governing (tightest) window left after this request.
        if u64::from(g.decision.remaining) * 10 <= u64::from(g.decision.limit) {
            m.near_limit(g.scope);
        }
    }
    for (i, s) in check.scopes.iter().enumerate() {
        let outcome = if !verdict.fallback {
            Outcome::Allowed
        } else if verdict.failed_open & (1 << i) != 0 {
            Outcome::FailedOpen
        } else {
            Outcome::LocalFallback
        };
        m.decision(s.scope, outcome);
    }
}

/// Queues a violation event for the database log (when one is configured). Never blocks.
/// `ident` is what the rejecting scope counted (an IPv6 client's network for `ip`).
pub(super) fn record(
    core: &Core,
    client_ip: IpAddr,
    key: Option<&KeyInfo>,
    g: &WindowDecision,
    ident: Option<&Ident>,
    at_ms: u64,
) {
    let Some(queue) = &core.events else { return };
    let ident = match g.scope {
        Scope::Ip | Scope::Auth => ident.map_or_else(|| client_ip.to_string(), Ident::to_string),
        Scope::Key => key
            .and_then(KeyInfo::key_scope_id)
            .unwrap_or_default()
            .to_string(),
        Scope::Tenant => key
            .and_then(KeyInfo::tenant_id)
            .unwrap_or_default()
            .to_string(),
        Scope::Global => "all".to_string(),
        Scope::Named(_) => ident.map_or_else(|| "all".to_string(), Ident::to_string),
    };
    queue.push(Event {
        tenant_id: key.and_then(|k| k.tenant.clone()),
        // The key scope's identity (`jwt:<sub>` for a token); a caller known only by its
        // tenant (the Envoy rate-limit service) has none.
        api_key_id: key.and_then(KeyInfo::key_scope_id).map(Arc::from),
        ip: client_ip,
        scope: g.scope.as_str(),
        limit_key: format!("{}:{ident}", g.scope.as_str()),
        limit_value: u64::from(g.decision.limit),
        count: g.decision.current,
        window: g.window,
        span_secs: None,
        at_ms,
    });
}

/// Who a request is, as the limits see it: everything a scope's identity comes from.
#[derive(Debug, Clone, Copy)]
pub struct Who<'a> {
    /// The resolved client address (None: a rate-limit service descriptor without
    /// `remote_address`; nothing keyed by an address applies).
    pub client_ip: Option<IpAddr>,
    /// The caller's key, when identified.
    pub key: Option<&'a KeyInfo>,
    /// The route, whose own tables (`limits`) apply.
    pub route: Option<&'a Route>,
    /// The custom scopes' identities, indexed like `Config::scopes` (None: the request
    /// does not carry the attribute; empty without custom scopes).
    pub customs: &'a [Option<Ident>],
}

impl<'a> Who<'a> {
    /// A caller known by its address and key only (no route tables, no custom scopes).
    pub fn of(client_ip: IpAddr, key: Option<&'a KeyInfo>) -> Who<'a> {
        Who {
            client_ip: Some(client_ip),
            key,
            route: None,
            customs: &[],
        }
    }

    /// The identity a route table or custom scope counting `counts` counts, if any.
    pub(crate) fn ident(&self, rt: &Runtime, counts: Counts) -> Option<Ident> {
        match counts {
            Counts::Ip => self
                .client_ip
                .map(|ip| Ident::client(ip, rt.config.ipv6_prefix)),
            Counts::Key => self.key.and_then(|k| k.key_ident.clone()),
            Counts::Tenant => self.key.and_then(|k| k.tenant_ident.clone()),
            Counts::Global => Some(Ident::Global),
            Counts::Custom(i) => self.customs.get(i).cloned().flatten(),
        }
    }
}
