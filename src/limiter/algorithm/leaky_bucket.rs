//! Leaky bucket as a meter: each request pours `cost` in, the bucket drains at `limit`
//! per window, and a request that would overflow `limit` is rejected (never queued).
//! Lua twin: `lua/leaky_bucket.lua`. Same integer token-ms units as the token bucket.

//!
//! Leases: `take` pours the leased tokens in at once and adds them to the meter's `Hold`:
//! until the hold ends the meter drains to no less than the held amount, as if every held
//! token had been poured at once, so a lease used late can't have the drain counted twice
//! (a plain early charge would let the meter drain empty during the lease, and the
//! lease's tokens then come on top of an empty meter's full allowance). `give_back`
//! takes unused tokens out and releases them from the hold while it lasts; later, nothing.
//!
//! Settling: a debt pours more in, above the limit if need be but to at most capacity +
//! limit (`step` then rejects until the meter has drained to `limit - cost`, exactly); a
//! refund takes out what `refund_units` allows, never below the hold. See `settle`.

use super::{add_debt, div_ceil, hold_end, refund_units, to_u32, Hold, Lease, Settle};
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

    /// The level at `now` (never before `last`), drained (to no less than the held
    /// amount while the hold lasts), the hold still in force then, and that time.
    fn level_at(&self, hold: Hold, rate: u64, now: u64) -> (u64, Hold, u64) {
        let t = now.max(self.last);
        let drain =
            |level: u64, from: u64, to: u64| level.saturating_sub((to - from).saturating_mul(rate));
        if hold.units == 0 {
            return (drain(self.level, self.last, t), Hold::NONE, t);
        }
        if t < hold.until {
            return (drain(self.level, self.last, t).max(hold.units), hold, t);
        }
        let mid = hold.until.max(self.last);
        let at_end = drain(self.level, self.last, mid).max(hold.units);
        (drain(at_end, mid, t), Hold::NONE, t)
    }
}

/// Ms from `now` until a meter at `level` (with `hold`) is down to `target` units.
fn time_to(level: u64, hold: Hold, rate: u64, now: u64, target: u64) -> u64 {
    if level <= target {
        return 0;
    }
    if hold.units == 0 || now >= hold.until || target >= hold.units {
        return div_ceil(level - target, rate);
    }
    // Held above the target until the hold ends.
    let d = hold.until - now;
    let at_end = level.saturating_sub(d.saturating_mul(rate)).max(hold.units);
    d + div_ceil(at_end - target, rate)
}

/// One request of `cost` against the meter (holding `hold`) at `now`.
pub fn step(
    m: &mut Meter,
    hold: &mut Hold,
    limit: &WindowLimit,
    now: u64,
    cost: u32,
    commit: bool,
) -> Decision {
    let period = limit.window.period_ms();
    let rate = u64::from(limit.limit);
    let cap = rate.saturating_mul(period);
    let (level, h, _) = m.level_at(*hold, rate, now);
    let need = u64::from(cost).saturating_mul(period);
    let current = div_ceil(level, period) + u64::from(cost);
    if level.saturating_add(need) <= cap {
        let next = level + need;
        if commit {
            *m = Meter {
                level: next,
                last: now,
            };
            *hold = h;
        }
        return Decision {
            allowed: true,
            limit: limit.limit,
            remaining: to_u32((cap - next) / period),
            current,
            reset_after_ms: time_to(next, h, rate, now, 0),
            retry_after_ms: 0,
        };
    }
    let retry = if need > cap {
        time_to(level, h, rate, now, 0).max(1)
    } else {
        time_to(level, h, rate, now, cap - need)
    };
    Decision {
        allowed: false,
        limit: limit.limit,
        remaining: 0,
        current,
        reset_after_ms: time_to(level, h, rate, now, 0),
        retry_after_ms: retry,
    }
}

/// Leases up to `n` tokens at `now` until `until`: pours them in (never above the
/// limit) and holds them until `hold_end`. Tags: the hold's end for this lease, 0.
pub fn take(
    m: &mut Meter,
    hold: &mut Hold,
    limit: &WindowLimit,
    now: u64,
    n: u64,
    until: u64,
) -> Lease {
    let period = limit.window.period_ms();
    let rate = u64::from(limit.limit);
    let cap = rate.saturating_mul(period);
    let (level, h, at) = m.level_at(*hold, rate, now);
    let granted = n.min(cap.saturating_sub(level) / period);
    if granted == 0 {
        return Lease::default();
    }
    let units = granted * period;
    let end = hold_end(now, until);
    *m = Meter {
        level: level + units,
        last: at,
    };
    *hold = h.add(units, end);
    Lease {
        granted,
        until,
        tag1: end,
        tag2: 0,
    }
}

