//! `prompt_mechanism`, `prompt_template` and prompt macros (`docs/declaration.md`, "Templates" and
//! "Prompt documents").
//!
//! A template is `{blocks:[…], variables?:{name: default}}` of at most 64 KiB. Refusals name the
//! JSON-pointer path inside the template, e.g.
//! `configuration.prompt_template: /blocks/2/role: must be system, developer, user or assistant`.

use std::collections::{BTreeMap, HashSet};
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use nexus_proto::{ErrorCode, Refusal};

use super::{ENVELOPE_BOUND, invalid};

nexus_proto::words! {
    /// How a request is assembled (`prompt_mechanism`).
    pub enum Mechanism("prompt mechanism") {
        /// The documents and the turn; no history.
        Raw => "raw",
        /// The fixed order.
        Default => "default",
        /// The declared template's order.
        Assembly => "assembly",
    }
}

/// The built-in prompt macros, written `{{name}}` in documents and inline template text.
pub const MACROS: [&str; 5] = ["agent", "user", "workspace", "date", "conversation_kind"];
/// A template holds 1 to this many blocks.
pub const MAX_BLOCKS: usize = 64;
/// A template declares at most this many variables.
pub const MAX_VARIABLES: usize = 32;
/// The bound of a history block's `max_entries`.
pub const MAX_HISTORY_ENTRIES: u64 = 200;

const SLOTS: [&str; 3] = ["system_prompt", "character", "persona"];
const ROLES: [&str; 4] = ["system", "developer", "user", "assistant"];

static MACRO_RE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\{\{([^{}]*)\}\}").expect("static regex"));
static VARIABLE_RE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[a-z][a-z0-9_]*$").expect("static regex"));

/// The first `{{name}}` in `text` that is neither a built-in macro nor one of `variables`.
/// The name is taken exactly as written between the braces (`{{ agent }}` is not `{{agent}}`).
pub fn unknown_macro<'t>(text: &'t str, variables: &[String]) -> Option<&'t str> {
    MACRO_RE
        .captures_iter(text)
        .filter_map(|c| c.get(1))
        .map(|m| m.as_str())
        .find(|name| !MACROS.contains(name) && !variables.iter().any(|v| v == name))
}

/// The variables a stored (validated) configuration makes available to its prompt documents:
/// the template's declared names under `prompt_mechanism: assembly`, else none (the template is
/// stored unread under the other mechanisms).
pub fn configuration_variables(configuration: &Value) -> Vec<String> {
    if configuration.get("prompt_mechanism").and_then(Value::as_str) != Some("assembly") {
        return Vec::new();
    }
    configuration
        .get("prompt_template")
        .and_then(|t| t.get("variables"))
        .and_then(Value::as_object)
        .map(|vars| vars.keys().cloned().collect())
        .unwrap_or_default()
}

