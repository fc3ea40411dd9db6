//! Automatic temporary bans in the pipeline: a banned identity is refused with 403 before
//! any limiter decision; a rejection by a scope with `ban = {...}` is counted, and the
//! count reaching `after` bans the identity (fleet-wide on Redis).
//!
//! Counting never delays the 429: on Redis it runs in a spawned task under the store's
//! deadline, at most once per identity per `retry_after` (see [`strike`]), and while
//! Redis fails this gateway's own count decides.

use std::net::IpAddr;
use std::sync::Arc;

use super::core::Core;
use super::Rejection;
use crate::bans::{Ban, BanSource, Bans, Tally};
use crate::identity::KeyInfo;
use crate::limiter::{BanRule, Ident, Scope, Window};
use crate::store::bans::Published;
use crate::store::BanStore;
use crate::violations::{Event, EventSink};

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
    /// The request's clock reading (what the strike counts at).
    pub(super) now_ms: u64,
    /// Who struck: a proxied request or a decision API (whose bans may hold at most half
    /// of the table).
    pub(super) source: BanSource,
}

/// Counts a rejection of `ident` by `scope` under `rule`, whose `retry_after` was
/// `retry_after_ms`; bans it on the `after`-th of the span (at most one ban per span),
/// under `scope.ban_scope()`. Each scope counts its own strikes: a route's `login.ip`
/// rule is not pooled with `[limits.ip]`'s, though both ban the address.
/// Only a ban formats anything: a rejection that does not ban costs the count alone.
///
/// On Redis the rejections go to the fleet's count in batches: at most one call per
/// identity per `retry_after` on this gateway, the ones counted meanwhile with the next
/// call (INCRBY n). The ban lands when the fleet's count crosses `after` with a call
/// (before < after <= after it: one gateway sees that), or at once when this gateway's
/// own count reaches `after`; publishing it is the arbiter between the two (a ban in
/// force is kept, not imposed twice).
pub(super) fn strike(
    core: &Core,
    scope: Scope,
    ident: &Ident,
    rule: BanRule,
    retry_after_ms: u64,
    who: &Offender<'_>,
) {
    let now_ms = who.now_ms;
    let Some(redis) = core.shared_bans.clone() else {
        if core.bans.strike(scope, ident, &rule, now_ms) == rule.after {
            Pending::new(core, scope, ident, rule, now_ms, who).impose();
        }
        return;
    };
    let tally = core
        .bans
        .strike_shared(scope, ident, &rule, now_ms, retry_after_ms);
    if tally == Tally::Held {
        return;
    }
    let ban = Pending::new(core, scope, ident, rule, now_ms, who);
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime to call Redis from: this gateway's own count decides.
        match tally {
            Tally::Send { n, span_ms } => core.bans.sent(scope, ident, span_ms, n),
            Tally::Ban | Tally::Held => ban.impose(),
        }
        return;
    };
    match tally {
        Tally::Held => {}
        Tally::Ban => {
            // This gateway saw the `after`-th rejection: the ban is in force here at once
            // (the next request is refused, whatever Redis takes), then published; the
            // fleet's answer may replace it with another gateway's earlier ban, or lift it
            // when the fleet's table is full.
            let here = ban.ban();
            let held = ban
                .bans
                .insert_from(ban.ident.clone(), here.clone(), now_ms, ban.source);
            runtime.spawn(publish(redis, ban, held.then(|| here.id())));
        }
        Tally::Send { n, span_ms } => {
            runtime.spawn(async move {
                let mut call = Call {
                    bans: ban.bans.clone(),
                    scope,
                    ident: ban.ident.clone(),
                    span_ms,
                    unsent: n,
                };
                let count = match redis.strike(scope, &ban.ident, n, rule.within_ms).await {
                    Ok(count) => count,
                    // Redis away: they go with the next call; meanwhile this gateway's
                    // own count decides (see `Bans::strike_shared`).
                    Err(e) => {
                        tracing::debug!(error = %e, "counting rejections towards a ban failed");
                        return;
                    }
                };
                call.unsent = 0;
                drop(call);
                // Exactly one call sees the count cross `after`: one ban per span,
                // however many gateways go on refusing before the ban reaches them (the
                // count stays quiet until the ban ends, see `BanStore::quiet_strikes`).
                let after = i64::from(rule.after);
                if count.saturating_sub(i64::from(n)) < after && after <= count {
                    publish(redis, ban, None).await;
                }
            });
        }
    }
}

