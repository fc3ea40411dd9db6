//! Black-box conformance of the Envoy rate-limit service in envoyproxy/ratelimit mode
//! (`[rls] config` = envoyproxy YAML), against the contract of issue 23: the real gateway
//! binary, a tonic client from envoy-types, the memory store and a real Redis.
//!
//! Every case of `matching` and `modes` is a table (YAML files -> requests -> expected responses) that one
//! runner plays on three stores: memory, Redis with `admission = "auto"` (leases), and
//! Redis with `"exact"`. Beside what a step expects, the runner checks on every response:
//! `duration_until_reset` of each limited status is the rest of the epoch-aligned window
//! of its unit (so never more than the unit) and never grows for a descriptor within a
//! case; without `[rls] response_headers` none of the RateLimit-* headers is added; on
//! Redis the counters are under `<prefix>:{rls:<domain>:` (no
//! silent memory fallback).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use throttle::clock::{Clock, SystemClock};
use tonic::transport::Channel;

use crate::support::redis::RedisServer;
use crate::support::{eventually, free_port, Gateway, Upstream};

mod cli_reload;
mod fleet;
mod matching;
mod modes;
mod refusals;

// ---------------------------------------------------------------------------------------
// The table's vocabulary.

/// A descriptor's entries.
pub(super) type D = &'static [(&'static str, &'static str)];

pub(super) const MIN: Unit = Unit::Minute;

/// One case: YAML files, the gateway's `[rls] response_headers`, and the steps.
pub(super) struct Case {
    pub(super) name: &'static str,
    /// `(file name, content)`; one file is `[rls] config = <file>`, `dir` makes it the
    /// directory holding all of them (sub-directories as `sub/x.yaml`).
    pub(super) files: Vec<(&'static str, String)>,
    pub(super) dir: bool,
    pub(super) headers: bool,
    /// On Redis: no key may contain any of these (descriptors that must never be counted).
    pub(super) never_stored: &'static [&'static str],
    pub(super) steps: Vec<Step>,
}

impl Case {
    pub(super) fn new(name: &'static str, yaml: &str, steps: Vec<Step>) -> Self {
        Self {
            name,
            files: vec![("ratelimit.yaml", yaml.to_string())],
            dir: false,
            headers: false,
            never_stored: &[],
            steps,
        }
    }
}

pub(super) enum Step {
    Call(RateLimitRequest, Want),
    /// Lets wall-clock time pass (for `duration_until_reset` shrinking), never readiness.
    Pause(Duration),
}

pub(super) enum Want {
    Resp {
        overall: Code,
        statuses: Vec<St>,
        /// `(RateLimit-Limit, RateLimit-Remaining, index of the status whose reset it is)`.
        header: Option<(u32, u32, usize)>,
    },
    Err(tonic::Code),
}

