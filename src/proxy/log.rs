//! The access-log line and the trace of a request ending in `logging` (built only with
//! the log, or tracing, on).

use pingora::proxy::Session;
use pingora::Error;

use super::RequestCtx;
use crate::access_log::{rfc3339_ms, AccessLog, Entry};
use crate::admission::{Core, Rejection};
use crate::listener::peer_ip;
use crate::otlp::{Finished, Trace, Tracer, Upstream};

/// The scope and window of a rate-limit rejection (`concurrent` for a concurrency one).
pub(super) fn rejected(r: &Rejection) -> Option<(&'static str, &'static str)> {
    match r {
        Rejection::RateLimited { governing, .. } => {
            Some((governing.scope.as_str(), governing.window.label()))
        }
        Rejection::Concurrent { full, .. } => Some((full.scope.as_str(), "concurrent")),
        _ => None,
    }
}

/// Queues the line of the request `ctx` that ended with `status`.
pub(super) fn write(log: &AccessLog, core: &Core, s: &Session, ctx: &RequestCtx, status: u16) {
    let a = ctx.admission.as_ref();
    let refused = ctx.refused.as_ref();
    let key = a
        .and_then(|a| a.key.as_deref())
        .or_else(|| refused.and_then(|r| r.key.as_deref()));
    let req = s.req_header();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    // The resolved address; the socket's peer only when the request was refused before
    // one was known.
    let client_ip = a
        .map(|a| a.client_ip)
        .or_else(|| refused.and_then(|r| r.client_ip))
        .unwrap_or_else(|| peer_ip(s.client_addr()));
    log.log(Entry {
        time: rfc3339_ms(core.clock.now_ms()),
        request_id: ctx
            .request_id
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .unwrap_or(""),
        client_ip: Some(client_ip.to_string()),
        method: req.method.as_str(),
        path: req.uri.path(),
        route: ctx.route.as_ref().map(|r| &*r.route.name),
        status,
        scope: ctx.rejected.map(|r| r.0),
        window: ctx.rejected.map(|r| r.1),
        // The key scope's identity: a key id, or `jwt:<sub>` for a token.
        key_id: key.and_then(|k| k.key_scope_id()),
        tenant: key.and_then(|k| k.tenant_id()),
        upstream: ctx.upstream_addr.map(|u| u.to_string()),
        duration_ms: ctx.started.map_or(0.0, |t| ms(t.elapsed())),
        upstream_ms: ctx.upstream_started.map(|t| ms(t.elapsed())),
        bytes_in: s.body_bytes_read(),
        bytes_out: s.body_bytes_sent(),
    });
}

/// Hands the trace of the request `ctx` that ended with `status` (and error `e`) to the
/// exporter.
pub(super) fn trace(
    tracer: &Tracer,
    core: &Core,
    s: &Session,
    ctx: &RequestCtx,
    (trace, status, e): (Trace, u16, Option<&Error>),
) {
    if !trace.sampled() {
        return;
    }
    let a = ctx.admission.as_ref();
    let req = s.req_header();
    // Cut before it is queued: a path may be most of a megabyte-long request head.
    let path = crate::config::cap(req.uri.path(), crate::otlp::MAX_PATH);
    let (method, method_original) = crate::otlp::method_label(&req.method);
    let store = trace
        .store_span
        .map(|(at, took)| (at, took, core.store.name()));
    tracer.finish(Finished {
        trace,
        ended: tokio::time::Instant::now(),
        method,
        method_original,
        path: path.to_string(),
        route: ctx.route.as_ref().map(|r| r.route.name.clone()),
        client_ip: a
            .map(|a| a.client_ip)
            .or_else(|| ctx.refused.as_ref().and_then(|r| r.client_ip)),
        status,
        request_id: ctx.request_id.clone(),
        rejected: ctx.rejected,
        store,
        upstream: ctx.upstream_started.map(|started| Upstream {
            started,
            addr: ctx.upstream_addr,
            status: ctx.upstream_head.map(|h| h.1),
        }),
        error: e.map(|e| e.etype().as_str().to_string()),
    });
}
