//! The Anthropic Messages adapter.
//!
//! Wire format:
//! - `POST {base_url}/v1/messages` (a `base_url` already ending in `/v1` gets `/messages`), headers
//!   `x-api-key: <key>` (when the provider has a key) and `anthropic-version: <version>`
//!   (default [`DEFAULT_ANTHROPIC_VERSION`]), body `{model, max_tokens, system?, messages, tools?,
//!   stream?}`.
//! - Our transcript maps onto it: every `system` and `developer` message (each prompt document)
//!   is one `{type:"text", text}` block of the top-level `system` array, in order;
//!   `user` text is a `text` block; an assistant turn is its `text` block plus one
//!   `{type:"tool_use", id, name, input}` per call (`input` is the call's JSON object; arguments
//!   that are not an object are sent as `{}`, the task already failed with
//!   `invalid_tool_arguments`); a tool result is `{type:"tool_result", tool_use_id, content}` in
//!   a `user` turn. Consecutive messages of one role merge into one turn, so the results of one
//!   round travel together; empty text is left out. Call ids outside `[A-Za-z0-9_-]` have those
//!   characters replaced by `_` on both sides.
//! - Tools: each OpenAI-shaped entry `{type:"function", function:{name, description,
//!   parameters}}` is sent as `{name, description?, input_schema}` (`input_schema` defaults to an
//!   empty object schema).
//! - A whole answer: `content[]` blocks (`text` concatenated, `tool_use` as calls, others
//!   ignored), `stop_reason`, `usage`.
//! - A streamed answer (`text/event-stream`): `message_start` (input usage), `content_block_start`
//!   (`text`, or `tool_use` -> `tool_call_started`), `content_block_delta` (`text_delta` ->
//!   `text_delta`, `input_json_delta` -> `tool_call_arguments_delta`; thinking is counted to its
//!   bound and never kept, signature deltas are ignored), `content_block_stop`, `message_delta` (`stop_reason`, output usage),
//!   `message_stop`, `ping`, and `error`. A stream that ends before `message_stop` and without a
//!   `stop_reason` was cut: `Transport` (retryable).
//!
//! `stop_reason` mapping to [`ModelResponse::finish_reason`]: `end_turn`, `stop_sequence` and
//! `pause_turn` -> `stop`; `tool_use` -> `tool_calls`; `max_tokens` and
//! `model_context_window_exceeded` -> `length`; `refusal` -> [`ModelError::Refused`] (the
//! classifier declined); any other word is kept. Errors (HTTP statuses, error bodies and stream
//! `error` events) map as the shared wire rules say: 529 or `overloaded_error` -> `Overloaded`,
//! 429 or `rate_limit_error` -> `RateLimited`, 401/403/404 -> `ModelUnavailable`, `prompt is too
//! long` -> `ContextOverflow`, others by their documented status.

use std::fmt;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::bounds::{CALL_ARGUMENTS_KEPT, check_text_len, count_reasoning, push_capped};
use super::registry::ConfigError;
use super::wire::{Answer, ErrorInfo, endpoint, http_client, provider_error, read_events, send, stream_cut};
use super::{
    BoxFuture, ChatMessage, DeltaSink, ModelError, ModelProvider, ModelRequest, ModelResponse, ToolCall,
    TranscriptDelta, Usage,
};

/// The `anthropic-version` header sent unless the provider names another.
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";
/// The `max_tokens` sent unless the provider names another (the API requires one).
pub const DEFAULT_ANTHROPIC_MAX_TOKENS: u32 = 8192;

/// The client of one `anthropic` provider. One `reqwest` client (rustls) per provider, with the
/// provider's `request_timeout_ms` as the whole-request timeout (streamed body included).
pub struct AnthropicProvider {
    provider: String,
    endpoint: reqwest::Url,
    api_key: Option<String>,
    version: String,
    max_tokens: u32,
    stream: bool,
    http: reqwest::Client,
}

