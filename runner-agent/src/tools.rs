//! The built-in tools this runner serves, their announcement (schemas and honest effect profiles)
//! and the shaping of their results into commit bodies.
//!
//! Two axes of failure (`docs/protocol.md`, "Commit"): a tool that ran and failed (bad arguments, a
//! non-zero exit, a refused path) is [`ToolOutcome::Completed`] with `is_error: true`, which the
//! model reads; a call that could not run at all (unknown tool, `tool_input` not an object, bash
//! not startable) is [`ToolOutcome::Failed`].
//!
//! Bounds (README, "runner-agent's tools"): every call ends by its timeout or its stop and gives
//! its slot back, whatever its system calls do ([`blocking`]); every read keeps at most a fixed
//! number of bytes in memory while it reads; nothing a bash call or a command tool starts
//! outlives it ([`process`], [`reap`]); what `process_start` starts lives until `process_kill`
//! or [`Toolbox::shutdown`] ([`processes`]).
//!
//! What is served is the [`Catalog`]: the built-ins, `skill` with a skills directory, the command
//! tools of the tools file ([`command`]) and tools fed in from outside (MCP), rebuilt whole when
//! one of them changes. Each tool, with its input, result, bounds and effect profile:
//! `docs/runner-tools.md`.

mod bash;
pub(crate) mod blocking;
pub(crate) mod catalog;
mod command;
mod edit;
mod files;
mod patch;
mod paths;
mod process;
mod processes;
pub(crate) mod reap;
mod search;
mod skills;
mod web;

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use self::blocking::{Ended, Strays};
use self::catalog::Served;
pub(crate) use self::catalog::{Catalog, CatalogError, ExtraTool, ToolSpec};
use self::reap::Owner;
pub(crate) use self::web::WebFetchConfig;
use crate::claim::ClaimHandle;
use crate::toolsfile::ToolsFile;

/// The spec's commit bound (`result_too_large`, "1 MB"), read as 10^6 bytes of body JSON.
pub(crate) const MAX_COMMIT_BODY_BYTES: usize = 1_000_000;
/// The announced `timeout_ms` of the file tools, in milliseconds.
const FILE_TOOL_TIMEOUT_MS: u64 = 60_000;

/// Why a running tool is being stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// nexus canceled the task (`work_canceled`) or reports the claim inactive.
    Canceled,
    /// The agent is shutting down.
    Shutdown,
}

/// What a tool may know and use while it runs.
pub(crate) struct ToolContext {
    /// The canonical workdir.
    pub(crate) workdir: PathBuf,
    /// The `timeout_ms` announced for bash.
    pub(crate) bash_timeout_ms: u64,
    /// The task row's `timeout_ms`, when nexus sent one.
    pub(crate) task_timeout_ms: Option<u64>,
    /// The latest instant at which a result is still useful (claim deadline minus the commit
    /// margin).
    pub(crate) clamp_at: Option<Instant>,
    /// Becomes `Some` when the tool must stop.
    pub(crate) stop: watch::Receiver<Option<StopReason>>,
    /// The claim, for progress frames and claim requests.
    pub(crate) claim: Option<ClaimHandle>,
    /// The state dir's mark, which bash puts on every process it starts ([`reap`]).
    pub(crate) owner: Owner,
}

impl ToolContext {
    /// A context for a test: `workdir` with `owner`'s mark and bash's `bash_timeout_ms`, no task
    /// timeout, clamp or claim; the tool stops when the returned sender says so (and never, once
    /// it is dropped).
    #[cfg(test)]
    pub(crate) fn for_test(
        workdir: &std::path::Path,
        owner: &Owner,
        bash_timeout_ms: u64,
    ) -> (watch::Sender<Option<StopReason>>, ToolContext) {
        let (stop_tx, stop) = watch::channel(None);
        let ctx = ToolContext {
            workdir: workdir.to_owned(),
            bash_timeout_ms,
            task_timeout_ms: None,
            clamp_at: None,
            stop,
            claim: None,
            owner: owner.clone(),
        };
        (stop_tx, ctx)
    }

    /// Resolves when the tool is asked to stop; never resolves if nobody can ask any more.
    pub(crate) async fn stopped(&mut self) -> StopReason {
        let reason = self.stop.wait_for(Option::is_some).await.ok().and_then(|reason| *reason);
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }
}

/// Watching the processes a test's tools start.
#[cfg(test)]
pub(crate) mod test_processes {
    use std::path::Path;
    use std::time::Duration;

