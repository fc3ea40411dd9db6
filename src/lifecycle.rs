//! What the process must know to stop well: open proxy connections (capped, globally and
//! per peer address) and background work that must finish before exit (the violation log
//! flush, and on Redis the lease returns giving every leased token back). A gateway told
//! to stop exits as soon as both are zero instead of sleeping the whole grace period.
//!
//! Periodic background services are `every(period, f)`: one loop that honours shutdown,
//! delays a late tick, and may end with a last action the process waits for.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::time::MissedTickBehavior;

/// Open connections and unfinished shutdown work of one process.
#[derive(Debug, Default)]
pub struct Lifecycle {
    connections: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, u32>>,
    finishing: AtomicUsize,
    refusing: AtomicUsize,
    draining: AtomicBool,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `max_connections` connections are open.
    Total,
    /// `max_connections_per_ip` connections of this peer are open.
    PerIp,
}

impl Refused {
    /// The `reason` label of `throttle_connections_refused_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Total => "max_connections",
            Refused::PerIp => "per_ip",
        }
    }
}

/// The identity connections are counted by: an IPv4 address (also when carried in an
/// IPv6 one, as `limiter::canonical` reads it), else the IPv6 /64, so one client holding
/// a /64 is one client, as the `ip` scope counts it.
pub fn conn_key(ip: IpAddr) -> IpAddr {
    match crate::limiter::canonical(ip) {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !(u128::MAX >> 64);
            IpAddr::V6(std::net::Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

/// The proxy's `max_connections_per_ip` when not configured: max(16, max_connections / 16).
pub fn default_per_ip(max_connections: usize) -> u32 {
    u32::try_from(max_connections / 16)
        .unwrap_or(u32::MAX)
        .max(16)
}

/// An open connection; released on drop.
#[derive(Debug)]
pub struct ConnSlot {
    lifecycle: Arc<Lifecycle>,
    ip: Option<IpAddr>,
}

/// A refused connection being answered (the 503 write); released on drop.
#[derive(Debug)]
pub struct Refusing {
    lifecycle: Arc<Lifecycle>,
}

/// Refused connections answered at once; beyond this they are closed without an answer,
/// so a burst of refusals cannot itself use up the process's files.
pub const MAX_REFUSING: usize = 16;

/// Connections the admin listener keeps open at most (its own cap, apart from the proxy's).
pub const ADMIN_MAX_CONNECTIONS: usize = 64;

/// The admin listener's probe reserve: connections beyond its caps (`ADMIN_MAX_CONNECTIONS`,
/// `admin_max_connections_per_ip`) that may only ask `GET /healthz` or `GET /readyz`, one
/// request each, whose head must arrive within `PROBE_HEAD_TIMEOUT`. So whoever holds the
/// other slots, the kubelet's probes are answered.
pub const PROBE_SLOTS: usize = 64;

/// Probe-reserve connections one client (IPv4 address, IPv6 /64) holds at most.
pub const PROBE_SLOTS_PER_IP: u32 = 1;

/// How long a probe-reserve connection may take to send its request head.
pub const PROBE_HEAD_TIMEOUT: Duration = Duration::from_secs(1);

/// Connections the Envoy rate-limit service keeps open at most (its own cap). Envoy
/// multiplexes calls over a few HTTP/2 connections per worker, so this is ample.
pub const RLS_MAX_CONNECTIONS: usize = 256;

/// Unfinished shutdown work (a background task flushing state); released on drop.
#[derive(Debug)]
pub struct Finishing {
    lifecycle: Arc<Lifecycle>,
}

// === impl Lifecycle ===

impl Lifecycle {
    /// Takes a connection slot for `peer`, or says which cap refused it. `per_ip` caps are
    /// counted only when set (a trusted proxy's connections are not), per `conn_key`.
    ///
    /// # Errors
    /// `Refused` when a cap is reached; nothing is taken then.
    pub fn open(
        self: &Arc<Self>,
        peer: IpAddr,
        max: usize,
        per_ip: Option<u32>,
    ) -> Result<ConnSlot, Refused> {
        let before = self.connections.fetch_add(1, Ordering::AcqRel);
        let mut slot = ConnSlot {
            lifecycle: self.clone(),
            ip: None,
        };
        if before >= max {
            return Err(Refused::Total); // the slot's drop gives the count back
        }
        if let Some(cap) = per_ip {
            let mut m = self.per_ip.lock().unwrap_or_else(PoisonError::into_inner);
            let key = conn_key(peer);
            let n = m.entry(key).or_insert(0);
            if *n >= cap {
                return Err(Refused::PerIp);
            }
            *n += 1;
            slot.ip = Some(key);
        }
        Ok(slot)
    }

    /// Open proxy connections.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    /// Marks shutdown work as unfinished until the guard drops.
    pub fn finishing(self: &Arc<Self>) -> Finishing {
        self.finishing.fetch_add(1, Ordering::AcqRel);
        Finishing {
            lifecycle: self.clone(),
        }
    }

    /// A permit to answer a refused connection, unless `MAX_REFUSING` are being answered.
    pub fn refusing(self: &Arc<Self>) -> Option<Refusing> {
        let before = self.refusing.fetch_add(1, Ordering::AcqRel);
        let permit = Refusing {
            lifecycle: self.clone(),
        };
        (before < MAX_REFUSING).then_some(permit)
    }

    /// From the stop or upgrade signal on, every answer carries `Connection: close`, so
    /// clients move to the new process (or away) while this one still serves, instead of
    /// holding an idle keep-alive connection that Pingora closes when the grace period
    /// starts: a request sent on it just then would be lost.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// True once [`Lifecycle::drain`] was called.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// True when no connection is open and no shutdown work is pending.
    pub fn idle(&self) -> bool {
        self.connections() == 0 && self.finishing.load(Ordering::Acquire) == 0
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        if let Some(ip) = self.ip {
            let mut m = self
                .lifecycle
                .per_ip
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = m.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&ip);
                }
            }
        }
        self.lifecycle.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Refusing {
    fn drop(&mut self) {
        self.lifecycle.refusing.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Finishing {
    fn drop(&mut self) {
        self.lifecycle.finishing.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Raises the open-file soft limit to the hard limit and returns the new soft limit, so a
/// connection flood meets `max_connections` long before the process runs out of files.
pub fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!(error = %e, soft, hard, "cannot raise the open-file limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-file limit");
            1024
        }
    }
}

/// The default `max_connections` for an open-file limit `nofile` when `open` files are
/// already open: a margin (an eighth of the limit, 256 to 1024 files) stays free for the
/// runtimes' own descriptors, the admin listener, Redis, PostgreSQL, logs, and a burst of
/// connections accepted before their tasks run to refuse them (an accept loop takes up to
/// 128 in a row); the admin and rate-limit listeners' own caps are set aside too; every
/// proxied connection may hold an upstream connection as well. At least 16.
pub fn default_max_connections(nofile: u64, open: u64) -> usize {
    let margin = (nofile / 8).clamp(256, 1024);
    let others = (ADMIN_MAX_CONNECTIONS + PROBE_SLOTS + RLS_MAX_CONNECTIONS) as u64;
    let reserved = open.saturating_add(margin).saturating_add(others);
    let usable = nofile.saturating_sub(reserved) / 2;
    usize::try_from(usable).unwrap_or(usize::MAX).max(16)
}

/// Files this process has open now (`/proc/self/fd`); 64 when that cannot be read.
pub fn open_files() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(64, |d| d.count() as u64)
}

// === periodic background services ===

/// A background service running `f` every `period` until shutdown: a tick at once and then
/// every period (a late tick is delayed, not bunched up), each tick run to its end before
/// shutdown is looked at again, then the last action (`Every::at_shutdown`) if any, which
/// the process waits for when the service holds the lifecycle (`Every::finishing`).
pub fn every<F, Fut>(period: Duration, f: F) -> Every
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Every {
        period,
        tick: boxed(f),
        last: None,
        lifecycle: None,
    }
}

type Task = Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

fn boxed<F, Fut>(f: F) -> Task
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Box::new(move || Box::pin(f()))
}

