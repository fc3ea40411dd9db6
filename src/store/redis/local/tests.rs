//! Tests of the lease table and the over-limit cache.

use super::*;
use crate::limiter::{Algorithm, Decision, Window};
use crate::limiter::{OnFailure, ScopeLimits};

fn limits(limit: u32, admission: Admission) -> ScopeLimits {
    ScopeLimits {
        concurrent: None,
        ban: None,
        windows: vec![WindowLimit::new(Window::Minute, limit).with_admission(admission)],
        on_failure: OnFailure::Local,
        message: None,
        count_on: None,
    }
}

fn check<'a>(l: &'a ScopeLimits, cost: u32) -> Check<'a> {
    let mut c = Check::new(cost);
    c.push(Scope::Key, Ident::Name("k".into()), l);
    c
}

fn decision(allowed: bool, remaining: u32, retry: u64) -> WindowDecision {
    WindowDecision {
        scope: Scope::Key,
        window: Window::Minute,
        decision: Decision {
            allowed,
            limit: 100,
            remaining,
            current: u64::from(100 - remaining),
            reset_after_ms: 60_000,
            retry_after_ms: retry,
        },
    }
}

fn grant(n: u64, until: u64) -> Grant {
    Grant {
        granted: n,
        until,
        tag1: 7,
        tag2: 0,
    }
}

/// A rejection is repeated for requests of at least the same cost until its retry
/// ends, with a shrinking retry_after; a cheaper request goes to Redis.
#[test]
fn over_limit_cache_repeats_a_rejection_until_retry() {
    let local = Local::new(1_000);
    let l = limits(100, Admission::Auto);
    let c = check(&l, 2);
    local.record(
        &c.scopes,
        2,
        &[decision(false, 0, 5_000)],
        &[Grant::default()],
        1_000,
        900,
        1_000,
    );
    let Outcome::OverLimit(v) = local.decide(&c, 3_000) else {
        panic!("not cached")
    };
    let g = v.governing.unwrap();
    assert_eq!((g.decision.retry_after_ms, g.decision.limit), (3_000, 100));
    assert!(!v.allowed);
    assert_eq!(
        local.decide(&check(&l, 1), 3_000),
        Outcome::Remote,
        "cheaper"
    );
    assert_eq!(local.decide(&c, 6_000), Outcome::Remote, "retry has passed");
}

/// A lease admits locally while it holds tokens and has not ended; the lease end is
/// converted from the script's clock.
#[test]
fn a_lease_admits_until_spent_or_ended() {
    let local = Local::new(1_000);
    let l = limits(100, Admission::Auto);
    let c = check(&l, 1);
    // Redis at 500 granted 3 tokens until 1_500 (its clock); our clock read 10_000.
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(3, 1_500)],
        10_000,
        500,
        10_000,
    );
    for remaining in [49, 48, 47] {
        let Outcome::Leased(v) = local.decide(&c, 10_100) else {
            panic!("not leased")
        };
        assert_eq!(v.governing.unwrap().decision.remaining, remaining);
    }
    assert_eq!(local.decide(&c, 10_100), Outcome::Remote, "spent");
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(3, 1_500)],
        10_000,
        500,
        10_000,
    );
    assert_eq!(local.decide(&c, 11_000), Outcome::Remote, "ended at 11_000");
}

/// Exact windows never use leases; a lease being replaced goes back with the call.
#[test]
fn exact_windows_and_replaced_leases() {
    let local = Local::new(1_000);
    let exact = limits(100, Admission::Exact);
    let c = check(&exact, 1);
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(4, 2_000)],
        0,
        0,
        0,
    );
    assert_eq!(local.decide(&c, 10), Outcome::Remote);
    let a = remote(&local.prepare(&c, 10));
    assert_eq!((a.want, a.ret), (0, 4), "exact: returned, none wanted");

    let auto = limits(100, Admission::Auto);
    let c = check(&auto, 5);
    local.record(
        &c.scopes,
        5,
        &[decision(true, 50, 0)],
        &[grant(3, 2_000)],
        0,
        0,
        0,
    );
    let a = remote(&local.prepare(&c, 10));
    assert_eq!(a.ret, 3, "too few tokens for cost 5: given back");
    assert_eq!(a.from.tag1, 7);
}

