//! The OpenAI-compatible chat-completions adapter (OpenRouter, vLLM, llama.cpp server, Ollama).
//!
//! Wire format:
//! - `POST {base_url}/chat/completions`, `Authorization: Bearer <key>` when the provider has a
//!   key, body `{model, messages, tools?, tool_choice: "auto"?, max_tokens?, stream?,
//!   stream_options?}` (`tools` and `tool_choice` only when tools are offered, `max_tokens` only
//!   when configured; streaming adds `stream: true` and `stream_options: {include_usage: true}`).
//! - Messages: `{role:"system"|"developer"|"user", content}`, where adjacent `system` or
//!   `developer` messages of one role (the prompt's documents) are joined into one whose
//!   `content` is their text parts `[{type:"text", text}, …]`, each document remaining its own
//!   part (a lone message keeps a string `content`; user messages are never joined);
//!   `{role:"assistant", content|null, tool_calls?:[{id, type:"function", function:{name, arguments}}]}`
//!   (`tool_calls` omitted when empty), `{role:"tool", tool_call_id, content}`.
//! - A whole answer (`application/json`, also accepted when streaming was asked and the server
//!   ignored it): `choices[0].message.content` (a string, or text parts that are concatenated),
//!   `.refusal`, `.tool_calls`, `choices[0].finish_reason`, `usage.prompt_tokens` /
//!   `usage.completion_tokens`.
//! - A streamed answer (`text/event-stream`): `data: {choices:[{delta:{content?, refusal?,
//!   tool_calls?:[{index, id?, function:{name?, arguments?}}]}, finish_reason?}], usage?}` chunks,
//!   then `data: [DONE]`. Text is reported as `text_delta`, a call's first name as
//!   `tool_call_started`, argument pieces as `tool_call_arguments_delta`; pieces are assembled
//!   by `index` into the same [`ModelResponse`] a whole answer gives. A stream that ends with
//!   neither a finish reason nor `[DONE]` was cut: `Transport` (retryable).
//!
//! Error mapping ([`ModelError`]): no HTTP answer, a timeout or a cut stream -> `Transport`;
//! non-2xx -> as in the shared wire rules (503/529/`overloaded_error` -> `Overloaded`, 429 ->
//! `RateLimited` with `Retry-After`, 401/403/404 -> `ModelUnavailable`, context length ->
//! `ContextOverflow`, else `Http`); an `error` object in a 2xx body or a stream chunk -> its
//! numeric `code` as a status, else `Provider`; a non-empty `refusal` -> `Refused` (the
//! classifier declined); `finish_reason: "content_filter"` without a refusal -> `Blocked` (a
//! content block); `finish_reason: "error"`, malformed JSON, no choice, a nameless tool call, or
//! neither content nor tool calls -> `Provider`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde_json::{Value, json};

use super::bounds::{
    ANSWER_TEXT_BOUND, CALL_ARGUMENTS_KEPT, CALL_NAME_KEPT, check_text_len, count_reasoning, push_capped,
};
use super::registry::ConfigError;
use super::wire::{Answer, ErrorInfo, endpoint, http_client, provider_error, read_events, send, shorten, stream_cut};
use super::{
    BoxFuture, ChatMessage, DeltaSink, ModelError, ModelProvider, ModelRequest, ModelResponse, ToolCall,
    TranscriptDelta, Usage,
};

/// Where OpenAI-compatible servers put a model's reasoning (vLLM, DeepSeek: `reasoning_content`;
/// OpenRouter, Ollama: `reasoning`): counted to its bound, never kept ([`super::bounds`]).
const REASONING_KEYS: [&str; 2] = ["reasoning_content", "reasoning"];

/// The client of one `openai_compatible` provider. One `reqwest` client (rustls) per provider,
/// with the provider's `request_timeout_ms` as the whole-request timeout (streamed body included).
pub struct OpenAiCompatibleProvider {
    provider: String,
    endpoint: reqwest::Url,
    api_key: Option<String>,
    stream: bool,
    max_tokens: Option<u32>,
    http: reqwest::Client,
}

