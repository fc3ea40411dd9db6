//! The serde mirror of `gateway.toml`: user-facing and stable. Unknown keys are errors.
//! Values that are validated later carry their span (`Spanned`) so errors can name
//! `file:line:col`.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    #[serde(default)]
    pub(crate) server: ServerFile,
    #[serde(default)]
    pub(crate) client_ip: ClientIpFile,
    #[serde(default)]
    pub(crate) store: StoreFile,
    pub(crate) database: Option<DatabaseFile>,
    #[serde(default)]
    pub(crate) limits: LimitsFile,
    #[serde(default)]
    pub(crate) scopes: BTreeMap<String, Spanned<CustomScopeFile>>,
    #[serde(default)]
    pub(crate) auth: AuthSectionFile,
    #[serde(default)]
    pub(crate) tiers: BTreeMap<String, Spanned<TierFile>>,
    #[serde(default)]
    pub(crate) routes: Vec<Spanned<RouteFile>>,
    #[serde(default)]
    pub(crate) keys: Vec<Spanned<KeyFile>>,
    #[serde(default)]
    pub(crate) tenants: Vec<TenantFile>,
    #[serde(default)]
    pub(crate) blocks: Vec<BlockFile>,
    pub(crate) rls: Option<RlsFile>,
    pub(crate) tracing: Option<TracingFile>,
    pub(crate) regions: Option<Spanned<RegionsFile>>,
}

/// `[regions]`: this gateway's region and its peers' Redis (issue 37).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegionsFile {
    pub(crate) name: Spanned<String>,
    /// Region name -> Redis URL (`"${VAR}"` expanded as `[store] url` is).
    pub(crate) peers: Spanned<BTreeMap<String, Spanned<String>>>,
    pub(crate) sync_ms: Option<Spanned<u64>>,
    pub(crate) partition_secs: Option<Spanned<u64>>,
    /// The first contract's budget: accepted, unused (the allotments + grants rule has
    /// none), warned about.
    pub(crate) unsynced: Option<Spanned<f64>>,
}

/// `fleet = "regions" | "home" | "local"` on a scope table or a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FleetFile {
    Local,
    Regions,
    Home,
}

/// `[tracing]`: OTLP export of a span per proxied request.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TracingFile {
    pub(crate) otlp_endpoint: Option<Spanned<String>>,
    pub(crate) service_name: Option<Spanned<String>>,
    pub(crate) sample_ratio: Option<Spanned<f64>>,
}

/// `[rls]`: the rate-limit service's envoyproxy/ratelimit descriptors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RlsFile {
    pub(crate) config: Option<Spanned<String>>,
    pub(crate) response_headers: Option<bool>,
    pub(crate) on_failure: Option<OnFailureFile>,
    pub(crate) admission: Option<AdmissionFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServerFile {
    pub(crate) listen: Option<Spanned<String>>,
    pub(crate) admin_listen: Option<Spanned<String>>,
    pub(crate) rls_listen: Option<Spanned<String>>,
    pub(crate) instance_id: Option<String>,
    pub(crate) threads: Option<Spanned<usize>>,
    pub(crate) grace_period_secs: Option<Spanned<u64>>,
    pub(crate) upgrade_sock: Option<String>,
    pub(crate) header_timeout_secs: Option<Spanned<u64>>,
    pub(crate) idle_timeout_secs: Option<Spanned<u64>>,
    pub(crate) body_timeout_secs: Option<Spanned<u64>>,
    pub(crate) max_connections: Option<Spanned<u32>>,
    pub(crate) max_connections_per_ip: Option<Spanned<u32>>,
    pub(crate) admin_max_connections_per_ip: Option<Spanned<u32>>,
    pub(crate) rls_max_connections_per_ip: Option<Spanned<u32>>,
    pub(crate) underscores_in_headers: Option<bool>,
    pub(crate) path_parameters: Option<PathParametersFile>,
    pub(crate) case_insensitive_paths: Option<bool>,
    pub(crate) rate_limit_headers: Option<RateLimitHeadersFile>,
    pub(crate) tls: Option<Spanned<TlsFile>>,
    /// `check_token = "${VAR}"`: the bearer token `POST /v1/check` and the RLS require.
    pub(crate) check_token: Option<Spanned<String>>,
    /// `check_token_file`: `check_token` read from a file (a mounted secret).
    pub(crate) check_token_file: Option<Spanned<String>>,
    /// `admin_token_file`: the admin token's file (a mounted secret).
    pub(crate) admin_token_file: Option<Spanned<String>>,
    /// `access_log = "stdout" | "off" | "<path>"`.
    pub(crate) access_log: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) enum RateLimitHeadersFile {
    #[serde(rename = "x-ratelimit")]
    XRateLimit,
    #[serde(rename = "ietf")]
    Ietf,
    #[serde(rename = "both")]
    Both,
}

