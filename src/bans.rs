//! Automatic temporary bans: an identity a scope rejected `ban.after` times within
//! `ban.within_secs` is blocked for `ban.for_secs`.
//!
//! `Bans` holds the bans this gateway enforces (its own, and on Redis the fleet's, merged
//! every second by the ban sync) and, on the memory store, the rejection counts. The
//! request path asks [`Bans::banned`]: one atomic load while nothing is banned, one
//! read-locked hash lookup otherwise; a banned caller costs that lookup, not a limiter
//! decision. Both maps are bounded.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};

use ipnet::IpNet;

use crate::limiter::{BanRule, Base, Ident, Scope};

/// Most bans held. At the cap a new ban is refused (and counted), never put in place of
/// another: a flood of bans on others cannot lift an earlier one.
pub const MAX_BANS: usize = 100_000;
/// Most bans struck by the decision APIs (`from_check`) held: half the table, so bans
/// named by a caller of `/v1/check` or the RLS can never crowd out those of proxied abuse.
pub const MAX_CHECK_BANS: usize = MAX_BANS / 2;

/// What struck a ban: proxied requests, or the decision APIs (`/v1/check`, the RLS) with
/// `from_check = true`, which may hold at most half the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BanSource {
    /// Requests the gateway proxies.
    Proxy,
    /// `POST /v1/check` or the rate-limit service.
    Check,
}

impl BanSource {
    /// The `source` label of `throttle_bans_dropped_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            BanSource::Proxy => "proxy",
            BanSource::Check => "check",
        }
    }
}
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
    /// The keys of `map` whose ban the decision APIs struck here (on Redis the fleet's
    /// table keeps its own count; bans synced from it are not in here).
    checks: HashSet<(Scope, Ident)>,
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
                checks: HashSet::new(),
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
        self.insert_from(ident, ban, now_ms, BanSource::Proxy)
    }

    /// [`Bans::insert`] of a ban `source` struck: one of the decision APIs is also
    /// refused when half the table holds bans they struck (the fleet's table on Redis
    /// counts its own).
    pub fn insert_from(&self, ident: Ident, ban: Ban, now_ms: u64, source: BanSource) -> bool {
        let key = (ban.scope, ident);
        let until_ms = ban.expires_at_ms;
        {
            let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
            if !put(
                &mut active,
                key.clone(),
                ban,
                now_ms,
                self.max_bans,
                Some(source),
            ) {
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
            active.checks.remove(&key);
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
        active.checks.retain(|k| fresh.contains_key(k));
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
                active.checks.remove(key);
            }
            if active.soonest_ms <= now_ms {
                active.prune(now_ms);
            }
            for (key, ban) in &set {
                put(
                    &mut active,
                    key.clone(),
                    ban.clone(),
                    now_ms,
                    self.max_bans,
                    None,
                );
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
        active.prune(now_ms);
        self.any.store(!active.map.is_empty(), Ordering::Relaxed);
    }
}

impl Active {
    /// Drops the bans ended by `now_ms`.
    fn prune(&mut self, now_ms: u64) {
        self.map.retain(|_, b| b.expires_at_ms > now_ms);
        let map = &self.map;
        self.checks.retain(|k| map.contains_key(k));
        self.soonest_ms = soonest(&self.map);
    }
}

/// Puts `ban` under `key` in `active` unless it holds `max` bans in force and none on
/// `key`, or, for a ban of the decision APIs, `max / 2` of theirs and none on `key`; then
/// false: refused, never put in place of another. `source` None: a ban synced from the
/// fleet, whose source the fleet's table counts.
fn put(
    active: &mut Active,
    key: (Scope, Ident),
    ban: Ban,
    now_ms: u64,
    max: usize,
    source: Option<BanSource>,
) -> bool {
    let full = |a: &Active| {
        let checks_full = source == Some(BanSource::Check)
            && a.checks.len() >= max / 2
            && !a.checks.contains(&key);
        checks_full || (a.map.len() >= max && !a.map.contains_key(&key))
    };
    if full(active) {
        if active.soonest_ms <= now_ms {
            active.prune(now_ms);
        }
        if full(active) {
            return false;
        }
    }
    active.soonest_ms = active.soonest_ms.min(ban.expires_at_ms);
    match source {
        Some(BanSource::Check) => active.checks.insert(key.clone()),
        Some(BanSource::Proxy) => active.checks.remove(&key),
        None => false,
    };
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
        // `config::parse_net`: an address (a /32 or /128) is `Ip`, an IPv6 network `Net`;
        // an IPv4 network is no client's identity.
        Scope::Ip | Scope::Auth => match crate::config::parse_net(value)? {
            IpNet::V6(net) if net.prefix_len() < 128 => Some(Ident::Net(net)),
            IpNet::V4(net) if net.prefix_len() < 32 => None,
            net => Some(Ident::Ip(net.addr())),
        },
        Scope::Key | Scope::Tenant if !value.is_empty() => Some(Ident::Name(value.into())),
        Scope::Key | Scope::Tenant | Scope::Global => None,
        Scope::Named(n) => match n.info().base {
            Base::Ip => parse_ident(Scope::Ip, value),
            Base::Key | Base::Tenant | Base::Custom(_) | Base::Domain(_) => {
                parse_ident(Scope::Key, value)
            }
            Base::Global => None,
        },
    }
}

#[cfg(test)]
mod tests;
