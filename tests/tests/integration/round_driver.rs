//! The round driver's per-call failure words and its repeat brake (`docs/executions.md`,
//! "Per-call failures" and "Repeat brake"), end to end with the scripted model and an in-process
//! kernel tool.

use nexus_actors::store::EventType;
use nexus_proto::{ExecutionId, RunStatus};
use std::time::Duration;

use serde_json::{Value, json};

use nexus_tests::{Http, TestServer, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// Starts one execution of `script` (model `scripted/s`) for an Agent that declares
/// `runners_list`, and waits until it is quiet; answers the execution as the door shows it.
async fn run(script: Value) -> (TestServer, Value) {
    let server = TestServer::start(&[("s", script)]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let declared = http
        .declare(&json!({"configuration": {"default_model": "scripted/s", "approval_mode": "bypass",
                                           "kernel_tools": ["nexus.runners.list"]}}))
        .await;
    assert_eq!(declared.status, 200, "{declared:?}");
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "go"})).await;
    assert_eq!(admitted.status, 201, "{admitted:?}");
    let id: ExecutionId = admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    wait_until("the execution is quiet", WAIT, || async {
        let row = server.store().execution(id).await.ok()??;
        matches!(row.status, RunStatus::Completed | RunStatus::NeedsAttention).then_some(())
    })
    .await;
    let execution = http.get(&format!("/agent_api/v1/executions/{id}")).await.body;
    (server, execution)
}

fn error_keys(execution: &Value) -> Vec<(String, String)> {
    execution["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| (t["task_key"].as_str().unwrap_or("").to_owned(), t["error_key"].as_str().unwrap_or("").to_owned()))
        .collect()
}

#[tokio::test]
async fn each_bad_call_fails_alone_with_its_word_and_the_round_goes_on() {
    let big = format!(r#"{{"pad": "{}"}}"#, "x".repeat(70_000));
    let script = json!({"rounds": [
        {"tool_calls": [
            {"id": "ok", "name": "runners_list"},
            {"id": "array", "name": "runners_list", "arguments": "[1, 2]"},
            {"id": "nul", "name": "runners_list", "arguments": "{\"x\": \"a\\u0000b\"}"},
            {"id": "huge_number", "name": "runners_list", "arguments": "{\"n\": 1e400}"},
            {"id": "nobody", "name": "no_such_tool", "arguments": {"why": "asked"}},
            {"id": "big", "name": "runners_list", "arguments": big},
            {"id": "cut", "name": "runners_list", "arguments": "{\"x\": \"abc"}
        ]},
        {"final": "done: {{tool:nobody}}"}
    ]});
    let (server, execution) = run(script).await;
    assert_eq!(execution["status"], "completed", "{execution}");
    let keys = error_keys(&execution);
    assert_eq!(
        keys,
        [
            ("r1t0", ""),
            ("r1t1", "invalid_tool_arguments"),
            ("r1t2", "invalid_tool_input"),
            ("r1t3", "invalid_tool_input"),
            ("r1t4", "unknown_tool"),
            ("r1t5", "tool_input_too_large"),
            // Without a `length` finish, cut-off arguments are just malformed.
            ("r1t6", "invalid_tool_arguments"),
        ]
        .map(|(k, e)| (k.to_owned(), e.to_owned()))
    );
    // The model read each failure as its tool result.
    assert!(execution["final_text"].as_str().is_some_and(|t| t.contains("no_such_tool")), "{execution}");
    // The record keeps what the model asked of an undeclared tool.
    let id: ExecutionId = execution["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    let events = server.store().events_after(id, 0, 1_000).await.expect("events");
    let round = events.iter().find(|e| e.event.event_type() == EventType::RoundResult).expect("round_result");
    assert_eq!(round.event.data()["tool_calls"][4]["input"], json!({"why": "asked"}), "{:?}", round.event.data());
}

#[tokio::test]
async fn arguments_cut_at_the_output_limit_are_truncated_tool_arguments() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "cut", "name": "runners_list", "arguments": "{\"x\": \"abc"}], "finish_reason": "length"},
        {"final": "done"}
    ]});
    let (_server, execution) = run(script).await;
    assert_eq!(error_keys(&execution), [("r1t0".to_owned(), "truncated_tool_arguments".to_owned())]);
}

#[tokio::test]
async fn the_repeat_brake_refuses_the_tenth_unchanging_round() {
    let mut rounds: Vec<Value> = (0..12).map(|_| json!({"tool_calls": [{"name": "runners_list"}]})).collect();
    rounds.push(json!({"final": "never"}));
    let (server, execution) = run(json!({"rounds": rounds})).await;
    assert_eq!(execution["status"], "needs_attention", "{execution}");
    assert_eq!(execution["attention_reason"], "halt_failure");
    assert_eq!(execution["error_key"], "round_expansion_refused");
    // Nine rounds ran; the tenth was never expanded.
    assert_eq!(execution["tasks"].as_array().map(Vec::len), Some(9), "{execution}");
    let id: ExecutionId = execution["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    let events = server.store().events_after(id, 0, 1_000).await.expect("events");
    let attention =
        events.iter().find(|e| e.event.event_type() == EventType::AttentionRequired).expect("attention_required");
    assert!(
        attention.event.data()["message"].as_str().is_some_and(|m| m.starts_with("repeat_call_loop")),
        "{attention:?}"
    );
}

#[tokio::test]
async fn changing_results_are_progress_and_never_braked() {
    // Twelve rounds of different calls: nothing is stale.
    let mut rounds: Vec<Value> =
        (0..12).map(|i| json!({"tool_calls": [{"name": "runners_list", "arguments": {"round": i}}]})).collect();
    rounds.push(json!({"final": "finished"}));
    let (_server, execution) = run(json!({"rounds": rounds})).await;
    assert_eq!(execution["status"], "completed", "{execution}");
    assert_eq!(execution["tasks"].as_array().map(Vec::len), Some(12));
}
