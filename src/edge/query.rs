//! `[auth] key_query`: the API key read from a query parameter, and the forwarded URI
//! without it. Names and values are `application/x-www-form-urlencoded` as browsers and
//! HTTP clients send them (`%XX` decoded, `+` a space, so a key with a `+` is sent as
//! `%2B`); the other parameters go upstream byte for byte.

use http::Uri;

pub use crate::identity::query_param as param;

/// `uri` without every `name` parameter, or None when it has none (nothing to rewrite).
pub fn strip(uri: &Uri, name: &str) -> Option<Uri> {
    let query = uri.query()?;
    let named = |pair: &&str| {
        let raw = pair.split_once('=').map_or(*pair, |(n, _)| n);
        form_urlencoded::parse(raw.as_bytes())
            .next()
            .is_some_and(|(n, _)| n == name)
    };
    if !query.split('&').any(|p| named(&p)) {
        return None;
    }
    let kept: Vec<&str> = query.split('&').filter(|p| !named(p)).collect();
    let path = uri.path();
    let pq = if kept.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", kept.join("&"))
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = pq.parse().ok();
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::AmbiguousCredentials;

    #[test]
    fn params_are_found_decoded_and_never_twice() {
        type Row<'a> = (
            Option<&'a str>,
            Result<Option<&'a str>, AmbiguousCredentials>,
        );
        let rows: [Row<'_>; 7] = [
            (None, Ok(None)),
            (Some("a=1&b=2"), Ok(None)),
            (Some("apikey=k1"), Ok(Some("k1"))),
            (Some("x=1&apikey=k%2B1&y"), Ok(Some("k+1"))),
            (Some("api%6Bey=k1"), Ok(Some("k1"))),
            (Some("apikey=k1&apikey=k1"), Err(AmbiguousCredentials)),
            (Some("apikey"), Ok(Some(""))),
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
        ];
        for (uri, want) in rows {
            let got = strip(&uri.parse().unwrap(), "apikey").map(|u| u.to_string());
            assert_eq!(got.as_deref(), want, "{uri}");
        }
    }
}
