//! Wall-clock time for limiter decisions, injected so tests can step it exactly.
//!
//! Limiter time is Unix epoch milliseconds (`u64`), not `Instant`: `X-RateLimit-Reset`
//! is absolute Unix seconds and state shared through Redis is read by many processes.
//! Timers and deadlines use tokio time instead (pausable in tests).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A source of wall-clock time in Unix epoch milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch. Never panics; may go backwards (NTP), so
    /// algorithms saturate differences at zero.
    fn now_ms(&self) -> u64;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// A clock that moves only when told to. Clones share one time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

/// What [`SystemClock`] adds to the system's time (ms): 0 unless the process was started
/// with `THROTTLE_CLOCK_START_MS` (see [`start_at`]).
static SHIFT_MS: AtomicI64 = AtomicI64::new(0);

/// Starts the process's clock at `start_ms` (Unix ms): from now on [`SystemClock`] reads
/// `start_ms` plus the real time elapsed since this call, and the Redis store sends that
/// time with every script call instead of using Redis `TIME`. For tests and drills of
/// calendar edges (a DST day, the end of a month) against the real binary; `throttle run`
/// calls it when `THROTTLE_CLOCK_START_MS` is set and says so in its log.
pub fn start_at(start_ms: u64) {
    SHIFT_MS.store(0, Ordering::SeqCst);
    let real = SystemClock.now_ms();
    let shift = i64::try_from(start_ms)
        .unwrap_or(i64::MAX)
        .saturating_sub(i64::try_from(real).unwrap_or(i64::MAX));
    SHIFT_MS.store(shift, Ordering::SeqCst);
}

/// Whether the clock was moved by [`start_at`].
pub fn shifted() -> bool {
    SHIFT_MS.load(Ordering::Relaxed) != 0
}

// === impl SystemClock ===

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one sanctioned read of the system clock
    fn now_ms(&self) -> u64 {
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        match SHIFT_MS.load(Ordering::Relaxed) {
            0 => real,
            shift => real.saturating_add_signed(shift),
        }
    }
}

// === impl ManualClock ===

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn at(now_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(now_ms)))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms`.
    pub fn set(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}
