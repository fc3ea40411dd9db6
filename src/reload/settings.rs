//! Every setting of the config model, and what a reload does with it.
//!
//! `settings` destructures each config struct without `..`, so a new field does not
//! compile until it is classified here: **applied** (the runtime a reload swaps in reads
//! it for the next request, connection or tick) or **restart** (read once when the
//! process starts: a listener, a thread pool, the store's or the database's connection,
//! the access log, the exporter). A restart-only setting is compared with the config the
//! process *started* with (`Core::started`), so a change stays listed in
//! `needs_restart` on every later reload until a restart, and a change undone is no
//! longer listed. Each binding is handed to `Out`, so a field named but not classified is
//! an unused variable (a warning, an error under `-D warnings`).
//!
//! Names are gateway.toml's, dotted (`store.lease_ms`, `server.tls`). Whole sections
//! whose every value the runtime holds (tiers, keys, blocks, limits) are one name each.

use crate::config::{Config, Jwt, KeySources, Rls, Route, Server, Store, Tracing};

/// What a reload does with a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// The new runtime applies it.
    Applied,
    /// Read at start only: a change needs a restart.
    Restart,
    /// Applied in part; the part fixed at start is listed when it changes (see the
    /// setting's comment in `settings`).
    Partly,
}

/// One setting: its gateway.toml name, what a reload does with it, and whether the file
/// now asks for something the process does not do (always false for applied ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// `store.lease_ms`.
    pub name: &'static str,
    /// Applied, restart or partly.
    pub reload: Reload,
    /// Listed in `needs_restart`.
    pub pending: bool,
}

/// The settings a reload to `new` does not apply, for a process started on `started`.
pub fn needs_restart(started: &Config, new: &Config) -> Vec<&'static str> {
    settings(started, new)
        .into_iter()
        .filter_map(|s| s.pending.then_some(s.name))
        .collect()
}

/// Every setting of the model, in gateway.toml order, classified (see the module docs).
/// Sections absent from `started` (`[tracing]`, `[auth.jwt]`, routes) are one name.
pub fn settings(started: &Config, new: &Config) -> Vec<Setting> {
    let mut out = Out::default();
    let Config {
        source: _, // not a setting: the file's path
        server,
        trusted_proxies,
        ipv6_prefix,
        client_ip_header,
        store,
        database_url,
        events_retention_months,
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
        tenant_tiers: _, // made from tiers and tenants
        blocks,
        rls,
        tracing,
        regions,
        file_warnings: _, // not a setting: what `throttle check` says of the file
    } = started;
    server_settings(&mut out, server, &new.server);
    out.applied("client_ip.trusted_proxies", trusted_proxies);
    out.applied("client_ip.ipv6_prefix", ipv6_prefix);
    out.applied("client_ip.header", client_ip_header);
    store_settings(&mut out, store, &new.store);
    // The pool, the snapshot's LISTEN and the violation log writer connect at start.
    out.restart("database.url", *database_url != new.database_url);
    out.applied("database.events_retention_months", events_retention_months);
    out.applied("limits.ip", ip_limits);
    out.applied("limits.global", global_limits);
    out.applied("limits.auth", auth_limits);
    out.applied("scopes", scopes);
    auth_settings(&mut out, auth);
    jwt_settings(&mut out, jwt.as_ref());
    out.applied("tiers", tiers);
    route_settings(&mut out, routes.first());
    out.applied("keys", keys);
    out.applied("tenants", tenants);
    out.applied("blocks", blocks);
    rls_settings(&mut out, rls);
    tracing_settings(&mut out, tracing.as_ref(), new.tracing.as_ref());
    // The sync loop and the peers' connections start with the process.
    out.restart("regions", *regions != new.regions);
    out.0
}

