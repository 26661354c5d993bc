//! Stable refusal words (`docs/protocol.md`, "Refusals"; `docs/declaration.md`; `docs/executions.md`,
//! "Error keys") and their transport mapping.
//!
//! One word names one meaning. Tests assert codes, never message text.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! error_codes {
    ($($variant:ident => ($word:literal, $http:literal, $grpc:ident)),* $(,)?) => {
        /// A stable error code: the spec's word, its HTTP status and its gRPC code.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $(
                #[doc = concat!("`", $word, "` (HTTP ", stringify!($http), ")")]
                $variant,
            )*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The spec's word, e.g. `stale_claim`.
            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $word),* }
            }

            /// The HTTP status the origin's door answers with.
            pub fn http_status(self) -> u16 {
                match self { $(ErrorCode::$variant => $http),* }
            }

            /// The gRPC status code used on the gRPC doors.
            pub fn grpc_code(self) -> tonic::Code {
                match self { $(ErrorCode::$variant => tonic::Code::$grpc),* }
            }

            /// Parses a word back into its code.
            pub fn from_word(word: &str) -> Option<ErrorCode> {
                match word { $($word => Some(ErrorCode::$variant),)* _ => None }
            }
        }
    };
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let word = <std::borrow::Cow<'de, str> as Deserialize>::deserialize(deserializer)?;
        ErrorCode::from_word(&word).ok_or_else(|| serde::de::Error::custom(format!("{word:?} is not an error code")))
    }
}

impl std::str::FromStr for ErrorCode {
    type Err = crate::words::UnknownWord;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        ErrorCode::from_word(word)
            .ok_or_else(|| crate::words::UnknownWord { vocabulary: "error code", word: word.to_owned() })
    }
}

