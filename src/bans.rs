//! Automatic temporary bans: an identity a scope rejected `ban.after` times within
//! `ban.within_secs` is blocked for `ban.for_secs`.
//!
//! `Bans` holds the bans this gateway enforces (its own, and on Redis the fleet's, merged
//! every second by the ban sync) and, on the memory store, the rejection counts. The
//! request path asks [`Bans::banned`]: one atomic load while nothing is banned, one
//! read-locked hash lookup otherwise; a banned caller costs that lookup, not a limiter
//! decision. Both maps are bounded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};

use crate::limiter::{BanRule, Ident, Scope};

/// Most bans held; past it the ones expiring first are dropped.
const MAX_BANS: usize = 100_000;
/// Most identities whose rejections are counted locally (memory store).
const MAX_STRIKES: usize = 100_000;

/// One ban.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ban {
    /// The scope that banned.
    pub scope: Scope,
    /// Who, as text (an address, an IPv6 network, a key id or a tenant id).
    pub value: String,
    /// `automatic: N rate-limit rejections in Ss`.
    pub reason: String,
    /// When it ends (Unix ms).
    pub expires_at_ms: u64,
}

/// Rejections of one identity in its current span.
#[derive(Debug, Clone, Copy)]
struct Strike {
    since_ms: u64,
    count: u32,
}

/// The bans in force and the local rejection counts.
#[derive(Default)]
pub struct Bans {
    active: RwLock<HashMap<(Scope, Ident), Ban>>,
    /// Whether `active` may hold anything: lets the common case skip the lock.
    any: AtomicBool,
    strikes: Mutex<HashMap<(Scope, Ident), Strike>>,
}

// === impl Ban ===

impl Ban {
    /// The ban `rule` of `scope` puts on `ident` at `now_ms`.
    pub fn new(scope: Scope, ident: &Ident, rule: &BanRule, now_ms: u64) -> Self {
        Ban {
            scope,
            value: ident.to_string(),
            reason: format!(
                "automatic: {} rate-limit rejections in {}s",
                rule.after,
                rule.within_ms / 1000
            ),
            expires_at_ms: now_ms.saturating_add(rule.for_ms),
        }
    }

    /// Its id in `/v1/blocks`: negative (posted blocks are positive), the same on every
    /// gateway (FNV-1a of scope and value, 53 bits so JSON numbers hold it).
    pub fn id(&self) -> i64 {
        ban_id(self.scope, &self.value)
    }

    /// Whole seconds until it ends, at least 1.
    pub fn retry_after_secs(&self, now_ms: u64) -> u64 {
        self.expires_at_ms
            .saturating_sub(now_ms)
            .div_ceil(1000)
            .max(1)
    }
}

/// The `/v1/blocks` id of the ban of `scope` on `value`.
pub fn ban_id(scope: Scope, value: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in scope.as_str().bytes().chain([b':']).chain(value.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let id = i64::try_from(h & ((1 << 53) - 1)).unwrap_or(0);
    -id - 1
}

// === impl Bans ===

impl Bans {
    /// The ban on `ident` in `scope`, if one is in force at `now_ms`.
    pub fn banned(&self, scope: Scope, ident: &Ident, now_ms: u64) -> Option<Ban> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let active = self.active.read().unwrap_or_else(PoisonError::into_inner);
        active
            .get(&(scope, ident.clone()))
            .filter(|b| b.expires_at_ms > now_ms)
            .cloned()
    }

    /// Counts a rejection of `ident` by `scope` under `rule` (memory store): the count in
    /// the current span, which starts at the first rejection and lasts `within_ms`.
    pub fn strike(&self, scope: Scope, ident: &Ident, rule: &BanRule, now_ms: u64) -> u32 {
        let mut strikes = self.strikes.lock().unwrap_or_else(PoisonError::into_inner);
        if strikes.len() >= MAX_STRIKES {
            strikes.retain(|_, s| now_ms < s.since_ms.saturating_add(rule.within_ms));
            if strikes.len() >= MAX_STRIKES {
                strikes.clear(); // a spray of identities: forget them rather than grow
            }
        }
        let s = strikes.entry((scope, ident.clone())).or_insert(Strike {
            since_ms: now_ms,
            count: 0,
        });
        if now_ms >= s.since_ms.saturating_add(rule.within_ms) {
            *s = Strike {
                since_ms: now_ms,
                count: 0,
            };
        }
        s.count = s.count.saturating_add(1);
        s.count
    }

    /// Puts `ban` on `ident` (replacing an earlier one) at `now_ms`.
    pub fn insert(&self, ident: Ident, ban: Ban, now_ms: u64) {
        let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
        if active.len() >= MAX_BANS {
            active.retain(|_, b| b.expires_at_ms > now_ms);
        }
        if active.len() >= MAX_BANS {
            let first = active.iter().min_by_key(|(_, b)| b.expires_at_ms);
            if let Some(k) = first.map(|(k, _)| k.clone()) {
                active.remove(&k);
            }
        }
        active.insert((ban.scope, ident), ban);
        self.any.store(true, Ordering::Relaxed);
    }

    /// Lifts the ban of `/v1/blocks` id `id`; the lifted ban, if there was one.
    pub fn lift(&self, id: i64) -> Option<Ban> {
        let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
        let key = active.iter().find(|(_, b)| b.id() == id)?.0.clone();
        let ban = active.remove(&key);
        self.any.store(!active.is_empty(), Ordering::Relaxed);
        ban
    }

    /// The bans in force at `now_ms`, soonest to end first.
    pub fn list(&self, now_ms: u64) -> Vec<Ban> {
        let active = self.active.read().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<Ban> = active
            .values()
            .filter(|b| b.expires_at_ms > now_ms)
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.expires_at_ms, &a.value).cmp(&(b.expires_at_ms, &b.value)));
        out
    }

    /// Replaces the bans with the fleet's (`remote`, from Redis) and drops expired ones.
    pub fn replace(&self, remote: Vec<(Ident, Ban)>, now_ms: u64) {
        let fresh: HashMap<(Scope, Ident), Ban> = remote
            .into_iter()
            .filter(|(_, b)| b.expires_at_ms > now_ms)
            .take(MAX_BANS)
            .map(|(ident, b)| ((b.scope, ident), b))
            .collect();
        let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
        *active = fresh;
        self.any.store(!active.is_empty(), Ordering::Relaxed);
    }

    /// Drops expired bans (memory store; on Redis `replace` does).
    pub fn prune(&self, now_ms: u64) {
        let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
        active.retain(|_, b| b.expires_at_ms > now_ms);
        self.any.store(!active.is_empty(), Ordering::Relaxed);
    }
}

