//! From the serde mirror (`file`) to the validated model: one file per section (`server`
//! with `tokens` for its tokens, `store`, `tiers` for `[limits]` and `[tiers]`, `keys` for
//! keys and blocks, `scopes` for custom scopes and route limits, `routes`, `auth` and
//! `jwt` for `[auth]`, `client_ip`, `rls`); `validate` calls them in the order their
//! errors are reported.

use std::collections::{HashMap, HashSet};
use std::fmt::Display;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::ops::{Range, RangeInclusive};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use sha2::{Digest, Sha256};
use toml::Spanned;

use crate::config::error::ConfigError;
use crate::config::file::*;
use crate::config::limits::{burst_multiplier, WindowSettings};
use crate::config::model::*;
use crate::limiter::{Admission, Algorithm, BanRule, OnFailure, ScopeLimits, Window, WindowLimit};

mod auth;
mod calendar;
mod client_ip;
mod jwt;
mod keys;
mod regions;
mod rls;
mod routes;
mod scopes;
mod server;
mod store;
mod tiers;
mod tokens;

use self::auth::*;
use self::calendar::*;
use self::client_ip::*;
use self::jwt::*;
use self::keys::*;
pub use self::keys::{format_rfc3339, rfc3339_ms};
use self::regions::*;
use self::rls::*;
use self::routes::*;
use self::scopes::*;
use self::server::*;
use self::store::*;
use self::tiers::*;
use self::tokens::*;

/// Bounds that keep a typo (an extra zero, ms for s) from taking the gateway down.
const MAX_THREADS: usize = 256;
const MAX_CONNECTIONS: u32 = 10_000_000;
/// An hour: a longer upstream timeout or drain is a typo, not a plan.
const MAX_UPSTREAM_TIMEOUT_MS: u64 = 3_600_000;
/// The shortest upstream health-check interval: faster probes are load, not safety.
const MIN_HEALTH_INTERVAL_MS: u64 = 100;
const MAX_STORE_TIMEOUT_MS: u64 = 60_000;
/// The longest `[store] lease_ms` accepted.
const MAX_LEASE_MS: u64 = 60_000;
const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);
const DEFAULT_ADMIN_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9090);
const NO_ROUTES: &str =
    "no [[routes]]: every proxied request would get 404 (is the file truncated?)";

/// Reads an environment variable (`std::env::var`, or a table in tests).
pub(super) type EnvLookup<'a> = &'a dyn Fn(&str) -> Result<String, std::env::VarError>;

struct Ctx<'a> {
    name: &'a str,
    source: &'a str,
    env: EnvLookup<'a>,
    /// How many regions share a `fleet = "regions"` limit (None: no `[regions]`).
    regions: Option<usize>,
    /// Warnings placed at a value, in the order found (`Config::file_warnings`).
    warnings: std::cell::RefCell<Vec<String>>,
}

impl<'a> Ctx<'a> {
    fn new(name: &'a str, source: &'a str, env: EnvLookup<'a>) -> Self {
        Self {
            name,
            source,
            env,
            regions: None,
            warnings: Default::default(),
        }
    }

    /// The same, with `regions` to check the tables' `fleet` against.
    fn with_regions(self, regions: Option<&Regions>) -> Self {
        Self {
            regions: regions.map(Regions::count),
            ..self
        }
    }

    fn err(&self, span: Range<usize>, msg: impl Into<String>) -> ConfigError {
        ConfigError::at(self.name, self.source, Some(span), msg)
    }

    /// A warning at `span`: `file:line:col: warning: msg`.
    fn warn(&self, span: Range<usize>, msg: &str) {
        let at = ConfigError::at(
            self.name,
            self.source,
            Some(span),
            format!("warning: {msg}"),
        );
        self.warnings.borrow_mut().push(at.to_string());
    }
}

