//! The ExecutionActor: one per execution (a Run). It freezes the declaration at materialization
//! and drives rounds: model call, tool calls fanned out as tasks, results, model again, until a
//! final answer (spec/REFERENCE.md 7, "Round driver", and 8).
//!
//! The handler never waits on a model or a runner: a model call runs in a task the actor owns and
//! comes back as [`ExecutionMsg::ModelDone`]; a task's settlement comes back from its
//! [`ExecutorActor`](crate::executor::ExecutorActor) as [`ExecutionMsg::TaskSettled`]. Each
//! round's expansion (its tasks, the transcript and the events narrating it) is one store
//! transaction, and the actor rebuilds itself from the store after a restart.

pub mod kernel;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use uuid::Uuid;

use nexus_proto::{ErrorCode, Refusal};

use crate::declaration::tools::RunnerSelection;
use crate::declaration::{FrozenDeclaration, RunnerFacts, freeze, validate_execution_declaration, wire_projection};
use crate::executor::ExecutorMsg;
use crate::executor::commit::model_text;
use crate::model::{ChatMessage, ModelError, ModelRequest, ModelResponse, ToolCall};
use crate::root::{Fabric, RootHandle};
use crate::store::{EventRow, ExecutionRow, TaskRow, now_ms};

/// The largest tool input, in bytes (`tool_input_too_large`).
pub const TOOL_INPUT_BOUND: usize = 65_536;
/// The longest tool name a model may call (`unknown_tool` beyond it).
pub const TOOL_NAME_BOUND: usize = 128;

/// Whether a task status is terminal (REFERENCE.md 7, "Statuses"). Unknown statuses are live.
pub fn task_status_is_settled(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "canceled" | "timed_out" | "uncertain" | "skipped")
}

/// Whether a run status ends the execution for a follower: terminal, or quiescent until a person
/// acts.
pub fn run_status_is_quiescent(status: &str) -> bool {
    matches!(status, "completed" | "canceled" | "needs_attention")
}

/// The ExecutionActor's messages.
pub enum ExecutionMsg {
    /// Make progress: materialize, or start the next round when nothing is outstanding.
    Advance,
    /// A model call finished.
    ModelDone {
        /// The round it answers.
        round: i64,
        /// The model reference that answered.
        model: String,
        /// The answer.
        result: Result<ModelResponse, ModelError>,
    },
    /// A task settled (durably) in its executor.
    TaskSettled(Box<TaskRow>),
    /// A claimant extended its task's deadline.
    DeadlineExtended {
        /// The task.
        task_key: String,
        /// The new deadline, Unix milliseconds.
        deadline_at: i64,
        /// The extension asked for, in milliseconds.
        timeout_ms: i64,
    },
    /// Stop the execution: open tasks are canceled and it ends `canceled`.
    Stop(RpcReplyPort<Result<ExecutionRow, Refusal>>),
}

/// Arguments: which execution.
pub struct ExecutionArgs {
    /// Shared context.
    pub fabric: Arc<Fabric>,
    /// Root, to find executors.
    pub root: RootHandle,
    /// The execution's UUID.
    pub public_id: Uuid,
}

/// The ExecutionActor's state.
pub struct ExecutionState {
    fabric: Arc<Fabric>,
    root: RootHandle,
    row: ExecutionRow,
    declaration: Option<FrozenDeclaration>,
    transcript: Vec<ChatMessage>,
    /// The current round's tasks by key, settled or not, whose results the model has not read.
    pending: BTreeMap<String, TaskRow>,
    /// Events written with the next save.
    events: Vec<EventRow>,
    model_call: Option<JoinHandle<()>>,
    /// Index into `[default_model] + fallback_models` of the model in use.
    model_index: usize,
}

/// The ExecutionActor.
pub struct ExecutionActor;

