//! The tool grammar: `tool_definitions` (plain, runner-routed), `kernel_tools`, the runner fields,
//! assembly of a frozen tool set, and the provider wire projection (spec/REFERENCE.md 4).

use std::collections::HashSet;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use nexus_kernel_tools::lookup as kernel_lookup;
use nexus_proto::{ErrorCode, Refusal};

use super::invalid;
use crate::announcement::is_model_visible;

/// The bound of `tool_definitions` as canonical JSON, in bytes (`tool_definitions_bound`).
pub const TOOL_DEFINITIONS_BOUND: usize = 1_048_576;
/// The kernel's default park for a runner task without an announced `timeout_ms`: 10 minutes.
pub const DEFAULT_TIMEOUT_MS: u64 = 600_000;

static UUID_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$").expect("static regex")
});

/// The name of a tool entry: `function.name`, falling back to top-level `name`.
pub fn entry_name(entry: &Value) -> Option<&str> {
    entry.get("function").and_then(|f| f.get("name")).or_else(|| entry.get("name")).and_then(Value::as_str)
}

pub(super) fn canonical_tool_definitions(value: Option<&Value>) -> Result<Value, Refusal> {
    const FIELD: &str = "configuration.tool_definitions";
    let entries = match value {
        None | Some(Value::Null) => return Ok(json!([])),
        Some(Value::Array(entries)) => entries,
        Some(_) => return Err(invalid(FIELD, "must be an array")),
    };
    let mut names = HashSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let path = format!("{FIELD}[{i}]");
        if !entry.is_object() {
            return Err(invalid(&path, "must be an object"));
        }
        let Some(name) = entry_name(entry).filter(|n| !n.is_empty() && n.len() <= 128 && !n.contains('\0')) else {
            return Err(invalid(&path, "needs a name of 1 to 128 characters (function.name or name)"));
        };
        if !names.insert(name.to_owned()) {
            return Err(invalid(&path, format!("duplicate_tool_name: {name} is declared twice")));
        }
        if entry.get("defer_loading").is_some_and(|defer| !defer.is_boolean()) {
            return Err(invalid(&format!("{path}.defer_loading"), "must be true or false"));
        }
        if entry.get("canonical").is_some() {
            return Err(invalid(
                &path,
                "kernel aliases (entries with `canonical`) are not accepted by this server version",
            ));
        }
        if let Some(route) = entry.get("route") {
            validate_route(&path, name, route)?;
        } else if kernel_lookup(name).is_some() {
            return Err(invalid(
                &path,
                format!("kernel_tool_redefined: {name} is a kernel tool; import it through kernel_tools"),
            ));
        }
    }
    let mut sorted = entries.clone();
    sorted.sort_by_cached_key(|entry| (entry_name(entry).unwrap_or_default().to_owned(), entry.to_string()));
    let canonical = Value::Array(sorted);
    if canonical.to_string().len() > TOOL_DEFINITIONS_BOUND {
        return Err(invalid(FIELD, "is over its bound of 1048576 bytes of canonical JSON"));
    }
    Ok(canonical)
}

fn validate_route(path: &str, name: &str, route: &Value) -> Result<(), Refusal> {
    let bad = |detail: &str| invalid(&format!("{path}.route"), format!("invalid_tool_route: {detail}"));
    if kernel_lookup(name).is_some() {
        return Err(bad("a kernel name cannot be routed to a runner"));
    }
    let Some(route) = route.as_object() else { return Err(bad("must be an object")) };
    if let Some(key) = route.keys().find(|k| !matches!(k.as_str(), "kind" | "runner_executor_public_id" | "tool_name"))
    {
        return Err(bad(&format!("unknown key {key}")));
    }
    if route.get("kind").and_then(Value::as_str) != Some("runner") {
        return Err(bad("kind must be \"runner\""));
    }
    match route.get("runner_executor_public_id") {
        None | Some(Value::Null) => {
            return Err(invalid(
                &format!("{path}.route"),
                "runner_target_required: a declaration must name runner_executor_public_id",
            ));
        }
        Some(Value::String(id)) if UUID_RE.is_match(id) => {}
        Some(_) => return Err(bad("runner_executor_public_id must be a UUID")),
    }
    let tool_name = route.get("tool_name").and_then(Value::as_str).unwrap_or(name);
    if tool_name.is_empty() || tool_name.len() > 128 || tool_name.contains('\0') {
        return Err(bad("tool_name must be 1 to 128 characters without NUL"));
    }
    if tool_name != "skill" && kernel_lookup(tool_name).is_some() {
        return Err(bad("tool_name cannot be a kernel name"));
    }
    Ok(())
}

