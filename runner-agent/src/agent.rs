//! The agent's loop: one task owns the journal, the running tools and the live stream, and handles
//! one event at a time (a frame, a finished tool, a handle's request, a journal flush, a timer).
//! Tools run in a `JoinSet` the loop owns; the stream comes and goes underneath them.
//!
//! Each turn of the loop ends the same way ([`Agent::end_turn`]): the frames the turn produced go
//! out, several in one `RunnerBatch`, and the journal records it queued go to the disk with one
//! sync, off the loop. What must wait for the disk (a tool's start, a commit, an extend's answer)
//! waits in `after_durable` for the flush's event (`docs/protocol.md`, "Runner journal",
//! "Batches").

mod commits;
mod link;
mod reload;
mod requests;
mod stream;
mod work;

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nexus_proto::Refusal;
use nexus_proto::runner::v1::{NexusFrame, RunnerFrame};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};
use tonic::Streaming;
use tracing::{debug, error, info, warn};

use self::link::{ConnectError, Connected};
use self::reload::ReloadCause;
use crate::claim::{ControlRequest, RequestError};
use crate::config::{AgentConfig, ConfigError};
use crate::error::AgentError;
use crate::journal::{EntryState, Journal, StateDirLock, TaskKey, Ticket, lock_state_dir};
use crate::mcp::{self, McpHub, McpTiming};
use crate::retry::ReconnectBackoff;
use crate::sleep_until_opt;
use crate::tools::reap::{OWNER_VAR, Owner, kill_marked};
use crate::tools::{Catalog, StopReason, ToolOutcome, Toolbox};
use crate::toolsfile::{self, FileDigest, Problem, ToolsFile, ToolsFileError};

/// Requests from claim handles waiting for the loop.
const CONTROL_CAPACITY: usize = 256;
/// Bound on the last sweep for processes the tools left running, when the agent stops.
const LEFTOVER_SWEEP_TIMEOUT: Duration = Duration::from_secs(2);
/// Two suspected fences (see [`FenceWatch`]) this close together mean a second runner-agent.
const FENCE_WINDOW: Duration = Duration::from_secs(120);

type Connecting = Pin<Box<dyn Future<Output = Result<Connected, ConnectError>> + Send>>;

/// A tool's result, handed back to the loop.
struct Finished {
    key: TaskKey,
    outcome: ToolOutcome,
}

/// What waits for the journal: done once the flush through its ticket ends.
enum AfterDurable {
    /// Start a claimed tool, its `running` entry on disk.
    Start(Box<work::Start>),
    /// Send a result, its `commit_pending` entry on disk.
    Commit(TaskKey),
    /// Tell a tool its extension, the new deadline on disk.
    Extended { reply: oneshot::Sender<Result<i64, RequestError>>, deadline_at_ms: i64 },
}

/// A request sent on the live stream, waiting for the answer with its request id.
enum Pending {
    Announce,
    /// A claim of a task of the named tool.
    Claim(TaskKey, String),
    Commit(TaskKey),
    /// The loop's own claim-status read, to notice a cancellation the push missed.
    Probe(TaskKey),
    Extend {
        key: TaskKey,
        reply: oneshot::Sender<Result<i64, RequestError>>,
    },
    ClaimStatus(oneshot::Sender<Result<bool, RequestError>>),
}

/// Notices a second runner-agent using this runner's credential. nexus fences a runner's stream
/// when a newer one says hello and just closes it, which looks like any other clean close (a
/// shutdown), so the sign is the pattern: nexus closes the stream and the very next connection is
/// welcomed, twice within [`FENCE_WINDOW`]. Two such agents take turns at this for as long as both
/// run; a restarting nexus refuses connections in between, which breaks the pattern.
#[derive(Default)]
struct FenceWatch {
    /// nexus closed the last stream, and no connection attempt failed since.
    closed_by_nexus: bool,
    /// When the last suspected fence was seen.
    last_suspect: Option<Instant>,
    /// The warning was logged; it is logged once per process.
    warned: bool,
}

impl FenceWatch {
    /// A stream was lost: `by_nexus` when nexus ended it cleanly.
    fn lost(&mut self, by_nexus: bool) {
        self.closed_by_nexus = by_nexus;
    }

