//! Lifecycle hooks of an execution (spec/REFERENCE.md 11; R55–R57).
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
//! `attention_required` (REFERENCE.md 7, "Failure policy"). A person repairs it ([`repair`]):
//! `retry` runs the hook again as the next generation (same target, ordinary approval stage);
//! `abandon` releases the hold as if the hook had let the execution go on (a `stop` hook's
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

use nexus_proto::{
    AttentionReason, ConversationId, ErrorCode, ExecutionId, LifecycleEvent, Refusal, RunStatus, TaskKey, TaskStatus,
};

use crate::declaration::FrozenDeclaration;
use crate::declaration::approval::CallOrigin;
use crate::model::ChatMessage;
use crate::store::event::{AttentionRequired, TurnStatus};
use crate::store::{Event, EventRow, TaskRow};

use super::{ExecutionMsg, ExecutionState, advance, approval, emit, narrate, narration, offer, save};

/// The largest `feedback` of a decision, in bytes (16 KiB).
pub const FEEDBACK_BOUND: usize = 16_384;
/// The largest `output_preview` a `stop` hook gets, in bytes (cut at a character boundary);
/// `output_size_bytes` gives the whole answer's size.
pub const OUTPUT_PREVIEW_BOUND: usize = 4_096;

pub use crate::declaration::compaction::CompactionTrigger;

/// A hook boundary, as the driver reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookEvent<'a> {
    /// Before the first model round of the execution. Fires only while no round has started.
    TurnStart,
    /// Before actual compaction work on model round `round` (not on every size check).
    PreCompact {
        /// The model round being compacted (the source, `r{round}`).
        round: i64,
        /// What made compaction run.
        trigger: CompactionTrigger,
        /// How far over the bound the request was, in bytes, when known.
        overshoot_bytes: Option<u64>,
        /// How far over the window the request was, in tokens, when known.
        overshoot_tokens: Option<u64>,
    },
    /// After compaction of model round `round`, before the execution proceeds.
    PostCompact {
        /// The model round that was compacted (the source, `r{round}`).
        round: i64,
    },
    /// A normal final answer of the current round is ready.
    Stop {
        /// The candidate answer.
        output: &'a str,
    },
}

impl HookEvent<'_> {
    /// The event, as `lifecycle_hooks` names it.
    pub fn name(&self) -> LifecycleEvent {
        match self {
            HookEvent::TurnStart => LifecycleEvent::TurnStart,
            HookEvent::PreCompact { .. } => LifecycleEvent::PreCompact,
            HookEvent::PostCompact { .. } => LifecycleEvent::PostCompact,
            HookEvent::Stop { .. } => LifecycleEvent::Stop,
        }
    }

    /// The model round this boundary concerns, given the last round started.
    fn source_round(&self, current: i64) -> i64 {
        match self {
            HookEvent::TurnStart => current + 1,
            HookEvent::PreCompact { round, .. } | HookEvent::PostCompact { round } => *round,
            HookEvent::Stop { .. } => current,
        }
    }
}

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

/// A hook decision that lets the execution go on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// `continue:false`: acknowledged (any event), or the answer is accepted (`stop`).
    Proceed,
    /// `continue:true` on `stop`: run another model round with this feedback as its prompt.
    Continue(String),
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

/// One declared hook, as frozen.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Declared {
    tool: String,
    timeout_ms: i64,
    max_continuations: u64,
}

fn declared(declaration: &FrozenDeclaration, event: LifecycleEvent) -> Option<Declared> {
    let entry = declaration.lifecycle_hooks.get(event.as_str())?;
    Some(Declared {
        tool: entry["tool"].as_str()?.to_owned(),
        timeout_ms: entry["timeout_ms"].as_i64()?,
        max_continuations: entry["max_continuations"].as_u64().unwrap_or(0),
    })
}

