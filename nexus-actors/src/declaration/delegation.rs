//! `delegation_catalog` (`docs/declaration.md`, "Delegation catalog").
//!
//! Null (generic identity-based spawn) or an array of `{name, description, model_mode:
//! caller|default, declaration}`. Names are unique; `declaration` is a leaf in the inline
//! execution grammar (see [`super::validate_execution_declaration`]) that cannot hold another
//! catalog. The canonical entry carries the leaf's canonical declaration.

use std::collections::HashSet;

use serde_json::{Value, json};

use nexus_proto::Refusal;

use super::{ModelCheck, invalid, validate_inline};

/// The bound of a catalog entry's `name`, in bytes.
pub const CATALOG_NAME_BOUND: usize = 128;
/// The model modes of a catalog entry.
pub const MODEL_MODES: [&str; 2] = ["caller", "default"];

/// Validates `delegation_catalog` and returns its canonical form (null, or the entries with each
/// leaf declaration canonical).
///
/// # Errors
/// 422 `validation_failed` naming `field`, `field[i].key`, or a leaf's own field under
/// `field[i].declaration.`; prompt-document words for a leaf's documents.
pub(super) fn validate_catalog(
    value: Option<&Value>,
    field: &str,
    check_model: ModelCheck<'_>,
) -> Result<Value, Refusal> {
    let entries = match value {
        None | Some(Value::Null) => return Ok(Value::Null),
        Some(Value::Array(entries)) => entries,
        Some(_) => return Err(invalid(field, "must be null or an array of catalog entries")),
    };
    let mut names = HashSet::new();
    let mut canonical = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let Some(entry) = entry.as_object() else {
            return Err(invalid(&at, "must be an object {name, description, model_mode, declaration}"));
        };
        if let Some(key) =
            entry.keys().find(|k| !matches!(k.as_str(), "name" | "description" | "model_mode" | "declaration"))
        {
            return Err(invalid(
                &format!("{at}.{key}"),
                "unknown key; an entry takes name, description, model_mode and declaration",
            ));
        }
        let name = entry.get("name").and_then(Value::as_str);
        let Some(name) = name.filter(|n| !n.is_empty() && n.len() <= CATALOG_NAME_BOUND && !n.contains('\0')) else {
            return Err(invalid(&format!("{at}.name"), "is required: a string of 1 to 128 bytes without NUL"));
        };
        if !names.insert(name) {
            return Err(invalid(&format!("{at}.name"), format!("{name} is listed twice; names are unique")));
        }
        let Some(description) = entry.get("description").and_then(Value::as_str) else {
            return Err(invalid(&format!("{at}.description"), "is required: the parent-facing description string"));
        };
        let mode = entry.get("model_mode").and_then(Value::as_str);
        let Some(mode) = mode.filter(|m| MODEL_MODES.contains(m)) else {
            return Err(invalid(&format!("{at}.model_mode"), "is required and must be caller or default"));
        };
        let declaration_field = format!("{at}.declaration");
        let Some(declaration) = entry.get("declaration").and_then(Value::as_object) else {
            return Err(invalid(&declaration_field, "is required: a leaf execution declaration object"));
        };
        if declaration.get("delegation_catalog").is_some_and(|c| !c.is_null()) {
            return Err(invalid(
                &format!("{declaration_field}.delegation_catalog"),
                "a leaf cannot contain another catalog; the parent's is carried to children",
            ));
        }
        let leaf = validate_inline(declaration, &declaration_field, check_model, true)?;
        let mut leaf_json = leaf.configuration;
        if let Some(object) = leaf_json.as_object_mut() {
            object.insert("system_prompt".into(), leaf.system_prompt.unwrap_or(Value::Null));
            object.insert("summarizer".into(), leaf.summarizer.unwrap_or(Value::Null));
        }
        canonical.push(json!({"name": name, "description": description, "model_mode": mode, "declaration": leaf_json}));
    }
    Ok(Value::Array(canonical))
}
