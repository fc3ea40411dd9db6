//! The sliding window an adaptive route is judged on: the last 10 seconds of upstream
//! responses, in bounded memory whatever the traffic.
//!
//! Ten one-second buckets, each a histogram of fixed log-spaced latency bins plus the
//! response and 5xx counts. A bucket is tagged with the Unix second it counts; a response
//! of a later second reuses the slot of the second 10 s earlier (resetting it), and a
//! reading sums only the buckets of the 10 seconds ending at the reading's second. No
//! sample is ever stored: memory is `BUCKETS x (BINS x 4 + 24 + HITTERS x 32)` bytes
//! (about 11 KiB).
//!
//! Each bucket also tracks, per client (`adaptive::client_id`), the responses of up
//! to `HITTERS` clients: how many, how many were bad (5xx, or slower than the route's
//! `target_p99_ms`), how many 5xx and how many slow. A new client takes a free entry, or,
//! with a bad response, the entry of a client with no bad response; otherwise it is not
//! tracked in that second. `judge` reads the window as the controller sees it: without
//! the bad responses of the `min_clients - 1` clients with the most of them, so bad
//! responses move the factor only when at least `min_clients` clients send them (see
//! `judge`).

use std::time::Duration;

/// Seconds the window spans.
pub const WINDOW_SECS: u64 = 10;
const BUCKETS: usize = WINDOW_SECS as usize;
/// Latency bins: bin 0 holds everything under `FIRST_EDGE_US`; bin i > 0 spans
/// `[edge(i - 1), edge(i))` with `edge(i) = FIRST_EDGE_US x 2^(i / BINS_PER_DOUBLING)`,
/// so each bin is about 9% wide; the last bin is open-ended (over about 3 minutes).
const BINS: usize = 160;
const BINS_PER_DOUBLING: f64 = 8.0;
const FIRST_EDGE_US: f64 = 250.0;
/// Clients tracked per bucket; also the largest `min_clients` (see `Window::judge`).
pub const HITTERS: usize = 16;

/// A client as the window tells them apart: an IPv4 address, or an IPv6 client's /48 (its
/// `/ipv6_prefix` network when that is shorter; see `adaptive::client_id`), as a 128-bit
/// number.
pub type Client = u128;

/// One client's responses within a bucket (`samples` 0: a free entry).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Hitter {
    client: Client,
    samples: u32,
    bad: u32,
    errors: u32,
    slow: u32,
}

/// One response as the window counts it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Who sent the request.
    pub client: Client,
    /// From the upstream request's last byte written to the response head.
    pub latency: Duration,
    /// A 5xx from the upstream, or no answer from it (connect failure, timeout).
    pub error: bool,
    /// Slower than the route's `target_p99_ms`.
    pub slow: bool,
}

/// One second of responses.
#[derive(Debug, Clone)]
struct Bucket {
    /// The Unix second counted (`u64::MAX`: never used).
    second: u64,
    total: u32,
    errors: u32,
    bins: [u32; BINS],
    hitters: [Hitter; HITTERS],
}

/// The last 10 s of one route's upstream responses.
#[derive(Debug, Clone)]
pub struct Window {
    buckets: Box<[Bucket; BUCKETS]>,
}

/// What a window shows at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    /// Responses counted.
    pub total: u64,
    /// 5xx responses among them (a failed connect's 502 included).
    pub errors: u64,
    /// The 99th-percentile latency in ms (interpolated within its bin, as Prometheus'
    /// `histogram_quantile` does); `None` without responses.
    pub p99_ms: Option<f64>,
}

// === impl Window ===

impl Default for Window {
    fn default() -> Self {
        let empty = Bucket {
            second: u64::MAX,
            total: 0,
            errors: 0,
            bins: [0; BINS],
            hitters: [Hitter::default(); HITTERS],
        };
        Self {
            buckets: Box::new(std::array::from_fn(|_| empty.clone())),
        }
    }
}

