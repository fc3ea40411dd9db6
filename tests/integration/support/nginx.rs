//! A real nginx as the upstream of routing tests: one process per test, in its own
//! directory, answering each listen port with a fixed body that names it and the request
//! (`<label> <method> <uri> host=<host> fwd=<forwarded> xff=<x-forwarded-for>`), so a test
//! sees which upstream served a request and what it was told. Installed with apt-get
//! (as root) when missing, else the test fails naming the command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use super::free_port;
use super::redis::install;

const NGINX_INSTALL: &str = "sudo apt-get install nginx-light";

/// nginx on `PATH` (installed once per test process when missing and possible).
fn nginx_binary() -> PathBuf {
    static FOUND: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let find = || {
                install::on_path("nginx").or_else(|| {
                    let p = PathBuf::from("/usr/sbin/nginx");
                    p.exists().then_some(p)
                })
            };
            if let Some(p) = find() {
                return Ok(p);
            }
            if !install::can_apt_install() {
                return Err(format!(
                    "nginx is missing; install it with: {NGINX_INSTALL}"
                ));
            }
            let _lock = install::InstallLock::acquire();
            if let Some(p) = find() {
                return Ok(p);
            }
            install::apt_install(&["nginx-light"], true)?;
            find().ok_or_else(|| "nginx not found after installing nginx-light".to_string())
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A running nginx, stopped on drop.
pub struct Nginx {
    /// One address per label given to `start`, in order.
    pub addrs: Vec<SocketAddr>,
    child: Child,
    _dir: TempDir,
}

impl Nginx {
    /// nginx with one `server` per label, each on its own loopback port.
    pub async fn start(labels: &[&str]) -> Self {
        let bin = nginx_binary();
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path().display().to_string();
            let ports: Vec<u16> = labels.iter().map(|_| free_port()).collect();
            let servers: String = labels
                .iter()
                .zip(&ports)
                .map(|(label, port)| {
                    format!(
                        "server {{ listen 127.0.0.1:{port}; server_name _; \
                         location / {{ default_type text/plain; \
                         return 200 \"{label} $request_method $request_uri host=$http_host \
                         fwd=$http_forwarded xff=$http_x_forwarded_for\\n\"; }} }}\n"
                    )
                })
                .collect();
            let conf = format!(
                "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
                 error_log {d}/error.log warn;\nevents {{ worker_connections 256; }}\n\
                 http {{\n access_log off;\n client_body_temp_path {d}/body;\n\
                 proxy_temp_path {d}/proxy;\n fastcgi_temp_path {d}/fastcgi;\n\
                 uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n{servers}}}\n"
            );
            std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
            let child = Command::new(&bin)
                .args(["-p", &d, "-c", &format!("{d}/nginx.conf")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let addrs: Vec<SocketAddr> =
                ports.iter().map(|p| ([127, 0, 0, 1], *p).into()).collect();
            let mut nginx = Nginx {
                addrs,
                child,
                _dir: dir,
            };
            if nginx.wait_ready().await {
                return nginx;
            }
        }
        panic!("nginx did not start");
    }

    async fn wait_ready(&mut self) -> bool {
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // a port race: try again with others
            }
            let mut all = true;
            for a in &self.addrs {
                all &= tokio::net::TcpStream::connect(a).await.is_ok();
            }
            if all {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        false
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
