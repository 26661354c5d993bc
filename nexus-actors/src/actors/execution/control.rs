//! Execution control: pause and resume, stop, regeneration and the context estimate
//! (`docs/executions.md`, "Control"; `docs/declaration.md`, "Freezing" and "Inline declarations").
//!
//! **Pause** `{force?}` (a running execution only, else 409 `not_pausable`): the run turns
//! `paused` and schedules nothing new, no model round and no dispatch. Claimed work finishes and
//! its settlement is recorded. A graceful pause lets an in-flight model call finish and keeps its
//! answer for the resume; a forced pause aborts the call, and the resume asks again under a new
//! round number (the new generation), so a late answer of the aborted call is never read.
//!
//! **Clocks freeze.** While paused, neither a runner task's deadline (the park clock, held by its
//! [`ExecutorActor`](crate::actors::executor::ExecutorActor)) nor an approval hold or the hold of a
//! call of `ask` awaiting its answer (held here) runs out. A frozen deadline is stored as
//! [`FROZEN_EPOCH_MS`] plus the milliseconds that were left, so it is durable (a nexus restart
//! while paused stays paused, with its clocks frozen) and no expiry timer can reach it. Resume
//! stores `resume time + what was left`: every open deadline moves forward by exactly the paused
//! time, which `turn_status` reports as `paused_ms`. A runner that claims a task while its
//! execution is paused starts a live clock for it, as any claim does (`docs/protocol.md`, "Claim");
//! resume leaves such a deadline where it is. Extending a frozen deadline is refused
//! `not_extendable` (`docs/protocol.md`, "Extend"): it does not run.
//!
//! **Resume** (a paused execution only, else 409 `not_paused`): thaw the clocks, turn `running`,
//! then read the kept answer, or go on where the round stood (settled results go to the model).
//!
//! **Stop** `{force?}`, forced by default at the doors. Calls parked for approval, and calls of
//! `ask` awaiting an answer, never reached a runner and settle `canceled` at once. A forced stop
//! also cancels every task at the runners (a claimant gets `work_canceled`) and aborts a model
//! call; a graceful stop lets dispatched tasks finish (each bounded by its own deadline) and asks
//! the model nothing more. While runner tasks are open the run is `canceling`; it ends `canceled`
//! (`run_canceled`) when they have settled, or, for a forced stop, when `[execution] stop_drain_ms`
//! has passed. Stopping a finished execution answers it as it is.
//!
//! **Regeneration** makes a new execution of the same input. Without an `execution_declaration`
//! it reuses the original's frozen declaration exactly (tools, environment, approval, models), so
//! profile edits since then do not reach it; a supplied object is validated as on input admission
//! and replaces it whole, resolved and frozen at once. An original that never froze a
//! declaration cannot be regenerated without one: 409 `not_regenerable`.
//!
//! **Context estimate** compiles what the next round would send, the same compilation
//! materialization and a round perform, and writes nothing: it reads the store and never starts
//! the execution's actor.
//!
//! Every transition is narrated durably as `turn_status`: `paused {force, paused_at,
//! aborted_round}`, `running {resumed, paused_ms}`, `canceling {force, draining}` and `canceled
//! {error_key, force, unsettled?}`.

use std::collections::BTreeSet;
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;
use tracing::Instrument;

use nexus_proto::{ErrorCode, Refusal, RunStatus, RunnerId, TaskKey, TaskStatus};

use crate::model::{ModelFailure, ModelResponse};
use crate::store::event::TurnStatus;
use crate::store::{Event, ExecutionRow, TaskRow};

use super::approval;
use super::phase::{End, Phase};
use super::{ExecutionMsg, ExecutionState, advance, answer, emit, enter, model_done, narrate, resumed, save};

pub use crate::clock::{FROZEN_EPOCH_MS, frozen_remaining_ms, is_frozen};

mod decide;

pub use decide::{DeadlineShift, StopPlan, at_runner, paused_ms};

