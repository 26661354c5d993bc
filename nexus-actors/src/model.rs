//! Model providers: the `provider/model` resolver and the clients behind it.
//!
//! Owns the internal chat transcript shape ([`ChatMessage`]), the provider-neutral request and
//! answer ([`ModelRequest`], [`ModelResponse`]), the streamed transcript deltas
//! ([`TranscriptDelta`], [`DeltaSink`]), the provider error keys ([`ModelError`],
//! `docs/executions.md`, "Error keys"), the provider table from config ([`ProviderTable`]), the
//! resolver that turns a reference such as `openrouter/z-ai/glm-5.3` into a client
//! ([`ModelRegistry`], with the resolver words of `default_model` and `fallback_models`:
//! `docs/declaration.md`, "Configuration fields"), the attempt budget of one model step and its
//! classification ([`retry`]; `docs/executions.md`, "Models"), and three clients:
//! [`scripted::ScriptedProvider`] (deterministic, for tests and `nexus quickstart`),
//! [`openai::OpenAiCompatibleProvider`] (chat completions) and [`anthropic::AnthropicProvider`]
//! (Messages), the last two streaming over HTTPS with rustls ([`sse`]).
//!
//! Does not own: the fallback order and the `model_change` event (the execution actor walks the
//! chain using [`retry::ModelFailure::advance`]), the tool wire projection (the declaration
//! module builds [`ModelRequest::tools`]), the event feed that carries the deltas, or
//! persistence.

pub mod anthropic;
pub mod bounds;
pub mod config;
#[cfg(test)]
mod fake_http;
pub mod openai;
pub mod prompt;
pub mod registry;
pub mod retry;
pub mod scripted;
pub mod sse;
mod wire;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use self::config::{ModelConfig, ProviderConfig, ProviderKind, ProviderTable};
pub use self::registry::{ConfigError, ModelPrices, ModelRegistry, ResolveError, ResolvedModel};
pub use self::retry::{ModelFailure, RetryPolicy};
pub use self::scripted::{Script, ScriptError};

/// A boxed, sendable future borrowed for `'a` (the trait below is object safe without
/// `async-trait`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One chat message in the internal, OpenAI-chat-shaped transcript.
///
/// Serialized with a `role` tag: `{"role":"system","content":…}`, `{"role":"developer",…}`, `{"role":"user","content":…}`,
/// `{"role":"assistant","content":…|null,"tool_calls":[{id,name,arguments}]}`,
/// `{"role":"tool","tool_call_id":…,"content":…}`. This is the stored shape, not a provider's
/// wire shape: each adapter projects it (see [`openai`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    /// Instructions (system prompt, templates).
    System {
        /// The text.
        content: String,
    },
    /// Developer instructions: a document declared `role: developer` (OpenAI-compatible
    /// `developer`; Anthropic's `system` parameter). Never stored in a transcript: requests are
    /// assembled with it ([`prompt`]).
    Developer {
        /// The text.
        content: String,
    },
    /// A user turn.
    User {
        /// The text.
        content: String,
    },
    /// A model answer: text, tool calls, or both.
    Assistant {
        /// The text, `None` when the model only called tools.
        #[serde(default)]
        content: Option<String>,
        /// The tool calls, in the model's order; empty for a final answer.
        #[serde(default)]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call, answering the assistant's call with the same id.
    Tool {
        /// The [`ToolCall::id`] this answers.
        tool_call_id: String,
        /// The committed `content` string, exactly as the model reads it.
        content: String,
    },
}