/// The rate meter sizes what is wanted: nothing for a first request, the rate over the
/// lease length once there is traffic.
#[test]
fn want_follows_the_local_rate() {
    let local = Local::new(1_000);
    let l = limits(10_000, Admission::Auto);
    let c = check(&l, 1);
    assert_eq!(local.decide(&c, 0), Outcome::Remote);
    assert_eq!(
        remote(&local.prepare(&c, 0)).want,
        0,
        "one request: no lease"
    );
    for t in 1..50 {
        let _ = local.decide(&c, t * 10);
    }
    let want = remote(&local.prepare(&c, 500)).want;
    assert_eq!(want, 50, "50 requests in the last second, 1 s leases");
}

fn remote(plan: &Plan) -> LeaseArgs {
    match plan.scopes[0][0] {
        WindowPlan::Remote(a) => a,
        WindowPlan::Covered { .. } => panic!("covered"),
    }
}

/// A window with a lease is covered (its tokens spent) while another goes to Redis;
/// `undo` gives the tokens back when the request is rejected.
#[test]
fn covered_windows_spend_and_undo() {
    let local = Local::new(1_000);
    let l = ScopeLimits {
        concurrent: None,
        ban: None,
        windows: vec![
            WindowLimit::new(Window::Second, 10),
            WindowLimit::new(Window::Minute, 100),
        ],
        on_failure: OnFailure::Local,
        message: None,
        count_on: None,
    };
    let c = check(&l, 1);
    let minute = WindowDecision {
        window: Window::Second,
        ..decision(true, 5, 0)
    };
    local.record(
        &c.scopes,
        1,
        &[minute, decision(true, 50, 0)],
        &[Grant::default(), grant(3, 2_000)],
        0,
        0,
        0,
    );
    let plan = local.prepare(&c, 10);
    assert!(matches!(plan.scopes[0][0], WindowPlan::Remote(_)));
    let WindowPlan::Covered { decision: d, .. } = plan.scopes[0][1] else {
        panic!("minute not covered")
    };
    assert_eq!(d.decision.remaining, 49);
    local.undo(&c, &plan, 1);
    let again = local.prepare(&c, 20);
    let WindowPlan::Covered { decision: d, .. } = again.scopes[0][1] else {
        panic!("minute not covered")
    };
    assert_eq!(d.decision.remaining, 49, "the undone token was spent again");
}

/// A call that goes to Redis anyway renews a lease past half its life: the lease ends
/// (leftovers back) instead of paying.
#[test]
fn aging_leases_renew_with_a_call() {
    let local = Local::new(1_000);
    let l = limits(100, Admission::Auto);
    let c = check(&l, 1);
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(5, 1_000)],
        0,
        0,
        0,
    );
    assert!(matches!(
        local.prepare(&c, 400).scopes[0][0],
        WindowPlan::Covered { .. }
    ));
    let a = remote(&local.prepare(&c, 600));
    assert_eq!(a.ret, 4, "the 4 left go back; Redis decides this request");
}

