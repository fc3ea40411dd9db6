//! The `jwks_url` refresher: one background loop per verifier that fetches the JWKS at
//! start, every `jwks_refresh`, at once after a reload names a new URL, and early (but
//! at most once per `KID_REFETCH_INTERVAL` after the last fetch) when a token carried an
//! unknown `kid`.
//!
//! Every fetch has a deadline (`FETCH_DEADLINE`, connect to last byte) and a body bound
//! (`MAX_JWKS_BYTES`); a fetch that fails in any way (transport, status, size, deadline,
//! not a JWKS, no usable key) is counted and logged, and the last good set stays in use.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::time::{sleep_until, Instant};

use super::error::FetchError;
use super::verifier::JwtVerifier;

/// Deadline of one JWKS fetch, connect to last byte.
pub const FETCH_DEADLINE: Duration = Duration::from_secs(5);

/// Least time between a fetch and one brought forward by an unknown `kid`.
pub const KID_REFETCH_INTERVAL: Duration = Duration::from_secs(10);

/// Largest JWKS body read (1 MiB: thousands of keys).
pub const MAX_JWKS_BYTES: usize = 1 << 20;

/// How soon a failed fetch is tried again while no `jwks_url` set has loaded yet (the
/// gateway is not ready until one has): at most `jwks_refresh`.
pub(super) const FIRST_SET_RETRY: Duration = Duration::from_secs(1);

/// How many redirects a JWKS fetch follows.
const MAX_REDIRECTS: usize = 3;

// === impl JwtVerifier ===

impl JwtVerifier {
    /// Fetches `jwks_url` once and installs its keys; without a URL, does nothing
    /// (`Ok(0)`). Counted in `stats()` either way.
    ///
    /// # Errors
    /// Why no new set was installed; the last good set stays.
    pub async fn refresh_once(&self) -> Result<usize, FetchError> {
        let Some(url) = self.settings().jwks_url else {
            return Ok(0);
        };
        let deadline = self.timing.fetch_deadline;
        let fetched = match tokio::time::timeout(deadline, self.fetch(&url)).await {
            Ok(body) => body.and_then(|b| self.install_url(&url, &b)),
            Err(_) => Err(FetchError::Timeout),
        };
        let counter = match fetched {
            Ok(_) => &self.counters.fetches,
            Err(_) => &self.counters.fetch_failures,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        fetched
    }

    /// Keeps the `jwks_url` set fresh until `shutdown` completes (see the module docs):
    /// spawn it once per verifier, e.g. inside `lifecycle`'s background services. With no
    /// URL configured every round is a no-op, so a reload that adds one is picked up.
    pub async fn run_refresher(self: Arc<Self>, shutdown: impl Future<Output = ()>) {
        self.drive(|| self.refresh_logged(), shutdown).await;
    }

    async fn refresh_logged(&self) {
        match self.refresh_once().await {
            Ok(keys) => tracing::debug!(keys, "jwks refreshed"),
            Err(e) => {
                tracing::warn!(error = %e, "jwks refresh failed; the last good key set stays")
            }
        }
    }

    /// The refresher's schedule around `refresh` (a fetch in production, a stand-in in
    /// tests, which run it on paused time).
    pub(super) async fn drive<F, Fut>(&self, refresh: F, shutdown: impl Future<Output = ()>)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = ()>,
    {
        tokio::pin!(shutdown);
        loop {
            // Misses until now are answered by this fetch.
            self.kid_wanted.store(false, Ordering::Release);
            tokio::select! {
                () = &mut shutdown => return,
                () = refresh() => {}
            }
            if !self.wait_for_next(Instant::now(), &mut shutdown).await {
                return;
            }
        }
    }

    /// Waits until the next fetch is due: `jwks_refresh` after `fetched`, at once on a
    /// new URL, or `kid_refetch` after `fetched` when a miss wants one. False on shutdown.
    async fn wait_for_next(
        &self,
        fetched: Instant,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> bool {
        let every = self.settings().jwks_refresh;
        let due = if self.awaiting_keys() {
            // Not ready until a first set loads: try again soon, not a whole period later.
            fetched + every.min(FIRST_SET_RETRY)
        } else {
            fetched + every
        };
        loop {
            tokio::select! {
                () = shutdown.as_mut() => return false,
                () = sleep_until(due) => return true,
                () = self.url_changed.notified() => return true,
                () = self.kid_miss.notified() => {
                    // A wake-up left from a miss the last fetch already answered.
                    if !self.kid_wanted.load(Ordering::Acquire) {
                        continue;
                    }
                    let early = (fetched + self.timing.kid_refetch).min(due);
                    tokio::select! {
                        () = shutdown.as_mut() => return false,
                        () = sleep_until(early) => {}
                        () = self.url_changed.notified() => {}
                    }
                    self.counters.kid_refetches.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
            }
        }
    }

    /// The body at `url`, at most `MAX_JWKS_BYTES` (the caller bounds the time).
    async fn fetch(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        let transport = |e: reqwest::Error| FetchError::Transport(e.to_string());
        let mut resp = self
            .client()?
            .get(url)
            .header(http::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(transport)?;
        if !resp.status().is_success() {
            return Err(FetchError::Status(resp.status().as_u16()));
        }
        let too_large = FetchError::TooLarge(MAX_JWKS_BYTES);
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
        {
            return Err(too_large);
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(too_large);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// The HTTP client, built on first use (it reads the system trust store) and kept for
    /// its connection pool.
    fn client(&self) -> Result<reqwest::Client, FetchError> {
        let mut slot = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let deadline = self.timing.fetch_deadline;
        // No overall client timeout: `refresh_once` bounds the whole fetch itself.
        let client = reqwest::Client::builder()
            .connect_timeout(deadline)
            .redirect(reqwest::redirect::Policy::limited(MAX_REDIRECTS))
            .user_agent(concat!("throttle/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| FetchError::Client(e.to_string()))?;
        *slot = Some(client.clone());
        Ok(client)
    }
}
