//! `nexus-runner-agent`: the worker daemon that serves environment-local tools to nexus.
//!
//! Owns: the runner side of `nexus.runner.v1.RunnerService/Connect` — hello, announce, claim,
//! run, extend, commit, progress, pong — with reconnect and backoff; the claim journal that makes
//! a result survive a disconnect or restart and keeps a claimed tool from ever running twice; and
//! the built-in tools (`bash`, `read_file`, `write_file`, `list_dir`, `edit`, `apply_patch`,
//! `grep`, `glob`, the `process_*` tools, and `web_fetch` when configured), confined to one
//! workdir, each bounded in time and memory and leaving no process behind beyond what
//! `process_start` holds until the agent stops (`docs/runner-tools.md`); and the tools file
//! ([`toolsfile`]): command tools run like `bash`, MCP servers bridged through rmcp, per-tool
//! `max_concurrency`, read again on SIGHUP and when it changes, and announced again without a
//! restart.
//!
//! Does not own: any server state. nexus decides what is dispatched, who may claim it, and how
//! a task settles; this crate only follows the protocol in `docs/protocol.md`.
//!
//! Main types: [`AgentConfig`] (every knob, with defaults), [`run`] (the daemon, also called
//! in-process by tests), [`describe_tools`] (what `runner-agent tools` prints),
//! [`journal::Journal`] (the on-disk claim journal), [`claim::ClaimHandle`] (extend, claim status
//! and progress for a running tool) and [`toolsfile::ToolsFileError`] (a refused tools file, with
//! its line, column and field).

mod agent;
pub mod claim;
pub mod config;
mod error;
pub mod journal;
mod mcp;
mod retry;
mod tools;
pub mod toolsfile;

use std::future::Future;
use std::path::Path;

use tracing::Instrument;

/// Doors for the integration tests in `nexus-tests`; not an API, and it changes with the crate.
#[doc(hidden)]
pub mod testing {
    pub use crate::mcp::testing as mcp;
}

pub use crate::config::{AgentConfig, ConfigError, Credential, TlsOptions, default_state_dir};
pub use crate::error::AgentError;

/// Runs the agent until `shutdown` resolves.
///
/// Reads `config.tools_file` when set, connects to the first of `config.nexus_urls` (moving on to the next when a stream drops), says hello, announces its
/// tools (the built-ins and the tools file's; again whenever the file changes), then claims and runs
/// the tool calls nexus hints at, at most `config.slots` at a time, committing each result after
/// journaling it. Any stream failure reconnects with jittered exponential backoff (no attempt
/// limit) and re-sends unacknowledged results. When `shutdown` resolves, running tools are killed,
/// their results journaled and (if connected) committed, bounded by `config.shutdown_grace`; then
/// it returns `Ok(())`.
///
/// # Errors
/// [`AgentError::Config`] or [`AgentError::Journal`] before anything starts (an unreadable or
/// invalid TLS file is [`ConfigError::TlsFile`], naming it; a refused tools file is
/// [`ConfigError::ToolsFile`], naming its line and field; a state dir that another runner-agent
/// holds is [`journal::JournalError::InUse`]), [`AgentError::Refused`] when nexus
/// refuses the hello with a final word such as `unauthorized`, and [`AgentError::Tls`] when TLS
/// with nexus fails for a reason retrying cannot mend (an untrusted server certificate, a refused
/// or missing client certificate).
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    install_crypto_provider();
    let span = tracing::info_span!("runner", runner_id = %config.runner_id);
    let agent = span.in_scope(|| agent::Agent::new(config))?;
    agent.run(shutdown).instrument(span).await
}

