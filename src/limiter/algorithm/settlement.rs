//! Settlement math: a request's reserved cost corrected by its true cost, as a debt
//! bounded by `max_debt` or a refund of what can be given back safely, and what the
//! window shows right after (`settled`).

use super::{div_ceil, to_u32};
use crate::limiter::decision::Decision;
use crate::limiter::policy::{Algorithm, WindowLimit};

/// One settle of one window, normalized: a debt or a refund, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Charge up to this many tokens more, at once (at most `debt_ceiling`: no window
    /// accepts more; each algorithm bounds it further by `max_debt`).
    Debt(u64),
    /// Give back up to `back` tokens of a request admitted at `at` with reserved cost
    /// `cost` (so its true cost is `cost - back`).
    Refund {
        /// Tokens to give back (`<= cost`).
        back: u64,
        /// The reserved cost.
        cost: u64,
        /// When the request was admitted (store clock, Unix ms).
        at: u64,
    },
}

impl Settle {
    /// `delta` (non-zero) for a request of reserved `cost` admitted at `at`.
    pub fn new(limit: &WindowLimit, cost: u32, delta: i64, at: u64) -> Settle {
        let cost = u64::from(cost.max(1));
        if delta > 0 {
            Settle::Debt(delta.unsigned_abs().min(debt_ceiling(limit)))
        } else {
            Settle::Refund {
                back: delta.unsigned_abs().min(cost),
                cost,
                at,
            }
        }
    }
}

/// The most tokens a settlement may leave a window in debt: its limit (the contract in
/// `DESIGN.md`, "Promises at the seams"), so the window is usable again within about one
/// window length of the settlement. Per algorithm, after a debt (what is already there
/// is never lowered):
/// - `fixed_window`: the count is at most 2 x limit (usable again at the next window);
/// - `sliding_window`: the weighted count the next request sees, `prev x (end - now) /
///   len + curr`, is at most 2 x limit (`curr` is capped; usable again within 1.5 window
///   lengths plus `len / (2 x limit)`, see `sliding_window::settle`);
/// - `sliding_log`: the live total is at most 2 x limit (the debt entry is cut to fit;
///   usable again one period after the settlement);
/// - `token_bucket`: the level is at least `-limit` tokens (usable again for `cost`
///   within `(limit + cost) / rate`: one period plus the cost's refill);
/// - `leaky_bucket`: the level is at most capacity + limit (the same recovery).
///
/// `lua/prelude.lua` `max_debt` is the twin.
pub fn max_debt(limit: &WindowLimit) -> u64 {
    u64::from(limit.limit)
}

/// More debt than any window accepts (a full token bucket's capacity plus `max_debt`
/// below empty; every other window at most 2 x limit): `Settle::new` cuts a delta to it,
/// so the Lua products stay exact whatever the upstream reported.
pub fn debt_ceiling(limit: &WindowLimit) -> u64 {
    max_debt(limit) + u64::from(limit.capacity.max(limit.limit))
}

/// `count` raised by a debt of `d`, to at most `top`; a count already at or above `top`
/// stays (a settlement never lowers what is there). Same as `add_debt` in
/// `lua/prelude.lua` (written so every sum stays exact in a double).
pub(crate) fn add_debt(count: u64, d: u64, top: u64) -> u64 {
    if count >= top {
        return count;
    }
    count + d.min(top - count)
}

/// A counter's bound after a debt: twice the limit (in debt by at most the limit),
/// within a `u32`.
pub(crate) fn counter_top(limit: &WindowLimit) -> u64 {
    (2 * u64::from(limit.limit)).min(u64::from(u32::MAX))
}

/// The part of a settlement's `delta` (true cost - reserved cost) that the window a
/// request was admitted on with `d` takes, settled at the instant of `d`: a debt cut to
/// the window's bound (`max_debt`), a refund to what the request's count holds. Whole
/// tokens (a bucket stopped at its bound part-way through a token takes that fraction
/// too; see `settled`). A rejected `d` (nothing charged) takes nothing.
pub fn accepted_delta(d: &Decision, limit: &WindowLimit, delta: i64) -> i64 {
    if !d.allowed || delta == 0 {
        return 0;
    }
    if delta < 0 {
        let back = delta.unsigned_abs().min(d.current);
        return -i64::try_from(back).unwrap_or(i64::MAX);
    }
    let room = debt_room(d, limit);
    i64::try_from(delta.unsigned_abs().min(room)).unwrap_or(i64::MAX)
}

/// The debt (tokens) the window of an admitted `d` takes at the instant of `d`.
fn debt_room(d: &Decision, limit: &WindowLimit) -> u64 {
    let lim = u64::from(limit.limit);
    match limit.algorithm {
        // `current` = capacity - floor(left / period): left / period + limit tokens.
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            (u64::from(limit.capacity) + lim).saturating_sub(d.current)
        }
        // The count (sliding counter: the weighted count, `current` rounded up) to 2 x
        // limit.
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
            counter_top(limit).saturating_sub(d.current)
        }
    }
}

