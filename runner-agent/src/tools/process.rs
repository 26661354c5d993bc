//! One child process for one tool call, shared by `bash` and the command tools: started in the
//! workdir as the leader of its own process group, with the call's marks in its environment
//! ([`super::reap`]), its stdin fed from memory (or null), its output read as it comes and kept
//! up to [`OUTPUT_CAP_BYTES`] a stream.
//!
//! It clamps itself: when its kill instant (its timeout or the claim deadline) comes, or the
//! task is stopped, the whole group gets SIGKILL. When the leader exits the group is killed too,
//! and then every process carrying the call's mark, which finds what left the group with
//! `setsid`. A dropped call future ends them the same way. It never extends its claim; it sends
//! a progress frame with the output's tail at most once a second while output comes.

use std::io;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::time::{Instant, MissedTickBehavior};

use super::reap::{CALL_VAR, OWNER_VAR, kill_marked};
use super::{StopReason, ToolContext};
use crate::sleep_until_opt;

/// Each of stdout and stderr keeps at most this many leading bytes.
pub(crate) const OUTPUT_CAP_BYTES: usize = 256 * 1024;
/// Each stream also keeps its last this many bytes, for error messages.
pub(super) const TAIL_BYTES: usize = 4 * 1024;
/// Once the leader has exited, output still in the pipes is read for at most this long: a
/// background process that keeps the pipes open does not hold the result back.
const PIPE_DRAIN_GRACE: Duration = Duration::from_millis(200);
/// Progress frames (`{"text_tail", "bytes"}`) go out at most this often, and only when the
/// process wrote something since the last one: nexus shows one per task and second on the
/// execution's feed (and the spec drops frames under 250 ms apart), so a faster pace would only
/// cost the stream.
const PROGRESS_PERIOD: Duration = Duration::from_millis(1_000);
/// How much of the latest output a progress frame carries.
const PROGRESS_TAIL_BYTES: usize = 2_048;
/// Bound on the sweep for the call's marked processes once it ended.
const SWEEP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the group was killed before its leader exited on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Killed {
    /// The kill instant came.
    Timeout,
    /// The call was stopped.
    Stopped(StopReason),
}

/// Why the process did not start.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotStarted {
    /// `spawn` failed (no such program, not executable, the workdir is gone, ...).
    #[error("{0}")]
    Spawn(io::Error),
    /// The pipes for its output could not be set up.
    #[error("its output could not be captured")]
    NoPipes,
}

/// How a started process ended.
#[derive(Debug)]
pub(super) struct Exited {
    /// The leader's exit status; `None` when it was not waited for (killed and the pipes
    /// closed first), an error when waiting failed.
    pub(super) status: Option<io::Result<ExitStatus>>,
    /// Set when the group was killed before the leader exited on its own.
    pub(super) killed: Option<Killed>,
    pub(super) stdout: Capture,
    pub(super) stderr: Capture,
}

/// Runs `command` (program and arguments set; this adds the workdir, the marks, the pipes and
/// the process group) until it and its pipes are done, `kill_at` passes or `ctx` is stopped.
/// `stdin`: the bytes written to its stdin, which is then closed (a process that does not read
/// them is not waited for); `None` for a null stdin.
pub(super) async fn run(
    mut command: Command,
    stdin: Option<Vec<u8>>,
    kill_at: Instant,
    ctx: &mut ToolContext,
) -> Result<Exited, NotStarted> {
    let call = ctx.owner.new_call();
    command
        .current_dir(&ctx.workdir)
        .env(OWNER_VAR, ctx.owner.as_str())
        .env(CALL_VAR, &call)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(NotStarted::Spawn)?;
    let mut processes = CallProcesses {
        group: child.id().and_then(|pid| i32::try_from(pid).ok()).map(Pid::from_raw),
        call: Some(call),
    };
    let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        processes.end().await;
        return Err(NotStarted::NoPipes);
    };
    let input = stdin.unwrap_or_default();
    let mut input_pipe = child.stdin.take();
    let mut written = 0;
    if input.is_empty() {
        input_pipe = None;
    }

    let mut out = Capture::default();
    let mut err = Capture::default();
    let mut tail = Vec::new();
    let (mut out_open, mut err_open) = (true, true);
    let (mut out_buf, mut err_buf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let mut status: Option<io::Result<ExitStatus>> = None;
    let mut killed: Option<Killed> = None;
    let mut drain_until: Option<Instant> = None;
    let mut progress = tokio::time::interval(PROGRESS_PERIOD);
    progress.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut progress_sent = 0;

    while status.is_none() || out_open || err_open {
        tokio::select! {
            // `write` (not `write_all`) so that a write cut short by another branch loses nothing.
            wrote = write_some(&mut input_pipe, &input[written..]) => match wrote {
                Ok(n) if n > 0 && written + n < input.len() => written += n,
                // All written (EOF follows as the pipe is dropped), or the process closed its stdin.
                _ => input_pipe = None,
            },
            read = stdout.read(&mut out_buf), if out_open => match read {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => { out.push(&out_buf[..n]); push_tail(&mut tail, &out_buf[..n], PROGRESS_TAIL_BYTES); }
            },
            read = stderr.read(&mut err_buf), if err_open => match read {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => { err.push(&err_buf[..n]); push_tail(&mut tail, &err_buf[..n], PROGRESS_TAIL_BYTES); }
            },
            exited = child.wait(), if status.is_none() => {
                status = Some(exited);
                input_pipe = None;
                // What the leader left running in its group dies with it; what it wrote is
                // still in the pipes. The leader is reaped, so its id may be reused: the group is
                // not signalled again.
                processes.kill_group();
                processes.group = None;
                drain_until = Some(Instant::now() + PIPE_DRAIN_GRACE);
            }
            () = tokio::time::sleep_until(kill_at), if killed.is_none() => {
                killed = Some(Killed::Timeout);
                processes.kill_group();
            }
            reason = ctx.stopped(), if killed.is_none() => {
                killed = Some(Killed::Stopped(reason));
                processes.kill_group();
            }
            () = sleep_until_opt(drain_until) => break,
            _ = progress.tick(), if ctx.claim.is_some() => {
                let produced = out.total + err.total;
                if produced > progress_sent && let Some(claim) = &ctx.claim {
                    let text_tail = String::from_utf8_lossy(&tail).into_owned();
                    // `bytes`: what stdout and stderr produced so far, in all.
                    claim.progress(&json!({ "text_tail": text_tail, "bytes": produced }));
                    progress_sent = produced;
                }
            }
        }
    }
    processes.end().await;
    Ok(Exited { status, killed, stdout: out, stderr: err })
}

