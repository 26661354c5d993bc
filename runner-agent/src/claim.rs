//! The client side of a held claim: extend it, read its status, send progress. Each running tool
//! gets a [`ClaimHandle`]; its requests travel through the agent's loop over the live stream.

use std::fmt;

use nexus_proto::Refusal;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::journal::TaskKey;

/// A request made through a [`ClaimHandle`] got no useful answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// No stream is open, or it dropped before the answer came. Not proof of anything about the
    /// claim: ask again later.
    #[error("not connected to nexus")]
    Disconnected,
    /// nexus refused the request with one of the spec's words (`not_claimant`,
    /// `not_extendable`, `extension_too_long`, `invalid_timeout_ms`, ...).
    #[error("nexus refused the request: {0}")]
    Refused(Refusal),
    /// nexus answered with a frame of the wrong kind.
    #[error("nexus answered with an unexpected frame")]
    UnexpectedAnswer,
    /// The agent is no longer running.
    #[error("the agent has stopped")]
    Stopped,
}

/// What a handle asks the agent's loop to do.
pub(crate) enum ControlRequest {
    Extend { key: TaskKey, claim_token: String, timeout_ms: i64, reply: oneshot::Sender<Result<i64, RequestError>> },
    ClaimStatus { key: TaskKey, claim_token: String, reply: oneshot::Sender<Result<bool, RequestError>> },
    Progress { key: TaskKey, claim_token: String, frame_json: String },
}

/// The claim on one task, as held by the tool running it.
#[derive(Clone)]
pub struct ClaimHandle {
    key: TaskKey,
    claim_token: String,
    control: mpsc::Sender<ControlRequest>,
}

impl fmt::Debug for ClaimHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimHandle").field("key", &self.key).finish_non_exhaustive()
    }
}

impl ClaimHandle {
    pub(crate) fn new(key: TaskKey, claim_token: String, control: mpsc::Sender<ControlRequest>) -> Self {
        ClaimHandle { key, claim_token, control }
    }

    /// The task this claim is on.
    pub fn task(&self) -> &TaskKey {
        &self.key
    }

    /// Moves the claim deadline to now + `timeout_ms` (milliseconds; nexus caps it by the
    /// announced timeout and by one hour). Returns the new deadline in Unix milliseconds, which
    /// the journal also records. Guidance: extend at half the park, then at each half.
    ///
    /// # Errors
    /// [`RequestError::Refused`] with `not_claimant`, `not_extendable`, `extension_too_long` or
    /// `invalid_timeout_ms`; [`RequestError::Disconnected`] when no stream is open.
    pub async fn extend(&self, timeout_ms: i64) -> Result<i64, RequestError> {
        let (reply, answer) = oneshot::channel();
        let request =
            ControlRequest::Extend { key: self.key.clone(), claim_token: self.claim_token.clone(), timeout_ms, reply };
        self.ask(request, answer).await
    }

    /// Whether the claim is still active (false once the task was canceled or settled). Never
    /// renews the claim.
    ///
    /// # Errors
    /// [`RequestError::Refused`] with `not_claimant`; [`RequestError::Disconnected`] when no
    /// stream is open. Neither is proof of cancellation.
    pub async fn is_active(&self) -> Result<bool, RequestError> {
        let (reply, answer) = oneshot::channel();
        let request =
            ControlRequest::ClaimStatus { key: self.key.clone(), claim_token: self.claim_token.clone(), reply };
        self.ask(request, answer).await
    }

    /// Sends an ephemeral progress frame (e.g. `{"text_tail": "..."}`). Best effort: dropped when
    /// the agent is busy or disconnected, and nexus drops frames under 250 ms apart. Returns
    /// whether the frame was handed to the agent.
    pub fn progress(&self, frame: &Value) -> bool {
        let request = ControlRequest::Progress {
            key: self.key.clone(),
            claim_token: self.claim_token.clone(),
            frame_json: frame.to_string(),
        };
        self.control.try_send(request).is_ok()
    }

    async fn ask<T>(
        &self,
        request: ControlRequest,
        answer: oneshot::Receiver<Result<T, RequestError>>,
    ) -> Result<T, RequestError> {
        self.control.send(request).await.map_err(|_| RequestError::Stopped)?;
        answer.await.map_err(|_| RequestError::Stopped)?
    }
}
