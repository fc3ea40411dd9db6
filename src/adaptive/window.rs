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
mod tests;
