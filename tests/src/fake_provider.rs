//! A local fake model provider on 127.0.0.1:0 that speaks both wires nexus's adapters speak:
//! OpenAI chat completions (`POST /v1/chat/completions`, base URL [`FakeProvider::openai_base_url`])
//! and Anthropic Messages (`POST /v1/messages`, base URL [`FakeProvider::anthropic_base_url`]),
//! each streamed (server-sent events, when the request says `stream: true`) or whole.
//!
//! A test scripts what each model answers with [`FakeProvider::script`]: a queue of [`Act`]s per
//! model name (the request's `model`), one act per request, in order. A request for a model with
//! nothing queued is answered 400 (a request error, never retried), so an unexpected request
//! shows as a failed execution rather than a hang. Every request is recorded
//! ([`FakeProvider::requests`], [`FakeProvider::count`]) before it is answered, so a test can
//! prove that a model was never asked.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// Which wire a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// `POST /v1/chat/completions`.
    OpenAi,
    /// `POST /v1/messages`.
    Anthropic,
}

/// One scripted answer. Each wire answers it in its own shape; "streamed" means the request asked
/// for `stream: true`.
#[derive(Clone, Debug)]
pub enum Act {
    /// A final text answer (streamed in two pieces).
    Text(String),
    /// Tool calls `(id, name, arguments)`, the arguments streamed in two pieces.
    ToolCalls(Vec<(String, String, Value)>),
    /// A final text `tool said: <content of the request's last tool result>`.
    EchoLastToolResult,
    /// The classifier declines: OpenAI `refusal` (with `finish_reason: stop`), Anthropic
    /// `stop_reason: refusal` (after a first streamed word).
    Refuse,
    /// A content block: OpenAI `finish_reason: content_filter` without a refusal (after a first
    /// streamed word). The Anthropic wire has no content block and answers 400.
    Block,
    /// Overloaded: OpenAI 503, Anthropic 529 with `overloaded_error`.
    Overload,
    /// A 200 stream that breaks off with an `overloaded_error` error event after a first word.
    OverloadMidStream,
    /// 429 with `Retry-After: <seconds>`.
    RateLimit {
        /// The `Retry-After` value, whole seconds.
        retry_after_secs: u64,
    },
    /// 500 with an error body.
    ServerError,
    /// Any status with an error body of that status (e.g. 400, 401, 404).
    Status(u16),
    /// A 200 answer whose body stops after a first word: the connection is dropped mid-stream.
    CutStream,
    /// The prompt does not fit the model: 400 with OpenAI `code: context_length_exceeded`, or
    /// Anthropic `invalid_request_error` "prompt is too long" (`provider_context_overflow`).
    ContextOverflow,
    /// The inner act, reporting `input_tokens` as the request's prompt tokens (OpenAI
    /// `usage.prompt_tokens`, Anthropic `usage.input_tokens`) instead of the usual 11.
    WithUsage {
        /// The prompt tokens to report.
        input_tokens: u64,
        /// What to answer.
        act: Box<Act>,
    },
}

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct FakeRequest {
    /// The wire.
    pub wire: Wire,
    /// The body's `model`.
    pub model: String,
    /// Whether the body asked for a stream.
    pub stream: bool,
    /// The body.
    pub body: Value,
    /// The `authorization`, `x-api-key` and `anthropic-version` headers, when sent.
    pub headers: BTreeMap<String, String>,
}

impl FakeRequest {
    /// The content of every tool result the request carries, in order (OpenAI `role: tool`
    /// messages, Anthropic `tool_result` blocks).
    pub fn tool_results(&self) -> Vec<String> {
        let messages = self.body["messages"].as_array().cloned().unwrap_or_default();
        match self.wire {
            Wire::OpenAi => messages
                .iter()
                .filter(|m| m["role"] == "tool")
                .filter_map(|m| m["content"].as_str().map(str::to_owned))
                .collect(),
            Wire::Anthropic => messages
                .iter()
                .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
                .filter(|block| block["type"] == "tool_result")
                .filter_map(|block| block["content"].as_str().map(str::to_owned))
                .collect(),
        }
    }
}

#[derive(Default)]
struct Shared {
    acts: Mutex<HashMap<String, VecDeque<Act>>>,
    requests: Mutex<Vec<FakeRequest>>,
}

/// The fake; it stops when dropped.
#[derive(Debug)]
pub struct FakeProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    serve: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.serve.abort();
    }
}