pub(super) fn validate_kernel_tools(value: Option<&Value>) -> Result<(), Refusal> {
    const FIELD: &str = "configuration.kernel_tools";
    let names = match value {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(names)) => names,
        Some(_) => return Err(invalid(FIELD, "must be an array of canonical kernel names")),
    };
    let mut seen = HashSet::new();
    for name in names {
        let Some(name) = name.as_str() else { return Err(invalid(FIELD, "entries must be strings")) };
        if !seen.insert(name) {
            return Err(invalid(FIELD, format!("{name} is listed twice")));
        }
        match kernel_lookup(name) {
            Some(tool) if tool.canonical_name == name => {}
            Some(tool) => {
                return Err(invalid(
                    FIELD,
                    format!("{name} is a wire name; list the canonical {}", tool.canonical_name),
                ));
            }
            None => return Err(invalid(FIELD, format!("{name} is not a live kernel tool"))),
        }
    }
    Ok(())
}

pub(super) fn validate_runner_ids(value: Option<&Value>) -> Result<(), Refusal> {
    const FIELD: &str = "configuration.runner_executor_public_ids";
    let ids = match value {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(ids)) => ids,
        Some(_) => return Err(invalid(FIELD, "must be an array of UUIDs")),
    };
    let mut seen = HashSet::new();
    for id in ids {
        let Some(id) = id.as_str().filter(|id| UUID_RE.is_match(id)) else {
            return Err(invalid(FIELD, "entries must be UUID strings"));
        };
        if !seen.insert(id.to_lowercase()) {
            return Err(invalid(FIELD, format!("{id} is listed twice")));
        }
    }
    Ok(())
}

pub(super) fn validate_runner_tool_names(value: Option<&Value>) -> Result<(), Refusal> {
    const FIELD: &str = "configuration.runner_tool_names";
    let names = match value {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(names)) => names,
        Some(_) => return Err(invalid(FIELD, "must be null or an array of names")),
    };
    for name in names {
        if !name.as_str().is_some_and(|n| !n.is_empty() && n.len() <= 128 && !n.contains('\0')) {
            return Err(invalid(FIELD, "each name must be a string of 1 to 128 characters without NUL"));
        }
    }
    Ok(())
}

// ---- assembly and freezing ----------------------------------------------------------------------

/// Where a runner callable goes: its frozen target and the served name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerRoute {
    /// The frozen target Runner.
    pub runner_executor_public_id: Uuid,
    /// The name the runner announced (the collision name never reaches the runner).
    pub tool_name: String,
}

/// One callable in a frozen tool set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrozenTool {
    /// The callable name the model sees.
    pub name: String,
    /// The stored entry (`{type:"function", function:{...}, route?, defer_loading?}`).
    pub definition: Value,
    /// The runner route, for runner callables.
    pub route: Option<RunnerRoute>,
    /// The served tool's effect profile at freezing.
    pub effect_profile: Option<Value>,
    /// The served tool's announced `timeout_ms`.
    pub timeout_ms: Option<u64>,
}

/// What a runner looked like when it was selected: its id, display name, status and canonical
/// announcement.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerFacts {
    /// The runner's UUID.
    pub public_id: Uuid,
    /// Display name.
    pub display_name: String,
    /// Whether it is eligible (active, credential ready).
    pub eligible: bool,
    /// The canonical announcement `{tools, environment, documents}`.
    pub announcement: Value,
}

/// The immutable declaration an execution runs under (REFERENCE.md 8).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrozenDeclaration {
    /// The assembled tool set, in declaration order.
    pub tools: Vec<FrozenTool>,
    /// `bypass | ask | rules`, or null when nothing needs approval.
    pub approval_mode: Option<String>,
    /// As declared.
    pub approval_rules: Value,
    /// The model reference every round uses.
    pub default_model: Option<String>,
    /// Captured fallback list.
    pub fallback_models: Vec<String>,
    /// The system prompt document, if any.
    pub system_prompt: Option<Value>,
    /// The selected Runner (`default_runner_executor_public_id`).
    pub default_runner_executor_public_id: Option<Uuid>,
    /// The candidates with their display names and environments, in declaration order.
    pub runner_candidates: Vec<Value>,
    /// As declared; run by a later part of the fabric.
    pub lifecycle_hooks: Value,
    /// Digest of this declaration's canonical JSON (without this field), for display.
    pub digest: String,
}

/// Builds the qualified collision name: the first 49 characters of the served name, `__`, then 12
/// hex characters of SHA-256 over (runner UUID, NUL, served name) (REFERENCE.md 4, "Runner import
/// collisions").
pub fn qualified_name(runner: Uuid, served: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(runner.to_string().as_bytes());
    hasher.update([0u8]);
    hasher.update(served.as_bytes());
    let digest = hex::encode(hasher.finalize());
    let head: String = served.chars().take(49).collect();
    format!("{head}__{}", &digest[..12])
}

