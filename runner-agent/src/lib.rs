//! `nexus-runner-agent`: the worker daemon that serves environment-local tools to nexus.
//!
//! Owns: the runner side of `nexus.runner.v1.RunnerService/Connect` — hello, announce, claim,
//! run, extend, commit, progress, pong — with reconnect and backoff; the claim journal that makes
//! a result survive a disconnect or restart and keeps a claimed tool from ever running twice; and
//! the built-in tools (`bash`, `read_file`, `write_file`, `list_dir`, `edit`, `apply_patch`,
//! `grep`, `glob`, the `process_*` tools, and `web_fetch` when configured), confined to one
//! workdir, each bounded in time and memory and leaving no process behind beyond what
//! `process_start` holds until the agent stops (`docs/runner-tools-builtins.md`).
//!
//! Does not own: any server state. nexus decides what is dispatched, who may claim it, and how
//! a task settles; this crate only follows the protocol in `docs/protocol.md`.
//!
//! Main types: [`AgentConfig`] (every knob, with defaults), [`run`] (the daemon, also called
//! in-process by tests), [`journal::Journal`] (the on-disk claim journal) and
//! [`claim::ClaimHandle`] (extend, claim status and progress for a running tool).

mod agent;
pub mod claim;
pub mod config;
mod error;
pub mod journal;
mod retry;
mod tools;

use std::future::Future;

use tracing::Instrument;

pub use crate::config::{AgentConfig, ConfigError, Credential, TlsOptions, default_state_dir};
pub use crate::error::AgentError;

/// Runs the agent until `shutdown` resolves.
///
/// Connects to `config.nexus_url`, says hello, announces the built-in tools, then claims and runs
/// the tool calls nexus hints at, at most `config.slots` at a time, committing each result after
/// journaling it. Any stream failure reconnects with jittered exponential backoff (no attempt
/// limit) and re-sends unacknowledged results. When `shutdown` resolves, running tools are killed,
/// their results journaled and (if connected) committed, bounded by `config.shutdown_grace`; then
/// it returns `Ok(())`.
///
/// # Errors
/// [`AgentError::Config`] or [`AgentError::Journal`] before anything starts (an unreadable or
/// invalid TLS file is [`ConfigError::TlsFile`], naming it; a state dir that another runner-agent
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
