//! Compaction end to end (`docs/executions.md`, "Compaction"; "Lifecycle hooks" for
//! `pre_compact`/`post_compact`): a real server, the fake OpenAI-wire provider (which can refuse a
//! request for length and report any input token count), the in-process kernel tool
//! `runners_list` for the model's rounds, and a raw runner for the delegate summarizer and the
//! hooks.
//!
//! Most executions run the same shape: round 1 and round 2 each call `runners_list`; round 3 is
//! where compaction happens. Before it the transcript is `[input, a1(c1), t1, a2(c2), t2]`: the
//! first round (`a1`, `t1`) is compacted, the input is pinned and the latest round is the retained
//! tail.

use nexus_actors::store::EventType;
use nexus_proto::{ErrorCode, ExecutionId, RunStatus, TaskKind, TaskStatus};
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use nexus_actors::actors::execution::compaction::{DEFAULT_INSTRUCTIONS, SUMMARY_HEADER};
use nexus_actors::model::{ModelConfig, ProviderConfig, ProviderKind};
use nexus_actors::store::{EventRow, ExecutionRow, TaskRow};
use nexus_proto::Refusal;
use nexus_proto::agent::v1::CompactExecutionRequest;
use nexus_tests::invariants::{Observations, assert_holds, check, collect};
use nexus_tests::{Act, FakeProvider, FakeRequest, Http, Minted, RawRunner, TestServer, agent_client, authed};

const WAIT: Duration = Duration::from_secs(30);

const READ_ONLY: &str = r#"{"kind":"read_only","destructive":false,"effect_scope":"closed","idempotency":"intrinsic","reconciliation":"none"}"#;

/// A server whose `oa` provider (openai_compatible, any model) points at the fake; `oa/tiny` has
/// a context window of 1000 tokens, every other model the default.
struct Bed {
    fake: FakeProvider,
    server: TestServer,
    agent: Minted,
}

impl Bed {
    async fn start() -> Bed {
        let fake = FakeProvider::start().await;
        let server = TestServer::start_with(&[], provider(fake.openai_base_url())).await;
        let agent = server.agent("agent").await;
        Bed { fake, server, agent }
    }

    fn http(&self) -> Http {
        Http::new(&self.server.url(), Some(&self.agent.token))
    }

    /// Admits an input with an inline declaration and returns its execution.
    async fn run(&self, text: &str, declaration: Value) -> ExecutionId {
        self.server.run_declared(&self.agent, text, declaration).await
    }

    async fn settled(&self, run: ExecutionId) -> ExecutionRow {
        self.server.settled(run, WAIT).await
    }

    async fn task(&self, run: ExecutionId, key: &str) -> TaskRow {
        self.server.task(run, key).await.expect("task")
    }

    async fn events(&self, run: ExecutionId) -> Vec<EventRow> {
        self.server.store().events_after(run, 0, i64::MAX).await.expect("events")
    }

    async fn assert_invariants(&self, run: ExecutionId, tag: &str) {
        let history = collect(self.server.store(), &[run], Observations::default()).await;
        assert_holds(tag, &check(&history));
    }
}

fn provider(url: String) -> impl FnOnce(&mut nexus_actors::config::ServerConfig) {
    move |config| {
        config.execution.model_retry_min_delay_ms = 5;
        config.execution.model_retry_max_delay_ms = 20;
        let tiny = ModelConfig { context_window_tokens: Some(1_000), ..ModelConfig::default() };
        config.providers.providers.insert(
            "oa".into(),
            ProviderConfig {
                base_url: Some(url),
                allow_any_model: true,
                models: [("tiny".to_owned(), tiny)].into(),
                ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
            },
        );
    }
}

fn call(id: &str) -> Act {
    Act::ToolCalls(vec![(id.to_owned(), "runners_list".to_owned(), json!({}))])
}

/// An execution declaration: `model`, the kernel tool `runners_list`, and `policy`.
fn declaration(model: &str, policy: Value) -> Value {
    json!({"approval_mode": "bypass", "default_model": model, "kernel_tools": ["nexus.runners.list"],
           "compaction_policy": policy})
}

fn of_type(events: &[EventRow], event_type: EventType) -> Vec<Value> {
    events.iter().filter(|e| e.event.event_type() == event_type).map(|e| e.event.data().clone()).collect()
}

fn position(events: &[EventRow], what: impl Fn(&EventRow) -> bool) -> usize {
    events.iter().position(what).expect("the event is there")
}

