//! One limit across regions against the real binary: three regions on one machine, each
//! with its own redis-server and gateway (`[regions]`), the links between them through
//! delay proxies where the test is about time.
//!
//! - `fleet = "home"` is exact for a small limit: 5 a minute per key, whichever region
//!   the requests reach, keys homed in every region.
//! - `fleet = "home"` and `fleet = "regions"` work in every kind of table a limit can be
//!   in: a table of 3 an hour admits 3 across the three regions (9 without `fleet`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::support::delay_proxy::DelayProxy;
use crate::support::kinds::{kind_config_with, TABLE_KINDS};
use crate::support::redis::RedisServer;
use crate::support::{client, Gateway, Upstream};

/// The names of the three regions, sorted (a region's index is its place here).
const NAMES: [&str; 3] = ["r1", "r2", "r3"];

/// A deadline for every Redis call no loaded test machine misses.
const LONG_DEADLINE: &str = "timeout_ms = 1000";

/// The `[store]` and `[regions]` sections of region `i`: its own Redis (with `store`
/// lines), the others' as peers (`peer_url(j)`: the URL region `i` reaches region `j`'s
/// Redis by).
fn region_sections(
    i: usize,
    prefix: &str,
    own: &str,
    peer_url: impl Fn(usize) -> String,
    store: &str,
) -> String {
    let peers: Vec<String> = (0..NAMES.len())
        .filter(|j| *j != i)
        .map(|j| format!("{} = \"{}\"", NAMES[j], peer_url(j)))
        .collect();
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{own}\"\nkey_prefix = \"{prefix}\"\n{store}\n\n[regions]\nname = \"{}\"\npeers = {{ {} }}\n",
        NAMES[i],
        peers.join(", ")
    )
}

/// Three redis-servers, one per region.
async fn three_redis() -> Vec<RedisServer> {
    let mut out = Vec::new();
    for _ in 0..NAMES.len() {
        out.push(RedisServer::start().await);
    }
    out
}

/// A gateway per region on `redis`, each with `body(i)` after its store and regions
/// sections (peers reached directly).
async fn three_gateways(
    redis: &[RedisServer],
    prefix: &str,
    body: impl Fn(&str) -> String,
) -> Vec<Gateway> {
    let mut out = Vec::new();
    for i in 0..NAMES.len() {
        let sections = region_sections(
            i,
            prefix,
            &redis[i].url(),
            |j| redis[j].url(),
            LONG_DEADLINE,
        );
        out.push(Gateway::start(&body(&sections), None).await);
    }
    out
}

/// The status of a GET of `path` on `gw` as key `k1` (`key-one-secret`), user `u1`.
async fn status(gw: &Gateway, key: &str, path: &str) -> (u16, Option<String>) {
    let r = client()
        .get(gw.url(path))
        .header("x-api-key", key)
        .header("x-user", "u1")
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    let scope = match code {
        429 => {
            let body: Value = r.json().await.unwrap();
            body["scope"].as_str().map(str::to_string)
        }
        _ => None,
    };
    (code, scope)
}

/// `fleet = "home"` with 5 a minute per key: six keys (homed in every region), twenty
/// requests each spread over the three regions, 50 ms apart: exactly 5 admitted per key,
/// and every refusal names the key scope. Without the home (each region on its own Redis) a key
/// would get 5 in each region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_home_is_exact_for_small_limits() {
    let up = Upstream::start("home").await;
    let keys: Vec<String> = (1..=6).map(|n| format!("key-{n}-secret")).collect();
    let entries: String = (1..=6)
        .map(|n| {
            format!("[[keys]]\nid = \"k{n}\"\nkey = \"key-{n}-secret\"\ntenant = \"t{n}\"\ntier = \"small\"\n\n")
        })
        .collect();
    let body = format!(
        "[tiers.small]\nkey = {{ per_minute = 5, algorithm = \"fixed_window\", fleet = \"home\" }}\n\n{entries}[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstreams = [\"{{upstream}}\"]\n"
    );
    // 50 ms one way between regions, and the default local deadline (25 ms): a home
    // region's answer takes a round trip between regions, which its deadline allows.
    let fleet = Delayed::start_with("home", 50, &body, &up, "").await;
    // Stay inside one minute window: start right after a minute begins if one is near.
    wait_for_room_in_the_minute(50).await;
    for key in &keys {
        let mut admitted = 0;
        for n in 0..20 {
            let (code, scope) = status(&fleet.gws[n % 3], key, "/x").await;
            match code {
                200 => admitted += 1,
                429 => assert_eq!(scope.as_deref(), Some("key"), "{key}"),
                other => panic!("{key}: status {other}"),
            }
        }
        assert_eq!(admitted, 5, "{key}: admitted across the three regions");
    }
}

