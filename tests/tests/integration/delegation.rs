//! Delegation end to end (`docs/delegation.md`): `delegate_task`, `wait`, `join`, `spawn`,
//! `send`, `status`, `cancel`, with a local fake provider playing each model (one model name per
//! child, so every answer is scripted in order) and real runner-agents serving the children's
//! tools.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::store::children::ChildRow;
use nexus_proto::{ChildDisposition, ExecutionId, RunStatus, TaskKey, TaskStatus};
use nexus_tests::processes::RunnerAgentProcess;
use nexus_tests::{Act, FakeProvider, Http, Minted, TestServer, wait_until};

const WAIT: Duration = Duration::from_secs(60);

/// A server whose `fake/<model>` models are answered by `fake`, one Agent, and its HTTP client.
struct Bed {
    fake: FakeProvider,
    server: TestServer,
    http: Http,
    token: String,
}

impl Bed {
    async fn start() -> Bed {
        let fake = FakeProvider::start().await;
        let server = TestServer::start_with_fake(&fake).await;
        let agent = server.agent("agent").await;
        let http = Http::new(&server.url(), Some(&agent.token));
        Bed { fake, server, http, token: agent.token }
    }

    /// The same server restarted on its store (a new port).
    async fn restart(self) -> Bed {
        let Bed { fake, server, token, .. } = self;
        let server = server.restart(&[]).await;
        let http = Http::new(&server.url(), Some(&token));
        Bed { fake, server, http, token }
    }

