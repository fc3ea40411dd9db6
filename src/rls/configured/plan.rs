//! What each descriptor of a request asks for: its limit (the config's match or its own
//! `limit`), its hits, its counter; and the store check that decides it.

use std::collections::HashSet;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use smallvec::SmallVec;

use crate::config::{Rls, RlsDescriptors};
use crate::descriptors::{plain_counter, Limit, Unit};
use crate::limiter::{Algorithm, Check, Ident, Scope, ScopeLimits, Window, WindowLimit};

/// What one descriptor asks for, once matched.
pub(super) enum Plan<'a> {
    /// No limit applies (unknown domain, no match, the depth rule, replaced).
    Free,
    /// `unlimited: true` (the limit, for its `replaces`).
    Unlimited(&'a Limit),
    /// A limit to decide.
    Limited(Limited<'a>),
}

pub(super) struct Limited<'a> {
    pub(super) limit: Limit,
    /// The config path, when the limit has `detailed_metric` (None: an override).
    pub(super) path: Option<&'a str>,
    pub(super) counter: String,
    /// Units to spend; 0: check only.
    pub(super) hits: u64,
}

// === impl Plan ===

impl<'a> Plan<'a> {
    /// The limit to decide, if any.
    pub(super) fn limited(&self) -> Option<&Limited<'a>> {
        match self {
            Plan::Limited(l) => Some(l),
            _ => None,
        }
    }

    /// Whether its answer can make the call `OVER_LIMIT` (a limited, non-shadow
    /// descriptor; a quota one together with the others).
    pub(super) fn can_refuse(&self) -> bool {
        self.limited().is_some_and(|l| !l.limit.shadow_mode)
    }
}

// === impl Limited ===

impl Limited<'_> {
    /// `requests_per_unit: 0`: always over, decided without the store.
    pub(super) fn closed(&self) -> bool {
        self.limit.requests_per_unit == 0
    }

    /// The store check of this descriptor in `scope` under `limits` (its one window):
    /// a charge of its hits, or a look (`peek`, one unit) for hits 0.
    pub(super) fn check<'l>(&self, scope: Scope, limits: &'l ScopeLimits) -> Check<'l> {
        let mut c = Check::new(u32::try_from(self.hits).unwrap_or(u32::MAX));
        c.peek = self.hits == 0;
        c.push(scope, Ident::Name(self.counter.as_str().into()), limits);
        c
    }
}

/// What `desc` asks for: its limit (a descriptor's own `limit`, else the config's) and
/// hits (its own `hits_addend`, else the request's; 0 there counts as 1).
pub(super) fn plan<'a>(
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
pub(super) fn drop_replaced(plans: &mut [Plan<'_>]) {
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

/// The one window of a descriptor's limit: fixed, aligned to the Unix epoch.
pub(super) fn scope_limits(rls: &Rls, limit: &Limit) -> ScopeLimits {
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
        count_on: None,
    }
}

/// envoyproxy/ratelimit's unit lengths (month 30 days, year 365 days).
pub(super) fn window(u: Unit) -> Window {
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
pub(super) fn override_unit(u: i32) -> Option<Unit> {
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