fn rounds(events: &[EventRow]) -> Vec<i64> {
    of_type(events, EventType::RoundStarted).iter().filter_map(|e| e["round"].as_i64()).collect()
}

/// The request's messages as `(role, content)`, content `""` when absent.
fn messages(request: &FakeRequest) -> Vec<(String, String)> {
    request.body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (m["role"].as_str().unwrap_or_default().to_owned(), m["content"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

/// The ids of the tool calls the request's assistant messages carry, in order.
fn call_ids(request: &FakeRequest) -> Vec<String> {
    request.body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["id"].as_str().map(str::to_owned))
        .collect()
}

fn offers_no_tools(request: &FakeRequest) -> bool {
    request.body.get("tools").is_none_or(|tools| tools.as_array().is_some_and(Vec::is_empty))
}

/// The first `task_status` event of `key`: the one carrying the compaction's facts.
fn first_status(events: &[EventRow], key: &str) -> Value {
    of_type(events, EventType::TaskStatus).into_iter().find(|e| e["task_key"] == key).expect("a task_status")
}

#[tokio::test]
async fn an_overflow_compacts_with_the_kernel_summarizer_and_the_round_runs_again() {
    let bed = Bed::start().await;
    bed.fake.script("m", [call("c1"), call("c2"), Act::ContextOverflow, Act::Text("done".into())]);
    bed.fake.script("sum", [Act::Text("listed the runners once".into())]);
    let mut declared = declaration("oa/m", json!({"mode": "kernel", "model": "oa/sum"}));
    declared["summarizer"] = json!({"content": "Keep decisions and pointers."});
    let run = bed.run("who runs my tools?", declared).await;
    let row = bed.settled(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("done")), "{row:?}");

    let events = bed.events(run).await;
    assert_eq!(
        of_type(&events, EventType::ContextCompacted),
        vec![json!({"run_public_id": run, "task_key": "r3", "summary_task_key": "c3-summary", "mode": "kernel",
                    "trigger": "overflow", "replaced_messages": 2, "retained_messages": 2})]
    );
    // The refused round is asked again under its own number, without a retry of its own.
    assert_eq!(rounds(&events), [1, 2, 3, 3]);
    assert!(of_type(&events, EventType::AttentionRequired).is_empty());

    // The summarizer saw no tools, the summarizer document and the history to compact.
    let summarizer = bed.fake.requests_for("sum");
    assert_eq!(summarizer.len(), 1);
    assert!(offers_no_tools(&summarizer[0]), "{:?}", summarizer[0].body.get("tools"));
    let asked = messages(&summarizer[0]);
    assert_eq!(asked.len(), 2);
    assert_eq!(asked[0], ("system".to_owned(), "Keep decisions and pointers.".to_owned()));
    assert_eq!(asked[1].0, "user");
    assert!(asked[1].1.contains("[assistant called runners_list as c1]"), "{}", asked[1].1);
    assert!(asked[1].1.contains("[user, kept verbatim] who runs my tools?"), "{}", asked[1].1);
    assert!(!asked[1].1.contains("as c2]"), "the retained tail is not summarized: {}", asked[1].1);

    // The round ran again over the pinned input, the summary and the retained tail.
    let requests = bed.fake.requests_for("m");
    assert_eq!(requests.len(), 4);
    assert_eq!(call_ids(&requests[2]), ["c1", "c2"], "the refused request carried everything");
    let again = messages(&requests[3]);
    assert_eq!(again[0], ("user".to_owned(), "who runs my tools?".to_owned()));
    assert_eq!(again[1].0, "assistant");
    assert_eq!(again[1].1, format!("{SUMMARY_HEADER}\n\nlisted the runners once"));
    assert_eq!(again.len(), 4, "{again:?}");
    assert_eq!(call_ids(&requests[3]), ["c2"], "the first round is compacted away");
    assert_eq!(requests[3].tool_results().len(), 1);

    // The summary task is durable, narrated with the compaction's facts, and settled once.
    let summary = bed.task(run, "c3-summary").await;
    assert_eq!((summary.kind, summary.status), (TaskKind::ModelTask, TaskStatus::Completed));
    assert_eq!(summary.result.as_ref().map(|r| r["content"].clone()), Some(json!("listed the runners once")));
    assert_eq!(summary.target_executor_public_id, None, "a kernel summary never reaches a runner");
    let first = first_status(&events, "c3-summary");
    assert_eq!((first["status"].as_str(), first["kind"].as_str()), (Some("waiting"), Some("model_task")));
    assert_eq!(first["compaction"], json!({"task_key": "r3", "trigger": "overflow", "mode": "kernel"}));
    let usage = of_type(&events, EventType::Usage);
    assert!(usage.iter().any(|u| u["summary_task_key"] == "c3-summary" && u["model"] == "oa/sum"), "{usage:?}");
    let transcript = row.transcript.as_array().expect("transcript");
    assert!(transcript.iter().all(|m| m["tool_call_id"] != "c1"), "the stored transcript is compacted too");
    bed.assert_invariants(run, "overflow").await;
}

#[tokio::test]
async fn high_reported_usage_against_a_small_window_compacts_before_the_next_round() {
    let bed = Bed::start().await;
    // oa/tiny has a 1000-token window; 80 % of it is 800. Round 1 reports 11 input tokens, round 2
    // reports 900: with its tail, the next request would not fit.
    bed.fake.script(
        "tiny",
        [
            call("c1"),
            Act::WithUsage { input_tokens: 900, act: Box::new(call("c2")) },
            Act::Text("summary of round one".into()),
            Act::Text("done".into()),
        ],
    );
    let run = bed.run("count my runners", declaration("oa/tiny", json!({"mode": "kernel"}))).await;
    let row = bed.settled(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("done")), "{row:?}");

    let events = bed.events(run).await;
    let compacted = of_type(&events, EventType::ContextCompacted);
    assert_eq!(compacted.len(), 1);
    assert_eq!(
        (compacted[0]["trigger"].as_str(), compacted[0]["mode"].as_str(), compacted[0]["task_key"].as_str()),
        (Some("usage"), Some("kernel"), Some("r3"))
    );
    assert_eq!(rounds(&events), [1, 2, 3], "a proactive compaction asks no round twice");
    let first = first_status(&events, "c3-summary");
    let overshoot = first["compaction"]["overshoot_tokens"].as_u64().expect("overshoot_tokens");
    assert!(overshoot > 100 && overshoot < 1_000, "900 reported plus the tail, over 800: {overshoot}");

    // Without a policy model the summarizer is the execution's model, without tools, under the
    // built-in instructions (no summarizer document was declared).
    let requests = bed.fake.requests_for("tiny");
    assert_eq!(requests.len(), 4);
    assert!(!offers_no_tools(&requests[1]), "the rounds offer their tools");
    assert!(offers_no_tools(&requests[2]), "the summarizer offers none");
    assert_eq!(messages(&requests[2])[0], ("system".to_owned(), DEFAULT_INSTRUCTIONS.to_owned()));
    assert_eq!(call_ids(&requests[3]), ["c2"]);
    assert!(messages(&requests[3])[1].1.ends_with("summary of round one"));
    bed.assert_invariants(run, "usage").await;
}

