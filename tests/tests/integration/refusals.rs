//! One fault, one word (`docs/protocol.md`, "Refusals"): the same bad inputs walk every door of
//! both protocols and get the same word. The doors are read from their definitions (the HTTP
//! routes in `nexus-actors/src/doors/http*`, the methods of `agent.proto`), so a new door is in
//! the table the day it is added.

use std::path::Path;
use std::time::Duration;

use prost::Message;
use reqwest::Method;
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};

use nexus_proto::agent::v1::{
    CancelInputRequest, CompactExecutionRequest, CreateInputRequest, DeclareProfileRequest, EstimateContextRequest,
    ExecutorRequest, GetConversationRequest, GetExecutionRequest, GetProfileRequest, JsonRequest,
    ListConversationsRequest, ListExecutionsRequest, MemoryRequest, NamedDefinitionRequest, PauseExecutionRequest,
    PromptDocumentRequest, RegenerateExecutionRequest, ResumeExecutionRequest, StopExecutionRequest,
    StreamEventsRequest, TaskDecisionRequest,
};
use nexus_proto::{ErrorCode, ExecutionId, Refusal};
use nexus_tests::http::Http;
use nexus_tests::server::{Minted, TestServer};

/// The request bound of every door, HTTP body and gRPC message alike.
const BOUND: usize = nexus_actors::doors::http::BODY_LIMIT;

/// Every HTTP door, `(method, route)`, read from the router's definitions: each `.route("…",
/// …)` with the method routers it chains.
fn http_doors() -> Vec<(Method, String)> {
    let doors = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nexus-actors/src/doors");
    let mut files = vec![doors.join("http.rs")];
    for entry in std::fs::read_dir(doors.join("http")).expect("the http doors") {
        files.push(entry.expect("entry").path());
    }
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("source");
        let mut rest = text.as_str();
        while let Some(at) = rest.find(".route(\"") {
            rest = &rest[at + ".route(\"".len()..];
            let path = &rest[..rest.find('"').expect("a closed path")];
            // The route's arguments, up to its closing parenthesis.
            let mut depth = 1;
            let end = rest
                .char_indices()
                .find(|(_, c)| {
                    depth += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map(|(i, _)| i)
                .expect("a closed route");
            let arguments = &rest[path.len() + 1..end];
            for (word, method) in
                [("get", Method::GET), ("put", Method::PUT), ("post", Method::POST), ("delete", Method::DELETE)]
            {
                let called = arguments.match_indices(&format!("{word}(")).any(|(i, _)| {
                    arguments[..i].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                });
                if called {
                    found.push((method, path.to_owned()));
                }
            }
        }
    }
    found.sort_by(|a, b| (a.1.as_str(), a.0.as_str()).cmp(&(b.1.as_str(), b.0.as_str())));
    found
}

/// Every method of `nexus.agent.v1.AgentService`, read from `agent.proto`.
fn grpc_methods() -> Vec<String> {
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto/nexus/agent/v1/agent.proto");
    let text = std::fs::read_to_string(proto).expect("agent.proto");
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("rpc "))
        .map(|rest| rest[..rest.find('(').expect("rpc name")].trim().to_owned())
        .collect()
}

/// The credential a probe presents.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Credential {
    Agent,
    Missing,
    Garbage,
    /// A valid token of the other plane.
    Runner,
    /// Two `Authorization` headers, both the Agent's.
    Twice,
}

/// What came back: the HTTP status (or gRPC code), the word and the message.
#[derive(Clone, Debug, PartialEq)]
struct Answer {
    status: String,
    code: Option<ErrorCode>,
    message: String,
}

struct Fixture {
    server: TestServer,
    agent: Minted,
    runner: Minted,
    run: ExecutionId,
    client: reqwest::Client,
}

