//! The declaration grammar, tool assembly, freezing and the provider wire projection.
//!
//! Pure code with no I/O (`docs/architecture.md`, "Server modules"). The standing declaration is
//! validated here on `PUT /agent_api/v1/profile/configuration` (`docs/declaration.md`,
//! "Whole replacement") and the inline `execution_declaration` on the input doors
//! (`docs/declaration.md`, "Inline declarations"); at materialization an execution assembles its
//! tool set from it and freezes the result (`docs/executions.md`, "Materialization";
//! `docs/declaration.md`, "Freezing").
//!
//! Every field has its grammar: the tool list in [`tools`]; `approval_mode` and `approval_rules`
//! (with the pure approval evaluator) in [`approval`]; `prompt_mechanism`, `prompt_template` and
//! macros in [`template`]; the prompt documents in [`documents`]; `compaction_policy` in
//! [`compaction`]; `lifecycle_hooks` in [`hooks`]; `memory_context_limit` and
//! `conversation_reach` in [`memory`]; `delegation_catalog` in [`delegation`]; `default_model` and
//! `fallback_models` here. A refusal's message starts with the field's path
//! (`configuration.<field>`, `execution_declaration.<field>`, `prompt_documents.<slot>`).

pub mod announcement;
pub mod approval;
pub mod compaction;
pub mod delegation;
pub mod documents;
pub mod hooks;
pub mod memory;
pub mod template;
pub mod tools;

use serde_json::{Map, Value, json};

use nexus_proto::{ErrorCode, Refusal};

pub use self::tools::{
    Assembly, DEFAULT_TIMEOUT_MS, Eligibility, FrozenDeclaration, FrozenSkill, FrozenTool, RunnerFacts, RunnerRoute,
    TOOL_DEFINITIONS_BOUND, assemble, entry_name, freeze, narrow, qualified_name, wire_projection,
};
use self::tools::{
    canonical_tool_definitions, refuse_unserved, validate_kernel_tools, validate_runner_ids, validate_runner_tool_names,
};

pub use self::approval::{ApprovalMode, CallOrigin, Decision, GrantOrigin, RuleMatch, Verdict, decide, evaluate};
pub use self::documents::PromptSlot;
use self::documents::document;
use self::template::configuration_variables;

/// The envelope bound of the smaller structured fields (`approval_rules`, `prompt_template`,
/// `compaction_policy`, `lifecycle_hooks`, `fallback_models`), in bytes of JSON.
pub const ENVELOPE_BOUND: usize = 65_536;
/// The bound of one prompt document's content, in bytes (`prompt_document_bound`).
pub const PROMPT_DOCUMENT_BOUND: usize = 65_536;
/// The bound of one `fallback_models` entry, in characters.
pub const FALLBACK_MODEL_BOUND: usize = 193;

/// The fields of the standing configuration, in storage order. Unknown fields are ignored.
/// The inline `execution_declaration` carries the same fields without a wrapper.
pub const CONFIGURATION_FIELDS: [&str; 15] = [
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
];

pub(crate) fn invalid(field: &str, detail: impl std::fmt::Display) -> Refusal {
    Refusal::new(ErrorCode::ValidationFailed, format!("{field}: {detail}"))
}

/// Resolves a model reference at declaration time: `Ok` or the resolver's word and a message.
pub type ModelCheck<'a> = &'a dyn Fn(&str) -> Result<(), (String, String)>;

/// Checks a door body: empty (`null`) or a JSON object that names only `known` fields. Every
/// door that takes a body checks it here, on both transports: a misspelled field is refused
/// rather than ignored, because ignoring it silently changes what the door does (a stop with
/// `{"forse": false}` would be a forced one).
///
/// # Errors
/// 400 `parameter_missing` for a body that is not an object (one word with every other door's
/// "not an object": `docs/protocol.md`, "Refusals"); 400 `parameter_invalid` for a field outside
/// `known`.
pub fn known_fields(body: &Value, known: &[&str]) -> Result<(), Refusal> {
    let fields = match body {
        Value::Null => return Ok(()),
        Value::Object(fields) => fields,
        _ => return Err(Refusal::new(ErrorCode::ParameterMissing, "the body must be a JSON object")),
    };
    let Some(unknown) = fields.keys().find(|key| !known.contains(&key.as_str())) else {
        return Ok(());
    };
    let takes = if known.is_empty() { "no fields".to_owned() } else { known.join(", ") };
    Err(Refusal::new(
        ErrorCode::ParameterInvalid,
        format!("unknown field {:?}; this door takes {takes}", crate::json::echo(unknown)),
    ))
}

/// A validated declaration: the canonical configuration and both prompt-document slots.
///
/// Returned by [`validate_profile_put`] and [`validate_execution_declaration`].
#[derive(Clone, Debug, PartialEq)]
pub struct ValidatedProfile {
    /// The canonical configuration object, with every field of [`CONFIGURATION_FIELDS`] present
    /// (null when omitted; `[]` for `tool_definitions`, `kernel_tools` and
    /// `runner_executor_public_ids`).
    pub configuration: Value,
    /// `{content, role}` or `None` (cleared).
    pub system_prompt: Option<Value>,
    /// `{content, role:"system"}` or `None` (cleared).
    pub summarizer: Option<Value>,
}

