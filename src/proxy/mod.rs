//! The Pingora `ProxyHttp` adapter over the admission pipeline: it translates, and each
//! phase delegates to one or two functions. `target` hands the request to the edge as its
//! neutral pieces (plus what Pingora keeps only in the raw request line), one
//! `edge::admit_http` parses the target and decides, `upstream` picks the peer and retries
//! a failed connect, `forward` writes the upstream request, `edge::answered` settles the
//! reported cost and gives the rate headers, `timeouts` keeps the client's deadlines,
//! `respond` writes the gateway's own answers (rendered by `reply`), and `RequestCtx`
//! (`ctx`) carries the request between phases and ends it in `logging`.

mod ctx;
mod forward;
pub mod listener;
mod log;
mod respond;
pub mod target;
mod timeouts;
pub mod tls;
mod upstream;

use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorType};

pub use self::ctx::RequestCtx;
pub use self::respond::write;
use crate::access_log::AccessLog;
use crate::admission::{self, Admission, Core};
use crate::edge::request_id;
use crate::lifecycle::Lifecycle;
use crate::listener::peer_ip;
use crate::metrics::RouteCounters;
use crate::otlp::{self, Tracer};
use crate::reply::error_reply;

/// The gateway: one per process, shared by every request.
pub struct Gateway {
    core: Arc<Core>,
    /// Metrics of requests no route matched.
    unrouted: RouteCounters,
    /// `[server] access_log` (None: off).
    access_log: Option<AccessLog>,
    /// `[tracing]` (None: off).
    tracer: Option<Tracer>,
    /// Whether the process is stopping (answers then close their connection).
    lifecycle: Arc<Lifecycle>,
}

// === impl Gateway ===