error_codes! {
    ParameterMissing => ("parameter_missing", 400, InvalidArgument),
    ParameterInvalid => ("parameter_invalid", 400, InvalidArgument),
    Unauthorized => ("unauthorized", 401, Unauthenticated),
    NotAgent => ("not_agent", 403, PermissionDenied),
    NotAuthorized => ("not_authorized", 403, PermissionDenied),
    NotFound => ("not_found", 404, NotFound),
    // A door that exists, asked with a method it does not take (the `Allow` header names those).
    MethodNotAllowed => ("method_not_allowed", 405, Unimplemented),
    ContentTooLarge => ("content_too_large", 413, InvalidArgument),
    ValidationFailed => ("validation_failed", 422, InvalidArgument),
    PromptDocumentInvalid => ("prompt_document_invalid", 422, InvalidArgument),
    PromptDocumentTooLarge => ("prompt_document_too_large", 422, InvalidArgument),
    PromptDocumentMacroUnknown => ("prompt_document_macro_unknown", 422, InvalidArgument),
    // An input's `variables` names a variable the answering template does not declare
    // (`docs/prompt.md`, "Macros").
    VariableUndeclared => ("variable_undeclared", 422, InvalidArgument),
    RateLimited => ("rate_limited", 429, ResourceExhausted),
    // Announcement (`docs/protocol.md`, "Announce").
    InvalidAnnouncement => ("invalid_announcement", 422, InvalidArgument),
    ReservedNamespace => ("reserved_namespace", 422, InvalidArgument),
    // Claim (`docs/protocol.md`, "Claim").
    NotAddressedHere => ("not_addressed_here", 409, FailedPrecondition),
    NotClaimableKind => ("not_claimable_kind", 409, FailedPrecondition),
    TaskNotClaimable => ("task_not_claimable", 409, FailedPrecondition),
    AlreadyClaimed => ("already_claimed", 409, FailedPrecondition),
    NotEligible => ("not_eligible", 409, FailedPrecondition),
    // Read claim, extend (`docs/protocol.md`, "Claim status" and "Extend").
    NotClaimant => ("not_claimant", 409, FailedPrecondition),
    NotExtendable => ("not_extendable", 409, FailedPrecondition),
    ExtensionTooLong => ("extension_too_long", 409, FailedPrecondition),
    InvalidTimeoutMs => ("invalid_timeout_ms", 422, InvalidArgument),
    // Commit (`docs/protocol.md`, "Commit").
    StaleClaim => ("stale_claim", 409, FailedPrecondition),
    TaskNotRunning => ("task_not_running", 409, FailedPrecondition),
    InvalidOutcome => ("invalid_outcome", 422, InvalidArgument),
    ResultTooLarge => ("result_too_large", 422, InvalidArgument),
    InvalidResultType => ("invalid_result_type", 422, InvalidArgument),
    InvalidTitle => ("invalid_title", 422, InvalidArgument),
    InvalidMetadata => ("invalid_metadata", 422, InvalidArgument),
    MetadataTooLarge => ("metadata_too_large", 422, InvalidArgument),
    InvalidContent => ("invalid_content", 422, InvalidArgument),
    UnsupportedContentKind => ("unsupported_content_kind", 422, InvalidArgument),
    TooManyContentBlocks => ("too_many_content_blocks", 422, InvalidArgument),
    ResultUnstorable => ("result_unstorable", 422, InvalidArgument),
    // Progress (`docs/protocol.md`, "Progress").
    FrameTooLarge => ("frame_too_large", 422, InvalidArgument),
    InvalidFrame => ("invalid_frame", 422, InvalidArgument),
    // Stream protocol.
    ProtocolViolation => ("protocol_violation", 400, InvalidArgument),
    // Runs: in the vocabulary, but no door answers with it today (a stop of a finished execution
    // answers the execution as it is: `docs/executions.md`, "Control").
    RunNotStoppable => ("run_not_stoppable", 409, FailedPrecondition),
    // Execution control (`docs/executions.md`, "Control"): the spec names no words for these
    // refusals, so each says what the execution is not.
    NotPausable => ("not_pausable", 409, FailedPrecondition),
    NotPaused => ("not_paused", 409, FailedPrecondition),
    NotRegenerable => ("not_regenerable", 409, FailedPrecondition),
    // Conversations (`docs/executions.md`, "Conversations: one turn at a time"): the spec's cap of
    // 16 waiting inputs, and the cancel door's refusal of an input that already ran or was applied
    // (named after compaction's `task_not_queued`).
    InputQueueFull => ("input_queue_full", 409, FailedPrecondition),
    InputNotQueued => ("input_not_queued", 409, FailedPrecondition),
    // Scheduled inputs (`docs/executions.md`, "Scheduled inputs"): the spec's four refusals of
    // `deliver_at` / `deliver_in` (REFERENCE 9). The spec gives no statuses; each is a
    // well-formed request the server will not take as it stands, so 422.
    DeliverAtInPast => ("deliver_at_in_past", 422, InvalidArgument),
    DeliverAtTooFar => ("deliver_at_too_far", 422, InvalidArgument),
    DeliverAtAmbiguous => ("deliver_at_ambiguous", 422, InvalidArgument),
    DeliverAtNotSteerable => ("deliver_at_not_steerable", 422, InvalidArgument),
    // Approval (`docs/executions.md`, "Approval"): the approve and deny doors.
    NotAwaitingApproval => ("not_awaiting_approval", 409, FailedPrecondition),
    NotAdjudicable => ("not_adjudicable", 409, FailedPrecondition),
    // Approval (`docs/executions.md`, "Approval"): task error keys. A task settles with them; no
    // door refuses with them today.
    ApprovalDenied => ("approval_denied", 403, PermissionDenied),
    ApprovalExpired => ("approval_expired", 408, DeadlineExceeded),
    // `ask` (`docs/kernel-tools.md`, "ask"): the answer door refuses a task that does not wait
    // for an answer; a hold that ran out settles the task `timed_out` with `ask_expired`.
    NotAwaitingInput => ("not_awaiting_input", 409, FailedPrecondition),
    AskExpired => ("ask_expired", 408, DeadlineExceeded),
    // Delegation (`docs/delegation.md`): task error keys of `wait` and `join` (REFERENCE 7, "Error
    // keys"), and the words of the conversation tools (REFERENCE 5, "send/status/cancel"). A call
    // settles with them; the model reads them.
    AwaitFailed => ("await_failed", 424, FailedPrecondition),
    AwaitTimeout => ("await_timeout", 408, DeadlineExceeded),
    JoinLoserCanceled => ("join_loser_canceled", 409, Aborted),
    JoinStarved => ("join_starved", 424, FailedPrecondition),
    QuorumUnreachable => ("quorum_unreachable", 424, FailedPrecondition),
    ModelNotAuthorized => ("model_not_authorized", 403, PermissionDenied),
    UnknownConversation => ("unknown_conversation", 404, NotFound),
    AncestorConversation => ("ancestor_conversation", 409, FailedPrecondition),
    ParentWaiting => ("parent_waiting", 409, FailedPrecondition),
    PrincipalUnknown => ("principal_unknown", 404, NotFound),
    // The retry and abandon doors of a held task (`docs/executions.md`, "Lifecycle hooks").
    NotRetryable => ("not_retryable", 409, FailedPrecondition),
    NotAbandonable => ("not_abandonable", 409, FailedPrecondition),
    // Lifecycle hooks (`docs/executions.md`, "Lifecycle hooks"): task error keys of a hook task
    // that settles failed.
    InvalidHookResult => ("invalid_hook_result", 422, InvalidArgument),
    HookError => ("hook_error", 422, FailedPrecondition),
    StopHookLimit => ("stop_hook_limit", 409, ResourceExhausted),
    HookRequiresModel => ("hook_requires_model", 409, FailedPrecondition),
    // Compaction (`docs/executions.md`, "Compaction"): the manual compaction door.
    CompactionDisabled => ("compaction_disabled", 409, FailedPrecondition),
    AlreadyCompacted => ("already_compacted", 409, FailedPrecondition),
    NothingToCompact => ("nothing_to_compact", 409, FailedPrecondition),
    TaskNotQueued => ("task_not_queued", 409, FailedPrecondition),
    // Tool assembly (`docs/declaration.md`, "Runner imports").
    RunnerNotDeclared => ("runner_not_declared", 422, InvalidArgument),
    RunnerNotEligible => ("runner_not_eligible", 422, InvalidArgument),
    ToolNotServed => ("tool_not_served", 422, InvalidArgument),
    ToolNotDeclared => ("tool_not_declared", 422, InvalidArgument),
    // Memory (`docs/kernel-tools.md`, "memory"): the doors' and the memory tools' refusals.
    // `stale_object` is a conditional write that lost a race; `memory_read_only`, `memory_bound`,
    // `memory_edit_no_match` and `memory_edit_ambiguous` are ours (the spec names none).
    StaleObject => ("stale_object", 409, FailedPrecondition),
    MemoryNotFound => ("memory_not_found", 404, NotFound),
    MemoryPathInvalid => ("memory_path_invalid", 422, InvalidArgument),
    MemoryScopeUnavailable => ("memory_scope_unavailable", 422, InvalidArgument),
    MemoryReservedPrefix => ("memory_reserved_prefix", 422, InvalidArgument),
    MemoryReadOnly => ("memory_read_only", 403, PermissionDenied),
    MemoryBound => ("memory_bound", 422, InvalidArgument),
    MemoryEditNoMatch => ("memory_edit_no_match", 422, InvalidArgument),
    MemoryEditAmbiguous => ("memory_edit_ambiguous", 422, InvalidArgument),
    // Budgets (`docs/executions.md`, "Budgets"): a reservation that does not fit the execution's
    // remaining budget (a model call, a tool call, a child); the word is ours, the spec names none.
    BudgetExhausted => ("budget_exhausted", 409, ResourceExhausted),
    // Server side.
    Unavailable => ("unavailable", 503, Unavailable),
    Internal => ("internal", 500, Internal),
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal: a stable code plus a message that tells the user what to do.
///
/// Serialized as the HTTP error body `{"code": "...", "message": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Refusal {
    /// The spec's word.
    pub code: ErrorCode,
    /// Human-readable guidance; never asserted by tests.
    pub message: String,
    /// For `rate_limited`: whole seconds to wait before retrying (HTTP `Retry-After`, gRPC
    /// `retry-after` metadata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

/// The longest refusal message, in characters: a message that repeats client input (a 100 KB
/// tool name) is cut there and ends with `…`.
pub const MESSAGE_BOUND: usize = 1_024;

impl Refusal {
    /// A refusal with `code` and `message`, cut to [`MESSAGE_BOUND`] characters.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if let Some((end, _)) = message.char_indices().nth(MESSAGE_BOUND) {
            message.truncate(end);
            message.push('…');
        }
        Refusal { code, message, retry_after: None }
    }

    /// A `rate_limited` refusal that asks the caller to wait `seconds` (at least 1).
    pub fn rate_limited(seconds: u64) -> Self {
        let seconds = seconds.max(1);
        Refusal {
            code: ErrorCode::RateLimited,
            message: format!("the request budget is spent; retry after {seconds} s"),
            retry_after: Some(seconds),
        }
    }

    /// A refusal read off the wire (a runner-stream refusal frame, an HTTP error body): the word
    /// when this build knows it; otherwise the code its HTTP status stands for (a newer peer's
    /// word), with the unknown word kept at the head of the message.
    pub fn from_wire(word: &str, message: &str, http_status: u16) -> Refusal {
        match ErrorCode::from_word(word) {
            Some(code) => Refusal::new(code, message),
            None => Refusal::new(ErrorCode::for_http_status(http_status), format!("{word}: {message}")),
        }
    }

    /// The gRPC status for this refusal: the mapped code, with the word in the message's head and
    /// in the `nexus-error-code` metadata entry.
    pub fn to_status(&self) -> tonic::Status {
        let word = self.code.as_str();
        // The word leads the message for generic clients, unless the message already names it.
        let message =
            if self.message.contains(word) { self.message.clone() } else { format!("{word}: {}", self.message) };
        let mut status = tonic::Status::new(self.code.grpc_code(), message);
        status.metadata_mut().insert("nexus-error-code", tonic::metadata::MetadataValue::from_static(word));
        if let Some(seconds) = self.retry_after
            && let Ok(value) = seconds.to_string().parse()
        {
            status.metadata_mut().insert("retry-after", value);
        }
        status
    }

    /// Reads a refusal back from a gRPC status made by [`Refusal::to_status`]. A status without a
    /// known word (from a proxy, or a newer peer) takes the code its gRPC code stands for, and
    /// its message is kept whole.
    pub fn from_status(status: &tonic::Status) -> Refusal {
        let word = status.metadata().get("nexus-error-code").and_then(|v| v.to_str().ok());
        let retry_after =
            status.metadata().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let Some(code) = word.and_then(ErrorCode::from_word) else {
            return Refusal {
                code: ErrorCode::for_grpc_code(status.code()),
                message: status.message().to_owned(),
                retry_after,
            };
        };
        // `to_status` puts the word in front of the message; take it back off.
        let message = status.message().strip_prefix(&format!("{code}: ")).unwrap_or(status.message()).to_owned();
        Refusal { code, message, retry_after }
    }
}

