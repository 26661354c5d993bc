//! Batches on the runner stream (`docs/protocol.md`, "Batches"): several requests in one
//! `RunnerBatch`, answered in one `NexusBatch`, their claims written in one store write; refused
//! frames keep their place; pushes batched only for a runner that asked.

use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::doors::api::CreateInput;
use nexus_proto::runner::v1::{Claim, Commit, Hello, WorkAvailable, nexus_frame, runner_frame};
use nexus_proto::{ExecutionId, RunStatus};
use nexus_tests::{Minted, RawRunner, Reply, TestServer, wait_until};

const WAIT: Duration = Duration::from_secs(20);
const CALLS: usize = 4;

fn tool() -> Value {
    json!({"name": "probe", "description": "Probe the machine.", "input_schema": {"type": "object"},
           "effect_profile": {"kind": "read_only", "destructive": false, "effect_scope": "closed",
                              "idempotency": "intrinsic", "reconciliation": "none"},
           "timeout_ms": 60_000})
}

fn fan_script() -> Value {
    let calls: Vec<Value> = (0..CALLS).map(|i| json!({"id": format!("c{i}"), "name": "probe"})).collect();
    json!({"rounds": [{"tool_calls": calls}, {"final": "done {{tool:c0}} {{tool:c3}}"}]})
}

/// A server whose pings are far apart (so no presence write lands in a counted window), an Agent
/// importing one runner, and that runner connected (reading batches or not) and announced.
async fn setup(batches: bool) -> (TestServer, Minted, RawRunner) {
    let server = TestServer::start_with(&[("fan", fan_script())], |c| {
        c.runner.ping_interval_ms = 600_000;
        c.runner.liveness_timeout_ms = 1_800_000;
    })
    .await;
    let agent = server.agent("agent").await;
    let runner = server.runner("runner").await;
    let (raw, hello) = RawRunner::connect_with(&server.url(), runner.id, &runner.token, batches).await;
    assert!(matches!(hello, Reply::Frame(nexus_frame::Frame::Welcome(_))), "{hello:?}");
    assert!(raw.announce(&json!({"tools": [tool()]})).await.code().is_none());
    let caller = server.caller(&agent).await;
    let body = json!({"configuration": {"runner_executor_public_ids": [runner.id], "approval_mode": "bypass",
                                         "default_model": "scripted/fan"}});
    server.server.api.declare(&caller, body).await.expect("declared");
    (server, agent, raw)
}

async fn admit(server: &TestServer, agent: &Minted) -> ExecutionId {
    let caller = server.caller(agent).await;
    let input = CreateInput { text: "go".to_owned(), ..CreateInput::default() };
    server.server.api.create_input(&caller, input).await.expect("admitted").execution_public_id
}

async fn offers(raw: &mut RawRunner, count: usize) -> Vec<WorkAvailable> {
    let mut offers = Vec::with_capacity(count);
    while offers.len() < count {
        offers.push(raw.next_work(WAIT).await.expect("an offer"));
    }
    offers
}

fn claim(work: &WorkAvailable) -> runner_frame::Frame {
    runner_frame::Frame::Claim(Claim { run_public_id: work.run_public_id.clone(), task_key: work.task_key.clone() })
}

fn commit(work: &WorkAvailable, token: &str, content: &str) -> runner_frame::Frame {
    runner_frame::Frame::Commit(Commit {
        run_public_id: work.run_public_id.clone(),
        task_key: work.task_key.clone(),
        claim_token: token.to_owned(),
        body_json: json!({"content": content}).to_string(),
    })
}

#[tokio::test]
async fn a_batch_of_claims_is_one_write_and_one_answer_and_commits_settle_the_round() {
    let (server, agent, mut raw) = setup(true).await;
    let run = admit(&server, &agent).await;
    let work = offers(&mut raw, CALLS).await;
    // The round's offers came together, in one NexusBatch.
    assert_eq!(raw.batches_received(), (1, CALLS as u64), "the round's offers in one batch");

    let before = server.store().io_stats();
    let grants = raw.batch(work.iter().map(claim).collect()).await;
    let after = server.store().io_stats();
    let tokens: Vec<String> = grants.iter().map(|g| g.granted().unwrap_or_else(|| panic!("{g:?}")).0).collect();
    assert_eq!(after.writes - before.writes, 1, "the batch's claims share one store write");
    assert_eq!(after.reads - before.reads, 0, "claims read nothing: the inbox holds its rows");
    assert_eq!(raw.batches_received(), (2, 2 * CALLS as u64), "the answers came in one batch");
    for (work, grant) in work.iter().zip(&grants) {
        let (_, task) = grant.granted().expect("granted");
        assert_eq!(task["task_key"], work.task_key.as_str(), "answers in request order");
    }

    let commits: Vec<_> = work.iter().zip(&tokens).map(|(w, t)| commit(w, t, &format!("out-{}", w.task_key))).collect();
    let committed = raw.batch(commits).await;
    for reply in &committed {
        assert_eq!(reply.committed(), Some((false, "completed".to_owned())), "{reply:?}");
    }
    let row = wait_until("completed", WAIT, || async {
        let row = server.store().execution(run).await.expect("read").expect("row");
        (row.status == RunStatus::Completed).then_some(row)
    })
    .await;
    assert_eq!(row.final_text.as_deref(), Some("done out-r1t0 out-r1t3"));
    // A second commit with the same token, batched, is idle; a wrong token is stale.
    let again = raw.batch(vec![commit(&work[0], &tokens[0], "again"), commit(&work[1], "e1.forged", "x")]).await;
    assert_eq!(again[0].committed(), Some((true, "completed".to_owned())));
    assert_eq!(again[1].code(), Some("stale_claim"));
}

