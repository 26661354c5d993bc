//! The conformance suite of the Agent configuration door: one test per requirement that concerns
//! declaration, validation, storage or assembly (`docs/declaration.md`; a test's `rNN_` prefix is
//! the requirement number the document quotes), driving the real HTTP doors. Tests assert status
//! codes and refusal words, never message text beyond the field a message must name and the word it
//! must carry.
//!
//! What a provider receives (the wire projection) is observed through a fake OpenAI-compatible
//! provider on 127.0.0.1:0 that records every request ([`FakeProvider`]); inputs are admitted
//! through the in-process API, the door the HTTP and gRPC edges share.
//!
//! What no door can observe yet, so no test here asserts it:
//! - the intersection of memory bindings and the freezing of bindings and speaker: there are no
//!   memory doors or memory tools in-process, so the effective context is invisible (the stored
//!   limit is checked instead; `docs/declaration.md`, "Memory limits"). The reach is observed
//!   through the history tools (`r37_subtree_...`, `r38_reach_...`);
//! - `execution_declaration` on an input update: that door does not exist; regeneration and the
//!   context estimate take one in the control suite (`control.rs`; `docs/executions.md`,
//!   "Control");
//! - run-time behaviour (the model chain, the context estimate, regeneration, spawning, lifecycle
//!   hooks at run time) belongs to other suites (`docs/executions.md`);
//! - the spawn half of the delegation catalog (`spawn.declaration` against a captured catalog):
//!   no such kernel tool runs in-process, so a spawn call cannot be observed apart from the
//!   kernel-tool tests `r21_`, `r32_` and `r33_` (`docs/declaration.md`, "Delegation catalog").

use nexus_proto::{ErrorCode, ExecutionId};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use uuid::Uuid;

use nexus_actors::config::ServerConfig;
use nexus_actors::doors::api::CreateInput;
use nexus_actors::model::{ModelConfig, ProviderConfig, ProviderKind};
use nexus_actors::store::ExecutionRow;
use nexus_proto::Refusal;
use nexus_tests::{Answer, Http, Minted, RawRunner, TestServer, wait_until};

/// How long an execution driven by the fake provider may take to settle.
const SETTLE: Duration = Duration::from_secs(10);

/// A server with one Agent and its HTTP client.
struct Door {
    server: TestServer,
    agent: Minted,
    http: Http,
}

async fn door() -> Door {
    door_with(|_| {}).await
}

async fn door_with(adjust: impl FnOnce(&mut ServerConfig)) -> Door {
    let server = TestServer::start_with(&[], adjust).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    Door { server, agent, http }
}

/// Adds providers whose models resolve to each resolver word: `any/<anything>` (runnable, any
/// model name), `off/m` (`provider_disabled`) and `veiled/secret` (`model_hidden`). The built-in
/// `openrouter` has no credential here (`missing_credential`).
fn with_providers(config: &mut ServerConfig) {
    let providers = &mut config.providers.providers;
    providers.insert(
        "any".into(),
        ProviderConfig {
            base_url: Some("http://127.0.0.1:9/v1".into()),
            allow_any_model: true,
            ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
        },
    );
    providers.insert(
        "off".into(),
        ProviderConfig {
            enabled: false,
            models: BTreeMap::from([("m".to_owned(), ModelConfig::default())]),
            ..ProviderConfig::new(ProviderKind::Scripted)
        },
    );
    providers.insert(
        "veiled".into(),
        ProviderConfig {
            models: BTreeMap::from([("secret".to_owned(), ModelConfig { hidden: true, ..ModelConfig::default() })]),
            ..ProviderConfig::new(ProviderKind::Scripted)
        },
    );
}

impl Door {
    /// Declares a known-good state with both documents, so refusals can be shown to change nothing.
    async fn seed(&self) -> Value {
        let answer = self
            .http
            .declare(&json!({
                "configuration": {"default_model": "scripted/default", "approval_mode": "ask"},
                "prompt_documents": {"system_prompt": {"content": "You are {{agent}}."}, "summarizer": {"content": "Keep decisions."}}
            }))
            .await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        answer.body
    }

    /// The stored profile row and the GET body, to compare before and after a refusal.
    async fn snapshot(&self) -> (Value, Value) {
        let row = self.server.store().profile(self.agent.member()).await.expect("store").expect("profile");
        let stored = json!({
            "configuration": row.configuration, "system_prompt": row.system_prompt, "summarizer": row.summarizer,
            "system_prompt_version": row.system_prompt_version, "summarizer_version": row.summarizer_version,
        });
        let mut read = self.http.profile().await.body;
        read["measured_at"] = Value::Null;
        (stored, read)
    }

    /// Asserts that `body` is refused with `status` and `code` and that nothing changed.
    async fn refused(&self, body: &Value, status: u16, code: &str) -> Answer {
        let before = self.snapshot().await;
        let answer = self.http.declare(body).await;
        assert_eq!((answer.status, answer.code()), (status, Some(code)), "{body} -> {:?}", answer.body);
        assert_eq!(self.snapshot().await, before, "a refused PUT changed the profile: {body}");
        answer
    }

    /// Asserts that `configuration` is refused 422 `validation_failed`, changing nothing, with a
    /// message that starts with `field` and carries `word`.
    async fn rejects(&self, configuration: &Value, field: &str, word: &str) {
        let answer = self.refused(&json!({"configuration": configuration}), 422, "validation_failed").await;
        names(&answer, field, word);
    }

    /// Declares `configuration` (no documents), asserts 200 and returns the stored configuration
    /// as GET reads it.
    async fn accepts(&self, configuration: &Value) -> Value {
        let answer = self.http.declare(&json!({"configuration": configuration})).await;
        assert_eq!(answer.status, 200, "{configuration} -> {:?}", answer.body);
        self.http.profile().await.body["configuration"].clone()
    }

    /// `POST /agent_api/v1/tools/assembly`.
    async fn preview(&self, body: &Value) -> Answer {
        self.http.post("/agent_api/v1/tools/assembly", body).await
    }

    /// The preview of `configuration` for `selected`, asserted 200: the assembled entries.
    async fn assembled(&self, selected: Option<nexus_proto::RunnerId>, configuration: &Value) -> Vec<Value> {
        let body = json!({"default_runner_executor_public_id": selected, "configuration": configuration});
        let answer = self.preview(&body).await;
        assert_eq!(answer.status, 200, "{body} -> {:?}", answer.body);
        answer.body["tool_definitions"].as_array().cloned().expect("tool_definitions")
    }

    /// `GET /agent_api/v1/tools`: the catalog entry of a kernel tool by wire name.
    async fn kernel(&self, wire: &str) -> Value {
        let catalog = self.http.get("/agent_api/v1/tools").await;
        assert_eq!(catalog.status, 200);
        let tools = catalog.body["tools"].as_array().cloned().expect("tools");
        tools.into_iter().find(|t| t["name"] == wire).unwrap_or_else(|| panic!("{wire} is not in the catalog"))
    }

    /// A runner minted, connected and announcing `tools`, with `environment` `{"name": name}`.
    async fn runner(&self, name: &str, tools: Value) -> (Minted, RawRunner) {
        let runner = self.server.runner(name).await;
        let announcement = json!({"tools": tools, "environment": {"name": name}});
        let raw = RawRunner::connect_announced(&self.server.url(), &runner, &announcement).await;
        (runner, raw)
    }

    /// Admits an input through the in-process API (the door both edges share).
    async fn turn(
        &self,
        text: &str,
        declaration: Option<Value>,
        tool_names: Option<Value>,
    ) -> Result<ExecutionId, Refusal> {
        let caller = self.server.caller(&self.agent).await;
        let input = CreateInput {
            text: text.to_owned(),
            execution_declaration: declaration,
            tool_names,
            ..CreateInput::default()
        };
        self.server.server.api.create_input(&caller, input).await.map(|admitted| admitted.execution_public_id)
    }

    /// Admits an input under the standing profile with `runner` selected among its candidates.
    async fn turn_selecting(&self, text: &str, runner: nexus_proto::RunnerId) -> Result<ExecutionId, Refusal> {
        let caller = self.server.caller(&self.agent).await;
        let input =
            CreateInput { text: text.to_owned(), runner_executor_public_id: Some(runner), ..CreateInput::default() };
        self.server.server.api.create_input(&caller, input).await.map(|admitted| admitted.execution_public_id)
    }

    /// Waits until the execution is quiescent (completed, canceled or needs_attention).
    async fn settled(&self, execution: ExecutionId) -> ExecutionRow {
        self.server.settled(execution, SETTLE).await
    }
}

fn field_named(answer: &Answer, field: &str) {
    assert!(answer.message().contains(field), "the message should name {field}: {}", answer.message());
}

/// The message starts with the field path and carries the spec's word.
fn names(answer: &Answer, field: &str, word: &str) {
    let message = answer.message();
    assert!(message.starts_with(field), "the message should start with {field}: {message}");
    assert!(message.contains(word), "the message should carry {word}: {message}");
}

// ---- tool entries -------------------------------------------------------------------------------

const EFFECT: &str = r#"{"kind":"read_only","destructive":false,"effect_scope":"closed","idempotency":"intrinsic","reconciliation":"none"}"#;

fn effect() -> Value {
    serde_json::from_str(EFFECT).expect("effect profile")
}

/// An ordinary nested function declaration.
fn function(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "description": format!("{name} does one thing."),
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}})
}

/// A runner-routed callable.
fn routed(name: &str, runner: Uuid, served: &str) -> Value {
    let mut entry = function(name);
    entry["route"] = json!({"kind": "runner", "runner_executor_public_id": runner, "tool_name": served});
    entry
}

/// A model announcement (description and input schema).
fn served(name: &str) -> Value {
    json!({"name": name, "description": format!("{name} as served."), "effect_profile": effect(),
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}})
}

/// An operator-only announcement (no description, no input schema).
fn operator_only(name: &str) -> Value {
    json!({"name": name, "effect_profile": effect()})
}

/// The callable name of an entry: `function.name`, falling back to `name`.
fn entry_name(entry: &Value) -> &str {
    entry["function"]["name"].as_str().or_else(|| entry["name"].as_str()).unwrap_or_default()
}

fn entry_names(entries: &[Value]) -> Vec<&str> {
    entries.iter().map(entry_name).collect()
}

fn find<'a>(entries: &'a [Value], name: &str) -> &'a Value {
    entries.iter().find(|e| entry_name(e) == name).unwrap_or_else(|| panic!("{name} is missing: {entries:?}"))
}

// ---- the fake provider --------------------------------------------------------------------------

type Answerer = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

#[derive(Clone)]
struct Fake {
    requests: Arc<Mutex<Vec<Value>>>,
    answer: Answerer,
    gate: Arc<Semaphore>,
}

/// An OpenAI-compatible chat-completions endpoint that records every request body before it
/// answers. A closed gate holds answers (not the recording) until [`FakeProvider::release`].
struct FakeProvider {
    url: String,
    fake: Fake,
    serve: tokio::task::JoinHandle<()>,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.serve.abort();
    }
}

impl FakeProvider {
    async fn start(open: bool, answer: impl Fn(&Value) -> Value + Send + Sync + 'static) -> FakeProvider {
        let permits = if open { Semaphore::MAX_PERMITS } else { 0 };
        let fake = Fake { requests: Arc::default(), answer: Arc::new(answer), gate: Arc::new(Semaphore::new(permits)) };
        let app =
            axum::Router::new().route("/v1/chat/completions", axum::routing::post(complete)).with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/v1", listener.local_addr().expect("address"));
        let serve = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeProvider { url, fake, serve }
    }

    fn requests(&self) -> Vec<Value> {
        self.fake.requests.lock().expect("requests").clone()
    }

    /// The requests of the turn whose user text is `text`, in order.
    fn turn(&self, text: &str) -> Vec<Value> {
        self.requests().into_iter().filter(|r| user_text(r) == Some(text)).collect()
    }

    fn release(&self) {
        self.fake.gate.add_permits(1_000);
    }
}

async fn complete(State(fake): State<Fake>, axum::Json(body): axum::Json<Value>) -> axum::Json<Value> {
    fake.requests.lock().expect("requests").push(body.clone());
    if let Ok(permit) = fake.gate.acquire().await {
        permit.forget();
    }
    axum::Json((fake.answer)(&body))
}

/// A door whose `wire/<model>` models are answered by a fake provider.
async fn wire_door(answer: impl Fn(&Value) -> Value + Send + Sync + 'static) -> (Door, FakeProvider) {
    wire_door_gated(true, answer).await
}

async fn wire_door_gated(open: bool, answer: impl Fn(&Value) -> Value + Send + Sync + 'static) -> (Door, FakeProvider) {
    let fake = FakeProvider::start(open, answer).await;
    let url = fake.url.clone();
    let d = door_with(move |config| {
        config.providers.providers.insert(
            "wire".into(),
            ProviderConfig {
                base_url: Some(url),
                allow_any_model: true,
                ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
            },
        );
    })
    .await;
    (d, fake)
}

/// The first user message of a request.
fn user_text(request: &Value) -> Option<&str> {
    request["messages"].as_array()?.iter().find(|m| m["role"] == "user").and_then(|m| m["content"].as_str())
}

fn tool_results(request: &Value) -> Vec<String> {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    messages.iter().filter(|m| m["role"] == "tool").filter_map(|m| m["content"].as_str().map(str::to_owned)).collect()
}

fn system_texts(request: &Value) -> Vec<String> {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    messages.iter().filter(|m| m["role"] == "system").filter_map(|m| m["content"].as_str().map(str::to_owned)).collect()
}

/// The tools a request offers (empty when it offers none).
fn offered(request: &Value) -> Vec<Value> {
    request["tools"].as_array().cloned().unwrap_or_default()
}

fn offered_names(request: &Value) -> Vec<String> {
    offered(request).iter().map(|t| entry_name(t).to_owned()).collect()
}

/// The `strict` a wire entry carries, wherever it carries it.
fn wire_strict(tool: &Value) -> Option<bool> {
    tool.get("strict").or_else(|| tool["function"].get("strict")).and_then(Value::as_bool)
}

fn say(text: &str) -> Value {
    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
}

fn calls(calls: &[(&str, Value)]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, arguments))| {
            json!({"id": format!("call_{i}"), "type": "function", "function": {"name": name, "arguments": arguments.to_string()}})
        })
        .collect();
    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": tool_calls}, "finish_reason": "tool_calls"}]})
}

fn decline() -> Value {
    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null, "refusal": "declined"}, "finish_reason": "content_filter"}]})
}

// ---- SHA-256, for the collision names (`docs/declaration.md`, "Collision names") ----------------

/// SHA-256 (FIPS 180-4) as lowercase hex; the suite derives collision names independently.
fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
        0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
        0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
        0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
        0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
        0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
        0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut state: [u32; 8] =
        [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    let mut message = data.to_vec();
    message.push(0x80);
    while message.len() % 64 != 56 {
        message.push(0);
    }
    let bits = u64::try_from(data.len()).expect("length") * 8;
    message.extend_from_slice(&bits.to_be_bytes());
    for block in message.chunks(64) {
        let mut w = [0u32; 64];
        for (word, bytes) in w.iter_mut().zip(block.chunks(4)) {
            *word = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let mut v = state;
        for (k, wi) in K.iter().zip(w) {
            let [a, b, c, d, e, f, g, h] = v;
            let t1 = h
                .wrapping_add(e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25))
                .wrapping_add((e & f) ^ (!e & g))
                .wrapping_add(*k)
                .wrapping_add(wi);
            let t2 =
                (a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22)).wrapping_add((a & b) ^ (a & c) ^ (b & c));
            v = [t1.wrapping_add(t2), a, b, c, d.wrapping_add(t1), e, f, g];
        }
        for (s, x) in state.iter_mut().zip(v) {
            *s = s.wrapping_add(x);
        }
    }
    state.iter().map(|x| format!("{x:08x}")).collect()
}