impl Gateway {
    /// A gateway over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self {
            unrouted: core.metrics.route("none"),
            core,
            access_log: None,
            tracer: None,
            lifecycle: Arc::default(),
        }
    }

    /// The gateway answering with `Connection: close` once `lifecycle` drains.
    pub fn with_lifecycle(mut self, lifecycle: Arc<Lifecycle>) -> Self {
        self.lifecycle = lifecycle;
        self
    }

    /// The gateway with its tracer (`[tracing]`; None: off).
    pub fn with_tracer(mut self, tracer: Option<Tracer>) -> Self {
        self.tracer = tracer;
        self
    }

    /// The gateway with its access log (`[server] access_log`; None: off).
    pub fn with_access_log(mut self, log: Option<AccessLog>) -> Self {
        self.access_log = log;
        self
    }

    /// Runs the pipeline for a proxied request.
    async fn admit(
        &self,
        req: &RequestHeader,
        peer: IpAddr,
        ctx: &mut RequestCtx,
    ) -> Result<Admission, admission::Refusal> {
        let (a, t) = crate::edge::admit_http(&self.core, peer, target::wire(req)).await?;
        ctx.host_header = t.host_header;
        ctx.uri = t.uri;
        Ok(a)
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    /// Boxed: Pingora keeps the context inside the request's future, which moves (is
    /// copied) a few times per request; a pointer instead of the 744 bytes of state costs
    /// one allocation and saves about 2,600 instructions a request (callgrind, with limits
    /// and on a 429 alike).
    type CTX = Box<RequestCtx>;

    fn new_ctx(&self) -> Box<RequestCtx> {
        Box::default()
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<bool> {
        timeouts::arm(session, ctx, &self.core);
        if self.lifecycle.draining() {
            // Pingora reads the client's keep-alive wish with the request head; this
            // answer closes the connection so the client reconnects to the process that
            // stays (or, stopping, to another gateway).
            session.set_keepalive(None);
        }
        if self.access_log.is_some() {
            ctx.started = Some(tokio::time::Instant::now());
        }
        let began = self.tracer.as_ref().map(|_| otlp::Began::now());
        let peer = peer_ip(session.client_addr());
        let admitted = self.admit(session.req_header(), peer, ctx).await;
        let runtime = match &admitted {
            Ok(a) => Some(&a.runtime),
            Err(r) => r.runtime.as_ref(),
        };
        let trusted = runtime.is_some_and(|rt| rt.resolver.is_trusted(peer));
        let id = request_id::choose(&session.req_header().headers, trusted);
        ctx.request_id = Some(id);
        if let (Some(tracer), Some(began)) = (&self.tracer, began) {
            let headers = &session.req_header().headers;
            let mut trace = tracer.trace(began, headers, trusted);
            trace.store_span = match &admitted {
                Ok(a) => a.store_span.as_deref().copied(),
                Err(r) => r.seen.as_ref().and_then(|s| s.store_span),
            };
            ctx.trace = Some(Box::new(trace));
        }
        let a = match admitted {
            Ok(a) => a,
            Err(refusal) => {
                let reply = refusal.reply();
                respond::write_with_id(session, reply, ctx.request_id.as_ref()).await?;
                ctx.rejected = log::rejected(&refusal.rejection);
                ctx.refused = refusal.seen;
                ctx.route = refusal.route;
                return Ok(true);
            }
        };
        forward::strip_upgrade(session.req_header_mut(), a.route.as_deref());
        ctx.route = a.route.clone();
        let available = upstream::choose(ctx, a.route.as_deref());
        ctx.admission = Some(a);
        if !available {
            let reply = error_reply(502, "bad_gateway");
            respond::write_with_id(session, reply, ctx.request_id.as_ref()).await?;
        }
        Ok(!available)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<Box<HttpPeer>> {
        upstream::peer(ctx)
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Box<RequestCtx>,
        e: Box<Error>,
    ) -> Box<Error> {
        upstream::retry(ctx, e)
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        let Some(a) = &ctx.admission else {
            return Ok(());
        };
        let peer = peer_ip(session.client_addr());
        forward::rewrite(upstream, session.req_header(), peer, a, ctx)?;
        if let Some(id) = &ctx.request_id {
            upstream.insert_header(request_id::NAME, id.clone())?;
        }
        if let Some(t) = &ctx.trace {
            upstream.insert_header(otlp::TRACEPARENT, t.upstream_traceparent())?;
            match t.tracestate() {
                Some(state) => upstream.insert_header(otlp::TRACESTATE, state.clone())?,
                None => drop(upstream.remove_header(otlp::TRACESTATE)),
            }
        }
        Ok(())
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        timeouts::body_read(session, ctx, end_of_stream, &self.core);
        ctx.count_bytes(crate::config::Counted::Request, body.as_deref());
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        _end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<Option<std::time::Duration>> {
        ctx.count_bytes(crate::config::Counted::Response, body.as_deref());
        Ok(None)
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        ctx.upstream_head = Some((tokio::time::Instant::now(), resp.status.as_u16()));
        // A 101 the client did not ask for (its `Upgrade` was removed, or never sent)
        // is the upstream's error, not a tunnel: 502.
        if resp.status == http::StatusCode::SWITCHING_PROTOCOLS && !ctx.upgrades() {
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
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        if let Some(id) = &ctx.request_id {
            resp.insert_header(request_id::NAME, id.clone())?;
        }
        let Some(a) = &mut ctx.admission else {
            return Ok(());
        };
        for (name, value) in
            crate::edge::answered(a, (resp.status.as_u16(), &resp.headers), &self.core.metrics)
        {
            resp.insert_header(name, value)?;
        }
        Ok(())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Box<RequestCtx>,
    ) -> FailToProxy {
        respond::fail(session, e, ctx.request_id.as_ref()).await
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Box<RequestCtx>) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        if let Some(log) = &self.access_log {
            log::write(log, &self.core, session, ctx, status);
        }
        if let (Some(tracer), Some(trace)) = (&self.tracer, ctx.trace.take()) {
            log::trace(tracer, &self.core, session, ctx, (*trace, status, e));
        }
        ctx.finish(&self.core, &self.unrouted, status, e);
    }
}
