use std::path::Path;
use std::time::Duration;

use super::*;
use crate::limiter::{Algorithm, OnFailure, Window};

/// One route, so that a test config is complete (a file without routes is refused).
const ROUTE: &str = "\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:9000\"]\nauth = \"none\"\n";

fn with_route(src: &str) -> String {
    format!("{src}{ROUTE}")
}

fn fixture_dir(kind: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(kind)
}

/// Every invalid fixture fails with the `LINE:COL: message` its first line expects.
#[test]
fn every_invalid_fixture_fails_at_its_position() {
    let mut seen = 0;
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(fixture_dir("invalid")).unwrap() {
        let path = entry.unwrap().path();
        let source = std::fs::read_to_string(&path).unwrap();
        let expect = source
            .lines()
            .next()
            .unwrap()
            .strip_prefix("# expect: ")
            .unwrap()
            .trim();
        let err =
            parse("f.toml", &source).expect_err(&format!("{} should be rejected", path.display()));
        let shown = err.to_string();
        if !shown.starts_with(&format!("f.toml:{expect}")) {
            wrong.push(format!(
                "{}: got {shown:?}, expected f.toml:{expect}",
                path.display()
            ));
        }
        seen += 1;
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(seen >= 10, "only {seen} fixtures");
}

/// The shipped gateway.toml and every valid fixture are accepted.
#[test]
fn shipped_and_valid_configs_are_accepted() {
    parse("gateway.toml", SHIPPED).unwrap();
    for entry in std::fs::read_dir(fixture_dir("valid")).unwrap() {
        let path = entry.unwrap().path();
        load(&path).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Defaults: algorithm per window, burst from the tier, failure policy from the store.
#[test]
fn applies_defaults_and_tier_settings() {
    let c = parse("gateway.toml", SHIPPED).unwrap();
    let pro = &c.tiers["pro"];
    let sec = pro
        .key
        .windows
        .iter()
        .find(|w| w.window == Window::Second)
        .unwrap();
    assert_eq!(
        (sec.algorithm, sec.limit, sec.capacity),
        (Algorithm::TokenBucket, 50, 75)
    );
    let hour = pro
        .key
        .windows
        .iter()
        .find(|w| w.window == Window::Hour)
        .unwrap();
    assert_eq!(
        (hour.algorithm, hour.capacity),
        (Algorithm::SlidingWindow, 100_000)
    );
    let free = &c.tiers["free"];
    let month = free
        .key
        .windows
        .iter()
        .find(|w| w.window == Window::Month)
        .unwrap();
    assert_eq!(month.algorithm, Algorithm::FixedWindow);
    assert_eq!(free.key.on_failure, OnFailure::Local);
    assert!(free.key.message.as_deref().unwrap().contains("{limit}"));
    assert_eq!(c.routes[0].path_prefix, "/v1");
    assert_eq!(c.server.grace_period.as_secs(), 5);
}

/// A scope's own settings override the tier's and the store's.
#[test]
fn scope_settings_override_defaults() {
    let src = r#"
[store]
on_failure = "open"
[limits.ip]
per_minute = 10
algorithm = "sliding_log"
on_failure = "closed"
[limits.global]
per_second = 100
[tiers.t]
burst_multiplier = 2.0
key = { per_second = 10, burst_multiplier = 3.0 }
tenant = { per_second = 10, reset_jitter_secs = 60, per_day = 5 }
"#;
    let c = parse("x.toml", &with_route(src)).unwrap();
    let ip = c.ip_limits.as_ref().unwrap();
    assert_eq!(
        (ip.windows[0].algorithm, ip.on_failure),
        (Algorithm::SlidingLog, OnFailure::Closed)
    );
    assert_eq!(
        c.global_limits.as_ref().unwrap().on_failure,
        OnFailure::Open
    );
    assert_eq!(c.tiers["t"].key.windows[0].capacity, 30);
    let tenant = &c.tiers["t"].tenant;
    assert_eq!(tenant.windows[0].capacity, 20);
    assert_eq!(
        (tenant.windows[0].jitter_ms, tenant.windows[1].jitter_ms),
        (0, 60_000)
    );
}

/// Blocks parse addresses, CIDRs and expiry times.
#[test]
fn parses_blocks_with_expiry() {
    let src = r#"
[[blocks]]
scope = "ip"
value = "198.51.100.7"
[[blocks]]
scope = "tenant"
value = "evil"
expires_at = 2026-01-01T01:00:00+01:00
"#;
    let c = parse("x.toml", &with_route(src)).unwrap();
    assert_eq!(
        c.blocks[0].target,
        BlockTarget::Ip("198.51.100.7/32".parse().unwrap())
    );
    assert_eq!(c.blocks[1].expires_at_ms, Some(1_767_225_600_000));
}

/// The `[server]` keys that guard the gateway have safe defaults when absent.
#[test]
fn server_guard_defaults() {
    let s = parse("x.toml", ROUTE).unwrap().server;
    assert_eq!(s.header_timeout, Duration::from_secs(10));
    assert_eq!(s.idle_timeout, Duration::from_secs(60));
    assert_eq!((s.max_connections, s.max_connections_per_ip), (None, None));
    assert!(!s.underscores_in_headers);
    assert_eq!(s.path_parameters, PathParameters::Reject);
    assert_eq!((s.threads, s.grace_period), (2, Duration::from_secs(5)));
}

/// The same keys take the values given, at the edges of their ranges.
#[test]
fn server_guard_values_are_taken() {
    let src = r#"
[server]
header_timeout_secs = 300
idle_timeout_secs = 1
max_connections = 10000000
max_connections_per_ip = 1
underscores_in_headers = true
path_parameters = "allow"
threads = 256
grace_period_secs = 0
"#;
    let s = parse("x.toml", &with_route(src)).unwrap().server;
    assert_eq!(s.header_timeout, Duration::from_secs(300));
    assert_eq!(s.idle_timeout, Duration::from_secs(1));
    assert_eq!(s.max_connections, Some(10_000_000));
    assert_eq!(s.max_connections_per_ip, Some(1));
    assert!(s.underscores_in_headers);
    assert_eq!(s.path_parameters, PathParameters::Allow);
    assert_eq!((s.threads, s.grace_period), (256, Duration::ZERO));
    let s = parse(
        "x.toml",
        &with_route("[server]\npath_parameters = \"reject\"\n"),
    )
    .unwrap();
    assert_eq!(s.server.path_parameters, PathParameters::Reject);
}

/// Listeners on different ports, or on different specific addresses, are accepted;
/// one socket for both is refused, also when reached through an unspecified address.
#[test]
fn admin_listener_must_not_share_the_proxy_socket() {
    let server = |listen: &str, admin: &str| {
        let src = format!("[server]\nlisten = \"{listen}\"\nadmin_listen = \"{admin}\"\n");
        parse("x.toml", &with_route(&src))
    };
    for (l, a) in [
        ("127.0.0.1:8080", "127.0.0.1:9090"),
        ("127.0.0.1:8080", "127.0.0.2:8080"),
        ("127.0.0.1:8080", "[::1]:8080"),
        ("127.0.0.1:0", "127.0.0.1:0"),
    ] {
        server(l, a).unwrap_or_else(|e| panic!("{l} {a}: {e}"));
    }
    for (l, a) in [
        ("127.0.0.1:8080", "127.0.0.1:8080"),
        ("0.0.0.0:8080", "127.0.0.1:8080"),
        ("[::1]:8080", "[::]:8080"),
        ("[::]:8080", "0.0.0.0:8080"),
        ("[::ffff:127.0.0.1]:8080", "127.0.0.1:8080"),
    ] {
        let e = server(l, a).expect_err(&format!("{l} {a}"));
        assert_eq!(e.position, Some((3, 16)), "{e}");
        assert!(e.message.starts_with("admin_listen "), "{e}");
    }
    // The admin default (127.0.0.1:9090) taken by `listen`: the error points at `listen`.
    let e = parse(
        "x.toml",
        &with_route("[server]\nlisten = \"127.0.0.1:9090\"\n"),
    )
    .unwrap_err();
    assert_eq!(e.position, Some((2, 10)), "{e}");
    assert!(e.message.contains("(the default)"), "{e}");
}

/// Route upstream timeouts default to 1 s (connect) and 30 s (read).
#[test]
fn route_timeouts_default_and_take_values() {
    let c = parse("x.toml", ROUTE).unwrap();
    assert_eq!(c.routes[0].connect_timeout, Duration::from_secs(1));
    assert_eq!(c.routes[0].read_timeout, Duration::from_secs(30));
    let src = format!("{ROUTE}connect_timeout_ms = 1\nread_timeout_ms = 3600000\n");
    let c = parse("x.toml", &src).unwrap();
    assert_eq!(c.routes[0].connect_timeout, Duration::from_millis(1));
    assert_eq!(c.routes[0].read_timeout, Duration::from_secs(3600));
}

/// A file without routes is refused at its start, even when otherwise valid.
#[test]
fn refuses_a_config_without_routes() {
    for src in ["", "[limits.ip]\nper_second = 10\n"] {
        let e = parse("x.toml", src).unwrap_err();
        assert_eq!(e.position, Some((1, 1)));
        assert!(e.message.starts_with("no [[routes]]"), "{e}");
    }
}

/// An unreadable file is named in the error.
#[test]
fn missing_file_is_named() {
    let e = load(Path::new("/nonexistent/gw.toml")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/gw.toml: cannot read"),
        "{e}"
    );
}

/// The config inlined in docker-compose.yml is a valid gateway config.
#[test]
fn docker_compose_config_is_valid() {
    let compose =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docker-compose.yml"))
            .unwrap();
    let mut lines = compose
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("content: |"))
        .skip(1);
    let mut body = String::new();
    for l in lines.by_ref() {
        if !l.is_empty() && !l.starts_with("      ") {
            break;
        }
        body.push_str(l.get(6..).unwrap_or(""));
        body.push('\n');
    }
    assert!(body.contains("[[routes]]"), "no inline config found");
    let c = parse("docker-compose.yml#gateway", &body).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(c.store.backend, Backend::Redis);
    assert!(c.database_url.is_some() && c.auth_limits.is_some());
}

/// `rls_listen` is off by default, parsed when given, and refused (at its value) when it
/// would share the proxy's or the admin API's socket, the defaults included.
#[test]
fn rls_listener_needs_a_socket_of_its_own() {
    let server = |extra: &str| parse("x.toml", &with_route(&format!("[server]\n{extra}\n")));
    assert_eq!(server("").unwrap().server.rls_listen, None);
    let s = server("rls_listen = \"127.0.0.1:8081\"").unwrap();
    assert_eq!(s.server.rls_listen, Some("127.0.0.1:8081".parse().unwrap()));
    server("listen = \"127.0.0.1:0\"\nrls_listen = \"127.0.0.1:0\"").unwrap();
    for (extra, names) in [
        (
            "rls_listen = \"127.0.0.1:8080\"",
            "proxy listener's address",
        ),
        (
            "rls_listen = \"0.0.0.0:8080\"",
            "proxy listener 127.0.0.1:8080",
        ),
        (
            "rls_listen = \"127.0.0.1:9090\"",
            "admin listener's address",
        ),
        (
            "admin_listen = \"127.0.0.1:9191\"\nrls_listen = \"[::]:9191\"",
            "admin listener 127.0.0.1:9191",
        ),
    ] {
        let e = server(extra).expect_err(extra);
        let line = extra.lines().count() + 1;
        assert_eq!(e.position, Some((line, 14)), "{e}");
        assert!(e.message.starts_with("rls_listen "), "{e}");
        assert!(e.message.contains(names), "{e}");
    }
    let e = server("rls_listen = \"localhost:8081\"").unwrap_err();
    assert!(e.message.contains("expected IP:PORT"), "{e}");
}

/// `adaptive` on a route: each target optional, `min_factor` 0.1 unless set; a route
/// without it is not adaptive.
#[test]
fn adaptive_settings() {
    use crate::adaptive::{Factor, Settings};
    let c = parse(
        "f.toml",
        r#"
[[routes]]
name = "slow"
path_prefix = "/slow"
upstreams = ["127.0.0.1:9000"]
adaptive = { target_p99_ms = 200, max_error_rate = 0.05 }
[[routes]]
name = "errors"
path_prefix = "/errors"
upstreams = ["127.0.0.1:9000"]
adaptive = { max_error_rate = 1, min_factor = 0.25, min_clients = 2 }
[[routes]]
name = "plain"
path_prefix = "/"
upstreams = ["127.0.0.1:9000"]
"#,
    )
    .unwrap();
    let got: Vec<_> = c.routes.iter().map(|r| r.adaptive).collect();
    assert_eq!(
        got,
        [
            Some(Settings {
                target_p99_ms: Some(200),
                max_error_rate: Some(0.05),
                min_factor: Factor::from_f64(0.1),
                min_clients: 5,
            }),
            Some(Settings {
                target_p99_ms: None,
                max_error_rate: Some(1.0),
                min_factor: Factor::from_f64(0.25),
                min_clients: 2,
            }),
            None,
        ]
    );
}

/// `check_token = "${VAR}"` is the variable's value, read at load; a literal is itself;
/// the token never shows in `Debug`. Without it, a decision API beyond loopback warns.
#[test]
fn check_token_comes_from_the_environment() {
    let env = |var: &str| match var {
        "CHECK_TOKEN_A" => Ok("s3cret-token-0123".to_string()),
        "CHECK_TOKEN_EMPTY" => Ok(String::new()),
        _ => Err(std::env::VarError::NotPresent),
    };
    let load = |server: &str| parse_env("f.toml", &with_route(server), &env);
    let c = load("[server]\ncheck_token = \"${CHECK_TOKEN_A}\"\n").unwrap();
    let token = c.server.check_token.clone().unwrap();
    assert!(token.authorizes([&b"Bearer s3cret-token-0123"[..]]));
    assert!(token.authorizes([&b"bearer s3cret-token-0123"[..]]));
    for wrong in [
        &b"Basic s3cret-token-0123"[..],
        &b"Bearer s3cret-token-012"[..],
        b"s3cret-token-0123",
        b"Bearer s3cret-token-0123 ",
        b"",
    ] {
        assert!(!token.authorizes([wrong]), "{wrong:?}");
    }
    assert!(!token.authorizes(std::iter::empty()));
    assert!(
        !format!("{c:?}").contains("s3cret"),
        "the token leaks into Debug"
    );
    let literal = load("[server]\ncheck_token = \"literal-token-0123\"\n").unwrap();
    assert!(literal
        .server
        .check_token
        .unwrap()
        .authorizes([&b"Bearer literal-token-0123"[..]]));
    // A variable set but empty is an empty token; an unset one is named.
    let err = load("[server]\ncheck_token = \"${CHECK_TOKEN_EMPTY}\"\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "f.toml:2:15: check_token must not be empty (the value of ${CHECK_TOKEN_EMPTY})"
    );
    let err = load("[server]\ncheck_token = \"${CHECK_TOKEN_B}\"\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "f.toml:2:15: check_token: environment variable CHECK_TOKEN_B is not set"
    );
}

/// `throttle check` warns about a decision API listening beyond loopback without
/// `check_token`: the admin listener (`POST /v1/check`) and the RLS.
#[test]
fn decision_apis_beyond_loopback_warn_without_a_token() {
    let warnings = |server: &str| {
        parse("f.toml", &with_route(&format!("[server]\n{server}\n")))
            .unwrap()
            .warnings()
    };
    assert!(
        warnings("").is_empty(),
        "the default admin listener is loopback"
    );
    assert!(warnings("admin_listen = \"[::1]:9090\"\nrls_listen = \"127.0.0.1:8081\"").is_empty());
    let w = warnings("admin_listen = \"0.0.0.0:9090\"\nrls_listen = \"10.0.0.5:8081\"");
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].starts_with("f.toml: warning: admin_listen 0.0.0.0:9090 listens beyond loopback"));
    assert!(w[1].contains("rls_listen 10.0.0.5:8081") && w[1].contains("check_token"));
    let w = warnings("admin_listen = \"0.0.0.0:9090\"\ncheck_token = \"check-token-0123456\"");
    assert!(w.is_empty(), "{w:?}");
}

