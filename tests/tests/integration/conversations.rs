//! Conversations end to end against the fake OpenAI-compatible and Anthropic servers, checked
//! from the requests the fakes record (`docs/prompt.md`): a later turn carries the earlier turns
//! as the model saw them (the user text, the answer, a tool call with its result) and its own
//! input last; `raw` carries none; an `assembly` template's order, `max_entries` and budget hold;
//! macros arrive rendered and document roles as declared; a regeneration carries the same
//! history; every round's `round_started` records its context manifest; and a restart between
//! two turns loses nothing.

use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::doors::api::CreateInput;
use nexus_actors::model::{ProviderConfig, ProviderKind};
use nexus_actors::store::{EventRow, EventType};
use nexus_proto::{ConversationId, ExecutionId, RunStatus};
use nexus_tests::{Act, FakeProvider, FakeRequest, Minted, TestServer, Wire};

const SETTLE: Duration = Duration::from_secs(30);
const ANTHROPIC_KEY_VAR: &str = "NEXUS_TEST_FAKE_ANTHROPIC_KEY";

fn test_env(name: &str) -> Option<String> {
    (name == ANTHROPIC_KEY_VAR).then(|| "sk-ant-fake-key".to_owned())
}

/// A server whose `oa` (OpenAI-compatible) and `an` (Anthropic) providers point at one fake.
struct Bed {
    fake: FakeProvider,
    server: TestServer,
    agent: Minted,
}

impl Bed {
    async fn start() -> Bed {
        let fake = FakeProvider::start().await;
        let server = TestServer::start_with_env(&[], test_env, providers(&fake)).await;
        let agent = server.agent("ada").await;
        Bed { fake, server, agent }
    }

    /// Posts `text` with `declaration`, continuing `conversation` when given, and waits for its
    /// execution to settle `completed`.
    async fn turn(
        &self,
        conversation: Option<ConversationId>,
        text: &str,
        declaration: &Value,
    ) -> (ConversationId, ExecutionId) {
        let caller = self.server.caller(&self.agent).await;
        let input = CreateInput {
            conversation_public_id: conversation,
            text: text.to_owned(),
            execution_declaration: Some(declaration.clone()),
            ..CreateInput::default()
        };
        let admitted = self.server.server.api.create_input(&caller, input).await.expect("admitted");
        let row = self.server.settled(admitted.execution_public_id, SETTLE).await;
        assert_eq!(row.status, RunStatus::Completed, "{text}: {row:?}");
        (admitted.conversation_public_id, admitted.execution_public_id)
    }

    async fn events(&self, execution: ExecutionId, event_type: EventType) -> Vec<Value> {
        let all: Vec<EventRow> = self.server.store().events_after(execution, 0, i64::MAX).await.expect("events");
        all.into_iter().filter(|e| e.event.event_type() == event_type).map(|e| e.event.data()).collect()
    }
}

fn providers(fake: &FakeProvider) -> impl FnOnce(&mut nexus_actors::config::ServerConfig) + use<> {
    let (openai_url, anthropic_url) = (fake.openai_base_url(), fake.anthropic_base_url());
    move |config| {
        config.execution.workspace_name = "lab".into();
        let providers = &mut config.providers.providers;
        providers.insert(
            "oa".into(),
            ProviderConfig {
                base_url: Some(openai_url),
                allow_any_model: true,
                ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
            },
        );
        providers.insert(
            "an".into(),
            ProviderConfig {
                base_url: Some(anthropic_url),
                api_key_env: Some(ANTHROPIC_KEY_VAR.into()),
                allow_any_model: true,
                ..ProviderConfig::new(ProviderKind::Anthropic)
            },
        );
    }
}

fn call(id: &str, name: &str, arguments: Value) -> (String, String, Value) {
    (id.to_owned(), name.to_owned(), arguments)
}

