//! Tests of the adaptive window.

use super::*;

const T0: u64 = 1_764_000_000_000;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Every latency lands in a bin whose edges surround it, and bins are at most ~9% wide.
#[test]
fn bins_surround_their_latencies() {
    for us in [0u64, 100, 250, 999, 1_000, 12_345, 200_000, 5_000_000] {
        let d = Duration::from_micros(us);
        let i = bin(d);
        let v = us as f64 / 1_000.0;
        assert!(lower_edge_ms(i) <= v, "{us}us in bin {i}");
        assert!(v < lower_edge_ms(i + 1), "{us}us in bin {i}");
        if i > 0 {
            assert!(lower_edge_ms(i + 1) / lower_edge_ms(i) < 1.091);
        }
    }
    assert_eq!(bin(Duration::from_secs(3_600)), BINS - 1);
}

/// p99 and the error share over explicit responses, within a bin's width.
#[test]
fn p99_and_error_share() {
    // (fast ms, slow ms, how many slow of 100, errors, want p99 range)
    type Case = (u64, u64, u64, u64, (f64, f64));
    let cases: &[Case] = &[
        (10, 300, 0, 0, (9.0, 11.0)),
        (10, 300, 1, 0, (9.0, 11.0)),
        (10, 300, 2, 1, (270.0, 330.0)),
        (10, 300, 50, 100, (270.0, 330.0)),
        (50, 50, 100, 5, (45.0, 55.0)),
    ];
    for (i, (fast, slow, n_slow, errors, (lo, hi))) in cases.iter().enumerate() {
        let mut w = Window::default();
        for k in 0..100 {
            let latency = if k < *n_slow { ms(*slow) } else { ms(*fast) };
            w.record(T0, latency, k < *errors);
        }
        let o = w.observe(T0);
        assert_eq!((o.total, o.errors), (100, *errors), "case {i}");
        let p99 = o.p99_ms.unwrap();
        assert!(*lo <= p99 && p99 <= *hi, "case {i}: p99 {p99}");
        assert_eq!(o.error_rate(), Some(*errors as f64 / 100.0), "case {i}");
    }
}

/// `n` responses of `client` at `t`, `latency` ms each.
fn feed(w: &mut Window, t: u64, client: Client, n: u32, latency: u64, error: bool) {
    for _ in 0..n {
        let slow = latency > 100; // target_p99_ms 100
        w.record_sample(
            t,
            Sample {
                client,
                latency: ms(latency),
                error,
                slow,
            },
        );
    }
}

