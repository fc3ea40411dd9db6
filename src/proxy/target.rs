//! The Pingora side of the one target rule (`edge::target`): what Pingora's parsed URI
//! leaves out of a request target, read from the raw request line it keeps. Pingora keeps
//! an absolute-form authority out of `uri` (it is in `raw_path`) and has already refused a
//! `Host` that differs from it byte for byte, several `Host`s and userinfo.

use pingora::http::RequestHeader;
use pingora::protocols::http::authority::{raw_target_authority, RawTargetAuthority};

use crate::admission::Rejection;
#[cfg(test)]
use crate::edge::target::Target;
use crate::edge::target::{Hop, Wire};

/// `req` as the edge reads it; its upstream receives the target in origin form.
pub fn wire(req: &RequestHeader) -> Wire<'_> {
    Wire {
        method: &req.method,
        uri: &req.uri,
        headers: &req.headers,
        raw: raw_authority(req),
        hop: Hop::Origin,
    }
}

/// The absolute-form authority of the raw target that `req.uri` does not hold, or the
/// refusal of a target the routes cannot be matched on (400 `invalid_path`; an ambiguous
/// authority: 400 `invalid_host`).
fn raw_authority(req: &RequestHeader) -> Result<Option<&[u8]>, Rejection> {
    if !origin_or_absolute(req) {
        return Err(Rejection::InvalidPath);
    }
    if req.uri.authority().is_some() {
        return Ok(None);
    }
    match raw_target_authority(req.raw_path()) {
        RawTargetAuthority::Absolute { authority, .. } => Ok(Some(authority)),
        RawTargetAuthority::AmbiguousAuthority => Err(Rejection::InvalidHost),
        RawTargetAuthority::None => Ok(None),
    }
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

/// The target of a Pingora request (the tables below are the behaviour spec of the
/// proxy's target).
#[cfg(test)]
fn target(req: &RequestHeader, allow_params: bool) -> Result<Target<'_>, Rejection> {
    Target::parse(wire(req), allow_params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::target::method_allowed;
    use http::Version;
    use std::borrow::Cow;

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
                // Pingora lets through only a `Host` equal to the authority, byte for byte.
                "http://internal.example.com/x?q=1",
                &["internal.example.com"],
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
        let bad: [(&str, &[&str]); 10] = [
            ("/x", &[]),
            ("/x", &["a.example", "b.example"]),
            ("/x", &[""]),
            ("/x", &["a..b"]),
            ("/x", &["a.example.."]),
            ("/x", &["user@a.example"]),
            ("/x", &["a.example:99999"]),
            ("/x", &["a.example:"]),
            ("/x", &["a b"]),
            // Refused by Pingora before the gateway sees it, and by the one target rule.
            ("http://internal.example.com/x", &["public.example.com"]),
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
