//! Every setting of the model changed by itself: a reload either applies it or lists it.

use std::collections::BTreeSet;
use std::path::Path;

use super::*;
use crate::config;

/// A config that sets every setting of the model (files in `dir`).
fn base(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"[server]
listen = "127.0.0.1:18080"
admin_listen = "127.0.0.1:19090"
rls_listen = "127.0.0.1:18081"
instance_id = "a"
threads = 2
grace_period_secs = 5
upgrade_sock = "/tmp/a.sock"
header_timeout_secs = 10
idle_timeout_secs = 60
body_timeout_secs = 60
max_connections = 100
max_connections_per_ip = 10
admin_max_connections_per_ip = 8
rls_max_connections_per_ip = 8
underscores_in_headers = false
path_parameters = "reject"
case_insensitive_paths = false
rate_limit_headers = "x-ratelimit"
tls = {{ cert = "{d}/cert1.pem", key = "{d}/key1.pem" }}
check_token = "check-token-a-0123456789"
admin_token_file = "{d}/admin1"
access_log = "off"

[client_ip]
trusted_proxies = ["10.0.0.0/8"]
ipv6_prefix = 64
header = "x-forwarded-for"

[store]
backend = "redis"
url = "redis://127.0.0.1:1"
timeout_ms = 50
on_failure = "open"
instances = 2
key_prefix = "thr"
lease_ms = 1000
concurrency_lease_secs = 30
max_states = 1000

[database]
url = "postgres://127.0.0.1/a"
events_retention_months = 12

[limits.ip]
per_second = 100
[limits.global]
per_second = 1000
[limits.auth]
per_minute = 10

[scopes.user]
from = "header:X-User"
[limits.user]
per_minute = 50

[auth]
key_header = "x-api-key"
key_query = "api_key"

[auth.jwt]
algorithms = ["EdDSA", "HS256"]
jwks_file = "{d}/jwks1.json"
jwks_url = "http://127.0.0.1:1/jwks.json"
jwks_refresh_secs = 60
hs256_secret_env = "THROTTLE_RELOAD_TEST_SECRET_A"
issuer = "https://idp.test/"
audience = "api"
leeway_secs = 5
key_claim = "sub"
tenant_claim = "org"
tier_claim = "plan"
default_tier = "free"

[tiers.free]
key = {{ per_minute = 100 }}

[[routes]]
name = "api"
host = "api.test"
path_prefix = "/v1"
upstreams = ["127.0.0.1:1"]
auth = "optional"
cost = 1
mode = "enforce"
connect_timeout_ms = 1000
read_timeout_ms = 30000
cost_header = "x-cost"
max_cost = 10
adaptive = {{ target_p99_ms = 500, max_error_rate = 0.5, min_factor = 0.2, min_clients = 5 }}
health_check = {{ path = "/health", interval_ms = 1000 }}
upgrade = false
methods = ["GET"]
hide_credentials = false
identity_headers = true
real_ip_header = true
hide_client_headers = false
limits = {{ ip = {{ per_minute = 30 }} }}

[[keys]]
id = "k1"
key = "key-one"
tenant = "acme"
tier = "free"

[[tenants]]
id = "acme"
tier = "free"

[[blocks]]
scope = "ip"
value = "192.0.2.1"

[rls]
response_headers = false
on_failure = "open"
admission = "auto"

[tracing]
otlp_endpoint = "http://127.0.0.1:4317"
service_name = "throttle"
sample_ratio = 1.0
"#
    )
}