/// A rejection decided while an ended lease's leftovers are on their way back to Redis
/// may predate their arrival (the check overtook the background return): it is answered,
/// not cached, so the next request asks Redis again and gets the returned tokens. Without
/// this a fleet at its limit could strand those tokens for the whole retry.
#[test]
fn a_rejection_racing_a_return_is_not_cached() {
    let local = Local::new(1_000);
    let l = limits(100, Admission::Auto);
    let c = check(&l, 1);
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(5, 1_000)],
        0,
        0,
        0,
    );
    let r = local.expired(1_500);
    assert_eq!(r[0].lease.ret, 5, "5 leftovers handed to a return call");
    // A check sent meanwhile was rejected by Redis (the 5 were not back yet).
    local.record(
        &c.scopes,
        1,
        &[decision(false, 0, 60_000)],
        &[Grant::default()],
        1_600,
        1_600,
        1_600,
    );
    assert!(
        matches!(local.decide(&c, 1_700), Outcome::Remote),
        "the racing rejection is not repeated from the cache"
    );
    // Past the grace, rejections are cached again.
    local.record(
        &c.scopes,
        1,
        &[decision(false, 0, 60_000)],
        &[Grant::default()],
        4_000,
        4_000,
        4_000,
    );
    assert!(matches!(local.decide(&c, 4_100), Outcome::OverLimit(_)));
}

/// A rejection cached while this gateway still holds leased tokens of the window (a
/// concurrent call reached Redis after the lease took what was left) does not refuse
/// requests the lease can pay: those tokens are counted in Redis already, and refusing
/// would strand them. Once the lease is spent, the rejection is repeated.
#[test]
fn leased_tokens_are_spent_before_a_cached_rejection() {
    let local = Local::new(1_000);
    let l = limits(100, Admission::Auto);
    let c = check(&l, 1);
    local.record(
        &c.scopes,
        1,
        &[decision(true, 2, 0)],
        &[grant(2, 1_000)],
        0,
        0,
        0,
    );
    local.record(
        &c.scopes,
        1,
        &[decision(false, 0, 60_000)],
        &[Grant::default()],
        10,
        10,
        10,
    );
    for at in [20, 30] {
        assert!(
            matches!(local.decide(&c, at), Outcome::Leased(v) if v.allowed),
            "the lease pays at {at}"
        );
    }
    assert!(matches!(local.decide(&c, 40), Outcome::OverLimit(_)));
}

/// Where gateways lease, a rejection is repeated for at most three lease lengths (then
/// Redis is asked again, and finds what other gateways' leases gave back), still
/// answering the window's own retry; without leases, until its retry.
#[test]
fn a_cached_rejection_is_rechecked_within_three_leases() {
    let local = Local::new(1_000);
    let l = limits(100, Admission::Auto);
    let c = check(&l, 1);
    local.record(
        &c.scopes,
        1,
        &[decision(false, 0, 50_000)],
        &[Grant::default()],
        0,
        0,
        0,
    );
    let Outcome::OverLimit(v) = local.decide(&c, 2_900) else {
        panic!("not cached")
    };
    assert_eq!(v.governing.unwrap().decision.retry_after_ms, 47_100);
    assert_eq!(local.decide(&c, 3_000), Outcome::Remote, "asked again");
    let exact = limits(100, Admission::Exact);
    let c = check(&exact, 1);
    local.record(
        &c.scopes,
        1,
        &[decision(false, 0, 50_000)],
        &[Grant::default()],
        0,
        0,
        0,
    );
    assert!(matches!(local.decide(&c, 40_000), Outcome::OverLimit(_)));
}

/// Ended leases are collected once; idle identities are forgotten; drain takes all.
#[test]
fn expiry_and_drain_collect_leftovers() {
    let local = Local::new(1_000);
    let l = limits(100, Admission::Auto);
    let c = check(&l, 1);
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(5, 1_000)],
        0,
        0,
        0,
    );
    // A 1 s lease ending at 1_000 is collected half a lease later (a request of the
    // identity may end it with its own call first).
    assert!(local.expired(1_499).is_empty());
    let r = local.expired(1_500);
    assert_eq!((r.len(), r[0].lease.ret), (1, 5));
    assert!(local.expired(1_501).is_empty(), "collected once");
    assert_eq!(local.len(), 1);
    let _ = local.expired(10_000);
    assert!(local.is_empty(), "idle identity forgotten");
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(5, 99_000)],
        20_000,
        0,
        20_000,
    );
    assert_eq!(local.drain()[0].lease.ret, 5);
}

