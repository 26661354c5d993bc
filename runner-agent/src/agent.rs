//! The agent's loop: one task owns the journal, the running tools and the live stream, and handles
//! one event at a time (a frame, a finished tool, a handle's request, a timer). Tools run in a
//! `JoinSet` the loop owns; the stream comes and goes underneath them.

mod link;

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use nexus_proto::runner::v1::nexus_frame::Frame as Answer;
use nexus_proto::runner::v1::runner_frame::Frame as Request;
use nexus_proto::runner::v1::{
    Announce, Claim, ClaimGranted, ClaimStatus, Commit, Extend, Hello, NexusFrame, Pong, Progress, RunnerFrame,
    WorkAvailable, WorkCanceled,
};
use nexus_proto::{ErrorCode, InboxKind, RUNNER_PROTOCOL_VERSION, Refusal};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tonic::Streaming;
use tonic::transport::Endpoint;
use tracing::{Instrument, debug, error, info, info_span, warn};

use self::link::{ConnectError, Connected, HELLO_REQUEST_ID};
use crate::claim::{ClaimHandle, ControlRequest, RequestError};
use crate::config::{AgentConfig, ConfigError};
use crate::error::AgentError;
use crate::journal::{EntryState, Journal, JournalEntry, StateDirLock, TaskKey, lock_state_dir};
use crate::retry::{self, ReconnectBackoff};
use crate::sleep_until_opt;
use crate::tools::{StopReason, ToolContext, ToolOutcome, Toolbox};

/// Requests from claim handles waiting for the loop.
const CONTROL_CAPACITY: usize = 256;
/// Two suspected fences (see [`FenceWatch`]) this close together mean a second runner-agent.
const FENCE_WINDOW: Duration = Duration::from_secs(120);

type Connecting = Pin<Box<dyn Future<Output = Result<Connected, ConnectError>> + Send>>;

/// A tool's result, handed back to the loop.
struct Finished {
    key: TaskKey,
    outcome: ToolOutcome,
}

/// A request sent on the live stream, waiting for the answer with its request id.
enum Pending {
    Announce,
    Claim(TaskKey),
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
    next_request_id: u64,
    pending: HashMap<u64, (Pending, Instant)>,
    last_frame_at: Instant,
    connected_at: Instant,
    liveness: Duration,
}

pub(crate) struct Agent {
    config: AgentConfig,
    endpoint: Endpoint,
    toolbox: Arc<Toolbox>,
    /// Held for the agent's life: no second runner-agent writes this journal or uses this
    /// runner's stream meanwhile.
    _state_lock: StateDirLock,
    journal: Journal,
    /// Tools running now, with the way to stop each.
    running: HashMap<TaskKey, watch::Sender<Option<StopReason>>>,
    tasks: JoinSet<Finished>,
    /// Hinted tasks not yet claimed, oldest first; `hinted` mirrors it for lookups.
    hints: VecDeque<TaskKey>,
    hinted: HashSet<TaskKey>,
    /// Tasks with a request in flight of each kind.
    claiming: HashSet<TaskKey>,
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
}