/// The identity a ban's scope and value name (the inverse of `Ident`'s `Display`).
pub fn parse_ident(scope: Scope, value: &str) -> Option<Ident> {
    match scope {
        Scope::Ip | Scope::Auth => match value.parse::<ipnet::Ipv6Net>() {
            Ok(net) => Some(Ident::Net(net)),
            Err(_) => value.parse().ok().map(Ident::Ip),
        },
        Scope::Key | Scope::Tenant if !value.is_empty() => Some(Ident::Name(value.into())),
        Scope::Key | Scope::Tenant | Scope::Global => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: BanRule = BanRule {
        after: 3,
        within_ms: 10_000,
        for_ms: 60_000,
    };

    fn ip(s: &str) -> Ident {
        Ident::Ip(s.parse().unwrap())
    }

    /// (ms of each rejection, count after it): the span starts at the first rejection
    /// and a rejection past it starts a new one.
    #[test]
    fn strikes_count_within_the_span() {
        let bans = Bans::default();
        let cases = [(0, 1), (1_000, 2), (9_999, 3), (10_000, 1), (15_000, 2)];
        for (at, want) in cases {
            assert_eq!(
                bans.strike(Scope::Ip, &ip("1.2.3.4"), &RULE, at),
                want,
                "at {at}"
            );
        }
        // Another identity, another scope: counted apart.
        assert_eq!(bans.strike(Scope::Key, &ip("1.2.3.4"), &RULE, 15_000), 1);
        assert_eq!(bans.strike(Scope::Ip, &ip("1.2.3.5"), &RULE, 15_000), 1);
    }

    /// A ban is in force until it expires, then gone; lifting it by id ends it at once.
    #[test]
    fn bans_expire_and_lift() {
        let bans = Bans::default();
        let who = ip("203.0.113.7");
        assert_eq!(bans.banned(Scope::Ip, &who, 0), None);
        let ban = Ban::new(Scope::Ip, &who, &RULE, 1_000);
        assert_eq!(ban.reason, "automatic: 3 rate-limit rejections in 10s");
        assert_eq!(ban.retry_after_secs(1_000), 60);
        assert_eq!(ban.retry_after_secs(60_500), 1);
        bans.insert(who.clone(), ban.clone(), 1_000);
        assert_eq!(bans.banned(Scope::Ip, &who, 60_999), Some(ban.clone()));
        assert_eq!(bans.banned(Scope::Key, &who, 2_000), None);
        assert_eq!(bans.banned(Scope::Ip, &who, 61_000), None);
        assert_eq!(bans.list(2_000), std::slice::from_ref(&ban));
        assert!(ban.id() < 0);
        assert_eq!(bans.lift(ban.id()).as_ref(), Some(&ban));
        assert_eq!(bans.banned(Scope::Ip, &who, 2_000), None);
        assert_eq!(bans.lift(ban.id()), None);
    }

    /// Values round-trip through their text (what Redis and `/v1/blocks` carry).
    #[test]
    fn idents_round_trip() {
        let cases = [
            (
                Scope::Ip,
                Ident::client("2001:db8:1:2::9".parse().unwrap(), 64),
            ),
            (Scope::Ip, ip("203.0.113.7")),
            (Scope::Auth, ip("2001:db8::1")),
            (Scope::Key, Ident::Name("key_demo".into())),
            (Scope::Tenant, Ident::Name("acme".into())),
        ];
        for (scope, ident) in cases {
            assert_eq!(parse_ident(scope, &ident.to_string()), Some(ident.clone()));
        }
        assert_eq!(parse_ident(Scope::Key, ""), None);
        assert_eq!(parse_ident(Scope::Ip, "nonsense"), None);
    }

    /// A spray of identities does not grow the strike map past its bound.
    #[test]
    fn strikes_are_bounded() {
        let bans = Bans::default();
        for i in 0..(MAX_STRIKES as u32 + 10) {
            let who = Ident::Ip(std::net::IpAddr::from(i.to_be_bytes()));
            bans.strike(Scope::Ip, &who, &RULE, 0);
        }
        let n = bans.strikes.lock().unwrap().len();
        assert!(n <= MAX_STRIKES, "{n}");
    }
}
