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

/// Most bans held. At the cap a new ban is refused (and counted), never put in place of
/// another: a flood of bans on others cannot lift an earlier one.
pub const MAX_BANS: usize = 100_000;
/// Most identities whose rejections are counted locally (on Redis too: there the entry
/// also holds the rejections not yet sent to the fleet's count).
pub const MAX_STRIKES: usize = 100_000;
/// On Redis, the shortest time between two calls adding one identity's rejections to the
/// fleet's count (a rejection's `retry_after` may be a few ms).
pub const MIN_STRIKE_INTERVAL_MS: u64 = 100;

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

/// Rejections of one identity: counted in `[starts_ms, ends_ms)`. After a ban the entry
/// is quiet until the ban ends (`starts_ms == ends_ms ==` its end): rejections then are
/// not counted, and the first one after it starts a new span.
///
/// On Redis the entry also gates the calls adding to the fleet's count: `pending`
/// rejections wait here until `next_call_ms`, then go in one call.
#[derive(Debug, Clone, Copy)]
struct Strike {
    starts_ms: u64,
    ends_ms: u64,
    count: u32,
    /// Rejections of this span not yet added to the fleet's count (Redis).
    pending: u32,
    /// No call adds to the fleet's count before this.
    next_call_ms: u64,
    /// A call adding to the fleet's count is under way (at most one at a time).
    calling: bool,
}

impl Strike {
    /// Quiet until `until_ms` (a ban's end). A call under way stays known as such.
    fn quiet(until_ms: u64, calling: bool) -> Self {
        Strike {
            starts_ms: until_ms,
            ends_ms: until_ms,
            count: 0,
            pending: 0,
            next_call_ms: 0,
            calling,
        }
    }
}

/// What one rejection on a gateway sharing its counts (Redis) calls for; see
/// [`Bans::strike_shared`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tally {
    /// Nothing now: counted here (it goes with the next call), or quiet (a ban is in
    /// force).
    Held,
    /// This gateway's own count reached `after`: ban now (its count is at most the
    /// fleet's).
    Ban,
    /// Add `n` rejections to the fleet's count now, in one call; report its end with
    /// [`Bans::sent`] and `span_ms`.
    Send {
        /// Rejections to add.
        n: u32,
        /// The span they were counted in (its start).
        span_ms: u64,
    },
}

/// The bans in force and when the first of them ends.
#[derive(Default)]
struct Active {
    map: HashMap<(Scope, Ident), Ban>,
    /// No ban in `map` ends before this (`u64::MAX` when empty): at the cap, nothing can
    /// be pruned before then, so a refusal costs no scan.
    soonest_ms: u64,
}

/// The bans in force and the local rejection counts.
pub struct Bans {
    active: RwLock<Active>,
    /// Whether `active` may hold anything: lets the common case skip the lock.
    any: AtomicBool,
    strikes: Mutex<HashMap<(Scope, Ident), Strike>>,
    max_bans: usize,
    max_strikes: usize,
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

impl Default for Bans {
    fn default() -> Self {
        Self::with_caps(MAX_BANS, MAX_STRIKES)
    }
}

impl Bans {
    /// A table holding at most `max_bans` bans and `max_strikes` rejection counts.
    pub fn with_caps(max_bans: usize, max_strikes: usize) -> Self {
        Self {
            active: RwLock::new(Active {
                map: HashMap::new(),
                soonest_ms: u64::MAX,
            }),
            any: AtomicBool::new(false),
            strikes: Mutex::new(HashMap::new()),
            max_bans,
            max_strikes,
        }
    }

    /// The ban on `ident` in `scope`, if one is in force at `now_ms`.
    pub fn banned(&self, scope: Scope, ident: &Ident, now_ms: u64) -> Option<Ban> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let active = self.active.read().unwrap_or_else(PoisonError::into_inner);
        active
            .map
            .get(&(scope, ident.clone()))
            .filter(|b| b.expires_at_ms > now_ms)
            .cloned()
    }

