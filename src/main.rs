//! The `throttle` CLI: argument parsing and process exit codes only; everything else is
//! the library.

#![allow(clippy::print_stdout, clippy::print_stderr)] // CLI output is the point here

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use throttle::config::{self, Config};
use throttle::db;
use throttle::server::{self, Extras};
use throttle::simulate::SimError;

/// mimalloc: cheaper per allocation than glibc's malloc on the request path (see
/// benches/compare.sh).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        /// Take over the listeners of the running gateway (zero-downtime upgrade; then send
        /// the old process SIGQUIT).
        #[arg(long)]
        upgrade: bool,
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
    /// Replay a trace (CSV) through a config's limits on simulated time; print what would
    /// be allowed and rejected, per scope and per tenant.
    Simulate {
        /// The candidate config.
        #[arg(long, env = "THROTTLE_CONFIG", default_value = "gateway.toml")]
        config: PathBuf,
        /// The trace: CSV with a header (time, ip, api_key or key_id, path, host, cost).
        #[arg(long)]
        trace: PathBuf,
        /// Print one JSON object instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Apply the database migrations (idempotent).
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Manage API keys stored in PostgreSQL.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(clap::Args)]
struct DbArgs {
    /// Database URL (else $THROTTLE_DATABASE_URL, else [database] url of --config).
    #[arg(long, env = "THROTTLE_DATABASE_URL", global = true)]
    database_url: Option<String>,
    /// Config file consulted for [database] url and the known tiers.
    #[arg(
        long,
        env = "THROTTLE_CONFIG",
        default_value = "gateway.toml",
        global = true
    )]
    config: PathBuf,
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create a key; prints it once (only its SHA-256 is stored). Creates the tenant if needed.
    Create {
        /// Tenant id.
        #[arg(long)]
        tenant: String,
        /// Tier name (must exist in the config's [tiers]).
        #[arg(long)]
        tier: String,
    },
    /// Revoke a key by id.
    Revoke {
        /// Key id (as `keys list` prints it).
        id: String,
    },
    /// List keys (never the keys themselves).
    List,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => run(&cli.config, false),
        Some(Command::Run { config, upgrade }) => run(&config, upgrade),
        Some(Command::Check { config }) => return check(&config),
        Some(Command::Demo { config }) => demo(&config),
        Some(Command::Simulate {
            config,
            trace,
            json,
        }) => return simulate(&config, &trace, json),
        Some(Command::Migrate { db }) => migrate(&db),
        Some(Command::Keys { command, db }) => keys(command, &db),
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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr);
    // THROTTLE_LOG_FORMAT=json: one JSON object per line, for log shippers.
    let _ = if std::env::var("THROTTLE_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

fn check(path: &Path) -> ExitCode {
    match config::load(path) {
        Ok(c) => {
            // Warnings go to stderr and do not fail the check.
            for w in c.warnings() {
                eprintln!("{w}");
            }
            println!(
                "{}: ok ({} routes, {} tiers, {} keys, {} blocks)",
                path.display(),
                c.routes.len(),
                c.tiers.len(),
                c.keys.len(),
                c.blocks.len()
            );
            if let Some(d) = &c.rls.descriptors {
                println!(
                    "{}: ok ({} rate-limit service domains)",
                    d.path.display(),
                    d.scopes.len()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// `throttle simulate`: exit 1 naming `FILE:LINE` for a config or trace error.
fn simulate(config: &Path, trace: &Path, json: bool) -> ExitCode {
    let config = match config::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let name = trace.display();
    let file = match std::fs::File::open(trace) {
        Ok(f) => std::io::BufReader::new(f),
        Err(e) => {
            eprintln!("{name}: cannot read: {e}");
            return ExitCode::FAILURE;
        }
    };
    match throttle::simulate::simulate(&config, file) {
        Ok(report) if json => match serde_json::to_string(&report) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("throttle: {e}");
                return ExitCode::FAILURE;
            }
        },
        Ok(report) => print!("{report}"),
        Err(SimError::Line { line, reason }) => {
            eprintln!("{name}:{line}: {reason}");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn run(path: &Path, upgrade: bool) -> anyhow::Result<()> {
    init_logging();
    // Tests and drills of calendar edges: the gateway's clock starts at this instant.
    if let Ok(v) = std::env::var("THROTTLE_CLOCK_START_MS") {
        let start: u64 = v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("THROTTLE_CLOCK_START_MS={v:?}: not Unix ms"))?;
        throttle::clock::start_at(start);
        tracing::warn!(
            start_ms = start,
            "THROTTLE_CLOCK_START_MS: the clock is moved (testing only)"
        );
    }
    let mut config = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    config::apply_env(&mut config);
    for w in config.warnings() {
        tracing::warn!("{w}");
    }
    if let Some(url) = &config.database_url {
        preflight(url)?;
    }
    serve(
        config,
        Extras {
            upgrade,
            ..Extras::default()
        },
    )
}

/// Refuses to start against an older schema; a database that is down is not fatal (the
/// gateway serves the TOML keys and reports degraded until it comes back).
fn preflight(url: &str) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let pool = match tokio::time::timeout(std::time::Duration::from_secs(3), db::connect(url)).await {
            Ok(Ok(pool)) => pool,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "database unreachable at start; serving the keys of gateway.toml");
                return Ok(());
            }
            Err(_) => {
                tracing::warn!("database did not answer within 3 s; serving the keys of gateway.toml");
                return Ok(());
            }
        };
        let checked = db::check_schema(&pool).await;
        pool.close().await;
        checked.map_err(|e| anyhow::anyhow!("{e}"))
    })
}

fn database_url(args: &DbArgs) -> anyhow::Result<(String, Option<Config>)> {
    let config = if args.config.exists() {
        Some(config::load(&args.config).map_err(|e| anyhow::anyhow!("{e}"))?)
    } else {
        None
    };
    let url = args
        .database_url
        .clone()
        .or_else(|| config.as_ref().and_then(|c| c.database_url.clone()))
        .context("no database URL: pass --database-url, set THROTTLE_DATABASE_URL or [database] url in the config")?;
    Ok((url, config))
}

fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

fn migrate(args: &DbArgs) -> anyhow::Result<()> {
    let (url, _) = database_url(args)?;
    block_on(async {
        let pool = db::connect(&url).await?;
        db::migrate(&pool).await?;
        println!(
            "migrations applied ({} in total)",
            db::MIGRATOR.iter().count()
        );
        Ok(())
    })
}

fn keys(command: KeysCommand, args: &DbArgs) -> anyhow::Result<()> {
    let (url, config) = database_url(args)?;
    block_on(async move {
        let pool = db::connect(&url).await?;
        db::check_schema(&pool).await?;
        match command {
            KeysCommand::Create { tenant, tier } => {
                // A tier is a [tiers.NAME] of the config or a rate_limit_policies row.
                match &config {
                    Some(c) => {
                        if let Some(known) = db::policies::unknown_tier(&pool, c, &tier).await? {
                            anyhow::bail!(
                                "unknown tier {tier:?} (tiers of {} and rate_limit_policies: {known:?})",
                                c.source
                            );
                        }
                    }
                    None => eprintln!(
                        "warning: no config found at {}; tier {tier:?} is not checked",
                        args.config.display()
                    ),
                }
                let k = db::keys::create(&pool, &tenant, &tier).await?;
                println!("key_id: {}", k.id);
                println!("api_key: {}", k.key);
                eprintln!(
                    "Store the api_key now: it is not shown again (only its SHA-256 is kept)."
                );
            }
            KeysCommand::Revoke { id } => {
                db::keys::revoke(&pool, &id).await?;
                println!("revoked {id}");
            }
            KeysCommand::List => {
                println!(
                    "{:<22} {:<16} {:<10} {:<10} {:<21} REVOKED",
                    "ID", "TENANT", "TIER", "PREFIX", "CREATED"
                );
                for k in db::keys::list(&pool).await? {
                    println!(
                        "{:<22} {:<16} {:<10} {:<10} {:<21} {}",
                        k.id,
                        k.tenant,
                        k.tier,
                        k.prefix,
                        k.created_at,
                        k.revoked_at.as_deref().unwrap_or("-")
                    );
                }
            }
        }
        Ok(())
    })
}

fn serve(config: Config, extras: Extras) -> anyhow::Result<()> {
    tracing::info!(listen = %config.server.listen, admin = %config.server.admin_listen, "throttle starting");
    server::run(config, extras)?;
    Ok(())
}

fn demo(path: &Path) -> anyhow::Result<()> {
    init_logging();
    let config = if path.exists() {
        config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?
    } else {
        config::parse("gateway.toml (shipped)", config::SHIPPED)
            .map_err(|e| anyhow::anyhow!("{e}"))?
    };
    let upstream =
        std::net::TcpListener::bind("127.0.0.1:0").context("binding the demo upstream")?;
    let addr = upstream.local_addr()?;
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
            ..Extras::default()
        },
    )
}
