//! Who is calling: the presented key (or, with `[auth.jwt]`, Bearer JWT) under the route's
//! `auth` rule, guarded by `[limits.auth]` (failed lookups and refused tokens per address).

use std::net::IpAddr;
use std::sync::Arc;

use super::core::{Core, Dynamic, Runtime};
use super::limits::{decide, record};
use super::Rejection;
use crate::auth::JwtVerifier;
use crate::config::Auth;
use crate::identity::{validate_key, KeyInfo, Presented};
use crate::limiter::{Check, Ident, Scope};
use crate::metrics::Outcome;

/// The addresses a failed lookup is charged to.
#[derive(Debug, Clone, Copy)]
pub(super) struct Charged {
    /// The client address.
    pub(super) client_ip: IpAddr,
    /// Another address (the `/v1/check` caller), when it differs.
    pub(super) also: Option<IpAddr>,
    /// Who asks (whether a rejection may strike towards a ban).
    pub(super) origin: super::Origin,
}

impl Charged {
    /// The addresses charged (none for an unaddressed rate-limit descriptor).
    fn addresses(self) -> impl Iterator<Item = IpAddr> + Clone {
        let client = self.origin.addressed().then_some(self.client_ip);
        let also = self.also.filter(|a| *a != self.client_ip);
        client.into_iter().chain(also)
    }
}

/// The caller's key under `auth`.
///
/// # Errors
/// 401 when a required key is missing or a presented key is invalid; 429 `auth` when one
/// of the charged addresses has failed too many lookups.
pub(super) async fn identify(
    core: &Core,
    rt: &Runtime,
    dynamic: &Dynamic,
    presented: Presented<'_>,
    auth: Auth,
    charged: Charged,
    now_ms: u64,
) -> Result<Option<Arc<KeyInfo>>, Rejection> {
    // A `Known` caller is looked up by no secret: nothing to guess, nothing to count.
    let attempt = matches!(
        presented,
        Presented::Key(_) | Presented::Malformed | Presented::Token(_)
    );
    if attempt && rt.config.auth_limits.is_some() {
        for ip in charged.addresses() {
            if core.is_suspect(client_net(rt, ip), now_ms) {
                // Past the failed-lookup limit no key is even looked at, valid or not.
                auth_limit(core, rt, ip, true, now_ms, charged.origin).await?;
            }
        }
    }
    // Without `[auth.jwt]` no credential is a `Token` (`identity::api_key_from`).
    let found = match (presented, core.jwt()) {
        (Presented::Token(token), Some(verifier)) => {
            token_caller(rt, dynamic, &verifier, token, now_ms).map(Some)
        }
        _ => lookup_key(rt, dynamic, presented, auth),
    };
    match found {
        Err(refused @ (Rejection::InvalidKey | Rejection::InvalidToken)) => {
            if !charged.origin.addressed() {
                // No address to count the guess against: counted, so an operator sees it.
                core.metrics.rls_unmetered_lookups_total.inc();
            }
            for ip in charged.addresses() {
                auth_limit(core, rt, ip, false, now_ms, charged.origin).await?;
            }
            Err(refused)
        }
        other => other,
    }
}

/// The caller a Bearer JWT names (`KeyInfo::jwt`): its key-scope identity `jwt:<key_claim
/// value>`, never an API key's; its tenant only what `tenant_claim` names (the issuer is
/// trusted for it; without `tenant_claim` the token has no tenant: no tenant limits, no
/// tenant ban, no `X-Throttle-Tenant`); its tier the `tier_claim` value, else
/// `default_tier`, resolved as a key's is (the database's policies, then the config's
/// tiers); the tenant's tier by the one tenant-tier rule (`Dynamic::tenant_tier`), else
/// the token's. Verified at the request's clock reading.
///
/// # Errors
/// 401 `invalid_token`: the token does not verify, names no configured tier, or carries a
/// key or tenant claim that cannot be a header value.
fn token_caller(
    rt: &Runtime,
    dynamic: &Dynamic,
    verifier: &JwtVerifier,
    token: &[u8],
    now_ms: u64,
) -> Result<Arc<KeyInfo>, Rejection> {
    let caller = verifier.verify(token, now_ms / 1000).map_err(|e| {
        if verifier.awaiting_keys() {
            // No `jwks_url` set yet: the token's key may be one not fetched yet.
            return Rejection::NotReady;
        }
        tracing::debug!(reason = e.as_str(), "bearer token refused");
        Rejection::InvalidToken
    })?;
    let default = rt
        .config
        .jwt
        .as_ref()
        .and_then(|j| j.default_tier.as_deref());
    let tier_name = caller.tier.as_deref().or(default);
    let Some(tier) = tier_name.and_then(|t| dynamic.tier(&rt.config, t)) else {
        if dynamic.awaiting {
            // The tier may be a database policy not loaded yet.
            return Err(Rejection::NotReady);
        }
        tracing::debug!("bearer token refused: its tier is not configured");
        return Err(Rejection::InvalidToken);
    };
    let tenant = caller.tenant.as_deref();
    let tenant_tier = tenant
        .and_then(|t| dynamic.tenant_tier(&rt.config, t))
        .unwrap_or_else(|| tier.clone());
    let info = KeyInfo::jwt(
        &caller.key_id,
        tenant,
        (tier, tenant_tier),
        caller.claims.clone(),
    );
    // An id that cannot travel upstream in X-Throttle-* is refused, not dropped.
    let unsendable =
        info.headers.key_id.is_none() || (tenant.is_some() && info.headers.tenant.is_none());
    if unsendable {
        tracing::debug!("bearer token refused: a key or tenant claim is not a header value");
        return Err(Rejection::InvalidToken);
    }
    Ok(info)
}