impl Window {
    /// Counts one response at `now_ms` (limiter clock) that took `latency`, from no
    /// client in particular.
    pub fn record(&mut self, now_ms: u64, latency: Duration, error: bool) {
        self.record_sample(
            now_ms,
            Sample {
                client: 0,
                latency,
                error,
                slow: false,
            },
        );
    }

    /// Counts one response at `now_ms` (limiter clock).
    pub fn record_sample(&mut self, now_ms: u64, s: Sample) {
        let second = now_ms / 1_000;
        let Some(b) = self.buckets.get_mut((second % WINDOW_SECS) as usize) else {
            return;
        };
        if b.second != second {
            b.second = second;
            b.total = 0;
            b.errors = 0;
            b.bins = [0; BINS];
            b.hitters = [Hitter::default(); HITTERS];
        }
        b.total = b.total.saturating_add(1);
        if s.error {
            b.errors = b.errors.saturating_add(1);
        }
        if let Some(n) = b.bins.get_mut(bin(s.latency)) {
            *n = n.saturating_add(1);
        }
        b.hit(&s);
    }

    /// The responses of the 10 seconds ending with `now_ms`'s second.
    pub fn observe(&self, now_ms: u64) -> Observed {
        let (total, errors, bins) = self.sums(now_ms);
        Observed {
            total,
            errors,
            p99_ms: quantile(&bins, total, 0.99),
        }
    }

    /// The window as the controller judges it at `now_ms`: without the bad responses
    /// (5xx or slow) of the `min_clients - 1` clients with the most of them, so that
    /// fewer than `min_clients` clients (up to [`HITTERS`]) cannot shrink a route for
    /// everyone, however much of the traffic they are; their good responses still count
    /// as traffic. When fewer than `min_clients` clients sent bad responses, every bad
    /// response is left out: a bucket leaves a bad response untracked only when
    /// [`HITTERS`] clients with bad responses hold all its entries.
    pub fn judge(&self, now_ms: u64, min_clients: usize) -> Observed {
        let (mut total, mut errors, mut bins) = self.sums(now_ms);
        let worst = self.worst(now_ms, min_clients.saturating_sub(1));
        // Slow responses leave from the top of the histogram, other bad ones (fast 5xx)
        // from the bottom: the count above the target drops by exactly the slow ones, as
        // if they had never been recorded.
        let slow: u64 = worst.iter().map(|w| u64::from(w.slow)).sum();
        let fast_bad: u64 = worst
            .iter()
            .map(|w| u64::from(w.bad.saturating_sub(w.slow)))
            .sum();
        remove(bins.iter_mut().rev(), slow);
        remove(bins.iter_mut(), fast_bad);
        for w in &worst {
            total = total.saturating_sub(u64::from(w.bad));
            errors = errors.saturating_sub(u64::from(w.errors));
        }
        Observed {
            total,
            errors,
            p99_ms: quantile(&bins, total, 0.99),
        }
    }

    /// The buckets of the 10 seconds ending with `now_ms`'s second.
    fn live(&self, now_ms: u64) -> impl Iterator<Item = &Bucket> {
        let now = now_ms / 1_000;
        self.buckets
            .iter()
            .filter(move |b| b.second <= now && now - b.second < WINDOW_SECS)
    }

    /// (responses, 5xx, histogram) of the window.
    fn sums(&self, now_ms: u64) -> (u64, u64, [u64; BINS]) {
        let mut total = 0u64;
        let mut errors = 0u64;
        let mut bins = [0u64; BINS];
        for b in self.live(now_ms) {
            total += u64::from(b.total);
            errors += u64::from(b.errors);
            for (sum, n) in bins.iter_mut().zip(b.bins.iter()) {
                *sum += u64::from(*n);
            }
        }
        (total, errors, bins)
    }

