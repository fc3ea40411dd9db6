//! The five algorithms as pure step functions of (state, limit, now, cost).
//!
//! `step(state, limit, now, offset, cost, commit)` returns the `Decision` and writes the
//! next state into `state` only when `commit` is set and the request is allowed. A dry run
//! (`commit = false`) never writes, which is how the layered check evaluates every scope
//! before charging any. Each file here has a Lua twin in `lua/` with the same math.
//!
//! All arithmetic is integer milliseconds, so `retry_after` is exact: a request at
//! `now + retry_after` is admitted and one a millisecond earlier is not. Config validation
//! bounds `limit x window_ms` (capacity for the token bucket) by 2^52, so every product
//! fits a u64 here and a Lua double in Redis; operations saturate all the same.
//!
//! Leases (Redis only: `lua/check.lua`): after an admitted request, `take` charges `n`
//! more tokens at once for a gateway to admit later requests locally until the lease's
//! `until`; `give_back` returns unused ones. Safety rule: after any sequence of requests,
//! takes and give-backs, a state never admits more than an exact replay of the requests
//! actually admitted (lease tokens used at any time before `until`) would. Each algorithm
//! documents how it keeps that rule; the `leases_never_admit_more_than_a_replay` tests
//! check it on random sequences.

pub mod fixed_window;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use super::decision::Decision;
use super::policy::{Algorithm, Window, WindowLimit};

/// The state of one window of one identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Token bucket: level in token-ms units.
    TokenBucket(token_bucket::Bucket),
    /// Leaky bucket: level in token-ms units.
    LeakyBucket(leaky_bucket::Meter),
    /// Fixed window counter.
    FixedWindow(fixed_window::Counter),
    /// Sliding-window counter.
    SlidingWindow(sliding_window::Counters),
    /// Exact log, boxed to keep `State` small.
    SlidingLog(Box<sliding_log::Log>),
    /// Token bucket holding leased tokens back (Redis leases only; boxed, as rare).
    TokenBucketHeld(Box<(token_bucket::Bucket, Hold)>),
    /// Leaky bucket holding leased tokens in (Redis leases only; boxed, as rare).
    LeakyBucketHeld(Box<(leaky_bucket::Meter, Hold)>),
}

/// Leased tokens a bucket holds, in token-ms units, until `until` (Unix ms): a token
/// bucket refills to at most `capacity - units`, a leaky bucket drains to no less than
/// `units`. Charging a lease at once is not enough for a bucket: a capped bucket would
/// refill (a meter drain) through time in which the replay, its tokens not yet spent,
/// was full (empty) and wasted that refill (drain). The hold keeps the bucket where the
/// replay would be if every held token were spent at once. It lasts the lease plus as
/// long again, so leftovers given back just after a lease ends still count; later ones
/// are forfeited. Several leases share one hold (sum of tokens, latest end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hold {
    /// Tokens held x period_ms (0: none).
    pub units: u64,
    /// When the hold ends (Unix ms).
    pub until: u64,
}

/// A lease taken by `take`: `granted` tokens charged at once, usable until `until`; the
/// tags identify it for `give_back` (algorithm-specific; see each algorithm's `take`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lease {
    /// Tokens leased (0: none).
    pub granted: u64,
    /// When the lease ends (Unix ms).
    pub until: u64,
    /// First tag.
    pub tag1: u64,
    /// Second tag.
    pub tag2: u64,
}

// === impl Hold ===

impl Hold {
    /// No hold.
    pub const NONE: Hold = Hold { units: 0, until: 0 };

    /// A hold increased by `units` until at least `until`.
    pub(crate) fn add(self, units: u64, until: u64) -> Hold {
        Hold {
            units: self.units.saturating_add(units),
            until: self.until.max(until),
        }
    }

    /// A hold decreased by `units` (gone at 0).
    pub(crate) fn sub(self, units: u64) -> Hold {
        match self.units.saturating_sub(units) {
            0 => Hold::NONE,
            units => Hold { units, ..self },
        }
    }
}

/// When a bucket's hold of a lease ending at `until`, taken at `now`, ends: the lease
/// plus as long again (the grace for giving leftovers back).
pub(crate) fn hold_end(now: u64, until: u64) -> u64 {
    until.saturating_add(until.saturating_sub(now))
}

