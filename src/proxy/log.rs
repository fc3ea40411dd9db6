//! The access-log line of a request ending in `logging` (built only with the log on).

use pingora::proxy::Session;

use super::RequestCtx;
use crate::access_log::{rfc3339_ms, AccessLog, Entry};
use crate::admission::{Core, Rejection};
use crate::edge::peer_ip;

/// The scope and window of a rate-limit rejection.
pub(super) fn rejected(r: &Rejection) -> Option<(&'static str, &'static str)> {
    match r {
        Rejection::RateLimited { governing, .. } => {
            Some((governing.scope.as_str(), governing.window.label()))
        }
        _ => None,
    }
}

/// Queues the line of the request `ctx` that ended with `status`.
pub(super) fn write(log: &AccessLog, core: &Core, s: &Session, ctx: &RequestCtx, status: u16) {
    let a = ctx.admission.as_ref();
    let key = a.and_then(|a| a.key.as_deref());
    let req = s.req_header();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    let client_ip = a.map_or_else(|| peer_ip(s.client_addr()), |a| a.client_ip);
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
        key_id: key.map(|k| &*k.key_id),
        tenant: key.map(|k| &*k.tenant),
        upstream: ctx.upstream_addr.map(|u| u.to_string()),
        duration_ms: ctx.started.map_or(0.0, |t| ms(t.elapsed())),
        upstream_ms: ctx.upstream_started.map(|t| ms(t.elapsed())),
        bytes_in: s.body_bytes_read(),
        bytes_out: s.body_bytes_sent(),
    });
}
