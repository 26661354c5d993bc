//! The store on the backend the suite runs on (`NEXUS_TEST_STORE`): the claim is single-winner
//! at the database, so two stores opened on one PostgreSQL database can never both grant it
//! (one node serves a database at a time, `store::lock`; the rule holds below that lock too).

use nexus_proto::{ErrorCode, ExecutionId, TaskStatus};
use nexus_tests::key;
use std::sync::Arc;

use serde_json::json;
use sqlx::{AnyConnection, Connection, Row};
use tempfile::TempDir;
use tokio::sync::Barrier;

use nexus_actors::clock::Clock;
use nexus_actors::config::StoreConfig;
use nexus_actors::model::{ChatMessage, ToolCall};
use nexus_actors::store::{InputRow, Store, StoreBackend, StoreError, TaskRow, TranscriptWrite};
use nexus_tests::{TestDatabase, test_store_backend};

/// A store on the suite's backend; the data dir and database live as long as the returned guards.
async fn open_store() -> (Store, StoreConfig, TempDir, Option<TestDatabase>) {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let database = match test_store_backend() {
        StoreBackend::Postgres => Some(TestDatabase::create().await),
        _ => None,
    };
    let config = StoreConfig { database_url: database.as_ref().map(|d| d.url().to_owned()), ..StoreConfig::default() };
    let store = Store::connect(data_dir.path(), &config).await.expect("store opens");
    assert_eq!(store.backend(), test_store_backend());
    (store, config, data_dir, database)
}

