//! Validated internal configuration: what the gateway runs on. Built only by
//! `config::parse`, so every value here has passed validation.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use super::limits::WindowSettings;
pub use super::regions::{Peer, Regions};
use crate::limiter::{OnFailure, Scope, ScopeLimits};

/// The whole validated `gateway.toml`.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (as given), for messages.
    pub source: String,
    /// `[server]`.
    pub server: Server,
    /// `[client_ip] trusted_proxies`.
    pub trusted_proxies: Vec<IpNet>,
    /// `[client_ip] ipv6_prefix`: the `ip` scope counts an IPv6 client by this network
    /// (64 by default; 128 counts every address).
    pub ipv6_prefix: u8,
    /// `[client_ip] header`: where trusted proxies name the client.
    pub client_ip_header: ClientIpHeader,
    /// `[store]`.
    pub store: Store,
    /// `[database] url`.
    pub database_url: Option<String>,
    /// `[database] events_retention_months` (default 12; 0 keeps every month): violation
    /// log partitions of months older than this are dropped.
    pub events_retention_months: u32,
    /// `[limits.ip]`.
    pub ip_limits: Option<Arc<ScopeLimits>>,
    /// `[limits.global]`.
    pub global_limits: Option<Arc<ScopeLimits>>,
    /// `[limits.auth]`: failed key lookups per client IP.
    pub auth_limits: Option<Arc<ScopeLimits>>,
    /// `[scopes.<name>]` by name (with `[limits.<name>]`).
    pub scopes: Vec<CustomScope>,
    /// `[auth]`: where API keys are read from.
    pub auth: KeySources,
    /// `[auth.jwt]`: Bearer JWTs as callers (None: a Bearer value is always an API key).
    pub jwt: Option<Jwt>,
    /// `[tiers.NAME]` by name.
    pub tiers: HashMap<String, Arc<Tier>>,
    /// `[[routes]]` in file order.
    pub routes: Vec<Route>,
    /// `[[keys]]`.
    pub keys: Vec<KeyEntry>,
    /// `[[tenants]]`: tenant id -> tier name.
    pub tenants: HashMap<String, String>,
    /// The tier of each `[[tenants]]` entry that sets its own `calendar_tz` or
    /// `billing_anchor_day`: its tier with its tenant windows on that calendar, made once
    /// here so the tenant-tier rule hands it out as it is.
    pub tenant_tiers: HashMap<String, Arc<Tier>>,
    /// `[[blocks]]`.
    pub blocks: Vec<BlockEntry>,
    /// `[rls]`.
    pub rls: Rls,
    /// `[tracing]` (None: off). Read at start: a change needs a restart.
    pub tracing: Option<Tracing>,
    /// `[regions]` (None: this gateway's region is the whole fleet). Read at start.
    pub regions: Option<Regions>,
    /// Warnings about values of the file, each at its `file:line:col`, found while
    /// validating (`warnings` returns them with the others). Not a setting.
    pub file_warnings: Vec<String>,
}

/// `[tracing]`: a span per proxied request, exported over OTLP/gRPC.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracing {
    /// `otlp_endpoint`: the collector's gRPC address, `http://host:port`.
    pub endpoint: String,
    /// `service_name`: the resource's `service.name` (default `throttle`).
    pub service_name: String,
    /// `sample_ratio`: the share of requests without a trusted parent that are traced
    /// (0 to 1, default 1); a trusted parent's `sampled` flag decides for its requests.
    pub sample_ratio: f64,
}

/// `[rls] config`: envoyproxy/ratelimit's YAML, loaded.
#[derive(Debug)]
pub struct RlsDescriptors {
    /// The file or directory, resolved against the config file's directory.
    pub path: std::path::PathBuf,
    /// What it holds.
    pub config: crate::descriptors::RlsConfig,
    /// Each domain's scope (`rls:<domain>`): its counters' Redis keys
    /// (`thr:{rls:<domain>:<counter>}:1m`) and the memory store's entries.
    pub scopes: HashMap<String, Scope>,
}

