//! Throttle as a library: [`ThrottleLayer`], a `tower::Layer` that applies a
//! `gateway.toml`'s limits in front of any tower or axum service, on any
//! [`LimitStore`].
//!
//! The layer is a third adapter over the admission pipeline (beside the Pingora proxy and
//! `/v1/check`), and it speaks the proxy's contract exactly:
//! - **client address**: the socket peer (read from the request's extensions, see
//!   [`ThrottleLayer::with_peer`]) resolved through `X-Forwarded-For` and `[client_ip]
//!   trusted_proxies` by the proxy's resolver; from an untrusted peer the header is
//!   ignored. A request without a peer address is answered 500
//!   `{"error":"client_address_unavailable"}`: a silent fallback would put every client
//!   in one `ip` budget, and one client could then starve all of them.
//! - **route**: host (the URI's authority, else the one `Host` header) and the path
//!   normalized as the proxy does (400 `invalid_path` / `invalid_host`); the inner service
//!   sees the normalized path, so the route limited is the route served. `upstreams` is
//!   required by the file format and not used: the wrapped service is the upstream.
//! - **key**: `Authorization: Bearer <key>`, else `X-API-Key`, under the route's `auth`.
//! - **answers**: refusals (429, 401, 403, 404, 400, 503) are the gateway's JSON bodies
//!   and headers, byte for byte (`reply::render`); admitted responses get
//!   `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
//! - **inner request**: the client headers the proxy scrubs are removed
//!   (`edge::forward::doomed`: client-sent `X-Throttle-*`, names with `_`, URL and
//!   method overrides, forwarding headers from an untrusted peer, credentials on a
//!   `hide_credentials` route); a known key adds `X-Throttle-Tenant` and
//!   `X-Throttle-Key-Id`, and every admitted request carries a [`Caller`] extension. No
//!   address chain (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`) is added: the inner
//!   service is no network hop, and [`Caller`] carries the resolved client.
//! - **cost**: reserve, then settle, as the proxy does (`edge::answered`): the inner
//!   response's `cost_header` settles the request; a response future dropped before it
//!   resolved (the client left) settles at the route's `max_cost`.
//! - **request id**: `X-Request-Id` as the proxy keeps it (`edge::request_id`): a trusted
//!   proxy's sane id is kept, any other replaced by a fresh one; the inner service
//!   receives it and every answer (refusals too) carries it.
//!
//! What every HTTP transport shares is in `edge`; what the proxy adds of its own stays
//! there. The request id belongs to every transport (it joins the caller's logs to the
//! gateway's answer). The access log (`[server] access_log`) and the OTLP spans
//! (`[tracing]`) are the gateway process's: the layer writes neither, since an
//! application embedding it has its own request logging and tracing (`tower-http`'s
//! `TraceLayer`, `tracing` spans) around it, and the layer's `core().metrics` gives the
//! gateway's counters.
//!
//! An admitted request holds what admission took (concurrency slots) until the inner
//! service's response future resolves or fails, or is dropped: a streamed body that
//! outlives its response head is no longer counted in flight.
//!
//! The layer runs no background task. The memory store sweeps itself as it grows; a
//! `RedisStore` works as is, but the gateway's lease returns and heartbeat (fleet size
//! for the local fallback) are not run, so leased tokens expire with their window and
//! `TieredStore` divides by a fixed instance count. `[database]` is not read.
//!
//! Serving an axum app with the client address of each connection, on a Redis store:
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::sync::atomic::AtomicU32;
//! use std::sync::Arc;
//!
//! use axum::extract::ConnectInfo;
//! use axum::{routing::get, Router};
//! use throttle::layer::ThrottleLayer;
//! use throttle::metrics::Metrics;
//! use throttle::store::{MemoryStore, RedisStore, TieredStore};
//!
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! let config = throttle::config::load("gateway.toml".as_ref())?;
//! // Redis with the gateway's failure policy: a local fallback while Redis is away.
//! let metrics = Arc::new(Metrics::new()?);
//! let redis = Arc::new(RedisStore::from_config(&config.store)?);
//! let instances = Arc::new(AtomicU32::new(config.store.instances.unwrap_or(1)));
//! let store = TieredStore::new(redis, Arc::new(MemoryStore::new()), instances, metrics);
//! let throttle = ThrottleLayer::with_store(config, Arc::new(store))?
//!     .with_peer(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
//!
//! let app = Router::new()
//!     .route("/v1/hello", get(|| async { "hello" }))
//!     .layer(throttle);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```

mod request;
mod service;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::Extensions;

pub use self::service::{ResponseFuture, ThrottleService};
use crate::admission::{Core, Runtime};
use crate::config::{Backend, Config};
use crate::metrics::{Metrics, RouteCounters};
use crate::store::{LimitStore, MemoryStore};

/// Reads the socket peer's address from a request's extensions.
type PeerFn = dyn Fn(&Extensions) -> Option<IpAddr> + Send + Sync;