/// Waits until at least `secs` seconds of the current wall-clock minute are left (a
/// fixed minute window starts on the minute).
async fn wait_for_room_in_the_minute(secs: u64) {
    use throttle::clock::{Clock, SystemClock};
    let into = SystemClock.now_ms() % 60_000;
    if 60_000 - into < secs * 1000 {
        tokio::time::sleep(std::time::Duration::from_millis(60_000 - into + 50)).await;
    }
}

/// Both fleets in every kind of table: 3 an hour (fixed windows), nine requests spread
/// over the three regions admit 3, and the refusals name the table's scope. The regions
/// fleet admits each region's allotment (1 of 3); the home fleet decides all nine at the
/// identity's home.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_fleets_work_in_every_table_kind() {
    let up = Upstream::start("kinds").await;
    let redis = three_redis().await;
    for fleet in ["home", "regions"] {
        for (n, (label, kind, scope, _route)) in TABLE_KINDS.into_iter().enumerate() {
            let table = format!("per_hour = 3\nalgorithm = \"fixed_window\"\nfleet = \"{fleet}\"");
            let prefix = format!("kinds-{fleet}-{n}");
            let body =
                |sections: &str| kind_config_with(sections, &up.addr.to_string(), kind, &table, "");
            let gws = three_gateways(&redis, &prefix, body).await;
            let mut admitted = 0;
            for i in 0..9 {
                let (code, got) = status(&gws[i % 3], "key-one-secret", "/x").await;
                match code {
                    200 => admitted += 1,
                    429 => assert_eq!(got.as_deref(), Some(scope), "{fleet} {label}"),
                    other => panic!("{fleet} {label}: status {other}"),
                }
            }
            assert_eq!(
                admitted, 3,
                "{fleet} {label}: admitted across three regions"
            );
        }
    }
}

// === the bound, utilisation and a partition: three regions behind delay proxies ===

/// Three regions whose links go through one-way delay proxies (`links[i][j]`: region `i`'s
/// way to region `j`'s Redis), a gateway each.
struct Delayed {
    redis: Vec<RedisServer>,
    links: Vec<Vec<Option<DelayProxy>>>,
    gws: Vec<Gateway>,
    prefix: String,
}

impl Delayed {
    async fn start(prefix: &str, delay_ms: u64, body: &str, up: &Upstream) -> Self {
        Self::start_with(prefix, delay_ms, body, up, LONG_DEADLINE).await
    }

    /// As `start`, with `store` lines in each region's `[store]`.
    async fn start_with(
        prefix: &str,
        delay_ms: u64,
        body: &str,
        up: &Upstream,
        store: &str,
    ) -> Self {
        let body = body.replace("{upstream}", &up.addr.to_string());
        let redis = three_redis().await;
        let mut links = Vec::new();
        for i in 0..NAMES.len() {
            let mut row = Vec::new();
            for (j, r) in redis.iter().enumerate() {
                row.push(match i == j {
                    true => None,
                    false => Some(
                        DelayProxy::start(
                            SocketAddr::from(([127, 0, 0, 1], r.port)),
                            Duration::from_millis(delay_ms),
                        )
                        .await,
                    ),
                });
            }
            links.push(row);
        }
        let mut gws = Vec::new();
        for i in 0..NAMES.len() {
            let peer = |j: usize| format!("redis://{}", links[i][j].as_ref().unwrap().addr);
            let sections = region_sections(i, prefix, &redis[i].url(), peer, store);
            gws.push(Gateway::start(&format!("{sections}\n{body}"), None).await);
        }
        Self {
            redis,
            links,
            gws,
            prefix: prefix.to_string(),
        }
    }

    /// Cuts (or heals) every link into and out of region `k`.
    fn cut(&self, k: usize, cut: bool) {
        for (i, row) in self.links.iter().enumerate() {
            for (j, link) in row.iter().enumerate() {
                if let Some(l) = link.as_ref().filter(|_| i == k || j == k) {
                    match cut {
                        true => l.cut(),
                        false => l.heal(),
                    }
                }
            }
        }
    }

    /// Region `i`'s regions hash of `key`'s window `suffix` starting at `start`.
    async fn hash(&self, i: usize, key: &str, suffix: &str, start: u64) -> HashMap<String, i64> {
        let mut c = self.redis[i].client().await;
        self.hash_on(&mut c, key, suffix, start).await
    }

