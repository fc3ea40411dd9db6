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
use crate::db::blocks::BlockRow;
use crate::identity::Presented;
use crate::limiter::WindowDecision;
use crate::proxy::admit::{blocked_ip, blocked_key, identify, limit};
use crate::proxy::headers::RateHeaders;
use crate::proxy::respond::{error_reply, Rejection, Reply};
use crate::state::Shared;

/// Largest `/v1/check` body accepted.
const MAX_BODY: usize = 64 * 1024;

/// The admin HTTP app.
pub struct Admin {
    shared: Arc<Shared>,
    token: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockRequest {
    scope: String,
    value: String,
    reason: Option<String>,
    /// RFC 3339 (`2026-12-31T00:00:00Z`).
    expires_at: Option<String>,
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
    /// The admin app over `shared`; the block and reload endpoints need `Authorization:
    /// Bearer <token>` (`$THROTTLE_ADMIN_TOKEN`) and answer 401 without it.
    pub fn new(shared: Arc<Shared>, token: Option<String>) -> Self {
        Self {
            shared,
            token: token.filter(|t| !t.is_empty()),
        }
    }

    fn authorized(&self, session: &ServerSession) -> bool {
        let Some(token) = &self.token else {
            return false;
        };
        let presented = session
            .req_header()
            .headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        let expected = format!("Bearer {token}");
        presented.is_some_and(|p| constant_time_eq(p, expected.as_bytes()))
    }

    async fn reload_config(&self, session: &ServerSession) -> Reply {
        if !self.authorized(session) {
            return json_reply(
                401,
                &serde_json::json!({"error": "unauthorized", "detail": "Authorization: Bearer $THROTTLE_ADMIN_TOKEN required"}),
            );
        }
        // The reload itself runs detached from this connection: a client that hangs up
        // mid-reload cannot leave a half-applied config.
        let shared = self.shared.clone();
        let outcome = tokio::spawn(async move { crate::reload::reload(&shared).await }).await;
        match outcome
            .unwrap_or_else(|e| Err(crate::config::ConfigError::file("reload", e.to_string())))
        {
            Ok(r) => json_reply(
                200,
                &serde_json::json!({"reloaded": true, "source": r.source, "needs_restart": r.needs_restart}),
            ),
            Err(e) => {
                tracing::warn!("config reload rejected: {e}");
                json_reply(
                    400,
                    &serde_json::json!({"error": "invalid_config", "detail": e.to_string()}),
                )
            }
        }
    }

    async fn blocks(&self, session: &mut ServerSession, method: &Method, path: &str) -> Reply {
        if !self.authorized(session) {
            return json_reply(
                401,
                &serde_json::json!({"error": "unauthorized", "detail": "Authorization: Bearer $THROTTLE_ADMIN_TOKEN required"}),
            );
        }
        match (method, path) {
            (&Method::GET, "/v1/blocks") => json_reply(
                200,
                &serde_json::json!({ "blocks": self.shared.dynamic().block_rows.iter().map(block_json).collect::<Vec<_>>() }),
            ),
            (&Method::POST, "/v1/blocks") => match read_body(session).await {
                Ok(body) => self.add_block(&body).await,
                Err(reply) => reply,
            },
            (&Method::DELETE, p) => match p
                .strip_prefix("/v1/blocks/")
                .and_then(|id| id.parse::<i64>().ok())
            {
                Some(id) => self.remove_block(id).await,
                None => error_reply(404, "not_found"),
            },
            _ => error_reply(405, "method_not_allowed"),
        }
    }

    async fn add_block(&self, body: &[u8]) -> Reply {
        let req: BlockRequest = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => {
                return json_reply(
                    400,
                    &serde_json::json!({"error": "invalid_request", "detail": e.to_string()}),
                )
            }
        };
        let bad = |detail: &str| {
            json_reply(
                400,
                &serde_json::json!({"error": "invalid_request", "detail": detail}),
            )
        };
        let value = req.value.trim().to_string();
        // PostgreSQL text cannot hold NUL; no control character belongs in either field.
        if let Some(detail) = text_problem("value", &value, 256)
            .or_else(|| text_problem("reason", req.reason.as_deref().unwrap_or(""), 1024))
        {
            return bad(&detail);
        }
        match req.scope.as_str() {
            "ip" if crate::state::parse_net(&value).is_none() => {
                return bad("value must be an address or CIDR")
            }
            "ip" | "key" | "tenant" if !value.is_empty() => {}
            "ip" | "key" | "tenant" => return bad("value must not be empty"),
            _ => return bad("scope must be ip, key or tenant"),
        }
        let expires_at_ms = match req.expires_at.as_deref().map(crate::config::rfc3339_ms) {
            Some(Some(ms)) => Some(ms as i64),
            Some(None) => return bad("expires_at must be RFC 3339, e.g. 2026-12-31T00:00:00Z"),
            None => None,
        };
        let row = BlockRow {
            id: 0,
            scope: req.scope,
            value,
            reason: req.reason,
            expires_at_ms,
        };
        if self.shared.runtime().config.database_url.is_none() {
            return json_reply(201, &block_json(&self.shared.add_memory_block(row)));
        }
        let Some(pool) = self.shared.db_pool() else {
            return error_reply(503, "database_unavailable");
        };
        match crate::db::blocks::upsert(
            &pool,
            &row.scope,
            &row.value,
            row.reason.as_deref(),
            row.expires_at_ms,
        )
        .await
        {
            Ok(stored) => {
                self.reload(&pool).await;
                json_reply(201, &block_json(&stored))
            }
            Err(e) => json_reply(
                503,
                &serde_json::json!({"error": "database_unavailable", "detail": e.to_string()}),
            ),
        }
    }

