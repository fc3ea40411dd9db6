//! The gateway's own answers on a Pingora session: a `Reply` written as a complete
//! response, and the answer an error while proxying gets.

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, StatusCode};
use pingora::http::ResponseHeader;
use pingora::proxy::{FailToProxy, Session};
use pingora::{Error, ErrorSource, ErrorType, OrErr};

use crate::reply::headers as rate;
use crate::reply::{error_reply, Reply};

/// Writes `reply` to the client, keeping the connection reusable (never
/// `respond_error`, which closes it), so keep-alive survives a 429 storm.
///
/// # Errors
/// When the client connection fails.
pub async fn write(session: &mut Session, reply: &Reply) -> pingora::Result<()> {
    write_with_id(session, reply.clone(), None).await
}

/// `write`, with the request's `X-Request-Id`; the reply's body and header values are
/// moved into the response, not copied.
///
/// # Errors
/// When the client connection fails.
pub(super) async fn write_with_id(
    session: &mut Session,
    reply: Reply,
    request_id: Option<&HeaderValue>,
) -> pingora::Result<()> {
    let resp = head(reply.status, reply.headers, reply.body.len(), request_id)?;
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(reply.body), true).await?;
    Ok(())
}

/// The head of one of the gateway's own answers, built on `http`'s map with names made
/// once (constants) and without Pingora's case-preserving names map (a `ResponseHeader`
/// from `Parts` has none, as `build_no_case`): Pingora's `insert_header` would parse each
/// name again from bytes, copy a custom one into new `Bytes` and insert it into a second
/// map: 6,322 instructions and 10 allocations of a 429 (`benches/compare.sh`). On HTTP/1
/// the names Pingora knows a title case for go out in it (`Content-Type`), the others as
/// given, in lower case (`retry-after`): header names are case-insensitive (RFC 9110, 5.1).
///
/// # Errors
/// An invalid status or header name (none of the gateway's own), or a map over `http`'s
/// size limit.
fn head(
    status: u16,
    headers: Vec<(&'static str, HeaderValue)>,
    body_len: usize,
    request_id: Option<&HeaderValue>,
) -> pingora::Result<ResponseHeader> {
    let too_many = || Error::explain(ErrorType::InternalError, "response head over http's size");
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status =
        StatusCode::from_u16(status).or_err(ErrorType::InternalError, "invalid status")?;
    let map: &mut HeaderMap = &mut parts.headers;
    map.try_reserve(4 + headers.len()).map_err(|_| too_many())?;
    if let Some(id) = request_id {
        map.try_insert(crate::edge::request_id::HEADER, id.clone())
            .map_err(|_| too_many())?;
    }
    let own = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ),
        (header::CONTENT_LENGTH, HeaderValue::from(body_len)),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
    ];
    for (name, value) in own {
        map.try_insert(name, value).map_err(|_| too_many())?;
    }
    for (name, value) in headers {
        map.try_insert(name_of(name)?, value)
            .map_err(|_| too_many())?;
    }
    Ok(ResponseHeader::from(parts))
}

const X_LIMIT: HeaderName = HeaderName::from_static(rate::LIMIT);
const X_REMAINING: HeaderName = HeaderName::from_static(rate::REMAINING);
const X_RESET: HeaderName = HeaderName::from_static(rate::RESET);
const IETF_POLICY: HeaderName = HeaderName::from_static(rate::IETF_POLICY);
const IETF_LIMIT: HeaderName = HeaderName::from_static(rate::IETF_LIMIT);

/// The `HeaderName` of one of a reply's header names: the rate-limit family's without
/// parsing (a match on the constants), any other parsed.
///
/// # Errors
/// A name `http` refuses (none of the gateway's own).
fn name_of(name: &'static str) -> pingora::Result<HeaderName> {
    Ok(match name {
        rate::LIMIT => X_LIMIT,
        rate::REMAINING => X_REMAINING,
        rate::RESET => X_RESET,
        rate::RETRY_AFTER => header::RETRY_AFTER,
        rate::IETF_POLICY => IETF_POLICY,
        rate::IETF_LIMIT => IETF_LIMIT,
        other => HeaderName::from_bytes(other.as_bytes())
            .or_err(ErrorType::InvalidHTTPHeader, "invalid header name")?,
    })
}

