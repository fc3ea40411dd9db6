//! Tests of the token bucket.

use super::*;
use crate::limiter::algorithm::testkit::{
    assert_exact_at, assert_leases_safe, assert_retry_exact, assert_settles_safe, run_table,
    worst_bucket_excess,
};
use crate::limiter::algorithm::{self as alg, Lease, State};
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

const T: u64 = 10_000;

fn admitted(s: &mut State, l: &WindowLimit, now: u64, tries: usize) -> usize {
    (0..tries)
        .filter(|_| alg::step(s, l, now, 0, 1, true).allowed)
        .count()
}

/// A lease is spent at once and held: the bucket refills to at most capacity - held
/// until the hold ends. Without the hold, the bucket (97 left) would be full again at
/// 30 ms and admit 100 there, and with the 2 leased tokens used at 31 ms, 103 would be
/// admitted where a replay admits 101. With it: 98, so 101.
#[test]
fn lease_is_spent_at_once_and_held() {
    let l = lim(Window::Second, 100, 1.0);
    let mut s = State::initial(Algorithm::TokenBucket);
    assert!(alg::step(&mut s, &l, T, 0, 1, true).allowed);
    let lease = alg::take(&mut s, &l, T, 0, 2, T + 250);
    // The hold lasts the lease and as long again: tag1 is its end.
    let want = Lease {
        granted: 2,
        until: T + 250,
        tag1: T + 500,
        tag2: 0,
    };
    assert_eq!(lease, want);
    assert!(s.hold().is_some());
    assert_eq!(admitted(&mut s, &l, T + 30, 100), 98);
    let d = alg::step(&mut s, &l, T + 30, 0, 1, true);
    assert_eq!((d.allowed, d.retry_after_ms), (false, 10));
    let replay = [(T, 1), (T + 30, 98), (T + 31, 2)];
    let mut r = State::initial(Algorithm::TokenBucket);
    for (at, n) in replay {
        assert_eq!(admitted(&mut r, &l, at, n), n, "replay at {at}");
    }
}

/// A request needing more than capacity - held waits for the hold's end (exactly).
#[test]
fn hold_delays_what_needs_the_held_tokens() {
    let l = lim(Window::Second, 100, 1.0);
    let mut s = State::initial(Algorithm::TokenBucket);
    assert!(alg::step(&mut s, &l, T, 0, 50, true).allowed);
    assert_eq!(alg::take(&mut s, &l, T, 0, 10, T + 250).granted, 10);
    // At +300 the bucket holds 70 and reaches its held cap, 90, at +500 (the hold's
    // end); 95 fit 50 ms later.
    let d = alg::step(&mut s.clone(), &l, T + 300, 0, 95, false);
    assert_eq!(
        (d.allowed, d.retry_after_ms, d.reset_after_ms),
        (false, 250, 300)
    );
    assert!(!alg::step(&mut s.clone(), &l, T + 549, 0, 95, false).allowed);
    assert!(alg::step(&mut s.clone(), &l, T + 550, 0, 95, false).allowed);
    // What fits under the held cap is not delayed.
    let d = alg::step(&mut s.clone(), &l, T + 300, 0, 80, false);
    assert_eq!((d.allowed, d.retry_after_ms), (false, 100));
    assert!(alg::step(&mut s.clone(), &l, T + 300, 0, 70, false).allowed);
}

/// Leftovers given back while the hold lasts return to the bucket and leave the hold;
/// from the hold's end on they are forfeited.
#[test]
fn give_back_only_while_held() {
    let l = lim(Window::Second, 100, 1.0);
    let leased = || {
        let mut s = State::initial(Algorithm::TokenBucket);
        assert!(alg::step(&mut s, &l, T, 0, 50, true).allowed);
        let lease = alg::take(&mut s, &l, T, 0, 10, T + 250);
        (s, lease)
    };
    // (give back at, remaining of a cost-1 request then)
    // (give back at, remaining of a cost-1 request then): 40 left at T refill 1 per
    // 10 ms, to at most 90 until T + 500.
    for (at, remaining) in [(T + 100, 59), (T + 499, 98), (T + 500, 89), (T + 900, 99)] {
        let (mut s, lease) = leased();
        alg::give_back(&mut s, &l, at, 0, 10, lease.tag1, lease.tag2, lease.granted);
        if at < T + 500 {
            assert!(s.hold().is_none(), "hold released");
        }
        let d = alg::step(&mut s, &l, at, 0, 1, false);
        assert_eq!(d.remaining, remaining, "given back at {at}");
    }
    // A lease that ends with some tokens used releases its whole hold: the used ones
    // were spent by then (sustained traffic would otherwise shrink the bucket).
    let (mut s, lease) = leased();
    alg::give_back(&mut s, &l, T + 100, 0, 4, lease.tag1, 0, lease.granted);
    assert!(s.hold().is_none(), "hold released");
    assert_eq!(alg::step(&mut s, &l, T + 100, 0, 1, false).remaining, 53);
    // All used (given back 0): the hold goes, nothing returns to the level.
    let (mut s, lease) = leased();
    alg::give_back(&mut s, &l, T + 100, 0, 0, lease.tag1, 0, lease.granted);
    assert!(s.hold().is_none(), "hold released");
    assert_eq!(alg::step(&mut s, &l, T + 100, 0, 1, false).remaining, 49);
}

