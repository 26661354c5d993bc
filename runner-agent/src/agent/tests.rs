//! The loop driven frame by frame against a scripted stream. A test plays a turn of the loop
//! with [`turn`]: the outbox goes out and the journal flushes, its durable actions run.

use std::time::Duration;

use nexus_proto::InboxKind;
use nexus_proto::runner::v1::nexus_frame::Frame as Answer;
use nexus_proto::runner::v1::runner_frame::Frame as Request;
use nexus_proto::runner::v1::{
    Claim, ClaimGranted, Commit, NexusBatch, NexusFrame, Pong, RunnerBatch, RunnerFrame, WorkAvailable, WorkCanceled,
};
use serde_json::Value;
use tokio::sync::mpsc;

use super::link::HELLO_REQUEST_ID;
use crate::claim::{ClaimHandle, RequestError};
use crate::config::AgentConfig;
use crate::error::AgentError;
use crate::journal::{EntryState, Journal, JournalEntry, TaskKey, lock_state_dir};

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
        let lock = lock_state_dir(&self.config.state_dir).unwrap();
        let mut journal = Journal::open_writable(&lock, RUNNER).unwrap();
        for entry in entries {
            journal.insert(entry);
        }
        journal.sync().await.unwrap();
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

/// Ends turns until nothing waits for the journal: sends the outbox, flushes, and runs what
/// waited for the flush (which may queue more).
async fn turn(agent: &mut Agent) {
    loop {
        agent.end_turn();
        if agent.journal.is_idle() {
            return;
        }
        let flushed = tokio::time::timeout(Duration::from_secs(10), agent.journal.flushed()).await;
        agent.on_journal_flushed(flushed.expect("the journal flushed in time"));
    }
}

/// The frames as sent on the stream, batches whole.
fn sent_raw(frames: &mut mpsc::Receiver<RunnerFrame>) -> Vec<RunnerFrame> {
    std::iter::from_fn(|| frames.try_recv().ok()).collect()
}

/// The frames sent, each batch's frames in its place.
fn sent(frames: &mut mpsc::Receiver<RunnerFrame>) -> Vec<(u64, runner_frame::Frame)> {
    unbatch(sent_raw(frames))
}

fn unbatch(frames: Vec<RunnerFrame>) -> Vec<(u64, runner_frame::Frame)> {
    let mut out = Vec::new();
    for frame in frames {
        match frame.frame.unwrap() {
            Request::Batch(batch) => {
                assert_eq!(frame.request_id, 0, "a batch's own request id is 0");
                assert!(batch.frames.len() > 1, "a batch holds several frames");
                out.extend(batch.frames.into_iter().map(|inner| (inner.request_id, inner.frame.unwrap())));
            }
            body => out.push((frame.request_id, body)),
        }
    }
    out
}

fn batch(frames: Vec<NexusFrame>) -> NexusFrame {
    push(Answer::Batch(NexusBatch { frames }))
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
    agent.on_tool_finished(finished);
    turn(agent).await;
}

