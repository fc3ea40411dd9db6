//! `[auth] key_query`: the API key read from a query parameter, and the forwarded URI
//! without it. Names and values are `application/x-www-form-urlencoded` as browsers and
//! HTTP clients send them (`%XX` decoded, `+` a space, so a key with a `+` is sent as
//! `%2B`); the other parameters go upstream byte for byte.
//!
//! The key parameter is read as the most lenient upstream parser would read it, so no
//! spelling of it can pass as "no key" here and be a key there: its name matches in any
//! ASCII case (`APIKEY`, `ApiKey`), and `;` separates parameters as `&` does (`?a=1;apikey=k`).
//! A key containing `;` is therefore sent percent-encoded (`%3B`). Every such spelling is
//! removed before the request goes upstream, and two of them are ambiguous (400).

use std::borrow::Cow;

use http::Uri;

use crate::identity::AmbiguousCredentials;

/// The segments of `query`, split on `&` and `;`, each with the separator before it
/// (`None` for the first).
fn segments(query: &str) -> impl Iterator<Item = (Option<char>, &str)> {
    let mut rest = Some(query);
    let mut sep = None;
    std::iter::from_fn(move || {
        let q = rest?;
        let this = sep;
        match q.find(['&', ';']) {
            Some(i) => {
                sep = q[i..].chars().next();
                rest = Some(&q[i + 1..]);
                Some((this, &q[..i]))
            }
            None => {
                rest = None;
                Some((this, q))
            }
        }
    })
}

/// The decoded name and value of one segment (None: an empty segment).
fn pair(segment: &str) -> Option<(Cow<'_, str>, Cow<'_, str>)> {
    form_urlencoded::parse(segment.as_bytes()).next()
}

/// Whether `segment` names the key parameter `name` (any ASCII case, decoded).
fn names(segment: &str, name: &str) -> bool {
    pair(segment).is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))
}

/// The value of the key parameter `name` in `query`, if present.
///
/// # Errors
/// `AmbiguousCredentials` when it appears more than once, in any spelling (an upstream
/// reading the other one would serve a caller the gateway did not identify).
pub fn param<'q>(
    query: Option<&'q str>,
    name: &str,
) -> Result<Option<Cow<'q, str>>, AmbiguousCredentials> {
    let Some(query) = query else { return Ok(None) };
    let mut found = None;
    for (_, segment) in segments(query) {
        let Some((n, v)) = pair(segment) else {
            continue;
        };
        if n.eq_ignore_ascii_case(name) {
            if found.is_some() {
                return Err(AmbiguousCredentials);
            }
            found = Some(v);
        }
    }
    Ok(found)
}

/// `uri` without every spelling of the key parameter `name`, or None when it has none
/// (nothing to rewrite). The other parameters keep their bytes and separators.
pub fn strip(uri: &Uri, name: &str) -> Option<Uri> {
    let query = uri.query()?;
    if !segments(query).any(|(_, s)| names(s, name)) {
        return None;
    }
    let mut kept = String::with_capacity(query.len());
    for (sep, segment) in segments(query).filter(|(_, s)| !names(s, name)) {
        if let Some(sep) = sep.filter(|_| !kept.is_empty()) {
            kept.push(sep);
        }
        kept.push_str(segment);
    }
    let path = uri.path();
    let pq = if kept.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{kept}")
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = pq.parse().ok();
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_found_decoded_and_never_twice() {
        type Row<'a> = (
            Option<&'a str>,
            Result<Option<&'a str>, AmbiguousCredentials>,
        );
        let rows: [Row<'_>; 14] = [
            (None, Ok(None)),
            (Some("a=1&b=2"), Ok(None)),
            (Some("apikey=k1"), Ok(Some("k1"))),
            (Some("x=1&apikey=k%2B1&y"), Ok(Some("k+1"))),
            (Some("api%6Bey=k1"), Ok(Some("k1"))),
            (Some("apikey=k1&apikey=k1"), Err(AmbiguousCredentials)),
            (Some("apikey"), Ok(Some(""))),
            // Any ASCII case, and `;` separating like `&`: still the key parameter.
            (Some("APIKEY=k1"), Ok(Some("k1"))),
            (Some("a=1;apikey=k1"), Ok(Some("k1"))),
            (Some("a=1;ApiKey=k1&b=2"), Ok(Some("k1"))),
            (Some("apikey=k1;APIKEY=k1"), Err(AmbiguousCredentials)),
            (Some("apikey=k1&a=1;apikey=k2"), Err(AmbiguousCredentials)),
            // A key with `;` is sent as `%3B`.
            (Some("apikey=k%3B1"), Ok(Some("k;1"))),
            (Some("apikey=k;1"), Ok(Some("k"))),
        ];
        for (i, (query, want)) in rows.into_iter().enumerate() {
            let got = param(query, "apikey").map(|v| v.map(|v| v.into_owned()));
            assert_eq!(got, want.map(|v| v.map(str::to_string)), "row {i}");
        }
    }

    #[test]
    fn strip_removes_only_the_key_parameter() {
        let rows = [
            ("/x?apikey=k1", Some("/x")),
            ("/x?a=1&apikey=k1&b=%20", Some("/x?a=1&b=%20")),
            ("/x?api%6Bey=k1&a=1", Some("/x?a=1")),
            ("/x?a=1", None),
            ("/x", None),
            ("/x?apikeys=1", None),
            ("/x?a=1;APIKEY=k1;b=2", Some("/x?a=1;b=2")),
            ("/x?ApiKey=k1;b=2&c=3", Some("/x?b=2&c=3")),
            ("/x?a=1&apikey=k1", Some("/x?a=1")),
            ("/x?q=a;b&apikey=k1&z", Some("/x?q=a;b&z")),
            ("/x?;apikey=k1", Some("/x")),
        ];
        for (uri, want) in rows {
            let got = strip(&uri.parse().unwrap(), "apikey").map(|u| u.to_string());
            assert_eq!(got.as_deref(), want, "{uri}");
        }
    }
}
