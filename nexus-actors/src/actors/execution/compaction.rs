//! Compaction of an execution's context: the repair, not a policy (`docs/executions.md`,
//! "Compaction"; "Lifecycle hooks" for `pre_compact`/`post_compact`).
//!
//! # Policy
//!
//! The frozen declaration's `compaction_policy` `{mode: kernel|delegate|off, tool_name?, model?,
//! reasoning_enabled?, reasoning_effort?}` applies to every round of the execution. A null or
//! absent policy, or `mode: off`, compacts nothing: the typed refusal stands, so a provider's
//! `provider_context_overflow` halts the execution as it always did, and no size check runs.
//! `reasoning_enabled` and `reasoning_effort` are carried by the declaration but not sent: the
//! model layer has no reasoning controls yet.
//!
//! # Triggers
//!
//! Compaction runs at a round boundary, before the next model request (the *source* round
//! `r{n}`), and is recorded with its trigger:
//! - `usage`: the provider's own input token count of the last round plus the tail added since
//!   (that round's answer and tool results, estimated at [`ESTIMATE_BYTES_PER_TOKEN`] bytes per
//!   token) is over `[execution] compaction_threshold_percent` of the model's window
//!   (`context_window_tokens` in the provider table).
//! - `wall`: the request's canonical JSON (messages and tools) is over `[execution]
//!   request_bytes_bound` (`context_overflow`), or, when no provider count is known yet, its
//!   estimate is over the model's window (`estimated_input_exceeds_model_limit`).
//! - `overflow`: the provider rejected round `r{n}` for length (`provider_context_overflow`):
//!   the round is compacted and asked again under the same number, without charging retry.
//! - `manual`: `POST /agent_api/v1/executions/{id}/compact` ([`CompactionMsg::Manual`]).
//!
//! # The summary task
//!
//! Each compaction is one durable task `c{n}-summary` (the event's `summary_task_key`), written
//! `waiting` when the compaction is decided. Once the `pre_compact` hook passes, the work starts:
//! - `kernel`: a summarizer model call with no tools (a `model_task` row run in-process, never
//!   offered to a runner): the `summarizer` prompt document as its system instructions (a
//!   built-in text when the declaration has none), the history to compact rendered as one user
//!   message, on the policy's `model` or else the execution's current model.
//! - `delegate`: an ordinary `tool_call` inbox row addressed to the runner that serves
//!   `tool_name` (the execution's runner first, then the other candidates), through the approval
//!   stage with origin `kernel`, with `tool_input {history, retained_tail, run_public_id, task}`
//!   of at most [`DELEGATE_INPUT_BOUND`] bytes (the oldest material is trimmed first). Its
//!   committed `content` is the summary. When nobody answers (`tool_timeout`, `tool_uncertain`,
//!   or no runner serves the tool: `tool_not_served`), the kernel summarizer runs once instead,
//!   as `c{n}-summary-fallback`, and the event says `fallback_from: delegate` and
//!   `fallback_reason`.
//!
//! The summary replaces the compacted messages with one assistant message headed
//! [`SUMMARY_HEADER`], placed right before the retained tail; `context_compacted {run_public_id,
//! task_key, summary_task_key, mode, trigger, fallback_from?, fallback_reason?,
//! replaced_messages, retained_messages}` is written with the new transcript in one save, so the
//! next round never reads a summary that is not durable. Then `post_compact` runs, and the
//! source round starts.
//!
//! # What survives
//!
//! [`plan`] decides what is compacted. System messages (the documents) and every user message
//! (the input and later feedback: the pinned user constraints) stay verbatim. The retained tail,
//! the latest round from its assistant message on, stays verbatim, and so does every assistant
//! message with a tool call whose result has not reached the model, with everything after it
//! (unresolved obligations are never compacted away). What is left, earlier assistant messages
//! (an earlier summary among them) and their tool results, is compacted; when nothing is left,
//! there is nothing to compact.
//!
//! # At most once
//!
//! A source round is repaired at most once: a second trigger for it is ignored, and an overflow
//! of a round already compacted halts with `provider_context_overflow`. A compaction that fails
//! (the summarizer failed, the delegate answered an error or an empty summary) leaves the
//! transcript as it was: the round then runs uncompacted, except after `overflow`, where the
//! refusal stands and the execution halts.
//!
//! # Durability
//!
//! The summary task row, its `task_status` events (the first carries the compaction's facts:
//! trigger, mode, overshoot) and `context_compacted` are the state. After a restart, [`rebuild`]
//! finds the compaction of the next round where it stood: waiting for `pre_compact`, a delegate
//! task out at its runner, a kernel summarizer call to ask again, a summary to apply, or
//! `post_compact` to pass.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tracing::Instrument;

use nexus_proto::{ErrorCode, ExecutorStatus, Refusal, RunStatus, RunnerId, TaskKey, TaskKind, TaskStatus};

