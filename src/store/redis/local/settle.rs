//! Settling a request's cost against the leases in hand, window by window: a refund goes
//! back to the lease that paid it or is dropped when Redis would ignore it (`refund`), a
//! debt is spent from the leases or ends them (`debit`).

use smallvec::SmallVec;

use super::carry::{Pending, FLUSH_MS};
use super::entry::{Entry, Held};
use super::{Local, Return};
use crate::limiter::algorithm::refund_units;
use crate::limiter::{Algorithm, ScopeCheck, WindowLimit};
use crate::store::redis::wire::{Carried, LeaseArgs};

/// Windows of a scope, bit `1 << j` for its window `j`.
pub(super) type Windows = u32;

/// A debt the leases in hand could not hold (see `Local::debit`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Unpaid {
    /// The windows whose debt is Redis's (bit `1 << j` for window `j` of the scope).
    pub windows: Windows,
    /// For each of those windows, in order: the lease the settle call gives back first.
    pub ended: SmallVec<[LeaseArgs; 2]>,
}

// === impl Unpaid ===

impl Unpaid {
    /// The windows whose debt ended no lease (none in hand held any of it, nothing to
    /// give back): they may carry it on the next call (`Local::carry`).
    pub fn free(&self) -> Windows {
        let mut named = self.ended.iter();
        (0..Windows::BITS)
            .filter(|j| self.windows & (1 << j) != 0)
            .filter(|_| named.next().is_some_and(|a| *a == LeaseArgs::default()))
            .fold(0, |out, j| out | (1 << j))
    }

    /// What is left once the `carried` windows are taken out.
    pub fn without(self, carried: Windows) -> Unpaid {
        let sent = (0..Windows::BITS).filter(|j| self.windows & (1 << j) != 0);
        let ended = (sent.zip(self.ended))
            .filter(|(j, _)| carried & (1 << j) == 0)
            .map(|(_, a)| a)
            .collect();
        Unpaid {
            windows: self.windows & !carried,
            ended,
        }
    }
}

// === impl Local ===

impl Local {
    /// Settles a refund of `back` of the `cost` tokens a request of `s` reserved, each
    /// window `j` charged at `at[j]` (its `DecidedAt::of_window`: the script's clock),
    /// with the leases in hand: the windows done locally (bit `1 << j`), the others are
    /// Redis's (nothing changed for them).
    ///
    /// A refunded request paid from a lease is, for the lease rule, tokens of the lease
    /// never used: they go back with its leftovers, to the window (or bucket, or log
    /// entry) the lease was charged in, which is where Redis's refund of a request
    /// charged then goes. A counter (fixed or sliding window) takes any give-back into
    /// its window: any live lease of it takes the refund of a request charged in the
    /// current window (the call's own charge too). A bucket's or a log's refund depends
    /// on when it was charged: only the lease granted at the window's time takes it,
    /// never beyond what it was granted (a give-back is at most its size: a request the
    /// script charged beside the grant was not paid from it). The remaining the lease
    /// reports counts it.
    ///
    /// A window no lease takes is done too when Redis would provably ignore its refund
    /// (see `ignored`): Redis's clock is already past what the charge's refund can touch.
    pub fn refund(
        &self,
        s: &ScopeCheck<'_>,
        at: &[u64],
        (cost, back): (u32, u32),
        now: u64,
    ) -> Windows {
        if back == 0 {
            return 0;
        }
        let mut m = self.shard(s.scope, &s.ident);
        let Some(e) = m.map.get_mut(&(s.scope, s.ident.clone())) else {
            return 0;
        };
        let redis_now = e.redis_now(now);
        let mut done = 0;
        for (j, w) in s.limits.windows.iter().enumerate() {
            let Some(at) = at.get(j).copied().filter(|t| *t > 0) else {
                continue;
            };
            let off = s.ident.offset_ms(w);
            let slot = e.slot(w.window);
            let paid_by = slot.leases.iter_mut().find(|l| {
                let paid = match counter(w) {
                    // A counter's lease is of the window of its grant (it ends with it):
                    // the refund belongs there when the request was charged in that
                    // window too. Both times are the script's clock.
                    true => w.bounds(at, off) == w.bounds(l.granted_at, off),
                    false => l.granted_at == at && fits(l, back),
                };
                paid && l.limit == *w && now < l.until
            });
            if let Some(l) = paid_by {
                l.tokens += u64::from(back);
                l.visible = l.visible.saturating_add(back);
                done |= 1 << j;
            } else if ignored(w, off, at, (cost, back), redis_now) {
                done |= 1 << j;
            }
        }
        done
    }

