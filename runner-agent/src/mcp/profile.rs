//! Effect profiles of MCP tools, from their annotations (`docs/runner-tools.md`, "MCP servers").
//!
//! MCP annotations are hints with spec defaults: `readOnlyHint` false, `destructiveHint` true,
//! `idempotentHint` false, `openWorldHint` true. A tool with annotations gets
//! - read-only: `{read_only, destructive: false, scope, intrinsic, none}`;
//! - otherwise: `{write, destructiveHint, scope, idempotentHint ? intrinsic : none, none}`;
//!
//! where scope is `open` when `openWorldHint` holds, else `closed`. A tool without annotations
//! gets the server's declared `default_effect_profile`. MCP has no way to look an effect up, so
//! `reconciliation` is always `none` unless the operator's default says otherwise.

use rmcp::model::ToolAnnotations;

use crate::tools::{EffectKind, EffectProfile, EffectScope, Idempotency, Reconciliation};

/// The profile of a tool with `annotations` (or none), on a server whose default is `default`.
pub(crate) fn effect_profile(annotations: Option<&ToolAnnotations>, default: EffectProfile) -> EffectProfile {
    let Some(hints) = annotations else {
        return default;
    };
    let effect_scope = if hints.open_world_hint.unwrap_or(true) { EffectScope::Open } else { EffectScope::Closed };
    if hints.read_only_hint.unwrap_or(false) {
        return EffectProfile {
            kind: EffectKind::ReadOnly,
            destructive: false,
            effect_scope,
            idempotency: Idempotency::Intrinsic,
            reconciliation: Reconciliation::None,
        };
    }
    EffectProfile {
        kind: EffectKind::Write,
        destructive: hints.destructive_hint.unwrap_or(true),
        effect_scope,
        idempotency: if hints.idempotent_hint.unwrap_or(false) { Idempotency::Intrinsic } else { Idempotency::None },
        reconciliation: Reconciliation::None,
    }
}

/// The default of a server that declares none: the most careful profile.
pub(crate) const CAREFUL_DEFAULT: EffectProfile = EffectProfile::UNKNOWN_WRITE;

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn hints(
        read_only: Option<bool>,
        destructive: Option<bool>,
        idempotent: Option<bool>,
        open: Option<bool>,
    ) -> ToolAnnotations {
        ToolAnnotations::from_raw(None, read_only, destructive, idempotent, open)
    }

    fn wire(profile: EffectProfile) -> Value {
        serde_json::to_value(profile).expect("profile serializes")
    }

    #[test]
    fn annotations_map_to_profiles_with_the_mcp_defaults() {
        let default = EffectProfile {
            kind: EffectKind::ReadOnly,
            destructive: false,
            effect_scope: EffectScope::Closed,
            idempotency: Idempotency::Intrinsic,
            reconciliation: Reconciliation::Lookup,
        };
        // (requirement, annotations, expected profile)
        let rows: [(&str, Option<ToolAnnotations>, Value); 7] = [
            ("no annotations: the server's default", None, wire(default)),
            (
                "empty annotations: every MCP default (write, destructive, open, not idempotent)",
                Some(hints(None, None, None, None)),
                json!({"kind": "write", "destructive": true, "effect_scope": "open", "idempotency": "none", "reconciliation": "none"}),
            ),
            (
                "readOnlyHint: read_only, not destructive, intrinsic, open world by default",
                Some(hints(Some(true), Some(true), Some(false), None)),
                json!({"kind": "read_only", "destructive": false, "effect_scope": "open", "idempotency": "intrinsic", "reconciliation": "none"}),
            ),
            (
                "readOnlyHint with a closed world",
                Some(hints(Some(true), None, None, Some(false))),
                json!({"kind": "read_only", "destructive": false, "effect_scope": "closed", "idempotency": "intrinsic", "reconciliation": "none"}),
            ),
            (
                "additive and idempotent write in a closed world",
                Some(hints(Some(false), Some(false), Some(true), Some(false))),
                json!({"kind": "write", "destructive": false, "effect_scope": "closed", "idempotency": "intrinsic", "reconciliation": "none"}),
            ),
            (
                "destructive, not idempotent, open",
                Some(hints(None, Some(true), Some(false), Some(true))),
                json!({"kind": "write", "destructive": true, "effect_scope": "open", "idempotency": "none", "reconciliation": "none"}),
            ),
            (
                "only a title: still annotations, so the MCP defaults and not the server's default",
                Some(ToolAnnotations::with_title("Nice")),
                json!({"kind": "write", "destructive": true, "effect_scope": "open", "idempotency": "none", "reconciliation": "none"}),
            ),
        ];
        for (requirement, annotations, expected) in rows {
            assert_eq!(wire(effect_profile(annotations.as_ref(), default)), expected, "{requirement}");
        }
    }

    #[test]
    fn the_careful_default_is_the_contracts_default() {
        assert_eq!(
            wire(CAREFUL_DEFAULT),
            json!({"kind": "write", "destructive": true, "effect_scope": "open", "idempotency": "none", "reconciliation": "none"})
        );
    }
}
