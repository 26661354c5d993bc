//! The ExecutorActor: one per runner identity, the owner of the inbox rows addressed to it.
//!
//! It holds the open tasks, their claim tokens (as digests) and deadlines (the "park clock"), the
//! credential-epoch fence, and the one live stream (a [`ConnectionActor`]). It carries the origin's
//! executor doors (`docs/protocol.md`, "Announce" through "Progress"): announce, claim, claim
//! status, extend, commit and progress. Every state change is durable before it is answered.
//! Settlements are reported to the execution as messages.
//!
//! Offers (`work_available`) go out through an [offer window](OFFER_WINDOW): at most that many are
//! outstanding on a stream, and the rest of the claimable inbox waits here in `(started_at,
//! task_key)` order until earlier offers are claimed or settle. A new stream starts a fresh window
//! over the whole inbox, so the push stays level-triggered (`docs/protocol.md`, "Offers") while a
//! runner with thousands of open tasks never overflows its stream's outbound buffer.
//!
//! In debug builds the actor asserts the fabric's invariants as it can see them locally (a task
//! settles at most once, a claim is never granted on a claimed row, open tasks are unsettled and
//! timed, the window keeps its bound, a settled task's token never takes effect); the chaos
//! suite checks the same facts from the outside (`nexus_tests::invariants`).
//!
//! [`ConnectionActor`]: crate::actors::connection::ConnectionActor

pub mod commit;
mod deadlines;
mod eligibility;
mod offers;
mod requests;

use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use nexus_kernel_tools::EffectProfile;
use nexus_proto::runner::v1::{
    Announced, ClaimGranted, ClaimState, Committed, Extended, NexusBatch, NexusFrame, ProgressAccepted,
    Refusal as RefusalFrame, Welcome, WorkAvailable, WorkCanceled, nexus_frame::Frame,
};
use nexus_proto::{
    ErrorCode, ExecutionId, ExecutorStatus, InboxKind, Presence, RUNNER_PROTOCOL_VERSION, Refusal, RunnerId, TaskKey,
    TaskStatus,
};

use crate::actors::connection::ConnectionHandle;
use crate::actors::execution::control::DeadlineShift;
use crate::actors::fabric::Fabric;
use crate::actors::handle::ActorError;
use crate::actors::progress::{ProgressThrottle, TaskProgress};
use crate::actors::root::RootHandle;
use crate::auth::digest;
use crate::clock::{deadline_after, is_frozen};
use crate::store::{ExecutorRow, PresenceEvent, TaskRow};

use self::commit::CommitRefusal;
use self::deadlines::Deadlines;
use self::offers::{OfferWindow, Sent};

/// The most an extension may grant, in milliseconds (one hour).
pub const EXTENSION_CAP_MS: i64 = 3_600_000;
/// The largest progress frame, in bytes.
pub const PROGRESS_FRAME_BOUND: usize = 65_536;

/// The most `work_available` offers outstanding on one runner stream: offered and not yet claimed,
/// settled (committed, canceled, expired). Further claimable tasks wait in the executor, oldest
/// `(started_at, task_key)` first, and are offered as earlier offers leave the window.
///
/// Kept well below the stream's outbound buffer ([`OUTBOUND_BUFFER`](crate::actors::connection::OUTBOUND_BUFFER)
/// frames) so that offers can never fill it: answers, Welcome and `work_canceled` always find room,
/// and only a runner that stops reading its answers loses its stream. A runner-agent queues the
/// hints it cannot claim yet, so the window bounds the frames in flight, not the runner's
/// parallelism.
pub const OFFER_WINDOW: usize = 256;

// Offers may take at most half the outbound buffer; the rest is for control frames.
const _: () = assert!(OFFER_WINDOW >= 1 && OFFER_WINDOW * 2 <= crate::actors::connection::OUTBOUND_BUFFER);

/// Frames to one runner stream. A control frame (an answer, Welcome, `work_canceled`) that cannot
/// be queued drops the stream: the runner reconnects and the level-triggered inbox is offered
/// again. An offer that cannot be queued waits in the [offer window](OFFER_WINDOW) instead.
pub type Outbound = mpsc::Sender<Result<NexusFrame, tonic::Status>>;

/// A request read from the stream, after Hello.
#[derive(Debug)]
pub enum RunnerRequest {
    /// Whole-replacement announcement (JSON body).
    Announce(String),
    /// Claim one task.
    Claim {
        /// The task: its execution (`run_public_id`) and key.
        task: TaskId,
    },
    /// Read whether a claim is active; never renews.
    ClaimStatus {
        /// The task: its execution (`run_public_id`) and key.
        task: TaskId,
        /// The claim token.
        claim_token: String,
    },
    /// Move the deadline.
    Extend {
        /// The task: its execution (`run_public_id`) and key.
        task: TaskId,
        /// The claim token.
        claim_token: String,
        /// New park from now, in milliseconds.
        timeout_ms: i64,
    },
    /// Write-once result.
    Commit {
        /// The task: its execution (`run_public_id`) and key.
        task: TaskId,
        /// The claim token.
        claim_token: String,
        /// `{content?, structured_content?, is_error?, outcome?, ...}`.
        body_json: String,
    },
    /// Ephemeral progress.
    Progress {
        /// The task: its execution (`run_public_id`) and key.
        task: TaskId,
        /// The claim token.
        claim_token: String,
        /// The frame, a JSON object.
        frame_json: String,
    },
}

/// Requests read from a stream, in order, each with the request id its answer repeats; a frame
/// the reader refused keeps its place as its refusal.
pub type Requests = Vec<(u64, Result<RunnerRequest, Refusal>)>;