/// Ends a lease of `size` at `now`, `k` of its tokens unused, while its hold (ending at
/// `tag1`) lasts: the unused tokens leave the meter and the whole lease leaves the hold.
/// Later: nothing.
pub fn give_back(
    m: &mut Meter,
    hold: &mut Hold,
    limit: &WindowLimit,
    now: u64,
    k: u64,
    tag1: u64,
    size: u64,
) {
    if now >= tag1 {
        return;
    }
    let period = limit.window.period_ms();
    let (level, h, at) = m.level_at(*hold, u64::from(limit.limit), now);
    if h.units == 0 {
        return;
    }
    let back = k.min(size).saturating_mul(period).min(h.units);
    let release = size.saturating_mul(period).min(h.units);
    *m = Meter {
        level: level - back,
        last: at,
    };
    *hold = h.sub(release);
}

/// Settles a request on the meter (holding `hold`) at `now`; answers the debt accepted
/// in tokens, rounded up (0 for a refund).
///
/// Debt: the debt is poured in at once, past the limit if need be, to at most the
/// capacity plus the limit (`max_debt`: in debt by at most the limit; a level already
/// above stays). So it drains back to admitting `cost` within `(limit + cost) / rate` of
/// the settlement.
/// A replay pours the same at the same time (its own bound stops it at the same level):
/// it is never fuller.
///
/// Refund: `refund_units` come out (all of it when the request settles before its true
/// cost's worth of drain; less after, down to nothing once the reserved cost's worth has
/// drained), never below the hold. Why it never admits more than the replay: see
/// `refund_units` (the replay's meter may have run empty and wasted drain since).
pub fn settle(m: &mut Meter, hold: &mut Hold, limit: &WindowLimit, now: u64, s: Settle) -> u64 {
    let period = limit.window.period_ms();
    let rate = u64::from(limit.limit);
    let (level, h, at) = m.level_at(*hold, rate, now);
    let (next, accepted) = match s {
        Settle::Debt(d) => {
            let top = (u64::from(limit.capacity) + super::max_debt(limit)).saturating_mul(period);
            let next = add_debt(level, d.saturating_mul(period), top);
            (next, div_ceil(next - level, period))
        }
        Settle::Refund { back, cost, at } => {
            let units = refund_units(back, cost, at, now, period, rate);
            (level.saturating_sub(units).max(h.units).min(level), 0)
        }
    };
    *m = Meter {
        level: next,
        last: at,
    };
    *hold = h;
    accepted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithm::testkit::{
        assert_exact_at, assert_leases_safe, assert_retry_exact, assert_settles_safe, run_table,
        worst_bucket_excess,
    };
    use crate::limiter::algorithm::{self as alg, Lease, State};
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

    const T: u64 = 10_000;

    fn admitted(s: &mut State, l: &WindowLimit, now: u64, tries: usize) -> usize {
        (0..tries)
            .filter(|_| alg::step(s, l, now, 0, 1, true).allowed)
            .count()
    }

    /// A lease is poured in at once and held: the meter drains to no less than the held
    /// amount until the hold ends. Without the hold the meter (3 in) would be empty at
    /// 30 ms and admit 100 there, plus the 2 leased tokens: 103 where a replay admits 101.
    #[test]
    fn lease_is_poured_at_once_and_held() {
        let l = lim(Window::Second, 100);
        let mut s = State::initial(Algorithm::LeakyBucket);
        assert!(alg::step(&mut s, &l, T, 0, 1, true).allowed);
        let lease = alg::take(&mut s, &l, T, 0, 2, T + 250);
        let want = Lease {
            granted: 2,
            until: T + 250,
            tag1: T + 500,
            tag2: 0,
        };
        assert_eq!(lease, want);
        assert_eq!(admitted(&mut s, &l, T + 30, 100), 98);
        let d = alg::step(&mut s, &l, T + 30, 0, 1, true);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 10));
        let mut r = State::initial(Algorithm::LeakyBucket);
        for (at, n) in [(T, 1), (T + 30, 98), (T + 31, 2)] {
            assert_eq!(admitted(&mut r, &l, at, n), n, "replay at {at}");
        }
    }

    /// A request needing the held room waits for the hold's end (exactly).
    #[test]
    fn hold_delays_what_needs_the_held_room() {
        let l = lim(Window::Second, 100);
        let mut s = State::initial(Algorithm::LeakyBucket);
        assert!(alg::step(&mut s, &l, T, 0, 50, true).allowed);
        assert_eq!(alg::take(&mut s, &l, T, 0, 10, T + 250).granted, 10);
        // At +300: 60 - 30 = 30 in, 10 of them held until +500; 95 need it down to 5:
        // +550, the reset (empty) at +600.
        let d = alg::step(&mut s.clone(), &l, T + 300, 0, 95, false);
        assert_eq!(
            (d.allowed, d.retry_after_ms, d.reset_after_ms),
            (false, 250, 300)
        );
        assert!(!alg::step(&mut s.clone(), &l, T + 549, 0, 95, false).allowed);
        assert!(alg::step(&mut s.clone(), &l, T + 550, 0, 95, false).allowed);
        // What fits above the held amount is not delayed.
        let d = alg::step(&mut s.clone(), &l, T + 300, 0, 80, false);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 100));
        assert!(alg::step(&mut s.clone(), &l, T + 300, 0, 70, false).allowed);
    }

    /// Leftovers given back while the hold lasts leave the meter and the hold; from the
    /// hold's end on they are forfeited.
    #[test]
    fn give_back_only_while_held() {
        let l = lim(Window::Second, 100);
        // (give back at, remaining of a cost-1 request then): 60 in at T drain 1 per 10 ms,
        // to no less than 10 until T + 500.
        for (at, remaining) in [(T + 100, 59), (T + 499, 98), (T + 500, 89), (T + 700, 99)] {
            let mut s = State::initial(Algorithm::LeakyBucket);
            assert!(alg::step(&mut s, &l, T, 0, 50, true).allowed);
            let lease = alg::take(&mut s, &l, T, 0, 10, T + 250);
            alg::give_back(&mut s, &l, at, 0, 10, lease.tag1, lease.tag2, lease.granted);
            if at < T + 500 {
                assert!(s.hold().is_none(), "hold released");
            }
            let d = alg::step(&mut s, &l, at, 0, 1, false);
            assert_eq!(d.remaining, remaining, "given back at {at}");
        }
    }

    /// Random requests, leases (used, given back late or never) over several gateways:
    /// a replay of what was admitted admits it all, no span admits more than the limit
    /// plus the drain, and `retry_after` stays exact.
    #[test]
    fn leases_never_admit_more_than_a_replay() {
        for (limit, window) in [
            (20, Window::Second),
            (100, Window::Minute),
            (6, Window::Hour),
        ] {
            let l = lim(window, limit);
            for run in assert_leases_safe(&l, 0) {
                assert!(worst_bucket_excess(&l, &run.admitted) <= 0);
            }
        }
    }

    fn remaining(s: &State, l: &WindowLimit, now: u64, cost: u32) -> (bool, u32, u64) {
        let d = alg::step(&mut s.clone(), l, now, 0, cost, false);
        (d.allowed, d.remaining, d.retry_after_ms)
    }

    /// A debt fills the meter past its limit; retry waits for the drain, exactly.
    #[test]
    fn debt_waits_exactly() {
        let l = lim(Window::Second, 10); // drains 1 token per 100 ms
        let mut s = State::initial(Algorithm::LeakyBucket);
        assert!(alg::step(&mut s, &l, T, 0, 2, true).allowed);
        assert_eq!(alg::settle(&mut s, &l, T, 0, 2, 15, T), 15); // true cost 17
        let d = assert_exact_at(&s, &l, T, 1);
        assert_eq!(
            (d.retry_after_ms, d.reset_after_ms, d.current),
            (800, 1_700, 18)
        );
        assert_eq!(assert_exact_at(&s, &l, T + 1_000, 4).retry_after_ms, 100);
        assert_eq!(remaining(&s, &l, T, 11), (false, 0, 1_700));
    }

    /// A settlement fills the meter to at most capacity + limit, whatever the debt: a
    /// unit request waits at most `(limit + 1) / rate`, one period and a token's drain.
    #[test]
    fn debt_is_bounded_by_the_limit() {
        // (window, limit, reserved cost admitted at T, delta, accepted, then for a unit
        // request: current, retry_after, reset_after)
        type Row = (Window, u32, u32, i64, u64, u64, u64, u64);
        let rows: [Row; 5] = [
            (Window::Second, 10, 2, i64::MAX, 18, 21, 1_100, 2_000),
            (Window::Minute, 5, 1, 999_999_999, 9, 11, 72_000, 120_000),
            (
                Window::Second,
                1000,
                500,
                999_999_999,
                1_500,
                2_001,
                1_001,
                2_000,
            ),
            (Window::Hour, 3, 3, 50, 3, 7, 4_800_000, 7_200_000),
            // Within the bound: all of it.
            (Window::Second, 10, 2, 15, 15, 18, 800, 1_700),
        ];
        for (i, (window, limit, cost, delta, accepted, current, retry, reset)) in
            rows.into_iter().enumerate()
        {
            let l = lim(window, limit);
            let mut s = State::initial(Algorithm::LeakyBucket);
            assert!(alg::step(&mut s, &l, T, 0, cost, true).allowed, "row {i}");
            assert_eq!(
                alg::settle(&mut s, &l, T, 0, cost, delta, T),
                accepted,
                "row {i}"
            );
            let d = assert_exact_at(&s, &l, T, 1);
            assert_eq!(
                (d.current, d.retry_after_ms, d.reset_after_ms),
                (current, retry, reset),
                "row {i}: {d:?}"
            );
            let period = window.period_ms();
            assert!(
                retry <= period + period.div_ceil(u64::from(limit)),
                "row {i}"
            );
            // Stacked: a meter at its bound takes no more.
            let before = s.clone();
            let more = alg::settle(&mut s, &l, T, 0, cost, delta, T);
            if accepted < delta.unsigned_abs() {
                assert_eq!((more, &s), (0, &before), "row {i}");
            } else {
                assert_eq!(more, 3, "row {i}"); // 17 in: 3 more to 20
            }
        }
        // A meter already fuller (a state from before the bound) is not lowered.
        let l = lim(Window::Second, 10);
        let deep = Meter {
            level: 90_000,
            last: T,
        };
        let mut s = State::from(deep);
        assert_eq!(alg::settle(&mut s, &l, T, 0, 1, 5, T), 0);
        assert_eq!(s, State::from(deep));
    }

    /// A refund settled soon restores exactly the replay with the true cost; a late one
    /// less (the replay's meter may have run empty), never below the hold.
    #[test]
    fn refund_restores_the_replay() {
        let l = lim(Window::Second, 10);
        let mut s = State::initial(Algorithm::LeakyBucket);
        assert!(alg::step(&mut s, &l, T, 0, 8, true).allowed);
        alg::settle(&mut s, &l, T + 50, 0, 8, -5, T); // true cost 3
        let mut r = State::initial(Algorithm::LeakyBucket);
        assert!(alg::step(&mut r, &l, T, 0, 3, true).allowed);
        for (at, cost) in [(T + 50, 1), (T + 50, 8), (T + 60, 9)] {
            assert_eq!(remaining(&s, &l, at, cost), remaining(&r, &l, at, cost));
        }
        // 5 in at T (true 1) drains to 3 by T + 200, the replay's to 0 (wasting 100 ms);
        // both pour 5 then: 8 and 5. Refund 4: 200 ms x 10/s - 1 = 1 may have been
        // wasted: 3 out, 5, the replay's level.
        let (mut s, mut r) = (State::initial(l.algorithm), State::initial(l.algorithm));
        assert!(alg::step(&mut s, &l, T, 0, 5, true).allowed);
        assert!(alg::step(&mut r, &l, T, 0, 1, true).allowed);
        assert!(alg::step(&mut s, &l, T + 200, 0, 5, true).allowed);
        assert!(alg::step(&mut r, &l, T + 200, 0, 5, true).allowed);
        alg::settle(&mut s, &l, T + 200, 0, 5, -4, T);
        assert_eq!(remaining(&s, &l, T + 200, 5), remaining(&r, &l, T + 200, 5));
        assert!(!alg::step(&mut s, &l, T + 200, 0, 6, false).allowed);
        // A hold keeps its floor.
        let l = lim(Window::Second, 100);
        let mut s = State::initial(Algorithm::LeakyBucket);
        assert!(alg::step(&mut s, &l, T, 0, 10, true).allowed);
        assert_eq!(alg::take(&mut s, &l, T, 0, 10, T + 250).granted, 10);
        alg::settle(&mut s, &l, T, 0, 10, -10, T);
        assert_eq!(remaining(&s, &l, T, 1).1, 89);
    }

    /// Random requests settled at random times, both ways: a replay with the true costs
    /// (debts as forced charges when settled) admits every admitted request, and
    /// `retry_after` stays exact throughout.
    #[test]
    fn settles_never_admit_more_than_a_replay() {
        for (limit, window) in [
            (20, Window::Second),
            (100, Window::Minute),
            (6, Window::Hour),
            (3_000, Window::Second),
        ] {
            assert_settles_safe(&lim(window, limit), 0);
        }
    }
}
