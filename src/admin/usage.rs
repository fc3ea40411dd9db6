//! `GET /v1/usage?key_id=K` (or `tenant=T`, `ip=A`): every window that applies to that
//! identity, with `limit`, `used`, `remaining` and `reset` (Unix seconds), read without
//! spending.
//!
//! The identity is built as the pipeline builds a caller, and its windows come from the
//! one derivation of the limits that apply (`admission::Applied`): the identity's own
//! scopes (a key's and its tenant's, by the one tenant-tier rule; a tenant's; an
//! address's `ip`), `[limits.global]` (every caller spends it), and every route table
//! that counts the identity or the route's traffic as a whole (`login.ip`, named with its
//! `route`). Custom scopes count request attributes a key, tenant or address does not
//! name, so they are not listed. A JWT caller is `key_id=jwt:<sub>` (its key-scope
//! identity), at the `[auth.jwt] default_tier` unless `tier=<name>` names the tier its
//! tokens carry; it has no tenant here (a token's tenant comes from its claims).
//!
//! Parameters are `application/x-www-form-urlencoded` (percent-decoded, `+` a space).
//! Each window is read by one peek check (`Check::peek`, cost 1), so each window's own
//! decision comes back as `governing`. On Redis with leases, tokens a gateway leased but
//! has not spent yet count as used (Redis charged them at grant); a peek while this
//! gateway holds a usable lease of the window is answered from that lease.

use std::net::IpAddr;
use std::sync::Arc;

use super::dbapi::invalid_field;
use super::json_reply;
use crate::adaptive::Factor;
use crate::admission::{decide, Applied, Core, Dynamic, Runtime, Skip, Table, Tables, Who};
use crate::identity::{KeyInfo, JWT_PREFIX};
use crate::limiter::{Check, ScopeLimits};
use crate::reply::headers::unspent;
use crate::reply::{error_reply, Reply};

/// The identity a usage query names: an address, or a caller (a key, a JWT subject, a
/// tenant alone).
enum Subject {
    Caller(Arc<KeyInfo>),
    Ip(IpAddr),
}

/// One window to report: its entry's scope and identity, its limits, and the route of a
/// route table.
struct Row<'a> {
    entry: &'a crate::admission::applied::Entry,
    limits: &'a ScopeLimits,
    route: Option<&'a str>,
}

/// Answers `GET /v1/usage` (the caller checked the admin token).
pub(super) async fn usage(core: &Core, query: Option<&str>) -> Reply {
    let (rt, dynamic) = (core.runtime(), core.dynamic());
    let subject = match subject(&rt, &dynamic, query.unwrap_or("")) {
        Ok(s) => s,
        Err(reply) => return reply,
    };
    let (client_ip, key) = match &subject {
        Subject::Caller(k) => (None, Some(&**k)),
        Subject::Ip(ip) => (Some(*ip), None),
    };
    let who = |route| Who {
        client_ip,
        key,
        route,
        customs: &[],
    };
    let base = Applied::of(&rt, who(None), Skip::default(), Factor::ONE);
    let routes: Vec<(Applied, &crate::config::Route)> = rt
        .config
        .routes
        .iter()
        .filter(|r| !r.limits.is_empty())
        .map(|r| {
            (
                Applied::of(&rt, who(Some(r)), Skip::default(), Factor::ONE),
                r,
            )
        })
        .collect();
    let mut rows = rows(&base, tables(&rt, key, None), None);
    for (applied, route) in &routes {
        let own = rows_of_route(applied, tables(&rt, key, Some(route)), &route.name);
        rows.extend(own);
    }
    let mut windows = Vec::new();
    for row in &rows {
        match read(core, row).await {
            Ok(mut w) => windows.append(&mut w),
            Err(detail) => {
                let body = serde_json::json!({"error": "store_unavailable", "detail": detail});
                return json_reply(503, &body);
            }
        }
    }
    json_reply(200, &serde_json::json!({ "windows": windows }))
}

fn tables<'a>(
    rt: &'a Runtime,
    key: Option<&'a KeyInfo>,
    route: Option<&'a crate::config::Route>,
) -> Tables<'a> {
    Tables { rt, key, route }
}

/// The rows of every entry of `applied`.
fn rows<'a>(applied: &'a Applied, t: Tables<'a>, route: Option<&'a str>) -> Vec<Row<'a>> {
    applied
        .entries()
        .iter()
        .enumerate()
        .filter_map(|(i, entry)| {
            let limits = applied.limits(t, i)?;
            Some(Row {
                entry,
                limits,
                route,
            })
        })
        .collect()
}

/// The rows of `applied`'s route tables only (its other entries are the base's).
fn rows_of_route<'a>(applied: &'a Applied, t: Tables<'a>, route: &'a str) -> Vec<Row<'a>> {
    let mut out = rows(applied, t, Some(route));
    out.retain(|r| matches!(r.entry.table, Table::Route(_)));
    out
}