/// One `write` of `bytes` to the pipe; never resolves without a pipe.
async fn write_some(pipe: &mut Option<tokio::process::ChildStdin>, bytes: &[u8]) -> io::Result<usize> {
    match pipe {
        Some(pipe) => pipe.write(bytes).await,
        None => std::future::pending().await,
    }
}

fn push_tail(tail: &mut Vec<u8>, bytes: &[u8], keep: usize) {
    tail.extend_from_slice(bytes);
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
    }
}

/// One output stream: its first [`OUTPUT_CAP_BYTES`], its last [`TAIL_BYTES`], and how much was
/// produced in all.
#[derive(Debug, Default)]
pub(super) struct Capture {
    head: Vec<u8>,
    tail: Vec<u8>,
    /// Bytes the stream produced in all.
    pub(super) total: u64,
}

impl Capture {
    fn push(&mut self, bytes: &[u8]) {
        let room = OUTPUT_CAP_BYTES.saturating_sub(self.head.len());
        self.head.extend_from_slice(&bytes[..bytes.len().min(room)]);
        push_tail(&mut self.tail, bytes, TAIL_BYTES);
        self.total += bytes.len() as u64;
    }

    /// Whether more was produced than the head keeps.
    pub(super) fn truncated(&self) -> bool {
        self.total > self.head.len() as u64
    }

    /// The head's length in bytes.
    pub(super) fn kept(&self) -> usize {
        self.head.len()
    }

    /// The head as text (invalid UTF-8 replaced).
    pub(super) fn text(&self) -> String {
        String::from_utf8_lossy(&self.head).into_owned()
    }

    /// The last [`TAIL_BYTES`] as text (invalid UTF-8 replaced, which a cut inside a character
    /// causes at its start).
    pub(super) fn tail_text(&self) -> String {
        String::from_utf8_lossy(&self.tail).into_owned()
    }
}

/// What one call started: the leader's process group and the call's mark. Ended (group and
/// marked processes killed) when the call ends, or when dropped while the call may still run,
/// so a dropped tool future leaves no processes behind either.
struct CallProcesses {
    group: Option<Pid>,
    /// The call's mark ([`CALL_VAR`]); `None` once swept.
    call: Option<String>,
}

impl CallProcesses {
    fn kill_group(&self) {
        if let Some(group) = self.group {
            // ESRCH: the group is already gone.
            let _ = killpg(group, Signal::SIGKILL);
        }
    }

    /// Kills the group and every process carrying the call's mark, off the runtime's threads.
    async fn end(&mut self) {
        self.kill_group();
        let Some(call) = self.call.take() else {
            return;
        };
        let sweep = tokio::task::spawn_blocking(move || kill_marked(CALL_VAR, &call));
        match tokio::time::timeout(SWEEP_TIMEOUT, sweep).await {
            Ok(Ok(killed)) if killed > 0 => tracing::debug!(killed, "killed what the call left outside its group"),
            Ok(_) => {}
            Err(_) => tracing::warn!("the sweep for what the call left behind did not finish in time"),
        }
    }
}

impl Drop for CallProcesses {
    fn drop(&mut self) {
        self.kill_group();
        if let Some(call) = self.call.take() {
            kill_marked(CALL_VAR, &call);
        }
    }
}
