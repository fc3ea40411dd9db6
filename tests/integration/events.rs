//! The violation log writer (`EventQueue::run_writer`) against a real PostgreSQL: the
//! partition of an old month is created, a row the database refuses for good is dropped
//! and counted without holding up the others, and a transient failure keeps the events
//! until the database is reachable. Each test has a database of its own.

use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounterVec, Opts};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use throttle::db::events::{Event, EventQueue};
use throttle::limiter::Window;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::postgres::TestDb;
use crate::support::{eventually, free_port};

/// 2024-02-10T00:00:00Z.
const FEB_2024: u64 = 1_707_523_200_000;
/// 2023-11-05T00:00:00Z.
const NOV_2023: u64 = 1_699_142_400_000;

fn event(scope: &'static str, n: u64, at_ms: u64) -> Event {
    Event {
        tenant_id: Some(Arc::from("acme")),
        api_key_id: Some(Arc::from("key_demo")),
        ip: IpAddr::from([192, 0, 2, 7]),
        scope,
        limit_key: format!("{scope}:{n}"),
        limit_value: 10,
        count: 11,
        window: Window::Minute,
        span_secs: None,
        at_ms,
    }
}

fn queue() -> (Arc<EventQueue>, IntCounterVec) {
    let dropped = IntCounterVec::new(
        Opts::new("throttle_events_dropped_total", "test"),
        &["reason"],
    )
    .unwrap();
    (Arc::new(EventQueue::new(1000, dropped.clone())), dropped)
}

fn dropped(counter: &IntCounterVec, reason: &str) -> u64 {
    counter.with_label_values(&[reason]).get()
}

/// `run_writer` in a task, stopped by `finish`.
struct Writer {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Writer {
    fn start(queue: &Arc<EventQueue>, pool: PgPool) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(queue.clone().run_writer(pool, async move {
            let _ = stopped.await;
        }));
        Self { stop, task }
    }

    async fn finish(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the writer stops")
            .unwrap();
    }
}

