//! The conversation tools of delegation (`docs/delegation.md`, "The tools" and "spawn"):
//! `spawn` starts a child conversation under an inline declaration (a `delegation_catalog` entry's
//! leaf, a named definition, or the caller's own declaration), `send` posts to a child
//! conversation, `status` reads one, `cancel` stops its running work. They run off the actor, in
//! the task [`super::delegation::launch`] starts; bad input is a call error envelope.

use serde_json::{Map, Value, json};

use nexus_proto::{
    ChildDisposition, ChildKind, ConversationId, DeliveryMode, ErrorCode, ExecutionId, InputId, RunStatus, RunnerId,
};

use crate::actors::fabric::Fabric;
use crate::actors::root::RootHandle;
use crate::declaration::FrozenDeclaration;
use crate::store::children::ChildRow;
use crate::store::queue::Admission;
use crate::store::{ExecutionRow, InputRow, TaskRow};

use super::delegation::{ExecutionRowRef, child_execution, child_input, lifetime_and_wake, new_child, wake_child};
use super::kernel::KernelFailure;

/// The longest spawn `label` (REFERENCE 5).
pub const LABEL_BOUND: usize = 64;

/// The longest message `send` posts, in bytes (the input door's bound).
pub const MESSAGE_BOUND: usize = 1_048_576;

/// What a conversation tool came to.
pub enum Outcome {
    /// A result (or a call error envelope) the model reads.
    Result(Result<Value, String>),
    /// `spawn` started a child; the call waits on its first turn when `wait`.
    Child {
        /// The child.
        child: ChildRow,
        /// `wait: true`.
        wait: bool,
    },
}

fn refused(message: impl Into<String>) -> Result<Outcome, KernelFailure> {
    Ok(Outcome::Result(Err(message.into())))
}

/// Runs the conversation tool `name` for `task` of `execution`.
///
/// # Errors
/// A store failure.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    fabric: &Fabric,
    root: &RootHandle,
    declaration: &FrozenDeclaration,
    execution: &ExecutionRow,
    current_model: Option<&str>,
    allocation: Option<crate::budget::BudgetLimits>,
    task: &TaskRow,
    name: &str,
) -> Result<Outcome, KernelFailure> {
    let Some(input) = task.tool_input.as_object() else { return refused("the input must be an object") };
    match name {
        "spawn" => spawn(fabric, root, declaration, execution, current_model, allocation, task, input).await,
        "send" => send(fabric, root, execution, input).await,
        "status" => status(fabric, execution, input).await,
        "cancel" => cancel(fabric, root, execution, task, input).await,
        _ => Ok(Outcome::Result(Err(format!("{name} is not a conversation tool")))),
    }
}

/// A string parameter, when present.
fn text<'a>(input: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, String> {
    match input.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(format!("{key} must be a string")),
    }
}

