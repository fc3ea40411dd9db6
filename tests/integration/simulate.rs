//! `throttle simulate` as a user runs it (the fixture trace, `--json`, errors naming
//! `FILE:LINE`), and against a real gateway: for each algorithm, a trace sent to the
//! binary on the memory store at the trace's own pace gets, request by request, the
//! statuses the simulator predicts for the times the requests were actually sent.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};
use throttle::clock::{Clock, SystemClock};
use throttle::config::{self, Config};
use throttle::limiter::Scope;
use throttle::simulate::{simulate, Counts};
use tokio::time::Instant;

use crate::support::{client, Gateway, Upstream};

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/simulate");
    path.join(name).to_str().unwrap().to_string()
}

fn throttle_simulate(config: &str, trace: &str, json: bool) -> Output {
    let mut args = vec!["simulate", "--config", config, "--trace", trace];
    if json {
        args.push("--json");
    }
    Command::new(env!("CARGO_BIN_EXE_throttle"))
        .args(args)
        .output()
        .unwrap()
}

/// stdout of a run that must succeed.
fn stdout_ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr, "");
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Whether `table` has a line of exactly these cells (any spacing).
fn has_row(table: &str, cells: &[&str]) -> bool {
    table
        .lines()
        .any(|l| l.split_whitespace().eq(cells.iter().copied()))
}

/// The table for people, for the book's example (docs/src/features/simulate.md): the config in production and the
/// candidate that cuts the free tier from 10 to 5 per minute.
#[test]
fn prints_the_table_for_the_fixture_trace() {
    let trace = fixture("trace.csv");
    let now = stdout_ok(&throttle_simulate(&fixture("gateway.toml"), &trace, false));
    let span = "13 requests, 2026-03-02T10:00:00Z to 2026-03-02T10:00:14Z";
    assert!(
        now.starts_with(&format!(
            "{span}: 12 allowed, 0 rejected (429), 1 refused\n"
        )),
        "{now}"
    );
    for row in [
        &["scope", "allowed", "rejected"][..],
        &["key", "11", "0"],
        &["acme", "8", "0"],
        &["invalid_api_key", "1"],
    ] {
        assert!(has_row(&now, row), "{row:?} in\n{now}");
    }
    let cut = stdout_ok(&throttle_simulate(
        &fixture("candidate.toml"),
        &trace,
        false,
    ));
    assert!(
        cut.starts_with(&format!(
            "{span}: 10 allowed, 2 rejected (429), 1 refused\n"
        )),
        "{cut}"
    );
    for row in [
        &["key", "9", "2"][..],
        &["acme", "6", "2"],
        &["globex", "3", "0"],
    ] {
        assert!(has_row(&cut, row), "{row:?} in\n{cut}");
    }
}

/// `--json` is one object with the numbers a hand computation gives.
///
/// The trace: acme (key_acme, free tier) at 0, 2, 4, ..., 14 s (8 requests); globex
/// (key_globex, pro, 100/min) at 1, 5, 9 s (3); an anonymous request to the public route
/// at 3 s; an unknown key id at 7 s, refused `invalid_api_key` before any limit (no scope
/// counts it). Per-minute windows default to the token bucket.
///
/// gateway.toml, free key 10/min: acme's 8 requests fit a full bucket of 10. Scopes: ip
/// 8 + 3 + 1 = 12 allowed; key and tenant 8 + 3 = 11 allowed.
///
/// candidate.toml, free key 5/min: the bucket holds 5 and refills 1 per 12 s. Tokens
/// left: 0 s: 4; 2 s: 4 + 1/6 - 1 = 3.17; 4 s: 2.33; 6 s: 1.5; 8 s: 0.67; 10 s: 0.83,
/// short of 1: 429; 12 s: 0.67 + 4 s x 5/60 = exactly 1: admitted (0 left); 14 s: 0.17:
/// 429. acme: 6 allowed, 2 rejected (by the key scope, which the ip scope passed but is
/// not charged for a 429); ip 10, key 9 + 2 rejected, tenant 9.
#[test]
fn json_equals_the_hand_computation() {
    let trace = fixture("trace.csv");
    let run = |config: &str| -> Value {
        let out = throttle_simulate(&fixture(config), &trace, true);
        serde_json::from_str(&stdout_ok(&out)).unwrap()
    };
    let c = |allowed: u64, rejected: u64| json!({"allowed": allowed, "rejected": rejected});
    assert_eq!(
        run("gateway.toml"),
        json!({
            "scopes": {"ip": c(12, 0), "key": c(11, 0), "tenant": c(11, 0)},
            "tenants": {"acme": c(8, 0), "globex": c(3, 0)},
            "requests": 13, "allowed": 12, "rejected": 0,
            "refused": {"invalid_api_key": 1},
        })
    );
    assert_eq!(
        run("candidate.toml"),
        json!({
            "scopes": {"ip": c(10, 0), "key": c(9, 2), "tenant": c(9, 0)},
            "tenants": {"acme": c(6, 2), "globex": c(3, 0)},
            "requests": 13, "allowed": 10, "rejected": 2,
            "refused": {"invalid_api_key": 1},
        })
    );
}

