//! An axum app behind `throttle::layer::ThrottleLayer`: the gateway's limits, keys and
//! 429 contract in process, no proxy in front.
//!
//! ```text
//! cargo run --example tower_axum            # listens on 127.0.0.1:3000
//! curl -i http://127.0.0.1:3000/hello       # 200, X-RateLimit-Remaining: 1
//! curl -i http://127.0.0.1:3000/hello       # 200, X-RateLimit-Remaining: 0
//! curl -i http://127.0.0.1:3000/hello       # 429, Retry-After, the contract's JSON body
//! curl -i http://127.0.0.1:3000/account     # 401 {"error":"missing_api_key"}
//! curl -i -H 'X-API-Key: demo-key-123' http://127.0.0.1:3000/account
//! ```
//!
//! `TOWER_EXAMPLE_LISTEN` sets the address (`127.0.0.1:0`: any free port); the first
//! line printed is `listening on http://ADDR`. A real deployment would read its file with
//! `throttle::config::load(path)`.

#![allow(clippy::print_stdout)] // an example prints where it listens

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Extension};
use axum::routing::get;
use axum::Router;
use throttle::layer::{Caller, LayerError, ThrottleLayer};

/// One public route and one that needs a key; every client address gets 2 requests a
/// minute (a token bucket: the third in a row is refused).
const CONFIG: &str = r#"
[limits.ip]
per_minute = 2

[tiers.free]
key = { per_minute = 100 }

[[routes]]
name = "hello"
path_prefix = "/hello"
upstreams = ["127.0.0.1:1"]   # required by the format; the axum app is the upstream
auth = "none"

[[routes]]
name = "account"
path_prefix = "/account"
upstreams = ["127.0.0.1:1"]
auth = "required"

[[keys]]
id = "key_demo"
key = "demo-key-123"
tenant = "acme"
tier = "free"
"#;

/// The app: two handlers behind the layer, which reads the client address from axum's
/// `ConnectInfo`.
fn app(config: throttle::config::Config) -> Result<Router, LayerError> {
    let throttle = ThrottleLayer::new(config)?
        .with_peer(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
    Ok(Router::new()
        .route("/hello", get(hello))
        .route("/account", get(account))
        .layer(throttle))
}

async fn hello(Extension(caller): Extension<Caller>) -> String {
    format!("hello, {}\n", caller.client_ip)
}

async fn account(Extension(caller): Extension<Caller>) -> String {
    let key = caller.key_id.as_deref().unwrap_or("-");
    let tenant = caller.tenant.as_deref().unwrap_or("-");
    format!("key {key} of tenant {tenant}\n")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = throttle::config::parse("tower_axum.toml", CONFIG)?;
    let listen = std::env::var("TOWER_EXAMPLE_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let app = app(config)?.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
