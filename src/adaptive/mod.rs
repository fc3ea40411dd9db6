//! Adaptive limits: a route's limits shrink while its upstream is slow or failing, and
//! grow back once it recovers.
//!
//! A route with `adaptive = { target_p99_ms, max_error_rate, min_factor, min_clients }` has a
//! `RouteState`: a `Window` of its upstream responses over the last 10 s (latency
//! histogram and 5xx count per second, bounded memory) and a factor in `[min_factor, 1]`.
//! The proxy records every upstream response (`record`, a short mutex section); once a
//! second the server's controller task calls `tick`, which reads the window and moves the
//! factor (`controller::next`: x 0.8 above target, + 0.05 at or below). The window is
//! read without the bad responses of the `min_clients - 1` clients (IPv4 addresses, IPv6
//! /48s) with the most of them (`Window::judge`), so the factor moves only when at least
//! `min_clients` (default 5) clients see the upstream slow or failing: a few addresses
//! acting together cannot shrink a route for everyone. Admission reads
//! the factor with one atomic load and multiplies every limit checked for a request on
//! that route (rate windows and `concurrent` slots) by it: `max(1, floor(limit x factor))`.
//!
//! The factor is kept in millionths (`Factor`), so the steps and the effective limits
//! are exact integer arithmetic and never drift.

pub mod controller;
pub mod window;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

pub use self::window::{Client, Observed, Sample, Window};

/// A limit multiplier in `(0, 1]`, in millionths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Factor(u32);

/// A route's `adaptive` table, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Above target while the window's p99 latency is over this many ms.
    pub target_p99_ms: Option<u64>,
    /// Above target while the window's 5xx share is over this (in `[0, 1]`).
    pub max_error_rate: Option<f64>,
    /// The lowest factor (`min_factor`, default 0.1).
    pub min_factor: Factor,
    /// Clients whose bad responses it takes to move the factor (`min_clients`, default
    /// [`DEFAULT_MIN_CLIENTS`], at most [`window::HITTERS`]).
    pub min_clients: u32,
}

/// `min_clients` when the table names none.
pub const DEFAULT_MIN_CLIENTS: u32 = 5;

/// One adaptive route's live state: shared by every runtime that has the route, so a
/// config reload keeps it (see `reload`).
#[derive(Debug)]
pub struct RouteState {
    window: Mutex<Window>,
    factor: AtomicU32,
}

/// The window's name for the client at `ip`: an IPv4 address (as its IPv4-mapped IPv6
/// number), an IPv6 client by its /48 (or its `/ipv6_prefix` network when that is
/// shorter). A /48 is a site: a subscriber holding a /56 has 256 /64 identities for the
/// limits, but is one client here, so it cannot pass for several clients to shrink a
/// route.
pub fn client_id(ip: std::net::IpAddr, ipv6_prefix: u8) -> Client {
    /// The IPv6 network one client of the adaptive window stands for.
    const SITE: u8 = 48;
    match crate::limiter::check::network(ip, ipv6_prefix.min(SITE)) {
        ipnet::IpNet::V4(n) => u128::from(n.addr().to_ipv6_mapped()),
        ipnet::IpNet::V6(n) => u128::from(n.network()),
    }
}

// === impl Factor ===

impl Factor {
    /// No reduction.
    pub const ONE: Factor = Factor(1_000_000);
    /// `min_factor` when the table names none.
    pub const DEFAULT_MIN: Factor = Factor(100_000);

    /// `ppm` millionths, at least 1.
    pub fn from_ppm(ppm: u32) -> Self {
        Self(ppm.clamp(1, Self::ONE.0))
    }

    /// The nearest factor to `f` (clamped into `(0, 1]`).
    pub fn from_f64(f: f64) -> Self {
        let ppm = (f * 1e6).round();
        Self::from_ppm(if ppm.is_finite() && ppm > 0.0 {
            ppm.min(1e6) as u32
        } else {
            1
        })
    }

    /// Millionths.
    pub fn ppm(self) -> u32 {
        self.0
    }

    /// As a number (the gauge's value).
    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / 1e6
    }

    /// Whether limits are unchanged.
    pub fn is_one(self) -> bool {
        self == Self::ONE
    }

    /// The effective limit: `max(1, floor(limit x factor))`.
    pub fn apply(self, limit: u32) -> u32 {
        let scaled = u64::from(limit) * u64::from(self.0) / u64::from(Self::ONE.0);
        u32::try_from(scaled).unwrap_or(u32::MAX).max(1)
    }
}

impl Default for Factor {
    fn default() -> Self {
        Self::ONE
    }
}

// === impl RouteState ===

impl Default for RouteState {
    fn default() -> Self {
        Self {
            window: Mutex::new(Window::default()),
            factor: AtomicU32::new(Factor::ONE.0),
        }
    }
}

impl RouteState {
    /// The current factor (one atomic load).
    pub fn factor(&self) -> Factor {
        Factor(self.factor.load(Ordering::Relaxed))
    }

    /// Counts one upstream response at `now_ms`.
    pub fn record(&self, now_ms: u64, latency: Duration, error: bool) {
        self.window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(now_ms, latency, error);
    }

    /// Counts one upstream response of a client at `now_ms`; `slow` is judged against
    /// the route's `target_p99_ms`.
    pub fn record_from(
        &self,
        settings: &Settings,
        now_ms: u64,
        client: Client,
        latency: Duration,
        error: bool,
    ) {
        let slow = settings
            .target_p99_ms
            .is_some_and(|t| latency > Duration::from_millis(t));
        let sample = Sample {
            client,
            latency,
            error,
            slow,
        };
        self.window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record_sample(now_ms, sample);
    }

