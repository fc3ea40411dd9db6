//! What a request forwarded upstream carries, for every transport: the client headers it
//! must lose (`scrubbed`), the identity headers the gateway sets, and the address chain
//! (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`) built in one buffer.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::admission::{Admission, Runtime};
use crate::config::ClientIpHeader;

/// Removes the request headers an upstream must not take from a client:
/// - `X-Throttle-*`: only the gateway sets them;
/// - names with `_` (unless `underscores_in_headers`): CGI/WSGI upstreams read
///   `X_Throttle_Tenant` as `X-Throttle-Tenant`;
/// - `X-Original-URL` / `X-Rewrite-URL`: some frameworks route on them instead of the
///   path this gateway matched;
/// - `X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`: some frameworks
///   serve them instead of the method this gateway routed and limited;
/// - the client-IP chain the gateway does not read (`fwd`: it reads `Forwarded`);
/// - from a peer that is not a trusted proxy, `Forwarded` and `X-Forwarded-Host`,
///   `-Proto`, `-Port`, `-Prefix` (the gateway sets `Forwarded` and `X-Forwarded-For`
///   itself).
///
/// The names to remove, by the rule of [`scrubbed`] and the request's runtime `rt`
/// (empty, and nothing allocated, in the common case).
///
/// On a route with `hide_credentials`, the credentials the gateway read go too: the key
/// header (`[auth] key_header`) and a Bearer `Authorization` (a Basic one is the
/// upstream's and stays).
pub fn doomed(headers: &HeaderMap, a: &Admission, trusted: bool) -> Vec<HeaderName> {
    let rt = &a.runtime;
    let underscores = rt.config.server.underscores_in_headers;
    let fwd = reads_forwarded(rt);
    let hide = a.route.as_ref().is_some_and(|r| r.route.hide_credentials);
    let credential = |n: &HeaderName| {
        *n == rt.config.auth.key_header
            || (*n == http::header::AUTHORIZATION
                && headers
                    .get_all(n)
                    .iter()
                    .any(|v| crate::identity::is_bearer(v.as_bytes())))
    };
    let doomed =
        |n: &HeaderName| scrubbed(n.as_str(), trusted, underscores, fwd) || (hide && credential(n));
    if !headers.keys().any(doomed) {
        return Vec::new(); // the common case: nothing to remove, nothing allocated
    }
    headers.keys().filter(|n| doomed(n)).cloned().collect()
}

/// Whether the gateway reads the client-IP chain from `Forwarded` (else from
/// `X-Forwarded-For`).
pub fn reads_forwarded(rt: &Runtime) -> bool {
    rt.config.client_ip_header == ClientIpHeader::Forwarded
}

