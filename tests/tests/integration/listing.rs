//! History you can read (`docs/executions.md`, "History"): the conversations, turns and
//! executions listings on HTTP and gRPC, their paging, bounds and refusals, and the runners'
//! throttled `task_progress` items on a live feed.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_stream::StreamExt;

use nexus_proto::agent::v1::{
    GetConversationRequest, ListConversationsRequest, ListExecutionsRequest, StreamEventsRequest,
};
use nexus_proto::runner::v1::{Progress, nexus_frame, runner_frame};
use nexus_proto::{ErrorCode, Refusal};
use nexus_tests::{Http, RawRunner, Reply, TestServer, agent_client, authed, wait_until};

const WAIT: Duration = Duration::from_secs(30);

fn echo_script() -> Value {
    json!({"rounds": [{"final": "you said {{input}}"}]})
}

/// Declares the Agent's profile on `model`, with no tools and no approval.
async fn declare(http: &Http, model: &str) {
    let declared = http.declare(&json!({"configuration": {"default_model": model, "approval_mode": "bypass"}})).await;
    assert_eq!(declared.status, 200, "{declared:?}");
}

/// Posts one input (continuing `conversation` when given), waits for its execution to complete,
/// and answers `(conversation, execution)`.
async fn turn(http: &Http, text: &str, conversation: Option<&str>) -> (String, String) {
    let mut body = json!({"text": text});
    if let Some(conversation) = conversation {
        body["conversation_public_id"] = json!(conversation);
    }
    let admitted = http.post("/agent_api/v1/inputs", &body).await;
    assert_eq!(admitted.status, 201, "{admitted:?}");
    let execution = admitted.body["execution_public_id"].as_str().expect("execution").to_owned();
    completed(http, &execution).await;
    (admitted.body["conversation_public_id"].as_str().expect("conversation").to_owned(), execution)
}

async fn completed(http: &Http, execution: &str) {
    wait_until(&format!("execution {execution} to complete"), WAIT, || async {
        let row = http.get(&format!("/agent_api/v1/executions/{execution}")).await;
        (row.body["status"] == "completed").then_some(())
    })
    .await;
}

fn ids(list: &Value, key: &str) -> Vec<String> {
    list.as_array().expect("a list").iter().map(|item| item[key].as_str().expect("an id").to_owned()).collect()
}

fn strs(ids: &[&String]) -> Vec<String> {
    ids.iter().map(|id| (*id).clone()).collect()
}

fn refused(answer: &nexus_tests::Answer, status: u16, code: &str, what: &str) {
    assert_eq!((answer.status, answer.code()), (status, Some(code)), "{what}: {answer:?}");
    assert!(!answer.message().is_empty(), "{what}: a message says what to do");
}

fn grpc_json(reply: tonic::Response<nexus_proto::agent::v1::JsonReply>) -> Value {
    serde_json::from_str(&reply.into_inner().body_json).expect("body_json")
}

fn grpc_code(status: &tonic::Status) -> ErrorCode {
    Refusal::from_status(status).code
}

