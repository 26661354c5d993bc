//! The journal's files: the lines of `journal.log`, loading them (a torn last line tolerated),
//! the writer that appends and compacts them, and the version-1 `journal.json` that older
//! runner-agents wrote, read once to be migrated.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{JournalEntry, JournalError, TaskKey};

/// The version the log's header names.
pub(super) const FORMAT_VERSION: u32 = 2;
/// The version of the whole-document `journal.json` that is migrated.
const LEGACY_FORMAT_VERSION: u32 = 1;

/// The log's first line.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    version: u32,
    runner_id: Uuid,
}

/// One change to the journal, one line of the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(super) enum Record {
    /// The entry as it now stands, replacing any earlier entry of its task.
    Upsert {
        /// The whole entry.
        entry: JournalEntry,
    },
    /// The task's entry is gone.
    Remove {
        /// The task.
        #[serde(flatten)]
        key: TaskKey,
    },
}

impl Record {
    pub(super) fn key(&self) -> &TaskKey {
        match self {
            Record::Upsert { entry } => &entry.key,
            Record::Remove { key } => key,
        }
    }
}

/// The whole-document journal of format version 1.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LegacyFile {
    version: u32,
    runner_id: Uuid,
    entries: Vec<JournalEntry>,
}

/// When the writer rewrites the log from its live entries instead of appending: once the file
/// holds more than `factor` times the live set, counted in records and in bytes, and more than
/// the minimum of each (so a nearly empty journal is not rewritten on every change).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CompactionPolicy {
    /// Records the log may hold before it is compacted, whatever the live set. Default 1,024.
    pub(crate) min_records: u64,
    /// Bytes of records the log may hold before it is compacted. Default 16 MiB.
    pub(crate) min_bytes: u64,
    /// How many times the live set the log may grow to. Default 4.
    pub(crate) factor: u64,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy { min_records: 1_024, min_bytes: 16 * 1024 * 1024, factor: 4 }
    }
}

/// The log read from disk.
pub(super) struct Loaded {
    pub(super) entries: BTreeMap<TaskKey, JournalEntry>,
    /// Bytes after the last complete line: a record torn by a crash while it was written, never
    /// acknowledged, and ignored.
    pub(super) torn_bytes: usize,
}

/// Reads the log at `path`; `None` when there is none.
pub(super) fn read_log(path: &Path, runner_id: Uuid) -> Result<Option<Loaded>, JournalError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(JournalError::Io { path: path.to_owned(), error }),
    };
    // Every record is written with its newline last, so a crash mid-write leaves only bytes
    // after the last newline incomplete.
    let complete = bytes.iter().rposition(|byte| *byte == b'\n').map_or(0, |last| last + 1);
    let corrupt = |line: usize, reason: String| JournalError::CorruptRecord { path: path.to_owned(), line, reason };
    let mut lines = bytes[..complete].split_inclusive(|byte| *byte == b'\n').map(strip_newline).enumerate();
    // The file only ever appears by rename once written and synced, so its header is whole.
    let Some((_, first)) = lines.next() else {
        return Err(JournalError::Corrupt { path: path.to_owned(), reason: "no header line".to_owned() });
    };
    let header: Header = serde_json::from_slice(first).map_err(|err| corrupt(1, err.to_string()))?;
    if header.version != FORMAT_VERSION {
        let reason = format!("version {} (this build reads {FORMAT_VERSION})", header.version);
        return Err(JournalError::Corrupt { path: path.to_owned(), reason });
    }
    if header.runner_id != runner_id {
        return Err(JournalError::WrongRunner { path: path.to_owned(), found: header.runner_id, expected: runner_id });
    }
    let mut entries = BTreeMap::new();
    for (index, line) in lines {
        match serde_json::from_slice(line).map_err(|err| corrupt(index + 1, err.to_string()))? {
            Record::Upsert { entry } => entries.insert(entry.key.clone(), entry),
            Record::Remove { key } => entries.remove(&key),
        };
    }
    Ok(Some(Loaded { entries, torn_bytes: bytes.len() - complete }))
}

fn strip_newline(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}

/// Reads the version-1 `journal.json` at `path`; `None` when there is none.
pub(super) fn read_legacy(path: &Path, runner_id: Uuid) -> Result<Option<Vec<JournalEntry>>, JournalError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(JournalError::Io { path: path.to_owned(), error }),
    };
    let file: LegacyFile = serde_json::from_slice(&bytes)
        .map_err(|err| JournalError::Corrupt { path: path.to_owned(), reason: err.to_string() })?;
    if file.version != LEGACY_FORMAT_VERSION {
        let reason = format!("version {} (this build migrates {LEGACY_FORMAT_VERSION})", file.version);
        return Err(JournalError::Corrupt { path: path.to_owned(), reason });
    }
    if file.runner_id != runner_id {
        return Err(JournalError::WrongRunner { path: path.to_owned(), found: file.runner_id, expected: runner_id });
    }
    Ok(Some(file.entries))
}

/// One line: the JSON text (which never holds a raw newline) and a newline.
fn encode_line(path: &Path, value: &impl Serialize) -> Result<Vec<u8>, JournalError> {
    let mut line = serde_json::to_vec(value)
        .map_err(|err| JournalError::Io { path: path.to_owned(), error: std::io::Error::other(err) })?;
    line.push(b'\n');
    Ok(line)
}

/// The lines a batch of records is appended as.
#[cfg(test)]
pub(super) fn encode_records(path: &Path, records: &[Record]) -> Result<Vec<u8>, JournalError> {
    let mut bytes = Vec::new();
    for record in records {
        bytes.extend(encode_line(path, record)?);
    }
    Ok(bytes)
}

