//! The pipeline behind `admit`, one function per step of the order in the module docs:
//! `screen` (IP block and bans), `route`, `identify` (key, key and tenant blocks and
//! bans), then `charge` (concurrency slots, then the layered limits).

use std::net::IpAddr;
use std::sync::Arc;

use super::applied::{Applied, Tables};
use super::core::{Core, Dynamic, Runtime};
use super::custom::{self, Identities};
use super::limits::{self, Charge, LimitOutcome, Who};
use super::{auth, bans, concurrency};
use super::{Admission, AdmitRequest, Lifetime, Origin, Refusal, RefusalSeen, Rejection, Target};
use crate::adaptive::Factor;
use crate::config::{Auth, Mode, Route};
use crate::identity::{KeyInfo, Presented};
use crate::limiter::{Ident, Scope};
use crate::routing::RouteEntry;
use crate::store::{Ending, Held, LimitStore};

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
    let mut seen = Seen {
        key: None,
        now_ms,
        customs: Identities::new(),
        store_span: std::sync::OnceLock::new(),
    };
    let result = pipeline(core, &runtime, req, &mut seen).await;
    let ip = req.origin.addressed().then_some(req.client_ip);
    count_top(core, &runtime, ip, &seen, &result);
    if !core.observed {
        return result.map_err(|r| r.on(runtime, now_ms));
    }
    let store_span = seen.store_span.get().copied();
    match result {
        Ok(mut a) => {
            a.store_span = store_span.map(Box::new);
            Ok(a)
        }
        Err(r) => Err(Refusal {
            seen: Some(Box::new(RefusalSeen {
                client_ip: ip,
                key: seen.key,
                store_span,
            })),
            ..r.on(runtime, now_ms)
        }),
    }
}

/// Counts the request for `GET /v1/top` (see the module docs).
fn count_top(
    core: &Core,
    rt: &Runtime,
    ip: Option<IpAddr>,
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
    if let Some(ip) = ip {
        let client = Ident::client(ip, rt.config.ipv6_prefix);
        top.record(Scope::Ip, &client, rejected, now_ms);
    }
    if let Some(k) = &seen.key {
        if let Some(ident) = &k.key_ident {
            top.record(Scope::Key, ident, rejected, now_ms);
        }
        if let Some(ident) = &k.tenant_ident {
            top.record(Scope::Tenant, ident, rejected, now_ms);
        }
    }
    for (c, ident) in rt.config.scopes.iter().zip(&seen.customs) {
        if let Some(ident) = ident {
            top.record(c.scope, ident, rejected, now_ms);
        }
    }
}

/// What the pipeline learned about a request, for `GET /v1/top` whatever the outcome.
#[derive(Default)]
struct Seen {
    /// The caller's key, once identified.
    key: Option<Arc<KeyInfo>>,
    /// The limiter clock reading of the decision.
    now_ms: u64,
    /// The custom scopes' identities, once read.
    customs: Identities,
    /// The store call, once made.
    store_span: std::sync::OnceLock<super::StoreSpan>,
}

/// One request's way through the steps: what every step reads.
struct Step<'a> {
    core: &'a Core,
    rt: &'a Runtime,
    /// One snapshot of the database state for the whole request.
    dynamic: Arc<Dynamic>,
    req: &'a AdmitRequest<'a>,
    now_ms: u64,
    /// Where the store call is timed (`Seen::store_span`).
    span: &'a std::sync::OnceLock<super::StoreSpan>,
}

/// The pipeline behind `admit`; `seen` is filled as the request is identified.
async fn pipeline(
    core: &Core,
    runtime: &Arc<Runtime>,
    req: &AdmitRequest<'_>,
    seen: &mut Seen,
) -> Result<Admission, Refusal> {
    let step = Step {
        core,
        rt: runtime,
        dynamic: core.dynamic(),
        req,
        now_ms: seen.now_ms,
        span: &seen.store_span,
    };
    step.screen()?;
    let route = step.route().await?;
    let refused = |rejection| Refusal {
        route: route.clone(),
        ..Refusal::from(rejection)
    };
    let key = step.identify(route.as_deref()).await.map_err(refused)?;
    seen.key.clone_from(&key);
    if let Some(k) = &key {
        step.screen_key(k).map_err(refused)?;
    }
    let customs = step
        .customs(route.as_deref().map(|r| &r.route), key.as_deref())
        .map_err(refused)?;
    if !customs.is_empty() {
        seen.customs.clone_from(&customs);
    }
    step.charge(runtime, route.clone(), key, customs)
        .await
        .map_err(refused)
}

