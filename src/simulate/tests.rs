//! The simulator against hand computations (one trace per algorithm), the gateway's own
//! decision counters, and every way a trace line can be unreadable.

use std::collections::BTreeMap;

use super::*;
use crate::config;

/// A minute- and hour-aligned instant (2025-11-24T16:00:00Z).
const T0: u64 = 1_764_000_000_000;

const ROUTES: &str = r#"
[[routes]]
name = "api"
path_prefix = "/v1"
upstreams = ["127.0.0.1:1"]
auth = "required"

[[routes]]
name = "public"
path_prefix = "/public"
upstreams = ["127.0.0.1:1"]
auth = "none"

[[keys]]
id = "k1"
key = "key-one"
tenant = "acme"
tier = "free"

[[keys]]
id = "k2"
key = "key-two"
tenant = "acme"
tier = "free"

[[keys]]
id = "k3"
key = "key-three"
tenant = "globex"
tier = "free"
"#;

fn cfg(limits: &str) -> Config {
    config::parse("test.toml", &format!("{limits}\n{ROUTES}")).unwrap()
}

/// A trace of (ms after T0, ip, api_key, path) rows.
fn trace(rows: &[(u64, &str, &str, &str)]) -> String {
    let mut s = String::from("time,ip,api_key,path\n");
    for (at, ip, key, path) in rows {
        s.push_str(&format!("{},{ip},{key},{path}\n", T0 + at));
    }
    s
}

fn run_ok(config: &Config, trace: &str) -> Report {
    simulate(config, trace.as_bytes()).unwrap()
}

/// `key-one` on /v1 at each of `secs` (seconds after T0).
fn key_one_at(secs: &[f64]) -> String {
    let rows: Vec<_> = secs
        .iter()
        .map(|s| ((s * 1000.0) as u64, "198.51.100.1", "key-one", "/v1/x"))
        .collect();
    trace(&rows)
}

fn counts(allowed: u64, rejected: u64) -> Counts {
    Counts {
        allowed,
        rejected,
        shadow_rejected: 0,
    }
}

/// `(allowed, rejected)` of the key scope after replaying `secs` under `[tiers.free] key`.
fn key_scope(key_limits: &str, secs: &[f64]) -> Counts {
    let c = cfg(&format!("[tiers.free]\nkey = {{ {key_limits} }}\n"));
    run_ok(&c, &key_one_at(secs)).scopes.get(Scope::Key)
}

/// Token bucket, 3/min (1 token per 20 s): 0, 1, 2 s take the 3 tokens; 3 and 4 s find
/// 0.15 and 0.2; 25 s finds 0.2 + 21 x 0.05 = 1.25 (admitted); 26 s finds 0.3.
#[test]
fn token_bucket_matches_hand_computation() {
    let c = key_scope("per_minute = 3", &[0.0, 1.0, 2.0, 3.0, 4.0, 25.0, 26.0]);
    assert_eq!(c, counts(4, 3));
}

/// Fixed window, 3/min: 3 in the last second of a minute, a 4th rejected, then 3 more at
/// the boundary (the 2x spike) and a 7th rejected.
#[test]
fn fixed_window_matches_hand_computation() {
    let limits = r#"per_minute = 3, algorithm = "fixed_window""#;
    let c = key_scope(limits, &[59.0, 59.5, 59.9, 59.95, 60.0, 60.1, 60.2, 60.3]);
    assert_eq!(c, counts(6, 2));
}

/// Sliding-window counter, 4/min: 4 in minute 0 and a 5th rejected; at 90 s the previous
/// minute weighs 4 x 30/60 = 2, so 2 more fit and a 3rd is rejected.
#[test]
fn sliding_window_matches_hand_computation() {
    let limits = r#"per_minute = 4, algorithm = "sliding_window""#;
    let c = key_scope(limits, &[0.0, 1.0, 2.0, 3.0, 30.0, 90.0, 90.0, 90.0]);
    assert_eq!(c, counts(6, 2));
}

