//! The ExecutionActor: one per execution (a Run). It freezes the declaration at materialization
//! and drives rounds: model call, tool calls fanned out as tasks, results, model again, until a
//! final answer (`docs/executions.md`, "Round driver" and "Materialization").
//!
//! The handler never waits on a model or a runner: a model call runs in a task the actor owns and
//! comes back as [`ExecutionMsg::ModelDone`]; a task's settlement comes back from its
//! [`ExecutorActor`](crate::actors::executor::ExecutorActor) as [`ExecutionMsg::TaskSettled`]. Each
//! round's expansion (its tasks, the transcript and the events narrating it) is one store
//! transaction, and the actor rebuilds itself from the store after a restart.

pub mod approval;
pub mod ask;
pub mod brake;
pub mod budget;
pub mod compaction;
pub mod context;
pub mod control;
pub mod conversation_tools;
pub mod delegation;
pub mod discovery;
pub mod hooks;
pub mod kernel;
pub mod phase;
pub mod queue;
pub mod resolve;
pub mod sessions;
pub mod steer;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use nexus_proto::{AttentionReason, ErrorCode, ExecutionId, Refusal, RunStatus, TaskKey, TaskStatus};

use crate::actors::executor::commit::model_text;
use crate::actors::fabric::{Fabric, TranscriptEvent};
use crate::actors::handle::ActorError;
use crate::actors::root::RootHandle;
use crate::declaration::approval::CallOrigin;
use crate::declaration::{FrozenDeclaration, wire_projection};
use crate::model::retry::call_with_retries;
use crate::model::{ChatMessage, DeltaSink, ModelFailure, ModelRequest, ModelResponse, ResolvedModel, ToolCall};
use crate::store::event::{
    AttentionRequired, DeadlineExtended, Materialized, MaterializedTool, ModelChange, RoundCall, RoundResult,
    RoundStarted, TaskNarration, TurnStatus, Usage,
};
use crate::store::{Event, EventRow, ExecutionRow, TaskRow, TranscriptWrite};

use self::phase::{End, Facts, Phase};

/// Hands a task just written `dispatched` to its runner's inbox. Never waits: a cold inbox loads
/// in Root meanwhile, and a runner that cannot be reached now is offered the durable row when its
/// inbox next loads.
fn offer(state: &ExecutionState, task: &TaskRow) {
    offer_all(state, std::slice::from_ref(task).iter());
}

/// [`offer`] for several rows: one message per runner inbox, so a round's calls to one runner
/// are offered together (one `NexusBatch` to a runner that reads batches).
fn offer_all<'a>(state: &ExecutionState, tasks: impl Iterator<Item = &'a TaskRow>) {
    let mut by_runner: BTreeMap<nexus_proto::RunnerId, Vec<TaskRow>> = BTreeMap::new();
    for task in tasks {
        let Some(target) = task.target_executor_public_id else { continue };
        by_runner.entry(target).or_default().push(task.clone());
    }
    for (target, rows) in by_runner {
        if let Err(error) = state.root.executor(target).offer(rows) {
            tracing::warn!(runner_id = %target, %error, "cannot reach the runner's inbox now; it is offered when the inbox loads");
        }
    }
}

/// The largest tool input, in bytes (`tool_input_too_large`).
pub const TOOL_INPUT_BOUND: usize = 65_536;
/// The most tool calls one answer may fan out into (`round_expansion_refused`, detail
/// `too_wide_a_fan`): the spec's 32 members per fan, which also keeps a `round_result` event (the
/// text and every call's input) within one reply of the doors.
pub const FAN_BOUND: usize = 32;

/// The id the result of `task` answers on the provider wire: its call's id in the transcript's
/// latest round of calls ([`crate::model::current_call_id`]), else (a row with no call there) its
/// own `tool_call_id`.
pub(crate) fn wire_id(transcript: &[ChatMessage], task: &TaskRow) -> String {
    let index = match task.task_key {
        TaskKey::Call { index, .. } => usize::try_from(index).ok(),
        _ => None,
    };
    index
        .and_then(|index| crate::model::current_call_id(transcript, index))
        .map_or_else(|| task.tool_call_id.clone(), str::to_owned)
}
/// The longest tool name a model may call (`unknown_tool` beyond it).
pub const TOOL_NAME_BOUND: usize = 128;

/// The ExecutionActor's messages.
pub enum ExecutionMsg {
    /// Make progress: materialize, or start the next round when nothing is outstanding.
    Advance,
    /// Write the narrations (events) gathered since the last save. Sent to itself after a task
    /// settles mid-round, so that every settlement already queued is written by one save.
    Flush,
    /// A model call finished.
    ModelDone {
        /// The round it answers.
        round: i64,
        /// The model reference that answered.
        model: String,
        /// The answer.
        result: Result<ModelResponse, ModelFailure>,
    },
    /// A task settled (durably) in its executor.
    TaskSettled(Box<TaskRow>),
    /// A claimant extended its task's deadline.
    DeadlineExtended {
        /// The task.
        task_key: TaskKey,
        /// The new deadline, Unix milliseconds.
        deadline_at: i64,
        /// The extension asked for, in milliseconds.
        timeout_ms: i64,
    },
    /// Stop the execution (`docs/executions.md`, "Control"): forced (the default at the
    /// doors) cancels its open work and drains through `canceling`; graceful lets dispatched work
    /// finish and schedules nothing new. Either way it ends `canceled` ([`control::stop`]).
    Stop {
        /// Forced (`true`) or graceful.
        force: bool,
        /// The execution after the stop: `canceled`, or `canceling` while it drains.
        reply: RpcReplyPort<Result<ExecutionRow, Refusal>>,
    },
    /// Pause, resume, and the drain bound of a stop ([`control::ControlMsg`]).
    Control(control::ControlMsg),
    /// A person approved or denied a task parked in `needs_approval` (`docs/executions.md`,
    /// "Approval"). Answers the task as it now stands, or 409 `not_awaiting_approval` /
    /// `not_adjudicable`.
    Adjudicate {
        /// The parked task.
        task_key: TaskKey,
        /// Approve, or deny with a reason.
        adjudication: approval::Adjudication,
        /// Who decided.
        by: approval::Adjudicator,
        /// The task after the decision.
        reply: RpcReplyPort<Result<TaskRow, Refusal>>,
    },
    /// A person answered a call of `ask` awaiting its answer ([`ask::AskMsg`]).
    Ask(ask::AskMsg),
    /// A held task's hold ran out: an approval hold, or the hold of a call of `ask`.
    HoldExpired {
        /// The parked task.
        task_key: TaskKey,
        /// The hold's deadline the timer was set for; a moved deadline makes it stale.
        deadline_at: i64,
    },
    /// A person retries or abandons a failed hook task that holds the execution
    /// (`docs/executions.md`, "Lifecycle hooks"). Answers the new generation (retry) or the
    /// abandoned task, or 409 `not_retryable` / `not_abandonable`.
    Repair {
        /// The held task.
        task_key: TaskKey,
        /// Retry or abandon.
        repair: hooks::Repair,
        /// The task after the repair.
        reply: RpcReplyPort<Result<TaskRow, Refusal>>,
    },
    /// The manual compaction door, and the kernel summarizer's answers ([`compaction`]).
    Compaction(compaction::CompactionMsg),
    /// Canceling a queued input or a waiting steer ([`queue`]).
    Inputs(queue::InputMsg),
    /// Children started, ended, and waits' deadlines ([`delegation`]).
    Delegation(delegation::DelegationMsg),
}

