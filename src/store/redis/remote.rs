//! The part of a check that goes to Redis: the windows not paid from leases.

use super::local::{Plan, WindowPlan};
use super::wire::LeaseArgs;
use crate::limiter::{Check, DecidedAt, ScopeCheck};

/// The part of a check Redis decides: the windows not paid from leases.
pub(super) struct Remote<'a> {
    /// Scopes with at least one remote window: the scope, and its limits reduced to the
    /// remote windows when some were covered.
    pub(super) parts: Vec<(ScopeCheck<'a>, Option<crate::limiter::ScopeLimits>)>,
    /// Lease arguments of each part's windows.
    pub(super) leases: Vec<smallvec::SmallVec<[LeaseArgs; 2]>>,
    /// Decisions of the covered windows.
    pub(super) covered: Vec<crate::limiter::WindowDecision>,
    /// When the leases paying the covered windows were granted, per window.
    pub(super) granted_at: DecidedAt,
}

impl<'a> Remote<'a> {
    pub(super) fn of(check: &Check<'a>, plan: &Plan) -> Self {
        let mut out = Remote {
            parts: Vec::with_capacity(check.scopes.len()),
            leases: Vec::with_capacity(check.scopes.len()),
            covered: Vec::new(),
            granted_at: DecidedAt::default(),
        };
        for (i, s) in check.scopes.iter().enumerate() {
            let Some(plans) = plan.scopes.get(i) else {
                out.parts.push((s.clone(), None));
                out.leases.push(smallvec::SmallVec::new());
                continue;
            };
            let mut windows = Vec::new();
            let mut args = smallvec::SmallVec::new();
            for (j, (w, p)) in s.limits.windows.iter().zip(plans).enumerate() {
                match p {
                    WindowPlan::Covered {
                        decision,
                        granted_at,
                        ..
                    } => {
                        out.covered.push(*decision);
                        out.granted_at.add_window(&check.scopes, i, j, *granted_at);
                    }
                    WindowPlan::Remote(a) => {
                        windows.push(*w);
                        args.push(*a);
                    }
                }
            }
            if windows.is_empty() {
                continue;
            }
            let reduced =
                (windows.len() < s.limits.windows.len()).then(|| crate::limiter::ScopeLimits {
                    windows,
                    ..s.limits.clone()
                });
            out.parts.push((s.clone(), reduced));
            out.leases.push(args);
        }
        out
    }

    /// The scopes to send, each with its remote windows.
    pub(super) fn scopes(&self) -> Vec<ScopeCheck<'_>> {
        self.parts
            .iter()
            .map(|(s, reduced)| ScopeCheck {
                scope: s.scope,
                ident: s.ident.clone(),
                limits: reduced.as_ref().unwrap_or(s.limits),
            })
            .collect()
    }
}