/// Whether `label` is a spawn label: `[a-z0-9][a-z0-9_-]*`, at most 64 characters.
#[must_use]
pub fn is_label(label: &str) -> bool {
    let mut chars = label.chars();
    label.len() <= LABEL_BOUND
        && chars.next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The runner ids of a declaration's candidates.
fn candidates(declaration: &FrozenDeclaration) -> Vec<RunnerId> {
    declaration
        .runner_candidates
        .iter()
        .filter_map(|c| c["runner_executor_public_id"].as_str().and_then(|id| RunnerId::parse_any_case(id).ok()))
        .collect()
}

#[allow(clippy::too_many_lines, clippy::too_many_arguments)]
async fn spawn(
    fabric: &Fabric,
    root: &RootHandle,
    declaration: &FrozenDeclaration,
    execution: &ExecutionRow,
    current_model: Option<&str>,
    allocation: Option<crate::budget::BudgetLimits>,
    task: &TaskRow,
    input: &Map<String, Value>,
) -> Result<Outcome, KernelFailure> {
    let wait = match input.get("wait") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(wait)) => *wait,
        Some(_) => return refused("wait must be true or false."),
    };
    if let Some(existing) = fabric.store.child(execution.public_id, task.task_key).await? {
        return Ok(Outcome::Child { child: existing, wait });
    }
    if let Err(message) = super::delegation::within_bounds(&fabric.store, execution).await? {
        return refused(message);
    }
    let known = [
        "prompt",
        "agent",
        "label",
        "lifetime",
        "wake",
        "wait",
        "default_runner_executor_public_id",
        "model",
        "declaration",
    ];
    if let Some(key) = input.keys().find(|key| !known.contains(&key.as_str())) {
        return refused(format!("{key} is not a parameter of spawn; it takes {}", known.join(", ")));
    }
    let prompt = match text(input, "prompt") {
        Ok(Some(prompt)) if !prompt.trim().is_empty() => prompt,
        Ok(_) => return refused("prompt is empty"),
        Err(message) => return refused(message),
    };
    let (label, agent, model, entry) =
        match (text(input, "label"), text(input, "agent"), text(input, "model"), text(input, "declaration")) {
            (Ok(label), Ok(agent), Ok(model), Ok(entry)) => (label, agent, model, entry),
            (Err(m), ..) | (_, Err(m), ..) | (_, _, Err(m), _) | (.., Err(m)) => return refused(m),
        };
    if let Some(label) = label {
        if !is_label(label) {
            return refused("label must match [a-z0-9][a-z0-9_-]* and be at most 64 characters");
        }
        if fabric.store.child_label_taken(execution.conversation_public_id, label).await? {
            return refused(format!("label {label} already names a child of this conversation; choose another"));
        }
    }
    let (lifetime, wake) = match lifetime_and_wake(input) {
        Ok(fields) => fields,
        Err(message) => return refused(message),
    };
    // The child's declaration, authored (R49–R52): a catalog entry's leaf, a named definition, or
    // the caller's own.
    let catalog = &declaration.delegation_catalog;
    let mut authored: Map<String, Value> = match catalog.as_array() {
        Some(entries) => {
            if agent.is_some() {
                return refused(
                    "agent: this declaration publishes a delegation_catalog, so spawn names a catalog entry with \
                     declaration instead of an agent",
                );
            }
            let Some(name) = entry else {
                return refused("declaration: name one of the delegation_catalog's entries");
            };
            let Some(found) = entries.iter().find(|e| e["name"] == name) else {
                let names: Vec<&str> = entries.iter().filter_map(|e| e["name"].as_str()).collect();
                return refused(format!(
                    "declaration: {name} is not a delegation_catalog entry (entries: {})",
                    names.join(", ")
                ));
            };
            let mut leaf = found["declaration"].as_object().cloned().unwrap_or_default();
            // R51: `caller` runs on the caller's actual current model; `default` on the leaf's.
            if found["model_mode"] == "caller"
                && let Some(current) = current_model
            {
                leaf.insert("default_model".into(), json!(current));
            }
            // The catalog is carried to the child for nested delegation.
            if leaf.get("delegation_catalog").is_none_or(Value::is_null) {
                leaf.insert("delegation_catalog".into(), catalog.clone());
            }
            leaf
        }
        None => {
            if entry.is_some() {
                return refused("declaration: this declaration has no delegation_catalog; name an agent, or omit both");
            }
            match agent {
                Some(handle) => {
                    let name = handle.strip_prefix('@').unwrap_or(handle);
                    let definitions = fabric.store.named_definitions(execution.member_public_id).await?;
                    let Some(definition) = definitions.iter().find(|d| d.name == name) else {
                        return refused(format!(
                            "{}: agent {handle} is not a named definition of this Agent (PUT /agent_api/v1/profile/agents/{name} first)",
                            ErrorCode::PrincipalUnknown.as_str()
                        ));
                    };
                    let mut object = definition.configuration.as_object().cloned().unwrap_or_default();
                    if let Some(prompt) = &definition.system_prompt {
                        object.insert("system_prompt".into(), prompt.clone());
                    }
                    object
                }
                None => own_declaration(fabric, execution).await?,
            }
        }
    };
    // A `subtree` reach is inherited and never widened (R37).
    if declaration.conversation_reach == crate::declaration::memory::ConversationReach::Subtree {
        authored.insert("conversation_reach".into(), json!("subtree"));
    }
    // An explicit model wins (R51).
    if let Some(model) = model {
        if let Err(error) = fabric.models.resolve(model) {
            return refused(format!(
                "{}: {model} is not available here ({}); omit model",
                ErrorCode::ModelNotAuthorized.as_str(),
                error.word()
            ));
        }
        authored.insert("default_model".into(), json!(model));
    }
    // The child reaches no runner the caller lacks (R33), and inherits the caller's frozen default
    // unless the call names another; null means none (R32).
    let allowed = candidates(declaration);
    let declared: Vec<RunnerId> = authored
        .get("runner_executor_public_ids")
        .and_then(Value::as_array)
        .map(|ids| ids.iter().filter_map(|id| id.as_str().and_then(|s| RunnerId::parse_any_case(s).ok())).collect())
        .unwrap_or_default();
    if let Some(outside) = declared.iter().find(|id| !allowed.contains(id)) {
        return refused(format!(
            "{}: the child's declaration names runner {outside}, which this execution cannot reach; a child reaches only its parent's runners",
            ErrorCode::RunnerNotDeclared.as_str()
        ));
    }
    let runner = match input.get("default_runner_executor_public_id") {
        None => declaration.default_runner_executor_public_id.filter(|id| declared.contains(id)),
        Some(Value::Null) => None,
        Some(Value::String(id)) => match RunnerId::parse_any_case(id) {
            Ok(id) if declared.contains(&id) => Some(id),
            Ok(id) => {
                return refused(format!(
                    "{}: runner {id} is not among the child declaration's runner_executor_public_ids",
                    ErrorCode::RunnerNotDeclared.as_str()
                ));
            }
            Err(_) => return refused("default_runner_executor_public_id must be a runner UUID or null"),
        },
        Some(_) => return refused("default_runner_executor_public_id must be a runner UUID or null"),
    };
    let check = |reference: &str| fabric.models.check(reference);
    let authored = Value::Object(authored);
    if let Err(refusal) =
        crate::declaration::validate_execution_declaration(authored.as_object().unwrap_or(&Map::new()), &check)
    {
        return refused(format!("declaration: {}: {}", refusal.code, refusal.message));
    }
    let now = fabric.clock.now_ms();
    let at = ExecutionRowRef { execution, task };
    let parent_input = fabric.store.input(execution.input_public_id).await?;
    let child = new_child(&at, ChildKind::Spawn, prompt, lifetime, wake, label.map(str::to_owned), now);
    let row = child_input(&child, &at, prompt, parent_input.as_ref(), Some(authored), runner);
    let mut child_row = child_execution(&child, &at, row.public_id, None, now);
    child_row.budget = allocation.map(|a| crate::budget::BudgetLedger::for_child(a, now));
    let (child, created) = fabric.store.start_child(&child, &row, &child_row, &[]).await?;
    if created {
        tracing::info!(child = %child.child_execution_public_id, task_key = %child.task_key, "child conversation spawned");
    }
    wake_child(root, &child).await;
    Ok(Outcome::Child { child, wait })
}

