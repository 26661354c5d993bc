//! The rules every client-API body follows, on both transports (`docs/protocol.md`, "Refusals"):
//! an HTTP body and each JSON field of a gRPC request are read here, so one fault has one word
//! on every door.
//!
//! | fault | word |
//! | --- | --- |
//! | over [`BODY_LIMIT`] bytes (a gRPC message over it included) | 413 `content_too_large` |
//! | not JSON (empty where a body is required, a syntax error) | 400 `parameter_missing` |
//! | JSON, but not an object where an object is required (`null` included) | 400 `parameter_missing` |
//! | an object naming one key twice, at any depth | 400 `parameter_invalid` |
//! | a field the door does not take ([`known_fields`](crate::declaration::known_fields)) | 400 `parameter_invalid` |

use serde_json::{Map, Value};

use nexus_proto::{ErrorCode, Refusal};

pub use crate::doors::http::BODY_LIMIT;
use crate::json::{self, JsonFault};

/// The refusal of a body (or gRPC message) over [`BODY_LIMIT`]; `what` names it (`the body`,
/// `body_json`, `the request`).
pub fn too_large(what: &str) -> Refusal {
    Refusal::new(
        ErrorCode::ContentTooLarge,
        format!("{what} is over {BODY_LIMIT} bytes, the bound of a request; send less in one request"),
    )
}

/// Reads `bytes` as JSON of any shape; `what` names the body in refusals (`the body`,
/// `body_json`).
///
/// # Errors
/// 413 `content_too_large` over [`BODY_LIMIT`]; 400 `parameter_missing` for text that is not
/// JSON (an empty body included); 400 `parameter_invalid` for a key named twice in one object.
pub fn json(bytes: &[u8], what: &str) -> Result<Value, Refusal> {
    if bytes.len() > BODY_LIMIT {
        return Err(too_large(what));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Refusal::new(ErrorCode::ParameterMissing, format!("{what} is empty; send a JSON object")));
    }
    json::parse(bytes).map_err(|fault| match fault {
        JsonFault::Syntax(detail) => {
            Refusal::new(ErrorCode::ParameterMissing, format!("{what} is not JSON ({detail}); send a JSON object"))
        }
        duplicate @ JsonFault::DuplicateKey { .. } => {
            Refusal::new(ErrorCode::ParameterInvalid, format!("{what} is ambiguous: {duplicate}"))
        }
    })
}

/// Reads `bytes` as a JSON object.
///
/// # Errors
/// As [`json`], and 400 `parameter_missing` for JSON that is not an object (`null` included).
pub fn object(bytes: &[u8], what: &str) -> Result<Value, Refusal> {
    match json(bytes, what)? {
        object @ Value::Object(_) => Ok(object),
        _ => Err(not_an_object(what)),
    }
}

/// The refusal of JSON that is not an object where the door needs one.
pub fn not_an_object(what: &str) -> Refusal {
    Refusal::new(ErrorCode::ParameterMissing, format!("{what} must be a JSON object"))
}

/// The fields of an object body, or the refusal of any other shape.
///
/// # Errors
/// 400 `parameter_missing` when `body` is not an object.
pub fn fields<'a>(body: &'a Value, what: &str) -> Result<&'a Map<String, Value>, Refusal> {
    body.as_object().ok_or_else(|| not_an_object(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(result: Result<Value, Refusal>) -> ErrorCode {
        result.expect_err("refused").code
    }

    #[test]
    fn one_fault_one_word() {
        for not_json in ["", "  ", "{", "{\"a\":}", "nope", "{} {}"] {
            assert_eq!(word(json(not_json.as_bytes(), "the body")), ErrorCode::ParameterMissing, "{not_json:?}");
            assert_eq!(word(object(not_json.as_bytes(), "the body")), ErrorCode::ParameterMissing, "{not_json:?}");
        }
        for not_object in ["null", "[]", "1", "\"x\"", "true"] {
            assert!(json(not_object.as_bytes(), "the body").is_ok(), "{not_object}");
            assert_eq!(word(object(not_object.as_bytes(), "the body")), ErrorCode::ParameterMissing, "{not_object}");
        }
        let twice = br#"{"configuration":{"approval_mode":"ask","approval_mode":"bypass"}}"#;
        let refusal = object(twice, "the body").expect_err("ambiguous");
        assert_eq!(refusal.code, ErrorCode::ParameterInvalid);
        assert!(refusal.message.contains("approval_mode"), "the message names the key: {}", refusal.message);
        let huge = vec![b' '; BODY_LIMIT + 1];
        assert_eq!(word(json(&huge, "the body")), ErrorCode::ContentTooLarge);
        assert_eq!(object(b" {\"a\": 1} ", "the body").ok(), Some(serde_json::json!({"a": 1})));
    }
}
