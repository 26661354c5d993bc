//! The execution doors on HTTP: admit an input, read the execution, read its event feed a page at
//! a time, and watch it live as Server-Sent Events, resuming from a cursor.

use nexus_actors::store::EventType;
use nexus_proto::{ErrorCode, ExecutionId, RunStatus, TaskStatus};
use nexus_tests::key;
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use nexus_proto::Refusal;
use nexus_proto::agent::v1::{CreateInputRequest, StreamEventsRequest, TaskDecisionRequest};
use nexus_tests::{Http, Minted, RawRunner, TestServer, agent_client, authed, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// One SSE frame: `(id, event, data)`.
type Frame = (String, String, Value);

/// Reads a whole SSE body (the stream ends once the execution is quiescent).
async fn sse(server: &TestServer, member: &Minted, path: &str, last_event_id: Option<&str>) -> (u16, Vec<Frame>) {
    let mut request = reqwest::Client::new().get(format!("{}{path}", server.url())).bearer_auth(&member.token);
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    let response = tokio::time::timeout(WAIT, request.send()).await.expect("in time").expect("sse request");
    let status = response.status().as_u16();
    let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let text = tokio::time::timeout(WAIT, response.text()).await.expect("the stream ends").expect("body");
    if status != 200 {
        return (status, Vec::new());
    }
    assert_eq!(content_type.as_deref(), Some("text/event-stream"));
    let mut frames = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id: ").or_else(|| line.strip_prefix("id:")) {
                id = v.to_owned();
            } else if let Some(v) = line.strip_prefix("event: ").or_else(|| line.strip_prefix("event:")) {
                event = v.to_owned();
            } else if let Some(v) = line.strip_prefix("data: ").or_else(|| line.strip_prefix("data:")) {
                data.push_str(v);
            }
        }
        if event.is_empty() {
            continue; // a keep-alive comment
        }
        frames.push((id, event, serde_json::from_str(&data).expect("data is JSON")));
    }
    (status, frames)
}

async fn started(server: &TestServer, http: &Http) -> String {
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "say hello"})).await;
    assert_eq!(admitted.status, 201, "{admitted:?}");
    for key in ["conversation_public_id", "input_public_id", "execution_public_id"] {
        assert!(admitted.body[key].as_str().is_some_and(|v| uuid::Uuid::parse_str(v).is_ok()), "{key}: {admitted:?}");
    }
    let execution = admitted.body["execution_public_id"].as_str().expect("id").to_owned();
    let path = format!("/agent_api/v1/executions/{execution}");
    wait_until("the execution completes", WAIT, || async {
        let row = server.store().execution(execution.parse().ok()?).await.ok()??;
        (row.status == RunStatus::Completed).then_some(())
    })
    .await;
    let read = http.get(&path).await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.body["status"], "completed");
    assert_eq!(read.body["final_text"], "hello there");
    execution
}