impl FakeProvider {
    /// Starts the fake on 127.0.0.1:0.
    pub async fn start() -> FakeProvider {
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(openai))
            .route("/v1/messages", post(anthropic))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("address");
        let serve = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeProvider { addr, shared, serve }
    }

    /// `http://127.0.0.1:<port>/v1`: the `base_url` of an `openai_compatible` provider.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `http://127.0.0.1:<port>`: the `base_url` of an `anthropic` provider.
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues `acts` for requests naming `model`, after anything already queued.
    pub fn script(&self, model: &str, acts: impl IntoIterator<Item = Act>) {
        let mut queues = self.shared.acts.lock().expect("acts");
        queues.entry(model.to_owned()).or_default().extend(acts);
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<FakeRequest> {
        self.shared.requests.lock().expect("requests").clone()
    }

    /// The requests naming `model`.
    pub fn requests_for(&self, model: &str) -> Vec<FakeRequest> {
        self.requests().into_iter().filter(|r| r.model == model).collect()
    }

    /// How many requests named `model`.
    pub fn count(&self, model: &str) -> usize {
        self.requests_for(model).len()
    }
}

async fn openai(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: String) -> Response {
    let (request, act) = take(&shared, Wire::OpenAi, &headers, &body);
    match act {
        Some(act) => openai_answer(&request, act),
        None => nothing_scripted(&request),
    }
}

async fn anthropic(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: String) -> Response {
    let (request, act) = take(&shared, Wire::Anthropic, &headers, &body);
    match act {
        Some(act) => anthropic_answer(&request, act),
        None => nothing_scripted(&request),
    }
}

/// Records the request and takes the model's next act.
fn take(shared: &Shared, wire: Wire, headers: &HeaderMap, body: &str) -> (FakeRequest, Option<Act>) {
    let body: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let kept = ["authorization", "x-api-key", "anthropic-version"]
        .into_iter()
        .filter_map(|name| Some((name.to_owned(), headers.get(name)?.to_str().ok()?.to_owned())))
        .collect();
    let request = FakeRequest {
        wire,
        model: body["model"].as_str().unwrap_or_default().to_owned(),
        stream: body["stream"].as_bool().unwrap_or(false),
        body,
        headers: kept,
    };
    shared.requests.lock().expect("requests").push(request.clone());
    let act = shared.acts.lock().expect("acts").get_mut(&request.model).and_then(VecDeque::pop_front);
    (request, act)
}

fn nothing_scripted(request: &FakeRequest) -> Response {
    let message = format!("fake provider: nothing scripted for model {:?}", request.model);
    json_answer(400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}}))
}

fn json_answer(status: u16, body: Value) -> Response {
    let status = StatusCode::from_u16(status).expect("status");
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// A 200 event stream of `pieces`; with `cut`, the connection drops after them. Before the cut
/// the body yields once, so the server writes out what it has and the client reads the pieces,
/// then a connection that ends without the chunked terminator.
fn event_stream(pieces: Vec<String>, cut: bool) -> Response {
    use futures::StreamExt;

    let pieces = futures::stream::iter(pieces.into_iter().map(|p| Ok::<_, std::io::Error>(Bytes::from(p))));
    let tail = futures::stream::iter(cut.then_some(())).then(|()| async {
        tokio::task::yield_now().await;
        Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "fake provider cut the stream"))
    });
    let body = Body::from_stream(pieces.chain(tail));
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

fn data(value: &Value) -> String {
    format!("data: {value}\n\n")
}

fn named(value: &Value) -> String {
    format!("event: {}\ndata: {value}\n\n", value["type"].as_str().unwrap_or_default())
}

/// `text` in two pieces (at a character boundary near the middle).
fn halves(text: &str) -> [String; 2] {
    let mut mid = text.len() / 2;
    while !text.is_char_boundary(mid) {
        mid += 1;
    }
    [text[..mid].to_owned(), text[mid..].to_owned()]
}

fn echo(request: &FakeRequest) -> String {
    format!("tool said: {}", request.tool_results().last().cloned().unwrap_or_default())
}

/// The error body of a status, in the wire's shape.
fn error_body(wire: Wire, status: u16) -> Value {
    let kind = match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        500 => "api_error",
        503 | 529 => "overloaded_error",
        _ => "invalid_request_error",
    };
    let message = format!("fake provider answers {status}");
    match wire {
        Wire::OpenAi => json!({"error": {"message": message, "type": kind, "code": null}}),
        Wire::Anthropic => json!({"type": "error", "error": {"type": kind, "message": message}}),
    }
}