    /// Gone, or a zombie nobody has reaped yet: either way it runs no more.
    pub(crate) fn is_dead(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        }
    }

    /// The pids a script wrote to `workdir/file`, one a line.
    pub(crate) fn pids(workdir: &Path, file: &str) -> Vec<i32> {
        let text = std::fs::read_to_string(workdir.join(file)).expect("the pid file");
        text.lines().map(|line| line.trim().parse().expect("a pid")).collect()
    }

    /// Waits up to 20 s for every one of `pids` to be dead; `what` names the moment in the panic.
    pub(crate) async fn wait_dead(pids: &[i32], what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        for pid in pids {
            while !is_dead(*pid) {
                assert!(tokio::time::Instant::now() < deadline, "{what}: process {pid} survived");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// A canonical temporary workdir for a test, and the guard that removes it.
#[cfg(test)]
pub(crate) fn test_workdir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().canonicalize().expect("a canonical path");
    (dir, path)
}

/// What a tool call produced.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ToolOutcome {
    /// The tool ran. `content` is what the model reads; `structured_content` is kept for
    /// programs; `is_error` says the tool reported a failure.
    Completed { content: String, structured_content: Value, is_error: bool },
    /// The tool could not run at all (`outcome: failed`).
    Failed { content: String },
}

impl ToolOutcome {
    /// A test's view of a completed call: `(content, structured_content, is_error)`.
    ///
    /// # Panics
    /// When the call failed (`outcome: failed`), with its content.
    #[cfg(test)]
    pub(crate) fn into_parts(self) -> (String, Value, bool) {
        match self {
            ToolOutcome::Completed { content, structured_content, is_error } => (content, structured_content, is_error),
            ToolOutcome::Failed { content } => panic!("the call failed: {content}"),
        }
    }

    /// A tool-level error the model reads.
    pub(crate) fn error(message: impl Into<String>) -> Self {
        let message = message.into();
        ToolOutcome::Completed { structured_content: json!({ "error": message }), content: message, is_error: true }
    }

    /// The commit body: NUL characters replaced (nexus refuses them and closes the park), and
    /// shrunk to fit [`MAX_COMMIT_BODY_BYTES`] — first dropping `structured_content`, then cutting
    /// `content` with a note.
    pub(crate) fn into_commit_body(self) -> Value {
        let mut body = match self {
            ToolOutcome::Completed { content, structured_content, is_error } => json!({
                "content": content,
                "structured_content": structured_content,
                "is_error": is_error,
            }),
            ToolOutcome::Failed { content } => json!({ "outcome": "failed", "content": content }),
        };
        replace_nul(&mut body);
        fit_to_bound(&mut body, MAX_COMMIT_BODY_BYTES);
        body
    }
}

fn replace_nul(value: &mut Value) {
    match value {
        Value::String(text) if text.contains('\0') => *text = text.replace('\0', "\u{FFFD}"),
        Value::Array(items) => items.iter_mut().for_each(replace_nul),
        Value::Object(map) => map.values_mut().for_each(replace_nul),
        _ => {}
    }
}

fn encoded_len(value: &Value) -> usize {
    serde_json::to_string(value).map_or(usize::MAX, |text| text.len())
}

fn fit_to_bound(body: &mut Value, limit: usize) {
    if encoded_len(body) <= limit {
        return;
    }
    if let Some(structured) = body.get_mut("structured_content") {
        *structured = json!({ "omitted": "the structured result was larger than the commit bound" });
    }
    let total = encoded_len(body);
    if total <= limit {
        return;
    }
    let Some(Value::String(content)) = body.get_mut("content") else {
        return;
    };
    let note = format!("\n[cut to fit the {limit}-byte commit bound]");
    let content_cost: usize = content.chars().map(escaped_len).sum();
    let note_cost: usize = note.chars().map(escaped_len).sum();
    let budget = limit.saturating_sub(total - content_cost + note_cost);
    let mut used = 0;
    let mut keep = 0;
    for (at, ch) in content.char_indices() {
        used += escaped_len(ch);
        if used > budget {
            break;
        }
        keep = at + ch.len_utf8();
    }
    content.truncate(keep);
    content.push_str(&note);
}

/// Bytes `ch` takes inside a JSON string as serde_json writes it.
fn escaped_len(ch: char) -> usize {
    match ch {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if u32::from(c) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// An announced `effect_profile`: exactly the five keys of `docs/protocol.md` ("Announce"), each
/// with its closed set of values. In a tools file it is a table of these five keys; another key,
/// a missing one or another value is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EffectProfile {
    /// What the tool does to the world.
    pub(crate) kind: EffectKind,
    /// Whether its effect can destroy data.
    pub(crate) destructive: bool,
    /// Whether its effect stays inside the runner's environment.
    pub(crate) effect_scope: EffectScope,
    /// Whether running it twice is the same as once.
    pub(crate) idempotency: Idempotency,
    /// Whether its effect can be looked up after a lost result.
    pub(crate) reconciliation: Reconciliation,
}

impl EffectProfile {
    /// The profile assumed where nothing better is known: a destructive write with open scope,
    /// neither idempotent nor reconcilable.
    pub(crate) const UNKNOWN_WRITE: EffectProfile = EffectProfile {
        kind: EffectKind::Write,
        destructive: true,
        effect_scope: EffectScope::Open,
        idempotency: Idempotency::None,
        reconciliation: Reconciliation::None,
    };
}

/// `effect_profile.kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EffectKind {
    /// No effect at all; the result depends only on the input.
    Pure,
    /// Reads the world, changes nothing.
    ReadOnly,
    /// Changes the world.
    Write,
}

/// `effect_profile.effect_scope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EffectScope {
    /// Inside the runner's environment.
    Closed,
    /// Beyond it (the network, other systems).
    Open,
}

/// `effect_profile.idempotency`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Idempotency {
    /// Repeating the call repeats nothing.
    Intrinsic,
    /// Repeating it with the same key repeats nothing.
    Keyed,
    /// Repeating it repeats its effect.
    None,
}

/// `effect_profile.reconciliation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reconciliation {
    /// No way to learn whether a lost call took effect.
    None,
    /// Its effect can be looked up.
    Lookup,
}

/// The built-in tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Builtin {
    Bash,
    ReadFile,
    WriteFile,
    ListDir,
    Edit,
    ApplyPatch,
    Grep,
    Glob,
    ProcessStart,
    ProcessRead,
    ProcessWrite,
    ProcessKill,
    ProcessList,
    WebFetch,
}

impl Builtin {
    /// Every built-in, in announcement order.
    pub(crate) const ALL: [Builtin; 14] = [
        Builtin::Bash,
        Builtin::ReadFile,
        Builtin::WriteFile,
        Builtin::ListDir,
        Builtin::Edit,
        Builtin::ApplyPatch,
        Builtin::Grep,
        Builtin::Glob,
        Builtin::ProcessStart,
        Builtin::ProcessRead,
        Builtin::ProcessWrite,
        Builtin::ProcessKill,
        Builtin::ProcessList,
        Builtin::WebFetch,
    ];

