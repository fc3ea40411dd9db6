//! Concurrency slots of the pipeline (`concurrent = N` on ip, key and tenant): taken
//! all-or-nothing before any rate window is charged, so a request this refuses charges no
//! window; given back when the request ends, or at once when a rate window refuses it.

use super::core::{Core, Runtime};
use super::{Rejection, Who};
use crate::adaptive::Factor;
use crate::config::Mode;
use crate::identity::KeyInfo;
use crate::limiter::{Ident, OnFailure, Scope, ScopeLimits};
use crate::metrics::Outcome;
use crate::store::slots::{SlotLease, SlotRequest, SlotRequests};

/// The slots a caller needs: one per scope with `concurrent`, in scope order (the
/// built-in scopes, then custom scopes and the route's tables, as `build_check` orders
/// them).
pub fn slot_requests(rt: &Runtime, who: Who<'_>) -> SlotRequests {
    let (client_ip, key) = (who.client_ip, who.key);
    let mut out = SlotRequests::new();
    let mut push = |scope: Scope, ident: &Ident, limits: &ScopeLimits| {
        if let Some(limit) = limits.concurrent {
            // Never full: `throttle check` bounds the `concurrent` scopes of a request.
            let _ = out.try_push(SlotRequest {
                scope,
                ident: ident.clone(),
                limit,
                on_failure: limits.on_failure,
            });
        }
    };
    if let (Some(l), Some(ip)) = (&rt.config.ip_limits, client_ip) {
        push(Scope::Ip, &Ident::client(ip, rt.config.ipv6_prefix), l);
    }
    if let Some(k) = key {
        push(Scope::Key, &k.key_ident, &k.tier.key);
        push(Scope::Tenant, &k.tenant_ident, &k.tenant_tier.tenant);
    }
    if !who.customs.is_empty() || who.route.is_some_and(|r| !r.limits.is_empty()) {
        // The named scopes: those of the check with `concurrent`.
        let check = super::build_check(rt, who, 1);
        for s in check
            .scopes
            .iter()
            .filter(|s| matches!(s.scope, Scope::Named(_)))
        {
            push(s.scope, &s.ident, s.limits);
        }
    }
    out
}

/// Takes the caller's slots (an empty lease when no scope has `concurrent`), each
/// scope's N multiplied by the route's adaptive `factor`.
///
/// # Errors
/// 429 `concurrent` when a scope has all its slots taken (enforce mode; in shadow mode
/// the request goes on without slots), 503 when a fail-closed scope's store is away.
pub(super) async fn acquire(
    core: &Core,
    rt: &Runtime,
    who: Who<'_>,
    mode: Mode,
    factor: Factor,
) -> Result<SlotLease, Rejection> {
    let key = who.key;
    let mut reqs = slot_requests(rt, who);
    if !factor.is_one() {
        for r in &mut reqs {
            r.limit = factor.apply(r.limit);
        }
    }
    if reqs.is_empty() {
        return Ok(SlotLease::default());
    }
    match core.store.acquire(&reqs).await {
        Ok(Ok(lease)) => Ok(lease),
        Ok(Err(full)) => {
            if mode == Mode::Shadow {
                core.metrics.decision(full.scope, Outcome::ShadowRejected);
                return Ok(SlotLease::default());
            }
            core.metrics.decision(full.scope, Outcome::Rejected);
            let message = scope_message(rt, key, full.scope);
            Err(Rejection::Concurrent { full, message })
        }
        Err(e) => {
            // The store answers an error only for a fail-closed scope (see `TieredStore`).
            tracing::debug!(error = %e, "concurrency slots: store failed");
            for r in reqs.iter().filter(|r| r.on_failure == OnFailure::Closed) {
                core.metrics.decision(r.scope, Outcome::FailedClosed);
            }
            Err(Rejection::Unavailable)
        }
    }
}

/// The 429 message template of `scope` for this caller.
fn scope_message(rt: &Runtime, key: Option<&KeyInfo>, scope: Scope) -> Option<String> {
    let limits = match scope {
        Scope::Ip => rt.config.ip_limits.as_deref(),
        Scope::Key => key.map(|k| &*k.tier.key),
        Scope::Tenant => key.map(|k| &*k.tenant_tier.tenant),
        _ => None,
    };
    limits.and_then(|l| l.message.clone())
}
