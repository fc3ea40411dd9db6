//! Local admission for the Redis store: leases and the over-limit cache, so most requests
//! need no round trip and the fleet still never admits over the limit.
//!
//! - **Over-limit cache.** When Redis rejects a window with `retry_after` R, later
//!   requests of that identity needing at least as much (cost) of that window are
//!   rejected here until R has passed, with the same 429 fields and a shrinking
//!   `retry_after`. It only repeats rejections Redis decided: rejection is monotone in
//!   cost and time for every algorithm, so until then Redis would reject them too (unless
//!   another gateway gives leased tokens back early; the cache then rejects at most until
//!   R, never longer).
//! - **Leases.** The script call that admits a request of an `auto` scope may also lease
//!   part of each window's remaining quota to this gateway (charged in Redis at once, at
//!   most half of what remains, none below 2 tokens; see `lua/check.lua`). While every
//!   window a request needs holds enough leased tokens, it is admitted here (a peek is
//!   answered from them too, spending nothing). Settles go window by window, each at
//!   the time its window was charged (`Verdict::decided_at`): a refund of a request paid
//!   from a lease in hand goes back to it, and one Redis would provably ignore sends
//!   nothing (`refund`); a debt (a settled cost above the reserve) is spent from the
//!   leases in hand, as far as they hold it (`debit`), and counts in the rate leases are
//!   sized from. What is left of an `auto` window (the refund of a call's own charge, the
//!   rest of a debt) is held back and carried by the identity's next call, or flushed by
//!   the expiry pass (`carry`); a counter's debt in its window's last moments ends the
//!   leases in the settle call instead: `count_on` and `cost_from` cost no round trip
//!   while the leases last. The size follows the identity's local rate over the lease
//!   length (and the debt the renewing request is likely to settle). Unused tokens go
//!   back when a lease expires (`expired`) or at shutdown (`drain`), or with the next
//!   call for that window.
//!
//! Both are keyed to the limit they were decided at: a cached rejection or a lease
//! serves only a request whose window has exactly that limit (limit, capacity,
//! algorithm: an adaptive route's factor, a reload, a policy row or an override can
//! change it), and any other request of the identity is decided afresh by Redis. A
//! lease of a limit no longer in force is ended with the next call for its window (its
//! leftovers back), or when it expires.
//!
//! Time is the gateway's clock; a lease's end is converted from the script's clock by
//! the difference of the two readings, taken before the call (so it ends early if
//! anything). A lease also keeps the script's time of its grant: a request admitted on
//! it was charged then, which is what its settle names (`Verdict::decided_at`).
//!
//! Memory is bounded: at most `MAX_IDENTITIES` identities (scope, identity) are held.
//! A full shard first forgets its idle entries, then evicts an entry holding no lease,
//! then one holding leases (their leftovers go back with the next `expired`); each
//! eviction counts in `throttle_lease_table_evictions_total`. The 100 ms expiry pass
//! visits only the shards with a lease due (or an idle sweep due).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::HashMap;
use smallvec::SmallVec;

use super::wire::{Grant, LeaseArgs};
use crate::limiter::algorithm::lease_len;
use crate::limiter::{
    Admission, Check, DecidedAt, Ident, Scope, ScopeCheck, Verdict, WindowDecision, WindowLimit,
};
use crate::sharded::Sharded;

mod carry;
mod entry;
mod settle;

use self::entry::{Blocked, Entry, Held};

const SHARDS: usize = 64;
/// Most identities (scope, identity) the table holds, as the memory store's bound.
pub const MAX_IDENTITIES: usize = 524_288;
/// How long one call's lease request keeps others from asking for the same window.
const ASKING_MS: u64 = 200;
/// Idle entries (no lease, no rejection, no traffic for this long) are forgotten.
const IDLE_MS: u64 = 2_000;
/// How often a full shard may scan itself for idle entries to make room.
const ROOM_SWEEP_MS: u64 = 100;

/// How long after a lease's leftovers are handed to a background return its window's
/// rejections are not cached (see `Slot::returning_until`): well past a return call's
/// deadline on a loaded machine.
const RETURN_GRACE_MS: u64 = 2_000;

/// One shard of the table: an identity's windows, and when the expiry pass must look.
#[derive(Default)]
struct Shard {
    map: HashMap<(Scope, Ident), Entry>,
    /// No lease of this shard is due for collection before this (`u64::MAX`: none held).
    next_due: u64,
    /// When idle entries are next forgotten.
    next_prune: u64,
    /// When a full shard last swept its idle entries to make room.
    room_swept_at: u64,
}