/// The caller's own declaration as an authored object: its input's inline one, else its Agent's
/// standing configuration as it is now.
async fn own_declaration(fabric: &Fabric, execution: &ExecutionRow) -> Result<Map<String, Value>, KernelFailure> {
    let input = fabric.store.input(execution.input_public_id).await?;
    if let Some(Value::Object(inline)) = input.and_then(|i| i.execution_declaration) {
        return Ok(inline);
    }
    let profile = fabric.store.profile(execution.member_public_id).await?.unwrap_or_default();
    let mut object = profile.configuration.and_then(|c| c.as_object().cloned()).unwrap_or_default();
    if let Some(prompt) = profile.system_prompt {
        object.insert("system_prompt".into(), prompt);
    }
    Ok(object)
}

/// A conversation a conversation tool addresses: a spawned child conversation of the caller's
/// conversation, by label or id, with the row that made it a child.
async fn addressed(
    fabric: &Fabric,
    execution: &ExecutionRow,
    to: &str,
) -> Result<Result<ChildRow, String>, KernelFailure> {
    let conversation = execution.conversation_public_id;
    let by_id = to.parse::<ConversationId>().ok();
    if by_id == Some(conversation) {
        return Ok(Err(format!(
            "{}: {to} is this conversation; address a child conversation",
            ErrorCode::AncestorConversation.as_str()
        )));
    }
    let spawned = fabric.store.spawned_children(conversation).await?;
    let found = spawned.into_iter().find(|child| match by_id {
        Some(id) => child.child_conversation_public_id == id,
        None => child.label.as_deref() == Some(to),
    });
    match found {
        Some(child) => Ok(Ok(child)),
        None => Ok(Err(format!(
            "{}: no child conversation of this conversation is labelled or identified {to}; spawn one first",
            ErrorCode::UnknownConversation.as_str()
        ))),
    }
}