/// One expected `DescriptorStatus`.
#[derive(Clone, Copy, Debug)]
pub(super) struct St {
    pub(super) code: Code,
    pub(super) limit: Option<(u32, Unit, &'static str)>,
    /// None: the contract does not say (no check).
    pub(super) remaining: Option<u32>,
}

/// A limited status: OK with `remaining` left.
pub(super) fn ok(limit: (u32, Unit, &'static str), remaining: u32) -> St {
    St {
        code: Code::Ok,
        limit: Some(limit),
        remaining: Some(remaining),
    }
}

/// A limited status over its limit.
pub(super) fn over(limit: (u32, Unit, &'static str)) -> St {
    St {
        code: Code::OverLimit,
        limit: Some(limit),
        remaining: Some(0),
    }
}

/// OK without a limit (no match, whitelisted, replaced): remaining is not specified.
pub(super) fn free() -> St {
    St {
        code: Code::Ok,
        limit: None,
        remaining: None,
    }
}

/// `unlimited: true`.
pub(super) fn limitless() -> St {
    St {
        code: Code::Ok,
        limit: None,
        remaining: Some(u32::MAX),
    }
}

/// A descriptor of an unknown domain.
pub(super) fn unknown() -> St {
    St {
        code: Code::Ok,
        limit: None,
        remaining: Some(0),
    }
}

pub(super) fn call(req: RateLimitRequest, overall: Code, statuses: Vec<St>) -> Step {
    Step::Call(
        req,
        Want::Resp {
            overall,
            statuses,
            header: None,
        },
    )
}

/// As `call`, expecting the RateLimit-* headers.
pub(super) fn call_h(
    req: RateLimitRequest,
    overall: Code,
    statuses: Vec<St>,
    header: (u32, u32, usize),
) -> Step {
    Step::Call(
        req,
        Want::Resp {
            overall,
            statuses,
            header: Some(header),
        },
    )
}

pub(super) fn fails(req: RateLimitRequest, code: tonic::Code) -> Step {
    Step::Call(req, Want::Err(code))
}

/// A descriptor of `(key, value)` entries.
pub(super) fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A descriptor with its own `hits_addend`.
pub(super) fn desc_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..desc(entries)
    }
}

/// A descriptor with a limit override.
pub(super) fn desc_limit(
    entries: &[(&str, &str)],
    requests_per_unit: u32,
    unit: RateLimitUnit,
) -> RateLimitDescriptor {
    RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit,
            unit: unit as i32,
        }),
        ..desc(entries)
    }
}

pub(super) fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// A request of one-entry-list descriptors, e.g. `one("d", &[&[("k", "v")]])`.
pub(super) fn one(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    req(domain, descriptors.iter().map(|d| desc(d)).collect())
}

/// The window length of a unit, as the contract fixes them.
pub(super) fn unit_secs(unit: Unit) -> u64 {
    match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3_600,
        Unit::Day => 86_400,
        Unit::Week => 604_800,
        Unit::Month => 2_592_000,
        Unit::Year => 31_536_000,
        Unit::Unknown => panic!("UNKNOWN unit in a response"),
    }
}

// ---------------------------------------------------------------------------------------
// The gateway under test.

pub(super) fn now() -> f64 {
    SystemClock.now_ms() as f64 / 1000.0
}

/// When fewer than `need` seconds are left in the current minute (every window of minute
/// or longer ends on a minute boundary), waits for the next one: a case must count
/// inside one window.
pub(super) async fn fresh_window(need: f64) {
    let left = 60.0 - now() % 60.0;
    if left < need {
        tokio::time::sleep(Duration::from_secs_f64(left + 0.2)).await;
    }
}

pub(super) enum Store<'a> {
    Memory,
    /// (server, key prefix, admission)
    Redis(&'a RedisServer, &'a str, &'a str),
}

/// The `[store]` and `[rls]` sections for `config` (an absolute path).
pub(super) fn body(store: &Store, config: &std::path::Path, headers: bool) -> String {
    let rls = format!(
        "[rls]\nconfig = \"{}\"\nresponse_headers = {headers}\n",
        config.display()
    );
    match store {
        Store::Memory => rls,
        // Fail closed: a store error must show up, never pass as a silent OK.
        Store::Redis(r, prefix, admission) => format!(
            "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 2000\non_failure = \"closed\"\nkey_prefix = \"{prefix}\"\n\n{rls}on_failure = \"closed\"\nadmission = \"{admission}\"\n",
            r.url()
        ),
    }
}

/// A gateway serving the rate-limit service on `addr`, and a client connected to it.
pub(super) struct Rls {
    pub(super) gw: Gateway,
    pub(super) client: RateLimitServiceClient<Channel>,
    pub(super) addr: SocketAddr,
    _upstream: Upstream,
}

impl Rls {
    /// Starts the gateway with `body` (plus the route every config needs) and
    /// `rls_listen` on a free port; returns once a gRPC connection is up.
    pub(super) async fn start(body: &str) -> Self {
        let up = Upstream::start("rls-conformance").await;
        let body = format!(
            "{body}\n[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"{}\"]\n",
            up.addr
        );
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let server = format!("grace_period_secs = 0\nrls_listen = \"{addr}\"");
        let gw = Gateway::start_env(&["run"], &body, &server, &[]).await;
        let url = format!("http://{addr}");
        let client = eventually(Duration::from_secs(10), "the rate-limit service", || {
            let url = url.clone();
            async move { RateLimitServiceClient::connect(url).await.ok() }
        })
        .await;
        Self {
            gw,
            client,
            addr,
            _upstream: up,
        }
    }

