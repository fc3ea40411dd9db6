//! `ShouldRateLimit` with `[rls] config`: envoyproxy/ratelimit's semantics over Throttle's
//! store.
//!
//! Each descriptor is matched on its own against the domain's descriptor tree
//! (`descriptors::RlsConfig::lookup`) and, when a limit applies, decided by its own
//! check: one scope (`rls.<domain>`), one fixed window aligned to the Unix epoch, the
//! counter named by the descriptor's entries. The checks of a request run concurrently
//! (on Redis most are served from leases), and the request is all-or-nothing: when the
//! answer is `OVER_LIMIT`, every descriptor that was charged is refunded at once
//! (`LimitStore::settle` with the whole cost back), so no counter keeps a unit of a
//! refused request. Until that refund lands a concurrent request may see the units
//! spent: the error is always towards refusing, never towards admitting too much.
//!
//! What differs from envoyproxy/ratelimit (which counts every request, refused or not):
//! a refused request consumes nothing on any descriptor, and a descriptor `hits_addend`
//! of 0 answers whether one more unit would fit (a counter never passes its limit here,
//! so "over the limit" can only mean "no unit left").

use std::collections::HashSet;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration;
use smallvec::SmallVec;

use crate::admission::{self, Core};
use crate::config::{Rls, RlsDescriptors};
use crate::descriptors::{plain_counter, Limit, Unit};
use crate::limiter::{
    Algorithm, Check, Ident, OnFailure, ScopeLimits, Verdict, Window, WindowLimit,
};

/// Most descriptors one request may carry.
pub(super) const MAX_DESCRIPTORS: usize = 64;

/// What one descriptor asks for, once matched.
enum Plan<'a> {
    /// No limit applies (unknown domain, no match, the depth rule, replaced).
    Free,
    /// `unlimited: true` (the limit, for its `replaces`).
    Unlimited(&'a Limit),
    /// A limit to decide.
    Limited(Limited<'a>),
}

struct Limited<'a> {
    limit: Limit,
    /// The config path, when the limit has `detailed_metric` (None: an override).
    path: Option<&'a str>,
    counter: String,
    /// Units to spend; 0: check only.
    hits: u64,
}

/// One limited descriptor's outcome.
struct Outcome {
    /// The store admitted it (for a check only: a unit is left).
    fits: bool,
    /// Units left after this request (for a check only: left now).
    remaining: u32,
    /// Ms until the window ends.
    reset_ms: u64,
    /// What to refund when the request is refused (None: nothing was charged).
    charged: Option<Verdict>,
}

