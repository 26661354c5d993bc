//! The bounds of one model answer (`docs/executions.md`, "Answer bounds"), and the one check every
//! answer passes before the execution reads it ([`bound_answer`], called by
//! [`super::retry::call_with_retries`] for every client).
//!
//! An answer is refused whole, as a malformed answer (`ModelError::Provider`, key
//! `provider_error`, never retried, never a reason to fall back), when its text is over
//! [`ANSWER_TEXT_BOUND`] or its reasoning over [`ANSWER_REASONING_BOUND`]: nothing of it is stored.
//! The adapters refuse while they read, so an endless answer never sits in memory: an event-stream
//! event over [`STREAM_EVENT_BOUND`], a whole body over [`ANSWER_BODY_BOUND`], or text or
//! reasoning past their bounds ends the read at once. A tool call's own pieces are per-call
//! matters (`docs/executions.md`, "Per-call failures"): what is kept of them is capped
//! ([`CALL_ARGUMENTS_KEPT`], [`CALL_NAME_KEPT`]) so that an over-bound call is still refused by
//! its own word and the record holds a bounded prefix.
//!
//! NUL: neither store may hold U+0000 in a text column (PostgreSQL refuses it), and a model's
//! answer cannot be refused by its sender. So every U+0000 in an answer's text, a call's name or
//! a call's id becomes U+FFFD (the replacement character) here, before anything reads or stores
//! it. A NUL in a call's arguments stays: the arguments are JSON, where it is the per-call
//! failure `invalid_tool_input`.

use super::{ModelError, ModelResponse};

/// The longest text of one answer: 1,048,576 bytes of JSON string (UTF-8 bytes, with a quote, a
/// backslash or a control character counted as its JSON escape), so that the text fits in any
/// reply of the doors as stored.
pub const ANSWER_TEXT_BOUND: usize = 1_048_576;
/// The longest reasoning (Anthropic `thinking`, OpenAI-compatible `reasoning_content` /
/// `reasoning`) of one answer, in UTF-8 bytes. Reasoning is neither stored nor replayed.
pub const ANSWER_REASONING_BOUND: usize = 1_048_576;
/// The most of a call's arguments an answer keeps, in bytes: one more than the tool input bound
/// (65,536), so that a longer call is refused `tool_input_too_large` on a bounded prefix.
pub const CALL_ARGUMENTS_KEPT: usize = 65_537;
/// The most of a call's name or id an answer keeps, in characters: one more than the 128 a name
/// or a kept id may have (a longer name is `unknown_tool`, a longer id is replaced).
pub const CALL_NAME_KEPT: usize = 129;
/// The largest whole (not streamed) answer body read from a provider, in bytes.
pub const ANSWER_BODY_BOUND: usize = 16 * 1024 * 1024;
/// The largest single server-sent event read from a provider's stream, in bytes.
pub const STREAM_EVENT_BOUND: usize = 16 * 1024 * 1024;
/// The most of a provider's error body read, in bytes (its message is shortened further).
pub const ERROR_BODY_BOUND: usize = 65_536;

