//! PostgreSQL for tests: a fresh database per test on the machine's server, and a private
//! server (initdb in a temp dir) for the test that restarts it. Cleaned up on drop.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use tempfile::TempDir;

use super::free_port;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The machine's server (`$TEST_PG_URL`, default postgres://postgres@127.0.0.1:5432).
fn base() -> String {
    std::env::var("TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_string())
}

fn psql(url: &str, sql: &str) -> bool {
    Command::new("psql")
        .arg(url)
        .args(["-qtAc", sql])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A database of its own for one test.
pub struct TestDb {
    pub url: String,
    admin: String,
    name: String,
}

impl TestDb {
    /// A fresh empty database on `server` (a base URL without a database name). None when
    /// PostgreSQL is not there: tests then skip locally, but fail under `CI=true`.
    pub fn create_on(server: &str) -> Option<Self> {
        let name = format!(
            "thr_test_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let admin = format!("{server}/postgres");
        if !psql(&admin, &format!("CREATE DATABASE {name}")) {
            assert!(
                std::env::var("CI").is_err(),
                "PostgreSQL is required in CI (no server at {server})"
            );
            eprintln!("skipped: no PostgreSQL at {server}");
            return None;
        }
        Some(Self {
            url: format!("{server}/{name}"),
            admin,
            name,
        })
    }

    pub fn create() -> Option<Self> {
        Self::create_on(&base())
    }

    /// A fresh database with the migrations applied (through the real CLI).
    pub fn migrated() -> Option<Self> {
        let db = Self::create()?;
        db.migrate();
        Some(db)
    }

    pub fn migrate(&self) {
        let out = Command::new(env!("CARGO_BIN_EXE_throttle"))
            .args(["migrate", "--database-url", &self.url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "migrate: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub async fn pool(&self) -> sqlx::PgPool {
        sqlx::PgPool::connect(&self.url).await.unwrap()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        psql(
            &self.admin,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// A private PostgreSQL server (for stopping and restarting it), run as user `postgres`.
pub struct PgServer {
    pub port: u16,
    bin: PathBuf,
    data: PathBuf,
    _dir: TempDir,
}

impl PgServer {
    pub fn start() -> Option<Self> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path().join("bin"))
            .find(|p| p.join("initdb").exists())?;
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(dir.path(), Some(uid("postgres")?), None).ok()?;
        let data = dir.path().join("data");
        let ok = as_postgres(
            &bin.join("initdb"),
            &[
                "-D",
                data.to_str()?,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        if !ok {
            return None;
        }
        let s = PgServer {
            port: free_port(),
            bin,
            data,
            _dir: dir,
        };
        s.up().then_some(s)
    }

    pub fn up(&self) -> bool {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.data.display()
        );
        let log = self.data.join("server.log");
        as_postgres(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                self.data.to_str().unwrap(),
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start",
            ],
        )
    }

    pub fn down(&self) -> bool {
        as_postgres(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                self.data.to_str().unwrap(),
                "-m",
                "fast",
                "-w",
                "stop",
            ],
        )
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.down();
    }
}

fn uid(user: &str) -> Option<u32> {
    let out = Command::new("id").args(["-u", user]).output().ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

fn as_postgres(bin: &std::path::Path, args: &[&str]) -> bool {
    Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(bin)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