impl fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("provider", &self.provider)
            .field("endpoint", &self.endpoint.as_str())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("version", &self.version)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl AnthropicProvider {
    /// A streaming client for `provider` at `base_url` (an absolute `http`/`https` URL such as
    /// `https://api.anthropic.com`), sending `api_key` as `x-api-key` when present,
    /// [`DEFAULT_ANTHROPIC_VERSION`] and [`DEFAULT_ANTHROPIC_MAX_TOKENS`]. `request_timeout`
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
        let path = if base_url.trim_end_matches('/').ends_with("/v1") { "messages" } else { "v1/messages" };
        let endpoint = endpoint(&provider, base_url, path)?;
        let http = http_client(&provider, request_timeout)?;
        Ok(Self {
            provider,
            endpoint,
            api_key,
            version: DEFAULT_ANTHROPIC_VERSION.to_owned(),
            max_tokens: DEFAULT_ANTHROPIC_MAX_TOKENS,
            stream: true,
            http,
        })
    }

    /// Asks for a streamed answer (`true`, the default) or a whole one.
    #[must_use]
    pub fn with_stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// The `anthropic-version` header.
    #[must_use]
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// The `max_tokens` of every request (output tokens).
    #[must_use]
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
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
            "messages request"
        );
        let mut builder = self
            .http
            .post(self.endpoint.clone())
            .header("anthropic-version", &self.version)
            .json(&wire_request(&request, self.max_tokens, self.stream));
        if let Some(key) = &self.api_key {
            builder = builder.header("x-api-key", key);
        }
        let response = match send(&self.provider, "messages", builder).await? {
            Answer::Whole(body) => return parse_answer(&body),
            Answer::Events(response) => response,
        };
        let mut stream = StreamAnswer::new(request.deltas.clone());
        read_events(response, |event| stream.event(event.event.as_deref(), &event.data)).await?;
        stream.finish()
    }
}

impl ModelProvider for AnthropicProvider {
    fn complete<'a>(&'a self, request: ModelRequest) -> BoxFuture<'a, Result<ModelResponse, ModelError>> {
        Box::pin(self.call(request))
    }
}

/// The request body (module docs).
fn wire_request(request: &ModelRequest, max_tokens: u32, stream: bool) -> Value {
    let (system, messages) = wire_messages(&request.messages);
    let mut body = json!({"model": request.model, "max_tokens": max_tokens, "messages": messages});
    if let Some(system) = system {
        body["system"] = json!(system);
    }
    if !request.tools.is_empty() {
        body["tools"] = request.tools.iter().map(wire_tool).collect();
    }
    if stream {
        body["stream"] = json!(true);
    }
    body
}

/// `{name, description?, input_schema}` from an OpenAI-shaped (or flat) entry.
fn wire_tool(entry: &Value) -> Value {
    let function = entry.get("function").unwrap_or(entry);
    let mut tool = Map::new();
    tool.insert("name".into(), function.get("name").cloned().unwrap_or(Value::Null));
    if let Some(description) = function.get("description").filter(|d| d.is_string()) {
        tool.insert("description".into(), description.clone());
    }
    let schema = function
        .get("parameters")
        .filter(|p| p.is_object())
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    tool.insert("input_schema".into(), schema);
    Value::Object(tool)
}

/// A call id as the API accepts it (`^[a-zA-Z0-9_-]+$`).
fn wire_id(id: &str) -> String {
    let id: String =
        id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    if id.is_empty() { "_".to_owned() } else { id }
}

/// The system text and the turns (module docs).
fn wire_messages(messages: &[ChatMessage]) -> (Option<Value>, Vec<Value>) {
    let mut system: Vec<&str> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut push = |role: &'static str, block: Value| match turns.last_mut() {
        Some((last, blocks)) if *last == role => blocks.push(block),
        _ => turns.push((role, vec![block])),
    };
    for message in messages {
        match message {
            ChatMessage::System { content } | ChatMessage::Developer { content } => system.push(content),
            ChatMessage::User { content } => {
                if !content.is_empty() {
                    push("user", json!({"type": "text", "text": content}));
                }
            }
            ChatMessage::Assistant { content, tool_calls } => {
                if let Some(text) = content.as_deref().filter(|t| !t.is_empty()) {
                    push("assistant", json!({"type": "text", "text": text}));
                }
                for call in tool_calls {
                    let input = serde_json::from_str::<Value>(&call.arguments)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    push(
                        "assistant",
                        json!({"type": "tool_use", "id": wire_id(&call.id), "name": call.name, "input": input}),
                    );
                }
            }
            ChatMessage::Tool { tool_call_id, content } => {
                push("user", json!({"type": "tool_result", "tool_use_id": wire_id(tool_call_id), "content": content}))
            }
        }
    }
    let system: Vec<Value> =
        system.into_iter().filter(|s| !s.is_empty()).map(|text| json!({"type": "text", "text": text})).collect();
    let turns = turns.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    ((!system.is_empty()).then_some(Value::Array(system)), turns)
}