#[tokio::test]
async fn an_estimate_over_a_small_window_compacts_at_the_wall() {
    // The scripted provider reports no token counts, so the request's estimate is measured
    // against the window: 150 tokens, about 600 bytes, which round 3's request is over.
    let scripts = [
        (
            "walled",
            json!({"rounds": [
                {"tool_calls": [{"id": "c1", "name": "runners_list"}]},
                {"tool_calls": [{"id": "c2", "name": "runners_list"}]},
                {"final": "done: {{input}}"},
            ]}),
        ),
        ("wallsum", json!({"rounds": [{"final": "a short summary"}]})),
    ];
    let server = TestServer::start_with(&scripts, |config| {
        config.providers.providers.get_mut("scripted").expect("the built-in provider").context_window_tokens =
            Some(150);
    })
    .await;
    let agent = server.agent("agent").await;
    let bed = Bed { fake: FakeProvider::start().await, server, agent };
    let policy = json!({"mode": "kernel", "model": "scripted/wallsum"});
    let run = bed.run("walls", declaration("scripted/walled", policy)).await;
    let row = bed.settled(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("done: walls")), "{row:?}");

    let events = bed.events(run).await;
    let compacted = of_type(&events, EventType::ContextCompacted);
    assert_eq!(compacted.len(), 1, "round 2's request had nothing to compact yet");
    assert_eq!(
        (
            compacted[0]["trigger"].as_str(),
            compacted[0]["task_key"].as_str(),
            compacted[0]["replaced_messages"].as_u64()
        ),
        (Some("wall"), Some("r3"), Some(2))
    );
    let fact = &first_status(&events, "c3-summary")["compaction"];
    assert!(fact["overshoot_tokens"].as_u64().is_some_and(|t| t > 0), "{fact}");
    assert!(fact.get("overshoot_bytes").is_none(), "under the byte bound: {fact}");
    assert_eq!(rounds(&events), [1, 2, 3]);
    let transcript = row.transcript.as_array().expect("transcript");
    assert_eq!(transcript[1]["content"], format!("{SUMMARY_HEADER}\n\na short summary"));
    bed.assert_invariants(run, "wall").await;
}