/// `[rls]`: how the rate-limit service (`[server] rls_listen`) decides.
#[derive(Debug, Clone)]
pub struct Rls {
    /// `config`: the envoyproxy/ratelimit descriptors, read when the config is. None: the
    /// built-in descriptor mapping.
    pub descriptors: Option<Arc<RlsDescriptors>>,
    /// `response_headers`: add `RateLimit-Limit`, `-Remaining`, `-Reset` of the
    /// descriptor nearest its limit to every answer.
    pub response_headers: bool,
    /// `on_failure` (default: `[store] on_failure`).
    pub on_failure: OnFailure,
    /// `admission` (default `auto`: leases and the over-limit cache on Redis).
    pub admission: crate::limiter::Admission,
}

/// `[server]`.
#[derive(Debug, Clone)]
pub struct Server {
    /// Proxy listener.
    pub listen: SocketAddr,
    /// Admin listener.
    pub admin_listen: SocketAddr,
    /// The Envoy rate-limit service (gRPC) listener; `None`: not served.
    pub rls_listen: Option<SocketAddr>,
    /// Instance id (defaults to hostname:pid).
    pub instance_id: String,
    /// Worker threads of the proxy service.
    pub threads: usize,
    /// SIGTERM drain budget.
    pub grace_period: Duration,
    /// Socket through which an old process hands its listeners to a new one.
    pub upgrade_sock: Option<String>,
    /// Deadline for reading a request's headers (`header_timeout_secs`, default 10 s).
    pub header_timeout: Duration,
    /// Keep-alive idle timeout of a client connection (`idle_timeout_secs`, default 60 s).
    pub idle_timeout: Duration,
    /// Deadline for a request's whole body, from its headers (`body_timeout_secs`,
    /// default 60 s); past it the request is answered 408 `request_timeout`.
    pub body_timeout: Duration,
    /// Cap on open proxy connections; `None`: derived at start from the open-file limit.
    pub max_connections: Option<u32>,
    /// Cap on open proxy connections from one client (IPv4 address, IPv6 /64); `None`:
    /// max(16, max_connections / 16). A trusted proxy's connections are not capped.
    pub max_connections_per_ip: Option<u32>,
    /// Cap on open admin connections from one client (default 8); beyond it only the
    /// probe reserve answers `/healthz` and `/readyz`.
    pub admin_max_connections_per_ip: u32,
    /// Cap on open rate-limit service connections from one client (default 8).
    pub rls_max_connections_per_ip: u32,
    /// Forward request headers whose names contain `_`; when false (the default, as
    /// nginx) they are dropped before forwarding.
    pub underscores_in_headers: bool,
    /// Whether `;` path parameters are accepted.
    pub path_parameters: PathParameters,
    /// `case_insensitive_paths`: routes are matched as a case-insensitive upstream (IIS,
    /// a Windows or macOS file system) would serve the path: ASCII case folded, trailing
    /// dots and spaces of each segment ignored. The forwarded path is unchanged.
    pub case_insensitive_paths: bool,
    /// `rate_limit_headers`: which rate-limit header family answers carry.
    pub rate_limit_headers: RateLimitHeaders,
    /// `tls`: serve TLS (HTTP/2 and HTTP/1.1 by ALPN) on `listen`; `None`: plain HTTP.
    pub tls: Option<Tls>,
    /// `check_token` (or `check_token_file`'s content): the bearer token `POST /v1/check`
    /// and the RLS require; `None`: both answer anyone who reaches them.
    pub check_token: Option<Secret>,
    /// The admin token: `$THROTTLE_ADMIN_TOKEN`, or `admin_token_file`'s content (never
    /// both), read at load (and each reload's check; the admin listener keeps the token
    /// it started with). At least 16 bytes and no shipped placeholder.
    pub admin_token: Option<Secret>,
    /// `access_log`: where the JSON access log goes (read at start; a change needs a
    /// restart).
    pub access_log: AccessLogTarget,
}

/// `[server] access_log`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AccessLogTarget {
    /// `"off"` (the default): no log, nothing built per request.
    #[default]
    Off,
    /// `"stdout"`.
    Stdout,
    /// A file (appended to), relative paths resolved against the config's directory.
    File(std::path::PathBuf),
}