/// Answers `e`, an error while proxying, unless the client is gone or a response has
/// begun. Pingora closes the client's connection after such an error, so the answer says
/// `Connection: close`: a keep-alive client then opens a new connection instead of
/// meeting a reset on its next request.
pub(super) async fn fail(
    session: &mut Session,
    e: &Error,
    request_id: Option<&HeaderValue>,
) -> FailToProxy {
    let (code, body) = failure(e);
    if code > 0 && session.response_written().is_none() {
        session.set_keepalive(None);
        if let Err(err) = write_with_id(session, error_reply(code, body), request_id).await {
            tracing::debug!(error = %err, "cannot write error response");
        }
    }
    FailToProxy {
        error_code: code,
        can_reuse_downstream: false,
    }
}

/// The status and error code of an error while proxying (0: the client is gone, nothing
/// to answer).
fn failure(e: &Error) -> (u16, &'static str) {
    match (e.esource(), e.etype()) {
        (_, ErrorType::HTTPStatus(code)) => (*code, "error"),
        (
            ErrorSource::Upstream,
            ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout,
        ) => (504, "upstream_timeout"),
        (ErrorSource::Upstream, _) => (502, "bad_gateway"),
        // A body read past `body_timeout_secs` (the read timeout is the budget left).
        (ErrorSource::Downstream, ErrorType::ReadTimedout) => (408, "request_timeout"),
        (
            ErrorSource::Downstream,
            ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed,
        ) => (0, ""),
        (ErrorSource::Downstream, _) => (400, "bad_request"),
        _ => (502, "bad_gateway"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(resp: &ResponseHeader) -> String {
        let mut buf = bytes::BytesMut::new();
        resp.header_to_h1_wire(&mut buf);
        String::from_utf8(buf.to_vec()).unwrap()
    }

    /// A 429's head: every header once, the rate-limit family and the reply's others,
    /// with no second (case) map; on the wire the names Pingora titles are titled, the others
    /// as given.
    #[test]
    fn a_reply_head_carries_every_header_once() {
        let id = HeaderValue::from_static("abc");
        let headers = vec![
            (rate::LIMIT, HeaderValue::from_static("10")),
            (rate::REMAINING, HeaderValue::from_static("0")),
            (rate::RESET, HeaderValue::from_static("1764000060")),
            (rate::RETRY_AFTER, HeaderValue::from_static("3")),
            (
                rate::IETF_POLICY,
                HeaderValue::from_static("\"ip-1m\";q=10;w=60"),
            ),
            (
                rate::IETF_LIMIT,
                HeaderValue::from_static("\"ip-1m\";r=0;t=3"),
            ),
            ("www-authenticate", HeaderValue::from_static("Bearer")),
        ];
        let resp = head(429, headers, 42, Some(&id)).unwrap();
        assert_eq!(resp.status, 429);
        assert!(!resp.has_case());
        assert_eq!(resp.headers.len(), 11);
        let text = wire(&resp);
        for line in [
            "x-request-id: abc",
            "Content-Type: application/json",
            "Content-Length: 42",
            "Cache-Control: no-store",
            "x-ratelimit-limit: 10",
            "x-ratelimit-remaining: 0",
            "x-ratelimit-reset: 1764000060",
            "retry-after: 3",
            "ratelimit-policy: \"ip-1m\";q=10;w=60",
            "ratelimit: \"ip-1m\";r=0;t=3",
            "www-authenticate: Bearer",
        ] {
            assert_eq!(
                text.matches(&format!("{line}\r\n")).count(),
                1,
                "{line} in {text}"
            );
        }
    }

    /// A name `http` refuses, or a status out of range, is an error, not a panic.
    #[test]
    fn a_bad_name_or_status_is_an_error() {
        let bad = vec![("bad name", HeaderValue::from_static("x"))];
        assert!(head(200, bad, 0, None).is_err());
        assert!(head(1000, Vec::new(), 0, None).is_err());
    }
}
