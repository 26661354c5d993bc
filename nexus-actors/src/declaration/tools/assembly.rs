//! Assembly of a frozen tool set from a configuration and the selected Runner: explicit entries,
//! kernel imports, runner imports with collision names (`docs/declaration.md`, "Runner imports",
//! "Collision names").

use std::collections::HashSet;

use nexus_proto::RunnerId;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use nexus_kernel_tools::{Spellings, live as kernel_live, lookup as kernel_lookup};
use nexus_proto::{ErrorCode, Refusal};

use crate::declaration::announcement::is_model_visible;
use crate::declaration::invalid;
use crate::declaration::memory::ConversationReach;
use crate::eligibility::not_eligible;

use super::*;

/// An assembled tool set: the callables, the selected Runner and the candidate rows
/// `{runner_executor_public_id, display_name, environment}`.
pub type Assembly = (Vec<FrozenTool>, Option<RunnerId>, Vec<Value>);

/// Which Runner an assembly imports from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunnerSelection {
    /// This Runner: it must be a declared candidate and eligible.
    Named(RunnerId),
    /// No Runner: no Runner tools are imported (the preview's explicit `null`).
    NoRunner,
    /// The host's convenience default for an input that names none: the first eligible candidate
    /// in declaration order, or no Runner when none is eligible.
    FirstEligible,
}

impl RunnerSelection {
    /// `Named` for `Some`, the convenience default for `None`.
    pub fn or_first_eligible(id: Option<RunnerId>) -> Self {
        id.map_or(RunnerSelection::FirstEligible, RunnerSelection::Named)
    }
}