    /// The same through an open connection `c` (to the region's Redis).
    async fn hash_on(
        &self,
        c: &mut redis::aio::MultiplexedConnection,
        key: &str,
        suffix: &str,
        start: u64,
    ) -> HashMap<String, i64> {
        let name = format!("{}:{{key:{key}}}:{suffix}:rg:{start}", self.prefix);
        redis::cmd("HGETALL")
            .arg(&name)
            .query_async(c)
            .await
            .unwrap()
    }
}

/// One load: `rates[i]` requests a second to region `i` as key `key`, for `secs`.
#[derive(Clone)]
struct Load {
    /// The key's id; its secret is `<id>-secret`.
    key: &'static str,
    rates: [f64; 3],
}

/// Sends every load at once on a fixed schedule (open loop, at most 64 in flight per
/// load and region: a tick that finds 64 waiting sends nothing) for `secs`; per load the
/// requests sent and the 200s.
async fn drive(gws: &[Gateway], loads: &[Load], secs: f64) -> Vec<(u64, u64)> {
    let c = client();
    let mut tasks = Vec::new();
    for (n, load) in loads.iter().enumerate() {
        for (i, rate) in load.rates.iter().enumerate() {
            if *rate <= 0.0 {
                continue;
            }
            let (c, url) = (c.clone(), gws[i].url("/x"));
            let secret: Arc<str> = Arc::from(format!("{}-secret", load.key));
            let every = Duration::from_secs_f64(1.0 / rate);
            let count = (secs * rate) as u64;
            tasks.push(tokio::spawn(async move {
                let gate = Arc::new(tokio::sync::Semaphore::new(64));
                let ok = Arc::new(AtomicU64::new(0));
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut sent = Vec::new();
                let mut n_sent = 0;
                for _ in 0..count {
                    tick.tick().await;
                    let Ok(permit) = gate.clone().try_acquire_owned() else {
                        continue; // the gateway is behind: this request is not sent
                    };
                    n_sent += 1;
                    let (c, url, ok, secret) = (c.clone(), url.clone(), ok.clone(), secret.clone());
                    sent.push(tokio::spawn(async move {
                        let r = c.get(url).header("x-api-key", &*secret).send().await;
                        if r.is_ok_and(|r| r.status() == 200) {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        drop(permit);
                    }));
                }
                for s in sent {
                    let _ = s.await;
                }
                (n, n_sent, ok.load(Ordering::Relaxed))
            }));
        }
    }
    let mut out = vec![(0, 0); loads.len()];
    for t in tasks {
        let (n, sent, ok) = t.await.unwrap();
        out[n].0 += sent;
        out[n].1 += ok;
    }
    for (load, (sent, ok)) in loads.iter().zip(&out) {
        let offered: f64 = load.rates.iter().sum::<f64>() * secs;
        eprintln!(
            "{}: offered {offered:.0}, sent {sent}, admitted {ok}",
            load.key
        );
    }
    out
}

/// Per window of `key` (length `window_ms`, suffix `suffix`) starting in
/// `[from_ms, to_ms)`: the admitted count summed over the regions (each region's `own`)
/// and the demand.
async fn windows(
    fleet: &Delayed,
    key: &str,
    suffix: &str,
    window_ms: u64,
    from_ms: u64,
    to_ms: u64,
) -> Vec<(u64, i64, i64)> {
    let mut out = Vec::new();
    let mut start = from_ms / window_ms * window_ms;
    while start < to_ms {
        let (mut own, mut demand) = (0, 0);
        for i in 0..NAMES.len() {
            let h = fleet.hash(i, key, suffix, start).await;
            own += h.get("own").copied().unwrap_or(0);
            demand += h.get("demand").copied().unwrap_or(0);
        }
        out.push((start, own, demand));
        start += window_ms;
    }
    out
}

fn now_ms() -> u64 {
    use throttle::clock::{Clock, SystemClock};
    SystemClock.now_ms()
}

/// The body of the bound tests: keys of 30 a second and 120 a minute (fixed windows,
/// `fleet = "regions"`), and one of 100 a second for demand at 1x.
const BOUND_BODY: &str = r#"
[tiers.s]
key = { per_second = 30, fleet = "regions" }
[tiers.m]
key = { per_minute = 120, fleet = "regions" }
[tiers.x]
key = { per_second = 100, fleet = "regions" }

[[keys]]
id = "s80"
key = "s80-secret"
tenant = "a"
tier = "s"

[[keys]]
id = "s33"
key = "s33-secret"
tenant = "b"
tier = "s"

[[keys]]
id = "m80"
key = "m80-secret"
tenant = "c"
tier = "m"

[[keys]]
id = "m33"
key = "m33-secret"
tenant = "d"
tier = "m"

[[keys]]
id = "x80"
key = "x80-secret"
tenant = "e"
tier = "x"

[[routes]]
name = "api"
path_prefix = "/"
upstreams = ["{upstream}"]
"#;

/// The least share of `L` a whole window admits when demand is at or above it: the
/// issue's target.
const FLOOR: f64 = 0.97;

/// The demand a load puts on its limit: attackers at 10x, or exactly `L` split 80/10/10
/// through the gateways with leases. Both are held to `FLOOR`. (At 1x the light regions
/// used to keep 2 or 3 tokens each, forecasting their need from a demand that their
/// unused leases inflated, until leased tokens given back left the demand: 0.96 seen.)
#[derive(Clone, Copy, PartialEq)]
enum Demand {
    TenX,
    OneX,
}
use Demand::{OneX, TenX};

/// From when on (ms after the run's start) a load's windows are held to their floor:
/// `planned`, or never when the generator fell behind its schedule (under 95 % of the
/// offered requests sent: a loaded machine's backlog arrives in bursts, at times in one
/// region only, which is not the demand the floor is about). The bound is checked all
/// the same.
fn paced(load: &Load, sent: u64, secs: f64, planned: u64) -> u64 {
    let offered = load.rates.iter().sum::<f64>() * secs;
    if (sent as f64) < 0.95 * offered {
        eprintln!(
            "{}: the generator sent {sent} of {offered:.0}: utilisation not held to its floor",
            load.key
        );
        return u64::MAX / 2;
    }
    planned
}

/// Checks every window of `seen` (start, admitted, demand) against `limit`: never over
/// it; at least `FLOOR` of it in every whole window in `[from, to)` (and from
/// `planned_from` on) whose demand reached it. The worst admitted / L.
fn check_windows(
    what: &str,
    seen: &[(u64, i64, i64)],
    (limit, demand_kind): (u32, Demand),
    window_ms: u64,
    (from, to, planned_from): (u64, u64, u64),
) -> f64 {
    let mut worst: f64 = 0.0;
    for (start, own, demand) in seen {
        let ratio = *own as f64 / f64::from(limit);
        eprintln!(
            "{what}: window {start}: admitted {own} of {limit} ({ratio:.3}), demand {demand}"
        );
        worst = worst.max(ratio);
        assert!(
            *own <= i64::from(limit),
            "{what}: window {start} admitted {own} > {limit}"
        );
        let whole = *start >= from && start + window_ms <= to && *start >= planned_from;
        // At 1x the floor is about demand at `L` in its planned split; a window whose
        // demand is well over `L` got a loaded generator's backlog in a burst (often in
        // one region, which the grants, following the previous window's demand, cannot
        // follow within the window). Printed, bounded, not held to the floor.
        let paced = demand_kind == TenX || *demand * 100 <= i64::from(limit) * 105;
        if whole && *demand >= i64::from(limit) && paced {
            assert!(
                ratio >= FLOOR,
                "{what}: window {start} admitted {own} of {limit} with demand {demand}"
            );
        }
    }
    worst
}

/// Attackers at 10x a limit of 30 a second split 80/10/10 and 33/33/33, and demand at
/// exactly a limit of 100 a second split 80/10/10, at 5, 50 and 150 ms one way between
/// the regions: in every window the regions admit at most `L` together (the worst ratio
/// is printed), and at least 97 % of it in every whole window whose demand reached `L`
/// (at 1x, from the third second: the grants follow the previous window's demand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_second_windows_never_pass_the_limit_and_fill_it() {
    let up = Upstream::start("regions").await;
    let loads = [
        Load {
            key: "s80",
            rates: [240.0, 30.0, 30.0],
        },
        Load {
            key: "s33",
            rates: [100.0, 100.0, 100.0],
        },
        Load {
            key: "x80",
            rates: [80.0, 10.0, 10.0],
        },
    ];
    let mut worst: f64 = 0.0;
    for delay in [5, 50, 150] {
        let fleet = Delayed::start(&format!("bound{delay}"), delay, BOUND_BODY, &up).await;
        let from = now_ms();
        let got = drive(&fleet.gws, &loads, 5.0).await;
        let to = now_ms();
        // What the clients were admitted is within what the windows allowed.
        let touched = to / 1000 - from / 1000 + 1;
        for (load, (_, ok)) in loads.iter().zip(&got).take(2) {
            assert!(
                *ok <= 30 * touched,
                "{delay} ms {}: {ok} admitted in {touched} windows",
                load.key
            );
        }
        for (n, (load, limit, planned)) in [
            (&loads[0], (30, TenX), 0),
            (&loads[1], (30, TenX), 0),
            (&loads[2], (100, OneX), 2000),
        ]
        .into_iter()
        .enumerate()
        {
            let planned = paced(load, got[n].0, 5.0, planned);
            let seen = windows(&fleet, load.key, "1s", 1000, from, to).await;
            let what = format!("{delay} ms {}", load.key);
            worst = worst.max(check_windows(
                &what,
                &seen,
                limit,
                1000,
                (from, to, from + planned),
            ));
        }
    }
    eprintln!("1 s windows: worst admitted / L over every window and delay: {worst:.3}");
}

