//! Lifecycle hooks end to end (`docs/executions.md`, "Lifecycle hooks"): a real server, the
//! scripted model (or the fake OpenAI-wire provider), and a raw runner that serves the hook tool by
//! committing the decision a test chooses. The retry and abandon doors run on HTTP and gRPC.

use nexus_actors::store::EventType;
use nexus_proto::{ErrorCode, ExecutionId, InboxKind, RunStatus, TaskStatus};
use nexus_tests::key;
use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::model::{ProviderConfig, ProviderKind};
use nexus_actors::store::{EventRow, ExecutionRow, TaskRow};
use nexus_proto::Refusal;
use nexus_proto::agent::v1::TaskDecisionRequest;
use nexus_proto::runner::v1::nexus_frame;
use nexus_tests::invariants::{Observations, assert_holds, check, collect};
use nexus_tests::{Act, FakeProvider, Http, Minted, RawRunner, TestServer, agent_client, authed, wait_until};

const WAIT: Duration = Duration::from_secs(30);

const READ_ONLY: &str = r#"{"kind":"read_only","destructive":false,"effect_scope":"closed","idempotency":"intrinsic","reconciliation":"none"}"#;

/// A script whose every answer repeats the last user message, so each prompt the model read is
/// visible in the answer (and in the next stop hook's `output_preview`).
fn echo_script() -> Value {
    json!({"rounds": [{"final": "draft: {{input}}"}]})
}

fn tool(name: &str) -> Value {
    json!({"name": name, "description": format!("{name} as served."), "input_schema": {"type": "object"},
        "timeout_ms": 60_000, "effect_profile": serde_json::from_str::<Value>(READ_ONLY).expect("effect profile")})
}

/// A server, an Agent, and a raw runner announcing `probe` and the hook tool `review`.
struct Fixture {
    server: TestServer,
    agent: Minted,
    runner: Minted,
    raw: RawRunner,
}

impl Fixture {
    async fn start(scripts: &[(&str, Value)]) -> Fixture {
        let server = TestServer::start(scripts).await;
        Self::on(server).await
    }

    async fn on(server: TestServer) -> Fixture {
        let agent = server.agent("agent").await;
        let runner = server.runner("worker").await;
        let raw = connect(&server, &runner).await;
        Fixture { server, agent, runner, raw }
    }

    fn http(&self) -> Http {
        Http::new(&self.server.url(), Some(&self.agent.token))
    }

    /// Declares the standing profile: the runner, `hooks`, approval `mode` and `rules`.
    async fn declare(&self, model: &str, hooks: Value, rules: Value) {
        let body = json!({"configuration": {
            "runner_executor_public_ids": [self.runner.id], "approval_mode": "bypass", "approval_rules": rules,
            "default_model": model, "lifecycle_hooks": hooks,
        }});
        let answer = self.http().declare(&body).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
    }

    /// Admits an input over HTTP and answers its execution.
    async fn turn(&self, text: &str) -> ExecutionId {
        let answer = self.http().post("/agent_api/v1/inputs", &json!({"text": text})).await;
        assert_eq!(answer.status, 201, "{:?}", answer.body);
        answer.body["execution_public_id"].as_str().expect("id").parse::<ExecutionId>().expect("uuid")
    }

    async fn execution(&self, run: ExecutionId) -> ExecutionRow {
        self.server.store().execution(run).await.expect("store").expect("execution")
    }

    async fn task(&self, run: ExecutionId, key: &str) -> TaskRow {
        self.server.task(run, key).await.expect("task")
    }

    async fn status(&self, run: ExecutionId, status: RunStatus) -> ExecutionRow {
        let store = self.server.store();
        wait_until(&format!("the execution to be {status}"), WAIT, || async {
            store.execution(run).await.ok().flatten().filter(|row| row.status == status)
        })
        .await
    }

    async fn events(&self, run: ExecutionId, event_type: EventType) -> Vec<Value> {
        let all: Vec<EventRow> = self.server.store().events_after(run, 0, 10_000).await.expect("events");
        all.into_iter().filter(|e| e.event.event_type() == event_type).map(|e| e.event.data()).collect()
    }

