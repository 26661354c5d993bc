//! The approval stage end to end (`docs/executions.md`, "Approval"): a real server, a scripted
//! model, a raw runner that claims only what it is offered, and the approve and deny doors on
//! HTTP and gRPC.

use nexus_actors::store::EventType;
use nexus_proto::{ErrorCode, ExecutionId, RunStatus, TaskStatus};
use nexus_tests::key;
use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::store::EventRow;
use nexus_proto::Refusal;
use nexus_proto::agent::v1::{CreateInputRequest, DeclareProfileRequest, TaskDecisionRequest};
use nexus_tests::{Http, Minted, RawRunner, TestServer, agent_client, authed, wait_until};

const WAIT: Duration = Duration::from_secs(30);

const READ_ONLY: &str = r#"{"kind":"read_only","destructive":false,"effect_scope":"closed","idempotency":"intrinsic","reconciliation":"none"}"#;
const DESTRUCTIVE: &str =
    r#"{"kind":"write","destructive":true,"effect_scope":"open","idempotency":"none","reconciliation":"none"}"#;

fn denial(reason: &str) -> String {
    format!("<tool_use_error>This tool call was declined by the approver (approval_denied) {reason}</tool_use_error>")
}

fn tool(name: &str, effect: &str) -> Value {
    json!({"name": name, "description": format!("{name} as served."), "input_schema": {"type": "object"},
        "effect_profile": serde_json::from_str::<Value>(effect).expect("effect profile")})
}

/// A server, an Agent, and a raw runner announcing `probe`, `danger` and `other`.
struct Fixture {
    server: TestServer,
    agent: Minted,
    runner: Minted,
    raw: RawRunner,
}

impl Fixture {
    async fn start(scripts: &[(&str, Value)], hold_ms: Option<u64>) -> Fixture {
        let server = TestServer::start_with(scripts, |config| {
            if let Some(hold) = hold_ms {
                config.execution.approval_hold_ms = hold;
            }
        })
        .await;
        let agent = server.agent("agent").await;
        let runner = server.runner("worker").await;
        let raw = connect(&server, &runner, READ_ONLY).await;
        Fixture { server, agent, runner, raw }
    }

    /// Declares the standing profile: the runner's tools, `runners_list`, and the approval words.
    async fn declare(&self, model: &str, mode: &str, rules: Value) {
        let body = json!({"configuration": {
            "runner_executor_public_ids": [self.runner.id], "kernel_tools": ["nexus.runners.list"],
            "approval_mode": mode, "approval_rules": rules, "default_model": model,
        }});
        let mut client = agent_client(&self.server).await;
        client
            .declare_profile(authed(DeclareProfileRequest { body_json: body.to_string() }, &self.agent))
            .await
            .expect("declared");
    }

    /// Admits an input over gRPC and answers its execution.
    async fn turn(&self, text: &str) -> ExecutionId {
        let mut client = agent_client(&self.server).await;
        let request = CreateInputRequest { text: text.to_owned(), ..CreateInputRequest::default() };
        let id = client.create_input(authed(request, &self.agent)).await.expect("admitted").into_inner();
        id.execution_public_id.parse::<ExecutionId>().expect("uuid")
    }

    fn http(&self, member: &Minted) -> Http {
        Http::new(&self.server.url(), Some(&member.token))
    }
}

async fn connect(server: &TestServer, runner: &Minted, effect: &str) -> RawRunner {
    let tools = json!([tool("probe", effect), tool("danger", READ_ONLY), tool("other", READ_ONLY)]);
    RawRunner::connect_announced(&server.url(), runner, &json!({"tools": tools, "environment": {"name": "worker"}}))
        .await
}

fn decision(run: ExecutionId, task_key: &str, body: Value) -> TaskDecisionRequest {
    TaskDecisionRequest {
        execution_public_id: run.to_string(),
        task_key: task_key.to_owned(),
        body_json: body.to_string(),
    }
}

fn door(run: ExecutionId, task_key: &str, verb: &str) -> String {
    format!("/agent_api/v1/executions/{run}/tasks/{task_key}/{verb}")
}