#[tokio::test]
async fn admit_read_page_and_watch_over_http() {
    let server = TestServer::start(&[("hello", json!({"rounds": [{"final": "hello there"}]}))]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let declared = http.declare(&json!({"configuration": {"default_model": "scripted/hello"}})).await;
    assert_eq!(declared.status, 200, "{declared:?}");
    let execution = started(&server, &http).await;
    let events = format!("/agent_api/v1/executions/{execution}/events");

    // The live stream: every durable event once, in order, each `id:` its cursor; it ends because
    // the execution is quiescent.
    let (status, all) = sse(&server, &agent, &format!("{events}/stream"), None).await;
    assert_eq!(status, 200);
    assert!(all.len() >= 3, "{all:?}");
    assert_eq!(all.first().map(|f| f.1.as_str()), Some("input_materialized"));
    let last = all.last().expect("events");
    assert_eq!((last.1.as_str(), &last.2["data"]["status"]), ("turn_status", &json!("completed")));
    let seqs: Vec<i64> =
        all.iter().map(|f| f.0.strip_prefix("cvei_").and_then(|n| n.parse().ok()).expect("a cursor id")).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "strictly increasing cursors: {seqs:?}");
    assert!(all.iter().all(|f| f.2["cursor"] == json!(f.0)), "data carries the same cursor");

    // Pages: `limit` items and the cursor to go on from; the pages concatenate to the stream.
    let first = http.get(&format!("{events}?limit=2")).await;
    assert_eq!(first.status, 200, "{first:?}");
    let items = first.body["items"].as_array().expect("items");
    assert_eq!(items.len(), 2);
    assert_eq!(first.body["next_cursor"], json!(all[1].0));
    let rest = http.get(&format!("{events}?after={}&limit=200", all[1].0)).await;
    let rest_items = rest.body["items"].as_array().expect("items");
    assert_eq!(rest_items.len(), all.len() - 2);
    let paged: Vec<&Value> = items.iter().chain(rest_items).map(|i| &i["cursor"]).collect();
    let streamed: Vec<Value> = all.iter().map(|f| json!(f.0)).collect();
    assert_eq!(paged, streamed.iter().collect::<Vec<_>>());
    assert_eq!(rest_items[0]["type"], json!(all[2].1));
    // Past the end: nothing new, and the cursor stays where it was.
    let end = http.get(&format!("{events}?after={}", last.0)).await;
    assert_eq!(end.body["items"], json!([]));
    assert_eq!(end.body["next_cursor"], json!(last.0));

    // A reconnecting EventSource resumes after its Last-Event-ID.
    let (_, resumed) = sse(&server, &agent, &format!("{events}/stream"), Some(&all[0].0)).await;
    assert_eq!(resumed.iter().map(|f| &f.0).collect::<Vec<_>>(), all[1..].iter().map(|f| &f.0).collect::<Vec<_>>());

    // Bounds and cursors are refused with their words.
    let repeated = ["limit=5&limit=6", "after=cvei_1&after=cvei_2", "transcript=maybe"];
    for bad in ["limit=0", "limit=201", "limit=x", "after=nonsense", "after=cvei_01", "after=cvei_99999"]
        .iter()
        .chain(&repeated)
    {
        let answer = http.get(&format!("{events}?{bad}")).await;
        assert_eq!((answer.status, answer.code()), (400, Some("parameter_invalid")), "{bad}: {answer:?}");
    }
    // Stop on a completed execution changes nothing.
    let stopped = http.post(&format!("/agent_api/v1/executions/{execution}/stop"), &json!({})).await;
    assert_eq!((stopped.status, &stopped.body["status"]), (200, &json!("completed")), "{stopped:?}");
}