// === impl State ===

impl State {
    /// The state of an identity never seen before (or evicted after returning to it).
    pub fn initial(algorithm: Algorithm) -> State {
        match algorithm {
            Algorithm::TokenBucket => State::TokenBucket(token_bucket::Bucket::FULL),
            Algorithm::LeakyBucket => State::LeakyBucket(leaky_bucket::Meter::EMPTY),
            Algorithm::FixedWindow => State::FixedWindow(fixed_window::Counter::default()),
            Algorithm::SlidingWindow => State::SlidingWindow(sliding_window::Counters::default()),
            Algorithm::SlidingLog => State::SlidingLog(Box::default()),
        }
    }

    /// A copy when copying is cheap (every state but the log), so a dry run can compute
    /// the next state once and the charge merely store it.
    pub fn cheap_copy(&self) -> Option<State> {
        match self {
            State::SlidingLog(_) | State::TokenBucketHeld(_) | State::LeakyBucketHeld(_) => None,
            other => Some(other.clone()),
        }
    }

    fn matches(&self, algorithm: Algorithm) -> bool {
        matches!(
            (self, algorithm),
            (
                State::TokenBucket(_) | State::TokenBucketHeld(_),
                Algorithm::TokenBucket
            ) | (
                State::LeakyBucket(_) | State::LeakyBucketHeld(_),
                Algorithm::LeakyBucket
            ) | (State::FixedWindow(_), Algorithm::FixedWindow)
                | (State::SlidingWindow(_), Algorithm::SlidingWindow)
                | (State::SlidingLog(_), Algorithm::SlidingLog)
        )
    }

    /// A bucket's held variant (so a lease can add a hold).
    fn unsettle(&mut self) {
        match self {
            State::TokenBucket(b) => *self = State::TokenBucketHeld(Box::new((*b, Hold::NONE))),
            State::LeakyBucket(m) => *self = State::LeakyBucketHeld(Box::new((*m, Hold::NONE))),
            _ => {}
        }
    }

    /// A held bucket whose hold is over back to its plain variant.
    fn drop_empty_hold(&mut self) {
        match self {
            State::TokenBucketHeld(x) if x.1.units == 0 => *self = State::TokenBucket(x.0),
            State::LeakyBucketHeld(x) if x.1.units == 0 => *self = State::LeakyBucket(x.0),
            _ => {}
        }
    }
}

/// Applies `limit`'s algorithm to `state` at `now_ms` for a request of `cost`.
///
/// `offset_ms` shifts window boundaries (reset jitter, `< limit.jitter_ms`). A state of the
/// wrong variant (the algorithm changed on reload) is treated as initial.
pub fn step(
    state: &mut State,
    limit: &WindowLimit,
    now_ms: u64,
    offset_ms: u64,
    cost: u32,
    commit: bool,
) -> Decision {
    if !state.matches(limit.algorithm) {
        *state = State::initial(limit.algorithm);
    }
    let cost = cost.max(1);
    let d = match state {
        State::TokenBucket(b) => {
            token_bucket::step(b, &mut Hold::default(), limit, now_ms, cost, commit)
        }
        State::LeakyBucket(m) => {
            leaky_bucket::step(m, &mut Hold::default(), limit, now_ms, cost, commit)
        }
        State::FixedWindow(c) => fixed_window::step(c, limit, now_ms, offset_ms, cost, commit),
        State::SlidingWindow(c) => sliding_window::step(c, limit, now_ms, offset_ms, cost, commit),
        State::SlidingLog(l) => sliding_log::step(l, limit, now_ms, cost, commit),
        State::TokenBucketHeld(x) => {
            let (b, h) = &mut **x;
            token_bucket::step(b, h, limit, now_ms, cost, commit)
        }
        State::LeakyBucketHeld(x) => {
            let (m, h) = &mut **x;
            leaky_bucket::step(m, h, limit, now_ms, cost, commit)
        }
    };
    state.drop_empty_hold();
    d
}

