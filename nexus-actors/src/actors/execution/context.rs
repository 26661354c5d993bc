//! What each model request of an execution carries (`docs/prompt.md`): the frozen
//! documents with their macros rendered, the conversation's earlier turns, and the turn's own
//! transcript, assembled by [`crate::model::prompt`] under the declared mechanism.
//!
//! The macro values are taken once, at materialization, and recorded on `input_materialized`
//! (`macros`), so every round and every recovery renders the same text. The history is read once
//! per actor life, on the first round it is needed: the earlier turns have ended when a turn runs
//! (one execution at a time per conversation), so what the store holds of them is what the model
//! saw last. The turn's transcript is the execution's stored transcript; the request is assembled
//! again for every round, so every round re-applies the history budget and records its manifest
//! on `round_started.context`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use nexus_proto::MemberId;

use crate::actors::fabric::Fabric;
use crate::declaration::FrozenDeclaration;
use crate::model::prompt::{self, Assembled, Document, HistoryTurn, Macros, Mechanism, PromptRole};
use crate::model::{ChatMessage, config::DEFAULT_CONTEXT_WINDOW_TOKENS};
use crate::store::{Event, EventRow, InputRow, MemberRow, StoreResult};

use super::control::ESTIMATE_BYTES_PER_TOKEN;

/// `{{conversation_kind}}` of an input posted to the input door.
pub const CONVERSATION_KIND: &str = "conversation";

/// The execution's prompt context, once loaded.
#[derive(Debug, Default)]
pub struct ContextState {
    /// The macro values, from materialization (or the recovered `input_materialized`).
    pub(super) macros: Option<Macros>,
    /// The earlier turns, read on the first round that needs them.
    history: Option<Arc<Vec<HistoryTurn>>>,
    /// The input's template variables, read with the history.
    variables: BTreeMap<String, String>,
}

impl ContextState {
    /// The state of an execution whose durable events are `events`: the macros its
    /// `input_materialized` recorded.
    pub(super) fn rebuilt(events: &[EventRow]) -> Self {
        ContextState { macros: recorded_macros(events), history: None, variables: BTreeMap::new() }
    }

    /// The state of an execution materializing now, from what materialization holds already: no
    /// store read is left for its first round.
    pub(super) fn adopted(macros: Macros, history: Vec<HistoryTurn>, input: &InputRow) -> Self {
        ContextState { macros: Some(macros), history: Some(Arc::new(history)), variables: variables_of(input) }
    }
}

/// The macro values the last `input_materialized` of `events` recorded.
#[must_use]
pub fn recorded_macros(events: &[EventRow]) -> Option<Macros> {
    events.iter().rev().find_map(|e| match &e.event {
        Event::InputMaterialized(materialized) => materialized.macros.clone(),
        _ => None,
    })
}

async fn handle_of(fabric: &Fabric, member: MemberId) -> StoreResult<String> {
    Ok(fabric.store.member(member).await?.map_or_else(|| member.to_string(), |row| row.handle))
}

/// The macro values for an execution of `input` materialized now.
///
/// # Errors
/// A store failure reading the members.
pub async fn macros_now(fabric: &Fabric, input: &InputRow) -> StoreResult<Macros> {
    macros_knowing(fabric, input, None).await
}

/// [`macros_now`], with the Agent's row when the caller read it already (one read fewer).
async fn macros_knowing(fabric: &Fabric, input: &InputRow, agent: Option<&MemberRow>) -> StoreResult<Macros> {
    let agent = match agent.filter(|row| row.public_id == input.member_public_id) {
        Some(row) => row.handle.clone(),
        None => handle_of(fabric, input.member_public_id).await?,
    };
    let user = match input.poster() {
        poster if poster == input.member_public_id => agent.clone(),
        poster => handle_of(fabric, poster).await?,
    };
    Ok(Macros {
        agent,
        user,
        workspace: fabric.config.execution.workspace_name.clone(),
        date: prompt::iso_date(fabric.clock.now_ms()),
        conversation_kind: CONVERSATION_KIND.to_owned(),
        memory: None,
    })
}

/// The macro values for an execution of `input` under `declaration` materialized now, with the
/// `memory` block's text ([`memory_block`]).
///
/// # Errors
/// A store failure reading the members or the memory listing.
pub async fn taken_now(fabric: &Fabric, declaration: &FrozenDeclaration, input: &InputRow) -> StoreResult<Macros> {
    taken_knowing(fabric, declaration, input, None).await
}

/// [`taken_now`], with the Agent's row when the caller read it already (one read fewer).
///
/// # Errors
/// As [`taken_now`].
pub async fn taken_knowing(
    fabric: &Fabric,
    declaration: &FrozenDeclaration,
    input: &InputRow,
    agent: Option<&MemberRow>,
) -> StoreResult<Macros> {
    let mut macros = macros_knowing(fabric, input, agent).await?;
    macros.memory = memory_block(fabric, declaration).await?;
    Ok(macros)
}

