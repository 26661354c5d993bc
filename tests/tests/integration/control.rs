//! Execution control end to end (`docs/executions.md`, "Control"; `docs/declaration.md`,
//! "Inline declarations"): pause and resume, graceful and forced, with their frozen clocks; stop,
//! graceful and forced, draining through `canceling`; regeneration; the context estimate; and the
//! freeze of a running execution's declaration against profile edits.
//!
//! A real server, scripted models (or a local fake provider where a test must see what a model
//! was asked, or hold a model call open), and a raw runner that claims and commits only when told.

use nexus_actors::store::EventType;
use nexus_proto::{ErrorCode, ExecutionId, RunStatus, TaskStatus};
use nexus_tests::key;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use uuid::Uuid;

use nexus_actors::actors::execution::control::{FROZEN_EPOCH_MS, is_frozen};
use nexus_actors::config::ServerConfig;
use nexus_actors::model::{ProviderConfig, ProviderKind};
use nexus_actors::store::{EventRow, ExecutionRow};
use nexus_proto::Refusal;
use nexus_proto::agent::v1::{
    CompactExecutionRequest, CreateInputRequest, DeclareProfileRequest, EstimateContextRequest, PauseExecutionRequest,
    RegenerateExecutionRequest, ResumeExecutionRequest, StopExecutionRequest, TaskDecisionRequest,
};
use nexus_proto::runner::v1::nexus_frame;
use nexus_tests::{Act, FakeProvider, Http, Minted, RawRunner, Reply, TestServer, agent_client, authed, wait_until};

const WAIT: Duration = Duration::from_secs(30);

const READ_ONLY: &str = r#"{"kind":"read_only","destructive":false,"effect_scope":"closed","idempotency":"intrinsic","reconciliation":"none"}"#;

fn tool(name: &str, timeout_ms: Option<u64>) -> Value {
    let mut tool = json!({"name": name, "description": format!("{name} as served."), "input_schema": {"type": "object"},
        "effect_profile": serde_json::from_str::<Value>(READ_ONLY).expect("effect profile")});
    if let Some(timeout) = timeout_ms {
        tool["timeout_ms"] = json!(timeout);
    }
    tool
}

/// A server, an Agent, and a raw runner announcing `probe`, `other` and `review`.
struct Fixture {
    server: TestServer,
    agent: Minted,
    runner: Minted,
    raw: RawRunner,
    timeout_ms: Option<u64>,
}

impl Fixture {
    async fn start(scripts: &[(&str, Value)], timeout_ms: Option<u64>) -> Fixture {
        Self::start_with(scripts, timeout_ms, |_| {}).await
    }

    async fn start_with(
        scripts: &[(&str, Value)],
        timeout_ms: Option<u64>,
        adjust: impl FnOnce(&mut ServerConfig),
    ) -> Fixture {
        let server = TestServer::start_with(scripts, adjust).await;
        let agent = server.agent("agent").await;
        let runner = server.runner("worker").await;
        let raw = connect(&server, &runner, timeout_ms).await;
        Fixture { server, agent, runner, raw, timeout_ms }
    }

    /// Declares the standing profile over HTTP: the runner's tools under `mode` and `rules`.
    async fn declare(&self, configuration: Value) {
        let answer = self.http().declare(&json!({"configuration": configuration})).await;
        assert_eq!(answer.status, 200, "declared: {:?}", answer.body);
    }

    /// The runner's tools, `approval_mode` `mode` with `rules`, and `model`.
    async fn declare_tools(&self, model: &str, mode: &str, rules: Value) {
        self.declare(json!({"runner_executor_public_ids": [self.runner.id], "approval_mode": mode,
            "approval_rules": rules, "default_model": model}))
            .await;
    }

    /// Admits an input over HTTP and answers its execution.
    async fn turn(&self, text: &str) -> ExecutionId {
        let answer = self.http().post("/agent_api/v1/inputs", &json!({"text": text})).await;
        assert_eq!(answer.status, 201, "admitted: {:?}", answer.body);
        answer.body["execution_public_id"].as_str().expect("id").parse::<ExecutionId>().expect("uuid")
    }

    fn http(&self) -> Http {
        Http::new(&self.server.url(), Some(&self.agent.token))
    }
}

async fn connect(server: &TestServer, runner: &Minted, timeout_ms: Option<u64>) -> RawRunner {
    let tools = json!([tool("probe", timeout_ms), tool("other", timeout_ms), tool("review", timeout_ms)]);
    RawRunner::connect_announced(&server.url(), runner, &json!({"tools": tools, "environment": {"name": "worker"}}))
        .await
}

fn door(run: ExecutionId, verb: &str) -> String {
    format!("/agent_api/v1/executions/{run}/{verb}")
}

async fn row(server: &TestServer, run: ExecutionId) -> ExecutionRow {
    server.store().execution(run).await.expect("store").expect("execution")
}

async fn status_is(server: &TestServer, run: ExecutionId, status: RunStatus) -> ExecutionRow {
    wait_until(&format!("the execution to be {status}"), WAIT, || async {
        server.store().execution(run).await.ok().flatten().filter(|row| row.status == status)
    })
    .await
}

async fn events(server: &TestServer, run: ExecutionId) -> Vec<EventRow> {
    server.store().events_after(run, 0, i64::MAX).await.expect("events")
}

/// The `turn_status` data, in order.
async fn turn_statuses(server: &TestServer, run: ExecutionId) -> Vec<Value> {
    events(server, run)
        .await
        .into_iter()
        .filter(|e| e.event.event_type() == EventType::TurnStatus)
        .map(|e| e.event.data())
        .collect()
}

/// The position of the first event of `event_type` whose data matches `pick`.
fn position(events: &[EventRow], event_type: EventType, pick: impl Fn(&Value) -> bool) -> usize {
    events
        .iter()
        .position(|e| e.event.event_type() == event_type && pick(&e.event.data()))
        .unwrap_or_else(|| panic!("no {event_type} event as expected in {events:#?}"))
}

