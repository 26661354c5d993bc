//! Model adapters and the fallback chain end to end: real executions against a local fake
//! provider that speaks the OpenAI and Anthropic wires (`docs/executions.md`, "Models").
//!
//! Each test scripts what every model answers, runs one execution (or two), and checks the
//! durable events (`model_change`, `round_started`, `turn_status`), what the fake was asked (and
//! never asked), and the ephemeral transcript deltas.

use nexus_actors::store::EventType;
use nexus_proto::{ExecutionId, RunStatus, TaskStatus};
use nexus_tests::key;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::broadcast;

use nexus_actors::actors::fabric::TranscriptEvent;
use nexus_actors::model::{ProviderConfig, ProviderKind, TranscriptDelta};
use nexus_actors::store::{EventRow, ExecutionRow};
use nexus_tests::{Act, FakeProvider, Minted, TestServer, Wire, wait_until};

const SETTLE: Duration = Duration::from_secs(30);
/// The variable the `an` provider reads its key from; only the test's environment defines it.
const ANTHROPIC_KEY_VAR: &str = "NEXUS_TEST_FAKE_ANTHROPIC_KEY";
const ANTHROPIC_KEY: &str = "sk-ant-fake-key";

/// A server whose providers all point at one fake:
/// - `oa`: openai_compatible, streaming; `oa_whole`: the same, asking for whole answers;
/// - `an`: anthropic, streaming, with a key;
/// - `keyless`: openai_compatible whose key variable is unset (`missing_credential`);
/// - `off`: a disabled openai_compatible provider (`provider_disabled`).
struct Bed {
    fake: FakeProvider,
    server: TestServer,
    agent: Minted,
}

impl Bed {
    async fn start() -> Bed {
        let fake = FakeProvider::start().await;
        let (openai_url, anthropic_url) = (fake.openai_base_url(), fake.anthropic_base_url());
        let server = TestServer::start_with_env(&[], test_env, move |config| {
            config.execution.model_attempts = 3;
            config.execution.model_retry_min_delay_ms = 5;
            config.execution.model_retry_max_delay_ms = 20;
            let openai = |url: &str| ProviderConfig {
                base_url: Some(url.to_owned()),
                allow_any_model: true,
                ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
            };
            let providers = &mut config.providers.providers;
            providers.insert("oa".into(), openai(&openai_url));
            providers.insert("oa_whole".into(), ProviderConfig { stream: false, ..openai(&openai_url) });
            providers.insert(
                "keyless".into(),
                ProviderConfig { api_key_env: Some("NEXUS_TEST_UNSET_KEY".into()), ..openai(&openai_url) },
            );
            providers.insert("off".into(), ProviderConfig { enabled: false, ..openai(&openai_url) });
            providers.insert(
                "an".into(),
                ProviderConfig {
                    base_url: Some(anthropic_url),
                    api_key_env: Some(ANTHROPIC_KEY_VAR.into()),
                    allow_any_model: true,
                    ..ProviderConfig::new(ProviderKind::Anthropic)
                },
            );
        })
        .await;
        let agent = server.agent("agent").await;
        Bed { fake, server, agent }
    }

    /// The ephemeral transcript feed, from now on.
    fn deltas(&self) -> broadcast::Receiver<TranscriptEvent> {
        self.server.server.api.fabric.events.subscribe_transcript()
    }

    /// Admits an input with an inline declaration and returns its execution.
    async fn run(&self, text: &str, declaration: Value) -> ExecutionId {
        self.server.run_declared(&self.agent, text, declaration).await
    }

    /// Waits until the execution is quiescent (completed, canceled or needs_attention).
    async fn settled(&self, execution: ExecutionId) -> ExecutionRow {
        self.server.settled(execution, SETTLE).await
    }

    async fn events(&self, execution: ExecutionId) -> Vec<EventRow> {
        self.server.store().events_after(execution, 0, i64::MAX).await.expect("events")
    }
}

