//! Throttle: an edge gateway for public HTTP APIs on Pingora.
//!
//! The modules form layers; each imports only from the layers below it (checked by
//! `layering::imports_only_run_down`, with `layering::forbidden_imports` for the paths a
//! module must not name even below it, and `sizes` for the size bar):
//!
//! 1. `clock` and `sharded` (one table as mutex-guarded shards picked by hash), then
//!    `limiter` (policies, the five algorithms as pure functions, the layered verdict)
//!    and `adaptive` (the adaptive-limit window and controller), then `auth` (JWT
//!    verification: keys, JWKS refresh, the verified-token cache; of the gateway it
//!    imports only `sharded`) and `descriptors` (envoyproxy/ratelimit's YAML descriptors,
//!    loaded and matched; it imports nothing of the gateway), then `config`
//!    (`gateway.toml`, validated once). `regions` (one limit across regions: allotments,
//!    grants and the bound, as pure functions) sits beside `limiter`.
//! 2. `metrics`, `client_ip` (trusted-proxy address resolution), `blocklist`, `bans`
//!    (automatic temporary bans), `identity` (API key or JWT -> key id, tenant, tier),
//!    `lifecycle` (connections and shutdown work), `demo` (the echo upstream), `top` (the
//!    heavy-hitter sketch behind `GET /v1/top`), `access_log` (the JSON access log's
//!    writer), `otlp` (`[tracing]`: W3C trace context, spans exported over OTLP) and
//!    `violations` (the violation log's event and the sink admission pushes it to).
//! 3. `store` (where limiter state lives: memory, Redis, failure policy), `db`
//!    (PostgreSQL records: keys, tenants, policies, blocks, the violation log) and
//!    `routing` (host + path prefix + method -> route and upstreams).
//! 4. `admission`: the one transport-neutral pipeline every entry point runs, with the
//!    request lifetime and the snapshot it reads. It imports neither `db` nor
//!    `store::redis`: the violation log is a `violations::EventSink`, the fleet's bans a
//!    `store::BanStore`, and the database snapshot arrives built (`reload::snapshot`).
//! 5. `reply` (the gateway's own HTTP answers: `Refusal::reply`, `Admission::rate_headers`),
//!    `reload` (config hot reload, and `reload::snapshot`: the database snapshot read and
//!    published) and `upstream_health` (active health checks).
//! 6. `edge`: transport-neutral HTTP, no Pingora (path normalization, the one target
//!    parser and its `Host` rule, forwarding headers, the reported cost, `admit_http` and
//!    `answered`, the socket peer's canonical address), then `listener`: what the Pingora
//!    listeners share (the connection guard, the Pingora peer read through `edge`).
//! 7. The adapters, none importing another: `proxy` (Pingora), `admin` (the admin
//!    listener and `/v1/check`), `rls` (Envoy's rate-limit gRPC service), `sync` (the
//!    background link to PostgreSQL) and `layer` (the `tower::Layer` for embedding).
//! 8. `server`, which assembles them, and `simulate` (`throttle simulate`); `main.rs` is
//!    the CLI.
//!
//! ```
//! use throttle::clock::ManualClock;
//! use throttle::limiter::{Check, Ident, OnFailure, Scope, ScopeLimits, Window, WindowLimit};
//! use throttle::store::MemoryStore;
//!
//! let store = MemoryStore::with_clock(ManualClock::at(1_764_000_000_000));
//! let limits = ScopeLimits {
//!     concurrent: None,
//!     ban: None,
//!     windows: vec![WindowLimit::new(Window::Minute, 1)],
//!     on_failure: OnFailure::Local,
//!     message: None,
//!     count_on: None,
//! };
//! let mut check = Check::new(1);
//! check.push(Scope::Key, Ident::Name("key_demo".into()), &limits);
//! assert!(store.decide(&check).allowed);
//! let second = store.decide(&check);
//! assert!(!second.allowed);
//! assert_eq!(second.governing.unwrap().decision.retry_after_ms, 60_000);
//! ```

pub mod access_log;
pub mod adaptive;
pub mod admin;
pub mod admission;
pub mod auth;
pub mod bans;
pub mod blocklist;
pub mod client_ip;
pub mod clock;
pub mod config;
pub mod db;
pub mod demo;
pub mod descriptors;
pub mod edge;
pub mod identity;
pub mod layer;
pub mod lifecycle;
pub mod limiter;
pub mod listener;
pub mod metrics;
pub mod otlp;
pub mod proxy;
pub mod regions;
pub mod reload;
pub mod reply;
pub mod rls;
pub mod routing;
pub mod server;
pub mod sharded;
pub mod simulate;
pub mod store;
pub mod sync;
pub mod top;
pub mod upstream_health;
pub mod violations;

#[cfg(test)]
mod layering;
#[cfg(test)]
mod sizes;
