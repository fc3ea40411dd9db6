//! The calendar: epoch-aligned window bounds, and UTC months for `Window::Month`.

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

pub(crate) const DAY_MS: u64 = 86_400_000;

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
