//! The `ask` kernel tool end to end (`docs/kernel-tools.md`, "ask"): a real server, a scripted
//! model that calls `ask`, and the answer door on HTTP and gRPC. The call parks
//! `awaiting_input` with a hold and announces `input_required`; the owner or a steward answers;
//! the model reads the answer (the scripts echo it as the final text). A hold that runs out
//! settles `timed_out` `ask_expired`; a pause freezes the hold; a stop cancels the call.

use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::actors::execution::control::is_frozen;
use nexus_actors::cli::admin::grants;
use nexus_proto::agent::v1::TaskDecisionRequest;
use nexus_proto::{ErrorCode, ExecutionId, GrantRole, Refusal, RunStatus, TaskStatus};
use nexus_tests::{Answer, Http, Minted, TestServer, agent_client, authed, key, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// A server with one Agent that declares `ask` (and `runners_list`, a kernel tool that is no
/// question) under `scripted/<model>`.
struct Fixture {
    server: TestServer,
    agent: Minted,
}

impl Fixture {
    /// Starts a server with `scripts`; `hold_ms` sets `[execution] ask_hold_ms` when given.
    async fn start(scripts: &[(&str, Value)], hold_ms: Option<u64>) -> Fixture {
        let server = TestServer::start_with(scripts, |config| {
            if let Some(hold) = hold_ms {
                config.execution.ask_hold_ms = hold;
            }
        })
        .await;
        let agent = server.agent("agent").await;
        Fixture { server, agent }
    }

    /// Declares the Agent's profile: `ask` and `runners_list` on `scripted/<model>`, approval
    /// `mode` with `rules`.
    async fn declare(&self, model: &str, mode: &str, rules: Value) {
        let configuration = json!({"default_model": format!("scripted/{model}"), "approval_mode": mode,
            "approval_rules": rules, "kernel_tools": ["nexus.human.ask", "nexus.runners.list"]});
        let declared = self.http(&self.agent).declare(&json!({"configuration": configuration})).await;
        assert_eq!(declared.status, 200, "declared: {:?}", declared.body);
    }

    /// Admits an input (a new conversation) over HTTP and answers its execution.
    async fn turn(&self, text: &str) -> ExecutionId {
        let admitted = self.http(&self.agent).post("/agent_api/v1/inputs", &json!({"text": text})).await;
        assert_eq!(admitted.status, 201, "admitted: {:?}", admitted.body);
        admitted.body["execution_public_id"].as_str().expect("id").parse().expect("uuid")
    }

    fn http(&self, member: &Minted) -> Http {
        Http::new(&self.server.url(), Some(&member.token))
    }

    /// A Human member holding `role` on the Agent.
    async fn human(&self, handle: &str, role: GrantRole) -> Minted {
        let human = self.server.human(handle).await;
        grants::grant(self.server.store(), human.member(), self.agent.member(), role).await.expect("granted");
        human
    }

    /// `member` answers task `task_key` of `run` with `body` at the HTTP door.
    async fn answer(&self, member: &Minted, run: ExecutionId, task_key: &str, body: &Value) -> Answer {
        self.http(member).post(&format!("/agent_api/v1/executions/{run}/tasks/{task_key}/answer"), body).await
    }

    /// The execution's durable feed as the HTTP events door serves it: `(type, data)` each.
    async fn feed(&self, run: ExecutionId) -> Vec<(String, Value)> {
        let page = self.http(&self.agent).get(&format!("/agent_api/v1/executions/{run}/events?limit=200")).await;
        assert_eq!(page.status, 200, "{:?}", page.body);
        let items = page.body["items"].as_array().expect("items").clone();
        items
            .into_iter()
            .map(|item| (item["type"].as_str().unwrap_or_default().to_owned(), item["data"].clone()))
            .collect()
    }

    /// Waits for `input_required` of `task_key` on the feed and answers its data.
    async fn input_required(&self, run: ExecutionId, task_key: &str) -> Value {
        wait_until(&format!("input_required for {task_key}"), WAIT, || async {
            self.feed(run)
                .await
                .into_iter()
                .find(|(kind, data)| kind == "input_required" && data["task_key"] == task_key)
                .map(|(_, data)| data)
        })
        .await
    }

    /// Waits for the execution to complete and answers its final text.
    async fn completed(&self, run: ExecutionId) -> String {
        let row = wait_until("the execution to complete", WAIT, || async {
            self.server.store().execution(run).await.ok().flatten().filter(|row| row.status == RunStatus::Completed)
        })
        .await;
        row.final_text.unwrap_or_default()
    }

    /// Whether the task and the feed are as they were: a refused answer changes nothing.
    async fn unchanged(&self, run: ExecutionId, before: &(TaskStatus, Option<Value>, usize)) {
        let task = self.server.task(run, "r1t0").await.expect("task");
        let now = (task.status, task.result, self.feed(run).await.len());
        assert_eq!(&now, before, "a refused answer changes nothing");
    }

    async fn snapshot(&self, run: ExecutionId) -> (TaskStatus, Option<Value>, usize) {
        let task = self.server.task(run, "r1t0").await.expect("task");
        (task.status, task.result, self.feed(run).await.len())
    }
}

fn answer_request(run: ExecutionId, task_key: &str, body: Value) -> TaskDecisionRequest {
    TaskDecisionRequest {
        execution_public_id: run.to_string(),
        task_key: task_key.to_owned(),
        body_json: body.to_string(),
    }
}

#[tokio::test]
async fn an_ask_with_options_is_answered_at_the_door_and_the_model_reads_the_answer() {
    let script = json!({"rounds": [
        {"tool_calls": [
            {"id": "a", "name": "ask", "arguments": {"prompt": "Which colour?", "options": ["red", "blue"]}},
            {"id": "q", "name": "ask", "arguments": {"question": "Which colour?"}},
        ]},
        {"final": "answer={{tool:a}} refused={{tool:q}}"},
    ]});
    let f = Fixture::start(&[("choose", script)], None).await;
    f.declare("choose", "bypass", Value::Null).await;
    let run = f.turn("pick a colour").await;

    // The call waits for a person; the run stays running and the feed says what is asked.
    let required = f.input_required(run, "r1t0").await;
    let held = f.server.task_in(run, "r1t0", TaskStatus::AwaitingInput).await;
    assert_eq!(
        required,
        json!({"task_key": "r1t0", "prompt": "Which colour?", "options": ["red", "blue"], "multi": false,
               "hold_until": held.deadline_at})
    );
    assert_eq!(held.deadline_at - held.started_at, 86_400_000, "the default hold is 24 h");
    assert_eq!((held.timeout_ms, held.target_executor_public_id), (86_400_000, None));
    let row = f.server.store().execution(run).await.expect("store").expect("execution");
    assert_eq!(row.status, RunStatus::Running);
    // `question:` is refused as the call's error envelope: the tool ran and refused.
    let refused = f.server.task_in(run, "r1t1", TaskStatus::Completed).await;
    assert_eq!(refused.result.as_ref().map(|r| r["is_error"].clone()), Some(json!(true)));
    assert!(!f.feed(run).await.iter().any(|(kind, data)| kind == "input_required" && data["task_key"] == "r1t1"));
    let view = f.http(&f.agent).get(&format!("/agent_api/v1/executions/{run}")).await;
    let task = view.body["tasks"].as_array().expect("tasks").iter().find(|t| t["task_key"] == "r1t0").cloned();
    assert_eq!(
        task.map(|t| (t["status"].clone(), t["deadline_at"].clone())),
        Some((json!("awaiting_input"), json!(held.deadline_at)))
    );

    // The owner answers with one option; the task settles with it and the model reads it.
    let answered = f.answer(&f.agent, run, "r1t0", &json!({"answer": "blue"})).await;
    assert_eq!(answered.status, 200, "{:?}", answered.body);
    assert_eq!(answered.body["status"], "completed");
    assert_eq!(answered.body["result"]["content"], "blue");
    assert_eq!(answered.body["result"]["structured_content"]["answered_by"], json!(f.agent.id));
    assert_eq!(answered.body["result"]["structured_content"]["origin"], "agent");
    assert_eq!(
        f.completed(run).await,
        "answer=blue refused=ask takes prompt, not question: pass the question as prompt"
    );
    let settled = f.feed(run).await;
    assert!(
        settled.iter().any(|(kind, data)| kind == "task_status"
            && data["task_key"] == "r1t0"
            && data["status"] == "completed"
            && data["content"] == "blue"),
        "{settled:?}"
    );
    // The refused call is no question: nothing waits for an answer there.
    let late = f.answer(&f.agent, run, "r1t1", &json!({"answer": "blue"})).await;
    assert_eq!((late.status, late.code()), (409, Some("not_awaiting_input")));
}

#[tokio::test]
async fn a_wrong_answer_is_refused_and_changes_nothing_a_viewer_cannot_answer_and_a_second_answer_is_refused() {
    let script = json!({"rounds": [
        {"tool_calls": [
            {"id": "m", "name": "ask", "arguments": {"prompt": "Which?", "options": ["a", "b", "c"], "multi": true}},
        ]},
        {"final": "chose {{tool:m}}"},
    ]});
    let f = Fixture::start(&[("multi", script)], None).await;
    f.declare("multi", "bypass", Value::Null).await;
    let run = f.turn("choose").await;
    let required = f.input_required(run, "r1t0").await;
    assert_eq!(required["multi"], true);
    let before = f.snapshot(run).await;
    assert_eq!(before.0, TaskStatus::AwaitingInput);

    // Answers the call does not take: 422, nothing changes.
    for bad in [
        json!({"answer": "z"}),
        json!({"answer": ["a", "a"]}),
        json!({"answer": []}),
        json!({"answer": 5}),
        json!({"answer": ["a", "z"]}),
    ] {
        let refused = f.answer(&f.agent, run, "r1t0", &bad).await;
        assert_eq!((refused.status, refused.code()), (422, Some("validation_failed")), "{bad}");
    }
    // Bodies the door does not take: 400.
    let missing = f.answer(&f.agent, run, "r1t0", &json!({})).await;
    assert_eq!((missing.status, missing.code()), (400, Some("parameter_missing")));
    let extra = f.answer(&f.agent, run, "r1t0", &json!({"answer": "a", "why": "x"})).await;
    assert_eq!((extra.status, extra.code()), (400, Some("parameter_invalid")));
    // Standing: a viewer reads, never answers; another Agent learns nothing; unknown is 404.
    let viewer = f.human("viewer", GrantRole::Viewer).await;
    let refused = f.answer(&viewer, run, "r1t0", &json!({"answer": ["a"]})).await;
    assert_eq!((refused.status, refused.code()), (403, Some("not_authorized")));
    let stranger = f.server.agent("stranger").await;
    let refused = f.answer(&stranger, run, "r1t0", &json!({"answer": ["a"]})).await;
    assert_eq!((refused.status, refused.code()), (404, Some("not_found")));
    let unknown = f.answer(&f.agent, run, "r9t9", &json!({"answer": ["a"]})).await;
    assert_eq!((unknown.status, unknown.code()), (404, Some("not_found")));
    f.unchanged(run, &before).await;

    // A steward answers with two options; the model reads them as a JSON array.
    let steward = f.human("steward", GrantRole::Steward).await;
    let answered = f.answer(&steward, run, "r1t0", &json!({"answer": ["c", "a"]})).await;
    assert_eq!(answered.status, 200, "{:?}", answered.body);
    let fact = &answered.body["result"]["structured_content"];
    assert_eq!((fact["answered_by"].clone(), fact["origin"].clone()), (json!(steward.id), json!("human")));
    assert_eq!(fact["answer"], json!(["c", "a"]));
    // The answer was durable before it was answered; a second one is refused.
    let stored = f.server.task(run, "r1t0").await.expect("task");
    assert_eq!(stored.status, TaskStatus::Completed);
    let again = f.answer(&f.agent, run, "r1t0", &json!({"answer": ["b"]})).await;
    assert_eq!((again.status, again.code()), (409, Some("not_awaiting_input")));
    assert_eq!(f.completed(run).await, r#"chose ["c","a"]"#);
}

#[tokio::test]
async fn an_unanswered_ask_expires_timed_out_and_the_model_reads_why() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "s", "name": "ask", "arguments": {"prompt": "Still there?"}}]},
        {"final": "heard: {{tool:s}}"},
    ]});
    let f = Fixture::start(&[("expire", script)], Some(60_000)).await;
    f.declare("expire", "bypass", Value::Null).await;
    let run = f.turn("wait for me").await;
    let required = f.input_required(run, "r1t0").await;
    let held = f.server.task_in(run, "r1t0", TaskStatus::AwaitingInput).await;
    assert_eq!(held.deadline_at - held.started_at, 60_000, "[execution] ask_hold_ms");
    assert_eq!((required["options"].clone(), required["hold_until"].clone()), (json!([]), json!(held.deadline_at)));

    f.server.clock().advance(Duration::from_millis(61_000));
    let expired = f.server.task_in(run, "r1t0", TaskStatus::TimedOut).await;
    assert_eq!(expired.error_key.as_deref(), Some(ErrorCode::AskExpired.as_str()));
    let text = f.completed(run).await;
    assert!(text.starts_with("heard: <tool_use_error>") && text.contains("(ask_expired)"), "{text}");
    let late = f.answer(&f.agent, run, "r1t0", &json!({"answer": "yes"})).await;
    assert_eq!((late.status, late.code()), (409, Some("not_awaiting_input")));
}