    /// Charges a debt of `debt` units of a request of `s` of reserved `cost` (its true
    /// cost above its reserve) at `now`, each window `j` charged at `at[j]` (the
    /// script's clock), window by window:
    /// - a window holding a live lease of its limit with that many tokens pays from it
    ///   (they were charged in Redis when granted: spending them is an admission of
    ///   `debt` more on the lease, which the lease rule allows for every algorithm);
    /// - a window whose settle may be held back (`Local::holdable`) spends what its live
    ///   leases hold (none, or less than the debt each) and holds the rest back for the
    ///   identity's next call (`Local::carry`), which its emptied lease makes come soon:
    ///   the debt costs no call of its own;
    /// - the others (`Err`) are Redis's: their live leases end and the settle call gives
    ///   back, per window, the one named in `Unpaid::ended` before it charges the whole
    ///   debt there (a second lease of a window goes back with the next expiry pass), so
    ///   no gateway keeps admitting on tokens of a window the debt has spent, and a check
    ///   racing the settle sees less spent, not more (the leftovers are below the debt).
    ///
    /// The debt counts in the identity's rate (leases are sized for what it spends, not
    /// what it reserves), and for a while the next admissions on a lease keep room for
    /// one more such debt (`Entry::need`): a lease that could pay the request but not
    /// its debt is renewed with that request's check call, which asks for room for the
    /// debt too, so the debt is paid from the new lease rather than held for the next
    /// call (or, where it may not be held, sent in a settle call of its own).
    pub fn debit(
        &self,
        s: &ScopeCheck<'_>,
        debt: u64,
        (cost, at): (u32, &[u64]),
        now: u64,
    ) -> Result<(), Box<Unpaid>> {
        let mut m = self.shard(s.scope, &s.ident);
        let shard = &mut *m;
        let Some(e) = shard.map.get_mut(&(s.scope, s.ident.clone())) else {
            return Err(Box::new(Unpaid {
                windows: all(s),
                ended: s
                    .limits
                    .windows
                    .iter()
                    .map(|_| LeaseArgs::default())
                    .collect(),
            }));
        };
        let units = u32::try_from(debt).unwrap_or(u32::MAX);
        e.meter.add(now, units);
        let recent = e.need(0, now);
        e.debt = (units.max(recent - recent / 4), now);
        let redis_at = e.redis_now(now);
        let mut unpaid = Unpaid::default();
        let mut later = Vec::new();
        let mut held = false;
        for (j, w) in s.limits.windows.iter().enumerate() {
            let slot = e.slot(w.window);
            let paying = (slot.leases.iter_mut())
                .filter(|l| l.live(w, now) && l.tokens >= debt)
                .min_by_key(|l| l.until);
            if let Some(l) = paying {
                l.tokens -= debt;
                l.visible = l.visible.saturating_sub(units);
                continue;
            }
            let off = s.ident.offset_ms(w);
            let at_j = at.get(j).copied().unwrap_or(0);
            if self.holdable(w, off, at_j, redis_at) {
                let rest = Carried {
                    cost,
                    delta: 0,
                    at: at_j,
                };
                if let Some(h) = e.spend_and_hold(w, off, (debt, rest), now, redis_at) {
                    held |= h;
                    continue;
                }
            }
            let slot = e.slot(w.window);
            let mut ended: SmallVec<[Return; 2]> = SmallVec::new();
            slot.leases.retain(|l| {
                if !l.live(w, now) {
                    return true;
                }
                ended.extend(l.returned(s.scope, &s.ident));
                false
            });
            // The call names the lease with the most left; any other goes back later.
            let most = (0..ended.len()).max_by_key(|i| ended[*i].lease.ret);
            let named = most.map_or_else(LeaseArgs::default, |i| ended.remove(i).lease);
            unpaid.windows |= 1 << j;
            unpaid.ended.push(named);
            later.extend(ended);
        }
        if held {
            shard.next_due = shard.next_due.min(now.saturating_add(FLUSH_MS));
        }
        drop(m);
        if !later.is_empty() {
            self.queue_returns(later);
        }
        match unpaid.windows {
            0 => Ok(()),
            _ => Err(Box::new(unpaid)),
        }
    }
}