/// The ids of the tool calls whose results a transcript already holds (its `tool` messages).
pub fn answered_calls(transcript: &[ChatMessage]) -> std::collections::HashSet<&str> {
    transcript
        .iter()
        .filter_map(|m| match m {
            ChatMessage::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect()
}

/// One tool call requested by a model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id. In an answer: the provider's call id (scripted: the script's id or
    /// `call_{round}_{index}`). In a transcript: the id the call carries on the provider wire,
    /// unique in its execution ([`wire_call_ids`]); the result that answers it names this id.
    pub id: String,
    /// The tool's wire name, as the model wrote it (it may name no offered tool).
    pub name: String,
    /// JSON text as the model produced it; not parsed or validated here.
    pub arguments: String,
    /// In a transcript, the model's own id when the call goes out under another ([`wire_call_ids`]);
    /// `None` when the two are the same (and always in an answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
}

/// Whether `id` may go on the provider wire as it is: 1 to 128 characters of `[A-Za-z0-9_-]`,
/// which every provider nexus speaks accepts.
fn wire_safe(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Gives each call of round `round`'s answer the id it carries on the provider wire, unique in
/// the execution (`docs/executions.md`, "Provider call ids"): the model's own id when it is
/// wire-safe and no earlier call of `transcript` (nor of this answer) carries it, else the call's
/// task key `r{round}t{i}` (with `-2`, `-3`, … appended while that is taken), the model's id kept
/// beside it as [`ToolCall::model_id`]. Deterministic: the same transcript and answer give the
/// same ids, and once written they are read back, never minted again.
#[must_use]
pub fn wire_call_ids(transcript: &[ChatMessage], round: i64, calls: &[ToolCall]) -> Vec<ToolCall> {
    let mut taken: std::collections::HashSet<String> = transcript
        .iter()
        .flat_map(|m| match m {
            ChatMessage::Assistant { tool_calls, .. } => tool_calls.iter().map(|c| c.id.clone()).collect(),
            ChatMessage::Tool { tool_call_id, .. } => vec![tool_call_id.clone()],
            _ => Vec::new(),
        })
        .collect();
    calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            if wire_safe(&call.id) && !taken.contains(&call.id) {
                taken.insert(call.id.clone());
                return ToolCall { model_id: None, ..call.clone() };
            }
            let key = format!("r{round}t{index}");
            let mut minted = key.clone();
            let mut n = 2;
            while taken.contains(&minted) {
                minted = format!("{key}-{n}");
                n += 1;
            }
            taken.insert(minted.clone());
            ToolCall { id: minted, model_id: Some(call.id.clone()), ..call.clone() }
        })
        .collect()
}

/// The wire id of the `index`th call of the transcript's latest round of calls (its last
/// assistant message with calls): what the result of task `r{n}t{index}` of the current round
/// answers. `None` when there is no such call.
#[must_use]
pub fn current_call_id(transcript: &[ChatMessage], index: usize) -> Option<&str> {
    transcript.iter().rev().find_map(|m| match m {
        ChatMessage::Assistant { tool_calls, .. } if !tool_calls.is_empty() => {
            Some(tool_calls.get(index).map(|c| c.id.as_str()))
        }
        _ => None,
    })?
}

/// One model call: the whole transcript plus the offered tools.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelRequest {
    /// The model name: the part of the reference after `provider/` (may contain `/`).
    pub model: String,
    /// The transcript, oldest first.
    pub messages: Vec<ChatMessage>,
    /// Provider wire projection entries, e.g.
    /// `{"type":"function","function":{name,description,parameters},"strict":false}`; sent as
    /// given to OpenAI-compatible providers and projected to `{name, description, input_schema}`
    /// for Anthropic. Empty means no tools are offered.
    pub tools: Vec<serde_json::Value>,
    /// Where a streaming client reports the answer as it arrives ([`TranscriptDelta`]). `None`
    /// drops the deltas; the final [`ModelResponse`] is the same either way.
    pub deltas: Option<DeltaSink>,
}

/// One streamed piece of a model answer, or a reset of what was streamed
/// (`docs/executions.md`, "Events", the ephemeral items). Ephemeral: never stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TranscriptDelta {
    /// `text_delta {text}`: more answer text.
    Text {
        /// The new text (never empty).
        text: String,
    },
    /// `tool_call_started {index, tool_call_id, name}`: the model began a tool call.
    ToolCallStarted {
        /// 0-based position of the call in the answer's tool calls.
        index: usize,
        /// The provider's call id (`call_{index}` when it sent none).
        tool_call_id: String,
        /// The tool's wire name.
        name: String,
    },
    /// `tool_call_arguments_delta {index, delta}`: more of a call's JSON argument text.
    ToolCallArguments {
        /// The call's [`TranscriptDelta::ToolCallStarted::index`].
        index: usize,
        /// The new argument text (never empty).
        delta: String,
    },
    /// `stream_reset {reason}`: discard what this model step streamed so far. Sent by
    /// [`retry::call_with_retries`], never by a client.
    StreamReset {
        /// `retry` (another attempt follows), `refused` (the classifier declined; a fallback may
        /// follow) or `failed` (the step failed).
        reason: ResetReason,
    },
}