/// Validates an input's `variables` against the answering declaration's `configuration` and
/// answers them as `name -> text` (`docs/prompt.md`, "Macros"): an object of at most
/// [`MAX_VARIABLES`] string values, at most [`ENVELOPE_BOUND`] bytes as JSON, no NUL, each name
/// declared by the template of a configuration whose `prompt_mechanism` is `assembly`.
///
/// # Errors
/// 400 `parameter_invalid` for another shape, too many entries or a NUL; 413
/// `content_too_large` over the byte bound; 422 `variable_undeclared` naming the first name the
/// template does not declare (every name, when the mechanism is not `assembly`).
pub fn input_variables(configuration: &Value, variables: &Value) -> Result<BTreeMap<String, String>, Refusal> {
    let Some(object) = variables.as_object() else {
        return Err(Refusal::new(ErrorCode::ParameterInvalid, "variables must be an object of name: text"));
    };
    if object.len() > MAX_VARIABLES {
        return Err(Refusal::new(
            ErrorCode::ParameterInvalid,
            format!("variables has {} entries; a template declares at most {MAX_VARIABLES}", object.len()),
        ));
    }
    let size = variables.to_string().len();
    if size > ENVELOPE_BOUND {
        return Err(Refusal::new(
            ErrorCode::ContentTooLarge,
            format!("variables is {size} bytes, over its bound of {ENVELOPE_BOUND}"),
        ));
    }
    let declared = configuration_variables(configuration);
    let mut out = BTreeMap::new();
    for (name, value) in object {
        if !declared.contains(name) {
            let names = if declared.is_empty() { "none".to_owned() } else { declared.join(", ") };
            return Err(Refusal::new(
                ErrorCode::VariableUndeclared,
                format!(
                    "variables.{name}: variable_undeclared: the answering declaration's prompt_template declares \
                     {names}; variables need prompt_mechanism assembly and a declared name"
                ),
            ));
        }
        let Some(text) = value.as_str().filter(|t| !t.contains('\0')) else {
            return Err(Refusal::new(
                ErrorCode::ParameterInvalid,
                format!("variables.{name} must be a string without NUL"),
            ));
        };
        out.insert(name.clone(), text.to_owned());
    }
    Ok(out)
}

/// Validates `prompt_mechanism` and `prompt_template` together and returns the template's
/// declared variable names (empty unless the mechanism is `assembly`).
///
/// # Errors
/// 422 `validation_failed` naming `mechanism_field` or `template_field` (with the JSON pointer).
pub(super) fn validate_prompt(
    mechanism: Option<&Value>,
    template: Option<&Value>,
    mechanism_field: &str,
    template_field: &str,
) -> Result<Vec<String>, Refusal> {
    let assembly = match mechanism {
        None | Some(Value::Null) => false,
        Some(Value::String(word)) if matches!(word.as_str(), "raw" | "default") => false,
        Some(Value::String(word)) if word == "assembly" => true,
        Some(_) => return Err(invalid(mechanism_field, "must be raw, assembly or default")),
    };
    let template = template.filter(|t| !t.is_null());
    if let Some(template) = template {
        let size = template.to_string().len();
        if size > ENVELOPE_BOUND {
            return Err(invalid(template_field, format!("is {size} bytes, over its bound of {ENVELOPE_BOUND}")));
        }
    }
    match (assembly, template) {
        (false, _) => Ok(Vec::new()),
        (true, None) => Err(invalid(
            template_field,
            "prompt_template_missing: prompt_mechanism assembly needs a prompt_template {blocks, variables?}",
        )),
        (true, Some(template)) => validate_template(template)
            .map_err(|(pointer, detail)| invalid(template_field, format!("{pointer}: {detail}"))),
    }
}

/// Escapes one JSON-pointer reference token (RFC 6901).
fn token(raw: &str) -> String {
    raw.replace('~', "~0").replace('/', "~1")
}

type Pointed = (String, String);

fn at(pointer: impl Into<String>, detail: impl Into<String>) -> Pointed {
    (pointer.into(), detail.into())
}

