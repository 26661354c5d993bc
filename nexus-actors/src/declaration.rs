//! The declaration grammar, tool assembly, freezing and the provider wire projection.
//!
//! Pure code with no I/O (DESIGN.md, "Layout"). The standing declaration is validated here on
//! `PUT /agent_api/v1/profile/configuration` (spec/REFERENCE.md 3 and 4); at materialization an
//! execution assembles its tool set from it and freezes the result (REFERENCE.md 4, "Acceptance
//! import", and 8).
//!
//! This is the foundation's part of the grammar: tool definitions (plain and runner-routed),
//! `kernel_tools`, the runner fields, `approval_mode`, `default_model` and `fallback_models`,
//! `prompt_mechanism`, and prompt documents. Fields whose grammar is not yet enforced are stored
//! as authored.

pub mod tools;

use serde_json::{Map, Value, json};

use nexus_proto::{ErrorCode, Refusal};

pub use self::tools::{
    Assembly, DEFAULT_TIMEOUT_MS, FrozenDeclaration, FrozenTool, RunnerFacts, RunnerRoute, TOOL_DEFINITIONS_BOUND,
    assemble, entry_name, freeze, narrow, qualified_name, wire_projection,
};
use self::tools::{canonical_tool_definitions, validate_kernel_tools, validate_runner_ids, validate_runner_tool_names};

/// The envelope bound of the smaller structured fields, in bytes.
pub const ENVELOPE_BOUND: usize = 65_536;
/// The bound of one prompt document, in bytes.
pub const PROMPT_DOCUMENT_BOUND: usize = 65_536;
/// The bound of one `fallback_models` entry, in characters.
pub const FALLBACK_MODEL_BOUND: usize = 193;

/// The fields of the standing configuration, in storage order. Unknown fields are ignored.
pub const CONFIGURATION_FIELDS: [&str; 17] = [
    "tool_definitions",
    "kernel_tools",
    "runner_executor_public_ids",
    "runner_tool_names",
    "approval_mode",
    "approval_rules",
    "prompt_mechanism",
    "prompt_template",
    "compaction_policy",
    "lifecycle_hooks",
    "default_model",
    "fallback_models",
    "memory_context_limit",
    "conversation_reach",
    "delegation_catalog",
    "variables",
    "model_defaults",
];

pub(crate) fn invalid(field: &str, detail: impl std::fmt::Display) -> Refusal {
    Refusal::new(ErrorCode::ValidationFailed, format!("{field}: {detail}"))
}

/// Resolves a model reference at declaration time: `Ok` or the resolver's word and a message.
pub type ModelCheck<'a> = &'a dyn Fn(&str) -> Result<(), (String, String)>;

/// A validated PUT: the canonical configuration and both prompt-document slots.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidatedProfile {
    /// The canonical configuration object, with every known field present (null when omitted).
    pub configuration: Value,
    /// `{content, role}` or `None` (cleared).
    pub system_prompt: Option<Value>,
    /// `{content, role:"system"}` or `None` (cleared).
    pub summarizer: Option<Value>,
}

/// Validates the body of `PUT /agent_api/v1/profile/configuration`:
/// `{configuration:{...}, prompt_documents?:{system_prompt?, summarizer?}}`.
///
/// # Errors
/// 400 `parameter_missing` for a bad root or slot shape; 422 `prompt_document_invalid` or
/// `prompt_document_too_large` for a slot; 422 `validation_failed` naming the field otherwise.
pub fn validate_profile_put(body: &Value, check_model: ModelCheck<'_>) -> Result<ValidatedProfile, Refusal> {
    let Some(configuration) = body.get("configuration").and_then(Value::as_object) else {
        return Err(Refusal::new(ErrorCode::ParameterMissing, "`configuration` is required and must be an object"));
    };
    let (system_prompt, summarizer) = match body.get("prompt_documents") {
        None | Some(Value::Null) => (None, None),
        Some(Value::Object(slots)) => (
            slot(slots.get("system_prompt"), "system_prompt", false)?,
            slot(slots.get("summarizer"), "summarizer", true)?,
        ),
        Some(_) => return Err(Refusal::new(ErrorCode::ParameterMissing, "`prompt_documents` must be an object")),
    };
    let configuration = validate_configuration(configuration, check_model)?;
    Ok(ValidatedProfile { configuration, system_prompt, summarizer })
}

