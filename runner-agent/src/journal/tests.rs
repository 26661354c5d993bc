//! The journal's files on a real disk (a temp dir): round trip, torn tail, compaction, group
//! commit, crashes mid-write, and the migration of `journal.json`.

use serde_json::json;

use super::file::{CompactionPolicy, Record, encode_records};
use super::*;

const RUNNER: Uuid = Uuid::from_u128(1);

fn key(task: &str) -> TaskKey {
    TaskKey { run_public_id: "run-1".into(), task_key: task.into() }
}

fn running(task: &str, deadline_at_ms: i64) -> JournalEntry {
    JournalEntry {
        key: key(task),
        tool_name: "bash".into(),
        claim_token: format!("tok-{task}"),
        deadline_at_ms,
        state: EntryState::Running,
    }
}

fn pending(task: &str) -> JournalEntry {
    let body = json!({"content": format!("done {task}"), "structured_content": {"n": 1}, "is_error": false});
    JournalEntry { state: EntryState::CommitPending { body, fallback: false }, ..running(task, 2_000) }
}

fn writable(state_dir: &Path) -> (StateDirLock, Journal) {
    writable_with(state_dir, CompactionPolicy::default())
}

fn writable_with(state_dir: &Path, policy: CompactionPolicy) -> (StateDirLock, Journal) {
    let lock = lock_state_dir(state_dir).unwrap();
    let journal = Journal::open_writable_with(&lock, RUNNER, policy).unwrap();
    (lock, journal)
}

fn snapshot(state_dir: &Path) -> Vec<JournalEntry> {
    Journal::open(state_dir, RUNNER).unwrap().entries().cloned().collect()
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// Applies `records` to a journal and to a model of what it should hold.
fn apply(journal: &mut Journal, model: &mut BTreeMap<TaskKey, JournalEntry>, records: &[Record]) {
    for record in records {
        match record.clone() {
            Record::Upsert { entry } => {
                model.insert(entry.key.clone(), entry.clone());
                journal.insert(entry);
            }
            Record::Remove { key } => {
                model.remove(&key);
                journal.remove(&key);
            }
        }
    }
}

#[test]
fn one_holder_at_a_time_locks_a_state_dir() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let held = lock_state_dir(&state).unwrap();
    assert_eq!(held.dir(), state);
    match lock_state_dir(&state) {
        Err(JournalError::InUse { path, pid }) => {
            assert_eq!(path, state);
            assert_eq!(pid, Some(std::process::id()), "the holder's pid is named");
        }
        other => panic!("expected InUse, got {other:?}"),
    }
    drop(held);
    let again = lock_state_dir(&state).expect("a released lock is taken again");
    assert!(lock_state_dir(&dir.path().join("other")).is_ok(), "another state dir is free");
    drop(again);
}

#[tokio::test]
async fn journal_round_trips_through_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    assert!(snapshot(&state).is_empty(), "no state dir is an empty journal");
    let (lock, mut journal) = writable(&state);
    assert_eq!(journal.entries().count(), 0);
    journal.insert(running("a", 1_000));
    journal.insert(running("b", 1_500));
    journal.insert(running("gone", 1_500));
    let ticket = journal.update(&key("b"), |entry| *entry = pending("b")).unwrap();
    assert!(journal.has_unwritten(&key("b")));
    journal.remove(&key("gone"));
    assert!(journal.update(&key("gone"), |_| {}).is_none());
    journal.sync().await.unwrap();
    assert!(!journal.has_unwritten(&key("b")), "ticket {ticket:?} is written");
    assert!(journal.is_idle());

    let entries: Vec<_> = journal.entries().cloned().collect();
    assert_eq!(snapshot(&state), entries);
    assert_eq!(entries, [running("a", 1_000), pending("b")]);
    assert!(!state.join("journal.log.tmp").exists());

    // The file is the documented shape: a header, then one record per change.
    let raw = lines(journal.path());
    assert_eq!(raw[0], json!({"version": 2, "runner_id": RUNNER.to_string()}));
    assert_eq!(raw[1]["op"], "upsert");
    assert_eq!(raw[1]["entry"]["task_key"], "a");
    assert_eq!(raw[1]["entry"]["state"], "running");
    assert_eq!(raw[4]["entry"]["state"], "commit_pending");
    assert_eq!(raw[4]["entry"]["body"]["content"], "done b");
    assert_eq!(raw[5], json!({"op": "remove", "run_public_id": "run-1", "task_key": "gone"}));
    assert_eq!(raw.len(), 6);

    // Opening it again for writing compacts it to the live entries.
    drop(journal);
    let reopened = Journal::open_writable(&lock, RUNNER).unwrap();
    assert_eq!(reopened.entries().cloned().collect::<Vec<_>>(), entries);
    assert_eq!(lines(reopened.path()).len(), 3);
}