pub use super::secret::Secret;

/// `[server] rate_limit_headers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateLimitHeaders {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (the default).
    #[default]
    XRateLimit,
    /// `RateLimit-Policy` and `RateLimit` of draft-ietf-httpapi-ratelimit-headers-11.
    Ietf,
    /// Both families.
    Both,
}

impl RateLimitHeaders {
    /// Whether the `X-RateLimit-*` family is written.
    pub fn x_ratelimit(self) -> bool {
        matches!(self, Self::XRateLimit | Self::Both)
    }

    /// Whether the IETF family is written.
    pub fn ietf(self) -> bool {
        matches!(self, Self::Ietf | Self::Both)
    }
}

/// `[client_ip] header`: the header trusted proxies append the client to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientIpHeader {
    /// `X-Forwarded-For` (the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=...`.
    Forwarded,
}

/// `[server] tls`: the certificate chain and key, read and checked when the config is
/// loaded (start, `throttle check`, every reload), so a reload serves the files as they
/// are then.
#[derive(Debug, Clone)]
pub struct Tls {
    /// The certificate chain file (PEM), as resolved against the config's directory.
    pub cert: std::path::PathBuf,
    /// The private key file (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
    /// The chain and the signing key, ready for rustls.
    pub certified: Arc<pingora::tls::sign::CertifiedKey>,
}

/// `[server] path_parameters`: what to do with `;` parameters in a request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathParameters {
    /// Refuse such a request (the default): servers disagree on what `/v1;x/../admin`
    /// means, so a prefix match on it proves little.
    #[default]
    Reject,
    /// Accept them.
    Allow,
}

/// Store backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded in-process store.
    Memory,
    /// Redis (single node, Sentinel or Cluster).
    Redis,
}

/// `[store]`.
#[derive(Debug, Clone)]
pub struct Store {
    /// Backend.
    pub backend: Backend,
    /// `url`.
    pub url: Option<String>,
    /// `cluster` seed URLs.
    pub cluster: Vec<String>,
    /// `sentinel`: sentinel URLs and the master name.
    pub sentinel: Option<(Vec<String>, String)>,
    /// Per-call deadline.
    pub timeout: Duration,
    /// Default failure policy.
    pub on_failure: OnFailure,
    /// Fixed fleet size for the local fallback.
    pub instances: Option<u32>,
    /// Prefix of every Redis key (`thr`).
    pub key_prefix: String,
    /// The longest lease of quota taken from Redis (`lease_ms`, default 1000; each
    /// window's is at most a quarter of its period).
    pub lease: Duration,
    /// How long a concurrency slot's entry lives in Redis without renewal
    /// (`concurrency_lease_secs`, default 30): slots of a gateway that died free
    /// themselves within it.
    pub concurrency_lease: Duration,
    /// Most window states the memory store holds (`max_states`, default 262,144; on
    /// Redis, the local fallback's): beyond it the least recently used is evicted.
    pub max_states: usize,
}

/// `[store] max_states` when unset: window states (one per scope and identity) the
/// memory store holds.
pub const DEFAULT_MAX_STATES: usize = 262_144;

/// `[tiers.NAME]`: the key and tenant limits of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Tier {
    /// Tier name.
    pub name: String,
    /// Limits per API key.
    pub key: Arc<ScopeLimits>,
    /// How the key windows are built (burst, algorithm, jitter): what a key's
    /// `custom_override` builds the windows it sets with.
    pub key_settings: WindowSettings,
    /// Limits per tenant.
    pub tenant: Arc<ScopeLimits>,
}

/// `auth` of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// A valid key is required (401 otherwise).
    Required,
    /// A key is used when present; an invalid one is still 401.
    Optional,
    /// Keys are not looked at.
    None,
}

/// `mode` of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Reject over-limit requests.
    Enforce,
    /// Count and send headers, never reject.
    Shadow,
}