impl Agent {
    /// Validates the configuration and loads the journal.
    pub(crate) fn new(mut config: AgentConfig) -> Result<Agent, AgentError> {
        config.check()?;
        let endpoint = link::endpoint(&config)?;
        let workdir_error = |reason: String| ConfigError::Workdir { path: config.workdir.clone(), reason };
        let workdir = config.workdir.canonicalize().map_err(|err| workdir_error(err.to_string()))?;
        if !workdir.is_dir() {
            return Err(workdir_error("not a directory".to_owned()).into());
        }
        config.workdir = workdir.clone();
        let state_lock = lock_state_dir(&config.state_dir)?;
        let journal = Journal::open(&config.state_dir, config.runner_id)?;
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
        Ok(Agent {
            toolbox: Arc::new(Toolbox::new(workdir, config.tool_timeout_ms)),
            backoff: ReconnectBackoff::new(&config),
            config,
            endpoint,
            _state_lock: state_lock,
            journal,
            running: HashMap::new(),
            tasks: JoinSet::new(),
            hints: VecDeque::new(),
            hinted: HashSet::new(),
            claiming: HashSet::new(),
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
        tokio::pin!(shutdown);
        self.connecting = Some(self.open_after(Duration::ZERO));
        let mut maintenance = tokio::time::interval(self.config.poll_interval);
        maintenance.set_missed_tick_behavior(MissedTickBehavior::Delay);
        maintenance.reset();
        let mut drain_deadline = None;
        loop {
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
                Some(joined) = self.tasks.join_next() => match joined {
                    Ok(finished) => self.on_tool_finished(finished).await,
                    Err(err) => debug!(error = %err, "a tool task ended without a result"),
                },
                Some(request) = self.control_rx.recv() => self.on_control(request),
                opened = poll_connecting(&mut self.connecting) => {
                    self.connecting = None;
                    match opened {
                        Ok(connected) => self.on_connected(connected).await,
                        Err(err) => {
                            if let Some(refusal) = err.fatal() {
                                error!(code = %refusal.code, message = %refusal.message, "nexus refused this runner; not retrying");
                                return Err(AgentError::Refused(refusal));
                            }
                            if let Some(reason) = err.tls_failure(&self.config.tls) {
                                error!(%reason, "tls with nexus failed; not retrying");
                                return Err(AgentError::Tls(reason));
                            }
                            self.fence.lost(false);
                            if self.plaintext() && err.looks_like_a_tls_port() {
                                warn!(error = %err, hint = link::PLAINTEXT_TO_TLS_HINT, "could not open the stream to nexus");
                            } else {
                                warn!(error = %err, "could not open the stream to nexus");
                            }
                            self.schedule_reconnect();
                        }
                    }
                }
                received = next_frame(&mut self.inbound) => match received {
                    Ok(Some(frame)) => self.on_frame(frame).await,
                    Ok(None) => {
                        self.lose_link("nexus closed the stream");
                        self.fence.lost(true);
                    }
                    Err(status) => self.lose_link(&format!("the stream failed: {status}")),
                },
                () = sleep_until_opt(silent_at) => self.lose_link("no frame from nexus within the liveness bound"),
                _ = maintenance.tick() => self.maintain().await,
            }
        }
    }

    /// Whether the URL asks for plaintext (`http://`).
    fn plaintext(&self) -> bool {
        self.config.nexus_url.get(..7).is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
    }

    fn hello(&self) -> Hello {
        Hello {
            executor_public_id: self.config.runner_id.to_string(),
            credential: self.config.credential.expose().to_owned(),
            protocol_version: RUNNER_PROTOCOL_VERSION,
        }
    }

    fn open_after(&self, delay: Duration) -> Connecting {
        let bounds = (self.config.connect_timeout, self.config.handshake_timeout);
        Box::pin(link::open(self.endpoint.clone(), self.hello(), bounds, delay))
    }

    fn schedule_reconnect(&mut self) {
        let delay = self.backoff.next_delay();
        info!(delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "reconnecting");
        self.connecting = Some(self.open_after(delay));
    }

    async fn on_connected(&mut self, connected: Connected) {
        let Connected { outbound, inbound, welcome } = connected;
        if welcome.protocol_version != RUNNER_PROTOCOL_VERSION {
            warn!(theirs = welcome.protocol_version, ours = RUNNER_PROTOCOL_VERSION, "protocol versions differ");
        }
        // A slow pinger must not look dead: allow three ping intervals of silence.
        let ping_bound = Duration::from_millis(welcome.ping_interval_ms.saturating_mul(3));
        let liveness = self.config.liveness_timeout.max(ping_bound);
        info!(
            credential_epoch = welcome.credential_epoch,
            liveness_ms = u64::try_from(liveness.as_millis()).unwrap_or(u64::MAX),
            "connected to nexus"
        );
        if self.fence.welcomed(Instant::now()) {
            warn!(
                "nexus keeps closing this runner's stream and welcoming it straight back: another runner-agent may be \
                 using this runner's credential, each new stream fencing the other; stop it, or give it a runner of its \
                 own (nexus admin runner create)"
            );
        }
        self.attach(outbound, liveness);
        self.inbound = Some(inbound);
        self.after_connect().await;
    }

    fn attach(&mut self, outbound: mpsc::Sender<RunnerFrame>, liveness: Duration) {
        let now = Instant::now();
        self.link = Some(Link {
            outbound,
            next_request_id: HELLO_REQUEST_ID + 1,
            pending: HashMap::new(),
            last_frame_at: now,
            connected_at: now,
            liveness,
        });
    }

    /// Announce (whole replacement), then re-send every unacknowledged result.
    async fn after_connect(&mut self) {
        let body_json = self.toolbox.announcement().to_string();
        self.send_request(Request::Announce(Announce { body_json }), Pending::Announce);
        self.resend_commits().await;
    }

    fn lose_link(&mut self, reason: &str) {
        let Some(link) = self.link.take() else { return };
        self.fence.lost(false);
        self.inbound = None;
        warn!(reason, "lost the stream to nexus");
        for (pending, _) in link.pending.into_values() {
            if let Pending::Claim(key) = &pending {
                // nexus never grants a claim twice (`docs/protocol.md`, "Claim"): a grant lost
                // with the stream cannot be asked for again, and the call lapses at its deadline.
                warn!(
                    run_public_id = %key.run_public_id,
                    task_key = %key.task_key,
                    "a claim was unanswered when the stream dropped; if nexus granted it, the grant is lost and \
                     nexus settles the call at its deadline without running it here"
                );
            }
            self.abandon(pending, RequestError::Disconnected);
        }
        // Hints are level-triggered: nexus sends them all again after the next welcome.
        self.hints.clear();
        self.hinted.clear();
        if link.connected_at.elapsed() >= self.config.healthy_after {
            self.backoff.reset();
        }
        if !self.draining {
            self.schedule_reconnect();
        }
    }

    fn begin_drain(&mut self) {
        info!(running = self.running.len(), "shutting down");
        self.draining = true;
        self.connecting = None;
        self.hints.clear();
        self.hinted.clear();
        for stop in self.running.values() {
            stop.send_replace(Some(StopReason::Shutdown));
        }
    }

    /// Nothing left that could still produce or deliver a result.
    fn drained(&self) -> bool {
        self.running.is_empty() && (self.link.is_none() || (self.committing.is_empty() && self.claiming.is_empty()))
    }

    // ---- sending ----

    /// Sends a request with a fresh id and remembers what answers it. Without a stream the
    /// request is abandoned at once.
    fn send_request(&mut self, frame: Request, pending: Pending) {
        let Some(request_id) = self.send_numbered(frame) else {
            self.abandon(pending, RequestError::Disconnected);
            return;
        };
        match &pending {
            Pending::Claim(key) => self.claiming.insert(key.clone()),
            Pending::Commit(key) => self.committing.insert(key.clone()),
            Pending::Probe(key) => self.probing.insert(key.clone()),
            _ => false,
        };
        if let Some(link) = self.link.as_mut() {
            link.pending.insert(request_id, (pending, Instant::now()));
        }
    }

    /// Sends `frame` under a fresh request id; `None` when there is no usable stream.
    fn send_numbered(&mut self, frame: Request) -> Option<u64> {
        let link = self.link.as_mut()?;
        let request_id = link.next_request_id;
        link.next_request_id += 1;
        let frame = RunnerFrame { request_id, frame: Some(frame) };
        if link.outbound.try_send(frame).is_err() {
            self.lose_link("nexus stopped reading the stream");
            return None;
        }
        Some(request_id)
    }

    /// Sends a frame that expects no answer (request id 0).
    fn send_push(&mut self, frame: Request) {
        let Some(link) = self.link.as_ref() else {
            return;
        };
        if link.outbound.try_send(RunnerFrame { request_id: 0, frame: Some(frame) }).is_err() {
            self.lose_link("nexus stopped reading the stream");
        }
    }

    /// Forgets a request: clears its in-flight mark and tells a waiting handle.
    fn abandon(&mut self, pending: Pending, why: RequestError) {
        self.untrack(&pending);
        match pending {
            Pending::Extend { reply, .. } => drop(reply.send(Err(why))),
            Pending::ClaimStatus(reply) => drop(reply.send(Err(why))),
            _ => {}
        }
    }

    fn untrack(&mut self, pending: &Pending) {
        match pending {
            Pending::Claim(key) => self.claiming.remove(key),
            Pending::Commit(key) => self.committing.remove(key),
            Pending::Probe(key) => self.probing.remove(key),
            _ => false,
        };
    }

    fn send_commit(&mut self, key: &TaskKey) {
        if self.link.is_none() || self.committing.contains(key) {
            return;
        }
        let Some(entry) = self.journal.get(key) else {
            return;
        };
        let EntryState::CommitPending { body, .. } = &entry.state else {
            return;
        };
        let frame = Request::Commit(Commit {
            run_public_id: key.run_public_id.clone(),
            task_key: key.task_key.clone(),
            claim_token: entry.claim_token.clone(),
            body_json: body.to_string(),
        });
        self.send_request(frame, Pending::Commit(key.clone()));
    }

    /// Drops results whose deadline passed (nexus settles those by expiry), then sends every
    /// other unacknowledged result that is not already in flight.
    async fn resend_commits(&mut self) {
        let now_ms = unix_now_ms();
        let committing = &self.committing;
        let expired = self.journal.remove_where(|entry| {
            matches!(entry.state, EntryState::CommitPending { .. })
                && entry.deadline_at_ms <= now_ms
                && !committing.contains(&entry.key)
        });
        for entry in &expired {
            warn!(
                run_public_id = %entry.key.run_public_id, task_key = %entry.key.task_key,
                "dropping a result whose claim deadline passed; nexus settles the task by expiry"
            );
        }
        if !expired.is_empty() {
            persist(&self.journal).await;
        }
        let waiting: Vec<TaskKey> = self
            .journal
            .entries()
            .filter(|entry| matches!(entry.state, EntryState::CommitPending { .. }))
            .map(|entry| entry.key.clone())
            .collect();
        for key in waiting {
            self.send_commit(&key);
        }
    }

    // ---- events ----

    async fn on_frame(&mut self, frame: NexusFrame) {
        if let Some(link) = self.link.as_mut() {
            link.last_frame_at = Instant::now();
        }
        let NexusFrame { request_id, frame } = frame;
        let Some(frame) = frame else {
            debug!(request_id, "ignoring an empty frame");
            return;
        };
        match frame {
            Answer::Ping(ping) => self.send_push(Request::Pong(Pong { nonce: ping.nonce })),
            Answer::WorkAvailable(work) => self.on_work_available(work),
            Answer::WorkCanceled(canceled) => self.on_work_canceled(canceled),
            answer => {
                let pending = self.link.as_mut().and_then(|link| link.pending.remove(&request_id));
                match pending {
                    Some((pending, _)) => self.on_answer(pending, answer).await,
                    None => debug!(request_id, "ignoring an answer to no open request"),
                }
            }
        }
    }

    fn on_work_available(&mut self, work: WorkAvailable) {
        let key = TaskKey { run_public_id: work.run_public_id, task_key: work.task_key };
        // Only tool calls are claimable; another kind (a newer nexus's) is not this runner's.
        if work.kind.parse::<InboxKind>() != Ok(InboxKind::ToolCall) {
            debug!(kind = %work.kind, task_key = %key.task_key, "ignoring work that is not a tool call");
            return;
        }
        let held = self.running.contains_key(&key)
            || self.journal.contains(&key)
            || self.claiming.contains(&key)
            || self.hinted.contains(&key);
        if self.draining || held {
            debug!(run_public_id = %key.run_public_id, task_key = %key.task_key, "ignoring a hint for a task already held");
            return;
        }
        debug!(run_public_id = %key.run_public_id, task_key = %key.task_key, tool = %work.tool_name, "work available");
        self.hinted.insert(key.clone());
        self.hints.push_back(key);
        self.pump_claims();
    }

    fn on_work_canceled(&mut self, canceled: WorkCanceled) {
        let key = TaskKey { run_public_id: canceled.run_public_id, task_key: canceled.task_key };
        if self.hinted.remove(&key) {
            self.hints.retain(|hinted| hinted != &key);
        }
        self.stop_task(&key, "nexus canceled the task");
    }

    fn stop_task(&self, key: &TaskKey, why: &str) {
        if let Some(stop) = self.running.get(key) {
            info!(run_public_id = %key.run_public_id, task_key = %key.task_key, why, "stopping a running tool");
            stop.send_replace(Some(StopReason::Canceled));
        }
    }

    /// Claims hinted tasks while a slot is free: nothing is claimed that cannot start at once.
    fn pump_claims(&mut self) {
        while self.link.is_some() && !self.draining && self.running.len() + self.claiming.len() < self.config.slots {
            let Some(key) = self.hints.pop_front() else {
                break;
            };
            self.hinted.remove(&key);
            if self.journal.contains(&key) || self.running.contains_key(&key) {
                continue;
            }
            let frame =
                Request::Claim(Claim { run_public_id: key.run_public_id.clone(), task_key: key.task_key.clone() });
            self.send_request(frame, Pending::Claim(key));
        }
    }

    async fn on_answer(&mut self, pending: Pending, answer: Answer) {
        self.untrack(&pending);
        match (pending, answer) {
            (Pending::Announce, Answer::Announced(_)) => info!("nexus accepted the announcement"),
            (Pending::Announce, Answer::Refusal(refusal)) => error!(
                code = %refusal.code, message = %refusal.message,
                "nexus refused the announcement; the tools stay as last announced"
            ),
            (Pending::Claim(key), Answer::ClaimGranted(grant)) => self.on_claim_granted(key, grant).await,
            (Pending::Claim(key), Answer::Refusal(refusal)) => {
                debug!(run_public_id = %key.run_public_id, task_key = %key.task_key, code = %refusal.code, "claim refused");
            }
            (Pending::Commit(key), Answer::Committed(committed)) => {
                self.journal.remove(&key);
                persist(&self.journal).await;
                info!(
                    run_public_id = %key.run_public_id, task_key = %key.task_key,
                    idle = committed.idle, status = %committed.status, "commit acknowledged"
                );
            }
            (Pending::Commit(key), Answer::Refusal(refusal)) => self.on_commit_refused(key, refusal).await,
            (Pending::Probe(key), Answer::ClaimState(state)) => {
                if !state.active {
                    self.stop_task(&key, "the claim is no longer active");
                }
            }
            (Pending::Probe(key), Answer::Refusal(refusal)) => {
                if refusal_of(refusal).code == ErrorCode::NotClaimant {
                    self.stop_task(&key, "nexus says this runner no longer holds the claim");
                }
            }
            (Pending::Extend { key, reply }, Answer::Extended(extended)) => {
                if let Some(entry) = self.journal.get_mut(&key) {
                    entry.deadline_at_ms = extended.deadline_at_ms;
                    persist(&self.journal).await;
                }
                drop(reply.send(Ok(extended.deadline_at_ms)));
            }
            (Pending::ClaimStatus(reply), Answer::ClaimState(state)) => drop(reply.send(Ok(state.active))),
            (Pending::Extend { reply, .. }, Answer::Refusal(refusal)) => {
                drop(reply.send(Err(RequestError::Refused(refusal_of(refusal)))));
            }
            (Pending::ClaimStatus(reply), Answer::Refusal(refusal)) => {
                drop(reply.send(Err(RequestError::Refused(refusal_of(refusal)))));
            }
            (pending, _) => {
                warn!("nexus answered a request with a frame of another kind");
                self.abandon(pending, RequestError::UnexpectedAnswer);
            }
        }
        self.pump_claims();
    }

    async fn on_claim_granted(&mut self, key: TaskKey, grant: ClaimGranted) {
        let task: Value = serde_json::from_str(&grant.task_json).unwrap_or(Value::Null);
        let tool_name = task.get("tool_name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let tool_input = task.get("tool_input").cloned().unwrap_or(Value::Null);
        let task_timeout_ms = task.get("timeout_ms").and_then(Value::as_u64);
        let deadline_at_ms = if grant.deadline_at_ms > 0 {
            grant.deadline_at_ms
        } else {
            warn!(task_key = %key.task_key, "the claim came without a deadline; assuming the task's timeout");
            let budget = task_timeout_ms.unwrap_or(self.config.tool_timeout_ms);
            unix_now_ms().saturating_add(i64::try_from(budget).unwrap_or(i64::MAX))
        };
        info!(run_public_id = %key.run_public_id, task_key = %key.task_key, tool = %tool_name, "claimed");
        self.journal.insert(JournalEntry {
            key: key.clone(),
            tool_name: tool_name.clone(),
            claim_token: grant.claim_token.clone(),
            deadline_at_ms,
            state: EntryState::Running,
        });
        if self.draining {
            let content = "the runner was shutting down and did not start the tool".to_owned();
            self.record_result(&key, ToolOutcome::Failed { content }).await;
            return;
        }
        // Journal the claim before the tool can have any effect.
        if !persist(&self.journal).await {
            let content = "the runner could not record the claim in its journal, so it did not start the tool";
            self.record_result(&key, ToolOutcome::Failed { content: content.to_owned() }).await;
            return;
        }
        let (stop_tx, stop) = watch::channel(None);
        let until_deadline = Duration::from_millis(u64::try_from(deadline_at_ms - unix_now_ms()).unwrap_or(0));
        let ctx = ToolContext {
            workdir: self.toolbox.workdir().clone(),
            bash_timeout_ms: self.toolbox.bash_timeout_ms(),
            task_timeout_ms,
            clamp_at: Some(Instant::now() + until_deadline.saturating_sub(self.config.commit_margin)),
            stop,
            claim: Some(ClaimHandle::new(key.clone(), grant.claim_token, self.control_tx.clone())),
        };
        let span = info_span!(
            "task",
            runner_id = %self.config.runner_id,
            run_public_id = %key.run_public_id,
            task_key = %key.task_key,
            tool = %tool_name,
        );
        let toolbox = Arc::clone(&self.toolbox);
        let task_key = key.clone();
        self.tasks.spawn(
            async move {
                let outcome = AssertUnwindSafe(toolbox.run(&tool_name, tool_input, ctx))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|_| ToolOutcome::error("the tool crashed; its effect is unknown"));
                Finished { key: task_key, outcome }
            }
            .instrument(span),
        );
        self.running.insert(key, stop_tx);
    }

    async fn on_tool_finished(&mut self, finished: Finished) {
        let Finished { key, outcome } = finished;
        self.running.remove(&key);
        self.probing.remove(&key);
        let is_error = !matches!(outcome, ToolOutcome::Completed { is_error: false, .. });
        info!(run_public_id = %key.run_public_id, task_key = %key.task_key, is_error, "tool finished");
        self.record_result(&key, outcome).await;
        self.pump_claims();
    }

    /// Journals the result, then commits it.
    async fn record_result(&mut self, key: &TaskKey, outcome: ToolOutcome) {
        let Some(entry) = self.journal.get_mut(key) else {
            warn!(task_key = %key.task_key, "a tool finished for a task the journal does not hold");
            return;
        };
        entry.state = EntryState::CommitPending { body: outcome.into_commit_body(), fallback: false };
        if !persist(&self.journal).await {
            warn!(task_key = %key.task_key, "committing a result the journal could not keep");
        }
        self.send_commit(key);
    }

    async fn on_commit_refused(&mut self, key: TaskKey, frame: nexus_proto::runner::v1::Refusal) {
        let (run_public_id, task_key) = (&key.run_public_id, &key.task_key);
        let http_status = frame.http_status;
        let refusal = refusal_of(frame);
        if retry::is_retryable_refusal(refusal.code) {
            warn!(%run_public_id, %task_key, code = %refusal.code, "nexus could not take the result now; it stays journaled");
            return;
        }
        // A malformed result leaves the park standing: replace it once with a short error the
        // model can read, rather than letting the task run into its deadline.
        let malformed = http_status == 422 && refusal.code != ErrorCode::ResultUnstorable;
        if malformed
            && let Some(entry) = self.journal.get_mut(&key)
            && matches!(entry.state, EntryState::CommitPending { fallback: false, .. })
        {
            warn!(%run_public_id, %task_key, code = %refusal.code, "nexus refused the result; committing a short error instead");
            let message = format!("the tool ran, but nexus refused its result ({}: {})", refusal.code, refusal.message);
            entry.state =
                EntryState::CommitPending { body: ToolOutcome::error(message).into_commit_body(), fallback: true };
            persist(&self.journal).await;
            self.send_commit(&key);
            return;
        }
        warn!(%run_public_id, %task_key, code = %refusal.code, "nexus refused the commit for good; dropping the result");
        self.journal.remove(&key);
        persist(&self.journal).await;
    }

    fn on_control(&mut self, request: ControlRequest) {
        match request {
            ControlRequest::Progress { key, claim_token, frame_json } => {
                // Fire and forget: progress is throttled and never stored, so an answer (if
                // any) is not waited for and cannot wedge the stream.
                if self.running.contains_key(&key) {
                    self.send_numbered(Request::Progress(Progress {
                        run_public_id: key.run_public_id,
                        task_key: key.task_key,
                        claim_token,
                        frame_json,
                    }));
                }
            }
            ControlRequest::Extend { key, claim_token, timeout_ms, reply } => {
                let frame = Request::Extend(Extend {
                    run_public_id: key.run_public_id.clone(),
                    task_key: key.task_key.clone(),
                    claim_token,
                    timeout_ms,
                });
                self.send_request(frame, Pending::Extend { key, reply });
            }
            ControlRequest::ClaimStatus { key, claim_token, reply } => {
                let frame = Request::ClaimStatus(ClaimStatus {
                    run_public_id: key.run_public_id,
                    task_key: key.task_key,
                    claim_token,
                });
                self.send_request(frame, Pending::ClaimStatus(reply));
            }
        }
    }

    /// The periodic pass: drop a wedged stream, forget interrupted tasks whose deadline passed,
    /// re-send results, and read the claim status of running tools.
    async fn maintain(&mut self) {
        let wedged = self.link.as_ref().is_some_and(|link| {
            link.pending.values().any(|(_, sent_at)| sent_at.elapsed() >= self.config.request_timeout)
        });
        if wedged {
            self.lose_link("nexus did not answer a request in time");
        }
        let now_ms = unix_now_ms();
        let running = &self.running;
        let forgotten = self.journal.remove_where(|entry| {
            matches!(entry.state, EntryState::Running)
                && entry.deadline_at_ms <= now_ms
                && !running.contains_key(&entry.key)
        });
        for entry in &forgotten {
            info!(
                run_public_id = %entry.key.run_public_id, task_key = %entry.key.task_key,
                "forgetting an interrupted task whose deadline passed"
            );
        }
        if !forgotten.is_empty() {
            persist(&self.journal).await;
        }
        if self.link.is_none() {
            return;
        }
        self.resend_commits().await;
        let probes: Vec<(TaskKey, String)> = self
            .running
            .keys()
            .filter(|key| !self.probing.contains(*key))
            .filter_map(|key| self.journal.get(key).map(|entry| (key.clone(), entry.claim_token.clone())))
            .collect();
        for (key, claim_token) in probes {
            let frame = Request::ClaimStatus(ClaimStatus {
                run_public_id: key.run_public_id.clone(),
                task_key: key.task_key.clone(),
                claim_token,
            });
            self.send_request(frame, Pending::Probe(key));
        }
    }
}

/// Writes the journal; a failure is logged, and the caller decides what it means. (A free
/// function: holding `&Agent` across the write would make the loop's future `!Send`.)
async fn persist(journal: &Journal) -> bool {
    match journal.persist().await {
        Ok(()) => true,
        Err(err) => {
            error!(error = %err, "could not write the journal");
            false
        }
    }
}

/// A refusal frame as a typed refusal: a word this build does not know takes the code its HTTP
/// status stands for.
fn refusal_of(refusal: nexus_proto::runner::v1::Refusal) -> Refusal {
    let http_status = u16::try_from(refusal.http_status).unwrap_or(500);
    Refusal::from_wire(&refusal.code, &refusal.message, http_status)
}

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
mod tests {
    use std::path::{Path, PathBuf};

