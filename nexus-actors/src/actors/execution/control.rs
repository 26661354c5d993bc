//! Execution control: pause and resume, stop, regeneration and the context estimate
//! (spec/REFERENCE.md 7, "Pause, stop, delete"; 8, "What is frozen, and when"; 12, "Budget";
//! SPEC-000 "Inline execution declarations"; R45–R48).
//!
//! **Pause** `{force?}` (a running execution only, else 409 `not_pausable`): the run turns
//! `paused` and schedules nothing new, no model round and no dispatch. Claimed work finishes and
//! its settlement is recorded. A graceful pause lets an in-flight model call finish and keeps its
//! answer for the resume; a forced pause aborts the call, and the resume asks again under a new
//! round number (the new generation), so a late answer of the aborted call is never read.
//!
//! **Clocks freeze.** While paused, neither a runner task's deadline (the park clock, held by its
//! [`ExecutorActor`](crate::actors::executor::ExecutorActor)) nor an approval hold (held here) runs out.
//! A frozen deadline is stored as [`FROZEN_EPOCH_MS`] plus the milliseconds that were left, so
//! it is durable (a nexus restart while paused stays paused, with its clocks frozen) and no
//! expiry timer can reach it. Resume stores `resume time + what was left`: every open deadline
//! moves forward by exactly the paused time, which `turn_status` reports as `paused_ms`. A runner
//! that claims or extends a task while its execution is paused starts a live clock for it, as any
//! claim does (REFERENCE.md 6.6); resume leaves such a deadline where it is.
//!
//! **Resume** (a paused execution only, else 409 `not_paused`): thaw the clocks, turn `running`,
//! then read the kept answer, or go on where the round stood (settled results go to the model).
//!
//! **Stop** `{force?}`, forced by default at the doors. Calls parked for approval never reached a
//! runner and settle `canceled` at once. A forced stop also cancels every task at the runners
//! (a claimant gets `work_canceled`) and aborts a model call; a graceful stop lets dispatched
//! tasks finish (each bounded by its own deadline) and asks the model nothing more. While runner
//! tasks are open the run is `canceling`; it ends `canceled` (`run_canceled`) when they have
//! settled, or, for a forced stop, when `[execution] stop_drain_ms` has passed. Stopping a
//! finished execution answers it as it is.
//!
//! **Regeneration** makes a new execution of the same input. Without an `execution_declaration`
//! it reuses the original's frozen declaration exactly (tools, environment, approval, models), so
//! profile edits since then do not reach it; a supplied object is validated as on input admission
//! and replaces it whole, resolved and frozen at once (R45–R48). An original that never froze a
//! declaration cannot be regenerated without one: 409 `not_regenerable`.
//!
//! **Context estimate** compiles what the next round would send, the same compilation
//! materialization and a round perform, and writes nothing: it reads the store and never starts
//! the execution's actor (R47).
//!
//! Every transition is narrated durably as `turn_status`: `paused {force, paused_at,
//! aborted_round}`, `running {resumed, paused_ms}`, `canceling {force, draining}` and `canceled
//! {error_key, force, unsettled?}`.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Map, Value, json};
use tokio::task::JoinHandle;
use tracing::Instrument;
use uuid::Uuid;

use nexus_proto::{ErrorCode, Refusal};

use crate::actors::executor::ExecutorMsg;
use crate::actors::root::Fabric;
use crate::declaration::tools::RunnerSelection;
use crate::declaration::{FrozenDeclaration, freeze, validate_execution_declaration, wire_projection};
use crate::model::{ChatMessage, ModelFailure, ModelResponse};
use crate::store::{EventRow, ExecutionRow, InputRow, TaskRow, now_ms};

use super::approval::{self, NEEDS_APPROVAL};
use super::{
    ExecutionMsg, ExecutionState, advance, emit, model_done, result_text, runner_facts, save, task_status_data,
};

/// Where frozen deadlines start, in Unix milliseconds: 10000-01-01T00:00:00Z. A deadline at or
/// past it is frozen, and reads as this epoch plus the milliseconds it had left when its
/// execution paused.
pub const FROZEN_EPOCH_MS: i64 = 253_402_300_800_000;

/// The default of `[execution] stop_drain_ms`: how long a forced stop waits in `canceling` for
/// the runners' tasks to settle, in milliseconds (30 seconds).
pub const STOP_DRAIN_MS: u64 = 30_000;

/// How the estimate counts tokens: the UTF-8 bytes of the compiled request over four, rounded up.
pub const ESTIMATE_BYTES_PER_TOKEN: usize = 4;

