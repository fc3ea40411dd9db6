//! A headless Chromium driven over the W3C WebDriver protocol: Debian's `chromium` and
//! `chromium-driver` (`chromedriver` on a free port), spoken to with the dev-dependency
//! reqwest as plain JSON. Hand-rolled rather than a crate (fantoccini, thirtyfour): the
//! console test needs seven commands, and this adds no dependency tree to the build.
//!
//! Without the browser a test skips with a message, except under CI (`$CI` set), where
//! it fails: CI installs both packages (`.ci/run`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tempfile::TempDir;

use super::redis::install::{in_ci, on_path};
use super::{eventually, free_port};

/// The W3C name of an element reference in JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process with one browser session; both ended on drop.
pub struct Browser {
    driver: Child,
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>/session/<id>`.
    session: String,
    port: u16,
    closed: bool,
    _profile: TempDir,
}

impl Browser {
    /// A headless browser, or None (after saying why) when chromium or chromedriver is
    /// missing outside CI. Under CI a missing browser fails `test`.
    pub async fn start_or_skip(test: &str) -> Option<Self> {
        let chromium = ["chromium", "chromium-browser", "google-chrome"]
            .into_iter()
            .find_map(on_path);
        let (Some(chromium), Some(driver)) = (chromium, on_path("chromedriver")) else {
            let why = "needs chromium and chromedriver on $PATH \
                       (apt-get install chromium chromium-driver)";
            assert!(!in_ci(), "{test}: {why}; CI installs them in .ci/run");
            eprintln!("SKIPPED {test}: {why}");
            return None;
        };
        Some(Self::start(chromium, driver).await)
    }

    async fn start(chromium: PathBuf, driver: PathBuf) -> Self {
        let port = free_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let status = format!("http://127.0.0.1:{port}/status");
        eventually(Duration::from_secs(20), "chromedriver answers", || {
            let (http, status) = (http.clone(), status.clone());
            async move {
                let r = http.get(&status).send().await.ok()?;
                let v: Value = r.json().await.ok()?;
                v["value"]["ready"].as_bool().filter(|r| *r)
            }
        })
        .await;
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,2000",
                         "--no-first-run", "--disable-extensions",
                         format!("--user-data-dir={}", profile.path().display())],
            },
        }}});
        let r: Value = http
            .post(format!("http://127.0.0.1:{port}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {r}"));
        Self {
            driver: child,
            http,
            session: format!("http://127.0.0.1:{port}/session/{id}"),
            port,
            closed: false,
            _profile: profile,
        }
    }

    /// One command: `method` on `path` under the session, the answer's `value`.
    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r: Value = req.send().await.unwrap().json().await.unwrap();
        if r["value"]["error"].is_string() {
            panic!("WebDriver {path}: {}", r["value"]);
        }
        r["value"].clone()
    }

    /// Opens `url` and waits until its document has loaded.
    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// The value of `script` (a function body: `return ...`) run in the page.
    pub async fn eval(&self, script: &str) -> Value {
        let body = json!({"script": script, "args": []});
        self.command(reqwest::Method::POST, "/execute/sync", Some(body))
            .await
    }

    async fn element(&self, css: &str) -> String {
        let body = json!({"using": "css selector", "value": css});
        let v = self
            .command(reqwest::Method::POST, "/element", Some(body))
            .await;
        v[ELEMENT].as_str().unwrap().to_string()
    }

    /// Types `text` into the element `css` selects, as keystrokes.
    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        let body = json!({"text": text});
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(body),
        )
        .await;
    }

    /// Clicks the element `css` selects, as a pointer would.
    pub async fn click(&self, css: &str) {
        let id = self.element(css).await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Saves the viewport as `target/console-screenshots/<name>.png` (CI keeps them).
    pub async fn screenshot(&self, name: &str) {
        use base64::Engine;
        let png = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), bytes).unwrap();
    }

    /// Ends the session (the browser exits).
    pub async fn close(mut self) {
        self.command(reqwest::Method::DELETE, "", None).await;
        self.closed = true;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.closed {
            // A failed test: end the session so chromium does not outlive it.
            let path = self
                .session
                .trim_start_matches(&format!("http://127.0.0.1:{}", self.port));
            let request = format!(
                "DELETE {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = super::raw_exchange(&mut s, request.as_bytes());
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
