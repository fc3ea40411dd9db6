//! The JWKS refresher as a background service: it runs the current runtime's JWT
//! verifier's `run_refresher` (fetch at start, every `jwks_refresh_secs`, early on an
//! unknown `kid`) until shutdown. A reload that keeps `[auth.jwt]` keeps the verifier, whose
//! own refresher follows a changed `jwks_url`; a reload that adds or removes the section
//! replaces it (`Core::jwt_replaced`), and the service moves to the new one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::admission::Core;

/// Keeps the `jwks_url` key set of the running verifier fresh.
pub(crate) struct JwksRefresher {
    pub(crate) core: Arc<Core>,
}

#[async_trait]
impl BackgroundService for JwksRefresher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let stopping = AtomicBool::new(false);
        while !stopping.load(Ordering::Relaxed) {
            // Taken before the runtime is read: a swap in between still wakes it.
            let replaced = self.core.jwt_replaced();
            let verifier = self.core.runtime().jwt.clone();
            let until = async {
                tokio::select! {
                    _ = shutdown.changed() => stopping.store(true, Ordering::Relaxed),
                    () = replaced => {}
                }
            };
            match verifier {
                Some(v) => v.run_refresher(until).await,
                None => until.await,
            }
        }
    }
}