/// Why streamed text is discarded (`stream_reset.reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetReason {
    /// `retry`: the attempt failed and is repeated.
    Retry,
    /// `refused`: the classifier declined the answer.
    Refused,
    /// `failed`: the model step failed.
    Failed,
}

impl ResetReason {
    /// The spec's word.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Refused => "refused",
            Self::Failed => "failed",
        }
    }
}

nexus_proto::words! {
    /// The type of a transcript delta on a live watch.
    pub enum DeltaType("transcript delta type") {
        /// A piece of the answer's text.
        TextDelta => "text_delta",
        /// A tool call began.
        ToolCallStarted => "tool_call_started",
        /// A piece of a tool call's arguments.
        ToolCallArgumentsDelta => "tool_call_arguments_delta",
        /// What streamed so far is void.
        StreamReset => "stream_reset",
    }
}

impl TranscriptDelta {
    /// The event type.
    #[must_use]
    pub fn event_type(&self) -> DeltaType {
        match self {
            Self::Text { .. } => DeltaType::TextDelta,
            Self::ToolCallStarted { .. } => DeltaType::ToolCallStarted,
            Self::ToolCallArguments { .. } => DeltaType::ToolCallArgumentsDelta,
            Self::StreamReset { .. } => DeltaType::StreamReset,
        }
    }

    /// The event's data: `{text}`, `{index, tool_call_id, name}`, `{index, delta}` or `{reason}`.
    #[must_use]
    pub fn data(&self) -> Value {
        match self {
            Self::Text { text } => json!({"text": text}),
            Self::ToolCallStarted { index, tool_call_id, name } => {
                json!({"index": index, "tool_call_id": tool_call_id, "name": name})
            }
            Self::ToolCallArguments { index, delta } => json!({"index": index, "delta": delta}),
            Self::StreamReset { reason } => json!({"reason": reason.word()}),
        }
    }
}

/// A callback receiving [`TranscriptDelta`]s, called from the task running the model call. It
/// must not block (publish to a channel). Cloning shares the callback; two sinks are equal when
/// they share it.
#[derive(Clone)]
pub struct DeltaSink(Arc<dyn Fn(TranscriptDelta) + Send + Sync>);

impl DeltaSink {
    /// A sink calling `deliver` for each delta.
    pub fn new(deliver: impl Fn(TranscriptDelta) + Send + Sync + 'static) -> Self {
        Self(Arc::new(deliver))
    }

    /// Delivers one delta.
    pub fn send(&self, delta: TranscriptDelta) {
        (self.0)(delta);
    }
}

impl fmt::Debug for DeltaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DeltaSink")
    }
}

impl PartialEq for DeltaSink {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A successful model answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The answer text, `None` when the provider sent none.
    pub text: Option<String>,
    /// Tool calls to run; empty for a final answer.
    pub tool_calls: Vec<ToolCall>,
    /// The finish reason in the OpenAI words: `stop`, `tool_calls`, `length`, or another word
    /// the provider sent as is. Anthropic's `end_turn`/`stop_sequence`/`pause_turn` are `stop`,
    /// `tool_use` is `tool_calls`, `max_tokens`/`model_context_window_exceeded` are `length`.
    /// When the provider sends none: `tool_calls` if there are tool calls, else `stop`.
    /// `content_filter` and `refusal` never appear here: they are [`ModelError::Blocked`] and
    /// [`ModelError::Refused`].
    pub finish_reason: String,
    /// Token counts, when the provider reports them.
    pub usage: Option<Usage>,
}

/// Token counts of one model call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (OpenAI `usage.prompt_tokens`; Anthropic `usage.input_tokens` plus its
    /// cache creation and cache read tokens).
    pub input_tokens: u64,
    /// Generated tokens (OpenAI `usage.completion_tokens`, Anthropic `usage.output_tokens`).
    pub output_tokens: u64,
}

