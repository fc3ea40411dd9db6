//! The violation log: every rejection becomes a `rate_limit_events` row.
//!
//! The request path only pushes into a bounded in-memory queue (a mutex held for a
//! `VecDeque` push, never across an await). A background writer drains it in batches
//! (one multi-row INSERT), first creating the monthly partition of every month a batch
//! holds (old months too; the months known to exist are cached).
//!
//! Failures are sorted by [`classify`]:
//! - transient (the connection, the pool, a serialization failure or deadlock, a server
//!   short of resources or shutting down): the writer keeps the batch and retries with
//!   backoff;
//! - permanent (everything else: bad data, a constraint, a missing partition that could
//!   not be created, ...): the writer isolates the rows at fault by bisecting the batch,
//!   writes the others, and drops each row that can never be written, counted in
//!   `throttle_events_dropped_total{reason="rejected"}`. Newer events never wait behind
//!   such a row.
//!
//! When the queue is full the oldest event is dropped and counted as `reason="queue_full"`.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec};
use sqlx::postgres::PgPool;
use sqlx::QueryBuilder;
use tokio::sync::Notify;

use crate::limiter::Window;
pub use crate::violations::Event;
use crate::violations::EventSink;

/// Most rows per INSERT.
const BATCH: usize = 500;

/// Most months remembered as having a partition (then the cache starts over).
const KNOWN_MONTHS: usize = 1024;

/// What a failed write means for the rows it carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The database or the way to it is unwell: keep the rows and retry later.
    Transient,
    /// The statement or the rows themselves are refused: retrying the same rows fails again.
    Permanent,
}

