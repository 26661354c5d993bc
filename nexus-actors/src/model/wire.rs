//! What the HTTP clients share: the endpoint check, the client builder, reading a streamed body,
//! and the mapping of HTTP failures onto [`ModelError`].
//!
//! Error mapping, in order: 503, 529 or an error of type `overloaded_error` -> `Overloaded`;
//! 429 or type `rate_limit_error` -> `RateLimited` (with `Retry-After`); 401/403/404 ->
//! `ModelUnavailable`; code `context_length_exceeded`, or a message saying `prompt is too long`
//! or `maximum context length` -> `ContextOverflow`; any other status -> `Http`.

use std::time::Duration;

use serde_json::{Value, json};

use super::ModelError;
use super::bounds::{ANSWER_BODY_BOUND, ERROR_BODY_BOUND, STREAM_EVENT_BOUND};
use super::registry::ConfigError;
use super::sse::{SseEvent, SseParser};

/// Longest provider error text kept in a [`ModelError`] message, in bytes.
const ERROR_TEXT_LIMIT: usize = 512;

/// `{base_url}` joined with `path` (no leading `/`), after checking that `base_url` is an
/// absolute `http`/`https` URL without query or fragment (a trailing `/` is ignored).
pub(crate) fn endpoint(provider: &str, base_url: &str, path: &str) -> Result<reqwest::Url, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid { provider: provider.to_owned(), reason };
    let base = reqwest::Url::parse(base_url).map_err(|error| {
        invalid(format!("base_url `{base_url}` is not an absolute URL ({error}); write it like https://host/v1"))
    })?;
    if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
        return Err(invalid(format!("base_url `{base_url}` must be an http:// or https:// URL")));
    }
    if base.query().is_some() || base.fragment().is_some() {
        return Err(invalid(format!("base_url `{base_url}` must have no query or fragment")));
    }
    let joined = format!("{}/{path}", base.as_str().trim_end_matches('/'));
    reqwest::Url::parse(&joined).map_err(|error| invalid(format!("base_url `{base_url}`: {error}")))
}

/// One `reqwest` client (rustls) whose whole-request timeout is `request_timeout`.
pub(crate) fn http_client(provider: &str, request_timeout: Duration) -> Result<reqwest::Client, ConfigError> {
    reqwest::Client::builder()
        .timeout(request_timeout)
        .build()
        .map_err(|source| ConfigError::HttpClient { provider: provider.to_owned(), source })
}

/// Whether an answer is an event stream (`text/event-stream`) rather than one JSON body: a server
/// may ignore `stream: true`, so the content type decides how the body is read.
fn is_event_stream(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim_start().to_ascii_lowercase().starts_with("text/event-stream"))
}

/// A 2xx answer of a provider, by how its body is to be read.
pub(crate) enum Answer {
    /// One JSON body, read whole.
    Whole(Vec<u8>),
    /// An event stream, to read with [`read_events`].
    Events(reqwest::Response),
}

/// Sends a provider's request and answers its 2xx answer; any other status is read whole and
/// mapped (module docs). `what` names the request in the debug log (`messages`, `chat
/// completion`).
pub(crate) async fn send(provider: &str, what: &str, request: reqwest::RequestBuilder) -> Result<Answer, ModelError> {
    let response = request.send().await.map_err(transport_error)?;
    let status = response.status().as_u16();
    tracing::debug!(provider, status, "{what} answer");
    if !(200..300).contains(&status) {
        return Err(error_answer(response).await);
    }
    if is_event_stream(&response) {
        return Ok(Answer::Events(response));
    }
    match read_capped(response, ANSWER_BODY_BOUND).await? {
        (body, false) => Ok(Answer::Whole(body)),
        (_, true) => Err(provider_error(format!(
            "the answer body is over {ANSWER_BODY_BOUND} bytes; nothing of it was kept: ask for a shorter answer"
        ))),
    }
}