    /// The hook tasks of `run`, in key order.
    async fn hook_tasks(&self, run: ExecutionId) -> Vec<TaskRow> {
        let mut tasks: Vec<TaskRow> = self
            .server
            .store()
            .tasks_of(run)
            .await
            .expect("tasks")
            .into_iter()
            .filter(|t| t.task_key.is_hook())
            .collect();
        tasks.sort_by_key(|t| t.task_key);
        tasks
    }
}

async fn connect(server: &TestServer, runner: &Minted) -> RawRunner {
    RawRunner::connect_announced(
        &server.url(),
        runner,
        &json!({"tools": [tool("probe"), tool("review")], "environment": {"name": "worker"}}),
    )
    .await
}

fn repair_request(run: ExecutionId, task_key: &str) -> TaskDecisionRequest {
    TaskDecisionRequest {
        execution_public_id: run.to_string(),
        task_key: task_key.to_owned(),
        body_json: String::new(),
    }
}

fn door(run: ExecutionId, task_key: &str, verb: &str) -> String {
    format!("/agent_api/v1/executions/{run}/tasks/{task_key}/{verb}")
}

/// Waits for the offer of `key`, claims it, and answers the claim's token and task.
async fn claim(raw: &mut RawRunner, run: ExecutionId, key: &str) -> (String, Value) {
    let work = raw.next_work(WAIT).await.expect("work offered");
    assert_eq!((work.run_public_id.as_str(), work.task_key.as_str()), (run.to_string().as_str(), key));
    assert_eq!(
        (work.kind.parse::<InboxKind>().ok(), work.tool_name.as_str()),
        (Some(InboxKind::ToolCall), "review"),
        "an ordinary tool_call row"
    );
    let (token, task) = raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claim granted");
    assert_eq!(task["task_key"], key);
    (token, task)
}

/// Commits a hook decision; `is_error` marks the commit as the tool's error.
async fn commit(raw: &RawRunner, run: ExecutionId, key: &str, token: &str, decision: Value, is_error: bool) {
    let body = json!({"content": "reviewed", "structured_content": decision, "is_error": is_error});
    let committed = raw.commit(&run.to_string(), key, token, &body).await;
    assert_eq!(committed.code(), None, "commit refused: {committed:?}");
}

/// Claims the offered hook task `key`, commits `decision`, and answers the task as claimed.
async fn answer_hook(raw: &mut RawRunner, run: ExecutionId, key: &str, decision: Value) -> Value {
    let (token, task) = claim(raw, run, key).await;
    commit(raw, run, key, &token, decision, false).await;
    task
}

/// The settled `task_status` events of `key`.
fn settled<'a>(statuses: &'a [Value], key: &str) -> Vec<&'a Value> {
    statuses
        .iter()
        .filter(|e| e["task_key"] == key && e["failure_resolution"].is_null())
        .filter(|e| {
            matches!(e["status"].as_str(), Some("completed" | "failed" | "canceled" | "timed_out" | "uncertain"))
        })
        .collect()
}