/// Sliding log, 2/min: 0 and 10 s admitted, 20 s rejected, 61 s admitted (the 0 s entry
/// left the window at 60 s), 62 s rejected (10 s and 61 s are live).
#[test]
fn sliding_log_matches_hand_computation() {
    let limits = r#"per_minute = 2, algorithm = "sliding_log""#;
    let c = key_scope(limits, &[0.0, 10.0, 20.0, 61.0, 62.0]);
    assert_eq!(c, counts(3, 2));
}

/// Leaky bucket, 3/min (drains 1 per 20 s): three at 0 s fill it, a 4th overflows; at
/// 20 s one has drained (admitted, full again); at 21 s 0.05 has drained (rejected).
#[test]
fn leaky_bucket_matches_hand_computation() {
    let limits = r#"per_minute = 3, algorithm = "leaky_bucket""#;
    let c = key_scope(limits, &[0.0, 0.0, 0.0, 0.0, 20.0, 21.0]);
    assert_eq!(c, counts(4, 2));
}

/// Scopes count like `throttle_decisions_total`: a pass for every scope checked, a 429
/// for the rejecting scope alone; tenants count their keys' requests.
#[test]
fn rejection_counts_for_the_rejecting_scope_and_the_tenant() {
    let c = cfg(r#"
[limits.ip]
per_minute = 4
[limits.global]
per_minute = 100
[tiers.free]
key = { per_minute = 2 }
tenant = { per_minute = 3 }
"#);
    let t = trace(&[
        (0, "10.0.0.1", "key-one", "/v1/a"),   // allowed
        (1, "10.0.0.1", "key-one", "/v1/a"),   // allowed
        (2, "10.0.0.1", "key-one", "/v1/a"),   // 429 key
        (3, "10.0.0.2", "key-two", "/v1/a"),   // allowed (acme's 3rd)
        (4, "10.0.0.2", "key-two", "/v1/a"),   // 429 tenant
        (5, "10.0.0.1", "key-three", "/v1/a"), // allowed (ip's 3rd)
        (6, "10.0.0.1", "", "/public/a"),      // allowed (ip's 4th)
        (7, "10.0.0.1", "key-three", "/v1/a"), // 429 ip
    ]);
    let r = run_ok(&c, &t);
    assert_eq!((r.requests, r.allowed, r.rejected), (8, 5, 3));
    assert_eq!(r.scopes.get(Scope::Ip), counts(5, 1));
    assert_eq!(r.scopes.get(Scope::Key), counts(4, 1));
    assert_eq!(r.scopes.get(Scope::Tenant), counts(4, 1));
    assert_eq!(r.scopes.get(Scope::Global), counts(5, 0));
    assert_eq!(r.tenants["acme"], counts(3, 2));
    assert_eq!(r.tenants["globex"], counts(1, 1));
    assert_eq!(r.refused_total(), 0);
}

/// The report's scope counts are the replayed pipeline's own
/// `throttle_decisions_total{decision="allowed|rejected|shadow_rejected"}`.
#[test]
fn scope_counts_equal_the_pipelines_decision_metrics() {
    let c = cfg(r#"
[limits.ip]
per_minute = 5
[limits.auth]
per_minute = 1
[limits.global]
per_minute = 9
[tiers.free]
key = { per_minute = 3 }
tenant = { per_minute = 4 }
"#);
    let mut rows = Vec::new();
    let keys = ["key-one", "key-two", "key-three", "", "nope"];
    let paths = ["/v1/a", "/public/b", "/nowhere"];
    for i in 0..120u64 {
        let ip = ["10.0.0.1", "10.0.0.2", "10.0.0.3"][(i % 3) as usize];
        rows.push((
            i * 700,
            ip,
            keys[(i % 5) as usize],
            paths[(i % 7 % 3) as usize],
        ));
    }
    let (r, replay) = run(&c, trace(&rows).as_bytes()).unwrap();
    let metrics = String::from_utf8(replay.core.metrics.render()).unwrap();
    for scope in Scope::ALL {
        let counts = r.scopes.get(scope);
        for (decision, n) in [
            ("allowed", counts.allowed),
            ("rejected", counts.rejected),
            ("shadow_rejected", counts.shadow_rejected),
        ] {
            let series = format!(
                "throttle_decisions_total{{decision=\"{decision}\",scope=\"{}\"}} {n}\n",
                scope.as_str()
            );
            assert!(metrics.contains(&series), "{series} not in\n{metrics}");
        }
    }
    assert!(
        r.rejected > 0 && r.refused_total() > 0 && r.allowed > 0,
        "{r:?}"
    );
}

/// Refusals are counted by the `error` the gateway answers; a 404 still passed (and
/// counts for) the ip limit; an IP block answers before a malformed path.
#[test]
fn refusals_are_counted_by_name() {
    let c = cfg(r#"
[limits.ip]
per_minute = 100
[tiers.free]
key = { per_minute = 100 }
tenant = { per_minute = 100 }
[[blocks]]
scope = "ip"
value = "203.0.113.0/24"
[[blocks]]
scope = "key"
value = "k2"
[[blocks]]
scope = "tenant"
value = "globex"
"#);
    let t = trace(&[
        (0, "10.0.0.1", "", "/v1/a"),
        (1, "10.0.0.1", "wrong", "/v1/a"),
        (2, "10.0.0.1", "key two", "/v1/a"), // not a key a client could send
        (3, "203.0.113.5", "key-one", "/v1/a"),
        (4, "10.0.0.1", "key-two", "/v1/a"),
        (5, "10.0.0.1", "key-three", "/v1/a"),
        (6, "10.0.0.1", "key-one", "/nowhere"),
        (7, "10.0.0.1", "key-one", "/v1/../admin"),
        (8, "203.0.113.5", "key-one", "/v1/../admin"),
        (9, "10.0.0.1", "key-one", "/v1/a"),
    ]);
    let r = run_ok(&c, &t);
    let want: BTreeMap<&str, u64> = [
        ("missing_api_key", 1),
        ("invalid_api_key", 2),
        ("blocked_ip", 2),
        ("blocked_key", 1),
        ("blocked_tenant", 1),
        ("no_route", 1),
        ("invalid_path", 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(r.refused, want);
    assert_eq!((r.requests, r.allowed, r.rejected), (10, 1, 0));
    assert_eq!(r.scopes.get(Scope::Ip), counts(2, 0)); // the 404 and the admitted one
    assert_eq!(r.tenants.len(), 1);
}

/// A `key_id` row decides as a row presenting that key; an unknown id is an invalid key.
#[test]
fn key_id_rows_decide_like_api_key_rows() {
    let c = cfg("[tiers.free]\nkey = { per_minute = 2 }\ntenant = { per_minute = 100 }\n");
    let by_key = key_one_at(&[0.0, 1.0, 2.0, 3.0]);
    let by_id = by_key.replace("api_key", "key_id").replace("key-one", "k1");
    let a = run_ok(&c, &by_key);
    let b = run_ok(&c, &by_id);
    assert_eq!(a, b);
    assert_eq!(a.tenants["acme"], counts(2, 2));
    let unknown = run_ok(&c, &by_id.replace(",k1,", ",k9,"));
    assert_eq!(unknown.refused["invalid_api_key"], 4);
}

/// A `cost` cell overrides the route's cost; an empty one keeps it.
#[test]
fn cost_column_overrides_the_route_cost() {
    let c = cfg("[tiers.free]\nkey = { per_minute = 11 }\ntenant = { per_minute = 100 }\n");
    let t = format!(
        "time,ip,api_key,path,cost\n{T0},10.0.0.1,key-one,/v1/a,6\n{T0},10.0.0.1,key-one,/v1/a,4\n{T0},10.0.0.1,key-one,/v1/a,5\n{T0},10.0.0.1,key-one,/v1/a,\n"
    );
    let r = run_ok(&c, &t);
    assert_eq!(r.scopes.get(Scope::Key), counts(3, 1)); // 6 + 4 + 1 of 11; the 5 did not fit
}

/// Rows out of time order are replayed in time order (rows of one instant in file order).
#[test]
fn rows_are_replayed_in_time_order() {
    let c = cfg(r#"
[tiers.free]
key = { per_minute = 2, algorithm = "fixed_window" }
tenant = { per_minute = 100 }
"#);
    // Sorted, minute 0 (1, 2, 3 s) admits two and rejects one, and so does minute 1.
    let t = trace(&[
        (61_000, "10.0.0.1", "key-one", "/v1/a"),
        (1_000, "10.0.0.1", "key-one", "/v1/a"),
        (62_000, "10.0.0.1", "key-one", "/v1/a"),
        (2_000, "10.0.0.1", "key-one", "/v1/a"),
        (63_000, "10.0.0.1", "key-one", "/v1/a"),
        (3_000, "10.0.0.1", "key-one", "/v1/a"),
    ]);
    let r = run_ok(&c, &t);
    assert_eq!(r.scopes.get(Scope::Key), counts(4, 2));
    assert_eq!(r.span_ms, Some((T0 + 1_000, T0 + 63_000)));
}

/// A shadow-mode route admits every request and counts its would-be rejections.
#[test]
fn shadow_route_counts_would_be_rejections() {
    let src = format!(
        "[tiers.free]\nkey = {{ per_minute = 1 }}\ntenant = {{ per_minute = 100 }}\n{ROUTES}\n[[routes]]\nname = \"shadow\"\npath_prefix = \"/shadow\"\nupstreams = [\"127.0.0.1:1\"]\nauth = \"required\"\nmode = \"shadow\"\n"
    );
    let c = config::parse("test.toml", &src).unwrap();
    let t = trace(&[
        (0, "10.0.0.1", "key-one", "/shadow/a"),
        (1, "10.0.0.1", "key-one", "/shadow/a"),
        (2, "10.0.0.1", "key-one", "/shadow/a"),
    ]);
    let r = run_ok(&c, &t);
    assert_eq!((r.allowed, r.rejected, r.shadow_rejected), (3, 0, 2));
    let key = r.scopes.get(Scope::Key);
    assert_eq!((key.allowed, key.shadow_rejected), (1, 2));
    assert_eq!(r.tenants["acme"].shadow_rejected, 2);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["scopes"]["key"]["shadow_rejected"], 2);
    assert!(json["scopes"]["ip"].is_null());
}

/// `host` routes like the proxy: case, port and a trailing dot do not matter; a row
/// without a host matches only routes without one; a malformed host is `invalid_host`.
#[test]
fn host_is_routed_like_the_proxy() {
    let src = format!(
        "{ROUTES}\n[[routes]]\nname = \"admin\"\nhost = \"admin.example.com\"\npath_prefix = \"/admin\"\nupstreams = [\"127.0.0.1:1\"]\nauth = \"none\"\n"
    );
    let c = config::parse(
        "test.toml",
        &format!("[tiers.free]\nkey = {{ per_minute = 5 }}\n{src}"),
    )
    .unwrap();
    let t = format!(
        "time,ip,path,host\n{T0},10.0.0.1,/admin/x,Admin.Example.COM.:8443\n{T0},10.0.0.1,/admin/x,\n{T0},10.0.0.1,/admin/x,other.example.com\n{T0},10.0.0.1,/admin/x,bad host\n"
    );
    let r = run_ok(&c, &t);
    assert_eq!(r.allowed, 1);
    assert_eq!(r.refused["no_route"], 2);
    assert_eq!(r.refused["invalid_host"], 1);
}

/// Failed key lookups count against `[limits.auth]`: past it, a 429 for scope `auth`.
#[test]
fn failed_lookups_meet_the_auth_limit() {
    let c = cfg("[limits.auth]\nper_minute = 2\n[tiers.free]\nkey = { per_minute = 5 }\n");
    let t = trace(&[
        (0, "10.0.0.1", "bad-1", "/v1/a"),
        (1, "10.0.0.1", "bad-2", "/v1/a"),
        (2, "10.0.0.1", "bad-3", "/v1/a"),
        (3, "10.0.0.1", "key-one", "/v1/a"),
    ]);
    let r = run_ok(&c, &t);
    assert_eq!(r.refused["invalid_api_key"], 2);
    assert_eq!(r.scopes.get(Scope::Auth), counts(0, 2));
    assert_eq!(r.tenants["acme"], counts(0, 1)); // a valid key, refused all the same
}

/// A Redis config is simulated on the same limits, not divided by its instances.
#[test]
fn redis_config_is_simulated_on_the_whole_limits() {
    let limits = "[tiers.free]\nkey = { per_minute = 4 }\ntenant = { per_minute = 100 }\n";
    let redis = format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\ninstances = 4\non_failure = \"local\"\n{limits}"
    );
    let secs: Vec<f64> = (0..10).map(f64::from).collect();
    let t = key_one_at(&secs);
    let a = run_ok(&cfg(limits), &t);
    let b = run_ok(&cfg(&redis), &t);
    assert_eq!(a, b);
    assert_eq!(a.scopes.get(Scope::Key), counts(4, 6));
}

/// Both time formats are read; RFC 3339 keeps milliseconds and offsets.
#[test]
fn reads_rfc3339_and_unix_milliseconds() {
    let rows = trace::read(
        "time,ip,path\n2025-11-24T16:00:00.250Z,10.0.0.1,/a\n2025-11-24T17:00:00+01:00,::1,/b?q=1\n1764000000000,10.0.0.1,/c\n"
            .as_bytes(),
    )
    .unwrap();
    let times: Vec<u64> = rows.iter().map(|r| r.time_ms).collect();
    assert_eq!(times, [T0 + 250, T0, T0]);
    assert_eq!(rows[1].path, "/b");
    assert_eq!(rows[2].line, 4);
}

/// Every unreadable line is named, the header being line 1.
#[test]
fn unreadable_lines_are_named() {
    let ok = format!("{T0},10.0.0.1,key-one,/v1/a");
    let cases: &[(&str, u64, &str)] = &[
        ("", 1, "no \"time\" column"),
        ("time,ip,apikey,path\n", 1, "unknown column \"apikey\""),
        ("time,ip,path,ip\n", 1, "column \"ip\" appears twice"),
        ("ip,path\n", 1, "no \"time\" column"),
        (
            "time,ip,api_key,path\n{ok}\n{ok},5\n",
            3,
            "5 fields, but the header has 4",
        ),
        (
            "time,ip,api_key,path\n{ok}\nyesterday,10.0.0.1,,/a\n",
            3,
            "invalid time \"yesterday\"",
        ),
        (
            "time,ip,api_key,path\n1764000000,10.0.0.1,,/a\n",
            2,
            "looks like Unix seconds",
        ),
        (
            "time,ip,api_key,path\n2025-11-24T16:00:00,10.0.0.1,,/a\n",
            2,
            "invalid time",
        ),
        (
            "time,ip,api_key,path\n{ok}\n\n{T0},10.0.0.999,,/a\n",
            4,
            "invalid ip \"10.0.0.999\"",
        ),
        ("time,ip,api_key,path\n{T0},10.0.0.1,,\n", 2, "empty path"),
        (
            "time,ip,api_key,key_id,path\n{T0},10.0.0.1,a,k1,/a\n",
            2,
            "both api_key and key_id",
        ),
        (
            "time,ip,path,cost\n{T0},10.0.0.1,/a,0\n",
            2,
            "invalid cost \"0\"",
        ),
        (
            "time,ip,path,cost\n{T0},10.0.0.1,/a,-1\n",
            2,
            "invalid cost \"-1\"",
        ),
        (
            "time,ip,path\n{T0},10.0.0.1,\"/a\nb\"\n{T0},x,/a\n",
            4,
            "invalid ip \"x\"",
        ),
    ];
    let c = cfg("[tiers.free]\nkey = { per_minute = 5 }\n");
    for (src, line, reason) in cases {
        let src = src.replace("{ok}", &ok).replace("{T0}", &T0.to_string());
        match simulate(&c, src.as_bytes()) {
            Err(SimError::Line { line: l, reason: r }) => {
                assert_eq!(l, *line, "{src:?}: {r}");
                assert!(r.contains(reason), "{src:?}: {r}");
            }
            other => panic!("{src:?}: {other:?}"),
        }
    }
}

/// Invalid UTF-8 names its line too.
#[test]
fn invalid_utf8_names_its_line() {
    let mut src = format!("time,ip,path\n{T0},10.0.0.1,/a\n").into_bytes();
    src.extend_from_slice(format!("{T0},10.0.0.1,/").as_bytes());
    src.extend_from_slice(b"\xff\n");
    match simulate(&cfg("[tiers.free]\nkey = { per_minute = 5 }\n"), &src[..]) {
        Err(SimError::Line { line, reason }) => {
            assert_eq!((line, reason.as_str()), (3, "not valid UTF-8"))
        }
        other => panic!("{other:?}"),
    }
}

/// The table for people lists totals, scopes, tenants and refusals.
#[test]
fn table_lists_scopes_tenants_and_refusals() {
    let c = cfg("[tiers.free]\nkey = { per_minute = 1 }\n");
    let t = trace(&[
        (0, "10.0.0.1", "key-one", "/v1/a"),
        (1_000, "10.0.0.1", "key-one", "/v1/a"),
        (2_000, "10.0.0.1", "nope", "/v1/a"),
    ]);
    let text = run_ok(&c, &t).to_string();
    let want = "3 requests, 2025-11-24T16:00:00Z to 2025-11-24T16:00:02Z: 1 allowed, 1 rejected (429), 1 refused\n\
\n\
scope   allowed  rejected\n\
key           1         1\n\
\n\
tenant   allowed  rejected\n\
acme           1         1\n\
\n\
refused\n\
invalid_api_key         1\n";
    assert_eq!(text, want);
}

/// Rows are read one at a time: a reader that never ends still yields its first rows
/// (reading the whole trace first would never return).
#[test]
fn rows_stream_from_an_endless_reader() {
    struct Endless {
        header: bool,
        n: u64,
        pending: Vec<u8>,
    }
    impl std::io::Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.pending.is_empty() {
                self.pending = if self.header {
                    self.header = false;
                    b"time,ip,path\n".to_vec()
                } else {
                    self.n += 1;
                    format!("{},10.0.0.1,/a\n", T0 + self.n).into_bytes()
                };
            }
            let n = buf.len().min(self.pending.len());
            buf[..n].copy_from_slice(&self.pending[..n]);
            self.pending.drain(..n);
            Ok(n)
        }
    }
    let endless = Endless {
        header: true,
        n: 0,
        pending: Vec::new(),
    };
    let rows: Vec<Row> = trace::Rows::new(endless)
        .unwrap()
        .take(3)
        .collect::<Result<_, _>>()
        .unwrap();
    let lines: Vec<u64> = rows.iter().map(|r| r.line).collect();
    assert_eq!(lines, [2, 3, 4]);
}

/// Times past year 9999 are refused (window arithmetic would leave u64), and a row
/// earlier than one already replayed (beyond the reorder window) is named, not
/// silently replayed out of order.
#[test]
fn times_out_of_range_or_order_are_named() {
    let late = format!("time,ip,path\n{},10.0.0.1,/a\n", u64::MAX - 5);
    let e = trace::read(late.as_bytes()).unwrap_err().to_string();
    assert!(e.contains("line 2") && e.contains("out of range"), "{e}");
    let mut trace = String::from("time,ip,path\n");
    for i in 0..=REORDER as u64 + 1 {
        trace.push_str(&format!("{},10.0.0.1,/a\n", T0 + 1000 + i));
    }
    trace.push_str(&format!("{T0},10.0.0.1,/a\n"));
    let cfg = config::parse(
        "x.toml",
        "[[routes]]\nname = \"a\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\nauth = \"none\"\n",
    )
    .unwrap();
    let e = simulate(&cfg, trace.as_bytes()).unwrap_err().to_string();
    let line = REORDER + 4;
    assert!(
        e.contains(&format!("line {line}")) && e.contains("sort the trace"),
        "{e}"
    );
    // Within the window, disorder is sorted out.
    let small = format!("time,ip,path\n{},10.0.0.1,/a\n{T0},10.0.0.1,/a\n", T0 + 5);
    assert_eq!(simulate(&cfg, small.as_bytes()).unwrap().requests, 2);
}

/// Custom scopes replay from the trace's `header:<Name>` and `query` columns (and the
/// query part of `path`), route tables count their route alone, and each is reported
/// under its own name.
#[test]
fn custom_scopes_and_route_tables_replay() {
    let c = config::parse(
        "test.toml",
        r#"
[scopes.user]
from = "header:X-User"
[scopes.org]
from = "query:org"
[limits.user]
per_minute = 2
[limits.org]
per_minute = 1

[[routes]]
name = "login"
path_prefix = "/login"
upstreams = ["127.0.0.1:1"]
auth = "none"
limits = { ip = { per_minute = 1 } }

[[routes]]
name = "public"
path_prefix = "/"
upstreams = ["127.0.0.1:1"]
auth = "none"
"#,
    )
    .unwrap();
    let rows = [
        (0, "/a", "alice", ""),     // allowed
        (1, "/a", "alice", ""),     // allowed
        (2, "/a", "alice", ""),     // 429 user
        (3, "/a", "bob", ""),       // allowed: bob's own bucket
        (4, "/a", "", ""),          // allowed: no user, no shared bucket
        (5, "/a", "", "acme"),      // allowed
        (6, "/a?org=acme", "", ""), // 429 org (from the path's query)
        (7, "/login", "", ""),      // allowed
        (8, "/login", "", ""),      // 429 login.ip
    ];
    let mut t = String::from("time,ip,path,header:X-User,query\n");
    for (at, path, user, org) in rows {
        let query = if org.is_empty() {
            String::new()
        } else {
            format!("org={org}")
        };
        t.push_str(&format!("{},10.0.0.1,{path},{user},{query}\n", T0 + at));
    }
    let r = run_ok(&c, &t);
    assert_eq!((r.requests, r.allowed, r.rejected), (9, 6, 3));
    let by_name: BTreeMap<&str, Counts> = r.scopes.iter().collect();
    assert_eq!(by_name["user"], counts(3, 1), "{by_name:?}");
    assert_eq!(by_name["org"], counts(1, 1), "{by_name:?}");
    assert_eq!(by_name["login.ip"], counts(1, 1), "{by_name:?}");
}

/// The `status` column drives `count_on` (a failed-login table of 2 counts only the
/// 401s: three 200s and two 401s pass, the third 401 is refused) and the `bytes`
/// column a `cost_from` route (cost 100 reserved, 50 bytes settled each: four fit in
/// 250, the fifth does not).
#[test]
fn status_and_bytes_columns_settle() {
    let c = config::parse(
        "t.toml",
        r#"
[[routes]]
name = "login"
path_prefix = "/login"
upstreams = ["127.0.0.1:1"]
auth = "none"
[routes.limits.ip]
per_hour = 2
count_on = ["401"]

[[routes]]
name = "files"
path_prefix = "/files"
upstreams = ["127.0.0.1:1"]
auth = "none"
cost = 100
cost_from = "response_bytes"
[routes.limits.ip]
per_hour = 250
"#,
    )
    .unwrap();
    let mut t = String::from("time,ip,path,status,bytes\n");
    for (i, status) in [200, 200, 200, 401, 401, 401].into_iter().enumerate() {
        t.push_str(&format!("{},192.0.2.1,/login,{status},\n", T0 + i as u64));
    }
    let r = run_ok(&c, &t);
    assert_eq!((r.allowed, r.rejected), (5, 1));
    let mut t = String::from("time,ip,path,status,bytes\n");
    for i in 0..5 {
        t.push_str(&format!("{},192.0.2.2,/files,,50\n", T0 + i));
    }
    let r = run_ok(&c, &t);
    assert_eq!((r.allowed, r.rejected), (4, 1));
    let bad = "time,ip,path,status\n1764000000000,192.0.2.1,/login,600\n";
    assert!(simulate(&c, bad.as_bytes()).is_err());
}
