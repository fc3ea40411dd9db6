//! Every answer the gateway writes itself, as HTTP: one renderer of a `Rejection`, the
//! JSON bodies of the contract and the rate-limit headers (`headers`). Used by the proxy
//! and the admin listener alike; writing it to a connection is the transport's business.

pub mod headers;

use bytes::Bytes;
use http::HeaderValue;

use self::headers::{rate_pairs, retry_after_secs};
use crate::admission::{Admission, Refusal, Rejection};
use crate::bans::Ban;
use crate::config::RateLimitHeaders;
use crate::limiter::{Scope, WindowDecision};
use crate::store::slots::Full;

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

/// The 429 body's fields, as `rate_limited_body` writes them (the test checks it against
/// this serialization).
#[cfg(test)]
#[derive(serde::Serialize)]
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

const DEFAULT_CONCURRENT_MESSAGE: &str =
    "Concurrency limit exceeded: {limit} requests in flight at once for this {scope}. Retry in {retry_after}s.";

/// The 429 of a full concurrency scope: `"window":"concurrent"`, `retry_after` 1.0,
/// `Retry-After: 1` and no `X-RateLimit-*` (they describe rate windows).
fn concurrent(code: &str, full: &Full, template: Option<&str>) -> Reply {
    let template = template.unwrap_or(DEFAULT_CONCURRENT_MESSAGE);
    let message = fill(template, full.limit, "concurrent", 1, full.scope);
    let mut body = serde_json::json!({
        "error": code,
        "scope": full.scope.short_name(),
        "limit": full.limit,
        "current": full.current,
        "window": "concurrent",
        "retry_after": 1.0,
        "message": message,
    });
    if let (Some(route), Some(map)) = (full.scope.route(), body.as_object_mut()) {
        map.insert("route".into(), route.into());
    }
    json(429, body.to_string(), vec![headers::retry_soon()])
}

/// The 403 of an automatic ban: its scope, reason and the seconds until it lifts, also as
/// `Retry-After`.
fn banned(code: &str, ban: &Ban, now_ms: u64) -> Reply {
    let retry_after = ban.retry_after_secs(now_ms);
    let body = serde_json::json!({
        "error": code,
        "scope": ban.scope.as_str(),
        "reason": ban.reason,
        "retry_after": retry_after,
    });
    json(
        403,
        body.to_string(),
        vec![(headers::RETRY_AFTER, HeaderValue::from(retry_after))],
    )
}

// === impl Refusal ===

impl Refusal {
    /// The one rendering of a refusal, in the style of the runtime it was refused on
    /// (`[server] rate_limit_headers`) and at its clock reading.
    pub fn reply(&self) -> Reply {
        let style = self
            .runtime
            .as_ref()
            .map_or_else(RateLimitHeaders::default, |rt| {
                rt.config.server.rate_limit_headers
            });
        render(&self.rejection, self.now_ms, style)
    }
}

// === impl Admission ===

impl Admission {
    /// The rate-limit headers of an admitted request (`[server] rate_limit_headers` of
    /// the runtime it was admitted on): a forwarded response was not rejected, so no
    /// `Retry-After`; a shadow-mode would-be rejection shows 0 remaining.
    pub fn rate_headers(&self) -> impl Iterator<Item = (&'static str, HeaderValue)> + '_ {
        let style = self.runtime.config.server.rate_limit_headers;
        let flags = (self.shadow_rejected, false);
        let quotas = self.rate_policy.as_deref();
        self.rate
            .iter()
            .flat_map(move |wd| rate_pairs(style, wd, self.now_ms, flags, quotas))
    }
}

// === impl Rejection ===

impl Rejection {
    /// The error code a refusal answers with (the JSON body's `error`).
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::RateLimited { .. } | Rejection::Concurrent { .. } => "rate_limit_exceeded",
            Rejection::Banned(_) | Rejection::Blocked(_) => "blocked",
            Rejection::MissingKey => "missing_api_key",
            Rejection::InvalidKey => "invalid_api_key",
            Rejection::InvalidToken => "invalid_token",
            Rejection::NoRoute(_) | Rejection::UnknownRoute(_) => "no_route",
            Rejection::InvalidPath => "invalid_path",
            Rejection::InvalidHost => "invalid_host",
            Rejection::MethodNotAllowed => "method_not_allowed",
            Rejection::CostOverCapacity { .. } => "cost_exceeds_capacity",
            Rejection::AmbiguousCredentials => "ambiguous_credentials",
            Rejection::InvalidIdentity(_) => "invalid_identity",
            Rejection::MissingIdentity(_) => "missing_identity",
            Rejection::Unavailable => "rate_limiter_unavailable",
            Rejection::NotReady => "not_ready",
        }
    }
}