#[tokio::test]
async fn journal_refuses_another_runner_and_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let (lock, mut journal) = writable(dir.path());
    journal.insert(running("a", 1));
    journal.insert(running("b", 1));
    journal.sync().await.unwrap();
    drop(journal);
    assert!(matches!(Journal::open(dir.path(), Uuid::from_u128(2)), Err(JournalError::WrongRunner { .. })));
    assert!(matches!(Journal::open_writable(&lock, Uuid::from_u128(2)), Err(JournalError::WrongRunner { .. })));

    // A complete line that is no record, before the last line, names its file and line.
    let path = dir.path().join(JOURNAL_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut broken: Vec<&str> = text.lines().collect();
    broken[1] = "{\"op\":\"upsert\",\"entry\":";
    std::fs::write(&path, broken.join("\n") + "\n").unwrap();
    match Journal::open(dir.path(), RUNNER) {
        Err(JournalError::CorruptRecord { path: named, line, .. }) => assert_eq!((named, line), (path.clone(), 2)),
        other => panic!("expected a corrupt record, got {other:?}"),
    }
    // A writable open refuses it too, and leaves the file as it was.
    assert!(matches!(Journal::open_writable(&lock, RUNNER), Err(JournalError::CorruptRecord { line: 2, .. })));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), broken.join("\n") + "\n");

    std::fs::write(&path, "{\"version\":9,\"runner_id\":\"00000000-0000-0000-0000-000000000001\"}\n").unwrap();
    assert!(matches!(Journal::open(dir.path(), RUNNER), Err(JournalError::Corrupt { .. })));
    std::fs::write(&path, "").unwrap();
    assert!(matches!(Journal::open(dir.path(), RUNNER), Err(JournalError::Corrupt { .. })));
    std::fs::remove_file(&path).unwrap();
    std::fs::write(dir.path().join(LEGACY_JOURNAL_FILE), b"{not json").unwrap();
    assert!(matches!(Journal::open(dir.path(), RUNNER), Err(JournalError::Corrupt { .. })));
}

#[tokio::test]
async fn a_torn_last_record_is_ignored_and_dropped_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let (lock, mut journal) = writable(dir.path());
    journal.insert(running("a", 1));
    journal.sync().await.unwrap();
    drop(journal);

    // A crash in the middle of appending the next record.
    let path = dir.path().join(JOURNAL_FILE);
    let whole = std::fs::read(&path).unwrap();
    let torn = encode_records(&path, &[Record::Upsert { entry: pending("a") }]).unwrap();
    for cut in [1, torn.len() / 2, torn.len() - 1] {
        let mut bytes = whole.clone();
        bytes.extend_from_slice(&torn[..cut]);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(snapshot(dir.path()), [running("a", 1)], "cut at {cut}");
    }

    // Opening for writing rewrites the log without the torn bytes, so appends stay whole.
    let mut journal = Journal::open_writable(&lock, RUNNER).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), whole);
    journal.insert(running("b", 2));
    journal.sync().await.unwrap();
    assert_eq!(snapshot(dir.path()), [running("a", 1), running("b", 2)]);
}

