//! `[auth]`: where API keys are read from (`key_header`, `key_query`).

use super::*;

/// The longest `key_query` parameter name accepted.
const MAX_QUERY_NAME: usize = 64;

pub(super) fn key_sources(cx: &Ctx<'_>, a: &AuthSectionFile) -> Result<KeySources, ConfigError> {
    let mut out = KeySources::default();
    if let Some(h) = &a.key_header {
        let name = h.get_ref();
        let header = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            cx.err(
                h.span(),
                format!("key_header {name:?} is not a header name"),
            )
        })?;
        // Headers the gateway reads or writes itself cannot also carry a key.
        let taken = [
            "authorization",
            "host",
            "forwarded",
            "x-forwarded-for",
            "x-real-ip",
            "cookie",
        ];
        if taken.contains(&header.as_str()) || header.as_str().starts_with("x-throttle-") {
            return Err(cx.err(
                h.span(),
                format!("key_header {name:?} is a header the gateway reads or sets itself"),
            ));
        }
        out.key_header = header;
    }
    if let Some(q) = &a.key_query {
        let name = q.get_ref();
        let ok = !name.is_empty()
            && name.len() <= MAX_QUERY_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !ok {
            return Err(cx.err(
                q.span(),
                format!(
                    "key_query {name:?} must be 1 to {MAX_QUERY_NAME} letters, digits, '_', '-' or '.'"
                ),
            ));
        }
        out.key_query = Some(Arc::from(name.as_str()));
    }
    Ok(out)
}