fn validate_template(template: &Value) -> Result<Vec<String>, Pointed> {
    let Some(template) = template.as_object() else {
        return Err(at("/", "a template must be an object {blocks, variables?}"));
    };
    if let Some(key) = template.keys().find(|k| !matches!(k.as_str(), "blocks" | "variables")) {
        return Err(at(format!("/{}", token(key)), "unknown key; a template takes blocks and variables"));
    }
    let variables = validate_variables(template.get("variables"))?;
    let Some(blocks) = template.get("blocks").and_then(Value::as_array) else {
        return Err(at("/blocks", "is required and must be an array of 1 to 64 blocks"));
    };
    if blocks.is_empty() || blocks.len() > MAX_BLOCKS {
        return Err(at("/blocks", format!("has {} blocks; a template holds 1 to 64", blocks.len())));
    }
    let mut seen_slots = HashSet::new();
    let mut seen_once = HashSet::new();
    let mut history_seen = false;
    let mut input_seen = false;
    let mut leading_run = true;
    for (i, block) in blocks.iter().enumerate() {
        let here = format!("/blocks/{i}");
        let Some(block) = block.as_object() else { return Err(at(&here, "a block must be an object")) };
        let Some(kind) = block.get("type").and_then(Value::as_str) else {
            return Err(at(format!("{here}/type"), "is required"));
        };
        let allowed: &[&str] = match kind {
            "slot" => &["type", "slot"],
            "inline" => &["type", "role", "text"],
            "history" => &["type", "max_entries", "budget"],
            "memory" | "skills" | "lead" | "tail" | "input" => &["type"],
            _ => {
                return Err(at(
                    format!("{here}/type"),
                    "must be slot, inline, memory, skills, lead, tail, history or input",
                ));
            }
        };
        if let Some(key) = block.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(at(format!("{here}/{}", token(key)), format!("unknown key for a {kind} block")));
        }
        if input_seen {
            return Err(at(&here, "input must be the last block"));
        }
        let mut stays_leading = false;
        match kind {
            "slot" => {
                let slot = block.get("slot").and_then(Value::as_str);
                let Some(slot) = slot.filter(|s| SLOTS.contains(s)) else {
                    return Err(at(format!("{here}/slot"), "must be system_prompt, character or persona"));
                };
                if !seen_slots.insert(slot) {
                    return Err(at(
                        format!("{here}/slot"),
                        format!("{slot} appears twice; a slot is placed at most once"),
                    ));
                }
                if history_seen {
                    return Err(at(&here, "a slot block must come before the history block"));
                }
                stays_leading = true;
            }
            "inline" => {
                let role = block.get("role").and_then(Value::as_str);
                let Some(role) = role.filter(|r| ROLES.contains(r)) else {
                    return Err(at(format!("{here}/role"), "must be system, developer, user or assistant"));
                };
                if role == "system" && !leading_run {
                    return Err(at(
                        format!("{here}/role"),
                        "a system inline block is allowed only in the leading run of slot and system blocks",
                    ));
                }
                let Some(text) = block.get("text").and_then(Value::as_str) else {
                    return Err(at(format!("{here}/text"), "is required and must be a string"));
                };
                if let Some(name) = unknown_macro(text, &variables) {
                    return Err(at(
                        format!("{here}/text"),
                        format!("{{{{{name}}}}} is neither a macro ({}) nor a declared variable", MACROS.join(", ")),
                    ));
                }
                stays_leading = role == "system";
            }
            "history" => {
                if history_seen {
                    return Err(at(&here, "history appears twice; a template has exactly one"));
                }
                history_seen = true;
                validate_history(block, &here)?;
            }
            "input" => input_seen = true,
            _ => {
                if !seen_once.insert(kind) {
                    return Err(at(format!("{here}/type"), format!("{kind} appears twice; it is placed at most once")));
                }
            }
        }
        leading_run = leading_run && stays_leading;
    }
    if !history_seen {
        return Err(at("/blocks", "needs exactly one history block"));
    }
    if !input_seen {
        return Err(at("/blocks", "needs exactly one input block, placed last"));
    }
    Ok(variables)
}

fn validate_variables(value: Option<&Value>) -> Result<Vec<String>, Pointed> {
    let variables = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(variables)) => variables,
        Some(_) => return Err(at("/variables", "must be an object of name: default string")),
    };
    if variables.len() > MAX_VARIABLES {
        return Err(at("/variables", format!("declares {}; at most 32 are allowed", variables.len())));
    }
    for (name, default) in variables {
        let here = format!("/variables/{}", token(name));
        if !VARIABLE_RE.is_match(name) {
            return Err(at(&here, "a variable name must match [a-z][a-z0-9_]*"));
        }
        if MACROS.contains(&name.as_str()) {
            return Err(at(&here, "a variable cannot take a built-in macro's name"));
        }
        if !default.is_string() {
            return Err(at(&here, "the default must be a string"));
        }
    }
    Ok(variables.keys().cloned().collect())
}

