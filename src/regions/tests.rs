//! Table-driven tests of each rule, with the time given in every row.

use super::*;

fn params(limit: u64, window_ms: u64) -> Params {
    Params::new(limit, 3, window_ms)
}

#[test]
fn allotments_sum_to_the_limit_and_differ_by_at_most_one() {
    let cases = [
        // (L, R, allotments)
        (10, 3, vec![4, 3, 3]),
        (100, 3, vec![34, 33, 33]),
        (6_000, 3, vec![2_000, 2_000, 2_000]),
        (2, 3, vec![1, 1, 0]),
        (0, 3, vec![0, 0, 0]),
        (7, 1, vec![7]),
        (5_001, 2, vec![2_501, 2_500]),
    ];
    for (i, (limit, regions, want)) in cases.into_iter().enumerate() {
        let got: Vec<u64> = (0..regions).map(|r| allotment(limit, regions, r)).collect();
        assert_eq!(got, want, "case {i}");
        assert_eq!(got.iter().sum::<u64>(), limit, "case {i}");
    }
}

#[test]
fn links_are_partitioned_after_partition_ms_without_an_acknowledgement() {
    let cases = [
        // (acknowledgements at, now, partition ms, partitioned, lag)
        (vec![], 999, 1_000, false, 999),
        (vec![], 1_000, 1_000, true, 1_000),
        (vec![500], 1_499, 1_000, false, 999),
        (vec![500, 400], 1_500, 1_000, true, 1_000), // an older time never moves it back
        (vec![500], 400, 1_000, false, 0),           // a clock that went back: not partitioned
        (vec![2_000], 2_050, 50, true, 50),
    ];
    for (i, (acks, now, partition, partitioned, lag)) in cases.into_iter().enumerate() {
        let mut links = Links::new(3, 0);
        for t in acks {
            links.acknowledged(1, t);
        }
        assert_eq!(
            links.partitioned(1, now, partition),
            partitioned,
            "case {i}"
        );
        assert_eq!(links.lag_ms(1, now), lag, "case {i}");
        assert!(
            !links.partitioned(7, now, partition),
            "case {i}: not a peer"
        );
    }
}

#[test]
fn forecasts_take_the_larger_of_the_prior_pro_rata_and_the_measured_rate() {
    let p = params(100, 1_000); // sample_ms 50
    let cases = [
        // (demand, prior, elapsed, forecast of the rest)
        (0, None, 0, None),
        (5, None, 49, None), // not measured long enough
        (5, None, 50, Some(95)),
        (5, Some(10), 50, Some(95)),
        (0, Some(10), 0, Some(10)),
        (0, Some(10), 500, Some(5)),
        (1, Some(10), 999, Some(1)), // ceil
        (1, Some(10), 1_000, Some(0)),
        (1, Some(10), 5_000, Some(0)), // past the window's end
        (u64::MAX, None, 50, Some(u64::MAX)),
    ];
    for (i, (demand, prior, elapsed, want)) in cases.into_iter().enumerate() {
        assert_eq!(
            forecast_remaining(demand, prior, elapsed, &p),
            want,
            "case {i}"
        );
    }
}

/// One step of a region-0 scenario (window 0, L = 10, allotment 4).
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Decide `cost`; the verdict expected.
    Decide(u64, Verdict),
    /// Grant (peer, amount); whether it was granted.
    Grant(usize, u64, bool),
    /// A write from a peer (from, window, count, granted to region 0, heard from region 0):
    /// the count acknowledged.
    Receive(usize, u64, u64, u64, u64, u64),
    /// The state's (own, demand, cap, merged) after the steps so far.
    Expect(u64, u64, u64, u64),
}

use Step::*;
use Verdict::{Admit, OverCap};

fn run(name: &str, steps: &[Step]) -> WindowState {
    let p = params(10, 1_000);
    let mut s = WindowState::new(0, &p, 0);
    for (i, step) in steps.iter().enumerate() {
        let at = format!("{name}: step {i} {step:?}");
        match *step {
            Decide(cost, v) => assert_eq!(s.decide(cost), v, "{at}"),
            Grant(peer, amount, ok) => assert_eq!(s.grant(peer, amount), ok, "{at}"),
            Receive(from, window, count, granted, heard, acked) => {
                let w = SyncWrite {
                    from,
                    window,
                    count,
                    demand: count,
                    want: 0,
                    granted,
                    heard,
                };
                let ack = s.receive(&w);
                assert_eq!(
                    (ack.from, ack.window, ack.count),
                    (0, window, acked),
                    "{at}"
                );
            }
            Expect(own, demand, cap, merged) => {
                let got = (s.own(), s.demand(), s.cap(), s.merged());
                assert_eq!(got, (own, demand, cap, merged), "{at}");
            }
        }
    }
    s
}