/// `ban.from_check` defaults to false; a config block may be wide with `force = true`.
#[test]
fn ban_from_check_and_forced_blocks() {
    let c = parse(
        "f.toml",
        &with_route(
            "[limits.ip]\nper_second = 1\nban = { after = 2, within_secs = 10, for_secs = 60, from_check = true }\n\n[[blocks]]\nscope = \"ip\"\nvalue = \"0.0.0.0/0\"\nforce = true\n",
        ),
    )
    .unwrap();
    assert!(c.ip_limits.unwrap().ban.unwrap().from_check);
    assert_eq!(c.blocks.len(), 1);
    let c = parse(
        "f.toml",
        &with_route(
            "[limits.ip]\nper_second = 1\nban = { after = 2, within_secs = 10, for_secs = 60 }\n",
        ),
    )
    .unwrap();
    assert!(!c.ip_limits.unwrap().ban.unwrap().from_check);
}

/// An `[auth.jwt]` table for the tests below: a tier to name, `extra` lines added.
fn jwt_config(extra: &str) -> String {
    with_route(&format!(
        "[tiers.free]\nkey = {{ per_minute = 10 }}\n[tiers.pro]\nkey = {{ per_minute = 100 }}\n\n[auth.jwt]\n{extra}\n"
    ))
}

