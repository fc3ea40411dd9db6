//! The database snapshot: the connection state, and the one function that reloads the
//! snapshot of keys, tenants, policies, overrides and blocks and swaps it into the
//! pipeline's `Core` (`refresh`), used by the background refresher (`sync`), the admin
//! API and config reloads. The pipeline itself never reads the database: it sees the
//! published `admission::Dynamic` alone.
//!
//! The database returns plain records (`db::Records`); turning them into the key table
//! happens here: the effective tiers (the config's, with `rate_limit_policies` rows
//! replacing their key windows, plus the tiers only the database defines), then each key
//! with its tier and its `custom_override`. Database limits pass the checks config
//! limits pass (`config::window_limit`, `config::check_cost`); a refused one is logged
//! once, counted in `throttle_invalid_limits_total{source}`, and the key keeps its tier's
//! limits.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use sqlx::postgres::PgPool;

use crate::admission::{tenant_tier, Core, Dynamic, TenantTable};
use crate::config::calendar::TenantCalendar;
use crate::config::{
    burst_multiplier, check_cost, parse_algorithm, Config, LimitError, Tier, WindowSettings,
};
use crate::db::policies::{self, PolicyRow};
use crate::db::tenants::TenantRecord;
use crate::db::{self, DbError, Records};
use crate::identity::{apply_override, KeyInfo, KeyTable};
use crate::limiter::{ScopeLimits, Window};
use crate::metrics::Metrics;

/// The configured database: its pool once connected, and whether it answered last.
#[derive(Debug, Default)]
pub struct Database {
    url: Option<String>,
    pool: ArcSwapOption<PgPool>,
    healthy: AtomicBool,
}

// === impl Database ===

impl Database {
    /// The database at `url` (None: no database configured).
    pub fn new(url: Option<String>) -> Self {
        Self {
            url,
            ..Self::default()
        }
    }

    /// The URL, when a database is configured.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// Whether a database is configured.
    pub fn configured(&self) -> bool {
        self.url.is_some()
    }

    /// The pool once connected.
    pub fn pool(&self) -> Option<Arc<PgPool>> {
        self.pool.load_full()
    }

    /// Publishes the connected pool.
    pub fn set_pool(&self, pool: PgPool) {
        self.pool.store(Some(Arc::new(pool)));
    }

    /// Whether the database answered its last use.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Records health; true when it changed (log once per transition).
    pub fn set_healthy(&self, healthy: bool) -> bool {
        self.healthy.swap(healthy, Ordering::Relaxed) != healthy
    }
}

/// Reloads the snapshot from `pool` and publishes it.
///
/// # Errors
/// When the database fails; the old snapshot keeps serving.
pub async fn refresh(core: &Core, pool: &PgPool) -> Result<(), DbError> {
    let records = db::records(pool).await?;
    let previous = core.dynamic();
    let dynamic = build(
        &core.runtime().config,
        records,
        &core.metrics,
        previous.keys.refused(),
    );
    core.swap_dynamic(dynamic);
    Ok(())
}

