//! Every response the gateway writes itself: one `Rejection` type, one renderer, one
//! writer. Responses are written as explicit header + body (never `respond_error`, which
//! closes the connection), so keep-alive survives a 429 storm.

use bytes::Bytes;
use http::HeaderValue;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use serde::Serialize;

use super::headers::{retry_after_secs, RateHeaders};
use crate::limiter::{Scope, WindowDecision};

/// Why the gateway answered instead of the upstream.
#[derive(Debug, Clone)]
pub enum Rejection {
    /// 429: a limit was hit.
    RateLimited {
        /// The rejecting window.
        governing: WindowDecision,
        /// The scope's message template.
        message: Option<String>,
    },
    /// 403: a block matched.
    Blocked(&'static str),
    /// 401: a key is required and none was sent.
    MissingKey,
    /// 401: the key is unknown or malformed.
    InvalidKey,
    /// 404: no route matched (after the ip and global limits passed).
    NoRoute(Option<WindowDecision>),
    /// 400: an ambiguous path (dot segments, encoded separators, ...; see `path`).
    InvalidPath,
    /// 400: no, several or a malformed `Host` (see `target`).
    InvalidHost,
    /// 503: a fail-closed scope could not reach its store.
    Unavailable,
}

/// A rendered response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(&'static str, HeaderValue)>,
    /// JSON body.
    pub body: Bytes,
}

#[derive(Serialize)]
struct RateLimitedBody<'a> {
    error: &'static str,
    scope: &'static str,
    limit: u32,
    current: u64,
    window: &'static str,
    retry_after: f64,
    message: &'a str,
}

const DEFAULT_MESSAGE: &str =
    "Rate limit exceeded: {limit} requests per {window} for this {scope}. Retry in {retry_after}s.";

// === impl Rejection ===

impl Rejection {
    /// Renders the response at `now_ms`.
    pub fn render(&self, now_ms: u64) -> Reply {
        match self {
            Rejection::RateLimited { governing, message } => {
                rate_limited(governing, message.as_deref(), now_ms)
            }
            Rejection::Blocked(scope) => json(
                403,
                format!(r#"{{"error":"blocked","scope":"{scope}"}}"#),
                Vec::new(),
            ),
            Rejection::MissingKey => json(401, r#"{"error":"missing_api_key"}"#.into(), Vec::new()),
            Rejection::InvalidKey => json(401, r#"{"error":"invalid_api_key"}"#.into(), Vec::new()),
            Rejection::NoRoute(rate) => {
                let headers = rate
                    .map(|wd| RateHeaders::new(&wd, now_ms, false).pairs().collect())
                    .unwrap_or_default();
                json(404, r#"{"error":"no_route"}"#.into(), headers)
            }
            Rejection::InvalidPath => json(400, r#"{"error":"invalid_path"}"#.into(), Vec::new()),
            Rejection::InvalidHost => json(400, r#"{"error":"invalid_host"}"#.into(), Vec::new()),
            Rejection::Unavailable => json(
                503,
                r#"{"error":"rate_limiter_unavailable"}"#.into(),
                vec![("retry-after", HeaderValue::from_static("1"))],
            ),
        }
    }

    /// The `scope` a 403 names, from a block scope.
    pub fn blocked(scope: Scope) -> Self {
        Rejection::Blocked(scope.as_str())
    }
}

fn rate_limited(governing: &WindowDecision, template: Option<&str>, now_ms: u64) -> Reply {
    let d = &governing.decision;
    let message = render_message(template.unwrap_or(DEFAULT_MESSAGE), governing);
    let body = RateLimitedBody {
        error: "rate_limit_exceeded",
        scope: governing.scope.as_str(),
        limit: d.limit,
        current: d.current,
        window: governing.window.label(),
        retry_after: d.retry_after_ms as f64 / 1000.0,
        message: &message,
    };
    let body = serde_json::to_string(&body)
        .unwrap_or_else(|_| r#"{"error":"rate_limit_exceeded"}"#.into());
    json(
        429,
        body,
        RateHeaders::new(governing, now_ms, true).pairs().collect(),
    )
}

/// Fills `{limit}`, `{window}`, `{retry_after}` and `{scope}` of a message template.
pub fn render_message(template: &str, wd: &WindowDecision) -> String {
    template
        .replace("{limit}", &wd.decision.limit.to_string())
        .replace("{window}", wd.window.noun())
        .replace(
            "{retry_after}",
            &retry_after_secs(wd.decision.retry_after_ms).to_string(),
        )
        .replace("{scope}", wd.scope.as_str())
}

fn json(status: u16, body: String, headers: Vec<(&'static str, HeaderValue)>) -> Reply {
    Reply {
        status,
        headers,
        body: Bytes::from(body),
    }
}

/// A JSON error body `{"error": code}` with `status`.
pub fn error_reply(status: u16, code: &str) -> Reply {
    json(status, format!(r#"{{"error":"{code}"}}"#), Vec::new())
}

/// Writes `reply` to the client, keeping the connection reusable.
///
/// # Errors
/// When the client connection fails.
pub async fn write(session: &mut Session, reply: &Reply) -> pingora::Result<()> {
    let mut resp = ResponseHeader::build(reply.status, Some(4 + reply.headers.len()))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", reply.body.len())?;
    resp.insert_header("cache-control", "no-store")?;
    for (name, value) in &reply.headers {
        resp.insert_header(*name, value.clone())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(reply.body.clone()), true)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Decision, Window};

    /// The 429 body has the contract's fields and the rendered message.
    #[test]
    fn renders_429_body_and_headers() {
        let governing = WindowDecision {
            scope: Scope::Key,
            window: Window::Second,
            decision: Decision {
                allowed: false,
                limit: 5,
                remaining: 0,
                current: 6,
                reset_after_ms: 800,
                retry_after_ms: 200,
            },
        };
        let r = Rejection::RateLimited {
            governing,
            message: Some(
                "Your plan allows {limit} requests per {window}. Retry in {retry_after}s.".into(),
            ),
        }
        .render(1_764_000_000_000);
        assert_eq!(r.status, 429);
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "error": "rate_limit_exceeded", "scope": "key", "limit": 5, "current": 6, "window": "1s",
                "retry_after": 0.2, "message": "Your plan allows 5 requests per second. Retry in 1s."
            })
        );
        let names: Vec<_> = r
            .headers
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                "x-ratelimit-limit: 5",
                "x-ratelimit-remaining: 0",
                "x-ratelimit-reset: 1764000001",
                "retry-after: 1"
            ]
        );
    }

    /// Fixed bodies of the other rejections.
    #[test]
    fn renders_error_bodies() {
        let cases = [
            (
                Rejection::blocked(Scope::Ip),
                403,
                r#"{"error":"blocked","scope":"ip"}"#,
            ),
            (Rejection::MissingKey, 401, r#"{"error":"missing_api_key"}"#),
            (Rejection::InvalidKey, 401, r#"{"error":"invalid_api_key"}"#),
            (Rejection::NoRoute(None), 404, r#"{"error":"no_route"}"#),
            (
                Rejection::Unavailable,
                503,
                r#"{"error":"rate_limiter_unavailable"}"#,
            ),
        ];
        for (rej, status, body) in cases {
            let r = rej.render(0);
            assert_eq!((r.status, &r.body[..]), (status, body.as_bytes()));
        }
        assert_eq!(Rejection::Unavailable.render(0).headers[0].0, "retry-after");
    }
}
