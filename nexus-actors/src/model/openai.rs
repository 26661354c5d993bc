//! The OpenAI-compatible chat-completions adapter (OpenRouter, vLLM, llama.cpp server, Ollama).
//!
//! Wire format, non-streaming:
//! - `POST {base_url}/chat/completions`, `Authorization: Bearer <key>` when the provider has a
//!   key, body `{model, messages, tools?, tool_choice: "auto"?}` (`tools` and `tool_choice` only
//!   when tools are offered).
//! - Messages: `{role:"system"|"user", content}`,
//!   `{role:"assistant", content|null, tool_calls?:[{id, type:"function", function:{name, arguments}}]}`
//!   (`tool_calls` omitted when empty), `{role:"tool", tool_call_id, content}`.
//! - Answer: `choices[0].message.content` (a string, or text parts that are concatenated),
//!   `.tool_calls`, `choices[0].finish_reason`, `usage.prompt_tokens` / `usage.completion_tokens`.
//!
//! Error mapping ([`ModelError`]): no HTTP answer or a timeout -> `Transport`; 503, 529 or an
//! error body of type `overloaded_error` -> `Overloaded`; 401/403/404 -> `ModelUnavailable`; an
//! error body with code `context_length_exceeded` -> `ContextOverflow`; any other non-2xx ->
//! `Http`; a 2xx body that is not JSON, has no choice or message, has a nameless tool call, has
//! neither content nor tool calls, or says `finish_reason: "error"` -> `Provider`; a 2xx body
//! carrying an `error` object is mapped like an HTTP error when its `code` is a 4xx/5xx number,
//! else `Provider`; `finish_reason: "content_filter"` or a `refusal` -> `Refused`.

use std::fmt;
use std::time::Duration;

use serde_json::{Value, json};

use super::registry::ConfigError;
use super::{BoxFuture, ChatMessage, ModelError, ModelProvider, ModelRequest, ModelResponse, ToolCall, Usage};

/// Longest provider error text kept in a [`ModelError`] message, in bytes.
const ERROR_TEXT_LIMIT: usize = 512;

/// The client of one `openai_compatible` provider. One `reqwest` client (rustls) per provider,
/// with the provider's `request_timeout_ms` as the whole-request timeout.
pub struct OpenAiCompatibleProvider {
    provider: String,
    endpoint: reqwest::Url,
    api_key: Option<String>,
    http: reqwest::Client,
}

impl fmt::Debug for OpenAiCompatibleProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiCompatibleProvider")
            .field("provider", &self.provider)
            .field("endpoint", &self.endpoint.as_str())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl OpenAiCompatibleProvider {
    /// A client for `provider` at `base_url` (an absolute `http`/`https` URL; a trailing `/` is
    /// ignored). `api_key`, when present, is sent as a bearer token. `request_timeout` bounds each
    /// call from connect to the last byte of the answer.
    pub fn new(
        provider: impl Into<String>,
        base_url: &str,
        api_key: Option<String>,
        request_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let provider = provider.into();
        let invalid = |reason: String| ConfigError::Invalid { provider: provider.clone(), reason };
        let base = reqwest::Url::parse(base_url).map_err(|error| invalid(format!("base_url `{base_url}`: {error}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(invalid(format!("base_url `{base_url}` must be an http or https URL")));
        }
        if base.query().is_some() || base.fragment().is_some() {
            return Err(invalid(format!("base_url `{base_url}` must have no query or fragment")));
        }
        let endpoint = format!("{}/chat/completions", base.as_str().trim_end_matches('/'));
        let endpoint =
            reqwest::Url::parse(&endpoint).map_err(|error| invalid(format!("base_url `{base_url}`: {error}")))?;
        let http = reqwest::Client::builder()
            .timeout(request_timeout)
            .build()
            .map_err(|source| ConfigError::HttpClient { provider: provider.clone(), source })?;
        Ok(Self { provider, endpoint, api_key, http })
    }

    async fn call(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        tracing::debug!(
            provider = %self.provider,
            model = %request.model,
            messages = request.messages.len(),
            tools = request.tools.len(),
            "chat completion request"
        );
        let mut builder = self.http.post(self.endpoint.clone()).json(&wire_request(&request));
        if let Some(key) = &self.api_key {
            builder = builder.bearer_auth(key);
        }
        let response = builder.send().await.map_err(transport_error)?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(transport_error)?;
        tracing::debug!(provider = %self.provider, status, bytes = body.len(), "chat completion answer");
        if !(200..300).contains(&status) {
            return Err(http_error(status, &ErrorInfo::from_body(&body)));
        }
        parse_answer(&body)
    }
}

impl ModelProvider for OpenAiCompatibleProvider {
    fn complete<'a>(&'a self, request: ModelRequest) -> BoxFuture<'a, Result<ModelResponse, ModelError>> {
        Box::pin(self.call(request))
    }
}