/// A request's messages as `role: text` lines, whatever the wire: OpenAI messages (text parts
/// joined by ` | `, tool calls as `call:<id>:<name>`, results as `result:<id>`), or Anthropic's
/// `system` blocks (as `system:` lines) and the blocks of each message (one line per block).
fn lines(request: &FakeRequest) -> Vec<String> {
    let messages = request.body["messages"].as_array().cloned().unwrap_or_default();
    let text = |value: &Value| match value {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join(" | "),
        _ => String::new(),
    };
    let mut out = Vec::new();
    match request.wire {
        Wire::OpenAi => {
            for message in &messages {
                let role = message["role"].as_str().unwrap_or_default();
                match role {
                    "tool" => out.push(format!("result:{}", message["tool_call_id"].as_str().unwrap_or_default())),
                    _ => {
                        let content = text(&message["content"]);
                        if !content.is_empty() {
                            out.push(format!("{role}: {content}"));
                        }
                        for call in message["tool_calls"].as_array().into_iter().flatten() {
                            out.push(format!(
                                "call:{}:{}",
                                call["id"].as_str().unwrap_or_default(),
                                call["function"]["name"].as_str().unwrap_or_default()
                            ));
                        }
                    }
                }
            }
        }
        Wire::Anthropic => {
            for block in request.body["system"].as_array().into_iter().flatten() {
                out.push(format!("system: {}", block["text"].as_str().unwrap_or_default()));
            }
            for message in &messages {
                let role = message["role"].as_str().unwrap_or_default();
                for block in message["content"].as_array().into_iter().flatten() {
                    match block["type"].as_str() {
                        Some("text") => out.push(format!("{role}: {}", block["text"].as_str().unwrap_or_default())),
                        Some("tool_use") => out.push(format!(
                            "call:{}:{}",
                            block["id"].as_str().unwrap_or_default(),
                            block["name"].as_str().unwrap_or_default()
                        )),
                        Some("tool_result") => {
                            out.push(format!("result:{}", block["tool_use_id"].as_str().unwrap_or_default()));
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    out
}

/// Turn 2 carries turn 1 (the user text, the tool call and its result, the answer) in order,
/// then its own input last; the developer document arrives rendered, in its role; the manifest
/// names what was included.
async fn turn_two_carries_turn_one(provider: &str, wire: Wire) {
    let bed = Bed::start().await;
    let model = format!("{provider}-model");
    bed.fake.script(
        &model,
        [
            Act::ToolCalls(vec![call("call_1", "runners_list", json!({}))]),
            Act::Text("turn one answer".into()),
            Act::Text("turn two answer".into()),
        ],
    );
    let declaration = json!({
        "approval_mode": "bypass",
        "default_model": format!("{provider}/{model}"),
        "kernel_tools": ["nexus.runners.list"],
        "system_prompt": {
            "content": "You are {{agent}} for {{user}} in {{workspace}} on {{date}} ({{conversation_kind}}).",
            "role": "developer"
        }
    });
    let (conversation, first) = bed.turn(None, "first question", &declaration).await;
    let (_, second) = bed.turn(Some(conversation), "second question", &declaration).await;

    let requests = bed.fake.requests_for(&model);
    assert_eq!(requests.len(), 3, "two rounds of turn 1, one of turn 2");
    assert!(requests.iter().all(|r| r.wire == wire));
    let materialized = bed.events(second, EventType::InputMaterialized).await;
    let date = materialized[0]["macros"]["date"].as_str().expect("the date is recorded").to_owned();
    assert!(date.len() == 10 && date.as_bytes()[4] == b'-' && date.as_bytes()[7] == b'-', "ISO 8601 date: {date}");
    let document = format!("You are ada for ada in lab on {date} (conversation).");
    let system_line = match wire {
        Wire::OpenAi => format!("developer: {document}"),
        Wire::Anthropic => format!("system: {document}"),
    };
    // The fake's Anthropic wire says a few words before its tool_use; its OpenAI wire says none.
    let mut expected = vec![system_line.as_str(), "user: first question"];
    if wire == Wire::Anthropic {
        expected.push("assistant: Running it.");
    }
    expected.extend([
        "call:call_1:runners_list",
        "result:call_1",
        "assistant: turn one answer",
        "user: second question",
    ]);
    assert_eq!(lines(&requests[2]), expected, "{}", requests[2].body);
    // Turn 1's own first request carried no history; the document was the same.
    assert_eq!(lines(&requests[0]), [system_line.as_str(), "user: first question"]);
    // The tool result is the one turn 1's model read.
    assert_eq!(requests[2].tool_results(), requests[1].tool_results());
    if wire == Wire::Anthropic {
        assert_eq!(requests[2].body["system"], json!([{"type": "text", "text": document}]));
    } else {
        assert_eq!(requests[2].body["messages"][0], json!({"role": "developer", "content": document}));
    }

    // The manifest on turn 2's round_started.
    let started = bed.events(second, EventType::RoundStarted).await;
    assert_eq!(started.len(), 1);
    let context = &started[0]["context"];
    assert_eq!(context["mechanism"], "default");
    assert_eq!(context["documents"], json!([{"slot": "system_prompt", "role": "developer", "version": null}]));
    let history = &context["history"];
    assert_eq!((history["included_count"].as_u64(), history["trimmed_count"].as_u64()), (Some(3), Some(0)));
    let included: Vec<(i64, String, u64)> = history["included"]
        .as_array()
        .expect("included")
        .iter()
        .map(|e| {
            (
                e["turn"].as_i64().unwrap_or_default(),
                e["execution_public_id"].as_str().unwrap_or_default().to_owned(),
                e["position"].as_u64().unwrap_or(99),
            )
        })
        .collect();
    let first_id = first.to_string();
    assert_eq!(included, [(1, first_id.clone(), 3), (1, first_id.clone(), 1), (1, first_id, 0)]);
    assert!(
        context["estimated_tokens"].as_u64().unwrap_or_default() > history["included_tokens"].as_u64().unwrap_or(0)
    );
    let empty: Vec<&str> =
        context["empty_blocks"].as_array().expect("empty blocks").iter().filter_map(|b| b["block"].as_str()).collect();
    assert_eq!(empty, ["character", "persona", "memory", "skills", "lead", "tail"]);
    // The estimate door assembles the next request the same way: the document, turn 1, and turn
    // 2 as it ended.
    let caller = bed.server.caller(&bed.agent).await;
    let estimate = bed.server.server.api.estimate(&caller, second, &json!({})).await.expect("estimate");
    assert_eq!(estimate["messages"], 7, "{estimate}");
    assert_eq!(estimate["context"]["history"]["included_count"], 3, "{estimate}");
    assert!(estimate["bytes"]["documents"].as_u64().is_some_and(|b| b > 0), "{estimate}");
    // Turn 1's rounds carried no history.
    for started in bed.events(first, EventType::RoundStarted).await {
        assert_eq!(started["context"]["history"]["included_count"], 0, "{started}");
    }
}

#[tokio::test]
async fn turn_two_carries_turn_one_on_the_openai_wire() {
    turn_two_carries_turn_one("oa", Wire::OpenAi).await;
}

#[tokio::test]
async fn turn_two_carries_turn_one_on_the_anthropic_wire() {
    turn_two_carries_turn_one("an", Wire::Anthropic).await;
}

#[tokio::test]
async fn raw_carries_no_history() {
    let bed = Bed::start().await;
    bed.fake.script("plain", [Act::Text("one".into()), Act::Text("two".into())]);
    let declaration = json!({"approval_mode": "bypass", "default_model": "oa/plain", "prompt_mechanism": "raw",
                             "system_prompt": {"content": "Be {{agent}}."}});
    let (conversation, _) = bed.turn(None, "first", &declaration).await;
    let (_, second) = bed.turn(Some(conversation), "second", &declaration).await;
    let requests = bed.fake.requests_for("plain");
    assert_eq!(lines(&requests[1]), ["system: Be ada.", "user: second"]);
    let started = bed.events(second, EventType::RoundStarted).await;
    assert_eq!(started[0]["context"]["mechanism"], "raw");
    assert!(started[0]["context"].get("history").is_none(), "{}", started[0]);
}

/// An `assembly` template's blocks arrive in its order (adjacent system blocks joined as parts
/// of one message), its variables and macros rendered; `max_entries` and a token budget trim
/// the oldest turns first.
#[tokio::test]
async fn an_assembly_template_keeps_its_order_and_its_history_budget() {
    let bed = Bed::start().await;
    bed.fake.script("tpl", (1..=5).map(|n| Act::Text(format!("answer {n}"))));
    let plain = json!({"approval_mode": "bypass", "default_model": "oa/tpl"});
    let (conversation, _) = bed.turn(None, "question 1", &plain).await;
    bed.turn(Some(conversation), "question 2", &plain).await;
    bed.turn(Some(conversation), "question 3", &plain).await;

    let template = |history: Value| {
        json!({
            "blocks": [
                {"type": "inline", "role": "system", "text": "Rules for {{user}}."},
                {"type": "slot", "slot": "system_prompt"},
                history,
                {"type": "inline", "role": "developer", "text": "Tone: {{tone}}."},
                {"type": "input"}
            ],
            "variables": {"tone": "calm"}
        })
    };
    let declared = |history: Value| {
        json!({"approval_mode": "bypass", "default_model": "oa/tpl", "prompt_mechanism": "assembly",
               "prompt_template": template(history), "system_prompt": {"content": "Be {{tone}} in {{workspace}}."}})
    };
    // Three entries at most: answer 3, question 3 and answer 2; the history starts at a user
    // message, so answer 2 goes too.
    let (_, fourth) =
        bed.turn(Some(conversation), "question 4", &declared(json!({"type": "history", "max_entries": 3}))).await;
    let requests = bed.fake.requests_for("tpl");
    assert_eq!(
        lines(&requests[3]),
        [
            "system: Rules for ada. | Be calm in lab.",
            "user: question 3",
            "assistant: answer 3",
            "developer: Tone: calm.",
            "user: question 4"
        ]
    );
    let context = &bed.events(fourth, EventType::RoundStarted).await[0]["context"];
    assert_eq!(context["mechanism"], "assembly");
    assert_eq!(
        (context["history"]["included_count"].as_u64(), context["history"]["trimmed_count"].as_u64()),
        (Some(2), Some(4))
    );
    assert_eq!(context["history"]["max_entries"], 3);
    let documents: Vec<(&str, &str)> = context["documents"]
        .as_array()
        .expect("documents")
        .iter()
        .map(|d| (d["slot"].as_str().unwrap_or_default(), d["role"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(documents, [("inline", "system"), ("system_prompt", "system"), ("inline", "developer")]);

    // A budget of 30 tokens holds one turn (about 25): the three older ones are trimmed.
    let (_, fifth) = bed
        .turn(Some(conversation), "question 5", &declared(json!({"type": "history", "budget": {"max_tokens": 30}})))
        .await;
    let requests = bed.fake.requests_for("tpl");
    assert_eq!(
        lines(&requests[4]),
        [
            "system: Rules for ada. | Be calm in lab.",
            "user: question 4",
            "assistant: answer 4",
            "developer: Tone: calm.",
            "user: question 5"
        ]
    );
    let history = &bed.events(fifth, EventType::RoundStarted).await[0]["context"]["history"];
    assert_eq!((history["included_count"].as_u64(), history["trimmed_count"].as_u64()), (Some(2), Some(6)));
    assert_eq!(history["budget_tokens"], 30);
    assert!(history["included_tokens"].as_u64().is_some_and(|t| t > 0 && t <= 30), "{history}");
    let trimmed_turns: Vec<i64> =
        history["trimmed"].as_array().expect("trimmed").iter().filter_map(|e| e["turn"].as_i64()).collect();
    assert_eq!(trimmed_turns, [3, 3, 2, 2, 1, 1], "newest first");
}

/// A regeneration of turn 2 answers the same turn with the same history, and turn 3 then reads
/// the regenerated answer.
#[tokio::test]
async fn a_regeneration_carries_the_same_history_and_becomes_the_turn() {
    let bed = Bed::start().await;
    bed.fake.script(
        "regen",
        [Act::Text("one".into()), Act::Text("two".into()), Act::Text("two again".into()), Act::Text("three".into())],
    );
    let declaration = json!({"approval_mode": "bypass", "default_model": "oa/regen"});
    let (conversation, _) = bed.turn(None, "first", &declaration).await;
    let (_, second) = bed.turn(Some(conversation), "second", &declaration).await;
    let caller = bed.server.caller(&bed.agent).await;
    let regenerated = bed.server.server.api.regenerate(&caller, second, &json!({})).await.expect("regenerated");
    let again: ExecutionId =
        regenerated["execution_public_id"].as_str().and_then(|id| id.parse().ok()).expect("the regeneration's id");
    let row = bed.server.settled(again, SETTLE).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    bed.turn(Some(conversation), "third", &declaration).await;

    let requests = bed.fake.requests_for("regen");
    assert_eq!(requests.len(), 4);
    assert_eq!(lines(&requests[1]), ["user: first", "assistant: one", "user: second"]);
    assert_eq!(requests[2].body["messages"], requests[1].body["messages"], "the same turn, the same history");
    assert_eq!(
        lines(&requests[3]),
        ["user: first", "assistant: one", "user: second", "assistant: two again", "user: third"],
        "the regeneration is the answer the conversation keeps"
    );
}

/// A regeneration that does not complete (here the model refuses, and a person stops it) leaves
/// the turn's earlier answer in place: the next turn reads it, and the turn shows it.
#[tokio::test]
async fn a_regeneration_that_was_stopped_leaves_the_earlier_answer_in_place() {
    let bed = Bed::start().await;
    bed.fake.script("keep", [Act::Text("one".into()), Act::Text("two".into()), Act::Refuse, Act::Text("three".into())]);
    let declaration = json!({"approval_mode": "bypass", "default_model": "oa/keep"});
    let (conversation, _) = bed.turn(None, "first", &declaration).await;
    let (_, second) = bed.turn(Some(conversation), "second", &declaration).await;
    let caller = bed.server.caller(&bed.agent).await;
    let regenerated = bed.server.server.api.regenerate(&caller, second, &json!({})).await.expect("regenerated");
    let again: ExecutionId =
        regenerated["execution_public_id"].as_str().and_then(|id| id.parse().ok()).expect("the regeneration's id");
    let row = bed.server.settled(again, SETTLE).await;
    assert_ne!(row.status, RunStatus::Completed, "{row:?}");
    if !row.status.is_terminal() {
        bed.server.server.api.stop(&caller, again, true).await.expect("stopped");
        let row = bed.server.settled(again, SETTLE).await;
        assert!(row.status.is_terminal(), "{row:?}");
    }
    bed.turn(Some(conversation), "third", &declaration).await;
    let requests = bed.fake.requests_for("keep");
    assert_eq!(
        lines(requests.last().expect("turn 3")),
        ["user: first", "assistant: one", "user: second", "assistant: two", "user: third"],
        "the completed answer is the one the conversation keeps"
    );
    let turns = bed.server.server.api.conversation(&caller, conversation, 0).await.expect("turns");
    assert_eq!(turns["turns"][1]["final_text"], json!("two"), "{turns:#}");
    assert_eq!(turns["turns"][1]["execution_public_id"], json!(second));
    assert_eq!(turns["turns"][1]["candidates"], json!(2));
}

/// A restart between two turns loses nothing: turn 2, posted to the restarted server, carries
/// turn 1 whole.
#[tokio::test]
async fn a_restart_between_turns_keeps_the_history() {
    let bed = Bed::start().await;
    bed.fake.script(
        "durable",
        [
            Act::ToolCalls(vec![call("c_1", "runners_list", json!({}))]),
            Act::Text("one".into()),
            Act::Text("two".into()),
        ],
    );
    let declaration = json!({"approval_mode": "bypass", "default_model": "oa/durable",
                             "kernel_tools": ["nexus.runners.list"]});
    let (conversation, _) = bed.turn(None, "first", &declaration).await;
    let Bed { fake, server, agent } = bed;
    let server = server.restart_with_env(&[], test_env).await;
    let bed = Bed { fake, server, agent };
    bed.turn(Some(conversation), "second", &declaration).await;
    let requests = bed.fake.requests_for("durable");
    assert_eq!(
        lines(&requests[2]),
        ["user: first", "call:c_1:runners_list", "result:c_1", "assistant: one", "user: second"]
    );
}

/// The `nexus` binary is SIGKILLed between two turns and again during turn 2 (a call parked for
/// approval): nothing of the conversation is lost, and turn 2's rounds after each restart carry
/// turn 1 whole, then turn 2 as it stood.
#[tokio::test]
async fn a_sigkill_between_turns_and_during_one_loses_nothing() {
    use nexus_actors::store::StoreBackend;
    use nexus_tests::processes::{NexusProcess, StoreLocation, admin_agent, free_loopback_addr};
    use nexus_tests::{Http, TestDatabase, test_store_backend, wait_until};

    let fake = FakeProvider::start().await;
    fake.script(
        "killed",
        [
            Act::ToolCalls(vec![call("k_1", "runners_list", json!({}))]),
            Act::Text("one".into()),
            Act::ToolCalls(vec![call("k_2", "runners_list", json!({}))]),
            Act::Text("two".into()),
        ],
    );
    let dir = tempfile::tempdir().expect("dir");
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).expect("data dir");
    let database = match test_store_backend() {
        StoreBackend::Postgres => Some(TestDatabase::create().await),
        _ => None,
    };
    let at = StoreLocation { data_dir, database_url: database.as_ref().map(|d| d.url().to_owned()) };
    let config = dir.path().join("nexus.toml");
    std::fs::write(
        &config,
        format!(
            "[providers.oa]\nkind = \"openai_compatible\"\nbase_url = {:?}\nallow_any_model = true\n",
            fake.openai_base_url()
        ),
    )
    .expect("config");
    let addr = free_loopback_addr();
    let nexus = NexusProcess::serve(&at, addr, &config).await;
    let agent = admin_agent(&at, "ada").await;
    let http = Http::new(&nexus.url(), Some(&agent.token));
    let declaration = |mode: &str| json!({"approval_mode": mode, "default_model": "oa/killed", "kernel_tools": ["nexus.runners.list"]});
    let settled = |http: &Http, execution: String| {
        let http = http.clone();
        async move {
            wait_until("the execution to settle", SETTLE, || async {
                let row = http.get(&format!("/agent_api/v1/executions/{execution}")).await;
                matches!(row.body["status"].as_str(), Some("completed")).then_some(row.body)
            })
            .await
        }
    };
    let first = http
        .post("/agent_api/v1/inputs", &json!({"text": "first", "execution_declaration": declaration("bypass")}))
        .await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    let conversation = first.body["conversation_public_id"].as_str().expect("conversation").to_owned();
    settled(&http, first.body["execution_public_id"].as_str().expect("execution").to_owned()).await;

    // Between the turns.
    nexus.sigkill().await;
    let nexus = NexusProcess::serve(&at, addr, &config).await;
    let second = http
        .post(
            "/agent_api/v1/inputs",
            &json!({"conversation_public_id": conversation, "text": "second", "execution_declaration": declaration("ask")}),
        )
        .await;
    assert_eq!(second.status, 201, "{:?}", second.body);
    let execution = second.body["execution_public_id"].as_str().expect("execution").to_owned();
    // During turn 2: its call is parked for approval.
    wait_until("the call to park", SETTLE, || async {
        let row = http.get(&format!("/agent_api/v1/executions/{execution}")).await;
        row.body["tasks"]
            .as_array()
            .is_some_and(|tasks| tasks.iter().any(|t| t["status"] == "needs_approval"))
            .then_some(())
    })
    .await;
    nexus.sigkill().await;
    let nexus = NexusProcess::serve(&at, addr, &config).await;
    let approved = http.post(&format!("/agent_api/v1/executions/{execution}/tasks/r1t0/approve"), &json!({})).await;
    assert_eq!(approved.status, 200, "{:?}", approved.body);
    settled(&http, execution).await;

    let requests = fake.requests_for("killed");
    assert_eq!(requests.len(), 4, "no round was asked twice");
    let turn_one = ["user: first", "call:k_1:runners_list", "result:k_1", "assistant: one"];
    let mut expected: Vec<&str> = turn_one.to_vec();
    expected.push("user: second");
    assert_eq!(lines(&requests[2]), expected);
    expected.extend(["call:k_2:runners_list", "result:k_2"]);
    assert_eq!(lines(&requests[3]), expected);
    drop(nexus);
}

/// An input's `variables` render in place of the template's defaults; a name the template does
/// not declare, or any name under another mechanism, is refused `variable_undeclared` and admits
/// nothing.
#[tokio::test]
async fn an_input_sets_the_template_variables_and_undeclared_ones_are_refused() {
    let bed = Bed::start().await;
    bed.fake.script("vars", [Act::Text("ok".into())]);
    let declaration = json!({"approval_mode": "bypass", "default_model": "oa/vars", "prompt_mechanism": "assembly",
        "prompt_template": {"blocks": [{"type": "slot", "slot": "system_prompt"}, {"type": "history"}, {"type": "input"}],
                            "variables": {"tone": "calm", "lang": "English"}},
        "system_prompt": {"content": "Be {{tone}}; answer in {{lang}}."}});
    let caller = bed.server.caller(&bed.agent).await;
    let input = |declaration: &Value, variables: Value| CreateInput {
        text: "hello".into(),
        execution_declaration: Some(declaration.clone()),
        variables: Some(variables),
        ..CreateInput::default()
    };
    let api = &bed.server.server.api;
    let admitted = api.create_input(&caller, input(&declaration, json!({"tone": "sharp"}))).await.expect("admitted");
    let row = bed.server.settled(admitted.execution_public_id, SETTLE).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert_eq!(lines(&bed.fake.requests_for("vars")[0]), ["system: Be sharp; answer in English.", "user: hello"]);

    let refusals = [
        (input(&declaration, json!({"mood": "odd"})), "variable_undeclared"),
        (
            input(&json!({"approval_mode": "bypass", "default_model": "oa/vars"}), json!({"tone": "sharp"})),
            "variable_undeclared",
        ),
        (input(&declaration, json!({"tone": 3})), "parameter_invalid"),
        (input(&declaration, json!(["tone"])), "parameter_invalid"),
    ];
    for (input, word) in refusals {
        let refusal = api.create_input(&caller, input).await.expect_err("refused");
        assert_eq!(refusal.code.as_str(), word, "{}", refusal.message);
    }
    // Over HTTP too, by the same word.
    let http = nexus_tests::Http::new(&bed.server.url(), Some(&bed.agent.token));
    let answer = http
        .post(
            "/agent_api/v1/inputs",
            &json!({"text": "hi", "execution_declaration": declaration, "variables": {"nope": "x"}}),
        )
        .await;
    assert_eq!((answer.status, answer.code()), (422, Some("variable_undeclared")), "{:?}", answer.body);
    assert_eq!(bed.fake.count("vars"), 1, "nothing refused was admitted");
}