impl Fixture {
    async fn start() -> Fixture {
        // The table presents hundreds of bad credentials from 127.0.0.1.
        let server = TestServer::start_with(&[("refusals", json!({"rounds": [{"final": "done"}]}))], |config| {
            config.doors.credential_failure_burst = 100_000;
        })
        .await;
        let agent = server.agent("refusals").await;
        let runner = server.runner("refusals-runner").await;
        let run = server
            .run_declared(&agent, "hi", json!({"default_model": "scripted/refusals", "approval_mode": "bypass"}))
            .await;
        server.settled(run, Duration::from_secs(30)).await;
        Fixture { server, agent, runner, run, client: reqwest::Client::new() }
    }

    fn token(&self, credential: Credential) -> Vec<String> {
        let bearer = |token: &str| format!("Bearer {token}");
        match credential {
            Credential::Agent => vec![bearer(&self.agent.token)],
            Credential::Missing => vec![],
            Credential::Garbage => vec![bearer("sk-nexus-api-v1-0123456789abcdef")],
            Credential::Runner => vec![bearer(&self.runner.token)],
            Credential::Twice => vec![bearer(&self.agent.token), bearer(&self.agent.token)],
        }
    }

    /// The route with its segments filled: `id` for `{id}`.
    fn path(route: &str, id: &str) -> String {
        route
            .replace("{id}", id)
            .replace("{task_key}", "r1t0")
            .replace("{slot}", "system_prompt")
            .replace("{name}", "probe-def")
    }

    async fn http(&self, method: &Method, path: &str, credential: Credential, body: Option<(&str, Vec<u8>)>) -> Answer {
        let mut request = self.client.request(method.clone(), format!("{}{path}", self.server.url()));
        for value in self.token(credential) {
            request = request.header("authorization", value);
        }
        if let Some((content_type, body)) = body {
            request = request.header("content-type", content_type).body(body);
        }
        let response = request.send().await.expect("http request");
        let status = response.status().as_u16().to_string();
        let body: Value = serde_json::from_slice(&response.bytes().await.expect("body")).unwrap_or(Value::Null);
        Answer {
            status,
            code: body["code"].as_str().and_then(ErrorCode::from_word),
            message: body["message"].as_str().unwrap_or_default().to_owned(),
        }
    }

    async fn grpc(&self, method: &str, credential: Credential, message: Vec<u8>) -> Answer {
        let channel: Channel = Endpoint::from_shared(self.server.url()).expect("url").connect().await.expect("connect");
        let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(4 * BOUND);
        grpc.ready().await.expect("ready");
        let mut request = tonic::Request::new(message);
        for value in self.token(credential) {
            request.metadata_mut().append("authorization", value.parse().expect("metadata"));
        }
        let path = format!("/nexus.agent.v1.AgentService/{method}").parse().expect("path");
        let status = match grpc.server_streaming(request, path, Raw).await {
            Ok(response) => {
                let mut stream = response.into_inner();
                match stream.next().await {
                    Some(Err(status)) => status,
                    _ => tonic::Status::ok(""),
                }
            }
            Err(status) => status,
        };
        if status.code() == tonic::Code::Ok {
            return Answer { status: "OK".into(), code: None, message: String::new() };
        }
        let refusal = Refusal::from_status(&status);
        let worded = status.metadata().get("nexus-error-code").is_some();
        Answer {
            status: format!("{:?}", status.code()),
            code: worded.then_some(refusal.code),
            message: refusal.message,
        }
    }
}

/// Bytes in, bytes out: the table encodes each request itself.
#[derive(Clone, Copy, Debug, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        prost::bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let remaining = prost::bytes::Buf::remaining(src);
        Ok(Some(prost::bytes::Buf::copy_to_bytes(src, remaining).to_vec()))
    }
}

