//! `[client_ip]`: trusted proxies, the IPv6 prefix and the forwarded header.

use super::*;

/// The resolver's settings: trusted proxies, the IPv6 prefix and the header read.
pub(super) fn client_ip(
    cx: &Ctx<'_>,
    c: &ClientIpFile,
) -> Result<(Vec<IpNet>, u8, ClientIpHeader), ConfigError> {
    let trusted_proxies = trusted(cx, &c.trusted_proxies)?;
    let ipv6_prefix = bounded(cx, "ipv6_prefix", c.ipv6_prefix.as_ref(), 1..=128)?.unwrap_or(64);
    let client_ip_header = match c.header {
        None | Some(ForwardedHeaderFile::XForwardedFor) => ClientIpHeader::XForwardedFor,
        Some(ForwardedHeaderFile::Forwarded) => ClientIpHeader::Forwarded,
    };
    Ok((trusted_proxies, ipv6_prefix, client_ip_header))
}

pub(super) fn trusted(cx: &Ctx<'_>, list: &[Spanned<String>]) -> Result<Vec<IpNet>, ConfigError> {
    list.iter().map(|c| cidr(cx, c)).collect()
}

/// An address or CIDR; a bare address is a /32 or /128.
pub(super) fn cidr(cx: &Ctx<'_>, v: &Spanned<String>) -> Result<IpNet, ConfigError> {
    let s = v.get_ref().trim();
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    s.parse::<IpAddr>().map(IpNet::from).map_err(|_| {
        cx.err(
            v.span(),
            format!("invalid CIDR {s:?}: expected an address or ADDRESS/PREFIX"),
        )
    })
}