/// The environment the servers read provider keys from: only the `an` provider's key is set.
fn test_env(name: &str) -> Option<String> {
    (name == ANTHROPIC_KEY_VAR).then(|| ANTHROPIC_KEY.to_owned())
}

/// The data of every event of `event_type`, in order.
fn of_type(events: &[EventRow], event_type: EventType) -> Vec<Value> {
    events.iter().filter(|e| e.event.event_type() == event_type).map(|e| e.event.data().clone()).collect()
}

/// `(round, model)` of every `round_started`.
fn rounds(events: &[EventRow]) -> Vec<(i64, String)> {
    of_type(events, EventType::RoundStarted)
        .iter()
        .map(|d| (d["round"].as_i64().unwrap_or(-1), d["model"].as_str().unwrap_or_default().to_owned()))
        .collect()
}

/// Every delta of `execution` published so far.
fn drain(feed: &mut broadcast::Receiver<TranscriptEvent>, execution: ExecutionId) -> Vec<TranscriptEvent> {
    let mut out = Vec::new();
    loop {
        match feed.try_recv() {
            Ok(event) if event.execution_public_id == execution => out.push(event),
            Ok(_) => {}
            Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed) => return out,
            Err(broadcast::error::TryRecvError::Lagged(n)) => panic!("the transcript feed lagged by {n}"),
        }
    }
}

/// `text_delta`, `stream_reset:<reason>`, `tool_call_started:<name>`, … of each delta.
fn words(deltas: &[TranscriptEvent]) -> Vec<String> {
    deltas
        .iter()
        .map(|e| match &e.delta {
            TranscriptDelta::StreamReset { reason } => format!("stream_reset:{}", reason.word()),
            TranscriptDelta::ToolCallStarted { name, .. } => format!("tool_call_started:{name}"),
            other => other.event_type().as_str().to_owned(),
        })
        .collect()
}