use crate::actors::executor::commit::model_text;
use crate::declaration::approval::CallOrigin;
use crate::declaration::compaction::{CompactionMode, CompactionTrigger};
use crate::declaration::{FrozenDeclaration, wire_projection};
use crate::model::retry::call_with_retries;
use crate::model::{ChatMessage, ModelFailure, ModelRequest, ModelResponse, ResolvedModel};
use crate::store::event::{CompactionFact, ContextCompacted, Usage};
use crate::store::{Event, EventRow, TaskRow};

mod plan;

pub use plan::{
    DEFAULT_INSTRUCTIONS, DELEGATE_INPUT_BOUND, Detected, Measure, Plan, Policy, SUMMARIZER, SUMMARY_HEADER,
    compacted_transcript, delegate_input, fallback_key, parse_key, plan, policy, summarizer_bound, summarizer_input,
    summary_key, trigger,
};

use super::hooks::{self, Gate, HookEvent};
use super::{
    ExecutionMsg, ExecutionState, advance, answer, approval, emit, halt, model_chain, narrate, narration,
    next_available, offer, rewrite_transcript, save,
};

/// The messages of an ExecutionActor that concern compaction ([`ExecutionMsg::Compaction`]).
pub enum CompactionMsg {
    /// A person asks for a compaction before the next round (the manual door). Answers
    /// `{execution_public_id, summary_task_key, task_key, trigger, mode, status}`, or 409
    /// `compaction_disabled`, `task_not_queued`, `already_compacted` or `nothing_to_compact`.
    Manual {
        /// The acceptance, or the refusal.
        reply: RpcReplyPort<Result<Value, Refusal>>,
    },
    /// A kernel summarizer call finished.
    SummaryDone {
        /// The summary task it ran for.
        task_key: TaskKey,
        /// The model reference that answered.
        model: String,
        /// The answer.
        result: Result<ModelResponse, ModelFailure>,
    },
}

/// Where the compaction of the next round stands.
#[derive(Debug)]
enum Phase {
    /// Decided and written; `pre_compact` comes first.
    Waiting,
    /// The summary task is out (in the pending set).
    Working,
    /// The summary task settled; its result is applied, falls back, or fails the compaction.
    Settled(Box<TaskRow>),
    /// The summary replaced the history; `post_compact` comes next.
    Applied,
}

/// The compaction in progress, for source round `source`.
#[derive(Debug)]
struct Active {
    source: i64,
    trigger: CompactionTrigger,
    overshoot_bytes: Option<u64>,
    overshoot_tokens: Option<u64>,
    /// `Some(reason)` once the kernel summarizer runs instead of a delegate nobody answered.
    fallback_reason: Option<String>,
    phase: Phase,
}

/// The in-memory side of compaction, rebuilt from the store by [`rebuild`].
#[derive(Debug, Default)]
pub struct CompactionState {
    active: Option<Active>,
    /// Source rounds that were compacted already, or tried to be (at most once each).
    attempted: BTreeSet<i64>,
    /// The last round's provider token count: `(round, input_tokens)`.
    usage: Option<(i64, u64)>,
    /// The kernel summarizer call in flight.
    call: Option<JoinHandle<()>>,
}

impl Drop for CompactionState {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            call.abort();
        }
    }
}

/// The `compaction` fact on a summary task's `task_status` events.
fn fact(active: &Active, mode: CompactionMode) -> CompactionFact {
    CompactionFact {
        task_key: format!("r{}", active.source),
        trigger: active.trigger,
        mode,
        overshoot_bytes: active.overshoot_bytes,
        overshoot_tokens: active.overshoot_tokens,
        fallback_from: active.fallback_reason.as_ref().map(|_| CompactionMode::Delegate),
        fallback_reason: active.fallback_reason.clone(),
    }
}

/// Queues the `task_status` of a summary task with the compaction's facts.
fn narrate_with_fact(state: &mut ExecutionState, task: &TaskRow, fact: Option<CompactionFact>) {
    let mut narration = narration(task);
    narration.compaction = fact;
    emit(state, Event::TaskStatus(Box::new(narration)));
}

/// Separates the summary tasks (first) from the others (second).
pub(super) fn split(tasks: Vec<TaskRow>) -> (Vec<TaskRow>, Vec<TaskRow>) {
    tasks.into_iter().partition(|task| task.task_key.is_summary())
}

/// The round a compaction in progress is for, when it is the next one.
pub(super) fn in_progress(state: &ExecutionState) -> Option<i64> {
    state.compaction.active.as_ref().map(|active| active.source).filter(|source| *source == state.row.round + 1)
}

/// Records the provider's own input token count of model round `round` (the `usage` trigger).
pub(super) fn observe_usage(state: &mut ExecutionState, round: i64, input_tokens: u64) {
    state.compaction.usage = Some((round, input_tokens));
}