/// The spec's collision name: the first 49 characters, `__`, and 12 hex characters of SHA-256
/// over (full Runner UUID, NUL, served name).
fn qualified(runner: Uuid, served_name: &str) -> String {
    let mut input = runner.to_string().into_bytes();
    input.push(0);
    input.extend_from_slice(served_name.as_bytes());
    let head: String = served_name.chars().take(49).collect();
    format!("{head}__{}", &sha256_hex(&input)[..12])
}
#[tokio::test]
async fn r01_configuration_root_is_required() {
    let d = door().await;
    d.seed().await;
    for body in [
        json!({}),
        json!({"configuration": null}),
        json!({"configuration": []}),
        json!({"configuration": "x"}),
        json!([1]),
    ] {
        d.refused(&body, 400, "parameter_missing").await;
    }
}

#[tokio::test]
async fn r02_prompt_documents_shapes() {
    let d = door().await;
    d.seed().await;
    for docs in [json!([]), json!("x"), json!({"system_prompt": "text"}), json!({"summarizer": 3})] {
        d.refused(&json!({"configuration": {}, "prompt_documents": docs}), 400, "parameter_missing").await;
    }
}

#[tokio::test]
async fn r03_omitted_null_or_empty_documents_clear_slots() {
    let d = door().await;
    for (docs, system_cleared, summarizer_cleared) in [
        (None, true, true),
        (Some(json!(null)), true, true),
        (Some(json!({})), true, true),
        (Some(json!({"summarizer": {"content": "kept"}})), true, false),
        (Some(json!({"system_prompt": {"content": "kept"}, "summarizer": null})), false, true),
    ] {
        d.seed().await;
        let mut body = json!({"configuration": {}});
        if let Some(docs) = docs.clone() {
            body["prompt_documents"] = docs;
        }
        let answer = d.http.declare(&body).await;
        assert_eq!(answer.status, 200, "{body}");
        let row = d.server.store().profile(d.agent.member()).await.expect("store").expect("profile");
        assert_eq!(row.system_prompt.is_none(), system_cleared, "{docs:?}");
        assert_eq!(row.summarizer.is_none(), summarizer_cleared, "{docs:?}");
    }
}

#[tokio::test]
async fn r04_slot_content_and_roles() {
    let d = door().await;
    d.seed().await;
    d.refused(&json!({"configuration": {}, "prompt_documents": {"system_prompt": {}}}), 422, "prompt_document_invalid")
        .await;
    d.refused(
        &json!({"configuration": {}, "prompt_documents": {"summarizer": {"content": "x", "role": "developer"}}}),
        422,
        "prompt_document_invalid",
    )
    .await;
    let answer = d
        .http
        .declare(&json!({"configuration": {}, "prompt_documents": {"system_prompt": {"content": ""}, "summarizer": {"content": "s"}}}))
        .await;
    assert_eq!(answer.status, 200);
    let row = d.server.store().profile(d.agent.member()).await.expect("store").expect("profile");
    assert_eq!(
        row.system_prompt,
        Some(json!({"content": "", "role": "system"})),
        "empty content stores an empty document"
    );
    assert_eq!(row.summarizer, Some(json!({"content": "s", "role": "system"})));
    let developer = d
        .http
        .declare(
            &json!({"configuration": {}, "prompt_documents": {"system_prompt": {"content": "x", "role": "developer"}}}),
        )
        .await;
    assert_eq!(developer.status, 200);
}

#[tokio::test]
async fn r05_whole_replacement_reads_back_cleared_fields() {
    let d = door().await;
    d.seed().await;
    let answer = d.http.declare(&json!({"configuration": {}})).await;
    assert_eq!(answer.status, 200);
    let configuration = &d.http.profile().await.body["configuration"];
    assert_eq!(configuration["tool_definitions"], json!([]));
    assert_eq!(configuration["kernel_tools"], json!([]));
    assert_eq!(configuration["runner_executor_public_ids"], json!([]));
    assert_eq!(configuration["runner_tool_names"], Value::Null);
    assert_eq!(configuration["default_model"], Value::Null);
    assert_eq!(configuration["approval_mode"], Value::Null);
    assert_eq!(configuration["fallback_models"], Value::Null);
}

#[tokio::test]
async fn r06_refusals_change_nothing_and_success_bumps_versions() {
    let d = door().await;
    d.seed().await;
    let (before, _) = d.snapshot().await;
    d.refused(&json!({"configuration": {"approval_mode": "sometimes"}}), 422, "validation_failed").await;
    d.refused(
        &json!({"configuration": {}, "prompt_documents": {"system_prompt": {"content": "x".repeat(65_537)}}}),
        422,
        "prompt_document_too_large",
    )
    .await;
    // Identical content still advances both versions.
    let again = d.seed().await;
    assert_eq!(
        again["prompt_documents"]["system_prompt"]["version"],
        json!(before["system_prompt_version"].as_i64().unwrap_or(0) + 1)
    );
    assert_eq!(
        again["prompt_documents"]["summarizer"]["version"],
        json!(before["summarizer_version"].as_i64().unwrap_or(0) + 1)
    );
}

#[tokio::test]
async fn r08_unknown_fields_are_ignored() {
    let d = door().await;
    let answer = d
        .http
        .declare(&json!({"configuration": {"validation_context": {"admin": true}, "surprise": 1}, "extra_root": true, "prompt_documents": {"persona": {"content": "x"}}}))
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let configuration = &d.http.profile().await.body["configuration"];
    assert_eq!(configuration.get("validation_context"), None, "validation_context cannot be injected");
    assert_eq!(configuration.get("surprise"), None);
}

#[tokio::test]
async fn r09_credentials_planes_and_rate_limit() {
    let server = TestServer::start_with(&[], |config| {
        config.doors.requests_per_minute = 1;
        config.doors.burst = 3;
    })
    .await;
    let agent = server.agent("agent").await;
    let human = server.human("person").await;
    let runner = server.runner("runner").await;
    let body = json!({"configuration": {}});
    let anonymous = Http::new(&server.url(), None).declare(&body).await;
    assert_eq!((anonymous.status, anonymous.code()), (401, Some("unauthorized")));
    let transport = Http::new(&server.url(), Some(&runner.token)).declare(&body).await;
    assert_eq!((transport.status, transport.code()), (401, Some("unauthorized")));
    let garbage = Http::new(&server.url(), Some("sk-nexus-api-v1-0000")).declare(&body).await;
    assert_eq!((garbage.status, garbage.code()), (401, Some("unauthorized")));
    let person = Http::new(&server.url(), Some(&human.token)).declare(&body).await;
    assert_eq!((person.status, person.code()), (403, Some("not_agent")));
    // The budget: a burst of 3, then 429 with Retry-After in whole seconds.
    let http = Http::new(&server.url(), Some(&agent.token));
    for _ in 0..3 {
        assert_eq!(http.profile().await.status, 200);
    }
    let limited = http.declare(&body).await;
    assert_eq!((limited.status, limited.code()), (429, Some("rate_limited")));
    let seconds: u64 =
        limited.retry_after.as_deref().and_then(|s| s.parse().ok()).expect("Retry-After in whole seconds");
    assert!((1..=60).contains(&seconds), "{seconds}");
}

#[tokio::test]
async fn r10_the_answer_is_the_profile_and_get_output_round_trips() {
    let d = door().await;
    let put = d.seed().await;
    let mut get = d.http.profile().await.body;
    let mut put_body = put.clone();
    put_body["measured_at"] = Value::Null;
    get["measured_at"] = Value::Null;
    assert_eq!(put_body, get, "PUT answers exactly what GET reads");
    // The GET output is itself an accepted PUT body, and converges to the same contents.
    let before = d.server.store().profile(d.agent.member()).await.expect("store").expect("profile");
    let again = d.http.declare(&get).await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    let after = d.server.store().profile(d.agent.member()).await.expect("store").expect("profile");
    assert_eq!(after.configuration, before.configuration);
    assert_eq!(after.system_prompt, before.system_prompt);
    assert_eq!(after.summarizer, before.summarizer);
    assert_eq!(after.system_prompt_version, before.system_prompt_version + 1);
}

#[tokio::test]
async fn r11_default_model_resolver_words() {
    let d = door().await;
    d.seed().await;
    for (model, word) in [
        ("nowhere/x", "unknown_provider"),
        ("bare-word", "unknown_model"),
        ("model_selector:fast", "unknown_model"),
        ("scripted/absent", "unknown_model"),
        ("openrouter/z-ai/glm-5.3", "missing_credential"),
    ] {
        let answer = d.refused(&json!({"configuration": {"default_model": model}}), 422, "validation_failed").await;
        field_named(&answer, "default_model");
        field_named(&answer, word);
    }
}

