//! Decisions of the built-in mapping as `RateLimitResponse`s.
//!
//! Each descriptor is its own admission and gets its own status (`combine`): the
//! governing window's (the rejecting one, or on a pass the one with
//! the fewest remaining), with `current_limit` named `<scope>-<window>` (e.g. `key-1m`),
//! `limit_remaining` and `duration_until_reset` as the `X-RateLimit-*` headers give them.
//! A refusal that is not a rate limit (a block, a missing or invalid key, a fail-closed
//! store) is `OVER_LIMIT` too, with no `current_limit`: the protocol has no other way to
//! deny. Every denial carries the proxy's JSON body as `raw_body` (with its content type),
//! which Envoy sends as the body of its local reply.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration;

use crate::admission::{Admission, Refusal, Rejection};
use crate::limiter::{Window, WindowDecision};
use crate::metrics::Metrics;
use crate::reply::headers::RateHeaders;
use crate::store::Ending;

/// The answer to a request whose descriptors were decided one by one, in order: each
/// its own status; `OVER_LIMIT` when any was refused, and then nothing is charged on any
/// (the admitted ones are refunded at once, as a settle to cost 0). The headers and body
/// are the first refusal's, else those of the admitted descriptor with the fewest
/// remaining. Every admission is finished here (Envoy never says when a request ends).
pub(super) fn combine(
    decided: Vec<Result<Admission, Refusal>>,
    metrics: &Metrics,
) -> RateLimitResponse {
    let any_refused = decided.iter().any(Result::is_err);
    let mut statuses = Vec::with_capacity(decided.len());
    let mut chosen: Option<(bool, u32, RateLimitResponse)> = None;
    for d in decided {
        let (one, refusal) = match d {
            Ok(mut a) => {
                let one = admitted(&a, 1);
                if any_refused {
                    a.settle(0, metrics);
                    a.finish(Ending::Completed { status: 429 });
                } else {
                    a.finish(Ending::Completed { status: 200 });
                }
                (one, false)
            }
            Err(r) => (refused(&r, 1), true),
        };
        let remaining = one
            .statuses
            .first()
            .filter(|s| s.current_limit.is_some())
            .map_or(u32::MAX, |s| s.limit_remaining);
        statuses.extend(one.statuses.iter().cloned());
        let better = match &chosen {
            None => true,
            Some((was_refusal, was_remaining, _)) => {
                !was_refusal && (refusal || remaining < *was_remaining)
            }
        };
        if better {
            chosen = Some((refusal, remaining, one));
        }
    }
    let mut response = chosen.map(|(_, _, r)| r).unwrap_or_default();
    response.overall_code = if any_refused {
        Code::OverLimit
    } else {
        Code::Ok
    }
    .into();
    response.statuses = statuses;
    response
}

