//! The alias grammar: a profile's own spelling of a kernel tool (`docs/declaration.md`,
//! "Aliases" and "Refusal order", pass 4).
//!
//! An alias is a tool entry carrying `canonical`. Its compact input is
//! `{name | function:{name}, canonical, params?, omit?, description?, defer_loading?}`:
//! - `params` maps each alias parameter name to `{maps_to, invert?, description?}`, a kernel
//!   parameter (an inverted parameter negates a boolean and needs its own description);
//! - `omit` lists kernel parameters the alias never exposes;
//! - `description` replaces the kernel's text.
//!
//! The stored form is the alias rendered as a full function block with its facts beside it; a
//! `function` block beyond `{name}` in the input must equal that render. A call made under the
//! alias runs under the kernel's wire name with its input mapped ([`resolve_call`]).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::catalog::{KernelTool, ParamType, live, lookup};
use crate::macros::Spellings;

/// The refusal words of the alias grammar (each a 422 `validation_failed` naming the word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AliasWord {
    /// A malformed shape: a bad name, a non-string description, a non-array `omit`, a `params`
    /// that is not a map of objects, a non-boolean `invert`.
    Invalid,
    /// `canonical` names no live kernel tool.
    AliasCanonicalUnknown,
    /// The alias name is a kernel name that resolves to a different kernel tool.
    AliasNameReserved,
    /// `maps_to` or `omit` names no kernel parameter, two parameters map to one target, a target
    /// is omitted, or an alias parameter shadows a kernel parameter the alias keeps.
    AliasParamUnknown,
    /// `invert` on a kernel parameter that is not a boolean.
    AliasInvertNeedsBoolean,
    /// `invert` without the parameter's own description.
    AliasParamDescriptionRequired,
    /// A `function` block beyond `{name}` that does not equal the render.
    KernelToolRedefined,
}

impl AliasWord {
    /// The spec's word.
    pub fn as_str(self) -> &'static str {
        match self {
            AliasWord::Invalid => "invalid",
            AliasWord::AliasCanonicalUnknown => "alias_canonical_unknown",
            AliasWord::AliasNameReserved => "alias_name_reserved",
            AliasWord::AliasParamUnknown => "alias_param_unknown",
            AliasWord::AliasInvertNeedsBoolean => "alias_invert_needs_boolean",
            AliasWord::AliasParamDescriptionRequired => "alias_param_description_required",
            AliasWord::KernelToolRedefined => "kernel_tool_redefined",
        }
    }
}

/// Why an entry is not a lawful alias: the word and a sentence naming the part at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {detail}", word.as_str())]
pub struct AliasError {
    /// The refusal word.
    pub word: AliasWord,
    /// What is wrong.
    pub detail: String,
}

fn refuse(word: AliasWord, detail: impl Into<String>) -> AliasError {
    AliasError { word, detail: detail.into() }
}

/// One alias parameter: the kernel parameter it stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AliasParam {
    /// The kernel parameter.
    pub maps_to: String,
    /// Whether a boolean is negated on the way to the kernel.
    pub invert: bool,
    /// The alias parameter's own description, replacing the kernel's.
    pub description: Option<String>,
}

/// A parsed alias entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Alias {
    /// The alias's callable name.
    pub name: String,
    /// The kernel tool it spells.
    pub tool: &'static KernelTool,
    /// Alias parameter name to kernel parameter.
    pub params: BTreeMap<String, AliasParam>,
    /// Kernel parameters never exposed.
    pub omit: Vec<String>,
    /// The description replacing the kernel's text (macros unrendered).
    pub description: Option<String>,
}

/// Whether an entry is an alias (it carries `canonical`).
pub fn is_alias(entry: &Value) -> bool {
    entry.get("canonical").is_some()
}

/// An entry's name: `function.name`, falling back to top-level `name`.
fn raw_name(entry: &Value) -> Option<&Value> {
    entry.get("function").and_then(|f| f.get("name")).or_else(|| entry.get("name"))
}