    /// A real runner-agent for a fresh runner named `name`, announced before this answers.
    async fn runner_agent(&self, dirs: &Path, name: &str) -> (Minted, tokio::process::Child) {
        let runner = self.server.runner(name).await;
        let (workdir, state_dir) = (dirs.join(name).join("work"), dirs.join(name).join("state"));
        std::fs::create_dir_all(&workdir).expect("workdir");
        let (child, _log) = RunnerAgentProcess {
            nexus_url: self.server.url(),
            runner: runner.clone(),
            token_file: dirs.join(format!("{name}.token")),
            workdir,
            state_dir,
            tool_timeout_ms: 120_000,
        }
        .spawn_announced(&self.server, &[])
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

    /// The children of `run`, in the order of the keys of the calls that started them.
    async fn children(&self, run: ExecutionId) -> Vec<ChildRow> {
        let mut children = self.server.store().children_of(run).await.expect("children");
        children.sort_by_key(|c| c.task_key);
        children
    }

    /// The children of `run` once each has ended.
    async fn children_ended(&self, run: ExecutionId, count: usize) -> Vec<ChildRow> {
        wait_until("every child ends", WAIT, || async {
            let children = self.children(run).await;
            (children.len() == count && children.iter().all(ChildRow::ended)).then_some(children)
        })
        .await
    }
}

fn calls(calls: &[(&str, &str, Value)]) -> Act {
    Act::ToolCalls(
        calls.iter().map(|(id, name, input)| ((*id).to_owned(), (*name).to_owned(), input.clone())).collect(),
    )
}

fn delegation_tools() -> Value {
    json!(["nexus.graph.delegate_task", "nexus.graph.wait", "nexus.graph.join"])
}

#[tokio::test]
async fn a_background_child_is_waited_for_and_an_inline_one_answers_its_call() {
    let bed = Bed::start().await;
    bed.declare(json!({"default_model": "fake/p", "approval_mode": "bypass", "kernel_tools": delegation_tools()}))
        .await;
    bed.fake.script(
        "p",
        [
            calls(&[("d", "delegate_task", json!({"prompt": "count the apples", "model": "fake/c1"}))]),
            calls(&[("w", "wait", json!({"task": "r1t0"}))]),
            calls(&[("i", "delegate_task", json!({"prompt": "count the pears", "model": "fake/c2", "wait": true}))]),
            Act::EchoLastToolResult,
        ],
    );
    bed.fake.script("c1", [Act::Text("seven apples".into())]);
    bed.fake.script("c2", [Act::Text("three pears".into())]);
    let run = bed.post_input("count the fruit").await;
    let row = bed.quiet(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert_eq!(row.final_text.as_deref(), Some("tool said: three pears"));
    let requests = bed.fake.requests_for("p");
    // The background call answered at once with its key; the wait read the child's answer.
    assert!(
        requests[1].tool_results()[0].contains("Task r1t0 started in the background"),
        "{:?}",
        requests[1].tool_results()
    );
    assert_eq!(requests[2].tool_results().last().map(String::as_str), Some("seven apples"));
    // The child started with an empty context: its only user message is the prompt.
    let child_request = &bed.fake.requests_for("c1")[0].body;
    let users: Vec<&Value> =
        child_request["messages"].as_array().expect("messages").iter().filter(|m| m["role"] == "user").collect();
    assert_eq!(users.len(), 1, "{child_request}");
    assert_eq!(users[0]["content"], "count the apples");
    let children = bed.children_ended(run, 2).await;
    // The wait consumed it, or (it ended before the wait was called) the boundary before did.
    let early = format!("execution:{run}");
    assert!(
        [Some("task:r2t0"), Some(early.as_str())].contains(&children[0].consumed_by.as_deref()),
        "{:?}",
        children[0]
    );
    assert_eq!(children[1].consumed_by.as_deref(), Some("task:r3t0"), "the inline call consumed it");
    assert!(
        children
            .iter()
            .all(|c| c.status == RunStatus::Completed && c.parent_conversation_public_id == row.conversation_public_id)
    );
}

#[tokio::test]
async fn a_result_after_the_turn_starts_a_turn_and_is_read_once() {
    let bed = Bed::start().await;
    bed.declare(json!({"default_model": "fake/p", "approval_mode": "bypass", "kernel_tools": delegation_tools()}))
        .await;
    // The parent answers before the child can: the child's model has no answer until the test
    // gives it one.
    bed.fake.script(
        "p",
        [
            calls(&[("d", "delegate_task", json!({"prompt": "look it up", "model": "fake/slow"}))]),
            Act::Text("I asked a helper".into()),
            Act::Text("the helper said so".into()),
        ],
    );
    let run = bed.post_input("find out").await;
    let row = bed.quiet(run).await;
    assert_eq!(row.final_text.as_deref(), Some("I asked a helper"));
    // The end's dispositions are recorded right after the save that ended the turn.
    let child = wait_until("the end disposes of the child", WAIT, || async {
        bed.children(run).await.into_iter().next().filter(|c| c.disposition.is_some())
    })
    .await;
    assert_eq!(child.disposition, Some(ChildDisposition::Detached), "a conversation-lifetime child outlives the turn");
    assert_eq!(child.owner.as_deref(), Some(format!("conversation:{}", row.conversation_public_id).as_str()));
    // Unscripted, the child's first request is refused (400): it halts and waits for a person,
    // still live, so the turn's end detached it.
    wait_until("the child halts", WAIT, || async {
        let row = bed.server.store().execution(child.child_execution_public_id).await.ok().flatten()?;
        (row.status == RunStatus::NeedsAttention).then_some(())
    })
    .await;
    assert_eq!(bed.fake.count("slow"), 1, "asked once");
    // Stop it: its (canceled) result is mail, and wakes the parent's conversation.
    let stopped =
        bed.http.post(&format!("/agent_api/v1/executions/{}/stop", child.child_execution_public_id), &json!({})).await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    let mail = wait_until("the mail turn ends", WAIT, || async {
        let line = bed.server.store().latest_execution_of(row.conversation_public_id).await.ok().flatten()?;
        (line.public_id != run && line.status.is_terminal()).then_some(line)
    })
    .await;
    assert_eq!(mail.final_text.as_deref(), Some("the helper said so"), "{mail:?}");
    let requests = bed.fake.requests_for("p");
    assert_eq!(requests.len(), 3);
    let last_user = requests[2].body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .cloned()
        .expect("user");
    let text = last_user["content"].as_str().expect("text");
    assert!(text.starts_with("<task_result task=\"r1t0\" status=\"canceled\">"), "{text}");
    assert!(text.contains("<prompt>look it up</prompt>"), "{text}");
    let child = bed.children(run).await.remove(0);
    assert_eq!(child.consumed_by.as_deref().map(|s| s.starts_with("input:")), Some(true), "{child:?}");
}

/// The `join` task's structured result, once it settled.
async fn join_result(bed: &Bed, run: ExecutionId, key: &str) -> (TaskStatus, Value) {
    let task = wait_until("the join settles", WAIT, || async {
        bed.server.task(run, key).await.filter(nexus_actors::store::TaskRow::is_settled)
    })
    .await;
    let result = task.result.clone().unwrap_or_default();
    (task.status, result["structured_content"].clone())
}

fn statuses(result: &Value) -> Vec<String> {
    result["tasks"].as_array().into_iter().flatten().map(|t| t["status"].as_str().unwrap_or("?").to_owned()).collect()
}

/// Issue 14's acceptance: a parent spawns three children onto three runners (each child's own
/// selection, so each reaches only its runner) and joins them under each policy.
#[tokio::test]
async fn each_join_policy_over_three_children_on_three_runners() {
    let bed = Bed::start().await;
    let dirs = tempfile::tempdir().expect("dirs");
    let (w1, _a) = bed.runner_agent(dirs.path(), "w1").await;
    let (w2, _b) = bed.runner_agent(dirs.path(), "w2").await;
    let (w3, _c) = bed.runner_agent(dirs.path(), "w3").await;
    let runners = [&w1, &w2, &w3];
    bed.declare(json!({
        "default_model": "fake/p", "approval_mode": "bypass",
        "runner_executor_public_ids": [w1.id, w2.id, w3.id],
        "kernel_tools": ["nexus.conversation.spawn", "nexus.graph.join"],
    }))
    .await;
    // One conversation per policy; child i of policy P runs on model P-i and on runner i.
    let plans: [(&str, Value, [&str; 3]); 3] = [
        ("all_required", json!({}), ["echo one", "echo two", "echo three"]),
        ("first_success", json!({}), ["echo fast", "sleep 120", "sleep 120"]),
        ("best_effort", json!({"min_successes": 2}), ["echo one", "echo two", "sleep 120"]),
    ];
    for (policy, extra, commands) in plans {
        let spawns: Vec<(String, String, Value)> = (0..3)
            .map(|i| {
                (
                    format!("s{i}"),
                    "spawn".to_owned(),
                    json!({"prompt": format!("part {i}"), "label": format!("part-{i}"), "model": format!("fake/{policy}-{i}"),
                           "default_runner_executor_public_id": runners[i].id}),
                )
            })
            .collect();
        let mut join = json!({"tasks": ["r1t0", "r1t1", "r1t2"], "policy": policy});
        for (key, value) in extra.as_object().expect("object") {
            join[key] = value.clone();
        }
        bed.fake.script("p", [Act::ToolCalls(spawns), calls(&[("j", "join", join)]), Act::EchoLastToolResult]);
        for (i, command) in commands.iter().enumerate() {
            bed.fake.script(
                &format!("{policy}-{i}"),
                [calls(&[("b", "bash", json!({"command": command}))]), Act::EchoLastToolResult],
            );
        }
        let run = bed.post_input(&format!("split the work ({policy})")).await;
        let (status, result) = join_result(&bed, run, "r2t0").await;
        let row = bed.quiet(run).await;
        assert_eq!(row.status, RunStatus::Completed, "{policy}: {row:?}");
        let children = bed.children(run).await;
        assert_eq!(children.len(), 3, "{policy}");
        // Each child ran on its own runner only.
        for (i, child) in children.iter().enumerate() {
            let tasks = bed.server.store().tasks_of(child.child_execution_public_id).await.expect("tasks");
            assert!(
                tasks.iter().all(|t| t.target_executor_public_id == Some(runners[i].runner())),
                "{policy} child {i}: {tasks:?}"
            );
        }
        match policy {
            "all_required" => {
                assert_eq!(status, TaskStatus::Completed, "{result}");
                assert_eq!(statuses(&result), ["completed", "completed", "completed"], "{result}");
                assert!(result["tasks"][1]["result"].as_str().is_some_and(|r| r.contains("two")), "{result}");
            }
            "first_success" => {
                assert_eq!(status, TaskStatus::Completed, "{result}");
                assert_eq!(result["selection"], "r1t0", "{result}");
                assert_eq!(statuses(&result), ["completed", "canceled", "canceled"], "{result}");
                for loser in &children[1..] {
                    assert_eq!(loser.disposition, Some(ChildDisposition::Canceled), "{loser:?}");
                }
                let ended = bed.children_ended(run, 3).await;
                assert!(ended[1..].iter().all(|c| c.status == RunStatus::Canceled), "{ended:?}");
            }
            _ => {
                assert_eq!(status, TaskStatus::Completed, "{result}");
                assert_eq!(statuses(&result), ["completed", "completed", "canceled"], "{result}");
                bed.children_ended(run, 3).await;
            }
        }
        // Every child's result was consumed once: by the join, or (a child that ended before the
        // join call existed) read at the parent's next boundary, then once only.
        let ended = bed.children_ended(run, 3).await;
        let early = format!("execution:{run}");
        for child in &ended {
            let by = child.consumed_by.as_deref();
            assert!(by == Some("task:r2t0") || by == Some(early.as_str()), "{policy}: {child:?}");
        }
        let request = bed.fake.requests_for("p").pop().expect("the parent's last request");
        let envelopes = request.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["content"].as_str().is_some_and(|t| t.starts_with("<task_result ")))
            .count();
        let read_early = ended.iter().filter(|c| c.consumed_by.as_deref() == Some(early.as_str())).count();
        assert_eq!(envelopes, read_early, "{policy}: each result read early is in the transcript once");
        // The parent read the join's result.
        assert!(row.final_text.as_deref().is_some_and(|t| t.contains(policy)), "{row:?}");
    }
}

/// A restart while a join waits: the join resumes from the store and ends as it would have; each
/// child's result is consumed once, and no model is asked twice.
#[tokio::test]
async fn a_join_survives_a_restart_and_ends_as_it_would_have() {
    let bed = Bed::start().await;
    bed.declare(json!({"default_model": "fake/p", "approval_mode": "bypass",
        "kernel_tools": ["nexus.graph.delegate_task", "nexus.graph.join", "nexus.human.ask"]}))
        .await;
    let delegates: Vec<(String, String, Value)> = (0..3)
        .map(|i| {
            (
                format!("d{i}"),
                "delegate_task".to_owned(),
                json!({"prompt": format!("part {i}"), "model": format!("fake/c{i}")}),
            )
        })
        .collect();
    bed.fake.script(
        "p",
        [
            Act::ToolCalls(delegates),
            calls(&[("j", "join", json!({"tasks": ["r1t0", "r1t1", "r1t2"], "policy": "first_success"}))]),
            Act::EchoLastToolResult,
        ],
    );
    for i in 0..3 {
        bed.fake.script(
            &format!("c{i}"),
            [calls(&[("q", "ask", json!({"prompt": format!("go on with {i}?")}))]), Act::EchoLastToolResult],
        );
    }
    let run = bed.post_input("three parts, the first that finishes wins").await;
    bed.server.task_in(run, "r2t0", TaskStatus::Running).await;
    let children = bed.children(run).await;
    for child in &children {
        bed.server.task_in(child.child_execution_public_id, "r1t0", TaskStatus::AwaitingInput).await;
    }
    let bed = bed.restart().await;
    // The second child answers first: it is the selection; the others are canceled.
    let answered = bed
        .http
        .post(
            &format!("/agent_api/v1/executions/{}/tasks/r1t0/answer", children[1].child_execution_public_id),
            &json!({"answer": "yes"}),
        )
        .await;
    assert_eq!(answered.status, 200, "{answered:?}");
    let (status, result) = join_result(&bed, run, "r2t0").await;
    assert_eq!(status, TaskStatus::Completed, "{result}");
    assert_eq!(result["selection"], "r1t1", "{result}");
    assert_eq!(statuses(&result), ["canceled", "completed", "canceled"], "{result}");
    let row = bed.quiet(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let ended = bed.children_ended(run, 3).await;
    assert!(ended.iter().all(|c| c.consumed_by.as_deref() == Some("task:r2t0")), "{ended:?}");
    assert_eq!(
        [bed.fake.count("c0"), bed.fake.count("c1"), bed.fake.count("c2")],
        [1, 2, 1],
        "no model was asked twice"
    );
    assert_eq!(bed.fake.count("p"), 3);
}

/// R49–R52 and the conversation tools: `spawn` from catalog entries runs on the model R51 says
/// (the caller's actual model for `caller`, the leaf's for `default`, an explicit one over both),
/// refuses what the catalog rules refuse, and `send`, `status` and `cancel` address the children
/// by label; the children door lists them and each child shows its parent.
#[tokio::test]
async fn spawn_follows_the_catalog_and_send_status_cancel_address_the_children() {
    let bed = Bed::start().await;
    // A runner the Agent may use, which the parent does not declare.
    let outside = bed.server.runner("outside").await;
    bed.declare(json!({
        "default_model": "fake/p", "approval_mode": "bypass",
        "kernel_tools": ["nexus.conversation.spawn", "nexus.conversation.send", "nexus.conversation.status", "nexus.conversation.cancel"],
        "delegation_catalog": [
            {"name": "researcher", "description": "Digs things up.", "model_mode": "caller",
             "declaration": {"default_model": "fake/leafr", "approval_mode": "bypass"}},
            {"name": "writer", "description": "Writes them down.", "model_mode": "default",
             "declaration": {"default_model": "fake/leafw", "approval_mode": "bypass"}},
            {"name": "outsider", "description": "Works elsewhere.", "model_mode": "default",
             "declaration": {"default_model": "fake/leafo", "approval_mode": "bypass", "runner_executor_public_ids": [outside.id]}},
        ],
    }))
    .await;
    bed.fake.script(
        "p",
        [
            calls(&[("a", "spawn", json!({"prompt": "research it", "declaration": "researcher", "label": "res", "wait": true}))]),
            // The researcher runs on the caller's model: this is its answer.
            Act::Text("found it".into()),
            calls(&[("b", "spawn", json!({"prompt": "write it", "declaration": "writer", "label": "wri", "wait": true}))]),
            calls(&[
                ("c", "spawn", json!({"prompt": "x", "agent": "@someone"})),
                ("d", "spawn", json!({"prompt": "x", "declaration": "nope"})),
                ("e", "spawn", json!({"prompt": "y", "declaration": "writer", "model": "fake/explicit", "wake": "passive", "label": "exp"})),
                ("f", "spawn", json!({"prompt": "z", "declaration": "writer", "model": "fake/never", "label": "stuck"})),
                ("g", "spawn", json!({"prompt": "again", "declaration": "writer", "label": "res"})),
                ("o", "spawn", json!({"prompt": "elsewhere", "declaration": "outsider"})),
            ]),
            calls(&[
                ("h", "send", json!({"to": "wri", "message": "and again"})),
                ("i", "status", json!({"to": "res"})),
                ("j", "cancel", json!({"to": "stuck"})),
                ("k", "status", json!({"to": "nobody"})),
            ]),
            Act::Text("done".into()),
        ],
    );
    bed.fake.script("leafw", [Act::Text("written".into()), Act::Text("written again".into())]);
    bed.fake.script("explicit", [Act::Text("explicit".into())]);
    let run = bed.post_input("research and write").await;
    let row = bed.quiet(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let requests = bed.fake.requests_for("p");
    assert_eq!(requests.len(), 6, "five parent rounds and the researcher's one");
    let researcher_users: Vec<&Value> =
        requests[1].body["messages"].as_array().expect("messages").iter().filter(|m| m["role"] == "user").collect();
    assert_eq!(
        researcher_users.last().map(|m| m["content"].clone()),
        Some(json!("research it")),
        "caller mode: the caller's model"
    );
    assert_eq!(requests[2].tool_results().last().map(String::as_str), Some("found it"));
    assert_eq!(
        requests[3].tool_results().last().map(String::as_str),
        Some("written"),
        "default mode: the leaf's model"
    );
    let refused = requests[4].tool_results();
    let round3 = &refused[refused.len() - 6..];
    assert!(round3[0].contains("names a catalog entry with declaration instead of an agent"), "{}", round3[0]);
    assert!(round3[1].contains("nope is not a delegation_catalog entry"), "{}", round3[1]);
    assert!(round3[2].contains("started in the background"), "{}", round3[2]);
    assert!(round3[3].contains("started in the background"), "{}", round3[3]);
    assert!(round3[4].contains("label res already names a child"), "{}", round3[4]);
    // R33: a child never reaches a runner its parent lacks.
    assert!(
        round3[5].starts_with("runner_not_declared") && round3[5].contains(&outside.id.to_string()),
        "{}",
        round3[5]
    );
    assert_eq!(bed.fake.count("leafo"), 0);
    let last = bed.fake.requests_for("p").pop().expect("last").tool_results();
    let round4 = &last[last.len() - 4..];
    assert!(round4[0].contains("\"delivered\":\"queued\""), "{}", round4[0]);
    assert!(round4[1].contains("\"status\":\"completed\"") && round4[1].contains("found it"), "{}", round4[1]);
    assert!(round4[2].contains("\"canceled\":true"), "{}", round4[2]);
    assert!(round4[3].starts_with("unknown_conversation"), "{}", round4[3]);
    // The sent message is a second turn of the writer's conversation, under its own declaration.
    wait_until("the writer answers the message", WAIT, || async { (bed.fake.count("leafw") == 2).then_some(()) }).await;
    wait_until("the explicit child answers", WAIT, || async { (bed.fake.count("explicit") == 1).then_some(()) }).await;
    assert_eq!(bed.fake.count("leafr"), 0, "caller mode never asks the leaf's model");
    // The children door lists the four children; each child shows its parent.
    let listed = bed.http.get(&format!("/agent_api/v1/executions/{run}/children")).await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let children = listed.body["children"].as_array().cloned().expect("children");
    let labels: Vec<&str> = children.iter().filter_map(|c| c["label"].as_str()).collect();
    assert_eq!(labels.len(), 4, "{children:?}");
    for label in ["res", "wri", "exp", "stuck"] {
        assert!(labels.contains(&label), "{label}: {labels:?}");
    }
    let stuck = children.iter().find(|c| c["label"] == "stuck").expect("stuck");
    assert_eq!(stuck["disposition"], "canceled", "{stuck}");
    let child_id = children[0]["execution_public_id"].as_str().expect("id");
    let child = bed.http.get(&format!("/agent_api/v1/executions/{child_id}")).await;
    assert_eq!(child.body["parent"]["execution_public_id"], json!(run), "{:?}", child.body);
    assert_eq!(child.body["parent"]["task_key"], children[0]["task_key"]);
    let top = bed.http.get(&format!("/agent_api/v1/executions/{run}")).await;
    assert_eq!(top.body["parent"], Value::Null);
    // The gRPC twin lists the same children; another Agent learns nothing.
    let mut client = nexus_tests::agent_client(&bed.server).await;
    // Only the token reaches the wire.
    let agent = Minted { id: uuid::Uuid::nil(), token: bed.token.clone() };
    let request = nexus_proto::agent::v1::GetExecutionRequest {
        execution_public_id: run.to_string(),
        tasks_after: String::new(),
    };
    let twin = client.list_children(nexus_tests::authed(request.clone(), &agent)).await.expect("listed").into_inner();
    let twin: Value = serde_json::from_str(&twin.body_json).expect("json");
    let keys = |body: &Value| -> Vec<Value> {
        body["children"].as_array().into_iter().flatten().map(|c| c["task_key"].clone()).collect()
    };
    assert_eq!(keys(&twin), keys(&listed.body));
    let stranger = bed.server.agent("stranger").await;
    let hidden = Http::new(&bed.server.url(), Some(&stranger.token))
        .get(&format!("/agent_api/v1/executions/{run}/children"))
        .await;
    assert_eq!(hidden.status, 404, "{hidden:?}");
    let refused = client.list_children(nexus_tests::authed(request, &stranger)).await.expect_err("hidden");
    assert_eq!(refused.code(), tonic::Code::NotFound);
}

/// Budgets over children (R75): a child's allocation is reserved before its call is dispatched,
/// a child that does not fit is refused with `budget_exhausted` and never started, and the
/// children's allocations never add up past the parent's remainder.
#[tokio::test]
async fn a_budget_refuses_a_child_and_allocations_never_exceed_it() {
    let bed = Bed::start().await;
    bed.declare(json!({"default_model": "fake/p", "approval_mode": "bypass", "kernel_tools": delegation_tools()}))
        .await;
    bed.fake.script(
        "p",
        [
            Act::ToolCalls(
                (0..3)
                    .map(|i| {
                        (
                            format!("d{i}"),
                            "delegate_task".to_owned(),
                            json!({"prompt": format!("part {i}"), "model": format!("fake/b{i}"), "wait": true}),
                        )
                    })
                    .collect(),
            ),
            Act::Text("done".into()),
        ],
    );
    for i in 0..3 {
        bed.fake.script(&format!("b{i}"), [Act::Text(format!("part {i} done"))]);
    }
    let admitted = bed
        .http
        .post(
            "/agent_api/v1/inputs",
            &json!({"text": "three parts", "budget": {"max_model_tokens": 200000, "max_children": 2}}),
        )
        .await;
    assert_eq!(admitted.status, 201, "{admitted:?}");
    let run: ExecutionId = admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    let row = bed.quiet(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let refused = bed.server.task(run, "r1t2").await.expect("third call");
    assert_eq!(
        (refused.status, refused.error_key.as_deref()),
        (TaskStatus::Failed, Some("budget_exhausted")),
        "{refused:?}"
    );
    assert_eq!(bed.fake.count("b2"), 0, "the refused child was never started");
    let children = bed.children_ended(run, 2).await;
    let allocated: u64 = children
        .iter()
        .map(|c| c.budget.as_ref().and_then(|b| b.limits.max_model_tokens).expect("each child has an allocation"))
        .sum();
    assert!(allocated <= 200_000, "the children's allocations fit the parent's budget: {allocated}");
    let view = bed.http.get(&format!("/agent_api/v1/executions/{run}")).await.body["budget"].clone();
    assert_eq!(view["used"]["children"], 2, "{view}");
    assert_eq!(view["reserved"]["children"], 0, "every allocation was settled: {view}");
    let used = view["used"]["model_tokens"].as_u64().expect("used tokens");
    assert!(used <= 200_000, "{view}");
    // What the children spent is counted in the parent's usage.
    let spent: u64 = children.iter().map(|c| c.budget.as_ref().map_or(0, |b| b.spent().model_tokens)).sum();
    assert!(used >= spent && spent > 0, "used {used}, children spent {spent}");
}

/// R37: a `subtree` reach covers the current conversation and its descendants, the child
/// conversations delegation started, and nothing else of the Agent's.
#[tokio::test]
async fn a_subtree_reach_covers_the_children_and_nothing_beside() {
    let bed = Bed::start().await;
    bed.declare(json!({"default_model": "fake/p", "approval_mode": "bypass", "conversation_reach": "subtree",
        "kernel_tools": ["nexus.graph.delegate_task", "nexus.conversation.search"]}))
        .await;
    // Another conversation of the Agent says the word too.
    bed.fake.script("p", [Act::Text("noted".into())]);
    let beside = bed.post_input("the word is plum, beside").await;
    bed.quiet(beside).await;
    bed.fake.script(
        "p",
        [
            calls(&[(
                "d",
                "delegate_task",
                json!({"prompt": "the word is plum, below", "model": "fake/k", "wait": true}),
            )]),
            calls(&[("s", "session_search", json!({"query": "plum"}))]),
            Act::EchoLastToolResult,
        ],
    );
    bed.fake.script("k", [Act::Text("ok".into())]);
    let run = bed.post_input("find the word").await;
    let row = bed.quiet(run).await;
    let child = bed.children(run).await.remove(0);
    let found = row.final_text.unwrap_or_default();
    assert!(
        found.contains(&child.child_conversation_public_id.to_string()),
        "the child's conversation is reached: {found}"
    );
    assert!(found.contains("below"), "{found}");
    assert!(!found.contains("beside"), "a conversation outside the subtree is not: {found}");
}

/// README's worked example, as written (budget included): `scripted/lead` delegates three counts
/// to `scripted/helper` children that run `bash` on the runner, and joins them `all_required`.
#[tokio::test]
async fn the_readme_example_delegates_and_joins() {
    let read = |name: &str| -> Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples").join(name);
        serde_json::from_str(&std::fs::read_to_string(path).expect("example script")).expect("json")
    };
    let server = TestServer::start(&[("lead", read("lead.json")), ("helper", read("helper.json"))]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    let dirs = tempfile::tempdir().expect("dirs");
    let runner = server.runner("worker-1").await;
    let workdir = dirs.path().join("work");
    std::fs::create_dir_all(workdir.join("src")).expect("workdir");
    std::fs::write(workdir.join("src/a.rs"), "").expect("file");
    let (_child, _log) = RunnerAgentProcess {
        nexus_url: server.url(),
        runner: runner.clone(),
        token_file: dirs.path().join("token"),
        workdir,
        state_dir: dirs.path().join("state"),
        tool_timeout_ms: 60_000,
    }
    .spawn_logged(&[]);
    wait_until("the runner announces its tools", WAIT, || async {
        server.store().executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
    })
    .await;
    let declared = http
        .declare(&json!({"configuration": {"runner_executor_public_ids": [runner.id], "approval_mode": "bypass",
            "default_model": "scripted/lead", "kernel_tools": ["nexus.graph.delegate_task", "nexus.graph.join"]}}))
        .await;
    assert_eq!(declared.status, 200, "{declared:?}");
    let admitted = http
        .post(
            "/agent_api/v1/inputs",
            &json!({"text": "How many Rust files are there?", "budget": {"max_children": 3, "max_tool_calls": 50}}),
        )
        .await;
    let run: ExecutionId = admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    let row = server.settled(run, WAIT).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let text = row.final_text.unwrap_or_default();
    assert!(text.starts_with("The three helpers reported: "), "{text}");
    assert!(
        text.contains("\"outcome\":\"completed\"") && text.contains("1 files (Count the Rust files under"),
        "{text}"
    );
    let children = http.get(&format!("/agent_api/v1/executions/{run}/children")).await;
    assert_eq!(children.body["children"].as_array().map(Vec::len), Some(3), "{:?}", children.body);
    assert_eq!(children.body["joins"][0]["policy"], "all_required");
    let allocations: Vec<u64> = children.body["children"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["budget"]["limits"]["max_tool_calls"].as_u64())
        .collect();
    assert_eq!(allocations.len(), 3, "each child ran on an allocation: {:?}", children.body);
    let budget = http.get(&format!("/agent_api/v1/executions/{run}")).await.body["budget"].clone();
    assert_eq!(budget["used"]["children"], 3, "{budget}");
    assert!(budget["used"]["tool_calls"].as_u64().is_some_and(|n| n <= 50), "{budget}");
}

/// `wake: passive`: a result that arrives after the turn starts nothing; the conversation's next
/// turn reads it first, before its own input, and consumes it.
#[tokio::test]
async fn a_passive_result_waits_for_the_next_turn() {
    let bed = Bed::start().await;
    bed.declare(json!({"default_model": "fake/p", "approval_mode": "bypass", "kernel_tools": delegation_tools()}))
        .await;
    bed.fake.script(
        "p",
        [
            calls(&[("d", "delegate_task", json!({"prompt": "think slowly", "model": "fake/q", "wake": "passive"}))]),
            Act::Text("later".into()),
        ],
    );
    let run = bed.post_input("start it").await;
    let row = bed.quiet(run).await;
    let child = bed.children(run).await.remove(0);
    // The child halts (its model was never scripted); stopping it ends it.
    wait_until("the child asks", WAIT, || async { (bed.fake.count("q") >= 1).then_some(()) }).await;
    let stopped =
        bed.http.post(&format!("/agent_api/v1/executions/{}/stop", child.child_execution_public_id), &json!({})).await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    bed.children_ended(run, 1).await;
    // Nothing started: the conversation's only execution is the first turn.
    let latest = bed.server.store().latest_execution_of(row.conversation_public_id).await.expect("read").expect("one");
    assert_eq!(latest.public_id, run, "a passive result starts no turn");
    bed.fake.script("p", [Act::Text("read it".into())]);
    let next = bed
        .http
        .post(
            "/agent_api/v1/inputs",
            // A turn under a declaration without delegation tools reads it too.
            &json!({"text": "and now?", "conversation_public_id": row.conversation_public_id,
                "execution_declaration": {"default_model": "fake/p", "approval_mode": "bypass"}}),
        )
        .await;
    assert_eq!(next.status, 201, "{next:?}");
    let second: ExecutionId = next.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    bed.quiet(second).await;
    let request = bed.fake.requests_for("p").pop().expect("the second turn's request");
    let users: Vec<String> = request.body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect();
    let n = users.len();
    assert!(users[n - 2].starts_with("<task_result task=\"r1t0\" status=\"canceled\">"), "{users:?}");
    assert_eq!(users[n - 1], "and now?");
    let child = bed.children(run).await.remove(0);
    assert_eq!(child.consumed_by, Some(format!("execution:{second}")));
}

/// `send` with `deliver_in` holds the message durably until its time (`docs/executions.md`,
/// "Scheduled inputs"), across a restart.
#[tokio::test]
async fn a_scheduled_send_is_held_until_its_time_across_a_restart() {
    let bed = Bed::start().await;
    bed.declare(json!({"default_model": "fake/p", "approval_mode": "bypass",
        "kernel_tools": ["nexus.conversation.spawn", "nexus.conversation.send"]}))
        .await;
    bed.fake.script(
        "p",
        [
            calls(&[("s", "spawn", json!({"prompt": "stand by", "label": "later", "model": "fake/w", "wait": true}))]),
            calls(&[("m", "send", json!({"to": "later", "message": "now go", "deliver_in": "20m"}))]),
            Act::Text("scheduled".into()),
        ],
    );
    bed.fake.script("w", [Act::Text("standing by".into()), Act::Text("going".into())]);
    let run = bed.post_input("schedule it").await;
    let row = bed.quiet(run).await;
    assert_eq!(row.final_text.as_deref(), Some("scheduled"));
    let sent = bed.fake.requests_for("p").pop().expect("last").tool_results().pop().expect("result");
    assert!(sent.contains("\"delivered\":\"scheduled\""), "{sent}");
    assert_eq!(bed.fake.count("w"), 1, "held: the child was not asked again");
    let bed = bed.restart().await;
    bed.server.clock().advance(Duration::from_secs(19 * 60));
    assert_eq!(bed.fake.count("w"), 1, "still held before its time");
    bed.server.clock().advance(Duration::from_secs(2 * 60));
    wait_until("the held message is delivered once", WAIT, || async { (bed.fake.count("w") == 2).then_some(()) }).await;
    let child = bed.children(run).await.remove(0);
    let latest = wait_until("the child's second turn ends", WAIT, || async {
        let latest = bed.server.store().latest_execution_of(child.child_conversation_public_id).await.ok().flatten()?;
        (latest.public_id != child.child_execution_public_id && latest.status.is_terminal()).then_some(latest)
    })
    .await;
    assert_eq!(latest.final_text.as_deref(), Some("going"));
}

/// nexus's guard against runaway recursion: a child nested 16 levels deep may not start another;
/// the refusal is a call error envelope and the tree unwinds normally.
#[tokio::test]
async fn nesting_stops_at_the_delegation_depth() {
    const DEPTH: usize = 16;
    let bed = Bed::start().await;
    bed.declare(json!({"default_model": "fake/p", "approval_mode": "bypass", "kernel_tools": delegation_tools()}))
        .await;
    let deeper = || calls(&[("d", "delegate_task", json!({"prompt": "go deeper", "model": "fake/r", "wait": true}))]);
    bed.fake.script("p", [deeper(), Act::EchoLastToolResult]);
    bed.fake.script("r", (0..DEPTH).map(|_| deeper()).chain((0..DEPTH).map(|_| Act::EchoLastToolResult)));
    let run = bed.post_input("recurse").await;
    let row = bed.quiet(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let text = row.final_text.unwrap_or_default();
    assert!(text.contains("delegation bound: this run is nested 16 levels deep"), "{text}");
    assert_eq!(bed.fake.count("r"), 2 * DEPTH, "sixteen levels of children, each asked twice");
}

/// A budgeted turn's mail turn draws on what the turn left (a child's share), not on nothing.
#[tokio::test]
async fn a_mail_turn_of_a_budgeted_turn_keeps_a_budget() {
    let bed = Bed::start().await;
    bed.declare(json!({"default_model": "fake/p", "approval_mode": "bypass", "kernel_tools": delegation_tools()}))
        .await;
    bed.fake.script(
        "p",
        [
            calls(&[("d", "delegate_task", json!({"prompt": "take your time", "model": "fake/slow2"}))]),
            Act::Text("asked".into()),
            Act::Text("read the result".into()),
        ],
    );
    let admitted = bed
        .http
        .post("/agent_api/v1/inputs", &json!({"text": "go", "budget": {"max_tool_calls": 40, "max_children": 4}}))
        .await;
    let run: ExecutionId = admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    let row = bed.quiet(run).await;
    let child = bed.children(run).await.remove(0);
    wait_until("the child asks", WAIT, || async { (bed.fake.count("slow2") >= 1).then_some(()) }).await;
    let stopped =
        bed.http.post(&format!("/agent_api/v1/executions/{}/stop", child.child_execution_public_id), &json!({})).await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    let mail = wait_until("the mail turn ends", WAIT, || async {
        let line = bed.server.store().latest_execution_of(row.conversation_public_id).await.ok().flatten()?;
        (line.public_id != run && line.status.is_terminal()).then_some(line)
    })
    .await;
    let mail = bed.server.store().execution(mail.public_id).await.expect("store").expect("the mail turn");
    let ledger = mail.budget.expect("the mail turn has a budget");
    let calls_allowed = ledger.limits.max_tool_calls.expect("a tool-call limit");
    assert!(calls_allowed > 0 && calls_allowed < 40, "a share of what the turn left: {ledger:?}");
}

/// A loser recorded canceled whose stop never landed (the node died between the join's record
/// and the child's cancellation) is stopped by recovery: a canceled child never runs on. The
/// crash's durable state is made directly: the child's row says `canceled` while the child still
/// waits on its `ask`.
#[tokio::test]
async fn a_child_recorded_canceled_is_stopped_after_a_restart() {
    let bed = Bed::start().await;
    bed.declare(json!({"default_model": "fake/p", "approval_mode": "bypass",
        "kernel_tools": ["nexus.graph.delegate_task", "nexus.human.ask"]}))
        .await;
    bed.fake.script(
        "p",
        [
            calls(&[("d", "delegate_task", json!({"prompt": "wait for a person", "model": "fake/loser"}))]),
            calls(&[("q", "ask", json!({"prompt": "parent waits"}))]),
        ],
    );
    bed.fake.script("loser", [calls(&[("q", "ask", json!({"prompt": "child waits"}))])]);
    let run = bed.post_input("start a child that loses").await;
    bed.server.task_in(run, "r2t0", TaskStatus::AwaitingInput).await;
    let child = bed.children(run).await.remove(0);
    bed.server.task_in(child.child_execution_public_id, "r1t0", TaskStatus::AwaitingInput).await;
    let key: TaskKey = "r1t0".parse().expect("key");
    let recorded = bed
        .server
        .store()
        .dispose_child(run, key, ChildDisposition::Canceled, None, Some("task:r2t0".into()))
        .await
        .expect("dispose");
    assert!(recorded);
    let bed = bed.restart().await;
    let stopped = wait_until("recovery stops the canceled child", WAIT, || async {
        let row = bed.server.store().execution(child.child_execution_public_id).await.ok().flatten()?;
        row.status.is_terminal().then_some(row)
    })
    .await;
    assert_eq!(stopped.status, RunStatus::Canceled, "{stopped:?}");
    let ask = bed.server.task(child.child_execution_public_id, "r1t0").await.expect("ask");
    assert_eq!(ask.status, TaskStatus::Canceled, "{ask:?}");
    let row = bed.children(run).await.remove(0);
    assert_eq!(row.consumed_by.as_deref(), Some("task:r2t0"), "its first consumer keeps it: {row:?}");
    assert_eq!(bed.fake.count("loser"), 1, "the canceled child never asked its model again");
}
