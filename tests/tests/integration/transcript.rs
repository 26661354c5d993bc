//! The transcript stored one message per row (`docs/architecture.md`, "Transcript storage"): a
//! save writes what is new, so the bytes a round's saves write stay flat as the execution grows,
//! and a restart reads back the same transcript, from which the execution goes on.
//!
//! One long execution of the scripted model: every round calls the runner tool `noop` once (a
//! raw runner serves it), then a final answer quotes the last result. The scripted model picks
//! its round from the transcript it is sent, so a transcript lost or reordered across the restart
//! would change the calls it makes.

use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::model::ChatMessage;
use nexus_actors::store::{EventType, SaveBytes};
use nexus_proto::{ExecutionId, RunStatus};
use nexus_tests::{Http, Minted, RawRunner, TestServer, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// Tool rounds before the final answer.
const ROUNDS: usize = 40;
/// The rounds whose saves are compared.
const EARLY: i64 = 3;
const LATE: i64 = 30;
/// The round whose call is open while nexus restarts.
const HELD: usize = 31;

fn script() -> Value {
    let mut rounds: Vec<Value> = (1..=ROUNDS)
        .map(|round| json!({"tool_calls": [{"id": format!("c{round}"), "name": "noop", "arguments": {"step": round}}]}))
        .collect();
    rounds.push(json!({"final": format!("done: {{{{tool:c{ROUNDS}}}}}")}));
    json!({"rounds": rounds})
}

fn scripts() -> [(&'static str, Value); 1] {
    [("long", script())]
}

async fn connect(server: &TestServer, runner: &Minted) -> RawRunner {
    let noop = json!({"name": "noop", "description": "Does nothing.", "input_schema": {"type": "object"},
        "effect_profile": {"kind": "read_only", "destructive": false, "effect_scope": "closed",
                           "idempotency": "intrinsic", "reconciliation": "none"}});
    RawRunner::connect_announced(&server.url(), runner, &json!({"tools": [noop], "environment": {"name": "worker"}}))
        .await
}

/// Waits for the offer of round `round`'s call, claims it and commits `ok <round>`.
async fn serve(raw: &mut RawRunner, run: ExecutionId, round: usize) {
    let key = offered(raw, run, round).await;
    let (token, _) = raw.claim(&run.to_string(), &key).await.granted().expect("claim granted");
    let committed = raw.commit(&run.to_string(), &key, &token, &json!({"content": format!("ok {round}")})).await;
    assert_eq!(committed.committed().map(|c| c.1), Some("completed".to_owned()), "{committed:?}");
}

/// Waits for the offer of round `round`'s call and answers its task key.
async fn offered(raw: &mut RawRunner, run: ExecutionId, round: usize) -> String {
    let key = format!("r{round}t0");
    let work = raw.next_work(WAIT).await.unwrap_or_else(|| panic!("{key} offered"));
    assert_eq!((work.run_public_id, work.task_key.as_str()), (run.to_string(), key.as_str()));
    key
}

fn round_bytes(server: &TestServer, run: ExecutionId, round: i64) -> SaveBytes {
    server.store().round_save_bytes(run, round).unwrap_or_else(|| panic!("round {round} saved nothing"))
}

/// What the estimate door measures of the next request: `(messages, transcript bytes)`.
async fn estimate(http: &Http, run: ExecutionId) -> (Value, Value) {
    let estimate = http.get(&format!("/agent_api/v1/executions/{run}/estimate")).await;
    assert_eq!(estimate.status, 200, "{:?}", estimate.body);
    (estimate.body["messages"].clone(), estimate.body["bytes"]["transcript"].clone())
}

/// The transcript the execution ends with: the input, then each round's call and its result in
/// order, then the answer.
fn expected_transcript() -> Vec<ChatMessage> {
    let mut messages = vec![ChatMessage::User { content: "count to forty".to_owned() }];
    for round in 1..=ROUNDS {
        let id = format!("c{round}");
        let call = nexus_actors::model::ToolCall {
            id: id.clone(),
            name: "noop".to_owned(),
            arguments: json!({"step": round}).to_string(),
            model_id: None,
        };
        messages.push(ChatMessage::Assistant { content: None, tool_calls: vec![call] });
        messages.push(ChatMessage::Tool { tool_call_id: id, content: format!("ok {round}") });
    }
    messages.push(ChatMessage::Assistant { content: Some(format!("done: ok {ROUNDS}")), tool_calls: Vec::new() });
    messages
}

fn transcript_of(value: &Value) -> Vec<ChatMessage> {
    serde_json::from_value(value.clone()).expect("the stored transcript is chat messages")
}

#[tokio::test]
async fn a_save_writes_what_is_new_and_a_restart_goes_on_from_the_same_transcript() {
    let server = TestServer::start(&scripts()).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("worker").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    // Announced before the input, so the execution freezes `noop` among its tools.
    let mut raw = connect(&server, &runner).await;
    let declared = http
        .declare(&json!({"configuration": {"runner_executor_public_ids": [runner.id], "approval_mode": "bypass",
                                           "default_model": "scripted/long"}}))
        .await;
    assert_eq!(declared.status, 200, "{declared:?}");
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "count to forty"})).await;
    assert_eq!(admitted.status, 201, "{admitted:?}");
    let run: ExecutionId = admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");

    for round in 1..HELD {
        serve(&mut raw, run, round).await;
    }
    // The offer of the held round's call follows every save of the rounds before it.
    offered(&mut raw, run, HELD).await;

    // A round's saves: its start (with the previous call's result), its expansion (the call, its
    // task and narration), and the call's settlement. Round 30 writes what round 3 wrote, give or
    // take the digits of its numbers, although its transcript is ten times as long.
    let (early, late) = (round_bytes(&server, run, EARLY), round_bytes(&server, run, LATE));
    eprintln!(
        "save bytes: round {EARLY}: {} saves, {} bytes ({:.0} per save); round {LATE}: {} saves, {} bytes ({:.0} per save)",
        early.saves,
        early.bytes,
        early.per_save(),
        late.saves,
        late.bytes,
        late.per_save()
    );
    assert_eq!(early.saves, late.saves, "every round saves the same number of times");
    assert!(late.bytes as f64 <= 1.2 * early.bytes as f64, "round {LATE} {late:?} against round {EARLY} {early:?}");
    assert!(late.per_save() <= 1.2 * early.per_save(), "round {LATE} {late:?} against round {EARLY} {early:?}");
    let total = server.store().save_bytes();
    assert!(total.saves >= early.saves * (LATE as u64) && total.bytes > late.bytes, "{total:?}");

    let before = server.store().execution(run).await.expect("store").expect("execution");
    let held = transcript_of(&before.transcript);
    let expected = expected_transcript();
    // The input, thirty calls with their results, and the held round's call.
    assert_eq!(held.len(), 2 * HELD, "{held:?}");
    assert_eq!(held[..], expected[..2 * HELD], "the store holds the transcript in order");
    assert_eq!(before.transcript_stored, held.len(), "every message is stored per row");
    let transcript_bytes = before.transcript.to_string().len() as u64;
    assert!(
        late.bytes < transcript_bytes,
        "round {LATE}'s saves ({late:?}) wrote less than the transcript they extended ({transcript_bytes} bytes)"
    );
    let estimated = estimate(&http, run).await;
    assert_eq!(estimated.0, json!(held.len()), "the estimate door reads the same transcript");

    // Stop nexus with the call open and start it again on the same store.
    drop(raw);
    let server = server.restart(&scripts()).await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let after = server.store().execution(run).await.expect("store").expect("execution");
    assert_eq!(after.transcript, before.transcript, "the restart reads back the same transcript");
    assert_eq!((after.round, after.status), (before.round, RunStatus::Running));
    assert_eq!(estimate(&http, run).await, estimated, "and the estimate door measures the same request");

    let mut raw = connect(&server, &runner).await;
    for round in HELD..=ROUNDS {
        serve(&mut raw, run, round).await;
    }
    let done = wait_until("the execution to complete", WAIT, || async {
        server.store().execution(run).await.ok().flatten().filter(|row| row.status == RunStatus::Completed)
    })
    .await;
    assert_eq!(done.final_text.as_deref(), Some(format!("done: ok {ROUNDS}").as_str()));
    assert_eq!(transcript_of(&done.transcript), expected, "the execution went on from the transcript it had");
    assert_eq!(done.transcript_stored, expected.len());
    // Each round started once: the held round's answer was durable, so no model call was asked
    // again after the restart.
    let events = server.store().events_after(run, 0, i64::MAX).await.expect("events");
    let rounds: Vec<i64> = events
        .iter()
        .filter(|e| e.event.event_type() == EventType::RoundStarted)
        .filter_map(|e| e.event.data()["round"].as_i64())
        .collect();
    assert_eq!(rounds, (1..=ROUNDS as i64 + 1).collect::<Vec<_>>());
    // The round after the restart saved what the rounds before it did.
    let resumed = round_bytes(&server, run, LATE + 5);
    assert!(resumed.bytes as f64 <= 1.2 * early.bytes as f64, "round {} {resumed:?}", LATE + 5);
    server.shutdown().await;
}