/// `[[routes]]`.
#[derive(Debug, Clone)]
pub struct Route {
    /// Unique name (metrics label).
    pub name: Arc<str>,
    /// Lower-case host without port, if the route is host-specific.
    pub host: Option<String>,
    /// Path prefix, without a trailing slash (except `/`).
    pub path_prefix: String,
    /// Resolved upstream addresses.
    pub upstreams: Vec<SocketAddr>,
    /// Key requirement.
    pub auth: Auth,
    /// Units spent per request.
    pub cost: u32,
    /// Enforce or shadow.
    pub mode: Mode,
    /// Upstream connect timeout.
    pub connect_timeout: Duration,
    /// Upstream read timeout.
    pub read_timeout: Duration,
    /// `cost_header`: the response header carrying the request's true cost (lower-case);
    /// the reserved `cost` is settled against it.
    pub cost_header: Option<http::HeaderName>,
    /// `max_cost`: a reported usage (or bytes' worth) above it settles as it; a client
    /// that leaves before the usage header is settled at it (needs `cost_header` or
    /// `cost_from`; at least `cost`).
    pub max_cost: Option<u32>,
    /// `cost_from` (and `cost_unit_bytes`): the request settles to the bytes it moved.
    pub cost_from: Option<super::CostFrom>,
    /// `adaptive`: limits follow the upstream's health (see `adaptive`).
    pub adaptive: Option<crate::adaptive::Settings>,
    /// `health_check`: upstreams failing it are skipped until they pass again.
    pub health_check: Option<HealthCheck>,
    /// `upgrade`: forward protocol upgrades (WebSocket) on this route. Off by default: a
    /// 101 tunnel is admitted once however many messages it carries, so the gateway
    /// removes `Upgrade` and the upstream answers plain HTTP.
    pub upgrade: bool,
    /// `methods`: the only methods the route matches (None: every method).
    pub methods: Option<Arc<[http::Method]>>,
    /// `hide_credentials`: the API key (header, Bearer or query) is not forwarded.
    pub hide_credentials: bool,
    /// `identity_headers` (default true): the upstream gets `X-Throttle-Tenant` and
    /// `X-Throttle-Key-Id` of a known caller (the client's are removed either way).
    pub identity_headers: bool,
    /// `real_ip_header` (default true): the upstream gets `X-Real-IP: <client>`; false:
    /// none, a client's own removed (`X-Forwarded-For` always goes).
    pub real_ip_header: bool,
    /// `hide_client_headers` (default false; Kong's name): a response the route forwards
    /// carries no `X-RateLimit-*` / `RateLimit-*` (a 429 still carries them).
    pub hide_client_headers: bool,
    /// `limits`: the route's own scope tables, counted for its requests alone.
    pub limits: Vec<RouteLimit>,
}

/// One of a route's scope tables (`[routes.limits.ip]`).
#[derive(Debug, Clone)]
pub struct RouteLimit {
    /// The named scope (`login.ip`): its own counters.
    pub scope: Scope,
    /// What it counts.
    pub counts: Counts,
    /// Its windows.
    pub limits: Arc<ScopeLimits>,
}

/// What a route's scope table counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counts {
    /// The client address (as the ip scope does).
    Ip,
    /// The key id.
    Key,
    /// The tenant id.
    Tenant,
    /// The route's traffic as a whole.
    Global,
    /// The custom scope `Config::scopes[i]`'s identity.
    Custom(usize),
}

/// `[scopes.<name>]`: a scope on a request attribute.
#[derive(Debug, Clone)]
pub struct CustomScope {
    /// The named scope (`user`).
    pub scope: Scope,
    /// Where the identity is read.
    pub from: Attribute,
    /// Without the attribute: leave the scope out, or answer 400.
    pub missing: Missing,
    /// `[limits.<name>]`, for every request that carries the attribute.
    pub limits: Option<Arc<ScopeLimits>>,
}

/// Where a custom scope reads its identity (`from`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attribute {
    /// `header:<Name>` (lower case).
    Header(http::HeaderName),
    /// `query:<param>`.
    Query(String),
    /// `cookie:<name>`.
    Cookie(String),
    /// `path:<n>`: the n-th (1-based) segment of the normalized path.
    Path(usize),
    /// `jwt:<claim>`: a claim of the verified token.
    Jwt(String),
}

/// `missing` of a custom scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// The scope is left out for that request (never one shared bucket).
    Skip,
    /// 400 `missing_identity`.
    Reject,
}