/// The length of `text` as a JSON string's contents: what it costs in any JSON reply.
#[must_use]
pub fn json_len(text: &str) -> usize {
    text.bytes()
        .map(|byte| match byte {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0x00..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

/// Appends `piece` to `kept`, keeping at most `cap` bytes (cut at a character boundary).
pub(crate) fn push_capped(kept: &mut String, piece: &str, cap: usize) {
    let room = cap.saturating_sub(kept.len());
    if room == 0 {
        return;
    }
    kept.push_str(prefix(piece, room));
}

/// The longest prefix of `text` of at most `bytes` bytes that ends at a character boundary.
fn prefix(text: &str, bytes: usize) -> &str {
    if text.len() <= bytes {
        return text;
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` cut to at most `chars` characters.
fn chars_prefix(text: &str, chars: usize) -> &str {
    match text.char_indices().nth(chars) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// The refusal of an answer whose text is over its bound.
pub(crate) fn text_too_long(bytes: usize) -> ModelError {
    ModelError::Provider {
        message: format!(
            "the answer's text is over {ANSWER_TEXT_BOUND} bytes ({bytes} so far); nothing of it was kept: ask for a shorter answer"
        ),
    }
}

/// Counts `piece` into an answer's reasoning; the refusal once it is over its bound.
///
/// # Errors
/// `Provider` when the reasoning is over [`ANSWER_REASONING_BOUND`].
pub(crate) fn count_reasoning(total: &mut usize, piece: &str) -> Result<(), ModelError> {
    *total = total.saturating_add(piece.len());
    if *total > ANSWER_REASONING_BOUND {
        return Err(ModelError::Provider {
            message: format!(
                "the answer's reasoning is over {ANSWER_REASONING_BOUND} bytes; nothing of it was kept: lower the reasoning effort"
            ),
        });
    }
    Ok(())
}

/// Refuses text that is over its bound in raw bytes already (a cheap check while reading).
///
/// # Errors
/// `Provider` when `text` is over [`ANSWER_TEXT_BOUND`] bytes.
pub(crate) fn check_text_len(text: &str) -> Result<(), ModelError> {
    match text.len() > ANSWER_TEXT_BOUND {
        true => Err(text_too_long(text.len())),
        false => Ok(()),
    }
}

/// Every answer, before the execution reads it (module docs): its text within
/// [`ANSWER_TEXT_BOUND`] as JSON, each call's arguments, name and id cut to what is kept, and
/// U+0000 replaced in the text, names and ids.
///
/// # Errors
/// `Provider` (`provider_error`) for text over its bound.
pub fn bound_answer(mut response: ModelResponse) -> Result<ModelResponse, ModelError> {
    if let Some(text) = &mut response.text {
        let length = json_len(text);
        if length > ANSWER_TEXT_BOUND {
            return Err(text_too_long(length));
        }
        replace_nul(text);
    }
    for call in &mut response.tool_calls {
        if call.arguments.len() > CALL_ARGUMENTS_KEPT {
            call.arguments = prefix(&call.arguments, CALL_ARGUMENTS_KEPT).to_owned();
        }
        for piece in [&mut call.name, &mut call.id] {
            if piece.chars().count() > CALL_NAME_KEPT {
                *piece = chars_prefix(piece, CALL_NAME_KEPT).to_owned();
            }
            replace_nul(piece);
        }
    }
    Ok(response)
}

fn replace_nul(text: &mut String) {
    if text.contains('\0') {
        *text = text.replace('\0', "\u{FFFD}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolCall;

    fn answer(text: &str, calls: Vec<ToolCall>) -> ModelResponse {
        ModelResponse { text: Some(text.to_owned()), tool_calls: calls, finish_reason: "stop".into(), usage: None }
    }

    #[test]
    fn json_length_counts_escapes() {
        assert_eq!(json_len("abc"), 3);
        assert_eq!(json_len("é"), 2);
        assert_eq!(json_len("a\"b\\c\n"), 9);
        assert_eq!(json_len("\u{1}"), 6);
        assert_eq!(json_len("\u{1}"), serde_json::to_string("\u{1}").expect("json").len() - 2);
    }

    #[test]
    fn text_over_its_bound_is_provider_error() {
        let at_bound = "x".repeat(ANSWER_TEXT_BOUND);
        assert!(bound_answer(answer(&at_bound, vec![])).is_ok());
        let over = "x".repeat(ANSWER_TEXT_BOUND + 1);
        assert_eq!(bound_answer(answer(&over, vec![])).expect_err("over").key(), "provider_error");
        // Control characters count as their escapes: 200,000 of them are 1.2 MB of JSON.
        let escaped = "\u{1}".repeat(200_000);
        assert_eq!(bound_answer(answer(&escaped, vec![])).expect_err("over as JSON").key(), "provider_error");
    }

    #[test]
    fn calls_are_cut_to_what_is_kept_and_nul_is_replaced() {
        let call = ToolCall {
            id: format!("id\0{}", "i".repeat(300)),
            name: "n\0".into(),
            arguments: "a".repeat(3 * CALL_ARGUMENTS_KEPT),
            model_id: None,
        };
        let bounded = bound_answer(answer("fine\0text", vec![call])).expect("calls are per-call matters");
        assert_eq!(bounded.text.as_deref(), Some("fine\u{FFFD}text"));
        let call = &bounded.tool_calls[0];
        assert_eq!(call.arguments.len(), CALL_ARGUMENTS_KEPT);
        assert_eq!(call.name, "n\u{FFFD}");
        assert_eq!(call.id.chars().count(), CALL_NAME_KEPT);
        assert!(!call.id.contains('\0'));
    }

    #[test]
    fn capped_pushes_stop_at_a_character_boundary() {
        let mut kept = String::new();
        push_capped(&mut kept, "ab", 3);
        push_capped(&mut kept, "éé", 3);
        assert_eq!(kept, "ab");
        push_capped(&mut kept, "c", 3);
        assert_eq!(kept, "abc");
        push_capped(&mut kept, "d", 3);
        assert_eq!(kept, "abc");
    }

    #[test]
    fn reasoning_is_counted_to_its_bound() {
        let mut total = 0;
        assert!(count_reasoning(&mut total, &"r".repeat(ANSWER_REASONING_BOUND)).is_ok());
        assert_eq!(count_reasoning(&mut total, "r").expect_err("over").key(), "provider_error");
    }
}
