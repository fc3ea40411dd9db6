//! From the serde mirror (`file`) to the validated model: one function per section.

use std::collections::{HashMap, HashSet};
use std::fmt::Display;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::ops::{Range, RangeInclusive};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use sha2::{Digest, Sha256};
use toml::Spanned;

use super::error::ConfigError;
use super::file::*;
use super::limits::{burst_multiplier, WindowSettings};
use super::model::*;
use crate::limiter::{Admission, Algorithm, BanRule, OnFailure, ScopeLimits, Window};

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
}

impl Ctx<'_> {
    fn err(&self, span: Range<usize>, msg: impl Into<String>) -> ConfigError {
        ConfigError::at(self.name, self.source, Some(span), msg)
    }
}

pub(super) fn validate(
    name: &str,
    source: &str,
    raw: File,
    env: EnvLookup<'_>,
) -> Result<Config, ConfigError> {
    let cx = Ctx { name, source, env };
    let server = server(&cx, &raw.server)?;
    let store = store(&cx, &raw.store)?;
    let ip_limits = match &raw.limits.ip {
        Some(s) => Some(Arc::new(scope(&cx, s, None, None, store.on_failure)?)),
        None => None,
    };
    if let Some(b) = raw.limits.global.as_ref().and_then(|g| g.ban.as_ref()) {
        let msg = "ban applies to [limits.ip], [limits.auth] and tier key / tenant tables, not [limits.global] (it would block everyone)";
        return Err(cx.err(b.span(), msg));
    }
    let global_limits = match &raw.limits.global {
        Some(s) => Some(Arc::new(rate_only(
            &cx,
            s,
            "[limits.global]",
            store.on_failure,
        )?)),
        None => None,
    };
    let auth_limits = match &raw.limits.auth {
        Some(s) => Some(Arc::new(rate_only(
            &cx,
            s,
            "[limits.auth]",
            store.on_failure,
        )?)),
        None => None,
    };
    let mut tiers = HashMap::new();
    for (tier_name, t) in &raw.tiers {
        tiers.insert(
            tier_name.clone(),
            Arc::new(tier(&cx, tier_name, t.get_ref(), store.on_failure)?),
        );
    }
    let keys = keys(&cx, &raw.keys, &tiers)?;
    let mut tenants = HashMap::new();
    for t in &raw.tenants {
        known_tier(&cx, &t.tier, &tiers)?;
        tenants.insert(t.id.clone(), t.tier.get_ref().clone());
    }
    let routes = routes(&cx, &raw.routes)?;
    let retention = raw
        .database
        .as_ref()
        .and_then(|d| d.events_retention_months.as_ref());
    let events_retention_months =
        bounded(&cx, "events_retention_months", retention, 0..=1200)?.unwrap_or(12);
    check_costs(
        &cx,
        &raw.routes,
        &routes,
        [&ip_limits, &global_limits],
        &tiers,
    )?;
    let trusted_proxies = trusted(&cx, &raw.client_ip.trusted_proxies)?;
    let ipv6_prefix = bounded(
        &cx,
        "ipv6_prefix",
        raw.client_ip.ipv6_prefix.as_ref(),
        1..=128,
    )?
    .unwrap_or(64);
    let client_ip_header = match raw.client_ip.header {
        None | Some(ForwardedHeaderFile::XForwardedFor) => ClientIpHeader::XForwardedFor,
        Some(ForwardedHeaderFile::Forwarded) => ClientIpHeader::Forwarded,
    };
    let blocks = blocks(&cx, &raw.blocks)?;
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
        database_url: raw.database.map(|d| d.url),
        ip_limits,
        global_limits,
        auth_limits,
        tiers,
        routes,
        keys,
        tenants,
        blocks,
    })
}