/// The ExecutorActor's messages.
pub enum ExecutorMsg {
    /// A stream passed Hello: fence any older stream, welcome this one, offer the inbox again.
    Attach {
        /// The stream.
        attach: Attach,
        /// `Ok` once Welcome is queued; `unauthorized` when fenced by the epoch or revoked.
        reply: RpcReplyPort<Result<(), Refusal>>,
    },
    /// A stream ended.
    Detach {
        /// The connection's id.
        conn_id: u64,
    },
    /// Requests from the stream `conn_id`: every frame its reader had read, in order. Their
    /// writes share one store write and their answers are queued together (`docs/protocol.md`,
    /// "Batches").
    Requests {
        /// The connection's id; requests from a fenced stream are dropped.
        conn_id: u64,
        /// The requests.
        requests: Requests,
        /// Some came in a `RunnerBatch`: the answers go back in one `NexusBatch`.
        batched: bool,
    },
    /// Tasks addressed here were written to the store: hold them and push `work_available`. The
    /// rows are exactly as their writer just made them durable, which spares a store read on the
    /// dispatch path.
    Offer(Vec<TaskRow>),
    /// Cancel a task: it settles `canceled` and the claimant gets `work_canceled`.
    Cancel {
        /// The task: its execution (`run_public_id`) and key.
        task: TaskId,
    },
    /// The stored row changed behind the actor (re-paired or revoked by `nexus admin`): reread it.
    Refresh,
    /// The inbox's one deadline alarm rang for `at` (Unix milliseconds): every task due by
    /// then expires.
    Alarm {
        /// The deadline the alarm was set for.
        at: i64,
    },
    /// The progress alarm rang for `at` (Unix milliseconds): every held progress frame due by
    /// then goes out ([`crate::actors::progress`]).
    ProgressDue {
        /// The time the alarm was set for.
        at: i64,
    },
    /// The execution paused or resumed: its open tasks here take their new deadlines from
    /// `shift` (durably) and the inbox alarm follows (`docs/executions.md`, "Control":
    /// the clocks freeze, and resume shifts them forward).
    ShiftDeadlines {
        /// The execution.
        run: ExecutionId,
        /// How each open task's deadline moves.
        shift: DeadlineShift,
        /// Answered once the new deadlines are durable.
        done: RpcReplyPort<()>,
    },
}

/// Arguments: which runner.
pub struct ExecutorArgs {
    /// Shared context.
    pub fabric: Arc<Fabric>,
    /// Root, to find executions.
    pub root: RootHandle,
    /// The runner.
    pub public_id: RunnerId,
}

/// The typed handle on a runner's inbox (its ExecutorActor), found by id: a message reaches the
/// live actor at once, or waits in Root while the actor loads ([`RootHandle`]). No method waits
/// on the actor except [`ExecutorHandle::attach`], which waits at most the call deadline.
#[derive(Clone, Debug)]
pub struct ExecutorHandle {
    runner: RunnerId,
    root: RootHandle,
}

impl ExecutorHandle {
    pub(crate) fn new(runner: RunnerId, root: RootHandle) -> Self {
        ExecutorHandle { runner, root }
    }

    /// The runner.
    pub fn runner(&self) -> RunnerId {
        self.runner
    }

    fn send(&self, message: ExecutorMsg) -> Result<(), ActorError> {
        self.root.to_executor(self.runner, message)
    }

    /// Hands over tasks just written `dispatched` to this runner, to hold and offer.
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown; the rows are durable and are offered when the
    /// inbox next loads.
    pub fn offer(&self, tasks: Vec<TaskRow>) -> Result<(), ActorError> {
        self.send(ExecutorMsg::Offer(tasks))
    }

    /// Cancels an open task: it settles `canceled`, and a claimant hears `work_canceled`.
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown.
    pub fn cancel(&self, task: TaskId) -> Result<(), ActorError> {
        self.send(ExecutorMsg::Cancel { task })
    }

    /// Moves the deadlines of `run`'s open tasks here by `shift` (a pause or a resume), and
    /// answers once the new deadlines are durable, so a pause's answer already shows them frozen.
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown; [`ActorError::Timeout`] after the call deadline.
    pub async fn shift_deadlines(&self, run: ExecutionId, shift: DeadlineShift) -> Result<(), ActorError> {
        let (done, moved) = tokio::sync::oneshot::channel();
        self.send(ExecutorMsg::ShiftDeadlines { run, shift, done: done.into() })?;
        let deadline = self.root.deadline();
        match tokio::time::timeout(deadline, moved).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(ActorError::Stopped { actor: "runner inbox" }),
            Err(_) => Err(ActorError::Timeout {
                actor: "runner inbox",
                after_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
            }),
        }
    }

    /// Rereads the runner's row (re-paired or revoked behind the actor's back).
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown.
    pub fn refresh(&self) -> Result<(), ActorError> {
        self.send(ExecutorMsg::Refresh)
    }

    /// Tells the inbox that the stream `conn_id` ended.
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown.
    pub fn detach(&self, conn_id: u64) -> Result<(), ActorError> {
        self.send(ExecutorMsg::Detach { conn_id })
    }

    /// Hands the inbox the requests read from the stream `conn_id`; each answer goes back on
    /// the stream with its request id, all in one `NexusBatch` when `batched` (or when the
    /// stream's Hello asked for batches).
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown.
    pub fn requests(&self, conn_id: u64, requests: Requests, batched: bool) -> Result<(), ActorError> {
        self.send(ExecutorMsg::Requests { conn_id, requests, batched })
    }

    /// Attaches a stream that passed Hello: fences an older one, queues Welcome, offers the inbox
    /// again. Waits (loading the inbox first when it is cold) at most the call deadline.
    ///
    /// # Errors
    /// `unauthorized` when the credential's epoch was fenced or the runner is revoked;
    /// `unavailable` when the inbox cannot be reached in time.
    pub async fn attach(&self, attach: Attach) -> Result<(), Refusal> {
        self.root.load_executor(self.runner).await?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.send(ExecutorMsg::Attach { attach, reply: reply.into() })?;
        match tokio::time::timeout(self.root.deadline(), answer).await {
            Ok(Ok(attached)) => attached,
            Ok(Err(_)) => Err(ActorError::Stopped { actor: "runner inbox" }.into()),
            Err(_) => Err(ActorError::Timeout {
                actor: "runner inbox",
                after_ms: u64::try_from(self.root.deadline().as_millis()).unwrap_or(u64::MAX),
            }
            .into()),
        }
    }
}

/// A stream that passed Hello, as [`ExecutorHandle::attach`] hands it over.
pub struct Attach {
    /// The connection's id.
    pub conn_id: u64,
    /// The Hello's request id, echoed on Welcome.
    pub hello_request_id: u64,
    /// The connection actor, stopped when fenced.
    pub connection: ConnectionHandle,
    /// Frames to the runner.
    pub outbound: Outbound,
    /// The epoch of the credential that said Hello.
    pub credential_epoch: i64,
    /// The Hello's `batches`: the runner reads `NexusBatch` frames.
    pub batches: bool,
}