    /// Counts a rejection of `ident` by `scope` under `rule` (memory store): the count in
    /// the current span, which starts at the first rejection and lasts `within_ms`. While
    /// a ban this table imposed on `ident` lasts, nothing is counted (0): the span
    /// restarts when the ban ends.
    ///
    /// At the cap, spans that are over are forgotten, then (a spray of identities) the
    /// half with the fewest rejections: an identity close to its ban keeps its count.
    pub fn strike(&self, scope: Scope, ident: &Ident, rule: &BanRule, now_ms: u64) -> u32 {
        self.with_strike(scope, ident, rule, now_ms, |s| s.count)
            .unwrap_or(0)
    }

    /// Counts a rejection as [`Bans::strike`] does, on a gateway that shares its counts
    /// (Redis), and says what to do about it. The rejection is also held as pending for
    /// the fleet's count; the pending ones go in one call (`Send`) when no call is under
    /// way and `interval_ms` (the rejection's `retry_after`, at least
    /// [`MIN_STRIKE_INTERVAL_MS`], at most the span) has passed since the last call: one
    /// call per identity per interval, however fast the rejections come. This gateway's
    /// own count reaching `after` bans at once (`Ban`).
    pub fn strike_shared(
        &self,
        scope: Scope,
        ident: &Ident,
        rule: &BanRule,
        now_ms: u64,
        interval_ms: u64,
    ) -> Tally {
        let interval_ms = interval_ms
            .max(MIN_STRIKE_INTERVAL_MS)
            .min(rule.within_ms.max(1));
        self.with_strike(scope, ident, rule, now_ms, |s| {
            s.pending = s.pending.saturating_add(1);
            if s.count == rule.after {
                // The ban quiets the fleet's count: what is pending no longer matters.
                s.pending = 0;
                return Tally::Ban;
            }
            if s.calling || now_ms < s.next_call_ms {
                return Tally::Held;
            }
            let n = std::mem::take(&mut s.pending);
            s.calling = true;
            s.next_call_ms = now_ms.saturating_add(interval_ms);
            Tally::Send {
                n,
                span_ms: s.starts_ms,
            }
        })
        .unwrap_or(Tally::Held)
    }

    /// The call a `Send` asked for is over: `unsent` of its rejections did not reach the
    /// fleet's count (all of them when it failed) and go with the next call, if their
    /// span (`span_ms`) is still the current one.
    pub fn sent(&self, scope: Scope, ident: &Ident, span_ms: u64, unsent: u32) {
        let mut strikes = self.strikes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = strikes.get_mut(&(scope, ident.clone())) {
            s.calling = false;
            if s.starts_ms == span_ms && s.starts_ms < s.ends_ms {
                s.pending = s.pending.saturating_add(unsent);
            }
        }
    }

    /// Counts a rejection in its span (a new span when the last is over) and hands the
    /// entry to `f`; None (nothing counted) while the entry is quiet.
    fn with_strike<R>(
        &self,
        scope: Scope,
        ident: &Ident,
        rule: &BanRule,
        now_ms: u64,
        f: impl FnOnce(&mut Strike) -> R,
    ) -> Option<R> {
        let mut strikes = self.strikes.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (scope, ident.clone());
        if strikes.len() >= self.max_strikes && !strikes.contains_key(&key) {
            shed(&mut strikes, now_ms, self.max_strikes);
        }
        let s = strikes.entry(key).or_insert(Strike {
            starts_ms: now_ms,
            ends_ms: now_ms,
            count: 0,
            pending: 0,
            next_call_ms: 0,
            calling: false,
        });
        if now_ms < s.starts_ms {
            return None; // quiet: the ban is in force
        }
        if now_ms >= s.ends_ms {
            *s = Strike {
                starts_ms: now_ms,
                ends_ms: now_ms.saturating_add(rule.within_ms),
                count: 0,
                pending: 0,
                ..*s
            };
        }
        s.count = s.count.saturating_add(1);
        Some(f(s))
    }

