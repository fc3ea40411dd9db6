//! The request target as the routes see it and the next hop receives it, for every HTTP
//! transport: the method rule, the normalized path, and one authority (the one `Host`
//! rule). [`Target::parse`] is the one parser; a transport hands it the neutral pieces of
//! its request ([`Wire`]).
//!
//! - The authority of an absolute-form target (or HTTP/2 `:authority`) is the host, and a
//!   `Host` that names another host (or several `Host`s) is refused: the next hop cannot be
//!   handed a host other than the one the route was matched on. Otherwise exactly one
//!   `Host` is required, whatever the version (none or several: 400). Hosts compare
//!   case-insensitively, without port and without one trailing dot.
//! - The path is normalized by `path::normalize` (400 `invalid_path` when ambiguous).
//! - A next hop in origin form (`Hop::Origin`, the proxy's upstream) receives that host
//!   (with the port as sent) in `Host` and the path in origin form; an in-process next hop
//!   (`Hop::Kept`, the tower layer's inner service) keeps the URI's form with the
//!   normalized path.
//!
//! The Pingora adapter reads what its `http::Uri` leaves out (an absolute-form authority
//! and a target that is no path) from the raw request line (`proxy::target`).

use std::borrow::Cow;

use http::header::HOST;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method, Uri};

use super::path::{self, Normalized};
use crate::admission::Rejection;

/// The transport-neutral pieces of a request the target is parsed from.
#[derive(Debug, Clone)]
pub struct Wire<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The parsed request target.
    pub uri: &'a Uri,
    /// The request headers (`Host`; the credentials and custom scopes read them too).
    pub headers: &'a HeaderMap,
    /// What the transport read from the raw request-target bytes that `uri` does not
    /// hold: the authority of an absolute-form target kept out of `uri` (Pingora), or
    /// the refusal of a target that is no path. `Ok(None)` when `uri` holds it all.
    pub raw: Result<Option<&'a [u8]>, Rejection>,
    /// The form the next hop receives the target in.
    pub hop: Hop,
}

/// The form the next hop receives a request's target in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// Origin form and the routed `Host` (a proxied upstream, RFC 9112 §3.2.1).
    Origin,
    /// The URI's own form with the normalized path (an in-process service).
    Kept,
}

/// Where a request goes, as the routes see it, and what the next hop must receive.
#[derive(Debug)]
pub struct Target<'a> {
    /// Lower-case host without port and trailing dot (always present: a request without
    /// one is refused; None only where a caller builds a target without one).
    pub host: Option<Cow<'a, str>>,
    /// The normalized path.
    pub path: Normalized<'a>,
    /// The raw query (`[auth] key_query` reads the key from it).
    pub query: Option<&'a str>,
    /// The `Host` the next hop must receive, when it differs from the client's
    /// (`Hop::Origin` only).
    pub host_header: Option<HeaderValue>,
    /// The URI the next hop must receive, when it differs from the client's.
    pub uri: Option<Uri>,
}

// === impl Target ===

impl<'a> Target<'a> {
    /// The target of `wire`, given whether `[server] path_parameters` allows them.
    ///
    /// # Errors
    /// 405 for a refused method, 400 `invalid_path` or `invalid_host`.
    pub fn parse(wire: Wire<'a>, allow_params: bool) -> Result<Self, Rejection> {
        if !method_allowed(wire.method) {
            return Err(Rejection::MethodNotAllowed);
        }
        let raw = wire.raw?;
        let path = normalized(wire.uri.path(), allow_params)?;
        let (authority, in_target) = match (wire.uri.authority(), raw) {
            (Some(a), _) => (a.as_str().as_bytes(), true),
            (None, Some(a)) => (a, true),
            (None, None) => (single_host(wire.headers)?, false),
        };
        let (host, port) = parse_authority(authority).ok_or(Rejection::InvalidHost)?;
        if in_target {
            agrees(wire.headers, &host)?;
        }
        let (host_header, uri) = match wire.hop {
            Hop::Origin => {
                let host_header = if in_target || needs_rewrite(authority, &host, port) {
                    Some(host_value(&host, port)?)
                } else {
                    None
                };
                let uri = if in_target || matches!(path.forward, Cow::Owned(_)) {
                    Some(origin_form(&path.forward, wire.uri.query())?)
                } else {
                    None
                };
                (host_header, uri)
            }
            Hop::Kept => match &path.forward {
                Cow::Owned(p) => (None, Some(with_path(wire.uri, p)?)),
                Cow::Borrowed(_) => (None, None),
            },
        };
        Ok(Target {
            host: Some(host),
            path,
            query: wire.uri.query(),
            host_header,
            uri,
        })
    }