/// Rebuilds the compaction state after a restart from the execution's summary tasks and event
/// log (see the module docs, "Durability"), narrating a settlement that a crash left unnarrated.
/// A kernel summarizer call the restart lost is asked again.
pub(super) fn rebuild(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    summary_tasks: Vec<TaskRow>,
    history: &[EventRow],
) {
    state.compaction.usage = history.iter().rev().find_map(|e| match &e.event {
        Event::Usage(usage) if usage.summary_task_key.is_none() => Some((usage.round?, usage.input_tokens)),
        _ => None,
    });
    let mut narrated: HashSet<TaskKey> = HashSet::new();
    let mut facts: HashMap<TaskKey, &CompactionFact> = HashMap::new();
    let mut applied: HashSet<TaskKey> = HashSet::new();
    for event in history {
        match &event.event {
            Event::TaskStatus(narration) if narration.task_key.is_summary() => {
                if narration.status.is_settled() {
                    narrated.insert(narration.task_key);
                }
                if let Some(fact) = &narration.compaction {
                    facts.entry(narration.task_key).or_insert(fact);
                }
            }
            Event::ContextCompacted(compacted) => {
                applied.insert(compacted.summary_task_key);
            }
            _ => {}
        }
    }
    let source = state.row.round + 1;
    let mut current: Option<TaskRow> = None;
    for task in summary_tasks {
        let Some((round, fallback)) = parse_key(task.task_key) else { continue };
        state.compaction.attempted.insert(round);
        if task.is_settled() && !narrated.contains(&task.task_key) {
            narrate(state, &task);
        }
        if round == source && (fallback || current.is_none()) {
            current = Some(task);
        }
    }
    let Some(task) = current else { return };
    let primary = facts.get(&summary_key(source)).copied();
    let fallback = facts.get(&fallback_key(source)).copied();
    let phase = if applied.contains(&task.task_key) {
        Phase::Applied
    } else if task.status == TaskStatus::Waiting {
        Phase::Waiting
    } else if task.is_settled() {
        Phase::Settled(Box::new(task.clone()))
    } else {
        Phase::Working
    };
    state.compaction.active = Some(Active {
        source,
        trigger: primary.map_or(CompactionTrigger::Manual, |fact| fact.trigger),
        overshoot_bytes: primary.and_then(|fact| fact.overshoot_bytes),
        overshoot_tokens: primary.and_then(|fact| fact.overshoot_tokens),
        fallback_reason: fallback.and_then(|fact| fact.fallback_reason.clone()),
        phase,
    });
    if matches!(state.compaction.active.as_ref().map(|a| &a.phase), Some(Phase::Working)) {
        let kernel_call = task.kind == TaskKind::ModelTask && task.status == TaskStatus::Running;
        state.pending.insert(task.task_key, task.clone());
        if kernel_call && matches!(state.row.status, RunStatus::Running | RunStatus::Paused) {
            let model = task.tool_input["model"].as_str().and_then(|m| state.fabric.models.resolve(m).ok());
            match (model, plan(&state.transcript)) {
                (Some(model), Some(plan)) => {
                    tracing::info!(execution_id = %state.row.public_id, task_key = %task.task_key, "summarizer asked again after a restart");
                    spawn_summarizer(myself, state, task.task_key, model, &plan);
                }
                _ => {
                    // Nothing to ask again with: the model is gone, or so is the history.
                    let _ = myself.cast(ExecutionMsg::Compaction(CompactionMsg::SummaryDone {
                        task_key: task.task_key,
                        model: task.tool_input["model"].as_str().unwrap_or_default().to_owned(),
                        result: Err(unavailable_failure("the summarizer's model no longer resolves")),
                    }));
                }
            }
        }
    }
}

fn unavailable_failure(message: &str) -> ModelFailure {
    ModelFailure {
        error: crate::model::ModelError::ModelUnavailable { status: 404, message: message.to_owned() },
        key: "provider_model_unavailable",
        advance: None,
        category: None,
        attempts: 1,
    }
}

/// Takes the settled summary task out of the pending set, so its result is never read as a tool
/// result; the boundary ([`gate`]) applies it.
pub(super) fn collect(state: &mut ExecutionState) {
    let keys: Vec<TaskKey> =
        state.pending.iter().filter(|(k, t)| k.is_summary() && t.is_settled()).map(|(k, _)| *k).collect();
    for key in keys {
        let Some(task) = state.pending.remove(&key) else { continue };
        let source = parse_key(key).map(|(round, _)| round);
        if let Some(active) = state.compaction.active.as_mut().filter(|a| Some(a.source) == source) {
            active.phase = Phase::Settled(Box::new(task));
        }
    }
}