/// Attackers at 10x a limit of 120 a minute split 80/10/10 and 33/33/33, the three
/// delays side by side (a fleet each) over one whole minute window: at most `L`, and at
/// least 97 % of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_minute_windows_never_pass_the_limit_and_fill_it() {
    let up = Upstream::start("regions").await;
    let loads = [
        Load {
            key: "m80",
            rates: [16.0, 2.0, 2.0],
        },
        Load {
            key: "m33",
            rates: [6.7, 6.7, 6.7],
        },
    ];
    let mut fleets = Vec::new();
    for delay in [5, 50, 150] {
        fleets.push((
            delay,
            Delayed::start(&format!("minute{delay}"), delay, BOUND_BODY, &up).await,
        ));
    }
    // From just before a minute starts to just after it ends.
    let next = (now_ms() / 60_000 + 1) * 60_000;
    tokio::time::sleep(Duration::from_millis(next.saturating_sub(now_ms() + 500))).await;
    let from = now_ms();
    let runs = fleets.iter().map(|(_, f)| drive(&f.gws, &loads, 61.5));
    futures_util::future::join_all(runs).await;
    let to = now_ms();
    let mut worst: f64 = 0.0;
    for (delay, fleet) in &fleets {
        for load in &loads {
            let seen = windows(fleet, load.key, "1m", 60_000, from, to).await;
            let what = format!("{delay} ms {}", load.key);
            worst = worst.max(check_windows(
                &what,
                &seen,
                (120, TenX),
                60_000,
                (from, to, from),
            ));
            assert!(
                seen.iter().any(|(s, _, _)| *s >= from && s + 60_000 <= to),
                "{what}: no whole window"
            );
        }
    }
    eprintln!("60 s windows: worst admitted / L over every window and delay: {worst:.3}");
}

