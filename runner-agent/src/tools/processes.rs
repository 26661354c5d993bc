//! `process_start`, `process_read`, `process_write`, `process_kill` and `process_list`:
//! long-running processes (a dev server, a REPL) that outlive the call that started them.
//!
//! Each is `bash -c command` in the workdir, leading a process group of its own, with stdin, stdout
//! and stderr piped. Its environment carries the runner's [`OWNER_VAR`] mark, so runner-agent's
//! sweeps at stop and start kill it and what it started, and a mark of its own
//! ([`PROCESS_VAR`]), so `process_kill` finds what left its group; it does not carry a call's
//! [`CALL_VAR`], so no call's sweep kills it. When its shell exits, what it left running in its
//! group or with its mark is killed too.
//!
//! stdout and stderr go, interleaved as they come, into one ring of [`BUFFER_BYTES`]; a read
//! returns what is new since the previous read and says how many bytes were overwritten unread.
//! The [`ProcessTable`] holds at most [`MAX_PROCESSES`]: a start past it reuses the place of the
//! process that exited longest ago, and is refused when all of them still run.
//! [`ProcessTable::shutdown`] (runner-agent stopping) kills them all.

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{Instrument, debug, warn};

use super::args::{optional_bool, optional_positive, optional_str, required_str};
use super::reap::{CALL_VAR, OWNER_VAR, Owner, kill_marked};
use super::{ToolContext, ToolOutcome};
use crate::sleep_until_opt;

/// Names the process (as a mark) in the environment of everything a started process runs.
pub(crate) const PROCESS_VAR: &str = "NEXUS_RUNNER_PROCESS";
/// The table holds at most this many processes, running or exited.
pub(crate) const MAX_PROCESSES: usize = 16;
/// Each process keeps at most this many bytes of output (1 MiB).
pub(crate) const BUFFER_BYTES: usize = 1024 * 1024;
/// process_read returns at most this many bytes when `max_bytes` is not given.
const DEFAULT_READ_BYTES: usize = 64 * 1024;
/// process_read returns at most this many bytes (the text travels twice in a commit body).
pub(crate) const MAX_READ_BYTES: usize = 256 * 1024;
/// process_read waits at most this long for new output (`wait_ms`).
pub(crate) const MAX_WAIT_MS: u64 = 30_000;
/// process_write gives up on a process that does not read its stdin after this long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long process_kill waits for the killed process to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// Once the shell exited, output still in the pipes is read for at most this long.
const PIPE_DRAIN_GRACE: Duration = Duration::from_millis(200);
/// Bound on one sweep for the processes with a process's mark.
const SWEEP_TIMEOUT: Duration = Duration::from_secs(5);
/// A command is shown in process_list cut at this many characters.
const COMMAND_SHOWN_CHARS: usize = 200;

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Exit {
    /// The exit code, or 128 + the signal that killed it (as bash reports it).
    code: i32,
    signal: Option<i32>,
}

impl Exit {
    fn of(status: &ExitStatus) -> Exit {
        Exit {
            code: status.code().or_else(|| status.signal().map(|sig| 128 + sig)).unwrap_or(-1),
            signal: status.signal(),
        }
    }

    fn describe(self) -> String {
        match self.signal {
            Some(signal) => format!("exited: killed by signal {signal} (exit code {})", self.code),
            None => format!("exited with code {}", self.code),
        }
    }
}

/// A process's output ring, read cursor and state, behind one lock.
#[derive(Debug, Default)]
struct Output {
    ring: VecDeque<u8>,
    /// Bytes ever written; the ring holds the last `ring.len()` of them.
    total: u64,
    /// Bytes of the stream already returned or overwritten unread.
    cursor: u64,
    exit: Option<Exit>,
    ended_at: Option<Instant>,
    /// The group to signal; `None` once the shell was reaped (its id may be reused).
    group: Option<Pid>,
}

impl Output {
    fn push(&mut self, bytes: &[u8]) {
        self.ring.extend(bytes);
        if self.ring.len() > BUFFER_BYTES {
            let excess = self.ring.len() - BUFFER_BYTES;
            self.ring.drain(..excess);
        }
        self.total += bytes.len() as u64;
    }

