//! The transport-neutral HTTP edge: what every HTTP entry point does around
//! `admission::admit`, written once. An adapter (the Pingora proxy, the tower layer,
//! `throttle simulate`) translates its wire format into these calls and the answers back.
//! `edge` speaks `http` and `std` types only: no Pingora, no tonic.
//!
//! - `target`: [`target::Target::parse`], the one target parser (the method rule, the
//!   normalized path from `path`, the one `Host` rule, what the next hop receives);
//! - [`admit_http`]: resolve the client IP, parse the target, answer an IP block before a
//!   400, then admit (the request side, one call);
//! - [`answered`]: the response side, one call: refund by outcome (`count_on`), settle
//!   the reported cost, and the rate headers to add;
//! - `forward`: the client headers scrubbed before forwarding, the identity headers and
//!   the address chain;
//! - `cost`: the usage an upstream reports (`cost_header`) and the settlement;
//! - [`peer_ip`]: a socket peer as the canonical address the limits and the connection
//!   caps key on (every listener and adapter reads its peer there);
//! - [`route_counters`]: a route's request counters, looked up in one place;
//! - `request_id`: the `X-Request-Id` kept from a trusted proxy or made, for every
//!   transport.

pub mod cost;
pub mod forward;
pub mod path;
pub mod query;
pub mod request_id;
pub mod target;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use http::{HeaderMap, HeaderValue};

use self::target::{Target, Wire};
use crate::admission::{
    self, Admission, AdmitRequest, Core, Origin, Refusal, Rejection, RouteLive, Runtime,
};
use crate::config::PathParameters;
use crate::identity::{api_key_from, validate_key, AmbiguousCredentials, Presented};
use crate::metrics::{Metrics, RouteCounters};
use crate::routing::RouteEntry;

/// What an HTTP request asks the pipeline, once its target is parsed.
#[derive(Debug)]
pub struct Ask<'a> {
    /// The routed host, if any.
    pub host: Option<&'a str>,
    /// The normalized path.
    pub path: &'a str,
    /// The request method.
    pub method: &'a http::Method,
    /// The credentials the request presents.
    pub key: Presented<'a>,
    /// The cost the request spends (None: the route's).
    pub cost: Option<u32>,
    /// What custom scopes read.
    pub attrs: admission::Attrs<'a>,
}

/// A socket peer's address as the limits and the connection caps key on it
/// (`client_ip::canonical`: an IPv4-mapped or NAT64 IPv6 address as IPv4), or `0.0.0.0`
/// for a peer without an IP (a Unix socket, or no peer known). The one canonicalization
/// of a peer: the listeners' per-client connection caps, the proxy, the tower layer and
/// `/v1/check` all read their peer here.
pub fn peer_ip(peer: Option<IpAddr>) -> IpAddr {
    peer_addr(peer).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// [`peer_ip`] without the `0.0.0.0` stand-in: None for a peer without an IP.
pub fn peer_addr(peer: Option<IpAddr>) -> Option<IpAddr> {
    peer.map(crate::client_ip::canonical)
}

/// The response side of an admitted request, one call: the next hop's `status` refunds
/// the tables whose `count_on` leaves it out (`Admission::settle_outcome`), the usage it
/// reported in its response `headers` settles the request (`Admission::settle_from`), and
/// the rate-limit headers to add come back (none on a route with `hide_client_headers`).
pub fn answered<'a>(
    a: &'a mut Admission,
    (status, headers): (u16, &HeaderMap),
    metrics: &Metrics,
) -> impl Iterator<Item = (&'static str, HeaderValue)> + 'a {
    a.settle_outcome(status, metrics);
    a.settle_from(headers, metrics);
    let a: &'a Admission = a;
    let shown = forward::shows_rate_headers(a).then(|| a.rate_headers());
    shown.into_iter().flatten()
}

/// The request counters of `route` (`live`: its state, `Core::route_state`), or
/// `unrouted` (the adapter's `none` counters) for a request no route matched: the one
/// place the per-route counters are looked up.
pub fn route_counters<'a>(
    core: &Core,
    route: Option<&RouteEntry>,
    live: Option<&'a RouteLive>,
    unrouted: &'a RouteCounters,
) -> &'a RouteCounters {
    match (route, live) {
        (Some(r), Some(live)) => live.counters(&core.metrics, &r.route.name),
        _ => unrouted,
    }
}

