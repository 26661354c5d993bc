//! Whose runner is whose (`docs/protocol.md`, "Assignment"; spec R28, 6.2 and 6.6): a runner
//! serves only the Agents it is assigned to, or every Agent when it is account-wide. Each test
//! drives a real server and a scripted runner; the CLI test runs the `nexus` binary.

use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use nexus_actors::cli::admin::{assign_runner, revoke_runner, unassign_runner};
use nexus_actors::doors::api::CreateInput;
use nexus_actors::store::EventType;
use nexus_proto::{ErrorCode, ExecutionId, TaskStatus};
use nexus_tests::processes::{StoreLocation, nexus_admin_output};
use nexus_tests::{Http, Minted, RawRunner, TestServer};

const WAIT: Duration = Duration::from_secs(20);

fn probe() -> Value {
    json!({"name": "probe", "description": "Probe the machine.", "input_schema": {"type": "object"},
           "effect_profile": {"kind": "read_only", "destructive": false, "effect_scope": "closed",
                              "idempotency": "intrinsic", "reconciliation": "none"},
           "timeout_ms": 60_000})
}

fn probe_script() -> Value {
    json!({"rounds": [
        {"tool_calls": [{"id": "c1", "name": "probe", "arguments": {}}]},
        {"final": "probe said {{tool:c1}}"}
    ]})
}

/// Two probe calls, one round each, then the answer.
fn two_probes_script() -> Value {
    json!({"rounds": [
        {"tool_calls": [{"id": "c1", "name": "probe", "arguments": {"n": 1}}]},
        {"tool_calls": [{"id": "c2", "name": "probe", "arguments": {"n": 2}}]},
        {"final": "first {{tool:c1}}, then {{tool:c2}}"}
    ]})
}

fn declaration(runner: Uuid) -> Value {
    json!({"runner_executor_public_ids": [runner], "approval_mode": "bypass", "default_model": "scripted/probe"})
}

/// Two Agents, `mine` and `theirs`, and a runner assigned to `mine` only, connected and
/// announcing `probe`.
struct Two {
    server: TestServer,
    mine: Minted,
    theirs: Minted,
    runner: Minted,
    raw: RawRunner,
}

async fn two_agents(scripts: &[(&str, Value)]) -> Two {
    let server = TestServer::start(scripts).await;
    let mine = server.agent("mine").await;
    let theirs = server.agent("theirs").await;
    let runner = server.runner_for("mine-box", &[&mine]).await;
    let raw = RawRunner::connect_announced(&server.url(), &runner, &json!({"tools": [probe()]})).await;
    Two { server, mine, theirs, runner, raw }
}

async fn admit(server: &TestServer, agent: &Minted, input: CreateInput) -> Result<ExecutionId, nexus_proto::Refusal> {
    let caller = server.caller(agent).await;
    server.server.api.create_input(&caller, input).await.map(|admitted| admitted.execution_public_id)
}

fn text(text: &str) -> CreateInput {
    CreateInput { text: text.to_owned(), ..CreateInput::default() }
}

/// The `turn_status` `failed` message of an execution refused at materialization.
async fn failure_message(server: &TestServer, run: ExecutionId) -> String {
    let events = server.store().events_after(run, 0, 1_000).await.expect("events");
    events
        .iter()
        .filter(|e| e.event.event_type() == EventType::TurnStatus)
        .map(|e| e.event.data())
        .find(|data| data["status"] == "failed")
        .and_then(|data| data["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no failed turn_status in {events:?}"))
}

