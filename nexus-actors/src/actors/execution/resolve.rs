//! Declaration resolution, the one path from an input to the frozen declaration an execution runs
//! under (`docs/executions.md`, "Materialization"), and the two doors built on it that read more
//! than they write: regeneration and the context estimate.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use nexus_proto::{ErrorCode, ExecutionId, MemberId, Refusal, RunStatus, TaskKey};

use crate::actors::fabric::Fabric;
use crate::declaration::tools::RunnerSelection;
use crate::declaration::{FrozenDeclaration, RunnerFacts, freeze, validate_execution_declaration, wire_projection};
use crate::model::ChatMessage;
use crate::store::event::TurnStatus;
use crate::store::{Event, EventRow, ExecutionRow, InputRow, Store, TaskRow};

use super::control::ESTIMATE_BYTES_PER_TOKEN;
use super::result_text;

/// The facts of every runner a configuration names (candidates, then explicit route targets) that
/// exists, read from the store and judged for the answering `agent` ([`crate::eligibility`]).
///
/// # Errors
/// `internal` on a store failure.
pub async fn runner_facts(store: &Store, configuration: &Value, agent: MemberId) -> Result<Vec<RunnerFacts>, Refusal> {
    crate::eligibility::runner_facts(store, configuration, agent).await
}

fn internal(e: impl std::fmt::Display) -> Refusal {
    Refusal::new(ErrorCode::Internal, format!("the store failed: {e}"))
}

/// Resolves the declaration an execution of `input` would freeze, without writing: `supplied`
/// (an inline `execution_declaration`, validated as on input admission), else the input's own
/// inline declaration, else the answering member's standing profile; assembled against the
/// runners' current facts with the input's runner selection and `tool_names`. This is the one
/// resolution: materialization, regeneration and the estimate all call it
/// (`docs/executions.md`, "Materialization").
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
    let (configuration, system_prompt, summarizer, version) = match inline {
        Some(inline) => {
            let object = inline
                .as_object()
                .ok_or_else(|| Refusal::new(ErrorCode::ValidationFailed, "execution_declaration: must be an object"))?;
            let validated = validate_execution_declaration(object, &check)?;
            (validated.configuration, validated.system_prompt, validated.summarizer, None)
        }
        None => {
            let profile = fabric.store.profile(input.member_public_id).await.map_err(internal)?.unwrap_or_default();
            let configuration = profile.configuration.clone().ok_or_else(|| {
                Refusal::new(
                    ErrorCode::ValidationFailed,
                    "configuration: the profile has not declared one; PUT /agent_api/v1/profile/configuration first",
                )
            })?;
            let version = profile.system_prompt.as_ref().map(|_| profile.system_prompt_version);
            (configuration, profile.system_prompt, profile.summarizer, version)
        }
    };
    let runners = runner_facts(&fabric.store, &configuration, input.member_public_id).await?;
    let tool_names: Option<Vec<String>> =
        input.tool_names.as_ref().and_then(|v| serde_json::from_value(v.clone()).ok());
    let frozen = freeze(
        &configuration,
        system_prompt,
        RunnerSelection::or_first_eligible(input.runner_executor_public_id),
        &runners,
        tool_names.as_deref(),
    )?
    .with_summarizer(summarizer)
    .with_system_prompt_version(version)
    .with_memory_bindings(memory_bindings(&configuration, input));
    let frozen = with_memory_skills(&fabric.store, frozen).await?;
    if frozen.default_model.is_none() {
        return Err(Refusal::new(ErrorCode::ValidationFailed, "default_model: the declaration names no model to run"));
    }
    Ok(frozen)
}