/// The origin's hook input for `event` on the source round `source` (`r{n}`) of execution `run`.
pub fn hook_input(
    event: &HookEvent<'_>,
    source: &str,
    run: ExecutionId,
    conversation: Option<ConversationId>,
) -> Value {
    let mut input = json!({
        "event": event.name(),
        "task_key": source,
        "run_public_id": run,
        "conversation_public_id": conversation,
    });
    match event {
        HookEvent::Stop { output } => {
            input["output_preview"] = json!(preview(output));
            input["output_size_bytes"] = json!(output.len());
        }
        HookEvent::PreCompact { trigger, overshoot_bytes, overshoot_tokens, .. } => {
            input["compaction_trigger"] = json!(trigger);
            if let Some(bytes) = overshoot_bytes {
                input["overshoot_bytes"] = json!(bytes);
            }
            if let Some(tokens) = overshoot_tokens {
                input["overshoot_tokens"] = json!(tokens);
            }
        }
        HookEvent::TurnStart | HookEvent::PostCompact { .. } => {}
    }
    input
}

/// The first [`OUTPUT_PREVIEW_BOUND`] bytes of `text`, cut back to a character boundary.
fn preview(text: &str) -> &str {
    let mut end = text.len().min(OUTPUT_PREVIEW_BOUND);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Reads the decision of a completed hook task of `event` from its stored result (REFERENCE.md
/// 11, "Decision"). Continuation limits are judged by the caller.
///
/// # Errors
/// `(hook_error, message)` when the commit had `is_error:true`; `(invalid_hook_result, message)`
/// for a malformed decision.
pub fn read_decision(event: LifecycleEvent, result: Option<&Value>) -> Result<Decision, (ErrorCode, String)> {
    let result = result.unwrap_or(&Value::Null);
    let invalid = |message: String| (ErrorCode::InvalidHookResult, message);
    if result["is_error"] == Value::Bool(true) {
        return Err((
            ErrorCode::HookError,
            "the hook tool's commit had is_error:true; fix the hook tool, then retry the hook or abandon it".into(),
        ));
    }
    let Some(decision) = result.get("structured_content").and_then(Value::as_object) else {
        return Err(invalid("structured_content must be an object {continue, feedback?}".into()));
    };
    if let Some(key) = decision.keys().find(|k| !matches!(k.as_str(), "continue" | "feedback")) {
        return Err(invalid(format!(
            "structured_content.{key} is not allowed; a decision has only continue and feedback"
        )));
    }
    let Some(go_on) = decision.get("continue").and_then(Value::as_bool) else {
        return Err(invalid("structured_content.continue is required and must be a boolean".into()));
    };
    let feedback = match decision.get("feedback") {
        None => None,
        Some(Value::String(feedback)) => Some(feedback),
        Some(_) => return Err(invalid("structured_content.feedback must be a string".into())),
    };
    if let Some(feedback) = feedback {
        if feedback.len() > FEEDBACK_BOUND {
            return Err(invalid(format!(
                "structured_content.feedback is {} bytes, over its bound of {FEEDBACK_BOUND}",
                feedback.len()
            )));
        }
        if feedback.contains('\0') {
            return Err(invalid("structured_content.feedback contains NUL".into()));
        }
    }
    if !go_on {
        return Ok(Decision::Proceed);
    }
    if event != LifecycleEvent::Stop {
        return Err(invalid(format!("a {event} hook may only acknowledge: continue must be false")));
    }
    match feedback.filter(|f| !f.trim().is_empty()) {
        Some(feedback) => Ok(Decision::Continue(feedback.clone())),
        None => Err(invalid("continue:true needs non-blank structured_content.feedback".into())),
    }
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
    state.row.status = RunStatus::NeedsAttention;
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
    state.row.status = RunStatus::Running;
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
        match judge(state, event, &task) {
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

/// The decision of a completed hook task, with the `stop` continuation limits.
fn judge(state: &ExecutionState, event: LifecycleEvent, task: &TaskRow) -> Result<Decision, (ErrorCode, String)> {
    let decision = read_decision(event, task.result.as_ref())?;
    if matches!(decision, Decision::Continue(_)) {
        if !state.transcript.iter().any(|m| matches!(m, ChatMessage::Assistant { .. })) {
            return Err((
                ErrorCode::HookRequiresModel,
                "the stop hook asked for another model round, but this execution has no model round to continue".into(),
            ));
        }
        let max = state
            .declaration
            .as_ref()
            .and_then(|d| declared(d, LifecycleEvent::Stop))
            .map_or(0, |h| h.max_continuations);
        if state.hooks.continuations >= max {
            return Err((
                ErrorCode::StopHookLimit,
                format!(
                    "the stop hook asked for continuation {} but max_continuations is {max}; abandon the hook to \
                     deliver the answer",
                    state.hooks.continuations + 1
                ),
            ));
        }
    }
    Ok(decision)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_keys_name_the_event_the_source_and_the_generation() {
        let rows = [
            ("h1-turn_start", Some((1, "turn_start", 1))),
            ("h3-stop", Some((3, "stop", 1))),
            ("h3-stop-g2", Some((3, "stop", 2))),
            ("h12-pre_compact-g10", Some((12, "pre_compact", 10))),
            ("h2-post_compact", Some((2, "post_compact", 1))),
            ("h3-stop-g1", None),
            ("h3-stop-g", None),
            ("h-stop", None),
            ("hx-stop", None),
            ("h3-session_end", None),
            ("r1t0", None),
            ("h3stop", None),
        ];
        for (text, expected) in rows {
            let parsed = text.parse::<TaskKey>().ok().and_then(|key| match key {
                TaskKey::Hook { round, event, generation } => Some((round, event.as_str(), generation)),
                _ => None,
            });
            assert_eq!(parsed, expected, "{text}");
            if let Ok(key) = text.parse::<TaskKey>() {
                assert_eq!(key.to_string(), text, "{text} round-trips");
            }
        }
        let retry = TaskKey::Hook { round: 3, event: LifecycleEvent::Stop, generation: 2 };
        assert_eq!(retry.first_generation().to_string(), "h3-stop");
        assert_eq!(
            "h1-turn_start".parse::<TaskKey>().ok().and_then(TaskKey::hook_event),
            Some(LifecycleEvent::TurnStart)
        );
        assert!(!"r1t0".parse::<TaskKey>().expect("a key").is_hook());
    }

    #[test]
    fn r56_decisions_and_their_failure_words() {
        let stop = |content: Value| {
            read_decision(LifecycleEvent::Stop, Some(&json!({"structured_content": content, "is_error": false})))
        };
        let word = |r: Result<Decision, (ErrorCode, String)>| r.map_err(|(code, _)| code.as_str());
        let rows: [(&str, Value, Result<Decision, &str>); 13] = [
            ("accept", json!({"continue": false}), Ok(Decision::Proceed)),
            ("accept_with_feedback", json!({"continue": false, "feedback": "fine"}), Ok(Decision::Proceed)),
            ("continue", json!({"continue": true, "feedback": "more"}), Ok(Decision::Continue("more".into()))),
            ("continue_without_feedback", json!({"continue": true}), Err("invalid_hook_result")),
            ("continue_blank_feedback", json!({"continue": true, "feedback": " \n\t"}), Err("invalid_hook_result")),
            ("continue_missing", json!({"feedback": "x"}), Err("invalid_hook_result")),
            ("continue_not_bool", json!({"continue": "yes"}), Err("invalid_hook_result")),
            ("extra_key", json!({"continue": false, "reason": "x"}), Err("invalid_hook_result")),
            ("feedback_not_string", json!({"continue": false, "feedback": 1}), Err("invalid_hook_result")),
            ("feedback_nul", json!({"continue": true, "feedback": "a\u{0}b"}), Err("invalid_hook_result")),
            (
                "feedback_over_16_kib",
                json!({"continue": true, "feedback": "x".repeat(FEEDBACK_BOUND + 1)}),
                Err("invalid_hook_result"),
            ),
            ("not_an_object", json!([true]), Err("invalid_hook_result")),
            ("null", Value::Null, Err("invalid_hook_result")),
        ];
        for (name, content, expected) in rows {
            assert_eq!(word(stop(content)), expected, "{name}");
        }
        let at_bound = json!({"continue": true, "feedback": "x".repeat(FEEDBACK_BOUND)});
        assert!(stop(at_bound).is_ok(), "16 KiB of feedback is allowed");
        assert_eq!(
            word(read_decision(LifecycleEvent::Stop, Some(&json!({"content": "no structure"})))),
            Err("invalid_hook_result")
        );
        assert_eq!(word(read_decision(LifecycleEvent::Stop, None)), Err("invalid_hook_result"));
        let errored = json!({"structured_content": {"continue": false}, "is_error": true});
        assert_eq!(word(read_decision(LifecycleEvent::Stop, Some(&errored))), Err("hook_error"));
        for event in [LifecycleEvent::TurnStart, LifecycleEvent::PreCompact, LifecycleEvent::PostCompact] {
            let ack = json!({"structured_content": {"continue": false}});
            assert_eq!(read_decision(event, Some(&ack)), Ok(Decision::Proceed), "{event}");
            let go_on = json!({"structured_content": {"continue": true, "feedback": "more"}});
            assert_eq!(word(read_decision(event, Some(&go_on))), Err("invalid_hook_result"), "{event}");
        }
    }

    #[test]
    fn the_hook_input_is_the_origins() {
        let run = ExecutionId::new_v4();
        let conversation = ConversationId::new_v4();
        let answer = "é".repeat(3_000);
        let stop = hook_input(&HookEvent::Stop { output: &answer }, "r2", run, Some(conversation));
        assert_eq!(stop["event"], "stop");
        assert_eq!(stop["task_key"], "r2");
        assert_eq!(stop["run_public_id"], json!(run));
        assert_eq!(stop["conversation_public_id"], json!(conversation));
        assert_eq!(stop["output_size_bytes"], 6_000);
        let shown = stop["output_preview"].as_str().expect("preview");
        assert_eq!(shown.len(), OUTPUT_PREVIEW_BOUND, "cut at a character boundary at the bound");
        let start = hook_input(&HookEvent::TurnStart, "r1", run, None);
        assert_eq!(
            start,
            json!({"event": "turn_start", "task_key": "r1", "run_public_id": run, "conversation_public_id": null})
        );
        let pre = HookEvent::PreCompact {
            round: 4,
            trigger: CompactionTrigger::Overflow,
            overshoot_bytes: Some(10),
            overshoot_tokens: None,
        };
        let input = hook_input(&pre, "r4", run, None);
        assert_eq!(
            (input["compaction_trigger"].as_str(), input["overshoot_bytes"].as_u64()),
            (Some("overflow"), Some(10))
        );
        assert!(input.get("overshoot_tokens").is_none());
        assert_eq!(pre.source_round(9), 4);
        assert_eq!(HookEvent::TurnStart.source_round(0), 1);
        assert_eq!(HookEvent::Stop { output: "" }.source_round(3), 3);
    }

    #[test]
    fn r55_a_hook_tool_is_never_imported_for_the_model() {
        let runner = nexus_proto::RunnerId::new_v4();
        let tool = |name: &str| json!({"name": name, "description": "d", "input_schema": {"type": "object"}});
        let facts = crate::declaration::RunnerFacts {
            public_id: runner,
            display_name: "worker".into(),
            eligible: true,
            announcement: json!({"tools": [tool("probe"), tool("review")], "environment": {}, "documents": []}),
        };
        let configuration = json!({
            "runner_executor_public_ids": [runner],
            "approval_mode": "bypass",
            "lifecycle_hooks": {"stop": {"tool": "review", "timeout_ms": 1000, "max_continuations": 1}},
        });
        let selection = crate::declaration::tools::RunnerSelection::FirstEligible;
        let frozen = crate::declaration::freeze(&configuration, None, selection, &[facts], None).expect("frozen");
        let names: Vec<&str> = frozen.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["probe"]);
        assert_eq!(
            declared(&frozen, LifecycleEvent::Stop),
            Some(Declared { tool: "review".into(), timeout_ms: 1000, max_continuations: 1 })
        );
        assert_eq!(declared(&frozen, LifecycleEvent::TurnStart), None);
    }
}