/// A trace that cannot be read exits 1, prints nothing on stdout and names `FILE:LINE`
/// (the header is line 1); so does a trace that cannot be opened.
#[test]
fn bad_trace_exits_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = "2026-03-02T10:00:00Z,198.51.100.7,key_acme,/v1/search";
    for (name, body, expect) in [
        (
            "ip.csv",
            format!("time,ip,key_id,path\n{good}\n2026-03-02T10:00:01Z,not-an-ip,key_acme,/v1\n"),
            ":3: invalid ip \"not-an-ip\"",
        ),
        (
            "time.csv",
            format!("time,ip,key_id,path\n{good}\n{good}\nyesterday,198.51.100.7,,/v1\n"),
            ":4: invalid time \"yesterday\"",
        ),
        (
            "fields.csv",
            format!("time,ip,key_id,path\n{good}\n{good},extra\n"),
            ":3: 5 fields, but the header has 4",
        ),
        (
            "header.csv",
            format!("time,ip,apikey,path\n{good}\n"),
            ":1: unknown column \"apikey\"",
        ),
        // Near u64::MAX window arithmetic would wrap: refused, naming the line.
        (
            "late.csv",
            format!("time,ip,key_id,path\n{good}\n18446744073709551610,198.51.100.7,,/v1\n"),
            ":3: time \"18446744073709551610\" is out of range",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, body).unwrap();
        let p = path.to_str().unwrap();
        let out = throttle_simulate(&fixture("gateway.toml"), p, false);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}");
        assert!(stderr.starts_with(&format!("{p}{expect}")), "{stderr}");
    }
    let missing = dir.path().join("missing.csv");
    let p = missing.to_str().unwrap();
    let out = throttle_simulate(&fixture("gateway.toml"), p, false);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with(&format!("{p}: cannot read")));
}

// --- The simulator against a real gateway ---------------------------------------------
//
// One key, 4 per second (`burst_multiplier = 2`: a token bucket holds 8; the others ignore
// the burst), on two routes: /light costs 1, /heavy costs 2. Bursts at ms offsets from a
// wall-clock second boundary (fixed and sliding windows are aligned to the epoch), `L` a
// request to /light and `H` to /heavy, planned 5 ms apart and sent one after the other.
// The bursts are placed so that moving any one of them by up to 85 ms changes no decision
// of any algorithm (no refill or drain reaching a cost, window start, log expiry or
// sliding weight crossing nearer), so the pace can slip without changing what the test
// exercises; the comparison itself uses the times the requests were actually sent.

/// The bursts: (ms after a second boundary, requests).
const BURSTS: [(u64, &str); 3] = [(100, "LH"), (1225, "HLLHL"), (2100, "LLHLH")];

/// What each algorithm decides for `BURSTS` (A: 200, R: 429), computed by hand (a burst's
/// requests taken as simultaneous; the 5 ms between them flip nothing).
///
/// token_bucket (holds 8, +1 per 250 ms): 8 -> 7 -> 5; full again by 1225 (5 + 4.5):
/// 6, 5, 4, 2, 1; by 2100 1 + 3.5 = 4.5: 3.5, 2.5, 0.5, then 0.5 < 1 and < 2: two 429s.
///
/// leaky_bucket (holds 4, drains 1 per 250 ms): 1, 3; empty by 1225: 2, 3, 4, then H
/// and L overflow; by 2100 4 - 3.5 = 0.5: 1.5, 2.5, H would be 4.5 (429), L 3.5, H 5.5
/// (429).
///
/// fixed_window (4 per epoch second): second 0: 1, 3; second 1: 2, 3, 4, H 6 and L 5
/// over (429); second 2: 1, 2, 4, L 5 and H 6 over.
///
/// sliding_window (4/s, the previous second weighted by the part of it still in the
/// trailing second): second 0: 1, 3. At 1225 the 3 weigh 3 x 0.775 = 2.325: H 4.325
/// (429), L 3.325, L 4.325 (429), H 5.325 (429), L 4.325 (429). At 2100 second 1's 1
/// weighs 0.9: L 1.9, L 2.9, H 4.9 (429), L 3.9, H 5.9 (429).
///
/// sliding_log (4 in the trailing 1000 ms): 1, 3 at 100 (gone at 1100); at 1225: 2, 3,
/// 4, H 6 and L 5 over; at 2100 the 4 of 1225 are live until 2225: all five refused.
const HAND: [(&str, &str); 5] = [
    ("token_bucket", "AA AAAAA AAARR"),
    ("leaky_bucket", "AA AAARR AARAR"),
    ("fixed_window", "AA AAARR AAARR"),
    ("sliding_window", "AA RARRR AARAR"),
    ("sliding_log", "AA AAARR RRRRR"),
];

