//! The loop driven frame by frame against a scripted stream.

use std::time::Duration;

use nexus_proto::InboxKind;
use nexus_proto::runner::v1::nexus_frame::Frame as Answer;
use nexus_proto::runner::v1::runner_frame::Frame as Request;
use nexus_proto::runner::v1::{ClaimGranted, Commit, NexusFrame, Pong, RunnerFrame, WorkAvailable, WorkCanceled};
use serde_json::Value;
use tokio::sync::mpsc;

use super::link::HELLO_REQUEST_ID;
use crate::claim::{ClaimHandle, RequestError};
use crate::config::AgentConfig;
use crate::error::AgentError;
use crate::journal::{EntryState, Journal, JournalEntry, TaskKey};

use std::path::{Path, PathBuf};

use nexus_proto::runner::v1::{Committed, Ping, Refusal as RefusalFrame, runner_frame};
use serde_json::json;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::*;
use crate::config::Credential;

const RUNNER: Uuid = Uuid::from_u128(42);

struct Setup {
    _dir: tempfile::TempDir,
    config: AgentConfig,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let workdir = dir.path().join("work");
        std::fs::create_dir(&workdir).unwrap();
        // Port 9 (discard) on loopback: nothing in these tests ever connects.
        let mut config = AgentConfig::new("http://127.0.0.1:9", RUNNER, Credential::new("token"), workdir);
        config.state_dir = dir.path().join("state");
        Setup { _dir: dir, config }
    }

    fn workdir(&self) -> &Path {
        &self.config.workdir
    }

    /// The journal as a restarted agent would read it.
    fn on_disk(&self) -> Journal {
        Journal::open(&self.config.state_dir, RUNNER).unwrap()
    }

    async fn seed(&self, entries: Vec<JournalEntry>) {
        let mut journal = self.on_disk();
        entries.into_iter().for_each(|entry| journal.insert(entry));
        journal.persist().await.unwrap();
    }

    fn agent(&self) -> (Agent, mpsc::Receiver<RunnerFrame>) {
        let mut agent = Agent::new(self.config.clone()).unwrap();
        let (outbound, frames) = mpsc::channel(64);
        agent.attach(outbound, Duration::from_secs(45));
        (agent, frames)
    }
}

fn key(task: &str) -> TaskKey {
    TaskKey { run_public_id: "run-1".into(), task_key: task.into() }
}

fn entry(task: &str, deadline_at_ms: i64, state: EntryState) -> JournalEntry {
    JournalEntry { key: key(task), tool_name: "bash".into(), claim_token: format!("tok-{task}"), deadline_at_ms, state }
}

fn push(frame: Answer) -> NexusFrame {
    NexusFrame { request_id: 0, frame: Some(frame) }
}

fn work(task: &str) -> NexusFrame {
    push(Answer::WorkAvailable(WorkAvailable {
        kind: InboxKind::ToolCall.as_str().into(),
        run_public_id: "run-1".into(),
        task_key: task.into(),
        tool_name: "bash".into(),
    }))
}

fn answer(request_id: u64, frame: Answer) -> NexusFrame {
    NexusFrame { request_id, frame: Some(frame) }
}

fn refusal(code: &str, http_status: u32) -> Answer {
    Answer::Refusal(RefusalFrame { code: code.into(), message: "refused".into(), http_status })
}

fn grant(tool_name: &str, tool_input: Value, claim_token: &str) -> Answer {
    Answer::ClaimGranted(ClaimGranted {
        task_json: json!({"tool_name": tool_name, "tool_input": tool_input, "timeout_ms": 60_000}).to_string(),
        claim_token: claim_token.into(),
        deadline_at_ms: unix_now_ms() + 60_000,
    })
}

fn sent(frames: &mut mpsc::Receiver<RunnerFrame>) -> Vec<(u64, runner_frame::Frame)> {
    std::iter::from_fn(|| frames.try_recv().ok()).map(|frame| (frame.request_id, frame.frame.unwrap())).collect()
}

fn claimed_tasks(frames: &[(u64, runner_frame::Frame)]) -> Vec<String> {
    frames
        .iter()
        .filter_map(|(_, frame)| match frame {
            Request::Claim(claim) => Some(claim.task_key.clone()),
            _ => None,
        })
        .collect()
}

fn commit_of(frames: &[(u64, runner_frame::Frame)]) -> (u64, Commit, Value) {
    let (request_id, commit) = frames
        .iter()
        .find_map(|(id, frame)| match frame {
            Request::Commit(commit) => Some((*id, commit.clone())),
            _ => None,
        })
        .expect("a commit frame");
    let body = serde_json::from_str(&commit.body_json).unwrap();
    (request_id, commit, body)
}

