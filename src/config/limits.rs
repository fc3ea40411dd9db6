//! The one validation of a window limit, shared by `gateway.toml` (`validate`) and the
//! limits the database supplies (a policy row, a key's `custom_override`): a limit that
//! passes here is exact in Rust and in Redis' Lua (doubles), and bounded in memory.

use crate::limiter::algorithm::{Calendar, MAX_EXACT_PRODUCT};
use crate::limiter::{Admission, Algorithm, Fleet, ScopeLimits, Window, WindowLimit};

/// Largest accepted limit: keeps Redis' Lua numbers (doubles) exact.
pub const MAX_LIMIT: u64 = 1_000_000_000;
/// Largest `sliding_log` limit: the log holds one entry per admitted request.
pub const MAX_SLIDING_LOG: u32 = 100_000;
/// Accepted `burst_multiplier` range.
pub const BURST_RANGE: std::ops::RangeInclusive<f64> = 1.0..=1000.0;

/// A limit refused; the message names the field (`per_day`, `burst_multiplier`, ...).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    /// A window of 0.
    #[error("{field} must be at least 1 (a zero limit blocks everything; use [[blocks]])")]
    Zero {
        /// The field.
        field: String,
    },
    /// Above `MAX_LIMIT`.
    #[error("{field} = {limit} is above the maximum of {MAX_LIMIT}")]
    AboveMax {
        /// The field.
        field: String,
        /// The value given.
        limit: u64,
    },
    /// A `sliding_log` window above `MAX_SLIDING_LOG`.
    #[error("{field} = {limit} is too large for sliding_log (one entry per request; max {MAX_SLIDING_LOG}): use sliding_window")]
    SlidingLog {
        /// The field.
        field: String,
        /// The value given.
        limit: u32,
    },
    /// limit x burst x window beyond 2^52.
    #[error("{field} = {limit} is too large for {} (limit x burst x window must stay below 2^52 for exact arithmetic; max {max}): use fixed_window", algorithm.as_str())]
    Inexact {
        /// The field.
        field: String,
        /// The value given.
        limit: u32,
        /// The window's algorithm.
        algorithm: Algorithm,
        /// The largest exact value for this window.
        max: u64,
    },
    /// A burst multiplier outside `BURST_RANGE`.
    #[error("{field} must be between 1.0 and 1000, got {value}")]
    Burst {
        /// The field.
        field: String,
        /// The value given.
        value: f64,
    },
    /// Not a whole number (negative, fractional, a string...).
    #[error("{field} must be a whole number from 1 to {MAX_LIMIT}, got {value}")]
    NotALimit {
        /// The field.
        field: String,
        /// The value given, as written.
        value: String,
    },
    /// A window no request of the costliest route can ever fit in.
    #[error("{field} = {capacity} is below the cost {cost} of the costliest route: no request could ever pass")]
    BelowCost {
        /// The field.
        field: String,
        /// The window's capacity (its limit, times the burst for a token bucket).
        capacity: u32,
        /// The highest route cost of the config.
        cost: u32,
    },
    /// Not a window field.
    #[error(
        "unknown field {field:?} (expected per_second, per_minute, per_hour, per_day or per_month)"
    )]
    UnknownField {
        /// The field.
        field: String,
    },
    /// Not an algorithm's name.
    #[error("{field} = {value:?} is not an algorithm (token_bucket, sliding_window, fixed_window, sliding_log or leaky_bucket)")]
    UnknownAlgorithm {
        /// The field.
        field: String,
        /// The value given.
        value: String,
    },
    /// A value of the wrong shape as a whole (an override that is not an object).
    #[error("{field} must be a JSON object of per_second .. per_month")]
    NotAnObject {
        /// The field.
        field: String,
    },
    /// A window of a `fleet = "regions"` table counted by another algorithm than
    /// `fixed_window` (a database policy row's `algorithm`).
    #[error("{field}: fleet = \"regions\" counts fixed_window windows only, not {}: only a fixed window has a start every region agrees on, to carry allotments and grants across regions", algorithm.as_str())]
    FleetAlgorithm {
        /// The field.
        field: String,
        /// The algorithm asked for.
        algorithm: Algorithm,
    },
}

/// How a scope builds its windows beyond their limits: the burst, the algorithm and the
/// reset jitter. What a database policy row or a key's `custom_override` builds new key
/// windows with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowSettings {
    /// `burst_multiplier` (1.0 when unset).
    pub burst_multiplier: f64,
    /// The scope's `algorithm`; None: each window's default.
    pub algorithm: Option<Algorithm>,
    /// `reset_jitter_secs`, in ms (day and month windows only).
    pub jitter_ms: u64,
    /// `admission` (Redis only).
    pub admission: Admission,
    /// `calendar_tz` / `billing_anchor_day`: where day, week and month windows start
    /// (None: UTC, the 1st).
    pub calendar: Option<&'static Calendar>,
    /// `fleet`: who shares the windows. Windows the database adds later (a policy row,
    /// a key's override) take the tier's, so no column is needed for it.
    pub fleet: Fleet,
}

