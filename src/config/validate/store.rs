//! `[store]`: the backend, its timeouts, leases and failure policy.

use super::*;

/// The largest `max_states`: 2^28 states, tens of GiB.
const MAX_STATES: u64 = 1 << 28;

pub(super) fn store(cx: &Ctx<'_>, s: &StoreFile) -> Result<Store, ConfigError> {
    let backend = match s.backend.as_ref().map(|b| *b.get_ref()) {
        Some(BackendFile::Redis) => Backend::Redis,
        _ => Backend::Memory,
    };
    if let (Some(b), Backend::Redis) = (&s.backend, backend) {
        if s.url.is_none() && s.cluster.is_none() && s.sentinel.is_none() {
            return Err(cx.err(
                b.span(),
                "backend = \"redis\" needs `url`, `cluster` or `sentinel`",
            ));
        }
    }
    let timeout_ms = bounded(
        cx,
        "timeout_ms",
        s.timeout_ms.as_ref(),
        1..=MAX_STORE_TIMEOUT_MS,
    )?;
    if let Some(n) = &s.instances {
        if *n.get_ref() == 0 {
            return Err(cx.err(n.span(), "instances must be at least 1"));
        }
    }
    let lease_ms = bounded(cx, "lease_ms", s.lease_ms.as_ref(), 1..=MAX_LEASE_MS)?;
    let conc_secs = bounded(
        cx,
        "concurrency_lease_secs",
        s.concurrency_lease_secs.as_ref(),
        1..=3_600,
    )?;
    let max_states = bounded(cx, "max_states", s.max_states.as_ref(), 1..=MAX_STATES)?;
    // Every URL may be a `"${VAR}"` reference: credentials stay out of the file.
    let urls = |key: &str, v: &[Spanned<String>]| -> Result<Vec<String>, ConfigError> {
        v.iter().map(|u| env_value(cx, key, u)).collect()
    };
    let sentinel = match &s.sentinel {
        Some(st) => Some((urls("sentinel.urls", &st.urls)?, st.master.clone())),
        None => None,
    };
    Ok(Store {
        backend,
        url: s
            .url
            .as_ref()
            .map(|u| env_value(cx, "url", u))
            .transpose()?,
        cluster: urls("cluster", s.cluster.as_deref().unwrap_or_default())?,
        sentinel,
        timeout: Duration::from_millis(timeout_ms.unwrap_or(25)),
        on_failure: s.on_failure.map_or(OnFailure::Local, on_failure),
        instances: s.instances.as_ref().map(|n| *n.get_ref()),
        key_prefix: s.key_prefix.clone().unwrap_or_else(|| "thr".to_string()),
        lease: Duration::from_millis(lease_ms.unwrap_or(1_000)),
        concurrency_lease: Duration::from_secs(conc_secs.unwrap_or(30)),
        max_states: max_states.map_or(crate::config::DEFAULT_MAX_STATES, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        }),
    })
}

pub(super) fn on_failure(f: OnFailureFile) -> OnFailure {
    match f {
        OnFailureFile::Open => OnFailure::Open,
        OnFailureFile::Closed => OnFailure::Closed,
        OnFailureFile::Local => OnFailure::Local,
    }
}
