//! What `[auth.jwt]` becomes once the config is read, and the checks that make a set of
//! settings usable (each refusal a `JwtConfigError` the config layer reports as is).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use jsonwebtoken::Algorithm;

use super::error::JwtConfigError;

/// The algorithms `algorithms` may name (DESIGN's list). `none` is not an `Algorithm`, so it
/// cannot be named at all; HS384/HS512, PS384/PS512 are left out as DESIGN does.
pub const SUPPORTED_ALGORITHMS: [Algorithm; 8] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
    Algorithm::HS256,
];

/// Shortest `hs256_secret` (bytes): RFC 7518 3.2 asks for a key at least as long as the
/// hash output, and a short secret can be brute-forced from one token offline.
pub const MIN_HS256_SECRET_LEN: usize = 32;

/// `[auth.jwt]`, as the config layer produces it (secrets already read from the
/// environment). `Default` gives DESIGN's defaults and no algorithm, which `JwtVerifier::new`
/// refuses: `algorithms` must be given.
#[derive(Clone, PartialEq, Eq)]
pub struct JwtSettings {
    /// The algorithms a token may use: a non-empty subset of `SUPPORTED_ALGORITHMS`.
    pub algorithms: Vec<Algorithm>,
    /// A JWKS file, read at build and on every reload.
    pub jwks_file: Option<PathBuf>,
    /// A JWKS URL (`https://`, or `http://` for a local key server), fetched by the
    /// refresher at start and every `jwks_refresh`.
    pub jwks_url: Option<String>,
    /// How often the JWKS URL is fetched (default 300 s).
    pub jwks_refresh: Duration,
    /// The HS256 secret (the value of `hs256_secret_env`), at least 32 bytes; required
    /// exactly when `algorithms` has HS256.
    pub hs256_secret: Option<Vec<u8>>,
    /// The `iss` a token must carry, if set.
    pub issuer: Option<String>,
    /// A value the token's `aud` must carry (the string, or one of the array), if set.
    /// Unset, `aud` is not looked at.
    pub audience: Option<String>,
    /// Slack on `exp` and `nbf` for clock skew between issuer and gateway (default 30).
    pub leeway_secs: u64,
    /// The claim that names the caller (default `sub`).
    pub key_claim: String,
    /// The claim that names the tenant, if any.
    pub tenant_claim: Option<String>,
    /// The claim that names the tier, if any.
    pub tier_claim: Option<String>,
    /// Claims custom scopes read (`from = "jwt:<claim>"`), kept in `Caller::claims`.
    pub scope_claims: Vec<String>,
}

/// The default `jwks_refresh`.
pub const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(300);

/// The default `leeway_secs`.
pub const DEFAULT_LEEWAY_SECS: u64 = 30;

// === impl JwtSettings ===

impl Default for JwtSettings {
    fn default() -> Self {
        Self {
            algorithms: Vec::new(),
            jwks_file: None,
            jwks_url: None,
            jwks_refresh: DEFAULT_JWKS_REFRESH,
            hs256_secret: None,
            issuer: None,
            audience: None,
            leeway_secs: DEFAULT_LEEWAY_SECS,
            key_claim: "sub".into(),
            tenant_claim: None,
            tier_claim: None,
            scope_claims: Vec::new(),
        }
    }
}

/// The secret is never printed.
impl fmt::Debug for JwtSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtSettings")
            .field("algorithms", &self.algorithms)
            .field("jwks_file", &self.jwks_file)
            .field("jwks_url", &self.jwks_url)
            .field("jwks_refresh", &self.jwks_refresh)
            .field(
                "hs256_secret",
                &self.hs256_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("leeway_secs", &self.leeway_secs)
            .field("key_claim", &self.key_claim)
            .field("tenant_claim", &self.tenant_claim)
            .field("tier_claim", &self.tier_claim)
            .finish()
    }
}

impl JwtSettings {
    /// Whether a token may use `alg`.
    pub fn allows(&self, alg: Algorithm) -> bool {
        self.algorithms.contains(&alg)
    }

    /// Whether any allowed algorithm needs a public key (a JWKS).
    fn wants_public_keys(&self) -> bool {
        self.algorithms.iter().any(|a| *a != Algorithm::HS256)
    }

    /// Refuses settings that could never verify a token, or would verify one unsafely.
    ///
    /// # Errors
    /// The first rule broken, in field order.
    pub fn check(&self) -> Result<(), JwtConfigError> {
        if self.algorithms.is_empty() {
            return Err(JwtConfigError::NoAlgorithms);
        }
        if let Some(a) = self
            .algorithms
            .iter()
            .find(|a| !SUPPORTED_ALGORITHMS.contains(a))
        {
            return Err(JwtConfigError::UnsupportedAlgorithm(*a));
        }
        self.check_secret()?;
        let has_jwks = self.jwks_file.is_some() || self.jwks_url.is_some();
        if self.wants_public_keys() && !has_jwks {
            return Err(JwtConfigError::NoKeySource);
        }
        if has_jwks && !self.wants_public_keys() {
            return Err(JwtConfigError::JwksWithoutPublicAlgorithm);
        }
        if let Some(url) = &self.jwks_url {
            check_url(url)?;
        }
        if self.jwks_refresh.is_zero() {
            return Err(JwtConfigError::ZeroRefresh);
        }
        let claims = [
            Some(&self.key_claim),
            self.tenant_claim.as_ref(),
            self.tier_claim.as_ref(),
        ];
        if claims.into_iter().flatten().any(String::is_empty) {
            return Err(JwtConfigError::EmptyClaimName);
        }
        Ok(())
    }

    fn check_secret(&self) -> Result<(), JwtConfigError> {
        match (&self.hs256_secret, self.allows(Algorithm::HS256)) {
            (None, true) => Err(JwtConfigError::MissingSecret),
            (Some(_), false) => Err(JwtConfigError::SecretWithoutHs256),
            (Some(s), true) if s.len() < MIN_HS256_SECRET_LEN => Err(JwtConfigError::ShortSecret {
                len: s.len(),
                min: MIN_HS256_SECRET_LEN,
            }),
            _ => Ok(()),
        }
    }
}

/// An absolute `http`/`https` URL with a host.
fn check_url(url: &str) -> Result<(), JwtConfigError> {
    let bad = |reason: &str| JwtConfigError::BadUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(parsed.scheme(), "https" | "http") {
        return Err(bad("the scheme must be https or http"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    Ok(())
}