// === impl LimitError ===

impl LimitError {
    /// The field the error is about.
    pub fn field(&self) -> &str {
        match self {
            LimitError::Zero { field }
            | LimitError::AboveMax { field, .. }
            | LimitError::SlidingLog { field, .. }
            | LimitError::Inexact { field, .. }
            | LimitError::Burst { field, .. }
            | LimitError::NotALimit { field, .. }
            | LimitError::BelowCost { field, .. }
            | LimitError::UnknownField { field }
            | LimitError::UnknownAlgorithm { field, .. }
            | LimitError::FleetAlgorithm { field, .. }
            | LimitError::NotAnObject { field } => field,
        }
    }

    /// The same error about the field `to` (e.g. a table column `req_per_minute` for the
    /// window `per_minute`); a `FleetAlgorithm` error stays about `algorithm`.
    #[must_use]
    pub fn for_field(mut self, to: impl Into<String>) -> Self {
        let to = to.into();
        match &mut self {
            LimitError::Zero { field }
            | LimitError::AboveMax { field, .. }
            | LimitError::SlidingLog { field, .. }
            | LimitError::Inexact { field, .. }
            | LimitError::Burst { field, .. }
            | LimitError::NotALimit { field, .. }
            | LimitError::BelowCost { field, .. }
            | LimitError::UnknownField { field }
            | LimitError::UnknownAlgorithm { field, .. }
            | LimitError::NotAnObject { field } => *field = to,
            // About the algorithm, whichever window met it first.
            LimitError::FleetAlgorithm { .. } => {}
        }
        self
    }
}

// === impl WindowSettings ===

impl Default for WindowSettings {
    fn default() -> Self {
        Self {
            burst_multiplier: 1.0,
            algorithm: None,
            jitter_ms: 0,
            admission: Admission::Auto,
            calendar: None,
            fleet: Fleet::Local,
        }
    }
}

impl WindowSettings {
    /// The algorithm of `window` under these settings: the scope's, else `fixed_window`
    /// for a `fleet = "regions"` table (the only one that carries across regions, so
    /// `per_second = 100, fleet = "regions"` needs nothing more), else the window's
    /// default.
    pub fn algorithm_of(&self, window: Window) -> Algorithm {
        match (self.algorithm, self.fleet) {
            (Some(a), _) => a,
            (None, Fleet::Regions) => Algorithm::FixedWindow,
            (None, _) => window.default_algorithm(),
        }
    }

    /// `limit` per `window` with these settings, validated (`window_limit`); a
    /// `fleet = "regions"` window counted by another algorithm than `fixed_window` is
    /// refused.
    ///
    /// # Errors
    /// `LimitError` naming the window's field.
    pub fn window(&self, window: Window, limit: u64) -> Result<WindowLimit, LimitError> {
        let algorithm = self.algorithm_of(window);
        if self.fleet == Fleet::Regions && algorithm != Algorithm::FixedWindow {
            return Err(LimitError::FleetAlgorithm {
                field: "algorithm".into(),
                algorithm,
            });
        }
        window_limit(
            window,
            limit,
            algorithm,
            self.burst_multiplier,
            self.jitter_ms,
        )
        .map(|w| WindowLimit {
            fleet: self.fleet,
            ..w.with_admission(self.admission)
                .with_calendar(self.calendar)
        })
    }
}

/// `v` when it is a valid `burst_multiplier` (finite, 1.0 to 1000).
///
/// # Errors
/// `LimitError::Burst`.
pub fn burst_multiplier(v: f64) -> Result<f64, LimitError> {
    if v.is_finite() && BURST_RANGE.contains(&v) {
        Ok(v)
    } else {
        Err(LimitError::Burst {
            field: "burst_multiplier".into(),
            value: v,
        })
    }
}

