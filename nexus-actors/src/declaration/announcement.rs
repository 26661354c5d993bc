//! Validation and canonical storage of a runner's announcement (`docs/protocol.md`, "Announce").
//!
//! Pure code. The announcement is a whole replacement of `{tools, environment, documents}`.

use std::collections::HashSet;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value, json};

use nexus_kernel_tools::{EffectProfile, reserved_namespace_of};
use nexus_proto::{ErrorCode, Refusal};

use crate::clock::TIMEOUT_BOUND_MS;

/// Tool names an executor may announce: `\A[a-zA-Z0-9_-]{1,64}\z`.
static TOOL_NAME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[a-zA-Z0-9_-]{1,64}$").expect("static regex"));
/// Document names follow the skill grammar.
static DOCUMENT_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9](?:-?[a-z0-9])*$").expect("static regex"));

/// The bound of the canonical tool list, in bytes (`tool_definitions_bound`).
pub const TOOLS_BOUND: usize = 1_048_576;
/// The bound of the environment object, in bytes (`executor_environment_bound`).
pub const ENVIRONMENT_BOUND: usize = 65_536;
/// The bound of a document description, in bytes.
pub const DOCUMENT_DESCRIPTION_BOUND: usize = 1024;

fn defect(path: &str, reason: &str) -> Refusal {
    Refusal::new(ErrorCode::InvalidAnnouncement, format!("{path}: {reason}"))
}

/// Validates an announcement body and returns its canonical form: tools sorted by name, unknown
/// keys dropped, each effect profile with exactly its five keys; `environment` defaults to `{}`
/// and `documents` to `[]`.
///
/// # Errors
/// - 400 `parameter_missing` when `tools` is absent;
/// - 422 `reserved_namespace` for a name in a reserved kernel namespace (either spelling);
/// - 422 `invalid_announcement` naming `tools[i].field` or `documents[i].field`;
/// - 422 `validation_failed` when the tool list or the environment is over its bound.
pub fn validate(body: &Value) -> Result<Value, Refusal> {
    let Some(root) = body.as_object() else {
        return Err(Refusal::new(ErrorCode::ParameterMissing, "the announcement must be a JSON object with `tools`"));
    };
    let Some(tools) = root.get("tools") else {
        return Err(Refusal::new(ErrorCode::ParameterMissing, "`tools` is required (send [] to clear the list)"));
    };
    let Some(tools) = tools.as_array() else {
        return Err(defect("tools", "must be an array"));
    };
    let mut seen = HashSet::new();
    let mut canonical_tools = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let entry = validate_tool(i, tool, &mut seen)?;
        canonical_tools.push(entry);
    }
    canonical_tools.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let tools_value = Value::Array(canonical_tools);
    if tools_value.to_string().len() > TOOLS_BOUND {
        return Err(Refusal::new(ErrorCode::ValidationFailed, "tools: the list is over its bound of 1048576 bytes"));
    }

    let environment = match root.get("environment") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(o)) => Value::Object(o.clone()),
        Some(_) => return Err(defect("environment", "must be an object")),
    };
    if environment.to_string().len() > ENVIRONMENT_BOUND {
        return Err(Refusal::new(
            ErrorCode::ValidationFailed,
            "environment: the object is over its bound of 65536 bytes",
        ));
    }

    let documents = validate_documents(root.get("documents"), &seen)?;
    Ok(json!({"tools": tools_value, "environment": environment, "documents": documents}))
}

/// Parses a runner's `Announce.body_json` and validates it ([`validate`]): what the executor
/// runs on every announce frame.
///
/// # Errors
/// 400 `parameter_missing` when the text is not JSON; otherwise as [`validate`].
pub fn validate_json(body_json: &str) -> Result<Value, Refusal> {
    let body: Value = crate::json::parse_str(body_json).map_err(|fault| match fault {
        crate::json::JsonFault::Syntax(e) => {
            Refusal::new(ErrorCode::ParameterMissing, format!("the announcement is not JSON: {e}"))
        }
        // A key named twice is a defect of the announcement, refused rather than guessed at.
        duplicate => {
            Refusal::new(ErrorCode::InvalidAnnouncement, format!("the announcement is ambiguous: {duplicate}"))
        }
    })?;
    validate(&body)
}