fn server(cx: &Ctx<'_>, s: &ServerFile) -> Result<Server, ConfigError> {
    let (listen, admin_listen) = listeners(cx, s)?;
    let rls_listen = rls_listener(cx, s, listen, admin_listen)?;
    let threads = match &s.threads {
        Some(t) if *t.get_ref() == 0 => return Err(cx.err(t.span(), "threads must be at least 1")),
        Some(t) if *t.get_ref() > MAX_THREADS => {
            let msg = format!("threads = {} is absurd: at most {MAX_THREADS}", t.get_ref());
            return Err(cx.err(t.span(), msg));
        }
        Some(t) => *t.get_ref(),
        None => 2,
    };
    let secs = |key, v: &Option<Spanned<u64>>, range, default| {
        let n = bounded(cx, key, v.as_ref(), range)?;
        Ok::<_, ConfigError>(Duration::from_secs(n.unwrap_or(default)))
    };
    let conns = |key, v: &Option<Spanned<u32>>, max| bounded(cx, key, v.as_ref(), 1..=max);
    Ok(Server {
        listen,
        admin_listen,
        rls_listen,
        instance_id: s.instance_id.clone().unwrap_or_else(default_instance_id),
        threads,
        grace_period: secs("grace_period_secs", &s.grace_period_secs, 0..=3600, 5)?,
        upgrade_sock: s.upgrade_sock.clone(),
        header_timeout: secs("header_timeout_secs", &s.header_timeout_secs, 1..=300, 10)?,
        idle_timeout: secs("idle_timeout_secs", &s.idle_timeout_secs, 1..=3600, 60)?,
        body_timeout: secs("body_timeout_secs", &s.body_timeout_secs, 1..=3600, 60)?,
        max_connections: conns("max_connections", &s.max_connections, MAX_CONNECTIONS)?,
        max_connections_per_ip: conns(
            "max_connections_per_ip",
            &s.max_connections_per_ip,
            u32::MAX,
        )?,
        underscores_in_headers: s.underscores_in_headers.unwrap_or(false),
        path_parameters: match s.path_parameters {
            None | Some(PathParametersFile::Reject) => PathParameters::Reject,
            Some(PathParametersFile::Allow) => PathParameters::Allow,
        },
        case_insensitive_paths: s.case_insensitive_paths.unwrap_or(false),
        rate_limit_headers: match s.rate_limit_headers {
            None | Some(RateLimitHeadersFile::XRateLimit) => RateLimitHeaders::XRateLimit,
            Some(RateLimitHeadersFile::Ietf) => RateLimitHeaders::Ietf,
            Some(RateLimitHeadersFile::Both) => RateLimitHeaders::Both,
        },
        tls: match &s.tls {
            Some(t) => Some(tls(cx, t)?),
            None => None,
        },
        check_token: match &s.check_token {
            Some(t) => Some(check_token(cx, t)?),
            None => None,
        },
    })
}

/// The longest `check_token` accepted.
const MAX_TOKEN: usize = 4096;

/// `check_token`: resolved (`"${VAR}"`), then refused when empty or when it could not be
/// sent as `Authorization: Bearer <token>` (only visible ASCII, no spaces).
fn check_token(cx: &Ctx<'_>, v: &Spanned<String>) -> Result<Secret, ConfigError> {
    let token = env_value(cx, "check_token", v)?;
    let problem = if token.is_empty() {
        Some("check_token must not be empty".to_string())
    } else if !token.bytes().all(|b| b.is_ascii_graphic()) {
        Some("check_token must be visible ASCII without spaces: it is sent as `Authorization: Bearer <token>`".to_string())
    } else if token.len() > MAX_TOKEN {
        Some(format!("check_token is longer than {MAX_TOKEN} bytes"))
    } else {
        None
    };
    match problem {
        Some(msg) => Err(cx.err(v.span(), msg)),
        None => Ok(Secret::new(&token)),
    }
}

/// A string value that may be an environment variable reference: `"${NAME}"` (the whole
/// value) is `NAME`'s value in the gateway's environment, read at load (and at each
/// reload); any other value is itself. A missing variable, a malformed reference or a
/// `${` inside a longer value is an error at the value naming `key`.
fn env_value(cx: &Ctx<'_>, key: &str, v: &Spanned<String>) -> Result<String, ConfigError> {
    let raw = v.get_ref();
    let Some(name) = raw.strip_prefix("${").and_then(|r| r.strip_suffix('}')) else {
        if raw.contains("${") {
            let msg = format!("{key}: only a whole-value \"${{VAR}}\" reference is expanded, not one inside a longer string");
            return Err(cx.err(v.span(), msg));
        }
        return Ok(raw.clone());
    };
    let well_formed = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !well_formed {
        let msg = format!("{key}: {raw:?} is not a valid environment variable reference (${{NAME}}, NAME of letters, digits and _)");
        return Err(cx.err(v.span(), msg));
    }
    match (cx.env)(name) {
        Ok(value) => Ok(value),
        Err(std::env::VarError::NotPresent) => Err(cx.err(
            v.span(),
            format!("{key}: environment variable {name} is not set"),
        )),
        Err(std::env::VarError::NotUnicode(_)) => Err(cx.err(
            v.span(),
            format!("{key}: environment variable {name} is not valid UTF-8"),
        )),
    }
}

