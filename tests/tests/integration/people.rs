//! People in the loop (`docs/executions.md`, "People in the loop"): a Human made the steward of
//! an Agent approves its parked calls and posts inputs its profile answers; a viewer reads and
//! never acts; a stranger Human gets 403 `not_authorized`; another Agent still gets 404; a revoke
//! takes effect on the next request. HTTP and gRPC alike, on the suite's store.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_stream::StreamExt;

use nexus_actors::cli::admin::grants;
use nexus_actors::doors::api::Need;
use nexus_proto::agent::v1::{
    CreateInputRequest, DeclareProfileRequest, GetExecutionRequest, StopExecutionRequest, StreamEventsRequest,
    TaskDecisionRequest,
};
use nexus_proto::{ErrorCode, ExecutionId, GrantRole, MemberId, Refusal, RunStatus, TaskStatus};
use nexus_tests::{Http, Minted, RawRunner, TestServer, agent_client, authed, nexus_binary, wait_until};

const WAIT: Duration = Duration::from_secs(30);

const READ_ONLY: &str = r#"{"kind":"read_only","destructive":false,"effect_scope":"closed","idempotency":"intrinsic","reconciliation":"none"}"#;

/// A server whose Agent declares approval mode `ask` over a raw runner's `probe`: every turn
/// parks its one call until someone decides.
struct Fixture {
    server: TestServer,
    agent: Minted,
    raw: RawRunner,
}

impl Fixture {
    async fn start() -> Fixture {
        let script = json!({"rounds": [
            {"tool_calls": [{"id": "p", "name": "probe", "arguments": {"command": "ls"}}]},
            {"final": "probe={{tool:p}}"},
        ]});
        let server = TestServer::start(&[("ask", script)]).await;
        let agent = server.agent("agent").await;
        let runner = server.runner("worker").await;
        let tool = json!({"name": "probe", "description": "probe as served.", "input_schema": {"type": "object"},
            "effect_profile": serde_json::from_str::<Value>(READ_ONLY).expect("effect profile")});
        let raw = RawRunner::connect_announced(
            &server.url(),
            &runner,
            &json!({"tools": [tool], "environment": {"name": "worker"}}),
        )
        .await;
        let body = json!({"configuration": {
            "runner_executor_public_ids": [runner.id], "approval_mode": "ask", "default_model": "scripted/ask",
        }});
        let mut client = agent_client(&server).await;
        client
            .declare_profile(authed(DeclareProfileRequest { body_json: body.to_string() }, &agent))
            .await
            .expect("declared");
        Fixture { server, agent, raw }
    }

    fn http(&self, member: &Minted) -> Http {
        Http::new(&self.server.url(), Some(&member.token))
    }

    /// A Human member holding `role` on the Agent (none for `None`).
    async fn human(&self, handle: &str, role: Option<GrantRole>) -> Minted {
        let human = self.server.human(handle).await;
        if let Some(role) = role {
            grants::grant(self.server.store(), human.member(), self.agent.member(), role).await.expect("granted");
        }
        human
    }

    /// `member` posts `request` over gRPC; answers the execution and its conversation.
    async fn post(&self, member: &Minted, request: CreateInputRequest) -> Result<(ExecutionId, String), Refusal> {
        let mut client = agent_client(&self.server).await;
        let admitted = client.create_input(authed(request, member)).await.map_err(|s| Refusal::from_status(&s))?;
        let admitted = admitted.into_inner();
        Ok((admitted.execution_public_id.parse().expect("uuid"), admitted.conversation_public_id))
    }

    /// The Agent's own turn, parked at its call.
    async fn parked_turn(&self, text: &str) -> ExecutionId {
        let request = CreateInputRequest { text: text.to_owned(), ..CreateInputRequest::default() };
        let (run, _) = self.post(&self.agent, request).await.expect("admitted");
        self.server.task_in(run, "r1t0", TaskStatus::NeedsApproval).await;
        run
    }

    /// The runner serves the dispatched call of `run` with `content`.
    async fn serve(&mut self, run: ExecutionId, content: &str) {
        let work = self.raw.next_work(WAIT).await.expect("work offered");
        assert_eq!((work.run_public_id.as_str(), work.task_key.as_str()), (run.to_string().as_str(), "r1t0"));
        let (token, _) = self.raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claim granted");
        let committed =
            self.raw.commit(&work.run_public_id, &work.task_key, &token, &json!({"content": content})).await;
        assert_eq!(committed.code(), None, "commit refused: {committed:?}");
    }