/// Every setting's name, one change of it (text replaced in `base`), and whether a
/// reload lists it in `needs_restart`.
const TABLE: &[(&str, &str, &str, bool)] = &[
    ("server.listen", "127.0.0.1:18080", "127.0.0.1:18090", true),
    (
        "server.admin_listen",
        "127.0.0.1:19090",
        "127.0.0.1:19091",
        true,
    ),
    (
        "server.rls_listen",
        "127.0.0.1:18081",
        "127.0.0.1:18082",
        true,
    ),
    (
        "server.instance_id",
        "instance_id = \"a\"",
        "instance_id = \"b\"",
        true,
    ),
    ("server.threads", "threads = 2", "threads = 3", true),
    (
        "server.grace_period_secs",
        "grace_period_secs = 5",
        "grace_period_secs = 6",
        true,
    ),
    ("server.upgrade_sock", "/tmp/a.sock", "/tmp/b.sock", true),
    (
        "server.header_timeout_secs",
        "header_timeout_secs = 10",
        "header_timeout_secs = 3",
        false,
    ),
    // With TLS on, HTTP/2 connections keep the start's idle timeout.
    (
        "server.idle_timeout_secs",
        "idle_timeout_secs = 60",
        "idle_timeout_secs = 5",
        true,
    ),
    (
        "server.body_timeout_secs",
        "body_timeout_secs = 60",
        "body_timeout_secs = 7",
        false,
    ),
    (
        "server.max_connections",
        "max_connections = 100",
        "max_connections = 99",
        true,
    ),
    (
        "server.max_connections_per_ip",
        "max_connections_per_ip = 10",
        "max_connections_per_ip = 3",
        false,
    ),
    (
        "server.admin_max_connections_per_ip",
        "admin_max_connections_per_ip = 8",
        "admin_max_connections_per_ip = 4",
        false,
    ),
    (
        "server.rls_max_connections_per_ip",
        "rls_max_connections_per_ip = 8",
        "rls_max_connections_per_ip = 4",
        false,
    ),
    (
        "server.underscores_in_headers",
        "underscores_in_headers = false",
        "underscores_in_headers = true",
        false,
    ),
    ("server.path_parameters", "\"reject\"", "\"allow\"", false),
    (
        "server.case_insensitive_paths",
        "case_insensitive_paths = false",
        "case_insensitive_paths = true",
        false,
    ),
    (
        "server.rate_limit_headers",
        "\"x-ratelimit\"",
        "\"both\"",
        false,
    ),
    // A new pair is served from the next handshake (adding or removing: below).
    (
        "server.tls",
        "cert1.pem\", key = \"{d}/key1",
        "cert2.pem\", key = \"{d}/key2",
        false,
    ),
    (
        "server.check_token",
        "check-token-a-0123456789",
        "check-token-b-0123456789",
        false,
    ),
    ("server.admin_token_file", "admin1", "admin2", true),
    (
        "server.access_log",
        "access_log = \"off\"",
        "access_log = \"stdout\"",
        true,
    ),
    (
        "client_ip.trusted_proxies",
        "10.0.0.0/8",
        "10.1.0.0/16",
        false,
    ),
    (
        "client_ip.ipv6_prefix",
        "ipv6_prefix = 64",
        "ipv6_prefix = 56",
        false,
    ),
    (
        "client_ip.header",
        "\"x-forwarded-for\"",
        "\"forwarded\"",
        false,
    ),
    (
        "store.backend",
        "backend = \"redis\"",
        "backend = \"memory\"",
        true,
    ),
    (
        "store.url",
        "redis://127.0.0.1:1\"",
        "redis://127.0.0.1:2\"",
        true,
    ),
    (
        "store.cluster",
        "url = \"redis://127.0.0.1:1\"",
        "cluster = [\"redis://127.0.0.1:3\"]",
        true,
    ),
    (
        "store.sentinel",
        "url = \"redis://127.0.0.1:1\"",
        "sentinel = { urls = [\"redis://127.0.0.1:4\"], master = \"m\" }",
        true,
    ),
    (
        "store.timeout_ms",
        "timeout_ms = 50",
        "timeout_ms = 40",
        true,
    ),
    (
        "store.on_failure",
        "on_failure = \"open\"\ninstances",
        "on_failure = \"closed\"\ninstances",
        false,
    ),
    ("store.instances", "instances = 2", "instances = 3", true),
    (
        "store.key_prefix",
        "key_prefix = \"thr\"",
        "key_prefix = \"x\"",
        true,
    ),
    ("store.lease_ms", "lease_ms = 1000", "lease_ms = 200", true),
    (
        "store.concurrency_lease_secs",
        "concurrency_lease_secs = 30",
        "concurrency_lease_secs = 10",
        true,
    ),
    (
        "store.max_states",
        "max_states = 1000",
        "max_states = 2000",
        true,
    ),
    ("database.url", "127.0.0.1/a", "127.0.0.1/b", true),
    (
        "database.events_retention_months",
        "events_retention_months = 12",
        "events_retention_months = 3",
        false,
    ),
    (
        "limits.ip",
        "per_second = 100\n",
        "per_second = 101\n",
        false,
    ),
    (
        "limits.global",
        "per_second = 1000",
        "per_second = 1001",
        false,
    ),
    (
        "limits.auth",
        "[limits.auth]\nper_minute = 10",
        "[limits.auth]\nper_minute = 11",
        false,
    ),
    ("scopes", "header:X-User", "header:X-Account", false),
    (
        "auth.key_header",
        "key_header = \"x-api-key\"",
        "key_header = \"x-key\"",
        false,
    ),
    (
        "auth.key_query",
        "key_query = \"api_key\"",
        "key_query = \"k\"",
        false,
    ),
    (
        "auth.jwt.algorithms",
        "[\"EdDSA\", \"HS256\"]",
        "[\"HS256\", \"EdDSA\"]",
        false,
    ),
    ("auth.jwt.jwks_file", "jwks1.json", "jwks2.json", false),
    (
        "auth.jwt.jwks_url",
        "127.0.0.1:1/jwks.json",
        "127.0.0.1:2/jwks.json",
        false,
    ),
    (
        "auth.jwt.jwks_refresh_secs",
        "jwks_refresh_secs = 60",
        "jwks_refresh_secs = 61",
        false,
    ),
    ("auth.jwt.hs256_secret_env", "SECRET_A", "SECRET_B", false),
    (
        "auth.jwt.issuer",
        "https://idp.test/",
        "https://idp2.test/",
        false,
    ),
    (
        "auth.jwt.audience",
        "audience = \"api\"",
        "audience = \"api2\"",
        false,
    ),
    (
        "auth.jwt.leeway_secs",
        "leeway_secs = 5",
        "leeway_secs = 6",
        false,
    ),
    (
        "auth.jwt.key_claim",
        "key_claim = \"sub\"",
        "key_claim = \"uid\"",
        false,
    ),
    (
        "auth.jwt.tenant_claim",
        "tenant_claim = \"org\"",
        "tenant_claim = \"team\"",
        false,
    ),
    (
        "auth.jwt.tier_claim",
        "tier_claim = \"plan\"",
        "tier_claim = \"level\"",
        false,
    ),
    (
        "auth.jwt.scope_claims",
        "from = \"header:X-User\"",
        "from = \"jwt:uid\"",
        false,
    ),
    (
        "auth.jwt.default_tier",
        "default_tier = \"free\"",
        "default_tier = \"pro\"\n[tiers.pro]\nkey = { per_minute = 7 }",
        false,
    ),
    (
        "tiers",
        "key = { per_minute = 100 }",
        "key = { per_minute = 90 }",
        false,
    ),
    ("routes.name", "name = \"api\"", "name = \"api2\"", false),
    ("routes.host", "api.test", "api2.test", false),
    ("routes.path_prefix", "\"/v1\"", "\"/v2\"", false),
    (
        "routes.upstreams",
        "upstreams = [\"127.0.0.1:1\"]",
        "upstreams = [\"127.0.0.1:2\"]",
        false,
    ),
    (
        "routes.auth",
        "auth = \"optional\"",
        "auth = \"none\"",
        false,
    ),
    ("routes.cost", "cost = 1\n", "cost = 2\n", false),
    ("routes.mode", "\"enforce\"", "\"shadow\"", false),
    (
        "routes.connect_timeout_ms",
        "connect_timeout_ms = 1000",
        "connect_timeout_ms = 900",
        false,
    ),
    (
        "routes.read_timeout_ms",
        "read_timeout_ms = 30000",
        "read_timeout_ms = 900",
        false,
    ),
    ("routes.cost_header", "\"x-cost\"", "\"x-usage\"", false),
    ("routes.max_cost", "max_cost = 10", "max_cost = 20", false),
    (
        "routes.cost_from",
        "cost_header = \"x-cost\"",
        "cost_from = \"response_bytes\"\ncost_unit_bytes = 100",
        false,
    ),
    (
        "routes.adaptive.target_p99_ms",
        "target_p99_ms = 500",
        "target_p99_ms = 400",
        false,
    ),
    (
        "routes.adaptive.max_error_rate",
        "max_error_rate = 0.5",
        "max_error_rate = 0.4",
        false,
    ),
    (
        "routes.adaptive.min_factor",
        "min_factor = 0.2",
        "min_factor = 0.3",
        false,
    ),
    (
        "routes.adaptive.min_clients",
        "min_clients = 5",
        "min_clients = 6",
        false,
    ),
    (
        "routes.health_check",
        "interval_ms = 1000",
        "interval_ms = 2000",
        false,
    ),
    ("routes.upgrade", "upgrade = false", "upgrade = true", false),
    ("routes.methods", "[\"GET\"]", "[\"GET\", \"POST\"]", false),
    (
        "routes.hide_credentials",
        "hide_credentials = false",
        "hide_credentials = true",
        false,
    ),
    (
        "routes.identity_headers",
        "identity_headers = true",
        "identity_headers = false",
        false,
    ),
    (
        "routes.real_ip_header",
        "real_ip_header = true",
        "real_ip_header = false",
        false,
    ),
    (
        "routes.hide_client_headers",
        "hide_client_headers = false",
        "hide_client_headers = true",
        false,
    ),
    ("routes.limits", "per_minute = 30", "per_minute = 31", false),
    ("keys", "key = \"key-one\"", "key = \"key-two\"", false),
    (
        "tenants",
        "[[tenants]]\nid = \"acme\"",
        "[[tenants]]\nid = \"other\"",
        false,
    ),
    ("blocks", "192.0.2.1", "192.0.2.2", false),
    (
        "rls.config",
        "[rls]\n",
        "[rls]\nconfig = \"{d}/rls\"\n",
        false,
    ),
    (
        "rls.response_headers",
        "response_headers = false",
        "response_headers = true",
        false,
    ),
    (
        "rls.on_failure",
        "[rls]\nresponse_headers = false\non_failure = \"open\"",
        "[rls]\nresponse_headers = false\non_failure = \"closed\"",
        false,
    ),
    (
        "rls.admission",
        "admission = \"auto\"",
        "admission = \"exact\"",
        false,
    ),
    (
        "tracing.otlp_endpoint",
        "127.0.0.1:4317",
        "127.0.0.1:4318",
        true,
    ),
    (
        "tracing.service_name",
        "service_name = \"throttle\"",
        "service_name = \"edge\"",
        true,
    ),
    (
        "tracing.sample_ratio",
        "sample_ratio = 1.0",
        "sample_ratio = 0.5",
        true,
    ),
    (
        "regions",
        "[tracing]",
        "[regions]\nname = \"eu\"\npeers = { us = \"redis://127.0.0.1:2\" }\n[tracing]",
        true,
    ),
];