struct Connection {
    id: u64,
    actor: ConnectionHandle,
    outbound: Outbound,
    /// Pushes and answers may go out in `NexusBatch` frames.
    batches: bool,
}

/// A task by its execution and key.
pub type TaskId = (ExecutionId, TaskKey);

/// The ExecutorActor's state.
pub struct ExecutorState {
    fabric: Arc<Fabric>,
    root: RootHandle,
    row: ExecutorRow,
    /// When `row` was last read from the store (Unix milliseconds).
    row_read_at: i64,
    connection: Option<Connection>,
    open: HashMap<TaskId, TaskRow>,
    /// Every open task's deadline, and the one alarm for the earliest.
    deadlines: Deadlines,
    /// The per-task throttle of progress frames on their executions' feeds.
    progress: ProgressThrottle,
    /// The current stream's offers: only open, claimable tasks; empty while no stream is attached.
    window: OfferWindow,
}

/// The ExecutorActor.
pub struct ExecutorActor;

#[cfg(debug_assertions)]
impl ExecutorState {
    /// Asserts, after every message, the invariants that stay cheap to check however large the
    /// inbox is; the ones about a single task are asserted where it changes (`hold`, `claim`,
    /// `settle`, `fill_window`).
    fn check_invariants(&self) {
        let window = &self.window;
        window.check();
        assert!(
            window.outstanding() + window.waiting() <= self.open.len(),
            "the offer window holds tasks that are not open ({} offered, {} waiting, {} open)",
            window.outstanding(),
            window.waiting(),
            self.open.len()
        );
        assert!(
            self.connection.is_some() || window.outstanding() + window.waiting() == 0,
            "an offer window outlived its stream"
        );
        assert_eq!(self.deadlines.len(), self.open.len(), "every open task has exactly one deadline");
        assert!(self.progress.len() <= self.open.len(), "progress throttles outlive their tasks");
    }
}

fn internal(e: impl std::fmt::Display) -> Refusal {
    Refusal::new(ErrorCode::Internal, format!("the inbox store failed: {e}"))
}

/// The refusal frame answering `request_id` (`docs/protocol.md`, "Refusals").
pub(crate) fn refusal_frame(request_id: u64, refusal: &Refusal) -> NexusFrame {
    NexusFrame {
        request_id,
        frame: Some(Frame::Refusal(RefusalFrame {
            code: refusal.code.as_str().to_owned(),
            message: refusal.message.clone(),
            http_status: u32::from(refusal.code.http_status()),
        })),
    }
}

/// The inbox row as the runner sees it on claim (`docs/protocol.md`, "Inbox rows").
pub fn task_json(task: &TaskRow) -> Value {
    json!({
        "kind": task.kind.inbox_kind(),
        "run_public_id": task.run_public_id,
        "task_key": task.task_key,
        "tool_name": task.tool_name,
        "tool_input": task.tool_input,
        "tool_call_id": task.tool_call_id,
        "started_at": task.started_at,
        "deadline_at": task.deadline_at,
        "timeout_ms": task.timeout_ms,
        "claimed": task.claimed,
        "addressed_to": {"role": "runner", "executor_public_id": task.target_executor_public_id},
        "effect_profile": task.effect_profile,
        "tool_alias": if task.callable_name == task.tool_name { Value::Null } else { json!(task.callable_name) },
    })
}

/// The expiry rule (`docs/protocol.md`, "Expiry"): never claimed, or claimed and replayable, is
/// `timed_out` (`tool_timeout`); claimed and not replayable is `uncertain` (`tool_uncertain`).
pub fn expiry_outcome(task: &TaskRow) -> (TaskStatus, &'static str) {
    if !task.claimed || EffectProfile::json_replayable(task.effect_profile.as_ref()) {
        (TaskStatus::TimedOut, "tool_timeout")
    } else {
        (TaskStatus::Uncertain, "tool_uncertain")
    }
}

impl Actor for ExecutorActor {
    type Msg = ExecutorMsg;
    type State = ExecutorState;
    type Arguments = ExecutorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ExecutorMsg>,
        args: ExecutorArgs,
    ) -> Result<ExecutorState, ActorProcessingErr> {
        let row = args
            .fabric
            .store
            .executor(args.public_id)
            .await?
            .ok_or_else(|| format!("no executor {}", args.public_id))?;
        let now = args.fabric.clock.now_ms();
        let progress_interval_ms = args.fabric.config.runner.progress_interval_ms;
        let mut state = ExecutorState {
            fabric: args.fabric,
            root: args.root,
            row,
            row_read_at: now,
            connection: None,
            open: HashMap::new(),
            deadlines: Deadlines::default(),
            progress: ProgressThrottle::new(progress_interval_ms),
            window: OfferWindow::new(OFFER_WINDOW),
        };
        // The park clock resumes: every open task gets its timer back.
        for task in state.fabric.store.open_tasks_for(args.public_id).await? {
            let id = (task.run_public_id, task.task_key);
            hold(&mut state, id, task);
        }
        rearm(&myself, &mut state);
        #[cfg(debug_assertions)]
        state.check_invariants();
        tracing::debug!(runner_id = %args.public_id, open = state.open.len(), "executor loaded");
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ExecutorMsg>,
        state: &mut ExecutorState,
    ) -> Result<(), ActorProcessingErr> {
        state.deadlines.disarm();
        state.progress.disarm();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ExecutorMsg>,
        msg: ExecutorMsg,
        state: &mut ExecutorState,
    ) -> Result<(), ActorProcessingErr> {
        let handled = handle_msg(msg, state).await;
        // Whatever left the window (a claim, a settlement) or joined the inbox makes room for the
        // next offers; they queue after this message's answer.
        fill_window(state);
        rearm(&myself, state);
        rearm_progress(&myself, state);
        #[cfg(debug_assertions)]
        state.check_invariants();
        handled
    }
}

