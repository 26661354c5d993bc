//! Execution budgets end to end (`docs/executions.md`, "Budgets"; R75): real executions against
//! the fake OpenAI-compatible provider. A model call's worst case (the request's estimate plus
//! the provider's `max_tokens`, priced) is reserved before anything is sent; a reservation that
//! does not fit ends the execution `canceled` with `budget_exhausted` and the fake is never
//! asked. A tool call past `max_tool_calls` settles `failed` `budget_exhausted`. The ledger is
//! on the execution row, survives a restart, and GET execution and the feed show it.

use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::model::{ModelConfig, ProviderConfig, ProviderKind};
use nexus_actors::store::{EventRow, EventType};
use nexus_proto::agent::v1::{CreateInputRequest, GetExecutionRequest};
use nexus_proto::{ErrorCode, ExecutionId, Refusal, RunStatus, TaskStatus};
use nexus_tests::{Act, FakeProvider, Http, Minted, TestServer, agent_client, authed, wait_until};

const SETTLE: Duration = Duration::from_secs(30);
/// The output cap every provider of the bed sends, in tokens: each call reserves it.
const MAX_TOKENS: u32 = 100;

/// A server whose providers point at one fake:
/// - `oa`: openai_compatible, `max_tokens` 100, unpriced;
/// - `paid`: the same, priced at 1000 USD per million input and output tokens (0.001 USD a
///   token), except model `paid/cheap`, whose entry prices output at 0.
struct Bed {
    fake: FakeProvider,
    server: TestServer,
    agent: Minted,
}

fn providers(url: &str) -> Vec<(String, ProviderConfig)> {
    let openai = ProviderConfig {
        base_url: Some(url.to_owned()),
        allow_any_model: true,
        max_tokens: Some(MAX_TOKENS),
        ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
    };
    let paid = ProviderConfig {
        input_price_per_mtok: Some(1_000.0),
        output_price_per_mtok: Some(1_000.0),
        models: [("cheap".to_owned(), ModelConfig { output_price_per_mtok: Some(0.0), ..ModelConfig::default() })]
            .into(),
        ..openai.clone()
    };
    vec![("oa".into(), openai), ("paid".into(), paid)]
}

impl Bed {
    async fn start() -> Bed {
        let fake = FakeProvider::start().await;
        let url = fake.openai_base_url();
        let server = TestServer::start_with(&[], move |config| {
            config.execution.model_attempts = 1;
            // A call of `ask` outlasts the deadline test's clock moves.
            config.execution.ask_hold_ms = 3_600_000;
            for (name, provider) in providers(&url) {
                config.providers.providers.insert(name, provider);
            }
        })
        .await;
        let agent = server.agent("agent").await;
        Bed { fake, server, agent }
    }

    fn http(&self) -> Http {
        Http::new(&self.server.url(), Some(&self.agent.token))
    }

    /// Posts an input over HTTP with `body` merged in; answers its execution.
    async fn post(&self, body: Value) -> ExecutionId {
        let admitted = self.http().post("/agent_api/v1/inputs", &body).await;
        assert_eq!(admitted.status, 201, "admitted: {:?}", admitted.body);
        admitted.body["execution_public_id"].as_str().expect("id").parse().expect("uuid")
    }

    async fn settled(&self, run: ExecutionId) -> nexus_actors::store::ExecutionRow {
        self.server.settled(run, SETTLE).await
    }

    async fn events(&self, run: ExecutionId) -> Vec<EventRow> {
        self.server.store().events_after(run, 0, i64::MAX).await.expect("events")
    }

    /// GET execution's `budget`.
    async fn budget(&self, run: ExecutionId) -> Value {
        let got = self.http().get(&format!("/agent_api/v1/executions/{run}")).await;
        assert_eq!(got.status, 200, "{:?}", got.body);
        got.body["budget"].clone()
    }
}

