//! Lifecycle hooks of an execution (`docs/executions.md`, "Lifecycle hooks").
//!
//! # Tasks
//!
//! A declared hook runs as an ordinary `tool_call` inbox task on the runner that serves its tool:
//! the execution's frozen runner (`default_runner_executor_public_id`), whose announcement must
//! list the tool; otherwise the task fails `tool_not_served`. The task has the hook's own
//! `timeout_ms`, passes the approval stage with origin `kernel` (pre-approved unless a rule
//! naming that origin denies it or says ask), and uses the ordinary claim, extend, commit and
//! deadline. Its key names the event and the source, the model round `r{n}` it concerns:
//! `h{n}-{event}` (`h1-turn_start` before round 1, `h3-stop` for round 3's answer), and
//! `h{n}-{event}-g{k}` for the k-th generation a retry makes. So there is one durable task per
//! event/source pair and generation. Its input is the origin's `{event, task_key (the source
//! round), run_public_id, conversation_public_id, output_preview?, output_size_bytes?}`, plus
//! `compaction_trigger`, `overshoot_bytes?` and `overshoot_tokens?` for `pre_compact`
//! ([`hook_input`]).
//!
//! The hook tool is never shown to the model: assembly does not import a runner tool that a hook
//! names, and neither the hook task nor its result enters the transcript.
//!
//! # Boundaries
//!
//! The round driver asks [`gate`] at each boundary: `turn_start` before the first model round
//! (round 0 → 1, also when a regeneration starts a new execution), `stop` when a final answer is
//! ready, and the compaction code asks for `pre_compact` (before actual compaction work) and
//! `post_compact` (after it, before the execution proceeds). [`Gate::Open`] means go on now: no
//! hook is declared, or this boundary's hook already resolved. [`Gate::Held`] means a hook task is
//! out or holds the execution: the caller returns, and the driver is re-entered through
//! `advance` once the hook resolves, when it asks [`gate`] again and gets [`Gate::Open`].
//!
//! # Decisions
//!
//! A completed hook task's `structured_content` is the decision [`read_decision`]: only
//! `continue` (boolean, required) and `feedback` (a string of at most [`FEEDBACK_BOUND`] bytes,
//! no NUL, non-blank when `continue` is true). Events other than `stop` must answer
//! `continue:false`. A `stop` hook that continues puts its feedback in the transcript as the user
//! message of the next model round of the same execution, whose next candidate answer passes
//! through `stop` again; continuations are counted (durably: they are the completed `stop` hook
//! tasks whose decision continued) up to the hook's `max_continuations`.
//!
//! A decision that breaks a rule settles the task `failed` with `invalid_hook_result`,
//! `hook_error` (the commit had `is_error:true`), `stop_hook_limit` (a continuation beyond
//! `max_continuations`) or `hook_requires_model` (a continuation with no model round before).
//! The row, which the inbox settled `completed`, is rewritten with the failure word and keeps the
//! committed result; its one settled `task_status` event says `failed`. Timeouts and failed
//! commits keep their ordinary words (`tool_timeout`, `tool_uncertain`, `tool_failed`).
//!
//! # Hold and repair
//!
//! A failed hook holds the execution: `needs_attention` with reason `halt_failure`, narrated by
//! `attention_required` (`docs/executions.md`, "Lifecycle hooks"). A person repairs it
//! ([`repair`]): `retry` runs the hook again as the next generation (same target, ordinary approval
//! stage); `abandon` releases the hold as if the hook had let the execution go on (a `stop` hook's
//! answer is delivered, a `turn_start` hook's round starts). Both answer 409 `not_retryable` /
//! `not_abandonable` unless the task is `failed`, `timed_out` or `uncertain` and unresolved.
//!
//! A force-stop cancels hook tasks like any other open task (the claimant gets `work_canceled`)
//! and nothing vetoes it; a hook never blocks shutdown.
//!
//! # Durability
//!
//! Every decision is written before it is acted on. After a restart, [`rebuild`] reads the hook
//! tasks and their `task_status` events back: an open hook task is waited for again, a settled
//! one that was never narrated is judged, a held one holds, and resolved ones stay resolved.

use std::collections::{BTreeMap, HashSet};