/// A cached rejection and a lease serve only requests of the limit they were decided
/// at: the same identity under another limit (an adaptive factor, a reload) goes to
/// Redis, and the lease of the old limit goes back with that call.
#[test]
fn rejections_and_leases_are_keyed_to_their_limit() {
    let local = Local::new(1_000);
    let full = limits(20, Admission::Auto);
    let reduced = limits(4, Admission::Auto);
    let at_full = check(&full, 1);
    let at_reduced = check(&reduced, 1);
    local.record(
        &at_reduced.scopes,
        1,
        &[decision(false, 0, 5_000)],
        &[Grant::default()],
        1_000,
        1_000,
        1_000,
    );
    assert!(matches!(
        local.decide(&at_reduced, 2_000),
        Outcome::OverLimit(_)
    ));
    assert_eq!(
        local.decide(&at_full, 2_000),
        Outcome::Remote,
        "a rejection at limit 4 is not one at limit 20"
    );

    let local = Local::new(1_000);
    local.record(
        &at_full.scopes,
        1,
        &[decision(true, 15, 0)],
        &[grant(5, 2_000)],
        1_000,
        1_000,
        1_000,
    );
    assert!(matches!(local.decide(&at_full, 1_100), Outcome::Leased(_)));
    assert_eq!(
        local.decide(&at_reduced, 1_100),
        Outcome::Remote,
        "a lease of limit 20 does not pay under limit 4"
    );
    let a = remote(&local.prepare(&at_reduced, 1_100));
    assert_eq!(a.ret, 4, "the old limit's lease ends with the call");
    assert_eq!(local.decide(&at_full, 1_100), Outcome::Remote, "it is gone");
}

/// A request admitted on a lease was charged when the lease was granted: its verdict
/// names the script's time of the grant, not the gateway's clock.
#[test]
fn leased_verdicts_name_the_grant_time() {
    let local = Local::new(1_000);
    let l = limits(100, Admission::Auto);
    let c = check(&l, 1);
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(3, 1_500)],
        10_000,
        500,
        10_000,
    );
    let Outcome::Leased(v) = local.decide(&c, 10_100) else {
        panic!("not leased")
    };
    // The check's scope 0 (its only one, key).
    assert_eq!(v.decided_at.of(0), 500);
    let plan = local.prepare(&c, 10_200);
    let WindowPlan::Covered { granted_at, .. } = plan.scopes[0][0] else {
        panic!("not covered")
    };
    assert_eq!(granted_at, 500);
}

/// The table holds a bounded number of identities: a spray of identities evicts
/// (idle ones first, then ones without leases, then leased ones, whose tokens go
/// back with the next expiry pass), and every eviction is counted.
#[test]
fn the_table_is_bounded_and_evicted_leases_go_back() {
    let local = Local::with_capacity(1_000, SHARDS); // one identity per shard
    let l = limits(100, Admission::Auto);
    let leased = check(&l, 1);
    local.record(
        &leased.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(5, 60_000)],
        0,
        0,
        0,
    );
    for i in 0..2_000u32 {
        let mut c = Check::new(1);
        c.push(
            Scope::Ip,
            Ident::Ip(std::net::IpAddr::from(i.to_be_bytes())),
            &l,
        );
        let _ = local.decide(&c, 10);
    }
    assert!(local.len() <= SHARDS, "{} identities held", local.len());
    let evictions = local.take_evictions();
    assert!(evictions >= 2_000 - SHARDS as u64, "{evictions} evictions");
    // The leased identity's shard filled up too: its tokens come back, not lost.
    let back: u64 = local.expired(20).iter().map(|r| r.lease.ret).sum();
    assert_eq!(back, 5, "the evicted lease's 5 tokens are given back");
}

