//! The claim journal: every claim this runner holds and every result it has not yet had
//! acknowledged, kept in `<state-dir>/journal.json` so that a restart neither loses a result nor
//! runs a tool twice.
//!
//! The file is one JSON document, rewritten whole and atomically (temp file, fsync, rename, fsync
//! of the directory) after every change:
//!
//! ```json
//! {
//!   "version": 1,
//!   "runner_id": "6f1c…",
//!   "entries": [
//!     {"run_public_id": "…", "task_key": "…", "tool_name": "bash", "claim_token": "…",
//!      "deadline_at_ms": 1767225600000, "state": "running"},
//!     {"run_public_id": "…", "task_key": "…", "tool_name": "read_file", "claim_token": "…",
//!      "deadline_at_ms": 1767225600000, "state": "commit_pending",
//!      "body": {"content": "…", "structured_content": {}, "is_error": false}, "fallback": false}
//!   ]
//! }
//! ```
//!
//! Rules the agent keeps with it: an entry is written `running` before its tool starts and
//! `commit_pending` (with the body) before the commit is sent; it is removed when nexus answers
//! the commit or refuses it for good, or once its deadline has passed. A `running` entry found at
//! start-up belongs to a tool that was interrupted: it is never run again, and nexus settles it by
//! expiry.
//!
//! One runner-agent at a time owns a state directory: [`lock_state_dir`] takes an exclusive
//! advisory lock on `<state-dir>/runner-agent.lock` for the life of the process, so a second
//! runner-agent on the same directory stops at once instead of writing the same journal.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The journal's file name inside the state directory.
pub const JOURNAL_FILE: &str = "journal.json";
/// The lock file inside the state directory; it holds the owner's pid, for the operator.
pub const LOCK_FILE: &str = "runner-agent.lock";
const FORMAT_VERSION: u32 = 1;

/// Identifies one task: the run it belongs to and its key inside that run.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskKey {
    /// The run's public id.
    pub run_public_id: String,
    /// The task's key within the run.
    pub task_key: String,
}

/// Where a journaled claim stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum EntryState {
    /// Claimed, and its tool started (or was about to) but produced no result yet.
    Running,
    /// The tool finished; `body` is the commit body, not yet acknowledged by nexus.
    CommitPending {
        /// The commit body: `{content, structured_content, is_error}` or
        /// `{outcome: "failed", content}`.
        body: serde_json::Value,
        /// True when `body` is the short error that replaced a result nexus refused as
        /// malformed; a second refusal drops the entry.
        #[serde(default)]
        fallback: bool,
    },
}

/// One claimed task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// The task.
    #[serde(flatten)]
    pub key: TaskKey,
    /// The tool that was claimed.
    pub tool_name: String,
    /// The claim token nexus granted; commits carry it.
    pub claim_token: String,
    /// The claim deadline, Unix milliseconds (moved by a successful extend).
    pub deadline_at_ms: i64,
    /// Running, or waiting for its commit to be acknowledged.
    #[serde(flatten)]
    pub state: EntryState,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JournalFile {
    version: u32,
    runner_id: Uuid,
    entries: Vec<JournalEntry>,
}

/// The journal failed to load or to persist.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The state directory or journal file could not be read or written.
    #[error("journal i/o at {path}: {error}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The I/O failure.
        error: std::io::Error,
    },
    /// The journal file is not a journal this build understands. It is left untouched: move it
    /// aside to start empty (its running tasks then settle by expiry on nexus).
    #[error("unreadable journal {path}: {reason}")]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Another runner-agent holds the state directory's lock: two processes would fence each
    /// other's streams and overwrite each other's journal.
    #[error(
        "another runner-agent holds {path} (pid {}): stop it, or give this one its own --state-dir",
        pid.map_or_else(|| "unknown".to_owned(), |pid| pid.to_string())
    )]
    InUse {
        /// The state directory.
        path: PathBuf,
        /// The holder's pid, as it recorded it (absent while it is still writing it).
        pid: Option<u32>,
    },
    /// The journal belongs to another runner: two runners must not share a state directory.
    #[error("journal {path} belongs to runner {found}, not {expected}")]
    WrongRunner {
        /// The journal file.
        path: PathBuf,
        /// The runner it records.
        found: Uuid,
        /// The runner this agent runs as.
        expected: Uuid,
    },
}