/// `[auth.jwt]` gets DESIGN's defaults (refresh 300 s, leeway 30 s, `sub`), reads the
/// HS256 secret from the variable it names, and a config without it has no JWT.
#[test]
fn jwt_defaults_and_secret_from_the_environment() {
    let secret = "0123456789abcdef0123456789abcdef";
    let env = |var: &str| match var {
        "JWT_SECRET" => Ok(secret.to_string()),
        "SHORT" => Ok("short".to_string()),
        "ISSUER" => Ok("https://idp.example.com/".to_string()),
        _ => Err(std::env::VarError::NotPresent),
    };
    let load = |extra: &str| parse_env("f.toml", &jwt_config(extra), &env);
    let c = load(
        "algorithms = [\"HS256\"]\nhs256_secret_env = \"JWT_SECRET\"\ndefault_tier = \"free\"\nissuer = \"${ISSUER}\"",
    )
    .unwrap();
    let j = c.jwt.unwrap();
    let s = &j.settings;
    assert_eq!(s.algorithms, [crate::auth::Algorithm::HS256]);
    assert_eq!(s.hs256_secret.as_deref(), Some(secret.as_bytes()));
    assert_eq!(s.jwks_refresh, Duration::from_secs(300));
    assert_eq!(s.leeway_secs, 30);
    assert_eq!(s.key_claim, "sub");
    assert_eq!(s.issuer.as_deref(), Some("https://idp.example.com/"));
    assert_eq!(
        (s.tenant_claim.as_ref(), s.tier_claim.as_ref()),
        (None, None)
    );
    assert_eq!(j.default_tier.as_deref(), Some("free"));
    assert!(
        !format!("{s:?}").contains(secret),
        "the secret is never printed"
    );

    let e = load("algorithms = [\"HS256\"]\nhs256_secret_env = \"SHORT\"\ndefault_tier = \"free\"")
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("f.toml:8:20: the HS256 secret is 5 bytes"),
        "{e}"
    );
    let e = load("algorithms = [\"HS256\"]\nhs256_secret_env = \"JWT_SECRET\"\ntier_claim = \"\"")
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("f.toml:9:14: tier_claim must be 1 to 64"),
        "{e}"
    );
    let e = load("algorithms = []\ndefault_tier = \"free\"").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("f.toml:7:14: algorithms must name"),
        "{e}"
    );
    let e = load("algorithms = [\"RS256\", \"RS256\"]\njwks_url = \"http://127.0.0.1:1/\"\ntier_claim = \"plan\"\njwks_refresh_secs = 0")
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("f.toml:7:24: algorithms: RS256 is listed twice"),
        "{e}"
    );
    assert!(parse("f.toml", &with_route("")).unwrap().jwt.is_none());
}