/// Whether a stored deadline is frozen (its execution is paused).
pub fn is_frozen(deadline_at: i64) -> bool {
    deadline_at >= FROZEN_EPOCH_MS
}

/// What a frozen deadline had left when it froze, in milliseconds; `None` for a live one.
pub fn frozen_remaining_ms(deadline_at: i64) -> Option<i64> {
    is_frozen(deadline_at).then(|| deadline_at - FROZEN_EPOCH_MS)
}

/// How a pause or a resume moves an open task's deadline. The ExecutorActor applies it to its
/// open tasks ([`ExecutorMsg::ShiftDeadlines`]) and the ExecutionActor to its approval holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadlineShift {
    /// The execution paused at `at` (Unix milliseconds): a live deadline becomes
    /// [`FROZEN_EPOCH_MS`] plus what it had left (never less than zero).
    Freeze {
        /// When the pause began.
        at: i64,
    },
    /// The execution resumed at `at`: a frozen deadline becomes `at` plus what it had left.
    Thaw {
        /// When the resume happened.
        at: i64,
    },
}

impl DeadlineShift {
    /// The moved deadline, or `None` when this shift leaves `deadline_at` as it is (freezing a
    /// frozen deadline, thawing a live one).
    pub fn apply(self, deadline_at: i64) -> Option<i64> {
        match self {
            DeadlineShift::Freeze { at } if !is_frozen(deadline_at) => {
                Some(FROZEN_EPOCH_MS.saturating_add(deadline_at.saturating_sub(at).max(0)))
            }
            DeadlineShift::Thaw { at } => frozen_remaining_ms(deadline_at).map(|left| at.saturating_add(left)),
            DeadlineShift::Freeze { .. } => None,
        }
    }
}

/// The control messages of an ExecutionActor ([`ExecutionMsg::Control`]).
pub enum ControlMsg {
    /// Pause a running execution; answers it `paused`, or 409 `not_pausable`.
    Pause {
        /// Also abort an in-flight model call.
        force: bool,
        /// The execution after the pause.
        reply: RpcReplyPort<Result<ExecutionRow, Refusal>>,
    },
    /// Resume a paused execution; answers it `running`, or 409 `not_paused`.
    Resume {
        /// The execution after the resume.
        reply: RpcReplyPort<Result<ExecutionRow, Refusal>>,
    },
    /// The drain bound of a forced stop passed.
    DrainBound {
        /// The drain it bounds; a later drain makes it stale.
        generation: u64,
    },
}

/// A model answer that arrived during a graceful pause.
struct HeldAnswer {
    model: String,
    result: Result<ModelResponse, ModelFailure>,
}

/// What the ExecutionActor keeps for control. In memory only: what must survive a restart is in
/// the store (the status, frozen deadlines, the `turn_status` events).
#[derive(Default)]
pub struct ControlState {
    /// The answer of a model call that finished during a graceful pause.
    held_answer: Option<HeldAnswer>,
    /// The round whose model call a forced pause aborted; its late answer is dropped.
    aborted_round: Option<i64>,
    /// When the current pause began (Unix milliseconds), once known.
    paused_at: Option<i64>,
    /// Whether the current stop is forced, once known.
    force: Option<bool>,
    /// The drain bound timer of a forced stop, and its generation.
    drain_timer: Option<JoinHandle<()>>,
    drain_generation: u64,
}

impl Drop for ControlState {
    fn drop(&mut self) {
        if let Some(timer) = self.drain_timer.take() {
            timer.abort();
        }
    }
}

type Outcome = Result<Result<ExecutionRow, Refusal>, ActorProcessingErr>;

/// Sends `outcome` to `reply`. A store failure answers `internal` and is returned, so the actor
/// stops and reloads from the store on next use.
///
/// # Errors
/// The failure inside `outcome`.
pub(super) fn answer(
    reply: RpcReplyPort<Result<ExecutionRow, Refusal>>,
    outcome: Outcome,
) -> Result<(), ActorProcessingErr> {
    match outcome {
        Ok(answer) => {
            let _ = reply.send(answer);
            Ok(())
        }
        Err(e) => {
            let _ = reply.send(Err(Refusal::new(
                ErrorCode::Internal,
                format!("could not record the change: {e}; read the execution and retry"),
            )));
            Err(e)
        }
    }
}

/// Handles one [`ControlMsg`].
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn handle(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    msg: ControlMsg,
) -> Result<(), ActorProcessingErr> {
    match msg {
        ControlMsg::Pause { force, reply } => {
            let outcome = pause(myself, state, force).await;
            answer(reply, outcome)
        }
        ControlMsg::Resume { reply } => {
            let outcome = resume(myself, state).await;
            answer(reply, outcome)
        }
        ControlMsg::DrainBound { generation } => {
            if state.row.status != "canceling" || generation != state.control.drain_generation {
                return Ok(());
            }
            let unsettled: Vec<String> = open_tasks(state).await?.into_iter().map(|t| t.task_key).collect();
            tracing::warn!(execution_id = %state.row.public_id, unsettled = unsettled.len(), "stop drain bound passed");
            finish(state, Some(unsettled)).await
        }
    }
}