    use nexus_proto::runner::v1::{Committed, Ping, Refusal as RefusalFrame, runner_frame};
    use serde_json::json;
    use sha2::{Digest, Sha256};
    use uuid::Uuid;

    use super::*;
    use crate::config::Credential;

    const RUNNER: Uuid = Uuid::from_u128(42);

    struct Setup {
        _dir: tempfile::TempDir,
        config: AgentConfig,
    }

    impl Setup {
        fn new() -> Setup {
            let dir = tempfile::tempdir().unwrap();
            let workdir = dir.path().join("work");
            std::fs::create_dir(&workdir).unwrap();
            // Port 9 (discard) on loopback: nothing in these tests ever connects.
            let mut config = AgentConfig::new("http://127.0.0.1:9", RUNNER, Credential::new("token"), workdir);
            config.state_dir = dir.path().join("state");
            Setup { _dir: dir, config }
        }

        fn workdir(&self) -> &Path {
            &self.config.workdir
        }

        /// The journal as a restarted agent would read it.
        fn on_disk(&self) -> Journal {
            Journal::open(&self.config.state_dir, RUNNER).unwrap()
        }

        async fn seed(&self, entries: Vec<JournalEntry>) {
            let mut journal = self.on_disk();
            entries.into_iter().for_each(|entry| journal.insert(entry));
            journal.persist().await.unwrap();
        }

