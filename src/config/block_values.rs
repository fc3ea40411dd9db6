//! What a block's value and reason may be, checked alike for `[[blocks]]` in the config
//! and for `POST /v1/blocks`.

use ipnet::IpNet;

/// The shortest IPv4 prefix a block may have without `force`.
pub const MIN_V4_PREFIX: u8 = 8;
/// The shortest IPv6 prefix a block may have without `force`.
pub const MIN_V6_PREFIX: u8 = 32;

/// Why `s` cannot be a block's text: a control character, or a bidirectional formatting
/// character (which makes a listing read differently from what is stored).
pub fn text_problem(s: &str) -> Option<&'static str> {
    // Controls, and the line and paragraph separators that split a line as well.
    if s.chars()
        .any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
    {
        return Some("must not contain control characters");
    }
    if s.chars().any(is_bidi_control) {
        return Some("must not contain bidirectional formatting characters");
    }
    None
}

/// The Unicode bidirectional formatting characters (UAX #9: embeddings, overrides,
/// isolates, marks).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Why `value` (an address or a CIDR that parses) is not a block to take as written:
/// host bits set after the prefix (`10.0.0.1/8`: probably not what was meant), or a
/// prefix shorter than /8 (IPv4) or /32 (IPv6), which blocks a large part of the
/// Internet; an IPv6 network that carries IPv4 (`::ffff:0:0/96`, NAT64's
/// `64:ff9b::/96`) by the IPv4 network it carries. `force` accepts both (the network is
/// then the prefix's).
pub fn net_problem(value: &str, force: bool) -> Option<String> {
    let net = super::net::parse_net_as_written(value)?;
    if force {
        return None;
    }
    if net != net.trunc() {
        return Some(format!(
            "{net} has host bits set: write {} (or send \"force\": true)",
            net.trunc()
        ));
    }
    // A network that carries IPv4 (mapped, translated, NAT64: `64:ff9b::/96` is all of
    // IPv4) is judged as the IPv4 network it is matched as.
    let (prefix, min) = match crate::limiter::canonical_net(net) {
        IpNet::V4(n) => (n.prefix_len(), MIN_V4_PREFIX),
        IpNet::V6(n) => (n.prefix_len(), MIN_V6_PREFIX),
    };
    (prefix < min).then(|| {
        format!(
            "{net} is wider than /{min}: it would block too much (send \"force\": true to mean it)"
        )
    })
}
