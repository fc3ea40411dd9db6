//! The request_filter pipeline as plain functions: resolve the client IP, refuse blocked
//! callers, match the route, identify the key, enforce the layered limits.
//!
//! Order matters and is part of the contract: an IP block answers 403 before anything
//! else is looked at; auth (401) comes before limits, so an unauthenticated caller spends
//! no key or tenant budget; the ip and global limits apply even when no route matches,
//! so probing for routes is rate limited too. Failed key lookups count against the client
//! IP in `[limits.auth]`; past that limit no key from that IP is looked at (429 `auth`).

use std::net::IpAddr;
use std::sync::Arc;

use pingora::http::RequestHeader;

use super::respond::Rejection;
use super::router::RouteEntry;
use super::target::target;
use crate::config::{Auth, Mode, PathParameters};
use crate::db::events::Event;
use crate::identity::{api_key_from, KeyInfo, Presented};
use crate::limiter::{Check, Ident, OnFailure, Scope, Verdict, WindowDecision};
use crate::metrics::Outcome;
use crate::state::{Dynamic, Runtime, Shared};

/// A request that may go upstream.
#[derive(Clone)]
pub struct Admitted {
    /// The resolved client address.
    pub client_ip: IpAddr,
    /// The matched route.
    pub route: Arc<RouteEntry>,
    /// The caller's key, when one was presented and is valid.
    pub key: Option<Arc<KeyInfo>>,
    /// The window the response headers describe.
    pub rate: Option<WindowDecision>,
    /// True when `rate` is a shadow-mode would-be rejection.
    pub shadow_rejected: bool,
    /// The `Host` to forward, when it differs from the client's (see `target`).
    pub host_header: Option<http::HeaderValue>,
    /// The origin-form URI to forward, when it differs from the client's.
    pub uri: Option<http::Uri>,
}

/// The outcome of the limits for one caller.
#[derive(Debug, Clone, Copy)]
pub struct LimitOutcome {
    /// The layered verdict (`allowed` may be false only in shadow mode).
    pub verdict: Verdict,
    /// True when the verdict rejected but the mode is shadow.
    pub shadow_rejected: bool,
}

/// A refused request: the answer, and the route it matched (for metrics).
pub struct Refusal {
    /// What to answer.
    pub rejection: Rejection,
    /// The matched route's name, if any.
    pub route: Option<Arc<str>>,
}

impl From<Rejection> for Refusal {
    fn from(rejection: Rejection) -> Self {
        Refusal {
            rejection,
            route: None,
        }
    }
}

/// Runs the whole pipeline for a proxied request.
///
/// # Errors
/// The `Refusal` to answer with.
pub async fn admit(
    shared: &Shared,
    rt: &Runtime,
    req: &RequestHeader,
    peer: IpAddr,
    now_ms: u64,
) -> Result<Admitted, Refusal> {
    let xff = req
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .map(|v| v.as_bytes());
    let client_ip = rt.resolver.resolve(peer, xff);
    let dynamic = shared.dynamic(); // one snapshot for the whole request
    if blocked_ip(rt, &dynamic, client_ip, now_ms) {
        return Err(Rejection::blocked(Scope::Ip).into());
    }
    let allow_params = rt.config.server.path_parameters == PathParameters::Allow;
    let t = target(req, allow_params)?;
    let Some(route) = rt.router.find(t.host.as_deref(), &t.path.route) else {
        let out = limit(shared, rt, client_ip, None, 1, Mode::Enforce).await?;
        return Err(Rejection::NoRoute(out.verdict.governing).into());
    };
    let refused = |rejection| Refusal {
        rejection,
        route: Some(route.route.name.clone()),
    };
    let presented = match route.route.auth {
        Auth::None => Presented::Missing,
        _ => api_key_from(&req.headers),
    };
    let key = identify(
        shared,
        rt,
        &dynamic,
        presented,
        route.route.auth,
        client_ip,
        None,
        now_ms,
    )
    .await
    .map_err(refused)?;
    if let Some(k) = &key {
        blocked_key(rt, &dynamic, k, now_ms).map_err(refused)?;
    }
    let (cost, mode) = (route.route.cost, route.route.mode);
    let out = limit(shared, rt, client_ip, key.as_deref(), cost, mode)
        .await
        .map_err(refused)?;
    Ok(Admitted {
        client_ip,
        route: route.clone(),
        key,
        rate: out.verdict.governing,
        shadow_rejected: out.shadow_rejected,
        host_header: t.host_header,
        uri: t.uri,
    })
}

