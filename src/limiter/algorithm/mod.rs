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

mod calendar;
pub mod fixed_window;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

pub use self::calendar::{bounds, civil_from_days, days_from_civil};
use super::decision::Decision;
use super::policy::{Algorithm, WindowLimit};

/// The state of one window of one identity: its algorithm's state (`algo()`) and, for a
/// bucket with leases out, the hold (`hold()`).
///
/// Not a `{ algo, hold: Option<Box<Hold>> }` pair: an `Algo` is 24 bytes (16 of state
/// and its tag), so the pair would be 32. A held state boxes the algorithm's state with
/// its hold instead, and that box sits in the tag's spare values: `State` (and
/// `Option<State>`) stays 24 bytes and a state without a hold carries no allocation (the
/// log's own aside). Each operation is one dispatch over the five algorithms (`Algo`'s
/// methods), given the hold: a scratch `Hold::NONE` for a state without one (the hot
/// path, inline), the boxed one for a held state (out of line). A held state's hold is
/// never empty: the operation that ends it unboxes the state again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State(Repr);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    /// No hold: every state but a bucket with leases out.
    Bare(Algo),
    /// A bucket holding leased tokens (Redis leases only; boxed, as rare).
    Held(Box<(Algo, Hold)>),
}

/// The state of one algorithm (in `Algorithm`'s order, so `algorithm()` is the tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Algo {
    /// Token bucket: level in token-ms units.
    TokenBucket(token_bucket::Bucket),
    /// Sliding-window counter.
    SlidingWindow(sliding_window::Counters),
    /// Fixed window counter.
    FixedWindow(fixed_window::Counter),
    /// Exact log, boxed to keep `State` small.
    SlidingLog(Box<sliding_log::Log>),
    /// Leaky bucket: level in token-ms units.
    LeakyBucket(leaky_bucket::Meter),
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

// === impl Algo ===

impl Algo {
    /// A state that owns nothing, to leave behind when moving one out.
    const VOID: Algo = Algo::FixedWindow(fixed_window::Counter { start: 0, count: 0 });

    /// The algorithm this is the state of.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Algo::TokenBucket(_) => Algorithm::TokenBucket,
            Algo::LeakyBucket(_) => Algorithm::LeakyBucket,
            Algo::FixedWindow(_) => Algorithm::FixedWindow,
            Algo::SlidingWindow(_) => Algorithm::SlidingWindow,
            Algo::SlidingLog(_) => Algorithm::SlidingLog,
        }
    }

    /// `step` on this state, holding `hold` (`None`: nothing, so a bucket is given a
    /// scratch `Hold::NONE` and the counters and the log none at all).
    #[inline(always)]
    fn step(
        &mut self,
        hold: Option<&mut Hold>,
        limit: &WindowLimit,
        now: u64,
        offset: u64,
        cost: u32,
        commit: bool,
    ) -> Decision {
        match self {
            Algo::TokenBucket(b) => token_bucket::step(
                b,
                hold.unwrap_or(&mut Hold::default()),
                limit,
                now,
                cost,
                commit,
            ),
            Algo::LeakyBucket(m) => leaky_bucket::step(
                m,
                hold.unwrap_or(&mut Hold::default()),
                limit,
                now,
                cost,
                commit,
            ),
            Algo::FixedWindow(c) => fixed_window::step(c, limit, now, offset, cost, commit),
            Algo::SlidingWindow(c) => sliding_window::step(c, limit, now, offset, cost, commit),
            Algo::SlidingLog(l) => sliding_log::step(l, limit, now, cost, commit),
        }
    }

    /// `take` on this state, holding `hold`.
    fn take(
        &mut self,
        hold: &mut Hold,
        limit: &WindowLimit,
        now: u64,
        offset: u64,
        n: u64,
        until: u64,
    ) -> Lease {
        match self {
            Algo::TokenBucket(b) => token_bucket::take(b, hold, limit, now, n, until),
            Algo::LeakyBucket(m) => leaky_bucket::take(m, hold, limit, now, n, until),
            Algo::FixedWindow(c) => fixed_window::take(c, limit, now, offset, n, until),
            Algo::SlidingWindow(c) => sliding_window::take(c, limit, now, offset, n, until),
            Algo::SlidingLog(l) => sliding_log::take(l, limit, now, n, until),
        }
    }

    /// `give_back` on this state, holding `hold` (a bucket holding nothing has nothing
    /// to give back: a held state's hold is never empty).
    #[allow(clippy::too_many_arguments)]
    fn give_back(
        &mut self,
        hold: &mut Hold,
        limit: &WindowLimit,
        now: u64,
        offset: u64,
        k: u64,
        tag1: u64,
        size: u64,
    ) {
        match self {
            Algo::FixedWindow(_) | Algo::SlidingWindow(_) | Algo::SlidingLog(_) if k == 0 => {}
            Algo::FixedWindow(c) => fixed_window::give_back(c, k, tag1),
            Algo::SlidingWindow(c) => sliding_window::give_back(c, limit, offset, k, tag1),
            Algo::SlidingLog(l) => sliding_log::give_back(l, k, tag1, size),
            Algo::TokenBucket(_) | Algo::LeakyBucket(_) if hold.units == 0 => {}
            Algo::TokenBucket(b) => token_bucket::give_back(b, hold, limit, now, k, tag1, size),
            Algo::LeakyBucket(m) => leaky_bucket::give_back(m, hold, limit, now, k, tag1, size),
        }
    }

    /// `settle` on this state, holding `hold` (`None`: nothing, as for `step`).
    #[inline(always)]
    fn settle(
        &mut self,
        hold: Option<&mut Hold>,
        limit: &WindowLimit,
        now: u64,
        offset: u64,
        s: Settle,
    ) -> u64 {
        match self {
            Algo::TokenBucket(b) => {
                token_bucket::settle(b, hold.unwrap_or(&mut Hold::default()), limit, now, s)
            }
            Algo::LeakyBucket(m) => {
                leaky_bucket::settle(m, hold.unwrap_or(&mut Hold::default()), limit, now, s)
            }
            Algo::FixedWindow(c) => fixed_window::settle(c, limit, now, offset, s),
            Algo::SlidingWindow(c) => sliding_window::settle(c, limit, now, offset, s),
            Algo::SlidingLog(l) => sliding_log::settle(l, limit, now, s),
        }
    }
}