    /// Its announced name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Builtin::Bash => "bash",
            Builtin::ReadFile => "read_file",
            Builtin::WriteFile => "write_file",
            Builtin::ListDir => "list_dir",
            Builtin::Edit => "edit",
            Builtin::ApplyPatch => "apply_patch",
            Builtin::Grep => "grep",
            Builtin::Glob => "glob",
            Builtin::ProcessStart => "process_start",
            Builtin::ProcessRead => "process_read",
            Builtin::ProcessWrite => "process_write",
            Builtin::ProcessKill => "process_kill",
            Builtin::ProcessList => "process_list",
            Builtin::WebFetch => "web_fetch",
        }
    }

    /// The built-in announced as `name`.
    pub(crate) fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|tool| tool.name() == name)
    }

    fn description(self) -> &'static str {
        match self {
            Builtin::Bash => {
                "Run a command with `bash -c` in the runner's working directory, with no stdin. \
                 Returns the exit code, stdout and stderr (each cut after its first 256 KiB). \
                 Nothing the command starts outlives the call: when the shell exits, or the \
                 timeout passes, or the call is canceled, its whole process group is killed, and \
                 so is every process it started in a new session (`setsid`, `nohup ... &` too). \
                 Run long-lived services some other way."
            }
            Builtin::ReadFile => {
                "Read a regular text file inside the working directory (FIFOs, sockets and \
                 devices are refused). `offset` is the first line (1-based) and `limit` the \
                 number of lines. Returns at most 512 KiB of text; a line longer than 64 KiB \
                 shows its first 64 KiB and a mark. Returns the file's SHA-256, which write_file \
                 accepts as `expected_sha256`, and its line count, both only for files up to \
                 64 MiB: a larger file is read only as far as the requested lines, and gets \
                 neither."
            }
            Builtin::WriteFile => {
                "Write a whole text file inside the working directory, atomically, creating \
                 parent directories; the target must be a regular file or missing. With \
                 `expected_sha256` the write happens only if the file's current SHA-256 \
                 matches (files up to 64 MiB); `expected_sha256: null` requires that the file \
                 does not exist yet."
            }
            Builtin::ListDir => {
                "List a directory inside the working directory: each entry's name, type (file, \
                 dir, symlink, other) and size, sorted by name; at most the first 2000 names."
            }
            Builtin::Edit => {
                "Replace an exact text in a UTF-8 file inside the working directory, atomically. \
                 `old_text` must appear exactly once, else nothing changes and the answer says how \
                 many times it appears and on which lines; with `replace_all` every occurrence is \
                 replaced. With `expected_sha256` the edit happens only if the file's current \
                 SHA-256 matches (read_file returns it). Files up to 16 MiB. Returns the new \
                 SHA-256 and the number of replacements."
            }
            Builtin::ApplyPatch => {
                "Apply a unified diff (`--- a/x` / `+++ b/x` sections with `@@` hunks, or `git \
                 diff` output) to files inside the working directory: all files change or none \
                 do. `--- /dev/null` creates a file, `+++ /dev/null` deletes one; renames, copies \
                 and binary patches are refused. Hunks must match exactly (they may sit at other \
                 line numbers). `expected_sha256` maps a path to the SHA-256 its file must have, \
                 or to null for a file that must not exist. Any failing hunk or base refuses the \
                 whole patch, naming each file and hunk, and changes nothing. At most 256 UTF-8 \
                 files, each up to 16 MiB. If the files cannot all be put back after a failed \
                 write, structured_content lists `applied` and `not_applied` files."
            }
            Builtin::Grep => {
                "Search file contents under a directory of the working directory for a regex \
                 (Rust syntax), line by line, honouring .gitignore and .ignore files and skipping \
                 hidden entries, symlinks, binary files (a NUL byte) and files over 64 MiB. `glob` \
                 filters files (a pattern without `/` matches the file name). Returns `path:line: \
                 text` in path order, then line order: at most `max_results` (default 200, at most \
                 2000), each line cut at 500 characters, at most 256 KiB of text; says when cut."
            }
            Builtin::Glob => {
                "Find files and directories under a directory of the working directory whose names \
                 match a glob: without `/` it matches the name (`*.rs`), with `/` the path below \
                 the searched directory (`src/**/*.rs`; `*` does not cross `/`, `**` does). Honours \
                 .gitignore and .ignore files, skips hidden entries and does not follow symlinks. \
                 Returns paths in order (depth first, by name): at most `max_results` (default \
                 200, at most 2000); says when cut."
            }
            Builtin::ProcessStart => {
                "Start a long-running process (`bash -c command` in the working directory: a dev \
                 server, a watcher, a REPL) that keeps running after this call, in a process group \
                 of its own with stdin, stdout and stderr piped. Returns its id for process_read, \
                 process_write and process_kill. At most 16 processes are held; a start past that \
                 takes the place of the one that exited longest ago, and is refused when all 16 \
                 run. Each keeps its last 1 MiB of output. When its shell exits, or runner-agent \
                 stops, everything it started is killed."
            }
            Builtin::ProcessRead => {
                "Read what a started process wrote (stdout and stderr interleaved) since the last \
                 read, at most `max_bytes` (default 65536, at most 262144), and whether it still \
                 runs or its exit code. With `wait_ms` (at most 30000) it waits that long for new \
                 output unless some is there or the process exited. Says how many bytes were \
                 overwritten before they were read (the buffer keeps the last 1 MiB) and how many \
                 remain unread."
            }
            Builtin::ProcessWrite => {
                "Write text to the stdin of a started process; with `close_stdin` close it \
                 afterwards (send EOF). Gives up after 10 s if the process does not read, saying \
                 how many bytes were written."
            }
            Builtin::ProcessKill => {
                "Kill a started process (SIGKILL to its process group, and to everything it \
                 started that left the group), wait up to 5 s for its exit, and drop it from the \
                 table. Returns its exit code and up to 64 KiB of its unread output."
            }
            Builtin::ProcessList => {
                "List the started processes this runner holds: id, name, command (first 200 \
                 characters), pid, running or exit code, age in seconds and unread output bytes."
            }
            Builtin::WebFetch => {
                "Fetch a URL with an HTTP(S) GET and return its body as text: text/*, JSON, XML \
                 and the like as they are (UTF-8), HTML turned into readable text; other types \
                 are refused. Only hosts in this runner's allowlist, and redirects to them (at \
                 most 5), are fetched. The body is read up to `max_bytes` (at most the runner's \
                 bound, 2 MiB unless configured) and the text cut at 512 KiB, both said when \
                 cut; the fetch ends at the runner's timeout (20 s unless configured). Returns the \
                 final URL, status and content type; an HTTP error status is a tool error with \
                 the body."
            }
        }
    }

    fn input_schema(self) -> Value {
        let path = |what: &str| json!({"type": "string", "description": format!("{what}; relative paths resolve in the working directory")});
        match self {
            Builtin::Bash => json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The bash script to run."},
                    "timeout_ms": {"type": "integer", "minimum": 1,
                        "description": "Kill the command after this many milliseconds; at most the announced timeout."},
                },
                "required": ["command"],
            }),
            Builtin::ReadFile => json!({
                "type": "object",
                "properties": {
                    "path": path("The file to read"),
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to return, 1-based. Default 1."},
                    "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to return. Default: all."},
                },
                "required": ["path"],
            }),
            Builtin::WriteFile => json!({
                "type": "object",
                "properties": {
                    "path": path("The file to write"),
                    "content": {"type": "string", "description": "The file's new content."},
                    "expected_sha256": {"type": ["string", "null"],
                        "description": "Hex SHA-256 the current file must have; null means the file must not exist. Omit to skip the check."},
                },
                "required": ["path", "content"],
            }),
            Builtin::ListDir => json!({
                "type": "object",
                "properties": {"path": path("The directory to list; default \".\"")},
                "required": [],
            }),
            Builtin::Edit => json!({
                "type": "object",
                "properties": {
                    "path": path("The file to edit"),
                    "old_text": {"type": "string", "description": "The exact text to replace (not empty)."},
                    "new_text": {"type": "string", "description": "The text to put in its place."},
                    "expected_sha256": {"type": "string",
                        "description": "Hex SHA-256 the current file must have. Omit to skip the check."},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence. Default false."},
                },
                "required": ["path", "old_text", "new_text"],
            }),
            Builtin::ApplyPatch => json!({
                "type": "object",
                "properties": {
                    "patch": {"type": "string", "description": "The unified diff."},
                    "expected_sha256": {"type": "object",
                        "additionalProperties": {"type": ["string", "null"]},
                        "description": "Path -> hex SHA-256 its file must have, or null if it must not exist."},
                },
                "required": ["patch"],
            }),
            Builtin::Grep => json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "The regex to find (Rust regex syntax)."},
                    "path": path("The directory (or file) to search; default \".\""),
                    "glob": {"type": "string", "description": "Only files matching this glob, e.g. \"*.py\"."},
                    "case_insensitive": {"type": "boolean", "description": "Ignore case. Default false."},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 2000,
                        "description": "The most matching lines to return. Default 200."},
                },
                "required": ["pattern"],
            }),
            Builtin::Glob => json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "The glob, e.g. \"*.toml\" or \"src/**/*.rs\"."},
                    "path": path("The directory to search; default \".\""),
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 2000,
                        "description": "The most paths to return. Default 200."},
                },
                "required": ["pattern"],
            }),
            Builtin::ProcessStart => json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The bash script to run."},
                    "name": {"type": "string", "description": "A label for process_list (at most 64 characters)."},
                },
                "required": ["command"],
            }),
            Builtin::ProcessRead => json!({
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "The id process_start returned."},
                    "max_bytes": {"type": "integer", "minimum": 1, "maximum": 262_144,
                        "description": "The most bytes to return. Default 65536."},
                    "wait_ms": {"type": "integer", "minimum": 0, "maximum": 30_000,
                        "description": "Wait this long for new output if there is none yet. Default 0."},
                },
                "required": ["id"],
            }),
            Builtin::ProcessWrite => json!({
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "The id process_start returned."},
                    "input": {"type": "string", "description": "The text to write (add \\n to end a line)."},
                    "close_stdin": {"type": "boolean", "description": "Close stdin after writing. Default false."},
                },
                "required": ["id", "input"],
            }),
            Builtin::ProcessKill => json!({
                "type": "object",
                "properties": {"id": {"type": "string", "description": "The id process_start returned."}},
                "required": ["id"],
            }),
            Builtin::ProcessList => json!({"type": "object", "properties": {}, "required": []}),
            Builtin::WebFetch => json!({
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "The http or https URL to fetch."},
                    "max_bytes": {"type": "integer", "minimum": 1,
                        "description": "The most body bytes to read; at most the runner's bound."},
                },
                "required": ["url"],
            }),
        }
    }

    fn effect_profile(self) -> EffectProfile {
        let read_only = EffectProfile {
            kind: EffectKind::ReadOnly,
            destructive: false,
            effect_scope: EffectScope::Closed,
            idempotency: Idempotency::Intrinsic,
            reconciliation: Reconciliation::None,
        };
        match self {
            Builtin::Bash => EffectProfile {
                kind: EffectKind::Write,
                destructive: true,
                effect_scope: EffectScope::Open,
                idempotency: Idempotency::None,
                reconciliation: Reconciliation::None,
            },
            Builtin::WriteFile | Builtin::Edit | Builtin::ApplyPatch => EffectProfile {
                kind: EffectKind::Write,
                destructive: true,
                effect_scope: EffectScope::Closed,
                idempotency: Idempotency::None,
                reconciliation: Reconciliation::Lookup,
            },
            Builtin::ReadFile | Builtin::ListDir | Builtin::Grep | Builtin::Glob | Builtin::ProcessList => read_only,
            Builtin::ProcessStart | Builtin::ProcessWrite => EffectProfile {
                kind: EffectKind::Write,
                destructive: true,
                effect_scope: EffectScope::Open,
                idempotency: Idempotency::None,
                reconciliation: Reconciliation::None,
            },
            // It moves the process's read cursor, and nothing else: a repeat returns later output.
            Builtin::ProcessRead => EffectProfile { idempotency: Idempotency::None, ..read_only },
            // A GET changes nothing, but what it reads lies outside the runner.
            Builtin::WebFetch => EffectProfile { effect_scope: EffectScope::Open, ..read_only },
            // Killed twice is killed once.
            Builtin::ProcessKill => EffectProfile {
                kind: EffectKind::Write,
                destructive: true,
                effect_scope: EffectScope::Closed,
                idempotency: Idempotency::Intrinsic,
                reconciliation: Reconciliation::None,
            },
        }
    }
}