/// The snapshot of `records` under `config`:
///
/// - the effective tiers (`effective_tiers`);
/// - each live database key (a key in both is the config's) with the tier of its
///   `policy_id`, else of its `tier` (keys naming no effective tier are skipped and
///   logged), its `custom_override` applied over that tier's key windows, and its
///   tenant's tier (the tenants table, else `[[tenants]]`, else the key's tier);
/// - the config's own keys, with the effective tiers of their tier names.
///
/// Refused limits are logged and counted unless `reported` (the previous snapshot's
/// refusals) holds them already: each is reported once while it stays.
pub fn build(
    config: &Config,
    records: Records,
    metrics: &Metrics,
    reported: &HashSet<String>,
) -> Dynamic {
    let mut refusals = Refusals {
        metrics,
        reported,
        seen: HashSet::new(),
    };
    let max_cost = config.max_cost();
    let tiers = effective_tiers(config, &records.policies, &mut refusals);
    let tenant_tiers = own_tenant_tiers(config, &records.tenants, &tiers);
    let tenants: HashMap<String, String> = records
        .tenants
        .into_iter()
        .map(|t| (t.id, t.tier))
        .collect();
    let table = TenantTable {
        tenants: &tenants,
        own: &tenant_tiers,
    };
    let tenant_tier = |t: &str| tenant_tier(config, table, &tiers, t);
    let mut keys = KeyTable::default();
    for k in &records.keys {
        if !crate::identity::key_id_allowed(&k.id) {
            tracing::warn!(key_id = %k.id, "key id is in the JWT callers' namespace (jwt:); ignored");
            continue;
        }
        let policy = k.policy_id.as_deref().and_then(|p| tiers.get(p));
        let Some(base) = policy.or_else(|| tiers.get(&k.tier)) else {
            let named = k.policy_id.as_deref().unwrap_or(&k.tier);
            tracing::warn!(key_id = %k.id, tier = %named, "key names a tier neither gateway.toml nor rate_limit_policies defines; ignored");
            continue;
        };
        let tier = match &k.custom_override {
            Some(o) => match apply_override(base, o, max_cost) {
                Ok(t) => Arc::new(t),
                Err(e) => {
                    refusals.refuse(Source::Override, &k.id, &o.to_string(), &e);
                    base.clone()
                }
            },
            None => base.clone(),
        };
        let of_tenant = tenant_tier(&k.tenant).unwrap_or_else(|| base.clone());
        keys.insert(
            k.sha256,
            KeyInfo::api_key(&k.id, &k.tenant, tier, of_tenant),
        );
    }
    // The config's own keys, last: a key in both is the config's; its tenant's tier by
    // the same rule (the tenants table first), so one tenant is limited at one size.
    for (sha256, info) in KeyTable::from_config_tiers(config, &tiers, &tenant_tier).iter() {
        keys.insert(*sha256, info.clone());
    }
    keys.set_refused(refusals.seen);
    Dynamic {
        tiers,
        tenants,
        tenant_tiers,
        ..Dynamic::new(keys, records.blocks)
    }
}

/// The tier of every tenant with its own calendar, over the effective `tiers`: the
/// tenants table's rows with `calendar_tz` or `billing_anchor_day` (a zone this build
/// does not know is logged and the row keeps its tier's calendar), and the `[[tenants]]`
/// entries with their own calendar that the table has no row for.
fn own_tenant_tiers(
    config: &Config,
    rows: &[TenantRecord],
    tiers: &HashMap<String, Arc<Tier>>,
) -> HashMap<String, Arc<Tier>> {
    let tier = |name: &str| tiers.get(name).or_else(|| config.tiers.get(name));
    let mut own = HashMap::new();
    for r in rows {
        let settings = TenantCalendar {
            zone: r.calendar_tz.as_deref(),
            anchor_day: r.billing_anchor_day.map(i64::from),
        };
        let Some(base) = tier(&r.tier).filter(|_| settings.is_set()) else {
            continue;
        };
        match crate::config::calendar::tenant_tier(base, settings) {
            Ok(t) => {
                own.insert(r.id.clone(), Arc::new(t));
            }
            Err(e) => {
                tracing::warn!(tenant = %r.id, error = %e, "tenant calendar refused; the tenant keeps its tier's calendar");
            }
        }
    }
    let in_table: HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    for (id, derived) in &config.tenant_tiers {
        if in_table.contains(id.as_str()) {
            continue;
        }
        if let Some(base) = tier(&derived.name) {
            let t = crate::config::calendar::with_tenant_windows_of(base, derived);
            own.insert(id.clone(), Arc::new(t));
        }
    }
    own
}

/// The tiers keys resolve against: every tier of `config`, with the key windows, burst
/// and algorithm of its `rate_limit_policies` row when that row is valid (the message,
/// failure policy, reset jitter and tenant windows stay the config's), and a tier for
/// every valid row the config does not name. A refused row leaves a config tier as the
/// config has it, and defines no tier otherwise.
fn effective_tiers(
    config: &Config,
    rows: &[PolicyRow],
    refusals: &mut Refusals<'_>,
) -> HashMap<String, Arc<Tier>> {
    let mut tiers = config.tiers.clone();
    for row in rows {
        let base = config.tiers.get(&row.id).map(|t| &**t);
        match row_tier(config, row) {
            Ok(t) if base == Some(&t) => {} // the row says what the config says
            Ok(t) => {
                tiers.insert(row.id.clone(), Arc::new(t));
            }
            Err(e) => refusals.refuse(Source::Policy, &row.id, &format!("{row:?}"), &e),
        }
    }
    tiers
}