/// Leases and cached rejections of one gateway.
pub struct Local {
    shards: Sharded<Shard>,
    lease_ms: u64,
    per_shard: usize,
    /// Leftovers to give back with the next `expired`: leases whose entry was evicted,
    /// and leases granted by a call whose reply came too late to be used.
    evicted: Mutex<Vec<Return>>,
    evictions: AtomicU64,
}

/// What `Local::decide` concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted on leased tokens.
    Leased(Verdict),
    /// Rejected from the over-limit cache.
    OverLimit(Verdict),
    /// Redis must decide.
    Remote,
}

/// How one check goes to Redis (see `Local::prepare`).
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Per scope, per window, in the check's order.
    pub scopes: SmallVec<[SmallVec<[WindowPlan; 2]>; 4]>,
}

/// One window of a `Plan`.
#[derive(Debug, Clone, Copy)]
pub enum WindowPlan {
    /// Paid from a lease in hand: not sent to Redis.
    Covered {
        /// The local decision.
        decision: WindowDecision,
        /// The lease it was paid from (its end).
        until: u64,
        /// When Redis granted that lease (the script's clock): when this request was
        /// charged.
        granted_at: u64,
    },
    /// Decided by Redis, with these lease arguments.
    Remote(LeaseArgs),
}

/// Unused tokens to give back to one window, or a settle held back for it (see
/// `Local::carry`).
#[derive(Debug, Clone)]
pub struct Return {
    /// The scope.
    pub scope: Scope,
    /// Its identity.
    pub ident: Ident,
    /// The window's limit (for the script's arguments).
    pub limit: WindowLimit,
    /// What goes back (and the settle the call carries).
    pub lease: LeaseArgs,
}

// === impl Local ===

impl Local {
    /// A table leasing for at most `lease_ms` (0: no leases; the over-limit cache stays).
    pub fn new(lease_ms: u64) -> Self {
        Self::with_capacity(lease_ms, MAX_IDENTITIES)
    }

    /// A table holding at most about `identities` identities (rounded up to a multiple
    /// of the shard count).
    pub fn with_capacity(lease_ms: u64, identities: usize) -> Self {
        Self {
            shards: Sharded::with(SHARDS, || Shard {
                next_due: u64::MAX,
                ..Shard::default()
            }),
            lease_ms,
            per_shard: identities.div_ceil(SHARDS).max(1),
            evicted: Mutex::default(),
            evictions: AtomicU64::new(0),
        }
    }

