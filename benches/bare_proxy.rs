//! A bare Pingora proxy (no Throttle code at all): the baseline of `benches/compare.sh`.
//!
//! `BARE_PROXY_LISTEN=127.0.0.1:8100 BARE_PROXY_UPSTREAM=127.0.0.1:8200 cargo bench --bench bare_proxy`
//! serves until killed; without those variables it prints how to run it and exits. With
//! `BARE_PROXY_REJECT=1` it answers every request itself with a fixed 429 (the same
//! headers and body size as Throttle's): Pingora's own floor for a rejection.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use pingora::prelude::HttpPeer;
use pingora::proxy::{ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;

/// The same allocator as the `throttle` binary, so the comparison is of the code.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Bare(SocketAddr, bool);

/// A 429 body of the size Throttle writes.
const BODY: &[u8] = br#"{"error":"rate_limit_exceeded","scope":"ip","limit":1,"current":2,"window":"1h","retry_after":3599.999,"message":"Rate limit exceeded: 1 requests per hour for this ip. Retry in 3600s."}"#;

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();
    fn new_ctx(&self) {}
    async fn request_filter(&self, session: &mut Session, _c: &mut ()) -> pingora::Result<bool> {
        if !self.1 {
            return Ok(false);
        }
        let mut resp = pingora::http::ResponseHeader::build(429, Some(8))?;
        resp.insert_header("content-type", "application/json")?;
        resp.insert_header("content-length", BODY.len())?;
        resp.insert_header("cache-control", "no-store")?;
        resp.insert_header("x-ratelimit-limit", "1")?;
        resp.insert_header("x-ratelimit-remaining", "0")?;
        resp.insert_header("x-ratelimit-reset", "1796070000")?;
        resp.insert_header("retry-after", "3600")?;
        session.write_response_header(Box::new(resp), false).await?;
        session
            .write_response_body(Some(bytes::Bytes::from_static(BODY)), true)
            .await?;
        Ok(true)
    }
    async fn upstream_peer(&self, _s: &mut Session, _c: &mut ()) -> pingora::Result<Box<HttpPeer>> {
        // The same peer settings as Throttle's routes (connect 1 s, read and write 30 s,
        // idle 60 s), so the comparison is of the code, not of the timeouts.
        let mut peer = HttpPeer::new(self.0, false, String::new());
        peer.options.connection_timeout = Some(Duration::from_secs(1));
        peer.options.read_timeout = Some(Duration::from_secs(30));
        peer.options.write_timeout = Some(Duration::from_secs(30));
        peer.options.idle_timeout = Some(Duration::from_secs(60));
        Ok(Box::new(peer))
    }
}

fn main() {
    let (Ok(listen), Ok(upstream)) = (
        std::env::var("BARE_PROXY_LISTEN"),
        std::env::var("BARE_PROXY_UPSTREAM"),
    ) else {
        println!("bare_proxy: set BARE_PROXY_LISTEN and BARE_PROXY_UPSTREAM to run it (benches/compare.sh does)");
        return;
    };
    let conf = ServerConf {
        threads: 1,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    let mut svc = pingora::proxy::http_proxy_service(
        &server.configuration,
        Bare(
            upstream.parse().unwrap(),
            std::env::var("BARE_PROXY_REJECT").is_ok(),
        ),
    );
    svc.add_tcp(&listen);
    server.add_service(svc);
    server.bootstrap();
    server.run_forever();
}
