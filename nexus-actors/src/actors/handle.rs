//! What every typed actor handle shares: the error of a stopped or silent actor, and the one way
//! to ask an actor and wait for its answer under a deadline (`docs/architecture.md`, "Handles").
//!
//! A handle's casts never wait. A handle's calls wait at most the configured deadline
//! (`[actors] call_timeout_ms`); a call that times out has an unknown outcome, because the
//! message stays queued and its handler still runs (ractor's semantics), so the error says so.

use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};

use nexus_proto::{ErrorCode, Refusal};

/// Why an actor could not be reached.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ActorError {
    /// The actor has stopped, or the server is shutting down.
    #[error("the {actor} is stopped")]
    Stopped {
        /// Which actor, e.g. `execution`.
        actor: &'static str,
    },
    /// The actor did not answer within the deadline; what it did is unknown.
    #[error("the {actor} did not answer within {after_ms} ms")]
    Timeout {
        /// Which actor.
        actor: &'static str,
        /// The deadline, in milliseconds.
        after_ms: u64,
    },
}

impl From<ActorError> for Refusal {
    fn from(error: ActorError) -> Refusal {
        match error {
            ActorError::Stopped { actor } => Refusal::new(
                ErrorCode::Unavailable,
                format!("the {actor} is restarting or shutting down; retry shortly"),
            ),
            ActorError::Timeout { actor, after_ms } => Refusal::new(
                ErrorCode::Unavailable,
                format!(
                    "the {actor} did not answer within {after_ms} ms; what it did is unknown: read it again, then retry"
                ),
            ),
        }
    }
}

/// Sends `build(reply)` to `actor` and waits at most `deadline` for the answer.
///
/// # Errors
/// [`ActorError::Stopped`] when the actor is gone or drops the reply port;
/// [`ActorError::Timeout`] when it does not answer in time.
pub(crate) async fn call<M, T>(
    actor: &ActorRef<M>,
    name: &'static str,
    deadline: Duration,
    build: impl FnOnce(RpcReplyPort<T>) -> M,
) -> Result<T, ActorError>
where
    M: ractor::Message,
    T: Send + 'static,
{
    match actor.call(build, Some(deadline)).await {
        Ok(CallResult::Success(answer)) => Ok(answer),
        Ok(CallResult::Timeout) => {
            Err(ActorError::Timeout { actor: name, after_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX) })
        }
        Ok(CallResult::SenderError) | Err(_) => Err(ActorError::Stopped { actor: name }),
    }
}

/// Casts `message` to `actor`.
///
/// # Errors
/// [`ActorError::Stopped`] when the actor is gone.
pub(crate) fn cast<M: ractor::Message>(actor: &ActorRef<M>, name: &'static str, message: M) -> Result<(), ActorError> {
    actor.cast(message).map_err(|_| ActorError::Stopped { actor: name })
}