async fn handle_msg(msg: ExecutorMsg, state: &mut ExecutorState) -> Result<(), ActorProcessingErr> {
    match msg {
        ExecutorMsg::Attach { attach: stream, reply } => {
            let result = attach(state, stream).await;
            let _ = reply.send(result);
        }
        ExecutorMsg::Detach { conn_id } => {
            if state.connection.as_ref().is_some_and(|c| c.id == conn_id) {
                state.connection = None;
                state.window.clear();
                tracing::info!(runner_id = %state.row.public_id, "runner stream closed");
                if let Err(e) = state.fabric.store.touch_executor(state.row.public_id, PresenceEvent::Detached).await {
                    tracing::warn!(error = %e, "could not record last_seen_at");
                }
                (state.row.connected_at, state.row.last_seen_at) = (None, Some(state.fabric.clock.now_ms()));
            }
        }
        ExecutorMsg::Requests { conn_id, requests, batched } => {
            if state.connection.as_ref().is_none_or(|c| c.id != conn_id) {
                tracing::debug!(runner_id = %state.row.public_id, "dropping requests from a fenced stream");
                return Ok(());
            }
            let answers = requests::answer(state, requests).await;
            push_all(state, answers, batched);
        }
        ExecutorMsg::Refresh => {
            state.row_read_at = i64::MIN;
            refresh_row(state).await?;
        }
        ExecutorMsg::Offer(tasks) => {
            // Eligibility is checked at dispatch: a revoked runner gets no new work, and the
            // call fails at once rather than waiting out its park. A revocation by `nexus admin`
            // (another process) reaches a live stream within a ping interval (`Refresh`); the row
            // is reread here at most once per interval for a runner without one, so a busy inbox
            // reads nothing per offer (issue 10, item 1). A claim's conditional write is the
            // last word either way.
            refresh_row(state).await?;
            // An assigned runner serves only its Agents' runs (`eligibility`).
            let served = eligibility::served(state, tasks.iter().map(|t| t.run_public_id)).await?;
            for task in tasks {
                let id = (task.run_public_id, task.task_key);
                if !state.open.contains_key(&id) {
                    if task.is_settled() {
                        continue;
                    }
                    hold(state, id, task);
                }
                if state.row.status != ExecutorStatus::Active {
                    settle(state, &id, TaskStatus::Failed, None, Some("executor_revoked")).await?;
                    continue;
                }
                if !served.covers(id.0) {
                    settle(state, &id, TaskStatus::Failed, None, Some(eligibility::NOT_ELIGIBLE)).await?;
                    continue;
                }
                // Offered when the window has room; a repeated offer of a task already offered
                // on this stream is not sent twice.
                enqueue_offer(state, &id);
            }
        }
        ExecutorMsg::Cancel { task: id } => {
            if let Some(task) = state.open.get(&id) {
                let claimed = task.claimed;
                settle(state, &id, TaskStatus::Canceled, None, Some("task_canceled")).await?;
                if claimed {
                    push(
                        state,
                        NexusFrame {
                            request_id: 0,
                            frame: Some(Frame::WorkCanceled(WorkCanceled {
                                run_public_id: id.0.to_string(),
                                task_key: id.1.to_string(),
                            })),
                        },
                    );
                }
            }
        }
        ExecutorMsg::Alarm { at } => {
            state.deadlines.rang(at);
            // Due by the alarm's time, or by now if the clock ran on past it.
            let due = state.deadlines.due(at.max(state.fabric.clock.now_ms()));
            for (id, deadline_at) in due {
                let Some(task) = state.open.get(&id) else {
                    debug_assert!(false, "a filed deadline belongs to an open task: {id:?}");
                    state.deadlines.remove(&id);
                    continue;
                };
                debug_assert_eq!(task.deadline_at, deadline_at, "the alarm keeps the held deadline: {id:?}");
                let (status, error_key) = expiry_outcome(task);
                tracing::info!(runner_id = %state.row.public_id, run_id = %id.0, task_key = %id.1, %status, "task expired");
                settle(state, &id, status, None, Some(error_key)).await?;
            }
        }
        ExecutorMsg::ProgressDue { at } => {
            state.progress.rang(at);
            for item in state.progress.due(at.max(state.fabric.clock.now_ms())) {
                state.fabric.events.publish_progress(item);
            }
        }
        ExecutorMsg::ShiftDeadlines { run, shift, done } => {
            // Every open deadline of the execution here moves in one store write.
            let moved: Vec<TaskRow> = state
                .open
                .values()
                .filter(|task| task.run_public_id == run)
                .filter_map(|task| {
                    let deadline_at = shift.apply(task.deadline_at)?;
                    Some(TaskRow { deadline_at, ..task.clone() })
                })
                .collect();
            let written = state.fabric.store.update_tasks(moved.clone()).await?;
            for (task, written) in moved.into_iter().zip(written) {
                if !written {
                    tracing::warn!(run_id = %run, task_key = %task.task_key, "a deadline shift lost to another claim");
                    continue;
                }
                let id = (task.run_public_id, task.task_key);
                hold(state, id, task);
            }
            // The caller may have given up waiting; the shift stands either way.
            let _ = done.send(());
        }
    }
    Ok(())
}

/// Rereads the runner's row unless it was read within the last ping interval.
async fn refresh_row(state: &mut ExecutorState) -> Result<(), crate::store::StoreError> {
    let now = state.fabric.clock.now_ms();
    let interval = i64::try_from(state.fabric.config.runner.ping_interval_ms).unwrap_or(i64::MAX);
    if now.saturating_sub(state.row_read_at) < interval {
        return Ok(());
    }
    if let Some(row) = state.fabric.store.executor(state.row.public_id).await? {
        state.row = row;
    }
    state.row_read_at = now;
    Ok(())
}

fn work_available(task: &TaskRow) -> Option<NexusFrame> {
    let kind = task.kind.inbox_kind()?;
    Some(NexusFrame {
        request_id: 0,
        frame: Some(Frame::WorkAvailable(WorkAvailable {
            kind: kind.as_str().to_owned(),
            run_public_id: task.run_public_id.to_string(),
            task_key: task.task_key.to_string(),
            tool_name: task.tool_name.clone(),
        })),
    })
}

/// Queues a control frame (an answer, Welcome, `work_canceled`). One that cannot be queued drops
/// the stream: the runner stopped reading, and reconnects to a fresh window.
fn push(state: &mut ExecutorState, frame: NexusFrame) {
    let Some(connection) = &state.connection else { return };
    if let Err(e) = connection.outbound.try_send(Ok(frame)) {
        tracing::warn!(runner_id = %state.row.public_id, error = %e, "runner stream cannot take frames; dropping it");
        connection.actor.close("outbound full or closed");
        state.connection = None;
        state.window.clear();
    }
}