    /// What is new since the last read, at most `max_bytes`: the bytes, how many were
    /// overwritten unread, and how many remain unread.
    fn read(&mut self, max_bytes: usize) -> (Vec<u8>, u64, u64) {
        let first_kept = self.total - self.ring.len() as u64;
        let start = self.cursor.max(first_kept);
        let dropped = start - self.cursor;
        let available = usize::try_from(self.total - start).unwrap_or(usize::MAX);
        let skip = usize::try_from(start - first_kept).unwrap_or(0);
        let mut bytes: Vec<u8> = self.ring.iter().skip(skip).take(available.min(max_bytes)).copied().collect();
        // A character cut by max_bytes waits for the next read.
        if bytes.len() < available
            && let Err(err) = std::str::from_utf8(&bytes)
            && err.error_len().is_none()
            && err.valid_up_to() > 0
        {
            bytes.truncate(err.valid_up_to());
        }
        self.cursor = start + bytes.len() as u64;
        (bytes, dropped, self.total - self.cursor)
    }
}

/// One started process.
#[derive(Debug)]
struct Process {
    id: String,
    name: Option<String>,
    command: String,
    pid: Option<u32>,
    /// Its mark ([`PROCESS_VAR`]).
    mark: String,
    started: Instant,
    output: Mutex<Output>,
    /// Woken at every new output and at the exit.
    changed: Notify,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    /// The task that reads its output and waits for it.
    pump: Mutex<Option<JoinHandle<()>>>,
}

impl Process {
    fn output(&self) -> MutexGuard<'_, Output> {
        // A panic while holding the lock leaves the ring consistent enough to read.
        self.output.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn kill_group(&self) {
        if let Some(group) = self.output().group {
            // ESRCH: the group is gone already.
            let _ = killpg(group, Signal::SIGKILL);
        }
    }

    fn summary(&self) -> Value {
        let output = self.output();
        let command: String = self.command.chars().take(COMMAND_SHOWN_CHARS).collect();
        json!({
            "id": self.id,
            "name": self.name,
            "command": command,
            "pid": self.pid,
            "running": output.exit.is_none(),
            "exit_code": output.exit.map(|exit| exit.code),
            "unread_bytes": output.total - output.cursor.max(output.total - output.ring.len() as u64),
            "seconds": self.started.elapsed().as_secs(),
        })
    }
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    entries: BTreeMap<u64, Arc<Process>>,
    /// Set by shutdown: no process starts any more.
    closed: bool,
}

/// The processes of one toolbox (see the module's page).
#[derive(Debug, Default)]
pub(crate) struct ProcessTable {
    table: Mutex<Table>,
}

impl ProcessTable {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn find(&self, id: &str) -> Result<Arc<Process>, String> {
        let table = self.table();
        table.entries.values().find(|process| process.id == id).cloned().ok_or_else(|| {
            let known: Vec<&str> = table.entries.values().map(|process| process.id.as_str()).collect();
            if known.is_empty() {
                format!("no process {id:?}; none is held (process_start starts one)")
            } else {
                format!("no process {id:?}; held: {}", known.join(", "))
            }
        })
    }

    /// Kills every process and what it started, and stops their tasks; no process starts after.
    pub(crate) async fn shutdown(&self) {
        let processes: Vec<Arc<Process>> = {
            let mut table = self.table();
            table.closed = true;
            std::mem::take(&mut table.entries).into_values().collect()
        };
        if processes.is_empty() {
            return;
        }
        for process in &processes {
            process.kill_group();
        }
        let marks: Vec<String> = processes.iter().map(|process| process.mark.clone()).collect();
        sweep(marks).await;
        for process in &processes {
            let pump = process.pump.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
            if let Some(pump) = pump {
                pump.abort();
            }
        }
        debug!(count = processes.len(), "killed the started processes");
    }
}

impl Drop for ProcessTable {
    /// A table dropped without [`ProcessTable::shutdown`] still leaves no process running.
    fn drop(&mut self) {
        let table = self.table.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        for process in table.entries.values() {
            process.kill_group();
            kill_marked(PROCESS_VAR, &process.mark);
            if let Some(pump) = process.pump.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
                pump.abort();
            }
        }
    }
}

