//! Hot reload: re-read `gateway.toml` (SIGHUP or `POST /v1/reload`) and swap the runtime.
//!
//! An invalid file is rejected with exactly the errors of `throttle check` and the old
//! config keeps serving. A valid one applies to every request that starts after the swap;
//! requests in flight finish on the runtime they started with, and no connection is
//! touched. An adaptive route that keeps its name and stays adaptive keeps its window and
//! factor (a reload never lifts the protection from a struggling upstream; new settings
//! apply from the next controller tick). What a reload applies and what needs a restart
//! is classified field by field in `settings` (the listeners, the store's connection and
//! leases, the database URL, the access log, `[tracing]`, adding or removing TLS...): the
//! answer's `needs_restart` names every such setting the file changed since the process
//! started.
//!
//! What the gateway keeps per name of a route, route table, custom scope or domain (metric
//! series, `/v1/top` sketches) is dropped when a reload removes the name (`forget_removed`),
//! so reloads with fresh names never grow it; the names themselves stay interned (see
//! `limiter::named` for that bound).

use std::collections::HashSet;
use std::path::PathBuf;

use self::snapshot::Database;
use crate::admission::{Core, Runtime, RuntimeError};
use crate::config::{self, Config, ConfigError};
use crate::limiter::{Named, Scope};

pub mod settings;
pub mod snapshot;

/// What a successful reload changed.
#[derive(Debug, Clone)]
pub struct Reloaded {
    /// The file re-read.
    pub source: String,
    /// Settings the file changed since the process started that only a restart applies
    /// (`settings::needs_restart`), as dotted gateway.toml paths.
    pub needs_restart: Vec<&'static str>,
}

/// Re-reads the config file of the running gateway and swaps it in.
///
/// # Errors
/// The file's `ConfigError` (`FILE:LINE:COL: message`); the old config keeps serving.
pub async fn reload(core: &Core, db: &Database) -> Result<Reloaded, ConfigError> {
    let old = core.runtime();
    let source = old.config.source.clone();
    let path = PathBuf::from(&source);
    // File IO and upstream name resolution: off the async workers.
    let mut loaded = tokio::task::spawn_blocking(move || config::load(&path))
        .await
        .map_err(|e| ConfigError::file(&source, format!("reload task failed: {e}")))??;
    config::apply_env(&mut loaded);
    if let Some(addr) = core.upstream_override {
        point_routes_at(&mut loaded, addr); // `throttle demo` keeps its in-process upstream
    }
    let needs_restart = settings::needs_restart(&core.started, &loaded);
    Runtime::from_config(loaded)
        .map_err(RuntimeError::from)
        .and_then(|rt| core.swap_runtime(rt))
        .map_err(|e| ConfigError::file(&source, e.to_string()))?;
    forget_removed(core);
    if let Some(pool) = db.pool() {
        // A tier new in the file gets its rate_limit_policies row (existing rows stay the
        // truth); database keys resolve their tiers through the config: rebuild them now.
        if let Err(e) = crate::db::sync_policies(&pool, &core.runtime().config).await {
            tracing::warn!(error = %e, "policy rows for new tiers not written; the next start retries");
        }
        if let Err(e) = snapshot::refresh(core, &pool).await {
            tracing::warn!(error = %e, "snapshot reload after a config reload failed; the next refresh retries");
        }
    }
    if !needs_restart.is_empty() {
        tracing::warn!(settings = ?needs_restart, "config reloaded; these settings take effect only after a restart");
    }
    tracing::info!(%source, "config reloaded");
    Ok(Reloaded {
        source,
        needs_restart,
    })
}

/// Drops the metric series and `/v1/top` sketches of every route, named scope and domain
/// the running config does not have (those a reload removed, and any a request still on
/// an older runtime made since the last reload).
pub fn forget_removed(core: &Core) {
    let rt = core.runtime();
    let config = &rt.config;
    let scopes = named_scopes(config);
    let names: HashSet<&str> = scopes.iter().map(|n| n.info().name).collect();
    core.metrics.retain_scopes(|n| names.contains(n));
    let routes: HashSet<&str> = config.routes.iter().map(|r| &*r.name).collect();
    core.metrics.retain_routes(|r| routes.contains(r));
    let domains = config.rls.descriptors.as_ref();
    core.metrics
        .retain_domains(|d| domains.is_some_and(|ds| ds.config.has_domain(d)));
    core.top.retain(|n| scopes.contains(&n));
}

/// Every named scope of `config`: its custom scopes, its routes' tables and its domains.
pub fn named_scopes(config: &Config) -> HashSet<Named> {
    let customs = config.scopes.iter().map(|c| c.scope);
    let tables = config
        .routes
        .iter()
        .flat_map(|r| r.limits.iter().map(|t| t.scope));
    let domains = config
        .rls
        .descriptors
        .iter()
        .flat_map(|d| d.scopes.values().copied());
    customs
        .chain(tables)
        .chain(domains)
        .filter_map(|s| match s {
            Scope::Named(n) => Some(n),
            _ => None,
        })
        .collect()
}

/// Points every route at `addr` (`throttle demo`'s in-process upstream).
pub fn point_routes_at(config: &mut Config, addr: std::net::SocketAddr) {
    for route in &mut config.routes {
        route.upstreams = vec![addr];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config's named scopes are its custom scopes and its routes' tables (the ones a
    /// reload keeps metric series and sketches for), and nothing else.
    #[test]
    fn named_scopes_are_customs_and_route_tables() {
        let c = config::parse(
            "n.toml",
            "[scopes.rl_user]\nfrom = \"header:X-U\"\n[[routes]]\nname = \"rl_login\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\nlimits = { ip = { per_minute = 3 }, rl_user = { per_minute = 3 } }\n",
        )
        .unwrap();
        let mut names: Vec<&str> = named_scopes(&c).iter().map(|n| n.info().name).collect();
        names.sort_unstable();
        assert_eq!(names, ["rl_login.ip", "rl_login.rl_user", "rl_user"]);
    }
}
