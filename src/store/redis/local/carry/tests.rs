//! Tests of settles held back to go with the identity's next call.

use super::super::*;
use super::{FLUSH_MS, HORIZON_MS, MAX_HELD};
use crate::limiter::{Algorithm, Decision, OnFailure, ScopeLimits, Window};
use crate::store::redis::wire::Carried;

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::SlidingLog,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

/// One `window` of 100 (`alg`, `admission`).
fn limits(alg: Algorithm, window: Window, admission: Admission) -> ScopeLimits {
    ScopeLimits {
        concurrent: None,
        ban: None,
        windows: vec![WindowLimit::with_algorithm(window, 100, alg).with_admission(admission)],
        on_failure: OnFailure::Local,
        message: None,
        count_on: None,
    }
}

fn check(l: &ScopeLimits, cost: u32) -> Check<'_> {
    let mut c = Check::new(cost);
    c.push(Scope::Key, Ident::Name("k".into()), l);
    c
}

fn allowed(window: Window) -> WindowDecision {
    WindowDecision {
        scope: Scope::Key,
        window,
        decision: Decision {
            allowed: true,
            limit: 100,
            remaining: 50,
            current: 50,
            reset_after_ms: 60_000,
            retry_after_ms: 0,
        },
    }
}

/// A request of `c` at our `now` decided by a call the script ran at `script`, its reply
/// recorded at `now`, leasing `granted` tokens for a second.
fn called(local: &Local, c: &Check<'_>, script: u64, now: u64, granted: u64) {
    assert_eq!(local.decide(c, now), Outcome::Remote);
    let w = c.scopes[0].limits.windows[0].window;
    let grant = Grant {
        granted,
        until: script + 1_000,
        tag1: 7,
        tag2: 0,
    };
    local.record(&c.scopes, c.cost, &[allowed(w)], &[grant], now, script, now);
}

/// What the next call of `c` at `now` carries for its window.
fn next_call(local: &Local, c: &Check<'_>, now: u64) -> Carried {
    match local.prepare(c, now).scopes[0][0] {
        WindowPlan::Remote(a) => a.settle,
        WindowPlan::Covered { .. } => panic!("paid from a lease: no call"),
    }
}

/// A minute's start on the script's clock (its windows all start there).
const T: u64 = 1_764_000_000_000;

/// The refund of a call's own charge (no lease took it, Redis would not ignore it yet)
/// is held and goes with the identity's next call, once, for every algorithm: no call
/// of its own.
#[test]
fn a_refund_no_lease_takes_rides_on_the_next_call() {
    for alg in ALGORITHMS {
        let local = Local::new(1_000);
        let l = limits(alg, Window::Minute, Admission::Auto);
        let c = check(&l, 2);
        called(&local, &c, T + 500, 10_000, 0);
        let s = &c.scopes[0];
        assert_eq!(local.refund(s, &[T + 500], (2, 1), 10_001), 0, "{alg:?}");
        assert_eq!(
            local.carry(s, 1, &[T + 500], (2, -1), 10_001),
            1,
            "{alg:?}: held"
        );
        let carried = Carried {
            cost: 2,
            delta: -1,
            at: T + 500,
        };
        assert_eq!(next_call(&local, &c, 10_020), carried, "{alg:?}");
        assert_eq!(
            next_call(&local, &c, 10_030),
            Carried::default(),
            "{alg:?}: carried once"
        );
        assert!(local.expired(10_001 + 10 * FLUSH_MS).is_empty(), "{alg:?}");
    }
}

/// A peek carries nothing (it charges nothing): the settle waits for a check.
#[test]
fn a_peek_carries_nothing() {
    let local = Local::new(1_000);
    let l = limits(Algorithm::TokenBucket, Window::Minute, Admission::Auto);
    let c = check(&l, 2);
    called(&local, &c, T + 500, 10_000, 0);
    assert_eq!(local.carry(&c.scopes[0], 1, &[T + 500], (2, 3), 10_001), 1);
    let mut peek = c.clone();
    peek.peek = true;
    assert_eq!(next_call(&local, &peek, 10_010), Carried::default());
    assert_eq!(next_call(&local, &c, 10_020).delta, 3);
}

