//! `[limits.*]` and `[tiers.*]`: scope tables, their windows, bans and concurrency.

use super::*;

/// The scope tables of `[limits]` and the tiers.
pub(super) struct Limits {
    pub(super) ip_limits: Option<Arc<ScopeLimits>>,
    pub(super) global_limits: Option<Arc<ScopeLimits>>,
    pub(super) auth_limits: Option<Arc<ScopeLimits>>,
    pub(super) tiers: HashMap<String, Arc<Tier>>,
}

/// `[limits.ip]`, `[limits.global]` (which takes no ban), `[limits.auth]` and `[tiers.*]`,
/// in that order.
pub(super) fn limits(
    cx: &Ctx<'_>,
    raw: &File,
    on_failure: OnFailure,
) -> Result<Limits, ConfigError> {
    let table = |name: &str| raw.limits.0.get(name);
    let ip_limits = match table("ip") {
        Some(s) => Some(Arc::new(applying(
            cx,
            s,
            "[limits.ip]",
            scope(cx, s.get_ref(), &Inherit::default(), on_failure),
        )?)),
        None => None,
    };
    if let Some(b) = raw.limits.table("global").and_then(|g| g.ban.as_ref()) {
        let msg = "ban applies to [limits.ip], [limits.auth] and tier key / tenant tables, not [limits.global] (it would block everyone)";
        return Err(cx.err(b.span(), msg));
    }
    let rate = |name: &str| -> Result<Option<Arc<ScopeLimits>>, ConfigError> {
        let Some(s) = table(name) else {
            return Ok(None);
        };
        let label = format!("[limits.{name}]");
        if let (Some(c), "auth") = (&s.get_ref().count_on, name) {
            let msg = "count_on applies to the tables a request is admitted on, not [limits.auth] (it counts failed authentications)";
            return Err(cx.err(c.span(), msg));
        }
        let built = rate_only(cx, s.get_ref(), &label, on_failure);
        Ok(Some(Arc::new(applying(cx, s, &label, built)?)))
    };
    let global_limits = rate("global")?;
    let auth_limits = rate("auth")?;
    // With a database a tier's key windows may come from its `rate_limit_policies` row or
    // a key's override, built with the key table's settings: such a table can apply.
    let windows_elsewhere = raw.database.is_some();
    let mut tiers = HashMap::new();
    for (tier_name, t) in &raw.tiers {
        let built = tier(cx, tier_name, t.get_ref(), on_failure, windows_elsewhere)?;
        tiers.insert(tier_name.clone(), Arc::new(built));
    }
    Ok(Limits {
        ip_limits,
        global_limits,
        auth_limits,
        tiers,
    })
}

/// `built`, the scope table `s` named `label`, when it can ever limit a request: a table
/// with neither a window nor `concurrent` is an error at the table (after any error in its
/// values, which names a more precise place); `count_on` on a table without a window (a
/// concurrency-only table reserves nothing to refund) is an error at `count_on`.
pub(super) fn applying(
    cx: &Ctx<'_>,
    s: &Spanned<ScopeFile>,
    label: &str,
    built: Result<ScopeLimits, ConfigError>,
) -> Result<ScopeLimits, ConfigError> {
    let built = built?;
    if built.windows.is_empty() && built.concurrent.is_none() {
        return Err(cx.err(s.span(), never_applies(label)));
    }
    if let (true, Some(c)) = (built.windows.is_empty(), &s.get_ref().count_on) {
        let msg = format!("{label}: count_on needs a rate window (per_second, per_minute, per_hour, per_day or per_month): a table without one reserves nothing to refund");
        return Err(cx.err(c.span(), msg));
    }
    Ok(built)
}

/// Why a table without windows and `concurrent` is refused.
pub(super) fn never_applies(label: &str) -> String {
    format!("{label} has no window (per_second, per_minute, per_hour, per_day or per_month) and no concurrent: it would never limit anything")
}

pub(super) fn algorithm(a: AlgorithmFile) -> Algorithm {
    match a {
        AlgorithmFile::TokenBucket => Algorithm::TokenBucket,
        AlgorithmFile::SlidingWindow => Algorithm::SlidingWindow,
        AlgorithmFile::FixedWindow => Algorithm::FixedWindow,
        AlgorithmFile::SlidingLog => Algorithm::SlidingLog,
        AlgorithmFile::LeakyBucket => Algorithm::LeakyBucket,
    }
}