#[tokio::test]
async fn an_approved_ask_is_answered_over_grpc() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "g", "name": "ask", "arguments": {"prompt": "Your name?"}}]},
        {"final": "hello {{tool:g}}"},
    ]});
    let f = Fixture::start(&[("grpc", script)], Some(120_000)).await;
    f.declare("grpc", "rules", json!([{"tool": "ask", "verdict": "ask"}])).await;
    let run = f.turn("greet me").await;
    // The call passes the approval stage first; approved, it is asked, with its own hold.
    f.server.task_in(run, "r1t0", TaskStatus::NeedsApproval).await;
    let mut client = agent_client(&f.server).await;
    let approved = client.approve_task(authed(answer_request(run, "r1t0", json!({})), &f.agent)).await;
    let approved: Value = serde_json::from_str(&approved.expect("approved").into_inner().body_json).expect("json");
    assert_eq!(approved["status"], "awaiting_input", "{approved}");
    f.input_required(run, "r1t0").await;
    let held = f.server.task(run, "r1t0").await.expect("task");
    assert_eq!(held.deadline_at - held.started_at, 120_000, "the ask's hold, from its approval");

    let refused = client
        .answer_task(authed(answer_request(run, "r1t0", json!({"answer": ["Ada"]})), &f.agent))
        .await
        .expect_err("a free-text question takes text");
    assert_eq!(Refusal::from_status(&refused).code, ErrorCode::ValidationFailed);
    let reply = client
        .answer_task(authed(answer_request(run, "r1t0", json!({"answer": "Ada"})), &f.agent))
        .await
        .expect("answered")
        .into_inner();
    let answered: Value = serde_json::from_str(&reply.body_json).expect("json");
    assert_eq!((answered["status"].clone(), answered["result"]["content"].clone()), (json!("completed"), json!("Ada")));
    assert_eq!(f.completed(run).await, "hello Ada");
    let again = client
        .answer_task(authed(answer_request(run, "r1t0", json!({"answer": "Bob"})), &f.agent))
        .await
        .expect_err("answered already");
    assert_eq!(Refusal::from_status(&again).code, ErrorCode::NotAwaitingInput);
}

