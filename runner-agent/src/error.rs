//! The errors that end [`run`](crate::run).

use nexus_proto::Refusal;

use crate::config::ConfigError;
use crate::journal::JournalError;

/// Why the agent stopped without being asked to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The configuration cannot be used; nothing was started.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The journal cannot be read; nothing was started.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// nexus refused this runner's hello with a final word (`unauthorized` for a rejected
    /// credential, or any code outside the retryable list): retrying cannot help.
    #[error("nexus refused this runner: {0}")]
    Refused(Refusal),
}
