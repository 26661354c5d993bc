//! The `nexus` binary: parses flags, sets up tracing and calls the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use nexus_actors::admin::{MemberKind, create_member, create_runner};
use nexus_actors::config::ServerConfig;
use nexus_actors::quickstart::{QuickstartOptions, run as quickstart};
use nexus_actors::store::Store;

/// nexus: hosts Agent profiles and runs their executions over a fabric of runners.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `info` or `nexus_actors=debug`.
    #[arg(long, env = "NEXUS_LOG", global = true)]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve gRPC and the HTTP/JSON doors on one port.
    Serve {
        /// A TOML config file (see README, "Configuration").
        #[arg(long, env = "NEXUS_CONFIG")]
        config: Option<PathBuf>,
        /// Where the embedded SQLite store lives (overrides the file).
        #[arg(long, env = "NEXUS_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// The address to listen on.
        #[arg(long, env = "NEXUS_LISTEN", default_value = "127.0.0.1:7740")]
        listen: SocketAddr,
    },
    /// Mint credentials.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Run the main job on this machine: nexus, a runner-agent on the current directory, and one
    /// question answered end to end.
    Quickstart {
        /// The runner-agent binary (default: next to nexus, built with cargo when missing).
        #[arg(long, env = "NEXUS_RUNNER_AGENT")]
        runner_agent: Option<PathBuf>,
        /// A script for the scripted model instead of deploy/quickstart/script.json.
        #[arg(long)]
        script: Option<PathBuf>,
        /// A real model (`provider/model`, e.g. openrouter/z-ai/glm-5.3); needs the provider's key.
        #[arg(long, env = "NEXUS_MODEL")]
        model: Option<String>,
        /// Keep the temporary data dir.
        #[arg(long)]
        keep_data: bool,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
    },
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Members (agents and humans).
    Member {
        #[command(subcommand)]
        command: MemberCommand,
    },
    /// Runners (executor addresses).
    Runner {
        #[command(subcommand)]
        command: RunnerCommand,
    },
}

#[derive(Debug, Subcommand)]
enum MemberCommand {
    /// Create a member; prints {public_id, kind, handle, token}.
    Create {
        #[arg(long, env = "NEXUS_DATA_DIR")]
        data_dir: PathBuf,
        #[arg(long, value_enum)]
        kind: Kind,
        /// [a-z0-9][a-z0-9_-]{1,31}
        #[arg(long)]
        handle: String,
    },
}

#[derive(Debug, Subcommand)]
enum RunnerCommand {
    /// Create a runner; prints {runner_executor_public_id, name, token}.
    Create {
        #[arg(long, env = "NEXUS_DATA_DIR")]
        data_dir: PathBuf,
        /// Display name, 1 to 100 characters.
        #[arg(long)]
        name: String,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Kind {
    Agent,
    Human,
}

/// Opens the store of an existing data dir: a typo must not mint credentials into a new, empty
/// store that no server reads.
async fn open_existing(data_dir: &std::path::Path) -> anyhow::Result<Store> {
    if !data_dir.join("nexus.db").is_file() {
        anyhow::bail!(
            "no nexus store in {}; start `nexus serve --data-dir {}` once to create it",
            data_dir.display(),
            data_dir.display()
        );
    }
    Ok(Store::open(data_dir).await?)
}

fn init_tracing(filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config, data_dir, listen } => {
            init_tracing(cli.log.as_deref().unwrap_or("info"));
            let mut config = ServerConfig::load(config.as_deref())?;
            if let Some(dir) = data_dir {
                config.data_dir = dir;
            }
            let listener =
                tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
            // SIGINT from a terminal, SIGTERM from systemd or a container runtime.
            let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            let shutdown = async move {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            };
            nexus_actors::serve(listener, config, shutdown).await?;
        }
        Command::Admin { command } => {
            init_tracing(cli.log.as_deref().unwrap_or("warn"));
            let output = match command {
                AdminCommand::Member { command: MemberCommand::Create { data_dir, kind, handle } } => {
                    let store = open_existing(&data_dir).await?;
                    let kind = match kind {
                        Kind::Agent => MemberKind::Agent,
                        Kind::Human => MemberKind::Human,
                    };
                    create_member(&store, kind, &handle).await
                }
                AdminCommand::Runner { command: RunnerCommand::Create { data_dir, name } } => {
                    let store = open_existing(&data_dir).await?;
                    create_runner(&store, &name).await
                }
            };
            match output {
                Ok(value) => {
                    // A closed stdout must not panic after the credential was minted.
                    let mut out = std::io::stdout().lock();
                    std::io::Write::write_all(
                        &mut out,
                        format!("{}\n", serde_json::to_string_pretty(&value)?).as_bytes(),
                    )
                    .context("cannot print the minted credential")?;
                }
                Err(refusal) => anyhow::bail!("{}: {}", refusal.code, refusal.message),
            }
        }
        Command::Quickstart { runner_agent, script, model, keep_data, timeout_secs } => {
            init_tracing(cli.log.as_deref().unwrap_or("warn"));
            let options = QuickstartOptions {
                workdir: std::env::current_dir()?,
                runner_agent,
                script,
                model,
                keep_data,
                timeout: Duration::from_secs(timeout_secs),
            };
            quickstart(options).await?;
        }
    }
    Ok(())
}
