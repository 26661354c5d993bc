//! Hostile model answers end to end (`docs/executions.md`, "Answer bounds", "Reply bounds",
//! "Provider call ids", "Text and NUL"), against the local fake provider on both wires:
//!
//! - an answer over its bounds (70 MB, or just over the text bound) is refused `provider_error`,
//!   nothing of it is stored, and the execution stays readable on every door;
//! - a round's paged task list and a bounded reply on both protocols;
//! - two calls under one provider id go back to the provider under distinct ids, each result
//!   paired with its own call, while the record keeps the model's id;
//! - NUL from a person is refused at the door, NUL from a model is stored by the documented rule,
//!   on either store.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_stream::StreamExt;

use nexus_actors::model::bounds::ANSWER_TEXT_BOUND;
use nexus_actors::model::{ProviderConfig, ProviderKind};
use nexus_actors::store::EventType;
use nexus_proto::agent::v1::{CreateInputRequest, GetExecutionRequest, StreamEventsRequest};
use nexus_proto::{ErrorCode, ExecutionId, RunStatus};
use nexus_tests::{Act, FakeProvider, Http, Minted, TestServer, Wire, agent_client, authed};

const SETTLE: Duration = Duration::from_secs(60);

/// A server whose providers point at one fake: `oa` (OpenAI-compatible, streaming), `oa_whole`
/// (the same, whole answers) and `an` (Anthropic, streaming).
async fn bed() -> (FakeProvider, TestServer, Minted) {
    let fake = FakeProvider::start().await;
    let (openai_url, anthropic_url) = (fake.openai_base_url(), fake.anthropic_base_url());
    let server = TestServer::start_with_env(
        &[],
        |name| (name == "NEXUS_TEST_BOUNDS_KEY").then(|| "k".to_owned()),
        move |config| {
            config.execution.model_attempts = 1;
            let openai = |url: &str| ProviderConfig {
                base_url: Some(url.to_owned()),
                allow_any_model: true,
                ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
            };
            let providers = &mut config.providers.providers;
            providers.insert("oa".into(), openai(&openai_url));
            providers.insert("oa_whole".into(), ProviderConfig { stream: false, ..openai(&openai_url) });
            providers.insert(
                "an".into(),
                ProviderConfig {
                    base_url: Some(anthropic_url),
                    api_key_env: Some("NEXUS_TEST_BOUNDS_KEY".into()),
                    allow_any_model: true,
                    ..ProviderConfig::new(ProviderKind::Anthropic)
                },
            );
        },
    )
    .await;
    let agent = server.agent("agent").await;
    (fake, server, agent)
}

fn declaration(model: &str) -> Value {
    json!({"approval_mode": "bypass", "default_model": model, "kernel_tools": ["nexus.runners.list"]})
}

/// Reads the execution on every door: gRPC `GetExecution` and `StreamEvents` (whole, not
/// followed), HTTP `GET …/executions/{id}` and one page of `GET …/events`. Answers the gRPC
/// execution JSON, the gRPC final text and the event types.
async fn read_everywhere(server: &TestServer, agent: &Minted, execution: ExecutionId) -> (Value, String, Vec<String>) {
    let mut client = agent_client(server).await;
    let id = execution.to_string();
    let reply = client
        .get_execution(authed(
            GetExecutionRequest { execution_public_id: id.clone(), tasks_after: String::new() },
            agent,
        ))
        .await
        .expect("GetExecution answers whatever the store accepted")
        .into_inner();
    let detail: Value = serde_json::from_str(&reply.execution_json).expect("execution json");
    assert!(detail.get("final_text").is_none(), "the final text travels once, in its own field");
    let request = StreamEventsRequest {
        execution_public_id: id.clone(),
        after: String::new(),
        follow: false,
        transcript: false,
        progress: false,
    };
    let stream = client.stream_events(authed(request, agent)).await.expect("StreamEvents opens").into_inner();
    let events: Vec<_> =
        tokio::time::timeout(SETTLE, stream.collect::<Vec<_>>()).await.expect("the stream ends").into_iter().collect();
    let types = events.into_iter().map(|e| e.expect("every event fits a reply").r#type).collect::<Vec<String>>();

    let http = Http::new(&server.url(), Some(&agent.token));
    let got = http.get(&format!("/agent_api/v1/executions/{id}")).await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(got.body["status"], detail["status"]);
    let page = http.get(&format!("/agent_api/v1/executions/{id}/events?limit=200")).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.body["items"].as_array().map(Vec::len), Some(types.len()));
    (detail, reply.final_text, types)
}