/// Takes the next offer, which must be `run`/`key`, and claims it; answers the claim token.
/// A second Agent with its own runner, whose turn on `model` parks one call (`probe`, allowed) on
/// that runner and holds one (`other`, asked): live clocks beside a paused execution's frozen ones.
/// Answers the execution and the runner's stream, which must stay open.
async fn live_clocks(server: &TestServer, timeout_ms: Option<u64>, model: &str) -> (ExecutionId, RawRunner) {
    let agent = server.agent("beside").await;
    let runner = server.runner("beside-worker").await;
    let raw = connect(server, &runner, timeout_ms).await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let rules = json!([{"tool": "probe", "verdict": "allow"}, {"tool": "other", "verdict": "ask"}]);
    let configuration = json!({"runner_executor_public_ids": [runner.id], "approval_mode": "rules",
        "approval_rules": rules, "default_model": model});
    let declared = http.declare(&json!({"configuration": configuration})).await;
    assert_eq!(declared.status, 200, "declared: {:?}", declared.body);
    let answer = http.post("/agent_api/v1/inputs", &json!({"text": "beside"})).await;
    assert_eq!(answer.status, 201, "admitted: {:?}", answer.body);
    let run = answer.body["execution_public_id"].as_str().expect("id").parse::<ExecutionId>().expect("uuid");
    server.task_in(run, "r1t0", TaskStatus::Dispatched).await;
    server.task_in(run, "r1t1", TaskStatus::NeedsApproval).await;
    (run, raw)
}

/// Waits until both live clocks of [`live_clocks`]' execution ran out: time has passed for
/// every timer of the server.
async fn live_clocks_ran_out(server: &TestServer, run: ExecutionId) {
    server.task_in(run, "r1t0", TaskStatus::TimedOut).await;
    server.task_in(run, "r1t1", TaskStatus::TimedOut).await;
}

async fn claim_next(raw: &mut RawRunner, run: ExecutionId, key: &str) -> String {
    let work = raw.next_work(WAIT).await.expect("work offered");
    assert_eq!((work.run_public_id.as_str(), work.task_key.as_str()), (run.to_string().as_str(), key));
    let (token, _) = raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claim granted");
    token
}

async fn commit(raw: &RawRunner, run: ExecutionId, key: &str, token: &str, content: &str) {
    let committed = raw.commit(&run.to_string(), key, token, &json!({"content": content})).await;
    assert_eq!(committed.committed().map(|c| c.1), Some("completed".to_owned()), "{committed:?}");
}

/// A local model server on the OpenAI wire whose first request never answers (a model call held
/// open) and whose later requests answer `asked again`. It counts the requests it got.
struct HeldModel {
    base_url: String,
    requests: Arc<Mutex<usize>>,
    serve: tokio::task::JoinHandle<()>,
}

impl Drop for HeldModel {
    fn drop(&mut self) {
        self.serve.abort();
    }
}

impl HeldModel {
    async fn start() -> HeldModel {
        let requests: Arc<Mutex<usize>> = Arc::default();
        let counter = requests.clone();
        let app = Router::new().route(
            "/v1/chat/completions",
            post(move |_body: String| {
                let counter = counter.clone();
                async move {
                    let nth = {
                        let mut count = counter.lock().expect("count");
                        *count += 1;
                        *count
                    };
                    if nth == 1 {
                        std::future::pending::<()>().await;
                    }
                    axum::Json(json!({"id": "held", "object": "chat.completion", "choices": [{"index": 0,
                        "message": {"role": "assistant", "content": "asked again"}, "finish_reason": "stop"}]}))
                }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let base_url = format!("http://{}/v1", listener.local_addr().expect("address"));
        let serve = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        HeldModel { base_url, requests, serve }
    }

    fn count(&self) -> usize {
        *self.requests.lock().expect("count")
    }
}

fn openai_provider(base_url: &str) -> ProviderConfig {
    ProviderConfig {
        base_url: Some(base_url.to_owned()),
        allow_any_model: true,
        ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
    }
}

#[tokio::test]
async fn a_graceful_pause_records_finished_work_and_starts_no_round_until_resume() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}]},
        {"final": "got {{tool:p}}"},
    ]});
    let mut f = Fixture::start(&[("pause", script)], None).await;
    f.declare_tools("scripted/pause", "bypass", Value::Null).await;
    let run = f.turn("probe it").await;
    f.server.task_in(run, "r1t0", TaskStatus::Dispatched).await;
    let http = f.http();

    let paused = http.post(&door(run, "pause"), &json!({})).await;
    assert_eq!((paused.status, paused.body["status"].as_str()), (200, Some("paused")), "{:?}", paused.body);
    let statuses = turn_statuses(&f.server, run).await;
    let pause = statuses.last().expect("a turn_status");
    assert_eq!((pause["status"].as_str(), pause["force"].as_bool()), (Some("paused"), Some(false)));

    // Work already dispatched still runs, and its result is recorded.
    let token = claim_next(&mut f.raw, run, "r1t0").await;
    commit(&f.raw, run, "r1t0", &token, "pong").await;
    let all = wait_until("the settlement's narration", WAIT, || async {
        let all = events(&f.server, run).await;
        all.iter()
            .any(|e| e.event.event_type() == EventType::TaskStatus && e.event.data()["status"] == "completed")
            .then_some(all)
    })
    .await;
    // The refusal goes through the actor after the settlement: nothing new was scheduled.
    let again = http.post(&door(run, "pause"), &json!({"force": true})).await;
    assert_eq!((again.status, again.code()), (409, Some("not_pausable")));
    let paused_row = row(&f.server, run).await;
    assert_eq!((paused_row.status, paused_row.round), (RunStatus::Paused, 1), "no new round while paused");
    assert_eq!(all.iter().filter(|e| e.event.event_type() == EventType::RoundStarted).count(), 1);

    let resumed = http.send(reqwest::Method::POST, &door(run, "resume"), None).await;
    assert_eq!(resumed.status, 200, "{:?}", resumed.body);
    assert_ne!(resumed.body["status"], "paused");
    let done = status_is(&f.server, run, RunStatus::Completed).await;
    assert_eq!(done.final_text.as_deref(), Some("got pong"));
    let all = events(&f.server, run).await;
    let resume_at = position(&all, EventType::TurnStatus, |d| d["resumed"] == true);
    let settled_at = position(&all, EventType::TaskStatus, |d| d["status"] == "completed");
    let round_two = position(&all, EventType::RoundStarted, |d| d["round"] == 2);
    assert!(settled_at < resume_at && resume_at < round_two, "paused work settles, then resume, then round 2");
    let again = http.post(&door(run, "resume"), &json!({})).await;
    assert_eq!((again.status, again.code()), (409, Some("not_paused")));
}