    /// What the window shows at `now_ms`.
    pub fn observe(&self, now_ms: u64) -> Observed {
        self.window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .observe(now_ms)
    }

    /// What the controller judges at `now_ms` (`Window::judge`: without the bad
    /// responses of the `min_clients - 1` worst clients).
    pub fn judged(&self, now_ms: u64, min_clients: u32) -> Observed {
        self.window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .judge(now_ms, min_clients as usize)
    }

    /// One controller step at `now_ms`; answers the new factor.
    pub fn tick(&self, settings: &Settings, now_ms: u64) -> Factor {
        let observed = self.judged(now_ms, settings.min_clients);
        let next = controller::next(self.factor(), settings, &observed);
        self.factor.store(next.0, Ordering::Relaxed);
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `max(1, floor(limit x factor))`, exactly.
    #[test]
    fn effective_limits() {
        let cases = [
            (1.0, 100, 100),
            (0.8, 100, 80),
            (0.64, 100, 64),
            (0.85, 100, 85),
            (0.7, 10, 7),
            (0.1, 5, 1),
            (0.1, 1, 1),
            (0.5, 3, 1),
            (0.999_999, u32::MAX, 4_294_963_000),
        ];
        for (f, limit, want) in cases {
            assert_eq!(Factor::from_f64(f).apply(limit), want, "{f} x {limit}");
        }
        assert_eq!(Factor::from_f64(0.0), Factor::from_ppm(1));
        assert_eq!(Factor::from_f64(f64::NAN), Factor::from_ppm(1));
        assert_eq!(Factor::from_f64(7.0), Factor::ONE);
    }

    /// A slow route's state steps down on explicit time, then back up once the slow
    /// responses have left the window.
    #[test]
    fn state_steps_on_explicit_time() {
        const T0: u64 = 1_764_000_000_000;
        let s = Settings {
            target_p99_ms: Some(200),
            max_error_rate: None,
            min_factor: Factor::DEFAULT_MIN,
            min_clients: 1,
        };
        let st = RouteState::default();
        assert!(st.factor().is_one());
        for i in 0..20 {
            st.record(T0 + i * 50, Duration::from_millis(500), false);
        }
        assert_eq!(st.tick(&s, T0 + 1_000), Factor::from_f64(0.8));
        assert_eq!(st.tick(&s, T0 + 2_000), Factor::from_f64(0.64));
        // 10 s after the slow second it has slid out: recovery.
        assert_eq!(st.tick(&s, T0 + 10_000), Factor::from_f64(0.69));
        assert_eq!(st.factor(), Factor::from_f64(0.69));
    }

    /// The controller moves the factor only when at least `min_clients` clients answer
    /// slow: two addresses (or every /64 of one IPv6 /48) sending nothing but slow
    /// requests, on explicit time, leave it at 1 however long they go on; five move it.
    #[test]
    fn min_clients_clients_move_the_factor() {
        const T0: u64 = 1_764_000_000_000;
        let s = Settings {
            target_p99_ms: Some(100),
            max_error_rate: Some(0.1),
            min_factor: Factor::DEFAULT_MIN,
            min_clients: DEFAULT_MIN_CLIENTS,
        };
        let clients = |ips: &[&str]| -> Vec<Client> {
            ips.iter()
                .map(|ip| client_id(ip.parse().unwrap(), 64))
                .collect()
        };
        let rows: [(&[&str], bool); 4] = [
            (&["192.0.2.1", "192.0.2.2"], false),
            (
                &[
                    "2001:db8:1:1::1",
                    "2001:db8:1:2::1",
                    "2001:db8:1:3::1",
                    "2001:db8:1:4::1",
                    "2001:db8:1:5::1",
                ],
                false,
            ),
            (&["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"], false),
            (
                &[
                    "192.0.2.1",
                    "192.0.2.2",
                    "192.0.2.3",
                    "192.0.2.4",
                    "192.0.2.5",
                ],
                true,
            ),
        ];
        for (bad, moves) in rows {
            let st = RouteState::default();
            let mut lowest = Factor::ONE;
            for second in 0..30u64 {
                let now = T0 + second * 1_000;
                for c in clients(&["198.51.100.1", "198.51.100.2"]) {
                    st.record_from(&s, now, c, Duration::from_millis(5), false);
                }
                for c in clients(bad) {
                    for _ in 0..10 {
                        st.record_from(&s, now, c, Duration::from_millis(400), true);
                    }
                }
                lowest = lowest.min(st.tick(&s, now + 999));
            }
            assert_eq!(lowest < Factor::ONE, moves, "{bad:?}: lowest {lowest:?}");
        }
    }

    /// An IPv6 subscriber's /64s (a /56 holds 256) are one client of the window; IPv4
    /// addresses and other sites are clients of their own.
    #[test]
    fn an_ipv6_site_is_one_client() {
        let id = |ip: &str| client_id(ip.parse().unwrap(), 64);
        assert_eq!(id("2001:db8:7:100::1"), id("2001:db8:7:2ff::9"));
        assert_ne!(id("2001:db8:7::1"), id("2001:db8:8::1"));
        assert_ne!(id("192.0.2.1"), id("192.0.2.2"));
    }
}