#[tokio::test]
async fn a_stop_hook_continues_twice_then_accepts() {
    let mut f = Fixture::start(&[("echo", echo_script())]).await;
    f.declare(
        "scripted/echo",
        json!({"stop": {"tool": "review", "timeout_ms": 30_000, "max_continuations": 2}}),
        Value::Null,
    )
    .await;
    let run = f.turn("first ask").await;
    let conversation = f.execution(run).await.conversation_public_id;

    // The first candidate answer goes to the stop hook with the origin's input.
    let task = answer_hook(&mut f.raw, run, "h1-stop", json!({"continue": true, "feedback": "add detail A"})).await;
    assert_eq!(
        task["tool_input"],
        json!({"event": "stop", "task_key": "r1", "run_public_id": run, "conversation_public_id": conversation,
            "output_preview": "draft: first ask", "output_size_bytes": "draft: first ask".len()})
    );
    assert_eq!(task["timeout_ms"], 30_000, "the hook's own timeout");
    assert_eq!(task["addressed_to"]["executor_public_id"], json!(f.runner.id));
    // The feedback was the next round's prompt: the model answered it, and that answer went
    // through the stop hook again.
    let task = answer_hook(&mut f.raw, run, "h2-stop", json!({"continue": true, "feedback": "add detail B"})).await;
    assert_eq!(
        (task["tool_input"]["output_preview"].as_str(), task["tool_input"]["task_key"].as_str()),
        (Some("draft: add detail A"), Some("r2"))
    );
    let task = answer_hook(&mut f.raw, run, "h3-stop", json!({"continue": false})).await;
    assert_eq!(task["tool_input"]["output_preview"], "draft: add detail B");

    let row = f.status(run, RunStatus::Completed).await;
    assert_eq!(row.final_text.as_deref(), Some("draft: add detail B"));
    assert_eq!(row.round, 3);
    let hooks = f.hook_tasks(run).await;
    let keys: Vec<(String, TaskStatus)> = hooks.iter().map(|t| (t.task_key.to_string(), t.status)).collect();
    let completed = |key: &str| (key.to_owned(), TaskStatus::Completed);
    assert_eq!(keys, [completed("h1-stop"), completed("h2-stop"), completed("h3-stop")]);
    for hook in &hooks {
        assert_eq!(hook.approval.as_ref().map(|a| a["origin"].clone()), Some(json!("kernel")), "origin kernel");
        assert_eq!(
            (hook.kind, hook.target_executor_public_id),
            (nexus_proto::TaskKind::ToolTask, Some(f.runner.runner()))
        );
    }
    // The model read the feedback as user messages and never a hook result.
    let messages = row.transcript.as_array().expect("transcript");
    let users: Vec<&str> =
        messages.iter().filter(|m| m["role"] == "user").filter_map(|m| m["content"].as_str()).collect();
    assert_eq!(users, ["first ask", "add detail A", "add detail B"]);
    assert!(messages.iter().all(|m| m["role"] != "tool"), "no hook result reaches the model");
    // Each hook task settled once, marked as a hook, with its decision.
    let statuses = f.events(run, EventType::TaskStatus).await;
    for (key, decision) in [
        ("h1-stop", json!({"continue": true, "feedback": "add detail A"})),
        ("h2-stop", json!({"continue": true, "feedback": "add detail B"})),
        ("h3-stop", json!({"continue": false})),
    ] {
        let once = settled(&statuses, key);
        assert_eq!(once.len(), 1, "{key} settles once");
        assert_eq!((once[0]["status"].as_str(), once[0]["hook"].as_str()), (Some("completed"), Some("stop")), "{key}");
        assert_eq!(once[0]["decision"], decision, "{key}");
    }
    assert_eq!(f.events(run, EventType::RoundResult).await.len(), 3);
    assert!(f.events(run, EventType::AttentionRequired).await.is_empty());
}

