//! Settles held back to go with the identity's next call (`Local::carry`): a window's
//! refund no lease takes, or its debt when no lease of it is in hand, is not sent on its
//! own at once but carried by the next 'check' call of that identity (the script applies
//! it before deciding), else flushed by the expiry pass.

use super::entry::Entry;
use super::settle::{counter, ignored, Windows};
use super::{Local, Return};
use crate::limiter::{Admission, Ident, Scope, ScopeCheck, WindowLimit};
use crate::store::redis::wire::{Carried, LeaseArgs};

/// A held settle goes out with the first expiry pass this long after it was held, unless
/// a call of its identity carried it first.
pub(super) const FLUSH_MS: u64 = 50;
/// How often the expiry pass runs (`server::services::lease_returns`).
const PASS_MS: u64 = 100;
/// Room for the flush call's own time and for Redis's clock running ahead of the lower
/// bound the gateway keeps of it (a round trip at most).
const SLACK_MS: u64 = 100;
/// A counter's settle is held only while the window it lands in (the one current now)
/// lasts at least this long: it reaches Redis before that window ends, as a settle sent
/// at once would (a debt counts in that window, a refund still finds its charge).
const HORIZON_MS: u64 = FLUSH_MS + PASS_MS + SLACK_MS;
/// The most settles held for one window of an identity.
const MAX_HELD: usize = 4;

/// A settle of one window held back (see `Local::carry`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    pub(super) settle: Carried,
    /// The limit the request was charged under: only a call of that limit carries it.
    pub(super) limit: WindowLimit,
    /// The gateway's clock when it was first held.
    pub(super) since: u64,
    /// A lower bound of Redis's clock then (0: unknown).
    pub(super) redis_at: u64,
}

// === impl Local ===

impl Local {
    /// Holds back the settle of `windows` (bit `1 << j` for window `j` of `s`) of a
    /// request of reserved `cost` settling `delta` (signed), each window charged at
    /// `at[j]` (the script's clock), to go with the identity's next call: the windows
    /// held (the others are to be sent now).
    ///
    /// The script applies a carried settle at the start of that call, before deciding,
    /// exactly as the request's own 'settle' call would at that time: this gateway's
    /// next decision of the window sees it as it would have seen a settle sent before
    /// it. A call carries one settle a window (the oldest held); with no call, the
    /// expiry pass sends those held `FLUSH_MS` (so at most about `FLUSH_MS` + `PASS_MS`
    /// after), or drops a refund Redis would ignore by then (a bucket's refund is worth
    /// less the later it comes, never more). A call that fails loses what it carried,
    /// as a failed settle call would.
    ///
    /// Held only for `auto` windows with leases on (an exact window's settle goes at
    /// once, so every gateway's next decision sees it), a counter's only while its
    /// window lasts `HORIZON_MS` more. A debt adds to a debt held for the window, a
    /// counter's refund to a refund of the same window held; else it is held beside
    /// them, up to `MAX_HELD` a window (a refund Redis would now ignore is dropped to
    /// make room), beyond that sent now.
    pub fn carry(
        &self,
        s: &ScopeCheck<'_>,
        windows: Windows,
        at: &[u64],
        (cost, delta): (u32, i64),
        now: u64,
    ) -> Windows {
        if self.lease_ms == 0 || windows == 0 || delta == 0 {
            return 0;
        }
        // A refund gives back at most the reserve.
        let delta = match u32::try_from(delta.unsigned_abs()) {
            _ if delta > 0 => delta,
            Ok(back) => -i64::from(back.min(cost)),
            Err(_) => -i64::from(cost),
        };
        let mut m = self.shard(s.scope, &s.ident);
        let shard = &mut *m;
        let Some(e) = shard.map.get_mut(&(s.scope, s.ident.clone())) else {
            return 0;
        };
        let redis_at = e.redis_now(now);
        let mut done = 0;
        for (j, w) in s.limits.windows.iter().enumerate() {
            let at = at.get(j).copied().unwrap_or(0);
            let off = s.ident.offset_ms(w);
            if windows & (1 << j) == 0 || !self.holdable(w, off, at, redis_at) {
                continue;
            }
            let new = Pending {
                settle: Carried { cost, delta, at },
                limit: *w,
                since: now,
                redis_at,
            };
            if e.hold(new, off, redis_at) {
                done |= 1 << j;
            }
        }
        if done != 0 {
            shard.next_due = shard.next_due.min(now.saturating_add(FLUSH_MS));
        }
        done
    }

    /// Whether a settle of a window of `w` (offset `off`) charged at `at` may be held
    /// back (see `carry`), Redis's clock having reached `redis_at` (a lower bound; 0:
    /// unknown): an `auto` window with leases on, a counter only while its window lasts
    /// `HORIZON_MS` more.
    pub(super) fn holdable(&self, w: &WindowLimit, off: u64, at: u64, redis_at: u64) -> bool {
        self.lease_ms > 0
            && w.admission == Admission::Auto
            && at > 0
            && (!counter(w) || lasts(w, off, redis_at))
    }
}

// === impl Entry ===