    /// Whether to warn now that a connection was welcomed (true at most once).
    fn welcomed(&mut self, now: Instant) -> bool {
        if !std::mem::take(&mut self.closed_by_nexus) {
            return false;
        }
        let repeated = self.last_suspect.is_some_and(|at| now.duration_since(at) <= FENCE_WINDOW);
        self.last_suspect = Some(now);
        if !repeated || self.warned {
            return false;
        }
        self.warned = true;
        true
    }
}

/// The live stream's sending half and bookkeeping.
struct Link {
    outbound: mpsc::Sender<RunnerFrame>,
    /// Frames of this turn, sent when it ends ([`Agent::flush_outbox`]).
    outbox: Vec<RunnerFrame>,
    next_request_id: u64,
    pending: HashMap<u64, (Pending, Instant)>,
    last_frame_at: Instant,
    connected_at: Instant,
    liveness: Duration,
    /// nexus said in its welcome that it reads `RunnerBatch` frames.
    batches: bool,
}

pub(crate) struct Agent {
    config: AgentConfig,
    /// One target per URL of `config.nexus_urls`, in its order.
    endpoints: Vec<link::Target>,
    /// The address of the last stream, when its URL's name resolved to several: the next
    /// attempt at that URL tries it last.
    last_address: Option<std::net::SocketAddr>,
    /// The index in `endpoints` of the node this agent is connected to or connecting to.
    node: usize,
    /// Attempts to open a stream since the last welcome: the agent tries each node of the list
    /// in turn at once, and waits its backoff only after a whole round failed.
    attempts: usize,
    /// The nodes (indexes in `endpoints`) that refused this runner since the last welcome.
    refusals: HashSet<usize>,
    toolbox: Arc<Toolbox>,
    /// Held for the agent's life: no second runner-agent writes this journal or uses this
    /// runner's stream meanwhile.
    _state_lock: StateDirLock,
    journal: Journal,
    /// Actions waiting for their journal records to be durable, in ticket order.
    after_durable: VecDeque<(Ticket, AfterDurable)>,
    /// Tools running now (or claimed and waiting for their journal entry to start), with the way
    /// to stop each.
    running: HashMap<TaskKey, RunningTool>,
    tasks: JoinSet<Finished>,
    /// The task each tool task runs, so that one that ends without a result (a panic the tool's
    /// own guard missed, an abort) still gives its slot back.
    task_keys: HashMap<tokio::task::Id, TaskKey>,
    /// Hinted tasks not yet claimed, oldest first; `hinted` mirrors it for lookups.
    hints: VecDeque<Hint>,
    hinted: HashSet<TaskKey>,
    /// Tasks with a claim in flight, and the tool of each.
    claiming: HashMap<TaskKey, String>,
    /// Tasks with a request in flight of each other kind.
    committing: HashSet<TaskKey>,
    probing: HashSet<TaskKey>,
    link: Option<Link>,
    inbound: Option<Streaming<NexusFrame>>,
    connecting: Option<Connecting>,
    backoff: ReconnectBackoff,
    fence: FenceWatch,
    control_tx: mpsc::Sender<ControlRequest>,
    control_rx: mpsc::Receiver<ControlRequest>,
    draining: bool,
    /// The catalog last announced (or to be announced at the next connect); a change is
    /// announced at once when connected.
    catalog: watch::Receiver<Arc<Catalog>>,
    /// The tools file's reload in progress, off the loop.
    reload: Option<tokio::task::JoinHandle<Reloaded>>,
    /// The digest of the tools file's content last read, good or bad: the maintenance tick
    /// reads it again only to compare.
    tools_digest: Option<FileDigest>,
    /// The last reload refusal logged, so that a file that stays bad is logged once.
    reload_refusal: Option<ToolsFileError>,
    /// The MCP servers of the tools file (none without one); taken when the agent stops.
    mcp: Option<McpHub>,
    /// Bumps whenever the hub's tools change; they are then fed into the catalog.
    mcp_changes: watch::Receiver<u64>,
    /// The hub's reconfiguration after a reload, in progress; the next one waits for it.
    mcp_reconfiguring: Option<tokio::task::JoinHandle<()>>,
}

/// A hinted task, waiting for a slot (and for its tool to be under its `max_concurrency`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hint {
    key: TaskKey,
    /// The hint's `tool_name`.
    tool: String,
}

/// A tool claimed or running, with the way to stop it.
struct RunningTool {
    stop: watch::Sender<Option<StopReason>>,
    /// The task's `tool_name`.
    tool: String,
}