#[tokio::test]
async fn a_forced_pause_aborts_the_model_call_and_resume_asks_again_under_a_new_round() {
    let model = HeldModel::start().await;
    let base_url = model.base_url.clone();
    let server = TestServer::start_with(&[], move |config| {
        config.providers.providers.insert("held".into(), openai_provider(&base_url));
    })
    .await;
    let agent = server.agent("agent").await;
    let mut client = agent_client(&server).await;
    let body = json!({"configuration": {"default_model": "held/m"}});
    client
        .declare_profile(authed(DeclareProfileRequest { body_json: body.to_string() }, &agent))
        .await
        .expect("declared");
    let request = CreateInputRequest { text: "think".into(), ..CreateInputRequest::default() };
    let created = client.create_input(authed(request, &agent)).await.expect("admitted").into_inner();
    let run: ExecutionId = created.execution_public_id.parse().expect("uuid");
    wait_until("the model call", WAIT, || async { (model.count() == 1).then_some(()) }).await;

    let pause = PauseExecutionRequest { execution_public_id: run.to_string(), force: true };
    let paused = client.pause_execution(authed(pause, &agent)).await.expect("paused").into_inner();
    assert_eq!(paused.status, "paused");
    let statuses = turn_statuses(&server, run).await;
    let pause = statuses.last().expect("turn_status");
    assert_eq!(
        (pause["status"].as_str(), pause["force"].as_bool(), pause["aborted_round"].as_i64()),
        (Some("paused"), Some(true), Some(1))
    );
    assert_eq!(model.count(), 1, "nothing is asked while paused");

    let resume = ResumeExecutionRequest { execution_public_id: run.to_string() };
    let resumed = client.resume_execution(authed(resume, &agent)).await.expect("resumed").into_inner();
    assert_ne!(resumed.status, "paused");
    let done = status_is(&server, run, RunStatus::Completed).await;
    assert_eq!(done.final_text.as_deref(), Some("asked again"));
    assert_eq!(model.count(), 2, "the aborted call was asked again once");
    let rounds: Vec<i64> = events(&server, run)
        .await
        .iter()
        .filter(|e| e.event.event_type() == EventType::RoundStarted)
        .filter_map(|e| e.event.data()["round"].as_i64())
        .collect();
    assert_eq!(rounds, [1, 2], "the call is asked again under a new round number");
    assert_eq!(done.round, 2);
}

#[tokio::test]
async fn resume_moves_open_deadlines_and_holds_forward_by_the_paused_time() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}, {"id": "o", "name": "other", "arguments": {}}]},
        {"final": "{{tool:p}} {{tool:o}}"},
    ]});
    // Short clocks: without the freeze, both would run out during the pause.
    let mut f = Fixture::start_with(&[("clocks", script)], Some(3_000), |config| {
        config.execution.approval_hold_ms = 3_000;
    })
    .await;
    let rules = json!([{"tool": "probe", "verdict": "allow"}, {"tool": "other", "verdict": "ask"}]);
    f.declare_tools("scripted/clocks", "rules", rules).await;
    let run = f.turn("both").await;
    let dispatched = f.server.task_in(run, "r1t0", TaskStatus::Dispatched).await;
    let parked = f.server.task_in(run, "r1t1", TaskStatus::NeedsApproval).await;
    let http = f.http();

    let paused = http.send(reqwest::Method::POST, &door(run, "pause"), None).await;
    assert_eq!(paused.body["status"], "paused", "{:?}", paused.body);
    // The pause answers once every clock is frozen, the runner's inbox included: its answer
    // already shows no deadline and what is left.
    let tasks = paused.body["tasks"].as_array().expect("tasks");
    assert!(tasks.iter().all(|t| t["deadline_at"].is_null() && t["frozen_remaining_ms"].is_i64()), "{tasks:?}");
    let frozen = f.server.store().task(run, key("r1t0")).await.expect("store").expect("task");
    assert!(is_frozen(frozen.deadline_at), "the runner task's clock is frozen when the pause answers");
    assert!(frozen.deadline_at <= FROZEN_EPOCH_MS + 3_000, "what is left is at most the park");
    let hold = f.server.store().task(run, key("r1t1")).await.expect("store").expect("task");
    assert!(is_frozen(hold.deadline_at), "the approval hold is frozen");
    let view = http.get(&format!("/agent_api/v1/executions/{run}")).await;
    let tasks = view.body["tasks"].as_array().expect("tasks");
    assert!(tasks.iter().all(|t| t["deadline_at"].is_null() && t["frozen_remaining_ms"].is_i64()), "{tasks:?}");
    // Longer than either clock had: the live clocks of an execution beside it run out, the frozen
    // ones stay.
    let (beside, _beside_runner) = live_clocks(&f.server, f.timeout_ms, "scripted/clocks").await;
    f.server.clock().advance(Duration::from_millis(3_300));
    live_clocks_ran_out(&f.server, beside).await;
    assert_eq!(f.server.task_in(run, "r1t0", TaskStatus::Dispatched).await.deadline_at, frozen.deadline_at);
    f.server.task_in(run, "r1t1", TaskStatus::NeedsApproval).await;

    let resumed = http.send(reqwest::Method::POST, &door(run, "resume"), None).await;
    assert_eq!(resumed.status, 200, "{:?}", resumed.body);
    let paused_ms =
        turn_statuses(&f.server, run).await.last().and_then(|d| d["paused_ms"].as_i64()).expect("paused_ms");
    assert!(paused_ms >= 3_300, "paused for {paused_ms} ms");
    let thawed = wait_until("the runner task's clock to thaw", WAIT, || async {
        f.server.store().task(run, key("r1t0")).await.ok().flatten().filter(|t| !is_frozen(t.deadline_at))
    })
    .await;
    assert_eq!(thawed.deadline_at - dispatched.deadline_at, paused_ms, "moved by exactly the paused time");
    let hold = f.server.store().task(run, key("r1t1")).await.expect("store").expect("task");
    assert_eq!(hold.deadline_at - parked.deadline_at, paused_ms, "the hold moved by the paused time");

    let token = claim_next(&mut f.raw, run, "r1t0").await;
    commit(&f.raw, run, "r1t0", &token, "a").await;
    let approved = http.post(&format!("/agent_api/v1/executions/{run}/tasks/r1t1/approve"), &json!({})).await;
    assert_eq!(approved.body["status"], "dispatched", "{:?}", approved.body);
    let token = claim_next(&mut f.raw, run, "r1t1").await;
    commit(&f.raw, run, "r1t1", &token, "b").await;
    assert_eq!(status_is(&f.server, run, RunStatus::Completed).await.final_text.as_deref(), Some("a b"));
}