#[tokio::test]
async fn r28_an_agent_cannot_declare_another_agents_runner() {
    let t = two_agents(&[("probe", probe_script())]).await;
    let theirs = Http::new(&t.server.url(), Some(&t.theirs.token));
    let route = json!({"type": "function", "function": {"name": "ship", "parameters": {"type": "object"}},
                       "route": {"kind": "runner", "runner_executor_public_id": t.runner.id, "tool_name": "probe"}});
    // (row, configuration)
    let rows = [
        ("as a candidate", declaration(t.runner.id)),
        ("as a route target", json!({"approval_mode": "bypass", "tool_definitions": [route]})),
    ];
    for (row, configuration) in rows {
        let answer = theirs.declare(&json!({"configuration": configuration})).await;
        assert_eq!((answer.status, answer.code()), (422, Some("runner_not_eligible")), "{row}: {:?}", answer.body);
        assert!(answer.message().contains(&t.runner.id.to_string()), "{row}: {}", answer.message());
        assert!(!answer.message().contains("mine-box"), "{row}: the display name does not leak");
        let named = theirs
            .put(
                "/agent_api/v1/profile/agents/helper",
                &json!({"scope": "instance", "description": "Helps.", "configuration": configuration}),
            )
            .await;
        assert_eq!((named.status, named.code()), (422, Some("runner_not_eligible")), "{row}: {:?}", named.body);
    }
    // Nothing changed: the profile still declares nothing, and no named definition was made.
    assert_eq!(theirs.profile().await.body["configuration"]["runner_executor_public_ids"], Value::Null);
    assert_eq!(theirs.get("/agent_api/v1/profile/agents").await.body["agents"], json!([]));
    // A runner that does not exist yet may be declared (materialization judges it), and the
    // Agent the runner is assigned to declares it.
    assert_eq!(theirs.declare(&json!({"configuration": declaration(Uuid::new_v4())})).await.status, 200);
    let mine = Http::new(&t.server.url(), Some(&t.mine.token));
    assert_eq!(mine.declare(&json!({"configuration": declaration(t.runner.id)})).await.status, 200);
}

#[tokio::test]
async fn an_inline_declaration_of_another_agents_runner_is_refused_at_materialization_and_nothing_is_dispatched() {
    let mut t = two_agents(&[("probe", probe_script())]).await;
    let route = json!({"type": "function", "function": {"name": "ship", "parameters": {"type": "object"}},
                       "route": {"kind": "runner", "runner_executor_public_id": t.runner.id, "tool_name": "probe"}});
    let routed = json!({"approval_mode": "bypass", "default_model": "scripted/probe", "tool_definitions": [route]});
    let mut refused = Vec::new();
    for inline in [declaration(t.runner.id), routed] {
        let input = CreateInput { execution_declaration: Some(inline.clone()), ..text("probe it") };
        let run = admit(&t.server, &t.theirs, input).await.expect("admission stores intent");
        let row = t.server.settled(run, WAIT).await;
        assert_eq!(row.error_key.as_deref(), Some("runner_not_eligible"), "{inline}");
        assert_eq!(row.declaration, None, "nothing was frozen: {inline}");
        assert!(failure_message(&t.server, run).await.contains(&t.runner.id.to_string()));
        assert!(t.server.store().tasks_of(run).await.expect("tasks").is_empty(), "no task for {inline}");
        refused.push(run);
    }
    // An input naming the runner itself is refused at admission, before any intent is stored.
    let input = CreateInput {
        execution_declaration: Some(declaration(t.runner.id)),
        runner_executor_public_id: Some(t.runner.runner()),
        ..text("probe it")
    };
    let refusal = admit(&t.server, &t.theirs, input).await.expect_err("refused");
    assert_eq!(refusal.code, ErrorCode::RunnerNotEligible);
    // The runner holds nothing for the other Agent: the first work it is offered is its own
    // Agent's, admitted after every refusal above.
    assert!(t.server.store().open_tasks_for(t.runner.runner()).await.expect("inbox").is_empty());
    let input = CreateInput { execution_declaration: Some(declaration(t.runner.id)), ..text("probe it") };
    let own = admit(&t.server, &t.mine, input).await.expect("admitted");
    let work = t.raw.next_work(WAIT).await.expect("work for its own Agent");
    assert_eq!(work.run_public_id, own.to_string());
    assert!(!refused.iter().any(|run| run.to_string() == work.run_public_id));
}

