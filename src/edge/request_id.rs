//! `X-Request-Id`, for every HTTP transport (the proxy and the tower layer): the value a
//! trusted proxy sent, when it is sane (visible ASCII, at most `MAX_LEN` bytes), else a
//! fresh random 128-bit id (32 hex digits) from the thread's RNG (no system call per
//! request). Every value from an untrusted peer is replaced. The id goes to the next hop
//! (replacing the client's) and back in every answer.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The longest id kept from a trusted proxy.
pub const MAX_LEN: usize = 128;

/// The header's name.
pub const NAME: &str = "x-request-id";

/// The header's name, made once: a lookup or insert by a `&str` parses and checks it
/// each time.
pub const HEADER: HeaderName = HeaderName::from_static(NAME);

/// The request's id: the trusted proxy's `headers` value if `trusted` and sane, else new
/// (an untrusted peer's headers are not looked at).
pub fn choose(headers: &HeaderMap, trusted: bool) -> HeaderValue {
    if !trusted {
        return generate();
    }
    let mut sent = headers.get_all(&HEADER).iter();
    match (sent.next(), sent.next()) {
        (Some(v), None) if sane(v.as_bytes()) => v.clone(),
        _ => generate(),
    }
}

/// A fresh id: 128 random bits as 32 lowercase hex digits.
pub fn generate() -> HeaderValue {
    HeaderValue::from_bytes(&hex32(rand::random()))
        .unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// `n` as 32 lowercase hex digits, zero-padded, written digit by digit (no `core::fmt`
/// and no intermediate `String` on the request path).
fn hex32(n: u128) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 32];
    for (i, digit) in text.iter_mut().enumerate() {
        let nibble = (n >> (124 - 4 * i)) & 0xf;
        *digit = HEX[nibble as usize];
    }
    text
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

    /// `hex32` is `format!("{n:032x}")`.
    #[test]
    fn hex32_is_zero_padded_lower_hex() {
        for n in [
            0,
            1,
            0xab,
            1 << 64,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            assert_eq!(hex32(n), format!("{n:032x}").as_bytes(), "{n:x}");
        }
    }

    /// Generated ids are 32 hex digits and differ.
    #[test]
    fn generated_ids_are_hex_and_differ() {
        let (a, b) = (generate(), generate());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a
            .as_bytes()
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c)));
    }
}
