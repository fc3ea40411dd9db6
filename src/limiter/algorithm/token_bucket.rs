//! Token bucket: refills continuously at `limit` tokens per window, holds at most
//! `capacity` (= limit x burst_multiplier). Lua twin: `lua/token_bucket.lua`.
//!
//! Exactness: the level is kept in token-ms units (1 token = `period_ms` units, refill =
//! `limit` units per ms), so every quantity is an integer and `retry_after` is exact to
//! the millisecond.
//!
//! Leases: `take` spends the leased tokens at once and adds them to the bucket's `Hold`:
//! until the hold ends the bucket refills to at most `capacity - held`, as if every held
//! token had been spent at once, so a lease used late can't have its refill counted
//! twice (a plain early charge would let a full bucket refill during the lease, and the
//! lease's tokens then come on top of a full bucket). `give_back` returns unused tokens
//! to the level and releases them from the hold while the hold lasts; later, nothing.
//!
//! Settling: a debt may take the bucket below empty, to at most `limit` tokens below
//! (the capacity may be larger: `burst_multiplier`). Levels are unsigned, so a negative
//! level `-x` at `now` is kept as an empty bucket at `last = now + ceil(x / rate)` in
//! the future (rounded up: at most a millisecond's refill more is charged), at most one
//! period ahead. There is no refill before `last`, so no request is admitted until then,
//! `retry_after_ms` and `reset_after_ms` count the wait from `now` to `last`, and `current`
//! counts the debt: a bucket owing `D` tokens answers `capacity + D + cost`
//! (`used_tokens`). A refund raises the level by what `refund_units` allows (the replay
//! may have been full and wasted refill since the request), at most to the capacity
//! less any hold; see `settle`.

use super::{div_ceil, hold_end, refund_units, to_u32, Hold, Lease, Settle};
use crate::limiter::decision::Decision;
use crate::limiter::policy::WindowLimit;

/// Bucket state. `last = u64::MAX` marks a bucket never touched (full).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Tokens x period_ms at `last`.
    pub level: u64,
    /// When `level` was computed (Unix ms).
    pub last: u64,
}

// === impl Bucket ===

impl Bucket {
    /// A bucket that has never been used: full.
    pub const FULL: Bucket = Bucket {
        level: 0,
        last: u64::MAX,
    };

    /// The level at `now` (never before `last`), refilled and capped (at `cap - held`
    /// while the hold lasts), the hold still in force then, and that time.
    fn level_at(&self, hold: Hold, rate: u64, cap: u64, now: u64) -> (u64, Hold, u64) {
        if self.last == u64::MAX {
            return (cap, Hold::NONE, now);
        }
        let t = now.max(self.last);
        let grow =
            |level: u64, from: u64, to: u64| level.saturating_add((to - from).saturating_mul(rate));
        if hold.units == 0 {
            return (grow(self.level, self.last, t).min(cap), Hold::NONE, t);
        }
        let held_cap = cap.saturating_sub(hold.units);
        if t < hold.until {
            return (grow(self.level, self.last, t).min(held_cap), hold, t);
        }
        let mid = hold.until.max(self.last);
        let at_end = grow(self.level, self.last, mid).min(held_cap);
        (grow(at_end, mid, t).min(cap), Hold::NONE, t)
    }

    /// The level at `now` as a signed number (negative while a debt is paid off: `last`
    /// in the future, refilling linearly up to it), and the hold in force at `now`.
    fn signed_level(&self, hold: Hold, rate: u64, cap: u64, now: u64) -> (i128, Hold) {
        if self.last == u64::MAX {
            return (i128::from(cap), Hold::NONE);
        }
        if self.last > now {
            let owed = i128::from(self.last - now) * i128::from(rate);
            let h = if hold.units > 0 && now < hold.until {
                hold
            } else {
                Hold::NONE
            };
            return (i128::from(self.level) - owed, h);
        }
        let (level, h, _) = self.level_at(hold, rate, cap, now);
        (i128::from(level), h)
    }

