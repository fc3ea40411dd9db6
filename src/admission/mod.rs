//! The admission pipeline: one transport-neutral step that every entry point (the proxy,
//! `POST /v1/check`, the Envoy rate-limit service, the tower layer) runs to decide a request.
//!
//! `admit(&core, &AdmitRequest)` takes plain data (client address, host and path or a
//! route name, the presented key, a cost) and answers with an `Admission` or a `Refusal`.
//! Order matters and is part of the contract:
//! 1. an IP block answers 403 before anything else is looked at;
//! 2. the route: matched by host and path (no match: the ip and global limits still
//!    apply, then 404, so probing for routes is rate limited too), or named;
//! 3. the key, under the route's `auth` (401 before any limit, so an unauthenticated
//!    caller spends no key or tenant budget), or with `[auth.jwt]` a Bearer JWT, whose
//!    claims stand in for a key; failed lookups and tokens that do not verify count
//!    against the client address in `[limits.auth]`, and past that limit no key or token
//!    is looked at (429 `auth`);
//! 4. key and tenant blocks (403);
//! 5. concurrency slots (`concurrent = N` on ip, key, tenant and the named scopes: a
//!    route's tables, custom scopes), all-or-nothing (429 `concurrent`); a request refused here charges no rate window;
//! 6. the layered limits ip -> key -> tenant -> global, then the named scopes (a route's
//!    tables, custom scopes), all-or-nothing (429 or 503); a
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

pub mod applied;
mod auth;
mod bans;
mod concurrency;
pub mod core;
pub mod custom;
mod limits;
mod outcome;
mod pipeline;
pub mod routes;

use std::net::IpAddr;
use std::sync::Arc;

pub use self::applied::{Applied, Skip, Table, Tables};
pub use self::auth::lookup_key;
pub use self::core::{block_entry, tenant_tier, Core, Dynamic, Runtime, RuntimeError, TenantTable};
pub use self::custom::Attrs;
pub use self::limits::{decide, Who};
pub use self::pipeline::{admit_at, blocked_ip, ip_blocked, ip_blocked_at};
pub use self::routes::RouteLive;
use crate::identity::{KeyInfo, Presented};
use crate::limiter::{Quota, Scope, WindowDecision};
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
    /// What custom scopes read (headers, query; empty for the decision APIs).
    pub attrs: Attrs<'a>,
    /// Shared scopes another part of the same call already spent (the rate-limit
    /// service's later descriptors); default: none.
    pub skip: Skip,
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
    /// A rate-limit service descriptor without `remote_address`: no client address, so
    /// nothing keyed by one applies (IP blocks and bans, the `ip` scope and a route's `ip`
    /// table, `[limits.auth]`); `client_ip` is a placeholder.
    Unaddressed,
}

impl Origin {
    /// Whether a rejection of this origin counts towards `rule`'s ban.
    pub fn strikes(self, rule: &crate::limiter::BanRule) -> bool {
        self == Origin::Proxy || rule.from_check
    }

    /// What a ban this origin strikes counts as: the decision APIs' bans may fill at most
    /// half of the table.
    pub fn ban_source(self) -> crate::bans::BanSource {
        match self {
            Origin::Proxy => crate::bans::BanSource::Proxy,
            Origin::Check | Origin::Unaddressed => crate::bans::BanSource::Check,
        }
    }