#[tokio::test]
async fn a_continuation_beyond_the_limit_holds_until_abandon_delivers_the_answer() {
    let mut f = Fixture::start(&[("echo", echo_script())]).await;
    f.declare(
        "scripted/echo",
        json!({"stop": {"tool": "review", "timeout_ms": 30_000, "max_continuations": 1}}),
        Value::Null,
    )
    .await;
    let run = f.turn("ask").await;
    answer_hook(&mut f.raw, run, "h1-stop", json!({"continue": true, "feedback": "again"})).await;
    answer_hook(&mut f.raw, run, "h2-stop", json!({"continue": true, "feedback": "more"})).await;

    let row = f.status(run, RunStatus::NeedsAttention).await;
    assert_eq!(
        (row.attention_reason, row.error_key.as_deref()),
        (Some(nexus_proto::AttentionReason::HaltFailure), Some("stop_hook_limit"))
    );
    assert_eq!(row.final_text, None, "nothing is delivered while held");
    let held = f.task(run, "h2-stop").await;
    assert_eq!((held.status, held.error_key.as_deref()), (TaskStatus::Failed, Some("stop_hook_limit")));
    let result = held.result.expect("the committed result is kept");
    assert_eq!(result["structured_content"], json!({"continue": true, "feedback": "more"}));
    assert_eq!(result["error"]["key"], "stop_hook_limit");
    let attention = f.events(run, EventType::AttentionRequired).await;
    assert_eq!(attention.len(), 1);
    assert_eq!(
        (
            attention[0]["reason"].as_str(),
            attention[0]["error_key"].as_str(),
            attention[0]["task_key"].as_str(),
            attention[0]["hook"].as_str()
        ),
        (Some("halt_failure"), Some("stop_hook_limit"), Some("h2-stop"), Some("stop"))
    );
    let statuses = f.events(run, EventType::TaskStatus).await;
    let once = settled(&statuses, "h2-stop");
    assert_eq!(once.len(), 1, "the rewritten settlement is narrated once");
    assert_eq!((once[0]["status"].as_str(), once[0]["error_key"].as_str()), (Some("failed"), Some("stop_hook_limit")));

    // Only a failed, unresolved task is repaired; the doors need the owner.
    let owner = f.http();
    let refused = owner.post(&door(run, "h1-stop", "abandon"), &json!({})).await;
    assert_eq!((refused.status, refused.code()), (409, Some("not_abandonable")));
    let refused = owner.post(&door(run, "h9-stop", "retry"), &json!({})).await;
    assert_eq!((refused.status, refused.code()), (404, Some("not_found")));
    let stranger = f.server.agent("stranger").await;
    let refused =
        Http::new(&f.server.url(), Some(&stranger.token)).post(&door(run, "h2-stop", "abandon"), &json!({})).await;
    assert_eq!((refused.status, refused.code()), (404, Some("not_found")), "a stranger learns no id exists");

    // Abandon over gRPC releases the hold: the answer the hook last saw is delivered.
    let mut grpc = agent_client(&f.server).await;
    let reply =
        grpc.abandon_task(authed(repair_request(run, "h2-stop"), &f.agent)).await.expect("abandoned").into_inner();
    let task: Value = serde_json::from_str(&reply.body_json).expect("task json");
    assert_eq!((task["task_key"].as_str(), task["failure_resolution"].as_str()), (Some("h2-stop"), Some("abandoned")));
    let row = f.status(run, RunStatus::Completed).await;
    assert_eq!(row.final_text.as_deref(), Some("draft: again"));
    assert_eq!((row.attention_reason, row.error_key), (None, None));
    let statuses = f.events(run, EventType::TaskStatus).await;
    assert!(statuses.iter().any(|e| e["task_key"] == "h2-stop" && e["failure_resolution"] == "abandoned"));

    // Resolved now: neither door applies again.
    let status = grpc.abandon_task(authed(repair_request(run, "h2-stop"), &f.agent)).await.expect_err("resolved");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NotAbandonable);
    let status = grpc.retry_task(authed(repair_request(run, "h2-stop"), &f.agent)).await.expect_err("resolved");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NotRetryable);
}