    /// The bucket at signed `level` at `now`: below 0, empty until the debt is paid off.
    fn from_signed(level: i128, rate: u64, now: u64) -> Bucket {
        match u64::try_from(level) {
            Ok(level) => Bucket { level, last: now },
            Err(_) => {
                let owed = u64::try_from(level.unsigned_abs()).unwrap_or(u64::MAX);
                Bucket {
                    level: 0,
                    last: now.saturating_add(div_ceil(owed, rate)).min(u64::MAX - 1),
                }
            }
        }
    }
}

/// The tokens a bucket of `capacity` has used at a decision: `level` units at `last`,
/// `owed` units of refill still to come before `last` (a debt: `(last - now) x rate`).
/// Counted up to a whole token (a partial token used counts as used), so a bucket `x`
/// units below empty has used `capacity + ceil(x / period)`. `lua/token_bucket.lua`
/// `tb_used` is the twin.
fn used_tokens(capacity: u32, level: u64, owed: u64, period: u64) -> u64 {
    let capacity = u64::from(capacity);
    if level >= owed {
        capacity.saturating_sub((level - owed) / period)
    } else {
        capacity.saturating_add(div_ceil(owed - level, period))
    }
}

/// Ms from `now` until a bucket at `level` (with `hold`) holds `target` (<= cap) units.
fn time_to(level: u64, hold: Hold, rate: u64, cap: u64, now: u64, target: u64) -> u64 {
    if level >= target {
        return 0;
    }
    let held_cap = cap.saturating_sub(hold.units);
    if hold.units == 0 || now >= hold.until || target <= held_cap {
        return div_ceil(target - level, rate);
    }
    // Capped below the target until the hold ends.
    let d = hold.until - now;
    let at_end = level.saturating_add(d.saturating_mul(rate)).min(held_cap);
    d + div_ceil(target - at_end, rate)
}

/// One request of `cost` against the bucket (holding `hold`) at `now`.
pub fn step(
    b: &mut Bucket,
    hold: &mut Hold,
    limit: &WindowLimit,
    now: u64,
    cost: u32,
    commit: bool,
) -> Decision {
    let period = limit.window.period_ms();
    let rate = u64::from(limit.limit);
    let cap = u64::from(limit.capacity).saturating_mul(period);
    let (level, h, at) = b.level_at(*hold, rate, cap, now);
    // A bucket in debt is empty until `at` (in the future): no refill before it.
    let wait = at - now;
    let need = u64::from(cost).saturating_mul(period);
    let current = used_tokens(limit.capacity, level, wait.saturating_mul(rate), period)
        .saturating_add(u64::from(cost));
    if level >= need {
        let left = level - need;
        if commit {
            *b = Bucket {
                level: left,
                last: now,
            };
            *hold = h;
        }
        return Decision {
            allowed: true,
            limit: limit.limit,
            remaining: to_u32(left / period).min(limit.limit),
            current,
            reset_after_ms: time_to(left, h, rate, cap, now, cap),
            retry_after_ms: 0,
        };
    }
    let retry = if need > cap {
        // Never admissible (cost above capacity): point at the next full bucket.
        (wait + time_to(level, h, rate, cap, at, cap)).max(1)
    } else {
        wait + time_to(level, h, rate, cap, at, need)
    };
    Decision {
        allowed: false,
        limit: limit.limit,
        remaining: 0,
        current,
        reset_after_ms: wait + time_to(level, h, rate, cap, at, cap),
        retry_after_ms: retry,
    }
}