#[tokio::test]
async fn http_admission_refuses_bad_input_and_other_members() {
    let server = TestServer::start(&[("hello", json!({"rounds": [{"final": "hello there"}]}))]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    http.declare(&json!({"configuration": {"default_model": "scripted/hello"}})).await;
    let human = server.human("person").await;
    let before = server.store().fingerprint().await.expect("fingerprint");
    let refusals = [
        (json!({}), 400, "parameter_missing"),
        (json!({"text": 7}), 400, "parameter_invalid"),
        (json!({"text": "x", "unknown": 1}), 400, "parameter_invalid"),
        (json!({"text": "x", "conversation_public_id": "not-a-uuid"}), 400, "parameter_invalid"),
        (json!({"text": "x", "tool_names": "bash"}), 400, "parameter_invalid"),
    ];
    for (body, status, code) in refusals {
        let answer = http.post("/agent_api/v1/inputs", &body).await;
        assert_eq!((answer.status, answer.code()), (status, Some(code)), "{body}: {answer:?}");
    }
    let not_json = http.send(reqwest::Method::POST, "/agent_api/v1/inputs", Some("{".into())).await;
    assert_eq!((not_json.status, not_json.code()), (400, Some("parameter_missing")));
    for not_an_object in ["[1]", "\"hi\"", "7"] {
        let answer = http.send(reqwest::Method::POST, "/agent_api/v1/inputs", Some(not_an_object.into())).await;
        assert_eq!((answer.status, answer.code()), (400, Some("parameter_missing")), "{not_an_object}: {answer:?}");
    }
    // A Human posts only for an Agent it stewards, and must name it (`people.rs` has the rest).
    let person = Http::new(&server.url(), Some(&human.token));
    let as_human = person.post("/agent_api/v1/inputs", &json!({"text": "x"})).await;
    assert_eq!((as_human.status, as_human.code()), (400, Some("parameter_missing")), "{as_human:?}");
    let as_stranger = person.post("/agent_api/v1/inputs", &json!({"text": "x", "agent_public_id": agent.id})).await;
    assert_eq!((as_stranger.status, as_stranger.code()), (403, Some("not_authorized")), "{as_stranger:?}");
    assert_eq!(server.store().fingerprint().await.expect("fingerprint"), before, "refused admissions wrote nothing");

    // Another member sees no execution, no events and no stream.
    let execution = started(&server, &http).await;
    let other = server.agent("other").await;
    let stranger = Http::new(&server.url(), Some(&other.token));
    for path in
        [format!("/agent_api/v1/executions/{execution}"), format!("/agent_api/v1/executions/{execution}/events")]
    {
        let answer = stranger.get(&path).await;
        assert_eq!((answer.status, answer.code()), (404, Some("not_found")), "{path}: {answer:?}");
    }
    let (status, _) = sse(&server, &other, &format!("/agent_api/v1/executions/{execution}/events/stream"), None).await;
    assert_eq!(status, 404);
    let unauthenticated = Http::new(&server.url(), None).get(&format!("/agent_api/v1/executions/{execution}")).await;
    assert_eq!(unauthenticated.status, 401);
    let bad_id = http.get("/agent_api/v1/executions/not-a-uuid").await;
    assert_eq!((bad_id.status, bad_id.code()), (400, Some("parameter_invalid")));
}

#[tokio::test]
async fn a_live_watch_carries_transcript_deltas_and_pages_never_do() {
    // Round 1 parks an in-process call for approval, so the watcher is attached before round 2's
    // answer streams.
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "k", "name": "runners_list", "arguments": {}}]},
        {"final": "hello there, watcher"}
    ]});
    let server = TestServer::start(&[("watched", script)]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let declared = http
        .declare(&json!({"configuration": {"default_model": "scripted/watched", "approval_mode": "ask",
                                           "kernel_tools": ["nexus.runners.list"]}}))
        .await;
    assert_eq!(declared.status, 200, "{declared:?}");
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "go"})).await;
    let execution = admitted.body["execution_public_id"].as_str().expect("id").to_owned();
    wait_until("the call parks", WAIT, || async {
        let task = server.store().task(execution.parse().ok()?, key("r1t0")).await.ok()??;
        (task.status == TaskStatus::NeedsApproval).then_some(())
    })
    .await;

    // Once the response has started, the watcher is subscribed (before its first durable read).
    let url = format!("{}/agent_api/v1/executions/{execution}/events/stream?transcript=true", server.url());
    let response = reqwest::Client::new().get(url).bearer_auth(&agent.token).send().await.expect("watch");
    assert_eq!(response.status().as_u16(), 200);
    let approve = format!("/agent_api/v1/executions/{execution}/tasks/r1t0/approve");
    let approved = http.post(&approve, &json!({})).await;
    assert_eq!(approved.status, 200, "{approved:?}");
    let body = tokio::time::timeout(WAIT, response.text()).await.expect("the watch ends").expect("body");

    let mut streamed = String::new();
    let mut deltas_before_final = false;
    for block in body.split("\n\n") {
        let event = block.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or_default();
        let data: Value = block
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or(Value::Null);
        if event == "text_delta" {
            assert!(!block.lines().any(|l| l.starts_with("id:")), "a delta has no resumable id: {block}");
            assert_eq!(data["data"]["round"], 2, "{data}");
            streamed.push_str(data["data"]["text"].as_str().expect("text"));
        }
        if event == "round_result" && data["data"]["round"] == 2 {
            deltas_before_final = !streamed.is_empty();
        }
    }
    assert_eq!(streamed, "hello there, watcher", "the deltas add up to the answer:\n{body}");
    assert!(deltas_before_final, "the answer streamed before it settled:\n{body}");
    // Deltas are never stored: the durable page has none.
    let page = http.get(&format!("/agent_api/v1/executions/{execution}/events?limit=200")).await;
    let types: Vec<&str> =
        page.body["items"].as_array().expect("items").iter().filter_map(|i| i["type"].as_str()).collect();
    assert!(types.contains(&"round_result") && !types.contains(&"text_delta"), "{types:?}");
}

