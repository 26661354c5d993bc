//! The approval stage with a real `runner-agent` process serving the tool: a parked call runs on
//! the worker only after it is approved over HTTP, and a denied one never runs there at all.

use nexus_proto::{ExecutionId, RunStatus, TaskStatus};
use nexus_tests::key;
use std::time::Duration;

use serde_json::{Value, json};

use nexus_tests::processes::RunnerAgentProcess;
use nexus_tests::{Http, TestServer, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// One tool round that writes `marker` in the runner's workdir with bash, then a final answer that
/// quotes the call's result.
fn script() -> Value {
    json!({"rounds": [
        {"tool_calls": [{"id": "touch", "name": "bash", "arguments": {"command": "echo ran > marker && echo wrote"}}]},
        {"final": "result: {{tool:touch.stdout}}"}
    ]})
}

/// A server, an Agent declared under `ask` on one real runner-agent, and one admitted input whose
/// bash call is parked. Answers what the test needs, with the runner-agent kept alive.
async fn parked_on_a_real_runner() -> (TestServer, Http, ExecutionId, tempfile::TempDir, tokio::process::Child) {
    let server = TestServer::start(&[("touch", script())]).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("worker").await;
    let dirs = tempfile::tempdir().expect("dirs");
    let (workdir, state_dir) = (dirs.path().join("work"), dirs.path().join("state"));
    std::fs::create_dir_all(&workdir).expect("workdir");
    let child = RunnerAgentProcess {
        nexus_url: server.url(),
        runner: runner.clone(),
        token_file: dirs.path().join("token"),
        workdir,
        state_dir,
        tool_timeout_ms: 30_000,
    }
    .spawn();
    wait_until("the runner announces its tools", WAIT, || async {
        server.store().executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
    })
    .await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let declared = http
        .declare(&json!({"configuration": {"runner_executor_public_ids": [runner.id], "approval_mode": "ask",
                                           "default_model": "scripted/touch"}}))
        .await;
    assert_eq!(declared.status, 200, "{declared:?}");
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "touch the marker"})).await;
    assert_eq!(admitted.status, 201, "{admitted:?}");
    let run: ExecutionId = admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    wait_until("the bash call parks", WAIT, || async {
        let task = server.store().task(run, key("r1t0")).await.ok()??;
        (task.status == TaskStatus::NeedsApproval).then_some(())
    })
    .await;
    (server, http, run, dirs, child)
}

async fn quiet(server: &TestServer, run: ExecutionId) -> nexus_actors::store::ExecutionRow {
    wait_until("the execution is quiet", WAIT, || async {
        let row = server.store().execution(run).await.ok()??;
        matches!(row.status, RunStatus::Completed | RunStatus::NeedsAttention).then_some(row)
    })
    .await
}

#[tokio::test]
async fn an_approved_call_runs_on_the_runner_agent_only_after_approval() {
    let (server, http, run, dirs, _child) = parked_on_a_real_runner().await;
    let marker = dirs.path().join("work/marker");
    // Parked: the worker, connected and announced, has run nothing, and the call is not in its
    // inbox to claim.
    assert!(!marker.exists(), "a parked call never reaches the worker");
    let parked = server.store().task(run, key("r1t0")).await.expect("task").expect("row");
    assert_eq!((parked.status, parked.claimed), (TaskStatus::NeedsApproval, false));
    let inboxes = server.store().executors_with_open_tasks().await.expect("inboxes");
    assert!(inboxes.is_empty(), "nothing is offered to the worker while the call is parked: {inboxes:?}");
    let approved = http.post(&format!("/agent_api/v1/executions/{run}/tasks/r1t0/approve"), &json!({})).await;
    assert_eq!(approved.status, 200, "{approved:?}");
    // The owning Agent decided: the fact names it.
    assert_eq!(approved.body["approval"]["origin"], "agent", "{approved:?}");
    assert!(approved.body["approval"]["decided_by"].is_string(), "{approved:?}");
    let row = quiet(&server, run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert_eq!(row.final_text.as_deref(), Some("result: wrote"));
    assert_eq!(std::fs::read_to_string(&marker).expect("the worker ran the call"), "ran\n");
    let task = server.store().task(run, key("r1t0")).await.expect("task").expect("row");
    assert_eq!((task.status, task.claimed), (TaskStatus::Completed, true));
}

#[tokio::test]
async fn a_denied_call_never_runs_and_the_model_reads_the_denial() {
    let (server, http, run, dirs, _child) = parked_on_a_real_runner().await;
    let denied = http
        .post(&format!("/agent_api/v1/executions/{run}/tasks/r1t0/deny"), &json!({"reason": "not on this machine"}))
        .await;
    assert_eq!(denied.status, 200, "{denied:?}");
    let row = quiet(&server, run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert_eq!(
        row.final_text.as_deref(),
        Some(
            "result: <tool_use_error>This tool call was declined by the approver (approval_denied) not on this \
             machine</tool_use_error>"
        )
    );
    let task = server.store().task(run, key("r1t0")).await.expect("task").expect("row");
    assert_eq!(
        (task.status, task.error_key.as_deref(), task.claimed),
        (TaskStatus::Failed, Some("approval_denied"), false)
    );
    assert!(!dirs.path().join("work/marker").exists(), "a denied call never reaches the worker");
}