#[tokio::test]
async fn a_pause_freezes_the_hold_and_the_ask_is_answerable_after_the_resume() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "ask", "arguments": {"prompt": "Go on?", "options": ["yes", "no"]}}]},
        {"final": "said {{tool:p}}"},
    ]});
    let f = Fixture::start(&[("pause", script)], Some(60_000)).await;
    f.declare("pause", "bypass", Value::Null).await;
    let run = f.turn("paused one").await;
    // An ask beside it, on live clocks: its expiry shows that the time passed for every timer.
    let beside = f.turn("live one").await;
    let held = f.server.task_in(run, "r1t0", TaskStatus::AwaitingInput).await;
    f.server.task_in(beside, "r1t0", TaskStatus::AwaitingInput).await;
    let http = f.http(&f.agent);

    let paused = http.send(reqwest::Method::POST, &format!("/agent_api/v1/executions/{run}/pause"), None).await;
    assert_eq!(paused.body["status"], "paused", "{:?}", paused.body);
    let frozen = f.server.task(run, "r1t0").await.expect("task");
    assert!(is_frozen(frozen.deadline_at), "the hold is frozen when the pause answers");
    // A paused execution takes no answer; the refusal changes nothing.
    let refused = f.answer(&f.agent, run, "r1t0", &json!({"answer": "yes"})).await;
    assert_eq!((refused.status, refused.code()), (409, Some("not_adjudicable")));

    f.server.clock().advance(Duration::from_millis(61_000));
    f.server.task_in(beside, "r1t0", TaskStatus::TimedOut).await;
    let still = f.server.task(run, "r1t0").await.expect("task");
    assert_eq!((still.status, still.deadline_at), (TaskStatus::AwaitingInput, frozen.deadline_at));

    let resumed = http.send(reqwest::Method::POST, &format!("/agent_api/v1/executions/{run}/resume"), None).await;
    assert_eq!(resumed.status, 200, "{:?}", resumed.body);
    let thawed = f.server.store().task(run, key("r1t0")).await.expect("store").expect("task");
    assert!(!is_frozen(thawed.deadline_at));
    assert!(thawed.deadline_at - held.deadline_at >= 61_000, "the hold moved forward by the paused time");
    let answered = f.answer(&f.agent, run, "r1t0", &json!({"answer": "yes"})).await;
    assert_eq!(answered.status, 200, "{:?}", answered.body);
    assert_eq!(f.completed(run).await, "said yes");
}

