//! Bringing in test peers the machine lacks (redis-server, PostgreSQL): with apt-get when
//! running as root, one test process at a time (a lock file, since `cargo test` runs may
//! overlap), otherwise an error naming the exact command to run.
//!
//! Declared from `redis.rs` (`support::redis::install`); `postgres.rs` uses it too.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Under CI a missing peer fails the test instead of skipping it (any value of `$CI`, as
/// in the tests themselves).
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// `name` as found on `$PATH`.
pub fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.trim_ascii() == b"0")
}

/// Whether this process may install packages itself (root with apt-get).
pub fn can_apt_install() -> bool {
    is_root() && on_path("apt-get").is_some()
}

/// `apt-get install` (after `apt-get update` when the first try fails). Waits for another
/// apt/dpkg holding its lock rather than failing.
pub fn apt_install(packages: &[&str], no_recommends: bool) -> Result<(), String> {
    eprintln!(
        "throttle tests: installing {} with apt-get",
        packages.join(" ")
    );
    let install = || {
        let mut cmd = Command::new("apt-get");
        cmd.env("DEBIAN_FRONTEND", "noninteractive").args([
            "-o",
            "DPkg::Lock::Timeout=600",
            "install",
            "-y",
            "-qq",
        ]);
        if no_recommends {
            cmd.arg("--no-install-recommends");
        }
        cmd.args(packages).output()
    };
    let mut out = install().map_err(|e| format!("apt-get: {e}"))?;
    if !out.status.success() {
        let _ = Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["-o", "DPkg::Lock::Timeout=600", "update", "-qq"])
            .output();
        out = install().map_err(|e| format!("apt-get: {e}"))?;
    }
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "apt-get install {} failed:\n{}{}",
            packages.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Held while installing or starting peers; removed on drop. A lock file created with
/// O_EXCL that holds the owner's pid, so one left behind by a killed process is taken
/// over. (Not `File::lock`: that needs Rust 1.89 and the crate's MSRV is older.)
pub struct InstallLock {
    path: PathBuf,
}

impl InstallLock {
    pub fn acquire() -> Self {
        let path = std::env::temp_dir().join("throttle-test-install.lock");
        // 20 minutes in polls of 100 ms (tests may pause tokio's clock).
        for _ in 0..12_000 {
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    let _ = write!(f, "{}", std::process::id());
                    return Self { path };
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if stale(&path) {
                        let _ = std::fs::remove_file(&path);
                        continue;
                    }
                }
                Err(e) => panic!("cannot create {}: {e}", path.display()),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "{} still held after 20 minutes; remove it if no test is installing",
            path.display()
        );
    }
}

impl Drop for InstallLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The lock's owner is gone (or it never wrote its pid, a minute ago).
fn stale(path: &Path) -> bool {
    match std::fs::read_to_string(path) {
        Ok(s) => match s.trim().parse::<u32>() {
            Ok(pid) => {
                Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{pid}")).exists()
            }
            Err(_) => std::fs::metadata(path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|d| d > Duration::from_secs(60))),
        },
        Err(_) => false,
    }
}