/// The expiry pass skips shards with nothing due, and still collects each lease once
/// it is due.
#[test]
fn the_expiry_pass_collects_what_is_due_only() {
    let local = Local::new(1_000);
    let l = limits(100, Admission::Auto);
    let c = check(&l, 1);
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(5, 1_000)],
        0,
        0,
        0,
    );
    let mut other = Check::new(1);
    other.push(Scope::Tenant, Ident::Name("t".into()), &l);
    local.record(
        &other.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(7, 9_000)],
        0,
        0,
        0,
    );
    assert!(local.expired(100).is_empty());
    let first: Vec<u64> = local.expired(1_500).iter().map(|r| r.lease.ret).collect();
    assert_eq!(first, vec![5]);
    assert!(local.expired(5_000).is_empty());
    let second: Vec<u64> = local.expired(13_500).iter().map(|r| r.lease.ret).collect();
    assert_eq!(second, vec![7]);
}

/// A debt is charged to the lease in hand when it holds it (the next admissions see
/// fewer tokens, and keep room for another such debt); a debt it cannot hold ends the
/// lease and names its leftovers for the settle call to give back, so nothing more is
/// admitted on it. (No charge times: the debt may not be held back; see
/// `a_debt_beyond_the_lease_spends_it_and_rides_the_rest` for one that may.)
#[test]
fn a_debt_spends_the_lease_or_ends_it() {
    let local = Local::new(1_000);
    let l = limits(100, Admission::Auto);
    let c = check(&l, 1);
    // 10 tokens until 11_000 on our clock.
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(10, 1_500)],
        10_000,
        500,
        10_000,
    );
    let s = &c.scopes[0];
    assert_eq!(local.debit(s, 4, (1, &[]), 10_100), Ok(()), "held");
    // 6 tokens left: a request of 1 and a debt of 4 fit while 5 are.
    for remaining in [45, 44] {
        let Outcome::Leased(v) = local.decide(&c, 10_200) else {
            panic!("the lease holds a request and a debt")
        };
        assert_eq!(v.governing.unwrap().decision.remaining, remaining);
    }
    assert_eq!(
        local.decide(&c, 10_200),
        Outcome::Remote,
        "4 left: no room for the request's likely debt, renewed with a call"
    );
    let Some(WindowPlan::Remote(a)) = local.prepare(&c, 10_200).scopes[0].first().copied() else {
        panic!("not renewed")
    };
    assert_eq!(a.ret, 4, "the leftovers go back with the call");
    // A new lease of 10; a debt of 11 ends it: its 10 tokens go back with the settle.
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(10, 1_500)],
        10_000,
        500,
        10_000,
    );
    let unpaid = local.debit(s, 11, (1, &[]), 10_300).unwrap_err();
    assert_eq!(unpaid.windows, 1, "the window's debt is Redis's");
    assert_eq!(
        (unpaid.ended[0].ret, unpaid.ended[0].from),
        (10, grant(10, 1_500)),
        "the leftovers named"
    );
    assert_eq!(
        local.decide(&c, 10_300),
        Outcome::Remote,
        "nothing admitted on it"
    );
    // No lease in hand: the whole debt is Redis's, nothing to give back.
    let none = local.debit(s, 3, (1, &[]), 10_400).unwrap_err();
    assert!(none.ended.iter().all(|a| a.from.granted == 0 && a.ret == 0));
}

/// Leases are sized from what an identity spends: its debts count in its rate, and the
/// renewing request's likely debt is asked for on top.
#[test]
fn debts_count_in_the_rate_leases_are_sized_from() {
    let local = Local::new(1_000);
    let l = limits(10_000, Admission::Auto);
    let c = check(&l, 1);
    let _ = local.decide(&c, 10_000);
    let alone = remote(&local.prepare(&c, 10_001)).want;
    let local = Local::new(1_000);
    let _ = local.decide(&c, 10_000);
    local.record(
        &c.scopes,
        1,
        &[decision(true, 50, 0)],
        &[grant(10, 1_500)],
        10_000,
        500,
        10_000,
    );
    for _ in 0..9 {
        let _ = local.debit(&c.scopes[0], 10, (1, &[]), 10_000);
    }
    // The lease ends with the first debt it cannot hold: asked for again.
    let a = remote(&local.prepare(&c, 10_001));
    assert_eq!(
        (alone, a.want),
        (0, 101),
        "1 request and 90 units of debt in a second, and room for the request's own debt"
    );
}