/// Keeps the answer of a model call that finished during a graceful pause; the resume reads it.
/// The answer of a call that a forced pause aborted, or of an older round, is dropped.
pub(super) fn hold_answer(
    state: &mut ExecutionState,
    round: i64,
    model: String,
    result: Result<ModelResponse, ModelFailure>,
) {
    if round != state.row.round || state.control.aborted_round == Some(round) {
        return;
    }
    state.model_call = None;
    state.control.held_answer = Some(HeldAnswer { model, result });
}

fn refuse(code: ErrorCode, state: &ExecutionState, what: &str) -> Outcome {
    Ok(Err(Refusal::new(code, format!("execution {} is {}; {what}", state.row.public_id, state.row.status))))
}

async fn pause(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState, force: bool) -> Outcome {
    if state.row.status != "running" {
        return refuse(ErrorCode::NotPausable, state, "only a running execution pauses");
    }
    let now = now_ms();
    let mut aborted_round = None;
    if force && let Some(call) = state.model_call.take() {
        call.abort();
        aborted_round = Some(state.row.round);
    }
    state.control.aborted_round = aborted_round;
    state.control.paused_at = Some(now);
    // The status is durable before the clocks freeze: a crash between the two leaves live
    // clocks under a pause, never frozen ones under a running execution.
    state.row.status = "paused".into();
    emit(
        state,
        "turn_status",
        json!({"status": "paused", "force": force, "paused_at": now, "aborted_round": aborted_round}),
    );
    save(state, &[]).await?;
    shift_clocks(myself, state, DeadlineShift::Freeze { at: now }).await?;
    tracing::info!(execution_id = %state.row.public_id, force, "execution paused");
    Ok(Ok(state.row.clone()))
}

async fn resume(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState) -> Outcome {
    if state.row.status != "paused" {
        return refuse(ErrorCode::NotPaused, state, "only a paused execution resumes");
    }
    let now = now_ms();
    let paused_at = match state.control.paused_at {
        Some(at) => at,
        None => last_turn_status(state, "paused").await?.and_then(|e| e.data["paused_at"].as_i64()).unwrap_or(now),
    };
    // The clocks thaw before the status is durable: a crash between the two leaves a paused
    // execution with live clocks, never a running one with frozen clocks.
    shift_clocks(myself, state, DeadlineShift::Thaw { at: now }).await?;
    state.control.aborted_round = None;
    state.control.paused_at = None;
    state.row.status = "running".into();
    let paused_ms = now.saturating_sub(paused_at).max(0);
    emit(state, "turn_status", json!({"status": "running", "resumed": true, "paused_ms": paused_ms}));
    save(state, &[]).await?;
    tracing::info!(execution_id = %state.row.public_id, paused_ms, "execution resumed");
    match state.control.held_answer.take() {
        Some(held) => model_done(myself, state, &held.model, held.result).await?,
        // Go on where the round stood; a call a forced pause aborted (or a restart lost) is
        // asked again under the next round number.
        None => advance(myself, state).await?,
    }
    Ok(Ok(state.row.clone()))
}

/// Moves every open deadline of the execution: its approval holds here (durably, timers
/// following), and its runner tasks in their executors ([`ExecutorMsg::ShiftDeadlines`]).
async fn shift_clocks(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    shift: DeadlineShift,
) -> Result<(), ActorProcessingErr> {
    let parked: Vec<TaskRow> = state.pending.values().filter(|t| t.status == NEEDS_APPROVAL).cloned().collect();
    for mut task in parked {
        let Some(deadline_at) = shift.apply(task.deadline_at) else { continue };
        task.deadline_at = deadline_at;
        if state.fabric.store.decide_task(&task).await? {
            state.pending.insert(task.task_key.clone(), task);
        }
    }
    match shift {
        DeadlineShift::Freeze { .. } => {
            for (_, hold) in state.holds.drain() {
                hold.abort();
            }
        }
        // Every parked task's hold runs again, to its new deadline.
        DeadlineShift::Thaw { .. } => approval::rearm(myself, state),
    }
    let targets: BTreeSet<Uuid> = open_tasks(state).await?.iter().filter_map(|t| t.target_executor_public_id).collect();
    for target in targets {
        match state.root.executor(target).await {
            Ok(executor) => {
                let _ = executor.cast(ExecutorMsg::ShiftDeadlines { run: state.row.public_id, shift });
            }
            Err(refusal) => {
                tracing::warn!(runner_id = %target, code = %refusal.code, "cannot move deadlines at the runner's inbox")
            }
        }
    }
    Ok(())
}