/// The tier `row` defines under `config`: over the config's tier of that name, its
/// windows holding the costliest route's `cost`. What every gateway's snapshot refuses
/// (and so what `PUT /v1/policies` refuses before writing the row).
///
/// # Errors
/// `LimitError` naming the column refused.
pub fn row_tier(config: &Config, row: &PolicyRow) -> Result<Tier, LimitError> {
    let base = config.tiers.get(&row.id).map(|t| &**t);
    policy_tier(config, row, base, config.max_cost())
}

/// The tier `row` defines over `base` (the config's tier of that name, if any), its
/// windows validated as the config's are: a zero or NULL window is no window, NULL
/// `burst_multiplier` is 1.0, NULL `algorithm` each window's default.
///
/// # Errors
/// `LimitError` naming the column refused.
pub fn policy_tier(
    config: &Config,
    row: &PolicyRow,
    base: Option<&Tier>,
    max_cost: u32,
) -> Result<Tier, LimitError> {
    let settings = WindowSettings {
        burst_multiplier: burst_multiplier(row.burst_multiplier.unwrap_or(1.0))?,
        algorithm: match row.algorithm.as_deref() {
            Some(a) => Some(parse_algorithm("algorithm", a)?),
            None => None,
        },
        jitter_ms: base.map_or(0, |t| t.key_settings.jitter_ms),
        admission: base.map_or_else(Default::default, |t| t.key_settings.admission),
        calendar: base.and_then(|t| t.key_settings.calendar),
        fleet: base.map_or_else(Default::default, |t| t.key_settings.fleet),
    };
    let mut windows = Vec::new();
    for (window, limit) in Window::ALL.into_iter().zip(row.limits) {
        let column = policies::column(window);
        let limit = match limit {
            None | Some(0) => continue,
            Some(n) => u64::try_from(n).map_err(|_| LimitError::NotALimit {
                field: column.into(),
                value: n.to_string(),
            })?,
        };
        windows.push(
            settings
                .window(window, limit)
                .map_err(|e| e.for_field(column))?,
        );
    }
    // A window no column holds (`per_week`) stays the config's.
    if let Some(t) = base {
        let kept = t
            .key
            .windows
            .iter()
            .filter(|w| policies::column(w.window).is_empty());
        windows.extend(kept.copied());
        windows.sort_by_key(|w| Window::TABLE.iter().position(|x| *x == w.window));
    }
    let key = ScopeLimits {
        concurrent: base.and_then(|t| t.key.concurrent),
        ban: base.and_then(|t| t.key.ban),
        windows,
        on_failure: base.map_or(config.store.on_failure, |t| t.key.on_failure),
        message: base.and_then(|t| t.key.message.clone()),
        count_on: base.and_then(|t| t.key.count_on),
    };
    check_cost(&key, max_cost).map_err(|e| {
        let column = Window::ALL
            .into_iter()
            .find(|w| w.config_key() == e.field())
            .map_or("", policies::column);
        e.for_field(column)
    })?;
    let tenant = match base {
        Some(t) => t.tenant.clone(),
        None => Arc::new(ScopeLimits {
            concurrent: None,
            ban: None,
            windows: Vec::new(),
            on_failure: config.store.on_failure,
            message: None,
            count_on: None,
        }),
    };
    Ok(Tier {
        name: row.id.clone(),
        key: Arc::new(key),
        key_settings: settings,
        tenant,
    })
}

/// Where a refused limit came from (the `source` label).
#[derive(Debug, Clone, Copy)]
enum Source {
    /// A key's `custom_override`.
    Override,
    /// A `rate_limit_policies` row.
    Policy,
}

/// The refusals of one build, reported once each.
struct Refusals<'a> {
    metrics: &'a Metrics,
    /// Those the previous snapshot reported already.
    reported: &'a HashSet<String>,
    /// Those of this build.
    seen: HashSet<String>,
}

// === impl Refusals ===