/// Waits for the execution to complete and answers its final text.
async fn completed(server: &TestServer, run: ExecutionId) -> String {
    let row = wait_until("the execution to complete", WAIT, || async {
        server.store().execution(run).await.ok().flatten().filter(|row| row.status == RunStatus::Completed)
    })
    .await;
    row.final_text.unwrap_or_default()
}

async fn events(server: &TestServer, run: ExecutionId, event_type: EventType) -> Vec<Value> {
    let all: Vec<EventRow> = server.store().events_after(run, 0, 10_000).await.expect("events");
    all.into_iter().filter(|e| e.event.event_type() == event_type).map(|e| e.event.data()).collect()
}

/// Claims the offered task and commits `content`.
async fn serve_one(raw: &mut RawRunner, run: ExecutionId, key: &str, content: &str) {
    let work = raw.next_work(WAIT).await.expect("work offered");
    assert_eq!((work.run_public_id.as_str(), work.task_key.as_str()), (run.to_string().as_str(), key));
    let (token, row) = raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claim granted");
    assert_eq!(row["task_key"], key);
    let committed = raw.commit(&work.run_public_id, &work.task_key, &token, &json!({"content": content})).await;
    assert_eq!(committed.code(), None, "commit refused: {committed:?}");
}

#[tokio::test]
async fn ask_parks_both_calls_and_approval_over_http_runs_them() {
    let script = json!({"rounds": [
        {"tool_calls": [
            {"id": "p", "name": "probe", "arguments": {"command": "ls"}},
            {"id": "k", "name": "runners_list", "arguments": {}},
        ]},
        {"final": "probe={{tool:p}} runner={{tool:k.current_runner_executor_public_id}}"},
    ]});
    let mut f = Fixture::start(&[("ask", script)], None).await;
    f.declare("scripted/ask", "ask", Value::Null).await;
    let run = f.turn("look around").await;

    // Both calls park; the run stays running and says approval_required for each.
    let probe = f.server.task_in(run, "r1t0", TaskStatus::NeedsApproval).await;
    let kernel = f.server.task_in(run, "r1t1", TaskStatus::NeedsApproval).await;
    assert_eq!((probe.approval.clone(), probe.target_executor_public_id), (None, Some(f.runner.runner())));
    assert_eq!(kernel.target_executor_public_id, None, "runners_list runs in-process");
    let row = f.server.store().execution(run).await.expect("store").expect("execution");
    assert_eq!(row.status, RunStatus::Running);
    let required = events(&f.server, run, EventType::ApprovalRequired).await;
    let keys: Vec<&str> = required.iter().filter_map(|e| e["task_key"].as_str()).collect();
    assert_eq!(keys, ["r1t0", "r1t1"]);
    assert_eq!(required[0]["kind"], "approval");
    assert_eq!(required[0]["served_name"], "probe");
    assert_eq!(required[0]["effect_profile"]["kind"], "read_only");
    assert_eq!(required[0]["hold_until"], json!(probe.deadline_at));
    // A 24-hour hold by default.
    let hold = probe.deadline_at - probe.started_at;
    assert_eq!(hold, 86_400_000, "the default hold is 24 h");
    // The runner cannot take parked work.
    assert_eq!(f.raw.claim(&run.to_string(), "r1t0").await.code(), Some("task_not_claimable"));

    // Nobody but the owner decides; unknown executions and tasks are 404, and so is another
    // member's execution, with the message an unknown id gets: no stranger learns an id exists.
    let stranger = f.server.agent("stranger").await;
    let refused = f.http(&stranger).post(&door(run, "r1t0", "approve"), &json!({})).await;
    assert_eq!((refused.status, refused.code()), (404, Some("not_found")));
    assert_eq!(refused.message(), format!("no execution {run}"));
    let owner = f.http(&f.agent);
    let unknown = owner.post(&door(ExecutionId::new_v4(), "r1t0", "approve"), &json!({})).await;
    assert_eq!((unknown.status, unknown.code()), (404, Some("not_found")));
    let unknown = owner.post(&door(run, "r9t9", "approve"), &json!({})).await;
    assert_eq!((unknown.status, unknown.code()), (404, Some("not_found")));

    // Approving the kernel call runs it at once; the round still waits for the probe.
    let approved = owner.send(reqwest::Method::POST, &door(run, "r1t1", "approve"), None).await;
    assert_eq!(approved.status, 200, "{:?}", approved.body);
    assert_eq!(approved.body["status"], "completed");
    assert_eq!(approved.body["approval"]["origin"], "agent");
    assert_eq!(approved.body["approval"]["decided_by"], json!(f.agent.id));
    assert_eq!(f.server.store().execution(run).await.expect("store").expect("row").round, 1);

    let approved = owner.post(&door(run, "r1t0", "approve"), &json!({})).await;
    assert_eq!(approved.status, 200, "{:?}", approved.body);
    assert_eq!(approved.body["status"], "dispatched");
    serve_one(&mut f.raw, run, "r1t0", "pong").await;
    let text = completed(&f.server, run).await;
    assert_eq!(text, format!("probe=pong runner={}", f.runner.id));

    // The fact is on the task and in its task_status events.
    let probe = f.server.store().task(run, key("r1t0")).await.expect("store").expect("task");
    assert_eq!(probe.status, TaskStatus::Completed);
    assert_eq!(probe.approval.as_ref().map(|a| a["origin"].clone()), Some(json!("agent")));
    let statuses = events(&f.server, run, EventType::TaskStatus).await;
    let settled = statuses.iter().find(|e| e["task_key"] == "r1t0" && e["status"] == "completed").expect("settled");
    assert_eq!(settled["approval"]["decided_by"], json!(f.agent.id));

    // A decided task is not parked any more.
    let again = owner.post(&door(run, "r1t0", "approve"), &json!({})).await;
    assert_eq!((again.status, again.code()), (409, Some("not_awaiting_approval")));
    let again = owner.post(&door(run, "r1t1", "deny"), &json!({"reason": "late"})).await;
    assert_eq!((again.status, again.code()), (409, Some("not_awaiting_approval")));
}

