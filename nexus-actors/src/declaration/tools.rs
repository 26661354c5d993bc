//! The tool grammar: `tool_definitions` (ordinary functions, exact kernel entries, kernel
//! aliases, runner-routed callables), `kernel_tools`, the runner fields, assembly of a frozen tool
//! set (explicit entries, kernel imports, runner imports with collision names), call resolution
//! and the provider wire projection (spec/REFERENCE.md 4; SPEC-000 "Function declarations",
//! "Runner routes", "Aliases"; R13–R33). The kernel catalog and the alias grammar themselves live
//! in `nexus-kernel-tools`.

use std::collections::HashSet;
use std::sync::LazyLock;

use nexus_proto::RunnerId;
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use nexus_kernel_tools::{
    KernelTool, ResolvedCall, Spellings, canonicalize_alias, is_alias, live as kernel_live, lookup as kernel_lookup,
    resolve_call,
};
use nexus_proto::{ErrorCode, Refusal};

use super::invalid;
use crate::declaration::announcement::is_model_visible;

/// The bound of `tool_definitions` as canonical JSON, in bytes (`tool_definitions_bound`).
pub const TOOL_DEFINITIONS_BOUND: usize = 1_048_576;
/// The kernel's default park for a runner task without an announced `timeout_ms`: 10 minutes.
pub const DEFAULT_TIMEOUT_MS: u64 = 600_000;

static PROVIDER_NAME_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-zA-Z0-9_-]{1,64}$").expect("static regex"));

static UUID_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$").expect("static regex")
});

/// The name of a tool entry: `function.name`, falling back to top-level `name`.
pub fn entry_name(entry: &Value) -> Option<&str> {
    entry.get("function").and_then(|f| f.get("name")).or_else(|| entry.get("name")).and_then(Value::as_str)
}

pub(super) fn canonical_tool_definitions(value: Option<&Value>) -> Result<Value, Refusal> {
    canonical_tool_definitions_at("configuration.tool_definitions", value)
}

/// Whether a callable name fits every provider's rule `^[a-zA-Z0-9_-]{1,64}$` (FACTS.md,
/// "Provider tool names").
pub fn provider_name_ok(name: &str) -> bool {
    PROVIDER_NAME_RE.is_match(name)
}

/// Validates a `tool_definitions` list and returns its canonical stored form
/// (REFERENCE.md 4, "Refusal order" and "Stored form"; R13–R23). `field` names the list in
/// refusal messages (`configuration.tool_definitions`, `execution_declaration.tool_definitions`).
///
/// The checks run as passes over the whole list, in the origin's order:
/// 1. every entry is an object; `duplicate_tool_name` (two entries of any kind on one name);
/// 2. `invalid`: a `defer_loading` that is not a boolean;
/// 3. a routed entry's route: `invalid_tool_route` (also for an alias or a kernel name with a
///    route), `runner_target_required`;
/// 4. an alias's refusal: `invalid`, `alias_canonical_unknown`, `alias_name_reserved`,
///    `alias_param_unknown`, `alias_invert_needs_boolean`, `alias_param_description_required`,
///    `kernel_tool_redefined`;
/// 5. a plain entry on a kernel name (either spelling) must equal the catalog definition or the
///    set's re-spelled render, ignoring `defer_loading`: else `kernel_tool_redefined`.
///
/// Every callable name must also fit the provider rule `^[a-zA-Z0-9_-]{1,64}$` (`invalid`).
///
/// The stored form renders the set with its own spellings (aliases as full function blocks with
/// their facts, plain kernel entries re-spelled), sorted by `[name, entry JSON]`. A list with no
/// alias keeps the catalog's bytes exactly, and canonicalizing a stored list is a no-op.
///
/// # Errors
/// 422 `validation_failed` whose message is `{field}[i]: {word}: ...` (or `{field}: ...` for the
/// list itself, including the 1 MiB `tool_definitions_bound`).
pub fn canonical_tool_definitions_at(field: &str, value: Option<&Value>) -> Result<Value, Refusal> {
    let entries = match value {
        None | Some(Value::Null) => return Ok(json!([])),
        Some(Value::Array(entries)) => entries,
        Some(_) => return Err(invalid(field, "invalid: must be an array of tool declarations")),
    };
    let at = |i: usize| format!("{field}[{i}]");
    if let Some(i) = entries.iter().position(|entry| !entry.is_object()) {
        return Err(invalid(&at(i), "invalid: must be an object"));
    }
    // 1. duplicate_tool_name, over every entry that has a name.
    let mut names = HashSet::new();
    for (i, entry) in entries.iter().enumerate() {
        if let Some(name) = entry_name(entry)
            && !names.insert(name)
        {
            return Err(invalid(&at(i), format!("duplicate_tool_name: {name} is declared twice")));
        }
    }
    // 2. defer_loading must be a boolean.
    if let Some(i) = entries.iter().position(|e| e.get("defer_loading").is_some_and(|defer| !defer.is_boolean())) {
        return Err(invalid(&format!("{}.defer_loading", at(i)), "invalid: must be true or false"));
    }
    // 3. routes.
    for (i, entry) in entries.iter().enumerate() {
        let Some(route) = entry.get("route") else { continue };
        if is_alias(entry) {
            return Err(invalid(
                &format!("{}.route", at(i)),
                "invalid_tool_route: a kernel alias cannot be routed to a runner",
            ));
        }
        validate_route(&at(i), entry_name(entry), route)?;
    }
    // 4. aliases, rendered with the set's spellings.
    let spellings = Spellings::from_entries(entries.iter());
    let mut stored = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        if !is_alias(entry) {
            continue;
        }
        let rendered = canonicalize_alias(entry, &spellings).map_err(|error| invalid(&at(i), error))?;
        let name = entry_name(&rendered).unwrap_or_default();
        if !provider_name_ok(name) {
            return Err(invalid(&at(i), format!("invalid: the name {name} must match ^[a-zA-Z0-9_-]{{1,64}}$")));
        }
        stored.push(rendered);
    }
    // 5. plain entries: names, and kernel names only in the catalog's (or the set's) bytes.
    for (i, entry) in entries.iter().enumerate() {
        if is_alias(entry) {
            continue;
        }
        let Some(name) = entry_name(entry) else {
            return Err(invalid(&at(i), "invalid: needs a name (function.name or name)"));
        };
        if entry.get("route").is_none()
            && let Some(tool) = kernel_lookup(name)
        {
            stored.push(kernel_entry(&at(i), tool, entry, &spellings)?);
            continue;
        }
        if !provider_name_ok(name) {
            return Err(invalid(&at(i), format!("invalid: the name {name} must match ^[a-zA-Z0-9_-]{{1,64}}$")));
        }
        stored.push(entry.clone());
    }
    // Sort key `[name, entry.to_json]`: names are unique by now, so the JSON text only breaks ties
    // that cannot occur; compare it lazily rather than serializing every entry.
    stored.sort_by(|a, b| {
        entry_name(a)
            .unwrap_or_default()
            .cmp(entry_name(b).unwrap_or_default())
            .then_with(|| a.to_string().cmp(&b.to_string()))
    });
    let canonical = Value::Array(stored);
    if json_len(&canonical) > TOOL_DEFINITIONS_BOUND {
        return Err(invalid(field, "tool_definitions_bound: over 1048576 bytes of canonical JSON"));
    }
    Ok(canonical)
}

