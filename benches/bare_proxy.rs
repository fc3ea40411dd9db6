//! A bare Pingora proxy (no Throttle code at all): the baseline of `benches/compare.sh`.
//!
//! `BARE_PROXY_LISTEN=127.0.0.1:8100 BARE_PROXY_UPSTREAM=127.0.0.1:8200 cargo bench --bench bare_proxy`
//! serves until killed; without those variables it prints how to run it and exits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::net::SocketAddr;

use async_trait::async_trait;
use pingora::prelude::HttpPeer;
use pingora::proxy::{ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;

struct Bare(SocketAddr);

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();
    fn new_ctx(&self) {}
    async fn upstream_peer(&self, _s: &mut Session, _c: &mut ()) -> pingora::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.0, false, String::new())))
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
    let mut svc =
        pingora::proxy::http_proxy_service(&server.configuration, Bare(upstream.parse().unwrap()));
    svc.add_tcp(&listen);
    server.add_service(svc);
    server.bootstrap();
    server.run_forever();
}