#[tokio::test]
async fn a_denial_over_grpc_reaches_the_model_as_the_tool_use_error() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {"command": "rm -rf /tmp/x"}}]},
        {"final": "saw: {{tool:p}}"},
    ]});
    let f = Fixture::start(&[("deny", script)], None).await;
    f.declare("scripted/deny", "ask", json!([{"tool": "danger", "verdict": "deny"}])).await;
    let run = f.turn("clean up").await;
    f.server.task_in(run, "r1t0", TaskStatus::NeedsApproval).await;

    let mut client = agent_client(&f.server).await;
    let stranger = f.server.agent("stranger").await;
    let status = client.deny_task(authed(decision(run, "r1t0", json!({})), &stranger)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NotFound, "another member's execution is not found");
    let status =
        client.deny_task(authed(decision(run, "r1t0", json!({"reason": 3})), &f.agent)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::ParameterInvalid);
    // A misspelled field is refused, never ignored: the call stays parked.
    let status =
        client.deny_task(authed(decision(run, "r1t0", json!({"reasn": "no"})), &f.agent)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::ParameterInvalid);
    let status =
        client.approve_task(authed(decision(run, "r1t0", json!({"ok": true})), &f.agent)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::ParameterInvalid);
    f.server.task_in(run, "r1t0", TaskStatus::NeedsApproval).await;

    let reason = "not on this machine";
    let reply = client
        .deny_task(authed(decision(run, "r1t0", json!({"reason": reason})), &f.agent))
        .await
        .expect("denied")
        .into_inner();
    let task: Value = serde_json::from_str(&reply.body_json).expect("task json");
    assert_eq!((task["status"].as_str(), task["error_key"].as_str()), (Some("failed"), Some("approval_denied")));
    assert_eq!(task["approval"]["origin"], "agent");
    assert_eq!(task["result"]["error"]["detail"], reason);

    assert_eq!(completed(&f.server, run).await, format!("saw: {}", denial(reason)));
    // The runner never had the work.
    assert_eq!(f.raw.claim(&run.to_string(), "r1t0").await.code(), Some("task_not_claimable"));
    let status = client.approve_task(authed(decision(run, "r1t0", json!({})), &f.agent)).await.expect_err("settled");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NotAwaitingApproval);
}