/// `jwks_file` is taken from the config file's directory and read at load; every claim
/// setting is kept as written.
#[test]
fn jwt_jwks_file_is_relative_to_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
    let jwks = format!(r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"{x}"}}]}}"#);
    std::fs::write(dir.path().join("jwks.json"), jwks).unwrap();
    let path = dir.path().join("gateway.toml");
    let extra = "algorithms = [\"EdDSA\"]\njwks_file = \"jwks.json\"\nkey_claim = \"client_id\"\ntenant_claim = \"org\"\ntier_claim = \"plan\"\naudience = \"api\"\nleeway_secs = 5\njwks_refresh_secs = 60";
    std::fs::write(&path, jwt_config(extra)).unwrap();
    let c = load(&path).unwrap();
    let s = c.jwt.unwrap().settings;
    assert_eq!(
        s.jwks_file.as_deref(),
        Some(dir.path().join("jwks.json").as_path())
    );
    assert_eq!(
        (
            s.key_claim.as_str(),
            s.tenant_claim.as_deref(),
            s.tier_claim.as_deref()
        ),
        ("client_id", Some("org"), Some("plan"))
    );
    assert_eq!((s.audience.as_deref(), s.leeway_secs), (Some("api"), 5));
    assert_eq!(s.jwks_refresh, Duration::from_secs(60));
    // A JWKS without a key usable with the algorithms is refused at its line.
    std::fs::write(dir.path().join("jwks.json"), r#"{"keys":[]}"#).unwrap();
    let e = load(&path).unwrap_err().to_string();
    assert!(
        e.contains(":8:13: jwks_file ") && e.contains("none of its 0 keys"),
        "{e}"
    );
}