impl Actor for ExecutionActor {
    type Msg = ExecutionMsg;
    type State = ExecutionState;
    type Arguments = ExecutionArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<ExecutionMsg>,
        args: ExecutionArgs,
    ) -> Result<ExecutionState, ActorProcessingErr> {
        let store = &args.fabric.store;
        let row = store.execution(args.public_id).await?.ok_or_else(|| format!("no execution {}", args.public_id))?;
        let transcript: Vec<ChatMessage> = serde_json::from_value(row.transcript.clone())?;
        let declaration: Option<FrozenDeclaration> = row.declaration.clone().map(serde_json::from_value).transpose()?;
        // Calls whose results the model has not read yet: the current round's tasks that are not
        // in the transcript.
        let answered: HashSet<&str> = transcript
            .iter()
            .filter_map(|m| match m {
                ChatMessage::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
                _ => None,
            })
            .collect();
        let tasks = store.tasks_of(args.public_id).await?;
        // A task settles in its executor first and is narrated here after; a crash between the
        // two leaves a settled task with no `task_status` event. Recovery writes what is missing,
        // so every settlement reaches the feed exactly once.
        let narrated: HashSet<String> = store
            .events_after(args.public_id, 0, i64::MAX)
            .await?
            .into_iter()
            .filter(|e| e.event_type == "task_status" && e.data["status"].as_str().is_some_and(task_status_is_settled))
            .filter_map(|e| e.data["task_key"].as_str().map(str::to_owned))
            .collect();
        let unnarrated: Vec<TaskRow> =
            tasks.iter().filter(|t| t.is_settled() && !narrated.contains(&t.task_key)).cloned().collect();
        let pending = tasks
            .into_iter()
            .filter(|t| t.round == row.round && !answered.contains(t.tool_call_id.as_str()))
            .map(|t| (t.task_key.clone(), t))
            .collect();
        let mut state = ExecutionState {
            fabric: args.fabric,
            root: args.root,
            row,
            declaration,
            transcript,
            pending,
            events: Vec::new(),
            model_call: None,
            model_index: 0,
        };
        for task in &unnarrated {
            emit(&mut state, "task_status", task_status_data(task));
        }
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
        myself.cast(ExecutionMsg::Advance)?;
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
            ExecutionMsg::ModelDone { round, model, result } => {
                if round != state.row.round || state.row.status != "running" {
                    return Ok(());
                }
                state.model_call = None;
                model_done(&myself, state, &model, result).await?;
            }
            ExecutionMsg::TaskSettled(task) => {
                let Some(held) = state.pending.get_mut(&task.task_key) else { return Ok(()) };
                if held.is_settled() {
                    return Ok(());
                }
                *held = (*task).clone();
                emit(state, "task_status", task_status_data(&task));
                save(state, &[]).await?;
                if state.row.status == "running" {
                    advance(&myself, state).await?;
                }
            }
            ExecutionMsg::DeadlineExtended { task_key, deadline_at, timeout_ms } => {
                if let Some(task) = state.pending.get_mut(&task_key) {
                    let by = deadline_at - task.deadline_at;
                    task.deadline_at = deadline_at;
                    emit(
                        state,
                        "task_deadline_extended",
                        json!({"task_key": task_key, "deadline_at": deadline_at, "by": by, "timeout_ms": timeout_ms}),
                    );
                    save(state, &[]).await?;
                }
            }
            ExecutionMsg::Stop(reply) => {
                let result = stop(state).await;
                let _ = reply.send(result);
                if run_status_is_quiescent(&state.row.status) {
                    myself.stop(None);
                }
            }
        }
        if run_status_is_quiescent(&state.row.status) && state.pending.values().all(TaskRow::is_settled) {
            myself.stop(None);
        }
        Ok(())
    }
}

fn emit(state: &mut ExecutionState, event_type: &str, data: Value) {
    state.row.event_seq += 1;
    state.events.push(EventRow { seq: state.row.event_seq, event_type: event_type.to_owned(), data, at: now_ms() });
}

