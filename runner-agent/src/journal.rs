//! The claim journal: every claim this runner holds and every result it has not yet had
//! acknowledged, kept in `<state-dir>/journal.log` so that a restart neither loses a result nor
//! runs a tool twice.
//!
//! The file is a log of JSON lines: a header naming the format and the runner, then one record
//! per change, each the entry as it now stands (`upsert`) or the removal of a task (`remove`).
//! The last record of a task wins; loading replays the lines in order.
//!
//! ```json
//! {"version":2,"runner_id":"6f1c…"}
//! {"op":"upsert","entry":{"run_public_id":"…","task_key":"…","tool_name":"bash","claim_token":"…","deadline_at_ms":1767225600000,"state":"running"}}
//! {"op":"upsert","entry":{"run_public_id":"…","task_key":"…","tool_name":"bash","claim_token":"…","deadline_at_ms":1767225600000,"state":"commit_pending","body":{"content":"…","structured_content":{},"is_error":false},"fallback":false}}
//! {"op":"remove","run_public_id":"…","task_key":"…"}
//! ```
//!
//! Writing: the agent's loop changes the journal in memory ([`Journal::insert`] and friends each
//! queue one record and return its [`Ticket`]), and at the end of each turn hands everything
//! queued to a blocking task that appends it and syncs once ([`Journal::start_flush`]); the loop
//! learns of the sync as an event ([`Journal::flushed`]). So every change of one turn shares one
//! fsync, and the loop never waits on the disk. Whatever must be durable before it happens waits
//! for its ticket: a tool starts only once its `running` entry is on disk, and a commit is sent
//! only once its `commit_pending` entry (with the body) is. While one flush runs, new records
//! queue for the next.
//!
//! Compaction: when the log's records outnumber both 1,024 and four times the live entries, or
//! its bytes exceed both 16 MiB and four times the live entries' bytes, the writer rewrites it
//! instead of appending: the header and one `upsert` per live entry into `journal.log.tmp`,
//! fsync, rename over the log, fsync of the directory. Opening the journal for writing always compacts, which also migrates
//! an old `journal.json` (version 1, one JSON document, whose entries win over the log's) and
//! removes it afterwards.
//!
//! Crashes: a record is written with its newline last, so a crash mid-write leaves at most a
//! partial last line; it was never acknowledged and loading ignores it. Any other line that does
//! not parse is [`JournalError::CorruptRecord`], naming the file and the line. A failed append
//! makes the next flush rewrite the whole file, so a partial line never ends up mid-log.
//!
//! Rules the agent keeps with it: an entry is written `running` before its tool starts and
//! `commit_pending` (with the body) before the commit is sent; it is removed when nexus answers
//! the commit or refuses it for good, or once its deadline has passed. A `running` entry found at
//! start-up belongs to a tool that was interrupted: it is never run again, and nexus settles it by
//! expiry.
//!
//! One runner-agent at a time owns a state directory: [`lock_state_dir`] takes an exclusive
//! advisory lock on `<state-dir>/runner-agent.lock` for the life of the process, so a second
//! runner-agent on the same directory stops at once instead of writing the same journal; only
//! the lock's holder opens the journal for writing ([`Journal::open_writable`]).

mod file;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tracing::{info, warn};
use uuid::Uuid;

pub(crate) use self::file::CompactionPolicy;
pub(crate) use self::file::LogWriter;
use self::file::Record;

/// The journal's file name inside the state directory.
pub const JOURNAL_FILE: &str = "journal.log";
/// The whole-document journal of older runner-agents, migrated into [`JOURNAL_FILE`] and removed
/// when the journal is opened for writing.
pub const LEGACY_JOURNAL_FILE: &str = "journal.json";
/// The lock file inside the state directory; it holds the owner's pid, for the operator.
pub const LOCK_FILE: &str = "runner-agent.lock";

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
    /// A complete line of the log that is not a record (a torn last line is not this: it is
    /// ignored). The file is left untouched, as for [`JournalError::Corrupt`].
    #[error("unreadable journal {path}, line {line}: {reason}")]
    CorruptRecord {
        /// The journal file.
        path: PathBuf,
        /// The line, counting the header as line 1.
        line: usize,
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
    dir: PathBuf,
    _file: std::fs::File,
}

impl StateDirLock {
    /// The state directory this lock holds.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
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
    Ok(StateDirLock { dir: state_dir.to_owned(), _file: file })
}

/// The place of one queued record in the journal's order: the record is on disk once a flush
/// through its ticket has succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ticket(u64);

/// A flush that ended: every record up to `through` was handed to the disk, and `result` says
/// whether it is durable.
#[derive(Debug)]
pub(crate) struct Flushed {
    pub(crate) through: Ticket,
    pub(crate) result: Result<(), JournalError>,
}

/// The writing side of an open journal.
struct Log {
    runner_id: Uuid,
    policy: CompactionPolicy,
    /// Records not yet handed to the writer, oldest first.
    queued: Vec<Record>,
    /// The ticket the next record gets.
    next: u64,
    /// Tasks with a record queued or being written: the ticket of the latest.
    unwritten: HashMap<TaskKey, Ticket>,
    /// The writer while no flush runs (a flush owns it meanwhile).
    writer: Option<LogWriter>,
    in_flight: Option<InFlight>,
    fsyncs: Arc<AtomicU64>,
}

