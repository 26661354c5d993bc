//! Integration tests of the runner fabric: a real server on 127.0.0.1:0 and scripted runners that
//! speak the stream frame by frame (`docs/protocol.md`, "Announce" through "Expiry").

use nexus_actors::doors::api::FeedType;
use nexus_actors::store::EventType;
use nexus_proto::TaskKey;
use nexus_proto::{ErrorCode, ExecutionId, ExecutorStatus, TaskStatus};
use nexus_tests::key;
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use nexus_actors::actors::executor::OFFER_WINDOW;
use nexus_actors::doors::api::CreateInput;
use nexus_actors::store::TaskRow;
use nexus_proto::runner::v1::{WorkAvailable, nexus_frame};
use nexus_tests::{Minted, RawRunner, Reply, TcpProxy, TestServer, wait_until};

const WAIT: Duration = Duration::from_secs(20);

fn effect(kind: &str, idempotency: &str) -> Value {
    json!({"kind": kind, "destructive": kind == "write", "effect_scope": "closed", "idempotency": idempotency, "reconciliation": "none"})
}

fn probe_tool(effect_profile: Value, timeout_ms: u64) -> Value {
    json!({"name": "probe", "description": "Probe the machine.", "input_schema": {"type": "object"},
           "effect_profile": effect_profile, "timeout_ms": timeout_ms})
}

fn probe_script() -> Value {
    json!({"rounds": [
        {"tool_calls": [{"id": "c1", "name": "probe", "arguments": {"depth": 1}}]},
        {"final": "probe said {{tool:c1}}"}
    ]})
}

struct Setup {
    server: TestServer,
    agent: Minted,
    runner: Minted,
    raw: RawRunner,
}

/// A server, an Agent whose profile imports runner A's tools, and runner A connected and
/// announced.
async fn setup(tool: Value) -> Setup {
    let server = TestServer::start(&[("probe", probe_script())]).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("runner-a").await;
    let (raw, hello) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    assert!(matches!(hello, Reply::Frame(nexus_frame::Frame::Welcome(_))), "{hello:?}");
    let announced = raw.announce(&json!({"tools": [tool]})).await;
    let Reply::Frame(nexus_frame::Frame::Announced(announced)) = &announced else { panic!("{announced:?}") };
    // The answer shows the executor as discovery does: this stream is attached, so it is online.
    let executor: Value = serde_json::from_str(&announced.executor_json).expect("executor_json");
    assert_eq!(executor["presence"], "online", "{executor}");
    assert!(executor["connected_at"].is_i64(), "{executor}");
    declare(&server, &agent, runner.id, "scripted/probe").await;
    Setup { server, agent, runner, raw }
}

async fn declare(server: &TestServer, agent: &Minted, runner: Uuid, model: &str) {
    let caller = server.caller(agent).await;
    let body = json!({"configuration": {"runner_executor_public_ids": [runner], "approval_mode": "bypass", "default_model": model}});
    server.server.api.declare(&caller, body).await.expect("declared");
}

async fn admit(server: &TestServer, agent: &Minted, text: &str) -> ExecutionId {
    let caller = server.caller(agent).await;
    let input = CreateInput { text: text.to_owned(), ..CreateInput::default() };
    server.server.api.create_input(&caller, input).await.expect("admitted").execution_public_id
}

async fn execution(server: &TestServer, agent: &Minted, id: ExecutionId) -> Value {
    let caller = server.caller(agent).await;
    server.server.api.execution(&caller, id).await.expect("execution")
}

async fn wait_status(server: &TestServer, agent: &Minted, id: ExecutionId, status: &str) -> Value {
    wait_until(&format!("execution {status}"), WAIT, || async {
        let row = execution(server, agent, id).await;
        (row["status"] == status).then_some(row)
    })
    .await
}

#[tokio::test]
async fn runner_b_cannot_claim_runner_a_task() {
    let mut s = setup(probe_tool(effect("read_only", "intrinsic"), 60_000)).await;
    let runner_b = s.server.runner("runner-b").await;
    let (raw_b, hello) = RawRunner::connect(&s.server.url(), runner_b.id, &runner_b.token).await;
    assert!(hello.code().is_none(), "{hello:?}");
    assert!(
        raw_b
            .announce(&json!({"tools": [probe_tool(effect("read_only", "intrinsic"), 60_000)]}))
            .await
            .code()
            .is_none()
    );

    let run = admit(&s.server, &s.agent, "probe it").await;
    let work = s.raw.next_work(WAIT).await.expect("work for A");
    assert_eq!(work.run_public_id, run.to_string());
    assert_eq!(work.tool_name, "probe");

    // B announces the same tool, and still can never claim work accepted for A.
    let refused = raw_b.claim(&work.run_public_id, &work.task_key).await;
    assert_eq!(refused.code(), Some("not_addressed_here"));
    assert!(matches!(refused, Reply::Refused { http_status: 409, .. }));
    // B cannot commit it either, with any token.
    let commit = raw_b.commit(&work.run_public_id, &work.task_key, "forged", &json!({"content": "x"})).await;
    assert_eq!(commit.code(), Some("not_addressed_here"));

    let (token, task) = s.raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("A claims");
    assert_eq!(task["tool_input"], json!({"depth": 1}));
    assert_eq!(task["addressed_to"]["executor_public_id"], json!(s.runner.id));
    let done = s.raw.commit(&work.run_public_id, &work.task_key, &token, &json!({"content": "all good"})).await;
    assert_eq!(done.committed(), Some((false, "completed".to_owned())));
    let row = wait_status(&s.server, &s.agent, run, "completed").await;
    assert_eq!(row["final_text"], "probe said all good");
}