#[tokio::test]
async fn a_claimant_cannot_extend_a_frozen_deadline_and_can_once_resumed() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}]},
        {"final": "extended: {{tool:p}}"},
    ]});
    let mut f = Fixture::start(&[("extend", script)], Some(60_000)).await;
    f.declare_tools("scripted/extend", "bypass", Value::Null).await;
    let run = f.turn("hold").await;
    let token = claim_next(&mut f.raw, run, "r1t0").await;
    let paused = f.http().send(reqwest::Method::POST, &door(run, "pause"), None).await;
    assert_eq!(paused.body["status"], "paused", "{:?}", paused.body);
    let frozen = wait_until("the claimed task's clock to freeze", WAIT, || async {
        f.server.store().task(run, key("r1t0")).await.ok().flatten().filter(|t| is_frozen(t.deadline_at))
    })
    .await;
    let refused = f.raw.extend(&run.to_string(), "r1t0", &token, 30_000).await;
    assert_eq!(refused.code(), Some("not_extendable"), "{refused:?}");
    let still = f.server.task(run, "r1t0").await.expect("task");
    assert_eq!(still.deadline_at, frozen.deadline_at, "a refused extension changes nothing");

    let resumed = f.http().send(reqwest::Method::POST, &door(run, "resume"), None).await;
    assert_eq!(resumed.status, 200, "{:?}", resumed.body);
    wait_until("the clock to thaw", WAIT, || async {
        f.server.store().task(run, key("r1t0")).await.ok().flatten().filter(|t| !is_frozen(t.deadline_at))
    })
    .await;
    let extended = f.raw.extend(&run.to_string(), "r1t0", &token, 30_000).await;
    let Reply::Frame(nexus_frame::Frame::Extended(extended)) = &extended else { panic!("{extended:?}") };
    assert!(!is_frozen(extended.deadline_at_ms));
    commit(&f.raw, run, "r1t0", &token, "yes").await;
    assert_eq!(status_is(&f.server, run, RunStatus::Completed).await.final_text.as_deref(), Some("extended: yes"));
}

#[tokio::test]
async fn a_task_settled_while_paused_shows_no_time_left() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}]},
        {"final": "settled: {{tool:p}}"},
    ]});
    let mut f = Fixture::start(&[("settle", script)], Some(60_000)).await;
    f.declare_tools("scripted/settle", "bypass", Value::Null).await;
    let run = f.turn("settle while paused").await;
    let token = claim_next(&mut f.raw, run, "r1t0").await;
    let paused = f.http().send(reqwest::Method::POST, &door(run, "pause"), None).await;
    assert_eq!(paused.body["status"], "paused", "{:?}", paused.body);
    wait_until("the claimed task's clock to freeze", WAIT, || async {
        f.server.store().task(run, key("r1t0")).await.ok().flatten().filter(|t| is_frozen(t.deadline_at))
    })
    .await;
    let view = f.http().get(&format!("/agent_api/v1/executions/{run}")).await;
    assert!(
        view.body["tasks"][0]["frozen_remaining_ms"].is_i64(),
        "an open task shows what it has left: {:?}",
        view.body
    );
    // Claimed work finishes during a pause; its frozen deadline is then nobody's time.
    commit(&f.raw, run, "r1t0", &token, "done").await;
    f.server.task_in(run, "r1t0", TaskStatus::Completed).await;
    let view = f.http().get(&format!("/agent_api/v1/executions/{run}")).await;
    let task = &view.body["tasks"][0];
    assert_eq!(
        (task["status"].as_str(), &task["deadline_at"], &task["frozen_remaining_ms"]),
        (Some("completed"), &Value::Null, &Value::Null),
        "{task}"
    );
    let resumed = f.http().send(reqwest::Method::POST, &door(run, "resume"), None).await;
    assert_eq!(resumed.status, 200, "{:?}", resumed.body);
    assert_eq!(status_is(&f.server, run, RunStatus::Completed).await.final_text.as_deref(), Some("settled: done"));
}

#[tokio::test]
async fn a_nexus_restart_while_paused_stays_paused_with_its_clocks_frozen() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}]},
        {"final": "after restart: {{tool:p}}"},
    ]});
    let beside = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}, {"id": "o", "name": "other", "arguments": {}}]},
        {"final": "beside"},
    ]});
    let scripts = [("restart", script), ("beside", beside)];
    let f = Fixture::start_with(&scripts, Some(3_000), |config| config.execution.approval_hold_ms = 3_000).await;
    f.declare_tools("scripted/restart", "bypass", Value::Null).await;
    let run = f.turn("survive").await;
    f.server.task_in(run, "r1t0", TaskStatus::Dispatched).await;
    let paused = f.http().send(reqwest::Method::POST, &door(run, "pause"), None).await;
    assert_eq!(paused.body["status"], "paused", "{:?}", paused.body);
    wait_until("the clock to freeze", WAIT, || async {
        f.server.store().task(run, key("r1t0")).await.ok().flatten().filter(|t| is_frozen(t.deadline_at))
    })
    .await;
    let Fixture { server, agent, runner, raw, timeout_ms } = f;
    drop(raw);

    // Stop nexus and start it again on the same store.
    let server = server.restart(&scripts).await;
    let mut raw = connect(&server, &runner, timeout_ms).await;

    assert_eq!(row(&server, run).await.status, RunStatus::Paused, "still paused after the restart");
    // Past the task's whole park: its clock stays frozen while live ones beside it run out.
    let (beside, _beside_runner) = live_clocks(&server, timeout_ms, "scripted/beside").await;
    server.clock().advance(Duration::from_millis(3_300));
    live_clocks_ran_out(&server, beside).await;
    let still = server.task_in(run, "r1t0", TaskStatus::Dispatched).await;
    assert!(is_frozen(still.deadline_at));
    assert_eq!(row(&server, run).await.status, RunStatus::Paused);

    let mut client = agent_client(&server).await;
    let resume = ResumeExecutionRequest { execution_public_id: run.to_string() };
    client.resume_execution(authed(resume, &agent)).await.expect("resumed");
    let token = claim_next(&mut raw, run, "r1t0").await;
    commit(&raw, run, "r1t0", &token, "here").await;
    assert_eq!(status_is(&server, run, RunStatus::Completed).await.final_text.as_deref(), Some("after restart: here"));
}