/// Writes the row, new tasks and pending events in one transaction, then wakes followers.
async fn save(state: &mut ExecutionState, new_tasks: &[TaskRow]) -> Result<(), ActorProcessingErr> {
    state.row.transcript = serde_json::to_value(&state.transcript)?;
    state.row.declaration = state.declaration.as_ref().map(serde_json::to_value).transpose()?;
    let events = std::mem::take(&mut state.events);
    state.fabric.store.save_execution(&state.row, new_tasks, &events).await?;
    state.fabric.events.publish(state.row.public_id, state.row.event_seq);
    if run_status_is_quiescent(&state.row.status) {
        state.fabric.events.close(state.row.public_id);
    }
    Ok(())
}

fn task_status_data(task: &TaskRow) -> Value {
    let mut data = json!({
        "task_key": task.task_key,
        "kind": "tool_task",
        "status": task.status,
        "tool_name": task.callable_name,
        "served_name": task.tool_name,
        "tool_call_id": task.tool_call_id,
        "runner_executor_public_id": task.target_executor_public_id,
        "error_key": task.error_key,
    });
    if task.is_settled() {
        data["content"] = json!(result_text(task));
        if let Some(result) = &task.result {
            data["is_error"] = result["is_error"].clone();
        }
    }
    data
}

/// The text the model reads for a settled task.
fn result_text(task: &TaskRow) -> String {
    let content = task.result.as_ref().map(model_text).unwrap_or_default();
    match (task.status.as_str(), task.error_key.as_deref()) {
        ("completed", _) => content,
        ("timed_out", _) => {
            format!("tool_timeout: {} did not finish within its deadline ({} ms)", task.callable_name, task.timeout_ms)
        }
        ("uncertain", _) => format!(
            "tool_uncertain: {} was claimed but no result arrived before its deadline; its effect may have happened",
            task.callable_name
        ),
        ("canceled", _) => format!("task_canceled: {} was canceled", task.callable_name),
        (_, Some(key)) if content.is_empty() => format!("{key}: {} could not run", task.callable_name),
        (_, Some(key)) => format!("{key}: {content}"),
        (status, None) => format!("{status}: {content}"),
    }
}

async fn advance(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState) -> Result<(), ActorProcessingErr> {
    let status = state.row.status.clone();
    match status.as_str() {
        "pending" if materialize(state).await? => start_round(myself, state).await?,
        "running" => {
            if state.model_call.is_some() || !state.pending.values().all(TaskRow::is_settled) {
                return Ok(());
            }
            if state
                .transcript
                .last()
                .is_some_and(|m| matches!(m, ChatMessage::Assistant { tool_calls, .. } if tool_calls.is_empty()))
            {
                return Ok(());
            }
            // Every call of the round has settled: its results go back to the model in call order.
            let mut settled: Vec<TaskRow> = std::mem::take(&mut state.pending).into_values().collect();
            settled
                .sort_by_key(|t| t.task_key.trim_start_matches(&format!("r{}t", t.round)).parse::<u64>().unwrap_or(0));
            for task in &settled {
                state
                    .transcript
                    .push(ChatMessage::Tool { tool_call_id: task.tool_call_id.clone(), content: result_text(task) });
            }
            start_round(myself, state).await?;
        }
        _ => {}
    }
    Ok(())
}