    /// A call that must succeed.
    pub(super) async fn ask(&mut self, req: RateLimitRequest) -> RateLimitResponse {
        match self.client.should_rate_limit(req.clone()).await {
            Ok(r) => r.into_inner(),
            Err(s) => panic!("{}: {s:?}\n{}", show(&req), self.gw.log()),
        }
    }
}

/// A request in one line: `domain [k=v,k=v (hits 3) (limit 2/2)] ... hits N`.
pub(super) fn show(req: &RateLimitRequest) -> String {
    let mut s = format!("domain {:?}", req.domain);
    for d in &req.descriptors {
        let e: Vec<String> = d
            .entries
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        s += &format!(" [{}", e.join(","));
        if let Some(h) = &d.hits_addend {
            s += &format!(" hits_addend {}", h.value);
        }
        if let Some(l) = &d.limit {
            s += &format!(" limit {}/{:?}", l.requests_per_unit, l.unit());
        }
        s += "]";
    }
    if req.hits_addend != 0 {
        s += &format!(" request hits_addend {}", req.hits_addend);
    }
    s
}

/// A response header added by the service (case-insensitive name).
pub(super) fn added(r: &RateLimitResponse, name: &str) -> Option<String> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.clone())
}

const HEADERS: [&str; 3] = ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"];

// ---------------------------------------------------------------------------------------
// The runner.