    fn shard(&self, scope: Scope, ident: &Ident) -> MutexGuard<'_, Shard> {
        self.shards.lock_for((scope, ident))
    }

    /// The entry of (`scope`, `ident`) in `shard`, made room for when the shard is full
    /// (see the module docs).
    fn entry<'s>(
        &self,
        shard: &'s mut Shard,
        scope: Scope,
        ident: &Ident,
        now: u64,
    ) -> &'s mut Entry {
        let key = (scope, ident.clone());
        if !shard.map.contains_key(&key) && shard.map.len() >= self.per_shard {
            self.make_room(shard, now);
        }
        shard.map.entry(key).or_default()
    }

    /// Frees one place in a full shard: idle entries first, then an entry without a
    /// lease, else one with leases (their leftovers queued for `expired`).
    /// A full shard's idle sweep (a scan of the whole shard) runs at most once per
    /// `ROOM_SWEEP_MS`, so a spray of new identities at the cap costs one eviction per
    /// request, not a scan.
    fn make_room(&self, shard: &mut Shard, now: u64) {
        if now >= shard.room_swept_at.saturating_add(ROOM_SWEEP_MS) {
            shard.room_swept_at = now;
            shard.map.retain(|_, e| !e.idle(now));
            if shard.map.len() < self.per_shard {
                return;
            }
        }
        let victim = shard
            .map
            .iter()
            .find(|(_, e)| e.windows.iter().all(|s| s.leases.is_empty()))
            .or_else(|| shard.map.iter().next())
            .map(|(k, _)| k.clone());
        let Some(key) = victim else { return };
        if let Some(e) = shard.map.remove(&key) {
            let mut returns = Vec::new();
            for slot in e.windows {
                for l in slot.leases {
                    if let Some(r) = l.returned(key.0, &key.1) {
                        returns.push(r);
                    }
                }
            }
            returns.extend(e.held.iter().map(|p| p.returned(key.0, &key.1)));
            if !returns.is_empty() {
                self.evicted
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .extend(returns);
            }
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues leased tokens to be given back with the next `expired` (a lease granted by
    /// a call that missed its deadline: it was never in hand).
    pub fn queue_returns(&self, returns: Vec<Return>) {
        self.evicted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(returns);
    }

    /// Entries evicted to make room since the last call (for the metric).
    pub fn take_evictions(&self) -> u64 {
        self.evictions.swap(0, Ordering::Relaxed)
    }

    /// Decides `check` locally when it can: a cached rejection, or leases for every
    /// window. Counts the request in each identity's rate either way.
    pub fn decide(&self, check: &Check<'_>, now: u64) -> Outcome {
        if check.is_empty() {
            return Outcome::Remote;
        }
        let mut rejected: Option<WindowDecision> = None;
        let mut leased = true;
        for s in &check.scopes {
            let mut m = self.shard(s.scope, &s.ident);
            let e = self.entry(&mut m, s.scope, &s.ident, now);
            let need = e.arrive(check, now);
            for w in &s.limits.windows {
                let slot = e.slot(w.window);
                let usable =
                    slot.usable(now, check.cost, w).is_some() && w.admission == Admission::Auto;
                leased &= usable && slot.usable(now, need, w).is_some();
                // Tokens leased to this gateway are already counted in Redis: a window
                // holding them pays with them even when a rejection is cached beside them
                // (a concurrent call of the same identity reached Redis after the lease
                // took what was left). Refusing then would strand the lease's tokens until
                // it ends, and the fleet would admit less than its limit.
                if usable {
                    continue;
                }
                if let Some(b) = slot
                    .blocked
                    .filter(|b| now < b.until && check.cost >= b.cost && b.limit == *w)
                {
                    let wd = b.at(s.scope, w.window, now);
                    if rejected
                        .is_none_or(|r| wd.decision.retry_after_ms > r.decision.retry_after_ms)
                    {
                        rejected = Some(wd);
                    }
                }
            }
        }
        if let Some(g) = rejected {
            return Outcome::OverLimit(Verdict {
                allowed: false,
                governing: Some(g),
                scopes_checked: scopes_bits(check),
                fallback: false,
                failed_open: 0,
                decided_at: DecidedAt::default(),
            });
        }
        // A peek a lease could pay is answered from it, spending nothing: Redis does not
        // see the tokens leased here, and asking it would end the lease.
        if !leased || self.lease_ms == 0 {
            return Outcome::Remote;
        }
        let mut decisions: SmallVec<[WindowDecision; 8]> = SmallVec::new();
        let mut decided_at = DecidedAt::default();
        for (i, s) in check.scopes.iter().enumerate() {
            let mut m = self.shard(s.scope, &s.ident);
            let Some(e) = m.map.get_mut(&(s.scope, s.ident.clone())) else {
                return Outcome::Remote; // pruned in between: ask Redis
            };
            for (j, w) in s.limits.windows.iter().enumerate() {
                let slot = e.slot(w.window);
                let Some(k) = slot.usable(now, check.cost, w) else {
                    return Outcome::Remote;
                };
                let l = &mut slot.leases[k];
                decided_at.add_window(&check.scopes, i, j, l.granted_at);
                decisions.push(if check.peek {
                    l.look(s.scope, w.window, check.cost, now)
                } else {
                    l.spend(s.scope, w.window, check.cost, now)
                });
            }
        }
        Outcome::Leased(Verdict {
            decided_at,
            ..Verdict::from_decisions(check, decisions)
        })
    }

    /// How Redis will be asked about `check`, per scope and window: a window holding a
    /// usable lease is `Covered` (its tokens are spent now, and given back by `undo` if
    /// another window rejects); the others are `Remote`, with tokens wanted where the
    /// identity's rate calls for a lease and the leftovers of a lease being replaced
    /// (taken out of the table now: they go back with the call).
    pub fn prepare(&self, check: &Check<'_>, now: u64) -> Plan {
        let mut out = SmallVec::new();
        for s in &check.scopes {
            let mut plans = SmallVec::new();
            let mut m = self.shard(s.scope, &s.ident);
            let e = self.entry(&mut m, s.scope, &s.ident, now);
            let rate = e.meter.per_second(now);
            let need = e.need(check.cost, now);
            for w in &s.limits.windows {
                let slot = e.slot(w.window);
                let auto = w.admission == Admission::Auto && self.lease_ms > 0 && !check.peek;
                // A call goes to Redis anyway: a lease past half its life is renewed with
                // it rather than alone later, so an identity's windows (and the scopes
                // its requests share) renew together; so is one that could not also pay
                // the debt the request is likely to settle.
                let usable = slot
                    .usable(now, need, w)
                    .filter(|i| auto && !slot.leases[*i].aging(now));
                if let Some(i) = usable {
                    let l = &mut slot.leases[i];
                    let decision = l.spend(s.scope, w.window, check.cost, now);
                    plans.push(WindowPlan::Covered {
                        decision,
                        until: l.until,
                        granted_at: l.granted_at,
                    });
                    continue;
                }
                if let Some(i) = slot.leases.iter().position(|l| l.limit != *w) {
                    // A lease of a limit no longer in force ends first.
                    let l = slot.leases.remove(i);
                    slot.leases.push(l);
                } else if let Some(i) = slot.usable(now, check.cost, w) {
                    // Renewed: end it first (its leftovers go back with the call).
                    let l = slot.leases.remove(i);
                    slot.leases.push(l);
                }
                let mut a = LeaseArgs::default();
                // None of the leases can pay: one ends with this call (the wire carries one
                // per window; another ends with the next call or at expiry), its unused
                // tokens back and, for a bucket, its hold released (so even a spent lease
                // is named).
                if let Some(l) = slot.leases.pop() {
                    a.ret = l.tokens;
                    a.from = l.grant;
                }
                if auto && slot.asking_until <= now {
                    let len = lease_len(self.lease_ms, w.window.period_ms());
                    // With room for the debt this request is likely to settle: else it
                    // would take tokens sized for the requests after it, and the lease
                    // would run dry a request early.
                    a.want = want(rate, len, w, need - check.cost);
                    if a.want > 0 {
                        slot.asking_until = now.saturating_add(ASKING_MS);
                    }
                }
                if !check.peek {
                    a.settle = e.take_carried(w);
                }
                plans.push(WindowPlan::Remote(a));
            }
            out.push(plans);
        }
        Plan { scopes: out }
    }

    /// Gives the tokens `plan` spent on covered windows back to their leases (another
    /// window rejected the request).
    pub fn undo(&self, check: &Check<'_>, plan: &Plan, cost: u32) {
        for (s, plans) in check.scopes.iter().zip(&plan.scopes) {
            let mut m = self.shard(s.scope, &s.ident);
            let Some(e) = m.map.get_mut(&(s.scope, s.ident.clone())) else {
                continue;
            };
            for (w, p) in s.limits.windows.iter().zip(plans) {
                if let WindowPlan::Covered { until, .. } = p {
                    let slot = e.slot(w.window);
                    if let Some(l) = slot.leases.iter_mut().find(|l| l.until == *until) {
                        l.tokens += u64::from(cost);
                        l.visible = l.visible.saturating_add(cost);
                    }
                }
            }
        }
    }

    /// Records what Redis decided for `scopes`: rejections to repeat, leases taken.
    /// `now` is the gateway's clock read before the call, `redis_now` the script's,
    /// `replied` the gateway's clock when the reply came (for `Entry::redis_now`).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        scopes: &[ScopeCheck<'_>],
        cost: u32,
        decisions: &[WindowDecision],
        grants: &[Grant],
        now: u64,
        redis_now: u64,
        replied: u64,
    ) {
        let mut at = 0;
        for s in scopes {
            let mut m = self.shard(s.scope, &s.ident);
            let mut due = u64::MAX;
            let e = self.entry(&mut m, s.scope, &s.ident, now);
            if redis_now >= e.seen.0 {
                e.seen = (redis_now, replied.max(now));
            }
            for w in &s.limits.windows {
                let (Some(wd), Some(g)) = (decisions.get(at), grants.get(at)) else {
                    return;
                };
                at += 1;
                let slot = e.slot(w.window);
                slot.asking_until = 0;
                let d = wd.decision;
                if !d.allowed && d.retry_after_ms > 0 && now >= slot.returning_until {
                    // Where gateways lease, tokens leased elsewhere come back within a
                    // lease and its grace: a rejection is repeated for at most
                    // `RECHECK_LEASES` lease lengths, then Redis is asked again, so the
                    // fleet spends what its leases return (the answer's retry_after stays
                    // the window's).
                    let mut hold = d.retry_after_ms;
                    if w.admission == Admission::Auto && self.lease_ms > 0 {
                        hold = hold.min(self.lease_ms.saturating_mul(RECHECK_LEASES));
                    }
                    // A regions window's cap rises when a peer's grant arrives (within a
                    // sync period or so): its rejection is repeated for one sync period.
                    if w.fleet == crate::limiter::Fleet::Regions {
                        hold = hold.min(crate::regions::DEFAULT_SYNC_MS);
                    }
                    slot.blocked = Some(Blocked {
                        until: now.saturating_add(hold),
                        retry_at: now.saturating_add(d.retry_after_ms),
                        cost,
                        limit: *w,
                        decision: d,
                        reset_at: now.saturating_add(d.reset_after_ms),
                    });
                } else if d.allowed {
                    slot.blocked = None;
                }
                if g.granted > 0 {
                    let len = g.until.saturating_sub(redis_now);
                    let until = now.saturating_add(len);
                    let held = Held {
                        tokens: g.granted,
                        until,
                        len,
                        grant: *g,
                        granted_at: redis_now,
                        limit: *w,
                        visible: d.remaining,
                        reset_at: now.saturating_add(d.reset_after_ms),
                    };
                    due = due.min(held.due());
                    slot.leases.push(held);
                    e.pay_held(w, s.ident.offset_ms(w));
                }
            }
            m.next_due = m.next_due.min(due);
        }
    }

    /// Leases that ended with tokens left (taken out of the table to be given back), and
    /// settles held long enough (see `Local::carry`); forgets idle entries.
    pub fn expired(&self, now: u64) -> Vec<Return> {
        let mut out =
            std::mem::take(&mut *self.evicted.lock().unwrap_or_else(PoisonError::into_inner));
        // A short grace after the end, so that an identity still sending gives the lease
        // back with its next call instead of a call of its own (well inside a bucket's
        // hold, which lasts one lease length past the end).
        self.collect(&mut out, |l| l.due() <= now, Some(now));
        out
    }

    /// Every lease with tokens left, and every settle held (shutdown).
    pub fn drain(&self) -> Vec<Return> {
        let mut out =
            std::mem::take(&mut *self.evicted.lock().unwrap_or_else(PoisonError::into_inner));
        self.collect(&mut out, |_| true, None);
        out
    }

    /// Takes the leases `due` out of the table into `out`; with `prune_at`, visits only
    /// shards with a lease due or an idle sweep due then (and forgets idle entries).
    fn collect(&self, out: &mut Vec<Return>, due: impl Fn(&Held) -> bool, prune_at: Option<u64>) {
        for mut guard in self.shards.iter_locked() {
            let m = &mut *guard;
            if let Some(now) = prune_at {
                if now < m.next_due && now < m.next_prune {
                    continue;
                }
            }
            let mut next_due = u64::MAX;
            for ((scope, ident), e) in m.map.iter_mut() {
                for slot in &mut e.windows {
                    let mut returning = false;
                    slot.leases.retain(|l| {
                        if !due(l) {
                            next_due = next_due.min(l.due());
                            return true;
                        }
                        let back = l.returned(*scope, ident);
                        returning |= back.as_ref().is_some_and(|r| r.lease.ret > 0);
                        out.extend(back);
                        false
                    });
                    if let (true, Some(now)) = (returning, prune_at) {
                        // A check racing the return call could reach Redis first.
                        slot.returning_until = now.saturating_add(RETURN_GRACE_MS);
                    }
                }
                next_due = next_due.min(e.flush((*scope, ident), prune_at, out));
            }
            m.next_due = next_due;
            if let Some(now) = prune_at.filter(|now| *now >= m.next_prune) {
                m.map.retain(|_, e| !e.idle(now));
                m.next_prune = now.saturating_add(IDLE_MS);
            }
        }
    }

    /// Identities held (for tests and memory bounds).
    pub fn len(&self) -> usize {
        self.shards.iter_locked().map(|s| s.map.len()).sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How many lease lengths a rejection is repeated from the cache at most, where
/// gateways lease (a lease ends, and its leftovers go back, within 1.5 lease lengths).
const RECHECK_LEASES: u64 = 3;

/// Tokens to ask for: the identity's rate over the lease length, and the `debt` the
/// calling request is likely to settle (the script grants at most half of what
/// remains); none when the rate alone is under 2.
fn want(per_second: u64, len_ms: u64, limit: &WindowLimit, debt: u32) -> u64 {
    let w = per_second.saturating_mul(len_ms).div_ceil(1000);
    if w < 2 {
        return 0;
    }
    w.saturating_add(u64::from(debt))
        .min(u64::from(limit.limit) / 2)
}

fn scopes_bits(check: &Check<'_>) -> u8 {
    (1u16 << check.scopes.len()).wrapping_sub(1) as u8
}

#[cfg(test)]
mod tests;
