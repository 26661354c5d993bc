//! The kernel catalog: canonical names, wire names, definitions and effect profiles
//! (`docs/declaration.md`, "Kernel imports": the nineteen tools).
//!
//! Each tool's `function_definition` is `{type:"function", function:{name, description,
//! parameters}}`: exactly what reaches a provider. Its `template` is the same block with the
//! tool-name macros unrendered; the `definition` renders them with the wire names. The catalog
//! endpoint (`GET /agent_api/v1/tools`) serves [`catalog_entries`].

use std::sync::LazyLock;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::effect::{EffectKind as K, EffectProfile, EffectScope as S, Idempotency as I, Reconciliation as R};
use crate::macros::Spellings;
use crate::templates::TEMPLATES;

/// One kernel tool's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelTool {
    /// `source.category.name`, e.g. `nexus.graph.delegate_task`.
    pub canonical_name: &'static str,
    /// The stored wire name, e.g. `delegate_task`. Stored, never derived.
    pub name: &'static str,
    /// Which effect-profile constant the tool carries.
    pub effect: Effect,
}

/// The catalog's named effect-profile constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// read_only / false / closed / intrinsic / none.
    ReadOnlyClosed,
    /// write / false / closed / intrinsic / lookup.
    GraphWrite,
    /// write / true / closed / intrinsic / lookup.
    MemoryWrite,
    /// MEMORY_WRITE with idempotency `none`.
    MemoryEdit,
}

impl Effect {
    /// The constant's profile.
    pub fn profile(self) -> EffectProfile {
        match self {
            Effect::ReadOnlyClosed => EffectProfile::new(K::ReadOnly, false, S::Closed, I::Intrinsic, R::None),
            Effect::GraphWrite => EffectProfile::new(K::Write, false, S::Closed, I::Intrinsic, R::Lookup),
            Effect::MemoryWrite => EffectProfile::new(K::Write, true, S::Closed, I::Intrinsic, R::Lookup),
            Effect::MemoryEdit => EffectProfile::new(K::Write, true, S::Closed, I::None, R::Lookup),
        }
    }
}

const fn tool(canonical_name: &'static str, name: &'static str, effect: Effect) -> KernelTool {
    KernelTool { canonical_name, name, effect }
}

/// Namespaces no executor may announce, in either spelling (`docs/protocol.md`, "Announce").
pub const RESERVED_NAMESPACES: [&str; 5] =
    ["nexus.graph", "nexus.human", "nexus.conversation", "nexus.tools", "nexus.runners"];

/// Every live kernel tool, in catalog order.
/// The first 19 are the origin's, byte for byte; `nexus.graph.join` is nexus's extension
/// (`docs/delegation.md`, "Joins").
pub const CATALOG: [KernelTool; 20] = [
    tool("nexus.graph.delegate_task", "delegate_task", Effect::GraphWrite),
    tool("nexus.graph.wait", "wait", Effect::GraphWrite),
    tool("nexus.human.ask", "ask", Effect::GraphWrite),
    tool("nexus.conversation.spawn", "spawn", Effect::GraphWrite),
    tool("nexus.conversation.send", "send", Effect::GraphWrite),
    tool("nexus.conversation.status", "status", Effect::ReadOnlyClosed),
    tool("nexus.conversation.cancel", "cancel", Effect::GraphWrite),
    tool("nexus.conversation.search", "session_search", Effect::ReadOnlyClosed),
    tool("nexus.conversation.read", "session_read", Effect::ReadOnlyClosed),
    tool("nexus.memory.read", "memory_read", Effect::ReadOnlyClosed),
    tool("nexus.memory.write", "memory_write", Effect::MemoryWrite),
    tool("nexus.memory.edit", "memory_edit", Effect::MemoryEdit),
    tool("nexus.memory.ls", "memory_ls", Effect::ReadOnlyClosed),
    tool("nexus.memory.grep", "memory_grep", Effect::ReadOnlyClosed),
    tool("nexus.memory.delete", "memory_delete", Effect::MemoryWrite),
    tool("nexus.skill.load", "skill", Effect::ReadOnlyClosed),
    tool("nexus.tools.search", "tool_search", Effect::ReadOnlyClosed),
    tool("nexus.tools.call", "tool_call", Effect::GraphWrite),
    tool("nexus.runners.list", "runners_list", Effect::ReadOnlyClosed),
    tool("nexus.graph.join", "join", Effect::GraphWrite),
];

/// Resolves a canonical name or a wire name to its kernel tool.
pub fn lookup(name: &str) -> Option<&'static KernelTool> {
    CATALOG.iter().find(|t| t.canonical_name == name || t.name == name)
}

/// Resolves a canonical name (only) to its live kernel tool.
pub fn live(canonical_name: &str) -> Option<&'static KernelTool> {
    CATALOG.iter().find(|t| t.canonical_name == canonical_name)
}

/// The canonical names of every live kernel tool, in catalog order.
pub fn live_names() -> impl Iterator<Item = &'static str> {
    CATALOG.iter().map(|t| t.canonical_name)
}