/// Resolves a presented key against the database snapshot, then the config's keys.
///
/// # Errors
/// 401 `missing_api_key` / `invalid_api_key`.
pub fn lookup_key(
    rt: &Runtime,
    dynamic: &Dynamic,
    presented: Presented<'_>,
    auth: Auth,
) -> Result<Option<Arc<KeyInfo>>, Rejection> {
    match presented {
        Presented::Missing if auth == Auth::Required => Err(Rejection::MissingKey),
        Presented::Missing => Ok(None),
        Presented::Malformed => Err(Rejection::InvalidKey),
        Presented::Known(info) => Ok(Some(info.clone())),
        // A token only where no verifier is: the value is an API key like any other.
        Presented::Token(t) => lookup_key(rt, dynamic, validate_key(t), auth),
        Presented::Key(k) => match dynamic.keys.lookup(k) {
            // The snapshot holds the config's keys too, with the database's policies.
            Some(info) => Ok(Some(info)),
            None => match rt.keys.lookup(k) {
                Some(info) => Ok(Some(info)),
                // Before the first snapshot an unknown key may be one not loaded yet.
                None if dynamic.awaiting => Err(Rejection::NotReady),
                None => Err(Rejection::InvalidKey),
            },
        },
    }
}

/// Counts (or, with `peek`, looks at) a failed key lookup against `ip`.
async fn auth_limit(
    core: &Core,
    rt: &Runtime,
    ip: IpAddr,
    peek: bool,
    now_ms: u64,
    origin: super::Origin,
) -> Result<(), Rejection> {
    let Some(limits) = &rt.config.auth_limits else {
        return Ok(());
    };
    let mut check = Check::new(1);
    check.peek = peek;
    check.at_ms = Some(now_ms);
    check.push(
        Scope::Auth,
        Ident::client(ip, rt.config.ipv6_prefix),
        limits,
    );
    let verdict = match decide(core, &check).await {
        Ok(v) => v,
        Err(_) => return Ok(()), // brute-force counting fails open: auth itself still holds
    };
    if !peek {
        let longest = limits
            .windows
            .iter()
            .map(|w| w.window.period_ms())
            .max()
            .unwrap_or(0);
        core.suspect(client_net(rt, ip), now_ms.saturating_add(longest), now_ms);
    }
    match verdict.governing {
        Some(g) if !verdict.allowed => {
            core.metrics.decision(Scope::Auth, Outcome::Rejected);
            let ident = check.scopes.first().map(|s| &s.ident);
            record(core, ip, None, &g, ident, now_ms);
            let rule = limits.ban.filter(|r| origin.strikes(r));
            if let (Some(rule), Some(s)) = (rule, check.scopes.first()) {
                let who = super::bans::Offender {
                    client_ip: ip,
                    key: None,
                    now_ms,
                    source: origin.ban_source(),
                };
                super::bans::strike(
                    core,
                    Scope::Auth,
                    &s.ident,
                    rule,
                    g.decision.retry_after_ms,
                    &who,
                );
            }
            Err(Rejection::RateLimited {
                governing: g,
                message: limits.message.clone(),
                policy: rt
                    .config
                    .server
                    .rate_limit_headers
                    .ietf()
                    .then(|| check.quotas()),
            })
        }
        _ => Ok(()),
    }
}

/// What `[limits.auth]` counts `ip` by: the address (IPv4), an IPv6 client's network.
fn client_net(rt: &Runtime, ip: IpAddr) -> ipnet::IpNet {
    crate::limiter::network(ip, rt.config.ipv6_prefix)
}
