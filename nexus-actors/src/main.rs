//! The `nexus` binary: parses flags, sets up tracing and calls the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use nexus_actors::cli::admin::{MemberKind, create_member, create_runner};
use nexus_actors::cli::quickstart::{QuickstartOptions, run as quickstart};
use nexus_actors::config::{ServerConfig, StoreConfig};
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
        /// The data dir: the embedded SQLite store and the lock file (overrides the file).
        #[arg(long, env = "NEXUS_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// A `postgres://` URL: the store is that PostgreSQL database instead of SQLite in the
        /// data dir (overrides store.database_url).
        #[arg(long, env = "NEXUS_DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
        /// The address to listen on.
        #[arg(long, env = "NEXUS_LISTEN", default_value = "127.0.0.1:7740")]
        listen: SocketAddr,
        /// The address other machines reach this node at, HOST:PORT, as the cluster listing
        /// shows it (overrides cluster.advertise_address; default: the listen address).
        #[arg(long, env = "NEXUS_ADVERTISE_ADDRESS")]
        advertise_address: Option<String>,
        /// Most connections open at once (overrides connections.max_connections; default: 3/4 of
        /// `ulimit -n`).
        #[arg(long, env = "NEXUS_MAX_CONNECTIONS")]
        max_connections: Option<u32>,
        /// The server's TLS certificate chain, PEM (overrides tls.cert; needs --tls-key).
        #[arg(long, env = "NEXUS_TLS_CERT")]
        tls_cert: Option<PathBuf>,
        /// The server's TLS private key, PEM (overrides tls.key).
        #[arg(long, env = "NEXUS_TLS_KEY")]
        tls_key: Option<PathBuf>,
        /// CA certificates, PEM, that client certificates must chain to (overrides
        /// tls.client_ca; the file's tls.client_auth says who must present one).
        #[arg(long, env = "NEXUS_TLS_CLIENT_CA")]
        tls_client_ca: Option<PathBuf>,
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
    #[command(flatten)]
    People(nexus_actors::cli::people::PeopleCommand),
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
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long, value_enum)]
        kind: Kind,
        /// [a-z0-9][a-z0-9_-]{1,31}
        #[arg(long)]
        handle: String,
    },
    /// Suspend an Agent: it keeps its credentials, but its declaration doors answer 403
    /// not_authorized. Prints {public_id, status}.
    Suspend {
        #[command(flatten)]
        store: StoreArgs,
        /// The member's UUID.
        #[arg(long)]
        member_id: nexus_proto::MemberId,
    },
    /// Reinstate a suspended member. Prints {public_id, status}.
    Reinstate {
        #[command(flatten)]
        store: StoreArgs,
        /// The member's UUID.
        #[arg(long)]
        member_id: nexus_proto::MemberId,
    },
    /// Make a Human the steward (posts inputs, approves, controls) or viewer (reads) of an Agent;
    /// a repeat replaces the role. Prints {agent_public_id, human_public_id, role, previous_role}.
    Grant {
        #[command(flatten)]
        store: StoreArgs,
        /// The Human member's UUID.
        #[arg(long)]
        human: nexus_proto::MemberId,
        /// The Agent member's UUID.
        #[arg(long)]
        agent: nexus_proto::MemberId,
        #[arg(long, value_enum)]
        role: Role,
    },
    /// Take back a Human's grant on an Agent; its next request is judged without it. Prints
    /// {agent_public_id, human_public_id, revoked_role}.
    Revoke {
        #[command(flatten)]
        store: StoreArgs,
        /// The Human member's UUID.
        #[arg(long)]
        human: nexus_proto::MemberId,
        /// The Agent member's UUID.
        #[arg(long)]
        agent: nexus_proto::MemberId,
    },
}

