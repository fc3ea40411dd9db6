//! The Envoy rate-limit service (`[server] rls_listen`): `envoy.service.ratelimit.v3.
//! RateLimitService/ShouldRateLimit` over gRPC, one more adapter over the admission
//! pipeline. A call is admitted like a proxied request or a `/v1/check` and counts against
//! the same buckets (one store, one state).
//!
//! With `[rls] config`, the descriptors follow envoyproxy/ratelimit's YAML and semantics
//! (`configured`). Without it, the built-in mapping (`request`, `answer`): each
//! descriptor is its own admission request, decided all-or-nothing across its scopes (the
//! built-in scopes, then a route's tables and custom scopes), and the call is all-or-nothing across
//! descriptors (one refused: the others are refunded). One call spends each shared scope
//! at most once, whatever its number of descriptors: `global` with its first descriptor,
//! `ip` with the first descriptor naming each `remote_address` (`shared_once`):
//! - `remote_address` -> the `ip` scope (absent: no address, so nothing keyed by one
//!   applies, see `Origin::Unaddressed`, and it is no error); `api_key` -> the key (the
//!   raw key, hashed and looked up as the proxy does; without `remote_address` its failed
//!   lookups cannot be counted against an address in `[limits.auth]` and are counted in
//!   `throttle_rls_unmetered_lookups_total`: send `remote_address` to meter guessing);
//!   `key_id` -> the key of that id; `tenant` -> the tenant (alone: its tenant limits
//!   only, its tier by the tenant-tier rule; with a key: it must be the key's tenant);
//!   `route` -> that route's `cost`, `mode` and `auth` (none: no route, cost 1, enforce),
//!   and an adaptive route's current factor (learned from proxied traffic only);
//! - `hits_addend` is the cost (a descriptor's own, else the request's); 0 (unset) means
//!   the default: the route's `cost`, else 1;
//! - `domain` is not used. Unknown entries, conflicting values within a descriptor, an
//!   unparseable `remote_address`, an unknown route or tenant, `is_negative_hits` and
//!   descriptor limit overrides are `INVALID_ARGUMENT` with a message saying what is wrong.
//!
//! Answering (`answer`): one status per descriptor (its governing window), `OVER_LIMIT`
//! when any is refused, the `X-RateLimit-*` headers (and `Retry-After` on a denial) in
//! `response_headers_to_add`. A blocked IP, key or tenant, a missing or invalid key (an
//! unknown `key_id` is an invalid key) and a fail-closed store are `OVER_LIMIT` as well,
//! with the proxy's JSON body as `raw_body`. Failed key lookups count against
//! `remote_address` in `[limits.auth]`, never against Envoy's own address. A `key_id` or
//! `tenant` names a caller Envoy has identified, so it satisfies `auth = "required"` as a
//! valid key does.
//!
//! A call ends when it is answered: whatever the admission holds (a concurrency slot) is
//! given back at once, since Envoy never says when its request ends.
//!
//! The listener is plaintext HTTP/2 (gRPC), meant for a sidecar or a private network. It
//! runs as a background service on its own runtime with `server.threads` threads, stops
//! accepting on shutdown and drains the calls in flight. On a zero-downtime upgrade the new
//! process binds the port as soon as the old one lets go of it.

mod answer;
mod configured;
mod directory;
mod request;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::{Request, Response, Status};

use self::directory::Directory;
use self::request::Caller;
use crate::admission::{self, AdmitRequest, Core, Origin, Rejection, Skip, Target};
use crate::config::Auth;
use crate::identity::{validate_key, Presented};
use crate::lifecycle::{Lifecycle, RLS_MAX_CONNECTIONS};
use crate::listener::Guarded;

/// Largest request accepted: a few descriptors are a few hundred bytes.
const MAX_REQUEST: usize = 64 * 1024;

/// How often an upgrading process tries the port its predecessor still holds.
const REBIND_EVERY: Duration = Duration::from_millis(20);

/// The `RateLimitService` implementation.
pub struct Rls {
    core: Arc<Core>,
    directory: Directory,
}

/// The gRPC listener, a Pingora background service.
pub struct RlsListener {
    rls: Arc<Rls>,
    addr: SocketAddr,
    /// The socket bound at start (None: bind it once free, on an upgrade).
    bound: Mutex<Option<std::net::TcpListener>>,
    lifecycle: Arc<Lifecycle>,
    /// This listener's open connections (its own cap, `RLS_MAX_CONNECTIONS`).
    connections: Arc<Lifecycle>,
}

/// An accepted RLS connection: the proxy's HTTP/2 deadlines, and its slot.
pub struct RlsConn(Guarded);

// === impl Rls ===