/// Queues the answers to one message's requests: in one `NexusBatch` when they came in a
/// `RunnerBatch` or the stream asked for batches, else one frame each ([`push`]).
fn push_all(state: &mut ExecutorState, answers: Vec<NexusFrame>, batched: bool) {
    let Some(connection) = &state.connection else { return };
    // A batch is answered in kind, even a batch of one.
    if !answers.is_empty() && (batched || (connection.batches && answers.len() > 1)) {
        push(state, batch_frame(answers));
        return;
    }
    for answer in answers {
        push(state, answer);
    }
}

fn batch_frame(frames: Vec<NexusFrame>) -> NexusFrame {
    NexusFrame { request_id: 0, frame: Some(Frame::Batch(NexusBatch { frames })) }
}

/// Whether the runner may claim the task now, so that it belongs in the offer window.
fn claimable(task: &TaskRow) -> bool {
    !task.claimed && task.status == TaskStatus::Dispatched && task.kind.inbox_kind() == Some(InboxKind::ToolCall)
}

/// Holds an open task: it is addressed here, unsettled, and has its deadline filed with the inbox alarm.
fn hold(state: &mut ExecutorState, id: TaskId, task: TaskRow) {
    debug_assert!(!task.is_settled(), "an open task is never settled: {id:?} is {}", task.status);
    debug_assert_eq!(
        task.target_executor_public_id,
        Some(state.row.public_id),
        "an executor holds only the tasks addressed to it: {id:?}"
    );
    state.deadlines.set(id, task.deadline_at);
    state.open.insert(id, task);
}

/// Starts a fresh offer window for a new stream over the whole claimable inbox.
fn reset_window(state: &mut ExecutorState) {
    if state.connection.is_none() {
        state.window.clear();
        return;
    }
    let inbox = state.open.iter().filter(|(_, task)| claimable(task)).map(|(id, task)| (id, task.started_at));
    state.window.reset(inbox);
}

/// Puts an open, claimable task in line for an offer on the current stream, unless it was
/// offered there already.
fn enqueue_offer(state: &mut ExecutorState, id: &TaskId) {
    if state.connection.is_none() {
        return;
    }
    if let Some(task) = state.open.get(id).filter(|task| claimable(task)) {
        state.window.enqueue(id, task.started_at);
    }
}

/// Offers waiting tasks, oldest first, while the window has room. An offer that the outbound
/// channel cannot take now waits for the next message; offers never drop the stream.
fn fill_window(state: &mut ExecutorState) {
    let Some(connection) = &state.connection else { return };
    let open = &state.open;
    if connection.batches {
        // One `NexusBatch` of every offer the window lets out now, if the stream has room for
        // a frame (offers never drop the stream).
        if connection.outbound.capacity() == 0 {
            return;
        }
        let mut frames = Vec::new();
        state.window.fill(|id| {
            if frames.len() >= crate::actors::connection::BATCH_BOUND {
                return Sent::Blocked;
            }
            match open.get(id).filter(|task| claimable(task)).and_then(work_available) {
                Some(frame) => {
                    frames.push(frame);
                    Sent::Offered
                }
                None => Sent::Gone,
            }
        });
        let frame = match frames.len() {
            0 => return,
            1 => frames.pop().expect("one offer"),
            _ => batch_frame(frames),
        };
        if let Err(e) = connection.outbound.try_send(Ok(frame)) {
            // Room was checked above; only a closed stream (its Detach clears the window) or a
            // race with a ping gets here. The window counts these offers as out, so the stream
            // goes, and the next one is offered the inbox afresh.
            tracing::warn!(runner_id = %state.row.public_id, error = %e, "runner stream cannot take offers; dropping it");
            connection.actor.close("outbound full or closed");
            state.connection = None;
            state.window.clear();
        }
        return;
    }
    state.window.fill(|id| {
        let frame = open.get(id).filter(|task| claimable(task)).and_then(work_available);
        debug_assert!(frame.is_some(), "only open, claimable tasks wait for an offer: {id:?}");
        let Some(frame) = frame else { return Sent::Gone };
        match connection.outbound.try_send(Ok(frame)) {
            Ok(()) => Sent::Offered,
            // Full: only answers can fill the buffer (offers take at most OFFER_WINDOW of it), and
            // the next answer that finds it full drops the stream. Closed: the stream is gone and
            // its Detach clears the window. Either way the task keeps its place.
            Err(_) => Sent::Blocked,
        }
    });
}

/// Arms the inbox's one alarm for its earliest live deadline, unless it is armed for that
/// already. A frozen deadline (a paused execution's) never comes due, so it arms nothing.
fn rearm(myself: &ActorRef<ExecutorMsg>, state: &mut ExecutorState) {
    let Some(at) = state.deadlines.next_live() else {
        state.deadlines.disarm();
        return;
    };
    if state.deadlines.armed_for() == Some(at) {
        return;
    }
    let actor = myself.clone();
    let clock = state.fabric.clock.clone();
    let alarm = tokio::spawn(async move {
        clock.sleep_until(at).await;
        let _ = actor.cast(ExecutorMsg::Alarm { at });
    });
    state.deadlines.arm(at, alarm);
}

/// Sets the progress alarm for the earliest held frame, or clears it when none is held.
fn rearm_progress(myself: &ActorRef<ExecutorMsg>, state: &mut ExecutorState) {
    let Some(at) = state.progress.next_due() else {
        state.progress.disarm();
        return;
    };
    if state.progress.armed_for() == Some(at) {
        return;
    }
    let actor = myself.clone();
    let clock = state.fabric.clock.clone();
    let alarm = tokio::spawn(async move {
        clock.sleep_until(at).await;
        let _ = actor.cast(ExecutorMsg::ProgressDue { at });
    });
    state.progress.arm(at, alarm);
}