fn slot(value: Option<&Value>, name: &str, system_only: bool) -> Result<Option<Value>, Refusal> {
    let slot = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(slot)) => slot,
        Some(_) => {
            return Err(Refusal::new(
                ErrorCode::ParameterMissing,
                format!("prompt_documents.{name} must be an object"),
            ));
        }
    };
    let Some(content) = slot.get("content").and_then(Value::as_str) else {
        return Err(Refusal::new(
            ErrorCode::PromptDocumentInvalid,
            format!("prompt_documents.{name}.content is required and must be a string"),
        ));
    };
    if content.len() > PROMPT_DOCUMENT_BOUND {
        return Err(Refusal::new(
            ErrorCode::PromptDocumentTooLarge,
            format!("prompt_documents.{name} is over 65536 bytes"),
        ));
    }
    let role = match slot.get("role") {
        None | Some(Value::Null) => "system",
        Some(Value::String(role)) if role == "system" || (!system_only && role == "developer") => role.as_str(),
        Some(_) => {
            let allowed = if system_only { "system" } else { "system or developer" };
            return Err(Refusal::new(
                ErrorCode::PromptDocumentInvalid,
                format!("prompt_documents.{name}.role must be {allowed}"),
            ));
        }
    };
    Ok(Some(json!({"content": content, "role": role})))
}

/// Validates a configuration object and returns its canonical form.
///
/// # Errors
/// 422 `validation_failed` whose message names the field (and the refusal word, where the
/// grammar has one).
pub fn validate_configuration(
    configuration: &Map<String, Value>,
    check_model: ModelCheck<'_>,
) -> Result<Value, Refusal> {
    let mut out = Map::new();
    for field in CONFIGURATION_FIELDS {
        out.insert(field.to_owned(), configuration.get(field).cloned().unwrap_or(Value::Null));
    }
    let tool_definitions = canonical_tool_definitions(configuration.get("tool_definitions"))?;
    out.insert("tool_definitions".into(), tool_definitions.clone());
    validate_kernel_tools(configuration.get("kernel_tools"))?;
    validate_runner_ids(configuration.get("runner_executor_public_ids"))?;
    validate_runner_tool_names(configuration.get("runner_tool_names"))?;
    validate_approval_mode(&out, &tool_definitions)?;
    if let Some(mechanism) = configuration.get("prompt_mechanism").filter(|v| !v.is_null())
        && !matches!(mechanism.as_str(), Some("raw" | "assembly" | "default"))
    {
        return Err(invalid("configuration.prompt_mechanism", "must be raw, assembly or default"));
    }
    if let Some(model) = configuration.get("default_model").filter(|v| !v.is_null()) {
        let Some(reference) = model.as_str() else {
            return Err(invalid("configuration.default_model", "unknown_model: must be a provider/model string"));
        };
        check_model(reference)
            .map_err(|(word, message)| invalid("configuration.default_model", format!("{word}: {message}")))?;
    }
    validate_fallback_models(configuration.get("fallback_models"), check_model)?;
    Ok(Value::Object(out))
}