    /// The `n` clients with the most bad responses in the window, worst first (ties: the
    /// most responses, then the lowest identity); only clients with a bad response.
    fn worst(&self, now_ms: u64, n: usize) -> Vec<Hitter> {
        if n == 0 {
            return Vec::new();
        }
        let mut merged: Vec<Hitter> = Vec::with_capacity(HITTERS * BUCKETS);
        for h in self.live(now_ms).flat_map(|b| b.hitters.iter()) {
            if h.samples == 0 {
                continue;
            }
            match merged.iter_mut().find(|m| m.client == h.client) {
                Some(m) => {
                    m.samples = m.samples.saturating_add(h.samples);
                    m.bad = m.bad.saturating_add(h.bad);
                    m.errors = m.errors.saturating_add(h.errors);
                    m.slow = m.slow.saturating_add(h.slow);
                }
                None => merged.push(*h),
            }
        }
        merged.retain(|h| h.bad > 0);
        merged.sort_unstable_by_key(|h| {
            std::cmp::Reverse((h.bad, h.samples, std::cmp::Reverse(h.client)))
        });
        merged.truncate(n);
        merged
    }
}

/// Takes `n` responses out of the bins `iter` walks, in its order.
fn remove<'a>(iter: impl Iterator<Item = &'a mut u64>, mut n: u64) {
    for c in iter {
        if n == 0 {
            return;
        }
        let take = n.min(*c);
        *c -= take;
        n -= take;
    }
}

// === impl Bucket ===

impl Bucket {
    /// Counts `s` for its client (see the module docs for who is tracked).
    fn hit(&mut self, s: &Sample) {
        let bad = s.error || s.slow;
        let i = match self
            .hitters
            .iter()
            .position(|h| h.samples > 0 && h.client == s.client)
        {
            Some(i) => i,
            None => {
                let free = self.hitters.iter().position(|h| h.samples == 0);
                let spare = || {
                    self.hitters
                        .iter()
                        .enumerate()
                        .filter(|(_, h)| h.bad == 0)
                        .min_by_key(|(_, h)| h.samples)
                        .map(|(i, _)| i)
                };
                match free.or_else(|| if bad { spare() } else { None }) {
                    Some(i) => i,
                    None => return, // not tracked this second
                }
            }
        };
        let Some(h) = self.hitters.get_mut(i) else {
            return;
        };
        if h.samples == 0 || h.client != s.client {
            *h = Hitter {
                client: s.client,
                ..Hitter::default()
            };
        }
        h.samples = h.samples.saturating_add(1);
        h.bad = h.bad.saturating_add(u32::from(bad));
        h.errors = h.errors.saturating_add(u32::from(s.error));
        h.slow = h.slow.saturating_add(u32::from(s.slow));
    }
}

// === impl Observed ===

impl Observed {
    /// The 5xx share, `None` without responses.
    pub fn error_rate(&self) -> Option<f64> {
        (self.total > 0).then(|| self.errors as f64 / self.total as f64)
    }
}

/// The bin of a latency.
fn bin(latency: Duration) -> usize {
    let us = latency.as_secs_f64() * 1e6;
    if us < FIRST_EDGE_US {
        return 0;
    }
    let i = ((us / FIRST_EDGE_US).log2() * BINS_PER_DOUBLING).floor() as usize + 1;
    i.min(BINS - 1)
}

/// The lower edge of bin `i`, in ms.
fn lower_edge_ms(i: usize) -> f64 {
    if i == 0 {
        return 0.0;
    }
    FIRST_EDGE_US * ((i - 1) as f64 / BINS_PER_DOUBLING).exp2() / 1_000.0
}

/// The `q` quantile of `total` values binned in `bins`, interpolated linearly within
/// the bin it falls in (the open last bin answers its lower edge).
fn quantile(bins: &[u64; BINS], total: u64, q: f64) -> Option<f64> {
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    for (i, n) in bins.iter().enumerate() {
        if *n == 0 {
            continue;
        }
        if (below + n) as f64 >= rank {
            let lo = lower_edge_ms(i);
            if i == BINS - 1 {
                return Some(lo);
            }
            let hi = lower_edge_ms(i + 1);
            let within = ((rank - below as f64) / *n as f64).clamp(0.0, 1.0);
            return Some(lo + (hi - lo) * within);
        }
        below += n;
    }
    Some(lower_edge_ms(BINS - 1))
}

#[cfg(test)]
mod tests {
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
}