#[tokio::test]
async fn an_unassigned_runner_cannot_claim_work_already_addressed_to_it_and_assign_takes_effect_again() {
    let mut t = two_agents(&[("probe", probe_script())]).await;
    let mine = Http::new(&t.server.url(), Some(&t.mine.token));
    assert_eq!(mine.declare(&json!({"configuration": declaration(t.runner.id)})).await.status, 200);
    let run = admit(&t.server, &t.mine, text("probe it")).await.expect("admitted");
    let work = t.raw.next_work(WAIT).await.expect("work");
    assert_eq!(work.run_public_id, run.to_string());

    let left = unassign_runner(t.server.store(), t.runner.runner(), t.mine.member()).await.expect("unassigned");
    assert_eq!(left["assigned_agent_public_ids"], json!([]));
    let claim = t.raw.claim(&work.run_public_id, &work.task_key).await;
    assert_eq!(claim.code(), Some("not_eligible"), "{claim:?}");
    assert!(matches!(claim, nexus_tests::Reply::Refused { http_status: 409, .. }));
    // The task fails with the word at once rather than waiting out its park, and the execution
    // goes on: the model reads the failure.
    let task = t.server.task_in(run, &work.task_key, TaskStatus::Failed).await;
    assert_eq!(task.error_key.as_deref(), Some("not_eligible"));
    assert!(!task.claimed);
    let row = t.server.settled(run, WAIT).await;
    assert!(row.final_text.as_deref().is_some_and(|t| t.starts_with("probe said")), "{row:?}");
    // Unassigned, the Agent's next input is refused at materialization.
    let next = admit(&t.server, &t.mine, text("again")).await.expect("admission stores intent");
    assert_eq!(t.server.settled(next, WAIT).await.error_key.as_deref(), Some("runner_not_eligible"));

    // Assigned again, it serves the Agent again.
    let back = assign_runner(t.server.store(), t.runner.runner(), t.mine.member()).await.expect("assigned");
    assert_eq!(back["assigned_agent_public_ids"], json!([t.mine.id]));
    let again = admit(&t.server, &t.mine, text("once more")).await.expect("admitted");
    let work = t.raw.next_work(WAIT).await.expect("work");
    assert_eq!(work.run_public_id, again.to_string());
    let (token, _) = t.raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claimed");
    let done = t.raw.commit(&work.run_public_id, &work.task_key, &token, &json!({"content": "fine"})).await;
    assert_eq!(done.committed(), Some((false, "completed".to_owned())));
    assert_eq!(t.server.settled(again, WAIT).await.final_text.as_deref(), Some("probe said fine"));
}

#[tokio::test]
async fn work_claimed_before_an_unassignment_commits_and_the_next_call_fails_at_dispatch() {
    let mut t = two_agents(&[("probe", two_probes_script())]).await;
    let mine = Http::new(&t.server.url(), Some(&t.mine.token));
    assert_eq!(mine.declare(&json!({"configuration": declaration(t.runner.id)})).await.status, 200);
    let run = admit(&t.server, &t.mine, text("probe twice")).await.expect("admitted");
    let first = t.raw.next_work(WAIT).await.expect("work");
    let (token, _) = t.raw.claim(&first.run_public_id, &first.task_key).await.granted().expect("claimed");
    unassign_runner(t.server.store(), t.runner.runner(), t.mine.member()).await.expect("unassigned");
    // The granted claim stands: its work may have run.
    let done = t.raw.commit(&first.run_public_id, &first.task_key, &token, &json!({"content": "one"})).await;
    assert_eq!(done.committed(), Some((false, "completed".to_owned())));
    // The second round's call is addressed to the frozen target and fails at dispatch: it is
    // never offered.
    let row = t.server.settled(run, WAIT).await;
    assert_eq!(row.final_text.as_deref().map(|t| t.starts_with("first one, then")), Some(true), "{row:?}");
    let second = t.server.task(run, "r2t0").await.expect("the second call");
    assert_eq!((second.status, second.error_key.as_deref()), (TaskStatus::Failed, Some("not_eligible")));
    assert_eq!(second.target_executor_public_id, Some(t.runner.runner()));
    assert!(t.raw.received_work().iter().all(|w| w.task_key != "r2t0"), "the second call was never offered");
    assert_eq!(t.server.task(run, &first.task_key).await.map(|task| task.status), Some(TaskStatus::Completed));
}