use ractor::{ActorProcessingErr, ActorRef};
use serde_json::{Value, json};

use nexus_proto::{AttentionReason, ErrorCode, LifecycleEvent, Refusal, RunStatus, TaskKey, TaskStatus};

use crate::declaration::approval::CallOrigin;
use crate::model::ChatMessage;
use crate::store::event::{AttentionRequired, TurnStatus};
use crate::store::{Event, EventRow, TaskRow};

use super::phase::Phase;
use super::{ExecutionMsg, ExecutionState, advance, approval, emit, enter, narrate, narration, offer, resumed, save};

mod decision;

use decision::declared;
pub use decision::{
    CompactionTrigger, Continuations, Decision, FEEDBACK_BOUND, HookEvent, OUTPUT_PREVIEW_BOUND, hook_input, judge,
    read_decision,
};

/// What [`gate`] says about a boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Go on now.
    Open,
    /// A hook task is out or holds the execution; the driver is re-entered when it resolves.
    Held,
}

/// A person's repair of a held hook task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repair {
    /// Run the hook again as a new generation.
    Retry,
    /// Release the hold; the boundary counts as passed.
    Abandon,
}

impl Repair {
    /// The 409 word of a task this repair does not apply to.
    pub fn refusal(self) -> ErrorCode {
        match self {
            Repair::Retry => ErrorCode::NotRetryable,
            Repair::Abandon => ErrorCode::NotAbandonable,
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Repair::Retry => "retried",
            Repair::Abandon => "abandoned",
        }
    }
}

/// The in-memory side of the hooks, rebuilt from the store by [`rebuild`].
#[derive(Debug, Default)]
pub struct HookState {
    /// Hook tasks that settled but whose settled `task_status` is not written yet.
    unnarrated: HashSet<TaskKey>,
    /// Event/source pairs (the first generation's key, `h{n}-{event}`) whose hook resolved:
    /// acknowledged, accepted, continued or abandoned.
    resolved: HashSet<TaskKey>,
    /// Continuations the `stop` hook granted so far.
    continuations: u64,
}

/// Separates the hook tasks (first) from the model's tool tasks (second).
pub(super) fn split(tasks: Vec<TaskRow>) -> (Vec<TaskRow>, Vec<TaskRow>) {
    tasks.into_iter().partition(|task| task.task_key.is_hook())
}

/// Rebuilds the hook state and puts the unresolved hook tasks in the pending set, from the
/// execution's hook tasks and event log (see the module docs, "Durability").
pub(super) fn rebuild(state: &mut ExecutionState, hook_tasks: Vec<TaskRow>, history: &[EventRow]) {
    let mut narrated: HashSet<TaskKey> = HashSet::new();
    let mut abandoned: HashSet<TaskKey> = HashSet::new();
    for narration in history.iter().filter_map(|e| e.event.as_task_status()) {
        if narration.status.is_settled() {
            narrated.insert(narration.task_key);
        }
        if narration.failure_resolution.as_deref() == Some(Repair::Abandon.verb()) {
            abandoned.insert(narration.task_key);
        }
    }
    // Only the latest generation of each event/source pair counts: a retry resolved the others.
    let mut latest: BTreeMap<TaskKey, (u32, TaskRow)> = BTreeMap::new();
    for task in hook_tasks {
        let TaskKey::Hook { generation, .. } = task.task_key else { continue };
        let base = task.task_key.first_generation();
        let newer = latest.get(&base).is_none_or(|(held, _)| *held < generation);
        if newer {
            latest.insert(base, (generation, task));
        }
    }
    for (base, (_, task)) in latest {
        let task_key = task.task_key;
        if abandoned.contains(&task_key) {
            state.hooks.resolved.insert(base);
        } else if !task.is_settled() {
            state.pending.insert(task_key, task);
        } else if !narrated.contains(&task_key) {
            state.hooks.unnarrated.insert(task_key);
            state.pending.insert(task_key, task);
        } else if task.status == TaskStatus::Completed {
            let continued = task.result.as_ref().is_some_and(|r| r["structured_content"]["continue"] == true);
            if task_key.hook_event() == Some(LifecycleEvent::Stop) && continued {
                state.hooks.continuations += 1;
            }
            state.hooks.resolved.insert(base);
        } else {
            state.pending.insert(task_key, task);
        }
    }
}

