//! The input of a layered check: which identities, under which limits, at what cost.

use std::net::IpAddr;
use std::sync::Arc;

use arrayvec::ArrayVec;

use super::decision::DecidedAt;
use super::policy::{Scope, ScopeLimits, WindowLimit};

/// The identity a scope counts. Cheap to clone: an address, or a shared name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Ident {
    /// A client address (ip scope).
    Ip(IpAddr),
    /// A client's IPv6 network (ip scope, `[client_ip] ipv6_prefix` below 128).
    Net(ipnet::Ipv6Net),
    /// A key id or tenant id.
    Name(Arc<str>),
    /// The single global identity.
    Global,
}

/// Most scopes one request meets: the four built-in ones, a route's tables and custom
/// scopes together.
pub const MAX_SCOPES: usize = 8;

/// Most concurrency slots one request takes (scopes with `concurrent`, built-in and
/// named together; `throttle check` refuses a config where a request could need more).
pub const MAX_SLOTS: usize = 3;

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
    /// The scopes, in evaluation order (ip, key, tenant, global, then the route's and
    /// custom scopes; or auth alone). One entry per scope at most, [`MAX_SCOPES`] in all
    /// (`throttle check` refuses a route that could meet more).
    pub scopes: ArrayVec<ScopeCheck<'a>, MAX_SCOPES>,
    /// Units the request spends in every window (route `cost`); at least 1.
    pub cost: u32,
    /// Decide without charging anything (a look at the state).
    pub peek: bool,
    /// Decide as of this time (Unix ms) instead of the store's own clock reading (the
    /// memory store only): a later settle then finds the request's entry at the time
    /// the admission recorded, whatever the clock did in between.
    pub at_ms: Option<u64>,
}

/// The address a client is counted, banned and blocked by: an IPv4 address carried in an
/// IPv6 one is that IPv4 address, so every IPv4 client behind a NAT64 gateway or a
/// dual-stack socket keeps a limit of its own instead of sharing one /64:
/// - IPv4-mapped `::ffff:a.b.c.d` and IPv4-translated `::ffff:0:a.b.c.d` (RFC 2765);
/// - IPv4-compatible `::a.b.c.d` (deprecated; `::` and `::1` excepted);
/// - NAT64 `64:ff9b::a.b.c.d` (RFC 6052, the well-known /96) and any /96 of the
///   local-use `64:ff9b:1::/48` (RFC 8215): the last 32 bits.
///
/// Any other address is returned unchanged.
pub fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    let b = v6.octets();
    let v4 = |i: usize| IpAddr::V4(std::net::Ipv4Addr::new(b[i], b[i + 1], b[i + 2], b[i + 3]));
    let s = v6.segments();
    match s {
        // ::ffff:a.b.c.d (mapped) and ::ffff:0:a.b.c.d (translated)
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] => v4(12),
        // ::a.b.c.d (compatible), not :: or ::1
        [0, 0, 0, 0, 0, 0, hi, lo] if hi != 0 || lo > 1 => v4(12),
        // 64:ff9b::/96
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => v4(12),
        // 64:ff9b:1::/48: operators carve /96 prefixes out of it (RFC 8215)
        [0x64, 0xff9b, 1, ..] => v4(12),
        _ => ip,
    }
}

/// A configured network (a block, a trusted proxy) in the form clients are compared in: a
/// /96 or longer inside one of `canonical`'s IPv4-carrying ranges is that IPv4 network
/// (`::ffff:10.0.0.0/104` is `10.0.0.0/8`), so it still matches the clients it names.
pub fn canonical_net(net: ipnet::IpNet) -> ipnet::IpNet {
    match net {
        ipnet::IpNet::V6(n) if n.prefix_len() >= 96 => match canonical(IpAddr::V6(n.network())) {
            IpAddr::V4(v4) => {
                ipnet::Ipv4Net::new(v4, n.prefix_len() - 96).map_or(net, ipnet::IpNet::V4)
            }
            IpAddr::V6(_) => net,
        },
        _ => net,
    }
}

/// The network the `ip` scope counts `ip` by: the address itself for IPv4 (and for IPv6
/// when `ipv6_prefix` is 128), else its `/ipv6_prefix` network.
pub fn network(ip: IpAddr, ipv6_prefix: u8) -> ipnet::IpNet {
    match ip {
        IpAddr::V4(a) => ipnet::IpNet::V4(ipnet::Ipv4Net::from(a)),
        // `min(128)` makes `new` infallible; fall back to the host anyway.
        IpAddr::V6(a) => ipnet::Ipv6Net::new(a, ipv6_prefix.min(128))
            .map_or_else(|_| ipnet::Ipv6Net::from(a), |n| n.trunc())
            .into(),
    }
}

