//! `runner-agent`: parses flags, sets up logging to stderr and calls [`nexus_runner_agent::run`];
//! `runner-agent tools` prints what it would announce ([`nexus_runner_agent::describe_tools`]).
//!
//! It exits once `run` returns, whatever is still blocked: the runtime waits at most
//! [`EXIT_GRACE`] for its blocking threads (a tool stuck in the kernel never holds the process).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use nexus_runner_agent::config::{DEFAULT_SLOTS, DEFAULT_TOOL_TIMEOUT_MS};
use nexus_runner_agent::{AgentConfig, Credential, TlsOptions, default_state_dir};
use tracing_subscriber::EnvFilter;
use uuid::Uuid;

/// Serve this machine's tools to nexus: the built-ins (bash, files, edit, apply_patch, grep,
/// glob, processes, web_fetch when enabled) and a tools file's commands and MCP servers.
#[derive(Debug, Parser)]
#[command(name = "runner-agent", version, subcommand_negates_reqs = true)]
struct Cli {
    /// The nexus gRPC endpoint, e.g. http://127.0.0.1:7300, or https://HOST:PORT with --tls-ca.
    /// Several nodes of one cluster: repeat the flag or separate URLs with commas (at most 16);
    /// the agent moves to the next when its node goes away.
    #[arg(long, env = "NEXUS_RUNNER_NEXUS", required = true, value_delimiter = ',')]
    nexus: Vec<String>,
    /// This runner's executor public id.
    #[arg(long, env = "NEXUS_RUNNER_ID", required = true)]
    runner_id: Option<Uuid>,
    /// File holding the transport token (surrounding whitespace is ignored).
    #[arg(long, env = "NEXUS_RUNNER_TOKEN_FILE", required = true)]
    token_file: Option<PathBuf>,
    /// Directory the tools run in; file tools cannot leave it.
    #[arg(long, env = "NEXUS_RUNNER_WORKDIR", required = true)]
    workdir: Option<PathBuf>,
    /// A tools file (TOML) of command tools, MCP servers and built-in settings; read again on
    /// SIGHUP and when it changes (docs/runner-tools.md).
    #[arg(long, env = "NEXUS_RUNNER_TOOLS_FILE")]
    tools_file: Option<PathBuf>,
    /// Where the claim journal lives; one runner-agent at a time holds it (a second one stops at
    /// once) [default: $XDG_STATE_HOME/nexus-runner-agent/RUNNER_ID, else
    /// $HOME/.local/state/nexus-runner-agent/RUNNER_ID, else under the temp dir].
    #[arg(long, env = "NEXUS_RUNNER_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// How many tools run at once.
    #[arg(long, env = "NEXUS_RUNNER_SLOTS", default_value_t = DEFAULT_SLOTS)]
    slots: usize,
    /// The timeout announced for bash, in milliseconds.
    #[arg(long, env = "NEXUS_RUNNER_TOOL_TIMEOUT_MS", default_value_t = DEFAULT_TOOL_TIMEOUT_MS)]
    tool_timeout_ms: u64,
    /// CA certificates (PEM) that nexus's certificate must chain to; required for https://.
    /// Platform roots are not trusted implicitly: for a publicly signed nexus pass the system
    /// bundle, e.g. /etc/ssl/certs/ca-certificates.crt.
    #[arg(long, env = "NEXUS_RUNNER_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// This runner's certificate chain (PEM) for mutual TLS; needs --tls-key.
    #[arg(long, env = "NEXUS_RUNNER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// This runner's private key (PEM: PKCS#8, PKCS#1 or SEC1); needs --tls-cert.
    #[arg(long, env = "NEXUS_RUNNER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The name nexus's certificate must carry, when it is not the URL's host.
    #[arg(long, env = "NEXUS_RUNNER_TLS_SERVER_NAME")]
    tls_server_name: Option<String>,
    /// Bound on opening the connection to nexus (TCP and HTTP/2), in milliseconds.
    #[arg(long, env = "NEXUS_RUNNER_CONNECT_TIMEOUT_MS", default_value_t = 10_000)]
    connect_timeout_ms: u64,
    /// Bound on nexus answering the hello on a new stream, in milliseconds.
    #[arg(long, env = "NEXUS_RUNNER_HANDSHAKE_TIMEOUT_MS", default_value_t = 10_000)]
    handshake_timeout_ms: u64,
    /// How long the stream may stay silent (no frame, not even a ping) before the agent takes
    /// its node for gone and moves on, in milliseconds; never below three of nexus's ping
    /// intervals. Lower it to fail over faster between several nodes.
    #[arg(long, env = "NEXUS_RUNNER_LIVENESS_TIMEOUT_MS", default_value_t = 45_000)]
    liveness_timeout_ms: u64,
    /// A directory of skills: each NAME/SKILL.md is announced as a document, and `skill {name}`
    /// returns its content. Read again at every connect.
    #[arg(long, env = "NEXUS_RUNNER_SKILLS_DIR")]
    skills_dir: Option<PathBuf>,
    /// Log filter (a level such as info or debug, or a tracing directive).
    #[arg(long, env = "NEXUS_RUNNER_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the tools this runner would announce (JSON: name, timeout_ms, max_concurrency,
    /// effect_profile, description) and exit; a bad tools file is printed and exits 1. The tools
    /// file's MCP servers are started and listed (up to 15 s), then stopped.
    Tools {
        /// The tools file to read.
        #[arg(long, env = "NEXUS_RUNNER_TOOLS_FILE")]
        tools_file: Option<PathBuf>,
        /// The workdir [default: the current directory].
        #[arg(long, env = "NEXUS_RUNNER_WORKDIR")]
        workdir: Option<PathBuf>,
        /// A directory of skills (announces `skill`).
        #[arg(long, env = "NEXUS_RUNNER_SKILLS_DIR")]
        skills_dir: Option<PathBuf>,
        /// The timeout announced for bash, in milliseconds.
        #[arg(long, env = "NEXUS_RUNNER_TOOL_TIMEOUT_MS", default_value_t = DEFAULT_TOOL_TIMEOUT_MS)]
        tool_timeout_ms: u64,
    },
}

