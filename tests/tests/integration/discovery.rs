//! The discovery bridge and skills end to end (`docs/kernel-tools.md`, "tool_call", "skill",
//! "What runs"): a real `runner-agent` serves the tools, a local fake provider plays the model,
//! and each test asserts what the model read in its next request.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::store::{Event, EventType};
use nexus_proto::{ExecutionId, RunStatus, TaskStatus};
use nexus_tests::processes::RunnerAgentProcess;
use nexus_tests::{Act, FakeProvider, Http, Minted, TestServer};

const WAIT: Duration = Duration::from_secs(30);

/// A server whose `fake/<model>` models are answered by `fake`, one Agent, and its HTTP client.
struct Bed {
    fake: FakeProvider,
    server: TestServer,
    http: Http,
}

impl Bed {
    async fn start() -> Bed {
        let fake = FakeProvider::start().await;
        let server = TestServer::start_with_fake(&fake).await;
        let agent = server.agent("agent").await;
        let http = Http::new(&server.url(), Some(&agent.token));
        Bed { fake, server, http }
    }

    /// A real runner-agent for a fresh runner, with `extra` flags, announced before this
    /// answers. The process and its directories live as long as the returned handles.
    async fn runner_agent(&self, dirs: &Path, extra: &[&str]) -> (Minted, tokio::process::Child) {
        let runner = self.server.runner("worker").await;
        let (workdir, state_dir) = (dirs.join("work"), dirs.join("state"));
        std::fs::create_dir_all(&workdir).expect("workdir");
        let (child, _log) = RunnerAgentProcess {
            nexus_url: self.server.url(),
            runner: runner.clone(),
            token_file: dirs.join("token"),
            workdir,
            state_dir,
            tool_timeout_ms: 30_000,
        }
        .spawn_announced(&self.server, extra)
        .await;
        (runner, child)
    }

    async fn declare(&self, configuration: Value) {
        let declared = self.http.declare(&json!({ "configuration": configuration })).await;
        assert_eq!(declared.status, 200, "{declared:?}");
    }

    async fn post_input(&self, text: &str) -> ExecutionId {
        let admitted = self.http.post("/agent_api/v1/inputs", &json!({ "text": text })).await;
        assert_eq!(admitted.status, 201, "{admitted:?}");
        admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id")
    }

    async fn quiet(&self, run: ExecutionId) -> nexus_actors::store::ExecutionRow {
        self.server.settled(run, WAIT).await
    }
}

fn calls(calls: &[(&str, &str, Value)]) -> Act {
    Act::ToolCalls(
        calls.iter().map(|(id, name, input)| ((*id).to_owned(), (*name).to_owned(), input.clone())).collect(),
    )
}

