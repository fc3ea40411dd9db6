//! Sliding log: the exact count of cost admitted in the trailing window `(now - len, now]`.
//! Lua twin: `lua/sliding_log.lua` (a sorted set).
//!
//! Trade-off: exact, but memory grows with the limit (one entry per admitted request),
//! so it suits small limits. `1mo` is 30 days here.

use std::collections::VecDeque;

use crate::limiter::decision::Decision;
use crate::limiter::policy::WindowLimit;

/// Admitted requests, oldest first, with their running total.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Log {
    /// `(admitted_at_ms, cost)`, oldest first.
    pub entries: VecDeque<(u64, u32)>,
    /// Sum of `cost` over `entries`.
    pub total: u64,
}

/// One request of `cost` at `now`.
pub fn step(log: &mut Log, limit: &WindowLimit, now: u64, cost: u32, commit: bool) -> Decision {
    let len = limit.window.period_ms();
    let live = |t: u64| t.saturating_add(len) > now;
    let expired: u64 = log
        .entries
        .iter()
        .take_while(|(t, _)| !live(*t))
        .map(|(_, c)| u64::from(*c))
        .sum();
    let used = log.total - expired;
    let current = used + u64::from(cost);
    let lim = u64::from(limit.limit);
    if current <= lim {
        if commit {
            while log.entries.front().is_some_and(|(t, _)| !live(*t)) {
                log.entries.pop_front();
            }
            log.entries.push_back((now, cost));
            log.total = current;
        }
        return Decision {
            allowed: true,
            limit: limit.limit,
            remaining: (lim - current) as u32,
            current,
            reset_after_ms: len,
            retry_after_ms: 0,
        };
    }
    // The oldest live entries must expire until `cost` fits again.
    let mut to_free = current - lim;
    let mut retry_at = now.saturating_add(len);
    if u64::from(cost) <= lim {
        for (t, c) in log.entries.iter().filter(|(t, _)| live(*t)) {
            if u64::from(*c) >= to_free {
                retry_at = t + len;
                break;
            }
            to_free -= u64::from(*c);
        }
    }
    let reset_at = log.entries.back().map_or(now, |(t, _)| (t + len).max(now));
    Decision {
        allowed: false,
        limit: limit.limit,
        remaining: 0,
        current,
        reset_after_ms: reset_at - now,
        retry_after_ms: (retry_at - now).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithm::testkit::{admitted_between, assert_retry_exact, run_table};
    use crate::limiter::policy::{Algorithm, Window};

    fn lim(window: Window, limit: u32) -> WindowLimit {
        WindowLimit::with_algorithm(window, limit, Algorithm::SlidingLog)
    }

    /// Each admitted request leaves the window exactly `len` after it was admitted.
    #[test]
    fn entries_expire_exactly_one_window_later() {
        run_table(
            &lim(Window::Second, 3),
            &[
                (1_000, 1, true, 2, 0),
                (1_400, 2, true, 0, 0),
                (1_500, 1, false, 0, 500),
                (1_999, 1, false, 0, 1),
                (2_000, 1, true, 0, 0),
                (2_001, 2, false, 0, 399),
                (2_400, 2, true, 0, 0),
            ],
        );
    }

    /// Exactness: in any trailing window of the limit's length, at most `limit` are admitted.
    #[test]
    fn never_exceeds_the_limit_in_any_trailing_window() {
        let l = lim(Window::Minute, 10);
        let mut rng = crate::limiter::algorithm::testkit::Rng(42);
        let mut now = 1_000_000u64;
        let mut admitted = Vec::new();
        let mut log = Log::default();
        for _ in 0..5_000 {
            now += rng.below(2_000);
            if step(&mut log, &l, now, 1, true).allowed {
                admitted.push(now);
            }
        }
        for (i, t) in admitted.iter().enumerate() {
            let in_window = admitted[..=i].iter().filter(|s| **s + 60_000 > *t).count();
            assert!(
                in_window <= 10,
                "{in_window} admitted in the minute ending {t}"
            );
        }
        // ...and it is not trivially strict: the spike test admits the full limit once.
        let times: Vec<u64> = (0..10)
            .map(|i| 119_000 + i * 100)
            .chain((0..10).map(|i| 120_000 + i * 100))
            .collect();
        assert_eq!(admitted_between(&l, &times), 10);
    }

    /// A request at now + retry_after is admitted, one a millisecond earlier is not.
    #[test]
    fn retry_after_is_exact() {
        for (limit, window) in [(3, Window::Second), (7, Window::Minute), (20, Window::Hour)] {
            assert_retry_exact(&lim(window, limit));
        }
    }
}