/// `[server] tls`: both files read and parsed now, the key matched to the certificate;
/// any failure is reported at the `tls` value. Relative paths are taken from the config
/// file's directory.
fn tls(cx: &Ctx<'_>, t: &Spanned<TlsFile>) -> Result<Tls, ConfigError> {
    use pingora::tls::{sign::CertifiedKey, CertificateDer, CryptoProvider, PrivateKeyDer};
    let dir = std::path::Path::new(cx.name)
        .parent()
        .unwrap_or(std::path::Path::new(""));
    let (cert, key) = (dir.join(&t.get_ref().cert), dir.join(&t.get_ref().key));
    let fail = |msg: String| cx.err(t.span(), format!("tls: {msg}"));
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| fail(format!("cannot read {}: {e}", p.display())))
    };
    let (cert_pem, key_pem) = (read(&cert)?, read(&key)?);
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<_, _>>()
        .map_err(|e| fail(format!("{}: unparseable PEM: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(fail(format!("{}: no CERTIFICATE in PEM", cert.display())));
    }
    let private: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| fail(format!("{}: unparseable PEM: {e}", key.display())))?
        .ok_or_else(|| fail(format!("{}: no PRIVATE KEY in PEM", key.display())))?;
    pingora::tls::install_default_crypto_provider();
    let provider =
        CryptoProvider::get_default().ok_or_else(|| fail("no TLS crypto provider".to_string()))?;
    let certified = CertifiedKey::from_der(chain, private, provider).map_err(|e| {
        fail(format!(
            "{} and {} do not make a key pair: {e}",
            cert.display(),
            key.display()
        ))
    })?;
    Ok(Tls {
        cert,
        key,
        certified: Arc::new(certified),
    })
}

/// `listen` and `admin_listen`, refused when both would bind one socket: the admin API
/// would then answer on the public port.
fn listeners(cx: &Ctx<'_>, s: &ServerFile) -> Result<(SocketAddr, SocketAddr), ConfigError> {
    let listen = listen_addr(cx, s.listen.as_ref())?.unwrap_or(DEFAULT_LISTEN);
    let admin = listen_addr(cx, s.admin_listen.as_ref())?.unwrap_or(DEFAULT_ADMIN_LISTEN);
    if !same_socket(listen, admin) {
        return Ok((listen, admin));
    }
    let (span, default) = match (&s.admin_listen, &s.listen) {
        (Some(a), _) => (a.span(), ""),
        (None, Some(l)) => (l.span(), " (the default)"),
        (None, None) => (0..0, " (the default)"),
    };
    let what = if listen == admin {
        "is the proxy listener's address".to_string()
    } else {
        format!("overlaps the proxy listener {listen} (same port, an unspecified address)")
    };
    Err(cx.err(
        span,
        format!(
            "admin_listen {admin}{default} {what}: the admin API would answer on the public port"
        ),
    ))
}

/// `rls_listen`, refused when it would bind the proxy's or the admin API's socket.
fn rls_listener(
    cx: &Ctx<'_>,
    s: &ServerFile,
    listen: SocketAddr,
    admin: SocketAddr,
) -> Result<Option<SocketAddr>, ConfigError> {
    let Some(rls) = listen_addr(cx, s.rls_listen.as_ref())? else {
        return Ok(None);
    };
    let taken = [("proxy", listen), ("admin", admin)]
        .into_iter()
        .find(|(_, other)| same_socket(rls, *other));
    let Some((name, other)) = taken else {
        return Ok(Some(rls));
    };
    let what = if rls == other {
        format!("is the {name} listener's address")
    } else {
        format!("overlaps the {name} listener {other} (same port, an unspecified address)")
    };
    let span = s.rls_listen.as_ref().map_or(0..0, |v| v.span());
    Err(cx.err(
        span,
        format!("rls_listen {rls} {what}: the rate-limit service needs a socket of its own"),
    ))
}

fn listen_addr(
    cx: &Ctx<'_>,
    v: Option<&Spanned<String>>,
) -> Result<Option<SocketAddr>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    v.get_ref().parse().map(Some).map_err(|_| {
        cx.err(
            v.span(),
            format!("invalid listen address {:?}: expected IP:PORT", v.get_ref()),
        )
    })
}