/// Leases up to `n` tokens of `limit`'s window at `now_ms`, usable until `until_ms`:
/// charges them at once and returns what was granted (clamped so the state stays
/// admissible: never more than what remains). `lua/check.lua` calls it right after an
/// admitted request's write, with `n = lease_size(..)` and `until = now + lease_len(..)`.
pub fn take(
    state: &mut State,
    limit: &WindowLimit,
    now_ms: u64,
    offset_ms: u64,
    n: u64,
    until_ms: u64,
) -> Lease {
    if !state.matches(limit.algorithm) {
        *state = State::initial(limit.algorithm);
    }
    if n == 0 || until_ms <= now_ms {
        return Lease::default();
    }
    state.unsettle();
    let lease = match state {
        State::FixedWindow(c) => fixed_window::take(c, limit, now_ms, offset_ms, n, until_ms),
        State::SlidingWindow(c) => sliding_window::take(c, limit, now_ms, offset_ms, n, until_ms),
        State::SlidingLog(l) => sliding_log::take(l, limit, now_ms, n, until_ms),
        State::TokenBucketHeld(x) => {
            let (b, h) = &mut **x;
            token_bucket::take(b, h, limit, now_ms, n, until_ms)
        }
        State::LeakyBucketHeld(x) => {
            let (m, h) = &mut **x;
            leaky_bucket::take(m, h, limit, now_ms, n, until_ms)
        }
        State::TokenBucket(_) | State::LeakyBucket(_) => Lease::default(), // unsettled above
    };
    state.drop_empty_hold();
    lease
}

/// Ends an earlier lease at `now_ms`, giving `k` unused tokens back (0: all were used);
/// `tag1`, `tag2` as `take` answered them (`tag2` only names the Lua log member: the Rust
/// log finds the entry by time and size), `size` its `granted` (0: no lease). A bucket's
/// hold of the lease is released. What can no longer be given back safely (the window or
/// the hold is over) is forfeited. A state of the wrong variant is left alone.
#[allow(clippy::too_many_arguments)]
pub fn give_back(
    state: &mut State,
    limit: &WindowLimit,
    now_ms: u64,
    offset_ms: u64,
    k: u64,
    tag1: u64,
    _tag2: u64,
    size: u64,
) {
    if !state.matches(limit.algorithm) || size == 0 {
        return;
    }
    match state {
        State::FixedWindow(_) | State::SlidingWindow(_) | State::SlidingLog(_) if k == 0 => {}
        State::FixedWindow(c) => fixed_window::give_back(c, k, tag1),
        State::SlidingWindow(c) => sliding_window::give_back(c, limit, offset_ms, k, tag1),
        State::SlidingLog(l) => sliding_log::give_back(l, k, tag1, size),
        State::TokenBucketHeld(x) => {
            let (b, h) = &mut **x;
            token_bucket::give_back(b, h, limit, now_ms, k, tag1, size);
        }
        State::LeakyBucketHeld(x) => {
            let (m, h) = &mut **x;
            leaky_bucket::give_back(m, h, limit, now_ms, k, tag1, size);
        }
        // Nothing held: nothing to give back.
        State::TokenBucket(_) | State::LeakyBucket(_) => {}
    }
    state.drop_empty_hold();
}

/// Settles a request admitted at `admitted_at_ms` with the reserved `cost` on this
/// window, at `now_ms`, once its true cost (`cost + delta`) is known: `delta > 0`
/// charges the debt at `now_ms`, past the limit if need be but bounded: a settlement
/// leaves the window in debt by at most its limit (`max_debt`; each algorithm documents
/// what it caps), and the rest of the debt is forgiven; `delta < 0` refunds what the
/// algorithm can refund safely (see the module docs). `lua/check.lua`'s 'settle' mode
/// is the twin. A state of the wrong variant is reset for a debt, left alone for a refund.
///
/// Answers the debt the window accepted, in tokens (0 for a refund): what a replay of the
/// true costs charges. A bucket stopped at its bound part-way through a token answers
/// that token (rounded up; the replay's own bound stops it at the same level).
#[allow(clippy::too_many_arguments)]
pub fn settle(
    state: &mut State,
    limit: &WindowLimit,
    now_ms: u64,
    offset_ms: u64,
    cost: u32,
    delta: i64,
    admitted_at_ms: u64,
) -> u64 {
    if delta == 0 {
        return 0;
    }
    if !state.matches(limit.algorithm) {
        if delta < 0 {
            return 0;
        }
        *state = State::initial(limit.algorithm);
    }
    let s = Settle::new(limit, cost, delta, admitted_at_ms);
    let accepted = match state {
        State::TokenBucket(b) => token_bucket::settle(b, &mut Hold::default(), limit, now_ms, s),
        State::LeakyBucket(m) => leaky_bucket::settle(m, &mut Hold::default(), limit, now_ms, s),
        State::FixedWindow(c) => fixed_window::settle(c, limit, now_ms, offset_ms, s),
        State::SlidingWindow(c) => sliding_window::settle(c, limit, now_ms, offset_ms, s),
        State::SlidingLog(l) => sliding_log::settle(l, limit, now_ms, s),
        State::TokenBucketHeld(x) => {
            let (b, h) = &mut **x;
            token_bucket::settle(b, h, limit, now_ms, s)
        }
        State::LeakyBucketHeld(x) => {
            let (m, h) = &mut **x;
            leaky_bucket::settle(m, h, limit, now_ms, s)
        }
    };
    state.drop_empty_hold();
    accepted
}

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