/// The typed handle on an execution's actor, found by id: a message reaches the live actor at
/// once, or waits in Root while the actor loads ([`RootHandle`]). Notices never wait; questions
/// wait at most the call deadline.
#[derive(Clone, Debug)]
pub struct ExecutionHandle {
    execution: ExecutionId,
    root: RootHandle,
}

impl ExecutionHandle {
    pub(crate) fn new(execution: ExecutionId, root: RootHandle) -> Self {
        ExecutionHandle { execution, root }
    }

    /// Tells the execution that one of its tasks settled (durably, in its executor).
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown; the execution narrates the settlement from the
    /// store when it next loads.
    pub fn task_settled(&self, task: TaskRow) -> Result<(), ActorError> {
        self.root.to_execution(self.execution, ExecutionMsg::TaskSettled(Box::new(task)))
    }

    /// Tells the execution that a claimant extended a task's deadline to `deadline_at` (Unix
    /// milliseconds), asking for `timeout_ms`.
    ///
    /// # Errors
    /// [`ActorError::Stopped`] during shutdown.
    pub fn deadline_extended(&self, task_key: TaskKey, deadline_at: i64, timeout_ms: i64) -> Result<(), ActorError> {
        self.root.to_execution(self.execution, ExecutionMsg::DeadlineExtended { task_key, deadline_at, timeout_ms })
    }

    /// Makes sure the execution's actor is live (it runs as soon as it is, when it can).
    ///
    /// # Errors
    /// `not_found` for an unknown execution; `unavailable` when it cannot be loaded in time.
    pub async fn load(&self) -> Result<(), Refusal> {
        self.root.load_execution(self.execution).await
    }

    /// Stops the execution, forced or graceful; answers it `canceled`, or `canceling` while it
    /// drains.
    ///
    /// # Errors
    /// The stop's refusals; `unavailable` when the actor cannot answer in time.
    pub async fn stop(&self, force: bool) -> Result<ExecutionRow, Refusal> {
        self.root.ask_execution(self.execution, |reply| ExecutionMsg::Stop { force, reply }).await?
    }

    /// Pauses a running execution; answers it `paused`.
    ///
    /// # Errors
    /// 409 `not_pausable`; `unavailable` when the actor cannot answer in time.
    pub async fn pause(&self, force: bool) -> Result<ExecutionRow, Refusal> {
        self.root
            .ask_execution(self.execution, |reply| ExecutionMsg::Control(control::ControlMsg::Pause { force, reply }))
            .await?
    }

    /// Resumes a paused execution; answers it `running`.
    ///
    /// # Errors
    /// 409 `not_paused`; `unavailable` when the actor cannot answer in time.
    pub async fn resume(&self) -> Result<ExecutionRow, Refusal> {
        self.root
            .ask_execution(self.execution, |reply| ExecutionMsg::Control(control::ControlMsg::Resume { reply }))
            .await?
    }

    /// Approves or denies a parked task; answers the task as it now stands.
    ///
    /// # Errors
    /// 409 `not_awaiting_approval` or `not_adjudicable`; `unavailable` when the actor cannot
    /// answer in time.
    pub async fn adjudicate(
        &self,
        task_key: TaskKey,
        adjudication: approval::Adjudication,
        by: approval::Adjudicator,
    ) -> Result<TaskRow, Refusal> {
        self.root
            .ask_execution(self.execution, |reply| ExecutionMsg::Adjudicate {
                task_key,
                adjudication: adjudication.clone(),
                by: by.clone(),
                reply,
            })
            .await?
    }

    /// Retries or abandons a failed hook task that holds the execution; answers the new
    /// generation or the abandoned task.
    ///
    /// # Errors
    /// 409 `not_retryable` or `not_abandonable`; `unavailable` when the actor cannot answer in
    /// time.
    pub async fn repair(&self, task_key: TaskKey, repair: hooks::Repair) -> Result<TaskRow, Refusal> {
        self.root.ask_execution(self.execution, |reply| ExecutionMsg::Repair { task_key, repair, reply }).await?
    }

    /// Asks for a compaction before the next round (the manual door).
    ///
    /// # Errors
    /// 409 `compaction_disabled`, `task_not_queued`, `already_compacted` or `nothing_to_compact`;
    /// `unavailable` when the actor cannot answer in time.
    pub async fn compact(&self) -> Result<Value, Refusal> {
        self.root
            .ask_execution(self.execution, |reply| {
                ExecutionMsg::Compaction(compaction::CompactionMsg::Manual { reply })
            })
            .await?
    }
}

/// Arguments: which execution.
pub struct ExecutionArgs {
    /// Shared context.
    pub fabric: Arc<Fabric>,
    /// Root, to find executors.
    pub root: RootHandle,
    /// The execution.
    pub public_id: ExecutionId,
    /// Its row as the loader just read it (the loader checks that the execution exists), so
    /// that starting reads it once.
    pub row: ExecutionRow,
}

/// The ExecutionActor's state.
pub struct ExecutionState {
    fabric: Arc<Fabric>,
    root: RootHandle,
    /// Where the execution stands ([`phase`]); `row.status` is its projection, written only by
    /// [`enter`] and [`sync`].
    phase: Phase,
    row: ExecutionRow,
    /// Shared with every live execution that froze the same bytes ([`Fabric::declarations`]).
    declaration: Option<Arc<FrozenDeclaration>>,
    transcript: Vec<ChatMessage>,
    /// How many leading messages of `transcript` the store holds as they are here: the next save
    /// writes the ones after them (`docs/architecture.md`, "Transcript storage").
    transcript_stored: usize,
    /// The store may hold messages after `transcript_stored` that the transcript no longer has
    /// (it was rewritten, [`rewrite_transcript`]): the next save replaces them.
    transcript_rewritten: bool,
    /// The current round's tasks by key, settled or not, whose results the model has not read,
    /// and the unresolved hook tasks ([`hooks`]), which the model never reads.
    pending: BTreeMap<TaskKey, TaskRow>,
    /// Events written with the next save.
    events: Vec<EventRow>,
    model_call: Option<JoinHandle<()>>,
    /// The hold timer of each held task (parked for approval, or a call of `ask` awaiting its
    /// answer), by task key.
    holds: HashMap<TaskKey, JoinHandle<()>>,
    /// The I/O kernel calls running in-process, by task key ([`kernel::launch`]).
    kernel_calls: HashMap<TaskKey, JoinHandle<()>>,
    /// Index into [`model_chain`] where each round starts looking for an available route: 0, or
    /// the route the last `model_change` switched to (restored from the event log).
    model_index: usize,
    /// Pause, resume and stop bookkeeping ([`control`]).
    control: control::ControlState,
    /// Lifecycle hook bookkeeping ([`hooks`]).
    hooks: hooks::HookState,
    /// Compaction bookkeeping ([`compaction`]).
    compaction: compaction::CompactionState,
    /// The prompt's macros and the conversation's history ([`context`]).
    context: context::ContextState,
    /// The frozen declaration is in the store as it is here: saves leave its column alone.
    declaration_stored: bool,
    /// A [`ExecutionMsg::Flush`] is on its way.
    flush_queued: bool,
    /// Steers being applied, and the hand-off to the conversation's next turn ([`queue`]).
    queue: queue::QueueState,
    /// Waits on children, results to hand on, and the end's dispositions ([`delegation`]).
    delegation: delegation::DelegationState,
}

