//! Every table `throttle check` accepts is enforced: each table kind (`[limits.ip]`,
//! `[limits.global]`, a custom scope's `[limits.<name>]`, a tier's `key` and `tenant`
//! tables, a route's `ip`, `key`, `tenant`, `global` and custom-scope tables) crossed with
//! each scope-table key (every `per_*` window, `concurrent`, `ban`, `admission`,
//! `on_failure`, alone and beside a window). Each accepted combination limits a request
//! through the pipeline (a 429 for a window or for `concurrent`, a 403 once a `ban` is
//! struck); each refused one is a `throttle check` error positioned inside its table.

use std::sync::Arc;

use super::*;
use crate::clock::ManualClock;
use crate::limiter::Scope;
use crate::metrics::Metrics;
use crate::store::MemoryStore;

const NOW: u64 = 1_764_000_000_000;

/// Where the table under test sits.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Ip,
    Global,
    Custom,
    TierKey,
    TierTenant,
    Route(&'static str),
}

const KINDS: [Kind; 10] = [
    Kind::Ip,
    Kind::Global,
    Kind::Custom,
    Kind::TierKey,
    Kind::TierTenant,
    Kind::Route("ip"),
    Kind::Route("key"),
    Kind::Route("tenant"),
    Kind::Route("global"),
    Kind::Route("user"),
];

/// What a request meets once the table's limit is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limited {
    /// 429 by a rate window.
    Window,
    /// 429 `concurrent`.
    Concurrent,
    /// 429, then 403 once the ban is struck.
    Banned,
}

/// The key sets crossed with every kind, and what an accepted one does.
const KEYS: [(&str, Option<Limited>); 11] = [
    ("per_second = 2", Some(Limited::Window)),
    ("per_minute = 2", Some(Limited::Window)),
    ("per_hour = 2", Some(Limited::Window)),
    ("per_day = 2", Some(Limited::Window)),
    ("per_month = 2", Some(Limited::Window)),
    ("concurrent = 1", Some(Limited::Concurrent)),
    ("ban = { after = 1, within_secs = 60, for_secs = 60 }", None),
    ("admission = \"exact\"", None),
    ("on_failure = \"closed\"", None),
    (
        "per_minute = 2\nban = { after = 1, within_secs = 60, for_secs = 60 }",
        Some(Limited::Banned),
    ),
    (
        "per_minute = 2\nadmission = \"exact\"\non_failure = \"closed\"",
        Some(Limited::Window),
    ),
];

/// The config with `keys` in the table of `kind`; answers it and the table's line range.
fn config(kind: Kind, keys: &str) -> (String, std::ops::RangeInclusive<usize>) {
    let mut head = String::from("[scopes.user]\nfrom = \"header:X-User\"\n\n");
    let table = match kind {
        Kind::Ip => "[limits.ip]".to_string(),
        Kind::Global => "[limits.global]".to_string(),
        Kind::Custom => "[limits.user]".to_string(),
        Kind::TierKey => "[tiers.t.key]".to_string(),
        Kind::TierTenant => "[tiers.t.tenant]".to_string(),
        Kind::Route(scope) => format!("[routes.limits.{scope}]"),
    };
    let tier = match kind {
        Kind::TierKey | Kind::TierTenant => "",
        _ => "[tiers.t]\nmessage = \"m\"\n\n",
    };
    head.push_str(tier);
    let route = "[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:9\"]\n";
    let keys_section =
        "[[keys]]\nid = \"k1\"\nkey = \"good-key\"\ntenant = \"acme\"\ntier = \"t\"\n";
    let (before, after) = match kind {
        Kind::Route(_) => (format!("{head}{keys_section}\n{route}"), String::new()),
        _ => (head, format!("\n{route}\n{keys_section}")),
    };
    let first = before.lines().count() + 1;
    let last = first + keys.lines().count();
    (format!("{before}{table}\n{keys}\n{after}"), first..=last)
}

