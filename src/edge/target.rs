//! The request target as the routes see it, for every transport: the method rule, the
//! normalized path, and one authority (the one `Host` rule).
//!
//! - The authority of an absolute-form target (or HTTP/2 `:authority`) is the host;
//!   otherwise exactly one `Host` is required (none or several: 400). Hosts compare
//!   case-insensitively, without port and without one trailing dot.
//! - The path is normalized by `path::normalize` (400 `invalid_path` when ambiguous).
//!
//! The Pingora adapter reads an absolute-form authority from the raw request line
//! (`proxy::target`); the rest of the rule is here.

use std::borrow::Cow;

use http::header::HOST;
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{HeaderMap, Uri};

use super::path::{self, Normalized};
use crate::admission::Rejection;

/// Where a request goes, as the routes see it.
#[derive(Debug)]
pub struct Routed<'a> {
    /// Lower-case host without port and trailing dot.
    pub host: Option<Cow<'a, str>>,
    /// The normalized path.
    pub path: Normalized<'a>,
    /// The URI the next hop must see, when normalization changed the path.
    pub uri: Option<Uri>,
    /// The raw query.
    pub query: Option<&'a str>,
}

/// The host and normalized path of `parts` (an `http` request: the tower layer's).
///
/// # Errors
/// 405 for a refused method, 400 `invalid_path` or `invalid_host`.
pub fn routed(parts: &Parts, allow_params: bool) -> Result<Routed<'_>, Rejection> {
    if !method_allowed(&parts.method) {
        return Err(Rejection::MethodNotAllowed);
    }
    let path = normalized(parts.uri.path(), allow_params)?;
    let host = match parts.uri.authority() {
        // Absolute form (or HTTP/2 `:authority`): routed by it, and a `Host` that names
        // another host is refused, so the next hop cannot be handed a host other than
        // the one the route was matched on.
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
    Ok(Routed {
        host,
        path,
        uri,
        query: parts.uri.query(),
    })
}

/// `raw` normalized (`path::normalize`), or 400 `invalid_path`.
///
/// # Errors
/// `Rejection::InvalidPath` when the path is ambiguous.
pub fn normalized(raw: &str, allow_params: bool) -> Result<Normalized<'_>, Rejection> {
    path::normalize(raw, allow_params).map_err(|e| {
        tracing::debug!(error = %e, "invalid path");
        Rejection::InvalidPath
    })
}

/// A `Host` value (or any authority) as the routes see it: the lower-case host without
/// port, or 400 `invalid_host`.
///
/// # Errors
/// `Rejection::InvalidHost` when it is no valid authority.
pub fn host(raw: &[u8]) -> Result<Cow<'_, str>, Rejection> {
    parse_authority(raw)
        .map(|(h, _)| h)
        .ok_or(Rejection::InvalidHost)
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

/// Longest accepted host (RFC 1035 names are at most 253 characters).
const MAX_HOST: usize = 253;

/// The one `Host` of a request: none or several are refused, whatever the version (an
/// HTTP/1.0 request without `Host` would reach the upstream's default virtual host, which
/// need not be the one its route was chosen for).
pub fn single_host(headers: &HeaderMap) -> Result<&[u8], Rejection> {
    let mut hosts = headers.get_all(HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(h), None) => Ok(h.as_bytes()),
        _ => Err(Rejection::InvalidHost),
    }
}

/// Whether the gateway forwards a request with this method (the rule is
/// `config::method_forwarded`, which a route's `methods` are checked against too).
pub fn method_allowed(m: &http::Method) -> bool {
    crate::config::method_forwarded(m)
}

/// `host[:port]` or `[v6][:port]` -> (lower-case host without one trailing dot, port).
pub fn parse_authority(raw: &[u8]) -> Option<(Cow<'_, str>, Option<u16>)> {
    let s = std::str::from_utf8(raw).ok()?;
    if s.contains('@') {
        return None; // userinfo has no place in a request target
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        v6.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (&s[..v6.len() + 2], port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            Some(p.parse::<u16>().ok()?)
        }
        Some(_) => return None,
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.len() > MAX_HOST || !valid_host(host) {
        return None;
    }
    let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    };
    Some((host, port))
}

/// A reg-name of letters, digits, `-`, `_` and non-empty dot-separated labels, or an
/// IPv6 literal in brackets (already checked).
fn valid_host(h: &str) -> bool {
    if h.starts_with('[') {
        return true;
    }
    // One pass: allowed bytes only, and no empty label (no leading, trailing or double dot).
    let mut prev = b'.';
    for &b in h.as_bytes() {
        let ok = match b {
            b'.' => prev != b'.',
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => true,
            _ => false,
        };
        if !ok {
            return false;
        }
        prev = b;
    }
    prev != b'.'
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Version;

    // The tower layer's request form.

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
