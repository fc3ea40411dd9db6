//! The state of one window of one identity (`State`): its algorithm's state (`Algo`) and
//! a bucket's hold of leased tokens (`Hold`), with the one dispatch over the five
//! algorithms each operation goes through.

use super::{fixed_window, leaky_bucket, sliding_log, sliding_window, token_bucket, Settle};
use crate::limiter::decision::Decision;
use crate::limiter::policy::{Algorithm, WindowLimit};

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
    pub(super) fn step(
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
    pub(super) fn take(
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
    pub(super) fn give_back(
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
    pub(super) fn settle(
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

    pub(super) fn matches(&self, algorithm: Algorithm) -> bool {
        self.algo().algorithm() == algorithm
    }

    /// The algorithm's state when it holds nothing: the hot path of `step` and `settle`
    /// (dispatched in place: no allocation, no indirection).
    #[inline]
    pub(super) fn bare_mut(&mut self) -> Option<&mut Algo> {
        match &mut self.0 {
            Repr::Bare(algo) => Some(algo),
            Repr::Held(_) => None,
        }
    }

    /// Runs `f` on the algorithm's state and its hold (a scratch `Hold::NONE` when there
    /// is none): a hold that `f` started (a lease) is boxed with the state, one that is
    /// over (its units gone) is dropped with its box. The way of a held state, and of
    /// `take` and `give_back` (Redis leases only: off the memory store's path).
    pub(super) fn with_hold<R>(&mut self, f: impl FnOnce(&mut Algo, &mut Hold) -> R) -> R {
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
