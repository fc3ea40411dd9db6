//! `[auth.jwt]`: the algorithms, the key sources (`jwks_file` relative to the config's
//! directory, `jwks_url`, the HS256 secret read from the variable `hs256_secret_env`
//! names), the claims and the default tier. Each error is reported at its value; what the
//! verifier itself would refuse at start (a `jwks_file` that cannot be read or holds no
//! usable key, too short a secret) is refused here too, so `throttle check` and a reload
//! see it.

use std::path::Path;

use crate::auth::{
    Algorithm, JwtConfigError, JwtSettings, JwtVerifier, DEFAULT_JWKS_REFRESH, DEFAULT_LEEWAY_SECS,
    SUPPORTED_ALGORITHMS,
};

use super::*;

/// The longest `jwks_refresh_secs` accepted (a day).
const MAX_REFRESH_SECS: u64 = 86_400;
/// The largest `leeway_secs` accepted (an hour: more is not clock skew).
const MAX_LEEWAY_SECS: u64 = 3_600;
/// The longest claim name accepted.
const MAX_CLAIM_NAME: usize = 64;

pub(super) fn jwt(
    cx: &Ctx<'_>,
    j: &Spanned<JwtFile>,
    tiers: &HashMap<String, Arc<Tier>>,
) -> Result<Jwt, ConfigError> {
    let f = j.get_ref();
    let defaults = JwtSettings::default();
    let secs = |key, v: &Option<Spanned<u64>>, max| bounded(cx, key, v.as_ref(), 0..=max);
    let settings = JwtSettings {
        algorithms: algorithms(cx, &f.algorithms)?,
        jwks_file: f
            .jwks_file
            .as_ref()
            .map(|p| config_dir(cx).join(p.get_ref())),
        jwks_url: text(cx, "jwks_url", &f.jwks_url)?,
        jwks_refresh: bounded(
            cx,
            "jwks_refresh_secs",
            f.jwks_refresh_secs.as_ref(),
            1..=MAX_REFRESH_SECS,
        )?
        .map_or(DEFAULT_JWKS_REFRESH, Duration::from_secs),
        hs256_secret: secret(cx, f.hs256_secret_env.as_ref())?,
        issuer: text(cx, "issuer", &f.issuer)?,
        audience: text(cx, "audience", &f.audience)?,
        leeway_secs: secs("leeway_secs", &f.leeway_secs, MAX_LEEWAY_SECS)?
            .unwrap_or(DEFAULT_LEEWAY_SECS),
        key_claim: claim(cx, "key_claim", &f.key_claim)?.unwrap_or(defaults.key_claim),
        tenant_claim: claim(cx, "tenant_claim", &f.tenant_claim)?,
        tier_claim: claim(cx, "tier_claim", &f.tier_claim)?,
        // Filled from the custom scopes by `validate` (`from = "jwt:<claim>"`).
        scope_claims: Vec::new(),
    };
    if let Some(t) = &f.default_tier {
        known_tier(cx, t, tiers)?;
    }
    if f.tier_claim.is_none() && f.default_tier.is_none() {
        return Err(cx.err(
            j.span(),
            "[auth.jwt] needs tier_claim or default_tier: a token's tier gives its key limits",
        ));
    }
    // What the verifier refuses at start is refused now, at the value that causes it.
    JwtVerifier::new(settings.clone()).map_err(|e| {
        let msg = match (&e, &j.get_ref().jwks_url) {
            // Never the value of a `${VAR}` (it may carry credentials): the variable.
            (JwtConfigError::BadUrl { reason, .. }, Some(raw)) => {
                format!(
                    "jwks_url {}: {reason}",
                    super::server::shown(raw, raw.get_ref())
                )
            }
            _ => e.to_string(),
        };
        cx.err(span_of(j, &e), msg)
    })?;
    Ok(Jwt {
        settings,
        default_tier: f.default_tier.as_ref().map(|t| t.get_ref().clone()),
    })
}

