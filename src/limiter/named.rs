//! Scopes named by the config: a route's scope tables (`login.ip`), custom scopes on
//! request attributes (`user`, `login.user`) and the rate-limit service's domains
//! (`rls:<domain>`).
//!
//! A named scope is a `Copy` handle (a `u32` entry number, so a `Scope` is 5 bytes) on an
//! entry of a process-wide, deduplicating interner; reading the entry takes no lock, and
//! its name is a `&'static str` for Redis keys, metric labels and 429 bodies. Interning
//! the same identity (route, what it counts, custom scope or domain name) again returns the
//! same handle, so a reload that keeps its scopes adds nothing and handles compare and hash
//! as numbers. Nothing counts the entries against a process-wide cap: `throttle check`, a
//! refused reload or a reload with fresh names can never use up what a later config needs.
//! What a config may hold is bounded per config instead, in validation: at most
//! [`MAX_NAMED`] route tables and custom scopes, and at most [`MAX_DOMAINS`] domains.
//!
//! The trade-off: entries are never freed (a handle may live in a request in flight, a
//! ban or a lease long after the config that made it). The memory kept is at most
//! [`BYTES_PER_ENTRY`] (208 B) plus the name's length for each distinct name ever
//! interned: about 1 MiB for a thousand reloads of five fresh names each. What grows per
//! name elsewhere (metric series, `/v1/top` sketches) is dropped when a reload removes the
//! scope, so only this table outlives it.
//!
//! Names never collide across kinds: route names with limits are `[A-Za-z0-9_-]{1,64}` and
//! custom scope names `[a-z][a-z0-9_]{0,31}` (neither has `.` or `:`), a route's table is
//! `<route>.<scope>`, a custom scope is its bare name and a domain is `rls:<domain>`; no
//! custom scope may be named `rls`, so no Redis key `{<scope>:<identity>}` of one is a
//! domain's `{rls:<domain>:<counter>}`. Two different kinds with the same text are two
//! entries whatever their names.

use std::collections::HashMap;
use std::fmt;
use std::sync::{LazyLock, Mutex, OnceLock, PoisonError};

/// Most route scope tables and custom scopes one config may have.
pub const MAX_NAMED: usize = 255;

/// Most rate-limit service domains (`[rls] config`) one config may have (they do not count
/// toward [`MAX_NAMED`]).
pub const MAX_DOMAINS: usize = 4096;

/// The most memory one interned entry asks the allocator for besides its name's bytes: the
/// entry (64 B), its slot in the entry table (16 B, in segments that double: up to 32 B)
/// and its share of the interner's map (a 48 B slot and a control byte, at a load between
/// 7/16 and 7/8: 56 to 112 B). Measured with a counting allocator, 11-byte names
/// included: 208 B per entry over the first 1,000 entries, 157 to 164 B over 6,000 to
/// 100,000.
pub const BYTES_PER_ENTRY: usize = 208;

/// The name prefix of a rate-limit service domain's scope.
pub const DOMAIN_PREFIX: &str = "rls:";

/// A named scope's handle (see the module docs): its entry's number, a `u32` kept as bytes
/// so that `Scope` is 5 bytes with alignment 1 (a `WindowDecision` stays 48 bytes).
/// Equal, hashed and ordered by entry (one entry per identity).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Named([u8; 4]);

/// What a named scope counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// The client address (a route's `ip` table).
    Ip,
    /// The key id (a route's `key` table).
    Key,
    /// The tenant id (a route's `tenant` table).
    Tenant,
    /// One counter for all of the route's traffic (a route's `global` table).
    Global,
    /// A request attribute: the custom scope of this name (`[scopes.<name>]`).
    Custom(&'static str),
    /// The rate-limit service's descriptors of this domain (`[rls] config`).
    Domain(&'static str),
}

/// One entry of the interner.
#[derive(Debug)]
pub struct NamedInfo {
    /// The full name: `<route>.<scope>` for a route's table, the custom scope's name, or
    /// `rls:<domain>`.
    pub name: &'static str,
    /// The route whose requests alone it counts, if any.
    pub route: Option<&'static str>,
    /// What it counts.
    pub base: Base,
    /// For a route's custom table, the custom scope itself (bans struck by the table are
    /// recorded there).
    pub unrouted: Option<Named>,
}

/// What an entry counts, without its text: part of the interner's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Ip,
    Key,
    Tenant,
    Global,
    Custom,
    Domain,
}

