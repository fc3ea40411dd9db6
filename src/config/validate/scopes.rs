//! `[scopes.<name>]` (custom scopes on request attributes), `[limits.<name>]` beyond the
//! built-in tables, and each route's `limits`.

use super::*;
use crate::limiter::{Base, Named, Scope, MAX_NAMED, MAX_SCOPES, MAX_SLOTS};

/// Names a custom scope may not take: the built-in scopes, and `concurrent` (the scope a
/// 429 of the concurrency slots names).
const RESERVED: [&str; 6] = ["ip", "key", "tenant", "global", "auth", "concurrent"];

/// The name before the rate-limit service's domain scopes (`rls:<domain>`): a custom scope
/// `rls` would have the Redis keys of a domain's counters (`{rls:<domain>:<counter>}` is
/// also `{rls:<value>}` for the value `<domain>:<counter>`).
const DOMAINS: &str = "rls";

/// `[scopes.*]` with their `[limits.<name>]`, in name order; any other `[limits.*]` table
/// than `ip`, `global`, `auth` or a custom scope's is an error at that table.
pub(super) fn custom_scopes(
    cx: &Ctx<'_>,
    raw: &File,
    on_failure: OnFailure,
) -> Result<Vec<CustomScope>, ConfigError> {
    let mut out = Vec::with_capacity(raw.scopes.len());
    for (name, def) in &raw.scopes {
        if let Err(why) = custom_name(name) {
            return Err(cx.err(def.span(), format!("[scopes.{name}]: {why}")));
        }
        let d = def.get_ref();
        let from = attribute(d.from.get_ref()).map_err(|e| cx.err(d.from.span(), e))?;
        if out.len() == MAX_NAMED {
            return Err(cx.err(def.span(), too_many_named(&format!("[scopes.{name}]"))));
        }
        let scope = Scope::Named(Named::custom(name));
        let limits = match raw.limits.0.get(name) {
            Some(s) => {
                let label = format!("[limits.{name}]");
                let built = scope_table(cx, s.get_ref(), on_failure);
                Some(Arc::new(applying(cx, s, &label, built)?))
            }
            None => None,
        };
        out.push(CustomScope {
            scope,
            from,
            missing: match d.missing {
                Some(MissingFile::Reject) => Missing::Reject,
                Some(MissingFile::Skip) | None => Missing::Skip,
            },
            limits,
        });
    }
    for (name, table) in &raw.limits.0 {
        if !matches!(name.as_str(), "ip" | "global" | "auth") && !raw.scopes.contains_key(name) {
            return Err(cx.err(
                table.span(),
                unknown_table(&format!("[limits.{name}]"), name),
            ));
        }
    }
    Ok(out)
}

/// The claims `jwt:<claim>` scopes read go to the verifier's settings; such a scope
/// without `[auth.jwt]` is an error at its `from`.
pub(super) fn jwt_scope_claims(
    cx: &Ctx<'_>,
    raw: &File,
    scopes: &[CustomScope],
    jwt: Option<&mut Jwt>,
) -> Result<(), ConfigError> {
    let claims: Vec<String> = scopes
        .iter()
        .filter_map(|c| match &c.from {
            Attribute::Jwt(claim) => Some(claim.clone()),
            _ => None,
        })
        .collect();
    match jwt {
        Some(j) => j.settings.scope_claims = claims,
        None => {
            let needs = raw.scopes.values().map(|d| &d.get_ref().from);
            if let Some(from) = needs.into_iter().find(|f| f.get_ref().starts_with("jwt:")) {
                let msg = format!(
                    "from = {:?} reads a JWT claim: it needs [auth.jwt]",
                    from.get_ref()
                );
                return Err(cx.err(from.span(), msg));
            }
        }
    }
    Ok(())
}

/// Custom scopes may not read what carries a credential: `Authorization` (API keys and
/// JWTs), the `key_header` or the `key_query` parameter; an error at the scope's `from`.
/// (A credential as an identity would put the raw key in Redis keys, bans and `/v1/top`.)
pub(super) fn credential_scopes(
    cx: &Ctx<'_>,
    raw: &File,
    scopes: &[CustomScope],
    auth: &KeySources,
) -> Result<(), ConfigError> {
    for (c, (name, def)) in scopes.iter().zip(&raw.scopes) {
        let what = match &c.from {
            Attribute::Header(h) if *h == http::header::AUTHORIZATION => {
                "Authorization (API keys and JWTs)"
            }
            Attribute::Header(h) if *h == auth.key_header => {
                "the API key header ([auth] key_header)"
            }
            Attribute::Query(q) if auth.key_query.as_deref() == Some(q.as_str()) => {
                "the API key parameter ([auth] key_query)"
            }
            _ => continue,
        };
        let from = &def.get_ref().from;
        let msg = format!(
            "[scopes.{name}] from = {:?} reads a credential, {what}: a custom scope may not",
            from.get_ref()
        );
        return Err(cx.err(from.span(), msg));
    }
    Ok(())
}

