//! `memory_context_limit` and `conversation_reach` (`docs/declaration.md`, "Memory limits").
//!
//! A limit is `null` (no ceiling) or `{bindings:[…]}`; `{"bindings":[]}` admits no memory. A
//! non-empty limit uses natural roots only: each binding is `{name, scope, access}` with `name`
//! equal to its `scope`, no `conversation_public_id` or `speaker_public_id`, and the
//! `conversation` root among them.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use nexus_proto::Refusal;

use super::invalid;

/// The memory scopes a binding may name (the stored grammar's three plus `speaker`).
pub const MEMORY_SCOPES: [&str; 4] = ["conversation", "workspace", "user", "speaker"];
/// A memory context holds at most this many bindings.
pub const MAX_BINDINGS: usize = 16;
/// The conversation reach words; null means `workspace`.
pub const CONVERSATION_REACHES: [&str; 2] = ["workspace", "subtree"];

/// Validates `memory_context_limit`.
///
/// # Errors
/// 422 `validation_failed` naming `field`, `field.bindings` or `field.bindings[i].key`.
pub(super) fn validate_memory_limit(value: Option<&Value>, field: &str) -> Result<(), Refusal> {
    let limit = match value {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(limit)) => limit,
        Some(_) => return Err(invalid(field, "must be null or an object {bindings:[…]}")),
    };
    if let Some(key) = limit.keys().find(|k| *k != "bindings") {
        return Err(invalid(&format!("{field}.{key}"), "unknown key; a memory limit takes only bindings"));
    }
    let bindings_field = format!("{field}.bindings");
    let Some(bindings) = limit.get("bindings").and_then(Value::as_array) else {
        return Err(invalid(&bindings_field, "is required and must be an array ([] admits no memory)"));
    };
    if bindings.len() > MAX_BINDINGS {
        return Err(invalid(&bindings_field, format!("has {} bindings; at most 16 are allowed", bindings.len())));
    }
    let mut names = HashSet::new();
    for (i, binding) in bindings.iter().enumerate() {
        let at = format!("{bindings_field}[{i}]");
        let Some(binding) = binding.as_object() else {
            return Err(invalid(&at, "must be an object {name, scope, access}"));
        };
        for id in ["conversation_public_id", "speaker_public_id"] {
            if binding.contains_key(id) {
                return Err(invalid(&format!("{at}.{id}"), "a memory limit names natural roots only; remove the id"));
            }
        }
        if let Some(key) = binding.keys().find(|k| !matches!(k.as_str(), "name" | "scope" | "access")) {
            return Err(invalid(&format!("{at}.{key}"), "unknown key; a binding takes name, scope and access"));
        }
        let scope = binding.get("scope").and_then(Value::as_str);
        let Some(scope) = scope.filter(|s| MEMORY_SCOPES.contains(s)) else {
            return Err(invalid(&format!("{at}.scope"), "must be conversation, workspace, user or speaker"));
        };
        if binding.get("name").and_then(Value::as_str) != Some(scope) {
            return Err(invalid(&format!("{at}.name"), format!("must equal its scope ({scope}): natural roots only")));
        }
        if !names.insert(scope) {
            return Err(invalid(&format!("{at}.name"), format!("{scope} is bound twice")));
        }
        if !binding.get("access").and_then(Value::as_str).is_some_and(|a| matches!(a, "read" | "read_write")) {
            return Err(invalid(&format!("{at}.access"), "must be read or read_write"));
        }
    }
    if !bindings.is_empty() && !names.contains("conversation") {
        return Err(invalid(&bindings_field, "a non-empty limit must include the conversation root"));
    }
    Ok(())
}

/// Validates `conversation_reach`: `workspace`, `subtree` or null.
///
/// # Errors
/// 422 `validation_failed` naming `field`.
pub(super) fn validate_reach(value: Option<&Value>, field: &str) -> Result<(), Refusal> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(reach)) if CONVERSATION_REACHES.contains(&reach.as_str()) => Ok(()),
        Some(_) => Err(invalid(field, "must be workspace, subtree or null")),
    }
}

/// The conversations an execution's history tools and conversation addressing reach (R37;
/// `docs/kernel-tools.md`, "session_search and session_read"). Never another Agent's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConversationReach {
    /// The Agent's own conversations (`workspace`, and what null or omission mean).
    #[default]
    Workspace,
    /// The current conversation and its descendants (`subtree`).
    Subtree,
}