/// Validates the body of `PUT /agent_api/v1/profile/configuration`:
/// `{configuration:{...}, prompt_documents?:{system_prompt?, summarizer?}}`.
///
/// Validation is total before it returns: the caller writes only on `Ok`, so a refusal changes
/// nothing. The documents are checked against the variables of the template in this same body, so a
/// variable can be renamed in one PUT (`docs/declaration.md`, "Whole replacement").
///
/// # Errors
/// 400 `parameter_missing` for a bad root or slot shape; 422 `validation_failed` naming the field
/// (`configuration.<field>…`); 422 `prompt_document_invalid`, `prompt_document_too_large` or
/// `prompt_document_macro_unknown` for a document (`prompt_documents.<slot>…`).
pub fn validate_profile_put(body: &Value, check_model: ModelCheck<'_>) -> Result<ValidatedProfile, Refusal> {
    let Some(configuration) = body.get("configuration").and_then(Value::as_object) else {
        return Err(Refusal::new(ErrorCode::ParameterMissing, "`configuration` is required and must be an object"));
    };
    let slots = match body.get("prompt_documents") {
        None | Some(Value::Null) => None,
        Some(Value::Object(slots)) => Some(slots),
        Some(_) => return Err(Refusal::new(ErrorCode::ParameterMissing, "`prompt_documents` must be an object")),
    };
    let mut shaped = Vec::with_capacity(PromptSlot::ALL.len());
    for (name, system_only) in PromptSlot::ALL.iter().map(|slot| (slot.as_str(), slot.system_only())) {
        match slots.and_then(|s| s.get(name)) {
            None | Some(Value::Null) => shaped.push(None),
            Some(Value::Object(slot)) => shaped.push(Some((name, system_only, slot))),
            Some(_) => {
                return Err(Refusal::new(
                    ErrorCode::ParameterMissing,
                    format!("prompt_documents.{name} must be an object {{content, role?}} or null"),
                ));
            }
        }
    }
    // A budget belongs to one input or inline declaration, never to the standing profile
    // (`docs/executions.md`, "Budgets").
    if configuration.contains_key("budget") {
        return Err(invalid(
            "configuration.budget",
            "the standing profile takes no budget; give one per input (`budget`) or in an inline execution_declaration",
        ));
    }
    let (configuration, variables) = validate_fields(configuration, "configuration", check_model, false)?;
    let mut documents = Vec::with_capacity(PromptSlot::ALL.len());
    for slot in shaped {
        documents.push(match slot {
            None => None,
            Some((name, system_only, slot)) => {
                Some(document(slot, &format!("prompt_documents.{name}"), system_only, &variables)?)
            }
        });
    }
    let summarizer = documents.pop().flatten();
    let system_prompt = documents.pop().flatten();
    Ok(ValidatedProfile { configuration: Value::Object(configuration), system_prompt, summarizer })
}

/// Validates a configuration object and returns its canonical form.
///
/// # Errors
/// 422 `validation_failed` whose message names the field (`configuration.<field>`) and the
/// refusal word, where the grammar has one.
pub fn validate_configuration(
    configuration: &Map<String, Value>,
    check_model: ModelCheck<'_>,
) -> Result<Value, Refusal> {
    validate_fields(configuration, "configuration", check_model, false).map(|(canonical, _)| Value::Object(canonical))
}

/// Validates an inline `execution_declaration` (`docs/declaration.md`, "Inline declarations"): the
/// configuration fields carried directly, without a `configuration` wrapper, plus `system_prompt`
/// and `summarizer` as `{content, role?}`. Unknown fields (identities among them) are ignored and
/// never reach the canonical form.
///
/// The object replaces the declaration whole: omitted fields take the declaration's defaults
/// (null; `[]` for the tool lists and for `fallback_models`). The same grammars as the profile
/// apply, and the documents' macros must be built-in or declared by this object's template.
///
/// # Errors
/// 422 `validation_failed` naming `execution_declaration.<field>`; 422
/// `prompt_document_invalid` (also for a non-object document), `prompt_document_too_large` or
/// `prompt_document_macro_unknown` naming `execution_declaration.<slot>`.
pub fn validate_execution_declaration(
    declaration: &Map<String, Value>,
    check_model: ModelCheck<'_>,
) -> Result<ValidatedProfile, Refusal> {
    // An inline declaration may carry a budget (`docs/executions.md`, "Budgets"); it stays in the
    // authored object the input keeps, and is frozen at materialization.
    if let Some(budget) = declaration.get("budget").filter(|b| !b.is_null()) {
        crate::budget::BudgetLimits::parse(budget, "execution_declaration.budget")?;
    }
    validate_inline(declaration, "execution_declaration", check_model, false)
}

/// The owned slot a door names.
///
/// # Errors
/// 404 `not_found` for a name other than `system_prompt` and `summarizer`.
pub fn prompt_slot(name: &str) -> Result<PromptSlot, Refusal> {
    name.parse().map_err(|_| {
        Refusal::new(
            ErrorCode::NotFound,
            format!("{name}: no owned prompt document by that name; the slots are system_prompt and summarizer"),
        )
    })
}

/// Validates one prompt-document edit on its own door against the Agent's then-current stored
/// `configuration` (its template's variables; `docs/declaration.md`, "Prompt documents"): `body` is
/// `{content, role?}`, or null to clear.
///
/// Returns the canonical `{content, role}` to store, or `None` to clear the slot.
///
/// # Errors
/// 400 `parameter_missing` for a body that is neither an object nor null; 422
/// `prompt_document_invalid`, `prompt_document_too_large` or `prompt_document_macro_unknown`.
pub fn validate_slot_edit(slot: PromptSlot, body: &Value, configuration: &Value) -> Result<Option<Value>, Refusal> {
    let system_only = slot.system_only();
    let slot = slot.as_str();
    match body {
        Value::Null => Ok(None),
        Value::Object(document_body) => {
            document(document_body, slot, system_only, &configuration_variables(configuration)).map(Some)
        }
        _ => Err(Refusal::new(ErrorCode::ParameterMissing, format!("{slot}: must be an object {{content, role?}}"))),
    }
}