    async fn completed(&self, run: ExecutionId) -> String {
        let row = wait_until("the execution to complete", WAIT, || async {
            self.server.store().execution(run).await.ok().flatten().filter(|row| row.status == RunStatus::Completed)
        })
        .await;
        row.final_text.unwrap_or_default()
    }
}

/// The execution door `verb` of `run` (`""` for the execution itself).
fn door(run: impl std::fmt::Display, verb: &str) -> String {
    if verb.is_empty() {
        return format!("/agent_api/v1/executions/{run}");
    }
    format!("/agent_api/v1/executions/{run}/{verb}")
}

fn decision(run: ExecutionId) -> TaskDecisionRequest {
    TaskDecisionRequest { execution_public_id: run.to_string(), task_key: "r1t0".into(), body_json: String::new() }
}

fn input(text: &str, agent: Option<&Minted>, conversation: Option<&str>) -> CreateInputRequest {
    CreateInputRequest {
        text: text.to_owned(),
        agent_public_id: agent.map(|a| a.id.to_string()).unwrap_or_default(),
        conversation_public_id: conversation.unwrap_or_default().to_owned(),
        ..CreateInputRequest::default()
    }
}

#[tokio::test]
async fn a_steward_approves_a_parked_call_and_posts_inputs_its_agent_answers() {
    let mut f = Fixture::start().await;
    let steward = f.human("steward", Some(GrantRole::Steward)).await;
    let person = f.http(&steward);

    // The Agent's own turn parks; the steward approves it over HTTP, and the fact names them.
    let run = f.parked_turn("look around").await;
    let approved = person.post(&format!("{}/r1t0/approve", door(run, "tasks")), &json!({})).await;
    assert_eq!(approved.status, 200, "{approved:?}");
    assert_eq!(approved.body["approval"]["origin"], "human", "{approved:?}");
    assert_eq!(approved.body["approval"]["decided_by"], json!(steward.id), "{approved:?}");
    f.serve(run, "listing").await;
    assert_eq!(f.completed(run).await, "probe=listing");
    let read = person.get(&door(run, "")).await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(
        (&read.body["member_public_id"], &read.body["posted_by_public_id"]),
        (&json!(f.agent.id), &json!(f.agent.id))
    );
    let first_conversation = read.body["conversation_public_id"].as_str().expect("conversation").to_owned();

    // A new conversation over gRPC: it names the Agent, whose profile answers; the steward
    // approves the parked call over gRPC.
    let (second, conversation) = f.post(&steward, input("steward asks", Some(&f.agent), None)).await.expect("admitted");
    assert_ne!(conversation, first_conversation);
    f.server.task_in(second, "r1t0", TaskStatus::NeedsApproval).await;
    let mut client = agent_client(&f.server).await;
    let task = client.approve_task(authed(decision(second), &steward)).await.expect("approved").into_inner();
    let task: Value = serde_json::from_str(&task.body_json).expect("task json");
    assert_eq!(task["approval"]["origin"], "human");
    f.serve(second, "from the steward").await;
    assert_eq!(f.completed(second).await, "probe=from the steward");
    // The execution is the Agent's; the input records who posted it, and both read that.
    let row = f.server.store().execution(second).await.expect("store").expect("execution");
    assert_eq!(row.member_public_id, f.agent.member());
    let stored = f.server.store().input(row.input_public_id).await.expect("store").expect("input");
    assert_eq!((stored.posted_by_public_id, stored.poster()), (Some(steward.member()), steward.member()));
    for reader in [&steward, &f.agent] {
        let shown = client
            .get_execution(authed(
                GetExecutionRequest { execution_public_id: second.to_string(), tasks_after: String::new() },
                reader,
            ))
            .await
            .expect("read")
            .into_inner();
        let shown: Value = serde_json::from_str(&shown.execution_json).expect("execution json");
        assert_eq!(
            (&shown["member_public_id"], &shown["posted_by_public_id"]),
            (&json!(f.agent.id), &json!(steward.id))
        );
    }

    // The steward continues the Agent's first conversation over HTTP (its Agent is its owner),
    // then stops the turn it started.
    let continued = person
        .post("/agent_api/v1/inputs", &json!({"text": "and then?", "conversation_public_id": first_conversation}))
        .await;
    assert_eq!(continued.status, 201, "{continued:?}");
    assert_eq!(continued.body["conversation_public_id"], json!(first_conversation));
    let third: ExecutionId = continued.body["execution_public_id"].as_str().expect("id").parse().expect("uuid");
    let row = f.server.store().execution(third).await.expect("store").expect("execution");
    let stored = f.server.store().input(row.input_public_id).await.expect("store").expect("input");
    assert_eq!((row.member_public_id, stored.turn, stored.poster()), (f.agent.member(), 2, steward.member()));
    // Naming another Agent than the conversation's is refused.
    let other = f.server.agent("other").await;
    let mismatch = person
        .post(
            "/agent_api/v1/inputs",
            &json!({"text": "x", "conversation_public_id": first_conversation, "agent_public_id": other.id}),
        )
        .await;
    assert_eq!((mismatch.status, mismatch.code()), (422, Some("validation_failed")), "{mismatch:?}");
    f.server.task_in(third, "r1t0", TaskStatus::NeedsApproval).await;
    let stopped = person.post(&door(third, "stop"), &json!({})).await;
    assert_eq!((stopped.status, &stopped.body["status"]), (200, &json!("canceled")), "{stopped:?}");

    // A suspended steward may still read, but starts nothing.
    nexus_actors::cli::admin::set_member_status(
        f.server.store(),
        steward.member(),
        nexus_proto::MemberStatus::Suspended,
    )
    .await
    .expect("suspended");
    assert_eq!(person.get(&door(second, "")).await.status, 200);
    let refused = f.post(&steward, input("again", Some(&f.agent), None)).await.expect_err("refused");
    assert_eq!(refused.code, ErrorCode::NotAuthorized);
}