/// Asks whether the driver may pass `event`'s boundary now (see the module docs,
/// "Boundaries"). Fires the declared hook the first time: its task is written (with the events
/// and whatever else the state holds) before it is offered.
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(crate) async fn gate(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    event: HookEvent<'_>,
) -> Result<Gate, ActorProcessingErr> {
    let Some(hook) = state.declaration.as_ref().and_then(|d| declared(d, event.name())) else {
        return Ok(Gate::Open);
    };
    if event == HookEvent::TurnStart && state.row.round != 0 {
        return Ok(Gate::Open);
    }
    let round = event.source_round(state.row.round);
    let key = TaskKey::hook(round, event.name());
    if state.hooks.resolved.contains(&key) {
        return Ok(Gate::Open);
    }
    if state.pending.keys().any(|held| held.is_hook() && held.first_generation() == key) {
        return Ok(Gate::Held);
    }
    let source = format!("r{round}");
    let input = hook_input(&event, &source, state.row.public_id, Some(state.row.conversation_public_id));
    let now = state.fabric.clock.now_ms();
    // Settled `failed` until it is addressed to the runner that serves the hook tool.
    let mut task = TaskRow {
        tool_input: input,
        status: TaskStatus::Failed,
        settled_at: Some(now),
        ..TaskRow::new(state.row.public_id, key, state.row.round, hook.tool.clone(), hook.timeout_ms, now)
    };
    address(state, &mut task).await?;
    launch(myself, state, task).await?;
    Ok(Gate::Held)
}

/// Addresses a hook task to the frozen runner when its announcement lists the hook tool, with
/// that tool's effect profile; otherwise leaves it unaddressed (it fails `tool_not_served`).
async fn address(state: &ExecutionState, task: &mut TaskRow) -> Result<(), ActorProcessingErr> {
    let Some(runner) = state.declaration.as_ref().and_then(|d| d.default_runner_executor_public_id) else {
        return Ok(());
    };
    let Some(row) = state.fabric.store.executor(runner).await? else { return Ok(()) };
    let announced = row.announcement["tools"]
        .as_array()
        .and_then(|tools| tools.iter().find(|t| t["name"].as_str() == Some(task.tool_name.as_str())));
    if let Some(announced) = announced {
        task.target_executor_public_id = Some(runner);
        task.effect_profile = announced.get("effect_profile").cloned();
    }
    Ok(())
}

/// Passes a new hook task through the approval stage (origin kernel), writes it with its
/// `task_status` (and `approval_required` when it parks), and offers it to its runner. A task
/// that settles at once (unserved, denied) holds the execution in the same write.
async fn launch(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    mut task: TaskRow,
) -> Result<(), ActorProcessingErr> {
    let now = state.fabric.clock.now_ms();
    match (&state.declaration, task.target_executor_public_id) {
        (Some(declaration), Some(_)) => {
            approval::admit(declaration, &mut task, CallOrigin::Kernel, now, approval::hold_ms(state));
        }
        _ => {
            let runner = state
                .declaration
                .as_ref()
                .and_then(|d| d.default_runner_executor_public_id)
                .map_or_else(|| "no runner is selected".to_owned(), |id| format!("runner {id} does not announce it"));
            let message = format!(
                "no runner serves the hook tool {}: {runner}; announce it on the execution's runner and retry the hook, \
                 or abandon it",
                task.tool_name
            );
            task.status = TaskStatus::Failed;
            task.error_key = Some(ErrorCode::ToolNotServed.as_str().into());
            task.settled_at = Some(now);
            task.result = Some(json!({"content": message, "is_error": true, "outcome": "failed"}));
        }
    }
    tracing::info!(execution_id = %state.row.public_id, task_key = %task.task_key, status = %task.status, "hook task");
    state.pending.insert(task.task_key, task.clone());
    narrate(state, &task);
    approval::announce_parks(myself, state, std::slice::from_ref(&task));
    if task.is_settled() {
        hold(state, &task);
    }
    save(state, std::slice::from_ref(&task)).await?;
    if task.status == TaskStatus::Dispatched {
        offer(state, &task);
    }
    Ok(())
}

