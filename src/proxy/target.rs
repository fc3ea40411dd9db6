//! The request target as the gateway routes it and forwards it: one authority and one
//! path, so the route a request is matched on is the route the upstream serves.
//!
//! - The authority of an absolute-form target (`GET http://api.example.com/x`) is the
//!   host (RFC 9112 §3.2.2; Pingora refuses a `Host` that differs from it); otherwise
//!   exactly one `Host` is required for HTTP/1.1 (none or several: 400). Hosts compare case-insensitively, without port and without one
//!   trailing dot; the upstream receives that host (with the port as sent) in `Host` and
//!   the path in origin form.
//! - The path is normalized by `edge::path::normalize` (400 `invalid_path` when ambiguous).

use std::borrow::Cow;

use http::header::HOST;
use http::{HeaderValue, Uri};
use pingora::http::RequestHeader;
use pingora::protocols::http::authority::{raw_target_authority, RawTargetAuthority};

use crate::admission::Rejection;
use crate::edge::path::Normalized;
use crate::edge::target::{method_allowed, normalized, parse_authority, single_host};

/// The routed and forwarded form of a request target.
#[derive(Debug)]
pub struct Target<'a> {
    /// Lower-case host without port and trailing dot (always present: a request without
    /// one is refused).
    pub host: Option<Cow<'a, str>>,
    /// The normalized path.
    pub path: Normalized<'a>,
    /// The `Host` the upstream must receive, when it differs from what the client sent.
    pub host_header: Option<HeaderValue>,
    /// The origin-form URI the upstream must receive, when it differs from the client's.
    pub uri: Option<Uri>,
    /// The raw query.
    pub query: Option<&'a str>,
}

impl crate::edge::Destination for Target<'_> {
    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    fn route_path(&self) -> &str {
        &self.path.route
    }

    fn query(&self) -> Option<&str> {
        self.query
    }
}

/// Works out the target of `req`.
///
/// # Errors
/// 400 `invalid_path` or `invalid_host`.
pub fn target(req: &RequestHeader, allow_params: bool) -> Result<Target<'_>, Rejection> {
    if !method_allowed(&req.method) {
        return Err(Rejection::MethodNotAllowed);
    }
    if !origin_or_absolute(req) {
        return Err(Rejection::InvalidPath);
    }
    let path = normalized(req.uri.path(), allow_params)?;
    // Pingora keeps an absolute-form authority out of `uri` (it is in `raw_path`) and has
    // already refused a `Host` that differs from it, several `Host`s and userinfo.
    let (authority, from_uri) = match req.uri.authority() {
        Some(a) => (Some(a.as_str().as_bytes()), true),
        None => match raw_target_authority(req.raw_path()) {
            RawTargetAuthority::Absolute { authority, .. } => (Some(authority), true),
            RawTargetAuthority::AmbiguousAuthority => return Err(Rejection::InvalidHost),
            RawTargetAuthority::None => (Some(single_host(&req.headers)?), false),
        },
    };
    let (host, port) = match authority {
        Some(a) => {
            let (h, p) = parse_authority(a).ok_or(Rejection::InvalidHost)?;
            (Some(h), p)
        }
        None => (None, None),
    };
    let host_header = match &host {
        Some(h) if from_uri || needs_rewrite(req, h, port) => {
            let value = match port {
                Some(p) => format!("{h}:{p}"),
                None => h.to_string(),
            };
            Some(HeaderValue::from_str(&value).map_err(|_| Rejection::InvalidHost)?)
        }
        _ => None,
    };
    let uri = if from_uri || matches!(path.forward, Cow::Owned(_)) {
        Some(origin_form(&path.forward, req.uri.query())?)
    } else {
        None
    };
    Ok(Target {
        host,
        path,
        host_header,
        uri,
        query: req.uri.query(),
    })
}

/// Whether the request target is what the routes are matched on: origin-form (`/` first)
/// whose path is the parsed URI's path, byte for byte, or absolute-form
/// (`http://host/path`). Anything else (`v1/x`, `%2fv1`, `?a=1`, `x:80/../v1`, a target
/// starting with a space, `*`) is refused: Pingora parses such a target as `/` while it
/// would forward the raw bytes, so the route matched would not be the path forwarded.
fn origin_or_absolute(req: &RequestHeader) -> bool {
    let raw = req.raw_path();
    if raw.first() == Some(&b'/') {
        let path = raw.split(|&b| b == b'?').next().unwrap_or(raw);
        return path == req.uri.path().as_bytes();
    }
    matches!(
        raw_target_authority(raw),
        RawTargetAuthority::Absolute { path_and_query, .. }
            if path_and_query.is_empty() || path_and_query.first() == Some(&b'/')
    )
}

/// Whether the client's `Host` differs from the normalized host (case, trailing dot).
fn needs_rewrite(req: &RequestHeader, host: &str, port: Option<u16>) -> bool {
    let sent = req.headers.get(HOST).map_or(&b""[..], |v| v.as_bytes());
    let plain = sent.len() == host.len() + port.map_or(0, |p| 1 + digits(p));
    !(plain && sent.starts_with(host.as_bytes()))
}

