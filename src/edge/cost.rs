//! What a request really cost: the usage an upstream reports in the route's
//! `cost_header`, parsed once for every transport, and the settlement it drives (or, for a
//! client that left first, `max_cost`); or the bytes it moved (`cost_from`).

use http::HeaderMap;

use crate::admission::Admission;
use crate::metrics::Metrics;

// === impl Admission ===

impl Admission {
    /// Reserve, then settle: the usage the upstream reports in the route's `cost_header`
    /// (every value; the largest counts), bounded by `max_cost`, settles the request. The
    /// proxy and the tower layer both settle here; without a valid value nothing settles.
    pub fn settle_from(&mut self, headers: &HeaderMap, metrics: &Metrics) {
        let a = self;
        let route = a.route.as_ref().map(|r| &r.route);
        let Some((name, max_cost)) =
            route.and_then(|r| Some((r.cost_header.as_ref()?, r.max_cost)))
        else {
            return;
        };
        let values = headers.get_all(name).iter().map(|v| v.as_bytes());
        if let Some(reported) = reported_usage(values) {
            let (actual, clamped) = clamp_usage(reported, max_cost);
            if clamped {
                metrics.cost_clamped.inc();
            }
            a.settle(actual, metrics);
        }
    }

    /// A client cannot pay less by leaving: a request whose client went away before a
    /// valid usage header settles at the route's `max_cost` (a route with `cost_header`
    /// and without `max_cost` keeps the reserve). A request already settled stays as it is.
    pub fn settle_abandoned(&mut self, metrics: &Metrics) {
        let max_cost = self.route.as_ref().and_then(|r| {
            let r = &r.route;
            r.cost_header.as_ref().and(r.max_cost)
        });
        if let Some(max) = max_cost {
            if !self.is_settled() {
                self.settle(max, metrics);
            }
        }
    }
}

// === impl Admission: cost_from ===

impl Admission {
    /// Which bytes the request's route settles on (`cost_from`), if any.
    pub fn counted_bytes(&self) -> Option<crate::config::Counted> {
        let route = self.route.as_ref()?;
        Some(route.route.cost_from?.counted)
    }

    /// Reserve, then settle to the bytes moved: `bytes` (the response body bytes sent,
    /// or the request body bytes read; a client that left pays what was sent) in the
    /// route's `cost_unit_bytes`, rounded up and bounded by `max_cost`, settles the
    /// request. Nothing on a route without `cost_from`.
    pub fn settle_bytes(&mut self, bytes: u64, metrics: &Metrics) {
        let Some(route) = self.route.as_ref().map(|r| &r.route) else {
            return;
        };
        let Some(from) = route.cost_from else {
            return;
        };
        let (actual, clamped) = clamp_usage(from.units(bytes), route.max_cost);
        if clamped {
            metrics.cost_clamped.inc();
        }
        self.settle(actual, metrics);
    }
}

/// The usage an upstream reported in its `cost_header` lines: every line and every
/// comma-separated element of a line is one value (RFC 9110 5.3: repeated field lines are
/// one list); the largest counts, so repeating the header can never lower the bill. No
/// value, or any malformed or empty element among them: `None` (nothing settles).
pub fn reported_usage<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<u32> {
    let mut largest: Option<u32> = None;
    for line in values {
        for element in line.split(|b| *b == b',') {
            let v = true_cost(element)?;
            largest = Some(largest.map_or(v, |l| l.max(v)));
        }
    }
    largest
}

/// A reported usage bounded by the route's `max_cost`; `true` when it was clamped.
pub fn clamp_usage(reported: u32, max_cost: Option<u32>) -> (u32, bool) {
    match max_cost {
        Some(max) if reported > max => (max, true),
        _ => (reported, false),
    }
}

/// A `cost_header` value: decimal digits only (at most 9, so it fits any window math), or
/// nothing is settled.
pub fn true_cost(v: &[u8]) -> Option<u32> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 9 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::{clamp_usage, reported_usage, true_cost};

    /// Repeated usage headers: the largest value counts; one malformed element voids
    /// them all.
    #[test]
    fn repeated_usage_headers() {
        let cases: &[(&[&[u8]], Option<u32>)] = &[
            (&[], None),
            (&[b"7"], Some(7)),
            (&[b"900", b"3"], Some(900)),
            (&[b"3", b"900"], Some(900)),
            (&[b"12, 13"], Some(13)),
            (&[b"5", b"12,13", b" 4 "], Some(13)),
            (&[b"900", b"abc"], None),
            (&[b"abc", b"900"], None),
            (&[b"900", b""], None),
            (&[b"1,"], None),
            (&[b"900", b"-1"], None),
        ];
        for (values, want) in cases {
            assert_eq!(reported_usage(values.iter().copied()), *want, "{values:?}");
        }
    }

    #[test]
    fn usage_is_clamped_to_max_cost() {
        assert_eq!(clamp_usage(5_000, Some(900)), (900, true));
        assert_eq!(clamp_usage(900, Some(900)), (900, false));
        assert_eq!(clamp_usage(3, Some(900)), (3, false));
        assert_eq!(clamp_usage(5_000, None), (5_000, false));
    }

    #[test]
    fn cost_header_values() {
        let cases: &[(&[u8], Option<u32>)] = &[
            (b"42", Some(42)),
            (b" 7 ", Some(7)),
            (b"0", Some(0)),
            (b"999999999", Some(999_999_999)),
            (b"1000000000", None),
            (b"", None),
            (b"-3", None),
            (b"+3", None),
            (b"3.5", None),
            (b"1e3", None),
            (b"12, 13", None),
            (b"\xff", None),
        ];
        for (v, want) in cases {
            assert_eq!(true_cost(v), *want, "{v:?}");
        }
    }
}