/// An entry's identity: its route, its kind and the custom scope's or domain's name
/// (empty for the built-in kinds).
type Key<'a> = (Option<&'a str>, Kind, &'a str);

/// The interner: identities to handles. Only writers (config validation) take its lock.
static TABLE: LazyLock<Mutex<HashMap<Key<'static>, Named>>> = LazyLock::new(Mutex::default);

/// Entries by number, read without a lock: segment `s` holds `FIRST << s` slots, made when
/// the first entry reaches it; slots are filled under `TABLE`'s lock, once.
static ENTRIES: [OnceLock<Box<[OnceLock<&'static NamedInfo>]>>; SEGMENTS] =
    [const { OnceLock::new() }; SEGMENTS];
const FIRST: u64 = 64;
/// Enough segments for every `u32` entry number.
const SEGMENTS: usize = 27;

// === impl Named ===

impl Named {
    /// The scope counting `base` on `route`'s requests (every request without a route),
    /// interned when new. Not for the request path (it takes a lock).
    pub fn intern(route: Option<&str>, base: Base) -> Named {
        let (kind, text) = split(base);
        insert(&mut lock(), route, kind, text)
    }

    /// The custom scope `name` (`[scopes.<name>]`, `[limits.<name>]`).
    pub fn custom(name: &str) -> Named {
        insert(&mut lock(), None, Kind::Custom, name)
    }

    /// The rate-limit service domain `domain`'s scope (`rls:<domain>`).
    pub fn domain(domain: &str) -> Named {
        insert(&mut lock(), None, Kind::Domain, domain)
    }

    /// The interned scope whose name is `name`, if any: the inverse of `info().name`.
    pub fn lookup(name: &str) -> Option<Named> {
        let key = parse(name)?;
        find(&lock(), key)
    }

    /// Its entry (lock-free).
    pub fn info(self) -> &'static NamedInfo {
        // Handles are only made by `insert`, after their slot was filled.
        static UNKNOWN: NamedInfo = NamedInfo {
            name: "unknown",
            route: None,
            base: Base::Global,
            unrouted: None,
        };
        let (segment, offset) = slot_of(self.number());
        ENTRIES
            .get(segment)
            .and_then(OnceLock::get)
            .and_then(|s| s.get(offset))
            .and_then(OnceLock::get)
            .copied()
            .unwrap_or(&UNKNOWN)
    }
}

impl Named {
    fn number(self) -> u32 {
        u32::from_le_bytes(self.0)
    }
}

impl fmt::Debug for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Named").field(&self.info().name).finish()
    }
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<Key<'static>, Named>> {
    TABLE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The segment and offset of entry `n`.
fn slot_of(n: u32) -> (usize, usize) {
    let block = u64::from(n) / FIRST + 1;
    let segment = 63 - block.leading_zeros();
    let offset = u64::from(n) - FIRST * ((1 << segment) - 1);
    // Below 27 and below the segment's length (at most 2^32): the casts keep every bit.
    (segment as usize, offset as usize)
}

/// The handle of `key`, if interned.
fn find(table: &HashMap<Key<'static>, Named>, key: Key<'_>) -> Option<Named> {
    // The map is covariant in its key: a borrowed key looks up `'static` ones.
    let table: &HashMap<Key<'_>, Named> = table;
    table.get(&key).copied()
}

