//! Sliding-window counter: the current epoch-aligned window's count plus the previous
//! window's count weighted by how much of it still overlaps the trailing window
//! (Cloudflare's "counting things" estimate). Lua twin: `lua/sliding_window.lua`.
//!
//! Trade-off: two counters per key instead of a log, at the price of assuming the
//! previous window's requests were evenly spread. It removes the fixed window's 2x
//! boundary spike; its error against the exact log is measured in the Redis issue's
//! accuracy test. Admission test, in integers: `prev x (end - now) + (curr + cost) x len
//! <= limit x len`.

use super::{bounds, div_ceil, to_u32};
use crate::limiter::decision::Decision;
use crate::limiter::policy::WindowLimit;

/// Two adjacent window counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Start of the current window (Unix ms).
    pub start: u64,
    /// Count of the window before `start`.
    pub prev: u32,
    /// Count of the window starting at `start`.
    pub curr: u32,
}

/// One request of `cost` at `now`.
pub fn step(
    c: &mut Counters,
    limit: &WindowLimit,
    now: u64,
    offset: u64,
    cost: u32,
    commit: bool,
) -> Decision {
    let (start, end) = bounds(limit.window, now, offset);
    let (prev_start, _) = bounds(limit.window, start.saturating_sub(1), offset);
    let (prev, curr) = if c.start == start {
        (c.prev, c.curr)
    } else if c.start == prev_start && start > 0 {
        (c.curr, 0)
    } else {
        (0, 0)
    };
    let len = end - start;
    let weighted = u64::from(prev).saturating_mul(end - now);
    let lim = u64::from(limit.limit);
    let after = weighted.saturating_add((u64::from(curr) + u64::from(cost)).saturating_mul(len));
    let current = div_ceil(after, len);
    let (_, next_end) = bounds(limit.window, end, offset);
    if after <= lim.saturating_mul(len) {
        if commit {
            *c = Counters {
                start,
                prev,
                curr: curr + cost,
            };
        }
        return Decision {
            allowed: true,
            limit: limit.limit,
            remaining: to_u32((lim.saturating_mul(len) - after) / len),
            current,
            reset_after_ms: next_end - now,
            retry_after_ms: 0,
        };
    }
    let retry_at = if u64::from(curr) + u64::from(cost) <= lim {
        // Admitted later in this window, once the previous window's weight has shrunk.
        let slack = (lim - u64::from(curr) - u64::from(cost)).saturating_mul(len);
        end - (slack / u64::from(prev.max(1))).min(end - now)
    } else if u64::from(cost) <= lim {
        // Admitted in the next window, once this window's weight has shrunk.
        let next_len = next_end - end;
        let slack = (lim - u64::from(cost)).saturating_mul(next_len);
        next_end - (slack / u64::from(curr.max(1))).min(next_len)
    } else {
        next_end
    };
    let reset_at = if curr > 0 {
        next_end
    } else if prev > 0 {
        end
    } else {
        now
    };
    Decision {
        allowed: false,
        limit: limit.limit,
        remaining: 0,
        current,
        reset_after_ms: reset_at - now,
        retry_after_ms: retry_at.saturating_sub(now).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithm::testkit::{admitted_between, assert_retry_exact, run_table};
    use crate::limiter::policy::{Algorithm, Window};

    fn lim(window: Window, limit: u32) -> WindowLimit {
        WindowLimit::with_algorithm(window, limit, Algorithm::SlidingWindow)
    }

    /// The previous window's count fades out linearly across the current window.
    #[test]
    fn previous_window_weight_fades() {
        run_table(
            &lim(Window::Minute, 10),
            &[
                // 10 at the end of minute 1 fill it.
                (119_000, 10, true, 0, 0),
                // At 120 000 the previous 10 weigh fully: rejected until 6 s in (weight 9/10).
                (120_000, 1, false, 0, 6_000),
                (125_999, 1, false, 0, 1),
                (126_000, 1, true, 0, 0),
                // Half way through, the previous window weighs 5: 5 - 1 already spent = 4 more.
                (150_000, 4, true, 0, 0),
                (150_000, 1, false, 0, 6_000),
            ],
        );
    }

    /// No 2x spike: the burst that a fixed window admits across a boundary is cut to 1x.
    #[test]
    fn has_no_boundary_spike() {
        let l = lim(Window::Minute, 10);
        let times: Vec<u64> = (0..10)
            .map(|i| 119_000 + i * 100)
            .chain((0..10).map(|i| 120_000 + i * 100))
            .collect();
        assert_eq!(admitted_between(&l, &times), 10);
    }

    /// Windows more than one apart forget the past entirely.
    #[test]
    fn forgets_after_two_windows() {
        run_table(
            &lim(Window::Second, 2),
            &[
                (1_000, 2, true, 0, 0),
                (1_999, 1, false, 0, 501),
                (3_000, 2, true, 0, 0),
            ],
        );
    }

    /// A request at now + retry_after is admitted, one a millisecond earlier is not.
    #[test]
    fn retry_after_is_exact() {
        for (limit, window) in [
            (3, Window::Second),
            (7, Window::Minute),
            (100, Window::Hour),
            (40, Window::Month),
        ] {
            assert_retry_exact(&lim(window, limit));
        }
    }
}