/// What reading the tools file again found.
#[derive(Debug)]
enum Reloaded {
    /// The same bytes as last read; nothing to do.
    Unchanged,
    /// New bytes (or a forced read), valid.
    Good(Box<ToolsFile>, FileDigest),
    /// New bytes, refused; `digest` is `None` when the file could not be read.
    Bad(ToolsFileError, Option<FileDigest>),
}

impl Agent {
    /// Validates the configuration and loads the journal.
    pub(crate) fn new(mut config: AgentConfig) -> Result<Agent, AgentError> {
        config.check()?;
        let endpoints =
            config.nexus_urls.iter().map(|url| link::target(&config, url)).collect::<Result<Vec<_>, _>>()?;
        let workdir_error = |reason: String| ConfigError::Workdir { path: config.workdir.clone(), reason };
        let workdir = config.workdir.canonicalize().map_err(|err| workdir_error(err.to_string()))?;
        if !workdir.is_dir() {
            return Err(workdir_error("not a directory".to_owned()).into());
        }
        config.workdir = workdir.clone();
        if let Some(dir) = &config.skills_dir {
            let skills_error = |reason: String| ConfigError::SkillsDir { path: dir.clone(), reason };
            let canonical = dir.canonicalize().map_err(|err| skills_error(err.to_string()))?;
            if !canonical.is_dir() {
                return Err(skills_error("not a directory".to_owned()).into());
            }
            config.skills_dir = Some(canonical);
        }
        let state_lock = lock_state_dir(&config.state_dir)?;
        let journal = Journal::open_writable(&state_lock, config.runner_id)?;
        // Held the state dir, so every process with its mark is a previous run's leftover.
        let owner = Owner::of_state_dir(state_lock.dir());
        let leftovers = kill_marked(OWNER_VAR, owner.as_str());
        if leftovers > 0 {
            warn!(killed = leftovers, "killed processes that the tools of an earlier run left behind");
        }
        for entry in journal.entries() {
            let (run_public_id, task_key) = (&entry.key.run_public_id, &entry.key.task_key);
            match entry.state {
                EntryState::Running => warn!(
                    %run_public_id, %task_key, tool = %entry.tool_name,
                    "a task claimed before the restart has no result; it is never run again and nexus settles it at its deadline"
                ),
                EntryState::CommitPending { .. } => {
                    info!(%run_public_id, %task_key, "a result from before the restart will be committed once connected");
                }
            }
        }
        let (control_tx, control_rx) = mpsc::channel(CONTROL_CAPACITY);
        let toolbox = Toolbox::new(workdir, config.tool_timeout_ms, owner).with_skills_dir(config.skills_dir.clone());
        let mut tools_digest = None;
        if let Some(path) = &config.tools_file {
            let (file, digest) = toolsfile::load(path).map_err(|source| ConfigError::ToolsFile { source })?;
            toolbox
                .replace_tools_file(file)
                .map_err(|err| ConfigError::ToolsFile { source: ToolsFileError::of_catalog(path, &err) })?;
            info!(path = %path.display(), tools = toolbox.catalog().specs().count(), "read the tools file");
            tools_digest = Some(digest);
        }
        let catalog = toolbox.subscribe();
        let mcp = McpHub::start(
            toolbox.tools_file().mcp_servers.clone(),
            toolbox.workdir().clone(),
            toolbox.owner().clone(),
            McpTiming::default(),
        );
        let mcp_changes = mcp.subscribe();
        Ok(Agent {
            toolbox: Arc::new(toolbox),
            catalog,
            reload: None,
            tools_digest,
            reload_refusal: None,
            mcp: Some(mcp),
            mcp_changes,
            mcp_reconfiguring: None,
            backoff: ReconnectBackoff::new(&config),
            config,
            endpoints,
            last_address: None,
            node: 0,
            attempts: 0,
            refusals: HashSet::new(),
            _state_lock: state_lock,
            journal,
            after_durable: VecDeque::new(),
            running: HashMap::new(),
            tasks: JoinSet::new(),
            task_keys: HashMap::new(),
            hints: VecDeque::new(),
            hinted: HashSet::new(),
            claiming: HashMap::new(),
            committing: HashSet::new(),
            probing: HashSet::new(),
            link: None,
            inbound: None,
            connecting: None,
            control_tx,
            control_rx,
            draining: false,
            fence: FenceWatch::default(),
        })
    }