/// Plays `case` on `store` ("memory", "redis", "redis_exact").
async fn run(case: fn() -> Case, store: &str) {
    let case = case();
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in &case.files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    let config = match case.dir {
        true => dir.path().to_path_buf(),
        false => dir.path().join(case.files[0].0),
    };
    let redis = match store {
        "memory" => None,
        _ => Some(RedisServer::start().await),
    };
    let prefix = format!("rlsc-{}-{store}-{}", case.name, std::process::id());
    let st = match &redis {
        None => Store::Memory,
        Some(r) => Store::Redis(r, &prefix, if store == "redis" { "auto" } else { "exact" }),
    };
    let mut rls = Rls::start(&body(&st, &config, case.headers)).await;
    fresh_window(15.0).await;
    let mut resets: HashMap<String, f64> = HashMap::new();
    let mut counted: Vec<&str> = Vec::new();
    for (i, step) in case.steps.iter().enumerate() {
        let (req, want) = match step {
            Step::Pause(d) => {
                tokio::time::sleep(*d).await;
                continue;
            }
            Step::Call(req, want) => (req, want),
        };
        let ctx = format!("case {} on {store}, step {i}: {}", case.name, show(req));
        let before = now();
        let got = rls.client.should_rate_limit(req.clone()).await;
        let after = now();
        let (overall, statuses, header) = match want {
            Want::Err(code) => {
                match got {
                    Err(s) => assert_eq!(s.code(), *code, "{ctx}: {s:?}"),
                    Ok(r) => panic!("{ctx}: want {code:?}, got {:?}", r.into_inner()),
                }
                continue;
            }
            Want::Resp {
                overall,
                statuses,
                header,
            } => (*overall, statuses, *header),
        };
        let r = match got {
            Ok(r) => r.into_inner(),
            Err(s) => panic!("{ctx}: {s:?}\n{}", rls.gw.log()),
        };
        let ctx = format!("{ctx}\n  got {r:?}");
        assert_eq!(r.overall_code(), overall, "{ctx}: overall_code");
        assert_eq!(r.statuses.len(), statuses.len(), "{ctx}: statuses");
        for (j, (got, want)) in r.statuses.iter().zip(statuses).enumerate() {
            assert_eq!(got.code(), want.code, "{ctx}: status {j} code");
            let limit = got
                .current_limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit(), l.name.as_str()));
            assert_eq!(limit, want.limit, "{ctx}: status {j} current_limit");
            if let Some(rem) = want.remaining {
                assert_eq!(
                    got.limit_remaining, rem,
                    "{ctx}: status {j} limit_remaining"
                );
            }
            let Some((rpu, unit, _)) = want.limit else {
                continue;
            };
            let d = got
                .duration_until_reset
                .as_ref()
                .unwrap_or_else(|| panic!("{ctx}: status {j} has no duration_until_reset"));
            let d = d.seconds as f64 + f64::from(d.nanos) / 1e9;
            let len = unit_secs(unit) as f64;
            // The rest of the epoch-aligned window at some instant of the call (±1 s for
            // whole-second rounding), never more than the unit.
            let (lo, hi) = (len - after % len - 1.0, len - before % len + 1.0);
            assert!(
                d <= len && d >= lo && d <= hi,
                "{ctx}: status {j} duration_until_reset {d} s, the window ends in {:.1} s",
                len - before % len
            );
            let key = format!(
                "{}|{:?}|{rpu}|{unit:?}",
                req.domain, req.descriptors[j].entries
            );
            if let Some(prev) = resets.insert(key, d) {
                assert!(
                    d <= prev,
                    "{ctx}: status {j} duration_until_reset grew {prev} -> {d}"
                );
            }
            let hits = req.descriptors[j].hits_addend.as_ref().map(|h| h.value);
            if overall == Code::Ok && want.code == Code::Ok && hits != Some(0) {
                counted.push(&req.domain);
            }
        }
        if !case.headers {
            for h in HEADERS {
                assert_eq!(added(&r, h), None, "{ctx}: {h} without response_headers");
            }
        } else if let Some((limit, remaining, of)) = header {
            assert_eq!(added(&r, HEADERS[0]), Some(limit.to_string()), "{ctx}");
            assert_eq!(added(&r, HEADERS[1]), Some(remaining.to_string()), "{ctx}");
            let reset: i64 = added(&r, HEADERS[2])
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{ctx}: no numeric {}", HEADERS[2]));
            let want = r.statuses[of]
                .duration_until_reset
                .as_ref()
                .unwrap()
                .seconds;
            assert!(
                (reset - want).abs() <= 1,
                "{ctx}: reset {reset}, status {of}'s {want}"
            );
        }
    }
    if let Some(redis) = &redis {
        let mut c = redis.client().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut c)
            .await
            .unwrap();
        counted.sort_unstable();
        counted.dedup();
        for domain in counted {
            // The domain's scope, `rls:<domain>`.
            let want = format!("{prefix}:{{rls:{domain}:");
            let scoped = |k: &String| k.starts_with(&want);
            assert!(
                keys.iter().any(scoped),
                "case {} on {store}: no Redis key {want}*: {keys:?}",
                case.name
            );
        }
        for never in case.never_stored {
            assert!(
                !keys.iter().any(|k| k.contains(never)),
                "case {} on {store}: {never} was counted: {keys:?}",
                case.name
            );
        }
    }
}

/// One test per case and store: `rls_conformance::<case>::{memory, redis, redis_exact}`.
macro_rules! conformance {
    ($table:ident: $($case:ident),* $(,)?) => {$(
        mod $case {
            #[tokio::test]
            async fn memory() {
                super::run(super::$table::$case, "memory").await
            }
            #[tokio::test]
            async fn redis() {
                super::run(super::$table::$case, "redis").await
            }
            #[tokio::test]
            async fn redis_exact() {
                super::run(super::$table::$case, "redis_exact").await
            }
        }
    )*};
}

conformance!(matching: basic, over_limit, two_descriptors, reset, nested, bare_key, whitelist,
    wildcard, share_threshold, units, directory);
conformance!(modes: unlimited, shadow, quota, replaces, hits_request, hits_descriptor,
    limit_override, headers, invalid, unknown_domain);
conformance!(refusals: refused_consumes_nothing, remaining_counts_refusals, zero_limit);