    /// Puts `ban` on `ident` at `now_ms` (replacing an earlier ban on it) and makes its
    /// rejection count quiet until the ban ends. False (nothing changed) when the table
    /// is full of bans still in force.
    pub fn insert(&self, ident: Ident, ban: Ban, now_ms: u64) -> bool {
        let key = (ban.scope, ident);
        let until_ms = ban.expires_at_ms;
        {
            let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
            if !put(&mut active, key.clone(), ban, now_ms, self.max_bans) {
                return false;
            }
            self.any.store(true, Ordering::Relaxed);
        }
        let mut strikes = self.strikes.lock().unwrap_or_else(PoisonError::into_inner);
        if strikes.len() >= self.max_strikes && !strikes.contains_key(&key) {
            shed(&mut strikes, now_ms, self.max_strikes);
        }
        let calling = strikes.get(&key).is_some_and(|s| s.calling);
        strikes.insert(key, Strike::quiet(until_ms, calling));
        true
    }

    /// Lifts the ban of `/v1/blocks` id `id`; the lifted ban, if there was one. The
    /// identity's rejections are counted afresh.
    pub fn lift(&self, id: i64) -> Option<Ban> {
        let (key, ban) = {
            let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
            let key = active.map.iter().find(|(_, b)| b.id() == id)?.0.clone();
            let ban = active.map.remove(&key);
            self.any.store(!active.map.is_empty(), Ordering::Relaxed);
            (key, ban)
        };
        let mut strikes = self.strikes.lock().unwrap_or_else(PoisonError::into_inner);
        strikes.remove(&key);
        ban
    }

    /// The bans in force at `now_ms`, soonest to end first.
    pub fn list(&self, now_ms: u64) -> Vec<Ban> {
        let active = self.active.read().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<Ban> = active
            .map
            .values()
            .filter(|b| b.expires_at_ms > now_ms)
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.expires_at_ms, &a.value).cmp(&(b.expires_at_ms, &b.value)));
        out
    }

    /// Replaces the bans with the fleet's (`remote`, all of them, from Redis) and drops
    /// expired ones. The rejection counts of the banned identities go quiet until their
    /// bans end, as for a ban imposed here.
    pub fn replace(&self, remote: Vec<(Ident, Ban)>, now_ms: u64) {
        let fresh: HashMap<(Scope, Ident), Ban> = remote
            .into_iter()
            .filter(|(_, b)| b.expires_at_ms > now_ms)
            .take(self.max_bans)
            .map(|(ident, b)| ((b.scope, ident), b))
            .collect();
        self.quiet(fresh.iter().map(|(k, b)| (k, b.expires_at_ms)));
        let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
        active.soonest_ms = soonest(&fresh);
        active.map = fresh;
        self.any.store(!active.map.is_empty(), Ordering::Relaxed);
    }

    /// Applies what changed in the fleet's bans since the last sync (Redis): `set` (bans
    /// new or renewed) go in, `lifted` identities come out, and ended bans are dropped;
    /// the others stay as they are. Rejection counts follow as for bans imposed and
    /// lifted here: quiet while a ban lasts, afresh after a lift. At the cap, bans new
    /// here are refused (the fleet's table has the same cap).
    pub fn apply(&self, set: Vec<(Ident, Ban)>, lifted: Vec<(Scope, Ident)>, now_ms: u64) {
        let set: Vec<((Scope, Ident), Ban)> = set
            .into_iter()
            .filter(|(_, b)| b.expires_at_ms > now_ms)
            .map(|(ident, b)| ((b.scope, ident), b))
            .collect();
        {
            let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
            for key in &lifted {
                active.map.remove(key);
            }
            if active.soonest_ms <= now_ms {
                active.map.retain(|_, b| b.expires_at_ms > now_ms);
                active.soonest_ms = soonest(&active.map);
            }
            for (key, ban) in &set {
                put(&mut active, key.clone(), ban.clone(), now_ms, self.max_bans);
            }
            self.any.store(!active.map.is_empty(), Ordering::Relaxed);
        }
        self.quiet(set.iter().map(|(k, b)| (k, b.expires_at_ms)));
        if !lifted.is_empty() {
            let mut strikes = self.strikes.lock().unwrap_or_else(PoisonError::into_inner);
            for key in &lifted {
                strikes.remove(key);
            }
        }
    }

    /// Quiets the rejection counts already held for `banned` (identity, ban's end) until
    /// their bans end; identities without a count get none.
    fn quiet<'a>(&self, banned: impl Iterator<Item = (&'a (Scope, Ident), u64)>) {
        let mut strikes = self.strikes.lock().unwrap_or_else(PoisonError::into_inner);
        if strikes.is_empty() {
            return;
        }
        for (key, until_ms) in banned {
            if let Some(s) = strikes.get_mut(key) {
                *s = Strike::quiet(until_ms, s.calling);
            }
        }
    }

    /// Drops expired bans (memory store; on Redis the sync does). Costs nothing while
    /// no ban has ended.
    pub fn prune(&self, now_ms: u64) {
        let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
        if active.soonest_ms > now_ms {
            return;
        }
        active.map.retain(|_, b| b.expires_at_ms > now_ms);
        active.soonest_ms = soonest(&active.map);
        self.any.store(!active.map.is_empty(), Ordering::Relaxed);
    }
}