/// A periodic background service (see `every`).
pub struct Every {
    period: Duration,
    tick: Task,
    last: Option<Task>,
    lifecycle: Option<Arc<Lifecycle>>,
}

// === impl Every ===

impl Every {
    /// Runs `f` once when shutdown is seen, after the last tick.
    pub fn at_shutdown<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.last = Some(boxed(f));
        self
    }

    /// Holds `lifecycle`'s shutdown work open while the service runs, so the process does
    /// not exit early before the last action is done.
    pub fn finishing(mut self, lifecycle: Arc<Lifecycle>) -> Self {
        self.lifecycle = Some(lifecycle);
        self
    }
}

#[async_trait]
impl BackgroundService for Every {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let _finishing = self.lifecycle.as_ref().map(Lifecycle::finishing);
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => (self.tick)().await,
            }
        }
        if let Some(last) = &self.last {
            last().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Caps refuse without taking anything; dropping a slot gives it back.
    #[test]
    fn caps_total_and_per_ip() {
        let l = Arc::new(Lifecycle::default());
        let a = l.open(ip("10.0.0.1"), 3, Some(2)).unwrap();
        let _b = l.open(ip("10.0.0.1"), 3, Some(2)).unwrap();
        assert_eq!(
            l.open(ip("10.0.0.1"), 3, Some(2)).unwrap_err(),
            Refused::PerIp
        );
        let _c = l.open(ip("10.0.0.2"), 3, Some(2)).unwrap();
        assert_eq!(
            l.open(ip("10.0.0.3"), 3, Some(2)).unwrap_err(),
            Refused::Total
        );
        assert_eq!(l.connections(), 3);
        drop(a);
        assert_eq!(l.connections(), 2);
        let _d = l.open(ip("10.0.0.1"), 3, Some(2)).unwrap();
        assert!(!l.idle());
    }

    /// One client is one identity: an IPv4 address, IPv4 carried in IPv6 included, or an
    /// IPv6 /64; a cap counts the /64 as a whole.
    #[test]
    fn connections_count_per_client_identity() {
        let cases = [
            ("192.0.2.7", "192.0.2.7"),
            ("::ffff:192.0.2.7", "192.0.2.7"),
            ("64:ff9b::192.0.2.7", "192.0.2.7"),
            ("::192.0.2.7", "192.0.2.7"),
            ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::"),
            ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::"),
            ("2001:db8:1:3::1", "2001:db8:1:3::"),
            ("::1", "::"),
        ];
        for (input, want) in cases {
            assert_eq!(conn_key(ip(input)), ip(want), "{input}");
        }
        let l = Arc::new(Lifecycle::default());
        let _a = l.open(ip("2001:db8::1"), 10, Some(2)).unwrap();
        let _b = l.open(ip("2001:db8::2"), 10, Some(2)).unwrap();
        let third = l.open(ip("2001:db8::ffff:3"), 10, Some(2));
        assert_eq!(third.unwrap_err(), Refused::PerIp);
        let _c = l.open(ip("2001:db8:0:1::1"), 10, Some(2)).unwrap();
        let _d = l.open(ip("::ffff:10.0.0.1"), 10, Some(1)).unwrap();
        assert_eq!(
            l.open(ip("10.0.0.1"), 10, Some(1)).unwrap_err(),
            Refused::PerIp
        );
    }

    /// The proxy's default per-address cap: max(16, max_connections / 16).
    #[test]
    fn default_per_ip_cap() {
        for (max, want) in [(10, 16), (256, 16), (512, 32), (100_000, 6250)] {
            assert_eq!(default_per_ip(max), want, "{max}");
        }
    }

    /// Idle only when no connection and no shutdown work remain.
    #[test]
    fn idle_waits_for_finishing_work() {
        let l = Arc::new(Lifecycle::default());
        let f = l.finishing();
        assert!(!l.idle());
        drop(f);
        assert!(l.idle());
    }

    /// The cap leaves what is open and a margin free; never under 16.
    #[test]
    fn default_cap_keeps_a_reserve() {
        let others = ADMIN_MAX_CONNECTIONS + PROBE_SLOTS + RLS_MAX_CONNECTIONS;
        assert_eq!(
            default_max_connections(1024, 30),
            (1024 - 30 - 256 - others) / 2
        );
        assert_eq!(
            default_max_connections(4096, 33),
            (4096 - 33 - 512 - others) / 2
        );
        assert_eq!(
            default_max_connections(1_048_576, 40),
            (1_048_576 - 40 - 1024 - others) / 2
        );
        assert_eq!(default_max_connections(128, 33), 16);
        assert_eq!(default_max_connections(10, 5), 16);
    }

    /// Refusals in flight are bounded: past the bound a refusal is a plain close.
    #[test]
    fn refusals_in_flight_are_bounded() {
        let l = Arc::new(Lifecycle::default());
        let held: Vec<_> = (0..MAX_REFUSING).map(|_| l.refusing().unwrap()).collect();
        assert!(l.refusing().is_none());
        drop(held);
        assert!(l.refusing().is_some());
    }
}