impl Alias {
    /// Parses an alias entry, checking the refusals of pass 4 in order (`docs/declaration.md`,
    /// "Refusal order"), except the final `function`-block comparison, which needs the set's
    /// spellings ([`Alias::check_function`]).
    ///
    /// # Errors
    /// [`AliasError`] with the first refusal word that applies.
    pub fn parse(entry: &Value) -> Result<Alias, AliasError> {
        let Some(name) = raw_name(entry)
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty() && n.chars().count() <= 128 && !n.contains('\0'))
        else {
            return Err(refuse(
                AliasWord::Invalid,
                "the alias name must be a string of 1 to 128 characters without NUL",
            ));
        };
        let canonical = entry.get("canonical").and_then(Value::as_str);
        let Some(tool) = canonical.and_then(live) else {
            let shown = entry.get("canonical").map(Value::to_string).unwrap_or_default();
            return Err(refuse(
                AliasWord::AliasCanonicalUnknown,
                format!("canonical {shown} is not a live kernel tool's canonical name"),
            ));
        };
        if let Some(named) = lookup(name)
            && named.canonical_name != tool.canonical_name
        {
            return Err(refuse(
                AliasWord::AliasNameReserved,
                format!(
                    "{name} is the kernel tool {}; it cannot point to {}",
                    named.canonical_name, tool.canonical_name
                ),
            ));
        }
        let description = match entry.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(text.clone()),
            Some(_) => return Err(refuse(AliasWord::Invalid, "description must be a string")),
        };
        let kernel_params = tool.parameters();
        let omit: Vec<String> = match entry.get("omit") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => {
                let mut omit = Vec::new();
                for item in items {
                    let Some(param) = item.as_str() else {
                        return Err(refuse(AliasWord::Invalid, "omit must be an array of strings"));
                    };
                    if !kernel_params.contains_key(param) {
                        return Err(refuse(
                            AliasWord::AliasParamUnknown,
                            format!("omit names {param}, which is not a parameter of {}", tool.canonical_name),
                        ));
                    }
                    omit.push(param.to_owned());
                }
                omit
            }
            Some(_) => return Err(refuse(AliasWord::Invalid, "omit must be an array of strings")),
        };
        let params = match entry.get("params") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(params)) => parse_params(tool, params, &omit)?,
            Some(_) => return Err(refuse(AliasWord::Invalid, "params must be an object of parameter objects")),
        };
        Ok(Alias { name: name.to_owned(), tool, params, omit, description })
    }

    /// The alias as a full function block `{name, description, parameters}`: parameters renamed,
    /// omitted ones removed, an inverted boolean's default negated, descriptions replaced, and
    /// every description's macros rendered with `spellings`.
    pub fn render_function(&self, spellings: &Spellings) -> Value {
        let template = &self.tool.template()["function"];
        let kernel_parameters = &template["parameters"];
        let alias_of: BTreeMap<&str, (&str, &AliasParam)> =
            self.params.iter().map(|(alias, param)| (param.maps_to.as_str(), (alias.as_str(), param))).collect();
        let mut properties = Map::new();
        for (kernel, schema) in self.tool.parameters() {
            if self.omit.contains(kernel) {
                continue;
            }
            match alias_of.get(kernel.as_str()) {
                Some((alias, param)) => {
                    let mut schema = schema.clone();
                    if let Some(object) = schema.as_object_mut() {
                        if param.invert
                            && let Some(Value::Bool(default)) = object.get("default")
                        {
                            let negated = !*default;
                            object.insert("default".into(), Value::Bool(negated));
                        }
                        if let Some(description) = &param.description {
                            object.insert("description".into(), Value::String(description.clone()));
                        }
                    }
                    properties.insert((*alias).to_owned(), schema);
                }
                None => {
                    properties.insert(kernel.clone(), schema.clone());
                }
            }
        }
        let mut parameters = kernel_parameters.as_object().cloned().unwrap_or_default();
        parameters.insert("properties".into(), Value::Object(properties));
        if let Some(required) = kernel_parameters.get("required").and_then(Value::as_array) {
            let renamed: Vec<Value> = required
                .iter()
                .filter_map(Value::as_str)
                .filter(|kernel| !self.omit.iter().any(|o| o == kernel))
                .map(|kernel| json!(alias_of.get(kernel).map_or(kernel, |(alias, _)| *alias)))
                .collect();
            parameters.insert("required".into(), Value::Array(renamed));
        }
        let description = self.description.clone().map_or_else(|| template["description"].clone(), Value::String);
        let function = json!({
            "name": self.name,
            "description": description,
            "parameters": Value::Object(parameters),
        });
        spellings.render_descriptions(&function)
    }

    /// Checks the entry's `function` block: `{name}` alone (or no block) is the compact input;
    /// anything more must equal [`Alias::render_function`] exactly.
    ///
    /// # Errors
    /// `kernel_tool_redefined` for a block that differs from the render; `invalid` for a
    /// `function` that is not an object.
    pub fn check_function(&self, entry: &Value, spellings: &Spellings) -> Result<(), AliasError> {
        let Some(function) = entry.get("function") else { return Ok(()) };
        let Some(block) = function.as_object() else {
            return Err(refuse(AliasWord::Invalid, "function must be an object"));
        };
        if block.keys().all(|key| key == "name") {
            return Ok(());
        }
        if *function != self.render_function(spellings) {
            return Err(refuse(
                AliasWord::KernelToolRedefined,
                format!(
                    "the function block of {} differs from its render; send only {{\"name\"}} with the alias facts",
                    self.name
                ),
            ));
        }
        Ok(())
    }

    /// The stored form: `{type:"function", function:<render>, canonical, ...facts}`. The facts
    /// (`params`, `omit`, `description`, `defer_loading` and any other top-level key) are kept as
    /// authored; a top-level `name` moves into the function block.
    pub fn render_entry(&self, entry: &Value, spellings: &Spellings) -> Value {
        let mut out = entry.as_object().cloned().unwrap_or_default();
        out.remove("name");
        out.insert("type".into(), json!("function"));
        out.insert("canonical".into(), json!(self.tool.canonical_name));
        out.insert("function".into(), self.render_function(spellings));
        Value::Object(out)
    }

    /// Rewrites an input made under the alias into the kernel's input: a mapped key moves to its
    /// `maps_to` (a boolean negated under `invert`; a non-boolean moves unchanged), omitted keys
    /// are dropped, other keys pass. A mapped key wins over the same kernel key passed directly.
    pub fn map_input(&self, input: &Value) -> Value {
        let Some(object) = input.as_object() else { return input.clone() };
        let mut out = Map::new();
        let mut mapped = Vec::new();
        for (key, value) in object {
            if let Some(param) = self.params.get(key) {
                let value = match value {
                    Value::Bool(flag) if param.invert => Value::Bool(!flag),
                    other => other.clone(),
                };
                mapped.push((param.maps_to.clone(), value));
            } else if !self.omit.contains(key) {
                out.insert(key.clone(), value.clone());
            }
        }
        out.extend(mapped);
        Value::Object(out)
    }
}