/// Puts `ban` under `key` in `active` unless it holds `max` bans in force and none on
/// `key` (then false: refused, never put in place of another).
fn put(active: &mut Active, key: (Scope, Ident), ban: Ban, now_ms: u64, max: usize) -> bool {
    if active.map.len() >= max && !active.map.contains_key(&key) {
        if active.soonest_ms <= now_ms {
            active.map.retain(|_, b| b.expires_at_ms > now_ms);
            active.soonest_ms = soonest(&active.map);
        }
        if active.map.len() >= max {
            return false;
        }
    }
    active.soonest_ms = active.soonest_ms.min(ban.expires_at_ms);
    active.map.insert(key, ban);
    true
}

/// When the first of `bans` ends (`u64::MAX`: none).
fn soonest(bans: &HashMap<(Scope, Ident), Ban>) -> u64 {
    bans.values()
        .map(|b| b.expires_at_ms)
        .min()
        .unwrap_or(u64::MAX)
}

/// Makes room in a full strike map (`max` entries): spans that are over go; if more than
/// half the map is left, the half (at least) with the fewest rejections goes too (quiet
/// entries, which stand for a ban in force, rank highest). Amortized O(1) per new
/// identity: each pass leaves at most half the map.
fn shed(strikes: &mut HashMap<(Scope, Ident), Strike>, now_ms: u64, max: usize) {
    strikes.retain(|_, s| now_ms < s.ends_ms);
    if strikes.len() <= max / 2 {
        return;
    }
    let rank = |s: &Strike| {
        if now_ms < s.starts_ms {
            u32::MAX
        } else {
            s.count
        }
    };
    let mut ranks: Vec<u32> = strikes.values().map(rank).collect();
    let mid = ranks.len() / 2;
    let (_, threshold, _) = ranks.select_nth_unstable(mid);
    let threshold = *threshold;
    strikes.retain(|_, s| rank(s) > threshold);
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
        from_check: false,
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

    /// At the cap a new ban is refused (false) and every ban in force stays; a ban that
    /// has ended makes room; renewing a ban in force is not a new one.
    #[test]
    fn a_full_table_refuses_new_bans_and_keeps_the_old() {
        let bans = Bans::with_caps(3, 10);
        let who = |i: u8| ip(&format!("198.51.100.{i}"));
        let rule = |for_ms| BanRule { for_ms, ..RULE };
        // The attacker's own long ban first, then two short ones on others.
        assert!(bans.insert(who(1), Ban::new(Scope::Ip, &who(1), &rule(3_600_000), 0), 0));
        assert!(bans.insert(who(2), Ban::new(Scope::Ip, &who(2), &rule(1_000), 0), 0));
        assert!(bans.insert(who(3), Ban::new(Scope::Ip, &who(3), &rule(2_000), 0), 0));
        // A flood of bans on others: all refused, the first ban survives.
        for i in 4..100 {
            assert!(!bans.insert(
                who(i),
                Ban::new(Scope::Ip, &who(i), &rule(9_999_999), 10),
                10
            ));
        }
        assert!(bans.banned(Scope::Ip, &who(1), 500).is_some());
        assert!(bans.banned(Scope::Ip, &who(2), 500).is_some());
        // Renewing a ban in force is allowed at the cap.
        assert!(bans.insert(who(2), Ban::new(Scope::Ip, &who(2), &rule(1_000), 600), 600));
        // Once one has ended (the one on .3 at 2 s), there is room again.
        assert!(bans.insert(
            who(50),
            Ban::new(Scope::Ip, &who(50), &rule(1_000), 2_000),
            2_000
        ));
        assert!(bans.banned(Scope::Ip, &who(50), 2_000).is_some());
        assert!(bans.banned(Scope::Ip, &who(1), 2_000).is_some());
        assert_eq!(bans.list(2_000).len(), 2, "{:?}", bans.list(2_000));
    }

    /// A ban restarts the counting span: rejections while it lasts (a gateway the ban
    /// has not reached) count nothing, and once it ends `after` rejections within
    /// `within` ban again, even inside the span that led to the first ban.
    #[test]
    fn a_ban_that_ends_can_be_struck_again() {
        let bans = Bans::default();
        let who = ip("192.0.2.9");
        let rule = BanRule {
            for_ms: 5_000,
            ..RULE
        }; // shorter than the 10 s span
        for (at, want) in [(0, 1), (1_000, 2), (2_000, 3)] {
            assert_eq!(bans.strike(Scope::Ip, &who, &rule, at), want);
        }
        assert!(bans.insert(who.clone(), Ban::new(Scope::Ip, &who, &rule, 2_000), 2_000));
        assert_eq!(
            bans.strike(Scope::Ip, &who, &rule, 3_000),
            0,
            "quiet while banned"
        );
        assert_eq!(bans.banned(Scope::Ip, &who, 7_000), None, "ended at 7 s");
        for (at, want) in [(7_000, 1), (7_500, 2), (8_000, 3)] {
            assert_eq!(bans.strike(Scope::Ip, &who, &rule, at), want, "at {at}");
        }
        // Lifting a ban counts afresh too.
        let again = Ban::new(Scope::Ip, &who, &rule, 8_000);
        assert!(bans.insert(who.clone(), again.clone(), 8_000));
        assert_eq!(bans.lift(again.id()), Some(again));
        assert_eq!(bans.strike(Scope::Ip, &who, &rule, 8_500), 1);
    }

    /// A spray of one-off identities filling the strike map does not reset the count of
    /// an identity close to its ban.
    #[test]
    fn a_spray_does_not_reset_a_count_near_a_ban() {
        let bans = Bans::with_caps(10, 100);
        let who = ip("192.0.2.1");
        bans.strike(Scope::Ip, &who, &RULE, 0);
        bans.strike(Scope::Ip, &who, &RULE, 0);
        for i in 0..1_000u32 {
            let other = Ident::Ip(std::net::IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
            bans.strike(Scope::Ip, &other, &RULE, 1);
        }
        assert!(bans.strikes.lock().unwrap().len() <= 100);
        assert_eq!(bans.strike(Scope::Ip, &who, &RULE, 2), 3);
    }

    /// On Redis: the first rejection calls, the ones within its interval are held, the
    /// first after it sends them all in one call; the local count reaching `after` bans
    /// at once.
    #[test]
    fn shared_strikes_call_once_per_interval_and_carry_the_rest() {
        let bans = Bans::default();
        let who = ip("192.0.2.20");
        let rule = BanRule { after: 10, ..RULE };
        let strike = |at| bans.strike_shared(Scope::Ip, &who, &rule, at, 1_000);
        assert_eq!(strike(0), Tally::Send { n: 1, span_ms: 0 });
        // Within the interval, and while the call is under way: held.
        for at in [1, 200, 999] {
            assert_eq!(strike(at), Tally::Held, "at {at}");
        }
        // The interval is over but the call is not: still held.
        assert_eq!(strike(1_000), Tally::Held);
        bans.sent(Scope::Ip, &who, 0, 0);
        // The next call carries the four held meanwhile and this one.
        assert_eq!(strike(1_001), Tally::Send { n: 5, span_ms: 0 });
        // A failed call: its rejections go with the next.
        bans.sent(Scope::Ip, &who, 0, 5);
        assert_eq!(strike(2_001), Tally::Send { n: 6, span_ms: 0 });
        bans.sent(Scope::Ip, &who, 0, 0);
        // Rejections 8 and 9 held; the 10th (local count = after) bans at once.
        assert_eq!(strike(2_002), Tally::Held);
        assert_eq!(strike(2_003), Tally::Held);
        assert_eq!(strike(2_004), Tally::Ban);
    }

    /// The interval is the rejection's retry_after, at least `MIN_STRIKE_INTERVAL_MS`,
    /// at most the span; a new span drops what was held in the last.
    #[test]
    fn shared_strike_intervals_are_bounded_and_spans_restart() {
        let bans = Bans::default();
        let who = ip("192.0.2.21");
        let rule = BanRule {
            after: 1_000,
            ..RULE
        }; // a 10 s span
        let strike = |at, every| bans.strike_shared(Scope::Ip, &who, &rule, at, every);
        let done = |span, unsent| bans.sent(Scope::Ip, &who, span, unsent);
        // A 1 ms retry_after waits 100 ms.
        assert_eq!(strike(0, 1), Tally::Send { n: 1, span_ms: 0 });
        done(0, 0);
        assert_eq!(strike(99, 1), Tally::Held);
        // An hour's retry_after waits the span (10 s), not the hour.
        assert_eq!(strike(100, 3_600_000), Tally::Send { n: 2, span_ms: 0 });
        assert_eq!(strike(9_999, 1), Tally::Held);
        // That call fails late, after a new span began (10 s): its rejections belong to
        // the last span and are dropped, as is the one held there.
        assert_eq!(strike(10_050, 1), Tally::Held, "the call is under way");
        done(0, 2);
        assert_eq!(
            strike(10_100, 1),
            Tally::Send {
                n: 2,
                span_ms: 10_050
            }
        );
    }

    /// A spray of identities on Redis does not grow the table past its bound either.
    #[test]
    fn shared_strikes_are_bounded() {
        let bans = Bans::with_caps(10, 1_000);
        for i in 0..10_000u32 {
            let who = Ident::Ip(std::net::IpAddr::from(i.to_be_bytes()));
            bans.strike_shared(Scope::Ip, &who, &RULE, 0, 1_000);
        }
        let n = bans.strikes.lock().unwrap().len();
        assert!(n <= 1_000, "{n}");
    }

    /// Changes from the fleet: set bans go in (their counts go quiet), lifted ones come
    /// out (their counts start afresh), ended ones go, the rest stay.
    #[test]
    fn fleet_changes_apply_incrementally() {
        let bans = Bans::default();
        let (a, b, c) = (ip("198.51.100.1"), ip("198.51.100.2"), ip("198.51.100.3"));
        let short = BanRule {
            for_ms: 1_000,
            ..RULE
        };
        bans.apply(
            vec![
                (a.clone(), Ban::new(Scope::Ip, &a, &RULE, 0)),
                (b.clone(), Ban::new(Scope::Ip, &b, &short, 0)),
            ],
            Vec::new(),
            0,
        );
        assert!(bans.banned(Scope::Ip, &a, 500).is_some());
        assert!(bans.banned(Scope::Ip, &b, 500).is_some());
        // c has a count: a ban on it quiets it.
        bans.strike(Scope::Ip, &c, &RULE, 500);
        bans.apply(
            vec![(c.clone(), Ban::new(Scope::Ip, &c, &short, 500))],
            Vec::new(),
            500,
        );
        assert_eq!(bans.strike(Scope::Ip, &c, &RULE, 600), 0, "quiet");
        // Nothing changed: all stay. Later b's ban ends and it goes.
        bans.apply(Vec::new(), Vec::new(), 700);
        assert_eq!(bans.list(700).len(), 3);
        bans.apply(Vec::new(), Vec::new(), 1_200);
        assert_eq!(bans.list(1_200).len(), 2);
        assert_eq!(
            bans.active.read().unwrap().map.len(),
            2,
            "dropped, not only hidden"
        );
        // a lifted: gone, its count afresh.
        bans.apply(Vec::new(), vec![(Scope::Ip, a.clone())], 1_300);
        assert!(bans.banned(Scope::Ip, &a, 1_300).is_none());
        assert_eq!(bans.strike(Scope::Ip, &a, &RULE, 1_300), 1);
        assert!(bans.banned(Scope::Ip, &c, 1_300).is_some());
    }
}
