//! Model providers: the `provider/model` resolver and the clients behind it.
//!
//! Owns the internal chat transcript shape ([`ChatMessage`]), the provider-neutral request and
//! answer ([`ModelRequest`], [`ModelResponse`]), the provider error keys ([`ModelError`], spec
//! REFERENCE.md §7 "Error keys"), the provider table from config ([`ProviderTable`]), the resolver
//! that turns a reference such as `openrouter/z-ai/glm-5.3` into a client ([`ModelRegistry`],
//! resolver words of §3 `default_model` and §16 `fallback_models`), and two clients:
//! [`scripted::ScriptedProvider`] (deterministic, for tests and `nexus quickstart`) and
//! [`openai::OpenAiCompatibleProvider`] (chat completions over HTTPS with rustls).
//!
//! Does not own: retries, fallback order, budgets and lane floors (the execution actor decides
//! using [`ModelError::key`], [`ModelError::retryable`] and [`ModelError::status`]), the tool
//! wire projection (the declaration module builds [`ModelRequest::tools`]), or persistence.

pub mod config;
pub mod openai;
pub mod registry;
pub mod scripted;

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

pub use self::config::{ModelConfig, ProviderConfig, ProviderKind, ProviderTable};
pub use self::registry::{ConfigError, ModelRegistry, ResolveError, ResolvedModel};
pub use self::scripted::{Script, ScriptError};

/// A boxed, sendable future borrowed for `'a` (the trait below is object safe without
/// `async-trait`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One chat message in the internal, OpenAI-chat-shaped transcript.
///
/// Serialized with a `role` tag: `{"role":"system","content":…}`, `{"role":"user","content":…}`,
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

/// One tool call requested by a model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's call id (scripted: the script's id or `call_{round}_{index}`).
    pub id: String,
    /// The tool's wire name, as the model wrote it (it may name no offered tool).
    pub name: String,
    /// JSON text as the model produced it; not parsed or validated here.
    pub arguments: String,
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
    /// given. Empty means no tools are offered.
    pub tools: Vec<serde_json::Value>,
}

/// A successful model answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The answer text, `None` when the provider sent none.
    pub text: Option<String>,
    /// Tool calls to run; empty for a final answer.
    pub tool_calls: Vec<ToolCall>,
    /// The provider's finish reason as sent (`stop`, `tool_calls`, `length`, …). When the
    /// provider sends none: `tool_calls` if there are tool calls, else `stop`.
    /// `content_filter` never appears here: it is [`ModelError::Refused`].
    pub finish_reason: String,
    /// Token counts, when the provider reports them.
    pub usage: Option<Usage>,
}

/// Token counts of one model call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (OpenAI `usage.prompt_tokens`).
    pub input_tokens: u64,
    /// Generated tokens (OpenAI `usage.completion_tokens`).
    pub output_tokens: u64,
}

/// Why a model call failed. [`ModelError::key`] gives the spec's error key (REFERENCE.md §7).
#[non_exhaustive]
#[derive(thiserror::Error, Debug)]
pub enum ModelError {
    /// The request never got an HTTP answer (connect, TLS, timeout, reset, body read).
    /// Key `provider_http_error`; retryable.
    #[error("provider transport failure: {message}")]
    Transport {
        /// What failed (never contains the credential).
        message: String,
    },
    /// An HTTP error status not covered by a more specific variant (400, 408, 429, 500, …).
    /// Key `provider_http_error`; retryable for 429 and 5xx.
    #[error("provider answered http {status}: {message}")]
    Http {
        /// The HTTP status.
        status: u16,
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
    /// 503, 529, or an `overloaded_error` body. Key `provider_overloaded`; retryable.
    #[error("provider overloaded (http {status:?}): {message}")]
    Overloaded {
        /// The HTTP status, `None` when an otherwise successful body said `overloaded_error`.
        status: Option<u16>,
        /// The provider's error text, shortened.
        message: String,
    },
    /// The prompt does not fit the model (an error body with code `context_length_exceeded`).
    /// Key `provider_context_overflow`; not retryable.
    #[error("provider context overflow (http {status}): {message}")]
    ContextOverflow {
        /// The HTTP status.
        status: u16,
        /// The provider's error text, shortened.
        message: String,
    },
    /// A malformed or abnormal answer (bad JSON, no choice, `finish_reason: error`, an empty
    /// answer), or a scripted provider failure (exhausted script, missing tool result).
    /// Key `provider_error`; not retryable.
    #[error("provider error: {message}")]
    Provider {
        /// What was wrong.
        message: String,
    },
    /// The provider's classifier declined (`finish_reason: content_filter`, or a `refusal`).
    /// Key `model_refused`; not retryable (the fallback list may advance on it).
    #[error("model refused: {message}")]
    Refused {
        /// The refusal text, or the finish reason.
        message: String,
    },
}

impl ModelError {
    /// The spec's error key: `provider_http_error`, `provider_model_unavailable`,
    /// `provider_overloaded`, `provider_context_overflow`, `provider_error` or `model_refused`.
    #[must_use]
    pub fn key(&self) -> &'static str {
        match self {
            Self::Transport { .. } | Self::Http { .. } => "provider_http_error",
            Self::ModelUnavailable { .. } => "provider_model_unavailable",
            Self::Overloaded { .. } => "provider_overloaded",
            Self::ContextOverflow { .. } => "provider_context_overflow",
            Self::Provider { .. } => "provider_error",
            Self::Refused { .. } => "model_refused",
        }
    }

    /// Whether repeating the same request may succeed: transport failures, 429, and every 5xx
    /// (including 503/529 overload). The caller owns the budget and the 429 floor.
    #[must_use]
    pub fn retryable(&self) -> bool {
        match self {
            Self::Transport { .. } | Self::Overloaded { .. } => true,
            Self::Http { status, .. } => *status == 429 || *status >= 500,
            Self::ModelUnavailable { .. }
            | Self::ContextOverflow { .. }
            | Self::Provider { .. }
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
            Self::Overloaded { status, .. } => *status,
            Self::Transport { .. } | Self::Provider { .. } | Self::Refused { .. } => None,
        }
    }
}

/// A client for one provider. Stateless per call: everything the provider needs is in the
/// request, so a call may be repeated or sent to another provider.
pub trait ModelProvider: Send + Sync + std::fmt::Debug {
    /// Sends one request and returns the answer. Bounded by the provider's
    /// `request_timeout_ms`.
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
    }

    #[test]
    fn chat_message_stored_shape() {
        let messages = vec![
            ChatMessage::System { content: "s".into() },
            ChatMessage::User { content: "u".into() },
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![ToolCall { id: "c1".into(), name: "bash".into(), arguments: "{}".into() }],
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
}