/// The budget of named scopes one config may have, spent at `what`.
fn too_many_named(what: &str) -> String {
    format!("{what}: more than {MAX_NAMED} named scopes (custom scopes and route scope tables) in one config")
}

/// A scope table of a custom scope or a route: every key of `[limits.ip]` applies.
fn scope_table(
    cx: &Ctx<'_>,
    s: &ScopeFile,
    on_failure: OnFailure,
) -> Result<ScopeLimits, ConfigError> {
    scope(cx, s, &Inherit::default(), on_failure)
}

fn unknown_table(table: &str, name: &str) -> String {
    match name {
        "key" | "tenant" => format!(
            "{table}: key and tenant limits are set per tier ([tiers.<name>] {name} = {{ ... }})"
        ),
        _ => format!("{table}: no scope {name:?} (ip, key, tenant, global, or a [scopes.{name}] custom scope)"),
    }
}

/// `[a-z][a-z0-9_]{0,31}`, not a reserved name.
fn custom_name(name: &str) -> Result<(), String> {
    if RESERVED.contains(&name) {
        return Err(format!("{name:?} is a built-in scope; pick another name"));
    }
    if name == DOMAINS {
        return Err(format!(
            "{name:?} names the rate-limit service's domains (rls:<domain>); pick another name"
        ));
    }
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_lowercase());
    let rest_ok = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !first_ok || !rest_ok || name.len() > 32 {
        return Err(format!(
            "{name:?} is not a scope name (a lower-case letter, then up to 31 of a-z, 0-9, _)"
        ));
    }
    Ok(())
}

/// `from`: `header:<Name>`, `query:<param>`, `cookie:<name>`, `path:<n>`, `jwt:<claim>`.
pub(super) fn attribute(from: &str) -> Result<Attribute, String> {
    let bad = || {
        format!("from = {from:?}: expected \"header:<Name>\", \"query:<param>\", \"cookie:<name>\", \"path:<n>\" or \"jwt:<claim>\"")
    };
    let (kind, arg) = from.split_once(':').ok_or_else(bad)?;
    if arg.is_empty() || arg.len() > 128 || arg.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(bad());
    }
    Ok(match kind {
        "header" => Attribute::Header(
            http::HeaderName::from_bytes(arg.to_ascii_lowercase().as_bytes())
                .map_err(|_| format!("from = {from:?}: {arg:?} is not a header name"))?,
        ),
        "query" => Attribute::Query(arg.to_string()),
        "cookie" => Attribute::Cookie(arg.to_string()),
        "path" => match arg.parse::<usize>() {
            Ok(n) if (1..=64).contains(&n) => Attribute::Path(n),
            _ => return Err(format!("from = {from:?}: the segment must be from 1 to 64")),
        },
        "jwt" => Attribute::Jwt(arg.to_string()),
        _ => return Err(bad()),
    })
}

/// Each route's `limits`, resolved against the custom scopes; also bounds the scopes one
/// request of the route can meet by [`MAX_SCOPES`].
pub(super) fn route_limits(
    cx: &Ctx<'_>,
    raw: &[Spanned<RouteFile>],
    routes: &mut [Route],
    customs: &[CustomScope],
    (builtin, builtin_slots): (usize, usize),
    on_failure: OnFailure,
) -> Result<(), ConfigError> {
    let global_customs = customs.iter().filter(|c| c.limits.is_some()).count();
    let mut named = customs.len();
    let slotted = |l: &ScopeLimits| l.concurrent.is_some();
    let global_slots = customs
        .iter()
        .filter(|c| c.limits.as_deref().is_some_and(slotted))
        .count()
        + builtin_slots;
    // A request that matches no route meets the built-in and custom scopes alone.
    if builtin + global_customs > MAX_SCOPES || global_slots > MAX_SLOTS {
        let at = raw.first().map_or(0..0, |r| r.get_ref().name.span());
        return Err(cx.err(
            at,
            too_many("a request", builtin + global_customs, global_slots),
        ));
    }
    for (route, r) in routes.iter_mut().zip(raw) {
        let r = r.get_ref();
        if r.limits.0.is_empty() {
            continue;
        }
        let name = route.name.to_string();
        limited_route_name(cx, r, &name)?;
        for (scope_name, table) in &r.limits.0 {
            named += 1;
            if named > MAX_NAMED {
                let label = format!("[routes.limits.{scope_name}] of route {name:?}");
                return Err(cx.err(table.span(), too_many_named(&label)));
            }
            let cost = route.cost;
            let t = route_table(cx, &name, (scope_name, table), customs, cost, on_failure)?;
            route.limits.push(t);
        }
        let most = builtin + global_customs + route.limits.len();
        let slots = global_slots + route.limits.iter().filter(|t| slotted(&t.limits)).count();
        if most > MAX_SCOPES || slots > MAX_SLOTS {
            let what = format!("route {name:?}: a request");
            return Err(cx.err(r.name.span(), too_many(&what, most, slots)));
        }
    }
    Ok(())
}

