//! The five algorithms as pure step functions of (state, limit, now, cost).
//!
//! `step(state, limit, now, offset, cost, commit)` returns the `Decision` and writes the
//! next state into `state` only when `commit` is set and the request is allowed. A dry run
//! (`commit = false`) never writes, which is how the layered check evaluates every scope
//! before charging any. Each algorithm's file here has a Lua twin in `lua/` with the same
//! math.
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
//!
//! `state` holds a window's `State` and the dispatch over the algorithms, `settlement`
//! the settlement math (`Settle`, `max_debt`, `settled`), `calendar` the window bounds.

mod calendar;
pub mod fixed_window;
pub mod leaky_bucket;
mod settlement;
pub mod sliding_log;
pub mod sliding_window;
mod state;
pub mod token_bucket;

pub use self::calendar::{
    bounds, bounds_in, civil_from_days, days_from_civil, edges, Calendar, CalendarError,
};
pub use self::settlement::{accepted_delta, debt_ceiling, max_debt, settled, Settle};
pub(crate) use self::settlement::{add_debt, counter_top, refund_units};
pub(crate) use self::state::hold_end;
pub use self::state::{Algo, Hold, Lease, State};
use super::decision::Decision;
use super::policy::WindowLimit;

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
    match state.bare_mut() {
        Some(algo) => algo.step(None, limit, now_ms, offset_ms, cost, commit),
        None => step_held(state, limit, now_ms, offset_ms, cost, commit),
    }
}

/// `step` on a held state: out of line, so the hot path (nothing held) stays a plain
/// dispatch.
#[cold]
#[inline(never)]
fn step_held(
    state: &mut State,
    limit: &WindowLimit,
    now: u64,
    offset: u64,
    cost: u32,
    commit: bool,
) -> Decision {
    state.with_hold(|algo, hold| algo.step(Some(hold), limit, now, offset, cost, commit))
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
    state.with_hold(|algo, hold| algo.take(hold, limit, now_ms, offset_ms, n, until_ms))
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
    state.with_hold(|algo, hold| {
        algo.give_back(hold, limit, now_ms, offset_ms, k, tag1, size);
    });
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
    match state.bare_mut() {
        Some(algo) => algo.settle(None, limit, now_ms, offset_ms, s),
        None => settle_held(state, limit, now_ms, offset_ms, s),
    }
}

/// `settle` on a held state, out of line (see `step_held`).
#[cold]
#[inline(never)]
fn settle_held(state: &mut State, limit: &WindowLimit, now: u64, offset: u64, s: Settle) -> u64 {
    state.with_hold(|algo, hold| algo.settle(Some(hold), limit, now, offset, s))
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
mod tests;