#[tokio::test]
async fn a_viewer_reads_and_never_acts_a_stranger_does_neither_and_another_agent_sees_nothing() {
    let mut f = Fixture::start().await;
    let viewer = f.human("viewer", Some(GrantRole::Viewer)).await;
    let stranger = f.human("stranger", None).await;
    let other_agent = f.server.agent("other").await;
    let run = f.parked_turn("look around").await;
    let conversation = f.server.store().execution(run).await.expect("store").expect("execution").conversation_public_id;
    let unknown = ExecutionId::new_v4();
    let approve = format!("{}/r1t0/approve", door(run, "tasks"));
    let deny = format!("{}/r1t0/deny", door(run, "tasks"));

    // The viewer reads the execution and its events, on HTTP and gRPC.
    let watcher = f.http(&viewer);
    let read = watcher.get(&door(run, "")).await;
    assert_eq!((read.status, &read.body["tasks"][0]["status"]), (200, &json!("needs_approval")), "{read:?}");
    let events = watcher.get(&door(run, "events")).await;
    assert!(events.status == 200 && events.body["items"].as_array().is_some_and(|i| !i.is_empty()), "{events:?}");
    let mut client = agent_client(&f.server).await;
    let get = || GetExecutionRequest { execution_public_id: run.to_string(), tasks_after: String::new() };
    assert_eq!(client.get_execution(authed(get(), &viewer)).await.expect("read").into_inner().status, "running");
    let stream = || StreamEventsRequest { execution_public_id: run.to_string(), ..StreamEventsRequest::default() };
    let streamed: Vec<_> =
        client.stream_events(authed(stream(), &viewer)).await.expect("stream").into_inner().collect().await;
    assert!(!streamed.is_empty() && streamed.iter().all(Result::is_ok), "{streamed:?}");

    // The history doors follow the same rule: the viewer lists and reads the Agent's
    // conversation, the stranger lists nothing and reads nothing.
    let listed = watcher.get("/agent_api/v1/conversations").await;
    assert_eq!(listed.body["conversations"][0]["conversation_public_id"], json!(conversation), "{listed:?}");
    let turns = watcher.get(&format!("/agent_api/v1/conversations/{conversation}")).await;
    assert_eq!((turns.status, &turns.body["turns"][0]["execution_public_id"]), (200, &json!(run)), "{turns:?}");
    let executions = watcher.get(&format!("/agent_api/v1/executions?conversation={conversation}")).await;
    assert_eq!(executions.body["executions"][0]["execution_public_id"], json!(run), "{executions:?}");
    let outsider = f.http(&stranger);
    assert_eq!(outsider.get("/agent_api/v1/conversations").await.body["conversations"], json!([]));
    let refused = outsider.get(&format!("/agent_api/v1/conversations/{conversation}")).await;
    assert_eq!((refused.status, refused.code()), (403, Some("not_authorized")), "{refused:?}");

    // ... and acts on nothing: 403 not_authorized on every acting door, both protocols.
    let acts: Vec<(String, Value)> = vec![
        (approve.clone(), json!({})),
        (deny.clone(), json!({})),
        (door(run, "stop"), json!({})),
        (door(run, "pause"), json!({})),
        (door(run, "resume"), json!({})),
        (door(run, "regenerate"), json!({})),
        (door(run, "compact"), json!({})),
        (door(run, "estimate"), json!({})),
        (format!("{}/r1t0/retry", door(run, "tasks")), json!({})),
        ("/agent_api/v1/inputs".into(), json!({"text": "x", "agent_public_id": f.agent.id})),
        ("/agent_api/v1/inputs".into(), json!({"text": "x", "conversation_public_id": conversation})),
    ];
    for (path, body) in &acts {
        let answer = watcher.post(path, body).await;
        assert_eq!((answer.status, answer.code()), (403, Some("not_authorized")), "viewer {path}: {answer:?}");
    }
    let status = client.approve_task(authed(decision(run), &viewer)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NotAuthorized);
    let stop = StopExecutionRequest { execution_public_id: run.to_string(), force: None };
    let status = client.stop_execution(authed(stop.clone(), &viewer)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NotAuthorized);
    let refused = f.post(&viewer, input("x", Some(&f.agent), None)).await.expect_err("refused");
    assert_eq!(refused.code, ErrorCode::NotAuthorized);

    // A stranger Human: 403 on reading and on acting; an unknown id is 404 for everyone.
    let outsider = f.http(&stranger);
    for path in [door(run, ""), door(run, "events")] {
        let answer = outsider.get(&path).await;
        assert_eq!((answer.status, answer.code()), (403, Some("not_authorized")), "stranger {path}: {answer:?}");
    }
    for (path, body) in &acts {
        let answer = outsider.post(path, body).await;
        assert_eq!((answer.status, answer.code()), (403, Some("not_authorized")), "stranger {path}: {answer:?}");
    }
    let status = client.get_execution(authed(get(), &stranger)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NotAuthorized);
    let status = client.stream_events(authed(stream(), &stranger)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NotAuthorized);
    for who in [&watcher, &outsider] {
        let answer = who.get(&door(unknown, "")).await;
        assert_eq!((answer.status, answer.code()), (404, Some("not_found")), "{answer:?}");
        let answer = who.post(&format!("{}/r1t0/approve", door(unknown, "tasks")), &json!({})).await;
        assert_eq!((answer.status, answer.code()), (404, Some("not_found")), "{answer:?}");
    }
    // A Human names an Agent that is none: 404, whatever the id is.
    for id in [MemberId::new_v4(), stranger.member()] {
        let answer = outsider.post("/agent_api/v1/inputs", &json!({"text": "x", "agent_public_id": id})).await;
        assert_eq!((answer.status, answer.code()), (404, Some("not_found")), "{answer:?}");
    }

    // Another Agent: 404 as for an unknown id, with the same message.
    let elsewhere = f.http(&other_agent);
    let unknown_answer = elsewhere.get(&door(unknown, "")).await;
    let answer = elsewhere.get(&door(run, "")).await;
    assert_eq!((answer.status, answer.code()), (404, Some("not_found")), "{answer:?}");
    assert_eq!(
        answer.message().replace(&run.to_string(), "ID"),
        unknown_answer.message().replace(&unknown.to_string(), "ID")
    );
    for (path, body) in &acts {
        let answer = elsewhere.post(path, body).await;
        assert_eq!((answer.status, answer.code()), (404, Some("not_found")), "other agent {path}: {answer:?}");
    }
    let status = client.stop_execution(authed(stop, &other_agent)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::NotFound);

    // The conversation doors' helper answers the same (helper E's listing doors plug it in).
    let api = &f.server.server.api;
    let readers = [
        (&viewer, Ok(f.agent.member())),
        (&f.agent, Ok(f.agent.member())),
        (&stranger, Err(ErrorCode::NotAuthorized)),
        (&other_agent, Err(ErrorCode::NotFound)),
    ];
    for (member, answer) in readers {
        let caller = f.server.caller(member).await;
        assert_eq!(api.conversation_for(&caller, conversation, Need::Read).await.map_err(|r| r.code), answer);
    }
    let caller = f.server.caller(&viewer).await;
    let acting = api.conversation_for(&caller, conversation, Need::Act).await.map_err(|r| r.code);
    assert_eq!(acting, Err(ErrorCode::NotAuthorized));

    // None of it moved the parked call; the Agent decides, and the viewer watches to the end.
    let task = f.server.task(run, "r1t0").await.expect("task");
    assert_eq!((task.status, task.approval), (TaskStatus::NeedsApproval, None));
    assert_eq!(f.server.store().execution(run).await.expect("store").expect("execution").status, RunStatus::Running);
    assert_eq!(f.http(&f.agent).post(&approve, &json!({})).await.status, 200);
    f.serve(run, "seen").await;
    assert_eq!(f.completed(run).await, "probe=seen");
    let stream = reqwest::Client::new()
        .get(format!("{}{}", f.server.url(), door(run, "events/stream")))
        .bearer_auth(&viewer.token)
        .send()
        .await
        .expect("sse");
    assert_eq!(stream.status().as_u16(), 200);
    let text = tokio::time::timeout(WAIT, stream.text()).await.expect("the stream ends").expect("body");
    assert!(text.contains("event: approval_required") || text.contains("event:approval_required"), "{text}");
    let refused = reqwest::Client::new()
        .get(format!("{}{}", f.server.url(), door(run, "events/stream")))
        .bearer_auth(&stranger.token)
        .send()
        .await
        .expect("sse");
    assert_eq!(refused.status().as_u16(), 403);
}