#[tokio::test]
async fn rules_mode_allows_denies_and_refuses_the_unmatched_by_path_and_match() {
    let script = json!({"rounds": [
        {"tool_calls": [
            {"id": "a", "name": "probe", "arguments": {"command": "echo hi"}},
            {"id": "b", "name": "probe", "arguments": {"command": "echo x; rm -rf /"}},
            {"id": "c", "name": "other", "arguments": {}},
            {"id": "d", "name": "probe", "arguments": {"command": "ls"}},
            {"id": "e", "name": "danger", "arguments": {"argv": ["git", "push"]}},
        ]},
        {"final": "done"},
    ]});
    let mut f = Fixture::start(&[("rules", script)], None).await;
    let rules = json!([
        {"tool": "probe", "path": "command", "match": "echo *", "verdict": "allow"},
        {"tool": "probe|danger", "path": "command", "match": "*rm -rf*", "verdict": "deny", "reason": "destructive"},
        {"tool": "danger", "path": "argv", "match": "git push*", "verdict": "ask"},
    ]);
    f.declare("scripted/rules", "rules", rules).await;
    let run = f.turn("do things").await;

    let asked = f.server.task_in(run, "r1t4", TaskStatus::NeedsApproval).await;
    assert_eq!(asked.tool_input, json!({"argv": ["git", "push"]}));
    let store = f.server.store();
    let row =
        |task_key: &'static str| async move { store.task(run, key(task_key)).await.expect("store").expect("task") };
    let allowed = row("r1t0").await;
    assert_eq!(allowed.status, TaskStatus::Dispatched);
    assert_eq!(allowed.approval.as_ref().map(|a| a["origin"].clone()), Some(json!("rule")));
    for (key, origin, reason) in [
        ("r1t1", "rule", "destructive"),
        ("r1t2", "mode", "no approval rule allows other"),
        ("r1t3", "mode", "no approval rule allows probe"),
    ] {
        let task = row(key).await;
        assert_eq!((task.status, task.error_key.as_deref()), (TaskStatus::Failed, Some("approval_denied")), "{key}");
        assert_eq!(task.approval.as_ref().map(|a| a["origin"].clone()), Some(json!(origin)), "{key}");
        let result = task.result.expect("result");
        assert_eq!(result["content"], denial(reason), "{key}");
        assert_eq!(result["error"]["detail"], reason, "{key}");
    }

    serve_one(&mut f.raw, run, "r1t0", "hi").await;
    let approved = f.http(&f.agent).post(&door(run, "r1t4", "approve"), &json!({})).await;
    assert_eq!(approved.body["status"], "dispatched", "{:?}", approved.body);
    serve_one(&mut f.raw, run, "r1t4", "pushed").await;
    assert_eq!(completed(&f.server, run).await, "done");
    // The model read every result in call order, the denials as the origin's words.
    let execution = f.server.store().execution(run).await.expect("store").expect("row");
    let results: Vec<String> = execution
        .transcript
        .as_array()
        .expect("transcript")
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        results,
        [
            "hi".to_owned(),
            denial("destructive"),
            denial("no approval rule allows other"),
            denial("no approval rule allows probe"),
            "pushed".to_owned()
        ]
    );
}

#[tokio::test]
async fn bypass_grants_everything_a_deny_rule_does_not_catch() {
    let script = json!({"rounds": [
        {"tool_calls": [
            {"id": "a", "name": "probe", "arguments": {"command": "ls"}},
            {"id": "b", "name": "probe", "arguments": {"command": "rm -rf /"}},
        ]},
        {"final": "{{tool:b}}"},
    ]});
    let mut f = Fixture::start(&[("bypass", script)], None).await;
    let rules = json!([{"tool": "probe", "path": "command", "match": "rm *", "verdict": "deny"},
                       {"tool": "probe", "verdict": "ask"}]);
    f.declare("scripted/bypass", "bypass", rules).await;
    let run = f.turn("go").await;
    let granted = f.server.task_in(run, "r1t0", TaskStatus::Dispatched).await;
    assert_eq!(granted.approval.as_ref().map(|a| a["origin"].clone()), Some(json!("mode")));
    serve_one(&mut f.raw, run, "r1t0", "listed").await;
    assert_eq!(
        completed(&f.server, run).await,
        "<tool_use_error>This tool call was declined by the approver (approval_denied)</tool_use_error>"
    );
}