/// Kills every process carrying one of `marks`, off the runtime's threads, bounded.
async fn sweep(marks: Vec<String>) {
    let swept =
        tokio::task::spawn_blocking(move || marks.iter().map(|mark| kill_marked(PROCESS_VAR, mark)).sum::<usize>());
    match tokio::time::timeout(SWEEP_TIMEOUT, swept).await {
        Ok(Ok(killed)) if killed > 0 => debug!(killed, "killed what started processes left"),
        Ok(_) => {}
        Err(_) => warn!("the sweep for what started processes left did not finish in time"),
    }
}

/// `process_start {command, name?}`.
pub(super) fn start(table: &ProcessTable, workdir: &Path, owner: &Owner, input: &Map<String, Value>) -> ToolOutcome {
    let parsed = required_str(input, "command").and_then(|command| Ok((command, optional_str(input, "name")?)));
    let (command, name) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return ToolOutcome::error(message),
    };
    if name.is_some_and(|name| name.chars().count() > 64) {
        return ToolOutcome::error("`name` must be at most 64 characters");
    }
    let mut guard = table.table();
    if guard.closed {
        return ToolOutcome::error("no process was started: the runner is shutting down");
    }
    if guard.entries.len() >= MAX_PROCESSES {
        let oldest_exited = guard
            .entries
            .iter()
            .filter_map(|(key, process)| process.output().ended_at.map(|at| (at, *key)))
            .min()
            .map(|(_, key)| key);
        match oldest_exited {
            Some(key) => {
                guard.entries.remove(&key);
            }
            None => {
                return ToolOutcome::error(format!(
                    "no process was started: {MAX_PROCESSES} processes are running, the most this runner holds; \
                     stop one with process_kill (process_list lists them)"
                ));
            }
        }
    }
    guard.next += 1;
    let key = guard.next;
    let id = format!("p{key}");
    let mark = owner.new_call();
    let spawned = Command::new("bash")
        .arg("-c")
        .arg(command)
        .current_dir(workdir)
        .env(OWNER_VAR, owner.as_str())
        .env(PROCESS_VAR, &mark)
        .env_remove(CALL_VAR)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => return ToolOutcome::Failed { content: format!("could not start bash: {err}") },
    };
    let pid = child.id();
    let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return ToolOutcome::Failed { content: "could not capture the pipes of bash".to_owned() };
    };
    let group = pid.and_then(|pid| i32::try_from(pid).ok()).map(Pid::from_raw);
    let process = Arc::new(Process {
        id: id.clone(),
        name: name.map(str::to_owned),
        command: command.to_owned(),
        pid,
        mark,
        started: Instant::now(),
        output: Mutex::new(Output { group, ..Output::default() }),
        changed: Notify::new(),
        stdin: tokio::sync::Mutex::new(Some(stdin)),
        pump: Mutex::new(None),
    });
    let span = tracing::debug_span!("process", process_id = %id, pid);
    let pump = tokio::spawn(pump(Arc::clone(&process), child, stdout, stderr).instrument(span));
    *process.pump.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(pump);
    guard.entries.insert(key, process);
    drop(guard);
    let called = name.map_or_else(String::new, |name| format!(" ({name})"));
    ToolOutcome::Completed {
        content: format!(
            "started process {id}{called}, pid {}; read its output with process_read {{\"id\": \"{id}\"}}",
            pid.map_or_else(|| "unknown".to_owned(), |pid| pid.to_string())
        ),
        structured_content: json!({ "id": id, "pid": pid, "name": name }),
        is_error: false,
    }
}

