//! Fixed window: a counter per epoch-aligned window (the calendar month in UTC for `1mo`),
//! optionally shifted by a per-key offset. Lua twin: `lua/fixed_window.lua`.
//!
//! Trade-off: cheapest state (one counter), but a client can spend a full limit just
//! before a boundary and another just after it: up to 2x the limit within one window's
//! length (the test `admits_twice_the_limit_across_a_boundary` shows it).
//!
//! Leases: `take` adds the leased tokens to the window's count and ends the lease with
//! the window, so every leased token is spent in the window that was charged for it.
//! `give_back` subtracts unused tokens while that window lasts; after it, nothing (its
//! tokens went with it).
//!
//! Settling: a debt is added to the window current at the settle, past the limit if need
//! be but to at most 2 x limit (rejected until the window ends); a refund comes off the
//! window the request was charged in, only while it is current. See `settle`.

use super::{add_debt, counter_top, to_u32, Lease, Settle};
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
    let (start, end) = limit.bounds(now, offset);
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

/// Leases up to `n` tokens at `now` (never more than the window has left), until `until`
/// or the window's end if sooner. Tags: the window's start, 0.
pub fn take(
    c: &mut Counter,
    limit: &WindowLimit,
    now: u64,
    offset: u64,
    n: u64,
    until: u64,
) -> Lease {
    let (start, end) = limit.bounds(now, offset);
    let count = if c.start == start { c.count } else { 0 };
    let granted = n.min(u64::from(limit.limit.saturating_sub(count)));
    if granted == 0 {
        return Lease::default();
    }
    *c = Counter {
        start,
        count: count + to_u32(granted),
    };
    Lease {
        granted,
        until: until.min(end),
        tag1: start,
        tag2: 0,
    }
}

/// Gives `k` unused tokens of the lease taken in the window starting at `tag1` back, if
/// the state is still that window's.
pub fn give_back(c: &mut Counter, k: u64, tag1: u64) {
    if c.start == tag1 {
        c.count = c.count.saturating_sub(to_u32(k));
    }
}