impl Rls {
    /// The service over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self {
            core,
            directory: Directory::default(),
        }
    }

    /// Decides `req` (see the module docs).
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a malformed request.
    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let runtime = self.core.runtime();
        if let Some(d) = &runtime.config.rls.descriptors {
            return configured::decide(&self.core, &runtime.config.rls, d, req)
                .await
                .map_err(invalid);
        }
        drop(runtime);
        let asked = request::read(req).map_err(invalid)?;
        let skips = shared_once(&asked);
        let one = asked
            .iter()
            .zip(skips)
            .map(|(a, skip)| self.decide_one(a, skip));
        let decided = futures_util::future::join_all(one)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, Status>>()?;
        Ok(answer::combine(decided, &self.core.metrics))
    }

    /// One descriptor of the built-in mapping, admitted as `/v1/check` admits a request.
    async fn decide_one(
        &self,
        asked: &request::Asked<'_>,
        skip: Skip,
    ) -> Result<Result<admission::Admission, admission::Refusal>, Status> {
        let known = match (asked.caller, asked.tenant) {
            (Caller::KeyId(id), _) => self.directory.key(&self.core, id),
            (Caller::Anonymous, Some(t)) => {
                Some(self.directory.tenant(&self.core, t).map_err(invalid)?)
            }
            _ => None,
        };
        let key = match (asked.caller, &known) {
            (_, Some(k)) => Presented::Known(k),
            (Caller::ApiKey(k), None) => validate_key(k.as_bytes()),
            // An unknown id is an invalid key: refused as the proxy refuses one.
            (Caller::KeyId(_), None) => Presented::Malformed,
            (Caller::Anonymous, None) => Presented::Missing,
        };
        if let Some(t) = asked.tenant {
            self.same_tenant(key, t)?;
        }
        let (client_ip, origin) = match asked.client_ip {
            Some(ip) => (ip, Origin::Check),
            // No address: nothing keyed by one applies (see `Origin::Unaddressed`).
            None => (IpAddr::V4(Ipv4Addr::UNSPECIFIED), Origin::Unaddressed),
        };
        let request = AdmitRequest {
            client_ip,
            target: asked.route.map_or(Target::Any, Target::Named),
            key,
            cost: asked.cost,
            also_charge: None,
            origin,
            attrs: Default::default(),
            skip,
        };
        match admission::admit(&self.core, &request).await {
            Ok(a) => Ok(Ok(a)),
            Err(refusal) => match &refusal.rejection {
                Rejection::UnknownRoute(name) => Err(invalid(format!("unknown route {name:?}"))),
                // A key or tier not loaded yet: Envoy retries or applies its failure mode.
                Rejection::NotReady => Err(Status::unavailable(
                    "not ready: the first database snapshot or key set has not loaded",
                )),
                _ => Ok(Err(refusal)),
            },
        }
    }

    /// `UNAUTHENTICATED` unless the call carries `authorization: Bearer <check_token>`
    /// (when `[server] check_token` is set).
    fn authorize(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        let runtime = self.core.runtime();
        let Some(token) = &runtime.config.server.check_token else {
            return Ok(());
        };
        let presented = metadata.get_all("authorization").into_iter();
        if token.authorizes(presented.map(|v| v.as_bytes())) {
            return Ok(());
        }
        Err(Status::unauthenticated(
            "authorization: Bearer <[server] check_token> required",
        ))
    }

    /// Refuses a `tenant` entry that is not the tenant of the key sent with it (an invalid
    /// key is left to admission, which refuses it).
    fn same_tenant(&self, key: Presented<'_>, tenant: &str) -> Result<(), Status> {
        let owner = match key {
            Presented::Known(k) => Some(k.clone()),
            Presented::Key(_) => {
                let (rt, dynamic) = (self.core.runtime(), self.core.dynamic());
                admission::lookup_key(&rt, &dynamic, key, Auth::Optional)
                    .ok()
                    .flatten()
            }
            Presented::Missing | Presented::Malformed | Presented::Token(_) => None,
        };
        // The owner of a raw `api_key` is never named: the answer must not tell a caller
        // whose key it guessed (a `key_id` is an identity Envoy vouches for).
        let theirs = owner.as_ref().map(|k| k.tenant_id().unwrap_or(""));
        match (theirs, key) {
            (Some(t), Presented::Known(_)) if t != tenant => Err(invalid(format!(
                "tenant {tenant:?} conflicts with the key's tenant {t:?}"
            ))),
            (Some(t), _) if t != tenant => Err(invalid(format!(
                "tenant {tenant:?} is not the tenant of the api_key"
            ))),
            _ => Ok(()),
        }
    }
}

/// What each descriptor of one call leaves out: a call spends `global` once (with its
/// first descriptor) and `ip` once per `remote_address` (with the first descriptor naming
/// it), whatever its number of descriptors. A refused descriptor refuses the whole call,
/// and nothing of it is charged, so a scope left out is never left unpaid.
fn shared_once(asked: &[request::Asked<'_>]) -> Vec<Skip> {
    asked
        .iter()
        .enumerate()
        .map(|(i, a)| Skip {
            global: i > 0,
            ip: a.client_ip.is_some() && asked[..i].iter().any(|b| b.client_ip == a.client_ip),
        })
        .collect()
}

#[async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.authorize(request.metadata())?;
        self.decide(request.get_ref()).await.map(Response::new)
    }
}

fn invalid(message: String) -> Status {
    tracing::debug!(%message, "malformed rate-limit request");
    Status::invalid_argument(message)
}

// === impl RlsListener ===