fn validate_tool(i: usize, tool: &Value, seen: &mut HashSet<String>) -> Result<Value, Refusal> {
    let path = format!("tools[{i}]");
    let Some(tool) = tool.as_object() else {
        return Err(defect(&path, "must be an object"));
    };
    let Some(name) = tool.get("name").and_then(Value::as_str) else {
        return Err(defect(&format!("{path}.name"), "is required and must be a string"));
    };
    // Kernel names are classified before the format check, so a dotted reserved spelling gets
    // its own word rather than a format defect.
    if let Some(namespace) = reserved_namespace_of(name) {
        return Err(Refusal::new(
            ErrorCode::ReservedNamespace,
            format!("{path}.name: {name} is in the reserved namespace {namespace}; rename the tool"),
        ));
    }
    if !TOOL_NAME.is_match(name) {
        return Err(defect(&format!("{path}.name"), "must match ^[a-zA-Z0-9_-]{1,64}$"));
    }
    if !seen.insert(name.to_owned()) {
        return Err(defect(&format!("{path}.name"), "is announced twice"));
    }
    let profile = match tool.get("effect_profile") {
        None => return Err(defect(&format!("{path}.effect_profile"), "is required")),
        Some(value) => EffectProfile::from_json(value).map_err(|e| {
            let field = e.field.map(|f| format!(".{f}")).unwrap_or_default();
            defect(&format!("{path}.effect_profile{field}"), &e.reason)
        })?,
    };
    let mut entry = Map::new();
    entry.insert("name".into(), json!(name));
    entry.insert("effect_profile".into(), profile.to_json());
    match tool.get("timeout_ms") {
        None | Some(Value::Null) => {}
        // Bounded here, so no deadline computed from it can overflow or reach the frozen range
        // (`docs/protocol.md`, "Announce").
        Some(value) => match value.as_u64().filter(|ms| (1..=TIMEOUT_BOUND_MS).contains(ms)) {
            Some(ms) => {
                entry.insert("timeout_ms".into(), json!(ms));
            }
            None => {
                return Err(defect(
                    &format!("{path}.timeout_ms"),
                    &format!("must be a positive integer of milliseconds, at most {TIMEOUT_BOUND_MS} (7 days)"),
                ));
            }
        },
    }
    match tool.get("description") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if !s.is_empty() => {
            entry.insert("description".into(), json!(s));
        }
        Some(_) => return Err(defect(&format!("{path}.description"), "must be a non-empty string")),
    }
    match tool.get("input_schema") {
        None | Some(Value::Null) => {}
        Some(Value::Object(schema)) if schema.get("type") == Some(&json!("object")) => {
            entry.insert("input_schema".into(), Value::Object(schema.clone()));
        }
        Some(_) => {
            return Err(defect(&format!("{path}.input_schema"), "must be an object with \"type\": \"object\""));
        }
    }
    Ok(Value::Object(entry))
}

fn validate_documents(documents: Option<&Value>, tool_names: &HashSet<String>) -> Result<Value, Refusal> {
    let documents = match documents {
        None | Some(Value::Null) => return Ok(json!([])),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(defect("documents", "must be an array")),
    };
    let mut out = Vec::with_capacity(documents.len());
    let mut names = HashSet::new();
    for (i, document) in documents.iter().enumerate() {
        let path = format!("documents[{i}]");
        let Some(document) = document.as_object() else {
            return Err(defect(&path, "must be an object"));
        };
        let name = document.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.len() > 64 || !DOCUMENT_NAME.is_match(name) {
            return Err(defect(
                &format!("{path}.name"),
                "must match ^[a-z0-9](?:-?[a-z0-9])*$ with at most 64 characters",
            ));
        }
        if !names.insert(name.to_owned()) {
            return Err(defect(&format!("{path}.name"), "is announced twice"));
        }
        let description = document.get("description").and_then(Value::as_str).unwrap_or_default();
        if description.is_empty() || description.len() > DOCUMENT_DESCRIPTION_BOUND {
            return Err(defect(&format!("{path}.description"), "must be a non-empty string of at most 1024 bytes"));
        }
        out.push(json!({"name": name, "description": description}));
    }
    if !out.is_empty() && !tool_names.contains("skill") {
        return Err(defect("documents", "an executor that announces documents must also announce `skill`"));
    }
    out.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Ok(Value::Array(out))
}