/// Random requests, leases (used, given back late or never) over several gateways:
/// a replay of what was admitted admits it all, no span admits more than a full
/// bucket plus its refill, and `retry_after` stays exact.
#[test]
fn leases_never_admit_more_than_a_replay() {
    for (limit, window, burst) in [
        (20, Window::Second, 1.0),
        (100, Window::Minute, 1.5),
        (6, Window::Hour, 2.0),
    ] {
        let l = lim(window, limit, burst);
        for run in assert_leases_safe(&l, 0) {
            assert!(worst_bucket_excess(&l, &run.admitted) <= 0);
        }
    }
}

fn remaining(s: &State, l: &WindowLimit, now: u64, cost: u32) -> (bool, u32, u64) {
    let d = alg::step(&mut s.clone(), l, now, 0, cost, false);
    (d.allowed, d.remaining, d.retry_after_ms)
}

/// A debt takes the bucket below empty: empty until it is paid off (an empty bucket
/// at a `last` in the future), and retry/reset count the wait, exactly.
#[test]
fn debt_waits_exactly() {
    let l = lim(Window::Second, 10, 1.0); // 1 token per 100 ms
    let mut s = State::initial(Algorithm::TokenBucket);
    assert!(alg::step(&mut s, &l, T, 0, 2, true).allowed);
    // True cost 18: 8 left - 16 = 8 tokens owed (within the limit), paid off at
    // T + 800.
    assert_eq!(alg::settle(&mut s, &l, T, 0, 2, 16, T), 16);
    assert_eq!(
        s,
        State::from(Bucket {
            level: 0,
            last: T + 800
        })
    );
    let d = assert_exact_at(&s, &l, T, 1);
    assert_eq!((d.retry_after_ms, d.reset_after_ms), (900, 1_800));
    assert_eq!(assert_exact_at(&s, &l, T + 850, 3).retry_after_ms, 250);
    // Never admissible (above capacity): the next full bucket.
    assert_eq!(remaining(&s, &l, T, 11), (false, 0, 1_800));
    // A refund while in debt pays part of it off: an admitted-at-once refund of 2
    // (true cost 0) 100 ms later gives back 2 tokens less the 1 refilled since.
    assert_eq!(alg::settle(&mut s, &l, T + 100, 0, 2, -2, T), 0);
    assert_eq!(
        s,
        State::from(Bucket {
            level: 0,
            last: T + 700
        })
    );
}

/// A settlement leaves the bucket at most `limit` tokens below empty, whatever the
/// debt and the capacity: empty for at most one period, then a unit request waits
/// for a token's refill, `(limit + 1) / rate` in all. One `x-usage-tokens: 999999999`
/// on a global 1000/s bucket: 1 001 ms (was ~10^7 s); on `per_minute = 5`: 72 s (was
/// 380 years).
#[test]
fn debt_is_bounded_by_the_limit() {
    let rows: [DebtRow; 6] = [
        (
            Window::Second,
            10,
            1.0,
            2,
            i64::MAX,
            18,
            1_000,
            21,
            1_100,
            2_000,
        ),
        (
            Window::Second,
            10,
            1.5,
            2,
            999_999_999,
            23,
            1_000,
            26,
            1_100,
            2_500,
        ),
        (
            Window::Minute,
            5,
            1.0,
            1,
            999_999_999,
            9,
            60_000,
            11,
            72_000,
            120_000,
        ),
        (
            Window::Second,
            1000,
            1.0,
            500,
            999_999_999,
            1_500,
            1_000,
            2_001,
            1_001,
            2_000,
        ),
        (
            Window::Hour,
            3,
            2.0,
            3,
            50,
            6,
            3_600_000,
            10,
            4_800_000,
            10_800_000,
        ),
        // Within the bound: all of it.
        (Window::Second, 10, 1.0, 2, 15, 15, 700, 18, 800, 1_700),
    ];
    for (i, row) in rows.into_iter().enumerate() {
        assert_debt_row(i, row);
    }
}

