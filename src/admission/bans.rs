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
/// the span (at most one ban per span).
pub(super) fn strike(core: &Core, scope: Scope, ident: &Ident, rule: BanRule, who: &Offender<'_>) {
    let now_ms = core.clock.now_ms();
    let event = core.events.as_ref().map(|q| {
        let e = Event {
            tenant_id: who.key.map(|k| k.tenant.clone()),
            api_key_id: who
                .key
                .map(|k| k.key_id.clone())
                .filter(|id| !id.is_empty()),
            ip: who.client_ip,
            scope: scope.as_str(),
            limit_key: format!("ban:{}:{ident}", scope.as_str()),
            limit_value: u64::from(rule.after),
            count: u64::from(rule.after),
            window: Window::Second,
            span_secs: Some(rule.within_ms / 1000),
            at_ms: now_ms,
        };
        (q.clone(), e)
    });
    let ban = Ban::new(scope, ident, &rule, now_ms);
    let counted = core.metrics.bans(scope);
    let Some(redis) = core.shared_bans.clone() else {
        let n = core.bans.strike(scope, ident, &rule, now_ms);
        if n == rule.after {
            counted.inc();
            impose(&core.bans, ident.clone(), ban, event, now_ms);
        }
        return;
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let bans = core.bans.clone();
    let ident = ident.clone();
    runtime.spawn(async move {
        let n = match redis.strike(scope, &ident, rule.within_ms).await {
            Ok(n) => n,
            // Redis away: this gateway's own count decides.
            Err(_) => u64::from(bans.strike(scope, &ident, &rule, now_ms)),
        };
        // Exactly one gateway sees the `after`-th rejection of the span: one ban per
        // span, however many gateways go on refusing before the ban reaches them.
        if n != u64::from(rule.after) {
            return;
        }
        if let Err(e) = redis.publish_ban(&ban).await {
            tracing::warn!(error = %e, "publishing an automatic ban failed: it holds on this gateway only");
        }
        counted.inc();
        impose(&bans, ident, ban, event, now_ms);
    });
}

fn impose(
    bans: &Bans,
    ident: Ident,
    ban: Ban,
    event: Option<(Arc<EventQueue>, Event)>,
    now_ms: u64,
) {
    tracing::info!(scope = ban.scope.as_str(), reason = %ban.reason, "automatic ban");
    bans.insert(ident, ban, now_ms);
    if let Some((queue, e)) = event {
        queue.push(e);
    }
}
