//! `[[routes]]`: matching, upstreams, costs, timeouts, adaptive limits and health checks.

use super::*;

pub(super) fn routes(cx: &Ctx<'_>, list: &[Spanned<RouteFile>]) -> Result<Vec<Route>, ConfigError> {
    let mut names = HashSet::new();
    let mut out = Vec::with_capacity(list.len());
    for r in list {
        let r = r.get_ref();
        if !names.insert(r.name.get_ref().clone()) {
            return Err(cx.err(
                r.name.span(),
                format!("duplicate route name {:?}", r.name.get_ref()),
            ));
        }
        out.push(route(cx, r)?);
    }
    Ok(out)
}

/// One route, its values checked in the order they are written in the docs.
fn route(cx: &Ctx<'_>, r: &RouteFile) -> Result<Route, ConfigError> {
    let prefix = r.path_prefix.get_ref();
    if !prefix.starts_with('/') {
        return Err(cx.err(
            r.path_prefix.span(),
            format!("path_prefix must start with '/', got {prefix:?}"),
        ));
    }
    if r.upstreams.get_ref().is_empty() {
        return Err(cx.err(r.upstreams.span(), "a route needs at least one upstream"));
    }
    let upstreams = r
        .upstreams
        .get_ref()
        .iter()
        .map(|u| upstream(cx, u))
        .collect::<Result<_, _>>()?;
    let (cost, max_cost) = costs(cx, r)?;
    let trimmed = prefix.trim_end_matches('/');
    Ok(Route {
        name: Arc::from(r.name.get_ref().as_str()),
        host: r.host.as_ref().map(|h| h.trim().to_ascii_lowercase()),
        path_prefix: if trimmed.is_empty() {
            "/".into()
        } else {
            trimmed.into()
        },
        upstreams,
        auth: match r.auth {
            AuthFile::Required => Auth::Required,
            AuthFile::Optional => Auth::Optional,
            AuthFile::None => Auth::None,
        },
        cost,
        mode: match r.mode {
            ModeFile::Enforce => Mode::Enforce,
            ModeFile::Shadow => Mode::Shadow,
        },
        connect_timeout: upstream_timeout(cx, "connect_timeout_ms", &r.connect_timeout_ms, 1_000)?,
        read_timeout: upstream_timeout(cx, "read_timeout_ms", &r.read_timeout_ms, 30_000)?,
        cost_header: cost_header(cx, r)?,
        max_cost,
        cost_from: cost_from(cx, r)?,
        adaptive: match &r.adaptive {
            Some(a) => Some(adaptive(cx, a)?),
            None => None,
        },
        health_check: match &r.health_check {
            None => None,
            Some(h) => Some(health_check(cx, h.get_ref())?),
        },
        upgrade: r.upgrade.unwrap_or(false),
        methods: methods(cx, r)?,
        hide_credentials: r.hide_credentials.unwrap_or(false),
        identity_headers: r.identity_headers.unwrap_or(true),
        real_ip_header: r.real_ip_header.unwrap_or(true),
        hide_client_headers: r.hide_client_headers.unwrap_or(false),
        limits: Vec::new(),
    })
}

/// A route's `methods`: a non-empty list of distinct upper-case methods the gateway
/// forwards (not CONNECT, TRACE or TRACK).
fn methods(cx: &Ctx<'_>, r: &RouteFile) -> Result<Option<Arc<[http::Method]>>, ConfigError> {
    let Some(list) = &r.methods else {
        return Ok(None);
    };
    if list.get_ref().is_empty() {
        return Err(cx.err(
            list.span(),
            "methods must name at least one method (leave it out for every method)",
        ));
    }
    let mut out: Vec<http::Method> = Vec::with_capacity(list.get_ref().len());
    for m in list.get_ref() {
        let name = m.get_ref();
        let method = http::Method::from_bytes(name.as_bytes())
            .ok()
            .filter(method_forwarded)
            .ok_or_else(|| {
                cx.err(
                    m.span(),
                    format!("{name:?} is not a method the gateway forwards (upper case, like \"GET\", at most 32 bytes; not CONNECT, TRACE or TRACK)"),
                )
            })?;
        if out.contains(&method) {
            return Err(cx.err(m.span(), format!("method {name:?} is listed twice")));
        }
        out.push(method);
    }
    Ok(Some(out.into()))
}