/// `nexus admin <args>` against the server's store: its exit success, stdout JSON, and stderr.
async fn admin(server: &TestServer, args: &[&str]) -> (bool, Value, String) {
    let config = server.config();
    let mut command = tokio::process::Command::new(nexus_binary());
    command.arg("admin").args(args).arg("--data-dir").arg(&config.data_dir);
    if let Some(url) = &config.store.database_url {
        command.arg("--database-url").arg(url);
    }
    let out = command.stdin(std::process::Stdio::null()).output().await.expect("nexus admin runs");
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.success(), json, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test]
async fn grants_from_the_cli_take_effect_on_the_next_request_and_refuse_clearly() {
    let server = TestServer::start(&[("hello", json!({"rounds": [{"final": "hello there"}]}))]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    http.declare(&json!({"configuration": {"default_model": "scripted/hello"}})).await;
    let human = server.human("person").await;
    let person = Http::new(&server.url(), Some(&human.token));
    let (h, a) = (human.id.to_string(), agent.id.to_string());
    // An Agent may name itself as the Agent that answers.
    let posted = http.post("/agent_api/v1/inputs", &json!({"text": "hi", "agent_public_id": agent.id})).await;
    assert_eq!(posted.status, 201, "{posted:?}");
    let run = posted.body["execution_public_id"].as_str().expect("id").to_owned();
    server.settled(run.parse().expect("uuid"), WAIT).await;
    let post = json!({"text": "from a person", "agent_public_id": agent.id});
    assert_eq!(person.get(&door(&run, "")).await.code(), Some("not_authorized"));

    // viewer: reads, may not post.
    let (ok, granted, err) =
        admin(&server, &["member", "grant", "--human", &h, "--agent", &a, "--role", "viewer"]).await;
    assert!(ok, "{err}");
    assert_eq!(granted, json!({"agent_public_id": a, "human_public_id": h, "role": "viewer", "previous_role": null}));
    assert_eq!(person.get(&door(&run, "")).await.status, 200);
    assert_eq!(person.post("/agent_api/v1/inputs", &post).await.code(), Some("not_authorized"));
    // A repeat replaces the role: steward posts, and the Agent's profile answers.
    let (ok, granted, err) =
        admin(&server, &["member", "grant", "--human", &h, "--agent", &a, "--role", "steward"]).await;
    assert!(ok, "{err}");
    assert_eq!((&granted["role"], &granted["previous_role"]), (&json!("steward"), &json!("viewer")));
    let answer = person.post("/agent_api/v1/inputs", &post).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    let theirs: ExecutionId = answer.body["execution_public_id"].as_str().expect("id").parse().expect("uuid");
    assert_eq!(server.settled(theirs, WAIT).await.final_text.as_deref(), Some("hello there"));
    // Revoked: the very next request is refused.
    let (ok, revoked, err) = admin(&server, &["member", "revoke", "--human", &h, "--agent", &a]).await;
    assert!(ok, "{err}");
    assert_eq!(revoked, json!({"agent_public_id": a, "human_public_id": h, "revoked_role": "steward"}));
    assert_eq!(person.get(&door(theirs, "")).await.code(), Some("not_authorized"));
    assert_eq!(person.post("/agent_api/v1/inputs", &post).await.code(), Some("not_authorized"));
    assert_eq!(server.store().grant_role(agent.member(), human.member()).await.expect("store"), None);

    // Clear refusals, and nothing written by them.
    let before = server.store().fingerprint().await.expect("fingerprint");
    let unknown = MemberId::new_v4().to_string();
    let refusals: Vec<(Vec<&str>, &str)> = vec![
        (vec!["grant", "--human", &a, "--agent", &a, "--role", "viewer"], "validation_failed"),
        (vec!["grant", "--human", &h, "--agent", &h, "--role", "viewer"], "validation_failed"),
        (vec!["grant", "--human", &unknown, "--agent", &a, "--role", "steward"], "not_found"),
        (vec!["grant", "--human", &h, "--agent", &unknown, "--role", "steward"], "not_found"),
        (vec!["grant", "--human", &h, "--agent", &a, "--role", "owner"], "invalid value 'owner'"),
        (vec!["revoke", "--human", &h, "--agent", &a], "not_found"),
    ];
    for (args, word) in refusals {
        let args: Vec<&str> = ["member"].into_iter().chain(args).collect();
        let (ok, _, err) = admin(&server, &args).await;
        assert!(!ok && err.contains(word), "{args:?}: {err}");
    }
    assert_eq!(server.store().fingerprint().await.expect("fingerprint"), before, "refusals wrote nothing");
}

#[tokio::test]
async fn the_store_keeps_one_grant_per_pair_and_lists_a_humans_agents() {
    let server = TestServer::start(&[]).await;
    let store = server.store();
    let first_agent = server.agent("first").await;
    let (first, second) = (first_agent.member(), server.agent("second").await.member());
    let human = server.human("person").await;
    let caller = server.caller(&human).await;
    let readable = |member: nexus_actors::store::MemberRow| async move {
        nexus_actors::doors::api::agents_readable_by(store, &member).await.expect("listed")
    };
    assert_eq!(readable(caller.member.clone()).await, vec![]);
    store.put_grant(first, human.member(), GrantRole::Viewer).await.expect("grant");
    store.put_grant(first, human.member(), GrantRole::Steward).await.expect("repeat");
    store.put_grant(second, human.member(), GrantRole::Viewer).await.expect("grant");
    assert_eq!(store.grant_role(first, human.member()).await.expect("read"), Some(GrantRole::Steward));
    assert_eq!(store.grant_role(second, first).await.expect("read"), None);
    let mut expected = vec![first, second];
    expected.sort_by_key(|id| id.to_string());
    assert_eq!(readable(caller.member.clone()).await, expected);
    assert_eq!(store.grants_of(human.member()).await.expect("grants").len(), 2);
    assert_eq!(store.delete_grant(first, human.member()).await.expect("revoke"), Some(GrantRole::Steward));
    assert_eq!(store.delete_grant(first, human.member()).await.expect("again"), None);
    assert_eq!(readable(caller.member.clone()).await, vec![second]);
    // An Agent reads only itself, whatever grants name it.
    assert_eq!(readable(server.caller(&first_agent).await.member).await, vec![first]);
}
