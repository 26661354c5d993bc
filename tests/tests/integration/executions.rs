//! End-to-end executions: a real server, a real runner-agent, and clients on the gRPC and HTTP
//! doors.

use nexus_proto::{ErrorCode, ExecutionId, TaskStatus};
use nexus_tests::key;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use uuid::Uuid;

use nexus_proto::agent::v1::agent_service_client::AgentServiceClient;
use nexus_proto::agent::v1::{
    CreateInputRequest, DeclareProfileRequest, GetExecutionRequest, StopExecutionRequest, StreamEventsRequest,
};
use nexus_tests::{Minted, TestServer, agent_client, authed, wait_until};

const WAIT: Duration = Duration::from_secs(30);

async fn wait_announced(server: &TestServer, runner: &Minted) {
    wait_until("the runner's announcement", WAIT, || async {
        server.store().executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
    })
    .await;
}

async fn declare(client: &mut AgentServiceClient<Channel>, agent: &Minted, runner: Uuid, model: &str) -> Value {
    let body = json!({"configuration": {"runner_executor_public_ids": [runner], "approval_mode": "bypass", "default_model": model}});
    let reply = client
        .declare_profile(authed(DeclareProfileRequest { body_json: body.to_string() }, agent))
        .await
        .expect("declare");
    serde_json::from_str(&reply.into_inner().profile_json).expect("profile json")
}

async fn start(client: &mut AgentServiceClient<Channel>, agent: &Minted, text: &str) -> String {
    let request = CreateInputRequest { text: text.to_owned(), ..CreateInputRequest::default() };
    client.create_input(authed(request, agent)).await.expect("create input").into_inner().execution_public_id
}

async fn events(
    client: &mut AgentServiceClient<Channel>,
    agent: &Minted,
    execution: &str,
    after: &str,
    follow: bool,
) -> Vec<nexus_proto::agent::v1::ExecutionEvent> {
    let request = StreamEventsRequest {
        execution_public_id: execution.to_owned(),
        after: after.to_owned(),
        follow,
        transcript: false,
        progress: false,
    };
    let stream = client.stream_events(authed(request, agent)).await.expect("stream").into_inner();
    tokio::time::timeout(WAIT, stream.map(|e| e.expect("event")).collect::<Vec<_>>()).await.expect("stream ends")
}

/// Polls `GetExecution` until the execution is `completed`.
async fn wait_completed(
    client: &AgentServiceClient<Channel>,
    agent: &Minted,
    execution: &str,
) -> nexus_proto::agent::v1::Execution {
    wait_until("the execution to complete", WAIT, || async {
        let request = authed(
            GetExecutionRequest { execution_public_id: execution.to_owned(), tasks_after: String::new() },
            agent,
        );
        let row = client.clone().get_execution(request).await.ok()?.into_inner();
        (row.status == "completed").then_some(row)
    })
    .await
}

