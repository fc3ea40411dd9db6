//! The admin listener: `/healthz`, `/readyz`, `/metrics` and `POST /v1/check`.
//!
//! `/v1/check` is the sidecar decision API: it runs the same blocks, key lookup and layered
//! limits as the proxy for the IP it is given (never the caller's), and answers 200 or
//! 429 with the decision as JSON plus the proxy's `X-RateLimit-*` headers.

use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use http::{Method, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde::{Deserialize, Serialize};

use crate::config::{Auth, Mode};
use crate::identity::Presented;
use crate::limiter::WindowDecision;
use crate::proxy::admit::{blocked_key, limit, lookup_key};
use crate::proxy::headers::RateHeaders;
use crate::proxy::respond::{error_reply, Rejection, Reply};
use crate::state::Shared;

/// Largest `/v1/check` body accepted.
const MAX_BODY: usize = 64 * 1024;

/// The admin HTTP app.
pub struct Admin {
    shared: Arc<Shared>,
}

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
    limit: Option<u32>,
    remaining: Option<u32>,
    reset: Option<u64>,
    retry_after: Option<f64>,
    window: Option<&'static str>,
}

// === impl Admin ===

impl Admin {
    /// The admin app over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    fn readyz(&self) -> Reply {
        let rt = self.shared.runtime();
        let store_ok = self.shared.store.healthy();
        let body = serde_json::json!({
            "ready": true,
            "degraded": !store_ok,
            "instance_id": rt.config.server.instance_id,
            "store": { "backend": self.shared.store.name(), "healthy": store_ok },
            "database": { "configured": rt.config.database_url.is_some(), "healthy": rt.config.database_url.is_none() },
        });
        json_reply(200, &body)
    }

    async fn check(&self, session: &mut ServerSession) -> Reply {
        let body = match read_body(session).await {
            Ok(b) => b,
            Err(reply) => return reply,
        };
        let req: CheckRequest = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return json_reply(
                    400,
                    &serde_json::json!({"error": "invalid_request", "detail": e.to_string()}),
                )
            }
        };
        match self.decide(&req).await {
            Ok(reply) | Err(reply) => reply,
        }
    }

    async fn decide(&self, req: &CheckRequest) -> Result<Reply, Reply> {
        let rt = self.shared.runtime();
        let now_ms = self.shared.clock.now_ms();
        let reject = |r: Rejection| r.render(now_ms);
        let ip = req.ip.to_canonical();
        if rt.blocks.ip(ip, now_ms).is_some() {
            return Err(reject(Rejection::blocked(crate::limiter::Scope::Ip)));
        }
        let route = match &req.route {
            Some(name) => Some(rt.router.find_by_name(name).ok_or_else(|| {
                json_reply(
                    404,
                    &serde_json::json!({"error": "no_route", "route": name}),
                )
            })?),
            None => None,
        };
        let auth = route.map_or(Auth::Optional, |r| r.route.auth);
        let presented = match &req.api_key {
            Some(k) if auth != Auth::None => crate::identity::validate_key(k.as_bytes()),
            _ => Presented::Missing,
        };
        let key = lookup_key(&rt, presented, auth).map_err(reject)?;
        if let Some(k) = &key {
            blocked_key(&rt, k, now_ms).map_err(reject)?;
        }
        let cost = req.cost.or(route.map(|r| r.route.cost)).unwrap_or(1).max(1);
        let mode = route.map_or(Mode::Enforce, |r| r.route.mode);
        match limit(&self.shared, &rt, ip, key.as_deref(), cost, mode).await {
            Ok(out) => Ok(decision_reply(
                out.verdict.governing.as_ref(),
                now_ms,
                true,
                out.shadow_rejected,
            )),
            Err(Rejection::RateLimited { governing, .. }) => {
                Err(decision_reply(Some(&governing), now_ms, false, false))
            }
            Err(other) => Err(reject(other)),
        }
    }
}

fn decision_reply(
    wd: Option<&WindowDecision>,
    now_ms: u64,
    allowed: bool,
    shadow_rejected: bool,
) -> Reply {
    let headers = wd.map(|wd| RateHeaders::new(wd, now_ms, !allowed || shadow_rejected));
    let body = CheckResponse {
        allowed,
        scope: wd.map(|w| w.scope.as_str()),
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
    let mut reply = json_reply(if allowed { 200 } else { 429 }, &body);
    if let Some(mut h) = headers {
        if allowed {
            h.retry_after = None;
        }
        reply.headers = h.pairs().collect();
    }
    reply
}

async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, Reply> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_BODY {
                    return Err(error_reply(413, "body_too_large"));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(_) => return Err(error_reply(400, "invalid_request")),
        }
    }
}

fn json_reply<T: Serialize>(status: u16, body: &T) -> Reply {
    let body = serde_json::to_vec(body).unwrap_or_default();
    Reply {
        status,
        headers: Vec::new(),
        body: body.into(),
    }
}

fn to_response(reply: Reply, content_type: &'static str) -> Response<Vec<u8>> {
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", content_type)
        .header("content-length", reply.body.len())
        .header("cache-control", "no-store");
    for (name, value) in reply.headers {
        builder = builder.header(name, value);
    }
    builder
        .body(reply.body.to_vec())
        .unwrap_or_else(|_| Response::new(Vec::new()))
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let method = session.req_header().method.clone();
        let path = session.req_header().uri.path().to_string();
        match (method, path.as_str()) {
            (Method::GET, "/healthz") => to_response(
                json_reply(200, &serde_json::json!({"status": "ok"})),
                "application/json",
            ),
            (Method::GET, "/readyz") => to_response(self.readyz(), "application/json"),
            (Method::GET, "/metrics") => {
                let body = self.shared.metrics.render();
                to_response(
                    Reply {
                        status: 200,
                        headers: Vec::new(),
                        body: body.into(),
                    },
                    "text/plain; version=0.0.4",
                )
            }
            (Method::POST, "/v1/check") => {
                to_response(self.check(session).await, "application/json")
            }
            (_, "/healthz" | "/readyz" | "/metrics" | "/v1/check") => {
                to_response(error_reply(405, "method_not_allowed"), "application/json")
            }
            _ => to_response(error_reply(404, "not_found"), "application/json"),
        }
    }
}
