//! The Agent's two owned prompt documents, `system_prompt` and `summarizer` (`docs/declaration.md`,
//! "Prompt documents").
//!
//! A document is `{content, role?}`: `content` a string of at most 64 KiB (empty stores an empty
//! document), `role` `system` (the default) or `developer`; `summarizer` permits only `system`.
//! Every `{{name}}` in the content must be a built-in macro or a variable the template declares.

use serde_json::{Map, Value, json};

use nexus_proto::{ErrorCode, Refusal};

use super::PROMPT_DOCUMENT_BOUND;
use super::template::{MACROS, unknown_macro};

nexus_proto::words! {
    /// An Agent's owned prompt-document slot.
    pub enum PromptSlot("prompt-document slot") {
        /// The Agent's system prompt (`system` or `developer` role).
        SystemPrompt => "system_prompt",
        /// The summarizer's instructions (`system` role only).
        Summarizer => "summarizer",
    }
}

impl PromptSlot {
    /// Whether the slot is restricted to the `system` role.
    pub const fn system_only(self) -> bool {
        matches!(self, PromptSlot::Summarizer)
    }
}

/// Validates one document object at `path` (e.g. `prompt_documents.system_prompt`) and returns
/// its canonical form `{content, role}`.
///
/// # Errors
/// 422 `prompt_document_invalid` (missing or non-string content, a role outside the slot's
/// words), `prompt_document_too_large` (over 64 KiB) or `prompt_document_macro_unknown`.
pub(super) fn document(
    slot: &Map<String, Value>,
    path: &str,
    system_only: bool,
    variables: &[String],
) -> Result<Value, Refusal> {
    let Some(content) = slot.get("content").and_then(Value::as_str) else {
        return Err(Refusal::new(
            ErrorCode::PromptDocumentInvalid,
            format!("{path}.content: prompt_document_invalid: is required and must be a string"),
        ));
    };
    if content.len() > PROMPT_DOCUMENT_BOUND {
        return Err(Refusal::new(
            ErrorCode::PromptDocumentTooLarge,
            format!(
                "{path}.content: prompt_document_too_large: is {} bytes, over its bound of {PROMPT_DOCUMENT_BOUND}",
                content.len()
            ),
        ));
    }
    let role = match slot.get("role") {
        None | Some(Value::Null) => "system",
        Some(Value::String(role)) if role == "system" || (!system_only && role == "developer") => role.as_str(),
        Some(_) => {
            let allowed = if system_only { "system" } else { "system or developer" };
            return Err(Refusal::new(
                ErrorCode::PromptDocumentInvalid,
                format!("{path}.role: prompt_document_invalid: must be {allowed}"),
            ));
        }
    };
    if let Some(name) = unknown_macro(content, variables) {
        let declared = if variables.is_empty() { "none".to_owned() } else { variables.join(", ") };
        return Err(Refusal::new(
            ErrorCode::PromptDocumentMacroUnknown,
            format!(
                "{path}.content: prompt_document_macro_unknown: {{{{{name}}}}} is unknown; use a macro ({}) \
                 or a variable the prompt_template declares (declared: {declared})",
                MACROS.join(", ")
            ),
        ));
    }
    Ok(json!({"content": content, "role": role}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(slot: Value, system_only: bool, variables: &[String]) -> Result<Value, Refusal> {
        document(slot.as_object().expect("object"), "prompt_documents.x", system_only, variables)
    }

    #[test]
    fn r58_document_refusals() {
        let tone = vec!["tone".to_owned()];
        let cases = [
            ("r4_empty_object", json!({}), false, "prompt_document_invalid"),
            ("content_not_string", json!({"content": 3}), false, "prompt_document_invalid"),
            ("role_outside", json!({"content": "", "role": "user"}), false, "prompt_document_invalid"),
            ("r4_summarizer_developer", json!({"content": "", "role": "developer"}), true, "prompt_document_invalid"),
            (
                "too_large",
                json!({"content": "x".repeat(PROMPT_DOCUMENT_BOUND + 1)}),
                false,
                "prompt_document_too_large",
            ),
            ("macro_unknown", json!({"content": "{{nope}}"}), false, "prompt_document_macro_unknown"),
            ("summarizer_macro_unknown", json!({"content": "{{agents}}"}), true, "prompt_document_macro_unknown"),
        ];
        for (name, slot, only, code) in cases {
            let refusal = check(slot, only, &tone).expect_err(name);
            assert_eq!(refusal.code.as_str(), code, "{name}");
            assert!(refusal.message.starts_with("prompt_documents.x."), "{name}: {}", refusal.message);
        }
    }

    #[test]
    fn r4_r58_documents_accepted() {
        let tone = vec!["tone".to_owned()];
        let exactly_bound = "x".repeat(PROMPT_DOCUMENT_BOUND);
        assert_eq!(check(json!({"content": ""}), true, &[]), Ok(json!({"content": "", "role": "system"})));
        assert_eq!(
            check(json!({"content": "You are {{agent}}, {{tone}}.", "role": "developer"}), false, &tone),
            Ok(json!({"content": "You are {{agent}}, {{tone}}.", "role": "developer"}))
        );
        assert_eq!(
            check(json!({"content": exactly_bound, "role": null}), true, &[]),
            Ok(json!({"content": exactly_bound, "role": "system"}))
        );
        let only = |slot: &str| slot.parse::<PromptSlot>().ok().map(PromptSlot::system_only);
        assert_eq!(only("summarizer"), Some(true));
        assert_eq!(only("system_prompt"), Some(false));
        assert_eq!(only("persona"), None);
    }
}