pub(super) fn validate(
    name: &str,
    source: &str,
    raw: File,
    env: EnvLookup<'_>,
) -> Result<Config, ConfigError> {
    let cx = Ctx::new(name, source, env);
    let server = server(&cx, &raw.server)?;
    let store = store(&cx, &raw.store)?;
    let regions = regions(&cx, raw.regions.as_ref(), &store)?;
    let cx = cx.with_regions(regions.as_ref());
    let Limits {
        ip_limits,
        global_limits,
        auth_limits,
        tiers,
    } = limits(&cx, &raw, store.on_failure)?;
    let keys = keys(&cx, &raw.keys, &tiers)?;
    let (tenants, tenant_tiers) = tenants(&cx, &raw.tenants, &tiers)?;
    let scopes = custom_scopes(&cx, &raw, store.on_failure)?;
    let mut routes = routes(&cx, &raw.routes)?;
    let builtin = builtin_scopes(&ip_limits, &global_limits, &tiers);
    let failure = store.on_failure;
    route_limits(&cx, &raw.routes, &mut routes, &scopes, builtin, failure)?;
    let auth = key_sources(&cx, &raw.auth)?;
    credential_scopes(&cx, &raw, &scopes, &auth)?;
    let mut jwt = match &raw.auth.jwt {
        Some(j) => Some(jwt(&cx, j, &tiers)?),
        None => None,
    };
    jwt_scope_claims(&cx, &raw, &scopes, jwt.as_mut())?;
    let (events_retention_months, database_url) = database(&cx, raw.database.as_ref())?;
    check_costs(
        &cx,
        &raw.routes,
        &routes,
        [&ip_limits, &global_limits],
        &tiers,
    )?;
    let (trusted_proxies, ipv6_prefix, client_ip_header) = client_ip(&cx, &raw.client_ip)?;
    let blocks = blocks(&cx, &raw.blocks)?;
    let rls = rls(&cx, raw.rls.as_ref(), &store)?;
    let tracing = match &raw.tracing {
        Some(t) => tracing_section(&cx, t)?,
        None => None,
    };
    // Last, so that a more specific error in a half-written file is reported first.
    if routes.is_empty() {
        return Err(cx.err(0..0, NO_ROUTES));
    }
    Ok(Config {
        source: name.to_string(),
        server,
        trusted_proxies,
        ipv6_prefix,
        client_ip_header,
        store,
        events_retention_months,
        database_url,
        ip_limits,
        global_limits,
        auth_limits,
        scopes,
        auth,
        jwt,
        tiers,
        routes,
        keys,
        tenants,
        tenant_tiers,
        blocks,
        rls,
        tracing,
        regions,
        file_warnings: cx.warnings.into_inner(),
    })
}

/// The built-in scopes a request may meet, and how many of them have `concurrent` (ip,
/// and a tier's key and tenant).
fn builtin_scopes(
    ip_limits: &Option<Arc<ScopeLimits>>,
    global_limits: &Option<Arc<ScopeLimits>>,
    tiers: &HashMap<String, Arc<Tier>>,
) -> (usize, usize) {
    let builtin = usize::from(ip_limits.is_some()) + 2 + usize::from(global_limits.is_some());
    let tier_slots = |f: fn(&Tier) -> bool| usize::from(tiers.values().any(|t| f(t)));
    let slots = usize::from(ip_limits.as_ref().is_some_and(|l| l.concurrent.is_some()))
        + tier_slots(|t| t.key.concurrent.is_some())
        + tier_slots(|t| t.tenant.concurrent.is_some());
    (builtin, slots)
}

/// `[database]`: the events' retention in months (default 12) and the URL.
fn database(
    cx: &Ctx<'_>,
    raw: Option<&DatabaseFile>,
) -> Result<(u32, Option<String>), ConfigError> {
    let retention = raw.and_then(|d| d.events_retention_months.as_ref());
    let months = bounded(cx, "events_retention_months", retention, 0..=1200)?.unwrap_or(12);
    let url = match raw {
        Some(d) => Some(env_value(cx, "[database] url", &d.url)?),
        None => None,
    };
    Ok((months, url))
}

/// `v` when within `range`, else an error at its value naming `key`.
fn bounded<T>(
    cx: &Ctx<'_>,
    key: &str,
    v: Option<&Spanned<T>>,
    range: RangeInclusive<T>,
) -> Result<Option<T>, ConfigError>
where
    T: Copy + PartialOrd + Display,
{
    let Some(v) = v else { return Ok(None) };
    let n = *v.get_ref();
    if n < *range.start() {
        let msg = format!("{key} must be at least {}", range.start());
        return Err(cx.err(v.span(), msg));
    }
    if n > *range.end() {
        let msg = format!("{key} = {n} is above the maximum of {}", range.end());
        return Err(cx.err(v.span(), msg));
    }
    Ok(Some(n))
}