/// With no call of the identity, the expiry pass sends a held settle `FLUSH_MS` after it
/// was held (a 'return' call's window: nothing given back, the settle applied), or drops
/// a refund Redis would ignore by then; a shutdown sends every one held.
#[test]
fn the_expiry_pass_flushes_what_no_call_carried() {
    let local = Local::new(1_000);
    let l = limits(Algorithm::TokenBucket, Window::Minute, Admission::Auto);
    let c = check(&l, 2);
    called(&local, &c, T + 500, 10_000, 0);
    assert_eq!(local.carry(&c.scopes[0], 1, &[T + 500], (2, 3), 10_000), 1);
    assert!(local.expired(10_000 + FLUSH_MS - 1).is_empty(), "too soon");
    let out = local.expired(10_000 + FLUSH_MS);
    assert_eq!(out.len(), 1);
    let r = &out[0];
    assert_eq!((r.scope, r.limit), (Scope::Key, l.windows[0]));
    assert_eq!(
        (r.lease.ret, r.lease.from, r.lease.want),
        (0, Grant::default(), 0)
    );
    assert_eq!(
        r.lease.settle,
        Carried {
            cost: 2,
            delta: 3,
            at: T + 500
        }
    );
    assert!(local.expired(10_000 + 3 * FLUSH_MS).is_empty(), "sent once");

    // 100 a second: a refund of 1 of 2 charged at T + 500 is worth nothing from
    // T + 520 on; held at T + 501, flushed at T + 551: dropped.
    let l = limits(Algorithm::TokenBucket, Window::Second, Admission::Auto);
    let c = check(&l, 2);
    called(&local, &c, T + 500, 20_000, 0);
    assert_eq!(local.carry(&c.scopes[0], 1, &[T + 500], (2, -1), 20_001), 1);
    assert!(
        local.expired(20_001 + FLUSH_MS).is_empty(),
        "ignored by Redis"
    );

    assert_eq!(local.carry(&c.scopes[0], 1, &[T + 500], (2, 4), 20_100), 1);
    let all = local.drain();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].lease.settle.delta, 4, "shutdown: sent");
}

/// Held only where leases are in play (`auto` windows, leases on) and where Redis's
/// clock is known for a counter: every other settle is sent at once.
#[test]
fn only_auto_windows_with_leases_hold_a_settle() {
    for (lease_ms, admission, alg, known, held) in [
        (1_000, Admission::Auto, Algorithm::TokenBucket, true, true),
        (1_000, Admission::Exact, Algorithm::TokenBucket, true, false),
        (0, Admission::Auto, Algorithm::TokenBucket, true, false),
        (1_000, Admission::Auto, Algorithm::TokenBucket, false, true),
        (1_000, Admission::Auto, Algorithm::FixedWindow, false, false),
    ] {
        let local = Local::new(lease_ms);
        let l = limits(alg, Window::Minute, admission);
        let c = check(&l, 2);
        if known {
            called(&local, &c, T + 500, 10_000, 0);
        } else {
            let _ = local.decide(&c, 10_000);
        }
        let got = local.carry(&c.scopes[0], 1, &[T + 500], (2, 5), 10_001);
        assert_eq!(
            got,
            u32::from(held),
            "{lease_ms} {admission:?} {alg:?} {known}"
        );
    }
}

/// A counter's settle is held only while the window current at Redis (a lower bound of
/// its clock) lasts `HORIZON_MS` more: it reaches Redis before the window ends, so a debt
/// counts in the window it was settled in and a refund still finds its charge.
#[test]
fn a_counters_settle_is_held_only_well_inside_its_window() {
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        for (script, held) in [
            (T + 100, true),
            (T + 1_000 - HORIZON_MS - 1, true),
            (T + 1_000 - HORIZON_MS, false),
            (T + 990, false),
        ] {
            let local = Local::new(1_000);
            let l = limits(alg, Window::Second, Admission::Auto);
            let c = check(&l, 2);
            called(&local, &c, script, 10_000, 0);
            let got = local.carry(&c.scopes[0], 1, &[script], (2, 3), 10_000);
            assert_eq!(got, u32::from(held), "{alg:?} at {}", script - T);
        }
    }
}

/// Debts held for a window add up; a counter's refunds of one window add up (each gives
/// its own tokens back there); a bucket's or a log's refunds do not (each depends on its
/// charge's time), nor a debt and a refund: they wait beside each other, oldest carried
/// first, one a call. A refund never gives back more than the reserve.
#[test]
fn held_settles_merge_only_when_exact() {
    let held = |alg, first: (u32, i64, u64), second: (u32, i64, u64)| {
        let local = Local::new(1_000);
        let l = limits(alg, Window::Second, Admission::Auto);
        let c = check(&l, 2);
        called(&local, &c, T + 100, 10_000, 0);
        let s = &c.scopes[0];
        let (cost, delta, at) = first;
        assert_eq!(local.carry(s, 1, &[at], (cost, delta), 10_000), 1);
        let (cost, delta, at) = second;
        assert_eq!(local.carry(s, 1, &[at], (cost, delta), 10_001), 1);
        let calls = [10_002, 10_003, 10_004].map(|now| next_call(&local, &c, now));
        calls
            .into_iter()
            .filter(|s| s.delta != 0)
            .collect::<Vec<_>>()
    };
    let carried = |cost, delta, at| Carried { cost, delta, at };
    for alg in ALGORITHMS {
        let got = held(alg, (2, 3, T + 100), (1, 4, T + 90));
        assert_eq!(got, [carried(2, 7, T + 90)], "{alg:?}: debts add up");
        let got = held(alg, (2, 3, T + 100), (2, -1, T + 100));
        let both = [carried(2, 3, T + 100), carried(2, -1, T + 100)];
        assert_eq!(got, both, "{alg:?}: a debt and a refund");
    }
    // A counter's refunds of one window (one of 5 with a reserve of 3: 3 back).
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let got = held(alg, (2, -1, T + 100), (3, -5, T + 150));
        assert_eq!(got, [carried(5, -4, T + 100)], "{alg:?}");
    }
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::SlidingLog,
    ] {
        let got = held(alg, (2, -1, T + 100), (2, -1, T + 101));
        let both = [carried(2, -1, T + 100), carried(2, -1, T + 101)];
        assert_eq!(got, both, "{alg:?}: refunds wait beside each other");
    }
}