#[tokio::test]
async fn conversations_list_newest_first_and_show_their_turns_on_both_protocols() {
    let server = TestServer::start(&[("echo", echo_script())]).await;
    let agent = server.agent("historian").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    declare(&http, "scripted/echo").await;

    // Conversation A has two turns, the second posted once the first completed; B and C one each.
    let (a, a1) = turn(&http, "one", None).await;
    let (again, a2) = turn(&http, "two", Some(&a)).await;
    assert_eq!(again, a, "the second input continues the conversation");
    let (b, b1) = turn(&http, "other", None).await;
    let (c, _) = turn(&http, "third", None).await;

    let listed = http.get("/agent_api/v1/conversations").await;
    assert_eq!(listed.status, 200, "{listed:?}");
    assert_eq!(ids(&listed.body["conversations"], "conversation_public_id"), strs(&[&c, &b, &a]), "newest first");
    assert_eq!(listed.body["next_cursor"], Value::Null, "one page holds them all");
    let oldest = &listed.body["conversations"][2];
    assert_eq!(oldest["member_public_id"], json!(agent.id));
    assert_eq!((oldest["turn_count"].as_i64(), oldest["last_status"].as_str()), (Some(2), Some("completed")));
    assert_eq!(oldest["last_execution_public_id"], json!(a2));
    assert!(oldest["created_at"].as_i64() <= oldest["last_turn_at"].as_i64(), "{oldest}");

    // Paging: a cursor and a limit, with the event pages' bounds.
    let first = http.get("/agent_api/v1/conversations?limit=2").await;
    assert_eq!(ids(&first.body["conversations"], "conversation_public_id"), strs(&[&c, &b]));
    assert_eq!(first.body["next_cursor"], json!(b));
    let rest = http.get(&format!("/agent_api/v1/conversations?limit=2&after={b}")).await;
    assert_eq!(ids(&rest.body["conversations"], "conversation_public_id"), strs(&[&a]));
    assert_eq!(rest.body["next_cursor"], Value::Null);
    for (query, what) in [
        ("limit=0", "a limit under 1"),
        ("limit=201", "a limit over 200"),
        ("limit=ten", "a limit that is no number"),
        ("after=nope", "a cursor that is no id"),
        (&format!("after={}", uuid::Uuid::new_v4()) as &str, "a cursor of no conversation"),
        (&format!("after={}", b.to_uppercase()), "a cursor in another spelling"),
        ("status=completed", "a parameter this door does not take"),
        ("limit=1&limit=2", "a parameter twice"),
    ] {
        refused(&http.get(&format!("/agent_api/v1/conversations?{query}")).await, 400, "parameter_invalid", what);
    }

    // A conversation's turns, in order, with poster, execution, status and final text.
    let shown = http.get(&format!("/agent_api/v1/conversations/{a}")).await;
    assert_eq!(shown.status, 200, "{shown:?}");
    assert_eq!(
        (shown.body["conversation_public_id"].as_str(), shown.body["turns_next"].clone()),
        (Some(a.as_str()), Value::Null)
    );
    let turns = shown.body["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 2, "{turns:?}");
    for (index, (text, execution)) in [("one", &a1), ("two", &a2)].into_iter().enumerate() {
        let turn = &turns[index];
        assert_eq!(turn["turn"], index + 1, "{turn}");
        assert_eq!(turn["text"], text, "{turn}");
        assert_eq!(turn["posted_by_public_id"], Value::Null, "the Agent posted it itself: {turn}");
        assert_eq!(turn["execution_public_id"], json!(execution), "{turn}");
        assert_eq!(turn["status"], "completed", "{turn}");
        assert_eq!(turn["final_text"], format!("you said {text}"), "{turn}");
        assert_eq!((turn["candidates"].as_i64(), turn["text_truncated"].as_bool()), (Some(1), Some(false)), "{turn}");
        assert!(turn["input_public_id"].is_string() && turn["created_at"].is_i64(), "{turn}");
    }
    let later = http.get(&format!("/agent_api/v1/conversations/{a}?turns_after=1")).await;
    assert_eq!(ids(&later.body["turns"], "execution_public_id"), strs(&[&a2]), "turns after the first");

    // A regenerated turn shows its newest candidate, and the listing follows it.
    let regenerated = http.post(&format!("/agent_api/v1/executions/{a2}/regenerate"), &json!({})).await;
    assert_eq!(regenerated.status, 201, "{regenerated:?}");
    let a2b = regenerated.body["execution_public_id"].as_str().expect("new execution").to_owned();
    completed(&http, &a2b).await;
    let shown = http.get(&format!("/agent_api/v1/conversations/{a}")).await;
    let second = &shown.body["turns"][1];
    assert_eq!(
        (second["execution_public_id"].clone(), second["candidates"].as_i64()),
        (json!(a2b), Some(2)),
        "{second}"
    );
    assert_eq!((second["status"].as_str(), second["final_text"].as_str()), (Some("completed"), Some("you said two")));
    let listed = http.get("/agent_api/v1/conversations").await;
    assert_eq!(listed.body["conversations"][2]["last_execution_public_id"], json!(a2b));
    assert_eq!(listed.body["conversations"][2]["turn_count"], 2, "a regeneration is no new turn");

    // Executions: newest first, by conversation and by status, paged.
    let of_a = http.get(&format!("/agent_api/v1/executions?conversation={a}")).await;
    assert_eq!(of_a.status, 200, "{of_a:?}");
    assert_eq!(ids(&of_a.body["executions"], "execution_public_id"), strs(&[&a2b, &a2, &a1]));
    let newest = &of_a.body["executions"][0];
    assert_eq!((newest["turn"].as_i64(), newest["status"].as_str()), (Some(2), Some("completed")), "{newest}");
    assert_eq!(newest["conversation_public_id"], json!(a));
    assert_eq!(newest["final_text"], Value::Null, "the answer is read from the execution itself");
    let all = http.get("/agent_api/v1/executions?status=completed").await;
    assert_eq!(all.body["executions"].as_array().map(Vec::len), Some(5), "{all:?}");
    let none = http.get("/agent_api/v1/executions?status=needs_attention").await;
    assert_eq!(none.body["executions"], json!([]));
    let page = http.get(&format!("/agent_api/v1/executions?conversation={a}&limit=2")).await;
    assert_eq!(ids(&page.body["executions"], "execution_public_id"), strs(&[&a2b, &a2]));
    assert_eq!(page.body["next_cursor"], json!(a2));
    let page = http.get(&format!("/agent_api/v1/executions?conversation={a}&limit=2&after={a2}")).await;
    assert_eq!(ids(&page.body["executions"], "execution_public_id"), strs(&[&a1]));
    assert_eq!(page.body["next_cursor"], Value::Null);
    let of_b = http.get(&format!("/agent_api/v1/executions?conversation={b}&status=completed")).await;
    assert_eq!(ids(&of_b.body["executions"], "execution_public_id"), strs(&[&b1]));
    for (query, what) in [
        ("status=failed", "a status that is no run status"),
        ("status=Completed", "a status in another spelling"),
        ("conversation=nope", "a conversation that is no id"),
        ("limit=201", "a limit over 200"),
        ("after=nope", "a cursor that is no id"),
        (&format!("after={}", uuid::Uuid::new_v4()) as &str, "a cursor of no execution"),
        ("turn=1", "a parameter this door does not take"),
    ] {
        refused(&http.get(&format!("/agent_api/v1/executions?{query}")).await, 400, "parameter_invalid", what);
    }
    let unknown = uuid::Uuid::new_v4();
    refused(
        &http.get(&format!("/agent_api/v1/executions?conversation={unknown}")).await,
        404,
        "not_found",
        "no such conversation",
    );
    refused(
        &http.get(&format!("/agent_api/v1/conversations/{unknown}")).await,
        404,
        "not_found",
        "no such conversation",
    );
    refused(&http.get("/agent_api/v1/conversations/nope").await, 400, "parameter_invalid", "a malformed id");
    refused(
        &http.get(&format!("/agent_api/v1/conversations/{}", a.to_uppercase())).await,
        400,
        "parameter_invalid",
        "an upper-case id",
    );
    refused(
        &http.get(&format!("/agent_api/v1/conversations/{a}?turns_after=-1")).await,
        400,
        "parameter_invalid",
        "a negative turn",
    );
    refused(
        &http.get(&format!("/agent_api/v1/conversations/{a}?after={a}")).await,
        400,
        "parameter_invalid",
        "a parameter of another door",
    );

    // gRPC answers the same JSON.
    let mut client = agent_client(&server).await;
    let listed = grpc_json(
        client
            .list_conversations(authed(ListConversationsRequest { after: String::new(), limit: Some(2) }, &agent))
            .await
            .expect("listed"),
    );
    assert_eq!(listed, http.get("/agent_api/v1/conversations?limit=2").await.body);
    let rest = grpc_json(
        client
            .list_conversations(authed(ListConversationsRequest { after: b.clone(), limit: None }, &agent))
            .await
            .expect("listed"),
    );
    assert_eq!(ids(&rest["conversations"], "conversation_public_id"), strs(&[&a]));
    let shown = grpc_json(
        client
            .get_conversation(authed(
                GetConversationRequest { conversation_public_id: a.clone(), turns_after: 0 },
                &agent,
            ))
            .await
            .expect("shown"),
    );
    assert_eq!(shown, http.get(&format!("/agent_api/v1/conversations/{a}")).await.body);
    let executions = grpc_json(
        client
            .list_executions(authed(
                ListExecutionsRequest {
                    conversation_public_id: a.clone(),
                    status: "completed".into(),
                    after: String::new(),
                    limit: Some(2),
                },
                &agent,
            ))
            .await
            .expect("listed"),
    );
    assert_eq!(
        executions,
        http.get(&format!("/agent_api/v1/executions?conversation={a}&status=completed&limit=2")).await.body
    );
    for (request, word) in [
        (ListConversationsRequest { after: String::new(), limit: Some(0) }, ErrorCode::ParameterInvalid),
        (ListConversationsRequest { after: String::new(), limit: Some(201) }, ErrorCode::ParameterInvalid),
        (ListConversationsRequest { after: "nope".into(), limit: None }, ErrorCode::ParameterInvalid),
    ] {
        let status = client.list_conversations(authed(request, &agent)).await.expect_err("refused");
        assert_eq!(grpc_code(&status), word);
    }
    let bad_status = ListExecutionsRequest { status: "failed".into(), ..ListExecutionsRequest::default() };
    let status = client.list_executions(authed(bad_status, &agent)).await.expect_err("refused");
    assert_eq!(grpc_code(&status), ErrorCode::ParameterInvalid);
    let missing = GetConversationRequest { conversation_public_id: unknown.to_string(), turns_after: 0 };
    let status = client.get_conversation(authed(missing, &agent)).await.expect_err("refused");
    assert_eq!(grpc_code(&status), ErrorCode::NotFound);

    // Another Agent's conversations are not found, and its listings hold none of them; a Human
    // reads no Agent's history yet.
    let stranger = server.agent("stranger").await;
    let other = Http::new(&server.url(), Some(&stranger.token));
    refused(
        &other.get(&format!("/agent_api/v1/conversations/{a}")).await,
        404,
        "not_found",
        "another Agent's conversation",
    );
    refused(
        &other.get(&format!("/agent_api/v1/executions?conversation={a}")).await,
        404,
        "not_found",
        "another Agent's conversation",
    );
    refused(
        &other.get(&format!("/agent_api/v1/conversations?after={a}")).await,
        400,
        "parameter_invalid",
        "another Agent's cursor",
    );
    refused(
        &other.get(&format!("/agent_api/v1/executions?after={a1}")).await,
        400,
        "parameter_invalid",
        "another Agent's cursor",
    );
    assert_eq!(other.get("/agent_api/v1/conversations").await.body, json!({"conversations": [], "next_cursor": null}));
    assert_eq!(other.get("/agent_api/v1/executions").await.body, json!({"executions": [], "next_cursor": null}));
    let theirs = GetConversationRequest { conversation_public_id: a.clone(), turns_after: 0 };
    let status = client.get_conversation(authed(theirs, &stranger)).await.expect_err("refused");
    assert_eq!(grpc_code(&status), ErrorCode::NotFound);
    let human = server.human("person").await;
    let person = Http::new(&server.url(), Some(&human.token));
    assert_eq!(person.get("/agent_api/v1/conversations").await.body["conversations"], json!([]));
    // A Human without a grant: 403, as on every execution door (`docs/executions.md`, "People in
    // the loop"); its listings are empty.
    refused(&person.get(&format!("/agent_api/v1/conversations/{a}")).await, 403, "not_authorized", "a Human");
    refused(
        &person.get(&format!("/agent_api/v1/executions?conversation={a}")).await,
        403,
        "not_authorized",
        "a Human filtering by a conversation",
    );
    assert_eq!(person.get("/agent_api/v1/executions").await.body["executions"], json!([]));
}

#[tokio::test]
async fn a_conversation_reply_pages_its_turns_within_its_bound() {
    let server = TestServer::start(&[("short", json!({"rounds": [{"final": "noted"}]}))]).await;
    let agent = server.agent("talker").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    declare(&http, "scripted/short").await;
    // Four turns of almost a megabyte each: three fit one reply's 3 MiB of turns, the fourth
    // goes on the next page.
    let text = |n: usize| format!("{n}{}", "x".repeat(1_040_000));
    let (conversation, _) = turn(&http, &text(1), None).await;
    for n in 2..=4 {
        turn(&http, &text(n), Some(&conversation)).await;
    }
    let mut client = agent_client(&server).await;
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let request = GetConversationRequest { conversation_public_id: conversation.clone(), turns_after: after };
        let page = grpc_json(client.get_conversation(authed(request, &agent)).await.expect("a page fits the reply"));
        let turns = page["turns"].as_array().expect("turns");
        assert!(!turns.is_empty(), "{}", page["turns_next"]);
        assert!(page.to_string().len() <= 4 * 1024 * 1024, "a reply fits 4 MiB");
        assert!(page["turns"].to_string().len() <= 3 * 1024 * 1024 || turns.len() == 1, "turns fit their bound");
        for turn in turns {
            assert_eq!(turn["text"].as_str().map(str::len), Some(1_040_001), "whole texts");
            seen.push(turn["turn"].as_u64().expect("turn"));
        }
        match page["turns_next"].as_u64() {
            Some(next) => {
                assert_eq!(Some(next), turns.last().and_then(|t| t["turn"].as_u64()));
                after = u32::try_from(next).expect("small");
            }
            None => break,
        }
    }
    assert_eq!(seen, [1, 2, 3, 4], "every turn once, in order");
    let first = http.get(&format!("/agent_api/v1/conversations/{conversation}")).await;
    assert_eq!((first.body["turns"].as_array().map(Vec::len), first.body["turns_next"].as_u64()), (Some(3), Some(3)));
}