/// The effective memory bindings of an execution of `input` under `configuration` (R36): the
/// selected roots (conversation, workspace, and speaker when a Human other than the Agent posted
/// the input) intersected with `memory_context_limit`, owners resolved (`docs/kernel-tools.md`,
/// "memory").
fn memory_bindings(configuration: &Value, input: &InputRow) -> Vec<crate::memory::MemoryBinding> {
    let speaker = input.posted_by_public_id.filter(|poster| *poster != input.member_public_id);
    let selected = crate::memory::selected_roots(input.member_public_id, input.conversation_public_id, speaker);
    crate::memory::effective(selected, &configuration["memory_context_limit"])
}

/// `frozen` with the skills of its memory sources after the runner's, when `skill` is declared:
/// each `skills/<name>.md` of the workspace binding, then of the speaker's (REFERENCE 12, "Skills
/// block"), a name already frozen from an earlier source skipped (`docs/kernel-tools.md`,
/// "skill"). Only the names and descriptions are frozen; a call reads the document as it is then.
///
/// # Errors
/// `internal` on a store failure.
async fn with_memory_skills(store: &Store, mut frozen: FrozenDeclaration) -> Result<FrozenDeclaration, Refusal> {
    use crate::memory::MemoryScope;
    if !frozen.declares_skill() {
        return Ok(frozen);
    }
    let before = frozen.skills.len();
    for scope in [MemoryScope::Workspace, MemoryScope::Speaker] {
        let Some(root) = frozen.memory_binding(scope).map(crate::memory::MemoryBinding::root) else { continue };
        for info in store.memory_list(&root, crate::memory::SKILLS_PREFIX).await.map_err(internal)? {
            let Some(name) = crate::memory::skill_name(&info.path) else { continue };
            if frozen.skills.iter().any(|s| s.name == name) {
                continue;
            }
            let Some(document) = store.memory_document(&root, &info.path).await.map_err(internal)? else { continue };
            let Some(description) = crate::memory::skill_description(&document.content) else { continue };
            frozen.skills.push(crate::declaration::tools::FrozenSkill {
                name: name.to_owned(),
                description,
                route: None,
                effect_profile: None,
                timeout_ms: None,
                memory: Some(scope),
            });
        }
    }
    Ok(match frozen.skills.len() > before {
        true => frozen.redigested(),
        false => frozen,
    })
}

/// The optional `execution_declaration` of a regenerate or estimate body: `null`, absent, `{}`,
/// or `{execution_declaration: {...} | null}`. Any other field is refused: a misspelled one would
/// otherwise reuse the frozen declaration without a word.
///
/// # Errors
/// 400 `parameter_missing` for a body that is not an object; `parameter_invalid` when it names another
/// field.
pub fn supplied_declaration(body: &Value) -> Result<Option<Value>, Refusal> {
    crate::declaration::known_fields(body, &["execution_declaration"])?;
    Ok(body.get("execution_declaration").filter(|v| !v.is_null()).cloned())
}

/// Creates the regeneration of `original` (`docs/executions.md`, "Control"): a new `pending`
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
    let now = fabric.clock.now_ms();
    let row = ExecutionRow {
        public_id: ExecutionId::new_v4(),
        conversation_public_id: original.conversation_public_id,
        input_public_id: original.input_public_id,
        member_public_id: original.member_public_id,
        status: RunStatus::Pending,
        attention_reason: None,
        transcript: json!([]),
        transcript_stored: 0,
        round: 0,
        final_text: None,
        error_key: None,
        event_seq: 1,
        budget: None,
        created_at: now,
        updated_at: now,
        declaration: Some(declaration),
        parent_execution_public_id: None,
    };
    let event = EventRow {
        seq: 1,
        event: Event::TurnStatus(TurnStatus::Pending {
            regenerated_from: original.public_id,
            declaration: how.to_owned(),
            declaration_digest: row.declaration.as_ref().and_then(|d| d["digest"].as_str()).map(str::to_owned),
        }),
        at: now,
    };
    fabric.store.create_execution(&row, &[event]).await.map_err(internal)?;
    tracing::info!(execution_id = %row.public_id, from = %original.public_id, how, "execution regenerated");
    Ok(row)
}

