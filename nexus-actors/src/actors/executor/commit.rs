//! Commit payload rules (`docs/protocol.md`, "Commit"): what a runner may commit, and how it is
//! stored.

use serde_json::{Map, Value};

use nexus_proto::{ErrorCode, Refusal};

/// The largest stored result, in bytes of canonical JSON (1 MB).
pub const RESULT_BOUND: usize = 1_000_000;
/// The largest `metadata` object, in bytes (64 KiB).
pub const METADATA_BOUND: usize = 65_536;
/// The most content blocks in one result.
pub const CONTENT_BLOCKS_BOUND: usize = 256;
/// The longest `title`, in characters.
pub const TITLE_BOUND: usize = 256;

nexus_proto::words! {
    /// A commit's `outcome`: whether the tool could run at all.
    pub enum Outcome("commit outcome") {
        /// It ran (its result may still be an error the model reads).
        Completed => "completed",
        /// It could not run: the task settles `failed` with `tool_failed`.
        Failed => "failed",
    }
}

/// A validated commit: the body to store and whether the tool could not run at all.
#[derive(Clone, Debug, PartialEq)]
pub struct CommitBody {
    /// `{content, structured_content?, is_error, outcome, title?, metadata?}` as stored.
    pub stored: Value,
    /// `outcome: failed`: the task settles `failed` with `tool_failed`.
    pub failed: bool,
}

/// What a refused commit does to the park.
#[derive(Clone, Debug, PartialEq)]
pub enum CommitRefusal {
    /// The park stands; the runner may commit again with the same token.
    Standing(Refusal),
    /// `result_unstorable`: the park closes and the task settles `failed`.
    Closes(Refusal),
}

fn standing(code: ErrorCode, message: &str) -> CommitRefusal {
    CommitRefusal::Standing(Refusal::new(code, message))
}

fn has_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// Validates a commit body (the flat body without `claim_token`).
///
/// # Errors
/// [`CommitRefusal::Standing`] with `invalid_outcome`, `invalid_result_type`, `invalid_title`,
/// `invalid_metadata`, `metadata_too_large`, `invalid_content`, `unsupported_content_kind`,
/// `too_many_content_blocks` or `result_too_large`; [`CommitRefusal::Closes`] with
/// `result_unstorable` for text that cannot be stored (NUL or invalid UTF-8).
pub fn validate(body_json: &str) -> Result<CommitBody, CommitRefusal> {
    // Strict: a key named twice in the body is refused, never settled by the last one.
    let body: Value = match crate::json::parse_str(body_json) {
        Ok(body) => body,
        Err(_) if std::str::from_utf8(body_json.as_bytes()).is_err() => {
            return Err(CommitRefusal::Closes(Refusal::new(
                ErrorCode::ResultUnstorable,
                "the result is not valid UTF-8",
            )));
        }
        Err(e) => {
            return Err(standing(ErrorCode::InvalidContent, &format!("the commit body is not one JSON value: {e}")));
        }
    };
    let Some(body) = body.as_object() else {
        return Err(standing(ErrorCode::InvalidContent, "the commit body must be a JSON object"));
    };
    if has_nul(&Value::Object(body.clone())) {
        return Err(CommitRefusal::Closes(Refusal::new(
            ErrorCode::ResultUnstorable,
            "the result contains a NUL character",
        )));
    }
    let outcome = match body.get("outcome") {
        None | Some(Value::Null) => Outcome::Completed,
        Some(Value::String(word)) => {
            word.parse().map_err(|_| standing(ErrorCode::InvalidOutcome, "outcome must be completed or failed"))?
        }
        Some(_) => return Err(standing(ErrorCode::InvalidOutcome, "outcome must be completed or failed")),
    };
    let failed = outcome == Outcome::Failed;
    match body.get("result_type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "complete" => {}
        Some(_) => return Err(standing(ErrorCode::InvalidResultType, "result_type must be absent (complete)")),
    }
    let mut stored = Map::new();
    stored.insert("content".into(), validate_content(body.get("content"))?);
    if let Some(structured) = body.get("structured_content") {
        // Explicit null and false are retained.
        stored.insert("structured_content".into(), structured.clone());
    }
    let is_error = match body.get("is_error") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(standing(ErrorCode::InvalidContent, "is_error must be a boolean")),
    };
    stored.insert("is_error".into(), Value::Bool(is_error));
    stored.insert("outcome".into(), Value::String(if failed { "failed" } else { "completed" }.into()));
    match body.get("title") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if !t.is_empty() && t.chars().count() <= TITLE_BOUND => {
            stored.insert("title".into(), Value::String(t.clone()));
        }
        Some(_) => {
            return Err(standing(
                ErrorCode::InvalidTitle,
                "title must be a non-empty string of at most 256 characters",
            ));
        }
    }
    match body.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(metadata)) => {
            if Value::Object(metadata.clone()).to_string().len() > METADATA_BOUND {
                return Err(standing(ErrorCode::MetadataTooLarge, "metadata is over 65536 bytes"));
            }
            stored.insert("metadata".into(), Value::Object(metadata.clone()));
        }
        Some(_) => return Err(standing(ErrorCode::InvalidMetadata, "metadata must be an object")),
    }
    let stored = Value::Object(stored);
    if stored.to_string().len() > RESULT_BOUND {
        return Err(standing(ErrorCode::ResultTooLarge, "the result is over 1 MB; commit a shorter content"));
    }
    Ok(CommitBody { stored, failed })
}