/// The inline grammar at `prefix` (`execution_declaration`, or a catalog leaf's path).
fn validate_inline(
    declaration: &Map<String, Value>,
    prefix: &str,
    check_model: ModelCheck<'_>,
    leaf: bool,
) -> Result<ValidatedProfile, Refusal> {
    let (mut configuration, variables) = validate_fields(declaration, prefix, check_model, leaf)?;
    if configuration.get("fallback_models").is_none_or(Value::is_null) {
        configuration.insert("fallback_models".into(), json!([]));
    }
    let mut documents = Vec::with_capacity(PromptSlot::ALL.len());
    for (name, system_only) in PromptSlot::ALL.iter().map(|slot| (slot.as_str(), slot.system_only())) {
        let path = format!("{prefix}.{name}");
        documents.push(match declaration.get(name) {
            None | Some(Value::Null) => None,
            Some(Value::Object(slot)) => Some(document(slot, &path, system_only, &variables)?),
            Some(_) => {
                return Err(Refusal::new(
                    ErrorCode::PromptDocumentInvalid,
                    format!("{path}: prompt_document_invalid: must be an object {{content, role?}} or null"),
                ));
            }
        });
    }
    let summarizer = documents.pop().flatten();
    let system_prompt = documents.pop().flatten();
    Ok(ValidatedProfile { configuration: Value::Object(configuration), system_prompt, summarizer })
}

/// Names a refusal from the tool grammar (which speaks of `configuration.`) at `prefix`.
fn at_prefix(mut refusal: Refusal, prefix: &str) -> Refusal {
    if prefix != "configuration"
        && let Some(rest) = refusal.message.strip_prefix("configuration.")
    {
        refusal.message = format!("{prefix}.{rest}");
    }
    refusal
}

/// Validates every configuration field of `source` at `prefix` and returns the canonical map
/// and the template variables in force for the documents.
fn validate_fields(
    source: &Map<String, Value>,
    prefix: &str,
    check_model: ModelCheck<'_>,
    leaf: bool,
) -> Result<(Map<String, Value>, Vec<String>), Refusal> {
    let field = |name: &str| format!("{prefix}.{name}");
    let mut out = Map::new();
    for name in CONFIGURATION_FIELDS {
        // The tool list (up to 1 MiB) is replaced by its canonical form below: never copy it here.
        let value =
            if name == "tool_definitions" { Value::Null } else { source.get(name).cloned().unwrap_or(Value::Null) };
        out.insert(name.to_owned(), value);
    }
    let tool_definitions =
        canonical_tool_definitions(source.get("tool_definitions")).map_err(|r| at_prefix(r, prefix))?;
    let tools_declared = non_empty_array(Some(&tool_definitions));
    out.insert("tool_definitions".into(), tool_definitions);
    validate_kernel_tools(source.get("kernel_tools")).map_err(|r| at_prefix(r, prefix))?;
    // Nothing this server cannot run is offered to a model (`docs/kernel-tools.md`).
    refuse_unserved(source.get("tool_definitions"), source.get("kernel_tools")).map_err(|r| at_prefix(r, prefix))?;
    validate_runner_ids(source.get("runner_executor_public_ids")).map_err(|r| at_prefix(r, prefix))?;
    validate_runner_tool_names(source.get("runner_tool_names")).map_err(|r| at_prefix(r, prefix))?;
    for list in ["kernel_tools", "runner_executor_public_ids"] {
        if out.get(list).is_none_or(Value::is_null) {
            out.insert(list.into(), json!([]));
        }
    }
    let hooks_declared = hooks::validate_hooks(source.get("lifecycle_hooks"), &field("lifecycle_hooks"))?;
    let runner_imports = non_empty_array(source.get("runner_executor_public_ids"))
        && source.get("runner_tool_names").and_then(Value::as_array).is_none_or(|n| !n.is_empty());
    let mode_needed = tools_declared || non_empty_array(source.get("kernel_tools")) || hooks_declared || runner_imports;
    approval::validate_mode(source.get("approval_mode"), &field("approval_mode"), mode_needed)?;
    approval::validate_rules(source.get("approval_rules"), &field("approval_rules"))?;
    let variables = template::validate_prompt(
        source.get("prompt_mechanism"),
        source.get("prompt_template"),
        &field("prompt_mechanism"),
        &field("prompt_template"),
    )?;
    compaction::validate_compaction(source.get("compaction_policy"), &field("compaction_policy"))?;
    validate_default_model(source.get("default_model"), &field("default_model"), check_model)?;
    validate_fallback_models(source.get("fallback_models"), &field("fallback_models"))?;
    memory::validate_memory_limit(source.get("memory_context_limit"), &field("memory_context_limit"))?;
    memory::validate_reach(source.get("conversation_reach"), &field("conversation_reach"))?;
    let catalog_field = field("delegation_catalog");
    if leaf {
        if source.get("delegation_catalog").is_some_and(|c| !c.is_null()) {
            return Err(invalid(&catalog_field, "a leaf cannot contain another catalog"));
        }
    } else {
        let catalog = delegation::validate_catalog(source.get("delegation_catalog"), &catalog_field, check_model)?;
        out.insert("delegation_catalog".into(), catalog);
    }
    Ok((out, variables))
}