#[tokio::test]
async fn a_turn_start_hook_passes_the_approval_stage_and_acknowledges_before_the_first_round() {
    let mut f = Fixture::start(&[("echo", echo_script())]).await;
    // A rule naming origin kernel parks the hook task; without it a hook is pre-approved.
    let rules = json!([{"tool": "review", "verdict": "ask", "origin": "kernel"}]);
    f.declare("scripted/echo", json!({"turn_start": {"tool": "review", "timeout_ms": 30_000}}), rules).await;
    let run = f.turn("hello").await;
    let conversation = f.execution(run).await.conversation_public_id;

    let store = f.server.store();
    let parked = wait_until("the turn_start hook to park", WAIT, || async {
        store.task(run, key("h1-turn_start")).await.ok().flatten().filter(|t| t.status == TaskStatus::NeedsApproval)
    })
    .await;
    assert_eq!(
        parked.tool_input,
        json!({"event": "turn_start", "task_key": "r1", "run_public_id": run, "conversation_public_id": conversation})
    );
    let required = f.events(run, EventType::ApprovalRequired).await;
    assert_eq!(required.len(), 1);
    assert_eq!(required[0]["task_key"], "h1-turn_start");
    // No model round starts while the hook is out.
    let row = f.execution(run).await;
    assert_eq!((row.status, row.round), (RunStatus::Running, 0));
    assert!(f.events(run, EventType::RoundStarted).await.is_empty());

    let approved = f.http().post(&door(run, "h1-turn_start", "approve"), &json!({})).await;
    assert_eq!((approved.status, approved.body["status"].as_str()), (200, Some("dispatched")), "{:?}", approved.body);
    answer_hook(&mut f.raw, run, "h1-turn_start", json!({"continue": false})).await;
    let row = f.status(run, RunStatus::Completed).await;
    assert_eq!(row.final_text.as_deref(), Some("draft: hello"));

    // The hook settled (acknowledged) before the first round started.
    let all: Vec<EventRow> = f.server.store().events_after(run, 0, 10_000).await.expect("events");
    let acknowledged = all
        .iter()
        .position(|e| {
            e.event.event_type() == EventType::TaskStatus
                && e.event.data()["task_key"] == "h1-turn_start"
                && e.event.data()["status"] == "completed"
        })
        .expect("the hook settled");
    let first_round =
        all.iter().position(|e| e.event.event_type() == EventType::RoundStarted).expect("a round started");
    assert!(acknowledged < first_round, "turn_start fires before the first model request");
    assert_eq!(all[acknowledged].event.data()["hook"], "turn_start");
    assert_eq!(f.hook_tasks(run).await.len(), 1, "one turn_start hook per execution");
}

#[tokio::test]
async fn a_hook_that_times_out_holds_until_a_retry_succeeds() {
    let mut f = Fixture::start(&[("echo", echo_script())]).await;
    f.declare(
        "scripted/echo",
        json!({"stop": {"tool": "review", "timeout_ms": 60_000, "max_continuations": 0}}),
        Value::Null,
    )
    .await;
    let run = f.turn("slow").await;
    // Offered, never claimed: the deadline, a minute on, settles it.
    let work = f.raw.next_work(WAIT).await.expect("offered");
    assert_eq!(work.task_key, "h1-stop");
    f.server.clock().advance(Duration::from_secs(61));
    let row = f.status(run, RunStatus::NeedsAttention).await;
    assert_eq!(
        (row.attention_reason, row.error_key.as_deref()),
        (Some(nexus_proto::AttentionReason::HaltFailure), Some("tool_timeout"))
    );
    let timed_out = f.task(run, "h1-stop").await;
    assert_eq!((timed_out.status, timed_out.error_key.as_deref()), (TaskStatus::TimedOut, Some("tool_timeout")));
    let attention = f.events(run, EventType::AttentionRequired).await;
    assert_eq!(
        (attention[0]["error_key"].as_str(), attention[0]["task_key"].as_str()),
        (Some("tool_timeout"), Some("h1-stop"))
    );

    // Retry over HTTP: the next generation runs on the same target, and the execution runs again.
    let retried = f.http().post(&door(run, "h1-stop", "retry"), &json!({})).await;
    assert_eq!(retried.status, 200, "{:?}", retried.body);
    assert_eq!(
        (retried.body["task_key"].as_str(), retried.body["status"].as_str(), retried.body["retry_of"].as_str()),
        (Some("h1-stop-g2"), Some("dispatched"), Some("h1-stop"))
    );
    assert_eq!(retried.body["runner_executor_public_id"], json!(f.runner.id));
    assert_eq!(f.execution(run).await.status, RunStatus::Running);
    let task = answer_hook(&mut f.raw, run, "h1-stop-g2", json!({"continue": false})).await;
    assert_eq!(task["tool_input"]["output_preview"], "draft: slow");
    let row = f.status(run, RunStatus::Completed).await;
    assert_eq!(row.final_text.as_deref(), Some("draft: slow"));
    // The first generation is resolved by the retry.
    let statuses = f.events(run, EventType::TaskStatus).await;
    let resolution =
        statuses.iter().find(|e| e["task_key"] == "h1-stop" && !e["failure_resolution"].is_null()).expect("resolution");
    assert_eq!(
        (resolution["failure_resolution"].as_str(), resolution["retried_as"].as_str()),
        (Some("retried"), Some("h1-stop-g2"))
    );
    let refused = f.http().post(&door(run, "h1-stop", "retry"), &json!({})).await;
    assert_eq!((refused.status, refused.code()), (409, Some("not_retryable")));
    let history = collect(f.server.store(), &[run], Observations::default()).await;
    assert_holds("timeout then retry", &check(&history));
}

