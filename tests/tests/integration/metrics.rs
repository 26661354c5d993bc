//! `GET /metrics` scraped after a workload: the store's census, the counted series and the
//! doors' answers match what the store and the test did (`docs/metrics.md`).

use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use nexus_actors::doors::api::CreateInput;
use nexus_actors::store::EventType;
use nexus_proto::agent::v1::GetExecutionRequest;
use nexus_proto::{ExecutionId, RunStatus, TaskStatus};
use nexus_tests::probe::Probe;
use nexus_tests::{Http, Minted, TestServer, agent_client, authed, wait_until};

const WAIT: Duration = Duration::from_secs(20);

/// The value of the sample named `series` (name and labels, exactly as written), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn scrape(server: &TestServer, token: Option<&str>) -> (u16, Option<String>, String) {
    let mut request = reqwest::Client::new().get(format!("{}/metrics", server.url()));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let answer = tokio::time::timeout(WAIT, request.send()).await.expect("in time").expect("scraped");
    let status = answer.status().as_u16();
    let content_type = answer.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (status, content_type, answer.text().await.expect("body"))
}

async fn admit(server: &TestServer, agent: &Minted) -> ExecutionId {
    let caller = server.caller(agent).await;
    let input = CreateInput { text: "probe it".to_owned(), ..CreateInput::default() };
    server.server.api.create_input(&caller, input).await.expect("admitted").execution_public_id
}

#[tokio::test]
async fn a_scrape_after_a_workload_matches_the_store() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "c1", "name": "probe", "arguments": {}}]},
        {"final": "probe said {{tool:c1}}"}
    ]});
    let server = TestServer::start(&[("probe", script)]).await;
    let Probe { agent, runner, mut raw } = Probe::start(&server, "bypass", "scripted/probe").await;

    // One execution's call is claimed and committed, and it completes; a second one's call
    // waits in the runner's inbox, never claimed.
    let done = admit(&server, &agent).await;
    let work = raw.next_work(WAIT).await.expect("work");
    let (token, _) = raw.claim(&work.run_public_id, &work.task_key).await.granted().expect("granted");
    assert!(
        raw.commit(&work.run_public_id, &work.task_key, &token, &json!({"content": "ok"})).await.committed().is_some()
    );
    let store = server.store();
    wait_until("the first execution to complete", WAIT, || async {
        (store.execution(done).await.ok()??.status == RunStatus::Completed).then_some(())
    })
    .await;
    let waiting = admit(&server, &agent).await;
    let offered = raw.next_work(WAIT).await.expect("work");
    assert_eq!(offered.run_public_id, waiting.to_string());

    // A refusal on each door kind.
    let http = Http::new(&server.url(), Some(&agent.token));
    assert_eq!(http.get(&format!("/agent_api/v1/executions/{}", Uuid::new_v4())).await.status, 404);
    let mut client = agent_client(&server).await;
    let request = GetExecutionRequest { execution_public_id: Uuid::new_v4().to_string(), tasks_after: String::new() };
    client.get_execution(authed(request, &agent)).await.expect_err("not found");
    // A credential presented is checked, even from this host.
    let (status, _, _) = scrape(&server, Some("not-a-token")).await;
    assert_eq!(status, 401);

    let before = store.group_commit_stats();
    let (status, content_type, text) = scrape(&server, None).await;
    let after = store.group_commit_stats();
    assert_eq!(status, 200, "{text}");
    assert_eq!(content_type.as_deref(), Some(nexus_actors::metrics::CONTENT_TYPE));
    assert!(text.trim_end().ends_with("# EOF"), "{text}");

    // The store's census, status by status, every status listed.
    let mut tasks = store.tasks_of(done).await.expect("tasks");
    tasks.extend(store.tasks_of(waiting).await.expect("tasks"));
    for status in TaskStatus::ALL {
        let stored = tasks.iter().filter(|task| task.status == *status).count() as f64;
        assert_eq!(sample(&text, &format!("nexus_tasks{{status=\"{status}\"}}")), Some(stored), "{status}:\n{text}");
    }
    let mut executions = Vec::new();
    for id in [done, waiting] {
        executions.push(store.execution(id).await.expect("read").expect("execution"));
    }
    for status in RunStatus::ALL {
        let stored = executions.iter().filter(|row| row.status == *status).count() as f64;
        assert_eq!(
            sample(&text, &format!("nexus_executions{{status=\"{status}\"}}")),
            Some(stored),
            "{status}:\n{text}"
        );
    }
    let runner_label = format!("{{runner=\"{}\"}}", runner.id);
    assert_eq!(sample(&text, &format!("nexus_runner_open_tasks{runner_label}")), Some(1.0), "{text}");
    assert_eq!(sample(&text, &format!("nexus_runner_unclaimed_tasks{runner_label}")), Some(1.0), "{text}");
    assert_eq!(sample(&text, "nexus_runners_online"), Some(1.0), "{text}");

    // What happened: one model step per round, the tokens the usage events recorded, one call
    // settled by the runner, and the group commit's transactions.
    let rounds: i64 = executions.iter().map(|row| row.round).sum();
    let calls = ["ok", "error"].map(|outcome| {
        sample(
            &text,
            &format!("nexus_model_call_duration_seconds_count{{provider=\"scripted\",outcome=\"{outcome}\"}}"),
        )
        .unwrap_or(0.0)
    });
    assert_eq!(calls, [rounds as f64, 0.0], "{text}");
    let mut tokens = [0u64; 2];
    for id in [done, waiting] {
        for event in store.events_after(id, 0, 1000).await.expect("events") {
            if event.event.event_type() == EventType::Usage {
                let data = event.event.data();
                tokens[0] += data["input_tokens"].as_u64().expect("input_tokens");
                tokens[1] += data["output_tokens"].as_u64().expect("output_tokens");
            }
        }
    }
    for (kind, stored) in ["input", "output"].into_iter().zip(tokens) {
        let counted = sample(&text, &format!("nexus_model_tokens_total{{provider=\"scripted\",kind=\"{kind}\"}}"));
        assert_eq!(counted.unwrap_or(0.0), stored as f64, "{kind}:\n{text}");
    }
    assert_eq!(
        sample(&text, "nexus_task_settle_duration_seconds_count{route=\"runner\",status=\"completed\"}"),
        Some(1.0),
        "{text}"
    );
    let transactions = sample(&text, "nexus_store_commit_batch_size_count").expect("batches") as u64;
    assert!((before.transactions..=after.transactions).contains(&transactions), "{transactions} {before:?} {after:?}");
    let writes = sample(&text, "nexus_store_commit_batch_size_sum").expect("writes") as u64;
    assert!((before.writes..=after.writes).contains(&writes), "{writes} {before:?} {after:?}");
    assert_eq!(sample(&text, "nexus_store_commit_duration_seconds_count"), Some(transactions as f64), "{text}");

    // The doors' answers by code: each refusal above, once.
    for (door, code) in [("http", "not_found"), ("grpc", "not_found"), ("http", "unauthorized")] {
        assert_eq!(
            sample(&text, &format!("nexus_door_requests_total{{door=\"{door}\",code=\"{code}\"}}")),
            Some(1.0),
            "{door} {code}:\n{text}"
        );
    }
    // No series is labelled with an execution's id.
    for id in [done, waiting] {
        assert!(!text.contains(&id.to_string()), "{text}");
    }
    server.shutdown().await;
}