/// A route with limits names its counters: 1 to 64 of A-Z, a-z, 0-9, `_` and `-`.
fn limited_route_name(cx: &Ctx<'_>, r: &RouteFile, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        return Ok(());
    }
    Err(cx.err(
        r.name.span(),
        format!("route {name:?} has limits: its name must be 1 to 64 of A-Z, a-z, 0-9, _ and - (it names the route's counters)"),
    ))
}

/// Route `route`'s table `limits.<scope_name>`: its own named scope (`<route>.<scope>`).
fn route_table(
    cx: &Ctx<'_>,
    route: &str,
    (scope_name, table): (&String, &Spanned<ScopeFile>),
    customs: &[CustomScope],
    cost: u32,
    on_failure: OnFailure,
) -> Result<RouteLimit, ConfigError> {
    let label = format!("[routes.limits.{scope_name}] of route {route:?}");
    let (base, counts) = match scope_name.as_str() {
        "ip" => (Base::Ip, Counts::Ip),
        "key" => (Base::Key, Counts::Key),
        "tenant" => (Base::Tenant, Counts::Tenant),
        "global" => (Base::Global, Counts::Global),
        other => match customs.iter().position(|c| c.scope.as_str() == other) {
            Some(i) => (Base::Custom(customs[i].scope.as_str()), Counts::Custom(i)),
            None => return Err(cx.err(table.span(), unknown_table(&label, other))),
        },
    };
    let s = table.get_ref();
    if let (Counts::Global, Some(b)) = (counts, &s.ban) {
        let msg =
            format!("{label}: ban does not apply to a global table (it would block everyone)");
        return Err(cx.err(b.span(), msg));
    }
    let limits = applying(cx, table, &label, scope_table(cx, s, on_failure))?;
    if let Err(e) = crate::config::check_cost(&limits, cost) {
        let why = match e {
            crate::config::LimitError::BelowCost {
                field,
                capacity,
                cost,
            } => format!(
                "{field} = {capacity} is below the route's cost {cost}: no request could ever pass"
            ),
            other => other.to_string(),
        };
        return Err(cx.err(table.span(), format!("{label}: {why}")));
    }
    Ok(RouteLimit {
        scope: Scope::Named(Named::intern(Some(route), base)),
        counts,
        limits: Arc::new(limits),
    })
}

fn too_many(what: &str, scopes: usize, slots: usize) -> String {
    if scopes > MAX_SCOPES {
        format!("{what} could meet {scopes} scopes (built-in, custom and the route's own); at most {MAX_SCOPES}")
    } else {
        format!("{what} could need {slots} concurrency slots (scopes with `concurrent`); at most {MAX_SLOTS}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_parse_or_say_why() {
        let ok = [
            (
                "header:X-User",
                Attribute::Header(http::HeaderName::from_static("x-user")),
            ),
            ("query:user", Attribute::Query("user".into())),
            ("cookie:session", Attribute::Cookie("session".into())),
            ("path:2", Attribute::Path(2)),
            ("jwt:org", Attribute::Jwt("org".into())),
        ];
        for (from, want) in ok {
            assert_eq!(attribute(from).unwrap(), want, "{from}");
        }
        for bad in [
            "header",
            "header:",
            "body:x",
            "path:0",
            "path:x",
            "header:a b",
            "header:é",
        ] {
            assert!(attribute(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn custom_names() {
        for ok in ["user", "u", "org_id", "a1234567890123456789012345678901"] {
            assert!(custom_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "ip",
            "key",
            "tenant",
            "global",
            "auth",
            "concurrent",
            "rls",
            "User",
            "1a",
            "_a",
            "a-b",
            "",
            "a12345678901234567890123456789012",
        ] {
            assert!(custom_name(bad).is_err(), "{bad}");
        }
    }
}