#[tokio::test]
async fn records_of_one_flush_share_one_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let (_lock, mut journal) = writable(dir.path());
    // Opening compacts: the file, then the directory.
    assert_eq!(journal.fsyncs(), 2);
    for n in 0..100 {
        journal.insert(running(&format!("t{n:03}"), n));
    }
    for n in (0..100).step_by(2) {
        journal.remove(&key(&format!("t{n:03}")));
    }
    journal.start_flush();
    journal.start_flush(); // nothing more to hand over while one runs
    journal.insert(running("late", 7)); // queued behind the running flush
    let flushed = journal.flushed().await;
    flushed.result.unwrap();
    assert_eq!(journal.fsyncs(), 3, "150 records, one fsync");
    assert!(journal.has_unwritten(&key("late")));
    assert!(!journal.has_unwritten(&key("t001")));
    journal.sync().await.unwrap();
    assert_eq!(journal.fsyncs(), 4);
    assert_eq!(snapshot(dir.path()).len(), 51);
    assert_eq!(lines(journal.path()).len(), 1 + 150 + 1);
    journal.sync().await.unwrap();
    assert_eq!(journal.fsyncs(), 4, "nothing queued, nothing written");
}

#[tokio::test]
async fn compaction_keeps_exactly_the_live_set() {
    let dir = tempfile::tempdir().unwrap();
    let policy = CompactionPolicy { min_records: 8, min_bytes: u64::MAX, factor: 2 };
    let (_lock, mut journal) = writable_with(dir.path(), policy);
    for task in ["a", "b", "c"] {
        journal.insert(running(task, 0));
    }
    journal.sync().await.unwrap();
    let mut compactions = 0;
    for round in 1..=40 {
        // Churn: the live entries move, and short-lived ones come and go.
        journal.update(&key("a"), |entry| entry.deadline_at_ms = round);
        journal.insert(running(&format!("tmp{round}"), round));
        if round % 3 == 0 {
            journal.update(&key("b"), |entry| *entry = pending("b"));
        }
        journal.remove(&key(&format!("tmp{round}")));
        journal.sync().await.unwrap();

        let raw = lines(journal.path());
        assert!(raw.len() <= 1 + 8 + 4, "round {round}: the log stays bounded ({} lines)", raw.len());
        let on_disk = snapshot(dir.path());
        assert_eq!(on_disk, journal.entries().cloned().collect::<Vec<_>>(), "round {round}");
        if journal.writer_mut().records() == 3 {
            compactions += 1;
            // Just compacted: the header and one upsert per live entry, nothing else.
            let tasks: Vec<&str> = raw[1..].iter().map(|line| line["entry"]["task_key"].as_str().unwrap()).collect();
            assert_eq!(tasks, ["a", "b", "c"], "round {round}");
            assert!(raw[1..].iter().all(|line| line["op"] == "upsert"));
            assert_eq!(raw[1]["entry"]["deadline_at_ms"], round);
        }
    }
    assert!(compactions >= 5, "compacted {compactions} times");
    assert!(!dir.path().join("journal.log.tmp").exists());
}

#[tokio::test]
async fn a_crash_mid_append_loses_at_most_the_unacknowledged_records() {
    let base = [running("a", 1), running("b", 1)];
    let batch = [
        Record::Upsert { entry: pending("a") },
        Record::Upsert { entry: running("c", 3) },
        Record::Remove { key: key("b") },
    ];
    let scratch = tempfile::tempdir().unwrap();
    let bytes = encode_records(&scratch.path().join(JOURNAL_FILE), &batch).unwrap();
    let ends: Vec<usize> = bytes.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(at, _)| at + 1).collect();
    let mut cuts = vec![0, bytes.len()];
    for end in &ends {
        cuts.extend([end - 1, *end, end + 1]);
    }
    for cut in cuts.into_iter().filter(|cut| *cut <= bytes.len()) {
        let dir = tempfile::tempdir().unwrap();
        let (lock, mut journal) = writable(dir.path());
        let mut model = BTreeMap::new();
        let upserts: Vec<Record> = base.iter().cloned().map(|entry| Record::Upsert { entry }).collect();
        apply(&mut journal, &mut model, &upserts);
        journal.sync().await.unwrap();

        // The writer dies after `cut` bytes of the next batch; the process with it.
        let mut unacknowledged = BTreeMap::new();
        apply(&mut journal, &mut unacknowledged, &batch);
        journal.writer_mut().fail_after_bytes = Some(cut);
        journal.start_flush();
        assert!(journal.flushed().await.result.is_err());
        drop(journal);

        // What survives is the acknowledged state plus the whole lines that reached the disk.
        let whole_lines = ends.iter().filter(|end| **end <= cut).count();
        let mut expected = model.clone();
        for record in &batch[..whole_lines] {
            match record.clone() {
                Record::Upsert { entry } => expected.insert(entry.key.clone(), entry),
                Record::Remove { key } => expected.remove(&key),
            };
        }
        let expected: Vec<JournalEntry> = expected.into_values().collect();
        assert_eq!(snapshot(dir.path()), expected, "cut at {cut}");
        let reopened = Journal::open_writable(&lock, RUNNER).unwrap();
        assert_eq!(reopened.entries().cloned().collect::<Vec<_>>(), expected, "cut at {cut}");
    }
}