    /// Whether the request names a client address (all but `Unaddressed`).
    pub fn addressed(self) -> bool {
        self != Origin::Unaddressed
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
        /// The request method (a route's `methods` may not take it).
        method: &'a http::Method,
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
    /// 401: a Bearer JWT did not verify (signature, time, issuer, audience, algorithm,
    /// claims, or a tier no `[tiers.NAME]` defines).
    InvalidToken,
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
    /// 400: a custom scope's attribute is over 256 bytes, not text, or sent twice.
    InvalidIdentity(Scope),
    /// 400: a custom scope with `missing = "reject"` found no attribute.
    MissingIdentity(Scope),
    /// 405: a method the gateway does not forward (see `edge::target::method_allowed`).
    MethodNotAllowed,
    /// 400: the cost a `/v1/check` (or rate-limit service) call names is above the
    /// capacity of one of its windows, so no wait would ever admit it.
    CostOverCapacity {
        /// The cost asked.
        cost: u32,
        /// The smallest capacity below it.
        capacity: u32,
    },
    /// 503: a fail-closed scope could not reach its store.
    Unavailable,
    /// 503: the credential may be one not loaded yet (before the first database snapshot,
    /// or before the first `jwks_url` key set): answered `not_ready` with `Retry-After`,
    /// never 401, and not counted as a failed lookup.
    NotReady,
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
    /// What the access log and the trace say of the refused request (only when
    /// `Core::observed`: one pointer otherwise).
    pub seen: Option<Box<RefusalSeen>>,
}

/// What a refused request showed before its refusal (see `Refusal::seen`).
#[derive(Debug, Clone, Default)]
pub struct RefusalSeen {
    /// The resolved client address, when the request had one.
    pub client_ip: Option<IpAddr>,
    /// The caller's key, when it was identified before the refusal.
    pub key: Option<Arc<KeyInfo>>,
    /// The store call, when the refusal made one.
    pub store_span: Option<StoreSpan>,
}

impl RefusalSeen {
    /// A request refused knowing only its client address.
    pub fn at(client_ip: IpAddr) -> Self {
        Self {
            client_ip: Some(client_ip),
            ..Self::default()
        }
    }
}

/// A store call: when it started and how long it took.
pub type StoreSpan = (tokio::time::Instant, std::time::Duration);

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
    /// The store call of the rate windows, when `Core::observed` (for the trace).
    pub store_span: Option<Box<StoreSpan>>,
    /// When the store decided each scope, on its own clock (what a settle names).
    decided_at: crate::limiter::DecidedAt,
    /// The custom scopes' identities the request was charged under.
    customs: custom::Identities,
    /// The tables that applied, as decided (scaled by the route's adaptive factor): what a
    /// settle charges or refunds, and what `/v1/usage`, simulate and the RLS report.
    pub applied: Applied,
    /// Whether the store charged the rate windows (not when it failed open, or the local
    /// fallback decided): only then is there a cost to settle.
    charged: bool,
    settled: bool,
    /// Once the upstream answered: the check positions `count_on` refunded (a bit each),
    /// which a settle leaves alone (`settle_outcome`).
    uncounted: Option<u32>,
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
            seen: None,
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
        let tables = Tables {
            rt: &self.runtime,
            key: self.key.as_deref(),
            route: self.route.as_deref().map(|r| &r.route),
        };
        // The same tables, at the same (scaled) limits, in the same positions as decided;
        // less those an outcome already refunded.
        let all = self.applied.check(tables, reserved);
        let uncounted = self.uncounted.unwrap_or(0);
        let (check, at) = all.part(self.decided_at, |i| uncounted & (1 << i) == 0);
        l.store.settle(&check, delta, at);
        l.held.cost = actual;
        metrics.cost_settled(delta);
        settle_rate(&mut self.rate, &check, delta);
        delta
    }

    /// Who the request was charged as (its address, key, route and custom identities).
    pub fn who(&self) -> Who<'_> {
        Who {
            client_ip: Some(self.client_ip),
            key: self.key.as_deref(),
            route: self.route.as_deref().map(|r| &r.route),
            customs: &self.customs,
        }
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

/// The headers' governing window (`rate`) as settled by `delta` on `check` (remaining,
/// reset).
fn settle_rate(rate: &mut Option<WindowDecision>, check: &crate::limiter::Check<'_>, delta: i64) {
    let Some(wd) = rate else { return };
    let limit = check
        .scopes
        .iter()
        .filter(|s| s.scope == wd.scope)
        .flat_map(|s| s.limits.windows.iter())
        .find(|w| w.window == wd.window)
        .copied();
    if let Some(limit) = limit {
        wd.decision = crate::limiter::algorithm::settled(&wd.decision, &limit, delta);
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_jwt;
#[cfg(test)]
mod tests_tables;