/// At most `MAX_HELD` settles wait for one window: the next one is sent now, unless a
/// refund held is worth nothing by then (dropped to make room).
#[test]
fn a_window_holds_a_few_settles() {
    let local = Local::new(1_000);
    // 100 a second: a refund of 1 of 2 is worth nothing 20 ms after its charge.
    let l = limits(Algorithm::TokenBucket, Window::Second, Admission::Auto);
    let c = check(&l, 2);
    called(&local, &c, T + 100, 10_000, 0);
    let s = &c.scopes[0];
    for k in 0..MAX_HELD as u64 {
        assert_eq!(local.carry(s, 1, &[T + 100 + k], (2, -1), 10_000), 1, "{k}");
    }
    assert_eq!(local.carry(s, 1, &[T + 105], (2, -1), 10_001), 0, "full");
    // 30 ms on: the four held are worth nothing; a debt takes their place.
    assert_eq!(local.carry(s, 1, &[T + 130], (2, 5), 10_030), 1);
    assert_eq!(next_call(&local, &c, 10_031).delta, 5);
    assert_eq!(next_call(&local, &c, 10_032), Carried::default());
}

/// A debt held when no lease was in hand is paid from the lease a call already in flight
/// then grants (spending leased tokens on it is an admission on the lease): nothing is
/// carried, and the lease pays that much less. A counter's lease of a later window does
/// not pay it (the debt counts in its own window): the next call carries it.
#[test]
fn a_held_debt_is_paid_from_the_lease_granted_next() {
    for alg in ALGORITHMS {
        let local = Local::new(1_000);
        let l = limits(alg, Window::Minute, Admission::Auto);
        let c = check(&l, 1);
        called(&local, &c, T + 500, 10_000, 0);
        assert_eq!(local.carry(&c.scopes[0], 1, &[T + 500], (1, 3), 10_001), 1);
        called(&local, &c, T + 510, 10_010, 10);
        let mut paid = 0;
        while let Outcome::Leased(_) = local.decide(&c, 10_020) {
            paid += 1;
        }
        assert_eq!(paid, 7, "{alg:?}: 10 leased, 3 spent on the debt");
        let drained = local.drain();
        assert!(
            drained.iter().all(|r| r.lease.settle == Carried::default()),
            "{alg:?}: nothing held"
        );
    }
    let local = Local::new(1_000);
    let l = limits(Algorithm::FixedWindow, Window::Minute, Admission::Auto);
    let c = check(&l, 1);
    called(&local, &c, T + 500, 10_000, 0);
    assert_eq!(local.carry(&c.scopes[0], 1, &[T + 500], (1, 3), 10_001), 1);
    called(&local, &c, T + 60_010, 10_010, 10);
    let mut paid = 0;
    while let Outcome::Leased(_) = local.decide(&c, 10_020) {
        paid += 1;
    }
    assert_eq!(paid, 10, "the next minute's lease pays no debt of this one");
    assert_eq!(next_call(&local, &c, 10_030).delta, 3);
}

/// An identity holding a settle is not forgotten as idle: its settle goes out first.
#[test]
fn a_held_settle_outlives_the_idle_sweep() {
    let local = Local::new(1_000);
    let l = limits(Algorithm::TokenBucket, Window::Hour, Admission::Auto);
    let c = check(&l, 2);
    called(&local, &c, T + 500, 10_000, 0);
    assert_eq!(local.carry(&c.scopes[0], 1, &[T + 500], (2, 3), 10_000), 1);
    let out = local.expired(10_000 + 10 * IDLE_MS);
    assert_eq!(out.len(), 1, "sent, not forgotten");
    assert!(local.is_empty(), "then forgotten");
}