const KEY: &str = "sim-paced-key";

/// The config of the paced trace under `algorithm` (without `[server]`).
fn limits(algorithm: &str, upstream: &str) -> String {
    format!(
        r#"
[tiers.paced]
key = {{ per_second = 4, algorithm = "{algorithm}", burst_multiplier = 2 }}

[[routes]]
name = "light"
path_prefix = "/light"
upstreams = ["{upstream}"]
auth = "required"

[[routes]]
name = "heavy"
path_prefix = "/heavy"
upstreams = ["{upstream}"]
auth = "required"
cost = 2

[[keys]]
id = "paced"
key = "{KEY}"
tenant = "pacers"
tier = "paced"
"#
    )
}

/// The planned requests: (ms after the start, path).
fn plan() -> Vec<(u64, &'static str)> {
    let mut rows = Vec::new();
    for (at, burst) in BURSTS {
        for (i, r) in (0u64..).zip(burst.chars()) {
            rows.push((at + 5 * i, if r == 'H' { "/heavy" } else { "/light" }));
        }
    }
    rows
}

/// A trace of (Unix ms, path) rows, all from 127.0.0.1 with `KEY`; `cost` fills a cost
/// column (which overrides the route's).
fn csv(rows: &[(u64, &str)], cost: Option<u32>) -> String {
    let mut s = String::from("time,ip,api_key,path,cost\n");
    let cost = cost.map(|c| c.to_string()).unwrap_or_default();
    for (at, path) in rows {
        s.push_str(&format!("{at},127.0.0.1,{KEY},{path},{cost}\n"));
    }
    s
}

/// The simulator's decision on each row (A or R): row n is allowed when replaying the
/// first n rows allows one more request than replaying the first n - 1. Also checks the
/// whole replay's key scope and tenant counts against those decisions.
fn simulated(config: &Config, rows: &[(u64, &str)], cost: Option<u32>) -> String {
    let mut before = 0;
    let mut out = String::new();
    for n in 1..=rows.len() {
        let report = simulate(config, csv(&rows[..n], cost).as_bytes()).unwrap();
        assert_eq!(report.allowed + report.rejected, n as u64, "{report:?}");
        out.push(if report.allowed > before { 'A' } else { 'R' });
        before = report.allowed;
    }
    let report = simulate(config, csv(rows, cost).as_bytes()).unwrap();
    let allowed = out.matches('A').count() as u64;
    let counts = Counts {
        allowed,
        rejected: rows.len() as u64 - allowed,
        shadow_rejected: 0,
    };
    assert_eq!(report.scopes.get(Scope::Key), counts, "{report:?}");
    assert_eq!(report.tenants["pacers"], counts, "{report:?}");
    out
}

/// `HAND`'s decisions without the spaces between bursts.
fn hand(algorithm: &str) -> String {
    let (_, decisions) = HAND.iter().find(|(a, _)| *a == algorithm).unwrap();
    decisions.replace(' ', "")
}

/// The simulator, on the planned trace, decides as the hand computation for every
/// algorithm; and the trace tells the algorithms and the costs apart: the five hand
/// computations all differ, and every algorithm decides otherwise when /heavy costs 1.
/// So a simulator that ignored the algorithm or the cost could not pass the gateway tests
/// below.
#[test]
fn paced_trace_matches_the_hand_computation_and_tells_algorithms_apart() {
    // 2026-03-02T10:00:00Z, a second boundary.
    let rows: Vec<(u64, &str)> = plan()
        .into_iter()
        .map(|(at, p)| (1_772_445_600_000 + at, p))
        .collect();
    for (algorithm, _) in HAND {
        let config = config::parse("paced.toml", &limits(algorithm, "127.0.0.1:1")).unwrap();
        let decided = simulated(&config, &rows, None);
        assert_eq!(decided, hand(algorithm), "{algorithm}");
        assert_ne!(simulated(&config, &rows, Some(1)), decided, "{algorithm}");
    }
    let mut all: Vec<String> = HAND.iter().map(|(a, _)| hand(a)).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), HAND.len());
}

