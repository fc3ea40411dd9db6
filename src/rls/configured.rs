//! `ShouldRateLimit` with `[rls] config`: envoyproxy/ratelimit's semantics over Throttle's
//! store.
//!
//! Each descriptor is matched on its own against the domain's descriptor tree
//! (`descriptors::RlsConfig::lookup`, in `plan`) and, when a limit applies, decided by its
//! own check: the domain's scope, one fixed window aligned to the Unix epoch, the counter
//! named by the descriptor's entries.
//!
//! **All or nothing.** A call answered `OVER_LIMIT` consumes nothing on any descriptor,
//! on every store (memory, Redis `exact`, Redis `auto` with leases). A store check is
//! all-or-nothing only within itself, so a call with several descriptors is decided in two
//! rounds: first every limited descriptor is looked at without charging (a `peek` of its
//! hits), and only when that look admits the call are they charged, concurrently. A call
//! charging one descriptor that no other can refuse skips the look: its one check
//! decides it. On Redis `exact` the look is one more round trip per descriptor; with
//! leases both rounds are served by the lease in hand. Between the look and the charge a
//! concurrent call may take the last units of a descriptor: its charge is then refused,
//! so is the call, and the descriptors charged meanwhile are refunded at once
//! (`LimitStore::settle`; on Redis back to the lease that paid them while it is in hand).
//! Only in that race do a refused call's units exist at all, for a moment, and the error is
//! then towards refusing, never towards admitting too much.
//!
//! **`limit_remaining`** is what a descriptor has left once the call is done: after an
//! admitted call with its hits taken, after a refused call (or for `hits_addend` 0) as it
//! stands, 0 when it is over its limit. `requests_per_unit: 0` is always over, as in
//! envoyproxy/ratelimit (a descriptor's own `limit` too), decided without the store.
//!
//! What differs from envoyproxy/ratelimit (which counts every request, refused or not):
//! a refused request consumes nothing on any descriptor, and a descriptor `hits_addend`
//! of 0 answers whether one more unit would fit (a counter never passes its limit here,
//! so "over the limit" can only mean "no unit left").

mod plan;
mod reply;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures_util::future::join_all;

use self::plan::{drop_replaced, plan, scope_limits, Limited, Plan};
use crate::admission::{self, Core};
use crate::clock::Clock;
use crate::config::{Rls, RlsDescriptors};
use crate::limiter::{Check, OnFailure, ScopeLimits, Verdict};

/// Most descriptors one request may carry.
pub(super) const MAX_DESCRIPTORS: usize = 64;