#[tokio::test]
async fn a_forced_stop_drains_through_canceling_and_the_claimant_hears_of_it() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}, {"id": "o", "name": "other", "arguments": {}}]},
        {"final": "never"},
    ]});
    let mut f = Fixture::start(&[("force", script)], None).await;
    let rules = json!([{"tool": "probe", "verdict": "allow"}, {"tool": "other", "verdict": "ask"}]);
    f.declare_tools("scripted/force", "rules", rules).await;
    let run = f.turn("hold on").await;
    f.server.task_in(run, "r1t1", TaskStatus::NeedsApproval).await;
    let token = claim_next(&mut f.raw, run, "r1t0").await;

    // No body: a stop is forced by default, and the door answers once the drain has ended.
    let stopped = f.http().send(reqwest::Method::POST, &door(run, "stop"), None).await;
    assert_eq!(stopped.status, 200, "{:?}", stopped.body);
    assert_eq!(
        (stopped.body["status"].as_str(), stopped.body["error_key"].as_str()),
        (Some("canceled"), Some("run_canceled"))
    );
    let canceled = loop {
        match f.raw.next_push(WAIT).await.expect("a push") {
            nexus_frame::Frame::WorkCanceled(canceled) => break canceled,
            _ => continue,
        }
    };
    assert_eq!((canceled.run_public_id.as_str(), canceled.task_key.as_str()), (run.to_string().as_str(), "r1t0"));
    for key in ["r1t0", "r1t1"] {
        let task = f.server.task(run, key).await.expect("task");
        assert_eq!((task.status, task.error_key.as_deref()), (TaskStatus::Canceled, Some("task_canceled")), "{key}");
    }
    // A late commit of the canceled claim is an idle success; nothing changes.
    let late = f.raw.commit(&run.to_string(), "r1t0", &token, &json!({"content": "too late"})).await;
    assert_eq!(late.committed(), Some((true, "canceled".to_owned())));

    let all = events(&f.server, run).await;
    let canceling = position(&all, EventType::TurnStatus, |d| d["status"] == "canceling");
    assert_eq!(all[canceling].event.data()["force"], true);
    assert_eq!(all[canceling].event.data()["draining"], json!(["r1t0"]), "only the runner's task drains");
    let drained = position(&all, EventType::TaskStatus, |d| d["task_key"] == "r1t0" && d["status"] == "canceled");
    let ended = position(&all, EventType::TurnStatus, |d| d["status"] == "canceled");
    assert!(canceling < drained && drained < ended, "canceling, then the claim settles, then canceled");
    assert!(!all.iter().any(|e| e.event.event_type() == EventType::RoundStarted && e.event.data()["round"] == 2));
    // Stopping again answers the execution as it is.
    let again = f.http().post(&door(run, "stop"), &json!({"force": false})).await;
    assert_eq!((again.status, again.body["status"].as_str()), (200, Some("canceled")));
}

#[tokio::test]
async fn a_graceful_stop_lets_the_dispatched_task_finish_and_asks_the_model_nothing() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}]},
        {"final": "never"},
    ]});
    let mut f = Fixture::start(&[("graceful", script)], None).await;
    f.declare_tools("scripted/graceful", "bypass", Value::Null).await;
    let run = f.turn("finish it").await;
    let token = claim_next(&mut f.raw, run, "r1t0").await;

    let mut client = agent_client(&f.server).await;
    let stop = StopExecutionRequest { execution_public_id: run.to_string(), force: Some(false) };
    let stopping = client.stop_execution(authed(stop, &f.agent)).await.expect("stopping").into_inner();
    assert_eq!(stopping.status, "canceling");
    assert_eq!(
        f.server.store().task(run, key("r1t0")).await.expect("store").expect("task").status,
        TaskStatus::Dispatched
    );

    commit(&f.raw, run, "r1t0", &token, "finished").await;
    let done = status_is(&f.server, run, RunStatus::Canceled).await;
    assert_eq!((done.error_key.as_deref(), done.final_text, done.round), (Some("run_canceled"), None, 1));
    let task = f.server.store().task(run, key("r1t0")).await.expect("store").expect("task");
    assert_eq!(task.status, TaskStatus::Completed, "the dispatched task finished");
    let all = events(&f.server, run).await;
    let canceling = position(&all, EventType::TurnStatus, |d| d["status"] == "canceling");
    assert_eq!(all[canceling].event.data()["force"], false);
    let finished = position(&all, EventType::TaskStatus, |d| d["task_key"] == "r1t0" && d["status"] == "completed");
    let ended = position(&all, EventType::TurnStatus, |d| d["status"] == "canceled");
    assert!(canceling < finished && finished < ended);
    assert_eq!(
        all.iter().filter(|e| e.event.event_type() == EventType::RoundStarted).count(),
        1,
        "no round after the stop"
    );
}