/// Whether an announced entry is visible to models: it has both `description` and `input_schema`.
pub fn is_model_visible(entry: &Value) -> bool {
    entry.get("description").is_some() && entry.get("input_schema").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Value {
        json!({"kind":"read_only","destructive":false,"effect_scope":"closed","idempotency":"intrinsic","reconciliation":"none"})
    }

    fn code(body: Value) -> String {
        validate(&body).expect_err("refused").code.as_str().to_owned()
    }

    #[test]
    fn canonical_form_sorts_and_drops_unknown_keys() {
        let body = json!({"tools": [
            {"name": "zeta", "effect_profile": profile(), "extra": 1},
            {"name": "alpha", "effect_profile": profile(), "description": "A", "input_schema": {"type": "object"}, "timeout_ms": 5}
        ]});
        let out = validate(&body).expect("valid");
        assert_eq!(out["tools"][0]["name"], "alpha");
        assert_eq!(out["tools"][1], json!({"name": "zeta", "effect_profile": profile()}));
        assert_eq!(out["environment"], json!({}));
        assert!(is_model_visible(&out["tools"][0]));
        assert!(!is_model_visible(&out["tools"][1]));
    }

    #[test]
    fn refusal_words() {
        assert_eq!(code(json!({})), "parameter_missing");
        assert_eq!(
            code(json!({"tools": [{"name": "delegate_task", "effect_profile": profile()}]})),
            "reserved_namespace"
        );
        assert_eq!(
            code(json!({"tools": [{"name": "nexus.graph.wait", "effect_profile": profile()}]})),
            "reserved_namespace"
        );
        assert_eq!(
            code(json!({"tools": [{"name": "has space", "effect_profile": profile()}]})),
            "invalid_announcement"
        );
        assert_eq!(code(json!({"tools": [{"name": "a"}]})), "invalid_announcement");
        assert_eq!(
            code(
                json!({"tools": [{"name": "a", "effect_profile": profile()}, {"name": "a", "effect_profile": profile()}]})
            ),
            "invalid_announcement"
        );
        for timeout in [json!(0), json!(-1), json!(1.5), json!(TIMEOUT_BOUND_MS + 1), json!(u64::MAX)] {
            let announced = json!({"tools": [{"name": "a", "effect_profile": profile()}, {"name": "b",
                                   "effect_profile": profile(), "timeout_ms": timeout}]});
            let refusal = validate(&announced).expect_err("refused");
            assert_eq!(refusal.code, ErrorCode::InvalidAnnouncement, "{timeout}");
            assert!(
                refusal.message.contains("tools[1].timeout_ms"),
                "the refusal names the field: {}",
                refusal.message
            );
        }
        let longest = json!({"tools": [{"name": "a", "effect_profile": profile(), "timeout_ms": TIMEOUT_BOUND_MS}]});
        assert!(validate(&longest).is_ok(), "the bound itself is accepted");
        assert_eq!(
            code(json!({"tools": [], "environment": {"blob": "x".repeat(ENVIRONMENT_BOUND)}})),
            "validation_failed"
        );
        assert_eq!(
            code(json!({"tools": [], "documents": [{"name": "guide", "description": "d"}]})),
            "invalid_announcement"
        );
    }

    #[test]
    fn defects_name_the_field_path() {
        let mut bad = profile();
        bad["kind"] = json!("teleport");
        let refusal = validate(
            &json!({"tools": [{"name": "ok", "effect_profile": profile()}, {"name": "b", "effect_profile": bad}]}),
        )
        .expect_err("refused");
        assert!(refusal.message.starts_with("tools[1].effect_profile.kind"), "{}", refusal.message);
        let refusal = validate(
            &json!({"tools": [{"name": "b", "effect_profile": profile(), "input_schema": {"type": "array"}}]}),
        )
        .expect_err("refused");
        assert!(refusal.message.starts_with("tools[0].input_schema"), "{}", refusal.message);
    }

    #[test]
    fn memory_wire_names_and_skill_are_admitted() {
        let body = json!({"tools": [
            {"name": "memory_read", "effect_profile": profile()},
            {"name": "skill", "effect_profile": profile()}
        ], "documents": [{"name": "deploy-guide", "description": "How to deploy"}]});
        let out = validate(&body).expect("valid");
        assert_eq!(out["documents"][0]["name"], "deploy-guide");
    }
}