/// Sends `plan()` to `gw` at its pace, starting at the next wall-clock second boundary
/// (at least 200 ms away): (Unix ms when sent, path) per request, and the statuses (A for
/// 200, R for 429).
async fn send_paced(gw: &Gateway) -> (Vec<(u64, &'static str)>, String) {
    let c = client();
    // Opens the pooled connection first: a 404 (no route) charges no limit configured here.
    let warm = c.get(gw.url("/warm-up")).send().await.unwrap();
    assert_eq!(warm.status(), 404);
    let (now, anchor) = (SystemClock.now_ms(), Instant::now());
    let start = ((now + 200) / 1000 + 1) * 1000;
    let mut sent = Vec::new();
    let mut statuses = String::new();
    for (at, path) in plan() {
        tokio::time::sleep_until(anchor + Duration::from_millis(start + at - now)).await;
        sent.push((SystemClock.now_ms(), path));
        let r = c
            .get(gw.url(path))
            .header("x-api-key", KEY)
            .send()
            .await
            .unwrap();
        statuses.push(match r.status().as_u16() {
            200 => 'A',
            429 => 'R',
            s => panic!("{path}: {s} {}", r.text().await.unwrap_or_default()),
        });
    }
    (sent, statuses)
}

/// A real gateway (the binary, memory store, wall clock) running the paced trace under
/// `algorithm` answers every request as the simulator decides it at the time it was sent.
async fn gateway_decides_as_simulated(algorithm: &str) {
    let up = Upstream::start("paced").await;
    let gw = Gateway::start(&limits(algorithm, "{upstream}"), Some(&up)).await;
    let config = config::load(&gw.config_path()).unwrap();
    let (sent, statuses) = send_paced(&gw).await;
    let offsets: Vec<u64> = sent.iter().map(|(t, _)| t - sent[0].0).collect();
    assert_eq!(
        simulated(&config, &sent, None),
        statuses,
        "{algorithm}: simulator vs gateway; sent at ms {offsets:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gateway_decides_as_simulated_token_bucket() {
    gateway_decides_as_simulated("token_bucket").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gateway_decides_as_simulated_leaky_bucket() {
    gateway_decides_as_simulated("leaky_bucket").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gateway_decides_as_simulated_fixed_window() {
    gateway_decides_as_simulated("fixed_window").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gateway_decides_as_simulated_sliding_window() {
    gateway_decides_as_simulated("sliding_window").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gateway_decides_as_simulated_sliding_log() {
    gateway_decides_as_simulated("sliding_log").await;
}

/// `simulate` follows a table's calendar: a day quota of 2 in Los Angeles, three requests
/// in the last minute of 2026-03-07 (local) and one ten seconds into 2026-03-08: the
/// fourth starts a new local day (3 allowed, 1 rejected). Counted in UTC days, all four
/// fall on 2026-03-08 and two are rejected.
#[test]
fn simulate_follows_the_calendar() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    std::fs::write(
        &trace,
        "time,ip,path\n\
         2026-03-08T07:59:00Z,198.51.100.7,/a\n\
         2026-03-08T07:59:30Z,198.51.100.7,/a\n\
         2026-03-08T07:59:50Z,198.51.100.7,/a\n\
         2026-03-08T08:00:10Z,198.51.100.7,/a\n",
    )
    .unwrap();
    let table = "[limits.ip]\nper_day = 2\nalgorithm = \"fixed_window\"\n";
    for (zone, allowed, rejected) in [
        ("calendar_tz = \"America/Los_Angeles\"\n", 3, 1),
        ("", 2, 2),
    ] {
        let config = dir.path().join("gateway.toml");
        std::fs::write(
            &config,
            format!(
                "{table}{zone}\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:9\"]\nauth = \"none\"\n"
            ),
        )
        .unwrap();
        let out = throttle_simulate(config.to_str().unwrap(), trace.to_str().unwrap(), true);
        let report: serde_json::Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
        let ip = &report["scopes"]["ip"];
        assert_eq!(
            (ip["allowed"].as_u64(), ip["rejected"].as_u64()),
            (Some(allowed), Some(rejected)),
            "{zone:?}: {report}"
        );
    }
}