/// A refund of a request paid from a lease goes back to that lease, for every
/// algorithm (no call); a bucket's or a log's lease never beyond what it was granted
/// (the refund of the call's own charge, with nothing spent from the lease, is Redis's).
#[test]
fn refunds_go_back_to_the_lease_that_paid_them() {
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::SlidingLog,
        Algorithm::LeakyBucket,
    ] {
        let counter = matches!(alg, Algorithm::FixedWindow | Algorithm::SlidingWindow);
        let local = Local::new(1_000);
        let mut l = limits(100, Admission::Auto);
        l.windows = vec![WindowLimit::with_algorithm(Window::Minute, 100, alg)];
        let c = check(&l, 1);
        local.record(
            &c.scopes,
            1,
            &[decision(true, 50, 0)],
            &[grant(2, 1_500)],
            10_000,
            500,
            10_000,
        );
        // Nothing spent from the lease yet: only a counter takes the call's own refund.
        assert_eq!(
            local.refund(&c.scopes[0], &[500], (1, 1), 10_050),
            u32::from(counter),
            "{alg:?}"
        );
        let Outcome::Leased(v) = local.decide(&c, 10_100) else {
            panic!("{alg:?}: not leased")
        };
        let at = v.decided_at.of_window(&c.scopes, 0, 0);
        assert_eq!(
            local.refund(&c.scopes[0], &[at], (1, 1), 10_200),
            1,
            "{alg:?}"
        );
        // Refunded: the lease pays two more (three for a counter).
        let mut paid = 0;
        while let Outcome::Leased(_) = local.decide(&c, 10_300) {
            paid += 1;
        }
        assert_eq!(paid, if counter { 3 } else { 2 }, "{alg:?}");
    }
}

/// Limits of `windows` (each with `alg`, 100 a window) for an `auto` scope.
fn windows(alg: Algorithm, windows: &[Window]) -> ScopeLimits {
    let mut l = limits(100, Admission::Auto);
    l.windows = (windows.iter())
        .map(|w| WindowLimit::with_algorithm(*w, 100, alg))
        .collect();
    l
}

fn at(window: Window, allowed: bool) -> WindowDecision {
    WindowDecision {
        window,
        ..decision(allowed, 50, 0)
    }
}

/// A scope's windows paid by leases granted at different times (a 1 s lease is renewed
/// while a 1 min one lasts): the verdict names each window's grant, and the refund goes
/// back to both leases, no call.
#[test]
fn a_refund_finds_each_windows_lease_granted_at_its_own_time() {
    for alg in [Algorithm::TokenBucket, Algorithm::FixedWindow] {
        let local = Local::new(1_000);
        let l = windows(alg, &[Window::Second, Window::Minute]);
        let c = check(&l, 1);
        let both = [at(Window::Second, true), at(Window::Minute, true)];
        // Both granted by the script at 59_200, then the 1 s lease alone at 60_100 (the
        // next second; its first lease ended).
        local.record(
            &c.scopes,
            1,
            &both,
            &[grant(5, 60_000), grant(5, 60_200)],
            10_000,
            59_200,
            10_000,
        );
        let Outcome::Leased(_) = local.decide(&c, 10_100) else {
            panic!("{alg:?}: not leased")
        };
        let mut second = c.clone();
        second.scopes[0].limits = Box::leak(Box::new(windows(alg, &[Window::Second])));
        local.record(
            &second.scopes,
            1,
            &both[..1],
            &[grant(5, 60_350)],
            10_900,
            60_100,
            10_900,
        );
        let Outcome::Leased(v) = local.decide(&c, 10_950) else {
            panic!("{alg:?}: not leased")
        };
        let times = [
            v.decided_at.of_window(&c.scopes, 0, 0),
            v.decided_at.of_window(&c.scopes, 0, 1),
        ];
        assert_eq!(times, [60_100, 59_200], "{alg:?}");
        assert_eq!(v.decided_at.of(0), 59_200, "the scope's earliest");
        assert_eq!(
            local.refund(&c.scopes[0], &times, (1, 1), 10_960),
            0b11,
            "{alg:?}: both windows refunded locally"
        );
    }
}

