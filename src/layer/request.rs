//! From an `http::Request` to the pipeline's plain data, and from the pipeline's answers
//! back to `http` types: the layer's half of what `proxy::target` does for Pingora.

use std::borrow::Cow;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HOST};
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, Uri};

use crate::admission::{Admission, Rejection};
use crate::proxy::path::{self, Normalized};
use crate::proxy::target::{method_allowed, parse_authority};
use crate::reply::headers::rate_pairs;
use crate::reply::Reply;

/// Where a request goes, as the routes see it.
pub(super) struct Routed<'a> {
    /// Lower-case host without port and trailing dot.
    pub(super) host: Option<Cow<'a, str>>,
    /// The normalized path.
    pub(super) path: Normalized<'a>,
    /// The URI the inner service must see, when normalization changed the path.
    pub(super) uri: Option<Uri>,
}

/// The host and normalized path of `parts`.
///
/// # Errors
/// 400 `invalid_path` or `invalid_host`, as the proxy answers them.
pub(super) fn routed(parts: &Parts, allow_params: bool) -> Result<Routed<'_>, Rejection> {
    if !method_allowed(&parts.method) {
        return Err(Rejection::MethodNotAllowed);
    }
    let path = path::normalize(parts.uri.path(), allow_params).map_err(|e| {
        tracing::debug!(error = %e, "invalid path");
        Rejection::InvalidPath
    })?;
    let host = match parts.uri.authority() {
        // Absolute form (or HTTP/2 `:authority`): routed by it, and a `Host` that names
        // another host is refused, so the inner service cannot be handed a host other
        // than the one the route was matched on.
        Some(a) => {
            let host = parse_authority(a.as_str().as_bytes())
                .ok_or(Rejection::InvalidHost)?
                .0;
            let mut hosts = parts.headers.get_all(HOST).iter();
            match (hosts.next(), hosts.next()) {
                (None, _) => {}
                (Some(h), None)
                    if parse_authority(h.as_bytes()).is_some_and(|(h, _)| h == host) => {}
                _ => return Err(Rejection::InvalidHost),
            }
            Some(host)
        }
        None => {
            let h = single_host(&parts.headers)?;
            Some(parse_authority(h).ok_or(Rejection::InvalidHost)?.0)
        }
    };
    let uri = match &path.forward {
        Cow::Owned(p) => Some(with_path(&parts.uri, p).ok_or(Rejection::InvalidPath)?),
        Cow::Borrowed(_) => None,
    };
    Ok(Routed { host, path, uri })
}

/// The one `Host` of a request: none or several are refused, as the proxy does.
fn single_host(headers: &HeaderMap) -> Result<&[u8], Rejection> {
    let mut hosts = headers.get_all(HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(h), None) => Ok(h.as_bytes()),
        _ => Err(Rejection::InvalidHost),
    }
}

/// `uri` with its path replaced by `path` (query, scheme and authority kept).
fn with_path(uri: &Uri, path: &str) -> Option<Uri> {
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::from_maybe_shared(pq).ok()?);
    Uri::from_parts(parts).ok()
}

/// The headers the inner service gets: scrubbed as the proxy scrubs them
/// (`proxy::scrubbed`: the client's `X-Throttle-*`, which only the layer sets, names with
/// `_`, URL overrides, and forwarding headers from an untrusted peer), then the key's
/// tenant and id added.
pub(super) fn identity_headers(headers: &mut HeaderMap, a: &Admission, trusted: bool) {
    let underscores = a.runtime.config.server.underscores_in_headers;
    let fwd = a.runtime.config.client_ip_header == crate::config::ClientIpHeader::Forwarded;
    let doomed = |n: &HeaderName| crate::proxy::scrubbed(n.as_str(), trusted, underscores, fwd);
    if headers.keys().any(doomed) {
        let doomed: Vec<HeaderName> = headers.keys().filter(|n| doomed(n)).cloned().collect();
        for name in doomed {
            headers.remove(name);
        }
    }
    if let Some((tenant, key_id)) = a.key.as_ref().and_then(|k| k.headers.clone()) {
        headers.insert(HeaderName::from_static("x-throttle-tenant"), tenant);
        headers.insert(HeaderName::from_static("x-throttle-key-id"), key_id);
    }
}

