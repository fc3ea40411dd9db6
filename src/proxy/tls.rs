//! TLS on the proxy listener (`[server] tls`): rustls through Pingora, HTTP/2 and
//! HTTP/1.1 by ALPN.
//!
//! Pingora builds its rustls `ServerConfig` once per listener, so a certificate given as
//! files would be fixed at start. Instead the listener gets `CertResolver`, which hands
//! each handshake the certificate of the *current* config: a reload (SIGHUP or
//! `POST /v1/reload`) re-reads and checks both files, and the next handshake serves the
//! new pair; connections already open keep theirs. A reload that removes `tls` keeps the
//! listener on TLS (listeners are fixed at start) with the last certificate.

use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::listeners::tls::TlsSettings;
use pingora::tls::sign::CertifiedKey;
use pingora::tls::{ClientHello, ResolvesServerCert};

use crate::admission::Core;

/// Picks the certificate of the config in force at each handshake.
pub struct CertResolver {
    core: Arc<Core>,
    /// The last certificate seen, for a config that no longer names one.
    last: ArcSwap<CertifiedKey>,
}

// === impl CertResolver ===

impl CertResolver {
    /// A resolver over `core`'s config; `None` when it has no `tls`.
    pub fn new(core: Arc<Core>) -> Option<Self> {
        let first = core.runtime().config.server.tls.as_ref()?.certified.clone();
        Some(Self {
            core,
            last: ArcSwap::new(first),
        })
    }

    /// Pingora's TLS settings for the listener: this resolver, ALPN h2 then http/1.1.
    ///
    /// # Errors
    /// When Pingora refuses the settings.
    pub fn settings(self) -> pingora::Result<TlsSettings> {
        // The paths are unused: a resolver takes precedence over files in `build`.
        let mut settings = TlsSettings::intermediate("", "")?;
        settings.set_cert_resolver(Arc::new(self));
        settings.enable_h2();
        Ok(settings)
    }
}

impl std::fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertResolver").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let rt = self.core.runtime();
        match &rt.config.server.tls {
            Some(tls) => {
                if !Arc::ptr_eq(&self.last.load(), &tls.certified) {
                    self.last.store(tls.certified.clone());
                }
                Some(tls.certified.clone())
            }
            None => Some(self.last.load_full()),
        }
    }
}