/// A bucket's lease takes a refund of what it paid, never beyond what it was granted:
/// a second refund of the same request's tokens (or of the call's own charge) is
/// Redis's.
#[test]
fn a_refund_never_exceeds_the_leases_grant() {
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::SlidingLog,
    ] {
        let local = Local::new(1_000);
        let l = windows(alg, &[Window::Minute]);
        let c = check(&l, 2);
        local.record(
            &c.scopes,
            2,
            &[decision(true, 50, 0)],
            &[grant(3, 1_500)],
            10_000,
            500,
            10_000,
        );
        let Outcome::Leased(v) = local.decide(&c, 10_010) else {
            panic!("{alg:?}: not leased")
        };
        let t = [v.decided_at.of_window(&c.scopes, 0, 0)];
        assert_eq!(local.refund(&c.scopes[0], &t, (2, 2), 10_020), 1, "{alg:?}");
        assert_eq!(
            local.refund(&c.scopes[0], &t, (2, 1), 10_020),
            0,
            "{alg:?}: 3 of 3 held"
        );
        // The lease pays one more request of 2, not two.
        let mut paid = 0;
        while let Outcome::Leased(_) = local.decide(&c, 10_030) {
            paid += 1;
        }
        assert_eq!(paid, 1, "{alg:?}");
    }
}

/// A refund Redis would ignore sends nothing: a fixed window's charge in a window Redis
/// has left, a sliding window's two windows back, a bucket's once it has refilled the
/// cost since. One it would not ignore (no lease to take it) is Redis's.
#[test]
fn a_refund_redis_would_ignore_makes_no_call() {
    // (algorithm, the script's time of the charge, of the latest call, and whether a
    // refund 10 ms after that call's reply is ignored).
    let cases = [
        (Algorithm::FixedWindow, 500, 900, false),
        (Algorithm::FixedWindow, 500, 1_000, true),
        (Algorithm::FixedWindow, 500, 995, true), // 995 + 10 ms since the reply
        (Algorithm::SlidingWindow, 500, 1_500, false),
        (Algorithm::SlidingWindow, 500, 1_990, true),
        // 100 a second: a token refills in 10 ms; a refund of 1 of 2 charged at 500 is
        // worth nothing from 520 on.
        (Algorithm::TokenBucket, 500, 500, false),
        (Algorithm::TokenBucket, 500, 505, false),
        (Algorithm::TokenBucket, 500, 510, true),
        (Algorithm::LeakyBucket, 500, 510, true),
        (Algorithm::SlidingLog, 500, 60_000, false),
    ];
    for (alg, charged, latest, ignored) in cases {
        let local = Local::new(1_000);
        let l = windows(alg, &[Window::Second]);
        let c = check(&l, 2);
        // A call at `latest` (no lease), its reply recorded at 10_000 on our clock.
        local.record(
            &c.scopes,
            2,
            &[at(Window::Second, true)],
            &[Grant::default()],
            9_990,
            latest,
            10_000,
        );
        let got = local.refund(&c.scopes[0], &[charged], (2, 1), 10_010);
        assert_eq!(
            got,
            u32::from(ignored),
            "{alg:?} charged at {charged}, Redis at {latest}"
        );
    }
    // Nothing known of Redis's clock: the refund is Redis's.
    let local = Local::new(1_000);
    let l = windows(Algorithm::FixedWindow, &[Window::Second]);
    let c = check(&l, 2);
    let _ = local.decide(&c, 10_000);
    assert_eq!(local.refund(&c.scopes[0], &[500], (2, 1), 50_000), 0);
}