    /// Runs until `shutdown` resolves and the stopped tools are journaled (bounded by
    /// `shutdown_grace`), or until nexus refuses this runner for good.
    pub(crate) async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
        let outcome = self.serve(shutdown).await;
        // Whatever the last turns queued (a removal, a result) still goes to the disk.
        if let Err(err) = self.journal.sync().await {
            error!(error = %err, "could not write the journal");
        }
        // The MCP servers get their grace before the sweep kills whatever carries the mark.
        if let Some(mcp) = self.mcp.take() {
            mcp.shutdown().await;
        }
        self.toolbox.shutdown().await;
        kill_leftovers(self.toolbox.owner().as_str().to_owned()).await;
        outcome
    }

    async fn serve(&mut self, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
        tokio::pin!(shutdown);
        self.connecting = Some(self.open_after(Duration::ZERO));
        let mut maintenance = tokio::time::interval(self.config.poll_interval);
        maintenance.set_missed_tick_behavior(MissedTickBehavior::Delay);
        maintenance.reset();
        let mut drain_deadline = None;
        // SIGHUP reads the tools file again (only with one: without, SIGHUP keeps its default).
        let mut hangups = match &self.config.tools_file {
            Some(_) => tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .inspect_err(|err| warn!(error = %err, "cannot listen for sighup; the tools file is still read again when it changes"))
                .ok(),
            None => None,
        };
        loop {
            self.end_turn();
            if self.draining && self.drained() {
                info!("stopped");
                return Ok(());
            }
            let silent_at = self.link.as_ref().map(|link| link.last_frame_at + link.liveness);
            tokio::select! {
                () = &mut shutdown, if !self.draining => {
                    self.begin_drain();
                    drain_deadline = Some(Instant::now() + self.config.shutdown_grace);
                }
                () = sleep_until_opt(drain_deadline) => {
                    warn!("the shutdown grace passed with work open; it stays journaled");
                    return Ok(());
                }
                flushed = self.journal.flushed() => self.on_journal_flushed(flushed),
                Some(joined) = self.tasks.join_next_with_id() => {
                    self.on_joined(joined);
                    // Tools done meanwhile end in this turn too: their results share a flush
                    // and a batch.
                    while let Some(joined) = self.tasks.try_join_next_with_id() {
                        self.on_joined(joined);
                    }
                }
                Some(request) = self.control_rx.recv() => {
                    self.on_control(request);
                    while let Ok(request) = self.control_rx.try_recv() {
                        self.on_control(request);
                    }
                }
                opened = poll_connecting(&mut self.connecting) => {
                    self.connecting = None;
                    match opened {
                        Ok(connected) => self.on_connected(connected),
                        Err(err) => {
                            // With several nodes, one that refuses this runner (another
                            // cluster's, say) is left for the others; only when every node of
                            // the list refused does the agent stop.
                            if let Some(refusal) = err.fatal() {
                                let code = refusal.code;
                                let why = format!("{code}: {}", refusal.message);
                                if self.leave_refusing_node(&why) {
                                    continue;
                                }
                                error!(nexus = self.nexus_url(), %code, message = %refusal.message, "nexus refused this runner; not retrying");
                                return Err(AgentError::Refused(refusal));
                            }
                            if let Some(reason) = err.tls_failure(&self.config.tls) {
                                if self.leave_refusing_node(&format!("tls failed: {reason}")) {
                                    continue;
                                }
                                error!(nexus = self.nexus_url(), %reason, "tls with nexus failed; not retrying");
                                return Err(AgentError::Tls(reason));
                            }
                            self.fence.lost(false);
                            if self.endpoints.len() > 1 {
                                // A standby that cannot pass the stream on to the node that
                                // serves refuses it at once, naming that node (an older nexus
                                // closed the connection instead); a stopped node refuses the
                                // connection.
                                warn!(nexus = self.nexus_url(), error = %err, "could not open the stream to this node; trying the next");
                            } else if self.plaintext() && err.looks_like_a_tls_port() {
                                warn!(nexus = self.nexus_url(), error = %err, hint = link::PLAINTEXT_TO_TLS_HINT, "could not open the stream to nexus");
                            } else {
                                warn!(nexus = self.nexus_url(), error = %err, "could not open the stream to nexus");
                            }
                            self.schedule_reconnect();
                        }
                    }
                }
                received = next_frame(&mut self.inbound) => match received {
                    Ok(Some(frame)) => self.on_frame(frame),
                    Ok(None) => {
                        self.lose_link("nexus closed the stream");
                        self.fence.lost(true);
                    }
                    Err(status) => self.lose_link(&format!("the stream failed: {status}")),
                },
                () = sleep_until_opt(silent_at) => self.lose_link("no frame from nexus within the liveness bound"),
                _ = maintenance.tick() => {
                    self.maintain();
                    self.start_reload(ReloadCause::Tick);
                }
                () = reload::hangup(&mut hangups), if !self.draining => self.start_reload(ReloadCause::Hangup),
                reloaded = reload::poll_reload(&mut self.reload) => self.on_reloaded(reloaded),
                Ok(()) = self.catalog.changed() => self.on_catalog_changed(),
                Ok(()) = self.mcp_changes.changed() => self.on_mcp_changed(),
            }
        }
    }

    /// The end of a turn: the frames it produced go out, and the journal records it queued go to
    /// the disk together (unless a flush runs already; they then go with the next).
    fn end_turn(&mut self) {
        self.flush_outbox();
        self.journal.start_flush();
    }

    fn on_joined(&mut self, joined: Result<(tokio::task::Id, Finished), JoinError>) {
        match joined {
            Ok((id, finished)) => {
                self.task_keys.remove(&id);
                self.on_tool_finished(finished);
            }
            Err(err) => {
                let Some(key) = self.task_keys.remove(&err.id()) else {
                    debug!(error = %err, "a tool task ended without a result");
                    return;
                };
                warn!(task_key = %key.task_key, error = %err, "a tool task ended without a result");
                let outcome = ToolOutcome::error("the tool crashed; its effect is unknown");
                self.on_tool_finished(Finished { key, outcome });
            }
        }
    }

    fn begin_drain(&mut self) {
        info!(running = self.running.len(), "shutting down");
        self.draining = true;
        self.connecting = None;
        self.hints.clear();
        self.hinted.clear();
        for running in self.running.values() {
            running.stop.send_replace(Some(StopReason::Shutdown));
        }
    }

    /// Nothing left that could still produce, journal or deliver a result.
    fn drained(&self) -> bool {
        self.running.is_empty()
            && self.after_durable.is_empty()
            && self.journal.is_idle()
            && (self.link.is_none() || (self.committing.is_empty() && self.claiming.is_empty()))
    }
}