fn openai_answer(request: &FakeRequest, act: Act) -> Response {
    let (act, prompt_tokens) = match act {
        Act::WithUsage { input_tokens, act } => (*act, input_tokens),
        act => (act, 11),
    };
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let usage = json!({"id": "chatcmpl-fake", "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 7}});
    let whole = |message: Value, finish: &str| {
        json_answer(
            200,
            json!({"id": "chatcmpl-fake", "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 7}}),
        )
    };
    let text_stream = |text: &str, finish: &str| {
        let [a, b] = halves(text);
        let pieces = vec![
            data(&chunk(json!({"role": "assistant", "content": ""}), Value::Null)),
            data(&chunk(json!({"content": a}), Value::Null)),
            data(&chunk(json!({"content": b}), Value::Null)),
            data(&chunk(json!({}), json!(finish))),
            data(&usage),
            "data: [DONE]\n\n".to_owned(),
        ];
        event_stream(pieces, false)
    };
    match act {
        Act::Text(text) if request.stream => text_stream(&text, "stop"),
        Act::Text(text) => whole(json!({"role": "assistant", "content": text}), "stop"),
        Act::EchoLastToolResult if request.stream => text_stream(&echo(request), "stop"),
        Act::EchoLastToolResult => whole(json!({"role": "assistant", "content": echo(request)}), "stop"),
        Act::ToolCalls(calls) if request.stream => {
            let mut pieces = vec![data(&chunk(json!({"role": "assistant", "content": null}), Value::Null))];
            for (index, (id, name, arguments)) in calls.iter().enumerate() {
                let [a, b] = halves(&arguments.to_string());
                pieces.push(data(&chunk(
                    json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                        "function": {"name": name, "arguments": a}}]}),
                    Value::Null,
                )));
                pieces.push(data(&chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": b}}]}),
                    Value::Null,
                )));
            }
            pieces.push(data(&chunk(json!({}), json!("tool_calls"))));
            pieces.push(data(&usage));
            pieces.push("data: [DONE]\n\n".to_owned());
            event_stream(pieces, false)
        }
        Act::ToolCalls(calls) => {
            let calls: Vec<Value> = calls
                .iter()
                .map(|(id, name, arguments)| {
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}})
                })
                .collect();
            whole(json!({"role": "assistant", "content": null, "tool_calls": calls}), "tool_calls")
        }
        Act::Refuse if request.stream => event_stream(
            vec![
                data(&chunk(json!({"role": "assistant", "refusal": "I can't "}), Value::Null)),
                data(&chunk(json!({"refusal": "help with that."}), Value::Null)),
                data(&chunk(json!({}), json!("stop"))),
                "data: [DONE]\n\n".to_owned(),
            ],
            false,
        ),
        Act::Refuse => {
            whole(json!({"role": "assistant", "content": null, "refusal": "I can't help with that."}), "stop")
        }
        Act::Block if request.stream => event_stream(
            vec![
                data(&chunk(json!({"role": "assistant", "content": "Sure"}), Value::Null)),
                data(&chunk(json!({}), json!("content_filter"))),
                "data: [DONE]\n\n".to_owned(),
            ],
            false,
        ),
        Act::Block => whole(json!({"role": "assistant", "content": ""}), "content_filter"),
        Act::Overload => json_answer(503, error_body(Wire::OpenAi, 503)),
        Act::OverloadMidStream => event_stream(
            vec![
                data(&chunk(json!({"role": "assistant", "content": "Hel"}), Value::Null)),
                data(&json!({"error": {"type": "overloaded_error", "message": "Overloaded"}})),
            ],
            false,
        ),
        Act::RateLimit { retry_after_secs } => {
            let mut response = json_answer(429, error_body(Wire::OpenAi, 429));
            response.headers_mut().insert(header::RETRY_AFTER, retry_after_secs.into());
            response
        }
        Act::ServerError => json_answer(500, error_body(Wire::OpenAi, 500)),
        Act::Status(status) => json_answer(status, error_body(Wire::OpenAi, status)),
        Act::CutStream => {
            event_stream(vec![data(&chunk(json!({"role": "assistant", "content": "Hel"}), Value::Null))], true)
        }
        Act::ContextOverflow => json_answer(
            400,
            json!({"error": {"message": "This model's maximum context length is 8192 tokens", "type": "invalid_request_error",
                "code": "context_length_exceeded"}}),
        ),
        Act::WithUsage { .. } => nothing_scripted(request),
    }
}