// === impl Entry ===

impl Entry {
    /// Spends on a `debt` of a window of `w` (offset `off`) what its live leases hold
    /// (each less than the debt), ending first first, and holds the rest back as `rest`
    /// (its delta set here): whether something was held; None (nothing spent or held)
    /// when the window holds its most settles already (see `Local::debit`).
    fn spend_and_hold(
        &mut self,
        w: &WindowLimit,
        off: u64,
        (debt, rest): (u64, Carried),
        now: u64,
        redis_at: u64,
    ) -> Option<bool> {
        let slot = self.slot(w.window);
        let avail: u64 = slot
            .leases
            .iter()
            .filter(|l| l.live(w, now))
            .map(|l| l.tokens)
            .sum();
        let rest = Pending {
            settle: Carried {
                delta: i64::try_from(debt.saturating_sub(avail)).unwrap_or(i64::MAX),
                ..rest
            },
            limit: *w,
            since: now,
            redis_at,
        };
        if avail < debt && !self.hold(rest, off, redis_at) {
            return None;
        }
        let units = u32::try_from(debt).unwrap_or(u32::MAX);
        let slot = self.slot(w.window);
        let mut leases: SmallVec<[&mut Held; 2]> =
            slot.leases.iter_mut().filter(|l| l.live(w, now)).collect();
        leases.sort_by_key(|l| l.until);
        let mut left = debt;
        for l in leases {
            let take = l.tokens.min(left);
            l.tokens -= take;
            l.visible = l.visible.saturating_sub(units);
            left -= take;
        }
        Some(avail < debt)
    }

    /// A time Redis's clock has provably reached by the gateway's `now`: the latest
    /// script time recorded for this identity, plus the gateway's time since that
    /// call's reply (its script ran before the reply arrived). 0: none known.
    pub(super) fn redis_now(&self, now: u64) -> u64 {
        let (script, reply) = self.seen;
        match script {
            0 => 0,
            _ => script.saturating_add(now.saturating_sub(reply)),
        }
    }
}

pub(super) fn counter(w: &WindowLimit) -> bool {
    matches!(
        w.algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindow
    )
}

/// Whether a bucket's or log's lease can take `back` more tokens: never beyond its grant.
fn fits(l: &Held, back: u32) -> bool {
    l.tokens.saturating_add(u64::from(back)) <= l.grant.granted
}

fn all(s: &ScopeCheck<'_>) -> Windows {
    (1u64 << s.limits.windows.len()).wrapping_sub(1) as Windows
}

/// Whether Redis's 'settle' of a refund of `back` of `cost` tokens charged at `at` in a
/// window of `w` (offset `off`) changes nothing once its clock has reached `redis_now`
/// (a lower bound of its `now` then; the twins are the `settle`s of `lua/*.lua`):
/// - fixed window: only the charge's window, while it is current, takes a refund;
/// - sliding window: only the current window and the one before it do;
/// - token and leaky buckets: the refund is `refund_units`, none once the bucket has
///   refilled (or drained) the whole cost since the charge;
/// - sliding log: the entry is rewritten (never skipped).
pub(super) fn ignored(
    w: &WindowLimit,
    off: u64,
    at: u64,
    (cost, back): (u32, u32),
    redis_now: u64,
) -> bool {
    if redis_now == 0 {
        return false;
    }
    match w.algorithm {
        Algorithm::FixedWindow => redis_now >= w.bounds(at, off).1,
        Algorithm::SlidingWindow => {
            let next = w.bounds(at, off).1;
            redis_now >= w.bounds(next, off).1
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let (back, cost) = (u64::from(back.min(cost)), u64::from(cost));
            let period = w.window.period_ms();
            refund_units(back, cost, at, redis_now, period, u64::from(w.limit)) == 0
        }
        Algorithm::SlidingLog => false,
    }
}