/// (window, limit, burst, reserved cost admitted at T, delta, accepted, paid off at
/// T + ms, then for a unit request: current, retry_after, reset_after)
type DebtRow = (Window, u32, f64, u32, i64, u64, u64, u64, u64, u64);

/// One row of `debt_is_bounded_by_the_limit`.
fn assert_debt_row(i: usize, row: DebtRow) {
    let (window, limit, burst, cost, delta, accepted, paid, current, retry, reset) = row;
    let l = lim(window, limit, burst);
    let mut s = State::initial(Algorithm::TokenBucket);
    assert!(alg::step(&mut s, &l, T, 0, cost, true).allowed, "row {i}");
    assert_eq!(
        alg::settle(&mut s, &l, T, 0, cost, delta, T),
        accepted,
        "row {i}"
    );
    let want = Bucket {
        level: 0,
        last: T + paid,
    };
    assert_eq!(s, State::from(want), "row {i}");
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
    // Stacked: a bucket at its bound takes no more debt.
    let before = s.clone();
    let more = alg::settle(&mut s, &l, T, 0, cost, delta, T);
    if accepted < delta.unsigned_abs() {
        assert_eq!((more, &s), (0, &before), "row {i}");
    } else {
        // 7 owed: 3 more to the bound.
        assert_eq!(more, 3, "row {i}");
    }
}

/// The debt bound holds from where the bucket is at each settlement, and a bucket
/// already past it is left alone.
#[test]
fn debt_is_bounded_from_the_level_then() {
    // Later settlements are bounded from where the bucket is then: half paid off,
    // another huge debt puts it back at the bound (one period from that settlement).
    let l = lim(Window::Second, 10, 1.0);
    let mut s = State::initial(Algorithm::TokenBucket);
    alg::settle(&mut s, &l, T, 0, 1, i64::MAX, T);
    assert_eq!(alg::settle(&mut s, &l, T + 500, 0, 1, i64::MAX, T), 5);
    assert_eq!(
        s,
        State::from(Bucket {
            level: 0,
            last: T + 1_500
        })
    );
    // A bucket already further below (a state from before the bound) is not lowered.
    let mut s = State::from(Bucket {
        level: 0,
        last: T + 9_000,
    });
    assert_eq!(alg::settle(&mut s, &l, T, 0, 1, 5, T), 0);
    let deep = Bucket {
        level: 0,
        last: T + 9_000,
    };
    assert_eq!(s, State::from(deep));
}

/// A 429's `current` counts the debt: a bucket owing D tokens shows capacity + D +
/// cost. Rounding: the owed units are counted up to a whole token (as a partial token
/// used counts as used), so D exactly when the debt is a multiple of a millisecond's
/// refill, as here; a debt of 1 at 3/s is kept as 334 ms (1.002 tokens) and shows 2.
#[test]
fn current_counts_the_debt() {
    // (limit, burst, debt beyond empty, decided ms after the settle, cost, current)
    let rows: [(u32, f64, i64, u64, u32, u64); 8] = [
        (10, 1.0, 8, 0, 1, 10 + 8 + 1),
        (10, 1.5, 4, 0, 1, 15 + 4 + 1),
        (10, 1.5, 4, 0, 3, 15 + 4 + 3),
        (10, 1.5, 4, 100, 1, 15 + 3 + 1), // one token refilled since
        (10, 1.5, 4, 150, 1, 15 + 3 + 1), // 2.5 owed: counted as 3
        (10, 1.5, 4, 400, 1, 15 + 1),     // paid off: empty
        (1000, 1.0, 1000, 0, 1, 1000 + 1000 + 1),
        (3, 1.0, 1, 0, 1, 3 + 2 + 1), // 1.002 owed (rounded up to the ms)
    ];
    for (i, (limit, burst, owed, after, cost, current)) in rows.into_iter().enumerate() {
        let l = lim(Window::Second, limit, burst);
        let mut s = State::initial(Algorithm::TokenBucket);
        // From full: the capacity, then `owed` more.
        alg::settle(&mut s, &l, T, 0, 1, i64::from(l.capacity) + owed, T);
        let d = alg::step(&mut s.clone(), &l, T + after, 0, cost, false);
        assert!(!d.allowed, "row {i}: {d:?}");
        assert_eq!(d.current, current, "row {i}: {d:?} {s:?}");
    }
}