fn anthropic_answer(request: &FakeRequest, act: Act) -> Response {
    let (act, input_tokens) = match act {
        Act::WithUsage { input_tokens, act } => (*act, input_tokens),
        act => (act, 11),
    };
    let start = json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message", "role": "assistant",
        "content": [], "model": request.model, "stop_reason": null, "usage": {"input_tokens": input_tokens, "output_tokens": 1}}});
    let end = |stop_reason: &str| {
        [
            named(&json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                "usage": {"output_tokens": 7}})),
            named(&json!({"type": "message_stop"})),
        ]
    };
    let text_block = |index: usize, pieces: &[String]| {
        let mut out = vec![named(
            &json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
        )];
        for piece in pieces {
            out.push(named(
                &json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}),
            ));
        }
        out.push(named(&json!({"type": "content_block_stop", "index": index})));
        out
    };
    let whole = |content: Value, stop_reason: &str| {
        json_answer(
            200,
            json!({"id": "msg_fake", "type": "message", "role": "assistant", "model": request.model,
            "content": content, "stop_reason": stop_reason, "usage": {"input_tokens": input_tokens, "output_tokens": 7}}),
        )
    };
    let text_stream = |text: &str| {
        let mut pieces = vec![named(&start)];
        pieces.extend(text_block(0, &halves(text)));
        pieces.extend(end("end_turn"));
        event_stream(pieces, false)
    };
    match act {
        Act::Text(text) if request.stream => text_stream(&text),
        Act::Text(text) => whole(json!([{"type": "text", "text": text}]), "end_turn"),
        Act::EchoLastToolResult if request.stream => text_stream(&echo(request)),
        Act::EchoLastToolResult => whole(json!([{"type": "text", "text": echo(request)}]), "end_turn"),
        Act::ToolCalls(calls) if request.stream => {
            let mut pieces = vec![named(&start)];
            pieces.extend(text_block(0, &["Running it.".to_owned()]));
            for (offset, (id, name, arguments)) in calls.iter().enumerate() {
                let index = offset + 1;
                pieces.push(named(&json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})));
                for piece in halves(&arguments.to_string()) {
                    pieces.push(named(&json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece}})));
                }
                pieces.push(named(&json!({"type": "content_block_stop", "index": index})));
            }
            pieces.extend(end("tool_use"));
            event_stream(pieces, false)
        }
        Act::ToolCalls(calls) => {
            let mut content = vec![json!({"type": "text", "text": "Running it."})];
            content.extend(
                calls.iter().map(
                    |(id, name, arguments)| json!({"type": "tool_use", "id": id, "name": name, "input": arguments}),
                ),
            );
            whole(Value::Array(content), "tool_use")
        }
        Act::Refuse if request.stream => {
            let mut pieces = vec![named(&start)];
            pieces.extend(text_block(0, &["I will".to_owned()]));
            pieces.extend(end("refusal"));
            event_stream(pieces, false)
        }
        Act::Refuse => whole(json!([]), "refusal"),
        Act::Block => json_answer(400, error_body(Wire::Anthropic, 400)),
        Act::Overload => json_answer(529, error_body(Wire::Anthropic, 529)),
        Act::OverloadMidStream => {
            let mut pieces = vec![named(&start)];
            pieces.push(named(
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            pieces.push(named(
                &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
            ));
            pieces
                .push(named(&json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})));
            event_stream(pieces, false)
        }
        Act::RateLimit { retry_after_secs } => {
            let mut response = json_answer(429, error_body(Wire::Anthropic, 429));
            response.headers_mut().insert(header::RETRY_AFTER, retry_after_secs.into());
            response
        }
        Act::ServerError => json_answer(500, error_body(Wire::Anthropic, 500)),
        Act::Status(status) => json_answer(status, error_body(Wire::Anthropic, status)),
        Act::CutStream => {
            let mut pieces = vec![named(&start)];
            pieces.push(named(
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            pieces.push(named(
                &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
            ));
            event_stream(pieces, true)
        }
        Act::ContextOverflow => json_answer(
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
        ),
        Act::WithUsage { .. } => nothing_scripted(request),
    }
}