#[tokio::test]
async fn repeat_commit_is_idle_and_wrong_token_is_stale_claim() {
    let mut s = setup(probe_tool(effect("read_only", "intrinsic"), 60_000)).await;
    let run = admit(&s.server, &s.agent, "probe it").await;
    let work = s.raw.next_work(WAIT).await.expect("work");
    let (token, _) = s.raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claim");

    let wrong = s.raw.commit(&work.run_public_id, &work.task_key, "not-the-token", &json!({"content": "x"})).await;
    assert_eq!(wrong.code(), Some("stale_claim"));
    let first = s.raw.commit(&work.run_public_id, &work.task_key, &token, &json!({"content": "first"})).await;
    assert_eq!(first.committed(), Some((false, "completed".to_owned())));
    let repeat = s.raw.commit(&work.run_public_id, &work.task_key, &token, &json!({"content": "second"})).await;
    assert_eq!(repeat.committed(), Some((true, "completed".to_owned())), "a repeat is an idle success");
    let wrong_after =
        s.raw.commit(&work.run_public_id, &work.task_key, "not-the-token", &json!({"content": "x"})).await;
    assert_eq!(wrong_after.code(), Some("stale_claim"));

    let row = wait_status(&s.server, &s.agent, run, "completed").await;
    assert_eq!(row["tasks"][0]["result"]["content"], "first", "write-once keeps the first result");
    assert_eq!(row["final_text"], "probe said first");
}

#[tokio::test]
async fn a_claim_is_never_granted_twice() {
    let mut s = setup(probe_tool(effect("read_only", "intrinsic"), 60_000)).await;
    let _run = admit(&s.server, &s.agent, "probe it").await;
    let work = s.raw.next_work(WAIT).await.expect("work");
    // Two claims race on the same stream, and a third comes from a second stream of the same
    // runner after the first is fenced: exactly one is granted.
    let (a, b) = tokio::join!(
        s.raw.claim(&work.run_public_id, &work.task_key),
        s.raw.claim(&work.run_public_id, &work.task_key)
    );
    let granted = [&a, &b].iter().filter(|r| r.granted().is_some()).count();
    assert_eq!(granted, 1, "{a:?} {b:?}");
    let loser = if a.granted().is_some() { &b } else { &a };
    assert_eq!(loser.code(), Some("already_claimed"));

    let (again, hello) = RawRunner::connect(&s.server.url(), s.runner.id, &s.runner.token).await;
    assert!(hello.code().is_none());
    assert_eq!(again.claim(&work.run_public_id, &work.task_key).await.code(), Some("already_claimed"));
}

#[tokio::test]
async fn expiry_is_timed_out_when_replayable_and_uncertain_otherwise() {
    // Claimed and replayable: timed_out.
    let mut s = setup(probe_tool(effect("read_only", "intrinsic"), 300)).await;
    let run = admit(&s.server, &s.agent, "probe it").await;
    let work = s.raw.next_work(WAIT).await.expect("work");
    let (token, _) = s.raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claim");
    let row = wait_status(&s.server, &s.agent, run, "completed").await;
    assert_eq!(row["tasks"][0]["status"], "timed_out");
    assert_eq!(row["tasks"][0]["error_key"], "tool_timeout");
    // The deadline wins: a commit after it changes nothing.
    let late = s.raw.commit(&work.run_public_id, &work.task_key, &token, &json!({"content": "late"})).await;
    assert_eq!(late.committed(), Some((true, "timed_out".to_owned())));

    // Claimed and not replayable: uncertain.
    let mut w = setup(probe_tool(effect("write", "none"), 300)).await;
    let run = admit(&w.server, &w.agent, "probe it").await;
    let work = w.raw.next_work(WAIT).await.expect("work");
    w.raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claim");
    let row = wait_status(&w.server, &w.agent, run, "completed").await;
    assert_eq!(row["tasks"][0]["status"], "uncertain");
    assert_eq!(row["tasks"][0]["error_key"], "tool_uncertain");
    assert!(row["final_text"].as_str().unwrap_or_default().contains("tool_uncertain"));

    // Never claimed, even when not replayable: timed_out.
    let mut n = setup(probe_tool(effect("write", "none"), 300)).await;
    let run = admit(&n.server, &n.agent, "probe it").await;
    n.raw.next_work(WAIT).await.expect("work");
    let row = wait_status(&n.server, &n.agent, run, "completed").await;
    assert_eq!(row["tasks"][0]["status"], "timed_out");
    assert_eq!(row["tasks"][0]["claimed"], false);
}

