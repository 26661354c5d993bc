//! Kernel tools that run in-process over the frozen declaration (`docs/executions.md`,
//! "Kernel tools"): `runners_list` and `tool_search`. They read only what the execution froze, so
//! they need no I/O and no actor.

use serde_json::{Value, json};

use crate::declaration::FrozenDeclaration;
use crate::declaration::tools::provider_definition;

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

/// Searches the frozen callables: names, descriptions, runner UUIDs and served names. An exact
/// name returns that entry; otherwise every query term must match. Answers `{tools:[{name,
/// definition, route?, skills}], truncated}`.
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
    let row = |tool: &crate::declaration::FrozenTool| {
        let mut row = json!({"name": tool.name, "definition": provider_definition(&tool.definition), "skills": []});
        if let Some(route) = &tool.route {
            row["route"] = json!({"kind": "runner", "runner_executor_public_id": route.runner_executor_public_id,
                                  "tool_name": route.tool_name});
        }
        row
    };
    if let Some(exact) = declaration.tools.iter().find(|t| t.name == query) {
        return Ok(json!({"tools": [row(exact)], "truncated": false}));
    }
    let terms: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
    let matches: Vec<&crate::declaration::FrozenTool> = declaration
        .tools
        .iter()
        .filter(|tool| {
            let function = tool.definition.get("function").unwrap_or(&tool.definition);
            let haystack = format!(
                "{} {} {} {}",
                tool.name,
                function["description"].as_str().unwrap_or_default(),
                tool.route.as_ref().map(|r| r.runner_executor_public_id.to_string()).unwrap_or_default(),
                tool.route.as_ref().map(|r| r.tool_name.as_str()).unwrap_or_default(),
            )
            .to_lowercase();
            terms.iter().all(|term| haystack.contains(term.as_str()))
        })
        .collect();
    let shown = usize::try_from(limit).unwrap_or(usize::MAX);
    Ok(json!({
        "tools": matches.iter().take(shown).map(|t| row(t)).collect::<Vec<_>>(),
        "truncated": matches.len() > shown,
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::declaration::{FrozenTool, RunnerRoute};

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
}