/// The `memory` block (`docs/kernel-tools.md`, "memory"): the effective context's bindings and
/// their documents (the reserved `skills/` ones left out: the skills block lists those), read
/// once at materialization. `None` when no memory tool is declared (the model could read
/// nothing it lists) or the effective context is empty. One listing read per binding (at most
/// three), each bounded by the documents-per-owner bound.
///
/// # Errors
/// A store failure.
pub async fn memory_block(fabric: &Fabric, declaration: &FrozenDeclaration) -> StoreResult<Option<String>> {
    let declares_memory =
        declaration.tools.iter().any(|t| t.canonical_name().is_some_and(|c| c.starts_with("nexus.memory.")));
    if !declares_memory || declaration.memory_bindings.is_empty() {
        return Ok(None);
    }
    let mut documents = Vec::with_capacity(declaration.memory_bindings.len());
    for binding in &declaration.memory_bindings {
        let listed = fabric.store.memory_list(&binding.root(), "").await?;
        documents.push((binding.scope, listed.into_iter().filter(|d| !crate::memory::reserved(&d.path)).collect()));
    }
    Ok(crate::memory::render_block(&declaration.memory_bindings, &documents))
}

/// The template variables `input` sets, as admission validated them (an unreadable entry is
/// left out: the template's default stands).
#[must_use]
pub fn variables_of(input: &InputRow) -> BTreeMap<String, String> {
    input
        .variables
        .as_ref()
        .and_then(Value::as_object)
        .map(|vars| vars.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
        .unwrap_or_default()
}

/// The frozen `system_prompt` as a [`Document`].
fn system_prompt(declaration: &FrozenDeclaration) -> Option<Document> {
    let document = declaration.system_prompt.as_ref()?;
    Some(Document {
        content: document["content"].as_str().unwrap_or_default().to_owned(),
        role: match document["role"].as_str() {
            Some("developer") => PromptRole::Developer,
            _ => PromptRole::System,
        },
        version: declaration.system_prompt_version,
    })
}

/// The earlier turns of `input`'s conversation (none under `raw`, and no read for a first turn).
///
/// # Errors
/// A store failure.
pub async fn history_of(
    fabric: &Fabric,
    declaration: &FrozenDeclaration,
    input: &InputRow,
) -> StoreResult<Vec<HistoryTurn>> {
    if declaration.mechanism() == Mechanism::Raw || input.turn <= 1 {
        return Ok(Vec::new());
    }
    fabric.store.conversation_history(input.conversation_public_id, input.turn).await
}

/// The model's context window for the assembly: the declaration's current route's, else the
/// default window.
pub fn window_of(fabric: &Fabric, reference: Option<&str>) -> u64 {
    reference
        .and_then(|r| fabric.models.resolve(r).ok())
        .map_or(DEFAULT_CONTEXT_WINDOW_TOKENS, |m| m.context_window_tokens)
}

/// Assembles one request from its parts ([`prompt::assemble`]).
#[must_use]
pub fn assemble_with(
    declaration: &FrozenDeclaration,
    macros: &Macros,
    variables: &BTreeMap<String, String>,
    history: &[HistoryTurn],
    turn: &[ChatMessage],
    window_tokens: u64,
    tools: &[serde_json::Value],
) -> Assembled {
    let document = system_prompt(declaration);
    let tools_bytes = serde_json::to_vec(&json!(tools)).map_or(0, |b| b.len());
    prompt::assemble(&prompt::Request {
        mechanism: declaration.mechanism(),
        template: declaration.prompt_template.as_ref(),
        system_prompt: document.as_ref(),
        macros,
        variables,
        history,
        skills: &declaration.skills,
        turn,
        window_tokens,
        tools_bytes,
        bytes_per_token: ESTIMATE_BYTES_PER_TOKEN,
    })
}

/// The next request of the execution in `state`, for a model whose window is `window_tokens`
/// offered `tools`: loads the macros and the history on first use.
///
/// # Errors
/// A store failure (the actor stops and reloads).
pub(super) async fn assemble(
    state: &mut super::ExecutionState,
    window_tokens: u64,
    tools: &[serde_json::Value],
) -> Result<Assembled, ractor::ActorProcessingErr> {
    let Some(declaration) = state.declaration.clone() else { return Err("a request before materialization".into()) };
    if state.context.macros.is_none() || state.context.history.is_none() {
        let input =
            state.fabric.store.input(state.row.input_public_id).await?.ok_or("the execution's input is missing")?;
        if state.context.macros.is_none() {
            // Materialized before macros were recorded: taken now, once per actor life.
            state.context.macros = Some(macros_now(&state.fabric, &input).await?);
        }
        if state.context.history.is_none() {
            state.context.history = Some(Arc::new(history_of(&state.fabric, &declaration, &input).await?));
            state.context.variables = variables_of(&input);
        }
    }
    let (Some(macros), Some(history)) = (&state.context.macros, &state.context.history) else {
        return Err("the prompt context is missing".into());
    };
    let variables = &state.context.variables;
    Ok(assemble_with(&declaration, macros, variables, history, &state.transcript, window_tokens, tools))
}
