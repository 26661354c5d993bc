//! The grammar of `tool_definitions`, `kernel_tools` and the runner fields: validation and the
//! canonical form (`docs/declaration.md`, "Tool definitions").

use std::collections::HashSet;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value, json};

use nexus_kernel_tools::{KernelTool, Spellings, canonicalize_alias, is_alias, lookup as kernel_lookup, served};
use nexus_proto::Refusal;

use crate::declaration::invalid;

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

pub(in crate::declaration) fn canonical_tool_definitions(value: Option<&Value>) -> Result<Value, Refusal> {
    canonical_tool_definitions_at("configuration.tool_definitions", value)
}

/// Whether a callable name fits every provider's rule `^[a-zA-Z0-9_-]{1,64}$`
/// (`docs/declaration.md`, "Tool definitions").
pub fn provider_name_ok(name: &str) -> bool {
    PROVIDER_NAME_RE.is_match(name)
}

/// Validates a `tool_definitions` list and returns its canonical stored form
/// (`docs/declaration.md`, "Refusal order" and "Tool definitions"). `field` names the list in
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

pub(in crate::declaration) fn validate_kernel_tools(value: Option<&Value>) -> Result<(), Refusal> {
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

/// The kernel canonical name a `tool_definitions` entry declares, if it declares one: an alias's
/// `canonical`, or a plain (unrouted) entry on a kernel name in either spelling.
fn declared_canonical(entry: &Value) -> Option<&str> {
    if is_alias(entry) {
        return entry.get("canonical").and_then(Value::as_str);
    }
    if entry.get("route").is_some() {
        return None;
    }
    entry_name(entry).and_then(kernel_lookup).map(|tool| tool.canonical_name)
}

/// Refuses a declared kernel tool this server does not run (`docs/kernel-tools.md`, "What runs"):
/// a plain or compact entry, an alias whose canonical is not served, or a `kernel_tools` import.
/// Runs after the grammar of both lists (their own words come first), on the lists as written,
/// so the index is the author's.
///
/// # Errors
/// 422 `validation_failed` whose message is `configuration.tool_definitions[i]:
/// kernel_tool_unavailable: ...` or `configuration.kernel_tools[i]: kernel_tool_unavailable: ...`.
pub(in crate::declaration) fn refuse_unserved(
    tool_definitions: Option<&Value>,
    kernel_tools: Option<&Value>,
) -> Result<(), Refusal> {
    let unavailable = |field: String, canonical: &str| {
        invalid(
            &field,
            format!(
                "kernel_tool_unavailable: {canonical} is in the kernel catalog but this server does not run it \
                 yet; it arrives with delegation (delegate_task, wait, spawn, send, status, cancel): remove it \
                 from the declaration"
            ),
        )
    };
    for (i, entry) in tool_definitions.and_then(Value::as_array).into_iter().flatten().enumerate() {
        if let Some(canonical) = declared_canonical(entry)
            && !served(canonical)
        {
            return Err(unavailable(format!("configuration.tool_definitions[{i}]"), canonical));
        }
    }
    for (i, canonical) in kernel_tools.and_then(Value::as_array).into_iter().flatten().enumerate() {
        if let Some(canonical) = canonical.as_str()
            && !served(canonical)
        {
            return Err(unavailable(format!("configuration.kernel_tools[{i}]"), canonical));
        }
    }
    Ok(())
}

pub(in crate::declaration) fn validate_runner_ids(value: Option<&Value>) -> Result<(), Refusal> {
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

pub(in crate::declaration) fn validate_runner_tool_names(value: Option<&Value>) -> Result<(), Refusal> {
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