fn validate_content(content: Option<&Value>) -> Result<Value, CommitRefusal> {
    let blocks = match content {
        None | Some(Value::Null) => return Ok(Value::String(String::new())),
        Some(Value::String(text)) => return Ok(Value::String(text.clone())),
        Some(Value::Array(blocks)) => blocks,
        Some(_) => return Err(standing(ErrorCode::InvalidContent, "content must be a string or an array of blocks")),
    };
    if blocks.len() > CONTENT_BLOCKS_BOUND {
        return Err(standing(ErrorCode::TooManyContentBlocks, "at most 256 content blocks"));
    }
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") if block.get("text").is_some_and(Value::is_string) => {}
            Some("resource_link") => {
                // Uploads are not served by this version, so no link can name this executor's capture.
                return Err(standing(
                    ErrorCode::UnsupportedContentKind,
                    "resource_link blocks need an upload, which this server does not take yet",
                ));
            }
            Some("text") => return Err(standing(ErrorCode::InvalidContent, "a text block needs a string `text`")),
            _ => return Err(standing(ErrorCode::UnsupportedContentKind, "blocks are {type:text,text}")),
        }
    }
    Ok(Value::Array(blocks.clone()))
}

/// The text the model reads from a stored result: the string content, or its text blocks joined.
pub fn model_text(stored: &Value) -> String {
    match &stored["content"] {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(result: Result<CommitBody, CommitRefusal>) -> (String, bool) {
        match result {
            Err(CommitRefusal::Standing(r)) => (r.code.as_str().to_owned(), false),
            Err(CommitRefusal::Closes(r)) => (r.code.as_str().to_owned(), true),
            Ok(_) => ("ok".into(), false),
        }
    }

    #[test]
    fn payload_refusals() {
        assert_eq!(word(validate(r#"{"outcome":"maybe"}"#)), ("invalid_outcome".into(), false));
        assert_eq!(word(validate(r#"{"result_type":"partial"}"#)), ("invalid_result_type".into(), false));
        assert_eq!(word(validate(r#"{"metadata":[]}"#)), ("invalid_metadata".into(), false));
        assert_eq!(word(validate(r#"{"title":""}"#)), ("invalid_title".into(), false));
        assert_eq!(word(validate(r#"{"content":5}"#)), ("invalid_content".into(), false));
        assert_eq!(word(validate(r#"{"content":[{"type":"image"}]}"#)), ("unsupported_content_kind".into(), false));
        let big = format!(r#"{{"content":"{}"}}"#, "x".repeat(RESULT_BOUND));
        assert_eq!(word(validate(&big)), ("result_too_large".into(), false));
        let meta = format!(r#"{{"metadata":{{"k":"{}"}}}}"#, "x".repeat(METADATA_BOUND));
        assert_eq!(word(validate(&meta)), ("metadata_too_large".into(), false));
        assert_eq!(word(validate(r#"{"content":"a\u0000b"}"#)), ("result_unstorable".into(), true));
    }

    #[test]
    fn stored_shape_and_model_text() {
        let ok = validate(r#"{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"structured_content":false,"is_error":true}"#)
            .expect("valid");
        assert!(!ok.failed);
        assert_eq!(ok.stored["structured_content"], Value::Bool(false));
        assert_eq!(ok.stored["is_error"], Value::Bool(true));
        assert_eq!(model_text(&ok.stored), "a\nb");
        let failed = validate(r#"{"outcome":"failed","content":"no such tool"}"#).expect("valid");
        assert!(failed.failed);
    }
}
