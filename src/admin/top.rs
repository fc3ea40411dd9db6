//! `GET /v1/top?scope=key&n=10` (admin token): the approximate heaviest identities of the
//! last 60 s of one scope, from the sketch the admission pipeline feeds (`crate::top`).
//!
//! `scope` is `ip`, `key` or `tenant` (required); `n` a positive integer, 10 when absent
//! and at most `MAX_N` (a larger `n` is capped). Anything else is 400 `invalid_request`.

use serde::Serialize;

use super::{invalid, json_reply};
use crate::admission::Core;
use crate::limiter::Scope;
use crate::reply::Reply;
use crate::top::WINDOW_SECS;

/// Identities answered when `n` is absent.
const DEFAULT_N: usize = 10;
/// Most identities answered.
pub(super) const MAX_N: usize = 100;

#[derive(Serialize)]
struct TopResponse {
    scope: &'static str,
    window_secs: u64,
    top: Vec<Entry>,
}

#[derive(Serialize)]
struct Entry {
    identity: String,
    requests: u64,
    rejected: u64,
}

/// A parsed query.
#[derive(Debug, PartialEq, Eq)]
struct Query {
    scope: Scope,
    n: usize,
}

/// Answers the query (the caller checked the admin token).
pub(super) fn top(core: &Core, query: Option<&str>) -> Reply {
    let q = match parse(query.unwrap_or("")) {
        Ok(q) => q,
        Err(detail) => return invalid(detail),
    };
    let configured = match q.scope {
        Scope::Named(_) => core
            .runtime()
            .config
            .scopes
            .iter()
            .any(|c| c.scope == q.scope),
        _ => true,
    };
    let Some(sketch) = core.top.scope(q.scope).filter(|_| configured) else {
        return invalid(SCOPES);
    };
    let top = sketch
        .top(q.n, core.clock.now_ms())
        .into_iter()
        .map(|h| Entry {
            identity: h.identity.to_string(),
            requests: h.requests,
            rejected: h.rejected,
        })
        .collect();
    json_reply(
        200,
        &TopResponse {
            scope: q.scope.as_str(),
            window_secs: WINDOW_SECS,
            top,
        },
    )
}

const SCOPES: &str = "scope must be ip, key, tenant or a custom scope's name";

/// `scope` and `n` from a query string; other parameters are ignored.
fn parse(query: &str) -> Result<Query, &'static str> {
    let (mut scope, mut n) = (None, DEFAULT_N);
    for (name, value) in query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
    {
        match name {
            "scope" => {
                scope = match Scope::parse(value) {
                    Some(s @ (Scope::Ip | Scope::Key | Scope::Tenant | Scope::Named(_))) => Some(s),
                    _ => return Err(SCOPES),
                }
            }
            "n" => {
                n = match value.parse::<usize>() {
                    Ok(v) if v > 0 => v.min(MAX_N),
                    _ => return Err("n must be a positive integer"),
                }
            }
            _ => {}
        }
    }
    let scope = scope.ok_or("scope is required (ip, key, tenant or a custom scope's name)")?;
    Ok(Query { scope, n })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Query strings and what they parse to.
    #[test]
    fn top_query_parses_scope_and_n() {
        let ok = |scope, n| Ok(Query { scope, n });
        let cases: [(&str, Result<Query, &str>); 11] = [
            ("scope=key&n=10", ok(Scope::Key, 10)),
            ("scope=ip", ok(Scope::Ip, DEFAULT_N)),
            ("n=3&scope=tenant", ok(Scope::Tenant, 3)),
            ("scope=key&n=100000", ok(Scope::Key, MAX_N)),
            ("scope=key&other=1", ok(Scope::Key, DEFAULT_N)),
            ("scope=global", Err(SCOPES)),
            ("scope=KEY", Err(SCOPES)),
            ("scope=key&n=0", Err("n must be a positive integer")),
            ("scope=key&n=-1", Err("n must be a positive integer")),
            ("scope=key&n=", Err("n must be a positive integer")),
            (
                "",
                Err("scope is required (ip, key, tenant or a custom scope's name)"),
            ),
        ];
        for (query, want) in cases {
            assert_eq!(parse(query), want, "{query:?}");
        }
    }
}
