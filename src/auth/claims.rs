//! The claims of a token whose signature verified: time (`exp`, `nbf` against the caller's
//! `now`, not jsonwebtoken's own clock, so tests step time and the whole request sees one
//! reading), `iss`, `aud`, then the identity claims that make the `Caller`.

use serde_json::{Map, Value};

use super::error::InvalidToken;
use super::settings::JwtSettings;
use super::{Caller, MAX_CLAIM_LEN};

/// The caller `claims` name, if they hold at `now_secs` under `settings`.
///
/// # Errors
/// The first claim that fails, in the order time, issuer, audience, identity.
pub(super) fn caller(
    claims: &Map<String, Value>,
    settings: &JwtSettings,
    now_secs: u64,
) -> Result<Caller, InvalidToken> {
    let leeway = settings.leeway_secs;
    let exp = claims
        .get("exp")
        .and_then(numeric_date)
        .ok_or(InvalidToken::MissingExp)?;
    if now_secs > exp.saturating_add(leeway) {
        return Err(InvalidToken::Expired);
    }
    if let Some(nbf) = claims.get("nbf") {
        let nbf = numeric_date(nbf).ok_or(InvalidToken::NotYetValid)?;
        if nbf > now_secs.saturating_add(leeway) {
            return Err(InvalidToken::NotYetValid);
        }
    }
    if let Some(want) = &settings.issuer {
        if claims.get("iss").and_then(Value::as_str) != Some(want.as_str()) {
            return Err(InvalidToken::Issuer);
        }
    }
    if let Some(want) = &settings.audience {
        if !has_audience(claims.get("aud"), want) {
            return Err(InvalidToken::Audience);
        }
    }
    Ok(Caller {
        key_id: identity(claims.get(&settings.key_claim))?.ok_or(InvalidToken::Claim)?,
        tenant: optional(claims, settings.tenant_claim.as_deref())?,
        tier: optional(claims, settings.tier_claim.as_deref())?,
        expires_at: exp,
        claims: settings
            .scope_claims
            .iter()
            .filter_map(|name| {
                let value = match claims.get(name)? {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    _ => return None,
                };
                Some((name.clone(), value))
            })
            .collect(),
    })
}

/// A NumericDate (RFC 7519 2): seconds, possibly fractional (truncated), not negative.
fn numeric_date(v: &Value) -> Option<u64> {
    match v.as_u64() {
        Some(n) => Some(n),
        None => v
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f as u64),
    }
}

/// `aud` is the audience, or an array holding it (RFC 7519 4.1.3).
fn has_audience(aud: Option<&Value>, want: &str) -> bool {
    match aud {
        Some(Value::String(s)) => s == want,
        Some(Value::Array(all)) => all.iter().any(|a| a.as_str() == Some(want)),
        _ => false,
    }
}

fn optional(
    claims: &Map<String, Value>,
    name: Option<&str>,
) -> Result<Option<String>, InvalidToken> {
    match name {
        Some(name) => identity(claims.get(name)),
        None => Ok(None),
    }
}

/// An identity claim's value: a non-empty string or a number, at most `MAX_CLAIM_LEN`
/// bytes; absent is `None`.
fn identity(v: Option<&Value>) -> Result<Option<String>, InvalidToken> {
    let s = match v {
        None => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => return Err(InvalidToken::Claim),
    };
    if s.is_empty() || s.len() > MAX_CLAIM_LEN {
        return Err(InvalidToken::Claim);
    }
    Ok(Some(s))
}
