//! Blocks by address / CIDR, key id and tenant, each with an optional expiry.
//!
//! Exact addresses and ids are hash lookups; CIDRs are scanned linearly (the list comes
//! from config and the admin API and is expected to stay small). The list is immutable
//! and swapped whole when it changes.

use hashbrown::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::config::{BlockEntry, BlockTarget};

/// A stored block (a `rate_limit_blocks` row, or one posted to the admin API without a
/// database), as `GET /v1/blocks` shows it; `admission::block_entry` makes it an entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BlockRow {
    /// Row id (what `DELETE /v1/blocks/{id}` takes).
    pub id: i64,
    /// `ip`, `key` or `tenant`.
    pub scope: String,
    /// Address / CIDR, key id or tenant id.
    pub value: String,
    /// Why.
    pub reason: Option<String>,
    /// Expiry, Unix ms.
    pub expires_at_ms: Option<i64>,
}

/// The active block list.
#[derive(Debug, Default, Clone)]
pub struct BlockList {
    addrs: HashMap<IpAddr, BlockEntry>,
    nets: Vec<(IpNet, BlockEntry)>,
    keys: HashMap<String, BlockEntry>,
    tenants: HashMap<String, BlockEntry>,
}

// === impl BlockList ===

impl BlockList {
    /// A list of `entries`; of several blocks on one target, the longest-lived wins.
    pub fn new(entries: impl IntoIterator<Item = BlockEntry>) -> Self {
        let mut list = Self::default();
        for e in entries {
            list.insert(e);
        }
        list
    }

    fn insert(&mut self, mut e: BlockEntry) {
        // A block written in an IPv4-carrying IPv6 form names IPv4 clients.
        if let BlockTarget::Ip(net) = &mut e.target {
            *net = crate::limiter::canonical_net(*net);
        }
        fn keep(map_entry: Option<&BlockEntry>, new: &BlockEntry) -> bool {
            map_entry.is_none_or(|old| match (old.expires_at_ms, new.expires_at_ms) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(a), Some(b)) => b > a,
            })
        }
        match &e.target {
            BlockTarget::Ip(net) if net.prefix_len() == net.max_prefix_len() => {
                if keep(self.addrs.get(&net.addr()), &e) {
                    self.addrs.insert(net.addr(), e);
                }
            }
            BlockTarget::Ip(net) => self.nets.push((*net, e)),
            BlockTarget::Key(id) => {
                if keep(self.keys.get(id), &e) {
                    self.keys.insert(id.clone(), e);
                }
            }
            BlockTarget::Tenant(id) => {
                if keep(self.tenants.get(id), &e) {
                    self.tenants.insert(id.clone(), e);
                }
            }
        }
    }

    /// The block on `ip` in force at `now_ms`.
    pub fn ip(&self, ip: IpAddr, now_ms: u64) -> Option<&BlockEntry> {
        let ip = crate::limiter::canonical(ip);
        self.addrs.get(&ip).filter(|b| live(b, now_ms)).or_else(|| {
            self.nets
                .iter()
                .find(|(n, b)| n.contains(&ip) && live(b, now_ms))
                .map(|(_, b)| b)
        })
    }

    /// The block on key id `id` in force at `now_ms`.
    pub fn key(&self, id: &str, now_ms: u64) -> Option<&BlockEntry> {
        self.keys.get(id).filter(|b| live(b, now_ms))
    }

    /// The block on tenant `id` in force at `now_ms`.
    pub fn tenant(&self, id: &str, now_ms: u64) -> Option<&BlockEntry> {
        self.tenants.get(id).filter(|b| live(b, now_ms))
    }

    /// Whether no block is configured.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
            && self.nets.is_empty()
            && self.keys.is_empty()
            && self.tenants.is_empty()
    }
}

fn live(b: &BlockEntry, now_ms: u64) -> bool {
    b.expires_at_ms.is_none_or(|t| now_ms < t)
}

// The value checks live with the config (which checks `[[blocks]]` with them).
pub use crate::config::{net_problem, text_problem, MIN_V4_PREFIX, MIN_V6_PREFIX};

#[cfg(test)]
mod tests {
    use super::*;

