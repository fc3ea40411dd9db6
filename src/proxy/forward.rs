//! The request the upstream receives, as Pingora's `RequestHeader`: `edge::forward`'s
//! scrubbing, address chain and identity headers, plus the target `target` rewrote.

use std::net::IpAddr;

use pingora::http::RequestHeader;

use super::RequestCtx;
use crate::admission::Admission;
use crate::edge::forward::{self, AddressHeaders};
use crate::edge::query as forward_query;
use crate::routing::RouteEntry;

/// A route without `upgrade = true` forwards no protocol upgrade: with `Upgrade` gone
/// from the client's request `req`, Pingora treats it as plain HTTP and the upstream
/// cannot open a 101 tunnel that one admission would pay for.
pub(super) fn strip_upgrade(req: &mut RequestHeader, route: Option<&RouteEntry>) {
    let upgrade = &http::header::UPGRADE;
    if !route.is_some_and(|r| r.route.upgrade) && req.headers.contains_key(upgrade) {
        req.remove_header(upgrade);
    }
}

/// Rewrites `upstream`, the request to forward, for the admitted request `a` from `peer`
/// whose own headers are `client`.
///
/// # Errors
/// A header value Pingora refuses.
pub(super) fn rewrite(
    upstream: &mut RequestHeader,
    client: &RequestHeader,
    peer: IpAddr,
    a: &Admission,
    ctx: &RequestCtx,
) -> pingora::Result<()> {
    let rt = &a.runtime; // the config the request was admitted on
    let trusted = rt.resolver.is_trusted(peer);
    for name in forward::doomed(&upstream.headers, a, trusted) {
        upstream.remove_header(&name);
    }
    // `[auth] key_query`: the key parameter does not go upstream.
    let key_query = rt.config.auth.key_query.as_deref();
    let uri = ctx.uri.as_ref().unwrap_or(&client.uri);
    if let Some(uri) = key_query.and_then(|n| forward_query::strip(uri, n)) {
        upstream.set_uri(uri);
    } else if let Some(uri) = &ctx.uri {
        upstream.set_uri(uri.clone());
    }
    if let Some(host) = &ctx.host_header {
        upstream.insert_header(http::header::HOST, host.clone())?;
    }
    let chain = AddressHeaders::new(&client.headers, rt, peer, a.client_ip, trusted);
    upstream.insert_header("x-forwarded-for", chain.forwarded_for)?;
    if let Some(fwd) = chain.forwarded {
        upstream.insert_header(http::header::FORWARDED, fwd)?;
    }
    if forward::sends_real_ip(a) {
        upstream.insert_header("x-real-ip", chain.real_ip)?;
    } else {
        // The gateway's header, left out on this route: a client's own must not reach
        // an upstream that trusts the name.
        upstream.remove_header("x-real-ip");
    }
    for (name, value) in forward::identity_headers(a).into_iter().flatten().flatten() {
        upstream.insert_header(name, value)?;
    }
    Ok(())
}