/// The execution's unsettled tasks, as the store has them: the current round's and any other
/// (hooks, the summarizer).
async fn open_tasks(state: &ExecutionState) -> Result<Vec<TaskRow>, ActorProcessingErr> {
    let tasks = state.fabric.store.tasks_of(state.row.public_id).await?;
    Ok(tasks.into_iter().filter(|t| !t.is_settled()).collect())
}

/// Whether a task is in a runner's hands: dispatched to its inbox or claimed there.
fn at_runner(task: &TaskRow) -> bool {
    task.target_executor_public_id.is_some() && matches!(task.status.as_str(), "dispatched" | "running")
}

async fn last_turn_status(state: &ExecutionState, status: &str) -> Result<Option<EventRow>, ActorProcessingErr> {
    let events = state.fabric.store.events_after(state.row.public_id, 0, i64::MAX).await?;
    Ok(events.into_iter().rev().find(|e| e.event_type == "turn_status" && e.data["status"] == status))
}

/// Stops the execution ([module docs](self)). Answers it `canceled`, or `canceling` while runner
/// tasks drain.
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn stop(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState, force: bool) -> Outcome {
    match state.row.status.as_str() {
        "completed" | "canceled" => return Ok(Ok(state.row.clone())),
        // A forced stop overtakes a graceful drain; anything else leaves the drain as it is.
        "canceling" => {
            if force && state.control.force != Some(true) {
                state.control.force = Some(true);
                let draining = cancel_at_runners(state).await?;
                emit(state, "turn_status", json!({"status": "canceling", "force": true, "draining": draining}));
                save(state, &[]).await?;
                arm_drain_bound(myself, state);
            }
            return Ok(Ok(state.row.clone()));
        }
        _ => {}
    }
    let now = now_ms();
    if state.row.status == "paused" {
        // The drain runs on live clocks: a graceful stop waits for deadlines that can pass.
        shift_clocks(myself, state, DeadlineShift::Thaw { at: now }).await?;
    }
    state.control.held_answer = None;
    state.control.aborted_round = None;
    state.control.paused_at = None;
    state.control.force = Some(force);
    if let Some(call) = state.model_call.take() {
        call.abort();
    }
    // Waiting work never reached a runner: calls parked for approval (and anything else
    // unsettled outside a runner) settle canceled now.
    for mut task in open_tasks(state).await?.into_iter().filter(|t| !at_runner(t)) {
        let parked = task.status == NEEDS_APPROVAL;
        task.status = "canceled".into();
        task.error_key = Some("task_canceled".into());
        task.settled_at = Some(now);
        // A parked row is written only while it is still parked (a decision may have won).
        let written = if parked {
            state.fabric.store.decide_task(&task).await?
        } else {
            state.fabric.store.update_task(&task).await?;
            true
        };
        if let Some(timer) = state.holds.remove(&task.task_key) {
            timer.abort();
        }
        if written {
            emit(state, "task_status", task_status_data(&task));
            if state.pending.contains_key(&task.task_key) {
                state.pending.insert(task.task_key.clone(), task);
            }
        }
    }
    let draining: Vec<String> = if force {
        cancel_at_runners(state).await?
    } else {
        open_tasks(state).await?.into_iter().filter(at_runner).map(|t| t.task_key).collect()
    };
    if draining.is_empty() {
        finish(state, None).await?;
        return Ok(Ok(state.row.clone()));
    }
    state.row.status = "canceling".into();
    emit(state, "turn_status", json!({"status": "canceling", "force": force, "draining": draining}));
    save(state, &[]).await?;
    if force {
        arm_drain_bound(myself, state);
    }
    tracing::info!(execution_id = %state.row.public_id, force, draining = draining.len(), "execution canceling");
    Ok(Ok(state.row.clone()))
}

/// Cancels every task of the execution at its runner's inbox: it settles `canceled`
/// (`task_canceled`) there, a claimant gets `work_canceled`, and the settlement comes back as
/// [`ExecutionMsg::TaskSettled`]. Answers the keys of the tasks it asked to cancel.
async fn cancel_at_runners(state: &mut ExecutionState) -> Result<Vec<String>, ActorProcessingErr> {
    let open: Vec<TaskRow> = open_tasks(state).await?.into_iter().filter(at_runner).collect();
    for task in &open {
        let Some(target) = task.target_executor_public_id else { continue };
        match state.root.executor(target).await {
            Ok(executor) => {
                let _ = executor.cast(ExecutorMsg::Cancel { run: task.run_public_id, task_key: task.task_key.clone() });
            }
            // The drain bound ends the stop; the task settles by its deadline at the latest.
            Err(refusal) => {
                tracing::warn!(runner_id = %target, code = %refusal.code, "cannot cancel at the runner's inbox")
            }
        }
    }
    Ok(open.into_iter().map(|t| t.task_key).collect())
}