/// Why one model call failed. [`ModelError::key`] gives the error key (`docs/executions.md`,
/// "Error keys"), [`ModelError::retryable`] whether the same request may be sent again, and
/// [`ModelError::finish_quality`] the origin's finish quality of an answer that came back unusable.
/// What a failure means for the model step after its retries (and for the fallback chain) is
/// decided in [`retry`].
#[non_exhaustive]
#[derive(thiserror::Error, Debug)]
pub enum ModelError {
    /// The request never got a whole answer: connect, TLS, timeout, reset, body read, or a stream
    /// that ended before the answer finished (no `[DONE]`/finish reason, no `message_stop`).
    /// Key `provider_http_error`; retryable.
    #[error("provider transport failure: {message}")]
    Transport {
        /// What failed (never contains the credential).
        message: String,
    },
    /// An HTTP error status not covered by a more specific variant (400, 408, 413, 500, 502, …),
    /// or an error object of that status inside a 2xx body or a stream.
    /// Key `provider_http_error`; retryable for 5xx.
    #[error("provider answered http {status}: {message}")]
    Http {
        /// The HTTP status.
        status: u16,
        /// The provider's error text, shortened.
        message: String,
    },
    /// 429 (or Anthropic `rate_limit_error`): the lane's budget is spent for now. Key
    /// `provider_http_error`; retryable after `retry_after`; never a reason to fall back.
    #[error("provider rate limited the call (http 429): {message}")]
    RateLimited {
        /// The provider's `Retry-After` (whole seconds, or an HTTP date), when it sent one.
        retry_after: Option<Duration>,
        /// The provider's error text, shortened.
        message: String,
    },
    /// 401, 403 or 404: the key or the model is not usable. Key `provider_model_unavailable`;
    /// not retryable.
    #[error("provider model unavailable (http {status}): {message}")]
    ModelUnavailable {
        /// The HTTP status.
        status: u16,
        /// The provider's error text, shortened.
        message: String,
    },
    /// 503, 529, or an `overloaded_error` (in an error body or as a stream `error` event). Key
    /// `provider_overloaded`; retryable.
    #[error("provider overloaded (http {status:?}): {message}")]
    Overloaded {
        /// The HTTP status, `None` when an otherwise successful answer said `overloaded_error`.
        status: Option<u16>,
        /// The provider's error text, shortened.
        message: String,
    },
    /// The prompt does not fit the model: an error with code `context_length_exceeded`, or whose
    /// text says `prompt is too long` / `maximum context length`. Key
    /// `provider_context_overflow`; not retryable.
    #[error("provider context overflow (http {status}): {message}")]
    ContextOverflow {
        /// The HTTP status.
        status: u16,
        /// The provider's error text, shortened.
        message: String,
    },
    /// A malformed or abnormal answer (bad JSON, no choice, `finish_reason: error`, an empty
    /// answer, a nameless tool call), or a scripted provider failure (exhausted script, missing
    /// tool result). Key `provider_error`, finish quality `error`; not retryable.
    #[error("provider error: {message}")]
    Provider {
        /// What was wrong.
        message: String,
    },
    /// The provider's content filter withheld the answer (OpenAI `finish_reason: content_filter`
    /// without a `refusal`): a content block, finish quality `blocked`. Key `provider_error`; not
    /// retryable, and never a reason to fall back (`docs/executions.md`, "Models").
    #[error("content blocked by the provider: {message}")]
    Blocked {
        /// The finish reason, or the provider's text.
        message: String,
    },
    /// The provider's classifier declined (an OpenAI `refusal`, an Anthropic `stop_reason:
    /// refusal`): finish quality `refused`. Key `model_refused`; not retryable (the fallback list
    /// advances on it).
    #[error("model refused: {message}")]
    Refused {
        /// The refusal text, or the stop reason.
        message: String,
    },
}