#[tokio::test]
async fn claiming_restarts_the_park_clock_and_extend_is_capped() {
    let mut s = setup(probe_tool(effect("read_only", "intrinsic"), 5_000)).await;
    let _run = admit(&s.server, &s.agent, "probe it").await;
    let work = s.raw.next_work(WAIT).await.expect("work");
    let before = s.server.store().clock().now_ms();
    let granted = s.raw.claim(&work.run_public_id, &work.task_key).await;
    let Reply::Frame(nexus_frame::Frame::ClaimGranted(claim)) = &granted else { panic!("{granted:?}") };
    assert!(claim.deadline_at_ms >= before + 5_000, "the holder gets a full deadline");
    let token = claim.claim_token.clone();

    assert_eq!(s.raw.extend(&work.run_public_id, &work.task_key, &token, 0).await.code(), Some("invalid_timeout_ms"));
    assert_eq!(
        s.raw.extend(&work.run_public_id, &work.task_key, &token, 5_001).await.code(),
        Some("extension_too_long")
    );
    assert_eq!(s.raw.extend(&work.run_public_id, &work.task_key, "other", 1_000).await.code(), Some("not_claimant"));
    let extended = s.raw.extend(&work.run_public_id, &work.task_key, &token, 4_000).await;
    assert!(matches!(extended, Reply::Frame(nexus_frame::Frame::Extended(_))), "{extended:?}");
    let status = s.raw.claim_status(&work.run_public_id, &work.task_key, &token).await;
    assert_eq!(
        status,
        Reply::Frame(nexus_frame::Frame::ClaimState(nexus_proto::runner::v1::ClaimState { active: true }))
    );
    assert_eq!(s.raw.claim_status(&work.run_public_id, &work.task_key, "other").await.code(), Some("not_claimant"));
}

#[tokio::test]
async fn announcement_refusal_words() {
    let server = TestServer::start(&[]).await;
    let runner = server.runner("runner").await;
    let (raw, _) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    let good = effect("read_only", "intrinsic");
    let mut extra_key = good.clone();
    extra_key["world"] = json!("closed");
    let cases: Vec<(&str, Value, &str)> = vec![
        ("missing tools", json!({}), "parameter_missing"),
        (
            "wire name in a reserved namespace",
            json!({"tools": [{"name": "delegate_task", "effect_profile": good}]}),
            "reserved_namespace",
        ),
        (
            "canonical name in a reserved namespace",
            json!({"tools": [{"name": "nexus.runners.list", "effect_profile": good}]}),
            "reserved_namespace",
        ),
        ("bad name", json!({"tools": [{"name": "no spaces", "effect_profile": good}]}), "invalid_announcement"),
        ("name too long", json!({"tools": [{"name": "x".repeat(65), "effect_profile": good}]}), "invalid_announcement"),
        (
            "repeated name",
            json!({"tools": [{"name": "a", "effect_profile": good}, {"name": "a", "effect_profile": good}]}),
            "invalid_announcement",
        ),
        ("missing effect profile", json!({"tools": [{"name": "a"}]}), "invalid_announcement"),
        ("sixth effect key", json!({"tools": [{"name": "a", "effect_profile": extra_key}]}), "invalid_announcement"),
        (
            "schema not an object schema",
            json!({"tools": [{"name": "a", "effect_profile": good, "input_schema": {"type": "string"}}]}),
            "invalid_announcement",
        ),
        (
            "environment over its bound",
            json!({"tools": [], "environment": {"x": "y".repeat(70_000)}}),
            "validation_failed",
        ),
    ];
    for (case, body, word) in cases {
        assert_eq!(raw.announce(&body).await.code(), Some(word), "{case}");
    }
    // A refusal changes nothing; a valid announcement replaces the list whole.
    assert!(server.store().executor(runner.runner()).await.expect("row").expect("runner").announced_at.is_none());
    assert!(
        raw.announce(&json!({"tools": [{"name": "b", "effect_profile": good}, {"name": "a", "effect_profile": good}]}))
            .await
            .code()
            .is_none()
    );
    assert!(raw.announce(&json!({"tools": [{"name": "c", "effect_profile": good}]})).await.code().is_none());
    let row = server.store().executor(runner.runner()).await.expect("row").expect("runner");
    assert_eq!(row.announcement["tools"], json!([{"name": "c", "effect_profile": good}]));
}