#[tokio::test]
async fn the_manual_door_compacts_the_queued_round_and_refuses_with_its_words() {
    let bed = Bed::start().await;
    bed.fake
        .script("m", [call("c1"), call("c2"), Act::Text("first round, summarized".into()), Act::Text("done".into())]);
    let mut declared = declaration("oa/m", json!({"mode": "kernel"}));
    declared["approval_mode"] = json!("ask");
    let run = bed.run("list them, carefully", declared).await;
    let http = bed.http();
    let door = format!("/agent_api/v1/executions/{run}/compact");
    let approve = |key: &str| format!("/agent_api/v1/executions/{run}/tasks/{key}/approve");
    let mut grpc = agent_client(&bed.server).await;
    let request = |member: &Minted| authed(CompactExecutionRequest { execution_public_id: run.to_string() }, member);

    // Round 1's call is parked: only the input and an open call, nothing to compact (gRPC twin).
    bed.server.task_in(run, "r1t0", TaskStatus::NeedsApproval).await;
    let status = grpc.compact_execution(request(&bed.agent)).await.expect_err("nothing to compact");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NothingToCompact);
    assert_eq!(http.post(&approve("r1t0"), &json!({})).await.status, 200);

    // Round 2's call is parked: round 3 is queued, and round 1 can be compacted.
    bed.server.task_in(run, "r2t0", TaskStatus::NeedsApproval).await;
    let accepted = http.post(&door, &json!({})).await;
    assert_eq!(accepted.status, 202, "{:?}", accepted.body);
    assert_eq!(
        accepted.body,
        json!({"execution_public_id": run, "summary_task_key": "c3-summary", "task_key": "r3", "trigger": "manual",
               "mode": "kernel", "status": "waiting"})
    );
    assert_eq!(bed.task(run, "c3-summary").await.status, TaskStatus::Waiting, "durable before the answer");
    let again = http.send(reqwest::Method::POST, &door, None).await;
    assert_eq!((again.status, again.code()), (409, Some("already_compacted")));
    let status = grpc.compact_execution(request(&bed.agent)).await.expect_err("compacted already");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::AlreadyCompacted);
    assert_eq!(bed.fake.count("m"), 2, "the compaction waits for the round boundary");

    // The parked call is an unresolved obligation: it is never compacted away.
    assert_eq!(http.post(&approve("r2t0"), &json!({})).await.status, 200);
    let row = bed.settled(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("done")), "{row:?}");
    let events = bed.events(run).await;
    let compacted = of_type(&events, EventType::ContextCompacted);
    assert_eq!(
        (compacted[0]["trigger"].as_str(), compacted[0]["summary_task_key"].as_str()),
        (Some("manual"), Some("c3-summary"))
    );
    let requests = bed.fake.requests_for("m");
    assert_eq!(requests.len(), 4);
    assert!(offers_no_tools(&requests[2]), "the summarizer runs with no tools");
    assert_eq!(call_ids(&requests[3]), ["c2"], "the call that was open at the door survived");
    assert_eq!(requests[3].tool_results().len(), 1);

    // Finished, it has no queued round; other executions and members get their words.
    let done = http.post(&door, &json!({})).await;
    assert_eq!((done.status, done.code()), (409, Some("task_not_queued")));
    bed.fake.script("plain", [Act::Text("hi".into())]);
    let plain = bed.run("no policy", declaration("oa/plain", Value::Null)).await;
    bed.settled(plain).await;
    let disabled = http.post(&format!("/agent_api/v1/executions/{plain}/compact"), &json!({})).await;
    assert_eq!((disabled.status, disabled.code()), (409, Some("compaction_disabled")));
    let unknown = http.post(&format!("/agent_api/v1/executions/{}/compact", Uuid::new_v4()), &json!({})).await;
    assert_eq!((unknown.status, unknown.code()), (404, Some("not_found")));
    let stranger = bed.server.agent("stranger").await;
    let foreign = Http::new(&bed.server.url(), Some(&stranger.token)).post(&door, &json!({})).await;
    assert_eq!((foreign.status, foreign.code()), (404, Some("not_found")));
    let bad_body = http.post(&door, &json!([1])).await;
    assert_eq!((bad_body.status, bad_body.code()), (400, Some("parameter_missing")), "not an object");
    bed.assert_invariants(run, "manual").await;
}

