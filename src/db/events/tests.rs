//! Tests of the event writer.

use std::borrow::Cow;
use std::net::IpAddr;

use super::*;

#[test]
fn sqlstates_are_sorted_into_transient_and_permanent() {
    for code in [
        "08000", "08003", "08006", "08001", "08004", "08P01", "40001", "40P01", "40000", "53000",
        "53100", "53200", "53300", "57P01", "57P02", "57P03", "57P05", "57014", "58000", "58030",
        "25006", "55P03",
    ] {
        assert_eq!(classify_sqlstate(code), Failure::Transient, "{code}");
    }
    for code in [
        "22001", "22003", "22007", "22008", "22P02", "23502", "23503", "23505", "23514", "23P01",
        "42501", "42P01", "42703", "42P17", "0A000", "XX000", "P0001", "57P04", "", "4", "?",
    ] {
        assert_eq!(classify_sqlstate(code), Failure::Permanent, "{code}");
    }
}

#[derive(Debug)]
struct PgError(Option<&'static str>);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pg error {:?}", self.0)
    }
}

impl std::error::Error for PgError {}

impl sqlx::error::DatabaseError for PgError {
    fn message(&self) -> &str {
        "pg error"
    }
    fn code(&self) -> Option<Cow<'_, str>> {
        self.0.map(Cow::Borrowed)
    }
    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }
    fn kind(&self) -> sqlx::error::ErrorKind {
        sqlx::error::ErrorKind::Other
    }
}

#[test]
fn sqlx_errors_are_sorted_by_kind_then_sqlstate() {
    let transient = [
        sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
        sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
        sqlx::Error::PoolTimedOut,
        sqlx::Error::PoolClosed,
        sqlx::Error::WorkerCrashed,
        sqlx::Error::Protocol("unexpected message".into()),
        sqlx::Error::Tls("handshake".into()),
        sqlx::Error::from(PgError(Some("57P01"))),
        sqlx::Error::from(PgError(Some("40P01"))),
        sqlx::Error::from(PgError(Some("08006"))),
    ];
    for e in &transient {
        assert_eq!(classify(e), Failure::Transient, "{e}");
    }
    let permanent = [
        sqlx::Error::from(PgError(Some("23514"))),
        sqlx::Error::from(PgError(Some("22008"))),
        sqlx::Error::from(PgError(Some("42501"))),
        sqlx::Error::from(PgError(None)),
        sqlx::Error::Encode("bad value".into()),
        sqlx::Error::InvalidArgument("bad".into()),
        sqlx::Error::RowNotFound,
    ];
    for e in &permanent {
        assert_eq!(classify(e), Failure::Permanent, "{e}");
    }
}

#[test]
fn only_class_42_fails_every_row_alike() {
    assert!(statement_level(Some("42501")));
    assert!(statement_level(Some("42P01")));
    assert!(!statement_level(Some("23514")));
    assert!(!statement_level(Some("22008")));
    assert!(!statement_level(None));
}

#[test]
fn utc_months_and_their_first_days() {
    let day = 86_400_000_u64;
    assert_eq!(format_month(utc_month(0)), "1970-01");
    assert_eq!(format_month(utc_month(31 * day - 1)), "1970-01");
    assert_eq!(format_month(utc_month(31 * day)), "1970-02");
    // 2024-02-10T12:00:00Z, 2024-02-29 (leap day), 2024-03-01T00:00:00Z.
    assert_eq!(format_month(utc_month(1_707_566_400_000)), "2024-02");
    assert_eq!(format_month(utc_month(1_709_251_199_999)), "2024-02");
    assert_eq!(format_month(utc_month(1_709_251_200_000)), "2024-03");
    assert_eq!(format_month(utc_month(1_767_225_599_999)), "2025-12");
    assert_eq!(format_month(utc_month(1_767_225_600_000)), "2026-01");
    assert_eq!(month_start_days(utc_month(1_709_251_200_000)), 19_783);
    assert_eq!(month_start_days(utc_month(1_707_566_400_000)), 19_754);
    // Every month start maps back to its own month, over four centuries.
    for month in (1970 * 12 + 1)..(2370 * 12) {
        let start = u64::try_from(month_start_days(month)).unwrap() * day;
        assert_eq!(utc_month(start), month);
        assert_eq!(utc_month(start - 1), month - 1);
    }
    // Nonsense times do not panic (their partition then fails to be created).
    let _ = utc_month(u64::MAX);
}

fn event(at_ms: u64) -> Event {
    Event {
        tenant_id: None,
        api_key_id: None,
        ip: IpAddr::from([127, 0, 0, 1]),
        scope: "ip",
        limit_key: "ip:127.0.0.1".into(),
        limit_value: 1,
        count: 2,
        window: Window::Minute,
        span_secs: None,
        at_ms,
    }
}

#[test]
fn queue_counts_overflow_as_queue_full() {
    let dropped = IntCounterVec::new(prometheus::Opts::new("d", "d"), &["reason"]).unwrap();
    let q = EventQueue::new(2, dropped.clone());
    for t in 0..3 {
        q.push(event(t));
    }
    assert_eq!(q.len(), 2);
    assert_eq!(dropped.with_label_values(&["queue_full"]).get(), 1);
    assert_eq!(dropped.with_label_values(&["rejected"]).get(), 0);
    q.put_back(vec![event(9)]);
    assert_eq!(dropped.with_label_values(&["queue_full"]).get(), 2);
    assert_eq!(
        q.take(10).iter().map(|e| e.at_ms).collect::<Vec<_>>(),
        [1, 2]
    );
}