#[tokio::test]
async fn after_a_failed_append_the_next_flush_rewrites_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (_lock, mut journal) = writable(dir.path());
    journal.insert(running("a", 1));
    journal.sync().await.unwrap();
    journal.insert(running("b", 2));
    journal.writer_mut().fail_after_bytes = Some(10);
    assert!(journal.sync().await.is_err());
    // The partial line is on disk; the process lives on and writes more.
    journal.insert(running("c", 3));
    journal.sync().await.unwrap();
    let expected = [running("a", 1), running("b", 2), running("c", 3)];
    assert_eq!(snapshot(dir.path()), expected, "no partial line mid-log");
    assert_eq!(lines(journal.path()).len(), 4, "rewritten: a header and the three entries");
}

#[tokio::test]
async fn records_never_flushed_are_lost_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let (lock, mut journal) = writable(dir.path());
    journal.insert(running("a", 1));
    journal.sync().await.unwrap();
    journal.insert(pending("a"));
    journal.insert(running("b", 2));
    drop(journal); // a crash before the turn ended
    assert_eq!(snapshot(dir.path()), [running("a", 1)]);

    // A flush already running when the journal drops still completes on the blocking pool.
    let mut journal = Journal::open_writable(&lock, RUNNER).unwrap();
    journal.insert(running("b", 2));
    journal.start_flush();
    drop(journal);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while snapshot(dir.path()).len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "the running flush finished");
        tokio::task::yield_now().await;
    }
    assert_eq!(snapshot(dir.path()), [running("a", 1), running("b", 2)]);
}

#[tokio::test]
async fn an_old_journal_json_is_migrated_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (lock, mut journal) = writable(dir.path());
    journal.insert(running("from-log", 1));
    journal.insert(running("both", 1));
    journal.sync().await.unwrap();
    drop(journal);
    // As an older runner-agent (or one downgraded meanwhile) left it.
    let legacy = json!({
        "version": 1,
        "runner_id": RUNNER.to_string(),
        "entries": [serde_json::to_value(pending("both")).unwrap(), serde_json::to_value(running("json", 5)).unwrap()],
    });
    let legacy_path = dir.path().join(LEGACY_JOURNAL_FILE);
    std::fs::write(&legacy_path, serde_json::to_vec_pretty(&legacy).unwrap()).unwrap();
    let expected = [pending("both"), running("from-log", 1), running("json", 5)];
    assert_eq!(snapshot(dir.path()), expected, "a snapshot reads both, the old file on top");
    assert!(legacy_path.exists(), "a snapshot writes nothing");

    let journal = Journal::open_writable(&lock, RUNNER).unwrap();
    assert_eq!(journal.entries().cloned().collect::<Vec<_>>(), expected);
    assert!(!legacy_path.exists());
    assert_eq!(snapshot(dir.path()), expected);

    // A legacy file of another runner is refused, not migrated.
    drop(journal);
    let other = json!({"version": 1, "runner_id": Uuid::from_u128(9).to_string(), "entries": []});
    std::fs::write(&legacy_path, other.to_string()).unwrap();
    assert!(matches!(Journal::open_writable(&lock, RUNNER), Err(JournalError::WrongRunner { .. })));
    assert!(legacy_path.exists());
}

#[test]
fn remove_where_returns_what_it_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (_lock, mut journal) = writable(dir.path());
    for (task, deadline) in [("a", 10), ("b", 20), ("c", 30)] {
        journal.insert(running(task, deadline));
    }
    let removed = journal.remove_where(|entry| entry.deadline_at_ms < 25);
    let removed: Vec<&str> = removed.iter().map(|e| e.key.task_key.as_str()).collect();
    assert_eq!(removed, ["a", "b"]);
    assert!(journal.contains(&key("c")));
    assert!(!journal.contains(&key("a")));
}
