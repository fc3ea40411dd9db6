//! Trusted-proxy `X-Forwarded-For` resolution.
//!
//! The chain is `[X-Forwarded-For entries..., socket peer]`, walked from the right while
//! the address is a trusted proxy; the first untrusted address is the client. So a client
//! can prepend whatever it likes to `X-Forwarded-For`: only hops appended by trusted
//! proxies are believed (tower-governor's left-most rule is the counter-example). An
//! unparseable entry stops the walk and the client is the last address examined; when
//! every hop is trusted, the left-most one is the client. From an untrusted peer the
//! header is ignored entirely. Default: no trusted proxies.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// Resolves the client address of a request.
#[derive(Debug, Clone, Default)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
}

// === impl ClientIpResolver ===

impl ClientIpResolver {
    /// A resolver believing `X-Forwarded-For` from peers in `trusted`.
    pub fn new(trusted: Vec<IpNet>) -> Self {
        Self { trusted }
    }

    /// Whether `ip` is a trusted proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    /// The client address, given the socket peer and the `X-Forwarded-For` values in the
    /// order they appeared (several headers are one comma-separated list).
    pub fn resolve<'h>(
        &self,
        peer: IpAddr,
        xff: impl DoubleEndedIterator<Item = &'h [u8]>,
    ) -> IpAddr {
        let mut client = peer.to_canonical();
        if !self.is_trusted(client) {
            return client;
        }
        for value in xff.rev() {
            for entry in value.rsplit(|b| *b == b',') {
                match parse_entry(entry) {
                    Some(ip) => {
                        client = ip;
                        if !self.is_trusted(ip) {
                            return ip;
                        }
                    }
                    None => return client,
                }
            }
        }
        client
    }
}

/// One `X-Forwarded-For` entry: an address, optionally with a port (`1.2.3.4:80`,
/// `[::1]:80`). IPv4-mapped IPv6 addresses become IPv4.
pub fn parse_entry(raw: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(raw).ok()?.trim();
    if s.len() > 64 {
        return None;
    }
    s.parse::<IpAddr>()
        .or_else(|_| s.parse::<SocketAddr>().map(|a| a.ip()))
        .ok()
        .map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolver(trusted: &[&str]) -> ClientIpResolver {
        ClientIpResolver::new(trusted.iter().map(|s| s.parse().unwrap()).collect())
    }

    /// (trusted CIDRs, peer, X-Forwarded-For headers, expected client).
    #[test]
    fn resolves_table() {
        let t = &["10.0.0.0/8", "127.0.0.1/32", "2001:db8:ffff::/48"];
        let cases: &[(&[&str], &str, &[&str], &str)] = &[
            // Untrusted peer: XFF ignored, however plausible.
            (t, "198.51.100.9", &["1.2.3.4"], "198.51.100.9"),
            (&[], "127.0.0.1", &["1.2.3.4"], "127.0.0.1"),
            // Trusted peer, one client hop.
            (t, "10.0.0.1", &["203.0.113.7"], "203.0.113.7"),
            // Spoofed left-most entry: the right-most untrusted hop wins.
            (t, "10.0.0.1", &["6.6.6.6, 203.0.113.7"], "203.0.113.7"),
            (
                t,
                "10.0.0.1",
                &["6.6.6.6, 203.0.113.7, 10.1.2.3"],
                "203.0.113.7",
            ),
            // All hops trusted: the left-most.
            (t, "10.0.0.1", &["10.9.9.9, 10.1.1.1"], "10.9.9.9"),
            (t, "10.0.0.1", &[], "10.0.0.1"),
            // Garbage stops the walk: the last address examined.
            (t, "10.0.0.1", &["203.0.113.7, garbage"], "10.0.0.1"),
            (t, "10.0.0.1", &["garbage, 10.2.2.2"], "10.2.2.2"),
            (t, "10.0.0.1", &[""], "10.0.0.1"),
            (t, "10.0.0.1", &["1.2.3.4, , 10.2.2.2"], "10.2.2.2"),
            // Multiple headers are one list, in order.
            (t, "10.0.0.1", &["6.6.6.6", "203.0.113.7"], "203.0.113.7"),
            (t, "10.0.0.1", &["203.0.113.7", "10.3.3.3"], "203.0.113.7"),
            // Ports and whitespace.
            (t, "10.0.0.1", &[" 203.0.113.7:5555 "], "203.0.113.7"),
            (t, "10.0.0.1", &["[2001:db8::1]:443"], "2001:db8::1"),
            // IPv6 peers and clients; IPv4-mapped addresses are IPv4.
            (t, "2001:db8:ffff::1", &["2001:db8::42"], "2001:db8::42"),
            (t, "::ffff:10.0.0.1", &["203.0.113.7"], "203.0.113.7"),
            (t, "10.0.0.1", &["::ffff:203.0.113.7"], "203.0.113.7"),
            (t, "2001:db8::5", &["203.0.113.7"], "2001:db8::5"),
        ];
        for (i, (trusted, peer, xff, want)) in cases.iter().enumerate() {
            let r = resolver(trusted);
            let got = r.resolve(peer.parse().unwrap(), xff.iter().map(|s| s.as_bytes()));
            assert_eq!(
                got,
                want.parse::<IpAddr>().unwrap(),
                "case {i}: peer {peer} xff {xff:?}"
            );
        }
    }

    /// Non-UTF-8 bytes and absurdly long entries are garbage, not panics.
    #[test]
    fn survives_hostile_bytes() {
        let r = resolver(&["10.0.0.0/8"]);
        let long = "1".repeat(8192);
        let hostile: [&[u8]; 3] = [b"\xff\xfe, 10.0.0.2", long.as_bytes(), b"\x00"];
        for h in hostile {
            let _ = r.resolve("10.0.0.1".parse().unwrap(), std::iter::once(h));
        }
        assert_eq!(
            r.resolve(
                "10.0.0.1".parse().unwrap(),
                std::iter::once(&b"\xff, 10.0.0.2"[..])
            ),
            "10.0.0.2".parse::<IpAddr>().unwrap()
        );
    }
}