/// `limit` per `window`, counted by `algorithm`, with token-bucket capacity
/// `limit x burst` and reset jitter `jitter_ms`: the one constructor of a validated
/// window, for the config and the database alike.
///
/// Refused: 0, above `MAX_LIMIT`, a `sliding_log` above `MAX_SLIDING_LOG`, any product of
/// the algorithm (limit or capacity x window length) beyond 2^52, a burst outside
/// `BURST_RANGE`.
///
/// # Errors
/// `LimitError` naming the window's field (`per_day`, ...) or `burst_multiplier`.
pub fn window_limit(
    window: Window,
    limit: u64,
    algorithm: Algorithm,
    burst: f64,
    jitter_ms: u64,
) -> Result<WindowLimit, LimitError> {
    let field = || window.config_key().to_string();
    if limit == 0 {
        return Err(LimitError::Zero { field: field() });
    }
    let Some(n) = u32::try_from(limit).ok().filter(|_| limit <= MAX_LIMIT) else {
        return Err(LimitError::AboveMax {
            field: field(),
            limit,
        });
    };
    let burst = burst_multiplier(burst)?;
    let wl = WindowLimit::with_algorithm(window, n, algorithm)
        .with_burst(burst)
        .with_jitter_ms(jitter_ms);
    exact_bounds(&wl)?;
    Ok(wl)
}

/// Keeps every product of the algorithms exact (u64 here, a double in Lua) and the exact
/// log's memory bounded.
fn exact_bounds(wl: &WindowLimit) -> Result<(), LimitError> {
    let field = wl.window.config_key().to_string();
    // The longest calendar month, for the sliding counter's month windows.
    let len = if wl.window == Window::Month {
        31 * 86_400_000
    } else {
        wl.window.period_ms()
    };
    let product = match wl.algorithm {
        Algorithm::FixedWindow => 0,
        Algorithm::SlidingLog if wl.limit > MAX_SLIDING_LOG => {
            return Err(LimitError::SlidingLog {
                field,
                limit: wl.limit,
            });
        }
        Algorithm::SlidingLog => 0,
        Algorithm::TokenBucket => u64::from(wl.capacity).saturating_mul(len),
        Algorithm::SlidingWindow | Algorithm::LeakyBucket => {
            u64::from(wl.limit).saturating_mul(len)
        }
    };
    if product > MAX_EXACT_PRODUCT {
        return Err(LimitError::Inexact {
            field,
            limit: wl.limit,
            algorithm: wl.algorithm,
            max: MAX_EXACT_PRODUCT / len,
        });
    }
    Ok(())
}

/// The algorithm named `value` (the `gateway.toml` spelling).
///
/// # Errors
/// `LimitError::UnknownAlgorithm` naming `field`.
pub fn parse_algorithm(field: &str, value: &str) -> Result<Algorithm, LimitError> {
    Algorithm::parse(value).ok_or_else(|| LimitError::UnknownAlgorithm {
        field: field.to_string(),
        value: value.to_string(),
    })
}

/// Refuses a scope with a window smaller than `cost` (the highest route cost): a key
/// under it could never pass on the costliest route, and the config refuses the same.
///
/// # Errors
/// `LimitError::BelowCost` naming the first such window.
pub fn check_cost(limits: &ScopeLimits, cost: u32) -> Result<(), LimitError> {
    match limits.windows.iter().find(|w| w.capacity < cost) {
        Some(w) => Err(LimitError::BelowCost {
            field: w.window.config_key().to_string(),
            capacity: w.capacity,
            cost,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared checks, with messages naming the field.
    #[test]
    fn refuses_what_the_config_refuses() {
        let ok = window_limit(Window::Minute, 100, Algorithm::TokenBucket, 1.5, 0).unwrap();
        assert_eq!((ok.limit, ok.capacity), (100, 150));
        let err = |w, n, a, b| window_limit(w, n, a, b, 0).unwrap_err();
        let e = err(Window::Day, 1_000_000_000, Algorithm::SlidingWindow, 1.0);
        assert_eq!(e.field(), "per_day");
        assert!(
            e.to_string()
                .starts_with("per_day = 1000000000 is too large for sliding_window"),
            "{e}"
        );
        let e = err(Window::Hour, 200_000, Algorithm::SlidingLog, 1.0);
        assert!(matches!(e, LimitError::SlidingLog { .. }), "{e}");
        assert!(matches!(
            err(Window::Second, 0, Algorithm::TokenBucket, 1.0),
            LimitError::Zero { .. }
        ));
        assert!(matches!(
            err(Window::Month, MAX_LIMIT + 1, Algorithm::FixedWindow, 1.0),
            LimitError::AboveMax { .. }
        ));
        let e = err(Window::Second, 5, Algorithm::TokenBucket, 0.5);
        assert_eq!(e.field(), "burst_multiplier");
        // A fixed window is exact at any size.
        window_limit(Window::Month, MAX_LIMIT, Algorithm::FixedWindow, 1.0, 0).unwrap();
        assert_eq!(e.for_field("req_x").field(), "req_x");
    }
}