/// A `tower::Layer` applying a `gateway.toml`'s limits to the service it wraps (see the
/// [module docs](self) for the contract).
///
/// The wrapped service's response body must be buildable from the gateway's own JSON
/// bodies (`ResBody: From<Bytes>`: `axum::body::Body`, `http_body_util::Full<Bytes>`);
/// its errors pass through unchanged, so an axum `Router` takes the layer as is.
///
/// ```
/// use std::net::SocketAddr;
///
/// use axum::{body::Body, routing::get, Router};
/// use http::{Request, StatusCode};
/// use throttle::layer::ThrottleLayer;
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = throttle::config::parse(
///     "inline",
///     r#"
///     [limits.ip]
///     per_minute = 1
///
///     [[routes]]
///     name = "hello"
///     path_prefix = "/"
///     upstreams = ["127.0.0.1:1"]  # required by the format; the wrapped service serves
///     auth = "none"
///     "#,
/// )?;
/// let app = Router::new()
///     .route("/hello", get(|| async { "hello" }))
///     .layer(ThrottleLayer::new(config)?);
///
/// // The peer address is a `SocketAddr` extension (axum's `ConnectInfo`: see `with_peer`).
/// let request = || {
///     Request::get("/hello")
///         .header("host", "api.example.com")
///         .extension(SocketAddr::from(([192, 0, 2, 7], 50_000)))
///         .body(Body::empty())
/// };
/// let first = app.clone().oneshot(request()?).await?;
/// assert_eq!(first.status(), StatusCode::OK);
/// assert_eq!(first.headers()["x-ratelimit-remaining"], "0");
///
/// let second = app.oneshot(request()?).await?;
/// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(second.headers()["retry-after"], "60");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ThrottleLayer {
    shared: Arc<Shared>,
}

/// What every clone of the layer and its services shares.
struct Shared {
    core: Arc<Core>,
    peer: Arc<PeerFn>,
    /// Metrics of requests no route matched.
    unrouted: RouteCounters,
}

/// Who an admitted request is from, as a request extension for the inner service
/// (axum: `Extension<Caller>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The resolved client address (the one the `ip` scope counts).
    pub client_ip: IpAddr,
    /// The matched route's name.
    pub route: Option<Arc<str>>,
    /// The key id, when a valid key was presented (never the key itself).
    pub key_id: Option<Arc<str>>,
    /// The key's tenant.
    pub tenant: Option<Arc<str>>,
}

/// Why a layer cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// The config names a store the layer does not build by itself.
    #[error("{0}")]
    Store(String),
    /// Metrics could not be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The routes' upstream sets could not be built.
    #[error("routes: {0}")]
    Routes(#[from] std::io::Error),
    /// The config asks for what the layer cannot do: a route's `cost_from` (the layer
    /// does not see the response body: use the proxy for bandwidth quotas).
    #[error("{0}")]
    Unsupported(String),
}

// === impl ThrottleLayer ===

impl ThrottleLayer {
    /// The limits of `config` on an in-process `MemoryStore`.
    ///
    /// # Errors
    /// `LayerError::Store` when `[store] backend = "redis"` (build that store and use
    /// [`with_store`](Self::with_store)); otherwise when metrics or routes cannot be set up.
    pub fn new(config: Config) -> Result<Self, LayerError> {
        if config.store.backend == Backend::Redis {
            return Err(LayerError::Store(
                "[store] backend = \"redis\": build the store and pass it to \
                 ThrottleLayer::with_store"
                    .into(),
            ));
        }
        Self::with_store(config, Arc::new(MemoryStore::new()))
    }

    /// The limits of `config` on `store` (memory, Redis, tiered or your own); the
    /// `[store]` section is not read.
    ///
    /// # Errors
    /// When metrics or routes cannot be set up; `LayerError::Unsupported` for a route
    /// with `cost_from` (the layer hands the response body on without reading it; a
    /// layer made with [`from_core`](Self::from_core) keeps such a route's reserve).
    pub fn with_store(config: Config, store: Arc<dyn LimitStore>) -> Result<Self, LayerError> {
        if let Some(r) = config.routes.iter().find(|r| r.cost_from.is_some()) {
            return Err(LayerError::Unsupported(format!(
                "route {:?}: cost_from needs the response body, which the tower layer does \
                 not read; serve this route through the proxy",
                r.name
            )));
        }
        let metrics = Arc::new(Metrics::new()?);
        let core = Core::new(Runtime::from_config(config)?, store, metrics)
            .map_err(std::io::Error::from)?;
        Ok(Self::from_core(Arc::new(core)))
    }

    /// A layer over an existing pipeline state (a shared one, or one on a test clock).
    pub fn from_core(core: Arc<Core>) -> Self {
        Self {
            shared: Arc::new(Shared {
                unrouted: core.metrics.route("none"),
                core,
                peer: Arc::new(default_peer),
            }),
        }
    }

    /// Reads the socket peer's address with `peer` instead of the default, which takes
    /// a `SocketAddr` extension, else an `IpAddr` one. With axum, served through
    /// `into_make_service_with_connect_info::<SocketAddr>()`:
    /// `|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())`.
    pub fn with_peer<F>(self, peer: F) -> Self
    where
        F: Fn(&Extensions) -> Option<IpAddr> + Send + Sync + 'static,
    {
        let s = &self.shared;
        Self {
            shared: Arc::new(Shared {
                core: s.core.clone(),
                peer: Arc::new(peer),
                unrouted: s.unrouted.clone(),
            }),
        }
    }

    /// The pipeline state: its metrics (`core().metrics.render()` is the gateway's
    /// `/metrics` text), its runtime (`core().swap_runtime` reloads the config) and store.
    pub fn core(&self) -> &Arc<Core> {
        &self.shared.core
    }
}

impl<S> tower::Layer<S> for ThrottleLayer {
    type Service = ThrottleService<S>;

    fn layer(&self, inner: S) -> ThrottleService<S> {
        ThrottleService::new(inner, self.shared.clone())
    }
}

impl std::fmt::Debug for ThrottleLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThrottleLayer")
            .field("store", &self.shared.core.store.name())
            .finish_non_exhaustive()
    }
}

/// The peer of a `SocketAddr` extension, else of an `IpAddr` one.
fn default_peer(ext: &Extensions) -> Option<IpAddr> {
    ext.get::<SocketAddr>()
        .map(SocketAddr::ip)
        .or_else(|| ext.get::<IpAddr>().copied())
}