#[tokio::test]
async fn a_forced_stop_cancels_the_waiting_ask() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "x", "name": "ask", "arguments": {"prompt": "Shall I?"}}]},
        {"final": "never {{tool:x}}"},
    ]});
    let f = Fixture::start(&[("stop", script)], None).await;
    f.declare("stop", "bypass", Value::Null).await;
    let run = f.turn("then stop").await;
    f.input_required(run, "r1t0").await;
    let stopped = f.http(&f.agent).post(&format!("/agent_api/v1/executions/{run}/stop"), &json!({})).await;
    assert_eq!(stopped.body["status"], "canceled", "{:?}", stopped.body);
    let canceled = f.server.task_in(run, "r1t0", TaskStatus::Canceled).await;
    assert_eq!(canceled.error_key.as_deref(), Some("task_canceled"));
    let late = f.answer(&f.agent, run, "r1t0", &json!({"answer": "yes"})).await;
    assert_eq!((late.status, late.code()), (409, Some("not_awaiting_input")));
}

#[tokio::test]
async fn a_waiting_ask_keeps_its_hold_across_a_restart() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "r", "name": "ask", "arguments": {"prompt": "After the restart?"}}]},
        {"final": "got {{tool:r}}"},
    ]});
    let scripts = [("restart", script)];
    let f = Fixture::start(&scripts, Some(60_000)).await;
    f.declare("restart", "bypass", Value::Null).await;
    let answered = f.turn("answered after").await;
    let expiring = f.turn("expires after").await;
    let held = f.server.task_in(answered, "r1t0", TaskStatus::AwaitingInput).await;
    f.server.task_in(expiring, "r1t0", TaskStatus::AwaitingInput).await;

    let Fixture { server, agent } = f;
    let f = Fixture { server: server.restart(&scripts).await, agent };
    let still = f.server.task_in(answered, "r1t0", TaskStatus::AwaitingInput).await;
    assert_eq!(still.deadline_at, held.deadline_at, "the hold is durable");
    let reply = f.answer(&f.agent, answered, "r1t0", &json!({"answer": "yes"})).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(f.completed(answered).await, "got yes");
    // The other hold is armed again from its durable deadline and runs out.
    f.server.clock().advance(Duration::from_millis(61_000));
    let expired = f.server.task_in(expiring, "r1t0", TaskStatus::TimedOut).await;
    assert_eq!(expired.error_key.as_deref(), Some("ask_expired"));
    assert!(f.completed(expiring).await.contains("(ask_expired)"));
}