        fn agent(&self) -> (Agent, mpsc::Receiver<RunnerFrame>) {
            let mut agent = Agent::new(self.config.clone()).unwrap();
            let (outbound, frames) = mpsc::channel(64);
            agent.attach(outbound, Duration::from_secs(45));
            (agent, frames)
        }
    }

    fn key(task: &str) -> TaskKey {
        TaskKey { run_public_id: "run-1".into(), task_key: task.into() }
    }

    fn entry(task: &str, deadline_at_ms: i64, state: EntryState) -> JournalEntry {
        JournalEntry {
            key: key(task),
            tool_name: "bash".into(),
            claim_token: format!("tok-{task}"),
            deadline_at_ms,
            state,
        }
    }

    fn push(frame: Answer) -> NexusFrame {
        NexusFrame { request_id: 0, frame: Some(frame) }
    }

    fn work(task: &str) -> NexusFrame {
        push(Answer::WorkAvailable(WorkAvailable {
            kind: InboxKind::ToolCall.as_str().into(),
            run_public_id: "run-1".into(),
            task_key: task.into(),
            tool_name: "bash".into(),
        }))
    }

    fn answer(request_id: u64, frame: Answer) -> NexusFrame {
        NexusFrame { request_id, frame: Some(frame) }
    }

    fn refusal(code: &str, http_status: u32) -> Answer {
        Answer::Refusal(RefusalFrame { code: code.into(), message: "refused".into(), http_status })
    }