#[tokio::test]
async fn a_70_mb_answer_is_refused_with_its_word_and_the_execution_stays_readable() {
    let (fake, server, agent) = bed().await;
    let huge = "x".repeat(70 * 1024 * 1024);
    let just_over = "y".repeat(ANSWER_TEXT_BOUND + 1024);
    // 70 MB streamed and whole on the OpenAI wire; just over the text bound on both wires.
    let cases = [
        ("oa", "huge", huge.clone()),
        ("oa_whole", "huge_whole", huge),
        ("oa", "over", just_over.clone()),
        ("an", "over_an", just_over),
    ];
    for (provider, model, text) in cases {
        fake.script(model, [Act::Text(text)]);
        let execution = server.run_declared(&agent, "say a lot", declaration(&format!("{provider}/{model}"))).await;
        let row = server.settled(execution, SETTLE).await;
        assert_eq!(row.status, RunStatus::NeedsAttention, "{model}: {:?}", row.error_key);
        assert_eq!(row.error_key.as_deref(), Some("provider_error"), "{model}");
        assert_eq!(row.final_text, None, "{model}: nothing of the answer is stored");
        let events = server.store().events_after(execution, 0, i64::MAX).await.expect("events");
        let stored: usize = events.iter().map(|e| e.event.data().to_string().len()).sum();
        assert!(stored < 64 * 1024, "{model}: the events hold {stored} bytes");
        let attention = events
            .iter()
            .find(|e| e.event.event_type() == EventType::AttentionRequired)
            .map(|e| e.event.data())
            .expect("attention_required");
        assert_eq!(attention["error_key"], "provider_error", "{model}");
        let (detail, final_text, types) = read_everywhere(&server, &agent, execution).await;
        assert_eq!((detail["status"].as_str(), final_text.as_str()), (Some("needs_attention"), ""));
        assert!(types.iter().any(|t| t == "attention_required"), "{model}: {types:?}");
    }
}

#[tokio::test]
async fn an_answer_at_the_text_bound_completes_and_reads_back_whole() {
    let (fake, server, agent) = bed().await;
    // Just under the bound, with quotes that cost two bytes each as JSON.
    let text = format!("{}{}", "\"".repeat(1000), "z".repeat(ANSWER_TEXT_BOUND - 2000));
    fake.script("fits", [Act::Text(text.clone())]);
    let execution = server.run_declared(&agent, "say a lot", declaration("oa/fits")).await;
    let row = server.settled(execution, SETTLE).await;
    assert_eq!(row.status, RunStatus::Completed, "{:?}", row.error_key);
    let (_, final_text, types) = read_everywhere(&server, &agent, execution).await;
    assert_eq!(final_text, text, "the gRPC reply carries the whole text once");
    assert!(types.iter().any(|t| t == "round_result"));
}

#[tokio::test]
async fn too_wide_a_fan_is_refused_before_any_call_runs() {
    let (fake, server, agent) = bed().await;
    let calls = (0..33).map(|i| (format!("c{i}"), "runners_list".to_owned(), json!({}))).collect();
    fake.script("wide", [Act::ToolCalls(calls)]);
    let execution = server.run_declared(&agent, "call everything", declaration("oa/wide")).await;
    let row = server.settled(execution, SETTLE).await;
    assert_eq!(row.status, RunStatus::NeedsAttention);
    assert_eq!(row.error_key.as_deref(), Some("round_expansion_refused"));
    assert!(server.store().tasks_of(execution).await.expect("tasks").is_empty(), "no call became a task");
}