/// Tokens to lease after an admitted request, as `lua/check.lua` sizes them: what was
/// wanted, at most half of what remains, none below 2.
pub fn lease_size(want: u64, remaining_after: u32) -> u64 {
    let n = want.min(u64::from(remaining_after) / 2);
    if n < 2 {
        0
    } else {
        n
    }
}

/// A window's lease length, as `lua/check.lua` computes it: the configured longest lease,
/// at most a quarter of the period (0: no lease).
pub fn lease_len(lease_ms: u64, period_ms: u64) -> u64 {
    lease_ms.min(period_ms / 4)
}

/// The `[start, end)` of the epoch-aligned window containing `now_ms`, shifted by `offset_ms`.
/// `Month` is the calendar month in UTC.
pub fn bounds(window: Window, now_ms: u64, offset_ms: u64) -> (u64, u64) {
    let t = now_ms.saturating_sub(offset_ms);
    let (start, end) = match window {
        Window::Month => month_bounds(t),
        w => {
            let p = w.period_ms();
            let start = t - t % p;
            (start, start + p)
        }
    };
    (start + offset_ms, end + offset_ms)
}

const DAY_MS: u64 = 86_400_000;

fn month_bounds(t: u64) -> (u64, u64) {
    let (y, m, _) = civil_from_days((t / DAY_MS) as i64);
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let start = days_from_civil(y, m, 1).max(0) as u64 * DAY_MS;
    let end = days_from_civil(ny, nm, 1).max(0) as u64 * DAY_MS;
    (start, end)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The (year, month, day) of a day count since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The largest `limit x window_ms` accepted: with headroom for sums, exact in a double (Lua).
pub const MAX_EXACT_PRODUCT: u64 = 1 << 52;

/// `ceil(a / b)`; `b = 0` counts as 1.
pub(crate) fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

/// Saturating narrowing for values that fit by construction.
pub(crate) fn to_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
pub(crate) mod testkit;

#[cfg(test)]
mod tests {
    use super::*;

    /// Month windows follow the calendar, including leap years and year ends.
    #[test]
    fn month_bounds_follow_the_calendar() {
        let ms = |y, m, d| days_from_civil(y, m, d) as u64 * DAY_MS;
        let cases = [
            (ms(2024, 2, 10), ms(2024, 2, 1), ms(2024, 3, 1)), // leap February: 29 days
            (ms(2025, 2, 28) + 5, ms(2025, 2, 1), ms(2025, 3, 1)),
            (
                ms(2026, 12, 31) + DAY_MS - 1,
                ms(2026, 12, 1),
                ms(2027, 1, 1),
            ),
            (ms(2027, 1, 1), ms(2027, 1, 1), ms(2027, 2, 1)),
        ];
        for (i, (now, start, end)) in cases.into_iter().enumerate() {
            assert_eq!(bounds(Window::Month, now, 0), (start, end), "case {i}");
        }
        assert_eq!(ms(2024, 3, 1) - ms(2024, 2, 1), 29 * DAY_MS);
        assert_eq!(
            civil_from_days(days_from_civil(2026, 11, 29)),
            (2026, 11, 29)
        );
    }

    /// Fixed-length windows align to the epoch; an offset shifts both edges.
    #[test]
    fn bounds_align_to_epoch_and_shift_by_offset() {
        assert_eq!(bounds(Window::Minute, 125_000, 0), (120_000, 180_000));
        assert_eq!(bounds(Window::Day, DAY_MS + 10, 0), (DAY_MS, 2 * DAY_MS));
        assert_eq!(bounds(Window::Day, DAY_MS + 10, 20), (20, DAY_MS + 20));
        assert_eq!(
            bounds(Window::Day, DAY_MS + 30, 20),
            (DAY_MS + 20, 2 * DAY_MS + 20)
        );
    }

    /// Lease sizing mirrors check.lua: min(want, remaining / 2), none below 2; length
    /// min(lease_ms, period / 4).
    #[test]
    fn lease_size_and_len_mirror_check_lua() {
        // (want, remaining after the request, tokens)
        for (want, remaining, n) in [
            (10, 100, 10),
            (10, 9, 4),
            (10, 4, 2),
            (10, 3, 0),
            (1, 100, 0),
            (0, 100, 0),
        ] {
            assert_eq!(
                lease_size(want, remaining),
                n,
                "want {want}, remaining {remaining}"
            );
        }
        assert_eq!(lease_len(1_000, 1_000), 250);
        assert_eq!(lease_len(1_000, 60_000), 1_000);
        assert_eq!(lease_len(0, 60_000), 0);
    }

    /// `settled`: the window as the response's headers show it right after the
    /// settlement, at the admission's instant, per algorithm.
    #[test]
    fn settled_shows_the_window_after_the_settlement() {
        const T: u64 = 10_000;
        const HUGE: i64 = 999_999_999;
        let w = |window, limit, algorithm| WindowLimit::with_algorithm(window, limit, algorithm);
        let tb = w(Window::Second, 10, Algorithm::TokenBucket);
        let burst = tb.with_burst(1.5);
        let lb = w(Window::Second, 10, Algorithm::LeakyBucket);
        let fw = w(Window::Minute, 10, Algorithm::FixedWindow);
        let sw = w(Window::Minute, 10, Algorithm::SlidingWindow);
        let sl = w(Window::Second, 5, Algorithm::SlidingLog);
        // (limit, earlier admissions (at, cost), admitted at, cost, delta, then:
        // accepted, remaining, current, reset_after_ms)
        type Row = (
            WindowLimit,
            &'static [(u64, u32)],
            u64,
            u32,
            i64,
            i64,
            u32,
            u64,
            u64,
        );
        let rows: [Row; 22] = [
            // 10/s: cost 2 leaves 8, full again in 200 ms.
            (tb, &[], T, 2, 3, 3, 5, 5, 500),
            (tb, &[], T, 2, HUGE, 18, 0, 20, 2_000), // 10 below empty: 1 s + 1 s
            (tb, &[], T, 2, -1, -1, 9, 1, 100),
            (tb, &[], T, 2, -2, -2, 10, 0, 0),
            // Capacity 15: 13 left (10 shown); a debt of 4 leaves 9, not 6.
            (burst, &[], T, 2, 4, 4, 9, 6, 600),
            (burst, &[], T, 2, HUGE, 23, 0, 25, 2_500),
            // A meter: 2 in, empty in 200 ms.
            (lb, &[], T, 2, 3, 3, 5, 5, 500),
            (lb, &[], T, 2, HUGE, 18, 0, 20, 2_000), // at 20: 2 s to drain
            (lb, &[], T, 2, -2, -2, 10, 0, 0),
            // A minute's count: the reset is the window's end, whatever is settled.
            (fw, &[], 61_000, 4, 3, 3, 3, 7, 59_000),
            (fw, &[], 61_000, 4, HUGE, 16, 0, 20, 59_000),
            (fw, &[], 61_000, 4, -4, -4, 10, 0, 59_000),
            (fw, &[(60_500, 5)], 61_000, 4, 30, 11, 0, 20, 59_000),
            // Half way through a minute after a full one (weighing 5), cost 1: 6 of 10;
            // the reset is the next window's end.
            (sw, &[(59_000, 10)], 90_000, 1, 2, 2, 2, 8, 90_000),
            (sw, &[(59_000, 10)], 90_000, 1, HUGE, 14, 0, 20, 90_000),
            (sw, &[(59_000, 10)], 90_000, 1, -1, -1, 5, 5, 90_000),
            (sw, &[], 60_000, 1, HUGE, 19, 0, 20, 120_000),
            // A log of 5/s: 1 at 1 000, cost 2 at 1 100: 3; the debt's entry leaves at
            // 2 100, with the request's.
            (sl, &[(1_000, 1)], 1_100, 2, 1, 1, 1, 4, 1_000),
            (sl, &[(1_000, 1)], 1_100, 2, HUGE, 7, 0, 10, 1_000),
            (sl, &[(1_000, 1)], 1_100, 2, -2, -2, 4, 1, 1_000),
            // Nothing to settle: as admitted.
            (tb, &[], T, 2, 0, 0, 8, 2, 200),
            (sl, &[(1_000, 1)], 1_100, 2, 0, 0, 2, 3, 1_000),
        ];
        for (i, (l, before, at, cost, delta, accepted, remaining, current, reset)) in
            rows.into_iter().enumerate()
        {
            let mut s = State::initial(l.algorithm);
            for &(t, c) in before {
                assert!(step(&mut s, &l, t, 0, c, true).allowed, "row {i}");
            }
            let d = step(&mut s, &l, at, 0, cost, true);
            assert!(d.allowed, "row {i}");
            assert_eq!(accepted_delta(&d, &l, delta), accepted, "row {i}");
            let got = settled(&d, &l, delta);
            let want = Decision {
                remaining,
                current,
                reset_after_ms: reset,
                ..d
            };
            assert_eq!(got, want, "row {i}: admitted with {d:?}");
            // The state settled at the same instant shows the same (a unit request, dry).
            settle(&mut s, &l, at, 0, cost, delta, at);
            let next = step(&mut s.clone(), &l, at, 0, 1, false);
            assert_eq!(next.current, current + 1, "row {i}: {next:?}");
            let left = if next.allowed { next.remaining + 1 } else { 0 };
            assert_eq!(left.min(l.limit), remaining, "row {i}: {next:?}");
        }
        // A rejected request was not charged: nothing settles.
        let mut s = State::initial(Algorithm::FixedWindow);
        assert!(step(&mut s, &fw, 61_000, 0, 10, true).allowed);
        let d = step(&mut s, &fw, 61_000, 0, 1, true);
        assert!(!d.allowed);
        assert_eq!((settled(&d, &fw, 5), accepted_delta(&d, &fw, 5)), (d, 0));
    }

    /// `settled` against the algorithms: random traffic, each admitted request settled
    /// at once by a random delta (refunds, debts, debts far past the bound) on a copy of
    /// the state; what a unit request (dry) then sees agrees with `settled` exactly for
    /// the counters and the log, and for the buckets to the ms (the decision does not
    /// carry the level's fraction of a token).
    #[test]
    fn settled_agrees_with_the_settled_state() {
        let cases = [
            WindowLimit::with_algorithm(Window::Second, 10, Algorithm::TokenBucket),
            WindowLimit::with_algorithm(Window::Minute, 7, Algorithm::TokenBucket).with_burst(2.0),
            WindowLimit::with_algorithm(Window::Second, 3_000, Algorithm::TokenBucket),
            WindowLimit::with_algorithm(Window::Second, 10, Algorithm::LeakyBucket),
            WindowLimit::with_algorithm(Window::Hour, 7, Algorithm::LeakyBucket),
            WindowLimit::with_algorithm(Window::Minute, 10, Algorithm::FixedWindow),
            WindowLimit::with_algorithm(Window::Month, 30, Algorithm::FixedWindow),
            WindowLimit::with_algorithm(Window::Minute, 10, Algorithm::SlidingWindow),
            WindowLimit::with_algorithm(Window::Month, 30, Algorithm::SlidingWindow),
            WindowLimit::with_algorithm(Window::Second, 6, Algorithm::SlidingLog),
            WindowLimit::with_algorithm(Window::Minute, 20, Algorithm::SlidingLog),
        ];
        let mut worst = [0u64; 2];
        for (n, l) in cases.into_iter().enumerate() {
            let mut rng = testkit::Rng(0x5E7 + n as u64);
            let period = l.window.period_ms();
            let lim = u64::from(l.limit);
            let max_cost = lim.min(4).max(lim / 200);
            let mut state = State::initial(l.algorithm);
            let mut now = 1_764_000_000_000 + rng.below(period);
            let mut checked = 0;
            for _ in 0..3_000 {
                now += rng.below(period * max_cost * 2 / lim + 1);
                let cost = 1 + rng.below(max_cost) as u32;
                let d = step(&mut state, &l, now, 0, cost, true);
                if !d.allowed {
                    now += d.retry_after_ms; // admitted then: every step settles one
                    continue;
                }
                let c = i64::from(cost);
                let delta = match rng.below(5) {
                    0 => -(rng.below(u64::from(cost) + 1) as i64),
                    1 => 999_999_999,
                    2 => (lim + rng.below(2 * lim + 2)) as i64,
                    _ => rng.below(2 * u64::from(cost) + 2) as i64 - c / 2,
                };
                let mut after = state.clone();
                let took = settle(&mut after, &l, now, 0, cost, delta, now);
                let got = settled(&d, &l, delta);
                let ctx = || format!("{l:?} at {now}: {d:?} {delta} -> {got:?} {after:?}");
                let accepted = accepted_delta(&d, &l, delta);
                if delta > 0 {
                    // The state takes the whole tokens, a bucket perhaps a fraction more.
                    assert!(took.abs_diff(accepted as u64) <= 1, "{}", ctx());
                }
                let next = step(&mut after.clone(), &l, now, 0, 1, false);
                let left = if next.allowed { next.remaining + 1 } else { 0 };
                assert_eq!(left.min(l.limit), got.remaining, "{}", ctx());
                let bucket = matches!(l.algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket);
                // The true reset: a bucket's time to full (empty), from a never admissible
                // request; the others' from the unit request.
                let reset = if bucket {
                    let never = l.capacity + 1;
                    step(&mut after.clone(), &l, now, 0, never, false).reset_after_ms
                } else {
                    next.reset_after_ms
                };
                if bucket {
                    worst[0] = worst[0].max(got.current.abs_diff(next.current - 1));
                    worst[1] = worst[1].max(got.reset_after_ms.abs_diff(reset));
                    // A bucket below empty is kept to the ms (a ms's refill more; at 3000/s
                    // that is 3 tokens), and counts a fraction of a token as one.
                    let ms = div_ceil(lim, period);
                    assert!(
                        got.current.abs_diff(next.current - 1) <= ms + 1,
                        "{}",
                        ctx()
                    );
                    assert!(got.reset_after_ms.abs_diff(reset) <= 1, "{} {reset}", ctx());
                } else {
                    assert_eq!(got.current, next.current - 1, "{}", ctx());
                    let sliding_rejected = l.algorithm == Algorithm::SlidingWindow && !next.allowed;
                    if l.algorithm == Algorithm::SlidingLog && delta < 0 {
                        assert!(got.reset_after_ms >= reset, "{} {reset}", ctx());
                    } else if !sliding_rejected {
                        assert_eq!(got.reset_after_ms, reset, "{}", ctx());
                    }
                }
                checked += 1;
                // Keep the settled state now and then, so traffic meets debts.
                if rng.below(4) == 0 {
                    state = after;
                }
            }
            if std::env::var_os("LEASE_STATS").is_some() {
                eprintln!("{l:?}: {checked} checked");
            }
            assert!(checked > 1_000, "{l:?}: {checked}");
        }
        if std::env::var_os("LEASE_STATS").is_some() {
            eprintln!(
                "buckets: current off by at most {}, reset by {} ms",
                worst[0], worst[1]
            );
        }
    }

    /// Holds live in their own boxed variants: a state costs what it did before leases.
    #[test]
    fn holds_keep_state_small() {
        assert!(std::mem::size_of::<State>() <= 24);
        let l = WindowLimit::with_algorithm(Window::Second, 100, Algorithm::TokenBucket);
        let mut s = State::initial(Algorithm::TokenBucket);
        assert!(step(&mut s, &l, 1_000, 0, 1, true).allowed);
        assert_eq!(take(&mut s, &l, 1_000, 0, 10, 1_250).granted, 10);
        assert!(matches!(s, State::TokenBucketHeld(_)));
        assert!(s.cheap_copy().is_none());
        // Once the hold is over, the next charge stores the plain bucket again.
        assert!(step(&mut s, &l, 1_500, 0, 1, true).allowed);
        assert!(matches!(s, State::TokenBucket(_)));
    }
}