/// `[server] tls = { cert = "cert.pem", key = "key.pem" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsFile {
    pub(crate) cert: String,
    pub(crate) key: String,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PathParametersFile {
    Reject,
    Allow,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClientIpFile {
    #[serde(default)]
    pub(crate) trusted_proxies: Vec<Spanned<String>>,
    pub(crate) ipv6_prefix: Option<Spanned<u8>>,
    pub(crate) header: Option<ForwardedHeaderFile>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) enum ForwardedHeaderFile {
    #[serde(rename = "x-forwarded-for")]
    XForwardedFor,
    #[serde(rename = "forwarded")]
    Forwarded,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StoreFile {
    #[serde(default)]
    pub(crate) backend: Option<Spanned<BackendFile>>,
    pub(crate) url: Option<Spanned<String>>,
    pub(crate) cluster: Option<Vec<Spanned<String>>>,
    pub(crate) sentinel: Option<SentinelFile>,
    pub(crate) timeout_ms: Option<Spanned<u64>>,
    pub(crate) on_failure: Option<OnFailureFile>,
    pub(crate) instances: Option<Spanned<u32>>,
    pub(crate) key_prefix: Option<String>,
    pub(crate) lease_ms: Option<Spanned<u64>>,
    pub(crate) concurrency_lease_secs: Option<Spanned<u64>>,
    pub(crate) max_states: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SentinelFile {
    pub(crate) urls: Vec<Spanned<String>>,
    pub(crate) master: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BackendFile {
    Memory,
    Redis,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnFailureFile {
    Open,
    Closed,
    Local,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DatabaseFile {
    pub(crate) url: Spanned<String>,
    pub(crate) events_retention_months: Option<Spanned<u32>>,
}

/// `[limits.<scope>]`: `ip`, `global`, `auth` or a custom scope's name (checked by
/// `validate`, which names the table of an unknown one).
#[derive(Debug, Default, Deserialize)]
#[serde(transparent)]
pub(crate) struct LimitsFile(pub(crate) BTreeMap<String, Spanned<ScopeFile>>);

impl LimitsFile {
    /// The table of `scope`, if given.
    pub(crate) fn table(&self, scope: &str) -> Option<&ScopeFile> {
        self.0.get(scope).map(Spanned::get_ref)
    }
}

/// `[scopes.<name>]`: a custom scope on a request attribute.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CustomScopeFile {
    /// `header:<Name>`, `query:<param>`, `cookie:<name>`, `path:<n>` or `jwt:<claim>`.
    pub(crate) from: Spanned<String>,
    pub(crate) missing: Option<MissingFile>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum MissingFile {
    Skip,
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AlgorithmFile {
    TokenBucket,
    SlidingWindow,
    FixedWindow,
    SlidingLog,
    LeakyBucket,
}

/// A scope table: `[limits.ip]`, `[limits.global]`, or a tier's `key` / `tenant`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScopeFile {
    pub(crate) per_second: Option<Spanned<u64>>,
    pub(crate) per_minute: Option<Spanned<u64>>,
    pub(crate) per_hour: Option<Spanned<u64>>,
    pub(crate) per_day: Option<Spanned<u64>>,
    pub(crate) per_week: Option<Spanned<u64>>,
    pub(crate) per_month: Option<Spanned<u64>>,
    pub(crate) algorithm: Option<Spanned<AlgorithmFile>>,
    pub(crate) burst_multiplier: Option<Spanned<f64>>,
    pub(crate) on_failure: Option<OnFailureFile>,
    pub(crate) reset_jitter_secs: Option<u64>,
    pub(crate) message: Option<String>,
    pub(crate) admission: Option<AdmissionFile>,
    pub(crate) concurrent: Option<Spanned<u64>>,
    pub(crate) ban: Option<Spanned<BanFile>>,
    pub(crate) count_on: Option<Spanned<Vec<String>>>,
    /// `calendar_tz = "Europe/Berlin"`: day, week and month windows start at local midnight.
    pub(crate) calendar_tz: Option<Spanned<String>>,
    /// `billing_anchor_day = 1..28`: the day of the month a month window starts on.
    pub(crate) billing_anchor_day: Option<Spanned<i64>>,
    /// `fleet = "regions" | "home"`: who shares the table's windows (needs `[regions]`).
    pub(crate) fleet: Option<Spanned<FleetFile>>,
}

impl ScopeFile {
    /// The window fields, in `Window::TABLE`'s order.
    pub(crate) fn window_fields(&self) -> [&Option<Spanned<u64>>; 6] {
        [
            &self.per_second,
            &self.per_minute,
            &self.per_hour,
            &self.per_day,
            &self.per_week,
            &self.per_month,
        ]
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BanFile {
    pub(crate) after: Spanned<u64>,
    pub(crate) within_secs: Spanned<u64>,
    pub(crate) for_secs: Spanned<u64>,
    /// Whether rejections answered by `/v1/check` and the RLS count towards a ban.
    pub(crate) from_check: Option<bool>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AdmissionFile {
    Auto,
    Exact,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TierFile {
    pub(crate) message: Option<String>,
    pub(crate) burst_multiplier: Option<Spanned<f64>>,
    pub(crate) key: Option<Spanned<ScopeFile>>,
    pub(crate) tenant: Option<Spanned<ScopeFile>>,
    /// The default `calendar_tz` of the tier's `key` and `tenant` tables.
    pub(crate) calendar_tz: Option<Spanned<String>>,
    /// The default `billing_anchor_day` of the tier's `key` and `tenant` tables.
    pub(crate) billing_anchor_day: Option<Spanned<i64>>,
    /// The default `fleet` of the tier's `key` and `tenant` tables.
    pub(crate) fleet: Option<Spanned<FleetFile>>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AuthFile {
    #[default]
    Required,
    Optional,
    None,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ModeFile {
    #[default]
    Enforce,
    Shadow,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RouteFile {
    pub(crate) name: Spanned<String>,
    pub(crate) path_prefix: Spanned<String>,
    pub(crate) host: Option<String>,
    pub(crate) upstreams: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    pub(crate) auth: AuthFile,
    pub(crate) cost: Option<Spanned<u32>>,
    #[serde(default)]
    pub(crate) mode: ModeFile,
    pub(crate) connect_timeout_ms: Option<Spanned<u64>>,
    pub(crate) read_timeout_ms: Option<Spanned<u64>>,
    pub(crate) cost_header: Option<Spanned<String>>,
    pub(crate) max_cost: Option<Spanned<u32>>,
    pub(crate) cost_from: Option<Spanned<String>>,
    pub(crate) cost_unit_bytes: Option<Spanned<u32>>,
    pub(crate) adaptive: Option<Spanned<AdaptiveFile>>,
    pub(crate) health_check: Option<Spanned<HealthCheckFile>>,
    pub(crate) upgrade: Option<bool>,
    /// `methods = ["GET", "POST"]`: the route matches only these methods.
    pub(crate) methods: Option<Spanned<Vec<Spanned<String>>>>,
    /// `hide_credentials = true`: the API key (header or query) is not forwarded.
    pub(crate) hide_credentials: Option<bool>,
    /// `identity_headers = false`: no `X-Throttle-Tenant` / `X-Throttle-Key-Id` upstream.
    pub(crate) identity_headers: Option<bool>,
    /// `real_ip_header = false`: no `X-Real-IP` upstream.
    pub(crate) real_ip_header: Option<bool>,
    /// `hide_client_headers = true`: no rate-limit headers on the route's passed answers.
    pub(crate) hide_client_headers: Option<bool>,
    /// `limits`: the route's own scope tables (`ip`, `key`, `tenant`, `global`, custom).
    #[serde(default)]
    pub(crate) limits: LimitsFile,
}

/// `[auth]`: where API keys are read from.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuthSectionFile {
    /// The API-key header (default `X-API-Key`); `Authorization: Bearer` always works.
    pub(crate) key_header: Option<Spanned<String>>,
    /// A query parameter that also carries the key (stripped from the forwarded URI).
    pub(crate) key_query: Option<Spanned<String>>,
    /// `[auth.jwt]`: Bearer JWTs as callers.
    pub(crate) jwt: Option<Spanned<JwtFile>>,
}

/// `[auth.jwt]`: how Bearer JWTs are verified and what their claims mean.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JwtFile {
    pub(crate) algorithms: Spanned<Vec<Spanned<String>>>,
    pub(crate) jwks_file: Option<Spanned<String>>,
    pub(crate) jwks_url: Option<Spanned<String>>,
    pub(crate) jwks_refresh_secs: Option<Spanned<u64>>,
    /// The name of the environment variable holding the HS256 secret.
    pub(crate) hs256_secret_env: Option<Spanned<String>>,
    pub(crate) issuer: Option<Spanned<String>>,
    pub(crate) audience: Option<Spanned<String>>,
    pub(crate) leeway_secs: Option<Spanned<u64>>,
    pub(crate) key_claim: Option<Spanned<String>>,
    pub(crate) tenant_claim: Option<Spanned<String>>,
    pub(crate) tier_claim: Option<Spanned<String>>,
    pub(crate) default_tier: Option<Spanned<String>>,
}

/// A route's `adaptive = { target_p99_ms, max_error_rate, min_factor, min_clients }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdaptiveFile {
    pub(crate) target_p99_ms: Option<Spanned<u64>>,
    pub(crate) max_error_rate: Option<Spanned<f64>>,
    pub(crate) min_factor: Option<Spanned<f64>>,
    pub(crate) min_clients: Option<Spanned<u32>>,
}

/// A route's `health_check = { path = "/healthz", interval_ms = 1000 }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HealthCheckFile {
    pub(crate) path: Spanned<String>,
    pub(crate) interval_ms: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KeyFile {
    pub(crate) id: Spanned<String>,
    pub(crate) key: Option<Spanned<String>>,
    pub(crate) key_sha256: Option<Spanned<String>>,
    pub(crate) tenant: String,
    pub(crate) tier: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantFile {
    pub(crate) id: String,
    pub(crate) tier: Spanned<String>,
    /// This tenant's own `calendar_tz` for its tenant windows (over its tier's).
    pub(crate) calendar_tz: Option<Spanned<String>>,
    /// This tenant's own `billing_anchor_day` for its tenant windows (over its tier's).
    pub(crate) billing_anchor_day: Option<Spanned<i64>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BlockScopeFile {
    Ip,
    Key,
    Tenant,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BlockFile {
    pub(crate) scope: BlockScopeFile,
    pub(crate) value: Spanned<String>,
    pub(crate) reason: Option<String>,
    pub(crate) expires_at: Option<Spanned<toml::value::Datetime>>,
    /// Accept an IP block wider than /8 (IPv4) or /32 (IPv6).
    pub(crate) force: Option<bool>,
}
