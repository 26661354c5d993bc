//! The workspace's binaries as child processes: `nexus serve` on a data dir (killed with SIGKILL
//! and restarted on the same dir and port), `nexus admin`, and `runner-agent`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::server::{Minted, TestServer, WAIT, nexus_binary, runner_agent_binary, wait_until};

/// A free loopback port, for a server that must come back on the same address after a restart.
/// (Another process could take it between this call and the bind; on a test machine it does not.)
pub fn free_loopback_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr")
}

/// Where a `nexus` child keeps its store: the data dir, and a PostgreSQL URL when the suite runs
/// on PostgreSQL.
#[derive(Clone, Debug)]
pub struct StoreLocation {
    /// The data dir (always: it holds the lock file, and the SQLite store when there is no URL).
    pub data_dir: PathBuf,
    /// `--database-url`, on PostgreSQL.
    pub database_url: Option<String>,
}

impl StoreLocation {
    fn args(&self) -> Vec<String> {
        let mut args = vec!["--data-dir".to_owned(), self.data_dir.display().to_string()];
        if let Some(url) = &self.database_url {
            args.extend(["--database-url".to_owned(), url.clone()]);
        }
        args
    }
}

/// `nexus serve` as a child process.
#[derive(Debug)]
pub struct NexusProcess {
    child: Child,
    /// The address it serves.
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl NexusProcess {
    /// Starts `nexus serve --config <config> --listen <listen>` on `store` and waits (30 s at
    /// most) for the log line that names its address.
    ///
    /// # Panics
    /// When it does not start, with its log.
    pub async fn serve(store: &StoreLocation, listen: SocketAddr, config: &Path) -> NexusProcess {
        Self::start(Command::new(nexus_binary()), store, listen, config).await
    }

    /// As [`NexusProcess::serve`], with at most `fd_limit` open file descriptors (`ulimit -n`):
    /// a server that runs out of them under idle connections.
    ///
    /// # Panics
    /// As [`NexusProcess::serve`].
    pub async fn serve_with_fd_limit(
        store: &StoreLocation,
        listen: SocketAddr,
        config: &Path,
        fd_limit: u64,
    ) -> NexusProcess {
        let mut shell = Command::new("sh");
        shell.arg("-c").arg(r#"ulimit -n "$0" && exec "$@""#).arg(fd_limit.to_string()).arg(nexus_binary());
        Self::start(shell, store, listen, config).await
    }

    /// Starts `nexus serve` on a PostgreSQL `store` that another node serves, and waits (30 s at
    /// most) for its log to say it waits as a standby; [`NexusProcess::url`] is `listen`.
    ///
    /// # Panics
    /// When it does not say so, with its log.
    pub async fn standby(store: &StoreLocation, listen: SocketAddr, config: &Path) -> NexusProcess {
        let mut node = Self::start_with(Command::new(nexus_binary()), store, listen, config, false).await;
        node.addr = listen;
        node.wait_for_log("standby", Duration::from_secs(30), |line| line.contains("standby: another node holds"))
            .await;
        node
    }

    /// Waits until a line of the log satisfies `condition`, up to `limit`.
    ///
    /// # Panics
    /// When none does in time, with the log.
    pub async fn wait_for_log(&self, what: &str, limit: Duration, condition: impl Fn(&str) -> bool) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if self.log().iter().any(|line| condition(line)) {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("nexus did not log {what} within {limit:?}; log:\n{}", self.log().join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn start(command: Command, store: &StoreLocation, listen: SocketAddr, config: &Path) -> NexusProcess {
        Self::start_with(command, store, listen, config, true).await
    }

    async fn start_with(
        mut command: Command,
        store: &StoreLocation,
        listen: SocketAddr,
        config: &Path,
        serving: bool,
    ) -> NexusProcess {
        let mut child = command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--listen")
            .arg(listen.to_string())
            .args(store.args())
            .env("NEXUS_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("nexus serve starts");
        let stderr = child.stderr.take().expect("stderr");
        let (addr_tx, addr_rx) = oneshot::channel();
        let mut addr_tx = Some(addr_tx);
        let log = drain_lines(stderr, move |line| {
            if let Some(addr) = line.split("addr=").nth(1).and_then(|rest| rest.split_whitespace().next())
                && let Some(tx) = addr_tx.take()
            {
                let _ = tx.send(addr.to_owned());
            }
        });
        if !serving {
            drop(addr_rx);
            return NexusProcess { child, addr: listen, log };
        }
        let addr = match tokio::time::timeout(Duration::from_secs(30), addr_rx).await {
            Ok(Ok(addr)) => addr.parse().expect("the logged address parses"),
            _ => panic!("nexus serve did not log its address; log:\n{}", log.lock().expect("log").join("\n")),
        };
        NexusProcess { child, addr, log }
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The child's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The log lines so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }

    /// SIGKILL, and reap.
    pub async fn sigkill(mut self) {
        self.child.start_kill().expect("SIGKILL nexus");
        self.child.wait().await.expect("reap nexus");
    }

    /// Waits up to `limit` for the child to exit on its own (a node that stops itself), and
    /// reaps it.
    ///
    /// # Panics
    /// When it is still running at `limit`, with its log.
    pub async fn exits_within(mut self, limit: Duration) -> ExitStatus {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status.expect("reap nexus"),
            Err(_) => panic!("nexus did not stop by itself within {limit:?}; log:\n{}", self.log().join("\n")),
        }
    }

    /// SIGTERM (what systemd sends), and wait up to `limit` for the exit.
    ///
    /// # Panics
    /// When it does not exit in time.
    pub async fn sigterm(mut self, limit: Duration) -> ExitStatus {
        let pid = self.child.id().expect("a live child has a pid");
        let sent = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await.expect("kill runs");
        assert!(sent.success(), "kill -TERM {pid} failed");
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status.expect("reap nexus"),
            Err(_) => panic!("nexus did not exit within {limit:?} of SIGTERM; log:\n{}", self.log().join("\n")),
        }
    }
}

/// Collects a child's output lines for its whole life (so that a full pipe never blocks it),
/// calling `each` on every line as it arrives.
fn drain_lines(
    output: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    mut each: impl FnMut(&str) + Send + 'static,
) -> Arc<Mutex<Vec<String>>> {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let lines = log.clone();
    tokio::spawn(async move {
        let mut reader = BufReader::new(output).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            each(&line);
            lines.lock().expect("log").push(line);
        }
    });
    log
}

/// Runs `nexus admin <args>` against `store` and returns its JSON output.
///
/// # Panics
/// When the command fails.
pub async fn nexus_admin(store: &StoreLocation, args: &[&str]) -> Value {
    let out = Command::new(nexus_binary())
        .arg("admin")
        .args(args)
        .args(store.args())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("nexus admin runs");
    assert!(out.status.success(), "nexus admin {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("nexus admin prints JSON")
}

/// Runs `nexus admin <args>` against `store` and answers its exit status, its stdout parsed as
/// JSON (`Value::Null` when it printed none) and its stderr: for tests of the command's refusals.
///
/// # Panics
/// When the binary cannot run.
pub async fn nexus_admin_output(store: &StoreLocation, args: &[&str]) -> (ExitStatus, Value, String) {
    let out = Command::new(nexus_binary())
        .arg("admin")
        .args(args)
        .args(store.args())
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("nexus admin runs");
    let stdout = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status, stdout, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Mints an account-wide runner with `nexus admin runner create --account-wide`.
pub async fn admin_runner(store: &StoreLocation, name: &str) -> Minted {
    let value = nexus_admin(store, &["runner", "create", "--name", name, "--account-wide"]).await;
    Minted {
        id: Uuid::parse_str(value["runner_executor_public_id"].as_str().expect("id")).expect("uuid"),
        token: value["token"].as_str().expect("token").to_owned(),
    }
}

/// Mints an Agent member with `nexus admin member create`.
pub async fn admin_agent(store: &StoreLocation, handle: &str) -> Minted {
    let value = nexus_admin(store, &["member", "create", "--kind", "agent", "--handle", handle]).await;
    Minted {
        id: Uuid::parse_str(value["public_id"].as_str().expect("id")).expect("uuid"),
        token: value["token"].as_str().expect("token").to_owned(),
    }
}

/// How to start one `runner-agent` process.
#[derive(Clone, Debug)]
pub struct RunnerAgentProcess {
    /// `--nexus`.
    pub nexus_url: String,
    /// The runner's id and token.
    pub runner: Minted,
    /// `--token-file` (written by [`RunnerAgentProcess::spawn`]).
    pub token_file: PathBuf,
    /// `--workdir`.
    pub workdir: PathBuf,
    /// `--state-dir` (keep it across restarts: it holds the journal).
    pub state_dir: PathBuf,
    /// `--tool-timeout-ms`.
    pub tool_timeout_ms: u64,
}

impl RunnerAgentProcess {
    /// Starts the process (killed when the handle drops).
    ///
    /// # Panics
    /// When it cannot start.
    pub fn spawn(&self) -> Child {
        self.command().arg("--log").arg("error").spawn().expect("runner-agent starts")
    }

    /// Starts the process with `extra` flags, logging at info (killed when the handle drops);
    /// answers it with its log lines so far, which keep coming.
    ///
    /// # Panics
    /// When it cannot start.
    pub fn spawn_logged(&self, extra: &[&str]) -> (Child, Arc<Mutex<Vec<String>>>) {
        let mut child = self
            .command()
            .args(extra)
            .arg("--log")
            .arg("info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("runner-agent starts");
        let log = drain_lines(child.stderr.take().expect("stderr"), |_| {});
        (child, log)
    }

    /// Starts the process like [`RunnerAgentProcess::spawn_logged`] and waits up to [`WAIT`]
    /// until `server`'s store holds this runner's announcement.
    ///
    /// # Panics
    /// When it cannot start, or announces nothing in time.
    pub async fn spawn_announced(&self, server: &TestServer, extra: &[&str]) -> (Child, Arc<Mutex<Vec<String>>>) {
        let spawned = self.spawn_logged(extra);
        let runner = self.runner.runner();
        wait_until("the runner announces its tools", WAIT, || async {
            server.store().executor(runner).await.ok().flatten().and_then(|row| row.announced_at)
        })
        .await;
        spawned
    }

    fn command(&self) -> Command {
        std::fs::write(&self.token_file, &self.runner.token).expect("token file");
        let mut command = Command::new(runner_agent_binary());
        command
            .arg("--nexus")
            .arg(&self.nexus_url)
            .arg("--runner-id")
            .arg(self.runner.id.to_string())
            .arg("--token-file")
            .arg(&self.token_file)
            .arg("--workdir")
            .arg(&self.workdir)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--tool-timeout-ms")
            .arg(self.tool_timeout_ms.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        command
    }
}

/// SIGKILLs a child and reaps it.
pub async fn sigkill(child: &mut Child) {
    let _ = child.start_kill();
    let _ = child.wait().await;
}