/// What the window a request was admitted on with `d` (its `remaining`,
/// `reset_after_ms` and `current` at admission) shows right after the request's
/// settlement by `delta` (true cost - reserved cost) at that same instant, for the
/// response's headers. The delta applied is `accepted_delta` (a debt cut to the window's
/// bound). `remaining` goes down by the debt (up by the refund), within `0..=limit`;
/// `current` (used + debt) moves with it; `reset_after_ms` moves as the algorithm moves
/// it:
/// - `token_bucket`: the time to full grows by `debt x period / limit` ms (rounded up;
///   at the bound, exactly one period more than an empty bucket's refill), shrinks by
///   the refund's (rounded down);
/// - `leaky_bucket`: likewise the time to empty (at the bound, `(capacity + limit) /
///   rate`);
/// - `fixed_window`: unchanged (the window's end);
/// - `sliding_window`: unchanged (`step` answers an admitted request the end of the next
///   window, when both counts have faded; a debt adds to the current count, which fades
///   then too);
/// - `sliding_log`: a debt's entry, at the settlement, leaves one period after it (the
///   request's own entry, at the same instant, already did); a refund leaves it
///   unchanged (later than the truth when the request's entry was the newest and goes).
///
/// Exact for counters and the log; for buckets to the ms or so (`d` does not carry the
/// level's fraction of a token), and a bucket's hold (Redis leases) is not seen. A
/// rejected `d` or a zero delta: `d` unchanged.
pub fn settled(d: &Decision, limit: &WindowLimit, delta: i64) -> Decision {
    let asked = delta;
    let delta = accepted_delta(d, limit, asked);
    if delta == 0 {
        return *d;
    }
    let lim = u64::from(limit.limit);
    let period = limit.window.period_ms();
    let moved = delta.unsigned_abs();
    let bucket = matches!(
        limit.algorithm,
        Algorithm::TokenBucket | Algorithm::LeakyBucket
    );
    let current = if delta > 0 {
        d.current.saturating_add(moved)
    } else {
        d.current - moved
    };
    // Tokens left before the clamp at `limit`: a token bucket may hold more (burst).
    let left = if limit.algorithm == Algorithm::TokenBucket {
        u64::from(limit.capacity).saturating_sub(d.current)
    } else {
        u64::from(d.remaining)
    };
    let remaining = if delta > 0 {
        left.saturating_sub(moved)
    } else {
        left.saturating_add(moved)
    };
    let reset_after_ms = if bucket && asked > delta {
        // Cut at the bound: a token bucket `limit` below empty (then its capacity to
        // refill), a meter at capacity + limit (to drain), exactly.
        div_ceil(
            (u64::from(limit.capacity) + lim).saturating_mul(period),
            lim,
        )
    } else if bucket && delta > 0 {
        let more = div_ceil(moved.saturating_mul(period), lim);
        d.reset_after_ms.saturating_add(more)
    } else if bucket {
        let less = moved.saturating_mul(period) / lim.max(1);
        d.reset_after_ms.saturating_sub(less)
    } else if limit.algorithm == Algorithm::SlidingLog && delta > 0 {
        d.reset_after_ms.max(period)
    } else {
        d.reset_after_ms
    };
    Decision {
        remaining: to_u32(remaining.min(lim)),
        current,
        reset_after_ms,
        ..*d
    }
}

/// The units (tokens x period_ms) a bucket may give back for a refund of `back` of a
/// request of reserved `cost` admitted at `at`, at `now`, refilling (token bucket) or
/// draining (leaky bucket) `rate` units per ms.
///
/// Why not all of `back`: the replay (the request cost its true `c = cost - back`) may
/// have reached the bucket's cap (token: full; leaky: empty) since `at` and wasted
/// refill (drain) that our bucket, `back` tokens lower (fuller), still counts. The
/// replay's distance to its cap right after the request was at least `c` tokens (it
/// had room for the request), and only refill (drain) shrinks that distance: requests,
/// debts, lease takes (which move the hold with the level) and give-backs never do. So
/// the replay wasted at most `elapsed x rate - c x period`, and giving back `back x
/// period` less that never lifts our bucket above the replay's.
pub(crate) fn refund_units(back: u64, cost: u64, at: u64, now: u64, period: u64, rate: u64) -> u64 {
    let c = (cost - back).saturating_mul(period);
    let wasted = now
        .saturating_sub(at)
        .saturating_mul(rate)
        .saturating_sub(c);
    back.saturating_mul(period).saturating_sub(wasted)
}