/// `X-Throttle-Tenant` and `X-Throttle-Key-Id` of an admitted request whose caller is
/// known (both transports add them after scrubbing the client's). Static names: Pingora
/// keeps a `&'static str` name as it is, while a `HeaderName` is copied into a new
/// buffer (two allocations a request, measured by callgrind).
///
/// Each is None when the caller has no such id (a JWT without `tenant_claim` has no
/// tenant), and both on a route with `identity_headers = false`.
pub fn identity_headers(a: &Admission) -> Option<[Option<(&'static str, HeaderValue)>; 2]> {
    if a.route.as_ref().is_some_and(|r| !r.route.identity_headers) {
        return None;
    }
    let h = &a.key.as_ref()?.headers;
    Some([
        h.tenant.clone().map(|v| ("x-throttle-tenant", v)),
        h.key_id.clone().map(|v| ("x-throttle-key-id", v)),
    ])
}

/// Whether the upstream request of `a` gets `X-Real-IP` (not on a route with
/// `real_ip_header = false`).
pub fn sends_real_ip(a: &Admission) -> bool {
    a.route.as_ref().is_none_or(|r| r.route.real_ip_header)
}

/// Whether the response forwarded for `a` carries its rate-limit headers (not on a route
/// with `hide_client_headers = true`; the gateway's own 429 always does).
pub fn shows_rate_headers(a: &Admission) -> bool {
    a.route
        .as_ref()
        .is_none_or(|r| !r.route.hide_client_headers)
}

/// Whether a client-sent request header (lower-case `name`) is removed before the request
/// goes upstream: `X-Throttle-*` (only the gateway sets them), names with `_` (unless
/// `underscores_in_headers`), URL- and method-override headers, the client-IP chain the gateway does
/// not read (`Forwarded`, or `X-Forwarded-For` with `reads_forwarded`), and, from an
/// untrusted peer, the forwarding headers that would name another host, scheme or prefix.
/// The tower layer applies the same rule.
pub fn scrubbed(n: &str, trusted: bool, underscores: bool, reads_forwarded: bool) -> bool {
    n.starts_with("x-throttle-")
        // The client-IP chain the gateway does not read was never checked.
        || (if reads_forwarded { n == "x-forwarded-for" } else { n == "forwarded" })
        || (!underscores && n.contains('_'))
        || matches!(
            n,
            "x-original-url"
                | "x-rewrite-url"
                | "x-http-method-override"
                | "x-http-method"
                | "x-method-override"
        )
        || (!trusted
            && matches!(
                n,
                "forwarded"
                    | "x-forwarded-host"
                    | "x-forwarded-proto"
                    | "x-forwarded-port"
                    | "x-forwarded-prefix"
            ))
}

/// The address header values of a request, written into one buffer: the peer (the
/// `X-Forwarded-For` of an untrusted peer), `for=<peer>` (IPv6 as `for="[v6]"`, only when
/// asked for: the gateway reads `Forwarded`) and the client (`X-Real-IP`), one allocation
/// for the three.
pub struct AddressValues {
    /// The peer, as an untrusted peer's `X-Forwarded-For`.
    pub peer: HeaderValue,
    /// `for=<peer>`: this hop's `Forwarded` element, when asked for.
    pub forwarded: Option<HeaderValue>,
    /// The client, as `X-Real-IP`.
    pub client: HeaderValue,
}

// === impl AddressValues ===

impl AddressValues {
    /// The values for a request from `peer` whose client is `client`; `with_forwarded`:
    /// this hop's `Forwarded` element too.
    pub fn new(peer: IpAddr, client: IpAddr, with_forwarded: bool) -> Self {
        let mut buf = Vec::with_capacity(128);
        push_ip(&mut buf, peer);
        let p = buf.len();
        if with_forwarded {
            // The peer's text again, copied rather than formatted twice.
            let v6 = peer.is_ipv6();
            buf.extend_from_slice(if v6 { b"for=\"[" } else { b"for=" });
            buf.extend_from_within(..p);
            if v6 {
                buf.extend_from_slice(b"]\"");
            }
        }
        let f = buf.len();
        let same = client == peer;
        if !same {
            push_ip(&mut buf, client);
        }
        let all = bytes::Bytes::from(buf);
        let value = |r: std::ops::Range<usize>| {
            HeaderValue::from_maybe_shared(all.slice(r))
                .unwrap_or(HeaderValue::from_static("unknown"))
        };
        let peer_v = value(0..p);
        Self {
            forwarded: with_forwarded.then(|| value(p..f)),
            client: if same {
                peer_v.clone()
            } else {
                value(f..all.len())
            },
            peer: peer_v,
        }
    }
}

/// The address chain of a forwarded request, decided once: only the chain the gateway
/// read is forwarded as received (from a trusted proxy, plus this hop); the other was never
/// checked, so an upstream reading it would believe whatever the client wrote.
/// `X-Forwarded-For` always carries this hop.
pub struct AddressHeaders {
    /// `X-Forwarded-For`: a trusted peer's chain plus the peer, else the peer alone.
    pub forwarded_for: HeaderValue,
    /// `Forwarded`, only when the gateway reads it (`[client_ip] header`).
    pub forwarded: Option<HeaderValue>,
    /// `X-Real-IP`: the client the gateway resolved.
    pub real_ip: HeaderValue,
}

// === impl AddressHeaders ===

impl AddressHeaders {
    /// The chain for a request from `peer` (`trusted`: a trusted proxy) with the client's
    /// `headers`, whose client resolved to `client`, on the runtime `rt`.
    pub fn new(
        headers: &HeaderMap,
        rt: &Runtime,
        peer: IpAddr,
        client: IpAddr,
        trusted: bool,
    ) -> Self {
        let reads_forwarded = reads_forwarded(rt);
        let ips = AddressValues::new(peer, client, reads_forwarded);
        let forwarded_for = if trusted && !reads_forwarded {
            forwarded_for(headers, peer)
        } else {
            ips.peer.clone()
        };
        let forwarded = match (ips.forwarded, trusted) {
            (None, _) => None,
            (Some(element), true) => Some(forwarded(headers, &element)),
            (Some(element), false) => Some(element),
        };
        Self {
            forwarded_for,
            forwarded,
            real_ip: ips.client,
        }
    }
}

/// Appends `ip` as text: IPv4 octet by octet (no `core::fmt` on the request path), IPv6
/// through `Display`.
fn push_ip(buf: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let mut b = itoa::Buffer::new();
            for (i, o) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf.push(b'.');
                }
                buf.extend_from_slice(b.format(o).as_bytes());
            }
        }
        IpAddr::V6(v6) => {
            use std::io::Write;
            let _ = write!(buf, "{v6}");
        }
    }
}