    fn grant(tool_name: &str, tool_input: Value, claim_token: &str) -> Answer {
        Answer::ClaimGranted(ClaimGranted {
            task_json: json!({"tool_name": tool_name, "tool_input": tool_input, "timeout_ms": 60_000}).to_string(),
            claim_token: claim_token.into(),
            deadline_at_ms: unix_now_ms() + 60_000,
        })
    }

    fn sent(frames: &mut mpsc::Receiver<RunnerFrame>) -> Vec<(u64, runner_frame::Frame)> {
        std::iter::from_fn(|| frames.try_recv().ok()).map(|frame| (frame.request_id, frame.frame.unwrap())).collect()
    }

    fn claimed_tasks(frames: &[(u64, runner_frame::Frame)]) -> Vec<String> {
        frames
            .iter()
            .filter_map(|(_, frame)| match frame {
                Request::Claim(claim) => Some(claim.task_key.clone()),
                _ => None,
            })
            .collect()
    }

    fn commit_of(frames: &[(u64, runner_frame::Frame)]) -> (u64, Commit, Value) {
        let (request_id, commit) = frames
            .iter()
            .find_map(|(id, frame)| match frame {
                Request::Commit(commit) => Some((*id, commit.clone())),
                _ => None,
            })
            .expect("a commit frame");
        let body = serde_json::from_str(&commit.body_json).unwrap();
        (request_id, commit, body)
    }

