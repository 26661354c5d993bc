//! One MCP server's supervisor: connect, `initialize`, list, watch, and restart with backoff.
//!
//! A session ends when the connection closes (a crashed stdio child closes its stdout), when a
//! `tools/list` or a ping is not answered in time (a hung server), or when the hub stops the
//! server. Then the server's tools are withdrawn and published, its child is stopped (its process
//! group killed, then every process carrying the session's mark: what left the group with
//! `setsid` too, as for bash in [`crate::tools::reap`]), and after a jittered delay that doubles
//! with each failed session ([`crate::retry::ReconnectBackoff`]) a new session starts. A session
//! that stayed healthy at least as long as the largest delay starts the delays over.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientRequest, Implementation, PingRequest, ProtocolVersion, Tool,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, Peer, RoleClient, ServiceError, ServiceExt};
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use super::{McpServerConfig, McpTiming, McpTransport, lock};
use crate::retry::ReconnectBackoff;
use crate::tools::EffectProfile;
use crate::tools::reap::{CALL_VAR, OWNER_VAR, Owner, kill_marked};

/// Bytes of a stdio server's latest stderr kept for the log line that reports its end.
const STDERR_TAIL_BYTES: usize = 2_048;
/// Largest JSON body accepted from an HTTP server; a tool result is cut to 1 MB for its commit
/// anyway, and this leaves room for the structured part that is dropped first.
const MAX_HTTP_JSON_BYTES: usize = 8 * 1024 * 1024;
/// After SIGKILL, how long the child's exit is awaited before it is left to tokio's reaper.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// Bound on the sweep for a session's marked processes.
const SWEEP_TIMEOUT: Duration = Duration::from_secs(5);

