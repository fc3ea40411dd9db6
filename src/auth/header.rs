//! The cheap, pre-crypto part of a token: its shape and its header, read before any key is
//! chosen (jsonwebtoken reads the header again when it checks the signature; the few
//! hundred nanoseconds buy checks it does not make: `crit`, and an algorithm name outside
//! the allowed list refused as such rather than as a parse error).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::Algorithm;
use serde::de::IgnoredAny;
use serde::Deserialize;

use super::error::InvalidToken;
use super::MAX_TOKEN_LEN;

/// What a token's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Header {
    /// The algorithm, one of the eight supported.
    pub(super) alg: Algorithm,
    /// The key id, if any.
    pub(super) kid: Option<String>,
}

#[derive(Deserialize)]
struct RawHeader {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crit: Option<IgnoredAny>,
}

/// The token as text and its encoded header, if it is at most `MAX_TOKEN_LEN` bytes of
/// three non-empty base64url parts (no padding) separated by two dots.
pub(super) fn compact_parts(token: &[u8]) -> Option<(&str, &str)> {
    if token.len() > MAX_TOKEN_LEN {
        return None;
    }
    let mut parts = token.split(|b| *b == b'.');
    let head = parts.next()?;
    let (payload, signature) = (parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let b64url = |p: &[u8]| {
        !p.is_empty()
            && p.iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
    };
    if !(b64url(head) && b64url(payload) && b64url(signature)) {
        return None;
    }
    // Only ASCII is left, so both are valid UTF-8.
    Some((
        std::str::from_utf8(token).ok()?,
        std::str::from_utf8(head).ok()?,
    ))
}

/// The token's text and header, or why it cannot be a token.
pub(super) fn read(token: &[u8]) -> Result<(&str, Header), InvalidToken> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(InvalidToken::TooLong);
    }
    let (text, head) = compact_parts(token).ok_or(InvalidToken::Malformed)?;
    let json = URL_SAFE_NO_PAD
        .decode(head)
        .map_err(|_| InvalidToken::Malformed)?;
    let raw: RawHeader = serde_json::from_slice(&json).map_err(|_| InvalidToken::Malformed)?;
    if raw.crit.is_some() {
        return Err(InvalidToken::Critical);
    }
    let alg = algorithm(&raw.alg).ok_or(InvalidToken::Algorithm)?;
    Ok((text, Header { alg, kid: raw.kid }))
}

/// The supported algorithm spelled `name` (case-sensitive, as RFC 7518 spells them).
pub(super) fn algorithm(name: &str) -> Option<Algorithm> {
    Some(match name {
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        "HS256" => Algorithm::HS256,
        _ => return None,
    })
}