impl fmt::Debug for OpenAiCompatibleProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiCompatibleProvider")
            .field("provider", &self.provider)
            .field("endpoint", &self.endpoint.as_str())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl OpenAiCompatibleProvider {
    /// A streaming client for `provider` at `base_url` (an absolute `http`/`https` URL; a trailing
    /// `/` is ignored). `api_key`, when present, is sent as a bearer token. `request_timeout`
    /// bounds each call from connect to the last byte of the answer.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a bad `base_url`, [`ConfigError::HttpClient`] when rustls
    /// cannot be set up.
    pub fn new(
        provider: impl Into<String>,
        base_url: &str,
        api_key: Option<String>,
        request_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let provider = provider.into();
        let endpoint = endpoint(&provider, base_url, "chat/completions")?;
        let http = http_client(&provider, request_timeout)?;
        Ok(Self { provider, endpoint, api_key, stream: true, max_tokens: None, http })
    }

    /// Asks for a streamed answer (`true`, the default) or a whole one.
    #[must_use]
    pub fn with_stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Sends `max_tokens` (output tokens) with every request; `None` (the default) sends none.
    #[must_use]
    pub fn with_max_tokens(mut self, max_tokens: Option<u32>) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    async fn call(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        tracing::debug!(
            provider = %self.provider,
            model = %request.model,
            messages = request.messages.len(),
            tools = request.tools.len(),
            stream = self.stream,
            "chat completion request"
        );
        let mut builder =
            self.http.post(self.endpoint.clone()).json(&wire_request(&request, self.stream, self.max_tokens));
        if let Some(key) = &self.api_key {
            builder = builder.bearer_auth(key);
        }
        let response = match send(&self.provider, "chat completion", builder).await? {
            Answer::Whole(body) => return parse_answer(&body),
            Answer::Events(response) => response,
        };
        let mut stream = StreamAnswer::new(request.deltas.clone());
        read_events(response, |event| stream.event(&event.data)).await?;
        stream.finish()
    }
}

impl ModelProvider for OpenAiCompatibleProvider {
    fn complete<'a>(&'a self, request: ModelRequest) -> BoxFuture<'a, Result<ModelResponse, ModelError>> {
        Box::pin(self.call(request))
    }
}

/// The request body (module docs).
fn wire_request(request: &ModelRequest, stream: bool, max_tokens: Option<u32>) -> Value {
    let messages = join_adjacent(request.messages.iter().map(wire_message).collect());
    let mut body = json!({"model": request.model, "messages": messages});
    if !request.tools.is_empty() {
        body["tools"] = Value::Array(request.tools.clone());
        body["tool_choice"] = json!("auto");
    }
    if let Some(max_tokens) = max_tokens {
        body["max_tokens"] = json!(max_tokens);
    }
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// Joins adjacent `system` or `developer` messages of one role into one message of text parts
/// (module docs).
fn join_adjacent(messages: Vec<Value>) -> Vec<Value> {
    let joinable = |m: &Value| matches!(m["role"].as_str(), Some("system" | "developer"));
    let part = |content: &Value| match content {
        Value::Array(parts) => parts.clone(),
        other => vec![json!({"type": "text", "text": other})],
    };
    let mut out: Vec<Value> = Vec::with_capacity(messages.len());
    for message in messages {
        if let Some(last) = out.last_mut()
            && joinable(&message)
            && last["role"] == message["role"]
        {
            let mut parts = part(&last["content"]);
            parts.extend(part(&message["content"]));
            last["content"] = Value::Array(parts);
            continue;
        }
        out.push(message);
    }
    out
}

fn wire_message(message: &ChatMessage) -> Value {
    match message {
        ChatMessage::System { content } => json!({"role": "system", "content": content}),
        ChatMessage::Developer { content } => json!({"role": "developer", "content": content}),
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

/// Parses a whole 2xx body (module docs).
fn parse_answer(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|error| provider_error(format!("answer is not JSON: {error}")))?;
    if let Some(error) = value.get("error").filter(|error| !error.is_null()) {
        return Err(ErrorInfo::in_answer(error));
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
    let finish_reason = parse_finish_reason(choice.get("finish_reason"))?;
    let mut reasoning = 0;
    for key in REASONING_KEYS {
        count_reasoning(&mut reasoning, message.get(key).and_then(Value::as_str).unwrap_or_default())?;
    }
    let refusal = message.get("refusal").and_then(Value::as_str).unwrap_or_default();
    judge_finish(refusal, finish_reason.as_deref())?;
    let text = parse_content(message.get("content"))?;
    let tool_calls = parse_tool_calls(message.get("tool_calls"))?;
    answer(text, tool_calls, finish_reason, value.get("usage").and_then(parse_usage))
}

fn parse_finish_reason(value: Option<&Value>) -> Result<Option<String>, ModelError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(reason)) => Ok(Some(reason.clone())),
        Some(other) => Err(provider_error(format!("finish_reason is not a string: {other}"))),
    }
}

