//! The five algorithms as pure step functions of (state, limit, now, cost).
//!
//! `step(state, limit, now, offset, cost, commit)` returns the `Decision` and writes the
//! next state into `state` only when `commit` is set and the request is allowed. A dry run
//! (`commit = false`) never writes, which is how the layered check evaluates every scope
//! before charging any. Each file here has a Lua twin in `lua/` with the same math.
//!
//! All arithmetic is integer milliseconds, so `retry_after` is exact: a request at
//! `now + retry_after` is admitted and one a millisecond earlier is not. Config validation
//! bounds `limit x window_ms` (capacity for the token bucket) by 2^52, so every product
//! fits a u64 here and a Lua double in Redis; operations saturate all the same.

pub mod fixed_window;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use super::decision::Decision;
use super::policy::{Algorithm, Window, WindowLimit};

/// The state of one window of one identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Token bucket: level in token-ms units.
    TokenBucket(token_bucket::Bucket),
    /// Leaky bucket: level in token-ms units.
    LeakyBucket(leaky_bucket::Meter),
    /// Fixed window counter.
    FixedWindow(fixed_window::Counter),
    /// Sliding-window counter.
    SlidingWindow(sliding_window::Counters),
    /// Exact log, boxed to keep `State` small.
    SlidingLog(Box<sliding_log::Log>),
}

// === impl State ===

impl State {
    /// The state of an identity never seen before (or evicted after returning to it).
    pub fn initial(algorithm: Algorithm) -> State {
        match algorithm {
            Algorithm::TokenBucket => State::TokenBucket(token_bucket::Bucket::FULL),
            Algorithm::LeakyBucket => State::LeakyBucket(leaky_bucket::Meter::EMPTY),
            Algorithm::FixedWindow => State::FixedWindow(fixed_window::Counter::default()),
            Algorithm::SlidingWindow => State::SlidingWindow(sliding_window::Counters::default()),
            Algorithm::SlidingLog => State::SlidingLog(Box::default()),
        }
    }

    /// A copy when copying is cheap (every state but the log), so a dry run can compute
    /// the next state once and the charge merely store it.
    pub fn cheap_copy(&self) -> Option<State> {
        match self {
            State::SlidingLog(_) => None,
            other => Some(other.clone()),
        }
    }

    fn matches(&self, algorithm: Algorithm) -> bool {
        matches!(
            (self, algorithm),
            (State::TokenBucket(_), Algorithm::TokenBucket)
                | (State::LeakyBucket(_), Algorithm::LeakyBucket)
                | (State::FixedWindow(_), Algorithm::FixedWindow)
                | (State::SlidingWindow(_), Algorithm::SlidingWindow)
                | (State::SlidingLog(_), Algorithm::SlidingLog)
        )
    }
}

/// Applies `limit`'s algorithm to `state` at `now_ms` for a request of `cost`.
///
/// `offset_ms` shifts window boundaries (reset jitter, `< limit.jitter_ms`). A state of the
/// wrong variant (the algorithm changed on reload) is treated as initial.
pub fn step(
    state: &mut State,
    limit: &WindowLimit,
    now_ms: u64,
    offset_ms: u64,
    cost: u32,
    commit: bool,
) -> Decision {
    if !state.matches(limit.algorithm) {
        *state = State::initial(limit.algorithm);
    }
    let cost = cost.max(1);
    match state {
        State::TokenBucket(b) => token_bucket::step(b, limit, now_ms, cost, commit),
        State::LeakyBucket(m) => leaky_bucket::step(m, limit, now_ms, cost, commit),
        State::FixedWindow(c) => fixed_window::step(c, limit, now_ms, offset_ms, cost, commit),
        State::SlidingWindow(c) => sliding_window::step(c, limit, now_ms, offset_ms, cost, commit),
        State::SlidingLog(l) => sliding_log::step(l, limit, now_ms, cost, commit),
    }
}

/// The `[start, end)` of the epoch-aligned window containing `now_ms`, shifted by `offset_ms`.
/// `Month` is the calendar month in UTC.
pub fn bounds(window: Window, now_ms: u64, offset_ms: u64) -> (u64, u64) {
    let t = now_ms.saturating_sub(offset_ms);
    let (start, end) = match window {
        Window::Month => month_bounds(t),
        w => {
            let p = w.period_ms();
            let start = t - t % p;
            (start, start + p)
        }
    };
    (start + offset_ms, end + offset_ms)
}

const DAY_MS: u64 = 86_400_000;

fn month_bounds(t: u64) -> (u64, u64) {
    let (y, m, _) = civil_from_days((t / DAY_MS) as i64);
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let start = days_from_civil(y, m, 1).max(0) as u64 * DAY_MS;
    let end = days_from_civil(ny, nm, 1).max(0) as u64 * DAY_MS;
    (start, end)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The (year, month, day) of a day count since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The largest `limit x window_ms` accepted: with headroom for sums, exact in a double (Lua).
pub const MAX_EXACT_PRODUCT: u64 = 1 << 52;

/// `ceil(a / b)`; `b = 0` counts as 1.
pub(crate) fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

/// Saturating narrowing for values that fit by construction.
pub(crate) fn to_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
pub(crate) mod testkit;

#[cfg(test)]
mod tests {
    use super::*;

    /// Month windows follow the calendar, including leap years and year ends.
    #[test]
    fn month_bounds_follow_the_calendar() {
        let ms = |y, m, d| days_from_civil(y, m, d) as u64 * DAY_MS;
        let cases = [
            (ms(2024, 2, 10), ms(2024, 2, 1), ms(2024, 3, 1)), // leap February: 29 days
            (ms(2025, 2, 28) + 5, ms(2025, 2, 1), ms(2025, 3, 1)),
            (
                ms(2026, 12, 31) + DAY_MS - 1,
                ms(2026, 12, 1),
                ms(2027, 1, 1),
            ),
            (ms(2027, 1, 1), ms(2027, 1, 1), ms(2027, 2, 1)),
        ];
        for (i, (now, start, end)) in cases.into_iter().enumerate() {
            assert_eq!(bounds(Window::Month, now, 0), (start, end), "case {i}");
        }
        assert_eq!(ms(2024, 3, 1) - ms(2024, 2, 1), 29 * DAY_MS);
        assert_eq!(
            civil_from_days(days_from_civil(2026, 11, 29)),
            (2026, 11, 29)
        );
    }

    /// Fixed-length windows align to the epoch; an offset shifts both edges.
    #[test]
    fn bounds_align_to_epoch_and_shift_by_offset() {
        assert_eq!(bounds(Window::Minute, 125_000, 0), (120_000, 180_000));
        assert_eq!(bounds(Window::Day, DAY_MS + 10, 0), (DAY_MS, 2 * DAY_MS));
        assert_eq!(bounds(Window::Day, DAY_MS + 10, 20), (20, DAY_MS + 20));
        assert_eq!(
            bounds(Window::Day, DAY_MS + 30, 20),
            (DAY_MS + 20, 2 * DAY_MS + 20)
        );
    }
}
