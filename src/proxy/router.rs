//! Route matching (host + longest path prefix on a segment boundary) and upstream choice.

use std::sync::Arc;

use pingora::lb::selection::RoundRobin;
use pingora::lb::LoadBalancer;

use crate::config::Route;

/// The routes of one config, most specific first.
pub struct Router {
    routes: Vec<Arc<RouteEntry>>,
}

/// A route and its upstream set.
pub struct RouteEntry {
    /// The route.
    pub route: Route,
    /// Round-robin over the route's upstreams.
    pub upstreams: LoadBalancer<RoundRobin>,
}

// === impl Router ===

impl Router {
    /// Builds the router; longer prefixes first, host-specific before host-less.
    ///
    /// # Errors
    /// When an upstream set cannot be built.
    pub fn new(routes: &[Route]) -> std::io::Result<Self> {
        let mut out = Vec::with_capacity(routes.len());
        for r in routes {
            let upstreams = LoadBalancer::try_from_iter(r.upstreams.iter().copied())?;
            out.push(Arc::new(RouteEntry {
                route: r.clone(),
                upstreams,
            }));
        }
        out.sort_by_key(|e| {
            (
                std::cmp::Reverse(e.route.path_prefix.len()),
                e.route.host.is_none(),
            )
        });
        Ok(Self { routes: out })
    }

    /// The route named `name`.
    pub fn find_by_name(&self, name: &str) -> Option<&Arc<RouteEntry>> {
        self.routes.iter().find(|e| &*e.route.name == name)
    }

    /// The route for `host` (any case, port ignored) and `path`.
    pub fn find(&self, host: Option<&[u8]>, path: &str) -> Option<&Arc<RouteEntry>> {
        let host = host.map(strip_port);
        self.routes.iter().find(|e| {
            let host_ok = match (&e.route.host, host) {
                (None, _) => true,
                (Some(want), Some(got)) => want.as_bytes().eq_ignore_ascii_case(got),
                (Some(_), None) => false,
            };
            host_ok && prefix_matches(&e.route.path_prefix, path)
        })
    }
}

/// `/v1` matches `/v1`, `/v1/` and `/v1/x`, never `/v1x`; `/` matches everything.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/') || rest.starts_with('?'))
}

fn strip_port(host: &[u8]) -> &[u8] {
    if host.first() == Some(&b'[') {
        // [v6]:port
        return host
            .iter()
            .position(|b| *b == b']')
            .map_or(host, |i| &host[..=i]);
    }
    match host.iter().rposition(|b| *b == b':') {
        Some(i) => &host[..i],
        None => host,
    }
}

/// Whether `path` holds a dot segment (`.` / `..`, raw or percent-encoded) or a
/// backslash: an upstream that normalizes it could see a different route than we
/// matched, so such paths are refused instead of guessed at.
pub fn is_ambiguous_path(path: &str) -> bool {
    if path.contains('\\') || path.contains("%5c") || path.contains("%5C") {
        return true;
    }
    path.split('/').any(is_dot_segment)
}

/// `.` or `..`, each dot possibly written `%2e`.
fn is_dot_segment(seg: &str) -> bool {
    let b = seg.as_bytes();
    let (mut i, mut dots) = (0, 0);
    while i < b.len() {
        if b[i] == b'.' {
            i += 1;
        } else if b.len() - i >= 3 && b[i] == b'%' && b[i + 1] == b'2' && (b[i + 2] | 0x20) == b'e'
        {
            i += 3;
        } else {
            return false;
        }
        dots += 1;
    }
    (1..=2).contains(&dots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

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

    /// Longest prefix wins; a host-specific route beats a host-less one; ports ignored.
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
        let r = Router::new(&c.routes).unwrap();
        let name = |host: Option<&str>, path: &str| {
            r.find(host.map(str::as_bytes), path)
                .map(|e| e.route.name.to_string())
        };
        assert_eq!(name(None, "/v1/users").as_deref(), Some("v1"));
        assert_eq!(
            name(Some("api.acme.test:8080"), "/v1/users").as_deref(),
            Some("v1-acme")
        );
        assert_eq!(name(Some("other.test"), "/v1/users").as_deref(), Some("v1"));
        assert_eq!(
            name(Some("api.acme.test"), "/v1/search/x").as_deref(),
            Some("search")
        );
        assert_eq!(name(None, "/v1x").as_deref(), Some("root"));
        assert_eq!(name(None, "/").as_deref(), Some("root"));
    }

    /// Dot segments and backslashes are ambiguous; ordinary dots are not.
    #[test]
    fn flags_ambiguous_paths() {
        for p in [
            "/public/../v1",
            "/a/./b",
            "/a/%2e%2E/b",
            "/a\\b",
            "/a/%5Cb",
            "/..",
        ] {
            assert!(is_ambiguous_path(p), "{p}");
        }
        for p in ["/v1/file.json", "/v1/...x", "/", "/a.b/c"] {
            assert!(!is_ambiguous_path(p), "{p}");
        }
    }
}
