//! The Pingora `ProxyHttp` adapter over the admission pipeline. Each phase calls one or
//! two tested functions: `target` turns the request line into the routed path and host,
//! `admission::admit` decides, `reply` renders the gateway's own answers.

pub mod listener;
pub mod target;
pub mod tls;

use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use http::{HeaderValue, Uri};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType};

use crate::admission::{self, Admission, Core};
use crate::edge::forward::{self, AddressValues};
use crate::metrics::RouteCounters;
use crate::reply::{error_reply, Reply};
use crate::routing::RouteEntry;
use crate::store::Ending;

/// The gateway: one per process, shared by every request.
pub struct Gateway {
    core: Arc<Core>,
    /// Metrics of requests no route matched.
    unrouted: RouteCounters,
}

/// Per-request state carried between phases.
#[derive(Default)]
pub struct RequestCtx {
    admission: Option<Admission>,
    /// The `Host` to forward, when it differs from the client's (see `target`).
    host_header: Option<HeaderValue>,
    /// The origin-form URI to forward, when it differs from the client's.
    uri: Option<Uri>,
    /// The route, for metrics (none: no route matched).
    route: Option<Arc<RouteEntry>>,
    connect_tries: usize,
    /// The upstream chosen while admitting (a balanced route), for the first attempt.
    chosen: Option<std::net::SocketAddr>,
    upstream_started: Option<tokio::time::Instant>,
    /// When the request's last byte went to the upstream (its body's end, or its head
    /// for a request without a body): where the adaptive latency starts.
    upstream_sent: Option<tokio::time::Instant>,
    /// When the upstream's response head arrived, and its status.
    upstream_head: Option<(tokio::time::Instant, u16)>,
    /// When the request body must be complete (`body_timeout_secs` after the headers).
    body_deadline: Option<tokio::time::Instant>,
}

// === impl Gateway ===