impl ModelError {
    /// The spec's error key: `provider_http_error`, `provider_model_unavailable`,
    /// `provider_overloaded`, `provider_context_overflow`, `provider_error` or `model_refused`.
    #[must_use]
    pub fn key(&self) -> &'static str {
        match self {
            Self::Transport { .. } | Self::Http { .. } | Self::RateLimited { .. } => "provider_http_error",
            Self::ModelUnavailable { .. } => "provider_model_unavailable",
            Self::Overloaded { .. } => "provider_overloaded",
            Self::ContextOverflow { .. } => "provider_context_overflow",
            Self::Provider { .. } | Self::Blocked { .. } => "provider_error",
            Self::Refused { .. } => "model_refused",
        }
    }

    /// Whether repeating the same request may succeed: transport failures, 429, and every 5xx
    /// (including 503/529 overload). [`retry`] owns the budget and the 429 floor.
    #[must_use]
    pub fn retryable(&self) -> bool {
        match self {
            Self::Transport { .. } | Self::Overloaded { .. } | Self::RateLimited { .. } => true,
            Self::Http { status, .. } => *status == 429 || *status >= 500,
            Self::ModelUnavailable { .. }
            | Self::ContextOverflow { .. }
            | Self::Provider { .. }
            | Self::Blocked { .. }
            | Self::Refused { .. } => false,
        }
    }

    /// The HTTP status the provider answered with, when there was one (e.g. to tell a 429 apart).
    #[must_use]
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Http { status, .. }
            | Self::ModelUnavailable { status, .. }
            | Self::ContextOverflow { status, .. } => Some(*status),
            Self::RateLimited { .. } => Some(429),
            Self::Overloaded { status, .. } => *status,
            Self::Transport { .. } | Self::Provider { .. } | Self::Blocked { .. } | Self::Refused { .. } => None,
        }
    }

    /// The origin's `finish_quality` of an answer that came back but cannot be used: `refused`,
    /// `blocked` or `error`; `None` for a failure that produced no answer.
    #[must_use]
    pub fn finish_quality(&self) -> Option<&'static str> {
        match self {
            Self::Refused { .. } => Some("refused"),
            Self::Blocked { .. } => Some("blocked"),
            Self::Provider { .. } => Some("error"),
            _ => None,
        }
    }
}