/// The answer to an admitted request (`OK`; shadow-mode would-be rejections included).
pub(super) fn admitted(a: &Admission, descriptors: usize) -> RateLimitResponse {
    let response_headers_to_add = a
        .rate_headers()
        .map(|(name, value)| header(name, &value))
        .collect();
    let wd = a.rate.as_ref();
    let headers = wd.map(|wd| RateHeaders {
        retry_after: None,
        ..RateHeaders::new(wd, a.now_ms, a.shadow_rejected)
    });
    let status = status(Code::Ok, wd.zip(headers.as_ref()));
    RateLimitResponse {
        overall_code: Code::Ok.into(),
        statuses: vec![status; descriptors],
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

/// The answer to a refused request (`OVER_LIMIT`): the gRPC statuses, with the one
/// rendering of the refusal (`Refusal::reply`) as its headers and body.
pub(super) fn refused(refusal: &Refusal, descriptors: usize) -> RateLimitResponse {
    let reply = refusal.reply();
    let now_ms = refusal.now_ms;
    let wd = match &refusal.rejection {
        Rejection::RateLimited { governing, .. } => Some(governing),
        _ => None,
    };
    let headers = wd.map(|wd| RateHeaders::new(wd, now_ms, true));
    let status = status(Code::OverLimit, wd.zip(headers.as_ref()));
    let mut add: Vec<HeaderValue> = reply
        .headers
        .iter()
        .map(|(name, value)| header(name, value))
        .collect();
    add.push(header(
        "content-type",
        &http::HeaderValue::from_static("application/json"),
    ));
    RateLimitResponse {
        overall_code: Code::OverLimit.into(),
        statuses: vec![status; descriptors],
        response_headers_to_add: add,
        raw_body: reply.body.to_vec(),
        ..RateLimitResponse::default()
    }
}

fn status(code: Code, governing: Option<(&WindowDecision, &RateHeaders)>) -> DescriptorStatus {
    let Some((wd, h)) = governing else {
        return DescriptorStatus {
            code: code.into(),
            ..DescriptorStatus::default()
        };
    };
    DescriptorStatus {
        code: code.into(),
        current_limit: Some(RateLimit {
            name: format!("{}-{}", wd.scope.as_str(), wd.window.label()),
            requests_per_unit: h.limit,
            unit: unit(wd.window).into(),
        }),
        limit_remaining: h.remaining,
        duration_until_reset: Some(duration(wd.decision.reset_after_ms)),
        quota: None,
    }
}

fn unit(w: Window) -> Unit {
    match w {
        Window::Second => Unit::Second,
        Window::Minute => Unit::Minute,
        Window::Hour => Unit::Hour,
        Window::Day => Unit::Day,
        Window::Month | Window::Days30 => Unit::Month,
        Window::Week => Unit::Week,
        Window::Year => Unit::Year,
    }
}

fn duration(ms: u64) -> Duration {
    Duration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        // Under 1e9: fits.
        nanos: i32::try_from(ms % 1000 * 1_000_000).unwrap_or(0),
    }
}

fn header(name: &str, value: &http::HeaderValue) -> HeaderValue {
    HeaderValue {
        key: name.to_string(),
        value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
        ..HeaderValue::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Decision, Scope};

    const NOW_MS: u64 = 1_764_000_000_250;

    /// `rejection` refused at `NOW_MS` (the default header style).
    fn at_now(rejection: Rejection) -> Refusal {
        Refusal {
            now_ms: NOW_MS,
            ..Refusal::from(rejection)
        }
    }

    fn governing(allowed: bool) -> WindowDecision {
        WindowDecision {
            scope: Scope::Key,
            window: Window::Minute,
            decision: Decision {
                allowed,
                limit: 3,
                remaining: if allowed { 2 } else { 0 },
                current: 4,
                reset_after_ms: 41_500,
                retry_after_ms: if allowed { 0 } else { 20_100 },
            },
        }
    }

    fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
        let h = r.response_headers_to_add.iter();
        h.map(|h| (h.key.clone(), h.value.clone())).collect()
    }

    /// A rate-limit rejection: OVER_LIMIT for every descriptor, the rejecting window as
    /// the status, the proxy's 429 headers and JSON body.
    #[test]
    fn rate_limited_is_over_limit_with_the_window() {
        let rejection = Rejection::RateLimited {
            governing: governing(false),
            message: None,
            policy: None,
        };
        let r = refused(&at_now(rejection), 2);
        assert_eq!(r.overall_code, i32::from(Code::OverLimit));
        assert_eq!(r.statuses.len(), 2);
        let s = &r.statuses[1];
        assert_eq!(s.code, i32::from(Code::OverLimit));
        let limit = s.current_limit.clone().unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit),
            ("key-1m", 3)
        );
        assert_eq!(limit.unit, i32::from(Unit::Minute));
        assert_eq!(s.limit_remaining, 0);
        let d = s.duration_until_reset.unwrap();
        assert_eq!((d.seconds, d.nanos), (41, 500_000_000));
        assert_eq!(
            headers(&r),
            [
                ("x-ratelimit-limit", "3"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1764000042"),
                ("retry-after", "21"),
                ("content-type", "application/json"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
        assert_eq!(body["error"], "rate_limit_exceeded");
        assert_eq!(body["scope"], "key");
    }

    /// A block is OVER_LIMIT without a window, with the 403 body.
    #[test]
    fn blocked_is_over_limit_without_a_window() {
        let r = refused(&at_now(Rejection::Blocked(Scope::Ip)), 1);
        assert_eq!(r.overall_code, i32::from(Code::OverLimit));
        assert_eq!(r.statuses[0].current_limit, None);
        assert_eq!(r.raw_body, br#"{"error":"blocked","scope":"ip"}"#);
    }

    /// Statuses describe the governing window of a pass; no Retry-After.
    #[test]
    fn status_of_a_pass() {
        let wd = governing(true);
        let h = RateHeaders {
            retry_after: None,
            ..RateHeaders::new(&wd, NOW_MS, false)
        };
        let s = status(Code::Ok, Some((&wd, &h)));
        assert_eq!((s.code, s.limit_remaining), (i32::from(Code::Ok), 2));
        assert_eq!(status(Code::Ok, None).current_limit, None);
    }
}
