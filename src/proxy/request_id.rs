//! `X-Request-Id`: the value a trusted proxy sent, when it is sane (visible ASCII, at
//! most `MAX_LEN` bytes), else a fresh random 128-bit id (32 hex digits) from the
//! thread's RNG (no system call per request). Every value from an untrusted peer is
//! replaced. The id goes upstream (replacing the client's) and back in every answer.

use http::{HeaderMap, HeaderValue};

/// The longest id kept from a trusted proxy.
pub(super) const MAX_LEN: usize = 128;

/// The header's name.
pub(super) const NAME: &str = "x-request-id";

/// The request's id: the trusted proxy's `headers` value if `trusted` and sane, else new.
pub(super) fn choose(headers: &HeaderMap, trusted: bool) -> HeaderValue {
    let mut sent = headers.get_all(NAME).iter();
    match (trusted, sent.next(), sent.next()) {
        (true, Some(v), None) if sane(v.as_bytes()) => v.clone(),
        _ => generate(),
    }
}

/// A fresh id: 128 random bits as 32 lowercase hex digits.
pub(super) fn generate() -> HeaderValue {
    let n: u128 = rand::random();
    let text = format!("{n:032x}");
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// Visible ASCII, 1 to `MAX_LEN` bytes.
fn sane(v: &[u8]) -> bool {
    !v.is_empty() && v.len() <= MAX_LEN && v.iter().all(u8::is_ascii_graphic)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(NAME, HeaderValue::from_str(v).unwrap());
        h
    }

    /// A trusted proxy's sane id is kept; an untrusted peer's is replaced.
    #[test]
    fn keeps_trusted_replaces_untrusted() {
        assert_eq!(choose(&with("abc-123"), true), "abc-123");
        let replaced = choose(&with("abc-123"), false);
        assert_ne!(replaced, "abc-123");
        assert_eq!(replaced.len(), 32);
    }

    /// Over-long, spaced or absent ids from a trusted proxy are replaced.
    #[test]
    fn replaces_insane_ids() {
        for v in ["a b", &"x".repeat(MAX_LEN + 1)] {
            assert_eq!(choose(&with(v), true).len(), 32, "{v}");
        }
        assert_eq!(choose(&HeaderMap::new(), true).len(), 32);
        assert_eq!(choose(&with(&"x".repeat(MAX_LEN)), true).len(), MAX_LEN);
    }

    /// Generated ids are 32 hex digits and differ.
    #[test]
    fn generated_ids_are_hex_and_differ() {
        let (a, b) = (generate(), generate());
        assert_ne!(a, b);
        assert!(a.as_bytes().iter().all(u8::is_ascii_hexdigit));
    }
}