impl ErrorCode {
    /// The general code a gRPC status code stands for, when no word came with it.
    pub fn for_grpc_code(code: tonic::Code) -> ErrorCode {
        match code {
            tonic::Code::Unauthenticated => ErrorCode::Unauthorized,
            tonic::Code::PermissionDenied => ErrorCode::NotAuthorized,
            tonic::Code::NotFound => ErrorCode::NotFound,
            tonic::Code::InvalidArgument => ErrorCode::ParameterInvalid,
            tonic::Code::ResourceExhausted => ErrorCode::RateLimited,
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => ErrorCode::Unavailable,
            _ => ErrorCode::Internal,
        }
    }

    /// The general code an HTTP status stands for, when no known word came with it.
    pub fn for_http_status(status: u16) -> ErrorCode {
        match status {
            401 => ErrorCode::Unauthorized,
            403 => ErrorCode::NotAuthorized,
            404 => ErrorCode::NotFound,
            413 => ErrorCode::ContentTooLarge,
            422 => ErrorCode::ValidationFailed,
            429 => ErrorCode::RateLimited,
            400..=499 => ErrorCode::ParameterInvalid,
            503 => ErrorCode::Unavailable,
            _ => ErrorCode::Internal,
        }
    }
}

/// An error and its causes on one line, joined by `: `, leaving out a cause whose text the line
/// already holds (many errors quote their source in their own message): what both binaries print
/// after `error: ` when they stop on a refusal, never a backtrace.
pub fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = String::new();
    let mut cause = Some(error);
    while let Some(current) = cause {
        let text = current.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        cause = current.source();
    }
    line
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_line_names_each_cause_once() {
        #[derive(Debug)]
        struct Outer(std::io::Error, bool);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                if self.1 { write!(f, "cannot read a.toml: {}", self.0) } else { write!(f, "cannot read a.toml") }
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let quoting = Outer(std::io::Error::other("denied"), true);
        assert_eq!(super::one_line(&quoting), "cannot read a.toml: denied");
        let plain = Outer(std::io::Error::other("denied"), false);
        assert_eq!(super::one_line(&plain), "cannot read a.toml: denied");
    }

    use super::*;

    #[test]
    fn words_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "duplicate word {}", code.as_str());
            assert_eq!(ErrorCode::from_word(code.as_str()), Some(*code));
        }
        assert_eq!(ErrorCode::StaleClaim.http_status(), 409);
        assert_eq!(ErrorCode::Unauthorized.grpc_code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn refusal_survives_a_grpc_status() {
        let refusal = Refusal::new(ErrorCode::StaleClaim, "claim again");
        let back = Refusal::from_status(&refusal.to_status());
        assert_eq!(back, refusal, "the word, the message and no retry hint survive");
        let limited = Refusal::rate_limited(7);
        assert_eq!(Refusal::from_status(&limited.to_status()).retry_after, Some(7));
        let named = Refusal::new(ErrorCode::ValidationFailed, "configuration.x: validation_failed: y");
        assert_eq!(named.to_status().message(), "configuration.x: validation_failed: y", "the word is not repeated");
        // A status no nexus made keeps its message and takes its code's general word.
        let foreign = Refusal::from_status(&tonic::Status::unavailable("upstream connect error"));
        assert_eq!((foreign.code, foreign.message.as_str()), (ErrorCode::Unavailable, "upstream connect error"));
        let newer = Refusal::from_wire("quota_spent", "wait", 429);
        assert_eq!((newer.code, newer.message.as_str()), (ErrorCode::RateLimited, "quota_spent: wait"));
        assert_eq!(Refusal::from_wire("stale_claim", "again", 409), Refusal::new(ErrorCode::StaleClaim, "again"));
        let long = Refusal::new(ErrorCode::ToolNotServed, format!("tool {} is not served", "x".repeat(100_000)));
        assert_eq!(long.message.chars().count(), MESSAGE_BOUND + 1, "echoed input is cut");
        assert!(long.message.ends_with('…'));
        let body = serde_json::to_value(&refusal).expect("json");
        assert_eq!(body, serde_json::json!({"code": "stale_claim", "message": "claim again"}));
        assert_eq!(serde_json::from_value::<Refusal>(body).expect("parses"), refusal);
    }
}
