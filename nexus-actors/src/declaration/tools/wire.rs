//! The provider wire projection of a frozen tool set (`docs/declaration.md`, "Wire projection").

use serde_json::{Map, Value, json};

use super::*;

/// The provider wire projection of a frozen set (`docs/declaration.md`, "Wire projection"):
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