#[tokio::test]
async fn mode_off_lets_the_overflow_halt_and_a_round_is_repaired_at_most_once() {
    let bed = Bed::start().await;
    bed.fake.script("off", [call("c1"), call("c2"), Act::ContextOverflow]);
    let run = bed.run("too much", declaration("oa/off", json!({"mode": "off"}))).await;
    let row = bed.settled(run).await;
    assert_eq!(
        (row.status, row.attention_reason, row.error_key.as_deref()),
        (RunStatus::NeedsAttention, Some(nexus_proto::AttentionReason::HaltFailure), Some("provider_context_overflow"))
    );
    let events = bed.events(run).await;
    assert!(of_type(&events, EventType::ContextCompacted).is_empty());
    assert!(bed.server.store().tasks_of(run).await.expect("tasks").iter().all(|t| !t.task_key.is_summary()));
    assert_eq!(bed.fake.count("off"), 3, "no summarizer was asked");

    // Under kernel a round overflowing again after its compaction is not compacted twice.
    bed.fake.script(
        "twice",
        [call("c1"), call("c2"), Act::ContextOverflow, Act::Text("summary".into()), Act::ContextOverflow],
    );
    let run = bed.run("still too much", declaration("oa/twice", json!({"mode": "kernel"}))).await;
    let row = bed.settled(run).await;
    assert_eq!((row.status, row.error_key.as_deref()), (RunStatus::NeedsAttention, Some("provider_context_overflow")));
    let events = bed.events(run).await;
    assert_eq!(of_type(&events, EventType::ContextCompacted).len(), 1);
    assert_eq!(rounds(&events), [1, 2, 3, 3]);
    assert_eq!(bed.fake.count("twice"), 5);
    bed.assert_invariants(run, "repaired once").await;
}

// ---- with a runner: the delegate, the hooks, restarts -------------------------------------------

fn tool(name: &str, timeout_ms: u64) -> Value {
    json!({"name": name, "description": format!("{name} as served."), "input_schema": {"type": "object"},
        "timeout_ms": timeout_ms, "effect_profile": serde_json::from_str::<Value>(READ_ONLY).expect("effect profile")})
}

/// The bed plus a raw runner announcing `summarize` (the delegate) and `review` (the hooks).
struct Served {
    bed: Bed,
    runner: Minted,
    raw: RawRunner,
}

impl Served {
    async fn start(summarize_timeout_ms: u64) -> Served {
        let bed = Bed::start().await;
        let runner = bed.server.runner("worker").await;
        let raw = connect(&bed.server, &runner, summarize_timeout_ms).await;
        Served { bed, runner, raw }
    }

    fn declaration(&self, model: &str, policy: Value, hooks: Value) -> Value {
        let mut declared = declaration(model, policy);
        declared["runner_executor_public_ids"] = json!([self.runner.id]);
        declared["runner_tool_names"] = json!([]);
        declared["lifecycle_hooks"] = hooks;
        declared
    }
}

async fn connect(server: &TestServer, runner: &Minted, summarize_timeout_ms: u64) -> RawRunner {
    let tools = json!([tool("summarize", summarize_timeout_ms), tool("review", 60_000)]);
    RawRunner::connect_announced(&server.url(), runner, &json!({"tools": tools, "environment": {"name": "worker"}}))
        .await
}

/// Waits for the offer of `key`, claims it, and answers the claim's token and task.
async fn claim(raw: &mut RawRunner, run: ExecutionId, key: &str) -> (String, Value) {
    let work = loop {
        let work = raw.next_work(WAIT).await.expect("work offered");
        if work.task_key == key {
            break work;
        }
    };
    assert_eq!(work.run_public_id, run.to_string());
    let (token, task) = raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claim granted");
    assert_eq!(task["task_key"], key);
    (token, task)
}

async fn commit(raw: &RawRunner, run: ExecutionId, key: &str, token: &str, body: Value) {
    let committed = raw.commit(&run.to_string(), key, token, &body).await;
    assert_eq!(committed.code(), None, "commit refused: {committed:?}");
}