/// `stop_reason` as a finish reason (module docs).
fn finish_reason(stop_reason: Option<&str>, has_calls: bool) -> Result<String, ModelError> {
    Ok(match stop_reason {
        Some("refusal") => return Err(ModelError::Refused { message: "stop_reason refusal".to_owned() }),
        Some("end_turn" | "stop_sequence" | "pause_turn") => "stop".to_owned(),
        Some("tool_use") => "tool_calls".to_owned(),
        Some("max_tokens" | "model_context_window_exceeded") => "length".to_owned(),
        Some(other) => other.to_owned(),
        None if has_calls => "tool_calls".to_owned(),
        None => "stop".to_owned(),
    })
}

fn parse_usage(usage: &Value) -> Usage {
    let count = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
    Usage {
        input_tokens: count("input_tokens") + count("cache_creation_input_tokens") + count("cache_read_input_tokens"),
        output_tokens: count("output_tokens"),
    }
}

fn answer(
    text: Option<String>,
    tool_calls: Vec<ToolCall>,
    stop_reason: Option<&str>,
    usage: Option<Usage>,
) -> Result<ModelResponse, ModelError> {
    let finish_reason = finish_reason(stop_reason, !tool_calls.is_empty())?;
    if text.is_none() && tool_calls.is_empty() {
        return Err(provider_error(format!("answer has neither text nor tool calls (stop_reason {stop_reason:?})")));
    }
    Ok(ModelResponse { text, tool_calls, finish_reason, usage })
}

/// Parses a whole 2xx body (module docs).
fn parse_answer(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|error| provider_error(format!("answer is not JSON: {error}")))?;
    if value.get("type").and_then(Value::as_str) == Some("error") || value.get("error").is_some_and(|e| !e.is_null()) {
        return Err(ErrorInfo::in_answer(value.get("error").unwrap_or(&value)));
    }
    let blocks =
        value.get("content").and_then(Value::as_array).ok_or_else(|| provider_error("answer has no content"))?;
    let mut text: Option<String> = None;
    let mut tool_calls = Vec::new();
    let mut reasoning = 0;
    for (index, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("thinking") => {
                count_reasoning(&mut reasoning, block.get("thinking").and_then(Value::as_str).unwrap_or(""))?;
            }
            Some("text") => {
                text.get_or_insert_with(String::new).push_str(block.get("text").and_then(Value::as_str).unwrap_or(""));
            }
            Some("tool_use") => {
                let name = block
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|name| !name.is_empty())
                    .ok_or_else(|| provider_error(format!("content[{index}] tool_use has no name")))?;
                let id = block.get("id").and_then(Value::as_str).filter(|id| !id.is_empty());
                let arguments = match block.get("input") {
                    None | Some(Value::Null) => "{}".to_owned(),
                    Some(input) => input.to_string(),
                };
                let id = id.map_or_else(|| format!("call_{}", tool_calls.len()), str::to_owned);
                tool_calls.push(ToolCall { id, name: name.to_owned(), arguments, model_id: None });
            }
            _ => {}
        }
    }
    let stop_reason = value.get("stop_reason").and_then(Value::as_str);
    answer(text, tool_calls, stop_reason, value.get("usage").filter(|u| u.is_object()).map(parse_usage))
}

/// What a content block being streamed is.
#[derive(Debug)]
enum Block {
    Text,
    ToolUse { ordinal: usize },
    Other,
}

/// The assembly of one streamed answer (module docs).
#[derive(Debug)]
struct StreamAnswer {
    deltas: Option<DeltaSink>,
    /// By the block's `index`.
    blocks: std::collections::BTreeMap<u64, Block>,
    text: Option<String>,
    calls: Vec<ToolCall>,
    stop_reason: Option<String>,
    usage: Usage,
    saw_usage: bool,
    stopped: bool,
    /// Thinking bytes read, counted to their bound and never kept.
    reasoning: usize,
}

impl StreamAnswer {
    fn new(deltas: Option<DeltaSink>) -> Self {
        Self {
            deltas,
            blocks: std::collections::BTreeMap::new(),
            text: None,
            calls: Vec::new(),
            stop_reason: None,
            usage: Usage::default(),
            saw_usage: false,
            stopped: false,
            reasoning: 0,
        }
    }