/// The tool list this runner would announce with these settings, as `runner-agent tools` prints
/// it: a JSON array, one object per tool in announcement order, each
/// `{name, timeout_ms, max_concurrency (null: no bound but the slots), effect_profile,
/// description (null for `skill`)}`. Connects to no nexus and runs no tool; the tools file's MCP
/// servers are started, listed and stopped (a server not listed within [`MCP_LIST_WAIT`] is
/// named in [`ToolList::mcp_not_listed`] and its tools are missing).
///
/// `workdir` must be a directory; `tool_timeout_ms` is bash's announced timeout (1..=604800000).
///
/// # Errors
/// [`ConfigError::Workdir`], [`ConfigError::SkillsDir`], [`ConfigError::Invalid`] for the
/// timeout, and [`ConfigError::ToolsFile`] naming the file's line, column and field.
pub async fn describe_tools(
    workdir: &Path,
    tool_timeout_ms: u64,
    skills_dir: Option<&Path>,
    tools_file: Option<&Path>,
) -> Result<ToolList, ConfigError> {
    if !(1..=config::MAX_TOOL_TIMEOUT_MS).contains(&tool_timeout_ms) {
        return Err(ConfigError::Invalid { field: "tool_timeout_ms", reason: "must be between 1 and 604800000" });
    }
    let workdir_error = |reason: String| ConfigError::Workdir { path: workdir.to_owned(), reason };
    let canonical = workdir.canonicalize().map_err(|err| workdir_error(err.to_string()))?;
    if !canonical.is_dir() {
        return Err(workdir_error("not a directory".to_owned()));
    }
    if let Some(dir) = skills_dir
        && !dir.is_dir()
    {
        return Err(ConfigError::SkillsDir { path: dir.to_owned(), reason: "not a directory".to_owned() });
    }
    let owner = tools::reap::Owner::of_state_dir(&canonical);
    let toolbox =
        tools::Toolbox::new(canonical, tool_timeout_ms, owner).with_skills_dir(skills_dir.map(Path::to_owned));
    if let Some(path) = tools_file {
        let (file, _) = toolsfile::load(path)?;
        toolbox
            .replace_tools_file(file)
            .map_err(|err| ConfigError::ToolsFile { source: toolsfile::ToolsFileError::of_catalog(path, &err) })?;
    }
    let servers = toolbox.tools_file().mcp_servers.clone();
    let mut mcp_not_listed = Vec::new();
    let mut mcp_held_back = Vec::new();
    if !servers.is_empty() {
        let hub = mcp::McpHub::start(servers, toolbox.workdir().clone(), toolbox.owner().clone(), Default::default());
        // Each server lists its tools or fails once (a crash, a refused connection), or the
        // wait ends; a failed one is not waited for while it backs off.
        let deadline = tokio::time::Instant::now() + MCP_LIST_WAIT;
        while !hub.starting().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(MCP_LIST_POLL).await;
        }
        mcp_not_listed = hub.not_listed();
        // As the daemon serves them: an MCP tool whose name another tool has is held back alone.
        let taken = toolbox.set_extra_tools_holding_back(mcp::extra_tools(&hub));
        if let Ok(held_back) = &taken {
            mcp_held_back.clone_from(held_back);
        }
        if let Err(err) = taken {
            hub.shutdown().await;
            let source = tools_file.map_or_else(
                || toolsfile::ToolsFileError::of_catalog(Path::new(""), &err),
                |path| toolsfile::ToolsFileError::of_catalog(path, &err),
            );
            return Err(ConfigError::ToolsFile { source });
        }
        hub.shutdown().await;
    }
    let tools = toolbox.catalog().specs().map(tools::ToolSpec::described).collect();
    Ok(ToolList { tools: serde_json::Value::Array(tools), mcp_not_listed, mcp_held_back })
}

/// How long [`describe_tools`] waits for the MCP servers to list their tools (a server that
/// fails first is not waited for).
pub const MCP_LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(15);
/// How often [`describe_tools`] looks whether the servers have answered.
const MCP_LIST_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// What [`describe_tools`] found.
#[derive(Debug)]
pub struct ToolList {
    /// The JSON array of tools, as described there.
    pub tools: serde_json::Value,
    /// The MCP servers whose tools are missing: failed, or not listed within [`MCP_LIST_WAIT`].
    pub mcp_not_listed: Vec<String>,
    /// The MCP tools not served because another tool has their name.
    pub mcp_held_back: Vec<String>,
}

/// Makes ring the process-wide rustls crypto provider; [`run`] calls it, and a second call (or a
/// provider installed earlier by the embedding program) leaves the installed one in place.
pub fn install_crypto_provider() {
    // Err means a default is already installed; keeping it is the point.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