    async fn finish_next(agent: &mut Agent) {
        let joined = tokio::time::timeout(Duration::from_secs(10), agent.tasks.join_next()).await;
        let finished = joined.expect("a tool finished in time").expect("a tool was running").unwrap();
        agent.on_tool_finished(finished).await;
    }

    #[tokio::test]
    async fn a_task_claimed_before_a_restart_is_never_claimed_or_run_again() {
        let setup = Setup::new();
        setup.seed(vec![entry("t1", unix_now_ms() + 60_000, EntryState::Running)]).await;
        let (mut agent, mut frames) = setup.agent();

        agent.on_frame(work("t1")).await;
        agent.on_frame(work("t2")).await;
        agent.on_frame(work("t2")).await; // a duplicate hint
        let mut ask = work("t3");
        if let Some(Answer::WorkAvailable(w)) = ask.frame.as_mut() {
            w.kind = "ask".into();
        }
        agent.on_frame(ask).await;

        let frames = sent(&mut frames);
        assert_eq!(claimed_tasks(&frames), ["t2"]);
        assert_eq!(frames[0].0, HELLO_REQUEST_ID + 1);
        assert!(agent.running.is_empty());
        assert_eq!(setup.on_disk().get(&key("t1")).unwrap().state, EntryState::Running);
    }

