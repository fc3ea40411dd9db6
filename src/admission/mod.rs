//! The admission pipeline: one transport-neutral step that every entry point (the proxy,
//! `POST /v1/check`, later the Envoy gRPC service) runs to decide a request.
//!
//! `admit(&core, &AdmitRequest)` takes plain data (client address, host and path or a
//! route name, the presented key, a cost) and answers with an `Admission` or a `Refusal`.
//! Order matters and is part of the contract:
//! 1. an IP block answers 403 before anything else is looked at;
//! 2. the route: matched by host and path (no match: the ip and global limits still
//!    apply, then 404, so probing for routes is rate limited too), or named;
//! 3. the key, under the route's `auth` (401 before any limit, so an unauthenticated
//!    caller spends no key or tenant budget); failed lookups count against the client
//!    address in `[limits.auth]`, and past that limit no key is looked at (429 `auth`);
//! 4. key and tenant blocks (403);
//! 5. concurrency slots (`concurrent = N` on ip, key, tenant), all-or-nothing (429
//!    `concurrent`); a request refused here charges no rate window;
//! 6. the layered limits ip -> key -> tenant -> global, all-or-nothing (429 or 503); a
//!    refusal here gives the slots of step 5 back at once.
//!
//! Every decided request is counted for `GET /v1/top` (`crate::top`): its address, and
//! its key and tenant once identified, as rejected when a limit answered 429 (a rate
//! window or `concurrent`; not a block, a 401 or a 503, and not a shadow-mode would-be
//! rejection). Every entry point runs `admit`, so the proxy, `POST /v1/check` (for the
//! `ip` it names), the Envoy rate-limit service and the tower layer all feed it.
//!
//! On an adaptive route (`adaptive`), every limit of steps 5 and 6 is multiplied by the
//! route's current factor, read once per request. Every entry point that names a route
//! gets it: the proxy, `/v1/check` with a `route` and the Envoy rate-limit service's
//! `route` entry alike; only the proxy feeds the route's window (it alone sees the
//! upstream), so the factor of a gateway that only answers checks stays 1.
//!
//! An `Admission` is the request's lifetime: it keeps the `Arc` of the runtime config it
//! was decided on (a reload between phases cannot mix two configs) and is finished exactly
//! once when the request ends (`finish`, or its drop), handing the store back what the
//! request holds.

mod auth;
mod bans;
pub mod concurrency;
pub mod core;
mod limits;
pub mod snapshot;

use std::net::IpAddr;
use std::sync::Arc;

pub use self::auth::lookup_key;
pub use self::core::{block_entry, parse_net, Core, Dynamic, Runtime};
pub use self::limits::build_check;
use crate::adaptive::Factor;
use crate::config::{Auth, Mode};
use crate::identity::{KeyInfo, Presented};
use crate::limiter::{Ident, Quota, Scope, WindowDecision};
use crate::metrics::Metrics;
use crate::routing::RouteEntry;
use crate::store::slots::Full;
use crate::store::{Ending, Held, LimitStore};

/// A request as every entry point describes it: plain data, no transport types.
#[derive(Debug, Clone, Copy)]
pub struct AdmitRequest<'a> {
    /// The resolved client address (the one the `ip` scope counts).
    pub client_ip: IpAddr,
    /// Where the request goes.
    pub target: Target<'a>,
    /// The API key as presented.
    pub key: Presented<'a>,
    /// Units to spend instead of the route's `cost`.
    pub cost: Option<u32>,
    /// Another address charged for failed key lookups: the address that really sent a
    /// `/v1/check`, whose `ip` field is the caller's choice.
    pub also_charge: Option<IpAddr>,
    /// Who is asking: a proxied request, or a decision API naming a client.
    pub origin: Origin,
}

/// Who asks for a decision. Automatic bans are struck only by proxied requests: a
/// decision API names its client (`ip`, `key_id`, `tenant`) and so could ban anyone,
/// unless the scope's `ban` says `from_check = true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A request the gateway proxies (or the tower layer, or a simulated trace).
    Proxy,
    /// `POST /v1/check` or the Envoy rate-limit service.
    Check,
}