/// What a gRPC probe puts in its request: nothing odd, a JSON field's text, or an id's text.
#[derive(Clone, Copy, Debug)]
enum Field<'a> {
    Plain,
    Json(&'a str),
    Id(&'a str),
}

/// Whether a method's JSON field is its body (`body_json`), or a declaration it carries.
#[derive(Clone, Copy, Debug, PartialEq)]
enum JsonKind {
    Body,
    Declaration,
}

/// The encoded request of `method` with `field`, or `None` when the method has no such field.
/// `run` is an execution id in its one spelling, for the doors that need one.
fn request(method: &str, field: Field<'_>, run: &str) -> Option<(Vec<u8>, Option<JsonKind>)> {
    let (json, id) = match field {
        Field::Plain => ("", run),
        Field::Json(json) => (json, run),
        Field::Id(id) => ("", id),
    };
    let body = Some(JsonKind::Body);
    let declaration = Some(JsonKind::Declaration);
    let decision =
        || TaskDecisionRequest { execution_public_id: id.into(), task_key: "r1t0".into(), body_json: json.into() };
    let (encoded, kind, has_id) = match method {
        "DeclareProfile" => (DeclareProfileRequest { body_json: json.into() }.encode_to_vec(), body, false),
        "GetProfile" => (GetProfileRequest {}.encode_to_vec(), None, false),
        "CreateInput" => (
            CreateInputRequest {
                text: "hi".into(),
                execution_declaration_json: json.into(),
                conversation_public_id: if matches!(field, Field::Id(_)) { id.into() } else { String::new() },
                ..CreateInputRequest::default()
            }
            .encode_to_vec(),
            declaration,
            true,
        ),
        "GetExecution" | "ListChildren" => (
            GetExecutionRequest { execution_public_id: id.into(), tasks_after: String::new() }.encode_to_vec(),
            None,
            true,
        ),
        "StreamEvents" => (
            StreamEventsRequest { execution_public_id: id.into(), ..StreamEventsRequest::default() }.encode_to_vec(),
            None,
            true,
        ),
        "StopExecution" => {
            (StopExecutionRequest { execution_public_id: id.into(), force: None }.encode_to_vec(), None, true)
        }
        "PauseExecution" => {
            (PauseExecutionRequest { execution_public_id: id.into(), force: false }.encode_to_vec(), None, true)
        }
        "ResumeExecution" => (ResumeExecutionRequest { execution_public_id: id.into() }.encode_to_vec(), None, true),
        "RegenerateExecution" => (
            RegenerateExecutionRequest { execution_public_id: id.into(), execution_declaration_json: json.into() }
                .encode_to_vec(),
            declaration,
            true,
        ),
        "EstimateContext" => (
            EstimateContextRequest { execution_public_id: id.into(), execution_declaration_json: json.into() }
                .encode_to_vec(),
            declaration,
            true,
        ),
        "ApproveTask" | "DenyTask" | "AnswerTask" | "RetryTask" | "AbandonTask" => {
            (decision().encode_to_vec(), body, true)
        }
        "CompactExecution" => (CompactExecutionRequest { execution_public_id: id.into() }.encode_to_vec(), None, true),
        "CancelInput" => (CancelInputRequest { input_public_id: id.into() }.encode_to_vec(), None, true),
        "GetPromptDocument" | "PutPromptDocument" => (
            PromptDocumentRequest { slot: "system_prompt".into(), body_json: json.into() }.encode_to_vec(),
            body,
            false,
        ),
        "GetMemory" | "PutMemory" | "DeleteMemory" | "ListMemory" => (
            MemoryRequest {
                binding: "workspace".into(),
                path: "notes.md".into(),
                body_json: json.into(),
                ..MemoryRequest::default()
            }
            .encode_to_vec(),
            body,
            false,
        ),
        "PutNamedDefinition" | "DeleteNamedDefinition" => {
            (NamedDefinitionRequest { name: "probe-def".into(), body_json: json.into() }.encode_to_vec(), body, false)
        }
        "ListNamedDefinitions" | "ListTools" | "PreviewAssembly" | "ListModels" | "ListExecutors" => {
            (JsonRequest { body_json: json.into() }.encode_to_vec(), body, false)
        }
        "GetExecutor" => (ExecutorRequest { executor_public_id: id.into() }.encode_to_vec(), None, true),
        "ListConversations" => {
            (ListConversationsRequest { after: String::new(), limit: None }.encode_to_vec(), None, false)
        }
        "GetConversation" => {
            (GetConversationRequest { conversation_public_id: id.into(), turns_after: 0 }.encode_to_vec(), None, true)
        }
        "ListExecutions" => (
            ListExecutionsRequest {
                conversation_public_id: if matches!(field, Field::Id(_)) { id.into() } else { String::new() },
                ..ListExecutionsRequest::default()
            }
            .encode_to_vec(),
            None,
            true,
        ),
        other => panic!("the table has no row for the gRPC method {other}: add it"),
    };
    match field {
        Field::Plain => Some((encoded, kind)),
        Field::Json(_) => kind.map(|kind| (encoded, Some(kind))),
        Field::Id(_) => has_id.then_some((encoded, None)),
    }
}

/// A JSON text over the request bound.
fn oversize() -> String {
    format!("{{\"pad\": \"{}\"}}", "x".repeat(BOUND))
}

/// The body faults and their one word: `(fault, body, word)`.
fn body_faults() -> Vec<(&'static str, String, ErrorCode)> {
    vec![
        ("unparseable JSON", "{\"a\":".to_owned(), ErrorCode::ParameterMissing),
        ("non-object JSON", "[1]".to_owned(), ErrorCode::ParameterMissing),
        ("null", "null".to_owned(), ErrorCode::ParameterMissing),
        ("a key twice", "{\"k\": 1, \"k\": 2}".to_owned(), ErrorCode::ParameterInvalid),
        ("oversize", oversize(), ErrorCode::ContentTooLarge),
    ]
}

/// `null` clears a prompt document: it is that door's one lawful non-object body.
fn null_is_lawful(door: &str) -> bool {
    door.contains("prompt_documents") || door == "PutPromptDocument"
}

fn check(failures: &mut Vec<String>, door: &str, fault: &str, answer: &Answer, word: ErrorCode) {
    if answer.code != Some(word) {
        failures.push(format!("{door}, {fault}: wanted {word}, got {answer:?}"));
    } else if answer.message.trim().is_empty() {
        failures.push(format!("{door}, {fault}: {word} without a message"));
    }
}

#[tokio::test]
async fn every_door_answers_one_word_per_fault_on_both_protocols() {
    let f = Fixture::start().await;
    let doors = http_doors();
    assert!(doors.len() >= 25, "the router's definitions were not read: {doors:?}");
    assert!(doors.contains(&(Method::PUT, "/agent_api/v1/profile/configuration".to_owned())));
    let methods = grpc_methods();
    assert!(methods.len() >= 25, "agent.proto was not read: {methods:?}");
    let unknown_run = ExecutionId::new_v4().to_string();
    let shouting = f.run.to_string().to_uppercase();
    let mut failures = Vec::new();
    let mut unknown_message = None;

    for (method, route) in &doors {
        let door = format!("{method} {route}");
        let path = Fixture::path(route, &unknown_run);
        let takes_body = *method == Method::POST || *method == Method::PUT;
        let body = takes_body.then(|| ("application/json", b"{}".to_vec()));
        // Credentials: one word, and one message for a guess and a token of the other plane.
        for credential in [Credential::Missing, Credential::Garbage, Credential::Runner, Credential::Twice] {
            let answer = f.http(method, &path, credential, body.clone()).await;
            // The scrape is served to this host's callers without a credential (`docs/metrics.md`,
            // "Who may scrape"); a credential presented is checked as on every door.
            if route == "/metrics" && credential == Credential::Missing {
                if answer.status != "200" {
                    failures.push(format!("{door}: a loopback scrape without a credential got {answer:?}"));
                }
                continue;
            }
            check(&mut failures, &door, &format!("{credential:?} credential"), &answer, ErrorCode::Unauthorized);
        }
        let garbage = f.http(method, &path, Credential::Garbage, body.clone()).await;
        let runner = f.http(method, &path, Credential::Runner, body.clone()).await;
        if garbage != runner {
            failures.push(format!("{door}: a runner token is told from a guess: {garbage:?} / {runner:?}"));
        }
        match &unknown_message {
            None => unknown_message = Some(garbage.message.clone()),
            Some(message) if *message != garbage.message => {
                failures.push(format!("{door}: another message for a guessed token: {}", garbage.message));
            }
            Some(_) => {}
        }
        // An unknown query parameter.
        let answer = f.http(method, &format!("{path}?bogus=1"), Credential::Agent, body.clone()).await;
        check(&mut failures, &door, "an unknown query parameter", &answer, ErrorCode::ParameterInvalid);
        // An id in another spelling of a real one.
        if route.contains("{id}") {
            let id = if route.contains("executors") { f.runner.id.to_string() } else { f.run.to_string() };
            let answer = f.http(method, &Fixture::path(route, &id.to_uppercase()), Credential::Agent, None).await;
            check(&mut failures, &door, "an upper-case id", &answer, ErrorCode::ParameterInvalid);
        }
        if !takes_body {
            continue;
        }
        for (fault, text, word) in body_faults() {
            let answer = f.http(method, &path, Credential::Agent, Some(("application/json", text.into_bytes()))).await;
            if fault == "null" && null_is_lawful(route) {
                assert_eq!(answer.status, "200", "{door}: null clears the document: {answer:?}");
                continue;
            }
            check(&mut failures, &door, fault, &answer, word);
        }
        let answer = f.http(method, &path, Credential::Agent, Some(("text/plain", b"{}".to_vec()))).await;
        check(&mut failures, &door, "a wrong content type", &answer, ErrorCode::ParameterInvalid);
    }

    for method in &methods {
        let (plain, _) = request(method, Field::Plain, &unknown_run).expect("a plain request");
        for credential in [Credential::Missing, Credential::Garbage, Credential::Runner, Credential::Twice] {
            let answer = f.grpc(method, credential, plain.clone()).await;
            check(&mut failures, method, &format!("{credential:?} credential"), &answer, ErrorCode::Unauthorized);
        }
        let garbage = f.grpc(method, Credential::Garbage, plain.clone()).await;
        if Some(&garbage.message) != unknown_message.as_ref() {
            failures.push(format!("{method}: a guessed token is not answered as on HTTP: {garbage:?}"));
        }
        let runner = f.grpc(method, Credential::Runner, plain.clone()).await;
        if garbage != runner {
            failures.push(format!("{method}: a runner token is told from a guess: {garbage:?} / {runner:?}"));
        }
        // An oversize message, whatever field carries it.
        let answer = f.grpc(method, Credential::Agent, vec![0; BOUND + 1]).await;
        check(&mut failures, method, "an oversize message", &answer, ErrorCode::ContentTooLarge);
        if let Some((message, _)) = request(method, Field::Id(&shouting), &unknown_run) {
            let answer = f.grpc(method, Credential::Agent, message).await;
            check(&mut failures, method, "an upper-case id", &answer, ErrorCode::ParameterInvalid);
        }
        for (fault, text, word) in body_faults() {
            let Some((message, kind)) = request(method, Field::Json(&text), &unknown_run) else { continue };
            // A declaration field that is JSON but not an object is a field's value, judged as the
            // HTTP door judges `execution_declaration`; the body rules are the same.
            if kind == Some(JsonKind::Declaration) && matches!(fault, "non-object JSON" | "null") {
                continue;
            }
            let answer = f.grpc(method, Credential::Agent, message).await;
            if fault == "null" && null_is_lawful(method) {
                assert_eq!(answer.status, "OK", "{method}: null clears the document: {answer:?}");
                continue;
            }
            check(&mut failures, method, fault, &answer, word);
        }
    }
    assert!(failures.is_empty(), "{} refusals off the table:\n{}", failures.len(), failures.join("\n"));
}

#[tokio::test]
async fn a_key_given_twice_is_refused_and_changes_nothing() {
    let f = Fixture::start().await;
    let http = Http::new(&f.server.url(), Some(&f.agent.token));
    let before = http.get("/agent_api/v1/profile").await;
    let twice = r#"{"configuration": {"default_model": "scripted/refusals", "approval_mode": "ask", "approval_mode": "bypass"}}"#;
    let answer = http.send(Method::PUT, "/agent_api/v1/profile/configuration", Some(twice.to_owned())).await;
    assert_eq!((answer.status, answer.code()), (400, Some("parameter_invalid")), "{answer:?}");
    assert!(answer.message().contains("approval_mode"), "the message names the key: {}", answer.message());
    let mut client = nexus_tests::client::agent_client(&f.server).await;
    let status = client
        .declare_profile(nexus_tests::client::authed(DeclareProfileRequest { body_json: twice.to_owned() }, &f.agent))
        .await
        .expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::ParameterInvalid);
    assert!(status.message().contains("approval_mode"), "{}", status.message());
    let after = http.get("/agent_api/v1/profile").await;
    assert_eq!(before.body["configuration"], after.body["configuration"], "nothing changed");
    // Nested, and inside a JSON field of a gRPC request.
    let nested = r#"{"text": "hi", "execution_declaration": {"default_model": "scripted/refusals", "lifecycle_hooks": {"a": 1, "a": 2}}}"#;
    let answer = http.send(Method::POST, "/agent_api/v1/inputs", Some(nested.to_owned())).await;
    assert_eq!((answer.status, answer.code()), (400, Some("parameter_invalid")), "{answer:?}");
    let inline = CreateInputRequest {
        text: "hi".into(),
        execution_declaration_json: r#"{"default_model": "x/y", "default_model": "scripted/refusals"}"#.into(),
        ..CreateInputRequest::default()
    };
    let status = client.create_input(nexus_tests::client::authed(inline, &f.agent)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::ParameterInvalid);
}

