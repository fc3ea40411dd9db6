//! `X-RateLimit-*` and `Retry-After`: pure formatting of a decision at a time.
//!
//! Reset and retry are relative in a `Decision`; they become absolute here, against
//! the gateway's own clock reading taken at decision time.

use http::HeaderValue;

use crate::limiter::WindowDecision;

/// Header name of the limit.
pub const LIMIT: &str = "x-ratelimit-limit";
/// Header name of the remaining count.
pub const REMAINING: &str = "x-ratelimit-remaining";
/// Header name of the reset time (Unix seconds).
pub const RESET: &str = "x-ratelimit-reset";
/// `Retry-After`.
pub const RETRY_AFTER: &str = "retry-after";

/// The rate-limit headers of one governing window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateHeaders {
    /// `X-RateLimit-Limit`.
    pub limit: u32,
    /// `X-RateLimit-Remaining` (0 on a rejection).
    pub remaining: u32,
    /// `X-RateLimit-Reset`: Unix seconds, rounded up.
    pub reset: u64,
    /// `Retry-After` in whole seconds (rounded up, at least 1), on rejections only.
    pub retry_after: Option<u64>,
}

// === impl RateHeaders ===

impl RateHeaders {
    /// Headers for `wd` decided at `now_ms`; `rejected` adds `Retry-After` and zeroes Remaining.
    pub fn new(wd: &WindowDecision, now_ms: u64, rejected: bool) -> Self {
        let d = &wd.decision;
        Self {
            limit: d.limit,
            remaining: if rejected { 0 } else { d.remaining },
            reset: now_ms.saturating_add(d.reset_after_ms).div_ceil(1000),
            retry_after: rejected.then(|| retry_after_secs(d.retry_after_ms)),
        }
    }

    /// `(name, value)` pairs. The values share one buffer: one allocation for all of
    /// them (a `HeaderValue` of its own each would cost one apiece).
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, HeaderValue)> {
        let mut buf = itoa::Buffer::new();
        let mut out = bytes::BytesMut::with_capacity(48);
        let mut ends = [0usize; 4];
        let numbers = [
            Some(u64::from(self.limit)),
            Some(u64::from(self.remaining)),
            Some(self.reset),
            self.retry_after,
        ];
        for (i, n) in numbers.iter().enumerate() {
            if let Some(n) = n {
                out.extend_from_slice(buf.format(*n).as_bytes());
            }
            ends[i] = out.len();
        }
        let all = out.freeze();
        let names = [LIMIT, REMAINING, RESET, RETRY_AFTER];
        (0..4).filter_map(move |i| {
            numbers[i]?;
            let start = if i == 0 { 0 } else { ends[i - 1] };
            let v = HeaderValue::from_maybe_shared(all.slice(start..ends[i])).ok()?;
            Some((names[i], v))
        })
    }
}

/// Whole seconds for `Retry-After`: rounded up, at least 1.
pub fn retry_after_secs(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Decision, Scope, Window};

    fn wd(remaining: u32, reset: u64, retry: u64) -> WindowDecision {
        WindowDecision {
            scope: Scope::Key,
            window: Window::Minute,
            decision: Decision {
                allowed: retry == 0,
                limit: 100,
                remaining,
                current: 1,
                reset_after_ms: reset,
                retry_after_ms: retry,
            },
        }
    }

    fn rendered(h: &RateHeaders) -> Vec<(String, String)> {
        h.pairs()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
            .collect()
    }

    /// A pass carries Limit, Remaining and Reset (rounded up to the second).
    #[test]
    fn pass_headers() {
        let h = RateHeaders::new(&wd(42, 1_500, 0), 1_764_000_000_200, false);
        assert_eq!(
            rendered(&h),
            [
                ("x-ratelimit-limit", "100"),
                ("x-ratelimit-remaining", "42"),
                ("x-ratelimit-reset", "1764000002")
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
    }

    /// A rejection has Remaining 0 and Retry-After rounded up, at least 1.
    #[test]
    fn reject_headers() {
        let h = RateHeaders::new(&wd(3, 60_000, 1_001), 1_764_000_000_000, true);
        assert_eq!((h.remaining, h.retry_after), (0, Some(2)));
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1000), 1);
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(
            rendered(&h).last().unwrap(),
            &("retry-after".to_string(), "2".to_string())
        );
    }
}