/// `algorithms`: a non-empty list of `SUPPORTED_ALGORITHMS`, each named once; `none` is
/// refused by name.
fn algorithms(
    cx: &Ctx<'_>,
    list: &Spanned<Vec<Spanned<String>>>,
) -> Result<Vec<Algorithm>, ConfigError> {
    if list.get_ref().is_empty() {
        return Err(cx.err(list.span(), "algorithms must name at least one algorithm"));
    }
    let supported: Vec<String> = SUPPORTED_ALGORITHMS
        .iter()
        .map(|a| format!("{a:?}"))
        .collect();
    let mut out = Vec::new();
    for a in list.get_ref() {
        let name = a.get_ref();
        if name.eq_ignore_ascii_case("none") {
            let msg = "algorithms: \"none\" is never accepted: an unsigned token proves nothing";
            return Err(cx.err(a.span(), msg));
        }
        let Some(i) = supported.iter().position(|s| s == name) else {
            let msg = format!(
                "algorithms: unknown algorithm {name:?} (supported: {})",
                supported.join(", ")
            );
            return Err(cx.err(a.span(), msg));
        };
        let alg = SUPPORTED_ALGORITHMS[i];
        if out.contains(&alg) {
            return Err(cx.err(a.span(), format!("algorithms: {name} is listed twice")));
        }
        out.push(alg);
    }
    Ok(out)
}

/// A string setting that may be a `"${VAR}"` reference; empty is refused.
fn text(
    cx: &Ctx<'_>,
    key: &str,
    v: &Option<Spanned<String>>,
) -> Result<Option<String>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    let value = env_value(cx, key, v)?;
    if value.is_empty() {
        return Err(cx.err(v.span(), format!("{key} must not be empty")));
    }
    Ok(Some(value))
}

/// A claim name: 1 to `MAX_CLAIM_NAME` bytes.
fn claim(
    cx: &Ctx<'_>,
    key: &str,
    v: &Option<Spanned<String>>,
) -> Result<Option<String>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    let name = v.get_ref();
    if name.is_empty() || name.len() > MAX_CLAIM_NAME {
        let msg = format!("{key} must be 1 to {MAX_CLAIM_NAME} bytes");
        return Err(cx.err(v.span(), msg));
    }
    Ok(Some(name.clone()))
}

/// The HS256 secret: the value of the environment variable `hs256_secret_env` names, read
/// now (at start, `throttle check` and every reload). A missing variable is an error
/// naming it.
fn secret(cx: &Ctx<'_>, v: Option<&Spanned<String>>) -> Result<Option<Vec<u8>>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    let name = v.get_ref();
    let well_formed = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !well_formed {
        let msg = format!("hs256_secret_env: {name:?} is not an environment variable name (letters, digits and _)");
        return Err(cx.err(v.span(), msg));
    }
    match (cx.env)(name) {
        Ok(value) => Ok(Some(value.into_bytes())),
        Err(std::env::VarError::NotPresent) => Err(cx.err(
            v.span(),
            format!("hs256_secret_env: environment variable {name} is not set"),
        )),
        Err(std::env::VarError::NotUnicode(_)) => Err(cx.err(
            v.span(),
            format!("hs256_secret_env: environment variable {name} is not valid UTF-8"),
        )),
    }
}

/// The directory relative paths of the config are taken from.
fn config_dir<'a>(cx: &Ctx<'a>) -> &'a Path {
    Path::new(cx.name).parent().unwrap_or(Path::new(""))
}

/// Where a verifier's refusal of the settings points: the value that causes it, else the
/// table.
fn span_of(j: &Spanned<JwtFile>, e: &JwtConfigError) -> Range<usize> {
    let f = j.get_ref();
    let at = |v: &Option<Spanned<String>>| v.as_ref().map(Spanned::span);
    let span = match e {
        JwtConfigError::NoAlgorithms
        | JwtConfigError::UnsupportedAlgorithm(_)
        | JwtConfigError::MissingSecret
        | JwtConfigError::NoKeySource => Some(f.algorithms.span()),
        JwtConfigError::SecretWithoutHs256 | JwtConfigError::ShortSecret { .. } => {
            at(&f.hs256_secret_env)
        }
        JwtConfigError::JwksWithoutPublicAlgorithm => at(&f.jwks_file).or(at(&f.jwks_url)),
        JwtConfigError::BadUrl { .. } => at(&f.jwks_url),
        JwtConfigError::ZeroRefresh => f.jwks_refresh_secs.as_ref().map(Spanned::span),
        JwtConfigError::EmptyClaimName => None,
        JwtConfigError::ReadFile { .. } | JwtConfigError::BadFile { .. } => at(&f.jwks_file),
    };
    span.unwrap_or_else(|| j.span())
}
