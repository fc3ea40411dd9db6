//! Route matching (host + longest path prefix on a segment boundary, on the normalized
//! target of `target.rs`) and upstream choice.
//!
//! A route with `health_check` gets Pingora's `HttpHealthCheck` on its balancer: the
//! checks themselves run in the background (`upstream_health`), and `select` only
//! returns upstreams whose last check passed. Upstreams start healthy (Pingora's
//! default), so a fresh config serves at once; the first pass runs right after start or
//! reload.

use std::sync::Arc;
use std::time::Duration;

use pingora::lb::health_check::HttpHealthCheck;
use pingora::lb::selection::RoundRobin;
use pingora::lb::LoadBalancer;

use crate::config::Route;

/// The routes of one config, most specific first.
pub struct Router {
    routes: Vec<Arc<RouteEntry>>,
    /// `[server] case_insensitive_paths`: match on `fold_path` of the path.
    case_insensitive: bool,
}

/// A route and its upstream set (its counters and adaptive state, which outlive a
/// reload, are `Core`'s: `admission::Core::route_state`).
pub struct RouteEntry {
    /// The route.
    pub route: Route,
    /// Round-robin over the route's upstreams.
    pub upstreams: LoadBalancer<RoundRobin>,
    /// The only upstream, when there is one: no balancer call per request.
    pub single: Option<std::net::SocketAddr>,
    /// The prefix requests are matched on (`fold_path`ed with `case_insensitive_paths`).
    match_prefix: String,
}

impl std::fmt::Debug for RouteEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteEntry")
            .field("route", &self.route.name)
            .finish_non_exhaustive()
    }
}

// === impl Router ===

impl Router {
    /// Builds the router; host-specific routes first, then longer prefixes first.
    ///
    /// # Errors
    /// When an upstream set cannot be built.
    pub fn new(routes: &[Route], case_insensitive: bool) -> std::io::Result<Self> {
        let mut out = Vec::with_capacity(routes.len());
        for r in routes {
            let mut upstreams = LoadBalancer::try_from_iter(r.upstreams.iter().copied())?;
            if let Some(hc) = health_check(r)? {
                upstreams.set_health_check(Box::new(hc));
            }
            out.push(Arc::new(RouteEntry {
                single: match (&r.upstreams[..], &r.health_check) {
                    // A checked upstream goes through the balancer, which knows its health.
                    ([one], None) => Some(*one),
                    _ => None,
                },
                route: r.clone(),
                upstreams,
                match_prefix: if case_insensitive {
                    fold_path(&r.path_prefix)
                } else {
                    r.path_prefix.to_string()
                },
            }));
        }
        // Host first, then the longest prefix: a route naming the request's host wins over
        // every host-less route, whatever their prefix lengths (nginx picks the server
        // block before the location, Envoy the virtual host before the route). A request
        // whose host has routes but no matching prefix among them matches nothing (404):
        // the host-less routes are not that host's fallback.
        out.sort_by_key(|e| {
            (
                e.route.host.is_none(),
                std::cmp::Reverse(e.route.path_prefix.len()),
            )
        });
        Ok(Self {
            routes: out,
            case_insensitive,
        })
    }

    /// Every route, most specific first.
    pub fn entries(&self) -> &[Arc<RouteEntry>] {
        &self.routes
    }

    /// The route named `name`.
    pub fn find_by_name(&self, name: &str) -> Option<&Arc<RouteEntry>> {
        self.routes.iter().find(|e| &*e.route.name == name)
    }

    /// The route for a normalized `host` (lower case, no port, no trailing dot; see
    /// `target`), a normalized `path` and `method`: the most specific route whose prefix
    /// matches and whose `methods` (if any) take `method`. A route that matches all but
    /// the method is passed over for the next candidate, as nginx's `limit_except` is not
    /// and Envoy's route `:method` header match is.
    pub fn find(
        &self,
        host: Option<&str>,
        path: &str,
        method: &http::Method,
    ) -> Option<&Arc<RouteEntry>> {
        let folded;
        let path = if self.case_insensitive {
            folded = fold_path(path);
            folded.as_str()
        } else {
            path
        };
        // Host routes come first: once one names the request's host, that host is a
        // virtual host of its own and the host-less routes are not its fallback.
        let mut host_known = false;
        for e in &self.routes {
            match (&e.route.host, host) {
                (Some(want), Some(got)) if route_host(want).eq_ignore_ascii_case(got) => {
                    host_known = true;
                }
                (Some(_), _) => continue,
                (None, _) if host_known => return None,
                (None, _) => {}
            }
            if prefix_matches(&e.match_prefix, path) && e.route.takes(method) {
                return Some(e);
            }
        }
        None
    }
}