fn core(config: crate::config::Config) -> Core {
    let clock = Arc::new(ManualClock::at(NOW));
    let store = Arc::new(MemoryStore::with_clock(ManualClock::at(NOW)));
    Core::with_clock(
        Runtime::from_config(config).unwrap(),
        store,
        Arc::new(Metrics::new().unwrap()),
        clock,
    )
    .unwrap()
}

/// Admits requests, holding every admission, until one is refused (at most 5); answers
/// what refused it and what the next request meets.
async fn until_refused(core: &Core) -> Option<(Rejection, Rejection)> {
    let mut headers = http::HeaderMap::new();
    headers.insert("x-user", http::HeaderValue::from_static("alice"));
    let req = AdmitRequest {
        client_ip: "198.51.100.7".parse().unwrap(),
        target: Target::Match {
            host: None,
            path: "/x",
            method: &http::Method::GET,
        },
        key: crate::identity::validate_key(b"good-key"),
        cost: None,
        also_charge: None,
        origin: Origin::Proxy,
        attrs: Attrs {
            headers: Some(&headers),
            query: None,
        },
        skip: Skip::default(),
    };
    let mut held = Vec::new();
    for _ in 0..5 {
        match admit(core, &req).await {
            Ok(a) => held.push(a),
            Err(first) => {
                let next = admit(core, &req).await.err()?;
                return Some((first.rejection, next.rejection));
            }
        }
    }
    None
}

fn limited_as(first: &Rejection, next: &Rejection) -> Option<Limited> {
    match (first, next) {
        (Rejection::RateLimited { .. }, Rejection::Banned(_)) => Some(Limited::Banned),
        (Rejection::RateLimited { .. }, Rejection::RateLimited { .. }) => Some(Limited::Window),
        (Rejection::Concurrent { .. }, _) => Some(Limited::Concurrent),
        _ => None,
    }
}

/// The refusing scope's name: the table's own scope (`ip`, `api.key`, `user`, ...).
fn refused_scope(r: &Rejection) -> Option<Scope> {
    match r {
        Rejection::RateLimited { governing, .. } => Some(governing.scope),
        Rejection::Concurrent { full, .. } => Some(full.scope),
        _ => None,
    }
}

fn expected_scope(kind: Kind) -> String {
    match kind {
        Kind::Ip => "ip".into(),
        Kind::Global => "global".into(),
        Kind::Custom => "user".into(),
        Kind::TierKey => "key".into(),
        Kind::TierTenant => "tenant".into(),
        Kind::Route(s) => format!("api.{s}"),
    }
}

#[tokio::test]
async fn every_accepted_table_limits_a_request() {
    let mut accepted = 0;
    for kind in KINDS {
        for (keys, limits) in KEYS {
            let (src, lines) = config(kind, keys);
            let case = format!("{kind:?} with {keys:?}");
            let parsed = crate::config::parse("t.toml", &src);
            let config = match (parsed, limits) {
                (Ok(c), Some(_)) => c,
                (Err(e), _) => {
                    let (line, _) = e.position.unwrap_or_else(|| panic!("{case}: {e}"));
                    assert!(lines.contains(&line), "{case}: {e} not in {lines:?}\n{src}");
                    continue;
                }
                (Ok(_), None) => panic!("{case}: accepted a table that never limits\n{src}"),
            };
            let core = core(config);
            let (first, next) = until_refused(&core)
                .await
                .unwrap_or_else(|| panic!("{case}: never limited\n{src}"));
            assert_eq!(
                limited_as(&first, &next),
                limits,
                "{case}: {first:?} then {next:?}"
            );
            let scope = refused_scope(&first).map(|s| s.as_str().to_string());
            assert_eq!(scope, Some(expected_scope(kind)), "{case}: {first:?}");
            accepted += 1;
        }
    }
    // Refused by design beside the never-limiting tables: `concurrent` and `ban` on
    // `[limits.global]`, `ban` on a route's `global` table.
    assert_eq!(accepted, 77, "combinations accepted");
}
