//! What the gateway's Pingora listeners share below their adapters (the proxy's, the
//! admin API's, the Envoy rate-limit service's): the connection guard (`guarded`) and
//! the socket peer as Pingora hands it over, read through the one canonicalization
//! (`edge::peer_ip`) the pipeline uses, so a connection cap and an `ip` limit key the
//! same client alike.

pub mod guarded;

use std::net::IpAddr;

use pingora::protocols::l4::socket::SocketAddr;
use pingora::protocols::Stream;

pub use self::guarded::Guarded;

/// A Pingora socket peer's IP, as given (None: a Unix socket, or no peer known).
fn inet(peer: Option<&SocketAddr>) -> Option<IpAddr> {
    peer.and_then(SocketAddr::as_inet).map(|a| a.ip())
}

/// A Pingora session's peer as the limits key on it (`edge::peer_addr`); None for a peer
/// without an IP.
pub fn peer_addr(peer: Option<&SocketAddr>) -> Option<IpAddr> {
    crate::edge::peer_addr(inet(peer))
}

/// A Pingora session's peer as the limits key on it (`edge::peer_ip`: `0.0.0.0` for a
/// peer without an IP): the proxy decides every request on an address.
pub fn peer_ip(peer: Option<&SocketAddr>) -> IpAddr {
    crate::edge::peer_ip(inet(peer))
}

/// The peer of an accepted connection, as the per-client connection caps key on it: the
/// same address the `ip` limits of its requests key on (`edge::peer_ip`).
pub fn stream_peer(stream: &Stream) -> IpAddr {
    let digest = stream.get_socket_digest();
    peer_ip(digest.as_ref().and_then(|d| d.peer_addr()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pingora::protocols::l4::socket::SocketAddr;

    use super::peer_ip;
    use crate::lifecycle::{Lifecycle, Refused};

    fn inet(s: &str) -> SocketAddr {
        SocketAddr::Inet(s.parse().unwrap())
    }

    /// The listeners read a NAT64 or IPv4-mapped peer as its IPv4 client, as the `ip`
    /// limits do (`edge::peer_ip`), so the per-client connection cap counts every form of
    /// the address as one client, and another NAT64 client apart.
    #[test]
    fn a_nat64_peer_is_its_ipv4_client() {
        let v4 = inet("192.0.2.7:1000");
        let forms = [
            inet("[64:ff9b::c000:207]:1000"),
            inet("[::ffff:192.0.2.7]:1000"),
        ];
        for form in &forms {
            assert_eq!(peer_ip(Some(form)), peer_ip(Some(&v4)), "{form:?}");
            assert_eq!(peer_ip(Some(form)).to_string(), "192.0.2.7");
        }
        assert_eq!(peer_ip(None).to_string(), "0.0.0.0");

        let conns = Arc::new(Lifecycle::default());
        let slots: Vec<_> = [&v4, &forms[0], &forms[1]]
            .into_iter()
            .map(|p| conns.open(peer_ip(Some(p)), 100, Some(3)).unwrap())
            .collect();
        let fourth = conns.open(peer_ip(Some(&forms[0])), 100, Some(3));
        assert!(matches!(fourth, Err(Refused::PerIp)));
        let other = inet("[64:ff9b::c000:208]:1000");
        assert!(conns.open(peer_ip(Some(&other)), 100, Some(3)).is_ok());
        drop(slots);
    }
}