#[tokio::test]
async fn discovery_and_the_assembly_preview_list_only_the_callers_eligible_runners() {
    let server = TestServer::start(&[]).await;
    let mine = server.agent("mine").await;
    let theirs = server.agent("theirs").await;
    let person = server.human("person").await;
    let wide = server.runner("everyone").await;
    let own = server.runner_for("mine-box", &[&mine]).await;
    let other = server.runner_for("their-box", &[&theirs]).await;
    let gone = server.runner_for("gone-box", &[&mine]).await;
    revoke_runner(server.store(), gone.runner()).await.expect("revoked");
    let listed = |who: &Minted| {
        let http = Http::new(&server.url(), Some(&who.token));
        async move {
            let answer = http.get("/agent_api/v1/executors").await;
            assert_eq!(answer.status, 200, "{:?}", answer.body);
            let mut ids: Vec<String> = answer.body["executors"]
                .as_array()
                .expect("list")
                .iter()
                .map(|e| e["public_id"].as_str().expect("id").to_owned())
                .collect();
            ids.sort();
            ids
        }
    };
    let sorted = |ids: &[Uuid]| {
        let mut ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        ids.sort();
        ids
    };
    assert_eq!(listed(&mine).await, sorted(&[wide.id, own.id]));
    assert_eq!(listed(&theirs).await, sorted(&[wide.id, other.id]));
    assert_eq!(listed(&person).await, sorted(&[wide.id]), "a Human without grants sees the account-wide runners");
    // A viewer (or steward) of an Agent also sees the runners assigned to that Agent.
    nexus_actors::cli::admin::grants::grant(
        server.store(),
        person.member(),
        mine.member(),
        nexus_proto::GrantRole::Viewer,
    )
    .await
    .expect("granted");
    assert_eq!(listed(&person).await, sorted(&[wide.id, own.id]), "a viewer of mine sees mine's runners");
    let as_mine = Http::new(&server.url(), Some(&mine.token));
    let one = as_mine.get(&format!("/agent_api/v1/executors/{}", own.id)).await;
    assert_eq!((one.status, one.body["assignment_scope"].as_str()), (200, Some("user_private")));
    for id in [other.id, gone.id] {
        let answer = as_mine.get(&format!("/agent_api/v1/executors/{id}")).await;
        assert_eq!((answer.status, answer.code()), (404, Some("not_found")), "{id}");
    }

    // The preview shows only eligible candidates and refuses to select another's runner, with
    // the same word as for a runner that does not exist and without its display name.
    let configuration = json!({"runner_executor_public_ids": [other.id, own.id, wide.id]});
    let preview = |selected: Value| {
        let http = as_mine.clone();
        let configuration = configuration.clone();
        async move {
            http.post(
                "/agent_api/v1/tools/assembly",
                &json!({"default_runner_executor_public_id": selected, "configuration": configuration}),
            )
            .await
        }
    };
    let shown = preview(Value::Null).await;
    assert_eq!(shown.status, 200, "{:?}", shown.body);
    let ids = |rows: &Value| -> Vec<String> {
        rows.as_array()
            .expect("rows")
            .iter()
            .map(|r| r["runner_executor_public_id"].as_str().expect("id").to_owned())
            .collect()
    };
    let (own_s, wide_s) = (own.id.to_string(), wide.id.to_string());
    assert_eq!(ids(&shown.body["environment"]["runner_candidates"]), [own_s.clone(), wide_s.clone()]);
    assert_eq!(ids(&shown.body["environment"]["executors"]), [own_s, wide_s]);
    assert!(!shown.body.to_string().contains("their-box"), "{}", shown.body);
    let foreign = preview(json!(other.id)).await;
    assert_eq!((foreign.status, foreign.code()), (422, Some("runner_not_eligible")));
    assert!(!foreign.message().contains("their-box"), "{}", foreign.message());
    let mut unknown_configuration = configuration.clone();
    let unknown = Uuid::new_v4();
    unknown_configuration["runner_executor_public_ids"] = json!([unknown]);
    let unknown_answer = as_mine
        .post(
            "/agent_api/v1/tools/assembly",
            &json!({"default_runner_executor_public_id": unknown, "configuration": unknown_configuration}),
        )
        .await;
    assert_eq!(unknown_answer.code(), Some("runner_not_eligible"));
    assert_eq!(
        unknown_answer.message().replace(&unknown.to_string(), "ID"),
        foreign.message().replace(&other.id.to_string(), "ID"),
        "an unknown runner and another Agent's read alike"
    );
    assert_eq!(preview(json!(own.id)).await.status, 200);

    // Assignment takes effect on the next read, and so does its removal.
    assign_runner(server.store(), other.runner(), mine.member()).await.expect("assigned");
    assert_eq!(listed(&mine).await, sorted(&[wide.id, own.id, other.id]));
    assert_eq!(as_mine.get(&format!("/agent_api/v1/executors/{}", other.id)).await.status, 200);
    assert_eq!(preview(json!(other.id)).await.status, 200);
    unassign_runner(server.store(), other.runner(), mine.member()).await.expect("unassigned");
    assert_eq!(listed(&mine).await, sorted(&[wide.id, own.id]));
    assert_eq!(as_mine.get(&format!("/agent_api/v1/executors/{}", other.id)).await.status, 404);
}