/// The streamed text of one round and model.
fn streamed_text(deltas: &[TranscriptEvent], round: i64, model: &str) -> String {
    deltas
        .iter()
        .filter(|e| e.round == round && e.model == model)
        .filter_map(|e| match &e.delta {
            TranscriptDelta::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn call(id: &str, name: &str, arguments: Value) -> (String, String, Value) {
    (id.to_owned(), name.to_owned(), arguments)
}

#[tokio::test]
async fn a_refusal_falls_back_and_the_completed_tool_results_stay() {
    let bed = Bed::start().await;
    bed.fake.script("careful", [Act::ToolCalls(vec![call("call_rl", "runners_list", json!({}))]), Act::Refuse]);
    bed.fake.script("bold", [Act::EchoLastToolResult]);
    let mut feed = bed.deltas();
    let execution = bed
        .run(
            "who runs my tools?",
            json!({"approval_mode": "bypass", "default_model": "oa/careful", "fallback_models": ["oa/bold"],
                   "kernel_tools": ["nexus.runners.list"]}),
        )
        .await;
    let row = bed.settled(execution).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let final_text = row.final_text.clone().unwrap_or_default();
    assert!(final_text.starts_with("tool said: ") && final_text.contains("runners"), "{final_text}");

    let events = bed.events(execution).await;
    assert_eq!(
        of_type(&events, EventType::ModelChange),
        vec![json!({"round": 2, "from": "oa/careful", "to": "oa/bold", "reason": "model_refused",
                    "error_key": "model_refused"})]
    );
    // The refused round is replaced on the fallback, under the same number.
    assert_eq!(rounds(&events), vec![(1, "oa/careful".into()), (2, "oa/careful".into()), (2, "oa/bold".into())]);
    // Recovery replaces the model step; the completed tool result stays in its transcript.
    let careful = bed.fake.requests_for("careful");
    let bold = bed.fake.requests_for("bold");
    assert_eq!((careful.len(), bold.len()), (2, 1));
    assert_eq!(careful[1].tool_results().len(), 1);
    assert_eq!(bold[0].tool_results(), careful[1].tool_results(), "the fallback reads the same tool result");
    assert!(bold[0].stream && bold[0].wire == Wire::OpenAi);

    // The deltas narrate both models: the tool call of round 1, the fallback's text in round 2.
    let deltas = drain(&mut feed, execution);
    assert!(words(&deltas).contains(&"tool_call_started:runners_list".to_owned()), "{:?}", words(&deltas));
    assert_eq!(streamed_text(&deltas, 2, "oa/bold"), final_text);
    assert!(
        !deltas.iter().any(|e| matches!(e.delta, TranscriptDelta::StreamReset { .. })),
        "a refusal that streamed no text needs no reset"
    );
}

#[tokio::test]
async fn a_second_refusal_at_the_end_of_the_chain_stands() {
    let bed = Bed::start().await;
    bed.fake.script("first", [Act::Refuse]);
    bed.fake.script("second", [Act::Refuse]);
    let mut feed = bed.deltas();
    let execution = bed
        .run("do it", json!({"approval_mode": "bypass", "default_model": "an/first", "fallback_models": ["an/second"]}))
        .await;
    let row = bed.settled(execution).await;
    assert_eq!(row.status, RunStatus::NeedsAttention);
    assert_eq!(row.attention_reason, Some(nexus_proto::AttentionReason::HaltFailure));
    assert_eq!(row.error_key.as_deref(), Some("model_refused"));
    let events = bed.events(execution).await;
    let changes = of_type(&events, EventType::ModelChange);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!((changes[0]["from"].as_str(), changes[0]["to"].as_str()), (Some("an/first"), Some("an/second")));
    assert_eq!(
        of_type(&events, EventType::TurnStatus).last().map(|d| d["error_key"].clone()),
        Some(json!("model_refused"))
    );
    assert_eq!((bed.fake.count("first"), bed.fake.count("second")), (1, 1), "a refusal is never retried");
    // Each refusal came after a streamed word, and each is reset as refused.
    assert_eq!(
        words(&drain(&mut feed, execution)),
        ["text_delta", "stream_reset:refused", "text_delta", "stream_reset:refused"]
    );
    let request = &bed.fake.requests_for("first")[0];
    assert_eq!(request.wire, Wire::Anthropic);
    assert_eq!(request.headers.get("x-api-key").map(String::as_str), Some(ANTHROPIC_KEY));
}

#[tokio::test]
async fn a_content_block_never_falls_back() {
    let bed = Bed::start().await;
    bed.fake.script("filtered", [Act::Block]);
    bed.fake.script("spare", [Act::Text("never asked".into())]);
    let mut feed = bed.deltas();
    let execution = bed
        .run(
            "say it",
            json!({"approval_mode": "bypass", "default_model": "oa/filtered", "fallback_models": ["oa/spare"]}),
        )
        .await;
    let row = bed.settled(execution).await;
    assert_eq!(row.status, RunStatus::NeedsAttention);
    assert_eq!(row.error_key.as_deref(), Some("provider_error"));
    let events = bed.events(execution).await;
    assert!(of_type(&events, EventType::ModelChange).is_empty());
    assert_eq!(bed.fake.count("filtered"), 1, "a content block is not retried");
    assert_eq!(bed.fake.count("spare"), 0, "a content block never reaches the fallback");
    assert_eq!(words(&drain(&mut feed, execution)), ["text_delta", "stream_reset:failed"]);
}

#[tokio::test]
async fn request_errors_and_an_unavailable_model_never_fall_back() {
    let bed = Bed::start().await;
    bed.fake.script("bad_request", [Act::Status(400)]);
    bed.fake.script("gone", [Act::Status(404)]);
    bed.fake.script("spare", [Act::Text("never asked".into())]);
    for (model, key) in [("oa/bad_request", "provider_http_error"), ("an/gone", "provider_model_unavailable")] {
        let execution = bed
            .run(model, json!({"approval_mode": "bypass", "default_model": model, "fallback_models": ["oa/spare"]}))
            .await;
        let row = bed.settled(execution).await;
        assert_eq!((row.status, row.error_key.as_deref()), (RunStatus::NeedsAttention, Some(key)), "{model}");
        assert!(of_type(&bed.events(execution).await, EventType::ModelChange).is_empty(), "{model}");
    }
    assert_eq!((bed.fake.count("bad_request"), bed.fake.count("gone")), (1, 1), "request errors are not retried");
    assert_eq!(bed.fake.count("spare"), 0);
}

#[tokio::test]
async fn a_429_waits_and_retries_without_falling_back() {
    let bed = Bed::start().await;
    bed.fake.script("busy", [Act::RateLimit { retry_after_secs: 1 }, Act::Text("after the wait".into())]);
    bed.fake.script("never", [Act::Text("never asked".into())]);
    let execution = bed
        .run(
            "hello",
            json!({"approval_mode": "bypass", "default_model": "oa_whole/busy", "fallback_models": ["oa/never"]}),
        )
        .await;
    let row = bed.settled(execution).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert_eq!(row.final_text.as_deref(), Some("after the wait"));
    assert_eq!(bed.fake.count("busy"), 2);
    assert_eq!(bed.fake.count("never"), 0);
    let events = bed.events(execution).await;
    assert!(of_type(&events, EventType::ModelChange).is_empty());
    assert!(bed.fake.requests_for("busy").iter().all(|r| !r.stream), "oa_whole asks for whole answers");
    let usage = of_type(&events, EventType::Usage);
    assert_eq!(usage.len(), 1);
    assert_eq!((usage[0]["input_tokens"].as_u64(), usage[0]["output_tokens"].as_u64()), (Some(11), Some(7)));
}

#[tokio::test]
async fn overloaded_on_every_attempt_falls_back_with_provider_overloaded() {
    let bed = Bed::start().await;
    bed.fake.script("swamped", [Act::Overload, Act::OverloadMidStream, Act::Overload]);
    bed.fake.script("relief", [Act::Text("relieved".into())]);
    let mut feed = bed.deltas();
    let execution = bed
        .run(
            "hello",
            json!({"approval_mode": "bypass", "default_model": "an/swamped", "fallback_models": ["oa/relief"]}),
        )
        .await;
    let row = bed.settled(execution).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert_eq!(row.final_text.as_deref(), Some("relieved"));
    assert_eq!(bed.fake.count("swamped"), 3, "every attempt of the budget was spent first");
    let events = bed.events(execution).await;
    assert_eq!(
        of_type(&events, EventType::ModelChange),
        vec![json!({"round": 1, "from": "an/swamped", "to": "oa/relief", "reason": "provider_overloaded",
                    "category": "overloaded", "error_key": "provider_overloaded"})]
    );
    let deltas = drain(&mut feed, execution);
    // The overload that broke off a stream reset what it had streamed before the next attempt.
    assert_eq!(words(&deltas)[..2], ["text_delta".to_owned(), "stream_reset:retry".to_owned()]);
    assert_eq!(streamed_text(&deltas, 1, "oa/relief"), "relieved");
}

#[tokio::test]
async fn unavailable_candidates_are_skipped_without_provider_io() {
    let bed = Bed::start().await;
    bed.fake.script("picky", [Act::Refuse]);
    bed.fake.script("locked", [Act::Text("never asked".into())]);
    bed.fake.script("disabled", [Act::Text("never asked".into())]);
    bed.fake.script("open", [Act::Text("from the first available fallback".into())]);
    let execution = bed
        .run(
            "hello",
            json!({"approval_mode": "bypass", "default_model": "oa/picky",
                   "fallback_models": ["keyless/locked", "off/disabled", "nowhere/at-all", "oa/open"]}),
        )
        .await;
    let row = bed.settled(execution).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert_eq!(row.final_text.as_deref(), Some("from the first available fallback"));
    let events = bed.events(execution).await;
    let changes = of_type(&events, EventType::ModelChange);
    assert_eq!(changes.len(), 1, "a skipped candidate is no switch: {changes:?}");
    assert_eq!((changes[0]["from"].as_str(), changes[0]["to"].as_str()), (Some("oa/picky"), Some("oa/open")));
    assert_eq!((bed.fake.count("locked"), bed.fake.count("disabled"), bed.fake.count("at-all")), (0, 0, 0));
    let asked: Vec<String> = bed.fake.requests().iter().map(|r| r.model.clone()).collect();
    assert_eq!(asked, ["picky", "open"], "no provider I/O and no failed attempt for a skipped candidate");
}

#[tokio::test]
async fn a_cut_stream_is_retried_after_a_stream_reset() {
    let bed = Bed::start().await;
    let mut feed = bed.deltas();
    for (reference, model) in [("oa/flaky", "flaky"), ("an/shaky", "shaky")] {
        bed.fake.script(model, [Act::CutStream, Act::Text("whole at last".into())]);
        let execution = bed
            .run("hello", json!({"approval_mode": "bypass", "default_model": reference, "fallback_models": []}))
            .await;
        let row = bed.settled(execution).await;
        assert_eq!(row.status, RunStatus::Completed, "{reference}: {row:?}");
        assert_eq!(row.final_text.as_deref(), Some("whole at last"), "{reference}");
        assert_eq!(bed.fake.count(model), 2, "{reference}: the cut attempt was repeated");
        assert!(of_type(&bed.events(execution).await, EventType::ModelChange).is_empty(), "{reference}");
        let deltas = drain(&mut feed, execution);
        assert_eq!(words(&deltas), ["text_delta", "stream_reset:retry", "text_delta", "text_delta"], "{reference}");
        // After the reset, the deltas spell the answer exactly once.
        let after_reset: String = deltas[2..]
            .iter()
            .filter_map(|e| match &e.delta {
                TranscriptDelta::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(after_reset, "whole at last", "{reference}");
    }
}

#[tokio::test]
async fn an_anthropic_tool_round_trip_with_a_real_runner() {
    let bed = Bed::start().await;
    let runner = bed.server.runner("worker").await;
    let workdir = tempfile::tempdir().expect("workdir");
    let state = tempfile::tempdir().expect("state");
    let _child = bed.server.spawn_runner_agent(&runner, workdir.path(), state.path(), None);
    wait_until("the runner's announcement", SETTLE, || async {
        bed.server.store().executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
    })
    .await;
    bed.fake.script(
        "claude-test",
        [
            Act::ToolCalls(vec![call("toolu_01", "bash", json!({"command": "echo from-the-runner"}))]),
            Act::EchoLastToolResult,
        ],
    );
    let mut feed = bed.deltas();
    let execution = bed
        .run(
            "what does the runner say?",
            json!({"approval_mode": "bypass", "default_model": "an/claude-test",
                   "runner_executor_public_ids": [runner.id],
                   "system_prompt": {"content": "Use the tools."}}),
        )
        .await;
    let row = bed.settled(execution).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let final_text = row.final_text.clone().unwrap_or_default();
    assert!(final_text.starts_with("tool said: ") && final_text.contains("from-the-runner"), "{final_text}");
    let task = bed.server.store().task(execution, key("r1t0")).await.expect("store").expect("the call's task");
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.target_executor_public_id, Some(runner.runner()), "the call ran on the runner");

    let requests = bed.fake.requests_for("claude-test");
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_eq!(request.wire, Wire::Anthropic);
        assert!(request.stream);
        assert_eq!(request.headers.get("x-api-key").map(String::as_str), Some(ANTHROPIC_KEY));
        assert_eq!(request.headers.get("anthropic-version").map(String::as_str), Some("2023-06-01"));
        assert_eq!(request.body["system"], json!([{"type": "text", "text": "Use the tools."}]));
        let tools = request.body["tools"].as_array().cloned().unwrap_or_default();
        let bash = tools.iter().find(|t| t["name"] == "bash").expect("bash is offered");
        assert_eq!(bash["input_schema"]["type"], json!("object"), "{bash}");
        assert!(bash.get("function").is_none() && bash.get("type").is_none(), "the Anthropic tool shape: {bash}");
    }
    // The second request carries the model's tool_use and the runner's result under its id.
    let messages = requests[1].body["messages"].as_array().cloned().unwrap_or_default();
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
    let tool_use = messages[1]["content"].as_array().and_then(|blocks| blocks.iter().find(|b| b["type"] == "tool_use"));
    assert_eq!(
        tool_use,
        Some(
            &json!({"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "echo from-the-runner"}})
        )
    );
    let result = &messages[2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], "toolu_01");
    assert!(result["content"].as_str().is_some_and(|c| c.contains("from-the-runner")), "{result}");

    let deltas = drain(&mut feed, execution);
    let round_one: Vec<String> = words(&deltas.iter().filter(|e| e.round == 1).cloned().collect::<Vec<_>>());
    assert_eq!(
        round_one,
        ["text_delta", "tool_call_started:bash", "tool_call_arguments_delta", "tool_call_arguments_delta"]
    );
    let arguments: String = deltas
        .iter()
        .filter_map(|e| match &e.delta {
            TranscriptDelta::ToolCallArguments { index: 0, delta } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).expect("assembled JSON"),
        json!({"command": "echo from-the-runner"})
    );
    assert_eq!(streamed_text(&deltas, 2, "an/claude-test"), final_text);
}

#[tokio::test]
async fn a_switch_survives_a_nexus_restart_and_the_spent_route_is_never_asked_again() {
    let bed = Bed::start().await;
    bed.fake.script("wary", [Act::Refuse]);
    bed.fake
        .script("steady", [Act::ToolCalls(vec![call("call_rl", "runners_list", json!({}))]), Act::EchoLastToolResult]);
    // `ask` parks the fallback's tool call: the execution waits there across the restart.
    let execution = bed
        .run(
            "list the runners",
            json!({"approval_mode": "ask", "default_model": "oa/wary", "fallback_models": ["oa/steady"],
                   "kernel_tools": ["nexus.runners.list"]}),
        )
        .await;
    wait_until("the parked call", SETTLE, || async {
        bed.server
            .store()
            .task(execution, key("r1t0"))
            .await
            .ok()
            .flatten()
            .filter(|t| t.status == TaskStatus::NeedsApproval)
    })
    .await;

    let Bed { fake, server, agent } = bed;
    let server = server.restart_with_env(&[], test_env).await;

    let caller = server.caller(&agent).await;
    server.server.api.approve_task(&caller, execution, "r1t0").await.expect("approved");
    let row = wait_until("the execution to settle", SETTLE, || async {
        server.store().execution(execution).await.ok().flatten().filter(|row| row.status.is_quiescent())
    })
    .await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert!(row.final_text.as_deref().is_some_and(|t| t.starts_with("tool said: ")), "{row:?}");
    assert_eq!(fake.count("wary"), 1, "the refused route is never asked again, not even after a restart");
    assert_eq!(fake.count("steady"), 2);
    let events = server.store().events_after(execution, 0, i64::MAX).await.expect("events");
    assert_eq!(rounds(&events), vec![(1, "oa/wary".into()), (1, "oa/steady".into()), (2, "oa/steady".into())]);
    assert_eq!(of_type(&events, EventType::ModelChange).len(), 1);
}
