//! Trusted-proxy `X-Forwarded-For` (or RFC 7239 `Forwarded`) resolution.
//!
//! The chain is `[X-Forwarded-For entries..., socket peer]`, walked from the right while
//! the address is a trusted proxy; the first untrusted address is the client. So a client
//! can prepend whatever it likes to `X-Forwarded-For`: only hops appended by trusted
//! proxies are believed (tower-governor's left-most rule is the counter-example). An
//! unparseable entry stops the walk and the client is the last address examined; when
//! every hop is trusted, the left-most one is the client. From an untrusted peer the
//! header is ignored entirely. Default: no trusted proxies.
//!
//! With `[client_ip] header = "forwarded"` the same walk reads the `for=` node of each
//! RFC 7239 `Forwarded` element instead: an element without `for`, an `unknown` or
//! obfuscated (`_...`) node, or one that does not parse stops the walk like an
//! unparseable `X-Forwarded-For` entry.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;

use crate::config::ClientIpHeader;

/// `X-Forwarded-For`, made once (a lookup by a `&str` parses and checks the name each time).
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub use crate::limiter::canonical;

/// Resolves the client address of a request.
#[derive(Debug, Clone, Default)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
    header: ClientIpHeader,
}

// === impl ClientIpResolver ===

impl ClientIpResolver {
    /// A resolver believing `X-Forwarded-For` from peers in `trusted`.
    pub fn new(trusted: Vec<IpNet>) -> Self {
        Self {
            trusted: trusted
                .into_iter()
                .map(crate::limiter::canonical_net)
                .collect(),
            header: ClientIpHeader::XForwardedFor,
        }
    }

    /// The same, reading `header` instead.
    pub fn with_header(mut self, header: ClientIpHeader) -> Self {
        self.header = header;
        self
    }

    /// The client address of a request from `peer` with `headers`.
    pub fn resolve_headers(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        // An untrusted peer is the client: its headers are not looked up.
        let client = canonical(peer);
        if !self.is_trusted(client) {
            return client;
        }
        match self.header {
            ClientIpHeader::XForwardedFor => {
                let values = headers.get_all(&X_FORWARDED_FOR).iter();
                self.resolve(peer, values.map(|v| v.as_bytes()))
            }
            ClientIpHeader::Forwarded => {
                let values = headers.get_all(http::header::FORWARDED).iter();
                self.resolve_forwarded(peer, values.map(|v| v.as_bytes()))
            }
        }
    }

    /// Whether `ip` is a trusted proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    /// The client address, given the socket peer and the `X-Forwarded-For` values in the
    /// order they appeared (several headers are one comma-separated list).
    pub fn resolve<'h>(
        &self,
        peer: IpAddr,
        xff: impl DoubleEndedIterator<Item = &'h [u8]>,
    ) -> IpAddr {
        let hops = xff
            .rev()
            .flat_map(|value| value.rsplit(|b| *b == b',').map(parse_entry));
        self.walk(peer, hops)
    }

    /// As [`resolve`](Self::resolve), over RFC 7239 `Forwarded` values: each element's
    /// `for=` node is a hop.
    pub fn resolve_forwarded<'h>(
        &self,
        peer: IpAddr,
        values: impl DoubleEndedIterator<Item = &'h [u8]>,
    ) -> IpAddr {
        let hops = values
            .rev()
            .flat_map(|value| match std::str::from_utf8(value) {
                Ok(v) => split_quoted(v, ',').rev().map(forwarded_for).collect(),
                Err(_) => vec![None], // garbage stops the walk
            });
        self.walk(peer, hops)
    }

    /// The walk itself over `hops`, right to left (`None`: an entry that does not parse).
    fn walk(&self, peer: IpAddr, hops: impl Iterator<Item = Option<IpAddr>>) -> IpAddr {
        let mut client = canonical(peer);
        if !self.is_trusted(client) {
            return client;
        }
        for hop in hops {
            match hop {
                Some(ip) => {
                    client = ip;
                    if !self.is_trusted(ip) {
                        return ip;
                    }
                }
                None => return client,
            }
        }
        client
    }
}