/// Holds the execution for repair on a failed hook task (`docs/executions.md`, "Lifecycle
/// hooks").
fn hold(state: &mut ExecutionState, task: &TaskRow) {
    let error_key = task.error_key.clone().unwrap_or_else(|| task.status.as_str().to_owned());
    let event = task.task_key.hook_event();
    let event_name = event.map_or("", LifecycleEvent::as_str);
    let message = format!(
        "the {event_name} hook task {} settled {} ({error_key}); retry it (POST …/tasks/{}/retry) or release the hold \
         (POST …/tasks/{}/abandon)",
        task.task_key, task.status, task.task_key, task.task_key
    );
    tracing::warn!(execution_id = %state.row.public_id, task_key = %task.task_key, %error_key, "hook failed; execution held");
    enter(state, Phase::NeedsAttention);
    state.row.attention_reason = Some(AttentionReason::HaltFailure);
    state.row.error_key = Some(error_key.clone());
    emit(
        state,
        Event::AttentionRequired(AttentionRequired {
            reason: AttentionReason::HaltFailure,
            error_key: error_key.clone(),
            message,
            task_key: Some(task.task_key),
            hook: event,
            blocked_task_keys: Some(vec![task.task_key]),
        }),
    );
    emit(
        state,
        Event::TurnStatus(TurnStatus::NeedsAttention { attention_reason: AttentionReason::HaltFailure, error_key }),
    );
}

/// Releases a hold: the execution runs again.
fn release(state: &mut ExecutionState) {
    let working = resumed(state);
    enter(state, working);
    state.row.attention_reason = None;
    state.row.error_key = None;
    emit(state, Event::TurnStatus(TurnStatus::Running { resumed: None, paused_ms: None }));
}

/// A hook task settled in its inbox. While the execution runs it is judged at once (through
/// `advance`); after the execution ended the settlement is only narrated; otherwise (paused) it
/// waits to be judged when the execution runs again.
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn settled(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    task: TaskRow,
) -> Result<(), ActorProcessingErr> {
    let Some(held) = state.pending.get_mut(&task.task_key) else { return Ok(()) };
    if held.is_settled() {
        return Ok(());
    }
    *held = task.clone();
    match state.row.status {
        RunStatus::Running => {
            state.hooks.unnarrated.insert(task.task_key);
            advance(myself, state).await
        }
        RunStatus::Completed | RunStatus::Canceled | RunStatus::Canceling => {
            narrate(state, &task);
            save(state, &[]).await
        }
        _ => {
            state.hooks.unnarrated.insert(task.task_key);
            Ok(())
        }
    }
}

/// Judges every settled hook task in the pending set (see the module docs, "Decisions"): a
/// decision that lets the execution go on resolves its hook (a `stop` continuation also puts
/// its feedback in the transcript); a failure holds the execution. Answers whether the driver
/// may go on. Everything judged is written before the answer.
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn judge_settled(state: &mut ExecutionState) -> Result<bool, ActorProcessingErr> {
    if state.row.status != RunStatus::Running {
        return Ok(false);
    }
    let settled: Vec<TaskKey> =
        state.pending.iter().filter(|(k, t)| k.is_hook() && t.is_settled()).map(|(k, _)| *k).collect();
    if settled.is_empty() {
        return Ok(true);
    }
    for task_key in settled {
        let (Some(mut task), Some(event)) = (state.pending.get(&task_key).cloned(), task_key.hook_event()) else {
            continue;
        };
        let unnarrated = state.hooks.unnarrated.remove(&task_key);
        if task.status != TaskStatus::Completed {
            if unnarrated {
                narrate(state, &task);
            }
            hold(state, &task);
            save(state, &[]).await?;
            return Ok(false);
        }
        match judge_task(state, event, &task) {
            Ok(decision) => {
                let mut judged = narration(&task);
                judged.decision = Some(task.result.as_ref().map_or(Value::Null, |r| r["structured_content"].clone()));
                emit(state, Event::TaskStatus(Box::new(judged)));
                state.pending.remove(&task_key);
                state.hooks.resolved.insert(task_key.first_generation());
                tracing::info!(execution_id = %state.row.public_id, %task_key, ?decision, "hook decided");
                if let Decision::Continue(feedback) = decision {
                    state.hooks.continuations += 1;
                    state.transcript.push(ChatMessage::User { content: feedback });
                }
            }
            Err((code, message)) => {
                task.status = TaskStatus::Failed;
                task.error_key = Some(code.as_str().into());
                if let Some(result) = task.result.as_mut() {
                    result["error"] = json!({"key": code.as_str(), "detail": message});
                }
                state.fabric.store.update_task(&task).await?;
                state.pending.insert(task_key, task.clone());
                narrate(state, &task);
                hold(state, &task);
                save(state, &[]).await?;
                return Ok(false);
            }
        }
    }
    save(state, &[]).await?;
    Ok(true)
}