fn arm_drain_bound(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState) {
    state.control.drain_generation += 1;
    let generation = state.control.drain_generation;
    let wait = Duration::from_millis(state.fabric.config.execution.stop_drain_ms);
    let actor = myself.clone();
    let span = tracing::debug_span!("stop_drain", execution_id = %state.row.public_id);
    let timer = tokio::spawn(
        async move {
            tokio::time::sleep(wait).await;
            let _ = actor.cast(ExecutionMsg::Control(ControlMsg::DrainBound { generation }));
        }
        .instrument(span),
    );
    if let Some(old) = state.control.drain_timer.replace(timer) {
        old.abort();
    }
}

/// Ends the stop: `canceled` with `run_canceled`. `unsettled` names the tasks still open when a
/// drain bound ended it.
async fn finish(state: &mut ExecutionState, unsettled: Option<Vec<String>>) -> Result<(), ActorProcessingErr> {
    if let Some(timer) = state.control.drain_timer.take() {
        timer.abort();
    }
    state.row.status = "canceled".into();
    state.row.error_key = Some("run_canceled".into());
    state.row.attention_reason = None;
    let mut data = json!({"status": "canceled", "error_key": "run_canceled", "force": state.control.force});
    if let Some(unsettled) = unsettled {
        data["unsettled"] = json!(unsettled);
    }
    emit(state, "turn_status", data);
    save(state, &[]).await?;
    tracing::info!(execution_id = %state.row.public_id, "execution stopped");
    Ok(())
}

/// A task settled while the stop drains: it is narrated (its result reaches no model), and the
/// stop ends once no runner task is open.
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn settled_while_canceling(
    state: &mut ExecutionState,
    task: TaskRow,
) -> Result<(), ActorProcessingErr> {
    let narrate = match state.pending.get(&task.task_key) {
        Some(held) => !held.is_settled(),
        None => true,
    };
    if narrate {
        emit(state, "task_status", task_status_data(&task));
        if state.pending.contains_key(&task.task_key) {
            state.pending.insert(task.task_key.clone(), task);
        }
        save(state, &[]).await?;
    }
    if !open_tasks(state).await?.iter().any(at_runner) {
        finish(state, None).await?;
    }
    Ok(())
}

/// After a restart that found the execution `canceling`: end the stop when nothing is open;
/// otherwise a forced stop cancels what is still open again and re-arms its bound, and a
/// graceful one waits for its tasks.
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn resume_drain(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
) -> Result<(), ActorProcessingErr> {
    if !open_tasks(state).await?.iter().any(at_runner) {
        return finish(state, None).await;
    }
    if state.control.drain_timer.is_some() {
        return Ok(());
    }
    let force = match state.control.force {
        Some(force) => force,
        None => last_turn_status(state, "canceling").await?.and_then(|e| e.data["force"].as_bool()).unwrap_or(true),
    };
    state.control.force = Some(force);
    if force {
        cancel_at_runners(state).await?;
        arm_drain_bound(myself, state);
    }
    Ok(())
}

// ---- declarations: regeneration and the estimate ------------------------------------------------

fn internal(e: impl std::fmt::Display) -> Refusal {
    Refusal::new(ErrorCode::Internal, format!("the store failed: {e}"))
}

