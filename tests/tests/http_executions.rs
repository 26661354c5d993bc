//! The execution doors on HTTP: admit an input, read the execution, read its event feed a page at
//! a time, and watch it live as Server-Sent Events, resuming from a cursor.

use std::time::Duration;

use serde_json::{Value, json};

use nexus_tests::{Http, Minted, TestServer, wait_until};

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
        (row.status == "completed").then_some(())
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
    for bad in ["limit=0", "limit=201", "limit=x", "after=nonsense", "after=cvei_01"] {
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
    let as_human =
        Http::new(&server.url(), Some(&human.token)).post("/agent_api/v1/inputs", &json!({"text": "x"})).await;
    assert_eq!((as_human.status, as_human.code()), (403, Some("not_agent")), "{as_human:?}");
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
        let task = server.store().task(execution.parse().ok()?, "r1t0").await.ok()??;
        (task.status == "needs_approval").then_some(())
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