/// Whether binding `a` and `b` would collide: one port (not 0, which picks a free one),
/// and one address or either unspecified (`0.0.0.0`, `::`).
fn same_socket(a: SocketAddr, b: SocketAddr) -> bool {
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    a.port() == b.port() && a.port() != 0 && (x == y || x.is_unspecified() || y.is_unspecified())
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

fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "throttle".to_string()
    } else {
        host
    };
    format!("{host}:{}", std::process::id())
}

fn trusted(cx: &Ctx<'_>, list: &[Spanned<String>]) -> Result<Vec<IpNet>, ConfigError> {
    list.iter().map(|c| cidr(cx, c)).collect()
}

/// An address or CIDR; a bare address is a /32 or /128.
fn cidr(cx: &Ctx<'_>, v: &Spanned<String>) -> Result<IpNet, ConfigError> {
    let s = v.get_ref().trim();
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    s.parse::<IpAddr>().map(IpNet::from).map_err(|_| {
        cx.err(
            v.span(),
            format!("invalid CIDR {s:?}: expected an address or ADDRESS/PREFIX"),
        )
    })
}

fn store(cx: &Ctx<'_>, s: &StoreFile) -> Result<Store, ConfigError> {
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
    Ok(Store {
        backend,
        url: s.url.clone(),
        cluster: s.cluster.clone().unwrap_or_default(),
        sentinel: s
            .sentinel
            .as_ref()
            .map(|s| (s.urls.clone(), s.master.clone())),
        timeout: Duration::from_millis(timeout_ms.unwrap_or(25)),
        on_failure: s.on_failure.map_or(OnFailure::Local, on_failure),
        instances: s.instances.as_ref().map(|n| *n.get_ref()),
        key_prefix: s.key_prefix.clone().unwrap_or_else(|| "thr".to_string()),
        lease: Duration::from_millis(lease_ms.unwrap_or(1_000)),
        concurrency_lease: Duration::from_secs(conc_secs.unwrap_or(30)),
    })
}

fn on_failure(f: OnFailureFile) -> OnFailure {
    match f {
        OnFailureFile::Open => OnFailure::Open,
        OnFailureFile::Closed => OnFailure::Closed,
        OnFailureFile::Local => OnFailure::Local,
    }
}

fn algorithm(a: AlgorithmFile) -> Algorithm {
    match a {
        AlgorithmFile::TokenBucket => Algorithm::TokenBucket,
        AlgorithmFile::SlidingWindow => Algorithm::SlidingWindow,
        AlgorithmFile::FixedWindow => Algorithm::FixedWindow,
        AlgorithmFile::SlidingLog => Algorithm::SlidingLog,
        AlgorithmFile::LeakyBucket => Algorithm::LeakyBucket,
    }
}

fn burst(cx: &Ctx<'_>, b: &Spanned<f64>) -> Result<f64, ConfigError> {
    burst_multiplier(*b.get_ref()).map_err(|e| cx.err(b.span(), e.to_string()))
}

/// How the windows of scope table `s` are built; `tier_burst` is the enclosing tier's.
fn settings(
    cx: &Ctx<'_>,
    s: &ScopeFile,
    tier_burst: Option<f64>,
) -> Result<WindowSettings, ConfigError> {
    Ok(WindowSettings {
        burst_multiplier: match &s.burst_multiplier {
            Some(b) => burst(cx, b)?,
            None => tier_burst.unwrap_or(1.0),
        },
        algorithm: s.algorithm.map(algorithm),
        jitter_ms: s.reset_jitter_secs.unwrap_or(0).saturating_mul(1000),
        admission: match s.admission {
            Some(AdmissionFile::Exact) => Admission::Exact,
            Some(AdmissionFile::Auto) | None => Admission::Auto,
        },
    })
}