#[tokio::test]
async fn malformed_and_errored_decisions_fail_with_their_words() {
    let mut f = Fixture::start(&[("echo", echo_script())]).await;
    f.declare("scripted/echo", json!({"turn_start": {"tool": "review", "timeout_ms": 30_000}}), Value::Null).await;
    let run = f.turn("check").await;
    let owner = f.http();

    // Only stop may continue: a turn_start hook that asks to is invalid_hook_result.
    answer_hook(&mut f.raw, run, "h1-turn_start", json!({"continue": true, "feedback": "go on"})).await;
    let row = f.status(run, RunStatus::NeedsAttention).await;
    assert_eq!(row.error_key.as_deref(), Some("invalid_hook_result"));
    let failed = f.task(run, "h1-turn_start").await;
    assert_eq!((failed.status, failed.error_key.as_deref()), (TaskStatus::Failed, Some("invalid_hook_result")));
    assert_eq!(f.execution(run).await.round, 0, "no model round ran");

    // A commit with is_error:true is hook_error, whatever its structure says.
    let retried = owner.post(&door(run, "h1-turn_start", "retry"), &json!({})).await;
    assert_eq!(retried.body["task_key"], "h1-turn_start-g2", "{:?}", retried.body);
    let (token, _) = claim(&mut f.raw, run, "h1-turn_start-g2").await;
    commit(&f.raw, run, "h1-turn_start-g2", &token, json!({"continue": false}), true).await;
    f.status(run, RunStatus::NeedsAttention).await;
    let failed = f.task(run, "h1-turn_start-g2").await;
    assert_eq!((failed.status, failed.error_key.as_deref()), (TaskStatus::Failed, Some("hook_error")));
    assert_eq!(f.execution(run).await.error_key.as_deref(), Some("hook_error"));

    // A key outside {continue, feedback} is invalid_hook_result.
    let retried = owner.post(&door(run, "h1-turn_start-g2", "retry"), &json!({})).await;
    assert_eq!(retried.body["task_key"], "h1-turn_start-g3", "{:?}", retried.body);
    answer_hook(&mut f.raw, run, "h1-turn_start-g3", json!({"continue": false, "verdict": "fine"})).await;
    f.status(run, RunStatus::NeedsAttention).await;
    let failed = f.task(run, "h1-turn_start-g3").await;
    assert_eq!(failed.error_key.as_deref(), Some("invalid_hook_result"));
    // Superseded generations are resolved; only the latest holds.
    let refused = owner.post(&door(run, "h1-turn_start", "retry"), &json!({})).await;
    assert_eq!((refused.status, refused.code()), (409, Some("not_retryable")));

    // Abandoning a turn_start hook lets the first round run.
    let abandoned = owner.send(reqwest::Method::POST, &door(run, "h1-turn_start-g3", "abandon"), None).await;
    assert_eq!(abandoned.body["failure_resolution"], "abandoned", "{:?}", abandoned.body);
    let row = f.status(run, RunStatus::Completed).await;
    assert_eq!(row.final_text.as_deref(), Some("draft: check"));
    let attention = f.events(run, EventType::AttentionRequired).await;
    let words: Vec<&str> = attention.iter().filter_map(|e| e["error_key"].as_str()).collect();
    assert_eq!(words, ["invalid_hook_result", "hook_error", "invalid_hook_result"]);
    let statuses = f.events(run, EventType::TaskStatus).await;
    for key in ["h1-turn_start", "h1-turn_start-g2", "h1-turn_start-g3"] {
        assert_eq!(settled(&statuses, key).len(), 1, "{key} settles once");
    }
    let history = collect(f.server.store(), &[run], Observations::default()).await;
    assert_holds("rewritten decisions", &check(&history));
}