/// Leases up to `n` tokens at `now` until `until`: spends them (never more than the
/// level holds) and holds them until `hold_end`. Tags: the hold's end for this lease, 0.
pub fn take(
    b: &mut Bucket,
    hold: &mut Hold,
    limit: &WindowLimit,
    now: u64,
    n: u64,
    until: u64,
) -> Lease {
    let period = limit.window.period_ms();
    let rate = u64::from(limit.limit);
    let cap = u64::from(limit.capacity).saturating_mul(period);
    let (level, h, at) = b.level_at(*hold, rate, cap, now);
    let granted = n.min(level / period);
    if granted == 0 {
        return Lease::default();
    }
    let units = granted * period;
    let end = hold_end(now, until);
    *b = Bucket {
        level: level - units,
        last: at,
    };
    *hold = h.add(units, end);
    Lease {
        granted,
        until,
        tag1: end,
        tag2: 0,
    }
}

/// Ends a lease of `size` at `now`, `k` of its tokens unused, while its hold (ending at
/// `tag1`) lasts: the unused tokens return to the level and the whole lease leaves the
/// hold (its used tokens were spent by now; holding them longer would only shrink the
/// bucket under sustained traffic). Later: nothing.
pub fn give_back(
    b: &mut Bucket,
    hold: &mut Hold,
    limit: &WindowLimit,
    now: u64,
    k: u64,
    tag1: u64,
    size: u64,
) {
    let period = limit.window.period_ms();
    let rate = u64::from(limit.limit);
    let cap = u64::from(limit.capacity).saturating_mul(period);
    if now >= tag1 {
        return;
    }
    // Signed: a bucket in debt (settle) pays it off with the tokens given back.
    let (level, h) = b.signed_level(*hold, rate, cap, now);
    if h.units == 0 {
        return;
    }
    let back = k.min(size).saturating_mul(period).min(h.units);
    let release = size.saturating_mul(period).min(h.units);
    *b = Bucket::from_signed(level + i128::from(back), rate, now);
    *hold = h.sub(release);
}

/// Settles a request on the bucket (holding `hold`) at `now`; answers the debt accepted
/// in tokens, rounded up (0 for a refund).
///
/// Debt: the level drops by the debt, below 0 if need be (an empty bucket until the
/// debt is paid off, see the module docs), never below `-limit` tokens (`max_debt`: in
/// debt by at most the limit, whatever the capacity; a bucket already below stays). So
/// it is empty for at most one period (plus the ms rounding) and admits `cost` within
/// `(limit + cost) / rate` of the settlement. A replay charges the same debt at the same
/// time (its own bound stops it at the same level): it stays at least as full.
///
/// Refund: the level rises by `refund_units` (all of it when the request settles
/// before its true cost's worth of refill; less after, down to nothing once the
/// reserved cost's worth has refilled), at most to the capacity less the hold. Why it
/// never admits more than the replay: see `refund_units`. A bucket in debt pays it off
/// first (the signed level).
pub fn settle(b: &mut Bucket, hold: &mut Hold, limit: &WindowLimit, now: u64, s: Settle) -> u64 {
    if b.last == u64::MAX && matches!(s, Settle::Refund { .. }) {
        return 0; // a full bucket: nothing to give back to
    }
    let period = limit.window.period_ms();
    let rate = u64::from(limit.limit);
    let cap = u64::from(limit.capacity).saturating_mul(period);
    let (level, h) = b.signed_level(*hold, rate, cap, now);
    let (next, accepted) = match s {
        Settle::Debt(d) => {
            let floor = -i128::from(super::max_debt(limit).saturating_mul(period));
            if level <= floor {
                return 0;
            }
            let units = i128::from(d.saturating_mul(period)).min(level - floor);
            let tokens = div_ceil(u64::try_from(units).unwrap_or(u64::MAX), period);
            (level - units, tokens)
        }
        Settle::Refund { back, cost, at } => {
            let units = refund_units(back, cost, at, now, period, rate);
            let top = i128::from(cap.saturating_sub(h.units));
            if units == 0 || level >= top {
                return 0;
            }
            ((level + i128::from(units)).min(top), 0)
        }
    };
    *b = Bucket::from_signed(next, rate, now);
    *hold = h;
    accepted
}

#[cfg(test)]
mod tests;