/// Settles a request at `now`; answers the debt accepted (0 for a refund).
///
/// Debt: added to the current window's count (a replay charges it there too), past the
/// limit if need be but to at most 2 x limit (`counter_top`: in debt by at most the
/// limit; a count already above stays): `step` rejects until the window ends, at the
/// latest one window length after the settlement, and `remaining` never underflows.
///
/// Refund: the request was charged in the window containing its `at`. While that window
/// is current, the replay's count is this count less the refund, so giving it back is
/// exact. Once it is over, no later window holds the request's charge: nothing.
pub fn settle(c: &mut Counter, limit: &WindowLimit, now: u64, offset: u64, s: Settle) -> u64 {
    let (start, _) = limit.bounds(now, offset);
    let count = if c.start == start { c.count } else { 0 };
    match s {
        Settle::Debt(d) => {
            let raised = add_debt(u64::from(count), d, counter_top(limit));
            *c = Counter {
                start,
                count: to_u32(raised),
            };
            raised - u64::from(count)
        }
        Settle::Refund { back, at, .. } => {
            if c.start == start && limit.bounds(at, offset).0 == start {
                c.count = count.saturating_sub(to_u32(back));
            }
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithm::testkit::{
        admitted_between, assert_exact_at, assert_leases_safe, assert_retry_exact,
        assert_settles_safe, run_table,
    };
    use crate::limiter::algorithm::{self as alg, bounds, days_from_civil, Algo, Lease, State};
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

    fn count(s: &State) -> (u64, u32) {
        match s.algo() {
            Algo::FixedWindow(c) => (c.start, c.count),
            other => panic!("{other:?}"),
        }
    }

    /// A lease adds to the window's count and ends with the window at the latest; unused
    /// tokens come back while the window lasts, and are gone with it.
    #[test]
    fn lease_is_counted_in_its_window() {
        let l = lim(Window::Minute, 10);
        let mut s = State::initial(Algorithm::FixedWindow);
        assert!(alg::step(&mut s, &l, 60_500, 0, 1, true).allowed);
        let lease = alg::take(&mut s, &l, 60_500, 0, 4, 75_500);
        let want = Lease {
            granted: 4,
            until: 75_500,
            tag1: 60_000,
            tag2: 0,
        };
        assert_eq!(lease, want);
        assert_eq!(count(&s), (60_000, 5));
        assert_eq!(alg::step(&mut s, &l, 61_000, 0, 1, true).remaining, 4);
        // (give back at, tokens, count after)
        alg::give_back(&mut s, &l, 70_000, 0, 3, lease.tag1, 0, 4);
        assert_eq!(count(&s), (60_000, 3));
        // Near the end, a lease ends with the window.
        let late = alg::take(&mut s, &l, 119_000, 0, 5, 134_000);
        assert_eq!((late.granted, late.until), (5, 120_000));
        // Never more than the window has left (2 here).
        assert_eq!(alg::take(&mut s, &l, 119_500, 0, 5, 134_000).granted, 2);
        assert_eq!(
            alg::take(&mut s, &l, 119_500, 0, 5, 134_000),
            Lease::default()
        );
        // The next window: the previous one's leftovers are gone with it.
        assert!(alg::step(&mut s, &l, 120_100, 0, 1, true).allowed);
        alg::give_back(&mut s, &l, 120_200, 0, 5, late.tag1, 0, 5);
        assert_eq!(count(&s), (120_000, 1));
    }

    /// Random requests and leases: a replay of what was admitted admits it all, no fixed
    /// window admits more than the limit, and `retry_after` stays exact.
    #[test]
    fn leases_never_admit_more_than_a_replay() {
        for (limit, window, offset) in [
            (20, Window::Second, 0),
            (100, Window::Minute, 7_000),
            (30, Window::Month, 3 * 86_400_000),
        ] {
            let l = lim(window, limit);
            for run in assert_leases_safe(&l, offset) {
                let mut per_window = std::collections::HashMap::new();
                for (t, c) in run.admitted {
                    *per_window
                        .entry(bounds(window, t, offset).0)
                        .or_insert(0u64) += u64::from(c);
                }
                assert!(per_window.values().all(|n| *n <= u64::from(limit)));
            }
        }
    }

    /// A debt lifts the current window's count past the limit: rejected until the
    /// window ends, exactly.
    #[test]
    fn debt_waits_for_the_window_end() {
        let l = lim(Window::Minute, 10);
        let mut s = State::initial(Algorithm::FixedWindow);
        assert!(alg::step(&mut s, &l, 60_500, 0, 4, true).allowed);
        alg::settle(&mut s, &l, 61_000, 0, 4, 10, 60_500); // true cost 14
        assert_eq!(count(&s), (60_000, 14));
        let d = assert_exact_at(&s, &l, 61_000, 1);
        assert_eq!((d.retry_after_ms, d.current), (59_000, 15));
        // Settled in a later window: charged to the window current then.
        alg::settle(&mut s, &l, 125_000, 0, 4, 3, 60_500);
        assert_eq!(count(&s), (120_000, 3));
        // A huge debt stops at 2 x limit, and another adds nothing.
        assert_eq!(
            alg::settle(&mut s, &l, 125_000, 0, 1, i64::MAX, 125_000),
            17
        );
        assert_eq!(alg::settle(&mut s, &l, 125_000, 0, 1, i64::MAX, 125_000), 0);
        assert_eq!(count(&s), (120_000, 20));
        assert_eq!(assert_exact_at(&s, &l, 125_000, 1).retry_after_ms, 55_000);
    }

    /// A settlement leaves the count at most 2 x limit (in debt by at most the limit),
    /// whatever the debt: the window admits again at its end, within one window length.
    /// `per_minute = 5` after `x-usage-tokens: 999999999`: a count of 10 (it was about
    /// 10^9), admitted again at the next minute.
    #[test]
    fn debt_is_bounded_by_the_limit() {
        let day = 86_400_000u64;
        let feb = days_from_civil(2026, 2, 1) as u64 * day;
        let mar = days_from_civil(2026, 3, 1) as u64 * day;
        let rows: [DebtRow; 5] = [
            (Window::Minute, 5, 0, 61_000, 1, 999_999_999, 9, 11, 59_000),
            (
                Window::Second,
                1000,
                0,
                1_500,
                500,
                999_999_999,
                1_500,
                2_001,
                500,
            ),
            (
                Window::Month,
                30,
                0,
                feb + 5,
                10,
                i64::MAX,
                50,
                61,
                mar - feb - 5,
            ),
            (
                Window::Day,
                10,
                1_000,
                day + 1_010,
                1,
                100,
                19,
                21,
                day - 10,
            ),
            // Within the bound: all of it.
            (Window::Minute, 10, 0, 61_000, 4, 10, 10, 15, 59_000),
        ];
        for (i, row) in rows.into_iter().enumerate() {
            assert_debt_row(i, row);
        }
    }

    /// (window, limit, offset, admitted (and settled) at, reserved cost, delta, accepted,
    /// then for a unit request: current, retry_after)
    type DebtRow = (Window, u32, u64, u64, u32, i64, u64, u64, u64);

    /// One row of `debt_is_bounded_by_the_limit`.
    fn assert_debt_row(i: usize, row: DebtRow) {
        let (window, limit, offset, at, cost, delta, accepted, current, retry) = row;
        let l = lim(window, limit).with_jitter_ms(offset + 1);
        let mut s = State::initial(Algorithm::FixedWindow);
        assert!(
            alg::step(&mut s, &l, at, offset, cost, true).allowed,
            "row {i}"
        );
        assert_eq!(
            alg::settle(&mut s, &l, at, offset, cost, delta, at),
            accepted,
            "row {i}"
        );
        let d = alg::step(&mut s.clone(), &l, at, offset, 1, false);
        assert_eq!(
            (d.allowed, d.current, d.retry_after_ms),
            (false, current, retry),
            "row {i}: {d:?}"
        );
        let end = at + retry;
        assert!(alg::step(&mut s.clone(), &l, end, offset, 1, false).allowed);
        assert!(!alg::step(&mut s.clone(), &l, end - 1, offset, 1, false).allowed);
        // Stacked: a count at its bound takes no more.
        let more = alg::settle(&mut s, &l, at, offset, cost, delta, at);
        let left = if accepted < delta.unsigned_abs() {
            0
        } else {
            6
        };
        assert_eq!(more, left, "row {i}");
        assert_eq!(count(&s).1, 2 * limit, "row {i}");
    }

    /// A count already above the bound (a state from before it) is not lowered.
    #[test]
    fn debt_past_the_bound_is_not_lowered() {
        let l = lim(Window::Minute, 10);
        let mut s = State::from(Counter {
            start: 60_000,
            count: 500,
        });
        assert_eq!(alg::settle(&mut s, &l, 61_000, 0, 1, 5, 61_000), 0);
        assert_eq!(count(&s), (60_000, 500));
    }

    /// A refund restores exactly the replay while the request's window is current;
    /// after it, nothing (the next window never held the request's charge).
    #[test]
    fn refund_restores_the_replay_in_its_window() {
        let l = lim(Window::Minute, 10);
        let mut s = State::initial(Algorithm::FixedWindow);
        assert!(alg::step(&mut s, &l, 60_500, 0, 4, true).allowed);
        assert!(alg::step(&mut s, &l, 61_000, 0, 5, true).allowed);
        alg::settle(&mut s, &l, 70_000, 0, 4, -3, 60_500); // true cost 1
        let mut r = State::initial(Algorithm::FixedWindow);
        assert!(alg::step(&mut r, &l, 60_500, 0, 1, true).allowed);
        assert!(alg::step(&mut r, &l, 61_000, 0, 5, true).allowed);
        assert_eq!(s, r);
        // Admitted at the end of one window, settled in the next: nothing.
        assert!(alg::step(&mut s, &l, 119_000, 0, 4, true).allowed);
        assert!(alg::step(&mut s, &l, 120_100, 0, 2, true).allowed);
        alg::settle(&mut s, &l, 120_500, 0, 4, -4, 119_000);
        assert_eq!(count(&s), (120_000, 2));
    }

    /// Random requests settled at random times, both ways: a replay with the true costs
    /// (debts as forced charges when settled) admits every admitted request, and
    /// `retry_after` stays exact throughout.
    #[test]
    fn settles_never_admit_more_than_a_replay() {
        for (limit, window, offset) in [
            (20, Window::Second, 0),
            (100, Window::Minute, 7_000),
            (30, Window::Month, 3 * 86_400_000),
        ] {
            assert_settles_safe(&lim(window, limit), offset);
        }
    }
}
