//! The transport-neutral HTTP edge: what every HTTP entry point does around
//! `admission::admit`, written once. An adapter (the Pingora proxy, the tower layer,
//! `throttle simulate`) translates its wire format into these calls and the answers back.
//!
//! - `target`: the method rule, the normalized path (`path`) and the one `Host` rule;
//! - [`admit_http`]: resolve the client IP, parse the target, answer an IP block before a
//!   400, then admit;
//! - `forward`: the client headers scrubbed before forwarding, the identity headers and
//!   the address chain;
//! - `cost`: the usage an upstream reports (`cost_header`) and the settlement;
//! - [`peer_addr`] / [`peer_ip`]: a Pingora socket peer as the canonical address the limits
//!   key on (the proxy and `/v1/check` both read their peer there);
//! - `guarded`: the connection guard (header and body deadlines) both listeners use.

pub mod cost;
pub mod forward;
pub mod guarded;
pub mod path;
pub mod query;
pub mod target;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use http::HeaderMap;
use pingora::protocols::l4::socket::SocketAddr;

use crate::admission::{self, Admission, AdmitRequest, Core, Origin, Refusal, Rejection, Runtime};
use crate::config::PathParameters;
use crate::identity::{api_key_from, validate_key, AmbiguousCredentials, Presented};

/// Where a parsed request target goes, as the routes see it.
pub trait Destination {
    /// The lower-case host without port and trailing dot, if any.
    fn host(&self) -> Option<&str>;
    /// The normalized path the routes match on.
    fn route_path(&self) -> &str;
    /// The raw query, if any (`[auth] key_query` reads the key from it).
    fn query(&self) -> Option<&str>;
}

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

/// A socket peer as the address the limits key on (`client_ip::canonical`: an IPv4-mapped
/// or NAT64 IPv6 address as IPv4); None for a peer without an IP (a Unix socket, or no
/// peer known). Pingora's own address type, since both Pingora adapters (the proxy and
/// `/v1/check`) hold one; `edge` already speaks Pingora's connection types (`guarded`).
pub fn peer_addr(peer: Option<&SocketAddr>) -> Option<IpAddr> {
    peer.and_then(SocketAddr::as_inet)
        .map(|a| crate::client_ip::canonical(a.ip()))
}

/// [`peer_addr`], or `0.0.0.0` without one: the proxy decides every request on an address.
pub fn peer_ip(peer: Option<&SocketAddr>) -> IpAddr {
    peer_addr(peer).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// Runs the pipeline for an HTTP request from `peer` with `headers`: resolves the client
/// IP, parses the target with `parse` (given whether `[server] path_parameters` allows
/// them), reads the credentials, and admits. An IP block answers 403 before a malformed
/// target's 400 (or 405). On admission, the parsed target comes back with it.
///
/// # Errors
/// The refusal to answer.
pub async fn admit_http<T: Destination>(
    core: &Core,
    peer: IpAddr,
    (method, headers): (&http::Method, &HeaderMap),
    parse: impl FnOnce(bool) -> Result<T, Rejection>,
) -> Result<(Admission, T), Refusal> {
    // The request's one config snapshot and one clock reading, for all that follows.
    let (rt, now_ms) = (core.runtime(), core.clock.now_ms());
    let client_ip = rt.resolver.resolve_headers(peer, headers);
    let allow_params = rt.config.server.path_parameters == PathParameters::Allow;
    let target = match parse(allow_params) {
        Ok(t) => t,
        Err(rejection) => return Err(refused_before(core, (rt, now_ms), client_ip, rejection)),
    };
    let from_query = match &rt.config.auth.key_query {
        Some(name) => query::param(target.query(), name),
        None => Ok(None),
    };
    let key = from_query.as_ref().map_err(|e| *e).and_then(|q| {
        let header = api_key_from(headers, &rt.config.auth.key_header, rt.config.jwt.is_some())?;
        credentials(header, q.as_deref())
    });
    let ask = key
        .map(|key| Ask {
            host: target.host(),
            path: target.route_path(),
            method,
            key,
            cost: None,
            attrs: admission::Attrs {
                headers: Some(headers),
                query: target.query(),
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

// === impl Routed ===

impl Destination for target::Routed<'_> {
    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    fn route_path(&self) -> &str {
        &self.path.route
    }

    fn query(&self) -> Option<&str> {
        self.query
    }
}

#[cfg(test)]
mod tests;