/// Every store and database URL may be a `"${VAR}"` reference, resolved at load; a
/// missing variable is an error naming it, at the value.
#[test]
fn urls_come_from_the_environment() {
    let env = |var: &str| match var {
        "REDIS_A" => Ok("redis://:pw@10.0.0.1:6379".to_string()),
        "REDIS_B" => Ok("redis://10.0.0.2:7000".to_string()),
        "PG" => Ok("postgres://u:pw@db/throttle".to_string()),
        _ => Err(std::env::VarError::NotPresent),
    };
    let load = |s: &str| parse_env("f.toml", &with_route(s), &env);
    let c = load("[store]\nbackend = \"redis\"\nurl = \"${REDIS_A}\"\n").unwrap();
    assert_eq!(c.store.url.as_deref(), Some("redis://:pw@10.0.0.1:6379"));
    let c =
        load("[store]\nbackend = \"redis\"\ncluster = [\"${REDIS_A}\", \"${REDIS_B}\"]\n").unwrap();
    assert_eq!(
        c.store.cluster,
        ["redis://:pw@10.0.0.1:6379", "redis://10.0.0.2:7000"]
    );
    let c = load(
        "[store]\nbackend = \"redis\"\nsentinel = { urls = [\"${REDIS_B}\"], master = \"m\" }\n",
    )
    .unwrap();
    assert_eq!(c.store.sentinel.unwrap().0, ["redis://10.0.0.2:7000"]);
    let c = load("[database]\nurl = \"${PG}\"\n").unwrap();
    assert_eq!(
        c.database_url.as_deref(),
        Some("postgres://u:pw@db/throttle")
    );
    let err = load("[database]\nurl = \"${PG_MISSING}\"\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "f.toml:2:7: [database] url: environment variable PG_MISSING is not set"
    );
    let err = load("[store]\nbackend = \"redis\"\nurl = \"redis://${REDIS_A}\"\n").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("f.toml:3:7: url: only a whole-value"),
        "{err}"
    );
}