/// A scope table; `tier_burst` / `tier_message` are the enclosing tier's defaults. Each
/// window goes through `config::window_limit`, its error placed at the window's value.
fn scope(
    cx: &Ctx<'_>,
    s: &ScopeFile,
    tier_burst: Option<f64>,
    tier_message: Option<&String>,
    default_failure: OnFailure,
) -> Result<ScopeLimits, ConfigError> {
    let settings = settings(cx, s, tier_burst)?;
    let fields = [
        &s.per_second,
        &s.per_minute,
        &s.per_hour,
        &s.per_day,
        &s.per_month,
    ];
    let mut windows = Vec::new();
    for (window, field) in Window::ALL.into_iter().zip(fields) {
        let Some(v) = field else { continue };
        let wl = settings
            .window(window, *v.get_ref())
            .map_err(|e| cx.err(v.span(), e.to_string()))?;
        windows.push(wl);
    }
    let concurrent = match &s.concurrent {
        None => None,
        Some(c) => match u32::try_from(*c.get_ref()) {
            Ok(n) if (1..=MAX_CONCURRENT).contains(&n) => Some(n),
            _ => {
                return Err(cx.err(
                    c.span(),
                    format!("concurrent must be between 1 and {MAX_CONCURRENT}"),
                ))
            }
        },
    };
    let ban = match &s.ban {
        None => None,
        Some(b) => Some(ban_rule(cx, b.get_ref())?),
    };
    Ok(ScopeLimits {
        concurrent,
        ban,
        windows,
        on_failure: s.on_failure.map_or(default_failure, on_failure),
        message: s.message.clone().or_else(|| tier_message.cloned()),
    })
}

/// `ban = {...}`, each value bounded: a ban needs at least one rejection, and spans
/// within a day (counting) and 30 days (the ban).
fn ban_rule(cx: &Ctx<'_>, b: &BanFile) -> Result<BanRule, ConfigError> {
    let after = bounded(cx, "ban.after", Some(&b.after), 1..=1_000_000)?.unwrap_or(1);
    let within = bounded(cx, "ban.within_secs", Some(&b.within_secs), 1..=86_400)?.unwrap_or(1);
    let for_secs = bounded(cx, "ban.for_secs", Some(&b.for_secs), 1..=30 * 86_400)?.unwrap_or(1);
    Ok(BanRule {
        after: u32::try_from(after).unwrap_or(u32::MAX),
        within_ms: within * 1000,
        for_ms: for_secs * 1000,
        from_check: b.from_check.unwrap_or(false),
    })
}

/// The largest `concurrent`: requests in flight of one identity.
const MAX_CONCURRENT: u32 = 1_000_000;

/// A scope table that takes rate windows only (`[limits.global]`, `[limits.auth]`): the
/// contract puts `concurrent` on ip, key and tenant.
fn rate_only(
    cx: &Ctx<'_>,
    s: &ScopeFile,
    table: &str,
    default_failure: OnFailure,
) -> Result<ScopeLimits, ConfigError> {
    if let Some(c) = &s.concurrent {
        return Err(cx.err(
            c.span(),
            format!("concurrent applies to [limits.ip] and tier key / tenant tables, not {table}"),
        ));
    }
    scope(cx, s, None, None, default_failure)
}

fn tier(
    cx: &Ctx<'_>,
    name: &str,
    t: &TierFile,
    default_failure: OnFailure,
) -> Result<Tier, ConfigError> {
    let b = match &t.burst_multiplier {
        Some(b) => Some(burst(cx, b)?),
        None => None,
    };
    let empty = ScopeFile::default();
    let key = t.key.as_ref().unwrap_or(&empty);
    Ok(Tier {
        name: name.to_string(),
        key: Arc::new(scope(cx, key, b, t.message.as_ref(), default_failure)?),
        key_settings: settings(cx, key, b)?,
        tenant: Arc::new(scope(
            cx,
            t.tenant.as_ref().unwrap_or(&empty),
            b,
            t.message.as_ref(),
            default_failure,
        )?),
    })
}

fn known_tier(
    cx: &Ctx<'_>,
    tier: &Spanned<String>,
    tiers: &HashMap<String, Arc<Tier>>,
) -> Result<(), ConfigError> {
    if tiers.contains_key(tier.get_ref()) {
        return Ok(());
    }
    let mut known: Vec<&str> = tiers.keys().map(String::as_str).collect();
    known.sort_unstable();
    Err(cx.err(
        tier.span(),
        format!(
            "unknown tier {:?} (known tiers: {})",
            tier.get_ref(),
            known.join(", ")
        ),
    ))
}