async fn acknowledge(raw: &mut RawRunner, run: ExecutionId, key: &str) -> Value {
    let (token, task) = claim(raw, run, key).await;
    commit(raw, run, key, &token, json!({"content": "ok", "structured_content": {"continue": false}})).await;
    task
}

#[tokio::test]
async fn a_delegate_summarizes_on_the_runner_that_serves_its_tool() {
    let mut s = Served::start(60_000).await;
    s.bed.fake.script("d", [call("c1"), call("c2"), Act::ContextOverflow, Act::Text("done".into())]);
    let declared = s.declaration("oa/d", json!({"mode": "delegate", "tool_name": "summarize"}), Value::Null);
    let run = s.bed.run("delegate it", declared).await;

    let (token, task) = claim(&mut s.raw, run, "c3-summary").await;
    assert_eq!((task["tool_name"].as_str(), task["timeout_ms"].as_u64()), (Some("summarize"), Some(60_000)));
    let input = &task["tool_input"];
    assert_eq!((input["run_public_id"].clone(), input["task"].as_str()), (json!(run), Some("r3")));
    let history = input["history"].as_array().expect("history");
    let roles: Vec<&str> = history.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool"], "the input, then round 1");
    assert_eq!(history[0]["content"], "delegate it");
    assert_eq!(history[1]["tool_calls"][0]["id"], "c1");
    let tail = input["retained_tail"].as_array().expect("retained_tail");
    assert_eq!((tail.len(), tail[0]["tool_calls"][0]["id"].as_str()), (2, Some("c2")));
    assert!(input.to_string().len() <= 65_536);
    commit(&s.raw, run, "c3-summary", &token, json!({"content": "the runner's summary"})).await;

    let row = s.bed.settled(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("done")), "{row:?}");
    let events = s.bed.events(run).await;
    assert_eq!(
        of_type(&events, EventType::ContextCompacted),
        vec![json!({"run_public_id": run, "task_key": "r3", "summary_task_key": "c3-summary", "mode": "delegate",
                    "trigger": "overflow", "replaced_messages": 2, "retained_messages": 2})]
    );
    let requests = s.bed.fake.requests_for("d");
    assert_eq!(requests.len(), 4, "no kernel summarizer was asked");
    assert_eq!(messages(&requests[3])[1].1, format!("{SUMMARY_HEADER}\n\nthe runner's summary"));
    let summary = s.bed.task(run, "c3-summary").await;
    assert_eq!(
        (summary.kind, summary.target_executor_public_id),
        (nexus_proto::TaskKind::ToolTask, Some(s.runner.runner()))
    );
    assert_eq!(summary.approval.as_ref().map(|a| a["origin"].clone()), Some(json!("kernel")));
    s.bed.assert_invariants(run, "delegate").await;
}

#[tokio::test]
async fn a_delegate_nobody_answers_falls_back_to_the_kernel_summarizer_once() {
    let mut s = Served::start(60_000).await;
    s.bed.fake.script(
        "d",
        [
            call("c1"),
            call("c2"),
            Act::ContextOverflow,
            Act::Text("the kernel's summary".into()),
            Act::Text("done".into()),
        ],
    );
    let declared = s.declaration("oa/d", json!({"mode": "delegate", "tool_name": "summarize"}), Value::Null);
    let run = s.bed.run("nobody home", declared).await;
    // Offered, never claimed: its deadline, a minute on, settles it `tool_timeout`.
    let work = s.raw.next_work(WAIT).await.expect("the delegate task is offered");
    assert_eq!(work.task_key, "c3-summary");
    s.bed.server.clock().advance(Duration::from_secs(61));

    let row = s.bed.settled(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("done")), "{row:?}");
    let events = s.bed.events(run).await;
    assert_eq!(
        of_type(&events, EventType::ContextCompacted),
        vec![json!({"run_public_id": run, "task_key": "r3", "summary_task_key": "c3-summary-fallback",
                    "mode": "kernel", "trigger": "overflow", "fallback_from": "delegate",
                    "fallback_reason": "tool_timeout", "replaced_messages": 2, "retained_messages": 2})]
    );
    let delegate = s.bed.task(run, "c3-summary").await;
    assert_eq!((delegate.status, delegate.error_key.as_deref()), (TaskStatus::TimedOut, Some("tool_timeout")));
    let fallback = s.bed.task(run, "c3-summary-fallback").await;
    assert_eq!((fallback.kind, fallback.status), (TaskKind::ModelTask, TaskStatus::Completed));
    let fact = &first_status(&events, "c3-summary-fallback")["compaction"];
    assert_eq!(
        (fact["fallback_from"].as_str(), fact["fallback_reason"].as_str()),
        (Some("delegate"), Some("tool_timeout"))
    );
    let requests = s.bed.fake.requests_for("d");
    assert_eq!(requests.len(), 5);
    assert_eq!(requests.iter().filter(|r| offers_no_tools(r)).count(), 1, "the kernel summarizer ran once");
    assert!(offers_no_tools(&requests[3]));
    assert_eq!(messages(&requests[4])[1].1, format!("{SUMMARY_HEADER}\n\nthe kernel's summary"));
    s.bed.assert_invariants(run, "fallback").await;
}