/// `scripted/parked`: round 1 calls the kernel tool `runners_list`, which parks for approval.
fn parked_script() -> (&'static str, Value) {
    (
        "parked",
        json!({"rounds": [
            {"tool_calls": [{"id": "k", "name": "runners_list", "arguments": {}}]},
            {"final": "done"}
        ]}),
    )
}

/// Declares `scripted/parked` under approval `ask`, admits an input, and waits until its call
/// `r1t0` is parked and narrated: a live execution that does nothing until it is told.
async fn parked(server: &TestServer, http: &Http) -> String {
    let declared = http
        .declare(&json!({"configuration": {"default_model": "scripted/parked", "approval_mode": "ask",
                                           "kernel_tools": ["nexus.runners.list"]}}))
        .await;
    assert_eq!(declared.status, 200, "{declared:?}");
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "go"})).await;
    assert_eq!(admitted.status, 201, "{admitted:?}");
    let execution = admitted.body["execution_public_id"].as_str().expect("id").to_owned();
    let run: ExecutionId = execution.parse().expect("uuid");
    wait_until("the call parks and is narrated", WAIT, || async {
        let task = server.store().task(run, key("r1t0")).await.ok()??;
        let events = server.store().events_after(run, 0, i64::MAX).await.ok()?;
        (task.status == TaskStatus::NeedsApproval
            && events.iter().any(|e| e.event.event_type() == EventType::ApprovalRequired))
        .then_some(())
    })
    .await;
    execution
}