// === impl Route ===

impl Route {
    /// Whether the route takes requests of `method`.
    pub fn takes(&self, method: &http::Method) -> bool {
        // HEAD is GET without the body (RFC 9110 §9.3.2): a route that takes GET takes
        // it, so a HEAD cannot fall through to another (cheaper) route's limits.
        self.methods.as_ref().is_none_or(|m| {
            m.contains(method) || (method == http::Method::HEAD && m.contains(&http::Method::GET))
        })
    }
}

/// Whether the gateway forwards a request with this method: any upper-case token but
/// `TRACE`/`TRACK` (an upstream would echo the request, credentials and all, to whoever
/// can read the response) and `CONNECT` (a tunnel is not an API request). Methods are
/// case-sensitive (RFC 9110 §9.1): a lower-case `get` is not `GET` to the gateway, but an
/// upstream that folds case would serve it as one, so it is refused (405). A route's
/// `methods` may name only these. A token over `MAX_METHOD_LEN` bytes is refused too (no
/// registered method is longer than 17): it never reaches routing, the upstream or the
/// access log whole.
pub fn method_forwarded(m: &http::Method) -> bool {
    let s = m.as_str();
    s.len() <= MAX_METHOD_LEN
        && !matches!(s, "TRACE" | "TRACK" | "CONNECT")
        && !s.bytes().any(|b| b.is_ascii_lowercase())
}

/// The longest method token forwarded (bytes); a longer one is 405 before routing.
pub(crate) const MAX_METHOD_LEN: usize = 32;

/// `[auth]`: where API keys are read from. `Authorization: Bearer <key>` always works.
#[derive(Debug, Clone)]
pub struct KeySources {
    /// `key_header` (default `x-api-key`), lower case.
    pub key_header: http::HeaderName,
    /// `key_query`: a query parameter that also carries the key.
    pub key_query: Option<Arc<str>>,
}

impl Default for KeySources {
    fn default() -> Self {
        KeySources {
            key_header: http::HeaderName::from_static("x-api-key"),
            key_query: None,
        }
    }
}

/// `[auth.jwt]`: how Bearer JWTs are verified and whose limits they spend.
#[derive(Debug, Clone)]
pub struct Jwt {
    /// What the verifier checks (the HS256 secret already read from the environment,
    /// `jwks_file` resolved against the config's directory).
    pub settings: crate::auth::JwtSettings,
    /// The tier of a token that carries no `tier_claim` value; validation makes sure a
    /// token always has one of the two (`tier_claim` or `default_tier` is set) and that
    /// this names a `[tiers.NAME]`.
    pub default_tier: Option<String>,
}

/// A route's active upstream health check: `GET path` on every upstream each
/// `interval`; anything but a 200 (or no answer within the route's timeouts, capped at
/// the interval) marks the upstream down until a check passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// Request path (origin form, starts with `/`).
    pub path: String,
    /// Time between checks (`interval_ms`, default 1000).
    pub interval: Duration,
}

/// `[[keys]]`: a key known from the file.
#[derive(Debug, Clone)]
pub struct KeyEntry {
    /// Key id (never the key).
    pub id: String,
    /// SHA-256 of the key.
    pub sha256: [u8; 32],
    /// Tenant id.
    pub tenant: String,
    /// Tier name.
    pub tier: String,
}

/// What a block matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockTarget {
    /// An address or CIDR.
    Ip(IpNet),
    /// A key id.
    Key(String),
    /// A tenant id.
    Tenant(String),
}

/// `[[blocks]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockEntry {
    /// What is blocked.
    pub target: BlockTarget,
    /// Why (for operators).
    pub reason: Option<String>,
    /// Unix ms after which the block no longer applies.
    pub expires_at_ms: Option<u64>,
}

// === impl Config ===

impl Config {
    /// The highest `cost` of any route (1 without routes): every window a key can be
    /// given must hold at least that much, or the key is locked out of that route.
    pub fn max_cost(&self) -> u32 {
        self.routes.iter().map(|r| r.cost).max().unwrap_or(1)
    }
}