/// The tools, bound to one workdir, one announced bash timeout and one state dir's mark, and the
/// [`Catalog`] of what is served now. The catalog changes at run time (a reloaded tools file, new
/// tools fed in from outside); [`Toolbox::subscribe`] tells of each change, and a call keeps the
/// tool it started with.
#[derive(Debug)]
pub(crate) struct Toolbox {
    workdir: PathBuf,
    bash_timeout_ms: u64,
    owner: Owner,
    /// File-tool threads abandoned by their calls and still running.
    strays: Strays,
    /// Where the skills are read from (`--skills-dir`); `None` serves no skills.
    skills_dir: Option<PathBuf>,
    /// What the catalog is built from.
    sources: Mutex<Sources>,
    /// The catalog now; every change is sent whole.
    catalog: watch::Sender<Arc<Catalog>>,
    /// The processes `process_start` started, which outlive their calls.
    processes: processes::ProcessTable,
}

/// What a catalog is built from, besides the built-ins.
#[derive(Debug, Default)]
struct Sources {
    file: Arc<ToolsFile>,
    extra: Vec<ExtraTool>,
    /// `web_fetch`'s settings and client, from the file's `[builtin.web_fetch]`; `None` serves
    /// no web_fetch.
    web_fetch: Option<Arc<web::WebFetch>>,
}

/// The effect profile of `skill`: it only reads.
const SKILL_EFFECT: EffectProfile = EffectProfile {
    kind: EffectKind::ReadOnly,
    destructive: false,
    effect_scope: EffectScope::Closed,
    idempotency: Idempotency::Intrinsic,
    reconciliation: Reconciliation::None,
};

impl Toolbox {
    /// The built-in tools alone. `workdir` must already be canonical.
    pub(crate) fn new(workdir: PathBuf, bash_timeout_ms: u64, owner: Owner) -> Self {
        let (catalog, _) = watch::channel(Arc::new(Catalog::default()));
        let toolbox = Toolbox {
            workdir,
            bash_timeout_ms,
            owner,
            strays: Strays::default(),
            skills_dir: None,
            sources: Mutex::new(Sources::default()),
            catalog,
            processes: processes::ProcessTable::default(),
        };
        // The built-ins alone always make a valid catalog; an empty one would announce nothing.
        if let Ok(catalog) = toolbox.rebuild(&Sources::default()) {
            toolbox.catalog.send_replace(Arc::new(catalog));
        }
        toolbox
    }

    /// Kills every process `process_start` started (and what they started); none starts after.
    /// Called once when the agent stops, before its last sweep.
    pub(crate) async fn shutdown(&self) {
        self.processes.shutdown().await;
    }

    /// The toolbox serving `web_fetch` with `config` (a tools file holding only that table).
    #[cfg(test)]
    pub(crate) fn with_web_fetch(self, config: WebFetchConfig) -> Self {
        let mut file = ToolsFile::default();
        file.builtins.web_fetch = Some(config);
        self.replace_tools_file(file).expect("web_fetch alone makes a valid catalog");
        self
    }

