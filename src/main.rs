//! The `throttle` CLI: argument parsing and process exit codes only; everything else is
//! the library.

#![allow(clippy::print_stdout, clippy::print_stderr)] // CLI output is the point here

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use throttle::config::{self, Config};
use throttle::server::{self, Extras};

/// Throttle: an edge gateway for public HTTP APIs.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Config file (used when no subcommand is given: `run`).
    #[arg(long, env = "THROTTLE_CONFIG", default_value = "gateway.toml")]
    config: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Start the gateway (the default).
    Run {
        /// Config file.
        #[arg(long, env = "THROTTLE_CONFIG", default_value = "gateway.toml")]
        config: PathBuf,
    },
    /// Validate a config file; errors print as FILE:LINE:COL: message.
    Check {
        /// Config file.
        #[arg(long, env = "THROTTLE_CONFIG", default_value = "gateway.toml")]
        config: PathBuf,
    },
    /// Run the gateway from the shipped config with an in-process demo upstream.
    Demo {
        /// Config file (falls back to the shipped gateway.toml when absent).
        #[arg(long, default_value = "gateway.toml")]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => run(&cli.config),
        Some(Command::Run { config }) => run(&config),
        Some(Command::Check { config }) => return check(&config),
        Some(Command::Demo { config }) => demo(&config),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("throttle: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}

fn check(path: &Path) -> ExitCode {
    match config::load(path) {
        Ok(c) => {
            println!(
                "{}: ok ({} routes, {} tiers, {} keys, {} blocks)",
                path.display(),
                c.routes.len(),
                c.tiers.len(),
                c.keys.len(),
                c.blocks.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(path: &Path) -> anyhow::Result<()> {
    init_logging();
    let config = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    serve(config, Extras::default())
}

fn serve(config: Config, extras: Extras) -> anyhow::Result<()> {
    tracing::info!(listen = %config.server.listen, admin = %config.server.admin_listen, "throttle starting");
    let (mut server, _shared) = server::build(config, extras)?;
    server.bootstrap();
    server.run_forever()
}

fn demo(path: &Path) -> anyhow::Result<()> {
    init_logging();
    let mut config = if path.exists() {
        config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?
    } else {
        config::parse("gateway.toml (shipped)", config::SHIPPED)
            .map_err(|e| anyhow::anyhow!("{e}"))?
    };
    let upstream =
        std::net::TcpListener::bind("127.0.0.1:0").context("binding the demo upstream")?;
    let addr = upstream.local_addr()?;
    for route in &mut config.routes {
        route.upstreams = vec![addr];
    }
    let listen = config.server.listen;
    println!(
        "throttle demo: gateway on http://{listen}, admin on http://{}, demo upstream on {addr}",
        config.server.admin_listen
    );
    println!("  curl -i -H 'Authorization: Bearer demo-key-123' http://{listen}/v1/hello   # 200, then 429 after 5 in a second");
    println!("  curl -i http://{listen}/public/hello                                      # no key needed");
    serve(
        config,
        Extras {
            demo_upstream: Some(upstream),
        },
    )
}
