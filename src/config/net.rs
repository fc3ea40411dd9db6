//! `parse_net`: the one reading of an address or CIDR, for `[client_ip]
//! trusted_proxies`, `[[blocks]]`, `POST /v1/blocks`, the block table and ban identities.

use std::net::IpAddr;

use ipnet::IpNet;

/// `s` (surrounding whitespace ignored) as written: `ADDRESS/PREFIX`, or a bare address
/// as a /32 (IPv4) or /128 (IPv6). Host bits are kept (`net_problem` judges them).
pub fn parse_net_as_written(s: &str) -> Option<IpNet> {
    let s = s.trim();
    s.parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
}

/// The network `s` names (see `parse_net_as_written`): host bits after the prefix
/// cleared, so `10.0.0.1/8` is `10.0.0.0/8`.
pub fn parse_net(s: &str) -> Option<IpNet> {
    parse_net_as_written(s).map(|n| n.trunc())
}

#[cfg(test)]
mod tests {
    use super::{parse_net, parse_net_as_written};

    /// (text, as written, the network): both `None` for what is not an address or CIDR.
    #[test]
    fn parse_net_reads_an_address_or_a_cidr() {
        let cases: &[(&str, Option<&str>, Option<&str>)] = &[
            ("10.0.0.0/8", Some("10.0.0.0/8"), Some("10.0.0.0/8")),
            ("10.0.0.1/8", Some("10.0.0.1/8"), Some("10.0.0.0/8")),
            ("192.0.2.7", Some("192.0.2.7/32"), Some("192.0.2.7/32")),
            (" 192.0.2.7\t", Some("192.0.2.7/32"), Some("192.0.2.7/32")),
            (
                "2001:db8::/32",
                Some("2001:db8::/32"),
                Some("2001:db8::/32"),
            ),
            (
                "2001:db8::1/48",
                Some("2001:db8::1/48"),
                Some("2001:db8::/48"),
            ),
            (
                "2001:db8::1",
                Some("2001:db8::1/128"),
                Some("2001:db8::1/128"),
            ),
            (
                "::ffff:192.0.2.7",
                Some("::ffff:192.0.2.7/128"),
                Some("::ffff:192.0.2.7/128"),
            ),
            ("0.0.0.0/0", Some("0.0.0.0/0"), Some("0.0.0.0/0")),
            ("", None, None),
            ("nonsense", None, None),
            ("10.0.0.0/33", None, None),
            ("2001:db8::/129", None, None),
            ("10.0.0.0/", None, None),
            ("10.0.0/8", None, None),
            ("[2001:db8::1]", None, None),
            ("10.0.0.1:80", None, None),
            ("10.0.0.0 /8", None, None),
        ];
        for &(s, written, net) in cases {
            let show = |n: Option<ipnet::IpNet>| n.map(|n| n.to_string());
            assert_eq!(
                show(parse_net_as_written(s)),
                written.map(String::from),
                "{s:?}"
            );
            assert_eq!(show(parse_net(s)), net.map(String::from), "{s:?}");
        }
    }
}