/// The names of the tools a request offered, sorted.
fn offered(body: &Value) -> Vec<String> {
    let mut names: Vec<String> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// The system messages' texts of a request.
fn system_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "system")
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn tool_call_runs_a_deferred_runner_tool_through_ask_approval() {
    let bed = Bed::start().await;
    let dirs = tempfile::tempdir().expect("dirs");
    let (runner, _child) = bed.runner_agent(dirs.path(), &[]).await;
    bed.declare(json!({
        "runner_executor_public_ids": [runner.id], "default_model": "fake/m", "approval_mode": "ask",
        "kernel_tools": ["nexus.tools.search", "nexus.tools.call"],
        "approval_rules": [{"tool": "tool_search", "verdict": "allow"}],
    }))
    .await;
    bed.fake.script(
        "m",
        [
            calls(&[("found", "tool_search", json!({"query": "bash"}))]),
            calls(&[(
                "ran",
                "tool_call",
                json!({"name": "bash", "input": {"command": "echo ran > marker && echo wrote"}}),
            )]),
            Act::EchoLastToolResult,
        ],
    );
    let run = bed.post_input("run it through the bridge").await;
    // The target parks as a direct bash call would: under `ask`, before anything reaches the
    // worker, recorded as `tool_call` beside the served name and the runner.
    let parked = bed.server.task_in(run, "r2t0", TaskStatus::NeedsApproval).await;
    assert_eq!((parked.callable_name.as_str(), parked.tool_name.as_str()), ("tool_call", "bash"));
    assert_eq!(parked.target_executor_public_id, Some(runner.runner()));
    assert_eq!(parked.tool_input, json!({"command": "echo ran > marker && echo wrote"}));
    assert!(!parked.claimed, "nothing claimed it");
    let marker = dirs.path().join("work/marker");
    assert!(!marker.exists(), "a parked call never reaches the worker");
    let events = bed.server.store().events_after(run, 0, i64::MAX).await.expect("events");
    let required = events
        .iter()
        .find_map(|e| match &e.event {
            Event::ApprovalRequired(required) => Some(required.clone()),
            _ => None,
        })
        .expect("approval_required");
    assert_eq!((required.tool_name.as_str(), required.served_name.as_str()), ("tool_call", "bash"));
    assert_eq!(required.runner_executor_public_id, Some(runner.runner()));

    let approved = bed.http.post(&format!("/agent_api/v1/executions/{run}/tasks/r2t0/approve"), &json!({})).await;
    assert_eq!(approved.status, 200, "{approved:?}");
    let row = bed.quiet(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert_eq!(std::fs::read_to_string(&marker).expect("the worker ran the call"), "ran\n");
    let task = bed.server.task(run, "r2t0").await.expect("row");
    assert_eq!((task.status, task.claimed), (TaskStatus::Completed, true));

    let requests = bed.fake.requests_for("m");
    assert_eq!(requests.len(), 3, "search, call, answer");
    // The runner's tools are deferred: the model sees only the bridge.
    assert_eq!(offered(&requests[0].body), ["tool_call", "tool_search"]);
    // It found bash with tool_search, and read the target's real result through tool_call.
    let found = &requests[1].tool_results()[0];
    assert!(found.contains("\"name\":\"bash\"") && found.contains(&runner.id.to_string()), "{found}");
    let result = requests[2].tool_results().last().cloned().expect("a tool result");
    assert!(result.contains("wrote"), "the model read bash's stdout: {result}");
    assert!(row.final_text.as_deref().is_some_and(|t| t.contains("wrote")), "{row:?}");
}

#[tokio::test]
async fn tool_call_outside_the_frozen_set_reads_tool_not_declared() {
    let bed = Bed::start().await;
    bed.declare(json!({"default_model": "fake/m", "approval_mode": "bypass",
        "kernel_tools": ["nexus.tools.search", "nexus.tools.call", "nexus.runners.list"]}))
        .await;
    bed.fake.script(
        "m",
        [
            calls(&[
                ("a", "tool_call", json!({"name": "deploy", "input": {}})),
                ("b", "tool_call", json!({"name": "tool_call", "input": {"name": "runners_list", "input": {}}})),
                ("c", "tool_call", json!({"name": "runners_list"})),
                ("d", "tool_call", json!({"name": "runners_list", "input": {}})),
            ]),
            Act::Text("done".into()),
        ],
    );
    let run = bed.post_input("call what is not there").await;
    let row = bed.quiet(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let requests = bed.fake.requests_for("m");
    let read = requests[1].tool_results();
    assert_eq!(read.len(), 4, "{read:?}");
    assert!(read[0].starts_with("tool_not_declared: deploy is not a declared tool"), "{}", read[0]);
    assert!(read[0].contains("tool_search"), "the model is told what to do: {}", read[0]);
    assert!(read[1].starts_with("tool_not_declared: tool_call cannot be called through tool_call"), "{}", read[1]);
    assert!(read[2].starts_with("invalid_tool_input: "), "{}", read[2]);
    // A kernel target runs in-process: the model reads runners_list's own answer.
    assert!(read[3].contains("current_runner_executor_public_id"), "{}", read[3]);
    let mut words = Vec::new();
    for task_key in ["r1t0", "r1t1", "r1t2", "r1t3"] {
        words.push(bed.server.task(run, task_key).await.expect("row").error_key);
    }
    assert_eq!(
        words,
        [Some("tool_not_declared".into()), Some("tool_not_declared".into()), Some("invalid_tool_input".into()), None]
    );
    let served = bed.server.task(run, "r1t3").await.expect("row");
    assert_eq!((served.callable_name.as_str(), served.tool_name.as_str()), ("tool_call", "runners_list"));
}

#[tokio::test]
async fn a_runner_agent_skill_is_listed_and_loaded_by_name() {
    let bed = Bed::start().await;
    let dirs = tempfile::tempdir().expect("dirs");
    let skills = dirs.path().join("skills");
    std::fs::create_dir_all(skills.join("deploy-guide")).expect("skill dir");
    let content = "---\ndescription: How to ship the service safely\n---\n# Deploy\n1. Build.\n2. Ship.\n";
    std::fs::write(skills.join("deploy-guide/SKILL.md"), content).expect("skill file");
    let skills_dir = skills.to_str().expect("utf-8 path");
    let (runner, _child) = bed.runner_agent(dirs.path(), &["--skills-dir", skills_dir]).await;
    bed.declare(json!({
        "runner_executor_public_ids": [runner.id], "runner_tool_names": [], "default_model": "fake/m",
        "approval_mode": "bypass", "kernel_tools": ["nexus.skill.load"],
    }))
    .await;
    bed.fake.script(
        "m",
        [
            calls(&[("a", "skill", json!({"name": "deploy-guide"})), ("b", "skill", json!({"name": "nope"}))]),
            Act::Text("done".into()),
        ],
    );
    let run = bed.post_input("load the deploy guide").await;
    let row = bed.quiet(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let requests = bed.fake.requests_for("m");
    assert_eq!(requests.len(), 2);
    // The skills block, in the request the model read.
    let system = system_texts(&requests[0].body);
    assert!(
        system
            .iter()
            .any(|text| text.contains("Skills available now.\n- deploy-guide: How to ship the service safely")),
        "{system:?}"
    );
    assert_eq!(offered(&requests[0].body), ["skill"], "the runner's skill tool is never offered as its own");
    // The runner's document loads from the runner; an unknown name reads skill_unknown as data.
    assert_eq!(requests[1].tool_results(), [content.to_owned(), "skill_unknown: nope".to_owned()]);
    let loaded = bed.server.task(run, "r1t0").await.expect("row");
    assert_eq!((loaded.tool_name.as_str(), loaded.target_executor_public_id), ("skill", Some(runner.runner())));
    assert_eq!((loaded.status, loaded.claimed), (TaskStatus::Completed, true));
    let unknown = bed.server.task(run, "r1t1").await.expect("row");
    assert_eq!((unknown.status, unknown.target_executor_public_id), (TaskStatus::Completed, None));
    // The manifest lists the block with its count.
    let events = bed.server.store().events_after(run, 0, i64::MAX).await.expect("events");
    let manifest = events
        .iter()
        .filter(|e| e.event.event_type() == EventType::RoundStarted)
        .find_map(|e| match &e.event {
            Event::RoundStarted(started) => started.context.clone(),
            _ => None,
        })
        .expect("a manifest");
    let listed = manifest.documents.iter().find(|d| d.slot == "skills").expect("the skills block is listed");
    assert_eq!(listed.count, Some(1));
}
