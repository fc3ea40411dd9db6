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

    /// Whether the `Authorization` values of one request (every one received, as
    /// received) grant this secret: the one rule of the admin API, `POST /v1/check` and
    /// the RLS. There must be exactly one value (with two, which one a proxy in front
    /// checked is anyone's guess), of the form `Bearer 1*SP <secret>`: the scheme in any
    /// case (RFC 9110 §11.1), one or more spaces after it (RFC 6750 §2.1), nothing after
    /// the token. Both tokens are hashed first, so the comparison takes the same time
    /// whatever the presented value's length or content.
    pub fn authorizes<'a>(&self, values: impl IntoIterator<Item = &'a [u8]>) -> bool {
        let mut all = values.into_iter();
        match (all.next(), all.next()) {
            (Some(one), None) => self.bearer_matches(one),
            _ => false,
        }
    }

    /// Whether one `Authorization` value is `Bearer 1*SP <secret>` (see `authorizes`).
    fn bearer_matches(&self, presented: &[u8]) -> bool {
        use sha2::{Digest, Sha256};
        let Some((scheme, rest)) = presented.split_at_checked(6) else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
            return false;
        }
        let spaces = rest.iter().take_while(|&&b| b == b' ').count();
        let token = &rest[spaces..];
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

#[cfg(test)]
mod tests {
    use super::Secret;

    /// One rule for every bearer token: exactly one value, `Bearer` in any case, one or
    /// more spaces, the token and nothing else.
    #[test]
    fn authorizes_exactly_one_bearer_value() {
        let s = Secret::new("s3cret-token-0123");
        let cases: &[(&[&[u8]], bool)] = &[
            (&[b"Bearer s3cret-token-0123"], true),
            (&[b"bearer s3cret-token-0123"], true),
            (&[b"BEARER s3cret-token-0123"], true),
            (&[b"Bearer  s3cret-token-0123"], true),
            (&[b"Bearer    s3cret-token-0123"], true),
            (&[], false),
            (
                &[b"Bearer s3cret-token-0123", b"Bearer s3cret-token-0123"],
                false,
            ),
            (&[b"Bearer s3cret-token-0123", b"Bearer other"], false),
            (&[b"Bearer other", b"Bearer s3cret-token-0123"], false),
            (&[b"Bearer\ts3cret-token-0123"], false),
            (&[b"Bearers3cret-token-0123"], false),
            (&[b"Bearer s3cret-token-0123 "], false),
            (&[b"Bearer s3cret-token-012"], false),
            (&[b"Bearer s3cret-token-01234"], false),
            (&[b"Basic s3cret-token-0123"], false),
            (&[b"s3cret-token-0123"], false),
            (&[b" Bearer s3cret-token-0123"], false),
            (&[b"Bearer "], false),
            (&[b"Bearer"], false),
            (&[b""], false),
        ];
        for (values, want) in cases {
            let got = s.authorizes(values.iter().copied());
            assert_eq!(
                got,
                *want,
                "{:?}",
                values
                    .iter()
                    .map(|v| String::from_utf8_lossy(v))
                    .collect::<Vec<_>>()
            );
        }
    }
}
