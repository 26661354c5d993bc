//! `bash {command, timeout_ms?}`: `bash -c` in the workdir, stdin null, as one child process of
//! [`super::process`]: its own process group, killed whole at its timeout (or the claim
//! deadline) or when the task is canceled, and nothing it starts outlives the call. Only the
//! first [`OUTPUT_CAP_BYTES`](super::process::OUTPUT_CAP_BYTES) of each stream are kept. It never extends its claim.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::process::Command;
use tokio::time::Instant;

use super::args::{optional_positive, required_str};
use super::process::{self, Capture, Exited, Killed, NotStarted};
use super::{StopReason, ToolContext, ToolOutcome};

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
    let mut shell = Command::new("bash");
    shell.arg("-c").arg(command);
    match process::run(shell, None, kill_at, ctx).await {
        Ok(Exited { status, killed, stdout, stderr }) => render(status, killed, timeout_ms, &stdout, &stderr),
        Err(NotStarted::Spawn(err)) if !ctx.workdir.is_dir() => ToolOutcome::Failed {
            content: format!("could not start bash: the workdir {} is missing ({err})", ctx.workdir.display()),
        },
        Err(NotStarted::Spawn(err)) => ToolOutcome::Failed { content: format!("could not start bash: {err}") },
        Err(NotStarted::NoPipes) => ToolOutcome::Failed { content: "could not capture the output of bash".to_owned() },
    }
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
            let exit_code = exit_code(status);
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

/// The exit code, or 128 plus the signal that ended the process, as shells report it.
pub(super) fn exit_code(status: ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|sig| 128 + sig)).unwrap_or(-1)
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
        content.push_str(&format!("[{name} cut: showing the first {} of {} bytes]\n", capture.kept(), capture.total));
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use tokio::sync::watch;

    use super::*;
    use crate::tools::process::OUTPUT_CAP_BYTES;
    use crate::tools::reap::Owner;

    fn context(workdir: &Path, bash_timeout_ms: u64) -> (watch::Sender<Option<StopReason>>, ToolContext) {
        ToolContext::for_test(workdir, &Owner::of_state_dir(workdir), bash_timeout_ms)
    }

    async fn bash(workdir: &Path, input: Value, timeout_ms: u64) -> (String, Value, bool) {
        let (_stop, mut ctx) = context(workdir, timeout_ms);
        run(input.as_object().unwrap(), &mut ctx).await.into_parts()
    }

    use crate::tools::test_processes::{is_dead as process_is_dead, pids, wait_dead};
    use crate::tools::test_workdir as workdir;

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
