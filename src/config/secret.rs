//! `Secret`: a token from the config.

use std::sync::Arc;

/// A secret from the config (a token): never printed, compared in constant time.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: &str) -> Self {
        Self(value.into())
    }

    /// The secret itself (to hand to the one component that compares it).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `authorization` (a header value as received) is `Bearer <secret>` (the
    /// scheme case-insensitive, as RFC 9110 says). Both tokens are hashed first, so the
    /// comparison takes the same time whatever the presented value's length or content.
    pub fn bearer_matches(&self, authorization: Option<&[u8]>) -> bool {
        use sha2::{Digest, Sha256};
        let Some(presented) = authorization else {
            return false;
        };
        let token = match presented.split_at_checked(7) {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case(b"bearer ") => token,
            _ => return false,
        };
        let (a, b) = (Sha256::digest(token), Sha256::digest(self.0.as_bytes()));
        a.iter()
            .zip(b.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}