fn probe_tool() -> Value {
    json!({"name": "probe", "description": "Probe the machine.", "input_schema": {"type": "object"},
           "effect_profile": {"kind": "read_only", "destructive": false, "effect_scope": "closed",
                              "idempotency": "intrinsic", "reconciliation": "none"},
           "timeout_ms": 60_000})
}

/// The `task_progress` items of an SSE body, as `(task_key, text_tail)`.
fn sse_progress(body: &str) -> Vec<(String, String)> {
    body.split("\n\n")
        .filter(|block| block.lines().any(|l| l == "event: task_progress"))
        .map(|block| {
            assert!(!block.lines().any(|l| l.starts_with("id:")), "progress has no resumable id: {block}");
            let data: Value = block
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .and_then(|d| serde_json::from_str(d).ok())
                .expect("data");
            let item = &data["data"];
            (
                item["task_key"].as_str().expect("task_key").to_owned(),
                item["frame"]["text_tail"].as_str().expect("frame").to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn runner_progress_reaches_the_feed_throttled_per_task() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "c1", "name": "probe", "arguments": {}}]},
        {"final": "probe said {{tool:c1}}"}
    ]});
    let server = TestServer::start(&[("probe", script)]).await;
    let agent = server.agent("watcher").await;
    let runner = server.runner("runner-a").await;
    let (mut raw, hello) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    assert!(matches!(hello, Reply::Frame(nexus_frame::Frame::Welcome(_))), "{hello:?}");
    assert!(raw.announce(&json!({"tools": [probe_tool()]})).await.code().is_none());
    let http = Http::new(&server.url(), Some(&agent.token));
    let declared = http
        .declare(&json!({"configuration": {"default_model": "scripted/probe", "approval_mode": "bypass",
                                           "runner_executor_public_ids": [runner.id]}}))
        .await;
    assert_eq!(declared.status, 200, "{declared:?}");
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "probe it"})).await;
    let execution = admitted.body["execution_public_id"].as_str().expect("id").to_owned();
    let work = raw.next_work(WAIT).await.expect("work");
    let (token, _) = raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("claim");

    // Three watchers: SSE and gRPC asking for progress, and one gRPC follower that does not.
    let url = format!("{}/agent_api/v1/executions/{execution}/events/stream?progress=true", server.url());
    let sse = reqwest::Client::new().get(url).bearer_auth(&agent.token).send().await.expect("watch");
    assert_eq!(sse.status().as_u16(), 200);
    let mut client = agent_client(&server).await;
    let follow = |progress| StreamEventsRequest {
        execution_public_id: execution.clone(),
        after: String::new(),
        follow: true,
        transcript: false,
        progress,
    };
    let mut watching = client.stream_events(authed(follow(true), &agent)).await.expect("follow").into_inner();
    let mut plain = client.stream_events(authed(follow(false), &agent)).await.expect("follow").into_inner();

    let progress = |token: &str, text: &str| {
        runner_frame::Frame::Progress(Progress {
            run_public_id: work.run_public_id.clone(),
            task_key: work.task_key.clone(),
            claim_token: token.to_owned(),
            frame_json: json!({"text_tail": text}).to_string(),
        })
    };
    // Ten frames at once: the first goes out, the newest of the rest an interval later.
    for n in 0..10 {
        let accepted = raw.request(progress(&token, &format!("line {n}"))).await;
        assert!(matches!(accepted, Reply::Frame(nexus_frame::Frame::ProgressAccepted(_))), "{accepted:?}");
    }
    // A frame without the claim is refused and never shown.
    assert_eq!(raw.request(progress("forged", "forged")).await.code(), Some("not_claimant"));
    let mut items = Vec::new();
    let started = tokio::time::Instant::now();
    while items.len() < 2 {
        let event = tokio::time::timeout(WAIT, watching.next()).await.expect("an item").expect("open").expect("ok");
        if event.r#type == "task_progress" {
            assert!(event.cursor.is_empty(), "progress is not resumable: {event:?}");
            let data: Value = serde_json::from_str(&event.data_json).expect("data");
            assert_eq!(
                (data["task_key"].as_str(), data["tool_name"].as_str()),
                (Some(work.task_key.as_str()), Some("probe"))
            );
            assert_eq!(data["runner_executor_public_id"], json!(runner.id));
            items.push(data["frame"]["text_tail"].as_str().expect("text").to_owned());
        }
    }
    assert_eq!(items, ["line 0", "line 9"], "the first at once, then the newest after the interval");
    assert!(started.elapsed() >= Duration::from_millis(500), "the second waited for its interval");

    // One more frame, and the task settles inside its interval: the frame is not lost.
    raw.request(progress(&token, "last words")).await;
    let done = raw.commit(&work.run_public_id, &work.task_key, &token, &json!({"content": "ok"})).await;
    assert_eq!(done.committed(), Some((false, "completed".to_owned())));
    let mut rest = Vec::new();
    while let Some(event) = tokio::time::timeout(WAIT, watching.next()).await.expect("the watch ends") {
        let event = event.expect("ok");
        if event.r#type == "task_progress" {
            let data: Value = serde_json::from_str(&event.data_json).expect("data");
            rest.push(data["frame"]["text_tail"].as_str().expect("text").to_owned());
        }
    }
    assert_eq!(rest, ["last words"], "the held frame goes out when its task settles");
    let body = tokio::time::timeout(WAIT, sse.text()).await.expect("the watch ends").expect("body");
    let shown: Vec<String> = sse_progress(&body)
        .into_iter()
        .map(|(key, text)| {
            assert_eq!(key, work.task_key);
            text
        })
        .collect();
    assert_eq!(shown, ["line 0", "line 9", "last words"], "{body}");
    let mut types = Vec::new();
    while let Some(event) = tokio::time::timeout(WAIT, plain.next()).await.expect("the watch ends") {
        types.push(event.expect("ok").r#type);
    }
    assert!(!types.is_empty() && !types.iter().any(|t| t == "task_progress"), "asked for none: {types:?}");
    // Nothing of it is stored.
    let page = http.get(&format!("/agent_api/v1/executions/{execution}/events?limit=200")).await;
    assert!(
        page.body["items"].as_array().expect("items").iter().all(|item| item["type"] != "task_progress"),
        "{page:?}"
    );
    assert_eq!(
        wait_until("completion", WAIT, || async {
            let row = http.get(&format!("/agent_api/v1/executions/{execution}")).await;
            (row.body["status"] == "completed").then_some(row.body["final_text"].clone())
        })
        .await,
        "probe said ok"
    );
}