impl Refusals<'_> {
    /// Records that `id`'s limits (`raw`) were refused with `e`: a log line and a count,
    /// unless the previous snapshot refused the same already.
    fn refuse(&mut self, source: Source, id: &str, raw: &str, e: &LimitError) {
        let label = match source {
            Source::Override => "override",
            Source::Policy => "policy",
        };
        let what = format!("{label}\u{0}{id}\u{0}{raw}\u{0}{e}");
        if !self.reported.contains(&what) && !self.seen.contains(&what) {
            self.metrics
                .invalid_limits_total
                .with_label_values(&[label])
                .inc();
            match source {
                Source::Override => {
                    tracing::warn!(key_id = %id, field = %e.field(), error = %e, "custom_override refused; the key keeps its tier's limits")
                }
                Source::Policy => {
                    tracing::warn!(policy_id = %id, field = %e.field(), error = %e, "rate_limit_policies row refused; its keys keep the limits of their tier in gateway.toml (or of api_keys.tier)")
                }
            }
        }
        self.seen.insert(what);
    }
}

#[cfg(test)]
#[path = "snapshot_calendar.rs"]
mod calendar_tests;

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;
    use crate::db::keys::ActiveKey;
    use crate::limiter::Algorithm;

    const CONFIG: &str = r#"