/// With `min_clients` 2, the controller's reading leaves out the bad responses of the
/// one client with the most of them, even when it is all the traffic. Rows: traffic
/// as (client, count, latency ms, 5xx), then the judged (total, errors) and whether
/// p99 > 100 ms.
#[test]
fn judge_leaves_out_the_worst_client() {
    type Row = (&'static [(Client, u32, u64, bool)], (u64, u64), bool);
    let rows: &[Row] = &[
        // Nobody bad: everything counts.
        (&[(1, 50, 10, false), (2, 50, 10, false)], (100, 0), false),
        // One client's 500s among healthy traffic: left out.
        (&[(1, 90, 10, false), (9, 60, 10, true)], (90, 0), false),
        // One client's slow responses: left out of the percentile.
        (&[(1, 90, 10, false), (9, 60, 300, false)], (90, 0), false),
        // Its good responses still count as traffic.
        (
            &[(1, 90, 10, false), (9, 30, 10, false), (9, 60, 10, true)],
            (120, 0),
            false,
        ),
        // A truly failing upstream: every client sees 5xx, only the worst is left out.
        (
            &[(1, 40, 10, true), (2, 30, 10, true), (3, 30, 10, false)],
            (60, 30),
            false,
        ),
        // ... and truly slow: p99 stays above target without the worst client.
        (&[(1, 40, 300, false), (2, 30, 300, false)], (30, 0), true),
        // The worst client alone is the whole traffic: one client is not two.
        (&[(9, 5, 10, false), (9, 20, 10, true)], (5, 0), false),
        (&[(9, 3, 300, false)], (0, 0), false),
        // Only the single worst: a second bad client still counts.
        (
            &[(1, 50, 10, false), (8, 20, 10, true), (9, 30, 10, true)],
            (70, 20),
            false,
        ),
    ];
    for (i, (traffic, (total, errors), slow)) in rows.iter().enumerate() {
        let mut w = Window::default();
        for (k, &(client, n, latency, error)) in traffic.iter().enumerate() {
            // Spread over two seconds: the worst client is merged across buckets.
            feed(
                &mut w,
                T0 + (k as u64 % 2) * 1_000,
                client,
                n,
                latency,
                error,
            );
        }
        let o = w.judge(T0 + 1_000, 2);
        assert_eq!((o.total, o.errors), (*total, *errors), "row {i}");
        assert_eq!(o.p99_ms.unwrap_or(0.0) > 100.0, *slow, "row {i}: {o:?}");
        // `observe` is the raw window, everything counted.
        let all: u64 = traffic.iter().map(|t| u64::from(t.1)).sum();
        assert_eq!(w.observe(T0 + 1_000).total, all, "row {i}");
    }
}

/// A bucket tracks at most `HITTERS` clients; a bad response takes the entry of a
/// client with none, so the one bad client among many healthy ones is still found.
#[test]
fn a_bad_client_is_tracked_among_many() {
    let mut w = Window::default();
    for c in 1..=20 {
        feed(&mut w, T0, c, 5, 10, false);
    }
    feed(&mut w, T0, 99, 30, 10, true);
    let o = w.judge(T0, 2);
    assert_eq!((o.total, o.errors), (100, 0));
    // A slow upstream for everyone is not hidden by it.
    for c in 1..=20 {
        feed(&mut w, T0 + 1_000, c, 5, 400, false);
    }
    assert!(w.judge(T0 + 1_000, 2).p99_ms.unwrap() > 100.0);
}

/// Bad responses move the reading only when at least `min_clients` clients send them,
/// whatever their share of the traffic, and only while they are in the window. Rows:
/// bad clients as (second of the window, client), each sending 20 slow 503s among 10
/// healthy clients' 5 fast answers per second each; `min_clients`; the reading's
/// second; whether it is above a 100 ms p99 / 10% error target.
#[test]
fn bad_answers_count_from_min_clients_clients() {
    type Row = (&'static [(u64, Client)], usize, u64, bool);
    let rows: &[Row] = &[
        // Nobody bad.
        (&[], 5, 0, false),
        // Two addresses acting together, however loud: not enough.
        (&[(0, 101), (0, 102)], 5, 0, false),
        (&[(0, 101), (1, 102), (2, 101), (3, 102)], 5, 3, false),
        (&[(0, 101), (0, 102), (0, 103), (0, 104)], 5, 0, false),
        // Five: enough.
        (
            &[(0, 101), (0, 102), (0, 103), (0, 104), (0, 105)],
            5,
            0,
            true,
        ),
        // Five spread over the window count together ...
        (
            &[(0, 101), (2, 102), (4, 103), (6, 104), (9, 105)],
            5,
            9,
            true,
        ),
        // ... until the first has left it (the window is 10 s).
        (
            &[(0, 101), (2, 102), (4, 103), (6, 104), (9, 105)],
            5,
            10,
            false,
        ),
        // min_clients 1: one client is enough; 2: two are.
        (&[(0, 101)], 1, 0, true),
        (&[(0, 101)], 2, 0, false),
        (&[(0, 101), (0, 102)], 2, 0, true),
        // The largest min_clients: HITTERS clients.
        (
            &[
                (0, 101),
                (0, 102),
                (0, 103),
                (0, 104),
                (0, 105),
                (0, 106),
                (0, 107),
                (0, 108),
                (1, 109),
                (1, 110),
                (1, 111),
                (1, 112),
                (1, 113),
                (1, 114),
                (1, 115),
                (1, 116),
            ],
            HITTERS,
            1,
            true,
        ),
    ];
    for (i, (bad, min_clients, at, above)) in rows.iter().enumerate() {
        let mut w = Window::default();
        for second in 0..WINDOW_SECS {
            for c in 1..=10 {
                feed(&mut w, T0 + second * 1_000, c, 5, 5, false);
            }
        }
        for &(second, client) in bad.iter() {
            feed(&mut w, T0 + second * 1_000, client, 20, 300, true);
        }
        let o = w.judge(T0 + at * 1_000, *min_clients);
        let got = o.p99_ms.unwrap_or(0.0) > 100.0 || o.error_rate().unwrap_or(0.0) > 0.1;
        assert_eq!(got, *above, "row {i}: {o:?}");
    }
}

/// The window slides: a response counts for the 10 seconds starting at its second,
/// then is forgotten, and a reused slot starts empty.
#[test]
fn slides_over_ten_seconds() {
    let mut w = Window::default();
    assert_eq!(
        w.observe(T0),
        Observed {
            total: 0,
            errors: 0,
            p99_ms: None
        }
    );
    assert_eq!(w.observe(T0).error_rate(), None);
    w.record(T0 + 500, ms(400), true);
    w.record(T0 + 3_000, ms(5), false);
    let total_at = |w: &Window, t: u64| w.observe(t).total;
    assert_eq!(total_at(&w, T0), 1);
    assert_eq!(total_at(&w, T0 + 3_000), 2);
    assert_eq!(total_at(&w, T0 + 9_999), 2);
    assert_eq!(total_at(&w, T0 + 10_000), 1, "the first second has left");
    assert_eq!(total_at(&w, T0 + 12_999), 1);
    assert_eq!(total_at(&w, T0 + 13_000), 0);
    // Second T0+10 reuses the slot of second T0: the old response is gone.
    w.record(T0 + 10_100, ms(5), false);
    let o = w.observe(T0 + 10_100);
    assert_eq!((o.total, o.errors), (2, 0));
    assert!(o.p99_ms.unwrap() < 6.0);
    // A reading from before a bucket's second does not count it.
    assert_eq!(total_at(&w, T0 + 2_000), 0);
}