/// The child conversation that `to` names, for `tool`, which takes `to` alone.
async fn addressed_by_to(
    fabric: &Fabric,
    execution: &ExecutionRow,
    tool: &str,
    input: &Map<String, Value>,
) -> Result<Result<ChildRow, String>, KernelFailure> {
    if let Some(key) = input.keys().find(|key| key.as_str() != "to") {
        return Ok(Err(format!("{key} is not a parameter of {tool}; it takes to")));
    }
    match text(input, "to") {
        Ok(Some(to)) => addressed(fabric, execution, to).await,
        Ok(None) => Ok(Err("to is required".into())),
        Err(message) => Ok(Err(message)),
    }
}

async fn send(
    fabric: &Fabric,
    root: &RootHandle,
    execution: &ExecutionRow,
    input: &Map<String, Value>,
) -> Result<Outcome, KernelFailure> {
    let known = ["to", "message", "agent", "steer", "deliver_in", "deliver_at", "wake", "model"];
    if let Some(key) = input.keys().find(|key| !known.contains(&key.as_str())) {
        return refused(format!("{key} is not a parameter of send; it takes {}", known.join(", ")));
    }
    let (to, message) = match (text(input, "to"), text(input, "message")) {
        (Ok(Some(to)), Ok(Some(message))) if !message.trim().is_empty() => (to, message),
        (Err(m), _) | (_, Err(m)) => return refused(m),
        _ => return refused("to and message are required"),
    };
    if message.len() > MESSAGE_BOUND || message.contains('\0') {
        return refused("message must be at most 1048576 bytes, without NUL");
    }
    for unsupported in ["agent", "model", "wake"] {
        if input.get(unsupported).is_some_and(|v| !v.is_null()) {
            return refused(format!(
                "{unsupported} is not supported by this server's send yet: the child answers under its own \
                 declaration and model; send without it"
            ));
        }
    }
    let steer = match input.get("steer") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(steer)) => *steer,
        Some(_) => return refused("steer must be true or false"),
    };
    let mode = if steer { DeliveryMode::Steer } else { DeliveryMode::Queue };
    let (deliver_at, deliver_in) = match (text(input, "deliver_at"), text(input, "deliver_in")) {
        (Ok(at), Ok(within)) => (at, within),
        (Err(m), _) | (_, Err(m)) => return refused(m),
    };
    let deliver_at = match crate::schedule::delivery_time(fabric.clock.now_ms(), deliver_at, deliver_in, mode) {
        Ok(at) => at,
        Err(refusal) => return refused(format!("{}: {}", refusal.code, refusal.message)),
    };
    let child = match addressed(fabric, execution, to).await? {
        Ok(child) => child,
        Err(message) => return refused(message),
    };
    // A later turn of the child keeps the child's own declaration: its first input's.
    let first = fabric.store.input_of_execution(child.child_execution_public_id).await?;
    let row = InputRow {
        public_id: InputId::new_v4(),
        conversation_public_id: child.child_conversation_public_id,
        member_public_id: execution.member_public_id,
        text: message.to_owned(),
        execution_declaration: first.as_ref().and_then(|i| i.execution_declaration.clone()),
        runner_executor_public_id: first.as_ref().and_then(|i| i.runner_executor_public_id),
        tool_names: None,
        variables: None,
        posted_by_public_id: first.as_ref().and_then(|i| i.posted_by_public_id),
        turn: 0,
        deliver_at,
        budget: None,
    };
    // Held until its time when scheduled, durably (`docs/executions.md`, "Scheduled inputs").
    let admission = super::queue::admit(fabric, root, &row, false, mode, ExecutionId::new_v4()).await?;
    Ok(Outcome::Result(match admission {
        Admission::Full { waiting } => Err(format!(
            "{}: the child conversation already holds {waiting} waiting inputs; wait for it first",
            ErrorCode::InputQueueFull.as_str()
        )),
        Admission::Scheduled { execution, turn, deliver_at } => Ok(json!({
            "conversation_public_id": child.child_conversation_public_id, "label": child.label,
            "delivered": "scheduled", "turn": turn, "execution_public_id": execution, "deliver_at": deliver_at,
        })),
        Admission::Steer { turn, into } => Ok(json!({
            "conversation_public_id": child.child_conversation_public_id, "label": child.label,
            "delivered": "steer", "turn": turn, "execution_public_id": into.public_id,
        })),
        Admission::Turn { execution, turn, ahead } => Ok(json!({
            "conversation_public_id": child.child_conversation_public_id, "label": child.label,
            "delivered": "queued", "turn": turn, "execution_public_id": execution, "queue_position": ahead.len(),
        })),
    }))
}

