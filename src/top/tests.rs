//! The sketch on explicit time: ranks, counts within the count-min error, the 60 s
//! window, and a fixed size under a spray of distinct identities.

use std::net::{IpAddr, Ipv4Addr};

use super::*;

/// A start on a 10 s boundary, so slot edges fall on round offsets.
const T0: u64 = 1_764_000_000_000;

fn name(s: &str) -> Ident {
    Ident::Name(s.into())
}

fn ip(n: u32) -> Ident {
    Ident::Ip(IpAddr::V4(Ipv4Addr::from(n)))
}

fn record_n(s: &TopSketch, who: &Ident, n: u64, rejected: u64, now_ms: u64) {
    for i in 0..n {
        s.record(who, i < rejected, now_ms);
    }
}

/// (identity, requests, rejected) as a test table writes it.
type Row = (&'static str, u64, u64);

/// (identity, requests, rejected) of an answer.
fn rows(top: &[Heavy]) -> Vec<(String, u64, u64)> {
    top.iter()
        .map(|h| (h.identity.to_string(), h.requests, h.rejected))
        .collect()
}

/// Heavier identities rank first; counts and rejected counts are exact at low volume.
#[test]
fn ranks_by_requests_with_rejected_counts() {
    let s = TopSketch::new();
    // (identity, requests, of which rejected)
    let traffic = [
        ("key_b", 300, 0),
        ("key_a", 1_000, 56),
        ("key_d", 5, 5),
        ("key_c", 40, 0),
    ];
    for (who, n, rejected) in traffic {
        record_n(&s, &name(who), n, rejected, T0 + 1_000);
    }
    let cases: [(usize, &[Row]); 3] = [
        (1, &[("key_a", 1_000, 56)]),
        (
            3,
            &[("key_a", 1_000, 56), ("key_b", 300, 0), ("key_c", 40, 0)],
        ),
        (
            10,
            &[
                ("key_a", 1_000, 56),
                ("key_b", 300, 0),
                ("key_c", 40, 0),
                ("key_d", 5, 5),
            ],
        ),
    ];
    for (n, want) in cases {
        let want: Vec<_> = want
            .iter()
            .map(|(w, r, j)| (w.to_string(), *r, *j))
            .collect();
        assert_eq!(rows(&s.top(n, T0 + 2_000)), want, "n = {n}");
    }
}

/// A request counts for 50 to 60 s: until the sixth 10 s boundary after it.
#[test]
fn window_expires_after_sixty_seconds() {
    // (recorded at, read at, expected requests)
    let cases = [
        (0, 0, 1),
        (0, 59_999, 1),
        (0, 60_000, 0),
        (9_999, 59_999, 1),
        (9_999, 60_000, 0), // counted for 50.001 s: the 10 s step
        (30_000, 85_000, 1),
        (30_000, 90_000, 0),
        (0, 600_000, 0),
    ];
    for (at, read, want) in cases {
        let s = TopSketch::new();
        s.record(&name("k"), false, T0 + at);
        let got: u64 = s.top(10, T0 + read).iter().map(|h| h.requests).sum();
        assert_eq!(got, want, "recorded at +{at} ms, read at +{read} ms");
    }
}

/// Counts of several slots add up; a slot reused after a minute starts from zero.
#[test]
fn slots_rotate_and_sum() {
    let s = TopSketch::new();
    let k = name("k");
    // (at, requests recorded, expected window count read at the same time)
    let steps = [
        (0, 10, 10),
        (10_000, 20, 30),
        (50_000, 5, 35),
        (60_000, 1, 26), // the slot of +0 is reused: its 10 are gone
        (75_000, 0, 6),  // +10 s slot gone too
        (115_000, 0, 1),
        (120_000, 0, 0),
    ];
    for (at, n, want) in steps {
        record_n(&s, &k, n, 0, T0 + at);
        let got: u64 = s.top(1, T0 + at).iter().map(|h| h.requests).sum();
        assert_eq!(got, want, "at +{at} ms");
    }
}

/// A million distinct addresses keep the candidate set at its cap and the sketches at
/// their fixed size, and the heavy hitters still rank first within 10%.
#[test]
fn bounded_under_a_spray_of_distinct_identities() {
    let s = TopSketch::new();
    let heavy = [(ip(1), 5_000u64), (ip(2), 3_000)];
    let spray = 1_000_000u32;
    for i in 0..spray {
        // Spread over the six slots of one window, the heavy ones interleaved.
        let at = T0 + u64::from(i) * 59_000 / u64::from(spray);
        s.record(&ip(1_000_000 + i), false, at);
        for (who, n) in &heavy {
            if u64::from(i) % (u64::from(spray) / n) == 0 {
                s.record(who, false, at);
            }
        }
    }
    assert!(s.lock().len() <= CANDIDATES);
    assert_eq!(s.slots.len(), SLOTS as usize);
    let top = s.top(2, T0 + 59_000);
    for (h, (who, truth)) in top.iter().zip(&heavy) {
        assert_eq!(&h.identity, who);
        let err = h.requests.abs_diff(*truth);
        assert!(err * 10 <= *truth, "{who}: {} vs {truth}", h.requests);
    }
    // A light one never exceeds its truth by more than the count-min error.
    let light = s.top(CANDIDATES, T0 + 59_000);
    assert!(light.iter().skip(2).all(|h| h.requests < 500), "{light:?}");
}

/// After a spray has filled the candidate set, a new heavy hitter still gets in; an
/// identity that went quiet makes room at the next rotation.
#[test]
fn new_heavy_hitter_displaces_light_candidates() {
    let s = TopSketch::new();
    for i in 0..10_000 {
        s.record(&ip(i), false, T0);
    }
    record_n(&s, &name("late"), 200, 0, T0 + 1_000);
    assert_eq!(s.top(1, T0 + 1_000)[0].identity, name("late"));
    // Seventy seconds later only a new identity is heard from.
    s.record(&name("new"), false, T0 + 70_000);
    assert_eq!(rows(&s.top(10, T0 + 70_000)), [("new".into(), 1, 0)]);
    assert!(s.lock().len() <= 2, "quiet candidates dropped at rotation");
}

/// Only ip, key and tenant have identities to rank.
#[test]
fn table_has_a_sketch_per_identity_scope() {
    let t = TopTable::new();
    let cases = [
        (Scope::Ip, true),
        (Scope::Key, true),
        (Scope::Tenant, true),
        (Scope::Global, false),
        (Scope::Auth, false),
    ];
    for (scope, has) in cases {
        assert_eq!(t.scope(scope).is_some(), has, "{scope:?}");
    }
}

/// Each row takes its own 12 bits of the fingerprint, in its own block of counters.
#[test]
fn cells_take_one_field_per_row() {
    let cases: [(u64, [usize; HASHES]); 3] = [
        (0, [0, WIDTH, 2 * WIDTH, 3 * WIDTH]),
        (
            0x0000_0123_4567_89ab,
            [0x9ab, WIDTH + 0x678, 2 * WIDTH + 0x345, 3 * WIDTH + 0x012],
        ),
        (
            u64::MAX,
            [WIDTH - 1, 2 * WIDTH - 1, 3 * WIDTH - 1, 4 * WIDTH - 1],
        ),
    ];
    for (fp, want) in cases {
        assert_eq!(Cells::of(fp).0, want, "{fp:#x}");
    }
}

/// The estimate is the least of the rows: a fingerprint that shares some rows' counters
/// with another is still counted exactly while one of its rows is its own.
#[test]
fn count_min_reads_the_least_row() {
    let m = CountMin::new();
    let a = Cells::of(0x0000_0000_0000_0001);
    let b = Cells::of(0x0000_0001_0000_0001); // shares rows 0, 1 and 3 with `a`, not row 2
    for n in 1..=3 {
        assert_eq!(m.incr(a), n);
    }
    assert_eq!(m.incr(b), 1);
    assert_eq!((m.get(a), m.get(b)), (3, 1));
    m.reset();
    assert_eq!((m.get(a), m.get(b)), (0, 0));
}

/// A custom scope's sketch is made by its first request, never by a read (a read of one
/// nobody counted in answers empty), and dropped when a reload removes the scope; route
/// tables and domains have none.
#[test]
fn custom_sketches_live_while_their_scope_does() {
    let t = TopTable::new();
    let (kept, gone) = (Named::custom("top_kept"), Named::custom("top_gone"));
    assert!(t.scope(Scope::Named(gone)).unwrap().top(5, T0).is_empty());
    assert_eq!(t.custom_sketches(), 0);
    for n in [kept, gone] {
        count(&t, n, 3);
    }
    let table = Named::intern(Some("top_route"), Base::Custom("top_kept"));
    let domain = Named::domain("top_kept");
    for n in [table, domain] {
        count(&t, n, 1);
        assert!(t.scope(Scope::Named(n)).is_none());
    }
    assert_eq!(t.custom_sketches(), 2);
    t.retain(|n| n == kept);
    assert_eq!(t.custom_sketches(), 1);
    let top = t.scope(Scope::Named(kept)).unwrap().top(5, T0);
    assert_eq!(rows(&top), [("alice".to_string(), 3, 0)]);
    assert!(t.scope(Scope::Named(gone)).unwrap().top(5, T0).is_empty());

    fn count(t: &TopTable, n: Named, times: u64) {
        for _ in 0..times {
            t.record(Scope::Named(n), &name("alice"), false, T0);
        }
    }
}