#[tokio::test]
async fn a_batch_is_answered_as_if_each_frame_came_alone() {
    let (server, agent, mut raw) = setup(false).await;
    admit(&server, &agent).await;
    let work = offers(&mut raw, CALLS).await;
    // Without `batches` in the Hello the offers come one frame each.
    assert_eq!(raw.batches_received(), (0, 0));

    // The same task twice: the first wins, the second is already claimed; a commit naming a
    // task staged earlier in the batch sees it granted (here with a token it never held).
    let hello = runner_frame::Frame::Hello(Hello {
        executor_public_id: work[0].run_public_id.clone(),
        credential: "x".into(),
        protocol_version: nexus_proto::RUNNER_PROTOCOL_VERSION,
        batches: true,
    });
    let announce = runner_frame::Frame::Announce(nexus_proto::runner::v1::Announce { body_json: "{}".into() });
    let nested = runner_frame::Frame::Batch(nexus_proto::runner::v1::RunnerBatch { frames: Vec::new() });
    let replies = raw
        .batch(vec![
            claim(&work[0]),
            claim(&work[0]),
            commit(&work[0], "e1.never-granted", "x"),
            hello,
            announce,
            nested,
            claim(&work[1]),
        ])
        .await;
    assert!(replies[0].granted().is_some(), "{:?}", replies[0]);
    assert_eq!(replies[1].code(), Some("already_claimed"));
    assert_eq!(replies[2].code(), Some("stale_claim"));
    assert_eq!(replies[3].code(), Some("protocol_violation"));
    assert_eq!(replies[4].code(), Some("protocol_violation"));
    assert_eq!(replies[5].code(), Some("protocol_violation"));
    assert!(replies[6].granted().is_some(), "{:?}", replies[6]);
    assert!(raw.is_open(), "refused frames in a batch leave the stream open");
    // A batch is answered in kind even on a stream that did not ask for batches.
    assert_eq!(raw.batches_received().0, 1);

    // More than 256 frames: every one is refused, nothing is claimed.
    let too_many: Vec<_> = (0..257).map(|_| claim(&work[2])).collect();
    let refused = raw.batch(too_many).await;
    assert!(refused.iter().all(|r| r.code() == Some("protocol_violation")), "{:?}", refused[0]);
    assert!(raw.claim(&work[2].run_public_id, &work[2].task_key).await.granted().is_some(), "still claimable");
}

/// What one turn of a new conversation reads (issue 10: reads per settled call), a call to one
/// runner and a final answer, counted by the store from admission to `completed`, the test's
/// own polls left out. Each read is one of: the door's credential and member (2); the profile
/// at admission and at resolution (2); the execution's row when its actor loads (1; a fresh
/// execution reads back no tasks and no events); the Agent's member row (1; the macros use it
/// too); the input (1); the runner's row for eligibility (1); the passive mail of delegation
/// (1); the conversation's line and waiting steers at the start and at the hand-off (4).
#[tokio::test]
async fn a_turn_of_one_call_reads_the_store_thirteen_times_at_most() {
    let script = json!({"rounds": [{"tool_calls": [{"id": "c0", "name": "probe"}]}, {"final": "done {{tool:c0}}"}]});
    let server = TestServer::start_with(&[("one", script)], |c| {
        c.runner.ping_interval_ms = 600_000;
        c.runner.liveness_timeout_ms = 1_800_000;
    })
    .await;
    let agent = server.agent("agent").await;
    let runner = server.runner("runner").await;
    let (mut raw, _) = RawRunner::connect_with(&server.url(), runner.id, &runner.token, true).await;
    assert!(raw.announce(&json!({"tools": [tool()]})).await.code().is_none());
    let caller = server.caller(&agent).await;
    let body = json!({"configuration": {"runner_executor_public_ids": [runner.id], "approval_mode": "bypass",
                                         "default_model": "scripted/one"}});
    server.server.api.declare(&caller, body).await.expect("declared");
    // The first turn is not counted: it runs beside the start's recovery, which reads too.
    for turn in 0..3 {
        let before = server.store().io_stats();
        let run = admit(&server, &agent).await;
        let work = offers(&mut raw, 1).await;
        let grants = raw.batch(vec![claim(&work[0])]).await;
        let (token, _) = grants[0].granted().unwrap_or_else(|| panic!("{grants:?}"));
        assert_eq!(
            raw.batch(vec![commit(&work[0], &token, "out")]).await[0].committed(),
            Some((false, "completed".to_owned()))
        );
        let mut polls = 0;
        let row = wait_until("completed", WAIT, || {
            polls += 1;
            async {
                let row = server.store().execution(run).await.expect("read").expect("row");
                (row.status == RunStatus::Completed).then_some(row)
            }
        })
        .await;
        // The hand-off to the conversation's next turn reads after the ending save: the turn is
        // over when its actor has stopped (the census reads nothing).
        wait_until("the execution's actor stopped", WAIT, || async {
            let census = server.server.api.root.census().await.ok()?;
            (census.executions == 0).then_some(())
        })
        .await;
        assert_eq!(row.final_text.as_deref(), Some("done out"));
        let reads = server.store().io_stats().reads - before.reads - polls;
        if turn > 0 {
            assert!(reads <= 13, "turn {turn} read the store {reads} times");
        }
    }
}