pub(super) fn burst(cx: &Ctx<'_>, b: &Spanned<f64>) -> Result<f64, ConfigError> {
    burst_multiplier(*b.get_ref()).map_err(|e| cx.err(b.span(), e.to_string()))
}

/// What a tier's `key` and `tenant` tables take from the tier when they do not say.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Inherit<'a> {
    /// The tier's `burst_multiplier`.
    pub(super) burst: Option<f64>,
    /// The tier's `message`.
    pub(super) message: Option<&'a String>,
    /// The tier's `calendar_tz` and `billing_anchor_day`.
    pub(super) calendar: CalendarKeys<'a>,
    /// The tier's `fleet`.
    pub(super) fleet: Option<&'a Spanned<FleetFile>>,
    /// The table's windows may also come from the database (a tier's key table with
    /// `[database]`): its calendar keys are not refused for want of a window here.
    pub(super) windows_elsewhere: bool,
}

/// How the windows of scope table `s` are built, over what it inherits.
pub(super) fn settings(
    cx: &Ctx<'_>,
    s: &ScopeFile,
    inherit: &Inherit<'_>,
) -> Result<WindowSettings, ConfigError> {
    Ok(WindowSettings {
        burst_multiplier: match &s.burst_multiplier {
            Some(b) => burst(cx, b)?,
            None => inherit.burst.unwrap_or(1.0),
        },
        algorithm: s.algorithm.as_ref().map(|a| algorithm(*a.get_ref())),
        jitter_ms: s.reset_jitter_secs.unwrap_or(0).saturating_mul(1000),
        admission: match s.admission {
            Some(AdmissionFile::Exact) => Admission::Exact,
            Some(AdmissionFile::Auto) | None => Admission::Auto,
        },
        calendar: CalendarKeys::of(s, inherit.calendar).calendar(cx)?,
        fleet: fleet(cx, s, inherit.fleet)?,
    })
}

/// A scope table over what it inherits from its tier. Each window goes through
/// `config::window_limit`, its error placed at the window's value; `per_week` without a
/// calendar counts Monday weeks in UTC. `calendar_tz` / `billing_anchor_day` written on a
/// table none of whose windows they would move are refused.
pub(super) fn scope(
    cx: &Ctx<'_>,
    s: &ScopeFile,
    inherit: &Inherit<'_>,
    default_failure: OnFailure,
) -> Result<ScopeLimits, ConfigError> {
    let settings = settings(cx, s, inherit)?;
    let fields = s.window_fields();
    let mut windows = Vec::new();
    for (window, field) in Window::TABLE.into_iter().zip(fields) {
        let Some(v) = field else { continue };
        let mut wl = settings
            .window(window, *v.get_ref())
            .map_err(|e| cx.err(v.span(), e.to_string()))?;
        if window == Window::Week && settings.calendar.is_none() {
            wl = wl.with_calendar(Some(utc_weeks(cx)?));
        }
        windows.push(wl);
    }
    if !inherit.windows_elsewhere {
        refuse_unaligned(cx, s, &windows)?;
        refuse_windowless(cx, s.fleet.as_ref(), &windows, "this table")?;
    }
    warn_small(cx, s, &windows);
    let concurrent = match &s.concurrent {
        None => None,
        Some(c) => match u32::try_from(*c.get_ref()) {
            Ok(n) if (1..=MAX_CONCURRENT).contains(&n) => Some(n),
            _ => {
                return Err(cx.err(
                    c.span(),
                    format!("concurrent must be between 1 and {MAX_CONCURRENT}"),
                ))
            }
        },
    };
    let ban = match &s.ban {
        None => None,
        Some(b) => Some(ban_rule(cx, b.get_ref())?),
    };
    Ok(ScopeLimits {
        concurrent,
        ban,
        windows,
        on_failure: s.on_failure.map_or(default_failure, on_failure),
        message: s.message.clone().or_else(|| inherit.message.cloned()),
        count_on: count_on(cx, s)?,
    })
}

/// `count_on = [...]`: status codes or classes (`crate::limiter::StatusSet::parse`); an
/// error at the list. (`applying` refuses it on a table without a rate window.)
fn count_on(cx: &Ctx<'_>, s: &ScopeFile) -> Result<Option<crate::limiter::StatusSet>, ConfigError> {
    let Some(list) = &s.count_on else {
        return Ok(None);
    };
    crate::limiter::StatusSet::parse(list.get_ref())
        .map(Some)
        .map_err(|e| cx.err(list.span(), e))
}