/// Syncs a directory, so that a rename or removal in it survives a crash.
pub(super) fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|error| JournalError::Io { path: dir.to_owned(), error })
}

/// Owns `journal.log` while the agent runs: appends each batch of records and syncs it once,
/// and rewrites the file from the live entries when it has grown (see [`CompactionPolicy`]).
/// It keeps each live entry's line, so that compacting serializes nothing.
pub(crate) struct LogWriter {
    path: PathBuf,
    header_line: Vec<u8>,
    /// The open log, positioned at its end; `None` before the first write and after a failed
    /// one, when the next write rewrites the whole file (a failed append may have left a
    /// partial line, which must not end up in the middle of the log).
    file: Option<std::fs::File>,
    live: BTreeMap<TaskKey, Vec<u8>>,
    live_bytes: u64,
    /// Records and bytes in the file after its header.
    records: u64,
    bytes: u64,
    policy: CompactionPolicy,
    fsyncs: Arc<AtomicU64>,
    /// Test hook: the next append writes only this many bytes and fails, as a crash would leave it.
    #[cfg(test)]
    pub(crate) fail_after_bytes: Option<usize>,
}

impl LogWriter {
    /// A writer whose first write rewrites `path` from `entries`.
    pub(super) fn new(
        path: PathBuf,
        runner_id: Uuid,
        entries: &BTreeMap<TaskKey, JournalEntry>,
        policy: CompactionPolicy,
        fsyncs: Arc<AtomicU64>,
    ) -> Result<LogWriter, JournalError> {
        let header_line = encode_line(&path, &Header { version: FORMAT_VERSION, runner_id })?;
        let mut writer = LogWriter {
            path,
            header_line,
            file: None,
            live: BTreeMap::new(),
            live_bytes: 0,
            records: 0,
            bytes: 0,
            policy,
            fsyncs,
            #[cfg(test)]
            fail_after_bytes: None,
        };
        for entry in entries.values() {
            let line = encode_line(&writer.path, &Record::Upsert { entry: entry.clone() })?;
            writer.keep(entry.key.clone(), line);
        }
        Ok(writer)
    }

    /// Makes `records` durable: one append and one sync, or a rewrite of the file when it is due
    /// for compaction (or the file is not open).
    ///
    /// # Errors
    /// [`JournalError::Io`] when a step fails; the next write then rewrites the file.
    pub(super) fn write(&mut self, records: Vec<Record>) -> Result<(), JournalError> {
        let mut lines = Vec::new();
        for record in records {
            let line = encode_line(&self.path, &record)?;
            lines.extend_from_slice(&line);
            match record {
                Record::Upsert { entry } => self.keep(entry.key, line),
                Record::Remove { key } => self.forget(&key),
            }
            self.records += 1;
        }
        self.bytes += lines.len() as u64;
        if self.file.is_none() || self.compaction_due() {
            return self.compact();
        }
        let result = self.append(&lines);
        if result.is_err() {
            self.file = None;
        }
        result
    }

    fn append(&mut self, lines: &[u8]) -> Result<(), JournalError> {
        let io = |error| JournalError::Io { path: self.path.clone(), error };
        let Some(file) = self.file.as_mut() else {
            return Err(io(std::io::Error::other("the log is not open")));
        };
        #[cfg(test)]
        if let Some(cut) = self.fail_after_bytes.take() {
            file.write_all(&lines[..cut.min(lines.len())]).map_err(io)?;
            return Err(io(std::io::Error::other("injected failure mid-append")));
        }
        file.write_all(lines).map_err(io)?;
        // Data and the file's length; nothing else about the file needs to survive.
        file.sync_data().map_err(io)?;
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn keep(&mut self, key: TaskKey, line: Vec<u8>) {
        self.live_bytes += line.len() as u64;
        if let Some(old) = self.live.insert(key, line) {
            self.live_bytes -= old.len() as u64;
        }
    }

    fn forget(&mut self, key: &TaskKey) {
        if let Some(old) = self.live.remove(key) {
            self.live_bytes -= old.len() as u64;
        }
    }

    fn compaction_due(&self) -> bool {
        let live = self.live.len() as u64;
        self.records > self.policy.min_records.max(self.policy.factor.saturating_mul(live))
            || self.bytes > self.policy.min_bytes.max(self.policy.factor.saturating_mul(self.live_bytes))
    }

    /// Rewrites the log as its header and one upsert per live entry, atomically: a temp file
    /// beside it, sync, rename over the log, sync of the directory.
    ///
    /// # Errors
    /// [`JournalError::Io`] when a step fails; the previous log is then still intact.
    pub(super) fn compact(&mut self) -> Result<(), JournalError> {
        self.file = None;
        let io = |error| JournalError::Io { path: self.path.clone(), error };
        let temp = self.path.with_extension("log.tmp");
        let mut contents = self.header_line.clone();
        for line in self.live.values() {
            contents.extend_from_slice(line);
        }
        let mut file = std::fs::File::create(&temp).map_err(io)?;
        file.write_all(&contents).map_err(io)?;
        file.sync_all().map_err(io)?;
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        std::fs::rename(&temp, &self.path).map_err(io)?;
        if let Some(dir) = self.path.parent() {
            sync_dir(dir)?;
            self.fsyncs.fetch_add(1, Ordering::Relaxed);
        }
        // The handle still names the file, now under the log's name, and stands at its end.
        self.file = Some(file);
        self.records = self.live.len() as u64;
        self.bytes = (contents.len() - self.header_line.len()) as u64;
        Ok(())
    }

    /// Records in the file after its header.
    #[cfg(test)]
    pub(super) fn records(&self) -> u64 {
        self.records
    }
}