/// An assembled tool set: the callables, the selected Runner and the candidate rows
/// `{runner_executor_public_id, display_name, environment}`.
pub type Assembly = (Vec<FrozenTool>, Option<Uuid>, Vec<Value>);

/// Assembles the tool set of a configuration (canonical form) for the selected Runner.
///
/// `runners` holds the facts of every runner the configuration names (candidates and explicit
/// route targets) that exists; `selected` is the input's choice, else the first candidate.
///
/// # Errors
/// 422 `runner_not_declared` (selected runner not a candidate), `runner_not_eligible`,
/// `tool_not_served` (an explicit route to a tool its target does not serve) and
/// `validation_failed` (`duplicate_tool_name` that remains after qualification).
pub fn assemble(configuration: &Value, selected: Option<Uuid>, runners: &[RunnerFacts]) -> Result<Assembly, Refusal> {
    let candidates: Vec<Uuid> = configuration["runner_executor_public_ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().and_then(|s| Uuid::parse_str(s).ok()))
        .collect();
    let facts_of = |id: Uuid| runners.iter().find(|r| r.public_id == id);
    let selected = match selected {
        Some(id) if !candidates.contains(&id) => {
            return Err(Refusal::new(
                ErrorCode::RunnerNotDeclared,
                format!("runner {id} is not among the declaration's runner_executor_public_ids"),
            ));
        }
        Some(id) => Some(id),
        None => candidates.first().copied(),
    };
    if let Some(id) = selected
        && !facts_of(id).is_some_and(|f| f.eligible)
    {
        return Err(Refusal::new(
            ErrorCode::RunnerNotEligible,
            format!("runner {id} is not eligible (missing or revoked)"),
        ));
    }

    let mut tools = Vec::new();
    let mut taken: HashSet<String> = HashSet::new();
    for entry in configuration["tool_definitions"].as_array().into_iter().flatten() {
        let name = entry_name(entry).unwrap_or_default().to_owned();
        let (route, effect_profile, timeout_ms) = match entry.get("route") {
            None => (None, None, None),
            Some(route) => {
                let target = route["runner_executor_public_id"].as_str().and_then(|s| Uuid::parse_str(s).ok());
                let served = route.get("tool_name").and_then(Value::as_str).unwrap_or(&name).to_owned();
                let announced = target.and_then(facts_of).and_then(|facts| {
                    facts.announcement["tools"].as_array()?.iter().find(|t| t["name"] == served.as_str()).cloned()
                });
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
        taken.insert(name.clone());
        tools.push(FrozenTool { name, definition: entry.clone(), route, effect_profile, timeout_ms });
    }

    let mut runner_candidates = Vec::new();
    for id in &candidates {
        if let Some(facts) = facts_of(*id) {
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
        for announced in facts.announcement["tools"].as_array().into_iter().flatten() {
            let served = announced["name"].as_str().unwrap_or_default();
            if !is_model_visible(announced) || allow.as_ref().is_some_and(|allow| !allow.contains(&served)) {
                continue;
            }
            let name = if taken.contains(served) || kernel_lookup(served).is_some() {
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
    selected: Option<Uuid>,
    runners: &[RunnerFacts],
    tool_names: Option<&[String]>,
) -> Result<FrozenDeclaration, Refusal> {
    let (tools, selected, runner_candidates) = assemble(configuration, selected, runners)?;
    let tools = narrow(tools, tool_names)?;
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
        digest: String::new(),
    };
    let bytes = serde_json::to_vec(&frozen).unwrap_or_default();
    frozen.digest = hex::encode(Sha256::digest(&bytes));
    Ok(frozen)
}

fn dedup(list: Vec<String>) -> Vec<String> {
    let mut seen = HashSet::new();
    list.into_iter().filter(|m| seen.insert(m.clone())).collect()
}

/// The provider wire projection of a frozen set (REFERENCE.md 4, "Wire projection" and
/// "Visibility"): routing and `defer_loading` are stripped, `strict:false` is added to functions
/// that carry no `strict`, and deferred entries are hidden only when the set has eager
/// `tool_search` and `tool_call` entries.
pub fn wire_projection(tools: &[FrozenTool]) -> Vec<Value> {
    let eager = |name: &str| {
        tools.iter().any(|t| t.name == name && t.definition.get("defer_loading") != Some(&Value::Bool(true)))
    };
    let hide_deferred = eager("tool_search") && eager("tool_call");
    tools
        .iter()
        .filter(|t| !(hide_deferred && t.definition.get("defer_loading") == Some(&Value::Bool(true))))
        .map(|t| project_entry(&t.definition))
        .collect()
}

fn project_entry(entry: &Value) -> Value {
    let Some(object) = entry.as_object() else { return entry.clone() };
    let mut out = object.clone();
    out.remove("route");
    out.remove("defer_loading");
    // The flat form is normalized to the nested form providers accept.
    if !out.contains_key("function") {
        let mut function = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(value) = out.remove(key) {
                function.insert(key.to_owned(), value);
            }
        }
        out.insert("function".into(), Value::Object(function));
    }
    out.entry("type").or_insert_with(|| json!("function"));
    let has_strict = out.contains_key("strict") || out["function"].get("strict").is_some();
    if out["type"] == "function" && !has_strict {
        out.insert("strict".into(), json!(false));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declaration::validate_configuration;

    fn accept_all(_: &str) -> Result<(), (String, String)> {
        Ok(())
    }

    fn runner(id: Uuid, tools: Value) -> RunnerFacts {
        RunnerFacts {
            public_id: id,
            display_name: "r".into(),
            eligible: true,
            announcement: json!({"tools": tools, "environment": {"os": "linux"}, "documents": []}),
        }
    }

    fn visible(name: &str) -> Value {
        json!({"name": name, "description": "d", "input_schema": {"type": "object"},
               "effect_profile": {"kind":"write","destructive":true,"effect_scope":"open","idempotency":"none","reconciliation":"none"},
               "timeout_ms": 1000})
    }

    fn config(value: Value) -> Value {
        validate_configuration(value.as_object().expect("object"), &accept_all).expect("valid")
    }

    #[test]
    fn imports_selected_runner_narrowed_and_deferred() {
        let id = Uuid::new_v4();
        let facts = runner(id, json!([visible("bash"), visible("read_file"), {"name": "logs", "effect_profile": {}}]));
        let cfg = config(
            json!({"runner_executor_public_ids": [id], "runner_tool_names": ["bash", "logs"], "approval_mode": "bypass"}),
        );
        let frozen = freeze(&cfg, None, None, &[facts], None).expect("frozen");
        assert_eq!(frozen.tools.len(), 1, "read_file is not allowed and logs is invisible");
        assert_eq!(frozen.tools[0].name, "bash");
        assert_eq!(frozen.tools[0].definition["defer_loading"], json!(true));
        assert_eq!(frozen.tools[0].route.as_ref().map(|r| r.runner_executor_public_id), Some(id));
        assert_eq!(frozen.default_runner_executor_public_id, Some(id));
        let wire = wire_projection(&frozen.tools);
        assert_eq!(
            wire[0],
            json!({"type":"function","function":{"name":"bash","description":"d","parameters":{"type":"object"}},"strict":false})
        );
    }

    #[test]
    fn collisions_get_the_qualified_name() {
        let id = Uuid::parse_str("00000000-0000-4000-8000-000000000001").expect("uuid");
        let facts = runner(id, json!([visible("bash")]));
        let cfg = config(json!({
            "runner_executor_public_ids": [id],
            "approval_mode": "bypass",
            "tool_definitions": [{"type":"function","function":{"name":"bash","parameters":{"type":"object"}}}]
        }));
        let frozen = freeze(&cfg, None, None, &[facts], None).expect("frozen");
        let imported = &frozen.tools[1];
        assert_eq!(imported.name, qualified_name(id, "bash"));
        assert!(imported.name.starts_with("bash__") && imported.name.len() == "bash__".len() + 12);
        assert_eq!(imported.route.as_ref().map(|r| r.tool_name.as_str()), Some("bash"));
        let long = "x".repeat(64);
        assert_eq!(qualified_name(id, &long).len(), 63);
    }

    #[test]
    fn assembly_refusals() {
        let id = Uuid::new_v4();
        let other = Uuid::new_v4();
        let cfg = config(json!({"runner_executor_public_ids": [id], "approval_mode": "bypass"}));
        let code = |r: Result<FrozenDeclaration, Refusal>| r.expect_err("refused").code;
        assert_eq!(code(freeze(&cfg, None, Some(other), &[runner(id, json!([]))], None)), "runner_not_declared");
        let mut revoked = runner(id, json!([]));
        revoked.eligible = false;
        assert_eq!(code(freeze(&cfg, None, None, &[revoked], None)), "runner_not_eligible");
        assert_eq!(
            code(freeze(&cfg, None, None, &[runner(id, json!([visible("bash")]))], Some(&["nope".to_owned()]))),
            "tool_not_declared"
        );
        let routed = config(json!({"approval_mode": "bypass", "tool_definitions": [
            {"type":"function","function":{"name":"deploy"},"route":{"kind":"runner","runner_executor_public_id": id, "tool_name": "deploy"}}
        ]}));
        assert_eq!(code(freeze(&routed, None, None, &[runner(id, json!([visible("bash")]))], None)), "tool_not_served");
    }
}
