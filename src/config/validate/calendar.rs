//! `calendar_tz` and `billing_anchor_day` on scope tables, tiers and `[[tenants]]`: the
//! zone and the anchor checked where they are written, and refused on a table with no
//! window they would move.

use super::*;
use crate::config::calendar::{tenant_tier, TenantCalendar};
use crate::limiter::algorithm::Calendar;
use crate::limiter::WindowLimit;

/// The keys a table's calendar comes from: its own, else its tier's (each key apart).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CalendarKeys<'a> {
    pub(super) zone: Option<&'a Spanned<String>>,
    pub(super) anchor: Option<&'a Spanned<i64>>,
}

// === impl CalendarKeys ===

impl<'a> CalendarKeys<'a> {
    /// The keys of `s`, each falling back to `tier`'s.
    pub(super) fn of(s: &'a ScopeFile, tier: CalendarKeys<'a>) -> Self {
        Self {
            zone: s.calendar_tz.as_ref().or(tier.zone),
            anchor: s.billing_anchor_day.as_ref().or(tier.anchor),
        }
    }

    /// The calendar they name (None when neither is given), each error at its value.
    pub(super) fn calendar(&self, cx: &Ctx<'_>) -> Result<Option<&'static Calendar>, ConfigError> {
        if self.zone.is_none() && self.anchor.is_none() {
            return Ok(None);
        }
        let day = match self.anchor {
            Some(a) => anchor_day(cx, a)?,
            None => 1,
        };
        let zone = self.zone.map_or("UTC", |z| z.get_ref().as_str());
        Calendar::interned(zone, day).map(Some).map_err(|e| {
            let span = self.zone.map_or(0..0, Spanned::span);
            cx.err(span, format!("calendar_tz: {e}"))
        })
    }
}

/// `billing_anchor_day`, checked: 1..=28.
fn anchor_day(cx: &Ctx<'_>, a: &Spanned<i64>) -> Result<i64, ConfigError> {
    let day = *a.get_ref();
    if (1..=28).contains(&day) {
        return Ok(day);
    }
    let msg = format!("billing_anchor_day must be 1..=28 (every month has these days), got {day}");
    Err(cx.err(a.span(), msg))
}

/// The calendar a `per_week` window without `calendar_tz` follows: Monday weeks in UTC.
pub(super) fn utc_weeks(cx: &Ctx<'_>) -> Result<&'static Calendar, ConfigError> {
    Calendar::interned("UTC", 1).map_err(|e| cx.err(0..0, e.to_string()))
}

/// Refuses `calendar_tz` / `billing_anchor_day` written on table `s` when none of its
/// `windows` would follow them (`billing_anchor_day` moves month windows only).
pub(super) fn refuse_unaligned(
    cx: &Ctx<'_>,
    s: &ScopeFile,
    windows: &[WindowLimit],
) -> Result<(), ConfigError> {
    let own = CalendarKeys {
        zone: s.calendar_tz.as_ref(),
        anchor: s.billing_anchor_day.as_ref(),
    };
    own.refuse_unaligned(cx, windows, "this table")
}

impl CalendarKeys<'_> {
    /// Refuses these keys when none of `windows` (those of `table`) would follow them.
    pub(super) fn refuse_unaligned(
        &self,
        cx: &Ctx<'_>,
        windows: &[WindowLimit],
        table: &str,
    ) -> Result<(), ConfigError> {
        if let Some(z) = self.zone {
            if !windows.iter().any(WindowLimit::follows_calendar) {
                let msg = unaligned("calendar_tz", windows, false, table);
                return Err(cx.err(z.span(), msg));
            }
        }
        if let Some(a) = self.anchor {
            let months = |w: &WindowLimit| w.window == Window::Month && w.follows_calendar();
            if !windows.iter().any(months) {
                let msg = unaligned("billing_anchor_day", windows, true, table);
                return Err(cx.err(a.span(), msg));
            }
        }
        Ok(())
    }
}

/// Why `key` moves nothing in `table` of `windows` (`months`: only month windows count).
pub(super) fn unaligned(key: &str, windows: &[WindowLimit], months: bool, table: &str) -> String {
    let what = if months {
        "starts the month windows of fixed_window and sliding_window on that day"
    } else {
        "aligns day, week and month windows of fixed_window and sliding_window"
    };
    let kinds: &[Window] = if months {
        &[Window::Month]
    } else {
        &[Window::Day, Window::Week, Window::Month]
    };
    let other: Vec<String> = windows
        .iter()
        .filter(|w| kinds.contains(&w.window))
        .map(|w| format!("{} uses {}", w.window.config_key(), w.algorithm.as_str()))
        .collect();
    let why = if other.is_empty() {
        let names: Vec<&str> = kinds.iter().map(|w| w.config_key()).collect();
        match names.split_last() {
            Some((last, [])) => format!("it has no {last}"),
            Some((last, rest)) => format!("it has no {} or {last}", rest.join(", ")),
            None => String::new(),
        }
    } else {
        other.join(", ")
    };
    format!("{key} {what}; {table} has none ({why})")
}

/// `[[tenants]]` entry `t`'s own calendar over its tier's tenant windows: the tier it is
/// limited at, or None when it sets none. Refused: a bad zone or anchor, or a tier whose
/// tenant table has no window the setting would move.
pub(super) fn tenant_own_tier(
    cx: &Ctx<'_>,
    t: &TenantFile,
    tier: &Tier,
) -> Result<Option<Arc<Tier>>, ConfigError> {
    let own = CalendarKeys {
        zone: t.calendar_tz.as_ref(),
        anchor: t.billing_anchor_day.as_ref(),
    };
    let Some(span) = own
        .zone
        .map(Spanned::span)
        .or(own.anchor.map(Spanned::span))
    else {
        return Ok(None);
    };
    own.calendar(cx)?;
    let table = format!("tenant {:?}'s tier {:?} tenant table", t.id, tier.name);
    own.refuse_unaligned(cx, &tier.tenant.windows, &table)?;
    let settings = TenantCalendar {
        zone: own.zone.map(|z| z.get_ref().as_str()),
        anchor_day: own.anchor.map(|a| *a.get_ref()),
    };
    tenant_tier(tier, settings)
        .map(|t| Some(Arc::new(t)))
        .map_err(|e| cx.err(span, e.to_string()))
}

/// The tenants of the file and their tiers' names, with the tier made for each entry
/// that has its own calendar (see `tenant_own_tier`).
pub(super) type Tenants = (HashMap<String, String>, HashMap<String, Arc<Tier>>);

/// `[[tenants]]`: each names a known tier; an entry with `calendar_tz` or
/// `billing_anchor_day` gets a tier of its own.
pub(super) fn tenants(
    cx: &Ctx<'_>,
    list: &[TenantFile],
    tiers: &HashMap<String, Arc<Tier>>,
) -> Result<Tenants, ConfigError> {
    let mut names = HashMap::new();
    let mut own = HashMap::new();
    for t in list {
        known_tier(cx, &t.tier, tiers)?;
        names.insert(t.id.clone(), t.tier.get_ref().clone());
        if let Some(tier) = tiers.get(t.tier.get_ref()) {
            if let Some(derived) = tenant_own_tier(cx, t, tier)? {
                own.insert(t.id.clone(), derived);
            }
        }
    }
    Ok((names, own))
}