/// Resolves the declaration an execution of `input` would freeze, without writing: `supplied`
/// (an inline `execution_declaration`, validated as on input admission), else the input's own
/// inline declaration, else the answering member's standing profile; assembled against the
/// runners' current facts with the input's runner selection and `tool_names` (the resolution of
/// materialization, REFERENCE.md 8).
///
/// # Errors
/// 422 `validation_failed` (a malformed declaration, no declaration at all, no model to run),
/// the assembly's refusals (`runner_not_declared`, `tool_not_served`, ...), `internal` on a store
/// failure.
pub async fn resolve(
    fabric: &Fabric,
    input: &InputRow,
    supplied: Option<&Value>,
) -> Result<FrozenDeclaration, Refusal> {
    let models = &fabric.models;
    let check = |reference: &str| models.check(reference);
    let inline = supplied.or(input.execution_declaration.as_ref());
    let (configuration, system_prompt, summarizer) = match inline {
        Some(inline) => {
            let object = inline
                .as_object()
                .ok_or_else(|| Refusal::new(ErrorCode::ValidationFailed, "execution_declaration: must be an object"))?;
            let validated = validate_execution_declaration(object, &check)?;
            (validated.configuration, validated.system_prompt, validated.summarizer)
        }
        None => {
            let profile = fabric.store.profile(input.member_public_id).await.map_err(internal)?.unwrap_or_default();
            let configuration = profile.configuration.clone().ok_or_else(|| {
                Refusal::new(
                    ErrorCode::ValidationFailed,
                    "configuration: the profile has not declared one; PUT /agent_api/v1/profile/configuration first",
                )
            })?;
            (configuration, profile.system_prompt, profile.summarizer)
        }
    };
    let runners = runner_facts(&fabric.store, &configuration).await?;
    let tool_names: Option<Vec<String>> =
        input.tool_names.as_ref().and_then(|v| serde_json::from_value(v.clone()).ok());
    let frozen = freeze(
        &configuration,
        system_prompt,
        RunnerSelection::or_first_eligible(input.runner_executor_public_id),
        &runners,
        tool_names.as_deref(),
    )?
    .with_summarizer(summarizer);
    if frozen.default_model.is_none() {
        return Err(Refusal::new(ErrorCode::ValidationFailed, "default_model: the declaration names no model to run"));
    }
    Ok(frozen)
}

/// The optional `execution_declaration` of a regenerate or estimate body: `null`, absent, `{}`,
/// or `{execution_declaration: {...} | null}`. Any other field is refused: a misspelled one would
/// otherwise reuse the frozen declaration without a word.
///
/// # Errors
/// 400 `parameter_invalid` for a body that is not an object or names another field.
pub fn supplied_declaration(body: &Value) -> Result<Option<Value>, Refusal> {
    crate::doors::api::known_fields(body, &["execution_declaration"])?;
    Ok(body.get("execution_declaration").filter(|v| !v.is_null()).cloned())
}

/// Creates the regeneration of `original` (REFERENCE.md 8, "Regeneration"; R48): a new `pending`
/// execution of the same input whose declaration is frozen already, the original's own when
/// `supplied` is `None`, else `supplied` resolved and frozen now. Its first event is `turn_status
/// {status: pending, regenerated_from, declaration: reused|replaced, declaration_digest}`. Nothing
/// of the original changes. Answers the new row; the caller starts its actor.
///
/// # Errors
/// 409 `not_regenerable` when the original froze no declaration and none is supplied; the
/// refusals of [`resolve`] for a supplied one; `internal` on a store failure.
pub async fn regenerate(
    fabric: &Fabric,
    original: &ExecutionRow,
    supplied: Option<&Value>,
) -> Result<ExecutionRow, Refusal> {
    let (declaration, how) = match supplied {
        Some(object) => {
            let input = fabric
                .store
                .input(original.input_public_id)
                .await
                .map_err(internal)?
                .ok_or_else(|| Refusal::new(ErrorCode::NotFound, "the execution's input is gone"))?;
            let frozen = resolve(fabric, &input, Some(object)).await?;
            (serde_json::to_value(&frozen).map_err(internal)?, "replaced")
        }
        None => match &original.declaration {
            Some(frozen) => (frozen.clone(), "reused"),
            None => {
                return Err(Refusal::new(
                    ErrorCode::NotRegenerable,
                    format!(
                        "execution {} never froze a declaration ({}); supply an execution_declaration to regenerate it",
                        original.public_id, original.status
                    ),
                ));
            }
        },
    };
    let now = now_ms();
    let row = ExecutionRow {
        public_id: Uuid::new_v4(),
        conversation_public_id: original.conversation_public_id,
        input_public_id: original.input_public_id,
        member_public_id: original.member_public_id,
        status: "pending".into(),
        attention_reason: None,
        transcript: json!([]),
        round: 0,
        final_text: None,
        error_key: None,
        event_seq: 1,
        created_at: now,
        updated_at: now,
        declaration: Some(declaration),
    };
    let event = EventRow {
        seq: 1,
        event_type: "turn_status".into(),
        data: json!({
            "status": "pending",
            "regenerated_from": original.public_id,
            "declaration": how,
            "declaration_digest": row.declaration.as_ref().map(|d| d["digest"].clone()),
        }),
        at: now,
    };
    fabric.store.create_execution(&row, &[event]).await.map_err(internal)?;
    tracing::info!(execution_id = %row.public_id, from = %original.public_id, how, "execution regenerated");
    Ok(row)
}