/// The longest `Forwarded` element or node believed: longer ones are garbage.
const MAX_ELEMENT: usize = 512;

/// Splits `s` on `sep` outside quoted strings (a `\` escapes inside them).
fn split_quoted(s: &str, sep: char) -> impl DoubleEndedIterator<Item = &str> {
    let mut cuts = Vec::new();
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => cuts.push(i),
            _ => {}
        }
    }
    let mut parts = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for cut in cuts {
        parts.push(&s[start..cut]);
        start = cut + 1;
    }
    parts.push(&s[start..]);
    parts.into_iter()
}

/// The address of a `Forwarded` element's `for=` node, if it has one that names an
/// address (`unknown`, obfuscated identifiers and garbage do not).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    if element.len() > MAX_ELEMENT {
        return None;
    }
    let mut found = None;
    for pair in split_quoted(element, ';') {
        let (name, value) = pair.trim().split_once('=')?;
        if !name.eq_ignore_ascii_case("for") {
            continue;
        }
        if found.is_some() {
            return None; // a repeated `for` is malformed
        }
        found = Some(node(value)?);
    }
    found
}

/// A `for=` value: a token or a quoted string holding `IPv4[:port]` or
/// `"[IPv6][:port]"`.
fn node(value: &str) -> Option<IpAddr> {
    let raw = match value.strip_prefix('"') {
        Some(rest) => unquote(rest.strip_suffix('"')?)?,
        None if !value.is_empty() && value.bytes().all(is_tchar) => value.to_string(),
        None => return None,
    };
    if let Some(v6) = raw.strip_prefix('[') {
        let (addr, rest) = v6.split_once(']')?;
        if !(rest.is_empty() || port(rest.strip_prefix(':')?)) {
            return None;
        }
        return addr
            .parse::<Ipv6Addr>()
            .ok()
            .map(|a| canonical(IpAddr::V6(a)));
    }
    let (addr, p) = match raw.split_once(':') {
        Some((addr, p)) => (addr, Some(p)),
        None => (raw.as_str(), None),
    };
    if p.is_some_and(|p| !port(p)) {
        return None;
    }
    match addr.parse::<IpAddr>().ok()? {
        ip @ IpAddr::V4(_) => Some(ip),
        // IPv6 must be bracketed (RFC 7239 section 6).
        IpAddr::V6(_) => None,
    }
}