/// The `HttpHealthCheck` of a route with `health_check`: `GET path` with the route's
/// host (or the first upstream's address) as `Host`; one failure marks an upstream down,
/// one success up again. Timeouts are the route's, capped at the interval so that one
/// pass never outlasts the next.
///
/// # Errors
/// When the request cannot be built (the path was validated, so not in practice).
fn health_check(r: &Route) -> std::io::Result<Option<HttpHealthCheck>> {
    let Some(cfg) = &r.health_check else {
        return Ok(None);
    };
    let host = match (&r.host, r.upstreams.first()) {
        (Some(h), _) => h.clone(),
        (None, Some(a)) => a.to_string(),
        (None, None) => "localhost".to_string(),
    };
    let mut hc = HttpHealthCheck::new(&host, false);
    let invalid = |e: Box<pingora::Error>| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string())
    };
    hc.req.set_uri(
        cfg.path
            .parse::<http::Uri>()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?,
    );
    hc.req
        .insert_header("user-agent", "throttle-health-check")
        .map_err(invalid)?;
    let cap = |d: Duration| Some(d.min(cfg.interval));
    let opts = &mut hc.peer_template.options;
    opts.connection_timeout = cap(r.connect_timeout);
    opts.total_connection_timeout = cap(r.connect_timeout);
    opts.read_timeout = cap(r.read_timeout);
    opts.write_timeout = cap(r.read_timeout);
    Ok(Some(hc))
}

/// A route's `host` as compared: without one trailing dot.
fn route_host(h: &str) -> &str {
    h.strip_suffix('.').unwrap_or(h)
}

/// A path as a case-insensitive upstream resolves it (IIS; Windows and macOS file
/// systems): ASCII letters in lower case, and each segment without trailing dots and
/// spaces (`%20`), so `/ADMIN/`, `/admin./` and `/admin%20/` are all `/admin/`.
pub fn fold_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for (i, seg) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        let mut s = seg;
        loop {
            let t = s.trim_end_matches('.');
            let t = t.strip_suffix("%20").unwrap_or(t);
            if t.len() == s.len() {
                break;
            }
            s = t;
        }
        out.extend(s.chars().map(|c| c.to_ascii_lowercase()));
    }
    out
}

