//! The answer's parts: each descriptor's status, the RateLimit-* headers, the JSON body
//! of a refusal, and the decision metrics.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::Duration;

use super::plan::Plan;
use crate::admission::Core;
use crate::descriptors::{Limit, Unit};

pub(super) fn pb_unit(u: Unit) -> PbUnit {
    match u {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

/// A descriptor's status; with a limit, `duration_until_reset` in whole seconds (rounded
/// up, at most the unit's length).
pub(super) fn status(
    code: Code,
    limit: Option<&Limit>,
    remaining: u32,
    reset_ms: u64,
) -> DescriptorStatus {
    let Some(l) = limit else {
        return DescriptorStatus {
            code: code.into(),
            limit_remaining: remaining,
            ..DescriptorStatus::default()
        };
    };
    let secs = reset_ms.div_ceil(1000).clamp(1, l.unit.seconds());
    DescriptorStatus {
        code: code.into(),
        current_limit: Some(RateLimit {
            name: l.name.clone().unwrap_or_default(),
            requests_per_unit: l.requests_per_unit,
            unit: pb_unit(l.unit).into(),
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(Duration {
            seconds: i64::try_from(secs).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        quota: None,
    }
}

/// The first descriptor that refused the request (non-quota first, as the answer's
/// `OVER_LIMIT` is decided).
pub(super) fn first_over<'s>(
    plans: &[Plan<'_>],
    statuses: &'s [DescriptorStatus],
) -> Option<(usize, &'s DescriptorStatus)> {
    let over = |s: &DescriptorStatus| s.code == i32::from(Code::OverLimit);
    let quota = |i: usize| matches!(&plans[i], Plan::Limited(l) if l.limit.quota_mode);
    statuses
        .iter()
        .enumerate()
        .find(|(i, s)| over(s) && !quota(*i))
        .or_else(|| statuses.iter().enumerate().find(|(_, s)| over(s)))
}

/// `RateLimit-Limit`, `-Remaining`, `-Reset` of the descriptor nearest its limit: a
/// non-quota descriptor over its limit first, else the limited one with the fewest left.
pub(super) fn nearest_headers(
    plans: &[Plan<'_>],
    statuses: &[DescriptorStatus],
) -> Vec<HeaderValue> {
    let over = first_over(plans, statuses)
        .filter(|(i, _)| !matches!(&plans[*i], Plan::Limited(l) if l.limit.quota_mode));
    let nearest = over.map(|(_, s)| s).or_else(|| {
        statuses
            .iter()
            .filter(|s| s.current_limit.is_some())
            .min_by_key(|s| s.limit_remaining)
    });
    let Some(s) = nearest else {
        return Vec::new();
    };
    let (Some(limit), Some(reset)) = (&s.current_limit, &s.duration_until_reset) else {
        return Vec::new();
    };
    vec![
        header("RateLimit-Limit", &limit.requests_per_unit.to_string()),
        header("RateLimit-Remaining", &s.limit_remaining.to_string()),
        header("RateLimit-Reset", &reset.seconds.to_string()),
    ]
}

/// The JSON body Envoy sends with its 429: which limit refused the request.
pub(super) fn body(domain: &str, plan: &Plan<'_>, s: &DescriptorStatus) -> Vec<u8> {
    let Plan::Limited(l) = plan else {
        return Vec::new();
    };
    let retry = s.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
    serde_json::json!({
        "error": "rate_limited",
        "domain": domain,
        "name": l.limit.name,
        "limit": l.limit.requests_per_unit,
        "unit": l.limit.unit.as_str(),
        "retry_after": retry,
    })
    .to_string()
    .into_bytes()
}

pub(super) fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value: value.to_string(),
        ..HeaderValue::default()
    }
}

/// `throttle_rls_decisions_total{domain,code}`.
pub(super) fn count(core: &Core, domain: &str, refused: bool) {
    let code = if refused { "over_limit" } else { "ok" };
    core.metrics
        .rls_decisions_total
        .with_label_values(&[domain, code])
        .inc();
}

/// `throttle_rls_descriptor_total{domain,descriptor,code}` of each `detailed_metric`
/// descriptor, `fits[i]` telling whether descriptor `i` was within its limit.
pub(super) fn count_descriptors(
    core: &Core,
    domain: &str,
    plans: &[Plan<'_>],
    fits: &[Option<bool>],
) {
    for (p, fits) in plans.iter().zip(fits) {
        let (Plan::Limited(l), Some(fits)) = (p, fits) else {
            continue;
        };
        let Some(path) = l.path else {
            continue;
        };
        let code = match (fits, l.limit.shadow_mode) {
            (true, _) => "ok",
            (false, true) => "shadow_over_limit",
            (false, false) => "over_limit",
        };
        core.metrics
            .rls_descriptor_total
            .with_label_values(&[domain, path, code])
            .inc();
    }
}