/// The upstream's `Forwarded` (RFC 7239) from a trusted peer: its elements plus
/// `for=<peer>` (`element`).
pub fn forwarded(headers: &HeaderMap, element: &HeaderValue) -> HeaderValue {
    let mut chain: Vec<&[u8]> = headers
        .get_all(http::header::FORWARDED)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    if chain.is_empty() {
        return element.clone();
    }
    chain.push(element.as_bytes());
    HeaderValue::from_bytes(&chain.join(&b", "[..])).unwrap_or_else(|_| element.clone())
}

/// The upstream's `X-Forwarded-For` from a trusted peer: the client's chain plus the
/// peer.
pub fn forwarded_for(headers: &HeaderMap, peer: IpAddr) -> HeaderValue {
    let peer_s = peer.to_string();
    let mut chain: Vec<&[u8]> = headers
        .get_all(&crate::client_ip::X_FORWARDED_FOR)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    chain.push(peer_s.as_bytes());
    let joined = chain.join(&b", "[..]);
    HeaderValue::from_bytes(&joined)
        .or_else(|_| HeaderValue::from_str(&peer_s))
        .unwrap_or(HeaderValue::from_static("0.0.0.0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(header: &str) -> Runtime {
        let config = format!(
            "[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]\nheader = \"{header}\"\n\n\
             [[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\nauth = \"none\"\n"
        );
        Runtime::from_config(crate::config::parse("t.toml", &config).unwrap()).unwrap()
    }

    fn text(v: &Option<HeaderValue>) -> Option<&str> {
        v.as_ref().map(|v| v.to_str().unwrap())
    }

    /// The override headers some frameworks serve instead of the routed method or path
    /// never go upstream; ordinary headers do.
    #[test]
    fn override_headers_are_scrubbed() {
        for (name, gone) in [
            ("x-http-method-override", true),
            ("x-http-method", true),
            ("x-method-override", true),
            ("x-original-url", true),
            ("x-rewrite-url", true),
            ("x-method", false),
            ("accept", false),
        ] {
            assert_eq!(scrubbed(name, true, false, false), gone, "{name}");
        }
    }

    /// Only the chain the gateway reads is forwarded as received, and only from a trusted
    /// peer; `X-Forwarded-For` always carries this hop and `X-Real-IP` the client.
    #[test]
    fn forwards_only_the_chain_it_read_from_a_trusted_peer() {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        headers.insert("forwarded", HeaderValue::from_static("for=5.6.7.8"));
        let (peer, client): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "1.2.3.4".parse().unwrap());
        let cases = [
            ("x-forwarded-for", true, "1.2.3.4, 10.0.0.1", None),
            ("x-forwarded-for", false, "10.0.0.1", None),
            (
                "forwarded",
                true,
                "10.0.0.1",
                Some("for=5.6.7.8, for=10.0.0.1"),
            ),
            ("forwarded", false, "10.0.0.1", Some("for=10.0.0.1")),
        ];
        for (header, trusted, xff, fwd) in cases {
            let chain = AddressHeaders::new(&headers, &runtime(header), peer, client, trusted);
            let got = (
                chain.forwarded_for.to_str().unwrap(),
                text(&chain.forwarded),
            );
            assert_eq!(got, (xff, fwd), "{header} trusted={trusted}");
            assert_eq!(chain.real_ip, "1.2.3.4");
        }
    }

    /// The three values of one buffer: the peer, its `Forwarded` element (IPv6 quoted in
    /// brackets) and the client, for IPv4 and IPv6 peers, the client the peer or not.
    #[test]
    fn address_values_name_the_peer_and_the_client() {
        let cases = [
            ("10.0.0.1", "10.0.0.1", "for=10.0.0.1"),
            ("10.0.0.1", "1.2.3.4", "for=10.0.0.1"),
            ("2001:db8::1", "2001:db8::1", "for=\"[2001:db8::1]\""),
            ("2001:db8::1", "192.0.2.9", "for=\"[2001:db8::1]\""),
            ("::ffff:10.0.0.1", "::1", "for=\"[::ffff:10.0.0.1]\""),
        ];
        for (peer, client, forwarded) in cases {
            for with in [true, false] {
                let v = AddressValues::new(peer.parse().unwrap(), client.parse().unwrap(), with);
                let got = (
                    v.peer.to_str().unwrap(),
                    text(&v.forwarded),
                    v.client.to_str().unwrap(),
                );
                assert_eq!(
                    got,
                    (peer, with.then_some(forwarded), client),
                    "{peer} {client}"
                );
            }
        }
    }
}