impl Origin {
    /// Whether a rejection of this origin counts towards `rule`'s ban.
    pub fn strikes(self, rule: &crate::limiter::BanRule) -> bool {
        self == Origin::Proxy || rule.from_check
    }
}

/// Which route a request is for.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// Match a route by normalized host and path (the proxy).
    Match {
        /// Lower-case host without port and trailing dot.
        host: Option<&'a str>,
        /// The normalized path routes are matched on.
        path: &'a str,
    },
    /// The route of this name (`/v1/check`'s `route`).
    Named(&'a str),
    /// No route: `auth = "optional"`, cost 1, enforce.
    Any,
}

/// Why a request is not admitted.
#[derive(Debug, Clone)]
pub enum Rejection {
    /// 429: a limit was hit.
    RateLimited {
        /// The rejecting window.
        governing: WindowDecision,
        /// The scope's message template.
        message: Option<String>,
        /// The check's windows, for `RateLimit-Policy` (with `rate_limit_headers` "ietf"
        /// or "both").
        policy: Option<Box<[Quota]>>,
    },
    /// 429: a scope has all its `concurrent` slots taken.
    Concurrent {
        /// The scope, its N and the count in flight including this request.
        full: Full,
        /// The scope's message template.
        message: Option<String>,
    },
    /// 403: a block matched.
    Blocked(Scope),
    /// 403: an automatic ban is in force.
    Banned(Box<crate::bans::Ban>),
    /// 401: a key is required and none was sent.
    MissingKey,
    /// 401: the key is unknown or malformed.
    InvalidKey,
    /// 404: no route matched (after the ip and global limits passed).
    NoRoute(Option<WindowDecision>),
    /// 404: `Target::Named` names no route.
    UnknownRoute(String),
    /// 400: an ambiguous path (the proxy's target parsing).
    InvalidPath,
    /// 400: no, several or a malformed `Host` (the proxy's target parsing).
    InvalidHost,
    /// 400: more than one credential (see `identity::api_key_from`).
    AmbiguousCredentials,
    /// 405: a method the gateway does not forward (see `proxy::target::method_allowed`).
    MethodNotAllowed,
    /// 503: a fail-closed scope could not reach its store.
    Unavailable,
}

/// A refused request: the answer, and the route it matched (for metrics).
#[derive(Clone)]
pub struct Refusal {
    /// What to answer.
    pub rejection: Rejection,
    /// The matched route, if any.
    pub route: Option<Arc<RouteEntry>>,
    /// The runtime config the request was refused on (None only for a refusal made
    /// outside the pipeline).
    pub runtime: Option<Arc<Runtime>>,
    /// The request's one limiter clock reading (what the answer's headers count from).
    pub now_ms: u64,
}

/// An admitted request, alive until it is finished.
pub struct Admission {
    /// The runtime config the request was decided on.
    pub runtime: Arc<Runtime>,
    /// The resolved client address.
    pub client_ip: IpAddr,
    /// The route (None for `Target::Any`).
    pub route: Option<Arc<RouteEntry>>,
    /// The caller's key, when one was presented and is valid.
    pub key: Option<Arc<KeyInfo>>,
    /// The window the response headers describe.
    pub rate: Option<WindowDecision>,
    /// True when `rate` is a shadow-mode would-be rejection.
    pub shadow_rejected: bool,
    /// The check's windows, for `RateLimit-Policy` (with `rate_limit_headers` "ietf" or
    /// "both").
    pub rate_policy: Option<Box<[Quota]>>,
    /// The limiter clock reading the decision was made at.
    pub now_ms: u64,
    /// When the store decided each scope, on its own clock (what a settle names).
    decided_at: crate::limiter::DecidedAt,
    /// The route's adaptive factor the limits were multiplied by (1: not adapting).
    pub factor: Factor,
    /// Whether the store charged the rate windows (not when it failed open, or the local
    /// fallback decided): only then is there a cost to settle.
    charged: bool,
    settled: bool,
    lifetime: Option<Lifetime>,
}