/// The ExecutionActor.
pub struct ExecutionActor;

impl Actor for ExecutionActor {
    type Msg = ExecutionMsg;
    type State = ExecutionState;
    type Arguments = ExecutionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ExecutionMsg>,
        args: ExecutionArgs,
    ) -> Result<ExecutionState, ActorProcessingErr> {
        let store = &args.fabric.store;
        let mut row = args.row;
        let transcript: Vec<ChatMessage> = serde_json::from_value(std::mem::take(&mut row.transcript))?;
        let row_transcript_stored = row.transcript_stored;
        let declaration: Option<FrozenDeclaration> = row.declaration.take().map(serde_json::from_value).transpose()?;
        let declaration = declaration.map(|d| args.fabric.declarations.intern(d));
        let declaration_stored = declaration.is_some();
        // Calls whose results the model has not read yet: the current round's tasks that are not
        // in the transcript.
        let answered = crate::model::answered_calls(&transcript);
        // An execution with no event yet has had no save: only saves write its tasks and events
        // (its first save carries `input_materialized`, or the first events of a regeneration),
        // so there is nothing to read back, and a turn's start spares those two reads.
        let fresh = row.event_seq == 0;
        // Hook tasks are rebuilt apart: their settlement is narrated once judged ([`hooks`]).
        let (hook_tasks, tasks) = hooks::split(if fresh { Vec::new() } else { store.tasks_of(args.public_id).await? });
        // So are compaction's summary tasks ([`compaction`]): the model never reads them.
        let (summary_tasks, tasks) = compaction::split(tasks);
        // A task settles in its executor first and is narrated here after; a crash between the
        // two leaves a settled task with no `task_status` event. Recovery writes what is missing,
        // so every settlement reaches the feed exactly once.
        let history = if fresh { Vec::new() } else { store.events_after(args.public_id, 0, i64::MAX).await? };
        let narrated: HashSet<TaskKey> = history
            .iter()
            .filter_map(|e| e.event.as_task_status())
            .filter(|narration| narration.status.is_settled())
            .map(|narration| narration.task_key)
            .collect();
        // A switch of the fallback chain is durable: a restart keeps the model it switched to.
        let model_index = declaration.as_ref().map_or(0, |d| switched_index(d, &history));
        let unnarrated: Vec<TaskRow> =
            tasks.iter().filter(|t| t.is_settled() && !narrated.contains(&t.task_key)).cloned().collect();
        let pending = tasks
            .into_iter()
            .filter(|t| t.round == row.round && !answered.contains(wire_id(&transcript, t).as_str()))
            .map(|t| (t.task_key, t))
            .collect();
        let mut state = ExecutionState {
            fabric: args.fabric,
            root: args.root,
            // Read from the facts once they are rebuilt, below.
            phase: Phase::Materializing,
            row,
            declaration,
            transcript_stored: row_transcript_stored,
            transcript,
            transcript_rewritten: false,
            pending,
            events: Vec::new(),
            model_call: None,
            holds: HashMap::new(),
            kernel_calls: HashMap::new(),
            model_index,
            control: control::ControlState::default(),
            hooks: hooks::HookState::default(),
            compaction: compaction::CompactionState::default(),
            context: context::ContextState::rebuilt(&history),
            declaration_stored,
            flush_queued: false,
            queue: queue::QueueState::loaded(),
            delegation: delegation::DelegationState::default(),
        };
        for task in &unnarrated {
            narrate(&mut state, task);
        }
        // A model call in flight when the process stopped keeps its whole reservation.
        budget::restarted(&mut state);
        hooks::rebuild(&mut state, hook_tasks, &history);
        compaction::rebuild(&myself, &mut state, summary_tasks, &history);
        // Parked tasks keep their durable holds across a restart.
        approval::rearm(&myself, &mut state);
        state.phase = Phase::of(&facts(&state));
        Ok(state)
    }

    async fn post_start(
        &self,
        myself: ActorRef<ExecutionMsg>,
        state: &mut ExecutionState,
    ) -> Result<(), ActorProcessingErr> {
        if !state.events.is_empty() {
            save(state, &[]).await?;
        }
        // In-process kernel calls a restart interrupted run again ([`kernel`]).
        if !matches!(state.row.status, RunStatus::Canceling) && !state.row.status.is_terminal() {
            let running: Vec<TaskRow> = state.pending.values().cloned().collect();
            kernel::launch(&myself, state, &running);
        }
        // A quiescent execution (loaded for a door, or for a late settlement) waits for that
        // message: an `Advance` first would find nothing to do and stop the actor before it.
        if !state.row.status.is_quiescent() {
            myself.cast(ExecutionMsg::Advance)?;
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ExecutionMsg>,
        state: &mut ExecutionState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(call) = state.model_call.take() {
            call.abort();
        }
        for (_, hold) in state.holds.drain() {
            hold.abort();
        }
        for (_, call) in state.kernel_calls.drain() {
            call.abort();
        }
        delegation::disarm_all(state);
        // Narrations gathered but not yet written (a Flush still queued) are written now.
        if !state.events.is_empty() {
            save(state, &[]).await?;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ExecutionMsg>,
        msg: ExecutionMsg,
        state: &mut ExecutionState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ExecutionMsg::Advance => advance(&myself, state).await?,
            // A graceful pause lets the model call finish; its answer waits for the resume.
            ExecutionMsg::ModelDone { round, model, result } if state.phase == Phase::Paused => {
                control::hold_answer(state, round, model, result);
            }
            ExecutionMsg::ModelDone { round, model, result } => {
                // The answer of an aborted call, or of a round replaced since, is never read.
                if state.phase != (Phase::AwaitingModel { round }) {
                    return Ok(());
                }
                state.model_call = None;
                model_done(&myself, state, &model, result).await?;
            }
            // While a stop drains, settlements are narrated and counted, never read by a model.
            ExecutionMsg::TaskSettled(task) if state.phase == Phase::Canceling => {
                control::settled_while_canceling(state, *task).await?;
            }
            // A hook task is judged before it is narrated ([`hooks`]).
            ExecutionMsg::TaskSettled(task) if task.task_key.is_hook() => {
                hooks::settled(&myself, state, *task).await?;
            }
            ExecutionMsg::TaskSettled(task) => {
                state.kernel_calls.remove(&task.task_key);
                let Some(held) = state.pending.get_mut(&task.task_key) else { return Ok(()) };
                if held.is_settled() {
                    return Ok(());
                }
                *held = (*task).clone();
                narrate(state, &task);
                if state.pending.values().all(TaskRow::is_settled) {
                    // The narration goes out with the boundary's own save (the next round's
                    // start, a hook's task, the final answer) or alone ([`advance`]).
                    if state.phase.is_working() {
                        advance(&myself, state).await?;
                    } else {
                        save(state, &[]).await?;
                    }
                } else if !state.flush_queued {
                    // Mid-round narrations are coalesced: the settlements already queued are all
                    // handled before this Flush, which writes them in one save. The task rows are
                    // durable already, and recovery narrates any that a crash leaves unwritten.
                    state.flush_queued = true;
                    let _ = myself.cast(ExecutionMsg::Flush);
                }
            }
            ExecutionMsg::Flush => {
                state.flush_queued = false;
                if !state.events.is_empty() {
                    save(state, &[]).await?;
                }
            }
            ExecutionMsg::DeadlineExtended { task_key, deadline_at, timeout_ms } => {
                if let Some(task) = state.pending.get_mut(&task_key) {
                    let by = deadline_at - task.deadline_at;
                    task.deadline_at = deadline_at;
                    emit(
                        state,
                        Event::TaskDeadlineExtended(DeadlineExtended { task_key, deadline_at, by, timeout_ms }),
                    );
                    save(state, &[]).await?;
                }
            }
            ExecutionMsg::Stop { force, reply } => {
                let stopped = control::stop(&myself, state, force).await;
                answer(reply, stopped, "the stop", "the execution")?;
                if state.row.status.is_quiescent() {
                    myself.stop(None);
                }
            }
            ExecutionMsg::Control(msg) => control::handle(&myself, state, msg).await?,
            ExecutionMsg::Adjudicate { task_key, adjudication, by, reply } => {
                let outcome = approval::adjudicate(&myself, state, task_key, adjudication, &by).await;
                answer(reply, outcome, "the decision", "the task")?;
            }
            ExecutionMsg::Ask(msg) => ask::handle(&myself, state, msg).await?,
            ExecutionMsg::HoldExpired { task_key, deadline_at } => {
                approval::expire(&myself, state, task_key, deadline_at).await?;
            }
            ExecutionMsg::Repair { task_key, repair, reply } => {
                let outcome = hooks::repair(&myself, state, task_key, repair).await;
                answer(reply, outcome, "the repair", "the task")?;
            }
            ExecutionMsg::Compaction(msg) => compaction::handle(&myself, state, msg).await?,
            ExecutionMsg::Inputs(msg) => queue::handle(state, msg).await?,
            ExecutionMsg::Delegation(msg) => delegation::handle(&myself, state, msg).await?,
        }
        sync(state);
        debug_assert!(
            !matches!(state.phase, Phase::Boundary { .. }),
            "execution {} rests at a boundary: the driver stopped without deciding what comes next",
            state.row.public_id
        );
        if state.row.status.is_quiescent() && state.pending.values().all(TaskRow::is_settled) {
            myself.stop(None);
        }
        Ok(())
    }
}