/// After `run` returns, how long the runtime may wait for its blocking threads before the process
/// exits anyway.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// Runs the agent; a failure prints `error: ` and its causes on one line (never a backtrace,
/// whatever `RUST_BACKTRACE` says) and exits 1.
fn main() -> std::process::ExitCode {
    let outcome = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => {
            let outcome = runtime.block_on(serve());
            runtime.shutdown_timeout(EXIT_GRACE);
            outcome
        }
        Err(error) => Err(anyhow::Error::new(error).context("cannot start tokio")),
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", nexus_proto::error::one_line(error.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `runner-agent tools`: the announced tool list as pretty JSON on stdout.
async fn print_tools(
    tools_file: Option<PathBuf>,
    workdir: Option<PathBuf>,
    skills_dir: Option<PathBuf>,
    tool_timeout_ms: u64,
) -> anyhow::Result<()> {
    let workdir = match workdir {
        Some(dir) => dir,
        None => std::env::current_dir().context("cannot read the current directory; pass --workdir")?,
    };
    // The MCP servers' failures (with the end of their stderr) are warnings on stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(EnvFilter::new("warn"))
        .init();
    let listed =
        nexus_runner_agent::describe_tools(&workdir, tool_timeout_ms, skills_dir.as_deref(), tools_file.as_deref())
            .await?;
    println!("{}", serde_json::to_string_pretty(&listed.tools)?);
    for tool in &listed.mcp_held_back {
        eprintln!(
            "warning: the MCP tool {tool} has the name of another tool and is not served; rename one, or give its server another prefix"
        );
    }
    for server in &listed.mcp_not_listed {
        eprintln!(
            "warning: the MCP server {server} failed or did not list its tools within {} s; its tools are missing above (the reason is logged above)",
            nexus_runner_agent::MCP_LIST_WAIT.as_secs()
        );
    }
    Ok(())
}

async fn serve() -> anyhow::Result<()> {
    nexus_runner_agent::install_crypto_provider();
    let cli = Cli::parse();
    if let Some(Command::Tools { tools_file, workdir, skills_dir, tool_timeout_ms }) = cli.command {
        return print_tools(tools_file, workdir, skills_dir, tool_timeout_ms).await;
    }
    let required = |what: &str| anyhow::anyhow!("--{what} is required");
    if cli.nexus.is_empty() {
        return Err(required("nexus"));
    }
    let runner_id = cli.runner_id.ok_or_else(|| required("runner-id"))?;
    let token_file = cli.token_file.ok_or_else(|| required("token-file"))?;
    let workdir = cli.workdir.ok_or_else(|| required("workdir"))?;
    let filter = EnvFilter::try_new(&cli.log).with_context(|| format!("invalid --log {:?}", cli.log))?;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        .init();

    let credential = Credential::from_file(&token_file)?;
    let urls = cli.nexus.iter().map(|url| url.trim().to_owned()).collect();
    let mut config = AgentConfig::with_urls(urls, runner_id, credential, workdir);
    config.state_dir = cli.state_dir.unwrap_or_else(|| default_state_dir(runner_id));
    config.slots = cli.slots;
    config.tool_timeout_ms = cli.tool_timeout_ms;
    config.connect_timeout = Duration::from_millis(cli.connect_timeout_ms);
    config.handshake_timeout = Duration::from_millis(cli.handshake_timeout_ms);
    config.liveness_timeout = Duration::from_millis(cli.liveness_timeout_ms);
    config.tls = TlsOptions { ca: cli.tls_ca, cert: cli.tls_cert, key: cli.tls_key, server_name: cli.tls_server_name };
    config.skills_dir = cli.skills_dir;
    config.tools_file = cli.tools_file;

    nexus_runner_agent::run(config, shutdown_signal()).await.inspect_err(|err| {
        tracing::error!(error = %err, "runner-agent stopped");
    })?;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot listen for sigterm");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