/// What `finish` hands back.
struct Lifetime {
    store: Arc<dyn LimitStore>,
    held: Held,
}

// === impl Rejection ===

impl From<Rejection> for Refusal {
    fn from(rejection: Rejection) -> Self {
        Refusal {
            rejection,
            route: None,
            runtime: None,
            now_ms: 0,
        }
    }
}

// === impl Refusal ===

impl std::fmt::Debug for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refusal")
            .field("rejection", &self.rejection)
            .field("route", &self.route)
            .field("now_ms", &self.now_ms)
            .finish_non_exhaustive()
    }
}

impl Refusal {
    /// The refusal, stamped with the request's runtime snapshot and clock reading.
    pub fn on(mut self, runtime: Arc<Runtime>, now_ms: u64) -> Self {
        self.runtime = Some(runtime);
        self.now_ms = now_ms;
        self
    }
}

// === impl Admission ===

impl Admission {
    /// The route's name for metrics (`none` without a route).
    pub fn route_name(&self) -> Option<&Arc<str>> {
        self.route.as_ref().map(|r| &r.route.name)
    }

    /// Settles the reserved cost against the request's true cost (`cost_header`), once:
    /// every window that was charged is charged `actual - cost` more, or refunded
    /// `cost - actual` (the store does it without blocking; a debt is bounded by each
    /// window's limit), and `rate` describes its window as settled
    /// (`limiter::algorithm::settled`), so the response's `X-RateLimit-Remaining` and
    /// `-Reset` are the settled ones. Answers the difference applied (0: nothing to
    /// settle).
    pub fn settle(&mut self, actual: u32, metrics: &Metrics) -> i64 {
        if self.settled || !self.charged {
            return 0;
        }
        self.settled = true;
        let Some(l) = &mut self.lifetime else {
            return 0;
        };
        let reserved = l.held.cost;
        let delta = i64::from(actual) - i64::from(reserved);
        if delta == 0 {
            return 0;
        }
        let base =
            limits::build_check(&self.runtime, self.client_ip, self.key.as_deref(), reserved);
        // The same (scaled) limits the request was decided on.
        let scaled = limits::scaled_limits(&base, self.factor);
        let check = limits::rebind(base, &scaled);
        l.store.settle(&check, delta, self.decided_at);
        l.held.cost = actual;
        metrics.cost_settled(delta);
        // The headers describe the governing window as settled (remaining, reset).
        if let Some(wd) = &mut self.rate {
            let limit = check
                .scopes
                .iter()
                .filter(|s| s.scope == wd.scope)
                .flat_map(|s| s.limits.windows.iter())
                .find(|w| w.window == wd.window);
            if let Some(limit) = limit {
                wd.decision = crate::limiter::algorithm::settled(&wd.decision, limit, delta);
            }
        }
        delta
    }

    /// Whether the request's cost was settled (`settle` ran with a charged reservation).
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// Ends the request: what it holds goes back to the store, once.
    pub fn finish(mut self, ending: Ending) {
        self.end(ending);
    }

    fn end(&mut self, ending: Ending) {
        if let Some(l) = self.lifetime.take() {
            l.store.finish(l.held, ending);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.end(Ending::Dropped);
    }
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("client_ip", &self.client_ip)
            .field("route", &self.route_name())
            .field("key", &self.key.as_ref().map(|k| &k.key_id))
            .field("rate", &self.rate)
            .field("finished", &self.lifetime.is_none())
            .finish_non_exhaustive()
    }
}

/// Decides `req` (see the module docs for the order of checks).
///
/// # Errors
/// The `Refusal` to answer with.
pub async fn admit(core: &Core, req: &AdmitRequest<'_>) -> Result<Admission, Refusal> {
    admit_at(core, core.runtime(), core.clock.now_ms(), req).await
}