struct InFlight {
    through: Ticket,
    task: JoinHandle<(LogWriter, Result<(), JournalError>)>,
}

/// The journal: its entries in memory and, when opened for writing, the log they are kept in.
/// Change it, then [`start_flush`](Journal::start_flush) (or [`sync`](Journal::sync)).
pub struct Journal {
    path: PathBuf,
    entries: BTreeMap<TaskKey, JournalEntry>,
    /// `None` for a snapshot ([`Journal::open`]): changes then stay in memory.
    log: Option<Log>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.path)
            .field("entries", &self.entries.len())
            .field("writable", &self.log.is_some())
            .finish()
    }
}

impl Journal {
    /// Reads the journal in `state_dir` as it stands, without writing anything: a snapshot, safe
    /// to take while a runner-agent runs there. A missing file is an empty journal; an old
    /// `journal.json` not yet migrated is read too.
    ///
    /// # Errors
    /// [`JournalError::Io`] when a file cannot be read, [`JournalError::Corrupt`] for an
    /// unknown version or a missing header, [`JournalError::CorruptRecord`] for a line that does
    /// not parse (other than a torn last one), and [`JournalError::WrongRunner`] when the
    /// journal names another runner.
    pub fn open(state_dir: &Path, runner_id: Uuid) -> Result<Journal, JournalError> {
        let (entries, _) = load(state_dir, runner_id)?;
        Ok(Journal { path: state_dir.join(JOURNAL_FILE), entries, log: None })
    }

    /// Opens the journal of the state directory `lock` holds for writing: reads it as
    /// [`open`](Journal::open) does, then rewrites the log from the entries (dropping a torn
    /// last line, migrating `journal.json` and removing it). Blocks on the disk.
    ///
    /// # Errors
    /// As [`open`](Journal::open), and [`JournalError::Io`] when the log cannot be rewritten.
    pub fn open_writable(lock: &StateDirLock, runner_id: Uuid) -> Result<Journal, JournalError> {
        Journal::open_writable_with(lock, runner_id, CompactionPolicy::default())
    }