/// The decision of a completed hook task, with the `stop` continuation limits ([`judge`]).
fn judge_task(state: &ExecutionState, event: LifecycleEvent, task: &TaskRow) -> Result<Decision, (ErrorCode, String)> {
    let max =
        state.declaration.as_ref().and_then(|d| declared(d, LifecycleEvent::Stop)).map_or(0, |h| h.max_continuations);
    let had_model_round = state.transcript.iter().any(|m| matches!(m, ChatMessage::Assistant { .. }));
    judge(event, task.result.as_ref(), Continuations { had_model_round, granted: state.hooks.continuations, max })
}

/// Applies a person's repair to a held hook task (see the module docs, "Hold and repair"). The
/// repair is durable before it is answered. Answers the new generation (retry) or the abandoned
/// task, or 409 `not_retryable` / `not_abandonable`.
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn repair(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    task_key: TaskKey,
    repair: Repair,
) -> Result<Result<TaskRow, Refusal>, ActorProcessingErr> {
    let verb = repair.verb();
    let held = state.pending.get(&task_key).filter(|_| task_key.is_hook()).cloned();
    let Some(task) = held else {
        return Ok(Err(Refusal::new(
            repair.refusal(),
            format!("task {task_key} does not hold this execution; only an unresolved failed hook task can be {verb}"),
        )));
    };
    if !task.status.is_repairable() {
        return Ok(Err(Refusal::new(
            repair.refusal(),
            format!("task {task_key} is {}; only a failed, timed_out or uncertain task can be {verb}", task.status),
        )));
    }
    if state.row.status != RunStatus::NeedsAttention {
        return Ok(Err(Refusal::new(
            repair.refusal(),
            format!("execution {} is {}; only a held execution can be repaired", state.row.public_id, state.row.status),
        )));
    }
    state.pending.remove(&task_key);
    let mut resolution = narration(&task);
    resolution.failure_resolution = Some(verb.to_owned());
    match repair {
        Repair::Retry => {
            let TaskKey::Hook { round, event, generation } = task_key else { unreachable!("a held task is a hook's") };
            let next = TaskKey::Hook { round, event, generation: generation + 1 };
            let now = state.fabric.clock.now_ms();
            let mut fresh = TaskRow {
                task_key: next,
                tool_call_id: next.to_string(),
                target_executor_public_id: task.target_executor_public_id,
                claimed: false,
                claim_token_digest: None,
                started_at: now,
                deadline_at: now,
                result: None,
                error_key: None,
                settled_at: Some(now),
                approval: None,
                status: TaskStatus::Failed,
                ..task
            };
            // Same target; a hook that had none is looked up again.
            if fresh.target_executor_public_id.is_none() {
                address(state, &mut fresh).await?;
            }
            resolution.retried_as = Some(fresh.task_key);
            tracing::info!(execution_id = %state.row.public_id, %task_key, retried_as = %fresh.task_key, "hook retried");
            emit(state, Event::TaskStatus(Box::new(resolution)));
            release(state);
            let fresh_key = fresh.task_key;
            launch(myself, state, fresh.clone()).await?;
            Ok(Ok(state.pending.get(&fresh_key).cloned().unwrap_or(fresh)))
        }
        Repair::Abandon => {
            tracing::info!(execution_id = %state.row.public_id, %task_key, "hook abandoned");
            state.hooks.resolved.insert(task_key.first_generation());
            emit(state, Event::TaskStatus(Box::new(resolution)));
            release(state);
            save(state, &[]).await?;
            advance(myself, state).await?;
            Ok(Ok(task))
        }
    }
}
