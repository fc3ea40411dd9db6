//! Fixed window: a counter per epoch-aligned window (the calendar month in UTC for `1mo`),
//! optionally shifted by a per-key offset. Lua twin: `lua/fixed_window.lua`.
//!
//! Trade-off: cheapest state (one counter), but a client can spend a full limit just
//! before a boundary and another just after it: up to 2x the limit within one window's
//! length (the test `admits_twice_the_limit_across_a_boundary` shows it).

use super::bounds;
use crate::limiter::decision::Decision;
use crate::limiter::policy::WindowLimit;

/// Counter state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counter {
    /// Start of the window `count` belongs to (Unix ms).
    pub start: u64,
    /// Cost admitted in that window.
    pub count: u32,
}

/// One request of `cost` at `now`.
pub fn step(
    c: &mut Counter,
    limit: &WindowLimit,
    now: u64,
    offset: u64,
    cost: u32,
    commit: bool,
) -> Decision {
    let (start, end) = bounds(limit.window, now, offset);
    let count = if c.start == start { c.count } else { 0 };
    let current = u64::from(count) + u64::from(cost);
    let reset_after_ms = end - now;
    if current <= u64::from(limit.limit) {
        if commit {
            *c = Counter {
                start,
                count: count + cost,
            };
        }
        return Decision {
            allowed: true,
            limit: limit.limit,
            remaining: limit.limit - count - cost,
            current,
            reset_after_ms,
            retry_after_ms: 0,
        };
    }
    Decision {
        allowed: false,
        limit: limit.limit,
        remaining: 0,
        current,
        reset_after_ms,
        retry_after_ms: reset_after_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithm::testkit::{admitted_between, assert_retry_exact, run_table};
    use crate::limiter::algorithm::{days_from_civil, State};
    use crate::limiter::policy::{Algorithm, Window};

    fn lim(window: Window, limit: u32) -> WindowLimit {
        WindowLimit::with_algorithm(window, limit, Algorithm::FixedWindow)
    }

    /// The counter resets exactly at the epoch-aligned boundary.
    #[test]
    fn resets_at_epoch_aligned_boundary() {
        run_table(
            &lim(Window::Minute, 2),
            &[
                (60_500, 1, true, 1, 0),
                (61_000, 1, true, 0, 0),
                (119_999, 1, false, 0, 1),
                (120_000, 2, true, 0, 0),
                (120_001, 1, false, 0, 59_999),
            ],
        );
    }

    /// 2x spike: a full limit at the end of one window and another at the start of the next.
    #[test]
    fn admits_twice_the_limit_across_a_boundary() {
        let l = lim(Window::Minute, 10);
        // 10 requests in the last second of a minute, 10 in the first second of the next:
        // 20 admitted within 2 s although the limit is 10 per minute.
        let times: Vec<u64> = (0..10)
            .map(|i| 119_000 + i * 100)
            .chain((0..10).map(|i| 120_000 + i * 100))
            .collect();
        assert_eq!(admitted_between(&l, &times), 20);
    }

    /// `1mo` is the calendar month: the counter survives to the 1st, 00:00 UTC.
    #[test]
    fn month_is_the_calendar_month() {
        let day = 86_400_000u64;
        let feb = days_from_civil(2026, 2, 1) as u64 * day;
        let mar = days_from_civil(2026, 3, 1) as u64 * day;
        let l = lim(Window::Month, 1);
        let mut s = State::initial(Algorithm::FixedWindow);
        let first = crate::limiter::algorithm::step(&mut s, &l, feb + 5, 0, 1, true);
        assert!(first.allowed);
        assert_eq!(first.reset_after_ms, mar - feb - 5);
        let d = crate::limiter::algorithm::step(&mut s, &l, mar - 1, 0, 1, true);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 1));
        assert!(crate::limiter::algorithm::step(&mut s, &l, mar, 0, 1, true).allowed);
    }

    /// A per-key offset moves the reset away from midnight.
    #[test]
    fn offset_shifts_the_reset() {
        let l = lim(Window::Day, 1).with_jitter_ms(3_600_000);
        let mut s = State::initial(Algorithm::FixedWindow);
        let day = 86_400_000u64;
        assert!(crate::limiter::algorithm::step(&mut s, &l, day + 1_010, 1_000, 1, true).allowed);
        let d = crate::limiter::algorithm::step(&mut s, &l, 2 * day + 10, 1_000, 1, true);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 990));
    }

    /// A request at now + retry_after is admitted, one a millisecond earlier is not.
    #[test]
    fn retry_after_is_exact() {
        for (limit, window) in [
            (3, Window::Second),
            (7, Window::Minute),
            (50, Window::Month),
        ] {
            assert_retry_exact(&lim(window, limit));
        }
    }
}