fn keys(
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

fn routes(cx: &Ctx<'_>, list: &[Spanned<RouteFile>]) -> Result<Vec<Route>, ConfigError> {
    let mut names = HashSet::new();
    let mut out = Vec::with_capacity(list.len());
    for r in list {
        let r = r.get_ref();
        if !names.insert(r.name.get_ref().clone()) {
            return Err(cx.err(
                r.name.span(),
                format!("duplicate route name {:?}", r.name.get_ref()),
            ));
        }
        let prefix = r.path_prefix.get_ref();
        if !prefix.starts_with('/') {
            return Err(cx.err(
                r.path_prefix.span(),
                format!("path_prefix must start with '/', got {prefix:?}"),
            ));
        }
        if r.upstreams.get_ref().is_empty() {
            return Err(cx.err(r.upstreams.span(), "a route needs at least one upstream"));
        }
        let upstreams = r
            .upstreams
            .get_ref()
            .iter()
            .map(|u| upstream(cx, u))
            .collect::<Result<_, _>>()?;
        let cost = match &r.cost {
            Some(c) if *c.get_ref() == 0 => return Err(cx.err(c.span(), "cost must be at least 1")),
            Some(c) => *c.get_ref(),
            None => 1,
        };
        let max_cost = match &r.max_cost {
            Some(m) if r.cost_header.is_none() => {
                return Err(cx.err(
                    m.span(),
                    "max_cost needs cost_header (it bounds the reported usage)",
                ))
            }
            Some(m) if *m.get_ref() < cost => {
                return Err(cx.err(
                    m.span(),
                    format!("max_cost {} is below the route's cost {cost}", m.get_ref()),
                ))
            }
            Some(m) => Some(*m.get_ref()),
            None => None,
        };
        let trimmed = prefix.trim_end_matches('/');
        out.push(Route {
            name: Arc::from(r.name.get_ref().as_str()),
            host: r.host.as_ref().map(|h| h.trim().to_ascii_lowercase()),
            path_prefix: if trimmed.is_empty() {
                "/".into()
            } else {
                trimmed.into()
            },
            upstreams,
            auth: match r.auth {
                AuthFile::Required => Auth::Required,
                AuthFile::Optional => Auth::Optional,
                AuthFile::None => Auth::None,
            },
            cost,
            mode: match r.mode {
                ModeFile::Enforce => Mode::Enforce,
                ModeFile::Shadow => Mode::Shadow,
            },
            connect_timeout: upstream_timeout(
                cx,
                "connect_timeout_ms",
                &r.connect_timeout_ms,
                1_000,
            )?,
            read_timeout: upstream_timeout(cx, "read_timeout_ms", &r.read_timeout_ms, 30_000)?,
            cost_header: match &r.cost_header {
                None => None,
                Some(h) => Some(
                    http::HeaderName::from_bytes(h.get_ref().as_bytes()).map_err(|_| {
                        cx.err(
                            h.span(),
                            format!("cost_header {:?} is not a header name", h.get_ref()),
                        )
                    })?,
                ),
            },
            max_cost,
            adaptive: match &r.adaptive {
                Some(a) => Some(adaptive(cx, a)?),
                None => None,
            },
            health_check: match &r.health_check {
                None => None,
                Some(h) => Some(health_check(cx, h.get_ref())?),
            },
            upgrade: r.upgrade.unwrap_or(false),
        });
    }
    Ok(out)
}

/// A route's `adaptive` table: at least one target; `max_error_rate` in [0, 1];
/// `min_factor` in (0, 1].
fn adaptive(
    cx: &Ctx<'_>,
    a: &Spanned<AdaptiveFile>,
) -> Result<crate::adaptive::Settings, ConfigError> {
    let t = a.get_ref();
    if t.target_p99_ms.is_none() && t.max_error_rate.is_none() {
        return Err(cx.err(
            a.span(),
            "adaptive needs target_p99_ms or max_error_rate (or both)",
        ));
    }
    let target_p99_ms = bounded(
        cx,
        "target_p99_ms",
        t.target_p99_ms.as_ref(),
        1..=MAX_UPSTREAM_TIMEOUT_MS,
    )?;
    let max_error_rate = match &t.max_error_rate {
        Some(v) if !(0.0..=1.0).contains(v.get_ref()) => {
            let msg = format!(
                "max_error_rate must be between 0 and 1, got {}",
                v.get_ref()
            );
            return Err(cx.err(v.span(), msg));
        }
        Some(v) => Some(*v.get_ref()),
        None => None,
    };
    let min_factor = match &t.min_factor {
        // At least one millionth: the factor's resolution.
        Some(v) if !(*v.get_ref() >= 1e-6 && *v.get_ref() <= 1.0) => {
            let msg = format!(
                "min_factor must be in (0, 1] (at least 0.000001), got {}",
                v.get_ref()
            );
            return Err(cx.err(v.span(), msg));
        }
        Some(v) => crate::adaptive::Factor::from_f64(*v.get_ref()),
        None => crate::adaptive::Factor::DEFAULT_MIN,
    };
    Ok(crate::adaptive::Settings {
        target_p99_ms,
        max_error_rate,
        min_factor,
    })
}

/// A route's `health_check`: an origin-form path and an interval of 100 ms to an hour.
fn health_check(cx: &Ctx<'_>, h: &HealthCheckFile) -> Result<HealthCheck, ConfigError> {
    let path = h.path.get_ref();
    let valid = path.starts_with('/')
        && path
            .parse::<http::uri::PathAndQuery>()
            .is_ok_and(|pq| pq.as_str() == path);
    if !valid {
        return Err(cx.err(
            h.path.span(),
            format!(
                "health_check path must be an origin-form path starting with '/', got {path:?}"
            ),
        ));
    }
    let interval = bounded(
        cx,
        "health_check interval_ms",
        h.interval_ms.as_ref(),
        MIN_HEALTH_INTERVAL_MS..=MAX_UPSTREAM_TIMEOUT_MS,
    )?;
    Ok(HealthCheck {
        path: path.clone(),
        interval: Duration::from_millis(interval.unwrap_or(1_000)),
    })
}

/// A route's upstream timeout in ms: 0 would fail every request, and over an hour is a typo.
fn upstream_timeout(
    cx: &Ctx<'_>,
    key: &str,
    v: &Option<Spanned<u64>>,
    default_ms: u64,
) -> Result<Duration, ConfigError> {
    let range = 1..=MAX_UPSTREAM_TIMEOUT_MS;
    Ok(Duration::from_millis(
        bounded(cx, key, v.as_ref(), range)?.unwrap_or(default_ms),
    ))
}

/// `IP:PORT`, or `host:port` resolved now (never on the request path).
fn upstream(cx: &Ctx<'_>, u: &Spanned<String>) -> Result<SocketAddr, ConfigError> {
    let s = u.get_ref().trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bad = || {
        cx.err(
            u.span(),
            format!("invalid upstream address {s:?}: expected HOST:PORT"),
        )
    };
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => s
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| cx.err(u.span(), format!("upstream host {host:?} does not resolve"))),
        _ => Err(bad()),
    }
}