/// A migrated database (through `throttle::db::migrate`) and a pool on it.
async fn migrated() -> Option<(TestDb, PgPool)> {
    let db = TestDb::create()?;
    let pool = db.pool().await;
    throttle::db::migrate(&pool).await.unwrap();
    Some((db, pool))
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn exists(pool: &PgPool, table: &str) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn events_of_an_old_month_get_their_partition_created() {
    let Some((_db, pool)) = migrated().await else {
        return;
    };
    assert!(!exists(&pool, "rate_limit_events_2024_02").await);
    assert!(!exists(&pool, "rate_limit_events_2023_11").await);
    let (q, counter) = queue();
    // One batch holding two old months.
    q.push(event("key", 1, FEB_2024));
    q.push(event("key", 2, NOV_2023));
    q.push(event("key", 3, FEB_2024 + 3_600_000));
    let writer = Writer::start(&q, pool.clone());
    eventually(Duration::from_secs(5), "3 old events written", || async {
        (count(&pool, "SELECT count(*) FROM rate_limit_events").await == 3).then_some(())
    })
    .await;
    assert!(exists(&pool, "rate_limit_events_2024_02").await);
    assert!(exists(&pool, "rate_limit_events_2023_11").await);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM rate_limit_events_2024_02").await,
        2
    );
    // A later batch of a month now cached.
    q.push(event("key", 4, FEB_2024 + 7_200_000));
    eventually(Duration::from_secs(5), "the 4th event written", || async {
        (count(&pool, "SELECT count(*) FROM rate_limit_events_2024_02").await == 3).then_some(())
    })
    .await;
    writer.finish().await;
    assert_eq!(dropped(&counter, "rejected"), 0);
    assert_eq!(dropped(&counter, "queue_full"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_refused_for_good_are_dropped_and_counted_and_the_others_written() {
    let Some((_db, pool)) = migrated().await else {
        return;
    };
    sqlx::query("ALTER TABLE rate_limit_events ADD CONSTRAINT no_poison CHECK (scope <> 'poison')")
        .execute(&pool)
        .await
        .unwrap();
    let (q, counter) = queue();
    // One batch: good rows around a CHECK violation (23514) and a time PostgreSQL cannot
    // represent (22008; its partition cannot be created either).
    for n in 0..10 {
        q.push(event("key", n, FEB_2024 + n));
    }
    q.push(event("poison", 100, FEB_2024));
    for n in 10..20 {
        q.push(event("key", n, FEB_2024 + n));
    }
    q.push(event("key", 101, u64::MAX));
    q.push(event("key", 20, FEB_2024 + 20));
    let writer = Writer::start(&q, pool.clone());
    eventually(
        Duration::from_secs(5),
        "21 good events written, 2 dropped",
        || async {
            let written = count(&pool, "SELECT count(*) FROM rate_limit_events").await;
            (written == 21 && dropped(&counter, "rejected") == 2).then_some(())
        },
    )
    .await;
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT limit_key FROM rate_limit_events ORDER BY created_at, limit_key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let want: Vec<String> = (0..=20).map(|n| format!("key:{n}")).collect();
    assert_eq!(keys, want);
    // Newer events (with another poison row) are not held up.
    q.push(event("poison", 102, FEB_2024));
    for n in 21..25 {
        q.push(event("key", n, FEB_2024 + n));
    }
    eventually(Duration::from_secs(5), "newer events written", || async {
        let written = count(&pool, "SELECT count(*) FROM rate_limit_events").await;
        (written == 25 && dropped(&counter, "rejected") == 3).then_some(())
    })
    .await;
    writer.finish().await;
    assert!(q.is_empty());
    assert_eq!(dropped(&counter, "queue_full"), 0);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM rate_limit_events WHERE scope = 'poison'"
        )
        .await,
        0
    );
}

/// The writer's `application_name` in the transient test.
const WRITER: &str = "throttle_event_writer_test";

/// Forwards every connection accepted on `listener` to `target`.
async fn forward(listener: TcpListener, target: (String, u16)) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            return;
        };
        let target = target.clone();
        tokio::spawn(async move {
            if let Ok(mut outbound) = TcpStream::connect((target.0.as_str(), target.1)).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn transient_failures_keep_the_events_until_the_database_is_reachable() {
    let Some((db, pool)) = migrated().await else {
        return;
    };
    // The writer's pool goes through a port where nothing listens yet.
    let real = PgConnectOptions::from_str(&db.url).unwrap();
    let target = (real.get_host().to_string(), real.get_port());
    let port = free_port();
    let writer_pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy_with(real.clone().port(port).application_name(WRITER));
    let (q, counter) = queue();
    for n in 0..5 {
        q.push(event("key", n, FEB_2024 + n));
    }
    let writer = Writer::start(&q, writer_pool);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM rate_limit_events").await,
        0
    );
    assert_eq!(dropped(&counter, "rejected"), 0);
    assert_eq!(dropped(&counter, "queue_full"), 0);
    q.push(event("key", 5, FEB_2024 + 5));

    // The database becomes reachable: every event is written.
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let proxy = tokio::spawn(forward(listener, target));
    eventually(Duration::from_secs(15), "6 kept events written", || async {
        (count(&pool, "SELECT count(*) FROM rate_limit_events").await == 6).then_some(())
    })
    .await;

    // The writer's connections are terminated (57P01): newer events still arrive.
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = $1",
    )
    .bind(WRITER)
    .execute(&pool)
    .await
    .unwrap();
    for n in 6..10 {
        q.push(event("key", n, FEB_2024 + n));
    }
    eventually(Duration::from_secs(15), "10 events written", || async {
        (count(&pool, "SELECT count(*) FROM rate_limit_events").await == 10).then_some(())
    })
    .await;
    writer.finish().await;
    proxy.abort();
    assert_eq!(dropped(&counter, "rejected"), 0);
    assert_eq!(dropped(&counter, "queue_full"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_events_are_written_when_the_writer_stops() {
    let Some((_db, pool)) = migrated().await else {
        return;
    };
    let (q, _counter) = queue();
    for n in 0..3 {
        q.push(event("key", n, NOV_2023 + n));
    }
    // Already told to stop: it still writes what is queued, then returns.
    tokio::time::timeout(
        Duration::from_secs(10),
        q.clone().run_writer(pool.clone(), std::future::ready(())),
    )
    .await
    .unwrap();
    assert!(q.is_empty());
    assert_eq!(
        count(&pool, "SELECT count(*) FROM rate_limit_events").await,
        3
    );
}