/// How the estimate counts tokens: the UTF-8 bytes of the compiled request over four, rounded up.
pub const ESTIMATE_BYTES_PER_TOKEN: usize = 4;

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
            answer(reply, outcome, "the pause", "the execution")
        }
        ControlMsg::Resume { reply } => {
            let outcome = resume(myself, state).await;
            answer(reply, outcome, "the resume", "the execution")
        }
        ControlMsg::DrainBound { generation } => {
            if state.phase != Phase::Canceling || generation != state.control.drain_generation {
                return Ok(());
            }
            let unsettled: Vec<TaskKey> = open_tasks(state).await?.into_iter().map(|t| t.task_key).collect();
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
    if !state.phase.is_working() {
        return refuse(ErrorCode::NotPausable, state, "only a running execution pauses");
    }
    let now = state.fabric.clock.now_ms();
    let mut aborted_round = None;
    if force && let Some(call) = state.model_call.take() {
        call.abort();
        aborted_round = Some(state.row.round);
    }
    state.control.aborted_round = aborted_round;
    state.control.paused_at = Some(now);
    // The status is durable before the clocks freeze: a crash between the two leaves live
    // clocks under a pause, never frozen ones under a running execution.
    enter(state, Phase::Paused);
    emit(state, Event::TurnStatus(TurnStatus::Paused { force, paused_at: now, aborted_round }));
    save(state, &[]).await?;
    shift_clocks(myself, state, DeadlineShift::Freeze { at: now }).await?;
    tracing::info!(execution_id = %state.row.public_id, force, "execution paused");
    Ok(Ok(state.row.clone()))
}

