//! Leaky bucket as a meter: each request pours `cost` in, the bucket drains at `limit`
//! per window, and a request that would overflow `limit` is rejected (never queued).
//! Lua twin: `lua/leaky_bucket.lua`. Same integer token-ms units as the token bucket.

use super::{div_ceil, to_u32};
use crate::limiter::decision::Decision;
use crate::limiter::policy::WindowLimit;

/// Meter state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meter {
    /// Water x period_ms at `last`.
    pub level: u64,
    /// When `level` was computed (Unix ms).
    pub last: u64,
}

// === impl Meter ===

impl Meter {
    /// An empty meter.
    pub const EMPTY: Meter = Meter { level: 0, last: 0 };
}

/// One request of `cost` against the meter at `now`.
pub fn step(m: &mut Meter, limit: &WindowLimit, now: u64, cost: u32, commit: bool) -> Decision {
    let period = limit.window.period_ms();
    let rate = u64::from(limit.limit);
    let cap = rate.saturating_mul(period);
    let drained = now.saturating_sub(m.last).saturating_mul(rate);
    let level = m.level.saturating_sub(drained);
    let need = u64::from(cost).saturating_mul(period);
    let current = div_ceil(level, period) + u64::from(cost);
    if level.saturating_add(need) <= cap {
        let next = level + need;
        if commit {
            *m = Meter {
                level: next,
                last: now,
            };
        }
        return Decision {
            allowed: true,
            limit: limit.limit,
            remaining: to_u32((cap - next) / period),
            current,
            reset_after_ms: div_ceil(next, rate),
            retry_after_ms: 0,
        };
    }
    let retry = if need > cap {
        div_ceil(level, rate).max(1)
    } else {
        div_ceil(level + need - cap, rate)
    };
    Decision {
        allowed: false,
        limit: limit.limit,
        remaining: 0,
        current,
        reset_after_ms: div_ceil(level, rate),
        retry_after_ms: retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithm::testkit::{assert_retry_exact, run_table};
    use crate::limiter::policy::{Algorithm, Window};

    fn lim(window: Window, limit: u32) -> WindowLimit {
        WindowLimit::with_algorithm(window, limit, Algorithm::LeakyBucket)
    }

    /// The meter fills to its limit and drains one unit per limit-th of the window.
    #[test]
    fn rejects_when_full_and_drains_steadily() {
        run_table(
            &lim(Window::Second, 4),
            &[
                (10_000, 1, true, 3, 0),
                (10_000, 3, true, 0, 0),
                (10_000, 1, false, 0, 250),
                (10_249, 1, false, 0, 1),
                (10_250, 1, true, 0, 0),
                (11_250, 4, true, 0, 0),
                (11_250, 2, false, 0, 500),
            ],
        );
    }

    /// Burst multiplier does not apply: capacity is the limit.
    #[test]
    fn ignores_burst_multiplier() {
        assert_eq!(lim(Window::Second, 4).with_burst(2.0).capacity, 4);
    }

    /// A request at now + retry_after is admitted, one a millisecond earlier is not.
    #[test]
    fn retry_after_is_exact() {
        for (limit, window) in [(3, Window::Second), (7, Window::Minute), (500, Window::Day)] {
            assert_retry_exact(&lim(window, limit));
        }
    }
}