/// Of a debt's windows the leases in hand cannot hold, only those that ended no lease
/// (`Unpaid::free`) may be held: one whose lease the debt ended names it for the settle
/// call, sent now, which gives it back before charging. (No charge times: the debt may
/// not be held back, so the lease it exceeds ends.)
#[test]
fn only_a_debt_that_ended_no_lease_is_held() {
    let local = Local::new(1_000);
    let mut l = limits(Algorithm::TokenBucket, Window::Second, Admission::Auto);
    l.windows.push(WindowLimit::with_algorithm(
        Window::Minute,
        100,
        Algorithm::TokenBucket,
    ));
    let c = check(&l, 1);
    assert_eq!(local.decide(&c, 10_000), Outcome::Remote);
    let minute = Grant {
        granted: 2,
        until: T + 1_500,
        tag1: 7,
        tag2: 0,
    };
    let both = [allowed(Window::Second), allowed(Window::Minute)];
    let grants = [Grant::default(), minute];
    local.record(&c.scopes, 1, &both, &grants, 10_000, T + 500, 10_000);
    let unpaid = local.debit(&c.scopes[0], 3, (1, &[]), 10_001).unwrap_err();
    assert_eq!(unpaid.windows, 0b11);
    assert_eq!(unpaid.free(), 0b01, "the second's: no lease ended");
    let left = (*unpaid).without(0b01);
    assert_eq!(left.windows, 0b10);
    assert_eq!(left.ended.len(), 1);
    assert_eq!((left.ended[0].ret, left.ended[0].from), (2, minute));
}

/// A debt the leases in hand hold only part of spends that part and holds the rest back
/// for the identity's next call (its emptied lease makes that call come), for every
/// algorithm: no settle call of its own, no lease ended.
#[test]
fn a_debt_beyond_the_lease_spends_it_and_rides_the_rest() {
    for alg in ALGORITHMS {
        let local = Local::new(1_000);
        let l = limits(alg, Window::Minute, Admission::Auto);
        let c = check(&l, 1);
        called(&local, &c, T + 500, 10_000, 5);
        let s = &c.scopes[0];
        assert_eq!(
            local.debit(s, 8, (1, &[T + 500]), 10_001),
            Ok(()),
            "{alg:?}"
        );
        assert_eq!(
            local.decide(&c, 10_002),
            Outcome::Remote,
            "{alg:?}: the lease is spent"
        );
        let rest = Carried {
            cost: 1,
            delta: 3,
            at: T + 500,
        };
        assert_eq!(next_call(&local, &c, 10_003), rest, "{alg:?}");
        assert!(
            (local.expired(10_001 + 10 * FLUSH_MS).iter())
                .all(|r| r.lease.settle == Carried::default()),
            "{alg:?}: carried once"
        );
    }
}

/// A counter's debt beyond its lease in the window's last `HORIZON_MS` is not held (a
/// later call could land it in the next window): the lease ends and the settle call,
/// sent now, gives its leftovers back before charging.
#[test]
fn a_debt_beyond_the_lease_near_a_counters_end_ends_it() {
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let local = Local::new(1_000);
        let l = limits(alg, Window::Minute, Admission::Auto);
        let c = check(&l, 1);
        let late = T + 60_000 - HORIZON_MS / 2;
        called(&local, &c, late, 10_000, 5);
        let unpaid = (local.debit(&c.scopes[0], 8, (1, &[late]), 10_001)).unwrap_err();
        assert_eq!((unpaid.windows, unpaid.ended[0].ret), (1, 5), "{alg:?}");
        assert_eq!(
            unpaid.free(),
            0,
            "{alg:?}: a lease ended, the settle goes now"
        );
    }
}

/// Two leases of a window, neither holding a debt alone, pay it together (ending first
/// first): nothing held, nothing sent.
#[test]
fn two_leases_pay_a_debt_together() {
    let local = Local::new(1_000);
    let l = limits(Algorithm::TokenBucket, Window::Minute, Admission::Auto);
    let c = check(&l, 1);
    called(&local, &c, T + 500, 10_000, 5);
    // A concurrent call's grant, recorded beside the first.
    let grant = Grant {
        granted: 5,
        until: T + 1_600,
        tag1: 8,
        tag2: 0,
    };
    let w = allowed(Window::Minute);
    local.record(&c.scopes, 1, &[w], &[grant], 10_100, T + 600, 10_100);
    let s = &c.scopes[0];
    assert_eq!(local.debit(s, 8, (1, &[T + 500]), 10_101), Ok(()));
    let left = local.drain();
    assert_eq!(
        left.iter()
            .map(|r| (r.lease.from.tag1, r.lease.ret))
            .collect::<Vec<_>>(),
        vec![(7, 0), (8, 2)],
        "the lease ending first spent out (a bucket's named even so), 3 of the other's"
    );
    assert!(
        left.iter().all(|r| r.lease.settle == Carried::default()),
        "nothing held"
    );
}