#[tokio::test]
async fn an_expired_hold_times_the_call_out_with_approval_expired() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}]},
        {"final": "after: {{tool:p}}"},
    ]});
    let f = Fixture::start(&[("expire", script)], Some(600_000)).await;
    f.declare("scripted/expire", "ask", Value::Null).await;
    let run = f.turn("wait").await;
    f.server.task_in(run, "r1t0", TaskStatus::NeedsApproval).await;
    // Past the ten-minute hold at once.
    f.server.clock().advance(Duration::from_secs(601));
    let text = completed(&f.server, run).await;
    assert!(text.starts_with("after: <tool_use_error>"), "{text}");
    assert!(text.contains("(approval_expired)"), "{text}");
    let task = f.server.store().task(run, key("r1t0")).await.expect("store").expect("task");
    assert_eq!((task.status, task.error_key.as_deref()), (TaskStatus::TimedOut, Some("approval_expired")));
    assert_eq!(task.approval, None, "nobody decided");
    let required = events(&f.server, run, EventType::ApprovalRequired).await;
    assert_eq!(required.len(), 1);
    assert_eq!(required[0]["hold_until"].as_i64().map(|until| until - task.started_at), Some(600_000));
    assert_eq!(f.raw.claim(&run.to_string(), "r1t0").await.code(), Some("task_not_claimable"));
    let late = f.http(&f.agent).post(&door(run, "r1t0", "approve"), &json!({})).await;
    assert_eq!((late.status, late.code()), (409, Some("not_awaiting_approval")));
}

#[tokio::test]
async fn a_changed_effect_profile_parks_the_call_again() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}]},
        {"final": "{{tool:p}}"},
    ]});
    let f = Fixture::start(&[("profile", script)], None).await;
    f.declare("scripted/profile", "ask", Value::Null).await;
    let run = f.turn("probe it").await;
    f.server.task_in(run, "r1t0", TaskStatus::NeedsApproval).await;
    // The runner now says its probe is destructive.
    drop(f.raw);
    let mut raw = connect(&f.server, &f.runner, DESTRUCTIVE).await;
    let owner = Http::new(&f.server.url(), Some(&f.agent.token));
    let again = owner.post(&door(run, "r1t0", "approve"), &json!({})).await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_eq!(again.body["status"], "needs_approval");
    assert_eq!(again.body["effect_profile"]["destructive"], true);
    let required = events(&f.server, run, EventType::ApprovalRequired).await;
    assert_eq!(required.len(), 2);
    assert_eq!(
        (required[1]["reparked"].as_bool(), required[1]["effect_profile"]["kind"].as_str()),
        (Some(true), Some("write"))
    );
    let approved = owner.post(&door(run, "r1t0", "approve"), &json!({})).await;
    assert_eq!(approved.body["status"], "dispatched", "{:?}", approved.body);
    serve_one(&mut raw, run, "r1t0", "done anyway").await;
    assert_eq!(completed(&f.server, run).await, "done anyway");
}

#[tokio::test]
async fn a_park_survives_a_nexus_restart_and_is_approved_after_it() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}]},
        {"final": "after restart: {{tool:p}}"},
    ]});
    let scripts = [("restart", script)];
    let f = Fixture::start(&scripts, None).await;
    f.declare("scripted/restart", "ask", Value::Null).await;
    let run = f.turn("survive").await;
    let parked = f.server.task_in(run, "r1t0", TaskStatus::NeedsApproval).await;
    let Fixture { server, agent, runner, raw } = f;
    drop(raw);

    // Stop nexus and start it again on the same store.
    let server = server.restart(&scripts).await;

    let still = server.store().task(run, key("r1t0")).await.expect("store").expect("task");
    assert_eq!(
        (still.status, still.deadline_at),
        (TaskStatus::NeedsApproval, parked.deadline_at),
        "the hold is durable"
    );
    let mut raw = connect(&server, &runner, READ_ONLY).await;
    let mut client = agent_client(&server).await;
    let reply = client.approve_task(authed(decision(run, "r1t0", json!({})), &agent)).await.expect("approved");
    let task: Value = serde_json::from_str(&reply.into_inner().body_json).expect("task json");
    assert_eq!(task["status"], "dispatched");
    serve_one(&mut raw, run, "r1t0", "still here").await;
    assert_eq!(completed(&server, run).await, "after restart: still here");
}