#[tokio::test]
async fn the_task_list_continues_after_a_key_on_both_doors() {
    let (fake, server, agent) = bed().await;
    let calls = (0..3).map(|i| (format!("c{i}"), "runners_list".to_owned(), json!({}))).collect();
    fake.script("three", [Act::ToolCalls(calls), Act::Text("done".into())]);
    let execution = server.run_declared(&agent, "page me", declaration("oa/three")).await;
    let row = server.settled(execution, SETTLE).await;
    assert_eq!(row.status, RunStatus::Completed, "{:?}", row.error_key);

    let mut client = agent_client(&server).await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let keys = |detail: &Value| -> Vec<String> {
        detail["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| t["task_key"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let page =
        |after: &str| GetExecutionRequest { execution_public_id: execution.to_string(), tasks_after: after.into() };
    let first: Value = serde_json::from_str(
        &client.get_execution(authed(page(""), &agent)).await.expect("first").into_inner().execution_json,
    )
    .expect("json");
    assert_eq!(
        (keys(&first), &first["tasks_next"]),
        (vec!["r1t0".to_owned(), "r1t1".into(), "r1t2".into()], &Value::Null)
    );
    let rest: Value = serde_json::from_str(
        &client.get_execution(authed(page("r1t0"), &agent)).await.expect("rest").into_inner().execution_json,
    )
    .expect("json");
    assert_eq!(keys(&rest), ["r1t1", "r1t2"]);
    let over_http = http.get(&format!("/agent_api/v1/executions/{execution}?tasks_after=r1t0")).await;
    assert_eq!(over_http.body["tasks"], rest["tasks"], "both doors page alike");

    let bad = client.get_execution(authed(page("r9t9"), &agent)).await.expect_err("an unknown task key");
    assert_eq!(nexus_proto::Refusal::from_status(&bad).code, ErrorCode::ParameterInvalid);
    let bad_http = http.get(&format!("/agent_api/v1/executions/{execution}?tasks_after=r9t9")).await;
    assert_eq!((bad_http.status, bad_http.code()), (400, Some("parameter_invalid")));
}

/// The ids the assistant's calls carry and the ids the results answer, in a request.
fn wire_ids(request: &nexus_tests::FakeRequest) -> (Vec<String>, Vec<String>) {
    let messages = request.body["messages"].as_array().cloned().unwrap_or_default();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    match request.wire {
        Wire::OpenAi => (
            messages
                .iter()
                .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
                .map(|c| text(&c["id"]))
                .collect(),
            messages.iter().filter(|m| m["role"] == "tool").map(|m| text(&m["tool_call_id"])).collect(),
        ),
        Wire::Anthropic => {
            let blocks: Vec<Value> =
                messages.iter().flat_map(|m| m["content"].as_array().cloned().unwrap_or_default()).collect();
            (
                blocks.iter().filter(|b| b["type"] == "tool_use").map(|b| text(&b["id"])).collect(),
                blocks.iter().filter(|b| b["type"] == "tool_result").map(|b| text(&b["tool_use_id"])).collect(),
            )
        }
    }
}

#[tokio::test]
async fn duplicate_provider_call_ids_go_back_distinct_and_paired_on_both_wires() {
    let (fake, server, agent) = bed().await;
    for (provider, model) in [("oa", "dup_oa"), ("an", "dup_an")] {
        // Round 1: two calls under one id; round 2: the same id once more, and an empty one.
        fake.script(
            model,
            [
                Act::ToolCalls(vec![
                    ("same".into(), "runners_list".into(), json!({})),
                    ("same".into(), "tool_search".into(), json!({"query": "runners"})),
                ]),
                Act::ToolCalls(vec![("same".into(), "tool_search".into(), json!({"query": "list"}))]),
                Act::EchoLastToolResult,
            ],
        );
        let declared = json!({"approval_mode": "bypass", "default_model": format!("{provider}/{model}"),
                              "kernel_tools": ["nexus.runners.list", "nexus.tools.search"]});
        let execution = server.run_declared(&agent, "look around", declared).await;
        let row = server.settled(execution, SETTLE).await;
        assert_eq!(row.status, RunStatus::Completed, "{model}: {:?}", row.error_key);

        let requests = fake.requests_for(model);
        assert_eq!(requests.len(), 3, "{model}");
        let (calls, results) = wire_ids(&requests[2]);
        assert_eq!(calls.len(), 3, "{model}: {calls:?}");
        let distinct: BTreeSet<&String> = calls.iter().collect();
        assert_eq!(distinct.len(), 3, "{model}: every call goes out under its own id: {calls:?}");
        assert_eq!(results, calls, "{model}: each result answers its own call, in order");
        assert_eq!(calls[0], "same", "{model}: a first, unique id is kept as the model sent it");
        assert_eq!(wire_ids(&requests[1]).0, calls[..2], "{model}: the ids never change once sent");
        // Each result is paired with its own call: runners_list's result lists runners,
        // tool_search's lists tools.
        let contents = requests[2].tool_results();
        assert!(contents[0].contains("runners") && !contents[0].contains("\"tools\""), "{model}: {}", contents[0]);
        assert!(contents[1].contains("\"tools\""), "{model}: {}", contents[1]);

        // The record keeps what the model sent.
        let events = server.store().events_after(execution, 0, i64::MAX).await.expect("events");
        let recorded: Vec<String> = events
            .iter()
            .filter(|e| e.event.event_type() == EventType::RoundResult)
            .flat_map(|e| e.event.data()["tool_calls"].as_array().cloned().unwrap_or_default())
            .map(|c| c["tool_call_id"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(recorded, ["same", "same", "same"], "{model}");
        let tasks = server.store().tasks_of(execution).await.expect("tasks");
        assert!(tasks.iter().all(|t| t.tool_call_id == "same"), "{model}");
    }
}

#[tokio::test]
async fn nul_is_refused_from_people_and_stored_by_the_rule_from_models() {
    let (fake, server, agent) = bed().await;
    // From a person: 400 parameter_invalid on both protocols, and nothing is admitted.
    let http = Http::new(&server.url(), Some(&agent.token));
    let refused = http.post("/agent_api/v1/inputs", &json!({"text": "a\u{0}b"})).await;
    assert_eq!((refused.status, refused.code()), (400, Some("parameter_invalid")), "{:?}", refused.body);
    let mut client = agent_client(&server).await;
    let request = CreateInputRequest { text: "a\u{0}b".into(), ..CreateInputRequest::default() };
    let status = client.create_input(authed(request, &agent)).await.expect_err("NUL");
    assert_eq!(nexus_proto::Refusal::from_status(&status).code, ErrorCode::ParameterInvalid);

    // From a model: its text and its call's id and name are stored with U+FFFD in place of NUL,
    // on either store, and the execution completes.
    fake.script(
        "nul",
        [
            Act::ToolCalls(vec![("id\u{0}x".into(), "runners\u{0}list".into(), json!({}))]),
            Act::Text("the end\u{0}of it".into()),
        ],
    );
    let execution = server.run_declared(&agent, "say NUL", declaration("oa/nul")).await;
    let row = server.settled(execution, SETTLE).await;
    assert_eq!(row.status, RunStatus::Completed, "{:?}", row.error_key);
    assert_eq!(row.final_text.as_deref(), Some("the end\u{FFFD}of it"));
    let task = server.task(execution, "r1t0").await.expect("the call's task");
    assert_eq!((task.callable_name.as_str(), task.tool_call_id.as_str()), ("runners\u{FFFD}list", "id\u{FFFD}x"));
    assert_eq!(task.error_key.as_deref(), Some("unknown_tool"));
    let (_, final_text, _) = read_everywhere(&server, &agent, execution).await;
    assert_eq!(final_text, "the end\u{FFFD}of it");
}