/// Publishes the ban to the fleet and imposes it here (counted and logged once); a ban
/// already in force on the identity (another gateway was first) is taken as it is, not
/// imposed twice. `here`: the id of the ban this gateway already put in force while it
/// published, lifted again if the fleet refuses it (its table is full).
async fn publish(redis: Arc<dyn BanStore>, ban: Pending, here: Option<i64>) {
    let published = ban.ban();
    match redis.publish_ban(&published, ban.now_ms, ban.source).await {
        Ok(Published::Set) => {
            let quiet = redis.quiet_strikes(
                ban.struck_by,
                &ban.ident,
                published.expires_at_ms,
                ban.now_ms,
            );
            if let Err(e) = quiet.await {
                tracing::debug!(error = %e, "quieting the strikes of a banned identity failed");
            }
            ban.impose();
        }
        Ok(Published::InForce(first)) => ban.adopt(first),
        // The fleet's table is full of bans in force (or, for a decision API's, its half of
        // it): refused, not put in place of one.
        Ok(Published::Full | Published::ChecksFull) => {
            if let Some(id) = here {
                ban.bans.lift(id);
            }
            ban.dropped.inc();
        }
        Err(e) => {
            tracing::warn!(error = %e, "publishing an automatic ban failed: it holds on this gateway only");
            ban.impose();
        }
    }
}

/// A call adding rejections to the fleet's count, under way: when it ends (or its task
/// is dropped), the identity may call again, and what did not reach Redis is pending
/// again.
struct Call {
    bans: Arc<Bans>,
    scope: Scope,
    ident: Ident,
    span_ms: u64,
    unsent: u32,
}

impl Drop for Call {
    fn drop(&mut self) {
        self.bans
            .sent(self.scope, &self.ident, self.span_ms, self.unsent);
    }
}

/// A rejection that may become a ban: what imposing it needs, none of it formatted yet.
struct Pending {
    /// The scope the ban is recorded under (`Scope::ban_scope` of the rejecting one).
    scope: Scope,
    /// The rejecting scope, whose strikes counted towards it.
    struck_by: Scope,
    ident: Ident,
    rule: BanRule,
    now_ms: u64,
    source: BanSource,
    client_ip: IpAddr,
    tenant: Option<Arc<str>>,
    key_id: Option<Arc<str>>,
    events: Option<Arc<dyn EventSink>>,
    counted: prometheus::IntCounter,
    dropped: prometheus::IntCounter,
    bans: Arc<Bans>,
}

impl Pending {
    fn new(
        core: &Core,
        scope: Scope,
        ident: &Ident,
        rule: BanRule,
        now_ms: u64,
        who: &Offender<'_>,
    ) -> Self {
        Pending {
            scope: scope.ban_scope(),
            struck_by: scope,
            ident: ident.clone(),
            rule,
            now_ms,
            source: who.source,
            client_ip: who.client_ip,
            tenant: who.key.and_then(|k| k.tenant.clone()),
            key_id: who.key.and_then(KeyInfo::key_scope_id).map(Arc::from),
            events: core.events.clone(),
            counted: core.metrics.bans(scope),
            dropped: core.metrics.bans_dropped[who.source as usize].clone(),
            bans: core.bans.clone(),
        }
    }

    /// Takes the fleet's ban on the identity (another gateway imposed it): in force
    /// here at once, not counted or logged again.
    fn adopt(self, first: Ban) {
        if !self.bans.insert(self.ident, first, self.now_ms) {
            self.dropped.inc();
        }
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
            .insert_from(self.ident.clone(), ban.clone(), self.now_ms, self.source)
        {
            tracing::warn!(
                scope = ban.scope.as_str(),
                source = self.source.as_str(),
                "automatic ban refused: the table of bans (or the decision APIs' half) is full"
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