#[tokio::test]
async fn r12_approval_mode_vocabulary_and_requirement() {
    let d = door().await;
    d.seed().await;
    let runner = d.server.runner("runner").await;
    for configuration in [
        json!({"approval_mode": "sometimes"}),
        json!({"approval_mode": 1}),
        json!({"kernel_tools": ["nexus.memory.read"]}),
        json!({"runner_executor_public_ids": [runner.id]}),
        json!({"tool_definitions": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
        json!({"lifecycle_hooks": {"stop": {"tool": "review", "timeout_ms": 1000, "max_continuations": 1}}}),
    ] {
        let answer = d.refused(&json!({"configuration": configuration}), 422, "validation_failed").await;
        field_named(&answer, "approval_mode");
    }
    for mode in ["bypass", "ask", "rules"] {
        let answer = d
            .http
            .declare(&json!({"configuration": {"approval_mode": mode, "runner_executor_public_ids": [runner.id]}}))
            .await;
        assert_eq!(answer.status, 200, "{mode}");
    }
    // Candidates whose runner_tool_names is [] import nothing and need no mode.
    let answer = d
        .http
        .declare(&json!({"configuration": {"runner_executor_public_ids": [runner.id], "runner_tool_names": []}}))
        .await;
    assert_eq!(answer.status, 200);
}

#[tokio::test]
async fn named_definitions_mint_replace_delete_restore() {
    let d = door().await;
    let body = json!({"scope": "instance", "description": "Reviews changes.", "configuration": {"default_model": "scripted/default"}});
    let minted = d.http.put("/agent_api/v1/profile/agents/reviewer", &body).await;
    assert_eq!(minted.status, 201, "{:?}", minted.body);
    assert_eq!(minted.body["identifier"], "agent/reviewer");
    let replaced = d.http.put("/agent_api/v1/profile/agents/reviewer", &body).await;
    assert_eq!(replaced.status, 200);
    let list = d.http.get("/agent_api/v1/profile/agents").await;
    assert_eq!(list.body["agents"].as_array().map(Vec::len), Some(1));
    assert_eq!(d.http.delete("/agent_api/v1/profile/agents/reviewer").await.status, 204);
    assert_eq!(d.http.get("/agent_api/v1/profile/agents").await.body["agents"], json!([]));
    assert_eq!(d.http.delete("/agent_api/v1/profile/agents/reviewer").await.status, 404);
    let restored = d.http.put("/agent_api/v1/profile/agents/reviewer", &body).await;
    assert_eq!(restored.status, 200, "a deleted definition is restored, not minted");
    // The handle grammar: anything else is a route miss.
    assert_eq!(d.http.put("/agent_api/v1/profile/agents/Bad_Name", &body).await.status, 404);
    assert_eq!(d.http.put("/agent_api/v1/profile/agents/x", &body).await.status, 404);
    for (bad, status, code) in [
        (json!({"description": "d", "configuration": {}}), 400, "parameter_missing"),
        (json!({"scope": "everyone", "description": "d", "configuration": {}}), 422, "validation_failed"),
        (json!({"scope": "steward", "description": "two\nlines", "configuration": {}}), 422, "validation_failed"),
        (
            json!({"scope": "steward", "description": "d", "configuration": {"approval_mode": "maybe"}}),
            422,
            "validation_failed",
        ),
    ] {
        let answer = d.http.put("/agent_api/v1/profile/agents/other", &bad).await;
        assert_eq!((answer.status, answer.code()), (status, Some(code)), "{bad}");
    }
}

#[tokio::test]
async fn assembly_preview_writes_nothing() {
    let d = door().await;
    let runner = d.server.runner("runner").await;
    let (raw, _) = nexus_tests::RawRunner::connect(&d.server.url(), runner.id, &runner.token).await;
    let effect = json!({"kind": "read_only", "destructive": false, "effect_scope": "closed", "idempotency": "intrinsic", "reconciliation": "none"});
    raw.announce(&json!({"tools": [
        {"name": "grep", "description": "Search.", "input_schema": {"type": "object"}, "effect_profile": effect},
        {"name": "logs", "effect_profile": effect}
    ], "environment": {"os": "linux"}}))
        .await;
    let other = d.server.runner("other").await;
    let before = d.server.store().fingerprint().await.expect("fingerprint");
    let body = json!({"default_runner_executor_public_id": runner.id, "configuration": {"runner_executor_public_ids": [runner.id]}});
    let answer = d.http.post("/agent_api/v1/tools/assembly", &body).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let tools = answer.body["tool_definitions"].as_array().expect("tools");
    assert_eq!(tools.len(), 1, "operator-only announcements are not imported");
    assert_eq!(tools[0]["function"]["name"], "grep");
    assert_eq!(tools[0]["defer_loading"], true);
    assert_eq!(answer.body["environment"]["default_runner_executor_public_id"], json!(runner.id));
    assert_eq!(answer.body["environment"]["runner_candidates"][0]["environment"]["os"], "linux");
    let missing = d.http.post("/agent_api/v1/tools/assembly", &json!({"configuration": {}})).await;
    assert_eq!((missing.status, missing.code()), (400, Some("parameter_missing")));
    let undeclared = d
        .http
        .post("/agent_api/v1/tools/assembly", &json!({"default_runner_executor_public_id": other.id, "configuration": {"runner_executor_public_ids": [runner.id]}}))
        .await;
    assert_eq!((undeclared.status, undeclared.code()), (422, Some("runner_not_declared")));
    let big = json!({"default_runner_executor_public_id": null, "configuration": {"tool_definitions": [{"type": "function", "function": {"name": "f", "description": "x".repeat(1_100_000)}}]}});
    let too_large = d.http.post("/agent_api/v1/tools/assembly", &big).await;
    assert_eq!((too_large.status, too_large.code()), (413, Some("content_too_large")));
    assert_eq!(d.server.store().fingerprint().await.expect("fingerprint"), before, "the preview wrote to the store");
    // The fingerprint does see writes.
    assert_eq!(d.http.declare(&json!({"configuration": {}})).await.status, 200);
    assert_ne!(d.server.store().fingerprint().await.expect("fingerprint"), before);
}

// ---- the rest of the profile door (`docs/declaration.md`, "Configuration fields") ---------------

fn template(variables: Value) -> Value {
    json!({"blocks": [{"type": "slot", "slot": "system_prompt"}, {"type": "history"}, {"type": "input"}], "variables": variables})
}

#[tokio::test]
async fn r07_template_variables_are_validated_with_the_new_system_prompt() {
    let d = door().await;
    let body = |variables: Value, content: &str| {
        json!({"configuration": {"prompt_mechanism": "assembly", "prompt_template": template(variables)},
               "prompt_documents": {"system_prompt": {"content": content}}})
    };
    let first = d.http.declare(&body(json!({"tone": "calm"}), "Be {{tone}}, {{agent}}.")).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    // Renaming the variable together with the document succeeds in one PUT.
    let renamed = d.http.declare(&body(json!({"voice": "calm"}), "Be {{voice}}.")).await;
    assert_eq!(renamed.status, 200, "{:?}", renamed.body);
    let slot = d.http.get("/agent_api/v1/profile/prompt_documents/system_prompt").await;
    assert_eq!(slot.body["content"], "Be {{voice}}.");
    // The old name is validated against the template of the same body, and nothing changes.
    let stale = d.refused(&body(json!({"voice": "calm"}), "Be {{tone}}."), 422, "prompt_document_macro_unknown").await;
    names(&stale, "prompt_documents.system_prompt", "prompt_document_macro_unknown");
    // A template stored unread (prompt_mechanism default) puts no variable in force.
    let unread = json!({"configuration": {"prompt_mechanism": "default", "prompt_template": template(json!({"voice": "x"}))},
        "prompt_documents": {"system_prompt": {"content": "{{voice}}"}}});
    d.refused(&unread, 422, "prompt_document_macro_unknown").await;
    // A later individual edit uses the then-current template.
    let path = "/agent_api/v1/profile/prompt_documents/system_prompt";
    assert_eq!(d.http.put(path, &json!({"content": "Now {{voice}}."})).await.status, 200);
    let old = d.http.put(path, &json!({"content": "Now {{tone}}."})).await;
    assert_eq!((old.status, old.code()), (422, Some("prompt_document_macro_unknown")));
}

#[tokio::test]
async fn r11_default_model_disabled_and_hidden_words() {
    let d = door_with(with_providers).await;
    d.seed().await;
    for (model, word) in [("off/m", "provider_disabled"), ("veiled/secret", "model_hidden")] {
        d.rejects(&json!({"default_model": model}), "configuration.default_model", word).await;
    }
    let configuration = d.accepts(&json!({"default_model": "any/some-model"})).await;
    assert_eq!(configuration["default_model"], "any/some-model");
}

// ---- the tool grammar (`docs/declaration.md`, "Tool definitions" to "Collision names") ----------

#[tokio::test]
async fn r13_tool_definitions_list_bound_and_canonical_order() {
    let d = door().await;
    d.seed().await;
    let field = "configuration.tool_definitions";
    for (row, list, at) in [
        ("not a list", json!("bash"), field),
        ("an object is not a list", json!({"bash": {}}), field),
        ("an entry that is not an object", json!([function("a"), 1]), "configuration.tool_definitions[1]"),
        ("a string entry", json!(["bash"]), "configuration.tool_definitions[0]"),
    ] {
        let answer = d
            .refused(
                &json!({"configuration": {"approval_mode": "bypass", "tool_definitions": list}}),
                422,
                "validation_failed",
            )
            .await;
        assert!(answer.message().starts_with(at), "{row}: {}", answer.message());
    }
    // The 1 MiB bound is over canonical JSON: exactly at the bound is accepted, one byte over is not.
    let sized = |total: usize| {
        let empty = json!([{"type": "function", "function": {"name": "big", "description": ""}}]).to_string().len();
        json!([{"type": "function", "function": {"name": "big", "description": "x".repeat(total - empty)}}])
    };
    assert_eq!(sized(1_048_576).to_string().len(), 1_048_576);
    let at_bound = d
        .http
        .declare(&json!({"configuration": {"approval_mode": "bypass", "tool_definitions": sized(1_048_576)}}))
        .await;
    assert_eq!(at_bound.status, 200, "exactly 1048576 bytes is within the bound: {:?}", at_bound.code());
    d.rejects(&json!({"approval_mode": "bypass", "tool_definitions": sized(1_048_577)}), field, "").await;
    let preview = d.preview(&json!({"default_runner_executor_public_id": null, "configuration": {"tool_definitions": sized(1_048_577)}})).await;
    assert_eq!(
        (preview.status, preview.code()),
        (413, Some("content_too_large")),
        "the preview answers over-bound lists with 413"
    );
    let preview = d.preview(&json!({"default_runner_executor_public_id": null, "configuration": {"tool_definitions": sized(1_048_576)}})).await;
    assert_eq!(preview.status, 200, "the preview accepts a list at the bound");
    // Stored sorted by callable name, whatever the declared order.
    let declared =
        json!([function("zeta"), function("alpha"), function("Mid"), function("beta_2"), function("alpha_1")]);
    let stored = d.accepts(&json!({"approval_mode": "bypass", "tool_definitions": declared})).await;
    let stored = stored["tool_definitions"].as_array().cloned().expect("list");
    assert_eq!(entry_names(&stored), ["Mid", "alpha", "alpha_1", "beta_2", "zeta"]);
    assert_eq!(find(&stored, "zeta"), &function("zeta"), "an ordinary entry is stored as declared");
}

#[tokio::test]
async fn r14_nested_and_flat_forms_and_the_strict_wire_default() {
    let (d, fake) = wire_door(|_| say("done")).await;
    let schema =
        json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"]});
    let list = json!([
        {"type": "function", "function": {"name": "nested", "description": "n", "parameters": schema}},
        {"type": "function", "name": "flat", "description": "f", "parameters": schema},
        {"type": "function", "function": {"name": "strict_inside", "description": "s", "parameters": schema, "strict": true}},
        {"type": "function", "function": {"name": "loose_outside", "description": "s", "parameters": schema}, "strict": false},
        {"type": "function", "name": "flat_strict", "description": "s", "parameters": schema, "strict": true},
    ]);
    let configuration =
        d.accepts(&json!({"approval_mode": "bypass", "default_model": "wire/m", "tool_definitions": list})).await;
    let stored = configuration["tool_definitions"].as_array().cloned().expect("list");
    assert_eq!(stored.len(), 5, "both forms are accepted");
    for name in ["nested", "flat"] {
        let entry = find(&stored, name);
        assert_eq!(wire_strict(entry), None, "{name}: the wire default does not rewrite the stored declaration");
        let parameters = entry["function"].get("parameters").unwrap_or(&entry["parameters"]);
        assert_eq!(parameters, &schema, "{name}: the parameter schema is stored unchanged");
    }
    let execution = d.turn("strict", None, None).await.expect("admitted");
    d.settled(execution).await;
    let request = fake.turn("strict").into_iter().next().expect("the provider was asked");
    let wire = offered(&request);
    for (name, strict) in
        [("nested", false), ("flat", false), ("strict_inside", true), ("loose_outside", false), ("flat_strict", true)]
    {
        let tool = find(&wire, name);
        assert_eq!(wire_strict(tool), Some(strict), "{name} on the wire: {tool}");
        assert_eq!(tool["function"]["parameters"], schema, "{name}: the wire keeps the schema, required list included");
        assert_eq!(tool["type"], "function");
    }
}

#[tokio::test]
async fn r15_defer_loading_is_boolean_stored_stripped_and_visibility_only() {
    let (d, fake) = wire_door(|request| {
        if user_text(request) == Some("authority") && tool_results(request).is_empty() {
            calls(&[("later", json!({"q": "guess"}))])
        } else {
            say("done")
        }
    })
    .await;
    d.seed().await;
    let mut deferred = function("later");
    deferred["defer_loading"] = json!(true);
    for bad in [json!(null), json!("true"), json!(1), json!([])] {
        let mut entry = function("later");
        entry["defer_loading"] = bad.clone();
        d.rejects(
            &json!({"approval_mode": "bypass", "tool_definitions": [function("first"), entry]}),
            "configuration.tool_definitions[1]",
            "invalid",
        )
        .await;
    }
    let mut eager = function("eager");
    eager["defer_loading"] = json!(false);
    let stored =
        d.accepts(&json!({"approval_mode": "bypass", "tool_definitions": [deferred.clone(), eager.clone()]})).await;
    let stored = stored["tool_definitions"].as_array().cloned().expect("list");
    assert_eq!(find(&stored, "later")["defer_loading"], true, "the annotation is stored");
    assert_eq!(find(&stored, "eager")["defer_loading"], false);

    let search = d.kernel("tool_search").await["definition"].clone();
    let call = d.kernel("tool_call").await["definition"].clone();
    let mut deferred_search = search.clone();
    deferred_search["defer_loading"] = json!(true);
    let (runner, _raw) = d.runner("host", json!([served("later_served")])).await;
    let hidden_target = routed("later", runner.id, "later_served");
    let mut hidden_target_deferred = hidden_target.clone();
    hidden_target_deferred["defer_loading"] = json!(true);
    // (row, extra entries, kernel_tools, is the deferred schema hidden)
    let rows: Vec<(&str, Value, Value, bool)> = vec![
        ("eager search and call hide deferred schemas", json!([search, call]), json!([]), true),
        ("search without call exposes everything", json!([search]), json!([]), false),
        ("a deferred search exposes everything", json!([deferred_search, call]), json!([]), false),
        (
            "aliases of search and call count",
            json!([{"name": "Find", "canonical": "nexus.tools.search"}, {"name": "Invoke", "canonical": "nexus.tools.call"}]),
            json!([]),
            true,
        ),
        ("plain kernel imports count", json!([]), json!(["nexus.tools.search", "nexus.tools.call"]), true),
        ("no discovery at all exposes everything", json!([]), json!([]), false),
    ];
    for (row, extra, kernel_tools, hidden) in rows {
        let mut list = extra.as_array().cloned().expect("list");
        list.push(hidden_target_deferred.clone());
        list.push(eager.clone());
        let declaration = json!({"approval_mode": "bypass", "default_model": "wire/m", "tool_definitions": list, "kernel_tools": kernel_tools});
        let execution = d.turn(row, Some(declaration), None).await.expect("admitted");
        d.settled(execution).await;
        let request = fake.turn(row).into_iter().next().unwrap_or_else(|| panic!("{row}: the provider was not asked"));
        let names = offered_names(&request);
        assert_eq!(!names.contains(&"later".to_owned()), hidden, "{row}: offered {names:?}");
        assert!(names.contains(&"eager".to_owned()), "{row}: an eager schema is always offered: {names:?}");
        assert!(!request["tools"].to_string().contains("defer_loading"), "{row}: defer_loading reached the wire");
    }
    // Deferral is not a permission boundary: a guessed callable that is hidden still executes.
    let search = d.kernel("tool_search").await["definition"].clone();
    let call = d.kernel("tool_call").await["definition"].clone();
    let declaration = json!({"approval_mode": "bypass", "default_model": "wire/m",
        "tool_definitions": [search, call, hidden_target_deferred]});
    let execution = d.turn("authority", Some(declaration), None).await.expect("admitted");
    let task = wait_until("the guessed call's task", SETTLE, || async {
        d.server
            .store()
            .tasks_of(execution)
            .await
            .ok()
            .and_then(|tasks| tasks.into_iter().find(|t| t.callable_name == "later"))
    })
    .await;
    assert!(!offered_names(&fake.turn("authority")[0]).contains(&"later".to_owned()), "later was hidden");
    assert_eq!(task.error_key, None, "the hidden callable was refused: {task:?}");
    assert_eq!(task.target_executor_public_id, Some(runner.runner()));
    assert_eq!(task.tool_name, "later_served");
}

#[tokio::test]
async fn r16_route_grammar() {
    let d = door().await;
    d.seed().await;
    let id = Uuid::new_v4();
    let with_route = |route: Value| {
        let mut entry = function("deploy");
        entry["route"] = route;
        json!({"approval_mode": "bypass", "tool_definitions": [function("first"), entry]})
    };
    let at = "configuration.tool_definitions[1]";
    let rows: Vec<(&str, Value, &str)> = vec![
        (
            "kind other than runner",
            with_route(json!({"kind": "local", "runner_executor_public_id": id, "tool_name": "deploy"})),
            "invalid_tool_route",
        ),
        (
            "kind missing",
            with_route(json!({"runner_executor_public_id": id, "tool_name": "deploy"})),
            "invalid_tool_route",
        ),
        (
            "a fourth key",
            with_route(
                json!({"kind": "runner", "runner_executor_public_id": id, "tool_name": "deploy", "timeout_ms": 5}),
            ),
            "invalid_tool_route",
        ),
        (
            "malformed UUID",
            with_route(json!({"kind": "runner", "runner_executor_public_id": "runner-1", "tool_name": "deploy"})),
            "invalid_tool_route",
        ),
        (
            "UUID not a string",
            with_route(json!({"kind": "runner", "runner_executor_public_id": 7, "tool_name": "deploy"})),
            "invalid_tool_route",
        ),
        (
            "tool_name missing",
            with_route(json!({"kind": "runner", "runner_executor_public_id": id})),
            "invalid_tool_route",
        ),
        (
            "tool_name empty",
            with_route(json!({"kind": "runner", "runner_executor_public_id": id, "tool_name": ""})),
            "invalid_tool_route",
        ),
        (
            "tool_name over 128",
            with_route(json!({"kind": "runner", "runner_executor_public_id": id, "tool_name": "t".repeat(129)})),
            "invalid_tool_route",
        ),
        (
            "tool_name with NUL",
            with_route(json!({"kind": "runner", "runner_executor_public_id": id, "tool_name": "de\u{0}ploy"})),
            "invalid_tool_route",
        ),
        (
            "tool_name a kernel wire name",
            with_route(json!({"kind": "runner", "runner_executor_public_id": id, "tool_name": "memory_read"})),
            "invalid_tool_route",
        ),
        (
            "tool_name a kernel canonical name",
            with_route(json!({"kind": "runner", "runner_executor_public_id": id, "tool_name": "nexus.memory.read"})),
            "invalid_tool_route",
        ),
        ("route not an object", with_route(json!("runner")), "invalid_tool_route"),
        ("UUID missing", with_route(json!({"kind": "runner", "tool_name": "deploy"})), "runner_target_required"),
        (
            "UUID null",
            with_route(json!({"kind": "runner", "runner_executor_public_id": null, "tool_name": "deploy"})),
            "runner_target_required",
        ),
        (
            "an alias with a route",
            json!({"approval_mode": "bypass", "tool_definitions": [function("first"),
                {"name": "Recall", "canonical": "nexus.memory.read", "route": {"kind": "runner", "runner_executor_public_id": id, "tool_name": "recall"}}]}),
            "invalid_tool_route",
        ),
        (
            "a kernel name with a route",
            json!({"approval_mode": "bypass", "tool_definitions": [function("first"), routed("memory_read", id, "recall")]}),
            "invalid_tool_route",
        ),
    ];
    for (row, configuration, word) in rows {
        let answer = d.refused(&json!({"configuration": configuration}), 422, "validation_failed").await;
        assert!(answer.message().starts_with(at), "{row}: {}", answer.message());
        assert!(answer.message().contains(word), "{row}: {} should carry {word}", answer.message());
    }
    // Accepted: tool_name of 128 characters, the source-routed skill, and a target that does
    // not exist yet (eligibility and the served capability are judged at acceptance).
    let stored = d
        .accepts(&json!({"approval_mode": "bypass", "tool_definitions": [
            routed("long", id, &"t".repeat(128)), routed("skills", id, "skill"), routed("deploy", Uuid::new_v4(), "deploy")]}))
        .await;
    let stored = stored["tool_definitions"].as_array().cloned().expect("list");
    assert_eq!(
        find(&stored, "skills")["route"],
        json!({"kind": "runner", "runner_executor_public_id": id, "tool_name": "skill"})
    );
}

#[tokio::test]
async fn r17_routing_metadata_and_alias_facts_never_reach_the_provider() {
    let (d, fake) = wire_door(|_| say("done")).await;
    let (runner, _raw) = d.runner("host", json!([served("bash"), served("grep")])).await;
    let alias = json!({"name": "Question", "canonical": "nexus.human.ask",
        "params": {"single": {"maps_to": "multi", "invert": true, "description": "true allows one option only."}},
        "omit": ["options"], "description": "Ask the human; keep the answer with {{memory_write}}."});
    let configuration = d
        .accepts(&json!({"approval_mode": "bypass", "default_model": "wire/m",
            "runner_executor_public_ids": [runner.id], "runner_tool_names": ["grep"],
            "tool_definitions": [routed("shell", runner.id, "bash"), alias]}))
        .await;
    let stored = configuration["tool_definitions"].as_array().cloned().expect("list");
    assert!(find(&stored, "shell").get("route").is_some(), "the route is stored");
    assert_eq!(find(&stored, "Question")["canonical"], "nexus.human.ask", "the alias facts are stored");
    let execution = d.turn("wire", None, None).await.expect("admitted");
    d.settled(execution).await;
    let request = fake.turn("wire").into_iter().next().expect("the provider was asked");
    let wire = offered(&request);
    for tool in &wire {
        let keys: Vec<&str> = tool.as_object().expect("object").keys().map(String::as_str).collect();
        assert!(
            keys.iter().all(|k| matches!(*k, "type" | "function" | "strict")),
            "{} carries {keys:?}",
            entry_name(tool)
        );
        let function_keys: Vec<&str> =
            tool["function"].as_object().expect("function").keys().map(String::as_str).collect();
        assert!(
            function_keys.iter().all(|k| matches!(*k, "name" | "description" | "parameters" | "strict")),
            "{} function carries {function_keys:?}",
            entry_name(tool)
        );
    }
    let text = request["tools"].to_string();
    for leaked in
        ["route", "runner_executor_public_id", "canonical", "maps_to", "\"omit\"", "\"params\"", "defer_loading"]
    {
        assert!(!text.contains(leaked), "{leaked} reached the provider: {text}");
    }
    let mut names: Vec<String> = offered_names(&request);
    names.sort();
    assert_eq!(names, ["Question", "grep", "shell"], "the routed callable keeps its authored name on the wire");
    let question = find(&wire, "Question");
    assert!(question["function"]["parameters"]["properties"].get("single").is_some());
    assert!(question["function"]["parameters"]["properties"].get("options").is_none(), "omitted parameters stay off");
}

#[tokio::test]
async fn r18_duplicate_callable_names_of_any_kind() {
    let d = door().await;
    d.seed().await;
    let id = Uuid::new_v4();
    let flat = json!({"type": "function", "name": "dup", "description": "flat", "parameters": {"type": "object"}});
    let rows: Vec<(&str, Value)> = vec![
        ("two ordinary entries", json!([function("dup"), function("dup")])),
        ("nested and flat", json!([function("dup"), flat])),
        ("ordinary and routed", json!([function("dup"), routed("dup", id, "served")])),
        ("ordinary and alias", json!([function("dup"), {"name": "dup", "canonical": "nexus.memory.read"}])),
        (
            "two aliases",
            json!([{"name": "Recall", "canonical": "nexus.memory.read"}, {"name": "Recall", "canonical": "nexus.memory.ls"}]),
        ),
    ];
    for (row, list) in rows {
        let answer = d
            .refused(
                &json!({"configuration": {"approval_mode": "bypass", "tool_definitions": list}}),
                422,
                "validation_failed",
            )
            .await;
        assert!(answer.message().starts_with("configuration.tool_definitions[1]"), "{row}: {}", answer.message());
        assert!(answer.message().contains("duplicate_tool_name"), "{row}: {}", answer.message());
    }
    // Several spellings of one canonical, the plain name among them, are lawful.
    let ask = d.kernel("ask").await["definition"].clone();
    let lawful = d
        .accepts(&json!({"approval_mode": "bypass", "tool_definitions": [ask,
            {"name": "Question", "canonical": "nexus.human.ask"}, {"name": "Query", "canonical": "nexus.human.ask"}]}))
        .await;
    assert_eq!(lawful["tool_definitions"].as_array().map(Vec::len), Some(3));
}

#[tokio::test]
async fn r19_a_kernel_name_in_other_bytes_is_redefined() {
    let d = door().await;
    d.seed().await;
    let ask = d.kernel("ask").await;
    let definition = ask["definition"].clone();
    let mut other_description = definition.clone();
    other_description["function"]["description"] = json!("Ask something.");
    let mut other_parameters = definition.clone();
    other_parameters["function"]["parameters"]["properties"]["extra"] = json!({"type": "string"});
    let mut canonical_spelling = function("nexus.memory.read");
    canonical_spelling["function"]["description"] = json!("Reads.");
    let mut with_strict = definition.clone();
    with_strict["function"]["strict"] = json!(true);
    for (row, entry) in [
        ("other description", other_description),
        ("other parameters", other_parameters),
        ("a bare name", json!({"type": "function", "function": {"name": "ask"}})),
        ("the canonical spelling in other bytes", canonical_spelling),
        ("a strict flag the catalog lacks", with_strict),
    ] {
        let body =
            json!({"configuration": {"approval_mode": "bypass", "tool_definitions": [function("first"), entry]}});
        let answer = d.refused(&body, 422, "validation_failed").await;
        assert!(answer.message().starts_with("configuration.tool_definitions[1]"), "{row}: {}", answer.message());
        assert!(answer.message().contains("kernel_tool_redefined"), "{row}: {}", answer.message());
    }
    // The catalog's exact bytes are accepted, with or without the presentation annotation.
    let mut deferred = definition.clone();
    deferred["defer_loading"] = json!(true);
    for entry in [definition.clone(), deferred] {
        let stored = d.accepts(&json!({"approval_mode": "bypass", "tool_definitions": [entry.clone()]})).await;
        assert_eq!(stored["tool_definitions"], json!([entry]));
    }
}

#[tokio::test]
async fn r20_alias_refusal_words() {
    let d = door().await;
    d.seed().await;
    let rows: Vec<(&str, Value, &str)> = vec![
        (
            "canonical not live",
            json!({"name": "Recall", "canonical": "nexus.memory.recall"}),
            "alias_canonical_unknown",
        ),
        (
            "canonical retired",
            json!({"name": "Compose", "canonical": "nexus.graph.compose"}),
            "alias_canonical_unknown",
        ),
        ("a reserved name re-pointed", json!({"name": "ask", "canonical": "nexus.memory.read"}), "alias_name_reserved"),
        (
            "another wire name re-pointed",
            json!({"name": "wait", "canonical": "nexus.human.ask"}),
            "alias_name_reserved",
        ),
        (
            "a canonical spelling re-pointed",
            json!({"name": "nexus.memory.read", "canonical": "nexus.human.ask"}),
            "alias_name_reserved",
        ),
        (
            "maps_to no parameter",
            json!({"name": "Recall", "canonical": "nexus.memory.read", "params": {"file": {"maps_to": "file"}}}),
            "alias_param_unknown",
        ),
        (
            "omit no parameter",
            json!({"name": "Recall", "canonical": "nexus.memory.read", "omit": ["cursor"]}),
            "alias_param_unknown",
        ),
        (
            "an alias parameter shadows a kept kernel parameter",
            json!({"name": "Recall", "canonical": "nexus.memory.read", "params": {"path": {"maps_to": "offset"}}}),
            "alias_param_unknown",
        ),
        (
            "two parameters on one target",
            json!({"name": "Recall", "canonical": "nexus.memory.read", "params": {"file": {"maps_to": "path"}, "doc": {"maps_to": "path"}}}),
            "alias_param_unknown",
        ),
        (
            "a mapped target is also omitted",
            json!({"name": "Recall", "canonical": "nexus.memory.read", "params": {"file": {"maps_to": "path"}}, "omit": ["path"]}),
            "alias_param_unknown",
        ),
        (
            "invert on a string",
            json!({"name": "Question", "canonical": "nexus.human.ask", "params": {"text": {"maps_to": "prompt", "invert": true, "description": "d"}}}),
            "alias_invert_needs_boolean",
        ),
        (
            "invert without a description",
            json!({"name": "Question", "canonical": "nexus.human.ask", "params": {"single": {"maps_to": "multi", "invert": true}}}),
            "alias_param_description_required",
        ),
    ];
    for (row, alias, word) in rows {
        let answer = d
            .refused(
                &json!({"configuration": {"approval_mode": "bypass", "tool_definitions": [function("first"), alias]}}),
                422,
                "validation_failed",
            )
            .await;
        assert!(answer.message().starts_with("configuration.tool_definitions[1]"), "{row}: {}", answer.message());
        assert!(answer.message().contains(word), "{row}: {} should carry {word}", answer.message());
    }
    // The lawful counterparts.
    let stored = d
        .accepts(&json!({"approval_mode": "bypass", "tool_definitions": [
            {"name": "Question", "canonical": "nexus.human.ask", "params": {"single": {"maps_to": "multi", "invert": true, "description": "true allows one option only."}}},
            {"name": "Recall", "canonical": "nexus.memory.read", "params": {"file": {"maps_to": "path"}}, "omit": ["offset"]},
            {"name": "Find", "canonical": "nexus.memory.grep", "params": {"pattern": {"maps_to": "pattern"}}},
        ]}))
        .await;
    let stored = stored["tool_definitions"].as_array().cloned().expect("list");
    let recall = &find(&stored, "Recall")["function"]["parameters"];
    assert!(recall["properties"].get("file").is_some() && recall["properties"].get("path").is_none());
    assert!(recall["properties"].get("offset").is_none(), "omitted parameters are not exposed");
    assert_eq!(recall["required"], json!(["file"]));
    // The inverted boolean carries its own description; `multi` has no default to negate (the
    // negated default is pinned by the alias grammar's own tests, over `delegate_task`'s `wait`).
    let single = &find(&stored, "Question")["function"]["parameters"]["properties"]["single"];
    assert_eq!(single["type"], "boolean");
    assert_eq!(single["description"], "true allows one option only.");
    assert!(single.get("default").is_none(), "no default is invented: {single}");
    let find_alias = &find(&stored, "Find")["function"]["parameters"];
    assert!(find_alias["properties"].get("pattern").is_some(), "an identity mapping keeps the parameter");
}

#[tokio::test]
async fn r21_alias_calls_run_under_the_kernel_wire_name_with_mapped_parameters() {
    let (d, _fake) = wire_door(|request| {
        if tool_results(request).is_empty() {
            calls(&[
                ("Question", json!({"prompt": "p", "single": true})),
                ("Recall", json!({"file": "notes.md", "offset": 3, "limit": 2})),
            ])
        } else {
            say("done")
        }
    })
    .await;
    let declaration = json!({"approval_mode": "bypass", "default_model": "wire/m", "tool_definitions": [
        {"name": "Question", "canonical": "nexus.human.ask",
         "params": {"single": {"maps_to": "multi", "invert": true, "description": "true allows one option only."}}},
        {"name": "Recall", "canonical": "nexus.memory.read", "params": {"file": {"maps_to": "path"}}, "omit": ["offset"]},
    ]});
    let execution = d.turn("aliases", Some(declaration), None).await.expect("admitted");
    let tasks = wait_until("both alias calls recorded", SETTLE, || async {
        d.server.store().tasks_of(execution).await.ok().filter(|tasks| tasks.len() >= 2)
    })
    .await;
    let caller = d.server.caller(&d.agent).await;
    let door_view = d.server.server.api.execution(&caller, execution).await.expect("execution");
    for (alias, wire, input) in [
        ("Question", "ask", json!({"prompt": "p", "multi": false})),
        ("Recall", "memory_read", json!({"path": "notes.md", "limit": 2})),
    ] {
        let task = tasks.iter().find(|t| t.callable_name == alias).unwrap_or_else(|| panic!("no task for {alias}"));
        assert_eq!(task.tool_name, wire, "{alias} runs under the kernel wire name: {task:?}");
        assert_eq!(task.tool_input, input, "{alias}: parameters mapped, inverted and omitted: {task:?}");
        let row = door_view["tasks"].as_array().and_then(|t| t.iter().find(|t| t["tool_name"] == alias).cloned());
        assert_eq!(
            row.map(|r| r["served_name"].clone()),
            Some(json!(wire)),
            "the record keeps the alias beside the kernel name"
        );
    }
}

#[tokio::test]
async fn r22_macros_render_with_the_profiles_spellings_and_catalog_bytes_otherwise() {
    let d = door().await;
    let write = d.kernel("memory_write").await;
    let catalog = write["definition"].clone();
    let template = write["template"]["function"]["description"].as_str().expect("template").to_owned();
    assert!(template.contains("{{memory_edit}}"), "the catalog serves the template unrendered: {template}");
    // No alias: the catalog's bytes exactly.
    let stored = d.accepts(&json!({"approval_mode": "bypass", "tool_definitions": [catalog.clone()]})).await;
    assert_eq!(stored["tool_definitions"][0], catalog);
    assert_eq!(stored["tool_definitions"][0].to_string(), catalog.to_string(), "byte for byte");
    // An alias re-spells every plain kernel entry: the catalog bytes are accepted and stored as
    // the profile's render, and the render itself is accepted back.
    let alias = json!({"name": "Patch", "canonical": "nexus.memory.edit"});
    let stored =
        d.accepts(&json!({"approval_mode": "bypass", "tool_definitions": [catalog.clone(), alias.clone()]})).await;
    let stored = stored["tool_definitions"].as_array().cloned().expect("list");
    let rendered = find(&stored, "memory_write");
    let expected = template.replace("{{memory_edit}}", "Patch");
    assert_eq!(rendered["function"]["description"], expected);
    assert_eq!(rendered["function"]["parameters"], catalog["function"]["parameters"]);
    let again = d.accepts(&json!({"approval_mode": "bypass", "tool_definitions": stored.clone()})).await;
    assert_eq!(again["tool_definitions"], json!(stored), "the render is itself accepted and converges");
    // Another spelling of the macro is a redefinition.
    let mut wrong = rendered.clone();
    wrong["function"]["description"] = json!(expected.replace("Patch", "Helper"));
    d.rejects(
        &json!({"approval_mode": "bypass", "tool_definitions": [alias.clone(), wrong]}),
        "configuration.tool_definitions[1]",
        "kernel_tool_redefined",
    )
    .await;
    // An alias description's macros render too, and plain kernel imports are re-spelled.
    let recall = json!({"name": "Recall", "canonical": "nexus.memory.read", "description": "Read; find more with {{tool_search}}, then edit with {{memory_edit}}."});
    let assembled = d
        .assembled(
            None,
            &json!({"tool_definitions": [alias, recall], "kernel_tools": ["nexus.memory.write", "nexus.memory.edit"]}),
        )
        .await;
    assert_eq!(
        find(&assembled, "Recall")["function"]["description"],
        "Read; find more with tool_search, then edit with Patch."
    );
    assert_eq!(find(&assembled, "memory_write")["function"]["description"], expected, "a plain import is re-spelled");
    let edit = d.kernel("memory_edit").await["template"]["function"]["description"].as_str().expect("text").to_owned();
    assert_eq!(
        find(&assembled, "memory_edit")["function"]["description"],
        edit.replace("{{memory_read}}", "Recall"),
        "the import renders {{memory_read}} with the Recall spelling"
    );
}

#[tokio::test]
async fn r23_the_compact_identity_alias() {
    let d = door().await;
    let skill = d.kernel("skill").await["definition"].clone();
    for compact in [
        json!({"type": "function", "function": {"name": "skill"}, "canonical": "nexus.skill.load"}),
        json!({"type": "function", "function": {"name": "skill"}, "canonical": "nexus.skill.load", "defer_loading": true}),
        json!({"name": "skill", "canonical": "nexus.skill.load"}),
    ] {
        let stored = d.accepts(&json!({"approval_mode": "bypass", "tool_definitions": [compact.clone()]})).await;
        let entry = &stored["tool_definitions"][0];
        assert_eq!(entry["function"], skill["function"], "{compact}: no kernel schema copied, the render stored");
        assert_eq!(entry["canonical"], "nexus.skill.load");
        assert_eq!(entry.get("defer_loading"), compact.get("defer_loading"), "{compact}");
    }
    // The identity declaration takes precedence over an automatic plain import of the same name.
    let assembled = d
        .assembled(
            None,
            &json!({"kernel_tools": ["nexus.skill.load"], "tool_definitions": [
                {"type": "function", "function": {"name": "skill"}, "canonical": "nexus.skill.load", "defer_loading": true}]}),
        )
        .await;
    assert_eq!(entry_names(&assembled), ["skill"], "one skill, not two");
    assert_eq!(assembled[0]["defer_loading"], true);
}

#[tokio::test]
async fn r24_kernel_tools_are_unique_live_canonical_names() {
    let d = door().await;
    d.seed().await;
    for (row, kernel_tools) in [
        ("duplicate", json!(["nexus.memory.read", "nexus.memory.read"])),
        ("unknown", json!(["nexus.memory.recall"])),
        ("retired", json!(["nexus.graph.compose"])),
        ("wire alias", json!(["memory_read"])),
        ("wildcard", json!(["nexus.memory.*"])),
        ("namespace wildcard", json!(["*"])),
        ("not a list", json!("nexus.memory.read")),
        ("not a string", json!([1])),
    ] {
        let body = json!({"configuration": {"approval_mode": "bypass", "kernel_tools": kernel_tools}});
        let answer = d.refused(&body, 422, "validation_failed").await;
        assert!(answer.message().starts_with("configuration.kernel_tools"), "{row}: {}", answer.message());
    }
    for (kernel_tools, reads) in [(json!(null), json!([])), (json!([]), json!([]))] {
        let stored = d.accepts(&json!({"kernel_tools": kernel_tools})).await;
        assert_eq!(stored["kernel_tools"], reads, "omitted, null or [] imports none");
    }
    let stored =
        d.accepts(&json!({"approval_mode": "ask", "kernel_tools": ["nexus.tools.search", "nexus.memory.read"]})).await;
    assert_eq!(stored["kernel_tools"], json!(["nexus.tools.search", "nexus.memory.read"]));
    // Imports are the catalog's plain definitions, and kernel_tools is not a deny list over
    // explicit declarations.
    let ask = d.kernel("ask").await["definition"].clone();
    let read = d.kernel("memory_read").await["definition"].clone();
    let assembled =
        d.assembled(None, &json!({"tool_definitions": [ask.clone()], "kernel_tools": ["nexus.memory.read"]})).await;
    assert_eq!(assembled, vec![ask.clone(), read]);
    let assembled = d.assembled(None, &json!({"tool_definitions": [ask.clone()], "kernel_tools": []})).await;
    assert_eq!(assembled, vec![ask]);
}

/// Issue 13, item 7, and issue 14: the doors refuse any live kernel tool this server does not
/// run (`kernel_tool_unavailable`); since delegation runs, that is none of the catalog's, so the
/// delegation tools are declarable in every shape, and the catalog lists the origin's nineteen
/// and nexus's `join`.
#[tokio::test]
async fn r24_every_catalog_tool_is_served_and_declarable() {
    let d = door().await;
    d.seed().await;
    let delegate = d.kernel("delegate_task").await["definition"].clone();
    let agent = json!({"name": "Agent", "canonical": "nexus.graph.delegate_task",
        "params": {"run_in_background": {"maps_to": "wait", "invert": true, "description": "Run it in the background."}}});
    let rows: Vec<(&str, Value)> = vec![
        (
            "a plain import",
            json!({"approval_mode": "bypass", "kernel_tools": ["nexus.memory.read", "nexus.graph.delegate_task", "nexus.graph.join"]}),
        ),
        ("the catalog's bytes", json!({"approval_mode": "bypass", "tool_definitions": [function("first"), delegate]})),
        (
            "a compact identity entry",
            json!({"approval_mode": "bypass", "tool_definitions": [{"name": "wait", "canonical": "nexus.graph.wait"}]}),
        ),
        ("an alias", json!({"approval_mode": "bypass", "tool_definitions": [agent]})),
    ];
    for (row, configuration) in rows {
        let answer = d.http.declare(&json!({"configuration": configuration})).await;
        assert_eq!(answer.status, 200, "{row}: {:?}", answer.body);
    }
    let catalog = d.http.get("/agent_api/v1/tools").await;
    let tools = catalog.body["tools"].as_array().cloned().unwrap_or_default();
    let every: Vec<Value> = tools.iter().map(|t| t["canonical_name"].clone()).collect();
    let all = d.http.declare(&json!({"configuration": {"approval_mode": "bypass", "kernel_tools": every}})).await;
    assert_eq!(all.status, 200, "every catalog tool at once: {:?}", all.body);
    assert_eq!(tools.len(), 20);
    assert_eq!(tools[19]["canonical_name"], "nexus.graph.join");
    assert_eq!(tools[19]["name"], "join");
}

#[tokio::test]
async fn r25_runner_executor_public_ids_are_unique_uuids_in_order() {
    let d = door().await;
    d.seed().await;
    let id = Uuid::new_v4();
    let upper = id.to_string().to_uppercase();
    for (row, ids) in [
        ("not a list", json!(id)),
        ("not a UUID", json!(["runner-1"])),
        ("a number", json!([7])),
        ("a UUID without hyphens", json!([id.simple().to_string()])),
        ("a duplicate", json!([id, id])),
        ("a duplicate in another case", json!([id, upper])),
    ] {
        let body = json!({"configuration": {"approval_mode": "bypass", "runner_executor_public_ids": ids}});
        let answer = d.refused(&body, 422, "validation_failed").await;
        assert!(
            answer.message().starts_with("configuration.runner_executor_public_ids"),
            "{row}: {}",
            answer.message()
        );
    }
    let (second, _second_raw) = d.runner("second", json!([])).await;
    let (first, _first_raw) = d.runner("first", json!([])).await;
    let order = json!([second.id, first.id]);
    let stored = d.accepts(&json!({"approval_mode": "bypass", "runner_executor_public_ids": order})).await;
    assert_eq!(stored["runner_executor_public_ids"], order, "declaration order is kept");
    let answer = d
        .preview(
            &json!({"default_runner_executor_public_id": null, "configuration": {"runner_executor_public_ids": order}}),
        )
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let candidates: Vec<Value> = answer.body["environment"]["runner_candidates"]
        .as_array()
        .cloned()
        .expect("candidates")
        .iter()
        .map(|c| c["runner_executor_public_id"].clone())
        .collect();
    assert_eq!(json!(candidates), order, "candidates are listed in declaration order");
}

#[tokio::test]
async fn r26_runner_tool_names_filter_the_selected_runners_model_announcements() {
    let d = door().await;
    d.seed().await;
    for (row, names) in [
        ("not a list", json!("grep")),
        ("empty name", json!([""])),
        ("129 characters", json!(["t".repeat(129)])),
        ("NUL", json!(["gr\u{0}ep"])),
        ("not a string", json!([1])),
    ] {
        let body = json!({"configuration": {"approval_mode": "bypass", "runner_tool_names": names}});
        let answer = d.refused(&body, 422, "validation_failed").await;
        assert!(answer.message().starts_with("configuration.runner_tool_names"), "{row}: {}", answer.message());
    }
    let half = json!({"name": "half", "description": "no schema", "effect_profile": effect()});
    let (a, _a_raw) = d.runner("a", json!([served("grep"), served("read"), operator_only("logs"), half])).await;
    let (b, _b_raw) = d.runner("b", json!([served("only_b"), served("grep")])).await;
    let stored = d.accepts(&json!({"approval_mode": "bypass", "runner_tool_names": ["t".repeat(128)]})).await;
    assert_eq!(stored["runner_tool_names"], json!(["t".repeat(128)]));
    // (row, selected, runner_tool_names, imported names)
    let rows: Vec<(&str, Uuid, Value, Vec<&str>)> = vec![
        ("null imports every model announcement", a.id, json!(null), vec!["grep", "read"]),
        ("[] imports none", a.id, json!([]), vec![]),
        (
            "a list imports the exact intersection",
            a.id,
            json!(["read", "missing", "logs", "half", "only_b"]),
            vec!["read"],
        ),
        ("only the selected runner contributes", b.id, json!(null), vec!["grep", "only_b"]),
        ("no other candidate fills a gap", b.id, json!(["read"]), vec![]),
    ];
    for (row, selected, names, expected) in rows {
        let configuration = json!({"runner_executor_public_ids": [a.id, b.id], "runner_tool_names": names});
        let assembled = d.assembled(Some(nexus_proto::RunnerId::from_uuid(selected)), &configuration).await;
        let mut got = entry_names(&assembled);
        got.sort_unstable();
        assert_eq!(got, expected, "{row}");
        for entry in &assembled {
            let name = entry_name(entry);
            assert_eq!(
                entry["route"]["runner_executor_public_id"],
                json!(selected),
                "{row}: {name} has an explicit UUID route"
            );
            let announced = served(name);
            assert_eq!(entry["function"]["description"], announced["description"], "{row}: description copied exactly");
            assert_eq!(entry["function"]["parameters"], announced["input_schema"], "{row}: schema copied exactly");
        }
    }
}

#[tokio::test]
async fn r27_import_collisions_get_stable_target_qualified_names() {
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "the suite's own SHA-256"
    );
    let d = door().await;
    let long = format!("L{}", "o".repeat(62) + "g");
    assert_eq!(long.len(), 64);
    let announced =
        [served("bash"), served("memory_read"), served("skill"), served("memory_grep"), served(&long), served("ok")];
    let (runner, _raw) = d.runner("host", json!(announced)).await;
    let configuration = json!({
        "runner_executor_public_ids": [runner.id],
        "tool_definitions": [function("bash"), function(&long)],
        "kernel_tools": ["nexus.memory.grep"],
    });
    let assembled = d.assembled(Some(runner.runner()), &configuration).await;
    let again = d.assembled(Some(runner.runner()), &configuration).await;
    assert_eq!(assembled, again, "the same input assembles the same names");
    let expected: Vec<(String, &str)> = vec![
        (qualified(runner.id, "bash"), "bash"),
        (qualified(runner.id, "memory_read"), "memory_read"),
        (qualified(runner.id, "skill"), "skill"),
        (qualified(runner.id, "memory_grep"), "memory_grep"),
        (qualified(runner.id, &long), long.as_str()),
        ("ok".to_owned(), "ok"),
    ];
    for (name, served_name) in &expected {
        let entry = find(&assembled, name);
        assert_eq!(entry["route"]["tool_name"], json!(served_name), "{name}: the route keeps the served name");
        assert_eq!(entry["route"]["runner_executor_public_id"], json!(runner.id));
        assert_eq!(entry["defer_loading"], true, "{name}: imported runner schemas are deferred");
        assert!(name.len() <= 64, "{name}");
    }
    assert_eq!(qualified(runner.id, &long).len(), 63);
    assert!(qualified(runner.id, &long).starts_with(&long[..49]));
    // Explicit callables and the kernel import keep their names.
    for name in ["bash", long.as_str(), "memory_grep"] {
        assert!(find(&assembled, name).get("route").is_none(), "{name} is the explicit or kernel entry");
    }
    assert_eq!(assembled.len(), 9);
    // A duplicate that remains after qualification is refused, never overwritten.
    let crowded = json!({"runner_executor_public_ids": [runner.id],
        "tool_definitions": [function("bash"), function(&qualified(runner.id, "bash"))]});
    let answer = d.preview(&json!({"default_runner_executor_public_id": runner.id, "configuration": crowded})).await;
    assert_eq!((answer.status, answer.code()), (422, Some("validation_failed")), "{:?}", answer.body);
    assert!(answer.message().contains("duplicate_tool_name"), "{}", answer.message());
}

// ---- assembly and freezing (`docs/declaration.md`, "Assembly preview" and "Freezing") -----------

#[tokio::test]
async fn r28_the_selected_runner_is_a_declared_eligible_candidate() {
    let d = door().await;
    let (present, present_raw) = d.runner("present", json!([served("grep")])).await;
    let absent = d.server.runner("never-connected").await;
    let stranger = d.server.runner("stranger").await;
    let unknown = Uuid::new_v4();
    let candidates = json!([present.id, absent.id, unknown]);
    let configuration = json!({"runner_executor_public_ids": candidates});
    // (row, selected, status, code)
    let rows: Vec<(&str, Option<Uuid>, u16, Option<&str>)> = vec![
        ("a runner that is not a candidate", Some(stranger.id), 422, Some("runner_not_declared")),
        ("a candidate that does not exist is not eligible", Some(unknown), 422, Some("runner_not_eligible")),
        ("presence is ignored: a never-connected candidate", Some(absent.id), 200, None),
        ("a connected candidate", Some(present.id), 200, None),
    ];
    for (row, selected, status, code) in rows {
        let answer =
            d.preview(&json!({"default_runner_executor_public_id": selected, "configuration": configuration})).await;
        assert_eq!((answer.status, answer.code()), (status, code), "{row}: {:?}", answer.body);
        if status == 200 {
            assert_eq!(answer.body["environment"]["default_runner_executor_public_id"], json!(selected), "{row}");
        }
    }
    // A candidate that announced and then disconnected still contributes its announcements.
    drop(present_raw);
    let assembled = d.assembled(Some(present.runner()), &configuration).await;
    assert_eq!(entry_names(&assembled), ["grep"]);
}

#[tokio::test]
async fn r29_an_explicit_route_to_an_unserved_tool_is_tool_not_served() {
    let d = door().await;
    let (a, _a_raw) = d.runner("a", json!([served("bash"), operator_only("logs")])).await;
    let (b, _b_raw) = d.runner("b", json!([served("bash")])).await;
    let nowhere = Uuid::new_v4();
    for (row, entry) in [
        ("a runner that does not serve the name", routed("deploy", a.id, "deploy")),
        ("a runner that does not exist", routed("deploy", nowhere, "deploy")),
    ] {
        let answer = d
            .preview(
                &json!({"default_runner_executor_public_id": null, "configuration": {"tool_definitions": [entry]}}),
            )
            .await;
        assert_eq!((answer.status, answer.code()), (422, Some("tool_not_served")), "{row}: {:?}", answer.body);
    }
    // The configuration itself can be declared before the target serves it.
    d.accepts(&json!({"approval_mode": "bypass", "tool_definitions": [routed("deploy", nowhere, "deploy")]})).await;
    // Two runners serving one execution name, under two authored callables, each exact.
    let mut shell_a = routed("shell_a", a.id, "bash");
    shell_a["function"]["description"] = json!("The shell on a.");
    let shell_b = routed("shell_b", b.id, "bash");
    let assembled = d.assembled(None, &json!({"tool_definitions": [shell_a.clone(), shell_b.clone()]})).await;
    assert_eq!(find(&assembled, "shell_a"), &shell_a, "an explicit declaration keeps its own description and schema");
    assert_eq!(find(&assembled, "shell_b"), &shell_b);
}

#[tokio::test]
async fn r30_input_tool_names_narrow_the_assembled_set_or_refuse_tool_not_declared() {
    let (d, fake) = wire_door(|_| say("done")).await;
    let declaration = json!({"approval_mode": "bypass", "default_model": "wire/m",
        "tool_definitions": [function("present"), function("other")]});
    for (row, tool_names) in [
        ("a callable absent from the declaration", json!(["present", "absent"])),
        ("an undeclared kernel name", json!(["memory_read"])),
    ] {
        match d.turn(row, Some(declaration.clone()), Some(tool_names)).await {
            Err(refusal) => assert_eq!(refusal.code, ErrorCode::ToolNotDeclared, "{row}: {refusal:?}"),
            Ok(execution) => {
                let settled = d.settled(execution).await;
                assert_eq!(settled.error_key.as_deref(), Some("tool_not_declared"), "{row}: {}", settled.status);
                assert!(fake.turn(row).is_empty(), "{row}: a refused input reached the provider");
            }
        }
    }
    for (row, tool_names, expected) in
        [("narrowed to one", json!(["present"]), vec!["present"]), ("[] authorizes nothing", json!([]), vec![])]
    {
        let execution = d.turn(row, Some(declaration.clone()), Some(tool_names)).await.expect("admitted");
        d.settled(execution).await;
        let request = fake.turn(row).into_iter().next().unwrap_or_else(|| panic!("{row}: not asked"));
        assert_eq!(offered_names(&request), expected, "{row}");
    }
}

#[tokio::test]
async fn r31_acceptance_freezes_the_declaration_and_later_changes_reach_future_work() {
    let (d, fake) = wire_door_gated(false, |request| {
        if tool_results(request).is_empty() { calls(&[("unlisted", json!({}))]) } else { say("done") }
    })
    .await;
    let (first, _first_raw) = d.runner("first", json!([served("grep")])).await;
    let (second, _second_raw) = d.runner("second", json!([served("find")])).await;
    d.accepts(&json!({"approval_mode": "bypass", "default_model": "wire/m", "tool_definitions": [function("before")],
        "runner_executor_public_ids": [first.id, second.id]}))
        .await;
    let execution = d.turn_selecting("frozen", first.runner()).await.expect("admitted");
    wait_until("the first model request", SETTLE, || async { (!fake.turn("frozen").is_empty()).then_some(()) }).await;
    d.accepts(&json!({"approval_mode": "bypass", "default_model": "wire/m", "tool_definitions": [function("after")],
        "runner_executor_public_ids": [second.id]}))
        .await;
    fake.release();
    d.settled(execution).await;
    let rounds = fake.turn("frozen");
    assert_eq!(rounds.len(), 2, "two rounds: {rounds:?}");
    let mut frozen = offered_names(&rounds[0]);
    frozen.sort();
    assert_eq!(frozen, ["before", "grep"], "the selected candidate's tools are imported");
    assert_eq!(offered_names(&rounds[1]), offered_names(&rounds[0]), "a later round keeps the frozen set");
    let next = d.turn_selecting("fresh", second.runner()).await.expect("admitted");
    d.settled(next).await;
    let mut fresh = offered_names(&fake.turn("fresh")[0]);
    fresh.sort();
    assert_eq!(fresh, ["after", "find"], "future work sees the new declaration");
}

#[tokio::test]
async fn r32_runners_list_reads_the_frozen_candidate_list() {
    let (d, fake) = wire_door_gated(false, |request| {
        if tool_results(request).is_empty() { calls(&[("runners_list", json!({}))]) } else { say("done") }
    })
    .await;
    let (first, _first_raw) = d.runner("first", json!([])).await;
    let (second, _second_raw) = d.runner("second", json!([])).await;
    d.accepts(&json!({"approval_mode": "bypass", "default_model": "wire/m", "kernel_tools": ["nexus.runners.list"],
        "runner_executor_public_ids": [first.id, second.id], "runner_tool_names": []}))
        .await;
    let execution = d.turn_selecting("environments", first.runner()).await.expect("admitted");
    wait_until("the first model request", SETTLE, || async { (!fake.turn("environments").is_empty()).then_some(()) })
        .await;
    // A later profile change does not reach the accepted work's candidate list.
    d.accepts(&json!({"approval_mode": "bypass", "default_model": "wire/m", "kernel_tools": ["nexus.runners.list"],
        "runner_executor_public_ids": [second.id], "runner_tool_names": []}))
        .await;
    fake.release();
    d.settled(execution).await;
    let rounds = fake.turn("environments");
    let result = rounds.get(1).map(tool_results).and_then(|r| r.into_iter().next()).expect("the call's result");
    let listed: Value = serde_json::from_str(&result).unwrap_or_else(|_| panic!("runners_list answered {result:?}"));
    assert_eq!(listed["current_runner_executor_public_id"], json!(first.id));
    let runners: Vec<Value> = listed["runners"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| r["runner_executor_public_id"].clone())
        .collect();
    assert_eq!(runners, vec![json!(first.id), json!(second.id)], "the frozen candidates, in declaration order");
    assert_eq!(listed["runners"][0]["display_name"], "first");
}

#[tokio::test]
async fn r33_delegated_tasks_inherit_the_accepted_tool_surface() {
    let (d, fake) = wire_door(|request| {
        if user_text(request) == Some("child work") {
            say("child answer")
        } else if tool_results(request).is_empty() {
            calls(&[("delegate_task", json!({"prompt": "child work", "wait": true, "tools": ["a"]}))])
        } else {
            say("parent done")
        }
    })
    .await;
    let declaration = json!({"approval_mode": "bypass", "default_model": "wire/m",
        "tool_definitions": [function("a"), function("b")], "kernel_tools": ["nexus.graph.delegate_task"]});
    let execution = d.turn("parent", Some(declaration), None).await.expect("admitted");
    d.settled(execution).await;
    let mut parent = offered_names(&fake.turn("parent")[0]);
    parent.sort();
    assert_eq!(parent, ["a", "b", "delegate_task"]);
    let child = fake.turn("child work").into_iter().next().unwrap_or_else(|| {
        let results: Vec<Vec<String>> = fake.turn("parent").iter().map(tool_results).collect();
        panic!("no child model step was asked; the delegate call answered {results:?}")
    });
    assert_eq!(offered_names(&child), ["a"], "the child inherits the parent's tools, narrowed by tools");
}

// ---- memory_context_limit and conversation_reach (`docs/declaration.md`, "Memory limits") -------

fn binding(name: &str, scope: &str, access: &str) -> Value {
    json!({"name": name, "scope": scope, "access": access})
}

#[tokio::test]
async fn r34_memory_limit_null_is_no_ceiling_and_empty_bindings_admit_no_memory() {
    let d = door().await;
    d.seed().await;
    for limit in [json!(null), json!({"bindings": []})] {
        let stored = d.accepts(&json!({"memory_context_limit": limit})).await;
        assert_eq!(stored["memory_context_limit"], limit, "{limit} is stored as declared, distinct from the other");
    }
    assert_eq!(d.accepts(&json!({})).await["memory_context_limit"], Value::Null, "omission clears to no ceiling");
    for (row, limit, field) in [
        ("a list", json!([]), "configuration.memory_context_limit"),
        ("a word", json!("none"), "configuration.memory_context_limit"),
        ("bindings missing", json!({}), "configuration.memory_context_limit"),
        ("bindings not a list", json!({"bindings": {}}), "configuration.memory_context_limit"),
    ] {
        let answer =
            d.refused(&json!({"configuration": {"memory_context_limit": limit}}), 422, "validation_failed").await;
        assert!(answer.message().starts_with(field), "{row}: {}", answer.message());
    }
}

#[tokio::test]
async fn r35_a_nonempty_limit_uses_natural_roots_with_the_conversation_root() {
    let d = door().await;
    d.seed().await;
    let conversation = binding("conversation", "conversation", "read_write");
    let rows: Vec<(&str, Value)> = vec![
        ("a name that is not its scope", json!([conversation, binding("notes", "workspace", "read")])),
        ("a root name on another scope", json!([conversation, binding("workspace", "speaker", "read")])),
        (
            "conversation_public_id",
            json!([{"name": "conversation", "scope": "conversation", "access": "read", "conversation_public_id": Uuid::new_v4()}]),
        ),
        (
            "speaker_public_id",
            json!([conversation, {"name": "speaker", "scope": "speaker", "access": "read", "speaker_public_id": Uuid::new_v4()}]),
        ),
        ("without the conversation root", json!([binding("workspace", "workspace", "read")])),
        ("an access outside read and read_write", json!([binding("conversation", "conversation", "write")])),
        ("an unknown scope", json!([conversation, binding("team", "team", "read")])),
    ];
    for (row, bindings) in rows {
        let body = json!({"configuration": {"memory_context_limit": {"bindings": bindings}}});
        let answer = d.refused(&body, 422, "validation_failed").await;
        assert!(answer.message().starts_with("configuration.memory_context_limit"), "{row}: {}", answer.message());
    }
    // A limit with all three kinds of root (`docs/declaration.md`, "Memory limits").
    let example = json!({"bindings": [
        {"name": "conversation", "scope": "conversation", "access": "read_write"},
        {"name": "workspace", "scope": "workspace", "access": "read"},
        {"name": "speaker", "scope": "speaker", "access": "read_write"}]});
    let stored = d.accepts(&json!({"memory_context_limit": example, "conversation_reach": "subtree"})).await;
    assert_eq!(stored["memory_context_limit"], example);
}

#[tokio::test]
async fn r36_a_limit_is_stored_as_declared_and_adds_no_root() {
    // The intersection itself needs memory doors and tools that do not exist yet; what a door can
    // show is that the stored limit is exactly the declared one: no root added, read kept as read.
    let d = door().await;
    for bindings in [
        json!([binding("conversation", "conversation", "read")]),
        json!([binding("conversation", "conversation", "read_write"), binding("user", "user", "read")]),
    ] {
        let limit = json!({"bindings": bindings});
        let stored = d.accepts(&json!({"memory_context_limit": limit})).await;
        assert_eq!(stored["memory_context_limit"], limit);
    }
}

#[tokio::test]
async fn r37_conversation_reach_vocabulary() {
    let d = door().await;
    d.seed().await;
    for reach in [json!("workspace"), json!("subtree"), json!(null)] {
        assert_eq!(d.accepts(&json!({"conversation_reach": reach})).await["conversation_reach"], reach);
    }
    assert_eq!(d.accepts(&json!({})).await["conversation_reach"], Value::Null, "omission means workspace");
    for reach in [json!("all"), json!("Subtree"), json!(""), json!(1), json!(["subtree"])] {
        d.rejects(&json!({"conversation_reach": reach}), "configuration.conversation_reach", "").await;
    }
}

// ---- fallback_models (`docs/declaration.md`, "Configuration fields") ----------------------------

#[tokio::test]
async fn r39_fallback_models_are_complete_references_within_their_bounds() {
    let d = door_with(with_providers).await;
    d.seed().await;
    let at_bound = format!("any/{}", "m".repeat(189));
    assert_eq!(at_bound.chars().count(), 193);
    let over = format!("any/{}", "m".repeat(190));
    let many: Vec<String> = (0..400).map(|i| format!("any/{i}-{}", "m".repeat(170))).collect();
    assert!(json!(many).to_string().len() > 65_536);
    for (row, list, field) in [
        ("not a list", json!("any/a"), "configuration.fallback_models:"),
        ("an object", json!({"any/a": 1}), "configuration.fallback_models:"),
        ("an entry that is not a string", json!(["any/a", 7]), "configuration.fallback_models[1]"),
        ("194 characters", json!([over]), "configuration.fallback_models[0]"),
        ("a bare word", json!(["gpt"]), "configuration.fallback_models[0]"),
        ("a selector", json!(["model_selector:fast"]), "configuration.fallback_models[0]"),
        ("over the 64 KiB envelope", json!(many), "configuration.fallback_models:"),
    ] {
        let answer = d.refused(&json!({"configuration": {"fallback_models": list}}), 422, "validation_failed").await;
        assert!(answer.message().starts_with(field), "{row}: {}", answer.message());
    }
    // Ordered; availability is judged live at selection, not at declaration.
    for (row, list) in [
        ("193 characters", json!([at_bound])),
        ("order is kept", json!(["any/b", "scripted/default", "any/a"])),
        ("a missing credential is judged live", json!(["openrouter/moonshotai/kimi-k3"])),
        ("a disabled provider is judged live", json!(["off/m"])),
        ("a hidden model is judged live", json!(["veiled/secret"])),
    ] {
        let answer = d.http.declare(&json!({"configuration": {"fallback_models": list}})).await;
        assert_eq!(answer.status, 200, "{row}: {:?}", answer.body);
        assert_eq!(d.http.profile().await.body["configuration"]["fallback_models"], list, "{row}");
    }
}

#[tokio::test]
async fn r40_empty_means_none_omission_clears_and_routes_are_visited_once() {
    let (d, fake) = wire_door(|request| match request["model"].as_str() {
        Some("x" | "a") => decline(),
        _ => say("answered"),
    })
    .await;
    for (configuration, reads) in [
        (json!({"fallback_models": []}), json!([])),
        (json!({"fallback_models": null}), json!(null)),
        (json!({}), json!(null)),
        (json!({"default_model": "wire/x", "fallback_models": ["wire/a"]}), json!(["wire/a"])),
        (json!({"fallback_models": ["wire/a", "wire/a"]}), json!(["wire/a", "wire/a"])),
    ] {
        let stored = d.accepts(&configuration).await;
        assert_eq!(stored["fallback_models"], reads, "{configuration}: the default is never appended");
    }
    // (row, fallback_models, the models asked in order) with x and a declining.
    let rows: Vec<(&str, Value, Vec<&str>)> = vec![
        ("[] declares no fallback", json!([]), vec!["x"]),
        ("the default is not appended", json!(["wire/a"]), vec!["x", "a"]),
        ("duplicates are visited once", json!(["wire/a", "wire/a", "wire/b"]), vec!["x", "a", "b"]),
        ("the default listed again is not revisited", json!(["wire/x", "wire/b"]), vec!["x", "b"]),
    ];
    for (row, fallbacks, expected) in rows {
        let declaration = json!({"default_model": "wire/x", "fallback_models": fallbacks});
        let execution = d.turn(row, Some(declaration), None).await.expect("admitted");
        d.settled(execution).await;
        let asked: Vec<String> =
            fake.turn(row).iter().map(|r| r["model"].as_str().unwrap_or_default().to_owned()).collect();
        assert_eq!(asked, expected, "{row}");
    }
}

// ---- execution_declaration (`docs/declaration.md`, "Inline declarations") -----------------------

#[tokio::test]
async fn r45_execution_declaration_has_the_flat_field_set_and_is_validated_at_admission() {
    let d = door().await;
    // A full inline declaration, with a model this server runs and identity fields that must not
    // count.
    let example = json!({
        "prompt_mechanism": "default",
        "system_prompt": {"content": "Check the supplied change.", "role": "developer"},
        "kernel_tools": ["nexus.memory.read"],
        "approval_mode": "ask",
        "default_model": "scripted/default",
        "fallback_models": ["scripted/default"],
        "credential": "sk-nexus-api-v1-0000", "member_public_id": Uuid::new_v4(), "user": "someone", "role": "admin",
    });
    let admitted = d.turn("example", Some(example), None).await.expect("the spec's example is admitted");
    // Let it finish, so the refusals below can show they write nothing.
    d.settled(admitted).await;
    let entry = |name: &str| json!({"name": name, "description": "d", "model_mode": "default", "declaration": {}});
    let rows: Vec<(&str, Value, &str, &str)> = vec![
        ("not an object", json!("ask"), "validation_failed", "execution_declaration"),
        (
            "a missing approval mode",
            json!({"default_model": "scripted/default", "kernel_tools": ["nexus.memory.read"]}),
            "validation_failed",
            "execution_declaration.approval_mode",
        ),
        (
            "the tool grammar",
            json!({"default_model": "scripted/default", "approval_mode": "ask", "tool_definitions": [function("a"), function("a")]}),
            "validation_failed",
            "execution_declaration.tool_definitions[1]",
        ),
        (
            "the resolver",
            json!({"default_model": "nowhere/x"}),
            "validation_failed",
            "execution_declaration.default_model",
        ),
        (
            "the rule grammar",
            json!({"default_model": "scripted/default", "approval_rules": [{"tool": "a", "verdict": "deny", "match": "*"}]}),
            "validation_failed",
            "execution_declaration.approval_rules",
        ),
        (
            "the template grammar",
            json!({"default_model": "scripted/default", "prompt_mechanism": "assembly"}),
            "validation_failed",
            "execution_declaration.prompt_template",
        ),
        (
            "the hook grammar",
            json!({"default_model": "scripted/default", "approval_mode": "ask", "lifecycle_hooks": {"stop": {"tool": "t", "timeout_ms": 0, "max_continuations": 0}}}),
            "validation_failed",
            "execution_declaration.lifecycle_hooks",
        ),
        (
            "the memory grammar",
            json!({"default_model": "scripted/default", "memory_context_limit": {"bindings": [binding("workspace", "workspace", "read")]}}),
            "validation_failed",
            "execution_declaration.memory_context_limit",
        ),
        (
            "the reach vocabulary",
            json!({"default_model": "scripted/default", "conversation_reach": "all"}),
            "validation_failed",
            "execution_declaration.conversation_reach",
        ),
        (
            "the fallback list",
            json!({"default_model": "scripted/default", "fallback_models": [7]}),
            "validation_failed",
            "execution_declaration.fallback_models",
        ),
        (
            "the delegation catalog",
            json!({"default_model": "scripted/default", "delegation_catalog": [entry("a"), entry("a")]}),
            "validation_failed",
            "execution_declaration.delegation_catalog",
        ),
        (
            "an undeclared macro",
            json!({"default_model": "scripted/default", "system_prompt": {"content": "{{who}}"}}),
            "prompt_document_macro_unknown",
            "execution_declaration.system_prompt",
        ),
        (
            "a summarizer role",
            json!({"default_model": "scripted/default", "summarizer": {"content": "s", "role": "developer"}}),
            "prompt_document_invalid",
            "execution_declaration.summarizer",
        ),
        (
            "a document over 64 KiB",
            json!({"default_model": "scripted/default", "system_prompt": {"content": "x".repeat(65_537)}}),
            "prompt_document_too_large",
            "execution_declaration.system_prompt",
        ),
    ];
    for (row, declaration, code, field) in rows {
        let before = d.server.store().fingerprint().await.expect("fingerprint");
        let refusal = d.turn(row, Some(declaration), None).await.expect_err(row);
        assert_eq!(refusal.code.as_str(), code, "{row}: {refusal:?}");
        assert!(refusal.message.starts_with(field), "{row}: {} should name {field}", refusal.message);
        assert_eq!(d.server.store().fingerprint().await.expect("fingerprint"), before, "{row}: a refused input wrote");
    }
}

#[tokio::test]
async fn r46_the_inline_declaration_replaces_the_standing_one_whole() {
    let (d, fake) = wire_door(|request| match request["model"].as_str() {
        Some("m") => decline(),
        _ => say("answered"),
    })
    .await;
    let declared = d
        .http
        .declare(&json!({
            "configuration": {"approval_mode": "bypass", "default_model": "wire/standing", "fallback_models": ["wire/standing_fallback"],
                "tool_definitions": [function("standing_tool")]},
            "prompt_documents": {"system_prompt": {"content": "standing words"}}}))
        .await;
    assert_eq!(declared.status, 200);
    let standing = d.turn("standing", None, None).await.expect("admitted");
    d.settled(standing).await;
    let request = fake.turn("standing").into_iter().next().expect("asked");
    assert_eq!(offered_names(&request), ["standing_tool"], "the standing declaration applies without an object");
    assert!(system_texts(&request).iter().any(|t| t.contains("standing words")));
    // Only the model: no tools, no system prompt and an empty fallback list, not the profile's.
    let inline = d.turn("inline", Some(json!({"default_model": "wire/m"})), None).await.expect("admitted");
    d.settled(inline).await;
    let asked = fake.turn("inline");
    let models: Vec<&str> = asked.iter().map(|r| r["model"].as_str().unwrap_or_default()).collect();
    assert_eq!(models, ["m"], "omitted fallback_models is [], not the profile's list");
    assert!(offered(&asked[0]).is_empty(), "no tool merged from the profile: {:?}", offered_names(&asked[0]));
    assert!(
        !system_texts(&asked[0]).iter().any(|t| t.contains("standing words")),
        "no document merged from the profile"
    );
    let own = d
        .turn("own", Some(json!({"default_model": "wire/own", "system_prompt": {"content": "inline words"}})), None)
        .await
        .expect("admitted");
    d.settled(own).await;
    let request = fake.turn("own").into_iter().next().expect("asked");
    assert_eq!(system_texts(&request), ["inline words"]);
}

// ---- delegation_catalog (`docs/declaration.md`, "Delegation catalog") ---------------------------

fn catalog_entry(name: &str, declaration: Value) -> Value {
    json!({"name": name, "description": format!("{name} reviews a change."), "model_mode": "default", "declaration": declaration})
}

#[tokio::test]
async fn r49_catalog_entries_are_unique_and_leaves_hold_no_catalog() {
    let d = door().await;
    d.seed().await;
    let field = "configuration.delegation_catalog";
    let rows: Vec<(&str, Value)> = vec![
        ("not a list", json!({"reviewer": {}})),
        ("an entry that is not an object", json!([1])),
        ("a duplicate name", json!([catalog_entry("a", json!({})), catalog_entry("a", json!({}))])),
        ("a missing name", json!([{"description": "d", "model_mode": "caller", "declaration": {}}])),
        ("a missing description", json!([{"name": "a", "model_mode": "caller", "declaration": {}}])),
        (
            "a model_mode outside caller and default",
            json!([{"name": "a", "description": "d", "model_mode": "parent", "declaration": {}}]),
        ),
        ("a missing declaration", json!([{"name": "a", "description": "d", "model_mode": "caller"}])),
        ("a leaf holding a catalog", json!([catalog_entry("a", json!({"delegation_catalog": []}))])),
        (
            "a leaf outside the execution grammar",
            json!([catalog_entry("a", json!({"kernel_tools": ["nexus.memory.read"]}))]),
        ),
        ("a leaf with a bad model", json!([catalog_entry("a", json!({"default_model": "nowhere/x"}))])),
    ];
    for (row, catalog) in rows {
        let answer =
            d.refused(&json!({"configuration": {"delegation_catalog": catalog}}), 422, "validation_failed").await;
        assert!(answer.message().starts_with(field), "{row}: {}", answer.message());
    }
    let leaf = json!({"default_model": "scripted/default", "approval_mode": "ask", "kernel_tools": ["nexus.memory.read"],
        "system_prompt": {"content": "Review for {{agent}}."}});
    let stored = d
        .accepts(&json!({"delegation_catalog": [catalog_entry("reviewer", leaf),
            {"name": "fixer", "description": "Fixes.", "model_mode": "caller", "declaration": {}}]}))
        .await;
    let catalog = stored["delegation_catalog"].as_array().cloned().expect("catalog");
    assert_eq!(catalog.len(), 2);
    assert_eq!(catalog[0]["name"], "reviewer");
    assert_eq!(catalog[0]["model_mode"], "default");
    assert_eq!(catalog[0]["declaration"]["default_model"], "scripted/default");
    assert_eq!(catalog[1]["model_mode"], "caller");
    let doc = d
        .refused(
            &json!({"configuration": {"delegation_catalog": [catalog_entry("a", json!({"system_prompt": {"content": "{{who}}"}}))]}}),
            422,
            "prompt_document_macro_unknown",
        )
        .await;
    assert!(doc.message().starts_with(field), "{}", doc.message());
}

#[tokio::test]
async fn r50_null_keeps_generic_spawn_and_any_list_is_a_catalog() {
    let d = door().await;
    for catalog in [json!(null), json!([]), json!([catalog_entry("reviewer", json!({}))])] {
        let stored = d.accepts(&json!({"delegation_catalog": catalog})).await;
        assert_eq!(stored["delegation_catalog"].is_null(), catalog.is_null(), "{catalog}: null and [] stay distinct");
        assert_eq!(stored["delegation_catalog"].as_array().map(Vec::len), catalog.as_array().map(Vec::len));
    }
    // The inline declaration accepts the catalog too.
    let declaration = json!({"default_model": "scripted/default", "delegation_catalog": []});
    d.turn("catalog", Some(declaration), None).await.expect("an inline catalog is admitted");
}

// ---- lifecycle_hooks (`docs/declaration.md`, "Lifecycle hooks") ---------------------------------

#[tokio::test]
async fn r53_hook_events_and_fields() {
    let d = door().await;
    d.seed().await;
    let hook = json!({"tool": "review", "timeout_ms": 1000});
    let stop = json!({"tool": "review", "timeout_ms": 1000, "max_continuations": 1});
    let big: serde_json::Map<String, Value> = (0..2000).map(|i| (format!("event_{i:04}"), hook.clone())).collect();
    let rows: Vec<(&str, Value, &str)> = vec![
        ("not an object", json!([hook]), "configuration.lifecycle_hooks"),
        ("an unknown event", json!({"session_end": hook}), "configuration.lifecycle_hooks.session_end"),
        ("an entry that is not an object", json!({"stop": "review"}), "configuration.lifecycle_hooks.stop"),
        (
            "an unknown entry field",
            json!({"turn_start": {"tool": "review", "timeout_ms": 1000, "async": true}}),
            "configuration.lifecycle_hooks.turn_start",
        ),
        (
            "max_continuations outside stop",
            json!({"pre_compact": {"tool": "review", "timeout_ms": 1000, "max_continuations": 1}}),
            "configuration.lifecycle_hooks.pre_compact",
        ),
        ("over the 64 KiB envelope", Value::Object(big), "configuration.lifecycle_hooks"),
    ];
    for (row, hooks, field) in rows {
        let body = json!({"configuration": {"approval_mode": "ask", "lifecycle_hooks": hooks}});
        let answer = d.refused(&body, 422, "validation_failed").await;
        assert!(answer.message().starts_with(field), "{row}: {}", answer.message());
    }
    let all = json!({"turn_start": hook, "pre_compact": hook, "post_compact": hook, "stop": stop});
    let stored = d.accepts(&json!({"approval_mode": "ask", "lifecycle_hooks": all})).await;
    assert_eq!(stored["lifecycle_hooks"], all);
    for empty in [json!(null), json!({})] {
        assert_eq!(d.accepts(&json!({"lifecycle_hooks": empty})).await["lifecycle_hooks"], empty, "enables nothing");
    }
}

#[tokio::test]
async fn r54_hook_tool_timeout_and_continuation_bounds() {
    let d = door().await;
    d.seed().await;
    let stop = |tool: Value, timeout: Value, continuations: Value| json!({"approval_mode": "ask", "lifecycle_hooks": {"stop": {"tool": tool, "timeout_ms": timeout, "max_continuations": continuations}}});
    let ok = || (json!("review"), json!(1000), json!(1));
    let rows: Vec<(&str, Value, &str)> = vec![
        (
            "tool missing",
            json!({"approval_mode": "ask", "lifecycle_hooks": {"stop": {"timeout_ms": 1, "max_continuations": 0}}}),
            "tool",
        ),
        ("tool empty", stop(json!(""), ok().1, ok().2), "tool"),
        ("tool not a string", stop(json!(7), ok().1, ok().2), "tool"),
        ("tool of 129 bytes", stop(json!("t".repeat(129)), ok().1, ok().2), "tool"),
        ("tool of 130 bytes in 65 characters", stop(json!("é".repeat(65)), ok().1, ok().2), "tool"),
        ("tool with NUL", stop(json!("rev\u{0}iew"), ok().1, ok().2), "tool"),
        ("a reserved kernel wire name", stop(json!("ask"), ok().1, ok().2), "tool"),
        ("a reserved kernel canonical name", stop(json!("nexus.graph.wait"), ok().1, ok().2), "tool"),
        ("a kernel memory name", stop(json!("memory_write"), ok().1, ok().2), "tool"),
        (
            "timeout missing",
            json!({"approval_mode": "ask", "lifecycle_hooks": {"stop": {"tool": "t", "max_continuations": 0}}}),
            "timeout_ms",
        ),
        ("timeout 0", stop(ok().0, json!(0), ok().2), "timeout_ms"),
        ("timeout 300001", stop(ok().0, json!(300_001), ok().2), "timeout_ms"),
        ("timeout fractional", stop(ok().0, json!(1.5), ok().2), "timeout_ms"),
        ("timeout a string", stop(ok().0, json!("1000"), ok().2), "timeout_ms"),
        ("timeout negative", stop(ok().0, json!(-1), ok().2), "timeout_ms"),
        (
            "stop without max_continuations",
            json!({"approval_mode": "ask", "lifecycle_hooks": {"stop": {"tool": "t", "timeout_ms": 1}}}),
            "max_continuations",
        ),
        ("max_continuations 21", stop(ok().0, ok().1, json!(21)), "max_continuations"),
        ("max_continuations -1", stop(ok().0, ok().1, json!(-1)), "max_continuations"),
        ("max_continuations fractional", stop(ok().0, ok().1, json!(0.5)), "max_continuations"),
    ];
    for (row, configuration, key) in rows {
        let answer = d.refused(&json!({"configuration": configuration}), 422, "validation_failed").await;
        let field = format!("configuration.lifecycle_hooks.stop.{key}");
        assert!(answer.message().starts_with(&field), "{row}: {} should name {field}", answer.message());
    }
    for (row, tool, timeout, continuations) in [
        ("the smallest values", json!("t"), json!(1), json!(0)),
        ("the largest values", json!("t".repeat(128)), json!(300_000), json!(20)),
        ("128 bytes in 64 characters", json!("é".repeat(64)), json!(1000), json!(1)),
    ] {
        let configuration = stop(tool, timeout, continuations);
        let answer = d.http.declare(&json!({"configuration": configuration})).await;
        assert_eq!(answer.status, 200, "{row}: {:?}", answer.body);
    }
}

// ---- prompt documents (`docs/declaration.md`, "Prompt documents") -------------------------------

#[tokio::test]
async fn r58_prompt_document_words_on_both_doors() {
    let d = door().await;
    d.seed().await;
    let rows: Vec<(&str, &str, Value, &str)> = vec![
        ("content missing", "system_prompt", json!({"role": "system"}), "prompt_document_invalid"),
        ("content not a string", "system_prompt", json!({"content": 7}), "prompt_document_invalid"),
        (
            "a role outside the vocabulary",
            "system_prompt",
            json!({"content": "x", "role": "user"}),
            "prompt_document_invalid",
        ),
        (
            "the summarizer is system only",
            "summarizer",
            json!({"content": "x", "role": "developer"}),
            "prompt_document_invalid",
        ),
        ("65537 bytes", "system_prompt", json!({"content": "x".repeat(65_537)}), "prompt_document_too_large"),
        (
            "65537 bytes in fewer characters",
            "summarizer",
            json!({"content": format!("{}x", "é".repeat(32_768))}),
            "prompt_document_too_large",
        ),
        ("an unknown macro", "system_prompt", json!({"content": "Hi {{tone}}."}), "prompt_document_macro_unknown"),
        (
            "an unknown macro in the summarizer",
            "summarizer",
            json!({"content": "{{persona}}"}),
            "prompt_document_macro_unknown",
        ),
    ];
    for (row, slot, document, code) in rows {
        let body = json!({"configuration": {}, "prompt_documents": {slot: document}});
        let answer = d.refused(&body, 422, code).await;
        assert!(answer.message().starts_with(&format!("prompt_documents.{slot}")), "{row}: {}", answer.message());
        let before = d.snapshot().await;
        let path = format!("/agent_api/v1/profile/prompt_documents/{slot}");
        let edit = d.http.put(&path, &document).await;
        assert_eq!((edit.status, edit.code()), (422, Some(code)), "{row} on the slot door: {:?}", edit.body);
        assert_eq!(d.snapshot().await, before, "{row}: a refused slot edit changed the profile");
    }
    // Every built-in macro, at exactly the bound.
    let macros = "{{agent}} {{user}} {{workspace}} {{date}} {{conversation_kind}}";
    let full = format!("{macros}{}", "x".repeat(65_536 - macros.len()));
    let body = json!({"configuration": {}, "prompt_documents": {"system_prompt": {"content": full}, "summarizer": {"content": macros}}});
    let answer = d.http.declare(&body).await;
    assert_eq!(answer.status, 200, "{:?}", answer.code());
    let edited = d.http.put("/agent_api/v1/profile/prompt_documents/summarizer", &json!({"content": macros})).await;
    assert_eq!(edited.status, 200);
    assert_eq!(edited.body["slot"], "summarizer");
    assert_eq!(edited.body["role"], "system");
    // Declared variables count under assembly.
    let body = json!({"configuration": {"prompt_mechanism": "assembly", "prompt_template": template(json!({"tone": "calm"}))},
        "prompt_documents": {"system_prompt": {"content": "{{tone}} {{agent}}"}, "summarizer": {"content": "{{tone}}"}}});
    assert_eq!(d.http.declare(&body).await.status, 200);
}

// ---- every word and status of the profile door (`docs/declaration.md`, "Doors") -----------------

#[tokio::test]
async fn spec000_every_word_and_status() {
    let server = TestServer::start_with(&[], |config| {
        config.doors.requests_per_minute = 1;
        config.doors.burst = 12;
    })
    .await;
    let agent = server.agent("agent").await;
    let human = server.human("person").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let anonymous = Http::new(&server.url(), None);
    let person = Http::new(&server.url(), Some(&human.token));
    let good = json!({"configuration": {}});
    // 403 not_authorized is pinned by `r09_a_suspended_agent_is_not_authorized_at_the_lock`.
    let rows: Vec<(&str, &Http, Value, u16, Option<&str>)> = vec![
        ("200: declared", &http, good.clone(), 200, None),
        ("400: bad root", &http, json!({"configuration": []}), 400, Some("parameter_missing")),
        (
            "400: bad slot",
            &http,
            json!({"configuration": {}, "prompt_documents": {"summarizer": "x"}}),
            400,
            Some("parameter_missing"),
        ),
        ("401: no credential", &anonymous, good.clone(), 401, Some("unauthorized")),
        ("403: a Human", &person, good.clone(), 403, Some("not_agent")),
        (
            "422: a word outside a vocabulary",
            &http,
            json!({"configuration": {"approval_mode": "never"}}),
            422,
            Some("validation_failed"),
        ),
        (
            "422: an invalid document",
            &http,
            json!({"configuration": {}, "prompt_documents": {"system_prompt": {}}}),
            422,
            Some("prompt_document_invalid"),
        ),
        (
            "422: a document over 64 KiB",
            &http,
            json!({"configuration": {}, "prompt_documents": {"system_prompt": {"content": "x".repeat(65_537)}}}),
            422,
            Some("prompt_document_too_large"),
        ),
        (
            "422: an unknown macro",
            &http,
            json!({"configuration": {}, "prompt_documents": {"system_prompt": {"content": "{{nobody}}"}}}),
            422,
            Some("prompt_document_macro_unknown"),
        ),
    ];
    for (row, client, body, status, code) in rows {
        let answer = client.declare(&body).await;
        assert_eq!((answer.status, answer.code()), (status, code), "{row}: {:?}", answer.body);
        if status == 200 {
            assert_eq!(answer.body["member"]["public_id"], json!(agent.id), "{row}: the profile is returned");
        }
    }
    // 429: the ordinary caller budget spent (a burst of 12, then one a minute).
    let mut limited = None;
    for _ in 0..12 {
        let answer = http.declare(&good).await;
        if answer.status == 429 {
            limited = Some(answer);
            break;
        }
        assert_eq!(answer.status, 200);
    }
    let limited = limited.expect("the budget is spent within the burst");
    assert_eq!(limited.code(), Some("rate_limited"));
    let seconds: u64 =
        limited.retry_after.as_deref().and_then(|s| s.parse().ok()).expect("Retry-After in whole seconds");
    assert!((1..=60).contains(&seconds), "{seconds}");
}

#[tokio::test]
async fn r09_a_suspended_agent_is_not_authorized_at_the_lock() {
    let d = door().await;
    d.seed().await;
    let before = d.snapshot().await;
    // The operator suspends the Agent: its credential still authenticates, but it is no longer
    // eligible when the ProfileActor takes the declaration lock.
    nexus_actors::cli::admin::set_member_status(
        d.server.store(),
        d.agent.member(),
        nexus_proto::MemberStatus::Suspended,
    )
    .await
    .expect("suspended");
    let answer = d.http.declare(&json!({"configuration": {}})).await;
    assert_eq!((answer.status, answer.code()), (403, Some("not_authorized")), "{:?}", answer.body);
    let slot = d.http.put("/agent_api/v1/profile/prompt_documents/system_prompt", &json!({"content": "x"})).await;
    assert_eq!((slot.status, slot.code()), (403, Some("not_authorized")));
    let definition = json!({"scope": "instance", "description": "d", "configuration": {}});
    let named = d.http.put("/agent_api/v1/profile/agents/helper", &definition).await;
    assert_eq!((named.status, named.code()), (403, Some("not_authorized")));
    assert_eq!(d.snapshot().await.0, before.0, "nothing changed");
    assert_eq!(d.http.profile().await.status, 200, "reading stays open");
    nexus_actors::cli::admin::set_member_status(d.server.store(), d.agent.member(), nexus_proto::MemberStatus::Active)
        .await
        .expect("reinstated");
    assert_eq!(d.http.declare(&json!({"configuration": {}})).await.status, 200);
}

// ---- conversation_reach at run time (`docs/kernel-tools.md`, "session_search and session_read") --

/// A server whose `fake` provider is a [`nexus_tests::FakeProvider`] the history tools are called
/// through, with two Agents.
struct ReachBed {
    fake: nexus_tests::FakeProvider,
    server: TestServer,
    ada: Minted,
    bob: Minted,
}

impl ReachBed {
    async fn start() -> ReachBed {
        let fake = nexus_tests::FakeProvider::start().await;
        let server = TestServer::start_with_fake(&fake).await;
        let ada = server.agent("ada").await;
        let bob = server.agent("bob").await;
        ReachBed { fake, server, ada, bob }
    }

    fn http(&self) -> Http {
        Http::new(&self.server.url(), Some(&self.ada.token))
    }

    /// Queues `acts` for `fake/<model>` and posts `text` for `agent`, inline-declared on it with
    /// the history tools and `reach` (or, when `reach` is `None`, under the standing profile).
    async fn post(
        &self,
        agent: &Minted,
        conversation: Option<nexus_proto::ConversationId>,
        text: &str,
        model: &str,
        reach: Option<Value>,
        acts: Vec<nexus_tests::Act>,
    ) -> nexus_actors::doors::api::Admitted {
        self.fake.script(model, acts);
        let caller = self.server.caller(agent).await;
        let declaration = reach.map(|reach| {
            json!({"approval_mode": "bypass", "default_model": format!("fake/{model}"), "conversation_reach": reach,
                "kernel_tools": ["nexus.conversation.search", "nexus.conversation.read"]})
        });
        let input = CreateInput {
            conversation_public_id: conversation,
            text: text.to_owned(),
            execution_declaration: declaration,
            ..CreateInput::default()
        };
        self.server.server.api.create_input(&caller, input).await.expect("admitted")
    }

    async fn completed(&self, execution: ExecutionId) -> ExecutionRow {
        let row = self.server.settled(execution, Duration::from_secs(30)).await;
        assert_eq!(row.status, nexus_proto::RunStatus::Completed, "{row:?}");
        row
    }

    /// The tool results request `index` of `model` carried, by call id.
    fn read(&self, model: &str, index: usize) -> BTreeMap<String, Value> {
        let requests = self.fake.requests_for(model);
        let Some(request) = requests.get(index) else { panic!("no request {index} of {model}") };
        request.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                let content = m["content"].as_str().unwrap_or_default();
                let value = serde_json::from_str(content).unwrap_or_else(|_| json!(content));
                (m["tool_call_id"].as_str().unwrap_or_default().to_owned(), value)
            })
            .collect()
    }
}