/// An inline declaration on `model` offering `runners_list` and `ask` (in-process kernel tools).
fn declaration(model: &str) -> Value {
    json!({"default_model": model, "approval_mode": "bypass", "kernel_tools": ["nexus.runners.list", "nexus.human.ask"]})
}

fn of_type(events: &[EventRow], event_type: EventType) -> Vec<Value> {
    events.iter().filter(|e| e.event.event_type() == event_type).map(|e| e.event.data()).collect()
}

/// The `turn_status failed` of a budget refusal, and the `budget` event that refused.
fn assert_refused(events: &[EventRow]) {
    let failed: Vec<Value> =
        of_type(events, EventType::TurnStatus).into_iter().filter(|d| d["status"] == "failed").collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["error_key"], "budget_exhausted");
    assert!(failed[0]["message"].as_str().is_some_and(|m| !m.is_empty()));
    let budgets = of_type(events, EventType::Budget);
    assert_eq!(budgets.last().map(|b| b["for"].clone()), Some(json!("refused")), "{budgets:?}");
}

/// A `max_model_tokens` budget admits round 1 (its estimate plus the 100-token cap fits), the
/// answer's real usage (5000 in, 7 out) replaces the reservation, and round 2 no longer fits:
/// the fake is asked once, the execution ends `canceled` with `budget_exhausted`, and GET shows
/// the ledger.
#[tokio::test]
async fn max_model_tokens_refuses_the_second_round_before_the_provider_is_asked() {
    let bed = Bed::start().await;
    // An undeclared tool settles at once (`unknown_tool`), so round 2 follows.
    bed.fake.script(
        "m1",
        [Act::WithUsage {
            input_tokens: 5_000,
            act: Box::new(Act::ToolCalls(vec![("c1".into(), "nope".into(), json!({}))])),
        }],
    );
    let run = bed
        .post(json!({"text": "go", "execution_declaration": {"default_model": "oa/m1"}, "budget": {"max_model_tokens": 2000}}))
        .await;
    let row = bed.settled(run).await;
    assert_eq!(row.status, RunStatus::Canceled);
    assert_eq!(row.error_key.as_deref(), Some("budget_exhausted"));
    assert_eq!(bed.fake.count("m1"), 1, "round 2 was never sent");
    let events = bed.events(run).await;
    assert_refused(&events);
    assert_eq!(of_type(&events, EventType::RoundStarted).len(), 1, "no second round started");
    let budget = bed.budget(run).await;
    assert_eq!(budget["limits"]["max_model_tokens"], 2000);
    assert_eq!(budget["used"]["model_tokens"], 5_007, "{budget}");
    assert_eq!(budget["reserved"]["model_tokens"], 0, "{budget}");
    assert_eq!(budget["remaining"]["model_tokens"], 0, "{budget}");
    // The first reservation was the request's estimate plus the cap.
    let first = &of_type(&events, EventType::Budget)[0];
    assert_eq!(first["for"], "model_call");
    let reserved = first["reserved"]["model_tokens"].as_u64().expect("tokens");
    assert!(reserved > u64::from(MAX_TOKENS) && reserved < 2000, "{first}");
}