/// Decides `req` against `d` (see the module docs).
///
/// # Errors
/// Why the request is malformed, as the message of an `INVALID_ARGUMENT` status.
pub(super) async fn decide(
    core: &Core,
    rls: &Rls,
    d: &RlsDescriptors,
    req: &RateLimitRequest,
) -> Result<RateLimitResponse, String> {
    if req.domain.is_empty() {
        return Err("rate limit domain must not be empty".into());
    }
    if req.descriptors.is_empty() {
        return Err("rate limit descriptor list must not be empty".into());
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(format!(
            "{} descriptors: at most {MAX_DESCRIPTORS}",
            req.descriptors.len()
        ));
    }
    let Some(&scope) = d.scopes.get(&req.domain) else {
        count(core, "unknown", false);
        return Ok(RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses: vec![status(Code::Ok, None, 0, 0); req.descriptors.len()],
            ..RateLimitResponse::default()
        });
    };
    let mut plans = req
        .descriptors
        .iter()
        .map(|desc| plan(d, &req.domain, desc, req.hits_addend))
        .collect::<Result<Vec<_>, _>>()?;
    drop_replaced(&mut plans);

    let limits: Vec<Option<ScopeLimits>> = plans
        .iter()
        .map(|p| match p {
            Plan::Limited(l) => Some(scope_limits(rls, &l.limit)),
            _ => None,
        })
        .collect();
    let checks: Vec<Option<Check<'_>>> = plans
        .iter()
        .zip(&limits)
        .map(|(p, sl)| match (p, sl) {
            (Plan::Limited(l), Some(sl)) => {
                let mut c = Check::new(u32::try_from(l.hits).unwrap_or(u32::MAX));
                c.peek = l.hits == 0;
                c.push(scope, Ident::Name(l.counter.as_str().into()), sl);
                Some(c)
            }
            _ => None,
        })
        .collect();
    let decided = futures_util::future::join_all(checks.iter().map(|c| async move {
        match c {
            Some(c) => Some(outcome(core, c).await),
            None => None,
        }
    }))
    .await;

    let mut statuses = Vec::with_capacity(plans.len());
    let (mut failed, mut quota_total, mut quota_failed) = (0usize, 0usize, 0usize);
    for (p, o) in plans.iter().zip(&decided) {
        let s = match (p, o) {
            (Plan::Free, _) | (Plan::Limited(_), None) => status(Code::Ok, None, 0, 0),
            (Plan::Unlimited(_), _) => status(Code::Ok, None, u32::MAX, 0),
            (Plan::Limited(l), Some(o)) => {
                let over = !o.fits;
                let code = if over && !l.limit.shadow_mode {
                    Code::OverLimit
                } else {
                    Code::Ok
                };
                if l.limit.quota_mode {
                    quota_total += 1;
                    quota_failed += usize::from(code == Code::OverLimit);
                } else if code == Code::OverLimit {
                    failed += 1;
                }
                let remaining = if over { 0 } else { o.remaining };
                status(code, Some(&l.limit), remaining, o.reset_ms)
            }
        };
        statuses.push(s);
    }
    let refused = failed > 0 || (quota_total > 0 && quota_total == quota_failed);
    if refused {
        for (c, o) in checks.iter().zip(&decided) {
            if let (
                Some(c),
                Some(Outcome {
                    charged: Some(v), ..
                }),
            ) = (c, o)
            {
                core.store.settle(c, -i64::from(c.cost), v.decided_at);
            }
        }
    }
    count(core, &req.domain, refused);
    for (p, o) in plans.iter().zip(&decided) {
        if let (Plan::Limited(l), Some(o)) = (p, o) {
            if let Some(path) = l.path {
                let code = match (o.fits, l.limit.shadow_mode) {
                    (true, _) => "ok",
                    (false, true) => "shadow_over_limit",
                    (false, false) => "over_limit",
                };
                core.metrics
                    .rls_descriptor_total
                    .with_label_values(&[&req.domain, path, code])
                    .inc();
            }
        }
    }
    let overall = if refused { Code::OverLimit } else { Code::Ok };
    let mut response = RateLimitResponse {
        overall_code: overall.into(),
        response_headers_to_add: Vec::new(),
        ..RateLimitResponse::default()
    };
    if rls.response_headers {
        response.response_headers_to_add = nearest_headers(&plans, &statuses);
    }
    if refused {
        if let Some((i, _)) = first_over(&plans, &statuses) {
            response.raw_body = body(&req.domain, &plans[i], &statuses[i]);
            response
                .response_headers_to_add
                .push(header("content-type", "application/json"));
        }
    }
    response.statuses = statuses;
    Ok(response)
}

/// What `desc` asks for: its limit (a descriptor's own `limit`, else the config's) and
/// hits (its own `hits_addend`, else the request's; 0 there counts as 1).
fn plan<'a>(
    d: &'a RlsDescriptors,
    domain: &str,
    desc: &RateLimitDescriptor,
    request_hits: u32,
) -> Result<Plan<'a>, String> {
    let entries: SmallVec<[(&str, &str); 4]> = desc
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    let hits = match &desc.hits_addend {
        Some(h) => h.value,
        None => u64::from(request_hits.max(1)),
    };
    if let Some(o) = &desc.limit {
        let unit = override_unit(o.unit)
            .ok_or_else(|| format!("descriptor limit: unknown unit {}", o.unit))?;
        return Ok(Plan::Limited(Limited {
            limit: Limit {
                unit,
                requests_per_unit: o.requests_per_unit,
                unlimited: false,
                name: None,
                replaces: Vec::new(),
                shadow_mode: false,
                quota_mode: false,
                detailed_metric: false,
            },
            path: None,
            counter: plain_counter(&entries),
            hits,
        }));
    }
    let Some(m) = d.config.lookup(domain, &entries) else {
        return Ok(Plan::Free);
    };
    if m.limit.unlimited {
        return Ok(Plan::Unlimited(m.limit));
    }
    Ok(Plan::Limited(Limited {
        limit: m.limit.clone(),
        path: m.limit.detailed_metric.then_some(m.path),
        counter: m.counter,
        hits,
    }))
}

