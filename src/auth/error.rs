//! The three ways JWT handling fails: settings that cannot work (a config error, at build or
//! reload), a token that does not verify (a 401 for that request), and a JWKS fetch that
//! did not give a usable set (logged and counted; the last good set stays).

use std::path::PathBuf;

use jsonwebtoken::Algorithm;

/// `[auth.jwt]` settings or a `jwks_file` that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JwtConfigError {
    /// `algorithms` is empty.
    #[error("algorithms: at least one algorithm is needed")]
    NoAlgorithms,
    /// An algorithm outside `SUPPORTED_ALGORITHMS`.
    #[error("algorithms: {0:?} is not supported (RS256, RS384, RS512, PS256, ES256, ES384, EdDSA, HS256)")]
    UnsupportedAlgorithm(Algorithm),
    /// HS256 allowed but no secret.
    #[error("HS256 is allowed but hs256_secret_env gives no secret")]
    MissingSecret,
    /// A secret but HS256 not allowed: the secret would be dead weight, or a typo.
    #[error("hs256_secret_env is set but HS256 is not in algorithms")]
    SecretWithoutHs256,
    /// A secret shorter than `MIN_HS256_SECRET_LEN`.
    #[error("the HS256 secret is {len} bytes; at least {min} are needed")]
    ShortSecret {
        /// Its length.
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// A public-key algorithm allowed but neither `jwks_file` nor `jwks_url`.
    #[error("algorithms other than HS256 need jwks_file or jwks_url")]
    NoKeySource,
    /// A JWKS given but only HS256 allowed: its keys could never be used.
    #[error("jwks_file / jwks_url are set but algorithms has no public-key algorithm")]
    JwksWithoutPublicAlgorithm,
    /// `jwks_url` is not an absolute http(s) URL.
    #[error("jwks_url {url:?}: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// `jwks_refresh` is zero.
    #[error("jwks_refresh_secs must be at least 1")]
    ZeroRefresh,
    /// A claim name is empty.
    #[error("key_claim, tenant_claim and tier_claim must not be empty")]
    EmptyClaimName,
    /// `jwks_file` cannot be read.
    #[error("jwks_file {}: {source}", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `jwks_file` is not a JWKS, or has no key usable with `algorithms`.
    #[error("jwks_file {}: {reason}", path.display())]
    BadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Why a token was refused. Every variant is a 401 `invalid_token`; the variant is for logs
/// and for a metric label (`as_str` is a fixed, bounded set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidToken {
    /// Over `MAX_TOKEN_LEN` bytes: refused unread.
    #[error("token longer than 8 KiB")]
    TooLong,
    /// Not `a.b.c` in base64url, or a header or payload that is not JSON.
    #[error("malformed token")]
    Malformed,
    /// A `crit` header: no JWS extension is understood, so none may be required.
    #[error("token requires an unsupported extension (crit)")]
    Critical,
    /// An algorithm not in `algorithms` (`none` included), or one the chosen key cannot
    /// verify (the key's type, curve or `alg` says otherwise).
    #[error("algorithm not allowed for this key")]
    Algorithm,
    /// A `kid` no key has (the refresher is told).
    #[error("unknown kid")]
    UnknownKid,
    /// No `kid`, and the key set does not hold exactly one key.
    #[error("no kid and no single key to use")]
    NoKid,
    /// The signature does not verify.
    #[error("bad signature")]
    Signature,
    /// No `exp`, or one that is not a number.
    #[error("missing or malformed exp")]
    MissingExp,
    /// `exp` (+ leeway) has passed.
    #[error("token expired")]
    Expired,
    /// `nbf` (- leeway) has not come yet, or is not a number.
    #[error("token not yet valid")]
    NotYetValid,
    /// `iss` is not the configured issuer.
    #[error("wrong issuer")]
    Issuer,
    /// `aud` does not carry the configured audience.
    #[error("wrong audience")]
    Audience,
    /// The key claim is missing, or an identity claim is not a string or number, is empty,
    /// or is over `MAX_CLAIM_LEN` bytes.
    #[error("identity claim missing or unusable")]
    Claim,
}

impl InvalidToken {
    /// A short fixed name (for a metric label or a log field).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooLong => "too_long",
            Self::Malformed => "malformed",
            Self::Critical => "critical",
            Self::Algorithm => "algorithm",
            Self::UnknownKid => "unknown_kid",
            Self::NoKid => "no_kid",
            Self::Signature => "signature",
            Self::MissingExp => "missing_exp",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::Issuer => "issuer",
            Self::Audience => "audience",
            Self::Claim => "claim",
        }
    }
}

/// A JWKS fetch that gave no new key set; the last good set stays in use.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The HTTP client could not be built (e.g. the system trust store is unreadable).
    #[error("jwks_url: cannot build the HTTP client: {0}")]
    Client(String),
    /// Connecting, sending or reading failed.
    #[error("jwks_url: {0}")]
    Transport(String),
    /// A non-2xx answer.
    #[error("jwks_url answered {0}")]
    Status(u16),
    /// A body over `MAX_JWKS_BYTES`.
    #[error("jwks_url: body over {0} bytes")]
    TooLarge(usize),
    /// No answer within `FETCH_DEADLINE`.
    #[error("jwks_url: no answer within the deadline")]
    Timeout,
    /// Not a JWKS (`{"keys": [...]}`), or no key usable with `algorithms`.
    #[error("jwks_url: {0}")]
    Jwks(String),
}
