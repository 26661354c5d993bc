//! runner-agent's tools against hostile input, with a real server and a real `runner-agent`
//! process: a FIFO read never costs a slot, and nothing a bash call starts outlives the call, its
//! timeout, a SIGTERM of runner-agent, or a SIGKILL and restart (issue 11, items 1 and 3).

use std::path::Path;
use std::time::Duration;

use nexus_proto::{ExecutionId, RunStatus, TaskStatus};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use nexus_tests::processes::RunnerAgentProcess;
use nexus_tests::{Minted, TestServer, wait_until};

const WAIT: Duration = Duration::from_secs(30);
/// runner-agent's default `shutdown_grace` (5 s), and room for a busy machine.
const SIGTERM_EXIT: Duration = Duration::from_secs(15);

/// Starts one background process in the shell's group and one in a session of its own, writes
/// their pids and the shell's own to `<name>.pid`, one a line, then `<name>.ready`.
fn background(name: &str) -> String {
    format!(
        "sleep 1000 & echo $! > {name}.tmp; setsid sleep 1000 & echo $! >> {name}.tmp; echo $$ >> {name}.tmp; \
         mv {name}.tmp {name}.pid; "
    )
}

fn pids(workdir: &Path, name: &str) -> Vec<i32> {
    let text = std::fs::read_to_string(workdir.join(format!("{name}.pid"))).expect("the pid file");
    text.lines().map(|line| line.trim().parse().expect("a pid")).collect()
}

/// Gone, or a zombie nobody has reaped yet: either way it runs no more.
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_dead(pids: &[i32], what: &str) {
    for pid in pids {
        wait_until(&format!("process {pid} to be gone {what}"), WAIT, || async { dead(*pid).then_some(()) }).await;
    }
}

async fn wait_pid_file(workdir: &Path, name: &str) -> Vec<i32> {
    let path = workdir.join(format!("{name}.pid"));
    wait_until(&format!("{name}.pid"), WAIT, || async { path.exists().then_some(()) }).await;
    pids(workdir, name)
}

struct Bed {
    server: TestServer,
    agent: Minted,
    runner: Minted,
    process: RunnerAgentProcess,
    _dirs: tempfile::TempDir,
}

impl Bed {
    async fn start(scripts: &[(&str, Value)]) -> Bed {
        let server = TestServer::start(scripts).await;
        let agent = server.agent("agent").await;
        let runner = server.runner("worker").await;
        let dirs = tempfile::tempdir().expect("dirs");
        let (workdir, state_dir) = (dirs.path().join("work"), dirs.path().join("state"));
        std::fs::create_dir_all(&workdir).expect("workdir");
        let process = RunnerAgentProcess {
            nexus_url: server.url(),
            runner: runner.clone(),
            token_file: dirs.path().join("token"),
            workdir,
            state_dir,
            tool_timeout_ms: 60_000,
        };
        Bed { server, agent, runner, process, _dirs: dirs }
    }

    fn workdir(&self) -> &Path {
        &self.process.workdir
    }

    /// Starts runner-agent with `extra` flags and waits for its announcement.
    async fn spawn(&self, extra: &[&str]) -> Child {
        let before = self.announced_at().await;
        let (child, _log) = self.process.spawn_logged(extra);
        wait_until("the runner announces its tools", WAIT, || async {
            self.announced_at().await.filter(|at| Some(*at) != before).map(|_| ())
        })
        .await;
        child
    }

    async fn announced_at(&self) -> Option<i64> {
        self.server.store().executor(self.runner.runner()).await.ok().flatten().and_then(|row| row.announced_at)
    }

    async fn run(&self, model: &str) -> ExecutionId {
        let declaration = json!({"approval_mode": "bypass", "default_model": format!("scripted/{model}"),
                                 "runner_executor_public_ids": [self.runner.id]});
        self.server.run_declared(&self.agent, "go", declaration).await
    }
}

async fn sigterm(child: &mut Child) {
    let pid = child.id().expect("a live child has a pid");
    let sent = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await.expect("kill runs");
    assert!(sent.success(), "kill -TERM {pid} failed");
    let exited = tokio::time::timeout(SIGTERM_EXIT, child.wait()).await;
    let status = exited.unwrap_or_else(|_| panic!("runner-agent did not exit within {SIGTERM_EXIT:?} of SIGTERM"));
    assert!(status.expect("reaped").success(), "runner-agent exits cleanly on SIGTERM");
}

