//! `bash {command, timeout_ms?}`: `bash -c` in the workdir, in its own process group, stdin
//! null. It clamps itself: when its timeout (or the claim deadline) comes, or the task is
//! canceled, the whole group gets SIGKILL. It never extends its claim.
//!
//! Nothing it starts outlives the call: when the shell exits (or is killed) its process group is
//! killed, and then every process that carries the call's mark in its environment, which finds
//! what left the group with `setsid` (see [`super::reap`]). Output is read as it comes, and only
//! the first [`OUTPUT_CAP_BYTES`] of each stream are kept.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Map, Value, json};
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::time::{Instant, MissedTickBehavior};

use super::args::{optional_positive, required_str};
use super::reap::{CALL_VAR, OWNER_VAR, kill_marked};
use super::{StopReason, ToolContext, ToolOutcome};
use crate::sleep_until_opt;

/// Each of stdout and stderr keeps at most this many leading bytes.
pub(super) const OUTPUT_CAP_BYTES: usize = 256 * 1024;
/// Once the shell has exited, output still in the pipes is read for at most this long: a
/// background process that keeps the pipes open does not hold the result back.
const PIPE_DRAIN_GRACE: Duration = Duration::from_millis(200);
/// Progress frames (`{"text_tail", "bytes"}`) go out at most this often, and only when the command
/// wrote something since the last one: nexus shows one per task and second on the execution's
/// feed (and the spec drops frames under 250 ms apart), so a faster pace would only cost the stream.
const PROGRESS_PERIOD: Duration = Duration::from_millis(1_000);
/// How much of the latest output a progress frame carries.
const PROGRESS_TAIL_BYTES: usize = 2_048;
/// Bound on the sweep for the call's marked processes once it ended.
const SWEEP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the group was killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Killed {
    Timeout,
    Stopped(StopReason),
}