/// Sorts a sqlx error: connection, I/O, TLS, protocol and pool failures are transient; a
/// database error by its SQLSTATE ([`classify_sqlstate`]); anything else (encoding a
/// value, ...) is permanent.
pub fn classify(error: &sqlx::Error) -> Failure {
    match error {
        sqlx::Error::Database(e) => match e.code() {
            Some(code) => classify_sqlstate(&code),
            None => Failure::Permanent,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Configuration(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => Failure::Transient,
        _ => Failure::Permanent,
    }
}

/// Sorts a PostgreSQL SQLSTATE. Transient: class 08 (connection exception), 40
/// (transaction rollback: serialization failure, deadlock), 53 (insufficient resources),
/// 57014 (query canceled), 57P01..57P05 (shutdown, cannot connect now, idle session
/// timeout), 58000/58030 (system and I/O errors), 25006 (read-only transaction: a standby
/// after a failover) and 55P03 (lock not available). Everything else (22 data exception,
/// 23 integrity constraint violation, 23514 included, which is also "no partition of
/// relation found for row", 42 syntax or access rule, ...) is permanent.
pub fn classify_sqlstate(code: &str) -> Failure {
    let transient = matches!(code.get(..2), Some("08" | "40" | "53"))
        || matches!(
            code,
            "57014" | "57P01" | "57P02" | "57P03" | "57P05" | "58000" | "58030" | "25006" | "55P03"
        );
    if transient {
        Failure::Transient
    } else {
        Failure::Permanent
    }
}

/// A permanent error that no row of the statement can escape (class 42: syntax, an
/// undefined object, a missing privilege): bisecting the batch would only fail again.
fn statement_level(code: Option<&str>) -> bool {
    code.and_then(|c| c.get(..2)) == Some("42")
}

fn sqlstate(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(e) => e.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// The bounded queue between the request path and the writer.
pub struct EventQueue {
    events: Mutex<VecDeque<Event>>,
    capacity: usize,
    wake: Notify,
    /// `reason="queue_full"`.
    overflowed: IntCounter,
    /// `reason="rejected"`.
    rejected: IntCounter,
}

impl EventSink for EventQueue {
    fn push(&self, event: Event) {
        EventQueue::push(self, event);
    }
}

// === impl EventQueue ===

impl EventQueue {
    /// A queue holding at most `capacity` events; drops are counted in `dropped`
    /// (`throttle_events_dropped_total`, label `reason`: `queue_full`, `rejected`).
    pub fn new(capacity: usize, dropped: IntCounterVec) -> Self {
        Self {
            events: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            capacity: capacity.max(1),
            wake: Notify::new(),
            overflowed: dropped.with_label_values(&["queue_full"]),
            rejected: dropped.with_label_values(&["rejected"]),
        }
    }

    /// Enqueues `event`, dropping (and counting) the oldest when full. Never blocks.
    pub fn push(&self, event: Event) {
        let mut q = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if q.len() >= self.capacity {
            q.pop_front();
            self.overflowed.inc();
        }
        q.push_back(event);
        drop(q);
        self.wake.notify_one();
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn take(&self, n: usize) -> Vec<Event> {
        let mut q = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let n = n.min(q.len());
        q.drain(..n).collect()
    }

    /// Puts a failed batch back in front, keeping order; what no longer fits is dropped
    /// (oldest first) and counted.
    fn put_back(&self, batch: Vec<Event>) {
        let mut q = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        for e in batch.into_iter().rev() {
            if q.len() >= self.capacity {
                self.overflowed.inc();
                continue;
            }
            q.push_front(e);
        }
    }

    /// Writes batches until the queue is empty, then waits for more. A transient failure
    /// puts the unwritten rows back and retries with backoff; rows refused for good are
    /// dropped and counted (see the module doc). Once `stop` resolves it writes what is
    /// queued and returns (at once while the database fails).
    pub async fn run_writer(
        self: Arc<Self>,
        pool: PgPool,
        stop: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(stop);
        let mut writer = Writer {
            pool,
            known: HashSet::new(),
            rejected: self.rejected.clone(),
        };
        let mut backoff = Duration::from_millis(100);
        // Once `stop` has resolved it is not polled again; what is queued still gets written.
        let mut stopping = false;
        loop {
            let batch = self.take(BATCH);
            if batch.is_empty() {
                if stopping {
                    return;
                }
                tokio::select! {
                    () = &mut stop => stopping = true,
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            match writer.write(batch).await {
                Ok(()) => backoff = Duration::from_millis(100),
                Err(Retry { rest, error }) => {
                    tracing::warn!(error = %error, events = rest.len(), "violation log write failed; retrying");
                    self.put_back(rest);
                    if stopping {
                        return;
                    }
                    tokio::select! {
                        () = &mut stop => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// A transient failure: `rest` (the rows not written, in order) goes back to the queue.
struct Retry {
    rest: Vec<Event>,
    error: sqlx::Error,
}

/// What `run_writer` keeps between batches.
struct Writer {
    pool: PgPool,
    /// UTC months (`year * 12 + month - 1`) whose partitions are known to exist.
    known: HashSet<i64>,
    rejected: IntCounter,
}

impl Writer {
    /// Writes `batch`: every row is written or dropped (and counted), unless a transient
    /// failure hands the unwritten ones back.
    async fn write(&mut self, batch: Vec<Event>) -> Result<(), Retry> {
        if let Err(error) = self.ensure_months(&batch).await {
            return Err(Retry { rest: batch, error });
        }
        let error = match insert(&self.pool, &batch).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if classify(&error) == Failure::Transient {
            return Err(Retry { rest: batch, error });
        }
        // A partition may have gone since it was cached (retention): look again.
        for e in &batch {
            self.known.remove(&utc_month(e.at_ms));
        }
        if let Err(error) = self.ensure_months(&batch).await {
            return Err(Retry { rest: batch, error });
        }
        self.isolate(batch, error).await
    }

    /// Creates the partitions of the months of `batch` not known to exist. A permanent
    /// failure is logged and left to the INSERT (whose rows for that month are then
    /// dropped); a transient one is returned.
    async fn ensure_months(&mut self, batch: &[Event]) -> Result<(), sqlx::Error> {
        let mut months: Vec<i64> = batch.iter().map(|e| utc_month(e.at_ms)).collect();
        months.sort_unstable();
        months.dedup();
        for month in months {
            if self.known.contains(&month) {
                continue;
            }
            match ensure_month(&self.pool, month).await {
                Ok(()) => {
                    if self.known.len() >= KNOWN_MONTHS {
                        self.known.clear();
                    }
                    self.known.insert(month);
                }
                Err(e) if classify(&e) == Failure::Transient => return Err(e),
                Err(e) => tracing::warn!(
                    error = %e,
                    sqlstate = sqlstate(&e).as_deref().unwrap_or(""),
                    month = %format_month(month),
                    "violation log: cannot create the partition of a month"
                ),
            }
        }
        Ok(())
    }

    /// `batch` failed permanently with `first`: writes it by halves, down to single rows,
    /// dropping (and counting) each row refused for good; logs once what was dropped.
    async fn isolate(&mut self, batch: Vec<Event>, first: sqlx::Error) -> Result<(), Retry> {
        let mut dropped = 0_u64;
        let mut codes: Vec<String> = Vec::new();
        let mut last_error: Option<sqlx::Error> = None;
        let mut note = |e: &sqlx::Error, rows: usize, dropped: &mut u64| {
            if let Some(code) = sqlstate(e) {
                if !codes.contains(&code) {
                    codes.push(code);
                }
            }
            *dropped += rows as u64;
        };
        let mut outcome = Ok(());
        if statement_level(sqlstate(&first).as_deref()) {
            // No row can pass this statement: no use trying them one by one.
            note(&first, batch.len(), &mut dropped);
            last_error = Some(first);
        } else {
            // Ranges still to write, the next on top; the whole batch failed already.
            let mid = batch.len() / 2;
            let mut todo = vec![(mid, batch.len()), (0, mid)];
            if batch.len() == 1 {
                note(&first, 1, &mut dropped);
                last_error = Some(first);
                todo.clear();
            }
            while let Some((from, to)) = todo.pop() {
                if from == to {
                    continue;
                }
                let error = match insert(&self.pool, &batch[from..to]).await {
                    Ok(()) => continue,
                    Err(e) => e,
                };
                if classify(&error) == Failure::Transient {
                    // Everything before `from` is written or dropped; the rest waits.
                    outcome = Err(Retry {
                        rest: batch[from..].to_vec(),
                        error,
                    });
                    break;
                }
                if to - from == 1 {
                    note(&error, 1, &mut dropped);
                    last_error = Some(error);
                } else {
                    let mid = from + (to - from) / 2;
                    todo.push((mid, to));
                    todo.push((from, mid));
                }
            }
        }
        if dropped > 0 {
            self.rejected.inc_by(dropped);
            tracing::warn!(
                dropped,
                events = batch.len(),
                sqlstate = codes.join(","),
                error = %last_error.map(|e| e.to_string()).unwrap_or_default(),
                "violation log: dropped events the database refuses for good"
            );
        }
        outcome
    }
}

/// The UTC month of `at_ms`, as `year * 12 + month - 1`.
fn utc_month(at_ms: u64) -> i64 {
    // Days since 1970-01-01 to a civil date (H. Hinnant's `civil_from_days`).
    let z = i64::try_from(at_ms / 86_400_000).unwrap_or(i64::MAX / 2) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    year * 12 + month - 1
}

/// Days since 1970-01-01 of the first day of `month` (`year * 12 + month - 1`).
fn month_start_days(month: i64) -> i64 {
    // H. Hinnant's `days_from_civil` for day 1.
    let (year, m) = (month.div_euclid(12), month.rem_euclid(12) + 1);
    let y = if m <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn format_month(month: i64) -> String {
    format!("{}-{:02}", month.div_euclid(12), month.rem_euclid(12) + 1)
}

/// Creates the partitions holding the UTC month `month` (`year * 12 + month - 1`).
///
/// Partition bounds follow the session's time zone (as `throttle_ensure_event_partition`
/// does), so the local months of the UTC month's first and last instants are ensured:
/// one partition under UTC, at most two elsewhere. Existing ones are left alone.
async fn ensure_month(pool: &PgPool, month: i64) -> Result<(), sqlx::Error> {
    #[allow(clippy::cast_precision_loss)] // days stay far below 2^53
    let secs = |days: i64| days as f64 * 86_400.0;
    let first = secs(month_start_days(month));
    let last = secs(month_start_days(month + 1)) - 0.001;
    sqlx::query(
        "SELECT throttle_ensure_event_partition(m.d)
         FROM (SELECT DISTINCT date_trunc('month', to_timestamp(t))::date AS d
               FROM unnest(ARRAY[$1, $2]::float8[]) AS t) AS m
         WHERE NOT EXISTS (
             SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'rate_limit_events'::regclass
               AND c.relname = 'rate_limit_events_' || to_char(m.d, 'YYYY_MM'))",
    )
    .bind(first)
    .bind(last)
    .execute(pool)
    .await?;
    Ok(())
}

async fn insert(pool: &PgPool, batch: &[Event]) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::new(
        "INSERT INTO rate_limit_events (tenant_id, api_key_id, ip, scope, limit_key, limit_value, count, \"window\", created_at) ",
    );
    q.push_values(batch, |mut row, e| {
        row.push_bind(e.tenant_id.as_deref().map(str::to_string))
            .push_bind(e.api_key_id.as_deref().map(str::to_string))
            .push_bind(e.ip.to_string())
            .push_unseparated("::inet")
            .push_bind(e.scope)
            .push_bind(e.limit_key.clone())
            .push_bind(i64::try_from(e.limit_value).unwrap_or(i64::MAX))
            .push_bind(i64::try_from(e.count).unwrap_or(i64::MAX))
            .push_bind(match e.span_secs {
                Some(s) => format!("{s} seconds"),
                None => interval(e.window).to_string(),
            })
            .push_unseparated("::interval")
            .push("to_timestamp(")
            .push_bind_unseparated(e.at_ms as f64 / 1000.0)
            .push_unseparated(")");
    });
    q.build().execute(pool).await?;
    Ok(())
}

fn interval(w: Window) -> &'static str {
    match w {
        Window::Second => "1 second",
        Window::Minute => "1 minute",
        Window::Hour => "1 hour",
        Window::Day => "1 day",
        Window::Month => "1 month",
        Window::Week => "7 days",
        Window::Days30 => "30 days",
        Window::Year => "365 days",
    }
}

#[cfg(test)]
mod tests;