/// The length of a value's compact JSON text, in bytes, without building the text.
pub fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to an in-memory sink cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// A plain entry on a kernel name: equal (ignoring `defer_loading`, flat or nested) to the
/// catalog definition or to the set's re-spelled render; stored as the re-spelled render.
fn kernel_entry(path: &str, tool: &KernelTool, entry: &Value, spellings: &Spellings) -> Result<Value, Refusal> {
    let mut bare = nested(entry);
    let defer = bare.as_object_mut().and_then(|object| object.remove("defer_loading"));
    let rendered = tool.render(spellings);
    if bare != *tool.definition() && bare != rendered {
        return Err(invalid(
            path,
            format!(
                "kernel_tool_redefined: {} is the kernel tool {}; declare it in the catalog's exact bytes, \
                 import it through kernel_tools, or spell it with an alias (canonical)",
                entry_name(entry).unwrap_or_default(),
                tool.canonical_name
            ),
        ));
    }
    let mut stored = rendered;
    if let (Some(defer), Some(object)) = (defer, stored.as_object_mut()) {
        object.insert("defer_loading".into(), defer);
    }
    Ok(stored)
}

/// The nested form of a flat function entry (`{type, name, description, parameters, strict}`
/// moves under `function`); any other entry unchanged.
fn nested(entry: &Value) -> Value {
    let Some(object) = entry.as_object() else { return entry.clone() };
    if object.contains_key("function") {
        return entry.clone();
    }
    let mut out = object.clone();
    let mut function = Map::new();
    for key in ["name", "description", "parameters", "strict"] {
        if let Some(value) = out.remove(key) {
            function.insert(key.to_owned(), value);
        }
    }
    out.insert("function".into(), Value::Object(function));
    Value::Object(out)
}

fn validate_route(path: &str, name: Option<&str>, route: &Value) -> Result<(), Refusal> {
    let bad = |detail: &str| invalid(&format!("{path}.route"), format!("invalid_tool_route: {detail}"));
    let Some(name) = name else { return Err(bad("the routed declaration needs a name")) };
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
    let Some(tool_name) = route.get("tool_name").and_then(Value::as_str) else {
        return Err(bad("tool_name (the served name) is required"));
    };
    if tool_name.is_empty() || tool_name.chars().count() > 128 || tool_name.contains('\0') {
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
    pub runner_executor_public_id: RunnerId,
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
    /// The kernel tool's canonical name, for kernel entries, aliases and kernel imports.
    #[serde(default)]
    pub canonical: Option<String>,
}

impl FrozenTool {
    /// The kernel canonical name this callable runs as, if it is a kernel tool. Declarations
    /// frozen before `canonical` was recorded fall back to the entry's facts and its name.
    pub fn canonical_name(&self) -> Option<&str> {
        if let Some(canonical) = &self.canonical {
            return Some(canonical);
        }
        if let Some(canonical) = self.definition.get("canonical").and_then(Value::as_str) {
            return Some(canonical);
        }
        if self.route.is_some() {
            return None;
        }
        kernel_lookup(&self.name).filter(|tool| tool.name == self.name).map(|tool| tool.canonical_name)
    }

    /// Whether the entry is declared `defer_loading: true`.
    pub fn deferred(&self) -> bool {
        self.definition.get("defer_loading") == Some(&Value::Bool(true))
    }

    /// Resolves a call the model made to this callable (REFERENCE.md 4, "Call resolution"): a
    /// runner callable runs under its frozen served name, an alias under the kernel wire name
    /// with its input mapped, anything else unchanged. `alias` is the callable name when it
    /// differs from `wire_name` (the inbox row's `tool_alias`, the transcript's `name`).
    pub fn resolve_call(&self, input: &Value) -> ResolvedCall {
        if let Some(route) = &self.route {
            let alias = (route.tool_name != self.name).then(|| self.name.clone());
            return ResolvedCall { wire_name: route.tool_name.clone(), input: input.clone(), alias };
        }
        resolve_call(&self.definition, input)
    }
}

/// What a runner looked like when it was selected: its id, display name, status and canonical
/// announcement.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerFacts {
    /// The runner's UUID.
    pub public_id: RunnerId,
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
    pub default_runner_executor_public_id: Option<RunnerId>,
    /// The candidates with their display names and environments, in declaration order.
    pub runner_candidates: Vec<Value>,
    /// As declared; run by a later part of the fabric.
    pub lifecycle_hooks: Value,
    /// `compaction_policy` as declared (REFERENCE.md 13), or null; run by
    /// [`crate::actors::execution::compaction`]. Absent in declarations frozen before it was captured.
    #[serde(default)]
    pub compaction_policy: Value,
    /// The `summarizer` prompt document `{content, role}`, if any: the kernel summarizer's
    /// instructions. Absent in declarations frozen before it was captured.
    #[serde(default)]
    pub summarizer: Option<Value>,
    /// Digest of this declaration's canonical JSON (without this field), for display.
    pub digest: String,
}

