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
//!   window a request needs holds enough leased tokens, it is admitted here. The size
//!   follows the identity's local rate over the lease length. Unused tokens go back when
//!   a lease expires (`expired`) or at shutdown (`drain`), or with the next call for that
//!   window.
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

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::{DefaultHashBuilder, HashMap};
use smallvec::SmallVec;

use super::wire::{Grant, LeaseArgs};
use crate::limiter::algorithm::lease_len;
use crate::limiter::{
    Admission, Algorithm, Check, DecidedAt, Decision, Ident, Scope, ScopeCheck, Verdict, Window,
    WindowDecision, WindowLimit,
};

const SHARDS: usize = 64;
/// Most identities (scope, identity) the table holds, as the memory store's bound.
pub const MAX_IDENTITIES: usize = 524_288;
/// How long one call's lease request keeps others from asking for the same window.
const ASKING_MS: u64 = 200;
/// Idle entries (no lease, no rejection, no traffic for this long) are forgotten.
const IDLE_MS: u64 = 2_000;

/// One shard of the table: an identity's windows, and when the expiry pass must look.
#[derive(Default)]
struct Shard {
    map: HashMap<(Scope, Ident), Entry>,
    /// No lease of this shard is due for collection before this (`u64::MAX`: none held).
    next_due: u64,
    /// When idle entries are next forgotten.
    next_prune: u64,
}