#[tokio::test]
async fn a_task_claimed_before_a_restart_is_never_claimed_or_run_again() {
    let setup = Setup::new();
    setup.seed(vec![entry("t1", unix_now_ms() + 60_000, EntryState::Running)]).await;
    let (mut agent, mut frames) = setup.agent();

    agent.on_frame(work("t1"));
    agent.on_frame(work("t2"));
    agent.on_frame(work("t2")); // a duplicate hint
    let mut ask = work("t3");
    if let Some(Answer::WorkAvailable(w)) = ask.frame.as_mut() {
        w.kind = "ask".into();
    }
    agent.on_frame(ask);
    turn(&mut agent).await;

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
    agent.on_frame(work("t1"));
    turn(&mut agent).await;
    let claim_id = sent(&mut frames)[0].0;

    let input = json!({"path": "out.txt", "content": "hello"});
    agent.on_frame(answer(claim_id, grant("write_file", input, "tok-1")));
    // The tool waits for its entry to reach the disk, holding its slot meanwhile.
    assert!(agent.tasks.is_empty(), "no tool starts before its claim is durable");
    assert!(agent.running.contains_key(&key("t1")));
    assert!(setup.on_disk().get(&key("t1")).is_none());
    let fsyncs = agent.journal.fsyncs();
    turn(&mut agent).await;
    assert_eq!(agent.journal.fsyncs(), fsyncs + 1);
    assert_eq!(agent.tasks.len(), 1, "the tool started once its claim was durable");
    let journaled = setup.on_disk().get(&key("t1")).cloned().unwrap();
    assert_eq!(journaled.claim_token, "tok-1");
    assert_eq!(journaled.tool_name, "write_file");
    assert_eq!(journaled.state, EntryState::Running);

    // The result is journaled before its commit goes out.
    let joined = tokio::time::timeout(Duration::from_secs(10), agent.tasks.join_next()).await;
    agent.on_tool_finished(joined.unwrap().unwrap().unwrap());
    agent.flush_outbox();
    assert!(sent(&mut frames).is_empty(), "no commit before its result is durable");
    agent.resend_commits();
    agent.flush_outbox();
    assert!(sent(&mut frames).is_empty(), "nor by the periodic pass");
    turn(&mut agent).await;
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
    agent.on_frame(answer(commit_id, committed));
    turn(&mut agent).await;
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
    agent.after_connect();
    turn(&mut agent).await;

    let frames_sent = sent(&mut frames);
    let Request::Announce(announce) = &frames_sent[0].1 else { panic!("announce first") };
    let announced: Value = serde_json::from_str(&announce.body_json).unwrap();
    assert_eq!(announced["tools"], agent.toolbox.announcement()["tools"]);
    assert!(announced["tools"].as_array().unwrap().iter().any(|tool| tool["name"] == "bash"));
    assert_eq!(frames_sent.len(), 2);
    let (commit_id, commit, resent) = commit_of(&frames_sent);
    assert_eq!((commit.task_key.as_str(), commit.claim_token.as_str()), ("live", "tok-live"));
    assert_eq!(resent, body);
    let remaining: Vec<String> = setup.on_disk().entries().map(|e| e.key.task_key.clone()).collect();
    assert_eq!(remaining, ["live", "orphan"]);

    // The maintenance pass forgets the interrupted task whose deadline passed, and does not
    // send the in-flight commit twice.
    agent.maintain();
    turn(&mut agent).await;
    assert!(sent(&mut frames).is_empty());
    let remaining: Vec<String> = setup.on_disk().entries().map(|e| e.key.task_key.clone()).collect();
    assert_eq!(remaining, ["live"]);

    // A final refusal drops the result.
    agent.on_frame(answer(commit_id, refusal("stale_claim", 409)));
    turn(&mut agent).await;
    assert_eq!(setup.on_disk().entries().count(), 0);
}

#[tokio::test]
async fn a_malformed_result_is_replaced_once_by_a_short_error() {
    let setup = Setup::new();
    let body = json!({"content": "x", "structured_content": null, "is_error": false});
    setup.seed(vec![entry("t1", unix_now_ms() + 60_000, EntryState::CommitPending { body, fallback: false })]).await;
    let (mut agent, mut frames) = setup.agent();
    agent.resend_commits();
    turn(&mut agent).await;
    let (first_id, _, _) = commit_of(&sent(&mut frames));

    agent.on_frame(answer(first_id, refusal("invalid_content", 422)));
    agent.flush_outbox();
    assert!(sent(&mut frames).is_empty(), "the short error is journaled before it is sent");
    turn(&mut agent).await;
    let (second_id, commit, fallback) = commit_of(&sent(&mut frames));
    assert_eq!(commit.claim_token, "tok-t1");
    assert_eq!(fallback["is_error"], true);
    assert!(fallback["content"].as_str().unwrap().contains("invalid_content"));
    assert!(matches!(setup.on_disk().get(&key("t1")).unwrap().state, EntryState::CommitPending { fallback: true, .. }));

    // A retryable refusal keeps it; a second malformed refusal drops it.
    agent.on_frame(answer(second_id, refusal("unavailable", 503)));
    turn(&mut agent).await;
    assert!(setup.on_disk().get(&key("t1")).is_some());
    agent.resend_commits();
    turn(&mut agent).await;
    let (third_id, _, _) = commit_of(&sent(&mut frames));
    agent.on_frame(answer(third_id, refusal("invalid_content", 422)));
    turn(&mut agent).await;
    assert!(setup.on_disk().get(&key("t1")).is_none());
}