#[tokio::test]
async fn regeneration_reuses_the_frozen_declaration_after_a_profile_edit_or_takes_a_new_one() {
    let one = json!({"rounds": [{"final": "one: {{input}}"}]});
    let two = json!({"rounds": [{"final": "two: {{input}}"}]});
    let f = Fixture::start(&[("one", one), ("two", two)], None).await;
    let http = f.http();
    f.declare(json!({"default_model": "scripted/one"})).await;
    let original = f.turn("hi").await;
    let first = status_is(&f.server, original, RunStatus::Completed).await;
    assert_eq!(first.final_text.as_deref(), Some("one: hi"));
    let digest = first.declaration.as_ref().map(|d| d["digest"].clone()).expect("frozen");

    // The profile moves on; the regeneration keeps what the original froze.
    f.declare(json!({"default_model": "scripted/two"})).await;
    let again = http.post(&door(original, "regenerate"), &json!({})).await;
    assert_eq!(again.status, 201, "{:?}", again.body);
    assert_eq!(
        (again.body["regenerated_from"].clone(), again.body["declaration"].as_str()),
        (json!(original), Some("reused"))
    );
    assert_eq!(again.body["declaration_digest"], digest);
    let reused = again.body["execution_public_id"].as_str().expect("id").parse::<ExecutionId>().expect("uuid");
    assert_ne!(reused, original);
    let second = status_is(&f.server, reused, RunStatus::Completed).await;
    assert_eq!(second.final_text.as_deref(), Some("one: hi"), "the frozen model answers");
    assert_eq!(
        (second.input_public_id, second.declaration.map(|d| d["digest"].clone())),
        (first.input_public_id, Some(digest.clone()))
    );
    let opening = turn_statuses(&f.server, reused).await;
    assert_eq!(
        (opening[0]["status"].as_str(), opening[0]["regenerated_from"].clone()),
        (Some("pending"), json!(original))
    );
    // A fresh input does see the edit.
    let fresh = f.turn("hi").await;
    assert_eq!(status_is(&f.server, fresh, RunStatus::Completed).await.final_text.as_deref(), Some("two: hi"));

    // Admission stores an inline declaration as authored; materialization freezes it, not the
    // standing profile (which now names `two`).
    let authored = json!({"default_model": "scripted/one", "approval_mode": "bypass"});
    let admitted =
        http.post("/agent_api/v1/inputs", &json!({"text": "inline", "execution_declaration": authored})).await;
    assert_eq!(admitted.status, 201, "{:?}", admitted.body);
    let inline = admitted.body["execution_public_id"].as_str().expect("id").parse::<ExecutionId>().expect("uuid");
    let input: nexus_proto::InputId = admitted.body["input_public_id"].as_str().expect("id").parse().expect("uuid");
    let stored = f.server.store().input(input).await.expect("store").expect("input");
    assert_eq!(stored.execution_declaration, Some(authored));
    assert_eq!(status_is(&f.server, inline, RunStatus::Completed).await.final_text.as_deref(), Some("one: inline"));

    // A supplied declaration replaces the frozen one for the new execution (over gRPC).
    let mut client = agent_client(&f.server).await;
    let request = RegenerateExecutionRequest {
        execution_public_id: original.to_string(),
        execution_declaration_json: json!({"default_model": "scripted/two"}).to_string(),
    };
    let reply = client.regenerate_execution(authed(request, &f.agent)).await.expect("regenerated").into_inner();
    assert!(reply.created);
    let body: Value = serde_json::from_str(&reply.body_json).expect("json");
    assert_eq!(body["declaration"], "replaced");
    assert_ne!(body["declaration_digest"], digest);
    let replaced = body["execution_public_id"].as_str().expect("id").parse::<ExecutionId>().expect("uuid");
    assert_eq!(status_is(&f.server, replaced, RunStatus::Completed).await.final_text.as_deref(), Some("two: hi"));

    // A declaration refused at admission's grammar changes nothing.
    let before = f.server.store().fingerprint().await.expect("fingerprint");
    let bad = http
        .post(
            &door(original, "regenerate"),
            &json!({"execution_declaration": {"default_model": "scripted/one", "approval_mode": "never"}}),
        )
        .await;
    assert_eq!((bad.status, bad.code()), (422, Some("validation_failed")));
    assert!(bad.message().contains("execution_declaration.approval_mode"), "{}", bad.message());
    let bad = http.post(&door(original, "regenerate"), &json!(["x"])).await;
    assert_eq!((bad.status, bad.code()), (400, Some("parameter_missing")), "not an object");
    assert_eq!(f.server.store().fingerprint().await.expect("fingerprint"), before, "refusals write nothing");

    // An execution that never froze a declaration regenerates only with one supplied.
    let unserved = json!({"default_model": "scripted/one", "approval_mode": "bypass", "tool_definitions": [
        {"type": "function", "function": {"name": "gone", "description": "d", "parameters": {"type": "object"}},
         "route": {"kind": "runner", "runner_executor_public_id": f.runner.id, "tool_name": "not_served"}}]});
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "x", "execution_declaration": unserved})).await;
    assert_eq!(admitted.status, 201, "{:?}", admitted.body);
    let refused = admitted.body["execution_public_id"].as_str().expect("id").parse::<ExecutionId>().expect("uuid");
    let ended = status_is(&f.server, refused, RunStatus::Canceled).await;
    assert_eq!((ended.declaration, ended.error_key.as_deref()), (None, Some("tool_not_served")));
    let none = http.send(reqwest::Method::POST, &door(refused, "regenerate"), None).await;
    assert_eq!((none.status, none.code()), (409, Some("not_regenerable")));
    let some = http
        .post(&door(refused, "regenerate"), &json!({"execution_declaration": {"default_model": "scripted/one"}}))
        .await;
    assert_eq!(some.status, 201, "{:?}", some.body);
    let rescued = some.body["execution_public_id"].as_str().expect("id").parse::<ExecutionId>().expect("uuid");
    assert_eq!(status_is(&f.server, rescued, RunStatus::Completed).await.final_text.as_deref(), Some("one: x"));
}