#[tokio::test]
async fn end_to_end_execution_over_grpc_with_a_real_runner_agent() {
    let script = json!({"rounds": [
        {"tool_calls": [
            {"id": "w", "name": "write_file", "arguments": {"path": "notes/hello.txt", "content": "one\ntwo\nthree\n"}},
            {"id": "l", "name": "bash", "arguments": {"command": "sleep 0.2; echo hi"}}
        ]},
        {"tool_calls": [{"id": "count", "name": "bash", "arguments": {"command": "wc -l < notes/hello.txt"}}]},
        {"final": "the file has {{tool:count.stdout}} lines"}
    ]});
    let server = TestServer::start(&[("e2e", script)]).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("worker-1").await;
    let workdir = tempfile::tempdir().expect("workdir");
    let state = tempfile::tempdir().expect("state");
    let _child = server.spawn_runner_agent(&runner, workdir.path(), state.path(), Some(60_000));
    wait_announced(&server, &runner).await;

    let mut client = agent_client(&server).await;
    let profile = declare(&mut client, &agent, runner.id, "scripted/e2e").await;
    assert_eq!(profile["configuration"]["approval_mode"], "bypass");
    let execution = start(&mut client, &agent, "count the lines").await;

    // Follow the stream to its end: it closes when the execution completes.
    let all = events(&mut client, &agent, &execution, "", true).await;
    let types: Vec<&str> = all.iter().map(|e| e.r#type.as_str()).collect();
    assert_eq!(types.first(), Some(&"input_materialized"));
    assert_eq!(types.iter().filter(|t| **t == "round_started").count(), 3);
    assert_eq!(types.last(), Some(&"turn_status"));

    let reply = client
        .get_execution(authed(
            GetExecutionRequest { execution_public_id: execution.clone(), tasks_after: String::new() },
            &agent,
        ))
        .await
        .expect("get");
    let row = reply.into_inner();
    assert_eq!(row.status, "completed");
    assert_eq!(row.final_text, "the file has 3 lines");
    let detail: Value = serde_json::from_str(&row.execution_json).expect("json");
    let tasks = detail["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 3);
    for task in tasks {
        assert_eq!(task["status"], "completed", "{task}");
        assert_eq!(task["runner_executor_public_id"], json!(runner.id), "each call ran on the runner");
    }
    assert_eq!(
        std::fs::read_to_string(workdir.path().join("notes/hello.txt")).expect("written by the runner"),
        "one\ntwo\nthree\n"
    );

    // The stream resumes from any cursor with exactly the rest.
    let middle = &all[all.len() / 2];
    let rest = events(&mut client, &agent, &execution, &middle.cursor, false).await;
    assert_eq!(rest.len(), all.len() - all.len() / 2 - 1);
    assert_eq!(rest.first().map(|e| &e.cursor), all.get(all.len() / 2 + 1).map(|e| &e.cursor));
    let bad = client
        .stream_events(authed(
            StreamEventsRequest {
                execution_public_id: execution,
                after: "nonsense".into(),
                follow: false,
                transcript: false,
                progress: false,
            },
            &agent,
        ))
        .await
        .expect_err("bad cursor");
    assert_eq!(nexus_proto::Refusal::from_status(&bad).code, ErrorCode::ParameterInvalid);
}

#[tokio::test]
async fn sigkill_of_runner_agent_mid_execution_settles_by_the_rules() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "s", "name": "bash", "arguments": {"command": "sleep 5; echo finished"}}]},
        {"final": "after the crash: {{tool:s}}"}
    ]});
    let server = TestServer::start(&[("crash", script)]).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("worker").await;
    let workdir = tempfile::tempdir().expect("workdir");
    let state = tempfile::tempdir().expect("state");
    let mut child = server.spawn_runner_agent(&runner, workdir.path(), state.path(), Some(1_500));
    wait_announced(&server, &runner).await;
    let mut client = agent_client(&server).await;
    declare(&mut client, &agent, runner.id, "scripted/crash").await;
    let execution = start(&mut client, &agent, "run it").await;
    let run: ExecutionId = execution.parse().expect("uuid");

    wait_until("the claim", WAIT, || async {
        server.store().task(run, key("r1t0")).await.ok().flatten().filter(|t| t.claimed).map(|_| ())
    })
    .await;
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
    // Start it again on the same state dir: it must not run the claimed tool a second time.
    let _again = server.spawn_runner_agent(&runner, workdir.path(), state.path(), Some(1_500));

    let row = wait_completed(&client, &agent, &execution).await;
    let detail: Value = serde_json::from_str(&row.execution_json).expect("json");
    // bash is not replayable: a claim that lapsed without a result is uncertain, never re-run.
    assert_eq!(detail["tasks"][0]["status"], "uncertain");
    assert_eq!(detail["tasks"][0]["error_key"], "tool_uncertain");
    assert_eq!(detail["tasks"][0]["result"], Value::Null);
    assert!(row.final_text.starts_with("after the crash: tool_uncertain"), "{}", row.final_text);
}