/// `ban = {...}`, each value bounded: a ban needs at least one rejection, and spans
/// within a day (counting) and 30 days (the ban).
pub(super) fn ban_rule(cx: &Ctx<'_>, b: &BanFile) -> Result<BanRule, ConfigError> {
    let after = bounded(cx, "ban.after", Some(&b.after), 1..=1_000_000)?.unwrap_or(1);
    let within = bounded(cx, "ban.within_secs", Some(&b.within_secs), 1..=86_400)?.unwrap_or(1);
    let for_secs = bounded(cx, "ban.for_secs", Some(&b.for_secs), 1..=30 * 86_400)?.unwrap_or(1);
    Ok(BanRule {
        after: u32::try_from(after).unwrap_or(u32::MAX),
        within_ms: within * 1000,
        for_ms: for_secs * 1000,
        from_check: b.from_check.unwrap_or(false),
    })
}

/// The largest `concurrent`: requests in flight of one identity.
pub(super) const MAX_CONCURRENT: u32 = 1_000_000;

/// A scope table that takes rate windows only (`[limits.global]`, `[limits.auth]`): the
/// contract puts `concurrent` on ip, key and tenant.
pub(super) fn rate_only(
    cx: &Ctx<'_>,
    s: &ScopeFile,
    table: &str,
    default_failure: OnFailure,
) -> Result<ScopeLimits, ConfigError> {
    if let Some(c) = &s.concurrent {
        return Err(cx.err(
            c.span(),
            format!("concurrent applies to [limits.ip] and tier key / tenant tables, not {table}"),
        ));
    }
    scope(cx, s, &Inherit::default(), default_failure)
}

/// `[tiers.<name>]`; `windows_elsewhere`: its key windows may also come from the database,
/// so a key table without windows of its own is not refused. The tier's `calendar_tz` /
/// `billing_anchor_day` are its tables' defaults, refused when neither table has a window
/// they would move (unless key windows may come from the database).
pub(super) fn tier(
    cx: &Ctx<'_>,
    name: &str,
    t: &TierFile,
    default_failure: OnFailure,
    windows_elsewhere: bool,
) -> Result<Tier, ConfigError> {
    let b = match &t.burst_multiplier {
        Some(b) => Some(burst(cx, b)?),
        None => None,
    };
    let calendar = CalendarKeys {
        zone: t.calendar_tz.as_ref(),
        anchor: t.billing_anchor_day.as_ref(),
    };
    let inherit = Inherit {
        burst: b,
        message: t.message.as_ref(),
        calendar,
        fleet: t.fleet.as_ref(),
        windows_elsewhere: false,
    };
    let table = |s: Option<&Spanned<ScopeFile>>, which: &str, any_windows: bool| {
        let inherit = Inherit {
            windows_elsewhere: any_windows,
            ..inherit
        };
        let Some(s) = s else {
            return scope(cx, &ScopeFile::default(), &inherit, default_failure);
        };
        let built = scope(cx, s.get_ref(), &inherit, default_failure);
        if any_windows {
            return built;
        }
        applying(cx, s, &format!("[tiers.{name}] {which}"), built)
    };
    let key = table(t.key.as_ref(), "key", windows_elsewhere)?;
    let tenant = table(t.tenant.as_ref(), "tenant", false)?;
    if !windows_elsewhere {
        let both: Vec<WindowLimit> = key.windows.iter().chain(&tenant.windows).copied().collect();
        let table = format!("[tiers.{name}] (key and tenant)");
        calendar.refuse_unaligned(cx, &both, &table)?;
        refuse_windowless(cx, t.fleet.as_ref(), &both, &table)?;
    }
    let empty = ScopeFile::default();
    let key_file = t.key.as_ref().map_or(&empty, Spanned::get_ref);
    Ok(Tier {
        name: name.to_string(),
        key: Arc::new(key),
        key_settings: settings(cx, key_file, &inherit)?,
        tenant: Arc::new(tenant),
    })
}

pub(super) fn known_tier(
    cx: &Ctx<'_>,
    tier: &Spanned<String>,
    tiers: &HashMap<String, Arc<Tier>>,
) -> Result<(), ConfigError> {
    if tiers.contains_key(tier.get_ref()) {
        return Ok(());
    }
    let mut known: Vec<&str> = tiers.keys().map(String::as_str).collect();
    known.sort_unstable();
    Err(cx.err(
        tier.span(),
        format!(
            "unknown tier {:?} (known tiers: {})",
            tier.get_ref(),
            known.join(", ")
        ),
    ))
}