/// A refusal is the classifier's word and wins over the finish reason; a content filter without
/// one is a content block.
fn judge_finish(refusal: &str, finish_reason: Option<&str>) -> Result<(), ModelError> {
    if !refusal.trim().is_empty() {
        return Err(ModelError::Refused { message: shorten(refusal) });
    }
    match finish_reason {
        Some("content_filter") => Err(ModelError::Blocked { message: "finish_reason content_filter".to_owned() }),
        Some("error") => Err(provider_error("finish_reason error")),
        _ => Ok(()),
    }
}

fn answer(
    text: Option<String>,
    tool_calls: Vec<ToolCall>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
) -> Result<ModelResponse, ModelError> {
    if text.is_none() && tool_calls.is_empty() {
        return Err(provider_error("answer has neither content nor tool calls"));
    }
    let finish_reason =
        finish_reason.unwrap_or_else(|| if tool_calls.is_empty() { "stop" } else { "tool_calls" }.to_owned());
    Ok(ModelResponse { text, tool_calls, finish_reason, usage })
}

fn parse_usage(usage: &Value) -> Option<Usage> {
    usage.is_object().then(|| Usage {
        input_tokens: usage.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
        output_tokens: usage.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0),
    })
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
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => "{}".to_owned(),
                Some(Value::String(text)) => text.clone(),
                Some(other) => other.to_string(),
            };
            Ok(ToolCall { id: call_id(call.get("id"), index), name: name.to_owned(), arguments, model_id: None })
        })
        .collect()
}

fn call_id(id: Option<&Value>, index: usize) -> String {
    id.and_then(Value::as_str).filter(|id| !id.is_empty()).map_or_else(|| format!("call_{index}"), str::to_owned)
}

/// A tool call being assembled from stream chunks.
#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
    started: bool,
}

/// The assembly of one streamed answer (module docs).
#[derive(Debug)]
struct StreamAnswer {
    deltas: Option<DeltaSink>,
    text: Option<String>,
    refusal: String,
    /// By the provider's `index`, which orders the calls.
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    done: bool,
    /// Reasoning bytes read, counted to their bound and never kept.
    reasoning: usize,
}

impl StreamAnswer {
    fn new(deltas: Option<DeltaSink>) -> Self {
        Self {
            deltas,
            text: None,
            refusal: String::new(),
            calls: BTreeMap::new(),
            finish_reason: None,
            usage: None,
            done: false,
            reasoning: 0,
        }
    }

    fn emit(&self, delta: TranscriptDelta) {
        if let Some(sink) = &self.deltas {
            sink.send(delta);
        }
    }