    /// A block written in an IPv4-carrying IPv6 form names IPv4 clients, as they are
    /// compared (NAT64, IPv4-mapped).
    #[test]
    fn ipv4_in_ipv6_blocks_match_ipv4_clients() {
        let entry = |v: &str| BlockEntry {
            target: BlockTarget::Ip(v.parse().unwrap()),
            reason: None,
            expires_at_ms: None,
        };
        let list = BlockList::new([entry("64:ff9b::5.6.9.9/128"), entry("::ffff:5.6.7.0/120")]);
        for ip in ["5.6.9.9", "5.6.7.200"] {
            assert!(list.ip(ip.parse().unwrap(), 0).is_some(), "{ip}");
        }
        assert!(list.ip("5.6.8.1".parse().unwrap(), 0).is_none());
    }

    fn block(target: BlockTarget, expires: Option<u64>) -> BlockEntry {
        BlockEntry {
            target,
            reason: None,
            expires_at_ms: expires,
        }
    }

    /// Addresses, CIDRs (v4 and v6, v4-mapped), keys and tenants; expiry honoured.
    #[test]
    fn matches_targets_until_expiry() {
        let list = BlockList::new([
            block(BlockTarget::Ip("203.0.113.0/24".parse().unwrap()), None),
            block(
                BlockTarget::Ip("198.51.100.7/32".parse().unwrap()),
                Some(1_000),
            ),
            block(BlockTarget::Ip("2001:db8::/32".parse().unwrap()), None),
            block(BlockTarget::Key("k1".into()), Some(500)),
            block(BlockTarget::Key("k1".into()), None),
            block(BlockTarget::Tenant("evil".into()), Some(2_000)),
        ]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cases = [
            (list.ip(ip("203.0.113.99"), 0).is_some(), true),
            (list.ip(ip("::ffff:203.0.113.99"), 0).is_some(), true),
            (list.ip(ip("203.0.114.1"), 0).is_some(), false),
            (list.ip(ip("198.51.100.7"), 999).is_some(), true),
            (list.ip(ip("198.51.100.7"), 1_000).is_some(), false),
            (list.ip(ip("2001:db8:1::1"), 0).is_some(), true),
            (list.key("k1", 10_000).is_some(), true),
            (list.key("k2", 0).is_some(), false),
            (list.tenant("evil", 1_999).is_some(), true),
            (list.tenant("evil", 2_000).is_some(), false),
        ];
        for (i, (got, want)) in cases.into_iter().enumerate() {
            assert_eq!(got, want, "case {i}");
        }
    }

    /// Host bits, short prefixes (IPv4-carrying ones as IPv4) and formatting characters
    /// are refused; `force` takes the network as meant.
    #[test]
    fn block_values_are_checked() {
        for (value, refused) in [
            ("1.2.3.4", false),
            ("10.0.0.0/8", false),
            ("2001:db8::/32", false),
            ("1.2.3.4/0", true),
            ("0.0.0.0/0", true),
            ("10.0.0.0/7", true),
            ("10.0.0.1/8", true),
            ("2001:db8::1/64", true),
            ("2001::/16", true),
            ("::/0", true),
            ("::ffff:0:0/96", true),
            ("::ffff:10.0.0.0/104", false),
            // NAT64 (RFC 6052's /96, RFC 8215's local-use /48) and translated: IPv4 inside.
            ("64:ff9b::/96", true),
            ("64:ff9b::/100", true),
            ("64:ff9b::a00:0/104", false),
            ("64:ff9b:1:2:3:4::/96", true),
            ("::ffff:0:0:0/96", true),
            ("::ffff:0:a00:0/104", false),
        ] {
            assert_eq!(net_problem(value, false).is_some(), refused, "{value}");
            assert_eq!(net_problem(value, true), None, "{value}");
        }
        assert!(net_problem("10.0.0.1/8", false)
            .unwrap()
            .contains("write 10.0.0.0/8"));
        assert_eq!(text_problem("203.0.113.0/24"), None);
        assert_eq!(text_problem("caf\u{e9}"), None);
        assert!(text_problem("a\nb").is_some());
        assert!(text_problem("a\u{2028}b").is_some());
        assert!(text_problem("evil\u{202E}lanruoj").is_some());
        assert!(text_problem("\u{2066}x").is_some());
    }
}
