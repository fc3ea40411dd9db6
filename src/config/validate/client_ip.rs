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

/// An address or CIDR (`config::parse_net`: a bare address is a /32 or /128, host bits
/// are cleared).
pub(super) fn cidr(cx: &Ctx<'_>, v: &Spanned<String>) -> Result<IpNet, ConfigError> {
    crate::config::parse_net(v.get_ref()).ok_or_else(|| {
        cx.err(
            v.span(),
            format!(
                "invalid CIDR {:?}: expected an address or ADDRESS/PREFIX",
                v.get_ref().trim()
            ),
        )
    })
}