/// A route whose cost exceeds a window it can meet would reject every request.
fn check_costs(
    cx: &Ctx<'_>,
    raw: &[Spanned<RouteFile>],
    routes: &[Route],
    scopes: [&Option<Arc<ScopeLimits>>; 2],
    tiers: &HashMap<String, Arc<Tier>>,
) -> Result<(), ConfigError> {
    let mut all: Vec<(String, &ScopeLimits)> = scopes
        .iter()
        .zip(["limits.ip", "limits.global"])
        .filter_map(|(s, n)| s.as_deref().map(|s| (n.to_string(), s)))
        .collect();
    for t in tiers.values() {
        all.push((format!("tiers.{}.key", t.name), &t.key));
        all.push((format!("tiers.{}.tenant", t.name), &t.tenant));
    }
    for (route, r) in routes.iter().zip(raw) {
        for (name, limits) in &all {
            if let Some(w) = limits.windows.iter().find(|w| w.capacity < route.cost) {
                let span = r.get_ref().cost.as_ref().map_or(r.span(), |c| c.span());
                return Err(cx.err(
                    span,
                    format!(
                        "cost {} exceeds {name}.{} = {}: no request could ever pass",
                        route.cost,
                        w.window.config_key(),
                        w.capacity
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn blocks(cx: &Ctx<'_>, list: &[BlockFile]) -> Result<Vec<BlockEntry>, ConfigError> {
    list.iter()
        .map(|b| {
            let value = b.value.get_ref().trim();
            if let Some(problem) = super::block_values::text_problem(value) {
                return Err(cx.err(b.value.span(), format!("block value {problem}")));
            }
            let target = match b.scope {
                BlockScopeFile::Ip => {
                    let net = cidr(cx, &b.value)?;
                    if let Some(problem) = super::block_values::net_problem(value, b.force.unwrap_or(false)) {
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
fn datetime_ms(d: &toml::value::Datetime) -> Option<u64> {
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