/// The context estimate of `row` (R47): compiles the request the next round would send, the
/// transcript with the settled results it has not read yet plus the offered tools, under the
/// frozen declaration, or `supplied` instead, or for an execution not yet materialized the
/// declaration it would freeze now; and measures it. Reads the store only: nothing is written,
/// reserved or started.
///
/// Answers `{execution_public_id, status, round, model, declaration: frozen|resolved|supplied,
/// declaration_digest, messages, tools, open_calls, bytes: {documents, transcript, tools, total},
/// estimated_tokens: {documents, transcript, tools, total}, estimator: {method, bytes_per_token,
/// exact}}`. `documents` are the system-role messages (the system prompt), `transcript` the
/// others; `total` is the whole request's canonical JSON. `open_calls` counts calls of the round
/// whose results are not in yet (the next round also carries them). Tokens are estimated as the
/// UTF-8 bytes over [`ESTIMATE_BYTES_PER_TOKEN`], rounded up: near what BPE tokenizers give for
/// English text and JSON, but no tokenizer's count, so it never gates a round (REFERENCE.md 12:
/// the window gate refuses only on an exact count, `estimated_input_exceeds_model_limit`).
///
/// # Errors
/// The refusals of [`resolve`] (422 `validation_failed` for a malformed supplied declaration);
/// `internal` on a store failure.
pub async fn estimate(fabric: &Fabric, row: &ExecutionRow, supplied: Option<&Value>) -> Result<Value, Refusal> {
    let store = &fabric.store;
    let input = store
        .input(row.input_public_id)
        .await
        .map_err(internal)?
        .ok_or_else(|| Refusal::new(ErrorCode::NotFound, "the execution's input is gone"))?;
    let materialized = row.declaration.is_some() && row.status != "pending";
    let (declaration, source) = match (supplied, &row.declaration) {
        (Some(object), _) => (resolve(fabric, &input, Some(object)).await?, "supplied"),
        (None, Some(frozen)) => (serde_json::from_value(frozen.clone()).map_err(internal)?, "frozen"),
        (None, None) => (resolve(fabric, &input, None).await?, "resolved"),
    };
    let mut transcript: Vec<ChatMessage> = if materialized {
        serde_json::from_value(row.transcript.clone()).map_err(internal)?
    } else {
        vec![ChatMessage::User { content: input.text.clone() }]
    };
    // The system prompt is the declaration's: a supplied one replaces the frozen one.
    if !materialized || supplied.is_some() {
        transcript.retain(|m| !matches!(m, ChatMessage::System { .. }));
        if let Some(content) =
            declaration.system_prompt.as_ref().and_then(|doc| doc["content"].as_str()).filter(|c| !c.is_empty())
        {
            transcript.insert(0, ChatMessage::System { content: content.to_owned() });
        }
    }
    let mut open_calls = 0;
    if materialized {
        let answered: HashSet<String> = transcript
            .iter()
            .filter_map(|m| match m {
                ChatMessage::Tool { tool_call_id, .. } => Some(tool_call_id.clone()),
                _ => None,
            })
            .collect();
        let mut unread: Vec<TaskRow> = store
            .tasks_of(row.public_id)
            .await
            .map_err(internal)?
            .into_iter()
            // The round's model calls (`r{round}t{i}`); hook tasks never reach the model.
            .filter(|t| t.round == row.round && t.task_key.starts_with(&format!("r{}t", t.round)))
            .filter(|t| !answered.contains(&t.tool_call_id))
            .collect();
        unread.sort_by_key(|t| t.task_key.trim_start_matches(&format!("r{}t", t.round)).parse::<u64>().unwrap_or(0));
        for task in unread {
            if task.is_settled() {
                transcript
                    .push(ChatMessage::Tool { tool_call_id: task.tool_call_id.clone(), content: result_text(&task) });
            } else {
                open_calls += 1;
            }
        }
    }
    let tools = wire_projection(&declaration.tools);
    let mut measured = measure(&transcript, &tools).map_err(internal)?;
    if let Some(object) = measured.as_object_mut() {
        let extra = json!({
            "execution_public_id": row.public_id,
            "status": row.status,
            "round": row.round + 1,
            "model": declaration.default_model,
            "declaration": source,
            "declaration_digest": declaration.digest,
            "open_calls": open_calls,
        });
        if let Value::Object(extra) = extra {
            object.extend(extra);
        }
    }
    Ok(measured)
}