/// The boundary before the next model round: starts a compaction when a trigger fires, and
/// drives the one in progress. [`Gate::Open`] lets the round start now; [`Gate::Held`] means the
/// compaction (or a hook around it) is out, and the driver is re-entered when it comes back.
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn gate(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
) -> Result<Gate, ActorProcessingErr> {
    let source = state.row.round + 1;
    if state.compaction.active.as_ref().is_some_and(|a| a.source != source) {
        state.compaction.active = None;
    }
    if state.compaction.active.is_none() {
        let Some(detected) = detect(state, source) else { return Ok(Gate::Open) };
        begin(state, source, detected.trigger, detected.overshoot_bytes, detected.overshoot_tokens).await?;
    }
    drive(myself, state).await
}

/// Whether round `source` must be compacted before it runs: measures the next request and asks
/// [`trigger`].
fn detect(state: &ExecutionState, source: i64) -> Option<Detected> {
    let declaration = state.declaration.as_ref()?;
    policy(declaration)?;
    if state.compaction.attempted.contains(&source) {
        return None;
    }
    let plan = plan(&state.transcript)?;
    let (_, model) = next_available(state, &model_chain(declaration), state.model_index)?;
    let config = &state.fabric.config.execution;
    let tools = wire_projection(&declaration.tools);
    let bytes = |value: &Value| serde_json::to_vec(value).map_or(0, |b| b.len()) as u64;
    let last_round_tokens = match state.compaction.usage {
        Some((round, input_tokens)) if round == state.row.round => Some(input_tokens),
        _ => None,
    };
    trigger(&Measure {
        request_bytes: bytes(&json!({"messages": state.transcript, "tools": tools})),
        request_bytes_bound: config.request_bytes_bound,
        last_round_tokens,
        tail_bytes: bytes(&json!(state.transcript[plan.tail_start..])),
        window_tokens: model.context_window_tokens,
        threshold_percent: config.compaction_threshold_percent,
    })
}

/// Decides a compaction of round `source`: writes its summary task `waiting`, with the
/// compaction's facts on its `task_status`.
async fn begin(
    state: &mut ExecutionState,
    source: i64,
    trigger: CompactionTrigger,
    overshoot_bytes: Option<u64>,
    overshoot_tokens: Option<u64>,
) -> Result<TaskRow, ActorProcessingErr> {
    let mode = state.declaration.as_deref().and_then(policy).map_or(CompactionMode::Kernel, |p| p.mode);
    let active =
        Active { source, trigger, overshoot_bytes, overshoot_tokens, fallback_reason: None, phase: Phase::Waiting };
    let task = waiting_task(state, summary_key(source), mode);
    tracing::info!(execution_id = %state.row.public_id, source, %trigger, %mode, "compaction decided");
    let compaction = fact(&active, mode);
    state.compaction.attempted.insert(source);
    state.compaction.active = Some(active);
    narrate_with_fact(state, &task, Some(compaction));
    save(state, std::slice::from_ref(&task)).await?;
    Ok(task)
}

fn waiting_task(state: &ExecutionState, key: TaskKey, mode: CompactionMode) -> TaskRow {
    let now = state.fabric.clock.now_ms();
    let name = match mode {
        CompactionMode::Kernel => SUMMARIZER.to_owned(),
        CompactionMode::Delegate => {
            state.declaration.as_deref().and_then(policy).and_then(|p| p.tool_name).unwrap_or_else(|| SUMMARIZER.into())
        }
    };
    let timeout_ms = i64::try_from(state.fabric.config.execution.default_task_timeout_ms).unwrap_or(i64::MAX);
    TaskRow {
        kind: match mode {
            CompactionMode::Kernel => TaskKind::ModelTask,
            CompactionMode::Delegate => TaskKind::ToolTask,
        },
        ..TaskRow::new(state.row.public_id, key, state.row.round, name, timeout_ms, now)
    }
}