/// Sends a handler's answer (`Ok` of `outcome`) to `reply`. A store failure answers `internal`,
/// saying that `what` could not be recorded and that the caller should read `read` and retry, and
/// is returned, so the actor stops and reloads from the store on next use.
///
/// # Errors
/// The failure inside `outcome`.
fn answer<T>(
    reply: RpcReplyPort<Result<T, Refusal>>,
    outcome: Result<Result<T, Refusal>, ActorProcessingErr>,
    what: &str,
    read: &str,
) -> Result<(), ActorProcessingErr> {
    match outcome {
        Ok(answer) => {
            let _ = reply.send(answer);
            Ok(())
        }
        Err(e) => {
            let _ = reply.send(Err(Refusal::new(
                ErrorCode::Internal,
                format!("could not record {what}: {e}; read {read} and retry"),
            )));
            Err(e)
        }
    }
}

/// The facts the phase is read from ([`Phase::of`]).
fn facts(state: &ExecutionState) -> Facts {
    Facts {
        status: state.row.status,
        round: state.row.round,
        model_call: state.model_call.is_some(),
        open_hook: state.pending.iter().find(|(key, task)| key.is_hook() && !task.is_settled()).map(|(key, _)| *key),
        open_calls: state.pending.iter().any(|(key, task)| !key.is_hook() && !key.is_summary() && !task.is_settled()),
        compacting: compaction::in_progress(state),
    }
}

/// Moves the execution into `next`: the one writer of the phase and of the status it shows.
/// A move the table refuses ([`Phase::allows`]) is a bug: it fails debug builds and is logged.
fn enter(state: &mut ExecutionState, next: Phase) {
    let from = state.phase;
    if from == next {
        return;
    }
    if !from.allows(next) {
        tracing::error!(execution_id = %state.row.public_id, %from, to = %next, "an execution moved where its phase table does not allow");
        debug_assert!(false, "execution {}: {from} -> {next} is not an allowed move", state.row.public_id);
    }
    tracing::debug!(execution_id = %state.row.public_id, %from, to = %next, "phase");
    state.phase = next;
    state.row.status = next.status();
}

/// Reads the phase again from the facts ([`Phase::of`]) and enters it: after a message, and
/// before the driver decides.
fn sync(state: &mut ExecutionState) {
    let now = Phase::of(&facts(state));
    enter(state, now);
}

/// The working phase the execution resumes into after a pause or a repair: what is out then
/// decides it.
fn resumed(state: &ExecutionState) -> Phase {
    Phase::of(&Facts { status: RunStatus::Running, ..facts(state) })
}

/// Queues `event` for the next save, under the execution's next sequence number.
fn emit(state: &mut ExecutionState, event: Event) {
    state.row.event_seq += 1;
    state.events.push(EventRow { seq: state.row.event_seq, event, at: state.fabric.clock.now_ms() });
}

/// Queues the `task_status` of `task` as it now stands.
fn narrate(state: &mut ExecutionState, task: &TaskRow) {
    state.fabric.metrics.task_settled(task);
    emit(state, Event::TaskStatus(Box::new(narration(task))));
}