impl Gateway {
    /// A gateway over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self {
            unrouted: core.metrics.route("none"),
            core,
        }
    }

    /// Runs the pipeline for a proxied request.
    async fn admit(
        &self,
        req: &RequestHeader,
        peer: IpAddr,
        ctx: &mut RequestCtx,
    ) -> Result<Admission, admission::Refusal> {
        let parse = |allow_params| target::target(req, allow_params);
        let (a, t) = crate::edge::admit_http(&self.core, peer, &req.headers, parse).await?;
        ctx.host_header = t.host_header;
        ctx.uri = t.uri;
        Ok(a)
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<bool> {
        let (body_timeout, idle_timeout) = {
            let rt = self.core.runtime();
            (rt.config.server.body_timeout, rt.config.server.idle_timeout)
        };
        ctx.body_deadline = Some(tokio::time::Instant::now() + body_timeout);
        // Each body read may take what is left of the budget (HTTP/1; see `body_budget`).
        session.set_read_timeout(Some(body_timeout));
        // A body left unread after the response is drained for at most as long (an HTTP/2
        // stream the client never ends would otherwise keep its connection busy forever),
        // and a client that reads nothing of its response for `idle_timeout_secs` (a zero
        // flow-control window, a full TCP window) is dropped.
        session.set_total_drain_timeout(Some(body_timeout));
        session.set_write_timeout(Some(idle_timeout));
        let peer = peer_ip(session);
        match self.admit(session.req_header(), peer, ctx).await {
            Ok(a) => {
                // A route without `upgrade = true` forwards no protocol upgrade: with
                // `Upgrade` gone, Pingora treats the request as plain HTTP and the
                // upstream cannot open a 101 tunnel that one admission would pay for.
                let upgrade_ok = a.route.as_ref().is_some_and(|r| r.route.upgrade);
                let upgrade = &http::header::UPGRADE;
                if !upgrade_ok && session.req_header().headers.contains_key(upgrade) {
                    session.req_header_mut().remove_header(upgrade);
                }
                ctx.route = a.route.clone();
                // A balanced route picks its upstream now: with every upstream down the
                // 502 is answered here, as a complete response on a connection that stays
                // open (an error while proxying would close it).
                let balanced = a.route.as_ref().filter(|r| r.single.is_none());
                if let Some(r) = balanced {
                    ctx.chosen = pick(r);
                    if ctx.chosen.is_none() {
                        ctx.admission = Some(a);
                        write(session, &error_reply(502, "bad_gateway")).await?;
                        return Ok(true);
                    }
                }
                ctx.admission = Some(a);
                Ok(false)
            }
            Err(refusal) => {
                write(session, &refusal.reply()).await?;
                ctx.route = refusal.route;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Box<HttpPeer>> {
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
        let r = &route.route;
        let mut peer = HttpPeer::new(addr, false, String::new());
        // Plain TCP: the connect timeout is the whole connection's (no TLS handshake), so
        // one timer, not two.
        peer.options.connection_timeout = Some(r.connect_timeout);
        peer.options.read_timeout = Some(r.read_timeout);
        peer.options.write_timeout = Some(r.read_timeout);
        peer.options.idle_timeout = Some(std::time::Duration::from_secs(60));
        ctx.upstream_started
            .get_or_insert_with(tokio::time::Instant::now);
        Ok(Box::new(peer))
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // Try each upstream of the route once before giving up.
        let upstreams = ctx
            .admission
            .as_ref()
            .and_then(|a| a.route.as_ref())
            .map_or(1, |r| r.route.upstreams.len());
        ctx.connect_tries += 1;
        if ctx.connect_tries < upstreams {
            e.set_retry(true);
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let Some(a) = &ctx.admission else {
            return Ok(());
        };
        let peer = peer_ip(session);
        let rt = &a.runtime; // the config the request was admitted on
        let trusted = rt.resolver.is_trusted(peer);
        for name in forward::doomed(&upstream.headers, rt, trusted) {
            upstream.remove_header(&name);
        }
        if let Some(uri) = &ctx.uri {
            upstream.set_uri(uri.clone());
        }
        if let Some(host) = &ctx.host_header {
            upstream.insert_header(http::header::HOST, host.clone())?;
        }
        let client = &session.req_header().headers;
        let reads_forwarded = forward::reads_forwarded(rt);
        let ips = AddressValues::new(peer, a.client_ip);
        // Only the chain the gateway read is forwarded as received (from a trusted proxy,
        // plus this hop): the other was never checked, so an upstream reading it would
        // believe whatever the client wrote. `X-Forwarded-For` always carries this hop.
        let xff = if trusted && !reads_forwarded {
            forward::forwarded_for(client, peer)
        } else {
            ips.peer.clone()
        };
        upstream.insert_header("x-forwarded-for", xff)?;
        if reads_forwarded {
            let fwd = if trusted {
                forward::forwarded(client, &ips.forwarded)
            } else {
                ips.forwarded
            };
            upstream.insert_header(http::header::FORWARDED, fwd)?;
        }
        upstream.insert_header("x-real-ip", ips.client)?;
        for (name, value) in forward::identity_headers(a).into_iter().flatten() {
            upstream.insert_header(name, value)?;
        }
        Ok(())
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        _body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        // Called with `end_of_stream` for a request without a body too; a retry on
        // another upstream sends it again and moves the mark.
        if session.was_upgraded() {
            // A tunnel's bytes are no request body: only the idle timeout applies.
            if ctx.body_deadline.take().is_some() {
                let idle = self.core.runtime().config.server.idle_timeout;
                session.set_read_timeout(Some(idle));
            }
        } else if end_of_stream {
            ctx.upstream_sent = Some(tokio::time::Instant::now());
        } else if let Some(deadline) = ctx.body_deadline {
            // The next body read gets what is left of `body_timeout_secs`.
            session.set_read_timeout(Some(body_budget(deadline)));
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        ctx.upstream_head = Some((tokio::time::Instant::now(), resp.status.as_u16()));
        // A 101 the client did not ask for (its `Upgrade` was removed, or never sent)
        // is the upstream's error, not a tunnel: 502.
        if resp.status == http::StatusCode::SWITCHING_PROTOCOLS
            && !ctx.route.as_ref().is_some_and(|r| r.route.upgrade)
        {
            return Error::e_explain(
                ErrorType::InvalidHTTPHeader,
                "101 from the upstream on a route without upgrade = true",
            );
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let Some(a) = &mut ctx.admission else {
            return Ok(());
        };
        a.settle_from(&resp.headers, &self.core.metrics);
        for (name, value) in a.rate_headers() {
            resp.insert_header(name, value)?;
        }
        Ok(())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        _ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let (code, body) = match (e.esource(), e.etype()) {
            (_, ErrorType::HTTPStatus(code)) => (*code, "error"),
            (
                ErrorSource::Upstream,
                ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout,
            ) => (504, "upstream_timeout"),
            (ErrorSource::Upstream, _) => (502, "bad_gateway"),
            // A body read past `body_timeout_secs` (the read timeout is the budget left).
            (ErrorSource::Downstream, ErrorType::ReadTimedout) => (408, "request_timeout"),
            (
                ErrorSource::Downstream,
                ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed,
            ) => (0, ""),
            (ErrorSource::Downstream, _) => (400, "bad_request"),
            _ => (502, "bad_gateway"),
        };
        // Pingora closes the client's connection after an error while proxying, so the
        // answer says `Connection: close`: a keep-alive client then opens a new connection
        // instead of meeting a reset on its next request.
        if code > 0 && session.response_written().is_none() {
            session.set_keepalive(None);
            if let Err(err) = write(session, &error_reply(code, body)).await {
                tracing::debug!(error = %err, "cannot write error response");
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let client = ctx
            .admission
            .as_ref()
            .map(|a| crate::adaptive::client_id(a.client_ip, a.runtime.config.ipv6_prefix));
        if let Some(mut a) = ctx.admission.take() {
            let ending = ending(e, status);
            // A client cannot pay less by leaving: gone before a valid usage header, the
            // request settles at the route's `max_cost` (without one, the reserve stays).
            let max_cost = a.route.as_ref().and_then(|r| {
                let r = &r.route;
                r.cost_header.as_ref().and(r.max_cost)
            });
            // Only a client that left before the upstream's response head: after it, the
            // usage header either came (and settled) or never will.
            let left_early = e.is_some_and(|e| e.esource() == &ErrorSource::Downstream)
                && ctx.upstream_head.is_none();
            if let Some(max) = max_cost.filter(|_| left_early) {
                if !a.is_settled() {
                    a.settle(max, &self.core.metrics);
                }
            }
            a.finish(ending);
        }
        let counters = match &ctx.route {
            Some(r) => r
                .counters
                .get_or_init(|| self.core.metrics.route(&r.route.name)),
            None => &self.unrouted,
        };
        counters.request(status);
        if let Some(started) = ctx.upstream_started {
            let took = started.elapsed();
            counters.upstream_seconds.observe(took.as_secs_f64());
            // An adaptive route learns from its upstream alone (see `upstream_sample`).
            let route = ctx.route.as_ref();
            let adaptive = route.and_then(|r| Some((r.adaptive.as_ref()?, r.route.adaptive?)));
            let sample = upstream_sample(ctx, started, e);
            if let (Some((state, settings)), Some((latency, error))) = (adaptive, sample) {
                let now_ms = self.core.clock.now_ms();
                state.record_from(&settings, now_ms, client.unwrap_or(0), latency, error);
            }
        }
    }
}

/// What an adaptive route learns from a proxied request: (latency, error), or nothing.
/// - The upstream answered: the time from the request's last byte written to the
///   response head (not the client's upload or download), an error when it answered 5xx.
/// - No answer, and the upstream is to blame: the gateway could not connect (the connect
///   time), or the request was fully sent and the upstream failed or timed out before
///   its head (the time since the last byte): an error.
/// - Otherwise nothing: the client went away or failed, the gateway refused or timed the
///   client out, or the upstream failed while the client was still uploading.
fn upstream_sample(
    ctx: &RequestCtx,
    started: tokio::time::Instant,
    e: Option<&Error>,
) -> Option<(std::time::Duration, bool)> {
    if let Some((at, status)) = ctx.upstream_head {
        // An upstream that answers before the body ends took no time after it.
        let from = ctx.upstream_sent.unwrap_or(at);
        return Some((at.saturating_duration_since(from), status >= 500));
    }
    let e = e.filter(|e| e.esource() == &ErrorSource::Upstream)?;
    if is_connect_failure(e.etype()) {
        return Some((started.elapsed(), true));
    }
    ctx.upstream_sent.map(|sent| (sent.elapsed(), true))
}

/// Whether the gateway never got a connection to the upstream.
fn is_connect_failure(t: &ErrorType) -> bool {
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

/// The next upstream of a balanced route (round robin over the healthy ones); None when
/// every one is down.
fn pick(route: &RouteEntry) -> Option<std::net::SocketAddr> {
    route
        .upstreams
        .select(b"", 256)
        .and_then(|b| b.addr.as_inet().copied())
}

/// How a request that reached `logging` ended.
fn ending(e: Option<&Error>, status: u16) -> Ending {
    match e {
        None => Ending::Completed { status },
        Some(e) if e.esource() == &ErrorSource::Downstream => Ending::ClientGone,
        Some(_) if status == 0 => Ending::ClientGone,
        Some(_) => Ending::UpstreamFailed,
    }
}

/// Writes `reply` to the client, keeping the connection reusable (never
/// `respond_error`, which closes it), so keep-alive survives a 429 storm.
///
/// # Errors
/// When the client connection fails.
/// What is left of a request's body budget; at least a millisecond, so that a read
/// past the deadline fails at once rather than waiting without a timeout.
fn body_budget(deadline: tokio::time::Instant) -> std::time::Duration {
    deadline
        .saturating_duration_since(tokio::time::Instant::now())
        .max(std::time::Duration::from_millis(1))
}

pub async fn write(session: &mut Session, reply: &Reply) -> pingora::Result<()> {
    let mut resp = ResponseHeader::build(reply.status, Some(4 + reply.headers.len()))?;
    resp.insert_header("content-type", HeaderValue::from_static("application/json"))?;
    resp.insert_header("content-length", reply.body.len())?;
    resp.insert_header("cache-control", HeaderValue::from_static("no-store"))?;
    for (name, value) in &reply.headers {
        resp.insert_header(*name, value.clone())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(reply.body.clone()), true)
        .await?;
    Ok(())
}

fn peer_ip(session: &Session) -> IpAddr {
    crate::edge::peer_ip(session.client_addr())
}