fn parse_params(
    tool: &KernelTool,
    params: &Map<String, Value>,
    omit: &[String],
) -> Result<BTreeMap<String, AliasParam>, AliasError> {
    let kernel_params = tool.parameters();
    if let Some((key, _)) = params.iter().find(|(_, v)| !v.is_object()) {
        return Err(refuse(AliasWord::Invalid, format!("params.{key} must be an object")));
    }
    let targets: BTreeSet<&str> = params.values().filter_map(|p| p.get("maps_to").and_then(Value::as_str)).collect();
    let mut seen = BTreeSet::new();
    let mut out = BTreeMap::new();
    for (key, param) in params {
        let Some(maps_to) = param.get("maps_to").and_then(Value::as_str).filter(|t| kernel_params.contains_key(*t))
        else {
            return Err(refuse(
                AliasWord::AliasParamUnknown,
                format!("params.{key}.maps_to must name a parameter of {}", tool.canonical_name),
            ));
        };
        if !seen.insert(maps_to) {
            return Err(refuse(AliasWord::AliasParamUnknown, format!("params.{key}: {maps_to} is mapped twice")));
        }
        if omit.iter().any(|o| o == maps_to) {
            return Err(refuse(AliasWord::AliasParamUnknown, format!("params.{key}: {maps_to} is also omitted")));
        }
        let kept = kernel_params.contains_key(key.as_str())
            && !omit.iter().any(|o| o == key)
            && !targets.contains(key.as_str());
        if kept {
            return Err(refuse(
                AliasWord::AliasParamUnknown,
                format!("params.{key} shadows the kernel parameter {key}, which the alias keeps"),
            ));
        }
        let invert = match param.get("invert") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(flag)) => *flag,
            Some(_) => return Err(refuse(AliasWord::Invalid, format!("params.{key}.invert must be true or false"))),
        };
        let description = match param.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(text.clone()),
            Some(_) => return Err(refuse(AliasWord::Invalid, format!("params.{key}.description must be a string"))),
        };
        if invert {
            if tool.parameter_type(maps_to) != Some(ParamType::Boolean) {
                return Err(refuse(
                    AliasWord::AliasInvertNeedsBoolean,
                    format!("params.{key}: {maps_to} is not a boolean and cannot be inverted"),
                ));
            }
            if description.as_deref().is_none_or(str::is_empty) {
                return Err(refuse(
                    AliasWord::AliasParamDescriptionRequired,
                    format!("params.{key} inverts {maps_to} and needs its own description"),
                ));
            }
        }
        out.insert(key.clone(), AliasParam { maps_to: maps_to.to_owned(), invert, description });
    }
    Ok(out)
}

