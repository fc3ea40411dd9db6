//! Where a request goes: the first attempt of a balanced route is picked while admitting,
//! a retry after a failed connect picks again, and each upstream of the route is tried
//! once before the request fails.

use std::net::SocketAddr;
use std::time::Duration;

use pingora::prelude::HttpPeer;
use pingora::{Error, ErrorType};
use tokio::time::Instant;

use super::RequestCtx;
use crate::routing::RouteEntry;

/// Picks the first attempt's upstream of a balanced `route` while admitting, so that with
/// every upstream down the 502 is answered as a complete response on a connection that
/// stays open (an error while proxying would close it). False when every one is down; a
/// single-upstream route (or none) picks nothing here.
pub(super) fn choose(ctx: &mut RequestCtx, route: Option<&RouteEntry>) -> bool {
    let Some(route) = route.filter(|r| r.single.is_none()) else {
        return true;
    };
    ctx.chosen = pick(route);
    ctx.chosen.is_some()
}

/// The peer of the next attempt, with the route's timeouts; the first attempt marks when
/// the upstream exchange started.
///
/// # Errors
/// No admitted route, or no upstream left to try.
pub(super) fn peer(ctx: &mut RequestCtx) -> pingora::Result<Box<HttpPeer>> {
    let Some(route) = ctx.admission.as_ref().and_then(|a| a.route.as_ref()) else {
        return Err(Error::explain(
            ErrorType::InternalError,
            "no admitted route",
        ));
    };
    // The first attempt goes where admission chose; a retry picks again.
    let chosen = ctx.chosen.take();
    let Some(addr) = route.single.or(chosen).or_else(|| pick(route)) else {
        return Err(Error::explain(
            ErrorType::ConnectNoRoute,
            "no upstream available",
        ));
    };
    ctx.upstream_addr = Some(addr);
    let r = &route.route;
    let mut peer = HttpPeer::new(addr, false, String::new());
    // Plain TCP: the connect timeout is the whole connection's (no TLS handshake), so
    // one timer, not two.
    peer.options.connection_timeout = Some(r.connect_timeout);
    peer.options.read_timeout = Some(r.read_timeout);
    peer.options.write_timeout = Some(r.read_timeout);
    peer.options.idle_timeout = Some(Duration::from_secs(60));
    ctx.upstream_started.get_or_insert_with(Instant::now);
    Ok(Box::new(peer))
}

/// A failed connect is retried (on the upstream `peer` picks next) until each upstream of
/// the route was tried once.
pub(super) fn retry(ctx: &mut RequestCtx, mut e: Box<Error>) -> Box<Error> {
    let upstreams = ctx.admitted_route().map_or(1, |r| r.route.upstreams.len());
    ctx.connect_tries += 1;
    if ctx.connect_tries < upstreams {
        e.set_retry(true);
    }
    e
}

/// The next upstream of a balanced route (round robin over the healthy ones); None when
/// every one is down.
fn pick(route: &RouteEntry) -> Option<SocketAddr> {
    route
        .upstreams
        .select(b"", 256)
        .and_then(|b| b.addr.as_inet().copied())
}

/// Whether the gateway never got a connection to the upstream.
pub(super) fn is_connect_failure(t: &ErrorType) -> bool {
    matches!(
        t,
        ErrorType::ConnectTimedout
            | ErrorType::ConnectRefused
            | ErrorType::ConnectNoRoute
            | ErrorType::ConnectError
            | ErrorType::ConnectProxyFailure
            | ErrorType::TLSHandshakeFailure
            | ErrorType::TLSHandshakeTimedout
            | ErrorType::SocketError
            | ErrorType::BindError
    )
}