#[tokio::test]
async fn the_context_estimate_compiles_the_next_round_and_writes_nothing() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}]},
        {"final": "seen {{tool:p}}"},
    ]});
    let mut f = Fixture::start(&[("estimate", script), ("two", json!({"rounds": [{"final": "x"}]}))], None).await;
    f.declare(json!({"runner_executor_public_ids": [f.runner.id], "approval_mode": "bypass",
        "default_model": "scripted/estimate"}))
        .await;
    let run = f.turn("measure me").await;
    let token = claim_next(&mut f.raw, run, "r1t0").await;
    commit(&f.raw, run, "r1t0", &token, "pong").await;
    let done = status_is(&f.server, run, RunStatus::Completed).await;
    // Quiet from here on: no runner stream touches the store.
    drop(f.raw);
    wait_until("the runner's stream to close", WAIT, || async {
        f.server.store().executor(f.runner.runner()).await.ok().flatten().filter(|r| r.connected_at.is_none())
    })
    .await;
    let http = Http::new(&f.server.url(), Some(&f.agent.token));
    wait_until("the finished execution's actor to stop", WAIT, || async {
        let census = f.server.server.api.root.census().await.ok()?;
        (census.executions == 0).then_some(())
    })
    .await;
    let before = f.server.store().fingerprint().await.expect("fingerprint");

    let estimate = http.get(&door(run, "estimate")).await;
    assert_eq!(estimate.status, 200, "{:?}", estimate.body);
    let body = &estimate.body;
    assert_eq!(body["declaration"], "frozen");
    assert_eq!(body["declaration_digest"], done.declaration.as_ref().expect("frozen")["digest"]);
    assert_eq!(body["model"], "scripted/estimate");
    let transcript_len = done.transcript.as_array().expect("transcript").len();
    assert_eq!(body["messages"], json!(transcript_len), "user, call, result, answer");
    assert_eq!(body["tools"], json!(3), "probe, other and review");
    let total = body["bytes"]["total"].as_u64().expect("total bytes");
    assert!(total > body["bytes"]["tools"].as_u64().expect("tool bytes"));
    assert!(body["bytes"]["transcript"].as_u64().expect("transcript bytes") > 0);
    assert_eq!(body["bytes"]["documents"], 0, "no system prompt was declared");
    assert_eq!(body["estimated_tokens"]["total"], json!(total.div_ceil(4)));
    assert_eq!(
        (body["estimator"]["method"].as_str(), body["estimator"]["exact"].as_bool()),
        (Some("utf8_bytes_div_4"), Some(false))
    );

    // Under a supplied declaration: its system prompt and its (absent) tools.
    let supplied = json!({"execution_declaration": {"default_model": "scripted/two",
        "system_prompt": {"content": "Answer in one word."}}});
    let other = http.post(&door(run, "estimate"), &supplied).await;
    assert_eq!(other.status, 200, "{:?}", other.body);
    assert_eq!(
        (other.body["declaration"].as_str(), other.body["model"].as_str()),
        (Some("supplied"), Some("scripted/two"))
    );
    assert_eq!(other.body["tools"], 0);
    assert!(other.body["bytes"]["documents"].as_u64().expect("documents") > 0);
    assert_eq!(other.body["messages"], json!(transcript_len + 1));

    let mut client = agent_client(&f.server).await;
    let request =
        EstimateContextRequest { execution_public_id: run.to_string(), execution_declaration_json: String::new() };
    let reply = client.estimate_context(authed(request, &f.agent)).await.expect("estimated").into_inner();
    let grpc: Value = serde_json::from_str(&reply.body_json).expect("json");
    assert_eq!(grpc["bytes"], body["bytes"], "both doors compile the same request");
    let bad = http.post(&door(run, "estimate"), &json!({"execution_declaration": {"approval_mode": "never"}})).await;
    assert_eq!((bad.status, bad.code()), (422, Some("validation_failed")));

    assert_eq!(f.server.store().fingerprint().await.expect("fingerprint"), before, "the estimate wrote nothing");
    assert_eq!(f.server.server.api.root.census().await.expect("census").executions, 0, "and started no actor");
}

#[tokio::test]
async fn a_profile_edit_during_a_running_execution_changes_none_of_its_tools_rules_hooks_or_models() {
    let fake = FakeProvider::start().await;
    let base_url = fake.openai_base_url();
    let mut f = Fixture::start_with(&[], None, move |config| {
        config.providers.providers.insert("fake".into(), openai_provider(&base_url));
    })
    .await;
    fake.script(
        "m1",
        [
            Act::ToolCalls(vec![("c1".into(), "probe".into(), json!({}))]),
            Act::ToolCalls(vec![("c2".into(), "probe".into(), json!({}))]),
            Act::Text("done".into()),
        ],
    );
    f.declare(json!({"runner_executor_public_ids": [f.runner.id], "runner_tool_names": ["probe"],
        "approval_mode": "rules", "approval_rules": [{"tool": "probe", "verdict": "allow"}],
        "default_model": "fake/m1", "fallback_models": []}))
        .await;
    let run = f.turn("probe twice").await;
    let token = claim_next(&mut f.raw, run, "r1t0").await;
    let frozen = row(&f.server, run).await.declaration.expect("frozen");

    // Between the rounds the profile changes every field the execution froze.
    f.declare(json!({"runner_executor_public_ids": [f.runner.id], "runner_tool_names": ["other"],
        "approval_mode": "rules", "approval_rules": [{"tool": "probe", "verdict": "deny"}],
        "lifecycle_hooks": {"turn_start": {"tool": "review", "timeout_ms": 1000}},
        "default_model": "fake/m2", "fallback_models": ["fake/m3"]}))
        .await;
    commit(&f.raw, run, "r1t0", &token, "first").await;
    // Round 2 runs on the frozen declaration: the same model and tools, the rule that allowed.
    let token = claim_next(&mut f.raw, run, "r2t0").await;
    commit(&f.raw, run, "r2t0", &token, "second").await;
    let done = status_is(&f.server, run, RunStatus::Completed).await;
    assert_eq!(done.final_text.as_deref(), Some("done"));

    assert_eq!(done.declaration.as_ref(), Some(&frozen), "the frozen declaration never changed");
    assert_eq!(frozen["default_model"], "fake/m1");
    assert_eq!(frozen["lifecycle_hooks"], Value::Null);
    let asked = fake.requests_for("m1");
    assert_eq!(asked.len(), 3, "every round asked the frozen model");
    for request in &asked {
        let tools: Vec<&str> = request.body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        assert_eq!(tools, ["probe"], "every round offered the frozen tools");
    }
    assert_eq!((fake.count("m2"), fake.count("m3")), (0, 0), "the edited models were never asked");
    let second = f.server.store().task(run, key("r2t0")).await.expect("store").expect("task");
    assert_eq!(second.status, TaskStatus::Completed, "the frozen allow rule granted the call the edit denies");
    assert_eq!(second.approval.as_ref().map(|a| a["origin"].clone()), Some(json!("rule")));
    let keys: Vec<String> =
        f.server.store().tasks_of(run).await.expect("tasks").into_iter().map(|t| t.task_key.to_string()).collect();
    assert_eq!(keys, ["r1t0", "r2t0"], "no hook of the edit ran");

    // The edit reaches the next materialization.
    let next = f.turn("again").await;
    let materialized = wait_until("the next execution to materialize", WAIT, || async {
        let all = f.server.store().events_after(next, 0, i64::MAX).await.ok()?;
        all.into_iter().find(|e| e.event.event_type() == EventType::InputMaterialized).map(|e| e.event.data())
    })
    .await;
    assert_eq!(materialized["default_model"], "fake/m2");
    let names: Vec<&str> =
        materialized["tools"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["other"]);
}

