//! `[server]`: listeners, limits of the process, TLS, the check token and `${VAR}` values.

use super::*;

pub(super) fn server(cx: &Ctx<'_>, s: &ServerFile) -> Result<Server, ConfigError> {
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
        admin_max_connections_per_ip: per_ip(
            cx,
            "admin_max_connections_per_ip",
            &s.admin_max_connections_per_ip,
        )?,
        rls_max_connections_per_ip: per_ip(
            cx,
            "rls_max_connections_per_ip",
            &s.rls_max_connections_per_ip,
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
        check_token: check_token(cx, s)?,
        admin_token: admin_token(cx, s)?,
        access_log: match &s.access_log {
            Some(v) => access_log(cx, v)?,
            None => AccessLogTarget::Off,
        },
    })
}

/// The admin and rate-limit listeners' per-client caps: at least 1, default
/// `DEFAULT_LISTENER_PER_IP` (a value at or above the listener's own cap caps nothing).
fn per_ip(cx: &Ctx<'_>, key: &str, v: &Option<Spanned<u32>>) -> Result<u32, ConfigError> {
    Ok(bounded(cx, key, v.as_ref(), 1..=u32::MAX)?.unwrap_or(DEFAULT_LISTENER_PER_IP))
}

/// Connections one client may hold on the admin or the rate-limit listener by default.
pub(crate) const DEFAULT_LISTENER_PER_IP: u32 = 8;

/// `[tracing]`: `otlp_endpoint` (`http://host:port`; `"${VAR}"` allowed; absent or
/// `"off"`: tracing off), `service_name`, `sample_ratio` (0 to 1).
pub(super) fn tracing_section(
    cx: &Ctx<'_>,
    t: &TracingFile,
) -> Result<Option<Tracing>, ConfigError> {
    let Some(raw) = &t.otlp_endpoint else {
        return Ok(None);
    };
    let endpoint = env_value(cx, "otlp_endpoint", raw)?;
    if endpoint == "off" {
        return Ok(None);
    }
    let bad = |why: &str| cx.err(raw.span(), format!("otlp_endpoint: {why}"));
    let quoted = shown(raw, &endpoint);
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| bad(&format!("{quoted} is not a URL: {e}")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(bad(
                "https is not supported: export to a collector beside the gateway over http://",
            ))
        }
        _ => return Err(bad(&format!("{quoted}: expected http://host:port"))),
    }
    if uri.host().is_none_or(str::is_empty) || uri.port_u16().is_none() {
        return Err(bad(&format!("{quoted}: expected http://host:port")));
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return Err(bad(&format!(
            "{quoted}: no path (the gRPC service's is fixed)"
        )));
    }
    let service_name = match &t.service_name {
        Some(n) if n.get_ref().trim().is_empty() || n.get_ref().len() > 255 => {
            return Err(cx.err(n.span(), "service_name: 1 to 255 characters"))
        }
        Some(n) => n.get_ref().clone(),
        None => "throttle".to_string(),
    };
    let sample_ratio = match &t.sample_ratio {
        Some(r) if !(0.0..=1.0).contains(r.get_ref()) => {
            return Err(cx.err(r.span(), "sample_ratio: from 0 to 1"))
        }
        Some(r) => *r.get_ref(),
        None => 1.0,
    };
    Ok(Some(Tracing {
        endpoint: format!("http://{}", uri.authority().map_or("", |a| a.as_str())),
        service_name,
        sample_ratio,
    }))
}

/// `access_log`: `"off"`, `"stdout"` or a file whose directory exists (relative to the
/// config file's directory). The file itself is opened (appended to) at start.
fn access_log(cx: &Ctx<'_>, v: &Spanned<String>) -> Result<AccessLogTarget, ConfigError> {
    let raw = env_value(cx, "access_log", v)?;
    match raw.as_str() {
        "off" => return Ok(AccessLogTarget::Off),
        "stdout" => return Ok(AccessLogTarget::Stdout),
        "" => {
            return Err(cx.err(
                v.span(),
                "access_log: empty (\"off\", \"stdout\" or a path)",
            ))
        }
        _ => {}
    }
    let dir = std::path::Path::new(cx.name)
        .parent()
        .unwrap_or(std::path::Path::new(""));
    let path = dir.join(&raw);
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if parent.is_some_and(|p| !p.is_dir()) || path.is_dir() {
        let shown = if v.get_ref().starts_with("${") {
            shown(v, "")
        } else {
            path.display().to_string()
        };
        let msg = format!("access_log: {shown} is not a file in an existing directory");
        return Err(cx.err(v.span(), msg));
    }
    Ok(AccessLogTarget::File(path))
}

/// How an error shows the value of `v` once resolved (`value`): quoted when it is written
/// in the file, else only the variable it came from (`the value of ${NAME}`), so a secret
/// read from the environment (a password in a URL) is never echoed.
pub(super) fn shown(v: &Spanned<String>, value: &str) -> String {
    let raw = v.get_ref();
    if raw.starts_with("${") && raw.ends_with('}') {
        format!("the value of {raw}")
    } else {
        format!("{value:?}")
    }
}

/// A string value that may be an environment variable reference: `"${NAME}"` (the whole
/// value) is `NAME`'s value in the gateway's environment, read at load (and at each
/// reload); any other value is itself. A missing variable, a malformed reference or a
/// `${` inside a longer value is an error at the value naming `key`.
pub(super) fn env_value(
    cx: &Ctx<'_>,
    key: &str,
    v: &Spanned<String>,
) -> Result<String, ConfigError> {
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
pub(super) fn tls(cx: &Ctx<'_>, t: &Spanned<TlsFile>) -> Result<Tls, ConfigError> {
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
pub(super) fn listeners(
    cx: &Ctx<'_>,
    s: &ServerFile,
) -> Result<(SocketAddr, SocketAddr), ConfigError> {
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
pub(super) fn rls_listener(
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

pub(super) fn listen_addr(
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
pub(super) fn same_socket(a: SocketAddr, b: SocketAddr) -> bool {
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    a.port() == b.port() && a.port() != 0 && (x == y || x.is_unspecified() || y.is_unspecified())
}

pub(super) fn default_instance_id() -> String {
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