// === impl State ===

impl State {
    /// The state of an identity never seen before (or evicted after returning to it).
    pub fn initial(algorithm: Algorithm) -> State {
        State::from(match algorithm {
            Algorithm::TokenBucket => Algo::TokenBucket(token_bucket::Bucket::FULL),
            Algorithm::LeakyBucket => Algo::LeakyBucket(leaky_bucket::Meter::EMPTY),
            Algorithm::FixedWindow => Algo::FixedWindow(fixed_window::Counter::default()),
            Algorithm::SlidingWindow => Algo::SlidingWindow(sliding_window::Counters::default()),
            Algorithm::SlidingLog => Algo::SlidingLog(Box::default()),
        })
    }

    /// A copy when copying is cheap (every state but the log and a held bucket), so a
    /// dry run can compute the next state once and the charge merely store it.
    pub fn cheap_copy(&self) -> Option<State> {
        match &self.0 {
            Repr::Bare(Algo::SlidingLog(_)) | Repr::Held(_) => None,
            Repr::Bare(algo) => Some(State(Repr::Bare(algo.clone()))),
        }
    }

    /// The algorithm's state.
    pub fn algo(&self) -> &Algo {
        match &self.0 {
            Repr::Bare(algo) => algo,
            Repr::Held(x) => &x.0,
        }
    }

    /// A bucket's hold of leased tokens, if it has one.
    pub fn hold(&self) -> Option<&Hold> {
        match &self.0 {
            Repr::Bare(_) => None,
            Repr::Held(x) => Some(&x.1),
        }
    }

    /// The sliding log, if this is one.
    pub fn log(&self) -> Option<&sliding_log::Log> {
        match self.algo() {
            Algo::SlidingLog(log) => Some(log),
            _ => None,
        }
    }

    fn matches(&self, algorithm: Algorithm) -> bool {
        self.algo().algorithm() == algorithm
    }

    /// The algorithm's state when it holds nothing: the hot path of `step` and `settle`
    /// (dispatched in place: no allocation, no indirection).
    #[inline]
    fn bare_mut(&mut self) -> Option<&mut Algo> {
        match &mut self.0 {
            Repr::Bare(algo) => Some(algo),
            Repr::Held(_) => None,
        }
    }

    /// Runs `f` on the algorithm's state and its hold (a scratch `Hold::NONE` when there
    /// is none): a hold that `f` started (a lease) is boxed with the state, one that is
    /// over (its units gone) is dropped with its box. The way of a held state, and of
    /// `take` and `give_back` (Redis leases only: off the memory store's path).
    fn with_hold<R>(&mut self, f: impl FnOnce(&mut Algo, &mut Hold) -> R) -> R {
        let mut none = Hold::NONE;
        let (algo, hold) = match &mut self.0 {
            Repr::Bare(algo) => (algo, &mut none),
            Repr::Held(x) => {
                let (algo, hold) = &mut **x;
                (algo, hold)
            }
        };
        let r = f(algo, hold);
        match &mut self.0 {
            Repr::Bare(algo) if none.units != 0 => {
                let algo = std::mem::replace(algo, Algo::VOID);
                self.0 = Repr::Held(Box::new((algo, none)));
            }
            Repr::Held(x) if x.1.units == 0 => {
                let algo = std::mem::replace(&mut x.0, Algo::VOID);
                self.0 = Repr::Bare(algo);
            }
            _ => {}
        }
        r
    }
}

impl From<Algo> for State {
    /// The state, holding nothing.
    fn from(algo: Algo) -> State {
        State(Repr::Bare(algo))
    }
}

macro_rules! state_from {
    ($($ty:ty => $variant:ident),* $(,)?) => {$(
        impl From<$ty> for State {
            fn from(s: $ty) -> State {
                State::from(Algo::$variant(s))
            }
        }
    )*};
}

state_from! {
    token_bucket::Bucket => TokenBucket,
    leaky_bucket::Meter => LeakyBucket,
    fixed_window::Counter => FixedWindow,
    sliding_window::Counters => SlidingWindow,
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