impl ConversationReach {
    /// The reach a validated configuration declares: `subtree` when it says so, else
    /// `workspace` (null, omitted).
    #[must_use]
    pub fn declared(configuration: &Value) -> ConversationReach {
        match configuration.get("conversation_reach").and_then(Value::as_str) {
            Some("subtree") => ConversationReach::Subtree,
            _ => ConversationReach::Workspace,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use nexus_proto::ErrorCode;

    const F: &str = "configuration.memory_context_limit";

    fn root(name: &str, scope: &str, access: &str) -> Value {
        json!({"name": name, "scope": scope, "access": access})
    }

    #[test]
    fn r34_r35_limit_refusals() {
        let conv = root("conversation", "conversation", "read_write");
        let too_many: Vec<Value> = (0..17).map(|_| conv.clone()).collect();
        let cases = [
            ("not_object", json!([]), F),
            ("unknown_key", json!({"bindings": [], "extra": 1}), "configuration.memory_context_limit.extra"),
            ("bindings_missing", json!({}), "configuration.memory_context_limit.bindings"),
            ("bindings_not_array", json!({"bindings": {}}), "configuration.memory_context_limit.bindings"),
            ("over_16", json!({"bindings": too_many}), "configuration.memory_context_limit.bindings"),
            (
                "binding_not_object",
                json!({"bindings": ["conversation"]}),
                "configuration.memory_context_limit.bindings[0]",
            ),
            (
                "r35_conversation_public_id",
                json!({"bindings": [{"name": "conversation", "scope": "conversation", "access": "read", "conversation_public_id": "00000000-0000-0000-0000-000000000000"}]}),
                "configuration.memory_context_limit.bindings[0].conversation_public_id",
            ),
            (
                "r35_speaker_public_id",
                json!({"bindings": [conv, {"name": "speaker", "scope": "speaker", "access": "read", "speaker_public_id": "x"}]}),
                "configuration.memory_context_limit.bindings[1].speaker_public_id",
            ),
            (
                "r35_name_not_scope",
                json!({"bindings": [conv, root("notes", "workspace", "read")]}),
                "configuration.memory_context_limit.bindings[1].name",
            ),
            (
                "scope_unknown",
                json!({"bindings": [conv, root("team", "team", "read")]}),
                "configuration.memory_context_limit.bindings[1].scope",
            ),
            (
                "access_outside",
                json!({"bindings": [root("conversation", "conversation", "write")]}),
                "configuration.memory_context_limit.bindings[0].access",
            ),
            (
                "duplicate_root",
                json!({"bindings": [conv, conv]}),
                "configuration.memory_context_limit.bindings[1].name",
            ),
            (
                "unknown_binding_key",
                json!({"bindings": [{"name": "conversation", "scope": "conversation", "access": "read", "x": 1}]}),
                "configuration.memory_context_limit.bindings[0].x",
            ),
            (
                "r35_needs_conversation_root",
                json!({"bindings": [root("workspace", "workspace", "read")]}),
                "configuration.memory_context_limit.bindings: a non-empty",
            ),
        ];
        for (name, limit, prefix) in cases {
            let refusal = validate_memory_limit(Some(&limit), F).expect_err(name);
            assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{name}");
            assert!(refusal.message.starts_with(prefix), "{name}: {} should start with {prefix}", refusal.message);
        }
    }

    #[test]
    fn r34_limits_accepted() {
        let spec_example = json!({"bindings": [
            { "name": "conversation", "scope": "conversation", "access": "read_write" },
            { "name": "workspace", "scope": "workspace", "access": "read" },
            { "name": "speaker", "scope": "speaker", "access": "read_write" }
        ]});
        for limit in [
            json!(null),
            json!({"bindings": []}),
            spec_example,
            json!({"bindings": [root("conversation", "conversation", "read"), root("user", "user", "read")]}),
        ] {
            assert_eq!(validate_memory_limit(Some(&limit), F), Ok(()), "{limit}");
        }
        assert_eq!(validate_memory_limit(None, F), Ok(()));
    }

    #[test]
    fn r37_reach_vocabulary() {
        let f = "configuration.conversation_reach";
        for reach in [json!(null), json!("workspace"), json!("subtree")] {
            assert_eq!(validate_reach(Some(&reach), f), Ok(()));
        }
        assert_eq!(validate_reach(None, f), Ok(()));
        for reach in [json!("global"), json!(""), json!(true)] {
            let refusal = validate_reach(Some(&reach), f).expect_err("refused");
            assert_eq!(refusal.code, ErrorCode::ValidationFailed);
            assert!(refusal.message.starts_with(f));
        }
    }
}
