//! Calendar quotas on built tiers: a tenant's own `calendar_tz` / `billing_anchor_day`
//! (`[[tenants]]`, or the tenants table's columns) over its tier's, made once (at config
//! load or in the database snapshot) into the tenant's own tier, so the tenant-tier rule
//! hands it out with no work per request.

use crate::config::Tier;
use crate::limiter::algorithm::{Calendar, CalendarError};
use crate::limiter::{ScopeLimits, WindowLimit};

/// A tenant's own calendar settings: each None keeps its tier's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TenantCalendar<'a> {
    /// `calendar_tz` (an IANA name).
    pub zone: Option<&'a str>,
    /// `billing_anchor_day` (1..=28).
    pub anchor_day: Option<i64>,
}

// === impl TenantCalendar ===

impl TenantCalendar<'_> {
    /// Whether the tenant sets anything of its own.
    pub fn is_set(&self) -> bool {
        self.zone.is_some() || self.anchor_day.is_some()
    }

    /// The calendar of a table whose own calendar is `base` (None: UTC, the 1st) with
    /// these settings over it.
    ///
    /// # Errors
    /// An unknown zone or an anchor outside 1..=28.
    pub fn over(&self, base: Option<&Calendar>) -> Result<&'static Calendar, CalendarError> {
        let zone = self.zone.or(base.map(Calendar::zone)).unwrap_or("UTC");
        let anchor = self
            .anchor_day
            .unwrap_or(base.map_or(1, |c| i64::from(c.anchor_day())));
        Calendar::interned(zone, anchor)
    }
}

/// The calendar `limits`' windows follow: that of its first window that has one.
pub fn table_calendar(limits: &ScopeLimits) -> Option<&'static Calendar> {
    limits.windows.iter().find_map(|w| w.calendar)
}

/// Whether a calendar would move any window of `limits` (a day, week or month counted by
/// `fixed_window` or `sliding_window`).
pub fn any_aligned(limits: &ScopeLimits) -> bool {
    limits.windows.iter().any(WindowLimit::follows_calendar)
}

/// `tier` with its tenant windows following `own` over the tier's tenant calendar: the
/// tier a tenant with its own `calendar_tz` / `billing_anchor_day` is limited at. Key
/// windows stay the tier's (a key follows its own tier's calendar).
///
/// # Errors
/// An unknown zone or an anchor outside 1..=28.
pub fn tenant_tier(tier: &Tier, own: TenantCalendar<'_>) -> Result<Tier, CalendarError> {
    let calendar = own.over(table_calendar(&tier.tenant))?;
    Ok(with_tenant_windows(tier, |w| {
        w.with_calendar(Some(calendar))
    }))
}

/// `tier` with the tenant windows of `derived` (a tier [`tenant_tier`] made from a tier
/// of the same name): how a database snapshot carries a `[[tenants]]` entry's own
/// calendar over to the effective tier, whose tenant windows are the config's.
pub fn with_tenant_windows_of(tier: &Tier, derived: &Tier) -> Tier {
    Tier {
        tenant: derived.tenant.clone(),
        ..tier.clone()
    }
}

fn with_tenant_windows(tier: &Tier, f: impl Fn(WindowLimit) -> WindowLimit) -> Tier {
    let tenant = ScopeLimits {
        windows: tier.tenant.windows.iter().copied().map(f).collect(),
        ..(*tier.tenant).clone()
    };
    Tier {
        tenant: std::sync::Arc::new(tenant),
        ..tier.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Window};

    fn zone(w: &WindowLimit) -> Option<(&str, u8)> {
        w.calendar.map(|c| (c.zone(), c.anchor_day()))
    }

    /// Each row: the tier's tenant calendar, the tenant's own settings, the calendar the
    /// tenant's day and month windows follow (the hour window never has one).
    #[test]
    fn a_tenant_calendar_over_its_tier() {
        let berlin = Calendar::interned("Europe/Berlin", 15).ok();
        let rows: [(Option<&'static Calendar>, TenantCalendar<'_>, (&str, u8)); 4] = [
            (
                None,
                TenantCalendar {
                    zone: Some("Pacific/Auckland"),
                    anchor_day: None,
                },
                ("Pacific/Auckland", 1),
            ),
            (
                None,
                TenantCalendar {
                    zone: None,
                    anchor_day: Some(15),
                },
                ("UTC", 15),
            ),
            (
                berlin,
                TenantCalendar {
                    zone: Some("America/Los_Angeles"),
                    anchor_day: None,
                },
                ("America/Los_Angeles", 15),
            ),
            (
                berlin,
                TenantCalendar {
                    zone: None,
                    anchor_day: Some(3),
                },
                ("Europe/Berlin", 3),
            ),
        ];
        for (base, own, want) in rows {
            let windows = [
                WindowLimit::with_algorithm(Window::Hour, 10, Algorithm::SlidingWindow),
                WindowLimit::with_algorithm(Window::Day, 10, Algorithm::FixedWindow),
                WindowLimit::with_algorithm(Window::Month, 10, Algorithm::FixedWindow),
                WindowLimit::with_algorithm(Window::Week, 10, Algorithm::TokenBucket),
            ]
            .map(|w| w.with_calendar(base));
            let limits = ScopeLimits {
                windows: windows.to_vec(),
                on_failure: crate::limiter::OnFailure::Local,
                message: None,
                concurrent: None,
                ban: None,
                count_on: None,
            };
            let tier = Tier {
                name: "t".into(),
                key: std::sync::Arc::new(limits.clone()),
                key_settings: crate::config::WindowSettings::default(),
                tenant: std::sync::Arc::new(limits),
            };
            let derived = tenant_tier(&tier, own).unwrap();
            let got: Vec<_> = derived.tenant.windows.iter().map(zone).collect();
            assert_eq!(got, [None, Some(want), Some(want), None], "{own:?}");
            // The key windows stay the tier's.
            assert_eq!(derived.key, tier.key);
        }
        let bad = TenantCalendar {
            zone: Some("Mars/Olympus"),
            anchor_day: None,
        };
        assert!(matches!(bad.over(None), Err(CalendarError::UnknownZone(_))));
        let bad = TenantCalendar {
            zone: None,
            anchor_day: Some(29),
        };
        assert_eq!(bad.over(None), Err(CalendarError::AnchorDay(29)));
    }
}