#[test]
fn a_region_admits_up_to_its_cap_and_grants_only_its_room() {
    let s = run(
        "cap and grants",
        &[
            Expect(0, 0, 4, 0),
            Decide(3, Admit),
            Decide(2, OverCap), // 3 + 2 > 4: refused, counted as demand
            Expect(3, 5, 4, 3),
            Grant(1, 2, false), // room is 1
            Grant(0, 1, false), // never to itself
            Grant(5, 1, false), // not a region
            Grant(1, 1, true),
            Expect(3, 5, 3, 3),
            Decide(1, OverCap),
            Receive(2, 0, 2, 3, 0, 2), // region 3 granted 3 in all
            Expect(3, 6, 6, 5),
            Receive(2, 0, 1, 2, 0, 1), // older, reordered: max-merge keeps 3 and 2
            Receive(2, 0, 2, 3, 0, 2), // a duplicate: nothing changes
            Expect(3, 6, 6, 5),
            Decide(3, Admit),
            Decide(1, OverCap),
            Grant(2, 1, false), // no room left: the cap never falls below own
        ],
    );
    assert_eq!((s.given(1), s.heard(2)), (1, 3));
}

#[test]
fn window_identity_keeps_late_and_early_writes_and_their_grants_out() {
    run(
        "windows",
        &[
            Receive(1, 1_000, 9, 5, 0, 0),    // early: a clock ahead
            Receive(2, u64::MAX, 9, 5, 0, 0), // another window altogether
            Receive(0, 0, 9, 5, 0, 0),        // its own write echoed back
            Expect(0, 0, 4, 0),
            Receive(1, 0, 1, 0, 0, 1),
            Expect(0, 0, 4, 1),
        ],
    );
}

/// The grant plan of region 0 (L = 100, allotment 34, window of 1 s, sample 50 ms).
#[test]
fn the_plan_grants_the_room_above_the_forecast_to_the_live_peers_that_want_it() {
    struct Row {
        now: u64,
        /// Region 0's admitted count and its demand in the previous window.
        own: u64,
        prior: Option<u64>,
        /// Per peer 1, 2: (prior demand, announced want, what it heard of our grants).
        peers: [(Option<u64>, Option<u64>, u64); 2],
        /// Already given to peers 1, 2.
        given: [u64; 2],
        partitioned: Option<usize>,
        plan: Vec<(usize, u64)>,
    }
    let row = |now, own, prior, peers, given, partitioned, plan| Row {
        now,
        own,
        prior,
        peers,
        given,
        partitioned,
        plan,
    };
    let rows = [
        // Nothing to forecast from: no plan.
        row(0, 0, None, [(Some(80), None, 0); 2], [0, 0], None, vec![]),
        // Prior 10: need 10, spare 24, to peer 1 whose prior is 80 (80 - 33 wanted).
        row(
            0,
            0,
            Some(10),
            [(Some(80), None, 0), (Some(10), None, 0)],
            [0, 0],
            None,
            vec![(1, 24)],
        ),
        // Both want more than there is: in proportion, floors' remainder to the largest.
        row(
            0,
            0,
            Some(10),
            [(None, Some(30), 0), (None, Some(10), 0)],
            [0, 0],
            None,
            vec![(1, 18), (2, 6)],
        ),
        // Never more than wanted.
        row(
            0,
            0,
            Some(10),
            [(None, Some(5), 0), (None, Some(0), 0)],
            [0, 0],
            None,
            vec![(1, 5)],
        ),
        // A grant the peer had not heard of when it said what it wants counts as given.
        row(
            0,
            0,
            Some(10),
            [(None, Some(22), 0), (None, None, 0)],
            [20, 0],
            None,
            vec![(1, 2)],
        ),
        row(
            0,
            0,
            Some(10),
            [(None, Some(22), 20), (None, None, 0)],
            [20, 0],
            None,
            vec![(1, 4)],
        ),
        // Never to a partitioned peer.
        row(
            0,
            0,
            Some(10),
            [(None, Some(30), 0), (None, Some(10), 0)],
            [0, 0],
            Some(1),
            vec![(2, 10)],
        ),
        // Late in the window the forecast shrinks (at least 1 is kept while it lasts).
        row(
            990,
            10,
            Some(10),
            [(None, Some(50), 0), (None, None, 0)],
            [0, 0],
            None,
            vec![(1, 23)],
        ),
        // A region at its cap has nothing to grant.
        row(
            500,
            34,
            Some(10),
            [(None, Some(50), 0), (None, None, 0)],
            [0, 0],
            None,
            vec![],
        ),
    ];
    let p = params(100, 1_000);
    for (i, r) in rows.into_iter().enumerate() {
        let mut s = WindowState::new(0, &p, 0);
        if let Some(prior) = r.prior {
            let mut before = WindowState::new(0, &p, 0);
            before.refused(prior);
            for (k, &(peer_prior, _, _)) in r.peers.iter().enumerate() {
                if let Some(d) = peer_prior {
                    before.receive(&write(k + 1, 0, d, 0, 0, 0));
                }
            }
            s = before.next(&p, 1_000);
        }
        let window = s.window();
        for _ in 0..r.own {
            s.decide(1);
        }
        for (k, &g) in r.given.iter().enumerate() {
            assert!(s.grant(k + 1, g), "row {i}: grant {g}");
        }
        for (k, &(_, want, heard)) in r.peers.iter().enumerate() {
            if let Some(w) = want {
                s.receive(&write(k + 1, window, 0, 0, w, heard));
            }
        }
        let now = window + r.now;
        let links = links_at(now, r.partitioned, &p);
        assert_eq!(s.plan(&p, &links, now), r.plan, "row {i}");
    }
}