/// Files the base config reads: two certificate pairs, two JWKS, two admin tokens, an
/// RLS descriptor directory (the HS256 secrets' variables are `parse`'s).
fn files() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    for n in ["1", "2"] {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(p.join(format!("cert{n}.pem")), c.cert.pem()).unwrap();
        std::fs::write(p.join(format!("key{n}.pem")), c.signing_key.serialize_pem()).unwrap();
        std::fs::write(
            p.join(format!("admin{n}")),
            format!("admin-token-{n}-0123456789abcdef"),
        )
        .unwrap();
    }
    let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
    for kid in ["1", "2"] {
        let jwks =
            format!(r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","kid":"{kid}","x":"{x}"}}]}}"#);
        std::fs::write(p.join(format!("jwks{kid}.json")), jwks).unwrap();
    }
    std::fs::create_dir(p.join("rls")).unwrap();
    std::fs::write(
        p.join("rls/api.yaml"),
        "domain: api\ndescriptors:\n  - key: generic_key\n    value: a\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
    )
    .unwrap();
    dir
}

fn parse(text: &str) -> Config {
    let env = |var: &str| match var {
        "THROTTLE_RELOAD_TEST_SECRET_A" | "THROTTLE_RELOAD_TEST_SECRET_B" => {
            Ok("0123456789abcdef0123456789abcdef".to_string())
        }
        _ => Err(std::env::VarError::NotPresent),
    };
    config::parse_with("gateway.toml", text, &env).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Each setting of the model, changed alone, is applied or listed as the table says,
/// the table's rows match `settings`' classification, and the table names every setting
/// `settings` enumerates (a field added to the model fails to compile in `settings`, and
/// once classified fails here until it has a row).
#[test]
fn every_setting_changed_alone_is_applied_or_listed() {
    let dir = files();
    let d = dir.path().display().to_string();
    let text = base(dir.path());
    let started = parse(&text);
    assert!(needs_restart(&started, &started).is_empty());
    let all = settings(&started, &started);
    for &(name, from, to, listed) in TABLE {
        let (from, to) = (from.replace("{d}", &d), to.replace("{d}", &d));
        assert_eq!(
            text.matches(&from).count(),
            1,
            "{name}: {from:?} is not unique"
        );
        let changed = parse(&text.replacen(&from, &to, 1));
        let mut got = needs_restart(&started, &changed);
        // A Cluster or Sentinel takes the place of `url`, which goes with it.
        if matches!(name, "store.cluster" | "store.sentinel") {
            got.retain(|n| *n != "store.url");
        }
        let expected: Vec<&str> = if listed { vec![name] } else { vec![] };
        assert_eq!(got, expected, "{name}");
        let kind = all.iter().find(|s| s.name == name).map(|s| s.reload);
        let consistent = match kind {
            Some(Reload::Applied) => !listed,
            Some(Reload::Restart) => listed,
            Some(Reload::Partly) => true,
            None => false,
        };
        assert!(consistent, "{name}: classified {kind:?}, listed: {listed}");
    }
    let names: BTreeSet<&str> = all.iter().map(|s| s.name).collect();
    let rows: BTreeSet<&str> = TABLE.iter().map(|r| r.0).collect();
    assert_eq!(names.len(), all.len(), "a name given twice");
    assert_eq!(rows.len(), TABLE.len(), "a row given twice");
    assert_eq!(
        names, rows,
        "every setting has a row, and every row a setting"
    );
}

/// A section absent at start is one setting: `[tracing]` and TLS added or removed are
/// listed; `[auth.jwt]`, routes' `adaptive` added are applied. Without TLS the idle
/// timeout applies in full.
#[test]
fn sections_added_or_removed() {
    let dir = files();
    let d = dir.path().display().to_string();
    let text = base(dir.path());
    let tls = format!("tls = {{ cert = \"{d}/cert1.pem\", key = \"{d}/key1.pem\" }}\n");
    let plain = text.replacen(&tls, "", 1);
    let started = parse(&text);
    let without_tls = parse(&plain);
    assert_eq!(needs_restart(&started, &without_tls), ["server.tls"]);
    assert_eq!(needs_restart(&without_tls, &started), ["server.tls"]);
    let idle = plain.replacen("idle_timeout_secs = 60", "idle_timeout_secs = 5", 1);
    assert!(needs_restart(&without_tls, &parse(&idle)).is_empty());
    let tracing_at = text.find("[tracing]").unwrap();
    let untraced = parse(&text[..tracing_at]);
    assert_eq!(needs_restart(&started, &untraced), ["tracing"]);
    assert_eq!(needs_restart(&untraced, &started), ["tracing"]);
    let jwt_at = text.find("[auth.jwt]").unwrap();
    let tiers_at = text.find("[tiers.free]").unwrap();
    let no_jwt = parse(&format!("{}{}", &text[..jwt_at], &text[tiers_at..]));
    assert!(needs_restart(&no_jwt, &started).is_empty());
    assert!(needs_restart(&started, &no_jwt).is_empty());
}

/// A restart-only change is compared with the start: it stays listed on a later reload
/// that changes something else, and is no longer listed once undone.
#[test]
fn a_pending_change_stays_listed_until_undone() {
    let dir = files();
    let text = base(dir.path());
    let started = parse(&text);
    let lease = text.replacen("lease_ms = 1000", "lease_ms = 200", 1);
    assert_eq!(needs_restart(&started, &parse(&lease)), ["store.lease_ms"]);
    let more = lease.replacen("check-token-a", "check-token-b", 1);
    assert_eq!(needs_restart(&started, &parse(&more)), ["store.lease_ms"]);
    let undone = more.replacen("lease_ms = 200", "lease_ms = 1000", 1);
    assert!(needs_restart(&started, &parse(&undone)).is_empty());
}