/// Each window of `row`, read by a peek.
///
/// # Errors
/// The store's error, as text.
async fn read(core: &Core, row: &Row<'_>) -> Result<Vec<serde_json::Value>, String> {
    let mut out = Vec::new();
    for w in &row.limits.windows {
        let one = ScopeLimits {
            windows: vec![*w],
            ..row.limits.clone()
        };
        let mut check = Check::new(1);
        check.peek = true;
        check.push(row.entry.scope, row.entry.ident.clone(), &one);
        // Read before the store's clock is: `now + reset_after_ms` is then at most the
        // window's end, never a rounding second past it (a store's own `now` is later).
        let now_ms = core.clock.now_ms();
        let verdict = decide(core, &check).await.map_err(|e| e.to_string())?;
        let Some(g) = verdict.governing else { continue };
        let d = g.decision;
        // A peek of one unit reports what is left after it: added back on a pass.
        let remaining = unspent(verdict.allowed, d.remaining, 1, d.limit);
        let reset_ms = now_ms.saturating_add(d.reset_after_ms);
        let mut window = serde_json::json!({
            "scope": row.entry.scope.short_name(),
            "window": g.window.label(),
            "limit": d.limit,
            "used": d.limit - remaining,
            "remaining": remaining,
            "reset": reset_ms.div_ceil(1000),
        });
        if let Some(route) = row.route {
            window["route"] = serde_json::Value::from(route);
        }
        out.push(window);
    }
    Ok(out)
}

/// The one identity of the query: `key_id` (an API key id, or `jwt:<sub>` with an
/// optional `tier`), `tenant` or `ip`, percent-decoded.
fn subject(rt: &Runtime, dynamic: &Dynamic, query: &str) -> Result<Subject, Reply> {
    let exactly_one = || invalid_field("key_id", "exactly one of key_id, tenant or ip is required");
    let mut pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .map(|(n, v)| (n.into_owned(), v.into_owned()))
        .collect();
    let tier = pairs
        .iter()
        .position(|(n, _)| n == "tier")
        .map(|i| pairs.remove(i).1);
    if pairs.iter().any(|(n, _)| n == "tier") {
        return Err(invalid_field("tier", "tier is given twice"));
    }
    let [(name, value)] = <[(String, String); 1]>::try_from(pairs).map_err(|_| exactly_one())?;
    if tier.is_some() && !(name == "key_id" && value.starts_with(JWT_PREFIX)) {
        return Err(invalid_field(
            "tier",
            "tier only goes with key_id=jwt:<sub>",
        ));
    }
    match name.as_str() {
        "key_id" => match value.strip_prefix(JWT_PREFIX) {
            Some(sub) => jwt_caller(rt, dynamic, sub, tier.as_deref()),
            None => key(rt, dynamic, &value).ok_or_else(|| error_reply(404, "not_found")),
        },
        "tenant" => tenant(rt, dynamic, &value).ok_or_else(|| error_reply(404, "not_found")),
        "ip" => value
            .trim()
            .parse::<IpAddr>()
            .map(|ip| Subject::Ip(crate::client_ip::canonical(ip)))
            .map_err(|_| invalid_field("ip", "ip must be an IPv4 or IPv6 address")),
        _ => Err(exactly_one()),
    }
}

/// The API key of id `id` (the database snapshot's first: it holds the config's keys
/// with the database's policies).
fn key(rt: &Runtime, dynamic: &Dynamic, id: &str) -> Option<Subject> {
    let all = dynamic.keys.iter().chain(rt.keys.iter());
    all.map(|(_, k)| k)
        .find(|k| &*k.key_id == id)
        .map(|k| Subject::Caller(k.clone()))
}

/// The tenant `id` alone: its tier by the tenant-tier rule, else the one its keys carry.
fn tenant(rt: &Runtime, dynamic: &Dynamic, id: &str) -> Option<Subject> {
    let of_keys = || {
        let all = dynamic.keys.iter().chain(rt.keys.iter());
        all.map(|(_, k)| k)
            .find(|k| k.tenant_id() == Some(id))
            .map(|k| k.tenant_tier.clone())
    };
    let tier = dynamic.tenant_tier(&rt.config, id).or_else(of_keys)?;
    Some(Subject::Caller(KeyInfo::tenant_only(id, tier)))
}

/// The JWT caller `jwt:<sub>` at `tier` (else the `[auth.jwt] default_tier`).
fn jwt_caller(
    rt: &Runtime,
    dynamic: &Dynamic,
    sub: &str,
    tier: Option<&str>,
) -> Result<Subject, Reply> {
    let Some(jwt) = &rt.config.jwt else {
        return Err(error_reply(404, "not_found"));
    };
    if sub.is_empty() {
        return Err(invalid_field(
            "key_id",
            "jwt: needs the token's subject after it",
        ));
    }
    let Some(name) = tier.or(jwt.default_tier.as_deref()) else {
        return Err(invalid_field(
            "tier",
            "[auth.jwt] has no default_tier: name the tier of the subject's tokens",
        ));
    };
    let Some(tier) = dynamic.tier(&rt.config, name) else {
        return Err(invalid_field("tier", "no such tier"));
    };
    let caller = KeyInfo::jwt(sub, None, (tier.clone(), tier), Vec::new());
    Ok(Subject::Caller(caller))
}
