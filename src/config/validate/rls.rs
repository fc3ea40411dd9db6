//! `[rls]`: the rate-limit service's settings, and its envoyproxy/ratelimit YAML read now,
//! so `throttle check` and a reload report a broken descriptor file as they report a
//! broken `gateway.toml` (`FILE:LINE:COL: message`, the YAML file's own position).

use super::*;
use crate::descriptors::RlsConfig;
use crate::limiter::named::MAX_DOMAINS;
use crate::limiter::{Admission, Named, Scope};

/// `[rls]` (absent: the built-in mapping, the store's failure policy, leases).
pub(super) fn rls(cx: &Ctx<'_>, raw: Option<&RlsFile>, store: &Store) -> Result<Rls, ConfigError> {
    let Some(r) = raw else {
        return Ok(Rls {
            descriptors: None,
            response_headers: false,
            on_failure: store.on_failure,
            admission: Admission::Auto,
        });
    };
    let descriptors = match &r.config {
        Some(path) => {
            let dir = std::path::Path::new(cx.name)
                .parent()
                .unwrap_or(std::path::Path::new(""));
            let resolved = dir.join(path.get_ref());
            if !resolved.exists() {
                return Err(cx.err(
                    path.span(),
                    format!("[rls] config: {} does not exist", resolved.display()),
                ));
            }
            let loaded = RlsConfig::load(&resolved).map_err(|e| ConfigError {
                file: e.file.clone(),
                position: Some((e.line, e.col)),
                message: e.message.clone(),
            })?;
            let domains = loaded.domains().count();
            if domains > MAX_DOMAINS {
                let msg = format!("[rls] config: {domains} domains; at most {MAX_DOMAINS}");
                return Err(cx.err(path.span(), msg));
            }
            // Each domain's own scope (`rls:<domain>`): no route table or custom scope can
            // have its name, so none shares its counters.
            let scopes = loaded
                .domains()
                .map(|d| (d.to_string(), Scope::Named(Named::domain(d))))
                .collect();
            Some(Arc::new(RlsDescriptors {
                path: resolved,
                config: loaded,
                scopes,
            }))
        }
        None => None,
    };
    Ok(Rls {
        descriptors,
        response_headers: r.response_headers.unwrap_or(false),
        on_failure: r.on_failure.map_or(store.on_failure, on_failure),
        admission: match r.admission {
            Some(AdmissionFile::Exact) => Admission::Exact,
            Some(AdmissionFile::Auto) | None => Admission::Auto,
        },
    })
}
