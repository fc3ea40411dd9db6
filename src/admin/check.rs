//! `POST /v1/check`: the sidecar decision API, a thin adapter over the admission pipeline.
//! It decides for the `ip` it is given (never the caller's), charging failed key lookups
//! to that `ip` and to the caller, and answers 200 or 429 with the decision as JSON plus
//! the proxy's `X-RateLimit-*` headers. A named adaptive `route` applies that route's
//! current factor (learned from proxied traffic); a check feeds nothing into its window.

use std::net::IpAddr;

use pingora::protocols::http::ServerSession;
use serde::{Deserialize, Serialize};

use super::{invalid, json_reply, read_body};
use crate::admission::{self, AdmitRequest, Core, Origin, Rejection, Target};
use crate::identity::{validate_key, Presented};
use crate::limiter::WindowDecision;
use crate::reply::headers::RateHeaders;
use crate::reply::Reply;
use crate::store::Ending;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    ip: IpAddr,
    api_key: Option<String>,
    route: Option<String>,
    cost: Option<u32>,
}

#[derive(Serialize)]
struct CheckResponse {
    allowed: bool,
    scope: Option<&'static str>,
    /// The route of a route's own window (beside `scope`, as the proxy's 429 names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    route: Option<&'static str>,
    limit: Option<u32>,
    remaining: Option<u32>,
    reset: Option<u64>,
    retry_after: Option<f64>,
    window: Option<&'static str>,
}

/// Decides the request in the body.
pub(super) async fn check(core: &Core, session: &mut ServerSession) -> Reply {
    let body = match read_body(core, session).await {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    let req: CheckRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return invalid(&e.to_string()),
    };
    // Failed key lookups are charged to the named `ip` and, unless the caller proved it
    // is the trusted service (`check_token`), to the caller's address too, so an open
    // API cannot be used to guess keys by rotating `ip`. A service holding the token is
    // not charged for its users' guesses: one user's bad keys must not lock out all.
    let token_set = core.runtime().config.server.check_token.is_some();
    let caller = crate::listener::peer_addr(session.client_addr()).filter(|_| !token_set);
    let request = AdmitRequest {
        skip: Default::default(),
        client_ip: crate::client_ip::canonical(req.ip),
        target: req.route.as_deref().map_or(Target::Any, Target::Named),
        key: req
            .api_key
            .as_deref()
            .map_or(Presented::Missing, |k| validate_key(k.as_bytes())),
        cost: req.cost,
        also_charge: caller,
        origin: Origin::Check,
        attrs: Default::default(),
    };
    match admission::admit(core, &request).await {
        Ok(a) => {
            let mut reply = decision(a.rate.as_ref(), a.now_ms, true, a.shadow_rejected);
            // The proxy's headers of an admitted request (`[server] rate_limit_headers`).
            reply.headers = a.rate_headers().collect();
            a.finish(Ending::Completed { status: 200 });
            reply
        }
        // A rate-limit answer (`[limits.auth]`'s too) is the documented decision body.
        Err(refusal) => match &refusal.rejection {
            Rejection::RateLimited { governing, .. } => {
                let mut reply = decision(Some(governing), refusal.now_ms, false, false);
                // The 429's headers, as the proxy answers it.
                reply.headers = refusal.reply().headers;
                reply
            }
            // A full concurrency scope: the decision body, with no rate-limit headers.
            Rejection::Concurrent { full, .. } => {
                let body = CheckResponse {
                    allowed: false,
                    scope: Some(full.scope.short_name()),
                    route: full.scope.route(),
                    limit: Some(full.limit),
                    remaining: Some(0),
                    reset: None,
                    retry_after: Some(1.0),
                    window: Some("concurrent"),
                };
                let mut reply = json_reply(429, &body);
                reply.headers = vec![crate::reply::headers::retry_soon()];
                reply
            }
            _ => refusal.reply(),
        },
    }
}

/// A decision as `/v1/check` answers it: the JSON body (the headers are the proxy's).
fn decision(wd: Option<&WindowDecision>, now_ms: u64, allowed: bool, shadow: bool) -> Reply {
    let headers = wd.map(|wd| RateHeaders::new(wd, now_ms, !allowed || shadow));
    let body = CheckResponse {
        allowed,
        scope: wd.map(|w| w.scope.short_name()),
        route: wd.and_then(|w| w.scope.route()),
        limit: headers.map(|h| h.limit),
        remaining: headers.map(|h| h.remaining),
        reset: headers.map(|h| h.reset),
        retry_after: wd.map(|w| {
            if allowed {
                0.0
            } else {
                w.decision.retry_after_ms as f64 / 1000.0
            }
        }),
        window: wd.map(|w| w.window.label()),
    };
    json_reply(if allowed { 200 } else { 429 }, &body)
}