/// Assembles the tool set of a configuration (canonical form) for the selected Runner.
///
/// `runners` holds the facts of every runner the configuration names (candidates and explicit
/// route targets) that exists, judged for the answering Agent. Only the selected Runner contributes
/// imports; an ineligible named Runner is refused, never silently replaced (`docs/declaration.md`,
/// "Runner imports"). The convenience default skips an ineligible candidate, and refuses when
/// every declared candidate is ineligible; an explicit route to a runner that exists and is not
/// eligible is refused (`docs/protocol.md`, "Assignment").
///
/// # Errors
/// 422 `runner_not_declared` (selected runner not a candidate), `runner_not_eligible` (the
/// selected runner, every candidate, or a route's target is not eligible for the Agent),
/// `tool_not_served` (an explicit route to a tool its target does not serve) and
/// `validation_failed` (`duplicate_tool_name` that remains after qualification).
pub fn assemble(
    configuration: &Value,
    selection: RunnerSelection,
    runners: &[RunnerFacts],
) -> Result<Assembly, Refusal> {
    let candidates: Vec<RunnerId> = configuration["runner_executor_public_ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().and_then(|s| RunnerId::parse_any_case(s).ok()))
        .collect();
    let facts_of = |id: RunnerId| runners.iter().find(|r| r.public_id == id);
    let selected = match selection {
        RunnerSelection::Named(id) if !candidates.contains(&id) => {
            return Err(Refusal::new(
                ErrorCode::RunnerNotDeclared,
                format!("runner {id} is not among the declaration's runner_executor_public_ids"),
            ));
        }
        RunnerSelection::Named(id) => Some(id),
        RunnerSelection::NoRunner => None,
        RunnerSelection::FirstEligible => {
            let first = candidates.iter().copied().find(|id| facts_of(*id).is_some_and(RunnerFacts::eligible));
            // Candidates declared and none of them eligible: the execution would run without the
            // runner it was declared for, its calls failing `unknown_tool`; refuse it instead,
            // naming each candidate (`docs/protocol.md`, "Assignment").
            if first.is_none() && !candidates.is_empty() {
                let why: Vec<String> = candidates
                    .iter()
                    .filter_map(|id| not_eligible(*id, facts_of(*id).map(|f| f.eligibility)))
                    .map(|refusal| refusal.message)
                    .collect();
                return Err(Refusal::new(
                    ErrorCode::RunnerNotEligible,
                    format!("none of the declaration's runner_executor_public_ids is eligible: {}", why.join("; ")),
                ));
            }
            first
        }
    };
    if let Some(id) = selected
        && let Some(refusal) = not_eligible(id, facts_of(id).map(|f| f.eligibility))
    {
        return Err(refusal);
    }

    let explicit = configuration["tool_definitions"].as_array().map(Vec::as_slice).unwrap_or_default();
    let spellings = Spellings::from_entries(explicit);
    let mut tools = Vec::new();
    let mut taken: HashSet<String> = HashSet::new();
    for entry in explicit {
        let name = entry_name(entry).unwrap_or_default().to_owned();
        let (route, mut effect_profile, timeout_ms) = match entry.get("route") {
            None => (None, None, None),
            Some(route) => {
                let target = route["runner_executor_public_id"].as_str().and_then(|s| RunnerId::parse_any_case(s).ok());
                let served = route.get("tool_name").and_then(Value::as_str).unwrap_or(&name).to_owned();
                let announced = target.and_then(facts_of).and_then(|facts| {
                    facts.announcement["tools"].as_array()?.iter().find(|t| t["name"] == served.as_str()).cloned()
                });
                // A target that exists and may not serve this Agent is refused as such; one that
                // does not exist serves nothing.
                if let Some(facts) = target.and_then(facts_of)
                    && let Some(refusal) = not_eligible(facts.public_id, Some(facts.eligibility))
                {
                    return Err(Refusal::new(refusal.code, format!("{name}: {}", refusal.message)));
                }
                let (Some(target), Some(announced)) = (target, announced) else {
                    return Err(Refusal::new(
                        ErrorCode::ToolNotServed,
                        format!("{name}: the route's target does not serve {served}"),
                    ));
                };
                let route = RunnerRoute { runner_executor_public_id: target, tool_name: served };
                (
                    Some(route),
                    announced.get("effect_profile").cloned(),
                    announced.get("timeout_ms").and_then(Value::as_u64),
                )
            }
        };
        let kernel = match entry.get("canonical").and_then(Value::as_str) {
            Some(canonical) => kernel_live(canonical),
            None if route.is_none() => kernel_lookup(&name).filter(|tool| tool.name == name),
            None => None,
        };
        if let Some(tool) = kernel {
            effect_profile = Some(tool.effect_profile().to_json());
        }
        if !taken.insert(name.clone()) {
            return Err(invalid(
                "configuration.tool_definitions",
                format!("duplicate_tool_name: {name} is declared twice"),
            ));
        }
        tools.push(FrozenTool {
            name,
            definition: entry.clone(),
            route,
            effect_profile,
            timeout_ms,
            canonical: kernel.map(|tool| tool.canonical_name.to_owned()),
        });
    }

    // Plain kernel imports, re-spelled with the set's spellings. An explicit declaration on the
    // same callable name (an identity declaration) takes precedence over the import.
    for canonical in configuration["kernel_tools"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        let Some(tool) = kernel_live(canonical) else { continue };
        if !taken.insert(tool.name.to_owned()) {
            continue;
        }
        tools.push(FrozenTool {
            name: tool.name.to_owned(),
            definition: tool.render(&spellings),
            route: None,
            effect_profile: Some(tool.effect_profile().to_json()),
            timeout_ms: None,
            canonical: Some(tool.canonical_name.to_owned()),
        });
    }

    let mut runner_candidates = Vec::new();
    // The ordered eligible candidates: one that may not serve this Agent is not shown.
    for id in &candidates {
        if let Some(facts) = facts_of(*id).filter(|f| f.eligible()) {
            runner_candidates.push(json!({
                "runner_executor_public_id": id,
                "display_name": facts.display_name,
                "environment": facts.announcement["environment"],
            }));
        }
    }

    if let Some(facts) = selected.and_then(facts_of) {
        let allow: Option<Vec<&str>> =
            configuration["runner_tool_names"].as_array().map(|names| names.iter().filter_map(Value::as_str).collect());
        // A lifecycle hook's tool runs only as a hook task and is never exposed to the model
        // (`docs/declaration.md`, "Runner imports"), so the runner's announcement of it is not
        // imported.
        let hook_tools: Vec<&str> = configuration["lifecycle_hooks"]
            .as_object()
            .into_iter()
            .flat_map(|hooks| hooks.values())
            .filter_map(|hook| hook["tool"].as_str())
            .collect();
        for announced in facts.announcement["tools"].as_array().into_iter().flatten() {
            let served = announced["name"].as_str().unwrap_or_default();
            if !is_model_visible(announced)
                || allow.as_ref().is_some_and(|allow| !allow.contains(&served))
                || hook_tools.contains(&served)
            {
                continue;
            }
            // A name colliding with a callable or a kernel name (either spelling) is qualified;
            // so is one no provider would accept.
            let name = if taken.contains(served) || kernel_lookup(served).is_some() || !provider_name_ok(served) {
                qualified_name(facts.public_id, served)
            } else {
                served.to_owned()
            };
            if !taken.insert(name.clone()) {
                return Err(invalid(
                    "configuration.tool_definitions",
                    format!("duplicate_tool_name: the imported {served} collides with {name}"),
                ));
            }
            let definition = json!({
                "type": "function",
                "function": {
                    "name": name,
                    "description": announced["description"],
                    "parameters": announced["input_schema"],
                },
                "route": {"kind": "runner", "runner_executor_public_id": facts.public_id, "tool_name": served},
                "defer_loading": true,
            });
            tools.push(FrozenTool {
                name,
                definition,
                route: Some(RunnerRoute { runner_executor_public_id: facts.public_id, tool_name: served.to_owned() }),
                effect_profile: announced.get("effect_profile").cloned(),
                timeout_ms: announced.get("timeout_ms").and_then(Value::as_u64),
                canonical: None,
            });
        }
    }
    Ok((tools, selected, runner_candidates))
}

/// Narrows a tool set to `tool_names` (flat names), keeping declaration order; `None` keeps all.
///
/// # Errors
/// 422 `tool_not_declared` naming the first name that is not in the set.
pub fn narrow(tools: Vec<FrozenTool>, tool_names: Option<&[String]>) -> Result<Vec<FrozenTool>, Refusal> {
    let Some(names) = tool_names else { return Ok(tools) };
    if let Some(missing) = names.iter().find(|n| !tools.iter().any(|t| &t.name == *n)) {
        return Err(Refusal::new(ErrorCode::ToolNotDeclared, format!("{missing} is not in the assembled tool set")));
    }
    Ok(tools.into_iter().filter(|t| names.contains(&t.name)).collect())
}

/// Freezes a declaration for one execution.
///
/// # Errors
/// The refusals of [`assemble`] and [`narrow`].
pub fn freeze(
    configuration: &Value,
    system_prompt: Option<Value>,
    selection: RunnerSelection,
    runners: &[RunnerFacts],
    tool_names: Option<&[String]>,
) -> Result<FrozenDeclaration, Refusal> {
    let (tools, selected, runner_candidates) = assemble(configuration, selection, runners)?;
    let tools = narrow(tools, tool_names)?;
    let declares_skill = tools.iter().any(|tool| tool.canonical_name() == Some(SKILL_CANONICAL));
    let skills = match selected.and_then(|id| runners.iter().find(|r| r.public_id == id)) {
        Some(facts) if declares_skill => runner_skills(facts),
        _ => Vec::new(),
    };
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
    };
    let mut frozen = FrozenDeclaration {
        tools,
        approval_mode: configuration["approval_mode"].as_str().map(str::to_owned),
        approval_rules: configuration["approval_rules"].clone(),
        default_model: configuration["default_model"].as_str().map(str::to_owned),
        fallback_models: dedup(strings(&configuration["fallback_models"])),
        system_prompt,
        default_runner_executor_public_id: selected,
        runner_candidates,
        lifecycle_hooks: configuration["lifecycle_hooks"].clone(),
        compaction_policy: configuration["compaction_policy"].clone(),
        summarizer: None,
        prompt_mechanism: configuration["prompt_mechanism"].as_str().and_then(|word| word.parse().ok()),
        prompt_template: Some(configuration["prompt_template"].clone()).filter(|t| !t.is_null()),
        system_prompt_version: None,
        skills,
        memory_bindings: Vec::new(),
        conversation_reach: ConversationReach::declared(configuration),
        delegation_catalog: configuration["delegation_catalog"].clone(),
        digest: String::new(),
    };
    let bytes = serde_json::to_vec(&frozen).unwrap_or_default();
    frozen.digest = hex::encode(Sha256::digest(&bytes));
    Ok(frozen)
}

/// The skills a runner announced as `documents` (`docs/kernel-tools.md`, "skill"), each routed to
/// its `skill` tool with that tool's effect profile and `timeout_ms`. A runner that announces no
/// `skill` serves no documents (the announcement door refuses documents without it).
fn runner_skills(facts: &RunnerFacts) -> Vec<FrozenSkill> {
    let Some(tool) = facts.announcement["tools"].as_array().into_iter().flatten().find(|t| t["name"] == "skill") else {
        return Vec::new();
    };
    facts.announcement["documents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|document| {
            Some(FrozenSkill {
                name: document["name"].as_str()?.to_owned(),
                description: document["description"].as_str()?.to_owned(),
                route: Some(RunnerRoute { runner_executor_public_id: facts.public_id, tool_name: "skill".into() }),
                effect_profile: tool.get("effect_profile").cloned(),
                timeout_ms: tool.get("timeout_ms").and_then(Value::as_u64),
                memory: None,
            })
        })
        .collect()
}

fn dedup(list: Vec<String>) -> Vec<String> {
    let mut seen = HashSet::new();
    list.into_iter().filter(|m| seen.insert(m.clone())).collect()
}