/// The request body (module docs).
fn wire_request(request: &ModelRequest) -> Value {
    let messages: Vec<Value> = request.messages.iter().map(wire_message).collect();
    let mut body = json!({"model": request.model, "messages": messages});
    if !request.tools.is_empty() {
        body["tools"] = Value::Array(request.tools.clone());
        body["tool_choice"] = json!("auto");
    }
    body
}

fn wire_message(message: &ChatMessage) -> Value {
    match message {
        ChatMessage::System { content } => json!({"role": "system", "content": content}),
        ChatMessage::User { content } => json!({"role": "user", "content": content}),
        ChatMessage::Assistant { content, tool_calls } => {
            let mut wire = json!({"role": "assistant", "content": content});
            if !tool_calls.is_empty() {
                wire["tool_calls"] = tool_calls
                    .iter()
                    .map(|call| {
                        json!({
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        })
                    })
                    .collect();
            }
            wire
        }
        ChatMessage::Tool { tool_call_id, content } => {
            json!({"role": "tool", "tool_call_id": tool_call_id, "content": content})
        }
    }
}

fn transport_error(error: reqwest::Error) -> ModelError {
    let mut message = if error.is_timeout() { format!("timed out: {error}") } else { error.to_string() };
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    ModelError::Transport { message }
}

/// What an error body says, from `{"error": {"message", "type", "code"}}`, `{"error": "text"}`
/// or `{"message"}`; the raw text when it is not JSON.
#[derive(Debug, Default)]
struct ErrorInfo {
    message: String,
    kind: Option<String>,
    code: Option<String>,
    numeric_code: Option<u16>,
}

impl ErrorInfo {
    fn from_body(body: &[u8]) -> Self {
        match serde_json::from_slice::<Value>(body) {
            Ok(value) => Self::from_value(&value),
            Err(_) => Self { message: shorten(&String::from_utf8_lossy(body)), ..Self::default() },
        }
    }

    fn from_value(value: &Value) -> Self {
        let error = value.get("error").unwrap_or(value);
        let message = match error {
            Value::String(text) => text.clone(),
            _ => error.get("message").and_then(Value::as_str).map_or_else(|| value.to_string(), str::to_owned),
        };
        let code = error.get("code");
        Self {
            message: shorten(&message),
            kind: error.get("type").and_then(Value::as_str).map(str::to_owned),
            code: code.and_then(Value::as_str).map(str::to_owned),
            numeric_code: code.and_then(Value::as_u64).and_then(|code| u16::try_from(code).ok()),
        }
    }
}

fn http_error(status: u16, info: &ErrorInfo) -> ModelError {
    let message = info.message.clone();
    if matches!(status, 503 | 529) || info.kind.as_deref() == Some("overloaded_error") {
        return ModelError::Overloaded { status: Some(status), message };
    }
    if matches!(status, 401 | 403 | 404) {
        return ModelError::ModelUnavailable { status, message };
    }
    if info.code.as_deref() == Some("context_length_exceeded") {
        return ModelError::ContextOverflow { status, message };
    }
    ModelError::Http { status, message }
}