/// Reads the process's output into its ring until the shell exits and the pipes are drained,
/// then kills what it left behind and records its exit.
async fn pump(
    process: Arc<Process>,
    mut child: Child,
    mut stdout: tokio::process::ChildStdout,
    mut stderr: tokio::process::ChildStderr,
) {
    let (mut out_open, mut err_open) = (true, true);
    let (mut out_buf, mut err_buf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let mut status: Option<std::io::Result<ExitStatus>> = None;
    let mut drain_until: Option<Instant> = None;
    while status.is_none() || out_open || err_open {
        tokio::select! {
            read = stdout.read(&mut out_buf), if out_open => match read {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => { process.output().push(&out_buf[..n]); process.changed.notify_waiters(); }
            },
            read = stderr.read(&mut err_buf), if err_open => match read {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => { process.output().push(&err_buf[..n]); process.changed.notify_waiters(); }
            },
            exited = child.wait(), if status.is_none() => {
                status = Some(exited);
                // What it left in its group dies with it; then its id may be reused.
                process.kill_group();
                process.output().group = None;
                drain_until = Some(Instant::now() + PIPE_DRAIN_GRACE);
            }
            () = sleep_until_opt(drain_until) => break,
        }
    }
    sweep(vec![process.mark.clone()]).await;
    let exit = match status {
        Some(Ok(status)) => Exit::of(&status),
        Some(Err(err)) => {
            warn!(error = %err, "could not wait for a started process");
            Exit { code: -1, signal: None }
        }
        None => Exit { code: -1, signal: None },
    };
    {
        let mut output = process.output();
        output.exit = Some(exit);
        output.ended_at = Some(Instant::now());
    }
    process.changed.notify_waiters();
}

/// `process_read {id, max_bytes?, wait_ms?}`.
pub(super) async fn read(table: &ProcessTable, input: &Map<String, Value>, ctx: &mut ToolContext) -> ToolOutcome {
    let parsed = (|| {
        Ok::<_, String>((
            required_str(input, "id")?,
            optional_positive(input, "max_bytes")?,
            match input.get("wait_ms") {
                None | Some(Value::Null) => 0,
                Some(value) => value.as_u64().ok_or_else(|| "`wait_ms` must be a non-negative integer".to_owned())?,
            },
        ))
    })();
    let (id, max_bytes, wait_ms) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return ToolOutcome::error(message),
    };
    let process = match table.find(id) {
        Ok(process) => process,
        Err(message) => return ToolOutcome::error(message),
    };
    let max_bytes =
        max_bytes.map_or(DEFAULT_READ_BYTES, |n| usize::try_from(n).unwrap_or(usize::MAX)).min(MAX_READ_BYTES);
    let wait_until = Instant::now() + Duration::from_millis(wait_ms.min(MAX_WAIT_MS));
    let wait_until = ctx.clamp_at.map_or(wait_until, |clamp| clamp.min(wait_until));
    loop {
        let notified = process.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let output = process.output();
            if output.total > output.cursor || output.exit.is_some() {
                break;
            }
        }
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep_until(wait_until) => break,
            _ = ctx.stopped() => break,
        }
    }
    let (bytes, dropped, unread, exit) = {
        let mut output = process.output();
        let (bytes, dropped, unread) = output.read(max_bytes);
        (bytes, dropped, unread, output.exit)
    };
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let state = exit.map_or_else(|| "running".to_owned(), Exit::describe);
    let mut content = format!("process {}: {state}\n", process.id);
    if dropped > 0 {
        content.push_str(&format!("[{dropped} bytes of output were overwritten before they were read]\n"));
    }
    if text.is_empty() {
        content.push_str("(no new output)\n");
    } else {
        content.push_str(&text);
        if !content.ends_with('\n') {
            content.push('\n');
        }
    }
    if unread > 0 {
        content.push_str(&format!("[{unread} more bytes unread; read again]\n"));
    }
    ToolOutcome::Completed {
        content,
        structured_content: json!({
            "id": process.id,
            "output": text,
            "dropped_bytes": dropped,
            "unread_bytes": unread,
            "running": exit.is_none(),
            "exit_code": exit.map(|exit| exit.code),
        }),
        is_error: false,
    }
}

