//! Kernel tools that run in-process (`docs/kernel-tools.md`).
//!
//! Two kinds. The pure ones (`runners_list`, `tool_search`, the in-process side of `skill`) read
//! only what the execution froze:
//! [`run`] answers them at once, inside the approval stage's routing. The I/O ones ([`runs_io`]:
//! memory, history search) read or write the store: the stage leaves their task `running`, and
//! [`launch`] runs each in a task owned by the ExecutionActor, which writes the settlement
//! (conditional on the row still being `running`, so a stop that won stays won) and sends it back
//! as [`ExecutionMsg::TaskSettled`], the same message a runner's settlement arrives as. A restart
//! launches again every in-process task it finds `running`: each I/O tool is safe to run twice
//! (reads are, and every write records the task that made it and answers its first result again).
//!
//! `tool_call` never runs here: it expands into its target's task before the approval stage
//! ([`super::discovery`]).

use std::sync::Arc;

use ractor::ActorRef;
use serde_json::{Value, json};
use tracing::Instrument;

use nexus_proto::{ConversationId, ErrorCode, ExecutionId, InputId, MemberId, TaskStatus};

use crate::actors::fabric::Fabric;
use crate::declaration::tools::{FrozenSkill, SKILL_CANONICAL, provider_definition};
use crate::declaration::{FrozenDeclaration, FrozenTool};
use crate::store::{MemoryAuthor, TaskRow};

use super::{ExecutionMsg, ExecutionState, sessions};

/// The I/O kernel tools by wire name: their calls run in a task of the ExecutionActor
/// ([`launch`]), never inside a handler.
const IO_TOOLS: [&str; 9] = [
    "skill",
    "memory_read",
    "memory_write",
    "memory_edit",
    "memory_ls",
    "memory_grep",
    "memory_delete",
    "session_search",
    "session_read",
];

/// Whether `wire_name` is an I/O kernel tool, run by [`launch`].
pub fn runs_io(wire_name: &str) -> bool {
    IO_TOOLS.contains(&wire_name)
}

/// What an I/O kernel call may read: the fabric (its store), the frozen declaration and the
/// execution's identity, with the task as the approval stage granted it.
pub struct KernelCall {
    /// The shared context: the store, the clock, the configuration.
    pub fabric: Arc<Fabric>,
    /// The execution's frozen declaration.
    pub declaration: Arc<FrozenDeclaration>,
    /// The calling execution.
    pub execution: ExecutionId,
    /// Its conversation.
    pub conversation: ConversationId,
    /// The input it answers.
    pub input: InputId,
    /// The answering Agent.
    pub agent: MemberId,
    /// The call, `running`.
    pub task: TaskRow,
}

/// A failure of the server itself while running an I/O kernel call (the store failed): the call
/// fails `internal` and the model reads the message.
pub type KernelFailure = Box<dyn std::error::Error + Send + Sync>;

/// Runs one I/O kernel call: `Ok(Some(Ok(result)))` is a result the model reads,
/// `Ok(Some(Err(message)))` a call error envelope (the tool ran and refused its input), `Ok(None)`
/// a tool this server does not run.
async fn run_io(call: &KernelCall) -> Result<Option<Result<Value, String>>, KernelFailure> {
    let task = &call.task;
    let store = &call.fabric.store;
    match task.tool_name.as_str() {
        // Memory (`docs/kernel-tools.md`, "memory"): the writes record this task.
        name @ ("memory_read" | "memory_write" | "memory_edit" | "memory_ls" | "memory_grep" | "memory_delete") => {
            let author = MemoryAuthor::Task { execution: call.execution, task_key: task.task_key };
            Ok(crate::memory::tools::run(store, &call.declaration, author, name, &task.tool_input).await?)
        }
        // A skill from memory (a runner's goes to that runner).
        "skill" => Ok(Some(skill(call).await?)),
        // History (`docs/kernel-tools.md`, "session_search and session_read"), within the frozen
        // reach.
        "session_search" => {
            Ok(Some(sessions::search(store, &sessions::reachable(call).await?, call.input, &task.tool_input).await?))
        }
        "session_read" => Ok(Some(sessions::read(store, &sessions::reachable(call).await?, &task.tool_input).await?)),
        _ => Ok(None),
    }
}

