//! The `status` label of the request metrics.

use super::STATUS_LABELS;

/// The position of `code`'s label in `STATUS_LABELS`.
pub fn status_index(code: u16) -> usize {
    let label = status_label(code);
    STATUS_LABELS
        .iter()
        .position(|l| *l == label)
        .unwrap_or(STATUS_LABELS.len() - 1)
}

/// The `status` label: a static string for common codes, no allocation.
pub fn status_label(code: u16) -> &'static str {
    const EXACT: [(u16, &str); 15] = [
        (200, "200"),
        (201, "201"),
        (204, "204"),
        (301, "301"),
        (302, "302"),
        (304, "304"),
        (400, "400"),
        (401, "401"),
        (403, "403"),
        (404, "404"),
        (429, "429"),
        (500, "500"),
        (502, "502"),
        (503, "503"),
        (504, "504"),
    ];
    if let Some((_, s)) = EXACT.iter().find(|(c, _)| *c == code) {
        return s;
    }
    match code {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}