/// Renders the answer to `rejection` at `now_ms`, with the rate-limit headers of
/// `style` (`[server] rate_limit_headers`). The body's `error` is `Rejection::code`, the
/// one spelling of each code (`throttle simulate` reports the same strings).
pub fn render(rejection: &Rejection, now_ms: u64, style: RateLimitHeaders) -> Reply {
    let code = rejection.code();
    match rejection {
        Rejection::RateLimited {
            governing,
            message,
            policy,
        } => {
            let headers = rate_pairs(style, governing, now_ms, (true, true), policy.as_deref());
            let template = message.as_deref().unwrap_or(DEFAULT_MESSAGE);
            let body = rate_limited_body(code, governing, template);
            json(429, body, headers.collect())
        }
        Rejection::Concurrent { full, message } => concurrent(code, full, message.as_deref()),
        Rejection::Banned(ban) => banned(code, ban, now_ms),
        Rejection::Blocked(scope) => json(
            403,
            format!(r#"{{"error":"{code}","scope":"{}"}}"#, scope.as_str()),
            Vec::new(),
        ),
        Rejection::NoRoute(rate) => {
            let mut reply = error_reply(404, code);
            if let Some(wd) = rate {
                reply.headers = rate_pairs(style, wd, now_ms, (false, false), None).collect();
            }
            reply
        }
        Rejection::UnknownRoute(name) => json(
            404,
            serde_json::json!({"error": code, "route": name}).to_string(),
            Vec::new(),
        ),
        Rejection::Unavailable | Rejection::NotReady => {
            let mut reply = error_reply(503, code);
            reply.headers = vec![headers::retry_soon()];
            reply
        }
        Rejection::MissingKey | Rejection::InvalidKey => error_reply(401, code),
        // RFC 6750 3.1: the Bearer challenge names the error.
        Rejection::InvalidToken => Reply {
            headers: vec![(
                "www-authenticate",
                HeaderValue::from_static(r#"Bearer error="invalid_token""#),
            )],
            ..error_reply(401, code)
        },
        Rejection::InvalidPath | Rejection::InvalidHost | Rejection::AmbiguousCredentials => {
            error_reply(400, code)
        }
        Rejection::MethodNotAllowed => error_reply(405, code),
        Rejection::CostOverCapacity { cost, capacity } => json(
            400,
            format!(r#"{{"error":"{code}","cost":{cost},"capacity":{capacity}}}"#),
            Vec::new(),
        ),
        // Custom scope names are [a-z][a-z0-9_]*: nothing to escape.
        Rejection::InvalidIdentity(scope) | Rejection::MissingIdentity(scope) => json(
            400,
            format!(r#"{{"error":"{code}","scope":"{}"}}"#, scope.as_str()),
            Vec::new(),
        ),
    }
}

/// The 429 body, written in one pass into one buffer: the same bytes `serde_json` makes
/// of `RateLimitedBody` (its float and string encoders are used for those two fields),
/// without a map serializer or a `replace` per placeholder. `code` needs no escaping (it is
/// `Rejection::code`'s).
fn rate_limited_body(code: &str, g: &WindowDecision, template: &str) -> Vec<u8> {
    let d = &g.decision;
    let mut num = itoa::Buffer::new();
    let mut out = Vec::with_capacity(160 + template.len());
    out.extend_from_slice(br#"{"error":""#);
    out.extend_from_slice(code.as_bytes());
    out.extend_from_slice(br#"","scope":""#);
    out.extend_from_slice(g.scope.short_name().as_bytes());
    if let Some(route) = g.scope.route() {
        // A route's own window: its name beside the scope (route names with limits are
        // [A-Za-z0-9_-], nothing to escape).
        out.extend_from_slice(br#"","route":""#);
        out.extend_from_slice(route.as_bytes());
    }
    out.extend_from_slice(br#"","limit":"#);
    out.extend_from_slice(num.format(d.limit).as_bytes());
    out.extend_from_slice(br#","current":"#);
    out.extend_from_slice(num.format(d.current).as_bytes());
    out.extend_from_slice(br#","window":""#);
    out.extend_from_slice(g.window.label().as_bytes());
    out.extend_from_slice(br#"","retry_after":"#);
    let _ = serde_json::to_writer(&mut out, &(d.retry_after_ms as f64 / 1000.0));
    out.extend_from_slice(br#","message":""#);
    let d = &g.decision;
    let values = (
        d.limit,
        g.window.noun(),
        retry_after_secs(d.retry_after_ms),
        g.scope,
    );
    // A template with nothing to escape (the default one always) is copied as it is: no
    // placeholder's value needs escaping (numbers, a window's noun, a scope's name).
    if template == DEFAULT_MESSAGE || !needs_escape(template) {
        fill_with(template, values, |part| {
            out.extend_from_slice(part.as_bytes())
        });
    } else {
        fill_with(template, values, |part| escape_json(&mut out, part));
    }
    out.extend_from_slice(br#""}"#);
    out
}

/// Whether `s` holds a byte a JSON string escapes (`"`, `\`, a control character).
fn needs_escape(s: &str) -> bool {
    s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\')
}

/// Appends `s` as the inside of a JSON string, escaped as `serde_json` escapes it
/// (`\"`, `\\`, the short escapes, `\u00xx` for other control characters; everything
/// else, non-ASCII included, as it is), copying the runs between escapes whole.
fn escape_json(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if short.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(short);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Fills `{limit}`, `{window}`, `{retry_after}` and `{scope}` of a message template, in
/// one pass (no placeholder value contains a brace, so this equals replacing them one
/// after another).
pub fn render_message(template: &str, wd: &WindowDecision) -> String {
    fill(
        template,
        wd.decision.limit,
        wd.window.noun(),
        retry_after_secs(wd.decision.retry_after_ms),
        wd.scope,
    )
}

/// `render_message` on plain values.
fn fill(template: &str, limit: u32, window: &str, retry_secs: u64, scope: Scope) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    fill_with(template, (limit, window, retry_secs, scope), |part| {
        out.push_str(part);
    });
    out
}

/// The parts of a filled template, in order, to `push`: the text between placeholders
/// and each placeholder's value (`{limit}`, `{window}`, `{retry_after}`, `{scope}`; any
/// other `{` is text).
fn fill_with(
    template: &str,
    (limit, window, retry_secs, scope): (u32, &str, u64, Scope),
    mut push: impl FnMut(&str),
) {
    let mut num = itoa::Buffer::new();
    let mut rest = template;
    while let Some(i) = memchr::memchr(b'{', rest.as_bytes()) {
        // `{` is ASCII: `i` and `i + 1` are character boundaries.
        let (text, tail) = rest.split_at(i);
        push(text);
        let (value, len): (&str, usize) = if tail.starts_with("{limit}") {
            (num.format(limit), 7)
        } else if tail.starts_with("{window}") {
            (window, 8)
        } else if tail.starts_with("{retry_after}") {
            (num.format(retry_secs), 13)
        } else if tail.starts_with("{scope}") {
            (scope.short_name(), 7)
        } else {
            ("{", 1)
        };
        push(value);
        rest = tail.get(len..).unwrap_or_default();
    }
    push(rest);
}

fn json(status: u16, body: impl Into<Bytes>, headers: Vec<(&'static str, HeaderValue)>) -> Reply {
    Reply {
        status,
        headers,
        body: body.into(),
    }
}

/// A JSON error body `{"error": code}` with `status`.
pub fn error_reply(status: u16, code: &str) -> Reply {
    let mut body = String::with_capacity(12 + code.len());
    body.push_str(r#"{"error":""#);
    body.push_str(code);
    body.push_str(r#""}"#);
    json(status, body, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Decision, Scope, Window};

    /// The one-pass body and message are byte for byte what serde_json and a chain of
    /// `replace` made, for awkward templates too.
    #[test]
    fn one_pass_429_body_equals_serde_json() {
        let templates = [
            DEFAULT_MESSAGE,
            "",
            "plain",
            "{limit}{limit} per {window} \"quoted\" \\ back\nnew line\t tab {unknown} {",
            "héllo {scope} {retry_after}s {{limit}} }{",
            "\u{1}control",
            "\u{8}\u{c}\u{1f}\u{7f} {limit",
            "{retry_after}",
        ];
        // Every control character, each between placeholders.
        let controls: String = (0u8..0x20)
            .map(|b| format!("{}{{scope}}", char::from(b)))
            .collect();
        let templates = templates.into_iter().chain([controls.as_str()]);
        for (retry, current) in [(0, 1), (143, 6), (3_599_999, 2), (1_000, u64::MAX)] {
            let g = WindowDecision {
                scope: Scope::Tenant,
                window: Window::Month,
                decision: Decision {
                    allowed: false,
                    limit: 4_000_000,
                    remaining: 0,
                    current,
                    reset_after_ms: 9,
                    retry_after_ms: retry,
                },
            };
            for t in templates.clone() {
                let old_message = t
                    .replace("{limit}", &g.decision.limit.to_string())
                    .replace("{window}", g.window.noun())
                    .replace(
                        "{retry_after}",
                        &retry_after_secs(g.decision.retry_after_ms).to_string(),
                    )
                    .replace("{scope}", g.scope.as_str());
                assert_eq!(render_message(t, &g), old_message, "{t:?}");
                let old = serde_json::to_vec(&RateLimitedBody {
                    error: "rate_limit_exceeded",
                    scope: g.scope.as_str(),
                    limit: g.decision.limit,
                    current: g.decision.current,
                    window: g.window.label(),
                    retry_after: g.decision.retry_after_ms as f64 / 1000.0,
                    message: &old_message,
                })
                .unwrap();
                assert_eq!(
                    rate_limited_body("rate_limit_exceeded", &g, t),
                    old,
                    "{t:?}"
                );
            }
        }
    }

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
        let r = render(
            &Rejection::RateLimited {
                governing,
                message: Some(
                    "Your plan allows {limit} requests per {window}. Retry in {retry_after}s."
                        .into(),
                ),
                policy: None,
            },
            1_764_000_000_000,
            RateLimitHeaders::XRateLimit,
        );
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

    /// Fixed bodies of the other rejections, byte for byte.
    #[test]
    fn renders_error_bodies() {
        let cases = [
            (
                Rejection::Blocked(Scope::Ip),
                403,
                r#"{"error":"blocked","scope":"ip"}"#,
            ),
            (Rejection::MissingKey, 401, r#"{"error":"missing_api_key"}"#),
            (Rejection::InvalidKey, 401, r#"{"error":"invalid_api_key"}"#),
            (Rejection::InvalidToken, 401, r#"{"error":"invalid_token"}"#),
            (Rejection::NoRoute(None), 404, r#"{"error":"no_route"}"#),
            (
                Rejection::UnknownRoute("a\"b".into()),
                404,
                r#"{"error":"no_route","route":"a\"b"}"#,
            ),
            (Rejection::InvalidPath, 400, r#"{"error":"invalid_path"}"#),
            (Rejection::InvalidHost, 400, r#"{"error":"invalid_host"}"#),
            (
                Rejection::AmbiguousCredentials,
                400,
                r#"{"error":"ambiguous_credentials"}"#,
            ),
            (
                Rejection::MethodNotAllowed,
                405,
                r#"{"error":"method_not_allowed"}"#,
            ),
            (
                Rejection::Unavailable,
                503,
                r#"{"error":"rate_limiter_unavailable"}"#,
            ),
        ];
        for (rej, status, body) in cases {
            let r = render(&rej, 0, RateLimitHeaders::Both);
            assert_eq!((r.status, &r.body[..]), (status, body.as_bytes()));
        }
        assert_eq!(
            render(&Rejection::Unavailable, 0, RateLimitHeaders::Ietf).headers[0].0,
            "retry-after"
        );
        let token = render(&Rejection::InvalidToken, 0, RateLimitHeaders::Both);
        assert_eq!(
            token.headers,
            [(
                "www-authenticate",
                HeaderValue::from_static(r#"Bearer error="invalid_token""#)
            )]
        );
        let key = render(&Rejection::InvalidKey, 0, RateLimitHeaders::Both);
        assert!(key.headers.is_empty(), "an API key is no Bearer challenge");
    }
}