impl Step<'_> {
    /// Step 1: an IP block, then the bans of the address (`ip`, and `auth` for guessing
    /// keys).
    fn screen(&self) -> Result<(), Rejection> {
        let (core, ip, now_ms) = (self.core, self.req.client_ip, self.now_ms);
        if !self.req.origin.addressed() {
            return Ok(());
        }
        if blocked_ip(self.rt, &self.dynamic, ip, now_ms) {
            return Err(Rejection::Blocked(Scope::Ip));
        }
        let client = Ident::client(ip, self.rt.config.ipv6_prefix);
        bans::check(core, Scope::Ip, &client, now_ms)?;
        bans::check(core, Scope::Auth, &client, now_ms)
    }

    /// Step 2: the route. A request no route matches still passes the ip and global
    /// limits before its 404, so probing for routes is rate limited too.
    async fn route(&self) -> Result<Option<Arc<RouteEntry>>, Rejection> {
        match self.req.target {
            Target::Match { host, path, method } => match self.rt.router.find(host, path, method) {
                Some(r) => Ok(Some(r.clone())),
                None => {
                    // The ip and global limits, as for any request, before the 404.
                    let who = self.who(None, None, &[]);
                    let applied = Applied::of(self.rt, who, self.req.skip, Factor::ONE);
                    let charge = self.charge_of(&applied, who, 1, Mode::Enforce);
                    let out = limits::limit(self.core, self.rt, &charge).await?;
                    Err(Rejection::NoRoute(out.verdict.governing))
                }
            },
            Target::Named(name) => match self.rt.router.find_by_name(name) {
                Some(r) => Ok(Some(r.clone())),
                None => Err(Rejection::UnknownRoute(name.to_string())),
            },
            Target::Any => Ok(None),
        }
    }

    /// Step 3: the key under the route's `auth`.
    async fn identify(
        &self,
        route: Option<&RouteEntry>,
    ) -> Result<Option<Arc<KeyInfo>>, Rejection> {
        let (core, rt, now_ms) = (self.core, self.rt, self.now_ms);
        let auth = route.map_or(Auth::Optional, |r| r.route.auth);
        let presented = match auth {
            Auth::None => Presented::Missing,
            _ => self.req.key,
        };
        let charged = auth::Charged {
            client_ip: self.req.client_ip,
            also: self.req.also_charge,
            origin: self.req.origin,
        };
        auth::identify(core, rt, &self.dynamic, presented, auth, charged, now_ms).await
    }

    /// Step 4: the blocks and bans of the key and its tenant (each in its namespace: a
    /// JWT caller's key scope is `jwt:<sub>`, and a token has a tenant only by its
    /// `tenant_claim`).
    fn screen_key(&self, k: &KeyInfo) -> Result<(), Rejection> {
        let (core, now_ms) = (self.core, self.now_ms);
        blocked_key(self.rt, &self.dynamic, k, now_ms)?;
        if let Some(ident) = &k.key_ident {
            bans::check(core, Scope::Key, ident, now_ms)?;
        }
        match &k.tenant_ident {
            Some(ident) => bans::check(core, Scope::Tenant, ident, now_ms),
            None => Ok(()),
        }
    }

    /// The custom scopes' identities (none configured: nothing read), and their bans.
    fn customs(
        &self,
        route: Option<&Route>,
        key: Option<&KeyInfo>,
    ) -> Result<Identities, Rejection> {
        let scopes = &self.rt.config.scopes;
        // The decision APIs carry no request attributes: their custom scopes are absent
        // (a `reject` scope does not refuse them).
        if scopes.is_empty() || self.req.origin != Origin::Proxy {
            return Ok(Identities::new());
        }
        let ids = custom::identities(
            (scopes, self.rt.config.server.case_insensitive_paths),
            (route, key),
            self.req,
        )?;
        for (c, ident) in scopes.iter().zip(&ids) {
            if let Some(ident) = ident {
                bans::check(self.core, c.scope, ident, self.now_ms)?;
            }
        }
        Ok(ids)
    }

    /// Who the request is, as the limits see it.
    fn who<'w>(
        &self,
        key: Option<&'w KeyInfo>,
        route: Option<&'w Route>,
        customs: &'w [Option<Ident>],
    ) -> Who<'w> {
        Who {
            client_ip: self.req.origin.addressed().then_some(self.req.client_ip),
            key,
            route,
            customs,
        }
    }

    /// The limits' view of the request: `applied` at `cost` in `mode`.
    fn charge_of<'k>(
        &'k self,
        applied: &'k Applied,
        who: Who<'k>,
        cost: u32,
        mode: Mode,
    ) -> Charge<'k> {
        Charge {
            applied,
            tables: Tables {
                rt: self.rt,
                key: who.key,
                route: who.route,
            },
            client_ip: self.req.client_ip,
            cost,
            mode,
            origin: self.req.origin,
            now_ms: self.now_ms,
            span: self.span,
        }
    }

    /// Steps 5 and 6: concurrency slots, then the layered limits, all or nothing, over the
    /// one list of tables that apply (`Applied`, scaled by an adaptive route's factor); a
    /// refusal of the limits gives the slots back at once.
    async fn charge(
        &self,
        runtime: &Arc<Runtime>,
        route: Option<Arc<RouteEntry>>,
        key: Option<Arc<KeyInfo>>,
        customs: Identities,
    ) -> Result<Admission, Rejection> {
        let (core, rt) = (self.core, self.rt);
        let r = route.as_ref().map(|r| &r.route);
        let cost = self.req.cost.or(r.map(|r| r.cost)).unwrap_or(1).max(1);
        let mode = r.map_or(Mode::Enforce, |r| r.mode);
        // An adaptive route's limits follow its upstream's health (see `adaptive`).
        let factor = match &route {
            // Only an adaptive route's state is looked up here (its adapter looks it up
            // for its counters when the request ends).
            Some(r) if r.route.adaptive.is_some() => core.route_state(r).factor(),
            _ => Factor::ONE,
        };
        let who = self.who(key.as_deref(), r, &customs);
        let applied = Applied::of(rt, who, self.req.skip, factor);
        let charge = self.charge_of(&applied, who, cost, mode);
        let slots = concurrency::acquire(core, &charge).await?;
        // From here the slots are held by a guard: if this future is dropped while the
        // rate windows are checked (a gRPC deadline, a client gone, a timeout layer), its
        // drop gives them back; a refusal gives them back at once.
        let mut guard = SlotGuard {
            store: &core.store,
            slots: Some(slots),
            ending: Ending::Dropped,
        };
        let out = match limits::limit(core, rt, &charge).await {
            Ok(out) => out,
            Err(rejection) => {
                guard.ending = Ending::Completed { status: 429 };
                return Err(rejection);
            }
        };
        let held = Held {
            cost,
            slots: guard.slots.take().unwrap_or_default(),
        };
        let caller = Caller {
            client_ip: self.req.client_ip,
            route,
            key,
            customs,
            applied,
        };
        Ok(admitted(
            core,
            runtime.clone(),
            caller,
            out,
            held,
            self.now_ms,
        ))
    }
}