/// Reads at most `cap` bytes of a body: the bytes, and whether there were more (the rest is never
/// read, so an endless body never sits in memory).
async fn read_capped(mut response: reqwest::Response, cap: usize) -> Result<(Vec<u8>, bool), ModelError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
        if body.len() + chunk.len() > cap {
            body.extend_from_slice(&chunk[..cap - body.len()]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// Reads a non-2xx answer whole and maps it (module docs).
async fn error_answer(response: reqwest::Response) -> ModelError {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(parse_retry_after);
    match read_capped(response, ERROR_BODY_BOUND).await {
        Ok((body, _)) => http_error(status, &ErrorInfo::from_body(&body), retry_after),
        Err(error) => {
            http_error(status, &ErrorInfo { message: error.to_string(), ..ErrorInfo::default() }, retry_after)
        }
    }
}

/// Feeds every server-sent event of the body to `on_event` until it returns `true` (the answer is
/// complete) or the body ends. A body that fails mid-way is `Transport`.
pub(crate) async fn read_events(
    mut response: reqwest::Response,
    mut on_event: impl FnMut(SseEvent) -> Result<bool, ModelError>,
) -> Result<(), ModelError> {
    let mut parser = SseParser::default();
    while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
        for event in parser.push(&chunk) {
            if on_event(event)? {
                return Ok(());
            }
        }
        if parser.oversize() {
            return Err(provider_error(format!(
                "a stream event is over {STREAM_EVENT_BOUND} bytes; nothing of the answer was kept"
            )));
        }
    }
    Ok(())
}

/// A `reqwest` failure as `Transport`, with its causes (never the credential: reqwest errors
/// name the URL, and keys travel in headers).
pub(crate) fn transport_error(error: reqwest::Error) -> ModelError {
    let mut message = if error.is_timeout() { format!("timed out: {error}") } else { error.to_string() };
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    ModelError::Transport { message }
}

/// `Retry-After` as delay-seconds; an HTTP date or garbage gives `None` (the backoff applies).
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    value.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0).map(Duration::from_secs_f64)
}

/// What an error body says, from `{"error": {"message", "type", "code"}}`, `{"error": "text"}`,
/// Anthropic's `{"type": "error", "error": {"type", "message"}}` or `{"message"}`; the raw text
/// when it is not JSON.
#[derive(Debug, Default)]
pub(crate) struct ErrorInfo {
    pub(crate) message: String,
    pub(crate) kind: Option<String>,
    pub(crate) code: Option<String>,
    pub(crate) numeric_code: Option<u16>,
}

impl ErrorInfo {
    pub(crate) fn from_body(body: &[u8]) -> Self {
        match serde_json::from_slice::<Value>(body) {
            Ok(value) => Self::from_value(&value),
            Err(_) => Self { message: shorten(&String::from_utf8_lossy(body)), ..Self::default() },
        }
    }

    pub(crate) fn from_value(value: &Value) -> Self {
        let error = value.get("error").unwrap_or(value);
        let message = match error {
            Value::String(text) => text.clone(),
            _ => error.get("message").and_then(Value::as_str).map_or_else(|| value.to_string(), str::to_owned),
        };
        let code = error.get("code");
        Self {
            message: shorten(&message),
            kind: error.get("type").and_then(Value::as_str).map(str::to_owned),
            code: code.and_then(Value::as_str).map(str::to_owned),
            numeric_code: code.and_then(Value::as_u64).and_then(|code| u16::try_from(code).ok()),
        }
    }

    /// The error object of a 2xx body or a stream event, mapped: a 4xx/5xx numeric `code` as that
    /// status, a known Anthropic error type as its status, else `Provider`.
    pub(crate) fn in_answer(error: &Value) -> ModelError {
        let info = Self::from_value(&json!({"error": error}));
        if let Some(code) = info.numeric_code.filter(|code| *code >= 400) {
            return http_error(code, &info, None);
        }
        if info.kind.as_deref() == Some("overloaded_error") {
            return ModelError::Overloaded { status: None, message: info.message };
        }
        if let Some(status) = info.kind.as_deref().and_then(anthropic_error_status) {
            return http_error(status, &info, None);
        }
        provider_error(format!("answer carries an error: {}", info.message))
    }
}

/// The HTTP status Anthropic documents for each error `type`.
fn anthropic_error_status(kind: &str) -> Option<u16> {
    Some(match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "billing_error" => 402,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "api_error" => 500,
        "timeout_error" => 504,
        _ => return None,
    })
}

/// A failed answer as a [`ModelError`] (module docs).
pub(crate) fn http_error(status: u16, info: &ErrorInfo, retry_after: Option<Duration>) -> ModelError {
    let message = info.message.clone();
    let kind = info.kind.as_deref();
    if matches!(status, 503 | 529) || kind == Some("overloaded_error") {
        return ModelError::Overloaded { status: Some(status), message };
    }
    if status == 429 || kind == Some("rate_limit_error") {
        return ModelError::RateLimited { retry_after, message };
    }
    if matches!(status, 401 | 403 | 404) {
        return ModelError::ModelUnavailable { status, message };
    }
    let lower = message.to_ascii_lowercase();
    if info.code.as_deref() == Some("context_length_exceeded")
        || lower.contains("prompt is too long")
        || lower.contains("maximum context length")
    {
        return ModelError::ContextOverflow { status, message };
    }
    ModelError::Http { status, message }
}