/// Adds the admitted request's rate-limit headers (`[server] rate_limit_headers`) to the
/// inner service's response.
pub(super) fn rate_headers(headers: &mut HeaderMap, a: &Admission) {
    if let Some(wd) = &a.rate {
        let style = a.runtime.config.server.rate_limit_headers;
        // An admitted response was not rejected: no `Retry-After`.
        let flags = (a.shadow_rejected, false);
        insert_all(
            headers,
            rate_pairs(style, wd, a.now_ms, flags, a.rate_policy.as_deref()),
        );
    }
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
fn insert_all(h: &mut HeaderMap, pairs: impl IntoIterator<Item = (&'static str, HeaderValue)>) {
    for (name, value) in pairs {
        if let Ok(name) = HeaderName::from_bytes(name.as_bytes()) {
            h.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Version;

    fn parts(uri: &str, hosts: &[&str], version: Version) -> Parts {
        let mut b = http::Request::builder().uri(uri).version(version);
        for h in hosts {
            b = b.header(HOST, *h);
        }
        b.body(()).unwrap().into_parts().0
    }

    /// Host from the URI's authority first, else the one `Host`; lower-cased, no port.
    #[test]
    fn host_from_authority_or_header() {
        let p = parts("http://API.example.com:8443/v1/x", &[], Version::HTTP_2);
        assert_eq!(
            routed(&p, false).unwrap().host.as_deref(),
            Some("api.example.com")
        );
        let p = parts("/v1/x", &["Api.Example.com."], Version::HTTP_11);
        assert_eq!(
            routed(&p, false).unwrap().host.as_deref(),
            Some("api.example.com")
        );
        let p = parts("/v1/x", &[], Version::HTTP_10);
        assert!(matches!(routed(&p, false), Err(Rejection::InvalidHost)));
    }

    /// No `Host` on HTTP/1.1, several, or a malformed one: 400 `invalid_host`.
    #[test]
    fn bad_hosts_are_refused() {
        for (hosts, version) in [
            (&[][..], Version::HTTP_11),
            (&["a.example", "b.example"][..], Version::HTTP_11),
            (&["user@a.example"][..], Version::HTTP_11),
        ] {
            let p = parts("/x", hosts, version);
            assert!(matches!(routed(&p, false), Err(Rejection::InvalidHost)));
        }
    }

    /// Absolute form: a `Host` naming another host, or several, is refused (the inner
    /// service would otherwise see a host the route was not matched on).
    #[test]
    fn absolute_form_and_host_must_agree() {
        let uri = "http://public.example/x";
        let p = parts(uri, &["admin.example"], Version::HTTP_11);
        assert!(matches!(routed(&p, false), Err(Rejection::InvalidHost)));
        let p = parts(uri, &["public.example", "admin.example"], Version::HTTP_11);
        assert!(matches!(routed(&p, false), Err(Rejection::InvalidHost)));
        let p = parts(uri, &["Public.Example:80"], Version::HTTP_11);
        assert_eq!(
            routed(&p, false).unwrap().host.as_deref(),
            Some("public.example")
        );
        let p = parts(uri, &[], Version::HTTP_11);
        assert_eq!(
            routed(&p, false).unwrap().host.as_deref(),
            Some("public.example")
        );
    }

    /// The inner service sees the normalized path (query kept); ambiguous paths are 400.
    #[test]
    fn path_is_normalized_for_the_inner_service() {
        let p = parts("/v1//%73earch?q=1", &["h"], Version::HTTP_11);
        let r = routed(&p, false).unwrap();
        assert_eq!(r.path.route, "/v1/search");
        assert_eq!(r.uri.unwrap().to_string(), "/v1/search?q=1");
        let p = parts("/v1/search", &["h"], Version::HTTP_11);
        assert!(routed(&p, false).unwrap().uri.is_none());
        let p = parts("/public/%2e%2e/v1/secret", &["h"], Version::HTTP_11);
        assert!(matches!(routed(&p, false), Err(Rejection::InvalidPath)));
    }
}
