//! Token bucket: refills continuously at `limit` tokens per window, holds at most
//! `capacity` (= limit x burst_multiplier). Lua twin: `lua/token_bucket.lua`.
//!
//! Exactness: the level is kept in token-ms units (1 token = `period_ms` units, refill =
//! `limit` units per ms), so every quantity is an integer and `retry_after` is exact to
//! the millisecond.

use super::{div_ceil, to_u32};
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

    /// The level at `now`, refilled and capped.
    fn level_at(&self, rate: u64, cap: u64, now: u64) -> u64 {
        if self.last == u64::MAX {
            return cap;
        }
        let refill = now.saturating_sub(self.last).saturating_mul(rate);
        self.level.saturating_add(refill).min(cap)
    }
}

/// One request of `cost` against the bucket at `now`.
pub fn step(b: &mut Bucket, limit: &WindowLimit, now: u64, cost: u32, commit: bool) -> Decision {
    let period = limit.window.period_ms();
    let rate = u64::from(limit.limit);
    let cap = u64::from(limit.capacity).saturating_mul(period);
    let level = b.level_at(rate, cap, now);
    let need = u64::from(cost).saturating_mul(period);
    let used_tokens = u64::from(limit.capacity) - level / period;
    let current = used_tokens + u64::from(cost);
    if level >= need {
        let left = level - need;
        if commit {
            *b = Bucket {
                level: left,
                last: now,
            };
        }
        return Decision {
            allowed: true,
            limit: limit.limit,
            remaining: to_u32(left / period).min(limit.limit),
            current,
            reset_after_ms: div_ceil(cap - left, rate),
            retry_after_ms: 0,
        };
    }
    let retry = if need > cap {
        // Never admissible (cost above capacity): point at the next full bucket.
        div_ceil(cap - level, rate).max(1)
    } else {
        div_ceil(need - level, rate)
    };
    Decision {
        allowed: false,
        limit: limit.limit,
        remaining: 0,
        current,
        reset_after_ms: div_ceil(cap - level, rate),
        retry_after_ms: retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithm::testkit::{assert_retry_exact, run_table};
    use crate::limiter::algorithm::State;
    use crate::limiter::policy::{Algorithm, Window};

    fn lim(window: Window, limit: u32, burst: f64) -> WindowLimit {
        WindowLimit::with_algorithm(window, limit, Algorithm::TokenBucket).with_burst(burst)
    }

    /// A 2/s bucket admits its capacity at once and then one token per 500 ms.
    #[test]
    fn refills_continuously() {
        run_table(
            &lim(Window::Second, 2, 1.0),
            &[
                // (now, cost, allowed, remaining, retry_after_ms)
                (1_000, 1, true, 1, 0),
                (1_000, 1, true, 0, 0),
                (1_000, 1, false, 0, 500),
                (1_499, 1, false, 0, 1),
                (1_500, 1, true, 0, 0),
                (2_500, 2, true, 0, 0),
                (2_500, 2, false, 0, 1_000),
            ],
        );
    }

    /// burst_multiplier 1.5 gives a 10/s limit a capacity of 15; remaining is clamped to 10.
    #[test]
    fn burst_multiplier_raises_capacity() {
        let l = lim(Window::Second, 10, 1.5);
        assert_eq!(l.capacity, 15);
        let mut rows = vec![(0u64, 1u32, true, 10u32, 0u64)];
        rows.extend((1..=13).map(|i| (0, 1, true, (14 - i).min(10), 0)));
        rows.push((0, 1, true, 0, 0));
        rows.push((0, 1, false, 0, 100));
        run_table(&l, &rows);
    }

    /// Cost spends several tokens; a rejected request spends none.
    #[test]
    fn cost_spends_tokens_and_rejection_spends_none() {
        run_table(
            &lim(Window::Minute, 6, 1.0),
            &[
                (0, 4, true, 2, 0),
                (0, 3, false, 0, 10_000),
                (0, 2, true, 0, 0),
                (10_000, 1, true, 0, 0),
            ],
        );
    }

    /// Reset is when the bucket is full again.
    #[test]
    fn reset_after_is_time_to_full() {
        let l = lim(Window::Minute, 60, 1.0);
        let mut s = State::initial(Algorithm::TokenBucket);
        let d = crate::limiter::algorithm::step(&mut s, &l, 5_000, 0, 3, true);
        assert_eq!(d.reset_after_ms, 3_000);
        assert_eq!(d.current, 3);
    }

    /// A request at now + retry_after is admitted, one a millisecond earlier is not.
    #[test]
    fn retry_after_is_exact() {
        for (limit, window, burst) in [
            (3, Window::Second, 1.0),
            (7, Window::Minute, 2.0),
            (1000, Window::Hour, 1.2),
        ] {
            assert_retry_exact(&lim(window, limit, burst));
        }
    }
}