async fn attach(state: &mut ExecutorState, stream: Attach) -> Result<(), Refusal> {
    if let Some(row) = state.fabric.store.executor(state.row.public_id).await.map_err(internal)? {
        state.row = row;
        state.row_read_at = state.fabric.clock.now_ms();
    }
    if state.row.status != ExecutorStatus::Active {
        return Err(Refusal::new(
            ErrorCode::Unauthorized,
            "this runner is revoked; revocation is final — create a new runner with `nexus admin runner create`",
        ));
    }
    if stream.credential_epoch != state.row.credential_epoch {
        return Err(Refusal::new(ErrorCode::Unauthorized, "this credential was fenced by a newer pairing"));
    }
    if let Some(old) = state.connection.take() {
        tracing::info!(runner_id = %state.row.public_id, "a new stream fences the old one");
        old.actor.close("fenced by a newer stream");
        state.window.clear();
    }
    state.fabric.store.touch_executor(state.row.public_id, PresenceEvent::Attached).await.map_err(internal)?;
    // The row held here shows what the store now says: an announcement's answer reads presence
    // off it (`docs/protocol.md`, "Presence").
    let now = state.fabric.clock.now_ms();
    (state.row.connected_at, state.row.last_seen_at) = (Some(now), Some(now));
    state.connection = Some(Connection {
        id: stream.conn_id,
        actor: stream.connection,
        outbound: stream.outbound,
        batches: stream.batches,
    });
    push(
        state,
        NexusFrame {
            request_id: stream.hello_request_id,
            frame: Some(Frame::Welcome(Welcome {
                executor_public_id: state.row.public_id.to_string(),
                credential_epoch: u64::try_from(state.row.credential_epoch).unwrap_or(0),
                protocol_version: RUNNER_PROTOCOL_VERSION,
                ping_interval_ms: state.fabric.config.runner.ping_interval_ms,
                batches: true,
            })),
        },
    );
    tracing::info!(runner_id = %state.row.public_id, open = state.open.len(), "runner stream attached");
    // The inbox is level-triggered: everything still claimable is offered again, through a fresh
    // window (filled after Welcome, when this message is handled).
    reset_window(state);
    Ok(())
}

async fn announce(state: &mut ExecutorState, body_json: &str) -> Result<Frame, Refusal> {
    let canonical = crate::declaration::announcement::validate_json(body_json)?;
    state.fabric.store.set_announcement(state.row.public_id, &canonical).await.map_err(internal)?;
    state.row.announcement = canonical;
    state.row.announced_at = Some(state.fabric.clock.now_ms());
    tracing::info!(runner_id = %state.row.public_id, tools = state.row.announcement["tools"].as_array().map_or(0, Vec::len), "announcement stored");
    Ok(Frame::Announced(Announced {
        executor_json: executor_json(&state.row, state.fabric.clock.now_ms()).to_string(),
    }))
}

/// A stream whose `last_seen_at` is older than this is shown `offline`, in milliseconds.
pub const PRESENCE_WINDOW_MS: i64 = 30_000;

/// An executor's presence (`docs/protocol.md`, "Presence"): `online` while a stream is attached
/// and was seen within [`PRESENCE_WINDOW_MS`], `not_yet_seen` before any stream, else `offline`.
/// Display only, never a gate.
pub fn presence(row: &ExecutorRow, now: i64) -> Presence {
    match (row.connected_at, row.last_seen_at) {
        (_, None) => Presence::NotYetSeen,
        (Some(_), Some(seen)) if now - seen <= PRESENCE_WINDOW_MS => Presence::Online,
        _ => Presence::Offline,
    }
}

/// An executor's description as discovery shows it (`docs/protocol.md`, "Discovery"):
/// `{public_id, kind, display_name, status, assignment_scope, credential_epoch, served_tools,
/// environment, served_documents, presence, last_seen_at, connected_at}`; `now` (Unix
/// milliseconds) decides the presence.
pub fn executor_json(row: &ExecutorRow, now: i64) -> Value {
    let presence = presence(row, now);
    json!({
        "public_id": row.public_id,
        "kind": row.kind,
        "display_name": row.display_name,
        "status": row.status,
        "assignment_scope": row.assignment_scope,
        "credential_epoch": row.credential_epoch,
        "served_tools": row.announcement["tools"],
        "environment": row.announcement["environment"],
        "served_documents": row.announcement["documents"],
        "presence": presence,
        "last_seen_at": row.last_seen_at,
        "connected_at": row.connected_at,
    })
}

/// Finds a task: open here, or settled (or addressed elsewhere) in the store.
async fn find(state: &ExecutorState, id: TaskId) -> Result<TaskRow, Refusal> {
    let (run, task_key) = id;
    if let Some(task) = state.open.get(&id) {
        // Tokens are checked against this copy: a settled one here would let a settled task's
        // token extend, commit or report progress.
        debug_assert!(!task.is_settled(), "an open task is never settled: {run}/{task_key} is {}", task.status);
        return Ok(task.clone());
    }
    let task =
        state.fabric.store.task(run, task_key).await.map_err(internal)?.ok_or_else(|| no_task(run, &task_key))?;
    if task.target_executor_public_id != Some(state.row.public_id) {
        return Err(Refusal::new(ErrorCode::NotAddressedHere, "this task is addressed to another executor"));
    }
    Ok(task)
}

/// `not_found` for a task key that names no task of `run` (a malformed key names none).
pub(crate) fn no_task(run: ExecutionId, task_key: &dyn std::fmt::Display) -> Refusal {
    Refusal::new(ErrorCode::NotFound, format!("no task {task_key} in run {run}"))
}

fn token_matches(task: &TaskRow, token: &str) -> bool {
    task.claim_token_digest.as_deref().is_some_and(|d| d == digest(token))
}

/// Whether a claim token was granted under the runner's current credential epoch (tokens are
/// `e<epoch>.<random>`); a re-paired runner's older claims are fenced.
fn token_current(state: &ExecutorState, token: &str) -> bool {
    token_epoch(token) == Some(state.row.credential_epoch)
}

/// The credential epoch a claim token names (`e<epoch>.<random>`), or `None` for a token of
/// another shape.
pub(crate) fn token_epoch(token: &str) -> Option<i64> {
    token.strip_prefix('e').and_then(|rest| rest.split_once('.')).and_then(|(epoch, _)| epoch.parse::<i64>().ok())
}

/// What one request decided: its answer now, or a row change whose answer waits until the
/// message's store write is durable ([`requests::answer`]).
enum Decided {
    Answer(Frame),
    Write(Staged),
}

/// A task row a request changed, staged until the message's write is durable, and what to do
/// once it is.
struct Staged {
    /// The row as it is to be written.
    row: TaskRow,
    effect: Effect,
}