    #[tokio::test]
    async fn a_claim_is_journaled_before_it_runs_and_its_result_before_it_is_committed() {
        let setup = Setup::new();
        let (mut agent, mut frames) = setup.agent();
        agent.on_frame(work("t1")).await;
        let claim_id = sent(&mut frames)[0].0;

        let input = json!({"path": "out.txt", "content": "hello"});
        agent.on_frame(answer(claim_id, grant("write_file", input, "tok-1"))).await;
        let journaled = setup.on_disk().get(&key("t1")).cloned().unwrap();
        assert_eq!(journaled.claim_token, "tok-1");
        assert_eq!(journaled.tool_name, "write_file");

        finish_next(&mut agent).await;
        let frames = sent(&mut frames);
        let (commit_id, commit, body) = commit_of(&frames);
        assert_eq!(commit.claim_token, "tok-1");
        assert_eq!((commit.run_public_id.as_str(), commit.task_key.as_str()), ("run-1", "t1"));
        assert_eq!(body["is_error"], false);
        assert_eq!(body["structured_content"]["sha256"], hex::encode(Sha256::digest(b"hello")));
        assert_eq!(std::fs::read_to_string(setup.workdir().join("out.txt")).unwrap(), "hello");
        // The result was on disk by the time the commit was sent.
        assert_eq!(setup.on_disk().get(&key("t1")).unwrap().state, EntryState::CommitPending { body, fallback: false });

        let committed = Answer::Committed(Committed { idle: false, status: "completed".into() });
        agent.on_frame(answer(commit_id, committed)).await;
        assert_eq!(setup.on_disk().entries().count(), 0);
        assert!(agent.committing.is_empty());
    }

    #[tokio::test]
    async fn results_are_resent_after_reconnect_and_expired_ones_are_dropped() {
        let setup = Setup::new();
        let body = json!({"content": "done", "structured_content": null, "is_error": false});
        let pending = || EntryState::CommitPending { body: body.clone(), fallback: false };
        let now = unix_now_ms();
        setup
            .seed(vec![
                entry("live", now + 60_000, pending()),
                entry("late", now - 1, pending()),
                entry("orphan", now - 1, EntryState::Running),
            ])
            .await;
        let (mut agent, mut frames) = setup.agent();
        agent.after_connect().await;

        let frames_sent = sent(&mut frames);
        let Request::Announce(announce) = &frames_sent[0].1 else { panic!("announce first") };
        let announced: Value = serde_json::from_str(&announce.body_json).unwrap();
        assert_eq!(announced["tools"].as_array().unwrap().len(), 4);
        assert_eq!(frames_sent.len(), 2);
        let (commit_id, commit, resent) = commit_of(&frames_sent);
        assert_eq!((commit.task_key.as_str(), commit.claim_token.as_str()), ("live", "tok-live"));
        assert_eq!(resent, body);
        let remaining: Vec<String> = setup.on_disk().entries().map(|e| e.key.task_key.clone()).collect();
        assert_eq!(remaining, ["live", "orphan"]);

        // The maintenance pass forgets the interrupted task whose deadline passed, and does not
        // send the in-flight commit twice.
        agent.maintain().await;
        assert!(sent(&mut frames).is_empty());
        let remaining: Vec<String> = setup.on_disk().entries().map(|e| e.key.task_key.clone()).collect();
        assert_eq!(remaining, ["live"]);

        // A final refusal drops the result.
        agent.on_frame(answer(commit_id, refusal("stale_claim", 409))).await;
        assert_eq!(setup.on_disk().entries().count(), 0);
    }

