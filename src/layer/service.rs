//! `ThrottleService`: admits a request, calls the inner service, and finishes the
//! admission when the inner service's response future resolves, fails or is dropped (a
//! dropped one settles as a client gone, as the proxy's does).

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};

use super::request;
use super::{Caller, Shared};
use crate::admission::{Admission, Refusal, RouteLive};
use crate::edge::target::{Hop, Wire};
use crate::edge::{self, request_id};
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

/// One request through the layer: one `edge::admit_http`, the inner service, one
/// `edge::answered`.
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
    let peer = edge::peer_addr((shared.peer)(&parts.extensions));
    let admitted = admit(&shared, peer, &parts).await;
    let runtime = match &admitted {
        Ok((a, _)) => Some(&a.runtime),
        Err(r) => r.as_ref().and_then(|r| r.runtime.as_ref()),
    };
    let trusted = peer.is_some_and(|p| runtime.is_some_and(|rt| rt.resolver.is_trusted(p)));
    let id = request_id::choose(&parts.headers, trusted);
    let admission = match admitted {
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
            let route = refusal.as_ref().and_then(|r| r.route.as_deref());
            let live = route.map(|r| shared.core.route_state(r));
            route_counters(&shared, route, live.as_deref()).request(reply.status);
            return Ok(request::with_id(request::respond(reply), id));
        }
    };
    request::identity_headers(&mut parts.headers, &admission, trusted);
    parts.headers.insert(request_id::NAME, id.clone());
    parts.extensions.insert(caller(&admission));
    let mut pending = Pending {
        admission: Some(admission),
        shared: shared.clone(),
    };
    let started = tokio::time::Instant::now();
    let result = inner.call(Request::from_parts(parts, body)).await;
    let Some(mut admission) = pending.admission.take() else {
        unreachable!("the admission is taken once, here")
    };
    let status = result.as_ref().map_or(0, |r| r.status().as_u16());
    let live = admission.route.as_ref().map(|r| shared.core.route_state(r));
    let counters = route_counters(&shared, admission.route.as_deref(), live.as_deref());
    counters.request(status);
    counters
        .upstream_seconds
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(mut resp) => {
            // Reserve, then settle, as the proxy does: the inner service reports the cost.
            let metrics = &shared.core.metrics;
            let rate = edge::answered(&mut admission, (status, resp.headers()), metrics);
            request::insert_all(resp.headers_mut(), rate);
            admission.finish(Ending::Completed { status });
            Ok(request::with_id(resp, id))
        }
        Err(e) => {
            admission.finish(Ending::UpstreamFailed);
            Err(e)
        }
    }
}

/// An admitted request while the inner service answers. Dropped with its admission (the
/// response future was dropped before it resolved: the client left), the request settles
/// as the proxy's does for a client gone before the answer (`settle_abandoned`: a client
/// cannot pay less by leaving) and ends `ClientGone`.
struct Pending {
    admission: Option<Admission>,
    shared: Arc<Shared>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(mut a) = self.admission.take() {
            a.settle_abandoned(&self.shared.core.metrics);
            a.finish(Ending::ClientGone);
        }
    }
}

/// Runs the pipeline for `parts` from `peer`: the admission and the URI the inner
/// service must see (a normalized path), or the refusal (None: no peer address to decide
/// on).
async fn admit(
    shared: &Shared,
    peer: Option<IpAddr>,
    parts: &Parts,
) -> Result<(Admission, Option<http::Uri>), Option<Refusal>> {
    let Some(peer) = peer else {
        tracing::error!(
            "no peer address in the request's extensions: see ThrottleLayer::with_peer"
        );
        return Err(None);
    };
    let wire = Wire {
        method: &parts.method,
        uri: &parts.uri,
        headers: &parts.headers,
        raw: Ok(None),
        hop: Hop::Kept,
    };
    match edge::admit_http(&shared.core, peer, wire).await {
        Ok((a, target)) => Ok((a, target.uri)),
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
    route: Option<&RouteEntry>,
    live: Option<&'a RouteLive>,
) -> &'a RouteCounters {
    edge::route_counters(&shared.core, route, live, &shared.unrouted)
}