/// What [`drive`] does next, read from the active compaction.
enum Step {
    Pre(HookEvent<'static>),
    Wait,
    Finish,
    Post(i64),
}

/// Drives the compaction in progress as far as it goes now.
async fn drive(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState) -> Result<Gate, ActorProcessingErr> {
    loop {
        if !state.phase.is_working() {
            return Ok(Gate::Held);
        }
        let step = match &state.compaction.active {
            None => return Ok(Gate::Open),
            Some(active) => match &active.phase {
                Phase::Waiting => Step::Pre(HookEvent::PreCompact {
                    round: active.source,
                    trigger: active.trigger,
                    overshoot_bytes: active.overshoot_bytes,
                    overshoot_tokens: active.overshoot_tokens,
                }),
                Phase::Working => Step::Wait,
                Phase::Settled(_) => Step::Finish,
                Phase::Applied => Step::Post(active.source),
            },
        };
        match step {
            Step::Pre(event) => {
                if hooks::gate(myself, state, event).await? == Gate::Held {
                    return Ok(Gate::Held);
                }
                let mode = state.declaration.as_deref().and_then(policy).map_or(CompactionMode::Kernel, |p| p.mode);
                let Some(source) = state.compaction.active.as_ref().map(|a| a.source) else { continue };
                match mode {
                    CompactionMode::Kernel => start_kernel(myself, state, summary_key(source)).await?,
                    CompactionMode::Delegate => start_delegate(myself, state, source).await?,
                }
            }
            Step::Wait => return Ok(Gate::Held),
            Step::Finish => {
                let phase = state.compaction.active.as_mut().map(|a| std::mem::replace(&mut a.phase, Phase::Working));
                if let Some(Phase::Settled(task)) = phase {
                    finish(myself, state, *task).await?;
                }
            }
            Step::Post(source) => {
                if hooks::gate(myself, state, HookEvent::PostCompact { round: source }).await? == Gate::Held {
                    return Ok(Gate::Held);
                }
                state.compaction.active = None;
                return Ok(Gate::Open);
            }
        }
    }
}

/// Writes a started summary task, over its `waiting` row (the first task) or as a new row (the
/// fallback), with its `task_status` (and `approval_required` when it parks) in one save. A task
/// that settled at once is kept for [`finish`]; an open one goes to the pending set, so the
/// driver waits for it. Answers `false` when a stop canceled the waiting row first.
async fn write_started(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    task: &TaskRow,
    mode: CompactionMode,
) -> Result<bool, ActorProcessingErr> {
    let fresh = parse_key(task.task_key).is_some_and(|(_, fallback)| fallback);
    if !fresh && !state.fabric.store.start_waiting_task(task).await? {
        state.compaction.active = None;
        return Ok(false);
    }
    let compaction = state.compaction.active.as_ref().map(|active| fact(active, mode));
    narrate_with_fact(state, task, compaction);
    let phase = if task.is_settled() {
        Phase::Settled(Box::new(task.clone()))
    } else {
        state.pending.insert(task.task_key, task.clone());
        approval::announce_parks(myself, state, std::slice::from_ref(task));
        Phase::Working
    };
    if let Some(active) = state.compaction.active.as_mut() {
        active.phase = phase;
    }
    let new_rows = if fresh { std::slice::from_ref(task) } else { &[] };
    save(state, new_rows).await?;
    Ok(true)
}

/// Starts the kernel summarizer as summary task `key`.
async fn start_kernel(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    key: TaskKey,
) -> Result<(), ActorProcessingErr> {
    let now = state.fabric.clock.now_ms();
    let mut task = waiting_task(state, key, CompactionMode::Kernel);
    task.status = TaskStatus::Running;
    let (model, plan) = match (summarizer_model(state), plan(&state.transcript)) {
        (Ok(model), Some(plan)) => (model, plan),
        (Err((word, message)), _) => {
            settle_failed(&mut task, word, &message, now);
            write_started(myself, state, &task, CompactionMode::Kernel).await?;
            return Ok(());
        }
        (_, None) => {
            settle_failed(&mut task, ErrorCode::NothingToCompact.as_str(), NOTHING_LEFT, now);
            write_started(myself, state, &task, CompactionMode::Kernel).await?;
            return Ok(());
        }
    };
    task.tool_input = json!({
        "model": model.reference,
        "compacted_messages": plan.compacted.len(),
        "retained_messages": state.transcript.len() - plan.tail_start,
    });
    if write_started(myself, state, &task, CompactionMode::Kernel).await? {
        spawn_summarizer(myself, state, key, model, &plan);
    }
    Ok(())
}

const NOTHING_LEFT: &str = "nothing is left to compact: the history holds only pinned messages and the retained tail";

/// The summarizer's model: the policy's `model`, else the execution's current route.
fn summarizer_model(state: &ExecutionState) -> Result<ResolvedModel, (&'static str, String)> {
    let Some(declaration) = &state.declaration else {
        return Err(("provider_model_unavailable", "the execution has no declaration".into()));
    };
    match policy(declaration).and_then(|p| p.model) {
        Some(reference) => state.fabric.models.resolve(&reference).map_err(|e| {
            (
                "provider_model_unavailable",
                format!("compaction_policy.model {reference}: {}: {e}; declare a model this server can run", e.word()),
            )
        }),
        None => next_available(state, &model_chain(declaration), state.model_index)
            .map(|(_, model)| model)
            .ok_or(("provider_model_unavailable", "no model in the declaration's chain is available".into())),
    }
}

fn settle_failed(task: &mut TaskRow, word: &str, message: &str, now: i64) {
    task.status = TaskStatus::Failed;
    task.error_key = Some(word.to_owned());
    task.settled_at = Some(now);
    task.result = Some(json!({"content": format!("{word}: {message}"), "is_error": true, "outcome": "failed"}));
}

/// Asks the summarizer in a task the actor owns; the answer comes back as
/// [`CompactionMsg::SummaryDone`].
fn spawn_summarizer(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    key: TaskKey,
    model: ResolvedModel,
    plan: &Plan,
) {
    let instructions = state
        .declaration
        .as_ref()
        .and_then(|d| d.summarizer.as_ref())
        .and_then(|doc| doc["content"].as_str())
        .filter(|c| !c.trim().is_empty())
        .unwrap_or(DEFAULT_INSTRUCTIONS)
        .to_owned();
    let bound =
        summarizer_bound(model.context_window_tokens, state.fabric.config.execution.compaction_threshold_percent);
    let input = summarizer_input(&state.transcript, plan, bound.saturating_sub(instructions.len()));
    let request = ModelRequest {
        model: model.model.clone(),
        messages: vec![ChatMessage::System { content: instructions }, ChatMessage::User { content: input }],
        tools: Vec::new(),
        deltas: None,
    };
    let retry = state.fabric.config.execution.retry_policy();
    let actor = myself.clone();
    let task_key = key;
    let reference = model.reference.clone();
    let span = tracing::info_span!("summarizer", execution_id = %state.row.public_id, %task_key, model = %reference);
    let call = tokio::spawn(
        async move {
            let result = call_with_retries(Arc::clone(&model.client), request, &retry).await;
            let done = CompactionMsg::SummaryDone { task_key, model: reference, result };
            let _ = actor.cast(ExecutionMsg::Compaction(done));
        }
        .instrument(span),
    );
    if let Some(old) = state.compaction.call.replace(call) {
        old.abort();
    }
}

/// Starts the delegate summary task of round `source`: addressed to the runner that serves the
/// policy's tool, or failed `tool_not_served` (the kernel summarizer then runs instead).
async fn start_delegate(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    source: i64,
) -> Result<(), ActorProcessingErr> {
    let Some(declaration) = state.declaration.clone() else { return Ok(()) };
    let now = state.fabric.clock.now_ms();
    let mut task = waiting_task(state, summary_key(source), CompactionMode::Delegate);
    task.started_at = now;
    let Some(plan) = plan(&state.transcript) else {
        settle_failed(&mut task, ErrorCode::NothingToCompact.as_str(), NOTHING_LEFT, now);
        write_started(myself, state, &task, CompactionMode::Delegate).await?;
        return Ok(());
    };
    task.tool_input =
        delegate_input(&state.transcript, &plan, state.row.public_id, &format!("r{source}"), DELEGATE_INPUT_BOUND);
    match address(state, &declaration, &task.tool_name).await? {
        Some((runner, timeout_ms, effect_profile)) => {
            task.target_executor_public_id = Some(runner);
            task.effect_profile = effect_profile;
            if let Some(timeout_ms) = timeout_ms {
                task.timeout_ms = timeout_ms;
            }
            approval::admit(&declaration, &mut task, CallOrigin::Kernel, now, approval::hold_ms(state));
        }
        None => {
            let message = format!(
                "no runner of this execution announces the compaction tool {}; announce it there, or the kernel \
                 summarizer runs instead",
                task.tool_name
            );
            settle_failed(&mut task, ErrorCode::ToolNotServed.as_str(), &message, now);
        }
    }
    if write_started(myself, state, &task, CompactionMode::Delegate).await? && task.status == TaskStatus::Dispatched {
        offer(state, &task);
    }
    Ok(())
}

/// The runner that serves `tool`: the execution's runner first, then the other candidates, each
/// only when its announcement lists the tool. Answers it with the announced `timeout_ms` and
/// `effect_profile`.
async fn address(
    state: &ExecutionState,
    declaration: &FrozenDeclaration,
    tool: &str,
) -> Result<Option<(RunnerId, Option<i64>, Option<Value>)>, ActorProcessingErr> {
    let mut runners: Vec<RunnerId> = declaration.default_runner_executor_public_id.into_iter().collect();
    for candidate in &declaration.runner_candidates {
        let id = candidate["runner_executor_public_id"].as_str().and_then(|s| RunnerId::parse_any_case(s).ok());
        if let Some(id) = id.filter(|id| !runners.contains(id)) {
            runners.push(id);
        }
    }
    for runner in runners {
        let Some(row) = state.fabric.store.executor(runner).await? else { continue };
        if row.status != ExecutorStatus::Active {
            continue;
        }
        let announced = row.announcement["tools"]
            .as_array()
            .and_then(|tools| tools.iter().find(|t| t["name"].as_str() == Some(tool)));
        if let Some(announced) = announced {
            return Ok(Some((runner, announced["timeout_ms"].as_i64(), announced.get("effect_profile").cloned())));
        }
    }
    Ok(None)
}

/// A summary task settled: its summary is applied; a delegate nobody answered falls back to the
/// kernel summarizer once; any other failure leaves the transcript as it is (and, after
/// `overflow`, the refusal stands).
async fn finish(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    task: TaskRow,
) -> Result<(), ActorProcessingErr> {
    let Some((source, fallback)) = parse_key(task.task_key) else { return Ok(()) };
    let summary = task.result.as_ref().map(model_text).unwrap_or_default();
    if task.status == TaskStatus::Completed
        && task.result.as_ref().is_none_or(|r| r["is_error"] != true)
        && !summary.trim().is_empty()
    {
        return apply(state, source, &task, &summary).await;
    }
    // Nobody answered: the deadline passed unclaimed or uncertain, or no runner serves the tool.
    // An approval that expired or was denied is an answer: the compaction fails.
    let unanswered = match (task.status, task.error_key.as_deref()) {
        (_, Some(word @ ("tool_timeout" | "tool_uncertain" | "tool_not_served"))) => Some(word.to_owned()),
        (TaskStatus::TimedOut, None) => Some("tool_timeout".to_owned()),
        (TaskStatus::Uncertain, None) => Some("tool_uncertain".to_owned()),
        _ => None,
    };
    let delegate = task.kind != TaskKind::ModelTask;
    if let (false, true, Some(reason)) = (fallback, delegate, unanswered) {
        tracing::info!(execution_id = %state.row.public_id, source, reason, "delegate summary unanswered; kernel summarizer instead");
        if let Some(active) = state.compaction.active.as_mut() {
            active.fallback_reason = Some(reason);
        }
        return start_kernel(myself, state, fallback_key(source)).await;
    }
    let word = task.error_key.clone().unwrap_or_else(|| "invalid_summary".to_owned());
    let trigger = state.compaction.active.as_ref().map_or(CompactionTrigger::Manual, |a| a.trigger);
    tracing::warn!(
        execution_id = %state.row.public_id, task_key = %task.task_key, status = %task.status, word, %trigger,
        "compaction failed; the history stays as it was"
    );
    state.compaction.active = None;
    if trigger == CompactionTrigger::Overflow {
        let message = format!(
            "round r{source} does not fit the model's context and its compaction failed ({} {word}); the history \
             stays as it was",
            task.task_key
        );
        return halt(state, "provider_context_overflow", &message).await;
    }
    Ok(())
}

/// Replaces the compacted history with `summary`, durably with `context_compacted`.
async fn apply(
    state: &mut ExecutionState,
    source: i64,
    task: &TaskRow,
    summary: &str,
) -> Result<(), ActorProcessingErr> {
    let Some(plan) = plan(&state.transcript) else {
        state.compaction.active = None;
        return Ok(());
    };
    let retained = state.transcript.len() - plan.tail_start;
    let rewritten = compacted_transcript(&state.transcript, &plan, summary);
    rewrite_transcript(state, rewritten);
    let Some(active) = state.compaction.active.as_mut() else { return Ok(()) };
    active.phase = Phase::Applied;
    let mode = if task.kind == TaskKind::ModelTask { CompactionMode::Kernel } else { CompactionMode::Delegate };
    let compacted = ContextCompacted {
        run_public_id: state.row.public_id,
        task_key: format!("r{source}"),
        summary_task_key: task.task_key,
        mode,
        trigger: active.trigger,
        replaced_messages: plan.compacted.len(),
        retained_messages: retained,
        fallback_from: active.fallback_reason.as_ref().map(|_| CompactionMode::Delegate),
        fallback_reason: active.fallback_reason.clone(),
    };
    tracing::info!(
        execution_id = %state.row.public_id, source, summary_task_key = %task.task_key, replaced = plan.compacted.len(),
        "context compacted"
    );
    emit(state, Event::ContextCompacted(compacted));
    save(state, &[]).await
}

/// A provider rejected round `r{n}` for length: when the policy allows and the round was not
/// repaired before, its compaction is decided (trigger `overflow`) and driven, and the round is
/// asked again under the same number once compacted. Answers `false` when the refusal stands.
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn overflow(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
) -> Result<bool, ActorProcessingErr> {
    let source = state.row.round;
    let enabled = state.declaration.as_deref().and_then(policy).is_some();
    if !enabled || state.compaction.attempted.contains(&source) || plan(&state.transcript).is_none() {
        return Ok(false);
    }
    // The round is asked again under its own number once compacted.
    state.row.round -= 1;
    state.compaction.active = None;
    begin(state, source, CompactionTrigger::Overflow, None, None).await?;
    advance(myself, state).await?;
    Ok(true)
}

/// Handles one [`CompactionMsg`].
///
/// # Errors
/// A store failure, which stops the actor (it reloads from the store on next use).
pub(super) async fn handle(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    msg: CompactionMsg,
) -> Result<(), ActorProcessingErr> {
    match msg {
        CompactionMsg::Manual { reply } => {
            let outcome = manual(myself, state).await;
            answer(reply, outcome, "the compaction", "the execution")
        }
        CompactionMsg::SummaryDone { task_key, model, result } => {
            summarized(myself, state, task_key, &model, result).await
        }
    }
}

/// The kernel summarizer answered: its task settles (durably) with the summary or the failure,
/// and the driver goes on when the execution runs.
async fn summarized(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    task_key: TaskKey,
    model: &str,
    result: Result<ModelResponse, ModelFailure>,
) -> Result<(), ActorProcessingErr> {
    state.compaction.call = None;
    // A stop canceled it meanwhile, or the answer is late.
    let Some(mut task) = state.pending.get(&task_key).filter(|t| t.status == TaskStatus::Running).cloned() else {
        return Ok(());
    };
    let now = state.fabric.clock.now_ms();
    match result {
        Ok(response) => {
            if let Some(usage) = &response.usage {
                emit(
                    state,
                    Event::Usage(Usage {
                        round: parse_key(task_key).map(|(round, _)| round),
                        model: model.to_owned(),
                        summary_task_key: Some(task_key),
                        input_tokens: usage.input_tokens,
                        output_tokens: usage.output_tokens,
                    }),
                );
            }
            let text = response.text.unwrap_or_default();
            if text.trim().is_empty() {
                let message = format!("{model} answered no summary text (finish_reason {})", response.finish_reason);
                settle_failed(&mut task, "provider_error", &message, now);
            } else {
                task.status = TaskStatus::Completed;
                task.settled_at = Some(now);
                task.result = Some(json!({"content": text, "is_error": false, "outcome": "completed"}));
            }
        }
        Err(failure) => {
            let message = format!("{model}: {} (after {} attempt(s))", failure.error, failure.attempts);
            settle_failed(&mut task, failure.key, &message, now);
        }
    }
    state.fabric.store.update_task(&task).await?;
    tracing::info!(execution_id = %state.row.public_id, %task_key, status = %task.status, "summarizer answered");
    narrate(state, &task);
    state.pending.insert(task.task_key, task);
    save(state, &[]).await?;
    if state.row.status == RunStatus::Running {
        advance(myself, state).await?;
    }
    Ok(())
}

/// The manual door (see [`CompactionMsg::Manual`]). Applies to the next model round while it is
/// queued: the execution runs, no model call is out, and its last answer was no final one (its
/// tool calls, a hook or an approval are what it waits for).
async fn manual(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
) -> Result<Result<Value, Refusal>, ActorProcessingErr> {
    let id = state.row.public_id;
    if state.declaration.is_none() {
        return Ok(Err(Refusal::new(
            ErrorCode::TaskNotQueued,
            format!("execution {id} is {}: no model round is queued yet; ask once it runs", state.row.status),
        )));
    }
    let Some(policy) = state.declaration.as_deref().and_then(policy) else {
        return Ok(Err(Refusal::new(
            ErrorCode::CompactionDisabled,
            format!(
                "execution {id} froze no compaction_policy, or mode off; declare {{\"mode\": \"kernel\"}} or \
                 {{\"mode\": \"delegate\", \"tool_name\": …}} for the executions that should compact"
            ),
        )));
    };
    let final_answer =
        matches!(state.transcript.last(), Some(ChatMessage::Assistant { tool_calls, .. }) if tool_calls.is_empty());
    if state.row.status != RunStatus::Running || state.model_call.is_some() || final_answer {
        let why = match state.row.status {
            RunStatus::Running if state.model_call.is_some() => format!("round r{} is running now", state.row.round),
            RunStatus::Running => "its answer is ready and no model round is queued".to_owned(),
            status => format!("it is {status}"),
        };
        return Ok(Err(Refusal::new(
            ErrorCode::TaskNotQueued,
            format!(
                "execution {id} has no queued model round to compact: {why}; ask while it waits for its tool calls"
            ),
        )));
    }
    let source = state.row.round + 1;
    if state.compaction.attempted.contains(&source) || state.compaction.active.is_some() {
        return Ok(Err(Refusal::new(
            ErrorCode::AlreadyCompacted,
            format!(
                "round r{source} of execution {id} is compacted already (or being compacted); a round is compacted at most once"
            ),
        )));
    }
    if plan(&state.transcript).is_none() {
        return Ok(Err(Refusal::new(
            ErrorCode::NothingToCompact,
            format!("execution {id}: {NOTHING_LEFT}; ask again after more rounds"),
        )));
    }
    let task = begin(state, source, CompactionTrigger::Manual, None, None).await?;
    if state.pending.values().all(TaskRow::is_settled) {
        advance(myself, state).await?;
    }
    Ok(Ok(json!({
        "execution_public_id": id,
        "summary_task_key": task.task_key,
        "task_key": format!("r{source}"),
        "trigger": CompactionTrigger::Manual,
        "mode": policy.mode,
        "status": task.status,
    })))
}
