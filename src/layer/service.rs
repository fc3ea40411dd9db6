//! `ThrottleService`: admits a request, calls the inner service, and finishes the
//! admission when the inner service's response future resolves, fails or is dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};

use super::request;
use super::{Caller, Shared};
use crate::admission::{Admission, Refusal, RouteLive};
use crate::edge;
use crate::metrics::RouteCounters;
use crate::reply::error_reply;
use crate::routing::RouteEntry;
use crate::store::Ending;

/// The future of a [`ThrottleService`] call: admission, then the inner service's.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// The service [`ThrottleLayer`](super::ThrottleLayer) wraps around `S`.
#[derive(Clone)]
pub struct ThrottleService<S> {
    inner: S,
    shared: Arc<Shared>,
}

// === impl ThrottleService ===

impl<S> ThrottleService<S> {
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for ThrottleService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThrottleService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for ThrottleService<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<Response<ResBody>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The instance polled ready is the one called (tower's clone-and-swap).
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        Box::pin(serve(self.shared.clone(), inner, req))
    }
}

/// One request through the layer.
async fn serve<S, ReqBody, ResBody>(
    shared: Arc<Shared>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResBody>, S::Error>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
{
    let (mut parts, body) = req.into_parts();
    let mut admission = match admit(&shared, &parts).await {
        Ok((a, uri)) => {
            if let Some(uri) = uri {
                parts.uri = uri;
            }
            // `[auth] key_query`: the key does not go to the inner service.
            let key_query = a.runtime.config.auth.key_query.as_deref();
            if let Some(uri) = key_query.and_then(|n| edge::query::strip(&parts.uri, n)) {
                parts.uri = uri;
            }
            a
        }
        Err(refusal) => {
            let reply = match &refusal {
                Some(r) => r.reply(),
                None => error_reply(500, "client_address_unavailable"),
            };
            let route = refusal.as_ref().and_then(|r| r.route.as_ref());
            let live = route.map(|r| shared.core.route_state(r));
            route_counters(&shared, route, live.as_deref()).request(reply.status);
            return Ok(request::respond(reply));
        }
    };
    let trusted = (shared.peer)(&parts.extensions)
        .is_some_and(|peer| admission.runtime.resolver.is_trusted(peer));
    request::identity_headers(&mut parts.headers, &admission, trusted);
    parts.extensions.insert(caller(&admission));
    let started = tokio::time::Instant::now();
    let result = inner.call(Request::from_parts(parts, body)).await;
    let status = result.as_ref().map_or(0, |r| r.status().as_u16());
    let live = admission.route.as_ref().map(|r| shared.core.route_state(r));
    let counters = route_counters(&shared, admission.route.as_ref(), live.as_deref());
    counters.request(status);
    counters
        .upstream_seconds
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(mut resp) => {
            // Reserve, then settle, as the proxy does: the inner service reports the cost.
            admission.settle_from(resp.headers(), &shared.core.metrics);
            request::rate_headers(resp.headers_mut(), &admission);
            admission.finish(Ending::Completed { status });
            Ok(resp)
        }
        Err(e) => {
            admission.finish(Ending::UpstreamFailed);
            Err(e)
        }
    }
}

/// Runs the pipeline for `parts`: the admission and the URI the inner service must see
/// (a normalized path), or the refusal (None: no peer address to decide on).
async fn admit(
    shared: &Shared,
    parts: &Parts,
) -> Result<(Admission, Option<http::Uri>), Option<Refusal>> {
    let core = &shared.core;
    let Some(peer) = (shared.peer)(&parts.extensions) else {
        tracing::error!(
            "no peer address in the request's extensions: see ThrottleLayer::with_peer"
        );
        return Err(None);
    };
    let parse = |allow_params| edge::target::routed(parts, allow_params);
    match edge::admit_http(core, peer, (&parts.method, &parts.headers), parse).await {
        Ok((a, routed)) => Ok((a, routed.uri)),
        Err(refusal) => Err(Some(refusal)),
    }
}

/// The admitted request as the inner service's extension.
fn caller(a: &Admission) -> Caller {
    Caller {
        client_ip: a.client_ip,
        route: a.route_name().cloned(),
        key_id: a.key.as_ref().map(|k| k.key_id.clone()),
        tenant: a.key.as_ref().and_then(|k| k.tenant.clone()),
    }
}

/// `throttle_requests_total` of `route` (`none` without one), `live` its state.
fn route_counters<'a>(
    shared: &'a Shared,
    route: Option<&Arc<RouteEntry>>,
    live: Option<&'a RouteLive>,
) -> &'a RouteCounters {
    match (route, live) {
        (Some(r), Some(live)) => live.counters(&shared.core.metrics, &r.route.name),
        _ => &shared.unrouted,
    }
}
