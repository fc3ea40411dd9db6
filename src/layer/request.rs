//! From the pipeline's answers back to `http` types (`edge` parses the request).

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::admission::Admission;
use crate::edge::{forward, request_id};
use crate::reply::Reply;

/// The headers the inner service gets: scrubbed as the proxy scrubs them
/// (`edge::forward::scrubbed`: the client's `X-Throttle-*`, which only the layer sets,
/// names with `_`, URL overrides, and forwarding headers from an untrusted peer), then
/// the key's tenant and id added.
pub(super) fn identity_headers(headers: &mut HeaderMap, a: &Admission, trusted: bool) {
    for name in forward::doomed(headers, a, trusted) {
        headers.remove(name);
    }
    for (name, value) in forward::identity_headers(a).into_iter().flatten().flatten() {
        headers.insert(name, value);
    }
}

/// `resp` with the request's `X-Request-Id` (`edge::request_id`).
pub(super) fn with_id<B>(mut resp: Response<B>, id: HeaderValue) -> Response<B> {
    resp.headers_mut().insert(request_id::NAME, id);
    resp
}

/// The gateway's own answer as a response: the JSON body, `Content-Type`,
/// `Cache-Control: no-store` and the reply's headers.
pub(super) fn respond<B: From<Bytes>>(reply: Reply) -> Response<B> {
    let mut resp = Response::new(B::from(reply.body));
    *resp.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    insert_all(h, reply.headers);
    resp
}

/// Inserts `(name, value)` pairs; the names are the reply module's lower-case constants.
pub(super) fn insert_all(
    h: &mut HeaderMap,
    pairs: impl IntoIterator<Item = (&'static str, HeaderValue)>,
) {
    for (name, value) in pairs {
        if let Ok(name) = HeaderName::from_bytes(name.as_bytes()) {
            h.insert(name, value);
        }
    }
}