#[tokio::test]
async fn pre_compact_and_post_compact_run_around_the_compaction() {
    let mut s = Served::start(60_000).await;
    s.bed.fake.script("h", [call("c1"), call("c2"), Act::ContextOverflow, Act::Text("done".into())]);
    s.bed.fake.script("hsum", [Act::Text("hooked summary".into())]);
    let hooks = json!({"pre_compact": {"tool": "review", "timeout_ms": 30_000},
                       "post_compact": {"tool": "review", "timeout_ms": 30_000}});
    let declared = s.declaration("oa/h", json!({"mode": "kernel", "model": "oa/hsum"}), hooks);
    let run = s.bed.run("hook it", declared).await;
    let conversation = s.bed.server.store().execution(run).await.expect("store").expect("row").conversation_public_id;

    let pre = acknowledge_checked(&mut s, run, "h3-pre_compact", |s| {
        assert_eq!(s.bed.fake.count("hsum"), 0, "no compaction work before pre_compact");
    })
    .await;
    assert_eq!(
        pre["tool_input"],
        json!({"event": "pre_compact", "task_key": "r3", "run_public_id": run, "conversation_public_id": conversation,
               "compaction_trigger": "overflow"})
    );
    let post = acknowledge_checked(&mut s, run, "h3-post_compact", |s| {
        assert_eq!(s.bed.fake.count("hsum"), 1, "compacted before post_compact");
        assert_eq!(s.bed.fake.count("h"), 3, "the round waits for post_compact");
    })
    .await;
    assert_eq!(post["tool_input"]["event"], "post_compact");
    let row = s.bed.settled(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("done")), "{row:?}");

    let events = s.bed.events(run).await;
    let settled = |key: &'static str| {
        move |e: &EventRow| {
            e.event.event_type() == EventType::TaskStatus
                && e.event.data()["task_key"] == key
                && e.event.data()["status"] == "completed"
        }
    };
    let pre_done = position(&events, settled("h3-pre_compact"));
    let compacted = position(&events, |e| e.event.event_type() == EventType::ContextCompacted);
    let post_done = position(&events, settled("h3-post_compact"));
    let rerun = events.iter().rposition(|e| e.event.event_type() == EventType::RoundStarted).expect("rounds");
    assert!(
        pre_done < compacted && compacted < post_done && post_done < rerun,
        "{pre_done} {compacted} {post_done} {rerun}"
    );
    assert_eq!(events[post_done].event.data()["hook"], "post_compact");
    s.bed.assert_invariants(run, "hooks").await;
}

/// Claims `key`, runs `check` while the hook is out, then acknowledges it.
async fn acknowledge_checked(s: &mut Served, run: ExecutionId, key: &str, check: impl FnOnce(&Served)) -> Value {
    let (token, task) = claim(&mut s.raw, run, key).await;
    check(s);
    commit(&s.raw, run, key, &token, json!({"content": "ok", "structured_content": {"continue": false}})).await;
    task
}