    #[tokio::test]
    async fn a_malformed_result_is_replaced_once_by_a_short_error() {
        let setup = Setup::new();
        let body = json!({"content": "x", "structured_content": null, "is_error": false});
        setup
            .seed(vec![entry("t1", unix_now_ms() + 60_000, EntryState::CommitPending { body, fallback: false })])
            .await;
        let (mut agent, mut frames) = setup.agent();
        agent.resend_commits().await;
        let (first_id, _, _) = commit_of(&sent(&mut frames));

        agent.on_frame(answer(first_id, refusal("invalid_content", 422))).await;
        let (second_id, commit, fallback) = commit_of(&sent(&mut frames));
        assert_eq!(commit.claim_token, "tok-t1");
        assert_eq!(fallback["is_error"], true);
        assert!(fallback["content"].as_str().unwrap().contains("invalid_content"));
        assert!(matches!(
            setup.on_disk().get(&key("t1")).unwrap().state,
            EntryState::CommitPending { fallback: true, .. }
        ));

        // A retryable refusal keeps it; a second malformed refusal drops it.
        agent.on_frame(answer(second_id, refusal("unavailable", 503))).await;
        assert!(setup.on_disk().get(&key("t1")).is_some());
        agent.resend_commits().await;
        let (third_id, _, _) = commit_of(&sent(&mut frames));
        agent.on_frame(answer(third_id, refusal("invalid_content", 422))).await;
        assert!(setup.on_disk().get(&key("t1")).is_none());
    }

    #[tokio::test]
    async fn claims_wait_for_a_free_slot() {
        let mut setup = Setup::new();
        setup.config.slots = 1;
        let (mut agent, mut frames) = setup.agent();
        agent.on_frame(work("t1")).await;
        agent.on_frame(work("t2")).await;
        let first = sent(&mut frames);
        assert_eq!(claimed_tasks(&first), ["t1"]);

        agent.on_frame(answer(first[0].0, refusal("already_claimed", 409))).await;
        let second = sent(&mut frames);
        assert_eq!(claimed_tasks(&second), ["t2"]);

        // While t2 runs, a new hint waits.
        let input = json!({"command": "sleep 30"});
        agent.on_frame(answer(second[0].0, grant("bash", input, "tok-2"))).await;
        agent.on_frame(work("t3")).await;
        assert!(claimed_tasks(&sent(&mut frames)).is_empty());
        agent.on_work_canceled(WorkCanceled { run_public_id: "run-1".into(), task_key: "t2".into() });
        finish_next(&mut agent).await;
        let after = sent(&mut frames);
        assert_eq!(claimed_tasks(&after), ["t3"]);
        let (_, _, body) = commit_of(&after);
        assert_eq!(body["content"], "the command was killed because its task was canceled");
        assert_eq!(body["is_error"], true);
    }

    #[tokio::test]
    async fn pings_get_pongs_and_a_lost_stream_fails_waiting_requests() {
        let setup = Setup::new();
        let (mut agent, mut frames) = setup.agent();
        agent.on_frame(push(Answer::Ping(Ping { nonce: 7 }))).await;
        let frames_sent = sent(&mut frames);
        assert!(matches!(frames_sent.as_slice(), [(0, Request::Pong(Pong { nonce: 7 }))]));

        let handle = ClaimHandle::new(key("t1"), "tok".into(), agent.control_tx.clone());
        let asking = tokio::spawn(async move { handle.is_active().await });
        let request = agent.control_rx.recv().await.unwrap();
        agent.on_control(request);
        let status_id = sent(&mut frames)[0].0;
        assert!(agent.link.as_ref().unwrap().pending.contains_key(&status_id));

        agent.lose_link("test");
        assert_eq!(asking.await.unwrap(), Err(RequestError::Disconnected));
        assert!(agent.link.is_none());
        assert!(agent.connecting.is_some(), "a reconnect is scheduled");
    }

    #[tokio::test]
    async fn run_stops_promptly_when_shutdown_resolves() {
        let setup = Setup::new();
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(Duration::from_secs(10), crate::run(setup.config.clone(), async {})).await;
        assert!(matches!(outcome, Ok(Ok(()))), "{outcome:?}");
        assert!(started.elapsed() < Duration::from_secs(5));

        let mut bad = setup.config.clone();
        bad.workdir = PathBuf::from("/nonexistent/nexus-workdir");
        assert!(matches!(crate::run(bad, async {}).await, Err(AgentError::Config(_))));
    }

    #[test]
    fn the_run_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let setup = Setup::new();
        let future = crate::run(setup.config.clone(), async {});
        assert_send(&future);
    }
}