/// Whether `ip` is blocked by the config or the database / admin API.
pub fn blocked_ip(rt: &Runtime, dynamic: &Dynamic, ip: IpAddr, now_ms: u64) -> bool {
    rt.blocks.ip(ip, now_ms).is_some() || dynamic.blocks.ip(ip, now_ms).is_some()
}

/// The caller's key under the route's `auth` rule, guarded by `[limits.auth]`.
///
/// Failed lookups count against `client_ip` and, when given, `also` (the address that
/// really sent the request, for `/v1/check`, whose `ip` field is the caller's choice).
///
/// # Errors
/// 401 when a required key is missing or a presented key is invalid; 429 `auth` when one
/// of the addresses has failed too many lookups.
#[allow(clippy::too_many_arguments)]
pub async fn identify(
    shared: &Shared,
    rt: &Runtime,
    dynamic: &Dynamic,
    presented: Presented<'_>,
    auth: Auth,
    client_ip: IpAddr,
    also: Option<IpAddr>,
    now_ms: u64,
) -> Result<Option<Arc<KeyInfo>>, Rejection> {
    let also = also.filter(|a| *a != client_ip);
    let addresses = std::iter::once(client_ip).chain(also);
    let attempt = !matches!(presented, Presented::Missing);
    if attempt && rt.config.auth_limits.is_some() {
        for ip in addresses.clone() {
            if shared.is_suspect(ip, now_ms) {
                // Past the failed-lookup limit no key is even looked at, valid or not.
                auth_limit(shared, rt, ip, true, now_ms).await?;
            }
        }
    }
    match lookup_key(rt, dynamic, presented, auth) {
        Err(Rejection::InvalidKey) => {
            for ip in addresses {
                auth_limit(shared, rt, ip, false, now_ms).await?;
            }
            Err(Rejection::InvalidKey)
        }
        other => other,
    }
}

/// Resolves a presented key against the config's keys, then the database snapshot.
///
/// # Errors
/// 401 `missing_api_key` / `invalid_api_key`.
pub fn lookup_key(
    rt: &Runtime,
    dynamic: &Dynamic,
    presented: Presented<'_>,
    auth: Auth,
) -> Result<Option<Arc<KeyInfo>>, Rejection> {
    match presented {
        Presented::Missing if auth == Auth::Required => Err(Rejection::MissingKey),
        Presented::Missing => Ok(None),
        Presented::Malformed => Err(Rejection::InvalidKey),
        Presented::Key(k) => match rt.keys.lookup(k) {
            Some(info) => Ok(Some(info.clone())),
            None => dynamic
                .keys
                .lookup(k)
                .cloned()
                .map(Some)
                .ok_or(Rejection::InvalidKey),
        },
    }
}

/// Counts (or, with `peek`, looks at) a failed key lookup against the client IP.
async fn auth_limit(
    shared: &Shared,
    rt: &Runtime,
    client_ip: IpAddr,
    peek: bool,
    now_ms: u64,
) -> Result<(), Rejection> {
    let Some(limits) = &rt.config.auth_limits else {
        return Ok(());
    };
    let mut check = Check::new(1);
    check.peek = peek;
    check.push(Scope::Auth, Ident::Ip(client_ip), limits);
    let verdict = match shared.store.check(&check).await {
        Ok(v) => v,
        Err(_) => return Ok(()), // brute-force counting fails open: auth itself still holds
    };
    if !peek {
        let longest = limits
            .windows
            .iter()
            .map(|w| w.window.period_ms())
            .max()
            .unwrap_or(0);
        shared.suspect(client_ip, now_ms.saturating_add(longest), now_ms);
    }
    match verdict.governing {
        Some(g) if !verdict.allowed => {
            shared.metrics.decision(Scope::Auth, Outcome::Rejected);
            record(shared, client_ip, None, &g);
            Err(Rejection::RateLimited {
                governing: g,
                message: limits.message.clone(),
            })
        }
        _ => Ok(()),
    }
}

/// 403 when the key or its tenant is blocked.
///
/// # Errors
/// `Rejection::Blocked` naming the scope.
pub fn blocked_key(
    rt: &Runtime,
    dynamic: &Dynamic,
    key: &KeyInfo,
    now_ms: u64,
) -> Result<(), Rejection> {
    if rt.blocks.key(&key.key_id, now_ms).is_some()
        || dynamic.blocks.key(&key.key_id, now_ms).is_some()
    {
        return Err(Rejection::blocked(Scope::Key));
    }
    if rt.blocks.tenant(&key.tenant, now_ms).is_some()
        || dynamic.blocks.tenant(&key.tenant, now_ms).is_some()
    {
        return Err(Rejection::blocked(Scope::Tenant));
    }
    Ok(())
}