/// Runs the pipeline for an HTTP request from `peer`: resolves the client IP, parses the
/// target of `wire` (`Target::parse`, given whether `[server] path_parameters` allows
/// them), reads the credentials, and admits. An IP block answers 403 before a malformed
/// target's 400 (or 405). On admission, the parsed target comes back with it.
///
/// # Errors
/// The refusal to answer.
pub async fn admit_http<'w>(
    core: &Core,
    peer: IpAddr,
    wire: Wire<'w>,
) -> Result<(Admission, Target<'w>), Refusal> {
    // The request's one config snapshot and one clock reading, for all that follows.
    let (rt, now_ms) = (core.runtime(), core.clock.now_ms());
    let (method, headers) = (wire.method, wire.headers);
    let client_ip = rt.resolver.resolve_headers(peer, headers);
    let allow_params = rt.config.server.path_parameters == PathParameters::Allow;
    let target = match Target::parse(wire, allow_params) {
        Ok(t) => t,
        Err(rejection) => return Err(refused_before(core, (rt, now_ms), client_ip, rejection)),
    };
    let from_query = match &rt.config.auth.key_query {
        Some(name) => query::param(target.query, name),
        None => Ok(None),
    };
    let key = from_query.as_ref().map_err(|e| *e).and_then(|q| {
        let header = api_key_from(headers, &rt.config.auth.key_header, rt.config.jwt.is_some())?;
        credentials(header, q.as_deref())
    });
    let ask = key
        .map(|key| Ask {
            host: target.host(),
            path: &target.path.route,
            method,
            key,
            cost: None,
            attrs: admission::Attrs {
                headers: Some(headers),
                query: target.query,
            },
        })
        .map_err(|_| Rejection::AmbiguousCredentials);
    let a = admit_asked(core, (rt, now_ms), client_ip, ask).await;
    drop(from_query);
    Ok((a?, target))
}

/// The key of a request: the one from its headers (`header`), or the `key_query`
/// parameter's value (`query`); both must agree when both are sent.
fn credentials<'a>(
    header: Presented<'a>,
    query: Option<&'a str>,
) -> Result<Presented<'a>, AmbiguousCredentials> {
    let Some(q) = query else { return Ok(header) };
    let from_query = validate_key(q.as_bytes());
    match (header, from_query) {
        (Presented::Missing, q) => Ok(q),
        (h, q) if h == q => Ok(h),
        _ => Err(AmbiguousCredentials),
    }
}

/// Admits what `client_ip` asks on the request's runtime snapshot and clock reading
/// (`at`), or answers the rejection met while reading the request (an IP block first).
/// `throttle simulate` enters here with the rows it replays.
///
/// # Errors
/// The refusal to answer.
pub async fn admit_asked(
    core: &Core,
    at: (Arc<Runtime>, u64),
    client_ip: IpAddr,
    ask: Result<Ask<'_>, Rejection>,
) -> Result<Admission, Refusal> {
    let ask = match ask {
        Ok(ask) => ask,
        Err(rejection) => return Err(refused_before(core, at, client_ip, rejection)),
    };
    let request = AdmitRequest {
        skip: Default::default(),
        client_ip,
        target: admission::Target::Match {
            host: ask.host,
            path: ask.path,
            method: ask.method,
        },
        key: ask.key,
        cost: ask.cost,
        also_charge: None,
        origin: Origin::Proxy,
        attrs: ask.attrs,
    };
    admission::admit_at(core, at.0, at.1, &request).await
}

/// A request refused before admission: an IP block still answers 403 first.
fn refused_before(
    core: &Core,
    (rt, now_ms): (Arc<Runtime>, u64),
    client_ip: IpAddr,
    rejection: Rejection,
) -> Refusal {
    match admission::ip_blocked_at(core, rt.clone(), now_ms, client_ip) {
        Some(blocked) => blocked,
        None => Refusal {
            seen: core
                .observed
                .then(|| Box::new(admission::RefusalSeen::at(client_ip))),
            ..Refusal::from(rejection).on(rt, now_ms)
        },
    }
}

#[cfg(test)]
mod tests;
