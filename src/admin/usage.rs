//! `GET /v1/usage?key_id=K` (or `tenant=T`, `ip=A`): every window that applies to that
//! identity, with `limit`, `used`, `remaining` and `reset` (Unix seconds), read without
//! spending. The windows: the identity's own scopes (a key's and its tenant's; a tenant's;
//! an address's `ip`), `[limits.global]` (every caller spends it), and every route table
//! that counts the identity or the route's traffic as a whole (`login.ip`, named with its
//! `route`). Custom scopes count request attributes a key, tenant or address does not
//! name, so they are not listed. Each window is read by one peek check (`Check::peek`, cost 1) per window, so each window's own
//! decision comes back as `governing`. On Redis with leases, tokens a gateway leased but
//! has not spent yet count as used (Redis charged them at grant); the peek ends this
//! gateway's own lease of the window (its leftovers go back with the call, as with any
//! call for that window), so this gateway's share reads exact.

use std::net::IpAddr;
use std::sync::Arc;

use super::dbapi::invalid_field;
use super::json_reply;
use crate::admission::{decide, Core};
use crate::config::Counts;
use crate::identity::KeyInfo;
use crate::limiter::{Check, Ident, Scope, ScopeLimits};
use crate::reply::{error_reply, Reply};

/// The identity a usage query names.
enum Subject {
    Key(Arc<KeyInfo>),
    Tenant(Arc<str>, Arc<ScopeLimits>),
    Ip(IpAddr),
}

/// Answers `GET /v1/usage` (the caller checked the admin token).
pub(super) async fn usage(core: &Core, query: Option<&str>) -> Reply {
    let subject = match subject(core, query.unwrap_or("")) {
        Ok(s) => s,
        Err(reply) => return reply,
    };
    let rt = core.runtime();
    // (scope, identity, limits, the route of a route table).
    let mut scopes: Vec<(Scope, Ident, Arc<ScopeLimits>, Option<&str>)> = Vec::new();
    // What the subject is, to each kind of count a route table may keep.
    let mut counted: Vec<(Counts, Ident)> = vec![(Counts::Global, Ident::Global)];
    match &subject {
        Subject::Key(k) => {
            scopes.push((Scope::Key, k.key_ident.clone(), k.tier.key.clone(), None));
            scopes.push((
                Scope::Tenant,
                k.tenant_ident.clone(),
                k.tenant_tier.tenant.clone(),
                None,
            ));
            counted.push((Counts::Key, k.key_ident.clone()));
            counted.push((Counts::Tenant, k.tenant_ident.clone()));
        }
        Subject::Tenant(t, limits) => {
            let ident = Ident::Name(t.clone());
            scopes.push((Scope::Tenant, ident.clone(), limits.clone(), None));
            counted.push((Counts::Tenant, ident));
        }
        Subject::Ip(ip) => {
            let ident = Ident::client(*ip, rt.config.ipv6_prefix);
            if let Some(l) = &rt.config.ip_limits {
                scopes.push((Scope::Ip, ident.clone(), l.clone(), None));
            }
            counted.push((Counts::Ip, ident));
        }
    }
    if let Some(l) = &rt.config.global_limits {
        scopes.push((Scope::Global, Ident::Global, l.clone(), None));
    }
    for route in &rt.config.routes {
        for t in &route.limits {
            if let Some((_, ident)) = counted.iter().find(|(c, _)| *c == t.counts) {
                let name = Some(&*route.name);
                scopes.push((t.scope, ident.clone(), t.limits.clone(), name));
            }
        }
    }
    let mut windows = Vec::new();
    for (scope, ident, limits, route) in &scopes {
        for w in &limits.windows {
            let one = ScopeLimits {
                windows: vec![*w],
                ..(**limits).clone()
            };
            let mut check = Check::new(1);
            check.peek = true;
            check.push(*scope, ident.clone(), &one);
            let verdict = match decide(core, &check).await {
                Ok(v) => v,
                Err(e) => {
                    return json_reply(
                        503,
                        &serde_json::json!({"error": "store_unavailable", "detail": e.to_string()}),
                    )
                }
            };
            let Some(g) = verdict.governing else { continue };
            let d = g.decision;
            // A peek of one unit reports what is left after it: add it back on a pass.
            let remaining = if verdict.allowed {
                d.remaining.saturating_add(1).min(d.limit)
            } else {
                d.remaining
            };
            let reset_ms = core.clock.now_ms().saturating_add(d.reset_after_ms);
            let mut window = serde_json::json!({
                "scope": scope.short_name(),
                "window": g.window.label(),
                "limit": d.limit,
                "used": d.limit - remaining,
                "remaining": remaining,
                "reset": reset_ms.div_ceil(1000),
            });
            if let Some(route) = route {
                window["route"] = serde_json::Value::from(*route);
            }
            windows.push(window);
        }
    }
    json_reply(200, &serde_json::json!({ "windows": windows }))
}

/// The one identity of the query: `key_id`, `tenant` or `ip`.
fn subject(core: &Core, query: &str) -> Result<Subject, Reply> {
    let mut pairs = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")));
    let (Some((name, value)), None) = (pairs.next(), pairs.next()) else {
        return Err(invalid_field(
            "key_id",
            "exactly one of key_id, tenant or ip is required",
        ));
    };
    let dynamic = core.dynamic();
    let rt = core.runtime();
    match name {
        "key_id" => dynamic
            .keys
            .iter()
            .chain(rt.keys.iter())
            .find(|(_, k)| &*k.key_id == value)
            .map(|(_, k)| Subject::Key(k.clone()))
            .ok_or_else(|| error_reply(404, "not_found")),
        "tenant" => {
            let by_key = dynamic
                .keys
                .iter()
                .chain(rt.keys.iter())
                .find(|(_, k)| &*k.tenant == value);
            if let Some((_, k)) = by_key {
                return Ok(Subject::Tenant(
                    k.tenant.clone(),
                    k.tenant_tier.tenant.clone(),
                ));
            }
            let tier = dynamic
                .tenants
                .get(value)
                .or_else(|| rt.config.tenants.get(value))
                .and_then(|t| dynamic.tiers.get(t).or_else(|| rt.config.tiers.get(t)))
                .ok_or_else(|| error_reply(404, "not_found"))?;
            Ok(Subject::Tenant(Arc::from(value), tier.tenant.clone()))
        }
        "ip" => value
            .parse::<IpAddr>()
            .map(|ip| Subject::Ip(crate::client_ip::canonical(ip)))
            .map_err(|_| invalid_field("ip", "ip must be an IPv4 or IPv6 address")),
        _ => Err(invalid_field(
            "key_id",
            "exactly one of key_id, tenant or ip is required",
        )),
    }
}