    fn emit(&self, delta: TranscriptDelta) {
        if let Some(sink) = &self.deltas {
            sink.send(delta);
        }
    }

    fn add_text(&mut self, text: &str) -> Result<(), ModelError> {
        let kept = self.text.get_or_insert_with(String::new);
        kept.push_str(text);
        check_text_len(kept)?;
        if !text.is_empty() {
            self.emit(TranscriptDelta::Text { text: text.to_owned() });
        }
        Ok(())
    }

    /// One event; `Ok(true)` at `message_stop`.
    fn event(&mut self, name: Option<&str>, data: &str) -> Result<bool, ModelError> {
        if data.trim().is_empty() {
            return Ok(false);
        }
        let value: Value =
            serde_json::from_str(data).map_err(|error| provider_error(format!("stream event is not JSON: {error}")))?;
        let kind = value.get("type").and_then(Value::as_str).or(name).unwrap_or_default();
        let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind {
            "message_start" => {
                if let Some(usage) = value.pointer("/message/usage").filter(|u| u.is_object()) {
                    self.usage = parse_usage(usage);
                    self.saw_usage = true;
                }
            }
            "content_block_start" => {
                let block = value.get("content_block").unwrap_or(&Value::Null);
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        self.blocks.insert(index, Block::Text);
                        self.add_text(block.get("text").and_then(Value::as_str).unwrap_or(""))?;
                    }
                    Some("thinking") => {
                        self.blocks.insert(index, Block::Other);
                        count_reasoning(
                            &mut self.reasoning,
                            block.get("thinking").and_then(Value::as_str).unwrap_or(""),
                        )?;
                    }
                    Some("tool_use") => {
                        let ordinal = self.calls.len();
                        let name = block.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                        if name.is_empty() {
                            return Err(provider_error(format!("content block {index} tool_use has no name")));
                        }
                        let id = block
                            .get("id")
                            .and_then(Value::as_str)
                            .filter(|id| !id.is_empty())
                            .map_or_else(|| format!("call_{ordinal}"), str::to_owned);
                        // A start may carry a non-empty input; deltas otherwise build it from "".
                        let input = block.get("input").filter(|i| i.as_object().is_some_and(|o| !o.is_empty()));
                        let arguments = input.map(Value::to_string).unwrap_or_default();
                        self.calls.push(ToolCall {
                            id: id.clone(),
                            name: name.clone(),
                            arguments: arguments.clone(),
                            model_id: None,
                        });
                        self.blocks.insert(index, Block::ToolUse { ordinal });
                        self.emit(TranscriptDelta::ToolCallStarted { index: ordinal, tool_call_id: id, name });
                        if !arguments.is_empty() {
                            self.emit(TranscriptDelta::ToolCallArguments { index: ordinal, delta: arguments });
                        }
                    }
                    _ => {
                        self.blocks.insert(index, Block::Other);
                    }
                }
            }
            "content_block_delta" => {
                let delta = value.get("delta").unwrap_or(&Value::Null);
                match (delta.get("type").and_then(Value::as_str), self.blocks.get(&index)) {
                    (Some("text_delta"), Some(Block::Text)) => {
                        self.add_text(delta.get("text").and_then(Value::as_str).unwrap_or(""))?;
                    }
                    (Some("thinking_delta"), _) => {
                        count_reasoning(
                            &mut self.reasoning,
                            delta.get("thinking").and_then(Value::as_str).unwrap_or(""),
                        )?;
                    }
                    (Some("input_json_delta"), Some(Block::ToolUse { ordinal })) => {
                        let ordinal = *ordinal;
                        let piece = delta.get("partial_json").and_then(Value::as_str).unwrap_or("");
                        if !piece.is_empty() {
                            push_capped(&mut self.calls[ordinal].arguments, piece, CALL_ARGUMENTS_KEPT);
                            self.emit(TranscriptDelta::ToolCallArguments { index: ordinal, delta: piece.to_owned() });
                        }
                    }
                    (Some("text_delta" | "input_json_delta"), _) => {
                        return Err(provider_error(format!("content block {index} got a delta it cannot take")));
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(output) = value.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    self.usage.output_tokens = output;
                    self.saw_usage = true;
                }
            }
            "message_stop" => {
                self.stopped = true;
                return Ok(true);
            }
            "error" => return Err(ErrorInfo::in_answer(value.get("error").unwrap_or(&value))),
            _ => {}
        }
        Ok(false)
    }

    /// The assembled answer, judged as a whole answer is.
    fn finish(self) -> Result<ModelResponse, ModelError> {
        if !self.stopped && self.stop_reason.is_none() {
            return Err(stream_cut("message_stop"));
        }
        let calls =
            self.calls
                .into_iter()
                .map(|call| {
                    if call.arguments.trim().is_empty() {
                        ToolCall { arguments: "{}".to_owned(), ..call }
                    } else {
                        call
                    }
                })
                .collect();
        answer(self.text, calls, self.stop_reason.as_deref(), self.saw_usage.then_some(self.usage))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::model::fake_http::{FakeServer, Reply};

    fn provider(server: &FakeServer, stream: bool) -> AnthropicProvider {
        AnthropicProvider::new("claude", &server.url(""), Some("sk-ant-test".into()), Duration::from_secs(10))
            .expect("client builds")
            .with_stream(stream)
            .with_max_tokens(1024)
    }

    fn user_request(model: &str) -> ModelRequest {
        ModelRequest {
            model: model.to_owned(),
            messages: vec![ChatMessage::User { content: "hi".into() }],
            ..ModelRequest::default()
        }
    }

    fn recording_sink() -> (DeltaSink, Arc<Mutex<Vec<TranscriptDelta>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&seen);
        (DeltaSink::new(move |delta| keep.lock().expect("lock").push(delta)), seen)
    }

    /// An SSE body of named events (each event's name is its data's `type`).
    fn sse(events: &[Value]) -> String {
        events
            .iter()
            .map(|event| format!("event: {}\ndata: {event}\n\n", event["type"].as_str().unwrap_or("")))
            .collect()
    }

    fn message_start() -> Value {
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "content": [], "stop_reason": null, "usage": {"input_tokens": 25, "cache_read_input_tokens": 5, "output_tokens": 1}}})
    }

    fn message_end(stop_reason: &str, output_tokens: u64) -> [Value; 2] {
        [
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                "usage": {"output_tokens": output_tokens}}),
            json!({"type": "message_stop"}),
        ]
    }

    #[test]
    fn transcript_maps_onto_turns_and_blocks() {
        let request = ModelRequest {
            model: "claude-sonnet-4-5".into(),
            messages: vec![
                ChatMessage::System { content: "be brief".into() },
                ChatMessage::User { content: "list files".into() },
                ChatMessage::Assistant {
                    content: Some("checking".into()),
                    tool_calls: vec![
                        ToolCall {
                            id: "call.1".into(),
                            name: "bash".into(),
                            arguments: "{\"command\":\"ls\"}".into(),
                            model_id: None,
                        },
                        ToolCall { id: "c2".into(), name: "read".into(), arguments: "not json".into(), model_id: None },
                    ],
                },
                ChatMessage::Tool { tool_call_id: "call.1".into(), content: "a.txt".into() },
                ChatMessage::Tool { tool_call_id: "c2".into(), content: "invalid_tool_arguments: …".into() },
                ChatMessage::System { content: "a later note".into() },
                ChatMessage::Assistant { content: None, tool_calls: vec![] },
                ChatMessage::User { content: "thanks".into() },
            ],
            tools: vec![
                json!({"type": "function", "strict": false, "function": {"name": "bash", "description": "Run",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}),
                json!({"type": "function", "function": {"name": "ping"}}),
            ],
            deltas: None,
        };
        assert_eq!(
            wire_request(&request, 1024, true),
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 1024,
                "stream": true,
                "system": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "a later note"}],
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "list files"}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "checking"},
                        {"type": "tool_use", "id": "call_1", "name": "bash", "input": {"command": "ls"}},
                        {"type": "tool_use", "id": "c2", "name": "read", "input": {}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "a.txt"},
                        {"type": "tool_result", "tool_use_id": "c2", "content": "invalid_tool_arguments: …"},
                        {"type": "text", "text": "thanks"}]}
                ],
                "tools": [
                    {"name": "bash", "description": "Run",
                     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
                    {"name": "ping", "input_schema": {"type": "object", "properties": {}}}
                ]
            })
        );
    }

    #[tokio::test]
    async fn streamed_text_and_tool_use_are_assembled_and_reported() {
        let server = FakeServer::start().await;
        let [delta_end, stop] = message_end("tool_use", 31);
        server.push(Reply::sse(sse(&[
            message_start(),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "ping"}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "check."}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"command\": "}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"ls\"}"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "content_block_start", "index": 2,
                "content_block": {"type": "tool_use", "id": "toolu_02", "name": "now", "input": {}}}),
            json!({"type": "content_block_stop", "index": 2}),
            delta_end,
            stop,
        ])));
        let (sink, seen) = recording_sink();
        let answer = provider(&server, true)
            .complete(ModelRequest { deltas: Some(sink), ..user_request("claude-x") })
            .await
            .expect("answer");
        assert_eq!(
            answer,
            ModelResponse {
                text: Some("Let me check.".into()),
                tool_calls: vec![
                    ToolCall {
                        id: "toolu_01".into(),
                        name: "bash".into(),
                        arguments: "{\"command\": \"ls\"}".into(),
                        model_id: None
                    },
                    ToolCall { id: "toolu_02".into(), name: "now".into(), arguments: "{}".into(), model_id: None },
                ],
                finish_reason: "tool_calls".into(),
                usage: Some(Usage { input_tokens: 30, output_tokens: 31 }),
            }
        );
        assert_eq!(
            *seen.lock().expect("lock"),
            vec![
                TranscriptDelta::Text { text: "Let me ".into() },
                TranscriptDelta::Text { text: "check.".into() },
                TranscriptDelta::ToolCallStarted { index: 0, tool_call_id: "toolu_01".into(), name: "bash".into() },
                TranscriptDelta::ToolCallArguments { index: 0, delta: "{\"command\": ".into() },
                TranscriptDelta::ToolCallArguments { index: 0, delta: "\"ls\"}".into() },
                TranscriptDelta::ToolCallStarted { index: 1, tool_call_id: "toolu_02".into(), name: "now".into() },
            ]
        );
        let sent = server.take_seen();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].path, "/v1/messages");
        assert_eq!(sent[0].header("x-api-key"), Some("sk-ant-test"));
        assert_eq!(sent[0].header("anthropic-version"), Some(DEFAULT_ANTHROPIC_VERSION));
        assert_eq!(sent[0].header("authorization"), None);
        assert_eq!(sent[0].body["stream"], json!(true));
        assert_eq!(sent[0].body["max_tokens"], json!(1024));
    }

    #[tokio::test]
    async fn whole_answers_and_stop_reasons() {
        let body = |content: Value, stop_reason: &str| {
            json!({"id": "msg_1", "type": "message", "role": "assistant", "content": content,
                "stop_reason": stop_reason, "usage": {"input_tokens": 10, "output_tokens": 2}})
            .to_string()
        };
        let server = FakeServer::start().await;
        let client = provider(&server, false);
        let text = json!([{"type": "text", "text": "Hello"}, {"type": "text", "text": "!"}]);
        /// Ok((finish_reason, text, tool calls)) or Err(key).
        type Expected = Result<(&'static str, Option<&'static str>, usize), &'static str>;
        let rows: Vec<(&str, String, Expected)> = vec![
            ("end_turn", body(text.clone(), "end_turn"), Ok(("stop", Some("Hello!"), 0))),
            ("stop_sequence", body(text.clone(), "stop_sequence"), Ok(("stop", Some("Hello!"), 0))),
            ("max_tokens", body(text.clone(), "max_tokens"), Ok(("length", Some("Hello!"), 0))),
            (
                "tool_use",
                body(
                    json!([{"type": "thinking", "thinking": "hm"},
                    {"type": "tool_use", "id": "toolu_9", "name": "bash", "input": {"command": "ls"}}]),
                    "tool_use",
                ),
                Ok(("tool_calls", None, 1)),
            ),
            ("refusal", body(json!([]), "refusal"), Err("model_refused")),
            ("empty", body(json!([]), "end_turn"), Err("provider_error")),
            (
                "error_body",
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}).to_string(),
                Err("provider_overloaded"),
            ),
        ];
        for (name, body, expected) in rows {
            server.reply(200, body);
            match (client.complete(user_request("m")).await, expected) {
                (Ok(answer), Ok((finish, text, calls))) => {
                    assert_eq!(answer.finish_reason, finish, "{name}");
                    assert_eq!(answer.text.as_deref(), text, "{name}");
                    assert_eq!(answer.tool_calls.len(), calls, "{name}");
                    assert_eq!(answer.usage, Some(Usage { input_tokens: 10, output_tokens: 2 }), "{name}");
                }
                (Err(error), Err(key)) => assert_eq!(error.key(), key, "{name}: {error}"),
                (actual, expected) => panic!("{name}: got {actual:?}, expected {expected:?}"),
            }
        }
        let sent = server.take_seen();
        assert_eq!(sent.len(), 7);
        assert_eq!(sent[0].body.get("stream"), None, "a whole answer is asked without stream");
    }

    #[tokio::test]
    async fn failures_map_to_spec_keys() {
        let server = FakeServer::start().await;
        let client = provider(&server, true);
        let error_body = |kind: &str| json!({"type": "error", "error": {"type": kind, "message": "m"}}).to_string();
        let text_start =
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
        let text =
            |t: &str| json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}});
        let [refusal_delta, refusal_stop] = message_end("refusal", 3);
        let rows: Vec<(&str, Reply, &str, bool)> = vec![
            ("529", Reply::json(529, error_body("overloaded_error")), "provider_overloaded", true),
            ("503", Reply::json(503, "upstream connect error"), "provider_overloaded", true),
            (
                "429",
                Reply {
                    headers: vec![("retry-after", "3".into())],
                    ..Reply::json(429, error_body("rate_limit_error"))
                },
                "provider_http_error",
                true,
            ),
            ("500", Reply::json(500, error_body("api_error")), "provider_http_error", true),
            ("401", Reply::json(401, error_body("authentication_error")), "provider_model_unavailable", false),
            ("404", Reply::json(404, error_body("not_found_error")), "provider_model_unavailable", false),
            ("400", Reply::json(400, error_body("invalid_request_error")), "provider_http_error", false),
            (
                "prompt_too_long",
                Reply::json(
                    400,
                    json!({"type": "error", "error": {"type": "invalid_request_error",
                    "message": "prompt is too long: 250000 tokens > 200000 maximum"}})
                    .to_string(),
                ),
                "provider_context_overflow",
                false,
            ),
            (
                "overloaded_event_mid_stream",
                Reply::sse(sse(&[
                    message_start(),
                    text_start.clone(),
                    text("Hel"),
                    json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
                ])),
                "provider_overloaded",
                true,
            ),
            (
                "refusal_mid_stream",
                Reply::sse(sse(&[message_start(), text_start.clone(), text("I will"), refusal_delta, refusal_stop])),
                "model_refused",
                false,
            ),
            (
                "cut_mid_stream",
                Reply::sse(sse(&[message_start(), text_start, text("Hel")])),
                "provider_http_error",
                true,
            ),
            ("malformed_event", Reply::sse("event: message_start\ndata: {nope\n\n"), "provider_error", false),
        ];
        for (name, reply, key, retryable) in rows {
            server.push(reply);
            let error = client.complete(user_request("m")).await.expect_err(name);
            assert_eq!(error.key(), key, "{name}: {error}");
            assert_eq!(error.retryable(), retryable, "{name}: {error}");
            if name == "429" {
                assert!(
                    matches!(error, ModelError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(3)),
                    "{error:?}"
                );
            }
        }
    }

    #[test]
    fn base_url_with_or_without_v1() {
        for (base, expected) in [
            ("https://api.anthropic.com", "https://api.anthropic.com/v1/messages"),
            ("https://api.anthropic.com/", "https://api.anthropic.com/v1/messages"),
            ("https://proxy.example/anthropic/v1", "https://proxy.example/anthropic/v1/messages"),
        ] {
            let client = AnthropicProvider::new("a", base, None, Duration::from_secs(1)).expect("valid");
            assert_eq!(client.endpoint.as_str(), expected, "{base}");
        }
        assert!(AnthropicProvider::new("a", "api.anthropic.com", None, Duration::from_secs(1)).is_err());
        let client = AnthropicProvider::new(
            "a",
            "https://api.anthropic.com",
            Some("sk-ant-secret".into()),
            Duration::from_secs(1),
        )
        .expect("valid");
        assert!(!format!("{client:?}").contains("sk-ant-secret"));
    }
}
