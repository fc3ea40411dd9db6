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
//! - [`peer_ip`]: a socket peer as the canonical address the limits key on.

pub mod cost;
pub mod forward;
pub mod path;
pub mod target;

use std::net::{IpAddr, Ipv4Addr};

use http::HeaderMap;

use crate::admission::{self, Admission, AdmitRequest, Core, Origin, Refusal, Rejection};
use crate::config::PathParameters;
use crate::identity::{api_key_from, Presented};

/// Where a parsed request target goes, as the routes see it.
pub trait Destination {
    /// The lower-case host without port and trailing dot, if any.
    fn host(&self) -> Option<&str>;
    /// The normalized path the routes match on.
    fn route_path(&self) -> &str;
}

/// What an HTTP request asks the pipeline, once its target is parsed.
#[derive(Debug)]
pub struct Ask<'a> {
    /// The routed host, if any.
    pub host: Option<&'a str>,
    /// The normalized path.
    pub path: &'a str,
    /// The credentials the request presents.
    pub key: Presented<'a>,
    /// The cost the request spends (None: the route's).
    pub cost: Option<u32>,
}

/// A socket peer as the address the limits key on (an IPv4-mapped IPv6 address as IPv4);
/// without one, `0.0.0.0`.
pub fn peer_ip(peer: Option<IpAddr>) -> IpAddr {
    peer.map_or(
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        crate::client_ip::canonical,
    )
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
    headers: &HeaderMap,
    parse: impl FnOnce(bool) -> Result<T, Rejection>,
) -> Result<(Admission, T), Refusal> {
    let (client_ip, allow_params) = {
        let rt = core.runtime();
        let client_ip = rt.resolver.resolve_headers(peer, headers);
        (
            client_ip,
            rt.config.server.path_parameters == PathParameters::Allow,
        )
    };
    let parsed = parse(allow_params).and_then(|t| {
        let key = api_key_from(headers).map_err(|_| Rejection::AmbiguousCredentials)?;
        Ok((t, key))
    });
    let (target, key) = match parsed {
        Ok(parsed) => parsed,
        Err(rejection) => return Err(refused_before(core, client_ip, rejection)),
    };
    let ask = Ask {
        host: target.host(),
        path: target.route_path(),
        key,
        cost: None,
    };
    let a = admit_asked(core, client_ip, Ok(ask)).await?;
    Ok((a, target))
}

/// Admits what `client_ip` asks, or answers the rejection met while reading the request
/// (an IP block first). `throttle simulate` enters here with the rows it replays.
///
/// # Errors
/// The refusal to answer.
pub async fn admit_asked(
    core: &Core,
    client_ip: IpAddr,
    ask: Result<Ask<'_>, Rejection>,
) -> Result<Admission, Refusal> {
    let ask = ask.map_err(|rejection| refused_before(core, client_ip, rejection))?;
    let request = AdmitRequest {
        client_ip,
        target: admission::Target::Match {
            host: ask.host,
            path: ask.path,
        },
        key: ask.key,
        cost: ask.cost,
        also_charge: None,
        origin: Origin::Proxy,
    };
    admission::admit(core, &request).await
}

/// A request refused before admission: an IP block still answers 403 first.
fn refused_before(core: &Core, client_ip: IpAddr, rejection: Rejection) -> Refusal {
    admission::ip_blocked(core, client_ip).unwrap_or_else(|| rejection.into())
}

// === impl Routed ===

impl Destination for target::Routed<'_> {
    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    fn route_path(&self) -> &str {
        &self.path.route
    }
}