/// `/v1` matches `/v1`, `/v1/` and `/v1/x`, never `/v1x`; `/` matches everything.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    /// Case-insensitive upstreams: case, trailing dots and spaces do not make another path.
    #[test]
    fn folded_paths() {
        let cases = [
            ("/Admin/Users", "/admin/users"),
            ("/admin./x", "/admin/x"),
            ("/admin%20/x", "/admin/x"),
            ("/admin.%20.%20/x", "/admin/x"),
            ("/admin...", "/admin"),
            ("/a.b/c", "/a.b/c"),
            ("/", "/"),
        ];
        for (path, want) in cases {
            assert_eq!(fold_path(path), want, "{path}");
        }
        let c = parse(
            "x.toml",
            r#"
[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["127.0.0.1:1"]
auth = "none"
[[routes]]
name = "admin"
path_prefix = "/Admin"
upstreams = ["127.0.0.1:2"]
"#,
        )
        .unwrap();
        let name = |r: &Router, path: &str| {
            r.find(Some("h"), path, &http::Method::GET)
                .unwrap()
                .route
                .name
                .to_string()
        };
        let sensitive = Router::new(&c.routes, false).unwrap();
        let folding = Router::new(&c.routes, true).unwrap();
        for path in ["/admin/x", "/ADMIN/x", "/Admin./x", "/admin%20"] {
            assert_eq!(name(&folding, path), "admin", "{path}");
        }
        assert_eq!(name(&sensitive, "/Admin/x"), "admin");
        assert_eq!(name(&sensitive, "/admin/x"), "public");
    }

    /// Segment-boundary prefix matching.
    #[test]
    fn prefix_table() {
        let cases = [
            ("/v1", "/v1", true),
            ("/v1", "/v1/", true),
            ("/v1", "/v1/users", true),
            ("/v1", "/v1x", false),
            ("/v1", "/v", false),
            ("/", "/anything", true),
            ("/v1/search", "/v1/search/q", true),
        ];
        for (i, (prefix, path, want)) in cases.into_iter().enumerate() {
            assert_eq!(prefix_matches(prefix, path), want, "case {i}");
        }
    }

    /// A route's `methods` take only those methods; another method falls through to the
    /// next candidate (longest prefix first), else no route.
    #[test]
    fn methods_fall_through_to_the_next_route() {
        let c = parse(
            "x.toml",
            r#"
[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["127.0.0.1:1"]
[[routes]]
name = "login"
path_prefix = "/v1/login"
methods = ["POST"]
upstreams = ["127.0.0.1:2"]
[[routes]]
name = "read-only"
path_prefix = "/docs"
methods = ["GET", "HEAD"]
upstreams = ["127.0.0.1:3"]
[[routes]]
name = "report"
path_prefix = "/v1/report"
methods = ["GET"]
upstreams = ["127.0.0.1:4"]
"#,
        )
        .unwrap();
        let r = Router::new(&c.routes, false).unwrap();
        let name = |method: http::Method, path: &str| {
            r.find(None, path, &method)
                .map(|e| e.route.name.to_string())
        };
        use http::Method;
        let rows = [
            (Method::POST, "/v1/login", Some("login")),
            (Method::GET, "/v1/login", Some("api")),
            (Method::PUT, "/v1/login/x", Some("api")),
            (Method::GET, "/docs/a", Some("read-only")),
            (Method::HEAD, "/docs", Some("read-only")),
            (Method::DELETE, "/docs/a", None),
            (Method::from_bytes(b"PURGE").unwrap(), "/docs/a", None),
            // A route taking GET takes HEAD: a HEAD does not fall through to `api`.
            (Method::GET, "/v1/report", Some("report")),
            (Method::HEAD, "/v1/report", Some("report")),
            (Method::POST, "/v1/report", Some("api")),
        ];
        for (method, path, want) in rows {
            assert_eq!(
                name(method.clone(), path).as_deref(),
                want,
                "{method} {path}"
            );
        }
    }

    /// A route naming the request's host beats every host-less one, whatever the prefix
    /// lengths; among routes of one kind the longest prefix wins.
    #[test]
    fn finds_most_specific_route() {
        let c = parse(
            "x.toml",
            r#"
[[routes]]
name = "root"
path_prefix = "/"
upstreams = ["127.0.0.1:1"]
auth = "none"
[[routes]]
name = "v1"
path_prefix = "/v1/"
upstreams = ["127.0.0.1:2"]
[[routes]]
name = "v1-acme"
path_prefix = "/v1"
host = "API.acme.test"
upstreams = ["127.0.0.1:3", "127.0.0.1:4"]
[[routes]]
name = "search"
path_prefix = "/v1/search"
upstreams = ["127.0.0.1:5"]
"#,
        )
        .unwrap();
        let r = Router::new(&c.routes, false).unwrap();
        let name = |host: Option<&str>, path: &str| {
            r.find(host, path, &http::Method::GET)
                .map(|e| e.route.name.to_string())
        };
        assert_eq!(name(None, "/v1/users").as_deref(), Some("v1"));
        assert_eq!(
            name(Some("api.acme.test"), "/v1/users").as_deref(),
            Some("v1-acme")
        );
        assert_eq!(name(Some("other.test"), "/v1/users").as_deref(), Some("v1"));
        // The host route wins over a longer host-less prefix (an internal site behind
        // `host` must not be reached through a public host-less route).
        assert_eq!(
            name(Some("api.acme.test"), "/v1/search/x").as_deref(),
            Some("v1-acme")
        );
        assert_eq!(name(None, "/v1/search/x").as_deref(), Some("search"));
        // No prefix of the host's routes matches: no route (the host-less ones are not
        // that virtual host's fallback, as with nginx server blocks).
        assert_eq!(name(Some("api.acme.test"), "/other"), None);
        assert_eq!(name(None, "/v1x").as_deref(), Some("root"));
        assert_eq!(name(None, "/").as_deref(), Some("root"));
    }
}
