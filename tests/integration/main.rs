//! The one integration-test binary (every test binary links Pingora; CI has 2 cores).
//! Tests start the real `throttle` binary, a real echo upstream and talk HTTP on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test harness code

mod support;

mod accuracy;
mod differential;
mod fleet;
mod leases;
mod lua_scripts;

mod access_log;
mod adaptive;
mod admin;
mod admin_api;
mod admin_fuzz;
mod admin_usage;
mod bans;
mod bounds;
mod calendar;
mod cli;
mod client_ip_e2e;
mod concurrency;
mod console;
mod dashboards;
mod db;
mod edge;
mod edge_round2;
mod edge_round3;
mod events;
mod flood;
mod hardening;
mod health;
mod jwt;
mod lifetime;
mod listeners;
mod names;
mod one_caller;
mod one_edge;
mod one_rule;
mod outcomes;
mod proxy_e2e;
mod ratelimit_headers;
mod ready;
mod rediss;
mod regions;
mod regions_cluster;
mod regions_harness;
mod regions_store;
mod reload;
mod request_edge;
mod rls;
mod rls_conformance;
mod routes;
mod scopes;
mod seams;
mod sentinel_failover;
mod settle;
mod simulate;
mod tls;
mod top;
mod tower_layer;
mod traces;
mod transport;
mod truthful;