#[tokio::test]
async fn the_control_doors_refuse_with_their_words() {
    let script = json!({"rounds": [{"final": "done"}]});
    let f = Fixture::start(&[("words", script)], None).await;
    f.declare(json!({"default_model": "scripted/words"})).await;
    let run = f.turn("hi").await;
    status_is(&f.server, run, RunStatus::Completed).await;
    let http = f.http();

    let paused = http.post(&door(run, "pause"), &json!({})).await;
    assert_eq!((paused.status, paused.code()), (409, Some("not_pausable")));
    let resumed = http.post(&door(run, "resume"), &json!({})).await;
    assert_eq!((resumed.status, resumed.code()), (409, Some("not_paused")));
    let stopped = http.post(&door(run, "stop"), &json!({})).await;
    assert_eq!(
        (stopped.status, stopped.body["status"].as_str()),
        (200, Some("completed")),
        "a finished run is as it is"
    );
    let rows = [
        ("pause", json!({"force": "yes"})),
        ("stop", json!({"force": 1})),
        // A misspelled field is refused, never ignored (it would stop by force, or reuse the
        // frozen declaration).
        ("stop", json!({"forse": false})),
        ("pause", json!({"force": true, "why": "x"})),
        ("regenerate", json!({"execution_declaraton": {"default_model": "scripted/words"}})),
        ("estimate", json!({"execution_declaraton": {}})),
    ];
    for (verb, body) in rows {
        let bad = http.post(&door(run, verb), &body).await;
        assert_eq!((bad.status, bad.code()), (400, Some("parameter_invalid")), "{verb} {body}");
    }
    // A body that is not an object has every door's word for it.
    let bad = http.post(&door(run, "resume"), &json!([1])).await;
    assert_eq!((bad.status, bad.code()), (400, Some("parameter_missing")));
    let stranger = Http::new(&f.server.url(), Some(&f.server.agent("stranger").await.token));
    for verb in ["pause", "resume", "stop", "regenerate", "estimate"] {
        for (who, id) in [(&http, Uuid::new_v4().to_string()), (&stranger, run.to_string())] {
            let answer = who.post(&format!("/agent_api/v1/executions/{id}/{verb}"), &json!({})).await;
            assert_eq!((answer.status, answer.code()), (404, Some("not_found")), "{verb} {id}");
        }
        // A malformed id is bad input, as on the read doors and the gRPC twins.
        let answer = http.post(&format!("/agent_api/v1/executions/not-a-uuid/{verb}"), &json!({})).await;
        assert_eq!((answer.status, answer.code()), (400, Some("parameter_invalid")), "{verb}");
        // A literal `null` body is not "no body": it is refused and changes nothing.
        let answer = http.send(reqwest::Method::POST, &door(run, verb), Some("null".into())).await;
        assert_eq!((answer.status, answer.code()), (400, Some("parameter_missing")), "{verb} null");
    }

    let mut client = agent_client(&f.server).await;
    // A malformed id is bad input on every gRPC twin too, never an unknown execution.
    let bad = "not-a-uuid".to_owned();
    let decision =
        || TaskDecisionRequest { execution_public_id: bad.clone(), task_key: "r1t0".into(), body_json: String::new() };
    let answers = [
        (
            "pause",
            client
                .pause_execution(authed(
                    PauseExecutionRequest { execution_public_id: bad.clone(), force: false },
                    &f.agent,
                ))
                .await
                .map(|_| ()),
        ),
        (
            "resume",
            client
                .resume_execution(authed(ResumeExecutionRequest { execution_public_id: bad.clone() }, &f.agent))
                .await
                .map(|_| ()),
        ),
        (
            "stop",
            client
                .stop_execution(authed(
                    StopExecutionRequest { execution_public_id: bad.clone(), force: Some(true) },
                    &f.agent,
                ))
                .await
                .map(|_| ()),
        ),
        (
            "regenerate",
            client
                .regenerate_execution(authed(
                    RegenerateExecutionRequest {
                        execution_public_id: bad.clone(),
                        execution_declaration_json: String::new(),
                    },
                    &f.agent,
                ))
                .await
                .map(|_| ()),
        ),
        (
            "estimate",
            client
                .estimate_context(authed(
                    EstimateContextRequest {
                        execution_public_id: bad.clone(),
                        execution_declaration_json: String::new(),
                    },
                    &f.agent,
                ))
                .await
                .map(|_| ()),
        ),
        ("approve", client.approve_task(authed(decision(), &f.agent)).await.map(|_| ())),
        ("deny", client.deny_task(authed(decision(), &f.agent)).await.map(|_| ())),
        ("retry", client.retry_task(authed(decision(), &f.agent)).await.map(|_| ())),
        ("abandon", client.abandon_task(authed(decision(), &f.agent)).await.map(|_| ())),
        (
            "compact",
            client
                .compact_execution(authed(CompactExecutionRequest { execution_public_id: bad.clone() }, &f.agent))
                .await
                .map(|_| ()),
        ),
    ];
    for (door, answer) in answers {
        let status = answer.expect_err("refused");
        assert_eq!(Refusal::from_status(&status).code, ErrorCode::ParameterInvalid, "{door}");
    }
    let status = client
        .pause_execution(authed(PauseExecutionRequest { execution_public_id: run.to_string(), force: false }, &f.agent))
        .await
        .expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NotPausable);
    let status = client
        .resume_execution(authed(ResumeExecutionRequest { execution_public_id: run.to_string() }, &f.agent))
        .await
        .expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NotPaused);
    let status = client
        .regenerate_execution(authed(
            RegenerateExecutionRequest { execution_public_id: run.to_string(), execution_declaration_json: "{".into() },
            &f.agent,
        ))
        .await
        .expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::ParameterMissing, "not JSON");
}
