//! One execution at a time per conversation (`docs/executions.md`, "Conversations: one turn at a
//! time"): a later input waits its turn, a steer arrives at the next safe boundary or becomes a
//! turn of its own, the input queue holds 16, and a queued input can be canceled.
//!
//! A real server, a local fake provider whose recorded requests show what each model call
//! carried (or a gated model server where a test must hold a model call open), and a raw runner
//! that commits only when told.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use nexus_actors::model::{ProviderConfig, ProviderKind};
use nexus_actors::store::{EventRow, EventType, ExecutionRow};
use nexus_proto::agent::v1::{CancelInputRequest, CreateInputRequest};
use nexus_proto::{ErrorCode, ExecutionId, InputId, Refusal, RunStatus, TaskStatus};
use nexus_tests::{Act, FakeProvider, Http, Minted, RawRunner, TestServer, agent_client, authed, wait_until};

const WAIT: Duration = Duration::from_secs(30);

fn openai_provider(base_url: &str) -> ProviderConfig {
    ProviderConfig {
        base_url: Some(base_url.to_owned()),
        allow_any_model: true,
        ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
    }
}

/// A server whose `fake` provider is `base_url`, an Agent declared on `fake/chat` with a raw
/// runner's `probe` tool, and that runner's stream.
struct Fixture {
    server: TestServer,
    agent: Minted,
    raw: RawRunner,
}

impl Fixture {
    async fn start(base_url: String) -> Fixture {
        let server = TestServer::start_with(&[], move |config| {
            config.providers.providers.insert("fake".into(), openai_provider(&base_url));
        })
        .await;
        let agent = server.agent("agent").await;
        let runner = server.runner("worker").await;
        let probe = json!({"name": "probe", "description": "Probe.", "input_schema": {"type": "object"},
            "effect_profile": {"kind": "read_only", "destructive": false, "effect_scope": "closed",
                "idempotency": "intrinsic", "reconciliation": "none"}});
        let raw = RawRunner::connect_announced(
            &server.url(),
            &runner,
            &json!({"tools": [probe], "environment": {"name": "worker"}}),
        )
        .await;
        let f = Fixture { server, agent, raw };
        let configuration = json!({"runner_executor_public_ids": [runner.id], "approval_mode": "bypass",
            "default_model": "fake/chat"});
        let declared = f.http().declare(&json!({"configuration": configuration})).await;
        assert_eq!(declared.status, 200, "declared: {:?}", declared.body);
        f
    }

    fn http(&self) -> Http {
        Http::new(&self.server.url(), Some(&self.agent.token))
    }

    /// Posts an input (`conversation` continues one) and answers the admission's body.
    async fn post(&self, text: &str, conversation: Option<&Value>, mode: Option<&str>) -> Value {
        let mut body = json!({"text": text});
        if let Some(conversation) = conversation {
            body["conversation_public_id"] = conversation.clone();
        }
        if let Some(mode) = mode {
            body["delivery_mode"] = json!(mode);
        }
        let answer = self.http().post("/agent_api/v1/inputs", &body).await;
        assert_eq!(answer.status, 201, "admitted: {:?}", answer.body);
        answer.body
    }

    async fn cancel(&self, input: &Value) -> nexus_tests::Answer {
        let input = input.as_str().expect("input id");
        self.http().post(&format!("/agent_api/v1/inputs/{input}/cancel"), &json!({})).await
    }

    async fn status_is(&self, run: ExecutionId, status: RunStatus) -> ExecutionRow {
        wait_until(&format!("{run} to be {status}"), WAIT, || async {
            self.server.store().execution(run).await.ok().flatten().filter(|row| row.status == status)
        })
        .await
    }

    async fn events(&self, run: ExecutionId) -> Vec<EventRow> {
        self.server.store().events_after(run, 0, i64::MAX).await.expect("events")
    }

    /// Claims and commits `run`'s next offered task, `key`, with `content`.
    async fn run_tool(&mut self, run: ExecutionId, key: &str, content: &str) {
        let work = self.raw.next_work(WAIT).await.expect("work offered");
        assert_eq!((work.run_public_id.as_str(), work.task_key.as_str()), (run.to_string().as_str(), key));
        let (token, _) = self.raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claimed");
        let committed = self.raw.commit(&work.run_public_id, key, &token, &json!({"content": content})).await;
        assert_eq!(committed.committed().map(|c| c.1), Some("completed".to_owned()), "{committed:?}");
    }
}

fn id(body: &Value, field: &str) -> ExecutionId {
    body[field].as_str().expect("id").parse().expect("uuid")
}