#[tokio::test]
async fn an_execution_answers_to_one_spelling_of_its_id() {
    let f = Fixture::start().await;
    let http = Http::new(&f.server.url(), Some(&f.agent.token));
    let id = f.run.to_string();
    let found = http.get(&format!("/agent_api/v1/executions/{id}")).await;
    assert_eq!(found.status, 200, "{found:?}");
    let uuid = f.run.uuid();
    for other in [id.to_uppercase(), format!("{{{id}}}"), format!("urn:uuid:{id}"), uuid.simple().to_string()] {
        let answer =
            http.get(&format!("/agent_api/v1/executions/{}", other.replace('{', "%7B").replace('}', "%7D"))).await;
        assert_eq!((answer.status, answer.code()), (400, Some("parameter_invalid")), "{other}: {answer:?}");
        let mut client = nexus_tests::client::agent_client(&f.server).await;
        let status = client
            .get_execution(nexus_tests::client::authed(
                GetExecutionRequest { execution_public_id: other.clone(), tasks_after: String::new() },
                &f.agent,
            ))
            .await
            .expect_err("refused");
        assert_eq!(Refusal::from_status(&status).code, ErrorCode::ParameterInvalid, "{other}");
    }
}

#[tokio::test]
async fn failed_credentials_are_throttled_per_source_and_a_known_good_one_is_not() {
    let server = TestServer::start_with(&[], |config| {
        config.doors.credential_failure_burst = 3;
        config.doors.credential_failures_per_minute = 1;
    })
    .await;
    let agent = server.agent("throttled").await;
    let good = Http::new(&server.url(), Some(&agent.token));
    assert_eq!(good.get("/agent_api/v1/profile").await.status, 200);
    let guess = Http::new(&server.url(), Some("sk-nexus-api-v1-guess"));
    for _ in 0..3 {
        assert_eq!(guess.get("/agent_api/v1/profile").await.code(), Some("unauthorized"));
    }
    let throttled = guess.get("/agent_api/v1/profile").await;
    assert_eq!((throttled.status, throttled.code()), (429, Some("rate_limited")), "{throttled:?}");
    let wait: u64 = throttled.retry_after.as_deref().and_then(|s| s.parse().ok()).expect("Retry-After");
    assert!((1..=60).contains(&wait), "{wait}");
    // gRPC shares the budget and says the same, with `retry-after` metadata.
    let mut client = nexus_tests::client::agent_client(&server).await;
    let mut request = tonic::Request::new(GetProfileRequest {});
    request.metadata_mut().insert("authorization", "Bearer sk-nexus-api-v1-guess".parse().expect("metadata"));
    let status = client.get_profile(request).await.expect_err("throttled");
    let refusal = Refusal::from_status(&status);
    assert_eq!((refusal.code, refusal.retry_after.is_some()), (ErrorCode::RateLimited, true));
    // A credential that already worked from here still does; a new one waits like a guess (it
    // cannot be told from one without being looked up).
    assert_eq!(good.get("/agent_api/v1/profile").await.status, 200);
    let newcomer = server.agent("newcomer").await;
    let newcomer = Http::new(&server.url(), Some(&newcomer.token));
    assert_eq!(newcomer.get("/agent_api/v1/profile").await.code(), Some("rate_limited"));
    // The budget refills on the server's clock.
    server.clock().advance(Duration::from_secs(61));
    assert_eq!(guess.get("/agent_api/v1/profile").await.code(), Some("unauthorized"));
    assert_eq!(guess.get("/agent_api/v1/profile").await.code(), Some("rate_limited"));
}