#[derive(Debug, Subcommand)]
enum RunnerCommand {
    /// Create a runner; prints {runner_executor_public_id, name, token, assignment_scope,
    /// assigned_agent_public_ids}. Say whom it serves: --assign AGENT_ID or --account-wide.
    Create {
        #[command(flatten)]
        store: StoreArgs,
        /// Display name, 1 to 100 characters.
        #[arg(long)]
        name: String,
        /// An Agent this runner serves (repeatable); it serves no one else (scope user_private).
        #[arg(long = "assign", value_name = "AGENT_ID")]
        assign: Vec<nexus_proto::MemberId>,
        /// Every Agent of this nexus may use the runner (scope account_wide).
        #[arg(long)]
        account_wide: bool,
    },
    /// Let one more Agent use an assigned runner. Prints {runner_executor_public_id,
    /// assignment_scope, assigned_agent_public_ids}.
    Assign {
        #[command(flatten)]
        store: StoreArgs,
        /// The runner's UUID.
        #[arg(long, visible_alias = "runner-id")]
        runner: nexus_proto::RunnerId,
        /// The Agent's UUID.
        #[arg(long, visible_alias = "agent-id")]
        agent: nexus_proto::MemberId,
    },
    /// Take an Agent off an assigned runner: it no longer sees, selects or sends work to it.
    /// Prints {runner_executor_public_id, assignment_scope, assigned_agent_public_ids}.
    Unassign {
        #[command(flatten)]
        store: StoreArgs,
        /// The runner's UUID.
        #[arg(long, visible_alias = "runner-id")]
        runner: nexus_proto::RunnerId,
        /// The Agent's UUID.
        #[arg(long, visible_alias = "agent-id")]
        agent: nexus_proto::MemberId,
    },
    /// Pair an active runner again: a new token under a new credential epoch; the old token, its
    /// stream and its claims are fenced. Prints {runner_executor_public_id, credential_epoch, token}.
    Repair {
        #[command(flatten)]
        store: StoreArgs,
        /// The runner's UUID.
        #[arg(long)]
        runner_id: nexus_proto::RunnerId,
    },
    /// Revoke a runner for good: no new claims or dispatch, and `repair` refuses it (create a new
    /// runner instead). Prints {runner_executor_public_id, status}.
    Revoke {
        #[command(flatten)]
        store: StoreArgs,
        /// The runner's UUID.
        #[arg(long)]
        runner_id: nexus_proto::RunnerId,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Kind {
    Agent,
    Human,
}

/// A grant's role (`nexus_proto::GrantRole`).
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Role {
    Steward,
    Viewer,
}

/// The store `nexus admin` writes to: the server's data dir, or its PostgreSQL database.
#[derive(Debug, clap::Args)]
struct StoreArgs {
    /// The data dir of a nexus whose store is SQLite.
    #[arg(long, env = "NEXUS_DATA_DIR", required_unless_present = "database_url")]
    data_dir: Option<PathBuf>,
    /// The `postgres://` URL of a nexus whose store is PostgreSQL.
    #[arg(long, env = "NEXUS_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
}

/// Opens an existing store: a typo must not mint credentials into a new, empty store that no
/// server reads.
async fn open_existing(args: StoreArgs) -> anyhow::Result<Store> {
    let store = StoreConfig { database_url: args.database_url, ..StoreConfig::default() };
    let data_dir = args.data_dir.unwrap_or_default();
    Ok(Store::connect_existing(&data_dir, &store).await?)
}

fn init_tracing(filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Runs the command; a failure prints `error: ` and its chain of causes on one line (never a
/// backtrace, whatever `RUST_BACKTRACE` says: the message is what to fix) and exits 1.
fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", nexus_proto::error::one_line(error.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    nexus_actors::install_crypto_provider();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            config,
            data_dir,
            database_url,
            listen,
            advertise_address,
            max_connections,
            tls_cert,
            tls_key,
            tls_client_ca,
        } => {
            init_tracing(cli.log.as_deref().unwrap_or("info"));
            let mut config = ServerConfig::load(config.as_deref())?;
            if let Some(dir) = data_dir {
                config.data_dir = dir;
            }
            if let Some(url) = database_url {
                config.store.database_url = Some(url);
            }
            if let Some(max) = max_connections {
                config.connections.max_connections = Some(max);
            }
            if let Some(address) = advertise_address {
                config.cluster.advertise_address = Some(address);
            }
            config.tls.cert = tls_cert.or(config.tls.cert);
            config.tls.key = tls_key.or(config.tls.key);
            config.tls.client_ca = tls_client_ca.or(config.tls.client_ca);
            config.validate()?;
            let listener = nexus_actors::listen(listen).with_context(|| format!("cannot listen on {listen}"))?;
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
                AdminCommand::Member { command: MemberCommand::Create { store, kind, handle } } => {
                    let store = open_existing(store).await?;
                    let kind = match kind {
                        Kind::Agent => MemberKind::Agent,
                        Kind::Human => MemberKind::Human,
                    };
                    create_member(&store, kind, &handle).await
                }
                AdminCommand::Runner { command: RunnerCommand::Create { store, name, assign, account_wide } } => {
                    match nexus_actors::cli::admin::assignment_from_flags(assign, account_wide) {
                        Ok(assignment) => {
                            let store = open_existing(store).await?;
                            create_runner(&store, &name, &assignment).await
                        }
                        Err(refusal) => Err(refusal),
                    }
                }
                AdminCommand::Runner { command: RunnerCommand::Assign { store, runner, agent } } => {
                    let store = open_existing(store).await?;
                    nexus_actors::cli::admin::assign_runner(&store, runner, agent).await
                }
                AdminCommand::Runner { command: RunnerCommand::Unassign { store, runner, agent } } => {
                    let store = open_existing(store).await?;
                    nexus_actors::cli::admin::unassign_runner(&store, runner, agent).await
                }
                AdminCommand::Member { command: MemberCommand::Suspend { store, member_id } } => {
                    let store = open_existing(store).await?;
                    nexus_actors::cli::admin::set_member_status(&store, member_id, nexus_proto::MemberStatus::Suspended)
                        .await
                }
                AdminCommand::Member { command: MemberCommand::Reinstate { store, member_id } } => {
                    let store = open_existing(store).await?;
                    nexus_actors::cli::admin::set_member_status(&store, member_id, nexus_proto::MemberStatus::Active)
                        .await
                }
                AdminCommand::Member { command: MemberCommand::Grant { store, human, agent, role } } => {
                    let store = open_existing(store).await?;
                    let role = match role {
                        Role::Steward => nexus_proto::GrantRole::Steward,
                        Role::Viewer => nexus_proto::GrantRole::Viewer,
                    };
                    nexus_actors::cli::admin::grants::grant(&store, human, agent, role).await
                }
                AdminCommand::Member { command: MemberCommand::Revoke { store, human, agent } } => {
                    let store = open_existing(store).await?;
                    nexus_actors::cli::admin::grants::revoke(&store, human, agent).await
                }
                AdminCommand::Runner { command: RunnerCommand::Repair { store, runner_id } } => {
                    let store = open_existing(store).await?;
                    nexus_actors::cli::admin::repair_runner(&store, runner_id).await
                }
                AdminCommand::Runner { command: RunnerCommand::Revoke { store, runner_id } } => {
                    let store = open_existing(store).await?;
                    nexus_actors::cli::admin::revoke_runner(&store, runner_id).await
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
        Command::People(command) => {
            init_tracing(cli.log.as_deref().unwrap_or("warn"));
            let code = nexus_actors::cli::people::run(command).await;
            if code != 0 {
                std::process::exit(code);
            }
        }
    }
    Ok(())
}
