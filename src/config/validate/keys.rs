//! `[[keys]]` and `[[blocks]]`, and the RFC 3339 times they carry.

use super::*;

pub(super) fn keys(
    cx: &Ctx<'_>,
    list: &[Spanned<KeyFile>],
    tiers: &HashMap<String, Arc<Tier>>,
) -> Result<Vec<KeyEntry>, ConfigError> {
    let mut ids = HashSet::new();
    let mut out = Vec::with_capacity(list.len());
    for k in list {
        let (span, k) = (k.span(), k.get_ref());
        if !ids.insert(k.id.get_ref().clone()) {
            return Err(cx.err(
                k.id.span(),
                format!("duplicate key id {:?}", k.id.get_ref()),
            ));
        }
        if !crate::auth::key_id_allowed(k.id.get_ref()) {
            return Err(cx.err(
                k.id.span(),
                format!(
                    "key id {:?}: ids starting with \"jwt:\" are JWT callers' (their key scope is jwt:<sub>)",
                    k.id.get_ref()
                ),
            ));
        }
        known_tier(cx, &k.tier, tiers)?;
        let sha256 = match (&k.key, &k.key_sha256) {
            (Some(_), Some(h)) => {
                return Err(cx.err(
                    h.span(),
                    "`key` and `key_sha256` are mutually exclusive: give one",
                ))
            }
            (None, None) => return Err(cx.err(span, "a key needs `key` or `key_sha256`")),
            (Some(key), None) if key.get_ref().is_empty() => {
                return Err(cx.err(key.span(), "`key` must not be empty"))
            }
            (Some(key), None) => Sha256::digest(key.get_ref().as_bytes()).into(),
            (None, Some(h)) => {
                let mut out = [0u8; 32];
                hex::decode_to_slice(h.get_ref().trim(), &mut out)
                    .map_err(|_| cx.err(h.span(), "key_sha256 must be 64 hex characters"))?;
                out
            }
        };
        out.push(KeyEntry {
            id: k.id.get_ref().clone(),
            sha256,
            tenant: k.tenant.clone(),
            tier: k.tier.get_ref().clone(),
        });
    }
    Ok(out)
}

pub(super) fn blocks(cx: &Ctx<'_>, list: &[BlockFile]) -> Result<Vec<BlockEntry>, ConfigError> {
    list.iter()
        .map(|b| {
            let value = b.value.get_ref().trim();
            if let Some(problem) = crate::config::block_values::text_problem(value) {
                return Err(cx.err(b.value.span(), format!("block value {problem}")));
            }
            let target = match b.scope {
                BlockScopeFile::Ip => {
                    let net = cidr(cx, &b.value)?;
                    if let Some(problem) = crate::config::block_values::net_problem(value, b.force.unwrap_or(false)) {
                        // In TOML the escape hatch is `force = true`, not the API's JSON.
                        let problem = problem.replace("send \"force\": true", "set force = true");
                        return Err(cx.err(b.value.span(), format!("block value {problem}")));
                    }
                    BlockTarget::Ip(net)
                }
                BlockScopeFile::Key => BlockTarget::Key(value.to_string()),
                BlockScopeFile::Tenant => BlockTarget::Tenant(value.to_string()),
            };
            if value.is_empty() {
                return Err(cx.err(b.value.span(), "block value must not be empty"));
            }
            let expires_at_ms = match &b.expires_at {
                Some(d) => Some(datetime_ms(d.get_ref()).ok_or_else(|| {
                    cx.err(d.span(), "expires_at must be an offset date-time (e.g. 2026-12-31T00:00:00Z) or a date")
                })?),
                None => None,
            };
            Ok(BlockEntry { target, reason: b.reason.clone(), expires_at_ms })
        })
        .collect()
}

/// Unix ms of an RFC 3339 date-time (or a bare date), e.g. `2026-12-31T00:00:00Z`.
pub fn rfc3339_ms(s: &str) -> Option<u64> {
    datetime_ms(&s.trim().parse::<toml::value::Datetime>().ok()?)
}

/// `2026-12-31T00:00:00Z` for Unix ms.
pub fn format_rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (y, m, d) = crate::limiter::algorithm::civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Unix ms of a TOML offset date-time, or of a bare date at 00:00 UTC.
pub(super) fn datetime_ms(d: &toml::value::Datetime) -> Option<u64> {
    let date = d.date?;
    let days = crate::limiter::algorithm::days_from_civil(
        i64::from(date.year),
        u32::from(date.month),
        u32::from(date.day),
    );
    let mut secs = days * 86_400;
    let mut nanos = 0i64;
    match (d.time, d.offset) {
        (None, None) => {}
        (Some(t), Some(off)) => {
            secs += i64::from(t.hour) * 3600
                + i64::from(t.minute) * 60
                + i64::from(t.second.unwrap_or(0));
            nanos = i64::from(t.nanosecond.unwrap_or(0));
            if let toml::value::Offset::Custom { minutes } = off {
                secs -= i64::from(minutes) * 60;
            }
        }
        _ => return None,
    }
    u64::try_from(secs * 1000 + nanos / 1_000_000).ok()
}