/// `process_write {id, input, close_stdin?}`.
pub(super) async fn write(table: &ProcessTable, input: &Map<String, Value>, ctx: &mut ToolContext) -> ToolOutcome {
    let parsed = (|| {
        Ok::<_, String>((
            required_str(input, "id")?,
            required_str(input, "input")?,
            optional_bool(input, "close_stdin")?.unwrap_or(false),
        ))
    })();
    let (id, text, close) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return ToolOutcome::error(message),
    };
    let process = match table.find(id) {
        Ok(process) => process,
        Err(message) => return ToolOutcome::error(message),
    };
    if process.output().exit.is_some() {
        return ToolOutcome::error(format!("process {id} has exited; nothing was written"));
    }
    let mut stdin = process.stdin.lock().await;
    let Some(pipe) = stdin.as_mut() else {
        return ToolOutcome::error(format!("process {id}: its stdin was closed by an earlier process_write"));
    };
    let give_up = Instant::now() + WRITE_TIMEOUT;
    let give_up = ctx.clamp_at.map_or(give_up, |clamp| clamp.min(give_up));
    let bytes = text.as_bytes();
    let mut written = 0;
    let mut failure = None;
    while written < bytes.len() {
        tokio::select! {
            wrote = pipe.write(&bytes[written..]) => match wrote {
                Ok(0) => { failure = Some("its stdin is closed".to_owned()); break; }
                Ok(n) => written += n,
                Err(err) => { failure = Some(format!("{err}")); break; }
            },
            () = tokio::time::sleep_until(give_up) => {
                failure = Some("it did not read its stdin in time".to_owned());
                break;
            }
            _ = ctx.stopped() => {
                failure = Some("the call was stopped".to_owned());
                break;
            }
        }
    }
    if failure.is_none() {
        let _ = pipe.flush().await;
    }
    if close {
        *stdin = None;
    }
    let closed = if close { "; stdin closed" } else { "" };
    match failure {
        None => ToolOutcome::Completed {
            content: format!("wrote {written} bytes to process {id}{closed}"),
            structured_content: json!({ "id": id, "bytes": written, "stdin_closed": close }),
            is_error: false,
        },
        Some(why) => ToolOutcome::Completed {
            content: format!("wrote {written} of {} bytes to process {id}: {why}{closed}", bytes.len()),
            structured_content: json!({ "id": id, "bytes": written, "stdin_closed": close, "error": why }),
            is_error: true,
        },
    }
}

/// `process_kill {id}`: kills it and what it started, waits (bounded) for its exit, and drops it
/// from the table, answering its unread output (at most [`DEFAULT_READ_BYTES`]).
pub(super) async fn kill(table: &ProcessTable, input: &Map<String, Value>) -> ToolOutcome {
    let id = match required_str(input, "id") {
        Ok(id) => id,
        Err(message) => return ToolOutcome::error(message),
    };
    let process = match table.find(id) {
        Ok(process) => process,
        Err(message) => return ToolOutcome::error(message),
    };
    process.kill_group();
    sweep(vec![process.mark.clone()]).await;
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        let notified = process.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if process.output().exit.is_some() {
            break;
        }
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep_until(deadline) => break,
        }
    }
    table.table().entries.retain(|_, held| !Arc::ptr_eq(held, &process));
    let (bytes, _, _, exit) = {
        let mut output = process.output();
        let (bytes, dropped, unread) = output.read(DEFAULT_READ_BYTES);
        (bytes, dropped, unread, output.exit)
    };
    if exit.is_none()
        && let Some(pump) = process.pump.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    {
        // Still not reaped: the task goes, and its child is killed when dropped.
        pump.abort();
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let state = exit.map_or_else(|| "killed; its exit was not seen in time".to_owned(), Exit::describe);
    let tail = if text.is_empty() { String::new() } else { format!("\nunread output:\n{text}") };
    ToolOutcome::Completed {
        content: format!("process {id} {state}; it is no longer held{tail}"),
        structured_content: json!({ "id": id, "exit_code": exit.map(|exit| exit.code), "output": text }),
        is_error: false,
    }
}