    /// The host the routes match on, if any.
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }
}

/// An authority taken from the request target: no `Host`, or one naming the same host.
fn agrees(headers: &HeaderMap, host: &str) -> Result<(), Rejection> {
    let mut hosts = headers.get_all(HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) => Ok(()),
        (Some(h), None) if parse_authority(h.as_bytes()).is_some_and(|(h, _)| h == host) => Ok(()),
        _ => Err(Rejection::InvalidHost),
    }
}

/// The routed host (and the port as sent) as a `Host` value.
fn host_value(host: &str, port: Option<u16>) -> Result<HeaderValue, Rejection> {
    let value = match port {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    HeaderValue::from_str(&value).map_err(|_| Rejection::InvalidHost)
}

/// Whether the client's `Host` (`sent`) differs from the normalized host (case, trailing
/// dot).
fn needs_rewrite(sent: &[u8], host: &str, port: Option<u16>) -> bool {
    let plain = sent.len() == host.len() + port.map_or(0, |p| 1 + digits(p));
    !(plain && sent.starts_with(host.as_bytes()))
}

fn digits(p: u16) -> usize {
    p.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// `path?query` as an origin-form URI.
fn origin_form(path: &str, query: Option<&str>) -> Result<Uri, Rejection> {
    let pq = match query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    Uri::builder()
        .path_and_query(pq)
        .build()
        .map_err(|_| Rejection::InvalidPath)
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
fn with_path(uri: &Uri, path: &str) -> Result<Uri, Rejection> {
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let mut parts = uri.clone().into_parts();
    let pq = PathAndQuery::from_maybe_shared(pq).map_err(|_| Rejection::InvalidPath)?;
    parts.path_and_query = Some(pq);
    Uri::from_parts(parts).map_err(|_| Rejection::InvalidPath)
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
    if raw.first() == Some(&b'[') {
        return bracketed(raw);
    }
    // A reg-name cannot hold ':' and a port is digits: the first ':' splits them (a
    // second one fails either way).
    let (host, port) = match raw.iter().position(|&b| b == b':') {
        Some(i) => (&raw[..i], Some(port(&raw[i + 1..])?)),
        None => (raw, None),
    };
    let host = host.strip_suffix(b".").unwrap_or(host);
    if host.is_empty() || host.len() > MAX_HOST {
        return None;
    }
    let upper = reg_name(host)?;
    // ASCII by now.
    let host = std::str::from_utf8(host).ok()?;
    let host = match upper {
        true => Cow::Owned(host.to_ascii_lowercase()),
        false => Cow::Borrowed(host),
    };
    Some((host, port))
}

/// `[v6][:port]` -> (the literal in brackets, lower case; port).
fn bracketed(raw: &[u8]) -> Option<(Cow<'_, str>, Option<u16>)> {
    let s = std::str::from_utf8(raw).ok()?;
    let (v6, after) = s.strip_prefix('[')?.split_once(']')?;
    v6.parse::<std::net::Ipv6Addr>().ok()?;
    let port = match after {
        "" => None,
        p => Some(port(p.strip_prefix(':')?.as_bytes())?),
    };
    let host = &s[..v6.len() + 2];
    let host = match host.bytes().any(|b| b.is_ascii_uppercase()) {
        true => Cow::Owned(host.to_ascii_lowercase()),
        false => Cow::Borrowed(host),
    };
    Some((host, port))
}

/// A port: 1 to 5 digits, at most 65535.
fn port(p: &[u8]) -> Option<u16> {
    if p.is_empty() || p.len() > 5 {
        return None;
    }
    let mut n = 0u32;
    for &b in p {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u32::from(b - b'0');
    }
    u16::try_from(n).ok()
}

/// A reg-name of letters, digits, `-`, `_` and non-empty dot-separated labels (no
/// leading, trailing or double dot), in one pass: whether it has upper-case letters;
/// None: not a reg-name.
fn reg_name(h: &[u8]) -> Option<bool> {
    let (mut prev, mut upper) = (b'.', false);
    for &b in h {
        match b {
            b'.' if prev == b'.' => return None,
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {}
            b'A'..=b'Z' => upper = true,
            _ => return None,
        }
        prev = b;
    }
    (prev != b'.').then_some(upper)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::request::Parts;
    use http::Version;

    // The tower layer's request form (the Pingora form's tables are in `proxy::target`).

    fn routed(p: &Parts, allow_params: bool) -> Result<Target<'_>, Rejection> {
        let wire = Wire {
            method: &p.method,
            uri: &p.uri,
            headers: &p.headers,
            raw: Ok(None),
            hop: Hop::Kept,
        };
        Target::parse(wire, allow_params)
    }

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