#[tokio::test]
async fn a_runner_frame_over_the_bound_ends_the_stream_with_its_word() {
    use nexus_proto::runner::v1::runner_service_client::RunnerServiceClient;
    use nexus_proto::runner::v1::{Announce, RunnerFrame, runner_frame};

    let server = TestServer::start_with(&[], |config| config.runner.max_frame_bytes = 1_100_000).await;
    let channel = Endpoint::from_shared(server.url()).expect("url").connect().await.expect("connect");
    let mut client = RunnerServiceClient::new(channel).max_encoding_message_size(8 * 1024 * 1024);
    let frame = RunnerFrame {
        request_id: 1,
        frame: Some(runner_frame::Frame::Announce(Announce { body_json: "x".repeat(1_200_000) })),
    };
    let inbound = tokio_stream::iter(vec![frame]).chain(tokio_stream::pending());
    let response = client.connect(inbound).await;
    let status = match response {
        Err(status) => status,
        Ok(response) => {
            let mut stream = response.into_inner();
            let end = tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    match stream.message().await {
                        Ok(Some(_)) => continue,
                        Ok(None) => return None,
                        Err(status) => return Some(status),
                    }
                }
            })
            .await
            .expect("the stream ends");
            end.expect("the stream ends with a status, not OK")
        }
    };
    let refusal = Refusal::from_status(&status);
    assert_eq!(refusal.code, ErrorCode::ContentTooLarge, "{status:?}");
    assert!(status.metadata().get("nexus-error-code").is_some(), "the word travels as metadata");
    assert!(refusal.message.contains("max_frame_bytes"), "{}", refusal.message);
}

#[tokio::test]
async fn a_refusal_never_repeats_a_huge_input_whole() {
    let f = Fixture::start().await;
    let http = Http::new(&f.server.url(), Some(&f.agent.token));
    let name = "n".repeat(100_000);
    let body = json!({"configuration": {"kernel_tools": [name], "approval_mode": "bypass"}});
    let answer = http.put("/agent_api/v1/profile/configuration", &body).await;
    assert_eq!((answer.status, answer.code()), (422, Some("validation_failed")), "{}", answer.message().len());
    let bound = nexus_proto::error::MESSAGE_BOUND;
    assert!(answer.message().chars().count() <= bound + 1, "{} characters", answer.message().chars().count());
    let answer = http.get(&format!("/agent_api/v1/profile?{}=1", "q".repeat(10_000))).await;
    assert_eq!(answer.code(), Some("parameter_invalid"));
    assert!(answer.message().len() < 1_000, "{} bytes", answer.message().len());
}