fn history_calls(calls: &[(&str, &str, Value)]) -> nexus_tests::Act {
    nexus_tests::Act::ToolCalls(
        calls.iter().map(|(id, name, input)| ((*id).to_owned(), (*name).to_owned(), input.clone())).collect(),
    )
}

/// The `(session_id, turn_id)` of each search hit.
fn hits(result: &Value) -> Vec<(Value, Value)> {
    let Some(results) = result["results"].as_array() else { panic!("a search result: {result}") };
    results.iter().map(|r| (r["session_id"].clone(), r["turn_id"].clone())).collect()
}

#[tokio::test]
async fn r37_subtree_restricts_the_history_tools_to_the_current_conversation_and_null_means_workspace() {
    let bed = ReachBed::start().await;
    let plain = || vec![nexus_tests::Act::Text("noted".into())];
    let a1 = bed.post(&bed.ada, None, "alpha zebra", "seed", Some(Value::Null), plain()).await;
    bed.completed(a1.execution_public_id).await;
    let b1 = bed.post(&bed.ada, None, "beta zebra", "seed", Some(Value::Null), plain()).await;
    bed.completed(b1.execution_public_id).await;
    let x1 = bed.post(&bed.bob, None, "bob zebra", "seed", Some(Value::Null), plain()).await;
    bed.completed(x1.execution_public_id).await;
    let (a, b) = (a1.conversation_public_id, b1.conversation_public_id);
    let probe = || {
        vec![
            history_calls(&[
                ("s", "session_search", json!({"query": "zebra"})),
                ("ra", "session_read", json!({"session_id": a})),
                ("rb", "session_read", json!({"session_id": b})),
                ("rx", "session_read", json!({"session_id": x1.conversation_public_id})),
            ]),
            nexus_tests::Act::Text("done".into()),
        ]
    };

    // subtree, continuing conversation A: A's turns only; B reads as unknown.
    let inside = bed.post(&bed.ada, Some(a), "look around", "subtree", Some(json!("subtree")), probe()).await;
    bed.completed(inside.execution_public_id).await;
    let read = bed.read("subtree", 1);
    assert_eq!(hits(&read["s"]), [(json!(a), json!(a1.input_public_id))]);
    assert_eq!(read["ra"]["turns"][0]["input"], "alpha zebra");
    assert!(read["rb"].as_str().is_some_and(|m| m.starts_with("unknown_conversation")), "{}", read["rb"]);

    // workspace and null alike: the Agent's other conversations, never bob's.
    for (model, reach) in [("workspace", json!("workspace")), ("null", Value::Null)] {
        let outside = bed.post(&bed.ada, None, "look around", model, Some(reach), probe()).await;
        bed.completed(outside.execution_public_id).await;
        let read = bed.read(model, 1);
        let found = hits(&read["s"]);
        assert_eq!(found, [(json!(b), json!(b1.input_public_id)), (json!(a), json!(a1.input_public_id))], "{model}");
        assert_eq!(read["ra"]["turns"][0]["input"], "alpha zebra", "{model}");
        assert_eq!(read["rb"]["turns"][0]["input"], "beta zebra", "{model}");
        assert!(read["rx"].as_str().is_some_and(|m| m.starts_with("unknown_conversation")), "{model}: {}", read["rx"]);
    }
}