/// `replaces`: a limit named by another matched limit's `replaces` is not applied (nor
/// counted). Names come from every matched limit, unlimited ones included.
fn drop_replaced(plans: &mut [Plan<'_>]) {
    let mut replacing: HashSet<String> = HashSet::new();
    for p in plans.iter() {
        match p {
            Plan::Limited(l) => replacing.extend(l.limit.replaces.iter().cloned()),
            Plan::Unlimited(limit) => replacing.extend(limit.replaces.iter().cloned()),
            Plan::Free => {}
        }
    }
    if replacing.is_empty() {
        return;
    }
    for p in plans.iter_mut() {
        if let Plan::Limited(l) = p {
            if l.limit.name.as_ref().is_some_and(|n| replacing.contains(n)) {
                *p = Plan::Free;
            }
        }
    }
}

/// One limited descriptor decided by the store. A store that cannot decide answers by
/// `[rls] on_failure`: closed refuses, open admits (the tiered store decides `local`
/// itself and answers a verdict).
async fn outcome(core: &Core, c: &Check<'_>) -> Outcome {
    let limit = c
        .scopes
        .first()
        .map_or(0, |s| s.limits.windows.first().map_or(0, |w| w.limit));
    match admission::decide(core, c).await {
        Ok(v) => {
            let (remaining, reset_ms) = v.governing.map_or((limit, 0), |g| {
                (g.decision.remaining, g.decision.reset_after_ms)
            });
            // A check only (peek of one unit) reports what is left now.
            let remaining = if c.peek && v.allowed {
                remaining.saturating_add(1).min(limit)
            } else {
                remaining
            };
            Outcome {
                fits: v.allowed,
                remaining,
                reset_ms,
                charged: (v.allowed && !c.peek).then_some(v),
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "rate-limit service: store failed");
            let closed = c
                .scopes
                .first()
                .is_some_and(|s| s.limits.on_failure == OnFailure::Closed);
            Outcome {
                fits: !closed,
                remaining: 0,
                reset_ms: 0,
                charged: None,
            }
        }
    }
}

/// The one window of a descriptor's limit: fixed, aligned to the Unix epoch.
fn scope_limits(rls: &Rls, limit: &Limit) -> ScopeLimits {
    let window = window(limit.unit);
    ScopeLimits {
        windows: vec![WindowLimit::with_algorithm(
            window,
            limit.requests_per_unit,
            Algorithm::FixedWindow,
        )
        .with_admission(rls.admission)],
        on_failure: rls.on_failure,
        message: None,
        concurrent: None,
        ban: None,
    }
}

/// envoyproxy/ratelimit's unit lengths (month 30 days, year 365 days).
fn window(u: Unit) -> Window {
    match u {
        Unit::Second => Window::Second,
        Unit::Minute => Window::Minute,
        Unit::Hour => Window::Hour,
        Unit::Day => Window::Day,
        Unit::Week => Window::Week,
        Unit::Month => Window::Days30,
        Unit::Year => Window::Year,
    }
}

/// `envoy.type.v3.RateLimitUnit` of a descriptor's limit override.
fn override_unit(u: i32) -> Option<Unit> {
    Some(match u {
        1 => Unit::Second,
        2 => Unit::Minute,
        3 => Unit::Hour,
        4 => Unit::Day,
        5 => Unit::Month,
        6 => Unit::Year,
        7 => Unit::Week,
        _ => return None,
    })
}

fn pb_unit(u: Unit) -> PbUnit {
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
fn status(code: Code, limit: Option<&Limit>, remaining: u32, reset_ms: u64) -> DescriptorStatus {
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
fn first_over<'s>(
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
fn nearest_headers(plans: &[Plan<'_>], statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
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
fn body(domain: &str, plan: &Plan<'_>, s: &DescriptorStatus) -> Vec<u8> {
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

fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value: value.to_string(),
        ..HeaderValue::default()
    }
}

/// `throttle_rls_decisions_total{domain,code}`.
fn count(core: &Core, domain: &str, refused: bool) {
    let code = if refused { "over_limit" } else { "ok" };
    core.metrics
        .rls_decisions_total
        .with_label_values(&[domain, code])
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// envoyproxy/ratelimit's units map to windows of its lengths.
    #[test]
    fn units_have_envoyproxy_lengths() {
        for (u, secs) in [
            (Unit::Second, 1),
            (Unit::Minute, 60),
            (Unit::Hour, 3600),
            (Unit::Day, 86_400),
            (Unit::Week, 604_800),
            (Unit::Month, 2_592_000),
            (Unit::Year, 31_536_000),
        ] {
            assert_eq!(window(u).period_ms(), secs * 1000, "{u:?}");
            assert_eq!(u.seconds(), secs, "{u:?}");
        }
        for code in 1..=7 {
            let u = override_unit(code).unwrap();
            assert_eq!(i32::from(pb_unit(u)), code, "{u:?}");
        }
        assert_eq!(override_unit(0), None);
        assert_eq!(override_unit(8), None);
    }
}