#[tokio::test]
async fn every_execution_door_refuses_unknown_fields_and_bodies_that_are_not_objects() {
    let server = TestServer::start(&[parked_script()]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let execution = parked(&server, &http).await;
    let door = |verb: &str| format!("/agent_api/v1/executions/{execution}/{verb}");
    let declaration = json!({"default_model": "scripted/parked"});
    // One row per door: a misspelled field (each would have changed what the door does, or
    // done it anyway), then a JSON body that is not an object.
    let rows = [
        ("/agent_api/v1/inputs".to_owned(), json!({"text": "x", "txt": "y"})),
        (door("stop"), json!({"forse": false})),
        (door("pause"), json!({"forse": true})),
        (door("resume"), json!({"now": true})),
        (door("regenerate"), json!({"execution_declaraton": declaration})),
        (door("estimate"), json!({"execution_declaraton": declaration})),
        (door("compact"), json!({"now": true})),
        (door("tasks/r1t0/approve"), json!({"approved": true})),
        (door("tasks/r1t0/deny"), json!({"reasn": "no"})),
        (door("tasks/r1t0/retry"), json!({"now": true})),
        (door("tasks/r1t0/abandon"), json!({"now": true})),
    ];
    let before = server.store().fingerprint().await.expect("fingerprint");
    for (path, misspelled) in &rows {
        let answer = http.post(path, misspelled).await;
        assert_eq!((answer.status, answer.code()), (400, Some("parameter_invalid")), "{path} {misspelled}: {answer:?}");
        assert!(!answer.message().is_empty(), "{path}: the message says what to do");
        for not_an_object in ["[1]", "\"force\"", "true"] {
            let answer = http.send(reqwest::Method::POST, path, Some(not_an_object.into())).await;
            assert_eq!((answer.status, answer.code()), (400, Some("parameter_missing")), "{path} {not_an_object}");
        }
    }
    // The gRPC twins whose body_json carries a door body follow the same rule.
    let mut client = agent_client(&server).await;
    for (verb, body_json) in [
        ("approve", r#"{"approved":true}"#),
        ("deny", r#"{"reasn":"no"}"#),
        ("retry", "[1]"),
        ("abandon", r#"{"x":1}"#),
    ] {
        let request = TaskDecisionRequest {
            execution_public_id: execution.clone(),
            task_key: "r1t0".into(),
            body_json: body_json.into(),
        };
        let request = authed(request, &agent);
        let refused = match verb {
            "approve" => client.approve_task(request).await.map(|_| ()),
            "deny" => client.deny_task(request).await.map(|_| ()),
            "retry" => client.retry_task(request).await.map(|_| ()),
            _ => client.abandon_task(request).await.map(|_| ()),
        }
        .expect_err("refused");
        // A body that is not an object has every door's word for it.
        let word = if body_json == "[1]" { ErrorCode::ParameterMissing } else { ErrorCode::ParameterInvalid };
        assert_eq!(Refusal::from_status(&refused).code, word, "{verb} {body_json}");
    }
    assert_eq!(server.store().fingerprint().await.expect("fingerprint"), before, "refused bodies changed nothing");

    // The known fields still work: the parked call is denied with its reason.
    let denied = http.post(&door("tasks/r1t0/deny"), &json!({"reason": "no"})).await;
    assert_eq!((denied.status, denied.body["status"].as_str()), (200, Some("failed")), "{denied:?}");
}

#[tokio::test]
async fn an_events_cursor_ahead_of_the_log_is_refused_on_every_event_door() {
    let server = TestServer::start(&[parked_script()]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let execution = parked(&server, &http).await;
    let run: ExecutionId = execution.parse().expect("uuid");
    let last = server.store().execution(run).await.expect("store").expect("execution").event_seq;
    let events = format!("/agent_api/v1/executions/{execution}/events");

    // The last cursor handed out is fine: nothing new yet.
    let at_end = http.get(&format!("{events}?after=cvei_{last}")).await;
    assert_eq!((at_end.status, &at_end.body["items"]), (200, &json!([])), "{at_end:?}");
    let ahead = format!("cvei_{}", last + 1);
    let page = http.get(&format!("{events}?after={ahead}")).await;
    assert_eq!((page.status, page.code()), (400, Some("parameter_invalid")), "{page:?}");
    // The live stream would have skipped every event up to the cursor: refused before it starts,
    // from the query and from a reconnect's Last-Event-ID alike.
    let (status, _) = sse(&server, &agent, &format!("{events}/stream?after=cvei_50"), None).await;
    assert_eq!(status, 400);
    let (status, _) = sse(&server, &agent, &format!("{events}/stream"), Some(&ahead)).await;
    assert_eq!(status, 400);
    let mut client = agent_client(&server).await;
    for follow in [false, true] {
        let request = StreamEventsRequest {
            execution_public_id: execution.clone(),
            after: ahead.clone(),
            follow,
            transcript: false,
            progress: false,
        };
        let refused = client.stream_events(authed(request, &agent)).await.expect_err("refused");
        assert_eq!(Refusal::from_status(&refused).code, ErrorCode::ParameterInvalid, "follow {follow}");
    }
}

#[tokio::test]
async fn shutdown_ends_open_event_watches_promptly_saying_where_to_follow_again() {
    let server = TestServer::start(&[parked_script()]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let execution = parked(&server, &http).await;

    // An SSE watcher and a gRPC follower on the live execution; once their answers have started,
    // both followers are attached.
    let url = format!("{}/agent_api/v1/executions/{execution}/events/stream", server.url());
    let watch = reqwest::Client::new().get(url).bearer_auth(&agent.token).send().await.expect("watch");
    assert_eq!(watch.status().as_u16(), 200);
    let mut client = agent_client(&server).await;
    let request = StreamEventsRequest {
        execution_public_id: execution,
        after: String::new(),
        follow: true,
        transcript: false,
        progress: false,
    };
    let mut follower = client.stream_events(authed(request, &agent)).await.expect("follow").into_inner();

    // The liveness bound is generous; an open watch used to hold the drain for its full 10 s.
    let TestServer { server: running, data_dir: _data_dir, database: _database } = server;
    let stopped = tokio::time::timeout(Duration::from_secs(5), running.shutdown()).await;
    assert!(matches!(stopped, Ok(Ok(()))), "shutdown completes promptly with a watcher open: {stopped:?}");

    // Each stream ends after the events it was sent, with a last item that says the node is
    // stopping and where to follow again from: a follower can tell it from an execution's end.
    let body =
        tokio::time::timeout(Duration::from_secs(5), watch.text()).await.expect("the watch ends").expect("a clean end");
    let last = body.split("\n\n").filter(|block| block.contains("event:")).last().expect("frames");
    assert!(body.contains("event: approval_required"), "{body}");
    assert!(last.contains("event: error") && last.contains("\"code\":\"unavailable\""), "{last}");
    let cursor =
        body.lines().filter_map(|line| line.strip_prefix("id: ").or_else(|| line.strip_prefix("id:"))).next_back();
    let cursor = cursor.expect("the durable events carry ids");
    assert!(last.contains(&format!("after cursor {cursor}")), "the last cursor sent, {cursor}: {last}");
    let mut received = Vec::new();
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(5), follower.message()).await.expect("the follower ends") {
            Ok(Some(event)) => received.push(event.cursor),
            Ok(None) => panic!("the gRPC stream ended without saying why: {received:?}"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
    let last_cursor = received.last().expect("events before the end");
    assert!(ended.message().contains(&format!("after cursor {last_cursor}")), "{ended:?}");
    assert_eq!(last_cursor, cursor, "both followers read every event");
}

#[tokio::test]
async fn a_suspended_agent_reads_but_admits_and_regenerates_nothing() {
    let server = TestServer::start(&[parked_script()]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let execution = parked(&server, &http).await;
    assert!(
        server
            .store()
            .set_member_status(agent.member(), nexus_proto::MemberStatus::Suspended)
            .await
            .expect("suspended")
    );
    let before = server.store().fingerprint().await.expect("fingerprint");

    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "more"})).await;
    assert_eq!((admitted.status, admitted.code()), (403, Some("not_authorized")), "{admitted:?}");
    let regenerated = http.post(&format!("/agent_api/v1/executions/{execution}/regenerate"), &json!({})).await;
    assert_eq!((regenerated.status, regenerated.code()), (403, Some("not_authorized")), "{regenerated:?}");
    let mut client = agent_client(&server).await;
    let request = CreateInputRequest { text: "more".into(), ..CreateInputRequest::default() };
    let refused = client.create_input(authed(request, &agent)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&refused).code, ErrorCode::NotAuthorized);
    // Nor does it start work on a live execution: approving, retrying, resuming and compacting
    // are refused before anything is looked at.
    for door in ["tasks/r1t0/approve", "tasks/r1t0/retry", "resume", "compact"] {
        let answer = http.post(&format!("/agent_api/v1/executions/{execution}/{door}"), &json!({})).await;
        assert_eq!((answer.status, answer.code()), (403, Some("not_authorized")), "{door}: {answer:?}");
    }
    // Reading stays allowed.
    for path in
        [format!("/agent_api/v1/executions/{execution}"), format!("/agent_api/v1/executions/{execution}/events")]
    {
        let read = http.get(&path).await;
        assert_eq!(read.status, 200, "{path}: {read:?}");
    }
    assert_eq!(server.store().fingerprint().await.expect("fingerprint"), before, "a suspended Agent started nothing");

    assert!(
        server.store().set_member_status(agent.member(), nexus_proto::MemberStatus::Active).await.expect("reinstated")
    );
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "more"})).await;
    assert_eq!(admitted.status, 201, "reinstated: {admitted:?}");
}

#[tokio::test]
async fn a_door_asked_with_the_wrong_method_answers_405_with_a_word() {
    let server = TestServer::start(&[]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let execution = Uuid::new_v4();
    let rows = [
        (reqwest::Method::DELETE, "/agent_api/v1/inputs".to_owned()),
        (reqwest::Method::GET, "/agent_api/v1/inputs".to_owned()),
        (reqwest::Method::GET, format!("/agent_api/v1/executions/{execution}/stop")),
        (reqwest::Method::POST, format!("/agent_api/v1/executions/{execution}")),
        (reqwest::Method::PUT, "/agent_api/v1/profile".to_owned()),
    ];
    for (method, path) in rows {
        let answer = http.send(method.clone(), &path, None).await;
        assert_eq!((answer.status, answer.code()), (405, Some("method_not_allowed")), "{method} {path}: {answer:?}");
        assert!(!answer.message().is_empty(), "{method} {path}");
    }
    let response =
        reqwest::Client::new().delete(format!("{}/agent_api/v1/inputs", server.url())).send().await.expect("request");
    let allow = response.headers().get("allow").and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(allow.as_deref(), Some("POST"), "the Allow header names the methods the door takes");
    // An unknown path is still 404.
    let missing = http.get("/agent_api/v1/nothing").await;
    assert_eq!((missing.status, missing.code()), (404, Some("not_found")));
}

#[tokio::test]
async fn a_timed_out_task_shows_its_error_key_and_message() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "p", "name": "probe", "arguments": {}}]},
        {"final": "after the timeout"}
    ]});
    let server = TestServer::start(&[("expire", script)]).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("worker").await;
    let (raw, hello) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    assert_eq!(hello.code(), None, "{hello:?}");
    let profile = json!({"kind": "read_only", "destructive": false, "effect_scope": "closed",
                         "idempotency": "intrinsic", "reconciliation": "none"});
    let tool = json!({"name": "probe", "description": "probe as served.", "input_schema": {"type": "object"},
                      "effect_profile": profile, "timeout_ms": 60_000});
    let announced = raw.announce(&json!({"tools": [tool], "environment": {"name": "worker"}})).await;
    assert_eq!(announced.code(), None, "{announced:?}");
    let http = Http::new(&server.url(), Some(&agent.token));
    let declared = http
        .declare(&json!({"configuration": {"default_model": "scripted/expire", "approval_mode": "bypass",
                                           "runner_executor_public_ids": [runner.id]}}))
        .await;
    assert_eq!(declared.status, 200, "{declared:?}");
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "go"})).await;
    let execution = admitted.body["execution_public_id"].as_str().expect("id").to_owned();
    // Nobody claims the call: a minute on, it times out.
    server.task_in(execution.parse().expect("id"), "r1t0", TaskStatus::Dispatched).await;
    server.clock().advance(Duration::from_secs(61));
    wait_until("the execution completes", WAIT, || async {
        let row = server.store().execution(execution.parse().ok()?).await.ok()??;
        (row.status == RunStatus::Completed).then_some(())
    })
    .await;
    let read = http.get(&format!("/agent_api/v1/executions/{execution}")).await;
    let task = &read.body["tasks"][0];
    assert_eq!(
        (task["status"].as_str(), task["error_key"].as_str()),
        (Some("timed_out"), Some("tool_timeout")),
        "{task}"
    );
    assert_eq!(task["result"], Value::Null, "no result arrived");
    assert!(task["error_message"].as_str().is_some_and(|m| !m.is_empty()), "a human message: {task}");
    drop(raw);
}