impl RlsListener {
    /// The service on `addr`, bound now.
    ///
    /// # Errors
    /// When `addr` cannot be bound.
    pub fn bind(
        core: Arc<Core>,
        lifecycle: Arc<Lifecycle>,
        addr: SocketAddr,
    ) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let mut l = Self::later(core, lifecycle, addr);
        l.bound = Mutex::new(Some(listener));
        Ok(l)
    }

    /// The service on `addr`, bound once it is free: a process taking over from another
    /// (a zero-downtime upgrade) gets the port when the old process stops serving it.
    pub fn later(core: Arc<Core>, lifecycle: Arc<Lifecycle>, addr: SocketAddr) -> Self {
        Self {
            rls: Arc::new(Rls::new(core)),
            addr,
            bound: Mutex::new(None),
            lifecycle,
            connections: Arc::new(Lifecycle::default()),
        }
    }

    /// The bound socket, or None when shutdown came first or binding failed for good.
    async fn listener(&self, shutdown: &mut ShutdownWatch) -> Option<tokio::net::TcpListener> {
        let bound = self
            .bound
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(l) = bound {
            return tokio::net::TcpListener::from_std(l)
                .map_err(|e| tracing::error!(error = %e, "rate-limit service cannot listen"))
                .ok();
        }
        let mut tick = tokio::time::interval(REBIND_EVERY);
        let mut waiting = false;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return None,
                _ = tick.tick() => match tokio::net::TcpListener::bind(self.addr).await {
                    Ok(l) => return Some(l),
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                        if !waiting {
                            tracing::info!(addr = %self.addr, "rate-limit service waits for its port");
                            waiting = true;
                        }
                    }
                    Err(e) => {
                        tracing::error!(addr = %self.addr, error = %e, "rate-limit service cannot listen");
                        return None;
                    }
                },
            }
        }
    }
}

#[async_trait]
impl BackgroundService for RlsListener {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // The process does not exit early (an idle drain) while calls are being answered.
        let _finishing = self.lifecycle.finishing();
        let Some(listener) = self.listener(&mut shutdown).await else {
            return;
        };
        let incoming = capped(listener, self.rls.core.clone(), self.connections.clone());
        let service = RateLimitServiceServer::from_arc(self.rls.clone())
            .max_decoding_message_size(MAX_REQUEST);
        let stop = async move {
            let _ = shutdown.changed().await;
        };
        tracing::info!(addr = %self.addr, "rate-limit service listening");
        let served = tonic::transport::Server::builder()
            .serve_with_incoming_shutdown(service, incoming, stop)
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "rate-limit service stopped");
        }
    }
}

/// The connections accepted on `listener`, each within the listener's caps (in total, and
/// `rls_max_connections_per_ip` per client, an IPv4 address or IPv6 /64; beyond them a
/// connection is closed at once) and guarded: the HTTP/2 preface and every header block
/// must arrive within `header_timeout_secs`, and a connection that reads nothing for
/// `idle_timeout_secs` is closed.
fn capped(
    listener: tokio::net::TcpListener,
    core: Arc<Core>,
    connections: Arc<Lifecycle>,
) -> impl futures_util::Stream<Item = std::io::Result<RlsConn>> {
    futures_util::stream::unfold(
        (listener, core, connections),
        |(listener, core, connections)| async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::debug!(error = %e, "rate-limit service accept failed");
                        // Out of files: let others finish before trying again.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (header, body, idle, per_ip) = {
                    let rt = core.runtime();
                    let s = &rt.config.server;
                    let per_ip = s.rls_max_connections_per_ip;
                    (s.header_timeout, s.body_timeout, s.idle_timeout, per_ip)
                };
                // The one canonical peer (`edge::peer_ip`), as the other listeners key it.
                let ip = crate::edge::peer_ip(Some(peer.ip()));
                let slot = match connections.open(ip, RLS_MAX_CONNECTIONS, Some(per_ip)) {
                    Ok(slot) => slot,
                    Err(why) => {
                        tracing::debug!(?why, "rate-limit connection refused: cap reached");
                        core.metrics.connection_refused("rls", why.as_str());
                        continue; // dropped: closed
                    }
                };
                let _ = tcp.set_nodelay(true);
                let stream: pingora::protocols::Stream =
                    Box::new(pingora::protocols::l4::stream::Stream::from(tcp));
                let conn = RlsConn(Guarded::http2(stream, header, body, Some(idle), slot));
                return Some((Ok(conn), (listener, core, connections)));
            }
        },
    )
}

impl tokio::io::AsyncRead for RlsConn {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for RlsConn {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Connected for RlsConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        use pingora::protocols::GetSocketDigest;
        let digest = self.0.get_socket_digest();
        let inet = |a: Option<&pingora::protocols::l4::socket::SocketAddr>| {
            a.and_then(|a| a.as_inet()).copied()
        };
        TcpConnectInfo {
            local_addr: digest.as_ref().and_then(|d| inet(d.local_addr())),
            remote_addr: digest.as_ref().and_then(|d| inet(d.peer_addr())),
        }
    }
}

#[cfg(test)]
mod tests;