/// A route's `cost` (at least 1) and `max_cost` (only with `cost_header` or `cost_from`,
/// not below `cost`).
fn costs(cx: &Ctx<'_>, r: &RouteFile) -> Result<(u32, Option<u32>), ConfigError> {
    let cost = match &r.cost {
        Some(c) if *c.get_ref() == 0 => return Err(cx.err(c.span(), "cost must be at least 1")),
        Some(c) => *c.get_ref(),
        None => 1,
    };
    let max_cost = match &r.max_cost {
        Some(m) if r.cost_header.is_none() && r.cost_from.is_none() => {
            return Err(cx.err(
                m.span(),
                "max_cost needs cost_header or cost_from (it bounds the settled cost)",
            ))
        }
        Some(m) if *m.get_ref() < cost => {
            return Err(cx.err(
                m.span(),
                format!("max_cost {} is below the route's cost {cost}", m.get_ref()),
            ))
        }
        Some(m) => Some(*m.get_ref()),
        None => None,
    };
    Ok((cost, max_cost))
}

/// A route's `cost_from` (`"response_bytes"` or `"request_bytes"`, not with
/// `cost_header`: one settlement per request) and `cost_unit_bytes` (at least 1, only
/// with `cost_from`).
fn cost_from(cx: &Ctx<'_>, r: &RouteFile) -> Result<Option<crate::config::CostFrom>, ConfigError> {
    use crate::config::{CostFrom, Counted};
    let Some(from) = &r.cost_from else {
        if let Some(u) = &r.cost_unit_bytes {
            return Err(cx.err(u.span(), "cost_unit_bytes needs cost_from"));
        }
        return Ok(None);
    };
    let counted = match from.get_ref().as_str() {
        "response_bytes" => Counted::Response,
        "request_bytes" => Counted::Request,
        other => {
            let msg =
                format!("cost_from = {other:?}: expected \"response_bytes\" or \"request_bytes\"");
            return Err(cx.err(from.span(), msg));
        }
    };
    if r.cost_header.is_some() {
        let msg = "cost_from and cost_header both settle the request: set one";
        return Err(cx.err(from.span(), msg));
    }
    let unit_bytes = match &r.cost_unit_bytes {
        Some(u) if *u.get_ref() == 0 => {
            return Err(cx.err(u.span(), "cost_unit_bytes must be at least 1"))
        }
        Some(u) => *u.get_ref(),
        None => 1,
    };
    Ok(Some(CostFrom {
        counted,
        unit_bytes,
    }))
}

/// A route's `cost_header`, which must be a valid header name.
fn cost_header(cx: &Ctx<'_>, r: &RouteFile) -> Result<Option<http::HeaderName>, ConfigError> {
    let Some(h) = &r.cost_header else {
        return Ok(None);
    };
    http::HeaderName::from_bytes(h.get_ref().as_bytes())
        .map(Some)
        .map_err(|_| {
            cx.err(
                h.span(),
                format!("cost_header {:?} is not a header name", h.get_ref()),
            )
        })
}

/// A route's `adaptive` table: at least one target; `max_error_rate` in [0, 1];
/// `min_factor` in (0, 1]; `min_clients` from 1 to the clients a window tells apart.
pub(super) fn adaptive(
    cx: &Ctx<'_>,
    a: &Spanned<AdaptiveFile>,
) -> Result<crate::adaptive::Settings, ConfigError> {
    let t = a.get_ref();
    if t.target_p99_ms.is_none() && t.max_error_rate.is_none() {
        return Err(cx.err(
            a.span(),
            "adaptive needs target_p99_ms or max_error_rate (or both)",
        ));
    }
    let target_p99_ms = bounded(
        cx,
        "target_p99_ms",
        t.target_p99_ms.as_ref(),
        1..=MAX_UPSTREAM_TIMEOUT_MS,
    )?;
    let max_error_rate = match &t.max_error_rate {
        Some(v) if !(0.0..=1.0).contains(v.get_ref()) => {
            let msg = format!(
                "max_error_rate must be between 0 and 1, got {}",
                v.get_ref()
            );
            return Err(cx.err(v.span(), msg));
        }
        Some(v) => Some(*v.get_ref()),
        None => None,
    };
    let min_factor = match &t.min_factor {
        // At least one millionth: the factor's resolution.
        Some(v) if !(*v.get_ref() >= 1e-6 && *v.get_ref() <= 1.0) => {
            let msg = format!(
                "min_factor must be in (0, 1] (at least 0.000001), got {}",
                v.get_ref()
            );
            return Err(cx.err(v.span(), msg));
        }
        Some(v) => crate::adaptive::Factor::from_f64(*v.get_ref()),
        None => crate::adaptive::Factor::DEFAULT_MIN,
    };
    let most = crate::adaptive::window::HITTERS as u32;
    let min_clients = bounded(cx, "min_clients", t.min_clients.as_ref(), 1..=most)?;
    Ok(crate::adaptive::Settings {
        target_p99_ms,
        max_error_rate,
        min_factor,
        min_clients: min_clients.unwrap_or(crate::adaptive::DEFAULT_MIN_CLIENTS),
    })
}