/// Resolves and freezes the declaration. Returns `false` when the execution ended instead.
async fn materialize(state: &mut ExecutionState) -> Result<bool, ActorProcessingErr> {
    let store = &state.fabric.store;
    let input = store.input(state.row.input_public_id).await?.ok_or("the execution's input is missing")?;
    let profile = store.profile(state.row.member_public_id).await?.unwrap_or_default();
    let models = &state.fabric.models;
    let check = |reference: &str| models.check(reference);
    let (configuration, system_prompt) = match &input.execution_declaration {
        Some(inline) => {
            let Some(object) = inline.as_object() else {
                return end_refused(
                    state,
                    &Refusal::new(ErrorCode::ValidationFailed, "execution_declaration must be an object"),
                )
                .await;
            };
            match validate_execution_declaration(object, &check) {
                Ok(validated) => (validated.configuration, validated.system_prompt),
                Err(refusal) => return end_refused(state, &refusal).await,
            }
        }
        None => match profile.configuration.clone() {
            Some(configuration) => (configuration, profile.system_prompt.clone()),
            None => {
                let refusal =
                    Refusal::new(ErrorCode::ValidationFailed, "the answering profile has not declared a configuration");
                return end_refused(state, &refusal).await;
            }
        },
    };
    let runners = runner_facts(store, &configuration).await.map_err(|r| r.message)?;
    let tool_names: Option<Vec<String>> =
        input.tool_names.as_ref().and_then(|v| serde_json::from_value(v.clone()).ok());
    let frozen = match freeze(
        &configuration,
        system_prompt,
        RunnerSelection::or_first_eligible(input.runner_executor_public_id),
        &runners,
        tool_names.as_deref(),
    ) {
        Ok(frozen) => frozen,
        Err(refusal) => return end_refused(state, &refusal).await,
    };
    if frozen.default_model.is_none() {
        let refusal = Refusal::new(ErrorCode::ValidationFailed, "default_model: the declaration names no model to run");
        return end_refused(state, &refusal).await;
    }
    if let Some(content) =
        frozen.system_prompt.as_ref().and_then(|doc| doc["content"].as_str()).filter(|c| !c.is_empty())
    {
        state.transcript.push(ChatMessage::System { content: content.to_owned() });
    }
    state.transcript.push(ChatMessage::User { content: input.text.clone() });
    emit(
        state,
        "input_materialized",
        json!({
            "input_public_id": input.public_id,
            "declaration_digest": frozen.digest,
            "default_model": frozen.default_model,
            "default_runner_executor_public_id": frozen.default_runner_executor_public_id,
            "tools": frozen.tools.iter().map(|t| json!({"name": t.name, "route": t.route})).collect::<Vec<_>>(),
            "runner_candidates": frozen.runner_candidates,
        }),
    );
    tracing::info!(execution_id = %state.row.public_id, tools = frozen.tools.len(), "execution materialized");
    state.declaration = Some(frozen);
    state.row.status = "running".into();
    emit(state, "turn_status", json!({"status": "running"}));
    save(state, &[]).await?;
    Ok(true)
}