#[tokio::test]
async fn an_input_whose_only_runner_is_revoked_is_refused_with_the_eligibility_word() {
    let mut t = two_agents(&[("probe", probe_script())]).await;
    let mine = Http::new(&t.server.url(), Some(&t.mine.token));
    assert_eq!(mine.declare(&json!({"configuration": declaration(t.runner.id)})).await.status, 200);
    revoke_runner(t.server.store(), t.runner.runner()).await.expect("revoked");
    let run = admit(&t.server, &t.mine, text("probe it")).await.expect("admission stores intent");
    let row = t.server.settled(run, WAIT).await;
    assert_eq!(row.error_key.as_deref(), Some("runner_not_eligible"), "not a call failing unknown_tool");
    let message = failure_message(&t.server, run).await;
    assert!(message.contains(&t.runner.id.to_string()) && message.contains("revoked"), "{message}");
    assert!(t.server.store().tasks_of(run).await.expect("tasks").is_empty());
    assert!(t.raw.received_work().is_empty());
    let shown = mine.get(&format!("/agent_api/v1/executions/{run}")).await;
    assert_eq!(shown.body["error_key"], "runner_not_eligible", "{:?}", shown.body);
}

#[tokio::test]
async fn the_runner_commands_refuse_bad_arguments_and_print_the_assignment() {
    let server = TestServer::start(&[]).await;
    let agent = server.agent("agent").await;
    let other = server.agent("other").await;
    let person = server.human("person").await;
    let at = StoreLocation {
        data_dir: server.data_dir.path().to_owned(),
        database_url: server.database.as_ref().map(|d| d.url().to_owned()),
    };
    let (agent_id, other_id, person_id) = (agent.id.to_string(), other.id.to_string(), person.id.to_string());

    // Whom the runner serves must be said: neither flag names both; both are refused.
    let (status, _, stderr) = nexus_admin_output(&at, &["runner", "create", "--name", "box"]).await;
    assert!(!status.success());
    assert!(stderr.contains("--assign") && stderr.contains("--account-wide"), "{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
    let both = ["runner", "create", "--name", "box", "--assign", &agent_id, "--account-wide"];
    assert!(!nexus_admin_output(&at, &both).await.0.success());
    // (row, args, word)
    let unknown = Uuid::new_v4().to_string();
    let rows: Vec<(&str, Vec<&str>, &str)> = vec![
        ("an unknown Agent", vec!["runner", "create", "--name", "box", "--assign", &unknown], "not_found"),
        ("a Human", vec!["runner", "create", "--name", "box", "--assign", &person_id], "validation_failed"),
        ("an empty name", vec!["runner", "create", "--name", " ", "--account-wide"], "validation_failed"),
    ];
    for (row, args, word) in rows {
        let (status, _, stderr) = nexus_admin_output(&at, &args).await;
        assert!(!status.success(), "{row}");
        assert!(stderr.starts_with(&format!("error: {word}: ")), "{row}: {stderr}");
    }
    assert!(server.store().executors().await.expect("executors").is_empty(), "no refused create made a runner");

    let (status, created, _) =
        nexus_admin_output(&at, &["runner", "create", "--name", "box", "--assign", &agent_id, "--assign", &agent_id])
            .await;
    assert!(status.success());
    assert_eq!(created["assignment_scope"], "user_private");
    assert_eq!(created["assigned_agent_public_ids"], json!([agent.id]), "a repeated Agent is assigned once");
    assert!(created["token"].as_str().is_some_and(|t| !t.is_empty()));
    let runner = created["runner_executor_public_id"].as_str().expect("id").to_owned();
    let (_, wide, _) = nexus_admin_output(&at, &["runner", "create", "--name", "shared", "--account-wide"]).await;
    assert_eq!(
        (wide["assignment_scope"].as_str(), &wide["assigned_agent_public_ids"]),
        (Some("account_wide"), &json!([]))
    );
    let wide_id = wide["runner_executor_public_id"].as_str().expect("id").to_owned();

    let (status, assigned, _) =
        nexus_admin_output(&at, &["runner", "assign", "--runner", &runner, "--agent", &other_id]).await;
    assert!(status.success());
    assert_eq!(
        assigned,
        json!({"runner_executor_public_id": runner, "assignment_scope": "user_private",
               "assigned_agent_public_ids": [agent.id, other.id]})
    );
    let (status, left, _) =
        nexus_admin_output(&at, &["runner", "unassign", "--runner", &runner, "--agent", &agent_id]).await;
    assert!(status.success());
    assert_eq!(left["assigned_agent_public_ids"], json!([other.id]));
    let rows: Vec<(&str, Vec<&str>, &str)> = vec![
        ("an unknown runner", vec!["runner", "assign", "--runner", &unknown, "--agent", &agent_id], "not_found"),
        ("a Human", vec!["runner", "assign", "--runner", &runner, "--agent", &person_id], "validation_failed"),
        (
            "an account-wide runner",
            vec!["runner", "assign", "--runner", &wide_id, "--agent", &agent_id],
            "validation_failed",
        ),
        ("not assigned", vec!["runner", "unassign", "--runner", &runner, "--agent", &agent_id], "not_found"),
        (
            "an account-wide runner",
            vec!["runner", "unassign", "--runner", &wide_id, "--agent", &agent_id],
            "validation_failed",
        ),
    ];
    for (row, args, word) in rows {
        let (status, _, stderr) = nexus_admin_output(&at, &args).await;
        assert!(!status.success(), "{row}");
        assert!(stderr.starts_with(&format!("error: {word}: ")), "{row}: {stderr}");
    }
    let (status, _, stderr) =
        nexus_admin_output(&at, &["runner", "assign", "--runner", "nope", "--agent", &agent_id]).await;
    assert!(!status.success() && stderr.contains("--runner"), "{stderr}");
    // The store agrees with what was printed.
    let runner_id: nexus_proto::RunnerId = runner.parse().expect("id");
    assert_eq!(server.store().runner_agents(runner_id).await.expect("agents"), vec![other.member()]);
}
