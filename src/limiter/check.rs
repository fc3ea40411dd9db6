//! The input of a layered check: which identities, under which limits, at what cost.

use std::net::IpAddr;
use std::sync::Arc;

use arrayvec::ArrayVec;

use super::policy::{Scope, ScopeLimits, WindowLimit};

/// The identity a scope counts. Cheap to clone: an address, or a shared name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Ident {
    /// A client address (ip scope).
    Ip(IpAddr),
    /// A key id or tenant id.
    Name(Arc<str>),
    /// The single global identity.
    Global,
}

/// One scope of a check.
#[derive(Debug, Clone)]
pub struct ScopeCheck<'a> {
    /// The scope.
    pub scope: Scope,
    /// Who is counted.
    pub ident: Ident,
    /// The scope's windows.
    pub limits: &'a ScopeLimits,
}

/// Everything a store needs to decide one request. Holds at most one entry per scope.
#[derive(Debug, Clone, Default)]
pub struct Check<'a> {
    /// The scopes, in evaluation order (ip, key, tenant, global; or auth alone). Sized
    /// from the type: one entry per scope at most.
    pub scopes: ArrayVec<ScopeCheck<'a>, { Scope::COUNT }>,
    /// Units the request spends in every window (route `cost`); at least 1.
    pub cost: u32,
    /// Decide without charging anything (a look at the state).
    pub peek: bool,
}

// === impl Ident ===

impl Ident {
    /// The per-identity reset offset in `[0, limit.jitter_ms)`: stable across processes
    /// (FNV-1a of the identity), so every gateway of a fleet agrees on it.
    pub fn offset_ms(&self, limit: &WindowLimit) -> u64 {
        if limit.jitter_ms == 0 {
            return 0;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut feed = |bytes: &[u8]| {
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        match self {
            Ident::Ip(IpAddr::V4(a)) => feed(&a.octets()),
            Ident::Ip(IpAddr::V6(a)) => feed(&a.octets()),
            Ident::Name(n) => feed(n.as_bytes()),
            Ident::Global => feed(b"global"),
        }
        h % limit.jitter_ms
    }
}

impl std::fmt::Display for Ident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ident::Ip(ip) => write!(f, "{ip}"),
            Ident::Name(n) => f.write_str(n),
            Ident::Global => f.write_str("all"),
        }
    }
}

// === impl Check ===

impl<'a> Check<'a> {
    /// An empty check of `cost`.
    pub fn new(cost: u32) -> Self {
        Self {
            scopes: ArrayVec::new(),
            cost: cost.max(1),
            peek: false,
        }
    }

    /// Adds a scope; ignored when the scope has no windows or is already present (so
    /// there is always room: at most one entry per scope).
    pub fn push(&mut self, scope: Scope, ident: Ident, limits: &'a ScopeLimits) {
        if limits.windows.is_empty() || self.scopes.iter().any(|s| s.scope == scope) {
            return;
        }
        self.scopes.push(ScopeCheck {
            scope,
            ident,
            limits,
        });
    }

    /// Whether no scope applies.
    pub fn is_empty(&self) -> bool {
        self.scopes.is_empty()
    }
}