static PARSED_TEMPLATES: LazyLock<Vec<Value>> = LazyLock::new(|| {
    TEMPLATES.iter().map(|text| serde_json::from_str(text).expect("catalog templates are valid JSON")).collect()
});

static DEFINITIONS: LazyLock<Vec<Value>> = LazyLock::new(|| {
    let catalog = Spellings::catalog();
    PARSED_TEMPLATES.iter().map(|template| catalog.render_descriptions(template)).collect()
});

/// The JSON type of one kernel parameter, as its schema declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    /// `"string"` (also `["string","null"]`).
    String,
    /// `"boolean"`.
    Boolean,
    /// `"integer"`.
    Integer,
    /// `"array"`.
    Array,
    /// `"object"`.
    Object,
}

impl KernelTool {
    fn index(&self) -> usize {
        CATALOG.iter().position(|t| t.canonical_name == self.canonical_name).expect("a catalog tool")
    }

    /// The definition source, with tool-name macros unrendered:
    /// `{type:"function", function:{name, description, parameters}}`.
    pub fn template(&self) -> &'static Value {
        &PARSED_TEMPLATES[self.index()]
    }

    /// The catalog's `function_definition`: the template rendered with the wire names. These are
    /// the bytes an exact kernel entry must equal.
    pub fn definition(&self) -> &'static Value {
        &DEFINITIONS[self.index()]
    }

    /// The definition rendered with a tool set's spellings (the plain entry "re-spelled").
    pub fn render(&self, spellings: &Spellings) -> Value {
        spellings.render_descriptions(self.template())
    }

    /// The parameter schemas by name (`function.parameters.properties`).
    pub fn parameters(&self) -> &'static Map<String, Value> {
        static EMPTY: LazyLock<Map<String, Value>> = LazyLock::new(Map::new);
        self.template()["function"]["parameters"]["properties"].as_object().unwrap_or(&EMPTY)
    }

    /// The type of one parameter, or `None` when the tool has no such parameter.
    pub fn parameter_type(&self, parameter: &str) -> Option<ParamType> {
        let schema = self.parameters().get(parameter)?;
        let word = match &schema["type"] {
            Value::String(word) => word.as_str(),
            Value::Array(words) => words.iter().filter_map(Value::as_str).find(|w| *w != "null").unwrap_or("string"),
            _ => "string",
        };
        Some(match word {
            "boolean" => ParamType::Boolean,
            "integer" | "number" => ParamType::Integer,
            "array" => ParamType::Array,
            "object" => ParamType::Object,
            _ => ParamType::String,
        })
    }

    /// The tool's effect profile.
    pub fn effect_profile(&self) -> EffectProfile {
        self.effect.profile()
    }
}

/// One row of the catalog endpoint, `GET /agent_api/v1/tools` (`docs/declaration.md`, "Kernel
/// imports"): `{canonical_name, name, effect_profile, definition, template}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CatalogEntry {
    /// `source.category.name`.
    pub canonical_name: &'static str,
    /// The wire name.
    pub name: &'static str,
    /// The five-key effect profile.
    pub effect_profile: EffectProfile,
    /// The `function_definition`, macros rendered with the wire names.
    pub definition: Value,
    /// The definition source, macros unrendered.
    pub template: Value,
}

/// Every catalog row, in catalog order.
pub fn catalog_entries() -> Vec<CatalogEntry> {
    CATALOG
        .iter()
        .map(|tool| CatalogEntry {
            canonical_name: tool.canonical_name,
            name: tool.name,
            effect_profile: tool.effect_profile(),
            definition: tool.definition().clone(),
            template: tool.template().clone(),
        })
        .collect()
}

/// The catalog rows as one JSON array, the body of `GET /agent_api/v1/tools`.
pub fn catalog_json() -> Value {
    serde_json::to_value(catalog_entries()).unwrap_or_default()
}

/// The kernel tools this server runs when a model calls them, by canonical name
/// (`docs/kernel-tools.md`): the one list every declaration door checks, so that nothing the
/// server cannot run is ever offered to a model. Every live tool is served today; a tool added to
/// the catalog before it runs stays out of this list, and the doors refuse it.
pub const SERVED: [&str; 20] = [
    "nexus.graph.delegate_task",
    "nexus.graph.wait",
    "nexus.graph.join",
    "nexus.conversation.spawn",
    "nexus.conversation.send",
    "nexus.conversation.status",
    "nexus.conversation.cancel",
    "nexus.human.ask",
    "nexus.conversation.search",
    "nexus.conversation.read",
    "nexus.memory.read",
    "nexus.memory.write",
    "nexus.memory.edit",
    "nexus.memory.ls",
    "nexus.memory.grep",
    "nexus.memory.delete",
    "nexus.skill.load",
    "nexus.tools.search",
    "nexus.tools.call",
    "nexus.runners.list",
];

/// Whether this server runs the live kernel tool `canonical_name` ([`SERVED`]). A wire name, an
/// unknown name or a retired one is never served.
pub fn served(canonical_name: &str) -> bool {
    SERVED.contains(&canonical_name)
}