fn digits(p: u16) -> usize {
    p.checked_ilog10().map_or(1, |d| d as usize + 1)
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use http::Version;

    fn req(raw_target: &str, hosts: &[&str], version: Version) -> RequestHeader {
        let mut r = RequestHeader::build("GET", raw_target.as_bytes(), None).unwrap();
        r.set_version(version);
        for h in hosts {
            r.append_header("host", *h).unwrap();
        }
        r
    }

    /// (target, Host headers, version) -> routed host, forwarded Host, forwarded URI.
    type Row<'a> = (
        &'a str,
        &'a [&'a str],
        Version,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
    );

    /// Only origin-form and absolute-form targets are routed: anything Pingora would parse
    /// as `/` while forwarding its raw bytes is 400.
    #[test]
    fn targets_that_are_not_paths_are_refused() {
        for raw in [
            "v1/secret.txt",
            "x:80/../v1/secret.txt",
            "public/../v1/x",
            "%2fv1/a",
            "?a=1",
            "*",
            "x:80%2f..%2fv1",
        ] {
            let r = RequestHeader::build("GET", raw.as_bytes(), None);
            let Ok(mut r) = r else { continue };
            r.append_header("host", "h").unwrap();
            assert!(
                matches!(target(&r, false), Err(Rejection::InvalidPath)),
                "{raw:?} was routed"
            );
        }
        for raw in ["/v1/x", "/v1/x?a=1", "http://h/v1/x", "http://h"] {
            let mut r = RequestHeader::build("GET", raw.as_bytes(), None).unwrap();
            r.append_header("host", "h").unwrap();
            assert!(target(&r, false).is_ok(), "{raw:?}");
        }
    }

    #[test]
    fn authority_table() {
        use Version as V;
        let ok: [Row<'_>; 8] = [
            (
                "/x",
                &["api.example.com"],
                V::HTTP_11,
                Some("api.example.com"),
                None,
                None,
            ),
            (
                "/x",
                &["API.Example.com:8080"],
                V::HTTP_11,
                Some("api.example.com"),
                Some("api.example.com:8080"),
                None,
            ),
            (
                "/x",
                &["internal.example.com."],
                V::HTTP_11,
                Some("internal.example.com"),
                Some("internal.example.com"),
                None,
            ),
            (
                "http://internal.example.com/x",
                &[],
                V::HTTP_11,
                Some("internal.example.com"),
                Some("internal.example.com"),
                Some("/x"),
            ),
            (
                "http://internal.example.com/x?q=1",
                &["public.example.com"],
                V::HTTP_11,
                Some("internal.example.com"),
                Some("internal.example.com"),
                Some("/x?q=1"),
            ),
            ("/x", &["[::1]:80"], V::HTTP_11, Some("[::1]"), None, None),
            (
                "/a//b?z",
                &["h"],
                V::HTTP_11,
                Some("h"),
                None,
                Some("/a/b?z"),
            ),
            (
                "/x",
                &["127.0.0.1:8080"],
                V::HTTP_11,
                Some("127.0.0.1"),
                None,
                None,
            ),
        ];
        for (i, (t, hosts, v, host, hh, uri)) in ok.into_iter().enumerate() {
            let r = req(t, hosts, v);
            let got = target(&r, false).unwrap_or_else(|e| panic!("case {i}: {e:?}"));
            assert_eq!(got.host.as_deref(), host, "case {i} host");
            assert_eq!(
                got.host_header.as_ref().map(|h| h.to_str().unwrap()),
                hh,
                "case {i} Host"
            );
            assert_eq!(
                got.uri.map(|u| u.to_string()).as_deref(),
                uri,
                "case {i} uri"
            );
        }
    }

    /// Missing, duplicate and malformed hosts are refused.
    #[test]
    fn refuses_bad_hosts() {
        let bad: [(&str, &[&str]); 9] = [
            ("/x", &[]),
            ("/x", &["a.example", "b.example"]),
            ("/x", &[""]),
            ("/x", &["a..b"]),
            ("/x", &["a.example.."]),
            ("/x", &["user@a.example"]),
            ("/x", &["a.example:99999"]),
            ("/x", &["a.example:"]),
            ("/x", &["a b"]),
        ];
        for (i, (t, hosts)) in bad.into_iter().enumerate() {
            let r = req(t, hosts, Version::HTTP_11);
            assert!(
                matches!(target(&r, false), Err(Rejection::InvalidHost)),
                "case {i}"
            );
        }
        // HTTP/1.0 without `Host` would reach the upstream's default virtual host.
        let r = req("/x", &[], Version::HTTP_10);
        assert!(matches!(target(&r, false), Err(Rejection::InvalidHost)));
    }

    /// Upper-case token methods pass; TRACE, TRACK, CONNECT and lower-case ones do not.
    #[test]
    fn method_table() {
        let cases = [
            ("GET", true),
            ("POST", true),
            ("PATCH", true),
            ("PROPFIND", true),
            ("TRACE", false),
            ("TRACK", false),
            ("CONNECT", false),
            ("get", false),
            ("Get", false),
            ("trace", false),
            // At most 32 bytes.
            ("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEF", true),
            ("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFG", false),
        ];
        for (m, want) in cases {
            let m = http::Method::from_bytes(m.as_bytes()).unwrap();
            assert_eq!(method_allowed(&m), want, "{m}");
            let mut r = req("/x", &["h"], Version::HTTP_11);
            r.set_method(m.clone());
            let refused = matches!(target(&r, false), Err(Rejection::MethodNotAllowed));
            assert_eq!(refused, !want, "{m}");
        }
    }

    /// A clean request needs no rewrite and allocates nothing for its target.
    #[test]
    fn clean_request_is_borrowed() {
        let r = req("/v1/x?y=1", &["api.example.com"], Version::HTTP_11);
        let t = target(&r, false).unwrap();
        assert!(matches!(t.host, Some(Cow::Borrowed(_))));
        assert!(matches!(t.path.forward, Cow::Borrowed(_)));
        assert!(t.host_header.is_none() && t.uri.is_none());
    }
}
