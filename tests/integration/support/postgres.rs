//! PostgreSQL for tests: a fresh database per test on the machine's server, and a private
//! server (initdb in a temp dir) for the test that restarts it. Cleaned up on drop.
//!
//! The machine's server is made ready once per test process: started when it is installed
//! but stopped, installed first (apt-get, as root) when it is missing, and given trust auth
//! on 127.0.0.1 when it asks user `postgres` for a password. When the tests cannot do that
//! themselves they say which command to run; the database tests then skip locally and
//! fail under `CI`.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;

use super::free_port;
use super::redis::install;

static SEQ: AtomicU32 = AtomicU32::new(0);

const DEFAULT_SERVER: &str = "postgres://postgres@127.0.0.1:5432";

/// What to run when PostgreSQL is missing and the tests cannot install it.
const PG_INSTALL: &str = "sudo apt-get install postgresql postgresql-client && sudo sed -i \
                          '1i host all all 127.0.0.1/32 trust' /etc/postgresql/*/main/pg_hba.conf \
                          && sudo service postgresql restart";

/// The line the tests need first in pg_hba.conf.
const TRUST_LINE: &str = "host all all 127.0.0.1/32 trust";

/// The machine's server (`$TEST_PG_URL`, default postgres://postgres@127.0.0.1:5432).
fn base() -> String {
    std::env::var("TEST_PG_URL").unwrap_or_else(|_| DEFAULT_SERVER.to_string())
}

fn psql(url: &str, sql: &str) -> bool {
    Command::new("psql")
        .arg(url)
        .args(["-w", "-qtAc", sql])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The machine's PostgreSQL answering on 127.0.0.1:5432 with trust auth for user
/// `postgres`, brought there once per test process when it can be (see the module doc).
/// With `$TEST_PG_URL` set that server is used as it is.
pub fn require_postgres() -> Result<(), String> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY.get_or_init(ensure_postgres).clone()
}