#[tokio::test]
async fn cross_plane_credentials_get_401() {
    let server = TestServer::start(&[]).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("runner").await;
    let http = reqwest::Client::new();
    let url = format!("{}/agent_api/v1/profile", server.url());

    let ok = http.get(&url).bearer_auth(&agent.token).send().await.expect("get");
    assert_eq!(ok.status(), 200);
    let body: Value = ok.json().await.expect("json");
    assert_eq!(body["member"]["public_id"], json!(agent.id));
    assert_eq!(body["configuration"]["tool_definitions"], json!([]));

    // A transport credential on a member door.
    let refused = http.get(&url).bearer_auth(&runner.token).send().await.expect("get");
    assert_eq!(refused.status(), 401);
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["code"], "unauthorized");
    let put = http
        .put(format!("{}/agent_api/v1/profile/configuration", server.url()))
        .bearer_auth(&runner.token)
        .json(&json!({"configuration": {}}))
        .send()
        .await
        .expect("put");
    assert_eq!(put.status(), 401);

    // A member credential on the runner stream.
    let (_raw, hello) = RawRunner::connect(&server.url(), runner.id, &agent.token).await;
    assert_eq!(hello.code(), Some("unauthorized"));
    assert!(matches!(hello, Reply::Refused { http_status: 401, .. }));
    // Another runner's transport credential.
    let other = server.runner("other").await;
    let (_raw, hello) = RawRunner::connect(&server.url(), runner.id, &other.token).await;
    assert_eq!(hello.code(), Some("unauthorized"));

    // The gRPC client API refuses a transport credential too.
    let channel = tonic::transport::Endpoint::from_shared(server.url()).expect("url").connect().await.expect("connect");
    let mut client = nexus_proto::agent::v1::agent_service_client::AgentServiceClient::new(channel);
    let mut request = tonic::Request::new(nexus_proto::agent::v1::GetProfileRequest {});
    request.metadata_mut().insert("authorization", format!("Bearer {}", runner.token).parse().expect("header"));
    let status = client.get_profile(request).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert_eq!(nexus_proto::Refusal::from_status(&status).code, ErrorCode::Unauthorized);
}

#[tokio::test]
async fn reconnect_offers_the_inbox_again_and_fences_the_old_stream() {
    let mut s = setup(probe_tool(effect("read_only", "intrinsic"), 60_000)).await;
    let run = admit(&s.server, &s.agent, "probe it").await;
    let first = s.raw.next_work(WAIT).await.expect("work");
    // A second Hello for the same runner fences the first stream and is offered the inbox again.
    let (mut second, hello) = RawRunner::connect(&s.server.url(), s.runner.id, &s.runner.token).await;
    assert!(hello.code().is_none());
    let again = second.next_work(WAIT).await.expect("offered again");
    assert_eq!(
        (again.run_public_id.as_str(), again.task_key.as_str()),
        (first.run_public_id.as_str(), first.task_key.as_str())
    );
    assert_eq!(
        s.raw.claim(&first.run_public_id, &first.task_key).await.code(),
        Some("lost"),
        "the fenced stream is closed"
    );
    let (token, _) = second.claim(&again.run_public_id, &again.task_key).await.granted().expect("claim");
    second
        .commit(&again.run_public_id, &again.task_key, &token, &json!({"content": "ok"}))
        .await
        .committed()
        .expect("commit");
    let row = wait_status(&s.server, &s.agent, run, "completed").await;
    assert_eq!(row["tasks"][0]["result"]["content"], "ok");
}