/// A route's `health_check`: an origin-form path and an interval of 100 ms to an hour.
pub(super) fn health_check(cx: &Ctx<'_>, h: &HealthCheckFile) -> Result<HealthCheck, ConfigError> {
    let path = h.path.get_ref();
    let valid = path.starts_with('/')
        && path
            .parse::<http::uri::PathAndQuery>()
            .is_ok_and(|pq| pq.as_str() == path);
    if !valid {
        return Err(cx.err(
            h.path.span(),
            format!(
                "health_check path must be an origin-form path starting with '/', got {path:?}"
            ),
        ));
    }
    let interval = bounded(
        cx,
        "health_check interval_ms",
        h.interval_ms.as_ref(),
        MIN_HEALTH_INTERVAL_MS..=MAX_UPSTREAM_TIMEOUT_MS,
    )?;
    Ok(HealthCheck {
        path: path.clone(),
        interval: Duration::from_millis(interval.unwrap_or(1_000)),
    })
}

/// A route's upstream timeout in ms: 0 would fail every request, and over an hour is a typo.
pub(super) fn upstream_timeout(
    cx: &Ctx<'_>,
    key: &str,
    v: &Option<Spanned<u64>>,
    default_ms: u64,
) -> Result<Duration, ConfigError> {
    let range = 1..=MAX_UPSTREAM_TIMEOUT_MS;
    Ok(Duration::from_millis(
        bounded(cx, key, v.as_ref(), range)?.unwrap_or(default_ms),
    ))
}

/// `IP:PORT`, or `host:port` resolved now (never on the request path).
pub(super) fn upstream(cx: &Ctx<'_>, u: &Spanned<String>) -> Result<SocketAddr, ConfigError> {
    let s = u.get_ref().trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bad = || {
        cx.err(
            u.span(),
            format!("invalid upstream address {s:?}: expected HOST:PORT"),
        )
    };
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => s
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| cx.err(u.span(), format!("upstream host {host:?} does not resolve"))),
        _ => Err(bad()),
    }
}

/// A route whose cost exceeds a window it can meet would reject every request.
pub(super) fn check_costs(
    cx: &Ctx<'_>,
    raw: &[Spanned<RouteFile>],
    routes: &[Route],
    scopes: [&Option<Arc<ScopeLimits>>; 2],
    tiers: &HashMap<String, Arc<Tier>>,
) -> Result<(), ConfigError> {
    let mut all: Vec<(String, &ScopeLimits)> = scopes
        .iter()
        .zip(["limits.ip", "limits.global"])
        .filter_map(|(s, n)| s.as_deref().map(|s| (n.to_string(), s)))
        .collect();
    for t in tiers.values() {
        all.push((format!("tiers.{}.key", t.name), &t.key));
        all.push((format!("tiers.{}.tenant", t.name), &t.tenant));
    }
    for (route, r) in routes.iter().zip(raw) {
        for (name, limits) in &all {
            if let Some(w) = limits.windows.iter().find(|w| w.capacity < route.cost) {
                let span = r.get_ref().cost.as_ref().map_or(r.span(), |c| c.span());
                return Err(cx.err(
                    span,
                    format!(
                        "cost {} exceeds {name}.{} = {}: no request could ever pass",
                        route.cost,
                        w.window.config_key(),
                        w.capacity
                    ),
                ));
            }
        }
    }
    Ok(())
}