/// The handle of (`route`, `kind`, `text`), its entry made when new. The entry's strings
/// are slices of one leaked name.
fn insert(
    table: &mut HashMap<Key<'static>, Named>,
    route: Option<&str>,
    kind: Kind,
    text: &str,
) -> Named {
    if let Some(n) = find(table, (route, kind, text)) {
        return n;
    }
    let unrouted = match (route, kind) {
        (Some(_), Kind::Custom | Kind::Domain) => Some(insert(table, None, kind, text)),
        _ => None,
    };
    let base = base_name(kind, text);
    let name: &'static str = Box::leak(match route {
        Some(r) => format!("{r}.{base}").into_boxed_str(),
        None => base.into_owned().into_boxed_str(),
    });
    let route = route.and_then(|r| name.get(..r.len()));
    let text = name.get(name.len() - text.len()..).unwrap_or_default();
    let info: &'static NamedInfo = Box::leak(Box::new(NamedInfo {
        name,
        route,
        base: base_of(kind, text),
        unrouted,
    }));
    // 2^32 entries of at least 64 B each is more memory than a gateway has: the number
    // never saturates in practice.
    let number = u32::try_from(table.len()).unwrap_or(u32::MAX);
    let (segment, offset) = slot_of(number);
    if let Some(seg) = ENTRIES.get(segment) {
        let slots = seg.get_or_init(|| (0..FIRST << segment).map(|_| OnceLock::new()).collect());
        if let Some(slot) = slots.get(offset) {
            let _ = slot.set(info); // only this writer, under the lock, fills slot `n`
        }
    }
    let n = Named(number.to_le_bytes());
    table.insert((route, kind, text), n);
    n
}
/// The scope part of a name: `ip`, ..., the custom scope's name, `rls:<domain>`.
fn base_name(kind: Kind, text: &str) -> std::borrow::Cow<'_, str> {
    match kind {
        Kind::Ip => "ip".into(),
        Kind::Key => "key".into(),
        Kind::Tenant => "tenant".into(),
        Kind::Global => "global".into(),
        Kind::Custom => text.into(),
        Kind::Domain => format!("{DOMAIN_PREFIX}{text}").into(),
    }
}

fn base_of(kind: Kind, text: &'static str) -> Base {
    match kind {
        Kind::Ip => Base::Ip,
        Kind::Key => Base::Key,
        Kind::Tenant => Base::Tenant,
        Kind::Global => Base::Global,
        Kind::Custom => Base::Custom(text),
        Kind::Domain => Base::Domain(text),
    }
}

fn split(base: Base) -> (Kind, &'static str) {
    match base {
        Base::Ip => (Kind::Ip, ""),
        Base::Key => (Kind::Key, ""),
        Base::Tenant => (Kind::Tenant, ""),
        Base::Global => (Kind::Global, ""),
        Base::Custom(t) => (Kind::Custom, t),
        Base::Domain(t) => (Kind::Domain, t),
    }
}