/// Leases and cached rejections of one gateway.
pub struct Local {
    shards: Box<[Mutex<Shard>]>,
    hasher: DefaultHashBuilder,
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

/// Unused tokens to give back to one window.
#[derive(Debug, Clone)]
pub struct Return {
    /// The scope.
    pub scope: Scope,
    /// Its identity.
    pub ident: Ident,
    /// The window's limit (for the script's arguments).
    pub limit: WindowLimit,
    /// What goes back.
    pub lease: LeaseArgs,
}

#[derive(Debug, Default)]
struct Entry {
    windows: SmallVec<[Slot; 2]>,
    meter: Meter,
    touched: u64,
}

#[derive(Debug, Clone)]
struct Slot {
    window: Window,
    /// Leases in hand, usually one; two when concurrent calls each got one.
    leases: SmallVec<[Held; 1]>,
    blocked: Option<Blocked>,
    /// A call asking for a lease of this window is in flight until then: others do not
    /// ask too (they would strand tokens).
    asking_until: u64,
}

/// A lease in hand.
#[derive(Debug, Clone, Copy)]
struct Held {
    tokens: u64,
    until: u64,
    /// Its length when granted.
    len: u64,
    grant: Grant,
    /// The script's time of the grant (when its tokens were charged).
    granted_at: u64,
    /// The limit it was granted under: it pays only requests of that limit.
    limit: WindowLimit,
    /// What the client may still spend (Redis's remaining when granted, lease included),
    /// decremented by local admissions: the `X-RateLimit-Remaining` shown.
    visible: u32,
    reset_at: u64,
}

/// A rejection Redis decided, repeated locally until `until` for requests of the same
/// limit.
#[derive(Debug, Clone, Copy)]
struct Blocked {
    until: u64,
    cost: u32,
    limit: WindowLimit,
    decision: Decision,
    reset_at: u64,
}

/// Cost units of an identity over the last second (two 1 s buckets, the previous one
/// weighted by overlap), to size its leases.
#[derive(Debug, Default, Clone, Copy)]
struct Meter {
    start: u64,
    prev: u64,
    curr: u64,
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
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        next_due: u64::MAX,
                        ..Shard::default()
                    })
                })
                .collect(),
            hasher: DefaultHashBuilder::default(),
            lease_ms,
            per_shard: identities.div_ceil(SHARDS).max(1),
            evicted: Mutex::default(),
            evictions: AtomicU64::new(0),
        }
    }

    fn shard(&self, scope: Scope, ident: &Ident) -> MutexGuard<'_, Shard> {
        let i = self.hasher.hash_one((scope, ident)) as usize % SHARDS;
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
    fn make_room(&self, shard: &mut Shard, now: u64) {
        shard.map.retain(|_, e| !e.idle(now));
        if shard.map.len() < self.per_shard {
            return;
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
            e.touched = now;
            if !check.peek {
                e.meter.add(now, check.cost);
            }
            for w in &s.limits.windows {
                let slot = e.slot(w.window);
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
                let usable = slot.usable(now, check.cost, w).is_some();
                leased &= usable && w.admission == Admission::Auto;
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
        if !leased || check.peek || self.lease_ms == 0 {
            return Outcome::Remote;
        }
        let mut decisions: SmallVec<[WindowDecision; 8]> = SmallVec::new();
        let mut decided_at = DecidedAt::default();
        for s in &check.scopes {
            let mut m = self.shard(s.scope, &s.ident);
            let Some(e) = m.map.get_mut(&(s.scope, s.ident.clone())) else {
                return Outcome::Remote; // pruned in between: ask Redis
            };
            for w in &s.limits.windows {
                let slot = e.slot(w.window);
                let Some(i) = slot.usable(now, check.cost, w) else {
                    return Outcome::Remote;
                };
                let l = &mut slot.leases[i];
                decided_at.add(s.scope, l.granted_at);
                decisions.push(l.spend(s.scope, w.window, check.cost, now));
            }
        }
        Outcome::Leased(Verdict {
            decided_at,
            ..Verdict::from_decisions(decisions)
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
            for w in &s.limits.windows {
                let slot = e.slot(w.window);
                let auto = w.admission == Admission::Auto && self.lease_ms > 0 && !check.peek;
                // A call goes to Redis anyway: a lease past half its life is renewed with
                // it rather than alone later, so an identity's windows (and the scopes
                // its requests share) renew together.
                let usable = slot
                    .usable(now, check.cost, w)
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
                    a.want = want(rate, len, w);
                    if a.want > 0 {
                        slot.asking_until = now.saturating_add(ASKING_MS);
                    }
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
    /// `now` is the gateway's clock read before the call, `redis_now` the script's.
    pub fn record(
        &self,
        scopes: &[ScopeCheck<'_>],
        cost: u32,
        decisions: &[WindowDecision],
        grants: &[Grant],
        now: u64,
        redis_now: u64,
    ) {
        let mut at = 0;
        for s in scopes {
            let mut m = self.shard(s.scope, &s.ident);
            let mut due = u64::MAX;
            let e = self.entry(&mut m, s.scope, &s.ident, now);
            for w in &s.limits.windows {
                let (Some(wd), Some(g)) = (decisions.get(at), grants.get(at)) else {
                    return;
                };
                at += 1;
                let slot = e.slot(w.window);
                slot.asking_until = 0;
                let d = wd.decision;
                if !d.allowed && d.retry_after_ms > 0 {
                    slot.blocked = Some(Blocked {
                        until: now.saturating_add(d.retry_after_ms),
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
                }
            }
            m.next_due = m.next_due.min(due);
        }
    }

    /// Leases that ended with tokens left (taken out of the table to be given back), and
    /// forgets idle entries.
    pub fn expired(&self, now: u64) -> Vec<Return> {
        let mut out =
            std::mem::take(&mut *self.evicted.lock().unwrap_or_else(PoisonError::into_inner));
        // A short grace after the end, so that an identity still sending gives the lease
        // back with its next call instead of a call of its own (well inside a bucket's
        // hold, which lasts one lease length past the end).
        self.collect(&mut out, |l| l.due() <= now, Some(now));
        out
    }

    /// Every lease with tokens left (shutdown).
    pub fn drain(&self) -> Vec<Return> {
        let mut out =
            std::mem::take(&mut *self.evicted.lock().unwrap_or_else(PoisonError::into_inner));
        self.collect(&mut out, |_| true, None);
        out
    }

    /// Takes the leases `due` out of the table into `out`; with `prune_at`, visits only
    /// shards with a lease due or an idle sweep due then (and forgets idle entries).
    fn collect(&self, out: &mut Vec<Return>, due: impl Fn(&Held) -> bool, prune_at: Option<u64>) {
        for shard in self.shards.iter() {
            let mut guard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            let m = &mut *guard;
            if let Some(now) = prune_at {
                if now < m.next_due && now < m.next_prune {
                    continue;
                }
            }
            let mut next_due = u64::MAX;
            for ((scope, ident), e) in m.map.iter_mut() {
                for slot in &mut e.windows {
                    slot.leases.retain(|l| {
                        if !due(l) {
                            next_due = next_due.min(l.due());
                            return true;
                        }
                        out.extend(l.returned(*scope, ident));
                        false
                    });
                }
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
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).map.len())
            .sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Tokens to ask for: the identity's rate over the lease length (the script grants at
/// most half of what remains); none under 2.
fn want(per_second: u64, len_ms: u64, limit: &WindowLimit) -> u64 {
    let w = per_second.saturating_mul(len_ms).div_ceil(1000);
    if w < 2 {
        return 0;
    }
    w.min(u64::from(limit.limit) / 2)
}

fn scopes_bits(check: &Check<'_>) -> u8 {
    check.scopes.iter().fold(0, |b, s| b | 1 << s.scope as u8)
}

// === impl Entry ===

impl Entry {
    fn slot(&mut self, window: Window) -> &mut Slot {
        let i = match self.windows.iter().position(|s| s.window == window) {
            Some(i) => i,
            None => {
                self.windows.push(Slot {
                    window,
                    leases: SmallVec::new(),
                    blocked: None,
                    asking_until: 0,
                });
                self.windows.len() - 1
            }
        };
        &mut self.windows[i]
    }

    fn idle(&self, now: u64) -> bool {
        now.saturating_sub(self.touched) > IDLE_MS
            && self
                .windows
                .iter()
                .all(|s| s.leases.is_empty() && s.blocked.is_none_or(|b| b.until <= now))
    }
}

// === impl Slot ===

impl Slot {
    /// The lease that can pay `cost` of a window of `limit` now: the one ending first.
    fn usable(&self, now: u64, cost: u32, limit: &WindowLimit) -> Option<usize> {
        self.leases
            .iter()
            .enumerate()
            .filter(|(_, l)| now < l.until && l.tokens >= u64::from(cost) && l.limit == *limit)
            .min_by_key(|(_, l)| l.until)
            .map(|(i, _)| i)
    }
}

// === impl Held ===

impl Held {
    /// Past half its life: renewed with the next call that goes to Redis anyway.
    fn aging(&self, now: u64) -> bool {
        self.until.saturating_sub(now) < self.len / 2
    }

    /// When `expired` collects it: half a lease after its end, so that an identity still
    /// sending gives it back with its next call rather than a call of its own.
    fn due(&self) -> u64 {
        self.until.saturating_add(self.len / 2)
    }

    /// What giving it back sends, if anything: its unused tokens, and for a bucket even
    /// none (naming a spent lease releases its hold).
    fn returned(&self, scope: Scope, ident: &Ident) -> Option<Return> {
        let bucket = matches!(
            self.limit.algorithm,
            Algorithm::TokenBucket | Algorithm::LeakyBucket
        );
        (self.tokens > 0 || bucket).then(|| Return {
            scope,
            ident: ident.clone(),
            limit: self.limit,
            lease: LeaseArgs {
                want: 0,
                ret: self.tokens,
                from: self.grant,
            },
        })
    }

    fn spend(&mut self, scope: Scope, window: Window, cost: u32, now: u64) -> WindowDecision {
        self.tokens -= u64::from(cost);
        self.visible = self.visible.saturating_sub(cost);
        let limit = self.limit.limit;
        WindowDecision {
            scope,
            window,
            decision: Decision {
                allowed: true,
                limit,
                remaining: self.visible.min(limit),
                current: u64::from(limit.saturating_sub(self.visible)),
                reset_after_ms: self.reset_at.saturating_sub(now),
                retry_after_ms: 0,
            },
        }
    }
}

// === impl Blocked ===

impl Blocked {
    fn at(&self, scope: Scope, window: Window, now: u64) -> WindowDecision {
        WindowDecision {
            scope,
            window,
            decision: Decision {
                allowed: false,
                remaining: 0,
                reset_after_ms: self.reset_at.saturating_sub(now),
                retry_after_ms: self.until.saturating_sub(now).max(1),
                ..self.decision
            },
        }
    }
}

// === impl Meter ===

impl Meter {
    const SPAN: u64 = 1_000;

    fn roll(&mut self, now: u64) {
        if now >= self.start + 2 * Self::SPAN {
            *self = Meter {
                start: now - now % Self::SPAN,
                prev: 0,
                curr: 0,
            };
        } else if now >= self.start + Self::SPAN {
            self.start += Self::SPAN;
            self.prev = self.curr;
            self.curr = 0;
        }
    }

    fn add(&mut self, now: u64, cost: u32) {
        self.roll(now);
        self.curr += u64::from(cost);
    }

    /// Cost units over the last second.
    fn per_second(&mut self, now: u64) -> u64 {
        self.roll(now);
        let into = now.saturating_sub(self.start).min(Self::SPAN);
        self.prev * (Self::SPAN - into) / Self::SPAN + self.curr
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{OnFailure, ScopeLimits};

    fn limits(limit: u32, admission: Admission) -> ScopeLimits {
        ScopeLimits {
            concurrent: None,
            ban: None,
            windows: vec![WindowLimit::new(Window::Minute, limit).with_admission(admission)],
            on_failure: OnFailure::Local,
            message: None,
        }
    }

    fn check<'a>(l: &'a ScopeLimits, cost: u32) -> Check<'a> {
        let mut c = Check::new(cost);
        c.push(Scope::Key, Ident::Name("k".into()), l);
        c
    }

    fn decision(allowed: bool, remaining: u32, retry: u64) -> WindowDecision {
        WindowDecision {
            scope: Scope::Key,
            window: Window::Minute,
            decision: Decision {
                allowed,
                limit: 100,
                remaining,
                current: u64::from(100 - remaining),
                reset_after_ms: 60_000,
                retry_after_ms: retry,
            },
        }
    }

    fn grant(n: u64, until: u64) -> Grant {
        Grant {
            granted: n,
            until,
            tag1: 7,
            tag2: 0,
        }
    }

    /// A rejection is repeated for requests of at least the same cost until its retry
    /// ends, with a shrinking retry_after; a cheaper request goes to Redis.
    #[test]
    fn over_limit_cache_repeats_a_rejection_until_retry() {
        let local = Local::new(1_000);
        let l = limits(100, Admission::Auto);
        let c = check(&l, 2);
        local.record(
            &c.scopes,
            2,
            &[decision(false, 0, 5_000)],
            &[Grant::default()],
            1_000,
            900,
        );
        let Outcome::OverLimit(v) = local.decide(&c, 3_000) else {
            panic!("not cached")
        };
        let g = v.governing.unwrap();
        assert_eq!((g.decision.retry_after_ms, g.decision.limit), (3_000, 100));
        assert!(!v.allowed);
        assert_eq!(
            local.decide(&check(&l, 1), 3_000),
            Outcome::Remote,
            "cheaper"
        );
        assert_eq!(local.decide(&c, 6_000), Outcome::Remote, "retry has passed");
    }

    /// A lease admits locally while it holds tokens and has not ended; the lease end is
    /// converted from the script's clock.
    #[test]
    fn a_lease_admits_until_spent_or_ended() {
        let local = Local::new(1_000);
        let l = limits(100, Admission::Auto);
        let c = check(&l, 1);
        // Redis at 500 granted 3 tokens until 1_500 (its clock); our clock read 10_000.
        local.record(
            &c.scopes,
            1,
            &[decision(true, 50, 0)],
            &[grant(3, 1_500)],
            10_000,
            500,
        );
        for remaining in [49, 48, 47] {
            let Outcome::Leased(v) = local.decide(&c, 10_100) else {
                panic!("not leased")
            };
            assert_eq!(v.governing.unwrap().decision.remaining, remaining);
        }
        assert_eq!(local.decide(&c, 10_100), Outcome::Remote, "spent");
        local.record(
            &c.scopes,
            1,
            &[decision(true, 50, 0)],
            &[grant(3, 1_500)],
            10_000,
            500,
        );
        assert_eq!(local.decide(&c, 11_000), Outcome::Remote, "ended at 11_000");
    }

    /// Exact windows never use leases; a lease being replaced goes back with the call.
    #[test]
    fn exact_windows_and_replaced_leases() {
        let local = Local::new(1_000);
        let exact = limits(100, Admission::Exact);
        let c = check(&exact, 1);
        local.record(
            &c.scopes,
            1,
            &[decision(true, 50, 0)],
            &[grant(4, 2_000)],
            0,
            0,
        );
        assert_eq!(local.decide(&c, 10), Outcome::Remote);
        let a = remote(&local.prepare(&c, 10));
        assert_eq!((a.want, a.ret), (0, 4), "exact: returned, none wanted");

        let auto = limits(100, Admission::Auto);
        let c = check(&auto, 5);
        local.record(
            &c.scopes,
            5,
            &[decision(true, 50, 0)],
            &[grant(3, 2_000)],
            0,
            0,
        );
        let a = remote(&local.prepare(&c, 10));
        assert_eq!(a.ret, 3, "too few tokens for cost 5: given back");
        assert_eq!(a.from.tag1, 7);
    }

    /// The rate meter sizes what is wanted: nothing for a first request, the rate over the
    /// lease length once there is traffic.
    #[test]
    fn want_follows_the_local_rate() {
        let local = Local::new(1_000);
        let l = limits(10_000, Admission::Auto);
        let c = check(&l, 1);
        assert_eq!(local.decide(&c, 0), Outcome::Remote);
        assert_eq!(
            remote(&local.prepare(&c, 0)).want,
            0,
            "one request: no lease"
        );
        for t in 1..50 {
            let _ = local.decide(&c, t * 10);
        }
        let want = remote(&local.prepare(&c, 500)).want;
        assert_eq!(want, 50, "50 requests in the last second, 1 s leases");
    }

    fn remote(plan: &Plan) -> LeaseArgs {
        match plan.scopes[0][0] {
            WindowPlan::Remote(a) => a,
            WindowPlan::Covered { .. } => panic!("covered"),
        }
    }

    /// A window with a lease is covered (its tokens spent) while another goes to Redis;
    /// `undo` gives the tokens back when the request is rejected.
    #[test]
    fn covered_windows_spend_and_undo() {
        let local = Local::new(1_000);
        let l = ScopeLimits {
            concurrent: None,
            ban: None,
            windows: vec![
                WindowLimit::new(Window::Second, 10),
                WindowLimit::new(Window::Minute, 100),
            ],
            on_failure: OnFailure::Local,
            message: None,
        };
        let c = check(&l, 1);
        let minute = WindowDecision {
            window: Window::Second,
            ..decision(true, 5, 0)
        };
        local.record(
            &c.scopes,
            1,
            &[minute, decision(true, 50, 0)],
            &[Grant::default(), grant(3, 2_000)],
            0,
            0,
        );
        let plan = local.prepare(&c, 10);
        assert!(matches!(plan.scopes[0][0], WindowPlan::Remote(_)));
        let WindowPlan::Covered { decision: d, .. } = plan.scopes[0][1] else {
            panic!("minute not covered")
        };
        assert_eq!(d.decision.remaining, 49);
        local.undo(&c, &plan, 1);
        let again = local.prepare(&c, 20);
        let WindowPlan::Covered { decision: d, .. } = again.scopes[0][1] else {
            panic!("minute not covered")
        };
        assert_eq!(d.decision.remaining, 49, "the undone token was spent again");
    }

    /// A call that goes to Redis anyway renews a lease past half its life: the lease ends
    /// (leftovers back) instead of paying.
    #[test]
    fn aging_leases_renew_with_a_call() {
        let local = Local::new(1_000);
        let l = limits(100, Admission::Auto);
        let c = check(&l, 1);
        local.record(
            &c.scopes,
            1,
            &[decision(true, 50, 0)],
            &[grant(5, 1_000)],
            0,
            0,
        );
        assert!(matches!(
            local.prepare(&c, 400).scopes[0][0],
            WindowPlan::Covered { .. }
        ));
        let a = remote(&local.prepare(&c, 600));
        assert_eq!(a.ret, 4, "the 4 left go back; Redis decides this request");
    }

    /// Ended leases are collected once; idle identities are forgotten; drain takes all.
    #[test]
    fn expiry_and_drain_collect_leftovers() {
        let local = Local::new(1_000);
        let l = limits(100, Admission::Auto);
        let c = check(&l, 1);
        local.record(
            &c.scopes,
            1,
            &[decision(true, 50, 0)],
            &[grant(5, 1_000)],
            0,
            0,
        );
        // A 1 s lease ending at 1_000 is collected half a lease later (a request of the
        // identity may end it with its own call first).
        assert!(local.expired(1_499).is_empty());
        let r = local.expired(1_500);
        assert_eq!((r.len(), r[0].lease.ret), (1, 5));
        assert!(local.expired(1_501).is_empty(), "collected once");
        assert_eq!(local.len(), 1);
        let _ = local.expired(10_000);
        assert!(local.is_empty(), "idle identity forgotten");
        local.record(
            &c.scopes,
            1,
            &[decision(true, 50, 0)],
            &[grant(5, 99_000)],
            20_000,
            0,
        );
        assert_eq!(local.drain()[0].lease.ret, 5);
    }

    /// A cached rejection and a lease serve only requests of the limit they were decided
    /// at: the same identity under another limit (an adaptive factor, a reload) goes to
    /// Redis, and the lease of the old limit goes back with that call.
    #[test]
    fn rejections_and_leases_are_keyed_to_their_limit() {
        let local = Local::new(1_000);
        let full = limits(20, Admission::Auto);
        let reduced = limits(4, Admission::Auto);
        let at_full = check(&full, 1);
        let at_reduced = check(&reduced, 1);
        local.record(
            &at_reduced.scopes,
            1,
            &[decision(false, 0, 5_000)],
            &[Grant::default()],
            1_000,
            1_000,
        );
        assert!(matches!(
            local.decide(&at_reduced, 2_000),
            Outcome::OverLimit(_)
        ));
        assert_eq!(
            local.decide(&at_full, 2_000),
            Outcome::Remote,
            "a rejection at limit 4 is not one at limit 20"
        );

        let local = Local::new(1_000);
        local.record(
            &at_full.scopes,
            1,
            &[decision(true, 15, 0)],
            &[grant(5, 2_000)],
            1_000,
            1_000,
        );
        assert!(matches!(local.decide(&at_full, 1_100), Outcome::Leased(_)));
        assert_eq!(
            local.decide(&at_reduced, 1_100),
            Outcome::Remote,
            "a lease of limit 20 does not pay under limit 4"
        );
        let a = remote(&local.prepare(&at_reduced, 1_100));
        assert_eq!(a.ret, 4, "the old limit's lease ends with the call");
        assert_eq!(local.decide(&at_full, 1_100), Outcome::Remote, "it is gone");
    }

    /// A request admitted on a lease was charged when the lease was granted: its verdict
    /// names the script's time of the grant, not the gateway's clock.
    #[test]
    fn leased_verdicts_name_the_grant_time() {
        let local = Local::new(1_000);
        let l = limits(100, Admission::Auto);
        let c = check(&l, 1);
        local.record(
            &c.scopes,
            1,
            &[decision(true, 50, 0)],
            &[grant(3, 1_500)],
            10_000,
            500,
        );
        let Outcome::Leased(v) = local.decide(&c, 10_100) else {
            panic!("not leased")
        };
        assert_eq!(v.decided_at.of(Scope::Key), 500);
        let plan = local.prepare(&c, 10_200);
        let WindowPlan::Covered { granted_at, .. } = plan.scopes[0][0] else {
            panic!("not covered")
        };
        assert_eq!(granted_at, 500);
    }

    /// The table holds a bounded number of identities: a spray of identities evicts
    /// (idle ones first, then ones without leases, then leased ones, whose tokens go
    /// back with the next expiry pass), and every eviction is counted.
    #[test]
    fn the_table_is_bounded_and_evicted_leases_go_back() {
        let local = Local::with_capacity(1_000, SHARDS); // one identity per shard
        let l = limits(100, Admission::Auto);
        let leased = check(&l, 1);
        local.record(
            &leased.scopes,
            1,
            &[decision(true, 50, 0)],
            &[grant(5, 60_000)],
            0,
            0,
        );
        for i in 0..2_000u32 {
            let mut c = Check::new(1);
            c.push(
                Scope::Ip,
                Ident::Ip(std::net::IpAddr::from(i.to_be_bytes())),
                &l,
            );
            let _ = local.decide(&c, 10);
        }
        assert!(local.len() <= SHARDS, "{} identities held", local.len());
        let evictions = local.take_evictions();
        assert!(evictions >= 2_000 - SHARDS as u64, "{evictions} evictions");
        // The leased identity's shard filled up too: its tokens come back, not lost.
        let back: u64 = local.expired(20).iter().map(|r| r.lease.ret).sum();
        assert_eq!(back, 5, "the evicted lease's 5 tokens are given back");
    }

    /// The expiry pass skips shards with nothing due, and still collects each lease once
    /// it is due.
    #[test]
    fn the_expiry_pass_collects_what_is_due_only() {
        let local = Local::new(1_000);
        let l = limits(100, Admission::Auto);
        let c = check(&l, 1);
        local.record(
            &c.scopes,
            1,
            &[decision(true, 50, 0)],
            &[grant(5, 1_000)],
            0,
            0,
        );
        let mut other = Check::new(1);
        other.push(Scope::Tenant, Ident::Name("t".into()), &l);
        local.record(
            &other.scopes,
            1,
            &[decision(true, 50, 0)],
            &[grant(7, 9_000)],
            0,
            0,
        );
        assert!(local.expired(100).is_empty());
        let first: Vec<u64> = local.expired(1_500).iter().map(|r| r.lease.ret).collect();
        assert_eq!(first, vec![5]);
        assert!(local.expired(5_000).is_empty());
        let second: Vec<u64> = local.expired(13_500).iter().map(|r| r.lease.ret).collect();
        assert_eq!(second, vec![7]);
    }
}