fn result_text(task: &nexus_actors::store::TaskRow) -> String {
    task.result.as_ref().and_then(|result| result["content"].as_str()).unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_fifo_read_leaves_a_one_slot_runner_claiming() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "fifo", "name": "read_file", "arguments": {"path": "pipe", "limit": 1}}]},
        {"tool_calls": [{"id": "next", "name": "bash", "arguments": {"command": "echo still-claiming"}}]},
        {"final": "{{tool:next.stdout}}"}
    ]});
    let bed = Bed::start(&[("fifo", script)]).await;
    let made = std::process::Command::new("mkfifo").arg(bed.workdir().join("pipe")).status().expect("mkfifo");
    assert!(made.success());
    let mut child = bed.spawn(&["--slots", "1"]).await;

    let run = bed.run("fifo").await;
    let row = bed.server.settled(run, WAIT).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let fifo = bed.server.task(run, "r1t0").await.expect("the read_file row");
    assert_eq!(fifo.status, TaskStatus::Completed, "the read was answered, not timed out: {fifo:?}");
    assert_eq!(fifo.result.as_ref().map(|result| result["is_error"].clone()), Some(json!(true)));
    assert!(result_text(&fifo).contains("pipe: is a FIFO"), "{}", result_text(&fifo));
    let next = bed.server.task(run, "r2t0").await.expect("the bash row");
    assert_eq!(next.status, TaskStatus::Completed);
    assert!(result_text(&next).contains("still-claiming"), "{}", result_text(&next));

    // Nothing is stuck in it: it stops at once when asked.
    sigterm(&mut child).await;
}

#[tokio::test]
async fn background_processes_die_with_their_call_its_timeout_sigterm_and_a_restart() {
    let ends = json!({"rounds": [
        {"tool_calls": [
            {"id": "ends", "name": "bash", "arguments": {"command": format!("{}echo done", background("ends"))}},
            {"id": "times_out", "name": "bash",
             "arguments": {"command": format!("{}sleep 1000", background("times_out")), "timeout_ms": 500}}
        ]},
        {"final": "{{tool:ends.stdout}}"}
    ]});
    let hangs = |name: &str| {
        json!({"rounds": [
            {"tool_calls": [{"id": name, "name": "bash", "arguments": {"command": format!("{}sleep 1000", background(name))}}]},
            {"final": "never"}
        ]})
    };
    let bed = Bed::start(&[("ends", ends), ("sigterm", hangs("sigterm")), ("sigkill", hangs("sigkill"))]).await;
    let mut child = bed.spawn(&[]).await;

    // A call that ends, and one that times out: what each started dies with it.
    let run = bed.run("ends").await;
    let row = bed.server.settled(run, WAIT).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let timed_out = bed.server.task(run, "r1t1").await.expect("the timed-out row");
    assert!(result_text(&timed_out).contains("killed after its timeout of 500 ms"), "{}", result_text(&timed_out));
    wait_dead(&pids(bed.workdir(), "ends"), "after its call ended").await;
    wait_dead(&pids(bed.workdir(), "times_out"), "after its call timed out").await;

    // SIGTERM of runner-agent while a call runs: it exits within its grace, and takes them along.
    bed.run("sigterm").await;
    let running = wait_pid_file(bed.workdir(), "sigterm").await;
    assert!(!running.iter().any(|pid| dead(*pid)), "all running before the SIGTERM");
    sigterm(&mut child).await;
    wait_dead(&running, "after runner-agent's SIGTERM").await;

    // SIGKILL leaves them running; the next start on the same state dir kills them.
    let mut child = bed.spawn(&[]).await;
    bed.run("sigkill").await;
    let running = wait_pid_file(bed.workdir(), "sigkill").await;
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
    assert!(!running.iter().any(|pid| dead(*pid)), "a SIGKILLed runner-agent cannot kill what its call started");
    let _again = bed.spawn(&[]).await;
    wait_dead(&running, "after the restart").await;
}