/// The exclusive lock on a state directory, held until this value drops (or the process dies:
/// the kernel releases it then, so a killed runner-agent leaves no stale lock behind).
#[derive(Debug)]
pub struct StateDirLock {
    _file: std::fs::File,
}

/// Takes the exclusive lock on `state_dir` (creating the directory if needed) and records this
/// process's pid in it. Never waits.
///
/// # Errors
/// [`JournalError::InUse`] when another process holds it, with that process's pid when it is
/// known, and [`JournalError::Io`] when the directory or lock file cannot be used.
pub fn lock_state_dir(state_dir: &Path) -> Result<StateDirLock, JournalError> {
    std::fs::create_dir_all(state_dir).map_err(|error| JournalError::Io { path: state_dir.to_owned(), error })?;
    let path = state_dir.join(LOCK_FILE);
    let io = |error| JournalError::Io { path: path.clone(), error };
    let mut file =
        std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path).map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let pid = file.read_to_string(&mut text).ok().and_then(|_| text.trim().parse().ok());
            return Err(JournalError::InUse { path: state_dir.to_owned(), pid });
        }
        Err(std::fs::TryLockError::Error(error)) => return Err(io(error)),
    }
    file.set_len(0).map_err(io)?;
    file.write_all(format!("{}\n", std::process::id()).as_bytes()).map_err(io)?;
    Ok(StateDirLock { _file: file })
}

/// The in-memory journal; mutate it, then [`persist`](Journal::persist) it.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    runner_id: Uuid,
    entries: BTreeMap<TaskKey, JournalEntry>,
}

