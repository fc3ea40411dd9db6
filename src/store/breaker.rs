//! A circuit breaker around the shared store: after `threshold` consecutive failures
//! (errors or missed deadlines) it opens and requests stop waiting on the store at all;
//! after `cooldown` one request is let through as a probe (half-open); a success closes
//! it, a failure opens it again. One log line per transition, never per request.
//!
//! Time is tokio time, so tests drive it with `start_paused` and `advance`.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The breaker's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go to the store.
    Closed,
    /// Calls skip the store until the cooldown ends.
    Open,
    /// One probe call is in flight; the others skip the store.
    HalfOpen,
}

#[derive(Debug)]
enum Inner {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// A probe left at `since`; if it never reports (its future was dropped), another
    /// probe may go after a cooldown, so the breaker cannot stay half-open for good.
    HalfOpen {
        since: Instant,
    },
}

/// See the module docs.
#[derive(Debug)]
pub struct CircuitBreaker {
    inner: Mutex<Inner>,
    threshold: u32,
    cooldown: Duration,
}

// === impl CircuitBreaker ===

impl CircuitBreaker {
    /// Opens after `threshold` consecutive failures; probes every `cooldown`.
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner::Closed { failures: 0 }),
            threshold: threshold.max(1),
            cooldown,
        }
    }

    /// Whether this call may go to the store (a half-open probe included).
    pub fn allow(&self) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match *inner {
            Inner::Closed { .. } => true,
            Inner::Open { until } if Instant::now() >= until => {
                *inner = Inner::HalfOpen {
                    since: Instant::now(),
                };
                true
            }
            Inner::HalfOpen { since } if Instant::now() >= since + self.cooldown => {
                *inner = Inner::HalfOpen {
                    since: Instant::now(),
                };
                true
            }
            Inner::Open { .. } | Inner::HalfOpen { .. } => false,
        }
    }

    /// The store answered.
    pub fn success(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if !matches!(*inner, Inner::Closed { .. }) {
            tracing::info!(
                "limit store answered again: circuit closed, decisions are shared again"
            );
        }
        *inner = Inner::Closed { failures: 0 };
    }

    /// The store failed or missed its deadline.
    pub fn failure(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let open = Inner::Open {
            until: Instant::now() + self.cooldown,
        };
        *inner = match *inner {
            Inner::Closed { failures } if failures + 1 >= self.threshold => {
                tracing::warn!(failures = failures + 1, "limit store failing: circuit open, deciding by on_failure without waiting on it");
                open
            }
            Inner::Closed { failures } => Inner::Closed {
                failures: failures + 1,
            },
            Inner::HalfOpen { .. } | Inner::Open { .. } => open,
        };
    }

    /// The current position.
    pub fn state(&self) -> BreakerState {
        match *self.inner.lock().unwrap_or_else(PoisonError::into_inner) {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Closed -> open after the threshold -> half-open probe after the cooldown -> closed.
    #[tokio::test(start_paused = true)]
    async fn opens_probes_and_closes() {
        let b = CircuitBreaker::new(3, Duration::from_millis(500));
        b.failure();
        b.failure();
        assert_eq!(b.state(), BreakerState::Closed);
        b.success(); // a success resets the count
        for _ in 0..3 {
            assert!(b.allow());
            b.failure();
        }
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.allow());
        tokio::time::advance(Duration::from_millis(499)).await;
        assert!(!b.allow());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(b.allow(), "the probe");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(!b.allow(), "only one probe at a time");
        b.failure();
        assert_eq!(b.state(), BreakerState::Open);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(b.allow());
        b.success();
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow());
    }

    /// A probe that never reports (its future was dropped mid-call) does not leave the
    /// breaker half-open for good: another probe goes after a cooldown.
    #[tokio::test(start_paused = true)]
    async fn a_lost_probe_is_replaced() {
        let b = CircuitBreaker::new(1, Duration::from_millis(500));
        b.failure();
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(b.allow(), "the probe");
        // ... whose future is dropped: neither success nor failure is reported.
        assert!(!b.allow());
        tokio::time::advance(Duration::from_millis(499)).await;
        assert!(!b.allow(), "still waiting on the first probe");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(b.allow(), "a second probe after the cooldown");
        b.success();
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
