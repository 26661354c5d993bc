//! `compaction_policy` (`docs/declaration.md`, "Compaction policy"): the shape a task's compaction
//! takes, `{mode: kernel|delegate|off, tool_name?, model?, reasoning_enabled?, reasoning_effort?}`,
//! under the 64 KiB envelope. `delegate` needs a non-empty `tool_name`.

use serde_json::Value;

use nexus_proto::Refusal;

use super::{ENVELOPE_BOUND, invalid};

nexus_proto::words! {
    /// How an enabled compaction produces its summary (`docs/executions.md`, "Compaction").
    pub enum CompactionMode("compaction mode") {
        /// A summarizer model call with no tools.
        Kernel => "kernel",
        /// An inbox task to the runner serving the policy's `tool_name`.
        Delegate => "delegate",
    }
}

nexus_proto::words! {
    /// What made a compaction run, for `pre_compact`'s `compaction_trigger` and the events.
    pub enum CompactionTrigger("compaction trigger") {
        /// The manual compaction door.
        Manual => "manual",
        /// The provider's own token count plus the tail exceeds the window.
        Usage => "usage",
        /// The byte bound or the estimated input exceeds the model's limit.
        Wall => "wall",
        /// The provider rejected the request for length.
        Overflow => "overflow",
    }
}

/// The compaction modes a policy may name (`off` disables compaction).
pub const COMPACTION_MODES: [&str; 3] = ["kernel", "delegate", "off"];
const KEYS: [&str; 5] = ["mode", "tool_name", "model", "reasoning_enabled", "reasoning_effort"];

/// Validates `compaction_policy` (null or a policy object).
///
/// # Errors
/// 422 `validation_failed` naming `field` or `field.key`.
pub(super) fn validate_compaction(value: Option<&Value>, field: &str) -> Result<(), Refusal> {
    let policy = match value {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(policy)) => policy,
        Some(_) => return Err(invalid(field, "must be null or an object {mode, tool_name?, model?, …}")),
    };
    let size = Value::Object(policy.clone()).to_string().len();
    if size > ENVELOPE_BOUND {
        return Err(invalid(field, format!("is {size} bytes, over its bound of {ENVELOPE_BOUND}")));
    }
    if let Some(key) = policy.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(invalid(
            &format!("{field}.{key}"),
            "unknown key; a policy takes mode, tool_name, model, reasoning_enabled, reasoning_effort",
        ));
    }
    let mode = policy.get("mode").and_then(Value::as_str);
    let Some(mode) = mode.filter(|m| COMPACTION_MODES.contains(m)) else {
        return Err(invalid(&format!("{field}.mode"), "is required and must be kernel, delegate or off"));
    };
    match policy.get("tool_name") {
        None | Some(Value::Null) if mode == "delegate" => {
            return Err(invalid(&format!("{field}.tool_name"), "is required when mode is delegate"));
        }
        None | Some(Value::Null) => {}
        Some(Value::String(name)) if !name.is_empty() && name.len() <= 128 && !name.contains('\0') => {}
        Some(_) => {
            return Err(invalid(&format!("{field}.tool_name"), "must be a tool name of 1 to 128 bytes without NUL"));
        }
    }
    if policy.get("model").is_some_and(|m| !m.is_null() && m.as_str().is_none_or(str::is_empty)) {
        return Err(invalid(&format!("{field}.model"), "must be a provider/model string"));
    }
    if policy.get("reasoning_enabled").is_some_and(|r| !r.is_null() && !r.is_boolean()) {
        return Err(invalid(&format!("{field}.reasoning_enabled"), "must be true or false"));
    }
    if policy.get("reasoning_effort").is_some_and(|r| !r.is_null() && r.as_str().is_none_or(str::is_empty)) {
        return Err(invalid(&format!("{field}.reasoning_effort"), "must be a non-empty string"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use nexus_proto::ErrorCode;

    const F: &str = "configuration.compaction_policy";

    #[test]
    fn r70_policy_refusals() {
        let cases = [
            ("not_object", json!("kernel"), F),
            ("mode_missing", json!({}), "configuration.compaction_policy.mode"),
            ("mode_outside", json!({"mode": "prune"}), "configuration.compaction_policy.mode"),
            ("r70_delegate_needs_tool", json!({"mode": "delegate"}), "configuration.compaction_policy.tool_name"),
            (
                "delegate_empty_tool",
                json!({"mode": "delegate", "tool_name": ""}),
                "configuration.compaction_policy.tool_name",
            ),
            ("tool_not_string", json!({"mode": "kernel", "tool_name": 1}), "configuration.compaction_policy.tool_name"),
            ("unknown_key", json!({"mode": "kernel", "when": "always"}), "configuration.compaction_policy.when"),
            ("model_not_string", json!({"mode": "kernel", "model": 5}), "configuration.compaction_policy.model"),
            (
                "reasoning_not_bool",
                json!({"mode": "kernel", "reasoning_enabled": "yes"}),
                "configuration.compaction_policy.reasoning_enabled",
            ),
            (
                "effort_empty",
                json!({"mode": "kernel", "reasoning_effort": ""}),
                "configuration.compaction_policy.reasoning_effort",
            ),
            (
                "over_64_kib",
                json!({"mode": "kernel", "model": "m".repeat(ENVELOPE_BOUND)}),
                "configuration.compaction_policy: is",
            ),
        ];
        for (name, policy, prefix) in cases {
            let refusal = validate_compaction(Some(&policy), F).expect_err(name);
            assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{name}");
            assert!(refusal.message.starts_with(prefix), "{name}: {} should start with {prefix}", refusal.message);
        }
    }

    #[test]
    fn r70_policies_accepted() {
        for policy in [
            json!(null),
            json!({"mode": "kernel"}),
            json!({"mode": "off"}),
            json!({"mode": "delegate", "tool_name": "summarize", "model": "p/m", "reasoning_enabled": true, "reasoning_effort": "low"}),
        ] {
            assert_eq!(validate_compaction(Some(&policy), F), Ok(()), "{policy}");
        }
        assert_eq!(validate_compaction(None, F), Ok(()));
    }
}