fn non_empty_array(value: Option<&Value>) -> bool {
    value.and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

fn validate_default_model(value: Option<&Value>, field: &str, check_model: ModelCheck<'_>) -> Result<(), Refusal> {
    let Some(model) = value.filter(|v| !v.is_null()) else { return Ok(()) };
    let Some(reference) = model.as_str() else {
        return Err(invalid(field, "unknown_model: must be a provider/model string"));
    };
    check_model(reference).map_err(|(word, message)| invalid(field, format!("{word}: {message}")))
}

/// `fallback_models` is judged by its shape only: each entry a complete `provider/model` reference.
/// Availability is judged live, at selection and at provider start (`docs/declaration.md`,
/// "Configuration fields"), so an entry whose provider lacks its credential today is still
/// accepted.
fn validate_fallback_models(value: Option<&Value>, field: &str) -> Result<(), Refusal> {
    let models = match value {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(models)) => models,
        Some(_) => return Err(invalid(field, "must be an array of provider/model references")),
    };
    if Value::Array(models.clone()).to_string().len() > ENVELOPE_BOUND {
        return Err(invalid(field, "the fallback list is over its bound of 65536 bytes"));
    }
    for (i, model) in models.iter().enumerate() {
        let Some(reference) = model.as_str() else {
            return Err(invalid(&format!("{field}[{i}]"), "must be a provider/model string"));
        };
        if reference.chars().count() > FALLBACK_MODEL_BOUND {
            return Err(invalid(&format!("{field}[{i}]"), "is over 193 characters"));
        }
        if !is_complete_reference(reference) {
            return Err(invalid(
                &format!("{field}[{i}]"),
                "unknown_model: must be a complete provider/model reference, not a bare word or a selector",
            ));
        }
    }
    Ok(())
}