/// The stream is cut while the tool runs on runner-agent: its result still settles the call, once.
///
/// The cut waits for the tool to start (it leaves `started` in the workdir and then waits for
/// `go`), not for the row to read `claimed`: nexus writes the claim before its grant reaches the
/// runner, and a cut in between loses the grant for good (a claim is never granted again), so
/// the call would lapse at its deadline instead. That race is the chaos suite's lost-grant
/// scenario; this test is about a result that survives the cut.
#[tokio::test]
async fn a_cut_stream_still_records_the_result_exactly_once() {
    let command = "touch started; while [ ! -e go ]; do sleep 0.02; done; echo slept";
    let server = TestServer::start(&[(
        "sleepy",
        json!({"rounds": [
            {"tool_calls": [{"id": "s", "name": "bash", "arguments": {"command": command}}]},
            {"final": "bash said {{tool:s.stdout}}"}
        ]}),
    )])
    .await;
    let agent = server.agent("agent").await;
    let runner = server.runner("runner").await;
    let proxy = TcpProxy::start(server.server.addr).await;
    let workdir = tempfile::tempdir().expect("workdir");
    let state_dir = tempfile::tempdir().expect("state");
    let config = nexus_tests::agent_config(proxy.url(), &runner, workdir.path(), state_dir.path());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent_task = tokio::spawn(nexus_runner_agent::run(config, async {
        let _ = stop_rx.await;
    }));
    wait_until("announcement", WAIT, || async {
        server.store().executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
    })
    .await;
    declare(&server, &agent, runner.id, "scripted/sleepy").await;
    let run = admit(&server, &agent, "sleep").await;
    // Cut the stream while the tool runs (after the grant reached the runner, before the commit).
    wait_until("the tool to start on the runner", WAIT, || async {
        workdir.path().join("started").exists().then_some(())
    })
    .await;
    assert!(proxy.cut() >= 1, "a live stream was cut");
    std::fs::write(workdir.path().join("go"), "").expect("let the tool finish");
    let row = wait_status(&server, &agent, run, "completed").await;
    assert_eq!(row["final_text"], "bash said slept");
    assert_eq!(row["tasks"][0]["status"], "completed");
    // Exactly one settlement was recorded for the task.
    let caller = server.caller(&agent).await;
    let events: Vec<_> =
        futures::StreamExt::collect::<Vec<_>>(server.server.api.events(&caller, run, "", false).await.expect("events"))
            .await;
    let settled = events
        .iter()
        .filter_map(|e| e.as_ref().ok())
        .filter(|e| {
            e.event_type == FeedType::Durable(EventType::TaskStatus)
                && e.data["task_key"] == "r1t0"
                && e.data["status"] == "completed"
        })
        .count();
    assert_eq!(settled, 1);
    let _ = stop_tx.send(());
    agent_task.await.expect("agent joins").expect("agent stops cleanly");
}