#[tokio::test]
async fn claims_wait_for_a_free_slot() {
    let mut setup = Setup::new();
    setup.config.slots = 1;
    let (mut agent, mut frames) = setup.agent();
    agent.on_frame(work("t1"));
    agent.on_frame(work("t2"));
    turn(&mut agent).await;
    let first = sent(&mut frames);
    assert_eq!(claimed_tasks(&first), ["t1"]);

    agent.on_frame(answer(first[0].0, refusal("already_claimed", 409)));
    turn(&mut agent).await;
    let second = sent(&mut frames);
    assert_eq!(claimed_tasks(&second), ["t2"]);

    // While t2 waits for its journal entry, and then runs, a new hint waits.
    let input = json!({"command": "sleep 30"});
    agent.on_frame(answer(second[0].0, grant("bash", input, "tok-2")));
    agent.on_frame(work("t3"));
    agent.flush_outbox();
    assert!(claimed_tasks(&sent(&mut frames)).is_empty());
    turn(&mut agent).await;
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
    agent.on_frame(push(Answer::Ping(Ping { nonce: 7 })));
    turn(&mut agent).await;
    let frames_sent = sent(&mut frames);
    assert!(matches!(frames_sent.as_slice(), [(0, Request::Pong(Pong { nonce: 7 }))]));

    let handle = ClaimHandle::new(key("t1"), "tok".into(), agent.control_tx.clone());
    let asking = tokio::spawn(async move { handle.is_active().await });
    let request = agent.control_rx.recv().await.unwrap();
    agent.on_control(request);
    turn(&mut agent).await;
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

fn claim_frame(request_id: u64, task: &str) -> RunnerFrame {
    let claim = Claim { run_public_id: "run-1".into(), task_key: task.into() };
    RunnerFrame { request_id, frame: Some(Request::Claim(claim)) }
}

fn inner_frames(frame: &RunnerFrame) -> Option<&[RunnerFrame]> {
    match &frame.frame {
        Some(Request::Batch(RunnerBatch { frames })) => Some(frames),
        _ => None,
    }
}

#[tokio::test]
async fn offers_in_one_batch_are_claimed_in_one_batch_and_a_batch_of_answers_is_handled() {
    let setup = Setup::new();
    let (mut agent, mut frames) = setup.agent();
    assert!(agent.hello().batches, "the hello says this runner reads batches");

    agent.on_frame(batch(vec![work("t1"), work("t2"), work("t3"), push(Answer::Ping(Ping { nonce: 9 }))]));
    turn(&mut agent).await;
    let raw = sent_raw(&mut frames);
    assert_eq!(raw.len(), 1, "one frame on the wire: {raw:?}");
    assert_eq!(raw[0].request_id, 0);
    let inner = inner_frames(&raw[0]).expect("a RunnerBatch");
    let requests = unbatch(raw.clone());
    assert_eq!(claimed_tasks(&requests), ["t1", "t2", "t3"]);
    assert!(matches!(inner[3].frame, Some(Request::Pong(Pong { nonce: 9 }))));
    let ids: Vec<u64> = inner[..3].iter().map(|frame| frame.request_id).collect();
    assert_eq!(ids, [HELLO_REQUEST_ID + 1, HELLO_REQUEST_ID + 2, HELLO_REQUEST_ID + 3]);

    // The answers come back together: two grants and a refusal. Both claims share one fsync
    // and both tools start once it is done.
    let write = |name: &str| json!({"path": format!("{name}.txt"), "content": name});
    agent.on_frame(batch(vec![
        answer(ids[0], grant("write_file", write("one"), "tok-1")),
        answer(ids[2], refusal("already_claimed", 409)),
        answer(ids[1], grant("write_file", write("two"), "tok-2")),
    ]));
    assert!(agent.tasks.is_empty());
    let fsyncs = agent.journal.fsyncs();
    turn(&mut agent).await;
    assert_eq!(agent.journal.fsyncs(), fsyncs + 1, "two claims, one fsync");
    assert_eq!(agent.tasks.len(), 2);
    assert!(agent.claiming.is_empty());

    // Both results in one turn: one fsync, one batch of commits.
    for _ in 0..2 {
        let joined = tokio::time::timeout(Duration::from_secs(10), agent.tasks.join_next()).await;
        agent.on_tool_finished(joined.unwrap().unwrap().unwrap());
    }
    turn(&mut agent).await;
    assert_eq!(agent.journal.fsyncs(), fsyncs + 2, "two results, one fsync");
    let raw = sent_raw(&mut frames);
    assert_eq!(raw.len(), 1, "the commits share a batch: {raw:?}");
    let commits: Vec<(u64, String)> = unbatch(raw)
        .into_iter()
        .map(|(id, frame)| match frame {
            Request::Commit(commit) => (id, commit.claim_token),
            other => panic!("expected commits, got {other:?}"),
        })
        .collect();
    let mut tokens: Vec<&str> = commits.iter().map(|(_, token)| token.as_str()).collect();
    tokens.sort_unstable();
    assert_eq!(tokens, ["tok-1", "tok-2"]);

    let committed = || Answer::Committed(Committed { idle: false, status: "completed".into() });
    agent.on_frame(batch(commits.iter().map(|(id, _)| answer(*id, committed())).collect()));
    turn(&mut agent).await;
    assert!(agent.committing.is_empty());
    assert_eq!(setup.on_disk().entries().count(), 0);
    assert_eq!(std::fs::read_to_string(setup.workdir().join("two.txt")).unwrap(), "two");
}

#[tokio::test]
async fn a_task_canceled_before_its_claim_is_durable_never_starts() {
    let setup = Setup::new();
    let (mut agent, mut frames) = setup.agent();
    agent.on_frame(work("t1"));
    turn(&mut agent).await;
    let claim_id = sent(&mut frames)[0].0;
    agent.on_frame(batch(vec![
        answer(claim_id, grant("bash", json!({"command": "touch ran"}), "tok-1")),
        push(Answer::WorkCanceled(WorkCanceled { run_public_id: "run-1".into(), task_key: "t1".into() })),
    ]));
    turn(&mut agent).await;
    assert!(agent.tasks.is_empty() && agent.running.is_empty());
    let (_, commit, body) = commit_of(&sent(&mut frames));
    assert_eq!(commit.claim_token, "tok-1");
    assert_eq!(body["outcome"], "failed");
    assert!(!setup.workdir().join("ran").exists());
}

#[test]
fn coalescing_keeps_order_and_bounds() {
    use super::requests::{MAX_BATCH_BYTES, MAX_BATCH_FRAMES, coalesce};
    use prost::Message;

    let announce =
        RunnerFrame { request_id: 5, frame: Some(Request::Announce(nexus_proto::runner::v1::Announce::default())) };
    let big = RunnerFrame {
        request_id: 9,
        frame: Some(Request::Progress(nexus_proto::runner::v1::Progress {
            frame_json: "x".repeat(MAX_BATCH_BYTES),
            ..Default::default()
        })),
    };
    let frames = vec![
        claim_frame(2, "a"),
        announce.clone(),
        claim_frame(3, "b"),
        claim_frame(4, "c"),
        big.clone(),
        claim_frame(6, "d"),
    ];
    let out = coalesce(frames);
    assert_eq!(out.len(), 5);
    assert_eq!(out[0], claim_frame(2, "a"), "a frame alone goes as itself");
    assert_eq!(out[1], announce, "announce never goes in a batch");
    assert_eq!(inner_frames(&out[2]).unwrap(), [claim_frame(3, "b"), claim_frame(4, "c")]);
    assert_eq!(out[3], big, "a frame over the byte bound goes alone");
    assert_eq!(out[4], claim_frame(6, "d"));

    let many: Vec<RunnerFrame> = (0..600).map(|n| claim_frame(n + 2, &format!("t{n}"))).collect();
    let out = coalesce(many.clone());
    let sizes: Vec<usize> = out.iter().map(|frame| inner_frames(frame).unwrap().len()).collect();
    assert_eq!(sizes, [MAX_BATCH_FRAMES, MAX_BATCH_FRAMES, 600 - 2 * MAX_BATCH_FRAMES]);
    let flattened: Vec<RunnerFrame> = out.iter().flat_map(|frame| inner_frames(frame).unwrap().to_vec()).collect();
    assert_eq!(flattened, many, "nothing lost or reordered");

    let commit = |n: u64| RunnerFrame {
        request_id: n,
        frame: Some(Request::Commit(Commit { body_json: "y".repeat(400_000), ..Default::default() })),
    };
    let out = coalesce((1..=5).map(commit).collect());
    let sizes: Vec<usize> = out.iter().map(|frame| inner_frames(frame).map_or(1, <[_]>::len)).collect();
    assert_eq!(sizes, [2, 2, 1]);
    assert!(out.iter().all(|frame| frame.encoded_len() <= MAX_BATCH_BYTES + 16));
}

#[tokio::test]
async fn a_claim_the_journal_could_not_keep_is_not_run_and_fails() {
    let setup = Setup::new();
    let (mut agent, mut frames) = setup.agent();
    agent.on_frame(work("t1"));
    turn(&mut agent).await;
    let claim_id = sent(&mut frames)[0].0;

    agent.journal.writer_mut().fail_after_bytes = Some(7);
    agent.on_frame(answer(claim_id, grant("bash", json!({"command": "touch ran"}), "tok-1")));
    turn(&mut agent).await;
    assert!(agent.tasks.is_empty() && agent.running.is_empty(), "the tool never started");
    let (_, commit, body) = commit_of(&sent(&mut frames));
    assert_eq!(commit.claim_token, "tok-1");
    assert_eq!(body["outcome"], "failed");
    assert!(body["content"].as_str().unwrap().contains("journal"), "{body}");
    assert!(!setup.workdir().join("ran").exists());
    // The next flush rewrote the log whole: the partial line is gone and the result is kept.
    let on_disk = setup.on_disk();
    assert!(matches!(on_disk.get(&key("t1")).unwrap().state, EntryState::CommitPending { .. }));
}

fn work_for(task: &str, tool_name: &str) -> NexusFrame {
    push(Answer::WorkAvailable(WorkAvailable {
        kind: InboxKind::ToolCall.as_str().into(),
        run_public_id: "run-1".into(),
        task_key: task.into(),
        tool_name: tool_name.into(),
    }))
}

const READ_ONLY: &str = r#"effect_profile = { kind = "read_only", destructive = false, effect_scope = "closed", idempotency = "intrinsic", reconciliation = "none" }"#;

/// A tools file beside the setup's state dir, served by the agent.
fn with_tools_file(setup: &mut Setup, text: &str) -> PathBuf {
    let path = setup._dir.path().join("tools.toml");
    std::fs::write(&path, text).unwrap();
    setup.config.tools_file = Some(path.clone());
    path
}

fn command_tool(name: &str, script: &str, extra: &str) -> String {
    format!(
        "[[tool]]\nname = \"{name}\"\ndescription = \"d\"\ncommand = [\"sh\", \"-c\", {script:?}]\n{READ_ONLY}\n{extra}\n"
    )
}

#[tokio::test]
async fn a_tool_at_its_max_concurrency_waits_in_line_while_other_tools_are_claimed() {
    let mut setup = Setup::new();
    setup.config.slots = 4;
    with_tools_file(&mut setup, &command_tool("tool_a", "cat > /dev/null; echo a-done", "max_concurrency = 1"));
    let (mut agent, mut frames) = setup.agent();
    agent.on_frame(batch(vec![work_for("a1", "tool_a"), work_for("a2", "tool_a"), work_for("b1", "bash")]));
    turn(&mut agent).await;
    let first = sent(&mut frames);
    assert_eq!(claimed_tasks(&first), ["a1", "b1"], "the second call of tool_a waits; bash's is claimed");
    assert_eq!(agent.hints.iter().map(|hint| hint.key.task_key.as_str()).collect::<Vec<_>>(), ["a2"]);

    // While a1 runs, neither a grant nor a finish of another tool lets a2 go.
    let (a1, b1) = (first[0].0, first[1].0);
    agent.on_frame(batch(vec![
        answer(a1, grant("tool_a", json!({}), "tok-a1")),
        answer(b1, grant("bash", json!({"command": "true"}), "tok-b1")),
    ]));
    turn(&mut agent).await;
    assert!(claimed_tasks(&sent(&mut frames)).is_empty());
    assert_eq!(agent.running.len(), 2);
    let mut finished_tools = Vec::new();
    let mut a2_claimed_after = None;
    for _ in 0..2 {
        let joined = tokio::time::timeout(Duration::from_secs(10), agent.tasks.join_next()).await;
        let finished = joined.unwrap().unwrap().unwrap();
        finished_tools.push(finished.key.task_key.clone());
        agent.on_tool_finished(finished);
        turn(&mut agent).await;
        if claimed_tasks(&sent(&mut frames)) == ["a2"] {
            a2_claimed_after = Some(finished_tools.clone());
        }
    }
    let claimed_after = a2_claimed_after.expect("a2 was claimed once a1 finished");
    assert_eq!(
        claimed_after.last().map(String::as_str),
        Some("a1"),
        "claimed right after a1 finished: {claimed_after:?}"
    );
    assert!(agent.hints.is_empty());

    // A refused claim gives its place back too.
    agent.on_frame(batch(vec![work_for("a3", "tool_a")]));
    turn(&mut agent).await;
    assert!(claimed_tasks(&sent(&mut frames)).is_empty(), "a2's claim is in flight");
    let a2 = agent.link.as_ref().unwrap().pending.iter().find_map(|(id, (pending, _))| match pending {
        Pending::Claim(key, _) if key.task_key == "a2" => Some(*id),
        _ => None,
    });
    agent.on_frame(answer(a2.expect("a2's claim is pending"), refusal("already_claimed", 409)));
    turn(&mut agent).await;
    assert_eq!(claimed_tasks(&sent(&mut frames)), ["a3"]);
}

#[tokio::test]
async fn a_command_tool_from_the_file_runs_through_a_claim() {
    let mut setup = Setup::new();
    let script = r#"exec python3 -c 'import json, os, sys; d = json.load(sys.stdin); print(json.dumps({"content": "hello " + d["who"], "structured_content": {"task": os.environ["NEXUS_TASK_KEY"]}}))'"#;
    with_tools_file(&mut setup, &command_tool("greet", script, ""));
    let (mut agent, mut frames) = setup.agent();
    agent.after_connect();
    turn(&mut agent).await;
    let announced = sent(&mut frames);
    let Request::Announce(announce) = &announced[0].1 else { panic!("announce first") };
    let body: Value = serde_json::from_str(&announce.body_json).unwrap();
    let names: Vec<&str> = body["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    let builtins = crate::tools::Builtin::ALL.len() - 1;
    assert_eq!(names[..4], ["bash", "read_file", "write_file", "list_dir"]);
    assert_eq!((names.len(), names[builtins]), (builtins + 1, "greet"), "the built-ins but web_fetch, then greet");
    assert!(body["tools"][builtins].get("max_concurrency").is_none());

    agent.on_frame(work_for("g1", "greet"));
    turn(&mut agent).await;
    let claim_id = sent(&mut frames)[0].0;
    agent.on_frame(answer(claim_id, grant("greet", json!({"who": "x"}), "tok-g1")));
    turn(&mut agent).await;
    finish_next(&mut agent).await;
    let (_, commit, body) = commit_of(&sent(&mut frames));
    assert_eq!(commit.claim_token, "tok-g1");
    assert_eq!(body["content"], "hello x");
    assert_eq!(body["structured_content"], json!({"task": "g1"}));
    assert_eq!(body["is_error"], false);
}

#[tokio::test]
async fn a_changed_file_is_announced_again_and_a_bad_one_keeps_the_old_tools() {
    let mut setup = Setup::new();
    let path = with_tools_file(&mut setup, &command_tool("one", "echo one", ""));
    let (mut agent, mut frames) = setup.agent();

    async fn reload(agent: &mut Agent, cause: ReloadCause) {
        agent.start_reload(cause);
        let reloaded = tokio::time::timeout(Duration::from_secs(10), reload::poll_reload(&mut agent.reload)).await;
        agent.on_reloaded(reloaded.expect("the reload ended in time"));
        if agent.catalog.has_changed().unwrap() {
            agent.on_catalog_changed();
        }
        turn(agent).await;
    }
    fn announced_names(frames: &[(u64, runner_frame::Frame)]) -> Vec<Vec<String>> {
        frames
            .iter()
            .filter_map(|(_, frame)| match frame {
                Request::Announce(announce) => {
                    let body: Value = serde_json::from_str(&announce.body_json).unwrap();
                    let tools = body["tools"].as_array().unwrap().iter();
                    let names = tools.map(|t| t["name"].as_str().unwrap().to_owned());
                    Some(names.filter(|name| crate::tools::Builtin::from_name(name).is_none()).collect())
                }
                _ => None,
            })
            .collect()
    }

    // The same bytes: nothing to announce.
    reload(&mut agent, ReloadCause::Tick).await;
    assert!(sent(&mut frames).is_empty());

    // New bytes: the new catalog is announced at once.
    std::fs::write(&path, command_tool("one", "echo one", "") + &command_tool("two", "echo two", "")).unwrap();
    reload(&mut agent, ReloadCause::Tick).await;
    assert_eq!(announced_names(&sent(&mut frames)), [["one", "two"]]);

    // A bad file: no announce, and the tools stay.
    std::fs::write(&path, command_tool("one", "echo one", "timeout_ms = 0")).unwrap();
    reload(&mut agent, ReloadCause::Tick).await;
    reload(&mut agent, ReloadCause::Hangup).await;
    assert!(sent(&mut frames).is_empty());
    let refusal = agent.reload_refusal.clone().expect("the refusal is kept");
    assert_eq!(
        (refusal.problem, refusal.field.as_deref(), refusal.location.map(|l| l.0)),
        (Problem::InvalidTimeout, Some("tool[0].timeout_ms"), Some(6))
    );
    assert!(agent.toolbox.catalog().get("two").is_some());

    // A call already running keeps its tool when the file takes it away.
    std::fs::write(&path, command_tool("two", "sleep 0.3; echo still-two", "")).unwrap();
    reload(&mut agent, ReloadCause::Tick).await;
    agent.on_frame(work_for("t2", "two"));
    turn(&mut agent).await;
    let claim_id = claimed_ids(&sent(&mut frames));
    agent.on_frame(answer(claim_id, grant("two", json!({}), "tok-t2")));
    turn(&mut agent).await;
    assert_eq!(agent.tasks.len(), 1);
    std::fs::write(&path, command_tool("three", "echo three", "")).unwrap();
    reload(&mut agent, ReloadCause::Tick).await;
    assert_eq!(announced_names(&sent(&mut frames)), [["three"]]);
    finish_next(&mut agent).await;
    let (_, _, body) = commit_of(&sent(&mut frames));
    assert_eq!(body["content"], "still-two\n");

    // SIGHUP serves the same bytes again, announced again; without a link nothing is sent, and
    // the next connect announces the catalog.
    reload(&mut agent, ReloadCause::Hangup).await;
    assert_eq!(announced_names(&sent(&mut frames)), [["three"]]);
    agent.link = None;
    std::fs::write(&path, command_tool("four", "echo four", "")).unwrap();
    reload(&mut agent, ReloadCause::Tick).await;
    let (outbound, mut frames) = mpsc::channel(64);
    agent.attach(outbound, Duration::from_secs(45));
    agent.after_connect();
    turn(&mut agent).await;
    assert_eq!(announced_names(&sent(&mut frames)), [["four"]]);
}

fn claimed_ids(frames: &[(u64, runner_frame::Frame)]) -> u64 {
    frames.iter().find_map(|(id, frame)| matches!(frame, Request::Claim(_)).then_some(*id)).expect("a claim")
}

#[tokio::test]
async fn a_refused_announcement_is_logged_and_the_agent_keeps_working() {
    let setup = Setup::new();
    let (mut agent, mut frames) = setup.agent();
    agent.after_connect();
    turn(&mut agent).await;
    let announce_id = sent(&mut frames)[0].0;
    agent.on_frame(answer(announce_id, refusal("validation_failed", 422)));
    turn(&mut agent).await;
    assert!(agent.link.is_some(), "the stream stays");
    assert!(agent.link.as_ref().unwrap().pending.is_empty());
    agent.on_frame(work("t1"));
    turn(&mut agent).await;
    assert_eq!(claimed_tasks(&sent(&mut frames)), ["t1"]);
}

#[test]
fn a_bad_tools_file_stops_the_agent_before_it_starts() {
    let mut setup = Setup::new();
    with_tools_file(&mut setup, &command_tool("bash", "true", ""));
    let Err(AgentError::Config(ConfigError::ToolsFile { source })) = Agent::new(setup.config.clone()) else {
        panic!("a tool named bash was accepted");
    };
    assert_eq!(
        (source.problem, source.field.as_deref(), source.location),
        (Problem::InvalidName, Some("tool[0].name"), Some((2, 8)))
    );
    setup.config.tools_file = Some(setup._dir.path().join("missing.toml"));
    let Err(AgentError::Config(ConfigError::ToolsFile { source })) = Agent::new(setup.config.clone()) else {
        panic!("a missing file was accepted");
    };
    assert_eq!(source.problem, Problem::Unreadable);
}