/// Settles `task` with `outcome` at `now`: `completed` with the result (or the call error
/// envelope) the model reads, or `failed` `tool_not_served` when nothing here runs it.
pub fn settle(task: &mut TaskRow, outcome: Option<Result<Value, String>>, now: i64) {
    task.settled_at = Some(now);
    match outcome {
        Some(Ok(result)) => {
            task.status = TaskStatus::Completed;
            task.result = Some(json!({
                "content": result_content(&result), "structured_content": result, "is_error": false, "outcome": "completed"
            }));
        }
        Some(Err(message)) => {
            task.status = TaskStatus::Completed;
            task.result = Some(json!({"content": message, "is_error": true, "outcome": "completed"}));
        }
        None => {
            task.status = TaskStatus::Failed;
            task.error_key = Some(ErrorCode::ToolNotServed.as_str().into());
            let message = format!("{} has no runner route and no in-process implementation here", task.callable_name);
            task.result = Some(json!({"content": message, "is_error": true, "outcome": "failed"}));
        }
    }
}

/// The text the model reads for a kernel result: a string result as it is, anything else as JSON.
fn result_content(result: &Value) -> String {
    match result {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Starts every I/O kernel call among `tasks` that is `running` in-process and not started yet
/// (`docs/kernel-tools.md`). Call it after the save that made the rows durable.
pub(super) fn launch<'a>(
    myself: &ActorRef<ExecutionMsg>,
    state: &mut ExecutionState,
    tasks: impl IntoIterator<Item = &'a TaskRow>,
) {
    let Some(declaration) = state.declaration.clone() else { return };
    for task in tasks {
        let in_process = task.status == TaskStatus::Running
            && task.target_executor_public_id.is_none()
            && !task.task_key.is_hook()
            && !task.task_key.is_summary();
        // A delegation call starts its child or reads its children ([`super::delegation`]).
        if in_process && super::delegation::is_call(task) {
            super::delegation::launch(myself, state, task);
            continue;
        }
        if !in_process || !runs_io(&task.tool_name) || state.kernel_calls.contains_key(&task.task_key) {
            continue;
        }
        let call = KernelCall {
            fabric: Arc::clone(&state.fabric),
            declaration: Arc::clone(&declaration),
            execution: state.row.public_id,
            conversation: state.row.conversation_public_id,
            input: state.row.input_public_id,
            agent: state.row.member_public_id,
            task: task.clone(),
        };
        let actor = myself.clone();
        let span = tracing::info_span!("kernel_call", execution_id = %call.execution, task_key = %task.task_key, tool = %task.tool_name);
        let handle = tokio::spawn(
            async move {
                let outcome = run_io(&call).await;
                let mut task = call.task.clone();
                let now = call.fabric.clock.now_ms();
                match outcome {
                    Ok(outcome) => settle(&mut task, outcome, now),
                    Err(failure) => {
                        tracing::warn!(error = %failure, "kernel call failed");
                        task.settled_at = Some(now);
                        task.status = TaskStatus::Failed;
                        task.error_key = Some(ErrorCode::Internal.as_str().into());
                        let message =
                            format!("{} failed inside the server: {failure}; retry the call", task.callable_name);
                        task.result = Some(json!({"content": message, "is_error": true, "outcome": "failed"}));
                    }
                }
                match call.fabric.store.settle_running_task(&task).await {
                    Ok(true) => {
                        let _ = actor.cast(ExecutionMsg::TaskSettled(Box::new(task)));
                    }
                    // A stop settled it first.
                    Ok(false) => {}
                    // The row stays `running`; the execution's next load runs the call again.
                    Err(error) => tracing::warn!(%error, "cannot record a kernel call's settlement"),
                }
            }
            .instrument(span),
        );
        state.kernel_calls.insert(task.task_key, handle);
    }
}

/// `tool_search`'s default and largest `limit`.
const SEARCH_LIMIT: (u64, u64) = (5, 20);

/// Runs `wire_name` in-process when it is one of the tools implemented here.
///
/// Returns `None` for a kernel tool this server does not run in-process, `Some(Ok(result))` for
/// a result the model reads, and `Some(Err(message))` for a call error envelope (the tool ran and
/// refused its input).
pub fn run(declaration: &FrozenDeclaration, wire_name: &str, input: &Value) -> Option<Result<Value, String>> {
    match wire_name {
        "runners_list" => Some(runners_list(declaration, input)),
        "tool_search" => Some(tool_search(declaration, input)),
        _ => None,
    }
}

/// `skill {name}` in-process (`docs/kernel-tools.md`, "skill"): a runner's document never gets
/// here (its call is dispatched to that runner, [`super::discovery::route_skill`]); a skill frozen
/// from memory is read from its binding's `skills/<name>.md` as it is now. An unknown name, or a
/// document deleted since the execution started, answers `skill_unknown: <name>` as data, a
/// completed result the model reads.
async fn skill(call: &KernelCall) -> Result<Result<Value, String>, KernelFailure> {
    if let Some(unknown) = call.task.tool_input.as_object().and_then(|f| f.keys().find(|k| k.as_str() != "name")) {
        let unknown: String = unknown.chars().take(64).collect();
        return Ok(Err(format!("skill takes only name; remove {unknown:?}")));
    }
    let Some(name) = call.task.tool_input["name"].as_str().filter(|name| !name.is_empty()) else {
        return Ok(Err("name is required: the skill to load, as the skills block lists it".into()));
    };
    let unknown = || Ok(Ok(Value::String(format!("skill_unknown: {name}"))));
    let Some(frozen) = call.declaration.skills.iter().find(|s| s.name == name) else { return unknown() };
    let Some(binding) = frozen.memory.and_then(|scope| call.declaration.memory_binding(scope)) else {
        return unknown();
    };
    let path = crate::memory::skill_path(name);
    match call.fabric.store.memory_document(&binding.root(), &path).await? {
        Some(document) => Ok(Ok(Value::String(document.content))),
        None => unknown(),
    }
}

/// `{current_runner_executor_public_id, runners:[{runner_executor_public_id, display_name,
/// environment}]}`, frozen at acceptance in declaration order; the current id may be null.
fn runners_list(declaration: &FrozenDeclaration, input: &Value) -> Result<Value, String> {
    if input.as_object().is_some_and(|o| !o.is_empty()) {
        return Err("runners_list takes no arguments".into());
    }
    Ok(json!({
        "current_runner_executor_public_id": declaration.default_runner_executor_public_id,
        "runners": declaration.runner_candidates,
    }))
}

/// Searches the frozen callables: names, descriptions, runner UUIDs and served names, and the
/// frozen skills' names and descriptions. An exact name (a callable's, or a skill's) returns that
/// entry; otherwise every query term must match. Answers `{tools:[{name, definition, route?,
/// skills}], truncated}`, where `skills` lists, on the `skill` tool's row, the skills that match
/// (`[{name, description}]`, at most `limit`; every skill when the query is the tool's exact
/// name), and is empty on every other row.
fn tool_search(declaration: &FrozenDeclaration, input: &Value) -> Result<Value, String> {
    let query = input["query"].as_str().map(str::trim).unwrap_or_default();
    if query.is_empty() {
        return Err("query is required and must be a non-empty string".into());
    }
    let limit = match &input["limit"] {
        Value::Null => SEARCH_LIMIT.0,
        value => match value.as_u64().filter(|l| (1..=SEARCH_LIMIT.1).contains(l)) {
            Some(limit) => limit,
            None => return Err("limit must be an integer from 1 to 20".into()),
        },
    };
    let shown = usize::try_from(limit).unwrap_or(usize::MAX);
    let is_skill_tool = |tool: &FrozenTool| tool.canonical_name() == Some(SKILL_CANONICAL) && tool.route.is_none();
    let row = |tool: &FrozenTool, skills: &[&FrozenSkill]| {
        let skills: Vec<Value> =
            skills.iter().take(shown).map(|s| json!({"name": s.name, "description": s.description})).collect();
        let mut row = json!({"name": tool.name, "definition": provider_definition(&tool.definition), "skills": skills});
        if let Some(route) = &tool.route {
            row["route"] = json!({"kind": "runner", "runner_executor_public_id": route.runner_executor_public_id,
                                  "tool_name": route.tool_name});
        }
        row
    };
    // The `skill` tool found by its exact name lists every skill (up to `limit`).
    if let Some(exact) = declaration.tools.iter().find(|t| t.name == query) {
        let skills: Vec<&FrozenSkill> = match is_skill_tool(exact) {
            true => declaration.skills.iter().collect(),
            false => Vec::new(),
        };
        return Ok(json!({"tools": [row(exact, &skills)], "truncated": skills.len() > shown}));
    }
    if let Some(skill) = declaration.skills.iter().find(|s| s.name == query)
        && let Some(tool) = declaration.tools.iter().find(|t| is_skill_tool(t))
    {
        return Ok(json!({"tools": [row(tool, &[skill])], "truncated": false}));
    }
    let terms: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
    let hit = |haystack: String| {
        let haystack = haystack.to_lowercase();
        terms.iter().all(|term| haystack.contains(term.as_str()))
    };
    let mut matches: Vec<(&FrozenTool, Vec<&FrozenSkill>)> = Vec::new();
    for tool in &declaration.tools {
        let function = tool.definition.get("function").unwrap_or(&tool.definition);
        let haystack = format!(
            "{} {} {} {}",
            tool.name,
            function["description"].as_str().unwrap_or_default(),
            tool.route.as_ref().map(|r| r.runner_executor_public_id.to_string()).unwrap_or_default(),
            tool.route.as_ref().map(|r| r.tool_name.as_str()).unwrap_or_default(),
        );
        let skills: Vec<&FrozenSkill> = match is_skill_tool(tool) {
            true => {
                declaration.skills.iter().filter(|s| hit(format!("{haystack} {} {}", s.name, s.description))).collect()
            }
            false => Vec::new(),
        };
        if !skills.is_empty() || hit(haystack) {
            matches.push((tool, skills));
        }
    }
    let skills_cut = matches.iter().any(|(_, skills)| skills.len() > shown);
    Ok(json!({
        "tools": matches.iter().take(shown).map(|(tool, skills)| row(tool, skills)).collect::<Vec<_>>(),
        "truncated": matches.len() > shown || skills_cut,
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::declaration::RunnerRoute;

    fn declaration() -> FrozenDeclaration {
        let runner: nexus_proto::RunnerId = "00000000-0000-4000-8000-000000000007".parse().expect("uuid");
        let tool = |name: &str, description: &str, route: Option<RunnerRoute>| FrozenTool {
            name: name.into(),
            definition: json!({"type": "function", "function": {"name": name, "description": description, "parameters": {"type": "object"}}}),
            route,
            effect_profile: None,
            timeout_ms: None,
            canonical: None,
        };
        FrozenDeclaration {
            tools: vec![
                tool(
                    "bash",
                    "Run a shell command",
                    Some(RunnerRoute { runner_executor_public_id: runner, tool_name: "bash".into() }),
                ),
                tool(
                    "read_file",
                    "Read a file from the workdir",
                    Some(RunnerRoute { runner_executor_public_id: runner, tool_name: "read_file".into() }),
                ),
                tool("deploy", "Deploy the service", None),
            ],
            approval_mode: Some("bypass".into()),
            approval_rules: Value::Null,
            default_model: Some("scripted/default".into()),
            fallback_models: Vec::new(),
            system_prompt: None,
            prompt_mechanism: None,
            prompt_template: None,
            system_prompt_version: None,
            default_runner_executor_public_id: Some(runner),
            runner_candidates: vec![
                json!({"runner_executor_public_id": runner, "display_name": "w", "environment": {}}),
            ],
            lifecycle_hooks: Value::Null,
            compaction_policy: Value::Null,
            summarizer: None,
            skills: Vec::new(),
            memory_bindings: Vec::new(),
            conversation_reach: crate::declaration::memory::ConversationReach::Workspace,
            delegation_catalog: Value::Null,
            digest: String::new(),
        }
    }

    #[test]
    fn runners_list_reads_the_frozen_candidates() {
        let frozen = declaration();
        let listed = run(&frozen, "runners_list", &json!({})).expect("in-process").expect("ok");
        assert_eq!(listed["current_runner_executor_public_id"], json!(frozen.default_runner_executor_public_id));
        assert_eq!(listed["runners"][0]["display_name"], "w");
        assert!(run(&frozen, "runners_list", &json!({"x": 1})).expect("in-process").is_err());
        assert!(run(&frozen, "delegate_task", &json!({})).is_none());
    }

    #[test]
    fn tool_search_exact_terms_limit_and_truncation() {
        let frozen = declaration();
        let exact = run(&frozen, "tool_search", &json!({"query": "deploy"})).expect("in-process").expect("ok");
        assert_eq!(exact["tools"][0]["name"], "deploy");
        assert_eq!(exact["tools"][0]["definition"]["strict"], false, "the provider form's strict default");
        let terms = run(&frozen, "tool_search", &json!({"query": "FILE workdir"})).expect("in-process").expect("ok");
        assert_eq!(terms["tools"].as_array().map(Vec::len), Some(1));
        assert_eq!(terms["tools"][0]["route"]["tool_name"], "read_file");
        let by_runner =
            run(&frozen, "tool_search", &json!({"query": "00000000-0000-4000-8000-000000000007", "limit": 1}))
                .expect("in-process")
                .expect("ok");
        assert_eq!(by_runner["tools"].as_array().map(Vec::len), Some(1));
        assert_eq!(by_runner["truncated"], true);
        assert!(run(&frozen, "tool_search", &json!({"query": " "})).expect("in-process").is_err());
        assert!(run(&frozen, "tool_search", &json!({"query": "x", "limit": 21})).expect("in-process").is_err());
    }

    fn with_skills() -> FrozenDeclaration {
        let mut frozen = declaration();
        let runner = frozen.default_runner_executor_public_id.expect("runner");
        frozen.tools.push(FrozenTool {
            name: "skill".into(),
            definition: nexus_kernel_tools::lookup("skill").expect("live").definition().clone(),
            route: None,
            effect_profile: None,
            timeout_ms: None,
            canonical: Some(SKILL_CANONICAL.into()),
        });
        let skill = |name: &str, description: &str| FrozenSkill {
            name: name.into(),
            description: description.into(),
            route: Some(RunnerRoute { runner_executor_public_id: runner, tool_name: "skill".into() }),
            effect_profile: None,
            timeout_ms: None,
            memory: None,
        };
        frozen.skills = vec![skill("deploy-guide", "How to ship the service"), skill("triage", "Sort incoming bugs")];
        frozen
    }

    #[test]
    fn tool_search_finds_skills_by_name_and_description() {
        let frozen = with_skills();
        let exact = run(&frozen, "tool_search", &json!({"query": "triage"})).expect("in-process").expect("ok");
        assert_eq!(exact["tools"].as_array().map(Vec::len), Some(1));
        assert_eq!(exact["tools"][0]["name"], "skill");
        assert_eq!(exact["tools"][0]["skills"], json!([{"name": "triage", "description": "Sort incoming bugs"}]));
        let terms = run(&frozen, "tool_search", &json!({"query": "SHIP service"})).expect("in-process").expect("ok");
        let names: Vec<&str> =
            terms["tools"].as_array().expect("rows").iter().filter_map(|r| r["name"].as_str()).collect();
        assert_eq!(names, ["skill"], "deploy's own text lacks `ship`; the skill's description has both terms");
        assert_eq!(terms["tools"][0]["skills"][0]["name"], "deploy-guide");
        // The skill tool's exact name lists every skill, up to the limit.
        let all = run(&frozen, "tool_search", &json!({"query": "skill", "limit": 1})).expect("in-process").expect("ok");
        assert_eq!(all["tools"][0]["skills"].as_array().map(Vec::len), Some(1));
        assert_eq!(all["truncated"], true);
        // Other rows carry no skills.
        let bash = run(&frozen, "tool_search", &json!({"query": "bash"})).expect("in-process").expect("ok");
        assert_eq!(bash["tools"][0]["skills"], json!([]));
    }

    #[test]
    fn skill_runs_as_an_io_tool() {
        assert!(runs_io("skill"), "a memory skill is read from the store");
        assert!(run(&with_skills(), "skill", &json!({"name": "triage"})).is_none());
    }
}
