//! The calendar: epoch-aligned window bounds, UTC months for `Window::Month`, and
//! [`Calendar`]: days, Monday weeks and (anchored) months at local midnight in an IANA zone.

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::Timestamp;

use crate::limiter::policy::Window;

/// The `[start, end)` of the epoch-aligned window containing `now_ms`, shifted by `offset_ms`.
/// `Month` is the calendar month in UTC.
pub fn bounds(window: Window, now_ms: u64, offset_ms: u64) -> (u64, u64) {
    let t = now_ms.saturating_sub(offset_ms);
    let (start, end) = match window {
        Window::Month => month_bounds(t),
        w => {
            let p = w.period_ms();
            let start = t - t % p;
            (start, start + p)
        }
    };
    (start + offset_ms, end + offset_ms)
}

/// [`bounds`] in a scope's calendar: `Day`, `Week` (Monday) and `Month` (from the anchor
/// day) start at local midnight of `calendar`; every other window, and every window
/// without a calendar, is [`bounds`]. `offset_ms` shifts both edges, as there.
pub fn bounds_in(
    window: Window,
    now_ms: u64,
    offset_ms: u64,
    calendar: Option<&Calendar>,
) -> (u64, u64) {
    let Some(cal) = calendar else {
        return bounds(window, now_ms, offset_ms);
    };
    let t = now_ms.saturating_sub(offset_ms);
    let local = match window {
        Window::Day => cal.day(t),
        Window::Week => cal.week(t),
        Window::Month => cal.month(t),
        _ => None,
    };
    match local {
        Some((start, end)) => (start + offset_ms, end + offset_ms),
        None => bounds(window, now_ms, offset_ms),
    }
}

/// The four edges around `now_ms` of a calendar window: `[prev_start, start)` the window
/// before, `[start, end)` the one containing `now_ms`, `[end, next_end)` the next. The
/// gateway computes them (the one place that knows the zone) and hands them to the Lua
/// script, which looks times up in them (see `bounds` in `lua/prelude.lua`).
pub fn edges(window: Window, now_ms: u64, offset_ms: u64, calendar: Option<&Calendar>) -> [u64; 4] {
    let (start, end) = bounds_in(window, now_ms, offset_ms, calendar);
    let (prev_start, _) = bounds_in(window, start.saturating_sub(1), offset_ms, calendar);
    let (_, next_end) = bounds_in(window, end, offset_ms, calendar);
    [prev_start, start, end, next_end]
}

pub(crate) const DAY_MS: u64 = 86_400_000;

/// Why a calendar setting is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalendarError {
    /// Not a zone of the IANA time-zone database (bundled in the binary).
    #[error("unknown time zone `{0}` (an IANA name such as \"Europe/Berlin\")")]
    UnknownZone(String),
    /// `billing_anchor_day` outside 1..=28 (every month has these days).
    #[error("billing_anchor_day must be 1..=28, got {0}")]
    AnchorDay(i64),
}

/// Where a scope's calendar windows begin: local midnight in an IANA time zone, and the
/// day of the month a month starts on (`billing_anchor_day`, 1..=28). DST is followed: a
/// local day is 23 or 25 hours on the days the clocks change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calendar {
    tz: TimeZone,
    anchor_day: i8,
}

impl Calendar {
    /// The calendar of `zone` (an IANA name; `"UTC"` too) with months starting on
    /// `anchor_day`.
    pub fn new(zone: &str, anchor_day: i64) -> Result<Self, CalendarError> {
        let tz = TimeZone::get(zone).map_err(|_| CalendarError::UnknownZone(zone.to_owned()))?;
        let anchor_day = match i8::try_from(anchor_day) {
            Ok(d @ 1..=28) => d,
            _ => return Err(CalendarError::AnchorDay(anchor_day)),
        };
        Ok(Self { tz, anchor_day })
    }

    /// The calendar of `zone` and `anchor_day`, interned for the life of the process:
    /// one leaked value per distinct pair (at most the zones of the bundled database x
    /// 28 anchors), so a `WindowLimit` can hold it and stay `Copy`.
    ///
    /// # Errors
    /// As [`Calendar::new`].
    pub fn interned(zone: &str, anchor_day: i64) -> Result<&'static Calendar, CalendarError> {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        type Table = Mutex<HashMap<(String, i64), &'static Calendar>>;
        static TABLE: OnceLock<Table> = OnceLock::new();
        let table = TABLE.get_or_init(Table::default);
        let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = t.get(&(zone.to_owned(), anchor_day)) {
            return Ok(c);
        }
        let cal: &'static Calendar = Box::leak(Box::new(Calendar::new(zone, anchor_day)?));
        t.insert((zone.to_owned(), anchor_day), cal);
        Ok(cal)
    }

    /// The IANA name of the zone.
    pub fn zone(&self) -> &str {
        self.tz.iana_name().unwrap_or("UTC")
    }

    /// The day of the month a month starts on.
    pub fn anchor_day(&self) -> u8 {
        self.anchor_day.unsigned_abs()
    }

    /// The local day containing `t_ms`: `[midnight, next midnight)`.
    pub fn day(&self, t_ms: u64) -> Option<(u64, u64)> {
        let today = self.date_of(t_ms)?;
        self.span(today, today.tomorrow().ok()?)
    }

    /// The local week (Monday to Monday) containing `t_ms`.
    pub fn week(&self, t_ms: u64) -> Option<(u64, u64)> {
        let today = self.date_of(t_ms)?;
        let back = i64::from(today.weekday().to_monday_zero_offset());
        let monday = today.checked_sub(jiff::Span::new().days(back)).ok()?;
        self.span(monday, monday.checked_add(jiff::Span::new().days(7)).ok()?)
    }

    /// The month containing `t_ms`, from the anchor day at local midnight to the anchor
    /// day of the next month.
    pub fn month(&self, t_ms: u64) -> Option<(u64, u64)> {
        let today = self.date_of(t_ms)?;
        let (mut y, mut m) = (today.year(), today.month());
        if today.day() < self.anchor_day {
            (y, m) = if m == 1 { (y - 1, 12) } else { (y, m - 1) };
        }
        let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
        let start = Date::new(y, m, self.anchor_day).ok()?;
        self.span(start, Date::new(ny, nm, self.anchor_day).ok()?)
    }

    fn date_of(&self, t_ms: u64) -> Option<Date> {
        let ts = Timestamp::from_millisecond(i64::try_from(t_ms).ok()?).ok()?;
        Some(self.tz.to_datetime(ts).date())
    }

    /// `[midnight of from, midnight of to)` in ms since the epoch.
    fn span(&self, from: Date, to: Date) -> Option<(u64, u64)> {
        Some((self.midnight(from)?, self.midnight(to)?))
    }

    /// The first instant of `date` in the zone: midnight, or the end of a gap that
    /// swallows midnight (the compatible disambiguation picks the later side of a gap).
    fn midnight(&self, date: Date) -> Option<u64> {
        let dt: DateTime = date.to_datetime(Time::midnight());
        let ts = self.tz.to_ambiguous_timestamp(dt).compatible().ok()?;
        u64::try_from(ts.as_millisecond()).ok()
    }
}

fn month_bounds(t: u64) -> (u64, u64) {
    let (y, m, _) = civil_from_days((t / DAY_MS) as i64);
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let start = days_from_civil(y, m, 1).max(0) as u64 * DAY_MS;
    let end = days_from_civil(ny, nm, 1).max(0) as u64 * DAY_MS;
    (start, end)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The (year, month, day) of a day count since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}
