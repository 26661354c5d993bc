//! The command line for people (README "The command line"): `nexus run --follow` drives a
//! conversation of two turns at a terminal (a pseudo-terminal here), asking to approve a parked
//! call in the first and to deny one in the second, and never asks when its input is not a
//! terminal.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use nexus_proto::{ConversationId, ExecutionId, RunStatus, TaskStatus};
use nexus_tests::probe::Probe;
use nexus_tests::{Minted, TestServer, key, nexus_binary};

const WAIT: Duration = Duration::from_secs(30);

/// A running `nexus` command and everything it printed.
struct Cli {
    child: tokio::process::Child,
    output: Arc<Mutex<String>>,
    /// The terminal's input side, when it runs on one.
    terminal: Option<std::fs::File>,
}

impl Cli {
    /// `nexus ARGS` against `server` as `member`, on a pseudo-terminal when `terminal`, else
    /// with no input and its output piped. `HOME` is a fresh dir, so no saved login is read.
    fn spawn(server: &TestServer, member: &Minted, args: &[&str], terminal: bool, home: &std::path::Path) -> Cli {
        let mut command = tokio::process::Command::new(nexus_binary());
        command
            .args(args)
            .env("NEXUS_URL", server.url())
            .env("NEXUS_TOKEN", &member.token)
            .env("HOME", home)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("NEXUS_CREDENTIALS")
            .kill_on_drop(true);
        let output = Arc::new(Mutex::new(String::new()));
        if terminal {
            let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
            let slave = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("slave"));
            command.stdin(slave(&pty.slave)).stdout(slave(&pty.slave)).stderr(slave(&pty.slave));
            let child = command.spawn().expect("nexus runs");
            drop(pty.slave);
            let master = std::fs::File::from(pty.master);
            let terminal = master.try_clone().expect("master");
            read_into(master, output.clone());
            Cli { child, output, terminal: Some(terminal) }
        } else {
            command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
            let mut child = command.spawn().expect("nexus runs");
            let stdout = child.stdout.take().expect("stdout").into_owned_fd().expect("fd");
            let stderr = child.stderr.take().expect("stderr").into_owned_fd().expect("fd");
            read_into(std::fs::File::from(stdout), output.clone());
            read_into(std::fs::File::from(stderr), output.clone());
            Cli { child, output, terminal: None }
        }
    }

    fn output(&self) -> String {
        self.output.lock().expect("output").clone()
    }

    /// Waits until the output holds `text`.
    async fn wait_for(&self, text: &str) {
        self.wait_for_times(text, 1).await;
    }

    /// Waits until the output holds `text` `times` times.
    async fn wait_for_times(&self, text: &str, times: usize) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.output().matches(text).count() < times {
            assert!(tokio::time::Instant::now() < deadline, "no {text:?} in:\n{}", self.output());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Types `line` at the terminal.
    fn type_line(&mut self, line: &str) {
        let terminal = self.terminal.as_mut().expect("a terminal");
        terminal.write_all(format!("{line}\n").as_bytes()).expect("typed");
    }

    /// Waits for the command to exit; its exit code and output.
    async fn finish(mut self) -> (i32, String) {
        let status = tokio::time::timeout(WAIT, self.child.wait()).await.expect("the command ends").expect("status");
        // What it printed last is read by a thread: give it the moment to get there.
        let mut output = self.output();
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = self.output();
            if now == output {
                break;
            }
            output = now;
        }
        (status.code().unwrap_or(-1), output)
    }
}

/// Reads `source` on a thread into `into` until it ends (a pseudo-terminal's master reads EIO once
/// the command exits).
fn read_into(mut source: std::fs::File, into: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        while let Ok(n) = source.read(&mut buffer) {
            if n == 0 {
                break;
            }
            into.lock().expect("output").push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
    });
}

/// The conversation and execution ids from `nexus run`'s first line.
fn ids_of(output: &str) -> (ExecutionId, ConversationId) {
    let line = output.lines().find(|line| line.contains("· execution ")).expect("the execution line");
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "execution").expect("execution");
    let conversation = words.iter().position(|w| *w == "conversation").expect("conversation");
    (
        words[at + 1].trim().parse().expect("an execution id"),
        words[conversation + 1].trim().parse().expect("a conversation id"),
    )
}