async fn status(
    fabric: &Fabric,
    execution: &ExecutionRow,
    input: &Map<String, Value>,
) -> Result<Outcome, KernelFailure> {
    let child = match addressed_by_to(fabric, execution, "status", input).await? {
        Ok(child) => child,
        Err(message) => return refused(message),
    };
    let latest = fabric.store.latest_execution_of(child.child_conversation_public_id).await?;
    let Some(latest) = latest else { return refused("the child conversation has no execution") };
    let mut result = json!({
        "conversation_public_id": child.child_conversation_public_id,
        "label": child.label,
        "status": latest.status,
        "execution_public_id": latest.public_id,
        "working": !latest.status.is_terminal(),
    });
    if let Some(text) = latest.final_text.filter(|_| latest.status == RunStatus::Completed) {
        result["result"] = json!(text);
    }
    if let Some(key) = latest.error_key {
        result["error_key"] = json!(key);
    }
    Ok(Outcome::Result(Ok(result)))
}

async fn cancel(
    fabric: &Fabric,
    root: &RootHandle,
    execution: &ExecutionRow,
    task: &TaskRow,
    input: &Map<String, Value>,
) -> Result<Outcome, KernelFailure> {
    let child = match addressed_by_to(fabric, execution, "cancel", input).await? {
        Ok(child) => child,
        Err(message) => return refused(message),
    };
    let latest = fabric.store.latest_execution_of(child.child_conversation_public_id).await?;
    let Some(latest) = latest.filter(|e| !e.status.is_terminal()) else {
        return Ok(Outcome::Result(Ok(json!({
            "conversation_public_id": child.child_conversation_public_id, "label": child.label,
            "canceled": false, "reason": "the child conversation has no running work",
        }))));
    };
    // The result of a child canceled by its parent is nobody's mail.
    if latest.public_id == child.child_execution_public_id {
        fabric
            .store
            .dispose_child(
                child.parent_execution_public_id,
                child.task_key,
                ChildDisposition::Canceled,
                None,
                Some(format!("task:{}", task.task_key)),
            )
            .await?;
    }
    let stopped = root.execution(latest.public_id).stop(true).await;
    Ok(Outcome::Result(Ok(json!({
        "conversation_public_id": child.child_conversation_public_id, "label": child.label,
        "canceled": stopped.is_ok(), "execution_public_id": latest.public_id,
        "status": stopped.map(|row| row.status.as_str().to_owned()).unwrap_or_else(|r| r.code.as_str().to_owned()),
    }))))
}
