//! Automatic temporary bans in the pipeline: a banned identity is refused with 403 before
//! any limiter decision; a rejection by a scope with `ban = {...}` is counted, and the
//! count reaching `after` bans the identity (fleet-wide on Redis).
//!
//! Counting never delays the 429: on Redis it runs in a spawned task under the store's
//! deadline, and a failed count falls back to this gateway's own.

use std::net::IpAddr;
use std::sync::Arc;

use super::core::Core;
use super::Rejection;
use crate::bans::{Ban, Bans};
use crate::db::events::{Event, EventQueue};
use crate::identity::KeyInfo;
use crate::limiter::{BanRule, Ident, Scope, Window};

/// 403 when `ident` is banned in `scope`.
pub(super) fn check(
    core: &Core,
    scope: Scope,
    ident: &Ident,
    now_ms: u64,
) -> Result<(), Rejection> {
    match core.bans.banned(scope, ident, now_ms) {
        Some(ban) => Err(Rejection::Banned(Box::new(ban))),
        None => Ok(()),
    }
}

/// Who a rejection was about, for the ban's event.
pub(super) struct Offender<'a> {
    pub(super) client_ip: IpAddr,
    pub(super) key: Option<&'a KeyInfo>,
}

/// Counts a rejection of `ident` by `scope` under `rule`; bans it on the `after`-th of
/// the span (at most one ban per span). Only a ban formats anything: a rejection that
/// does not ban costs the count alone.
pub(super) fn strike(core: &Core, scope: Scope, ident: &Ident, rule: BanRule, who: &Offender<'_>) {
    let ban = Pending {
        scope,
        ident: ident.clone(),
        rule,
        now_ms: core.clock.now_ms(),
        client_ip: who.client_ip,
        tenant: who.key.map(|k| k.tenant.clone()),
        key_id: who
            .key
            .map(|k| k.key_id.clone())
            .filter(|id| !id.is_empty()),
        events: core.events.clone(),
        counted: core.metrics.bans(scope),
        dropped: core.metrics.bans_dropped_total.clone(),
        bans: core.bans.clone(),
    };
    let Some(redis) = core.shared_bans.clone() else {
        if ban.local_strike() == rule.after {
            ban.impose();
        }
        return;
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let n = match redis.strike(scope, &ban.ident, rule.within_ms).await {
            Ok(n) => n,
            // Redis away: this gateway's own count decides.
            Err(_) => i64::from(ban.local_strike()),
        };
        // Exactly one gateway sees the `after`-th rejection of the span: one ban per
        // span, however many gateways go on refusing before the ban reaches them (and
        // the count stays quiet until the ban ends, see `RedisStore::quiet_strikes`).
        if n != i64::from(rule.after) {
            return;
        }
        let published = ban.ban();
        match redis.publish_ban(&published).await {
            Ok(true) => {
                let quiet = redis.quiet_strikes(scope, &ban.ident, published.expires_at_ms, ban.now_ms);
                if let Err(e) = quiet.await {
                    tracing::debug!(error = %e, "quieting the strikes of a banned identity failed");
                }
            }
            // The fleet's table is full of bans in force: refused, not put in place of one.
            Ok(false) => {
                ban.dropped.inc();
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "publishing an automatic ban failed: it holds on this gateway only");
            }
        }
        ban.impose();
    });
}

/// A rejection that may become a ban: what imposing it needs, none of it formatted yet.
struct Pending {
    scope: Scope,
    ident: Ident,
    rule: BanRule,
    now_ms: u64,
    client_ip: IpAddr,
    tenant: Option<Arc<str>>,
    key_id: Option<Arc<str>>,
    events: Option<Arc<EventQueue>>,
    counted: prometheus::IntCounter,
    dropped: prometheus::IntCounter,
    bans: Arc<Bans>,
}

impl Pending {
    /// Counts the rejection on this gateway.
    fn local_strike(&self) -> u32 {
        self.bans
            .strike(self.scope, &self.ident, &self.rule, self.now_ms)
    }

    fn ban(&self) -> Ban {
        Ban::new(self.scope, &self.ident, &self.rule, self.now_ms)
    }

    /// Bans here, counts it, and logs it when a database is configured; at the cap it
    /// is refused and counted as dropped instead.
    fn impose(self) {
        let ban = self.ban();
        if !self
            .bans
            .insert(self.ident.clone(), ban.clone(), self.now_ms)
        {
            tracing::warn!(
                scope = ban.scope.as_str(),
                "automatic ban refused: the table of bans is full"
            );
            self.dropped.inc();
            return;
        }
        tracing::info!(scope = ban.scope.as_str(), reason = %ban.reason, "automatic ban");
        self.counted.inc();
        if let Some(queue) = &self.events {
            queue.push(Event {
                tenant_id: self.tenant.clone(),
                api_key_id: self.key_id.clone(),
                ip: self.client_ip,
                scope: self.scope.as_str(),
                limit_key: format!("ban:{}:{}", self.scope.as_str(), self.ident),
                limit_value: u64::from(self.rule.after),
                count: u64::from(self.rule.after),
                window: Window::Second,
                span_secs: Some(self.rule.within_ms / 1000),
                at_ms: self.now_ms,
            });
        }
    }
}