/// Decides `req` on the adapter's runtime snapshot `runtime` at its one clock reading
/// `now_ms`: nothing in the pipeline loads the config or reads the limiter clock again,
/// and both travel in the `Admission` or `Refusal`.
///
/// # Errors
/// The `Refusal` to answer with.
pub async fn admit_at(
    core: &Core,
    runtime: Arc<Runtime>,
    now_ms: u64,
    req: &AdmitRequest<'_>,
) -> Result<Admission, Refusal> {
    let mut seen = Seen { key: None, now_ms };
    let result = pipeline(core, &runtime, req, &mut seen).await;
    count_top(core, &runtime, req.client_ip, &seen, &result);
    result.map_err(|r| r.on(runtime, now_ms))
}

/// Counts the request for `GET /v1/top` (see the module docs).
fn count_top(
    core: &Core,
    rt: &Runtime,
    ip: IpAddr,
    seen: &Seen,
    result: &Result<Admission, Refusal>,
) {
    let rejected = matches!(
        result,
        Err(Refusal {
            rejection: Rejection::RateLimited { .. } | Rejection::Concurrent { .. },
            ..
        })
    );
    let (top, now_ms) = (&core.top, seen.now_ms);
    // The identity the ip scope counts: an IPv6 client's network.
    let client = Ident::client(ip, rt.config.ipv6_prefix);
    top.record(Scope::Ip, &client, rejected, now_ms);
    if let Some(k) = &seen.key {
        top.record(Scope::Key, &k.key_ident, rejected, now_ms);
        top.record(Scope::Tenant, &k.tenant_ident, rejected, now_ms);
    }
}

/// What the pipeline learned about a request, for `GET /v1/top` whatever the outcome.
#[derive(Default)]
struct Seen {
    /// The caller's key, once identified.
    key: Option<Arc<KeyInfo>>,
    /// The limiter clock reading of the decision.
    now_ms: u64,
}

/// The pipeline behind `admit`; `seen` is filled as the request is identified.
async fn pipeline(
    core: &Core,
    runtime: &Arc<Runtime>,
    req: &AdmitRequest<'_>,
    seen: &mut Seen,
) -> Result<Admission, Refusal> {
    let rt = &**runtime;
    let dynamic = core.dynamic(); // one snapshot for the whole request
    let now_ms = seen.now_ms;
    let ip = req.client_ip;
    if blocked_ip(rt, &dynamic, ip, now_ms) {
        return Err(Rejection::Blocked(Scope::Ip).into());
    }
    let client = Ident::client(ip, rt.config.ipv6_prefix);
    bans::check(core, Scope::Ip, &client, now_ms)?;
    bans::check(core, Scope::Auth, &client, now_ms)?;
    let route = match req.target {
        Target::Match { host, path } => match rt.router.find(host, path) {
            Some(r) => Some(r.clone()),
            None => {
                let out = limits::limit(
                    core,
                    rt,
                    ip,
                    None,
                    1,
                    Mode::Enforce,
                    Factor::ONE,
                    (req.origin, now_ms),
                )
                .await?;
                return Err(Rejection::NoRoute(out.verdict.governing).into());
            }
        },
        Target::Named(name) => match rt.router.find_by_name(name) {
            Some(r) => Some(r.clone()),
            None => return Err(Rejection::UnknownRoute(name.to_string()).into()),
        },
        Target::Any => None,
    };
    let refused = |rejection| Refusal {
        route: route.clone(),
        ..Refusal::from(rejection)
    };
    let auth = route.as_ref().map_or(Auth::Optional, |r| r.route.auth);
    let presented = match auth {
        Auth::None => Presented::Missing,
        _ => req.key,
    };
    let charged = auth::Charged {
        client_ip: ip,
        also: req.also_charge,
        origin: req.origin,
    };
    let key = auth::identify(core, rt, &dynamic, presented, auth, charged, now_ms)
        .await
        .map_err(refused)?;
    seen.key.clone_from(&key);
    if let Some(k) = &key {
        blocked_key(rt, &dynamic, k, now_ms).map_err(refused)?;
        bans::check(core, Scope::Key, &k.key_ident, now_ms).map_err(refused)?;
        bans::check(core, Scope::Tenant, &k.tenant_ident, now_ms).map_err(refused)?;
    }
    let r = route.as_ref().map(|r| &r.route);
    let cost = req.cost.or(r.map(|r| r.cost)).unwrap_or(1).max(1);
    let mode = r.map_or(Mode::Enforce, |r| r.mode);
    // An adaptive route's limits follow its upstream's health (see `adaptive`).
    let factor = route.as_ref().map_or(Factor::ONE, |r| r.factor());
    let slots = concurrency::acquire(core, rt, ip, key.as_deref(), mode, factor)
        .await
        .map_err(refused)?;
    // From here the slots are held by a guard: if this future is dropped while the rate
    // windows are checked (a gRPC deadline, a client gone, a timeout layer), its drop
    // gives them back; a refusal gives them back at once.
    let mut guard = SlotGuard {
        store: &core.store,
        slots: Some(slots),
        ending: Ending::Dropped,
    };
    let at = (req.origin, now_ms);
    let limited = limits::limit(core, rt, ip, key.as_deref(), cost, mode, factor, at);
    let out = match limited.await {
        Ok(out) => out,
        Err(rejection) => {
            guard.ending = Ending::Completed { status: 429 };
            drop(guard);
            return Err(refused(rejection));
        }
    };
    let slots = guard.slots.take().unwrap_or_default();
    Ok(Admission {
        client_ip: ip,
        route,
        key,
        rate: out.verdict.governing,
        shadow_rejected: out.shadow_rejected,
        rate_policy: out.policy,
        decided_at: out.verdict.decided_at,
        now_ms,
        factor,
        // A shadow-mode would-be rejection was admitted, but the store charged nothing.
        charged: out.verdict.allowed
            && out.verdict.scopes_checked != 0
            && !out.verdict.fallback
            && out.verdict.failed_open == 0,
        settled: false,
        lifetime: Some(Lifetime {
            store: core.store.clone(),
            held: Held { cost, slots },
        }),
        runtime: runtime.clone(),
    })
}

