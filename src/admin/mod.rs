//! The admin listener: routing and the admin token. The endpoints live in their own
//! files: `health` (`/healthz`, `/readyz`, `/metrics`), `check` (`POST /v1/check`, the
//! sidecar decision API over the admission pipeline), `blocks` (`/v1/blocks`, one store
//! for the memory and PostgreSQL cases), `top` (`GET /v1/top`, the heaviest identities of
//! the last minute), `usage` (`GET /v1/usage`, read without spending), the
//! PostgreSQL-backed `keys`, `tenants` and `policies` (sharing `dbapi`), `routes` (`GET
//! /v1/routes`, the running config's routes and limits), `console` (the operator's page
//! at `/`), and `POST /v1/reload` and `GET /v1/openapi.json` here.

mod blocks;
mod check;
mod console;
mod dbapi;
mod health;
mod keys;
mod policies;
mod routes;
mod tenants;
mod top;
mod usage;

use std::sync::Arc;

use async_trait::async_trait;
use http::{Method, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde::Serialize;

use self::blocks::BlockStore;
use crate::admission::Core;
use crate::config::Secret;
use crate::reload::snapshot::Database;
use crate::reply::{error_reply, Reply};

/// The OpenAPI 3.1 document of this API (`GET /v1/openapi.json`).
const OPENAPI: &str = include_str!("openapi.json");

/// Every (method, path) `Admin::response` serves, `{id}` standing for a path segment:
/// what `openapi.json` must describe, operation for operation (a unit test checks it).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/index.html"),
    ("GET", "/console.js"),
    ("GET", "/console.css"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("POST", "/v1/check"),
    ("POST", "/v1/reload"),
    ("GET", "/v1/top"),
    ("GET", "/v1/blocks"),
    ("POST", "/v1/blocks"),
    ("DELETE", "/v1/blocks/{id}"),
    ("GET", "/v1/keys"),
    ("POST", "/v1/keys"),
    ("DELETE", "/v1/keys/{id}"),
    ("GET", "/v1/tenants"),
    ("POST", "/v1/tenants"),
    ("GET", "/v1/tenants/{id}"),
    ("PUT", "/v1/tenants/{id}"),
    ("DELETE", "/v1/tenants/{id}"),
    ("GET", "/v1/policies"),
    ("GET", "/v1/policies/{id}"),
    ("PUT", "/v1/policies/{id}"),
    ("GET", "/v1/usage"),
    ("GET", "/v1/routes"),
    ("GET", "/v1/openapi.json"),
];

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024;

/// The admin HTTP app.
pub struct Admin {
    core: Arc<Core>,
    db: Arc<Database>,
    blocks: BlockStore,
    token: Option<Secret>,
}

// === impl Admin ===

impl Admin {
    /// The admin app over `core` and `db`; the block, top and reload endpoints need
    /// `Authorization: Bearer <token>` (`$THROTTLE_ADMIN_TOKEN`) and answer 401 without it.
    pub fn new(core: Arc<Core>, db: Arc<Database>, token: Option<Secret>) -> Self {
        Self {
            blocks: BlockStore::new(&db),
            core,
            db,
            token: token.filter(|t| !t.expose().is_empty()),
        }
    }

    fn authorized(&self, session: &ServerSession) -> bool {
        self.token
            .as_ref()
            .is_some_and(|token| token.authorizes(authorization(session)))
    }

    /// Whether `POST /v1/check` may be answered: always without `[server] check_token`,
    /// else only with `Authorization: Bearer <check_token>` (the admin token is not it).
    fn may_check(&self, session: &ServerSession) -> bool {
        let runtime = self.core.runtime();
        match &runtime.config.server.check_token {
            None => true,
            Some(token) => token.authorizes(authorization(session)),
        }
    }

    async fn reload_config(&self) -> Reply {
        // The reload runs detached from this connection: a client that hangs up
        // mid-reload cannot leave a half-applied config.
        let (core, db) = (self.core.clone(), self.db.clone());
        let outcome = tokio::spawn(async move { crate::reload::reload(&core, &db).await }).await;
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
}

fn unauthorized() -> Reply {
    json_reply(
        401,
        &serde_json::json!({"error": "unauthorized", "detail": "Authorization: Bearer $THROTTLE_ADMIN_TOKEN required"}),
    )
}

fn check_unauthorized() -> Reply {
    json_reply(
        401,
        &serde_json::json!({"error": "unauthorized", "detail": "Authorization: Bearer <[server] check_token> required"}),
    )
}

/// The request body, at most `MAX_BODY` bytes, complete within `body_timeout_secs` (else
/// 408 `request_timeout`, as on the proxy: a dripped body must not hold an admin slot).
async fn read_body(core: &Core, session: &mut ServerSession) -> Result<Vec<u8>, Reply> {
    let within = core.runtime().config.server.body_timeout;
    let read = async {
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
    };
    match tokio::time::timeout(within, read).await {
        Ok(result) => result,
        Err(_) => {
            session.set_keepalive(None); // the rest of the body is never read
            Err(error_reply(408, "request_timeout"))
        }
    }
}

/// 400 `invalid_request` with a detail.
fn invalid(detail: &str) -> Reply {
    json_reply(
        400,
        &serde_json::json!({"error": "invalid_request", "detail": detail}),
    )
}

/// Every `Authorization` value of the request, as received (`Secret::authorizes` wants
/// exactly one).
fn authorization(session: &ServerSession) -> impl Iterator<Item = &[u8]> {
    session
        .req_header()
        .headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .map(|v| v.as_bytes())
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
        const JSON: &str = "application/json";
        let method = session.req_header().method.clone();
        let path = session.req_header().uri.path().to_string();
        if let Some(page) = console::serve(&method, &path) {
            return page;
        }
        let is_blocks = path == "/v1/blocks" || path.starts_with("/v1/blocks/");
        let records = ["/v1/keys", "/v1/tenants", "/v1/policies"]
            .into_iter()
            .find(|c| {
                path.strip_prefix(c)
                    .is_some_and(|r| r.is_empty() || r.starts_with('/'))
            });
        let reply = match (&method, path.as_str()) {
            (&Method::GET, "/healthz") => health::healthz(),
            (&Method::GET, "/readyz") => health::readyz(&self.core, &self.db),
            (&Method::GET, "/metrics") => {
                return to_response(health::metrics(&self.core), "text/plain; version=0.0.4")
            }
            (&Method::GET, "/v1/openapi.json") => Reply {
                status: 200,
                headers: Vec::new(),
                body: bytes::Bytes::from_static(OPENAPI.as_bytes()),
            },
            (&Method::POST, "/v1/check") if !self.may_check(session) => check_unauthorized(),
            (&Method::POST, "/v1/check") => check::check(&self.core, session).await,
            (&Method::POST, "/v1/reload") if self.authorized(session) => self.reload_config().await,
            (&Method::POST, "/v1/reload") => unauthorized(),
            (&Method::GET, "/v1/top") if self.authorized(session) => {
                top::top(&self.core, session.req_header().uri.query())
            }
            (&Method::GET, "/v1/top") => unauthorized(),
            (&Method::GET, "/v1/usage") if self.authorized(session) => {
                usage::usage(&self.core, session.req_header().uri.query()).await
            }
            (&Method::GET, "/v1/routes") if self.authorized(session) => routes::routes(&self.core),
            (&Method::GET, "/v1/usage" | "/v1/routes") => unauthorized(),
            (_, _) if is_blocks && !self.authorized(session) => unauthorized(),
            (_, _) if is_blocks => {
                self.blocks
                    .handle(&self.core, &self.db, session, &method, &path)
                    .await
            }
            (_, _) if records.is_some() && !self.authorized(session) => unauthorized(),
            (_, _) if records == Some("/v1/keys") => {
                keys::handle(&self.core, &self.db, session, &method, &path).await
            }
            (_, _) if records == Some("/v1/tenants") => {
                tenants::handle(&self.core, &self.db, session, &method, &path).await
            }
            (_, _) if records == Some("/v1/policies") => {
                policies::handle(&self.core, &self.db, session, &method, &path).await
            }
            (
                _,
                "/healthz" | "/readyz" | "/metrics" | "/v1/check" | "/v1/top" | "/v1/usage"
                | "/v1/routes" | "/v1/openapi.json",
            ) => error_reply(405, "method_not_allowed"),
            _ => error_reply(404, "not_found"),
        };
        to_response(reply, JSON)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{OPENAPI, ROUTES};

    /// openapi.json describes exactly the operations of `ROUTES`, and is OpenAPI 3.1.
    #[test]
    fn openapi_describes_every_route_and_nothing_else() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut documented = BTreeSet::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for method in ops.as_object().unwrap().keys() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let served: BTreeSet<_> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        assert_eq!(served, documented);
    }
}
