//! `gateway.toml`: parsed once (serde, unknown keys rejected) and validated into the
//! internal types of `model`. Every error names `file:line:col` (`ConfigError`).

mod block_values;
pub mod calendar;
mod cost_from;
mod error;
mod file;
mod limits;
mod model;
mod net;
mod regions;
mod secret;
mod text;
mod validate;
mod warnings;

use std::path::Path;

pub use block_values::{net_problem, text_problem, MIN_V4_PREFIX, MIN_V6_PREFIX};
pub use cost_from::{CostFrom, Counted};
pub use error::{line_col, ConfigError};
pub use limits::{
    burst_multiplier, check_cost, parse_algorithm, window_limit, LimitError, WindowSettings,
    BURST_RANGE, MAX_LIMIT, MAX_SLIDING_LOG,
};
pub use model::{
    method_forwarded, AccessLogTarget, Attribute, Auth, Backend, BlockEntry, BlockTarget,
    ClientIpHeader, Config, Counts, CustomScope, HealthCheck, Jwt, KeyEntry, KeySources, Missing,
    Mode, PathParameters, Peer, RateLimitHeaders, Regions, Rls, RlsDescriptors, Route, RouteLimit,
    Secret, Server, Store, Tier, Tls, Tracing, DEFAULT_MAX_STATES,
};
pub use net::{parse_net, parse_net_as_written};
pub use text::{cap, cap_in_place};
pub use validate::{format_rfc3339, rfc3339_ms};

/// The config shipped with Throttle (the repository's `gateway.toml`), used by
/// `throttle demo` when no file is found.
pub const SHIPPED: &str = include_str!("../../gateway.toml");

/// Reads and validates `path`.
///
/// # Errors
/// `ConfigError` naming the file, and line and column when the error has a position.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let name = path.display().to_string();
    let source = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::file(&name, format!("cannot read: {e}")))?;
    parse(&name, &source)
}

/// The environment variable `run` (and every reload) takes the database URL from, over
/// `[database] url`: a password need not sit in the file.
pub const DATABASE_URL_ENV: &str = "THROTTLE_DATABASE_URL";

/// Applies the settings the gateway's environment overrides: `THROTTLE_DATABASE_URL`
/// (when set and not empty) is the database URL.
pub fn apply_env(config: &mut Config) {
    if let Ok(url) = std::env::var(DATABASE_URL_ENV) {
        if !url.is_empty() {
            config.database_url = Some(url);
        }
    }
}

/// Validates `source`, naming it `name` in errors.
///
/// # Errors
/// `ConfigError` at the position of the first problem found.
pub fn parse(name: &str, source: &str) -> Result<Config, ConfigError> {
    parse_env(name, source, &|var| std::env::var(var))
}

/// As `parse`, reading environment variables through `env` (tests elsewhere in the crate).
#[cfg(test)]
pub(crate) fn parse_with(
    name: &str,
    source: &str,
    env: &dyn Fn(&str) -> Result<String, std::env::VarError>,
) -> Result<Config, ConfigError> {
    parse_env(name, source, env)
}

/// As `parse`, reading `"${VAR}"` references through `env`.
fn parse_env(
    name: &str,
    source: &str,
    env: validate::EnvLookup<'_>,
) -> Result<Config, ConfigError> {
    let raw: file::File = toml::from_str(source)
        .map_err(|e| ConfigError::at(name, source, e.span(), e.message().trim_end()))?;
    validate::validate(name, source, raw, env)
}

#[cfg(test)]
mod tests;