#[tokio::test]
async fn progress_is_accepted_from_the_claimant_only() {
    use nexus_proto::runner::v1::{Progress, runner_frame};
    let mut s = setup(probe_tool(effect("read_only", "intrinsic"), 60_000)).await;
    let _run = admit(&s.server, &s.agent, "probe it").await;
    let work = s.raw.next_work(WAIT).await.expect("work");
    let (token, _) = s.raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claim");
    let progress = |token: &str, frame: &str| {
        runner_frame::Frame::Progress(Progress {
            run_public_id: work.run_public_id.clone(),
            task_key: work.task_key.clone(),
            claim_token: token.to_owned(),
            frame_json: frame.to_owned(),
        })
    };
    let accepted = s.raw.request(progress(&token, r#"{"text_tail": "50%"}"#)).await;
    assert!(matches!(accepted, Reply::Frame(nexus_frame::Frame::ProgressAccepted(_))), "{accepted:?}");
    // Too fast for the 250 ms throttle: still accepted, silently dropped.
    let throttled = s.raw.request(progress(&token, r#"{"text_tail": "51%"}"#)).await;
    assert!(matches!(throttled, Reply::Frame(nexus_frame::Frame::ProgressAccepted(_))), "{throttled:?}");
    assert_eq!(s.raw.request(progress("other", "{}")).await.code(), Some("not_claimant"));
    assert_eq!(s.raw.request(progress(&token, "[1]")).await.code(), Some("invalid_frame"));
    let big = format!(r#"{{"text_tail": "{}"}}"#, "x".repeat(70_000));
    assert_eq!(s.raw.request(progress(&token, &big)).await.code(), Some("frame_too_large"));
}

#[tokio::test]
async fn health_and_reflection_are_served() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let server = TestServer::start(&[]).await;
    let channel = tonic::transport::Endpoint::from_shared(server.url()).expect("url").connect().await.expect("connect");
    let mut health = HealthClient::new(channel.clone());
    for service in ["nexus.runner.v1.RunnerService", "nexus.agent.v1.AgentService"] {
        let reply = health.check(HealthCheckRequest { service: service.into() }).await.expect("health").into_inner();
        assert_eq!(reply.status, ServingStatus::Serving as i32, "{service}");
    }
    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies =
        reflection.server_reflection_info(tokio_stream::iter([request])).await.expect("reflection").into_inner();
    let reply = replies.message().await.expect("reply").expect("one reply");
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else { panic!("{reply:?}") };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in ["nexus.agent.v1.AgentService", "nexus.runner.v1.RunnerService", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
    }
}

#[tokio::test]
async fn repairing_fences_the_old_stream_token_and_claims() {
    let server = TestServer::start_with(&[("probe", probe_script())], |config| {
        config.runner.ping_interval_ms = 100;
        config.runner.liveness_timeout_ms = 2_000;
    })
    .await;
    let agent = server.agent("agent").await;
    let runner = server.runner("runner-a").await;
    let (mut old, hello) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    assert!(hello.code().is_none());
    old.announce(&json!({"tools": [probe_tool(effect("read_only", "intrinsic"), 60_000)]})).await;
    declare(&server, &agent, runner.id, "scripted/probe").await;
    let _run = admit(&server, &agent, "probe it").await;
    let work = old.next_work(WAIT).await.expect("work");
    let (old_token, _) = old.claim(&work.run_public_id, &work.task_key).await.granted().expect("claim");

    let repaired = nexus_actors::cli::admin::repair_runner(server.store(), runner.runner()).await.expect("repaired");
    assert_eq!(repaired["credential_epoch"], 1);
    let new_credential = repaired["token"].as_str().expect("token").to_owned();
    // The old stream is closed within a ping interval, and its credential no longer says Hello.
    wait_until("the old stream to be fenced", WAIT, || async {
        (old.claim_status(&work.run_public_id, &work.task_key, &old_token).await == Reply::Lost).then_some(())
    })
    .await;
    let (_stale, hello) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    assert_eq!(hello.code(), Some("unauthorized"));
    // The new credential connects, and the claim granted under the old epoch is fenced.
    let (fresh, hello) = RawRunner::connect(&server.url(), runner.id, &new_credential).await;
    assert!(hello.code().is_none(), "{hello:?}");
    let commit = fresh.commit(&work.run_public_id, &work.task_key, &old_token, &json!({"content": "late"})).await;
    assert_eq!(commit.code(), Some("stale_claim"));
    assert_eq!(fresh.extend(&work.run_public_id, &work.task_key, &old_token, 1_000).await.code(), Some("not_claimant"));
}

#[tokio::test]
async fn a_revoked_runner_gets_no_new_work_and_leaves_discovery() {
    let mut s = setup(probe_tool(effect("read_only", "intrinsic"), 60_000)).await;
    let http = nexus_tests::Http::new(&s.server.url(), Some(&s.agent.token));
    let listed = http.get("/agent_api/v1/executors").await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.body["executors"][0]["public_id"], json!(s.runner.id));
    assert_eq!(listed.body["executors"][0]["presence"], "online");
    assert_eq!(listed.body["executors"][0]["served_tools"][0]["name"], "probe");

    nexus_actors::cli::admin::revoke_runner(s.server.store(), s.runner.runner()).await.expect("revoked");
    let run = admit(&s.server, &s.agent, "probe it").await;
    // Eligibility is checked at acceptance: the only candidate is revoked, so the execution is
    // refused at materialization with the eligibility word rather than run without its runner
    // (its calls failing `unknown_tool`).
    let row = s.server.settled(run, WAIT).await;
    assert_eq!(row.error_key.as_deref(), Some("runner_not_eligible"));
    assert!(s.server.store().tasks_of(run).await.expect("tasks").is_empty());
    assert!(s.raw.next_work(Duration::from_millis(300)).await.is_none(), "no work is offered to a revoked runner");
    assert_eq!(http.get("/agent_api/v1/executors").await.body["executors"], json!([]));
    assert_eq!(http.get(&format!("/agent_api/v1/executors/{}", s.runner.id)).await.status, 404);
}

#[tokio::test]
async fn a_revoked_runner_is_never_paired_again() {
    let server = TestServer::start(&[]).await;
    let runner = server.runner("runner").await;
    nexus_actors::cli::admin::revoke_runner(server.store(), runner.runner()).await.expect("revoked");
    let refused = nexus_actors::cli::admin::repair_runner(server.store(), runner.runner()).await.expect_err("refused");
    assert_eq!(refused.code, ErrorCode::NotEligible);
    let row = server.store().executor(runner.runner()).await.expect("store").expect("row");
    assert_eq!((row.status, row.credential_epoch), (ExecutorStatus::Revoked, 0), "the row is left as it was");
    let (_raw, hello) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    assert_eq!(hello.code(), Some("unauthorized"));
    let unknown = nexus_actors::cli::admin::repair_runner(server.store(), nexus_proto::RunnerId::new_v4())
        .await
        .expect_err("unknown");
    assert_eq!(unknown.code, ErrorCode::NotFound);
}

#[tokio::test]
async fn discovery_shows_presence_and_refuses_other_kinds() {
    let server = TestServer::start(&[]).await;
    let agent = server.agent("agent").await;
    let never = server.runner("never").await;
    let gone = server.runner("gone").await;
    let here = server.runner("here").await;
    let (_here, _) = RawRunner::connect(&server.url(), here.id, &here.token).await;
    {
        let (_gone, _) = RawRunner::connect(&server.url(), gone.id, &gone.token).await;
    }
    let http = nexus_tests::Http::new(&server.url(), Some(&agent.token));
    let presence = |id: uuid::Uuid| {
        let http = http.clone();
        async move { http.get(&format!("/agent_api/v1/executors/{id}")).await.body["presence"].as_str().map(str::to_owned) }
    };
    wait_until("the dropped stream to show offline", WAIT, || async {
        (presence(gone.id).await.as_deref() == Some("offline")).then_some(())
    })
    .await;
    assert_eq!(presence(never.id).await.as_deref(), Some("not_yet_seen"));
    assert_eq!(presence(here.id).await.as_deref(), Some("online"));
    let all = http.get("/agent_api/v1/executors?kind=runner").await;
    assert_eq!(all.body["executors"].as_array().map(Vec::len), Some(3));
    let wrong = http.get("/agent_api/v1/executors?kind=agent_application").await;
    assert_eq!((wrong.status, wrong.code()), (400, Some("parameter_invalid")));
    // A malformed id is bad input, as on every door that takes an id; an unknown one is 404.
    let malformed = http.get("/agent_api/v1/executors/not-a-uuid").await;
    assert_eq!((malformed.status, malformed.code()), (400, Some("parameter_invalid")));
    assert_eq!(http.get(&format!("/agent_api/v1/executors/{}", uuid::Uuid::new_v4())).await.status, 404);
    let transport = nexus_tests::Http::new(&server.url(), Some(&here.token)).get("/agent_api/v1/executors").await;
    assert_eq!((transport.status, transport.code()), (401, Some("unauthorized")));
}

#[tokio::test]
async fn shutdown_closes_runner_streams_first() {
    let server = TestServer::start(&[]).await;
    let runner = server.runner("runner").await;
    let (raw, hello) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    assert!(hello.code().is_none());
    assert_eq!(server.server.api.root.census().await.expect("census").connections, 1);
    let TestServer { server: running, data_dir: _keep, .. } = server;
    running.shutdown().await.expect("a clean shutdown");
    // The runner sees its stream end (it would reconnect to the next server).
    assert_eq!(raw.claim(&Uuid::new_v4().to_string(), "r1t0").await, Reply::Lost);
}

/// The task keys of `tasks` in the inbox's offer order, `(started_at, task_key)`.
fn offer_order<'a>(tasks: impl IntoIterator<Item = &'a TaskRow>) -> Vec<String> {
    let mut order: Vec<(i64, TaskKey)> = tasks.into_iter().map(|t| (t.started_at, t.task_key)).collect();
    order.sort();
    order.into_iter().map(|(_, key)| key.to_string()).collect()
}

fn keys(work: &[WorkAvailable]) -> Vec<String> {
    work.iter().map(|w| w.task_key.clone()).collect()
}

/// A request whose answer arrives after every frame nexus queued before it: once it is answered,
/// [`RawRunner::received_work`] holds every offer sent so far. Asserts the stream is still open.
async fn round_trip(raw: &RawRunner, run: ExecutionId) {
    let answer = raw.claim_status(&run.to_string(), "r1t0", "not-a-token").await;
    assert_eq!(answer.code(), Some("not_claimant"), "the stream still answers");
}

/// Claims every offered task at once and commits each, except `hold`, which is only claimed; its
/// token is returned.
async fn claim_and_commit(raw: &RawRunner, work: &[WorkAvailable], hold: Option<&str>) -> Option<String> {
    let held = futures::future::join_all(work.iter().map(|w| async move {
        let reply = raw.claim(&w.run_public_id, &w.task_key).await;
        let Some((token, _)) = reply.granted() else { panic!("claim {}: {reply:?}", w.task_key) };
        if hold == Some(w.task_key.as_str()) {
            return Some(token);
        }
        let done = raw.commit(&w.run_public_id, &w.task_key, &token, &json!({"content": "ok"})).await;
        assert_eq!(done.committed(), Some((false, "completed".to_owned())), "commit {}", w.task_key);
        None
    }))
    .await;
    held.into_iter().flatten().next()
}

#[tokio::test]
async fn a_burst_of_offers_fills_the_offer_window_and_keeps_the_stream() {
    let mut s = setup(probe_tool(effect("read_only", "intrinsic"), 600_000)).await;
    let run = admit(&s.server, &s.agent, "probe it").await;
    assert_eq!(s.raw.next_work(WAIT).await.expect("work").task_key, "r1t0");
    // 2,999 more tasks offered at once: about three times the stream's outbound buffer.
    let copies = s.server.dispatch_copies(run, "r1t0", 2_999).await;
    round_trip(&s.raw, run).await;
    // The window fills as the offers arrive, and no further.
    let window = s.raw.received_work();
    let dispatched: Vec<String> = copies.iter().map(|t| t.task_key.to_string()).collect();
    assert_eq!(keys(&window), dispatched[..OFFER_WINDOW - 1]);
    let tally = s.raw.offer_tally();
    assert_eq!((tally.outstanding, tally.high_water, tally.repeats), (OFFER_WINDOW, OFFER_WINDOW, 0));

    // Each claim makes room for exactly one more offer, the oldest waiting.
    let waiting = offer_order(&copies[OFFER_WINDOW - 1..]);
    let claimed = &window[..10];
    for work in claimed {
        assert!(s.raw.claim(&work.run_public_id, &work.task_key).await.granted().is_some(), "{}", work.task_key);
    }
    round_trip(&s.raw, run).await;
    assert_eq!(keys(&s.raw.received_work()), waiting[..10]);
    let tally = s.raw.offer_tally();
    assert_eq!((tally.outstanding, tally.high_water, tally.repeats), (OFFER_WINDOW, OFFER_WINDOW, 0));
    assert!(s.raw.is_open(), "the burst never dropped the stream");
    assert_eq!(s.server.server.api.root.census().await.expect("census").connections, 1);
}

#[tokio::test]
async fn a_runner_with_thousands_of_open_tasks_reconnects_and_commits_them_all() {
    let Setup { server, agent, runner, mut raw } = setup(probe_tool(effect("read_only", "intrinsic"), 600_000)).await;
    let run = admit(&server, &agent, "probe it").await;
    assert_eq!(raw.next_work(WAIT).await.expect("work").task_key, "r1t0");
    // The runner goes away, and 2,999 more tasks arrive while it is gone.
    drop(raw);
    wait_until("the stream to close", WAIT, || async {
        (server.server.api.root.census().await.ok()?.connections == 0).then_some(())
    })
    .await;
    let mut inbox = server.dispatch_copies(run, "r1t0", 2_999).await;
    inbox.push(server.store().task(run, key("r1t0")).await.expect("task").expect("r1t0"));
    let expected = offer_order(&inbox);
    assert_eq!(expected[0], "r1t0");

    // It reconnects to a window over the whole inbox, oldest first, and stays connected.
    let (mut first, hello) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    assert!(matches!(hello, Reply::Frame(nexus_frame::Frame::Welcome(_))), "{hello:?}");
    round_trip(&first, run).await;
    let window = first.received_work();
    assert_eq!(keys(&window), expected[..OFFER_WINDOW]);
    // r1t0 is claimed now and committed last, so the execution waits for every copy.
    let r1t0_token = claim_and_commit(&first, &window, Some("r1t0")).await.expect("r1t0 claimed");
    round_trip(&first, run).await;
    assert_eq!(first.offer_tally().high_water, OFFER_WINDOW);

    // Another reconnect starts a fresh window over what is left: nothing claimed comes again.
    let (mut second, hello) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    assert!(hello.code().is_none(), "{hello:?}");
    round_trip(&second, run).await;
    let mut batch = second.received_work();
    assert_eq!(keys(&batch), expected[OFFER_WINDOW..2 * OFFER_WINDOW]);
    let mut committed = OFFER_WINDOW - 1;
    while committed < 2_999 {
        if batch.is_empty() {
            batch.push(second.next_work(WAIT).await.unwrap_or_else(|| panic!("no offer after {committed} commits")));
            batch.extend(second.received_work());
        }
        claim_and_commit(&second, &batch, None).await;
        committed += batch.len();
        let tally = second.offer_tally();
        assert!(tally.high_water <= OFFER_WINDOW, "{tally:?}");
        batch = second.received_work();
    }
    assert_eq!(committed, 2_999);
    let done = second.commit(&run.to_string(), "r1t0", &r1t0_token, &json!({"content": "ok"})).await;
    assert_eq!(done.committed(), Some((false, "completed".to_owned())));
    let tally = second.offer_tally();
    assert_eq!(
        (tally.received, tally.outstanding, tally.high_water, tally.repeats),
        (3_000 - OFFER_WINDOW, 0, OFFER_WINDOW, 0),
        "every task left was offered once, never more than the window at a time"
    );
    assert!(second.is_open(), "the stream stayed open throughout");

    let row = wait_status(&server, &agent, run, "completed").await;
    assert_eq!(row["final_text"], "probe said ok");
    let tasks = server.store().tasks_of(run).await.expect("tasks");
    assert_eq!(tasks.len(), 3_000);
    assert!(
        tasks.iter().all(|t| t.status == TaskStatus::Completed && t.claimed),
        "every task was claimed and committed"
    );
}