/// `access_log`: off by default, "stdout", or a path relative to the config's directory
/// whose directory must exist.
#[test]
fn access_log_targets() {
    use crate::config::AccessLogTarget;
    let dir = std::env::temp_dir().join(format!("throttle-access-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let name = dir.join("gw.toml").display().to_string();
    let load = |v: &str| {
        parse(
            &name,
            &with_route(&format!("[server]\naccess_log = \"{v}\"\n")),
        )
    };
    assert_eq!(
        parse(&name, &with_route("")).unwrap().server.access_log,
        AccessLogTarget::Off
    );
    assert_eq!(load("off").unwrap().server.access_log, AccessLogTarget::Off);
    assert_eq!(
        load("stdout").unwrap().server.access_log,
        AccessLogTarget::Stdout
    );
    assert_eq!(
        load("access.log").unwrap().server.access_log,
        AccessLogTarget::File(dir.join("access.log"))
    );
    let err = load("no/such/dir/a.log").unwrap_err().to_string();
    assert!(
        err.contains("access_log:") && err.contains("existing directory"),
        "{err}"
    );
    assert!(load("")
        .unwrap_err()
        .to_string()
        .contains("access_log: empty"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `[tracing]`: off without `otlp_endpoint` (or with "off"); an `http://host:port`
/// endpoint, a service name and a sample ratio; anything else is an error at its value.
#[test]
fn tracing_section() {
    use crate::config::Tracing;
    let load = |body: &str| parse("gw.toml", &with_route(&format!("[tracing]\n{body}\n")));
    assert_eq!(parse("gw.toml", &with_route("")).unwrap().tracing, None);
    assert_eq!(load("").unwrap().tracing, None);
    assert_eq!(load("otlp_endpoint = \"off\"").unwrap().tracing, None);
    assert_eq!(
        load("otlp_endpoint = \"http://127.0.0.1:4317\"")
            .unwrap()
            .tracing,
        Some(Tracing {
            endpoint: "http://127.0.0.1:4317".into(),
            service_name: "throttle".into(),
            sample_ratio: 1.0,
        })
    );
    let t = load(
        "otlp_endpoint = \"http://otel-collector:4317/\"\nservice_name = \"edge\"\nsample_ratio = 0.25",
    )
    .unwrap()
    .tracing
    .unwrap();
    assert_eq!(
        (t.endpoint.as_str(), t.service_name.as_str(), t.sample_ratio),
        ("http://otel-collector:4317", "edge", 0.25)
    );
    for (body, wants) in [
        (
            "otlp_endpoint = \"https://c:4317\"",
            "https is not supported",
        ),
        ("otlp_endpoint = \"c:4317\"", "expected http://host:port"),
        ("otlp_endpoint = \"http://c\"", "expected http://host:port"),
        ("otlp_endpoint = \"http://c:4317/v1/traces\"", "no path"),
        ("otlp_endpoint = \"not a url\"", "is not a URL"),
        (
            "otlp_endpoint = \"http://c:1\"\nsample_ratio = 1.5",
            "sample_ratio",
        ),
        (
            "otlp_endpoint = \"http://c:1\"\nservice_name = \" \"",
            "service_name",
        ),
        (
            "otlp_endpoint = \"http://c:1\"\nsampler = 1",
            "unknown field",
        ),
    ] {
        let err = load(body).unwrap_err().to_string();
        assert!(
            err.starts_with("gw.toml:") && err.contains(wants),
            "{body}: {err}"
        );
    }
}

mod calendar;
mod regions;
mod secrets;
mod tables;
mod tokens;