/// Measures a compiled request: `{messages, tools, bytes:{documents, transcript, tools, total},
/// estimated_tokens:{...}, estimator}` (see [`estimate`]).
fn measure(messages: &[ChatMessage], tools: &[Value]) -> Result<Value, serde_json::Error> {
    let mut documents = 0;
    let mut conversation = 0;
    for message in messages {
        let bytes = serde_json::to_vec(message)?.len();
        if matches!(message, ChatMessage::System { .. }) {
            documents += bytes;
        } else {
            conversation += bytes;
        }
    }
    let tool_bytes = serde_json::to_vec(tools)?.len();
    let total = serde_json::to_vec(&json!({"messages": messages, "tools": tools}))?.len();
    let tokens = |bytes: usize| bytes.div_ceil(ESTIMATE_BYTES_PER_TOKEN);
    let mut bytes = Map::new();
    let mut estimated = Map::new();
    for (part, size) in
        [("documents", documents), ("transcript", conversation), ("tools", tool_bytes), ("total", total)]
    {
        bytes.insert(part.into(), json!(size));
        estimated.insert(part.into(), json!(tokens(size)));
    }
    Ok(json!({
        "messages": messages.len(),
        "tools": tools.len(),
        "bytes": bytes,
        "estimated_tokens": estimated,
        "estimator": {
            "method": "utf8_bytes_div_4",
            "bytes_per_token": ESTIMATE_BYTES_PER_TOKEN,
            "exact": false,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_freezes_what_is_left_and_a_resume_shifts_by_the_paused_time() {
        let paused_at = 1_000_000;
        let deadline = paused_at + 7_500;
        let frozen = DeadlineShift::Freeze { at: paused_at }.apply(deadline).expect("frozen");
        assert!(is_frozen(frozen));
        assert_eq!(frozen_remaining_ms(frozen), Some(7_500));
        // Freezing twice (a repeated message) changes nothing; thawing a live deadline neither.
        assert_eq!(DeadlineShift::Freeze { at: paused_at + 50 }.apply(frozen), None);
        assert_eq!(DeadlineShift::Thaw { at: paused_at }.apply(deadline), None);
        let resumed_at = paused_at + 60_000;
        let thawed = DeadlineShift::Thaw { at: resumed_at }.apply(frozen).expect("thawed");
        assert_eq!(thawed - deadline, resumed_at - paused_at, "moved forward by exactly the paused time");
        // A deadline that had already passed when the pause began has nothing left.
        let late = DeadlineShift::Freeze { at: paused_at }.apply(paused_at - 10).expect("frozen");
        assert_eq!(DeadlineShift::Thaw { at: resumed_at }.apply(late), Some(resumed_at));
        assert!(!is_frozen(i64::from(i32::MAX) * 1_000), "a live deadline in 2038 is not frozen");
    }

    #[test]
    fn the_estimate_measures_documents_transcript_and_tools_in_bytes_and_quarter_tokens() {
        let messages = vec![
            ChatMessage::System { content: "You are terse.".into() },
            ChatMessage::User { content: "count the lines".into() },
        ];
        let tools = vec![json!({"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}})];
        let measured = measure(&messages, &tools).expect("measured");
        let system = serde_json::to_vec(&messages[0]).expect("json").len();
        let user = serde_json::to_vec(&messages[1]).expect("json").len();
        let tool_bytes = serde_json::to_vec(&tools).expect("json").len();
        assert_eq!(measured["bytes"]["documents"], json!(system));
        assert_eq!(measured["bytes"]["transcript"], json!(user));
        assert_eq!(measured["bytes"]["tools"], json!(tool_bytes));
        let total = measured["bytes"]["total"].as_u64().expect("total");
        assert!(total as usize > system + user + tool_bytes, "the total carries the request's framing");
        assert_eq!(measured["estimated_tokens"]["total"], json!(total.div_ceil(4)));
        assert_eq!(measured["estimated_tokens"]["documents"], json!(system.div_ceil(4)));
        assert_eq!((measured["messages"].as_u64(), measured["tools"].as_u64()), (Some(2), Some(1)));
        assert_eq!(measured["estimator"]["exact"], false);
    }

    #[test]
    fn regenerate_and_estimate_bodies() {
        assert_eq!(supplied_declaration(&Value::Null).ok(), Some(None));
        assert_eq!(supplied_declaration(&json!({})).ok(), Some(None));
        assert_eq!(supplied_declaration(&json!({"execution_declaration": null})).ok(), Some(None));
        let declaration = json!({"default_model": "scripted/x"});
        assert_eq!(
            supplied_declaration(&json!({"execution_declaration": declaration.clone()})).ok(),
            Some(Some(declaration.clone()))
        );
        for bad in [json!([1]), json!({"execution_declaraton": declaration.clone()}), json!({"other": 1})] {
            assert_eq!(supplied_declaration(&bad).unwrap_err().code, "parameter_invalid", "{bad}");
        }
    }
}