#[tokio::test]
async fn r38_reach_is_frozen_at_materialization_and_a_regeneration_keeps_it() {
    let bed = ReachBed::start().await;
    let seed = bed
        .post(&bed.ada, None, "alpha zebra", "seed", Some(Value::Null), vec![nexus_tests::Act::Text("noted".into())])
        .await;
    bed.completed(seed.execution_public_id).await;
    let profile = |reach: &str| {
        json!({"configuration": {"approval_mode": "ask", "default_model": "fake/held", "conversation_reach": reach,
            "kernel_tools": ["nexus.conversation.search"]}})
    };
    let declared = bed.http().declare(&profile("subtree")).await;
    assert_eq!(declared.status, 200, "{:?}", declared.body);
    let search = || {
        vec![
            history_calls(&[("s", "session_search", json!({"query": "zebra"}))]),
            nexus_tests::Act::Text("done".into()),
        ]
    };
    let held = bed.post(&bed.ada, None, "where is it", "held", None, search()).await;
    let shared = &bed;
    let approve = |execution: ExecutionId| async move {
        let bed = shared;
        bed.server.task_in(execution, "r1t0", nexus_proto::TaskStatus::NeedsApproval).await;
        let path = format!("/agent_api/v1/executions/{execution}/tasks/r1t0/approve");
        let approved = bed.http().post(&path, &json!({})).await;
        assert_eq!(approved.status, 200, "{:?}", approved.body);
    };

    // Materialized under subtree and parked; the profile widens; the call still reads subtree.
    bed.server.task_in(held.execution_public_id, "r1t0", nexus_proto::TaskStatus::NeedsApproval).await;
    let widened = bed.http().declare(&profile("workspace")).await;
    assert_eq!(widened.status, 200, "{:?}", widened.body);
    approve(held.execution_public_id).await;
    let row = bed.completed(held.execution_public_id).await;
    assert_eq!(row.declaration.as_ref().map(|d| d["conversation_reach"].clone()), Some(json!("subtree")));
    assert_eq!(
        hits(&bed.read("held", 1)["s"]),
        Vec::<(Value, Value)>::new(),
        "the frozen subtree holds only this conversation"
    );

    // A regeneration reuses the captured declaration, reach included.
    bed.fake.script("held", search());
    let again =
        bed.http().post(&format!("/agent_api/v1/executions/{}/regenerate", held.execution_public_id), &json!({})).await;
    assert_eq!((again.status, again.body["declaration"].as_str()), (201, Some("reused")), "{:?}", again.body);
    let regenerated: ExecutionId = again.body["execution_public_id"].as_str().expect("id").parse().expect("uuid");
    approve(regenerated).await;
    let row = bed.completed(regenerated).await;
    assert_eq!(row.declaration.as_ref().map(|d| d["conversation_reach"].clone()), Some(json!("subtree")));
    assert_eq!(
        hits(&bed.read("held", 3)["s"]),
        Vec::<(Value, Value)>::new(),
        "the regeneration keeps the captured reach"
    );

    // New work takes the profile as it is now: workspace reaches the seed.
    let fresh = bed.post(&bed.ada, None, "where is it now", "held", None, search()).await;
    approve(fresh.execution_public_id).await;
    bed.completed(fresh.execution_public_id).await;
    assert_eq!(hits(&bed.read("held", 5)["s"]), [(json!(seed.conversation_public_id), json!(seed.input_public_id))]);
}