/// `text` trimmed and cut to [`ERROR_TEXT_LIMIT`] bytes at a character boundary.
pub(crate) fn shorten(text: &str) -> String {
    let text = text.trim();
    if text.len() <= ERROR_TEXT_LIMIT {
        return text.to_owned();
    }
    let mut end = ERROR_TEXT_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

pub(crate) fn provider_error(message: impl Into<String>) -> ModelError {
    ModelError::Provider { message: message.into() }
}

/// A stream that ended before the answer did: retryable, like a dropped connection.
pub(crate) fn stream_cut(what: &str) -> ModelError {
    ModelError::Transport { message: format!("the stream ended before {what}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_values() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after(" 0 "), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn error_mapping_rows() {
        let info = |body: Value| ErrorInfo::from_value(&body);
        let rows: Vec<(&str, u16, Value, &str)> = vec![
            ("503", 503, json!({"error": {"message": "busy"}}), "Overloaded"),
            (
                "529",
                529,
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
                "Overloaded",
            ),
            ("overloaded_type_on_500", 500, json!({"error": {"type": "overloaded_error"}}), "Overloaded"),
            ("429", 429, json!({"error": {"message": "slow"}}), "RateLimited"),
            ("rate_limit_type", 400, json!({"error": {"type": "rate_limit_error"}}), "RateLimited"),
            ("401", 401, json!({}), "ModelUnavailable"),
            ("403", 403, json!({}), "ModelUnavailable"),
            ("404", 404, json!({}), "ModelUnavailable"),
            (
                "openai_overflow",
                400,
                json!({"error": {"code": "context_length_exceeded", "message": "x"}}),
                "ContextOverflow",
            ),
            (
                "anthropic_overflow",
                400,
                json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
                "ContextOverflow",
            ),
            (
                "vllm_overflow",
                400,
                json!({"message": "This model's maximum context length is 4096 tokens"}),
                "ContextOverflow",
            ),
            ("400", 400, json!({"error": {"message": "bad"}}), "Http"),
            ("500", 500, json!("oops"), "Http"),
        ];
        for (name, status, body, variant) in rows {
            let error = http_error(status, &info(body), Some(Duration::from_secs(3)));
            assert!(format!("{error:?}").starts_with(variant), "{name}: {error:?}");
        }
        let limited = http_error(429, &ErrorInfo::default(), Some(Duration::from_secs(3)));
        assert!(matches!(limited, ModelError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(3)));
    }

    #[test]
    fn errors_inside_answers() {
        let rows: Vec<(Value, &str, Option<u16>)> = vec![
            (json!({"code": 502, "message": "upstream died"}), "provider_http_error", Some(502)),
            (json!({"type": "overloaded_error", "message": "Overloaded"}), "provider_overloaded", None),
            (json!({"type": "api_error", "message": "internal"}), "provider_http_error", Some(500)),
            (json!({"type": "rate_limit_error", "message": "slow"}), "provider_http_error", Some(429)),
            (json!({"type": "authentication_error"}), "provider_model_unavailable", Some(401)),
            (json!({"message": "something"}), "provider_error", None),
        ];
        for (error, key, status) in rows {
            let mapped = ErrorInfo::in_answer(&error);
            assert_eq!(mapped.key(), key, "{error}");
            assert_eq!(mapped.status(), status, "{error}");
        }
    }

    #[test]
    fn endpoints_are_checked_and_joined() {
        let joined = endpoint("p", "http://127.0.0.1:8080/v1/", "chat/completions").expect("valid");
        assert_eq!(joined.as_str(), "http://127.0.0.1:8080/v1/chat/completions");
        for bad in ["localhost/v1", "ftp://host/v1", "http://h/v1?x=1", "mailto:a@b"] {
            assert!(matches!(endpoint("p", bad, "x"), Err(ConfigError::Invalid { .. })), "{bad}");
        }
        assert_eq!(shorten(&"é".repeat(400)).len(), ERROR_TEXT_LIMIT + "…".len());
    }
}
