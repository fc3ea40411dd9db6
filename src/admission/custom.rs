//! The identities of custom scopes (`[scopes.<name>] from = ...`): read once per request,
//! before any limit, from the request's attributes.
//!
//! A value is the attribute as sent (a header's bytes, a query parameter or cookie
//! decoded, a path segment as normalized), at most [`MAX_IDENTITY`] bytes of UTF-8
//! without control characters; sent twice (two headers, two parameters or two cookies of
//! the name) it is ambiguous. Either is 400 `invalid_identity`: there is no fallback to a
//! shared bucket or to the client address. An absent or empty attribute is `missing`:
//! the scope is left out (`skip`), or 400 `missing_identity` (`reject`).

use super::{AdmitRequest, Rejection, Target};
use crate::config::{Attribute, Counts, CustomScope, Missing, Route};
use crate::identity::KeyInfo;
use crate::limiter::Ident;

/// Longest identity (bytes).
pub const MAX_IDENTITY: usize = 256;

/// What custom scopes read of a request: transport-neutral views of its headers and
/// query (the path comes from the target).
#[derive(Debug, Clone, Copy, Default)]
pub struct Attrs<'a> {
    /// The request headers, as received.
    pub headers: Option<&'a http::HeaderMap>,
    /// The raw query string (after `?`).
    pub query: Option<&'a str>,
}

/// Each custom scope's identity, indexed like `scopes` (None: skipped). A `Vec`: empty
/// (no allocation, three words in the `Admission`) without custom scopes.
pub(super) type Identities = Vec<Option<Ident>>;

/// The identities of `scopes` for `req` on `route`: a scope applies (is read, and may
/// reject) where it has limits: `[limits.<name>]` for every request, a route's
/// `limits.<name>` on that route; elsewhere it is None.
///
/// # Errors
/// 400 `invalid_identity` or `missing_identity` (see the module docs).
pub(super) fn identities(
    (scopes, fold): (&[CustomScope], bool),
    (route, key): (Option<&Route>, Option<&KeyInfo>),
    req: &AdmitRequest<'_>,
) -> Result<Identities, Rejection> {
    let seen = Seen {
        attrs: &req.attrs,
        claims: key.map_or(&[], |k| &k.claims),
        fold,
    };
    let path = match req.target {
        Target::Match { path, .. } => Some(path),
        Target::Named(_) | Target::Any => None,
    };
    let on_route =
        |i: usize| route.is_some_and(|r| r.limits.iter().any(|t| t.counts == Counts::Custom(i)));
    scopes
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if c.limits.is_none() && !on_route(i) {
                return Ok(None);
            }
            let value = match read(&c.from, &seen, path) {
                Ok(v) => v,
                Err(Invalid) => return Err(Rejection::InvalidIdentity(c.scope)),
            };
            match value {
                Some(v) if v.len() > MAX_IDENTITY || v.chars().any(char::is_control) => {
                    Err(Rejection::InvalidIdentity(c.scope))
                }
                Some(v) if !v.is_empty() => Ok(Some(Ident::Name(v.into()))),
                _ if c.missing == Missing::Reject => Err(Rejection::MissingIdentity(c.scope)),
                _ => Ok(None),
            }
        })
        .collect()
}

/// An attribute that cannot be an identity (sent twice, not UTF-8).
struct Invalid;

/// What a request shows: its attributes, and the claims of its verified JWT.
struct Seen<'a> {
    attrs: &'a Attrs<'a>,
    claims: &'a [(String, String)],
    /// `[server] case_insensitive_paths`: path segments are folded.
    fold: bool,
}

/// The attribute's value, if the request carries it.
fn read(from: &Attribute, seen: &Seen<'_>, path: Option<&str>) -> Result<Option<String>, Invalid> {
    let attrs = seen.attrs;
    match from {
        Attribute::Header(name) => {
            let Some(headers) = attrs.headers else {
                return Ok(None);
            };
            let mut values = headers.get_all(name).iter();
            let Some(v) = values.next() else {
                return Ok(None);
            };
            if values.next().is_some() {
                return Err(Invalid);
            }
            std::str::from_utf8(v.as_bytes())
                .map(|s| Some(s.trim().to_string()))
                .map_err(|_| Invalid)
        }
        Attribute::Query(name) => match crate::identity::query_param(attrs.query, name) {
            // Decoding is lossy: a value that was not UTF-8 comes back with U+FFFD.
            Ok(Some(v)) if v.contains('\u{FFFD}') => Err(Invalid),
            Ok(v) => Ok(v.map(|v| v.into_owned())),
            Err(_) => Err(Invalid),
        },
        Attribute::Cookie(name) => cookie(attrs.headers, name),
        Attribute::Path(n) => {
            let segment = path.and_then(|p| p.split('/').filter(|s| !s.is_empty()).nth(n - 1));
            // With `case_insensitive_paths` the upstream resolves `/orgs/ACME` and
            // `/orgs/acme` alike: one identity, as the router folds them.
            Ok(segment.map(|s| match seen.fold {
                true => crate::routing::fold_path(s),
                false => s.to_string(),
            }))
        }
        Attribute::Jwt(claim) => Ok(seen
            .claims
            .iter()
            .find(|(name, _)| name == claim)
            .map(|(_, v)| v.clone())),
    }
}