/// The facts of every runner a configuration names (candidates, then explicit route targets) that
/// exists, read from the store.
///
/// # Errors
/// `internal` on a store failure.
pub async fn runner_facts(store: &crate::store::Store, configuration: &Value) -> Result<Vec<RunnerFacts>, Refusal> {
    let mut ids: Vec<Uuid> = configuration["runner_executor_public_ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().and_then(|s| Uuid::parse_str(s).ok()))
        .collect();
    for entry in configuration["tool_definitions"].as_array().into_iter().flatten() {
        if let Some(id) = entry["route"]["runner_executor_public_id"].as_str().and_then(|s| Uuid::parse_str(s).ok())
            && !ids.contains(&id)
        {
            ids.push(id);
        }
    }
    let mut runners = Vec::new();
    for id in ids {
        let row = store
            .executor(id)
            .await
            .map_err(|e| Refusal::new(ErrorCode::Internal, format!("the store failed: {e}")))?;
        if let Some(row) = row {
            runners.push(RunnerFacts {
                public_id: id,
                display_name: row.display_name.clone(),
                eligible: row.status == "active",
                announcement: row.announcement.clone(),
            });
        }
    }
    Ok(runners)
}

async fn end_refused(state: &mut ExecutionState, refusal: &Refusal) -> Result<bool, ActorProcessingErr> {
    tracing::info!(execution_id = %state.row.public_id, code = %refusal.code, "execution refused at materialization");
    state.row.status = "canceled".into();
    state.row.error_key = Some(refusal.code.clone());
    emit(state, "turn_status", json!({"status": "failed", "error_key": refusal.code, "message": refusal.message}));
    save(state, &[]).await?;
    Ok(false)
}

/// The routes an execution may use, in order: the default model, then the captured fallbacks,
/// each route visited once.
fn model_chain(declaration: &FrozenDeclaration) -> Vec<String> {
    let mut chain: Vec<String> = Vec::new();
    for route in declaration.default_model.iter().chain(declaration.fallback_models.iter()) {
        if !chain.contains(route) {
            chain.push(route.clone());
        }
    }
    chain
}

async fn start_round(myself: &ActorRef<ExecutionMsg>, state: &mut ExecutionState) -> Result<(), ActorProcessingErr> {
    let Some(declaration) = &state.declaration else { return Err("a round before materialization".into()) };
    let chain = model_chain(declaration);
    // Availability is judged live: an unavailable route is skipped without provider I/O.
    let mut resolved = None;
    while state.model_index < chain.len() {
        match state.fabric.models.resolve(&chain[state.model_index]) {
            Ok(model) => {
                resolved = Some(model);
                break;
            }
            Err(e) => {
                tracing::warn!(execution_id = %state.row.public_id, model = %chain[state.model_index], word = e.word(), "model route unavailable; skipping");
                state.model_index += 1;
            }
        }
    }
    let Some(model) = resolved else {
        return halt(state, "provider_model_unavailable", "no model in the declaration's chain is available").await;
    };
    let request = ModelRequest {
        model: model.model.clone(),
        messages: state.transcript.clone(),
        tools: wire_projection(&declaration.tools),
    };
    state.row.round += 1;
    let round = state.row.round;
    emit(state, "round_started", json!({"round": round, "model": model.reference}));
    save(state, &[]).await?;

    let cfg = &state.fabric.config.execution;
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(cfg.model_retry_min_delay_ms))
        .with_max_delay(Duration::from_millis(cfg.model_retry_max_delay_ms))
        .with_max_times(cfg.model_attempts.saturating_sub(1))
        .with_jitter();
    let actor = myself.clone();
    let reference = model.reference.clone();
    let execution_id = state.row.public_id;
    state.model_call = Some(tokio::spawn(async move {
        let client = model.client;
        let call = || {
            let request = request.clone();
            let client = client.clone();
            async move { client.complete(request).await }
        };
        let result = call
            .retry(backoff)
            .when(ModelError::retryable)
            .notify(|e, wait| tracing::info!(%execution_id, error = %e, ?wait, "model call failed; retrying"))
            .await;
        let _ = actor.cast(ExecutionMsg::ModelDone { round, model: reference, result });
    }));
    Ok(())
}

async fn halt(state: &mut ExecutionState, error_key: &str, message: &str) -> Result<(), ActorProcessingErr> {
    tracing::warn!(execution_id = %state.row.public_id, error_key, "execution halted");
    state.row.status = "needs_attention".into();
    state.row.attention_reason = Some("halt_failure".into());
    state.row.error_key = Some(error_key.to_owned());
    emit(state, "attention_required", json!({"reason": "halt_failure", "error_key": error_key, "message": message}));
    emit(state, "turn_status", json!({"status": "failed", "error_key": error_key}));
    save(state, &[]).await
}