#[tokio::test]
async fn stop_cancels_dispatched_work() {
    let script =
        json!({"rounds": [{"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}]}, {"final": "never"}]});
    let server = TestServer::start(&[("stop", script)]).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("silent").await;
    // A runner that announces and then never claims.
    let (raw, _) = nexus_tests::RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    raw.announce(&json!({"tools": [{"name": "probe", "description": "p", "input_schema": {"type": "object"},
        "effect_profile": {"kind": "read_only", "destructive": false, "effect_scope": "closed", "idempotency": "intrinsic", "reconciliation": "none"}}]}))
        .await;
    let mut client = agent_client(&server).await;
    declare(&mut client, &agent, runner.id, "scripted/stop").await;
    let execution = start(&mut client, &agent, "wait forever").await;
    let run: ExecutionId = execution.parse().expect("uuid");
    wait_until("dispatch", WAIT, || async { server.store().task(run, key("r1t0")).await.ok().flatten().map(|_| ()) })
        .await;
    let stopped = client
        .stop_execution(authed(StopExecutionRequest { execution_public_id: execution.clone(), force: None }, &agent))
        .await
        .expect("stop")
        .into_inner();
    assert_eq!(stopped.status, "canceled");
    assert_eq!(stopped.error_key, "run_canceled");
    let task = wait_until("the cancel", WAIT, || async {
        server.store().task(run, key("r1t0")).await.ok().flatten().filter(|t| t.status == TaskStatus::Canceled)
    })
    .await;
    assert_eq!(task.error_key.as_deref(), Some("task_canceled"));
    // The claim is refused once canceled.
    assert_eq!(raw.claim(&execution, "r1t0").await.code(), Some("task_not_claimable"));
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let server = TestServer::start(&[]).await;
    let agent = server.agent("agent").await;
    let human = server.human("person").await;
    let mut client = agent_client(&server).await;
    // No declaration yet.
    let status = client
        .create_input(authed(CreateInputRequest { text: "hi".into(), ..Default::default() }, &agent))
        .await
        .expect_err("refused");
    assert_eq!(nexus_proto::Refusal::from_status(&status).code, ErrorCode::ValidationFailed);
    // A Human has no profile to declare.
    let status = client
        .declare_profile(authed(DeclareProfileRequest { body_json: json!({"configuration": {}}).to_string() }, &human))
        .await
        .expect_err("refused");
    assert_eq!(nexus_proto::Refusal::from_status(&status).code, ErrorCode::NotAgent);
    // An unknown provider is named by the resolver word.
    let body = json!({"configuration": {"default_model": "nowhere/model"}});
    let status = client
        .declare_profile(authed(DeclareProfileRequest { body_json: body.to_string() }, &agent))
        .await
        .expect_err("refused");
    let refusal = nexus_proto::Refusal::from_status(&status);
    assert_eq!(refusal.code, ErrorCode::ValidationFailed);
    assert!(refusal.message.contains("unknown_provider"), "{}", refusal.message);
    // OpenRouter without its key.
    let body = json!({"configuration": {"default_model": "openrouter/z-ai/glm-5.3"}});
    let status = client
        .declare_profile(authed(DeclareProfileRequest { body_json: body.to_string() }, &agent))
        .await
        .expect_err("refused");
    assert!(nexus_proto::Refusal::from_status(&status).message.contains("missing_credential"));
    // Nothing was stored by the refusals.
    let profile = server.store().profile(agent.member()).await.expect("store").expect("profile");
    assert_eq!(profile.configuration, None);
    assert_eq!(profile.system_prompt_version, 0);
    // The HTTP door answers the same words with the spec's statuses.
    let http = reqwest::Client::new();
    let put = |body: String| {
        http.put(format!("{}/agent_api/v1/profile/configuration", server.url()))
            .bearer_auth(&agent.token)
            .body(body)
            .send()
    };
    let response = put("not json".into()).await.expect("put");
    assert_eq!(response.status(), 400);
    assert_eq!(response.json::<Value>().await.expect("json")["code"], "parameter_missing");
    let response = put(json!({"configuration": {"approval_mode": "maybe"}}).to_string()).await.expect("put");
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["code"], "validation_failed");
    assert!(body["message"].as_str().unwrap_or_default().starts_with("configuration.approval_mode"));
    let response = put(json!({"configuration": {"default_model": "scripted/default"}, "prompt_documents": {"system_prompt": {"content": "be brief"}}}).to_string()).await.expect("put");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["prompt_documents"]["system_prompt"]["version"], 1);
    assert_eq!(body["configuration"]["default_model"], "scripted/default");
}

#[tokio::test]
async fn one_server_per_data_dir() {
    let first = TestServer::start(&[]).await;
    let config = nexus_actors::config::ServerConfig {
        data_dir: first.data_dir.path().to_owned(),
        ..nexus_actors::config::ServerConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let second = nexus_actors::start(listener, config.clone()).await;
    assert!(
        matches!(
            second,
            Err(nexus_actors::ServeError::StoreInUse(nexus_actors::store::LockError::DataDirInUse { .. }))
        ),
        "{second:?}"
    );
    // Once the first stops, the data dir is free again.
    first.server.shutdown().await.expect("shutdown");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let third = nexus_actors::start(listener, config).await.expect("the lock was released");
    third.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn admission_bounds_and_runner_selection() {
    let server = TestServer::start(&[]).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("runner").await;
    let other = server.runner("other").await;
    let mut client = agent_client(&server).await;
    declare(&mut client, &agent, runner.id, "scripted/default").await;
    let too_long = CreateInputRequest { text: "x".repeat(1_048_577), ..CreateInputRequest::default() };
    let status = client.create_input(authed(too_long, &agent)).await.expect_err("refused");
    assert_eq!(nexus_proto::Refusal::from_status(&status).code, ErrorCode::ContentTooLarge);
    let wrong_runner = CreateInputRequest {
        text: "hi".into(),
        runner_executor_public_id: other.id.to_string(),
        ..CreateInputRequest::default()
    };
    let status = client.create_input(authed(wrong_runner, &agent)).await.expect_err("refused");
    assert_eq!(nexus_proto::Refusal::from_status(&status).code, ErrorCode::RunnerNotDeclared);
    let huge = DeclareProfileRequest {
        body_json: format!("{{\"configuration\": {{}}, \"pad\": \"{}\"}}", "x".repeat(4 * 1024 * 1024)),
    };
    let status = client.declare_profile(authed(huge, &agent)).await.expect_err("refused");
    assert_eq!(nexus_proto::Refusal::from_status(&status).code, ErrorCode::ContentTooLarge);
    // An inline declaration is validated at admission and names its field.
    let inline = CreateInputRequest {
        text: "hi".into(),
        execution_declaration_json: json!({"default_model": "scripted/default", "approval_mode": "never"}).to_string(),
        ..CreateInputRequest::default()
    };
    let status = client.create_input(authed(inline, &agent)).await.expect_err("refused");
    let refusal = nexus_proto::Refusal::from_status(&status);
    assert_eq!(refusal.code, ErrorCode::ValidationFailed);
    assert!(refusal.message.contains("execution_declaration.approval_mode"), "{}", refusal.message);
    // A valid inline declaration runs without the standing profile's tools.
    let inline = CreateInputRequest {
        text: "echo me".into(),
        execution_declaration_json: json!({"default_model": "scripted/default"}).to_string(),
        ..CreateInputRequest::default()
    };
    let execution =
        client.create_input(authed(inline, &agent)).await.expect("admitted").into_inner().execution_public_id;
    let row = wait_completed(&client, &agent, &execution).await;
    assert!(row.final_text.contains("echo me"), "{}", row.final_text);
    // Stopping a finished execution answers its row.
    let stopped = client
        .stop_execution(authed(StopExecutionRequest { execution_public_id: execution, force: None }, &agent))
        .await
        .expect("stop")
        .into_inner();
    assert_eq!(stopped.status, "completed");
}