/// A complete `provider/model` reference: a provider, `/`, a model, no whitespace or control
/// characters, and not a `model_selector:` policy.
fn is_complete_reference(reference: &str) -> bool {
    if reference.starts_with("model_selector:") || reference.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return false;
    }
    reference.split_once('/').is_some_and(|(provider, model)| !provider.is_empty() && !model.is_empty())
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

    fn refused(value: Value) -> Refusal {
        validate_configuration(value.as_object().expect("object"), &accept_all).expect_err("refused")
    }

    fn inline(value: Value) -> Result<ValidatedProfile, Refusal> {
        validate_execution_declaration(value.as_object().expect("object"), &accept_all)
    }

    fn put(body: Value) -> Result<ValidatedProfile, Refusal> {
        validate_profile_put(&body, &accept_all)
    }

    const TEMPLATE_HISTORY_INPUT: &str =
        r#"[{"type":"slot","slot":"system_prompt"},{"type":"history"},{"type":"input"}]"#;

    fn template(variables: Value) -> Value {
        json!({"blocks": serde_json::from_str::<Value>(TEMPLATE_HISTORY_INPUT).expect("json"), "variables": variables})
    }

    fn rich_configuration() -> Value {
        json!({
            "tool_definitions": [
                {"type": "function", "function": {"name": "bash", "description": "run", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
            ],
            "approval_mode": "rules",
            "approval_rules": [{ "tool": "bash|start_process", "path": "command", "match": "*rm -rf /*", "verdict": "deny" }],
            "prompt_mechanism": "assembly",
            "prompt_template": template(json!({"tone": "calm"})),
            "compaction_policy": {"mode": "delegate", "tool_name": "summarize"},
            "lifecycle_hooks": {"stop": {"tool": "review_completion", "timeout_ms": 30000, "max_continuations": 2}},
            "default_model": "openrouter/z-ai/glm-5.3",
            "fallback_models": ["openrouter/moonshotai/kimi-k3"],
            "memory_context_limit": {"bindings": [{"name": "conversation", "scope": "conversation", "access": "read_write"}]},
            "conversation_reach": "subtree",
            "delegation_catalog": [{"name": "reviewer", "description": "Reviews a change.", "model_mode": "caller",
                "declaration": {"approval_mode": "ask", "kernel_tools": ["nexus.memory.read"], "system_prompt": {"content": "Review for {{agent}}."}}}]
        })
    }

    #[test]
    fn prompt_document_slots() {
        let docs = |docs: Value| put(json!({"configuration": {}, "prompt_documents": docs}));
        let rows = [
            ("r4_empty_slot_object", json!({"system_prompt": {}}), "prompt_document_invalid"),
            ("r2_slot_not_object", json!({"system_prompt": 3}), "parameter_missing"),
            ("r2_summarizer_not_object", json!({"summarizer": "text"}), "parameter_missing"),
            ("r2_root_not_object", json!("both"), "parameter_missing"),
            (
                "r58_too_large",
                json!({"system_prompt": {"content": "x".repeat(PROMPT_DOCUMENT_BOUND + 1)}}),
                "prompt_document_too_large",
            ),
            (
                "r4_summarizer_system_only",
                json!({"summarizer": {"content": "s", "role": "developer"}}),
                "prompt_document_invalid",
            ),
            (
                "r58_macro_unknown",
                json!({"system_prompt": {"content": "hi {{tone}}"}}),
                "prompt_document_macro_unknown",
            ),
        ];
        for (name, documents, code) in rows {
            assert_eq!(docs(documents).expect_err(name).code.as_str(), code, "{name}");
        }
        let ok = docs(json!({"system_prompt": {"content": "be brief, {{agent}}"}})).expect("valid");
        assert_eq!(ok.system_prompt, Some(json!({"content": "be brief, {{agent}}", "role": "system"})));
        assert_eq!(ok.summarizer, None);
        let both =
            docs(json!({"system_prompt": {"content": "", "role": "developer"}, "summarizer": {"content": "keep"}}))
                .expect("valid");
        assert_eq!(both.system_prompt, Some(json!({"content": "", "role": "developer"})));
        assert_eq!(both.summarizer, Some(json!({"content": "keep", "role": "system"})));
        for clears in [json!(null), json!({}), json!({"system_prompt": null, "summarizer": null})] {
            let cleared = docs(clears).expect("r3 clears");
            assert_eq!((cleared.system_prompt, cleared.summarizer), (None, None));
        }
        assert_eq!(put(json!({"configuration": []})).expect_err("r1").code, ErrorCode::ParameterMissing);
        assert_eq!(put(json!({})).expect_err("r1").code, ErrorCode::ParameterMissing);
    }

    #[test]
    fn spec_000_example_body_accepted() {
        let body = json!({
          "configuration": {
            "tool_definitions": [
              { "type": "function", "function": { "name": "bash", "description": "…", "parameters": { "type": "object", "properties": { "command": { "type": "string" } }, "required": ["command"] } } }
            ],
            "approval_mode": "bypass",
            "approval_rules": [
              { "tool": "bash|start_process", "path": "command", "match": "*rm -rf /*", "verdict": "deny" }
            ],
            "prompt_mechanism": "default",
            "prompt_template": null,
            "compaction_policy": { "mode": "kernel" },
            "lifecycle_hooks": {
              "stop": { "tool": "review_completion", "timeout_ms": 30000, "max_continuations": 2 }
            },
            "default_model": "openrouter/z-ai/glm-5.3",
            "fallback_models": ["openrouter/moonshotai/kimi-k3"]
          },
          "prompt_documents": {
            "system_prompt": { "content": "You are {{agent}}.", "role": "developer" },
            "summarizer": { "content": "Preserve decisions and pointers to results." }
          }
        });
        let ok = put(body.clone()).expect("the spec's own example is valid");
        let configuration = &ok.configuration;
        assert_eq!(configuration["approval_rules"], body["configuration"]["approval_rules"]);
        assert_eq!(configuration["lifecycle_hooks"], body["configuration"]["lifecycle_hooks"]);
        assert_eq!(configuration["compaction_policy"], json!({"mode": "kernel"}));
        assert_eq!(configuration["memory_context_limit"], Value::Null);
        assert_eq!(ok.system_prompt, Some(json!({"content": "You are {{agent}}.", "role": "developer"})));
    }

    #[test]
    fn r5_r8_whole_replacement_and_unknown_fields() {
        let empty = config(json!({"validation_context": {"x": 1}, "variables": {"a": "b"}, "model_defaults": {}}));
        let object = empty.as_object().expect("object");
        assert_eq!(object.len(), CONFIGURATION_FIELDS.len());
        assert!(!object.contains_key("validation_context"));
        assert!(!object.contains_key("variables"));
        for field in CONFIGURATION_FIELDS {
            let expected = match field {
                "tool_definitions" | "kernel_tools" | "runner_executor_public_ids" => json!([]),
                _ => Value::Null,
            };
            assert_eq!(object[field], expected, "{field}");
        }
    }

    #[test]
    fn canonical_output_revalidates_to_itself() {
        let once = config(rich_configuration());
        let twice = config(once.clone());
        assert_eq!(once, twice);
        assert_eq!(once["delegation_catalog"][0]["declaration"]["fallback_models"], json!([]));
        assert_eq!(
            once["delegation_catalog"][0]["declaration"]["system_prompt"],
            json!({"content": "Review for {{agent}}.", "role": "system"})
        );
        let inline_once = inline(rich_configuration()).expect("valid");
        let mut again = inline_once.configuration.as_object().expect("object").clone();
        again.insert("system_prompt".into(), inline_once.system_prompt.clone().unwrap_or(Value::Null));
        let inline_twice = validate_execution_declaration(&again, &accept_all).expect("valid");
        assert_eq!(inline_once, inline_twice);
    }

    #[test]
    fn configuration_refusals_name_the_field() {
        let cases = [
            ("r12_mode_vocabulary", json!({"approval_mode": "sometimes"}), "configuration.approval_mode"),
            (
                "r25_runner_ids",
                json!({"runner_executor_public_ids": ["not-a-uuid"]}),
                "configuration.runner_executor_public_ids",
            ),
            ("r24_kernel_tools", json!({"kernel_tools": ["ask"]}), "configuration.kernel_tools"),
            ("r26_runner_tool_names", json!({"runner_tool_names": [""]}), "configuration.runner_tool_names"),
            (
                "r18_duplicate",
                json!({"approval_mode": "bypass", "tool_definitions": [
                {"type":"function","function":{"name":"a"}}, {"type":"function","name":"a"}]}),
                "configuration.tool_definitions[1]",
            ),
            (
                "r16_route",
                json!({"approval_mode": "bypass", "tool_definitions": [
                {"type":"function","function":{"name":"a"},"route":{"kind":"runner"}}]}),
                "configuration.tool_definitions[0].route",
            ),
            (
                "r39_fallback_length",
                json!({"fallback_models": ["p/".to_owned() + &"m".repeat(200)]}),
                "configuration.fallback_models[0]",
            ),
            ("r39_fallback_type", json!({"fallback_models": "p/m"}), "configuration.fallback_models"),
            ("r39_fallback_entry_type", json!({"fallback_models": [1]}), "configuration.fallback_models[0]"),
            (
                "r39_fallback_envelope",
                json!({"fallback_models": vec!["p/".to_owned() + &"m".repeat(190); 400]}),
                "configuration.fallback_models: the fallback list",
            ),
            ("r68_rules", json!({"approval_rules": [{"verdict": "deny"}]}), "configuration.approval_rules[0].tool"),
            ("mechanism", json!({"prompt_mechanism": "fancy"}), "configuration.prompt_mechanism"),
            ("assembly_without_template", json!({"prompt_mechanism": "assembly"}), "configuration.prompt_template"),
            (
                "template_pointer",
                json!({"prompt_mechanism": "assembly", "prompt_template": {"blocks": [{"type": "history"}, {"type": "inline", "role": "bot", "text": ""}, {"type": "input"}]}}),
                "configuration.prompt_template: /blocks/1/role",
            ),
            (
                "r70_policy",
                json!({"compaction_policy": {"mode": "delegate"}}),
                "configuration.compaction_policy.tool_name",
            ),
            (
                "r53_hooks",
                json!({"approval_mode": "ask", "lifecycle_hooks": {"start": {"tool": "t", "timeout_ms": 1}}}),
                "configuration.lifecycle_hooks.start",
            ),
            (
                "r35_memory",
                json!({"memory_context_limit": {"bindings": [{"name": "workspace", "scope": "workspace", "access": "read"}]}}),
                "configuration.memory_context_limit.bindings",
            ),
            ("r37_reach", json!({"conversation_reach": "everything"}), "configuration.conversation_reach"),
            ("r49_catalog_type", json!({"delegation_catalog": {}}), "configuration.delegation_catalog"),
            ("r11_default_model_type", json!({"default_model": 5}), "configuration.default_model: unknown_model"),
        ];
        for (name, cfg, field) in cases {
            let refusal = refused(cfg);
            assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{name}");
            assert!(refusal.message.starts_with(field), "{name}: {} should name {field}", refusal.message);
        }
        let refuse_model = |_: &str| Err(("unknown_provider".to_owned(), "no such provider".to_owned()));
        for (name, cfg, field) in [
            ("r11_default_model", json!({"default_model": "x/y"}), "configuration.default_model: unknown_provider"),
            (
                "r39_fallback_bare_word",
                json!({"fallback_models": ["gpt"]}),
                "configuration.fallback_models[0]: unknown_model",
            ),
            (
                "r39_fallback_selector",
                json!({"fallback_models": ["model_selector:fast"]}),
                "configuration.fallback_models[0]: unknown_model",
            ),
        ] {
            let refusal = validate_configuration(cfg.as_object().expect("object"), &refuse_model).expect_err("refused");
            assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{name}");
            assert!(refusal.message.starts_with(field), "{name}: {}", refusal.message);
        }
        // Fallback availability is judged live, not at declaration: a complete reference the
        // resolver refuses today is still accepted.
        let accepted =
            validate_configuration(json!({"fallback_models": ["x/y"]}).as_object().expect("object"), &refuse_model);
        assert!(accepted.is_ok(), "{accepted:?}");
    }

    #[test]
    fn r12_approval_mode_required_for_tools_hooks_and_imports() {
        let id = Uuid::new_v4();
        let needs_mode = [
            ("runner_imports", json!({"runner_executor_public_ids": [id]})),
            ("kernel_tools", json!({"kernel_tools": ["nexus.memory.read"]})),
            ("tool_definitions", json!({"tool_definitions": [{"type": "function", "function": {"name": "bash"}}]})),
            ("r55_hooks_only", json!({"lifecycle_hooks": {"turn_start": {"tool": "warm", "timeout_ms": 10}}})),
        ];
        for (name, cfg) in needs_mode {
            let refusal = refused(cfg);
            assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{name}");
            assert!(refusal.message.starts_with("configuration.approval_mode"), "{name}: {}", refusal.message);
        }
        // runner_tool_names [] imports nothing, and {} hooks enable nothing: no mode is needed.
        let ok = config(json!({"runner_executor_public_ids": [id], "runner_tool_names": [], "lifecycle_hooks": {}}));
        assert_eq!(ok["lifecycle_hooks"], json!({}));
        assert_eq!(ok["runner_tool_names"], json!([]));
    }

    #[test]
    fn r7_variable_renamed_with_system_prompt_in_one_put() {
        let body = |variables: Value, content: &str| {
            json!({"configuration": {"prompt_mechanism": "assembly", "prompt_template": template(variables)},
                   "prompt_documents": {"system_prompt": {"content": content}, "summarizer": {"content": "{{tone}}"}}})
        };
        let ok = put(body(json!({"tone": "calm"}), "Be {{tone}}, {{agent}}.")).expect("declared variable");
        assert_eq!(ok.configuration["prompt_template"]["variables"], json!({"tone": "calm"}));
        let renamed = put(json!({"configuration": {"prompt_mechanism": "assembly", "prompt_template": template(json!({"voice": "calm"}))},
            "prompt_documents": {"system_prompt": {"content": "Be {{voice}}."}}}))
        .expect("renamed in one PUT");
        assert_eq!(renamed.system_prompt, Some(json!({"content": "Be {{voice}}.", "role": "system"})));
        let stale = put(body(json!({"voice": "calm"}), "Be {{tone}}.")).expect_err("old name");
        assert_eq!(stale.code, ErrorCode::PromptDocumentMacroUnknown);
        assert!(stale.message.starts_with("prompt_documents.system_prompt.content"));
        // The template is stored unread under default: its variables are not in force.
        let unread = put(
            json!({"configuration": {"prompt_mechanism": "default", "prompt_template": template(json!({"tone": "x"}))},
            "prompt_documents": {"system_prompt": {"content": "{{tone}}"}}}),
        )
        .expect_err("unread template");
        assert_eq!(unread.code, ErrorCode::PromptDocumentMacroUnknown);
    }

    #[test]
    fn r6_configuration_refused_before_any_document_is_accepted() {
        let refusal = put(json!({"configuration": {"approval_mode": "never"},
            "prompt_documents": {"system_prompt": {"content": "fine"}}}))
        .expect_err("refused");
        assert_eq!(refusal.code, ErrorCode::ValidationFailed);
        let refusal = put(json!({"configuration": {"approval_mode": "ask"},
            "prompt_documents": {"system_prompt": {"content": "fine"}, "summarizer": {"content": "{{nope}}"}}}))
        .expect_err("refused");
        assert_eq!(refusal.code, ErrorCode::PromptDocumentMacroUnknown);
        assert!(refusal.message.starts_with("prompt_documents.summarizer.content"));
    }

    #[test]
    fn slot_edit_uses_the_then_current_template() {
        let stored =
            config(json!({"prompt_mechanism": "assembly", "prompt_template": template(json!({"tone": "calm"}))}));
        assert_eq!(
            validate_slot_edit(PromptSlot::SystemPrompt, &json!({"content": "{{tone}}", "role": "developer"}), &stored),
            Ok(Some(json!({"content": "{{tone}}", "role": "developer"})))
        );
        assert_eq!(validate_slot_edit(PromptSlot::Summarizer, &Value::Null, &stored), Ok(None));
        let rows = [
            ("unknown_macro", "system_prompt", json!({"content": "{{voice}}"}), "prompt_document_macro_unknown"),
            ("r4_empty_object", "system_prompt", json!({}), "prompt_document_invalid"),
            (
                "summarizer_developer",
                "summarizer",
                json!({"content": "", "role": "developer"}),
                "prompt_document_invalid",
            ),
            (
                "too_large",
                "summarizer",
                json!({"content": "x".repeat(PROMPT_DOCUMENT_BOUND + 1)}),
                "prompt_document_too_large",
            ),
            ("body_not_object", "system_prompt", json!("text"), "parameter_missing"),
            ("unknown_slot", "persona", json!({"content": ""}), "not_found"),
        ];
        for (name, slot, body, code) in rows {
            let edited = prompt_slot(slot).and_then(|slot| validate_slot_edit(slot, &body, &stored));
            assert_eq!(edited.expect_err(name).code.as_str(), code, "{name}");
        }
        let undeclared = validate_slot_edit(PromptSlot::SystemPrompt, &json!({"content": "{{tone}}"}), &Value::Null);
        assert_eq!(undeclared.expect_err("no template").code, ErrorCode::PromptDocumentMacroUnknown);
    }

    #[test]
    fn r45_r46_inline_execution_declaration() {
        let spec_example = json!({
            "prompt_mechanism": "default",
            "system_prompt": { "content": "Check the supplied change.", "role": "developer" },
            "kernel_tools": ["nexus.memory.read"],
            "approval_mode": "ask",
            "default_model": "openai_api/gpt-6.1-sol",
            "fallback_models": ["anthropic/claude-sonnet-4-5"],
            "credential": "ignored", "member_public_id": "ignored"
        });
        let ok = inline(spec_example).expect("the spec's inline example is valid");
        assert_eq!(ok.system_prompt, Some(json!({"content": "Check the supplied change.", "role": "developer"})));
        assert_eq!(ok.summarizer, None);
        assert_eq!(ok.configuration["fallback_models"], json!(["anthropic/claude-sonnet-4-5"]));
        assert_eq!(ok.configuration["kernel_tools"], json!(["nexus.memory.read"]));
        assert!(ok.configuration.get("credential").is_none());
        assert!(ok.configuration.get("system_prompt").is_none());
        let defaults = inline(json!({})).expect("empty declaration");
        assert_eq!(defaults.configuration["fallback_models"], json!([]));
        assert_eq!(defaults.configuration["tool_definitions"], json!([]));
        assert_eq!(defaults.configuration["approval_mode"], Value::Null);

        let rows = [
            (
                "r12_mode",
                json!({"kernel_tools": ["nexus.memory.read"]}),
                "validation_failed",
                "execution_declaration.approval_mode",
            ),
            (
                "r24_tools_reprefixed",
                json!({"kernel_tools": ["nope"]}),
                "validation_failed",
                "execution_declaration.kernel_tools",
            ),
            (
                "r18_tool_definitions_reprefixed",
                json!({"approval_mode": "ask", "tool_definitions": [{"type": "function", "name": "a"}, {"type": "function", "name": "a"}]}),
                "validation_failed",
                "execution_declaration.tool_definitions[1]",
            ),
            (
                "rules",
                json!({"approval_rules": [{"tool": "a", "verdict": "deny", "match": "*"}]}),
                "validation_failed",
                "execution_declaration.approval_rules[0].match",
            ),
            (
                "template",
                json!({"prompt_mechanism": "assembly"}),
                "validation_failed",
                "execution_declaration.prompt_template",
            ),
            (
                "hooks",
                json!({"approval_mode": "ask", "lifecycle_hooks": {"stop": {"tool": "t", "timeout_ms": 1}}}),
                "validation_failed",
                "execution_declaration.lifecycle_hooks.stop.max_continuations",
            ),
            (
                "memory",
                json!({"memory_context_limit": []}),
                "validation_failed",
                "execution_declaration.memory_context_limit",
            ),
            (
                "reach",
                json!({"conversation_reach": "all"}),
                "validation_failed",
                "execution_declaration.conversation_reach",
            ),
            (
                "fallback",
                json!({"fallback_models": [7]}),
                "validation_failed",
                "execution_declaration.fallback_models[0]",
            ),
            (
                "policy",
                json!({"compaction_policy": {"mode": "never"}}),
                "validation_failed",
                "execution_declaration.compaction_policy.mode",
            ),
            (
                "catalog",
                json!({"delegation_catalog": [{}]}),
                "validation_failed",
                "execution_declaration.delegation_catalog[0]",
            ),
            (
                "prompt_macro",
                json!({"system_prompt": {"content": "{{who}}"}}),
                "prompt_document_macro_unknown",
                "execution_declaration.system_prompt.content",
            ),
            (
                "prompt_shape",
                json!({"summarizer": "text"}),
                "prompt_document_invalid",
                "execution_declaration.summarizer",
            ),
            (
                "prompt_empty",
                json!({"system_prompt": {}}),
                "prompt_document_invalid",
                "execution_declaration.system_prompt.content",
            ),
            (
                "prompt_role",
                json!({"summarizer": {"content": "", "role": "developer"}}),
                "prompt_document_invalid",
                "execution_declaration.summarizer.role",
            ),
        ];
        for (name, declaration, code, field) in rows {
            let refusal = inline(declaration).expect_err(name);
            assert_eq!(refusal.code.as_str(), code, "{name}");
            assert!(refusal.message.starts_with(field), "{name}: {} should name {field}", refusal.message);
        }
        let with_variables =
            inline(json!({"prompt_mechanism": "assembly", "prompt_template": template(json!({"tone": "x"})),
            "system_prompt": {"content": "{{tone}}"}}))
            .expect("inline template variables are in force");
        assert_eq!(with_variables.system_prompt, Some(json!({"content": "{{tone}}", "role": "system"})));
    }

    #[test]
    fn r49_delegation_catalog() {
        let entry = |name: &str, declaration: Value| json!({"name": name, "description": "d", "model_mode": "default", "declaration": declaration});
        assert_eq!(config(json!({"delegation_catalog": null}))["delegation_catalog"], Value::Null);
        assert_eq!(config(json!({"delegation_catalog": []}))["delegation_catalog"], json!([]));
        let ok = config(
            json!({"delegation_catalog": [entry("a", json!({"default_model": "p/m", "extra": 1})), entry("b", json!({}))]}),
        );
        let leaf = &ok["delegation_catalog"][0]["declaration"];
        assert_eq!(leaf["default_model"], json!("p/m"));
        assert_eq!(leaf["fallback_models"], json!([]));
        assert_eq!(leaf["delegation_catalog"], Value::Null);
        assert!(leaf.get("extra").is_none());
        assert_eq!(ok["delegation_catalog"][1]["model_mode"], json!("default"));

        let rows = [
            ("not_array", json!({"delegation_catalog": "x"}), "configuration.delegation_catalog"),
            ("entry_not_object", json!({"delegation_catalog": [1]}), "configuration.delegation_catalog[0]"),
            (
                "r49_duplicate_name",
                json!({"delegation_catalog": [entry("a", json!({})), entry("a", json!({}))]}),
                "configuration.delegation_catalog[1].name",
            ),
            (
                "name_missing",
                json!({"delegation_catalog": [{"description": "d", "model_mode": "caller", "declaration": {}}]}),
                "configuration.delegation_catalog[0].name",
            ),
            (
                "description_missing",
                json!({"delegation_catalog": [{"name": "a", "model_mode": "caller", "declaration": {}}]}),
                "configuration.delegation_catalog[0].description",
            ),
            (
                "model_mode_outside",
                json!({"delegation_catalog": [{"name": "a", "description": "d", "model_mode": "parent", "declaration": {}}]}),
                "configuration.delegation_catalog[0].model_mode",
            ),
            (
                "declaration_missing",
                json!({"delegation_catalog": [{"name": "a", "description": "d", "model_mode": "caller"}]}),
                "configuration.delegation_catalog[0].declaration",
            ),
            (
                "unknown_key",
                json!({"delegation_catalog": [{"name": "a", "description": "d", "model_mode": "caller", "declaration": {}, "agent": "@x"}]}),
                "configuration.delegation_catalog[0].agent",
            ),
            (
                "r49_leaf_holds_catalog",
                json!({"delegation_catalog": [entry("a", json!({"delegation_catalog": []}))]}),
                "configuration.delegation_catalog[0].declaration.delegation_catalog",
            ),
            (
                "leaf_field_named",
                json!({"delegation_catalog": [entry("a", json!({"kernel_tools": ["nexus.memory.read"]}))]}),
                "configuration.delegation_catalog[0].declaration.approval_mode",
            ),
            (
                "leaf_tool_refusal_reprefixed",
                json!({"delegation_catalog": [entry("a", json!({"kernel_tools": ["bogus"]}))]}),
                "configuration.delegation_catalog[0].declaration.kernel_tools",
            ),
        ];
        for (name, cfg, field) in rows {
            let refusal = refused(cfg);
            assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{name}");
            assert!(refusal.message.starts_with(field), "{name}: {} should name {field}", refusal.message);
        }
        let leaf_doc =
            refused(json!({"delegation_catalog": [entry("a", json!({"system_prompt": {"content": "{{x}}"}}))]}));
        assert_eq!(leaf_doc.code, ErrorCode::PromptDocumentMacroUnknown);
        assert!(leaf_doc.message.starts_with("configuration.delegation_catalog[0].declaration.system_prompt.content"));
    }
}