#[tokio::test]
async fn runner_agent_bash_reports_its_output_as_progress() {
    let command = "while [ ! -e watching ]; do sleep 0.02; done; echo first line; \
                   while [ ! -e go ]; do sleep 0.02; done; echo done";
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "s", "name": "bash", "arguments": {"command": command}}]},
        {"final": "bash said {{tool:s.stdout}}"}
    ]});
    let server = TestServer::start(&[("talkative", script)]).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("runner").await;
    let workdir = tempfile::tempdir().expect("workdir");
    let state_dir = tempfile::tempdir().expect("state");
    let config = nexus_tests::agent_config(server.url(), &runner, workdir.path(), state_dir.path());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent_task = tokio::spawn(nexus_runner_agent::run(config, async {
        let _ = stop_rx.await;
    }));
    wait_until("announcement", WAIT, || async {
        server.store().executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
    })
    .await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let declared = http
        .declare(&json!({"configuration": {"default_model": "scripted/talkative", "approval_mode": "bypass",
                                           "runner_executor_public_ids": [runner.id]}}))
        .await;
    assert_eq!(declared.status, 200, "{declared:?}");
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "talk"})).await;
    let execution = admitted.body["execution_public_id"].as_str().expect("id").to_owned();
    let mut client = agent_client(&server).await;
    let request = StreamEventsRequest {
        execution_public_id: execution.clone(),
        after: String::new(),
        follow: true,
        transcript: false,
        progress: true,
    };
    let mut watching = client.stream_events(authed(request, &agent)).await.expect("follow").into_inner();
    // The command writes only once the watcher is attached.
    std::fs::write(workdir.path().join("watching"), "").expect("watching");
    let frame = loop {
        let event = tokio::time::timeout(WAIT, watching.next()).await.expect("an item").expect("open").expect("ok");
        if event.r#type == "task_progress" {
            let data: Value = serde_json::from_str(&event.data_json).expect("data");
            assert_eq!((data["task_key"].as_str(), data["tool_name"].as_str()), (Some("r1t0"), Some("bash")), "{data}");
            break data["frame"].clone();
        }
    };
    assert_eq!(frame["text_tail"], "first line\n", "{frame}");
    assert_eq!(frame["bytes"], 11, "{frame}");
    std::fs::write(workdir.path().join("go"), "").expect("go");
    while let Some(event) = tokio::time::timeout(WAIT, watching.next()).await.expect("the watch ends") {
        event.expect("ok");
    }
    let row = http.get(&format!("/agent_api/v1/executions/{execution}")).await;
    assert_eq!(
        (row.body["status"].as_str(), row.body["final_text"].as_str()),
        (Some("completed"), Some("bash said first line\ndone"))
    );
    let _ = stop_tx.send(());
    agent_task.await.expect("agent joins").expect("agent stops cleanly");
}