#[tokio::test]
async fn nexus_run_follows_two_turns_asking_at_the_terminal_and_never_without_one() {
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "c1", "name": "probe", "arguments": {"depth": 1}}]},
        {"final": "probe said {{tool:c1}}"}
    ]});
    let server = TestServer::start(&[("probe", script)]).await;
    let Probe { agent, runner, raw } = Probe::start(&server, "ask", "scripted/probe").await;
    // The runner runs every call it is offered.
    let worker = Probe::serve(raw, |_| "sunny".to_owned());
    let home = tempfile::tempdir().expect("home");
    let store = server.store();

    // Turn one: asked at the terminal, approved; the call runs on the runner and the answer shows.
    let mut first = Cli::spawn(&server, &agent, &["run", "how is the weather?", "--follow"], true, home.path());
    first.wait_for("approve r1t0? [y/n]").await;
    assert!(first.output().contains("? probe [r1t0] on runner"), "{}", first.output());
    first.type_line("y");
    let (code, output) = first.finish().await;
    assert_eq!(code, 0, "{output}");
    for shown in [
        "approved",
        &format!("→ probe [r1t0] on runner {}", runner.id),
        "← probe [r1t0] completed: sunny",
        "probe said sunny",
    ] {
        assert!(output.contains(shown), "no {shown:?} in:\n{output}");
    }
    let (turn_one, conversation) = ids_of(&output);
    let row = store.execution(turn_one).await.expect("read").expect("execution");
    assert_eq!(row.status, RunStatus::Completed);
    assert_eq!(row.conversation_public_id, conversation);
    let task = store.task(turn_one, key("r1t0")).await.expect("read").expect("task");
    assert_eq!(task.status, TaskStatus::Completed);

    // Turn two, in the same conversation: denied at the terminal; the model reads the denial.
    let conversation_arg = conversation.to_string();
    let args = ["run", "and tomorrow?", "--conversation", conversation_arg.as_str(), "--follow"];
    let mut second = Cli::spawn(&server, &agent, &args, true, home.path());
    second.wait_for("approve r1t0? [y/n]").await;
    // An answer that is neither yes nor no is asked again.
    second.type_line("maybe");
    second.wait_for_times("approve r1t0? [y/n]", 2).await;
    second.type_line("n");
    let (code, output) = second.finish().await;
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("denied") && output.contains("← probe [r1t0] failed"), "{output}");
    let (turn_two, same) = ids_of(&output);
    assert_eq!(same, conversation, "the second turn is in the first's conversation");
    let task = store.task(turn_two, key("r1t0")).await.expect("read").expect("task");
    assert_eq!((task.status, task.error_key.as_deref()), (TaskStatus::Failed, Some("approval_denied")));
    let caller = server.caller(&agent).await;
    let turns = server.server.api.conversation(&caller, conversation, 0).await.expect("conversation");
    let turns = turns["turns"].as_array().expect("turns").clone();
    assert_eq!(turns.len(), 2, "{turns:?}");
    assert_eq!(turns[1]["execution_public_id"], turn_two.to_string());

    // Without a terminal it never asks: it says how to decide, and follows to the end once the
    // call is decided elsewhere.
    let args = ["run", "and the day after?", "--conversation", conversation_arg.as_str(), "--follow"];
    let third = Cli::spawn(&server, &agent, &args, false, home.path());
    third.wait_for("decide with: nexus approve").await;
    let (turn_three, _) = ids_of(&third.output());
    let approve = Cli::spawn(&server, &agent, &["approve", &turn_three.to_string(), "r1t0"], false, home.path());
    let (code, approved) = approve.finish().await;
    assert_eq!(code, 0, "{approved}");
    let (code, output) = third.finish().await;
    assert_eq!(code, 0, "{output}");
    assert!(!output.contains("approve r1t0? [y/n]"), "asked without a terminal:\n{output}");
    assert!(output.contains("probe said sunny"), "{output}");
    assert_eq!(store.execution(turn_three).await.expect("read").expect("execution").status, RunStatus::Completed);

    // At a terminal, a call decided elsewhere takes the question back: the follow goes on to
    // the end without anything typed.
    let args = ["run", "one more?", "--conversation", conversation_arg.as_str(), "--follow"];
    let fourth = Cli::spawn(&server, &agent, &args, true, home.path());
    fourth.wait_for("approve r1t0? [y/n]").await;
    let (turn_four, _) = ids_of(&fourth.output());
    let approve = Cli::spawn(&server, &agent, &["approve", &turn_four.to_string(), "r1t0"], false, home.path());
    assert_eq!(approve.finish().await.0, 0);
    let (code, output) = fourth.finish().await;
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("decided meanwhile: r1t0 is dispatched"), "{output}");
    assert!(output.contains("probe said sunny"), "{output}");

    // A refusal has its word and a non-zero exit; `--json` prints it as the doors do.
    let unknown = uuid::Uuid::new_v4().to_string();
    let (code, output) =
        Cli::spawn(&server, &agent, &["executions", "show", &unknown, "--json"], false, home.path()).finish().await;
    assert_eq!(code, 2, "{output}");
    let refused: serde_json::Value = serde_json::from_str(output.trim()).expect("one JSON line");
    assert_eq!(refused["code"], "not_found", "{output}");
    worker.abort();
    server.shutdown().await;
}
