//! `X-RateLimit-*`, the IETF `RateLimit-Policy` / `RateLimit` pair and `Retry-After`:
//! pure formatting of a decision at a time.
//!
//! Reset and retry are relative in a `Decision`; they become absolute here, against
//! the gateway's own clock reading taken at decision time.
//!
//! The IETF family follows draft-ietf-httpapi-ratelimit-headers-11, serialized as
//! Structured Field lists (RFC 8941) by `sfv`: `RateLimit-Policy` names every window of
//! the request's check, `"<scope>-<window>";q=<limit>;w=<seconds>`; `RateLimit` names the
//! governing window (the fewest remaining, or the rejecting one),
//! `"<scope>-<window>";r=<remaining>;t=<seconds until a full limit is admitted again>`.

use http::HeaderValue;
use sfv::{RefBareItem, RefListSerializer};

use crate::config::RateLimitHeaders;
use crate::limiter::{Quota, Scope, Window, WindowDecision};

/// Header name of the limit.
pub const LIMIT: &str = "x-ratelimit-limit";
/// Header name of the remaining count.
pub const REMAINING: &str = "x-ratelimit-remaining";
/// Header name of the reset time (Unix seconds).
pub const RESET: &str = "x-ratelimit-reset";
/// `Retry-After`.
pub const RETRY_AFTER: &str = "retry-after";
/// `Retry-After`'s value on an answer that a moment may change (not ready, no database
/// yet, a store away, too many connections, a concurrency slot taken): one second.
pub const RETRY_SOON: &str = "1";

/// What a window has left before this call spends: a decision of `cost` (a look,
/// `Check::peek`, or a charge) reports what is left after it; `/v1/usage` and the RLS's
/// uncharged statuses add `cost` back (never above `limit`). A refusal leaves nothing to
/// spend: 0, as `Decision::remaining` and `X-RateLimit-Remaining` say on a rejection.
pub fn unspent(allowed: bool, remaining: u32, cost: u32, limit: u32) -> u32 {
    if allowed {
        remaining.saturating_add(cost).min(limit)
    } else {
        0
    }
}

/// `Retry-After: 1` (`RETRY_SOON`) as a reply header.
pub fn retry_soon() -> (&'static str, HeaderValue) {
    (RETRY_AFTER, HeaderValue::from_static(RETRY_SOON))
}

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-11).
pub const IETF_POLICY: &str = "ratelimit-policy";
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11).
pub const IETF_LIMIT: &str = "ratelimit";

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

    /// `(name, value)` pairs, in order (`Retry-After` only when set). Numbers below 1,024
    /// are values made once (`number`): only the reset (Unix seconds) is formatted, one
    /// allocation.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, HeaderValue)> {
        self.slots().into_iter().flatten()
    }

    /// `pairs` in fixed slots: limit, remaining, reset, retry-after.
    fn slots(&self) -> [Option<(&'static str, HeaderValue)>; 4] {
        let numbers = [
            Some(u64::from(self.limit)),
            Some(u64::from(self.remaining)),
            Some(self.reset),
            self.retry_after,
        ];
        let names = [LIMIT, REMAINING, RESET, RETRY_AFTER];
        std::array::from_fn(|i| Some((names[i], number(numbers[i]?))))
    }
}