/// What a server offers while a session is healthy, read by the hub when it publishes and calls.
pub(super) struct ServerShared {
    name: String,
    prefix: String,
    timeout_ms: u64,
    max_concurrency: Option<NonZeroUsize>,
    default_effect_profile: EffectProfile,
    state: Mutex<Live>,
    /// Asks the supervisor to ping now: a call ran out of time or lost its connection.
    probe: Notify,
    /// How many sessions failed so far (a failed start counts).
    failures: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Live {
    peer: Option<Peer<RoleClient>>,
    tools: Option<Vec<Tool>>,
}

/// A server's listed tools, with what the hub needs to announce them.
pub(super) struct Snapshot {
    pub(super) prefix: String,
    pub(super) tools: Vec<Tool>,
    pub(super) timeout_ms: u64,
    pub(super) max_concurrency: Option<NonZeroUsize>,
    pub(super) default_effect_profile: EffectProfile,
}

impl ServerShared {
    pub(super) fn new(config: &McpServerConfig) -> ServerShared {
        ServerShared {
            name: config.name.clone(),
            prefix: config.prefix.clone(),
            timeout_ms: config.timeout_ms,
            max_concurrency: config.max_concurrency,
            default_effect_profile: config.default_effect_profile,
            state: Mutex::new(Live::default()),
            probe: Notify::new(),
            failures: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Whether a session of this server has failed since it was configured.
    pub(super) fn has_failed(&self) -> bool {
        self.failures.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The listed tools, when a session is healthy.
    pub(super) fn snapshot(&self) -> Option<Snapshot> {
        let tools = lock(&self.state).tools.clone()?;
        Some(Snapshot {
            prefix: self.prefix.clone(),
            tools,
            timeout_ms: self.timeout_ms,
            max_concurrency: self.max_concurrency,
            default_effect_profile: self.default_effect_profile,
        })
    }

    /// The connection to call on, when a session is healthy.
    pub(super) fn peer(&self) -> Option<Peer<RoleClient>> {
        let live = lock(&self.state);
        live.tools.as_ref()?;
        live.peer.clone()
    }

    /// Asks the supervisor to check the server now.
    pub(super) fn probe(&self) {
        self.probe.notify_one();
    }

    pub(super) fn set(&self, peer: Option<Peer<RoleClient>>, tools: Option<Vec<Tool>>) {
        *lock(&self.state) = Live { peer, tools };
    }
}

/// A running supervisor task, stopped by [`Supervisor::stop`] (or, without waiting, on drop).
pub(super) struct Supervisor {
    config: McpServerConfig,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    timing: McpTiming,
}

/// Tells the hub that a server's tools changed.
pub(super) type Publish = Box<dyn Fn() + Send + Sync>;

impl Supervisor {
    pub(super) fn spawn(
        config: McpServerConfig,
        shared: Arc<ServerShared>,
        workdir: PathBuf,
        owner: Owner,
        timing: McpTiming,
        publish: Publish,
    ) -> Supervisor {
        let (stop, stopped) = watch::channel(false);
        let span = tracing::info_span!("mcp_server", server = %config.name);
        let supervision = Supervision { config: config.clone(), shared, workdir, owner, timing, publish, stopped };
        let task = tokio::spawn(supervision.run().instrument(span));
        Supervisor { config, stop, task: Some(task), timing }
    }

    pub(super) fn config(&self) -> &McpServerConfig {
        &self.config
    }

    /// Stops the server and waits for its supervisor to end (bounded: past the bound the task
    /// is aborted, and dropping its child kills it).
    pub(super) async fn stop(mut self) {
        let _ = self.stop.send(true);
        let Some(mut task) = self.task.take() else {
            return;
        };
        let bound = self.timing.stop_grace * 2 + KILL_WAIT + SWEEP_TIMEOUT;
        if tokio::time::timeout(bound, &mut task).await.is_err() {
            tracing::warn!(server = %self.config.name, "mcp server did not stop in time; its supervisor is aborted");
            task.abort();
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // The supervisor sees the stop (or the closed channel) and ends its session.
        let _ = self.stop.send(true);
    }
}

/// Why a session ended.
enum SessionEnd {
    Stopped,
    Failed(String),
}

struct Supervision {
    config: McpServerConfig,
    shared: Arc<ServerShared>,
    workdir: PathBuf,
    owner: Owner,
    timing: McpTiming,
    publish: Publish,
    stopped: watch::Receiver<bool>,
}

impl Supervision {
    async fn run(mut self) {
        let mut backoff = ReconnectBackoff::between(self.timing.restart_min_delay, self.timing.restart_max_delay);
        loop {
            let mut healthy_since = None;
            let end = self.session(&mut healthy_since).await;
            self.shared.set(None, None);
            (self.publish)();
            let reason = match end {
                SessionEnd::Stopped => return,
                SessionEnd::Failed(reason) => reason,
            };
            self.shared.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if healthy_since.is_some_and(|since: Instant| since.elapsed() >= self.timing.restart_max_delay) {
                backoff.reset();
            }
            let delay = backoff.next_delay();
            tracing::warn!(reason = %reason, delay_ms = delay.as_millis() as u64, "mcp server unavailable; its tools are withdrawn until it restarts");
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = wait_stopped(&mut self.stopped) => return,
            }
        }
    }

    /// One connection, from connect to its end. Sets `healthy_since` once the tools are listed.
    async fn session(&mut self, healthy_since: &mut Option<Instant>) -> SessionEnd {
        let list_changed = Arc::new(Notify::new());
        let handler = Client { list_changed: list_changed.clone() };
        let connected = tokio::select! {
            connected = tokio::time::timeout(self.timing.connect_timeout, connect(&self.config, &self.workdir, &self.owner, handler)) => connected,
            () = wait_stopped(&mut self.stopped) => return SessionEnd::Stopped,
        };
        let (running, child) = match connected {
            Ok(Ok(connection)) => connection,
            Ok(Err(reason)) => return SessionEnd::Failed(reason),
            Err(_) => {
                return SessionEnd::Failed(format!(
                    "it did not finish `initialize` within {} ms",
                    self.timing.connect_timeout.as_millis()
                ));
            }
        };
        let stderr_tail = child.as_ref().map(|child| child.stderr_tail.clone());
        let end = self.watch(running, &list_changed, healthy_since).await;
        if let Some(child) = child {
            child.end(self.timing.stop_grace).await;
        }
        match end {
            SessionEnd::Failed(reason) => {
                let tail = stderr_tail.map(|tail| String::from_utf8_lossy(&lock(&tail)).trim().to_owned());
                match tail.filter(|tail| !tail.is_empty()) {
                    Some(tail) => SessionEnd::Failed(format!("{reason}; the end of its stderr: {tail}")),
                    None => SessionEnd::Failed(reason),
                }
            }
            SessionEnd::Stopped => SessionEnd::Stopped,
        }
    }

    /// Lists, publishes, then watches the connection until it fails or the server is stopped.
    /// Closes the connection before returning.
    async fn watch(
        &mut self,
        running: RunningService<RoleClient, Client>,
        list_changed: &Notify,
        healthy_since: &mut Option<Instant>,
    ) -> SessionEnd {
        let peer = running.peer().clone();
        let cancel = running.cancellation_token();
        let closed = running.waiting();
        tokio::pin!(closed);
        let mut ping = tokio::time::interval_at(Instant::now() + self.timing.ping_interval, self.timing.ping_interval);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut relist = true;
        // `closed` may be polled only until it completes.
        let mut open = true;
        let end = loop {
            if relist {
                relist = false;
                let listed = tokio::select! {
                    listed = tokio::time::timeout(self.timing.list_timeout, peer.list_all_tools()) => listed,
                    _ = &mut closed => {
                        open = false;
                        break SessionEnd::Failed("it closed the connection".to_owned());
                    }
                    () = wait_stopped(&mut self.stopped) => break SessionEnd::Stopped,
                };
                match listed {
                    Ok(Ok(tools)) => {
                        tracing::info!(tools = tools.len(), "mcp server listed its tools");
                        self.shared.set(Some(peer.clone()), Some(tools));
                        healthy_since.get_or_insert_with(Instant::now);
                        (self.publish)();
                    }
                    Ok(Err(error)) => break SessionEnd::Failed(format!("`tools/list` failed: {error}")),
                    Err(_) => {
                        break SessionEnd::Failed(format!(
                            "it did not answer `tools/list` within {} ms",
                            self.timing.list_timeout.as_millis()
                        ));
                    }
                }
            }
            tokio::select! {
                _ = &mut closed => {
                    open = false;
                    break SessionEnd::Failed("it closed the connection".to_owned());
                }
                () = wait_stopped(&mut self.stopped) => break SessionEnd::Stopped,
                () = list_changed.notified() => relist = true,
                _ = ping.tick() => {
                    if let Err(reason) = self.ping(&peer).await {
                        break SessionEnd::Failed(reason);
                    }
                }
                () = self.shared.probe.notified() => {
                    if let Err(reason) = self.ping(&peer).await {
                        break SessionEnd::Failed(reason);
                    }
                }
            }
        };
        // Withdraw the tools before the (bounded) close, so no new call starts on this session.
        self.shared.set(None, None);
        (self.publish)();
        cancel.cancel();
        if open && tokio::time::timeout(self.timing.stop_grace, &mut closed).await.is_err() {
            tracing::debug!("mcp connection did not close within the stop grace");
        }
        end
    }

    /// `Ok` when the server answers a ping in time (an error response is an answer too).
    async fn ping(&self, peer: &Peer<RoleClient>) -> Result<(), String> {
        let request = ClientRequest::PingRequest(PingRequest::default());
        match tokio::time::timeout(self.timing.ping_timeout, peer.send_request(request)).await {
            Ok(Ok(_) | Err(ServiceError::McpError(_))) => Ok(()),
            Ok(Err(error)) => Err(format!("a ping failed: {error}")),
            Err(_) => {
                Err(format!("it did not answer a ping within {} ms (hung)", self.timing.ping_timeout.as_millis()))
            }
        }
    }
}

/// Resolves once the hub asks the server to stop (or can no longer ask).
async fn wait_stopped(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// The client side of the connection: it only listens for `notifications/tools/list_changed`.
struct Client {
    list_changed: Arc<Notify>,
}

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("nexus-runner-agent", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }
}

type Connection = (RunningService<RoleClient, Client>, Option<StdioChild>);

/// How long a stdio server that failed `initialize` is given, once killed, to hand over the rest
/// of its stderr for the warning.
const STDERR_AFTER_FAILURE_WAIT: Duration = Duration::from_millis(500);

/// Starts the transport and runs `initialize`. Errors are sentences for the log.
async fn connect(
    config: &McpServerConfig,
    workdir: &Path,
    owner: &Owner,
    handler: Client,
) -> Result<Connection, String> {
    match &config.transport {
        McpTransport::Stdio { command, env } => {
            let (mut child, transport) = StdioChild::spawn(command, env, workdir, owner)?;
            match handler.serve(transport).await {
                Ok(running) => Ok((running, Some(child))),
                Err(error) => {
                    // A server that dies at start says why on stderr: quote its end.
                    child.kill_now();
                    let _ = tokio::time::timeout(STDERR_AFTER_FAILURE_WAIT, &mut child.drain).await;
                    let tail = String::from_utf8_lossy(&lock(&child.stderr_tail)).trim().to_owned();
                    if tail.is_empty() {
                        Err(format!("`initialize` failed: {error}"))
                    } else {
                        Err(format!("`initialize` failed: {error}; the end of its stderr: {tail}"))
                    }
                }
            }
        }
        McpTransport::Http { url, headers_from_env } => {
            let headers = headers(headers_from_env)?;
            let transport_config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(headers)
                .max_json_response_size(MAX_HTTP_JSON_BYTES);
            let transport = StreamableHttpClientTransport::from_config(transport_config);
            let running =
                handler.serve(transport).await.map_err(|error| format!("`initialize` at {url} failed: {error}"))?;
            Ok((running, None))
        }
    }
}

/// The HTTP headers of `headers_from_env` (header name -> variable), each value read now and
/// marked sensitive (it is never logged).
fn headers(
    headers_from_env: &BTreeMap<String, String>,
) -> Result<HashMap<http::HeaderName, http::HeaderValue>, String> {
    let mut headers = HashMap::new();
    for (header, var) in headers_from_env {
        let name = http::HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| format!("{header:?} is not a valid HTTP header name"))?;
        let value = std::env::var(var)
            .map_err(|_| format!("the environment variable {var} (the value of the header {header}) is not set"))?;
        let mut value = http::HeaderValue::from_str(&value).map_err(|_| {
            format!("the environment variable {var} does not hold a valid value for the header {header}")
        })?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    Ok(headers)
}

/// A stdio server's process: the leader of its own process group, with the owner's mark and a
/// session mark of its own in its environment. Dropped without [`StdioChild::end`], it is killed
/// at once.
struct StdioChild {
    child: tokio::process::Child,
    /// The process group; `None` once the leader is reaped (its id may be reused then).
    group: Option<Pid>,
    /// The session's mark ([`CALL_VAR`]); `None` once swept.
    mark: Option<String>,
    stderr_tail: Arc<Mutex<Vec<u8>>>,
    drain: JoinHandle<()>,
}

type StdioTransport = (tokio::process::ChildStdout, tokio::process::ChildStdin);

impl StdioChild {
    fn spawn(
        command: &[String],
        env: &BTreeMap<String, String>,
        workdir: &Path,
        owner: &Owner,
    ) -> Result<(StdioChild, StdioTransport), String> {
        let Some((program, args)) = command.split_first() else {
            return Err("its command is empty".to_owned());
        };
        let mark = owner.new_call();
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .current_dir(workdir)
            .envs(env)
            .env(OWNER_VAR, owner.as_str())
            .env(CALL_VAR, &mark)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| format!("could not start {program:?} in {}: {error}", workdir.display()))?;
        let group = child.id().and_then(|pid| i32::try_from(pid).ok()).map(Pid::from_raw);
        let stderr_tail = Arc::new(Mutex::new(Vec::new()));
        let drain = match child.stderr.take() {
            Some(stderr) => tokio::spawn(drain_stderr(stderr, stderr_tail.clone()).in_current_span()),
            None => tokio::spawn(async {}),
        };
        let io = (child.stdout.take(), child.stdin.take());
        let mut started = StdioChild { child, group, mark: Some(mark), stderr_tail, drain };
        match io {
            (Some(stdout), Some(stdin)) => Ok((started, (stdout, stdin))),
            _ => {
                started.kill_now();
                Err("could not connect to its stdin and stdout".to_owned())
            }
        }
    }

    /// SIGKILLs the process group, if the leader is not reaped yet.
    fn kill_now(&mut self) {
        if let Some(group) = self.group {
            // ESRCH: the group is gone already.
            let _ = killpg(group, Signal::SIGKILL);
        }
    }

    /// Waits up to `grace` for the server to exit by itself (its stdin is closed), then kills its
    /// process group, then every process carrying the session's mark.
    async fn end(mut self, grace: Duration) {
        let exited = tokio::time::timeout(grace, self.child.wait()).await.is_ok();
        if !exited {
            self.kill_now();
            let _ = tokio::time::timeout(KILL_WAIT, self.child.wait()).await;
        }
        self.group = None;
        // What it wrote last belongs in the log line that reports its end.
        let _ = tokio::time::timeout(Duration::from_millis(200), &mut self.drain).await;
        if let Some(mark) = self.mark.take() {
            let sweep = tokio::task::spawn_blocking(move || kill_marked(CALL_VAR, &mark));
            if let Ok(Ok(killed)) = tokio::time::timeout(SWEEP_TIMEOUT, sweep).await
                && killed > 0
            {
                tracing::debug!(killed, "killed processes an mcp server left behind");
            }
        }
    }
}

impl Drop for StdioChild {
    fn drop(&mut self) {
        self.drain.abort();
        self.kill_now();
        if let Some(mark) = self.mark.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            drop(runtime.spawn_blocking(move || kill_marked(CALL_VAR, &mark)));
        }
    }
}

/// Reads a server's stderr to its end, logging it at debug and keeping its latest bytes.
async fn drain_stderr(mut stderr: tokio::process::ChildStderr, tail: Arc<Mutex<Vec<u8>>>) {
    let mut buf = vec![0u8; 4096];
    loop {
        match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                tracing::debug!(stderr = %String::from_utf8_lossy(&buf[..n]), "mcp server wrote to stderr");
                let mut kept = lock(&tail);
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > STDERR_TAIL_BYTES {
                    let cut = kept.len() - STDERR_TAIL_BYTES;
                    kept.drain(..cut);
                }
            }
        }
    }
}