/// Kills every process this state dir's tools started that still runs (a tool past the grace, or
/// one that escaped its call's own sweep), bounded by [`LEFTOVER_SWEEP_TIMEOUT`].
async fn kill_leftovers(owner: String) {
    let sweep = tokio::task::spawn_blocking(move || kill_marked(OWNER_VAR, &owner));
    match tokio::time::timeout(LEFTOVER_SWEEP_TIMEOUT, sweep).await {
        Ok(Ok(0)) => {}
        Ok(Ok(killed)) => info!(killed, "killed what the tools left running"),
        Ok(Err(err)) => warn!(error = %err, "the sweep for what the tools left running failed"),
        Err(_) => warn!("the sweep for what the tools left running did not finish in time"),
    }
}

/// A refusal frame as a typed refusal: a word this build does not know takes the code its HTTP
/// status stands for.
fn refusal_of(refusal: nexus_proto::runner::v1::Refusal) -> Refusal {
    let http_status = u16::try_from(refusal.http_status).unwrap_or(500);
    Refusal::from_wire(&refusal.code, &refusal.message, http_status)
}

/// Unix milliseconds: the time of nexus's deadlines, which the journal keeps as granted.
#[expect(
    clippy::disallowed_methods,
    reason = "runner-agent's one read of the system clock: nexus grants deadlines in Unix time"
)]
fn unix_now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}

async fn poll_connecting(connecting: &mut Option<Connecting>) -> Result<Connected, ConnectError> {
    match connecting {
        Some(opening) => opening.await,
        None => std::future::pending().await,
    }
}

async fn next_frame(inbound: &mut Option<Streaming<NexusFrame>>) -> Result<Option<NexusFrame>, tonic::Status> {
    match inbound {
        Some(stream) => stream.message().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