/// One window of a check, as the IETF `RateLimit-Policy` header lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// The scope.
    pub scope: Scope,
    /// The window.
    pub window: super::policy::Window,
    /// Its limit.
    pub limit: u32,
    /// Its length in ms: the period, or for a calendar window the length of the one
    /// containing the check's time (a local day may be 23 or 25 hours, a month 28 to 31
    /// days).
    pub window_ms: u64,
}

// === impl Ident ===

impl Ident {
    /// What the `ip` (and `auth`) scope counts for a client at `ip`: the address for
    /// IPv4, its `/ipv6_prefix` network for IPv6 (the address itself at 128).
    pub fn client(ip: IpAddr, ipv6_prefix: u8) -> Ident {
        match network(ip, ipv6_prefix) {
            ipnet::IpNet::V6(n) if n.prefix_len() < 128 => Ident::Net(n),
            _ => Ident::Ip(ip),
        }
    }

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
            Ident::Net(n) => {
                feed(&n.network().octets());
                feed(&[n.prefix_len()]);
            }
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
            Ident::Net(n) => write!(f, "{n}"),
            Ident::Name(n) => f.write_str(n),
            Ident::Global => f.write_str("all"),
        }
    }
}

// === impl Check ===

impl<'a> Check<'a> {
    /// The scopes at the positions `keep` takes, with their decision times (`decided_at`
    /// re-indexed to the part's positions, each window keeping its own time): what a
    /// settle of some of the scopes sends.
    pub fn part(&self, decided_at: DecidedAt, keep: impl Fn(usize) -> bool) -> (Self, DecidedAt) {
        let mut out = self.clone();
        out.scopes.clear();
        for (i, s) in self.scopes.iter().enumerate() {
            if keep(i) {
                out.scopes.push(s.clone());
            }
        }
        let at = decided_at.select(&self.scopes, |i, _| keep(i));
        (out, at)
    }

    /// An empty check of `cost`.
    pub fn new(cost: u32) -> Self {
        Self {
            scopes: ArrayVec::new(),
            cost: cost.max(1),
            peek: false,
            at_ms: None,
        }
    }

    /// Adds a scope; ignored when the scope has no windows or is already present, or
    /// when the check is full (the config validation keeps a request under
    /// [`MAX_SCOPES`]).
    pub fn push(&mut self, scope: Scope, ident: Ident, limits: &'a ScopeLimits) {
        if limits.windows.is_empty()
            || self.scopes.is_full()
            || self.scopes.iter().any(|s| s.scope == scope)
        {
            return;
        }
        self.scopes.push(ScopeCheck {
            scope,
            ident,
            limits,
        });
    }

    /// Where `scope` is in the check.
    pub fn position(&self, scope: Scope) -> Option<usize> {
        self.scopes.iter().position(|s| s.scope == scope)
    }

    /// Whether no scope applies.
    pub fn is_empty(&self) -> bool {
        self.scopes.is_empty()
    }

    /// Every window of every scope, in check order (the IETF `RateLimit-Policy`).
    pub fn quotas(&self) -> Box<[Quota]> {
        let windows = self.scopes.iter().flat_map(|s| {
            s.limits.windows.iter().map(|w| Quota {
                scope: s.scope,
                window: w.window,
                limit: w.limit,
                window_ms: match (w.calendar, self.at_ms) {
                    (Some(_), Some(at)) => {
                        let (start, end) = w.bounds(at, s.ident.offset_ms(w));
                        end - start
                    }
                    _ => w.window.period_ms(),
                },
            })
        });
        windows.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::IpNet;

    /// (address, ipv6_prefix, network the ip scope counts).
    #[test]
    fn networks() {
        let cases = [
            ("203.0.113.7", 64, "203.0.113.7/32"),
            ("203.0.113.7", 1, "203.0.113.7/32"),
            ("2001:db8:1:2:aaaa::1", 64, "2001:db8:1:2::/64"),
            ("2001:db8:1:2:ffff:ffff:ffff:ffff", 64, "2001:db8:1:2::/64"),
            ("2001:db8:1:2:aaaa::1", 48, "2001:db8:1::/48"),
            ("2001:db8:1:2:aaaa::1", 128, "2001:db8:1:2:aaaa::1/128"),
            ("2001:db8:1:2:aaaa::1", 57, "2001:db8:1::/57"),
        ];
        for (ip, prefix, want) in cases {
            let got = network(ip.parse().unwrap(), prefix);
            assert_eq!(got, want.parse::<IpNet>().unwrap(), "{ip} /{prefix}");
        }
    }
}
