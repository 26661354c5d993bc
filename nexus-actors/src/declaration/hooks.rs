//! `lifecycle_hooks` (`docs/declaration.md`, "Lifecycle hooks").
//!
//! `{turn_start?, pre_compact?, post_compact?, stop?}`, each `{tool, timeout_ms}` and `stop` also
//! `max_continuations`; the object fits 64 KiB. `null` or `{}` enables nothing.

use serde_json::Value;

use nexus_kernel_tools::{lookup as kernel_lookup, reserved_namespace_of};
use nexus_proto::Refusal;

use super::{ENVELOPE_BOUND, invalid};

/// The only hook events, in firing order within a turn.
pub const HOOK_EVENTS: [&str; 4] = ["turn_start", "pre_compact", "post_compact", "stop"];
/// The largest `timeout_ms` of a hook, in milliseconds (5 minutes); the smallest is 1.
pub const MAX_HOOK_TIMEOUT_MS: u64 = 300_000;
/// The largest `max_continuations` of the `stop` hook; the smallest is 0.
pub const MAX_CONTINUATIONS: u64 = 20;
/// The bound of a hook tool name, in bytes.
pub const HOOK_TOOL_BOUND: usize = 128;

/// Validates `lifecycle_hooks` and says whether any hook is declared (a non-empty object), which
/// makes `approval_mode` required.
///
/// # Errors
/// 422 `validation_failed` naming `field` or `field.event[.key]`.
pub(super) fn validate_hooks(value: Option<&Value>, field: &str) -> Result<bool, Refusal> {
    let hooks = match value {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Object(hooks)) => hooks,
        Some(_) => return Err(invalid(field, "must be null or an object keyed by event")),
    };
    let size = Value::Object(hooks.clone()).to_string().len();
    if size > ENVELOPE_BOUND {
        return Err(invalid(field, format!("is {size} bytes, over its bound of {ENVELOPE_BOUND}")));
    }
    for (event, entry) in hooks {
        let at = format!("{field}.{event}");
        if !HOOK_EVENTS.contains(&event.as_str()) {
            return Err(invalid(&at, "unknown event; the events are turn_start, pre_compact, post_compact and stop"));
        }
        let stop = event == "stop";
        let Some(entry) = entry.as_object() else {
            return Err(invalid(&at, "must be an object {tool, timeout_ms} (stop also max_continuations)"));
        };
        if let Some(key) = entry
            .keys()
            .find(|k| !(matches!(k.as_str(), "tool" | "timeout_ms") || (stop && k.as_str() == "max_continuations")))
        {
            let takes = if stop { "tool, timeout_ms and max_continuations" } else { "tool and timeout_ms" };
            return Err(invalid(&format!("{at}.{key}"), format!("unknown field; a {event} hook takes {takes}")));
        }
        let tool = entry.get("tool").and_then(Value::as_str);
        let Some(tool) = tool.filter(|t| !t.is_empty() && t.len() <= HOOK_TOOL_BOUND && !t.contains('\0')) else {
            return Err(invalid(
                &format!("{at}.tool"),
                "is required: an executor tool name of 1 to 128 bytes without NUL",
            ));
        };
        if kernel_lookup(tool).is_some() || reserved_namespace_of(tool).is_some() {
            return Err(invalid(
                &format!("{at}.tool"),
                format!("{tool} is a reserved kernel tool name; name a tool an executor serves"),
            ));
        }
        // A missing field and one out of its range are told apart: the value is then quoted.
        let bounded = |field: &str, range: std::ops::RangeInclusive<u64>| match entry.get(field) {
            None | Some(Value::Null) => Err(invalid(
                &format!("{at}.{field}"),
                format!("is required: an integer from {} through {}", range.start(), range.end()),
            )),
            Some(value) if value.as_u64().is_some_and(|n| range.contains(&n)) => Ok(()),
            Some(value) => {
                let got = if value.is_number() { format!(", not {value}") } else { String::new() };
                Err(invalid(
                    &format!("{at}.{field}"),
                    format!("must be an integer from {} through {}{got}", range.start(), range.end()),
                ))
            }
        };
        bounded("timeout_ms", 1..=MAX_HOOK_TIMEOUT_MS)?;
        if stop {
            bounded("max_continuations", 0..=MAX_CONTINUATIONS)?;
        }
    }
    Ok(!hooks.is_empty())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use nexus_proto::ErrorCode;

    const F: &str = "configuration.lifecycle_hooks";

    #[test]
    fn r53_r54_hook_refusals() {
        let cases = [
            ("not_object", json!([]), F),
            (
                "r53_unknown_event",
                json!({"session_end": {"tool": "t", "timeout_ms": 1}}),
                "configuration.lifecycle_hooks.session_end",
            ),
            ("entry_not_object", json!({"stop": "t"}), "configuration.lifecycle_hooks.stop"),
            (
                "r53_unknown_field",
                json!({"turn_start": {"tool": "t", "timeout_ms": 1, "extra": true}}),
                "configuration.lifecycle_hooks.turn_start.extra",
            ),
            (
                "continuations_only_on_stop",
                json!({"pre_compact": {"tool": "t", "timeout_ms": 1, "max_continuations": 1}}),
                "configuration.lifecycle_hooks.pre_compact.max_continuations",
            ),
            (
                "tool_missing",
                json!({"stop": {"timeout_ms": 1, "max_continuations": 0}}),
                "configuration.lifecycle_hooks.stop.tool",
            ),
            (
                "tool_empty",
                json!({"turn_start": {"tool": "", "timeout_ms": 1}}),
                "configuration.lifecycle_hooks.turn_start.tool",
            ),
            (
                "tool_129_bytes",
                json!({"turn_start": {"tool": "t".repeat(129), "timeout_ms": 1}}),
                "configuration.lifecycle_hooks.turn_start.tool",
            ),
            (
                "tool_bytes_not_chars",
                json!({"turn_start": {"tool": "é".repeat(65), "timeout_ms": 1}}),
                "configuration.lifecycle_hooks.turn_start.tool",
            ),
            (
                "tool_nul",
                json!({"turn_start": {"tool": "a\u{0}", "timeout_ms": 1}}),
                "configuration.lifecycle_hooks.turn_start.tool",
            ),
            (
                "tool_kernel_wire",
                json!({"turn_start": {"tool": "ask", "timeout_ms": 1}}),
                "configuration.lifecycle_hooks.turn_start.tool",
            ),
            (
                "tool_kernel_canonical",
                json!({"turn_start": {"tool": "nexus.memory.read", "timeout_ms": 1}}),
                "configuration.lifecycle_hooks.turn_start.tool",
            ),
            (
                "tool_reserved_namespace",
                json!({"turn_start": {"tool": "nexus.graph.mine", "timeout_ms": 1}}),
                "configuration.lifecycle_hooks.turn_start.tool",
            ),
            (
                "timeout_missing",
                json!({"post_compact": {"tool": "t"}}),
                "configuration.lifecycle_hooks.post_compact.timeout_ms",
            ),
            (
                "timeout_zero",
                json!({"post_compact": {"tool": "t", "timeout_ms": 0}}),
                "configuration.lifecycle_hooks.post_compact.timeout_ms",
            ),
            (
                "timeout_over",
                json!({"post_compact": {"tool": "t", "timeout_ms": 300_001}}),
                "configuration.lifecycle_hooks.post_compact.timeout_ms",
            ),
            (
                "timeout_float",
                json!({"post_compact": {"tool": "t", "timeout_ms": 1000.0}}),
                "configuration.lifecycle_hooks.post_compact.timeout_ms",
            ),
            (
                "timeout_string",
                json!({"post_compact": {"tool": "t", "timeout_ms": "1000"}}),
                "configuration.lifecycle_hooks.post_compact.timeout_ms",
            ),
            (
                "stop_needs_continuations",
                json!({"stop": {"tool": "t", "timeout_ms": 1}}),
                "configuration.lifecycle_hooks.stop.max_continuations",
            ),
            (
                "continuations_over",
                json!({"stop": {"tool": "t", "timeout_ms": 1, "max_continuations": 21}}),
                "configuration.lifecycle_hooks.stop.max_continuations",
            ),
            (
                "continuations_negative",
                json!({"stop": {"tool": "t", "timeout_ms": 1, "max_continuations": -1}}),
                "configuration.lifecycle_hooks.stop.max_continuations",
            ),
            (
                "r53_over_64_kib",
                json!({"stop": {"tool": "t", "timeout_ms": 1, "max_continuations": 0}, "x": "y".repeat(ENVELOPE_BOUND)}),
                "configuration.lifecycle_hooks: is",
            ),
        ];
        for (name, hooks, prefix) in cases {
            let refusal = validate_hooks(Some(&hooks), F).expect_err(name);
            assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{name}");
            assert!(refusal.message.starts_with(prefix), "{name}: {} should start with {prefix}", refusal.message);
        }
        // A value out of its range is quoted, a missing one is said to be required.
        let message = |hooks: Value| validate_hooks(Some(&hooks), F).expect_err("refused").message;
        assert!(
            message(json!({"post_compact": {"tool": "t", "timeout_ms": 0}})).ends_with("from 1 through 300000, not 0")
        );
        assert!(
            message(json!({"post_compact": {"tool": "t"}})).ends_with("is required: an integer from 1 through 300000")
        );
        assert!(
            message(json!({"post_compact": {"tool": "t", "timeout_ms": "x".repeat(1_000)}})).len() < 200,
            "no echo"
        );
    }

    #[test]
    fn r53_r54_hooks_accepted() {
        let all = json!({
            "turn_start": {"tool": "warm_up", "timeout_ms": 1},
            "pre_compact": {"tool": "save", "timeout_ms": 300_000},
            "post_compact": {"tool": "t".repeat(128), "timeout_ms": 5},
            "stop": {"tool": "review_completion", "timeout_ms": 30_000, "max_continuations": 0}
        });
        assert_eq!(validate_hooks(Some(&all), F), Ok(true));
        let twenty = json!({"stop": {"tool": "review", "timeout_ms": 1, "max_continuations": 20}});
        assert_eq!(validate_hooks(Some(&twenty), F), Ok(true));
        assert_eq!(validate_hooks(Some(&json!({})), F), Ok(false));
        assert_eq!(validate_hooks(Some(&Value::Null), F), Ok(false));
        assert_eq!(validate_hooks(None, F), Ok(false));
    }
}