async fn resume(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState) -> Outcome {
    if state.phase != Phase::Paused {
        return refuse(ErrorCode::NotPaused, state, "only a paused execution resumes");
    }
    let now = state.fabric.clock.now_ms();
    let paused_at = match state.control.paused_at {
        Some(at) => at,
        None => last_turn_status(state, |status| match status {
            TurnStatus::Paused { paused_at, .. } => Some(*paused_at),
            _ => None,
        })
        .await?
        .unwrap_or(now),
    };
    // The clocks thaw before the status is durable: a crash between the two leaves a paused
    // execution with live clocks, never a running one with frozen clocks.
    shift_clocks(myself, state, DeadlineShift::Thaw { at: now }).await?;
    state.control.aborted_round = None;
    state.control.paused_at = None;
    let working = resumed(state);
    enter(state, working);
    let paused_ms = paused_ms(paused_at, now);
    emit(state, Event::TurnStatus(TurnStatus::Running { resumed: Some(true), paused_ms: Some(paused_ms) }));
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

/// Moves every open deadline of the execution: its holds here (approval holds and the holds of
/// calls of `ask` awaiting an answer; durably, timers following), and its runner tasks in their
/// executors ([`ExecutorMsg::ShiftDeadlines`]).
async fn shift_clocks(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    shift: DeadlineShift,
) -> Result<(), ActorProcessingErr> {
    let parked: Vec<TaskRow> = state.pending.values().filter(|t| approval::is_held(t.status)).cloned().collect();
    for mut task in parked {
        let Some(deadline_at) = shift.apply(task.deadline_at) else { continue };
        task.deadline_at = deadline_at;
        if state.fabric.store.decide_task_from(&task, task.status).await? {
            state.pending.insert(task.task_key, task);
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
    let targets: BTreeSet<RunnerId> =
        open_tasks(state).await?.iter().filter_map(|t| t.target_executor_public_id).collect();
    for target in targets {
        if let Err(error) = state.root.executor(target).shift_deadlines(state.row.public_id, shift).await {
            tracing::warn!(runner_id = %target, %error, "cannot move deadlines at the runner's inbox");
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

/// What `pick` reads off the latest `turn_status` it accepts, from the event log.
async fn last_turn_status<T>(
    state: &ExecutionState,
    pick: impl Fn(&TurnStatus) -> Option<T>,
) -> Result<Option<T>, ActorProcessingErr> {
    let events = state.fabric.store.events_after(state.row.public_id, 0, i64::MAX).await?;
    Ok(events.iter().rev().filter_map(|e| e.event.as_turn_status()).find_map(pick))
}

/// Stops the execution ([module docs](self)). Answers it `canceled`, or `canceling` while runner
/// tasks drain.
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn stop(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState, force: bool) -> Outcome {
    match state.row.status {
        RunStatus::Completed | RunStatus::Canceled => return Ok(Ok(state.row.clone())),
        // A forced stop overtakes a graceful drain; anything else leaves the drain as it is.
        RunStatus::Canceling => {
            if force && state.control.force != Some(true) {
                state.control.force = Some(true);
                let draining = cancel_at_runners(state).await?;
                emit(state, Event::TurnStatus(TurnStatus::Canceling { force: true, draining }));
                save(state, &[]).await?;
                arm_drain_bound(myself, state);
            }
            return Ok(Ok(state.row.clone()));
        }
        _ => {}
    }
    let now = state.fabric.clock.now_ms();
    if state.phase == Phase::Paused {
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
    let open = open_tasks(state).await?;
    let plan = StopPlan::of(&open);
    for mut task in open.into_iter().filter(|t| plan.settle_now.contains(&t.task_key)) {
        let held = approval::is_held(task.status).then_some(task.status);
        task.status = TaskStatus::Canceled;
        task.error_key = Some("task_canceled".into());
        task.settled_at = Some(now);
        // A held row (parked for approval, or a call of `ask` awaiting its answer) is written only
        // while it is still held (a decision or an answer may have won).
        let written = if let Some(held) = held {
            state.fabric.store.decide_task_from(&task, held).await?
        } else {
            state.fabric.store.update_task(&task).await?;
            true
        };
        if let Some(timer) = state.holds.remove(&task.task_key) {
            timer.abort();
        }
        if written {
            narrate(state, &task);
            if state.pending.contains_key(&task.task_key) {
                state.pending.insert(task.task_key, task);
            }
        }
    }
    let draining: Vec<TaskKey> = if force { cancel_at_runners(state).await? } else { plan.at_runners };
    if draining.is_empty() {
        finish(state, None).await?;
        return Ok(Ok(state.row.clone()));
    }
    let count = draining.len();
    enter(state, Phase::Canceling);
    emit(state, Event::TurnStatus(TurnStatus::Canceling { force, draining }));
    save(state, &[]).await?;
    if force {
        arm_drain_bound(myself, state);
    }
    tracing::info!(execution_id = %state.row.public_id, force, draining = count, "execution canceling");
    Ok(Ok(state.row.clone()))
}

/// Cancels every task of the execution at its runner's inbox: it settles `canceled`
/// (`task_canceled`) there, a claimant gets `work_canceled`, and the settlement comes back as
/// [`ExecutionMsg::TaskSettled`]. Answers the keys of the tasks it asked to cancel.
async fn cancel_at_runners(state: &mut ExecutionState) -> Result<Vec<TaskKey>, ActorProcessingErr> {
    let open: Vec<TaskRow> = open_tasks(state).await?.into_iter().filter(at_runner).collect();
    for task in &open {
        let Some(target) = task.target_executor_public_id else { continue };
        // The drain bound ends the stop; the task settles by its deadline at the latest.
        if let Err(error) = state.root.executor(target).cancel((task.run_public_id, task.task_key)) {
            tracing::warn!(runner_id = %target, %error, "cannot cancel at the runner's inbox");
        }
    }
    Ok(open.into_iter().map(|t| t.task_key).collect())
}

fn arm_drain_bound(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState) {
    state.control.drain_generation += 1;
    let generation = state.control.drain_generation;
    let wait = Duration::from_millis(state.fabric.config.execution.stop_drain_ms);
    let actor = myself.clone();
    let clock = state.fabric.clock.clone();
    let span = tracing::debug_span!("stop_drain", execution_id = %state.row.public_id);
    let timer = tokio::spawn(
        async move {
            clock.sleep(wait).await;
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
async fn finish(state: &mut ExecutionState, unsettled: Option<Vec<TaskKey>>) -> Result<(), ActorProcessingErr> {
    if let Some(timer) = state.control.drain_timer.take() {
        timer.abort();
    }
    enter(state, Phase::Done(End::Canceled));
    state.row.error_key = Some("run_canceled".into());
    state.row.attention_reason = None;
    let force = state.control.force;
    emit(
        state,
        Event::TurnStatus(TurnStatus::Canceled { error_key: "run_canceled".into(), force, unsettled, queued: None }),
    );
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
    let unnarrated = match state.pending.get(&task.task_key) {
        Some(held) => !held.is_settled(),
        None => true,
    };
    if unnarrated {
        narrate(state, &task);
        if state.pending.contains_key(&task.task_key) {
            state.pending.insert(task.task_key, task);
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
        None => last_turn_status(state, |status| match status {
            TurnStatus::Canceling { force, .. } => Some(*force),
            _ => None,
        })
        .await?
        .unwrap_or(true),
    };
    state.control.force = Some(force);
    if force {
        cancel_at_runners(state).await?;
        arm_drain_bound(myself, state);
    }
    Ok(())
}
