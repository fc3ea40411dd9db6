//! `GET /v1/routes` (admin token): the running config's routes and limits as loaded, for
//! the console and for operators checking what a reload applied.
//!
//! Redacted by construction: it is built field by field from what limits and routes
//! traffic (names, matches, windows, tiers), never from the config's text, so no token,
//! API key, database or store URL, or upstream credential can appear. Upstreams are the
//! resolved socket addresses; keys are not listed at all (`/v1/keys` lists their ids).
//! Tiers are the config's `[tiers.*]`; database policies are `/v1/policies`.

use serde_json::{json, Value};

use super::json_reply;
use crate::admission::Core;
use crate::config::{Auth, Counts, Mode, Route};
use crate::limiter::ScopeLimits;
use crate::reply::Reply;

/// Answers `GET /v1/routes` (the caller checked the admin token).
pub(super) fn routes(core: &Core) -> Reply {
    let rt = core.runtime();
    let config = &rt.config;
    let routes: Vec<Value> = config.routes.iter().map(route_json).collect();
    let mut tiers: Vec<(&String, Value)> = config
        .tiers
        .iter()
        .map(|(name, t)| {
            let body = json!({"key": limits_json(&t.key), "tenant": limits_json(&t.tenant)});
            (name, body)
        })
        .collect();
    tiers.sort_by(|a, b| a.0.cmp(b.0));
    let scopes: Vec<Value> = config
        .scopes
        .iter()
        .map(|c| json!({"scope": c.scope.as_str(), "limits": c.limits.as_deref().map(limits_json)}))
        .collect();
    let body = json!({
        "routes": routes,
        "limits": {
            "ip": config.ip_limits.as_deref().map(limits_json),
            "global": config.global_limits.as_deref().map(limits_json),
            "auth": config.auth_limits.as_deref().map(limits_json),
        },
        "tiers": tiers.into_iter().map(|(n, t)| (n.clone(), t)).collect::<serde_json::Map<_, _>>(),
        "scopes": scopes,
    });
    json_reply(200, &body)
}

fn route_json(r: &Route) -> Value {
    let limits: Vec<Value> = r
        .limits
        .iter()
        .map(|l| {
            let counts = match l.counts {
                Counts::Ip => "ip",
                Counts::Key => "key",
                Counts::Tenant => "tenant",
                Counts::Global => "global",
                Counts::Custom(_) => "custom",
            };
            json!({"scope": l.scope.as_str(), "counts": counts, "limits": limits_json(&l.limits)})
        })
        .collect();
    json!({
        "name": &*r.name,
        "host": r.host,
        "path_prefix": r.path_prefix,
        "methods": r.methods.as_ref().map(|m| m.iter().map(|m| m.as_str().to_string()).collect::<Vec<_>>()),
        "auth": match r.auth {
            Auth::Required => "required",
            Auth::Optional => "optional",
            Auth::None => "none",
        },
        "mode": match r.mode {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        },
        "cost": r.cost,
        "upstreams": r.upstreams.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "limits": limits,
    })
}

/// A scope's windows (`1m`, limit, algorithm) and its concurrency cap.
fn limits_json(l: &ScopeLimits) -> Value {
    let windows: Vec<Value> = l
        .windows
        .iter()
        .map(|w| json!({"window": w.window.label(), "limit": w.limit, "algorithm": w.algorithm.as_str()}))
        .collect();
    json!({"windows": windows, "concurrent": l.concurrent})
}