#[tokio::test]
async fn an_unserved_hook_tool_fails_tool_not_served_and_abandon_lets_the_turn_run() {
    let f = Fixture::start(&[("echo", echo_script())]).await;
    f.declare("scripted/echo", json!({"turn_start": {"tool": "ghost", "timeout_ms": 1_000}}), Value::Null).await;
    let run = f.turn("anyone there").await;
    let row = f.status(run, RunStatus::NeedsAttention).await;
    assert_eq!(row.error_key.as_deref(), Some("tool_not_served"));
    let failed = f.task(run, "h1-turn_start").await;
    assert_eq!(
        (failed.status, failed.error_key.as_deref(), failed.target_executor_public_id),
        (TaskStatus::Failed, Some("tool_not_served"), None)
    );
    let abandoned = f.http().post(&door(run, "h1-turn_start", "abandon"), &json!({})).await;
    assert_eq!(abandoned.status, 200, "{:?}", abandoned.body);
    assert_eq!(f.status(run, RunStatus::Completed).await.final_text.as_deref(), Some("draft: anyone there"));
}

#[tokio::test]
async fn a_forced_stop_cancels_the_hook_task_and_is_never_vetoed() {
    let mut f = Fixture::start(&[("echo", echo_script())]).await;
    f.declare(
        "scripted/echo",
        json!({"stop": {"tool": "review", "timeout_ms": 30_000, "max_continuations": 3}}),
        Value::Null,
    )
    .await;
    let run = f.turn("stop me").await;
    let (token, _) = claim(&mut f.raw, run, "h1-stop").await;

    let stopped = f.http().post(&format!("/agent_api/v1/executions/{run}/stop"), &json!({})).await;
    assert_eq!(stopped.status, 200, "{:?}", stopped.body);
    // The claimant hears that its work was canceled.
    let canceled = loop {
        match f.raw.next_push(WAIT).await.expect("a push") {
            nexus_frame::Frame::WorkCanceled(canceled) => break canceled,
            _ => continue,
        }
    };
    assert_eq!((canceled.run_public_id, canceled.task_key.as_str()), (run.to_string(), "h1-stop"));
    let row = f.status(run, RunStatus::Canceled).await;
    assert_eq!((row.error_key.as_deref(), row.final_text), (Some("run_canceled"), None));
    let hook = f.task(run, "h1-stop").await;
    assert_eq!((hook.status, hook.error_key.as_deref()), (TaskStatus::Canceled, Some("task_canceled")));
    // A late decision changes nothing.
    let late = f
        .raw
        .commit(
            &run.to_string(),
            "h1-stop",
            &token,
            &json!({"content": "x", "structured_content": {"continue": true, "feedback": "no"}}),
        )
        .await;
    assert_ne!(late.committed(), Some((false, "completed".to_owned())), "{late:?}");
    assert_eq!(f.task(run, "h1-stop").await.status, TaskStatus::Canceled);
    assert_eq!(f.execution(run).await.status, RunStatus::Canceled);
    let statuses = f.events(run, EventType::TaskStatus).await;
    let once = settled(&statuses, "h1-stop");
    assert_eq!(once.len(), 1);
    assert_eq!((once[0]["status"].as_str(), once[0]["hook"].as_str()), (Some("canceled"), Some("stop")));
}