fn ensure_postgres() -> Result<(), String> {
    if std::env::var_os("TEST_PG_URL").is_some() || connect().is_ok() {
        return Ok(());
    }
    let root = install::is_root();
    // One process at a time installs, starts or reconfigures; the others then find it up.
    let _lock = root.then(install::InstallLock::acquire);
    if connect().is_ok() {
        return Ok(());
    }
    // Only the client when something already listens on 5432 (a server of another kind).
    install_packages(!accepting())?;
    if connect().is_ok() {
        return Ok(());
    }
    let Some(v) = cluster() else {
        return Err(if accepting() {
            unusable(&connect().err().unwrap_or_default())
        } else {
            "PostgreSQL is installed but no cluster under /etc/postgresql/*/main is set to \
             port 5432; create one: sudo pg_createcluster --start <version> main"
                .to_string()
        });
    };
    if !accepting() {
        let start = format!("sudo pg_ctlcluster --skip-systemctl-redirect {v} main start");
        if !root {
            return Err(format!(
                "PostgreSQL {v} is installed but not running on 127.0.0.1:5432; start it: {start}"
            ));
        }
        eprintln!("throttle tests: starting PostgreSQL {v} (pg_ctlcluster)");
        let out = Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect", &v, "main", "start"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("pg_ctlcluster: {e}"))?;
        if !wait_for(Duration::from_secs(30), accepting) {
            return Err(format!(
                "PostgreSQL {v} did not accept connections on 127.0.0.1:5432 within 30 s \
                 (pg_ctlcluster: {}); see /var/log/postgresql/postgresql-{v}-main.log",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    match connect() {
        Ok(()) => Ok(()),
        Err(e) if auth_refused(&e) => {
            let hba = format!("/etc/postgresql/{v}/main/pg_hba.conf");
            let fix = format!(
                "sudo sed -i '1i {TRUST_LINE}' {hba} && sudo pg_ctlcluster {v} main reload"
            );
            if !root {
                return Err(format!(
                    "PostgreSQL on 127.0.0.1:5432 asks user postgres for a password ({e}); the \
                     tests need trust auth there: {fix}"
                ));
            }
            eprintln!("throttle tests: adding `{TRUST_LINE}` to {hba} and reloading PostgreSQL");
            trust_loopback(Path::new(&hba))?;
            let _ = Command::new("pg_ctlcluster")
                .args(["--skip-systemctl-redirect", &v, "main", "reload"])
                .stdin(Stdio::null())
                .output();
            // A reload is a signal: wait until the server has read the new rules.
            if wait_for(Duration::from_secs(30), || connect().is_ok()) {
                Ok(())
            } else {
                Err(format!(
                    "PostgreSQL still refuses user postgres on 127.0.0.1:5432 after adding \
                     `{TRUST_LINE}` to {hba}: {}",
                    connect().err().unwrap_or_default()
                ))
            }
        }
        Err(e) => Err(unusable(&e)),
    }
}

fn unusable(psql_error: &str) -> String {
    format!(
        "cannot use PostgreSQL at {DEFAULT_SERVER} ({psql_error}); the database tests need user \
         postgres with trust auth there, or another server in $TEST_PG_URL"
    )
}

/// psql installed, and the server too (initdb, pg_ctl, a cluster) when `server`.
fn install_packages(server: bool) -> Result<(), String> {
    let server = server && (cluster().is_none() || pg_bin().is_none());
    let client = install::on_path("psql").is_none();
    if !server && !client {
        return Ok(());
    }
    let (missing, packages): (&str, &[&str]) = if server {
        (
            "PostgreSQL (server and psql) is needed by the database tests and is not installed",
            &["postgresql", "postgresql-client"],
        )
    } else {
        (
            "psql is needed by the database tests and is not installed",
            &["postgresql-client"],
        )
    };
    if !install::can_apt_install() {
        return Err(format!("{missing}; run: {PG_INSTALL}"));
    }
    install::apt_install(packages, false)
        .map_err(|e| format!("{missing}; installing it failed ({e}); run: {PG_INSTALL}"))
}

/// `psql` can log in as user `postgres` on the default server; else psql's complaint.
fn connect() -> Result<(), String> {
    let out = Command::new("psql")
        .arg(format!("{DEFAULT_SERVER}/postgres"))
        .args(["-w", "-qtAc", "SELECT 1"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("psql: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn auth_refused(psql_error: &str) -> bool {
    [
        "password authentication failed",
        "no password supplied",
        "no pg_hba.conf entry",
        "Peer authentication failed",
        "Ident authentication failed",
    ]
    .iter()
    .any(|m| psql_error.contains(m))
}

/// Something accepts connections on 127.0.0.1:5432 (and `pg_isready` agrees, if present).
fn accepting() -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], 5432));
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
        && (install::on_path("pg_isready").is_none()
            || Command::new("pg_isready")
                .args(["-q", "-h", "127.0.0.1", "-p", "5432"])
                .status()
                .is_ok_and(|s| s.success()))
}

/// Polls `ready` every 100 ms for up to `patience` (counted in polls: tests may pause
/// tokio's clock, and std's `Instant` is off limits here).
fn wait_for(patience: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let step = Duration::from_millis(100);
    for _ in 0..patience.as_millis() / step.as_millis() {
        if ready() {
            return true;
        }
        std::thread::sleep(step);
    }
    ready()
}

/// The newest Debian-style cluster (/etc/postgresql/<version>/main) on port 5432.
fn cluster() -> Option<String> {
    let mut versions: Vec<(f64, String)> = std::fs::read_dir("/etc/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.path().join("main/postgresql.conf").exists())
        .filter(|e| port_of(&e.path().join("main/postgresql.conf")) == 5432)
        .filter_map(|e| {
            let v = e.file_name().into_string().ok()?;
            Some((v.parse().ok()?, v))
        })
        .collect();
    versions.sort_by(|a, b| a.0.total_cmp(&b.0));
    versions.pop().map(|(_, v)| v)
}

/// `port = N` in a postgresql.conf (5432 when not set).
fn port_of(conf: &Path) -> u16 {
    std::fs::read_to_string(conf)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split('#').next()?.trim().strip_prefix("port"))
        .filter_map(|rest| rest.trim_start().strip_prefix('=')?.trim().parse().ok())
        .next_back()
        .unwrap_or(5432)
}

/// Puts `host all all 127.0.0.1/32 trust` first in pg_hba.conf (first match wins).
fn trust_loopback(hba: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(hba).map_err(|e| format!("{}: {e}", hba.display()))?;
    let first_rule = text
        .lines()
        .map(|l| {
            l.split('#')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .find(|l| !l.is_empty());
    if first_rule.as_deref() == Some(TRUST_LINE) {
        return Ok(());
    }
    // Written in place, so the file keeps its owner and mode.
    std::fs::write(
        hba,
        format!("{TRUST_LINE} # added by throttle's tests\n{text}"),
    )
    .map_err(|e| format!("{}: {e}", hba.display()))
}

/// The directory holding initdb and pg_ctl (/usr/lib/postgresql/<version>/bin).
fn pg_bin() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .find(|p| p.join("initdb").exists())
}

/// A database of its own for one test.
pub struct TestDb {
    pub url: String,
    admin: String,
    name: String,
}

impl TestDb {
    /// A fresh empty database on `server` (a base URL without a database name). None when
    /// PostgreSQL is not there: tests then skip locally, but fail under `CI` (set at all).
    pub fn create_on(server: &str) -> Option<Self> {
        let name = format!(
            "thr_test_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let admin = format!("{server}/postgres");
        if !psql(&admin, &format!("CREATE DATABASE {name}")) {
            let why = format!(
                "cannot create a database on {server} as user postgres (is it running, with \
                 trust auth on 127.0.0.1?); without $TEST_PG_URL the tests set it up when \
                 they can, else run: {PG_INSTALL}"
            );
            assert!(!install::in_ci(), "PostgreSQL is required in CI: {why}");
            eprintln!("skipped: {why}");
            return None;
        }
        Some(Self {
            url: format!("{server}/{name}"),
            admin,
            name,
        })
    }

    /// A fresh empty database on the machine's server (made ready first, once).
    pub fn create() -> Option<Self> {
        if let Err(why) = require_postgres() {
            assert!(!install::in_ci(), "PostgreSQL is required in CI: {why}");
            eprintln!("skipped: {why}");
            return None;
        }
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
    /// None (with the reason on stderr) when PostgreSQL is not installed and cannot be,
    /// or when not running as root (the server runs as user `postgres`).
    pub fn start() -> Option<Self> {
        static PACKAGES: OnceLock<Result<(), String>> = OnceLock::new();
        let installed = PACKAGES.get_or_init(|| {
            if pg_bin().is_some() {
                return Ok(());
            }
            let _lock = install::is_root().then(install::InstallLock::acquire);
            install_packages(true)
        });
        if let Err(why) = installed {
            eprintln!("no private PostgreSQL: {why}");
            return None;
        }
        let bin = pg_bin()?;
        if !install::is_root() {
            eprintln!("no private PostgreSQL: it runs as user postgres, which needs root");
            return None;
        }
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