impl Journal {
    /// Opens (creating the directory if needed) the journal in `state_dir`. A missing file is an
    /// empty journal.
    ///
    /// # Errors
    /// [`JournalError::Io`] when the directory or file cannot be read,
    /// [`JournalError::Corrupt`] for an unparsable file or unknown version, and
    /// [`JournalError::WrongRunner`] when the file names another runner.
    pub fn open(state_dir: &Path, runner_id: Uuid) -> Result<Journal, JournalError> {
        std::fs::create_dir_all(state_dir).map_err(|error| JournalError::Io { path: state_dir.to_owned(), error })?;
        let path = state_dir.join(JOURNAL_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Journal { path, runner_id, entries: BTreeMap::new() });
            }
            Err(error) => return Err(JournalError::Io { path, error }),
        };
        let file: JournalFile = serde_json::from_slice(&bytes)
            .map_err(|err| JournalError::Corrupt { path: path.clone(), reason: err.to_string() })?;
        if file.version != FORMAT_VERSION {
            let reason = format!("version {} (this build reads {FORMAT_VERSION})", file.version);
            return Err(JournalError::Corrupt { path, reason });
        }
        if file.runner_id != runner_id {
            return Err(JournalError::WrongRunner { path, found: file.runner_id, expected: runner_id });
        }
        let entries = file.entries.into_iter().map(|entry| (entry.key.clone(), entry)).collect();
        Ok(Journal { path, runner_id, entries })
    }

    /// The journal file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every entry, ordered by run then task key.
    pub fn entries(&self) -> impl Iterator<Item = &JournalEntry> {
        self.entries.values()
    }

    /// The entry for `key`, if journaled.
    pub fn get(&self, key: &TaskKey) -> Option<&JournalEntry> {
        self.entries.get(key)
    }

    pub(crate) fn contains(&self, key: &TaskKey) -> bool {
        self.entries.contains_key(key)
    }

    pub(crate) fn get_mut(&mut self, key: &TaskKey) -> Option<&mut JournalEntry> {
        self.entries.get_mut(key)
    }

    pub(crate) fn insert(&mut self, entry: JournalEntry) {
        self.entries.insert(entry.key.clone(), entry);
    }

    pub(crate) fn remove(&mut self, key: &TaskKey) -> Option<JournalEntry> {
        self.entries.remove(key)
    }

    /// Removes the entries `expired` selects, returning them.
    pub(crate) fn remove_where(&mut self, mut expired: impl FnMut(&JournalEntry) -> bool) -> Vec<JournalEntry> {
        let keys: Vec<TaskKey> = self.entries.values().filter(|entry| expired(entry)).map(|e| e.key.clone()).collect();
        keys.iter().filter_map(|key| self.entries.remove(key)).collect()
    }

    /// Writes the whole journal atomically: a temp file beside it, fsync, rename over the old
    /// file, fsync of the directory. Runs on the blocking pool.
    ///
    /// # Errors
    /// [`JournalError::Io`] when any step fails; the previous file is then still intact.
    pub async fn persist(&self) -> Result<(), JournalError> {
        let file = JournalFile {
            version: FORMAT_VERSION,
            runner_id: self.runner_id,
            entries: self.entries.values().cloned().collect(),
        };
        let bytes = serde_json::to_vec_pretty(&file)
            .map_err(|err| JournalError::Corrupt { path: self.path.clone(), reason: err.to_string() })?;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&path, &bytes)).await.map_err(|err| JournalError::Io {
            path: self.path.clone(),
            error: std::io::Error::other(err.to_string()),
        })?
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), JournalError> {
    let io = |error| JournalError::Io { path: path.to_owned(), error };
    let temp = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&temp).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&temp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|dir| dir.sync_all()).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn key(task: &str) -> TaskKey {
        TaskKey { run_public_id: "run-1".into(), task_key: task.into() }
    }

    #[test]
    fn one_holder_at_a_time_locks_a_state_dir() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let held = lock_state_dir(&state).unwrap();
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
    async fn journal_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let runner = Uuid::from_u128(1);
        let mut journal = Journal::open(&dir.path().join("state"), runner).unwrap();
        assert_eq!(journal.entries().count(), 0);
        journal.insert(JournalEntry {
            key: key("a"),
            tool_name: "bash".into(),
            claim_token: "tok-a".into(),
            deadline_at_ms: 1_000,
            state: EntryState::Running,
        });
        let body = json!({"content": "hi", "structured_content": {"n": 1}, "is_error": false});
        journal.insert(JournalEntry {
            key: key("b"),
            tool_name: "read_file".into(),
            claim_token: "tok-b".into(),
            deadline_at_ms: 2_000,
            state: EntryState::CommitPending { body: body.clone(), fallback: false },
        });
        journal.persist().await.unwrap();
        assert!(!journal.path().with_extension("json.tmp").exists());

        let reopened = Journal::open(&dir.path().join("state"), runner).unwrap();
        let entries: Vec<_> = reopened.entries().cloned().collect();
        assert_eq!(entries, journal.entries().cloned().collect::<Vec<_>>());
        assert_eq!(entries[0].state, EntryState::Running);
        assert_eq!(entries[1].state, EntryState::CommitPending { body, fallback: false });
        assert_eq!(reopened.get(&key("a")).unwrap().claim_token, "tok-a");

        // The file is the documented shape: flat entries with a `state` tag.
        let raw: serde_json::Value = serde_json::from_slice(&std::fs::read(journal.path()).unwrap()).unwrap();
        assert_eq!(raw["version"], 1);
        assert_eq!(raw["runner_id"], runner.to_string());
        assert_eq!(raw["entries"][0]["task_key"], "a");
        assert_eq!(raw["entries"][0]["state"], "running");
        assert_eq!(raw["entries"][1]["state"], "commit_pending");
        assert_eq!(raw["entries"][1]["body"]["content"], "hi");
    }

    #[tokio::test]
    async fn journal_refuses_another_runner_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), Uuid::from_u128(1)).unwrap();
        journal.persist().await.unwrap();
        assert!(matches!(Journal::open(dir.path(), Uuid::from_u128(2)), Err(JournalError::WrongRunner { .. })));
        std::fs::write(dir.path().join(JOURNAL_FILE), b"{not json").unwrap();
        assert!(matches!(Journal::open(dir.path(), Uuid::from_u128(1)), Err(JournalError::Corrupt { .. })));
    }

    #[test]
    fn remove_where_returns_what_it_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path(), Uuid::nil()).unwrap();
        for (task, deadline) in [("a", 10), ("b", 20), ("c", 30)] {
            journal.insert(JournalEntry {
                key: key(task),
                tool_name: "bash".into(),
                claim_token: format!("tok-{task}"),
                deadline_at_ms: deadline,
                state: EntryState::Running,
            });
        }
        let removed = journal.remove_where(|entry| entry.deadline_at_ms < 25);
        let removed: Vec<&str> = removed.iter().map(|e| e.key.task_key.as_str()).collect();
        assert_eq!(removed, ["a", "b"]);
        assert!(journal.contains(&key("c")));
        assert!(!journal.contains(&key("a")));
    }
}