async fn finish_next(agent: &mut Agent) {
    let joined = tokio::time::timeout(Duration::from_secs(10), agent.tasks.join_next()).await;
    let finished = joined.expect("a tool finished in time").expect("a tool was running").unwrap();
    agent.on_tool_finished(finished).await;
}

#[tokio::test]
async fn a_task_claimed_before_a_restart_is_never_claimed_or_run_again() {
    let setup = Setup::new();
    setup.seed(vec![entry("t1", unix_now_ms() + 60_000, EntryState::Running)]).await;
    let (mut agent, mut frames) = setup.agent();

    agent.on_frame(work("t1")).await;
    agent.on_frame(work("t2")).await;
    agent.on_frame(work("t2")).await; // a duplicate hint
    let mut ask = work("t3");
    if let Some(Answer::WorkAvailable(w)) = ask.frame.as_mut() {
        w.kind = "ask".into();
    }
    agent.on_frame(ask).await;

    let frames = sent(&mut frames);
    assert_eq!(claimed_tasks(&frames), ["t2"]);
    assert_eq!(frames[0].0, HELLO_REQUEST_ID + 1);
    assert!(agent.running.is_empty());
    assert_eq!(setup.on_disk().get(&key("t1")).unwrap().state, EntryState::Running);
}

#[tokio::test]
async fn a_claim_is_journaled_before_it_runs_and_its_result_before_it_is_committed() {
    let setup = Setup::new();
    let (mut agent, mut frames) = setup.agent();
    agent.on_frame(work("t1")).await;
    let claim_id = sent(&mut frames)[0].0;

    let input = json!({"path": "out.txt", "content": "hello"});
    agent.on_frame(answer(claim_id, grant("write_file", input, "tok-1"))).await;
    let journaled = setup.on_disk().get(&key("t1")).cloned().unwrap();
    assert_eq!(journaled.claim_token, "tok-1");
    assert_eq!(journaled.tool_name, "write_file");

    finish_next(&mut agent).await;
    let frames = sent(&mut frames);
    let (commit_id, commit, body) = commit_of(&frames);
    assert_eq!(commit.claim_token, "tok-1");
    assert_eq!((commit.run_public_id.as_str(), commit.task_key.as_str()), ("run-1", "t1"));
    assert_eq!(body["is_error"], false);
    assert_eq!(body["structured_content"]["sha256"], hex::encode(Sha256::digest(b"hello")));
    assert_eq!(std::fs::read_to_string(setup.workdir().join("out.txt")).unwrap(), "hello");
    // The result was on disk by the time the commit was sent.
    assert_eq!(setup.on_disk().get(&key("t1")).unwrap().state, EntryState::CommitPending { body, fallback: false });

    let committed = Answer::Committed(Committed { idle: false, status: "completed".into() });
    agent.on_frame(answer(commit_id, committed)).await;
    assert_eq!(setup.on_disk().entries().count(), 0);
    assert!(agent.committing.is_empty());
}

#[tokio::test]
async fn results_are_resent_after_reconnect_and_expired_ones_are_dropped() {
    let setup = Setup::new();
    let body = json!({"content": "done", "structured_content": null, "is_error": false});
    let pending = || EntryState::CommitPending { body: body.clone(), fallback: false };
    let now = unix_now_ms();
    setup
        .seed(vec![
            entry("live", now + 60_000, pending()),
            entry("late", now - 1, pending()),
            entry("orphan", now - 1, EntryState::Running),
        ])
        .await;
    let (mut agent, mut frames) = setup.agent();
    agent.after_connect().await;

    let frames_sent = sent(&mut frames);
    let Request::Announce(announce) = &frames_sent[0].1 else { panic!("announce first") };
    let announced: Value = serde_json::from_str(&announce.body_json).unwrap();
    assert_eq!(announced["tools"].as_array().unwrap().len(), 4);
    assert_eq!(frames_sent.len(), 2);
    let (commit_id, commit, resent) = commit_of(&frames_sent);
    assert_eq!((commit.task_key.as_str(), commit.claim_token.as_str()), ("live", "tok-live"));
    assert_eq!(resent, body);
    let remaining: Vec<String> = setup.on_disk().entries().map(|e| e.key.task_key.clone()).collect();
    assert_eq!(remaining, ["live", "orphan"]);

    // The maintenance pass forgets the interrupted task whose deadline passed, and does not
    // send the in-flight commit twice.
    agent.maintain().await;
    assert!(sent(&mut frames).is_empty());
    let remaining: Vec<String> = setup.on_disk().entries().map(|e| e.key.task_key.clone()).collect();
    assert_eq!(remaining, ["live"]);

    // A final refusal drops the result.
    agent.on_frame(answer(commit_id, refusal("stale_claim", 409))).await;
    assert_eq!(setup.on_disk().entries().count(), 0);
}