fn shorten(text: &str) -> String {
    let text = text.trim();
    if text.len() <= ERROR_TEXT_LIMIT {
        return text.to_owned();
    }
    let mut end = ERROR_TEXT_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn provider_error(message: impl Into<String>) -> ModelError {
    ModelError::Provider { message: message.into() }
}

/// Parses a 2xx body (module docs).
fn parse_answer(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|error| provider_error(format!("answer is not JSON: {error}")))?;
    if let Some(error) = value.get("error").filter(|error| !error.is_null()) {
        let info = ErrorInfo::from_value(&json!({"error": error}));
        return Err(match info.numeric_code {
            Some(code) if code >= 400 => http_error(code, &info),
            _ if info.kind.as_deref() == Some("overloaded_error") => {
                ModelError::Overloaded { status: None, message: info.message }
            }
            _ => provider_error(format!("answer carries an error: {}", info.message)),
        });
    }
    let choice = value
        .get("choices")
        .and_then(|choices| choices.get(0))
        .filter(|choice| choice.is_object())
        .ok_or_else(|| provider_error("answer has no choices[0]"))?;
    let message = choice
        .get("message")
        .filter(|message| message.is_object())
        .ok_or_else(|| provider_error("choices[0] has no message"))?;
    let finish_reason = match choice.get("finish_reason") {
        None | Some(Value::Null) => None,
        Some(Value::String(reason)) => Some(reason.clone()),
        Some(other) => {
            return Err(provider_error(format!("finish_reason is not a string: {other}")));
        }
    };
    if let Some(refusal) = message.get("refusal").and_then(Value::as_str).filter(|text| !text.is_empty()) {
        return Err(ModelError::Refused { message: shorten(refusal) });
    }
    match finish_reason.as_deref() {
        Some("content_filter") => {
            return Err(ModelError::Refused { message: "finish_reason content_filter".to_owned() });
        }
        Some("error") => return Err(provider_error("finish_reason error")),
        _ => {}
    }
    let text = parse_content(message.get("content"))?;
    let tool_calls = parse_tool_calls(message.get("tool_calls"))?;
    if text.is_none() && tool_calls.is_empty() {
        return Err(provider_error("answer has neither content nor tool calls"));
    }
    let finish_reason =
        finish_reason.unwrap_or_else(|| if tool_calls.is_empty() { "stop" } else { "tool_calls" }.to_owned());
    let usage = value.get("usage").filter(|usage| usage.is_object()).map(|usage| Usage {
        input_tokens: usage.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
        output_tokens: usage.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0),
    });
    Ok(ModelResponse { text, tool_calls, finish_reason, usage })
}

fn parse_content(content: Option<&Value>) -> Result<Option<String>, ModelError> {
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Array(parts)) => {
            let text: String = parts
                .iter()
                .filter(|part| part.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|part| part.get("text").and_then(Value::as_str))
                .collect();
            Ok(Some(text))
        }
        Some(other) => {
            Err(provider_error(format!("message content has an unexpected shape: {}", shorten(&other.to_string()))))
        }
    }
}