fn non_empty_array(value: Option<&Value>) -> bool {
    value.and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

fn validate_approval_mode(configuration: &Map<String, Value>, tool_definitions: &Value) -> Result<(), Refusal> {
    const FIELD: &str = "configuration.approval_mode";
    match configuration.get("approval_mode") {
        Some(Value::Null) | None => {
            let runner_imports = non_empty_array(configuration.get("runner_executor_public_ids"))
                && configuration.get("runner_tool_names").and_then(Value::as_array).is_none_or(|n| !n.is_empty());
            let needs = non_empty_array(Some(tool_definitions))
                || non_empty_array(configuration.get("kernel_tools"))
                || configuration.get("lifecycle_hooks").is_some_and(|h| !h.is_null())
                || runner_imports;
            if needs {
                return Err(invalid(
                    FIELD,
                    "is required when the profile declares tools, kernel tools, hooks or runner imports",
                ));
            }
            Ok(())
        }
        Some(Value::String(mode)) if matches!(mode.as_str(), "bypass" | "ask" | "rules") => Ok(()),
        Some(_) => Err(invalid(FIELD, "must be bypass, ask or rules")),
    }
}

fn validate_fallback_models(value: Option<&Value>, check_model: ModelCheck<'_>) -> Result<(), Refusal> {
    const FIELD: &str = "configuration.fallback_models";
    let models = match value {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(models)) => models,
        Some(_) => return Err(invalid(FIELD, "must be an array of provider/model references")),
    };
    if Value::Array(models.clone()).to_string().len() > ENVELOPE_BOUND {
        return Err(invalid(FIELD, "the fallback list is over its bound of 65536 bytes"));
    }
    for (i, model) in models.iter().enumerate() {
        let Some(reference) = model.as_str() else {
            return Err(invalid(&format!("{FIELD}[{i}]"), "must be a provider/model string"));
        };
        if reference.chars().count() > FALLBACK_MODEL_BOUND {
            return Err(invalid(&format!("{FIELD}[{i}]"), "is over 193 characters"));
        }
        check_model(reference)
            .map_err(|(word, message)| invalid(&format!("{FIELD}[{i}]"), format!("{word}: {message}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    fn accept_all(_: &str) -> Result<(), (String, String)> {
        Ok(())
    }

    fn config(value: Value) -> Value {
        validate_configuration(value.as_object().expect("object"), &accept_all).expect("valid")
    }

    #[test]
    fn prompt_document_slots() {
        let put =
            |docs: Value| validate_profile_put(&json!({"configuration": {}, "prompt_documents": docs}), &accept_all);
        assert_eq!(put(json!({"system_prompt": {}})).expect_err("refused").code, "prompt_document_invalid");
        assert_eq!(put(json!({"system_prompt": 3})).expect_err("refused").code, "parameter_missing");
        assert_eq!(
            put(json!({"system_prompt": {"content": "x".repeat(PROMPT_DOCUMENT_BOUND + 1)}}))
                .expect_err("refused")
                .code,
            "prompt_document_too_large"
        );
        assert_eq!(
            put(json!({"summarizer": {"content": "s", "role": "developer"}})).expect_err("refused").code,
            "prompt_document_invalid"
        );
        let ok = put(json!({"system_prompt": {"content": "be brief"}})).expect("valid");
        assert_eq!(ok.system_prompt, Some(json!({"content": "be brief", "role": "system"})));
        assert_eq!(
            validate_profile_put(&json!({"configuration": []}), &accept_all).expect_err("refused").code,
            "parameter_missing"
        );
    }
    #[test]
    fn configuration_refusals_name_the_field() {
        let cases = [
            (json!({"approval_mode": "sometimes"}), "configuration.approval_mode"),
            (json!({"runner_executor_public_ids": ["not-a-uuid"]}), "configuration.runner_executor_public_ids"),
            (json!({"kernel_tools": ["ask"]}), "configuration.kernel_tools"),
            (json!({"runner_tool_names": [""]}), "configuration.runner_tool_names"),
            (
                json!({"approval_mode": "bypass", "tool_definitions": [
                {"type":"function","function":{"name":"a"}}, {"type":"function","name":"a"}]}),
                "configuration.tool_definitions[1]",
            ),
            (
                json!({"approval_mode": "bypass", "tool_definitions": [
                {"type":"function","function":{"name":"a"},"route":{"kind":"runner"}}]}),
                "configuration.tool_definitions[0].route",
            ),
            (json!({"fallback_models": ["p/".to_owned() + &"m".repeat(200)]}), "configuration.fallback_models[0]"),
        ];
        for (cfg, field) in cases {
            let refusal = validate_configuration(cfg.as_object().expect("object"), &accept_all).expect_err("refused");
            assert_eq!(refusal.code, "validation_failed");
            assert!(refusal.message.starts_with(field), "{} should name {field}", refusal.message);
        }
        let refuse_model = |_: &str| Err(("unknown_provider".to_owned(), "no such provider".to_owned()));
        let refusal =
            validate_configuration(json!({"default_model": "x/y"}).as_object().expect("object"), &refuse_model)
                .expect_err("refused");
        assert!(refusal.message.contains("unknown_provider"));
    }

    #[test]
    fn approval_mode_required_for_runner_imports() {
        let id = Uuid::new_v4();
        let refused = validate_configuration(
            json!({"runner_executor_public_ids": [id]}).as_object().expect("object"),
            &accept_all,
        )
        .expect_err("refused");
        assert_eq!(refused.code, "validation_failed");
        assert!(refused.message.starts_with("configuration.approval_mode"));
        // runner_tool_names [] imports nothing, so no mode is needed.
        config(json!({"runner_executor_public_ids": [id], "runner_tool_names": []}));
    }
}