#[tokio::test]
async fn a_malformed_result_is_replaced_once_by_a_short_error() {
    let setup = Setup::new();
    let body = json!({"content": "x", "structured_content": null, "is_error": false});
    setup.seed(vec![entry("t1", unix_now_ms() + 60_000, EntryState::CommitPending { body, fallback: false })]).await;
    let (mut agent, mut frames) = setup.agent();
    agent.resend_commits().await;
    let (first_id, _, _) = commit_of(&sent(&mut frames));

    agent.on_frame(answer(first_id, refusal("invalid_content", 422))).await;
    let (second_id, commit, fallback) = commit_of(&sent(&mut frames));
    assert_eq!(commit.claim_token, "tok-t1");
    assert_eq!(fallback["is_error"], true);
    assert!(fallback["content"].as_str().unwrap().contains("invalid_content"));
    assert!(matches!(setup.on_disk().get(&key("t1")).unwrap().state, EntryState::CommitPending { fallback: true, .. }));

    // A retryable refusal keeps it; a second malformed refusal drops it.
    agent.on_frame(answer(second_id, refusal("unavailable", 503))).await;
    assert!(setup.on_disk().get(&key("t1")).is_some());
    agent.resend_commits().await;
    let (third_id, _, _) = commit_of(&sent(&mut frames));
    agent.on_frame(answer(third_id, refusal("invalid_content", 422))).await;
    assert!(setup.on_disk().get(&key("t1")).is_none());
}

#[tokio::test]
async fn claims_wait_for_a_free_slot() {
    let mut setup = Setup::new();
    setup.config.slots = 1;
    let (mut agent, mut frames) = setup.agent();
    agent.on_frame(work("t1")).await;
    agent.on_frame(work("t2")).await;
    let first = sent(&mut frames);
    assert_eq!(claimed_tasks(&first), ["t1"]);

    agent.on_frame(answer(first[0].0, refusal("already_claimed", 409))).await;
    let second = sent(&mut frames);
    assert_eq!(claimed_tasks(&second), ["t2"]);

    // While t2 runs, a new hint waits.
    let input = json!({"command": "sleep 30"});
    agent.on_frame(answer(second[0].0, grant("bash", input, "tok-2"))).await;
    agent.on_frame(work("t3")).await;
    assert!(claimed_tasks(&sent(&mut frames)).is_empty());
    agent.on_work_canceled(WorkCanceled { run_public_id: "run-1".into(), task_key: "t2".into() });
    finish_next(&mut agent).await;
    let after = sent(&mut frames);
    assert_eq!(claimed_tasks(&after), ["t3"]);
    let (_, _, body) = commit_of(&after);
    assert_eq!(body["content"], "the command was killed because its task was canceled");
    assert_eq!(body["is_error"], true);
}

#[tokio::test]
async fn pings_get_pongs_and_a_lost_stream_fails_waiting_requests() {
    let setup = Setup::new();
    let (mut agent, mut frames) = setup.agent();
    agent.on_frame(push(Answer::Ping(Ping { nonce: 7 }))).await;
    let frames_sent = sent(&mut frames);
    assert!(matches!(frames_sent.as_slice(), [(0, Request::Pong(Pong { nonce: 7 }))]));

    let handle = ClaimHandle::new(key("t1"), "tok".into(), agent.control_tx.clone());
    let asking = tokio::spawn(async move { handle.is_active().await });
    let request = agent.control_rx.recv().await.unwrap();
    agent.on_control(request);
    let status_id = sent(&mut frames)[0].0;
    assert!(agent.link.as_ref().unwrap().pending.contains_key(&status_id));

    agent.lose_link("test");
    assert_eq!(asking.await.unwrap(), Err(RequestError::Disconnected));
    assert!(agent.link.is_none());
    assert!(agent.connecting.is_some(), "a reconnect is scheduled");
}

#[tokio::test]
async fn run_stops_promptly_when_shutdown_resolves() {
    let setup = Setup::new();
    let started = tokio::time::Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), crate::run(setup.config.clone(), async {})).await;
    assert!(matches!(outcome, Ok(Ok(()))), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let mut bad = setup.config.clone();
    bad.workdir = PathBuf::from("/nonexistent/nexus-workdir");
    assert!(matches!(crate::run(bad, async {}).await, Err(AgentError::Config(_))));
}

#[test]
fn the_run_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let setup = Setup::new();
    let future = crate::run(setup.config.clone(), async {});
    assert_send(&future);
}