/// `[server]`.
fn server_settings(out: &mut Out, a: &Server, b: &Server) {
    let Server {
        listen,
        admin_listen,
        rls_listen,
        instance_id,
        threads,
        grace_period,
        upgrade_sock,
        header_timeout,
        idle_timeout,
        body_timeout,
        max_connections,
        max_connections_per_ip,
        admin_max_connections_per_ip,
        rls_max_connections_per_ip,
        underscores_in_headers,
        path_parameters,
        case_insensitive_paths,
        rate_limit_headers,
        tls,
        check_token,
        admin_token,
        access_log,
    } = a;
    out.restart("server.listen", *listen != b.listen);
    out.restart("server.admin_listen", *admin_listen != b.admin_listen);
    out.restart("server.rls_listen", *rls_listen != b.rls_listen);
    // The heartbeat's id in Redis (`/healthz` shows the file's).
    out.restart("server.instance_id", *instance_id != b.instance_id);
    out.restart("server.threads", *threads != b.threads);
    out.restart("server.grace_period_secs", *grace_period != b.grace_period);
    out.restart("server.upgrade_sock", *upgrade_sock != b.upgrade_sock);
    out.applied("server.header_timeout_secs", header_timeout);
    // Read per connection, except Pingora's HTTP/2 idle timeout, fixed at start: listed
    // when the proxy listener serves TLS (the only way it speaks HTTP/2).
    let h2 = tls.is_some() && *idle_timeout != b.idle_timeout;
    out.partly("server.idle_timeout_secs", h2);
    out.applied("server.body_timeout_secs", body_timeout);
    out.restart(
        "server.max_connections",
        *max_connections != b.max_connections,
    );
    out.applied("server.max_connections_per_ip", max_connections_per_ip);
    // Read from the runtime at each accept, as the proxy's is.
    out.applied(
        "server.admin_max_connections_per_ip",
        admin_max_connections_per_ip,
    );
    out.applied(
        "server.rls_max_connections_per_ip",
        rls_max_connections_per_ip,
    );
    out.applied("server.underscores_in_headers", underscores_in_headers);
    out.applied("server.path_parameters", path_parameters);
    out.applied("server.case_insensitive_paths", case_insensitive_paths);
    out.applied("server.rate_limit_headers", rate_limit_headers);
    // The listener is TLS or plain from the start; a new cert and key pair is served
    // from the next handshake. Added or removed: listed (removed keeps the last pair).
    out.partly("server.tls", tls.is_some() != b.tls.is_some());
    out.applied("server.check_token", check_token);
    // The admin listener keeps the token it started with.
    out.restart("server.admin_token_file", *admin_token != b.admin_token);
    out.restart("server.access_log", *access_log != b.access_log);
}

/// `[store]`: the store and its Redis client are built at start.
fn store_settings(out: &mut Out, a: &Store, b: &Store) {
    let Store {
        backend,
        url,
        cluster,
        sentinel,
        timeout,
        on_failure,
        instances,
        key_prefix,
        lease,
        concurrency_lease,
        max_states,
    } = a;
    out.restart("store.backend", *backend != b.backend);
    out.restart("store.url", *url != b.url);
    out.restart("store.cluster", *cluster != b.cluster);
    out.restart("store.sentinel", *sentinel != b.sentinel);
    out.restart("store.timeout_ms", *timeout != b.timeout);
    // The default of every table's `on_failure`, resolved into the limits at load.
    out.applied("store.on_failure", on_failure);
    out.restart("store.instances", *instances != b.instances);
    out.restart("store.key_prefix", *key_prefix != b.key_prefix);
    out.restart("store.lease_ms", *lease != b.lease);
    out.restart(
        "store.concurrency_lease_secs",
        *concurrency_lease != b.concurrency_lease,
    );
    // The memory store (and Redis's local fallback) is sized once, at start.
    out.restart("store.max_states", *max_states != b.max_states);
}

/// `[auth]`.
fn auth_settings(out: &mut Out, a: &KeySources) {
    let KeySources {
        key_header,
        key_query,
    } = a;
    out.applied("auth.key_header", key_header);
    out.applied("auth.key_query", key_query);
}

/// `[auth.jwt]`: the verifier takes each reload's settings (`Core::swap_runtime`), and
/// the JWKS refresher follows the current verifier.
fn jwt_settings(out: &mut Out, a: Option<&Jwt>) {
    let Some(Jwt {
        settings,
        default_tier,
    }) = a
    else {
        return out.applied("auth.jwt", &a);
    };
    let crate::auth::JwtSettings {
        algorithms,
        jwks_file,
        jwks_url,
        jwks_refresh,
        hs256_secret,
        issuer,
        audience,
        leeway_secs,
        key_claim,
        tenant_claim,
        tier_claim,
        scope_claims,
    } = settings;
    out.applied("auth.jwt.algorithms", algorithms);
    out.applied("auth.jwt.jwks_file", jwks_file);
    out.applied("auth.jwt.jwks_url", jwks_url);
    out.applied("auth.jwt.jwks_refresh_secs", jwks_refresh);
    out.applied("auth.jwt.hs256_secret_env", hs256_secret);
    out.applied("auth.jwt.issuer", issuer);
    out.applied("auth.jwt.audience", audience);
    out.applied("auth.jwt.leeway_secs", leeway_secs);
    out.applied("auth.jwt.key_claim", key_claim);
    out.applied("auth.jwt.tenant_claim", tenant_claim);
    out.applied("auth.jwt.tier_claim", tier_claim);
    out.applied("auth.jwt.scope_claims", scope_claims);
    out.applied("auth.jwt.default_tier", default_tier);
}

