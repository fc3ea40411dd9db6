//! JWT bearer tokens as callers (`[auth.jwt]`): a token is verified against configured keys
//! and its claims become a [`Caller`] (key id, tenant, tier), the way an API key becomes a
//! `KeyInfo`. Self-contained: nothing here knows the config file, the pipeline or HTTP.
//!
//! The request path is [`JwtVerifier::verify`]: synchronous, no I/O, no lock held beyond a
//! cache shard's. A token verified before is answered from the cache right after the size
//! check; any other is checked in this order, and rejected for
//! 1. a token over [`MAX_TOKEN_LEN`] or not of the form `a.b.c` over the base64url alphabet,
//!    before anything is decoded;
//! 2. a header that is not JSON, carries `crit` (no extension is understood), or names an
//!    algorithm outside `algorithms` (`none` cannot be named at all);
//! 3. a token whose key cannot be chosen (see "Keys" below) or whose key cannot verify that
//!    algorithm: an `HS256` token only ever meets the `hs256_secret` (its `kid` is not
//!    looked at), any other only the JWKS keys, so an RSA public key is never an HMAC
//!    secret and the secret never "verifies" an RS token;
//! 4. a bad signature (jsonwebtoken on ring), then the claims: `exp` required, `nbf`,
//!    `iss` and `aud` (when configured), each time claim with `leeway_secs` of slack, and
//!    the identity claims (see [`Caller`]).
//!
//! Keys: `jwks_file` (read at build and on [`JwtVerifier::reload`]) and `jwks_url` (fetched
//! by [`JwtVerifier::run_refresher`]) are merged by `kid`; on a `kid` present in both, the
//! file's key wins (an operator's pin). A token with a `kid` uses the key of that `kid`; a
//! token without one uses the only key when the merged set holds exactly one, and is
//! refused otherwise: trying every key would let one forged token cost a verification per
//! key, and which key vouched for it would be a guess. JWKs with `use` other than `sig`,
//! `key_ops` without `verify`, an `alg` outside `algorithms`, symmetric (`oct`) keys or
//! curves other than P-256, P-384 and Ed25519 are skipped; an embedded `jwk`, `jku` or
//! `x5u` in a token header is never used.
//!
//! Unknown `kid`: the request fails at once (nothing waits for the network), and the
//! refresher is told; it refetches the JWKS at most once per [`KID_REFETCH_INTERVAL`]
//! (misses in between share that one refetch), so a key published after the last fetch
//! works within 10 s while a stream of made-up kids costs the key server one request per
//! 10 s.
//!
//! Verified tokens are cached (a keyed 128-bit hash of the token -> its `Caller`, at most
//! [`CACHE_CAPACITY`] entries) until their `exp`, then verified again; the cache belongs to
//! one key set and settings, so a rotation, a removed key or a reload with new settings
//! starts from an empty cache. Failures are never cached.

mod cache;
mod claims;
mod error;
mod header;
mod keys;
mod refresh;
mod settings;
mod verifier;

pub use cache::CACHE_CAPACITY;
pub use error::{FetchError, InvalidToken, JwtConfigError};
pub use jsonwebtoken::Algorithm;
pub use refresh::{FETCH_DEADLINE, KID_REFETCH_INTERVAL, MAX_JWKS_BYTES};
pub use settings::{
    JwtSettings, DEFAULT_JWKS_REFRESH, DEFAULT_LEEWAY_SECS, MIN_HS256_SECRET_LEN,
    SUPPORTED_ALGORITHMS,
};
pub use verifier::{JwtStats, JwtVerifier};

/// Longest token accepted (bytes); longer ones are refused before any decoding.
pub const MAX_TOKEN_LEN: usize = 8 * 1024;

/// Longest identity claim value (bytes), as for custom scopes' identities.
pub const MAX_CLAIM_LEN: usize = 256;

/// The namespace of JWT callers' key-scope identities: a token whose `key_claim` is
/// `alice` counts, is banned and is reported as `jwt:alice`, never as the API key id
/// `alice`.
pub const JWT_PREFIX: &str = "jwt:";

/// Whether `id` may be an API key id: not in the JWT callers' namespace (`jwt:`).
pub fn key_id_allowed(id: &str) -> bool {
    !id.starts_with(JWT_PREFIX)
}

/// Who a verified token says is calling.
///
/// Claim values are used when they are strings (non-empty, at most [`MAX_CLAIM_LEN`]
/// bytes) or numbers (in their JSON spelling, e.g. `42`); any other value of a configured
/// claim makes the token invalid, and so does a missing `key_claim`. A missing
/// `tenant_claim` or `tier_claim` leaves that field `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The `key_claim` value: the key scope's identity and `X-Throttle-Key-Id`.
    pub key_id: String,
    /// The `tenant_claim` value, if configured and present.
    pub tenant: Option<String>,
    /// The `tier_claim` value, if configured and present (else the default tier applies).
    pub tier: Option<String>,
    /// The token's `exp` (Unix seconds).
    pub expires_at: u64,
    /// The `scope_claims` the token carries as a string or a number, by name (a claim of
    /// another type counts as absent); their length is the custom scope's to check.
    pub claims: Vec<(String, String)>,
}

/// Whether a credential is meant as a JWT: a value with exactly two dots, how a `Bearer`
/// value is told apart from an API key before anything is verified (DESIGN's rule; a
/// malformed token is then an invalid token, not an unknown API key).
pub fn looks_like_jwt(value: &[u8]) -> bool {
    memchr::memchr_iter(b'.', value).count() == 2
}

#[cfg(test)]
mod tests;