/// The headers of `style` for the governing window `wd` decided at `now_ms`:
/// `X-RateLimit-*` and/or the IETF pair (`RateLimit-Policy` of the check's `quotas`). `rejected` zeroes the remaining count (a
/// 429, or a shadow-mode would-be rejection); `retry` adds `Retry-After` whatever the
/// style (a 429 only: a forwarded response was not rejected).
pub fn rate_pairs(
    style: RateLimitHeaders,
    wd: &WindowDecision,
    now_ms: u64,
    (rejected, retry): (bool, bool),
    quotas: Option<&[Quota]>,
) -> impl Iterator<Item = (&'static str, HeaderValue)> {
    let mut x = RateHeaders::new(wd, now_ms, rejected);
    if !retry {
        x.retry_after = None;
    }
    // Fixed slots, in the order they are sent: the X family (limit, remaining, reset,
    // retry-after), then the IETF pair. No iterator adapters chained per request.
    let mut out: [Option<(&'static str, HeaderValue)>; 6] = Default::default();
    if style.x_ratelimit() {
        let [a, b, c, d] = x.slots();
        (out[0], out[1], out[2], out[3]) = (a, b, c, d);
    } else {
        // Without the X family, `Retry-After` still goes with a rejection.
        out[0] = x.retry_after.map(|s| (RETRY_AFTER, HeaderValue::from(s)));
    }
    if style.ietf() {
        out[4] = quotas.and_then(ietf_policy).map(|v| (IETF_POLICY, v));
        out[5] = ietf_limit(wd, rejected).map(|v| (IETF_LIMIT, v));
    }
    out.into_iter().flatten()
}

/// The item name of a window: `"<scope>-<window>"`, e.g. `key-1m`.
fn item_name(scope: Scope, window: Window) -> String {
    format!("{}-{}", scope.as_str(), window.label())
}

/// `RateLimit-Policy` of a check's windows (`Check::quotas`), in order; `None` when
/// there is none.
pub fn ietf_policy(quotas: &[Quota]) -> Option<HeaderValue> {
    let mut out = String::with_capacity(24 * quotas.len());
    let mut list = Some(RefListSerializer::new(&mut out));
    for q in quotas {
        let name = item_name(q.scope, q.window);
        let secs = i64::try_from(q.window_ms / 1000).unwrap_or(i64::MAX);
        list = Some(
            list.take()?
                .bare_item(&RefBareItem::String(&name))
                .ok()?
                .parameter("q", &RefBareItem::Integer(i64::from(q.limit)))
                .ok()?
                .parameter("w", &RefBareItem::Integer(secs))
                .ok()?,
        );
    }
    if out.is_empty() {
        return None;
    }
    HeaderValue::from_str(&out).ok()
}

/// `RateLimit` for the governing window: remaining `r` (0 on a rejection) and `t`, whole
/// seconds until it admits a full limit again (rounded up; on a rejection never less than
/// `Retry-After` - 1).
pub fn ietf_limit(wd: &WindowDecision, rejected: bool) -> Option<HeaderValue> {
    let d = &wd.decision;
    let remaining = if rejected { 0 } else { d.remaining };
    let mut t = d.reset_after_ms.div_ceil(1000);
    if rejected {
        t = t.max(retry_after_secs(d.retry_after_ms) - 1);
    }
    let name = item_name(wd.scope, wd.window);
    let mut out = String::with_capacity(32);
    RefListSerializer::new(&mut out)
        .bare_item(&RefBareItem::String(&name))
        .ok()?
        .parameter("r", &RefBareItem::Integer(i64::from(remaining)))
        .ok()?
        .parameter(
            "t",
            &RefBareItem::Integer(i64::try_from(t).unwrap_or(i64::MAX)),
        )
        .ok()?;
    HeaderValue::from_str(&out).ok()
}

/// Numbers below this have a header value made once (`number`).
const SMALL: u64 = 1024;

/// The header values of 0..`SMALL`, made at the first use: a limit, a remaining count and
/// a `Retry-After` are mostly small. Each is a static string (leaked once, about 3 KB in
/// all), so a clone is a pointer copy: no formatting, no allocation, no reference count.
static SMALL_VALUES: std::sync::LazyLock<Box<[HeaderValue]>> = std::sync::LazyLock::new(|| {
    (0..SMALL)
        .map(|n| HeaderValue::from_static(Box::leak(n.to_string().into_boxed_str())))
        .collect()
});

/// `n` as a header value: a small one from `SMALL_VALUES`, a larger one formatted into
/// one allocation of its length (`HeaderValue::from(u64)` makes more).
fn number(n: u64) -> HeaderValue {
    if let Some(v) = usize::try_from(n).ok().and_then(|i| SMALL_VALUES.get(i)) {
        return v.clone();
    }
    let mut buf = itoa::Buffer::new();
    let digits = bytes::Bytes::copy_from_slice(buf.format(n).as_bytes());
    // Digits are always a valid value; the fallback is never taken.
    HeaderValue::from_maybe_shared(digits).unwrap_or_else(|_| HeaderValue::from(n))
}

/// Whole seconds for `Retry-After`: rounded up, at least 1.
pub fn retry_after_secs(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Decision, Scope, Window};

    /// A number's header value is its decimal digits, from the table or formatted.
    #[test]
    fn numbers_are_their_digits() {
        for n in [0, 1, 9, 10, 999, 1_023, 1_024, 1_764_000_060, u64::MAX] {
            assert_eq!(number(n), HeaderValue::from(n), "{n}");
            assert_eq!(number(n).to_str().unwrap(), n.to_string());
        }
    }

    /// (allowed, remaining after, cost, limit, unspent).
    #[test]
    fn unspent_adds_the_cost_back_on_a_pass() {
        let cases = [
            (true, 4, 1, 10, 5),
            (true, 0, 1, 10, 1),
            (true, 9, 1, 10, 10),
            (true, 7, 3, 10, 10),
            (true, 8, 5, 10, 10),
            (true, 5, 0, 10, 5),
            (true, u32::MAX - 1, 5, u32::MAX, u32::MAX),
            (false, 0, 1, 10, 0),
            (false, 3, 5, 10, 0),
            (false, 0, 0, 0, 0),
        ];
        for (allowed, remaining, cost, limit, want) in cases {
            assert_eq!(
                unspent(allowed, remaining, cost, limit),
                want,
                "{allowed} {remaining} {cost} {limit}"
            );
        }
    }

    /// Every "try again in a moment" answer says `Retry-After: 1`, as a header pair.
    #[test]
    fn retry_soon_is_one_second() {
        let (name, value) = retry_soon();
        assert_eq!((name, value.to_str().unwrap()), ("retry-after", "1"));
        assert_eq!(
            http::HeaderName::from_static(RETRY_AFTER),
            http::header::RETRY_AFTER
        );
    }

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

    fn scope(windows: &[(Window, u32)]) -> crate::limiter::ScopeLimits {
        crate::limiter::ScopeLimits {
            windows: windows
                .iter()
                .map(|(w, n)| crate::limiter::WindowLimit::new(*w, *n))
                .collect(),
            on_failure: crate::limiter::OnFailure::Open,
            message: None,
            concurrent: None,
            ban: None,
            count_on: None,
        }
    }

    fn text(v: Option<HeaderValue>) -> String {
        v.unwrap().to_str().unwrap().to_string()
    }

    /// `RateLimit-Policy` names every window of every scope of the check, in order, with
    /// its quota and its length in seconds (a month is 30 days).
    #[test]
    fn ietf_policy_lists_every_window() {
        use crate::limiter::Ident;
        let ip = scope(&[(Window::Second, 20)]);
        let key = scope(&[(Window::Minute, 500), (Window::Month, 1_000_000)]);
        let mut check = crate::limiter::Check::new(1);
        check.push(Scope::Ip, Ident::Global, &ip);
        check.push(Scope::Key, Ident::Global, &key);
        assert_eq!(
            text(ietf_policy(&check.quotas())),
            r#""ip-1s";q=20;w=1, "key-1m";q=500;w=60, "key-1mo";q=1000000;w=2592000"#
        );
        assert!(ietf_policy(&[]).is_none());
        // The value parses back as a Structured Field list.
        let parsed =
            sfv::Parser::parse_list(text(ietf_policy(&check.quotas())).as_bytes()).unwrap();
        assert_eq!(parsed.len(), 3);
    }

    /// A calendar window's `w` is the length of the window the check falls in: the
    /// spring-forward day in Berlin is 23 h, the fall-back day 25 h, February 2028 in
    /// Los Angeles 29 days; without the check's time, the nominal length.
    #[test]
    fn ietf_policy_gives_a_calendar_window_its_length() {
        use crate::limiter::algorithm::Calendar;
        use crate::limiter::{Algorithm, Ident, WindowLimit};
        let cal = |z| Some(Calendar::interned(z, 1).unwrap());
        let cases = [
            // 2026-03-29 12:00 UTC, 2026-10-25 12:00 UTC, 2028-02-10 12:00 UTC.
            (
                "Europe/Berlin",
                Window::Day,
                Some(1_774_785_600_000),
                82_800,
            ),
            (
                "Europe/Berlin",
                Window::Day,
                Some(1_792_929_600_000),
                90_000,
            ),
            (
                "America/Los_Angeles",
                Window::Month,
                Some(1_833_796_800_000),
                29 * 86_400,
            ),
            ("Europe/Berlin", Window::Day, None, 86_400),
        ];
        for (zone, window, at, secs) in cases {
            let mut l = scope(&[]);
            l.windows = vec![
                WindowLimit::with_algorithm(window, 10, Algorithm::FixedWindow)
                    .with_calendar(cal(zone)),
            ];
            let mut check = crate::limiter::Check::new(1);
            check.push(Scope::Tenant, Ident::Global, &l);
            check.at_ms = at;
            let got = text(ietf_policy(&check.quotas()));
            assert!(got.ends_with(&format!(";w={secs}")), "{zone} {at:?}: {got}");
        }
    }

    /// (remaining, reset_after_ms, retry_after_ms, rejected, expected `RateLimit`).
    #[test]
    fn ietf_limit_table() {
        let cases = [
            (42, 17_000, 0, false, r#""key-1m";r=42;t=17"#),
            (42, 16_001, 0, false, r#""key-1m";r=42;t=17"#),
            (0, 0, 0, false, r#""key-1m";r=0;t=0"#),
            // A rejection: r=0, t at least Retry-After - 1.
            (3, 60_000, 1_001, true, r#""key-1m";r=0;t=60"#),
            (3, 500, 4_200, true, r#""key-1m";r=0;t=4"#),
        ];
        for (remaining, reset, retry, rejected, want) in cases {
            let got = text(ietf_limit(&wd(remaining, reset, retry), rejected));
            assert_eq!(got, want, "{remaining} {reset} {retry} {rejected}");
            if rejected {
                let t: u64 = got.rsplit("t=").next().unwrap().parse().unwrap();
                assert!(t + 1 >= retry_after_secs(retry));
            }
        }
    }

    /// Each style writes its family; a 429 carries `Retry-After` in every style, a
    /// forwarded response in none.
    #[test]
    fn styles() {
        let policy = [Quota {
            scope: Scope::Key,
            window: Window::Minute,
            limit: 100,
            window_ms: 60_000,
        }];
        let names = |style, flags| -> Vec<&'static str> {
            rate_pairs(style, &wd(3, 60_000, 1_001), 0, flags, Some(&policy[..]))
                .map(|(n, _)| n)
                .collect()
        };
        use RateLimitHeaders::*;
        assert_eq!(
            names(XRateLimit, (true, true)),
            [LIMIT, REMAINING, RESET, RETRY_AFTER]
        );
        assert_eq!(
            names(Ietf, (true, true)),
            [RETRY_AFTER, IETF_POLICY, IETF_LIMIT]
        );
        assert_eq!(names(Ietf, (false, false)), [IETF_POLICY, IETF_LIMIT]);
        assert_eq!(
            names(Both, (false, false)),
            [LIMIT, REMAINING, RESET, IETF_POLICY, IETF_LIMIT]
        );
    }
}