/// The messages a recorded request carried, as `role: content` lines.
fn lines(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| format!("{}: {}", m["role"].as_str().unwrap_or("?"), m["content"].as_str().unwrap_or("<calls>")))
        .collect()
}

fn position(events: &[EventRow], event_type: EventType, pick: impl Fn(&Value) -> bool) -> usize {
    events
        .iter()
        .position(|e| e.event.event_type() == event_type && pick(&e.event.data()))
        .unwrap_or_else(|| panic!("no {event_type} as expected in {events:#?}"))
}

#[tokio::test]
async fn a_later_input_waits_its_turn_and_a_steer_arrives_at_the_boundary() {
    let fake = FakeProvider::start().await;
    let mut f = Fixture::start(fake.openai_base_url()).await;
    fake.script(
        "chat",
        [
            Act::ToolCalls(vec![("c1".into(), "probe".into(), json!({}))]),
            Act::Text("first answered".into()),
            Act::Text("second answered".into()),
        ],
    );
    let first = f.post("first", None, None).await;
    let conversation = first["conversation_public_id"].clone();
    let run1 = id(&first, "execution_public_id");
    assert_eq!(
        (first["turn"].as_i64(), first["status"].as_str(), &first["queue"]),
        (Some(1), Some("pending"), &Value::Null)
    );
    f.server.task_in(run1, "r1t0", TaskStatus::Dispatched).await;

    // While turn 1 waits for its call, a second input queues behind it and a steer is recorded.
    let second = f.post("second", Some(&conversation), None).await;
    let run2 = id(&second, "execution_public_id");
    assert_eq!((second["turn"].as_i64(), second["status"].as_str()), (Some(2), Some("pending")));
    assert_eq!(second["queue"], json!({"position": 1, "waits_for_execution_public_id": run1}));
    let steer = f.post("also check the logs", Some(&conversation), Some("steer")).await;
    assert_eq!(
        (steer["turn"].as_i64(), steer["delivery_mode"].as_str(), id(&steer, "execution_public_id")),
        (Some(3), Some("steer"), run1),
        "a steer is applied by the live execution"
    );
    let shown = f.http().get(&format!("/agent_api/v1/executions/{run2}")).await;
    assert_eq!((shown.body["status"].as_str(), &shown.body["queue"]), (Some("pending"), &second["queue"]));
    assert_eq!(fake.count("chat"), 1, "turn 2 has not asked the model");
    assert!(f.events(run2).await.is_empty(), "a queued turn has materialized nothing");

    f.run_tool(run1, "r1t0", "probed").await;
    let done1 = f.status_is(run1, RunStatus::Completed).await;
    let done2 = f.status_is(run2, RunStatus::Completed).await;
    assert_eq!(
        (done1.final_text.as_deref(), done2.final_text.as_deref()),
        (Some("first answered"), Some("second answered"))
    );

    // The second request of turn 1 carries the round's result, then the steer, as a user message.
    let requests = fake.requests_for("chat");
    assert_eq!(requests.len(), 3, "{requests:#?}");
    let after = lines(&requests[1].body);
    assert_eq!(
        after[after.len() - 2..],
        ["tool: probed".to_owned(), "user: also check the logs".to_owned()],
        "{after:#?}"
    );
    assert_eq!(lines(&requests[0].body).last().map(String::as_str), Some("user: first"));
    assert_eq!(lines(&requests[2].body).last().map(String::as_str), Some("user: second"), "turn 2 asked last");
    // Turn 2 started only after turn 1 ended.
    let ended = f.events(run1).await;
    let started = f.events(run2).await;
    let end = &ended[position(&ended, EventType::TurnStatus, |d| d["status"] == "completed")];
    let begin = &started[position(&started, EventType::InputMaterialized, |_| true)];
    assert!(begin.at >= end.at, "turn 2 materialized at {} before turn 1 ended at {}", begin.at, end.at);
    // The steer is narrated where it was applied: after the call settled, before round 2.
    let settled = position(&ended, EventType::TaskStatus, |d| d["task_key"] == "r1t0" && d["status"] == "completed");
    let applied = position(&ended, EventType::InputMaterialized, |d| d["delivery_mode"] == "steer");
    let round2 = position(&ended, EventType::RoundStarted, |d| d["round"] == 2);
    assert!(settled < applied && applied < round2, "{ended:#?}");
    assert_eq!(
        ended[applied].event.data(),
        json!({"input_public_id": steer["input_public_id"], "delivery_mode": "steer", "round": 2, "turn": 3})
    );
    // It stays in turn 1's history, and is never applied or answered again.
    assert!(done1.transcript.to_string().contains("also check the logs"));
    let canceled = f.cancel(&steer["input_public_id"]).await;
    assert_eq!((canceled.status, canceled.code()), (409, Some("input_not_queued")), "{canceled:?}");
    let canceled = f.cancel(&second["input_public_id"]).await;
    assert_eq!((canceled.status, canceled.code()), (409, Some("input_not_queued")), "a turn that ran");
}

