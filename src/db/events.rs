//! The violation log: every rejection becomes a `rate_limit_events` row.
//!
//! The request path only pushes into a bounded in-memory queue (a mutex held for a
//! `VecDeque` push, never across an await). A background writer drains it in batches
//! (one multi-row INSERT) and creates this month's and next month's partitions. While
//! PostgreSQL is down the writer keeps the events and retries with backoff; when the queue
//! is full the oldest event is dropped and counted in `throttle_events_dropped_total`.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus::IntCounter;
use sqlx::postgres::PgPool;
use sqlx::QueryBuilder;
use tokio::sync::Notify;

use super::DbError;
use crate::limiter::Window;

/// Most rows per INSERT.
const BATCH: usize = 500;

/// One rejection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Tenant of the caller, if known.
    pub tenant_id: Option<Arc<str>>,
    /// Key id of the caller, if known.
    pub api_key_id: Option<Arc<str>>,
    /// Client address.
    pub ip: IpAddr,
    /// Scope that rejected (`ip`, `key`, `tenant`, `global`, `auth`).
    pub scope: &'static str,
    /// The limited identity, `<scope>:<id>` (e.g. `key:key_demo`).
    pub limit_key: String,
    /// The limit.
    pub limit_value: u64,
    /// The count the request would have reached.
    pub count: u64,
    /// The window.
    pub window: Window,
    /// When (Unix ms).
    pub at_ms: u64,
}

/// The bounded queue between the request path and the writer.
pub struct EventQueue {
    events: Mutex<VecDeque<Event>>,
    capacity: usize,
    wake: Notify,
    dropped: IntCounter,
}

// === impl EventQueue ===

impl EventQueue {
    /// A queue holding at most `capacity` events.
    pub fn new(capacity: usize, dropped: IntCounter) -> Self {
        Self {
            events: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            capacity: capacity.max(1),
            wake: Notify::new(),
            dropped,
        }
    }

    /// Enqueues `event`, dropping (and counting) the oldest when full. Never blocks.
    pub fn push(&self, event: Event) {
        let mut q = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if q.len() >= self.capacity {
            q.pop_front();
            self.dropped.inc();
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
                self.dropped.inc();
                continue;
            }
            q.push_front(e);
        }
    }

    /// Writes batches until the queue is empty, then waits for more; retries with backoff
    /// while the database fails. Returns when `stop` resolves.
    pub async fn run_writer(
        self: Arc<Self>,
        pool: PgPool,
        stop: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(stop);
        let mut backoff = Duration::from_millis(100);
        let mut partitions_ok_for: Option<u64> = None;
        loop {
            let batch = self.take(BATCH);
            if batch.is_empty() {
                tokio::select! {
                    () = &mut stop => return,
                    () = self.wake.notified() => continue,
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
            let month = batch.first().map(|e| e.at_ms / (86_400_000 * 28));
            let result = async {
                if partitions_ok_for != month {
                    ensure_partitions(&pool).await?;
                    partitions_ok_for = month;
                }
                insert(&pool, &batch).await
            }
            .await;
            match result {
                Ok(()) => backoff = Duration::from_millis(100),
                Err(e) => {
                    tracing::warn!(error = %e, events = batch.len(), "violation log write failed; retrying");
                    self.put_back(batch);
                    partitions_ok_for = None;
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

/// Creates this month's and next month's partitions (idempotent).
///
/// # Errors
/// When the database fails.
pub async fn ensure_partitions(pool: &PgPool) -> Result<(), DbError> {
    sqlx::query(
        "SELECT throttle_ensure_event_partition(date_trunc('month', now())::date),
                throttle_ensure_event_partition((date_trunc('month', now()) + interval '1 month')::date)",
    )
    .execute(pool)
    .await?;
    Ok(())
}

async fn insert(pool: &PgPool, batch: &[Event]) -> Result<(), DbError> {
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
            .push_bind(interval(e.window))
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
    }
}