impl FrozenDeclaration {
    /// The declaration with its `summarizer` document frozen beside it, and its digest taken
    /// again over the whole.
    #[must_use]
    pub fn with_summarizer(mut self, summarizer: Option<Value>) -> Self {
        self.summarizer = summarizer;
        self.digest = String::new();
        let bytes = serde_json::to_vec(&self).unwrap_or_default();
        self.digest = hex::encode(Sha256::digest(&bytes));
        self
    }
}

/// Builds the qualified collision name: the first 49 characters of the served name, `__`, then 12
/// hex characters of SHA-256 over (runner UUID, NUL, served name) (REFERENCE.md 4, "Runner import
/// collisions"; R27). At most 63 characters.
///
/// A character of the head outside `[a-zA-Z0-9_-]` is written as `_`, so the name always fits the
/// provider rule `^[a-zA-Z0-9_-]{1,64}$`; for a served name inside that rule the name is exactly
/// the spec's. The digest covers the full served name as announced.
pub fn qualified_name(runner: RunnerId, served: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(runner.to_string().as_bytes());
    hasher.update([0u8]);
    hasher.update(served.as_bytes());
    let digest = hex::encode(hasher.finalize());
    let head: String = served
        .chars()
        .take(49)
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .collect();
    format!("{head}__{}", &digest[..12])
}

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
/// route targets) that exists. Only the selected Runner contributes imports; an ineligible named
/// Runner is refused, never silently replaced (REFERENCE.md 8).
///
/// # Errors
/// 422 `runner_not_declared` (selected runner not a candidate), `runner_not_eligible`,
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
        .filter_map(|v| v.as_str().and_then(|s| s.parse::<RunnerId>().ok()))
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
            candidates.iter().copied().find(|id| facts_of(*id).is_some_and(|f| f.eligible))
        }
    };
    if let Some(id) = selected
        && !facts_of(id).is_some_and(|f| f.eligible)
    {
        return Err(Refusal::new(
            ErrorCode::RunnerNotEligible,
            format!("runner {id} is not eligible (missing or revoked)"),
        ));
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
                let target = route["runner_executor_public_id"].as_str().and_then(|s| s.parse::<RunnerId>().ok());
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
        // A lifecycle hook's tool runs only as a hook task and is never exposed to the model
        // (REFERENCE.md 11; R55), so the runner's announcement of it is not imported.
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
/// "Visibility"; R14, R15, R17):
/// - an alias keeps only `type` and `function`; other entries drop `route` and `defer_loading`
///   (a flat function is nested);
/// - a `type: function` entry with `strict` in neither the function nor the entry gets
///   `strict:false`; an explicit value is preserved;
/// - deferred entries are hidden only when the set has eager entries whose canonical is
///   `nexus.tools.search` and `nexus.tools.call` (plain names or aliases); otherwise every entry
///   is exposed. Deferral never changes what may be called.
pub fn wire_projection(tools: &[FrozenTool]) -> Vec<Value> {
    let eager = |canonical: &str| tools.iter().any(|t| !t.deferred() && t.canonical_name() == Some(canonical));
    let hide_deferred = eager("nexus.tools.search") && eager("nexus.tools.call");
    tools.iter().filter(|t| !(hide_deferred && t.deferred())).map(|t| provider_definition(&t.definition)).collect()
}

/// One stored entry as a provider sees it (the projection rules of [`wire_projection`]); also
/// the `definition` that `tool_search` returns.
pub fn provider_definition(entry: &Value) -> Value {
    let Some(object) = entry.as_object() else { return entry.clone() };
    let mut out = if object.contains_key("canonical") {
        object
            .iter()
            .filter(|(key, _)| matches!(key.as_str(), "type" | "function"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    } else {
        let mut out = object.clone();
        out.remove("route");
        out.remove("defer_loading");
        out
    };
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
    use nexus_kernel_tools::lookup;

    use super::*;
    use crate::declaration::validate_configuration;

    const RUNNER: &str = "00000000-0000-4000-8000-000000000001";

    fn accept_all(_: &str) -> Result<(), (String, String)> {
        Ok(())
    }

    fn runner_id() -> RunnerId {
        RUNNER.parse().expect("uuid")
    }

    fn runner(id: RunnerId, tools: Value) -> RunnerFacts {
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

    fn definitions(list: Value) -> Result<Value, Refusal> {
        canonical_tool_definitions(Some(&list))
    }

    /// The refusal word of a list: the message is `configuration.tool_definitions...: word: ...`.
    fn word_of(list: Value) -> (String, String) {
        let refusal = definitions(list).expect_err("refused");
        assert_eq!(refusal.code, ErrorCode::ValidationFailed);
        let (path, rest) = refusal.message.split_once(": ").expect("path: word");
        let word = rest.split(':').next().unwrap_or_default().to_owned();
        (path.to_owned(), word)
    }

    fn kernel(name: &str) -> Value {
        lookup(name).expect("live").definition().clone()
    }

    fn plain(name: &str) -> Value {
        json!({"type":"function","function":{"name": name,"description":"d","parameters":{"type":"object"}}})
    }

    fn routed(name: &str, route: Value) -> Value {
        json!({"type":"function","function":{"name": name,"parameters":{"type":"object"}},"route": route})
    }

    fn agent_alias() -> Value {
        json!({"name": "Agent", "canonical": "nexus.graph.delegate_task",
               "params": {"run_in_background": {"maps_to": "wait", "invert": true, "description": "Run it in the background."}}})
    }

    fn frozen_tools(cfg: Value, runners: &[RunnerFacts]) -> Vec<FrozenTool> {
        freeze(&config(cfg), None, RunnerSelection::FirstEligible, runners, None).expect("frozen").tools
    }

    /// One row per refusal, each named after its requirement: (row, list, path, word).
    #[test]
    fn r13_to_r23_declaration_refusals() {
        let uuid = json!(RUNNER);
        let rows: Vec<(&str, Value, &str, &str)> = vec![
            ("R13 not a list", json!({"a": 1}), "configuration.tool_definitions", "invalid"),
            ("R13 entry not an object", json!([plain("a"), "b"]), "configuration.tool_definitions[1]", "invalid"),
            (
                "R15 defer_loading null",
                json!([{"type":"function","name":"a","defer_loading":null}]),
                "configuration.tool_definitions[0].defer_loading",
                "invalid",
            ),
            (
                "R15 defer_loading string",
                json!([{"type":"function","name":"a","defer_loading":"true"}]),
                "configuration.tool_definitions[0].defer_loading",
                "invalid",
            ),
            (
                "R15 defer_loading number",
                json!([{"type":"function","name":"a","defer_loading":1}]),
                "configuration.tool_definitions[0].defer_loading",
                "invalid",
            ),
            (
                "R15 defer_loading array",
                json!([{"type":"function","name":"a","defer_loading":[]}]),
                "configuration.tool_definitions[0].defer_loading",
                "invalid",
            ),
            (
                "R16 kind",
                json!([routed("a", json!({"kind":"mcp","runner_executor_public_id":uuid,"tool_name":"a"}))]),
                "configuration.tool_definitions[0].route",
                "invalid_tool_route",
            ),
            (
                "R16 extra key",
                json!([routed("a", json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":"a","x":1}))]),
                "configuration.tool_definitions[0].route",
                "invalid_tool_route",
            ),
            (
                "R16 malformed uuid",
                json!([routed("a", json!({"kind":"runner","runner_executor_public_id":"nope","tool_name":"a"}))]),
                "configuration.tool_definitions[0].route",
                "invalid_tool_route",
            ),
            (
                "R16 missing uuid",
                json!([routed("a", json!({"kind":"runner","tool_name":"a"}))]),
                "configuration.tool_definitions[0].route",
                "runner_target_required",
            ),
            (
                "R16 null uuid",
                json!([routed("a", json!({"kind":"runner","runner_executor_public_id":null,"tool_name":"a"}))]),
                "configuration.tool_definitions[0].route",
                "runner_target_required",
            ),
            (
                "R16 missing tool_name",
                json!([routed("a", json!({"kind":"runner","runner_executor_public_id":uuid}))]),
                "configuration.tool_definitions[0].route",
                "invalid_tool_route",
            ),
            (
                "R16 empty tool_name",
                json!([routed("a", json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":""}))]),
                "configuration.tool_definitions[0].route",
                "invalid_tool_route",
            ),
            (
                "R16 long tool_name",
                json!([routed(
                    "a",
                    json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":"t".repeat(129)})
                )]),
                "configuration.tool_definitions[0].route",
                "invalid_tool_route",
            ),
            (
                "R16 NUL tool_name",
                json!([routed("a", json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":"a\u{0}b"}))]),
                "configuration.tool_definitions[0].route",
                "invalid_tool_route",
            ),
            (
                "R16 kernel tool_name",
                json!([routed(
                    "a",
                    json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":"memory_read"})
                )]),
                "configuration.tool_definitions[0].route",
                "invalid_tool_route",
            ),
            (
                "R16 kernel callable routed",
                json!([routed("wait", json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":"w"}))]),
                "configuration.tool_definitions[0].route",
                "invalid_tool_route",
            ),
            (
                "R16 alias routed",
                json!([{"name":"s","canonical":"nexus.skill.load","route":{"kind":"runner","runner_executor_public_id":uuid,"tool_name":"s"}}]),
                "configuration.tool_definitions[0].route",
                "invalid_tool_route",
            ),
            (
                "R18 duplicate plain",
                json!([plain("a"), {"type":"function","name":"a"}]),
                "configuration.tool_definitions[1]",
                "duplicate_tool_name",
            ),
            (
                "R18 duplicate alias and plain",
                json!([plain("Agent"), agent_alias()]),
                "configuration.tool_definitions[1]",
                "duplicate_tool_name",
            ),
            (
                "R18 duplicate kernel entry and identity alias",
                json!([kernel("skill"), {"name":"skill","canonical":"nexus.skill.load"}]),
                "configuration.tool_definitions[1]",
                "duplicate_tool_name",
            ),
            (
                "R19 kernel name in other bytes",
                json!([plain("wait")]),
                "configuration.tool_definitions[0]",
                "kernel_tool_redefined",
            ),
            (
                "R19 canonical spelling as a plain name",
                json!([plain("nexus.graph.wait")]),
                "configuration.tool_definitions[0]",
                "kernel_tool_redefined",
            ),
            (
                "R19 kernel bytes plus strict",
                json!([{"type":"function","function":kernel("wait")["function"].clone(),"strict":true}]),
                "configuration.tool_definitions[0]",
                "kernel_tool_redefined",
            ),
            (
                "R20 alias_canonical_unknown",
                json!([{"name":"x","canonical":"nexus.graph.compose"}]),
                "configuration.tool_definitions[0]",
                "alias_canonical_unknown",
            ),
            (
                "R20 alias_name_reserved",
                json!([{"name":"ask","canonical":"nexus.skill.load"}]),
                "configuration.tool_definitions[0]",
                "alias_name_reserved",
            ),
            (
                "R20 alias_param_unknown",
                json!([plain("z"), {"name":"x","canonical":"nexus.skill.load","omit":["nope"]}]),
                "configuration.tool_definitions[1]",
                "alias_param_unknown",
            ),
            (
                "R20 alias_invert_needs_boolean",
                json!([{"name":"x","canonical":"nexus.memory.delete","params":{"p":{"maps_to":"path","invert":true,"description":"d"}}}]),
                "configuration.tool_definitions[0]",
                "alias_invert_needs_boolean",
            ),
            (
                "R20 alias_param_description_required",
                json!([{"name":"x","canonical":"nexus.graph.delegate_task","params":{"bg":{"maps_to":"wait","invert":true}}}]),
                "configuration.tool_definitions[0]",
                "alias_param_description_required",
            ),
            (
                "R20 alias function block redefined",
                json!([{"type":"function","function":{"name":"x","description":"mine"},"canonical":"nexus.skill.load"}]),
                "configuration.tool_definitions[0]",
                "kernel_tool_redefined",
            ),
            (
                "R20 alias name invalid",
                json!([{"name":"","canonical":"nexus.skill.load"}]),
                "configuration.tool_definitions[0]",
                "invalid",
            ),
            ("provider rule: dotted name", json!([plain("my.tool")]), "configuration.tool_definitions[0]", "invalid"),
            (
                "provider rule: 65 characters",
                json!([plain(&"a".repeat(65))]),
                "configuration.tool_definitions[0]",
                "invalid",
            ),
            (
                "provider rule: alias name",
                json!([{"name":"my skill","canonical":"nexus.skill.load"}]),
                "configuration.tool_definitions[0]",
                "invalid",
            ),
            (
                "name missing",
                json!([{"type":"function","function":{"description":"d"}}]),
                "configuration.tool_definitions[0]",
                "invalid",
            ),
        ];
        for (row, list, path, word) in rows {
            let (got_path, got_word) = word_of(list);
            assert_eq!((got_path.as_str(), got_word.as_str()), (path, word), "{row}");
        }
    }

    /// REFERENCE.md 4 "Refusal order": each row breaks two rules; the earlier word wins.
    #[test]
    fn refusal_order() {
        let bad_route = json!({"kind":"runner","tool_name":"a"});
        let rows: Vec<(&str, Value, &str)> = vec![
            (
                "duplicate before defer",
                json!([{"type":"function","name":"b","defer_loading":1}, plain("a"), plain("a")]),
                "duplicate_tool_name",
            ),
            (
                "defer before route",
                json!([routed("b", bad_route.clone()), {"type":"function","name":"a","defer_loading":"x"}]),
                "invalid",
            ),
            (
                "route before alias",
                json!([{"name":"x","canonical":"nexus.nope"}, routed("b", bad_route)]),
                "runner_target_required",
            ),
            (
                "alias before kernel bytes",
                json!([plain("wait"), {"name":"x","canonical":"nexus.nope"}]),
                "alias_canonical_unknown",
            ),
            ("canonical before reserved", json!([{"name":"ask","canonical":"nexus.nope"}]), "alias_canonical_unknown"),
            (
                "reserved before params",
                json!([{"name":"ask","canonical":"nexus.skill.load","omit":["nope"]}]),
                "alias_name_reserved",
            ),
            (
                "invert type before description",
                json!([{"name":"x","canonical":"nexus.skill.load","params":{"n":{"maps_to":"name","invert":true}}}]),
                "alias_invert_needs_boolean",
            ),
        ];
        for (row, list, word) in rows {
            assert_eq!(word_of(list).1, word, "{row}");
        }
    }

    #[test]
    fn r13_bound_and_sorted_storage() {
        let stored = definitions(json!([plain("zeta"), plain("alpha"), kernel("wait")])).expect("valid");
        let names: Vec<&str> = stored.as_array().expect("list").iter().filter_map(entry_name).collect();
        assert_eq!(names, ["alpha", "wait", "zeta"]);
        let big = json!([{"type":"function","function":{"name":"big","description":"x".repeat(TOOL_DEFINITIONS_BOUND),"parameters":{}}}]);
        let refusal = definitions(big).expect_err("over bound");
        assert_eq!(refusal.code, ErrorCode::ValidationFailed);
        assert!(refusal.message.starts_with("configuration.tool_definitions: tool_definitions_bound"));
        assert_eq!(definitions(json!([])).expect("empty"), json!([]));
        assert_eq!(canonical_tool_definitions(None).expect("omitted"), json!([]));
        let inline =
            canonical_tool_definitions_at("execution_declaration.tool_definitions", Some(&json!([plain("wait")])));
        assert!(
            inline
                .expect_err("refused")
                .message
                .starts_with("execution_declaration.tool_definitions[0]: kernel_tool_redefined")
        );
    }

    #[test]
    fn r19_r22_kernel_bytes_and_respelling() {
        // No alias: the catalog's bytes exactly, with or without defer_loading, nested or flat.
        let wait = kernel("wait");
        let stored = definitions(json!([wait.clone()])).expect("exact kernel entry");
        assert_eq!(stored, json!([wait.clone()]));
        let mut deferred = wait.clone();
        deferred["defer_loading"] = json!(true);
        assert_eq!(definitions(json!([deferred.clone()])).expect("deferred"), json!([deferred]));
        let function = &wait["function"];
        let flat = json!({"type":"function","name":"wait","description":function["description"],"parameters":function["parameters"]});
        assert_eq!(definitions(json!([flat])).expect("flat kernel entry"), json!([wait.clone()]));

        // An alias re-spells every description of the set: the plain wait entry in catalog bytes
        // is stored as the re-spelled render, and that render is accepted as authored too.
        let stored = definitions(json!([wait.clone(), agent_alias()])).expect("valid");
        let stored_wait = &stored[1];
        assert_eq!(entry_name(stored_wait), Some("wait"));
        let description = stored_wait["function"]["description"].as_str().expect("text");
        assert!(description.contains("started with Agent or spawn"), "{description}");
        assert_eq!(definitions(json!([stored_wait.clone(), agent_alias()])).expect("re-spelled accepted"), stored);
        // Another spelling of the macro is a redefinition.
        let mut wrong = stored_wait.clone();
        wrong["function"]["description"] = json!(description.replace("Agent", "Helper"));
        assert_eq!(word_of(json!([wrong, agent_alias()])).1, "kernel_tool_redefined");
    }

    #[test]
    fn r20_r23_aliases_stored_as_renders() {
        let compact =
            json!({"type":"function","function":{"name":"skill"},"canonical":"nexus.skill.load","defer_loading":true});
        let stored = definitions(json!([compact])).expect("R23 compact identity alias");
        assert_eq!(stored[0]["function"], kernel("skill")["function"]);
        assert_eq!(stored[0]["canonical"], "nexus.skill.load");
        assert_eq!(stored[0]["defer_loading"], true);

        let stored = definitions(json!([agent_alias(), kernel("ask")])).expect("valid");
        let agent = &stored[0];
        assert_eq!(agent["type"], "function");
        assert_eq!(agent["function"]["name"], "Agent");
        assert_eq!(agent["function"]["parameters"]["properties"]["run_in_background"]["default"], true);
        assert!(agent["function"]["parameters"]["properties"].get("wait").is_none());
        assert_eq!(agent["params"], agent_alias()["params"], "the facts stay beside the render");
        // Several spellings of one canonical, the plain name among them, are lawful.
        let both = definitions(
            json!([agent_alias(), {"name":"Helper","canonical":"nexus.graph.delegate_task"}, kernel("delegate_task")]),
        );
        assert_eq!(both.expect("lawful").as_array().map(Vec::len), Some(3));
    }

    #[test]
    fn canonical_form_is_idempotent() {
        let list = json!([
            plain("zeta"),
            {"type":"function","name":"flat","description":"d","parameters":{"type":"object"},"strict":true},
            routed("deploy", json!({"kind":"runner","runner_executor_public_id":RUNNER,"tool_name":"deploy"})),
            kernel("wait"),
            kernel("tool_search"),
            agent_alias(),
            {"name":"Await","canonical":"nexus.graph.wait","omit":["run_public_id"],"description":"Block on {{delegate_task}} work.","defer_loading":false},
            {"type":"function","function":{"name":"skill"},"canonical":"nexus.skill.load","defer_loading":true},
        ]);
        let once = definitions(list).expect("valid");
        let twice = definitions(once.clone()).expect("stored form is lawful");
        assert_eq!(twice, once);
        assert_eq!(twice.to_string(), once.to_string(), "byte-stable");
        // The Await alias renders the macro with the Agent spelling; the wait entry renders
        // {{delegate_task}} as Agent.
        let await_entry =
            once.as_array().expect("list").iter().find(|e| entry_name(e) == Some("Await")).expect("Await");
        assert_eq!(await_entry["function"]["description"], "Block on Agent work.");
        assert_eq!(await_entry["description"], "Block on {{delegate_task}} work.", "the fact keeps its macros");
    }

    #[test]
    fn r14_r15_r17_wire_projection_and_visibility() {
        let cfg = json!({"approval_mode": "bypass", "tool_definitions": [
            plain("nostrict"),
            {"type":"function","function":{"name":"fstrict","parameters":{},"strict":true}},
            {"type":"function","function":{"name":"estrict","parameters":{}},"strict":false},
            {"type":"function","name":"flat","description":"d","parameters":{"type":"object"},"defer_loading":true},
            agent_alias(),
        ]});
        let tools = frozen_tools(cfg, &[]);
        let wire = wire_projection(&tools);
        let by_name = |name: &str| wire.iter().find(|w| w["function"]["name"] == name).cloned().expect(name);
        assert_eq!(by_name("nostrict")["strict"], false, "R14 omitted strict becomes false on the wire");
        assert_eq!(by_name("fstrict").get("strict"), None, "R14 explicit strict in the function is kept");
        assert_eq!(by_name("fstrict")["function"]["strict"], true);
        assert_eq!(by_name("estrict")["strict"], false);
        assert_eq!(
            by_name("flat"),
            json!({"type":"function","function":{"name":"flat","description":"d","parameters":{"type":"object"}},"strict":false}),
            "R15 defer_loading is stripped and the flat form nested"
        );
        let agent = by_name("Agent");
        let keys: Vec<&str> = agent.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(keys, ["function", "strict", "type"], "R17 alias facts never reach the provider");
        assert_eq!(wire.len(), 5, "no search/call pair: every deferred schema is exposed");
        // The stored declaration is not rewritten.
        assert!(tools.iter().all(|t| t.definition.get("strict").is_none() || t.name == "estrict"));

        // Visibility rows: (row, extra entries, is the deferred entry hidden).
        let deferred = json!({"type":"function","function":{"name":"later","parameters":{}},"defer_loading":true});
        let mut search_deferred = kernel("tool_search");
        search_deferred["defer_loading"] = json!(true);
        let rows: Vec<(&str, Value, bool)> = vec![
            ("R15 eager search and call hide deferred", json!([kernel("tool_search"), kernel("tool_call")]), true),
            ("R15 only search exposes all", json!([kernel("tool_search")]), false),
            ("R15 deferred search exposes all", json!([search_deferred, kernel("tool_call")]), false),
            (
                "R15 aliases count",
                json!([{"name":"Find","canonical":"nexus.tools.search"}, {"name":"Run","canonical":"nexus.tools.call"}]),
                true,
            ),
        ];
        for (row, extra, hidden) in rows {
            let mut list = extra.as_array().cloned().expect("list");
            list.push(deferred.clone());
            let tools = frozen_tools(json!({"approval_mode":"bypass","tool_definitions": list}), &[]);
            let wire = wire_projection(&tools);
            assert_eq!(!wire.iter().any(|w| w["function"]["name"] == "later"), hidden, "{row}");
            assert!(tools.iter().any(|t| t.name == "later"), "{row}: deferral never changes authority");
        }
        // Kernel imports of search and call count too.
        let tools = frozen_tools(
            json!({"approval_mode":"bypass","kernel_tools":["nexus.tools.search","nexus.tools.call"],"tool_definitions":[deferred]}),
            &[],
        );
        assert_eq!(wire_projection(&tools).len(), 2);
    }

    #[test]
    fn r21_alias_calls_resolve_to_the_kernel() {
        let id = runner_id();
        let cfg = json!({"approval_mode": "bypass", "runner_executor_public_ids": [id], "tool_definitions": [
            agent_alias(),
            kernel("ask"),
            routed("shell", json!({"kind":"runner","runner_executor_public_id":id,"tool_name":"bash"})),
        ]});
        let tools = frozen_tools(cfg, &[runner(id, json!([visible("bash")]))]);
        let find = |name: &str| tools.iter().find(|t| t.name == name).expect(name);
        let agent = find("Agent");
        assert_eq!(agent.canonical_name(), Some("nexus.graph.delegate_task"));
        assert_eq!(agent.effect_profile.as_ref().map(|p| p["reconciliation"].clone()), Some(json!("lookup")));
        let call = agent.resolve_call(&json!({"prompt": "p", "run_in_background": true}));
        assert_eq!(call.wire_name, "delegate_task");
        assert_eq!(call.alias.as_deref(), Some("Agent"));
        assert_eq!(call.input, json!({"prompt": "p", "wait": false}));
        let ask = find("ask").resolve_call(&json!({"prompt": "?"}));
        assert_eq!((ask.wire_name.as_str(), ask.alias), ("ask", None));
        let shell = find("shell").resolve_call(&json!({"command": "ls"}));
        assert_eq!((shell.wire_name.as_str(), shell.alias.as_deref()), ("bash", Some("shell")));
        assert_eq!(find("shell").canonical_name(), None);
    }

    #[test]
    fn kernel_imports_and_identity_precedence() {
        let cfg = json!({"approval_mode": "bypass",
        "kernel_tools": ["nexus.skill.load", "nexus.graph.wait", "nexus.graph.delegate_task"],
        "tool_definitions": [
            {"type":"function","function":{"name":"skill"},"canonical":"nexus.skill.load","defer_loading":true},
            agent_alias(),
        ]});
        let tools = frozen_tools(cfg, &[]);
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["Agent", "skill", "wait", "delegate_task"], "explicit first, then imports in order");
        let skill = &tools[1];
        assert_eq!(skill.definition["defer_loading"], true, "the identity declaration beats the plain import");
        let wait = &tools[2];
        assert_eq!(wait.canonical.as_deref(), Some("nexus.graph.wait"));
        assert!(wait.definition["function"]["description"].as_str().expect("text").contains("started with Agent"));
        assert_eq!(tools[3].definition["function"]["name"], "delegate_task", "a plain import coexists with an alias");
        assert_eq!(wait.effect_profile, Some(lookup("wait").expect("live").effect_profile().to_json()));
        // Without aliases the import is the catalog's bytes.
        let tools = frozen_tools(json!({"approval_mode":"bypass","kernel_tools":["nexus.graph.wait"]}), &[]);
        assert_eq!(&tools[0].definition, lookup("wait").expect("live").definition());
    }

    #[test]
    fn r24_kernel_tools_rows() {
        let rows: Vec<(&str, Value, bool)> = vec![
            ("canonical names", json!(["nexus.memory.read", "nexus.tools.search"]), true),
            ("null", Value::Null, true),
            ("duplicate", json!(["nexus.memory.read", "nexus.memory.read"]), false),
            ("unknown", json!(["nexus.graph.compose"]), false),
            ("wire alias", json!(["memory_read"]), false),
            ("wildcard", json!(["nexus.memory.*"]), false),
            ("not a list", json!("nexus.memory.read"), false),
        ];
        for (row, value, ok) in rows {
            let result = validate_kernel_tools(Some(&value));
            assert_eq!(result.is_ok(), ok, "{row}");
            if let Err(refusal) = result {
                assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{row}");
                assert!(refusal.message.starts_with("configuration.kernel_tools"), "{row}");
            }
        }
    }

    #[test]
    fn r26_imports_selected_runner_narrowed_and_deferred() {
        let id = RunnerId::new_v4();
        let facts = runner(id, json!([visible("bash"), visible("read_file"), {"name": "logs", "effect_profile": {}}]));
        let cfg = config(
            json!({"runner_executor_public_ids": [id], "runner_tool_names": ["bash", "logs"], "approval_mode": "bypass"}),
        );
        let frozen = freeze(&cfg, None, RunnerSelection::FirstEligible, &[facts], None).expect("frozen");
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
    fn r27_collision_names_are_stable_and_fit_providers() {
        let id = runner_id();
        assert_eq!(qualified_name(id, "bash"), "bash__ce37e948ffca");
        assert_eq!(qualified_name(id, "memory_read"), "memory_read__cefde19374ff");
        assert_eq!(qualified_name(id, "fs.read"), "fs_read__3f799c3d7039", "outside the provider rule: sanitized head");
        let long = "x".repeat(70);
        assert_eq!(qualified_name(id, &long), format!("{}__ad2c6f8fef46", "x".repeat(49)));
        assert_eq!(qualified_name(id, &long).len(), 63);

        let facts = runner(
            id,
            json!([visible("bash"), visible("memory_read"), visible("wait"), visible("fs.read"), visible("ok")]),
        );
        let cfg = json!({
            "runner_executor_public_ids": [id],
            "approval_mode": "bypass",
            "kernel_tools": ["nexus.memory.read"],
            "tool_definitions": [plain("bash")]
        });
        let tools = frozen_tools(cfg, &[facts]);
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "bash",
                "memory_read",
                "bash__ce37e948ffca",
                "memory_read__cefde19374ff",
                qualified_name(id, "wait").as_str(),
                "fs_read__3f799c3d7039",
                "ok"
            ]
        );
        for tool in &tools {
            assert!(provider_name_ok(&tool.name), "{} fits ^[a-zA-Z0-9_-]{{1,64}}$", tool.name);
        }
        let served: Vec<Option<&str>> = tools.iter().map(|t| t.route.as_ref().map(|r| r.tool_name.as_str())).collect();
        assert_eq!(served[2..], [Some("bash"), Some("memory_read"), Some("wait"), Some("fs.read"), Some("ok")]);
        assert_eq!(tools[2].resolve_call(&json!({})).wire_name, "bash", "the route keeps the served name");
    }

    #[test]
    fn r28_to_r30_assembly_refusals() {
        let id = RunnerId::new_v4();
        let other = RunnerId::new_v4();
        let cfg = config(json!({"runner_executor_public_ids": [id], "approval_mode": "bypass"}));
        let code = |r: Result<FrozenDeclaration, Refusal>| r.expect_err("refused").code.as_str();
        assert_eq!(
            code(freeze(&cfg, None, RunnerSelection::Named(other), &[runner(id, json!([]))], None)),
            "runner_not_declared"
        );
        let mut revoked = runner(id, json!([]));
        revoked.eligible = false;
        assert_eq!(code(freeze(&cfg, None, RunnerSelection::Named(id), &[revoked], None)), "runner_not_eligible");
        assert_eq!(
            code(freeze(
                &cfg,
                None,
                RunnerSelection::FirstEligible,
                &[runner(id, json!([visible("bash")]))],
                Some(&["nope".to_owned()])
            )),
            "tool_not_declared"
        );
        let routed = config(json!({"approval_mode": "bypass", "tool_definitions": [
            {"type":"function","function":{"name":"deploy"},"route":{"kind":"runner","runner_executor_public_id": id, "tool_name": "deploy"}}
        ]}));
        assert_eq!(
            code(freeze(&routed, None, RunnerSelection::FirstEligible, &[runner(id, json!([visible("bash")]))], None)),
            "tool_not_served"
        );
    }

    #[test]
    fn selection_first_eligible_named_and_none() {
        let gone = RunnerId::new_v4();
        let here = RunnerId::new_v4();
        let cfg = config(json!({"runner_executor_public_ids": [gone, here], "approval_mode": "bypass"}));
        let mut revoked = runner(gone, json!([visible("old")]));
        revoked.eligible = false;
        let runners = [revoked, runner(here, json!([visible("bash")]))];
        // The convenience default skips an ineligible first candidate.
        let frozen = freeze(&cfg, None, RunnerSelection::FirstEligible, &runners, None).expect("frozen");
        assert_eq!(frozen.default_runner_executor_public_id, Some(here));
        assert_eq!(frozen.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["bash"]);
        // An explicit null imports no Runner tools at all.
        let none = freeze(&cfg, None, RunnerSelection::NoRunner, &runners, None).expect("frozen");
        assert_eq!(none.default_runner_executor_public_id, None);
        assert!(none.tools.is_empty());
        assert_eq!(none.runner_candidates.len(), 2, "the candidates are still reported");
        // A named ineligible runner is refused, never replaced.
        let refused = freeze(&cfg, None, RunnerSelection::Named(gone), &runners, None).expect_err("refused");
        assert_eq!(refused.code, ErrorCode::RunnerNotEligible);
    }
}