/// Writes the row, the transcript's new messages, new tasks and pending events in one
/// transaction, then wakes followers.
async fn save(state: &mut ExecutionState, new_tasks: &[TaskRow]) -> Result<(), ActorProcessingErr> {
    // An ending turn gives back the child allocations no child will use ([`delegation`]).
    if state.row.status.is_terminal() {
        delegation::before_end(state).await?;
    }
    // The frozen declaration never changes once stored: it is written once, not on every save.
    state.row.declaration = match state.declaration_stored {
        true => None,
        false => state.declaration.as_ref().map(serde_json::to_value).transpose()?,
    };
    // Only what the store does not hold yet is written, so a save costs the same at round 200 as
    // at round 2 (`docs/architecture.md`, "Transcript storage").
    let kept = state.transcript_stored.min(state.transcript.len());
    let messages = &state.transcript[kept..];
    let transcript = match state.transcript_rewritten {
        true => TranscriptWrite::Rewrite { kept, messages },
        false => TranscriptWrite::Append { kept, messages },
    };
    let events = std::mem::take(&mut state.events);
    // Steers applied since the last save are marked applied with it ([`steer`]).
    let applied = std::mem::take(&mut state.queue.applying);
    // Children's results handed to the model since the last save are consumed with it
    // ([`delegation`]).
    let consumed = std::mem::take(&mut state.delegation.consuming);
    let written = state
        .fabric
        .store
        .save_execution_applying(&state.row, transcript, new_tasks, &events, &applied, &consumed)
        .await;
    if written.is_ok() {
        state.transcript_stored = state.transcript.len();
        state.transcript_rewritten = false;
        if state.declaration.is_some() {
            state.declaration_stored = true;
        }
    }
    // The actor keeps the declaration in its typed form; the JSON copy on the row exists only for
    // the write (an idle execution holds one copy, not two).
    state.row.declaration = None;
    written?;
    state.fabric.events.publish(state.row.public_id, state.row.event_seq);
    if state.row.status.is_quiescent() {
        state.fabric.events.close(state.row.public_id);
    }
    // An end hands the conversation to its next turn ([`queue`]).
    if state.row.status.is_terminal() {
        queue::ended(state).await?;
        // A child tells its parent; a parent hands on its children's results and disposes of
        // the children still running ([`delegation`]).
        delegation::ended(state).await?;
    }
    Ok(())
}

/// Replaces the transcript with `rewritten` (a compaction): the next save rewrites the stored
/// messages from the first one that differs, and keeps those before it.
fn rewrite_transcript(state: &mut ExecutionState, rewritten: Vec<ChatMessage>) {
    let same = state.transcript.iter().zip(&rewritten).take_while(|(old, new)| old == new).count();
    state.transcript_stored = state.transcript_stored.min(same);
    state.transcript_rewritten = true;
    state.transcript = rewritten;
}

/// The `task_status` narration of `task` as it now stands.
fn narration(task: &TaskRow) -> TaskNarration {
    let settled = task.is_settled();
    TaskNarration {
        task_key: task.task_key,
        kind: task.kind,
        status: task.status,
        tool_name: task.callable_name.clone(),
        served_name: task.tool_name.clone(),
        tool_call_id: task.tool_call_id.clone(),
        runner_executor_public_id: task.target_executor_public_id,
        error_key: task.error_key.clone(),
        approval: task.approval.clone(),
        hook: task.task_key.hook_event(),
        content: settled.then(|| result_text(task)),
        is_error: task.result.as_ref().filter(|_| settled).map(|result| result["is_error"].as_bool().unwrap_or(false)),
        compaction: None,
        decision: None,
        failure_resolution: None,
        retried_as: None,
    }
}

/// The text the model reads for a settled task.
pub(crate) fn result_text(task: &TaskRow) -> String {
    let content = task.result.as_ref().map(model_text).unwrap_or_default();
    match (task.status, task.error_key.as_deref()) {
        (TaskStatus::Completed, _) => content,
        // The approval stage's results are the origin's tool-use errors, as written.
        (_, Some("approval_denied" | "approval_expired" | "ask_expired")) => content,
        (TaskStatus::TimedOut, _) => {
            format!("tool_timeout: {} did not finish within its deadline ({} ms)", task.callable_name, task.timeout_ms)
        }
        (TaskStatus::Uncertain, _) => format!(
            "tool_uncertain: {} was claimed but no result arrived before its deadline; its effect may have happened",
            task.callable_name
        ),
        (TaskStatus::Canceled, _) => format!("task_canceled: {} was canceled", task.callable_name),
        // The runner was taken off this Agent after the call was addressed to it
        // (`docs/protocol.md`, "Assignment").
        (_, Some("not_eligible")) if content.is_empty() => {
            format!("not_eligible: {} was not run: its runner no longer serves this Agent", task.callable_name)
        }
        (_, Some(key)) if content.is_empty() => format!("{key}: {} could not run", task.callable_name),
        (_, Some(key)) => format!("{key}: {content}"),
        (status, None) => format!("{status}: {content}"),
    }
}

/// Makes progress from where the execution stands ([`Phase`]): the round driver.
/// Moves the execution on from where it stands ([`step`]); whatever that left unwritten (a
/// settlement's narration at a round boundary, a materialization) is written in one save, so
/// a round boundary costs one write, not two (issue 10, item 1).
async fn advance(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState) -> Result<(), ActorProcessingErr> {
    step(myself, state).await?;
    if !state.events.is_empty() {
        save(state, &[]).await?;
    }
    Ok(())
}