enum Effect {
    /// A grant: hold the claimed row, answer with the token.
    Claim { frame: Frame },
    /// A moved deadline: hold it, tell the execution.
    Extend { timeout_ms: i64, frame: Frame },
    /// A settlement: release the task, tell the execution, answer.
    Settle { answer: Result<Frame, Refusal> },
}

impl Staged {
    fn id(&self) -> TaskId {
        (self.row.run_public_id, self.row.task_key)
    }

    /// Applies the change once its write is durable (`written`), or answers why not (`false`:
    /// the row held another claim, so nothing changed).
    fn apply(self, state: &mut ExecutorState, written: bool) -> Result<Frame, Refusal> {
        let id = self.id();
        match self.effect {
            Effect::Claim { frame } => {
                if !written {
                    // Another node won the row first: this grant loses.
                    return Err(Refusal::new(
                        ErrorCode::AlreadyClaimed,
                        "this task was claimed once; a claim is never re-granted",
                    ));
                }
                tracing::info!(runner_id = %state.row.public_id, run_id = %id.0, task_key = %id.1, "task claimed");
                state.window.withdraw(&id, self.row.started_at);
                hold(state, id, self.row);
                Ok(frame)
            }
            Effect::Extend { timeout_ms, frame } => {
                if !written {
                    return Err(internal("the task holds another claim"));
                }
                let deadline_at = self.row.deadline_at;
                hold(state, id, self.row);
                if let Err(error) = state.root.execution(id.0).deadline_extended(id.1, deadline_at, timeout_ms) {
                    unreachable_execution(id.0, &error);
                }
                Ok(frame)
            }
            Effect::Settle { answer } => {
                if !written {
                    return Err(internal("the task holds another claim"));
                }
                release(state, self.row);
                answer
            }
        }
    }
}

/// `task` settled `status` now, with `result` and `error_key`.
fn settled(
    state: &ExecutorState,
    mut task: TaskRow,
    status: TaskStatus,
    result: Option<Value>,
    error_key: Option<&str>,
) -> TaskRow {
    debug_assert!(
        !task.is_settled(),
        "a task settles at most once: {}/{} is already {}",
        task.run_public_id,
        task.task_key,
        task.status
    );
    debug_assert!(status.is_settled(), "{status} is not a settled status");
    task.status = status;
    task.result = result;
    task.error_key = error_key.map(str::to_owned);
    task.settled_at = Some(state.fabric.clock.now_ms());
    task
}

fn claim(state: &ExecutorState, task: TaskRow) -> Result<Decided, Refusal> {
    let (run, task_key) = (task.run_public_id, task.task_key);
    if task.kind.inbox_kind() != Some(InboxKind::ToolCall) {
        return Err(Refusal::new(ErrorCode::NotClaimableKind, "asks and approvals are never claimable"));
    }
    if task.claimed {
        return Err(Refusal::new(ErrorCode::AlreadyClaimed, "this task was claimed once; a claim is never re-granted"));
    }
    if task.status != TaskStatus::Dispatched {
        return Err(Refusal::new(
            ErrorCode::TaskNotClaimable,
            format!("the task is {}, not a dispatched park", task.status),
        ));
    }
    if state.row.status != ExecutorStatus::Active {
        return Err(Refusal::new(ErrorCode::NotEligible, "this runner is no longer eligible"));
    }
    debug_assert!(
        task.claim_token_digest.is_none(),
        "a claim is granted only on a row that never held a token: {run}/{task_key}"
    );
    // The token names the credential epoch it was granted under, so re-pairing fences it.
    let token = format!("e{}.{}", state.row.credential_epoch, crate::auth::random_token());
    let now = state.fabric.clock.now_ms();
    let mut granted = task;
    granted.claimed = true;
    granted.claim_token_digest = Some(digest(&token));
    // Claiming restarts the park clock: the holder gets a full deadline.
    granted.deadline_at = deadline_after(now, granted.timeout_ms);
    // The store's conditional write is the last word: another node that won the row first makes
    // this grant lose ([`Staged::apply`]).
    let frame = Frame::ClaimGranted(ClaimGranted {
        task_json: task_json(&granted).to_string(),
        claim_token: token,
        deadline_at_ms: granted.deadline_at,
    });
    Ok(Decided::Write(Staged { row: granted, effect: Effect::Claim { frame } }))
}

fn claim_status(state: &ExecutorState, task: &TaskRow, token: &str) -> Result<Frame, Refusal> {
    if !token_matches(task, token) || !token_current(state, token) {
        return Err(Refusal::new(ErrorCode::NotClaimant, "this token does not hold the claim"));
    }
    let active = !task.is_settled() && state.fabric.clock.now_ms() < task.deadline_at;
    Ok(Frame::ClaimState(ClaimState { active }))
}

fn extend(state: &ExecutorState, task: TaskRow, token: &str, timeout_ms: i64) -> Result<Decided, Refusal> {
    if !token_matches(&task, token) || !token_current(state, token) {
        return Err(Refusal::new(ErrorCode::NotClaimant, "this token does not hold the claim"));
    }
    if timeout_ms <= 0 {
        return Err(Refusal::new(ErrorCode::InvalidTimeoutMs, "timeout_ms must be a positive integer of milliseconds"));
    }
    let now = state.fabric.clock.now_ms();
    if task.is_settled() || now >= task.deadline_at {
        return Err(Refusal::new(
            ErrorCode::NotExtendable,
            "the claim is not a live park (settled or past its deadline)",
        ));
    }
    if is_frozen(task.deadline_at) {
        // Paused: the park does not run, so there is nothing to extend; once the execution
        // resumes, the deadline has what it had left when it paused.
        return Err(Refusal::new(
            ErrorCode::NotExtendable,
            "the execution is paused: its deadline is frozen until it resumes; extend after the resume",
        ));
    }
    let announced = state.row.announcement["tools"]
        .as_array()
        .and_then(|tools| tools.iter().find(|t| t["name"] == task.tool_name.as_str()))
        .and_then(|t| t["timeout_ms"].as_i64());
    let cap = announced.map_or(EXTENSION_CAP_MS, |a| a.min(EXTENSION_CAP_MS));
    if timeout_ms > cap {
        return Err(Refusal::new(ErrorCode::ExtensionTooLong, format!("at most {cap} ms may be granted")));
    }
    let mut extended = task;
    extended.deadline_at = deadline_after(now, timeout_ms);
    let frame = Frame::Extended(Extended { deadline_at_ms: extended.deadline_at });
    Ok(Decided::Write(Staged { row: extended, effect: Effect::Extend { timeout_ms, frame } }))
}