/// Validates an alias entry against a set's spellings and returns its stored form.
///
/// # Errors
/// [`AliasError`] with the first refusal of pass 4 (`docs/declaration.md`, "Refusal order").
pub fn canonicalize_alias(entry: &Value, spellings: &Spellings) -> Result<Value, AliasError> {
    let alias = Alias::parse(entry)?;
    alias.check_function(entry, spellings)?;
    Ok(alias.render_entry(entry, spellings))
}

/// Where one model call goes (`docs/declaration.md`, "Aliases").
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedCall {
    /// The name the call runs under: a kernel wire name, a runner's served name, or the callable.
    pub wire_name: String,
    /// The input, rewritten for an alias.
    pub input: Value,
    /// The callable name the model used, when it differs from `wire_name` (recorded as
    /// `tool_alias` on the inbox row and as the transcript's `name`).
    pub alias: Option<String>,
}

/// Resolves a call the model made to a stored entry:
/// - a runner callable runs under `route.tool_name` (the callable name is the alias unless equal);
/// - an alias runs under the kernel wire name with its input mapped ([`Alias::map_input`]); the
///   alias spelling is returned beside it (`None` for an identity declaration);
/// - anything else passes through unchanged.
pub fn resolve_call(entry: &Value, input: &Value) -> ResolvedCall {
    let name = raw_name(entry).and_then(Value::as_str).unwrap_or_default().to_owned();
    if let Some(served) = entry.get("route").and_then(|r| r.get("tool_name")).and_then(Value::as_str) {
        let alias = (served != name).then_some(name);
        return ResolvedCall { wire_name: served.to_owned(), input: input.clone(), alias };
    }
    if is_alias(entry)
        && let Ok(alias) = Alias::parse(entry)
    {
        let wire_name = alias.tool.name.to_owned();
        let spelled = (alias.name != wire_name).then(|| alias.name.clone());
        return ResolvedCall { wire_name, input: alias.map_input(input), alias: spelled };
    }
    ResolvedCall { wire_name: name, input: input.clone(), alias: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> Value {
        json!({"name": "Agent", "canonical": "nexus.graph.delegate_task", "description": "Hand work to a helper; collect it with {{wait}}.",
               "omit": ["model"],
               "params": {"run_in_background": {"maps_to": "wait", "invert": true, "description": "true runs the task in the background."},
                          "task": {"maps_to": "prompt"}}})
    }

    /// One row per refusal: (requirement, entry, word).
    #[test]
    fn r20_alias_refusals() {
        let rows: Vec<(&str, Value, &str)> = vec![
            ("name missing", json!({"canonical": "nexus.skill.load"}), "invalid"),
            ("name too long", json!({"name": "a".repeat(129), "canonical": "nexus.skill.load"}), "invalid"),
            ("canonical unknown", json!({"name": "x", "canonical": "nexus.graph.compose"}), "alias_canonical_unknown"),
            ("canonical is a wire name", json!({"name": "x", "canonical": "skill"}), "alias_canonical_unknown"),
            ("canonical not a string", json!({"name": "x", "canonical": 3}), "alias_canonical_unknown"),
            (
                "reserved re-pointed",
                json!({"name": "wait", "canonical": "nexus.graph.delegate_task"}),
                "alias_name_reserved",
            ),
            (
                "reserved canonical spelling re-pointed",
                json!({"name": "nexus.human.ask", "canonical": "nexus.skill.load"}),
                "alias_name_reserved",
            ),
            (
                "description not a string",
                json!({"name": "x", "canonical": "nexus.skill.load", "description": 1}),
                "invalid",
            ),
            ("omit not an array", json!({"name": "x", "canonical": "nexus.skill.load", "omit": "name"}), "invalid"),
            (
                "omit unknown",
                json!({"name": "x", "canonical": "nexus.skill.load", "omit": ["nope"]}),
                "alias_param_unknown",
            ),
            ("params not a map", json!({"name": "x", "canonical": "nexus.skill.load", "params": []}), "invalid"),
            (
                "param not an object",
                json!({"name": "x", "canonical": "nexus.skill.load", "params": {"n": "name"}}),
                "invalid",
            ),
            (
                "maps_to unknown",
                json!({"name": "x", "canonical": "nexus.skill.load", "params": {"n": {"maps_to": "nope"}}}),
                "alias_param_unknown",
            ),
            (
                "maps_to missing",
                json!({"name": "x", "canonical": "nexus.skill.load", "params": {"n": {}}}),
                "alias_param_unknown",
            ),
            (
                "targets not unique",
                json!({"name": "x", "canonical": "nexus.memory.write", "params": {"a": {"maps_to": "path"}, "b": {"maps_to": "path"}}}),
                "alias_param_unknown",
            ),
            (
                "target omitted",
                json!({"name": "x", "canonical": "nexus.memory.write", "omit": ["path"], "params": {"a": {"maps_to": "path"}}}),
                "alias_param_unknown",
            ),
            (
                "key shadows a kept parameter",
                json!({"name": "x", "canonical": "nexus.memory.write", "params": {"content": {"maps_to": "path"}}}),
                "alias_param_unknown",
            ),
            (
                "invert not boolean-typed",
                json!({"name": "x", "canonical": "nexus.memory.write", "params": {"p": {"maps_to": "path", "invert": true, "description": "d"}}}),
                "alias_invert_needs_boolean",
            ),
            (
                "invert not a boolean",
                json!({"name": "x", "canonical": "nexus.graph.delegate_task", "params": {"bg": {"maps_to": "wait", "invert": "yes"}}}),
                "invalid",
            ),
            (
                "invert without description",
                json!({"name": "x", "canonical": "nexus.graph.delegate_task", "params": {"bg": {"maps_to": "wait", "invert": true}}}),
                "alias_param_description_required",
            ),
            (
                "function block redefined",
                json!({"type": "function", "function": {"name": "x", "description": "other"}, "canonical": "nexus.skill.load"}),
                "kernel_tool_redefined",
            ),
            (
                "function not an object",
                json!({"name": "x", "function": "x", "canonical": "nexus.skill.load"}),
                "invalid",
            ),
        ];
        for (row, entry, word) in rows {
            let error = canonicalize_alias(&entry, &Spellings::catalog()).expect_err(row);
            assert_eq!(error.word.as_str(), word, "{row}: {error}");
            assert!(error.to_string().starts_with(word), "{row}");
        }
    }

    #[test]
    fn r23_compact_and_identity_aliases() {
        let compact =
            json!({"type":"function","function":{"name":"skill"},"canonical":"nexus.skill.load","defer_loading":true});
        let stored = canonicalize_alias(&compact, &Spellings::catalog()).expect("lawful");
        let skill = lookup("skill").expect("live");
        assert_eq!(stored["function"], skill.definition()["function"]);
        assert_eq!(stored["defer_loading"], true);
        assert_eq!(stored["canonical"], "nexus.skill.load");
        // The stored form is itself lawful and canonicalizes to itself.
        assert_eq!(canonicalize_alias(&stored, &Spellings::catalog()).expect("lawful"), stored);
        // The exact catalog block under `function` is the render too.
        let full = json!({"type":"function","function": skill.definition()["function"].clone(),"canonical":"nexus.skill.load"});
        assert!(canonicalize_alias(&full, &Spellings::catalog()).is_ok());
    }

    #[test]
    fn r21_r22_render_and_resolve() {
        let entry = agent();
        let spellings = Spellings::from_entries([&entry]);
        let stored = canonicalize_alias(&entry, &spellings).expect("lawful");
        let function = &stored["function"];
        assert_eq!(function["name"], "Agent");
        assert_eq!(function["description"], "Hand work to a helper; collect it with wait.");
        let properties = function["parameters"]["properties"].as_object().expect("properties");
        let names: Vec<&str> = properties.keys().map(String::as_str).collect();
        assert_eq!(names, ["lifetime", "run_in_background", "task", "tools", "wake"]);
        assert_eq!(properties["run_in_background"]["default"], true, "the inverted default is negated");
        assert_eq!(properties["run_in_background"]["type"], "boolean");
        assert_eq!(properties["run_in_background"]["description"], "true runs the task in the background.");
        assert_eq!(function["parameters"]["required"], json!(["task"]));
        assert_eq!(function["parameters"]["additionalProperties"], false);
        assert_eq!(stored["omit"], json!(["model"]));
        assert!(stored.get("name").is_none(), "the name lives in the function block");
        assert_eq!(canonicalize_alias(&stored, &spellings).expect("idempotent"), stored);

        // A wait alias re-spells the macro in the delegate alias's description.
        let wait = json!({"name": "Await", "canonical": "nexus.graph.wait"});
        let spellings = Spellings::from_entries([&entry, &wait]);
        let stored = canonicalize_alias(&entry, &spellings).expect("lawful");
        assert_eq!(stored["function"]["description"], "Hand work to a helper; collect it with Await.");

        let call = resolve_call(
            &stored,
            &json!({"task": "summarize", "run_in_background": false, "model": "x/y", "wake": "auto"}),
        );
        assert_eq!(call.wire_name, "delegate_task");
        assert_eq!(call.alias.as_deref(), Some("Agent"));
        assert_eq!(call.input, json!({"prompt": "summarize", "wait": true, "wake": "auto"}));
        // A non-boolean under invert moves unchanged.
        let call = resolve_call(&stored, &json!({"task": "t", "run_in_background": "no"}));
        assert_eq!(call.input, json!({"prompt": "t", "wait": "no"}));

        let routed = json!({"type":"function","function":{"name":"bash2"},"route":{"kind":"runner","runner_executor_public_id":"00000000-0000-4000-8000-000000000001","tool_name":"bash"}});
        let call = resolve_call(&routed, &json!({"command": "ls"}));
        assert_eq!((call.wire_name.as_str(), call.alias.as_deref()), ("bash", Some("bash2")));
        let plain = json!({"type":"function","function":{"name":"deploy"}});
        let call = resolve_call(&plain, &json!({"a": 1}));
        assert_eq!((call.wire_name.as_str(), call.alias, call.input), ("deploy", None, json!({"a": 1})));
        let identity = json!({"function":{"name":"skill"},"canonical":"nexus.skill.load"});
        assert_eq!(resolve_call(&identity, &json!({"name": "s"})).alias, None);
    }
}