fn validate_history(block: &Map<String, Value>, here: &str) -> Result<(), Pointed> {
    if let Some(max) = block.get("max_entries")
        && !max.as_u64().is_some_and(|n| (1..=MAX_HISTORY_ENTRIES).contains(&n))
    {
        return Err(at(format!("{here}/max_entries"), "must be an integer from 1 through 200"));
    }
    let budget = match block.get("budget") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(budget)) => budget,
        Some(_) => return Err(at(format!("{here}/budget"), "must be an object {share?, min_tokens?, max_tokens?}")),
    };
    if let Some(key) = budget.keys().find(|k| !matches!(k.as_str(), "share" | "min_tokens" | "max_tokens")) {
        return Err(at(
            format!("{here}/budget/{}", token(key)),
            "unknown key; a budget takes share, min_tokens, max_tokens",
        ));
    }
    if let Some(share) = budget.get("share")
        && !share.as_f64().is_some_and(|s| s > 0.0 && s <= 1.0)
    {
        return Err(at(format!("{here}/budget/share"), "must be a number greater than 0 and at most 1"));
    }
    let tokens = |key: &str| -> Result<Option<u64>, Pointed> {
        match budget.get(key) {
            None => Ok(None),
            Some(value) => value
                .as_u64()
                .map(Some)
                .ok_or_else(|| at(format!("{here}/budget/{key}"), "must be a non-negative integer")),
        }
    };
    if let (Some(min), Some(max)) = (tokens("min_tokens")?, tokens("max_tokens")?)
        && min > max
    {
        return Err(at(format!("{here}/budget/min_tokens"), "must not exceed max_tokens"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use nexus_proto::ErrorCode;

    const M: &str = "configuration.prompt_mechanism";
    const T: &str = "configuration.prompt_template";

    fn assembly(template: Value) -> Result<Vec<String>, Refusal> {
        validate_prompt(Some(&json!("assembly")), Some(&template), M, T)
    }

    fn blocks(blocks: Value) -> Value {
        json!({"blocks": blocks})
    }

    #[test]
    fn mechanism_vocabulary() {
        for word in [json!(null), json!("raw"), json!("default"), json!("assembly")] {
            let template = blocks(json!([{"type": "history"}, {"type": "input"}]));
            assert_eq!(validate_prompt(Some(&word), Some(&template), M, T), Ok(Vec::new()));
        }
        for word in [json!("fancy"), json!(1), json!(["raw"])] {
            let refusal = validate_prompt(Some(&word), None, M, T).expect_err("refused");
            assert_eq!(refusal.code, ErrorCode::ValidationFailed);
            assert!(refusal.message.starts_with(M), "{}", refusal.message);
        }
    }

    #[test]
    fn assembly_needs_a_template_and_other_mechanisms_store_it_unread() {
        let refusal = validate_prompt(Some(&json!("assembly")), Some(&Value::Null), M, T).expect_err("refused");
        assert!(refusal.message.starts_with("configuration.prompt_template: prompt_template_missing"));
        assert_eq!(validate_prompt(Some(&json!("default")), Some(&json!({"blocks": "junk"})), M, T), Ok(Vec::new()));
        assert_eq!(validate_prompt(None, Some(&json!(7)), M, T), Ok(Vec::new()));
        let huge = json!({"blocks": "x".repeat(ENVELOPE_BOUND)});
        let refusal = validate_prompt(Some(&json!("raw")), Some(&huge), M, T).expect_err("over bound");
        assert!(refusal.message.starts_with(T));
    }

    #[test]
    fn template_grammar_refusals_name_a_json_pointer() {
        let inline = |role: &str, text: &str| json!({"type": "inline", "role": role, "text": text});
        let h = json!({"type": "history"});
        let i = json!({"type": "input"});
        let many: Vec<Value> = (0..65).map(|_| json!({"type": "lead"})).collect();
        let too_many_vars: Map<String, Value> = (0..33).map(|n| (format!("v{n}"), json!(""))).collect();
        let cases = [
            ("not_object", json!([]), "/: "),
            ("unknown_root_key", json!({"blocks": [h, i], "extra": 1}), "/extra: "),
            ("blocks_missing", json!({}), "/blocks: "),
            ("blocks_empty", blocks(json!([])), "/blocks: "),
            ("blocks_over_64", blocks(Value::Array(many)), "/blocks: "),
            ("block_not_object", blocks(json!([h, "x", i])), "/blocks/1: "),
            ("type_missing", blocks(json!([{}, h, i])), "/blocks/0/type: "),
            ("type_unknown", blocks(json!([{"type": "banner"}, h, i])), "/blocks/0/type: "),
            ("unknown_block_key", blocks(json!([h, {"type": "memory", "x": 1}, i])), "/blocks/1/x: "),
            ("slot_unknown", blocks(json!([{"type": "slot", "slot": "other"}, h, i])), "/blocks/0/slot: "),
            (
                "slot_twice",
                blocks(json!([{"type": "slot", "slot": "persona"}, {"type": "slot", "slot": "persona"}, h, i])),
                "/blocks/1/slot: ",
            ),
            ("slot_after_history", blocks(json!([h, {"type": "slot", "slot": "persona"}, i])), "/blocks/1: "),
            ("role_unknown", blocks(json!([inline("tool", "x"), h, i])), "/blocks/0/role: "),
            (
                "system_inline_after_user",
                blocks(json!([inline("user", "x"), inline("system", "y"), h, i])),
                "/blocks/1/role: ",
            ),
            ("system_inline_after_history", blocks(json!([h, inline("system", "y"), i])), "/blocks/1/role: "),
            ("text_missing", blocks(json!([{"type": "inline", "role": "user"}, h, i])), "/blocks/0/text: "),
            ("text_unknown_macro", blocks(json!([inline("user", "hi {{who}}"), h, i])), "/blocks/0/text: "),
            ("memory_twice", blocks(json!([{"type": "memory"}, {"type": "memory"}, h, i])), "/blocks/1/type: "),
            ("history_twice", blocks(json!([h, h, i])), "/blocks/1: "),
            ("history_missing", blocks(json!([i])), "/blocks: "),
            ("input_missing", blocks(json!([h])), "/blocks: "),
            ("input_not_last", blocks(json!([h, i, {"type": "tail"}])), "/blocks/2: "),
            ("input_twice", blocks(json!([h, i, i])), "/blocks/2: "),
            ("max_entries_zero", blocks(json!([{"type": "history", "max_entries": 0}, i])), "/blocks/0/max_entries: "),
            ("max_entries_201", blocks(json!([{"type": "history", "max_entries": 201}, i])), "/blocks/0/max_entries: "),
            (
                "max_entries_float",
                blocks(json!([{"type": "history", "max_entries": 2.0}, i])),
                "/blocks/0/max_entries: ",
            ),
            ("budget_not_object", blocks(json!([{"type": "history", "budget": 1}, i])), "/blocks/0/budget: "),
            ("budget_unknown_key", blocks(json!([{"type": "history", "budget": {"x": 1}}, i])), "/blocks/0/budget/x: "),
            ("share_zero", blocks(json!([{"type": "history", "budget": {"share": 0}}, i])), "/blocks/0/budget/share: "),
            (
                "share_over_one",
                blocks(json!([{"type": "history", "budget": {"share": 1.5}}, i])),
                "/blocks/0/budget/share: ",
            ),
            (
                "min_tokens_negative",
                blocks(json!([{"type": "history", "budget": {"min_tokens": -1}}, i])),
                "/blocks/0/budget/min_tokens: ",
            ),
            (
                "min_over_max",
                blocks(json!([{"type": "history", "budget": {"min_tokens": 9, "max_tokens": 2}}, i])),
                "/blocks/0/budget/min_tokens: ",
            ),
            ("variables_not_object", json!({"blocks": [h, i], "variables": []}), "/variables: "),
            ("variables_over_32", json!({"blocks": [h, i], "variables": too_many_vars}), "/variables: "),
            ("variable_bad_name", json!({"blocks": [h, i], "variables": {"Tone": ""}}), "/variables/Tone: "),
            ("variable_leading_digit", json!({"blocks": [h, i], "variables": {"1x": ""}}), "/variables/1x: "),
            ("variable_pointer_escaped", json!({"blocks": [h, i], "variables": {"a/b": ""}}), "/variables/a~1b: "),
            ("variable_is_macro", json!({"blocks": [h, i], "variables": {"date": ""}}), "/variables/date: "),
            ("variable_default_not_string", json!({"blocks": [h, i], "variables": {"tone": 1}}), "/variables/tone: "),
        ];
        for (name, template, pointer) in cases {
            let refusal = assembly(template).expect_err(name);
            assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{name}");
            let expected = format!("{T}: {pointer}");
            assert!(refusal.message.starts_with(&expected), "{name}: {} should start with {expected}", refusal.message);
        }
    }

    #[test]
    fn full_template_accepted_with_its_variables() {
        let template = json!({
            "blocks": [
                {"type": "slot", "slot": "system_prompt"},
                {"type": "inline", "role": "system", "text": "Today is {{date}}; tone {{tone}}."},
                {"type": "slot", "slot": "character"},
                {"type": "inline", "role": "developer", "text": "Kind: {{conversation_kind}}"},
                {"type": "slot", "slot": "persona"},
                {"type": "memory"}, {"type": "skills"}, {"type": "lead"},
                {"type": "history", "max_entries": 200, "budget": {"share": 0.5, "min_tokens": 0, "max_tokens": 4000}},
                {"type": "inline", "role": "user", "text": "{{agent}} for {{user}} in {{workspace}}"},
                {"type": "tail"},
                {"type": "input"}
            ],
            "variables": {"tone": "calm", "audience_2": ""}
        });
        let mut variables = assembly(template).expect("valid");
        variables.sort();
        assert_eq!(variables, vec!["audience_2".to_owned(), "tone".to_owned()]);
    }

    #[test]
    fn r58_macro_scan() {
        let vars = vec!["tone".to_owned()];
        assert_eq!(unknown_macro("You are {{agent}} on {{date}} ({{tone}})", &vars), None);
        assert_eq!(unknown_macro("{{user}} {{nope}} {{other}}", &vars), Some("nope"));
        assert_eq!(unknown_macro("{{ agent }}", &vars), Some(" agent "));
        assert_eq!(unknown_macro("{{}}", &vars), Some(""));
        assert_eq!(unknown_macro("a { single } and {{unclosed", &vars), None);
        assert_eq!(unknown_macro("{{{agent}}}", &vars), None);
        for name in MACROS {
            assert_eq!(unknown_macro(&format!("{{{{{name}}}}}"), &[]), None, "{name}");
        }
    }

    #[test]
    fn stored_configuration_variables_only_under_assembly() {
        let template = json!({"blocks": [{"type": "history"}, {"type": "input"}], "variables": {"tone": "x"}});
        let assembled = json!({"prompt_mechanism": "assembly", "prompt_template": template});
        assert_eq!(configuration_variables(&assembled), vec!["tone".to_owned()]);
        let default = json!({"prompt_mechanism": "default", "prompt_template": template});
        assert!(configuration_variables(&default).is_empty());
        assert!(configuration_variables(&Value::Null).is_empty());
    }
}