fn commit(state: &ExecutorState, task: TaskRow, token: &str, body_json: &str) -> Result<Decided, Refusal> {
    if task.is_settled() {
        // Write-once: the same token after settle is an idle success.
        if token_matches(&task, token) {
            return Ok(Decided::Answer(Frame::Committed(Committed {
                idle: true,
                status: task.status.as_str().to_owned(),
            })));
        }
        return Err(Refusal::new(ErrorCode::StaleClaim, "this token does not hold the claim; the task has settled"));
    }
    if !task.claimed {
        return Err(Refusal::new(ErrorCode::TaskNotRunning, "claim the task before committing"));
    }
    if !token_matches(&task, token) {
        return Err(Refusal::new(ErrorCode::StaleClaim, "this token was rotated or never held the claim"));
    }
    if !token_current(state, token) {
        return Err(Refusal::new(ErrorCode::StaleClaim, "this claim was fenced when the runner was paired again"));
    }
    let settle = |task, status: TaskStatus, result, error_key, answer| {
        Ok(Decided::Write(Staged {
            row: settled(state, task, status, result, error_key),
            effect: Effect::Settle { answer },
        }))
    };
    let committed =
        |status: TaskStatus| Ok(Frame::Committed(Committed { idle: false, status: status.as_str().to_owned() }));
    if state.fabric.clock.now_ms() >= task.deadline_at {
        // The deadline wins: the content is discarded and the task settles by the expiry rule.
        let (status, error_key) = expiry_outcome(&task);
        return settle(task, status, None, Some(error_key), committed(status));
    }
    match commit::validate(body_json) {
        Ok(body) => {
            let (status, error_key) =
                if body.failed { (TaskStatus::Failed, Some("tool_failed")) } else { (TaskStatus::Completed, None) };
            settle(task, status, Some(body.stored), error_key, committed(status))
        }
        Err(CommitRefusal::Standing(refusal)) => Err(refusal),
        Err(CommitRefusal::Closes(refusal)) => {
            settle(task, TaskStatus::Failed, None, Some("result_unstorable"), Err(refusal))
        }
    }
}

fn progress(state: &mut ExecutorState, id: TaskId, token: &str, frame_json: &str) -> Result<Frame, Refusal> {
    let Some(task) = state.open.get(&id) else {
        return Err(Refusal::new(ErrorCode::NotClaimant, "no live claim on this task"));
    };
    debug_assert!(!task.is_settled(), "a settled task's token never reports progress: {}/{}", id.0, id.1);
    if !token_matches(task, token) || !token_current(state, token) {
        return Err(Refusal::new(ErrorCode::NotClaimant, "this token does not hold the claim"));
    }
    check_progress_frame(frame_json)?;
    // Accepted always; the throttle lets one frame per task and interval onto the execution's
    // feed, the newest winning, and nothing is stored (`crate::actors::progress`).
    let frame = crate::json::parse_str(frame_json)
        .map_err(|_| Refusal::new(ErrorCode::InvalidFrame, "a progress frame is a JSON object"))?;
    let now = state.fabric.clock.now_ms();
    let item = TaskProgress {
        execution_public_id: id.0,
        task_key: id.1,
        tool_name: task.callable_name.clone(),
        runner_executor_public_id: state.row.public_id,
        frame,
        at: now,
    };
    if let Some(item) = state.progress.offer(item, now) {
        tracing::debug!(run_id = %id.0, task_key = %id.1, "progress");
        state.fabric.events.publish_progress(item);
    }
    Ok(Frame::ProgressAccepted(ProgressAccepted {}))
}

/// A progress frame's own rules, once its claim is checked: at most [`PROGRESS_FRAME_BOUND`]
/// bytes, and a JSON object (`docs/protocol.md`, "Progress").
///
/// # Errors
/// `frame_too_large` over the bound; `invalid_frame` for anything but a JSON object.
pub(crate) fn check_progress_frame(frame_json: &str) -> Result<(), Refusal> {
    if frame_json.len() > PROGRESS_FRAME_BOUND {
        return Err(Refusal::new(ErrorCode::FrameTooLarge, "progress frames are at most 65536 bytes"));
    }
    if !crate::json::parse_str(frame_json).is_ok_and(|v| v.is_object()) {
        return Err(Refusal::new(ErrorCode::InvalidFrame, "a progress frame is a JSON object"));
    }
    Ok(())
}

/// Settles an open task on its own (an expiry, a cancel, a revoked runner): durable first, then
/// the execution hears of it.
async fn settle(
    state: &mut ExecutorState,
    id: &TaskId,
    status: TaskStatus,
    result: Option<Value>,
    error_key: Option<&str>,
) -> Result<(), crate::store::StoreError> {
    let Some(task) = state.open.get(id).cloned() else { return Ok(()) };
    let task = settled(state, task, status, result, error_key);
    state.fabric.store.update_task(&task).await?;
    release(state, task);
    Ok(())
}

/// Lets go of a task whose settlement is durable, and tells its execution.
fn release(state: &mut ExecutorState, task: TaskRow) {
    let id = (task.run_public_id, task.task_key);
    state.open.remove(&id);
    // The task's last progress goes out before its settlement is told.
    if let Some(item) = state.progress.release(id.0, id.1) {
        state.fabric.events.publish_progress(item);
    }
    state.window.withdraw(&id, task.started_at);
    let held = state.deadlines.remove(&id);
    debug_assert!(held, "every open task has its deadline: {id:?}");
    tracing::info!(runner_id = %state.row.public_id, run_id = %id.0, task_key = %id.1, status = %task.status, "task settled");
    // Never waits: a cold execution loads in Root while this actor goes on, and hears of its
    // tasks in the order they settled.
    if let Err(error) = state.root.execution(id.0).task_settled(task) {
        unreachable_execution(id.0, &error);
    }
}

fn unreachable_execution(run: ExecutionId, error: &ActorError) {
    tracing::warn!(run_id = %run, %error, "cannot reach the execution; it rereads the store when it next loads");
}