/// One limited descriptor's outcome.
struct Outcome {
    /// Within its limit: the store admitted its check (for a look: its hits would fit).
    fits: bool,
    /// Units left with the call's hits taken (for a look: what the charge would leave).
    left_after: u32,
    /// Units left as it stands, nothing of the call taken (0 when over or unknown).
    left_now: u32,
    /// Ms until the window ends.
    reset_ms: u64,
    /// What to refund when the call is refused (None: nothing was charged).
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
    validate(req)?;
    let Some(&scope) = d.scopes.get(&req.domain) else {
        reply::count(core, "unknown", false);
        return Ok(RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses: vec![reply::status(Code::Ok, None, 0, 0); req.descriptors.len()],
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
        .map(|p| p.limited().filter(|l| !l.closed()))
        .map(|l| l.map(|l| scope_limits(rls, &l.limit)))
        .collect();
    let checks: Vec<Option<Check<'_>>> = plans
        .iter()
        .zip(&limits)
        .map(|(p, sl)| Some(p.limited()?.check(scope, sl.as_ref()?)))
        .collect();
    let outcomes = outcomes(core, &plans, &checks).await;
    let refused = refused(&plans, &outcomes);
    if refused {
        refund(core, &checks, &outcomes);
    }
    reply::count(core, &req.domain, refused);
    let fits: Vec<Option<bool>> = outcomes
        .iter()
        .map(|o| o.as_ref().map(|o| o.fits))
        .collect();
    reply::count_descriptors(core, &req.domain, &plans, &fits);
    Ok(respond(rls, &req.domain, &plans, &outcomes, refused))
}

/// An empty domain or descriptor list, or too many descriptors.
fn validate(req: &RateLimitRequest) -> Result<(), String> {
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
    Ok(())
}

/// Every limited descriptor's outcome, in request order: looked at first, charged only
/// when the look admits the call (see the module docs).
async fn outcomes(
    core: &Core,
    plans: &[Plan<'_>],
    checks: &[Option<Check<'_>>],
) -> Vec<Option<Outcome>> {
    let now_ms = core.clock.now_ms();
    let at_once = charge_at_once(plans, checks);
    let looks = plans.iter().zip(checks).map(|(p, c)| async move {
        let l = p.limited()?;
        if l.closed() {
            return Some(Outcome::closed(l, now_ms));
        }
        let c = c.as_ref()?;
        if at_once || c.peek {
            Some(outcome(core, c).await)
        } else {
            Some(outcome(core, &look(c)).await)
        }
    });
    let mut out = join_all(looks).await;
    if at_once || refused(plans, &out) {
        return out;
    }
    let charges = checks.iter().zip(&out).map(|(c, o)| async move {
        match (c, o) {
            (Some(c), Some(o)) if !c.peek && o.fits => Some(outcome(core, c).await),
            _ => None,
        }
    });
    let charged = join_all(charges).await;
    for (o, charged) in out.iter_mut().zip(charged) {
        if charged.is_some() {
            *o = charged;
        }
    }
    out
}

/// Whether the call may be decided by charging at once, without a look: at most one
/// descriptor is charged and no other can refuse the call, so a refusal charged nothing.
fn charge_at_once(plans: &[Plan<'_>], checks: &[Option<Check<'_>>]) -> bool {
    let mut charged = checks
        .iter()
        .enumerate()
        .filter(|(_, c)| c.as_ref().is_some_and(|c| !c.peek))
        .map(|(i, _)| i);
    let first = charged.next();
    if charged.next().is_some() {
        return false;
    }
    plans
        .iter()
        .enumerate()
        .all(|(i, p)| !p.can_refuse() || Some(i) == first)
}

/// `c` as a look: decided, nothing charged.
fn look<'a>(c: &Check<'a>) -> Check<'a> {
    Check {
        peek: true,
        ..c.clone()
    }
}

/// Whether the call is `OVER_LIMIT`: a non-shadow descriptor over its limit, or, where
/// there are quota descriptors, every one of them over (a shadow one never is).
fn refused(plans: &[Plan<'_>], outcomes: &[Option<Outcome>]) -> bool {
    let (mut quota, mut quota_over) = (0usize, 0usize);
    for (p, o) in plans.iter().zip(outcomes) {
        let (Some(l), Some(o)) = (p.limited(), o) else {
            continue;
        };
        let over = !o.fits && !l.limit.shadow_mode;
        if l.limit.quota_mode {
            quota += 1;
            quota_over += usize::from(over);
        } else if over {
            return true;
        }
    }
    quota > 0 && quota == quota_over
}

/// Gives back every charge of a refused call (charges raced after the look).
fn refund(core: &Core, checks: &[Option<Check<'_>>], outcomes: &[Option<Outcome>]) {
    for (c, o) in checks.iter().zip(outcomes) {
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

/// One limited descriptor decided by the store. A store that cannot decide answers by
/// `[rls] on_failure`: closed refuses, open admits (the tiered store decides `local`
/// itself and answers a verdict).
async fn outcome(core: &Core, c: &Check<'_>) -> Outcome {
    let limit = c
        .scopes
        .first()
        .and_then(|s| s.limits.windows.first())
        .map_or(0, |w| w.limit);
    match admission::decide(core, c).await {
        Ok(v) => {
            let (remaining, reset_ms) = v.governing.map_or((limit, 0), |g| {
                (g.decision.remaining, g.decision.reset_after_ms)
            });
            Outcome {
                fits: v.allowed,
                left_after: remaining,
                left_now: crate::reply::headers::unspent(v.allowed, remaining, c.cost, limit),
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
                left_after: 0,
                left_now: 0,
                reset_ms: 0,
                charged: None,
            }
        }
    }
}

/// The answer: each descriptor's status, the overall code, the RateLimit-* headers
/// (`[rls] response_headers`) and, when refused, the JSON body.
fn respond(
    rls: &Rls,
    domain: &str,
    plans: &[Plan<'_>],
    outcomes: &[Option<Outcome>],
    refused: bool,
) -> RateLimitResponse {
    let statuses: Vec<DescriptorStatus> = plans
        .iter()
        .zip(outcomes)
        .map(|(p, o)| descriptor_status(p, o.as_ref(), refused))
        .collect();
    let overall = if refused { Code::OverLimit } else { Code::Ok };
    let mut response = RateLimitResponse {
        overall_code: overall.into(),
        ..RateLimitResponse::default()
    };
    if rls.response_headers {
        response.response_headers_to_add = reply::nearest_headers(plans, &statuses);
    }
    if refused {
        if let Some((i, _)) = reply::first_over(plans, &statuses) {
            response.raw_body = reply::body(domain, &plans[i], &statuses[i]);
            response
                .response_headers_to_add
                .push(reply::header("content-type", "application/json"));
        }
    }
    response.statuses = statuses;
    response
}

/// One descriptor's status: over its limit (OK in shadow mode) with remaining 0, else
/// what it has left once the call is done (see the module docs).
fn descriptor_status(p: &Plan<'_>, o: Option<&Outcome>, refused: bool) -> DescriptorStatus {
    let (l, o) = match (p, o) {
        (Plan::Limited(l), Some(o)) => (l, o),
        (Plan::Unlimited(_), _) => return reply::status(Code::Ok, None, u32::MAX, 0),
        _ => return reply::status(Code::Ok, None, 0, 0),
    };
    let code = if !o.fits && !l.limit.shadow_mode {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let taken = !refused && o.charged.is_some();
    let remaining = match (o.fits, taken) {
        (false, _) => 0,
        (true, true) => o.left_after,
        (true, false) => o.left_now,
    };
    reply::status(code, Some(&l.limit), remaining, o.reset_ms)
}

// === impl Outcome ===

impl Outcome {
    /// `requests_per_unit: 0`: over until its window ends, as envoyproxy/ratelimit
    /// answers it (every hit is over a limit of 0), with no store call.
    fn closed(l: &Limited<'_>, now_ms: u64) -> Outcome {
        let period = plan::window(l.limit.unit).period_ms().max(1);
        Outcome {
            fits: false,
            left_after: 0,
            left_now: 0,
            reset_ms: period - now_ms % period,
            charged: None,
        }
    }
}

#[cfg(test)]
mod tests;