/// The reserved namespace a name belongs to, in either spelling: a canonical name under the
/// namespace, or the wire name of a tool under it.
pub fn reserved_namespace_of(name: &str) -> Option<&'static str> {
    let canonical = lookup(name).map_or(name, |t| t.canonical_name);
    RESERVED_NAMESPACES
        .iter()
        .copied()
        .find(|ns| canonical.strip_prefix(ns).is_some_and(|rest| rest.is_empty() || rest.starts_with('.')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_has_the_origins_nineteen_and_join_unique() {
        let mut names = std::collections::HashSet::new();
        for tool in CATALOG {
            assert!(names.insert(tool.name));
            assert!(names.insert(tool.canonical_name));
        }
        assert_eq!(names.len(), 40);
        assert_eq!(CATALOG[19].canonical_name, "nexus.graph.join");
    }

    #[test]
    fn every_tool_has_its_definition_and_schema() {
        for tool in CATALOG {
            let definition = tool.definition();
            assert_eq!(definition["type"], "function", "{}", tool.name);
            assert_eq!(definition["function"]["name"], tool.name);
            assert_eq!(
                definition["function"].as_object().map(Map::len),
                Some(3),
                "exactly name/description/parameters"
            );
            assert!(definition["function"]["description"].as_str().is_some_and(|d| !d.contains("{{")));
            assert_eq!(definition["function"]["parameters"]["type"], "object");
            for required in definition["function"]["parameters"]["required"].as_array().into_iter().flatten() {
                let required = required.as_str().expect("string");
                assert!(tool.parameters().contains_key(required), "{} requires unknown {required}", tool.name);
            }
        }
        let delegate = lookup("delegate_task").expect("live");
        assert!(delegate.template()["function"]["description"].as_str().expect("text").contains("{{wait}}"));
        assert!(delegate.definition()["function"]["description"].as_str().expect("text").contains(" wait "));
        assert_eq!(delegate.parameter_type("wait"), Some(ParamType::Boolean));
        assert_eq!(delegate.parameter_type("tools"), Some(ParamType::Array));
        assert_eq!(delegate.parameter_type("nope"), None);
        assert_eq!(delegate.definition()["function"]["parameters"]["additionalProperties"], false);
        assert_eq!(delegate.definition()["function"]["parameters"]["required"], serde_json::json!(["prompt"]));
        let search = lookup("nexus.conversation.search").expect("live");
        assert_eq!(search.parameters()["limit"]["minimum"], 1);
        assert_eq!(search.parameters()["limit"]["maximum"], 50);
        assert_eq!(search.parameters()["archived"]["enum"], serde_json::json!(["exclude", "include", "only"]));
        let tool_search = lookup("tool_search").expect("live");
        assert_eq!(tool_search.parameters()["limit"]["maximum"], 20);
        assert_eq!(tool_search.parameters()["limit"]["default"], 5);
        let spawn = lookup("spawn").expect("live");
        assert_eq!(spawn.parameter_type("default_runner_executor_public_id"), Some(ParamType::String));
        assert_eq!(
            lookup("runners_list").expect("live").definition()["function"]["parameters"],
            serde_json::json!({"type":"object","properties":{},"additionalProperties":false})
        );
        assert_eq!(live("skill"), None, "live resolves canonical names only");
        assert_eq!(live_names().count(), 20);
    }

    #[test]
    fn catalog_endpoint_rows() {
        let rows = catalog_json();
        let rows = rows.as_array().expect("array");
        assert_eq!(rows.len(), 20);
        let first = rows[0].as_object().expect("object");
        let keys: Vec<&str> = first.keys().map(String::as_str).collect();
        assert_eq!(keys, ["canonical_name", "definition", "effect_profile", "name", "template"]);
        assert_eq!(rows[0]["canonical_name"], "nexus.graph.delegate_task");
        assert_eq!(rows[0]["effect_profile"]["reconciliation"], "lookup");
        assert_eq!(rows[11]["effect_profile"]["idempotency"], "none", "memory_edit is MEMORY_EDIT");
        assert_ne!(rows[0]["template"], rows[0]["definition"]);
    }

    #[test]
    fn every_live_tool_is_served() {
        for name in SERVED {
            assert!(live(name).is_some(), "{name} is a live canonical name");
        }
        let unserved: Vec<&str> = live_names().filter(|name| !served(name)).collect();
        assert!(unserved.is_empty(), "{unserved:?}");
        assert!(!served("tool_call"), "canonical names only");
        assert!(!served("nexus.graph.compose"));
    }

    #[test]
    fn reserved_namespaces_in_either_spelling() {
        assert_eq!(reserved_namespace_of("delegate_task"), Some("nexus.graph"));
        assert_eq!(reserved_namespace_of("nexus.human.ask"), Some("nexus.human"));
        assert_eq!(reserved_namespace_of("runners_list"), Some("nexus.runners"));
        assert_eq!(reserved_namespace_of("nexus.tools.anything"), Some("nexus.tools"));
        // Memory is overridable and skill is routed by source: neither is reserved.
        assert_eq!(reserved_namespace_of("memory_read"), None);
        assert_eq!(reserved_namespace_of("skill"), None);
        assert_eq!(reserved_namespace_of("bash"), None);
    }
}