impl Entry {
    /// Holds `new` (see `Local::carry`): merged into one held for its window when that
    /// is exact, else beside them while there is room; false: not held.
    pub(super) fn hold(&mut self, new: Pending, off: u64, redis_now: u64) -> bool {
        let w = new.limit;
        // Refunds Redis would now ignore make room.
        self.held
            .retain(|p| p.limit.window != w.window || !stale(&p.limit, off, &p.settle, redis_now));
        let into = (self.held.iter_mut())
            .filter(|p| p.limit == w)
            .find_map(|p| Some((merged(&w, off, &p.settle, &new.settle)?, p)));
        if let Some((settle, p)) = into {
            p.settle = settle;
            return true;
        }
        let mine = self.held.iter().filter(|p| p.limit.window == w.window);
        if mine.count() >= MAX_HELD {
            return false;
        }
        self.held.push(new);
        true
    }

    /// The oldest settle held for the window of `limit`, taken out to go with a call
    /// (none: delta 0).
    pub(super) fn take_carried(&mut self, limit: &WindowLimit) -> Carried {
        let Some(i) = self.held.iter().position(|p| p.limit == *limit) else {
            return Carried::default();
        };
        let p = self.held.remove(i);
        if self.held.is_empty() {
            self.held = Vec::new();
        }
        p.settle
    }

    /// Debts held for the window of `limit` are paid from the lease just granted for it
    /// (the slot's last) when it holds them and, for a counter, is of the window each
    /// was held in: spending leased tokens on a debt is an admission of that much more
    /// on the lease. (A call already in flight when the debt was held granted it; a
    /// later one carried the debt.)
    pub(super) fn pay_held(&mut self, limit: &WindowLimit, off: u64) {
        if self.held.is_empty() {
            return;
        }
        let Some(slot) = self.windows.iter_mut().find(|s| s.window == limit.window) else {
            return;
        };
        let Some(l) = slot.leases.last_mut().filter(|l| l.limit == *limit) else {
            return;
        };
        self.held.retain(|p| {
            let debt = u64::try_from(p.settle.delta).unwrap_or(0);
            let window = |t| p.limit.bounds(t, off);
            let same = !counter(&p.limit) || window(l.granted_at) == window(p.redis_at);
            if p.limit != *limit || debt == 0 || l.tokens < debt || !same {
                return true;
            }
            l.tokens -= debt;
            l.visible = l
                .visible
                .saturating_sub(u32::try_from(debt).unwrap_or(u32::MAX));
            false
        });
    }

    /// Takes the settles held in this entry into `out` (with `now`, only those held
    /// `FLUSH_MS` or more, dropping refunds Redis would ignore by then; without, all of
    /// them): when the expiry pass must look again for the others (`u64::MAX`: none).
    pub(super) fn flush(
        &mut self,
        (scope, ident): (Scope, &Ident),
        now: Option<u64>,
        out: &mut Vec<Return>,
    ) -> u64 {
        if self.held.is_empty() {
            return u64::MAX;
        }
        let redis_now = now.map_or(0, |now| self.redis_now(now));
        let mut next = u64::MAX;
        self.held.retain(|p| {
            let due = p.since.saturating_add(FLUSH_MS);
            if now.is_some_and(|now| now < due) {
                next = next.min(due);
                return true;
            }
            if !stale(&p.limit, ident.offset_ms(&p.limit), &p.settle, redis_now) {
                out.push(p.returned(scope, ident));
            }
            false
        });
        if self.held.is_empty() {
            self.held = Vec::new();
        }
        next
    }
}

// === impl Pending ===

impl Pending {
    /// The return call's window: nothing to give back, the settle to apply.
    pub(super) fn returned(&self, scope: Scope, ident: &Ident) -> Return {
        Return {
            scope,
            ident: ident.clone(),
            limit: self.limit,
            lease: LeaseArgs {
                settle: self.settle,
                ..LeaseArgs::default()
            },
        }
    }
}

/// Whether the window of `w` current at `redis_at` (a lower bound of Redis's clock; 0:
/// unknown) lasts `HORIZON_MS` more.
fn lasts(w: &WindowLimit, off: u64, redis_at: u64) -> bool {
    redis_at > 0 && redis_at.saturating_add(HORIZON_MS) < w.bounds(redis_at, off).1
}

/// Two settles of one window of `w` as one, when that is exact: two debts (each is
/// charged at the time it is applied, capped the same way whether summed or not), or two
/// refunds of a counter charged in the same window (each gives back its own tokens to
/// that window). A bucket's or a log's refunds depend on each charge's time and cost:
/// never merged.
fn merged(w: &WindowLimit, off: u64, a: &Carried, b: &Carried) -> Option<Carried> {
    if a.delta > 0 && b.delta > 0 {
        return Some(Carried {
            delta: a.delta.saturating_add(b.delta),
            at: a.at.min(b.at),
            ..*a
        });
    }
    let same = w.bounds(a.at, off) == w.bounds(b.at, off);
    (a.delta < 0 && b.delta < 0 && counter(w) && same).then(|| Carried {
        cost: a.cost.saturating_add(b.cost),
        delta: a.delta.saturating_add(b.delta),
        at: a.at,
    })
}

/// Whether `settle` is a refund Redis would ignore once its clock reaches `redis_now`.
fn stale(w: &WindowLimit, off: u64, settle: &Carried, redis_now: u64) -> bool {
    let back = u32::try_from(settle.delta.unsigned_abs()).unwrap_or(u32::MAX);
    settle.delta < 0 && ignored(w, off, settle.at, (settle.cost, back), redis_now)
}

#[cfg(test)]
mod tests;