/// The cookie `name` over every `Cookie` header, read as common parsers read it (RFC 6265
/// `name=value; ...`, and `,` separating cookies as `;` does, as older servers and
/// frameworks split them): names and values trimmed of spaces and tabs, then a value's
/// surrounding double quotes dropped. So `sess= abc`, `sess="abc"` and `other=1, sess=abc`
/// are all the session `abc` an upstream would read; the name twice is ambiguous.
fn cookie(headers: Option<&http::HeaderMap>, name: &str) -> Result<Option<String>, Invalid> {
    let Some(headers) = headers else {
        return Ok(None);
    };
    let mut found = None;
    for h in headers.get_all(http::header::COOKIE) {
        // Not skipped when not UTF-8: a second cookie of the name could hide there.
        let s = std::str::from_utf8(h.as_bytes()).map_err(|_| Invalid)?;
        for pair in s.split([';', ',']) {
            let Some((n, v)) = pair.split_once('=') else {
                continue;
            };
            if n.trim_matches([' ', '\t']) == name {
                if found.is_some() {
                    return Err(Invalid);
                }
                let v = v.trim_matches([' ', '\t']);
                let v = v
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(v);
                found = Some(v.to_string());
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn each_attribute_kind() {
        let h = headers(&[
            ("x-user", "alice"),
            ("cookie", "a=1; session=s3"),
            ("cookie", "b=2"),
        ]);
        let attrs = Attrs {
            headers: Some(&h),
            query: Some("org=acme&x=1"),
        };
        let claims = [("org".to_string(), "o-7".to_string())];
        let seen = Seen {
            attrs: &attrs,
            claims: &claims,
            fold: false,
        };
        let path = Some("/v1/orgs/acme/items");
        let read = |from| read(&from, &seen, path).ok().flatten();
        assert_eq!(read(Attribute::Jwt("org".into())).as_deref(), Some("o-7"));
        assert_eq!(read(Attribute::Jwt("sub".into())), None);
        let header = Attribute::Header(http::HeaderName::from_static("x-user"));
        assert_eq!(read(header).as_deref(), Some("alice"));
        assert_eq!(
            read(Attribute::Query("org".into())).as_deref(),
            Some("acme")
        );
        assert_eq!(read(Attribute::Query("none".into())), None);
        assert_eq!(
            read(Attribute::Cookie("session".into())).as_deref(),
            Some("s3")
        );
        assert_eq!(read(Attribute::Cookie("b".into())).as_deref(), Some("2"));
        assert_eq!(read(Attribute::Path(3)).as_deref(), Some("acme"));
        assert_eq!(read(Attribute::Path(9)), None);
    }

    /// Cookies as common parsers read them: one session whatever the spacing, quoting or
    /// separator; the name twice (however spelled) is ambiguous.
    #[test]
    fn cookies_read_as_parsers_read_them() {
        type Case<'a> = (&'a [&'a str], Result<Option<&'a str>, ()>);
        let cases: [Case<'_>; 11] = [
            (&["sess=abc"], Ok(Some("abc"))),
            (&["sess= abc"], Ok(Some("abc"))),
            (&["sess =abc "], Ok(Some("abc"))),
            (&["sess=\tabc\t"], Ok(Some("abc"))),
            (&["sess=\"abc\""], Ok(Some("abc"))),
            (&["other=1, sess=abc"], Ok(Some("abc"))),
            (&["other=1,sess=abc; x=2"], Ok(Some("abc"))),
            (&["other=1"], Ok(None)),
            (&["sess=abc, sess=abd"], Err(())),
            (&["sess=abc", "sess= abc"], Err(())),
            (&["a=1; sess=abc,sess=abc"], Err(())),
        ];
        for (values, want) in cases {
            let mut h = http::HeaderMap::new();
            for v in values {
                h.append("cookie", http::HeaderValue::from_str(v).unwrap());
            }
            let got = cookie(Some(&h), "sess").map_err(|_| ());
            assert_eq!(
                got.as_ref().map(|o| o.as_deref()),
                want.as_ref().map(|o| *o),
                "{values:?}"
            );
        }
    }

    #[test]
    fn twice_is_invalid() {
        let h = headers(&[("x-user", "a"), ("x-user", "b"), ("cookie", "s=1; s=2")]);
        let attrs = Attrs {
            headers: Some(&h),
            query: Some("u=1&u=2"),
        };
        let seen = Seen {
            attrs: &attrs,
            claims: &[],
            fold: false,
        };
        let header = Attribute::Header(http::HeaderName::from_static("x-user"));
        assert!(read(&header, &seen, None).is_err());
        assert!(read(&Attribute::Query("u".into()), &seen, None).is_err());
        assert!(read(&Attribute::Cookie("s".into()), &seen, None).is_err());
        // Not UTF-8: a cookie header cannot hide a second value, a parameter is not
        // decoded into U+FFFD.
        let mut h = headers(&[("cookie", "s=1")]);
        h.append("cookie", http::HeaderValue::from_bytes(b"s=\xff").unwrap());
        let attrs = Attrs {
            headers: Some(&h),
            query: Some("u=%FF"),
        };
        let seen = Seen {
            attrs: &attrs,
            claims: &[],
            fold: false,
        };
        assert!(read(&Attribute::Cookie("s".into()), &seen, None).is_err());
        assert!(read(&Attribute::Query("u".into()), &seen, None).is_err());
    }

    #[test]
    fn path_segments_fold_with_case_insensitive_paths() {
        let attrs = Attrs::default();
        let seen = |fold| Seen {
            attrs: &attrs,
            claims: &[],
            fold,
        };
        let at = |fold| read(&Attribute::Path(2), &seen(fold), Some("/orgs/ACME./x"));
        assert_eq!(at(false).ok().flatten().as_deref(), Some("ACME."));
        assert_eq!(at(true).ok().flatten().as_deref(), Some("acme"));
    }
}