async fn model_done(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    model: &str,
    result: Result<ModelResponse, ModelError>,
) -> Result<(), ActorProcessingErr> {
    let response = match result {
        Ok(response) => response,
        Err(error) => {
            // The fallback advances on a classifier refusal or exhausted retryable failures.
            let chain_len = state.declaration.as_ref().map_or(0, |d| model_chain(d).len());
            if (error.key() == "model_refused" || error.retryable()) && state.model_index + 1 < chain_len {
                state.model_index += 1;
                emit(state, "model_change", json!({"from": model, "reason": error.key()}));
                state.row.round -= 1;
                return start_round(myself, state).await;
            }
            return halt(state, error.key(), &error.to_string()).await;
        }
    };
    let round = state.row.round;
    if let Some(usage) = &response.usage {
        emit(
            state,
            "usage",
            json!({"round": round, "model": model, "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}),
        );
    }
    if response.tool_calls.is_empty() {
        let text = response.text.clone().unwrap_or_default();
        state.transcript.push(ChatMessage::Assistant { content: Some(text.clone()), tool_calls: Vec::new() });
        state.row.final_text = Some(text.clone());
        state.row.status = "completed".into();
        emit(
            state,
            "round_result",
            json!({"round": round, "model": model, "text": text, "tool_calls": [], "finish_reason": response.finish_reason}),
        );
        emit(state, "turn_status", json!({"status": "completed"}));
        save(state, &[]).await?;
        tracing::info!(execution_id = %state.row.public_id, rounds = round, "execution completed");
        return Ok(());
    }
    state
        .transcript
        .push(ChatMessage::Assistant { content: response.text.clone(), tool_calls: response.tool_calls.clone() });
    let tasks: Vec<TaskRow> =
        response.tool_calls.iter().enumerate().map(|(i, call)| task_for_call(state, round, i, call)).collect();
    emit(
        state,
        "round_result",
        json!({
            "round": round,
            "model": model,
            "text": response.text,
            "finish_reason": response.finish_reason,
            "tool_calls": tasks.iter().map(|t| json!({
                "task_key": t.task_key, "name": t.callable_name, "tool_call_id": t.tool_call_id, "input": t.tool_input,
                "runner_executor_public_id": t.target_executor_public_id,
            })).collect::<Vec<_>>(),
        }),
    );
    for task in &tasks {
        emit(state, "task_status", task_status_data(task));
    }
    for task in &tasks {
        state.pending.insert(task.task_key.clone(), task.clone());
    }
    if tasks.iter().any(|t| t.status == "needs_approval") {
        state.row.status = "needs_attention".into();
        state.row.attention_reason = Some("approval_required".into());
        emit(
            state,
            "attention_required",
            json!({"reason": "approval_required",
            "blocked_task_keys": tasks.iter().filter(|t| t.status == "needs_approval").map(|t| t.task_key.clone()).collect::<Vec<_>>()}),
        );
    }
    save(state, &tasks).await?;
    for task in tasks.iter().filter(|t| t.status == "dispatched") {
        let Some(target) = task.target_executor_public_id else { continue };
        match state.root.executor(target).await {
            Ok(executor) => {
                let _ = executor.cast(ExecutorMsg::Offer { run: task.run_public_id, task_key: task.task_key.clone() });
            }
            // The row is durable and addressed; the executor offers it when it next loads.
            Err(refusal) => {
                tracing::warn!(runner_id = %target, code = %refusal.code, "cannot reach the runner's inbox now")
            }
        }
    }
    advance(myself, state).await
}

/// Turns one model tool call into a task row: dispatched to its frozen runner target, or settled
/// at once with the per-call failure word.
fn task_for_call(state: &ExecutionState, round: i64, index: usize, call: &ToolCall) -> TaskRow {
    let now = now_ms();
    let default_timeout = i64::try_from(state.fabric.config.execution.default_task_timeout_ms).unwrap_or(i64::MAX);
    let mut task = TaskRow {
        run_public_id: state.row.public_id,
        task_key: format!("r{round}t{index}"),
        kind: "tool_call".into(),
        round,
        callable_name: call.name.clone(),
        tool_name: call.name.clone(),
        tool_input: json!({}),
        tool_call_id: if call.id.is_empty() || call.id.len() > 128 {
            format!("r{round}t{index}")
        } else {
            call.id.clone()
        },
        target_executor_public_id: None,
        effect_profile: None,
        timeout_ms: default_timeout,
        status: "failed".into(),
        claimed: false,
        claim_token_digest: None,
        started_at: now,
        deadline_at: now,
        result: None,
        error_key: None,
        settled_at: Some(now),
    };
    let fail = |mut task: TaskRow, key: &str, message: String| {
        task.error_key = Some(key.to_owned());
        task.result = Some(json!({"content": message, "is_error": true, "outcome": "failed"}));
        task
    };
    let declared = state
        .declaration
        .as_ref()
        .and_then(|d| d.tools.iter().find(|t| t.name == call.name))
        .filter(|_| call.name.len() <= TOOL_NAME_BOUND);
    let Some(tool) = declared else {
        return fail(task, "unknown_tool", format!("{} is not a declared tool", call.name));
    };
    let input: Value = match serde_json::from_str(&call.arguments) {
        Ok(value @ Value::Object(_)) => value,
        Ok(_) | Err(_) if call.arguments.trim().is_empty() => json!({}),
        _ => return fail(task, "invalid_tool_arguments", "the arguments must be a JSON object".into()),
    };
    if call.arguments.len() > TOOL_INPUT_BOUND {
        return fail(task, "tool_input_too_large", "the arguments are over 64 KiB".into());
    }
    // Aliases run under the kernel wire name with their parameters mapped; the callable name
    // stays beside it as the alias (REFERENCE.md 4, "Call resolution").
    let resolved = tool.resolve_call(&input);
    task.tool_name = resolved.wire_name;
    task.tool_input = resolved.input;
    let mode = state.declaration.as_ref().and_then(|d| d.approval_mode.as_deref()).unwrap_or("bypass");
    let Some(route) = &tool.route else {
        let in_process = state.declaration.as_ref().and_then(|d| kernel::run(d, &task.tool_name, &task.tool_input));
        return match in_process {
            Some(_) if mode != "bypass" => {
                task.status = "needs_approval".into();
                task.settled_at = None;
                task
            }
            Some(Ok(result)) => {
                task.status = "completed".into();
                task.result = Some(
                    json!({"content": result.to_string(), "structured_content": result, "is_error": false, "outcome": "completed"}),
                );
                task
            }
            Some(Err(message)) => {
                task.status = "completed".into();
                task.result = Some(json!({"content": message, "is_error": true, "outcome": "completed"}));
                task
            }
            None => fail(
                task,
                "tool_not_served",
                format!("{} has no runner route and no in-process implementation here", call.name),
            ),
        };
    };
    task.target_executor_public_id = Some(route.runner_executor_public_id);
    task.effect_profile = tool.effect_profile.clone();
    if let Some(timeout) = tool.timeout_ms {
        task.timeout_ms = i64::try_from(timeout).unwrap_or(i64::MAX);
    }
    task.deadline_at = now.saturating_add(task.timeout_ms);
    task.settled_at = None;
    task.status = if mode == "bypass" { "dispatched".into() } else { "needs_approval".into() };
    task
}

async fn stop(state: &mut ExecutionState) -> Result<ExecutionRow, Refusal> {
    if matches!(state.row.status.as_str(), "completed" | "canceled") {
        return Ok(state.row.clone());
    }
    if let Some(call) = state.model_call.take() {
        call.abort();
    }
    for task in state.pending.values_mut().filter(|t| !t.is_settled()) {
        match (task.status.as_str(), task.target_executor_public_id) {
            ("dispatched", Some(target)) => match state.root.executor(target).await {
                Ok(executor) => {
                    let _ =
                        executor.cast(ExecutorMsg::Cancel { run: task.run_public_id, task_key: task.task_key.clone() });
                }
                Err(refusal) => {
                    tracing::warn!(runner_id = %target, code = %refusal.code, "cannot cancel at the runner's inbox")
                }
            },
            _ => {
                task.status = "canceled".into();
                task.error_key = Some("task_canceled".into());
                task.settled_at = Some(now_ms());
                if let Err(e) = state.fabric.store.update_task(task).await {
                    tracing::warn!(error = %e, "could not record a canceled task");
                }
            }
        }
    }
    state.row.status = "canceled".into();
    state.row.error_key = Some("run_canceled".into());
    emit(state, "turn_status", json!({"status": "canceled", "error_key": "run_canceled"}));
    save(state, &[]).await.map_err(|e| Refusal::new(ErrorCode::Internal, format!("could not record the stop: {e}")))?;
    tracing::info!(execution_id = %state.row.public_id, "execution stopped");
    Ok(state.row.clone())
}