async fn step(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState) -> Result<(), ActorProcessingErr> {
    sync(state);
    let phase = state.phase;
    match phase {
        // The `turn_start` hook runs before the first model round (`docs/executions.md`,
        // "Lifecycle hooks").
        Phase::Materializing
            if materialize(state).await?
                && hooks::gate(myself, state, hooks::HookEvent::TurnStart).await? == hooks::Gate::Open =>
        {
            start_round(myself, state).await?;
        }
        // A restart found a stop draining: it goes on draining (`docs/executions.md`, "Control").
        Phase::Canceling => control::resume_drain(myself, state).await?,
        // At a boundary, or compacting with nothing out (a summary settled, or a hook to ask):
        // the driver decides. Awaiting the model, a hook or calls, it waits for their message.
        Phase::Boundary { .. } | Phase::Compacting { .. } => {
            if !state.pending.values().all(TaskRow::is_settled) {
                return Ok(());
            }
            // Settled hook tasks are judged first: a decision holds the execution, continues it
            // with feedback, or lets it go on.
            if !hooks::judge_settled(state).await? {
                return Ok(());
            }
            // A settled summary task is compaction's to apply, never a tool result.
            compaction::collect(state);
            if let Some(ChatMessage::Assistant { content, tool_calls }) = state.transcript.last()
                && tool_calls.is_empty()
            {
                let text = content.clone().unwrap_or_default();
                return deliver(myself, state, text).await;
            }
            // Every call of the round has settled: its results go back to the model in call order
            // (the keys of one round sort that way).
            let settled: Vec<TaskRow> = std::mem::take(&mut state.pending).into_values().collect();
            for task in &settled {
                let tool_call_id = wire_id(&state.transcript, task);
                state.transcript.push(ChatMessage::Tool { tool_call_id, content: result_text(task) });
            }
            // The safe boundary: steers posted meanwhile join the history here ([`steer`]).
            steer::apply(state).await?;
            // So do the results of children nobody waits for ([`delegation`]).
            delegation::apply_mail(state);
            // Compaction runs at the boundary, before the next model request (`docs/executions.md`,
            // "Compaction").
            if hooks::gate(myself, state, hooks::HookEvent::TurnStart).await? == hooks::Gate::Open
                && compaction::gate(myself, state).await? == hooks::Gate::Open
            {
                start_round(myself, state).await?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Resolves and freezes the declaration. Returns `false` when the execution ended instead, or
/// waits for its turn.
async fn materialize(state: &mut ExecutionState) -> Result<bool, ActorProcessingErr> {
    // A regeneration is created with its declaration frozen already, reused or replaced
    // (`docs/executions.md`, "Control"): it is adopted as it is, never resolved again.
    // One execution at a time per conversation: a queued input waits for its turn ([`queue`]);
    // so does a turn created with its declaration frozen (a child's result mailed to its
    // parent's conversation, [`delegation`]).
    if !queue::may_start(state).await? {
        return Ok(false);
    }
    if let Some(frozen) = state.declaration.take() {
        let input = state.fabric.store.input(state.row.input_public_id).await?;
        return adopt(state, &input.ok_or("the execution's input is missing")?, frozen, None).await;
    }
    // A turn that waited for its turn starts no work for an Agent suspended meanwhile
    // (`docs/executions.md`, "People in the loop"): the doors refuse new work to a suspended
    // member, and the line does too.
    let agent = state.fabric.store.member(state.row.member_public_id).await?;
    if agent.as_ref().is_some_and(|member| member.status != nexus_proto::MemberStatus::Active) {
        let refusal = Refusal::new(
            ErrorCode::NotAuthorized,
            "the Agent was suspended before this turn started; an operator reinstates it with \
             `nexus admin member reinstate`, then post the input again",
        );
        return end_refused(state, &refusal).await;
    }
    let input = state.fabric.store.input(state.row.input_public_id).await?.ok_or("the execution's input is missing")?;
    let frozen = match resolve::resolve(&state.fabric, &input, None).await {
        Ok(frozen) => frozen,
        // A store failure stops the actor; it resolves again when it reloads.
        Err(refusal) if refusal.code == ErrorCode::Internal => return Err(refusal.message.into()),
        Err(refusal) => return end_refused(state, &refusal).await,
    };
    let frozen = state.fabric.declarations.intern(frozen);
    adopt(state, &input, frozen, agent.as_ref()).await
}

/// Freezes `frozen` onto the execution (`agent`: the Agent's row, when read already): the first transcript (the input's text: the documents
/// and the history are assembled into each request, [`context`]), `input_materialized` (with the
/// macros' values) and `turn_status running`, written by the next save (normally the first
/// round's, so that materializing and starting a round take one write). Returns `true`.
async fn adopt(
    state: &mut ExecutionState,
    input: &crate::store::InputRow,
    frozen: Arc<FrozenDeclaration>,
    agent: Option<&crate::store::MemberRow>,
) -> Result<bool, ActorProcessingErr> {
    // The macros' values (one member read unless `agent` is the Agent's row already, one more
    // when a Human posted) and the earlier turns (none read for a first turn) are taken here,
    // once (`docs/prompt.md`, "History").
    let macros = context::taken_knowing(&state.fabric, &frozen, input, agent).await?;
    let history = context::history_of(&state.fabric, &frozen, input).await?;
    state.context = context::ContextState::adopted(macros.clone(), history, input);
    // The budget is frozen with the declaration (`docs/executions.md`, "Budgets").
    budget::adopt(state, input);
    // Children's results left for this turn are read first ([`delegation`]).
    delegation::read_passive_mail(state).await?;
    state.transcript.push(ChatMessage::User { content: input.text.clone() });
    emit(
        state,
        Event::InputMaterialized(Box::new(Materialized {
            input_public_id: input.public_id,
            declaration_digest: frozen.digest.clone(),
            default_model: frozen.default_model.clone(),
            default_runner_executor_public_id: frozen.default_runner_executor_public_id,
            tools: frozen
                .tools
                .iter()
                .map(|t| MaterializedTool { name: t.name.clone(), route: json!(t.route) })
                .collect(),
            runner_candidates: json!(frozen.runner_candidates),
            macros: Some(macros),
        })),
    );
    tracing::info!(execution_id = %state.row.public_id, tools = frozen.tools.len(), "execution materialized");
    state.declaration = Some(frozen);
    state.declaration_stored = false;
    enter(state, Phase::Boundary { round: state.row.round });
    emit(state, Event::TurnStatus(TurnStatus::Running { resumed: None, paused_ms: None }));
    Ok(true)
}

async fn end_refused(state: &mut ExecutionState, refusal: &Refusal) -> Result<bool, ActorProcessingErr> {
    tracing::info!(execution_id = %state.row.public_id, code = %refusal.code, "execution refused at materialization");
    enter(state, Phase::Done(End::Canceled));
    state.row.error_key = Some(refusal.code.as_str().to_owned());
    emit(
        state,
        Event::TurnStatus(TurnStatus::Failed {
            error_key: refusal.code.as_str().to_owned(),
            message: Some(refusal.message.clone()),
        }),
    );
    save(state, &[]).await?;
    Ok(false)
}

/// The routes an execution may use, in order: the default model, then the captured fallbacks,
/// each route visited once (`docs/executions.md`, "Models": the default is not appended,
/// duplicates are visited once).
fn model_chain(declaration: &FrozenDeclaration) -> Vec<String> {
    let mut chain: Vec<String> = Vec::new();
    for route in declaration.default_model.iter().chain(declaration.fallback_models.iter()) {
        if !chain.contains(route) {
            chain.push(route.clone());
        }
    }
    chain
}

/// Where the chain stands after the durable `model_change` events: the last switch's `to`, or 0.
fn switched_index(declaration: &FrozenDeclaration, history: &[EventRow]) -> usize {
    let chain = model_chain(declaration);
    history
        .iter()
        .rev()
        .find_map(|e| match &e.event {
            Event::ModelChange(change) => chain.iter().position(|route| *route == change.to),
            _ => None,
        })
        .unwrap_or(0)
}

/// The first route of `chain` at or after `from` that resolves now. Availability is judged live
/// and without provider I/O: a disabled provider or model, or a missing credential, is skipped
/// and counts as no attempt (`docs/executions.md`, "Models").
fn next_available(state: &ExecutionState, chain: &[String], from: usize) -> Option<(usize, ResolvedModel)> {
    chain.iter().enumerate().skip(from).find_map(|(index, route)| match state.fabric.models.resolve(route) {
        Ok(model) => Some((index, model)),
        Err(e) => {
            tracing::warn!(execution_id = %state.row.public_id, model = %route, word = e.word(), "model route unavailable; skipping");
            None
        }
    })
}

async fn start_round(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState) -> Result<(), ActorProcessingErr> {
    let Some(declaration) = &state.declaration else { return Err("a round before materialization".into()) };
    let chain = model_chain(declaration);
    let tools = wire_projection(&declaration.tools);
    let Some((_, model)) = next_available(state, &chain, state.model_index) else {
        return halt(state, "provider_model_unavailable", "no model in the declaration's chain is available").await;
    };
    let assembled = context::assemble(state, model.context_window_tokens, &tools).await?;
    // The call's worst case is reserved before anything is sent (`docs/executions.md`, "Budgets").
    if let Err(refusal) = budget::reserve_model_call(state, &model, assembled.manifest.estimated_tokens) {
        end_refused(state, &refusal).await?;
        return Ok(());
    }
    state.row.round += 1;
    let round = state.row.round;
    emit(
        state,
        Event::RoundStarted(RoundStarted { round, model: model.reference.clone(), context: Some(assembled.manifest) }),
    );
    save(state, &[]).await?;

    // Deltas are ephemeral: published as they arrive, never stored; `round_result` settles them.
    let execution_id = state.row.public_id;
    let deltas = {
        let fabric = Arc::clone(&state.fabric);
        let reference = model.reference.clone();
        DeltaSink::new(move |delta| {
            fabric.events.publish_transcript(TranscriptEvent {
                execution_public_id: execution_id,
                round,
                model: reference.clone(),
                delta,
            });
        })
    };
    let request =
        ModelRequest { model: model.model.clone(), messages: assembled.messages, tools, deltas: Some(deltas) };
    let policy = state.fabric.config.execution.retry_policy();
    let actor = myself.clone();
    let reference = model.reference.clone();
    let span = tracing::info_span!("model_call", %execution_id, round, model = %reference);
    let metrics = state.fabric.metrics.clone();
    state.model_call = Some(tokio::spawn(tracing::Instrument::instrument(
        async move {
            let began = tokio::time::Instant::now();
            let result = call_with_retries(model.client, request, &policy).await;
            let usage = result.as_ref().ok().and_then(|response| response.usage);
            metrics.model_called(&reference, result.is_ok(), began.elapsed().as_secs_f64(), usage);
            let _ = actor.cast(ExecutionMsg::ModelDone { round, model: reference, result });
        },
        span,
    )));
    enter(state, Phase::AwaitingModel { round });
    Ok(())
}

async fn halt(state: &mut ExecutionState, error_key: &str, message: &str) -> Result<(), ActorProcessingErr> {
    tracing::warn!(execution_id = %state.row.public_id, error_key, "execution halted");
    enter(state, Phase::NeedsAttention);
    state.row.attention_reason = Some(AttentionReason::HaltFailure);
    state.row.error_key = Some(error_key.to_owned());
    emit(
        state,
        Event::AttentionRequired(AttentionRequired {
            reason: AttentionReason::HaltFailure,
            error_key: error_key.to_owned(),
            message: message.to_owned(),
            task_key: None,
            hook: None,
            blocked_task_keys: None,
        }),
    );
    emit(state, Event::TurnStatus(TurnStatus::Failed { error_key: error_key.to_owned(), message: None }));
    save(state, &[]).await
}

async fn model_done(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    model: &str,
    result: Result<ModelResponse, ModelFailure>,
) -> Result<(), ActorProcessingErr> {
    // Real usage replaces the reservation; a failure or an answer without usage keeps it whole.
    let usage = result.as_ref().ok().and_then(|r| r.usage.as_ref()).map(|u| (u.input_tokens, u.output_tokens));
    budget::settle_model_call(state, usage);
    let response = match result {
        Ok(response) => response,
        Err(failure) => return model_failed(myself, state, model, failure).await,
    };
    let round = state.row.round;
    if let Some(usage) = &response.usage {
        emit(
            state,
            Event::Usage(Usage {
                round: Some(round),
                model: model.to_owned(),
                summary_task_key: None,
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
            }),
        );
        compaction::observe_usage(state, round, usage.input_tokens);
    }
    if response.tool_calls.is_empty() {
        let text = response.text.clone().unwrap_or_default();
        state.transcript.push(ChatMessage::Assistant { content: Some(text.clone()), tool_calls: Vec::new() });
        emit(
            state,
            Event::RoundResult(Box::new(RoundResult {
                round,
                model: model.to_owned(),
                text: Some(text.clone()),
                finish_reason: response.finish_reason.clone(),
                tool_calls: Vec::new(),
            })),
        );
        return deliver(myself, state, text).await;
    }
    // A round fans out at most so wide (`docs/executions.md`, "Answer bounds").
    if response.tool_calls.len() > FAN_BOUND {
        let message = format!(
            "too_wide_a_fan: the answer has {} tool calls, and a round fans out at most {FAN_BOUND}; the model is asked nothing more",
            response.tool_calls.len()
        );
        return halt(state, "round_expansion_refused", &message).await;
    }
    // The repeat brake, the round driver's only ceiling (`docs/executions.md`, "Repeat brake").
    if let Some(refused) = brake::check(&state.transcript, &response.tool_calls) {
        let message = format!("{}: {}; the model is asked nothing more", refused.detail, refused.message);
        return halt(state, "round_expansion_refused", &message).await;
    }
    // The transcript holds each call under an id unique in the execution, the model's own kept
    // beside it; the tasks and their events keep the model's (`docs/executions.md`, "Provider
    // call ids").
    let wire_calls = crate::model::wire_call_ids(&state.transcript, round, &response.tool_calls);
    state.transcript.push(ChatMessage::Assistant { content: response.text.clone(), tool_calls: wire_calls });
    // Arguments cut off at the output limit are reported as such, not as malformed.
    let truncated = matches!(response.finish_reason.as_str(), "length" | "max_tokens");
    let tasks: Vec<TaskRow> = response
        .tool_calls
        .iter()
        .enumerate()
        .map(|(i, call)| task_for_call(state, round, i, call, truncated))
        .collect();
    emit(
        state,
        Event::RoundResult(Box::new(RoundResult {
            round,
            model: model.to_owned(),
            text: response.text.clone(),
            finish_reason: response.finish_reason.clone(),
            tool_calls: tasks
                .iter()
                .map(|t| RoundCall {
                    task_key: t.task_key,
                    name: t.callable_name.clone(),
                    tool_call_id: t.tool_call_id.clone(),
                    input: t.tool_input.clone(),
                    runner_executor_public_id: t.target_executor_public_id,
                })
                .collect(),
        })),
    );
    for task in &tasks {
        narrate(state, task);
    }
    for task in &tasks {
        state.pending.insert(task.task_key, task.clone());
    }
    // Parked calls wait for a person while the run stays `running` (`docs/executions.md`,
    // "Approval").
    approval::announce_parks(myself, state, &tasks);
    save(state, &tasks).await?;
    offer_all(state, tasks.iter().filter(|t| t.status == TaskStatus::Dispatched));
    kernel::launch(myself, state, &tasks);
    advance(myself, state).await
}

/// A final answer is ready: the `stop` hook judges it first, and it is delivered once the hook
/// accepts it or is abandoned, or at once when no `stop` hook is declared (`docs/executions.md`,
/// "Lifecycle hooks").
async fn deliver(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    text: String,
) -> Result<(), ActorProcessingErr> {
    if hooks::gate(myself, state, hooks::HookEvent::Stop { output: &text }).await? == hooks::Gate::Held {
        return Ok(());
    }
    state.row.final_text = Some(text);
    enter(state, Phase::Done(End::Completed));
    emit(state, Event::TurnStatus(TurnStatus::Completed {}));
    save(state, &[]).await?;
    tracing::info!(execution_id = %state.row.public_id, rounds = state.row.round, "execution completed");
    Ok(())
}

/// A failed model step: the chain advances to the next available route when the failure allows
/// it (a classifier refusal, or retryable transport/server failures that spent the budget; never a
/// content block, a request error or a 429), emitting `model_change {from, to, reason,
/// category?}` and replacing the step with the same transcript, so completed tool results stay
/// (`docs/executions.md`, "Models"). Otherwise the failure stands and the execution halts with
/// its key; a refusal at the end of the chain stands as `model_refused`.
async fn model_failed(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    model: &str,
    failure: ModelFailure,
) -> Result<(), ActorProcessingErr> {
    let chain = state.declaration.as_deref().map(model_chain).unwrap_or_default();
    let next = match (failure.advance, chain.iter().position(|route| route == model)) {
        (Some(reason), Some(position)) => next_available(state, &chain, position + 1).map(|(index, _)| (reason, index)),
        _ => None,
    };
    if let Some((reason, index)) = next {
        let round = state.row.round;
        tracing::info!(execution_id = %state.row.public_id, from = model, to = %chain[index], %reason, "model fallback");
        emit(
            state,
            Event::ModelChange(ModelChange {
                round,
                from: model.to_owned(),
                to: chain[index].clone(),
                reason,
                error_key: failure.key.to_owned(),
                category: failure.category.map(str::to_owned),
            }),
        );
        state.model_index = index;
        // The same round again, on the next route.
        state.row.round -= 1;
        return start_round(myself, state).await;
    }
    // A request too long for the model is compacted and asked again, when the policy allows.
    if failure.key == "provider_context_overflow" && compaction::overflow(myself, state).await? {
        return Ok(());
    }
    let mut message = format!("{model}: {} (after {} attempt(s))", failure.error, failure.attempts);
    if let Some(quality) = failure.error.finish_quality() {
        message.push_str(&format!("; finish_quality {quality}"));
    }
    halt(state, failure.key, &message).await
}

/// Whether any string or key in `value` holds a NUL, which no tool input may carry.
fn holds_nul(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(map) => map.iter().any(|(key, item)| key.contains('\0') || holds_nul(item)),
        _ => false,
    }
}

/// Turns one model tool call into a task row: settled at once with a per-call failure word, or
/// resolved to its target and passed through the approval stage ([`approval::admit`]), which
/// dispatches it, runs it in-process, parks it in `needs_approval` or denies it.
fn task_for_call(state: &mut ExecutionState, round: i64, index: usize, call: &ToolCall, truncated: bool) -> TaskRow {
    let now = state.fabric.clock.now_ms();
    let default_timeout = i64::try_from(state.fabric.config.execution.default_task_timeout_ms).unwrap_or(i64::MAX);
    // Settled `failed` until the call passes every check below.
    let index = u32::try_from(index).unwrap_or(u32::MAX);
    let mut task = TaskRow {
        status: TaskStatus::Failed,
        settled_at: Some(now),
        ..TaskRow::new(
            state.row.public_id,
            TaskKey::Call { round, index },
            round,
            call.name.clone(),
            default_timeout,
            now,
        )
    };
    if !call.id.is_empty() && call.id.len() <= 128 {
        task.tool_call_id = call.id.clone();
    }
    let fail = |mut task: TaskRow, key: &str, message: String| {
        task.error_key = Some(key.to_owned());
        task.result = Some(json!({"content": message, "is_error": true, "outcome": "failed"}));
        task
    };
    // The frozen declaration is shared, so the budget below may be written while a tool is read.
    let frozen = state.declaration.clone();
    let declared = frozen
        .as_ref()
        .and_then(|d| d.tools.iter().find(|t| t.name == call.name))
        .filter(|_| call.name.len() <= TOOL_NAME_BOUND);
    let Some(tool) = declared else {
        // The record keeps what the model asked for, when it is a readable object.
        if let Ok(input @ Value::Object(_)) = serde_json::from_str::<Value>(&call.arguments)
            && call.arguments.len() <= TOOL_INPUT_BOUND
        {
            task.tool_input = input;
        }
        return fail(task, "unknown_tool", format!("{} is not a declared tool", call.name));
    };
    // Over-bound arguments are refused before they are read: what the answer kept of them is a
    // prefix ([`crate::model::bounds::CALL_ARGUMENTS_KEPT`]).
    if call.arguments.len() > TOOL_INPUT_BOUND {
        return fail(task, "tool_input_too_large", "the arguments are over 64 KiB".into());
    }
    let input: Value = match serde_json::from_str(&call.arguments) {
        Ok(value @ Value::Object(_)) => value,
        Ok(_) | Err(_) if call.arguments.trim().is_empty() => json!({}),
        Err(e) if e.is_eof() && truncated => {
            return fail(
                task,
                "truncated_tool_arguments",
                "the arguments were cut off at the model's output limit; ask for a smaller call".into(),
            );
        }
        // A number no JSON reader can hold (`1e400`) is unencodable input, not bad syntax.
        Err(e) if e.is_data() || e.to_string().contains("number out of range") => {
            return fail(task, "invalid_tool_input", format!("the arguments hold an unencodable value: {e}"));
        }
        _ => return fail(task, "invalid_tool_arguments", "the arguments must be a JSON object".into()),
    };
    if holds_nul(&input) {
        return fail(task, "invalid_tool_input", "the arguments hold a NUL character".into());
    }
    // Aliases run under the kernel wire name with their parameters mapped; the callable name
    // stays beside it as the alias (`docs/declaration.md`, "Aliases").
    let resolved = tool.resolve_call(&input);
    // `tool_call` expands into its frozen target, built from here on as a direct call of it; the
    // row keeps `tool_call` as its callable name (`docs/kernel-tools.md`, "tool_call").
    let Some(declaration) = frozen.as_deref() else { return task };
    let (tool, resolved) = match discovery::expand(declaration, tool, &resolved.input) {
        Ok(None) => (tool, resolved),
        Ok(Some((target, target_input))) => (target, target.resolve_call(target_input)),
        Err((key, message)) => {
            task.tool_input = input;
            return fail(task, key, message);
        }
    };
    task.tool_name = resolved.wire_name;
    task.tool_input = resolved.input;
    // The concrete target is persisted before the approval stage (`docs/executions.md`,
    // "Round driver"); the stage then grants and routes the call, parks it, or denies it
    // (`docs/executions.md`, "Approval").
    task.effect_profile = tool.effect_profile.clone();
    if let Some(route) = &tool.route {
        task.target_executor_public_id = Some(route.runner_executor_public_id);
        if let Some(timeout) = tool.timeout_ms {
            task.timeout_ms = i64::try_from(timeout).unwrap_or(i64::MAX);
        }
    }
    // A call of `ask` is budgeted its hold (`[execution] ask_hold_ms`), which starts once it is
    // granted ([`ask`]).
    ask::budget(state, &mut task);
    // So is a wait on children, its timeout ([`delegation`]).
    delegation::budget(&mut task);
    // `skill` goes where its argument comes from (`docs/kernel-tools.md`, "skill").
    discovery::route_skill(declaration, tool, &mut task);
    // One call is reserved before the approval stage; a spent budget dispatches nothing
    // (`docs/executions.md`, "Budgets").
    if let Err(refusal) = budget::reserve_tool_call(state, &task.callable_name) {
        return fail(task, ErrorCode::BudgetExhausted.as_str(), refusal.message);
    }
    // So is a child's allocation, out of the remainder, before the child can start
    // ([`delegation`], `docs/delegation.md`, "Budgets").
    if let Err(refusal) = delegation::reserve_allocation(state, &task) {
        return fail(task, ErrorCode::BudgetExhausted.as_str(), refusal.message);
    }
    approval::admit(declaration, &mut task, CallOrigin::Model, now, approval::hold_ms(state));
    task
}