/// Concurrency slots between their acquisition and the `Admission` that takes them over:
/// given back on drop (a refusal, or the admission future dropped mid-way).
struct SlotGuard<'a> {
    store: &'a Arc<dyn LimitStore>,
    slots: Option<crate::store::slots::SlotLease>,
    ending: Ending,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take().filter(|s| !s.is_empty()) {
            self.store.finish(Held { cost: 0, slots }, self.ending);
        }
    }
}

/// The 403 an IP block answers, if any: the first check of the pipeline, for adapters
/// that refuse a request before `admit` (a malformed request target).
pub fn ip_blocked(core: &Core, ip: IpAddr) -> Option<Refusal> {
    ip_blocked_at(core, core.runtime(), core.clock.now_ms(), ip)
}

/// `ip_blocked` on the request's runtime snapshot and clock reading.
pub fn ip_blocked_at(
    core: &Core,
    runtime: Arc<Runtime>,
    now_ms: u64,
    ip: IpAddr,
) -> Option<Refusal> {
    blocked_ip(&runtime, &core.dynamic(), ip, now_ms)
        .then(|| Refusal::from(Rejection::Blocked(Scope::Ip)).on(runtime, now_ms))
}

/// Whether `ip` is blocked by the config or the database / admin API.
pub fn blocked_ip(rt: &Runtime, dynamic: &Dynamic, ip: IpAddr, now_ms: u64) -> bool {
    rt.blocks.ip(ip, now_ms).is_some() || dynamic.blocks.ip(ip, now_ms).is_some()
}

/// 403 when the key or its tenant is blocked.
fn blocked_key(
    rt: &Runtime,
    dynamic: &Dynamic,
    key: &KeyInfo,
    now_ms: u64,
) -> Result<(), Rejection> {
    if rt.blocks.key(&key.key_id, now_ms).is_some()
        || dynamic.blocks.key(&key.key_id, now_ms).is_some()
    {
        return Err(Rejection::Blocked(Scope::Key));
    }
    if rt.blocks.tenant(&key.tenant, now_ms).is_some()
        || dynamic.blocks.tenant(&key.tenant, now_ms).is_some()
    {
        return Err(Rejection::Blocked(Scope::Tenant));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
