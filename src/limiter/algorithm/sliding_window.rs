//! Sliding-window counter: the current epoch-aligned window's count plus the previous
//! window's count weighted by how much of it still overlaps the trailing window
//! (Cloudflare's "counting things" estimate). Lua twin: `lua/sliding_window.lua`.
//!
//! Trade-off: two counters per key instead of a log, at the price of assuming the
//! previous window's requests were evenly spread. It removes the fixed window's 2x
//! boundary spike; its error against the exact log is measured in the Redis issue's
//! accuracy test. Admission test, in integers: `prev x (end - now) + (curr + cost) x len
//! <= limit x len`.
//!
//! Leases: `take` adds the leased tokens to the current window's count and ends the
//! lease with that window: a token used in a later window than the one charged for it
//! would be weighted as if spent earlier, and the trailing window could exceed what the
//! replay allows. `give_back` subtracts unused tokens from the window charged for them:
//! `curr` while the state is still that window's, `prev` once it moved to the next one,
//! nothing later (the weight of that window is gone).
//!
//! Settling: a debt is added to the current window's count, to at most a weighted count
//! of 2 x limit; a refund comes off the count of the window the request was charged in
//! (`curr` or `prev`). See `settle`.

use super::{add_debt, counter_top, div_ceil, to_u32, Lease, Settle};
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
    let (start, end) = limit.bounds(now, offset);
    let (prev, curr) = counts(c, limit, start, offset);
    let len = end - start;
    let weighted = u64::from(prev).saturating_mul(end - now);
    let lim = u64::from(limit.limit);
    let after = weighted.saturating_add((u64::from(curr) + u64::from(cost)).saturating_mul(len));
    // div_ceil(after, len), in terms that stay exact in a Lua double after a debt.
    let current = u64::from(curr) + u64::from(cost) + div_ceil(weighted, len);
    let (_, next_end) = limit.bounds(end, offset);
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

/// The (prev, curr) counts of `c` for the window `[start, ..)`.
fn counts(c: &Counters, limit: &WindowLimit, start: u64, offset: u64) -> (u32, u32) {
    let (prev_start, _) = limit.bounds(start.saturating_sub(1), offset);
    if c.start == start {
        (c.prev, c.curr)
    } else if c.start == prev_start && start > 0 {
        (c.curr, 0)
    } else {
        (0, 0)
    }
}

/// Leases up to `n` tokens at `now` (never more than keeps the weighted count within the
/// limit), until `until` or the current window's end if sooner. Tags: its start, 0.
pub fn take(
    c: &mut Counters,
    limit: &WindowLimit,
    now: u64,
    offset: u64,
    n: u64,
    until: u64,
) -> Lease {
    let (start, end) = limit.bounds(now, offset);
    let (prev, curr) = counts(c, limit, start, offset);
    let len = end - start;
    let used = u64::from(prev)
        .saturating_mul(end - now)
        .saturating_add(u64::from(curr).saturating_mul(len));
    let room = u64::from(limit.limit)
        .saturating_mul(len)
        .saturating_sub(used)
        / len;
    let granted = n.min(room);
    if granted == 0 {
        return Lease::default();
    }
    *c = Counters {
        start,
        prev,
        curr: curr + to_u32(granted),
    };
    Lease {
        granted,
        until: until.min(end),
        tag1: start,
        tag2: 0,
    }
}

/// Gives `k` unused tokens of the lease taken in the window starting at `tag1` back:
/// from `curr` if the state is still that window's, from `prev` if it is the next one's.
pub fn give_back(c: &mut Counters, limit: &WindowLimit, offset: u64, k: u64, tag1: u64) {
    let k = to_u32(k);
    if c.start == tag1 {
        c.curr = c.curr.saturating_sub(k);
    } else if c.start == limit.bounds(tag1, offset).1 {
        c.prev = c.prev.saturating_sub(k);
    }
}