/// A client for one provider. Stateless per call: everything the provider needs is in the
/// request, so a call may be repeated or sent to another provider.
pub trait ModelProvider: Send + Sync + std::fmt::Debug {
    /// Sends one request and returns the whole answer, reporting it piece by piece to
    /// [`ModelRequest::deltas`] when the client streams. Bounded by the provider's
    /// `request_timeout_ms`. One call is one attempt: retries belong to [`retry`].
    fn complete<'a>(&'a self, request: ModelRequest) -> BoxFuture<'a, Result<ModelResponse, ModelError>>;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn error_keys_retryability_and_status() {
        let msg = String::new;
        let rows: Vec<(ModelError, &str, bool, Option<u16>)> = vec![
            (ModelError::Transport { message: msg() }, "provider_http_error", true, None),
            (ModelError::Http { status: 400, message: msg() }, "provider_http_error", false, Some(400)),
            (ModelError::Http { status: 429, message: msg() }, "provider_http_error", true, Some(429)),
            (ModelError::RateLimited { retry_after: None, message: msg() }, "provider_http_error", true, Some(429)),
            (ModelError::Blocked { message: msg() }, "provider_error", false, None),
            (ModelError::Http { status: 500, message: msg() }, "provider_http_error", true, Some(500)),
            (
                ModelError::ModelUnavailable { status: 404, message: msg() },
                "provider_model_unavailable",
                false,
                Some(404),
            ),
            (ModelError::Overloaded { status: Some(529), message: msg() }, "provider_overloaded", true, Some(529)),
            (ModelError::Overloaded { status: None, message: msg() }, "provider_overloaded", true, None),
            (
                ModelError::ContextOverflow { status: 400, message: msg() },
                "provider_context_overflow",
                false,
                Some(400),
            ),
            (ModelError::Provider { message: msg() }, "provider_error", false, None),
            (ModelError::Refused { message: msg() }, "model_refused", false, None),
        ];
        for (error, key, retryable, status) in rows {
            assert_eq!(error.key(), key, "{error:?}");
            assert_eq!(error.retryable(), retryable, "{error:?}");
            assert_eq!(error.status(), status, "{error:?}");
        }
        let quality = |error: ModelError| error.finish_quality();
        assert_eq!(quality(ModelError::Refused { message: msg() }), Some("refused"));
        assert_eq!(quality(ModelError::Blocked { message: msg() }), Some("blocked"));
        assert_eq!(quality(ModelError::Provider { message: msg() }), Some("error"));
        assert_eq!(quality(ModelError::Overloaded { status: Some(503), message: msg() }), None);
    }

    #[test]
    fn delta_events_carry_the_spec_words() {
        let rows = [
            (TranscriptDelta::Text { text: "hi".into() }, "text_delta", json!({"text": "hi"})),
            (
                TranscriptDelta::ToolCallStarted { index: 1, tool_call_id: "c".into(), name: "bash".into() },
                "tool_call_started",
                json!({"index": 1, "tool_call_id": "c", "name": "bash"}),
            ),
            (
                TranscriptDelta::ToolCallArguments { index: 1, delta: "{\"a".into() },
                "tool_call_arguments_delta",
                json!({"index": 1, "delta": "{\"a"}),
            ),
            (TranscriptDelta::StreamReset { reason: ResetReason::Retry }, "stream_reset", json!({"reason": "retry"})),
            (
                TranscriptDelta::StreamReset { reason: ResetReason::Refused },
                "stream_reset",
                json!({"reason": "refused"}),
            ),
            (TranscriptDelta::StreamReset { reason: ResetReason::Failed }, "stream_reset", json!({"reason": "failed"})),
        ];
        for (delta, event_type, data) in rows {
            assert_eq!(delta.event_type().as_str(), event_type);
            assert_eq!(delta.data(), data, "{event_type}");
        }
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = {
            let seen = Arc::clone(&seen);
            DeltaSink::new(move |delta| seen.lock().expect("lock").push(delta))
        };
        assert_eq!(sink, sink.clone());
        assert_ne!(sink, DeltaSink::new(|_| {}));
        sink.send(TranscriptDelta::Text { text: "x".into() });
        assert_eq!(seen.lock().expect("lock").len(), 1);
    }

    #[test]
    fn chat_message_stored_shape() {
        let messages = vec![
            ChatMessage::System { content: "s".into() },
            ChatMessage::User { content: "u".into() },
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "bash".into(),
                    arguments: "{}".into(),
                    model_id: None,
                }],
            },
            ChatMessage::Tool { tool_call_id: "c1".into(), content: "ok".into() },
        ];
        let value = serde_json::to_value(&messages).expect("serializes");
        assert_eq!(
            value,
            json!([
                {"role": "system", "content": "s"},
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": null,
                 "tool_calls": [{"id": "c1", "name": "bash", "arguments": "{}"}]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ])
        );
        let back: Vec<ChatMessage> = serde_json::from_value(value).expect("deserializes");
        assert_eq!(back, messages);
        let short: ChatMessage =
            serde_json::from_value(json!({"role": "assistant", "content": "hi"})).expect("defaults apply");
        assert_eq!(short, ChatMessage::Assistant { content: Some("hi".into()), tool_calls: vec![] });
    }

    fn call(id: &str) -> ToolCall {
        ToolCall { id: id.into(), name: "bash".into(), arguments: "{}".into(), model_id: None }
    }

    #[test]
    fn wire_ids_are_unique_deterministic_and_keep_the_model_id() {
        let earlier = vec![
            ChatMessage::Assistant { content: None, tool_calls: vec![call("a"), call("r2t1")] },
            ChatMessage::Tool { tool_call_id: "a".into(), content: "x".into() },
        ];
        let answer = [call("a"), call("b"), call("b"), call(""), call("bad id!"), call(&"l".repeat(129))];
        let ids = wire_call_ids(&earlier, 2, &answer);
        let wire: Vec<&str> = ids.iter().map(|c| c.id.as_str()).collect();
        // `a` is taken by round 1, the second `b` by the first, `r2t1` by a kept model id.
        assert_eq!(wire, ["r2t0", "b", "r2t2", "r2t3", "r2t4", "r2t5"]);
        let kept: Vec<Option<&str>> = ids.iter().map(|c| c.model_id.as_deref()).collect();
        assert_eq!(kept[..5], [Some("a"), None, Some("b"), Some(""), Some("bad id!")]);
        assert_eq!(wire_call_ids(&earlier, 2, &answer), ids, "the same transcript gives the same ids");
        // A minted key already taken gets a suffix.
        let taken = vec![ChatMessage::Assistant { content: None, tool_calls: vec![call("r1t0")] }];
        assert_eq!(wire_call_ids(&taken, 1, &[call("r1t0")])[0].id, "r1t0-2");
        // The stored shape leaves `model_id` out when it is the same id.
        let stored = serde_json::to_value(&ids[1]).expect("json");
        assert!(stored.get("model_id").is_none(), "{stored}");
        let mut transcript = earlier.clone();
        transcript.push(ChatMessage::Assistant { content: None, tool_calls: ids });
        assert_eq!(current_call_id(&transcript, 2), Some("r2t2"));
        assert_eq!(current_call_id(&transcript, 9), None);
    }
}
