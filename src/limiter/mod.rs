//! Limits, algorithms and the layered decision.
//!
//! A request is checked against its scopes (the built-in ip, key, tenant and global, and
//! the named ones: a route's tables, custom scopes; at most `MAX_SCOPES`), each with one or
//! more windows. The decision is all-or-nothing: every window of every
//! scope is evaluated first (a dry run), and only when all of them allow the request is
//! any of them charged. When a later scope rejects, the earlier scopes keep their
//! remaining count untouched: nothing is charged (unlike Envoy ratelimit #185).
//!
//! This module knows nothing of HTTP or Pingora; stores (`crate::store`) own atomicity.

pub mod algorithm;
pub mod check;
pub mod decision;
pub mod named;
pub mod outcome;
pub mod policy;
pub mod scale;

pub use check::{
    canonical, canonical_net, network, Check, Ident, Quota, ScopeCheck, MAX_SCOPES, MAX_SLOTS,
};
pub use decision::{DecidedAt, Decision, Verdict, WindowDecision};
pub use outcome::StatusSet;
pub use policy::{
    Admission, Algorithm, BanRule, Base, Fleet, Named, OnFailure, Scope, ScopeLimits, Window,
    WindowLimit, MAX_NAMED,
};