/// The standing profile of a memory Agent answered by `scripted/m`, with `limit` as its
/// `memory_context_limit`.
fn memory_profile(limit: &serde_json::Value) -> serde_json::Value {
    json!({"configuration": {"default_model": "scripted/m", "approval_mode": "bypass",
        "kernel_tools": ["nexus.memory.write", "nexus.memory.read"], "memory_context_limit": limit}})
}

/// A script writing `workspace/r.md` and `conversation/r.md`, answering both results.
fn memory_script() -> serde_json::Value {
    json!({"rounds": [
        {"tool_calls": [
            {"id": "w", "name": "memory_write", "arguments": {"path": "workspace/r.md", "content": "x"}},
            {"id": "c", "name": "memory_write", "arguments": {"path": "conversation/r.md", "content": "x"}},
        ]},
        {"final": "{{tool:w}} | {{tool:c}}"},
    ]})
}

async fn memory_turn(server: &TestServer, http: &Http) -> (nexus_proto::ExecutionId, String) {
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "go"})).await;
    assert_eq!(admitted.status, 201, "{:?}", admitted.body);
    let id = admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    let row = server.settled(id, std::time::Duration::from_secs(30)).await;
    (id, row.final_text.unwrap_or_default())
}

#[tokio::test]
async fn r36_effective_memory_is_selected_intersect_limit_read_wins_no_root_added() {
    let server = TestServer::start(&[("m", memory_script())]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    // read beats read_write; the conversation root stays writable; `speaker` in the limit adds no
    // root (the Agent posts its own input: no speaker is selected).
    let limit = json!({"bindings": [
        {"name": "conversation", "scope": "conversation", "access": "read_write"},
        {"name": "workspace", "scope": "workspace", "access": "read"},
        {"name": "speaker", "scope": "speaker", "access": "read_write"},
    ]});
    assert_eq!(http.declare(&memory_profile(&limit)).await.status, 200);
    let (_, answer) = memory_turn(&server, &http).await;
    let (workspace, conversation) = answer.split_once(" | ").expect("two results");
    assert!(workspace.starts_with("memory_read_only:"), "{workspace}");
    assert!(conversation.starts_with("{\"bytes\":1"), "{conversation}");
    // `{"bindings": []}` admits none.
    assert_eq!(http.declare(&memory_profile(&json!({"bindings": []}))).await.status, 200);
    let (_, answer) = memory_turn(&server, &http).await;
    assert!(
        answer.starts_with("memory_scope_unavailable:") && answer.contains("| memory_scope_unavailable:"),
        "{answer}"
    );
}

#[tokio::test]
async fn r38_a_limit_changed_after_materialization_changes_nothing_for_the_execution_or_its_regeneration() {
    let server = TestServer::start(&[("m", memory_script())]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    assert_eq!(http.declare(&memory_profile(&serde_json::Value::Null)).await.status, 200);
    let (first, answer) = memory_turn(&server, &http).await;
    assert!(!answer.contains("memory_"), "{answer}");
    let read_only = json!({"bindings": [
        {"name": "conversation", "scope": "conversation", "access": "read"},
        {"name": "workspace", "scope": "workspace", "access": "read"},
    ]});
    assert_eq!(http.declare(&memory_profile(&read_only)).await.status, 200);
    // The regeneration reuses the frozen declaration: its writes still land.
    let regenerated = http.post(&format!("/agent_api/v1/executions/{first}/regenerate"), &json!({})).await;
    assert!(regenerated.status < 300, "{:?}", regenerated.body);
    let again: nexus_proto::ExecutionId =
        regenerated.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    let row = server.settled(again, std::time::Duration::from_secs(30)).await;
    let text = row.final_text.unwrap_or_default();
    assert!(!text.contains("memory_read_only"), "the frozen context stands: {text}");
    assert!(text.contains("\"revision\":2"), "{text}");
    // A new execution freezes the new limit.
    let (_, answer) = memory_turn(&server, &http).await;
    assert!(answer.starts_with("memory_read_only:") && answer.contains("| memory_read_only:"), "{answer}");
}