/// `process_list {}`.
pub(super) fn list(table: &ProcessTable) -> ToolOutcome {
    let processes: Vec<Arc<Process>> = table.table().entries.values().cloned().collect();
    let summaries: Vec<Value> = processes.iter().map(|process| process.summary()).collect();
    let mut content = if summaries.is_empty() { "no processes\n".to_owned() } else { String::new() };
    for summary in &summaries {
        let state = match &summary["exit_code"] {
            Value::Null => "running".to_owned(),
            code => format!("exited {code}"),
        };
        let name = summary["name"].as_str().map_or_else(String::new, |name| format!(" ({name})"));
        content.push_str(&format!(
            "{}{name}: {state}, pid {}, {} s, {} bytes unread: {}\n",
            summary["id"].as_str().unwrap_or_default(),
            summary["pid"],
            summary["seconds"],
            summary["unread_bytes"],
            summary["command"].as_str().unwrap_or_default(),
        ));
    }
    ToolOutcome::Completed { content, structured_content: json!({ "processes": summaries }), is_error: false }
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;

    use super::*;

    fn context(workdir: &Path) -> (watch::Sender<Option<super::super::StopReason>>, ToolContext) {
        ToolContext::for_test(workdir, &Owner::of_state_dir(workdir), 10_000)
    }

    fn completed(outcome: ToolOutcome) -> (String, Value, bool) {
        outcome.into_parts()
    }

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    /// Reads until the output holds `needle` (or the process exited), waiting on the process.
    async fn read_until(table: &ProcessTable, ctx: &mut ToolContext, id: &str, needle: &str) -> (String, Value) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = String::new();
        loop {
            let (_, structured, is_error) =
                completed(read(table, &args(json!({"id": id, "wait_ms": 2_000})), ctx).await);
            assert!(!is_error);
            seen.push_str(structured["output"].as_str().unwrap());
            if seen.contains(needle) || structured["running"] == false {
                return (seen, structured);
            }
            assert!(Instant::now() < deadline, "never saw {needle:?}; saw {seen:?}");
        }
    }

    use crate::tools::test_processes::{pids, wait_dead};
    use crate::tools::test_workdir as workdir;

    #[tokio::test]
    async fn a_repl_keeps_running_between_calls_reads_its_input_and_reports_its_exit() {
        let (_dir, workdir) = workdir();
        let (_stop, mut ctx) = context(&workdir);
        let table = ProcessTable::default();
        let command = "echo ready; while read line; do echo \"got $line\"; echo \"err $line\" >&2; done; exit 7";
        let (content, started, is_error) =
            completed(start(&table, &workdir, &ctx.owner, &args(json!({"command": command, "name": "repl"}))));
        assert!(!is_error, "{content}");
        let id = started["id"].as_str().unwrap().to_owned();
        assert_eq!(id, "p1");
        let (seen, _) = read_until(&table, &mut ctx, &id, "ready").await;
        assert_eq!(seen, "ready\n");

        let (_, wrote, is_error) = completed(write(&table, &args(json!({"id": id, "input": "one\n"})), &mut ctx).await);
        assert!(!is_error);
        assert_eq!(wrote["bytes"], 4);
        let (seen, _) = read_until(&table, &mut ctx, &id, "err one").await;
        assert!(seen.contains("got one\n") && seen.contains("err one\n"), "stdout and stderr interleave: {seen:?}");

        let (content, listed, _) = completed(list(&table));
        assert_eq!(listed["processes"][0]["running"], true, "{content}");
        assert!(content.starts_with("p1 (repl): running"), "{content}");

        let (_, _, is_error) =
            completed(write(&table, &args(json!({"id": id, "input": "", "close_stdin": true})), &mut ctx).await);
        assert!(!is_error);
        let (_, last) = read_until(&table, &mut ctx, &id, "never printed").await;
        assert_eq!(last["running"], false);
        assert_eq!(last["exit_code"], 7);
        let (content, _, is_error) = completed(write(&table, &args(json!({"id": id, "input": "x"})), &mut ctx).await);
        assert!(is_error && content.contains("has exited"), "{content}");
        let (content, _, is_error) = completed(read(&table, &args(json!({"id": "p9"})), &mut ctx).await);
        assert!(is_error && content.contains("held: p1"), "{content}");
    }

    #[tokio::test]
    async fn kill_ends_the_process_and_what_left_its_group_and_drops_it() {
        let (_dir, workdir) = workdir();
        let (_stop, mut ctx) = context(&workdir);
        let table = ProcessTable::default();
        let command = "sleep 1000 & echo $! > bg.pid; setsid sleep 1000 & echo $! >> bg.pid; echo up; sleep 1000";
        let (_, started, _) = completed(start(&table, &workdir, &ctx.owner, &args(json!({"command": command}))));
        let id = started["id"].as_str().unwrap().to_owned();
        let shell = i32::try_from(started["pid"].as_u64().unwrap()).unwrap();
        read_until(&table, &mut ctx, &id, "up").await;
        let mut pids = pids(&workdir, "bg.pid");
        assert_eq!(pids.len(), 2);
        let (content, killed, is_error) = completed(kill(&table, &args(json!({"id": id}))).await);
        assert!(!is_error, "{content}");
        assert_eq!(killed["exit_code"], 137, "SIGKILL: {content}");
        pids.push(shell);
        wait_dead(&pids, "after process_kill").await;
        let (_, listed, _) = completed(list(&table));
        assert_eq!(listed["processes"], json!([]));
        let (_, _, is_error) = completed(kill(&table, &args(json!({"id": id}))).await);
        assert!(is_error, "a second kill finds nothing");
    }

    #[tokio::test]
    async fn the_table_holds_sixteen_and_shutdown_kills_them_all() {
        let (_dir, workdir) = workdir();
        let (_stop, mut ctx) = context(&workdir);
        let table = ProcessTable::default();
        let (_, exited, _) = completed(start(&table, &workdir, &ctx.owner, &args(json!({"command": "echo done"}))));
        let exited_id = exited["id"].as_str().unwrap().to_owned();
        let (_, last) = read_until(&table, &mut ctx, &exited_id, "never printed").await;
        assert_eq!(last["exit_code"], 0);
        let mut pids = Vec::new();
        for _ in 1..MAX_PROCESSES {
            let (content, started, is_error) =
                completed(start(&table, &workdir, &ctx.owner, &args(json!({"command": "sleep 1000"}))));
            assert!(!is_error, "{content}");
            pids.push(i32::try_from(started["pid"].as_u64().unwrap()).unwrap());
        }
        // Full: the exited one's place is taken, then the next start is refused.
        let (content, started, is_error) =
            completed(start(&table, &workdir, &ctx.owner, &args(json!({"command": "sleep 1000"}))));
        assert!(!is_error, "{content}");
        pids.push(i32::try_from(started["pid"].as_u64().unwrap()).unwrap());
        let (_, listed, _) = completed(list(&table));
        let ids: Vec<&str> =
            listed["processes"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), MAX_PROCESSES);
        assert!(!ids.contains(&exited_id.as_str()), "{ids:?}");
        let (content, _, is_error) =
            completed(start(&table, &workdir, &ctx.owner, &args(json!({"command": "sleep 1000"}))));
        assert!(is_error && content.contains("16 processes are running"), "{content}");

        table.shutdown().await;
        wait_dead(&pids, "after shutdown").await;
        let (content, _, is_error) = completed(start(&table, &workdir, &ctx.owner, &args(json!({"command": "true"}))));
        assert!(is_error && content.contains("shutting down"), "{content}");
    }

    #[test]
    fn the_ring_keeps_the_last_mebibyte_and_counts_what_was_dropped() {
        let mut output = Output::default();
        output.push(b"hello ");
        let (bytes, dropped, unread) = output.read(3);
        assert_eq!((bytes.as_slice(), dropped, unread), (&b"hel"[..], 0, 3));
        output.push(&vec![b'x'; BUFFER_BYTES]);
        let (bytes, dropped, unread) = output.read(MAX_READ_BYTES);
        assert_eq!(dropped, 3, "\"lo \" was overwritten unread");
        assert_eq!(bytes.len(), MAX_READ_BYTES);
        assert_eq!(unread, (BUFFER_BYTES - MAX_READ_BYTES) as u64);
        // A character cut by max_bytes waits for the next read.
        let mut output = Output::default();
        output.push("aé".as_bytes());
        let (bytes, _, unread) = output.read(2);
        assert_eq!((bytes.as_slice(), unread), (&b"a"[..], 2));
        let (bytes, _, _) = output.read(2);
        assert_eq!(bytes, "é".as_bytes());
    }
}