#[tokio::test]
async fn the_hook_tool_never_reaches_the_model() {
    let fake = FakeProvider::start().await;
    let url = fake.openai_base_url();
    let server = TestServer::start_with(&[], move |config| {
        let provider = ProviderConfig {
            base_url: Some(url),
            allow_any_model: true,
            ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
        };
        config.providers.providers.insert("oa".into(), provider);
    })
    .await;
    let mut f = Fixture::on(server).await;
    fake.script("m1", [Act::Text("one".into()), Act::Text("two".into())]);
    let hooks = json!({
        "turn_start": {"tool": "review", "timeout_ms": 30_000},
        "stop": {"tool": "review", "timeout_ms": 30_000, "max_continuations": 1},
    });
    f.declare("oa/m1", hooks, Value::Null).await;
    let run = f.turn("begin").await;
    answer_hook(&mut f.raw, run, "h1-turn_start", json!({"continue": false})).await;
    answer_hook(&mut f.raw, run, "h1-stop", json!({"continue": true, "feedback": "say it again"})).await;
    answer_hook(&mut f.raw, run, "h2-stop", json!({"continue": false})).await;
    assert_eq!(f.status(run, RunStatus::Completed).await.final_text.as_deref(), Some("two"));

    // The runner announces review with a description and a schema, yet it is no callable.
    let materialized = f.events(run, EventType::InputMaterialized).await;
    let frozen: Vec<&str> =
        materialized[0]["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(frozen, ["probe"]);
    let requests = fake.requests_for("m1");
    assert_eq!(requests.len(), 2);
    for request in &requests {
        let offered: Vec<&str> = request.body["tools"]
            .as_array()
            .expect("tools offered")
            .iter()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        assert_eq!(offered, ["probe"], "the hook tool is never offered");
        assert!(request.tool_results().is_empty(), "no hook result is shown");
    }
    let last = requests[1].body["messages"].as_array().and_then(|m| m.last().cloned()).expect("messages");
    assert_eq!((last["role"].as_str(), last["content"].as_str()), (Some("user"), Some("say it again")));
}

#[tokio::test]
async fn a_stop_hook_out_over_a_nexus_restart_commits_after_it_and_the_execution_completes() {
    let scripts = [("echo", echo_script())];
    let mut f = Fixture::start(&scripts).await;
    f.declare(
        "scripted/echo",
        json!({"stop": {"tool": "review", "timeout_ms": 60_000, "max_continuations": 1}}),
        Value::Null,
    )
    .await;
    let run = f.turn("durable").await;
    let (token, _) = claim(&mut f.raw, run, "h1-stop").await;
    let Fixture { server, agent: _, runner, raw } = f;
    drop(raw);

    // Stop nexus and start it again on the same store.
    let server = server.restart(&scripts).await;

    let still = server.store().task(run, key("h1-stop")).await.expect("store").expect("task");
    assert_eq!((still.status, still.claimed), (TaskStatus::Dispatched, true), "the claimed hook task is durable");
    assert_eq!(server.store().execution(run).await.expect("store").expect("row").status, RunStatus::Running);
    // The runner reconnects and commits with the claim it holds: the answer is accepted and
    // delivered.
    let raw = connect(&server, &runner).await;
    commit(&raw, run, "h1-stop", &token, json!({"continue": false}), false).await;
    let row = wait_until("the execution to complete", WAIT, || async {
        server.store().execution(run).await.ok().flatten().filter(|row| row.status == RunStatus::Completed)
    })
    .await;
    assert_eq!(row.final_text.as_deref(), Some("draft: durable"));
    let events: Vec<EventRow> = server.store().events_after(run, 0, 10_000).await.expect("events");
    let settled_hooks = events
        .iter()
        .filter(|e| {
            e.event.event_type() == EventType::TaskStatus
                && e.event.data()["task_key"] == "h1-stop"
                && e.event.data()["status"] == "completed"
        })
        .count();
    assert_eq!(settled_hooks, 1);
    assert_eq!(
        events.iter().filter(|e| e.event.event_type() == EventType::RoundStarted).count(),
        1,
        "the answer was not asked again"
    );
}