    /// The toolbox serving the skills of `dir` too ([`skills`]).
    pub(crate) fn with_skills_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.skills_dir = dir;
        let sources = self.lock_sources();
        let rebuilt = self.rebuild(&sources);
        drop(sources);
        if let Ok(catalog) = rebuilt {
            self.catalog.send_replace(Arc::new(catalog));
        }
        self
    }

    /// Serves the tools of `file` from now on, in place of the file's earlier ones; calls
    /// already running keep theirs.
    ///
    /// # Errors
    /// [`CatalogError`] when the catalog with them would be invalid (a name an outside tool has,
    /// a tool list over nexus's bound); the earlier tools stay.
    pub(crate) fn replace_tools_file(&self, file: ToolsFile) -> Result<(), CatalogError> {
        let mut sources = self.lock_sources();
        let web_fetch = file.builtins.web_fetch.clone().map(|config| Arc::new(web::WebFetch::new(config)));
        let candidate = Sources { file: Arc::new(file), extra: sources.extra.clone(), web_fetch };
        let catalog = self.rebuild(&candidate)?;
        *sources = candidate;
        self.catalog.send_replace(Arc::new(catalog));
        Ok(())
    }

    /// The slot for tools served from outside this module (the MCP hub feeds it): `tools`
    /// replace every earlier outside tool; calls already running keep theirs.
    ///
    /// # Errors
    /// [`CatalogError`] when the catalog with them would be invalid (a name taken, a name out of
    /// the provider rule, a tool list over nexus's bound); the earlier tools stay.
    pub(crate) fn set_extra_tools(&self, tools: Vec<ExtraTool>) -> Result<(), CatalogError> {
        let mut sources = self.lock_sources();
        let candidate = Sources { file: Arc::clone(&sources.file), extra: tools, web_fetch: sources.web_fetch.clone() };
        let catalog = self.rebuild(&candidate)?;
        *sources = candidate;
        self.catalog.send_replace(Arc::new(catalog));
        Ok(())
    }

    /// [`Toolbox::set_extra_tools`], holding back each outside tool whose name another tool
    /// already has instead of refusing them all; answers the names held back.
    ///
    /// # Errors
    /// [`CatalogError`] for any other defect (a tool list over nexus's bound); the earlier
    /// tools stay.
    pub(crate) fn set_extra_tools_holding_back(&self, mut tools: Vec<ExtraTool>) -> Result<Vec<String>, CatalogError> {
        let mut held_back = Vec::new();
        loop {
            match self.set_extra_tools(tools.clone()) {
                Ok(()) => return Ok(held_back),
                Err(CatalogError::Duplicate(name)) if tools.iter().any(|tool| tool.spec.name == name) => {
                    tools.retain(|tool| tool.spec.name != name);
                    held_back.push(name);
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// The tools file served now (empty without one): its MCP servers are the hub's to run.
    pub(crate) fn tools_file(&self) -> Arc<ToolsFile> {
        Arc::clone(&self.lock_sources().file)
    }

    /// The catalog served now.
    pub(crate) fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog.borrow())
    }

    /// A receiver that sees every new catalog.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Arc<Catalog>> {
        self.catalog.subscribe()
    }

    fn lock_sources(&self) -> std::sync::MutexGuard<'_, Sources> {
        // A panic while holding it cannot leave the sources half-written: each is replaced whole.
        self.sources.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The catalog of the built-ins (with the file's settings), `skill`, the file's command
    /// tools and the outside tools, in that order.
    fn rebuild(&self, sources: &Sources) -> Result<Catalog, CatalogError> {
        let settings = &sources.file.builtins;
        let mut tools: Vec<(ToolSpec, Served)> = Builtin::ALL
            .into_iter()
            .filter(|tool| *tool != Builtin::WebFetch || sources.web_fetch.is_some())
            .map(|tool| {
                let timeout_ms = match (tool, &sources.web_fetch) {
                    (Builtin::Bash, _) => self.bash_timeout_ms,
                    (Builtin::WebFetch, Some(web)) => web.announced_timeout_ms(),
                    _ => FILE_TOOL_TIMEOUT_MS,
                };
                let spec = ToolSpec {
                    name: tool.name().to_owned(),
                    description: Some(tool.description().to_owned()),
                    input_schema: Some(tool.input_schema()),
                    effect_profile: tool.effect_profile(),
                    timeout_ms,
                    max_concurrency: settings.max_concurrency.get(&tool).copied(),
                };
                (spec, Served::Builtin(tool))
            })
            .collect();
        if self.skills_dir.is_some() {
            let spec = ToolSpec {
                name: "skill".to_owned(),
                description: None,
                input_schema: None,
                effect_profile: SKILL_EFFECT,
                timeout_ms: FILE_TOOL_TIMEOUT_MS,
                max_concurrency: None,
            };
            tools.push((spec, Served::Skill));
        }
        for command in &sources.file.commands {
            let spec = ToolSpec {
                name: command.name.clone(),
                description: Some(command.description.clone()),
                input_schema: Some(command.input_schema.clone()),
                effect_profile: command.effect_profile,
                timeout_ms: command.timeout_ms,
                max_concurrency: command.max_concurrency,
            };
            tools.push((spec, Served::Command(Arc::clone(command))));
        }
        for extra in &sources.extra {
            tools.push((extra.spec.clone(), Served::Extra(Arc::clone(&extra.call))));
        }
        Catalog::new(tools)
    }

    /// The mark bash puts on every process it starts.
    pub(crate) fn owner(&self) -> &Owner {
        &self.owner
    }

    pub(crate) fn workdir(&self) -> &PathBuf {
        &self.workdir
    }

    pub(crate) fn bash_timeout_ms(&self) -> u64 {
        self.bash_timeout_ms
    }

    /// How many calls of `tool` may be claimed or running at once; `None`: only the slots bound.
    pub(crate) fn max_concurrency(&self, tool: &str) -> Option<NonZeroUsize> {
        self.catalog.borrow().max_concurrency(tool)
    }

    /// The announce body: `{"tools": [...], "environment": {hostname, os, arch, workdir}}`, and
    /// with a skills directory `documents: [{name, description}]` and the `skill` tool (without
    /// description or schema: nexus routes `skill` calls to it, and never offers it to a model as
    /// a tool of its own). The skills directory is read again on every call.
    pub(crate) fn announcement(&self) -> Value {
        let tools = self.catalog().announced_tools();
        let mut body = json!({
            "environment": {
                "hostname": hostname(),
                "os": std::env::consts::OS,
                "arch": std::env::consts::ARCH,
                "workdir": self.workdir.display().to_string(),
            },
        });
        if let Some(dir) = &self.skills_dir {
            body["documents"] = Value::Array(skills::documents(dir));
        }
        body["tools"] = Value::Array(tools);
        body
    }

    /// Runs one call to completion, with the tool the catalog serves under `tool_name` now.
    /// Never panics on bad input: every problem is an outcome.
    #[cfg(test)]
    pub(crate) async fn run(&self, tool_name: &str, input: Value, ctx: ToolContext) -> ToolOutcome {
        self.run_in(&self.catalog(), tool_name, input, ctx).await
    }

    /// Runs one call with the tool `catalog` serves under `tool_name`: the catalog of the moment
    /// the call was started ([`Toolbox::catalog`]), so a reload meanwhile never changes its tool.
    pub(crate) async fn run_in(
        &self,
        catalog: &Catalog,
        tool_name: &str,
        input: Value,
        mut ctx: ToolContext,
    ) -> ToolOutcome {
        let Some((_, served)) = catalog.get(tool_name) else {
            return ToolOutcome::Failed {
                content: format!("unknown tool {tool_name:?}; this runner serves {}", catalog.names_for_message(20)),
            };
        };
        let tool = match served {
            Served::Builtin(tool) => *tool,
            Served::Extra(call) => return call(input, ctx).await,
            Served::Skill | Served::Command(_) => {
                let Value::Object(input) = input else {
                    return ToolOutcome::Failed { content: "tool_input must be a JSON object".to_owned() };
                };
                return match served {
                    Served::Command(command) => command::run(command, input, &mut ctx).await,
                    _ => self.skill(input, ctx).await,
                };
            }
        };
        let Value::Object(input) = input else {
            return ToolOutcome::Failed { content: "tool_input must be a JSON object".to_owned() };
        };
        let work: fn(&std::path::Path, &Map<String, Value>, &blocking::Cancel) -> ToolOutcome = match tool {
            Builtin::Bash => return bash::run(&input, &mut ctx).await,
            Builtin::ProcessStart => return processes::start(&self.processes, &self.workdir, &self.owner, &input),
            Builtin::ProcessRead => return processes::read(&self.processes, &input, &mut ctx).await,
            Builtin::ProcessWrite => return processes::write(&self.processes, &input, &mut ctx).await,
            Builtin::ProcessKill => return processes::kill(&self.processes, &input).await,
            Builtin::ProcessList => return processes::list(&self.processes),
            Builtin::WebFetch => {
                let Some(web) = self.lock_sources().web_fetch.clone() else {
                    return ToolOutcome::Failed { content: "web_fetch is not enabled on this runner".to_owned() };
                };
                return web::web_fetch(&web, &self.strays, &input, &mut ctx).await;
            }
            Builtin::ReadFile => files::read_file,
            Builtin::WriteFile => files::write_file,
            Builtin::ListDir => files::list_dir,
            Builtin::Edit => edit::edit,
            Builtin::ApplyPatch => patch::apply_patch,
            Builtin::Grep => search::grep,
            Builtin::Glob => search::glob,
        };
        // The sentence names this budget, never the elapsed time, as bash's does.
        let timeout_ms = ctx.task_timeout_ms.map_or(FILE_TOOL_TIMEOUT_MS, |ms| ms.min(FILE_TOOL_TIMEOUT_MS));
        let started = Instant::now();
        let until = ctx.clamp_at.map_or(started + Duration::from_millis(timeout_ms), |clamp| {
            clamp.min(started + Duration::from_millis(timeout_ms))
        });
        let workdir = self.workdir.clone();
        let ended =
            blocking::run(&self.strays, until, ctx.stopped(), move |cancel| work(&workdir, &input, cancel)).await;
        let name = tool.name();
        let effect = match tool.effect_profile().kind {
            EffectKind::Write => "; whether it took effect is unknown",
            EffectKind::ReadOnly | EffectKind::Pure => "",
        };
        match ended {
            Ended::Done(outcome) => outcome,
            Ended::TimedOut => {
                ToolOutcome::error(format!("{name} did not finish within its timeout of {timeout_ms} ms{effect}"))
            }
            Ended::Stopped(StopReason::Canceled) => {
                ToolOutcome::error(format!("{name} was abandoned because its task was canceled{effect}"))
            }
            Ended::Stopped(StopReason::Shutdown) => {
                ToolOutcome::error(format!("{name} was abandoned because the runner shut down{effect}"))
            }
            Ended::Busy => ToolOutcome::Failed {
                content: format!(
                    "{name} was not started: {} earlier file operations of this runner are still stuck in the \
                     kernel; try again later",
                    blocking::MAX_STRAYS
                ),
            },
            Ended::Crashed(why) => ToolOutcome::error(format!("{name} failed: {why}; its effect is unknown")),
        }
    }
}

impl Toolbox {
    /// `skill {name}`: a skill's content, read off the loop within the file tools' timeout.
    async fn skill(&self, input: Map<String, Value>, mut ctx: ToolContext) -> ToolOutcome {
        let Some(dir) = self.skills_dir.clone() else {
            return ToolOutcome::Failed { content: "this runner serves no skills".to_owned() };
        };
        let budget = Instant::now() + Duration::from_millis(FILE_TOOL_TIMEOUT_MS);
        let until = ctx.clamp_at.map_or(budget, |clamp| clamp.min(budget));
        match blocking::run(&self.strays, until, ctx.stopped(), move |_| skills::load(&dir, &input)).await {
            Ended::Done(outcome) => outcome,
            _ => ToolOutcome::error("skill was not read: the file did not open in time or the call was stopped"),
        }
    }
}

fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Argument readers shared by the tools; their errors are sentences for the model.
mod args {
    use serde_json::{Map, Value};

    pub(super) fn required_str<'a>(input: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
        match input.get(key) {
            Some(Value::String(text)) => Ok(text),
            Some(_) => Err(format!("`{key}` must be a string")),
            None => Err(format!("`{key}` is required")),
        }
    }

    pub(super) fn optional_str<'a>(input: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, String> {
        match input.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(format!("`{key}` must be a string")),
        }
    }

    pub(super) fn optional_bool(input: &Map<String, Value>, key: &str) -> Result<Option<bool>, String> {
        match input.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(flag)) => Ok(Some(*flag)),
            Some(_) => Err(format!("`{key}` must be true or false")),
        }
    }

    pub(super) fn optional_positive(input: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
        match input.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => match value.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(format!("`{key}` must be a positive integer")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcement_lists_every_tool_with_an_honest_five_key_profile() {
        let toolbox = Toolbox::new(PathBuf::from("/w"), 30_000, Owner::of_state_dir(std::path::Path::new("/s")));
        let body = toolbox.announcement();
        let tools = body["tools"].as_array().unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "bash",
                "read_file",
                "write_file",
                "list_dir",
                "edit",
                "apply_patch",
                "grep",
                "glob",
                "process_start",
                "process_read",
                "process_write",
                "process_kill",
                "process_list"
            ]
        );
        let profile = |name: &str| {
            let tool = tools.iter().find(|t| t["name"] == name).unwrap();
            let profile = tool["effect_profile"].as_object().unwrap();
            let mut keys: Vec<&str> = profile.keys().map(String::as_str).collect();
            keys.sort_unstable();
            assert_eq!(keys, ["destructive", "effect_scope", "idempotency", "kind", "reconciliation"]);
            assert_eq!(tool["input_schema"]["type"], "object");
            assert!(tool["description"].as_str().is_some_and(|d| !d.is_empty()));
            tool["effect_profile"].clone()
        };
        assert_eq!(
            profile("bash"),
            json!({"kind": "write", "destructive": true, "effect_scope": "open", "idempotency": "none", "reconciliation": "none"})
        );
        assert_eq!(
            profile("read_file"),
            json!({"kind": "read_only", "destructive": false, "effect_scope": "closed", "idempotency": "intrinsic", "reconciliation": "none"})
        );
        assert_eq!(
            profile("write_file"),
            json!({"kind": "write", "destructive": true, "effect_scope": "closed", "idempotency": "none", "reconciliation": "lookup"})
        );
        assert_eq!(profile("list_dir"), profile("read_file"));
        for read_only in ["grep", "glob", "process_list"] {
            assert_eq!(profile(read_only), profile("read_file"), "{read_only}");
        }
        for file_write in ["edit", "apply_patch"] {
            assert_eq!(profile(file_write), profile("write_file"), "{file_write}");
        }
        for open_write in ["process_start", "process_write"] {
            assert_eq!(profile(open_write), profile("bash"), "{open_write}");
        }
        assert_eq!(profile("process_read")["kind"], "read_only");
        assert_eq!(profile("process_read")["idempotency"], "none", "a read moves the cursor");
        assert_eq!(profile("process_kill")["idempotency"], "intrinsic");
        assert_eq!(profile("process_kill")["destructive"], true);
        let bytes = serde_json::to_string(&body["tools"]).unwrap().len();
        assert!(bytes < 64 * 1024, "the built-ins take {bytes} bytes of the announcement");
        assert_eq!(tools[0]["timeout_ms"], 30_000);
        assert_eq!(tools[0]["input_schema"]["required"], json!(["command"]));
        assert_eq!(body["environment"]["workdir"], "/w");
        assert_eq!(body["environment"]["os"], std::env::consts::OS);
    }

    #[tokio::test]
    async fn web_fetch_is_announced_and_served_only_when_configured() {
        let dir = tempfile::tempdir().unwrap();
        let plain = Toolbox::new(dir.path().to_owned(), 1_000, Owner::of_state_dir(dir.path()));
        let names = |toolbox: &Toolbox| -> Vec<String> {
            toolbox.announcement()["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect()
        };
        assert!(!names(&plain).contains(&"web_fetch".to_owned()));
        let (_stop_tx, ctx) = ToolContext::for_test(plain.workdir(), plain.owner(), 1_000);
        let refused = plain.run("web_fetch", json!({"url": "http://127.0.0.1/"}), ctx).await;
        assert!(matches!(&refused, ToolOutcome::Failed { content } if content.contains("unknown tool")), "{refused:?}");

        let config = WebFetchConfig { allow_hosts: vec!["docs.rs".to_owned()], max_bytes: 1_000, timeout_ms: 3_000 };
        let web = Toolbox::new(dir.path().to_owned(), 1_000, Owner::of_state_dir(dir.path())).with_web_fetch(config);
        let body = web.announcement();
        let tool =
            body["tools"].as_array().unwrap().iter().find(|t| t["name"] == "web_fetch").cloned().expect("web_fetch");
        assert_eq!(tool["timeout_ms"], 8_000, "the fetch's timeout and the conversion's margin");
        assert_eq!(
            tool["effect_profile"],
            json!({"kind": "read_only", "destructive": false, "effect_scope": "open", "idempotency": "intrinsic", "reconciliation": "none"})
        );
    }

    #[tokio::test]
    async fn a_skills_dir_announces_its_documents_and_serves_skill() {
        let dir = tempfile::tempdir().unwrap();
        let skills = dir.path().join("skills");
        std::fs::create_dir_all(skills.join("deploy")).unwrap();
        std::fs::write(skills.join("deploy/SKILL.md"), "---\ndescription: How to deploy\n---\nStep 1.\n").unwrap();
        let owner = Owner::of_state_dir(dir.path());
        let plain = Toolbox::new(dir.path().to_owned(), 1_000, owner.clone());
        assert!(plain.announcement().get("documents").is_none(), "no skills dir, no documents");
        assert!(!plain.announcement()["tools"].as_array().unwrap().iter().any(|t| t["name"] == "skill"));
        let toolbox = Toolbox::new(dir.path().to_owned(), 1_000, owner).with_skills_dir(Some(skills.clone()));
        let body = toolbox.announcement();
        assert_eq!(body["documents"], json!([{"name": "deploy", "description": "How to deploy"}]));
        let skill = body["tools"].as_array().unwrap().iter().find(|t| t["name"] == "skill").cloned().expect("skill");
        assert!(skill.get("description").is_none() && skill.get("input_schema").is_none(), "invisible to models");
        assert_eq!(skill["effect_profile"]["kind"], "read_only");
        // A skill added later is announced at the next connect.
        std::fs::create_dir_all(skills.join("triage")).unwrap();
        std::fs::write(skills.join("triage/SKILL.md"), "Sort bugs").unwrap();
        assert_eq!(toolbox.announcement()["documents"].as_array().map(Vec::len), Some(2));
        let (_stop_tx, ctx) = ToolContext::for_test(toolbox.workdir(), toolbox.owner(), 1_000);
        let loaded = toolbox.run("skill", json!({"name": "deploy"}), ctx).await;
        assert!(
            matches!(&loaded, ToolOutcome::Completed { content, is_error: false, .. } if content.ends_with("Step 1.\n"))
        );
    }

    #[tokio::test]
    async fn the_catalog_serves_the_file_and_outside_tools_and_tells_of_each_change() {
        let dir = tempfile::tempdir().unwrap();
        let toolbox = Toolbox::new(dir.path().canonicalize().unwrap(), 1_000, Owner::of_state_dir(dir.path()));
        let mut changes = toolbox.subscribe();
        let text = "[[tool]]\nname = \"echo\"\ndescription = \"d\"\ncommand = [\"cat\"]\nmax_concurrency = 3\n\
                    effect_profile = { kind = \"pure\", destructive = false, effect_scope = \"closed\", idempotency = \"intrinsic\", reconciliation = \"none\" }\n\
                    [builtin.list_dir]\nmax_concurrency = 1\n";
        let file = crate::toolsfile::parse(&dir.path().join("tools.toml"), text).unwrap();
        toolbox.replace_tools_file(file).unwrap();
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert_eq!(toolbox.tools_file().commands.len(), 1);
        assert_eq!(toolbox.max_concurrency("echo").map(NonZeroUsize::get), Some(3));
        assert_eq!(toolbox.max_concurrency("list_dir").map(NonZeroUsize::get), Some(1));
        assert_eq!(toolbox.max_concurrency("bash"), None);
        let echo = &toolbox.announcement()["tools"][Builtin::ALL.len() - 1];
        assert_eq!((echo["name"].as_str(), echo["effect_profile"]["kind"].as_str()), (Some("echo"), Some("pure")));

        // The outside slot: announced after the file's tools, and called through its closure.
        let call: catalog::ExtraCall = Arc::new(|input: Value, _ctx: ToolContext| {
            Box::pin(async move {
                ToolOutcome::Completed { content: "extra".into(), structured_content: input, is_error: false }
            })
        });
        let spec = |name: &str| ToolSpec {
            name: name.to_owned(),
            description: Some("an outside tool".to_owned()),
            input_schema: Some(json!({"type": "object"})),
            effect_profile: EffectProfile::UNKNOWN_WRITE,
            timeout_ms: 5_000,
            max_concurrency: None,
        };
        toolbox.set_extra_tools(vec![ExtraTool { spec: spec("fs_read"), call: Arc::clone(&call) }]).unwrap();
        assert!(changes.has_changed().unwrap());
        let names: Vec<String> = toolbox.catalog().specs().map(|spec| spec.name.clone()).collect();
        let builtins = Builtin::ALL.len() - 1;
        let expected: Vec<String> = Builtin::ALL[..builtins].iter().map(|tool| tool.name().to_owned()).collect();
        assert_eq!(names[..builtins], expected);
        assert_eq!(names[builtins..], ["echo", "fs_read"], "after the built-ins but web_fetch");
        let (_stop_tx, ctx) = ToolContext::for_test(toolbox.workdir(), toolbox.owner(), 1_000);
        let outcome = toolbox.run("fs_read", json!({"a": 1}), ctx).await;
        assert!(
            matches!(&outcome, ToolOutcome::Completed { content, structured_content, .. } if content == "extra" && structured_content["a"] == 1)
        );

        // A name taken is refused and the catalog stays.
        changes.borrow_and_update();
        let taken = toolbox.set_extra_tools(vec![ExtraTool { spec: spec("echo"), call }]);
        assert_eq!(taken.unwrap_err(), CatalogError::Duplicate("echo".into()));
        assert!(!changes.has_changed().unwrap());
        assert!(toolbox.catalog().get("fs_read").is_some());
    }

    #[test]
    fn five_hundred_command_tools_fit_and_a_list_over_nexus_bound_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tools.toml");
        let toolbox = Toolbox::new(dir.path().canonicalize().unwrap(), 1_000, Owner::of_state_dir(dir.path()));
        let file_of = |count: usize, description: &str| {
            let mut text = String::new();
            for n in 0..count {
                text.push_str(&format!(
                    "[[tool]]\nname = \"tool_{n:03}\"\ndescription = \"{description}\"\ncommand = [\"cat\"]\n\
                     input_schema = {{ type = \"object\", properties = {{ path = {{ type = \"string\" }} }} }}\n\
                     effect_profile = {{ kind = \"read_only\", destructive = false, effect_scope = \"closed\", idempotency = \"intrinsic\", reconciliation = \"none\" }}\n"
                ));
            }
            crate::toolsfile::parse(&path, &text).unwrap()
        };
        toolbox.replace_tools_file(file_of(500, &"Does one thing well. ".repeat(20))).unwrap();
        let body = toolbox.announcement();
        let tools = body["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 500 + Builtin::ALL.len() - 1, "the built-ins but web_fetch, and 500");
        assert!(serde_json::to_string(tools).unwrap().len() <= catalog::MAX_TOOL_LIST_BYTES);
        assert!(tools.iter().all(|t| crate::toolsfile::tool_name_problem(t["name"].as_str().unwrap()).is_none()
            || Builtin::from_name(t["name"].as_str().unwrap()).is_some()));

        let refused = toolbox.replace_tools_file(file_of(500, &"x".repeat(2_100))).unwrap_err();
        assert!(matches!(refused, CatalogError::TooLarge(bytes) if bytes > catalog::MAX_TOOL_LIST_BYTES));
        let as_file_error = crate::toolsfile::ToolsFileError::of_catalog(&path, &refused);
        assert_eq!(as_file_error.problem, crate::toolsfile::Problem::TooLarge);
        assert_eq!(toolbox.catalog().specs().count(), 500 + Builtin::ALL.len() - 1, "the earlier tools stay");
    }

    #[test]
    fn commit_bodies_have_the_spec_shape() {
        let completed =
            ToolOutcome::Completed { content: "ok".into(), structured_content: json!({"a": 1}), is_error: false };
        assert_eq!(
            completed.into_commit_body(),
            json!({"content": "ok", "structured_content": {"a": 1}, "is_error": false})
        );
        let failed = ToolOutcome::Failed { content: "no such tool".into() };
        assert_eq!(failed.into_commit_body(), json!({"outcome": "failed", "content": "no such tool"}));
    }

    #[test]
    fn commit_body_replaces_nul_and_fits_the_bound() {
        let outcome = ToolOutcome::Completed {
            content: "a\0b".into(),
            structured_content: json!({"raw": "x\0"}),
            is_error: false,
        };
        let body = outcome.into_commit_body();
        assert_eq!(body["content"], "a\u{FFFD}b");
        assert_eq!(body["structured_content"]["raw"], "x\u{FFFD}");

        // Both channels together are too big: structured goes first, content survives whole.
        let half = "é".repeat(MAX_COMMIT_BODY_BYTES / 3);
        let body = ToolOutcome::Completed {
            content: half.clone(),
            structured_content: json!({"stdout": half}),
            is_error: false,
        }
        .into_commit_body();
        assert_eq!(body["content"].as_str().unwrap().len(), half.len());
        assert!(body["structured_content"]["omitted"].is_string());
        assert!(encoded_len(&body) <= MAX_COMMIT_BODY_BYTES);

        // Content alone is too big, and escapes make it bigger still: cut on a char boundary.
        let body = ToolOutcome::Completed {
            content: "\"é".repeat(MAX_COMMIT_BODY_BYTES),
            structured_content: Value::Null,
            is_error: true,
        }
        .into_commit_body();
        let content = body["content"].as_str().unwrap();
        assert!(encoded_len(&body) <= MAX_COMMIT_BODY_BYTES);
        assert!(encoded_len(&body) > MAX_COMMIT_BODY_BYTES - 100);
        assert!(content.ends_with("-byte commit bound]"));
        assert_eq!(body["is_error"], true);
    }

    #[test]
    fn escaped_len_matches_serde_json() {
        let samples = (0u32..0x100).filter_map(char::from_u32).chain(['€', '😀', '\u{2028}']);
        for ch in samples {
            let encoded = serde_json::to_string(&ch.to_string()).unwrap();
            assert_eq!(escaped_len(ch), encoded.len() - 2, "{ch:?}");
        }
    }

    #[tokio::test]
    async fn started_processes_outlive_bash_sweeps_and_die_at_shutdown_or_the_owner_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let toolbox = Toolbox::new(dir.path().canonicalize().unwrap(), 10_000, Owner::of_state_dir(dir.path()));
        let ctx = || ToolContext::for_test(toolbox.workdir(), toolbox.owner(), 10_000).1;
        let pid_of = |outcome: &ToolOutcome| match outcome {
            ToolOutcome::Completed { structured_content, is_error: false, .. } => {
                i32::try_from(structured_content["pid"].as_u64().unwrap()).unwrap()
            }
            other => panic!("{other:?}"),
        };
        let first = pid_of(&toolbox.run("process_start", json!({"command": "sleep 1000"}), ctx()).await);
        let second = pid_of(&toolbox.run("process_start", json!({"command": "sleep 1000"}), ctx()).await);
        // A bash call sweeps its own mark when it ends; the started processes carry none.
        let bash = toolbox.run("bash", json!({"command": "true"}), ctx()).await;
        assert!(matches!(bash, ToolOutcome::Completed { is_error: false, .. }));
        let alive = |pid: i32| !test_processes::is_dead(pid);
        assert!(alive(first) && alive(second), "a bash call's sweep killed a started process");
        let listed = toolbox.run("process_list", json!({}), ctx()).await;
        assert!(
            matches!(&listed, ToolOutcome::Completed { structured_content, .. } if structured_content["processes"].as_array().map(Vec::len) == Some(2))
        );
        // runner-agent's start and stop sweep (the owner's mark) finds them ...
        assert!(reap::kill_marked(reap::OWNER_VAR, toolbox.owner().as_str()) >= 1);
        test_processes::wait_dead(&[first, second], "after the owner's sweep").await;
        // ... and so does the toolbox's shutdown.
        let third = pid_of(&toolbox.run("process_start", json!({"command": "sleep 1000"}), ctx()).await);
        toolbox.shutdown().await;
        test_processes::wait_dead(&[third], "after the toolbox's shutdown").await;
    }

    #[tokio::test]
    async fn unknown_tools_and_non_object_input_fail_without_running() {
        let dir = tempfile::tempdir().unwrap();
        let toolbox = Toolbox::new(dir.path().canonicalize().unwrap(), 1_000, Owner::of_state_dir(dir.path()));
        let ctx = || ToolContext::for_test(toolbox.workdir(), toolbox.owner(), 1_000).1;
        let unknown = toolbox.run("rm_rf", json!({}), ctx()).await;
        assert!(matches!(&unknown, ToolOutcome::Failed { content } if content.contains("rm_rf")));
        let not_object = toolbox.run("bash", json!(["echo"]), ctx()).await;
        assert!(matches!(not_object, ToolOutcome::Failed { .. }));
        let missing = toolbox.run("bash", json!({}), ctx()).await;
        assert!(matches!(missing, ToolOutcome::Completed { is_error: true, .. }));
    }
}