/// Settles a request at `now`; answers the debt accepted (0 for a refund).
///
/// Debt: added to the current window's count (a replay charges it there too), past the
/// limit if need be but bounded: the weighted count the next request sees,
/// `prev x (end - now) / len + curr`, is at most 2 x limit (`curr` is capped at
/// `(2 x limit x len - prev x (end - now)) / len`, rounded down, and at `u32::MAX`; a
/// `curr` already above stays). `step` then rejects until the weighted count has room again (in this window
/// or the next, exactly), with no underflow. The bound on the wait: the weight of the
/// previous window only fades, so the count stays within 2 x limit; in the next window
/// `curr` (at most 2 x limit) weighs `2 x limit x (next end - t) / len`, which leaves
/// room for a unit request from `next end - (limit - 1) x len / (2 x limit)` on. From a
/// settlement at the start of a window that is `len x (1.5 + 1 / (2 x limit))`: 1.5
/// window lengths and a bit (2 for a limit of 1), the worst case; later in the window,
/// less.
///
/// Refund: the request was charged in the window containing its `at`: if that is the
/// current window, `curr` gives it back; if the previous one, `prev` (whose weight is
/// fading); older, nothing (it no longer counts). The replay's count of that window is
/// ours less the refund and the estimate grows with both counts, so the state never
/// admits more than the replay.
pub fn settle(c: &mut Counters, limit: &WindowLimit, now: u64, offset: u64, s: Settle) -> u64 {
    let (start, end) = limit.bounds(now, offset);
    let (prev, curr) = counts(c, limit, start, offset);
    match s {
        Settle::Debt(d) => {
            let len = end - start;
            let top = counter_top(limit)
                .saturating_mul(len)
                .saturating_sub(u64::from(prev).saturating_mul(end - now))
                / len;
            let raised = add_debt(u64::from(curr), d, top.min(u64::from(u32::MAX)));
            *c = Counters {
                start,
                prev,
                curr: to_u32(raised),
            };
            raised - u64::from(curr)
        }
        Settle::Refund { back, at, .. } => {
            let charged = limit.bounds(at, offset).0;
            let back = to_u32(back);
            if charged == start {
                *c = Counters {
                    start,
                    prev,
                    curr: curr.saturating_sub(back),
                };
            } else if start > 0 && charged == limit.bounds(start - 1, offset).0 {
                *c = Counters {
                    start,
                    prev: prev.saturating_sub(back),
                    curr,
                };
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
    use crate::limiter::algorithm::{self as alg, Algo, Lease, State};
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

    fn counters(s: &State) -> (u64, u32, u32) {
        match s.algo() {
            Algo::SlidingWindow(c) => (c.start, c.prev, c.curr),
            other => panic!("{other:?}"),
        }
    }

    /// A lease adds to the current window's count and ends with that window; unused tokens
    /// come back to `curr` in that window, to `prev` in the next one, and not later.
    #[test]
    fn lease_is_counted_in_its_window() {
        let l = lim(Window::Minute, 10);
        let mut s = State::initial(Algorithm::SlidingWindow);
        assert!(alg::step(&mut s, &l, 100_000, 0, 1, true).allowed);
        let lease = alg::take(&mut s, &l, 100_000, 0, 4, 115_000);
        let want = Lease {
            granted: 4,
            until: 115_000,
            tag1: 60_000,
            tag2: 0,
        };
        assert_eq!(lease, want);
        assert_eq!(counters(&s), (60_000, 0, 5));
        // The same window: back to curr.
        alg::give_back(&mut s, &l, 110_000, 0, 2, lease.tag1, 0, 4);
        assert_eq!(counters(&s), (60_000, 0, 3));
        // Near the end, the lease ends with the window.
        let late = alg::take(&mut s, &l, 110_000, 0, 4, 125_000);
        assert_eq!((late.granted, late.until, late.tag1), (4, 120_000, 60_000));
        assert_eq!(counters(&s), (60_000, 0, 7));
        // The next window (the state moved on): back to prev.
        assert!(alg::step(&mut s, &l, 125_000, 0, 1, true).allowed);
        assert_eq!(counters(&s), (120_000, 7, 1));
        alg::give_back(&mut s, &l, 125_000, 0, 3, late.tag1, 0, 4);
        assert_eq!(counters(&s), (120_000, 4, 1));
        // Two windows on: nothing.
        assert!(alg::step(&mut s, &l, 185_000, 0, 1, true).allowed);
        alg::give_back(&mut s, &l, 185_000, 0, 1, lease.tag1, 0, 4);
        alg::give_back(&mut s, &l, 185_000, 0, 1, late.tag1, 0, 4);
        assert_eq!(counters(&s), (180_000, 1, 1));
    }

    /// A lease never takes more than keeps the weighted count within the limit.
    #[test]
    fn lease_is_clamped_to_the_weighted_room() {
        let l = lim(Window::Minute, 10);
        let mut s = State::initial(Algorithm::SlidingWindow);
        assert!(alg::step(&mut s, &l, 119_000, 0, 8, true).allowed);
        // Half way through the next window, 8 x 1/2 = 4 weigh; 1 more admitted: room 5.
        assert!(alg::step(&mut s, &l, 150_000, 0, 1, true).allowed);
        assert_eq!(alg::take(&mut s, &l, 150_000, 0, 9, 165_000).granted, 5);
        assert!(!alg::step(&mut s, &l, 150_000, 0, 1, false).allowed);
    }

    /// Random requests and leases: a replay of what was admitted admits it all, and
    /// `retry_after` stays exact.
    #[test]
    fn leases_never_admit_more_than_a_replay() {
        for (limit, window, offset) in [
            (20, Window::Second, 0),
            (100, Window::Minute, 7_000),
            (30, Window::Month, 3 * 86_400_000),
        ] {
            assert_leases_safe(&lim(window, limit), offset);
        }
    }

    /// A debt lifts the current window's count past the limit: rejected until its
    /// weight has faded in the next window, exactly.
    #[test]
    fn debt_waits_for_the_weight_to_fade() {
        let l = lim(Window::Minute, 10);
        let mut s = State::initial(Algorithm::SlidingWindow);
        assert!(alg::step(&mut s, &l, 100_000, 0, 2, true).allowed);
        alg::settle(&mut s, &l, 100_000, 0, 2, 15, 100_000); // true cost 17
        assert_eq!(counters(&s), (60_000, 0, 17));
        // 17 x (180 000 - t) / 60 000 + 1 <= 10 from t = 148 236 on.
        assert_eq!(assert_exact_at(&s, &l, 100_000, 1).retry_after_ms, 48_236);
        assert_eq!(assert_exact_at(&s, &l, 130_000, 1).retry_after_ms, 18_236);
        // Many windows' worth: cut to a count of 20 (2 x limit); 20 x (180 000 - t) /
        // 60 000 + 1 <= 10 from t = 153 000 on.
        assert_eq!(
            alg::settle(&mut s, &l, 100_000, 0, 1, 1_000_000, 100_000),
            3
        );
        assert_eq!(counters(&s), (60_000, 0, 20));
        assert_eq!(assert_exact_at(&s, &l, 100_000, 1).retry_after_ms, 53_000);
    }

    /// A settlement leaves the weighted count the next request sees, `prev x (end -
    /// now) / len + curr`, at most 2 x limit, whatever the debt (`curr` is capped). The
    /// settled window's count then weighs into the next window: a unit request waits at
    /// most `len x (1.5 + 1 / (2 x limit))`, from a settlement at a window's start (the
    /// worst case; 2 window lengths for a limit of 1), less from later in the window.
    #[test]
    fn debt_is_bounded_by_the_limit() {
        let rows: [DebtRow; 5] = [
            // At the start of a window: the worst case, 1.55 minutes.
            (
                Window::Minute,
                10,
                None,
                60_000,
                1,
                i64::MAX,
                19,
                20,
                21,
                93_000,
            ),
            (
                Window::Minute,
                1,
                None,
                60_000,
                1,
                999_999_999,
                1,
                2,
                3,
                120_000,
            ),
            // Half way, the previous window's 10 weigh 5: curr is cut to 15.
            (
                Window::Minute,
                10,
                Some((59_000, 10)),
                90_000,
                1,
                999,
                14,
                15,
                21,
                54_000,
            ),
            (
                Window::Second,
                1000,
                None,
                1_000,
                500,
                999_999_999,
                1_500,
                2_000,
                2_001,
                1_501,
            ),
            // Within the bound: all of it.
            (Window::Minute, 10, None, 100_000, 2, 15, 15, 17, 18, 48_236),
        ];
        for (i, row) in rows.into_iter().enumerate() {
            assert_debt_row(i, row);
        }
    }

    /// (window, limit, (previous window's admission at, cost), admitted and settled at,
    /// reserved cost, delta, accepted, curr after, then for a unit request: current,
    /// retry_after)
    type DebtRow = (
        Window,
        u32,
        Option<(u64, u32)>,
        u64,
        u32,
        i64,
        u64,
        u32,
        u64,
        u64,
    );

    /// One row of `debt_is_bounded_by_the_limit`.
    fn assert_debt_row(i: usize, row: DebtRow) {
        let (window, limit, prev, at, cost, delta, accepted, curr, current, retry) = row;
        let l = lim(window, limit);
        let mut s = State::initial(Algorithm::SlidingWindow);
        if let Some((t, c)) = prev {
            assert!(alg::step(&mut s, &l, t, 0, c, true).allowed, "row {i}");
        }
        assert!(alg::step(&mut s, &l, at, 0, cost, true).allowed, "row {i}");
        assert_eq!(
            alg::settle(&mut s, &l, at, 0, cost, delta, at),
            accepted,
            "row {i}"
        );
        assert_eq!(counters(&s).2, curr, "row {i}");
        let d = assert_exact_at(&s, &l, at, 1);
        assert_eq!(
            (d.current, d.retry_after_ms),
            (current, retry),
            "row {i}: {d:?}"
        );
        let (len, lim2) = (window.period_ms(), 2 * u64::from(limit));
        assert!(
            retry <= (len * (3 * lim2 / 2 + 1)).div_ceil(lim2),
            "row {i}"
        );
        // Stacked: at its bound the window takes no more.
        let more = alg::settle(&mut s, &l, at, 0, cost, delta, at);
        if accepted < delta.unsigned_abs() {
            assert_eq!(more, 0, "row {i}");
        }
    }

    /// Counts already above the bound (a state from before it) are not lowered.
    #[test]
    fn debt_past_the_bound_is_not_lowered() {
        let l = lim(Window::Minute, 10);
        let mut s = State::from(Counters {
            start: 60_000,
            prev: 0,
            curr: 500,
        });
        assert_eq!(alg::settle(&mut s, &l, 61_000, 0, 1, 5, 61_000), 0);
        assert_eq!(counters(&s), (60_000, 0, 500));
    }

    /// A refund comes off the count of the window the request was charged in: curr in
    /// that window, prev in the next (restoring the replay exactly), nothing later.
    #[test]
    fn refund_comes_off_the_charged_window() {
        let l = lim(Window::Minute, 10);
        let mut s = State::initial(Algorithm::SlidingWindow);
        let mut r = State::initial(Algorithm::SlidingWindow);
        assert!(alg::step(&mut s, &l, 110_000, 0, 3, true).allowed);
        assert!(alg::step(&mut r, &l, 110_000, 0, 3, true).allowed);
        assert!(alg::step(&mut s, &l, 119_000, 0, 6, true).allowed); // true cost 2
        assert!(alg::step(&mut r, &l, 119_000, 0, 2, true).allowed);
        // The same window: curr.
        let mut same = s.clone();
        alg::settle(&mut same, &l, 119_500, 0, 6, -4, 119_000);
        assert_eq!(same, r);
        // The next window: prev, whose weight is fading.
        assert!(alg::step(&mut s, &l, 150_000, 0, 1, true).allowed);
        assert!(alg::step(&mut r, &l, 150_000, 0, 1, true).allowed);
        alg::settle(&mut s, &l, 150_000, 0, 6, -4, 119_000);
        assert_eq!(counters(&s), (120_000, 5, 1));
        assert_eq!(s, r);
        // Two windows on: nothing.
        assert!(alg::step(&mut s, &l, 185_000, 0, 1, true).allowed);
        let before = s.clone();
        alg::settle(&mut s, &l, 185_000, 0, 3, -3, 110_000);
        assert_eq!(s, before);
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