/// A write from `from` for `window` with its demand, grant to the receiver, want, heard.
fn write(from: usize, window: u64, demand: u64, granted: u64, want: u64, heard: u64) -> SyncWrite {
    SyncWrite {
        from,
        window,
        count: 0,
        demand,
        want,
        granted,
        heard,
    }
}

/// Links at `now`: every peer acknowledged at `now`, but `cut`, silent for `partition_ms`.
fn links_at(now: u64, cut: Option<usize>, p: &Params) -> Links {
    let mut l = Links::new(3, now.saturating_sub(p.partition_ms));
    for k in (0..3).filter(|&k| Some(k) != cut) {
        l.acknowledged(k, now);
    }
    l
}

/// Admits cost-1 requests until one is refused; how many were admitted.
fn admit_all(s: &mut WindowState) -> u64 {
    let mut n = 0;
    while s.decide(1) == Verdict::Admit {
        n += 1;
    }
    n
}

/// A grant caught by a cut is capacity nobody uses, never capacity counted twice: the
/// donor's cap falls when it grants, the receiver's rises only when it hears, and a write
/// held by the cut and delivered after the window is over changes nothing.
#[test]
fn a_grant_lost_in_a_cut_or_delivered_late_is_never_counted_twice() {
    let p = params(100, 1_000);
    let mut s: Vec<WindowState> = (0..3).map(|i| WindowState::new(i, &p, 0)).collect();
    assert!(s[0].grant(2, 20));
    let held = s[0].sync_write(&p, 2, 10); // the cut holds it
    let counts: Vec<u64> = s.iter_mut().map(admit_all).collect();
    assert_eq!(counts, [14, 33, 33]);
    assert_eq!(counts.iter().sum::<u64>(), 80);
    // Delivered in the window, the grant moves capacity, and the sum stays at L.
    let mut heard = s[2].clone();
    heard.receive(&held);
    assert_eq!((heard.cap(), admit_all(&mut heard)), (53, 20));
    // Delivered after the heal, in the next window: nothing changes there.
    let mut next = s[2].next(&p, 1_000);
    let ack = next.receive(&held);
    assert_eq!((ack.count, next.cap(), next.heard(0)), (0, 33, 0));
    // Replayed after a newer write of the same window: the max keeps the newer.
    let mut late = s[2].clone();
    late.receive(&held);
    late.receive(&SyncWrite { granted: 5, ..held });
    assert_eq!(late.heard(0), 20);
}

/// A state read back from the store is the state the rule kept: the same cap, room,
/// wants and plan as one built by the rule's own steps.
#[test]
fn a_stored_state_is_the_state_the_rule_kept() {
    let p = params(100, 1_000);
    let links = Links::new(3, 0);
    // Built by the rule: region 1 admitted 20 of 25 asked, granted 5 to region 0, heard
    // 4 from region 2; region 0 wrote count 30, demand 80, want 40, heard 3.
    let mut rule = WindowState::new(1, &p, 0);
    for _ in 0..25 {
        rule.decide(1);
    }
    assert!(rule.grant(0, 5));
    rule.receive(&SyncWrite {
        from: 2,
        window: 0,
        count: 1,
        demand: 1,
        want: 0,
        granted: 4,
        heard: 0,
    });
    rule.receive(&SyncWrite {
        from: 0,
        window: 0,
        count: 30,
        demand: 80,
        want: 40,
        granted: 0,
        heard: 3,
    });
    let stored = Stored {
        own: 25,
        demand: 25,
        prior: None,
        regions: vec![
            StoredRegion {
                given: 5,
                heard: 0,
                count: 30,
                demand: 80,
                want: Some(40),
                heard_from_me: 3,
                prior: None,
            },
            StoredRegion::default(),
            StoredRegion {
                given: 0,
                heard: 4,
                count: 1,
                demand: 1,
                want: Some(0),
                heard_from_me: 0,
                prior: None,
            },
        ],
    };
    let read = WindowState::from_stored(1, &p, 0, &stored);
    assert_eq!(read, rule);
    assert_eq!(read.cap(), 33 + 4 - 5);
    assert_eq!(read.heard_by(0), 3);
    for now in [0, 60, 500, 999] {
        assert_eq!(
            read.plan(&p, &links, now),
            rule.plan(&p, &links, now),
            "at {now}"
        );
        assert_eq!(read.want(&p, now), rule.want(&p, now), "at {now}");
    }
}