/// `max_tool_calls: 1`: of a round's two calls the first runs and the second settles `failed`
/// `budget_exhausted` with a message the model reads; the execution goes on and completes.
#[tokio::test]
async fn max_tool_calls_refuses_the_second_call_of_a_round() {
    let bed = Bed::start().await;
    let calls = vec![("c1".into(), "runners_list".into(), json!({})), ("c2".into(), "runners_list".into(), json!({}))];
    bed.fake.script("m2", [Act::ToolCalls(calls), Act::EchoLastToolResult]);
    let run = bed
        .post(json!({"text": "go", "execution_declaration": declaration("oa/m2"), "budget": {"max_tool_calls": 1}}))
        .await;
    let row = bed.settled(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{:?}", row.error_key);
    let first = bed.server.task(run, "r1t0").await.expect("r1t0");
    assert_eq!(first.status, TaskStatus::Completed);
    let second = bed.server.task(run, "r1t1").await.expect("r1t1");
    assert_eq!(second.status, TaskStatus::Failed);
    assert_eq!(second.error_key.as_deref(), Some("budget_exhausted"));
    let read = bed.fake.requests_for("m2")[1].tool_results();
    assert!(read.last().is_some_and(|r| r.starts_with("budget_exhausted")), "{read:?}");
    let budget = bed.budget(run).await;
    assert_eq!(budget["used"]["tool_calls"], 1);
    assert_eq!(budget["remaining"]["tool_calls"], 0);
    let purposes: Vec<Value> =
        of_type(&bed.events(run).await, EventType::Budget).iter().map(|b| b["for"].clone()).collect();
    assert!(purposes.contains(&json!("tool_call")) && purposes.contains(&json!("refused")), "{purposes:?}");
}

/// `max_cost_usd` with prices: round 1 reserves its priced worst case and is charged its real
/// usage (407 tokens at 0.001 USD), round 2's worst case no longer fits 0.5 USD. An unpriced
/// model under a cost limit is refused before its first call.
#[tokio::test]
async fn max_cost_usd_prices_calls_and_refuses_unpriced_models() {
    let bed = Bed::start().await;
    bed.fake.script(
        "m3",
        [Act::WithUsage {
            input_tokens: 400,
            act: Box::new(Act::ToolCalls(vec![("c1".into(), "nope".into(), json!({}))])),
        }],
    );
    let run = bed
        .post(json!({"text": "go", "execution_declaration": {"default_model": "paid/m3"}, "budget": {"max_cost_usd": 0.5}}))
        .await;
    let row = bed.settled(run).await;
    assert_eq!(row.error_key.as_deref(), Some("budget_exhausted"));
    assert_eq!(bed.fake.count("m3"), 1);
    let budget = bed.budget(run).await;
    let used = budget["used"]["cost_usd"].as_f64().expect("cost");
    assert!((used - 0.407).abs() < 1e-9, "{budget}");
    assert_refused(&bed.events(run).await);

    // A model entry's price overrides its provider's: output at 0 USD.
    bed.fake.script("cheap", [Act::Text("fine".into())]);
    let run = bed
        .post(
            json!({"text": "go", "execution_declaration": declaration("paid/cheap"), "budget": {"max_cost_usd": 0.5}}),
        )
        .await;
    assert_eq!(bed.settled(run).await.status, RunStatus::Completed);
    let used = bed.budget(run).await["used"]["cost_usd"].as_f64().expect("cost");
    assert!((used - 0.011).abs() < 1e-9, "11 input tokens at 0.001 USD, 7 output at 0: {used}");

    bed.fake.script("m4", [Act::Text("never".into())]);
    let run = bed
        .post(json!({"text": "go", "execution_declaration": declaration("oa/m4"), "budget": {"max_cost_usd": 1}}))
        .await;
    let row = bed.settled(run).await;
    assert_eq!(row.status, RunStatus::Canceled);
    assert_eq!(row.error_key.as_deref(), Some("budget_exhausted"));
    assert_eq!(bed.fake.count("m4"), 0, "an unpriced model is never asked under a cost limit");
}

/// The grammar: unknown keys, non-positive numbers and fractions of counts are refused 422
/// `validation_failed` naming the field, on the input and inside an inline declaration; the
/// standing profile takes no budget; a refusal admits nothing. The input's budget and its
/// declaration's combine to the smaller of each limit, and an execution without one shows null.
#[tokio::test]
async fn budgets_are_validated_and_combined() {
    let bed = Bed::start().await;
    let http = bed.http();
    let inline = |budget: Value| {
        let mut declaration = declaration("oa/m5");
        declaration["budget"] = budget;
        declaration
    };
    let refused = [
        (
            "unknown_key",
            json!({"text": "x", "execution_declaration": declaration("oa/m5"), "budget": {"tokens": 5}}),
            "budget.tokens",
        ),
        (
            "negative",
            json!({"text": "x", "execution_declaration": declaration("oa/m5"), "budget": {"max_tool_calls": -1}}),
            "budget.max_tool_calls",
        ),
        (
            "fraction",
            json!({"text": "x", "execution_declaration": declaration("oa/m5"), "budget": {"max_model_tokens": 2.5}}),
            "budget.max_model_tokens",
        ),
        ("not_an_object", json!({"text": "x", "execution_declaration": declaration("oa/m5"), "budget": 7}), "budget"),
        (
            "inline_negative_cost",
            json!({"text": "x", "execution_declaration": inline(json!({"max_cost_usd": -1}))}),
            "execution_declaration.budget.max_cost_usd",
        ),
        (
            "inline_unknown",
            json!({"text": "x", "execution_declaration": inline(json!({"deadline": 5}))}),
            "execution_declaration.budget.deadline",
        ),
    ];
    for (name, body, field) in refused {
        let answer = http.post("/agent_api/v1/inputs", &body).await;
        assert_eq!(answer.status, 422, "{name}: {:?}", answer.body);
        assert_eq!(answer.code(), Some("validation_failed"), "{name}");
        assert!(answer.message().starts_with(field), "{name}: {}", answer.message());
    }
    let conversations = http.get("/agent_api/v1/conversations").await;
    assert_eq!(
        conversations.body["conversations"].as_array().map(Vec::len),
        Some(0),
        "nothing was admitted: {:?}",
        conversations.body
    );
    let put =
        http.declare(&json!({"configuration": {"default_model": "oa/m5", "budget": {"max_tool_calls": 1}}})).await;
    assert_eq!(put.status, 422, "{:?}", put.body);
    assert!(put.message().starts_with("configuration.budget"), "{}", put.message());

    bed.fake.script("m5", [Act::Text("a".into()), Act::Text("b".into())]);
    let both = bed
        .post(
            json!({"text": "x", "execution_declaration": inline(json!({"max_model_tokens": 900, "max_tool_calls": 3})),
            "budget": {"max_model_tokens": 5000, "max_children": 2}}),
        )
        .await;
    assert_eq!(bed.settled(both).await.status, RunStatus::Completed);
    let limits = bed.budget(both).await["limits"].clone();
    assert_eq!(
        limits,
        json!({"deadline_ms": null, "max_model_tokens": 900, "max_cost_usd": null, "max_tool_calls": 3, "max_children": 2})
    );
    let none = bed.post(json!({"text": "x", "execution_declaration": declaration("oa/m5")})).await;
    assert_eq!(bed.settled(none).await.status, RunStatus::Completed);
    assert_eq!(bed.budget(none).await, Value::Null);
}

/// The ledger is durable: round 1 parks on `ask`, the server restarts, the answer arrives, and
/// round 2 is judged against round 1's usage from before the restart (and refused).
#[tokio::test]
async fn a_restart_keeps_the_usage() {
    let bed = Bed::start().await;
    bed.fake.script(
        "m6",
        [Act::WithUsage {
            input_tokens: 3_000,
            act: Box::new(Act::ToolCalls(vec![("c1".into(), "ask".into(), json!({"prompt": "colour?"}))])),
        }],
    );
    let run = bed
        .post(
            json!({"text": "go", "execution_declaration": declaration("oa/m6"), "budget": {"max_model_tokens": 3100}}),
        )
        .await;
    bed.server.task_in(run, "r1t0", TaskStatus::AwaitingInput).await;
    let before = bed.budget(run).await;
    assert_eq!(before["used"]["model_tokens"], 3_007, "{before}");
    let Bed { fake, server, agent } = bed;
    let server = server.restart(&[]).await;
    let bed = Bed { fake, server, agent };
    assert_eq!(bed.budget(run).await["used"], before["used"], "the usage survived the restart");
    let answered =
        bed.http().post(&format!("/agent_api/v1/executions/{run}/tasks/r1t0/answer"), &json!({"answer": "blue"})).await;
    assert_eq!(answered.status, 200, "{:?}", answered.body);
    let row = bed.settled(run).await;
    assert_eq!(row.error_key.as_deref(), Some("budget_exhausted"), "3007 used + the next worst case > 3100");
    assert_eq!(bed.fake.count("m6"), 1);
}

/// `deadline_ms` runs from materialization on the fabric clock: past it, the next model call is
/// refused before it is sent.
#[tokio::test]
async fn the_deadline_refuses_calls_after_it() {
    let bed = Bed::start().await;
    bed.fake.script("m7", [Act::ToolCalls(vec![("c1".into(), "ask".into(), json!({"prompt": "colour?"}))])]);
    let run = bed
        .post(json!({"text": "go", "execution_declaration": declaration("oa/m7"), "budget": {"deadline_ms": 60000}}))
        .await;
    bed.server.task_in(run, "r1t0", TaskStatus::AwaitingInput).await;
    let deadline_at = bed.budget(run).await["deadline_at"].as_i64().expect("deadline_at");
    bed.server.clock().advance(Duration::from_secs(61));
    wait_until("the clock to pass the deadline", SETTLE, || async {
        (bed.server.clock().now_ms() >= deadline_at).then_some(())
    })
    .await;
    let answered =
        bed.http().post(&format!("/agent_api/v1/executions/{run}/tasks/r1t0/answer"), &json!({"answer": "blue"})).await;
    assert_eq!(answered.status, 200, "{:?}", answered.body);
    let row = bed.settled(run).await;
    assert_eq!(row.error_key.as_deref(), Some("budget_exhausted"));
    assert_eq!(bed.fake.count("m7"), 1);
}

/// The gRPC twins: `CreateInput.budget_json` is validated as the HTTP field is, and
/// `GetExecution`'s `execution_json` carries the ledger.
#[tokio::test]
async fn the_grpc_doors_take_and_show_the_budget() {
    let bed = Bed::start().await;
    let mut client = agent_client(&bed.server).await;
    let declaration = json!({"default_model": "oa/g1"}).to_string();
    let request = |budget: &str| CreateInputRequest {
        text: "go".into(),
        execution_declaration_json: declaration.clone(),
        budget_json: budget.into(),
        ..CreateInputRequest::default()
    };
    let status = client.create_input(authed(request(r#"{"max_children": 0}"#), &bed.agent)).await.expect_err("zero");
    let refusal = Refusal::from_status(&status);
    assert_eq!(refusal.code, ErrorCode::ValidationFailed);
    assert!(refusal.message.contains("budget.max_children"), "{}", refusal.message);

    bed.fake.script("g1", [Act::Text("done".into())]);
    let admitted = client
        .create_input(authed(request(r#"{"max_model_tokens": 100000}"#), &bed.agent))
        .await
        .expect("admitted")
        .into_inner();
    let run: ExecutionId = admitted.execution_public_id.parse().expect("uuid");
    assert_eq!(bed.settled(run).await.status, RunStatus::Completed);
    let reply = client
        .get_execution(authed(
            GetExecutionRequest { execution_public_id: run.to_string(), tasks_after: String::new() },
            &bed.agent,
        ))
        .await
        .expect("read")
        .into_inner();
    let detail: Value = serde_json::from_str(&reply.execution_json).expect("json");
    assert_eq!(detail["budget"]["limits"]["max_model_tokens"], 100_000);
    assert_eq!(detail["budget"]["used"]["model_tokens"], 18, "11 in and 7 out, as the fake reports");
    assert_eq!(detail["budget"]["reserved"]["model_tokens"], 0);
    assert_eq!(detail["budget"]["remaining"]["model_tokens"], 100_000 - 18);
}
