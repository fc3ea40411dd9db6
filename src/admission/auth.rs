//! Who is calling: the presented key under the route's `auth` rule, guarded by
//! `[limits.auth]` (failed lookups per address).

use std::net::IpAddr;
use std::sync::Arc;

use super::core::{Core, Dynamic, Runtime};
use super::limits::{decide, record};
use super::Rejection;
use crate::config::Auth;
use crate::identity::{KeyInfo, Presented};
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
    fn addresses(self) -> impl Iterator<Item = IpAddr> + Clone {
        let also = self.also.filter(|a| *a != self.client_ip);
        std::iter::once(self.client_ip).chain(also)
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
    let attempt = matches!(presented, Presented::Key(_) | Presented::Malformed);
    if attempt && rt.config.auth_limits.is_some() {
        for ip in charged.addresses() {
            if core.is_suspect(ip, now_ms) {
                // Past the failed-lookup limit no key is even looked at, valid or not.
                auth_limit(core, rt, ip, true, now_ms, charged.origin).await?;
            }
        }
    }
    match lookup_key(rt, dynamic, presented, auth) {
        Err(Rejection::InvalidKey) => {
            for ip in charged.addresses() {
                auth_limit(core, rt, ip, false, now_ms, charged.origin).await?;
            }
            Err(Rejection::InvalidKey)
        }
        other => other,
    }
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
        Presented::Key(k) => match dynamic.keys.lookup(k) {
            // The snapshot holds the config's keys too, with the database's policies.
            Some(info) => Ok(Some(info)),
            None => rt.keys.lookup(k).map(Some).ok_or(Rejection::InvalidKey),
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
        core.suspect(ip, now_ms.saturating_add(longest), now_ms);
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