/// The identity a name spells (see the module docs for why this is unambiguous).
fn parse(name: &str) -> Option<Key<'_>> {
    if let Some(domain) = name.strip_prefix(DOMAIN_PREFIX) {
        return Some((None, Kind::Domain, domain));
    }
    let (route, base) = match name.split_once('.') {
        Some((r, b)) => (Some(r), b),
        None => (None, name),
    };
    if base.is_empty() || route.is_some_and(str::is_empty) {
        return None;
    }
    Some(match (route, base) {
        (Some(_), "ip") => (route, Kind::Ip, ""),
        (Some(_), "key") => (route, Kind::Key, ""),
        (Some(_), "tenant") => (route, Kind::Tenant, ""),
        (Some(_), "global") => (route, Kind::Global, ""),
        _ => match base.strip_prefix(DOMAIN_PREFIX) {
            Some(domain) => (route, Kind::Domain, domain),
            None => (route, Kind::Custom, base),
        },
    })
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use super::*;

    /// Interning an identity twice gives one handle; its entry names route and base.
    #[test]
    fn interning_twice_gives_one_handle() {
        let a = Named::intern(Some("t_login"), Base::Ip);
        assert_eq!(a, Named::intern(Some("t_login"), Base::Ip));
        assert!(std::ptr::eq(
            a.info(),
            Named::intern(Some("t_login"), Base::Ip).info()
        ));
        assert_eq!(a.info().name, "t_login.ip");
        assert_eq!(a.info().route, Some("t_login"));
        let c = Named::intern(Some("t_login"), Base::Key);
        assert_ne!(a, c);
        let u = Named::custom("t_user");
        assert_eq!(u.info().base, Base::Custom("t_user"));
        assert_eq!(u.info().unrouted, None);
        assert_eq!(Named::custom("t_user"), u);
        assert_eq!(Named::intern(None, Base::Custom("t_user")), u);
        let ru = Named::intern(Some("t_login"), Base::Custom("t_user"));
        assert_eq!(ru.info().name, "t_login.t_user");
        assert_eq!(ru.info().unrouted, Some(u));
        let d = Named::domain("t_edge");
        assert_eq!(d.info().name, "rls:t_edge");
        assert_eq!(d.info().base, Base::Domain("t_edge"));
        assert_eq!(Named::domain("t_edge"), d);
    }

    /// The same text in different kinds is never one scope, nor one name: a route `rls`
    /// with a custom table `domain` is not the domain `domain`.
    #[test]
    fn distinct_kinds_with_the_same_text_never_equal() {
        let custom = Named::custom("t_same");
        let domain = Named::domain("t_same");
        let routed = Named::intern(Some("t_same"), Base::Custom("t_same"));
        let table = Named::intern(Some("rls"), Base::Custom("t_domain"));
        let rls = Named::domain("t_domain");
        let all = [custom, domain, routed, table, rls];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
                assert_ne!(a.info().name, b.info().name);
                assert_ne!(a.cmp(b), Ordering::Equal);
            }
        }
        assert_eq!(table.info().name, "rls.t_domain");
        assert_eq!(rls.info().name, "rls:t_domain");
    }

    /// `lookup` finds every interned kind by its name, and nothing else.
    #[test]
    fn lookup_inverts_the_name() {
        let all = [
            Named::intern(Some("t-look_1"), Base::Ip),
            Named::intern(Some("t-look_1"), Base::Key),
            Named::intern(Some("t-look_1"), Base::Tenant),
            Named::intern(Some("t-look_1"), Base::Global),
            Named::intern(Some("t-look_1"), Base::Custom("t_look")),
            Named::custom("t_look"),
            Named::domain("t.look:a b"),
            Named::intern(Some("t-look_1"), Base::Domain("t.look")),
        ];
        for n in all {
            assert_eq!(Named::lookup(n.info().name), Some(n), "{}", n.info().name);
        }
        for absent in [
            "",
            ".",
            "t-look_1.",
            ".ip",
            "t-look_1.user",
            "t_never",
            "rls:t_never",
            "ip",
        ] {
            assert_eq!(Named::lookup(absent), None, "{absent:?}");
        }
    }

    /// An entry's own size, its slots and its handle stay within what the docs state.
    #[test]
    fn an_entry_stays_within_its_stated_bytes() {
        let entry = std::mem::size_of::<NamedInfo>();
        let slot = std::mem::size_of::<OnceLock<&'static NamedInfo>>();
        let map = std::mem::size_of::<(Key<'static>, Named)>() + 1;
        assert_eq!((entry, slot, map), (64, 16, 49));
        // Segments at half use and the map at its lowest load (7/16, just after it doubled).
        assert!(entry + 2 * slot + map * 16 / 7 <= BYTES_PER_ENTRY);
        assert_eq!(std::mem::size_of::<crate::limiter::Scope>(), 5);
        assert_eq!(std::mem::align_of::<crate::limiter::Scope>(), 1);
        assert_eq!(std::mem::size_of::<crate::limiter::WindowDecision>(), 48);
    }

    /// Entry numbers map onto segments that double, without gaps or overlaps.
    #[test]
    fn entry_numbers_fill_the_segments_in_order() {
        assert_eq!(slot_of(0), (0, 0));
        assert_eq!(slot_of(63), (0, 63));
        assert_eq!(slot_of(64), (1, 0));
        assert_eq!(slot_of(191), (1, 127));
        assert_eq!(slot_of(192), (2, 0));
        let (segment, offset) = slot_of(u32::MAX);
        assert!(segment < SEGMENTS && (offset as u64) < FIRST << segment);
    }
}