fn task(run: ExecutionId, runner: nexus_proto::RunnerId) -> TaskRow {
    let now = Clock::system().now_ms();
    TaskRow {
        run_public_id: run,
        task_key: key("r1t0"),
        kind: nexus_proto::TaskKind::ToolTask,
        round: 1,
        callable_name: "probe".into(),
        tool_name: "probe".into(),
        tool_input: json!({"depth": 1}),
        tool_call_id: "c1".into(),
        target_executor_public_id: Some(runner),
        effect_profile: None,
        timeout_ms: 60_000,
        status: TaskStatus::Dispatched,
        claimed: false,
        claim_token_digest: None,
        started_at: now,
        deadline_at: now + 60_000,
        result: None,
        error_key: None,
        settled_at: None,
        approval: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_granted_once_across_nodes_sharing_the_store() {
    let (store, config, data_dir, _database) = open_store().await;
    let input = InputRow {
        public_id: nexus_proto::InputId::new_v4(),
        conversation_public_id: nexus_proto::ConversationId::new_v4(),
        member_public_id: nexus_proto::MemberId::new_v4(),
        text: "probe".into(),
        execution_declaration: None,
        runner_executor_public_id: None,
        tool_names: None,
        posted_by_public_id: None,
        variables: None,
        budget: None,
        turn: 0,
        deliver_at: None,
    };
    let run = ExecutionId::new_v4();
    store.admit_input(&input, true, run).await.expect("admit");
    let execution = store.execution(run).await.expect("read").expect("execution");
    let open = task(run, nexus_proto::RunnerId::new_v4());
    store
        .save_execution(&execution, TranscriptWrite::Unchanged, std::slice::from_ref(&open), &[])
        .await
        .expect("dispatch");

    // A second node: its own pool on the same database (on SQLite, the same file).
    let other = Store::connect(data_dir.path(), &config).await.expect("second node");
    let barrier = Arc::new(Barrier::new(2));
    let claims = [(store.clone(), "token-a"), (other.clone(), "token-b")].map(|(node, token)| {
        let barrier = barrier.clone();
        // Both nodes saw the task unclaimed.
        let mut granted = open.clone();
        granted.claimed = true;
        granted.claim_token_digest = Some(nexus_actors::auth::digest(token));
        tokio::spawn(async move {
            barrier.wait().await;
            node.update_task(&granted).await
        })
    });
    let mut won = Vec::new();
    for (claim, token) in claims.into_iter().zip(["token-a", "token-b"]) {
        match claim.await.expect("claim task") {
            Ok(()) => won.push(token),
            Err(StoreError::Conflict(_)) => {}
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(won.len(), 1, "exactly one node wins the claim: {won:?}");
    let stored = store.task(run, key("r1t0")).await.expect("read").expect("task");
    assert_eq!(stored.claim_token_digest, Some(nexus_actors::auth::digest(won[0])));

    // A stale copy (still unclaimed) can neither settle nor re-grant the claimed task; the
    // claimant's own writes go through.
    let mut stale = open.clone();
    stale.status = TaskStatus::TimedOut;
    stale.settled_at = Some(Clock::system().now_ms());
    assert!(matches!(other.update_task(&stale).await, Err(StoreError::Conflict(_))));
    let mut settled = stored.clone();
    settled.status = TaskStatus::Completed;
    settled.result = Some(json!({"content": "ok"}));
    settled.settled_at = Some(Clock::system().now_ms());
    store.update_task(&settled).await.expect("the claimant commits");
    assert_eq!(other.task(run, key("r1t0")).await.expect("read").expect("task"), settled);
    // Writing a task that does not exist stays a no-op.
    other.update_task(&task(ExecutionId::new_v4(), nexus_proto::RunnerId::new_v4())).await.expect("no row, no error");
    other.close().await;
    store.close().await;
}

#[tokio::test]
async fn an_existing_store_is_required_where_one_is_expected() {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let database = match test_store_backend() {
        StoreBackend::Postgres => Some(TestDatabase::create().await),
        _ => None,
    };
    let config = StoreConfig { database_url: database.as_ref().map(|d| d.url().to_owned()), ..StoreConfig::default() };
    let refused = Store::connect_existing(data_dir.path(), &config).await.expect_err("nothing there yet");
    assert!(refused.to_string().contains("nexus serve"), "{refused}");
    let store = Store::connect(data_dir.path(), &config).await.expect("created");
    let fingerprint = store.fingerprint().await.expect("fingerprint");
    store.close().await;
    let existing = Store::connect_existing(data_dir.path(), &config).await.expect("found");
    assert_eq!(existing.fingerprint().await.expect("fingerprint"), fingerprint, "reopening wrote nothing");
    existing.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_beside_a_busy_writer_never_fail_as_locked() {
    let (store, _config, _dir, _database) = open_store().await;
    let runner = nexus_proto::RunnerId::new_v4();
    let (_, credential) = nexus_actors::auth::mint(nexus_actors::auth::Plane::ExecutorTransport, runner.uuid());
    store.create_executor(runner, "busy", &credential).await.expect("runner");
    let busy = store.clone();
    let writer = tokio::spawn(async move {
        for i in 0..200 {
            busy.set_announcement(runner, &json!({"tools": [], "environment": {"i": i}, "documents": []}))
                .await
                .expect("announce");
        }
    });
    let mut minted = Vec::new();
    for i in 0..40 {
        let store = store.clone();
        minted.push(tokio::spawn(async move {
            nexus_actors::cli::admin::create_member(
                &store,
                nexus_actors::cli::admin::MemberKind::Agent,
                &format!("agent-{i}"),
            )
            .await
        }));
    }
    for handle in minted {
        let member = handle.await.expect("joins");
        assert!(member.is_ok(), "a write beside a busy writer failed: {member:?}");
    }
    writer.await.expect("writer");
    // A taken handle is still refused by the unique index.
    let again =
        nexus_actors::cli::admin::create_member(&store, nexus_actors::cli::admin::MemberKind::Agent, "agent-0").await;
    assert_eq!(again.map_err(|r| r.code).err(), Some(ErrorCode::ValidationFailed));
}

/// A connection of its own to the store's database, to write what an older nexus wrote.
async fn raw_connection(data_dir: &TempDir, config: &StoreConfig) -> AnyConnection {
    sqlx::any::install_default_drivers();
    let url = match &config.database_url {
        Some(url) => url.clone(),
        None => format!("sqlite://{}", data_dir.path().join("nexus.db").display()),
    };
    AnyConnection::connect(&url).await.expect("a raw connection")
}

/// `(legacy column, per-row messages)` of an execution as stored.
async fn stored_transcript(raw: &mut AnyConnection, run: ExecutionId) -> (String, i64) {
    let legacy = sqlx::query("SELECT transcript FROM executions WHERE public_id = $1")
        .bind(run.to_string())
        .fetch_one(&mut *raw)
        .await
        .expect("row")
        .get::<String, _>("transcript");
    let rows = sqlx::query("SELECT COUNT(*) AS n FROM transcript_messages WHERE execution_public_id = $1")
        .bind(run.to_string())
        .fetch_one(&mut *raw)
        .await
        .expect("count")
        .get::<i64, _>("n");
    (legacy, rows)
}

fn user(text: &str) -> ChatMessage {
    ChatMessage::User { content: text.to_owned() }
}

fn called(id: &str) -> ChatMessage {
    let call = ToolCall { id: id.to_owned(), name: "probe".to_owned(), arguments: "{}".to_owned(), model_id: None };
    ChatMessage::Assistant { content: None, tool_calls: vec![call] }
}

fn result(id: &str) -> ChatMessage {
    ChatMessage::Tool { tool_call_id: id.to_owned(), content: format!("result of {id}") }
}

#[tokio::test]
async fn a_transcript_written_whole_reads_back_and_saves_move_it_to_rows() {
    let (store, config, data_dir, _database) = open_store().await;
    let input = InputRow {
        public_id: nexus_proto::InputId::new_v4(),
        conversation_public_id: nexus_proto::ConversationId::new_v4(),
        member_public_id: nexus_proto::MemberId::new_v4(),
        text: "first".into(),
        execution_declaration: None,
        runner_executor_public_id: None,
        tool_names: None,
        posted_by_public_id: None,
        variables: None,
        budget: None,
        turn: 0,
        deliver_at: None,
    };
    let run = ExecutionId::new_v4();
    store.admit_input(&input, true, run).await.expect("admit");
    let admitted = store.execution(run).await.expect("read").expect("execution");
    assert_eq!((admitted.transcript.clone(), admitted.transcript_stored), (json!([]), 0));

    // An execution as a nexus before per-row transcripts left it: the whole array in the row.
    let legacy = vec![user("first"), called("a"), result("a")];
    let mut raw = raw_connection(&data_dir, &config).await;
    sqlx::query("UPDATE executions SET transcript = $1 WHERE public_id = $2")
        .bind(serde_json::to_string(&legacy).expect("json"))
        .bind(run.to_string())
        .execute(&mut raw)
        .await
        .expect("legacy transcript");
    let read = store.execution(run).await.expect("read").expect("execution");
    assert_eq!((read.transcript.clone(), read.transcript_stored), (json!(legacy), 0), "read from the row");
    // A save that leaves the transcript alone leaves it there.
    store.save_execution(&read, TranscriptWrite::Unchanged, &[], &[]).await.expect("unchanged");
    assert_eq!(store.execution(run).await.expect("read").expect("execution").transcript, json!(legacy));

    // The next save writes every message per row (none were stored so) and empties the column.
    let mut transcript = legacy.clone();
    transcript.push(called("b"));
    let write = TranscriptWrite::Append { kept: 0, messages: &transcript };
    store.save_execution(&read, write, &[], &[]).await.expect("moved");
    let moved = store.execution(run).await.expect("read").expect("execution");
    assert_eq!((moved.transcript.clone(), moved.transcript_stored), (json!(transcript), 4));
    assert_eq!(stored_transcript(&mut raw, run).await, ("[]".to_owned(), 4));

    // An append writes the new message alone: the row's words, the id twice, the message.
    let before = store.save_bytes();
    let at_round = store.round_save_bytes(run, moved.round).expect("saved at this round");
    transcript.push(result("b"));
    let write = TranscriptWrite::Append { kept: 4, messages: &transcript[4..] };
    store.save_execution(&moved, write, &[], &[]).await.expect("appended");
    let message = serde_json::to_string(&transcript[4]).expect("json").len() as u64;
    let expected = (moved.status.as_str().len() + 2 * run.to_string().len()) as u64 + message;
    let after = store.save_bytes();
    assert_eq!((after.saves - before.saves, after.bytes - before.bytes), (1, expected));
    let now = store.round_save_bytes(run, moved.round).expect("saved at this round");
    assert_eq!((now.saves - at_round.saves, now.bytes - at_round.bytes), (1, expected));
    let appended = store.execution(run).await.expect("read").expect("execution");
    assert_eq!((appended.transcript.clone(), appended.transcript_stored), (json!(transcript), 5));

    // A rewrite (a compaction) replaces the messages after the ones it kept.
    let summary = ChatMessage::Assistant { content: Some("summary".into()), tool_calls: Vec::new() };
    let rewritten = vec![user("first"), summary, result("b")];
    let write = TranscriptWrite::Rewrite { kept: 1, messages: &rewritten[1..] };
    store.save_execution(&appended, write, &[], &[]).await.expect("rewritten");
    let compacted = store.execution(run).await.expect("read").expect("execution");
    assert_eq!((compacted.transcript.clone(), compacted.transcript_stored), (json!(rewritten), 3));
    assert_eq!(stored_transcript(&mut raw, run).await, ("[]".to_owned(), 3));
    // And it grows from there.
    let grown = [called("c")];
    store
        .save_execution(&compacted, TranscriptWrite::Append { kept: 3, messages: &grown }, &[], &[])
        .await
        .expect("appended after the rewrite");
    let last = store.execution(run).await.expect("read").expect("execution");
    assert_eq!(last.transcript.as_array().map(Vec::len), Some(4));
    assert_eq!(last.transcript[3], json!(grown[0]));
    // Appending where a message is already stored is refused, and nothing of that save is written.
    let clash = store.save_execution(&last, TranscriptWrite::Append { kept: 2, messages: &grown }, &[], &[]).await;
    assert!(clash.is_err(), "{clash:?}");
    assert_eq!(store.execution(run).await.expect("read").expect("execution"), last);
    raw.close().await.expect("close");
    store.close().await;
}
