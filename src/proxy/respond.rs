//! The gateway's own answers on a Pingora session: a `Reply` written as a complete
//! response, and the answer an error while proxying gets.

use http::HeaderValue;
use pingora::http::ResponseHeader;
use pingora::proxy::{FailToProxy, Session};
use pingora::{Error, ErrorSource, ErrorType};

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
    let mut resp = ResponseHeader::build(reply.status, Some(5 + reply.headers.len()))?;
    if let Some(id) = request_id {
        resp.insert_header(crate::edge::request_id::NAME, id.clone())?;
    }
    resp.insert_header("content-type", HeaderValue::from_static("application/json"))?;
    resp.insert_header("content-length", reply.body.len())?;
    resp.insert_header("cache-control", HeaderValue::from_static("no-store"))?;
    for (name, value) in reply.headers {
        resp.insert_header(name, value)?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(reply.body), true).await?;
    Ok(())
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