/// `[[routes]]`: the router, its balancers, health checks and adaptive state are built
/// with each runtime (health checks and the controller follow the swap).
fn route_settings(out: &mut Out, a: Option<&Route>) {
    let Some(Route {
        name,
        host,
        path_prefix,
        upstreams,
        auth,
        cost,
        mode,
        connect_timeout,
        read_timeout,
        cost_header,
        max_cost,
        cost_from,
        adaptive,
        health_check,
        upgrade,
        methods,
        hide_credentials,
        identity_headers,
        real_ip_header,
        hide_client_headers,
        limits,
    }) = a
    else {
        return out.applied("routes", &a);
    };
    out.applied("routes.name", name);
    out.applied("routes.host", host);
    out.applied("routes.path_prefix", path_prefix);
    out.applied("routes.upstreams", upstreams);
    out.applied("routes.auth", auth);
    out.applied("routes.cost", cost);
    out.applied("routes.mode", mode);
    out.applied("routes.connect_timeout_ms", connect_timeout);
    out.applied("routes.read_timeout_ms", read_timeout);
    out.applied("routes.cost_header", cost_header);
    out.applied("routes.max_cost", max_cost);
    out.applied("routes.cost_from", cost_from);
    adaptive_settings(out, adaptive.as_ref());
    out.applied("routes.health_check", health_check);
    out.applied("routes.upgrade", upgrade);
    out.applied("routes.methods", methods);
    out.applied("routes.hide_credentials", hide_credentials);
    out.applied("routes.identity_headers", identity_headers);
    out.applied("routes.real_ip_header", real_ip_header);
    out.applied("routes.hide_client_headers", hide_client_headers);
    out.applied("routes.limits", limits);
}

/// A route's `adaptive`: the controller reads the current runtime's at each tick.
fn adaptive_settings(out: &mut Out, a: Option<&crate::adaptive::Settings>) {
    let Some(crate::adaptive::Settings {
        target_p99_ms,
        max_error_rate,
        min_factor,
        min_clients,
    }) = a
    else {
        return out.applied("routes.adaptive", &a);
    };
    out.applied("routes.adaptive.target_p99_ms", target_p99_ms);
    out.applied("routes.adaptive.max_error_rate", max_error_rate);
    out.applied("routes.adaptive.min_factor", min_factor);
    out.applied("routes.adaptive.min_clients", min_clients);
}

/// `[rls]`: read from the runtime by every rate-limit call.
fn rls_settings(out: &mut Out, a: &Rls) {
    let Rls {
        descriptors,
        response_headers,
        on_failure,
        admission,
    } = a;
    out.applied("rls.config", descriptors);
    out.applied("rls.response_headers", response_headers);
    out.applied("rls.on_failure", on_failure);
    out.applied("rls.admission", admission);
}

/// `[tracing]`: the exporter starts with the process.
fn tracing_settings(out: &mut Out, a: Option<&Tracing>, b: Option<&Tracing>) {
    let (
        Some(Tracing {
            endpoint,
            service_name,
            sample_ratio,
        }),
        Some(b),
    ) = (a, b)
    else {
        return out.restart("tracing", a.is_some() != b.is_some());
    };
    out.restart("tracing.otlp_endpoint", *endpoint != b.endpoint);
    out.restart("tracing.service_name", *service_name != b.service_name);
    out.restart("tracing.sample_ratio", *sample_ratio != b.sample_ratio);
}

/// The settings classified so far.
#[derive(Default)]
struct Out(Vec<Setting>);

impl Out {
    /// `name` is applied by a reload (`_value` is taken so that each field is used).
    fn applied<T: ?Sized>(&mut self, name: &'static str, _value: &T) {
        self.push(name, Reload::Applied, false);
    }

    /// `name` is read at start; `changed` since then.
    fn restart(&mut self, name: &'static str, changed: bool) {
        self.push(name, Reload::Restart, changed);
    }

    /// `name` is applied but for a part fixed at start, which `pending` says changed.
    fn partly(&mut self, name: &'static str, pending: bool) {
        self.push(name, Reload::Partly, pending);
    }

    fn push(&mut self, name: &'static str, reload: Reload, pending: bool) {
        self.0.push(Setting {
            name,
            reload,
            pending,
        });
    }
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