#[tokio::test]
async fn pinned_user_messages_survive_compaction() {
    let mut s = Served::start(60_000).await;
    s.bed.fake.script(
        "p",
        [
            Act::Text("a first draft".into()),
            call("c1"),
            call("c2"),
            Act::ContextOverflow,
            Act::Text("the final answer".into()),
        ],
    );
    s.bed.fake.script("psum", [Act::Text("drafted, then listed runners".into())]);
    let hooks = json!({"stop": {"tool": "review", "timeout_ms": 30_000, "max_continuations": 1}});
    let declared = s.declaration("oa/p", json!({"mode": "kernel", "model": "oa/psum"}), hooks);
    let run = s.bed.run("Constraint: never touch production.", declared).await;
    // The stop hook sends the first draft back with a second user constraint.
    let (token, _) = claim(&mut s.raw, run, "h1-stop").await;
    let feedback = json!({"continue": true, "feedback": "Also: answer in one line."});
    commit(&s.raw, run, "h1-stop", &token, json!({"content": "again", "structured_content": feedback})).await;
    acknowledge(&mut s.raw, run, "h4-stop").await;
    let row = s.bed.settled(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("the final answer")));

    let requests = s.bed.fake.requests_for("p");
    assert_eq!(requests.len(), 5);
    // Round 4 was compacted: the draft and round 2 went into the summary; both user messages
    // stayed verbatim and in order, ahead of the summary and the retained round 3.
    let compacted = messages(&requests[4]);
    let users: Vec<&str> = compacted.iter().filter(|(role, _)| role == "user").map(|(_, c)| c.as_str()).collect();
    assert_eq!(users, ["Constraint: never touch production.", "Also: answer in one line."]);
    assert_eq!(compacted[2], ("assistant".to_owned(), format!("{SUMMARY_HEADER}\n\ndrafted, then listed runners")));
    assert!(compacted.iter().all(|(_, c)| c != "a first draft"), "{compacted:?}");
    assert_eq!(call_ids(&requests[4]), ["c2"]);
    let summarized = messages(&s.bed.fake.requests_for("psum")[0]);
    assert!(summarized[1].1.contains("[assistant] a first draft"), "{}", summarized[1].1);
    let compacted_event = of_type(&s.bed.events(run).await, EventType::ContextCompacted);
    assert_eq!(
        (compacted_event[0]["task_key"].as_str(), compacted_event[0]["replaced_messages"].as_u64()),
        (Some("r4"), Some(3))
    );
    s.bed.assert_invariants(run, "pinned").await;
}

#[tokio::test]
async fn a_compaction_resumes_across_nexus_restarts() {
    let Served { mut bed, runner, mut raw } = Served::start(60_000).await;
    bed.fake.script("r", [call("c1"), call("c2"), Act::ContextOverflow, Act::Text("done".into())]);
    let hooks = json!({"pre_compact": {"tool": "review", "timeout_ms": 60_000}});
    let mut declared = declaration("oa/r", json!({"mode": "delegate", "tool_name": "summarize"}));
    declared["runner_executor_public_ids"] = json!([runner.id]);
    declared["runner_tool_names"] = json!([]);
    declared["lifecycle_hooks"] = hooks;
    let run = bed.run("survive restarts", declared).await;

    // Restart 1: the compaction is decided and waits for its pre_compact hook, claimed.
    let (token, _) = claim(&mut raw, run, "h3-pre_compact").await;
    assert_eq!(bed.task(run, "c3-summary").await.status, TaskStatus::Waiting);
    drop(raw);
    bed = restart(bed).await;
    assert_eq!(bed.task(run, "c3-summary").await.status, TaskStatus::Waiting, "the decision is durable");
    let mut raw = connect(&bed.server, &runner, 60_000).await;
    let ack = json!({"content": "ok", "structured_content": {"continue": false}});
    commit(&raw, run, "h3-pre_compact", &token, ack).await;

    // Restart 2: the delegate's summary task is out at the runner, claimed.
    let (token, task) = claim(&mut raw, run, "c3-summary").await;
    assert_eq!(task["tool_input"]["task"], "r3");
    drop(raw);
    bed = restart(bed).await;
    let raw = connect(&bed.server, &runner, 60_000).await;
    commit(&raw, run, "c3-summary", &token, json!({"content": "summary made across restarts"})).await;

    let row = bed.settled(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("done")), "{row:?}");
    let events = bed.events(run).await;
    let compacted = of_type(&events, EventType::ContextCompacted);
    assert_eq!(compacted.len(), 1, "applied once");
    assert_eq!((compacted[0]["mode"].as_str(), compacted[0]["trigger"].as_str()), (Some("delegate"), Some("overflow")));
    assert_eq!(rounds(&events), [1, 2, 3, 3]);
    let requests = bed.fake.requests_for("r");
    assert_eq!(requests.len(), 4);
    assert_eq!(messages(&requests[3])[1].1, format!("{SUMMARY_HEADER}\n\nsummary made across restarts"));
    assert_eq!(call_ids(&requests[3]), ["c2"]);
    bed.assert_invariants(run, "restarts").await;
}

/// Stops nexus and starts it again on the same store and configuration.
async fn restart(bed: Bed) -> Bed {
    let Bed { fake, server, agent } = bed;
    Bed { fake, server: server.restart(&[]).await, agent }
}