[tiers.free]
message = "free plan"
burst_multiplier = 2.0
key = { per_minute = 100, per_day = 1000, reset_jitter_secs = 60 }
tenant = { per_hour = 5000 }
[[routes]]
name = "search"
path_prefix = "/"
upstreams = ["127.0.0.1:9000"]
cost = 5
[[keys]]
id = "toml_key"
key = "toml-secret"
tenant = "acme"
tier = "free"
"#;

    fn row(id: &str, limits: [Option<i64>; 5]) -> PolicyRow {
        PolicyRow {
            id: id.into(),
            name: id.into(),
            limits,
            burst_multiplier: None,
            algorithm: None,
        }
    }

    fn key(id: &str, tier: &str, policy: Option<&str>, o: Option<serde_json::Value>) -> ActiveKey {
        ActiveKey {
            id: id.into(),
            tenant: "t".into(),
            tier: tier.into(),
            policy_id: policy.map(Into::into),
            sha256: Sha256::digest(id.as_bytes()).into(),
            custom_override: o,
        }
    }

    fn limits(d: &Dynamic, key: &str) -> Vec<(Window, u32, u32)> {
        let info = d.keys.lookup(key.as_bytes()).expect("key in the snapshot");
        let w = &info.tier.key.windows;
        w.iter().map(|w| (w.window, w.limit, w.capacity)).collect()
    }

    fn refused(m: &Metrics, source: &str) -> u64 {
        m.invalid_limits_total.with_label_values(&[source]).get()
    }

    /// A row replaces a config tier's key windows (keeping its message and tenant
    /// windows), a row of its own is a tier keys can be moved to, and the config's keys
    /// get the effective tiers too.
    #[test]
    fn rows_define_the_key_windows_of_tiers() {
        let c = crate::config::parse("t.toml", CONFIG).unwrap();
        let m = Metrics::new().unwrap();
        let mut free = row("free", [None, Some(7), None, Some(0), None]);
        free.burst_multiplier = Some(1.0);
        let mut gold = row("gold", [Some(50), None, None, Some(20_000), None]);
        gold.algorithm = Some("sliding_log".into());
        let records = Records {
            policies: vec![free, gold],
            keys: vec![
                key("k_free", "free", None, None),
                key("k_gold", "free", Some("gold"), None),
                key("k_lost", "nope", None, None),
            ],
            ..Records::default()
        };
        let d = build(&c, records, &m, &HashSet::new());
        assert_eq!(limits(&d, "k_free"), [(Window::Minute, 7, 7)]);
        let t = &d.keys.lookup(b"k_free").unwrap().tier;
        assert_eq!(t.key.message.as_deref(), Some("free plan"));
        assert_eq!(t.tenant, c.tiers["free"].tenant);
        assert_eq!(
            limits(&d, "k_gold"),
            [(Window::Second, 50, 50), (Window::Day, 20_000, 20_000)]
        );
        let gold = &d.keys.lookup(b"k_gold").unwrap().tier;
        assert!(gold
            .key
            .windows
            .iter()
            .all(|w| w.algorithm == Algorithm::SlidingLog));
        assert!(gold.tenant.windows.is_empty());
        assert!(d.keys.lookup(b"k_lost").is_none(), "unknown tier: skipped");
        assert_eq!(limits(&d, "toml-secret"), [(Window::Minute, 7, 7)]);
        assert_eq!(refused(&m, "policy"), 0);
    }

    /// A row the config would refuse leaves the tier as gateway.toml has it (or keys on
    /// a tier of its own on their api_keys.tier), counted once while it stays.
    #[test]
    fn invalid_rows_are_refused_and_counted_once() {
        let c = crate::config::parse("t.toml", CONFIG).unwrap();
        let m = Metrics::new().unwrap();
        let toml = [(Window::Minute, 100, 200), (Window::Day, 1000, 1000)];
        let cases = [
            row("free", [None, None, None, Some(1_000_000_000), None]),
            row("free", [None, Some(4), None, None, None]), // below the route cost 5
            row("free", [None, Some(-3), None, None, None]),
            PolicyRow {
                algorithm: Some("magic".into()),
                ..row("free", [None, Some(10), None, None, None])
            },
            PolicyRow {
                burst_multiplier: Some(0.5),
                ..row("free", [None, Some(10), None, None, None])
            },
            PolicyRow {
                algorithm: Some("sliding_log".into()),
                ..row("free", [None, None, Some(500_000), None, None])
            },
        ];
        let fields = [
            "req_per_day",
            "req_per_minute",
            "req_per_minute",
            "algorithm",
            "burst_multiplier",
            "req_per_hour",
        ];
        for (r, field) in cases.iter().zip(fields) {
            let e = policy_tier(&c, r, Some(&c.tiers["free"]), c.max_cost()).unwrap_err();
            assert_eq!(e.field(), field, "{e}");
        }
        let mut reported = HashSet::new();
        for round in 0..2 {
            let records = Records {
                policies: vec![
                    cases[0].clone(),
                    row("gold", [None, Some(1), None, None, None]),
                ],
                keys: vec![key("k_gold", "free", Some("gold"), None)],
                ..Records::default()
            };
            let d = build(&c, records, &m, &reported);
            assert_eq!(limits(&d, "k_gold"), toml, "round {round}");
            assert_eq!(limits(&d, "toml-secret"), toml);
            reported = d.keys.refused().clone();
        }
        assert_eq!(refused(&m, "policy"), 2, "two rows, each counted once");
    }

    /// A refused override leaves the key on its tier's limits, counted once; `null`
    /// removes a window; overrides apply over the row's windows with the row's burst.
    #[test]
    fn overrides_are_validated_and_counted() {
        let c = crate::config::parse("t.toml", CONFIG).unwrap();
        let m = Metrics::new().unwrap();
        let mut free = row("free", [None, Some(10), None, Some(1000), None]);
        free.burst_multiplier = Some(3.0);
        let records = || Records {
            policies: vec![free.clone()],
            keys: vec![
                key(
                    "k_bad",
                    "free",
                    None,
                    Some(serde_json::json!({"per_day": 1_000_000_000})),
                ),
                key(
                    "k_null",
                    "free",
                    None,
                    Some(serde_json::json!({"per_minute": null})),
                ),
                key(
                    "k_set",
                    "free",
                    None,
                    Some(serde_json::json!({"per_second": 2})),
                ),
            ],
            ..Records::default()
        };
        let d = build(&c, records(), &m, &HashSet::new());
        let tier = [(Window::Minute, 10, 30), (Window::Day, 1000, 1000)];
        assert_eq!(limits(&d, "k_bad"), tier);
        assert_eq!(limits(&d, "k_null"), [(Window::Day, 1000, 1000)]);
        assert_eq!(limits(&d, "k_set")[0], (Window::Second, 2, 6));
        assert_eq!(refused(&m, "override"), 1);
        let again = build(&c, records(), &m, d.keys.refused());
        assert_eq!(limits(&again, "k_bad"), tier);
        assert_eq!(refused(&m, "override"), 1, "reported once while it stays");
    }
}
