//! Tool-name macros and a profile's spellings (`docs/declaration.md`, "Aliases" and
//! "Tool definitions").
//!
//! A description may name another kernel tool as `{{wire_name}}` (the regex
//! `\{\{([a-z][a-z0-9_]*)\}\}`). The catalog renders each macro with the tool's wire name; a
//! profile renders it with its own spelling of that tool, so an alias name replaces the kernel
//! wire name in every description of the set. A macro that names no kernel tool stays as written.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::catalog::{KernelTool, live};

/// How one tool set spells the kernel tools: the wire name of each kernel tool mapped to the
/// callable name its macros render to. A tool the set does not re-spell keeps its wire name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spellings {
    by_wire: BTreeMap<&'static str, String>,
}

impl Spellings {
    /// The catalog's own spellings: every macro renders to the wire name.
    pub fn catalog() -> Self {
        Spellings::default()
    }

    /// The spellings a list of tool entries declares.
    ///
    /// Each alias (an entry whose `canonical` names a live kernel tool and whose name, from
    /// `function.name` or top-level `name`, differs from the wire name) re-spells its kernel tool.
    /// When several aliases re-spell one kernel tool, the smallest name (byte order) wins, so the
    /// spelling does not depend on the order of the list. Entries that are not valid aliases are
    /// skipped; the grammar refuses them separately.
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = &'a Value>) -> Self {
        let mut by_wire: BTreeMap<&'static str, String> = BTreeMap::new();
        for entry in entries {
            let Some(tool) = entry.get("canonical").and_then(Value::as_str).and_then(live) else { continue };
            let name = entry.get("function").and_then(|f| f.get("name")).or_else(|| entry.get("name"));
            let Some(name) = name.and_then(Value::as_str).filter(|n| !n.is_empty() && *n != tool.name) else {
                continue;
            };
            match by_wire.get(tool.name) {
                Some(current) if current.as_str() <= name => {}
                _ => {
                    by_wire.insert(tool.name, name.to_owned());
                }
            }
        }
        Spellings { by_wire }
    }

    /// Whether every kernel tool keeps its wire name.
    pub fn is_catalog(&self) -> bool {
        self.by_wire.is_empty()
    }

    /// The spelling of a kernel tool, by wire name.
    pub fn of<'a>(&'a self, tool: &'a KernelTool) -> &'a str {
        self.by_wire.get(tool.name).map_or(tool.name, String::as_str)
    }

    /// Renders the macros of one text.
    pub fn render(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            match macro_at(after) {
                Some(name) => {
                    let tool = crate::catalog::CATALOG.iter().find(|t| t.name == name);
                    match tool {
                        Some(tool) => out.push_str(self.of(tool)),
                        None => {
                            out.push_str("{{");
                            out.push_str(name);
                            out.push_str("}}");
                        }
                    }
                    rest = &after[name.len() + 2..];
                }
                None => {
                    // Not a macro here: move on by one brace, as the regex would.
                    out.push('{');
                    rest = &rest[start + 1..];
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// Renders the macros of every `description` string inside a JSON value (a function block,
    /// its parameter schema and nested schemas).
    pub fn render_descriptions(&self, value: &Value) -> Value {
        match value {
            Value::Object(object) => {
                let mut out = Map::new();
                for (key, item) in object {
                    let rendered = match item {
                        Value::String(text) if key == "description" => Value::String(self.render(text)),
                        _ => self.render_descriptions(item),
                    };
                    out.insert(key.clone(), rendered);
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(|item| self.render_descriptions(item)).collect()),
            other => other.clone(),
        }
    }
}

/// The macro name at the start of `text` (just after `{{`): `[a-z][a-z0-9_]*` followed by `}}`.
fn macro_at(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    if !bytes.first().is_some_and(u8::is_ascii_lowercase) {
        return None;
    }
    let len = bytes.iter().take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || **b == b'_').count();
    text[len..].starts_with("}}").then(|| &text[..len])
}

/// The macro names a text carries, in order of appearance (duplicates kept).
pub fn macro_names(text: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        match macro_at(after) {
            Some(name) => {
                names.push(name);
                rest = &after[name.len() + 2..];
            }
            None => rest = &rest[start + 1..],
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn renders_kernel_macros_with_the_sets_spellings() {
        let catalog = Spellings::catalog();
        assert_eq!(catalog.render("use {{wait}} then {{ask}}"), "use wait then ask");
        let entries = [
            json!({"name": "Agent", "canonical": "nexus.graph.delegate_task"}),
            json!({"function": {"name": "Await"}, "canonical": "nexus.graph.wait"}),
            json!({"function": {"name": "Block"}, "canonical": "nexus.graph.wait"}),
            json!({"name": "skill", "canonical": "nexus.skill.load"}),
            json!({"name": "x", "canonical": "nexus.nope"}),
        ];
        let spellings = Spellings::from_entries(entries.iter());
        assert!(!spellings.is_catalog());
        assert_eq!(spellings.render("{{delegate_task}}, {{wait}}, {{skill}}"), "Agent, Await, skill");
        // Unknown names, malformed macros and uppercase stay as written.
        assert_eq!(spellings.render("{{agent}} {{ wait }} {{Wait}} {{wait"), "{{agent}} {{ wait }} {{Wait}} {{wait");
        assert_eq!(spellings.render("{{{wait}}}"), "{Await}");
        assert_eq!(macro_names("a {{wait}} b {{x_1}} {{9}}"), vec!["wait", "x_1"]);
        let schema = json!({"description": "see {{wait}}", "properties": {"a": {"description": "{{wait}}", "default": "{{wait}}"}}});
        assert_eq!(
            spellings.render_descriptions(&schema),
            json!({"description": "see Await", "properties": {"a": {"description": "Await", "default": "{{wait}}"}}})
        );
    }
}