    /// One `data:` payload; `Ok(true)` at `[DONE]`.
    fn event(&mut self, data: &str) -> Result<bool, ModelError> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let chunk: Value =
            serde_json::from_str(data).map_err(|error| provider_error(format!("stream chunk is not JSON: {error}")))?;
        if let Some(error) = chunk.get("error").filter(|error| !error.is_null()) {
            return Err(ErrorInfo::in_answer(error));
        }
        if let Some(usage) = chunk.get("usage").and_then(parse_usage) {
            self.usage = Some(usage);
        }
        let Some(choice) = chunk.get("choices").and_then(|choices| choices.get(0)) else {
            return Ok(false);
        };
        if let Some(reason) = parse_finish_reason(choice.get("finish_reason"))? {
            self.finish_reason = Some(reason);
        }
        let Some(delta) = choice.get("delta").filter(|delta| delta.is_object()) else {
            return Ok(false);
        };
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            let kept = self.text.get_or_insert_with(String::new);
            kept.push_str(text);
            check_text_len(kept)?;
            if !text.is_empty() {
                self.emit(TranscriptDelta::Text { text: text.to_owned() });
            }
        }
        if let Some(refusal) = delta.get("refusal").and_then(Value::as_str) {
            push_capped(&mut self.refusal, refusal, ANSWER_TEXT_BOUND);
        }
        for key in REASONING_KEYS {
            if let Some(reasoning) = delta.get(key).and_then(Value::as_str) {
                count_reasoning(&mut self.reasoning, reasoning)?;
            }
        }
        match delta.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(calls)) => {
                for (position, call) in calls.iter().enumerate() {
                    self.tool_call_piece(position, call);
                }
            }
            Some(_) => return Err(provider_error("stream delta tool_calls is not an array")),
        }
        Ok(false)
    }

    fn tool_call_piece(&mut self, position: usize, piece: &Value) {
        let index = piece.get("index").and_then(Value::as_u64).unwrap_or(position as u64);
        let ordinal = self.calls.range(..index).count();
        let call = self.calls.entry(index).or_default();
        if let Some(id) = piece.get("id").and_then(Value::as_str).filter(|id| !id.is_empty()) {
            id.clone_into(&mut call.id);
        }
        let function = piece.get("function");
        if let Some(name) = function.and_then(|f| f.get("name")).and_then(Value::as_str)
            && !call.started
        {
            push_capped(&mut call.name, name, CALL_NAME_KEPT * 4);
        }
        let arguments = match function.and_then(|f| f.get("arguments")) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
        };
        push_capped(&mut call.arguments, &arguments, CALL_ARGUMENTS_KEPT);
        let mut deltas = Vec::new();
        if !call.started && !call.name.is_empty() {
            call.started = true;
            if call.id.is_empty() {
                call.id = format!("call_{ordinal}");
            }
            deltas.push(TranscriptDelta::ToolCallStarted {
                index: ordinal,
                tool_call_id: call.id.clone(),
                name: call.name.clone(),
            });
            if !call.arguments.is_empty() {
                deltas.push(TranscriptDelta::ToolCallArguments { index: ordinal, delta: call.arguments.clone() });
            }
        } else if call.started && !arguments.is_empty() {
            deltas.push(TranscriptDelta::ToolCallArguments { index: ordinal, delta: arguments });
        }
        for delta in deltas {
            self.emit(delta);
        }
    }

    /// The assembled answer, judged as a whole answer is.
    fn finish(self) -> Result<ModelResponse, ModelError> {
        if !self.done && self.finish_reason.is_none() {
            return Err(stream_cut("its finish_reason or [DONE]"));
        }
        judge_finish(&self.refusal, self.finish_reason.as_deref())?;
        let tool_calls = self
            .calls
            .into_values()
            .enumerate()
            .map(|(ordinal, call)| {
                if call.name.is_empty() {
                    return Err(provider_error(format!("streamed tool call {ordinal} has no function name")));
                }
                let arguments = if call.arguments.trim().is_empty() { "{}".to_owned() } else { call.arguments };
                let id = if call.id.is_empty() { format!("call_{ordinal}") } else { call.id };
                Ok(ToolCall { id, name: call.name, arguments, model_id: None })
            })
            .collect::<Result<Vec<_>, _>>()?;
        answer(self.text, tool_calls, self.finish_reason, self.usage)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::model::config::{ModelConfig, ProviderConfig, ProviderKind, ProviderTable};
    use crate::model::fake_http::{FakeServer, Reply};
    use crate::model::registry::ModelRegistry;

    #[test]
    fn documents_keep_their_roles_and_adjacent_ones_join_as_parts() {
        let request = ModelRequest {
            model: "m".into(),
            messages: vec![
                ChatMessage::System { content: "rules".into() },
                ChatMessage::System { content: "more rules".into() },
                ChatMessage::Developer { content: "be brief".into() },
                ChatMessage::User { content: "a".into() },
                ChatMessage::User { content: "b".into() },
            ],
            ..ModelRequest::default()
        };
        assert_eq!(
            wire_request(&request, false, None)["messages"],
            json!([
                {"role": "system", "content": [{"type": "text", "text": "rules"}, {"type": "text", "text": "more rules"}]},
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": "a"},
                {"role": "user", "content": "b"}
            ])
        );
    }

    trait OpenAiFake {
        fn base_url(&self) -> String;
        fn provider(&self, api_key: Option<&str>, timeout: Duration) -> OpenAiCompatibleProvider;
    }

    impl OpenAiFake for FakeServer {
        fn base_url(&self) -> String {
            self.url("/v1/")
        }

        /// A client asking for whole answers.
        fn provider(&self, api_key: Option<&str>, timeout: Duration) -> OpenAiCompatibleProvider {
            OpenAiCompatibleProvider::new("fake", &self.base_url(), api_key.map(str::to_owned), timeout)
                .expect("client builds")
                .with_stream(false)
        }
    }

    fn user_request(model: &str) -> ModelRequest {
        ModelRequest {
            model: model.to_owned(),
            messages: vec![ChatMessage::User { content: "hi".into() }],
            ..ModelRequest::default()
        }
    }

    /// A sink that keeps what it is given.
    fn recording_sink() -> (DeltaSink, Arc<Mutex<Vec<TranscriptDelta>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&seen);
        (DeltaSink::new(move |delta| keep.lock().expect("lock").push(delta)), seen)
    }

    /// An SSE body of `data:` lines.
    fn sse(chunks: &[Value], done: bool) -> String {
        let mut body: String = chunks.iter().map(|chunk| format!("data: {chunk}\n\n")).collect();
        if done {
            body.push_str("data: [DONE]\n\n");
        }
        body
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
        assert_eq!(seen[0].header("authorization"), Some("Bearer sk-test"));
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
                        model_id: None,
                    }],
                },
                ChatMessage::Tool { tool_call_id: "c0".into(), content: "exit_code: 0\nstdout:\n/work\n".into() },
                ChatMessage::Assistant { content: Some("in /work".into()), tool_calls: vec![] },
                ChatMessage::User { content: "now ls".into() },
            ],
            tools: vec![tool.clone()],
            deltas: None,
        };
        let provider = server.provider(None, Duration::from_secs(10));
        let answer = provider.complete(request).await.expect("answer");
        assert_eq!(answer.text, None);
        assert_eq!(answer.finish_reason, "tool_calls");
        assert_eq!(answer.usage, None);
        assert_eq!(
            answer.tool_calls,
            vec![
                ToolCall {
                    id: "call_abc".into(),
                    name: "bash".into(),
                    arguments: "{\"command\":\"ls\"}".into(),
                    model_id: None
                },
                ToolCall {
                    id: "call_1".into(),
                    name: "read".into(),
                    arguments: "{\"path\":\"a\"}".into(),
                    model_id: None
                },
            ]
        );
        let seen = server.take_seen();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].header("authorization"), None, "no key, no header");
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
            ("content_filter_is_a_content_block", 200, ok_choice("content_filter"), "provider_error", false),
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
        server.push(Reply { delay: Some(Duration::from_secs(30)), ..Reply::json(200, "{}") });
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
        assert_eq!(seen[0].header("authorization"), Some("Bearer sk-fake"));
        assert_eq!(seen[0].body["model"], "org/model-1");
        assert!(!format!("{:?}", resolved.client).contains("sk-fake"));
    }

    fn streaming(server: &FakeServer) -> OpenAiCompatibleProvider {
        OpenAiCompatibleProvider::new("fake", &server.base_url(), None, Duration::from_secs(10))
            .expect("client builds")
            .with_max_tokens(Some(256))
    }

    #[tokio::test]
    async fn streamed_text_and_tool_calls_are_assembled_and_reported_as_deltas() {
        let server = FakeServer::start().await;
        let delta = |delta: Value| json!({"choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
        server.push(Reply::sse(sse(
            &[
                delta(json!({"role": "assistant", "content": ""})),
                delta(json!({"content": "Let me "})),
                delta(json!({"content": "look."})),
                delta(json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                    "function": {"name": "bash", "arguments": ""}}]})),
                delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"comm"}}]})),
                delta(json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                    "function": {"name": "read_file", "arguments": "{\"path\":"}}]})),
                delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "and\":\"ls\"}"}}]})),
                delta(json!({"tool_calls": [{"index": 1, "function": {"arguments": "\"a.txt\"}"}}]})),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
                json!({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 9}}),
            ],
            true,
        )));
        let (sink, seen) = recording_sink();
        let request = ModelRequest { deltas: Some(sink), ..user_request("m") };
        let answer = streaming(&server).complete(request).await.expect("answer");
        assert_eq!(
            answer,
            ModelResponse {
                text: Some("Let me look.".into()),
                tool_calls: vec![
                    ToolCall {
                        id: "call_a".into(),
                        name: "bash".into(),
                        arguments: "{\"command\":\"ls\"}".into(),
                        model_id: None
                    },
                    ToolCall {
                        id: "call_b".into(),
                        name: "read_file".into(),
                        arguments: "{\"path\":\"a.txt\"}".into(),
                        model_id: None,
                    },
                ],
                finish_reason: "tool_calls".into(),
                usage: Some(Usage { input_tokens: 40, output_tokens: 9 }),
            }
        );
        let text = |t: &str| TranscriptDelta::Text { text: t.into() };
        let args = |index: usize, d: &str| TranscriptDelta::ToolCallArguments { index, delta: d.into() };
        let started = |index: usize, id: &str, name: &str| TranscriptDelta::ToolCallStarted {
            index,
            tool_call_id: id.into(),
            name: name.into(),
        };
        assert_eq!(
            *seen.lock().expect("lock"),
            vec![
                text("Let me "),
                text("look."),
                started(0, "call_a", "bash"),
                args(0, "{\"comm"),
                started(1, "call_b", "read_file"),
                args(1, "{\"path\":"),
                args(0, "and\":\"ls\"}"),
                args(1, "\"a.txt\"}"),
            ]
        );
        let sent = server.take_seen();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].body["stream"], json!(true));
        assert_eq!(sent[0].body["stream_options"], json!({"include_usage": true}));
        assert_eq!(sent[0].body["max_tokens"], json!(256));
    }

    #[tokio::test]
    async fn a_streaming_request_accepts_a_whole_answer() {
        let server = FakeServer::start().await;
        server.reply(200, json!({"choices": [{"message": {"content": "whole"}, "finish_reason": "stop"}]}).to_string());
        let (sink, seen) = recording_sink();
        let answer = streaming(&server)
            .complete(ModelRequest { deltas: Some(sink), ..user_request("m") })
            .await
            .expect("answer");
        assert_eq!(answer.text.as_deref(), Some("whole"));
        assert!(seen.lock().expect("lock").is_empty(), "a whole answer streams nothing");
    }

    #[tokio::test]
    async fn streamed_failures_map_to_spec_keys() {
        let text = |t: &str| json!({"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": null}]});
        let finish = |reason: &str| json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]});
        let rows: Vec<(&str, String, &str, bool, Option<&str>)> = vec![
            (
                "refusal_deltas",
                sse(
                    &[
                        json!({"choices": [{"index": 0, "delta": {"refusal": "I can't"}, "finish_reason": null}]}),
                        json!({"choices": [{"index": 0, "delta": {"refusal": " help."}, "finish_reason": null}]}),
                        finish("stop"),
                    ],
                    true,
                ),
                "model_refused",
                false,
                Some("refused"),
            ),
            (
                "content_filter",
                sse(&[text("par"), finish("content_filter")], true),
                "provider_error",
                false,
                Some("blocked"),
            ),
            ("finish_error", sse(&[text("x"), finish("error")], true), "provider_error", false, Some("error")),
            ("cut_mid_stream", sse(&[text("half an ans")], false), "provider_http_error", true, None),
            ("cut_before_anything", String::new(), "provider_http_error", true, None),
            (
                "error_chunk_with_status",
                sse(&[text("x"), json!({"error": {"code": 502, "message": "upstream"}})], false),
                "provider_http_error",
                true,
                None,
            ),
            (
                "overloaded_chunk",
                sse(&[json!({"error": {"type": "overloaded_error", "message": "busy"}})], false),
                "provider_overloaded",
                true,
                None,
            ),
            ("malformed_chunk", "data: {\"choices\": [\n\n".to_owned(), "provider_error", false, Some("error")),
            ("empty_answer", sse(&[finish("stop")], true), "provider_error", false, Some("error")),
        ];
        let server = FakeServer::start().await;
        let provider = streaming(&server);
        for (name, body, key, retryable, quality) in rows {
            server.push(Reply::sse(body));
            let error = provider.complete(user_request("m")).await.expect_err(name);
            assert_eq!(error.key(), key, "{name}: {error}");
            assert_eq!(error.retryable(), retryable, "{name}: {error}");
            assert_eq!(error.finish_quality(), quality, "{name}: {error}");
        }
    }

    #[tokio::test]
    async fn rate_limit_carries_retry_after() {
        let server = FakeServer::start().await;
        server.push(Reply {
            headers: vec![("retry-after", "7".into())],
            ..Reply::json(429, json!({"error": {"message": "slow down"}}).to_string())
        });
        let error = streaming(&server).complete(user_request("m")).await.expect_err("429");
        assert!(
            matches!(error, ModelError::RateLimited { retry_after: Some(wait), .. } if wait == Duration::from_secs(7)),
            "{error:?}"
        );
        assert_eq!(error.status(), Some(429));
        assert!(error.retryable());
    }
}