/// Region 3 cut off for 30 s in the middle of a run (50 ms links, 10x 80/10/10 on 30 a
/// second, 1x 80/10/10 on 100 a second): no window passes `L` before, during or after the
/// cut; after the heal every region sees every other's count of the window it healed in
/// within `sync_ms` + the delay, as the regions the cut did not separate do (measured and
/// printed against that target).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_cut_off_for_30_seconds_keeps_the_bound_and_agrees_after_the_heal() {
    let up = Upstream::start("regions").await;
    let fleet = Arc::new(Delayed::start("cut", 50, BOUND_BODY, &up).await);
    let loads = [
        Load {
            key: "s80",
            rates: [240.0, 30.0, 30.0],
        },
        Load {
            key: "x80",
            rates: [80.0, 10.0, 10.0],
        },
    ];
    let from = now_ms();
    // Windows are read as they end (their hashes outlive them by a few seconds only).
    let reading = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let reader = {
        let (fleet, reading) = (fleet.clone(), reading.clone());
        tokio::spawn(async move {
            let mut seen: HashMap<&'static str, Vec<(u64, i64, i64)>> = HashMap::new();
            let mut next = from / 1000 * 1000;
            while reading.load(Ordering::Relaxed) || next + 1000 <= now_ms() {
                if next + 1300 > now_ms() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                for key in ["s80", "x80"] {
                    let w = windows(&fleet, key, "1s", 1000, next, next + 1).await;
                    seen.entry(key).or_default().extend(w);
                }
                next += 1000;
            }
            seen
        })
    };
    let driving = {
        let (fleet, loads) = (fleet.clone(), loads.clone());
        tokio::spawn(async move { drive(&fleet.gws, &loads, 40.0).await })
    };
    // The cut 5 s in, the heal 30 s later, 200 ms into a second.
    let at = |ms: u64| async move {
        let now = now_ms();
        tokio::time::sleep(Duration::from_millis(ms.saturating_sub(now))).await;
    };
    let cut_at = (from + 5000) / 1000 * 1000 + 200;
    at(cut_at).await;
    fleet.cut(2, true);
    at(cut_at + 30_000).await;
    let window = (now_ms() / 1000) * 1000;
    let own: Vec<i64> = {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(
                fleet
                    .hash(i, "s80", "1s", window)
                    .await
                    .get("own")
                    .copied()
                    .unwrap_or(0),
            );
        }
        v
    };
    let mut clients = Vec::new();
    for r in &fleet.redis {
        clients.push(r.client().await);
    }
    let healed = tokio::time::Instant::now();
    fleet.cut(2, false);
    // Every region's view of every other's count reaches what it was at the heal (each
    // link's time kept: the cut ones against those the cut did not separate).
    let mut links: HashMap<(usize, usize), Duration> = HashMap::new();
    let mut agreed = None;
    while healed.elapsed() < Duration::from_millis(700) {
        for (i, c) in clients.iter_mut().enumerate() {
            let h = fleet.hash_on(c, "s80", "1s", window).await;
            for (j, o) in own.iter().enumerate() {
                if i != j && h.get(&format!("c:{j}")).copied().unwrap_or(0) >= *o {
                    links.entry((j, i)).or_insert_with(|| healed.elapsed());
                }
            }
        }
        if links.len() == 6 {
            agreed = links.values().max().copied();
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut by_link: Vec<_> = links.iter().collect();
    by_link.sort();
    eprintln!(
        "after the heal, link (from, to) -> agreed: {}",
        by_link
            .iter()
            .map(|((j, i), t)| format!("{j}->{i} {:.1} ms", t.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let got = driving.await.unwrap();
    reading.store(false, Ordering::Relaxed);
    let seen = reader.await.unwrap();
    let to = now_ms();
    for (n, (key, limit, planned)) in [("s80", (30, TenX), 0), ("x80", (100, OneX), 2000)]
        .into_iter()
        .enumerate()
    {
        let planned = paced(&loads[n], got[n].0, 40.0, planned);
        let windows = &seen[key];
        let during: Vec<_> = windows
            .iter()
            .filter(|(s, _, _)| *s >= cut_at && *s < cut_at + 30_000)
            .copied()
            .collect();
        assert!(
            during.len() >= 25,
            "{key}: {} windows read during the cut",
            during.len()
        );
        // The bound everywhere; utilisation only outside the cut (it costs the grants).
        let outside: Vec<_> = windows
            .iter()
            .filter(|(s, _, _)| *s + 1000 <= cut_at || *s >= cut_at + 31_000)
            .copied()
            .collect();
        check_windows(
            &format!("cut {key} outside"),
            &outside,
            limit,
            1000,
            (from, to, from + planned),
        );
        check_windows(
            &format!("cut {key} during"),
            &during,
            limit,
            1000,
            (u64::MAX, 0, 0),
        );
        let least = during.iter().map(|(_, o, _)| *o).min().unwrap_or(0);
        let mean =
            during.iter().map(|(_, o, _)| *o as f64).sum::<f64>() / during.len().max(1) as f64;
        eprintln!(
            "cut {key}: during the cut admitted / L lowest {:.3}, mean {:.3}",
            least as f64 / f64::from(limit.0),
            mean / f64::from(limit.0)
        );
    }
    let agreed = agreed.expect("the regions did not agree within 700 ms of the heal");
    // A write goes every tick, cut or not: the one that crosses at the heal is at most one
    // sync period old, and the first tick after the heal reads every count of it. The
    // regions the cut did not separate lag by as much (a count made just before the heal
    // crosses with the next tick). Asserted with room for a loaded machine (three debug
    // gateways and their load on two cores); the figure is printed against the target.
    let target = Duration::from_millis(50 + 50);
    eprintln!(
        "after the heal the regions agreed in {agreed:?} (target sync_ms 50 + the 50 ms delay = \
         {target:?}: {})",
        if agreed <= target { "met" } else { "not met" }
    );
    assert!(
        agreed <= Duration::from_millis(50 + 3 * 50 + 50),
        "agreed in {agreed:?}"
    );
}