    pub(crate) fn open_writable_with(
        lock: &StateDirLock,
        runner_id: Uuid,
        policy: CompactionPolicy,
    ) -> Result<Journal, JournalError> {
        let state_dir = lock.dir();
        let (entries, loaded) = load(state_dir, runner_id)?;
        let path = state_dir.join(JOURNAL_FILE);
        if loaded.torn_bytes > 0 {
            warn!(
                path = %path.display(), bytes = loaded.torn_bytes,
                "ignoring the journal's torn last record: a crash interrupted its write, so it was never acknowledged"
            );
        }
        let fsyncs = Arc::new(AtomicU64::new(0));
        let mut writer = LogWriter::new(path.clone(), runner_id, &entries, policy, Arc::clone(&fsyncs))?;
        writer.compact()?;
        if loaded.legacy {
            let legacy = state_dir.join(LEGACY_JOURNAL_FILE);
            std::fs::remove_file(&legacy).map_err(|error| JournalError::Io { path: legacy.clone(), error })?;
            file::sync_dir(state_dir)?;
            info!(from = %legacy.display(), to = %path.display(), entries = entries.len(), "migrated the journal");
        }
        let log = Log {
            runner_id,
            policy,
            queued: Vec::new(),
            next: 1,
            unwritten: HashMap::new(),
            writer: Some(writer),
            in_flight: None,
            fsyncs,
        };
        Ok(Journal { path, entries, log: Some(log) })
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

    /// How many fsyncs this journal has done since it was opened (a compaction counts two: the
    /// file and its directory).
    pub fn fsyncs(&self) -> u64 {
        self.log.as_ref().map_or(0, |log| log.fsyncs.load(Ordering::Relaxed))
    }

    pub(crate) fn contains(&self, key: &TaskKey) -> bool {
        self.entries.contains_key(key)
    }

    /// Adds or replaces the entry of its task.
    pub(crate) fn insert(&mut self, entry: JournalEntry) -> Ticket {
        self.entries.insert(entry.key.clone(), entry.clone());
        self.queue(Record::Upsert { entry })
    }

    /// Changes the entry for `key`, if journaled.
    pub(crate) fn update(&mut self, key: &TaskKey, change: impl FnOnce(&mut JournalEntry)) -> Option<Ticket> {
        let entry = self.entries.get_mut(key)?;
        change(entry);
        let entry = entry.clone();
        Some(self.queue(Record::Upsert { entry }))
    }

    pub(crate) fn remove(&mut self, key: &TaskKey) -> Option<JournalEntry> {
        let removed = self.entries.remove(key)?;
        self.queue(Record::Remove { key: key.clone() });
        Some(removed)
    }

    /// Removes the entries `expired` selects, returning them.
    pub(crate) fn remove_where(&mut self, mut expired: impl FnMut(&JournalEntry) -> bool) -> Vec<JournalEntry> {
        let keys: Vec<TaskKey> = self.entries.values().filter(|entry| expired(entry)).map(|e| e.key.clone()).collect();
        keys.iter().filter_map(|key| self.remove(key)).collect()
    }

    fn queue(&mut self, record: Record) -> Ticket {
        let Some(log) = self.log.as_mut() else { return Ticket(0) };
        let ticket = Ticket(log.next);
        log.next += 1;
        log.unwritten.insert(record.key().clone(), ticket);
        log.queued.push(record);
        ticket
    }

    /// Whether a change of `key` is still queued or being written.
    pub(crate) fn has_unwritten(&self, key: &TaskKey) -> bool {
        self.log.as_ref().is_some_and(|log| log.unwritten.contains_key(key))
    }

    /// Nothing is queued and no flush runs.
    pub(crate) fn is_idle(&self) -> bool {
        self.log.as_ref().is_none_or(|log| log.queued.is_empty() && log.in_flight.is_none())
    }

    /// Hands every queued record to a blocking task that writes them with one sync, unless a
    /// flush runs already (they then go with the next) or nothing is queued. Never blocks.
    pub(crate) fn start_flush(&mut self) {
        let Some(log) = self.log.as_mut() else { return };
        if log.in_flight.is_some() || log.queued.is_empty() {
            return;
        }
        let Some(mut writer) = log.writer.take() else { return };
        let records = std::mem::take(&mut log.queued);
        let through = Ticket(log.next - 1);
        let span = tracing::debug_span!("journal_flush", records = records.len());
        let task = tokio::task::spawn_blocking(move || {
            let _entered = span.enter();
            let result = writer.write(records);
            (writer, result)
        });
        log.in_flight = Some(InFlight { through, task });
    }

    /// Waits for the running flush to end (forever when none runs) and takes its writer back.
    /// Cancel-safe: dropped before the flush ends, it leaves the flush running.
    pub(crate) async fn flushed(&mut self) -> Flushed {
        let Some(log) = self.log.as_mut() else { return std::future::pending().await };
        let Some(in_flight) = log.in_flight.as_mut() else { return std::future::pending().await };
        let joined = (&mut in_flight.task).await;
        let through = in_flight.through;
        log.in_flight = None;
        let result = match joined {
            Ok((writer, result)) => {
                log.writer = Some(writer);
                result
            }
            Err(join_error) => {
                // The writer went with the task: start a new one, which rewrites the whole file
                // from what memory holds (records still queued are in it too; replaying them is
                // harmless).
                let fsyncs = Arc::clone(&log.fsyncs);
                match LogWriter::new(self.path.clone(), log.runner_id, &self.entries, log.policy, fsyncs) {
                    Ok(writer) => log.writer = Some(writer),
                    Err(err) => warn!(error = %err, "could not restart the journal's writer"),
                }
                Err(JournalError::Io { path: self.path.clone(), error: std::io::Error::other(join_error.to_string()) })
            }
        };
        log.unwritten.retain(|_, ticket| *ticket > through);
        Flushed { through, result }
    }

    /// Writes everything queued and waits until it is on disk.
    ///
    /// # Errors
    /// The last [`JournalError::Io`] a flush met; the next flush rewrites the whole file.
    pub async fn sync(&mut self) -> Result<(), JournalError> {
        let mut outcome = Ok(());
        loop {
            self.start_flush();
            if self.is_idle() {
                return outcome;
            }
            if self.log.as_ref().is_some_and(|log| log.in_flight.is_none()) {
                // Records are queued but there is no writer to take them.
                let error = std::io::Error::other("the journal's writer is gone");
                return Err(JournalError::Io { path: self.path.clone(), error });
            }
            if let Err(err) = self.flushed().await.result {
                outcome = Err(err);
            }
        }
    }

    /// The writer, for tests that inject failures into it.
    #[cfg(test)]
    pub(crate) fn writer_mut(&mut self) -> &mut LogWriter {
        self.log.as_mut().and_then(|log| log.writer.as_mut()).expect("an idle writable journal")
    }
}

/// What loading found besides the entries.
struct LoadNotes {
    torn_bytes: usize,
    legacy: bool,
}

/// The log's entries with a `journal.json`'s on top: a file left by an older runner-agent, or by
/// a migration that crashed before removing it (its entries are then the log's already).
fn load(state_dir: &Path, runner_id: Uuid) -> Result<(BTreeMap<TaskKey, JournalEntry>, LoadNotes), JournalError> {
    let log = file::read_log(&state_dir.join(JOURNAL_FILE), runner_id)?;
    let legacy = file::read_legacy(&state_dir.join(LEGACY_JOURNAL_FILE), runner_id)?;
    let torn_bytes = log.as_ref().map_or(0, |loaded| loaded.torn_bytes);
    let mut entries = log.map(|loaded| loaded.entries).unwrap_or_default();
    let notes = LoadNotes { torn_bytes, legacy: legacy.is_some() };
    for entry in legacy.into_iter().flatten() {
        entries.insert(entry.key.clone(), entry);
    }
    Ok((entries, notes))
}

#[cfg(test)]
mod tests;
