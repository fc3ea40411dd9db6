//! Hot reload: re-read `gateway.toml` (SIGHUP or `POST /v1/reload`) and swap the runtime.
//!
//! An invalid file is rejected with exactly the errors of `throttle check` and the old
//! config keeps serving. A valid one applies to every request that starts after the swap;
//! requests in flight finish on the runtime they started with, and no connection is
//! touched. Listeners, the store backend, the database URL and thread counts are fixed at
//! start: a change to them is reported and needs a restart (or a zero-downtime upgrade).

use std::path::PathBuf;

use crate::config::{self, Config, ConfigError};
use crate::state::{Runtime, Shared};

/// What a successful reload changed.
#[derive(Debug, Clone)]
pub struct Reloaded {
    /// The file re-read.
    pub source: String,
    /// Settings that changed but only take effect after a restart.
    pub needs_restart: Vec<&'static str>,
}

/// Re-reads the config file of the running gateway and swaps it in.
///
/// # Errors
/// The file's `ConfigError` (`FILE:LINE:COL: message`); the old config keeps serving.
pub async fn reload(shared: &Shared) -> Result<Reloaded, ConfigError> {
    let old = shared.runtime();
    let source = old.config.source.clone();
    let path = PathBuf::from(&source);
    // File IO and upstream name resolution: off the async workers.
    let mut loaded = tokio::task::spawn_blocking(move || config::load(&path))
        .await
        .map_err(|e| ConfigError::file(&source, format!("reload task failed: {e}")))??;
    if let Some(addr) = shared.upstream_override {
        point_routes_at(&mut loaded, addr); // `throttle demo` keeps its in-process upstream
    }
    let needs_restart = fixed_at_start(&old.config, &loaded);
    let runtime = Runtime::from_config(loaded)
        .map_err(|e| ConfigError::file(&source, format!("upstreams: {e}")))?;
    shared.swap_runtime(runtime);
    if let Some(pool) = shared.db_pool() {
        // Database keys resolve their tiers through the config: rebuild them now.
        match crate::db::snapshot::load(shared, &pool).await {
            Ok(d) => shared.swap_dynamic(d),
            Err(e) => {
                tracing::warn!(error = %e, "snapshot reload after a config reload failed; the next refresh retries")
            }
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

/// Points every route at `addr` (`throttle demo`'s in-process upstream).
pub fn point_routes_at(config: &mut Config, addr: std::net::SocketAddr) {
    for route in &mut config.routes {
        route.upstreams = vec![addr];
    }
}

fn fixed_at_start(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut out = Vec::new();
    if old.server.listen != new.server.listen {
        out.push("server.listen");
    }
    if old.server.admin_listen != new.server.admin_listen {
        out.push("server.admin_listen");
    }
    if old.server.threads != new.server.threads {
        out.push("server.threads");
    }
    if old.store.backend != new.store.backend
        || old.store.url != new.store.url
        || old.store.cluster != new.store.cluster
    {
        out.push("store");
    }
    if old.database_url != new.database_url {
        out.push("database.url");
    }
    out
}
