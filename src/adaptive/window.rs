//! The sliding window an adaptive route is judged on: the last 10 seconds of upstream
//! responses, in bounded memory whatever the traffic.
//!
//! Ten one-second buckets, each a histogram of fixed log-spaced latency bins plus the
//! response and 5xx counts. A bucket is tagged with the Unix second it counts; a response
//! of a later second reuses the slot of the second 10 s earlier (resetting it), and a
//! reading sums only the buckets of the 10 seconds ending at the reading's second. No
//! sample is ever stored: memory is `BUCKETS x (BINS x 4 + 24)` bytes (about 6.6 KiB).

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

/// One second of responses.
#[derive(Debug, Clone)]
struct Bucket {
    /// The Unix second counted (`u64::MAX`: never used).
    second: u64,
    total: u32,
    errors: u32,
    bins: [u32; BINS],
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
        };
        Self {
            buckets: Box::new(std::array::from_fn(|_| empty.clone())),
        }
    }
}

impl Window {
    /// Counts one response at `now_ms` (limiter clock) that took `latency`.
    pub fn record(&mut self, now_ms: u64, latency: Duration, error: bool) {
        let second = now_ms / 1_000;
        let Some(b) = self.buckets.get_mut((second % WINDOW_SECS) as usize) else {
            return;
        };
        if b.second != second {
            b.second = second;
            b.total = 0;
            b.errors = 0;
            b.bins = [0; BINS];
        }
        b.total = b.total.saturating_add(1);
        if error {
            b.errors = b.errors.saturating_add(1);
        }
        if let Some(n) = b.bins.get_mut(bin(latency)) {
            *n = n.saturating_add(1);
        }
    }

    /// The responses of the 10 seconds ending with `now_ms`'s second.
    pub fn observe(&self, now_ms: u64) -> Observed {
        let now = now_ms / 1_000;
        let mut total = 0u64;
        let mut errors = 0u64;
        let mut bins = [0u64; BINS];
        let live = self
            .buckets
            .iter()
            .filter(|b| b.second <= now && now - b.second < WINDOW_SECS);
        for b in live {
            total += u64::from(b.total);
            errors += u64::from(b.errors);
            for (sum, n) in bins.iter_mut().zip(b.bins.iter()) {
                *sum += u64::from(*n);
            }
        }
        Observed {
            total,
            errors,
            p99_ms: quantile(&bins, total, 0.99),
        }
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