    async fn remove_block(&self, id: i64) -> Reply {
        let removed = if self.shared.runtime().config.database_url.is_none() {
            self.shared.remove_memory_block(id)
        } else {
            let Some(pool) = self.shared.db_pool() else {
                return error_reply(503, "database_unavailable");
            };
            match crate::db::blocks::delete(&pool, id).await {
                Ok(found) => {
                    self.reload(&pool).await;
                    found
                }
                Err(_) => return error_reply(503, "database_unavailable"),
            }
        };
        if removed {
            Reply {
                status: 204,
                headers: Vec::new(),
                body: bytes::Bytes::new(),
            }
        } else {
            error_reply(404, "not_found")
        }
    }

    /// This gateway sees its own change at once; the others through NOTIFY.
    async fn reload(&self, pool: &sqlx::PgPool) {
        match crate::db::snapshot::load(&self.shared, pool).await {
            Ok(d) => self.shared.swap_dynamic(d),
            Err(e) => tracing::warn!(error = %e, "snapshot reload after a block change failed"),
        }
    }

    fn readyz(&self) -> Reply {
        let rt = self.shared.runtime();
        let store_ok = self.shared.store.healthy();
        let db_configured = rt.config.database_url.is_some();
        let db_ok = !db_configured || self.shared.db_healthy();
        let body = serde_json::json!({
            "ready": true,
            "degraded": !store_ok || !db_ok,
            "instance_id": rt.config.server.instance_id,
            "store": { "backend": self.shared.store.name(), "healthy": store_ok, "instances": self.shared.store.instances() },
            "database": { "configured": db_configured, "healthy": db_ok },
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
        let caller = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip().to_canonical());
        match self.decide(&req, caller).await {
            Ok(reply) | Err(reply) => reply,
        }
    }

    async fn decide(&self, req: &CheckRequest, caller: Option<IpAddr>) -> Result<Reply, Reply> {
        let rt = self.shared.runtime();
        let now_ms = self.shared.clock.now_ms();
        // A rate-limit answer (also `[limits.auth]`'s) is the documented decision body.
        let reject = |r: Rejection| match r {
            Rejection::RateLimited { governing, .. } => {
                decision_reply(Some(&governing), now_ms, false, false)
            }
            other => other.render(now_ms),
        };
        let ip = req.ip.to_canonical();
        let dynamic = self.shared.dynamic();
        if blocked_ip(&rt, &dynamic, ip, now_ms) {
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
        // Failed lookups count against the given `ip` and against the caller itself, so
        // rotating the `ip` field does not buy more guesses.
        let key = identify(
            &self.shared,
            &rt,
            &dynamic,
            presented,
            auth,
            ip,
            caller,
            now_ms,
        )
        .await
        .map_err(reject)?;
        if let Some(k) = &key {
            blocked_key(&rt, &dynamic, k, now_ms).map_err(reject)?;
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

/// Why a block field cannot be stored: control characters or too long.
fn text_problem(field: &str, s: &str, max: usize) -> Option<String> {
    if s.chars().any(char::is_control) {
        return Some(format!("{field} must not contain control characters"));
    }
    (s.len() > max).then(|| format!("{field} is longer than {max} bytes"))
}

fn block_json(b: &BlockRow) -> serde_json::Value {
    serde_json::json!({
        "id": b.id,
        "scope": b.scope,
        "value": b.value,
        "reason": b.reason,
        "expires_at": b.expires_at_ms.and_then(|ms| u64::try_from(ms).ok()).map(crate::config::format_rfc3339),
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
            (Method::POST, "/v1/reload") => {
                to_response(self.reload_config(session).await, "application/json")
            }
            (m, p) if p == "/v1/blocks" || p.starts_with("/v1/blocks/") => {
                to_response(self.blocks(session, &m, p).await, "application/json")
            }
            (_, "/healthz" | "/readyz" | "/metrics" | "/v1/check") => {
                to_response(error_reply(405, "method_not_allowed"), "application/json")
            }
            _ => to_response(error_reply(404, "not_found"), "application/json"),
        }
    }
}