/// Who an admitted request is: its route, its caller and the tables that applied.
pub(super) struct Caller {
    pub(super) client_ip: IpAddr,
    pub(super) route: Option<Arc<RouteEntry>>,
    pub(super) key: Option<Arc<KeyInfo>>,
    pub(super) customs: Identities,
    pub(super) applied: Applied,
}

/// The `Admission` of a request that passed every step.
fn admitted(
    core: &Core,
    runtime: Arc<Runtime>,
    caller: Caller,
    out: LimitOutcome,
    held: Held,
    now_ms: u64,
) -> Admission {
    let v = &out.verdict;
    // A shadow-mode would-be rejection was admitted, but the store charged nothing.
    let charged = v.allowed && v.scopes_checked != 0 && !v.fallback && v.failed_open == 0;
    Admission {
        client_ip: caller.client_ip,
        route: caller.route,
        key: caller.key,
        rate: out.verdict.governing,
        shadow_rejected: out.shadow_rejected,
        rate_policy: out.policy,
        decided_at: out.verdict.decided_at,
        customs: caller.customs,
        applied: caller.applied,
        now_ms,
        store_span: None,
        charged,
        settled: false,
        uncounted: None,
        lifetime: Some(Lifetime {
            store: core.store.clone(),
            held,
        }),
        runtime,
    }
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
    blocked_ip(&runtime, &core.dynamic(), ip, now_ms).then(|| Refusal {
        seen: core.observed.then(|| Box::new(RefusalSeen::at(ip))),
        ..Refusal::from(Rejection::Blocked(Scope::Ip)).on(runtime, now_ms)
    })
}

/// Whether `ip` is blocked by the config or the database / admin API.
pub fn blocked_ip(rt: &Runtime, dynamic: &Dynamic, ip: IpAddr, now_ms: u64) -> bool {
    rt.blocks.ip(ip, now_ms).is_some() || dynamic.blocks.ip(ip, now_ms).is_some()
}

/// 403 when the key or its tenant is blocked. A key block names the key scope's identity
/// (a key id, or `jwt:<sub>` for a token); a tenant block a tenant the caller really has.
fn blocked_key(
    rt: &Runtime,
    dynamic: &Dynamic,
    key: &KeyInfo,
    now_ms: u64,
) -> Result<(), Rejection> {
    if let Some(id) = key.key_scope_id() {
        if rt.blocks.key(id, now_ms).is_some() || dynamic.blocks.key(id, now_ms).is_some() {
            return Err(Rejection::Blocked(Scope::Key));
        }
    }
    if let Some(t) = key.tenant_id() {
        if rt.blocks.tenant(t, now_ms).is_some() || dynamic.blocks.tenant(t, now_ms).is_some() {
            return Err(Rejection::Blocked(Scope::Tenant));
        }
    }
    Ok(())
}