pub(super) async fn run(input: &Map<String, Value>, ctx: &mut ToolContext) -> ToolOutcome {
    let parsed =
        required_str(input, "command").and_then(|command| Ok((command, optional_positive(input, "timeout_ms")?)));
    let (command, requested_ms) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return ToolOutcome::error(message),
    };
    // The sentence names this budget, never the elapsed time, so equal timeouts give equal bytes.
    let timeout_ms = [Some(ctx.bash_timeout_ms), requested_ms, ctx.task_timeout_ms]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(ctx.bash_timeout_ms);
    let started = Instant::now();
    let kill_at = ctx.clamp_at.map_or(started + Duration::from_millis(timeout_ms), |clamp| {
        clamp.min(started + Duration::from_millis(timeout_ms))
    });

    let call = ctx.owner.new_call();
    let spawned = Command::new("bash")
        .arg("-c")
        .arg(command)
        .current_dir(&ctx.workdir)
        .env(OWNER_VAR, ctx.owner.as_str())
        .env(CALL_VAR, &call)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) if !ctx.workdir.is_dir() => {
            return ToolOutcome::Failed {
                content: format!("could not start bash: the workdir {} is missing ({err})", ctx.workdir.display()),
            };
        }
        Err(err) => {
            return ToolOutcome::Failed { content: format!("could not start bash: {err}") };
        }
    };
    let mut processes = CallProcesses {
        group: child.id().and_then(|pid| i32::try_from(pid).ok()).map(Pid::from_raw),
        call: Some(call),
    };
    let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        processes.end().await;
        return ToolOutcome::Failed { content: "could not capture the output of bash".to_owned() };
    };

    let mut out = Capture::default();
    let mut err = Capture::default();
    let mut tail = Vec::new();
    let (mut out_open, mut err_open) = (true, true);
    let (mut out_buf, mut err_buf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let mut status: Option<std::io::Result<ExitStatus>> = None;
    let mut killed: Option<Killed> = None;
    let mut drain_until: Option<Instant> = None;
    let mut progress = tokio::time::interval(PROGRESS_PERIOD);
    progress.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut progress_sent = 0;

    while status.is_none() || out_open || err_open {
        tokio::select! {
            read = stdout.read(&mut out_buf), if out_open => match read {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => { out.push(&out_buf[..n]); push_tail(&mut tail, &out_buf[..n]); }
            },
            read = stderr.read(&mut err_buf), if err_open => match read {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => { err.push(&err_buf[..n]); push_tail(&mut tail, &err_buf[..n]); }
            },
            exited = child.wait(), if status.is_none() => {
                status = Some(exited);
                // What the shell left running in its group dies with it; what it wrote is still
                // in the pipes. The shell is reaped, so its id may be reused: the group is not
                // signalled again.
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
    render(status, killed, timeout_ms, &out, &err)
}

fn render(
    status: Option<std::io::Result<ExitStatus>>,
    killed: Option<Killed>,
    timeout_ms: u64,
    out: &Capture,
    err: &Capture,
) -> ToolOutcome {
    let truncated = out.truncated() || err.truncated();
    let (stdout, stderr) = (out.text(), err.text());
    let stopped = |sentence: String| ToolOutcome::Completed {
        structured_content: json!({
            "exit_code": null, "stdout": stdout, "stderr": stderr, "truncated": truncated,
            "killed": true, "timeout_ms": timeout_ms,
        }),
        content: sentence,
        is_error: true,
    };
    match (killed, status) {
        (Some(Killed::Timeout), _) => stopped(format!("the command was killed after its timeout of {timeout_ms} ms")),
        (Some(Killed::Stopped(StopReason::Canceled)), _) => {
            stopped("the command was killed because its task was canceled".to_owned())
        }
        (Some(Killed::Stopped(StopReason::Shutdown)), _) => {
            stopped("the command was killed because the runner shut down".to_owned())
        }
        (None, Some(Err(wait_err))) => ToolOutcome::error(format!("could not wait for the command: {wait_err}")),
        (None, Some(Ok(status))) => {
            let exit_code = status.code().or_else(|| status.signal().map(|sig| 128 + sig)).unwrap_or(-1);
            let mut content = format!("exit_code: {exit_code}\n");
            section(&mut content, "stdout", out);
            section(&mut content, "stderr", err);
            ToolOutcome::Completed {
                content,
                structured_content: json!({
                    "exit_code": exit_code, "stdout": stdout, "stderr": stderr, "truncated": truncated,
                }),
                is_error: exit_code != 0,
            }
        }
        (None, None) => ToolOutcome::error("the command ended without an exit status"),
    }
}

fn section(content: &mut String, name: &str, capture: &Capture) {
    if capture.total == 0 {
        content.push_str(&format!("{name}: (empty)\n"));
        return;
    }
    content.push_str(&format!("{name}:\n{}", capture.text()));
    if !content.ends_with('\n') {
        content.push('\n');
    }
    if capture.truncated() {
        content.push_str(&format!(
            "[{name} cut: showing the first {} of {} bytes]\n",
            capture.head.len(),
            capture.total
        ));
    }
}

fn push_tail(tail: &mut Vec<u8>, bytes: &[u8]) {
    tail.extend_from_slice(bytes);
    if tail.len() > PROGRESS_TAIL_BYTES {
        tail.drain(..tail.len() - PROGRESS_TAIL_BYTES);
    }
}

/// The head of one output stream, and how much was produced in all.
#[derive(Default)]
struct Capture {
    head: Vec<u8>,
    total: u64,
}

impl Capture {
    fn push(&mut self, bytes: &[u8]) {
        let room = OUTPUT_CAP_BYTES.saturating_sub(self.head.len());
        self.head.extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.total += bytes.len() as u64;
    }

    fn truncated(&self) -> bool {
        self.total > self.head.len() as u64
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.head).into_owned()
    }
}

/// What one call started: the shell's process group and the call's mark. Ended (group and
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
            Ok(Ok(killed)) if killed > 0 => tracing::debug!(killed, "killed what the command left outside its group"),
            Ok(_) => {}
            Err(_) => tracing::warn!("the sweep for what the command left behind did not finish in time"),
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

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use tokio::sync::watch;

    use super::*;
    use crate::tools::reap::Owner;

    fn context(workdir: &Path, bash_timeout_ms: u64) -> (watch::Sender<Option<StopReason>>, ToolContext) {
        let (stop_tx, stop) = watch::channel(None);
        let ctx = ToolContext {
            workdir: workdir.to_owned(),
            bash_timeout_ms,
            task_timeout_ms: None,
            clamp_at: None,
            stop,
            claim: None,
            owner: Owner::of_state_dir(workdir),
        };
        (stop_tx, ctx)
    }

    async fn bash(workdir: &Path, input: Value, timeout_ms: u64) -> (String, Value, bool) {
        let (_stop, mut ctx) = context(workdir, timeout_ms);
        match run(input.as_object().unwrap(), &mut ctx).await {
            ToolOutcome::Completed { content, structured_content, is_error } => (content, structured_content, is_error),
            ToolOutcome::Failed { content } => panic!("failed: {content}"),
        }
    }

    fn workdir() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().canonicalize().unwrap();
        (dir, path)
    }

    /// Gone, or a zombie nobody has reaped yet: either way it runs no more.
    fn process_is_dead(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        }
    }

    #[tokio::test]
    async fn bash_reports_exit_code_stdout_and_stderr_in_the_workdir() {
        let (_dir, workdir) = workdir();
        std::fs::write(workdir.join("marker"), "m").unwrap();
        let (content, structured, is_error) =
            bash(&workdir, json!({"command": "ls; echo oops >&2; exit 3"}), 10_000).await;
        assert!(is_error);
        assert_eq!(structured["exit_code"], 3);
        assert_eq!(structured["stdout"], "marker\n");
        assert_eq!(structured["stderr"], "oops\n");
        assert_eq!(structured["truncated"], false);
        assert_eq!(content, "exit_code: 3\nstdout:\nmarker\nstderr:\noops\n");

        let (content, structured, is_error) = bash(&workdir, json!({"command": "true"}), 10_000).await;
        assert!(!is_error);
        assert_eq!(structured["exit_code"], 0);
        assert_eq!(content, "exit_code: 0\nstdout: (empty)\nstderr: (empty)\n");

        // stdin is null: a read gets EOF at once instead of hanging.
        let (_, structured, _) = bash(&workdir, json!({"command": "cat; echo done"}), 10_000).await;
        assert_eq!(structured["stdout"], "done\n");

        let (content, _, is_error) = bash(&workdir, json!({"command": 5}), 10_000).await;
        assert!(is_error);
        assert_eq!(content, "`command` must be a string");
    }

    #[tokio::test]
    async fn bash_timeout_kills_the_whole_group_and_names_the_timeout() {
        let (_dir, workdir) = workdir();
        let started = tokio::time::Instant::now();
        let command = "sleep 30 & echo $! > bg.pid; sleep 30";
        let (content, structured, is_error) =
            bash(&workdir, json!({"command": command, "timeout_ms": 300}), 600_000).await;
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
        assert!(is_error);
        assert_eq!(content, "the command was killed after its timeout of 300 ms");
        assert_eq!(structured["killed"], true);
        assert_eq!(structured["timeout_ms"], 300);

        let pid: i32 = std::fs::read_to_string(workdir.join("bg.pid")).unwrap().trim().parse().unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !process_is_dead(pid) {
            assert!(tokio::time::Instant::now() < deadline, "background sleep {pid} survived");
            tokio::task::yield_now().await;
        }

        // The announced timeout bounds a larger requested one; the sentence names the bound.
        let (content, _, _) = bash(&workdir, json!({"command": "sleep 30", "timeout_ms": 90_000}), 200).await;
        assert_eq!(content, "the command was killed after its timeout of 200 ms");
    }

    #[tokio::test]
    async fn bash_stops_when_its_task_is_canceled() {
        let (_dir, workdir) = workdir();
        let (stop_tx, mut ctx) = context(&workdir, 600_000);
        let input = json!({"command": "echo started; sleep 30"});
        let task = tokio::spawn(async move { run(input.as_object().unwrap(), &mut ctx).await });
        stop_tx.send_replace(Some(StopReason::Canceled));
        let outcome = tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
        let ToolOutcome::Completed { content, is_error, .. } = outcome else { panic!("{outcome:?}") };
        assert!(is_error);
        assert_eq!(content, "the command was killed because its task was canceled");
    }

    #[tokio::test]
    async fn bash_keeps_the_head_of_large_output() {
        let (_dir, workdir) = workdir();
        let command = "head -c 300000 /dev/zero | tr '\\0' a; echo -n tail-end";
        let (content, structured, is_error) = bash(&workdir, json!({"command": command}), 10_000).await;
        assert!(!is_error);
        assert_eq!(structured["truncated"], true);
        let stdout = structured["stdout"].as_str().unwrap();
        assert_eq!(stdout.len(), OUTPUT_CAP_BYTES);
        assert!(stdout.bytes().all(|b| b == b'a'));
        assert!(content.contains(&format!("[stdout cut: showing the first {OUTPUT_CAP_BYTES} of 300008 bytes]")));
    }

    /// The pids a script wrote to `file`, one a line.
    fn pids(workdir: &Path, file: &str) -> Vec<i32> {
        let text = std::fs::read_to_string(workdir.join(file)).unwrap();
        text.lines().map(|line| line.trim().parse().unwrap()).collect()
    }

    async fn wait_dead(pids: &[i32], what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        for pid in pids {
            while !process_is_dead(*pid) {
                assert!(tokio::time::Instant::now() < deadline, "{what}: process {pid} survived");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    /// Starts one background process in the shell's group and one in a session of its own, and
    /// records both pids in `bg.pid`.
    const BACKGROUND: &str = "sleep 1000 & echo $! > bg.pid; setsid sleep 1000 & echo $! >> bg.pid;";

    #[tokio::test]
    async fn background_processes_die_with_the_call_without_holding_its_result() {
        let (_dir, workdir) = workdir();
        let started = tokio::time::Instant::now();
        let command = format!("{BACKGROUND} echo fg");
        let (_, structured, is_error) = bash(&workdir, json!({ "command": command }), 60_000).await;
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
        assert!(!is_error);
        assert_eq!(structured["stdout"], "fg\n");
        let background = pids(&workdir, "bg.pid");
        assert_eq!(background.len(), 2);
        wait_dead(&background, "after the call ended").await;

        // The same after a timeout.
        let command = format!("{BACKGROUND} sleep 1000");
        let (content, _, _) = bash(&workdir, json!({ "command": command, "timeout_ms": 300 }), 60_000).await;
        assert_eq!(content, "the command was killed after its timeout of 300 ms");
        wait_dead(&pids(&workdir, "bg.pid"), "after the timeout").await;
    }

    #[tokio::test]
    async fn a_dropped_call_leaves_no_processes_behind() {
        let (_dir, workdir) = workdir();
        let (_stop, mut ctx) = context(&workdir, 600_000);
        let input = json!({ "command": format!("{BACKGROUND} echo ready > ready; sleep 1000") });
        let call = tokio::spawn(async move { run(input.as_object().unwrap(), &mut ctx).await });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !workdir.join("ready").exists() {
            assert!(tokio::time::Instant::now() < deadline, "the command never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        wait_dead(&pids(&workdir, "bg.pid"), "after the call was dropped").await;
    }
}