/// A refund settled soon restores exactly the replay with the true cost.
#[test]
fn refund_restores_the_replay() {
    let l = lim(Window::Second, 10, 1.0);
    let mut s = State::initial(Algorithm::TokenBucket);
    assert!(alg::step(&mut s, &l, T, 0, 8, true).allowed);
    alg::settle(&mut s, &l, T + 50, 0, 8, -5, T); // true cost 3
    let mut r = State::initial(Algorithm::TokenBucket);
    assert!(alg::step(&mut r, &l, T, 0, 3, true).allowed);
    for (at, cost) in [(T + 50, 1), (T + 50, 8), (T + 60, 8)] {
        assert_eq!(remaining(&s, &l, at, cost), remaining(&r, &l, at, cost));
    }
    assert_eq!(remaining(&s, &l, T + 50, 7), (true, 0, 0));
}

/// A refund gives back less once the replay could have been full and wasted refill:
/// `level + refund` capped would admit a token more than the replay here.
#[test]
fn refund_never_lifts_above_a_replay_that_was_full() {
    let l = lim(Window::Second, 10, 1.0);
    let mut s = State::initial(Algorithm::TokenBucket);
    let mut r = State::initial(Algorithm::TokenBucket);
    assert!(alg::step(&mut s, &l, T, 0, 5, true).allowed); // true cost 1
    assert!(alg::step(&mut r, &l, T, 0, 1, true).allowed);
    // By T + 200 the replay is full (one token's refill wasted); both spend 5.
    assert!(alg::step(&mut s, &l, T + 200, 0, 5, true).allowed);
    assert!(alg::step(&mut r, &l, T + 200, 0, 5, true).allowed);
    assert_eq!(remaining(&r, &l, T + 200, 1).1, 4);
    // 4 back would make 6; 200 ms x 10/s - 1 = 1 may have been wasted: 3 back.
    alg::settle(&mut s, &l, T + 200, 0, 5, -4, T);
    assert_eq!(remaining(&s, &l, T + 200, 1), remaining(&r, &l, T + 200, 1));
    assert!(!alg::step(&mut s, &l, T + 200, 0, 6, false).allowed);
    // Settled after the reserved cost's worth of refill: nothing comes back.
    let before = s.clone();
    assert!(alg::step(&mut s, &l, T + 700, 0, 1, true).allowed);
    let after_step = s.clone();
    alg::settle(&mut s, &l, T + 700, 0, 5, -5, T + 200);
    assert_eq!(s, after_step, "{before:?}");
}

/// A refund never lifts a holding bucket above capacity - held.
#[test]
fn refund_stops_at_the_hold() {
    let l = lim(Window::Second, 100, 1.0);
    let mut s = State::initial(Algorithm::TokenBucket);
    assert!(alg::step(&mut s, &l, T, 0, 10, true).allowed);
    assert_eq!(alg::take(&mut s, &l, T, 0, 10, T + 250).granted, 10);
    alg::settle(&mut s, &l, T, 0, 10, -10, T);
    // 80 + 10 back: 90 = capacity - held.
    assert_eq!(remaining(&s, &l, T, 1).1, 89);
    assert!(!alg::step(&mut s, &l, T, 0, 91, false).allowed);
}

/// Random requests settled at random times, both ways: a replay with the true costs
/// (debts as forced charges when settled) admits every admitted request, and
/// `retry_after` stays exact throughout.
#[test]
fn settles_never_admit_more_than_a_replay() {
    for (limit, window, burst) in [
        (20, Window::Second, 1.0),
        (100, Window::Minute, 1.5),
        (6, Window::Hour, 2.0),
        (3_000, Window::Second, 1.0),
    ] {
        assert_settles_safe(&lim(window, limit, burst), 0);
    }
}