/// The context estimate of `row` (`docs/executions.md`, "Control"): compiles the request the next
/// round would send, the transcript with the settled results it has not read yet plus the offered
/// tools, under the frozen declaration, or `supplied` instead, or for an execution not yet
/// materialized the declaration it would freeze now; and measures it. Reads the store only: nothing
/// is written, reserved or started.
///
/// Answers `{execution_public_id, status, round, model, declaration: frozen|resolved|supplied,
/// declaration_digest, messages, tools, open_calls, context, bytes: {documents, transcript, tools,
/// total}, estimated_tokens: {documents, transcript, tools, total}, estimator: {method,
/// bytes_per_token, exact}}`, measured over the request the next round would assemble
/// ([`super::context`]: documents, history, the turn) with its manifest as `context`.
/// `documents` are the system- and developer-role messages, `transcript` the others (history
/// and the turn); `total` is the whole request's canonical JSON. `open_calls` counts calls of the round
/// whose results are not in yet (the next round also carries them). Tokens are estimated as the
/// UTF-8 bytes over [`ESTIMATE_BYTES_PER_TOKEN`], rounded up: near what BPE tokenizers give for
/// English text and JSON, but no tokenizer's count, so it never gates a round
/// (`docs/executions.md`, "Control").
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
    let materialized = row.declaration.is_some() && row.status != RunStatus::Pending;
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
    // The documents are the declaration's (a supplied one replaces the frozen one): a system
    // message stored by an execution materialized before requests were assembled is not read.
    transcript.retain(|m| !matches!(m, ChatMessage::System { .. } | ChatMessage::Developer { .. }));
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
            .filter(|t| matches!(t.task_key, TaskKey::Call { round, .. } if round == row.round))
            .filter(|t| !answered.contains(&crate::actors::execution::wire_id(&transcript, t)))
            .collect();
        unread.sort_by_key(|t| t.task_key);
        for task in unread {
            if task.is_settled() {
                let tool_call_id = crate::actors::execution::wire_id(&transcript, &task);
                transcript.push(ChatMessage::Tool { tool_call_id, content: result_text(&task) });
            } else {
                open_calls += 1;
            }
        }
    }
    let tools = wire_projection(&declaration.tools);
    // The request as the next round would assemble it ([`super::context`]).
    let recorded = match materialized {
        true => {
            super::context::recorded_macros(&store.events_after(row.public_id, 0, i64::MAX).await.map_err(internal)?)
        }
        false => None,
    };
    let macros = match recorded {
        Some(macros) => macros,
        None => super::context::taken_now(fabric, &declaration, &input).await.map_err(internal)?,
    };
    let history = super::context::history_of(fabric, &declaration, &input).await.map_err(internal)?;
    let window = super::context::window_of(fabric, declaration.default_model.as_deref());
    let variables = super::context::variables_of(&input);
    let assembled =
        super::context::assemble_with(&declaration, &macros, &variables, &history, &transcript, window, &tools);
    let mut measured = measure(&assembled.messages, &tools).map_err(internal)?;
    if let Some(object) = measured.as_object_mut() {
        let extra = json!({
            "execution_public_id": row.public_id,
            "status": row.status,
            "round": row.round + 1,
            "model": declaration.default_model,
            "declaration": source,
            "declaration_digest": declaration.digest,
            "open_calls": open_calls,
            "context": assembled.manifest,
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
        if matches!(message, ChatMessage::System { .. } | ChatMessage::Developer { .. }) {
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
        for bad in [json!({"execution_declaraton": declaration.clone()}), json!({"other": 1})] {
            assert_eq!(supplied_declaration(&bad).unwrap_err().code, ErrorCode::ParameterInvalid, "{bad}");
        }
        // A body that is not an object has every door's word for it.
        assert_eq!(supplied_declaration(&json!([1])).unwrap_err().code, ErrorCode::ParameterMissing);
    }
}
