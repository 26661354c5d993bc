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
    /// The journal cannot be read, or another runner-agent holds the state directory
    /// ([`JournalError::InUse`]); nothing was started.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// nexus refused this runner's hello with a final word (`unauthorized` for a rejected
    /// credential, or any code outside the retryable list): retrying cannot help.
    #[error("nexus refused this runner: {0}")]
    Refused(Refusal),
    /// TLS with nexus failed in a way retrying cannot mend: nexus's certificate does not chain to
    /// `--tls-ca` or does not name the host, or nexus refused this runner's client certificate
    /// (or its lack of one).
    #[error("TLS with nexus failed: {0}")]
    Tls(String),
}