/// A local model on the OpenAI wire whose first request is held until [`Gated::release`], then
/// answered `one`; every later request is answered `heard: <its last user message>`. Every body
/// is recorded.
struct Gated {
    base_url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
    gate: Arc<tokio::sync::Notify>,
    serve: tokio::task::JoinHandle<()>,
}

impl Drop for Gated {
    fn drop(&mut self) {
        self.serve.abort();
    }
}

impl Gated {
    async fn start() -> Gated {
        let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
        let gate = Arc::new(tokio::sync::Notify::new());
        let (seen, held) = (bodies.clone(), gate.clone());
        let app = Router::new().route(
            "/v1/chat/completions",
            post(move |body: axum::Json<Value>| {
                let (seen, held) = (seen.clone(), held.clone());
                async move {
                    let nth = {
                        let mut seen = seen.lock().expect("bodies");
                        seen.push(body.0.clone());
                        seen.len()
                    };
                    let text = if nth == 1 {
                        held.notified().await;
                        "one".to_owned()
                    } else {
                        let last = body.0["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
                        format!("heard: {}", last["content"].as_str().unwrap_or_default())
                    };
                    axum::Json(json!({"id": "gated", "object": "chat.completion", "choices": [{"index": 0,
                        "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}))
                }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let base_url = format!("http://{}/v1", listener.local_addr().expect("address"));
        let serve = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Gated { base_url, bodies, gate, serve }
    }

    fn count(&self) -> usize {
        self.bodies.lock().expect("bodies").len()
    }

    fn release(&self) {
        self.gate.notify_one();
    }
}

#[tokio::test]
async fn a_steer_that_missed_the_last_boundary_becomes_the_next_turn() {
    let gated = Gated::start().await;
    let f = Fixture::start(gated.base_url.clone()).await;
    let first = f.post("first", None, None).await;
    let run1 = id(&first, "execution_public_id");
    wait_until("the model call to be out", WAIT, || async { (gated.count() == 1).then_some(()) }).await;
    // The call out is turn 1's last: its final answer comes before any boundary.
    let steer = f.post("one more thing", Some(&first["conversation_public_id"]), Some("steer")).await;
    assert_eq!(id(&steer, "execution_public_id"), run1);
    gated.release();
    let done1 = f.status_is(run1, RunStatus::Completed).await;
    assert_eq!(done1.final_text.as_deref(), Some("one"));
    assert!(!done1.transcript.to_string().contains("one more thing"), "never applied to turn 1");
    let events1 = f.events(run1).await;
    assert!(!events1.iter().any(|e| e.event.data()["delivery_mode"] == "steer"), "{events1:#?}");
    // It became a turn of its own, with its own execution, and was answered as one.
    let input: InputId = steer["input_public_id"].as_str().expect("id").parse().expect("uuid");
    let own = wait_until("the steer's own execution", WAIT, || async {
        f.server.store().first_execution_of(input).await.ok().flatten()
    })
    .await;
    assert_ne!(own, run1);
    let done = f.status_is(own, RunStatus::Completed).await;
    assert_eq!(done.final_text.as_deref(), Some("heard: one more thing"));
    assert_eq!(gated.count(), 2);
    let delivery = f.server.store().delivery(input).await.expect("store").expect("input");
    assert_eq!(delivery.outcome, Some(nexus_proto::SteerOutcome::Turn));

    // A steer with no live execution is a turn at once.
    let alone = f.post("steer alone", Some(&first["conversation_public_id"]), Some("steer")).await;
    assert_eq!(
        (alone["status"].as_str(), alone["turn"].as_i64(), &alone["queue"]),
        (Some("pending"), Some(3), &Value::Null)
    );
    let run3 = id(&alone, "execution_public_id");
    assert_eq!(f.status_is(run3, RunStatus::Completed).await.final_text.as_deref(), Some("heard: steer alone"));
}

#[tokio::test]
async fn the_input_queue_holds_sixteen_and_a_queued_input_can_be_canceled() {
    let fake = FakeProvider::start().await;
    let mut f = Fixture::start(fake.openai_base_url()).await;
    let mut acts = vec![Act::ToolCalls(vec![("c1".into(), "probe".into(), json!({}))]), Act::Text("turn 1".into())];
    acts.extend((3..=17).map(|turn| Act::Text(format!("turn {turn}"))));
    fake.script("chat", acts);
    let first = f.post("turn 1", None, None).await;
    let conversation = first["conversation_public_id"].clone();
    let run1 = id(&first, "execution_public_id");
    f.server.task_in(run1, "r1t0", TaskStatus::Dispatched).await;
    let mut queued = Vec::new();
    for turn in 2..=17 {
        let body = f.post(&format!("turn {turn}"), Some(&conversation), None).await;
        assert_eq!((body["turn"].as_i64(), body["queue"]["position"].as_i64()), (Some(turn), Some(turn - 1)));
        queued.push(body);
    }
    // The 17th waiting input, queued or steered, is refused and changes nothing.
    let before = f.server.store().fingerprint().await.expect("fingerprint");
    for mode in ["queue", "steer"] {
        let full = f
            .http()
            .post(
                "/agent_api/v1/inputs",
                &json!({"text": "one too many", "conversation_public_id": conversation, "delivery_mode": mode}),
            )
            .await;
        assert_eq!((full.status, full.code()), (409, Some("input_queue_full")), "{mode}: {full:?}");
    }
    let mut client = agent_client(&f.server).await;
    let request = CreateInputRequest {
        text: "one too many".into(),
        conversation_public_id: conversation.as_str().expect("id").into(),
        ..CreateInputRequest::default()
    };
    let status = client.create_input(authed(request, &f.agent)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::InputQueueFull);
    assert_eq!(f.server.store().fingerprint().await.expect("fingerprint"), before, "refusals write nothing");
    // Another delivery mode is refused by name.
    let odd = f.http().post("/agent_api/v1/inputs", &json!({"text": "x", "delivery_mode": "shout"})).await;
    assert_eq!((odd.status, odd.code()), (422, Some("validation_failed")), "{odd:?}");
    assert!(odd.message().contains("delivery_mode"), "{}", odd.message());
    let per_turn = f
        .http()
        .post(
            "/agent_api/v1/inputs",
            &json!({"text": "x", "delivery_mode": "steer", "tool_names": [],
            "conversation_public_id": conversation}),
        )
        .await;
    assert_eq!((per_turn.status, per_turn.code()), (422, Some("validation_failed")), "{per_turn:?}");
    assert!(per_turn.message().starts_with("tool_names"), "{}", per_turn.message());
    let request =
        CreateInputRequest { text: "x".into(), delivery_mode: "shout".into(), ..CreateInputRequest::default() };
    let status = client.create_input(authed(request, &f.agent)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::ValidationFailed);

    // Turn 2 is canceled while it waits (over gRPC), without materializing; again answers it again.
    let run2 = id(&queued[0], "execution_public_id");
    let request = CancelInputRequest { input_public_id: queued[0]["input_public_id"].as_str().expect("id").into() };
    let canceled = client.cancel_input(authed(request, &f.agent)).await.expect("canceled").into_inner();
    assert_eq!((canceled.status.as_str(), canceled.execution_public_id), ("canceled", run2.to_string()));
    let again = f.cancel(&queued[0]["input_public_id"]).await;
    assert_eq!((again.status, again.body["status"].as_str()), (200, Some("canceled")), "{again:?}");
    let events2 = f.events(run2).await;
    assert_eq!(events2.len(), 1, "{events2:#?}");
    assert_eq!(
        events2[0].event.data(),
        json!({"status": "canceled", "error_key": "run_canceled", "force": null, "queued": true})
    );
    // The running turn is no queued input; a stranger's cancel finds no input.
    let running = f.cancel(&first["input_public_id"]).await;
    assert_eq!((running.status, running.code()), (409, Some("input_not_queued")), "{running:?}");
    let stranger = f.server.agent("stranger").await;
    let theirs = Http::new(&f.server.url(), Some(&stranger.token))
        .post(
            &format!("/agent_api/v1/inputs/{}/cancel", queued[1]["input_public_id"].as_str().expect("id")),
            &json!({}),
        )
        .await;
    assert_eq!((theirs.status, theirs.code()), (404, Some("not_found")), "{theirs:?}");
    let unknown = f.cancel(&json!(InputId::new_v4().to_string())).await;
    assert_eq!((unknown.status, unknown.code()), (404, Some("not_found")));

    // A steer canceled before its boundary is never applied.
    let steer = f.post("never mind", Some(&conversation), Some("steer")).await;
    let dropped = f.cancel(&steer["input_public_id"]).await;
    assert_eq!((dropped.status, dropped.body["status"].as_str()), (200, Some("canceled")), "{dropped:?}");
    assert_ne!(id(&dropped.body, "execution_public_id"), run1);
    // A steer is disposed of once: a second disposal (here, as a turn) writes nothing.
    let store = f.server.store();
    let mut twice = store.execution(id(&dropped.body, "execution_public_id")).await.expect("store").expect("row");
    twice.public_id = ExecutionId::new_v4();
    assert!(!store.dispose_steer(nexus_proto::SteerOutcome::Turn, &twice, &[]).await.expect("store"));
    assert!(store.execution(twice.public_id).await.expect("store").is_none());

    // The queue moves on, in turn order, skipping what was canceled.
    f.run_tool(run1, "r1t0", "probed").await;
    for body in &queued[1..] {
        f.status_is(id(body, "execution_public_id"), RunStatus::Completed).await;
    }
    let asked: Vec<String> = fake.requests_for("chat").iter().filter_map(|r| lines(&r.body).last().cloned()).collect();
    let mut expected = vec!["user: turn 1".to_owned(), "tool: probed".to_owned()];
    expected.extend((3..=17).map(|turn| format!("user: turn {turn}")));
    assert_eq!(asked, expected);
    assert_eq!(f.server.store().execution(run2).await.expect("store").expect("row").status, RunStatus::Canceled);
}

#[tokio::test]
async fn a_busy_conversation_regenerates_nothing_and_a_suspension_starts_no_queued_turn() {
    let fake = FakeProvider::start().await;
    let mut f = Fixture::start(fake.openai_base_url()).await;
    fake.script(
        "chat",
        vec![Act::ToolCalls(vec![("c1".into(), "probe".into(), json!({}))]), Act::Text("turn 1".into())],
    );
    let first = f.post("turn 1", None, None).await;
    let conversation = first["conversation_public_id"].clone();
    let run1 = id(&first, "execution_public_id");
    f.server.task_in(run1, "r1t0", TaskStatus::Dispatched).await;
    let second = f.post("turn 2", Some(&conversation), None).await;
    let third = f.post("turn 3", Some(&conversation), None).await;
    let (run2, run3) = (id(&second, "execution_public_id"), id(&third, "execution_public_id"));

    // Neither the running turn nor a queued one is answered again while the conversation is busy:
    // the refusal names the live execution to wait for, and nothing is created.
    let declaration = json!({"execution_declaration": {"default_model": "fake/chat", "approval_mode": "bypass"}});
    for run in [run1, run2] {
        let answer = f.http().post(&format!("/agent_api/v1/executions/{run}/regenerate"), &declaration).await;
        assert_eq!((answer.status, answer.code()), (409, Some("not_regenerable")), "{run}: {answer:?}");
        assert!(answer.message().contains(&run1.to_string()), "{}", answer.message());
    }
    let path = format!("/agent_api/v1/executions?conversation={}", conversation.as_str().expect("id"));
    let listed = f.http().get(&path).await;
    assert_eq!(listed.body["executions"].as_array().map(Vec::len), Some(3), "no regeneration was created");

    // A steer carries text only: its rule is judged before the fields themselves.
    let steer = f
        .http()
        .post(
            "/agent_api/v1/inputs",
            &json!({"text": "x", "delivery_mode": "steer", "variables": {"a": "b"}, "conversation_public_id": conversation}),
        )
        .await;
    assert_eq!((steer.status, steer.code()), (422, Some("validation_failed")), "{steer:?}");
    assert!(steer.message().starts_with("variables: a steer"), "{}", steer.message());

    // Suspended, the Agent may still cancel a queued input (that only takes work away), and its
    // queued turn does not start when the one before it ends.
    nexus_actors::cli::admin::set_member_status(
        f.server.store(),
        f.agent.member(),
        nexus_proto::MemberStatus::Suspended,
    )
    .await
    .expect("suspended");
    let canceled = f.cancel(&third["input_public_id"]).await;
    assert_eq!((canceled.status, canceled.body["status"].as_str()), (200, Some("canceled")), "{canceled:?}");
    f.run_tool(run1, "r1t0", "probed").await;
    f.status_is(run1, RunStatus::Completed).await;
    let refused = f.status_is(run2, RunStatus::Canceled).await;
    assert_eq!(refused.error_key.as_deref(), Some("not_authorized"));
    assert_eq!(f.status_is(run3, RunStatus::Canceled).await.error_key.as_deref(), Some("run_canceled"));
    assert_eq!(fake.count("chat"), 2, "turn 2 never reached the model");
}