/// A numeric port (obfuscated ports do not name an address we can check).
fn port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// The content of a quoted string, escapes undone.
fn unquote(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
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
        .map(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IPv4 carried in IPv6 (mapped, translated, compatible, NAT64 well-known and
    /// local-use) is that IPv4 address; other IPv6 addresses are left alone.
    #[test]
    fn ipv4_inside_ipv6_is_ipv4() {
        let cases = [
            ("::ffff:192.0.2.7", "192.0.2.7"),
            ("::ffff:0:192.0.2.7", "192.0.2.7"),
            ("::192.0.2.7", "192.0.2.7"),
            ("64:ff9b::192.0.2.7", "192.0.2.7"),
            ("64:ff9b::c633:6409", "198.51.100.9"),
            ("64:ff9b:1::192.0.2.7", "192.0.2.7"),
            // Any /96 carved out of the local-use /48 (RFC 8215).
            ("64:ff9b:1:ffff::c000:207", "192.0.2.7"),
            ("64:ff9b:1:ffff::c000:208", "192.0.2.8"),
            ("192.0.2.7", "192.0.2.7"),
            ("::", "::"),
            ("::1", "::1"),
            ("2001:db8::7", "2001:db8::7"),
            ("64:ff9c::192.0.2.7", "64:ff9c::c000:207"),
        ];
        for (input, want) in cases {
            let got = canonical(input.parse().unwrap());
            assert_eq!(got, want.parse::<IpAddr>().unwrap(), "{input}");
        }
        // Configured networks (blocks, trusted proxies) take the same form.
        for (net, want) in [
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("64:ff9b::c000:207/128", "192.0.2.7/32"),
            ("64:ff9b:1:ffff::c000:200/120", "192.0.2.0/24"),
            ("2001:db8::/32", "2001:db8::/32"),
            ("64:ff9b::/64", "64:ff9b::/64"),
        ] {
            let got = crate::limiter::canonical_net(net.parse().unwrap());
            assert_eq!(got.to_string(), want, "{net}");
        }
        let trusted = ClientIpResolver::new(vec!["::ffff:10.0.0.0/104".parse().unwrap()]);
        assert!(trusted.is_trusted("10.1.2.3".parse().unwrap()));
        // Two IPv4 clients behind one NAT64 are two identities for the ip scope.
        let (a, b) = (
            canonical("64:ff9b::c000:207".parse().unwrap()),
            canonical("64:ff9b::c000:208".parse().unwrap()),
        );
        assert_ne!(
            crate::limiter::Ident::client(a, 64).to_string(),
            crate::limiter::Ident::client(b, 64).to_string()
        );
    }

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

    /// (trusted CIDRs, peer, `Forwarded` headers, expected client).
    #[test]
    fn forwarded_table() {
        let t = &["10.0.0.0/8", "2001:db8:ffff::/48"];
        let cases: &[(&[&str], &str, &[&str], &str)] = &[
            // Untrusted peer: ignored.
            (t, "198.51.100.9", &["for=1.2.3.4"], "198.51.100.9"),
            (t, "10.0.0.1", &["for=203.0.113.7"], "203.0.113.7"),
            (t, "10.0.0.1", &["For=\"203.0.113.7:4711\""], "203.0.113.7"),
            // Quoted IPv6 with brackets, with and without a port.
            (
                t,
                "10.0.0.1",
                &["for=\"[2001:db8::1]:4711\""],
                "2001:db8::1",
            ),
            (t, "10.0.0.1", &["for=\"[2001:db8::1]\""], "2001:db8::1"),
            // Right-most untrusted hop; other parameters ignored; several headers.
            (
                t,
                "10.0.0.1",
                &["for=6.6.6.6, for=203.0.113.7;proto=https;by=10.0.0.1, for=10.2.2.2"],
                "203.0.113.7",
            ),
            (
                t,
                "10.0.0.1",
                &["for=6.6.6.6", "for=203.0.113.7"],
                "203.0.113.7",
            ),
            (
                t,
                "10.0.0.1",
                &["for=203.0.113.7", "for=\"[2001:db8:ffff::9]\""],
                "203.0.113.7",
            ),
            // A quoted comma or semicolon is not a separator.
            (
                t,
                "10.0.0.1",
                &["for=203.0.113.7;host=\"a,b;c\", for=10.3.3.3"],
                "203.0.113.7",
            ),
            // unknown, obfuscated, missing, repeated or malformed nodes stop the walk.
            (t, "10.0.0.1", &["for=203.0.113.7, for=unknown"], "10.0.0.1"),
            (t, "10.0.0.1", &["for=203.0.113.7, for=_hidden"], "10.0.0.1"),
            (
                t,
                "10.0.0.1",
                &["for=203.0.113.7, for=10.9.9.9, for=unknown"],
                "10.0.0.1",
            ),
            (
                t,
                "10.0.0.1",
                &["for=203.0.113.7, for=unknown, for=10.9.9.9"],
                "10.9.9.9",
            ),
            (t, "10.0.0.1", &["for=203.0.113.7, proto=http"], "10.0.0.1"),
            (t, "10.0.0.1", &["for=1.2.3.4;for=203.0.113.7"], "10.0.0.1"),
            (t, "10.0.0.1", &["for=\"203.0.113.7:_port\""], "10.0.0.1"),
            (t, "10.0.0.1", &["for=2001:db8::1"], "10.0.0.1"),
            (t, "10.0.0.1", &["for=\"2001:db8::1\""], "10.0.0.1"),
            (t, "10.0.0.1", &["for=\"203.0.113.7"], "10.0.0.1"),
            (t, "10.0.0.1", &[""], "10.0.0.1"),
            (
                t,
                "10.0.0.1",
                &["for=203.0.113.7, , for=10.2.2.2"],
                "10.2.2.2",
            ),
            // IPv4-mapped is IPv4.
            (
                t,
                "10.0.0.1",
                &["for=\"[::ffff:203.0.113.7]\""],
                "203.0.113.7",
            ),
        ];
        for (i, (trusted, peer, fwd, want)) in cases.iter().enumerate() {
            let r = resolver(trusted);
            let got = r.resolve_forwarded(peer.parse().unwrap(), fwd.iter().map(|s| s.as_bytes()));
            assert_eq!(
                got,
                want.parse::<IpAddr>().unwrap(),
                "case {i}: peer {peer} forwarded {fwd:?}"
            );
        }
    }

    mod walk {
        use super::*;
        use proptest::prelude::*;

        fn hop() -> impl Strategy<Value = (IpAddr, Option<u16>)> {
            let v4 = prop_oneof![
                any::<[u8; 4]>().prop_map(IpAddr::from),
                (0u8..4).prop_map(|n| IpAddr::from([10, 0, 0, n])),
            ];
            let v6 = prop_oneof![
                any::<[u16; 8]>().prop_map(IpAddr::from),
                (0u16..4).prop_map(|n| IpAddr::from([0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, n])),
            ];
            (prop_oneof![v4, v6], proptest::option::of(any::<u16>()))
        }

        fn xff(ip: IpAddr, port: Option<u16>) -> String {
            match (ip, port) {
                (ip, None) => ip.to_string(),
                (IpAddr::V4(a), Some(p)) => format!("{a}:{p}"),
                (IpAddr::V6(a), Some(p)) => format!("[{a}]:{p}"),
            }
        }

        fn fwd(ip: IpAddr, port: Option<u16>, style: u8) -> String {
            let node = match (ip, port) {
                (IpAddr::V4(a), None) if style % 2 == 0 => a.to_string(),
                (IpAddr::V4(a), None) => format!("\"{a}\""),
                (IpAddr::V4(a), Some(p)) => format!("\"{a}:{p}\""),
                (IpAddr::V6(a), None) => format!("\"[{a}]\""),
                (IpAddr::V6(a), Some(p)) => format!("\"[{a}]:{p}\""),
            };
            match style % 4 {
                0 | 1 => format!("for={node}"),
                2 => format!("proto=https;FOR={node};by=\"[2001:db8::1]\""),
                _ => format!("host=\"x,y;z\";for={node}"),
            }
        }

        proptest! {
            /// The same chain, written as `X-Forwarded-For` and as `Forwarded` (any
            /// quoting, parameters and header split), resolves to the same client.
            #[test]
            fn forwarded_walks_as_xff(
                chain in proptest::collection::vec((hop(), any::<u8>()), 0..8),
                peer in hop(),
                split in any::<usize>(),
            ) {
                let r = resolver(&["10.0.0.0/8", "2001:db8:ffff::/48"]);
                let xs: Vec<String> = chain.iter().map(|((ip, p), _)| xff(*ip, *p)).collect();
                let fs: Vec<String> =
                    chain.iter().map(|((ip, p), s)| fwd(*ip, *p, *s)).collect();
                let cut = if chain.is_empty() { 0 } else { split % (chain.len() + 1) };
                let headers = |v: &[String]| -> Vec<String> {
                    [v[..cut].join(", "), v[cut..].join(",")]
                        .into_iter()
                        .filter(|h| !h.is_empty())
                        .collect()
                };
                let (xh, fh) = (headers(&xs), headers(&fs));
                let a = r.resolve(peer.0, xh.iter().map(|s| s.as_bytes()));
                let b = r.resolve_forwarded(peer.0, fh.iter().map(|s| s.as_bytes()));
                prop_assert_eq!(a, b, "xff {:?} forwarded {:?}", xh, fh);
            }

            /// Hostile bytes never panic.
            #[test]
            fn forwarded_survives_anything(v in proptest::collection::vec(any::<u8>(), 0..200)) {
                let r = resolver(&["10.0.0.0/8"]);
                let _ = r.resolve_forwarded("10.0.0.1".parse().unwrap(), std::iter::once(&v[..]));
            }
        }
    }
}