/// Enforces ip -> key -> tenant -> global for one request of `cost`.
///
/// # Errors
/// 429 with the rejecting window (enforce mode), or 503 when a fail-closed scope's store
/// is unreachable.
pub async fn limit(
    shared: &Shared,
    rt: &Runtime,
    client_ip: IpAddr,
    key: Option<&KeyInfo>,
    cost: u32,
    mode: Mode,
) -> Result<LimitOutcome, Rejection> {
    let check = build_check(rt, client_ip, key, cost);
    if check.is_empty() {
        return Ok(LimitOutcome {
            verdict: Verdict::UNLIMITED,
            shadow_rejected: false,
        });
    }
    let started = tokio::time::Instant::now();
    let result = shared.store.check(&check).await;
    shared.store_call.observe(started.elapsed().as_secs_f64());
    let store = shared.store.name();
    let verdict = match result {
        Ok(v) => v,
        Err(e) => return store_failed(shared, &check, store, &e),
    };
    if verdict.allowed {
        for s in &check.scopes {
            shared.metrics.decision(s.scope, Outcome::Allowed);
        }
        return Ok(LimitOutcome {
            verdict,
            shadow_rejected: false,
        });
    }
    let Some(governing) = verdict.governing else {
        return Ok(LimitOutcome {
            verdict,
            shadow_rejected: false,
        });
    };
    if mode == Mode::Shadow {
        shared
            .metrics
            .decision(governing.scope, Outcome::ShadowRejected);
        return Ok(LimitOutcome {
            verdict,
            shadow_rejected: true,
        });
    }
    shared.metrics.decision(governing.scope, Outcome::Rejected);
    record(shared, client_ip, key, &governing);
    let message = check
        .scopes
        .iter()
        .find(|s| s.scope == governing.scope)
        .and_then(|s| s.limits.message.clone());
    Err(Rejection::RateLimited { governing, message })
}

/// Queues a violation event for the database log (when one is configured). Never blocks.
fn record(shared: &Shared, client_ip: IpAddr, key: Option<&KeyInfo>, g: &WindowDecision) {
    let Some(queue) = &shared.events else { return };
    let ident = match g.scope {
        Scope::Ip | Scope::Auth => client_ip.to_string(),
        Scope::Key => key.map_or_else(String::new, |k| k.key_id.to_string()),
        Scope::Tenant => key.map_or_else(String::new, |k| k.tenant.to_string()),
        Scope::Global => "all".to_string(),
    };
    queue.push(Event {
        tenant_id: key.map(|k| k.tenant.clone()),
        api_key_id: key.map(|k| k.key_id.clone()),
        ip: client_ip,
        scope: g.scope.as_str(),
        limit_key: format!("{}:{ident}", g.scope.as_str()),
        limit_value: u64::from(g.decision.limit),
        count: g.decision.current,
        window: g.window,
        at_ms: shared.clock.now_ms(),
    });
}

/// The scopes that apply to a caller, in order.
pub fn build_check<'a>(
    rt: &'a Runtime,
    client_ip: IpAddr,
    key: Option<&'a KeyInfo>,
    cost: u32,
) -> Check<'a> {
    let mut check = Check::new(cost);
    if let Some(l) = &rt.config.ip_limits {
        check.push(Scope::Ip, Ident::Ip(client_ip), l);
    }
    if let Some(k) = key {
        check.push(Scope::Key, k.key_ident.clone(), &k.tier.key);
        check.push(Scope::Tenant, k.tenant_ident.clone(), &k.tenant_tier.tenant);
    }
    if let Some(l) = &rt.config.global_limits {
        check.push(Scope::Global, Ident::Global, l);
    }
    check
}

/// The store could not decide: each scope's `on_failure` says what happens.
fn store_failed(
    shared: &Shared,
    check: &Check<'_>,
    store: &str,
    e: &crate::store::StoreError,
) -> Result<LimitOutcome, Rejection> {
    shared
        .metrics
        .store_errors_total
        .with_label_values(&[store])
        .inc();
    tracing::debug!(error = %e, "limit store failed");
    if let Some(s) = check
        .scopes
        .iter()
        .find(|s| s.limits.on_failure == OnFailure::Closed)
    {
        shared.metrics.decision(s.scope, Outcome::FailedClosed);
        return Err(Rejection::Unavailable);
    }
    for s in &check.scopes {
        shared.metrics.decision(s.scope, Outcome::FailedOpen);
    }
    Ok(LimitOutcome {
        verdict: Verdict::UNLIMITED,
        shadow_rejected: false,
    })
}
