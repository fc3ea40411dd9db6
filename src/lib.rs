//! Throttle: an edge gateway for public HTTP APIs on Pingora.
//!
//! Data flows one way: `config` -> `proxy` -> `identity` -> `limiter` -> `store`.
//!
//! - `config`: `gateway.toml`, parsed and validated once into internal types.
//! - `client_ip`: trusted-proxy `X-Forwarded-For` resolution.
//! - `identity`: API key -> key id, tenant, tier (keys compared by SHA-256).
//! - `blocklist`: IP / CIDR, key and tenant blocks with expiry.
//! - `limiter`: policies, the five algorithms as pure functions, the layered verdict.
//! - `store`: where limiter state lives (`MemoryStore` embedded).
//! - `proxy`: the Pingora `ProxyHttp` glue, admission pipeline and responses.
//! - `admin`: `/healthz`, `/readyz`, `/metrics`, `POST /v1/check`.
//!
//! ```
//! use throttle::clock::ManualClock;
//! use throttle::limiter::{Check, Ident, OnFailure, Scope, ScopeLimits, Window, WindowLimit};
//! use throttle::store::MemoryStore;
//!
//! let store = MemoryStore::with_clock(ManualClock::at(1_764_000_000_000));
//! let limits = ScopeLimits {
//!     windows: vec![WindowLimit::new(Window::Minute, 1)],
//!     on_failure: OnFailure::Local,
//!     message: None,
//! };
//! let mut check = Check::new(1);
//! check.push(Scope::Key, Ident::Name("key_demo".into()), &limits);
//! assert!(store.decide(&check).allowed);
//! let second = store.decide(&check);
//! assert!(!second.allowed);
//! assert_eq!(second.governing.unwrap().decision.retry_after_ms, 60_000);
//! ```

pub mod admin;
pub mod blocklist;
pub mod client_ip;
pub mod clock;
pub mod config;
pub mod db;
pub mod demo;
pub mod identity;
pub mod lifecycle;
pub mod limiter;
pub mod metrics;
pub mod proxy;
pub mod reload;
pub mod server;
pub mod state;
pub mod store;