/// Tool calls; an absent or empty id becomes `call_{index}` (some local servers send none).
fn parse_tool_calls(tool_calls: Option<&Value>) -> Result<Vec<ToolCall>, ModelError> {
    let calls = match tool_calls {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(calls)) => calls,
        Some(_) => return Err(provider_error("tool_calls is not an array")),
    };
    calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            let function =
                call.get("function").ok_or_else(|| provider_error(format!("tool_calls[{index}] has no function")))?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .filter(|name| !name.is_empty())
                .ok_or_else(|| provider_error(format!("tool_calls[{index}] has no function name")))?;
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty())
                .map_or_else(|| format!("call_{index}"), str::to_owned);
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => "{}".to_owned(),
                Some(Value::String(text)) => text.clone(),
                Some(other) => other.to_string(),
            };
            Ok(ToolCall { id, name: name.to_owned(), arguments })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, VecDeque};
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode, Uri, header};
    use axum::response::{IntoResponse, Response};

    use super::*;
    use crate::model::config::{ModelConfig, ProviderConfig, ProviderKind, ProviderTable};
    use crate::model::registry::ModelRegistry;

    /// What the fake server answers next.
    struct Reply {
        status: u16,
        body: String,
        delay: Option<Duration>,
    }

    /// What the fake server received.
    #[derive(Debug)]
    struct Seen {
        path: String,
        authorization: Option<String>,
        body: Value,
    }

    #[derive(Default)]
    struct FakeState {
        replies: Mutex<VecDeque<Reply>>,
        seen: Mutex<Vec<Seen>>,
    }

    /// A chat-completions server on 127.0.0.1:0 answering queued replies in order.
    struct FakeServer {
        addr: SocketAddr,
        state: Arc<FakeState>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for FakeServer {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl FakeServer {
        async fn start() -> Self {
            let state = Arc::new(FakeState::default());
            let router = Router::new().fallback(answer).with_state(Arc::clone(&state));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
            let addr = listener.local_addr().expect("local addr");
            let task = tokio::spawn(async move {
                axum::serve(listener, router).await.expect("fake server runs");
            });
            Self { addr, state, task }
        }

        fn reply(&self, status: u16, body: impl Into<String>) {
            self.push(Reply { status, body: body.into(), delay: None });
        }

        fn push(&self, reply: Reply) {
            self.state.replies.lock().expect("lock").push_back(reply);
        }

        fn base_url(&self) -> String {
            format!("http://{}/v1/", self.addr)
        }

        fn provider(&self, api_key: Option<&str>, timeout: Duration) -> OpenAiCompatibleProvider {
            OpenAiCompatibleProvider::new("fake", &self.base_url(), api_key.map(str::to_owned), timeout)
                .expect("client builds")
        }

        fn take_seen(&self) -> Vec<Seen> {
            std::mem::take(&mut *self.state.seen.lock().expect("lock"))
        }
    }

    async fn answer(State(state): State<Arc<FakeState>>, uri: Uri, headers: HeaderMap, body: String) -> Response {
        let authorization =
            headers.get(header::AUTHORIZATION).map(|value| value.to_str().expect("ascii header").to_owned());
        let body = serde_json::from_str(&body).unwrap_or(Value::String(body));
        state.seen.lock().expect("lock").push(Seen { path: uri.path().to_owned(), authorization, body });
        let reply = state.replies.lock().expect("lock").pop_front();
        let Some(reply) = reply else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "no reply queued").into_response();
        };
        if let Some(delay) = reply.delay {
            tokio::time::sleep(delay).await;
        }
        let status = StatusCode::from_u16(reply.status).expect("valid status");
        (status, [(header::CONTENT_TYPE, "application/json")], reply.body).into_response()
    }

    fn user_request(model: &str) -> ModelRequest {
        ModelRequest {
            model: model.to_owned(),
            messages: vec![ChatMessage::User { content: "hi".into() }],
            tools: vec![],
        }
    }

    #[tokio::test]
    async fn text_answer() {
        let server = FakeServer::start().await;
        server.reply(
            200,
            json!({
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
            })
            .to_string(),
        );
        let provider = server.provider(Some("sk-test"), Duration::from_secs(10));
        let answer = provider.complete(user_request("z-ai/glm-5.3")).await.expect("answer");
        assert_eq!(
            answer,
            ModelResponse {
                text: Some("Hello!".into()),
                tool_calls: vec![],
                finish_reason: "stop".into(),
                usage: Some(Usage { input_tokens: 12, output_tokens: 3 }),
            }
        );
        let seen = server.take_seen();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].path, "/v1/chat/completions");
        assert_eq!(seen[0].authorization.as_deref(), Some("Bearer sk-test"));
        assert_eq!(seen[0].body, json!({"model": "z-ai/glm-5.3", "messages": [{"role": "user", "content": "hi"}]}));
    }

    #[tokio::test]
    async fn tool_call_answer_and_request_wire_shape() {
        let server = FakeServer::start().await;
        server.reply(
            200,
            json!({
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": null,
                    "tool_calls": [
                        {"id": "call_abc", "type": "function",
                         "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}},
                        {"type": "function", "function": {"name": "read", "arguments": {"path": "a"}}}
                    ]}}]
            })
            .to_string(),
        );
        let tool = json!({"type": "function", "strict": false, "function": {
            "name": "bash", "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}});
        let request = ModelRequest {
            model: "local-model".into(),
            messages: vec![
                ChatMessage::System { content: "sys".into() },
                ChatMessage::User { content: "list files".into() },
                ChatMessage::Assistant {
                    content: Some("checking".into()),
                    tool_calls: vec![ToolCall {
                        id: "c0".into(),
                        name: "bash".into(),
                        arguments: "{\"command\":\"pwd\"}".into(),
                    }],
                },
                ChatMessage::Tool { tool_call_id: "c0".into(), content: "exit_code: 0\nstdout:\n/work\n".into() },
                ChatMessage::Assistant { content: Some("in /work".into()), tool_calls: vec![] },
                ChatMessage::User { content: "now ls".into() },
            ],
            tools: vec![tool.clone()],
        };
        let provider = server.provider(None, Duration::from_secs(10));
        let answer = provider.complete(request).await.expect("answer");
        assert_eq!(answer.text, None);
        assert_eq!(answer.finish_reason, "tool_calls");
        assert_eq!(answer.usage, None);
        assert_eq!(
            answer.tool_calls,
            vec![
                ToolCall { id: "call_abc".into(), name: "bash".into(), arguments: "{\"command\":\"ls\"}".into() },
                ToolCall { id: "call_1".into(), name: "read".into(), arguments: "{\"path\":\"a\"}".into() },
            ]
        );
        let seen = server.take_seen();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].authorization, None, "no key, no header");
        assert_eq!(
            seen[0].body,
            json!({
                "model": "local-model",
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "list files"},
                    {"role": "assistant", "content": "checking", "tool_calls": [
                        {"id": "c0", "type": "function",
                         "function": {"name": "bash", "arguments": "{\"command\":\"pwd\"}"}}]},
                    {"role": "tool", "tool_call_id": "c0", "content": "exit_code: 0\nstdout:\n/work\n"},
                    {"role": "assistant", "content": "in /work"},
                    {"role": "user", "content": "now ls"}
                ],
                "tools": [tool],
                "tool_choice": "auto"
            })
        );
    }

    #[tokio::test]
    async fn error_answers_map_to_spec_keys() {
        let ok_choice = |finish: &str| {
            json!({"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": finish}]})
                .to_string()
        };
        let rows: Vec<(&str, u16, String, &str, bool)> = vec![
            ("not_found", 404, json!({"error": {"message": "no such model"}}).to_string(), "provider_model_unavailable", false),
            ("unauthorized", 401, "bad key".into(), "provider_model_unavailable", false),
            ("forbidden", 403, String::new(), "provider_model_unavailable", false),
            ("unavailable", 503, json!({"error": {"message": "busy"}}).to_string(), "provider_overloaded", true),
            ("overloaded_529", 529, json!({"type": "error", "error": {"type": "overloaded_error"}}).to_string(), "provider_overloaded", true),
            ("rate_limited", 429, json!({"error": {"message": "slow down"}}).to_string(), "provider_http_error", true),
            ("server_error", 500, "oops".into(), "provider_http_error", true),
            ("bad_request", 400, json!({"error": {"message": "bad"}}).to_string(), "provider_http_error", false),
            (
                "context_overflow",
                400,
                json!({"error": {"message": "too long", "code": "context_length_exceeded"}}).to_string(),
                "provider_context_overflow",
                false,
            ),
            ("malformed_json", 200, "{\"choices\": [".into(), "provider_error", false),
            ("no_choices", 200, json!({"choices": []}).to_string(), "provider_error", false),
            ("finish_error", 200, ok_choice("error"), "provider_error", false),
            (
                "empty_answer",
                200,
                json!({"choices": [{"message": {"role": "assistant", "content": null}, "finish_reason": "stop"}]}).to_string(),
                "provider_error",
                false,
            ),
            ("content_filter", 200, ok_choice("content_filter"), "model_refused", false),
            (
                "refusal",
                200,
                json!({"choices": [{"message": {"role": "assistant", "content": null, "refusal": "no"}, "finish_reason": "stop"}]})
                    .to_string(),
                "model_refused",
                false,
            ),
            (
                "error_in_ok_body",
                200,
                json!({"error": {"code": 502, "message": "upstream died"}}).to_string(),
                "provider_http_error",
                true,
            ),
            (
                "nameless_tool_call",
                200,
                json!({"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "a", "function": {}}]}}]})
                    .to_string(),
                "provider_error",
                false,
            ),
        ];
        let server = FakeServer::start().await;
        let provider = server.provider(Some("k"), Duration::from_secs(10));
        for (name, status, body, key, retryable) in rows {
            server.reply(status, body);
            let error = provider.complete(user_request("m")).await.expect_err(name);
            assert_eq!(error.key(), key, "{name}: {error}");
            assert_eq!(error.retryable(), retryable, "{name}: {error}");
            if status != 200 {
                assert_eq!(error.status(), Some(status), "{name}");
            }
        }
        assert_eq!(server.take_seen().len(), 17, "one request per row, no hidden retries");
    }

    #[tokio::test]
    async fn timeout_is_a_retryable_transport_failure() {
        let server = FakeServer::start().await;
        server.push(Reply { status: 200, body: "{}".into(), delay: Some(Duration::from_secs(30)) });
        let provider = server.provider(None, Duration::from_millis(200));
        let error = provider.complete(user_request("m")).await.expect_err("times out");
        assert!(matches!(error, ModelError::Transport { .. }), "{error:?}");
        assert_eq!(error.key(), "provider_http_error");
        assert!(error.retryable());
        assert_eq!(error.status(), None);
    }

    #[tokio::test]
    async fn registry_resolves_to_a_working_client_with_the_configured_key() {
        let server = FakeServer::start().await;
        let mut table = ProviderTable::default();
        table.providers.insert(
            "fake".into(),
            ProviderConfig {
                base_url: Some(server.base_url()),
                api_key_env: Some("FAKE_KEY".into()),
                models: BTreeMap::from([("org/model-1".into(), ModelConfig::default())]),
                request_timeout_ms: 10_000,
                ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
            },
        );
        let registry = ModelRegistry::new(table, |name| (name == "FAKE_KEY").then(|| "sk-fake".to_owned()))
            .expect("table is valid");
        let resolved = registry.resolve("fake/org/model-1").expect("resolves");
        assert_eq!(resolved.model, "org/model-1");
        server.reply(
            200,
            json!({"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}]})
                .to_string(),
        );
        let answer = resolved.client.complete(user_request(&resolved.model)).await.expect("answer");
        assert_eq!(answer.text.as_deref(), Some("ab"));
        assert_eq!(answer.finish_reason, "stop");
        let seen = server.take_seen();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].authorization.as_deref(), Some("Bearer sk-fake"));
        assert_eq!(seen[0].body["model"], "org/model-1");
        assert!(!format!("{:?}", resolved.client).contains("sk-fake"));
    }
}
